"""ONNX graph -> tunable tasks: the workloads of a model's heavy operators and how often each occurs.

``extract_tasks("model.onnx")`` loads the graph (without external weight data: only shapes matter),
runs ONNX shape inference, and maps each node to a workload in the syntax ``tuner tune`` accepts.
Nodes with the same workload become one :class:`Task` whose ``count`` says how often it runs per
inference; a task's weight in the model latency is that count.

Mapping (ONNX layouts are NCHW, weights [M, C/group, kH, kW]):

- ``Conv``, 2-D: ``conv2d_nchw(N,C,H,W,K=M,R,S,stride,pad,dilation)``. ``group == C`` (depthwise)
  gives ``depthwise_conv2d_nchw(...,multiplier=M/C)``. Other grouped convs (ResNeXt) are split: a
  conv of ``group`` groups counts as ``group`` convs of C/group -> M/group channels (the same
  workload ``group`` times), noted on the task. 1-D convs are 2-D convs with H = R = 1. 3-D and
  higher are skipped. The bias is not part of the workload.
- Pads: ``auto_pad`` SAME_UPPER/SAME_LOWER/VALID are resolved to explicit pads as ONNX defines them.
  ONNX pads are [top, left, bottom, right]; the workloads have one pad per axis, both sides.
  Asymmetric pads are tuned with the larger pad of each axis (``pad_h = max(top, bottom)``), and the
  task carries a note saying so (and when that changes the output size). The kernel shape is the
  same; only the border handling differs.
- ``Gemm``: ``transB=1`` is exactly ``dense(M,N,K)`` (X[M,K] @ W[N,K].T); ``transB=0`` is
  ``matmul(M,N,K)``. ``transA=1`` reads A transposed, which no workload expresses: it is tuned as an
  untransposed M x K operand, with a note. ``alpha``, ``beta`` and C (an epilogue) are ignored.
- ``MatMul``: 2-D -> ``matmul``; 1-D operands are promoted as numpy does (M or N = 1). Batched:
  when B has no batch (or only 1s), A's batch dimensions are flattened into M (``matmul``, exact);
  otherwise ``batch_matmul(B=product of the broadcast batch dims,...)``, noted when one operand is
  broadcast or several batch dims are flattened.
- Shapes must be static after shape inference (``--batch N`` fixes the first dimension of every
  graph input); dtypes float32 or float64. Anything else is skipped with a reason, as are heavy
  operators with no workload (``ConvTranspose``, quantized ops, ``Einsum``, recurrent layers,
  control flow). All other operators (elementwise, pooling, normalisation, data movement) are counted
  as "not tuned": their time is not part of the model latency estimate.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from measure_agent.workload import Workload, WorkloadError, make_workload

if TYPE_CHECKING:  # onnx is optional: imported lazily by import_onnx()
    import onnx

INSTALL_HINT = "pip install 'tunefleet[model]'"

# ONNX TensorProto element types the workloads support.
_DTYPES = {1: "float32", 11: "float64"}

# Heavy operators with no workload: skipped with a reason (everything else is "not tuned").
_NO_WORKLOAD = {
    "ConvTranspose": "transposed convolution has no tunable operator",
    "ConvInteger": "quantized convolution: only float32/float64 workloads are tunable",
    "QLinearConv": "quantized convolution: only float32/float64 workloads are tunable",
    "MatMulInteger": "quantized matmul: only float32/float64 workloads are tunable",
    "QLinearMatMul": "quantized matmul: only float32/float64 workloads are tunable",
    "Einsum": "Einsum has no tunable operator (export it as MatMul)",
    "LSTM": "recurrent layer has no tunable operator",
    "GRU": "recurrent layer has no tunable operator",
    "RNN": "recurrent layer has no tunable operator",
    "If": "control flow: subgraphs are not searched for tasks",
    "Loop": "control flow: subgraphs are not searched for tasks",
    "Scan": "control flow: subgraphs are not searched for tasks",
}


class ModelError(Exception):
    """A model that cannot be read or analysed (one-line message)."""


def import_onnx():
    """The ``onnx`` module, or a :class:`ModelError` telling how to install it."""
    try:
        import onnx
        import onnx.shape_inference  # noqa: F401
    except ImportError:
        raise ModelError(f"reading ONNX models needs the onnx package: {INSTALL_HINT}") from None
    return onnx


@dataclass(frozen=True)
class Task:
    """One workload of a model and how often it runs per inference."""

    workload: Workload
    count: int = 1
    nodes: tuple[str, ...] = ()
    op_types: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return self.workload.key

    @property
    def flops(self) -> int:
        """FLOPs of one call."""
        return self.workload.flops

    @property
    def total_flops(self) -> int:
        return self.count * self.workload.flops

    @property
    def op_type(self) -> str:
        return ",".join(self.op_types)

    def to_json(self) -> dict[str, Any]:
        return {"workload": self.key, "count": self.count, "flops": self.flops, "total_flops": self.total_flops,
                "op_type": self.op_type, "nodes": list(self.nodes), "notes": list(self.notes)}


@dataclass(frozen=True)
class Skipped:
    """A node that could be a task but is not, and why."""

    node: str
    op_type: str
    reason: str

    def __str__(self) -> str:
        return f"node {self.node!r} ({self.op_type}): {self.reason}"


@dataclass(frozen=True)
class ModelTasks:
    source: str
    tasks: tuple[Task, ...]
    skipped: tuple[Skipped, ...] = ()
    untuned: tuple[tuple[str, int], ...] = ()  # (op_type, nodes) with no tunable operator
    nodes: int = 0
    batch: int | None = None

    @property
    def total_flops(self) -> int:
        return sum(t.total_flops for t in self.tasks)

    def to_json(self) -> list[dict[str, Any]]:
        return [t.to_json() for t in self.tasks]


class _Skip(Exception):
    """Raised by a node handler: the node is skipped with this reason."""


@dataclass
class _TaskBuilder:
    workload: Workload
    count: int = 0
    nodes: list[str] = field(default_factory=list)
    op_types: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, node: str, op_type: str, times: int, notes: Iterable[str]) -> None:
        self.count += times
        self.nodes.append(node)
        if op_type not in self.op_types:
            self.op_types.append(op_type)
        for note in notes:
            if note not in self.notes:
                self.notes.append(note)

    def build(self) -> Task:
        return Task(self.workload, self.count, tuple(self.nodes), tuple(self.op_types), tuple(self.notes))


# -- loading ----------------------------------------------------------------------------------------
def load_model(path: str | Path, batch: int | None = None) -> "onnx.ModelProto":
    """The model at ``path`` with inferred shapes (weights' external data is not loaded)."""
    onnx = import_onnx()
    path = Path(path)
    if not path.exists():
        raise ModelError(f"no such file: {path}")
    if not path.is_file():
        raise ModelError(f"{path} is not a file")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - protobuf raises several kinds
        raise ModelError(f"{path} is not a readable ONNX model: {_one_line(exc)}") from None
    if not model.HasField("graph") or not model.graph.node:
        raise ModelError(f"{path} is not an ONNX model: it has no graph nodes")
    return infer_shapes(model, batch, str(path))


def infer_shapes(model: "onnx.ModelProto", batch: int | None = None, name: str = "model") -> "onnx.ModelProto":
    """A copy of ``model`` with local functions inlined, the batch set (optional) and shapes inferred."""
    onnx = import_onnx()
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    if copy.functions:
        try:
            import onnx.inliner

            copy = onnx.inliner.inline_local_functions(copy)
        except Exception:  # noqa: BLE001 - old onnx or odd functions: their nodes stay "not tuned"
            pass
    if batch is not None:
        _set_batch(copy.graph, batch)
    try:
        return onnx.shape_inference.infer_shapes(copy, check_type=False, strict_mode=False, data_prop=True)
    except Exception as exc:  # noqa: BLE001
        raise ModelError(f"shape inference failed on {name}: {_one_line(exc)}") from None


def _set_batch(graph, batch: int) -> None:
    """Fix the first dimension of every graph input to ``batch``; drop shapes inferred before."""
    if batch < 1:
        raise ModelError(f"batch must be >= 1, not {batch}")
    weights = {t.name for t in graph.initializer}
    for value in graph.input:
        if value.name in weights or not value.type.HasField("tensor_type"):
            continue
        shape = value.type.tensor_type.shape
        if value.type.tensor_type.HasField("shape") and len(shape.dim) > 0:
            first = shape.dim[0]
            first.Clear()
            first.dim_value = batch
    del graph.value_info[:]  # shapes stored for the old batch would contradict the new ones
    for value in graph.output:
        if value.type.HasField("tensor_type"):
            value.type.tensor_type.ClearField("shape")


# -- extraction -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Info:
    dtype: int | None
    dims: tuple[int | str, ...] | None  # None: rank unknown; str: a symbolic or unknown dimension


def extract_tasks(path: str | Path, batch: int | None = None) -> ModelTasks:
    """The tasks of the ONNX model at ``path`` (see the module docstring for the mapping)."""
    return tasks_from_model(load_model(path, batch), source=str(path), batch=batch, inferred=True)


def tasks_from_model(model: "onnx.ModelProto", source: str = "model", batch: int | None = None,
                     inferred: bool = False) -> ModelTasks:
    """The tasks of an in-memory model; shapes are inferred unless ``inferred``."""
    onnx = import_onnx()
    if not inferred:
        model = infer_shapes(model, batch, source)
    graph = model.graph
    info = _shape_table(graph)
    builders: dict[str, _TaskBuilder] = {}
    skipped: list[Skipped] = []
    untuned: Counter[str] = Counter()
    for index, node in enumerate(graph.node):
        name = node.name or f"{node.op_type}_{index}"
        handler = _HANDLERS.get(node.op_type) if node.domain in ("", "ai.onnx") else None
        if handler is None:
            if node.op_type in _NO_WORKLOAD:
                skipped.append(Skipped(name, node.op_type, _NO_WORKLOAD[node.op_type]))
            else:
                untuned[node.op_type] += 1
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        try:
            found = handler(node, info, attrs)
        except _Skip as exc:
            skipped.append(Skipped(name, node.op_type, str(exc)))
            continue
        for workload, times, notes in found:
            builder = builders.setdefault(workload.key, _TaskBuilder(workload))
            builder.add(name, node.op_type, times, notes)
    return ModelTasks(source=source, tasks=tuple(b.build() for b in builders.values()), skipped=tuple(skipped),
                      untuned=tuple(untuned.most_common()), nodes=len(graph.node), batch=batch)


def _shape_table(graph) -> dict[str, _Info]:
    table: dict[str, _Info] = {}
    for value in [*graph.input, *graph.value_info, *graph.output]:
        if not value.type.HasField("tensor_type"):
            continue
        tensor = value.type.tensor_type
        dims = None
        if tensor.HasField("shape"):
            dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in tensor.shape.dim)
        known = table.get(value.name)
        if dims is None and known is not None:
            continue
        table[value.name] = _Info(tensor.elem_type or None, dims)
    for tensor in graph.initializer:
        table[tensor.name] = _Info(tensor.data_type, tuple(tensor.dims))
    return table


