"""Trace replay and the KV-cache limit, through ``Engine.generate``.

* Replay: a request with ``reference`` emits exactly that trace then EOS, for every deterministic drafter and
  strategy (chains, trees, adversarial, an oracle that always drafts the trace), greedy and sampled; drafts are
  accepted iff they match the trace; requests without a reference decode exactly as they do without replay
  requests beside them; a sampled draft for a replay request is refused.
* KV limit: a request whose prompt + max_new_tokens + 1 fills ``max_seq_len`` decodes next to batch-mates
  drafting their whole budget, for every drafter and tree shape, with and without draft headroom: no overflow,
  and the same tokens as plain decoding.
"""

from __future__ import annotations

import random

import pytest
import torch

from services.rollout_actor.engine import Engine, GenerationRequest, SamplingParams
from services.rollout_actor.model import Transformer, init_weights
from services.rollout_actor.speculative.base import Drafter, DraftTree
from services.rollout_actor.speculative.ngram import NgramDrafter
from services.rollout_actor.speculative.strategy import FixedStrategy, Strategy
from services.rollout_actor.speculative.suffix_tree import SuffixTreeDrafter
from tests.conftest import tiny_config
from tests.rollout_actor.test_engine_speculative import FixedTokensDrafter, RandomSampledDrafter

V = 16
EOS = 1


@pytest.fixture(scope="module")
def model():
    return init_weights(Transformer(tiny_config(vocab_size=V)), seed=0, std=0.5).eval()


class OracleDrafter(Drafter):
    """Drafts the trace's true continuation (a chain; a tree adds a wrong sibling under every true node)."""

    name = "oracle"

    def __init__(self, traces: dict[str, list[int]]):
        self.traces = traces

    def propose(self, requests, max_tokens, width=1, depth=0):
        out = []
        for r, k in zip(requests, max_tokens):
            done = len(r.token_ids) - r.num_prompt_tokens
            nxt = (self.traces[r.request_id] + [EOS])[done : done + k]
            if width == 1:
                out.append(DraftTree.chain(nxt))
                continue
            tree = DraftTree()
            parent = -1
            for tok in nxt:
                if len(tree) + 2 > k:
                    break
                tree.tokens += [(tok + 1) % V or 2, tok]  # a wrong sibling first, then the true token
                tree.parents += [parent, parent]
                parent = len(tree) - 1
            out.append(tree)
        return out


class FullBudgetDrafter(Drafter):
    """Always drafts its whole budget (repeats of the last token), as a chain or as a width-2 tree."""

    name = "full"

    def propose(self, requests, max_tokens, width=1, depth=0):
        out = []
        for r, k in zip(requests, max_tokens):
            t = r.token_ids[-1]
            if width == 1:
                out.append(DraftTree.chain([t] * k))
            else:
                out.append(
                    DraftTree([(t + i) % V for i in range(k)], [-1 if i < 2 else i - 2 for i in range(k)])
                )
        return out


def _traces(n: int, seed: int = 0) -> list[list[int]]:
    """Sibling-like traces: one motif with a few random edits each, lengths 10-40, no EOS inside."""
    rng = random.Random(seed)
    motif = [rng.randrange(2, V) for _ in range(40)]
    out = []
    for _ in range(n):
        t = list(motif[: rng.randrange(10, 41)])
        for _ in range(3):
            t[rng.randrange(len(t))] = rng.randrange(2, V)
        out.append(t)
    return out


def _replay_requests(traces, temperature: float, problem: str = "p"):
    return [
        GenerationRequest(
            f"r{i}",
            [3, 5, 7 + i % 3],
            SamplingParams(temperature, max_new_tokens=48, seed=10 + i),
            problem_id=problem,
            reference=t,
        )
        for i, t in enumerate(traces)
    ]


STRATEGIES = [
    (Strategy("off"), None),
    (Strategy("suffix", 6), SuffixTreeDrafter()),
    (Strategy("suffix", 8, tree_width=2, tree_depth=4), SuffixTreeDrafter()),
    (Strategy("ngram", 4), NgramDrafter(max_ngram=3, min_ngram=1)),
    (Strategy("adversarial", 4), FixedTokensDrafter(0, "adversarial")),
    (Strategy("full", 5, tree_width=2), FullBudgetDrafter()),
]


@pytest.mark.parametrize("temperature", [0.0, 0.9])
@pytest.mark.parametrize("strategy, drafter", STRATEGIES, ids=[s.name for s, _ in STRATEGIES])
def test_replay_emits_the_trace_for_every_drafter(model, strategy, drafter, temperature):
    traces = _traces(8)
    drafters = {strategy.drafter: drafter} if drafter is not None else {}
    eng = Engine(model, max_batch_size=4, max_seq_len=64, eos_token_ids=[EOS], drafters=drafters)
    eng.selector = FixedStrategy(strategy)
    outs = eng.generate(_replay_requests(traces, temperature))
    for o, t in zip(outs, traces):
        assert o.token_ids == t + [EOS] and o.finish_reason == "eos"
        assert len(o.logprobs) == len(o.token_ids) and all(lp <= 0 for lp in o.logprobs)
    if strategy.drafter in ("suffix", "ngram"):  # siblings make the traces predictable: drafts got accepted
        assert sum(o.spec.accepted for o in outs) > 0
    if strategy.drafter == "adversarial":  # token 0 never occurs in a trace: nothing is accepted
        assert sum(o.spec.drafted for o in outs) > 0 and sum(o.spec.accepted for o in outs) == 0


