from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Timing(_message.Message):
    __slots__ = ("number", "repeat", "min_repeat_ms", "warmup", "build_timeout_s", "run_timeout_s")
    NUMBER_FIELD_NUMBER: _ClassVar[int]
    REPEAT_FIELD_NUMBER: _ClassVar[int]
    MIN_REPEAT_MS_FIELD_NUMBER: _ClassVar[int]
    WARMUP_FIELD_NUMBER: _ClassVar[int]
    BUILD_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    RUN_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    number: int
    repeat: int
    min_repeat_ms: float
    warmup: int
    build_timeout_s: float
    run_timeout_s: float
    def __init__(self, number: _Optional[int] = ..., repeat: _Optional[int] = ..., min_repeat_ms: _Optional[float] = ..., warmup: _Optional[int] = ..., build_timeout_s: _Optional[float] = ..., run_timeout_s: _Optional[float] = ...) -> None: ...

class Capabilities(_message.Message):
    __slots__ = ("arch", "cpu_model", "cores", "isa_features", "numba_version", "llvm_version", "os", "board", "gpu_name", "compute_capability", "max_threads_per_block", "max_shared_memory_per_block", "max_registers_per_block", "agent_version", "template_version", "templates")
    ARCH_FIELD_NUMBER: _ClassVar[int]
    CPU_MODEL_FIELD_NUMBER: _ClassVar[int]
    CORES_FIELD_NUMBER: _ClassVar[int]
    ISA_FEATURES_FIELD_NUMBER: _ClassVar[int]
    NUMBA_VERSION_FIELD_NUMBER: _ClassVar[int]
    LLVM_VERSION_FIELD_NUMBER: _ClassVar[int]
    OS_FIELD_NUMBER: _ClassVar[int]
    BOARD_FIELD_NUMBER: _ClassVar[int]
    GPU_NAME_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    MAX_THREADS_PER_BLOCK_FIELD_NUMBER: _ClassVar[int]
    MAX_SHARED_MEMORY_PER_BLOCK_FIELD_NUMBER: _ClassVar[int]
    MAX_REGISTERS_PER_BLOCK_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    TEMPLATE_VERSION_FIELD_NUMBER: _ClassVar[int]
    TEMPLATES_FIELD_NUMBER: _ClassVar[int]
    arch: str
    cpu_model: str
    cores: int
    isa_features: _containers.RepeatedScalarFieldContainer[str]
    numba_version: str
    llvm_version: str
    os: str
    board: str
    gpu_name: str
    compute_capability: str
    max_threads_per_block: int
    max_shared_memory_per_block: int
    max_registers_per_block: int
    agent_version: str
    template_version: str
    templates: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, arch: _Optional[str] = ..., cpu_model: _Optional[str] = ..., cores: _Optional[int] = ..., isa_features: _Optional[_Iterable[str]] = ..., numba_version: _Optional[str] = ..., llvm_version: _Optional[str] = ..., os: _Optional[str] = ..., board: _Optional[str] = ..., gpu_name: _Optional[str] = ..., compute_capability: _Optional[str] = ..., max_threads_per_block: _Optional[int] = ..., max_shared_memory_per_block: _Optional[int] = ..., max_registers_per_block: _Optional[int] = ..., agent_version: _Optional[str] = ..., template_version: _Optional[str] = ..., templates: _Optional[_Iterable[str]] = ...) -> None: ...

class RegisterRequest(_message.Message):
    __slots__ = ("key", "name", "capabilities", "protocol_version", "parallel")
    KEY_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    PARALLEL_FIELD_NUMBER: _ClassVar[int]
    key: str
    name: str
    capabilities: Capabilities
    protocol_version: int
    parallel: int
    def __init__(self, key: _Optional[str] = ..., name: _Optional[str] = ..., capabilities: _Optional[_Union[Capabilities, _Mapping]] = ..., protocol_version: _Optional[int] = ..., parallel: _Optional[int] = ...) -> None: ...

