"""The spot trainer's gRPC face (``protos/tailspec/v1/spot_trainer.proto``): ``SpotTrainerGrpc`` adapts a
``SpotTrainerService`` replica (Grant, Preempt, GetStatus), ``SpotTrainerClient`` calls one from the driver.

    addr = replica.serve(token=token)            # in the replica's process (a Ray actor): "127.0.0.1:<port>"
    with SpotTrainerClient(addr, token) as c:
        c.grant({"grant_id": "g1", "worker_id": "3", "deadline": time.time() + 60, "rl_step": 7,
                 "policy_version": 7})
        out = c.preempt("g1", release_by=time.time() + 2.0)

The client's dicts have the same keys as the Python API of ``SpotTrainerService`` (``grant``, ``preempt``,
``status``), with these wire effects: absolute times are ``google.protobuf.Timestamp`` (nanosecond resolution;
None = unset), ``top1`` / ``loss`` of a preempt are None when the grant did no step, a status's
``last_loss`` / ``last_accuracy`` are 0.0 before the first step. Only control messages go over gRPC:
draft-head weights (``head_state``, ``load_head``, ``publish``) stay Python / Ray calls.

Preempt over the wire: ``Preemption.grant_id`` empty = whatever the replica holds; ``release_by`` bounds the
wait for the in-flight step (``timeout = release_by - now``, at least 0; unset = wait until released);
``urgent`` cannot drop a step in flight (a step is never interrupted), so it is treated as a normal preempt.

Validation: a ``Grant`` over the wire must carry ids of the id form and a deadline in the future (at most a
day ahead; the Python API still takes ``deadline=None``), and may not claim a policy version newer than the
replica's + 1; a bad one is ``INVALID_ARGUMENT`` and changes nothing.
"""

from __future__ import annotations

import importlib.metadata
import time
from collections.abc import Mapping
from typing import Any

from services.common.grpc_client import channel, from_timestamp, to_timestamp
from services.common.proto_gen.tailspec.v1 import common_pb2, spot_trainer_pb2, spot_trainer_pb2_grpc
from services.common.validation import (
    MAX_DEADLINE_AHEAD_S,
    InvalidArgument,
    check_counter,
    check_deadline,
    check_id,
)

try:
    _VERSION = importlib.metadata.version("tailspec")
except importlib.metadata.PackageNotFoundError:  # running from a source tree that is not installed
    _VERSION = ""


# ---------------------------------------------------------------------- timestamps
def _set_ts(msg: Any, name: str, t: float | None) -> None:
    if t is not None:
        getattr(msg, name).CopyFrom(to_timestamp(t))


# ---------------------------------------------------------------------- dict <-> message
def grant_to_proto(grant: Mapping[str, Any]) -> common_pb2.Grant:
    """A grant dict (``grant_id``, ``worker_id``, ``deadline``, ``rl_step``, ``policy_version``; optional
    ``granted_at``) -> ``Grant``."""
    msg = common_pb2.Grant(
        grant_id=str(grant.get("grant_id") or ""),
        worker_id=str(grant.get("worker_id") or ""),
        rl_step=int(grant.get("rl_step") or 0),
        policy_version=int(grant.get("policy_version") or 0),
    )
    _set_ts(msg, "deadline", grant.get("deadline"))
    _set_ts(msg, "granted_at", grant.get("granted_at"))
    return msg


def grant_from_proto(msg: common_pb2.Grant) -> dict[str, Any]:
    """``Grant`` -> ``{"grant_id", "worker_id", "deadline", "rl_step", "policy_version", "granted_at"}``."""
    return dict(
        grant_id=msg.grant_id,
        worker_id=msg.worker_id,
        deadline=from_timestamp(msg, "deadline"),
        rl_step=int(msg.rl_step),
        policy_version=int(msg.policy_version),
        granted_at=from_timestamp(msg, "granted_at"),
    )


def grant_response_to_proto(out: Mapping[str, Any]) -> spot_trainer_pb2.GrantResponse:
    return spot_trainer_pb2.GrantResponse(
        accepted=bool(out["accepted"]),
        message=str(out.get("message", "")),
        buffered_samples=int(out.get("buffered_samples", 0)),
        drafter_version=int(out.get("drafter_version", 0)),
    )


def grant_response_from_proto(msg: spot_trainer_pb2.GrantResponse) -> dict[str, Any]:
    """-> ``{"accepted", "message", "buffered_samples", "drafter_version"}`` (as ``SpotTrainerService.grant``)."""
    return dict(
        accepted=msg.accepted,
        message=msg.message,
        buffered_samples=int(msg.buffered_samples),
        drafter_version=int(msg.drafter_version),
    )