@pytest.mark.parametrize("width", [1, 2])
def test_replay_accepts_a_draft_iff_it_matches_the_trace(model, width):
    traces = _traces(4, seed=1)
    oracle = OracleDrafter({f"r{i}": t for i, t in enumerate(traces)})
    k = 4
    eng = Engine(model, max_batch_size=4, max_seq_len=64, eos_token_ids=[EOS], drafters={"oracle": oracle})
    eng.selector = FixedStrategy(Strategy("oracle", k, tree_width=width, tree_depth=k))
    outs = eng.generate(_replay_requests(traces, 0.9))
    for o, t in zip(outs, traces):
        assert o.token_ids == t + [EOS]
        if width == 1:  # every drafted token is the trace's: all accepted, k + 1 tokens per step
            assert o.spec.accepted == o.spec.drafted > 0
            assert o.timings.decode_steps == -(-(len(t) + 1 - 1) // (k + 1))
        else:  # exactly the true child of each pair is accepted
            assert o.spec.accepted * 2 == o.spec.drafted > 0


def test_replay_leaves_requests_without_a_reference_unchanged(model):
    def sampled(i):
        return GenerationRequest(f"s{i}", [2, 4 + i, 6], SamplingParams(0.9, max_new_tokens=30, seed=500 + i))

    for strategy, drafter in STRATEGIES[:4]:
        drafters = {strategy.drafter: drafter} if drafter is not None else {}

        def engine(drafters=drafters):
            return Engine(model, max_batch_size=8, max_seq_len=64, eos_token_ids=[EOS], drafters=drafters)

        alone = engine().generate([sampled(i) for i in range(4)])
        eng = engine()
        eng.selector = FixedStrategy(strategy)
        mixed = eng.generate([sampled(i) for i in range(4)] + _replay_requests(_traces(4), 0.9))
        plain_alone = [o.token_ids for o in alone]
        assert [o.token_ids for o in mixed[:4]] == plain_alone, strategy.name
        assert all(o.token_ids != t + [EOS] for o, t in zip(mixed[:4], _traces(4)))


def test_replay_refuses_sampled_drafts(model):
    eng = Engine(
        model,
        max_batch_size=2,
        max_seq_len=64,
        eos_token_ids=[EOS],
        drafters={"random": RandomSampledDrafter(0, vocab=V)},
        selector=FixedStrategy(Strategy("random", 3)),
    )
    with pytest.raises(ValueError, match="trace replay takes deterministic drafts only"):
        eng.generate(_replay_requests(_traces(2), 0.9))


def test_replay_checks_the_trace_against_the_vocabulary(model):
    eng = Engine(model, max_batch_size=2, max_seq_len=64, eos_token_ids=[EOS])
    bad = GenerationRequest("x", [2, 3], SamplingParams(0.0, max_new_tokens=8), reference=[2, V + 3])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        eng.add_request(bad)


LIMIT_DRAFTERS = [
    (Strategy("full", 16), FullBudgetDrafter()),
    (Strategy("full", 16, tree_width=2, tree_depth=8), FullBudgetDrafter()),
    (Strategy("suffix", 16), SuffixTreeDrafter()),
    (Strategy("suffix", 16, tree_width=3, tree_depth=6), SuffixTreeDrafter()),
    (Strategy("ngram", 16), NgramDrafter(max_ngram=3, min_ngram=1)),
]


@pytest.mark.parametrize("headroom", [0, 64])
@pytest.mark.parametrize("strategy, drafter", LIMIT_DRAFTERS, ids=[s.name for s, _ in LIMIT_DRAFTERS])
def test_requests_at_the_cache_limit_beside_long_drafts(model, strategy, drafter, headroom):
    """Prompt length max_seq_len - max_new_tokens - 1 (the request fills its slot exactly) next to short-prompt
    batch-mates drafting at the maximum budget: no KV overflow, the same tokens as plain decoding."""
    max_seq_len, max_new = 96, 40
    g = torch.Generator().manual_seed(3)
    long_prompt = torch.randint(2, V, (max_seq_len - max_new - 1,), generator=g).tolist()

    def reqs():
        out = [GenerationRequest("long", long_prompt, SamplingParams(0.0, max_new_tokens=max_new), "a")]
        for i in range(3):
            p = SamplingParams(0.0, max_new_tokens=max_new)
            out.append(GenerationRequest(f"short{i}", [2 + i, 5, 9, 5, 9], p, "b"))
        return out

    plain = Engine(model, max_batch_size=4, max_seq_len=max_seq_len, eos_token_ids=[])
    eng = Engine(
        model,
        max_batch_size=4,
        max_seq_len=max_seq_len,
        eos_token_ids=[],
        drafters={strategy.drafter: drafter},
        selector=FixedStrategy(strategy),
        draft_headroom=headroom,
    )
    want = [o.token_ids for o in plain.generate(reqs())]
    got = eng.generate(reqs())
    assert [o.token_ids for o in got] == want
    assert [len(o.token_ids) for o in got] == [max_new] * 4
    assert sum(o.spec.drafted for o in got) > 0
