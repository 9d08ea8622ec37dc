"""The measurement agent: joins a daemon under a device key and measures what it leases.

The agent dials out (devices behind NAT can join) and opens one protocol v2 stream
(:mod:`measure_agent.protocol.stream`): hello with its capabilities and template version, then
credit for two batches (one to run, one ahead). The daemon pushes leases as work comes; the agent
measures a batch with the engine, sends its results and as much new credit on the same stream. It
keeps its device busy: the next batch is taken (and, for kernels not timed on the host CPU, built)
while this one runs. When the daemon is unreachable the agent retries with capped exponential
backoff and joins again by itself; when the daemon no longer knows it (restart, or it was presumed
dead) it joins again. ``stop()`` (SIGTERM in the CLI) finishes the batch in flight, reports it and
leaves.
"""

from __future__ import annotations

import logging
import queue
import random
import socket
import threading
from concurrent.futures import Future
from concurrent.futures import wait as wait_for_futures
from dataclasses import dataclass, field
from pathlib import Path

from measure_agent import __version__
from measure_agent.device import DeviceInfo, detect_device
from measure_agent.engine import MeasureEngine, MeasureInput, MeasureResult, MeasureStatus, TimingConfig
from measure_agent.engine.engine import Prepared
from measure_agent.engine.kernel_cache import DEFAULT_CACHE_MAX_MB
from measure_agent.protocol import PROTOCOL_VERSION
from measure_agent.protocol.connection import TlsFiles, Tracker, auth_metadata
from measure_agent.protocol.convert import capabilities_to_proto, clamped_timing_from_proto, result_to_proto
from measure_agent.protocol.errors import FleetError, NotFound, Unauthenticated, Unavailable, VersionMismatch
from measure_agent.protocol.stream import AgentStream
from measure_agent.protocol.v1 import fleet_pb2 as pb1
from measure_agent.protocol.v2 import agent_pb2 as pb
from measure_agent.space import ConfigError, ConfigSpace
from measure_agent.templates import TemplateNotFound
from measure_agent.workload import Workload, WorkloadError, parse_workload

logger = logging.getLogger("tunefleet.agent")

# Spaces an agent keeps by (workload text, target): a job leases one workload for many candidates.
SPACE_CACHE_SIZE = 64


