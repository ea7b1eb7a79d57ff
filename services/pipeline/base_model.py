"""The embedded default policy ("base model"): a tiny Qwen2 trained from scratch on GSM8K solutions.

``build_base_model`` trains a byte-level BPE tokenizer on the GSM8K train split, then supervised-trains a
small ``Qwen2ForCausalLM`` on ``format_prompt(q) + format_response(a) + EOS`` (loss on the response and EOS;
prompt tokens get a small weight, ``prompt_loss_weight``, which teaches the model the language of the
questions at no extra compute). Everything is fp32 on CPU, seeded, and fits in a few minutes on 2 cores.
The folder it writes is a plain Hugging Face model folder (config.json, model.safetensors,
generation_config.json, tokenizer.json, tokenizer_config.json, special_tokens_map.json) that transformers
and vLLM load unchanged, plus ``recipe.json`` (every hyper-parameter, seed, data hash, time, final loss).

``--evaluate`` reports the format rate, answer accuracy and response lengths of the folder it wrote
(``services/pipeline/base_model_eval.py``; for the synthetic tasks the held-out accuracy of
``services/pipeline/evaluation.py``).

CLI: ``python -m services.pipeline.base_model --out DIR [--seed N] [--evaluate]``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from services.pipeline.base_model_eval import evaluate_base_model, quantiles
from services.pipeline.datasets import (
    GSM8KExample,
    default_dataset_dir,
    format_prompt,
    format_response,
    load_gsm8k,
)
from services.pipeline.evaluation import evaluate_model_dir
from services.pipeline.tasks import BASE_RECIPES, check_task, task_data_dir

EOS_TOKEN = "<|endoftext|>"
EOS_TOKEN_ID = 0


@dataclass
class BaseModelRecipe:
    """Every hyper-parameter of the base-model recipe (all written to recipe.json)."""

    seed: int = 0
    name: str = "tailspec-gsm8k-tiny-qwen2"
    train_file: str = "train.jsonl"  # supervised data in the data folder (GSM8K JSONL format)
    # tokenizer
    vocab_size: int = 2048
    split_digits: bool = False  # one token per digit (arithmetic tasks)
    # architecture (Qwen2)
    hidden_size: int = 192
    num_hidden_layers: int = 4
    num_attention_heads: int = 6  # head_dim = 192 / 6 = 32 (vLLM CPU needs head_dim >= 32)
    num_key_value_heads: int = 2  # GQA, 3 query heads per KV head
    intermediate_size: int = 576  # 3x hidden
    rope_theta: float = 10000.0
    max_position_embeddings: int = 1024
    rms_norm_eps: float = 1e-6
    initializer_range: float = 0.02
    tie_word_embeddings: bool = True
    # training
    steps: int = 420
    batch_size: int = 32  # sequences per step (~5.8k tokens)
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 30
    weight_decay: float = 0.1  # on matrices only (not norms, biases)
    adam_beta1: float = 0.9
    adam_beta2: float = 0.95
    adam_eps: float = 1e-8
    grad_clip: float = 1.0
    prompt_loss_weight: float = 0.1  # loss weight of prompt tokens; response + EOS tokens weigh 1.0
    sort_chunk_batches: int = 64  # length-bucketing: sort chunks of batch_size*this by length
    num_threads: int = 2
    # evaluation / rollouts
    max_new_tokens_factor: float = 2.0  # recommended max_new_tokens = factor x reference p99 (rounded up)


# --------------------------------------------------------------------------------------------- utilities


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def folder_size_bytes(path: str | os.PathLike) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def recommended_max_new_tokens(ref_p99: int, factor: float, multiple: int = 64) -> int:
    return int(math.ceil(factor * ref_p99 / multiple) * multiple)


def _dataset_files(data_dir: str | os.PathLike | None, train_file: str = "train.jsonl") -> tuple[Path, Path]:
    d = Path(data_dir) if data_dir is not None else default_dataset_dir()
    return d / train_file, d / "test.jsonl"


# --------------------------------------------------------------------------------------------- tokenizer


def train_tokenizer(texts: Sequence[str], vocab_size: int, split_digits: bool = False):
    """Byte-level BPE (GPT-2 style pre-tokenization) with ``<|endoftext|>`` as id 0 (EOS and pad);
    ``split_digits``: every digit is a token of its own (as in Qwen2's tokenizer)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    if split_digits:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
        )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    assert tok.token_to_id(EOS_TOKEN) == EOS_TOKEN_ID
    return tok


