import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from services.common.proto_gen.tailspec.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Observation(_message.Message):
    __slots__ = ("batch_size", "arm", "committed_tokens", "seconds", "explored", "drafted_tokens", "accepted_tokens", "verify_steps", "steps", "at")
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    ARM_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    EXPLORED_FIELD_NUMBER: _ClassVar[int]
    DRAFTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    VERIFY_STEPS_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    batch_size: int
    arm: str
    committed_tokens: int
    seconds: float
    explored: bool
    drafted_tokens: int
    accepted_tokens: int
    verify_steps: int
    steps: int
    at: _timestamp_pb2.Timestamp
    def __init__(self, batch_size: _Optional[int] = ..., arm: _Optional[str] = ..., committed_tokens: _Optional[int] = ..., seconds: _Optional[float] = ..., explored: _Optional[bool] = ..., drafted_tokens: _Optional[int] = ..., accepted_tokens: _Optional[int] = ..., verify_steps: _Optional[int] = ..., steps: _Optional[int] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ReportObservationsRequest(_message.Message):
    __slots__ = ("worker_id", "strategy_table_version", "versions", "observations")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_TABLE_VERSION_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    OBSERVATIONS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    strategy_table_version: int
    versions: _common_pb2.Versions
    observations: _containers.RepeatedCompositeFieldContainer[Observation]
    def __init__(self, worker_id: _Optional[str] = ..., strategy_table_version: _Optional[int] = ..., versions: _Optional[_Union[_common_pb2.Versions, _Mapping]] = ..., observations: _Optional[_Iterable[_Union[Observation, _Mapping]]] = ...) -> None: ...

class ReportObservationsResponse(_message.Message):
    __slots__ = ("used", "dropped", "latest_table_version")
    USED_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    LATEST_TABLE_VERSION_FIELD_NUMBER: _ClassVar[int]
    used: int
    dropped: int
    latest_table_version: int
    def __init__(self, used: _Optional[int] = ..., dropped: _Optional[int] = ..., latest_table_version: _Optional[int] = ...) -> None: ...

class GetStrategyTableRequest(_message.Message):
    __slots__ = ("worker_id", "known_version")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    KNOWN_VERSION_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    known_version: int
    def __init__(self, worker_id: _Optional[str] = ..., known_version: _Optional[int] = ...) -> None: ...

class GetStrategyTableResponse(_message.Message):
    __slots__ = ("table", "unchanged")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    UNCHANGED_FIELD_NUMBER: _ClassVar[int]
    table: _common_pb2.StrategyTable
    unchanged: bool
    def __init__(self, table: _Optional[_Union[_common_pb2.StrategyTable, _Mapping]] = ..., unchanged: _Optional[bool] = ...) -> None: ...

class ArmStats(_message.Message):
    __slots__ = ("arm", "window", "total", "median", "ratio", "chosen", "explored", "guarded", "strikes")
    ARM_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    MEDIAN_FIELD_NUMBER: _ClassVar[int]
    RATIO_FIELD_NUMBER: _ClassVar[int]
    CHOSEN_FIELD_NUMBER: _ClassVar[int]
    EXPLORED_FIELD_NUMBER: _ClassVar[int]
    GUARDED_FIELD_NUMBER: _ClassVar[int]
    STRIKES_FIELD_NUMBER: _ClassVar[int]
    arm: str
    window: int
    total: int
    median: float
    ratio: float
    chosen: int
    explored: int
    guarded: bool
    strikes: int
    def __init__(self, arm: _Optional[str] = ..., window: _Optional[int] = ..., total: _Optional[int] = ..., median: _Optional[float] = ..., ratio: _Optional[float] = ..., chosen: _Optional[int] = ..., explored: _Optional[int] = ..., guarded: _Optional[bool] = ..., strikes: _Optional[int] = ...) -> None: ...

class BucketStats(_message.Message):
    __slots__ = ("bucket", "lo", "hi", "observations", "best", "chosen", "explored", "exploration_fraction", "arms")
    BUCKET_FIELD_NUMBER: _ClassVar[int]
    LO_FIELD_NUMBER: _ClassVar[int]
    HI_FIELD_NUMBER: _ClassVar[int]
    OBSERVATIONS_FIELD_NUMBER: _ClassVar[int]
    BEST_FIELD_NUMBER: _ClassVar[int]
    CHOSEN_FIELD_NUMBER: _ClassVar[int]
    EXPLORED_FIELD_NUMBER: _ClassVar[int]
    EXPLORATION_FRACTION_FIELD_NUMBER: _ClassVar[int]
    ARMS_FIELD_NUMBER: _ClassVar[int]
    bucket: int
    lo: int
    hi: int
    observations: int
    best: str
    chosen: int
    explored: int
    exploration_fraction: float
    arms: _containers.RepeatedCompositeFieldContainer[ArmStats]
    def __init__(self, bucket: _Optional[int] = ..., lo: _Optional[int] = ..., hi: _Optional[int] = ..., observations: _Optional[int] = ..., best: _Optional[str] = ..., chosen: _Optional[int] = ..., explored: _Optional[int] = ..., exploration_fraction: _Optional[float] = ..., arms: _Optional[_Iterable[_Union[ArmStats, _Mapping]]] = ...) -> None: ...

class TunerStatus(_message.Message):
    __slots__ = ("info", "table", "observations_total", "dropped_total", "exploration_fraction", "buckets")
    INFO_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    OBSERVATIONS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    DROPPED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    EXPLORATION_FRACTION_FIELD_NUMBER: _ClassVar[int]
    BUCKETS_FIELD_NUMBER: _ClassVar[int]
    info: _common_pb2.ServiceInfo
    table: _common_pb2.StrategyTable
    observations_total: int
    dropped_total: int
    exploration_fraction: float
    buckets: _containers.RepeatedCompositeFieldContainer[BucketStats]
    def __init__(self, info: _Optional[_Union[_common_pb2.ServiceInfo, _Mapping]] = ..., table: _Optional[_Union[_common_pb2.StrategyTable, _Mapping]] = ..., observations_total: _Optional[int] = ..., dropped_total: _Optional[int] = ..., exploration_fraction: _Optional[float] = ..., buckets: _Optional[_Iterable[_Union[BucketStats, _Mapping]]] = ...) -> None: ...
