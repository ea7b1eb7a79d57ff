"""Spot-trainer replicas: non-blocking grant / preempt, refusals, deadline, round-robin data sharding over
several replicas, parameter averaging (sync_replicas + load_head), and the gRPC face (SpotTrainerClient)."""

from __future__ import annotations

import time

import grpc
import pytest
import torch

from services.spot_trainer.grpc_service import SpotTrainerClient
from services.spot_trainer.replicas import lower_thread_priority, sync_replicas
from tests.spot_trainer.conftest import FRAME_LEN, feed, wait_for

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")

PREEMPT_KEYS = {
    "released",
    "release_seconds",
    "steps_in_grant",
    "trained_seconds",
    "drafter_version",
    "checkpoint_pending",
    "worker",
    "grant_id",
    "started_at",
    "finished_at",
    "step",
    "top1",
    "loss",
    "stop_reason",
    "message",
}


def _grant(gid: str, worker: str = "1", **kw) -> dict:
    return dict(dict(grant_id=gid, worker_id=worker, deadline=None, rl_step=3, policy_version=0), **kw)


def test_grant_trains_in_background_until_preempted(make_service):
    svc = make_service()
    feed(svc).close()
    t0 = time.time()
    ans = svc.grant(_grant("g1"))
    assert ans["accepted"] and ans["buffered_samples"] == 6 * FRAME_LEN and ans["drafter_version"] == 0
    assert wait_for(lambda: svc.spot.step >= 2)  # grant() returned at once; training runs on
    st = svc.status()
    assert st["training"] and [g["grant_id"] for g in st["active_grants"]] == ["g1"]
    again = svc.grant(_grant("g2", "2"))
    assert not again["accepted"] and "still holds grant 'g1'" in again["message"]

    out = svc.preempt("g1", timeout=30)
    assert set(out) == PREEMPT_KEYS
    assert out["released"] and out["stop_reason"] == "preempted"
    assert out["steps_in_grant"] >= 2 and out["step"] == svc.spot.step == out["steps_in_grant"]
    assert out["trained_seconds"] > 0 and out["worker"] == "1" and out["grant_id"] == "g1"
    assert t0 <= out["started_at"] <= out["finished_at"] <= time.time()
    assert out["loss"] is not None and 0.0 <= out["top1"] <= 1.0
    assert not svc.status()["training"] and svc.status()["active_grants"] == []
    assert svc.status()["trained_seconds_total"] == pytest.approx(out["trained_seconds"])
    assert svc.grant(_grant("g2", "2"))["accepted"]  # released: the replica takes the next grant


def test_grant_refused_without_data_and_preempt_of_nothing(make_service):
    svc = make_service()
    ans = svc.grant(_grant("g1"))
    assert not ans["accepted"] and ans["buffered_samples"] == 0
    assert "not enough fresh data" in ans["message"] and "8 needed" in ans["message"]
    out = svc.preempt()
    assert out["released"] and out["steps_in_grant"] == 0 and out["trained_seconds"] == 0.0
    assert out["grant_id"] == "" and out["stop_reason"] == "none" and out["started_at"] is None
    assert svc.preempt("unknown")["released"]
    with pytest.raises(ValueError):
        svc.grant({"grant_id": "", "worker_id": "1"})
    feed(svc).close()
    assert not svc.grant(_grant("late", deadline=time.time() - 1))["accepted"]  # deadline already passed


def test_deadline_stops_and_the_next_preempt_reports_it(make_service):
    svc = make_service()
    feed(svc).close()
    assert svc.grant(_grant("g1", deadline=time.time() + 1.0))["accepted"]
    assert svc.wait_grant(timeout=60)  # ends on its own at the deadline
    assert not svc.status()["training"] and len(svc.status()["active_grants"]) == 1  # still held
    assert not svc.grant(_grant("g2"))["accepted"]
    out = svc.preempt("g1")
    assert out["released"] and out["stop_reason"] == "deadline" and out["grant_id"] == "g1"
    assert out["finished_at"] is not None and out["trained_seconds"] > 0


def test_no_data_ends_a_grant(make_service):
    svc = make_service()
    feed(svc).close()
    assert svc.grant(_grant("g1"))["accepted"]
    assert wait_for(lambda: svc.spot.step >= 1)
    svc.update_policy({}, 5)  # a new policy: every row is stale now
    assert svc.wait_grant(timeout=60)
    out = svc.preempt()
    assert out["stop_reason"] == "no_data" and out["grant_id"] == "g1" and out["steps_in_grant"] >= 1


def test_one_sender_feeds_two_replicas_round_robin(make_service):
    a, b = make_service(0), make_service(1)
    sender = feed([a, b], n_frames=10)
    assert sender.addresses == [a.address(), b.address()] and sender.stats()["sent"] == 10
    sender.close()
    frames = [a.buffer.num_frames, b.buffer.num_frames]
    assert sum(frames) == 10 and min(frames) > 0  # each frame went to one replica, both got a share
    ids = [{f.request_id for f in s.buffer._frames} for s in (a, b)]
    assert not ids[0] & ids[1]


def _train(svc, gid: str, steps: int) -> int:
    assert svc.grant(_grant(gid))["accepted"]
    assert wait_for(lambda: svc.spot.step >= steps)
    return svc.preempt(gid)["steps_in_grant"]


