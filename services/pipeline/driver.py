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

This module is the step loop; the rest of a run is in its neighbours: ``preflight.py`` (inputs checked
before anything is written), ``scheduling.py`` (prompts, groups, LPT), ``run_services.py`` (starting and
stopping the services, the policy-trainer calls that survive its death), ``checkpoints.py`` and
``interrupts.py`` (step checkpoints, ``--resume``, SIGINT / SIGTERM), ``reporting.py`` (progress, plots,
summary) and ``outputs.py`` (the run folder's files).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch
import yaml
from tokenizers import Tokenizer

from services.common.config import Config, resolve_path, to_yaml
from services.common.metrics import TailspecMetrics
from services.common.placement import RunPlacement
from services.common.ray_utils import ActorPool
from services.pipeline.checkpoints import copy_tokenizer, read_checkpoint, write_checkpoint
from services.pipeline.control_plane import ControlPlane
from services.pipeline.datasets import GSM8KExample
from services.pipeline.evaluation import RunEvaluator
from services.pipeline.interrupts import RunInterrupted, SignalFlag
from services.pipeline.outputs import RunWriter, length_stats, new_run_id
from services.pipeline.preflight import check_cpus, check_run_dir, data_dir, load_data, resolve_model
from services.pipeline.reporting import (
    Progress,
    bubble_summary,
    print_results,
    spec_metrics,
    spec_summary,
    step_totals,
    tuner_summary,
    write_plots,
)
from services.pipeline.rewards import gsm8k_reward
from services.pipeline.run_services import RunServices, speculating
from services.pipeline.scheduling import (
    LengthPredictor,
    PromptSampler,
    assign_groups,
    group_requests,
    problem_id,
)
from services.pipeline.sinks import MetricSinks
from services.policy_trainer.grpo import group_advantages
from services.rollout_actor.shard import ShardResult
from services.spot_trainer.bubbles import BubbleAccounting


class TrainingError(RuntimeError):
    """The run cannot go on (e.g. a non-finite loss); the policy of that step is neither synced nor saved."""


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
        self.tokenizer = Tokenizer.from_file(str(self.model_path / "tokenizer.json"))
        self.evaluator = RunEvaluator(
            cfg, self.tokenizer, data_dir(cfg)
        )  # loads the held-out set (preflight)
        self.run_dir = Path(run_dir) if run_dir else resolve_path(cfg.run.runs_dir) / new_run_id(cfg.run.name)
        check_run_dir(self.run_dir, resume)
        check_cpus(cfg)
        self.sampler = PromptSampler(self.train, cfg.run.seed, cfg.data.shuffle)
        self.lengths = LengthPredictor()
        self.rows: list[dict] = []
        self.lengths_per_step: list[list[int]] = []
        self._timeline = None
        self.services: RunServices | None = None

    # ------------------------------------------------------------------ services
    def _start_services(self) -> None:
        """Ray (when used), metrics, and the control plane: coordinator, tuner, rollout actors, spot trainer,
        all speaking gRPC (``services/pipeline/control_plane.py``); then the policy trainer
        (``services/pipeline/run_services.py``)."""
        self.phase = "rollout"
        self.services = RunServices(self.cfg, self.model_path, self.run_dir, self._run_info, self.log)
        self.services.start()

    def _stop_services(self) -> None:
        if self.services is not None:
            self.phase = "done"
            self.services.stop()

    @property
    def plane(self) -> ControlPlane | None:
        return self.services.plane if self.services is not None else None

    @property
    def trainer(self) -> ActorPool | None:
        """The policy-trainer actor (an ``ActorPool`` of one)."""
        return self.services.trainer if self.services is not None else None

    @property
    def placement(self) -> RunPlacement | None:
        return self.services.placement if self.services is not None else None

    @property
    def metrics(self) -> TailspecMetrics | None:
        return self.services.metrics if self.services is not None else None

    @property
    def bubbles(self) -> BubbleAccounting:
        return self.services.bubbles

    @property
    def coordinator_address(self) -> str | None:
        return self.plane.coordinator_address if self.plane is not None else None

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
        return speculating(self.cfg)

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

    # ------------------------------------------------------------------ one step
    def _rollout(
        self, step: int, prompts: list[GSM8KExample]
    ) -> tuple[list, list[ShardResult], float, float]:
        """The step's rollout: its requests, the workers' results, its seconds, and the seconds of the speed-up
        measurement (a replayed sample, on step 1 and every ``speedup_every``-th step; 0.0 on the others)."""
        reqs = group_requests(step, prompts, self.tokenizer, self.cfg.trainer.group_size, self.cfg.run.seed)
        shards = assign_groups([(pid, self.lengths.predict(pid)) for pid in reqs], len(self.plane.rollout))
        t0 = time.perf_counter()
        spec = self.cfg.rollout.speculative
        measure = (spec.enabled or self.cfg.tuner.enabled) and spec.speedup_sample_prompts > 0
        measure = measure and (step - 1) % spec.speedup_every == 0
        results, trained, phase_end = self.plane.rollout_phase(
            step, [[r for pid in shard for r in reqs[pid]] for shard in shards], measure
        )
        for res in results:
            w = str(res.worker)
            self.bubbles.record(step, w, res.finished_at, phase_end, trained.get(w, 0.0))
        rollout_s = time.perf_counter() - t0
        self.speedup, measure_s = None, 0.0
        if measure:
            # replay a fixed sample (the first groups of worker 0's shard) with speculation off and on
            t0 = time.perf_counter()
            sample = [r for pid in shards[0][: spec.speedup_sample_prompts] for r in reqs[pid]]
            self.speedup = self.plane.rollout.call(0, "measure_speedup", sample)
            measure_s = time.perf_counter() - t0
        self.tuner_row = self.plane.tune(results) if self.plane.tuner is not None else None
        return reqs, results, rollout_s, measure_s

    def step(self, step: int) -> dict:
        cfg = self.cfg
        t_step = time.perf_counter()
        prompts = self.sampler.next(cfg.trainer.prompts_per_step)
        by_pid = {problem_id(ex): ex for ex in prompts}
        self._set_phase("rollout")
        reqs, results, rollout_s, measure_s = self._rollout(step, prompts)
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
        self.services.updates_since_checkpoint.append(samples)
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
        state = self._shared(self._trainer_call("policy_state_dict"))
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
            "step_seconds": time.perf_counter() - t_step - measure_s,  # the RL step, without the measurement
            "speedup_measure_seconds": measure_s,
            "policy_version": version,
            "loss": stats["loss"],
            "clip_fraction": stats["clip_fraction"],
            "kl_mean": stats["kl_mean"],
            "grad_norm": stats["grad_norm"],
            **(
                spec_metrics(list(outputs.values()), self.strategy_name, self.speedup)
                if self.speculating
                else {}
            ),
            **({"tuner": self.tuner_row} if self.tuner_row else {}),
            "bubble_seconds": bubble["bubble_idle_s"],
            "bubble_trained_seconds": bubble["bubble_trained_s"],
            "bubble_utilization": bubble["bubble_utilization"],
            "drafter_version": self.plane.drafter_version,
            "trainer_restarts": self.services.trainer_restarts,
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
        sinks = MetricSinks(cfg.trainer.logger, self.run_dir, cfg.run.name, yaml.safe_load(to_yaml(cfg)))
        self._start_services()
        caught = SignalFlag()
        try:
            if ckpt_state:
                self._restore(*ckpt_state)
            progress = Progress(self.console, cfg.trainer.steps)
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
                copy_tokenizer(self.model_path, ckpt)
            self._timeline = self.plane.timeline()
        finally:
            caught.restore()
            sinks.close()
            self._stop_services()
        write_plots(
            self.run_dir / "plots",
            self.rows,
            self.lengths_per_step,
            cfg.rollout.max_new_tokens,
            self.evaluator.plot_rows(self.rows),
            bool(self.evaluator.history),
            f"GRPO: {cfg.run.name}",
            self._timeline,
        )
        summary = self._summary(time.perf_counter() - t_run, ckpt)
        writer.write_summary(summary)
        print_results(self.console, summary)
        return summary

    # ------------------------------------------------------------------ checkpoints and resume
    def _save_checkpoint(self, step: int) -> Path:
        """Write ``checkpoints/step-<step>`` (``services/pipeline/checkpoints.py``): the trainer's policy +
        optimizer state, the tuner's state, and the driver's data cursor, RNG and length history."""
        state = {
            "step": step,
            "policy_version": self.rows[-1]["policy_version"] if self.rows else 0,
            **self.sampler.state(),  # cursor, order, rng
            **self.lengths.state(),  # length_history, length_global_mean
            "lengths_per_step": self.lengths_per_step,
        }
        final = write_checkpoint(
            self.run_dir, step, lambda d: self._trainer_call("save_state", str(d)), state
        )
        self.services.updates_since_checkpoint = []  # the trainer can be restored from this checkpoint alone
        return final

    def _trainer_call(self, method: str, *args):
        """A policy-trainer call that survives the trainer actor's death (``RunServices.trainer_call``)."""
        return self.services.trainer_call(method, *args)

    def _shared(self, weights):
        """Policy ``weights`` as every actor gets them: put once in Ray's object store (the ref is passed)
        under Ray, the state dict itself in-process."""
        if not self.cfg.ray.use_ray:
            return weights
        import ray  # Ray loads only for runs that use it (ray.use_ray=false runs in-process)

        return ray.put(weights)

    def _resume_point(self) -> tuple[Path, dict]:
        """The newest complete checkpoint and its driver state; points the tuner at its saved state."""
        ckpt, state = read_checkpoint(self.run_dir)
        if self.cfg.tuner.enabled and (ckpt / "tuner_state.json").is_file():
            self.cfg.tuner.init_state = str(ckpt / "tuner_state.json")
        return ckpt, state

    def _restore(self, ckpt: Path, state: dict) -> None:
        """Continue from ``ckpt``: trainer (policy, optimizer), the rollout actors' weights, data cursor, RNG."""
        version = self._trainer_call("load_state", str(ckpt / "trainer"))
        self.plane.load_weights(self._shared(self._trainer_call("policy_state_dict")), version)
        self.sampler.restore(state)
        self.lengths.restore(state)
        self.lengths_per_step = state["lengths_per_step"]
        self.log(f"resumed from {ckpt} (policy version {version})")

    def _summary(self, wall: float, ckpt) -> dict:
        """``summary.json``: the run's totals (``services/pipeline/reporting.py``), where its inputs and
        outputs are, and the evaluation, speculation, tuner and bubble summaries."""
        rows = self.rows
        return {
            "run_dir": str(self.run_dir),
            **step_totals(rows, self.lengths_per_step),
            "wall_seconds": wall,
            "policy_version": rows[-1]["policy_version"],
            "base_model": str(self.model_path),
            "dataset": str(data_dir(self.cfg) / self.cfg.data.train_file),
            "checkpoint": str(ckpt) if ckpt else None,
            "metrics_endpoint": self.services.metrics_endpoint,
            "coordinator_address": self.coordinator_address,
            **self.evaluator.summary(),
            **spec_summary(rows, self.strategy_name),
            # init_state: an earlier run's tuner state it started from
            **tuner_summary(rows, self.cfg.tuner.init_state),
            **bubble_summary(rows, self.bubbles.totals(), self.plane),
        }

    def _worker_bubble(self, step: int, worker: int) -> dict:
        r = next((r for r in self.bubbles.records if r.step == step and r.worker == str(worker)), None)
        return {"idle_seconds": r.idle_seconds if r else 0.0, "trained_seconds": r.trained if r else 0.0}
