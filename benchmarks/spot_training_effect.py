"""Effect of bubble training on the learned drafter: two runs of the main job, same seed and prompts, one with
spot training on and one with ``spot.enabled=false``; plots the learned drafter's acceptance rate per RL step.

    python -m benchmarks.spot_training_effect [--steps 6] [--out benchmarks/results] [--export-drafter DIR]

``--export-drafter DIR`` writes the newest drafter the spot trainer published in the "on" run as an EAGLE
checkpoint folder (``config.json`` + ``model.safetensors``), the learned arm of ``benchmarks.longtail --learned
DIR`` (``make bench`` runs this benchmark first for that reason).

Each run's learned-drafter figures come from its metrics.jsonl (``drafters.learned``: drafted and accepted
tokens of the steps where the tuner chose a learned or hybrid arm), plus the spot trainer's top-1 agreement on
its last training batch. Writes spot_training_effect.json and .png.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from benchmarks.machine import describe_machine
from benchmarks.runs import train_rows


def _run(run_dir: Path, steps: int, spot: bool, extra: list[str]) -> list[dict]:
    # tuner.learned_min_top1=0: the learned arms stay in the table from step 1 (by default they are gated until
    # the head is good enough, and this benchmark would then have no learned drafts to measure).
    # tuner.bandit.regret_budget=1.0: the default budget holds arms slower than off (a young head's) to 1% of
    # the rollout's time, too few learned draft tokens per step to see acceptance
    overrides = ["tuner.learned_min_top1=0", "tuner.bandit.regret_budget=1.0"]
    return train_rows(run_dir, steps, [f"spot.enabled={str(spot).lower()}", *overrides, *extra])


def _curve(rows: list[dict]) -> list[dict]:
    out = []
    for r in rows:
        d = r.get("drafters") or {}
        drafted = sum(d.get(k, {}).get("drafted", 0) for k in ("learned",))
        accepted = sum(d.get(k, {}).get("accepted", 0) for k in ("learned",))
        out.append(
            {
                "step": r["step"],
                "learned_drafted": drafted,
                "learned_accepted": accepted,
                "learned_acceptance_rate": accepted / drafted if drafted else None,
                "drafter_version": r.get("drafter_version"),
                "spot_top1": r.get("spot_top1"),
                "bubble_utilization": r.get("bubble_utilization"),
            }
        )
    return out


def export_drafter(run_dir: Path, dest: Path, top1: float | None = None) -> dict | None:
    """Write the newest drafter published in ``run_dir`` (the spot trainer's ``published/vN``) to ``dest`` as an
    EAGLE checkpoint folder for ``EagleDrafter.from_pretrained``, with ``tailspec_spot.json`` =
    ``{version, top1}`` (``top1``: the spot trainer's last top-1 accuracy, which ``benchmarks.longtail`` gates the
    adaptive policy's learned arms on, as ``make run`` does). Returns ``{version, path, top1}``, or None when
    the run published nothing (``dest`` is then left untouched)."""
    import shutil

    from omegaconf import OmegaConf

    from services.rollout_actor.model import Transformer
    from services.rollout_actor.speculative.eagle import (
        EagleConfig,
        EagleDraftModel,
        default_fuse_layers,
        save_eagle_checkpoint,
    )
    from services.spot_trainer.replicas import published_dir
    from services.spot_trainer.trainer import latest_published, load_published

    version, path = latest_published(published_dir(run_dir / "checkpoints" / "spot_trainer"))
    if path is None:
        return None
    cfg = OmegaConf.load(run_dir / "config.yaml")
    target = Transformer.from_pretrained(cfg.model.path)
    fuse = default_fuse_layers(target.config.num_hidden_layers) if cfg.rollout.speculative.eagle3 else None
    head = EagleDraftModel(target.config, EagleConfig(fuse_layers=fuse))
    head.load_state_dict(load_published(path))
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    save_eagle_checkpoint(head, tmp, target)
    from benchmarks.longtail.workload import SPOT_META

    (tmp / SPOT_META).write_text(json.dumps({"version": version, "top1": top1}) + "\n")
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)  # whole folder or nothing
    return {"version": version, "path": str(dest), "top1": top1}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument(
        "--export-drafter",
        type=Path,
        default=None,
        help="write the on-run's newest drafter here (EAGLE folder)",
    )
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    exported = None
    with tempfile.TemporaryDirectory() as tmp:
        on = _curve(_run(Path(tmp) / "on", a.steps, True, a.overrides))
        if a.export_drafter is not None:
            top1 = next((x["spot_top1"] for x in reversed(on) if x["spot_top1"] is not None), None)
            exported = export_drafter(Path(tmp) / "on", a.export_drafter, top1)
            print(f"[spot_training_effect] exported drafter: {exported}", flush=True)
        off = _curve(_run(Path(tmp) / "off", a.steps, False, a.overrides))
    res = {
        "machine": describe_machine(),
        "steps": a.steps,
        "exported_drafter": exported,
        "spot_on": on,
        "spot_off": off,
        "note": "acceptance rate of the learned drafter's point-mass drafts (tokens accepted / drafted) per step",
    }
    (out / "spot_training_effect.json").write_text(json.dumps(res, indent=2) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    for name, c in (("spot_on", on), ("spot_off", off)):
        ax.plot(
            [x["step"] for x in c],
            [x["learned_acceptance_rate"] for x in c],
            marker="o",
            label=f"{name.replace('_', ' ')} (bubble training {'on' if name == 'spot_on' else 'off'})",
        )
    ax.set_xlabel("RL step")
    ax.set_ylabel("learned drafter acceptance rate")
    ax.set_title("Learned drafter trained in rollout bubbles vs not trained (same seed)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "spot_training_effect.png", dpi=110)
    print(
        json.dumps(
            {
                k: [(x["step"], x["learned_acceptance_rate"]) for x in v]
                for k, v in (("spot_on", on), ("spot_off", off))
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
