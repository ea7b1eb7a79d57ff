"""Every bad input of a run fails fast and clearly: one ``error:`` line naming the key or file, exit status 2, and
nothing written (no run folder), before Ray or any service starts. A non-finite loss stops the run with the
step named and no policy saved."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from services.pipeline.cli import main
from tests.conftest import GSM8K_DIR

QUICK = [
    "trainer.steps=1",
    "trainer.prompts_per_step=2",
    "trainer.group_size=2",
    "rollout.max_new_tokens=8",
    "ray.use_ray=false",
]


def _train(tmp_path: Path, policy: Path, *extra: str, run: Path | None = None):
    run = run or tmp_path / "run"
    rc = main(["train", "--run-dir", str(run), f"model.path={policy}", *QUICK, *extra])
    return rc, run


def _one_error(capsys, *needles: str) -> str:
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and len(err.strip().splitlines()) == 1, err
    for n in needles:
        assert n in err, (n, err)
    return err


def _copy(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "model"
    shutil.copytree(src, dst)
    return dst


@pytest.mark.parametrize(
    "override, key",
    [
        ("trainer.lr=inf", "trainer.lr"),
        ("trainer.lr=nan", "trainer.lr"),
        ("trainer.lr=0", "trainer.lr"),
        ("trainer.clip_eps=0", "trainer.clip_eps"),
        ("trainer.kl_coef=-0.1", "trainer.kl_coef"),
        ("trainer.max_grad_norm=0", "trainer.max_grad_norm"),
        ("trainer.prompts_per_step=0", "trainer.prompts_per_step"),
        ("rollout.max_batch_size=0", "rollout.max_batch_size"),
        ("spot.lr=-1", "spot.lr"),
        ("rollout.threads_per_actor=0", "rollout.threads_per_actor"),
    ],
)
def test_out_of_range_config_values(tmp_path, tiny_policy_dir, capsys, override, key):
    rc, run = _train(tmp_path, tiny_policy_dir, override)
    assert rc == 2 and not run.exists()
    _one_error(capsys, key)


def test_empty_dataset(tmp_path, tiny_policy_dir, capsys):
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text("\n")
    rc, run = _train(tmp_path, tiny_policy_dir, f"data.dir={data}")
    assert rc == 2 and not run.exists()
    _one_error(capsys, "train.jsonl", "no examples")


def test_corrupt_safetensors(tmp_path, tiny_policy_dir, capsys):
    bad = _copy(tiny_policy_dir, tmp_path)
    (bad / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{garbage")
    rc, run = _train(tmp_path, bad)
    assert rc == 2 and not run.exists()
    _one_error(capsys, "model.safetensors", "not a readable safetensors file")


def test_weights_that_do_not_match_config(tmp_path, tiny_policy_dir, capsys):
    bad = _copy(tiny_policy_dir, tmp_path)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["intermediate_size"] = cfg["intermediate_size"] * 2
    (bad / "config.json").write_text(json.dumps(cfg))
    rc, run = _train(tmp_path, bad)
    assert rc == 2 and not run.exists()
    _one_error(capsys, "model.safetensors", "mlp", "config.json implies")


def test_config_json_missing_a_key(tmp_path, tiny_policy_dir, capsys):
    bad = _copy(tiny_policy_dir, tmp_path)
    cfg = json.loads((bad / "config.json").read_text())
    del cfg["num_attention_heads"]
    (bad / "config.json").write_text(json.dumps(cfg))
    rc, run = _train(tmp_path, bad)
    assert rc == 2 and not run.exists()
    _one_error(capsys, "config.json", "num_attention_heads")


def test_corrupt_tokenizer(tmp_path, tiny_policy_dir, capsys):
    bad = _copy(tiny_policy_dir, tmp_path)
    (bad / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": ')
    rc, run = _train(tmp_path, bad)
    assert rc == 2 and not run.exists()
    _one_error(capsys, "tokenizer.json", "cannot load")


def test_unwritable_run_folder(tmp_path, tiny_policy_dir, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    rc, run = _train(tmp_path, tiny_policy_dir, run=blocker / "run")
    assert rc == 2 and not run.exists()
    _one_error(capsys, "cannot be created", "a_file")


def test_a_folder_holding_an_unfinished_run_is_refused_and_kept(tmp_path, tiny_policy_dir, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    rc, _ = _train(tmp_path, tiny_policy_dir, run=run)
    assert rc == 2
    _one_error(capsys, "unfinished run")
    assert (run / "metrics.jsonl").read_text() == '{"step": 1}\n'  # nothing wiped


def test_more_actors_than_the_local_cluster_has_cpus(tmp_path, tiny_policy_dir, capsys, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    rc, run = _train(tmp_path, tiny_policy_dir, "ray.use_ray=true", "ray.num_cpus=2", "rollout.num_actors=3")
    assert rc == 2 and not run.exists()
    _one_error(capsys, "rollout.num_actors=3", "needs 3 CPUs", "has 2")


def test_non_finite_loss_stops_the_run_naming_the_step(tmp_path, tiny_policy_dir, capsys, monkeypatch):
    """The policy update of step 2 reports a NaN loss (the real update runs; its reported loss is replaced):
    the run stops at that step with one error line; step 1's metrics stay, no summary, no saved policy."""
    from services.policy_trainer.actor import PolicyTrainerService

    real = PolicyTrainerService.train_step
    calls = []

    def nan_at_step_2(self, *a, **kw):
        stats = real(self, *a, **kw)
        calls.append(1)
        return {**stats, "loss": float("nan")} if len(calls) == 2 else stats

    monkeypatch.setattr(PolicyTrainerService, "train_step", nan_at_step_2)
    rc, run = _train(tmp_path, tiny_policy_dir, "trainer.steps=3")
    assert rc == 2
    _one_error(capsys, "step 2", "non-finite loss")
    assert [json.loads(r)["step"] for r in (run / "metrics.jsonl").read_text().splitlines()] == [1]
    assert not (run / "summary.json").exists()
    assert not (run / "checkpoints" / "policy" / "model.safetensors").exists()


def test_gsm8k_dir_is_vendored():
    assert (GSM8K_DIR / "train.jsonl").is_file()
