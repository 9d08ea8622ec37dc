"""ONNX models -> tasks (``tuner tasks``), and one real ``tuner tune-model`` run."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from tuner.cli import main  # noqa: E402
from tuner.graph import ModelError, extract_tasks, tasks_from_model  # noqa: E402


def weight(name: str, shape, dtype=np.float32):
    return numpy_helper.from_array(np.random.default_rng(0).standard_normal(shape).astype(dtype), name)


def make_model(nodes, inputs, outputs, weights, opset: int = 17):
    graph = helper.make_graph(nodes, "test", inputs, outputs, weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def save(model, tmp_path, name="model.onnx") -> str:
    path = tmp_path / name
    onnx.save(model, str(path))
    return str(path)


def small_cnn(batch_dim=1):
    """3x3 conv, a 1x1 conv twice, a depthwise conv, pooling, a Gemm (transB=1) and a MatMul."""
    nodes = [
        helper.make_node("Conv", ["x", "w3x3", "b3x3"], ["c1"], name="conv3x3", pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w1x1"], ["c2"], name="conv1x1_a"),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("Conv", ["r2", "w1x1"], ["c3"], name="conv1x1_b"),
        helper.make_node("Conv", ["c3", "wdw"], ["c4"], name="depthwise", group=16, kernel_shape=[3, 3],
                         pads=[1, 1, 1, 1]),
        helper.make_node("GlobalAveragePool", ["c4"], ["p"], name="pool"),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "wfc", "bfc"], ["g"], name="fc", transB=1),
        helper.make_node("MatMul", ["g", "wmm"], ["y"], name="proj"),
    ]
    weights = [weight("w3x3", (16, 3, 3, 3)), weight("b3x3", (16,)), weight("w1x1", (16, 16, 1, 1)),
               weight("wdw", (32, 1, 3, 3)), weight("wfc", (10, 32)), weight("bfc", (10,)), weight("wmm", (10, 4))]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch_dim, 3, 32, 32])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    return make_model(nodes, inputs, outputs, weights)


CNN_TASKS = [
    ("conv2d_nchw(N=1,C=3,H=32,W=32,K=16,R=3,S=3,stride=2,pad=1,dilation=1,dtype=float32)", 1, "Conv", ["conv3x3"]),
    ("conv2d_nchw(N=1,C=16,H=16,W=16,K=16,R=1,S=1,stride=1,pad=0,dilation=1,dtype=float32)", 2, "Conv",
     ["conv1x1_a", "conv1x1_b"]),
    ("depthwise_conv2d_nchw(N=1,C=16,H=16,W=16,R=3,S=3,stride=1,pad=1,dilation=1,multiplier=2,dtype=float32)", 1,
     "Conv", ["depthwise"]),
    ("dense(M=1,N=10,K=32,dtype=float32)", 1, "Gemm", ["fc"]),
    ("matmul(M=1,N=4,K=10,dtype=float32)", 1, "MatMul", ["proj"]),
]


def test_tasks_of_a_small_cnn_in_json(tmp_path, capsys):
    path = save(small_cnn(), tmp_path)
    assert main(["tasks", path, "--json"]) == 0
    out, err = capsys.readouterr()
    tasks = json.loads(out)
    assert [(t["workload"], t["count"], t["op_type"], t["nodes"]) for t in tasks] == CNN_TASKS
    from measure_agent.workload import parse_workload

    for t in tasks:
        assert parse_workload(t["workload"]).key == t["workload"]  # what `tuner tune --workload` accepts
        assert t["flops"] == parse_workload(t["workload"]).flops and t["total_flops"] == t["count"] * t["flops"]
    assert tasks[0]["flops"] == 2 * 16 * 16 * 16 * 3 * 9
    assert err == ""


def test_task_table(tmp_path, capsys):
    path = save(small_cnn(), tmp_path)
    assert main(["tasks", path]) == 0
    out = capsys.readouterr().out
    assert "5 tasks from 10 nodes" in out
    for key, *_ in CNN_TASKS:
        assert key in out
    assert "not tuned (no tunable operator): Relu x2, GlobalAveragePool x1, Flatten x1" in out


def test_dynamic_batch_is_skipped_with_a_reason_and_fixed_by_batch(tmp_path, capsys):
    path = save(small_cnn(batch_dim="batch"), tmp_path)
    assert main(["tasks", path, "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == []
    first = err.splitlines()[0]
    assert "skipped node 'conv3x3' (Conv)" in first
    assert "dynamic shape [batch, 3, 32, 32]" in first and "--batch N" in first
    assert main(["tasks", path, "--json", "--batch", "4"]) == 0
    tasks = json.loads(capsys.readouterr().out)
    expected = [k.replace("(N=1,", "(N=4,").replace("(M=1,", "(M=4,") for k, *_ in CNN_TASKS]
    assert [t["workload"] for t in tasks] == expected


def test_batch_overrides_a_static_batch(tmp_path):
    found = extract_tasks(save(small_cnn(), tmp_path), batch=2)
    assert found.tasks[0].key.startswith("conv2d_nchw(N=2,")
    assert found.tasks[-1].key == "matmul(M=2,N=4,K=10,dtype=float32)"


def conv_model(x_shape, w_shape, dtype=TensorProto.FLOAT, **attrs):
    np_dtype = {TensorProto.FLOAT: np.float32, TensorProto.DOUBLE: np.float64, TensorProto.FLOAT16: np.float16}[dtype]
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="conv", **attrs)
    return make_model([node], [helper.make_tensor_value_info("x", dtype, list(x_shape))],
                      [helper.make_tensor_value_info("y", dtype, None)], [weight("w", w_shape, np_dtype)])


def only_task(model):
    found = tasks_from_model(model)
    assert not found.skipped, found.skipped
    assert len(found.tasks) == 1
    return found.tasks[0]


def test_conv_attributes():
    t = only_task(conv_model((1, 8, 15, 15), (4, 8, 3, 3), strides=[2, 1], dilations=[2, 2], pads=[2, 1, 2, 1]))
    assert t.key == ("conv2d_nchw(N=1,C=8,H=15,W=15,K=4,R=3,S=3,stride_h=2,stride_w=1,pad_h=2,pad_w=1,dilation=2,"
                     "dtype=float32)")
    assert t.notes == ()
    t = only_task(conv_model((1, 8, 15, 15), (4, 8, 3, 3), dtype=TensorProto.DOUBLE, auto_pad="VALID"))
    assert t.key.endswith("pad=0,dilation=1,dtype=float64)")
    # SAME_UPPER, stride 2, even input: total pad 1, extra at the end -> asymmetric, tuned with the max
    t = only_task(conv_model((1, 8, 16, 16), (4, 8, 3, 3), strides=[2, 2], auto_pad="SAME_UPPER"))
    assert "stride=2,pad=1," in t.key
    assert t.notes == ("asymmetric pads (top, left, bottom, right) = (0, 0, 1, 1) tuned as pad_h=1, pad_w=1",)
    t = only_task(conv_model((1, 8, 16, 16), (4, 8, 3, 3), pads=[0, 0, 1, 1]))
    assert "pad=1," in t.key and "(output 16x16 instead of 15x15)" in t.notes[0]
    # 1-D conv: a 2-D conv with H = R = 1
    t = only_task(conv_model((2, 4, 20), (6, 4, 5), strides=[2], pads=[2, 2]))
    assert t.key == ("conv2d_nchw(N=2,C=4,H=1,W=20,K=6,R=1,S=5,stride_h=1,stride_w=2,pad_h=0,pad_w=2,dilation=1,"
                     "dtype=float32)")


def test_grouped_conv_is_split_into_groups():
    t = only_task(conv_model((1, 32, 8, 8), (64, 8, 3, 3), group=4, pads=[1, 1, 1, 1]))
    assert t.key == "conv2d_nchw(N=1,C=8,H=8,W=8,K=16,R=3,S=3,stride=1,pad=1,dilation=1,dtype=float32)"
    assert t.count == 4 and "group=4" in t.notes[0]
    assert t.total_flops == 2 * 64 * 8 * 8 * 8 * 9  # the whole grouped conv's work


def test_gemm_and_matmul_shapes():
    def model(nodes, a_shape, weights):
        return make_model(nodes, [helper.make_tensor_value_info("a", TensorProto.FLOAT, list(a_shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], weights)

    gemm = model([helper.make_node("Gemm", ["a", "b"], ["y"])], (6, 5), [weight("b", (5, 7))])
    assert only_task(gemm).key == "matmul(M=6,N=7,K=5,dtype=float32)"
    gemm_ta = model([helper.make_node("Gemm", ["a", "b"], ["y"], transA=1, transB=1)], (5, 6), [weight("b", (7, 5))])
    t = only_task(gemm_ta)
    assert t.key == "dense(M=6,N=7,K=5,dtype=float32)" and "transA=1" in t.notes[0]
    flat = model([helper.make_node("MatMul", ["a", "b"], ["y"])], (2, 3, 4, 5), [weight("b", (5, 7))])
    t = only_task(flat)
    assert t.key == "matmul(M=24,N=7,K=5,dtype=float32)" and "flattened into M" in t.notes[0]
    batched = model([helper.make_node("MatMul", ["a", "b"], ["y"])], (3, 4, 5), [weight("b", (3, 5, 6))])
    assert only_task(batched).key == "batch_matmul(B=3,M=4,N=6,K=5,dtype=float32)"
    broadcast = model([helper.make_node("MatMul", ["a", "b"], ["y"])], (4, 5), [weight("b", (2, 3, 5, 6))])
    t = only_task(broadcast)
    assert t.key == "batch_matmul(B=6,M=4,N=6,K=5,dtype=float32)"
    assert any("broadcast" in n for n in t.notes) and any("flattened into B=6" in n for n in t.notes)
    vector = model([helper.make_node("MatMul", ["a", "b"], ["y"])], (5,), [weight("b", (5, 3))])
    assert only_task(vector).key == "matmul(M=1,N=3,K=5,dtype=float32)"


def test_unsupported_nodes_are_skipped_with_reasons():
    nodes = [helper.make_node("ConvTranspose", ["x", "wt"], ["u"], name="up"),
             helper.make_node("Conv", ["u", "w3d"], ["y"], name="conv3d")]
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4, 4])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                       [weight("wt", (2, 2, 2, 2, 2)), weight("w3d", (2, 2, 1, 1, 1))])
    found = tasks_from_model(model)
    assert found.tasks == ()
    assert [(s.node, s.reason) for s in found.skipped] == [
        ("up", "transposed convolution has no tunable operator"),
        ("conv3d", "3-D convolution: only 1-D and 2-D convolutions are tunable"),
    ]
    half = tasks_from_model(conv_model((1, 4, 8, 8), (4, 4, 3, 3), dtype=TensorProto.FLOAT16))
    assert half.skipped[0].reason == "element type FLOAT16 is not tunable (float32 and float64 only)"


@pytest.mark.parametrize("content, message", [
    (b"this is not a protobuf \xff\xfe", "is not a readable ONNX model"),
    (b"", "is not an ONNX model: it has no graph nodes"),
    (None, "no such file"),
])
def test_invalid_files_give_one_line_and_exit_2(tmp_path, capsys, content, message):
    path = tmp_path / "broken.onnx"
    if content is not None:
        path.write_bytes(content)
    assert main(["tasks", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    with pytest.raises(ModelError):
        extract_tasks(path)


def test_broken_file_through_the_real_command_line(cli_env, tmp_path):
    path = tmp_path / "garbage.onnx"
    path.write_bytes(b"\x08\x07garbage" * 10)
    proc = subprocess.run([sys.executable, "-m", "tuner", "tasks", str(path)], capture_output=True, text=True,
                          env=cli_env, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("tuner: error: ") and len(proc.stderr.strip().splitlines()) == 1
    assert "Traceback" not in proc.stderr


def test_without_onnx_the_tuner_imports_and_model_commands_say_what_to_install(cli_env, tmp_path):
    code = ("import sys; sys.modules['onnx'] = None\n"
            "import tuner.graph, tuner.cli\n"
            "from tuner.cli import main\n"
            "sys.exit(main(['tasks', sys.argv[1]]))\n")
    path = tmp_path / "m.onnx"
    path.write_bytes(b"")
    proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, env=cli_env,
                          timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("tuner: error: reading ONNX models needs the onnx package: "
                                   "pip install 'tunefleet[model]'")


def test_tune_model_refuses_bad_targets_and_models_without_tunable_tasks(tmp_path, capsys):
    path = save(small_cnn(), tmp_path)
    db = str(tmp_path / "t.db")
    # the default catalog has no templates of the testing family "sleep"
    assert main(["tune-model", path, "--trials", "4", "--target", "sleep", "--db", db]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("tuner: error: no task of 5 has a template on target sleep")
    assert main(["tune-model", path, "--trials", "4", "--target", "fpga", "--db", db]) == 2
    assert "unknown target 'fpga'" in capsys.readouterr().err
    dynamic = save(small_cnn(batch_dim="batch"), tmp_path, "dynamic.onnx")
    assert main(["tune-model", dynamic, "--trials", "4", "--db", db]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "dynamic shape" in err[0]
    assert err[-1] == f"tuner: error: {dynamic} has no tunable task (see: tuner tasks {dynamic})"


def test_tune_model_of_a_single_matmul_for_real(cli_env, tmp_path):
    """The real CPU matmul template through the embedded daemon: compiles kernels, so one small run."""
    model = make_model([helper.make_node("MatMul", ["a", "b"], ["c"], name="mm")],
                       [helper.make_tensor_value_info("a", TensorProto.FLOAT, [16, 8])],
                       [helper.make_tensor_value_info("c", TensorProto.FLOAT, [16, 24])], [weight("b", (8, 24))])
    path = save(model, tmp_path)
    db = f"sqlite:///{tmp_path / 'model.db'}"
    proc = subprocess.run(
        [sys.executable, "-m", "tuner", "tune-model", path, "--trials", "6", "--round-trials", "3", "--db", db,
         "--device-key", "ci-host", "--strategy", "random", "--parallel", "2", "--repeat", "2", "--min-repeat-ms", "1",
         "--json"],
        capture_output=True, text=True, env=cli_env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["trials"] == 6 and report["budget"] == 6 and report["rounds"] == 2
    (task,) = report["tasks"]
    assert task["workload"] == "matmul(M=16,N=24,K=8,dtype=float32)" and task["trials"] == 6
    assert 0 < task["best_s"] <= task["default_s"]
    assert report["latency_tuned_s"] == pytest.approx(task["best_s"])
    assert report["latency_default_s"] == pytest.approx(task["default_s"])
    assert "round 1 (warm-up)" in proc.stderr and "round 2 (gradient)" in proc.stderr
    from tuner.log import TuningLog

    with TuningLog(db) as log:
        assert len(log.trials(workload_key=task["workload"], device_key="ci-host", target="cpu")) == 6