class RegisterReply(_message.Message):
    __slots__ = ("agent_id", "heartbeat_interval_s", "agent_timeout_s")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    AGENT_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    heartbeat_interval_s: float
    agent_timeout_s: float
    def __init__(self, agent_id: _Optional[str] = ..., heartbeat_interval_s: _Optional[float] = ..., agent_timeout_s: _Optional[float] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("agent_id",)
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    def __init__(self, agent_id: _Optional[str] = ...) -> None: ...

class HeartbeatReply(_message.Message):
    __slots__ = ("known",)
    KNOWN_FIELD_NUMBER: _ClassVar[int]
    known: bool
    def __init__(self, known: bool = ...) -> None: ...

class LeaseRequest(_message.Message):
    __slots__ = ("agent_id", "max_candidates", "wait_s")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    WAIT_S_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    max_candidates: int
    wait_s: float
    def __init__(self, agent_id: _Optional[str] = ..., max_candidates: _Optional[int] = ..., wait_s: _Optional[float] = ...) -> None: ...

class Candidate(_message.Message):
    __slots__ = ("lease_id", "workload", "config_json", "target", "timing")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    workload: str
    config_json: str
    target: str
    timing: Timing
    def __init__(self, lease_id: _Optional[str] = ..., workload: _Optional[str] = ..., config_json: _Optional[str] = ..., target: _Optional[str] = ..., timing: _Optional[_Union[Timing, _Mapping]] = ...) -> None: ...

class LeaseReply(_message.Message):
    __slots__ = ("candidates", "known")
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    KNOWN_FIELD_NUMBER: _ClassVar[int]
    candidates: _containers.RepeatedCompositeFieldContainer[Candidate]
    known: bool
    def __init__(self, candidates: _Optional[_Iterable[_Union[Candidate, _Mapping]]] = ..., known: bool = ...) -> None: ...

class Measurement(_message.Message):
    __slots__ = ("lease_id", "status", "costs", "compile_time_s", "message", "details_json")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    COSTS_FIELD_NUMBER: _ClassVar[int]
    COMPILE_TIME_S_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    DETAILS_JSON_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    status: str
    costs: _containers.RepeatedScalarFieldContainer[float]
    compile_time_s: float
    message: str
    details_json: str
    def __init__(self, lease_id: _Optional[str] = ..., status: _Optional[str] = ..., costs: _Optional[_Iterable[float]] = ..., compile_time_s: _Optional[float] = ..., message: _Optional[str] = ..., details_json: _Optional[str] = ...) -> None: ...

class ReportRequest(_message.Message):
    __slots__ = ("agent_id", "measurements")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    MEASUREMENTS_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    measurements: _containers.RepeatedCompositeFieldContainer[Measurement]
    def __init__(self, agent_id: _Optional[str] = ..., measurements: _Optional[_Iterable[_Union[Measurement, _Mapping]]] = ...) -> None: ...

class ReportReply(_message.Message):
    __slots__ = ("accepted", "rejected_lease_ids")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REJECTED_LEASE_IDS_FIELD_NUMBER: _ClassVar[int]
    accepted: int
    rejected_lease_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, accepted: _Optional[int] = ..., rejected_lease_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class LeaveRequest(_message.Message):
    __slots__ = ("agent_id",)
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    def __init__(self, agent_id: _Optional[str] = ...) -> None: ...

class LeaveReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class JobSpec(_message.Message):
    __slots__ = ("workload", "target", "device_key", "strategy", "trials", "seed", "early_stopping", "priority", "timing", "wait_timeout_s", "pins", "constraints", "family", "time_budget_s", "transfer", "reuse_share")
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    DEVICE_KEY_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    TRIALS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    EARLY_STOPPING_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    WAIT_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    PINS_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINTS_FIELD_NUMBER: _ClassVar[int]
    FAMILY_FIELD_NUMBER: _ClassVar[int]
    TIME_BUDGET_S_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_FIELD_NUMBER: _ClassVar[int]
    REUSE_SHARE_FIELD_NUMBER: _ClassVar[int]
    workload: str
    target: str
    device_key: str
    strategy: str
    trials: int
    seed: int
    early_stopping: int
    priority: int
    timing: Timing
    wait_timeout_s: float
    pins: _containers.RepeatedScalarFieldContainer[str]
    constraints: _containers.RepeatedScalarFieldContainer[str]
    family: str
    time_budget_s: float
    transfer: bool
    reuse_share: float
    def __init__(self, workload: _Optional[str] = ..., target: _Optional[str] = ..., device_key: _Optional[str] = ..., strategy: _Optional[str] = ..., trials: _Optional[int] = ..., seed: _Optional[int] = ..., early_stopping: _Optional[int] = ..., priority: _Optional[int] = ..., timing: _Optional[_Union[Timing, _Mapping]] = ..., wait_timeout_s: _Optional[float] = ..., pins: _Optional[_Iterable[str]] = ..., constraints: _Optional[_Iterable[str]] = ..., family: _Optional[str] = ..., time_budget_s: _Optional[float] = ..., transfer: bool = ..., reuse_share: _Optional[float] = ...) -> None: ...

class JobRef(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    def __init__(self, job_id: _Optional[int] = ...) -> None: ...

class JobStatus(_message.Message):
    __slots__ = ("job_id", "state", "spec", "done", "measured_now", "errors", "best_mean_s", "best_config_json", "default_mean_s", "default_status", "stopped_early", "queued_candidates", "leased_candidates", "message", "created_at", "flops")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    MEASURED_NOW_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    BEST_MEAN_S_FIELD_NUMBER: _ClassVar[int]
    BEST_CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_MEAN_S_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_STATUS_FIELD_NUMBER: _ClassVar[int]
    STOPPED_EARLY_FIELD_NUMBER: _ClassVar[int]
    QUEUED_CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    LEASED_CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    FLOPS_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    state: str
    spec: JobSpec
    done: int
    measured_now: int
    errors: int
    best_mean_s: float
    best_config_json: str
    default_mean_s: float
    default_status: str
    stopped_early: bool
    queued_candidates: int
    leased_candidates: int
    message: str
    created_at: float
    flops: float
    def __init__(self, job_id: _Optional[int] = ..., state: _Optional[str] = ..., spec: _Optional[_Union[JobSpec, _Mapping]] = ..., done: _Optional[int] = ..., measured_now: _Optional[int] = ..., errors: _Optional[int] = ..., best_mean_s: _Optional[float] = ..., best_config_json: _Optional[str] = ..., default_mean_s: _Optional[float] = ..., default_status: _Optional[str] = ..., stopped_early: bool = ..., queued_candidates: _Optional[int] = ..., leased_candidates: _Optional[int] = ..., message: _Optional[str] = ..., created_at: _Optional[float] = ..., flops: _Optional[float] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ("after_job_id", "page_size")
    AFTER_JOB_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    after_job_id: int
    page_size: int
    def __init__(self, after_job_id: _Optional[int] = ..., page_size: _Optional[int] = ...) -> None: ...

class JobList(_message.Message):
    __slots__ = ("jobs", "more")
    JOBS_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[JobStatus]
    more: bool
    def __init__(self, jobs: _Optional[_Iterable[_Union[JobStatus, _Mapping]]] = ..., more: bool = ...) -> None: ...

class AgentInfo(_message.Message):
    __slots__ = ("agent_id", "key", "name", "capabilities", "last_heartbeat", "registered_at", "parallel", "leased", "peer", "overdue_leases", "quarantined")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_AT_FIELD_NUMBER: _ClassVar[int]
    PARALLEL_FIELD_NUMBER: _ClassVar[int]
    LEASED_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    OVERDUE_LEASES_FIELD_NUMBER: _ClassVar[int]
    QUARANTINED_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    key: str
    name: str
    capabilities: Capabilities
    last_heartbeat: float
    registered_at: float
    parallel: int
    leased: int
    peer: str
    overdue_leases: int
    quarantined: bool
    def __init__(self, agent_id: _Optional[str] = ..., key: _Optional[str] = ..., name: _Optional[str] = ..., capabilities: _Optional[_Union[Capabilities, _Mapping]] = ..., last_heartbeat: _Optional[float] = ..., registered_at: _Optional[float] = ..., parallel: _Optional[int] = ..., leased: _Optional[int] = ..., peer: _Optional[str] = ..., overdue_leases: _Optional[int] = ..., quarantined: bool = ...) -> None: ...

class KeyInfo(_message.Message):
    __slots__ = ("key", "agents", "busy_agents", "queued_candidates", "leased_candidates", "jobs")
    KEY_FIELD_NUMBER: _ClassVar[int]
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    BUSY_AGENTS_FIELD_NUMBER: _ClassVar[int]
    QUEUED_CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    LEASED_CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    key: str
    agents: int
    busy_agents: int
    queued_candidates: int
    leased_candidates: int
    jobs: int
    def __init__(self, key: _Optional[str] = ..., agents: _Optional[int] = ..., busy_agents: _Optional[int] = ..., queued_candidates: _Optional[int] = ..., leased_candidates: _Optional[int] = ..., jobs: _Optional[int] = ...) -> None: ...

class ListAgentsRequest(_message.Message):
    __slots__ = ("key", "keys_only")
    KEY_FIELD_NUMBER: _ClassVar[int]
    KEYS_ONLY_FIELD_NUMBER: _ClassVar[int]
    key: str
    keys_only: bool
    def __init__(self, key: _Optional[str] = ..., keys_only: bool = ...) -> None: ...

class MeasureRequest(_message.Message):
    __slots__ = ("workload", "target", "device_key", "configs_json", "timing", "wait_timeout_s")
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    DEVICE_KEY_FIELD_NUMBER: _ClassVar[int]
    CONFIGS_JSON_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    WAIT_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    workload: str
    target: str
    device_key: str
    configs_json: _containers.RepeatedScalarFieldContainer[str]
    timing: Timing
    wait_timeout_s: float
    def __init__(self, workload: _Optional[str] = ..., target: _Optional[str] = ..., device_key: _Optional[str] = ..., configs_json: _Optional[_Iterable[str]] = ..., timing: _Optional[_Union[Timing, _Mapping]] = ..., wait_timeout_s: _Optional[float] = ...) -> None: ...

class MeasureReply(_message.Message):
    __slots__ = ("measurements", "measured_by")
    MEASUREMENTS_FIELD_NUMBER: _ClassVar[int]
    MEASURED_BY_FIELD_NUMBER: _ClassVar[int]
    measurements: _containers.RepeatedCompositeFieldContainer[Measurement]
    measured_by: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, measurements: _Optional[_Iterable[_Union[Measurement, _Mapping]]] = ..., measured_by: _Optional[_Iterable[str]] = ...) -> None: ...

class RefusedAgent(_message.Message):
    __slots__ = ("name", "key", "peer", "agent_version", "template_version", "expected_template_version", "protocol_version", "expected_protocol_version", "reason", "seconds_ago", "attempts")
    NAME_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    TEMPLATE_VERSION_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_TEMPLATE_VERSION_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SECONDS_AGO_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    name: str
    key: str
    peer: str
    agent_version: str
    template_version: str
    expected_template_version: str
    protocol_version: int
    expected_protocol_version: int
    reason: str
    seconds_ago: float
    attempts: int
    def __init__(self, name: _Optional[str] = ..., key: _Optional[str] = ..., peer: _Optional[str] = ..., agent_version: _Optional[str] = ..., template_version: _Optional[str] = ..., expected_template_version: _Optional[str] = ..., protocol_version: _Optional[int] = ..., expected_protocol_version: _Optional[int] = ..., reason: _Optional[str] = ..., seconds_ago: _Optional[float] = ..., attempts: _Optional[int] = ...) -> None: ...

class AgentList(_message.Message):
    __slots__ = ("agents", "keys", "refused", "leader", "leader_epoch")
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    agents: _containers.RepeatedCompositeFieldContainer[AgentInfo]
    keys: _containers.RepeatedCompositeFieldContainer[KeyInfo]
    refused: _containers.RepeatedCompositeFieldContainer[RefusedAgent]
    leader: str
    leader_epoch: int
    def __init__(self, agents: _Optional[_Iterable[_Union[AgentInfo, _Mapping]]] = ..., keys: _Optional[_Iterable[_Union[KeyInfo, _Mapping]]] = ..., refused: _Optional[_Iterable[_Union[RefusedAgent, _Mapping]]] = ..., leader: _Optional[str] = ..., leader_epoch: _Optional[int] = ...) -> None: ...
