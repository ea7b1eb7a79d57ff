"""Fused q / k / v and gate / up projections (``services/rollout_actor/fused.py``): the same forward, the same
state dict, training untouched, weight loads reach the fused tensors, a replaced parameter falls back."""

from __future__ import annotations

import copy

import pytest
import torch

from services.rollout_actor.engine import Engine, GenerationRequest, SamplingParams
from services.rollout_actor.fused import fuse_projections, fused_linear, fused_product, linear_residual
from services.rollout_actor.model import Transformer, init_weights
from tests.conftest import tiny_config


@pytest.mark.parametrize("arch", ["Qwen2ForCausalLM", "LlamaForCausalLM"])  # q / k / v with and without bias
def test_fused_forward_and_state_dict_equal_the_separate_ones(arch):
    ref = init_weights(
        Transformer(tiny_config(architecture=arch, attention_bias=arch.startswith("Qwen2"))), 3
    )
    fused = copy.deepcopy(ref)
    params = {n: id(p) for n, p in fused.named_parameters()}
    assert fuse_projections(fused) == 2 * fused.config.num_hidden_layers
    assert fuse_projections(fused) == 0  # idempotent
    assert {n: id(p) for n, p in fused.named_parameters()} == params  # the same parameter objects
    ids = torch.randint(0, 64, (3, 7))
    with torch.no_grad():
        attn = fused.model.layers[0].self_attn
        x = torch.randn(3, 7, fused.config.hidden_size)
        assert fused_linear(attn, "qkv", x) is not None
        torch.testing.assert_close(fused(ids).logits, ref(ids).logits, atol=1e-5, rtol=1e-5)
    sd_ref, sd = ref.state_dict(), fused.state_dict()
    assert sd.keys() == sd_ref.keys() and all(torch.equal(sd[k], sd_ref[k]) for k in sd)


def test_the_inference_forward_with_a_kv_cache_equals_the_training_one():
    """No grad: q / k rotated as one tensor and the residual adds inside ``addmm``; with grad: the separate
    products and adds. Prefill then a 3-token step over the cache, rows at different lengths."""
    model = init_weights(Transformer(tiny_config(architecture="Qwen2ForCausalLM", attention_bias=True)), 5)
    fuse_projections(model)
    ids, step = torch.randint(0, 64, (2, 6)), torch.randint(0, 64, (2, 3))
    slots = torch.tensor([1, 0])

    def run(grad: bool) -> list[torch.Tensor]:
        cache = model.new_cache(num_slots=2, max_len=16)
        with torch.set_grad_enabled(grad):
            first = model(ids, cache=cache, slots=slots).logits
            cache.commit(slots, torch.tensor([6, 4]))
            return [first.detach(), model(step, cache=cache, slots=slots).logits.detach()]

    with torch.no_grad():
        assert fused_product(model.model.layers[0].self_attn, "qkv", torch.zeros(1, 1, 64)) is not None
    for fast, slow in zip(run(False), run(True)):
        torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-5)


def test_linear_residual_adds_in_the_product_and_falls_back_with_a_bias_or_grad():
    x, residual = torch.randn(2, 3, 8), torch.randn(2, 3, 5)
    for bias in (False, True):
        lin = torch.nn.Linear(8, 5, bias=bias)
        with torch.no_grad():
            torch.testing.assert_close(linear_residual(lin, x, residual), residual + lin(x))
            assert torch.equal(linear_residual(lin, x, None), lin(x))
    out = linear_residual(lin, x, residual)
    out.sum().backward()
    assert lin.weight.grad is not None


def test_training_gradients_reach_the_separate_parameters_and_updates_reach_the_fused_tensor():
    model = init_weights(Transformer(tiny_config()), 1)
    fuse_projections(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ids = torch.randint(0, 64, (2, 5))
    model(ids).logits.square().mean().backward()  # grad enabled: the separate products
    q = model.model.layers[0].self_attn.q_proj.weight
    assert q.grad is not None and q.grad.abs().sum() > 0
    opt.step()
    with torch.no_grad():  # the fused path reads the stepped weights
        x = torch.randn(2, 5, model.config.hidden_size)
        fq = fused_linear(model.model.layers[0].self_attn, "qkv", x)[0]
        torch.testing.assert_close(
            fq, torch.nn.functional.linear(x, q, model.model.layers[0].self_attn.q_proj.bias)
        )


def test_a_state_dict_load_reaches_the_fused_tensor_and_a_replaced_parameter_falls_back():
    a, b = init_weights(Transformer(tiny_config()), 1), init_weights(Transformer(tiny_config()), 2)
    fuse_projections(a)
    a.load_state_dict(b.state_dict())  # in place, as a weight sync does
    ids = torch.randint(0, 64, (2, 6))
    with torch.no_grad():
        torch.testing.assert_close(a(ids).logits, b(ids).logits, atol=1e-5, rtol=1e-5)
        mlp = a.model.layers[1].mlp
        mlp.up_proj.weight.data = mlp.up_proj.weight.data.clone() * 2  # no longer a view of the fused tensor
        assert fused_linear(mlp, "gate_up", torch.randn(1, 1, 64)) is None
        b.model.layers[1].mlp.up_proj.weight.mul_(2)
        torch.testing.assert_close(a(ids).logits, b(ids).logits, atol=1e-5, rtol=1e-5)


def test_an_engine_fuses_its_model_and_a_fused_model_saves(tmp_path):
    model = init_weights(Transformer(tiny_config()), 4, std=0.3).eval()
    Engine(model, max_batch_size=2, max_seq_len=32, eos_token_ids=[])
    assert fuse_projections(model) == 0  # the engine fused it
    model.save_pretrained(tmp_path)  # the views are written as tensors of their own
    loaded = Transformer.from_pretrained(tmp_path)
    ids = torch.randint(0, 64, (1, 5))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits, atol=1e-5, rtol=1e-5)
    out = Engine(loaded, max_batch_size=2, max_seq_len=32, eos_token_ids=[]).generate(
        [GenerationRequest("r", [3, 4, 5], SamplingParams(0.0, max_new_tokens=6))]
    )
    assert len(out[0].token_ids) == 6
