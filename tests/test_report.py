"""``tuner report``: the self-contained HTML page of a job and its convergence plot."""

import base64
import html
import json
import re
import subprocess
import sys
import textwrap
from datetime import datetime, timedelta, timezone

import pytest

from measure_agent.engine.types import MeasureResult, MeasureStatus
from tuner.log import TrialRecord, TuningLog

WL = "matmul(M=64,N=64,K=64)"
FLOPS = 2 * 64 * 64 * 64
DEVICE = "report-dev"
T0 = datetime(2024, 5, 1, 12, 0, tzinfo=timezone.utc)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
COMPILE_MESSAGE = "TypingError: no implementation of setitem <float32, int64>"


def ok(seconds: float, compile_s: float = 1.5) -> MeasureResult:
    return MeasureResult(MeasureStatus.OK, costs=(seconds, seconds), compile_time_s=compile_s)


@pytest.fixture()
def job_log(tmp_path):
    """A log holding 3 earlier trials of the workload and a job with 12 ok and 4 failed trials."""
    url = f"sqlite:///{tmp_path / 'report.db'}"
    with TuningLog(url) as log:
        log.upsert_device(DEVICE, {"arch": "x86_64", "cpu_model": "Test CPU 9000", "cores": 8,
                                   "isa_features": ["avx2", "fma"]})
        log.record_trials([
            TrialRecord.from_result(WL, DEVICE, "cpu", {"tile": 100 + i}, ok(0.01 * (i + 1)), agent="old-agent",
                                    created_at=T0 + timedelta(seconds=i))
            for i in range(3)
        ])
        job = log.create_job(WL, DEVICE, "cpu", "xgb", 19, {"seed": 7, "early_stopping": None})
        start = datetime.now(timezone.utc)
        records = []
        # Trial i (0-based) of the job takes 1 ms / (i + 1): the last ok one is the fastest.
        for i in range(12):
            records.append(TrialRecord.from_result(WL, DEVICE, "cpu", {"tile": i}, ok(1e-3 / (i + 1), 0.5 + i),
                                                   agent=f"agent-{i % 2}", created_at=start + timedelta(seconds=2 * i),
                                                   job_id=job))
        failures = [(MeasureStatus.COMPILE_ERROR, COMPILE_MESSAGE), (MeasureStatus.COMPILE_ERROR, "other"),
                    (MeasureStatus.COMPILE_ERROR, ""), (MeasureStatus.WRONG_ANSWER, "max error 0.5 > bound 1e-5")]
        for j, (status, message) in enumerate(failures):
            records.append(TrialRecord.from_result(WL, DEVICE, "cpu", {"tile": 50 + j},
                                                   MeasureResult(status, message=message),
                                                   created_at=start + timedelta(seconds=2 * j + 1), job_id=job))
        log.record_trials(records)
        log.finish_job(job, "done")
        empty = log.create_job(WL, DEVICE, "cpu", "random", 5)
    return url, job, empty


def tuner(env, *args):
    return subprocess.run([sys.executable, "-m", "tuner", *args], capture_output=True, text=True, env=env, timeout=300)


