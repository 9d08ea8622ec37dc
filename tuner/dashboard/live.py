"""What the dashboard knows beyond the log when it runs inside a daemon: fleet, job states, cancel.

The dashboard speaks only typed values of :mod:`tuner.fleet` here (never protobuf); the daemon
gives an implementation (:class:`tuner.daemon.fleet_state.DaemonFleetState`), and ``tuner
dashboard`` on a bare log has none (``live is None``).
"""

from __future__ import annotations

from typing import Protocol

from tuner.fleet.agents import FleetView
from tuner.fleet.jobs import JobStatus


class CancelRefused(LookupError):
    """The job cannot be cancelled here (unknown to the daemon, or no daemon)."""


class LiveFleet(Protocol):
    def fleet_view(self) -> FleetView:
        """Agents and device keys as they are now."""

    def job_statuses(self) -> list[JobStatus]:
        """The jobs the daemon holds in memory (running and recently finished)."""

    def cancel(self, job_id: int) -> JobStatus:
        """Cancel a job the way the gRPC ``CancelJob`` does; :class:`CancelRefused` for an unknown one."""

    def results_per_second(self) -> float:
        """Measurements reported by agents per second over the last minute."""
