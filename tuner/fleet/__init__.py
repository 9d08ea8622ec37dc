"""The application layer: what clients say to the tune-cluster and hear back, and how they reach it.

- :mod:`tuner.fleet.jobs`: :class:`JobSpec` (every field of a tuning job, validated once) and
  :class:`JobStatus` (a job at one moment);
- :mod:`tuner.fleet.agents`: :class:`FleetView` of the registered agents, device keys and refused
  registrations;
- :mod:`tuner.fleet.connect`: :func:`~tuner.fleet.connect.open_fleet`, the daemon at an address or
  an embedded daemon with a local agent, for every command that measures.

The command line, ``tune-model``, ``verify`` and any other client (a web page) use these types;
protobuf messages stay inside ``tuner/daemon``.
"""

from tuner.fleet.agents import AgentInfo, FleetView, KeyInfo, RefusedAgent
from tuner.fleet.jobs import FINAL_STATES, JobSpec, JobSpecError, JobStatus

__all__ = ["FINAL_STATES", "AgentInfo", "FleetView", "JobSpec", "JobSpecError", "JobStatus", "KeyInfo", "RefusedAgent"]
