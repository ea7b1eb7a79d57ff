"""The rollout actor's gRPC face (``protos/tailspec/v1/rollout.proto``) and its client.

Control only: the driver pushes the tuner's merged strategy table (``SetStrategyTable``, checked field by
field) and newly published drafter versions (``LoadDrafter``: the version, optionally the folder the spot
trainer published it to; the weights are read from the run's own published-drafter folder only, as JSON +
safetensors, never unpickled, and never sent over gRPC; ``RolloutWorker.published_drafter``) and asks for
status. Every call carries the run's token. Both are applied at once when the actor is
between rollout phases, otherwise at the start of its next rollout (``deferred=true``): never in the middle of
a request. Policy weights stay on the Ray object store (``RolloutWorker.load_weights``); ``LoadPolicy`` is
not served (UNIMPLEMENTED).

    address = worker.serve(token=token)            # in the actor's process
    client = RolloutClient(address, token)
    client.set_table(table)                        # BucketedBandit.table() dict
    client.load_drafter(version, "/run/checkpoints/spot_trainer/published/v000000003")
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.common.enums import drafter_name, state_from_pb, state_pb
from services.common.grpc_client import channel
from services.common.proto_gen.tailspec.v1 import common_pb2, rollout_pb2, rollout_pb2_grpc
from services.common.strategy_table import check_table_pb, table_from_pb, table_to_pb
from services.common.validation import InvalidArgument

SERVICE_NAME = "tailspec.v1.RolloutService"


class RolloutGrpc:
    """RPC-named methods over a ``RolloutWorker`` (its ``apply_table``, ``apply_drafter``, ``status``)."""

    def __init__(self, worker: Any, address: str = ""):
        self.worker = worker
        self.address = address

    def set_strategy_table(
        self, req: rollout_pb2.SetStrategyTableRequest
    ) -> rollout_pb2.SetStrategyTableResponse:
        check_table_pb(req.table, "table")
        have = getattr(self.worker, "drafters", None)
        if have is not None:
            for a in req.table.arms:
                name = drafter_name(a.drafter)
                if name != "off" and name not in have:
                    raise InvalidArgument(
                        f"table.arms: arm {a.name!r} needs drafter {name!r}, not on this actor"
                    )
        accepted, deferred, active = self.worker.apply_table(table_from_pb(req.table))
        msg = "" if accepted else "not newer than the active table (or no tuner on this actor)"
        return rollout_pb2.SetStrategyTableResponse(
            accepted=accepted,
            active_version=active,
            message=("deferred to the next phase" if deferred else msg),
        )

    def load_drafter(self, req: rollout_pb2.LoadDrafterRequest) -> rollout_pb2.LoadDrafterResponse:
        d = req.drafter
        accepted, deferred, active = self.worker.apply_drafter(int(d.version), d.checkpoint_path or None)
        return rollout_pb2.LoadDrafterResponse(
            accepted=accepted,
            deferred=deferred,
            active_version=active,
            message="" if accepted else "not newer than the active drafter",
        )

    def get_status(self, req: common_pb2.GetStatusRequest) -> rollout_pb2.RolloutStatus:
        st = self.worker.status()
        return rollout_pb2.RolloutStatus(
            info=common_pb2.ServiceInfo(
                service=SERVICE_NAME, instance_id=str(st["worker_id"]), address=self.address
            ),
            state=state_pb(st["state"]),
            versions=common_pb2.Versions(
                policy_version=st["policy_version"],
                drafter_version=st["drafter_version"],
                strategy_table_version=st["table_version"],
            ),
            rl_step=st["rl_step"],
            max_batch_size=st["max_batch_size"],
            finished_requests=st["finished_requests"],
            generated_tokens=st["generated_tokens"],
            drafted_tokens=st["drafted_tokens"],
            accepted_tokens=st["accepted_tokens"],
        )


class RolloutClient:
    """Synchronous client of one rollout actor's ``RolloutService``. RPC failures raise ``grpc.RpcError``."""

    def __init__(self, address: str, token: str | None = None, timeout: float = 60.0):
        self.address = address
        self.timeout = timeout
        self._channel = channel(address, token)
        self._stub = rollout_pb2_grpc.RolloutServiceStub(self._channel)

    def set_table(self, table: Mapping[str, Any]) -> dict[str, Any]:
        resp = self._stub.SetStrategyTable(
            rollout_pb2.SetStrategyTableRequest(table=table_to_pb(table)), timeout=self.timeout
        )
        return {"accepted": resp.accepted, "active_version": resp.active_version, "message": resp.message}

    def load_drafter(self, version: int, checkpoint_path: str) -> dict[str, Any]:
        resp = self._stub.LoadDrafter(
            rollout_pb2.LoadDrafterRequest(
                drafter=common_pb2.DrafterVersion(version=int(version), checkpoint_path=str(checkpoint_path))
            ),
            timeout=self.timeout,
        )
        return {"accepted": resp.accepted, "deferred": resp.deferred, "active_version": resp.active_version}

    def status(self) -> dict[str, Any]:
        r = self._stub.GetStatus(common_pb2.GetStatusRequest(), timeout=self.timeout)
        return {
            "worker_id": r.info.instance_id,
            "state": state_from_pb(r.state),
            "policy_version": r.versions.policy_version,
            "drafter_version": r.versions.drafter_version,
            "table_version": r.versions.strategy_table_version,
            "rl_step": r.rl_step,
            "finished_requests": r.finished_requests,
            "generated_tokens": r.generated_tokens,
            "drafted_tokens": r.drafted_tokens,
            "accepted_tokens": r.accepted_tokens,
        }

    def close(self) -> None:
        self._channel.close()
