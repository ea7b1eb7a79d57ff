"""The coordinator: one explicit state machine per worker, idle-worker grants, deadline-bounded preemption.

Plain Python, no Ray and no I/O: the Ray actor / gRPC service around it only forwards calls and delivers the
``Grant`` / ``Preempt`` messages it returns. Time comes from an injectable ``clock`` (``time.monotonic`` by
default) so that tests drive it explicitly.

Life cycle (after TLT, "Taming the Long Tail", arXiv 2511.16665, which trains the drafter on the idle
workers of the rollout long tail): a worker registers (STARTING), becomes ready (IDLE), runs its rollout share
(ROLLOUT) and, once done, is IDLE again. If the hidden-state buffer holds at least ``min_fresh_samples``
fresh samples (``buffer_ready(n_fresh)``), the coordinator grants the worker's resources to the spot trainer
(IDLE -> TRAINING, a ``Grant``). When rollout or the policy update needs the resources back,
``request_resources`` moves training workers to PREEMPTING and returns ``Preempt`` messages with a deadline
(``preempt_deadline_s``, 2 s by default). The trainer checks for preemption between steps and reports
``training_stopped`` (PREEMPTING -> IDLE); if it has not done so by the deadline, ``tick`` force-cancels the
training (losing at most the in-flight step) and the worker goes to IDLE, or to FAILED if it is unresponsive.

Contract
--------
- Every state change goes through ``_transition``, which checks ``states.TRANSITIONS`` (illegal -> raises
  ``IllegalTransition``) and records the change in ``transitions`` and the Gantt ``timeline``.
- Grants are issued only to IDLE workers that are not reserved. ``request_resources`` reserves the workers it
  names: a reserved worker gets no new grant until it starts a rollout or is ``release``-d, so a worker taken
  back for the policy update is not handed to the trainer again right away.
- Heartbeats: a worker in a live state (STARTING, ROLLOUT, IDLE, TRAINING, PREEMPTING) silent for more than
  ``heartbeat_timeout_s`` is marked FAILED by ``tick``. A FAILED worker comes back only by re-registering.
  A heartbeat carries the worker's own view (``WorkerReport``); it updates versions and step counters but
  never moves the state machine (a differing reported state is counted in ``stats['state_mismatches']``).
- ``rebuild_from_reports``: a restarted coordinator rebuilds its workers from their last reports; workers
  that report PREEMPTING get a fresh deadline (returned as ``Preempt`` messages to resend).
- Late or duplicate messages (``training_stopped`` for a grant that was already force-cancelled, or for an old
  grant id) are ignored and counted in ``stats['stale_messages']``; they never raise.
- A rollout phase opens with ``phase_started(step)`` (or implicitly at the first ``rollout_started``) and
  closes when no worker is in ROLLOUT any more; ``phases`` lists ``Phase(step, t_start, t_end)``.
- Thread-safe: every public method holds one re-entrant lock.
"""

from __future__ import annotations

import functools
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

from services.coordinator.states import LIVE_STATES, IllegalTransition, WorkerState, check_transition

S = WorkerState


@dataclass(frozen=True)
class WorkerReport:
    """What a worker says about itself in a heartbeat (and what a restarted coordinator rebuilds from)."""

    state: WorkerState
    policy_version: int = 0
    drafter_version: int = 0
    step: int = 0  # RL step the worker is in
    train_step: int = 0  # spot-trainer steps the drafter has done (global counter)

    @staticmethod
    def coerce(report: WorkerReport | Mapping[str, Any]) -> WorkerReport:
        if isinstance(report, WorkerReport):
            return report
        d = dict(report)
        d["state"] = WorkerState(d["state"])
        return WorkerReport(**d)


@dataclass(frozen=True)
class Grant:
    """The worker's resources are lent to the spot trainer until preempted."""

    worker_id: str
    grant_id: int
    resources: dict
    issued_at: float
    policy_version: int


@dataclass(frozen=True)
class Preempt:
    """Stop training on ``worker_id`` by ``deadline`` (coordinator clock); after it, training is cancelled."""

    worker_id: str
    deadline: float
    reason: str = ""
    grant_id: int | None = None


@dataclass(frozen=True)
class Transition:
    t: float
    worker_id: str
    src: WorkerState | None  # None: the worker's first state (register / rebuild)
    dst: WorkerState
    reason: str = ""


