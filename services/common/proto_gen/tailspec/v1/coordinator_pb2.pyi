import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from services.common.proto_gen.tailspec.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ResourcePurpose(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RESOURCE_PURPOSE_UNSPECIFIED: _ClassVar[ResourcePurpose]
    RESOURCE_PURPOSE_ROLLOUT: _ClassVar[ResourcePurpose]
    RESOURCE_PURPOSE_DRAFTER_TRAINING: _ClassVar[ResourcePurpose]
RESOURCE_PURPOSE_UNSPECIFIED: ResourcePurpose
RESOURCE_PURPOSE_ROLLOUT: ResourcePurpose
RESOURCE_PURPOSE_DRAFTER_TRAINING: ResourcePurpose

class RegisterRequest(_message.Message):
    __slots__ = ("worker_id", "role", "address", "node_id", "resources", "versions", "state", "rl_step")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    RL_STEP_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    role: _common_pb2.WorkerRole
    address: str
    node_id: str
    resources: _common_pb2.Resources
    versions: _common_pb2.Versions
    state: _common_pb2.WorkerState
    rl_step: int
    def __init__(self, worker_id: _Optional[str] = ..., role: _Optional[_Union[_common_pb2.WorkerRole, str]] = ..., address: _Optional[str] = ..., node_id: _Optional[str] = ..., resources: _Optional[_Union[_common_pb2.Resources, _Mapping]] = ..., versions: _Optional[_Union[_common_pb2.Versions, _Mapping]] = ..., state: _Optional[_Union[_common_pb2.WorkerState, str]] = ..., rl_step: _Optional[int] = ...) -> None: ...

class RegisterResponse(_message.Message):
    __slots__ = ("worker_id", "state", "heartbeat_interval_seconds", "heartbeat_timeout_seconds", "rl_step", "versions")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RL_STEP_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    state: _common_pb2.WorkerState
    heartbeat_interval_seconds: float
    heartbeat_timeout_seconds: float
    rl_step: int
    versions: _common_pb2.Versions
    def __init__(self, worker_id: _Optional[str] = ..., state: _Optional[_Union[_common_pb2.WorkerState, str]] = ..., heartbeat_interval_seconds: _Optional[float] = ..., heartbeat_timeout_seconds: _Optional[float] = ..., rl_step: _Optional[int] = ..., versions: _Optional[_Union[_common_pb2.Versions, _Mapping]] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("worker_id", "state", "versions", "active_batch_size", "pending_requests", "sent_at")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    PENDING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    SENT_AT_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    state: _common_pb2.WorkerState
    versions: _common_pb2.Versions
    active_batch_size: int
    pending_requests: int
    sent_at: _timestamp_pb2.Timestamp
    def __init__(self, worker_id: _Optional[str] = ..., state: _Optional[_Union[_common_pb2.WorkerState, str]] = ..., versions: _Optional[_Union[_common_pb2.Versions, _Mapping]] = ..., active_batch_size: _Optional[int] = ..., pending_requests: _Optional[int] = ..., sent_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("known", "state", "preemption", "target_versions", "rl_step")
    KNOWN_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PREEMPTION_FIELD_NUMBER: _ClassVar[int]
    TARGET_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    RL_STEP_FIELD_NUMBER: _ClassVar[int]
    known: bool
    state: _common_pb2.WorkerState
    preemption: _common_pb2.Preemption
    target_versions: _common_pb2.Versions
    rl_step: int
    def __init__(self, known: _Optional[bool] = ..., state: _Optional[_Union[_common_pb2.WorkerState, str]] = ..., preemption: _Optional[_Union[_common_pb2.Preemption, _Mapping]] = ..., target_versions: _Optional[_Union[_common_pb2.Versions, _Mapping]] = ..., rl_step: _Optional[int] = ...) -> None: ...

class ReportStateRequest(_message.Message):
    __slots__ = ("worker_id", "state", "reason", "rl_step", "versions", "pending_requests", "grant_id", "train_step")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RL_STEP_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    PENDING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    GRANT_ID_FIELD_NUMBER: _ClassVar[int]
    TRAIN_STEP_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    state: _common_pb2.WorkerState
    reason: str
    rl_step: int
    versions: _common_pb2.Versions
    pending_requests: int
    grant_id: str
    train_step: int
    def __init__(self, worker_id: _Optional[str] = ..., state: _Optional[_Union[_common_pb2.WorkerState, str]] = ..., reason: _Optional[str] = ..., rl_step: _Optional[int] = ..., versions: _Optional[_Union[_common_pb2.Versions, _Mapping]] = ..., pending_requests: _Optional[int] = ..., grant_id: _Optional[str] = ..., train_step: _Optional[int] = ...) -> None: ...

class ReportStateResponse(_message.Message):
    __slots__ = ("accepted", "state", "message", "grant")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    GRANT_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    state: _common_pb2.WorkerState
    message: str
    grant: _common_pb2.Grant
    def __init__(self, accepted: _Optional[bool] = ..., state: _Optional[_Union[_common_pb2.WorkerState, str]] = ..., message: _Optional[str] = ..., grant: _Optional[_Union[_common_pb2.Grant, _Mapping]] = ...) -> None: ...

class RequestResourcesRequest(_message.Message):
    __slots__ = ("requester_id", "purpose", "num_workers", "per_worker", "worker_ids", "deadline", "rl_step", "fresh_samples", "reason")
    REQUESTER_ID_FIELD_NUMBER: _ClassVar[int]
    PURPOSE_FIELD_NUMBER: _ClassVar[int]
    NUM_WORKERS_FIELD_NUMBER: _ClassVar[int]
    PER_WORKER_FIELD_NUMBER: _ClassVar[int]
    WORKER_IDS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    RL_STEP_FIELD_NUMBER: _ClassVar[int]
    FRESH_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    requester_id: str
    purpose: ResourcePurpose
    num_workers: int
    per_worker: _common_pb2.Resources
    worker_ids: _containers.RepeatedScalarFieldContainer[str]
    deadline: _timestamp_pb2.Timestamp
    rl_step: int
    fresh_samples: int
    reason: str
    def __init__(self, requester_id: _Optional[str] = ..., purpose: _Optional[_Union[ResourcePurpose, str]] = ..., num_workers: _Optional[int] = ..., per_worker: _Optional[_Union[_common_pb2.Resources, _Mapping]] = ..., worker_ids: _Optional[_Iterable[str]] = ..., deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., rl_step: _Optional[int] = ..., fresh_samples: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class RequestResourcesResponse(_message.Message):
    __slots__ = ("grants", "preemptions", "ready_worker_ids", "unavailable", "message")
    GRANTS_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIONS_FIELD_NUMBER: _ClassVar[int]
    READY_WORKER_IDS_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    grants: _containers.RepeatedCompositeFieldContainer[_common_pb2.Grant]
    preemptions: _containers.RepeatedCompositeFieldContainer[_common_pb2.Preemption]
    ready_worker_ids: _containers.RepeatedScalarFieldContainer[str]
    unavailable: int
    message: str
    def __init__(self, grants: _Optional[_Iterable[_Union[_common_pb2.Grant, _Mapping]]] = ..., preemptions: _Optional[_Iterable[_Union[_common_pb2.Preemption, _Mapping]]] = ..., ready_worker_ids: _Optional[_Iterable[str]] = ..., unavailable: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class WorkerInfo(_message.Message):
    __slots__ = ("worker_id", "role", "state", "address", "node_id", "resources", "versions", "active_batch_size", "pending_requests", "last_heartbeat", "state_since", "grant_id", "message")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    PENDING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    STATE_SINCE_FIELD_NUMBER: _ClassVar[int]
    GRANT_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    role: _common_pb2.WorkerRole
    state: _common_pb2.WorkerState
    address: str
    node_id: str
    resources: _common_pb2.Resources
    versions: _common_pb2.Versions
    active_batch_size: int
    pending_requests: int
    last_heartbeat: _timestamp_pb2.Timestamp
    state_since: _timestamp_pb2.Timestamp
    grant_id: str
    message: str
    def __init__(self, worker_id: _Optional[str] = ..., role: _Optional[_Union[_common_pb2.WorkerRole, str]] = ..., state: _Optional[_Union[_common_pb2.WorkerState, str]] = ..., address: _Optional[str] = ..., node_id: _Optional[str] = ..., resources: _Optional[_Union[_common_pb2.Resources, _Mapping]] = ..., versions: _Optional[_Union[_common_pb2.Versions, _Mapping]] = ..., active_batch_size: _Optional[int] = ..., pending_requests: _Optional[int] = ..., last_heartbeat: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., state_since: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., grant_id: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class CoordinatorStatus(_message.Message):
    __slots__ = ("info", "rl_step", "phase", "versions", "workers", "active_grants", "bubble_seconds_total", "bubble_trained_seconds_total", "recent_transitions", "now")
    INFO_FIELD_NUMBER: _ClassVar[int]
    RL_STEP_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_GRANTS_FIELD_NUMBER: _ClassVar[int]
    BUBBLE_SECONDS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    BUBBLE_TRAINED_SECONDS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    RECENT_TRANSITIONS_FIELD_NUMBER: _ClassVar[int]
    NOW_FIELD_NUMBER: _ClassVar[int]
    info: _common_pb2.ServiceInfo
    rl_step: int
    phase: _common_pb2.StepPhase
    versions: _common_pb2.Versions
    workers: _containers.RepeatedCompositeFieldContainer[WorkerInfo]
    active_grants: _containers.RepeatedCompositeFieldContainer[_common_pb2.Grant]
    bubble_seconds_total: float
    bubble_trained_seconds_total: float
    recent_transitions: _containers.RepeatedCompositeFieldContainer[_common_pb2.StateTransition]
    now: _timestamp_pb2.Timestamp
    def __init__(self, info: _Optional[_Union[_common_pb2.ServiceInfo, _Mapping]] = ..., rl_step: _Optional[int] = ..., phase: _Optional[_Union[_common_pb2.StepPhase, str]] = ..., versions: _Optional[_Union[_common_pb2.Versions, _Mapping]] = ..., workers: _Optional[_Iterable[_Union[WorkerInfo, _Mapping]]] = ..., active_grants: _Optional[_Iterable[_Union[_common_pb2.Grant, _Mapping]]] = ..., bubble_seconds_total: _Optional[float] = ..., bubble_trained_seconds_total: _Optional[float] = ..., recent_transitions: _Optional[_Iterable[_Union[_common_pb2.StateTransition, _Mapping]]] = ..., now: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ReportRunRequest(_message.Message):
    __slots__ = ("rl_step", "phase", "versions", "bubble_seconds_total", "bubble_trained_seconds_total")
    RL_STEP_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    BUBBLE_SECONDS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    BUBBLE_TRAINED_SECONDS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    rl_step: int
    phase: _common_pb2.StepPhase
    versions: _common_pb2.Versions
    bubble_seconds_total: float
    bubble_trained_seconds_total: float
    def __init__(self, rl_step: _Optional[int] = ..., phase: _Optional[_Union[_common_pb2.StepPhase, str]] = ..., versions: _Optional[_Union[_common_pb2.Versions, _Mapping]] = ..., bubble_seconds_total: _Optional[float] = ..., bubble_trained_seconds_total: _Optional[float] = ...) -> None: ...

class ReportRunResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
