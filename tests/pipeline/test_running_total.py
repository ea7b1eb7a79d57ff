"""The running-total task: deterministic generator, worked answers, exact-match reward, committed data."""

import json
import random

import pytest

from services.pipeline.datasets import extract_final_answer, load_gsm8k
from services.pipeline.rewards import gsm8k_reward
from services.pipeline.tasks import BASE_RECIPES, task_data_dir
from services.pipeline.tasks.running_total import (
    DEFAULT_DIR,
    LENGTH_MIX,
    Problem,
    dataset_rows,
    generate_problems,
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
        ("47+8=45\n#### 45", 0.0, 0.1),  # the forgotten carry earns the format reward only
        ("47+8=55\n#### 55 and more", 0.0, 0.0),  # not a number after the marker
        ("47+8=55\n55", 0.0, 0.0),  # no marker
        ("#### 5\n#### 55", 1.0, 0.1),  # the last marker counts
        ("#### 550", 0.0, 0.1),
    ],
)
def test_reward_exact_match(response, correct, fmt):
    r = gsm8k_reward(response, "55", 0.1)
    assert (r.correct, r.format) == (correct, fmt)


def test_sloppy_teacher_drops_carries_only():
    rng = random.Random(0)
    p = Problem(47, (8, 1))  # 47+8 carries, then no carry
    assert worked_answer(p, 1.0, rng) == "47+8=45 +1\n45+1=46\n#### 46"
    assert worked_answer(Problem(52, (-3,)), 1.0, rng) == "52-3=59\n#### 59"  # a forgotten borrow
    assert worked_answer(Problem(41, (5, -2)), 1.0, rng) == worked_answer(Problem(41, (5, -2)))
    with pytest.raises(ValueError):
        worked_answer(p, 0.5)
    # at carry_error 0.5 about half of the carry steps go wrong
    probs = generate_problems(400, seed=3)
    wrong = sum(worked_answer(q, 0.5, rng) != worked_answer(q) for q in probs)
    assert 0.3 * len(probs) < wrong < 0.9 * len(probs)


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
