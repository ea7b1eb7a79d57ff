"""Where each RL step's metrics row goes besides ``metrics.jsonl``: TensorBoard and Weights & Biases (offline).

``trainer.logger`` lists the sinks, as in VeRL (``trainer.logger=[console,jsonl,tensorboard,wandb]``):

- ``console``: the driver's progress line per step;
- ``jsonl``: ``<run_dir>/metrics.jsonl`` (required: it is the run's record, read by ``--resume`` and the plots);
- ``tensorboard``: event files in ``<run_dir>/tensorboard/`` (``tensorboard --logdir <run_dir>/tensorboard``);
- ``wandb``: a Weights & Biases run in offline mode under ``<run_dir>/wandb/`` (never the network, no login;
  upload it later with ``wandb sync <run_dir>/wandb/offline-run-*``).

Both file sinks log the same numbers as the row: ``scalars(row)`` flattens it (nested keys joined by ``/``,
list items by index, booleans as 0/1; strings, None and non-finite numbers left out), at global step
``row["step"]``. A sink opens on its first row, so a run that fails before step 1 leaves no empty log behind.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from services.common.config import LOGGERS, check_loggers


def scalars(row: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """The row's numbers as ``{"a/b/0": value}`` (module docstring)."""
    out: dict[str, float] = {}

    def walk(v: Any, key: str) -> None:
        if isinstance(v, Mapping):
            for k, x in v.items():
                walk(x, f"{key}/{k}" if key else str(k))
        elif isinstance(v, (list, tuple)):
            for i, x in enumerate(v):
                walk(x, f"{key}/{i}")
        elif isinstance(v, (bool, int, float)) and math.isfinite(float(v)):
            out[key] = float(v)

    walk(row, prefix)
    return out


class Sink(Protocol):
    """One destination of metrics rows."""

    def log(self, row: Mapping[str, Any]) -> None: ...

    def close(self) -> None: ...


class TensorBoardSink:
    """Scalars of each row to TensorBoard event files in ``log_dir`` (global step = the row's ``step``)."""

    def __init__(self, log_dir: Path):
        self.log_dir = Path(log_dir)
        self._writer = None

    def log(self, row: Mapping[str, Any]) -> None:
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=str(self.log_dir))
        step = int(row["step"])
        for tag, value in scalars(row).items():
            self._writer.add_scalar(tag, value, step)
        self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class WandbSink:
    """Each row to an offline Weights & Biases run under ``<root>/wandb/`` (``wandb.init(mode="offline")``:
    no network, no login). ``config`` (the resolved run config) becomes the W&B run's config."""

    def __init__(
        self, root: Path, name: str, config: Mapping[str, Any] | None = None, project: str = "tailspec"
    ):
        self.root = Path(root)
        self.name, self.project = name, project
        self.config = dict(config or {})
        self._run = None

    def log(self, row: Mapping[str, Any]) -> None:
        if self._run is None:
            import wandb

            self.root.mkdir(parents=True, exist_ok=True)
            settings = wandb.Settings(
                console="off", silent=True, x_disable_stats=True, disable_git=True, save_code=False
            )
            self._run = wandb.init(
                mode="offline",
                dir=str(self.root),
                project=self.project,
                name=self.name,
                config=self.config,
                settings=settings,
                reinit="create_new",
            )
        self._run.log(scalars(row), step=int(row["step"]))

    def close(self) -> None:
        if self._run is not None:
            self._run.finish()
            self._run = None


class MetricSinks:
    """The file sinks ``names`` asks for (``tensorboard``, ``wandb``; ``console`` and ``jsonl`` are the
    driver's own), under ``run_dir``. ``log(row)`` sends a row to each; ``close()`` flushes and closes them."""

    def __init__(
        self, names: Sequence[str], run_dir: Path, run_name: str = "tailspec", config: Mapping | None = None
    ):
        err = check_loggers(names)
        if err:
            raise ValueError(err)
        run_dir = Path(run_dir)
        self.names = list(names)
        self.sinks: list[Sink] = []
        if "tensorboard" in self.names:
            self.sinks.append(TensorBoardSink(run_dir / "tensorboard"))
        if "wandb" in self.names:
            self.sinks.append(WandbSink(run_dir, run_name, config))

    @property
    def console(self) -> bool:
        return "console" in self.names

    def log(self, row: Mapping[str, Any]) -> None:
        for s in self.sinks:
            s.log(row)

    def close(self) -> None:
        for s in self.sinks:
            s.close()


__all__ = ["LOGGERS", "MetricSinks", "Sink", "TensorBoardSink", "WandbSink", "check_loggers", "scalars"]
