"""Losslessness of the engine's speculative path (KV rollback, tree masks, verification) end to end.

* greedy: speculative output equals plain output token for token, for every drafter, chains and trees;
* sampling: the joint distribution of the first three generated tokens of a tiny model (vocabulary 6, so 216
  outcomes) is computed EXACTLY from the model; 20,000 speculative samples per drafter are tested against it
  with a chi-square goodness-of-fit test (p > 1e-4 passes; under losslessness a false alarm has probability
  1e-4 per case). Plain sampling is tested the same way, and a deliberately biased sampler must FAIL it, which
  shows the test has power.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

from services.rollout_actor.engine import Engine, GenerationRequest, SamplingParams
from services.rollout_actor.model import Transformer, init_weights
from services.rollout_actor.sampling import processed_probs
from services.rollout_actor.speculative.base import Drafter, DraftRequest, DraftTree
from services.rollout_actor.speculative.ngram import NgramDrafter
from services.rollout_actor.speculative.strategy import FixedStrategy, Strategy
from services.rollout_actor.speculative.suffix_tree import SuffixTreeDrafter
from tests.conftest import tiny_config

V = 6
PROMPT = [1, 4, 2]


class RandomSampledDrafter(Drafter):
    """Sampled drafts: every node's children drawn i.i.d. from a fixed random q (its probs are reported)."""

    name = "random"

    def __init__(self, seed=0, vocab=V):
        self.g = torch.Generator().manual_seed(seed)
        # q[parent_token] -> [vocab], a fixed random draft distribution per parent token
        self.q = torch.distributions.Dirichlet(torch.ones(vocab)).sample((vocab,))

    def propose(self, requests, max_tokens, width=1, depth=0):
        out = []
        for r, k in zip(requests, max_tokens):
            tree = DraftTree(iid_siblings=True)
            probs = []
            frontier = [(-1, r.token_ids[-1])]
            while frontier and len(tree) < k:
                parent, tok = frontier.pop(0)
                q = self.q[tok]
                for _ in range(width):
                    if len(tree) >= k:
                        break
                    x = int(torch.multinomial(q, 1, generator=self.g))
                    tree.tokens.append(x)
                    tree.parents.append(parent)
                    probs.append(q)
                    frontier.append((len(tree) - 1, x))
            tree.probs = torch.stack(probs) if probs else None
            out.append(tree)
        return out


class FixedTokensDrafter(Drafter):
    """Deterministic drafts of one token repeated (``adversarial``: the target's least likely token; ``wrong``:
    a token the target never emits because top-k removed it)."""

    def __init__(self, token: int, name: str):
        self.token, self.name = token, name

    def propose(self, requests, max_tokens, width=1, depth=0):
        out = []
        for k in max_tokens:
            if width == 1:
                out.append(DraftTree.chain([self.token] * k))
            else:  # two siblings at the root, then a chain under the first
                toks = [self.token, (self.token + 1) % V][:k]
                parents = [-1, -1][: len(toks)]
                while len(toks) < k:
                    parents.append(0 if len(toks) == 2 else len(toks) - 1)
                    toks.append(self.token)
                out.append(DraftTree(toks, parents))
        return out


@pytest.fixture(scope="module")
def model():
    return init_weights(Transformer(tiny_config(vocab_size=V)), seed=3, std=0.6).eval()


def exact_joint(model, temperature, top_k) -> dict[tuple, float]:
    out = {}
    with torch.no_grad():
        for seq in itertools.product(range(V), repeat=3):
            ids = torch.tensor([PROMPT + list(seq[:2])])
            p = processed_probs(model(ids).logits[0, -3:], temperature, top_k)
            out[seq] = float(p[0, seq[0]] * p[1, seq[1]] * p[2, seq[2]])
    return out


def sample_joint(model, drafter, strategy, n, temperature, top_k, seed=0) -> dict[tuple, int]:
    drafters = {drafter.name: drafter} if drafter is not None else {}
    eng = Engine(
        model,
        max_batch_size=256,
        max_seq_len=32,
        eos_token_ids=[],
        drafters=drafters,
        selector=FixedStrategy(strategy),
    )
    params = lambda i: SamplingParams(temperature, top_k=top_k, max_new_tokens=6, seed=seed * 10**6 + i)  # noqa: E731
    outs = eng.generate([GenerationRequest(str(i), PROMPT, params(i), "p") for i in range(n)])
    counts: dict[tuple, int] = {}
    for o in outs:
        key = tuple(o.token_ids[:3])
        counts[key] = counts.get(key, 0) + 1
    drafted = sum(o.spec.drafted for o in outs)
    assert drafter is None or drafted > 0, "the drafter never proposed: the test would prove nothing"
    return counts


