"""Client of the daemon's ClientService, and the conversions of its messages.

Callers see only typed values (:class:`~tuner.fleet.JobSpec`, :class:`~tuner.fleet.JobStatus`,
:class:`~tuner.fleet.FleetView`, engine results); gRPC errors come back as protocol exceptions.
The conversions between those types and their messages live here (the service imports them), and
go field by field by name, so a field added to ``JobSpec`` and to the proto needs no code here.
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Callable, Iterator, Sequence

import grpc

from measure_agent.bounded_json import loads_bounded
from measure_agent.engine import MeasureResult, TimingConfig
from measure_agent.protocol.connection import TlsFiles, Tracker, auth_metadata, leader_hint
from measure_agent.protocol.convert import (
    capabilities_from_json,
    capabilities_to_json,
    is_repeated,
    result_from_proto,
    timing_from_proto,
    timing_to_proto,
)
from measure_agent.protocol.errors import InvalidRequest, Unavailable, from_rpc_error
from measure_agent.protocol.v1 import fleet_pb2 as pb
from measure_agent.protocol.v1 import fleet_pb2_grpc as pb_grpc
from tuner.fleet.agents import AgentInfo, FleetView, KeyInfo, RefusedAgent
from tuner.fleet.jobs import JobSpec, JobStatus


class FleetClient:
    def __init__(self, address: str, timeout_s: float = 30.0, token: str | None = None,
                 tls: TlsFiles | None = None, on_outage: Callable[[str], None] | None = None) -> None:
        """``on_outage`` gets a note when a daemon that answered goes away and the client waits for it."""
        self.address = address
        self.timeout_s = timeout_s
        self.on_outage = on_outage or (lambda note: None)
        # Only a daemon that answered is waited for when it goes away (a restart); a daemon never
        # reached is a wrong address or one that is down: that fails at once.
        self._reached = False
        self._metadata = auth_metadata(token)
        self._tracker = Tracker(address, tls)
        self._stub = pb_grpc.ClientServiceStub(self._tracker.channel)

    def _call(self, method_name: str, request, *, retry_on_lost: bool = True, **kwargs):
        """One call, at the leader: a standby's refusal moves the client to the leader it names, and
        (``retry_on_lost``) a daemon that cannot be reached to the next one of the tracker, each
        daemon tried once. Calls that must not run twice (a submission) pass ``retry_on_lost=False``:
        a daemon lost mid-call may have done it."""
        timeout = kwargs.pop("timeout", self.timeout_s)
        tries = len(self._tracker.spec.split(",")) * 2 if self._tracker.alternatives else 1
        for attempt in range(tries):
            try:
                reply = getattr(self._stub, method_name)(request, timeout=timeout, metadata=self._metadata, **kwargs)
            except grpc.RpcError as exc:
                error = from_rpc_error(exc)
                hint = leader_hint(exc)
                standby = hint is not None  # a standby daemon answered (it names the leader, if any)
                self._reached = self._reached or not isinstance(error, Unavailable) or standby
                if attempt + 1 < tries and isinstance(error, Unavailable) and (standby or retry_on_lost):
                    self._failover(hint or None)
                    continue
                raise error from None
            self._reached = True
            return reply
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    def _failover(self, hint: str | None = None) -> None:
        self._tracker.failover(hint)
        self.address = self._tracker.address
        self._stub = pb_grpc.ClientServiceStub(self._tracker.channel)

    def submit(self, spec: JobSpec) -> JobStatus:
        """Submit a job; the daemon validates it (:class:`InvalidRequest` names what is wrong)."""
        if not isinstance(spec, JobSpec):
            raise TypeError(f"submit takes a JobSpec, not {type(spec).__name__}")
        return status_from_proto(self._call("SubmitJob", spec_to_proto(spec), retry_on_lost=False))

    def job(self, job_id: int) -> JobStatus:
        return status_from_proto(self._call("GetJob", pb.JobRef(job_id=job_id)))

    def jobs(self) -> list[JobStatus]:
        """Every job the daemon holds in memory, page by page."""
        found: list[JobStatus] = []
        while True:
            page = self._call("ListJobs", pb.ListJobsRequest(after_job_id=found[-1].job_id if found else 0))
            found += [status_from_proto(s) for s in page.jobs]
            if not page.more or not page.jobs:
                return found

    def cancel(self, job_id: int) -> JobStatus:
        return status_from_proto(self._call("CancelJob", pb.JobRef(job_id=job_id)))

    def measure(self, workload: str, device_key: str, configs_json: Sequence[str], *, target: str = "cpu",
                timing: TimingConfig | None = None, wait_timeout_s: float = 0.0) -> list[MeasureResult]:
        """Measure configs once on agents of ``device_key`` (not recorded in the log): one result per
        config, in order, each naming the agent that measured it (``measured_by``)."""
        request = pb.MeasureRequest(workload=workload, device_key=device_key, target=target,
                                    configs_json=list(configs_json), wait_timeout_s=wait_timeout_s)
        if timing is not None:
            request.timing.CopyFrom(timing_to_proto(timing))
        reply = self._call("Measure", request, timeout=None)
        try:
            return [dataclasses.replace(result_from_proto(m), measured_by=by)
                    for m, by in zip(reply.measurements, reply.measured_by, strict=True)]
        except (ValueError, json.JSONDecodeError) as exc:
            raise InvalidRequest(f"malformed measurement from the daemon: {exc}") from None

    def agents(self, key: str | None = None, keys_only: bool = False) -> FleetView:
        """The fleet: every key's counts, and the agents (of ``key`` only; none with ``keys_only``)."""
        return fleet_from_proto(self._call("ListAgents", pb.ListAgentsRequest(key=key or "", keys_only=keys_only)))

    def watch(self, job_id: int, reconnect_s: float = 600.0) -> Iterator[JobStatus]:
        """Status after every change until the job ends.

        When a daemon that answered goes away (restart, crash) the watch reconnects with capped
        exponential backoff for up to ``reconnect_s`` seconds of outage, then raises :class:`Unavailable`.
        """
        outage = _Outage(self.address, reconnect_s, self.on_outage)
        while True:
            try:
                for status in self._stub.WatchJob(pb.JobRef(job_id=job_id), metadata=self._metadata):
                    self._reached = True
                    outage.over()
                    status = status_from_proto(status)
                    yield status
                    if status.state in ("done", "failed", "cancelled"):
                        return
                # The stream ended without a final state: the daemon stopped; follow it again.
                self._reached = True
                if self._tracker.alternatives:
                    self._failover()
            except grpc.RpcError as exc:
                error = from_rpc_error(exc)
                lost = isinstance(error, Unavailable) or exc.code() == grpc.StatusCode.CANCELLED
                hint = leader_hint(exc)
                if hint:  # a standby named the leader: go there now
                    self._reached = True
                    self._failover(hint)
                    time.sleep(0.2)  # a stale hint between two standbys must not spin
                    continue
                if hint is not None:  # a standby while no daemon leads (a takeover in progress)
                    self._reached = True
                if not (lost and self._reached):
                    raise error from None
                if self._tracker.alternatives:
                    self._failover()
            outage.wait()

    def job_when_reachable(self, job_id: int, reconnect_s: float = 600.0) -> JobStatus:
        """:meth:`job`, waiting through an outage of a daemon that answered before (it may be restarting)
        as :meth:`watch` does; a daemon this client never reached fails at once."""
        outage = _Outage(self.address, reconnect_s, self.on_outage)
        while True:
            try:
                return self.job(job_id)
            except Unavailable:
                if not self._reached:
                    raise
                outage.wait()

    def close(self) -> None:
        self._tracker.close()

    def __enter__(self) -> "FleetClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Outage:
    """Capped exponential backoff through a daemon outage of at most ``limit_s`` seconds; ``notify``
    hears when an outage starts and when it is over."""

    def __init__(self, address: str, limit_s: float, notify: Callable[[str], None]) -> None:
        self.address = address
        self.limit_s = limit_s
        self.notify = notify
        self._started, self._backoff = None, 0.25

    def over(self) -> None:
        if self._started is not None:
            self.notify(f"reconnected to the daemon at {self.address}")
        self._started, self._backoff = None, 0.25

    def wait(self) -> None:
        now = time.monotonic()
        if self._started is None:
            self._started = now
            self.notify(f"lost the daemon at {self.address}; retrying for up to {self.limit_s:g} s "
                        "(it may be restarting)")
        if now - self._started > self.limit_s:
            raise Unavailable(f"daemon at {self.address} unreachable for {self.limit_s:g} s")
        time.sleep(self._backoff)
        self._backoff = min(5.0, self._backoff * 2)