def _static(info: dict[str, _Info], node, position: int, what: str) -> tuple[int, ...]:
    if position >= len(node.input) or not node.input[position]:
        raise _Skip(f"{what} is missing")
    name = node.input[position]
    found = info.get(name)
    if found is None or found.dims is None:
        raise _Skip(f"the shape of {what} {name!r} is unknown (shape inference could not determine it)")
    dynamic = [d for d in found.dims if not isinstance(d, int)]
    if dynamic:
        shown = "[" + ", ".join(str(d) for d in found.dims) + "]"
        raise _Skip(f"{what} {name!r} has a dynamic shape {shown} (dimension {dynamic[0]!r}); "
                    "give --batch N or export the model with static shapes")
    return tuple(int(d) for d in found.dims)


def _dtype(info: dict[str, _Info], node, positions: Iterable[int]) -> str:
    onnx = import_onnx()
    types = {info[node.input[p]].dtype for p in positions if node.input[p] in info}
    types.discard(None)
    if not types:
        return "float32"  # element type not recorded: ONNX models are float32 unless said otherwise
    if len(types) > 1:
        raise _Skip("operands of different element types")
    elem = types.pop()
    if elem not in _DTYPES:
        raise _Skip(f"element type {onnx.TensorProto.DataType.Name(elem)} is not tunable (float32 and float64 only)")
    return _DTYPES[elem]


