"""The coordinator actor over gRPC: every RPC mapped onto the state machine, heartbeat timeouts from the ticker,
re-registration after a restart, and token auth."""

import time

import grpc
import pytest

from services.coordinator.client import CoordinatorClient
from services.coordinator.service import CoordinatorActor

TOKEN = "test-token"  # every service requires the run's token


@pytest.fixture
def served():
    actor = CoordinatorActor(heartbeat_timeout_s=30.0, preempt_deadline_s=2.0, min_fresh_samples=10)
    address = actor.serve(token=TOKEN)
    client = CoordinatorClient(address, TOKEN, timeout=10)
    yield actor, client
    client.close()
    actor.close()


def test_life_cycle_over_grpc(served):
    actor, c = served
    assert c.register("0", cpus=1)["state"] == "STARTING"
    assert c.register("1", cpus=1)["state"] == "STARTING"
    assert c.report_state("0", "IDLE", "ready")["state"] == "IDLE"
    assert c.report_state("1", "IDLE", "ready")["state"] == "IDLE"
    for w in ("0", "1"):
        r = c.report_state(w, "ROLLOUT", "rollout started", rl_step=3)
        assert r["accepted"] and r["state"] == "ROLLOUT"
    assert actor.coordinator.step == 3
    # worker 0 finishes before the buffer has data: IDLE, no grant
    r = c.report_state("0", "IDLE", "share finished")
    assert r["accepted"] and r["state"] == "IDLE" and r["grant"] is None
    assert c.request_training(fresh_samples=5) == []  # below min_fresh_samples
    grants = c.request_training(fresh_samples=50)
    assert [g["worker_id"] for g in grants] == ["0"]
    assert c.states() == {"0": "TRAINING", "1": "ROLLOUT"}
    # worker 1 finishes: the buffer is ready, so its bubble is lent at once (the grant is in the answer)
    r = c.report_state("1", "IDLE", "share finished")
    assert r["state"] == "TRAINING" and r["grant"]["worker_id"] == "1"
    # take both back: PREEMPTING with deadlines, then the trainer releases them
    req = c.request_rollout(["0", "1"], "policy update")
    assert sorted(p["worker_id"] for p in req["preemptions"]) == ["0", "1"]
    assert all(p["release_by"] > time.time() for p in req["preemptions"])
    assert c.states() == {"0": "PREEMPTING", "1": "PREEMPTING"}
    hb = c.heartbeat("0", "IDLE")
    assert (
        hb["known"] and hb["state"] == "PREEMPTING" and hb["preemption"]["grant_id"] == grants[0]["grant_id"]
    )
    stale = c.report_state("0", "IDLE", "stopped", grant_id="999")
    assert not stale["accepted"] and "stale" in stale["message"]
    assert c.report_state("0", "IDLE", "stopped", grant_id=grants[0]["grant_id"], train_step=7)["accepted"]
    assert c.report_state("1", "IDLE", "stopped", grant_id=r["grant"]["grant_id"])["accepted"]
    assert c.states() == {"0": "IDLE", "1": "IDLE"}
    # an illegal transition is answered, not raised
    c.report_state("0", "FAILED", "test")
    bad = c.report_state("0", "ROLLOUT", "after failure")
    assert not bad["accepted"] and "illegal transition FAILED -> ROLLOUT" in bad["message"]
    with pytest.raises(grpc.RpcError) as e:  # TRAINING is the coordinator's to give
        c.report_state("1", "TRAINING")
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as e:
        c.report_state("nobody", "IDLE")
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    assert not c.heartbeat("nobody")["known"]


def test_run_report_reaches_status(served):
    _, c = served
    c.register("0")
    c.report_run(dict(step=4, phase="train", policy_version=3, drafter_version=2, table_version=9))
    st = c.status(verbose=True)
    assert st.rl_step == 4 and st.versions.policy_version == 3 and st.versions.strategy_table_version == 9
    assert [w.worker_id for w in st.workers] == ["0"] and st.recent_transitions


def test_silent_worker_is_failed_by_the_ticker():
    actor = CoordinatorActor(heartbeat_timeout_s=0.5, heartbeat_interval_s=0.1, tick_interval_s=0.05)
    c = CoordinatorClient(actor.serve(token=TOKEN), TOKEN, timeout=10)
    try:
        c.register("0")
        c.register("1")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and c.states()["0"] != "FAILED":
            c.heartbeat("1")  # only worker 1 keeps talking
            time.sleep(0.1)
        assert c.states() == {"0": "FAILED", "1": "STARTING"}
    finally:
        c.close()
        actor.close()


def test_restarted_coordinator_adopts_reported_states(served):
    """A coordinator that does not know a worker adopts the state it re-registers with (no transition)."""
    actor, c = served
    assert c.register("0", state="ROLLOUT", rl_step=5, versions={"policy_version": 4})["state"] == "ROLLOUT"
    assert c.register("1", state="TRAINING")["state"] == "TRAINING"
    assert c.register("2", state="IDLE")["state"] == "IDLE"
    assert c.states() == {"0": "ROLLOUT", "1": "TRAINING", "2": "IDLE"}
    assert actor.coordinator.step == 5 and actor.coordinator.policy_version == 4
    # the adopted ROLLOUT worker finishes normally; the adopted TRAINING one is taken back with a deadline
    assert c.report_state("0", "IDLE", "share finished")["accepted"]
    assert [p["worker_id"] for p in c.request_rollout(["1"])["preemptions"]] == ["1"]
    # a known worker re-registering has restarted: -> STARTING (through FAILED)
    assert c.register("2")["state"] == "STARTING"


def test_token_required_off_loopback_and_enforced():
    actor = CoordinatorActor()
    address = actor.serve(token="s3cret")
    try:
        with pytest.raises(grpc.RpcError) as e:
            CoordinatorClient(address, timeout=10).states()
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert CoordinatorClient(address, token="s3cret", timeout=10).states() == {}
    finally:
        actor.close()
    with pytest.raises(ValueError, match="token"):
        CoordinatorActor().serve(host="0.0.0.0")
    with pytest.raises(ValueError, match="token"):  # loopback too
        CoordinatorActor().serve()
