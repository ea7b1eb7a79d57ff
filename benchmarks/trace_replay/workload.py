"""The trace-replay workload: real sampled reasoning rollouts as GRPO steps, tokenized for a model shape.

Source: ``data/traces/qwen25-math-math-cot/math_cot_50.jsonl``, 50 MATH problems x 8 responses sampled by
Qwen2.5-Math (``idx, question, system, level, answer, responses, correct``; README there).

* Prompt: the problem's ``system`` and ``question`` in a plain chat-like template (``format_prompt``), encoded
  with the shape's tokenizer (``services.rollout_actor.shapes.load_tokenizer``); each response encoded alone.
  The engine replays it (``GenerationRequest.reference``): it emits exactly those ids, then an EOS.
* Epochs (the DAS setting, arXiv 2511.13841): the 8 responses of a problem are two epochs over the same
  problems, ``G = 4`` responses each: responses 0-3 are epoch 0, 4-7 epoch 1. Epoch 0 is the history (what an
  earlier RL step on these problems generated: the suffix drafter's per-problem history, the length classes
  of the adaptive policy, its tuner's table); epoch 1 is measured. Running the 8 responses as one epoch twice
  would replay in epoch 1 the very responses the drafter already holds, an acceptance no real run sees.
* A GRPO-like step submits ``problems x G`` requests together, in submission order (problem-major: a group's
  siblings are consecutive, so they are in flight at once and each can draft from those that finished).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from services.rollout_actor.engine import GenerationRequest, SamplingParams

REPO = Path(__file__).resolve().parents[2]
TRACES = REPO / "data" / "traces" / "qwen25-math-math-cot" / "math_cot_50.jsonl"
NUM_PROBLEMS = 50  # rows of TRACES
GROUP = 4  # responses per problem per epoch
EPOCHS = 2  # 8 responses = 2 epochs of GROUP
HISTORY_EPOCH, MEASURED_EPOCH = 0, 1
# Sampling of the replayed requests. In replay the trace decides every token; the processing (temperature, and
# no top-k / top-p, as GRPO rollouts sample) still runs in every step, so it is what a real rollout pays.
SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": 0}


def format_prompt(system: str, question: str) -> str:
    """The prompt text: ``system`` and ``question`` in a chat-like template ending where the answer starts."""
    return f"System: {system}\n\nUser: {question}\n\nAssistant:"


@dataclass(frozen=True)
class TraceProblem:
    """One MATH problem: its prompt ids and each recorded response's ids (without EOS)."""

    problem_id: str
    level: str
    prompt_ids: list[int]
    responses: list[list[int]]

    def epoch(self, e: int, group: int = GROUP) -> list[list[int]]:
        """The responses of epoch ``e``: ``responses[e * group : (e + 1) * group]``. Raises ``ValueError``
        past the recorded responses."""
        if e < 0 or (e + 1) * group > len(self.responses):
            raise ValueError(f"{self.problem_id}: epoch {e} of {group} needs {(e + 1) * group} responses")
        return self.responses[e * group : (e + 1) * group]


def load_rows(path: Path = TRACES, problems: int | None = None) -> list[dict]:
    """The first ``problems`` rows of the trace file (all when None), in file order."""
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return rows if problems is None else rows[:problems]


def tokenize(rows: Sequence[dict], tokenizer, vocab_size: int, eos_ids: Sequence[int]) -> list[TraceProblem]:
    """Encode every prompt and response with ``tokenizer`` (a ``tokenizers.Tokenizer``).

    Raises ``ValueError`` when an id is not below ``vocab_size`` (tokenizer and model do not match; nothing is
    mapped or clamped) or a response contains an EOS id (its replay would stop there)."""
    eos = set(eos_ids)
    out = []
    for row in rows:
        pid = f"math-{row['idx']}"
        prompt = tokenizer.encode(format_prompt(row["system"], row["question"])).ids
        responses = [tokenizer.encode(r).ids for r in row["responses"]]
        for ids in [prompt, *responses]:
            big = [t for t in ids if t >= vocab_size]
            if big:
                raise ValueError(f"{pid}: token id {big[0]} >= the model's vocabulary ({vocab_size})")
        for g, ids in enumerate(responses):
            if eos & set(ids):
                raise ValueError(f"{pid}: response {g} contains an EOS id ({sorted(eos & set(ids))})")
        out.append(TraceProblem(pid, row.get("level", ""), prompt, responses))
    return out


def requests(problems: Sequence[TraceProblem], epoch: int, group: int = GROUP) -> list[GenerationRequest]:
    """One GRPO-like step: every problem's ``group`` responses of ``epoch`` as replay requests, problem-major.

    Request ``i`` of problem ``p`` is ``"{problem_id}-e{epoch}-g{i}"`` with ``reference`` = its response ids
    and ``max_new_tokens = len(reference) + 1`` (the response, then EOS)."""
    out = []
    for p in problems:
        for g, ref in enumerate(p.epoch(epoch, group)):
            params = SamplingParams(**SAMPLING, max_new_tokens=len(ref) + 1, seed=epoch * 100 + g)
            out.append(
                GenerationRequest(
                    f"{p.problem_id}-e{epoch}-g{g}",
                    list(p.prompt_ids),
                    params,
                    p.problem_id,
                    reference=list(ref),
                )
            )
    return out


def max_seq_len(problems: Sequence[TraceProblem], margin: int = 16) -> int:
    """KV-cache length that holds every problem's prompt + longest response + EOS, plus ``margin``."""
    return max(len(p.prompt_ids) + max(len(r) for r in p.responses) + 2 for p in problems) + margin


def describe(problems: Sequence[TraceProblem], epoch: int, group: int = GROUP) -> dict:
    """Token counts of one epoch: requests, prompt tokens (mean), response tokens (total, mean, p90, max)."""
    lens = sorted(len(r) for p in problems for r in p.epoch(epoch, group))
    return {
        "problems": len(problems),
        "requests": len(lens),
        "prompt_tokens_mean": sum(len(p.prompt_ids) for p in problems) / max(1, len(problems)),
        "response_tokens": sum(lens),
        "response_tokens_mean": sum(lens) / max(1, len(lens)),
        "response_tokens_p90": lens[min(len(lens) - 1, int(0.9 * len(lens)))] if lens else 0,
        "response_tokens_max": lens[-1] if lens else 0,
    }
