"""The held-out evaluation inside `tailspec train` (in-process, tiny random policy on the running-total task):
eval keys in metrics.jsonl and summary.json, the config keys, and the evaluation's scoring."""

import json
from types import SimpleNamespace

import pytest

from services.common.config import REPO_ROOT, ConfigError, load_config
from services.pipeline.cli import main
from services.pipeline.datasets import load_gsm8k
from services.pipeline.evaluation import score
from services.pipeline.tasks.running_total import DEFAULT_DIR
from services.rollout_actor.model import Transformer, init_weights
from tests.conftest import tiny_config

CONFIG = REPO_ROOT / "configs" / "running_total_tiny.yaml"
QUICK = [
    "trainer.steps=3",
    "trainer.prompts_per_step=2",
    "trainer.group_size=2",
    "rollout.max_new_tokens=12",
    "ray.use_ray=false",
    "tuner.enabled=false",
    "spot.enabled=false",
    "metrics.enabled=false",
    "eval.n=6",
]


@pytest.fixture(scope="module")
def rt_policy(tmp_path_factory):
    """A tiny random policy with a digit-splitting tokenizer trained on running-total text."""
    from services.pipeline.base_model import save_tokenizer, train_tokenizer
    from services.pipeline.datasets import format_prompt, format_response

    out = tmp_path_factory.mktemp("rt_policy")
    ex = load_gsm8k(DEFAULT_DIR / "train.jsonl")[:300]
    texts = [format_prompt(e.question) + format_response(e.answer) for e in ex]
    save_tokenizer(train_tokenizer(texts, 300, split_digits=True), out, 512)
    cfg = tiny_config(vocab_size=300, eos_token_id=0, pad_token_id=0)
    init_weights(Transformer(cfg), seed=0, std=0.05).save_pretrained(out)
    return out


def _run(tmp_path, policy, *extra):
    run = tmp_path / "run"
    args = ["train", "--config", str(CONFIG), "--run-dir", str(run), f"model.path={policy}", *QUICK, *extra]
    return main(args), run


def test_run_reports_held_out_accuracy(tmp_path, rt_policy):
    rc, run = _run(tmp_path, rt_policy, "eval.every=2")
    assert rc == 0
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[0]["eval_initial"]["policy_version"] == 0 and rows[0]["eval_initial"]["problems"] == 6
    evaluated = [r["step"] for r in rows if "eval_accuracy" in r]
    assert evaluated == [2, 3]  # every 2 steps, and after the last
    for r in rows[1:]:
        assert 0.0 <= r["eval_accuracy"] <= 1.0 and 0.0 <= r["eval_accuracy_sampled"] <= 1.0
        assert r["eval"]["policy_version"] == r["policy_version"]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["eval_problems"] == 6 and summary["eval_set"].endswith("test.jsonl")
    assert summary["eval_accuracy_first"] == rows[0]["eval_initial"]["greedy"]["accuracy"]
    assert summary["eval_accuracy_last"] == rows[-1]["eval_accuracy"]
    assert summary["eval_temperature"] == 1.0
    assert [c["policy_version"] for c in summary["eval_curve"]] == [0, 2, 3]
    pooled = sorted(w for r in rows for w in [r["response_len_max"]])
    assert summary["response_len_run_max"] == pooled[-1]
    assert summary["response_len_run_tail_ratio"] == pytest.approx(
        summary["response_len_run_p99"] / summary["response_len_run_p50"]
    )
    assert (run / "plots" / "training_curves.png").stat().st_size > 1000


def test_greedy_evaluation_is_reproducible(tmp_path, rt_policy):
    """Greedy accuracy of the initial policy is a function of the weights: two runs agree."""
    firsts = []
    for k in range(2):
        rc, run = _run(tmp_path / str(k), rt_policy, "trainer.steps=1", "eval.sampled=false")
        assert rc == 0
        s = json.loads((run / "summary.json").read_text())
        assert "eval_accuracy_sampled_first" not in s
        first = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])["eval_initial"]
        firsts.append(first["greedy"])
    assert firsts[0] == firsts[1]


def test_eval_disabled_writes_no_eval_keys(tmp_path, rt_policy):
    rc, run = _run(tmp_path, rt_policy, "trainer.steps=1", "eval.enabled=false")
    assert rc == 0
    summary = json.loads((run / "summary.json").read_text())
    assert not [k for k in summary if k.startswith("eval_")]


@pytest.mark.parametrize("override", ["eval.every=-1", "eval.n=0", "task.name=chess"])
def test_eval_and_task_config_errors(override):
    with pytest.raises(ConfigError, match=override.split("=")[0]):
        load_config(CONFIG, [override])


def test_score_counts_exact_answers_and_lengths():
    ex = load_gsm8k(DEFAULT_DIR / "test.jsonl")[:3]
    outs = [
        SimpleNamespace(text=ex[0].answer, token_ids=[1] * 10, finish_reason="stop"),
        SimpleNamespace(text="1+1=2\n#### 9999", token_ids=[1] * 20, finish_reason="stop"),
        SimpleNamespace(text="1+1=", token_ids=[1] * 30, finish_reason="length"),
    ]
    s = score(ex, outs)
    assert s["accuracy"] == pytest.approx(1 / 3) and s["format_rate"] == pytest.approx(2 / 3)
    assert s["truncated_fraction"] == pytest.approx(1 / 3)
    assert (s["response_len_p50"], s["response_len_p99"]) == (20, 30)
