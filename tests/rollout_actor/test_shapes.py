"""Model shapes of real LLMs (``services/rollout_actor/shapes.py``): configs, parameter counts, building, tokenizers."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from services.rollout_actor import shapes
from services.rollout_actor.model import Transformer

# Published parameter counts (the model cards / safetensors index totals)
PUBLISHED = {
    "qwen2.5-0.5b": 494_032_768,
    "qwen2.5-1.5b": 1_543_714_304,
    "qwen2.5-7b": 7_615_616_512,
    "llama-3.1-8b": 8_030_261_248,
}


def small(cfg, **kw):
    """The same architecture and options, a few hundred thousand parameters."""
    base = dict(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=300,
    )
    return dataclasses.replace(cfg, **{**base, **kw})


@pytest.mark.parametrize("label", shapes.SHAPES)
def test_configs_parse(label):
    cfg = shapes.shape_config(label)
    assert cfg.vocab_size > 0 and cfg.num_hidden_layers > 0
    assert cfg.eos_ids(), f"{label}: no EOS id (trace replay ends each response with one)"
    assert all(0 <= e < cfg.vocab_size for e in cfg.eos_ids())


@pytest.mark.parametrize("label", list(PUBLISHED))
def test_parameter_count_from_config(label):
    assert shapes.count_parameters(shapes.shape_config(label)) == PUBLISHED[label]


def test_real_shape_fields():
    q7, llama = shapes.shape_config("qwen2.5-7b"), shapes.shape_config("llama-3.1-8b")
    assert (q7.hidden_size, q7.num_hidden_layers, q7.num_attention_heads, q7.num_key_value_heads) == (
        3584,
        28,
        28,
        4,
    )
    assert not q7.tie_word_embeddings and q7.attention_bias and q7.rope_theta == 1e6
    assert (llama.vocab_size, llama.num_key_value_heads, llama.rope_theta) == (128256, 8, 500000.0)
    assert not llama.attention_bias and llama.architecture == "LlamaForCausalLM"
    assert shapes.shape_config("qwen2.5-0.5b").tie_word_embeddings


@pytest.mark.parametrize("label", list(PUBLISHED))
def test_count_matches_allocated_model(label):
    cfg = small(shapes.shape_config(label))
    assert shapes.count_parameters(cfg) == Transformer(cfg).num_parameters()


def test_tiny_loads_its_trained_weights():
    model = shapes.build_model("tiny")
    ref = Transformer.from_pretrained(shapes.TINY_DIR)
    assert next(model.parameters()).dtype == torch.float32
    assert model.num_parameters() == shapes.count_parameters(model.config)
    for (n, a), (_, b) in zip(model.state_dict().items(), ref.state_dict().items()):
        assert torch.equal(a, b), n


@pytest.mark.parametrize("label", ["qwen2.5-0.5b", "llama-3.1-8b"])
def test_build_real_shape_random_weights(label, tmp_path, monkeypatch):
    # the real config shrunk (same architecture and options), written where build_model reads it
    d = json.loads(shapes.config_path(label).read_text())
    d.update(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4)
    d.update(num_key_value_heads=2, vocab_size=300, bos_token_id=1, eos_token_id=2)
    (tmp_path / label).mkdir()
    (tmp_path / label / "config.json").write_text(json.dumps(d))
    monkeypatch.setattr(shapes, "SHAPES_DIR", tmp_path)
    model = shapes.build_model(label, "cpu", seed=3)
    cfg = model.config
    assert model.num_parameters() == shapes.count_parameters(cfg)
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == cfg.tie_word_embeddings
    w = model.model.layers[0].mlp.up_proj.weight
    assert w.device.type == "cpu" and w.dtype == torch.float32
    assert abs(w.std().item() - 0.02) < 0.004
    assert torch.equal(model.model.norm.weight, torch.ones(64))
    again = shapes.build_model(label, "cpu", seed=3)
    assert torch.equal(
        again.model.layers[1].self_attn.q_proj.weight, model.model.layers[1].self_attn.q_proj.weight
    )
    out = model(torch.tensor([[5, 6, 7]]))
    assert out.logits.shape == (1, 3, 300) and torch.isfinite(out.logits).all()
    bf16 = shapes.build_model(label, "cpu", dtype=torch.bfloat16)
    assert next(bf16.parameters()).dtype == torch.bfloat16


def test_default_dtype():
    assert shapes.default_dtype("cpu") == torch.float32
    assert shapes.default_dtype("cuda") == torch.bfloat16


def test_unknown_shape():
    with pytest.raises(shapes.UnknownShapeError, match="qwen2.5-0.5b"):
        shapes.shape_config("qwen-9000")
    with pytest.raises(shapes.UnknownShapeError):
        shapes.build_model("nope")


def test_tokenizers_fit_the_vocabularies():
    tiny = shapes.load_tokenizer("tiny")
    assert tiny.get_vocab_size() <= shapes.shape_config("tiny").vocab_size
    bpe = shapes.load_tokenizer("qwen2.5-7b")
    assert bpe.get_vocab_size() == 32768
    text = "Let $x^2 + 3x = 10$. Then \\boxed{2}. Unseen bytes: \u00e9\u4e2d\U0001f600"
    ids = bpe.encode(text).ids
    assert bpe.decode(ids) == text  # byte level: any text round-trips, nothing unknown
    for label in shapes.REAL_SHAPES:
        assert shapes.tokenizer_path(label) == shapes.BPE_TOKENIZER
        assert max(ids) < bpe.get_vocab_size() <= shapes.shape_config(label).vocab_size
