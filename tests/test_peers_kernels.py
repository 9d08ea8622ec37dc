"""bench/peers_kernels.py without its peers: arguments, "not installed" lines, one numpy worker, and
the time-to-peer arithmetic over resumed tuning runs. Nothing here tunes or needs torch, ORT or TVM."""

from __future__ import annotations

import importlib.util
import json
import sys
from datetime import datetime, timedelta, timezone

import pytest

from script_modules import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("bench/peers_kernels.py")


@pytest.mark.parametrize("argv, message", [
    (["--workloads", "no_such_layer"], "neither a known name"),
    (["--trials", "0"], "--trials"),
    (["--rounds", "0"], "--rounds"),
    (["--peers", "tensorflow"], "invalid choice"),
])
def test_bad_arguments_are_refused_with_a_message(bench, capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        bench.main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_the_layers_are_read_from_ops_cpu(bench):
    table = bench.layer_table()
    assert table["matmul_512"] == "matmul(M=512,N=512,K=512)"
    assert table["r50_conv3x3_64"].startswith("conv2d_nchw(N=1,C=64,H=56,W=56,K=64")
    assert table["mv2_dw_32"].startswith("depthwise_conv2d_nchw(")
    assert set(bench.DEFAULT_WORKLOADS) <= set(table)


def test_missing_peers_are_one_line_each_with_the_install_command(bench, capsys, monkeypatch, tmp_path):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("torch", "onnxruntime", "onnx") else real_find_spec(name, *a))
    code = bench.main(["--quick", "--peers", "torch", "onnxruntime", "tvm", "--tvm-python",
                       str(tmp_path / "no-venv" / "python"), "--json", str(tmp_path / "out.json")])
    out = capsys.readouterr().out
    assert code == 0
    assert "Traceback" not in out
    assert "torch: not installed (torch): pip install torch==2.13.0" in out
    assert "onnxruntime: not installed (onnxruntime, onnx): pip install onnxruntime onnx" in out
    assert "tvm: not installed" in out and "apache-tvm==0.27.0.post1" in out
    assert "| matmul_128 | not installed | not installed | not installed |" in out
    assert (tmp_path / "out.json").exists()


def test_the_numpy_peer_is_measured_in_its_own_process(bench, capsys, tmp_path):
    report = tmp_path / "report.json"
    assert bench.main(["--quick", "--no-tune", "--peers", "openblas", "--workloads", "matmul_128", "conv_small",
                       "--json", str(report)]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| matmul_128 |"))
    assert float(row.split("|")[2].split()[0]) > 0  # median GFLOPS
    assert "| conv_small | n/a |" in out
    if sys.platform.startswith("linux"):  # each sample read the threads' wait for a CPU
        openblas = json.loads(report.read_text())["workloads"][0]["contestants"]["openblas"]
        assert 0 <= openblas["disturbed_samples"] <= openblas["samples"]


def test_time_to_peer_counts_the_walls_of_earlier_resumed_runs(bench):
    t0 = datetime(2025, 1, 1, tzinfo=timezone.utc)
    t1 = t0 + timedelta(seconds=500)  # the second run started later (measuring in between)
    runs = [(t0, 100.0), (t1, 50.0)]
    curve = [(t0 + timedelta(seconds=10), 5.0), (t0 + timedelta(seconds=20), None),
             (t0 + timedelta(seconds=90), 20.0), (t1 + timedelta(seconds=30), 40.0)]
    assert bench.reached(curve, runs, 4.0) == (1, 10.0)
    assert bench.reached(curve, runs, 10.0) == (3, 90.0)
    assert bench.reached(curve, runs, 30.0) == (4, 130.0)
    assert bench.reached(curve, runs, 50.0) is None
