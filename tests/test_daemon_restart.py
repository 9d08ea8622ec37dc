"""Jobs live in the database: a daemon killed mid-job resumes them, agents and watchers come back."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from measure_agent.engine import TimingConfig
from tuner.daemon import FleetClient
from tuner.fleet import JobSpec
from tuner.log import TuningLog

from fleet_helpers import free_port, start_agent, start_daemon_process, stop_all, wait_for

pytestmark = pytest.mark.timeout(300)


def test_sigkill_of_the_daemon_mid_job_resumes_without_loss_or_duplicates(tmp_path, kernel_cache_dir, cli_env):
    db = f"sqlite:///{tmp_path / 'daemon.db'}"
    port = free_port()
    address = f"127.0.0.1:{port}"
    daemon = start_daemon_process(db, port, env=cli_env)
    agents = [start_agent(address, "omega", f"omega-{i}", kernel_cache_dir) for i in range(2)]
    watcher = None
    try:
        with FleetClient(address) as client:
            wait_for(lambda: _agent_count(client) == 2, what="agents joined")
            job = client.submit(JobSpec("matmul(M=2,N=2,K=60)", "omega", target="sleep", strategy="random", trials=30,
                                timing=TimingConfig(repeat=1)))
        watcher = subprocess.Popen([sys.executable, "-m", "tuner", "wait", str(job.job_id), "--tracker", address],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env)
        # the watcher must have reached the daemon before it dies (a daemon never reached fails at
        # once): its first progress line says it has
        first = watcher.stderr.readline()
        assert first.startswith("["), first
        with TuningLog(db) as log:
            wait_for(lambda: len(log.trials(workload_key="matmul(M=2,N=2,K=60)")) >= 6, what="some trials logged")
        daemon.send_signal(signal.SIGKILL)
        daemon.wait()
        with TuningLog(db) as log:
            before = len(log.trials(workload_key="matmul(M=2,N=2,K=60)"))
            assert log.get_job(job.job_id).status == "running"
        assert before < 30

        daemon = start_daemon_process(db, port, env=cli_env)
        out, err = watcher.communicate(timeout=240)
        assert watcher.returncode == 0, out + err
        assert "30 in the log" in out
        with TuningLog(db) as log:
            trials = log.trials(workload_key="matmul(M=2,N=2,K=60)")
            configs = {json.dumps(t.config, sort_keys=True) for t in trials}
            assert len(trials) == len(configs) == 30
            assert log.get_job(job.job_id).status == "done"
        with FleetClient(address) as client:
            assert client.job(job.job_id).state == "done"
            # both agents rejoin by themselves (one may still be in its capped backoff when the job ends)
            wait_for(lambda: _agent_count(client) == 2, timeout_s=90, what="both agents back")
    finally:
        stop_all([p for p in (watcher, daemon, *agents) if p is not None])


def _agent_count(client) -> int:
    try:
        return len(client.agents().agents)
    except Exception:  # noqa: BLE001 - daemon still starting
        return 0
