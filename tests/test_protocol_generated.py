"""The checked-in generated code must match protos/ (run protos/generate.sh after editing a .proto)."""

import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

from measure_agent.protocol.v1 import fleet_pb2, fleet_pb2_grpc

ROOT = Path(__file__).resolve().parents[1]


def _normalised(file_proto: descriptor_pb2.FileDescriptorProto) -> descriptor_pb2.FileDescriptorProto:
    """Drop what differs between protoc versions without changing meaning (json_name)."""
    def strip(messages):
        for message in messages:
            for field in message.field:
                field.ClearField("json_name")
            strip(message.nested_type)
    copy = descriptor_pb2.FileDescriptorProto()
    copy.CopyFrom(file_proto)
    strip(copy.message_type)
    return copy


def test_generated_code_is_current(tmp_path):
    pytest.importorskip("grpc_tools")
    out = tmp_path / "fleet.desc"
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{ROOT / 'protos'}", f"--descriptor_set_out={out}",
         "measure_agent/protocol/v1/fleet.proto"],
        check=True, cwd=ROOT,
    )
    compiled = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file[0]
    embedded = descriptor_pb2.FileDescriptorProto.FromString(fleet_pb2.DESCRIPTOR.serialized_pb)
    assert _normalised(compiled) == _normalised(embedded), (
        "measure_agent/protocol/v1 is stale: run protos/generate.sh and commit the result"
    )


def test_generated_layout_mirrors_proto_package():
    assert fleet_pb2.DESCRIPTOR.package == "measure_agent.protocol.v1"
    assert fleet_pb2.DESCRIPTOR.name == "measure_agent/protocol/v1/fleet.proto"
    assert hasattr(fleet_pb2_grpc, "AgentServiceStub") and hasattr(fleet_pb2_grpc, "ClientServiceStub")
    # the pinned generator: gencode for the oldest runtime we support
    text = (ROOT / "measure_agent/protocol/v1/fleet_pb2_grpc.py").read_text()
    assert "GRPC_GENERATED_VERSION = '1.66.2'" in text
