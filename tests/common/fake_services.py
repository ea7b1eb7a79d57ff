"""Test doubles: a plain-Python fake coordinator (exposed with ``expose``) and a hand-written async servicer.

They also serve as the usage example for services: the core class stays plain Python; the gRPC side is
``expose(<Generated>Servicer, core)`` (or a small ``async def`` servicer subclass), hosted by ``GrpcServer``.
"""

from __future__ import annotations

import time

from google.protobuf.timestamp_pb2 import Timestamp

from services.common.proto_gen.tailspec.v1 import (
    common_pb2,
    coordinator_pb2,
    rollout_pb2,
    rollout_pb2_grpc,
)


def _now() -> Timestamp:
    ts = Timestamp()
    ts.FromNanoseconds(time.time_ns())
    return ts


class FakeCoordinator:
    """A plain object: methods named like the RPCs (snake_case), request in, response out."""

    def __init__(self):
        self.rl_step = 4
        self.workers: dict[str, coordinator_pb2.WorkerInfo] = {}
        for wid, state, pv, dv in (
            ("rollout-0", common_pb2.WORKER_STATE_ROLLOUT, 3, 2),
            ("rollout-1", common_pb2.WORKER_STATE_TRAINING, 3, 2),
            ("rollout-2", common_pb2.WORKER_STATE_IDLE, 3, 1),
        ):
            self.workers[wid] = coordinator_pb2.WorkerInfo(
                worker_id=wid,
                role=common_pb2.WORKER_ROLE_ROLLOUT,
                state=state,
                versions=common_pb2.Versions(policy_version=pv, drafter_version=dv),
                active_batch_size=5,
                last_heartbeat=_now(),
                address="127.0.0.1:0",
            )

    def register(self, req: coordinator_pb2.RegisterRequest) -> coordinator_pb2.RegisterResponse:
        if not req.worker_id:
            raise ValueError("worker_id is required")
        self.workers[req.worker_id] = coordinator_pb2.WorkerInfo(
            worker_id=req.worker_id, role=req.role, state=common_pb2.WORKER_STATE_STARTING
        )
        return coordinator_pb2.RegisterResponse(
            worker_id=req.worker_id, state=common_pb2.WORKER_STATE_STARTING, heartbeat_interval_seconds=1.0
        )

    def report_state(self, req: coordinator_pb2.ReportStateRequest) -> dict:
        if req.worker_id not in self.workers:
            raise KeyError(f"unknown worker {req.worker_id!r}")
        self.workers[req.worker_id].state = req.state
        # a dict in the response's JSON shape works too
        return {"accepted": True, "state": common_pb2.WorkerState.Name(req.state)}

    def get_status(self, req: common_pb2.GetStatusRequest) -> coordinator_pb2.CoordinatorStatus:
        return coordinator_pb2.CoordinatorStatus(
            info=common_pb2.ServiceInfo(service="tailspec.v1.CoordinatorService", instance_id="coordinator"),
            rl_step=self.rl_step,
            phase=common_pb2.STEP_PHASE_ROLLOUT,
            versions=common_pb2.Versions(policy_version=3, drafter_version=2, strategy_table_version=7),
            workers=list(self.workers.values()),
            bubble_seconds_total=12.5,
            bubble_trained_seconds_total=10.0,
            now=_now(),
        )


class FakeRollout(rollout_pb2_grpc.RolloutServiceServicer):
    """A hand-written async servicer (the other way to serve)."""

    def __init__(self):
        self.table_version = 0

    async def GetStatus(self, request, context):
        return rollout_pb2.RolloutStatus(
            state=common_pb2.WORKER_STATE_IDLE,
            versions=common_pb2.Versions(strategy_table_version=self.table_version),
        )

    async def SetStrategyTable(self, request, context):
        if request.table.version <= self.table_version:
            return rollout_pb2.SetStrategyTableResponse(accepted=False, active_version=self.table_version)
        self.table_version = request.table.version
        return rollout_pb2.SetStrategyTableResponse(accepted=True, active_version=self.table_version)
