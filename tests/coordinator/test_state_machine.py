"""Coordinator state machine: transition table, illegal transitions, grants, preemption deadlines, heartbeats,
rebuild from reports, and invariants over hypothesis-generated event sequences."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.coordinator import (
    TRANSITIONS,
    Coordinator,
    IllegalTransition,
    Preempt,
    WorkerReport,
    WorkerState,
)
from services.coordinator.states import check_transition

S = WorkerState


class FakeClock:
    def __init__(self, t: float = 100.0):
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


def make(clock=None, **kw) -> tuple[Coordinator, FakeClock]:
    clock = clock or FakeClock()
    kw = dict(dict(heartbeat_timeout_s=5.0, preempt_deadline_s=2.0, min_fresh_samples=10), **kw)
    return Coordinator(clock=clock, **kw), clock


def idle_worker(c: Coordinator, w: str = "w0") -> None:
    c.register(w, {"gpu": 1})
    c.ready(w)


# ---------------------------------------------------------------------- the table
def test_table_shape():
    assert set(TRANSITIONS) == set(WorkerState)
    assert all(isinstance(s, str) for s in WorkerState) and S.IDLE == "IDLE"
    for src, dsts in TRANSITIONS.items():
        assert src not in dsts
    assert TRANSITIONS[S.STOPPED] == frozenset()
    assert TRANSITIONS[S.PREEMPTING] == {S.IDLE, S.FAILED}
    assert S.ROLLOUT not in TRANSITIONS[S.TRAINING]
    assert S.TRAINING not in TRANSITIONS[S.ROLLOUT]
    assert S.STOPPED not in TRANSITIONS[S.TRAINING]  # preempt first
    # a worker only trains after being IDLE
    assert [s for s in WorkerState if S.TRAINING in TRANSITIONS[s]] == [S.IDLE]


@pytest.mark.parametrize(
    "src,dst", [(a, b) for a, b in itertools.product(WorkerState, WorkerState) if b not in TRANSITIONS[a]]
)
def test_illegal_pairs_raise(src, dst):
    with pytest.raises(IllegalTransition):
        check_transition("w", src, dst)


def test_illegal_calls_raise_and_change_nothing():
    c, _ = make()
    idle_worker(c)
    c.buffer_ready(100)  # -> TRAINING
    assert c.state("w0") is S.TRAINING
    before = c.snapshot()
    with pytest.raises(IllegalTransition):
        c.rollout_started("w0")  # must be taken back first
    with pytest.raises(IllegalTransition):
        c.rollout_finished("w0")
    with pytest.raises(IllegalTransition):
        c.stop("w0")
    assert c.snapshot() == before
    with pytest.raises(KeyError):
        c.heartbeat("nobody")


# ---------------------------------------------------------------------- life cycle
def test_grant_and_cooperative_preemption():
    c, clock = make()
    for w in ("w0", "w1"):
        idle_worker(c, w)
    c.phase_started(1)
    c.rollout_started("w0")
    c.rollout_started("w1")
    c.buffer_ready(3)
    clock.advance(1.0)
    assert c.rollout_finished("w0") is None  # not enough fresh data
    assert c.state("w0") is S.IDLE
    (g,) = c.buffer_ready(50)  # only w0 is idle
    assert g.worker_id == "w0" and g.resources == {"gpu": 1} and c.state("w0") is S.TRAINING
    clock.advance(3.0)
    assert c.rollout_finished("w1") is not None  # enough data now: granted right away
    assert c.phases[-1].t_end == clock.t  # last worker out of ROLLOUT closes the phase
    clock.advance(0.5)
    pre = c.request_resources(["w0", "w1"], reason="policy_update")
    assert {p.worker_id for p in pre} == {"w0", "w1"}
    assert all(p.deadline == clock.t + 2.0 and p.reason == "policy_update" for p in pre)
    clock.advance(1.0)
    assert c.request_resources(["w0"]) == [p for p in pre if p.worker_id == "w0"]  # deadline not extended
    assert c.training_stopped("w0", grant_id=g.grant_id, train_step=7)
    assert c.state("w0") is S.IDLE and c.snapshot()["w0"]["train_step"] == 7
    assert c.buffer_ready(1000) == []  # reserved: no re-grant until rollout or release
    c.rollout_started("w0", step=2)
    assert c.state("w0") is S.ROLLOUT and c.step == 2


def test_preempt_deadline_forces_cancel_and_late_stop_is_stale():
    c, clock = make()
    idle_worker(c)
    (g,) = c.buffer_ready(100)
    (p,) = c.request_resources(["w0"], "rollout")
    clock.advance(1.9)
    c.heartbeat("w0")
    assert c.tick() == [] and c.state("w0") is S.PREEMPTING
    clock.advance(0.1)
    (t,) = c.tick()
    assert (t.src, t.dst) == (S.PREEMPTING, S.IDLE) and t.t >= p.deadline
    assert c.stats["forced_cancels"] == 1
    assert c.training_stopped("w0", grant_id=g.grant_id) is False  # already cancelled
    assert c.stats["stale_messages"] == 1 and c.state("w0") is S.IDLE


def test_unresponsive_at_deadline_fails():
    c, clock = make(force_cancel=lambda worker_id: False)
    idle_worker(c)
    c.buffer_ready(100)
    c.request_resources(["w0"])
    clock.advance(2.0)
    c.tick()
    assert c.state("w0") is S.FAILED and c.stats["unresponsive_at_deadline"] == 1


def test_heartbeat_timeout_marks_failed_and_reregister():
    c, clock = make()
    idle_worker(c, "a")
    idle_worker(c, "b")
    for _ in range(4):
        clock.advance(2.0)
        c.heartbeat("a", {"state": "IDLE", "policy_version": 3, "drafter_version": 2, "step": 5})
        c.tick()
    assert c.state("a") is S.IDLE and c.state("b") is S.FAILED
    snap = c.snapshot()["a"]
    assert (snap["policy_version"], snap["drafter_version"], snap["step"]) == (3, 2, 5)
    assert c.heartbeat("b") is S.FAILED  # told to re-register
    assert c.register("b") is S.STARTING
    c.ready("b")
    assert c.state("b") is S.IDLE


def test_reregister_of_live_worker_passes_failed():
    c, _ = make()
    idle_worker(c)
    c.rollout_started("w0")
    c.register("w0")
    assert c.state("w0") is S.STARTING
    assert [(t.src, t.dst) for t in c.transitions][-2:] == [(S.ROLLOUT, S.FAILED), (S.FAILED, S.STARTING)]


def test_max_training_workers_and_release():
    c, _ = make(max_training_workers=1)
    for w in ("a", "b"):
        idle_worker(c, w)
    grants = c.buffer_ready(100)
    assert [g.worker_id for g in grants] == ["a"]
    c.training_stopped("a")  # finished on its own
    c.request_resources(["a"])
    assert [g.worker_id for g in c.buffer_ready(100)] == ["b"]
    c.request_resources(["b"])
    c.training_stopped("b")
    assert c.buffer_ready(100) == []
    assert [g.worker_id for g in c.release(["a"])] == ["a"]


def test_rebuild_from_reports():
    c, clock = make()
    reports = {
        "r": WorkerReport(S.ROLLOUT, policy_version=4, step=9),
        "t": {"state": "TRAINING", "policy_version": 4, "drafter_version": 3, "train_step": 120},
        "p": WorkerReport(S.PREEMPTING, policy_version=4),
        "i": WorkerReport(S.IDLE),
    }
    pre = c.rebuild_from_reports(reports, resources={"r": {"gpu": 1}})
    assert pre == [Preempt("p", clock.t + 2.0, "rebuild", c.snapshot()["p"]["grant_id"])]
    assert {w: c.state(w) for w in reports} == {
        "r": S.ROLLOUT,
        "t": S.TRAINING,
        "p": S.PREEMPTING,
        "i": S.IDLE,
    }
    assert c.policy_version == 4 and c.step == 9 and c.snapshot()["t"]["train_step"] == 120
    assert c.snapshot()["r"]["resources"] == {"gpu": 1}
    with pytest.raises(RuntimeError):
        c.rebuild_from_reports(reports)
    # the rebuilt machine keeps working: preempt deadline, rollout finish
    clock.advance(2.0)
    c.heartbeat("p")
    c.tick()
    assert c.state("p") is S.IDLE
    c.rollout_finished("r")
    assert c.phases[-1].t_end == clock.t


def test_snapshot_and_timeline():
    c, clock = make()
    idle_worker(c)
    clock.advance(1.0)
    c.rollout_started("w0", step=1)
    clock.advance(2.0)
    c.buffer_ready(100)
    c.rollout_finished("w0")
    clock.advance(3.0)
    snap = c.snapshot()["w0"]
    assert snap["state"] == "TRAINING" and snap["since"] == 103.0 and snap["grant_id"] == 1
    ev = c.timeline()
    assert [(e.state, e.t_start, e.t_end) for e in ev] == [
        ("STARTING", 100.0, 100.0),
        ("IDLE", 100.0, 101.0),
        ("ROLLOUT", 101.0, 103.0),
        ("IDLE", 103.0, 103.0),
        ("TRAINING", 103.0, 106.0),
    ]


# ---------------------------------------------------------------------- invariants over random sequences
WORKERS = ("w0", "w1", "w2")
worker = st.sampled_from(WORKERS)
_by_kind = {
    "register": worker,
    "ready": worker,
    "rollout_started": worker,
    "rollout_finished": worker,
    "buffer_ready": st.integers(0, 20),
    "request": st.lists(worker, min_size=1, max_size=3, unique=True),
    "release": worker,
    "training_stopped": worker,
    "heartbeat": worker,
    "advance": st.sampled_from([0.1, 0.5, 1.0, 2.5]),  # live workers heartbeat, then time passes
    "silence": st.sampled_from([2.0, 6.0]),  # time passes without heartbeats
    "tick": st.none(),
    "fail": worker,
}
# weights: the rollout / grant / preempt / tick cycle is common, failures and restarts are rare
_WEIGHTS = dict(
    rollout_started=4, rollout_finished=4, buffer_ready=3, request=4, training_stopped=3, advance=6, tick=4
)
event = st.one_of(*[st.tuples(st.just(k), v) for k, v in _by_kind.items() for _ in range(_WEIGHTS.get(k, 1))])


def _apply(c: Coordinator, clock: FakeClock, ev) -> tuple[list, list]:
    kind, arg = ev
    grants, preempts = [], []
    if kind == "register":
        c.register(arg, {"gpu": 1})
    elif kind == "ready":
        c.ready(arg)
    elif kind == "rollout_started":
        c.rollout_started(arg)
    elif kind == "rollout_finished":
        g = c.rollout_finished(arg)
        grants += [g] if g else []
    elif kind == "buffer_ready":
        grants += c.buffer_ready(arg)
    elif kind == "request":
        preempts += c.request_resources(arg, "rollout")
    elif kind == "release":
        grants += c.release([arg])
    elif kind == "training_stopped":
        c.training_stopped(arg)
    elif kind == "heartbeat":
        c.heartbeat(arg)
    elif kind == "advance":
        for w in WORKERS:
            if c.state(w) not in (S.FAILED, S.STOPPED):
                c.heartbeat(w)
        clock.advance(arg)
    elif kind == "silence":
        clock.advance(arg)
    elif kind == "tick":
        c.tick()
    elif kind == "fail":
        c.fail(arg)
    return grants, preempts


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(event, min_size=30, max_size=80))
def test_invariants_hold_for_random_event_sequences(events):
    clock = FakeClock()
    c = Coordinator(heartbeat_timeout_s=5.0, preempt_deadline_s=2.0, min_fresh_samples=5, clock=clock)
    for w in WORKERS:
        c.register(w, {"gpu": 1})
        c.ready(w)
    all_preempts: list[tuple[int, Preempt]] = []  # (index in the transition log when issued, message)
    reserved: set[str] = set()
    for ev in events:
        before = {w: c.state(w) for w in WORKERS}
        n_before = len(c.transitions)
        try:
            grants, preempts = _apply(c, clock, ev)
        except IllegalTransition:
            assert {w: c.state(w) for w in WORKERS} == before  # an illegal call changes nothing
            assert len(c.transitions) == n_before
            continue
        if ev[0] == "release":
            reserved.discard(ev[1])
        for g in grants:
            assert before[g.worker_id] in (S.IDLE, S.ROLLOUT)  # rollout_finished: ROLLOUT -> IDLE -> grant
            assert c.state(g.worker_id) is S.TRAINING
            assert g.worker_id not in reserved  # reserved workers are not handed to the trainer
        new = list(c.transitions)[n_before:]
        for t in new:  # every recorded change is legal, and a grant only ever starts from IDLE
            assert t.src is None or t.dst in TRANSITIONS[t.src]
            if t.dst is S.TRAINING:
                assert t.src is S.IDLE
        if ev[0] == "request":
            reserved |= {w for w in ev[1] if c.state(w) not in (S.FAILED, S.STOPPED)}
        reserved -= {t.worker_id for t in new if t.dst is S.ROLLOUT}
        all_preempts += [(n_before, p) for p in preempts]
        if ev[0] == "tick":  # a tick at or past a deadline leaves no worker PREEMPTING under it
            assert all(p.deadline > clock.t for p in c.pending_preempts())

    # drive every pending preemption past its deadline: each ends in IDLE or FAILED
    clock.advance(2.0)
    for w in WORKERS:
        if c.state(w) not in (S.FAILED, S.STOPPED):
            c.heartbeat(w)
    c.tick()
    assert c.workers_in(S.PREEMPTING) == []
    log = list(c.transitions)
    for idx, p in all_preempts:
        after = [t for t in log[idx:] if t.worker_id == p.worker_id]
        assert after, "a preempted worker must leave PREEMPTING"
        leave = next(t for t in after if t.src is S.PREEMPTING)
        assert leave.dst in (S.IDLE, S.FAILED)
        # after the request the worker never reaches ROLLOUT without passing IDLE (or a failure/restart)
        seen_idle_or_failed = False
        for t in after:
            if t.dst in (S.IDLE, S.FAILED):
                seen_idle_or_failed = True
            if t.dst is S.ROLLOUT:
                assert seen_idle_or_failed
    # one state per worker, and the timeline is a contiguous partition of each worker's time
    for w in WORKERS:
        ev_w = [e for e in c.timeline() if e.worker == w]
        assert all(a.t_end == b.t_start for a, b in zip(ev_w, ev_w[1:]))
        assert ev_w[-1].state == c.state(w).value and ev_w[-1].t_end == clock.t
    # heartbeats: after a tick no live worker is silent beyond the timeout
    clock.advance(5.1)
    c.tick()
    assert set(c.workers_in(S.FAILED, S.STOPPED)) == set(WORKERS)
