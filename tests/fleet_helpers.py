"""Starting daemons and agent processes on loopback for fleet tests."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from measure_agent.templates import testing_catalog
from tuner.daemon import Daemon


def start_daemon(log, listen="127.0.0.1:0", **kwargs) -> Daemon:
    kwargs.setdefault("heartbeat_interval_s", 0.3)
    kwargs.setdefault("agent_timeout_s", 2.0)
    return Daemon(log, listen, catalog=testing_catalog(), **kwargs).start()


def start_agent(address: str, key: str, name: str, cache_dir, parallel: int = 2, templates: str = "testing",
                extra_args: tuple[str, ...] = ()):
    env = dict(os.environ, XDG_CACHE_HOME=str(cache_dir))
    return subprocess.Popen(
        [sys.executable, "-m", "measure_agent", "--tracker", address, "--key", key, "--name", name,
         "--parallel", str(parallel), "--templates", templates, *extra_args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )


def wait_for(predicate, timeout_s: float = 60.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def agent_names(daemon: Daemon, key: str | None = None) -> set[str]:
    return {a.name for a in daemon.scheduler.agents() if key is None or a.key == key}


def stop_all(processes):
    for p in processes:
        if p.poll() is None:
            p.terminate()
    for p in processes:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_daemon_process(db_url: str, port: int, env=None) -> subprocess.Popen:
    """``tuner daemon`` as its own process (to be killed with SIGKILL in tests)."""
    return subprocess.Popen(
        [sys.executable, "-m", "tuner", "daemon", "--listen", f"127.0.0.1:{port}", "--db", db_url,
         "--templates", "testing", "--heartbeat-interval", "0.3", "--agent-timeout", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )
