"""``spot_training_effect --export-drafter``: the newest published drafter of a run becomes an EAGLE folder that
``benchmarks.longtail --learned`` (``EagleDrafter.from_pretrained``) loads with the same weights."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks.longtail.runners import TailspecRunner
from benchmarks.longtail.workload import SPOT_META, learned_gate
from benchmarks.spot_training_effect import export_drafter
from services.rollout_actor.model import Transformer
from services.rollout_actor.speculative.eagle import (
    EagleConfig,
    EagleDrafter,
    EagleDraftModel,
    save_eagle_checkpoint,
)
from services.spot_trainer.trainer import save_published


def _publish(run_dir, version, head):
    save_published(
        dict(head.state_dict()), run_dir / "checkpoints" / "spot_trainer" / "published" / f"v{version:09d}"
    )


def test_export_writes_the_newest_published_head(tiny_policy_dir, tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text(
        f"model:\n  path: {tiny_policy_dir}\nrollout:\n  speculative:\n    eagle3: false\n"
    )
    dest = tmp_path / "learned"
    assert export_drafter(run, dest) is None and not dest.exists()  # nothing published: nothing written
    target = Transformer.from_pretrained(tiny_policy_dir)
    old, new = (EagleDraftModel(target.config, EagleConfig(seed=s)) for s in (1, 2))
    _publish(run, 3, old)
    _publish(run, 4, new)
    assert export_drafter(run, dest, top1=0.27) == {"version": 4, "path": str(dest), "top1": 0.27}
    # the head's top-1 travels with it: benchmarks.longtail gates the adaptive policy's learned arms on it
    assert json.loads((dest / SPOT_META).read_text()) == {"version": 4, "top1": 0.27}
    assert learned_gate(dest, 0.5) == {"min_top1": 0.5, "top1": 0.27, "gated": True}
    loaded = EagleDrafter.from_pretrained(dest, target).model.state_dict()
    for k, v in new.state_dict().items():
        assert torch.equal(loaded[k], v), k
    assert not torch.equal(loaded["fc.weight"], old.state_dict()["fc.weight"])


def test_learned_gate_mirrors_make_runs_gate(tmp_path):
    """Gated below the bar, or when the top-1 is unknown (an untrained head in ``make run``); never at bar 0
    or without a learned drafter; a malformed metadata file is an error naming it."""
    head = tmp_path / "head"
    head.mkdir()
    assert learned_gate(None, 0.5)["gated"] is False
    assert learned_gate(head, 0.5) == {"min_top1": 0.5, "top1": None, "gated": True}
    assert learned_gate(head, 0.0)["gated"] is False
    (head / SPOT_META).write_text(json.dumps({"version": 2, "top1": 0.5}))
    assert learned_gate(head, 0.5)["gated"] is False  # at the bar: in, as in ControlPlane.gated_drafters
    assert learned_gate(head, 0.6)["gated"] is True
    (head / SPOT_META).write_text("[1, 2]")
    with pytest.raises(SystemExit, match=SPOT_META):
        learned_gate(head, 0.5)


def test_gated_runner_keeps_learned_arms_out_of_the_adaptive_table(tiny_policy_dir, tmp_path):
    target = Transformer.from_pretrained(tiny_policy_dir)
    head = tmp_path / "head"
    save_eagle_checkpoint(EagleDraftModel(target.config, EagleConfig(seed=1)), head, target)
    for gated in ([], ["learned", "hybrid"]):
        runner = TailspecRunner(target, 128, head)
        runner.gated = gated
        runner.init_adaptive(0)
        table = runner.adaptive.table
        learned = {n for n, a in table["arms"].items() if a["drafter"] == "learned"}
        assert learned  # the tuner has the learned arms either way
        playable = {
            n for b in table["buckets"] for n in [b["best"], *b.get("explore", []), *b.get("probe", [])]
        }
        assert bool(playable & learned) == (not gated), gated
