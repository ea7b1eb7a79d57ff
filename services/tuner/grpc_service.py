"""The tuner's gRPC face (``protos/tailspec/v1/tuner.proto``) and its client.

Rollout actors report their decode-step observations in batches (one ``ReportObservations`` per finished
rollout share, never per step); the driver fetches the merged table (``GetStrategyTable``) at the phase
boundary and pushes it to every rollout actor (``RolloutService.SetStrategyTable``), which copies it
in-process. ``GetStatus(verbose=True)`` carries per-bucket, per-arm statistics (the ``tuner`` row of
``metrics.jsonl`` and ``plots/tuner_arms.png``).

    svc = TunerService(...); address = svc.serve(token=token) # 127.0.0.1:<free port>
    client = TunerClient(address, token)
    client.report("0", observations)                          # dicts from StrategySelector.drain_observations()
    table = client.table()                                    # dict, as BucketedBandit.table()

The dict shapes on both sides are those of ``services/tuner/bandit.py`` (``table()``, ``stats()``) and
``StrategySelector.drain_observations()``; the functions below convert the observations and statistics to
and from the messages, and ``services/common/strategy_table.py`` the table (shared with the rollout actor's
gRPC face).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from services.common.grpc_client import channel
from services.common.proto_gen.tailspec.v1 import common_pb2, tuner_pb2, tuner_pb2_grpc
from services.common.strategy_table import table_from_pb, table_to_pb
from services.common.validation import InvalidArgument, check_counter, check_id, check_number

SERVICE_NAME = "tailspec.v1.TunerService"


# ---------------------------------------------------------------------------------------------- conversions
def check_observation_pb(ob: tuner_pb2.Observation, field: str) -> None:
    """Refuse (``InvalidArgument``) an observation with numbers no decode step produces."""
    check_counter(ob.batch_size, f"{field}.batch_size", at_least=1, at_most=1 << 20)
    check_id(ob.arm, f"{field}.arm")
    check_counter(ob.committed_tokens, f"{field}.committed_tokens", at_most=1 << 40)
    # 0 s: a count-only record (steps played under a lease, or a CUDA-graph capture step: counted, not timed)
    check_number(ob.seconds, f"{field}.seconds", hi=1e6)
    check_counter(ob.steps, f"{field}.steps", at_most=1 << 30)
    check_counter(ob.drafted_tokens, f"{field}.drafted_tokens", at_most=1 << 40)
    check_counter(ob.accepted_tokens, f"{field}.accepted_tokens", at_most=1 << 40)


MAX_OBSERVATIONS = 1_000_000  # per ReportObservations call


def observation_to_pb(ob: Mapping[str, Any]) -> tuner_pb2.Observation:
    """One ``StrategySelector`` observation dict -> ``Observation`` (committed tokens are whole tokens)."""
    return tuner_pb2.Observation(
        batch_size=int(ob["batch_size"]),
        arm=str(ob["arm"]),
        committed_tokens=int(round(float(ob["committed_tokens"]))),
        seconds=float(ob["seconds"]),
        explored=bool(ob.get("explored", False)),
        steps=int(ob.get("steps") or 1),
    )


def observation_from_pb(pb: tuner_pb2.Observation) -> dict[str, Any]:
    return {
        "batch_size": int(pb.batch_size),
        "arm": pb.arm,
        "committed_tokens": float(pb.committed_tokens),
        "seconds": float(pb.seconds),
        "explored": bool(pb.explored),
        "steps": max(1, int(pb.steps)),
    }


def _stats_to_pb(stats: Mapping[str, Any], verbose: bool) -> list[tuner_pb2.BucketStats]:
    if not verbose:
        return []
    out = []
    for b in stats["buckets"]:
        msg = tuner_pb2.BucketStats(
            bucket=int(b["bucket"]),
            lo=int(b["lo"]),
            observations=int(b["observations"]),
            best=b["best"],
            chosen=int(b["chosen"]),
            explored=int(b["explored"]),
            exploration_fraction=float(b["exploration_fraction"]),
        )
        if b.get("hi") is not None:
            msg.hi = int(b["hi"])
        for name, a in b["arms"].items():
            arm = tuner_pb2.ArmStats(
                arm=name,
                window=int(a["n"]),
                total=int(a["total"]),
                chosen=int(a["total"]),
                explored=int(a["explored"]),
                guarded=bool(a["guarded"]),
                strikes=int(a["strikes"]),
            )
            if a.get("median") is not None:
                arm.median = float(a["median"])
            if a.get("ratio") is not None:
                arm.ratio = float(a["ratio"])
            msg.arms.append(arm)
        out.append(msg)
    return out


def _stats_from_pb(pb: tuner_pb2.TunerStatus) -> dict[str, Any]:
    """``TunerStatus`` -> the ``BucketedBandit.stats()`` dict shape (plus ``table_version``)."""
    buckets = [
        {
            "bucket": int(b.bucket),
            "lo": int(b.lo),
            "hi": int(b.hi) if b.HasField("hi") else None,
            "observations": int(b.observations),
            "best": b.best,
            "chosen": int(b.chosen),
            "explored": int(b.explored),
            "exploration_fraction": float(b.exploration_fraction),
            "arms": {
                a.arm: {
                    "n": int(a.window),
                    "total": int(a.total),
                    "median": a.median if a.HasField("median") else None,
                    "ratio": a.ratio if a.HasField("ratio") else None,
                    "explored": int(a.explored),
                    "guarded": bool(a.guarded),
                    "strikes": int(a.strikes),
                }
                for a in b.arms
            },
        }
        for b in pb.buckets
    ]
    return {
        "buckets": buckets,
        "exploration_fraction": float(pb.exploration_fraction),
        "dropped": int(pb.dropped_total),
        "observations_total": int(pb.observations_total),
        "table_version": int(pb.table.version),
    }


# ---------------------------------------------------------------------------------------------- server side
class TunerGrpc:
    """RPC-named methods over a ``TunerService`` (hosted with ``expose(TunerServiceServicer, ...)``)."""

    def __init__(self, service: Any, address: str = ""):
        self.service = service
        self.address = address

    def report_observations(
        self, req: tuner_pb2.ReportObservationsRequest
    ) -> tuner_pb2.ReportObservationsResponse:
        check_id(req.worker_id, "worker_id")
        current = int(self.service.table()["version"])
        check_counter(req.strategy_table_version, "strategy_table_version", at_most=current)
        if len(req.observations) > MAX_OBSERVATIONS:
            raise InvalidArgument(
                f"{len(req.observations)} observations in one call (at most {MAX_OBSERVATIONS})"
            )
        for i, o in enumerate(req.observations):
            check_observation_pb(o, f"observations[{i}]")
        obs = [observation_from_pb(o) for o in req.observations]
        before = self.service.bandit.dropped
        table = self.service.merge(obs)
        dropped = self.service.bandit.dropped - before
        return tuner_pb2.ReportObservationsResponse(
            used=len(obs) - dropped, dropped=dropped, latest_table_version=int(table["version"])
        )

    def get_strategy_table(
        self, req: tuner_pb2.GetStrategyTableRequest
    ) -> tuner_pb2.GetStrategyTableResponse:
        check_id(req.worker_id, "worker_id", required=False)
        check_counter(req.known_version, "known_version")
        table = self.service.table()
        if req.known_version and int(table["version"]) <= req.known_version:
            return tuner_pb2.GetStrategyTableResponse(unchanged=True)
        return tuner_pb2.GetStrategyTableResponse(table=table_to_pb(table))

    def get_status(self, req: common_pb2.GetStatusRequest) -> tuner_pb2.TunerStatus:
        stats = self.service.stats()
        return tuner_pb2.TunerStatus(
            info=common_pb2.ServiceInfo(service=SERVICE_NAME, instance_id="tuner", address=self.address),
            table=table_to_pb(self.service.table()),
            observations_total=int(self.service.merged),
            dropped_total=int(stats.get("dropped", 0)),
            exploration_fraction=float(stats.get("exploration_fraction", 0.0)),
            buckets=_stats_to_pb(stats, req.verbose),
        )


# ---------------------------------------------------------------------------------------------- client
class TunerClient:
    """Synchronous client of ``TunerService``; returns the dict shapes of ``services/tuner/bandit.py``.
    RPC failures raise ``grpc.RpcError`` (e.g. UNAVAILABLE when the tuner is gone)."""

    def __init__(self, address: str, token: str | None = None, timeout: float = 30.0):
        self.address = address
        self.timeout = timeout
        self._channel = channel(address, token)
        self._stub = tuner_pb2_grpc.TunerServiceStub(self._channel)

    def report(
        self, worker_id: str, observations: Iterable[Mapping[str, Any]], table_version: int = 0
    ) -> dict:
        """One batch of observations -> {used, dropped, latest_table_version}."""
        resp = self._stub.ReportObservations(
            tuner_pb2.ReportObservationsRequest(
                worker_id=str(worker_id),
                strategy_table_version=int(table_version),
                observations=[observation_to_pb(o) for o in observations],
            ),
            timeout=self.timeout,
        )
        return {"used": resp.used, "dropped": resp.dropped, "latest_table_version": resp.latest_table_version}

    def table(self, known_version: int = 0, worker_id: str = "") -> dict | None:
        """The current table, or None when it is not newer than ``known_version``."""
        resp = self._stub.GetStrategyTable(
            tuner_pb2.GetStrategyTableRequest(worker_id=worker_id, known_version=int(known_version)),
            timeout=self.timeout,
        )
        return None if resp.unchanged else table_from_pb(resp.table)

    def status(self) -> dict:
        """Per-bucket, per-arm statistics (``BucketedBandit.stats()`` shape) plus totals."""
        return _stats_from_pb(
            self._stub.GetStatus(common_pb2.GetStatusRequest(verbose=True), timeout=self.timeout)
        )

    def close(self) -> None:
        self._channel.close()