class Phase(NamedTuple):
    """One rollout phase: RL step ``step`` from ``t_start`` to ``t_end`` (None while open)."""

    step: int
    t_start: float
    t_end: float | None = None


class TimelineEvent(NamedTuple):
    """One bar of the Gantt chart: ``worker`` was in ``state`` from ``t_start`` to ``t_end``."""

    worker: str
    state: str
    t_start: float
    t_end: float


@dataclass
class _Worker:
    worker_id: str
    resources: dict
    state: WorkerState
    since: float
    last_heartbeat: float
    policy_version: int = 0
    drafter_version: int = 0
    step: int = 0
    train_step: int = 0
    reported_state: WorkerState | None = None
    grant_id: int | None = None
    preempt: Preempt | None = None
    reserved: str | None = None  # reason of request_resources, until rollout_started / release


def _locked(fn):
    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        with self._lock:
            return fn(self, *args, **kwargs)

    return wrapper


class Coordinator:
    def __init__(
        self,
        heartbeat_timeout_s: float = 10.0,
        preempt_deadline_s: float = 2.0,
        min_fresh_samples: int = 1,
        max_training_workers: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        force_cancel: Callable[[str], bool] | None = None,
        max_history: int = 200_000,
        on_state: Callable[[str, WorkerState], None] | None = None,
    ):
        """``force_cancel(worker_id) -> responsive`` is called when a preempt deadline passes (e.g. the Ray
        wrapper cancels the trainer task there); without it a worker counts as responsive when its last
        heartbeat is within the timeout. ``on_state(worker_id, state)`` is called (under the lock) whenever a
        worker enters a state: every transition, and a worker's first state (register, adopt); the actor
        exports ``tailspec_worker_state`` from it."""
        if heartbeat_timeout_s <= 0 or preempt_deadline_s < 0:
            raise ValueError("heartbeat_timeout_s must be > 0 and preempt_deadline_s >= 0")
        self.heartbeat_timeout_s = float(heartbeat_timeout_s)
        self.preempt_deadline_s = float(preempt_deadline_s)
        self.min_fresh_samples = int(min_fresh_samples)
        self.max_training_workers = max_training_workers
        self._clock = clock
        self._force_cancel = force_cancel
        self._on_state = on_state
        self._lock = threading.RLock()
        self._workers: dict[str, _Worker] = {}
        self._next_grant_id = 1
        self.n_fresh = 0
        self.policy_version = 0
        self.step = 0
        self.transitions: deque[Transition] = deque(maxlen=max_history)
        self._closed_events: deque[TimelineEvent] = deque(maxlen=max_history)
        self.phases: list[Phase] = []
        self.stats = dict(
            grants=0,
            preempts=0,
            forced_cancels=0,
            heartbeat_failures=0,
            unresponsive_at_deadline=0,
            stale_messages=0,
            state_mismatches=0,
        )

    # ------------------------------------------------------------------ the one transition method
    def _transition(self, w: _Worker, dst: WorkerState, reason: str = "", now: float | None = None) -> None:
        check_transition(w.worker_id, w.state, dst, reason)
        now = self._clock() if now is None else now
        src = w.state
        self._closed_events.append(TimelineEvent(w.worker_id, src.value, w.since, now))
        self.transitions.append(Transition(now, w.worker_id, src, dst, reason))
        w.state, w.since = dst, now
        if self._on_state is not None:
            self._on_state(w.worker_id, dst)
        if src in (S.TRAINING, S.PREEMPTING) and dst not in (S.TRAINING, S.PREEMPTING):
            w.grant_id, w.preempt = None, None
        if src is S.ROLLOUT:
            self._maybe_close_phase(now)

    @staticmethod
    def _require(w: _Worker, expected: WorkerState, dst: WorkerState, what: str) -> None:
        """Event-specific guard on top of the table (e.g. ``rollout_finished`` needs ROLLOUT, although
        TRAINING -> IDLE is a legal transition for another event)."""
        if w.state is not expected:
            raise IllegalTransition(w.worker_id, w.state, dst, f"{what} needs {expected.value}")

    def _add_worker(self, worker_id: str, resources: dict | None, state: WorkerState, now: float) -> _Worker:
        w = _Worker(worker_id, dict(resources or {}), state, since=now, last_heartbeat=now)
        self._workers[worker_id] = w
        self.transitions.append(Transition(now, worker_id, None, state, "register"))
        if self._on_state is not None:
            self._on_state(worker_id, state)
        return w

    def _get(self, worker_id: str) -> _Worker:
        try:
            return self._workers[worker_id]
        except KeyError:
            raise KeyError(f"unknown worker {worker_id!r}") from None

    # ------------------------------------------------------------------ membership and heartbeats
    @_locked
    def register(self, worker_id: str, resources: dict | None = None) -> WorkerState:
        """New worker -> STARTING. A known worker re-registering has restarted: -> (FAILED ->) STARTING."""
        now = self._clock()
        w = self._workers.get(worker_id)
        if w is None:
            self._add_worker(worker_id, resources, S.STARTING, now)
            return S.STARTING
        if w.state is S.STOPPED:
            raise IllegalTransition(worker_id, S.STOPPED, S.STARTING, "a stopped worker cannot re-register")
        if resources is not None:
            w.resources = dict(resources)
        w.last_heartbeat = now
        if w.state is S.STARTING:
            return S.STARTING
        if w.state is not S.FAILED:
            self._transition(w, S.FAILED, "re-registered (worker restarted)", now)
        self._transition(w, S.STARTING, "re-register", now)
        return S.STARTING

    @_locked
    def ready(self, worker_id: str) -> None:
        """STARTING -> IDLE (model loaded, ready for rollout)."""
        w = self._get(worker_id)
        self._require(w, S.STARTING, S.IDLE, "ready")
        self._transition(w, S.IDLE, "ready")

    @_locked
    def heartbeat(
        self, worker_id: str, report: WorkerReport | Mapping[str, Any] | None = None
    ) -> WorkerState:
        """Record liveness (and the worker's report). Returns the coordinator's view of the worker's state:
        a worker told FAILED must re-register."""
        w = self._get(worker_id)
        w.last_heartbeat = self._clock()
        if report is not None:
            r = WorkerReport.coerce(report)
            w.reported_state = r.state
            w.policy_version, w.drafter_version = r.policy_version, r.drafter_version
            w.step, w.train_step = r.step, max(w.train_step, r.train_step)
            if r.state is not w.state:
                self.stats["state_mismatches"] += 1
        return w.state

    @_locked
    def rebuild_from_reports(
        self,
        reports: Mapping[str, WorkerReport | Mapping[str, Any]],
        resources: Mapping[str, dict] | None = None,
    ) -> list[Preempt]:
        """Rebuild the workers of a restarted (empty) coordinator from their own reports.

        States are taken as reported (this is initialisation, not a transition). TRAINING workers get a new
        grant id; PREEMPTING workers get a fresh deadline, returned as ``Preempt`` messages to resend."""
        if self._workers:
            raise RuntimeError("rebuild_from_reports needs an empty coordinator")
        out = [self.adopt(w, reports[w], (resources or {}).get(w)) for w in sorted(reports)]
        return [p for p in out if p is not None]

    @_locked
    def adopt(
        self, worker_id: str, report: WorkerReport | Mapping[str, Any], resources: dict | None = None
    ) -> Preempt | None:
        """One worker re-registering with a restarted coordinator that does not know it yet: its reported
        state is taken as is (initialisation, not a transition), as in ``rebuild_from_reports``. Returns the
        ``Preempt`` to resend for a PREEMPTING worker. Raises ``ValueError`` for a worker already known."""
        if worker_id in self._workers:
            raise ValueError(f"worker {worker_id!r} is already known: adopt is for unknown workers only")
        now = self._clock()
        r = WorkerReport.coerce(report)
        w = self._add_worker(worker_id, resources, r.state, now)
        w.reported_state = r.state
        w.policy_version, w.drafter_version = r.policy_version, r.drafter_version
        w.step, w.train_step = r.step, r.train_step
        self.policy_version = max(self.policy_version, r.policy_version)
        self.step = max(self.step, r.step)
        if r.state in (S.TRAINING, S.PREEMPTING):
            w.grant_id = self._new_grant_id()
        if r.state is S.ROLLOUT and (not self.phases or self.phases[-1].t_end is not None):
            self.phases.append(Phase(self.step, now))
        if r.state is S.PREEMPTING:
            w.preempt = Preempt(worker_id, now + self.preempt_deadline_s, "rebuild", w.grant_id)
            return w.preempt
        return None

    @_locked
    def fail(self, worker_id: str, reason: str = "reported failure") -> None:
        w = self._get(worker_id)
        if w.state is not S.FAILED:
            self._transition(w, S.FAILED, reason)

    @_locked
    def stop(self, worker_id: str) -> None:
        """-> STOPPED (terminal). A training worker must be preempted first."""
        self._transition(self._get(worker_id), S.STOPPED, "stop")

    # ------------------------------------------------------------------ rollout phases
    @_locked
    def phase_started(self, step: int) -> None:
        """A new rollout phase (RL step ``step``) begins."""
        now = self._clock()
        self._close_open_phase(now)
        self.step = int(step)
        self.phases.append(Phase(self.step, now))

    @_locked
    def set_policy_version(self, version: int) -> None:
        self.policy_version = int(version)

    @_locked
    def rollout_started(self, worker_id: str, step: int | None = None) -> None:
        """IDLE/STARTING -> ROLLOUT. Raises for a TRAINING/PREEMPTING worker: take it back first."""
        w = self._get(worker_id)
        check_transition(worker_id, w.state, S.ROLLOUT, "rollout started")  # before any bookkeeping
        if step is not None and int(step) != self.step:
            self.phase_started(step)
        elif not self.phases or self.phases[-1].t_end is not None:
            self.phases.append(Phase(self.step, self._clock()))
        self._transition(w, S.ROLLOUT, "rollout started")
        w.reserved = None
        w.step = self.step

    @_locked
    def rollout_finished(self, worker_id: str) -> Grant | None:
        """ROLLOUT -> IDLE; returns a Grant when the buffer holds enough fresh data."""
        w = self._get(worker_id)
        self._require(w, S.ROLLOUT, S.IDLE, "rollout_finished")
        self._transition(w, S.IDLE, "rollout share finished")
        return self._maybe_grant(w)

    def _maybe_close_phase(self, now: float) -> None:
        if any(w.state is S.ROLLOUT for w in self._workers.values()):
            return
        self._close_open_phase(now)

    def _close_open_phase(self, now: float) -> None:
        if self.phases and self.phases[-1].t_end is None:
            p = self.phases[-1]
            self.phases[-1] = Phase(p.step, p.t_start, now)

    # ------------------------------------------------------------------ grants and preemption
    def _new_grant_id(self) -> int:
        gid = self._next_grant_id
        self._next_grant_id += 1
        return gid

    def _maybe_grant(self, w: _Worker) -> Grant | None:
        if w.state is not S.IDLE or w.reserved is not None or self.n_fresh < self.min_fresh_samples:
            return None
        if self.max_training_workers is not None:
            if sum(x.state is S.TRAINING for x in self._workers.values()) >= self.max_training_workers:
                return None
        now = self._clock()
        self._transition(w, S.TRAINING, "granted to spot trainer", now)
        w.grant_id = self._new_grant_id()
        self.stats["grants"] += 1
        return Grant(w.worker_id, w.grant_id, dict(w.resources), now, self.policy_version)

    @_locked
    def buffer_ready(self, n_fresh: int) -> list[Grant]:
        """The hidden-state buffer now holds ``n_fresh`` fresh samples; grant every eligible IDLE worker."""
        self.n_fresh = int(n_fresh)
        grants = [self._maybe_grant(self._workers[k]) for k in sorted(self._workers)]
        return [g for g in grants if g is not None]

    @_locked
    def request_resources(self, worker_ids: Iterable[str], reason: str = "rollout") -> list[Preempt]:
        """Rollout or the policy update needs these workers: reserve them and preempt their training.

        Returns one ``Preempt`` per worker in TRAINING (now PREEMPTING) or already PREEMPTING (resent with
        its original deadline: a second request never extends a deadline)."""
        now = self._clock()
        out: list[Preempt] = []
        for worker_id in worker_ids:
            w = self._get(worker_id)
            if w.state in (S.STOPPED, S.FAILED):
                continue
            w.reserved = reason
            if w.state is S.TRAINING:
                self._transition(w, S.PREEMPTING, f"preempt: {reason}", now)
                w.preempt = Preempt(w.worker_id, now + self.preempt_deadline_s, reason, w.grant_id)
                self.stats["preempts"] += 1
            if w.state is S.PREEMPTING:
                assert w.preempt is not None
                out.append(w.preempt)
        return out

    @_locked
    def release(self, worker_ids: Iterable[str] | None = None) -> list[Grant]:
        """Drop reservations (all when ``None``) and grant those workers if eligible."""
        ids = sorted(self._workers) if worker_ids is None else list(worker_ids)
        grants = []
        for worker_id in ids:
            w = self._get(worker_id)
            w.reserved = None
            g = self._maybe_grant(w)
            if g is not None:
                grants.append(g)
        return grants

    @_locked
    def training_stopped(
        self, worker_id: str, grant_id: int | None = None, train_step: int | None = None
    ) -> bool:
        """The spot trainer stopped on this worker (preempted, or finished on its own): -> IDLE.

        Returns False (and counts a stale message) when the training was already cancelled or ``grant_id``
        names an older grant."""
        w = self._get(worker_id)
        if train_step is not None:
            w.train_step = max(w.train_step, int(train_step))
        if w.state not in (S.TRAINING, S.PREEMPTING) or (grant_id is not None and grant_id != w.grant_id):
            self.stats["stale_messages"] += 1
            return False
        why = "preempted: training stopped" if w.state is S.PREEMPTING else "training finished"
        self._transition(w, S.IDLE, why)
        return True

    @_locked
    def tick(self, now: float | None = None) -> list[Transition]:
        """Heartbeat timeouts -> FAILED; passed preempt deadlines -> force cancel -> IDLE (or FAILED if the
        worker is unresponsive). Returns the transitions made."""
        now = self._clock() if now is None else now
        made: list[Transition] = []
        for w in self._sorted_workers():
            if w.state in LIVE_STATES and now - w.last_heartbeat > self.heartbeat_timeout_s:
                self.stats["heartbeat_failures"] += 1
                self._transition(w, S.FAILED, "heartbeat timeout", now)
                made.append(self.transitions[-1])
        for w in self._sorted_workers():
            if w.state is S.PREEMPTING and w.preempt is not None and now >= w.preempt.deadline:
                self.stats["forced_cancels"] += 1
                if self._force_cancel is not None:
                    responsive = bool(self._force_cancel(w.worker_id))
                else:
                    responsive = now - w.last_heartbeat <= self.heartbeat_timeout_s
                if responsive:
                    self._transition(w, S.IDLE, "preempt deadline passed: training cancelled", now)
                else:
                    self.stats["unresponsive_at_deadline"] += 1
                    self._transition(w, S.FAILED, "unresponsive at preempt deadline", now)
                made.append(self.transitions[-1])
        return made

    def _sorted_workers(self) -> list[_Worker]:
        return [self._workers[k] for k in sorted(self._workers)]

    # ------------------------------------------------------------------ views
    @_locked
    def state(self, worker_id: str) -> WorkerState:
        return self._get(worker_id).state

    @_locked
    def workers_in(self, *states: WorkerState) -> list[str]:
        return [k for k in sorted(self._workers) if self._workers[k].state in states]

    @_locked
    def pending_preempts(self) -> list[Preempt]:
        return [w.preempt for w in self._sorted_workers() if w.state is S.PREEMPTING and w.preempt]

    @_locked
    def snapshot(self) -> dict[str, dict[str, Any]]:
        """Per worker: state, since, versions, current step, and grant / preempt / reservation details."""
        out = {}
        for w in self._sorted_workers():
            out[w.worker_id] = dict(
                state=w.state.value,
                since=w.since,
                policy_version=w.policy_version,
                drafter_version=w.drafter_version,
                step=w.step,
                train_step=w.train_step,
                last_heartbeat=w.last_heartbeat,
                reported_state=None if w.reported_state is None else w.reported_state.value,
                grant_id=w.grant_id,
                preempt=None if w.preempt is None else asdict(w.preempt),
                reserved=w.reserved,
                resources=dict(w.resources),
            )
        return out

    @_locked
    def timeline(self, now: float | None = None) -> list[TimelineEvent]:
        """Closed state intervals plus each worker's open one (ending at ``now``), for the Gantt chart."""
        now = self._clock() if now is None else now
        events = list(self._closed_events)
        events += [TimelineEvent(w.worker_id, w.state.value, w.since, now) for w in self._sorted_workers()]
        return events
