"""``CoordinatorClient``: the synchronous client of ``CoordinatorService`` that the driver and the rollout
workers use (plain dicts in and out; ``services/coordinator/grpc_service.py`` says what each RPC does)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from services.common.enums import WorkerState, phase_pb, state_from_pb, state_pb
from services.common.grpc_client import channel, to_timestamp
from services.common.proto_gen.tailspec.v1 import common_pb2, coordinator_pb2, coordinator_pb2_grpc


def _grant_dict(g: common_pb2.Grant) -> dict[str, Any]:
    return {
        "grant_id": g.grant_id,
        "worker_id": g.worker_id,
        "rl_step": int(g.rl_step),
        "policy_version": int(g.policy_version),
    }


class CoordinatorClient:
    """Synchronous client of ``CoordinatorService`` (plain dicts in and out). RPC failures raise
    ``grpc.RpcError`` (UNAVAILABLE when the coordinator is gone, NOT_FOUND for an unknown worker)."""

    def __init__(self, address: str, token: str | None = None, timeout: float = 30.0):
        self.address = address
        self.timeout = timeout
        self._channel = channel(address, token)
        self._stub = coordinator_pb2_grpc.CoordinatorServiceStub(self._channel)

    def register(
        self,
        worker_id: str,
        cpus: float = 0.0,
        state: str | None = None,
        rl_step: int = 0,
        versions: Mapping[str, int] | None = None,
        address: str = "",
    ) -> dict[str, Any]:
        """Register (``state`` given: re-register with a restarted coordinator in that state)."""
        v = dict(versions or {})
        resp = self._stub.Register(
            coordinator_pb2.RegisterRequest(
                worker_id=str(worker_id),
                role=common_pb2.WORKER_ROLE_ROLLOUT,
                address=address,
                resources=common_pb2.Resources(num_cpus=float(cpus)),
                versions=common_pb2.Versions(**v),
                state=0 if state is None else state_pb(state),
                rl_step=int(rl_step),
            ),
            timeout=self.timeout,
        )
        return {
            "state": state_from_pb(resp.state),
            "heartbeat_interval_s": resp.heartbeat_interval_seconds,
            "heartbeat_timeout_s": resp.heartbeat_timeout_seconds,
            "rl_step": int(resp.rl_step),
        }

    def heartbeat(self, worker_id: str, state: str | None = None, versions: Mapping[str, int] | None = None):
        resp = self._stub.Heartbeat(
            coordinator_pb2.HeartbeatRequest(
                worker_id=str(worker_id),
                state=0 if state is None else state_pb(state),
                versions=common_pb2.Versions(**dict(versions or {})),
                sent_at=to_timestamp(),
            ),
            timeout=self.timeout,
        )
        return {
            "known": resp.known,
            "state": state_from_pb(resp.state),
            "preemption": (
                {"grant_id": resp.preemption.grant_id, "reason": resp.preemption.reason}
                if resp.HasField("preemption")
                else None
            ),
        }

    def report_state(
        self,
        worker_id: str,
        state: str,
        reason: str = "",
        rl_step: int = 0,
        grant_id: str | None = None,
        train_step: int = 0,
    ) -> dict[str, Any]:
        """-> {accepted, state, message, grant (dict or None)}."""
        resp = self._stub.ReportState(
            coordinator_pb2.ReportStateRequest(
                worker_id=str(worker_id),
                state=state_pb(state),
                reason=reason,
                rl_step=int(rl_step),
                grant_id=grant_id or "",
                train_step=int(train_step or 0),
            ),
            timeout=self.timeout,
        )
        return {
            "accepted": resp.accepted,
            "state": state_from_pb(resp.state),
            "message": resp.message,
            "grant": _grant_dict(resp.grant) if resp.HasField("grant") else None,
        }

    def request_rollout(self, worker_ids: Iterable[str], reason: str = "rollout") -> dict[str, Any]:
        """Take workers back for rollout -> {preemptions: [{worker_id, grant_id, release_by}], ready: [...]}."""
        resp = self._stub.RequestResources(
            coordinator_pb2.RequestResourcesRequest(
                requester_id="driver",
                purpose=coordinator_pb2.RESOURCE_PURPOSE_ROLLOUT,
                worker_ids=[str(w) for w in worker_ids],
                reason=reason,
            ),
            timeout=self.timeout,
        )
        return {
            "preemptions": [
                {
                    "worker_id": p.worker_id,
                    "grant_id": p.grant_id,
                    "release_by": p.release_by.ToNanoseconds() / 1e9,
                }
                for p in resp.preemptions
            ],
            "ready": list(resp.ready_worker_ids),
        }

    def request_training(self, fresh_samples: int, requester: str = "spot-trainer") -> list[dict[str, Any]]:
        """Borrow every eligible idle worker for drafter training -> grants."""
        resp = self._stub.RequestResources(
            coordinator_pb2.RequestResourcesRequest(
                requester_id=requester,
                purpose=coordinator_pb2.RESOURCE_PURPOSE_DRAFTER_TRAINING,
                fresh_samples=int(fresh_samples),
            ),
            timeout=self.timeout,
        )
        return [_grant_dict(g) for g in resp.grants]

    def report_run(self, info: Mapping[str, Any]) -> None:
        """The driver's view: {step, phase, policy_version, drafter_version, table_version, bubble_seconds,
        bubble_trained_seconds}."""
        self._stub.ReportRun(
            coordinator_pb2.ReportRunRequest(
                rl_step=int(info.get("step", 0)),
                phase=phase_pb(info.get("phase", "")),
                versions=common_pb2.Versions(
                    policy_version=int(info.get("policy_version", 0)),
                    drafter_version=int(info.get("drafter_version", 0)),
                    strategy_table_version=int(info.get("table_version", 0)),
                ),
                bubble_seconds_total=float(info.get("bubble_seconds", 0.0)),
                bubble_trained_seconds_total=float(info.get("bubble_trained_seconds", 0.0)),
            ),
            timeout=self.timeout,
        )

    def states(self) -> dict[str, WorkerState]:
        """worker id -> state (one ``GetStatus``)."""
        resp = self._stub.GetStatus(common_pb2.GetStatusRequest(), timeout=self.timeout)
        return {w.worker_id: state_from_pb(w.state) for w in resp.workers}

    def status(self, verbose: bool = False) -> coordinator_pb2.CoordinatorStatus:
        return self._stub.GetStatus(common_pb2.GetStatusRequest(verbose=verbose), timeout=self.timeout)

    def close(self) -> None:
        self._channel.close()
