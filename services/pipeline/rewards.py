"""GSM8K rewards: final-answer correctness plus a small format reward.

The reward of a response is ``total = correct + format``:

- ``correct`` is 1.0 when the number after the response's last ``####`` (read and normalized by
  :func:`services.pipeline.datasets.extract_final_answer`) equals the gold final answer, else 0.0. Both
  are compared as exact rational numbers when both parse (``"18" == "18.0" == "18.00"``,
  ``"$1,000" == "1000"``), otherwise as normalized strings.
- ``format`` is ``format_reward`` (default 0.1, ``trainer.format_reward`` in the config) when the stripped
  response *ends with* ``#### <number>`` (nothing but the number after the marker), else 0.0. It is paid
  whether or not the answer is correct: it teaches the policy to finish with a parsable final answer, which
  also ends the response early instead of rambling to ``max_new_tokens``. Set it to 0 for a pure
  correctness reward.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

from services.pipeline.datasets import extract_final_answer

__all__ = ["RewardBreakdown", "gsm8k_reward", "answers_match"]

# '#### <number>' at the very end: optional '$', optional sign, digits with optional thousands commas,
# optional decimal part (a trailing '.' is allowed: "#### 18.").
_ENDS_WITH_ANSWER = re.compile(r"####[ \t]*\$?[ \t]*[-+]?\$?\d[\d,]*(?:\.\d*)?$")


@dataclass
class RewardBreakdown:
    correct: float  # 1.0 if the final answer matches the gold answer, else 0.0
    format: float  # format_reward if the response ends with '#### <number>', else 0.0
    total: float  # correct + format


def _as_number(s: str) -> Fraction | None:
    try:
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


def answers_match(predicted: str | None, gold: str | None) -> bool:
    """Whether two normalized final answers are equal: numerically (exact rationals) when both parse as
    numbers, otherwise as strings. ``None`` never matches."""
    if predicted is None or gold is None:
        return False
    a, b = _as_number(predicted), _as_number(gold)
    if a is not None and b is not None:
        return a == b
    return predicted == gold


def _normalize_gold(gold_answer: str) -> str | None:
    # Accept either the bare final answer ("1,000") or a full reference solution ("... #### 1,000").
    text = gold_answer if "####" in gold_answer else "#### " + gold_answer
    return extract_final_answer(text)


def gsm8k_reward(response: str, gold_answer: str, format_reward: float = 0.1) -> RewardBreakdown:
    """Reward of one GSM8K response.

    Args:
        response: the decoded response text (without the prompt).
        gold_answer: the gold final answer (``"18"``, ``"$1,000"``) or a full reference solution ending with
            ``#### <answer>``; it is normalized like the response's answer.
        format_reward: paid when the stripped response ends with ``#### <number>`` (see the module docstring).

    Returns:
        ``RewardBreakdown(correct, format, total)`` with ``correct`` in {0, 1}, ``format`` in
        {0, format_reward} and ``total = correct + format``.
    """
    correct = 1.0 if answers_match(extract_final_answer(response), _normalize_gold(gold_answer)) else 0.0
    fmt = float(format_reward) if _ENDS_WITH_ANSWER.search(response.strip()) else 0.0
    return RewardBreakdown(correct=correct, format=fmt, total=correct + fmt)
