"""The dashboard's JSON API and access rules over HTTP (starlette's TestClient, no browser)."""

from __future__ import annotations

import json
import warnings

import pytest

pytest.importorskip("starlette")
pytest.importorskip("httpx")

from measure_agent.templates import testing_catalog  # noqa: E402
from measure_agent.workload import parse_workload  # noqa: E402
from tuner.cli.common import CliError  # noqa: E402
from tuner.dashboard.app import DashboardAccess, create_app  # noqa: E402
from tuner.dashboard.live import CancelRefused  # noqa: E402
from tuner.fleet.agents import AgentInfo, FleetView, KeyInfo  # noqa: E402
from tuner.fleet.jobs import JobSpec, JobStatus  # noqa: E402
from tuner.log import TuningLog  # noqa: E402

from dashboard_helpers import DEVICES, FAILED_PER_JOB, FAILURE_MESSAGE, OK_PER_JOB, OTHER_SHAPE, WL, fill_log  # noqa: E402

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient  # noqa: E402

TOKEN = "s3cret-client-token-0123456789"
PAGES = ["/", "/jobs/1", "/workloads", f"/workload?key={WL}", "/agents",
         f"/kernel?workload={WL}&device={DEVICES[0]}&target=sleep"]


@pytest.fixture()
def log(tmp_path):
    with TuningLog(f"sqlite:///{tmp_path / 'dash.db'}") as log:
        fill_log(log)
        yield log


class FakeLive:
    """A daemon's live state as the dashboard sees it (typed values only)."""

    def __init__(self) -> None:
        self.cancelled: list[int] = []
        spec = JobSpec(WL, DEVICES[0], target="sleep")
        self.status = JobStatus(job_id=1, state="running", spec=spec, queued_candidates=3)

    def fleet_view(self) -> FleetView:
        agent = AgentInfo(agent_id="a1", key=DEVICES[0], name=f"{DEVICES[0]}-agent", device_info={"arch": "x86_64"},
                          leased=2, quarantined=True, overdue_leases=3)
        return FleetView(agents=(agent,), keys=(KeyInfo(DEVICES[0], agents=1, busy_agents=1, jobs=1),))

    def job_statuses(self):
        return [self.status]

    def cancel(self, job_id: int) -> JobStatus:
        if job_id != 1:
            raise CancelRefused(f"no job {job_id} in this daemon")
        self.cancelled.append(job_id)
        return JobStatus(job_id=1, state="cancelled", spec=self.status.spec)

    def results_per_second(self) -> float:
        return 12.5


def client(log, live=None, tokens=()):
    app = create_app(log, live=live, catalog=testing_catalog(), access=DashboardAccess(tokens))
    return TestClient(app)


