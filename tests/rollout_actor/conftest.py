"""Fixtures of the decoder tests: a transformers reference and our decoder on the same random weights."""

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from services.rollout_actor.model import Transformer

COMMON = dict(
    vocab_size=97,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    rms_norm_eps=1e-6,
)

CASES = {
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, dict(tie_word_embeddings=True, rope_theta=10000.0)),
    "llama": (LlamaConfig, LlamaForCausalLM, dict(tie_word_embeddings=False, rope_theta=500000.0)),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, dict(tie_word_embeddings=False, head_dim=32, rope_theta=1e6)),
}


@pytest.fixture(params=sorted(CASES))
def pair(request, tmp_path):
    cfg_cls, model_cls, extra = CASES[request.param]
    torch.manual_seed(0)
    kw = dict(COMMON, **extra)
    theta = kw.pop("rope_theta")
    cfg = cfg_cls(**kw, rope_parameters={"rope_type": "default", "rope_theta": theta})
    ref = model_cls(cfg).eval()
    with torch.no_grad():  # biases default to zero: randomize everything so qkv bias / q-k norm matter
        for p in ref.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    ref.save_pretrained(tmp_path)
    ours = Transformer.from_pretrained(tmp_path)
    return request.param, ref, ours
