"""Running total: a synthetic verifiable reasoning task with a worked scratchpad and a long length tail.

A problem is a two-digit start and a chain of one-digit additions and subtractions; the running total stays
in 0..99 (each step's sign is drawn among those that keep it there)::

    Question: 47+8-3+9
    Answer: 47+8=55 -3+9
    55-3=52 +9
    52+9=61
    #### 61<|endoftext|>

The response works the chain one operation a line: the first two terms, ``=``, their sum, then the rest of
the chain copied (the next line starts from the sum and the rest's first term). The sum's inputs sit right
before its ``=`` and the copies are anchored on ``=`` and the space, which a small transformer learns fast.
Its length grows quadratically with the chain (one token per digit: ~30 tokens for 3 operations, ~200
for 12). Chain lengths are mixed (most problems have 2-5 operations, some 6-10, a few
11-14), so response lengths have a long tail (p99 / p50 ~ 5). Each line is mostly a copy of the previous
one and sibling responses to one prompt repeat each other: a suffix drafter predicts them well.

Files are in the GSM8K JSONL format (``{"question", "answer"}``, the answer ending with ``#### <total>``), so
prompts (:func:`services.pipeline.datasets.format_prompt`), answer extraction and the exact-match reward
(:func:`services.pipeline.rewards.gsm8k_reward`) are the GSM8K ones. ``write_dataset`` writes, from fixed
seeds:

- ``train.jsonl``: RL prompts with their correct worked answers;
- ``test.jsonl``: the fixed held-out evaluation set (disjoint from ``train.jsonl`` and ``sft.jsonl``);
- ``sft.jsonl``: the supervised data of the base policy, worked by a *sloppy teacher* that forgets the carry
  (or borrow) on ``carry_error`` (default half) of the steps where the tens digit changes, e.g. ``47+8=45``,
  and then carries on consistently from its wrong total. The base policy imitates it: it has learned the
  format and the one-digit sums, but is unsure exactly where the reasoning is hard. Only a verifier knows
  which of its two habits is right; RL with the exact-match reward is meant to learn to carry (not yet
  shown: in 10-24 GRPO steps of 16 x 8 at lr 4e-5..3e-4 held-out accuracy did not rise).

CLI: ``python -m services.pipeline.tasks.running_total --out data/running_total``.
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass
from pathlib import Path

from services.pipeline.tasks import DATA_ROOT

__all__ = [
    "Problem",
    "DEFAULT_DIR",
    "generate_problem",
    "generate_problems",
    "worked_answer",
    "write_dataset",
]

NAME = "running_total"
DEFAULT_DIR = DATA_ROOT / NAME
# chain-length mixture: (probability, min ops, max ops) -- most short, some medium, a few long
LENGTH_MIX: tuple[tuple[float, int, int], ...] = ((0.80, 2, 5), (0.17, 6, 10), (0.03, 11, 14))
SEEDS = {"train": 1, "test": 2, "sft": 3}
SIZES = {"train": 4000, "test": 500, "sft": 20000}


@dataclass(frozen=True)
class Problem:
    start: int  # 10..99
    ops: tuple[int, ...]  # signed one-digit operands (+1..+9, -1..-9), applied left to right

    @property
    def question(self) -> str:
        return str(self.start) + "".join(f"{d:+d}" for d in self.ops)

    @property
    def total(self) -> int:
        return self.start + sum(self.ops)


def _num_ops(rng: random.Random) -> int:
    u = rng.random()
    for p, lo, hi in LENGTH_MIX:
        if u < p:
            return rng.randint(lo, hi)
        u -= p
    return rng.randint(LENGTH_MIX[-1][1], LENGTH_MIX[-1][2])


def generate_problem(rng: random.Random) -> Problem:
    """One problem from ``rng``: start in 10..99, 2-14 operations, running total always in 0..99."""
    total = start = rng.randint(10, 99)
    ops = []
    for _ in range(_num_ops(rng)):
        d = rng.randint(1, 9)
        signs = [s for s in (1, -1) if 0 <= total + s * d <= 99]
        op = rng.choice(signs) * d
        total += op
        ops.append(op)
    return Problem(start, tuple(ops))


def generate_problems(n: int, seed: int) -> list[Problem]:
    rng = random.Random(seed)
    return [generate_problem(rng) for _ in range(n)]


def worked_answer(p: Problem, carry_error: float = 0.0, rng: random.Random | None = None) -> str:
    """The worked answer: one ``a+d=b <rest of the chain>`` line per operation, then ``#### <total>``.

    With ``carry_error`` > 0 (needs ``rng``) it is the sloppy teacher's: on a step whose sum has a different
    tens digit than its first term (a carry or a borrow), it keeps that tens digit with this probability
    (``47+8`` -> ``45``, ``52-3`` -> ``59``) and goes on from the wrong total, so its final answer is wrong.
    """
    if carry_error > 0 and rng is None:
        raise ValueError("carry_error > 0 needs an rng")
    a, lines = p.start, []
    for i, d in enumerate(p.ops):
        b = a + d
        if carry_error > 0 and a >= 0 and b >= 0 and b // 10 != a // 10 and rng.random() < carry_error:
            b = (a // 10) * 10 + b % 10
        rest = "".join(f"{x:+d}" for x in p.ops[i + 1 :])
        lines.append(f"{a}{d:+d}={b}" + (" " + rest if rest else ""))
        a = b
    return "\n".join(lines) + f"\n#### {a}"


def _rows(problems: list[Problem], carry_error: float = 0.0, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    return [{"question": p.question, "answer": worked_answer(p, carry_error, rng)} for p in problems]


def dataset_rows(carry_error: float = 0.5, sizes: dict | None = None) -> dict[str, list[dict]]:
    """The three splits' rows (deterministic). Held-out test questions never appear in train or sft."""
    sizes = {**SIZES, **(sizes or {})}
    test = generate_problems(sizes["test"], SEEDS["test"])
    held = {p.question for p in test}
    out = {"test": _rows(test)}
    for split in ("train", "sft"):
        rng = random.Random(SEEDS[split])
        probs: list[Problem] = []
        while len(probs) < sizes[split]:
            p = generate_problem(rng)
            if p.question not in held:
                probs.append(p)
        out[split] = _rows(probs, carry_error if split == "sft" else 0.0, seed=SEEDS[split] + 100)
    return out


def write_dataset(out_dir: str | Path = DEFAULT_DIR, carry_error: float = 0.5, sizes: dict | None = None):
    """Write ``train.jsonl``, ``test.jsonl`` and ``sft.jsonl`` into ``out_dir``; returns the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for split, rows in dataset_rows(carry_error, sizes).items():
        path = out / f"{split}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        paths.append(path)
    return paths


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m services.pipeline.tasks.running_total")
    ap.add_argument("--out", default=str(DEFAULT_DIR))
    ap.add_argument("--carry-error", type=float, default=0.5, help="sloppy teacher's carry error (sft.jsonl)")
    args = ap.parse_args(argv)
    for p in write_dataset(args.out, args.carry_error):
        print(p)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
