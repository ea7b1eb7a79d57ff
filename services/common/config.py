"""The typed config tree (OmegaConf structured configs): every tunable of a run lives here.

``load_config(path, overrides)`` merges ``configs/*.yaml`` and ``dotted.key=value`` overrides onto these
dataclasses. An unknown key or a value of the wrong type raises ``ConfigError`` naming the key (and the
file), so a typo never runs silently with a default.

    tailspec train --config configs/gsm8k_tiny.yaml trainer.steps=2
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from services.common.grpc_auth import REDACTED

REPO_ROOT = Path(__file__).resolve().parents[2]


class ConfigError(ValueError):
    """Bad config: unknown key, wrong type, unreadable file or an invalid value."""


@dataclass
class RunConfig:
    name: str = "gsm8k_tiny"
    seed: int = 0
    runs_dir: str = "runs"  # runs/<run_id>/ unless --run-dir is given
    console: str = "rich"  # rich | plain


@dataclass
class ModelSection:
    # HF folder of the initial policy; relative paths are resolved against the repo root.
    path: str = "services/pipeline/assets/base_policy"
    # Build the embedded default policy there (tailspec base-model) when the folder is missing.
    build_if_missing: bool = True


@dataclass
class DataConfig:
    dir: str | None = None  # default: $TAILSPEC_DATA_DIR or data/gsm8k (vendored)
    train_file: str = "train.jsonl"
    test_file: str = "test.jsonl"
    shuffle: bool = True
    # the first N problems of train_file (null: all); RL then runs epochs over a fixed prompt set
    train_problems: int | None = None


@dataclass
class TrainerConfig:
    steps: int = 6  # RL steps
    prompts_per_step: int = 8  # B
    group_size: int = 4  # G responses per prompt
    backend: str = "torch"  # torch | deepspeed
    zero_stage: int = 1  # deepspeed only: 1 or 2
    lr: float = 2e-5
    weight_decay: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.99])
    max_grad_norm: float = 1.0
    micro_batch_size: int = 16  # sequences per forward/backward
    updates_per_step: int = 1  # optimizer passes over the step's rollouts (PPO epochs)
    clip_eps: float = 0.2  # PPO/GRPO ratio clip
    kl_coef: float = 0.0  # weight of the k3 KL to the reference (initial) policy; 0 = no reference forward
    format_reward: float = 0.1  # added when the response ends with '#### <number>'
    adv_eps: float = 1e-6
    scale_adv_by_std: bool = True
    save_checkpoint: bool = True  # final policy to runs/<id>/checkpoints/policy (HF format)
    # where each step's metrics row goes (VeRL's trainer.logger): console, jsonl (required), tensorboard
    # (<run_dir>/tensorboard/), wandb (offline, <run_dir>/wandb/); services/pipeline/sinks.py
    logger: list[str] = field(default_factory=lambda: ["console", "jsonl"])
    # every this many RL steps (and at the last), an atomic checkpoint runs/<id>/checkpoints/step-<k>/ that
    # `tailspec train --resume runs/<id>` continues from (policy, optimizer, data cursor, RNG, tuner); 0 = none
    save_every: int = 1
    # torch intra-op threads of the policy update; 0 = every core the trainer's process may use (the update
    # phase has the node to itself: rollout actors are idle and the spot trainer trains only in rollout
    # bubbles; on the 2-core dev machine 2 threads made a GRPO step 1.6x faster than Ray's default of 1)
    threads: int = 0
    # GPUs of the policy trainer actor (0 = CPU). Placement (Ray): the trainer gets its own placement-group
    # bundle {GPU: gpus, tailspec_trainer: 1} (each key only where it applies: GPU when gpus > 0, the
    # tailspec_trainer marker when some node advertises it: the local cluster tailspec starts and the Helm
    # chart's workers do, a head with num-cpus=0 does not), so it lands on a GPU node, never on a 0-CPU head.
    # Where neither applies the trainer shares rollout actor 0's bundle (a node with CPUs), reserving nothing.
    gpus: float = 0


@dataclass
class SpeculativeConfig:
    enabled: bool = False
    drafter: str = "off"  # off | suffix | ngram | learned | hybrid
    max_draft_tokens: int = 8
    tree_width: int = 1
    tree_depth: int = 0
    # rollout_speedup_vs_plain: replay this many of a step's prompts (x G) with speculation off and on, on
    # step 1 and every speedup_every-th step after it (the replay's seconds are not counted in step_seconds)
    speedup_sample_prompts: int = 2
    speedup_every: int = 5
    # the learned (EAGLE) drafter and the suffix+learned hybrid; checkpoint null = a fresh seeded draft head
    learned: bool = True
    learned_checkpoint: str | None = None
    eagle3: bool = False
    hybrid_threshold: float = 1.0


@dataclass
class RolloutConfig:
    num_actors: int = 2
    threads_per_actor: int = 1
    # GPUs per rollout actor (0 = CPU). Under Ray the actors are placed with a placement group of
    # num_actors bundles {CPU: threads_per_actor, GPU: gpus_per_actor}, strategy SPREAD (across nodes where
    # there is room; one node is fine); spot-trainer replica i shares bundle i (it trains in its bubble)
    gpus_per_actor: float = 0
    max_batch_size: int = 64  # slots per actor
    max_new_tokens: int = 320
    temperature: float = 0.9
    top_p: float = 1.0
    top_k: int = 0
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)


@dataclass
class TunerSection:
    """The adaptive strategy (services/tuner): bandit over arms per batch-size bucket + length-aware budgets.

    With ``enabled`` the rollout actors ignore ``rollout.speculative.drafter`` and follow the tuner's table.
    ``arms``: list of {drafter, max_draft_tokens, tree_width, tree_depth} (null = the shipped defaults, minus
    drafters the run does not have); ``bandit``: BanditConfig fields; ``budgets``: BudgetConfig fields.
    ``learned_min_top1``: the learned drafter's arms (``learned``, ``hybrid``) stay out of the strategy table
    until the spot trainer's latest top-1 accuracy (the head predicting the policy's next token on fresh
    hidden states) reaches it; before that, probing an untrained head only slows rollouts. 0 = always in.
    ``init_state``: an earlier run's ``checkpoints/tuner_state.json`` to start from (same model and machine:
    the arms' costs carry over; the learned drafter's arms start afresh); null = a cold tuner.
    """

    enabled: bool = True
    learned_min_top1: float = 0.5
    init_state: str | None = None
    arms: list[Any] | None = None
    bandit: dict[str, Any] = field(default_factory=dict)
    budgets: dict[str, Any] = field(default_factory=dict)


@dataclass
class SpotSection:
    """Drafter training in rollout bubbles (services/spot_trainer, services/coordinator)."""

    enabled: bool = True  # false: the learned drafter is never trained (its acceptance stays flat)
    preempt_deadline_s: float = 2.0
    min_fresh_samples: int = 256  # buffer rows of the current policy versions before a grant
    capacity_tokens: int = 200_000
    keep_versions: int = 2  # train on the last K policy versions' hidden states
    batch_size: int = 32
    seq_len: int = 4  # consecutive positions per sample (EAGLE unrolls over them)
    lr: float = 1.0e-3
    checkpoint_every: int = 50
    replicas: int | None = None  # data-parallel replicas (parameter averaging); null = one per rollout actor
    # CPU priority (nice increment, 0..19) of the training thread: bubble work yields to the critical path
    nice: int = 19
    # share of rollout requests whose hidden states are streamed to the spot trainer (chosen by a hash of the
    # request id). Collecting and shipping every request's cost ~18% more CPU than decoding alone at batch 64
    # (one process, receiver included; inside the noise of a 4-step RL run), while a bubble trains on a few
    # thousand rows of the ~9,000 a default step streams at 1.0
    stream_fraction: float = 0.25
    # a grant over gRPC always carries a deadline (an open-ended one is refused): granted now + this, though
    # the end of the rollout phase takes the worker back much sooner
    grant_deadline_s: float = 3600.0


@dataclass
class GrpcSection:
    """Where every service actor serves gRPC (coordinator, rollout actors, tuner, spot trainer). Every call,
    loopback included, carries the run's secret (``authorization: Bearer <token>``): ``token`` (or
    ``$TAILSPEC_GRPC_TOKEN``) is an operator-chosen one, null = a fresh secret per run. Written to
    ``<run_dir>/grpc_token`` (mode 0600), redacted in ``config.yaml``.

    ``host`` (also the spot trainer's hidden-state stream; rule in ``services/common/hosts.py``):

    - ``auto`` (default): on a Ray cluster with more than one node, every service binds its own node's IP
      (Ray's, ``ray.util.get_node_ip_address()`` inside the actor); else (one node, ``ray.use_ray=false``)
      ``127.0.0.1``;
    - ``node``: always the node's IP (``127.0.0.1`` without Ray);
    - a wildcard (``0.0.0.0``, ``::``): binds it and advertises the node's IP, so the address handed to
      other services is reachable (never ``0.0.0.0`` or loopback);
    - anything else (an IP, a hostname): bound and advertised as given: an explicit host wins.
    """

    host: str = "auto"
    token: str | None = None


@dataclass
class CoordinatorSection:
    """The coordinator actor (``tailspec status --address host:port``): ``port`` 0 = a free port (printed and
    written to summary.json); workers heartbeat every ``heartbeat_interval_s`` and are FAILED after
    ``heartbeat_timeout_s`` of silence."""

    port: int = 0
    keep_serving: bool = False  # keep answering after the run ends (tests, inspection)
    heartbeat_interval_s: float = 1.0
    heartbeat_timeout_s: float = 30.0


@dataclass
class MetricsSection:
    """Prometheus metrics (services/common/metrics.py). Inside Ray, Ray's metrics agent exports them; outside Ray
    (ray.use_ray=false) ``port`` starts a prometheus_client endpoint on ``host`` (0 = a free port)."""

    enabled: bool = True
    port: int | None = None
    host: str = "127.0.0.1"


@dataclass
class RayConfig:
    address: str | None = None  # None: $RAY_ADDRESS if set, else start a local cluster; "auto" joins one
    num_cpus: int | None = None
    temp_dir: str | None = None
    use_ray: bool = True  # False runs every service in-process (debugging, tests)
    # how long to wait for the placement groups (rollout actors, policy trainer) before failing with what is
    # missing, instead of hanging on a cluster that cannot hold them
    placement_timeout_s: float = 300.0


# ---- the task (services/pipeline/tasks) and the held-out evaluation (services/pipeline/evaluation.py)
@dataclass
class TaskSection:
    """``name``: gsm8k | running_total. It picks the data folder when ``data.dir`` is null and the
    base-model recipe ``model.build_if_missing`` builds (``tailspec base-model --task NAME``)."""

    name: str = "gsm8k"


@dataclass
class EvalSection:
    """Accuracy on a fixed held-out set (``data.test_file``, its first ``n`` problems), greedy and at
    ``rollout.temperature``, decoded by the rollout actors with speculation off: before step 1, after every
    ``every`` steps (0 = none in between) and after the last step."""

    enabled: bool = True
    every: int = 0
    n: int = 200
    sampled: bool = True  # also at the training temperature (one sample per problem)
    max_new_tokens: int | None = None  # null = rollout.max_new_tokens


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    model: ModelSection = field(default_factory=ModelSection)
    data: DataConfig = field(default_factory=DataConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    tuner: TunerSection = field(default_factory=TunerSection)
    spot: SpotSection = field(default_factory=SpotSection)
    grpc: GrpcSection = field(default_factory=GrpcSection)
    coordinator: CoordinatorSection = field(default_factory=CoordinatorSection)
    metrics: MetricsSection = field(default_factory=MetricsSection)
    ray: RayConfig = field(default_factory=RayConfig)
    task: TaskSection = field(default_factory=TaskSection)
    eval: EvalSection = field(default_factory=EvalSection)


def _non_finite(node: Any, prefix: str = "") -> str | None:
    """The dotted key of the first float in the config tree that is NaN or infinite, else None."""
    if dataclasses.is_dataclass(node):
        for f in dataclasses.fields(node):
            bad = _non_finite(getattr(node, f.name), f"{prefix}.{f.name}" if prefix else f.name)
            if bad:
                return bad
    elif isinstance(node, dict):
        for k, v in node.items():
            bad = _non_finite(v, f"{prefix}.{k}" if prefix else str(k))
            if bad:
                return bad
    elif isinstance(node, list):
        for i, v in enumerate(node):
            bad = _non_finite(v, f"{prefix}[{i}]")
            if bad:
                return bad
    elif isinstance(node, float) and not math.isfinite(node):
        return prefix
    return None


LOGGERS = ("console", "jsonl", "tensorboard", "wandb")
_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb"}  # sink -> the package it needs


def check_loggers(names: Sequence[str], key: str = "trainer.logger") -> str | None:
    """Why ``names`` is not a valid ``trainer.logger`` (one line naming ``key``), or None when it is."""
    names = list(names)
    unknown = [n for n in names if n not in LOGGERS]
    if unknown:
        return f"config key {key!r}: unknown logger {unknown[0]!r} (known: {', '.join(LOGGERS)})"
    if "jsonl" not in names:
        return f"config key {key!r} must include 'jsonl' (metrics.jsonl is the run's record; got {names})"
    for n in names:
        pkg = _PACKAGES.get(n)
        if pkg and importlib.util.find_spec(pkg) is None:
            return f"config key {key!r} names {n!r}, but the {pkg!r} package is not installed (pip install {pkg})"
    return None


def _validate(cfg: Config) -> None:
    bad = _non_finite(cfg)
    if bad:
        raise ConfigError(
            f"config key {bad!r} must be a finite number (got {OmegaConf.select(OmegaConf.structured(cfg), bad)!r})"
        )
    t, sp = cfg.trainer, cfg.spot
    checks = [
        (
            "data.train_problems",
            cfg.data.train_problems is None or cfg.data.train_problems >= 1,
            "must be >= 1",
        ),
        ("trainer.steps", cfg.trainer.steps >= 1, "must be >= 1"),
        ("trainer.prompts_per_step", cfg.trainer.prompts_per_step >= 1, "must be >= 1"),
        ("trainer.group_size", cfg.trainer.group_size >= 2, "must be >= 2 (group-normalized advantages)"),
        ("trainer.backend", cfg.trainer.backend in ("torch", "deepspeed"), "must be 'torch' or 'deepspeed'"),
        ("trainer.zero_stage", cfg.trainer.zero_stage in (1, 2), "must be 1 or 2"),
        ("trainer.lr", cfg.trainer.lr > 0, "must be > 0"),
        ("trainer.weight_decay", t.weight_decay >= 0, "must be >= 0"),
        (
            "trainer.betas",
            len(t.betas) == 2 and all(0 <= b < 1 for b in t.betas),
            "must be two numbers in [0, 1)",
        ),
        ("trainer.max_grad_norm", t.max_grad_norm > 0, "must be > 0"),
        ("trainer.clip_eps", t.clip_eps > 0, "must be > 0"),
        ("trainer.kl_coef", t.kl_coef >= 0, "must be >= 0"),
        ("trainer.format_reward", t.format_reward >= 0, "must be >= 0"),
        ("trainer.adv_eps", t.adv_eps > 0, "must be > 0"),
        ("trainer.micro_batch_size", cfg.trainer.micro_batch_size >= 1, "must be >= 1"),
        ("trainer.updates_per_step", cfg.trainer.updates_per_step >= 1, "must be >= 1"),
        ("trainer.save_every", t.save_every >= 0, "must be >= 0 (0 = no step checkpoints)"),
        ("trainer.threads", cfg.trainer.threads >= 0, "must be >= 0 (0 = all usable cores)"),
        ("trainer.gpus", t.gpus >= 0, "must be >= 0"),
        ("rollout.gpus_per_actor", cfg.rollout.gpus_per_actor >= 0, "must be >= 0"),
        ("ray.placement_timeout_s", cfg.ray.placement_timeout_s > 0, "must be > 0"),
        ("grpc.host", bool(cfg.grpc.host.strip()), "must be auto, node, a wildcard, an IP or a hostname"),
        ("rollout.num_actors", cfg.rollout.num_actors >= 1, "must be >= 1"),
        ("rollout.threads_per_actor", cfg.rollout.threads_per_actor >= 1, "must be >= 1"),
        ("rollout.max_batch_size", cfg.rollout.max_batch_size >= 1, "must be >= 1"),
        ("rollout.max_new_tokens", cfg.rollout.max_new_tokens >= 1, "must be >= 1"),
        ("rollout.temperature", cfg.rollout.temperature >= 0, "must be >= 0"),
        ("rollout.top_p", 0 < cfg.rollout.top_p <= 1, "must be in (0, 1]"),
        ("rollout.top_k", cfg.rollout.top_k >= 0, "must be >= 0"),
        (
            "rollout.speculative.drafter",
            cfg.rollout.speculative.drafter in ("off", "suffix", "ngram", "learned", "hybrid"),
            "must be one of off, suffix, ngram, learned, hybrid",
        ),
        (
            "rollout.speculative.max_draft_tokens",
            cfg.rollout.speculative.max_draft_tokens >= 1,
            "must be >= 1",
        ),
        ("rollout.speculative.tree_width", cfg.rollout.speculative.tree_width >= 1, "must be >= 1"),
        ("rollout.speculative.tree_depth", cfg.rollout.speculative.tree_depth >= 0, "must be >= 0"),
        (
            "rollout.speculative.speedup_sample_prompts",
            cfg.rollout.speculative.speedup_sample_prompts >= 0,
            "must be >= 0",
        ),
        (
            "rollout.speculative.speedup_every",
            cfg.rollout.speculative.speedup_every >= 1,
            "must be >= 1",
        ),
        ("spot.preempt_deadline_s", sp.preempt_deadline_s > 0, "must be > 0"),
        ("spot.min_fresh_samples", sp.min_fresh_samples >= 1, "must be >= 1"),
        ("spot.capacity_tokens", sp.capacity_tokens >= 1, "must be >= 1"),
        ("spot.keep_versions", sp.keep_versions >= 1, "must be >= 1"),
        ("spot.batch_size", sp.batch_size >= 1, "must be >= 1"),
        ("spot.seq_len", sp.seq_len >= 1, "must be >= 1"),
        ("spot.lr", sp.lr > 0, "must be > 0"),
        ("spot.checkpoint_every", sp.checkpoint_every >= 1, "must be >= 1"),
        (
            "metrics.port",
            cfg.metrics.port is None or 0 <= cfg.metrics.port <= 65535,
            "must be in 0..65535 or null",
        ),
        ("ray.num_cpus", cfg.ray.num_cpus is None or cfg.ray.num_cpus >= 1, "must be >= 1 or null"),
        ("spot.replicas", cfg.spot.replicas is None or cfg.spot.replicas >= 1, "must be >= 1 or null"),
        ("spot.nice", 0 <= cfg.spot.nice <= 19, "must be in 0..19"),
        ("spot.stream_fraction", 0 < cfg.spot.stream_fraction <= 1, "must be in (0, 1]"),
        ("spot.grant_deadline_s", 0 < cfg.spot.grant_deadline_s <= 86_400, "must be in (0, 86400]"),
        ("tuner.learned_min_top1", 0 <= cfg.tuner.learned_min_top1 <= 1, "must be in [0, 1]"),
        ("coordinator.port", 0 <= cfg.coordinator.port <= 65535, "must be in 0..65535"),
        ("coordinator.heartbeat_interval_s", cfg.coordinator.heartbeat_interval_s > 0, "must be > 0"),
        (
            "coordinator.heartbeat_timeout_s",
            cfg.coordinator.heartbeat_timeout_s > cfg.coordinator.heartbeat_interval_s,
            "must be > coordinator.heartbeat_interval_s",
        ),
    ]
    checks += [
        ("task.name", cfg.task.name in ("gsm8k", "running_total"), "must be gsm8k or running_total"),
        ("eval.every", cfg.eval.every >= 0, "must be >= 0 (0 = before the first and after the last step)"),
        ("eval.n", cfg.eval.n >= 1, "must be >= 1"),
        (
            "eval.max_new_tokens",
            cfg.eval.max_new_tokens is None or cfg.eval.max_new_tokens >= 1,
            "must be >= 1",
        ),
    ]
    for key, ok, why in checks:
        if not ok:
            raise ConfigError(
                f"config key {key!r} {why} (got {OmegaConf.select(OmegaConf.structured(cfg), key)!r})"
            )
    bad_logger = check_loggers(cfg.trainer.logger)
    if bad_logger:
        raise ConfigError(bad_logger)
    # The one service module the config imports, and only here, in the function: the tuner section is checked
    # with the tuner's own parsers (services/tuner/config_check.py), while importing the config (every service
    # does) pulls in no service. Nothing of the tuner imports this module, so there is no cycle.
    from services.tuner.config_check import TunerConfigError, check_tuner_section

    try:
        check_tuner_section(cfg.tuner)
    except TunerConfigError as e:
        raise ConfigError(str(e)) from None


def load_config(path: str | os.PathLike | None = None, overrides: list[str] | None = None) -> Config:
    """Load a YAML config onto the schema, apply ``key=value`` overrides, validate.

    Raises:
        ConfigError: unreadable file, unknown key, wrong type, or invalid value (message names the key).
    """
    schema = OmegaConf.structured(Config)
    layers: list[DictConfig] = [schema]
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {str(p)!r} not found")
        try:
            layers.append(OmegaConf.load(p))
        except Exception as e:  # yaml errors carry line numbers
            raise ConfigError(f"{p}: cannot parse YAML: {e}") from None
    for ov in overrides or []:
        if "=" not in ov:
            raise ConfigError(f"override {ov!r} is not of the form dotted.key=value")
    try:
        if overrides:
            layers.append(OmegaConf.from_dotlist(list(overrides)))
        for layer in layers[1:]:
            _yaml_words_as_strings(layer, Config)
        merged = OmegaConf.merge(*layers)
        cfg: Config = OmegaConf.to_object(merged)  # type: ignore[assignment]
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None)
        where = f" in {path}" if path else ""
        msg = str(e).splitlines()[0]
        raise ConfigError(f"config key {key!r}{where}: {msg}") from None
    _validate(cfg)
    return cfg


def _yaml_words_as_strings(layer: DictConfig, cls: type) -> None:
    """YAML 1.1 reads a bare ``off`` / ``no`` as false and ``on`` / ``yes`` as true, so
    ``rollout.speculative.drafter=off`` (or ``drafter: off`` in a file) would reach a ``str`` field as the
    boolean and be stringified to ``'False'``. In a field typed ``str`` the user meant the word: put ``'off'``
    / ``'on'`` back (in place) before merging; validation then judges the word."""
    hints = typing.get_type_hints(cls)
    for name in list(layer.keys()):
        hint = hints.get(str(name))
        if hint is None:
            continue  # unknown key: the merge reports it
        value = layer[name]
        if dataclasses.is_dataclass(hint) and isinstance(value, DictConfig):
            _yaml_words_as_strings(value, hint)
        elif isinstance(value, bool) and hint in (str, str | None):
            layer[name] = "on" if value else "off"


def to_yaml(cfg: Config, redact: bool = True) -> str:
    """The config as YAML; with ``redact`` (the default) secrets (``grpc.token``) read ``<redacted>``."""
    conf = OmegaConf.structured(cfg)
    if redact and cfg.grpc.token:
        conf.grpc.token = REDACTED
    return OmegaConf.to_yaml(conf)


def resolve_path(p: str) -> Path:
    """Relative paths in configs are relative to the repo root (so runs work from any directory)."""
    path = Path(os.path.expanduser(p))
    return path if path.is_absolute() else REPO_ROOT / path


__all__ = ["Config", "ConfigError", "load_config", "to_yaml", "resolve_path", "REPO_ROOT", "MISSING"]
