"""A run's step checkpoints: ``<run_dir>/checkpoints/step-<k>``, written atomically, the newest kept.

A step checkpoint holds ``trainer/`` (the policy trainer's policy + optimizer state, written by the trainer
actor), ``tuner_state.json`` (a copy of the tuner's own checkpoint, when the run has a tuner) and
``driver.json`` (the driver's data cursor, RNG and length history), written last: a folder is complete when
it has ``driver.json``. ``tailspec train --resume RUN_DIR`` continues from the newest complete one.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

CHECKPOINTS_KEPT = 2  # step checkpoints kept in checkpoints/ (the newest ones)
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
)


def _step_of(path: Path) -> int:
    return int(path.name.split("-", 1)[1])


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete step checkpoint ``run_dir/checkpoints/step-<k>`` (a folder is renamed into place
    only once everything in it is written), or None."""
    done = [p for p in (run_dir / "checkpoints").glob("step-*") if (p / "driver.json").is_file()]
    return max(done, key=_step_of, default=None)


def write_checkpoint(run_dir: Path, step: int, save_trainer: Callable[[Path], object], state: dict) -> Path:
    """Write ``run_dir/checkpoints/step-<step>`` atomically (a temporary folder renamed into place,
    ``driver.json`` last) and return it: ``save_trainer(folder)`` writes the trainer's state into
    ``folder`` (``step-<step>/trainer``), the tuner's ``checkpoints/tuner_state.json`` is copied when it
    exists, and ``state`` (JSON-serialisable) becomes ``driver.json``. Keeps the newest ``CHECKPOINTS_KEPT``."""
    root = run_dir / "checkpoints"
    tmp, final = root / f".step-{step}.tmp", root / f"step-{step}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_trainer(tmp / "trainer")
    tuner = root / "tuner_state.json"
    if tuner.is_file():
        shutil.copy2(tuner, tmp / "tuner_state.json")
    (tmp / "driver.json").write_text(json.dumps(state))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    old = sorted((p for p in root.glob("step-*") if p != final), key=_step_of)
    for p in old[: max(0, len(old) - (CHECKPOINTS_KEPT - 1))]:
        shutil.rmtree(p, ignore_errors=True)
    return final


def read_checkpoint(run_dir: Path) -> tuple[Path, dict]:
    """The newest complete checkpoint of ``run_dir`` and its ``driver.json``; raises FileNotFoundError when
    there is none (preflight checks that first: ``check_run_dir``)."""
    ckpt = latest_checkpoint(run_dir)
    if ckpt is None:
        raise FileNotFoundError(f"no complete checkpoint in {run_dir / 'checkpoints'}")
    return ckpt, json.loads((ckpt / "driver.json").read_text())


def copy_tokenizer(src: Path, dst: Path) -> None:
    """Copy the tokenizer and generation files of model folder ``src`` that exist into ``dst``."""
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copy(src / name, dst / name)
