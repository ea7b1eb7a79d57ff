"""The RL driver: GRPO on GSM8K over a pool of rollout actors and a policy-trainer actor.

One RL step (see ../shared/DESIGN.md, "One RL step"):

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

import os
import random
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from services.common.config import Config, resolve_path, to_yaml
from services.common.ray_utils import ActorPool, init_ray
from services.pipeline.control_plane import ControlPlane
from services.pipeline.datasets import GSM8KExample, default_dataset_dir, format_prompt, load_gsm8k
from services.pipeline.outputs import RunWriter, length_stats, new_run_id, plot_curves, plot_response_lengths
from services.pipeline.rewards import gsm8k_reward
from services.rollout_actor.worker import RolloutRequest, ShardResult


class PreflightError(ValueError):
    """Bad input found before anything is written: missing data, bad model folder, tokenizer mismatch."""


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
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
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


def data_dir(cfg: Config) -> Path:
    """``data.dir``, else the task's folder (GSM8K: $TAILSPEC_DATA_DIR or data/gsm8k)."""
    from services.pipeline.tasks import task_data_dir

    return Path(cfg.data.dir) if cfg.data.dir else (task_data_dir(cfg.task.name) or default_dataset_dir())


def load_data(cfg: Config) -> list[GSM8KExample]:
    return load_gsm8k(data_dir(cfg) / cfg.data.train_file)


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
    def __init__(self, cfg: Config, run_dir: Path | None = None, console=None):
        self.cfg = cfg
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
        self.rng = random.Random(cfg.run.seed)
        self.order = list(range(len(self.train)))
        if cfg.data.shuffle:
            self.rng.shuffle(self.order)
        self.cursor = 0
        self.lengths = LengthPredictor()
        self.rows: list[dict] = []
        self.lengths_per_step: list[list[int]] = []
        self._timeline = None

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
            from services.common.metrics import TailspecMetrics

            backend = "ray" if cfg.ray.use_ray else "prometheus"
            self.metrics = TailspecMetrics(backend=backend)
            if cfg.metrics.port is not None and backend == "prometheus":
                port = self.metrics.start_http_server(cfg.metrics.port, cfg.metrics.host)
                self.metrics_endpoint = f"http://{cfg.metrics.host}:{port}/metrics"
                self.log(f"metrics: {self.metrics_endpoint}")
        from services.spot_trainer.bubbles import BubbleAccounting

        self.bubbles = BubbleAccounting()
        self.phase = "rollout"
        self.plane = ControlPlane(
            cfg,
            self.model_path,
            self.run_dir,
            self.learned_cfg(),
            self.available_drafters(),
            self._run_info,
            self.log,
        )
        self.plane.start()
        self.log(f"coordinator: tailspec status --address {self.plane.coordinator_address}")
        from services.policy_trainer.actor import PolicyTrainerService

        self.trainer = ActorPool.create(
            PolicyTrainerService,
            [(str(self.model_path), asdict(cfg.trainer), cfg.run.seed)],
            cfg.ray.use_ray,
            num_cpus=0,
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
        m.record_step(row)
        m.record_responses(self.lengths_per_step[-1])
        for arm, n in ((row.get("tuner") or {}).get("choices") or {}).items():
            m.record_arm_selection("all", arm, n)
        for wid, state in self.plane.coord("states").items():
            m.set_worker_state(wid, str(state))

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
        if getattr(self, "plane", None) is not None:
            self.phase = "done"
            self.plane.report_run()
            self.plane.stop()
        if getattr(self, "trainer", None) is not None:
            self.trainer.shutdown()
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
        stats = self.trainer.call(0, "train_step", samples)
        self._set_phase("weight_sync")
        train_s = time.perf_counter() - t0

        t0 = time.perf_counter()
        version = int(stats["version"])
        state = self.trainer.call(0, "policy_state_dict")
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
        return row

    def _spec_metrics(self, outputs: list) -> dict:
        if not self.speculating:
            return {}
        from services.rollout_actor.speculative.stats import aggregate

        m = aggregate(outputs)
        m["strategy"] = self.strategy_name
        if self.speedup:
            m["rollout_speedup_vs_plain"] = self.speedup["speedup"]
            m["speedup_measurement"] = {
                "method": "replayed sample, speculation off vs on, same worker",
                **self.speedup,
            }
        return m

    # ------------------------------------------------------------------ the run
    def run(self) -> dict:
        cfg = self.cfg
        writer = RunWriter(self.run_dir)
        writer.write_config(to_yaml(cfg))
        self.log(f"run directory: {self.run_dir}")
        t_run = time.perf_counter()
        self._start_services()
        try:
            progress = _Progress(self.console, cfg.trainer.steps)
            initial = (
                self.evaluator.evaluate(self.plane.rollout, 0, self.log) if self.evaluator.enabled else {}
            )
            for step in range(1, cfg.trainer.steps + 1):
                row = self.step(step)
                if step == 1 and initial:
                    row["eval_initial"] = initial["eval"]
                if self.evaluator.due(step):
                    row.update(self.evaluator.evaluate(self.plane.rollout, row["policy_version"], self.log))
                writer.append_metrics(row)
                self._export_metrics(row)
                self.rows.append(row)
                progress.update(row)
            progress.close()
            ckpt = None
            if cfg.trainer.save_checkpoint:
                ckpt = self.run_dir / "checkpoints" / "policy"
                self.trainer.call(0, "save_checkpoint", str(ckpt))
                _copy_tokenizer(self.model_path, ckpt)
            self._timeline = self.plane.timeline()
        finally:
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
                "demotions_total": sum(t.get("demotions", 0) for t in rows),
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
        }


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
