"""Evaluating a base model folder the way its recipe reports it (``tailspec base-model --evaluate``).

``evaluate_base_model`` samples responses to GSM8K test questions with transformers ``generate`` and reports
the format rate (responses ending with ``#### <number>``, ``has_final_answer_format``), the answer accuracy
and the response-length distribution (``quantiles``) next to the reference solutions'.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path

from services.pipeline.datasets import (
    default_dataset_dir,
    extract_final_answer,
    format_prompt,
    format_response,
    load_gsm8k,
)

# Response ends with "#### <number>" (after stripping whitespace): the format the reward can read.
FINAL_ANSWER_FORMAT_RE = re.compile(r"####\s*\$?\s*-?\$?\d[\d,]*(?:\.\d+)?\.?$")


def has_final_answer_format(response: str) -> bool:
    """True when ``response`` (decoded up to, not including, EOS) ends with ``#### <number>``."""
    return FINAL_ANSWER_FORMAT_RE.search(response.strip()) is not None


def quantiles(values: Sequence[int | float]) -> dict:
    """p50/p90/p99/max/mean of a list of lengths (nearest-rank quantiles, deterministic)."""
    if not values:
        return {"n": 0}
    s = sorted(values)

    def q(p: float):
        return s[min(len(s) - 1, max(0, math.ceil(p * len(s)) - 1))]

    return {
        "n": len(s),
        "mean": round(sum(s) / len(s), 2),
        "p50": q(0.50),
        "p90": q(0.90),
        "p99": q(0.99),
        "max": s[-1],
    }


def evaluate_base_model(
    model_dir: str | os.PathLike,
    data_dir: str | os.PathLike | None = None,
    n: int = 200,
    temperature: float = 0.9,
    max_new_tokens: int | None = None,
    seed: int = 0,
    batch_size: int = 100,
    top_p: float = 1.0,
    progress: bool = True,
) -> dict:
    """Sample one response per question for the first ``n`` GSM8K test questions and summarize them.

    ``max_new_tokens`` defaults to recipe.json's ``recommended_max_new_tokens`` (else 512). A response ends
    at its first EOS; ``format_rate`` is the fraction whose stripped text ends with ``#### <number>``.
    """
    import torch
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = Path(model_dir)
    if max_new_tokens is None:
        recipe = model_dir / "recipe.json"
        max_new_tokens = (
            json.loads(recipe.read_text()).get("recommended_max_new_tokens", 512) if recipe.is_file() else 512
        )
    test_path = (Path(data_dir) if data_dir is not None else default_dataset_dir()) / "test.jsonl"
    examples = load_gsm8k(test_path)[:n]

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    eos = tokenizer.eos_token_id

    prev_threads = torch.get_num_threads()
    torch.set_num_threads(min(prev_threads, 2) if prev_threads else 2)
    torch.manual_seed(seed)
    t0 = time.time()
    records = []
    try:
        for s in tqdm(range(0, len(examples), batch_size), desc="evaluate", disable=not progress):
            chunk = examples[s : s + batch_size]
            enc = tokenizer([format_prompt(e.question) for e in chunk], return_tensors="pt", padding=True)
            with torch.no_grad():
                gen = model.generate(
                    **enc,
                    do_sample=True,
                    temperature=temperature,
                    top_p=top_p,
                    top_k=0,
                    max_new_tokens=max_new_tokens,
                    eos_token_id=eos,
                    pad_token_id=tokenizer.pad_token_id,
                )
            new = gen[:, enc["input_ids"].shape[1] :].tolist()
            for e, toks in zip(chunk, new, strict=True):
                ended = eos in toks
                toks = toks[: toks.index(eos)] if ended else toks
                text = tokenizer.decode(toks, skip_special_tokens=True)
                records.append(
                    {
                        "index": e.index,
                        "length": len(toks) + (1 if ended else 0),  # generated tokens incl. EOS
                        "eos": ended,
                        "format_ok": has_final_answer_format(text),
                        "correct": extract_final_answer(text) == e.final_answer,
                        "text": text,
                    }
                )
    finally:
        torch.set_num_threads(prev_threads)
    seconds = time.time() - t0
    ref = [len(tokenizer(format_response(e.answer)).input_ids) + 1 for e in examples]
    lengths = [rec["length"] for rec in records]
    k = len(records)
    return {
        "model_dir": str(model_dir.name),
        "n": k,
        "temperature": temperature,
        "top_p": top_p,
        "seed": seed,
        "max_new_tokens": max_new_tokens,
        "format_rate": round(sum(rec["format_ok"] for rec in records) / k, 4),
        "answer_accuracy": round(sum(rec["correct"] for rec in records) / k, 4),
        "eos_rate": round(sum(rec["eos"] for rec in records) / k, 4),
        "truncated_rate": round(sum(not rec["eos"] for rec in records) / k, 4),
        "response_tokens": quantiles(lengths),
        "reference_response_tokens": quantiles(ref),
        "length_definition": "generated tokens including EOS; reference = tokenized ' ' + answer + EOS",
        "generate_seconds": round(seconds, 1),
        "samples": [
            {key: rec[key] for key in ("index", "length", "format_ok", "correct", "text")}
            for rec in records[:5]
        ],
    }