# -- messages <-> typed values (the service uses these too) ------------------------------------
def _fields_to_proto(value, message, skip: Sequence[str] = ()) -> None:
    """Copy a dataclass's fields into the message fields of the same names (``None``: left unset)."""
    for f in dataclasses.fields(value):
        item = getattr(value, f.name)
        if f.name in skip or item is None:
            continue
        if isinstance(item, TimingConfig):
            getattr(message, f.name).CopyFrom(timing_to_proto(item))
        elif isinstance(item, (tuple, list)):
            getattr(message, f.name).extend(item)
        else:
            setattr(message, f.name, item)


def _fields_from_proto(message, cls, skip: Sequence[str] = ()) -> dict:
    """The keyword arguments of ``cls`` read from the message fields of the same names; a field
    the message leaves unset (optional or sub-message) keeps the dataclass default."""
    by_name = message.DESCRIPTOR.fields_by_name
    values = {}
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        descriptor = by_name[f.name]
        if descriptor.has_presence and not message.HasField(f.name):
            continue
        item = getattr(message, f.name)
        if f.name == "timing":
            values[f.name] = timing_from_proto(item)
        elif is_repeated(descriptor):
            values[f.name] = tuple(item)
        else:
            values[f.name] = item
    return values


def spec_to_proto(spec: JobSpec) -> pb.JobSpec:
    message = pb.JobSpec()
    _fields_to_proto(spec, message)
    return message


