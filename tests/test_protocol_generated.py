"""The checked-in generated code must match protos/ (run protos/generate.sh after editing a .proto)."""

import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

from measure_agent.protocol.v1 import fleet_pb2, fleet_pb2_grpc
from measure_agent.protocol.v2 import agent_pb2, agent_pb2_grpc

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


@pytest.mark.parametrize("module", [fleet_pb2, agent_pb2], ids=["v1", "v2"])
def test_generated_code_is_current(tmp_path, module):
    pytest.importorskip("grpc_tools")
    out = tmp_path / "protocol.desc"
    proto = module.DESCRIPTOR.name
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{ROOT / 'protos'}", f"--descriptor_set_out={out}", proto],
        check=True, cwd=ROOT,
    )
    compiled = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file[0]
    embedded = descriptor_pb2.FileDescriptorProto.FromString(module.DESCRIPTOR.serialized_pb)
    assert _normalised(compiled) == _normalised(embedded), (
        f"{Path(proto).parent} is stale: run protos/generate.sh and commit the result"
    )


def test_every_proto_is_generated():
    protos = sorted(p.relative_to(ROOT / "protos").as_posix() for p in (ROOT / "protos").rglob("*.proto"))
    assert protos == sorted([fleet_pb2.DESCRIPTOR.name, agent_pb2.DESCRIPTOR.name])


def test_generated_layout_mirrors_proto_package():
    assert fleet_pb2.DESCRIPTOR.package == "measure_agent.protocol.v1"
    assert fleet_pb2.DESCRIPTOR.name == "measure_agent/protocol/v1/fleet.proto"
    assert hasattr(fleet_pb2_grpc, "AgentServiceStub") and hasattr(fleet_pb2_grpc, "ClientServiceStub")
    # the pinned generator: gencode for the oldest runtime we support
    text = (ROOT / "measure_agent/protocol/v1/fleet_pb2_grpc.py").read_text()
    assert "GRPC_GENERATED_VERSION = '1.66.2'" in text


def test_v2_is_one_stream_per_agent():
    assert agent_pb2.DESCRIPTOR.package == "measure_agent.protocol.v2"
    assert agent_pb2.DESCRIPTOR.name == "measure_agent/protocol/v2/agent.proto"
    connect = agent_pb2.DESCRIPTOR.services_by_name["AgentService"].methods_by_name["Connect"]
    assert connect.client_streaming and connect.server_streaming
    assert [m.name for m in agent_pb2.DESCRIPTOR.services_by_name["AgentService"].methods] == ["Connect"]
    text = (ROOT / "measure_agent/protocol/v2/agent_pb2_grpc.py").read_text()
    assert "GRPC_GENERATED_VERSION = '1.66.2'" in text
