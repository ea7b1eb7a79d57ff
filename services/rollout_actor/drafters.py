"""The rollout actor's drafters: building them by name (``build_drafters``), the configured fixed
strategy (``strategy_from_config``), and where a published learned-drafter version may be loaded from
(``published_drafter_folder``: the run's own published-drafter folder only).

Plain Python; ``services/rollout_actor/worker.py`` uses these, and so do the benchmarks.
"""

from __future__ import annotations

import os
from pathlib import Path

from services.common.validation import InvalidArgument, Refused, check_counter
from services.rollout_actor.model import Transformer
from services.rollout_actor.speculative.base import Drafter
from services.rollout_actor.speculative.eagle import EagleDrafter
from services.rollout_actor.speculative.eagle_model import EagleConfig, default_fuse_layers
from services.rollout_actor.speculative.hybrid import HybridDrafter
from services.rollout_actor.speculative.ngram import NgramDrafter
from services.rollout_actor.speculative.strategy import Strategy
from services.rollout_actor.speculative.suffix_tree import SuffixTreeDrafter
from services.spot_trainer.trainer import MARKER, PUBLISHED_TENSORS, STATE_JSON


def build_drafters(
    target: Transformer | None = None,
    names: list[str] | tuple[str, ...] = ("suffix", "ngram"),
    learned: dict | None = None,
) -> dict[str, Drafter]:
    """Drafters by name: ``suffix``, ``ngram``, and with ``learned`` (and a target) ``learned`` + ``hybrid``.

    ``learned``: {checkpoint: EAGLE folder or None (a fresh, seeded draft head), eagle3: bool, seed: int,
    hybrid_threshold: float}. ``hybrid`` shares the ``suffix`` and ``learned`` instances (no duplicate history).
    """
    make = {"suffix": SuffixTreeDrafter, "ngram": NgramDrafter}
    unknown = [n for n in names if n not in make]
    if unknown:
        raise ValueError(f"unknown drafter(s) {unknown}; known: {sorted(make)}")
    out: dict[str, Drafter] = {n: make[n]() for n in names}
    if learned is not None and target is not None:
        if learned.get("checkpoint"):
            eagle = EagleDrafter.from_pretrained(learned["checkpoint"], target)
        else:
            fuse = default_fuse_layers(target.config.num_hidden_layers) if learned.get("eagle3") else None
            eagle = EagleDrafter(
                target, config=EagleConfig(fuse_layers=fuse, seed=int(learned.get("seed", 0)))
            )
        out["learned"] = eagle
        if "suffix" in out:
            out["hybrid"] = HybridDrafter(
                out["suffix"], eagle, float(learned.get("hybrid_threshold", 1.0)), forward_events=False
            )
    return out


def strategy_from_config(spec: dict | None) -> Strategy:
    """``rollout.speculative`` (enabled, drafter, max_draft_tokens, tree_width, tree_depth) -> Strategy."""
    if not spec or not spec.get("enabled") or spec.get("drafter", "off") == "off":
        return Strategy()
    return Strategy(
        spec["drafter"],
        int(spec["max_draft_tokens"]),
        int(spec.get("tree_width", 1)),
        int(spec.get("tree_depth", 0)),
    )


def published_drafter_folder(drafter_dir: str | os.PathLike, version: int, path: str | None = None) -> Path:
    """The folder of drafter ``version`` in a run's published-drafter folder ``drafter_dir``
    (``<run>/checkpoints/spot_trainer/published``), symlinks resolved.

    ``path`` (optional, as ``LoadDrafter`` carries it) must name that very folder. Raises ``InvalidArgument``
    for a version < 1, a relative path, a path outside ``drafter_dir`` (symlinks resolved) or another
    version's folder; ``Refused`` (NOT_FOUND) when the version is not published there (complete, marker
    written)."""
    version = check_counter(version, "drafter.version", at_least=1)
    root = Path(drafter_dir).resolve()
    folder = root / f"v{version:09d}"
    if path:
        given = Path(path)
        if not given.is_absolute():
            raise InvalidArgument(f"drafter.checkpoint_path {str(path)[:200]!r} is not absolute")
        real = given.resolve()
        if not real.is_relative_to(root):
            raise InvalidArgument(
                f"drafter.checkpoint_path {str(path)[:200]!r} is outside the run's drafter folder {root}"
            )
        if real != folder.resolve():
            raise InvalidArgument(
                f"drafter.checkpoint_path {str(path)[:200]!r} is not the folder of version {version}"
            )
    real = folder.resolve()
    files = [real / f for f in (MARKER, STATE_JSON, PUBLISHED_TENSORS)]
    if not real.is_relative_to(root) or not all(
        f.is_file() and f.resolve().is_relative_to(root) for f in files
    ):
        raise Refused(f"drafter version {version} is not published in the run's drafter folder {root}")
    return real


__all__ = ["build_drafters", "published_drafter_folder", "strategy_from_config"]