def _workload(op: str, sizes: dict[str, int], dtype: str) -> Workload:
    try:
        return make_workload(op, {**sizes, "dtype": dtype})
    except WorkloadError as exc:
        raise _Skip(str(exc)) from None


def _ints(attrs: dict, name: str, default: list[int]) -> list[int]:
    return [int(v) for v in attrs.get(name, default)]


# -- node handlers: (node, shape table, attributes) -> [(workload, times, notes)] ---------------------------
def _conv(node, info, attrs):
    x = _static(info, node, 0, "input")
    w = _static(info, node, 1, "weight")
    dtype = _dtype(info, node, (0, 1))
    if len(x) == 3 and len(w) == 3:  # 1-D: a 2-D conv with H = R = 1
        x, w = (x[0], x[1], 1, x[2]), (w[0], w[1], 1, w[2])
        one_d = True
        expand = lambda values, fill: [fill, *values]  # noqa: E731
    elif len(x) == 4 and len(w) == 4:
        one_d = False
        expand = lambda values, fill: list(values)  # noqa: E731
    else:
        raise _Skip(f"{len(x) - 2}-D convolution: only 1-D and 2-D convolutions are tunable")
    n, c, h, width = x
    m, c_per_group, r, s = w
    group = int(attrs.get("group", 1))
    if group < 1 or c != c_per_group * group:
        raise _Skip(f"weight shape {list(w)} does not match {c} input channels in {group} group(s)")
    strides = expand(_ints(attrs, "strides", [1] * (2 - one_d)), 1)
    dilations = expand(_ints(attrs, "dilations", [1] * (2 - one_d)), 1)
    auto_pad = attrs.get("auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else str(auto_pad)
    notes = ["1-D convolution tuned as a 2-D one with H = R = 1"] if one_d else []
    if auto_pad in ("", "NOTSET"):
        pads = _ints(attrs, "pads", [0] * (4 - 2 * one_d))
        if one_d:
            pads = [0, pads[0], 0, pads[1]]
        begins, ends = pads[:2], pads[2:]
    elif auto_pad == "VALID":
        begins, ends = [0, 0], [0, 0]
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        begins, ends = [], []
        for size, kernel, stride, dilation in zip((h, width), (r, s), strides, dilations):
            out = -(-size // stride)
            total = max(0, (out - 1) * stride + (kernel - 1) * dilation + 1 - size)
            small, large = total // 2, total - total // 2
            begins.append(small if auto_pad == "SAME_UPPER" else large)
            ends.append(large if auto_pad == "SAME_UPPER" else small)
    else:
        raise _Skip(f"unknown auto_pad {auto_pad!r}")
    if len(begins) != 2 or len(ends) != 2 or len(strides) != 2 or len(dilations) != 2:
        raise _Skip("strides, pads or dilations do not match the kernel's rank")
    out_hw = [(size + b + e - d * (k - 1) - 1) // st + 1
              for size, b, e, k, st, d in zip((h, width), begins, ends, (r, s), strides, dilations)]
    if min(out_hw) < 1:
        raise _Skip("the kernel does not fit the padded input")
    pad = [max(b, e) for b, e in zip(begins, ends)]
    if begins != ends:
        tuned_hw = [(size + 2 * p - d * (k - 1) - 1) // st + 1
                    for size, p, k, st, d in zip((h, width), pad, (r, s), strides, dilations)]
        note = (f"asymmetric pads (top, left, bottom, right) = {tuple(begins + ends)} "
                f"tuned as pad_h={pad[0]}, pad_w={pad[1]}")
        if tuned_hw != out_hw:
            note += f" (output {tuned_hw[0]}x{tuned_hw[1]} instead of {out_hw[0]}x{out_hw[1]})"
        notes.append(note)
    window = dict(stride_h=strides[0], stride_w=strides[1], pad_h=pad[0], pad_w=pad[1],
                  dilation_h=dilations[0], dilation_w=dilations[1])
    if group == 1:
        return [(_workload("conv2d_nchw", dict(N=n, C=c, H=h, W=width, K=m, R=r, S=s, **window), dtype), 1, notes)]
    if group == c and m % c == 0:
        sizes = dict(N=n, C=c, H=h, W=width, R=r, S=s, **window, multiplier=m // c)
        return [(_workload("depthwise_conv2d_nchw", sizes, dtype), 1, notes)]
    if m % group:
        raise _Skip(f"{m} output channels do not split into {group} groups")
    notes.append(f"grouped convolution (group={group}) tuned as {group} convolutions of "
                 f"{c // group} -> {m // group} channels")
    sizes = dict(N=n, C=c // group, H=h, W=width, K=m // group, R=r, S=s, **window)
    return [(_workload("conv2d_nchw", sizes, dtype), group, notes)]


def _gemm(node, info, attrs):
    a = _static(info, node, 0, "A")
    b = _static(info, node, 1, "B")
    dtype = _dtype(info, node, (0, 1))
    if len(a) != 2 or len(b) != 2:
        raise _Skip("Gemm operands must be 2-D")
    trans_a, trans_b = int(attrs.get("transA", 0)), int(attrs.get("transB", 0))
    m, k = (a[1], a[0]) if trans_a else a
    n, k_b = b if trans_b else (b[1], b[0])
    if k != k_b:
        raise _Skip(f"inner dimensions differ: A {list(a)}, B {list(b)}")
    notes = ["transA=1: A is read transposed, tuned as an M x K operand"] if trans_a else []
    op = "dense" if trans_b else "matmul"
    return [(_workload(op, dict(M=m, N=n, K=k), dtype), 1, notes)]


def _matmul(node, info, attrs):
    a = _static(info, node, 0, "A")
    b = _static(info, node, 1, "B")
    dtype = _dtype(info, node, (0, 1))
    if not a or not b:
        raise _Skip("MatMul of a scalar")
    a_batch, (m, k) = ((), (1, a[0])) if len(a) == 1 else (a[:-2], a[-2:])
    b_batch, (k_b, n) = ((), (b[0], 1)) if len(b) == 1 else (b[:-2], b[-2:])
    if k != k_b:
        raise _Skip(f"inner dimensions differ: A {list(a)}, B {list(b)}")
    try:
        batch = _broadcast(a_batch, b_batch)
    except ValueError:
        raise _Skip(f"batch dimensions do not broadcast: A {list(a)}, B {list(b)}") from None
    total, a_total, b_total = math.prod(batch), math.prod(a_batch), math.prod(b_batch)
    if total == 1:
        return [(_workload("matmul", dict(M=m, N=n, K=k), dtype), 1, [])]
    if b_total == 1:
        note = f"batch dimensions {list(a_batch)} of A flattened into M (B is shared)"
        return [(_workload("matmul", dict(M=a_total * m, N=n, K=k), dtype), 1, [note])]
    notes = []
    if len(batch) > 1:
        notes.append(f"batch dimensions {list(batch)} flattened into B={total}")
    if a_total != total or b_total != total:
        notes.append(f"broadcast batch: A {list(a)} x B {list(b)}")
    return [(_workload("batch_matmul", dict(B=total, M=m, N=n, K=k), dtype), 1, notes)]


def _broadcast(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    width = max(len(a), len(b))
    a, b = (1,) * (width - len(a)) + tuple(a), (1,) * (width - len(b)) + tuple(b)
    out = []
    for x, y in zip(a, b):
        if x != y and 1 not in (x, y):
            raise ValueError("not broadcastable")
        out.append(max(x, y))
    return tuple(out)


_HANDLERS = {"Conv": _conv, "Gemm": _gemm, "MatMul": _matmul}


def _one_line(exc: BaseException) -> str:
    for line in str(exc).splitlines():
        if line.strip():
            return line.strip()
    return type(exc).__name__
