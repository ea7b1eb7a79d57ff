"""The rollout worker indexes a rollout's finished responses into the suffix drafter's history after the
rollout (background thread), not on the decode thread, and the next rollout starts from the full history."""

from services.rollout_actor.shard import RolloutRequest
from services.rollout_actor.worker import RolloutWorker

SAMPLING = dict(temperature=0.9, top_p=1.0, top_k=0, max_new_tokens=12)


def test_rollout_responses_enter_the_history_after_the_rollout(tiny_policy_dir):
    w = RolloutWorker(0, str(tiny_policy_dir), SAMPLING, max_batch_size=4)
    suffix = w.drafters["suffix"]
    reqs = [
        RolloutRequest(f"p{i}-{g}", f"p{i}", [5 + i, 6, 7, 8], 10 * i + g) for i in range(2) for g in range(3)
    ]
    try:
        res = w.rollout(reqs, step=1)
        assert len(res.outputs) == 6
        w._join_history()  # the background indexing finishes
        assert suffix._pending_problem == {} and suffix._pending_global == []
        st = suffix.stats()
        assert st["global_responses"] == 6 and st["problem_responses"] == 6
        # the next rollout waits for the indexing and sees the history (new_step keeps step 1's responses)
        w.rollout(reqs[:2], step=2)
        assert w._history_thread is not None  # this rollout's indexing runs in the background again
        w._join_history()
        assert suffix.stats()["global_responses"] == 8
    finally:
        w.close()


def test_the_decode_loop_runs_with_the_history_frozen_out_of_gc(tiny_policy_dir):
    """During a rollout the objects that existed at its start (the drafters' history among them) sit in the
    GC's permanent generation, so collections on the decode path do not walk them; after it, none do."""
    import gc

    w = RolloutWorker(0, str(tiny_policy_dir), SAMPLING, max_batch_size=4)
    frozen_during: list[int] = []
    flush = w._flush_hidden
    w._flush_hidden = lambda out: (frozen_during.append(gc.get_freeze_count()), flush(out))
    reqs = [RolloutRequest(f"p0-{g}", "p0", [5, 6, 7, 8], g) for g in range(3)]
    try:
        assert gc.get_freeze_count() == 0
        w.rollout(reqs, step=1)
        assert len(frozen_during) == 3 and min(frozen_during) > 1000
        assert gc.get_freeze_count() == 0
    finally:
        w.close()
