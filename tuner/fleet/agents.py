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
class RefusedAgent:
    """A registration the daemon refused, the latest per agent name, key and host: an agent an upgrade
    left on another version, a bad key or name. Shown until an agent of that name and key registers
    (the daemon keeps the most recent ones only)."""

    name: str
    key: str
    peer: str  # the host it called from
    agent_version: str = ""
    template_version: str = ""
    expected_template_version: str = ""  # the daemon's
    protocol_version: int = 0
    expected_protocol_version: int = 0
    reason: str = ""
    seconds_ago: float = 0.0  # since its last refused attempt
    attempts: int = 1

    @property
    def version_mismatch(self) -> bool:
        return (self.template_version != self.expected_template_version
                or self.protocol_version != self.expected_protocol_version)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "peer": self.peer, "agent_version": self.agent_version,
                "template_version": self.template_version,
                "expected_template_version": self.expected_template_version,
                "protocol_version": self.protocol_version, "expected_protocol_version": self.expected_protocol_version,
                "reason": self.reason, "seconds_ago": round(self.seconds_ago, 3), "attempts": self.attempts}


@dataclass(frozen=True)
class FleetView:
    agents: tuple[AgentInfo, ...] = ()
    keys: tuple[KeyInfo, ...] = ()
    refused: tuple[RefusedAgent, ...] = ()
    leader: str = ""  # the leading daemon's address ("" for a single daemon)
    leader_epoch: int = 0  # its lease's epoch (0 for a single daemon)

    def agents_of(self, key: str) -> list[AgentInfo]:
        return [a for a in self.agents if a.key == key]
