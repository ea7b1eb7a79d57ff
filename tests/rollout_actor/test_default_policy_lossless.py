"""``make run``'s policy (``services/pipeline/assets/running_total_policy``) decodes the same tokens with every
deterministic drafter as without, at the run's temperature: the lossless guarantee on the policy users train
first, with drafts that are mostly accepted (each problem's earlier responses are in the suffix drafter's
history, as in the run's later epochs) and some rejected."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer

from services.pipeline.datasets import format_prompt, load_gsm8k
from services.rollout_actor.engine import Engine, GenerationRequest, SamplingParams
from services.rollout_actor.model import Transformer
from services.rollout_actor.speculative.ngram import NgramDrafter
from services.rollout_actor.speculative.strategy import FixedStrategy, Strategy
from services.rollout_actor.speculative.suffix_tree import SuffixTreeDrafter

REPO = Path(__file__).resolve().parents[2]
ASSET = REPO / "services" / "pipeline" / "assets" / "running_total_policy"
TRAIN = REPO / "data" / "running_total" / "train.jsonl"


@pytest.fixture(scope="module")
def policy():
    torch.set_num_threads(1)
    tok = Tokenizer.from_file(str(ASSET / "tokenizer.json"))
    rows = [r for r in load_gsm8k(TRAIN)[:200] if r.question.count("+") + r.question.count("-") >= 6][:3]
    prompts = [tok.encode(format_prompt(r.question)).ids for r in rows]
    return Transformer.from_pretrained(ASSET), prompts


def _requests(prompts: list[list[int]], seed: int) -> list[GenerationRequest]:
    params = [
        SamplingParams(temperature=1.0, max_new_tokens=320, seed=seed + i) for i in range(4 * len(prompts))
    ]
    return [
        GenerationRequest(f"p{p}-g{g}", list(ids), params[4 * p + g], f"p{p}")
        for p, ids in enumerate(prompts)
        for g in range(4)
    ]


@pytest.mark.parametrize(
    "strategy", [Strategy("suffix", 8), Strategy("suffix", 16, 2, 8), Strategy("ngram", 3)], ids=str
)
def test_default_policy_decodes_the_same_tokens_with_a_deterministic_drafter(policy, strategy):
    model, prompts = policy
    plain = Engine(model, max_batch_size=8, max_seq_len=512).generate(_requests(prompts, 100))
    suffix = SuffixTreeDrafter()
    for out in Engine(model, max_batch_size=8, max_seq_len=512).generate(_requests(prompts, 7)):
        suffix.add_history(out.problem_id, out.prompt_ids, out.token_ids)  # an earlier epoch's responses
    eng = Engine(
        model,
        max_batch_size=8,
        max_seq_len=512,
        drafters={"suffix": suffix, "ngram": NgramDrafter()},
        selector=FixedStrategy(strategy),
    )
    spec = eng.generate(_requests(prompts, 100))
    assert [o.token_ids for o in spec] == [o.token_ids for o in plain]
    flat = [x for o in plain for x in o.logprobs]
    assert [x for o in spec for x in o.logprobs] == pytest.approx(flat, abs=1e-4)
    drafted = sum(o.spec.drafted for o in spec)
    accepted = sum(o.spec.accepted for o in spec)
    assert 0 < accepted < drafted  # drafts were verified: some accepted, some rejected
