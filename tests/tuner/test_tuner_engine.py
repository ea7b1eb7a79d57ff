"""The tuner on the real engine and the base policy, timed by a cost model instead of the wall clock.

A decode step costs ``BASE + PER_TOKEN * (active batch + draft tokens)`` model-milliseconds (a fixed launch
overhead plus the verified tokens: what a memory/overhead-bound decoder pays). The engine decodes the same
GSM8K workload (8 requests per prompt) with every fixed arm and with the tuner, which sees only these modeled
step times, learning over a few rounds. Decoding is greedy, so every arm produces exactly the same tokens
(lossless) and only the number of verify steps and draft tokens differs. Asserted (tokens and modeled time):

* batch 4: the tuner's last round is within 10% of the best fixed arm's throughput;
* batch 64: the tuner's best arm for the 64+ bucket is ``off`` or an arm at least as fast as ``off`` there;
* a settled bucket (off best, nothing left to explore) is played under the selector's lease: the engine asks
  ``choose`` about a few steps only, and the tokens are those of plain decoding.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from tokenizers import Tokenizer

from services.pipeline.datasets import format_prompt, load_gsm8k
from services.rollout_actor.drafters import build_drafters
from services.rollout_actor.engine import Engine, GenerationRequest, SamplingParams
from services.rollout_actor.model import Transformer
from services.rollout_actor.speculative.strategy import FixedStrategy, StepObservation, Strategy
from services.tuner.selector import StrategySelector
from services.tuner.service import TunerService
from tests.conftest import BASE_POLICY, GSM8K_DIR

BASE, PER_TOKEN = 5.0, 0.02
ARMS = [
    {"drafter": "off"},
    {"drafter": "suffix", "max_draft_tokens": 4},
    {"drafter": "suffix", "max_draft_tokens": 8},
    {"drafter": "ngram", "max_draft_tokens": 3},
]


def cost(batch: int, drafted: int) -> float:
    return BASE + PER_TOKEN * (batch + drafted)


class Modeled:
    """Wraps a strategy selector: the step's seconds it observes are the cost model's, not the wall clock's;
    counts the steps it is asked about."""

    def __init__(self, inner):
        self.inner = inner
        self.asked = 0

    @property
    def lease(self):
        return self.inner.lease

    def choose(self, requests):
        self.asked += 1
        return self.inner.choose(requests)

    def observe(self, obs: StepObservation):
        # the engine reports every request's draft and accepted lengths (the selector's counterfactual records)
        assert len(obs.draft_lengths) == len(obs.accepted_lengths) == obs.batch_size
        assert (sum(obs.draft_lengths), sum(obs.accepted_lengths)) == (
            obs.drafted_tokens,
            obs.accepted_tokens,
        )
        assert all(0 <= a <= d for a, d in zip(obs.accepted_lengths, obs.draft_lengths))
        self.inner.observe(replace(obs, seconds=cost(obs.batch_size, obs.drafted_tokens) / 1e3))


@pytest.fixture(scope="module")
def setup():
    model = Transformer.from_pretrained(BASE_POLICY)
    tok = Tokenizer.from_file(str(BASE_POLICY / "tokenizer.json"))
    return model, tok, load_gsm8k(GSM8K_DIR / "test.jsonl")


def run(model, tok, questions, selector, batch, n_requests, seed):
    drafters = build_drafters(model)
    eng = Engine(
        model,
        max_batch_size=batch,
        max_seq_len=1024,
        tokenizer=tok,
        drafters=drafters,
        selector=selector if isinstance(selector, Modeled) else Modeled(selector),
    )
    reqs = [
        GenerationRequest(
            f"r{i}",
            tok.encode(format_prompt(questions[i // 8].question)).ids,
            SamplingParams(0.0, max_new_tokens=200, seed=seed + i),
            problem_id=str(i // 8),
        )
        for i in range(n_requests)
    ]
    outs = eng.generate(reqs)
    tokens = sum(len(o.token_ids) for o in outs)
    modeled = sum(cost(s.batch_size, s.drafted) for s in eng.step_log)
    return tokens / modeled, eng, [o.token_ids for o in outs]


@pytest.mark.parametrize("batch, n_requests, rounds", [(4, 8, 4), (64, 64, 3)])
def test_tuner_against_fixed_arms(setup, batch, n_requests, rounds):
    model, tok, questions = setup
    fixed = {}
    for arm in ARMS:
        s = Strategy(arm["drafter"], arm.get("max_draft_tokens", 0))
        fixed[s.name] = run(model, tok, questions, FixedStrategy(s), batch, n_requests, seed=1000)[0]
    tuner = TunerService(ARMS, {"regret_budget": 0.05}, ["suffix", "ngram"])
    selector = StrategySelector(tuner.table(), seed=0, clock="engine")  # the modeled step times
    for _ in range(rounds):  # learn across rounds, as across RL steps
        run(model, tok, questions, selector, batch, n_requests, seed=1000)
        selector.update_table(tuner.merge(selector.drain_observations()))
    thr = run(model, tok, questions, selector, batch, n_requests, seed=1000)[0]  # the fixed arms' workload
    best_name = max(fixed, key=fixed.get)
    print(
        f"\nbatch {batch}: fixed { ({k: round(v, 3) for k, v in fixed.items()}) }, tuner {thr:.3f}, "
        f"best table {[b['best'] for b in tuner.table()['buckets']]}"
    )
    if batch <= 4:
        assert thr >= 0.9 * fixed[best_name], (thr, fixed)
    else:
        b = tuner.bandit.bucket_of(batch)
        chosen = tuner.table()["buckets"][b]["best"]
        med = {a: v["median"] for a, v in tuner.stats()["buckets"][b]["arms"].items() if v["n"]}
        assert chosen == "off" or med[chosen] >= med["off"], (chosen, med)


def test_a_settled_bucket_is_leased_and_decodes_what_plain_decoding_does(setup):
    model, tok, questions = setup
    _, plain, plain_outs = run(model, tok, questions, FixedStrategy(), 8, 8, seed=7)
    # every drafting arm banned everywhere: off is settled in every bucket
    table = TunerService(ARMS, None, ["suffix", "ngram"]).table()
    for b in table["buckets"]:
        b.update(probe=[], explore=[], guarded=[a for a in table["arms"] if a != "off"])
    modeled = Modeled(StrategySelector(table, clock="engine"))
    _, eng, outs = run(model, tok, questions, modeled, 8, 8, seed=7)
    assert outs == plain_outs
    assert [s.batch_size for s in eng.step_log] == [s.batch_size for s in plain.step_log]
    buckets = len({TunerService(ARMS).bandit.bucket_of(s.batch_size) for s in eng.step_log})
    assert modeled.asked <= buckets + len(eng.step_log) // 64  # one per bucket entered (and lease renewal)
    assert modeled.asked < len(eng.step_log) / 4
    assert sum(s.leased for s in eng.step_log) == len(eng.step_log) - modeled.asked