def test_report_page_and_png(job_log, cli_env, tmp_path):
    pytest.importorskip("matplotlib")
    url, job, _ = job_log
    page, png = tmp_path / "report.html", tmp_path / "plot.png"
    proc = tuner(cli_env, "report", str(job), "--db", url, "-o", str(page), "--png", str(png))
    assert proc.returncode == 0, proc.stderr
    assert "16 trials, 4 errors" in proc.stdout

    text = page.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>")
    # Self-contained: the plot is embedded, nothing is loaded from elsewhere.
    match = re.search(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', text)
    assert match, "no embedded PNG"
    assert base64.b64decode(match.group(1)).startswith(PNG_MAGIC)
    assert 'src="http' not in text and 'href="http' not in text and "url(" not in text
    assert "<link" not in text and "<script src" not in text  # scripts are inline
    # The interactive chart is the dashboard's: its series, drawn by the same script.
    from tuner.report import collect
    from tuner.report.series import convergence_series

    embedded = re.search(r'<script type="application/json" id="convergence-data">(.*?)</script>', text).group(1)
    with TuningLog(url) as log:
        assert json.loads(embedded) == json.loads(json.dumps(convergence_series(collect(log, job))))
    assert "tunefleetConvergence" in text and "uPlot" in text
    assert png.read_bytes().startswith(PNG_MAGIC)

    plain = html.unescape(re.sub(r"<[^>]+>", " ", text))
    # Summary: workload, device and its info, strategy, status, the resumed history.
    assert "matmul(M=64,N=64,K=64,dtype=float32)" in plain
    assert DEVICE in plain and "Test CPU 9000" in plain and "avx2 fma" in plain
    assert "xgb" in plain and "done" in plain
    assert "3 trials of this workload and device were in the log before the job" in plain
    assert "16 (12 ok, 4 failed)" in plain

    # Top configs: the 10 fastest, fastest first, with GFLOPS, compile time and agent.
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", text.split("configs</h2>")[1].split("<h2>")[0])[1:]
    assert len(rows) == 10
    configs = [json.loads(html.unescape(re.search(r'<code class="config">(.*?)</code>', r).group(1))) for r in rows]
    assert configs == [{"tile": i} for i in range(11, 1, -1)]
    best_gflops = FLOPS / (1e-3 / 12) / 1e9
    assert f"{best_gflops:.2f}" in rows[0] and "11.50 s" in rows[0] and "agent-1" in rows[0]
    assert '{"tile": 0}' not in plain and '{"tile": 1}' not in plain  # 11th and 12th are not in the top 10

    # Error breakdown: count per status with a sample message.
    errors = html.unescape(text.split("<h2>Errors</h2>")[1])
    assert re.search(r">compile_error</td><td[^>]*>3</td>", errors)
    assert re.search(r">wrong_answer</td><td[^>]*>1</td>", errors)
    assert re.search(r">ok</td><td[^>]*>12</td>", errors)
    assert COMPILE_MESSAGE in errors and "max error 0.5 > bound 1e-5" in errors
    assert "4 of 16 trials failed" in errors


def run_main(*args) -> int:
    from tuner.cli import main

    return main(list(args))


def test_report_png_only_and_empty_job(job_log, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    url, job, empty = job_log
    png = tmp_path / "only.png"
    assert run_main("report", str(job), "--db", url, "--png", str(png)) == 0
    assert png.read_bytes().startswith(PNG_MAGIC)
    assert list(tmp_path.glob("*.html")) == []
    page = tmp_path / "empty.html"
    assert run_main("report", str(empty), "--db", url, "-o", str(page)) == 0
    text = page.read_text(encoding="utf-8")
    assert "No trial of this job ran successfully" in text and "No trials recorded for this job" in text
    assert "data:image/png;base64," in text
    assert "0 trials, 0 errors, no successful trial" in capsys.readouterr().out


@pytest.mark.parametrize("args, code, message", [
    (["99"], 1, "tuner: error: no job 99 in the tuning log"),
    ([], 2, "tuner: error: give -o FILE.html"),
])
def test_report_errors_are_one_line(job_log, tmp_path, capsys, args, code, message):
    url, job, _ = job_log
    extra = ["-o", str(tmp_path / "x.html")] if args else [str(job)]
    assert run_main("report", *args, *extra, "--db", url) == code
    err = capsys.readouterr().err
    assert err.startswith(message) and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "x.html").exists()


def test_without_matplotlib_the_tuner_imports_and_report_says_how_to_install(job_log, tmp_path):
    url, job, _ = job_log
    code = textwrap.dedent(f"""
        import importlib.abc, sys

        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "matplotlib":
                    raise ImportError("No module named 'matplotlib'")
                return None

        sys.meta_path.insert(0, Block())
        import tuner.cli, tuner.report
        tuner.cli.build_parser()
        assert not any(m.split(".")[0] == "matplotlib" for m in sys.modules)
        sys.exit(tuner.cli.main(["report", "{job}", "--db", {url!r}, "-o", {str(tmp_path / "r.html")!r}]))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip() == ("tuner: error: plots need matplotlib, which is not installed: "
                                   "pip install 'tunefleet[plot]'")
    assert not (tmp_path / "r.html").exists()


def test_report_data_numbers(job_log):
    from tuner.report import collect

    url, job, _ = job_log
    with TuningLog(url) as log:
        data = collect(log, job)
    assert len(data.trials) == 16 and data.earlier_trials == 3 and data.earlier_best_s == pytest.approx(0.01)
    best = data.best_so_far
    assert all(b is not None for b in best)
    assert all(a <= b for a, b in zip(best, best[1:]))  # never decreases
    assert best[-1] == pytest.approx(FLOPS / (1e-3 / 12) / 1e9)
    assert [(c.status, c.count, c.sample_message) for c in data.status_counts] == [
        ("ok", 12, ""), ("compile_error", 3, COMPILE_MESSAGE), ("wrong_answer", 1, "max error 0.5 > bound 1e-5")]
    assert data.best.config == {"tile": 11} and data.best_trial_number == 16
    assert data.duration is not None and data.duration.total_seconds() >= 0
