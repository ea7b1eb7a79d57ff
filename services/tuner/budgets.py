"""Length-aware draft budgets, after DAS (arXiv 2511.13841, "Distribution-Aware Speculative decoding").

In RL rollouts the same problems come back step after step, and a problem's past response lengths predict its
next ones. The long responses decide the rollout's makespan, so they get the largest draft budgets and are
served first when a step's draft tokens run short (``LengthHistory.classify``, ``LengthBudgets.allocate``).
Configuration errors raise ``TunerConfigError`` naming the key; bad requests raise ``ValueError``.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from services.tuner.settings import Settings, TunerConfigError, check_int, check_number

CLASSES = ("long", "medium", "short")


@dataclass
class BudgetConfig(Settings):
    """Config section ``tuner.budgets``: per-class draft budgets (tokens per request per step), the per-step
    quota (draft tokens over all requests), and how problems are classified (``LengthHistory``). Raises
    ``TunerConfigError`` naming the key of a bad value."""

    SECTION = "budgets"
    # Every class may draft the longest shipped chain (32): the arm's length decides. Class caps of 8 (medium)
    # and 4 (short) cost the adaptive policy ~7% of its long-tail speed-up on the trace-replay workload
    # (docs/tuner.md), where a row's padding is free (CPU: ragged.py) or shared (GPU: the longest row pays).
    long: int = 32
    medium: int = 32
    short: int = 32
    # The quota caps a step's verify width (its logits: 4,096 x 152k in bf16 = 1.2 GB at the Qwen2.5 vocabulary)
    # without cutting any shipped chain at up to 128 active requests: the tuner, not the quota, decides where
    # drafting pays. A quota of 512 cut suffix-k8 / k16 to a half / a quarter of the requests above 64 / 32 active
    # on the trace replay at max batch 128 (CPU), and the adaptive policy ran at 1.6-1.8x plain at 96-191 active
    # against 2.2-2.4x for the same arms uncut (docs/tuner.md).
    step_quota: int = 4096
    history: int = 8  # lengths kept per problem
    max_weight: float = 0.5  # predicted length = (1 - max_weight) * mean + max_weight * max
    long_quantile: float = 0.75
    short_quantile: float = 0.25
    long_threshold: int | None = None  # tokens; None: the long_quantile of the problems' predicted lengths
    short_threshold: int | None = None
    min_problems: int = 8  # known problems before the quantiles classify (else every problem is medium)
    max_problems: int = 1_000_000  # problems remembered (the one seen longest ago is forgotten first)

    def validate(self, source: str = "config") -> None:
        p = f"{source}: tuner.budgets"
        for key in ("long", "medium", "short", "step_quota", "history", "min_problems", "max_problems"):
            check_int(getattr(self, key), f"{p}.{key}", 1)
        for key, open_ in (("max_weight", False), ("long_quantile", True), ("short_quantile", True)):
            check_number(getattr(self, key), f"{p}.{key}", 0, 1, open_=open_)
        for key in ("long_threshold", "short_threshold"):
            if getattr(self, key) is not None:
                check_int(getattr(self, key), f"{p}.{key} (tokens)", 1)
        for lo, hi in (("short_quantile", "long_quantile"), ("short_threshold", "long_threshold")):
            a, b = getattr(self, lo), getattr(self, hi)
            if a is not None and b is not None and a >= b:
                raise TunerConfigError(f"{p}: {lo} ({a}) must be below {hi} ({b})")


class LengthHistory:
    """Per problem (``problem_id``) its last ``history`` response lengths (tokens), and the long / medium / short
    classification (``classify``)."""

    def __init__(self, cfg: BudgetConfig | None = None) -> None:
        self.cfg = cfg if cfg is not None else BudgetConfig()
        self._lengths: OrderedDict[str, deque[int]] = OrderedDict()
        self._thresholds: tuple[float | None, float | None] | None = None  # cache, None = stale

    def record(self, problem_id: str, length: int) -> None:
        """A response to ``problem_id`` finished with ``length`` generated tokens (``ValueError`` if negative)."""
        if isinstance(length, bool) or not isinstance(length, int) or length < 0:
            raise ValueError(f"length must be a non-negative integer, got {length!r}")
        if problem_id not in self._lengths:
            self._lengths[problem_id] = deque(maxlen=self.cfg.history)
            while len(self._lengths) > self.cfg.max_problems:
                self._lengths.popitem(last=False)  # forget the problem seen longest ago
        self._lengths.move_to_end(problem_id)
        self._lengths[problem_id].append(length)
        self._thresholds = None

    def predicted(self, problem_id: str) -> float | None:
        """``(1 - max_weight) * mean + max_weight * max`` of the problem's recent lengths; None if unknown."""
        q, w = self._lengths.get(problem_id), self.cfg.max_weight
        return (1.0 - w) * (sum(q) / len(q)) + w * max(q) if q else None

    def thresholds(self) -> tuple[float | None, float | None]:
        """``(long_threshold, short_threshold)`` in tokens: the configured ones, else the ``long_quantile`` /
        ``short_quantile`` (linear interpolation) of the known problems' predicted lengths once ``min_problems``
        are known; a None side means that class is not assigned."""
        if self._thresholds is None:
            cfg = self.cfg
            long_t, short_t = cfg.long_threshold, cfg.short_threshold
            if (long_t is None or short_t is None) and len(self._lengths) >= cfg.min_problems:
                preds = [self.predicted(p) for p in self._lengths]
                q_long, q_short = np.quantile(preds, [cfg.long_quantile, cfg.short_quantile]).tolist()
                long_t = q_long if long_t is None else long_t
                short_t = q_short if short_t is None else short_t
                if long_t <= short_t:  # all problems equally long: nobody is long or short
                    long_t = short_t = None
            self._thresholds = (long_t, short_t)
        return self._thresholds

    def classify(self, problem_id: str, generated: int = 0) -> str:
        """``long`` when ``generated`` (tokens so far) or the predicted length reaches the long threshold,
        ``short`` when the predicted length is at or below the short one, else ``medium`` (an unknown problem
        too)."""
        long_t, short_t = self.thresholds()
        pred = self.predicted(problem_id)
        if long_t is not None and (generated >= long_t or (pred is not None and pred >= long_t)):
            return "long"
        return "short" if pred is not None and short_t is not None and pred <= short_t else "medium"


