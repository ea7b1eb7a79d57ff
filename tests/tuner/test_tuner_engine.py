"""The tuner on the real engine and the default policy, timed by a cost model instead of the wall clock.

A decode step costs ``BASE + PER_TOKEN * (active batch + draft tokens)`` model-milliseconds (a fixed launch
overhead plus the verified tokens: what a memory/overhead-bound decoder pays). The engine decodes the same
GSM8K workload (8 requests per prompt) with every fixed arm and with the tuner, which sees only these modeled
step times, learning over a few rounds. Decoding is greedy, so every arm produces exactly the same tokens
(lossless) and only the number of verify steps and draft tokens differs. Asserted (tokens and modeled time):

* batch 4: the tuner's last round is within 10% of the best fixed arm's throughput;
* batch 64: the tuner's best arm for the 64+ bucket is ``off`` or an arm at least as fast as ``off`` there.
"""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer

from services.pipeline.datasets import format_prompt, load_gsm8k
from services.rollout_actor.engine import Engine, GenerationRequest, SamplingParams
from services.rollout_actor.model import Transformer
from services.rollout_actor.speculative.strategy import FixedPolicy, StepObservation, Strategy
from services.rollout_actor.worker import build_drafters
from services.tuner.policy import TunedStrategyPolicy
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
    """Wraps a strategy policy: the step's seconds it observes are the cost model's, not the wall clock's."""

    def __init__(self, inner):
        self.inner = inner

    def choose(self, requests):
        return self.inner.choose(requests)

    def observe(self, obs: StepObservation):
        self.inner.observe(
            StepObservation(
                obs.batch_size,
                obs.strategy,
                obs.committed_tokens,
                obs.drafted_tokens,
                obs.accepted_tokens,
                cost(obs.batch_size, obs.drafted_tokens) / 1e3,
            )
        )


@pytest.fixture(scope="module")
def setup():
    model = Transformer.from_pretrained(BASE_POLICY)
    tok = Tokenizer.from_file(str(BASE_POLICY / "tokenizer.json"))
    return model, tok, load_gsm8k(GSM8K_DIR / "test.jsonl")


def run(model, tok, questions, policy, batch, n_requests, seed):
    drafters = build_drafters(model)
    eng = Engine(
        model,
        max_batch_size=batch,
        max_seq_len=1024,
        tokenizer=tok,
        drafters=drafters,
        policy=Modeled(policy),
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
    return tokens / modeled, eng


@pytest.mark.parametrize("batch, n_requests, rounds", [(4, 8, 4), (64, 64, 3)])
def test_tuner_against_fixed_arms(setup, batch, n_requests, rounds):
    model, tok, questions = setup
    fixed = {}
    for arm in ARMS:
        s = Strategy(arm["drafter"], arm.get("max_draft_tokens", 0))
        fixed[s.name] = run(model, tok, questions, FixedPolicy(s), batch, n_requests, seed=1000)[0]
    tuner = TunerService(ARMS, {"epsilon": 0.05, "min_samples_for_guard": 4}, ["suffix", "ngram"])
    policy = TunedStrategyPolicy(tuner.table(), seed=0, clock="engine")  # the modeled step times
    for _ in range(rounds):  # learn across rounds, as across RL steps
        thr, eng = run(model, tok, questions, policy, batch, n_requests, seed=1000)
        policy.update_table(tuner.merge(policy.drain_observations()))
    thr, _ = run(model, tok, questions, policy, batch, n_requests, seed=1000)  # the fixed arms' workload
    best_name = max(fixed, key=fixed.get)
    print(
        f"\nbatch {batch}: fixed { ({k: round(v, 3) for k, v in fixed.items()}) }, tuner {thr:.3f}, "
        f"best table {tuner.bandit.best_arms()}"
    )
    if batch <= 4:
        assert thr >= 0.9 * fixed[best_name], (thr, fixed)
    else:
        b = tuner.bandit.bucket_of(batch)
        chosen = tuner.bandit.best_arms()[b]
        med = {a: v["median"] for a, v in tuner.stats()["buckets"][b]["arms"].items() if v["n"]}
        assert chosen == "off" or med[chosen] >= med["off"], (chosen, med)