def save_tokenizer(tok, out_dir: Path, model_max_length: int) -> None:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json.

    The config files are written by hand with ``tokenizer_class: PreTrainedTokenizerFast`` so that both
    transformers 5 (which maps it to its tokenizers backend) and the transformers 4.x that vLLM may use load
    the folder with ``AutoTokenizer``.
    """
    tok.save(str(out_dir / "tokenizer.json"))
    eos = {"content": EOS_TOKEN, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": {str(EOS_TOKEN_ID): {**eos, "special": True}},
        "bos_token": None,
        "eos_token": EOS_TOKEN,
        "pad_token": EOS_TOKEN,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
        "padding_side": "right",
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    special = {"eos_token": eos, "pad_token": eos}
    (out_dir / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")


# --------------------------------------------------------------------------------------------- training


def _encode_examples(tok, examples: Sequence[GSM8KExample], max_len: int):
    """Per example: (ids, n_prompt) with ids = prompt ids + response ids + [EOS]."""
    prompts = tok.encode_batch([format_prompt(e.question) for e in examples])
    responses = tok.encode_batch([format_response(e.answer) for e in examples])
    out = []
    for p, r in zip(prompts, responses, strict=True):
        ids = (p.ids + r.ids + [EOS_TOKEN_ID])[:max_len]
        out.append((ids, len(p.ids)))
    return out


def _batch_order(n: int, batch_size: int, chunk_batches: int, lengths: Sequence[int], rng: random.Random):
    """One epoch of batches: seeded shuffle, sort within chunks by length (less padding), shuffle batches."""
    idx = list(range(n))
    rng.shuffle(idx)
    chunk = batch_size * chunk_batches
    batches = []
    for s in range(0, n, chunk):
        part = sorted(idx[s : s + chunk], key=lambda i: lengths[i])
        batches += [part[b : b + batch_size] for b in range(0, len(part), batch_size)]
    rng.shuffle(batches)
    return batches


def _collate(encoded, batch: Sequence[int], prompt_weight: float):
    import torch

    T = max(len(encoded[i][0]) for i in batch)
    ids = torch.full((len(batch), T), EOS_TOKEN_ID, dtype=torch.long)
    mask = torch.zeros((len(batch), T), dtype=torch.long)
    weight = torch.zeros((len(batch), T), dtype=torch.float32)  # weight of predicting token t
    resp = torch.zeros((len(batch), T), dtype=torch.bool)
    for row, i in enumerate(batch):
        seq, n_prompt = encoded[i]
        ids[row, : len(seq)] = torch.tensor(seq)
        mask[row, : len(seq)] = 1
        weight[row, 1:n_prompt] = prompt_weight  # the first token has no prediction
        weight[row, n_prompt : len(seq)] = 1.0
        resp[row, n_prompt : len(seq)] = True
    return ids, mask, weight, resp


def _lr_at(step: int, r: BaseModelRecipe) -> float:
    if step < r.warmup_steps:
        return r.lr * (step + 1) / r.warmup_steps
    progress = (step - r.warmup_steps) / max(1, r.steps - r.warmup_steps)
    return r.lr * (r.min_lr_ratio + (1 - r.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def build_qwen2_config(r: BaseModelRecipe):
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=r.vocab_size,
        hidden_size=r.hidden_size,
        intermediate_size=r.intermediate_size,
        num_hidden_layers=r.num_hidden_layers,
        num_attention_heads=r.num_attention_heads,
        num_key_value_heads=r.num_key_value_heads,
        max_position_embeddings=r.max_position_embeddings,
        rope_theta=r.rope_theta,
        rms_norm_eps=r.rms_norm_eps,
        initializer_range=r.initializer_range,
        tie_word_embeddings=r.tie_word_embeddings,
        bos_token_id=EOS_TOKEN_ID,
        eos_token_id=EOS_TOKEN_ID,
        pad_token_id=EOS_TOKEN_ID,
        use_cache=True,
    )


def _patch_config_json(out_dir: Path, r: BaseModelRecipe) -> None:
    """Add the pre-transformers-5 spellings (rope_theta, torch_dtype, head_dim) for older loaders (vLLM)."""
    path = out_dir / "config.json"
    cfg = json.loads(path.read_text())
    cfg.setdefault("rope_theta", r.rope_theta)
    cfg.setdefault("torch_dtype", "float32")
    cfg.setdefault("head_dim", r.hidden_size // r.num_attention_heads)
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def build_base_model(
    out_dir: str | os.PathLike,
    data_dir: str | os.PathLike | None = None,
    seed: int = 0,
    vocab_size: int = BaseModelRecipe.vocab_size,
    steps: int = BaseModelRecipe.steps,
    progress: bool = True,
    **overrides,
) -> dict:
    """Train the tokenizer and the policy, save them to ``out_dir``; return the recipe report (recipe.json).

    ``overrides`` may set any other :class:`BaseModelRecipe` field.
    """
    import torch
    from tqdm.auto import tqdm
    from transformers import Qwen2ForCausalLM

    r = BaseModelRecipe(seed=seed, vocab_size=vocab_size, steps=steps, **overrides)
    if r.hidden_size % r.num_attention_heads or r.hidden_size // r.num_attention_heads < 32:
        raise ValueError("hidden_size / num_attention_heads must be an integer >= 32 (vLLM CPU head_dim)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    train_path, test_path = _dataset_files(data_dir, r.train_file)
    train = load_gsm8k(train_path)
    test = load_gsm8k(test_path) if test_path.is_file() else []

    prev_threads = torch.get_num_threads()
    torch.set_num_threads(r.num_threads)
    t_start = time.time()
    try:
        # ---- tokenizer
        texts = [format_prompt(e.question) + format_response(e.answer) for e in train]
        tok = train_tokenizer(texts, r.vocab_size, r.split_digits)
        save_tokenizer(tok, out, r.max_position_embeddings)
        t_tok = time.time() - t_start
        encoded = _encode_examples(tok, train, r.max_position_embeddings)
        lengths = [len(ids) for ids, _ in encoded]
        n_chars = sum(len(t) for t in texts)
        n_tokens = sum(lengths)

        # ---- model
        torch.manual_seed(r.seed)
        model = Qwen2ForCausalLM(build_qwen2_config(r))
        model.train()
        n_params = sum(p.numel() for p in model.parameters())
        decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
        no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
        opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": r.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=r.lr,
            betas=(r.adam_beta1, r.adam_beta2),
            eps=r.adam_eps,
        )
        rng = random.Random(r.seed)
        batches: list[list[int]] = []
        epoch = 0
        history: list[float] = []
        tokens_seen = 0
        t_train = time.time()
        bar = tqdm(range(r.steps), desc="base model", disable=not progress, dynamic_ncols=True)
        for step in bar:
            if not batches:
                batches = _batch_order(len(encoded), r.batch_size, r.sort_chunk_batches, lengths, rng)
                epoch += 1
            ids, mask, weight, resp = _collate(encoded, batches.pop(), r.prompt_loss_weight)
            for g in opt.param_groups:
                g["lr"] = _lr_at(step, r)
            logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]
            ce = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1), reduction="none"
            ).view(ids.size(0), -1)
            w = weight[:, 1:]
            loss = (ce * w).sum() / w.sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), r.grad_clip)
            opt.step()
            with torch.no_grad():
                rmask = resp[:, 1:]
                resp_loss = float((ce * rmask).sum() / rmask.sum())
            history.append(resp_loss)
            tokens_seen += int(mask.sum())
            elapsed = time.time() - t_train
            bar.set_postfix(
                loss=f"{resp_loss:.3f}",
                tok_s=f"{tokens_seen / max(elapsed, 1e-9):.0f}",
                ep=epoch,
                refresh=False,
            )
        train_seconds = time.time() - t_train

        # ---- save
        model.eval()
        model.generation_config.bos_token_id = EOS_TOKEN_ID
        model.generation_config.eos_token_id = EOS_TOKEN_ID
        model.generation_config.pad_token_id = EOS_TOKEN_ID
        model.save_pretrained(out, safe_serialization=True)
        _patch_config_json(out, r)
    finally:
        torch.set_num_threads(prev_threads)

    # reference response lengths (response tokens + EOS, what the policy must generate)
    ref_train = quantiles([len(ids) - n_p for ids, n_p in encoded])
    ref_test = quantiles([len(tok.encode(format_response(e.answer)).ids) + 1 for e in test]) if test else {}
    prompt_test = quantiles([len(tok.encode(format_prompt(e.question)).ids) for e in test]) if test else {}
    ref_p99 = (ref_test or ref_train)["p99"]
    last = history[-20:]
    import tokenizers
    import transformers

    report = {
        "name": r.name,
        "recipe": asdict(r),
        "architecture": "Qwen2ForCausalLM",
        "head_dim": r.hidden_size // r.num_attention_heads,
        "num_parameters": n_params,
        "dtype": "float32",
        "prompt_format": "Question: {question}\\nAnswer:",
        "response_format": " {answer}<|endoftext|>",
        "loss": "cross-entropy on response + EOS tokens (weight 1) and prompt tokens (prompt_loss_weight)",
        "eos_token": EOS_TOKEN,
        "eos_token_id": EOS_TOKEN_ID,
        "pad_token_id": EOS_TOKEN_ID,
        "data": {
            "train_file": train_path.name,
            "train_sha256": sha256_file(train_path),
            "train_examples": len(train),
            "test_file": test_path.name if test else None,
            "test_sha256": sha256_file(test_path) if test else None,
            "test_examples": len(test),
        },
        "tokenizer": {
            "type": "byte-level BPE",
            "vocab_size": tok.get_vocab_size(),
            "train_chars_per_token": round(n_chars / n_tokens, 3),
            "train_tokens_per_epoch": n_tokens,
            "train_seconds": round(t_tok, 2),
        },
        "training": {
            "epochs": round(r.steps * r.batch_size / len(train), 3),
            "tokens_seen": tokens_seen,
            "train_seconds": round(train_seconds, 1),
            "tokens_per_second": round(tokens_seen / train_seconds, 1),
            "final_loss": round(sum(last) / len(last), 4),
            "final_loss_definition": "mean response-token (incl. EOS) cross-entropy over the last 20 steps",
            "last_step_loss": round(history[-1], 4),
            "loss_curve_every_20_steps": [round(x, 4) for x in history[::20]],
        },
        "reference_response_tokens": {"train": ref_train, "test": ref_test, "definition": "response + EOS"},
        "prompt_tokens_test": prompt_test,
        "recommended_max_new_tokens": recommended_max_new_tokens(ref_p99, r.max_new_tokens_factor),
        "recommended_max_new_tokens_definition": f"{r.max_new_tokens_factor}x reference test p99, to x64",
        "total_seconds": round(time.time() - t_start, 1),
        "machine": {
            "cpu_count": os.cpu_count(),
            "torch_threads": r.num_threads,
            "load_average_1m_at_end": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        },
        "versions": {
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
        },
    }
    report["model_and_tokenizer_bytes"] = folder_size_bytes(out)
    (out / "recipe.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


# --------------------------------------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m services.pipeline.base_model", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--out", required=True, help="output model folder")
    ap.add_argument("--task", default="gsm8k", help="gsm8k | running_total (services/pipeline/tasks)")
    ap.add_argument("--data-dir", default=None, help="data folder (default: the task's; GSM8K: data/gsm8k)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=None, help="default: the task recipe's")
    ap.add_argument("--vocab-size", type=int, default=None, help="default: the task recipe's")
    ap.add_argument("--evaluate", action="store_true", help="also evaluate and write eval.json")
    ap.add_argument("--eval-only", action="store_true", help="only evaluate the existing --out folder")
    ap.add_argument("--eval-n", type=int, default=200)
    ap.add_argument("--max-new-tokens", type=int, default=None)
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    progress = not args.no_progress
    task = check_task(args.task)
    data_dir = args.data_dir or task_data_dir(task)
    recipe = dict(BASE_RECIPES[task])
    recipe.update(
        {k: v for k, v in (("steps", args.steps), ("vocab_size", args.vocab_size)) if v is not None}
    )
    if not args.eval_only:
        report = build_base_model(args.out, data_dir, seed=args.seed, progress=progress, **recipe)
        summary = {
            k: report[k]
            for k in ("num_parameters", "model_and_tokenizer_bytes", "recommended_max_new_tokens")
        }
        summary.update(
            {k: report["training"][k] for k in ("train_seconds", "final_loss", "tokens_per_second")}
        )
        print(json.dumps(summary, indent=2))
    if (args.evaluate or args.eval_only) and task != "gsm8k":  # held-out accuracy, greedy and sampled
        test = load_gsm8k(Path(data_dir) / "test.jsonl")[: args.eval_n]
        result = evaluate_model_dir(
            args.out, test, temperature=1.0, max_new_tokens=args.max_new_tokens or 320
        )
        (Path(args.out) / "eval.json").write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result, indent=2))
    elif args.evaluate or args.eval_only:
        result = evaluate_base_model(
            args.out,
            args.data_dir,
            n=args.eval_n,
            max_new_tokens=args.max_new_tokens,
            seed=args.seed,
            progress=progress,
        )
        (Path(args.out) / "eval.json").write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps({k: v for k, v in result.items() if k != "samples"}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