def preempt_response_to_proto(out: Mapping[str, Any]) -> spot_trainer_pb2.PreemptResponse:
    msg = spot_trainer_pb2.PreemptResponse(
        released=bool(out["released"]),
        release_seconds=float(out.get("release_seconds", 0.0)),
        steps_in_grant=int(out.get("steps_in_grant", 0)),
        trained_seconds=float(out.get("trained_seconds", 0.0)),
        drafter_version=int(out.get("drafter_version", 0)),
        checkpoint_pending=bool(out.get("checkpoint_pending", False)),
        message=str(out.get("message", "")),
        grant_id=str(out.get("grant_id", "")),
        worker_id=str(out.get("worker", "")),
        train_steps=int(out.get("step", 0)),
        stop_reason=str(out.get("stop_reason", "")),
    )
    _set_ts(msg, "started_at", out.get("started_at"))
    _set_ts(msg, "finished_at", out.get("finished_at"))
    if out.get("loss") is not None:
        msg.last_loss = float(out["loss"])
    if out.get("top1") is not None:
        msg.last_accuracy = float(out["top1"])
    return msg


def preempt_response_from_proto(msg: spot_trainer_pb2.PreemptResponse) -> dict[str, Any]:
    """-> the dict of ``SpotTrainerService.preempt``: ``{"released", "release_seconds", "steps_in_grant",
    "trained_seconds", "drafter_version", "checkpoint_pending", "worker", "grant_id", "started_at",
    "finished_at", "step", "top1", "loss", "stop_reason", "message"}``."""
    return dict(
        released=msg.released,
        release_seconds=msg.release_seconds,
        steps_in_grant=int(msg.steps_in_grant),
        trained_seconds=msg.trained_seconds,
        drafter_version=int(msg.drafter_version),
        checkpoint_pending=msg.checkpoint_pending,
        worker=msg.worker_id,
        grant_id=msg.grant_id,
        started_at=from_timestamp(msg, "started_at"),
        finished_at=from_timestamp(msg, "finished_at"),
        step=int(msg.train_steps),
        top1=msg.last_accuracy if msg.HasField("last_accuracy") else None,
        loss=msg.last_loss if msg.HasField("last_loss") else None,
        stop_reason=msg.stop_reason,
        message=msg.message,
    )


def status_to_proto(st: Mapping[str, Any]) -> spot_trainer_pb2.SpotTrainerStatus:
    info = common_pb2.ServiceInfo(
        service=str(st["service"]),
        instance_id=str(st["instance_id"]),
        address=str(st.get("grpc_address", "")),
        version=_VERSION,
        uptime_seconds=float(st.get("uptime_seconds", 0.0)),
        message=str(st.get("message", "")),
    )
    _set_ts(info, "started_at", st.get("started_at"))
    return spot_trainer_pb2.SpotTrainerStatus(
        info=info,
        active_grants=[grant_to_proto(g) for g in st.get("active_grants", [])],
        drafter=common_pb2.DrafterVersion(version=int(st.get("drafter_version", 0))),
        train_steps=int(st.get("train_steps", 0)),
        buffered_samples=int(st.get("buffered_samples", 0)),
        buffer_capacity=int(st.get("buffer_capacity", 0)),
        samples_dropped_stale=int(st.get("samples_dropped_stale", 0)),
        trained_seconds_total=float(st.get("trained_seconds_total", 0.0)),
        last_loss=float(st.get("last_loss") or 0.0),
        last_accuracy=float(st.get("last_accuracy") or 0.0),
        replica=int(st.get("replica", 0)),
        leader=bool(st.get("leader", False)),
        stream_address=str(st.get("stream_address", "")),
        steps_since_sync=int(st.get("steps_since_sync", 0)),
        training=bool(st.get("training", False)),
    )


def status_from_proto(msg: spot_trainer_pb2.SpotTrainerStatus) -> dict[str, Any]:
    """-> the dict of ``SpotTrainerService.status`` (same keys)."""
    return dict(
        service=msg.info.service,
        instance_id=msg.info.instance_id,
        grpc_address=msg.info.address,
        started_at=from_timestamp(msg.info, "started_at"),
        uptime_seconds=msg.info.uptime_seconds,
        message=msg.info.message,
        replica=int(msg.replica),
        leader=msg.leader,
        stream_address=msg.stream_address,
        active_grants=[grant_from_proto(g) for g in msg.active_grants],
        training=msg.training,
        drafter_version=int(msg.drafter.version),
        train_steps=int(msg.train_steps),
        steps_since_sync=int(msg.steps_since_sync),
        buffered_samples=int(msg.buffered_samples),
        buffer_capacity=int(msg.buffer_capacity),
        samples_dropped_stale=int(msg.samples_dropped_stale),
        trained_seconds_total=msg.trained_seconds_total,
        last_loss=msg.last_loss,
        last_accuracy=msg.last_accuracy,
    )


