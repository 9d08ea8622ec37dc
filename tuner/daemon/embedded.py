"""The local path: an embedded daemon and one local agent on loopback, for ``tuner tune``.

A run without ``--tracker`` goes through the same protocol, scheduler and engine as a fleet, so the
quick start exercises the real thing.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from measure_agent.agent import Agent
from measure_agent.device import DeviceInfo
from measure_agent.templates import load_catalog
from tuner.daemon.daemon import Daemon

REGISTRATION_WAIT_S = 120.0  # a first start may import numba and probe the GPU
from tuner.log import TuningLog


@contextmanager
def local_fleet(log: TuningLog, device_key: str, parallel: int = 1, catalog: str = "default",
                cache_dir: Path | None = None, device: DeviceInfo | None = None,
                agents_share_host: bool = True) -> Iterator[Daemon]:
    """A started daemon on 127.0.0.1 with one agent of ``device_key`` joined; both stop on exit.

    The agent times kernels on this process's CPU, so by default the daemon is told so
    (``Daemon(agents_share_host=True)``: jobs of CPU kernels propose only between batches); False
    is for benchmarks that show what proposing during timings costs."""
    daemon = Daemon(log, "127.0.0.1:0", catalog=load_catalog(catalog), heartbeat_interval_s=1.0,
                    agent_timeout_s=30.0, agents_share_host=agents_share_host).start()
    agent = Agent(daemon.address, device_key, name="local", parallel=parallel, catalog=catalog,
                  cache_dir=cache_dir, lease_wait_s=1.0, device=device)
    errors: list[BaseException] = []

    def serve() -> None:
        try:
            agent.run()
        except BaseException as exc:  # noqa: BLE001 - surfaced to the caller below
            errors.append(exc)

    thread = threading.Thread(target=serve, name="tunefleet-local-agent", daemon=True)
    thread.start()
    try:
        _wait_for_agent(daemon, device_key, thread)
        yield daemon
    finally:
        agent.stop()
        thread.join(timeout=60)
        daemon.stop()
    if errors:
        raise errors[0]


def _wait_for_agent(daemon: Daemon, device_key: str, thread: threading.Thread) -> None:
    """Return once the local agent has registered (callers then see its device at once), or when
    its thread ended (the error is raised on exit) or it took too long (the job waits for it)."""
    deadline = time.monotonic() + REGISTRATION_WAIT_S
    while thread.is_alive() and time.monotonic() < deadline:
        generation = daemon.scheduler.generation
        if daemon.scheduler.agent_count(device_key):
            return
        daemon.scheduler.wait_for_change(generation, 0.2)
