"""The coordinator's gRPC face: ``CoordinatorService`` (``protos/tailspec/v1/coordinator.proto``), RPC-named
methods over the plain ``Coordinator`` (``services/coordinator/coordinator.py``), hosted with
``GrpcServer([expose(CoordinatorServiceServicer, service)])`` by the Ray actor
(``services/coordinator/service.py``); its client is ``services/coordinator/client.py``.

    tailspec status --address 127.0.0.1:<port printed by `make run`>

RPC semantics (mapped onto ``Coordinator`` events):

- ``Register``: a new worker -> STARTING. A worker the coordinator does not know that reports a state
  (re-registration after a coordinator restart) is adopted in that state (``Coordinator.adopt``).
- ``ReportState``: ROLLOUT = ``rollout_started``; IDLE from STARTING = ``ready``, from ROLLOUT =
  ``rollout_finished`` (the answer carries the ``Grant`` when the bubble is lent at once), from
  TRAINING/PREEMPTING = ``training_stopped`` (``grant_id``; a stale grant is answered accepted=false),
  IDLE when already IDLE = accepted no-op; FAILED = ``fail``; STOPPED = ``stop``. TRAINING and PREEMPTING are
  the coordinator's to give, never reported. An illegal transition is answered ``accepted=false``.
- ``RequestResources``: ROLLOUT = ``request_resources(worker_ids)`` (preemptions + the ids already free);
  DRAFTER_TRAINING = ``buffer_ready(fresh_samples)`` (grants for every eligible idle worker).
- ``Heartbeat``: liveness and the worker's own view (``Coordinator.heartbeat``); the answer says the
  coordinator's view, and a pending preemption. ``known=false`` tells the worker to register again.
- ``ReportRun``: the driver's view (step, phase, versions, bubble totals) that ``GetStatus`` reports.

Validation (nothing received is trusted; ``services/common/validation.py``): every field is checked before
any state changes and a bad one is answered ``INVALID_ARGUMENT``. Worker ids must have the id form and, when
the coordinator was given the run's ``worker_ids``, be one of them; states, roles, phases and purposes must be
values the enums define; steps and versions may not run ahead of the run. The coordinator is *anchored* to
the run when it is built with ``initial_run`` (the pipeline always does: the driver's view at start, or at a
restart) or after its first accepted ``ReportRun``; from then on ``ReportRun`` moves the step by at most one
(never back), versions never go back, and a worker's step / versions may lead the run's by at most
``STEP_SLACK`` / ``VERSION_SLACK``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from services.common.enums import WorkerState, phase_name, phase_pb, state_from_pb, state_pb
from services.common.grpc_client import to_timestamp
from services.common.proto_gen.tailspec.v1 import common_pb2, coordinator_pb2
from services.common.validation import (
    InvalidArgument,
    check_address,
    check_counter,
    check_deadline,
    check_enum,
    check_id,
    check_number,
)
from services.coordinator.coordinator import Coordinator, Grant, Preempt, WorkerReport
from services.coordinator.states import IllegalTransition

S = WorkerState
SERVICE_NAME = "tailspec.v1.CoordinatorService"

STEP_SLACK = 1  # a worker's rl_step may lead the run's by this much (its report races the driver's)
VERSION_SLACK = 2  # a worker's policy / drafter version may lead the run's by this much
TABLE_VERSION_SLACK = 100_000  # strategy-table versions move once per merged batch: a generous bound
_REPORTABLE = (
    common_pb2.WORKER_STATE_ROLLOUT,
    common_pb2.WORKER_STATE_IDLE,
    common_pb2.WORKER_STATE_FAILED,
    common_pb2.WORKER_STATE_STOPPED,
)


class CoordinatorService:
    """RPC-named methods over a ``Coordinator``.

    Args:
        coordinator: the state machine.
        run_info: optional callable giving the driver's view {step, phase, policy_version, drafter_version,
            table_version, bubble_seconds, bubble_trained_seconds}; without it ``ReportRun`` sets that view.
        heartbeat_interval_s: what ``Register`` tells workers.
        worker_ids: the run's worker ids; when given, any other id is refused (``INVALID_ARGUMENT``).
        initial_run: the driver's view to start from (as ``ReportRun`` sets it); anchors the coordinator to
            the run (see "Validation").
    """

    def __init__(
        self,
        coordinator: Coordinator,
        run_info: Callable[[], dict[str, Any]] | None = None,
        heartbeat_interval_s: float = 1.0,
        address: str = "",
        worker_ids: Iterable[str] | None = None,
        initial_run: Mapping[str, Any] | None = None,
    ):
        self.coordinator = coordinator
        self._run_info = run_info
        self._reported: dict[str, Any] = {}
        self.worker_ids = None if worker_ids is None else {str(w) for w in worker_ids}
        self._anchored = False
        if initial_run is not None:
            self._reported = _run_dict(initial_run)
            self._anchored = True
            coordinator.set_policy_version(self._reported["policy_version"])
        self.heartbeat_interval_s = heartbeat_interval_s
        self.address = address
        self._addresses: dict[str, str] = {}
        self._mono0, self._wall0 = time.monotonic(), time.time()

    def run_info(self) -> dict[str, Any]:
        return self._run_info() if self._run_info is not None else dict(self._reported)

    def _wall(self, t_mono: float) -> float:
        """Coordinator clock (monotonic) -> wall-clock seconds."""
        return self._wall0 + (t_mono - self._mono0)

    def _grant_pb(self, g: Grant, grantee: str = "spot-trainer") -> common_pb2.Grant:
        return common_pb2.Grant(
            grant_id=str(g.grant_id),
            worker_id=g.worker_id,
            grantee_id=grantee,
            resources=common_pb2.Resources(num_cpus=float(g.resources.get("cpus", 0.0))),
            granted_at=to_timestamp(self._wall(g.issued_at)),
            rl_step=self.coordinator.step,
            policy_version=int(g.policy_version),
        )

    def _preempt_pb(self, p: Preempt) -> common_pb2.Preemption:
        return common_pb2.Preemption(
            grant_id="" if p.grant_id is None else str(p.grant_id),
            worker_id=p.worker_id,
            reason=p.reason,
            release_by=to_timestamp(self._wall(p.deadline)),
        )

    # ------------------------------------------------------------------ validation
    def _worker_id(self, value: str, field: str = "worker_id") -> str:
        return check_id(value, field, allowed=self.worker_ids)

    def _step_ceiling(self) -> int | None:
        if not self._anchored:
            return None
        return max(int(self._reported.get("step", 0)), self.coordinator.step) + STEP_SLACK

    def _check_step(self, value: int, field: str) -> int:
        return check_counter(value, field, at_most=self._step_ceiling())

    def _check_versions(self, v: common_pb2.Versions, field: str) -> None:
        ceiling = None
        if self._anchored:
            r = self._reported
            ceiling = max(int(r.get("step", 0)), self.coordinator.step, self.coordinator.policy_version)
            check_counter(v.policy_version, f"{field}.policy_version", at_most=ceiling + VERSION_SLACK)
            check_counter(
                v.drafter_version,
                f"{field}.drafter_version",
                at_most=max(ceiling, int(r.get("drafter_version", 0))) + VERSION_SLACK,
            )
            check_counter(
                v.strategy_table_version,
                f"{field}.strategy_table_version",
                at_most=int(r.get("table_version", 0)) + TABLE_VERSION_SLACK,
            )
        else:
            for name in ("policy_version", "drafter_version", "strategy_table_version"):
                check_counter(getattr(v, name), f"{field}.{name}")

    @staticmethod
    def _check_resources(r: common_pb2.Resources, field: str) -> None:
        check_number(r.num_cpus, f"{field}.num_cpus", hi=1e6)
        check_number(r.num_gpus, f"{field}.num_gpus", hi=1e6)
        for k, val in r.custom.items():
            check_number(val, f"{field}.custom[{k[:40]!r}]", hi=1e12)

    # ------------------------------------------------------------------ RPCs
    def register(self, req: coordinator_pb2.RegisterRequest) -> coordinator_pb2.RegisterResponse:
        self._worker_id(req.worker_id)
        check_enum(common_pb2.WorkerRole, req.role, "role")
        check_enum(common_pb2.WorkerState, req.state, "state")
        check_address(req.address, "address")
        self._check_resources(req.resources, "resources")
        self._check_versions(req.versions, "versions")
        self._check_step(req.rl_step, "rl_step")
        c = self.coordinator
        resources = {"cpus": req.resources.num_cpus} if req.HasField("resources") else None
        own = state_from_pb(req.state)
        known = req.worker_id in c.snapshot()
        if not known and own is not None and own is not S.STARTING:
            c.adopt(
                req.worker_id,
                WorkerReport(
                    own,
                    policy_version=req.versions.policy_version,
                    drafter_version=req.versions.drafter_version,
                    step=req.rl_step,
                ),
                resources,
            )
            state = own
        else:
            state = c.register(req.worker_id, resources)
        if req.address:
            self._addresses[req.worker_id] = req.address
        return coordinator_pb2.RegisterResponse(
            worker_id=req.worker_id,
            state=state_pb(state),
            heartbeat_interval_seconds=self.heartbeat_interval_s,
            heartbeat_timeout_seconds=c.heartbeat_timeout_s,
            rl_step=c.step,
        )

    def heartbeat(self, req: coordinator_pb2.HeartbeatRequest) -> coordinator_pb2.HeartbeatResponse:
        self._worker_id(req.worker_id)
        check_enum(common_pb2.WorkerState, req.state, "state")
        self._check_versions(req.versions, "versions")
        c = self.coordinator
        if req.worker_id not in c.snapshot():
            return coordinator_pb2.HeartbeatResponse(known=False, rl_step=c.step)
        own = state_from_pb(req.state)
        report = None
        if own is not None:
            report = WorkerReport(own, req.versions.policy_version, req.versions.drafter_version, step=c.step)
        state = c.heartbeat(req.worker_id, report)
        resp = coordinator_pb2.HeartbeatResponse(known=True, state=state_pb(state), rl_step=c.step)
        for p in c.pending_preempts():
            if p.worker_id == req.worker_id:
                resp.preemption.CopyFrom(self._preempt_pb(p))
        return resp

    def report_state(self, req: coordinator_pb2.ReportStateRequest) -> coordinator_pb2.ReportStateResponse:
        self._worker_id(req.worker_id)
        check_enum(common_pb2.WorkerState, req.state, "state")
        if req.state not in _REPORTABLE:
            raise InvalidArgument(
                f"ReportStateRequest.state must be ROLLOUT, IDLE, FAILED or STOPPED, got "
                f"{common_pb2.WorkerState.Name(req.state)} (TRAINING/PREEMPTING are the coordinator's)"
            )
        self._check_step(req.rl_step, "rl_step")
        self._check_versions(req.versions, "versions")
        if req.grant_id and not req.grant_id.isdigit():
            raise InvalidArgument(f"grant_id {req.grant_id[:40]!r} is not a grant id of this coordinator")
        check_counter(req.train_step, "train_step")
        c = self.coordinator
        dst = state_from_pb(req.state)
        w = req.worker_id
        cur = c.state(w)  # KeyError (NOT_FOUND) for an unknown worker
        grant = None
        accepted, message = True, ""
        try:
            if dst is S.ROLLOUT:
                c.rollout_started(w, req.rl_step or None)
            elif dst is S.IDLE:
                if cur is S.STARTING:
                    c.ready(w)
                elif cur is S.ROLLOUT:
                    grant = c.rollout_finished(w)
                elif cur in (S.TRAINING, S.PREEMPTING):
                    gid = int(req.grant_id) if req.grant_id else None
                    accepted = c.training_stopped(w, gid, req.train_step or None)
                    if not accepted:
                        message = f"stale: grant {req.grant_id!r} is not the worker's current grant"
                elif cur is not S.IDLE:
                    raise IllegalTransition(w, cur, S.IDLE, req.reason)
            elif dst is S.FAILED:
                c.fail(w, req.reason or "reported failure")
            elif dst is S.STOPPED:
                c.stop(w)
            else:
                raise ValueError(
                    f"ReportStateRequest.state must be ROLLOUT, IDLE, FAILED or STOPPED, got "
                    f"{common_pb2.WorkerState.Name(req.state)} (TRAINING/PREEMPTING are the coordinator's)"
                )
        except IllegalTransition as e:
            accepted, message = False, str(e)
        resp = coordinator_pb2.ReportStateResponse(
            accepted=accepted, state=state_pb(c.state(w)), message=message
        )
        if grant is not None:
            resp.grant.CopyFrom(self._grant_pb(grant))
        return resp

    def request_resources(
        self, req: coordinator_pb2.RequestResourcesRequest
    ) -> coordinator_pb2.RequestResourcesResponse:
        c = self.coordinator
        check_enum(coordinator_pb2.ResourcePurpose, req.purpose, "purpose")
        check_id(req.requester_id, "requester_id", required=False)
        for w in req.worker_ids:
            self._worker_id(w, "worker_ids[]")
        check_deadline(req, "deadline", required=False)
        check_counter(req.fresh_samples, "fresh_samples")
        self._check_step(req.rl_step, "rl_step")
        self._check_resources(req.per_worker, "per_worker")
        if req.purpose == coordinator_pb2.RESOURCE_PURPOSE_ROLLOUT:
            ids = list(req.worker_ids) or [
                w for w, info in c.snapshot().items() if info["state"] not in ("FAILED", "STOPPED")
            ]
            preempts = c.request_resources(ids, req.reason or "rollout")
            ready = [w for w in ids if c.state(w) in (S.IDLE, S.STARTING)]
            return coordinator_pb2.RequestResourcesResponse(
                preemptions=[self._preempt_pb(p) for p in preempts], ready_worker_ids=ready
            )
        if req.purpose == coordinator_pb2.RESOURCE_PURPOSE_DRAFTER_TRAINING:
            grants = c.buffer_ready(int(req.fresh_samples))
            return coordinator_pb2.RequestResourcesResponse(
                grants=[self._grant_pb(g, req.requester_id or "spot-trainer") for g in grants]
            )
        raise ValueError("RequestResourcesRequest.purpose must be ROLLOUT or DRAFTER_TRAINING")

    def report_run(self, req: coordinator_pb2.ReportRunRequest) -> coordinator_pb2.ReportRunResponse:
        check_enum(common_pb2.StepPhase, req.phase, "phase")
        new = {
            "step": check_counter(req.rl_step, "rl_step"),
            "phase": phase_name(req.phase),
            "policy_version": check_counter(req.versions.policy_version, "versions.policy_version"),
            "drafter_version": check_counter(req.versions.drafter_version, "versions.drafter_version"),
            "table_version": check_counter(
                req.versions.strategy_table_version, "versions.strategy_table_version"
            ),
            "bubble_seconds": check_number(req.bubble_seconds_total, "bubble_seconds_total", hi=1e12),
            "bubble_trained_seconds": check_number(
                req.bubble_trained_seconds_total, "bubble_trained_seconds_total", hi=1e12
            ),
        }
        if new["policy_version"] > new["step"]:
            raise InvalidArgument(
                f"versions.policy_version {new['policy_version']} is ahead of rl_step {new['step']}"
            )
        if self._anchored:
            old = self._reported
            lo = old["step"] - (1 if req.phase == common_pb2.STEP_PHASE_DONE else 0)
            if not lo <= new["step"] <= old["step"] + 1:
                raise InvalidArgument(
                    f"rl_step {new['step']}: the run is at step {old['step']} (a report moves it by at most one)"
                )
            slacks = {
                "policy_version": 1,
                "drafter_version": VERSION_SLACK,
                "table_version": TABLE_VERSION_SLACK,
            }
            for key, slack in slacks.items():
                bound = old[key] + slack
                if not old[key] <= new[key] <= bound:
                    raise InvalidArgument(
                        f"{key} {new[key]}: the run is at {old[key]} (never back, at most {bound})"
                    )
        self._reported = new
        self._anchored = True
        self.coordinator.set_policy_version(new["policy_version"])
        return coordinator_pb2.ReportRunResponse()

    def get_status(self, req: common_pb2.GetStatusRequest) -> coordinator_pb2.CoordinatorStatus:
        info = self.run_info()
        workers = []
        for wid, w in self.coordinator.snapshot().items():
            workers.append(
                coordinator_pb2.WorkerInfo(
                    worker_id=wid,
                    role=common_pb2.WORKER_ROLE_ROLLOUT,
                    state=state_pb(w["state"]),
                    address=self._addresses.get(wid, ""),
                    resources=common_pb2.Resources(num_cpus=float(w["resources"].get("cpus", 0.0))),
                    versions=common_pb2.Versions(
                        policy_version=int(w["policy_version"] or info.get("policy_version", 0)),
                        drafter_version=int(w["drafter_version"] or info.get("drafter_version", 0)),
                    ),
                    last_heartbeat=to_timestamp(self._wall(w["last_heartbeat"])),
                    state_since=to_timestamp(self._wall(w["since"])),
                    grant_id="" if w["grant_id"] is None else str(w["grant_id"]),
                )
            )
        transitions = []
        if req.verbose:
            for t in list(self.coordinator.transitions)[-50:]:
                transitions.append(
                    common_pb2.StateTransition(
                        worker_id=t.worker_id,
                        from_state=0 if t.src is None else state_pb(t.src),
                        to_state=state_pb(t.dst),
                        reason=t.reason,
                        at=to_timestamp(self._wall(t.t)),
                    )
                )
        return coordinator_pb2.CoordinatorStatus(
            info=common_pb2.ServiceInfo(
                service=SERVICE_NAME, instance_id="coordinator", address=self.address
            ),
            rl_step=int(info.get("step", self.coordinator.step)),
            phase=phase_pb(info.get("phase", "")),
            versions=common_pb2.Versions(
                policy_version=int(info.get("policy_version", 0)),
                drafter_version=int(info.get("drafter_version", 0)),
                strategy_table_version=int(info.get("table_version", 0)),
            ),
            workers=workers,
            bubble_seconds_total=float(info.get("bubble_seconds", 0.0)),
            bubble_trained_seconds_total=float(info.get("bubble_trained_seconds", 0.0)),
            recent_transitions=transitions,
            now=to_timestamp(),
        )


def _run_dict(info: Mapping[str, Any]) -> dict[str, Any]:
    """The driver's view (``run_info`` keys) with every key present."""
    return {
        "step": int(info.get("step", 0)),
        "phase": str(info.get("phase", "")),
        "policy_version": int(info.get("policy_version", 0)),
        "drafter_version": int(info.get("drafter_version", 0)),
        "table_version": int(info.get("table_version", 0)),
        "bubble_seconds": float(info.get("bubble_seconds", 0.0)),
        "bubble_trained_seconds": float(info.get("bubble_trained_seconds", 0.0)),
    }
