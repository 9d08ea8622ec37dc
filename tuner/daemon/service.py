"""gRPC servicers: translate messages to scheduler and job-manager calls, errors to status codes."""

from __future__ import annotations

import itertools
import json
import logging
import time
from dataclasses import replace
from typing import Protocol

import grpc

from measure_agent.device import DeviceInfo, DeviceKeyError, check_device_key
from measure_agent.protocol import PROTOCOL_VERSION, V1_PROTOCOL_VERSION
from measure_agent.engine import MeasureInput, MeasureResult, MeasureStatus, TimingConfig
from measure_agent.protocol.convert import (
    capabilities_to_json,
    is_repeated,
    result_from_proto,
    result_to_proto,
    timing_from_proto,
    timing_to_proto,
)
from measure_agent.protocol.errors import (
    FleetError,
    InvalidRequest,
    TimedOut,
    Unavailable,
    VersionMismatch,
    abort,
    shown,
)
from measure_agent.protocol.v1 import fleet_pb2 as pb
from measure_agent.protocol.v1 import fleet_pb2_grpc as pb_grpc
from measure_agent.space import ConfigError
from measure_agent.templates import TemplateCatalog, TemplateNotFound
from measure_agent.workload import WorkloadError, parse_workload
from tuner.daemon.client import fleet_to_proto, spec_from_proto, status_to_proto
from tuner.daemon.leadership import StandbyGate
from tuner.daemon.jobs import JobManager
from tuner.daemon.limits import (
    MAX_AGENT_NAME_CHARS,
    MAX_CANDIDATES_PER_LEASE,
    MAX_CAPABILITY_LIST,
    MAX_CAPABILITY_TEXT_CHARS,
    MAX_CONFIGS_PER_MEASURE,
    MAX_LEASE_WAIT_S,
    MAX_LISTED_JOBS,
    MAX_MEASURE_S,
    MAX_WATCH_S,
)
from tuner.daemon.scheduler import Scheduler
from tuner.daemon.fleet_state import fleet_view
from tuner.fleet.agents import RefusedAgent
from tuner.log.records import storable_text
from tuner.steering import SteeringError, parse_target

logger = logging.getLogger("tunefleet.daemon")



class Registration(Protocol):
    """What an agent says when it joins: v1's RegisterRequest and v2's Hello alike."""

    key: str
    name: str
    capabilities: pb.Capabilities
    protocol_version: int
    parallel: int


def check_registration(request: Registration, catalog: TemplateCatalog, expected_protocol: int) -> None:
    """Raise the :class:`FleetError` (one line) that refuses this registration, if any."""
    if request.protocol_version != expected_protocol:
        raise VersionMismatch(
            f"agent speaks protocol {request.protocol_version}, daemon {expected_protocol}: "
            "install the same tunefleet version on both"
        )
    theirs = request.capabilities.template_version
    if theirs != catalog.version:
        raise VersionMismatch(
            f"agent templates version {theirs or '(none)'} differs from the daemon's {catalog.version}: "
            "install the same tunefleet version on agent and daemon"
        )
    try:
        check_device_key(request.key)
    except DeviceKeyError as exc:
        raise InvalidRequest(str(exc)) from None
    if not 1 <= request.parallel <= 1024:
        raise InvalidRequest("parallel must be between 1 and 1024")
    _check_agent_name(request.name)
    _check_capabilities(request.capabilities)


