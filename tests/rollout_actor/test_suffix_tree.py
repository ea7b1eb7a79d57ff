"""SuffixTreeDrafter / SuffixTrie: counts, sources, eviction, sizing rule, tree shape, checkpoints."""

from __future__ import annotations

import pickle
import random
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.rollout_actor.speculative.base import DraftRequest, DraftTree
from services.rollout_actor.speculative.suffix_tree import SuffixTreeDrafter, SuffixTrie, _OnlineTrie

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def req(rid: str, pid: str, ids: list[int], num_prompt: int = 0) -> DraftRequest:
    return DraftRequest(rid, pid, list(ids), num_prompt)


def unique(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def assert_tree_ok(tree: DraftTree, budget: int, width: int, depth: int) -> None:
    assert tree.probs is None
    assert len(tree.tokens) == len(tree.parents) <= max(budget, 0)
    kids: Counter[int] = Counter()
    seen: dict[int, set[int]] = {}
    for i, (tok, p) in enumerate(zip(tree.tokens, tree.parents)):
        assert -1 <= p < i
        kids[p] += 1
        assert tok not in seen.setdefault(p, set()), "siblings must be distinct tokens"
        seen[p].add(tok)
    assert all(c <= width for c in kids.values())
    if depth > 0 and len(tree):
        assert max(tree.depths()) <= depth
    if width == 1:
        assert tree.is_chain()
    assert tree.score >= 0.0
    assert (tree.score > 0) == (len(tree) > 0)


def paths(tree: DraftTree) -> list[list[int]]:
    out: list[list[int]] = []
    for i, p in enumerate(tree.parents):
        out.append((out[p] if p >= 0 else []) + [tree.tokens[i]])
    return out


def occurs(needle: list[int], hay: list[int]) -> bool:
    m = len(needle)
    return any(hay[i : i + m] == needle for i in range(len(hay) - m + 1))


# ---------------------------------------------------------------------------------------------- the trie
def brute_counts(seqs: list[list[int]], depth: int) -> Counter:
    c: Counter = Counter()
    for s in seqs:
        for i in range(len(s)):
            for j in range(i + 1, min(len(s), i + depth) + 1):
                c[tuple(s[i:j])] += 1
    return c


def trie_counts(t: SuffixTrie) -> Counter:
    """Every string the trie represents, with its count; checks the node invariants on the way."""
    out: Counter = Counter()

    def rec(node, prefix: list[int]) -> None:
        if node.seq is not None:
            out[tuple(prefix)] += node.n
            for x in node.seq[node.pos : min(len(node.seq), node.lim)]:
                prefix = prefix + [x]
                out[tuple(prefix)] += node.n
        if node.ch:
            assert node.tot == sum(c.n for c in node.ch.values())
            if node.bc is not None:  # the cached best child: most frequent, ties to the lowest token
                assert node.ch[node.bk] is node.bc
                assert (node.bc.n, -node.bk) == max((c.n, -t) for t, c in node.ch.items())
            for tok, c in node.ch.items():
                assert c.n >= 1
                rec(c, prefix + [tok])
        else:
            assert node.tot == 0

    rec(t.root, [])
    return out


seq_st = st.lists(st.integers(0, 3), max_size=14)


@FAST
@given(st.integers(2, 7), st.lists(st.tuples(st.booleans(), seq_st), min_size=1, max_size=10))
def test_trie_counts_match_brute_force_under_insert_and_remove(depth, ops):
    t = SuffixTrie(depth)
    live: list[list[int]] = []
    for remove, s in ops:
        if remove and live:
            t.remove(live.pop(0))
        else:
            t.insert(s)
            live.append(s)
        expected = brute_counts(live, depth)
        assert trie_counts(t) == expected
        for key, c in list(expected.items())[:8]:
            assert t.count(list(key)) == c
    for s in live:
        t.remove(s)
    assert t.num_nodes() == 1 and t.num_tokens == 0


@FAST
@given(st.integers(2, 7), st.lists(seq_st, max_size=6))
def test_online_trie_counts_match_brute_force(depth, chunks):
    t = _OnlineTrie(depth)
    full: list[int] = []
    for c in chunks:
        t.extend(c)
        full += c
        assert trie_counts(t) == brute_counts([full], depth)


@FAST
@given(st.integers(2, 9), st.lists(st.integers(0, 3), max_size=40))
def test_online_trie_active_starts_are_the_earlier_occurring_suffixes(depth, seq):
    """The request source reads its longest match off the active starts: check it against brute force."""
    t = _OnlineTrie(depth)
    for i, tok in enumerate(seq):
        t.extend([tok])
        n = i + 1
        want = [
            s
            for s in range(n)
            if n - s < depth and any(seq[j : j + n - s] == seq[s:n] for j in range(s))  # occurs earlier
        ]
        assert list(t.active) == want
        for s in want:  # the node has the earlier occurrence's continuation
            assert t.active[s].tot > 0


# ---------------------------------------------------------------------------------------------- sources
def test_finished_sibling_continuation_is_drafted():
    d = SuffixTreeDrafter()
    prompt, resp = unique(100, 10), unique(1000, 40)
    d.start_request("a", "p", prompt)
    d.observe("a", resp)
    d.finish_request("a", "p", resp)
    d.start_request("b", "p", prompt)
    d.observe("b", resp[:5])
    (tree,) = d.propose([req("b", "p", prompt + resp[:5], len(prompt))], [8])
    assert tree.tokens == resp[5:13] and tree.is_chain() and tree.probs is None
    assert tree.score == pytest.approx(8.0)
    # the prompt tail is stored too: a sibling that has generated nothing yet drafts the first tokens
    (tree,) = d.propose([req("c", "p", prompt, len(prompt))], [6])
    assert tree.tokens == resp[:6]


def test_global_source_serves_other_problems_and_request_source_its_own_repeats():
    d = SuffixTreeDrafter(problem_capacity=0)
    resp = unique(1000, 30)
    d.finish_request("x", "p", resp)
    assert d.propose([req("r", "q", [7, 8] + resp[:10])], [4])[0].tokens == []  # queued, not indexed yet
    d.flush()  # the rollout worker's call after a rollout
    (tree,) = d.propose([req("r", "q", [7, 8] + resp[:10])], [4])
    assert tree.tokens == resp[10:14]
    # no history at all: the request's own earlier text
    e = SuffixTreeDrafter()
    ctx = [5, 6, 7, 8, 9, 1, 2, 3, 5, 6, 7]
    (tree,) = e.propose([req("s", "z", ctx)], [8])
    assert tree.tokens == [8, 9, 1, 2]  # match "5 6 7" (L=3) -> floor(1.0 * 3 + 1.0) = 4 tokens


def test_empty_draft_when_nothing_matches():
    d = SuffixTreeDrafter()
    assert d.propose([req("r", "p", unique(0, 50))], [8])[0].tokens == []
    d.finish_request("x", "p", unique(1000, 30))
    trees = d.propose(
        [req("r", "p", unique(0, 50)), req("s", "p", [1000, 1001, 1002]), req("t", "p", [])], [8, 0, 8]
    )
    assert [len(t) for t in trees] == [0, 0, 0]
    assert all(t.score == 0.0 for t in trees)
    # a single matched token drafts by default (min_match_len=1: floor(1.0 * 1 + 1.0) = 2 tokens), not below a
    # minimum of 2
    assert d.propose([req("u", "p", [5, 1000])], [8])[0].tokens == [1001, 1002]
    e = SuffixTreeDrafter(min_match_len=2)
    e.finish_request("x", "p", unique(1000, 30))
    assert len(e.propose([req("u", "p", [5, 1000])], [8])[0]) == 0
    assert len(SuffixTreeDrafter(min_match_len=1).propose([req("u", "q", [5, 1000])], [8])[0]) == 0  # fresh


def test_best_score_wins_across_sources():
    prefix = [1, 2, 3, 4, 5, 6]
    ctx = [99] + prefix

    def build(global_capacity: int) -> SuffixTreeDrafter:
        d = SuffixTreeDrafter(global_capacity=global_capacity)
        d.finish_request("s1", "p", prefix + [10, 11, 12])
        d.finish_request("s2", "p", prefix + [20, 21, 22])
        d.finish_request("o1", "q", prefix + [10, 11, 12])
        d.flush()
        return d

    # problem trie: 10 and 20 once each (p = 1/2, tie -> lowest id); global: 10 twice, 20 once (p = 2/3)
    (tree,) = build(0).propose([req("r", "p", ctx)], [3])
    assert tree.tokens == [10, 11, 12] and tree.score == pytest.approx(1.5)
    (tree,) = build(10_000).propose([req("r", "p", ctx)], [3])
    assert tree.tokens == [10, 11, 12] and tree.score == pytest.approx(2.0)


def test_min_token_prob_cuts_low_probability_paths():
    def build(min_p: float) -> SuffixTreeDrafter:
        d = SuffixTreeDrafter(min_token_prob=min_p, global_capacity=0)
        for i in range(5):
            d.finish_request(f"s{i}", "p", [1, 2, 3, 50 + i, 60 + i])
        return d

    assert build(0.25).propose([req("r", "p", [1, 2, 3])], [3])[0].tokens == []
    (tree,) = build(0.1).propose([req("r", "p", [1, 2, 3])], [3])
    assert tree.tokens == [50, 60] and tree.score == pytest.approx(0.4)


def test_width_gives_a_tree_of_alternatives():
    d = SuffixTreeDrafter(global_capacity=0)
    pre = [1, 2, 3, 4, 5, 6]  # a 6-token match allows 6 draft nodes
    d.finish_request("s1", "p", pre + [10, 11, 12])
    d.finish_request("s2", "p", pre + [10, 11, 12])
    d.finish_request("s3", "p", pre + [20, 21, 22])
    (tree,) = d.propose([req("r", "p", pre)], [6], width=2)
    assert_tree_ok(tree, 6, 2, 0)
    assert tree.tokens == [10, 11, 12, 20, 21, 22]  # best-first: 2/3-paths before 1/3-paths
    assert tree.parents == [-1, 0, 1, -1, 3, 4]
    assert tree.score == pytest.approx(3 * 2 / 3 + 3 * 1 / 3)
    (tree,) = d.propose([req("r", "p", pre)], [6], width=2, depth=1)
    assert tree.tokens == [10, 20] and tree.parents == [-1, -1]
    (tree,) = d.propose([req("r", "p", pre)], [4], width=2)
    assert tree.tokens == [10, 11, 12, 20] and tree.parents == [-1, 0, 1, -1]
    (chain,) = d.propose([req("r", "p", pre)], [6])
    assert chain.tokens == [10, 11, 12] and chain.score == pytest.approx(2.0)


def test_sibling_finishing_mid_request_extends_the_match():
    """A running request's remembered match bound must not hide a longer match a new sibling brings."""
    d = SuffixTreeDrafter(global_capacity=0)
    x = unique(100, 10)
    d.finish_request("s1", "p", [1, 2, 70, 71, 72, 73])
    d.start_request("r", "p", x)
    d.observe("r", [1, 2])
    (tree,) = d.propose([req("r", "p", x + [1, 2], 10)], [8])
    assert tree.tokens == [70, 71, 72]  # match "1 2": 3 tokens
    d.finish_request("s2", "p", x + [1, 2, 3] + unique(80, 10))
    d.observe("r", [3])
    (tree,) = d.propose([req("r", "p", x + [1, 2, 3], 10)], [8])
    assert tree.tokens == unique(80, 8)  # match of 13 tokens through the new sibling


def test_longer_match_is_more_specific_than_the_shared_middle():
    d = SuffixTreeDrafter(max_depth=16, global_capacity=0)
    mid = unique(1, 8)
    a, b, c = unique(100, 8), unique(200, 8), unique(300, 8)
    d.finish_request("s1", "p", a + mid + [50])
    d.finish_request("s2", "p", b + mid + [60])
    d.finish_request("s3", "p", c + mid + [60])
    ctx = a + mid
    for budget in (8, 2):  # a chain's match is not capped by the room below it (it re-anchors at the depth)
        (tree,) = d.propose([req("r", "p", ctx)], [budget])  # match includes a's tail: next token 50
        assert tree.tokens == [50] and tree.score == pytest.approx(1.0)
    # a tree needs room below its match: budget 8 caps the match at 8 = mid, whose next token is 60 (2 of 3)
    (tree,) = d.propose([req("r", "p", ctx)], [8], width=2)
    assert tree.tokens[0] == 60 and tree.score == pytest.approx(2 / 3 + 1 / 3)


# ---------------------------------------------------------------------------------------------- sizing
@pytest.mark.parametrize(
    "alpha,beta,budget,match,expected",
    [
        (1.0, 0.0, 8, 3, 3),
        (1.0, 0.0, 8, 20, 8),
        (0.5, 1.0, 16, 10, 6),
        (2.0, 0.0, 16, 5, 10),
        (0.5, 0.0, 8, 3, 1),
        (1.0, 0.0, 8, 1, 0),  # below min_match_len
        (1.0, 2.0, 4, 2, 4),
    ],
)
def test_draft_length_is_min_budget_alpha_match_beta(alpha, beta, budget, match, expected):
    d = SuffixTreeDrafter(max_depth=64, alpha=alpha, beta=beta, min_match_len=2)
    resp = unique(1000, 100)
    d.finish_request("x", "p", resp)
    ctx = [7] + resp[:match]  # 7 never occurs: the longest match is exactly `match`
    (tree,) = d.propose([req("r", "p", ctx)], [budget])
    assert len(tree) == expected == (d.draft_size(match, budget) if match >= 2 else 0)
    assert tree.tokens == resp[match : match + expected]


def test_chain_depth_and_cap_leave_room_in_the_trie():
    d = SuffixTreeDrafter(max_depth=16)
    resp = unique(1000, 100)
    d.finish_request("x", "p", resp)
    ctx = resp[:40]  # matches far longer than the trie depth
    (tree,) = d.propose([req("r", "p", ctx)], [8])
    assert tree.tokens == resp[40:48]  # a 15-token match, 1 level left: the chain re-anchors on 8 tokens
    (tree,) = d.propose([req("r", "p", ctx)], [8], width=2)
    assert tree.tokens == resp[40:48]  # a tree's match is capped at 8, leaving 8 levels
    (tree,) = d.propose([req("r", "p", ctx)], [8], depth=3)
    assert tree.tokens == resp[40:43]


# ---------------------------------------------------------------------------------------------- eviction
def test_a_problem_keeps_the_responses_of_its_last_w_visits_however_many_steps_apart():
    d = SuffixTreeDrafter(window_steps=2, global_capacity=0, use_request=False)
    old, new, newer = unique(1000, 20), unique(2000, 20), unique(3000, 20)
    d.new_step(0)
    d.finish_request("a", "p", old)
    d.new_step(1)
    d.finish_request("b", "p", new)
    for step in range(2, 40):  # an epoch of other problems: p is not visited, nothing of it is dropped
        d.new_step(step)
        d.finish_request(f"o{step}", f"other{step}", unique(10_000 + 100 * step, 20))
    assert d.propose([req("r", "p", old[:5])], [4])[0].tokens == old[5:9]
    d.finish_request("c", "p", newer)  # p's third visit (step 39): its first one (step 0) is dropped
    assert d.propose([req("r", "p", old[:5])], [4])[0].tokens == []
    assert d.propose([req("r2", "p", new[:5])], [4])[0].tokens == new[5:9]
    assert d.propose([req("r3", "p", newer[:5])], [4])[0].tokens == newer[5:9]


def test_history_capacity_drops_the_problem_visited_longest_ago_whole():
    d = SuffixTreeDrafter(history_capacity=4, global_capacity=0, use_request=False)
    seqs = {pid: [unique(1000 * (i + 1) + 100 * j, 20) for j in range(3)] for i, pid in enumerate("abc")}
    for pid, j in (("a", 0), ("a", 1), ("b", 0), ("b", 1)):
        d.finish_request(f"{pid}{j}", pid, seqs[pid][j])
    d.flush()
    assert d.stats()["problem_responses"] == 4
    d.finish_request("a2", "a", seqs["a"][2])  # a has the newest response: b is dropped whole
    d.flush()
    assert d.stats()["problems"] == 1 and d.stats()["problem_responses"] == 3
    assert d.propose([req("r", "b", seqs["b"][0][:5])], [4])[0].tokens == []
    assert d.propose([req("r", "a", seqs["a"][0][:5])], [4])[0].tokens == seqs["a"][0][5:9]
    d.finish_request("c0", "c", seqs["c"][0])
    d.flush()  # 4 responses: within the capacity, both stay
    assert d.stats()["problems"] == 2 and d.stats()["problem_responses"] == 4


def test_problem_capacity_is_fifo():
    d = SuffixTreeDrafter(problem_capacity=2, global_capacity=0, use_request=False)
    seqs = [unique(1000 * (i + 1), 20) for i in range(3)]
    for i, s in enumerate(seqs):
        d.finish_request(f"s{i}", "p", s)
    assert d.propose([req("r", "p", seqs[0][:5])], [4])[0].tokens == []
    assert d.propose([req("r1", "p", seqs[1][:5])], [4])[0].tokens == seqs[1][5:9]
    assert d.stats()["problem_tokens"] == 40


def test_global_fifo_eviction_by_responses():
    d = SuffixTreeDrafter(global_capacity=2, problem_capacity=0, use_request=False)
    a, b, c = unique(1000, 40), unique(2000, 40), unique(3000, 40)
    d.finish_request("a", "pa", a)
    d.finish_request("b", "pb", b)
    d.flush()
    assert d.propose([req("r", "z", a[:5])], [4])[0].tokens == a[5:9]
    d.finish_request("c", "pc", c)  # 3 responses > 2: a (the oldest) goes (stats() flushes)
    s = d.stats()
    assert s["global_tokens"] == 80 and s["global_responses"] == 2
    assert d.propose([req("r", "z", a[:5])], [4])[0].tokens == []
    assert d.propose([req("r2", "z", b[:5])], [4])[0].tokens == b[5:9]
    assert d.propose([req("r3", "z", c[:5])], [4])[0].tokens == c[5:9]


# ---------------------------------------------------------------------------------------------- properties
history_st = st.lists(
    st.tuples(st.sampled_from(["p", "q"]), st.lists(st.integers(0, 5), max_size=30)), max_size=6
)


@FAST
@given(
    history_st,
    st.lists(st.integers(0, 5), max_size=40),
    st.integers(0, 12),
    st.integers(1, 4),
    st.integers(0, 5),
    st.sampled_from([1, 2]),
)
def test_drafts_are_well_formed_continuations_that_occur_in_history(
    history, ctx, budget, width, depth, min_match
):
    d = SuffixTreeDrafter(max_depth=12, min_match_len=min_match, min_token_prob=0.05)
    corpus = []
    for i, (pid, s) in enumerate(history):
        d.finish_request(f"h{i}", pid, s)
        corpus.append(s)
    corpus.append(ctx)  # the request's own tokens are indexed too
    (tree,) = d.propose([req("r", "p", ctx)], [budget], width=width, depth=depth)
    assert_tree_ok(tree, budget, width, depth)
    anchor = ctx[len(ctx) - min_match :]
    for path in paths(tree):
        if width > 1:  # a tree path continues its match in one occurrence
            assert any(occurs(anchor + path, s) for s in corpus), (anchor, path)
        # a chain may re-anchor at the trie depth: each token follows its min_match predecessors somewhere
        full = ctx + path
        for i in range(len(ctx), len(full)):
            assert any(occurs(full[i - min_match : i + 1], s) for s in corpus), (full, i)


@FAST
@given(
    st.lists(st.tuples(st.integers(0, 5), st.lists(st.integers(0, 7), max_size=6)), min_size=1, max_size=25)
)
def test_incremental_state_gives_the_same_drafts_as_a_fresh_drafter(script):
    """Match hints, request tries built by observe(), and checkpoints must not change any draft."""
    rng = random.Random(len(script))
    d = SuffixTreeDrafter(max_depth=10, window_steps=2, global_capacity=4, problem_capacity=3, index_budget=5)
    running: dict[str, list[int]] = {}
    step, nid = 0, 0
    for op, toks in script:
        if op == 0 or not running:  # start a request
            rid, nid = f"r{nid}", nid + 1
            running[rid] = list(toks)
            d.start_request(rid, f"p{nid % 2}", toks)
        elif op == 1:  # finish one
            rid = sorted(running)[0]
            ids = running.pop(rid)
            d.finish_request(rid, f"p{int(rid[1:]) % 2}", ids + toks)
        elif op == 2:
            step += 1
            d.new_step(step)
        else:  # observe + propose for everyone, compared with a drafter restored from a checkpoint
            for rid in running:
                running[rid] += toks
                d.observe(rid, toks)
            reqs = [req(rid, f"p{int(rid[1:]) % 2}", ids) for rid, ids in running.items()]
            budgets = [rng.randrange(0, 9) for _ in reqs]
            width = 1 + op % 2
            fresh = SuffixTreeDrafter(max_depth=10, window_steps=2, global_capacity=4, problem_capacity=3)
            fresh.load_state_dict(pickle.loads(pickle.dumps(d.state_dict())))
            got = d.propose(reqs, budgets, width)
            want = fresh.propose(reqs, budgets, width)
            assert [(t.tokens, t.parents, round(t.score, 9)) for t in got] == [
                (t.tokens, t.parents, round(t.score, 9)) for t in want
            ]


# ---------------------------------------------------------------------------------------------- lifecycle
def test_observe_and_lazy_sync_agree():
    rng = random.Random(0)
    history = [[rng.randrange(8) for _ in range(60)] for _ in range(4)]
    a, b = SuffixTreeDrafter(), SuffixTreeDrafter()
    for i, s in enumerate(history):
        for d in (a, b):
            d.finish_request(f"h{i}", "p", s)
    prompt = [rng.randrange(8) for _ in range(10)]
    a.start_request("r", "p", prompt)
    ids = list(prompt)
    for _ in range(30):
        new = [rng.randrange(8) for _ in range(rng.randrange(1, 4))]
        ids += new
        a.observe("r", new)  # b never sees start_request/observe: it catches up from token_ids
        ta, tb = (d.propose([req("r", "p", ids, len(prompt))], [6])[0] for d in (a, b))
        assert (ta.tokens, ta.score) == (tb.tokens, tb.score)


def test_state_dict_round_trip_is_plain_and_exact():
    rng = random.Random(1)
    cfg = dict(max_depth=16, window_steps=3, global_capacity=8, problem_capacity=4)
    d = SuffixTreeDrafter(**cfg)
    for step in range(5):
        d.new_step(step)
        for g in range(4):
            pid = f"p{rng.randrange(3)}"
            d.start_request(f"s{step}-{g}", pid, [rng.randrange(10) for _ in range(8)])
            d.finish_request(f"s{step}-{g}", pid, [rng.randrange(10) for _ in range(40)])
    d.start_request("live", "p1", [1, 2, 3])
    d.observe("live", [4, 5, 6, 1, 2])
    state = d.state_dict()

    def plain(x) -> bool:
        if isinstance(x, dict):
            return all(isinstance(k, (str, int)) and plain(v) for k, v in x.items())
        if isinstance(x, (list, tuple)):
            return all(plain(v) for v in x)
        return x is None or isinstance(x, (bool, int, float, str))

    assert plain(state)
    restored = SuffixTreeDrafter(**cfg)
    restored.load_state_dict(pickle.loads(pickle.dumps(state)))

    def sizes(x: SuffixTreeDrafter) -> dict:  # node counts may differ: removals leave split runs split
        return {k: v for k, v in x.stats().items() if not k.endswith("_nodes")}

    assert sizes(restored) == sizes(d)
    probes = [req(f"q{i}", f"p{i % 3}", [rng.randrange(10) for _ in range(30)]) for i in range(20)]
    probes.append(req("live", "p1", [1, 2, 3, 4, 5, 6, 1, 2], 3))
    for width in (1, 3):
        got = d.propose(probes, [8] * len(probes), width)
        want = restored.propose(probes, [8] * len(probes), width)
        assert [(t.tokens, t.parents, t.score) for t in got] == [(t.tokens, t.parents, t.score) for t in want]
    d.new_step(6)
    restored.new_step(6)
    assert sizes(restored) == sizes(d)
    with pytest.raises(ValueError):
        restored.load_state_dict({"format": 999})


def test_finished_responses_are_queued_siblings_indexed_at_propose_global_at_flush():
    """``finish_request`` only queues (it runs on the engine's decode thread, also while speculation is off):
    a sibling's response is indexed when a request of its problem proposes, other problems see it after
    ``flush``; ``state_dict`` holds queued responses too, and drafts equal an eager drafter's."""
    resp = unique(1000, 30)
    d = SuffixTreeDrafter()
    d.finish_request("x", "p", resp)
    assert d._problems == {} and d._global.num_seqs == 0  # nothing indexed yet
    assert (
        d.propose([req("r", "p", [7, 8] + resp[:10])], [4])[0].tokens == resp[10:14]
    )  # sibling: indexed now
    assert "p" in d._problems and d._global.num_seqs == 0
    assert d.propose([req("s", "q", [7, 8] + resp[:10])], [4])[0].tokens == []  # other problem: not yet
    state = SuffixTreeDrafter()
    d.finish_request("y", "q", unique(2000, 30))
    state.load_state_dict(d.state_dict())  # flushes: both responses in the checkpoint
    assert len(state.state_dict()["responses"]) == 2
    assert (
        d.propose([req("s", "q", [7, 8] + resp[:10])], [4])[0].tokens == resp[10:14]
    )  # flushed by state_dict


def test_request_trie_is_built_at_first_propose_not_at_start():
    """``start_request`` keeps the prompt only (indexing it is ~1-2 ms of Python per request, wasted on requests
    never drafted); the first ``propose`` builds the trie, and a request finished without drafting still stores
    its prompt tail with the response."""
    d = SuffixTreeDrafter(max_depth=8)
    prompt = unique(100, 50)
    for i in range(4):
        d.start_request(f"r{i}", "p", prompt)
    assert all(r.trie.num_nodes() <= 1 and not r.trie.seq for r in d._requests.values())
    d.observe("r0", [7, 8])  # nothing to extend yet: propose catches up from token_ids
    (tree,) = d.propose([req("r0", "p", prompt + [7, 8], len(prompt))], [4])
    assert d._requests["r0"].trie.seq == prompt + [7, 8] and d._requests["r0"].trie.num_nodes() > 50
    assert not d._requests["r1"].trie.seq
    resp = unique(1000, 12)
    d.finish_request("r1", "p", resp)  # never drafted
    (tree,) = d.propose([req("r2", "p", prompt, len(prompt))], [5])
    assert (
        tree.tokens == resp[:5]
    )  # the stored response began with the prompt tail (7-token match, re-anchored)


# ---------------------------------------------------------------------------------------------- match choice
def test_one_token_match_drafts():
    def build(**kw) -> SuffixTreeDrafter:
        d = SuffixTreeDrafter(global_capacity=0, use_request=False, **kw)
        d.finish_request("s", "p", [5, 6, 7, 8, 9, 10, 11])
        return d

    ctx = [40, 41, 7]  # only "7" matches
    (tree,) = build().propose([req("r", "p", ctx)], [8])  # floor(1.0 * 1 + 1.0) = 2 tokens
    assert tree.tokens == [8, 9] and tree.score == pytest.approx(2.0)
    assert build(beta=0.0).propose([req("r", "p", ctx)], [8])[0].tokens == [8]
    assert build(min_match_len=2).propose([req("r", "p", ctx)], [8])[0].tokens == []


def test_best_score_over_match_lengths_can_choose_a_shorter_match():
    d = SuffixTreeDrafter(global_capacity=0, use_request=False)
    for i, s in enumerate([[9, 1, 2, 50], [9, 1, 2, 60]] + [[1, 2, 70, 71]] * 3):
        d.finish_request(f"s{i}", "p", s)
    # longest match "9 1 2" (2 occurrences): 50 or 60, score 1/2; "1 2" (5 occurrences): 70 71 at 3/5 each
    (tree,) = d.propose([req("r", "p", [8, 9, 1, 2])], [8])
    assert tree.tokens == [70, 71] and tree.score == pytest.approx(1.2)
    # without the shorter candidates' advantage (a single 70 71 sibling), the longest match wins
    e = SuffixTreeDrafter(global_capacity=0, use_request=False)
    for i, s in enumerate([[9, 1, 2, 50], [9, 1, 2, 60], [1, 2, 70, 71]]):
        e.finish_request(f"s{i}", "p", s)
    (tree,) = e.propose([req("r", "p", [8, 9, 1, 2])], [8])
    assert tree.tokens == [50] and tree.score == pytest.approx(0.5)


def test_chain_budget_up_to_and_past_max_depth_is_used():
    d = SuffixTreeDrafter(global_capacity=0)  # max_depth 32
    resp = unique(1000, 200)
    d.finish_request("s", "p", resp)
    ctx = [7] + resp[:40]
    t8, t16, t32, t48 = (d.propose([req("r", "p", ctx)], [k])[0] for k in (8, 16, 32, 48))
    assert t8.tokens == resp[40:48] and t16.tokens == resp[40:56]
    # longer than K=16's: a 31-token match (L <= D - 1) allows floor(1.0 * 31 + 1.0) = 32 tokens, re-anchored at D
    assert t32.tokens == resp[40:72] and t32.score == pytest.approx(32.0)
    assert t48.tokens == resp[40:72]
    assert len(SuffixTreeDrafter(global_capacity=0, beta=40.0).propose([req("r", "p", ctx)], [48])[0]) == 0
    e = SuffixTreeDrafter(global_capacity=0, beta=40.0)
    e.finish_request("s", "p", resp)
    assert e.propose([req("r", "p", ctx)], [48])[0].tokens == resp[40:88]


def test_global_capacity_counts_responses_not_tokens():
    d = SuffixTreeDrafter(global_capacity=2, problem_capacity=0, use_request=False)
    big, a, b = unique(10_000, 3000), unique(1000, 5), unique(2000, 5)
    d.finish_request("x", "p0", big)
    d.finish_request("y", "p1", a)
    d.flush()
    assert d.stats()["global_responses"] == 2 and d.stats()["global_tokens"] == 3005  # 3005 tokens stay
    d.finish_request("z", "p2", b)
    s = d.stats()
    assert s["global_responses"] == 2 and s["global_tokens"] == 10
    assert d.propose([req("r", "q", big[:5])], [4])[0].tokens == []
    assert d.propose([req("r2", "q", a[:2])], [2])[0].tokens == a[2:4]


# ---------------------------------------------------------------------------------------------- bounded indexing
def test_long_sibling_is_indexed_a_bounded_number_of_suffixes_per_propose():
    budget = 64
    resp = [7 + (i * 7919) % 50_000 for i in range(1000)]  # distinct tokens
    d = SuffixTreeDrafter(index_budget=budget, global_capacity=0)
    eager = SuffixTreeDrafter(global_capacity=0)
    for x in (d, eager):
        x.start_request("s", "p", [1, 2, 3])
        x.finish_request("s", "p", resp)  # stored with the prompt tail [1, 2, 3]: 1003 suffixes
    eager.flush()
    ctx = [1, 2, 3] + resp[:2]
    works, drafts = [], []
    for _ in range(30):
        tree, _ = d.propose([req("r", "p", ctx, 3), req("r2", "p", ctx, 3)], [8, 8])
        works.append(d.last_index_work)
        drafts.append(tree.tokens)
        if not works[-1]:
            break
    assert max(works) == budget and works[-1] == 0  # per propose call, over all its requests
    assert sum(works) == 1003 and len(works) == 1003 // budget + 2
    assert (
        drafts[0] == resp[2:8]
    )  # the beginning is indexed first: a 5-token match, floor(1.0 * 5 + 1.0) tokens
    assert d.propose([req("r", "p", ctx + resp[2:400])], [8])[0].tokens == resp[400:408]
    want = eager.propose([req("q", "p", ctx + resp[2:900])], [8])[0]
    got = d.propose([req("q", "p", ctx + resp[2:900])], [8])[0]
    assert (got.tokens, got.score) == (want.tokens, want.score) and got.tokens == resp[900:908]
    # a budget-0 request (speculation off) does no indexing; a short sibling is whole at the next propose
    d.finish_request("t", "p", unique(100_000, 10))
    d.propose([req("r", "p", ctx)], [0])
    assert d.last_index_work == 0
    assert d.propose([req("r", "p", [100_003, 100_004])], [2])[0].tokens == unique(100_005, 2)
    assert d.last_index_work == 10


@FAST
@given(
    st.lists(st.tuples(st.integers(0, 3), st.lists(st.integers(0, 5), max_size=12)), min_size=1, max_size=25),
    st.integers(1, 6),
)
def test_partial_indexing_and_match_hints_never_change_a_draft(script, index_budget):
    """Two drafters get the same calls (so queued siblings are indexed alike); the twin proposes under a new
    request id every time (no match hints, request trie rebuilt), and a third drafter restored from a
    checkpoint of the first (fully indexed) must agree after both flush."""
    cfg = dict(max_depth=8, global_capacity=3, problem_capacity=2, index_budget=index_budget)
    d, twin = SuffixTreeDrafter(**cfg), SuffixTreeDrafter(**cfg)
    ctx: list[int] = []
    n = 0
    for op, toks in script:
        if op == 0:
            for x in (d, twin):
                x.finish_request(f"s{n}", "p", toks)
            n += 1
        elif op == 1:
            for x in (d, twin):
                x.finish_request(f"s{n}", "q", toks)
                x.flush()
            n += 1
        else:
            ctx = ctx + toks
            n += 1
            got = d.propose([req("r", "p", ctx)], [op * 3])[0]
            want = twin.propose([req(f"t{n}", "p", ctx)], [op * 3])[0]
            assert (got.tokens, round(got.score, 9)) == (want.tokens, round(want.score, 9))
            assert d.last_index_work == twin.last_index_work <= index_budget


@FAST
@given(st.integers(2, 7), st.lists(seq_st, min_size=1, max_size=5), st.data())
def test_trie_ranges_of_suffixes_compose(depth, seqs, data):
    """Indexing a sequence in consecutive ranges of suffix starts equals indexing it at once; removal too."""
    t = SuffixTrie(depth)
    seqs = [s for s in seqs if s]
    for s in seqs:
        cut = data.draw(st.integers(0, len(s)))
        t.insert(s, 0, cut)
        t.insert(s, cut)
    assert trie_counts(t) == brute_counts(seqs, depth) and t.num_seqs == len(seqs)
    if not seqs:
        return
    s = seqs[0]
    cut = data.draw(st.integers(0, len(s)))
    t.remove(s, cut)
    t.remove(s, 0, cut)
    assert trie_counts(t) == brute_counts(seqs[1:], depth) and t.num_tokens == sum(map(len, seqs[1:]))
