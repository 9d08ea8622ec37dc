"""ResNet-50 as an ONNX graph -> tasks (``tuner tasks``) and, with ``--trials N``, ``tuner tune-model``.

The graph is built from ResNet-50's layer list (torchvision v1.5: the stride sits on the 3x3 conv of a
bottleneck): a 7x7/2 stem conv and max pool, bottleneck stages of [3, 4, 6, 3] blocks with widths 64,
128, 256, 512 (x4 expansion) and a 1x1 projection at the start of each stage, global average pool and
a 2048 -> 1000 classifier: 53 convs and one Gemm. Batch normalisation is folded into the convs (as in
inference exports), so each conv carries a bias. Weights are random (the graph is not numerically
meaningful; only shapes matter to the tuner).

    python bench/resnet50_model.py                                  # build, list the tasks
    python bench/resnet50_model.py --trials 24 --max-tasks 2        # and a small tune-model run
    python bench/resnet50_model.py --fc matmul --trials 24          # classifier exported as MatMul + Add

``--fc matmul`` exports the classifier as MatMul + Add (as TensorFlow/Keras exporters do), which maps
to ``matmul(M=1,N=1000,K=2048)`` rather than ``dense``. Tuning arguments after ``--`` go to
``tuner tune-model`` unchanged (e.g. ``-- --repeat 2 --min-repeat-ms 10``).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tuner.cli import main as tuner_main  # noqa: E402
from tuner.graph import ModelError, extract_tasks, import_onnx  # noqa: E402

STAGES = ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2))  # (width, blocks, stride of the first block)
EXPANSION = 4


class GraphBuilder:
    def __init__(self, onnx, seed: int = 0) -> None:
        self.onnx = onnx
        self.helper = onnx.helper
        self.rng = np.random.default_rng(seed)
        self.nodes: list = []
        self.weights: list = []
        self.convs = 0

    def _weight(self, name: str, shape: tuple[int, ...]) -> str:
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
        data = (self.rng.standard_normal(shape, dtype=np.float32) / np.sqrt(fan_in)).astype(np.float32)
        self.weights.append(self.onnx.numpy_helper.from_array(data, name))
        return name

    def conv(self, x: str, c_in: int, c_out: int, k: int, stride: int = 1, relu: bool = True) -> str:
        self.convs += 1
        name = f"conv{self.convs}"
        w = self._weight(f"{name}.weight", (c_out, c_in, k, k))
        b = self._weight(f"{name}.bias", (c_out,))
        pad = k // 2
        self.nodes.append(self.helper.make_node("Conv", [x, w, b], [name], name=name, kernel_shape=[k, k],
                                                strides=[stride, stride], pads=[pad] * 4))
        if not relu:
            return name
        self.nodes.append(self.helper.make_node("Relu", [name], [f"{name}.relu"], name=f"{name}.relu"))
        return f"{name}.relu"

    def op(self, op_type: str, inputs: list[str], name: str, **attrs) -> str:
        self.nodes.append(self.helper.make_node(op_type, inputs, [name], name=name, **attrs))
        return name


def build_resnet50(batch: int = 1, fc: str = "gemm", seed: int = 0):
    """The ONNX ModelProto of ResNet-50 (input [batch, 3, 224, 224], output [batch, 1000])."""
    onnx = import_onnx()
    g = GraphBuilder(onnx, seed)
    x = g.conv("input", 3, 64, 7, stride=2)
    x = g.op("MaxPool", [x], "maxpool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    c_in = 64
    for stage, (width, blocks, stride) in enumerate(STAGES, 1):
        for block in range(blocks):
            s = stride if block == 0 else 1
            identity = x
            y = g.conv(x, c_in, width, 1)
            y = g.conv(y, width, width, 3, stride=s)
            y = g.conv(y, width, width * EXPANSION, 1, relu=False)
            if block == 0:
                identity = g.conv(x, c_in, width * EXPANSION, 1, stride=s, relu=False)
            added = g.op("Add", [y, identity], f"layer{stage}.{block}.add")
            x = g.op("Relu", [added], f"layer{stage}.{block}.relu")
            c_in = width * EXPANSION
    x = g.op("GlobalAveragePool", [x], "avgpool")
    x = g.op("Flatten", [x], "flatten", axis=1)
    if fc == "gemm":
        out = g.op("Gemm", [x, g._weight("fc.weight", (1000, 2048)), g._weight("fc.bias", (1000,))], "fc",
                   transB=1)
    else:
        y = g.op("MatMul", [x, g._weight("fc.weight_t", (2048, 1000))], "fc.matmul")
        out = g.op("Add", [y, g._weight("fc.bias", (1000,))], "fc")
    h = onnx.helper
    graph = h.make_graph(g.nodes, "resnet50",
                         [h.make_tensor_value_info("input", onnx.TensorProto.FLOAT, [batch, 3, 224, 224])],
                         [h.make_tensor_value_info(out, onnx.TensorProto.FLOAT, [batch, 1000])], g.weights)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], producer_name="tunefleet-bench")
    assert g.convs == 53, g.convs
    return model


def main() -> int:
    argv = sys.argv[1:]
    extra = []
    if "--" in argv:
        at = argv.index("--")
        argv, extra = argv[:at], argv[at + 1:]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="where to write the model (default: a temporary file)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--fc", choices=("gemm", "matmul"), default="gemm",
                        help="classifier as Gemm (transB=1, as PyTorch exports) or MatMul + Add")
    parser.add_argument("--trials", type=int, help="run tune-model with this total budget")
    parser.add_argument("--max-tasks", type=int, help="tune only the K tasks with the most FLOPs")
    parser.add_argument("--round-trials", type=int, default=8)
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--strategy", default="xgb")
    parser.add_argument("--db", help="tuning log (default: a temporary SQLite file)")
    parser.add_argument("--device-key", help="device key (default: this host's)")
    args = parser.parse_args(argv)

    try:
        onnx = import_onnx()
    except ModelError as exc:
        print(f"resnet50_model: {exc}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="resnet50-") as tmp:
        path = Path(args.out or Path(tmp) / "resnet50.onnx")
        started = time.perf_counter()
        model = build_resnet50(args.batch, args.fc)
        onnx.save(model, str(path))
        size_mb = path.stat().st_size / 1e6
        params = sum(int(np.prod(w.dims)) for w in model.graph.initializer)
        print(f"built {path.name}: {len(model.graph.node)} nodes, {params / 1e6:.1f} M parameters, {size_mb:.0f} MB "
              f"in {time.perf_counter() - started:.1f} s")

        started = time.perf_counter()
        found = extract_tasks(path)
        took = time.perf_counter() - started
        convs = sum(t.count for t in found.tasks if "Conv" in t.op_types)
        print(f"task extraction: {took:.2f} s; {convs} conv calls in {len(found.tasks)} tasks; "
              f"{found.total_flops / 1e9:.2f} GFLOP per inference in tasks\n")
        print(f"$ tuner tasks {path.name}" + (f" --batch {args.batch}" if args.batch != 1 else ""))
        sys.stdout.flush()
        code = tuner_main(["tasks", str(path)])
        if code:
            return code
        if args.trials is None:
            print("\ntuning: not run. Give --trials N for tune-model, e.g. --trials 24 --max-tasks 2 for a smoke "
                  "run; a useful budget is several hundred trials per task, and each "
                  "trial compiles a numba kernel (seconds on a CPU).")
            return 0
        command = ["tune-model", str(path), "--trials", str(args.trials), "--round-trials", str(args.round_trials),
                   "--parallel", str(args.parallel), "--strategy", args.strategy,
                   "--db", args.db or f"sqlite:///{Path(tmp) / 'tuning.db'}"]
        if args.max_tasks:
            command += ["--max-tasks", str(args.max_tasks)]
        if args.device_key:
            command += ["--device-key", args.device_key]
        command += extra
        print(f"\n$ tuner {' '.join(command[:1] + [path.name] + command[2:])}")
        sys.stdout.flush()
        started = time.perf_counter()
        code = tuner_main(command)
        print(f"tune-model: exit {code} after {time.perf_counter() - started:.0f} s")
        return code


if __name__ == "__main__":
    sys.exit(main())
