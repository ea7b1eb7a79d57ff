"""A tiny random policy folder (HF format, real BPE tokenizer trained on a GSM8K slice) for fast pipeline tests."""

from __future__ import annotations

import pytest

from services.pipeline.base_model import save_tokenizer, train_tokenizer
from services.pipeline.datasets import format_prompt, format_response, load_gsm8k
from services.rollout_actor.model import ModelConfig, Transformer, init_weights
from tests.conftest import GSM8K_DIR


@pytest.fixture(scope="session")
def tiny_policy_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny_policy")
    ex = load_gsm8k(GSM8K_DIR / "train.jsonl")[:300]
    tok = train_tokenizer([format_prompt(e.question) + format_response(e.answer) for e in ex], 320)
    save_tokenizer(tok, out, 512)
    cfg = ModelConfig(
        vocab_size=320,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        eos_token_id=0,
        pad_token_id=0,
        max_position_embeddings=512,
    )
    init_weights(Transformer(cfg), seed=0, std=0.05).save_pretrained(out)
    return out