class AgentService(pb_grpc.AgentServiceServicer):
    """Protocol v1's unary agent calls. Agents speak v2 now: an agent of v1 is refused at Register
    with one line naming both versions, unless ``serve_v1`` (bench/fleet.py compares the two)."""

    def __init__(self, scheduler: Scheduler, catalog: TemplateCatalog, serve_v1: bool = False) -> None:
        self.scheduler = scheduler
        self.catalog = catalog
        self.expected_protocol = V1_PROTOCOL_VERSION if serve_v1 else PROTOCOL_VERSION

    def Register(self, request: pb.RegisterRequest, context: grpc.ServicerContext) -> pb.RegisterReply:
        try:
            check_registration(request, self.catalog, self.expected_protocol)
        except FleetError as exc:
            logger.warning("refused agent %s (key %s) from %s: %s", shown(request.name), shown(request.key),
                           context.peer(), exc)
            self.scheduler.refuse(refusal(request, context.peer(), self.catalog.version, exc,
                                          self.expected_protocol))
            abort(context, exc)
        agent = self.scheduler.register(
            request.key, request.name or context.peer(), capabilities_to_json(request.capabilities),
            request.parallel, context.peer(), templates=tuple(request.capabilities.templates),
        )
        logger.info("agent %s (%s) joined key %s from %s", agent.name, agent.agent_id[:8], agent.key, agent.peer)
        return pb.RegisterReply(agent_id=agent.agent_id, heartbeat_interval_s=self.scheduler.heartbeat_interval_s,
                                agent_timeout_s=self.scheduler.agent_timeout_s)

    def Heartbeat(self, request: pb.HeartbeatRequest, context: grpc.ServicerContext) -> pb.HeartbeatReply:
        return pb.HeartbeatReply(known=self.scheduler.heartbeat(request.agent_id))

    def Lease(self, request: pb.LeaseRequest, context: grpc.ServicerContext) -> pb.LeaseReply:
        wait_s = min(max(request.wait_s, 0.0), MAX_LEASE_WAIT_S)
        count = min(max(request.max_candidates, 1), MAX_CANDIDATES_PER_LEASE)
        taken = self.scheduler.lease(request.agent_id, count, wait_s)
        if taken is None:
            return pb.LeaseReply(known=False)
        return pb.LeaseReply(
            known=True,
            candidates=[
                pb.Candidate(lease_id=c.lease_id, workload=c.item.workload.key, config_json=c.item.config.json_text(),
                             target=c.item.target, timing=timing_to_proto(c.batch.timing))
                for c in taken
            ],
        )

    def Report(self, request: pb.ReportRequest, context: grpc.ServicerContext) -> pb.ReportReply:
        accepted = 0
        rejected = []
        name = self.scheduler.agent_name(request.agent_id)
        for measurement in request.measurements:
            result = arriving_result(measurement, measured_by=name)
            if self.scheduler.report(request.agent_id, measurement.lease_id, result):
                accepted += 1
            else:
                rejected.append(measurement.lease_id)
        if rejected:
            logger.info("rejected %d late or unknown results from agent %s", len(rejected), request.agent_id[:8])
        return pb.ReportReply(accepted=accepted, rejected_lease_ids=rejected)

    def Leave(self, request: pb.LeaveRequest, context: grpc.ServicerContext) -> pb.LeaveReply:
        self.scheduler.leave(request.agent_id)
        return pb.LeaveReply()


