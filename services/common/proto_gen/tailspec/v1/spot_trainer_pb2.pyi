import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from services.common.proto_gen.tailspec.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GrantRequest(_message.Message):
    __slots__ = ("grant",)
    GRANT_FIELD_NUMBER: _ClassVar[int]
    grant: _common_pb2.Grant
    def __init__(self, grant: _Optional[_Union[_common_pb2.Grant, _Mapping]] = ...) -> None: ...

class GrantResponse(_message.Message):
    __slots__ = ("accepted", "drafter_version", "buffered_samples", "message")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    DRAFTER_VERSION_FIELD_NUMBER: _ClassVar[int]
    BUFFERED_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    drafter_version: int
    buffered_samples: int
    message: str
    def __init__(self, accepted: _Optional[bool] = ..., drafter_version: _Optional[int] = ..., buffered_samples: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class PreemptRequest(_message.Message):
    __slots__ = ("preemption",)
    PREEMPTION_FIELD_NUMBER: _ClassVar[int]
    preemption: _common_pb2.Preemption
    def __init__(self, preemption: _Optional[_Union[_common_pb2.Preemption, _Mapping]] = ...) -> None: ...

class PreemptResponse(_message.Message):
    __slots__ = ("released", "release_seconds", "steps_in_grant", "trained_seconds", "drafter_version", "checkpoint_pending", "message", "grant_id", "worker_id", "started_at", "finished_at", "train_steps", "last_loss", "last_accuracy", "stop_reason")
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    RELEASE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    STEPS_IN_GRANT_FIELD_NUMBER: _ClassVar[int]
    TRAINED_SECONDS_FIELD_NUMBER: _ClassVar[int]
    DRAFTER_VERSION_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_PENDING_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    GRANT_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    TRAIN_STEPS_FIELD_NUMBER: _ClassVar[int]
    LAST_LOSS_FIELD_NUMBER: _ClassVar[int]
    LAST_ACCURACY_FIELD_NUMBER: _ClassVar[int]
    STOP_REASON_FIELD_NUMBER: _ClassVar[int]
    released: bool
    release_seconds: float
    steps_in_grant: int
    trained_seconds: float
    drafter_version: int
    checkpoint_pending: bool
    message: str
    grant_id: str
    worker_id: str
    started_at: _timestamp_pb2.Timestamp
    finished_at: _timestamp_pb2.Timestamp
    train_steps: int
    last_loss: float
    last_accuracy: float
    stop_reason: str
    def __init__(self, released: _Optional[bool] = ..., release_seconds: _Optional[float] = ..., steps_in_grant: _Optional[int] = ..., trained_seconds: _Optional[float] = ..., drafter_version: _Optional[int] = ..., checkpoint_pending: _Optional[bool] = ..., message: _Optional[str] = ..., grant_id: _Optional[str] = ..., worker_id: _Optional[str] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finished_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., train_steps: _Optional[int] = ..., last_loss: _Optional[float] = ..., last_accuracy: _Optional[float] = ..., stop_reason: _Optional[str] = ...) -> None: ...

class SpotTrainerStatus(_message.Message):
    __slots__ = ("info", "active_grants", "drafter", "train_steps", "buffered_samples", "buffer_capacity", "samples_dropped_stale", "trained_seconds_total", "last_loss", "last_accuracy", "replica", "leader", "stream_address", "steps_since_sync", "training")
    INFO_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_GRANTS_FIELD_NUMBER: _ClassVar[int]
    DRAFTER_FIELD_NUMBER: _ClassVar[int]
    TRAIN_STEPS_FIELD_NUMBER: _ClassVar[int]
    BUFFERED_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    BUFFER_CAPACITY_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_DROPPED_STALE_FIELD_NUMBER: _ClassVar[int]
    TRAINED_SECONDS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    LAST_LOSS_FIELD_NUMBER: _ClassVar[int]
    LAST_ACCURACY_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    STREAM_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    STEPS_SINCE_SYNC_FIELD_NUMBER: _ClassVar[int]
    TRAINING_FIELD_NUMBER: _ClassVar[int]
    info: _common_pb2.ServiceInfo
    active_grants: _containers.RepeatedCompositeFieldContainer[_common_pb2.Grant]
    drafter: _common_pb2.DrafterVersion
    train_steps: int
    buffered_samples: int
    buffer_capacity: int
    samples_dropped_stale: int
    trained_seconds_total: float
    last_loss: float
    last_accuracy: float
    replica: int
    leader: bool
    stream_address: str
    steps_since_sync: int
    training: bool
    def __init__(self, info: _Optional[_Union[_common_pb2.ServiceInfo, _Mapping]] = ..., active_grants: _Optional[_Iterable[_Union[_common_pb2.Grant, _Mapping]]] = ..., drafter: _Optional[_Union[_common_pb2.DrafterVersion, _Mapping]] = ..., train_steps: _Optional[int] = ..., buffered_samples: _Optional[int] = ..., buffer_capacity: _Optional[int] = ..., samples_dropped_stale: _Optional[int] = ..., trained_seconds_total: _Optional[float] = ..., last_loss: _Optional[float] = ..., last_accuracy: _Optional[float] = ..., replica: _Optional[int] = ..., leader: _Optional[bool] = ..., stream_address: _Optional[str] = ..., steps_since_sync: _Optional[int] = ..., training: _Optional[bool] = ...) -> None: ...
