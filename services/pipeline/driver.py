"""The RL driver: GRPO on GSM8K over a pool of rollout actors and a policy-trainer actor.

One RL step (see docs/architecture.md, "One RL step"):

1. sample ``trainer.prompts_per_step`` prompts (B) from GSM8K train, ``trainer.group_size`` (G) responses
   each; assign whole groups to rollout actors, predicted-longest first, to the least-loaded actor (LPT);
2. every actor decodes its shard with continuous batching; the driver gathers the responses;
3. rewards (GSM8K final-answer match + format reward), group-normalized advantages;
4. one GRPO update on the policy-trainer actor; the new weights go (versioned) to every rollout actor;
5. one line of ``metrics.jsonl``, a progress line, and at the end ``summary.json`` and the plots.

With ``ray.use_ray=false`` the same services run in-process (tests, debugging). Entry point:
``tailspec train --config configs/gsm8k_tiny.yaml`` (``services/pipeline/cli.py``).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import threading
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from services.common.config import Config, resolve_path, to_yaml
from services.common.ray_utils import ActorPool, init_ray
from services.pipeline.control_plane import ControlPlane, actor_died
from services.pipeline.datasets import GSM8KExample, default_dataset_dir, format_prompt, load_gsm8k
from services.pipeline.outputs import RunWriter, length_stats, new_run_id, plot_curves, plot_response_lengths
from services.pipeline.rewards import gsm8k_reward
from services.rollout_actor.model import ModelConfig, ModelLoadError, Transformer
from services.rollout_actor.speculative.stats import LONG_TAIL_BATCH
from services.rollout_actor.worker import RolloutRequest, ShardResult


class PreflightError(ValueError):
    """Bad input found before anything is written: missing data, bad model folder, tokenizer mismatch."""


class TrainingError(RuntimeError):
    """The run cannot go on (e.g. a non-finite loss); the policy of that step is neither synced nor saved."""


class RunInterrupted(Exception):
    """SIGINT / SIGTERM: the run stopped after a step and wrote a checkpoint (``exit_code`` = 128 + signal)."""

    def __init__(self, signum: int, step: int, run_dir: Path):
        self.exit_code = 128 + signum
        name = signal.Signals(signum).name
        super().__init__(
            f"interrupted by {name} after step {step}; checkpoint written. Resume with: "
            f"tailspec train --resume {run_dir}"
        )


CHECKPOINTS_KEPT = 2  # step checkpoints kept in checkpoints/ (the newest ones)


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete step checkpoint ``run_dir/checkpoints/step-<k>`` (a folder is renamed into place
    only once everything in it is written), or None."""
    done = [p for p in (run_dir / "checkpoints").glob("step-*") if (p / "driver.json").is_file()]
    return max(done, key=lambda p: int(p.name.split("-", 1)[1]), default=None)


# ---------------------------------------------------------------------------------------------- preflight
def resolve_model(cfg: Config, log=print) -> Path:
    path = resolve_path(cfg.model.path)
    if not path.exists():
        if not cfg.model.build_if_missing:
            raise PreflightError(f"model directory {path} does not exist (model.build_if_missing is false)")
        from services.pipeline.base_model import build_base_model
        from services.pipeline.tasks import BASE_RECIPES

        log(f"building the embedded default policy into {path} (first use; a few minutes)")
        build_base_model(path, data_dir=data_dir(cfg), seed=cfg.run.seed, **BASE_RECIPES[cfg.task.name])
    check_model_dir(path)
    return path


def check_model_dir(path: Path) -> None:
    """Raises PreflightError unless ``path`` holds config.json, model.safetensors and a matching tokenizer."""
    import json

    from tokenizers import Tokenizer

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
    import torch
    from safetensors import safe_open

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
        import torch

        have_gpus = torch.cuda.device_count()
        if gpus > have_gpus:
            raise PreflightError(
                f"rollout.num_actors={r.num_actors} x rollout.gpus_per_actor={r.gpus_per_actor:g} + "
                f"trainer.gpus={cfg.trainer.gpus:g} needs {gpus:g} GPUs; this machine has {have_gpus}"
            )


def data_dir(cfg: Config) -> Path:
    """``data.dir``, else the task's folder (GSM8K: $TAILSPEC_DATA_DIR or data/gsm8k)."""
    from services.pipeline.tasks import task_data_dir

    return Path(cfg.data.dir) if cfg.data.dir else (task_data_dir(cfg.task.name) or default_dataset_dir())


