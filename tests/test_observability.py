"""Prometheus metrics, JSON logs and the daemon's command line observability flags."""

from __future__ import annotations

import json
import logging
import urllib.request

import pytest

from measure_agent.engine import MeasureInput, MeasureResult, MeasureStatus, TimingConfig
from measure_agent.space import Config
from measure_agent.workload import parse_workload
from tuner.daemon.observability import JsonLogFormatter, MetricsServer, render_metrics
from tuner.log import TuningLog

from fleet_helpers import free_port, start_daemon, start_daemon_process, stop_all, wait_for


@pytest.fixture()
def daemon(tmp_path):
    with TuningLog(f"sqlite:///{tmp_path / 'm.db'}") as log:
        d = start_daemon(log)
        try:
            yield d
        finally:
            d.stop()


def test_metrics_count_agents_results_errors_and_expiries(daemon):
    s = daemon.scheduler
    agent = s.register("gpu-a", "a1", {}, parallel=1)
    item = MeasureInput(parse_workload("matmul(M=1,N=1,K=1)"), Config((("variant", 0),)), "sleep")
    s.submit("gpu-a", 7, 0, [item, item, item], TimingConfig())
    leases = s.lease(agent.agent_id, 3, 0)
    s.report(agent.agent_id, leases[0].lease_id, MeasureResult(MeasureStatus.OK, costs=(1.0,)))
    s.report(agent.agent_id, leases[1].lease_id, MeasureResult(MeasureStatus.COMPILE_ERROR, message="x"))
    text = render_metrics(daemon)
    assert 'tunefleet_agents{key="gpu-a"} 1' in text
    assert 'tunefleet_busy_agents{key="gpu-a"} 1' in text
    assert "tunefleet_trials_total 2" in text
    assert 'tunefleet_measurement_errors_total{status="compile_error"} 1' in text
    assert 'tunefleet_measurement_errors_total{status="run_timeout"} 0' in text
    assert "tunefleet_lease_expiries_total 0" in text
    assert "# TYPE tunefleet_trials_per_second gauge" in text
    assert 'tunefleet_jobs{state="running"}' in text
    s.leave(agent.agent_id)  # the remaining lease goes back to the queue
    assert 'tunefleet_queued_candidates{key="gpu-a"} 1' in render_metrics(daemon)


def test_metrics_over_http(daemon):
    server = MetricsServer("127.0.0.1:0", daemon).start()
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10).read().decode()
        assert body.startswith("# HELP tunefleet_")
        assert urllib.request.urlopen(f"http://127.0.0.1:{server.port}/healthz", timeout=10).read() == b"ok\n"
    finally:
        server.stop()


def test_json_log_lines():
    record = logging.LogRecord("tunefleet.daemon", logging.WARNING, __file__, 1, "refused %s", ("x",), None)
    line = json.loads(JsonLogFormatter().format(record))
    assert line["level"] == "warning" and line["message"] == "refused x" and line["logger"] == "tunefleet.daemon"


def test_daemon_cli_serves_metrics_and_logs_json(tmp_path, cli_env):
    import subprocess
    import sys

    port, metrics_port = free_port(), free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tuner", "daemon", "--listen", f"127.0.0.1:{port}",
                             "--db", f"sqlite:///{tmp_path / 'd.db'}", "--metrics-listen", f"127.0.0.1:{metrics_port}",
                             "--log-format", "json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env)
    try:
        def scrape():
            try:
                return urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
            except OSError:
                return ""
        assert "tunefleet_agents" in wait_for(scrape, what="metrics endpoint")
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    lines = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    assert any("daemon listening" in line["message"] for line in lines)
