"""``tuner verify``: default and random configs built, run and checked on this host by the real engine."""

from __future__ import annotations

import numpy as np
import pytest

from measure_agent.engine import MeasureStatus, TimingConfig
from measure_agent.space import Config
from measure_agent.templates import default_catalog, testing_catalog
from measure_agent.workload import parse_workload
from tuner.cli import main
from tuner.cli.verify import report
from tuner.measure.verify import VerifyRow, choose_configs, verify_configs
from tuner.measure import LocalMeasurer


@pytest.fixture()
def kernel_cache(monkeypatch, kernel_cache_dir):
    monkeypatch.setenv("XDG_CACHE_HOME", str(kernel_cache_dir))


def test_verify_matmul_on_cpu(kernel_cache, capsys):
    code = main(["verify", "--workload", "matmul(M=9,N=7,K=5)", "--samples", "2", "--seed", "1", "--parallel", "2"])
    out = capsys.readouterr().out
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0].startswith("verify matmul(M=9,N=7,K=5,dtype=float32) on ") and "target cpu" in lines[0]
    rows = [line for line in lines if line.startswith(("default", "random"))]
    assert len(rows) == 3 and all(" ok " in row for row in rows)
    assert lines[-1] == "all 3 configs match the reference"


def test_verify_cuda_in_the_simulator(kernel_cache, monkeypatch, capsys):
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "1")  # read by the engine's worker processes
    code = main(["verify", "--workload", "batch_matmul(B=2,M=5,N=6,K=3)", "--target", "cuda", "--samples", "1"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "target cuda" in out and out.rstrip().endswith("all 2 configs match the reference")


def test_failures_and_mismatches_are_reported_with_their_errors(tmp_path):
    """Through the fault-injection templates: every checked config reports its errors."""
    workload = parse_workload("matmul(M=8,N=6,K=5)")
    space = testing_catalog().get("matmul", "cpu").space(workload)
    configs = [space.make({"behaviour": b, "sleep_ms": 0, "variant": i}) for i, b in enumerate(["ok", "wrong", "raise"])]
    timing = TimingConfig(number=1, repeat=1, run_timeout_s=30, build_timeout_s=120)
    with LocalMeasurer(timing, catalog="testing", cache_dir=tmp_path) as measurer:
        rows = verify_configs(measurer, workload, "cpu", configs)
    assert [r.status for r in rows] == [MeasureStatus.OK, MeasureStatus.WRONG_ANSWER, MeasureStatus.RUNTIME_ERROR]
    assert rows[0].ok and rows[0].max_abs_error is not None and rows[0].max_abs_error < 1e-5
    assert rows[1].max_abs_error == pytest.approx(1.0, abs=1e-5) and rows[1].max_rel_error > 0
    assert rows[2].max_abs_error is None and "injected runtime error" in rows[2].message
    assert [r.config for r in rows] == configs


def test_report_exits_non_zero_on_any_failure(capsys):
    config = Config((("x", 1),))
    good = VerifyRow(config, MeasureStatus.OK, 1e-7, 1e-8)
    wrong = VerifyRow(config, MeasureStatus.WRONG_ANSWER, 0.5, 0.25, "output differs from the reference")
    crashed = VerifyRow(config, MeasureStatus.COMPILE_ERROR, None, None, "TypingError: no")
    assert report([good], ["default"]) == 0
    assert report([good, wrong, crashed], ["default", "random 1", "random 2"]) == 1
    out = capsys.readouterr().out
    assert "0.5" in out and "0.25" in out and "TypingError: no" in out
    assert out.rstrip().endswith("2 of 3 configs failed: random 1 (wrong_answer), random 2 (compile_error)")


def test_choose_configs_default_first_then_distinct_random_ones():
    workload = parse_workload("conv2d_nhwc(N=1,C=8,H=10,W=10,K=16,R=3,S=3,pad=1)")
    template = default_catalog().get(workload.op, "cuda")
    space = template.space(workload)
    chosen = choose_configs(template, workload, space, 5, seed=3)
    assert chosen[0] == ("default", template.default_config(workload, space))
    assert [label for label, _ in chosen[1:]] == [f"random {i}" for i in range(1, 6)]
    assert len({config.digest for _, config in chosen}) == 6
    assert chosen == choose_configs(template, workload, space, 5, seed=3)
    matmul = default_catalog().get("matmul", "cuda")
    tiny = parse_workload("matmul(M=1,N=1,K=1)")
    tiny_space = matmul.space(tiny)  # fewer configs than asked for: each once
    assert len(choose_configs(matmul, tiny, tiny_space, 50, seed=0)) == tiny_space.size


@pytest.mark.parametrize("args, message", [
    (["--tracker", "localhost:9000"], "needs both --tracker and --rpc-key"),
    (["--target", "fpga"], "no template for matmul on target fpga"),
])
def test_usage_errors_are_one_line(capsys, args, message):
    assert main(["verify", "--workload", "matmul(M=4,N=4,K=4)", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_verify_configs_takes_any_measurer():
    """The fleet path passes its own measurer: verify_configs only needs ``measure``."""
    workload = parse_workload("matmul(M=2,N=2,K=2)")
    space = default_catalog().get("matmul", "cpu").space(workload)
    config = space.sample(np.random.default_rng(0), 1)[0]

    class Fake:
        def measure(self, items):
            from measure_agent.engine import MeasureResult

            assert [i.target for i in items] == ["cpu"]
            return [MeasureResult(MeasureStatus.OK, costs=(1e-6,), details={"max_abs_error": 0.0, "max_rel_error": 0.0})]

    [row] = verify_configs(Fake(), workload, "cpu", [config])
    assert row.ok and row.max_abs_error == 0.0 and row.config == config


def test_verify_on_a_fleet_measures_on_the_agents_and_logs_nothing(tmp_path, kernel_cache_dir, cli_env):
    import subprocess as sp
    import sys as _sys

    from measure_agent.templates import default_catalog
    from tuner.daemon import Daemon
    from tuner.log import TuningLog

    from fleet_helpers import agent_names, start_agent, stop_all, wait_for

    with TuningLog(f"sqlite:///{tmp_path / 'v.db'}") as log:
        daemon = Daemon(log, "127.0.0.1:0", catalog=default_catalog(), heartbeat_interval_s=0.3,
                        agent_timeout_s=5).start()
        agent = start_agent(daemon.address, "verify-key", "verifier", kernel_cache_dir, templates="default")
        try:
            wait_for(lambda: agent_names(daemon) == {"verifier"}, what="agent joined")
            proc = sp.run([_sys.executable, "-m", "tuner", "verify", "--workload", "matmul(M=9,N=20,K=7)",
                           "--samples", "1", "--tracker", daemon.address, "--rpc-key", "verify-key"],
                          capture_output=True, text=True, env=cli_env, timeout=600)
            assert proc.returncode == 0, proc.stdout + proc.stderr
            assert "on fleet key verify-key" in proc.stdout and "default" in proc.stdout
            assert log.trials() == []  # verification is not tuning: nothing recorded
            missing = sp.run([_sys.executable, "-m", "tuner", "verify", "--workload", "matmul(M=9,N=20,K=7)",
                              "--tracker", daemon.address, "--rpc-key", "nobody"],
                             capture_output=True, text=True, env=cli_env, timeout=120)
            assert missing.returncode == 1 and "no agent of key nobody" in missing.stderr
        finally:
            stop_all([agent])
            daemon.stop()
