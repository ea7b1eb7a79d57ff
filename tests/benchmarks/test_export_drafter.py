"""``spot_training_effect --export-drafter``: the newest published drafter of a run becomes an EAGLE folder that
``rollout_longtail --learned`` (``EagleDrafter.from_pretrained``) loads with the same weights."""

from __future__ import annotations

import torch

from benchmarks.spot_training_effect import export_drafter
from services.rollout_actor.model import Transformer
from services.rollout_actor.speculative.eagle import EagleConfig, EagleDrafter, EagleDraftModel
from services.spot_trainer.trainer import save_state


def _publish(run_dir, version, head):
    save_state(
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
    assert export_drafter(run, dest) == {"version": 4, "path": str(dest)}
    loaded = EagleDrafter.from_pretrained(dest, target).model.state_dict()
    for k, v in new.state_dict().items():
        assert torch.equal(loaded[k], v), k
    assert not torch.equal(loaded["fc.weight"], old.state_dict()["fc.weight"])
