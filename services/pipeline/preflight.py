"""Preflight: the run's inputs checked before anything is written.

The model folder (config.json, safetensors header, tokenizer; built first when it is the embedded default
policy and ``model.build_if_missing``), the training data, the run folder (fresh, or resumable with
``--resume``) and the CPUs / GPUs a local Ray cluster can place. Every failure is a ``PreflightError`` with
one clear line; ``tailspec train`` prints it and exits with status 2.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import safe_open
from tokenizers import Tokenizer

from services.common.config import Config, resolve_path
from services.pipeline.base_model import build_base_model
from services.pipeline.checkpoints import latest_checkpoint
from services.pipeline.datasets import GSM8KExample, default_dataset_dir, load_gsm8k
from services.pipeline.tasks import BASE_RECIPES, task_data_dir
from services.rollout_actor.model import ModelConfig, ModelLoadError, Transformer


class PreflightError(ValueError):
    """Bad input found before anything is written: missing data, bad model folder, tokenizer mismatch."""


def resolve_model(cfg: Config, log=print) -> Path:
    """The checked model folder ``model.path``; built first with the task's base-model recipe when missing
    and ``model.build_if_missing`` (else PreflightError)."""
    path = resolve_path(cfg.model.path)
    if not path.exists():
        if not cfg.model.build_if_missing:
            raise PreflightError(f"model directory {path} does not exist (model.build_if_missing is false)")
        log(f"building the embedded default policy into {path} (first use; a few minutes)")
        build_base_model(path, data_dir=data_dir(cfg), seed=cfg.run.seed, **BASE_RECIPES[cfg.task.name])
    check_model_dir(path)
    return path


def check_model_dir(path: Path) -> None:
    """Raises PreflightError unless ``path`` holds config.json, model.safetensors and a matching tokenizer."""
    if not path.is_dir():
        raise PreflightError(f"model directory {path} does not exist")
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        if not (path / name).is_file():
            raise PreflightError(f"model directory {path} has no {name}")
    try:
        mcfg = json.loads((path / "config.json").read_text())
    except json.JSONDecodeError as e:
        raise PreflightError(f"{path / 'config.json'}: invalid JSON ({e})") from None
    try:
        model_cfg = ModelConfig.from_hf_dict(mcfg, str(path / "config.json"))
    except ModelLoadError as e:
        raise PreflightError(str(e)) from None
    try:
        tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    except Exception as e:  # noqa: BLE001 - tokenizers raises a bare Exception on a corrupt file
        raise PreflightError(f"{path / 'tokenizer.json'}: cannot load ({str(e).splitlines()[0]})") from None
    vocab = mcfg.get("vocab_size", 0)
    if tok.get_vocab_size() > vocab:
        raise PreflightError(
            f"tokenizer mismatch: {path / 'tokenizer.json'} has {tok.get_vocab_size()} tokens but "
            f"config.json vocab_size is {vocab}"
        )
    eos = mcfg.get("eos_token_id")
    eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
    if not eos_ids:
        raise PreflightError(f"{path / 'config.json'}: no eos_token_id")
    for e in eos_ids:
        if tok.id_to_token(e) is None:
            raise PreflightError(
                f"tokenizer mismatch: eos_token_id {e} of config.json is not in tokenizer.json"
            )
    check_weights(path / "model.safetensors", model_cfg)


def check_weights(path: Path, cfg: ModelConfig) -> None:
    """Raises PreflightError unless the safetensors file at ``path`` has a readable header whose tensors are
    exactly the model's, with the model's shapes (read from the header only: no tensor is loaded)."""
    try:
        with safe_open(str(path), framework="pt") as f:
            shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except Exception as e:  # noqa: BLE001 - SafetensorError, OSError, ...
        raise PreflightError(f"{path}: not a readable safetensors file ({str(e).splitlines()[0]})") from None
    with torch.device("meta"):
        want = {k: tuple(v.shape) for k, v in Transformer(cfg).state_dict().items()}
    if cfg.tie_word_embeddings:
        want.pop("lm_head.weight", None)
        shapes.pop("lm_head.weight", None)
    missing = sorted(set(want) - set(shapes))
    if missing:
        raise PreflightError(
            f"{path}: missing tensors {missing[:3]} (config.json describes a different model)"
        )
    unexpected = sorted(set(shapes) - set(want))
    if unexpected:
        raise PreflightError(
            f"{path}: unexpected tensors {unexpected[:3]} (config.json describes a different model)"
        )
    for k, shape in want.items():
        if shapes[k] != shape:
            raise PreflightError(
                f"{path}: tensor {k!r} has shape {list(shapes[k])}, config.json implies {list(shape)}"
            )


def check_run_dir(run_dir: Path, resume: bool = False) -> None:
    """Raises PreflightError when ``run_dir`` holds a run already (finished, or unfinished without ``resume``),
    has nothing to resume (``resume``), or cannot be created."""
    if (run_dir / "summary.json").exists():
        raise PreflightError(f"run directory {run_dir} already holds a finished run (summary.json)")
    if resume:
        if latest_checkpoint(run_dir) is None:
            raise PreflightError(f"--resume {run_dir}: no complete checkpoint in {run_dir / 'checkpoints'}")
        return
    metrics = run_dir / "metrics.jsonl"
    if metrics.exists() and metrics.stat().st_size > 0:
        raise PreflightError(
            f"run directory {run_dir} holds an unfinished run (metrics.jsonl without summary.json): continue it "
            f"with --resume {run_dir}, or choose another --run-dir"
        )
    parent = run_dir
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise PreflightError(f"run directory {run_dir} cannot be created: {parent} is not a writable folder")


def check_cpus(cfg: Config) -> None:
    """Raises PreflightError when a local Ray cluster could not place every rollout actor (each reserves
    ``rollout.threads_per_actor`` CPUs and ``rollout.gpus_per_actor`` GPUs; the trainer ``trainer.gpus``
    GPUs; the other services reserve none), instead of waiting for ever. (A joined cluster is checked when
    its placement groups are created: ``ray.placement_timeout_s``.)"""
    if not cfg.ray.use_ray or cfg.ray.address or os.environ.get("RAY_ADDRESS"):
        return
    have = cfg.ray.num_cpus or os.cpu_count() or 1
    need = cfg.rollout.num_actors * cfg.rollout.threads_per_actor
    if need > have:
        raise PreflightError(
            f"rollout.num_actors={cfg.rollout.num_actors} x rollout.threads_per_actor="
            f"{cfg.rollout.threads_per_actor} needs {need} CPUs; the local Ray cluster has {have} (ray.num_cpus)"
        )
    r = cfg.rollout
    gpus = r.num_actors * r.gpus_per_actor + cfg.trainer.gpus
    if gpus > 0:
        have_gpus = torch.cuda.device_count()
        if gpus > have_gpus:
            raise PreflightError(
                f"rollout.num_actors={r.num_actors} x rollout.gpus_per_actor={r.gpus_per_actor:g} + "
                f"trainer.gpus={cfg.trainer.gpus:g} needs {gpus:g} GPUs; this machine has {have_gpus}"
            )


def data_dir(cfg: Config) -> Path:
    """``data.dir``, else the task's folder (GSM8K: $TAILSPEC_DATA_DIR or data/gsm8k)."""
    return Path(cfg.data.dir) if cfg.data.dir else (task_data_dir(cfg.task.name) or default_dataset_dir())


def load_data(cfg: Config) -> list[GSM8KExample]:
    """The training examples (``data.train_file`` in ``data_dir``, its first ``data.train_problems`` when set);
    PreflightError when there are none."""
    d = data_dir(cfg)
    data = load_gsm8k(d / cfg.data.train_file)
    if not data:
        raise PreflightError(f"{d / cfg.data.train_file}: the dataset holds no examples")
    return data[: cfg.data.train_problems]
