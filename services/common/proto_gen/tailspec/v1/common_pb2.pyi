import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WorkerState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WORKER_STATE_UNSPECIFIED: _ClassVar[WorkerState]
    WORKER_STATE_STARTING: _ClassVar[WorkerState]
    WORKER_STATE_ROLLOUT: _ClassVar[WorkerState]
    WORKER_STATE_IDLE: _ClassVar[WorkerState]
    WORKER_STATE_TRAINING: _ClassVar[WorkerState]
    WORKER_STATE_PREEMPTING: _ClassVar[WorkerState]
    WORKER_STATE_FAILED: _ClassVar[WorkerState]
    WORKER_STATE_STOPPED: _ClassVar[WorkerState]

class WorkerRole(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WORKER_ROLE_UNSPECIFIED: _ClassVar[WorkerRole]
    WORKER_ROLE_ROLLOUT: _ClassVar[WorkerRole]
    WORKER_ROLE_SPOT_TRAINER: _ClassVar[WorkerRole]
    WORKER_ROLE_POLICY_TRAINER: _ClassVar[WorkerRole]
    WORKER_ROLE_TUNER: _ClassVar[WorkerRole]
    WORKER_ROLE_PIPELINE: _ClassVar[WorkerRole]

class StepPhase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STEP_PHASE_UNSPECIFIED: _ClassVar[StepPhase]
    STEP_PHASE_ROLLOUT: _ClassVar[StepPhase]
    STEP_PHASE_REWARD: _ClassVar[StepPhase]
    STEP_PHASE_TRAIN: _ClassVar[StepPhase]
    STEP_PHASE_WEIGHT_SYNC: _ClassVar[StepPhase]
    STEP_PHASE_DONE: _ClassVar[StepPhase]

class Drafter(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DRAFTER_UNSPECIFIED: _ClassVar[Drafter]
    DRAFTER_OFF: _ClassVar[Drafter]
    DRAFTER_SUFFIX: _ClassVar[Drafter]
    DRAFTER_LEARNED: _ClassVar[Drafter]
    DRAFTER_NGRAM: _ClassVar[Drafter]
    DRAFTER_HYBRID: _ClassVar[Drafter]
WORKER_STATE_UNSPECIFIED: WorkerState
WORKER_STATE_STARTING: WorkerState
WORKER_STATE_ROLLOUT: WorkerState
WORKER_STATE_IDLE: WorkerState
WORKER_STATE_TRAINING: WorkerState
WORKER_STATE_PREEMPTING: WorkerState
WORKER_STATE_FAILED: WorkerState
WORKER_STATE_STOPPED: WorkerState
WORKER_ROLE_UNSPECIFIED: WorkerRole
WORKER_ROLE_ROLLOUT: WorkerRole
WORKER_ROLE_SPOT_TRAINER: WorkerRole
WORKER_ROLE_POLICY_TRAINER: WorkerRole
WORKER_ROLE_TUNER: WorkerRole
WORKER_ROLE_PIPELINE: WorkerRole
STEP_PHASE_UNSPECIFIED: StepPhase
STEP_PHASE_ROLLOUT: StepPhase
STEP_PHASE_REWARD: StepPhase
STEP_PHASE_TRAIN: StepPhase
STEP_PHASE_WEIGHT_SYNC: StepPhase
STEP_PHASE_DONE: StepPhase
DRAFTER_UNSPECIFIED: Drafter
DRAFTER_OFF: Drafter
DRAFTER_SUFFIX: Drafter
DRAFTER_LEARNED: Drafter
DRAFTER_NGRAM: Drafter
DRAFTER_HYBRID: Drafter

class Resources(_message.Message):
    __slots__ = ("num_gpus", "num_cpus", "memory_bytes", "custom")
    class CustomEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    NUM_GPUS_FIELD_NUMBER: _ClassVar[int]
    NUM_CPUS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    CUSTOM_FIELD_NUMBER: _ClassVar[int]
    num_gpus: float
    num_cpus: float
    memory_bytes: int
    custom: _containers.ScalarMap[str, float]
    def __init__(self, num_gpus: _Optional[float] = ..., num_cpus: _Optional[float] = ..., memory_bytes: _Optional[int] = ..., custom: _Optional[_Mapping[str, float]] = ...) -> None: ...

class PolicyVersion(_message.Message):
    __slots__ = ("version", "rl_step", "weights_ref", "checksum", "num_parameters", "created_at")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    RL_STEP_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_REF_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    NUM_PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    version: int
    rl_step: int
    weights_ref: str
    checksum: str
    num_parameters: int
    created_at: _timestamp_pb2.Timestamp
    def __init__(self, version: _Optional[int] = ..., rl_step: _Optional[int] = ..., weights_ref: _Optional[str] = ..., checksum: _Optional[str] = ..., num_parameters: _Optional[int] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class DrafterVersion(_message.Message):
    __slots__ = ("version", "trained_on_policy_version", "train_steps", "weights_ref", "checkpoint_path", "eval_acceptance_length", "created_at")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TRAINED_ON_POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    TRAIN_STEPS_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_REF_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_PATH_FIELD_NUMBER: _ClassVar[int]
    EVAL_ACCEPTANCE_LENGTH_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    version: int
    trained_on_policy_version: int
    train_steps: int
    weights_ref: str
    checkpoint_path: str
    eval_acceptance_length: float
    created_at: _timestamp_pb2.Timestamp
    def __init__(self, version: _Optional[int] = ..., trained_on_policy_version: _Optional[int] = ..., train_steps: _Optional[int] = ..., weights_ref: _Optional[str] = ..., checkpoint_path: _Optional[str] = ..., eval_acceptance_length: _Optional[float] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Versions(_message.Message):
    __slots__ = ("policy_version", "drafter_version", "strategy_table_version")
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    DRAFTER_VERSION_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_TABLE_VERSION_FIELD_NUMBER: _ClassVar[int]
    policy_version: int
    drafter_version: int
    strategy_table_version: int
    def __init__(self, policy_version: _Optional[int] = ..., drafter_version: _Optional[int] = ..., strategy_table_version: _Optional[int] = ...) -> None: ...

class Grant(_message.Message):
    __slots__ = ("grant_id", "worker_id", "grantee_id", "resources", "granted_at", "deadline", "rl_step", "policy_version")
    GRANT_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    GRANTEE_ID_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    GRANTED_AT_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    RL_STEP_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    grant_id: str
    worker_id: str
    grantee_id: str
    resources: Resources
    granted_at: _timestamp_pb2.Timestamp
    deadline: _timestamp_pb2.Timestamp
    rl_step: int
    policy_version: int
    def __init__(self, grant_id: _Optional[str] = ..., worker_id: _Optional[str] = ..., grantee_id: _Optional[str] = ..., resources: _Optional[_Union[Resources, _Mapping]] = ..., granted_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., rl_step: _Optional[int] = ..., policy_version: _Optional[int] = ...) -> None: ...

class Preemption(_message.Message):
    __slots__ = ("grant_id", "worker_id", "reason", "release_by", "urgent")
    GRANT_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RELEASE_BY_FIELD_NUMBER: _ClassVar[int]
    URGENT_FIELD_NUMBER: _ClassVar[int]
    grant_id: str
    worker_id: str
    reason: str
    release_by: _timestamp_pb2.Timestamp
    urgent: bool
    def __init__(self, grant_id: _Optional[str] = ..., worker_id: _Optional[str] = ..., reason: _Optional[str] = ..., release_by: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., urgent: _Optional[bool] = ...) -> None: ...

class StateTransition(_message.Message):
    __slots__ = ("worker_id", "from_state", "to_state", "reason", "at", "rl_step")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_STATE_FIELD_NUMBER: _ClassVar[int]
    TO_STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    RL_STEP_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    from_state: WorkerState
    to_state: WorkerState
    reason: str
    at: _timestamp_pb2.Timestamp
    rl_step: int
    def __init__(self, worker_id: _Optional[str] = ..., from_state: _Optional[_Union[WorkerState, str]] = ..., to_state: _Optional[_Union[WorkerState, str]] = ..., reason: _Optional[str] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., rl_step: _Optional[int] = ...) -> None: ...

class Arm(_message.Message):
    __slots__ = ("name", "drafter", "max_draft_tokens", "tree_width", "tree_depth")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DRAFTER_FIELD_NUMBER: _ClassVar[int]
    MAX_DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TREE_WIDTH_FIELD_NUMBER: _ClassVar[int]
    TREE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    name: str
    drafter: Drafter
    max_draft_tokens: int
    tree_width: int
    tree_depth: int
    def __init__(self, name: _Optional[str] = ..., drafter: _Optional[_Union[Drafter, str]] = ..., max_draft_tokens: _Optional[int] = ..., tree_width: _Optional[int] = ..., tree_depth: _Optional[int] = ...) -> None: ...

class StrategyBucket(_message.Message):
    __slots__ = ("bucket", "lo", "hi", "best", "explore", "probe", "guarded", "windows", "allowance")
    BUCKET_FIELD_NUMBER: _ClassVar[int]
    LO_FIELD_NUMBER: _ClassVar[int]
    HI_FIELD_NUMBER: _ClassVar[int]
    BEST_FIELD_NUMBER: _ClassVar[int]
    EXPLORE_FIELD_NUMBER: _ClassVar[int]
    PROBE_FIELD_NUMBER: _ClassVar[int]
    GUARDED_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_FIELD_NUMBER: _ClassVar[int]
    ALLOWANCE_FIELD_NUMBER: _ClassVar[int]
    bucket: int
    lo: int
    hi: int
    best: str
    explore: _containers.RepeatedScalarFieldContainer[str]
    probe: _containers.RepeatedScalarFieldContainer[str]
    guarded: _containers.RepeatedScalarFieldContainer[str]
    windows: _containers.RepeatedCompositeFieldContainer[ArmWindow]
    allowance: float
    def __init__(self, bucket: _Optional[int] = ..., lo: _Optional[int] = ..., hi: _Optional[int] = ..., best: _Optional[str] = ..., explore: _Optional[_Iterable[str]] = ..., probe: _Optional[_Iterable[str]] = ..., guarded: _Optional[_Iterable[str]] = ..., windows: _Optional[_Iterable[_Union[ArmWindow, _Mapping]]] = ..., allowance: _Optional[float] = ...) -> None: ...

class ArmWindow(_message.Message):
    __slots__ = ("arm", "n", "tokens", "seconds", "tokens_sq", "tokens_seconds", "seconds_sq")
    ARM_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_SQ_FIELD_NUMBER: _ClassVar[int]
    TOKENS_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_SQ_FIELD_NUMBER: _ClassVar[int]
    arm: str
    n: float
    tokens: float
    seconds: float
    tokens_sq: float
    tokens_seconds: float
    seconds_sq: float
    def __init__(self, arm: _Optional[str] = ..., n: _Optional[float] = ..., tokens: _Optional[float] = ..., seconds: _Optional[float] = ..., tokens_sq: _Optional[float] = ..., tokens_seconds: _Optional[float] = ..., seconds_sq: _Optional[float] = ...) -> None: ...

class SelectorSettings(_message.Message):
    __slots__ = ("window", "min_samples", "z")
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    MIN_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    Z_FIELD_NUMBER: _ClassVar[int]
    window: int
    min_samples: int
    z: float
    def __init__(self, window: _Optional[int] = ..., min_samples: _Optional[int] = ..., z: _Optional[float] = ...) -> None: ...

class LedgerSettings(_message.Message):
    __slots__ = ("budget",)
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    budget: float
    def __init__(self, budget: _Optional[float] = ...) -> None: ...

class StrategyTable(_message.Message):
    __slots__ = ("version", "bucket_edges", "arms", "buckets", "drafter_version", "created_at", "ledger", "selector")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    BUCKET_EDGES_FIELD_NUMBER: _ClassVar[int]
    ARMS_FIELD_NUMBER: _ClassVar[int]
    BUCKETS_FIELD_NUMBER: _ClassVar[int]
    DRAFTER_VERSION_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    LEDGER_FIELD_NUMBER: _ClassVar[int]
    SELECTOR_FIELD_NUMBER: _ClassVar[int]
    version: int
    bucket_edges: _containers.RepeatedScalarFieldContainer[int]
    arms: _containers.RepeatedCompositeFieldContainer[Arm]
    buckets: _containers.RepeatedCompositeFieldContainer[StrategyBucket]
    drafter_version: int
    created_at: _timestamp_pb2.Timestamp
    ledger: LedgerSettings
    selector: SelectorSettings
    def __init__(self, version: _Optional[int] = ..., bucket_edges: _Optional[_Iterable[int]] = ..., arms: _Optional[_Iterable[_Union[Arm, _Mapping]]] = ..., buckets: _Optional[_Iterable[_Union[StrategyBucket, _Mapping]]] = ..., drafter_version: _Optional[int] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., ledger: _Optional[_Union[LedgerSettings, _Mapping]] = ..., selector: _Optional[_Union[SelectorSettings, _Mapping]] = ...) -> None: ...

class ServiceInfo(_message.Message):
    __slots__ = ("service", "instance_id", "address", "version", "started_at", "uptime_seconds", "message")
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    UPTIME_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    service: str
    instance_id: str
    address: str
    version: str
    started_at: _timestamp_pb2.Timestamp
    uptime_seconds: float
    message: str
    def __init__(self, service: _Optional[str] = ..., instance_id: _Optional[str] = ..., address: _Optional[str] = ..., version: _Optional[str] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., uptime_seconds: _Optional[float] = ..., message: _Optional[str] = ...) -> None: ...

class GetStatusRequest(_message.Message):
    __slots__ = ("verbose",)
    VERBOSE_FIELD_NUMBER: _ClassVar[int]
    verbose: bool
    def __init__(self, verbose: _Optional[bool] = ...) -> None: ...
