"""How a client reaches a fleet: the daemon at an address, or an embedded daemon and one local agent.

:func:`open_fleet` is the one way every command that measures (``tune``, ``tune-model``,
``verify``) gets a :class:`~tuner.daemon.FleetClient`: without an address it starts the embedded
daemon of :mod:`tuner.daemon.embedded` on loopback with an agent of this host, so local and remote
runs go through the same protocol, scheduler and engine.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator

if TYPE_CHECKING:
    from measure_agent.device import DeviceInfo
    from measure_agent.protocol.connection import TlsFiles
    from tuner.daemon import FleetClient


class LocalFleetError(Exception):
    """This host cannot measure what was asked (no GPU for CUDA, a target it does not match)."""


@dataclass(frozen=True)
class FleetSession:
    """An open fleet: its client, the device key whose agents measure, and whether it is embedded."""

    client: "FleetClient"
    device_key: str
    embedded: bool


def check_local_target(target: str) -> "DeviceInfo":
    """This host's device when it can measure ``target``; raises :class:`LocalFleetError` saying
    why not (before anything is started or recorded), or ``SteeringError`` for a bad target."""
    from measure_agent.device import cuda_simulated, detect_device, detect_gpu
    from tuner.steering import parse_target

    spec = parse_target(target)
    if spec.family == "cuda" and not detect_gpu() and not cuda_simulated():
        raise LocalFleetError("no CUDA GPU on this host: measure CUDA kernels on a fleet (--tracker HOST:PORT "
                              "--rpc-key KEY of CUDA agents), or set NUMBA_ENABLE_CUDASIM=1 to check templates in "
                              "numba's simulator")
    device = detect_device()
    if spec.has_requirements and not spec.matches(device.to_json()):
        raise LocalFleetError(f"this host ({spec.offered([device.to_json()])}) does not match "
                              f"target {spec.text!r}; run it on a fleet with --tracker")
    return device


@contextmanager
def open_fleet(tracker: str | None, device_key: str | None = None, *, target: str = "cpu",
               db: str | None = None, parallel: int = 1, token: str | None = None,
               tls: "TlsFiles | None" = None,
               on_outage: Callable[[str], None] | None = None) -> Iterator[FleetSession]:
    """The fleet at ``tracker`` (``device_key`` required: whose agents measure), or without one an
    embedded daemon on loopback over the tuning log ``db`` (a URL or path; default from
    :mod:`tuner.settings`) with one agent of this host (``parallel`` build workers) under
    ``device_key`` (default: this host's key). Everything started stops on exit.

    Raises ``ValueError`` for a missing device key, :class:`LocalFleetError` when this host cannot
    measure ``target``, and :class:`~tuner.log.TuningLogError` when the log cannot be opened.
    """
    from tuner.daemon import FleetClient

    if tracker:
        if not device_key:
            raise ValueError("a fleet needs the device key of the agents to use")
        with FleetClient(tracker, token=token, tls=tls, on_outage=on_outage) as client:
            yield FleetSession(client, device_key, embedded=False)
        return
    from tuner.daemon.embedded import local_fleet
    from tuner.log import TuningLog
    from tuner.settings import resolve_db_url

    device = check_local_target(target)
    device_key = device_key or device.default_key
    with TuningLog(resolve_db_url(db)) as log, local_fleet(log, device_key, parallel=parallel,
                                                           device=device) as daemon:
        with FleetClient(daemon.address, on_outage=on_outage) as client:
            yield FleetSession(client, device_key, embedded=True)
