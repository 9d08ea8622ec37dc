"""The measurement agent: joins a daemon under a device key and measures what it leases.

The agent dials out (devices behind NAT can join), registers its capabilities and template version,
then loops: lease candidates, measure them with the engine, report. It keeps its device busy: the
next batch is leased (and, for kernels not timed on the host CPU, built) while this one runs, and
results are reported in the background. A heartbeat thread keeps it known. When the daemon is unreachable the agent retries with capped exponential backoff and
registers again by itself; when the daemon no longer knows it (restart, or it was presumed dead)
it registers again. ``stop()`` (SIGTERM in the CLI) finishes the batch in flight, reports it and
leaves.
"""

from __future__ import annotations

import logging
import random
import socket
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from measure_agent import __version__
from measure_agent.device import DeviceInfo, detect_device
from measure_agent.engine import MeasureEngine, MeasureInput, MeasureResult, MeasureStatus, TimingConfig
from measure_agent.engine.engine import Prepared
from measure_agent.engine.kernel_cache import DEFAULT_CACHE_MAX_MB
from measure_agent.protocol import V1_PROTOCOL_VERSION
from measure_agent.protocol.convert import capabilities_to_proto, result_to_proto, timing_from_proto
from measure_agent.protocol.connection import TlsFiles, Tracker, auth_metadata, leader_hint
from measure_agent.protocol.errors import FleetError, Unauthenticated, Unavailable, VersionMismatch, from_rpc_error
from measure_agent.protocol.v1 import fleet_pb2 as pb
from measure_agent.protocol.v1 import fleet_pb2_grpc as pb_grpc
from measure_agent.space import ConfigError
from measure_agent.templates import TemplateNotFound
from measure_agent.workload import WorkloadError, parse_workload

logger = logging.getLogger("tunefleet.agent")


@dataclass
class _LeasedBatch:
    """Candidates of one lease: those that parse (with their timing), those that do not (already
    answered as invalid), and the built ones when built ahead."""

    agent_id: str | None  # the registration that leased them
    candidates: list  # pb.Candidate, in lease order
    items: list[tuple[str, MeasureInput, TimingConfig]] = field(default_factory=list)
    invalid: dict[str, pb.Measurement] = field(default_factory=dict)
    built: dict[str, Prepared] = field(default_factory=dict)

    def by_timing(self) -> dict[TimingConfig, list[tuple[str, MeasureInput]]]:
        groups: dict[TimingConfig, list[tuple[str, MeasureInput]]] = {}
        for lease_id, item, timing in self.items:
            groups.setdefault(timing, []).append((lease_id, item))
        return groups


def jittered(seconds: float) -> float:
    """A pause of between half and all of ``seconds``: after a daemon restart, a fleet's agents
    then come back spread out instead of all at once, in lockstep."""
    return seconds * random.uniform(0.5, 1.0)


class AgentRefused(Exception):
    """The daemon refused this agent for good (version mismatch, bad key): do not retry."""


