"""Helper for benchmarks that compare whole training runs: one ``tailspec train`` run, its metrics.jsonl rows."""

from __future__ import annotations

import json
from pathlib import Path

from services.pipeline.cli import main as tailspec


def train_rows(run_dir: Path, steps: int, overrides: list[str], config: Path | None = None) -> list[dict]:
    """Run the main job (``config``, else ``tailspec train``'s default; ``trainer.steps=steps``, no
    replayed-speedup sample) into ``run_dir``.

    Raises SystemExit when the run fails. Returns one dict per RL step (metrics.jsonl)."""
    args = [
        "train",
        *(["--config", str(config)] if config is not None else []),
        "--run-dir",
        str(run_dir),
        f"trainer.steps={steps}",
        "rollout.speculative.speedup_sample_prompts=0",
        *overrides,
    ]
    if tailspec(args) != 0:
        raise SystemExit(f"run failed: {run_dir}")
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
