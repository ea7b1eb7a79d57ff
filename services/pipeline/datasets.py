"""GSM8K loading and the prompt/response format used by the whole project.

Every part of tailspec (base-model recipe, rollouts, rewards, benchmarks) builds prompts with
:func:`format_prompt` and SFT targets with :func:`format_response`; the policy ends a response with its EOS
token. The reward reads the number after the last ``####`` with :func:`extract_final_answer`.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "DatasetError",
    "GSM8KExample",
    "default_dataset_dir",
    "extract_final_answer",
    "format_prompt",
    "format_response",
    "load_gsm8k",
]

FINAL_ANSWER_MARKER = "####"
DATA_DIR_ENV = "TAILSPEC_DATA_DIR"


class DatasetError(ValueError):
    """A dataset file is missing or malformed; the message names the file and, where known, the line."""


@dataclass
class GSM8KExample:
    question: str
    answer: str  # the full reference solution, ending with "#### <number>"
    final_answer: str  # normalized number after the last "####"
    index: int  # 0-based position among the file's examples (blank lines not counted)


def repo_root() -> Path:
    """The repository root: two levels above ``services/`` (this file is services/pipeline/datasets.py)."""
    return Path(__file__).resolve().parents[2]


def default_dataset_dir() -> Path:
    """The GSM8K folder: ``$TAILSPEC_DATA_DIR`` if set, else ``<repo root>/data/gsm8k`` (vendored, MIT)."""
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        return Path(env).expanduser()
    return repo_root() / "data" / "gsm8k"


def format_prompt(question: str) -> str:
    """The prompt the policy sees for one question."""
    return "Question: " + question.strip() + "\nAnswer:"


def format_response(answer: str) -> str:
    """The supervised target that follows :func:`format_prompt` (the policy then emits EOS)."""
    return " " + answer.strip()


_TRAILING_ZEROS = re.compile(r"\.0+$")


def _normalize_number(text: str) -> str:
    s = text.strip().replace(",", "").replace("$", "")
    s = "".join(s.split())  # drop any inner whitespace, e.g. "1 000"
    s = _TRAILING_ZEROS.sub("", s)  # "18.00" -> "18"
    s = s.rstrip(".")  # "18." -> "18"
    return s


def extract_final_answer(text: str) -> str | None:
    """The normalized answer after the last ``####`` in ``text``, or None if there is none.

    Normalization strips commas, ``$``, whitespace, a trailing ``.0``/``.00`` and a trailing ``.``:
    ``"#### $1,000.00"`` -> ``"1000"``. Only the first line after the marker counts. Returns None when the
    marker is absent or nothing follows it.
    """
    if not text:
        return None
    pos = text.rfind(FINAL_ANSWER_MARKER)
    if pos < 0:
        return None
    tail = text[pos + len(FINAL_ANSWER_MARKER) :].strip()
    tail = tail.split("\n", 1)[0]
    answer = _normalize_number(tail)
    return answer or None


def load_gsm8k(path: str | os.PathLike) -> list[GSM8KExample]:
    """Read a GSM8K JSONL file (``{"question": ..., "answer": "... #### N"}`` per line).

    Blank lines are skipped. Raises :class:`DatasetError` naming the file (and the 1-based line number) for a
    missing file, malformed JSON, a missing or non-string ``question``/``answer``, or an answer without a
    ``#### <answer>`` final answer.
    """
    p = Path(path)
    if not p.is_file():
        raise DatasetError(f"{p}: dataset file not found")
    examples: list[GSM8KExample] = []
    with p.open("r", encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{p}:{lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DatasetError(f"{where}: malformed JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(row, dict):
                raise DatasetError(f"{where}: expected a JSON object, got {type(row).__name__}")
            for key in ("question", "answer"):
                if key not in row:
                    raise DatasetError(f"{where}: missing key {key!r}")
                if not isinstance(row[key], str):
                    raise DatasetError(
                        f"{where}: key {key!r} must be a string, got {type(row[key]).__name__}"
                    )
            answer = row["answer"]
            final = extract_final_answer(answer) if "#### " in answer else None
            if final is None:
                raise DatasetError(f"{where}: answer has no final answer ('#### <number>')")
            examples.append(GSM8KExample(row["question"], answer, final, len(examples)))
    return examples
