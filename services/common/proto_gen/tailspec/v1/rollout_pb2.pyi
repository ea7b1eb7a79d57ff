from services.common.proto_gen.tailspec.v1 import common_pb2 as _common_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LoadPolicyRequest(_message.Message):
    __slots__ = ("policy", "immediately")
    POLICY_FIELD_NUMBER: _ClassVar[int]
    IMMEDIATELY_FIELD_NUMBER: _ClassVar[int]
    policy: _common_pb2.PolicyVersion
    immediately: bool
    def __init__(self, policy: _Optional[_Union[_common_pb2.PolicyVersion, _Mapping]] = ..., immediately: _Optional[bool] = ...) -> None: ...

class LoadPolicyResponse(_message.Message):
    __slots__ = ("accepted", "deferred", "active_version", "message")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    DEFERRED_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_VERSION_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    deferred: bool
    active_version: int
    message: str
    def __init__(self, accepted: _Optional[bool] = ..., deferred: _Optional[bool] = ..., active_version: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class LoadDrafterRequest(_message.Message):
    __slots__ = ("drafter", "immediately")
    DRAFTER_FIELD_NUMBER: _ClassVar[int]
    IMMEDIATELY_FIELD_NUMBER: _ClassVar[int]
    drafter: _common_pb2.DrafterVersion
    immediately: bool
    def __init__(self, drafter: _Optional[_Union[_common_pb2.DrafterVersion, _Mapping]] = ..., immediately: _Optional[bool] = ...) -> None: ...

class LoadDrafterResponse(_message.Message):
    __slots__ = ("accepted", "deferred", "active_version", "message")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    DEFERRED_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_VERSION_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    deferred: bool
    active_version: int
    message: str
    def __init__(self, accepted: _Optional[bool] = ..., deferred: _Optional[bool] = ..., active_version: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class SetStrategyTableRequest(_message.Message):
    __slots__ = ("table",)
    TABLE_FIELD_NUMBER: _ClassVar[int]
    table: _common_pb2.StrategyTable
    def __init__(self, table: _Optional[_Union[_common_pb2.StrategyTable, _Mapping]] = ...) -> None: ...

class SetStrategyTableResponse(_message.Message):
    __slots__ = ("accepted", "active_version", "message")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_VERSION_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    active_version: int
    message: str
    def __init__(self, accepted: _Optional[bool] = ..., active_version: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class RolloutStatus(_message.Message):
    __slots__ = ("info", "state", "versions", "rl_step", "active_batch_size", "max_batch_size", "pending_requests", "finished_requests", "generated_tokens", "drafted_tokens", "accepted_tokens", "mean_acceptance_length", "current_arm")
    INFO_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    RL_STEP_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    PENDING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    GENERATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DRAFTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MEAN_ACCEPTANCE_LENGTH_FIELD_NUMBER: _ClassVar[int]
    CURRENT_ARM_FIELD_NUMBER: _ClassVar[int]
    info: _common_pb2.ServiceInfo
    state: _common_pb2.WorkerState
    versions: _common_pb2.Versions
    rl_step: int
    active_batch_size: int
    max_batch_size: int
    pending_requests: int
    finished_requests: int
    generated_tokens: int
    drafted_tokens: int
    accepted_tokens: int
    mean_acceptance_length: float
    current_arm: _common_pb2.Arm
    def __init__(self, info: _Optional[_Union[_common_pb2.ServiceInfo, _Mapping]] = ..., state: _Optional[_Union[_common_pb2.WorkerState, str]] = ..., versions: _Optional[_Union[_common_pb2.Versions, _Mapping]] = ..., rl_step: _Optional[int] = ..., active_batch_size: _Optional[int] = ..., max_batch_size: _Optional[int] = ..., pending_requests: _Optional[int] = ..., finished_requests: _Optional[int] = ..., generated_tokens: _Optional[int] = ..., drafted_tokens: _Optional[int] = ..., accepted_tokens: _Optional[int] = ..., mean_acceptance_length: _Optional[float] = ..., current_arm: _Optional[_Union[_common_pb2.Arm, _Mapping]] = ...) -> None: ...
