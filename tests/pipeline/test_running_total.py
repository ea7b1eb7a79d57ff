"""The running-total task: deterministic generator, worked answers, exact-match reward, committed data."""

import json
import random

import pytest

from services.pipeline.datasets import extract_final_answer, load_gsm8k
from services.pipeline.rewards import gsm8k_reward
from services.pipeline.tasks import BASE_RECIPES, task_data_dir
from services.pipeline.tasks.running_total import (
    DEFAULT_DIR,
    HASTY_RATE,
    LENGTH_MIX,
    SFT_LENGTH_MIX,
    Problem,
    dataset_rows,
    generate_problems,
    teacher_answer,
    worked_answer,
)


def test_generator_is_deterministic_and_seeded():
    a, b = generate_problems(200, seed=7), generate_problems(200, seed=7)
    assert a == b
    assert a != generate_problems(200, seed=8)


def test_problems_stay_in_range_and_lengths_are_mixed():
    probs = generate_problems(3000, seed=1)
    lo, hi = LENGTH_MIX[0][1], LENGTH_MIX[-1][2]
    for p in probs:
        assert 10 <= p.start <= 99 and lo <= len(p.ops) <= hi
        assert all(1 <= abs(d) <= 9 for d in p.ops)
        t = p.start
        for d in p.ops:
            t += d
            assert 0 <= t <= 99
    n_ops = sorted(len(p.ops) for p in probs)
    p50, p99 = n_ops[len(n_ops) // 2], n_ops[int(0.99 * len(n_ops))]
    assert p99 / p50 >= 2.5  # the long tail the task exists for


def test_worked_answer_is_exact_and_rewarded():
    p = Problem(47, (8, -3, 9))
    ans = worked_answer(p)
    assert ans == "47+8=55 -3+9\n55-3=52 +9\n52+9=61\n#### 61"
    assert p.question == "47+8-3+9" and p.total == 61
    assert extract_final_answer(ans) == "61"
    r = gsm8k_reward(ans, "61", 0.1)
    assert (r.correct, r.format, r.total) == (1.0, 0.1, 1.1)


@pytest.mark.parametrize(
    "response, correct, fmt",
    [
        ("47+8=55\n#### 55", 1.0, 0.1),
        ("47+8=45\n#### 45", 0.0, 0.1),  # a wrong total earns the format reward only
        ("47+8=55\n#### 55 and more", 0.0, 0.0),  # not a number after the marker
        ("47+8=55\n55", 0.0, 0.0),  # no marker
        ("#### 5\n#### 55", 1.0, 0.1),  # the last marker counts
        ("#### 550", 0.0, 0.1),
    ],
)
def test_reward_exact_match(response, correct, fmt):
    r = gsm8k_reward(response, "55", 0.1)
    assert (r.correct, r.format) == (correct, fmt)


def test_hasty_teacher_stops_after_the_first_line():
    p = Problem(47, (8, -3, 9))
    always, never = random.Random(0), random.Random(0)
    assert teacher_answer(p, 1.0, always) == "47+8=55 -3+9\n#### 55"  # the first line's sum: wrong here
    assert teacher_answer(p, 0.0, never) == worked_answer(p)
    assert teacher_answer(Problem(47, (8,)), 1.0, always) == worked_answer(
        Problem(47, (8,))
    )  # one line: done
    with pytest.raises(ValueError):
        teacher_answer(p, 1.5, always)
    # at the default rate about that share of multi-operation problems is answered early
    rng = random.Random(3)
    probs = [q for q in generate_problems(1000, seed=3) if len(q.ops) >= 2]
    hasty = sum(teacher_answer(q, HASTY_RATE, rng) != worked_answer(q) for q in probs)
    assert abs(hasty / len(probs) - HASTY_RATE) < 0.06


def test_committed_data_is_the_generators_and_held_out():
    rows = dataset_rows(sizes={"train": 300, "sft": 300})
    for split in ("train", "test", "sft"):
        lines = (DEFAULT_DIR / f"{split}.jsonl").read_text().splitlines()
        assert [json.loads(x) for x in lines[: len(rows[split])]] == rows[split]
    test = load_gsm8k(DEFAULT_DIR / "test.jsonl")
    assert len(test) >= 200
    held = {e.question for e in test}
    for split in ("train", "sft"):
        assert not held & {e.question for e in load_gsm8k(DEFAULT_DIR / f"{split}.jsonl")}
    # train and test answers are correct worked answers; their totals are the problems'
    for e in test[:50]:
        assert str(eval(e.question)) == e.final_answer  # noqa: S307 (digits and +/- only)


def test_task_registry():
    assert task_data_dir("running_total") == DEFAULT_DIR and task_data_dir("gsm8k") is None
    assert BASE_RECIPES["running_total"]["split_digits"] is True
    with pytest.raises(ValueError):
        task_data_dir("nope")


def test_base_model_recipe_for_the_task(tmp_path):
    """The task's recipe (digit-splitting tokenizer, sft.jsonl) through build_base_model, shrunk to seconds."""
    import json as _json

    from tokenizers import Tokenizer

    from services.pipeline.base_model import build_base_model

    small = dict(hidden_size=64, num_attention_heads=2, num_key_value_heads=1, intermediate_size=128)
    recipe = {**BASE_RECIPES["running_total"], "steps": 2, "num_hidden_layers": 1, **small}
    report = build_base_model(tmp_path, data_dir=DEFAULT_DIR, progress=False, **recipe)
    assert report["data"]["train_file"] == "sft.jsonl" and report["name"] == "tailspec-running-total-qwen2"
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert tok.encode("47+8=55").tokens == ["4", "7", "+", "8", "=", "5", "5"]
    assert _json.loads((tmp_path / "recipe.json").read_text())["recipe"]["split_digits"] is True


def test_sft_data_has_more_long_chains_than_the_rl_prompts():
    """The base policy learns to copy long lines from sft.jsonl's long chains; train / test keep the RL mix."""

    def long_share(split: str) -> float:
        rows = load_gsm8k(DEFAULT_DIR / f"{split}.jsonl")
        return sum(len(_ops(e.question)) >= 11 for e in rows) / len(rows)

    assert long_share("sft") > 3 * long_share("train") > 0
    assert abs(long_share("sft") - SFT_LENGTH_MIX[-1][0]) < 0.02
    assert abs(long_share("train") - LENGTH_MIX[-1][0]) < 0.01


def _ops(question: str) -> list[str]:
    return [c for c in question[1:] if c in "+-"]