def test_api_answers_what_the_pages_show(log):
    c = client(log)
    overview = c.get("/api/overview").json()
    assert overview["jobs_by_state"] == {"done": 2}
    assert {k["key"] for k in overview["keys"]} == set(DEVICES)
    assert len(overview["recent_errors"]) == 2 * FAILED_PER_JOB
    assert overview["recent_errors"][0]["message"] == FAILURE_MESSAGE

    job = c.get("/api/jobs/1").json()
    assert (job["trials"], job["failed"], job["ok_trials"]) == (OK_PER_JOB + FAILED_PER_JOB, FAILED_PER_JOB, OK_PER_JOB)
    assert job["spec"]["pins"] == ["variant=1"] and job["spec"]["workload"] == parse_workload(WL).key
    assert job["top"][0]["config"] == {"variant": OK_PER_JOB - 1}  # the last ok trial is the fastest
    assert job["top"][0]["diff_from_default"] == {"variant": [0, OK_PER_JOB - 1]}
    assert any(t["is_default"] for t in job["top"])  # variant 0 is the sleep template's default
    series = job["series"]
    assert series["trial"] == list(range(1, OK_PER_JOB + FAILED_PER_JOB + 1))
    assert series["best"][-1] == max(g for g in series["gflops"] if g is not None)
    assert series["failed"].count(0) == FAILED_PER_JOB
    assert job["can_cancel"] is False  # no daemon behind a bare log

    failed = c.get("/api/jobs/1/trials", params={"status": "failed"}).json()
    assert failed["total"] == FAILED_PER_JOB and all(t["status"] == "compile_error" for t in failed["trials"])
    assert c.get("/api/jobs/1/trials", params={"status": "ok"}).json()["total"] == OK_PER_JOB

    workload = c.get("/api/workload", params={"key": WL}).json()
    fast, slow = workload["devices"]
    assert (fast["device_key"], slow["device_key"]) == DEVICES
    assert fast["vs_fastest"] == 1.0 and slow["vs_fastest"] == pytest.approx(0.5, rel=1e-3)
    assert [len(h["time"]) for h in workload["history"]] == [OK_PER_JOB + FAILED_PER_JOB] * 2
    [family] = workload["shapes"]
    assert {m["workload"] for m in family["members"]} == {parse_workload(WL).key, parse_workload(OTHER_SHAPE).key}

    kernel = c.get("/api/kernel", params={"workload": WL, "device": DEVICES[0], "target": "sleep"}).json()
    assert kernel["config"] == {"variant": OK_PER_JOB - 1} and "time.sleep(3 / 1000.0)" in kernel["source"]
    default = c.get("/api/kernel", params={"workload": WL, "device": DEVICES[0], "target": "sleep",
                                           "config": "default"}).json()
    assert default["config"] == {"variant": 0}

    agents = c.get("/api/agents").json()
    assert agents["live"] is False and agents["agents"] == []
    assert {a["name"]: a["failed"] for a in agents["measured_by"]} == {f"{d}-agent": FAILED_PER_JOB for d in DEVICES}


@pytest.mark.parametrize("path, status, message", [
    ("/api/jobs/99", 404, "no job 99 in the tuning log"),
    ("/api/jobs/0", 400, "a job id is a positive integer, not '0'"),
    ("/api/jobs/1/trials?status=bogus", 400, "status must be one of failed"),
    ("/api/workload?key=matmul(M=7,N=7,K=7)", 404, "no workload matmul(M=7,N=7,K=7"),
    ("/api/workload?key=nonsense(", 400, ""),
    ("/api/workload", 400, "missing query parameter 'key'"),
    (f"/api/kernel?workload={WL}&device=nobody&target=sleep", 404, "no device 'nobody'"),
    (f"/api/kernel?workload={WL}&device={DEVICES[0]}&target=sleep&config=%7B%22variant%22:-5%7D", 400,
     "invalid config"),
])
def test_bad_requests_get_one_line_errors(log, path, status, message):
    c = client(log)
    reply = c.get(path)
    assert reply.status_code == status
    error = reply.json()["error"]
    assert message in error and "\n" not in error and "Traceback" not in error


def test_every_page_renders_and_the_failure_message_is_escaped(log):
    c = client(log)
    for path in PAGES:
        reply = c.get(path)
        assert reply.status_code == 200, path
        assert "<script>alert" not in reply.text  # data sits in a JSON script block with < escaped
        assert "default-src 'self'" in reply.headers["content-security-policy"]
    assert c.get("/jobs/99").status_code == 404
    assert "no job 99" in c.get("/jobs/99").text


def test_static_assets_ship_in_the_package(log):
    c = client(log)
    for asset in ("vendor/uPlot.iife.min.js", "vendor/uPlot.min.css", "vendor/uPlot.LICENSE", "convergence.js",
                  "dashboard.js", "dashboard.css"):
        assert c.get(f"/static/{asset}").status_code == 200, asset
    for path in PAGES:  # no page loads anything from elsewhere
        assert "https://" not in c.get(path).text and "http://" not in c.get(path).text


def test_cancel_needs_the_client_token_and_never_shows_it(log):
    live = FakeLive()
    c = client(log, live=live, tokens=(TOKEN,))
    for path in PAGES + ["/api/overview", "/api/jobs/1", "/api/agents"]:
        assert TOKEN not in c.get(path).text
    assert c.get("/api/jobs/1").json()["can_cancel"] is True
    assert c.post("/api/jobs/1/cancel", json={}).status_code == 401
    assert c.post("/api/jobs/1/cancel", json={}, headers={"Authorization": "Bearer wrong-token-xxxxxxxx"}
                  ).status_code == 401
    assert live.cancelled == []
    ok = c.post("/api/jobs/1/cancel", json={}, headers={"Authorization": f"Bearer {TOKEN}"})
    assert ok.status_code == 200 and ok.json()["state"] == "cancelled" and live.cancelled == [1]
    unknown = c.post("/api/jobs/7/cancel", json={}, headers={"Authorization": f"Bearer {TOKEN}"})
    assert unknown.status_code == 404 and "no job 7" in unknown.json()["error"]