def load_data(cfg: Config) -> list[GSM8KExample]:
    d = data_dir(cfg)
    data = load_gsm8k(d / cfg.data.train_file)
    if not data:
        raise PreflightError(f"{d / cfg.data.train_file}: the dataset holds no examples")
    return data


# ---------------------------------------------------------------------------------------------- scheduling
def assign_groups(groups: list[tuple[str, int]], num_workers: int) -> list[list[str]]:
    """LPT: groups (problem_id, predicted length) sorted longest first, each to the least-loaded worker."""
    loads = [0.0] * num_workers
    shards: list[list[str]] = [[] for _ in range(num_workers)]
    for pid, pred in sorted(groups, key=lambda g: -g[1]):
        w = min(range(num_workers), key=lambda i: (loads[i], i))
        shards[w].append(pid)
        loads[w] += pred
    return shards


class LengthPredictor:
    """Per-problem mean of recent response lengths (unknown problems: the running global mean)."""

    def __init__(self, keep: int = 16):
        self.hist: dict[str, list[int]] = {}
        self.keep = keep
        self.global_mean = 100.0

    def predict(self, pid: str) -> float:
        h = self.hist.get(pid)
        return float(np.mean(h)) if h else self.global_mean

    def update(self, pid: str, length: int) -> None:
        h = self.hist.setdefault(pid, [])
        h.append(length)
        del h[: -self.keep]
        self.global_mean = 0.95 * self.global_mean + 0.05 * length