def test_sync_replicas_averages_weighted_by_steps(make_service):
    a, b, idle = make_service(0), make_service(1), make_service(2)
    feed([a, b], n_frames=8).close()
    assert sync_replicas([a.head_state(), b.head_state()]) is None  # nobody trained yet
    na, nb = _train(a, "ga", 2), _train(b, "gb", 4)
    sa, sb, si = a.head_state(), b.head_state(), idle.head_state()
    assert (sa["steps_since_sync"], sb["steps_since_sync"], si["steps_since_sync"]) == (na, nb, 0)
    assert not all(torch.equal(sa["state"][k], sb["state"][k]) for k in sa["state"])  # different data
    mean = sync_replicas([sa, sb, si])  # the idle replica has weight 0
    for k, v in sa["state"].items():
        if v.is_floating_point():
            expect = (na * v + nb * sb["state"][k]) / (na + nb)
            assert torch.allclose(mean[k], expect, atol=1e-6), k
    for svc in (a, b, idle):
        svc.load_head(mean)
        assert svc.head_state()["steps_since_sync"] == 0
    for k, v in mean.items():
        assert torch.equal(a.head.state_dict()[k], v) and torch.equal(b.head.state_dict()[k], v), k
        assert torch.equal(idle.head.state_dict()[k], v), k
    assert _train(a, "ga2", a.spot.step + 1) >= 1  # training goes on from the mean


def test_grpc_grant_preempt_status_round_trip(make_service):
    svc = make_service()
    addr = svc.serve(token="s3cret")
    assert addr.startswith("127.0.0.1:") and svc.serve(token="s3cret") == addr
    with SpotTrainerClient(addr, "s3cret") as c:
        st = c.status()
        assert set(st) == set(svc.status())
        assert st["replica"] == 0 and st["leader"] and st["grpc_address"] == addr
        assert st["stream_address"] == svc.address() and st["buffered_samples"] == 0
        refused = c.grant(_grant("g0", deadline=time.time() + 600))
        assert not refused["accepted"] and "not enough fresh data" in refused["message"]
        feed(svc).close()
        deadline = time.time() + 600
        ans = c.grant(_grant("g1", "7", deadline=deadline, rl_step=4, policy_version=0))
        assert ans == dict(
            accepted=True, message=ans["message"], buffered_samples=6 * FRAME_LEN, drafter_version=0
        )
        assert wait_for(lambda: c.status()["train_steps"] >= 2)
        st = c.status()
        assert st["training"] and len(st["active_grants"]) == 1
        g = st["active_grants"][0]
        assert (g["grant_id"], g["worker_id"], g["rl_step"]) == ("g1", "7", 4)
        assert g["deadline"] == pytest.approx(deadline, abs=1e-6) and g["granted_at"] is not None

        out = c.preempt("g1", release_by=time.time() + 30)
        assert set(out) == PREEMPT_KEYS
        assert out["released"] and out["stop_reason"] == "preempted" and out["worker"] == "7"
        assert out["steps_in_grant"] >= 2 and out["trained_seconds"] > 0 and out["step"] == svc.spot.step
        assert out["loss"] is not None and out["top1"] is not None
        assert out["started_at"] <= out["finished_at"]
        nothing = c.preempt()
        assert nothing["released"] and nothing["steps_in_grant"] == 0 and nothing["loss"] is None
        assert nothing["started_at"] is None and nothing["grant_id"] == ""
        with pytest.raises(grpc.RpcError) as err:
            c.grant({"grant_id": "", "worker_id": ""})
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert c.status()["last_loss"] == pytest.approx(out["loss"])


def test_grpc_token_required(make_service):
    svc = make_service()
    with pytest.raises(ValueError, match="token"):
        svc.serve(host="0.0.0.0")  # every service needs the run's token
    with pytest.raises(ValueError, match="token"):
        svc.serve()  # loopback too
    addr = svc.serve(token="s3cret")
    with SpotTrainerClient(addr) as anon, pytest.raises(grpc.RpcError) as err:
        anon.status()
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with SpotTrainerClient(addr, token="s3cret") as c:
        assert c.status()["instance_id"] == "spot_trainer-0"
    svc.close()
    assert not svc.grant(_grant("g"))["accepted"]


def test_training_thread_runs_niced_and_the_receiver_does_not(make_service):
    """Bubble training yields the CPU to the critical path: the grant's thread runs at nice + 19 (``spot.nice``),
    the service's other threads (the hidden-state receiver, the caller) keep their priority."""
    import os
    import threading

    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    svc = make_service()
    feed(svc).close()
    assert svc.grant(_grant("g1"))["accepted"]
    assert wait_for(lambda: svc.spot.step >= 1)
    tid = svc._grant.thread.native_id
    assert os.getpriority(os.PRIO_PROCESS, tid) == min(19, base + svc.nice) and svc.nice == 19
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == base
    assert os.getpriority(os.PRIO_PROCESS, svc.receiver._thread.native_id) == base
    svc.preempt("g1", timeout=30)
    # the helper alone: a thread's own value moves by the increment (capped at 19), 0 changes nothing
    got = []
    for inc in (0, 3):
        t = threading.Thread(
            target=lambda i=inc: got.append(
                (lower_thread_priority(i), os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
            )
        )
        t.start()
        t.join()
    assert got == [(None, base), (min(19, base + 3), min(19, base + 3))]
    with pytest.raises(ValueError, match="nice must be in 0..19"):
        make_service(nice=20)
