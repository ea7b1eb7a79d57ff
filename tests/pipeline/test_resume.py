"""Checkpoints and resume, with real processes: a run killed with SIGKILL mid-run continues with ``--resume``
and ends with exactly one metrics row per step, B x G responses per step and the policy version never going
back, like an uninterrupted run; SIGTERM stops a run after its step with a checkpoint and exit status 143;
a folder holding a crashed run is refused without ``--resume``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from services.pipeline.cli import main

REPO = Path(__file__).resolve().parents[2]
B, G, STEPS = 2, 2, 4
QUICK = [
    f"trainer.steps={STEPS}",
    f"trainer.prompts_per_step={B}",
    f"trainer.group_size={G}",
    "rollout.max_new_tokens=12",
    "rollout.num_actors=1",
    "ray.use_ray=false",
    "spot.enabled=false",
]


def _spawn(args: list[str]) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "services.pipeline.cli", "train", *args]
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 300) -> None:
    t0 = time.monotonic()
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() - t0 < timeout, f"{path} never appeared"
        time.sleep(0.05)


def _rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _check_complete(run: Path) -> list[dict]:
    rows = _rows(run)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))  # no duplicates, no gaps
    assert [r["policy_version"] for r in rows] == list(range(1, STEPS + 1))  # never back
    assert all(sum(w["requests"] for w in r["workers"]) == B * G for r in rows)
    assert json.loads((run / "summary.json").read_text())["steps"] == STEPS
    return rows


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, tiny_policy_dir):
    run = tmp_path_factory.mktemp("whole") / "run"
    assert main(["train", "--run-dir", str(run), f"model.path={tiny_policy_dir}", *QUICK]) == 0
    return _check_complete(run)


def test_sigkill_then_resume_completes_like_an_uninterrupted_run(
    tmp_path, tiny_policy_dir, uninterrupted, capsys
):
    run = tmp_path / "run"
    proc = _spawn(["--run-dir", str(run), f"model.path={tiny_policy_dir}", *QUICK])
    _wait_for(run / "checkpoints" / "step-2" / "driver.json", proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert not (run / "summary.json").exists()
    # without --resume the crashed run's folder is refused, and nothing in it is touched
    before = (run / "metrics.jsonl").read_text()
    assert main(["train", "--run-dir", str(run), f"model.path={tiny_policy_dir}", *QUICK]) == 2
    assert "--resume" in capsys.readouterr().err
    assert (run / "metrics.jsonl").read_text() == before
    assert main(["train", "--resume", str(run)]) == 0
    rows = _check_complete(run)
    # same data, same seeds, the same policy restored exactly: the same rewards as the uninterrupted run
    assert [r["reward_mean"] for r in rows] == pytest.approx([r["reward_mean"] for r in uninterrupted])
    assert [r["tokens_generated"] for r in rows] == [r["tokens_generated"] for r in uninterrupted]


def test_sigterm_stops_after_the_step_with_a_checkpoint(tmp_path, tiny_policy_dir):
    """With an operator's gRPC token, which config.yaml never holds: the resumed run reads it from the run's
    token file."""
    run = tmp_path / "run"
    proc = _spawn(
        ["--run-dir", str(run), f"model.path={tiny_policy_dir}", *QUICK, "grpc.token=operator-secret"]
    )
    _wait_for(run / "checkpoints" / "step-1" / "driver.json", proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert f"Resume with: tailspec train --resume {run}" in err
    done = [r["step"] for r in _rows(run)]
    assert done and done == list(range(1, len(done) + 1)) and len(done) < STEPS
    assert (run / "checkpoints" / f"step-{done[-1]}" / "driver.json").is_file()
    assert "operator-secret" not in (run / "config.yaml").read_text()
    assert main(["train", "--resume", str(run)]) == 0
    _check_complete(run)


def test_resume_without_a_checkpoint_is_refused(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("trainer:\n  steps: 2\n")
    assert main(["train", "--resume", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "no complete checkpoint" in err
