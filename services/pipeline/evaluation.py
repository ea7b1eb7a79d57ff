"""Held-out evaluation: answer accuracy of the policy on a fixed problem set, greedy and sampled.

The run evaluates the first ``eval.n`` problems of ``data.test_file`` (GSM8K JSONL format; for the synthetic
tasks a fixed generated set, e.g. ``data/running_total/test.jsonl``) before step 1, every ``eval.every``
steps and after the last step. The rollout actors decode them (batched, speculation off, without touching
the drafters' history or the tuner): once greedy (temperature 0) and, with ``eval.sampled``, once at the
training temperature with a fixed seed per problem. A response is correct when the number after its last
``####`` equals the gold answer (:func:`services.pipeline.rewards.gsm8k_reward`).

``evaluate_model_dir`` runs the same evaluation in-process on a model folder (the base-model recipes'
``eval.json``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from services.pipeline.datasets import GSM8KExample, format_prompt, load_gsm8k
from services.pipeline.rewards import gsm8k_reward
from services.rollout_actor.shard import RolloutRequest
from services.rollout_actor.worker import RolloutWorker

__all__ = ["eval_requests", "score", "run_eval", "flat_keys", "evaluate_model_dir", "EVAL_SEED"]

EVAL_SEED = 1_234_567  # sampled evaluation: the same seed per problem at every evaluation


def eval_requests(examples: Sequence[GSM8KExample], tokenizer) -> list[RolloutRequest]:
    """One request per problem (ids ``eval-<i>``), seeded per problem so every evaluation draws alike."""
    return [
        RolloutRequest(
            f"eval-{i}", f"eval-{e.index}", tokenizer.encode(format_prompt(e.question)).ids, EVAL_SEED + i
        )
        for i, e in enumerate(examples)
    ]


def _quantile(s: list[int], p: float) -> int:
    return s[min(len(s) - 1, max(0, math.ceil(p * len(s)) - 1))] if s else 0


def score(examples: Sequence[GSM8KExample], outputs: Sequence) -> dict:
    """Accuracy, format rate, truncation rate and response-length quantiles of one output per example."""
    rewards = [gsm8k_reward(o.text or "", e.answer, 1.0) for e, o in zip(examples, outputs, strict=True)]
    lens = sorted(len(o.token_ids) for o in outputs)
    n = max(1, len(outputs))
    return {
        "accuracy": sum(r.correct for r in rewards) / n,
        "format_rate": sum(r.format > 0 for r in rewards) / n,
        "truncated_fraction": sum(o.finish_reason == "length" for o in outputs) / n,
        "response_len_mean": float(np.mean(lens)) if lens else 0.0,
        "response_len_p50": _quantile(lens, 0.5),
        "response_len_p99": _quantile(lens, 0.99),
    }


def run_eval(
    generate: Callable[[list[RolloutRequest], float], list],
    examples: Sequence[GSM8KExample],
    tokenizer,
    temperature: float,
    sampled: bool = True,
) -> dict:
    """Evaluate with ``generate(requests, temperature) -> outputs in order``: greedy, and at ``temperature``
    when ``sampled``. Returns ``{"problems", "greedy": score, "sampled": score | None, "seconds"}``."""
    t0 = time.perf_counter()
    reqs = eval_requests(examples, tokenizer)
    out = {"problems": len(reqs), "temperature": temperature, "greedy": score(examples, generate(reqs, 0.0))}
    out["sampled"] = score(examples, generate(reqs, temperature)) if sampled else None
    out["seconds"] = time.perf_counter() - t0
    return out


def flat_keys(result: dict) -> dict:
    """The metrics.jsonl / plot keys of one evaluation."""
    row = {
        "eval_accuracy": result["greedy"]["accuracy"],
        "eval_format_rate": result["greedy"]["format_rate"],
        "eval_response_len_p50": result["greedy"]["response_len_p50"],
        "eval_seconds": result["seconds"],
    }
    if result.get("sampled"):
        row["eval_accuracy_sampled"] = result["sampled"]["accuracy"]
    return row


def shard_generate(pool, max_new_tokens: int) -> Callable[[list[RolloutRequest], float], list]:
    """``generate`` over a pool of rollout workers (``ActorPool`` of ``RolloutWorker``): requests dealt
    round-robin, decoded in parallel, outputs back in request order."""

    def generate(reqs: list[RolloutRequest], temperature: float) -> list:
        n = len(pool)
        shards = [reqs[i::n] for i in range(n)]
        futures = [pool.submit(i, "evaluate", shards[i], temperature, max_new_tokens) for i in range(n)]
        by_id = {o.request_id: o for f in futures for o in f.result()}
        return [by_id[r.request_id] for r in reqs]

    return generate


def evaluate_model_dir(
    model_dir: str | Path,
    examples: Sequence[GSM8KExample],
    temperature: float = 0.9,
    max_new_tokens: int = 256,
    max_batch_size: int = 64,
    threads: int = 1,
) -> dict:
    """In-process evaluation of an HF model folder with one rollout worker (speculation off)."""
    from tokenizers import Tokenizer

    sampling = dict(temperature=temperature, top_p=1.0, top_k=0, max_new_tokens=max_new_tokens)
    worker = RolloutWorker(0, str(model_dir), sampling, max_batch_size=max_batch_size, threads=threads)
    tok = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
    try:
        return run_eval(lambda r, t: worker.evaluate(r, t, max_new_tokens), examples, tok, temperature)
    finally:
        worker.close()


class RunEvaluator:
    """The run's held-out evaluation (config section ``eval``): which steps, the results, the summary keys.

    ``evaluate(pool, version)`` returns the metrics.jsonl keys of one evaluation (``eval``: the full result,
    plus the flat ``eval_accuracy``, ``eval_accuracy_sampled``, ...); the one before step 1 goes into step
    1's row as ``eval_initial``.
    """

    def __init__(self, cfg, tokenizer, data_dir: Path):
        self.cfg, self.tokenizer = cfg, tokenizer
        self.enabled = cfg.eval.enabled
        self.path = data_dir / cfg.data.test_file
        self.examples = load_gsm8k(self.path)[: cfg.eval.n] if self.enabled else []
        self.max_new_tokens = cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens
        self.history: list[dict] = []

    def due(self, step: int) -> bool:
        every, last = self.cfg.eval.every, self.cfg.trainer.steps
        return self.enabled and (step == last or (every > 0 and step % every == 0))

    def evaluate(self, pool, version: int, log=print) -> dict:
        gen = shard_generate(pool, self.max_new_tokens)
        res = run_eval(
            gen, self.examples, self.tokenizer, self.cfg.rollout.temperature, self.cfg.eval.sampled
        )
        res["policy_version"] = version
        self.history.append(res)
        flat = flat_keys(res)
        sampled = f", T={res['temperature']:g} {flat['eval_accuracy_sampled']:.3f}" if res["sampled"] else ""
        log(
            f"eval (policy v{version}, {res['problems']} held-out problems): accuracy greedy "
            f"{flat['eval_accuracy']:.3f}{sampled}  ({res['seconds']:.1f}s)"
        )
        return {"eval": res, **flat}

    def plot_rows(self, rows: list[dict]) -> list[dict]:
        """Rows for the training curves: a step-0 point with the evaluation before step 1."""
        if not self.history:
            return rows
        return [{"step": 0, **flat_keys(self.history[0])}] + rows

    def summary(self) -> dict:
        if not self.history:
            return {}
        first, last = self.history[0], self.history[-1]
        out = {
            "eval_problems": first["problems"],
            "eval_set": str(self.path),
            "eval_accuracy_first": first["greedy"]["accuracy"],
            "eval_accuracy_last": last["greedy"]["accuracy"],
        }
        if first["sampled"]:
            out["eval_temperature"] = first["temperature"]
            out["eval_accuracy_sampled_first"] = first["sampled"]["accuracy"]
            out["eval_accuracy_sampled_last"] = last["sampled"]["accuracy"]
        out["eval_curve"] = [
            {
                "policy_version": h["policy_version"],
                "accuracy": h["greedy"]["accuracy"],
                "accuracy_sampled": (h["sampled"] or {}).get("accuracy"),
            }
            for h in self.history
        ]
        return out