# ---------------------------------------------------------------------------------------------- driver
class RLDriver:
    """The RL loop. ``resume``: continue the run in ``run_dir`` from its newest complete checkpoint."""

    def __init__(self, cfg: Config, run_dir: Path | None = None, console=None, resume: bool = False):
        self.cfg = cfg
        self.resume = resume
        self.console = console
        self.log = console.print if console is not None else print
        # --- preflight: nothing is written before these pass
        self.model_path = resolve_model(cfg, self.log)
        self.train = load_data(cfg)
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(self.model_path / "tokenizer.json"))
        from services.pipeline.evaluation import RunEvaluator

        self.evaluator = RunEvaluator(
            cfg, self.tokenizer, data_dir(cfg)
        )  # loads the held-out set (preflight)
        self.run_dir = Path(run_dir) if run_dir else resolve_path(cfg.run.runs_dir) / new_run_id(cfg.run.name)
        check_run_dir(self.run_dir, resume)
        check_cpus(cfg)
        self.rng = random.Random(cfg.run.seed)
        self.order = list(range(len(self.train)))
        if cfg.data.shuffle:
            self.rng.shuffle(self.order)
        self.cursor = 0
        self.lengths = LengthPredictor()
        self.rows: list[dict] = []
        self.lengths_per_step: list[list[int]] = []
        self._timeline = None
        self._pending_updates: list[list[dict]] = []  # each update's samples since the newest checkpoint
        self.trainer_restarts = 0

    # ------------------------------------------------------------------ services
    def _start_services(self) -> None:
        """Ray (when used), metrics, and the control plane: coordinator, tuner, rollout actors, spot trainer,
        all speaking gRPC (``services/pipeline/control_plane.py``); then the policy trainer."""
        cfg = self.cfg
        if cfg.ray.use_ray:
            import ray

            if not ray.is_initialized():
                self._owns_ray = True
                self.log(init_ray(cfg.ray.address, cfg.ray.num_cpus, cfg.ray.temp_dir))
        self.metrics = None
        self.metrics_endpoint = None
        if cfg.metrics.enabled:
            from services.common.metrics import TailspecMetrics, install_process_metrics

            backend = "ray" if cfg.ray.use_ray else "prometheus"
            self.metrics = TailspecMetrics(backend=backend)
            install_process_metrics(self.metrics)  # in-process services export live through the driver's
            if cfg.metrics.port is not None and backend == "prometheus":
                port = self.metrics.start_http_server(cfg.metrics.port, cfg.metrics.host)
                self.metrics_endpoint = f"http://{cfg.metrics.host}:{port}/metrics"
                self.log(f"metrics: {self.metrics_endpoint}")
        from services.spot_trainer.bubbles import BubbleAccounting

        self.bubbles = BubbleAccounting()
        self.phase = "rollout"
        from services.common.placement import RunPlacement

        # placement groups (rollout actors spread, the trainer in its own bundle): created by the plane's
        # start, removed by _stop_services
        self.placement = RunPlacement.from_config(cfg)
        self.plane = ControlPlane(
            cfg,
            self.model_path,
            self.run_dir,
            self.learned_cfg(),
            self.available_drafters(),
            self._run_info,
            self.log,
            placement=self.placement,
        )
        self.plane.start()
        if self.metrics is not None:
            from services.common.metrics import table_arm_buckets
            from services.spot_trainer.stream import DROP_REASONS

            table = self.plane.initial_table
            self.metrics.init_series(
                [str(w) for w in self.plane.worker_ids],
                self.available_drafters() if self.speculating else (),
                table_arm_buckets(table) if table else (),
                DROP_REASONS if self.plane.spot is not None else (),
            )
        self.log(
            f"coordinator at {self.plane.coordinator_address}: tailspec status --run-dir {self.run_dir} "
            "(the run's token is in its grpc_token file, mode 0600)"
        )
        from services.policy_trainer.actor import PolicyTrainerService

        self.trainer = ActorPool.create(
            PolicyTrainerService,
            [(str(self.model_path), asdict(cfg.trainer), cfg.run.seed)],
            cfg.ray.use_ray,
            num_cpus=0,
            num_gpus=cfg.trainer.gpus,
            options_list=[self.placement.trainer_options()],
        )

    @property
    def coordinator_address(self) -> str | None:
        plane = getattr(self, "plane", None)
        return plane.coordinator_address if plane is not None else None

    def _set_phase(self, phase: str) -> None:
        self.phase = phase
        self.plane.report_run()

    def _export_metrics(self, row: dict) -> None:
        """The step's row to Prometheus (same numbers as metrics.jsonl)."""
        m = self.metrics
        if m is None:
            return
        m.record_step(row)  # arm selections by bucket too; worker states are exported by the coordinator
        m.record_responses(self.lengths_per_step[-1])

    @property
    def speculating(self) -> bool:
        return self.cfg.tuner.enabled or (
            self.cfg.rollout.speculative.enabled and self.cfg.rollout.speculative.drafter != "off"
        )

    @property
    def strategy_name(self) -> str:
        return "tuner" if self.cfg.tuner.enabled else self.cfg.rollout.speculative.drafter

    def _run_info(self) -> dict:
        last = self.rows[-1] if self.rows else {}
        t = self.bubbles.totals()
        return {
            "step": len(self.rows) + (0 if self.phase == "done" else 1),
            "phase": self.phase,
            "policy_version": last.get("policy_version", 0),
            "drafter_version": self.plane.drafter_version,
            "table_version": (last.get("tuner") or {}).get("table_version", 0),
            "bubble_seconds": t["idle_seconds"],
            "bubble_trained_seconds": t["trained_seconds"],
        }

    def learned_cfg(self) -> dict | None:
        spec = self.cfg.rollout.speculative
        if not spec.learned:
            return None
        ckpt = str(resolve_path(spec.learned_checkpoint)) if spec.learned_checkpoint else None
        return {
            "checkpoint": ckpt,
            "eagle3": spec.eagle3,
            "seed": self.cfg.run.seed,
            "hybrid_threshold": spec.hybrid_threshold,
        }

    def available_drafters(self) -> list[str]:
        return ["suffix", "ngram"] + (["learned", "hybrid"] if self.cfg.rollout.speculative.learned else [])

    def _stop_services(self) -> None:
        if getattr(self, "metrics", None) is not None:
            from services.common.metrics import install_process_metrics

            install_process_metrics(None)
        if getattr(self, "plane", None) is not None:
            self.phase = "done"
            self.plane.report_run()
            self.plane.stop()
        if getattr(self, "trainer", None) is not None:
            self.trainer.shutdown()
        if getattr(self, "placement", None) is not None:
            self.placement.remove()
        if getattr(self, "_owns_ray", False):
            import ray

            ray.shutdown()

    # ------------------------------------------------------------------ one step
    def _next_prompts(self) -> list[GSM8KExample]:
        out = []
        for _ in range(self.cfg.trainer.prompts_per_step):
            if self.cursor >= len(self.order):
                self.rng.shuffle(self.order)
                self.cursor = 0
            out.append(self.train[self.order[self.cursor]])
            self.cursor += 1
        return out

    def _rollout(self, step: int, prompts: list[GSM8KExample]) -> tuple[list, list[ShardResult], float]:
        g = self.cfg.trainer.group_size
        reqs: dict[str, list[RolloutRequest]] = {}
        for k, ex in enumerate(prompts):
            pid = f"gsm8k-train-{ex.index}"
            ids = self.tokenizer.encode(format_prompt(ex.question)).ids
            reqs[pid] = [
                RolloutRequest(
                    f"s{step}-p{k}-g{j}",
                    pid,
                    ids,
                    seed=self.cfg.run.seed * 7_919 + step * 100_003 + k * 101 + j,
                )
                for j in range(g)
            ]
        shards = assign_groups([(pid, self.lengths.predict(pid)) for pid in reqs], len(self.plane.rollout))
        t0 = time.perf_counter()
        spec = self.cfg.rollout.speculative
        measure = (spec.enabled or self.cfg.tuner.enabled) and spec.speedup_sample_prompts > 0
        results, trained, phase_end = self.plane.rollout_phase(
            step, [[r for pid in shard for r in reqs[pid]] for shard in shards], measure
        )
        for res in results:
            w = str(res.worker)
            self.bubbles.record(step, w, res.finished_at, phase_end, trained.get(w, 0.0))
        rollout_s = time.perf_counter() - t0
        self.speedup = None
        if measure:
            # replay a fixed sample (the first groups of worker 0's shard) with speculation off and on
            sample = [r for pid in shards[0][: spec.speedup_sample_prompts] for r in reqs[pid]]
            self.speedup = self.plane.rollout.call(0, "measure_speedup", sample)
        self.tuner_row = self.plane.tune(results) if self.plane.tuner is not None else None
        return reqs, results, rollout_s

    def step(self, step: int) -> dict:
        cfg = self.cfg
        t_step = time.perf_counter()
        prompts = self._next_prompts()
        by_pid = {f"gsm8k-train-{ex.index}": ex for ex in prompts}
        self._set_phase("rollout")
        reqs, results, rollout_s = self._rollout(step, prompts)
        self._set_phase("reward")

        t0 = time.perf_counter()
        outputs = {o.request_id: o for res in results for o in res.outputs}
        groups: list[list] = []
        for pid, rs in reqs.items():
            group = []
            for r in rs:
                o = outputs[r.request_id]
                rb = gsm8k_reward(o.text or "", by_pid[pid].answer, cfg.trainer.format_reward)
                group.append((r, o, rb))
                self.lengths.update(pid, len(o.token_ids))
            groups.append(group)
        import torch

        from services.policy_trainer.grpo import group_advantages

        rewards = torch.tensor([[rb.total for _, _, rb in grp] for grp in groups])
        adv = group_advantages(rewards, eps=cfg.trainer.adv_eps, scale_by_std=cfg.trainer.scale_adv_by_std)
        samples = [
            dict(prompt_ids=r.prompt_ids, response_ids=o.token_ids, advantage=float(adv[i, j]))
            for i, grp in enumerate(groups)
            for j, (r, o, _) in enumerate(grp)
        ]
        reward_s = time.perf_counter() - t0

        t0 = time.perf_counter()
        self._set_phase("train")
        stats = self._trainer_call("train_step", samples)
        self._pending_updates.append(samples)
        bad = [k for k in ("loss", "grad_norm") if not np.isfinite(stats.get(k, 0.0))]
        if bad:
            raise TrainingError(
                f"step {step}: non-finite {' and '.join(bad)} ({', '.join(f'{k}={stats[k]}' for k in bad)}); "
                "stopped before syncing or saving that policy (lower trainer.lr?)"
            )
        self._set_phase("weight_sync")
        train_s = time.perf_counter() - t0

        t0 = time.perf_counter()
        version = int(stats["version"])
        state = self._trainer_call("policy_state_dict")
        if cfg.ray.use_ray:
            import ray

            state = ray.put(state)
        self.plane.load_weights(state, version)
        sync_s = time.perf_counter() - t0
        spot_row = self.plane.after_update(state, version)
        bubble = self.bubbles.metrics(step)

        lens = [len(o.token_ids) for grp in groups for _, o, _ in grp]
        all_rb = [rb for grp in groups for _, _, rb in grp]
        self.lengths_per_step.append(lens)
        row = {
            "step": step,
            "reward_mean": float(rewards.mean()),
            "reward_std": float(rewards.std(unbiased=False)),
            "accuracy": float(np.mean([rb.correct for rb in all_rb])),
            "format_rate": float(np.mean([rb.format > 0 for rb in all_rb]))
            if cfg.trainer.format_reward > 0
            else None,
            **length_stats(lens),
            "truncated_fraction": float(np.mean([o.finish_reason == "length" for o in outputs.values()])),
            "tokens_generated": int(sum(lens)),
            "rollout_seconds": rollout_s,
            "rollout_tokens_per_second": sum(lens) / max(rollout_s, 1e-9),
            "reward_seconds": reward_s,
            "train_seconds": train_s,
            "weight_sync_seconds": sync_s,
            "step_seconds": time.perf_counter() - t_step,
            "policy_version": version,
            "loss": stats["loss"],
            "clip_fraction": stats["clip_fraction"],
            "kl_mean": stats["kl_mean"],
            "grad_norm": stats["grad_norm"],
            **self._spec_metrics(list(outputs.values())),
            **({"tuner": self.tuner_row} if self.tuner_row else {}),
            "bubble_seconds": bubble["bubble_idle_s"],
            "bubble_trained_seconds": bubble["bubble_trained_s"],
            "bubble_utilization": bubble["bubble_utilization"],
            "drafter_version": self.plane.drafter_version,
            "trainer_restarts": self.trainer_restarts,
            **spot_row,
            "workers": [
                {
                    "worker": res.worker,
                    "requests": len(res.outputs),
                    "tokens": int(sum(len(o.token_ids) for o in res.outputs)),
                    "rollout_seconds": res.finished_at - res.started_at,
                    **self._worker_bubble(step, res.worker),
                }
                for res in results
            ],
        }
        row["rollout_share_of_step"] = rollout_s / max(row["step_seconds"], 1e-9)
        if row.get("rollout_speedup_vs_plain"):
            # the same step with its rollout as long as plain decoding's (the replayed sample's ratio)
            s, r = row["step_seconds"], rollout_s
            row["step_speedup_vs_plain"] = (s - r + r * row["rollout_speedup_vs_plain"]) / max(s, 1e-9)
        return row

    def _spec_metrics(self, outputs: list) -> dict:
        if not self.speculating:
            return {}
        from services.rollout_actor.speculative.stats import aggregate

        m = aggregate(outputs)
        m["strategy"] = self.strategy_name
        if self.speedup:
            m["rollout_speedup_vs_plain"] = self.speedup["speedup"]
            m["long_tail_speedup_vs_plain"] = self.speedup.get("long_tail_speedup")
            m["speedup_measurement"] = {
                "method": "replayed sample, speculation off vs on, same worker",
                **self.speedup,
            }
        return m

    # ------------------------------------------------------------------ the run
    def run(self) -> dict:
        cfg = self.cfg
        ckpt_state = self._resume_point() if self.resume else None
        done = ckpt_state[1]["step"] if ckpt_state else 0
        writer = RunWriter(self.run_dir, resume_after=done if self.resume else None)
        writer.write_config(to_yaml(cfg))
        self.log(f"run directory: {self.run_dir}" + (f" (resuming after step {done})" if self.resume else ""))
        t_run = time.perf_counter()
        self.rows = writer.read_metrics()  # a resumed run's steps so far (the services start at that point)
        import yaml

        from services.pipeline.sinks import MetricSinks

        sinks = MetricSinks(cfg.trainer.logger, self.run_dir, cfg.run.name, yaml.safe_load(to_yaml(cfg)))
        self._start_services()
        caught = _SignalFlag()
        try:
            if ckpt_state:
                self._restore(*ckpt_state)
            progress = _Progress(self.console, cfg.trainer.steps)
            initial = (  # the held-out evaluation before step 1 (a resumed run has it in step 1's row)
                self.evaluator.evaluate(self.plane.rollout, 0, self.log)
                if self.evaluator.enabled and done == 0
                else {}
            )
            for step in range(done + 1, cfg.trainer.steps + 1):
                row = self.step(step)
                if step == 1 and initial:
                    row["eval_initial"] = initial["eval"]
                if self.evaluator.due(step):
                    row.update(self.evaluator.evaluate(self.plane.rollout, row["policy_version"], self.log))
                writer.append_metrics(row)
                self._export_metrics(row)
                sinks.log(row)
                self.rows.append(row)
                if sinks.console:
                    progress.update(row)
                every = cfg.trainer.save_every
                saved = bool(every) and (step % every == 0 or step == cfg.trainer.steps)
                if saved or (caught.signum and step < cfg.trainer.steps):
                    self._save_checkpoint(step)
                if caught.signum and step < cfg.trainer.steps:
                    raise RunInterrupted(caught.signum, step, self.run_dir)
            progress.close()
            ckpt = None
            if cfg.trainer.save_checkpoint:
                ckpt = self.run_dir / "checkpoints" / "policy"
                self._trainer_call("save_checkpoint", str(ckpt))
                _copy_tokenizer(self.model_path, ckpt)
            self._timeline = self.plane.timeline()
        finally:
            caught.restore()
            sinks.close()
            self._stop_services()
        plot_response_lengths(
            self.lengths_per_step, self.run_dir / "plots" / "response_length.png", cfg.rollout.max_new_tokens
        )
        plot_curves(
            self.evaluator.plot_rows(self.rows),
            ["reward_mean", "accuracy", "response_len_mean", "rollout_seconds"]
            + (["eval_accuracy", "eval_accuracy_sampled"] if self.evaluator.history else []),
            self.run_dir / "plots" / "training_curves.png",
            f"GRPO: {cfg.run.name}",
        )
        if self._timeline is not None:
            from services.spot_trainer.bubbles import plot_worker_timeline

            events, phases = self._timeline
            plot_worker_timeline(
                events,
                self.run_dir / "plots" / "worker_timeline.png",
                phases=phases,
                title="rollout / idle / training / preempting per worker",
            )
        from services.pipeline.outputs import plot_dashboard_preview

        plot_dashboard_preview(self.rows, self.run_dir / "plots" / "dashboard_preview.png")
        if any("tuner" in r for r in self.rows):
            from services.pipeline.outputs import plot_tuner_arms

            plot_tuner_arms(self.rows, self.run_dir / "plots" / "tuner_arms.png")
        summary = self._summary(time.perf_counter() - t_run, ckpt)
        writer.write_summary(summary)
        _print_table(self.console, self.rows, summary)
        return summary

    # ------------------------------------------------------------------ checkpoints and resume
    def _save_checkpoint(self, step: int) -> Path:
        """Write ``checkpoints/step-<step>`` atomically (a temporary folder renamed into place, ``driver.json``
        last): the trainer's policy + optimizer state, the tuner's state, and the driver's data cursor, RNG and
        length history. Keeps the newest ``CHECKPOINTS_KEPT``."""
        root = self.run_dir / "checkpoints"
        tmp, final = root / f".step-{step}.tmp", root / f"step-{step}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        self._trainer_call("save_state", str(tmp / "trainer"))
        tuner = root / "tuner_state.json"
        if tuner.is_file():
            shutil.copy2(tuner, tmp / "tuner_state.json")
        state = {
            "step": step,
            "policy_version": self.rows[-1]["policy_version"] if self.rows else 0,
            "cursor": self.cursor,
            "order": self.order,
            "rng": self.rng.getstate(),
            "length_history": self.lengths.hist,
            "length_global_mean": self.lengths.global_mean,
            "lengths_per_step": self.lengths_per_step,
        }
        (tmp / "driver.json").write_text(json.dumps(state))
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        self._pending_updates = []  # the trainer can now be restored from this checkpoint alone
        old = sorted(
            (p for p in root.glob("step-*") if p != final), key=lambda p: int(p.name.split("-", 1)[1])
        )
        for p in old[: max(0, len(old) - (CHECKPOINTS_KEPT - 1))]:
            shutil.rmtree(p, ignore_errors=True)
        return final

    def _trainer_call(self, method: str, *args):
        """A policy-trainer call; a trainer actor that died is restarted once (``_restart_trainer``) and the
        call repeated, so the run goes on with the step in flight redone."""
        try:
            return self.trainer.call(0, method, *args)
        except Exception as e:
            if not actor_died(e):
                raise
            self._restart_trainer(f"{method}: {type(e).__name__}")
            return self.trainer.call(0, method, *args)

    def _restart_trainer(self, why: str) -> None:
        """A fresh trainer actor, restored to the policy version the run had: the newest checkpoint, then the
        updates since it replayed on their own samples (same samples, same shuffling state: same weights)."""
        self.trainer.respawn(0)
        ckpt = latest_checkpoint(self.run_dir)
        if ckpt is not None:
            self.trainer.call(0, "load_state", str(ckpt / "trainer"))
        for samples in self._pending_updates:
            self.trainer.call(0, "train_step", samples)
        self.trainer_restarts += 1
        self.log(
            f"policy trainer died ({why}); restarted from {ckpt.name if ckpt else 'the initial policy'} "
            f"+ {len(self._pending_updates)} replayed update(s)"
        )

    def _resume_point(self) -> tuple[Path, dict]:
        """The newest complete checkpoint and its driver state; points the tuner at its saved state."""
        ckpt = latest_checkpoint(self.run_dir)
        assert ckpt is not None  # checked in preflight
        state = json.loads((ckpt / "driver.json").read_text())
        if self.cfg.tuner.enabled and (ckpt / "tuner_state.json").is_file():
            self.cfg.tuner.init_state = str(ckpt / "tuner_state.json")
        return ckpt, state

    def _restore(self, ckpt: Path, state: dict) -> None:
        """Continue from ``ckpt``: trainer (policy, optimizer), the rollout actors' weights, data cursor, RNG."""
        version = self._trainer_call("load_state", str(ckpt / "trainer"))
        weights = self._trainer_call("policy_state_dict")
        if self.cfg.ray.use_ray:
            import ray

            weights = ray.put(weights)
        self.plane.load_weights(weights, version)
        self.cursor, self.order = state["cursor"], state["order"]
        v, internal, gauss = state["rng"]
        self.rng.setstate((v, tuple(internal), gauss))
        self.lengths.hist = {k: list(h) for k, h in state["length_history"].items()}
        self.lengths.global_mean = state["length_global_mean"]
        self.lengths_per_step = state["lengths_per_step"]
        self.log(f"resumed from {ckpt} (policy version {version})")

    def _summary(self, wall: float, ckpt) -> dict:
        rows = self.rows
        return {
            "run_dir": str(self.run_dir),
            "steps": len(rows),
            "reward_mean_first": rows[0]["reward_mean"],
            "reward_mean_last": rows[-1]["reward_mean"],
            "accuracy_first": rows[0]["accuracy"],
            "accuracy_last": rows[-1]["accuracy"],
            "rollout_seconds_total": sum(r["rollout_seconds"] for r in rows),
            "train_seconds_total": sum(r["train_seconds"] for r in rows),
            "step_seconds_total": sum(r["step_seconds"] for r in rows),
            "tokens_generated_total": sum(r["tokens_generated"] for r in rows),
            "response_len_max": max(r["response_len_max"] for r in rows),
            **length_stats([n for lens in self.lengths_per_step for n in lens], "response_len_run_"),
            "rollout_share_of_step": sum(r["rollout_seconds"] for r in rows)
            / max(sum(r["step_seconds"] for r in rows), 1e-9),
            "wall_seconds": wall,
            "policy_version": rows[-1]["policy_version"],
            "base_model": str(self.model_path),
            "dataset": str(data_dir(self.cfg) / self.cfg.data.train_file),
            "checkpoint": str(ckpt) if ckpt else None,
            "metrics_endpoint": self.metrics_endpoint,
            "coordinator_address": self.coordinator_address,
            **self.evaluator.summary(),
            **self._spec_summary(),
            **self._tuner_summary(),
            **self._bubble_summary(),
        }

    def _worker_bubble(self, step: int, worker: int) -> dict:
        r = next((r for r in self.bubbles.records if r.step == step and r.worker == str(worker)), None)
        return {"idle_seconds": r.idle_seconds if r else 0.0, "trained_seconds": r.trained if r else 0.0}

    def _bubble_summary(self) -> dict:
        t = self.bubbles.totals()
        learned = [
            (r["step"], (r.get("drafters") or {}).get("learned", {}).get("acceptance_rate"))
            for r in self.rows
        ]
        return {
            "bubble_seconds_total": t["idle_seconds"],
            "bubble_trained_seconds_total": t["trained_seconds"],
            "bubble_utilization": t["bubble_utilization"],
            "drafter_version": self.plane.drafter_version,
            "spot_training": bool(self.plane.spot is not None),
            "spot_replicas": len(self.plane.spot) if self.plane.spot is not None else 0,
            "coordinator_restarts": self.plane.coordinator_restarts,
            "learned_acceptance_rate_by_step": learned,
        }

    def _tuner_summary(self) -> dict:
        rows = [r["tuner"] for r in self.rows if "tuner" in r]
        if not rows:
            return {}
        choices: dict[str, int] = {}
        for t in rows:
            for a, c in t["choices"].items():
                choices[a] = choices.get(a, 0) + c
        return {
            "tuner": {
                "table_version": rows[-1]["table_version"],
                "init_state": self.cfg.tuner.init_state,  # an earlier run's tuner state it started from
                "observations_total": sum(t["observations"] for t in rows),
                "choices_total": choices,
                "best_by_bucket": rows[-1]["best_by_bucket"],
                "exploration_fraction": rows[-1]["exploration_fraction"],
                "arm_reward_median": rows[-1]["arm_reward_median"],
            }
        }

    def _spec_summary(self) -> dict:
        rows = [r for r in self.rows if "drafted_tokens" in r]
        if not rows:
            return {}
        from services.rollout_actor.speculative.stats import merge_drafters

        drafted = sum(r["drafted_tokens"] for r in rows)
        accepted = sum(r["accepted_tokens"] for r in rows)
        verify = sum(r["verify_steps"] for r in rows)
        speedups = [r["rollout_speedup_vs_plain"] for r in rows if r.get("rollout_speedup_vs_plain")]
        tails = [r["long_tail_speedup_vs_plain"] for r in rows if r.get("long_tail_speedup_vs_plain")]
        steps = [r["step_speedup_vs_plain"] for r in rows if r.get("step_speedup_vs_plain")]
        return {
            "speculative_strategy": self.strategy_name,
            "drafted_tokens_total": drafted,
            "accepted_tokens_total": accepted,
            "acceptance_length_mean": (accepted + verify) / verify if verify else None,
            "acceptance_rate": accepted / drafted if drafted else None,
            "drafters": merge_drafters(rows),
            "rollout_speedup_vs_plain": float(np.mean(speedups)) if speedups else None,
            "rollout_speedup_vs_plain_method": "mean over steps of a replayed sample of each step's prompts, "
            "speculation off vs on on the same worker (not the live rollout)",
            "long_tail_speedup_vs_plain": float(np.mean(tails)) if tails else None,
            "long_tail_speedup_vs_plain_method": "the same replayed samples, decode steps with <= "
            f"{LONG_TAIL_BATCH} active requests only",
            "step_speedup_vs_plain": float(np.mean(steps)) if steps else None,
            "step_speedup_vs_plain_method": "mean over steps of step seconds with the rollout scaled by the "
            "replayed sample's speedup, over step seconds",
        }


