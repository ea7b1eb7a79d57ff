"""A decode step's cost by its verify width, for the selector's counterfactual records.

A step of a chain of a prefix drafter (``selector.PREFIX_DRAFTERS``) also says what each shorter chain of that
drafter would have committed on the same step (``StepObservation.accepted_lengths``). ``CostFit`` says what
that step would have cost: the step's seconds as a line in its verify width ``w`` (tokens in the verify
forward: one per request plus its draft nodes), ``s = a + b * w``, fitted by least squares over a bucket's
last timed steps (every arm's: ``off``'s steps have ``w`` = the batch size). A shorter chain's step on the
same requests would have cost ``s * (a + b * w') / (a + b * w)``: timed by the step's own seconds, not by
mean step seconds of the two arms taken at other moments of the rollout, with other draft lengths. On a CPU
the verify runs packed and its cost grows with ``w``; on a memory-bound GPU ``b`` is near 0 and a shorter
chain costs about the same.
"""

from __future__ import annotations

from services.tuner.bandit import RateWindow

# least squares needs this many steps (of more than one width) before it is used
COST_FIT_MIN_STEPS = 8
MIN_INTERCEPT = 0.01  # of the mean step seconds


class CostFit:
    """Step seconds ``s = a + b * w`` in the verify width ``w`` over the last ``size`` timed steps of a bucket.

    ``add(w, s)``: a step of width ``w`` (tokens) that took ``s`` seconds. ``line()``: ``(a, b)``, or None
    before ``COST_FIT_MIN_STEPS`` steps or while every step had the same width. ``b`` is clamped at 0 (a cost
    that falls with width is noise); an ``a`` below ``MIN_INTERCEPT`` of the mean step gives no fit (a cost
    proportional to the width, or less, would make every shorter chain look as cheap as its width: a step
    always has a cost of its own).
    """

    def __init__(self, size: int = 256) -> None:
        self._window = RateWindow(size)  # (w, s) pairs: its running sums are the normal equations'

    def add(self, w: float, s: float) -> None:
        self._window.append(w, s)

    def line(self) -> tuple[float, float] | None:
        """``(a, b)`` in seconds and seconds per token, or None (class docstring)."""
        n, sw, ss, sww, sws, _ = self._window.sums()
        if n < COST_FIT_MIN_STEPS:
            return None
        var = sww - sw * sw / n
        if var <= 1e-9 * max(1.0, sww):
            return None
        b = max(0.0, (sws - sw * ss / n) / var)
        a = (ss - b * sw) / n
        return (a, b) if a > MIN_INTERCEPT * ss / n else None
