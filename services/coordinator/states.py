"""The coordinator's per-worker state machine: the table of legal transitions between ``WorkerState``s
(the enum itself is shared, in ``services/common/enums.py``).

Contract
--------
- One state per worker at any time (so ROLLOUT and TRAINING can never hold at once on one worker).
- ``TRANSITIONS[a]`` is the set of states a worker in state ``a`` may move to; anything else raises
  ``IllegalTransition``. Staying in the same state is not a transition (and is not in the table).
- The table encodes the scheduling rules the coordinator relies on:

  * a worker only trains after it became IDLE (no grant to a STARTING or ROLLOUT worker);
  * a training worker goes back to ROLLOUT only through PREEMPTING -> IDLE (or, when its training ends on
    its own, TRAINING -> IDLE): never TRAINING -> ROLLOUT;
  * every PREEMPTING ends in IDLE (training cancelled, resources returned) or FAILED (unresponsive);
  * FAILED workers come back only by re-registering (FAILED -> STARTING); STOPPED is terminal.

The bubble-training life cycle follows TLT ("Taming the Long Tail", arXiv 2511.16665): workers that finished
their rollout share early train the drafter on their otherwise idle accelerators until rollout or the policy
update needs them back.
"""

from __future__ import annotations

from services.common.enums import WorkerState

S = WorkerState

TRANSITIONS: dict[WorkerState, frozenset[WorkerState]] = {
    S.STARTING: frozenset({S.IDLE, S.ROLLOUT, S.FAILED, S.STOPPED}),
    S.ROLLOUT: frozenset({S.IDLE, S.FAILED, S.STOPPED}),
    S.IDLE: frozenset({S.ROLLOUT, S.TRAINING, S.FAILED, S.STOPPED}),
    S.TRAINING: frozenset({S.PREEMPTING, S.IDLE, S.FAILED}),
    S.PREEMPTING: frozenset({S.IDLE, S.FAILED}),
    S.FAILED: frozenset({S.STARTING, S.STOPPED}),
    S.STOPPED: frozenset(),
}

#: States in which a worker is expected to heartbeat (silence past the timeout marks it FAILED).
LIVE_STATES: frozenset[WorkerState] = frozenset({S.STARTING, S.ROLLOUT, S.IDLE, S.TRAINING, S.PREEMPTING})


class IllegalTransition(Exception):
    """A transition that is not in ``TRANSITIONS``."""

    def __init__(self, worker_id: str, src: WorkerState, dst: WorkerState, reason: str = ""):
        self.worker_id, self.src, self.dst, self.reason = worker_id, src, dst, reason
        msg = f"worker {worker_id!r}: illegal transition {src.value} -> {dst.value}"
        super().__init__(msg + (f" ({reason})" if reason else ""))


def check_transition(worker_id: str, src: WorkerState, dst: WorkerState, reason: str = "") -> None:
    """Raise ``IllegalTransition`` unless ``src -> dst`` is in the table."""
    if dst not in TRANSITIONS[src]:
        raise IllegalTransition(worker_id, src, dst, reason)