# ---------------------------------------------------------------------- server side
class SpotTrainerGrpc:
    """RPC-named methods (snake_case) over one replica, for ``expose(SpotTrainerServiceServicer, ...)``:
    request message in, response message out. ``SpotTrainerService.serve()`` wires it up.

    ``service`` is any object with ``SpotTrainerService``'s ``grant``, ``preempt`` and ``status`` (and,
    optionally, ``policy_version``); this module does not import the replica (no import cycle)."""

    def __init__(self, service: Any):
        self.service = service

    def grant(self, req: spot_trainer_pb2.GrantRequest) -> spot_trainer_pb2.GrantResponse:
        g = req.grant
        check_id(g.grant_id, "grant.grant_id")
        check_id(g.worker_id, "grant.worker_id")
        check_id(g.grantee_id, "grant.grantee_id", required=False)
        check_deadline(g, "deadline")  # a bubble is deadline-bounded: no open-ended grant over the wire
        policy = int(getattr(self.service, "policy_version", 0))
        check_counter(g.policy_version, "grant.policy_version", at_most=policy + 1)
        check_counter(g.rl_step, "grant.rl_step")
        return grant_response_to_proto(self.service.grant(grant_from_proto(g)))

    def preempt(self, req: spot_trainer_pb2.PreemptRequest) -> spot_trainer_pb2.PreemptResponse:
        p = req.preemption
        check_id(p.grant_id, "preemption.grant_id", required=False)
        check_id(p.worker_id, "preemption.worker_id", required=False)
        if p.HasField("release_by"):
            t = p.release_by.ToNanoseconds() / 1e9
            if t > time.time() + MAX_DEADLINE_AHEAD_S:
                raise InvalidArgument("preemption.release_by lies more than a day ahead")
        release_by = from_timestamp(p, "release_by")
        timeout = None if release_by is None else max(0.0, release_by - time.time())
        return preempt_response_to_proto(self.service.preempt(p.grant_id or None, timeout=timeout))

    def get_status(self, req: common_pb2.GetStatusRequest) -> spot_trainer_pb2.SpotTrainerStatus:
        return status_to_proto(self.service.status())


# ---------------------------------------------------------------------- client side
class SpotTrainerClient:
    """Synchronous client of one replica's ``SpotTrainerService``; the dicts are those of the Python API.

    Args:
        address: ``host:port`` (what ``SpotTrainerService.serve`` returned).
        token: bearer token when the server requires one.
        timeout: default RPC deadline, seconds.
    Every method raises ``grpc.RpcError`` when the call fails (UNAVAILABLE, UNAUTHENTICATED,
    DEADLINE_EXCEEDED, INVALID_ARGUMENT for a grant without ids, ...).
    """

    def __init__(self, address: str, token: str | None = None, timeout: float = 10.0):
        self.address = address
        self.timeout = float(timeout)
        self._channel = channel(address, token)
        self._stub = spot_trainer_pb2_grpc.SpotTrainerServiceStub(self._channel)

    def grant(self, grant: Mapping[str, Any]) -> dict[str, Any]:
        """See ``SpotTrainerService.grant``: returns ``{"accepted", "message", "buffered_samples",
        "drafter_version"}``."""
        req = spot_trainer_pb2.GrantRequest(grant=grant_to_proto(grant))
        return grant_response_from_proto(self._stub.Grant(req, timeout=self.timeout))

    def preempt(
        self,
        grant_id: str | None = None,
        release_by: float | None = None,
        timeout: float | None = None,
        *,
        worker_id: str = "",
        reason: str = "",
        urgent: bool = False,
    ) -> dict[str, Any]:
        """See ``SpotTrainerService.preempt``.

        Args:
            grant_id: the grant to release; None = whatever the replica holds.
            release_by: ``time.time()`` seconds by which the replica should have released (it waits that long
                for the in-flight step, then answers ``released=False``); None = wait until released.
            timeout: RPC deadline in seconds; default ``self.timeout`` plus the time left to ``release_by``.
        """
        p = common_pb2.Preemption(grant_id=grant_id or "", worker_id=worker_id, reason=reason, urgent=urgent)
        _set_ts(p, "release_by", release_by)
        if timeout is None:
            timeout = self.timeout + (max(0.0, release_by - time.time()) if release_by is not None else 0.0)
        resp = self._stub.Preempt(spot_trainer_pb2.PreemptRequest(preemption=p), timeout=timeout)
        return preempt_response_from_proto(resp)

    def status(self) -> dict[str, Any]:
        """See ``SpotTrainerService.status``."""
        return status_from_proto(self._stub.GetStatus(common_pb2.GetStatusRequest(), timeout=self.timeout))

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> SpotTrainerClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