@dataclass
class _LeasedBatch:
    """Candidates of one lease: those that parse (with their timing), those that do not (already
    answered as invalid), and the built ones when built ahead."""

    stream: AgentStream  # the registration that leased them
    candidates: list  # pb1.Candidate, in lease order
    items: list[tuple[str, MeasureInput, TimingConfig]] = field(default_factory=list)
    invalid: dict[str, pb1.Measurement] = field(default_factory=dict)
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
        self._metadata = auth_metadata(token)
        self._tracker = Tracker(tracker, tls)
        self._stream: AgentStream | None = None  # the current registration
        self._leader_hint: str | None = None  # the leader a standby named in its last refusal
        self.measured = 0
        self.registrations = 0
        self._next: tuple[AgentStream, Future] | None = None  # the next batch, taken (and maybe built) ahead
        # the lease-ahead thread's work (None: leave); a thread and a queue are lighter than an
        # executor per batch, and the thread lives while run() does
        self._ahead: queue.SimpleQueue = queue.SimpleQueue()
        self._ahead_thread: threading.Thread | None = None
        # (workload text, target) -> the parsed workload and its space on this device: what every
        # leased candidate of a job needs, looked up once per job instead of once per candidate
        self._spaces: dict[tuple[str, str], tuple[Workload, ConfigSpace]] = {}
        self._spaces_lock = threading.Lock()

    # -- lifecycle --------------------------------------------------------------------------
    def stop(self) -> None:
        """Ask the agent to finish its batch in flight, report it and leave."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def run(self) -> None:
        """Serve until :meth:`stop`. Raises :class:`AgentRefused` when the daemon refuses us."""
        backoff = 0.5
        self._ahead_thread = threading.Thread(target=self._work_ahead, name="tunefleet-lease-ahead", daemon=True)
        self._ahead_thread.start()
        try:
            while not self._stop.is_set():
                try:
                    if self._stream is None:
                        self._join()
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
            if self._stream is not None:
                self._stream.leave()  # results already measured go first; what it holds is requeued
                self._stream = None
            self._ahead.put(None)
            self._ahead_thread.join()
            self.engine.close()
            self._tracker.close()

    # -- protocol ---------------------------------------------------------------------------
    def _failover(self) -> None:
        """Move to the leader a standby named, or to the next daemon of the tracker: the new daemon
        does not know this agent, which joins again (leases of the old one go back to its queue)."""
        hint, self._leader_hint = self._leader_hint, None
        address = self._tracker.failover(hint)
        self._stream = None
        logger.info("failing over to the daemon at %s", address)

    def _join(self) -> None:
        caps = capabilities_to_proto(self.device, __version__, self.engine.template_version,
                                     sorted(f"{t.op}/{t.target}" for t in self.engine.catalog))
        hello = pb.Hello(key=self.key, name=self.name, capabilities=caps, protocol_version=PROTOCOL_VERSION,
                         parallel=self.parallel)
        stream = AgentStream(self._tracker.channel, self._metadata)
        try:
            stream.open(hello)
        except Unavailable:
            self._leader_hint = stream.leader_hint
            raise
        except FleetError as exc:
            raise AgentRefused(f"daemon refused this agent: {exc}") from None
        self._leader_hint = None
        self._stream = stream
        stream.send(credit=pb.Credit(candidates=2 * self.parallel))  # a batch to run and one ahead
        self.registrations += 1
        logger.info("joined %s as %s under key %s", self.tracker, self.name, self.key)

    def _stream_lost(self, stream: AgentStream) -> None:
        """The stream ended under us: join again, or raise why not (run() handles it)."""
        self._drop_next()
        if self._stream is stream:
            self._stream = None
        stream.close()
        error = stream.error
        self._leader_hint = stream.leader_hint
        if error is None or isinstance(error, NotFound):
            logger.info("daemon does not know this agent any more; joining again")
            return
        if isinstance(error, (Unauthenticated, VersionMismatch)):
            raise AgentRefused(f"daemon refused this agent: {error}")  # retrying cannot help
        raise error

    def _serve_one_batch(self) -> None:
        """Run one leased batch while the next is taken (and built where allowed) ahead."""
        stream = self._stream
        if self._next is not None:
            (ahead_stream, next_batch), self._next = self._next, None
            batch = self._taken_ahead(ahead_stream, next_batch)
        else:
            batch = self._take(stream, build=True)
        if stream.ended:
            self._stream_lost(stream)
            return
        if not batch.candidates:
            return
        if not self._stop.is_set():
            overlap = self.engine.builds_may_overlap_runs([item for _, item, _ in batch.items])
            self._next = (stream, self._take_ahead(stream, overlap))
        measurements = self._run(batch)
        # Results and as much new credit; a stream that ended meanwhile drops them (the daemon
        # gave those leases to others when it ended).
        if stream.results_carry_credit:
            stream.send(results=pb.Results(measurements=measurements, credit=len(measurements)))
        else:  # a daemon of an earlier release reads credit only from its own message
            stream.send(results=pb.Results(measurements=measurements))
            stream.send(credit=pb.Credit(candidates=len(measurements)))

    def _take(self, stream: AgentStream, build: bool) -> "_LeasedBatch":
        """The next leased candidates (at most ``parallel``), built when ``build``."""
        return self._batch(stream, stream.take(self.parallel, self.lease_wait_s), build)

    def _take_ahead(self, stream: AgentStream, build: bool) -> Future:
        """:meth:`_take` on the lease-ahead thread, which starts once the leases are there (the
        stream hands them over): a batch, or an empty one when :meth:`_taken_ahead` gave up waiting."""
        future: Future = Future()

        def deliver(candidates: list) -> None:  # in this thread or the stream's reader: must not raise
            self._ahead.put((future, stream, candidates, build))

        stream.take_when_leased(self.parallel, deliver)
        return future

    def _work_ahead(self) -> None:
        """The lease-ahead thread: batches of the leases handed over, until told to leave."""
        while (work := self._ahead.get()) is not None:
            future, stream, candidates, build = work
            try:
                future.set_result(self._batch(stream, candidates, build))
            except BaseException as exc:  # noqa: BLE001 - raised where the batch is awaited, as before
                future.set_exception(exc)

    def _taken_ahead(self, stream: AgentStream, future: Future) -> "_LeasedBatch":
        """The batch :meth:`_take_ahead` took; empty when no lease came within ``lease_wait_s``."""
        if not future.done() and not wait_for_futures([future], timeout=self.lease_wait_s).done:
            if stream.cancel_take():  # nothing leased meanwhile: as take() when its wait ends
                return _LeasedBatch(stream, [])
        return future.result()  # taken: built by now, or soon

    def _batch(self, stream: AgentStream, candidates: list, build: bool) -> "_LeasedBatch":
        """A batch of leased ``candidates``, built when ``build``."""
        batch = _LeasedBatch(stream, candidates)
        for candidate in candidates:
            try:
                timing = clamped_timing_from_proto(candidate.timing)  # bounded whatever was sent
                workload, space = self._workload_space(candidate.workload, candidate.target)
                config = space.from_json(candidate.config_json)  # bounded: a hostile daemon cannot crash the agent
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

    def _workload_space(self, text: str, target: str) -> tuple[Workload, ConfigSpace]:
        """The workload ``text`` parses to and its space for ``target`` on this device, kept for the
        next candidates of the same job; raises as parsing and the catalog do (nothing is kept then)."""
        key = (text, target)
        found = self._spaces.get(key)
        if found is not None:
            return found
        workload = parse_workload(text)
        found = (workload, self.engine.catalog.space(workload, target, self.device))
        with self._spaces_lock:  # the lease-ahead thread and a batch taken in turn both look up
            if len(self._spaces) >= SPACE_CACHE_SIZE:
                del self._spaces[next(iter(self._spaces))]  # the oldest entry
            self._spaces[key] = found
        return found

    def _run(self, batch: "_LeasedBatch") -> list[pb1.Measurement]:
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
        """Stopping or rejoining: wait for a take in progress; its candidates go back to the queue
        when the stream ends."""
        if self._next is not None:
            (stream, pending), self._next = self._next, None
            if stream.cancel_take():
                return  # nothing was taken
            try:
                pending.result()
            except Exception:  # noqa: BLE001 - a build error of a batch we will not run
                pass
