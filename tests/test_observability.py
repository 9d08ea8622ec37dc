"""Prometheus metrics, JSON logs and the daemon's command line observability flags."""

from __future__ import annotations

import json
import logging
import re
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from measure_agent.engine import MeasureInput, MeasureResult, MeasureStatus, TimingConfig
from measure_agent.space import Config
from measure_agent.workload import parse_workload
from tuner.daemon.observability import DaemonMetrics, JsonLogFormatter, MetricsServer, render_metrics
from tuner.daemon.scheduler import Scheduler
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


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """Every sample of an exposition, by (name, sorted labels)."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def measure_one(scheduler, key: str, result: MeasureResult) -> None:
    agent = scheduler.register(key, "a1", {}, parallel=1)
    item = MeasureInput(parse_workload("matmul(M=1,N=1,K=1)"), Config((("variant", 0),)), "sleep")
    scheduler.submit(key, 7, 0, [item], TimingConfig())
    [lease] = scheduler.lease(agent.agent_id, 1, 0)
    assert scheduler.report(agent.agent_id, lease.lease_id, result)


def test_metrics_count_agents_results_errors_and_expiries(daemon):
    s = daemon.scheduler
    agent = s.register("gpu-a", "a1", {}, parallel=1)
    item = MeasureInput(parse_workload("matmul(M=1,N=1,K=1)"), Config((("variant", 0),)), "sleep")
    s.submit("gpu-a", 7, 0, [item, item, item], TimingConfig())
    leases = s.lease(agent.agent_id, 3, 0)
    s.report(agent.agent_id, leases[0].lease_id, MeasureResult(MeasureStatus.OK, costs=(1.0,)))
    s.report(agent.agent_id, leases[1].lease_id, MeasureResult(MeasureStatus.COMPILE_ERROR, message="x"))
    text = render_metrics(daemon)
    values = samples(text)
    assert values[("tunefleet_agents", (("key", "gpu-a"),))] == 1
    assert values[("tunefleet_busy_agents", (("key", "gpu-a"),))] == 1
    assert values[("tunefleet_trials_total", ())] == 2
    assert values[("tunefleet_measurement_errors_total", (("status", "compile_error"),))] == 1
    assert values[("tunefleet_measurement_errors_total", (("status", "run_timeout"),))] == 0
    assert values[("tunefleet_lease_expiries_total", ())] == 0
    assert values[("tunefleet_refused_calls_total", ())] == 0
    assert "# TYPE tunefleet_trials_per_second gauge" in text
    assert ("tunefleet_jobs", (("state", "running"),)) in values
    s.leave(agent.agent_id)  # the remaining lease goes back to the queue
    assert samples(render_metrics(daemon))[("tunefleet_queued_candidates", (("key", "gpu-a"),))] == 1


def test_results_fill_compile_run_and_lease_latency_histograms():
    now = [100.0]
    metrics = DaemonMetrics()
    scheduler = Scheduler(heartbeat_interval_s=1, agent_timeout_s=50, clock=lambda: now[0],
                          on_result=metrics.observe_result)
    agent = scheduler.register("cpu-x", "a1", {}, parallel=1)
    item = MeasureInput(parse_workload("matmul(M=1,N=1,K=1)"), Config((("variant", 0),)), "sleep")
    scheduler.submit("cpu-x", 1, 0, [item, item], TimingConfig())
    first, second = scheduler.lease(agent.agent_id, 2, 0)
    now[0] += 7.0  # seven seconds on the agent
    scheduler.report(agent.agent_id, first.lease_id,
                     MeasureResult(MeasureStatus.OK, costs=(2e-4, 5e-5), compile_time_s=0.3))
    now[0] += 40.0
    scheduler.report(agent.agent_id, second.lease_id, MeasureResult(MeasureStatus.RUN_TIMEOUT, compile_time_s=2.0))
    scheduler.report(agent.agent_id, second.lease_id, MeasureResult(MeasureStatus.OK, costs=(1.0,)))  # rejected
    values = samples(metrics.exposition().decode())
    key = (("key", "cpu-x"),)

    def bucket(name: str, le: str) -> float:
        return values[(f"tunefleet_{name}_bucket", tuple(sorted(key + (("le", le),))))]

    assert values[("tunefleet_lease_to_result_seconds_count", key)] == 2
    assert values[("tunefleet_lease_to_result_seconds_sum", key)] == pytest.approx(7.0 + 47.0)
    assert bucket("lease_to_result_seconds", "5.0") == 0 and bucket("lease_to_result_seconds", "10.0") == 1
    assert bucket("lease_to_result_seconds", "60.0") == 2
    assert values[("tunefleet_compile_seconds_count", key)] == 2  # failed runs compiled too
    assert values[("tunefleet_compile_seconds_sum", key)] == pytest.approx(2.3)
    assert values[("tunefleet_kernel_run_seconds_count", key)] == 1  # only the correct result has a time
    assert values[("tunefleet_kernel_run_seconds_sum", key)] == pytest.approx(5e-5)  # best of the repeats
    assert bucket("kernel_run_seconds", "3e-05") == 0 and bucket("kernel_run_seconds", "0.0001") == 1


def test_process_metrics_are_exported(daemon):
    names = {name for name, _ in samples(render_metrics(daemon))}
    assert "python_info" in names and "python_gc_collections_total" in names
    if sys.platform.startswith("linux"):  # the library reads /proc
        assert {"process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds"} <= names


def test_daemons_in_one_process_keep_their_own_metrics(tmp_path, daemon):
    with TuningLog(f"sqlite:///{tmp_path / 'other.db'}") as log:
        other = start_daemon(log)
        try:
            measure_one(other.scheduler, "other-key", MeasureResult(MeasureStatus.OK, costs=(1e-3,)))
            measure_one(other.scheduler, "other-key", MeasureResult(MeasureStatus.OK, costs=(1e-3,)))
            measure_one(daemon.scheduler, "gpu-a", MeasureResult(MeasureStatus.OK, costs=(1e-3,)))
            mine, theirs = samples(render_metrics(daemon)), samples(render_metrics(other))
        finally:
            other.stop()
    assert mine[("tunefleet_trials_total", ())] == 1 and theirs[("tunefleet_trials_total", ())] == 2
    assert mine[("tunefleet_lease_to_result_seconds_count", (("key", "gpu-a"),))] == 1
    assert ("tunefleet_lease_to_result_seconds_count", (("key", "other-key"),)) not in mine
    assert theirs[("tunefleet_lease_to_result_seconds_count", (("key", "other-key"),))] == 2


def test_metrics_over_http(daemon):
    server = MetricsServer("127.0.0.1:0", daemon).start()
    base = f"http://127.0.0.1:{server.port}"
    try:
        body = urllib.request.urlopen(f"{base}/metrics", timeout=10).read().decode()
        assert samples(body)[("tunefleet_trials_total", ())] == 0
        assert urllib.request.urlopen(f"{base}/healthz", timeout=10).read() == b"ok\n"
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(f"{base}/nothing", timeout=10)
        assert missing.value.code == 404
        # the library's content negotiation: OpenMetrics for a Prometheus that asks for it
        request = urllib.request.Request(f"{base}/metrics", headers={"Accept": "application/openmetrics-text"})
        with urllib.request.urlopen(request, timeout=10) as reply:
            assert reply.headers["Content-Type"].startswith("application/openmetrics-text")
            assert reply.read().decode().rstrip().endswith("# EOF")
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


DASHBOARD = Path(__file__).resolve().parents[1] / "deploy" / "grafana" / "tunefleet.json"
METRIC_NAME = re.compile(r"\b(?:tunefleet|process|python)_[a-zA-Z0-9_]+")


def test_grafana_dashboard_queries_only_metrics_the_daemon_exports(daemon):
    measure_one(daemon.scheduler, "gpu-a", MeasureResult(MeasureStatus.OK, costs=(1e-3,), compile_time_s=0.5))
    exported = {name for name, _ in samples(render_metrics(daemon))}
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    assert len(exprs) >= len(dashboard["panels"]) >= 10
    scrape_job = yaml.safe_load((DASHBOARD.parents[1] / "prometheus.yml").read_text())["scrape_configs"][0]["job_name"]
    [job_variable] = [v for v in dashboard["templating"]["list"] if v["name"] == "job"]
    assert job_variable["query"] == scrape_job  # the dashboard selects what deploy/prometheus.yml scrapes
    queried = set()
    for expr in exprs:
        names = METRIC_NAME.findall(expr)
        assert names, f"no metric in {expr!r}"
        missing = [n for n in names if n not in exported]
        assert not missing, f"{expr!r} queries {missing}, which the daemon does not export"
        queried |= set(names)
    assert {"tunefleet_compile_seconds_bucket", "tunefleet_kernel_run_seconds_bucket",
            "tunefleet_lease_to_result_seconds_bucket", "process_cpu_seconds_total"} <= queried
