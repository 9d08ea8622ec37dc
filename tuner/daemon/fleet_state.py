"""The daemon's live state as typed values of :mod:`tuner.fleet`: what ``ListAgents`` answers and
what the dashboard shows (:class:`tuner.dashboard.live.LiveFleet`)."""

from __future__ import annotations

from measure_agent.protocol.errors import NotFound
from tuner.daemon.jobs import JobManager
from tuner.daemon.leadership import StandbyGate
from tuner.daemon.scheduler import Scheduler
from tuner.fleet.agents import AgentInfo, FleetView, KeyInfo
from tuner.fleet.jobs import JobStatus


def fleet_view(scheduler: Scheduler, manager: JobManager, gate: StandbyGate, key: str | None = None,
               keys_only: bool = False) -> FleetView:
    """Every device key with agents or unfinished jobs, the registered agents (only those of
    ``key`` when given; none with ``keys_only``), the refused registrations and who leads (``gate``)."""
    agents = scheduler.agents()
    now = scheduler.now()
    jobs = [s for s in manager.list() if not s.finished]
    keys = sorted({a.key for a in agents} | {s.device_key for s in jobs})
    key_infos = []
    for each in keys if key is None else [k for k in keys if k == key]:
        queued, leased = scheduler.key_counts(each)
        of_key = [a for a in agents if a.key == each]
        key_infos.append(KeyInfo(
            key=each, agents=len(of_key), busy_agents=sum(1 for a in of_key if a.leases),
            queued_candidates=queued, leased_candidates=leased,
            jobs=sum(1 for s in jobs if s.device_key == each),
        ))
    listed = [] if keys_only else [a for a in agents if key is None or a.key == key]
    return FleetView(
        agents=tuple(AgentInfo(agent_id=a.agent_id, key=a.key, name=a.name, device_info=a.device_info,
                               templates=a.templates, parallel=a.parallel, leased=len(a.leases), peer=a.peer,
                               seconds_since_heartbeat=now - a.last_heartbeat,
                               seconds_since_registered=now - a.registered_at,
                               overdue_leases=a.overdue_leases, quarantined=a.quarantined)
                     for a in listed),
        keys=tuple(key_infos),
        refused=tuple(scheduler.refused()),
        leader=gate.leader_address, leader_epoch=gate.epoch,
    )


class DaemonFleetState:
    """The dashboard's view of a running daemon (see :class:`tuner.dashboard.live.LiveFleet`)."""

    def __init__(self, scheduler: Scheduler, manager: JobManager, gate: StandbyGate) -> None:
        self.scheduler = scheduler
        self.manager = manager
        self.gate = gate

    def fleet_view(self) -> FleetView:
        return fleet_view(self.scheduler, self.manager, self.gate)

    def job_statuses(self) -> list[JobStatus]:
        return self.manager.list()

    def cancel(self, job_id: int) -> JobStatus:
        from tuner.dashboard.live import CancelRefused

        try:
            return self.manager.cancel(job_id)  # the same path as the gRPC CancelJob
        except NotFound as exc:
            raise CancelRefused(str(exc)) from None

    def results_per_second(self) -> float:
        return self.scheduler.results_per_second()
