"""NgramDrafter: prompt lookup (most recent match of the longest suffix n-gram), budgets, purity."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.rollout_actor.speculative.base import DraftRequest
from services.rollout_actor.speculative.ngram import NgramDrafter, ngram_lookup


def req(ids: list[int], rid: str = "r") -> DraftRequest:
    return DraftRequest(rid, "p", list(ids), 0)


def reference(ids: list[int], max_n: int, min_n: int, k: int) -> tuple[list[int], int]:
    """Plain-Python prompt lookup: longest n first, then the latest start whose match is followed by a token."""
    n = len(ids)
    if k <= 0:
        return [], 0
    for g in range(min(max_n, n - 1), min_n - 1, -1):
        pat = ids[n - g :]
        for s in range(n - g - 1, -1, -1):
            if ids[s : s + g] == pat:
                return ids[s + g : s + g + k], g
    return [], 0


def test_most_recent_occurrence_wins():
    ids = [1, 2, 3, 4, 9, 1, 2, 3, 5, 7, 1, 2, 3]
    (tree,) = NgramDrafter(max_ngram=3, min_ngram=2).propose([req(ids)], [3])
    assert tree.tokens == [5, 7, 1] and tree.is_chain() and tree.probs is None
    assert tree.score == 3.0


def test_longest_ngram_beats_a_more_recent_shorter_one():
    # "1 2 3" occurs at 0 (followed by 40); "2 3" alone occurs more recently (followed by 50)
    ids = [1, 2, 3, 40, 41, 8, 2, 3, 50, 51, 1, 2, 3]
    assert NgramDrafter(max_ngram=3, min_ngram=2).propose([req(ids)], [2])[0].tokens == [40, 41]
    assert NgramDrafter(max_ngram=2, min_ngram=2).propose([req(ids)], [2])[0].tokens == [50, 51]


def test_budget_depth_and_no_match():
    d = NgramDrafter(max_ngram=4, min_ngram=2)
    ids = [5, 6, 7, 8, 9, 10, 11, 5, 6]
    trees = d.propose(
        [req(ids), req(ids), req(ids), req([1, 2, 3, 4]), req([]), req([7])], [10, 2, 0, 5, 5, 5]
    )
    assert trees[0].tokens == [7, 8, 9, 10, 11, 5, 6]  # never past the end of the context
    assert trees[1].tokens == [7, 8]
    assert [len(t) for t in trees[2:]] == [0, 0, 0, 0]
    assert all(t.score == 0.0 for t in trees[2:])
    assert d.propose([req(ids)], [10], width=4, depth=3)[0].tokens == [7, 8, 9]
    # a single repeated token is below min_ngram=2, enough for min_ngram=1
    assert d.propose([req([3, 4, 5, 3])], [4])[0].tokens == []
    assert NgramDrafter(min_ngram=1).propose([req([3, 4, 5, 3])], [4])[0].tokens == [4, 5, 3]


def test_continuation_may_overlap_the_pattern():
    ids = [1, 2, 1, 2, 1, 2]
    assert NgramDrafter(max_ngram=2, min_ngram=2).propose([req(ids)], [5])[0].tokens == [1, 2]


def test_large_ids_do_not_match_across_token_boundaries():
    # packed little-endian, [256, 0] holds the bytes of 1 at an odd offset: must not count as a match
    ids = [7, 256, 0, 0, 0, 99, 1, 0]
    assert ngram_lookup(ids, 2, 1, 3) == reference(ids, 2, 1, 3)
    ids = [2**24, 2**16, 2**8, 1, 5, 2**16, 2**8]
    assert ngram_lookup(ids, 3, 1, 4) == reference(ids, 3, 1, 4) == ([1, 5, 2**16, 2**8], 2)


def test_is_stateless():
    d = NgramDrafter()
    d.start_request("r", "p", [1, 2, 3])
    d.observe("r", [4])
    d.finish_request("r", "p", [4])
    d.new_step(3)
    d.load_state_dict(d.state_dict())
    ids = [9, 1, 2, 3, 4, 1, 2]
    assert (
        d.propose([req(ids)], [3])[0].tokens == NgramDrafter().propose([req(ids)], [3])[0].tokens == [3, 4, 1]
    )


def test_rejects_bad_config():
    with pytest.raises(ValueError):
        NgramDrafter(max_ngram=2, min_ngram=3)
    with pytest.raises(ValueError):
        NgramDrafter(min_ngram=0)


ids_st = st.lists(st.sampled_from([0, 1, 2, 3, 255, 256, 65536, 2**24 + 1, 2**31 - 1]), max_size=40)


@settings(max_examples=200, deadline=None)
@given(ids_st, st.integers(1, 5), st.integers(1, 5), st.integers(0, 10), st.integers(0, 4))
def test_matches_the_reference_and_drafts_occur_in_the_context(ids, a, b, budget, depth):
    max_n, min_n = max(a, b), min(a, b)
    k = min(budget, depth) if depth else budget
    toks, g = ngram_lookup(ids, max_n, min_n, k)
    assert (toks, g) == reference(ids, max_n, min_n, k)
    (tree,) = NgramDrafter(max_n, min_n).propose([req(ids)], [budget], depth=depth)
    assert tree.tokens == toks and tree.is_chain() and len(tree) <= k
    if toks:  # the matched n-gram followed by the draft occurs earlier in the context
        pat = ids[len(ids) - g :] + toks
        assert any(ids[s : s + len(pat)] == pat for s in range(len(ids) - g))
