"""Tuner and rollout actors over gRPC: tables and observations round-trip through the messages, a rollout actor
reports its observations to the tuner, takes tables and drafter versions (deferred while it decodes), heartbeats
the coordinator, and re-registers in its own state with a restarted coordinator."""

import time

import grpc
import pytest

from services.common.metrics import bucket_label
from services.common.strategy_table import table_from_pb, table_to_pb
from services.coordinator.service import CoordinatorActor
from services.rollout_actor.grpc_service import RolloutClient
from services.rollout_actor.shard import RolloutRequest
from services.rollout_actor.worker import RolloutWorker
from services.tuner.arms import default_arms
from services.tuner.bandit import BanditConfig, BucketedBandit
from services.tuner.grpc_service import TunerClient
from services.tuner.service import TunerService

SAMPLING = dict(temperature=0.9, top_p=1.0, top_k=0, max_new_tokens=24)
TOKEN = "test-token"  # every service requires the run's token


def test_table_round_trips_through_the_message():
    bandit = BucketedBandit(default_arms(), BanditConfig())
    for i in range(30):
        bandit.observe(1 + i % 9, "off", 8.0, 0.01)
        bandit.observe(1 + i % 9, "suffix-k8-w1", 14.0 + i, 0.01)
    table = bandit.table()
    assert table_from_pb(table_to_pb(table)) == table


def test_tuner_service_over_grpc():
    svc = TunerService()
    client = TunerClient(svc.serve(token=TOKEN), TOKEN, timeout=10)
    try:
        first = client.table()
        assert first == svc.table()
        assert client.table(known_version=first["version"]) is None  # unchanged
        obs = [dict(batch_size=2, arm="off", committed_tokens=2, seconds=0.01, explored=False)] * 5
        obs += [dict(batch_size=2, arm="nope", committed_tokens=2, seconds=0.01)]
        out = client.report("0", obs, first["version"])
        assert out == {"used": 5, "dropped": 1, "latest_table_version": first["version"] + 1}
        assert client.table(known_version=first["version"])["version"] == first["version"] + 1
        st = client.status()
        b = next(b for b in st["buckets"] if b["observations"])
        assert b["observations"] == 5 and b["arms"]["off"]["total"] == 5 and st["observations_total"] == 5
    finally:
        client.close()
        svc.close()


def _requests(n: int, ids: list[int], step: int = 1) -> list[RolloutRequest]:
    return [RolloutRequest(f"s{step}-r{i}", f"p{i % 2}", ids, seed=i) for i in range(n)]


def test_rollout_actor_over_grpc(tiny_policy_dir, tmp_path):
    """Observations to the tuner at the end of a shard; a table pushed mid-rollout is deferred to the next
    one; heartbeats keep the worker alive; a restarted coordinator adopts the worker's own state."""
    tuner = TunerService(available_drafters=["suffix", "ngram"])
    tuner_address = tuner.serve(token=TOKEN)
    coord = CoordinatorActor(heartbeat_timeout_s=30.0)
    coord_address = coord.serve(token=TOKEN)
    w = RolloutWorker(
        0, str(tiny_policy_dir), SAMPLING, max_batch_size=4, tuner_table=tuner.table(), learned=None
    )
    client = None
    coord2 = None
    try:
        client = RolloutClient(w.serve(token=TOKEN), TOKEN, timeout=30)
        assert w.connect_coordinator(coord_address, TOKEN, heartbeat_interval_s=0.1) == "IDLE"
        assert w.connect_tuner(tuner_address, TOKEN)
        assert client.status()["state"] == "IDLE"
        res = w.rollout(_requests(6, [5, 6, 7, 8]), step=1)
        assert len(res.outputs) == 6 and sum(res.choices.values()) == len(res.steps)
        # one record per step the selector was asked about; leased steps ride on its lease's records
        assert 0 < res.observations_reported <= len(res.steps)
        assert tuner.merged == res.observations_reported  # the tuner got them, over gRPC
        counted = sum(b["observations"] for b in tuner.bandit.stats()["buckets"])
        assert counted == len(res.steps)  # every step counted
        # the same steps per (bucket, arm): each step in the bucket of its active batch size
        edges = w.tuned.edges
        per_bucket: dict[str, int] = {}
        for st in res.steps:
            i = max(k for k, lo in enumerate(edges) if lo <= st.batch_size)
            label = bucket_label(edges[i], edges[i + 1] if i + 1 < len(edges) else None)
            per_bucket[label] = per_bucket.get(label, 0) + 1
        assert {b: sum(arms.values()) for b, arms in res.choices_by_bucket.items()} == per_bucket
        per_arm: dict[str, int] = {}
        for arms in res.choices_by_bucket.values():
            for arm, n in arms.items():
                per_arm[arm] = per_arm.get(arm, 0) + n
        assert per_arm == res.choices

        # a table pushed while the actor decodes is deferred, then installed at the next rollout
        newer = dict(tuner.table(), version=tuner.table()["version"] + 5)
        answers = []
        with w._busy:  # what a running rollout holds
            answers.append(client.set_table(newer))
        assert answers[0]["accepted"] and "deferred" in answers[0]["message"]
        assert w.tuned.version < newer["version"]
        w.rollout(_requests(2, [5, 6], step=2), step=2)
        assert w.tuned.version == newer["version"]
        assert not client.set_table(newer)["accepted"]  # not newer

        # the heartbeat thread keeps telling the coordinator the worker's own view
        deadline = time.monotonic() + 10
        while coord.coordinator.snapshot()["0"]["reported_state"] != "IDLE" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert coord.coordinator.snapshot()["0"]["reported_state"] == "IDLE"
        # the coordinator dies; a fresh one learns the worker's state from its re-registration
        coord.close()
        coord2 = CoordinatorActor(heartbeat_timeout_s=30.0)
        assert w.connect_coordinator(coord2.serve(token=TOKEN), TOKEN) == "IDLE"
        assert coord2.coordinator.state("0") == "IDLE"
        assert client.status()["finished_requests"] == 8
    finally:
        if client is not None:
            client.close()
        w.close()
        tuner.close()
        coord.close()
        if coord2 is not None:
            coord2.close()


def test_load_drafter_needs_a_published_path(tiny_policy_dir):
    w = RolloutWorker(0, str(tiny_policy_dir), SAMPLING, max_batch_size=2)
    client = RolloutClient(w.serve(token=TOKEN), TOKEN, timeout=30)
    try:
        with pytest.raises(grpc.RpcError) as e:
            client.load_drafter(1, "")
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        client.close()
        w.close()
