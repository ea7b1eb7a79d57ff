"""The coordinator's gRPC face: ``CoordinatorService`` (``protos/tailspec/v1/coordinator.proto``) over the
plain ``Coordinator`` plus the driver's view of the run (step, phase, versions, bubble totals).

    tailspec status --address 127.0.0.1:<coordinator.port>

The driver hosts it (``coordinator.port`` in the config; 127.0.0.1 unless ``coordinator.host`` says otherwise,
then ``coordinator.token`` is required) with ``GrpcServer([expose(CoordinatorServiceServicer, service)])``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from services.common.proto_gen.tailspec.v1 import common_pb2, coordinator_pb2
from services.coordinator.coordinator import Coordinator

_PHASES = {
    "rollout": common_pb2.STEP_PHASE_ROLLOUT,
    "reward": common_pb2.STEP_PHASE_REWARD,
    "train": common_pb2.STEP_PHASE_TRAIN,
    "weight_sync": common_pb2.STEP_PHASE_WEIGHT_SYNC,
    "done": common_pb2.STEP_PHASE_DONE,
}


def _ts(t: float | None = None) -> Timestamp:
    ts = Timestamp()
    ts.FromNanoseconds(int((time.time() if t is None else t) * 1e9))
    return ts


class CoordinatorService:
    """RPC-named methods (snake_case), request in, response out; ``run_info()`` gives the driver's view:
    {step, phase, policy_version, drafter_version, table_version, bubble_seconds, bubble_trained_seconds}."""

    def __init__(self, coordinator: Coordinator, run_info: Callable[[], dict[str, Any]]):
        self.coordinator = coordinator
        self.run_info = run_info

    def get_status(self, req: common_pb2.GetStatusRequest) -> coordinator_pb2.CoordinatorStatus:
        info = self.run_info()
        workers = []
        for wid, w in self.coordinator.snapshot().items():
            workers.append(
                coordinator_pb2.WorkerInfo(
                    worker_id=wid,
                    role=common_pb2.WORKER_ROLE_ROLLOUT,
                    state=common_pb2.WorkerState.Value(f"WORKER_STATE_{w['state']}"),
                    versions=common_pb2.Versions(
                        policy_version=int(info.get("policy_version", 0)),
                        drafter_version=int(info.get("drafter_version", 0)),
                    ),
                )
            )
        return coordinator_pb2.CoordinatorStatus(
            info=common_pb2.ServiceInfo(service="tailspec.v1.CoordinatorService", instance_id="coordinator"),
            rl_step=int(info.get("step", 0)),
            phase=_PHASES.get(info.get("phase", ""), common_pb2.STEP_PHASE_UNSPECIFIED),
            versions=common_pb2.Versions(
                policy_version=int(info.get("policy_version", 0)),
                drafter_version=int(info.get("drafter_version", 0)),
                strategy_table_version=int(info.get("table_version", 0)),
            ),
            workers=workers,
            bubble_seconds_total=float(info.get("bubble_seconds", 0.0)),
            bubble_trained_seconds_total=float(info.get("bubble_trained_seconds", 0.0)),
            now=_ts(),
        )
