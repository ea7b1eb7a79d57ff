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
before its ``=``, which a small transformer learns fast (a format where each line is only the sum and the
rest, ``=55-3+9``, copies more but puts the inputs a line away, and the same base-model recipe learns it
far worse). Its length grows quadratically with the chain (one token per digit: ~30 tokens
for 3 operations, ~200 for 12). Chain lengths are mixed (most problems have 2-5 operations, some 6-10, a few
11-14), so response lengths have a long tail. Each line's rest is a copy of the previous line's after its
first term, which a suffix or n-gram drafter predicts once that term is written.

Files are in the GSM8K JSONL format (``{"question", "answer"}``, the answer ending with ``#### <total>``), so
prompts (:func:`services.pipeline.datasets.format_prompt`), answer extraction and the exact-match reward
(:func:`services.pipeline.rewards.gsm8k_reward`) are the GSM8K ones. ``write_dataset`` writes, from fixed
seeds:

- ``train.jsonl``: RL prompts with their correct worked answers;
- ``test.jsonl``: the fixed held-out evaluation set (disjoint from ``train.jsonl`` and ``sft.jsonl``);
- ``sft.jsonl``: the supervised data of the base policy, with more long chains (``SFT_LENGTH_MIX``: 20% have
  11-14 operations), so that the base policy copies a long line's rest and sums as exactly as a short
  one's, written by a *hasty teacher* that, on ``hasty_rate``
  (default 0.6) of the problems, stops after the first line and gives its sum as the total
  (``47+8=55 -3+9`` then ``#### 55``). The base policy imitates both habits, so after its first line it
  usually answers too early (greedy decoding always does) and is wrong. The choice is one token (``####``
  or the next line's first digit) after the first line, so the exact-match reward teaches the policy to
  work the chain out in a few GRPO steps: held-out accuracy rises and responses grow longer, with the
  long tail of the long chains.

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
    "teacher_answer",
    "worked_answer",
    "write_dataset",
]

NAME = "running_total"
DEFAULT_DIR = DATA_ROOT / NAME
# chain-length mixture: (probability, min ops, max ops) -- most short, some medium, a few long
LENGTH_MIX: tuple[tuple[float, int, int], ...] = ((0.80, 2, 5), (0.17, 6, 10), (0.03, 11, 14))
# sft.jsonl's mixture: more long chains, so that the base policy copies a long line's rest as exactly as a
# short one's (with LENGTH_MIX it copies the rest of a 6+ operation chain at p ~0.65 a token)
SFT_LENGTH_MIX: tuple[tuple[float, int, int], ...] = ((0.45, 2, 5), (0.35, 6, 10), (0.20, 11, 14))
SEEDS = {"train": 1, "test": 2, "sft": 3}
SIZES = {"train": 4000, "test": 500, "sft": 30000}
HASTY_RATE = 0.6  # the hasty teacher stops after the first line on this share of sft.jsonl


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


def _num_ops(rng: random.Random, mix: tuple[tuple[float, int, int], ...]) -> int:
    u = rng.random()
    for p, lo, hi in mix:
        if u < p:
            return rng.randint(lo, hi)
        u -= p
    return rng.randint(mix[-1][1], mix[-1][2])


def generate_problem(rng: random.Random, mix: tuple[tuple[float, int, int], ...] = LENGTH_MIX) -> Problem:
    """One problem from ``rng``: start in 10..99, 2-14 operations (drawn from ``mix``: (probability, min,
    max) ranges), running total always in 0..99."""
    total = start = rng.randint(10, 99)
    ops = []
    for _ in range(_num_ops(rng, mix)):
        d = rng.randint(1, 9)
        signs = [s for s in (1, -1) if 0 <= total + s * d <= 99]
        op = rng.choice(signs) * d
        total += op
        ops.append(op)
    return Problem(start, tuple(ops))


def generate_problems(n: int, seed: int) -> list[Problem]:
    rng = random.Random(seed)
    return [generate_problem(rng) for _ in range(n)]


def worked_answer(p: Problem) -> str:
    """The worked answer: one ``a+d=b <rest of the chain>`` line per operation, then ``#### <total>``."""
    a, lines = p.start, []
    for i, d in enumerate(p.ops):
        rest = "".join(f"{x:+d}" for x in p.ops[i + 1 :])
        lines.append(f"{a}{d:+d}={a + d}" + (" " + rest if rest else ""))
        a += d
    return "\n".join(lines) + f"\n#### {a}"


def teacher_answer(p: Problem, hasty_rate: float, rng: random.Random) -> str:
    """The hasty teacher's answer: with probability ``hasty_rate`` the first line, then ``#### <its sum>``
    (wrong unless the rest of the chain sums to 0), else the worked answer.

    Raises:
        ValueError: ``hasty_rate`` outside [0, 1].
    """
    if not 0.0 <= hasty_rate <= 1.0:
        raise ValueError(f"hasty_rate must be in [0, 1], got {hasty_rate}")
    worked = worked_answer(p)
    if len(p.ops) < 2 or rng.random() >= hasty_rate:
        return worked
    return worked.split("\n", 1)[0] + f"\n#### {p.start + p.ops[0]}"


def _rows(problems: list[Problem], hasty_rate: float | None = None, seed: int = 0) -> list[dict]:
    """GSM8K-format rows: worked answers, or the hasty teacher's with ``hasty_rate``."""
    rng = random.Random(seed)
    answer = worked_answer if hasty_rate is None else (lambda p: teacher_answer(p, hasty_rate, rng))
    return [{"question": p.question, "answer": answer(p)} for p in problems]


def dataset_rows(hasty_rate: float = HASTY_RATE, sizes: dict | None = None) -> dict[str, list[dict]]:
    """The three splits' rows (deterministic). Held-out test questions never appear in train or sft."""
    sizes = {**SIZES, **(sizes or {})}
    test = generate_problems(sizes["test"], SEEDS["test"])
    held = {p.question for p in test}
    out = {"test": _rows(test)}
    for split in ("train", "sft"):
        rng = random.Random(SEEDS[split])
        probs: list[Problem] = []
        while len(probs) < sizes[split]:
            p = generate_problem(rng, SFT_LENGTH_MIX if split == "sft" else LENGTH_MIX)
            if p.question not in held:
                probs.append(p)
        out[split] = _rows(probs, hasty_rate if split == "sft" else None, seed=SEEDS[split] + 100)
    return out


def write_dataset(
    out_dir: str | Path = DEFAULT_DIR, hasty_rate: float = HASTY_RATE, sizes: dict | None = None
):
    """Write ``train.jsonl``, ``test.jsonl`` and ``sft.jsonl`` into ``out_dir``; returns the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for split, rows in dataset_rows(hasty_rate, sizes).items():
        path = out / f"{split}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        paths.append(path)
    return paths


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m services.pipeline.tasks.running_total")
    ap.add_argument("--out", default=str(DEFAULT_DIR))
    ap.add_argument(
        "--hasty-rate", type=float, default=HASTY_RATE, help="hasty teacher's early-stop rate (sft.jsonl)"
    )
    args = ap.parse_args(argv)
    for p in write_dataset(args.out, args.hasty_rate):
        print(p)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
