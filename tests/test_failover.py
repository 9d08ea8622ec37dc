"""No single point of failure (issue 22): daemons on one PostgreSQL log, a leader and a standby.

Real `tuner daemon` processes, real agents and `tuner wait` clients given both addresses; the leader is
SIGKILLed or frozen (SIGSTOP, SIGCONT after the takeover) mid-job. Every job ends with exactly its
budget of distinct trials, and a deposed leader records nothing and exits 75.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from measure_agent.engine import TimingConfig
from tuner.daemon import FleetClient
from tuner.fleet import JobSpec
from tuner.log import TuningLog

from fleet_helpers import free_port, start_agent, stop_all, wait_for
from test_leadership import pg_url  # noqa: F401 - fixture
from test_tuning_log import pg_admin  # noqa: F401 - fixture of pg_url

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(300)]
FAST = TimingConfig(repeat=1, warmup=0, run_timeout_s=10)
LEASE_TTL_S = 2.0  # short, so the tests wait little; the default is 5 s


def start_daemon(db_url: str, port: int, metrics_port: int | None = None) -> subprocess.Popen:
    metrics = ["--metrics-listen", f"127.0.0.1:{metrics_port}"] if metrics_port else []
    return subprocess.Popen(
        [sys.executable, "-m", "tuner", "daemon", "--listen", f"127.0.0.1:{port}", "--db", db_url,
         "--templates", "testing", "--heartbeat-interval", "0.3", "--agent-timeout", "2",
         "--lease-ttl", str(LEASE_TTL_S), *metrics],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def readyz(metrics_port: int) -> int:
    import urllib.error
    import urllib.request

    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/readyz", timeout=2).status
    except urllib.error.HTTPError as exc:
        return exc.code


def leader_metric(metrics_port: int) -> float | None:
    import urllib.request

    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=2).read().decode()
    except OSError:
        return None
    return next((float(line.split()[1]) for line in text.splitlines() if line.startswith("tunefleet_leader ")), None)


def health(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        try:
            return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=2).status
        except grpc.RpcError:
            return -1


def leading(address: str) -> bool:
    return health(address) == health_pb2.HealthCheckResponse.SERVING


def recorded(db_url: str, workload: str, key: str) -> tuple[int, int]:
    """(trials, distinct configs) of a workload on a key, as the log holds them."""
    with TuningLog(db_url) as log:
        trials = log.trials(workload_key=workload, device_key=key, target="sleep")
    return len(trials), len({json.dumps(t.config, sort_keys=True) for t in trials})


def test_a_standby_answers_not_serving_names_the_leader_and_clients_follow(pg_url, cli_env):
    a, b, metrics_a, metrics_b = free_port(), free_port(), free_port(), free_port()
    first = start_daemon(pg_url, a, metrics_a)
    try:
        wait_for(lambda: leading(f"127.0.0.1:{a}"), what="the first daemon leading")
        second = start_daemon(pg_url, b, metrics_b)
        try:
            wait_for(lambda: health(f"127.0.0.1:{b}") == health_pb2.HealthCheckResponse.NOT_SERVING,
                     what="the standby answering health")
            wait_for(lambda: leader_metric(metrics_b) is not None, what="the standby's metrics")
            assert (leader_metric(metrics_a), leader_metric(metrics_b)) == (1.0, 0.0)
            assert (readyz(metrics_a), readyz(metrics_b)) == (200, 503)  # Kubernetes' readiness
            direct = subprocess.run([sys.executable, "-m", "tuner", "agents", "--tracker", f"127.0.0.1:{b}"],
                                    capture_output=True, text=True, env=cli_env, timeout=60)
            assert direct.returncode == 1
            assert f"standby; the leader is at 127.0.0.1:{a}" in direct.stderr and direct.stderr.count("\n") == 1
            both = subprocess.run([sys.executable, "-m", "tuner", "agents", "--json",
                                   "--tracker", f"127.0.0.1:{b},127.0.0.1:{a}"],
                                  capture_output=True, text=True, env=cli_env, timeout=60)
            assert both.returncode == 0, both.stderr
            view = json.loads(both.stdout)
            assert view["leader"] == f"127.0.0.1:{a}" and view["leader_epoch"] == 1
        finally:
            stop_all([second])
    finally:
        stop_all([first])
    # a gracefully stopped leader released its lease: nothing to wait for at the next start
    assert first.returncode == 0


def _run_job_through(pg_url, cli_env, kernel_cache_dir, disturb) -> dict:
    """A job on two agents through a leader and a standby; ``disturb(leader_process, addresses)``
    acts mid-job. Returns what the test checks."""
    a, b = free_port(), free_port()
    tracker = f"127.0.0.1:{a},127.0.0.1:{b}"
    daemons = {a: start_daemon(pg_url, a)}
    agents, waiter = [], None
    try:
        wait_for(lambda: leading(f"127.0.0.1:{a}"), what="the first daemon leading")
        daemons[b] = start_daemon(pg_url, b)
        wait_for(lambda: health(f"127.0.0.1:{b}") == health_pb2.HealthCheckResponse.NOT_SERVING, what="standby")
        agents = [start_agent(tracker, "fo", f"fo-{i}", kernel_cache_dir) for i in range(2)]
        workload = "matmul(M=2,N=2,K=30)"
        with FleetClient(tracker) as client:
            wait_for(lambda: len(client.agents().agents_of("fo")) == 2, what="two agents")
            job = client.submit(JobSpec(workload, "fo", target="sleep", strategy="random", trials=60, timing=FAST))
        waiter = subprocess.Popen([sys.executable, "-m", "tuner", "wait", str(job.job_id), "--tracker", tracker],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env)
        wait_for(lambda: recorded(pg_url, workload, "fo")[0] >= 10, what="the job under way")
        outcome = disturb(daemons[a], (f"127.0.0.1:{a}", f"127.0.0.1:{b}"))
        out, err = waiter.communicate(timeout=240)
        outcome.update(wait_rc=waiter.returncode, wait_out=out, wait_err=err,
                       trials=recorded(pg_url, workload, "fo"))
        return outcome
    finally:
        stop_all(agents + ([waiter] if waiter else []) + list(daemons.values()))


def test_sigkill_of_the_leader_mid_job_loses_and_repeats_nothing(pg_url, cli_env, kernel_cache_dir):
    def kill(leader, addresses):
        leader.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        wait_for(lambda: leading(addresses[1]), timeout_s=30, what="the standby taking over")
        return {"takeover_s": time.monotonic() - killed}

    outcome = _run_job_through(pg_url, cli_env, kernel_cache_dir, kill)
    assert outcome["wait_rc"] == 0, outcome["wait_err"]
    assert "60 in the log" in outcome["wait_out"]
    assert outcome["trials"] == (60, 60)  # exactly the budget, all distinct
    assert outcome["takeover_s"] <= LEASE_TTL_S + 10  # documented bound: TTL + poll; generous under load


def test_a_frozen_leader_that_wakes_after_a_takeover_records_nothing_and_exits(pg_url, cli_env, kernel_cache_dir):
    def freeze(leader, addresses):
        leader.send_signal(signal.SIGSTOP)
        try:
            wait_for(lambda: health(addresses[1]) == health_pb2.HealthCheckResponse.SERVING, timeout_s=30,
                     what="the standby taking over from a frozen leader")
        finally:
            leader.send_signal(signal.SIGCONT)
        out, _ = leader.communicate(timeout=60)  # it notices, refuses everything and exits
        return {"old_rc": leader.returncode, "old_out": out}

    outcome = _run_job_through(pg_url, cli_env, kernel_cache_dir, freeze)
    assert outcome["old_rc"] == 75, outcome["old_out"]
    assert "deposed" in outcome["old_out"]
    assert outcome["wait_rc"] == 0, outcome["wait_err"]
    assert outcome["trials"] == (60, 60)


def test_a_second_daemon_on_a_sqlite_log_is_refused(tmp_path, cli_env):
    db = tmp_path / "one.db"
    port = free_port()
    first = subprocess.Popen([sys.executable, "-m", "tuner", "daemon", "--listen", f"127.0.0.1:{port}", "--db",
                              str(db), "--templates", "testing"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, env=cli_env)
    try:
        wait_for(lambda: leading(f"127.0.0.1:{port}"), what="the first daemon")
        second = subprocess.run([sys.executable, "-m", "tuner", "daemon", "--listen", f"127.0.0.1:{free_port()}",
                                 "--db", str(db), "--templates", "testing"], capture_output=True, text=True,
                                env=cli_env, timeout=60)
        assert second.returncode == 1
        assert f"pid {first.pid}" in second.stderr and "SQLite holds one daemon" in second.stderr
        assert "PostgreSQL" in second.stderr and second.stderr.count("\n") == 1
    finally:
        stop_all([first])
    os.kill(os.getpid(), 0)  # (the lock went with the first daemon: a new one starts)
    again = subprocess.Popen([sys.executable, "-m", "tuner", "daemon", "--listen", f"127.0.0.1:{port}", "--db",
                              str(db), "--templates", "testing"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, env=cli_env)
    try:
        wait_for(lambda: leading(f"127.0.0.1:{port}"), what="a new daemon after the first stopped")
    finally:
        stop_all([again])
