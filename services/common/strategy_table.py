"""The strategy table as it travels between the tuner, the driver and the rollout actors
(``common.proto``'s ``StrategyTable``): ``table_to_pb`` / ``table_from_pb`` convert the
``BucketedBandit.table()`` dict (the shape ``StrategySelector`` reads) to and from the message, and
``check_table_pb`` refuses (``InvalidArgument``) a received table a rollout actor could not play.

Imports no service module: the tuner's gRPC face (which serves the table) and the rollout actor's (which
receives it) both use it. The table's ``regret_budget`` travels in ``StrategyTable.ledger.budget``, its
``window``, ``min_samples`` and ``z`` in ``StrategyTable.selector``, each bucket's ``windows`` (the arms' window
sums, ``RateWindow.sums()``) in ``StrategyBucket.windows`` and its ``allowance`` (seconds).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from services.common.enums import drafter_name, drafter_pb
from services.common.proto_gen.tailspec.v1 import common_pb2
from services.common.validation import InvalidArgument, check_counter, check_enum, check_id, check_number

WINDOW_FIELDS = ("n", "tokens", "seconds", "tokens_sq", "tokens_seconds", "seconds_sq")  # RateWindow.sums()


def table_to_pb(table: Mapping[str, Any]) -> common_pb2.StrategyTable:
    """``BucketedBandit.table()`` dict -> ``StrategyTable``."""
    arms = [
        common_pb2.Arm(
            name=name,
            drafter=drafter_pb(a["drafter"]),
            max_draft_tokens=int(a.get("max_draft_tokens", 0)),
            tree_width=int(a.get("tree_width", 1)),
            tree_depth=int(a.get("tree_depth", 0)),
        )
        for name, a in table["arms"].items()
    ]
    buckets = []
    for b in table["buckets"]:
        msg = common_pb2.StrategyBucket(
            bucket=int(b["bucket"]),
            lo=int(b["lo"]),
            best=b["best"],
            explore=list(b.get("explore", [])),
            probe=list(b.get("probe", [])),
            guarded=list(b.get("guarded", [])),
            windows=[
                common_pb2.ArmWindow(arm=n, **dict(zip(WINDOW_FIELDS, map(float, w))))
                for n, w in b.get("windows", {}).items()
            ],
            allowance=float(b.get("allowance", 0.0)),
        )
        if b.get("hi") is not None:
            msg.hi = int(b["hi"])
        buckets.append(msg)
    created = Timestamp()
    created.GetCurrentTime()
    pb = common_pb2.StrategyTable(
        version=int(table["version"]),
        bucket_edges=[int(e) for e in table.get("bucket_edges", [])],
        arms=arms,
        buckets=buckets,
        created_at=created,
    )
    pb.ledger.CopyFrom(common_pb2.LedgerSettings(budget=float(table["regret_budget"])))
    if "window" in table:
        pb.selector.CopyFrom(
            common_pb2.SelectorSettings(
                window=int(table["window"]), min_samples=int(table["min_samples"]), z=float(table["z"])
            )
        )
    return pb


def table_from_pb(pb: common_pb2.StrategyTable) -> dict[str, Any]:
    """``StrategyTable`` -> the ``BucketedBandit.table()`` dict that ``StrategySelector`` reads."""
    settings = {}
    if pb.HasField("selector"):
        st = pb.selector
        settings = {"window": int(st.window), "min_samples": int(st.min_samples), "z": float(st.z)}
    return {
        "version": int(pb.version),
        "bucket_edges": list(pb.bucket_edges),
        "arms": {
            a.name: {
                "drafter": drafter_name(a.drafter),
                "max_draft_tokens": int(a.max_draft_tokens),
                "tree_width": int(a.tree_width),
                "tree_depth": int(a.tree_depth),
            }
            for a in pb.arms
        },
        "buckets": [
            {
                "bucket": int(b.bucket),
                "lo": int(b.lo),
                "hi": int(b.hi) if b.HasField("hi") else None,
                "best": b.best,
                "explore": list(b.explore),
                "probe": list(b.probe),
                "guarded": list(b.guarded),
                "windows": {w.arm: [float(getattr(w, k)) for k in WINDOW_FIELDS] for w in b.windows},
                "allowance": float(b.allowance),
            }
            for b in pb.buckets
        ],
        "regret_budget": float(pb.ledger.budget),
        **settings,
    }


def check_table_pb(pb: common_pb2.StrategyTable, field: str = "table") -> None:
    """Refuse (``InvalidArgument``) a received ``StrategyTable`` that a rollout actor could not play: unknown
    drafters, arms a bucket names but the table does not define, a regret budget outside (0, 1], non-finite
    numbers, bucket bounds out of order, absurd draft shapes or versions."""
    check_counter(pb.version, f"{field}.version", at_least=1)
    edges = list(pb.bucket_edges)
    if any(b <= a for a, b in zip(edges, edges[1:])):
        raise InvalidArgument(f"{field}.bucket_edges must increase, got {edges[:20]}")
    names = set()
    for i, a in enumerate(pb.arms):
        f = f"{field}.arms[{i}]"
        check_id(a.name, f"{f}.name")
        check_enum(common_pb2.Drafter, a.drafter, f"{f}.drafter")
        if a.drafter == common_pb2.DRAFTER_UNSPECIFIED:
            raise InvalidArgument(f"{f}.drafter is unspecified")
        check_counter(a.max_draft_tokens, f"{f}.max_draft_tokens", at_most=256)
        check_counter(a.tree_width, f"{f}.tree_width", at_most=64)
        check_counter(a.tree_depth, f"{f}.tree_depth", at_most=256)
        names.add(a.name)
    if not pb.buckets:
        raise InvalidArgument(f"{field} has no bucket")
    for i, b in enumerate(pb.buckets):
        f = f"{field}.buckets[{i}]"
        if b.HasField("hi") and b.hi <= b.lo:
            raise InvalidArgument(f"{f}: hi {b.hi} must be > lo {b.lo}")
        for key in ("explore", "probe", "guarded"):
            unknown = [n for n in getattr(b, key) if n not in names]
            if unknown:
                raise InvalidArgument(f"{f}.{key} names arms the table does not define: {unknown[:3]}")
        if b.best not in names:
            raise InvalidArgument(f"{f}.best {b.best[:64]!r} is not an arm of the table")
        for j, w in enumerate(b.windows):
            if w.arm not in names or w.arm in b.guarded:
                raise InvalidArgument(
                    f"{f}.windows[{j}].arm {w.arm[:64]!r} is not a playable arm of the table"
                )
            check_number(w.n, f"{f}.windows[{j}].n", hi=1 << 20)
            for k in WINDOW_FIELDS[1:]:
                check_number(getattr(w, k), f"{f}.windows[{j}].{k}", hi=1e30)
        check_number(b.allowance, f"{f}.allowance", lo=-1e12, hi=1e12)
    if pb.HasField("selector"):
        check_counter(pb.selector.window, f"{field}.selector.window", at_least=2, at_most=1 << 20)
        check_counter(pb.selector.min_samples, f"{field}.selector.min_samples", at_least=2, at_most=1 << 20)
        check_number(pb.selector.z, f"{field}.selector.z", hi=1e6)
    if pb.HasField("ledger"):
        check_number(pb.ledger.budget, f"{field}.ledger.budget", hi=1.0, lo_open=True)


__all__ = ["check_table_pb", "table_from_pb", "table_to_pb"]
