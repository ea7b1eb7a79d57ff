"""What one RL step rolls out, and on which rollout actor.

``PromptSampler`` draws the step's prompts (a seeded shuffle of the training set, reshuffled at each
epoch); ``group_requests`` makes ``trainer.group_size`` seeded requests per prompt (a group). Whole groups go
to rollout actors predicted-longest first (LPT): a group's predicted length is its problem's mean recent
response length (``LengthPredictor``), and each group goes to the least-loaded actor so far
(``assign_groups``), which keeps the long tail of the rollout short.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np

from services.pipeline.datasets import GSM8KExample, format_prompt
from services.rollout_actor.shard import RolloutRequest


def problem_id(ex: GSM8KExample) -> str:
    """The id of a training problem (its group's ``problem_id``)."""
    return f"gsm8k-train-{ex.index}"


class PromptSampler:
    """The training prompts in a seeded order (shuffled when ``shuffle``); the order is reshuffled each time
    it runs out. ``state``/``restore``: the cursor, order and RNG, for step checkpoints."""

    def __init__(self, train: Sequence[GSM8KExample], seed: int, shuffle: bool = True):
        self.train = train
        self.rng = random.Random(seed)
        self.order = list(range(len(train)))
        if shuffle:
            self.rng.shuffle(self.order)
        self.cursor = 0

    def next(self, n: int) -> list[GSM8KExample]:
        """The next ``n`` prompts."""
        out = []
        for _ in range(n):
            if self.cursor >= len(self.order):
                self.rng.shuffle(self.order)
                self.cursor = 0
            out.append(self.train[self.order[self.cursor]])
            self.cursor += 1
        return out

    def state(self) -> dict:
        """``cursor``, ``order`` and ``rng`` (JSON-serialisable)."""
        return {"cursor": self.cursor, "order": self.order, "rng": self.rng.getstate()}

    def restore(self, state: dict) -> None:
        """Continue from ``state`` (as ``state()`` returned it, through JSON)."""
        self.cursor, self.order = state["cursor"], state["order"]
        v, internal, gauss = state["rng"]
        self.rng.setstate((v, tuple(internal), gauss))


def group_requests(
    step: int, prompts: Sequence[GSM8KExample], tokenizer, group_size: int, seed: int
) -> dict[str, list[RolloutRequest]]:
    """``group_size`` requests per prompt, by problem id; request ``s<step>-p<k>-g<j>`` is seeded from the
    run's ``seed``, the step, the prompt's position ``k`` and ``j``."""
    reqs: dict[str, list[RolloutRequest]] = {}
    for k, ex in enumerate(prompts):
        pid = problem_id(ex)
        ids = tokenizer.encode(format_prompt(ex.question)).ids
        reqs[pid] = [
            RolloutRequest(
                f"s{step}-p{k}-g{j}",
                pid,
                ids,
                seed=seed * 7_919 + step * 100_003 + k * 101 + j,
            )
            for j in range(group_size)
        ]
    return reqs


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

    def state(self) -> dict:
        """``length_history`` and ``length_global_mean`` (JSON-serialisable), for step checkpoints."""
        return {"length_history": self.hist, "length_global_mean": self.global_mean}

    def restore(self, state: dict) -> None:
        """Continue from ``state`` (as ``state()`` returned it, through JSON)."""
        self.hist = {k: list(h) for k, h in state["length_history"].items()}
        self.global_mean = state["length_global_mean"]
