"""The embedded default policy through our engine.

* format: at temperature 0.9, >= 80% of 200 responses to GSM8K test questions end with '#### <number>', and
  the response lengths have a long tail (printed next to the reference solutions' with -s);
* lossless, greedy: speculative output equals plain output token for token for every drafter (suffix chain and
  tree, n-gram, learned chain and tree, and the hybrid of suffix + learned), on 100 GSM8K test prompts.
"""

from __future__ import annotations

import numpy as np
import pytest
from tokenizers import Tokenizer

from services.pipeline.base_model_eval import has_final_answer_format
from services.pipeline.datasets import format_prompt, load_gsm8k
from services.rollout_actor.engine import Engine, GenerationRequest, SamplingParams
from services.rollout_actor.model import Transformer
from services.rollout_actor.speculative.eagle import EagleDrafter
from services.rollout_actor.speculative.eagle_model import EagleConfig
from services.rollout_actor.speculative.hybrid import HybridDrafter
from services.rollout_actor.speculative.ngram import NgramDrafter
from services.rollout_actor.speculative.strategy import FixedStrategy, Strategy
from services.rollout_actor.speculative.suffix_tree import SuffixTreeDrafter
from tests.conftest import BASE_POLICY, GSM8K_DIR


@pytest.fixture(scope="module")
def policy():
    return Transformer.from_pretrained(BASE_POLICY), Tokenizer.from_file(str(BASE_POLICY / "tokenizer.json"))


@pytest.fixture(scope="module")
def test_questions():
    return load_gsm8k(GSM8K_DIR / "test.jsonl")


def test_format_rate_and_long_tail(policy, test_questions):
    model, tok = policy
    ex = test_questions[:200]
    eng = Engine(model, max_batch_size=64, max_seq_len=1024, tokenizer=tok)
    reqs = [
        GenerationRequest(
            str(i), tok.encode(format_prompt(e.question)).ids, SamplingParams(0.9, max_new_tokens=320, seed=i)
        )
        for i, e in enumerate(ex)
    ]
    outs = eng.generate(reqs)
    rate = float(np.mean([has_final_answer_format(o.text) for o in outs]))
    lens = np.array([len(o.token_ids) for o in outs])
    ref = np.array([len(tok.encode(" " + e.answer.strip()).ids) + 1 for e in ex])
    q = lambda a: (np.percentile(a, 50), np.percentile(a, 90), a.max())  # noqa: E731
    print(f"\nformat rate {rate:.3f}; response length p50/p90/max {q(lens)}; reference {q(ref)}")
    assert rate >= 0.80
    p50, p90, mx = q(lens)
    assert p90 >= 1.4 * p50 and mx >= 2.5 * p50, "no long tail in the response lengths"


def _greedy(model, tok, questions, drafters=None, strategy=None, hidden_layers=()):
    eng = Engine(
        model,
        max_batch_size=64,
        max_seq_len=1024,
        tokenizer=tok,
        drafters=drafters or {},
        selector=FixedStrategy(strategy or Strategy()),
        hidden_layers=hidden_layers,
    )
    reqs = [
        GenerationRequest(
            str(i),
            tok.encode(format_prompt(e.question)).ids,
            SamplingParams(0.0, max_new_tokens=160),
            problem_id=str(i % 25),
        )
        for i, e in enumerate(questions)
    ]
    return eng.generate(reqs)


def _learned(model, fuse=None):
    return EagleDrafter(model, config=EagleConfig(fuse_layers=fuse, seed=0))


CASES = {
    "suffix-chain": (lambda m: {"suffix": SuffixTreeDrafter()}, Strategy("suffix", 8)),
    "suffix-tree": (
        lambda m: {"suffix": SuffixTreeDrafter()},
        Strategy("suffix", 16, tree_width=3, tree_depth=6),
    ),
    "ngram": (lambda m: {"ngram": NgramDrafter()}, Strategy("ngram", 5)),
    "learned-chain": (lambda m: {"learned": _learned(m)}, Strategy("learned", 4)),
    "learned-tree": (lambda m: {"learned": _learned(m)}, Strategy("learned", 8, tree_width=2, tree_depth=4)),
    "hybrid": (
        lambda m: {"hybrid": HybridDrafter(SuffixTreeDrafter(), _learned(m), threshold=1.0)},
        Strategy("hybrid", 6),
    ),
}


@pytest.fixture(scope="module")
def plain_greedy(policy, test_questions):
    model, tok = policy
    return _greedy(model, tok, test_questions[:100])


@pytest.mark.parametrize("case", sorted(CASES))
def test_greedy_speculation_equals_plain_on_gsm8k(policy, test_questions, plain_greedy, case):
    model, tok = policy
    make, strategy = CASES[case]
    drafters = make(model)
    layers = next(
        (d.required_hidden_layers for d in drafters.values() if hasattr(d, "required_hidden_layers")), ()
    )
    spec = _greedy(model, tok, test_questions[:100], drafters, strategy, layers)
    assert len(spec) == 100
    mismatched = [i for i, (a, b) in enumerate(zip(spec, plain_greedy)) if a.token_ids != b.token_ids]
    assert not mismatched, f"{case}: outputs differ from plain decoding for prompts {mismatched[:5]}"
    assert sum(o.spec.drafted for o in spec) > 0