class _SignalFlag:
    """While a run is in progress, SIGINT and SIGTERM only record the signal (``signum``); the loop finishes
    the step, writes a checkpoint and stops. Only the main thread can install handlers; elsewhere a no-op."""

    def __init__(self):
        self.signum = 0
        self._old = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._set)

    def _set(self, signum, frame) -> None:
        self.signum = signum

    def restore(self) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)


def _copy_tokenizer(src: Path, dst: Path) -> None:
    import shutil

    for name in (
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "generation_config.json",
    ):
        if (src / name).is_file():
            shutil.copy(src / name, dst / name)


class _Progress:
    """One progress line per RL step (rich when available, plain print otherwise)."""

    def __init__(self, console, total: int):
        self.console, self.total = console, total

    def update(self, r: dict) -> None:
        msg = (
            f"step {r['step']}/{self.total}  reward {r['reward_mean']:.3f}  acc {r['accuracy']:.3f}  "
            f"len p50/p90/max {r['response_len_p50']:.0f}/{r['response_len_p90']:.0f}/{r['response_len_max']}  "
            f"rollout {r['rollout_seconds']:.1f}s  train {r['train_seconds']:.1f}s  "
            f"step {r['step_seconds']:.1f}s  v{r['policy_version']}"
        )
        if r.get("acceptance_length_mean"):
            msg += f"  tau {r['acceptance_length_mean']:.2f}"
        if r.get("long_tail_speedup_vs_plain"):
            msg += f"  tail x{r['long_tail_speedup_vs_plain']:.2f}"
        (self.console.print if self.console is not None else print)(msg)

    def close(self) -> None:
        pass


def _print_table(console, rows: list[dict], summary: dict) -> None:
    cols = [
        "step",
        "reward_mean",
        "accuracy",
        "response_len_p50",
        "response_len_p90",
        "response_len_max",
        "tokens_generated",
        "rollout_seconds",
        "train_seconds",
        "step_seconds",
    ]
    try:
        from rich.table import Table

        t = Table(title=f"tailspec run — {summary['run_dir']}")
        for c in cols:
            t.add_column(c, justify="right")
        for r in rows:
            t.add_row(*[f"{r[c]:.3f}" if isinstance(r[c], float) else str(r[c]) for c in cols])
        (console.print if console is not None else print)(t)
    except ImportError:  # pragma: no cover
        for r in rows:
            print({c: r[c] for c in cols})
    print(f"summary: {os.path.join(summary['run_dir'], 'summary.json')}")