def spec_from_proto(message: pb.JobSpec) -> JobSpec:
    """Raises ``ValueError`` for timing out of bounds (the rest is checked by ``JobSpec.validate``)."""
    return JobSpec(**_fields_from_proto(message, JobSpec))


def status_to_proto(status: JobStatus) -> pb.JobStatus:
    message = pb.JobStatus(spec=spec_to_proto(status.spec))
    _fields_to_proto(status, message, skip=("spec", "best_config"))
    if status.best_config is not None:
        message.best_config_json = json.dumps(status.best_config, sort_keys=True)
    return message


def status_from_proto(message: pb.JobStatus) -> JobStatus:
    values = _fields_from_proto(message, JobStatus, skip=("spec", "best_config"))
    best = loads_bounded(message.best_config_json, "best config") if message.best_config_json else None
    return JobStatus(spec=spec_from_proto(message.spec), best_config=best, **values)


def fleet_to_proto(fleet: FleetView) -> pb.AgentList:
    return pb.AgentList(
        agents=[pb.AgentInfo(agent_id=a.agent_id, key=a.key, name=a.name,
                             capabilities=capabilities_from_json(a.device_info, a.templates),
                             last_heartbeat=a.seconds_since_heartbeat, registered_at=a.seconds_since_registered,
                             parallel=a.parallel, leased=a.leased, peer=a.peer, overdue_leases=a.overdue_leases,
                             quarantined=a.quarantined)
                for a in fleet.agents],
        keys=[pb.KeyInfo(**dataclasses.asdict(k)) for k in fleet.keys],
        refused=[pb.RefusedAgent(**dataclasses.asdict(r)) for r in fleet.refused],
        leader=fleet.leader, leader_epoch=fleet.leader_epoch,
    )


def fleet_from_proto(message: pb.AgentList) -> FleetView:
    return FleetView(
        agents=tuple(AgentInfo(agent_id=a.agent_id, key=a.key, name=a.name,
                               device_info=capabilities_to_json(a.capabilities),
                               templates=tuple(a.capabilities.templates), parallel=a.parallel, leased=a.leased,
                               peer=a.peer, seconds_since_heartbeat=a.last_heartbeat,
                               seconds_since_registered=a.registered_at, overdue_leases=a.overdue_leases,
                               quarantined=a.quarantined)
                     for a in message.agents),
        keys=tuple(KeyInfo(**_fields_from_proto(k, KeyInfo)) for k in message.keys),
        refused=tuple(RefusedAgent(**_fields_from_proto(r, RefusedAgent)) for r in message.refused),
        leader=message.leader, leader_epoch=message.leader_epoch,
    )
