"""The fleet as clients see it: agents per device key, and each key's queue (``tuner agents``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from measure_agent.device import DeviceInfo


@dataclass(frozen=True)
class AgentInfo:
    """One registered agent. ``device_info`` is what the log records for its device
    (:meth:`measure_agent.device.DeviceInfo.to_json` keys plus agent and template versions)."""

    agent_id: str
    key: str
    name: str
    device_info: dict
    templates: tuple[str, ...] = ()
    parallel: int = 1
    leased: int = 0
    peer: str = ""
    seconds_since_heartbeat: float = 0.0
    seconds_since_registered: float = 0.0
    overdue_leases: int = 0  # leases it held past their deadline
    quarantined: bool = False  # gets no more candidates (it kept missing deadlines)

    @property
    def device(self) -> DeviceInfo:
        return DeviceInfo.from_json(self.device_info)

    def to_json(self) -> dict[str, Any]:
        return {"agent_id": self.agent_id, "key": self.key, "name": self.name, "parallel": self.parallel,
                "leased": self.leased, "peer": self.peer,
                "seconds_since_heartbeat": round(self.seconds_since_heartbeat, 3),
                "overdue_leases": self.overdue_leases, "quarantined": self.quarantined,
                "capabilities": self.device_info}


@dataclass(frozen=True)
class KeyInfo:
    """One device key: its agents and the work queued for them."""

    key: str
    agents: int = 0
    busy_agents: int = 0
    queued_candidates: int = 0
    leased_candidates: int = 0
    jobs: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "agents": self.agents, "busy_agents": self.busy_agents,
                "queued_candidates": self.queued_candidates, "leased_candidates": self.leased_candidates,
                "jobs": self.jobs}


@dataclass(frozen=True)
class FleetView:
    agents: tuple[AgentInfo, ...] = ()
    keys: tuple[KeyInfo, ...] = ()
    leader: str = ""  # the leading daemon's address ("" for a single daemon)
    leader_epoch: int = 0  # its lease's epoch (0 for a single daemon)

    def agents_of(self, key: str) -> list[AgentInfo]:
        return [a for a in self.agents if a.key == key]
