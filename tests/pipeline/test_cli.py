"""`tailspec train` end to end on a tiny policy (in-process), and every bad-input path: one message, exit 2,
no summary.json."""

import json
import shutil
import statistics

import pytest
import yaml

from services.pipeline.cli import main
from tests.conftest import GSM8K_DIR

QUICK = [
    "trainer.steps=2",
    "trainer.prompts_per_step=3",
    "trainer.group_size=2",
    "rollout.max_new_tokens=16",
    "rollout.num_actors=2",
    "ray.use_ray=false",
]


def _train(tmp_path, policy, *extra, config=None):
    run = tmp_path / "run"
    args = ["train", "--run-dir", str(run)] + (["--config", str(config)] if config else [])
    return main(args + [f"model.path={policy}", *QUICK, *extra]), run


def test_train_writes_every_output(tmp_path, tiny_policy_dir):
    rc, run = _train(tmp_path, tiny_policy_dir, "rollout.speculative.speedup_every=1")
    assert rc == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    need = {
        "step",
        "reward_mean",
        "reward_std",
        "response_len_mean",
        "response_len_p50",
        "response_len_p90",
        "response_len_max",
        "tokens_generated",
        "rollout_seconds",
        "train_seconds",
        "step_seconds",
        "policy_version",
    }
    assert need <= set(rows[0])
    assert [r["policy_version"] for r in rows] == [1, 2]
    assert all(r["tokens_generated"] == sum(w["tokens"] for w in r["workers"]) for r in rows)
    summary = json.loads((run / "summary.json").read_text())
    for key in (
        "steps",
        "reward_mean_first",
        "reward_mean_last",
        "rollout_seconds_total",
        "step_seconds_total",
        "tokens_generated_total",
        "base_model",
        "dataset",
    ):
        assert key in summary
    assert summary["steps"] == 2
    # what speculation did to the tail: the replayed sample's whole-rollout and long-tail speed-ups (on step 1
    # and every speedup_every-th step: here 1 and 2), the step's share spent in rollout, the step with its
    # rollout scaled to plain's; the measurement's seconds are not in the step's
    for r in rows:
        assert 0 < r["rollout_share_of_step"] < 1
        assert r["rollout_share_of_step"] == pytest.approx(r["rollout_seconds"] / r["step_seconds"])
        assert r["speedup_measure_seconds"] > 0
        assert r["step_seconds"] > r["rollout_seconds"] + r["train_seconds"]
        m = r["speedup_measurement"]
        # the long tail: each decode's seconds for the rollout's last N tokens, N = plain's tokens with <= 8 active
        tail = m["long_tail"]
        assert tail["tokens"] > 0 and tail["plain_seconds"] > 0 and tail["spec_seconds"] > 0
        assert r["long_tail_speedup_vs_plain"] == pytest.approx(tail["plain_seconds"] / tail["spec_seconds"])
        want = (r["step_seconds"] - r["rollout_seconds"] * (1 - r["rollout_speedup_vs_plain"])) / r[
            "step_seconds"
        ]
        assert r["step_speedup_vs_plain"] == pytest.approx(want)
    assert summary["long_tail_speedup_vs_plain"] == pytest.approx(
        statistics.median(r["long_tail_speedup_vs_plain"] for r in rows)
    )
    assert summary["speedup_measurements"] == 2
    assert summary["speedup_measure_seconds_total"] == pytest.approx(
        sum(r["speedup_measure_seconds"] for r in rows)
    )
    assert summary["response_len_run_tail_ratio"] >= 1
    assert 0 < summary["rollout_share_of_step"] < 1
    assert summary["tokens_generated_total"] == sum(r["tokens_generated"] for r in rows)
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert cfg["trainer"]["steps"] == 2 and cfg["rollout"]["max_new_tokens"] == 16
    assert (run / "plots" / "response_length.png").stat().st_size > 1000
    ckpt = run / "checkpoints" / "policy"
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in ckpt.iterdir()}


def test_speedup_is_measured_on_step_1_and_every_speedup_every_th_step(tmp_path, tiny_policy_dir):
    rc, run = _train(tmp_path, tiny_policy_dir, "trainer.steps=3", "rollout.speculative.speedup_every=2")
    assert rc == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "speedup_measurement" in r] == [1, 3]
    assert [r["speedup_measure_seconds"] > 0 for r in rows] == [True, False, True]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["speedup_measurements"] == 2


@pytest.mark.parametrize(
    "override, message",
    [
        ("rollout.speculative.speedup_every=0", "rollout.speculative.speedup_every"),
        ("trainer.stepz=2", "trainer.stepz"),
        ("trainer.steps=abc", "trainer.steps"),
        ("rollout.speculative.drafter=magic", "rollout.speculative.drafter"),
    ],
)
def test_config_errors(tmp_path, tiny_policy_dir, capsys, override, message):
    rc, run = _train(tmp_path, tiny_policy_dir, override)
    err = capsys.readouterr().err
    assert rc == 2 and message in err and err.count("error:") == 1
    assert not (run / "summary.json").exists()


def test_missing_dataset(tmp_path, tiny_policy_dir, capsys):
    rc, run = _train(tmp_path, tiny_policy_dir, f"data.dir={tmp_path / 'nowhere'}")
    err = capsys.readouterr().err
    assert rc == 2 and "train.jsonl" in err and not run.exists()


def test_malformed_jsonl_names_file_and_line(tmp_path, tiny_policy_dir, capsys):
    data = tmp_path / "data"
    data.mkdir()
    lines = (GSM8K_DIR / "train.jsonl").read_text().splitlines()[:5]
    lines[3] = '{"question": "broken'
    (data / "train.jsonl").write_text("\n".join(lines) + "\n")
    rc, run = _train(tmp_path, tiny_policy_dir, f"data.dir={data}")
    err = capsys.readouterr().err
    assert rc == 2 and "train.jsonl:4" in err and not run.exists()


def test_model_dir_without_config(tmp_path, tiny_policy_dir, capsys):
    bad = tmp_path / "model"
    shutil.copytree(tiny_policy_dir, bad)
    (bad / "config.json").unlink()
    rc, run = _train(tmp_path, bad, "model.build_if_missing=false")
    err = capsys.readouterr().err
    assert rc == 2 and "config.json" in err and not run.exists()


def test_tokenizer_mismatch(tmp_path, tiny_policy_dir, capsys):
    bad = tmp_path / "model"
    shutil.copytree(tiny_policy_dir, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["vocab_size"] = 100  # smaller than the tokenizer's 320 tokens
    (bad / "config.json").write_text(json.dumps(cfg))
    rc, run = _train(tmp_path, bad)
    err = capsys.readouterr().err
    assert rc == 2 and "tokenizer mismatch" in err and not run.exists()


def test_config_file_errors(tmp_path, tiny_policy_dir, capsys):
    rc, _ = _train(tmp_path, tiny_policy_dir, config=tmp_path / "missing.yaml")
    assert rc == 2 and "not found" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer:\n  steps: 2\n  lr_typo: 0.1\n")
    rc, _ = _train(tmp_path, tiny_policy_dir, config=bad)
    err = capsys.readouterr().err
    assert rc == 2 and "trainer.lr_typo" in err and "bad.yaml" in err