class Agent:
    def __init__(self, tracker: str, key: str, name: str | None = None, parallel: int = 1,
                 catalog: str = "default", cache_dir: Path | None = None, lease_wait_s: float = 2.0,
                 max_backoff_s: float = 30.0, device: DeviceInfo | None = None, token: str | None = None,
                 tls: TlsFiles | None = None, cache_max_mb: int = DEFAULT_CACHE_MAX_MB) -> None:
        self.tracker = tracker
        self.key = key
        self.name = name or f"{socket.gethostname()}"
        self.parallel = parallel
        self.lease_wait_s = lease_wait_s
        self.max_backoff_s = max_backoff_s
        self.device = device or detect_device()
        self.engine = MeasureEngine(TimingConfig(), build_workers=parallel, catalog=catalog, cache_dir=cache_dir,
                                    cache_max_mb=cache_max_mb)
        self._stop = threading.Event()
        self._left = threading.Event()  # heartbeats go on while a stopping agent finishes its batch
        self._agent_id: str | None = None
        self._heartbeat_interval_s = 2.0
        self._metadata = auth_metadata(token)
        self._tracker = Tracker(tracker, tls)
        self._stub = pb_grpc.AgentServiceStub(self._tracker.channel)
        self._leader_hint: str | None = None  # the leader a standby named in its last refusal
        self.measured = 0
        self.registrations = 0
        self._next: Future | None = None  # the next batch, leased (and maybe built) ahead
        self._ahead = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tunefleet-lease-ahead")
        self._reporter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tunefleet-report")

    # -- lifecycle --------------------------------------------------------------------------
    def stop(self) -> None:
        """Ask the agent to finish its batch in flight, report it and leave."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def run(self) -> None:
        """Serve until :meth:`stop`. Raises :class:`AgentRefused` when the daemon refuses us."""
        heartbeat = threading.Thread(target=self._heartbeat_loop, name="tunefleet-heartbeat", daemon=True)
        heartbeat.start()
        backoff = 0.5
        try:
            while not self._stop.is_set():
                try:
                    if self._agent_id is None:
                        self._register()
                    self._serve_one_batch()
                    backoff = 0.5
                except Unavailable as exc:
                    # A standby answered: a leader is (or is about to be) there, so no long backoff.
                    standby = self._leader_hint is not None
                    if self._tracker.alternatives:
                        self._failover()
                    pause = jittered(0.5 if standby else backoff)
                    logger.warning("%s; retrying%s in %.1f s", exc,
                                   f" at {self._tracker.address}" if self._tracker.alternatives else "", pause)
                    self._stop.wait(pause)
                    backoff = 0.5 if standby else min(self.max_backoff_s, backoff * 2)
                except FleetError as exc:
                    pause = jittered(backoff)
                    logger.warning("daemon error: %s; retrying in %.1f s", exc, pause)
                    self._stop.wait(pause)
                    backoff = min(self.max_backoff_s, backoff * 2)
        finally:
            self._drop_next()
            self._reporter.shutdown(wait=True)  # results already measured are delivered first
            self._leave()
            self._left.set()
            self._ahead.shutdown(wait=True)
            self.engine.close()
            self._tracker.close()

    # -- protocol ---------------------------------------------------------------------------
    def _failover(self) -> None:
        """Move to the leader a standby named, or to the next daemon of the tracker: the new daemon
        does not know this agent, which registers again (leases of the old one go back to its queue)."""
        hint, self._leader_hint = self._leader_hint, None
        address = self._tracker.failover(hint)
        self._stub = pb_grpc.AgentServiceStub(self._tracker.channel)
        self._agent_id = None
        logger.info("failing over to the daemon at %s", address)

    def _rpc(self, method, request, timeout_s: float):
        try:
            return method(request, timeout=timeout_s, metadata=self._metadata)
        except grpc.RpcError as exc:
            error = from_rpc_error(exc)
            self._leader_hint = leader_hint(exc)  # None unless a standby answered
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise Unavailable(f"daemon did not answer in {timeout_s:g} s") from None
            if isinstance(error, Unauthenticated):
                raise AgentRefused(str(error)) from None  # retrying with the same token cannot help
            raise error from None

    def _register(self) -> None:
        caps = capabilities_to_proto(self.device, __version__, self.engine.template_version,
                                     sorted(f"{t.op}/{t.target}" for t in self.engine.catalog))
        request = pb.RegisterRequest(key=self.key, name=self.name, capabilities=caps,
                                     protocol_version=V1_PROTOCOL_VERSION, parallel=self.parallel)
        try:
            reply = self._rpc(self._stub.Register, request, 10.0)
        except VersionMismatch as exc:
            raise AgentRefused(f"daemon refused this agent: {exc}") from None
        except FleetError as exc:
            if isinstance(exc, Unavailable):
                raise
            raise AgentRefused(f"daemon refused this agent: {exc}") from None
        self._agent_id = reply.agent_id
        self._heartbeat_interval_s = reply.heartbeat_interval_s or 2.0
        self.registrations += 1
        logger.info("joined %s as %s under key %s", self.tracker, self.name, self.key)

    def _serve_one_batch(self) -> None:
        """Run one leased batch while the next is leased (and built where allowed) ahead."""
        agent_id = self._agent_id
        if self._next is not None:
            next_batch, self._next = self._next, None
            batch = next_batch.result()  # its RPC errors surface here, handled by run()
        else:
            batch = self._lease(agent_id, build=True)
        if batch is None or not batch.candidates:
            return
        if batch.agent_id != self._agent_id:
            return  # leased under an earlier registration: those leases went back to the queue
        if not self._stop.is_set():
            overlap = self.engine.builds_may_overlap_runs([item for _, item, _ in batch.items])
            self._next = self._ahead.submit(self._lease, agent_id, overlap)
        measurements = self._run(batch)
        self._reporter.submit(self._report, agent_id, measurements)

    def _lease(self, agent_id: str | None, build: bool) -> "_LeasedBatch | None":
        """A new lease, built when ``build``; None when the daemon no longer knows this agent."""
        reply = self._rpc(self._stub.Lease, pb.LeaseRequest(agent_id=agent_id, max_candidates=self.parallel,
                                                            wait_s=self.lease_wait_s), self.lease_wait_s + 10.0)
        if not reply.known:
            logger.info("daemon does not know this agent any more; registering again")
            if self._agent_id == agent_id:
                self._agent_id = None
            return None
        batch = _LeasedBatch(agent_id, list(reply.candidates))
        for candidate in reply.candidates:
            try:
                timing = timing_from_proto(candidate.timing, clamp=True)  # bounded whatever was sent
                workload = parse_workload(candidate.workload)
                config = self.engine.catalog.space(workload, candidate.target, self.device).from_json(
                    candidate.config_json)  # bounded: a hostile daemon cannot crash the agent
            except (ValueError, WorkloadError, ConfigError, TemplateNotFound) as exc:
                batch.invalid[candidate.lease_id] = result_to_proto(
                    candidate.lease_id, MeasureResult(MeasureStatus.INVALID_CONFIG, message=str(exc)))
                continue
            batch.items.append((candidate.lease_id, MeasureInput(workload, config, candidate.target), timing))
        if build:
            for timing, group in batch.by_timing().items():
                for (lease_id, _), prepared in zip(group, self.engine.prepare([i for _, i in group], timing=timing)):
                    batch.built[lease_id] = prepared
        return batch

    def _run(self, batch: "_LeasedBatch") -> list[pb.Measurement]:
        out = dict(batch.invalid)
        for timing, group in batch.by_timing().items():
            ready = [batch.built.get(lease_id) for lease_id, _ in group]
            if any(p is None for p in ready):  # not built ahead: build now, then run
                ready = self.engine.prepare([item for _, item in group], timing=timing)
            for (lease_id, _), result in zip(group, self.engine.run(ready, timing=timing)):
                out[lease_id] = result_to_proto(lease_id, result)
        self.measured += len(out)
        return [out[c.lease_id] for c in batch.candidates]

    def _drop_next(self) -> None:
        """Stopping: wait for a lease in progress; its candidates go back to the queue when we leave."""
        if self._next is not None:
            try:
                self._next.result()
            except Exception:  # noqa: BLE001 - an RPC error of a batch we will not run
                pass
            self._next = None

    def _report(self, agent_id: str, measurements: list[pb.Measurement]) -> None:
        """Deliver results; keep trying through short outages (a stale lease is simply rejected)."""
        backoff = 0.5
        for _ in range(8):
            try:
                reply = self._rpc(self._stub.Report, pb.ReportRequest(agent_id=agent_id, measurements=measurements),
                                  30.0)
                if reply.rejected_lease_ids:
                    logger.info("%d results were no longer wanted (leases expired)", len(reply.rejected_lease_ids))
                return
            except Unavailable as exc:
                logger.warning("cannot report results: %s; retrying in %.1f s", exc, backoff)
                threading.Event().wait(backoff)
                backoff = min(self.max_backoff_s, backoff * 2)
        logger.warning("gave up reporting %d results; the daemon will lease them again", len(measurements))

    def _heartbeat_loop(self) -> None:
        while not self._left.wait(self._heartbeat_interval_s):
            agent_id = self._agent_id
            if agent_id is None:
                continue
            try:
                reply = self._rpc(self._stub.Heartbeat, pb.HeartbeatRequest(agent_id=agent_id), 5.0)
                if not reply.known and self._agent_id == agent_id:
                    self._agent_id = None  # the main loop registers again
            except (FleetError, AgentRefused):
                pass  # the main loop sees outages and refusals

    def _leave(self) -> None:
        if self._agent_id is None:
            return
        try:
            self._rpc(self._stub.Leave, pb.LeaveRequest(agent_id=self._agent_id), 5.0)
        except (FleetError, AgentRefused):
            pass
        self._agent_id = None