class LengthBudgets:
    """Per-step draft budgets per request: class budgets and the quota, long requests first."""

    def __init__(self, cfg: BudgetConfig | None = None, history: LengthHistory | None = None) -> None:
        self.cfg = cfg if cfg is not None else BudgetConfig()
        self.history = history if history is not None else LengthHistory(self.cfg)

    def allocate(self, requests: Sequence[Sequence[Any]], quota: int | None = None) -> dict[str, int]:
        """``{request_id: draft budget}`` for one decode step, in input order.

        ``requests``: ``(request_id, problem_id, requested_budget[, generated])``; each wants ``min(requested_budget,
        its class budget)`` draft tokens (None: the class budget). The ``quota`` (default ``step_quota``) goes to
        long requests first, then medium, then short; within a class the longest predicted first, then input
        order; the request where it runs out gets the rest, later ones 0. Raises ``ValueError`` for a malformed
        or duplicate request or a negative quota."""
        quota = self.cfg.step_quota if quota is None else quota
        if isinstance(quota, bool) or not isinstance(quota, int) or quota < 0:
            raise ValueError(f"quota must be a non-negative integer, got {quota!r}")
        rows, seen = [], set()
        for i, req in enumerate(requests):
            if len(req) not in (3, 4):
                raise ValueError(
                    f"requests[{i}]: expected (request_id, problem_id, budget[, generated]): {req!r}"
                )
            rid, pid, want, generated = *req[:3], int(req[3] or 0) if len(req) == 4 else 0
            if rid in seen:
                raise ValueError(f"requests[{i}]: duplicate request_id {rid!r}")
            if want is not None and (isinstance(want, bool) or not isinstance(want, int) or want < 0):
                raise ValueError(f"requests[{i}]: requested_budget must be an integer >= 0 or None: {want!r}")
            seen.add(rid)
            cls = self.history.classify(pid, generated)
            cap = getattr(self.cfg, cls) if want is None else min(want, getattr(self.cfg, cls))
            rows.append(
                (CLASSES.index(cls), -max(self.history.predicted(pid) or 0.0, generated), i, rid, cap)
            )
        out, left = {}, quota
        for *_, rid, want in sorted(rows):
            out[rid] = min(want, left)
            left -= out[rid]
        return {req[0]: out[req[0]] for req in requests}