def test_cancel_refuses_cross_site_requests_and_bare_logs(log):
    live = FakeLive()
    c = client(log, live=live)  # loopback without tokens: same-origin JSON may cancel
    assert c.post("/api/jobs/1/cancel", json={}, headers={"Origin": "http://evil.example"}).status_code == 403
    assert c.post("/api/jobs/1/cancel", content="x", headers={"Content-Type": "text/plain"}).status_code == 415
    assert c.get("/api/jobs/1/cancel").status_code == 405
    assert live.cancelled == []
    assert c.post("/api/jobs/1/cancel", json={}).status_code == 200 and live.cancelled == [1]
    bare = client(log).post("/api/jobs/1/cancel", json={})
    assert bare.status_code == 409 and "tuner cancel" in bare.json()["error"]


def test_live_state_shows_agents_quarantine_and_queued_jobs(log):
    c = client(log, live=FakeLive())
    overview = c.get("/api/overview").json()
    assert overview["trials_per_second"] == 12.5 and overview["trials_per_second_source"] == "daemon"
    assert overview["jobs_by_state"] == {"done": 1, "running": 1}
    [key] = overview["keys"]
    assert key["health"] == "degraded" and key["quarantined_agents"] == 1
    [agent] = c.get("/api/agents").json()["agents"]
    assert agent["quarantined"] is True and agent["leased"] == 2 and agent["failed"] == FAILED_PER_JOB
    assert agent["capabilities"] == {"arch": "x86_64"}


def test_loopback_only_answers_loopback_host_names(log):
    from tuner.cli.dashboard import dashboard_access

    access, warnings_ = dashboard_access("127.0.0.1:8080", (), tls=False)
    c = TestClient(create_app(log, access=access), base_url="http://127.0.0.1:8080")
    assert c.get("/api/jobs").status_code == 200
    assert c.get("/api/jobs", headers={"Host": "attacker.example"}).status_code == 400  # DNS rebinding
    with pytest.raises(CliError, match="without --client-token-file"):
        dashboard_access("0.0.0.0:8080", (), tls=False)
    access, warnings_ = dashboard_access("0.0.0.0:8080", (TOKEN,), tls=False)
    assert access.client_tokens == (TOKEN,) and "without TLS" in warnings_[0]


def test_dashboard_command_refuses_bad_setups_in_one_line(log, tmp_path, capsys):
    from tuner.cli import main

    assert main(["dashboard", "--db", str(tmp_path / "missing.db")]) in (1, 2)
    err = capsys.readouterr().err
    assert "no tuning log" in err and "Traceback" not in err
    assert main(["dashboard", "--db", log.url.removeprefix("sqlite:///"), "--listen", "0.0.0.0:0"]) == 2
    assert "beyond loopback" in capsys.readouterr().err


def test_report_and_dashboard_draw_from_one_series(log):
    from tuner.report import collect
    from tuner.report.series import convergence_series

    assert client(log).get("/api/jobs/1").json()["series"] == json.loads(json.dumps(
        convergence_series(collect(log, 1, default_config=False))))