def chi_square_pvalue(counts, probs, n) -> float:
    # pool cells with expected count < 5 into one (standard practice for the chi-square approximation)
    stat, df, pooled_e, pooled_o = 0.0, -1, 0.0, 0
    for k, p in probs.items():
        e, o = n * p, counts.get(k, 0)
        if p == 0:
            assert o == 0, f"outcome {k} has probability 0 but was sampled {o} times"
            continue
        if e < 5:
            pooled_e, pooled_o = pooled_e + e, pooled_o + o
            continue
        stat += (o - e) ** 2 / e
        df += 1
    if pooled_e > 0:
        stat += (pooled_o - pooled_e) ** 2 / pooled_e
        df += 1
    return float(
        torch.special.gammaincc(
            torch.tensor(df / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64)
        )
    )


N = 20_000
CASES = [
    ("plain", None, Strategy()),
    ("random-chain", RandomSampledDrafter(1), Strategy("random", 3)),
    ("random-tree", RandomSampledDrafter(2), Strategy("random", 4, tree_width=2)),
    ("adversarial-chain", "adversarial", Strategy("adversarial", 3)),
    ("always-wrong-tree", "wrong", Strategy("wrong", 4, tree_width=2)),
    ("ngram", NgramDrafter(max_ngram=2, min_ngram=1), Strategy("ngram", 3)),
    ("suffix-tree", SuffixTreeDrafter(), Strategy("suffix", 4, tree_width=2)),
]


FAST = [("random-tree", 0.9, 0), ("always-wrong-tree", 1.3, 4), ("suffix-tree", 0.9, 0)]
FULL = [(c[0], t, k) for c in CASES for t, k in ((0.9, 0), (1.3, 4)) if (c[0], t, k) not in FAST]


def _check_case(model, name, temperature, top_k):
    _, drafter, strategy = next(c for c in CASES if c[0] == name)
    probs = exact_joint(model, temperature, top_k)
    if drafter in ("adversarial", "wrong"):
        with torch.no_grad():
            p0 = processed_probs(model(torch.tensor([PROMPT])).logits[0, -1], temperature, top_k)
        # adversarial: the least likely token the target can emit; wrong: one it never emits (p = 0)
        allowed = torch.where(p0 > 0, p0, torch.full_like(p0, 2.0))
        tok = int(p0.argmin()) if drafter == "wrong" else int(allowed.argmin())
        drafter = FixedTokensDrafter(tok, strategy.drafter)
    counts = sample_joint(model, drafter, strategy, N, temperature, top_k, seed=sum(map(ord, name)))
    assert chi_square_pvalue(counts, probs, N) > 1e-4


@pytest.mark.parametrize("name, temperature, top_k", FAST)
def test_sampling_distribution_is_exact(model, name, temperature, top_k):
    _check_case(model, name, temperature, top_k)


@pytest.mark.slow
@pytest.mark.parametrize("name, temperature, top_k", FULL)
def test_sampling_distribution_is_exact_all_drafters(model, name, temperature, top_k):
    _check_case(model, name, temperature, top_k)


def test_chi_square_has_power(model):
    """A sampler that is slightly off (temperature 0.9 sampled, 1.0 claimed) must be rejected."""
    probs = exact_joint(model, 1.0, 0)
    counts = sample_joint(model, None, Strategy(), N, 0.9, 0)
    assert chi_square_pvalue(counts, probs, N) < 1e-4


def _plain_and_spec(m, params: SamplingParams, n: int, strategy: Strategy, drafter):
    """The same n requests (3-token prompts over a 16-token vocabulary, problem ids mod 3) decoded plainly and
    with ``strategy``; request i gets seed ``params.seed + i``. Returns (plain outputs, speculative outputs)."""

    def reqs():
        return [
            GenerationRequest(
                str(i),
                [i % 16, (i * 3) % 16, 5],
                dataclasses.replace(params, seed=None if params.seed is None else params.seed + i),
                problem_id=str(i % 3),
            )
            for i in range(n)
        ]

    plain = Engine(m, max_batch_size=4, max_seq_len=128, eos_token_ids=[]).generate(reqs())
    eng = Engine(
        m,
        max_batch_size=4,
        max_seq_len=128,
        eos_token_ids=[],
        drafters={strategy.drafter: drafter},
        selector=FixedStrategy(strategy),
    )
    return plain, eng.generate(reqs())


