"""Model shapes of real LLMs: the decoder at the size of a public checkpoint, with random weights.

Benchmarks that replay recorded rollouts (``benchmarks/trace_replay``) need the *cost* of a real model's
forward (its hidden size, layers, heads, KV heads, vocabulary), not its weights: in trace replay the emitted
tokens come from the trace, so the weights only have to be the right size. A shape is a label:

========================  ==========================================================================
``tiny``                  the embedded default policy (``services/pipeline/assets/base_policy``, its own
                          config, trained weights and ``tokenizer.json``; vocabulary 2,048)
``qwen2.5-0.5b``          Qwen2.5-0.5B (494M parameters, vocabulary 151,936, tied embeddings)
``qwen2.5-1.5b``          Qwen2.5-1.5B (1.54B, vocabulary 151,936, tied)
``qwen2.5-7b``            Qwen2.5-7B (7.62B, vocabulary 152,064, untied)
``llama-3.1-8b``          Llama-3.1-8B (8.03B, vocabulary 128,256, untied)
========================  ==========================================================================

The real shapes' ``config.json`` are copies of the public Hugging Face configs (``data/shapes/<label>/``);
nothing is downloaded. Their tokenizer is a byte-level BPE of 32,768 tokens trained on local text
(``data/tokenizers/bpe32k-math-en``; its README says on what): every id is below every real shape's vocabulary.
Llama-3.1's ``rope_scaling`` (``rope_type: llama3``) only rescales the rotary frequencies (same FLOPs and
memory), which random weights make irrelevant: it is dropped when the config is parsed.

    >>> count_parameters(shape_config("qwen2.5-0.5b"))
    494032768
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from services.rollout_actor.model import ModelConfig, Transformer, fill_weights

REPO = Path(__file__).resolve().parents[2]
TINY = "tiny"
TINY_DIR = REPO / "services" / "pipeline" / "assets" / "base_policy"
SHAPES_DIR = REPO / "data" / "shapes"
BPE_TOKENIZER = REPO / "data" / "tokenizers" / "bpe32k-math-en" / "tokenizer.json"
REAL_SHAPES: tuple[str, ...] = ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b", "llama-3.1-8b")
SHAPES: tuple[str, ...] = (TINY, *REAL_SHAPES)


class UnknownShapeError(ValueError):
    """A shape label that is not in ``SHAPES``."""


def _check(label: str) -> None:
    if label not in SHAPES:
        raise UnknownShapeError(f"unknown model shape {label!r}; known: {', '.join(SHAPES)}")


def config_path(label: str) -> Path:
    """The ``config.json`` of shape ``label``. Raises ``UnknownShapeError``."""
    _check(label)
    return TINY_DIR / "config.json" if label == TINY else SHAPES_DIR / label / "config.json"


def shape_config(label: str) -> ModelConfig:
    """Parse shape ``label``'s Hugging Face config (Llama-3 rope scaling dropped, module docstring).

    Raises ``UnknownShapeError``, or ``ModelLoadError`` for a config the decoder does not support."""
    path = config_path(label)
    d = json.loads(path.read_text())
    scaling = d.get("rope_scaling") or {}
    if scaling.get("rope_type") == "llama3":
        d = {k: v for k, v in d.items() if k != "rope_scaling"}
    return ModelConfig.from_hf_dict(d, str(path))


def tokenizer_path(label: str) -> Path:
    """The ``tokenizer.json`` used with shape ``label`` (tiny: its own; real shapes: the 32k BPE)."""
    _check(label)
    return TINY_DIR / "tokenizer.json" if label == TINY else BPE_TOKENIZER


def load_tokenizer(label: str):
    """``tokenizers.Tokenizer`` for shape ``label``. Raises ``FileNotFoundError`` when the file is missing."""
    from tokenizers import Tokenizer

    path = tokenizer_path(label)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing (python -m benchmarks.trace_replay.train_tokenizer)")
    return Tokenizer.from_file(str(path))


def count_parameters(cfg: ModelConfig) -> int:
    """Parameters of the decoder ``cfg`` describes (tied embeddings counted once), computed from the config
    alone (nothing allocated): equals ``Transformer(cfg).num_parameters()``."""
    h, d, kv = cfg.num_attention_heads, cfg.head_dim, cfg.num_key_value_heads
    hid, inter, vocab = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    qkv_bias = (h + 2 * kv) * d if cfg.attention_bias else 0
    o_bias = hid if cfg.attention_bias and cfg.architecture != "Qwen2ForCausalLM" else 0
    attn = hid * h * d + 2 * hid * kv * d + h * d * hid + qkv_bias + o_bias
    mlp = 3 * hid * inter + (2 * inter + hid if cfg.mlp_bias else 0)
    norms = 2 * hid + (2 * d if cfg.qk_norm else 0)
    layers = cfg.num_hidden_layers * (attn + mlp + norms)
    embed = vocab * hid
    return embed + layers + hid + (0 if cfg.tie_word_embeddings else vocab * hid)


def default_dtype(device: str | torch.device) -> torch.dtype:
    """bf16 on CUDA, fp32 elsewhere."""
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


def build_model(
    label: str, device: str | torch.device = "cpu", dtype: torch.dtype | None = None, seed: int = 0
) -> Transformer:
    """The decoder of shape ``label`` on ``device`` in ``dtype`` (default ``default_dtype(device)``), eval mode.

    ``tiny`` loads the default policy's trained weights; a real shape gets random weights (normal, std 0.02,
    drawn on ``device`` from a generator seeded with ``seed``; norms one, biases zero), allocated once, in
    ``dtype``, directly on ``device`` (no fp32 copy on the host: Qwen2.5-7B in bf16 takes 15 GB).
    Raises ``UnknownShapeError``."""
    _check(label)
    dtype = dtype or default_dtype(device)
    device = torch.device(device)
    if label == TINY:
        return Transformer.from_pretrained(TINY_DIR, dtype=dtype).to(device).eval()
    cfg = shape_config(label)
    with torch.device("meta"):
        model = Transformer(cfg)
    model = model.to(dtype).to_empty(device=device)
    if cfg.tie_word_embeddings:  # to_empty gives every module its own tensor: tie again
        model.lm_head.weight = model.model.embed_tokens.weight
    gen = torch.Generator(device=device).manual_seed(seed)
    return fill_weights(model, lambda p: p.normal_(0.0, 0.02, generator=gen)).eval()


__all__ = [
    "SHAPES",
    "REAL_SHAPES",
    "TINY",
    "UnknownShapeError",
    "build_model",
    "config_path",
    "count_parameters",
    "default_dtype",
    "load_tokenizer",
    "shape_config",
    "tokenizer_path",
]