def test_model_page_shows_tasks_latency_and_budget(log):
    from tuner.graph.tasks import ModelTasks, Task

    net = ModelTasks(source="/models/net.onnx", tasks=(Task(parse_workload(WL), count=2),
                                                       Task(parse_workload(OTHER_SHAPE), count=1)))
    c = TestClient(create_app(log, catalog=testing_catalog(), models=[net]))
    assert c.get("/api/models").json() == [{"model": "net.onnx", "source": "/models/net.onnx", "tasks": 2}]
    model = c.get("/api/model", params={"name": "net.onnx", "device": DEVICES[0], "target": "sleep"}).json()
    first, second = model["tasks"]
    assert (first["trials"], second["trials"]) == (OK_PER_JOB + FAILED_PER_JOB, 1)
    assert first["budget_share"] == pytest.approx(12 / 13, abs=1e-4)
    assert first["speedup"] == pytest.approx(OK_PER_JOB)  # default (variant 0) vs the fastest trial
    assert model["latency_default_s"] == pytest.approx(2 * first["default_s"] + second["default_s"])
    assert model["latency_tuned_s"] == pytest.approx(2 * first["best_s"] + second["best_s"])
    assert {(d["device_key"], d["target"]) for d in model["devices"]} == {(d, "sleep") for d in DEVICES}
    assert c.get("/model", params={"name": "net.onnx"}).status_code == 200
    missing = c.get("/api/model", params={"name": "other.onnx"})
    assert missing.status_code == 404 and "models: net.onnx" in missing.json()["error"]


def test_daemon_serves_the_dashboard_with_live_state(tmp_path):
    """``tuner daemon --http-listen``: the same app, with the fleet; SIGTERM stops both cleanly."""
    import signal
    import subprocess
    import sys
    import urllib.request

    from fleet_helpers import FakeAgent, free_port, wait_for

    grpc_port, http_port = free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tuner", "daemon", "--listen", f"127.0.0.1:{grpc_port}", "--db",
         f"sqlite:///{tmp_path / 'd.db'}", "--templates", "testing", "--http-listen", f"127.0.0.1:{http_port}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    agent = None
    try:
        line = ""
        while not line.startswith("tunefleet daemon listening") and proc.poll() is None:
            line = proc.stdout.readline()  # log lines come first
        assert f"dashboard at http://127.0.0.1:{http_port}/" in line, line
        agent = FakeAgent(f"127.0.0.1:{grpc_port}", key="web", name="web-agent")

        def agents():
            with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/api/agents", timeout=5) as reply:
                return json.load(reply)

        answer = wait_for(lambda: (lambda a: a if a["agents"] else None)(agents()), 20, "the agent on the dashboard")
        assert answer["live"] is True and answer["agents"][0]["name"] == "web-agent"
    finally:
        if agent is not None:
            agent.stop()
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = f"hung: {proc.communicate()[0]}"
        assert code == 0


def test_daemon_refuses_a_dashboard_beyond_loopback_without_a_token(tmp_path):
    import subprocess
    import sys

    from fleet_helpers import free_port

    proc = subprocess.run(
        [sys.executable, "-m", "tuner", "daemon", "--listen", f"127.0.0.1:{free_port()}", "--db",
         f"sqlite:///{tmp_path / 'd.db'}", "--http-listen", f"0.0.0.0:{free_port()}"],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("tuner: error: refusing to serve the dashboard on 0.0.0.0")


def test_without_the_dashboard_extra_the_command_says_how_to_install(monkeypatch, tmp_path, capsys, log):
    import sys

    from tuner.cli import main

    monkeypatch.setitem(sys.modules, "uvicorn", None)  # import uvicorn now raises ImportError
    assert main(["dashboard", "--db", log.url.removeprefix("sqlite:///")]) == 1
    assert capsys.readouterr().err.strip() == ("tuner: error: the dashboard needs uvicorn, which is not installed: "
                                               "pip install 'tunefleet[dashboard]'")


@pytest.mark.skipif(__import__("shutil").which("openssl") is None, reason="openssl not installed")
def test_dashboard_serves_https_with_the_tls_options(log, tmp_path):
    import ssl
    import subprocess
    import urllib.request

    from tuner.dashboard.server import DashboardServer

    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                   check=True, capture_output=True)
    server = DashboardServer(create_app(log), "127.0.0.1:0", tls_cert=str(cert), tls_key=str(key)).start()
    try:
        assert server.url.startswith("https://127.0.0.1:")
        context = ssl.create_default_context(cafile=str(cert))
        with urllib.request.urlopen(f"{server.url}/api/jobs", context=context, timeout=10) as reply:
            assert [j["job_id"] for j in json.load(reply)] == [2, 1]
    finally:
        server.stop()