@pytest.mark.parametrize(
    "strategy, drafter",
    [
        (Strategy("ngram", 4), NgramDrafter()),
        (Strategy("suffix", 6), SuffixTreeDrafter()),
        (Strategy("suffix", 8, tree_width=2, tree_depth=4), SuffixTreeDrafter()),
        (Strategy("random", 5, tree_width=2), RandomSampledDrafter(5, vocab=16)),
        (Strategy("adversarial", 4), FixedTokensDrafter(0, "adversarial")),
    ],
)
def test_greedy_speculation_equals_plain(strategy, drafter):
    m = init_weights(Transformer(tiny_config(vocab_size=16)), seed=0, std=0.5).eval()
    plain, spec = _plain_and_spec(m, SamplingParams(0.0, max_new_tokens=40), 12, strategy, drafter)
    assert [o.token_ids for o in spec] == [o.token_ids for o in plain]
    assert sum(o.spec.drafted for o in spec) > 0
    for a, b in zip(spec, plain):  # logprobs are those of the target, whatever path produced the token
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


@pytest.mark.parametrize(
    "strategy, drafter",
    [
        (Strategy("ngram", 4), NgramDrafter(max_ngram=2, min_ngram=1)),
        (Strategy("suffix", 6), SuffixTreeDrafter()),
        (Strategy("suffix", 8, tree_width=2, tree_depth=4), SuffixTreeDrafter()),
        (Strategy("adversarial", 4), FixedTokensDrafter(0, "adversarial")),
    ],
)
def test_sampling_with_a_deterministic_drafter_emits_plain_tokens(strategy, drafter):
    """Coupled verification + one uniform per output position: at temperature 0.9 with top-k, a deterministic
    drafter changes how many steps a response takes, not its tokens. Float round-off between the verify and
    decode forwards could flip a token whose uniform sits on a CDF boundary; at these sizes none does, and the
    assertion allows one response in 24 to diverge after a common prefix."""
    m = init_weights(Transformer(tiny_config(vocab_size=16)), seed=0, std=0.5).eval()
    params = SamplingParams(0.9, top_k=12, max_new_tokens=40, seed=100)
    plain, spec = _plain_and_spec(m, params, 24, strategy, drafter)
    same = sum(a.token_ids == b.token_ids for a, b in zip(spec, plain))
    assert same >= len(plain) - 1, same
    assert sum(o.spec.drafted for o in spec) > 0
    if strategy.drafter != "adversarial":
        assert sum(o.spec.accepted for o in spec) > 0  # speculation really took steps off


def test_sampled_drafts_keep_the_sequential_rule():
    """Sampled drafts (probs set) are verified by the sequential rule with fresh uniforms: lossless (see the
    chi-square cases), but not token-identical to plain decoding: the control that the identity above comes
    from the coupling, not from drafts that are never accepted."""
    m = init_weights(Transformer(tiny_config(vocab_size=V)), seed=0, std=0.5).eval()
    reqs = [
        GenerationRequest(str(i), PROMPT, SamplingParams(0.9, max_new_tokens=30, seed=i)) for i in range(16)
    ]
    plain = Engine(m, max_batch_size=4, max_seq_len=128, eos_token_ids=[]).generate(reqs)
    spec = Engine(
        m,
        max_batch_size=4,
        max_seq_len=128,
        eos_token_ids=[],
        drafters={"random": RandomSampledDrafter(3)},
        selector=FixedStrategy(Strategy("random", 3)),
    ).generate(reqs)
    assert sum(o.spec.accepted for o in spec) > 0
    assert sum(a.token_ids != b.token_ids for a, b in zip(spec, plain)) >= 8


def test_draft_request_carries_context():
    seen = []

    class Spy(Drafter):
        name = "spy"

        def propose(self, requests, max_tokens, width=1, depth=0):
            seen.extend(requests)
            return [DraftTree() for _ in requests]

    m = init_weights(Transformer(tiny_config()), seed=0).eval()
    Engine(m, eos_token_ids=[], drafters={"spy": Spy()}, selector=FixedStrategy(Strategy("spy", 2))).generate(
        [GenerationRequest("a", [3, 4], SamplingParams(0.0, max_new_tokens=4), "prob")]
    )
    assert (
        isinstance(seen[0], DraftRequest) and seen[0].problem_id == "prob" and seen[0].token_ids[:2] == [3, 4]
    )
    assert [len(r.token_ids) for r in seen] == [3, 4, 5]
