from measure_agent.protocol.v1 import fleet_pb2 as _fleet_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Hello(_message.Message):
    __slots__ = ("key", "name", "capabilities", "protocol_version", "parallel")
    KEY_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    PARALLEL_FIELD_NUMBER: _ClassVar[int]
    key: str
    name: str
    capabilities: _fleet_pb2.Capabilities
    protocol_version: int
    parallel: int
    def __init__(self, key: _Optional[str] = ..., name: _Optional[str] = ..., capabilities: _Optional[_Union[_fleet_pb2.Capabilities, _Mapping]] = ..., protocol_version: _Optional[int] = ..., parallel: _Optional[int] = ...) -> None: ...

class Credit(_message.Message):
    __slots__ = ("candidates",)
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    candidates: int
    def __init__(self, candidates: _Optional[int] = ...) -> None: ...

class Results(_message.Message):
    __slots__ = ("measurements", "credit")
    MEASUREMENTS_FIELD_NUMBER: _ClassVar[int]
    CREDIT_FIELD_NUMBER: _ClassVar[int]
    measurements: _containers.RepeatedCompositeFieldContainer[_fleet_pb2.Measurement]
    credit: int
    def __init__(self, measurements: _Optional[_Iterable[_Union[_fleet_pb2.Measurement, _Mapping]]] = ..., credit: _Optional[int] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Leaving(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AgentMessage(_message.Message):
    __slots__ = ("hello", "credit", "results", "heartbeat", "leaving")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    CREDIT_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    LEAVING_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    credit: Credit
    results: Results
    heartbeat: Heartbeat
    leaving: Leaving
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., credit: _Optional[_Union[Credit, _Mapping]] = ..., results: _Optional[_Union[Results, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., leaving: _Optional[_Union[Leaving, _Mapping]] = ...) -> None: ...

class Welcome(_message.Message):
    __slots__ = ("agent_id", "heartbeat_interval_s", "agent_timeout_s", "protocol_version", "results_carry_credit")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    AGENT_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    RESULTS_CARRY_CREDIT_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    heartbeat_interval_s: float
    agent_timeout_s: float
    protocol_version: int
    results_carry_credit: bool
    def __init__(self, agent_id: _Optional[str] = ..., heartbeat_interval_s: _Optional[float] = ..., agent_timeout_s: _Optional[float] = ..., protocol_version: _Optional[int] = ..., results_carry_credit: bool = ...) -> None: ...

class Leases(_message.Message):
    __slots__ = ("candidates",)
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    candidates: _containers.RepeatedCompositeFieldContainer[_fleet_pb2.Candidate]
    def __init__(self, candidates: _Optional[_Iterable[_Union[_fleet_pb2.Candidate, _Mapping]]] = ...) -> None: ...

class ResultsRefused(_message.Message):
    __slots__ = ("lease_ids",)
    LEASE_IDS_FIELD_NUMBER: _ClassVar[int]
    lease_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, lease_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class HeartbeatAck(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DaemonMessage(_message.Message):
    __slots__ = ("welcome", "leases", "results_refused", "heartbeat_ack")
    WELCOME_FIELD_NUMBER: _ClassVar[int]
    LEASES_FIELD_NUMBER: _ClassVar[int]
    RESULTS_REFUSED_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_ACK_FIELD_NUMBER: _ClassVar[int]
    welcome: Welcome
    leases: Leases
    results_refused: ResultsRefused
    heartbeat_ack: HeartbeatAck
    def __init__(self, welcome: _Optional[_Union[Welcome, _Mapping]] = ..., leases: _Optional[_Union[Leases, _Mapping]] = ..., results_refused: _Optional[_Union[ResultsRefused, _Mapping]] = ..., heartbeat_ack: _Optional[_Union[HeartbeatAck, _Mapping]] = ...) -> None: ...