class ClientService(pb_grpc.ClientServiceServicer):
    def __init__(self, manager: JobManager, scheduler: Scheduler, catalog: TemplateCatalog,
                 gate: StandbyGate | None = None) -> None:
        self.manager = manager
        self.scheduler = scheduler
        self.catalog = catalog
        self.gate = gate or StandbyGate()  # who leads, for ListAgents
        self._adhoc_ids = itertools.count(1)

    def SubmitJob(self, request: pb.JobSpec, context: grpc.ServicerContext) -> pb.JobStatus:
        try:
            status = self.manager.submit(spec_from_proto(request))
        except ValueError as exc:  # timing out of bounds
            abort(context, InvalidRequest(str(exc)))
        except FleetError as exc:
            abort(context, exc)
        logger.info("job %d submitted: %s on key %s", status.job_id, status.workload, status.device_key)
        return status_to_proto(status)

    def GetJob(self, request: pb.JobRef, context: grpc.ServicerContext) -> pb.JobStatus:
        try:
            return status_to_proto(self.manager.get(request.job_id))
        except FleetError as exc:
            abort(context, exc)

    def WatchJob(self, request: pb.JobRef, context: grpc.ServicerContext):
        try:
            self.manager.get(request.job_id)
        except FleetError as exc:
            abort(context, exc)
        # A stream ends after MAX_WATCH_S (clients follow it again), so none holds a call slot for good.
        until = time.monotonic() + MAX_WATCH_S
        for status in self.manager.watch(request.job_id, is_active=lambda: context.is_active()
                                         and time.monotonic() < until):
            yield status_to_proto(status)

    def ListJobs(self, request: pb.ListJobsRequest, context: grpc.ServicerContext) -> pb.JobList:
        size = request.page_size if 0 < request.page_size <= MAX_LISTED_JOBS else MAX_LISTED_JOBS
        jobs = [s for s in self.manager.list() if s.job_id > request.after_job_id]
        return pb.JobList(jobs=[status_to_proto(s) for s in jobs[:size]], more=len(jobs) > size)

    def CancelJob(self, request: pb.JobRef, context: grpc.ServicerContext) -> pb.JobStatus:
        try:
            return status_to_proto(self.manager.cancel(request.job_id))
        except FleetError as exc:
            abort(context, exc)

    def Measure(self, request: pb.MeasureRequest, context: grpc.ServicerContext) -> pb.MeasureReply:
        return _measure_configs(self, request, context)

    def ListAgents(self, request: pb.ListAgentsRequest, context: grpc.ServicerContext) -> pb.AgentList:
        if request.key:
            try:
                check_device_key(request.key)
            except DeviceKeyError as exc:
                abort(context, InvalidRequest(str(exc)))
        return fleet_to_proto(fleet_view(self.scheduler, self.manager, self.gate, key=request.key or None,
                                         keys_only=request.keys_only))


def _measure_configs(service: "ClientService", request: pb.MeasureRequest, context: grpc.ServicerContext):
    """Measure listed configs on agents of a key; results are returned, not logged."""
    try:
        workload = parse_workload(request.workload)
        target = parse_target(request.target or "cpu")
        # the space of the key's devices (register tiles follow their ISA); agents check again
        info = service.scheduler.device_info(request.device_key, target.matches if target.has_requirements else None)
        space = service.catalog.space(workload, target.family, DeviceInfo.from_recorded(info))
        if not 1 <= len(request.configs_json) <= MAX_CONFIGS_PER_MEASURE:
            raise InvalidRequest(f"give between 1 and {MAX_CONFIGS_PER_MEASURE} configs")
        configs = [space.from_json(text) for text in request.configs_json]
        timing = timing_from_proto(request.timing) if request.HasField("timing") else TimingConfig()
        check_device_key(request.device_key)
    except (WorkloadError, TemplateNotFound, SteeringError, ConfigError, ValueError) as exc:
        abort(context, InvalidRequest(str(exc)))
    except FleetError as exc:
        abort(context, exc)
    job_id = -next(service._adhoc_ids)  # not a job of the log: negative ids never collide
    items = [MeasureInput(workload, c, target.family) for c in configs]
    requirement = target.matches if target.has_requirements else None
    batch = service.scheduler.submit(request.device_key, job_id, 0, items, timing, requirement)
    since = service.scheduler.now()
    try:
        while batch.remaining:
            if service.scheduler.now() - since > MAX_MEASURE_S:
                abort(context, TimedOut(f"measuring gave up after {MAX_MEASURE_S:g} s"))
            generation = service.scheduler.generation
            if not context.is_active():
                return pb.MeasureReply()
            waited = service.scheduler.seconds_without_agents(request.device_key, since, requirement)
            if request.wait_timeout_s and waited > request.wait_timeout_s:
                abort(context, Unavailable(f"no agent of key {request.device_key!r} for {request.wait_timeout_s:g} s"))
            if batch.remaining:
                service.scheduler.wait_for_change(generation, 0.5)
    finally:
        service.scheduler.cancel_job(job_id)  # no-op when done; drops what is left otherwise
    return pb.MeasureReply(
        measurements=[result_to_proto("", r) for r in batch.results],
        measured_by=[r.measured_by for r in batch.results],
    )


