"""The dashboard in a real browser: headless Chromium driven by Playwright (Debian's ``chromium``
through ``executable_path``; ``.ci/run`` installs it). Each test writes screenshots of the pages
it opens to the directory printed at the end of the run (look at them).

The live test runs a real daemon and a real agent process with the ``testing`` catalog: its
sleep kernels (1 ms a call) are plain Python, so nothing is compiled.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright (Python) is not installed")

from measure_agent.engine import TimingConfig  # noqa: E402
from measure_agent.templates import testing_catalog  # noqa: E402
from tuner.dashboard.app import create_app  # noqa: E402
from tuner.dashboard.server import DashboardServer  # noqa: E402
from tuner.fleet import JobSpec  # noqa: E402
from tuner.log import TuningLog  # noqa: E402

from dashboard_helpers import DEVICES, FAILED_PER_JOB, OTHER_SHAPE, WL, fill_log  # noqa: E402
from fleet_helpers import agent_names, start_agent, start_daemon, stop_all, wait_for  # noqa: E402

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="chromium is not installed (apt-get install chromium)"),
]
FAST = TimingConfig(repeat=1, warmup=0, run_timeout_s=10)
WAIT_MS = 15_000


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dashboard-screenshots")
    yield folder
    print(f"\ndashboard screenshots: {folder}")


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield browser
        browser.close()


@pytest.fixture()
def page(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    yield page
    context.close()
    assert errors == []  # no script error on any page


@pytest.fixture()
def two_device_log(tmp_path):
    with TuningLog(f"sqlite:///{tmp_path / 'dash.db'}") as log:
        fill_log(log)
        yield log


def serve(app) -> DashboardServer:
    return DashboardServer(app, "127.0.0.1:0").start()


def test_log_pages_job_filter_and_workload_of_two_devices(two_device_log, page, screenshots):
    from measure_agent.workload import parse_workload
    from tuner.graph.tasks import ModelTasks, Task

    net = ModelTasks(source="net.onnx", tasks=(Task(parse_workload(WL), count=2),
                                               Task(parse_workload(OTHER_SHAPE), count=1)))
    server = serve(create_app(two_device_log, catalog=testing_catalog(), models=[net]))
    try:
        page.goto(server.url + "/")
        sync_api.expect(page.locator("#jobs-table tbody tr")).to_have_count(2)
        page.screenshot(path=screenshots / "overview-log.png", full_page=True)

        page.click("#jobs-table tbody tr:last-child a[href='/jobs/1']")
        page.wait_for_url("**/jobs/1")
        sync_api.expect(page.locator("#chart-trials .u-over")).to_have_count(1)  # uPlot drew
        sync_api.expect(page.locator("#trials-table tbody tr")).to_have_count(12)
        page.select_option("#status-filter", "failed")
        sync_api.expect(page.locator("#trials-table tbody tr")).to_have_count(FAILED_PER_JOB)
        statuses = page.locator("#trials-table tbody tr").evaluate_all("rows => rows.map(r => r.dataset.status)")
        assert statuses == ["compile_error"] * FAILED_PER_JOB
        assert "<script>alert(1)</script>" in page.locator("#trials-table").inner_text()  # shown as text
        page.screenshot(path=screenshots / "job-failed-filter.png", full_page=True)

        page.goto(f"{server.url}/workload?key={WL}")
        sync_api.expect(page.locator("#devices-table tbody tr")).to_have_count(2)
        assert page.locator("#devices-table tbody tr td:first-child").all_inner_texts() == list(DEVICES)
        assert page.locator("#chart-history").get_attribute("data-series") == "2"
        page.screenshot(path=screenshots / "workload-two-devices.png", full_page=True)

        page.click("#devices-table tbody tr:first-child a:text('show-kernel')")
        sync_api.expect(page.locator("#kernel-source")).to_contain_text("time.sleep(3 / 1000.0)")
        page.screenshot(path=screenshots / "kernel.png", full_page=True)

        page.goto(f"{server.url}/models")
        page.click("a:text('net.onnx')")
        sync_api.expect(page.locator("#model-table tbody tr")).to_have_count(2)
        sync_api.expect(page.locator("[data-card='tasks estimated'] .value")).to_have_text("2 / 2")
        page.screenshot(path=screenshots / "model.png", full_page=True)
    finally:
        page.goto("about:blank")  # stop polling before the server goes
        server.stop()


def test_live_job_grows_then_is_cancelled(tmp_path, page, screenshots, kernel_cache_dir):
    with TuningLog(f"sqlite:///{tmp_path / 'live.db'}") as log:
        daemon = start_daemon(log)
        agent = start_agent(daemon.address, "dash", "dash-agent", kernel_cache_dir, parallel=1)
        server = serve(create_app(log, live=daemon.fleet_state, catalog=daemon.catalog))
        try:
            wait_for(lambda: agent_names(daemon) == {"dash-agent"}, 30, "the agent to register")
            page.goto(server.url + "/")
            sync_api.expect(page.locator("#jobs-table")).to_have_count(0)  # nothing yet
            status = daemon.jobs.submit(JobSpec("matmul(M=64,N=64,K=1)", "dash", target="sleep", strategy="random",
                                                trials=100_000, timing=FAST))
            # the overview updates itself: the new job appears without a reload
            sync_api.expect(page.locator("#jobs-table tbody tr")).to_have_count(1, timeout=WAIT_MS)
            page.screenshot(path=screenshots / "overview-live.png", full_page=True)

            page.goto(f"{server.url}/jobs/{status.job_id}")
            trials = page.locator("[data-card=trials] .value")
            first = _count(trials.inner_text())
            page.wait_for_function(f"() => document.querySelector('#chart-trials').dataset.points > {first + 5}",
                                   timeout=WAIT_MS)
            assert _count(trials.inner_text()) > first  # the trial count and the plot grew
            page.screenshot(path=screenshots / "job-live.png", full_page=True)

            page.on("dialog", lambda dialog: dialog.accept())
            page.click("#cancel-job")
            sync_api.expect(page.locator("#job-title .state")).to_have_text("cancelled", timeout=WAIT_MS)
            assert daemon.jobs.get(status.job_id).state == "cancelled"
            page.screenshot(path=screenshots / "job-cancelled.png", full_page=True)

            page.goto(server.url + "/agents")
            sync_api.expect(page.locator("#agents-table tbody tr")).to_have_count(1)
            page.screenshot(path=screenshots / "agents-live.png", full_page=True)
        finally:
            page.goto("about:blank")
            server.stop()
            stop_all([agent])
            daemon.stop()
        wait_for(lambda: log.get_job(status.job_id).status == "cancelled", 10, "the log to record the cancel")


def _count(card_text: str) -> int:
    return int(card_text.split("/")[0])


def test_report_draws_the_dashboards_chart(two_device_log, page, screenshots):
    pytest.importorskip("matplotlib")
    from tuner.report import collect, convergence_png, render_html

    data = collect(two_device_log, 1)
    report = screenshots / "report.html"
    report.write_text(render_html(data, convergence_png(data)), encoding="utf-8")
    page.goto(report.as_uri())
    sync_api.expect(page.locator("#convergence .u-over")).to_have_count(1)  # uPlot drew, offline
    assert page.locator("#convergence .u-legend").inner_text().count("best so far") == 1
    page.screenshot(path=screenshots / "report.png", full_page=True)
