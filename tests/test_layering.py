"""Protobuf stays at the daemon's edge: the rest of the tuner speaks typed values (tuner.fleet)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TUNER = ROOT / "tuner"
MESSAGE_METHODS = {"HasField", "WhichOneof", "CopyFrom", "MergeFrom", "ClearField", "SerializeToString",
                   "ParseFromString", "FromString", "ListFields"}
EDGE = {TUNER / "daemon" / "service.py", TUNER / "daemon" / "stream_service.py", TUNER / "daemon" / "client.py"}
ONNX_READER = TUNER / "graph" / "tasks.py"  # ONNX models are protobuf messages too


def _modules():
    for path in sorted(TUNER.rglob("*.py")):
        yield path, ast.parse(path.read_text(), str(path))


def _imported(tree) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_only_the_daemon_imports_generated_protobuf_code():
    offenders = []
    for path, tree in _modules():
        if path.is_relative_to(TUNER / "daemon"):
            continue
        generated = [n for n in _imported(tree) if "_pb2" in n or n.startswith(("measure_agent.protocol.v1", "measure_agent.protocol.v2"))]
        if generated:
            offenders.append(f"{path.relative_to(ROOT)}: {', '.join(sorted(generated))}")
    assert offenders == []


def test_only_the_service_and_the_client_call_message_methods():
    offenders = []
    for path, tree in _modules():
        if path in EDGE or path == ONNX_READER:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in MESSAGE_METHODS:
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} .{node.attr}")
    assert offenders == []