def refusal(request: Registration, peer: str, expected_template_version: str, why: FleetError,
            expected_protocol: int) -> RefusedAgent:
    """What ``tuner agents`` shows of a refused registration: what the agent sent, cut to the
    daemon's limits (it was refused, so any of it may be too long or not text)."""
    caps = request.capabilities

    def text(value: str, most: int = MAX_CAPABILITY_TEXT_CHARS) -> str:
        return storable_text(value, most) if value.isprintable() else shown(value, most)

    host = peer.rsplit(":", 1)[0] if peer.count(":") >= 2 else peer  # "ipv4:10.0.0.5:53212": not the port
    return RefusedAgent(name=text(request.name, MAX_AGENT_NAME_CHARS), key=text(request.key, MAX_AGENT_NAME_CHARS),
                        peer=text(host), agent_version=text(caps.agent_version),
                        template_version=text(caps.template_version),
                        expected_template_version=expected_template_version,
                        protocol_version=request.protocol_version, expected_protocol_version=expected_protocol,
                        reason=text(str(why)))


def _check_agent_name(name: str) -> None:
    if len(name) > MAX_AGENT_NAME_CHARS:
        raise InvalidRequest(f"agent name must be at most {MAX_AGENT_NAME_CHARS} characters, not {len(name)}")
    if not name.isprintable():
        raise InvalidRequest(f"agent name {shown(name)} must be printable text (no control or NUL characters)")


def _check_capabilities(caps: pb.Capabilities) -> None:
    for field, value in caps.ListFields():
        if isinstance(value, str) and (len(value) > MAX_CAPABILITY_TEXT_CHARS or not value.isprintable()):
            raise InvalidRequest(f"capability {field.name} must be printable text of at most "
                                 f"{MAX_CAPABILITY_TEXT_CHARS} characters")
        if is_repeated(field):
            if len(value) > MAX_CAPABILITY_LIST:
                raise InvalidRequest(f"capability {field.name} lists at most {MAX_CAPABILITY_LIST} entries")
            if any(len(item) > MAX_CAPABILITY_TEXT_CHARS or not item.isprintable() for item in value):
                raise InvalidRequest(f"each of capability {field.name} must be printable text of at most "
                                     f"{MAX_CAPABILITY_TEXT_CHARS} characters")


# What an arriving measurement may claim: more would be a broken or hostile agent.
MAX_COST_S = 1e6
MAX_COMPILE_TIME_S = 1e6


def arriving_result(measurement: pb.Measurement, measured_by: str = "") -> MeasureResult:
    """The result an agent (named ``measured_by``) reported, checked as it arrives: one the log could
    not hold (an unknown status, an infinite or negative cost, malformed details) becomes a failed
    result saying why, so the job records it and goes on instead of failing."""
    try:
        result = result_from_proto(measurement)
        if any(not (0 <= c <= MAX_COST_S) for c in result.costs):
            raise ValueError(f"costs must be between 0 and {MAX_COST_S:g} s")
        if not (0 <= result.compile_time_s <= MAX_COMPILE_TIME_S):
            raise ValueError(f"compile time must be between 0 and {MAX_COMPILE_TIME_S:g} s")
    except (ValueError, TypeError, json.JSONDecodeError, RecursionError) as exc:
        return MeasureResult(MeasureStatus.RUNTIME_ERROR, message=f"the agent reported an invalid measurement: "
                                                                  f"{str(exc)[:200]}", measured_by=measured_by)
    return replace(result, message=storable_text(result.message, 4000), measured_by=measured_by)
