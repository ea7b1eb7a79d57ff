"""The cached forward's FlashAttention path (``attention.flash_attention``): each (row, KV head) as one sequence of
FlashAttention-2's variable-length kernel over that slot's keys in place. On CPU the kernel is replaced by a
reference with its contract (queries ``cu_q[i]..``, keys from ``cu_k[i]``, ``used_k[i]`` of them, causal
aligned to the end), which checks the layout: slots out of order, rows of different lengths, decode and chain
verify widths, static key lengths (graphs) and whole engine runs. On a GPU the real kernel is checked against
the masked path (bf16)."""

import pytest
import torch
import torch.nn.functional as F

from services.rollout_actor import attention as attn_mod
from services.rollout_actor.engine import Engine, GenerationRequest, SamplingParams
from services.rollout_actor.model import Transformer, init_weights
from tests.conftest import tiny_config

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def varlen_reference(q, k, v, cu_q, cu_k, max_q, max_k, used_k):
    out = torch.empty_like(q)
    for i in range(cu_q.numel() - 1):
        lo, hi = int(cu_q[i]), int(cu_q[i + 1])
        start, used = int(cu_k[i]), int(used_k[i])
        assert hi - lo <= max_q and used <= max_k
        qs = q[lo:hi].transpose(0, 1)  # [heads, T, D]
        ks, vs = (x[start : start + used].transpose(0, 1) for x in (k, v))  # [kv_heads, used, D]
        ks, vs = (x.repeat_interleave(qs.shape[0] // ks.shape[0], 0) for x in (ks, vs))
        causal = torch.ones(hi - lo, used, dtype=torch.bool, device=q.device).tril(used - (hi - lo))
        out[lo:hi] = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=causal).transpose(0, 1)
    return out


@pytest.fixture
def forced_flash(monkeypatch):
    """The flash path on CPU in fp32, with the reference kernel."""
    monkeypatch.setattr(attn_mod, "varlen_flash", varlen_reference)
    monkeypatch.setattr(
        attn_mod, "flash_attention_applies", lambda x, cache_k, mask: cache_k is not None and mask is None
    )


def _model(**kw):
    cfg = tiny_config(num_attention_heads=6, num_key_value_heads=2, **kw)
    return init_weights(Transformer(cfg), seed=0, std=0.3).eval()


def _cache(model, prompts, slots, num_slots=6, max_len=48):
    dev = model.lm_head.weight.device
    cache = model.new_cache(num_slots, max_len)
    for p, s in zip(prompts, slots):
        one = torch.tensor([s], device=dev)
        model(torch.tensor([p], device=dev), cache=cache, slots=one)
        cache.commit(one, torch.tensor([len(p)], device=dev))
    return cache


@pytest.mark.parametrize("width", [1, 3])
@pytest.mark.parametrize("kv_len", [None, 48])
@torch.inference_mode()
def test_flash_layout_equals_the_masked_path(monkeypatch, width, kv_len):
    m = _model()
    prompts, slots = [[5, 6, 7, 8, 9], [11, 12], [3, 4, 5, 6, 7, 8, 9, 10, 11]], [4, 1, 2]
    ids = torch.tensor([[7, 8, 9][:width], [1, 2, 3][:width], [30, 31, 32][:width]])
    s = torch.tensor(slots)
    want_cache = _cache(m, prompts, slots)
    want = m(ids, cache=want_cache, slots=s, kv_len=kv_len, hidden_layers=(1,))
    monkeypatch.setattr(attn_mod, "varlen_flash", varlen_reference)
    calls = []
    monkeypatch.setattr(
        attn_mod, "flash_attention_applies", lambda x, cache_k, mask: calls.append(1) or mask is None
    )
    got_cache = _cache(m, prompts, slots)
    got = m(ids, cache=got_cache, slots=s, kv_len=kv_len, hidden_layers=(1,))
    assert calls  # the flash path ran
    # float round-off of another summation order (logits of magnitude ~10); a wrong key is off by ~1
    torch.testing.assert_close(got.logits, want.logits, atol=5e-4, rtol=1e-3)
    torch.testing.assert_close(got.hidden[1], want.hidden[1], atol=5e-4, rtol=1e-3)
    torch.testing.assert_close(got_cache.k, want_cache.k)  # the same cache writes
    # a tree mask keeps the masked path
    tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool).expand(3, 3, 3)
    if width == 3:
        a = m(ids, cache=got_cache, slots=s, attn_mask=tree).logits
        monkeypatch.setattr(attn_mod, "flash_attention_applies", lambda x, cache_k, mask: False)
        torch.testing.assert_close(a, m(ids, cache=got_cache, slots=s, attn_mask=tree).logits)


def _requests(n=5, max_new=12):
    return [
        GenerationRequest(
            str(i),
            [2 + i, 3 + 2 * i, 4],
            SamplingParams(temperature=1.0, seed=i, max_new_tokens=max_new + 2 * i),
        )
        for i in range(n)
    ]


def test_engine_with_flash_attention_generates_what_it_generates_without(forced_flash):
    from services.rollout_actor.speculative.ngram import NgramDrafter
    from services.rollout_actor.speculative.strategy import FixedStrategy, Strategy

    m = _model()
    for selector, drafters in (
        (None, None),
        (FixedStrategy(Strategy("ngram", 3)), {"ngram": NgramDrafter()}),
    ):
        kw = dict(max_batch_size=3, max_seq_len=40, eos_token_ids=[], drafters=drafters)
        on = Engine(m, selector=selector, **kw).generate(_requests())
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(attn_mod, "flash_attention_applies", lambda x, cache_k, mask: False)
            off = Engine(m, selector=selector, **kw).generate(_requests())
        assert [o.token_ids for o in on] == [o.token_ids for o in off]
        for a, b in zip(on, off):
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("width", [1, 4])
@torch.inference_mode()
def test_cuda_flash_attention_matches_the_masked_path(width):
    m = _model(head_dim=64).cuda().to(torch.bfloat16)
    assert attn_mod.flash_attention_applies(m.lm_head.weight, m.new_cache(1, 8).k, None)
    prompts, slots = [[5, 6, 7, 8, 9] * 7, [11, 12], [3, 4, 5, 6, 7, 8, 9, 10, 11]], [4, 1, 2]
    s = torch.tensor(slots, device="cuda")
    ids = torch.randint(0, 64, (3, width), generator=torch.Generator().manual_seed(width)).cuda()

    def run(flash: bool, kv_len=None):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(attn_mod, "FLASH_ATTENTION", flash)
            cache = _cache(m, prompts, slots)
            return m(ids, cache=cache, slots=s, kv_len=kv_len, hidden_layers=(1,)).hidden[1].float()

    ref = run(False)
    for kv_len in (None, 48):
        torch.testing.assert_close(run(True, kv_len), ref, atol=3e-2, rtol=3e-2)


@pytest.mark.gpu
@requires_cuda
def test_cuda_bf16_engine_with_graphs_equals_without():
    """bf16: the flash path in both engines (each row's exact keys, no bucket padding), the same tokens."""
    m = _model(head_dim=64, vocab_size=32).cuda().to(torch.bfloat16)
    kw = dict(max_batch_size=4, max_seq_len=64, eos_token_ids=[])
    off = Engine(m, cuda_graphs=False, **kw).generate(_requests(n=7))
    eng = Engine(m, cuda_graphs=True, **kw)
    on = eng.generate(_requests(n=7))
    assert [o.token_ids for o in on] == [o.token_ids for o in off]
    assert eng.graphed.pool.stats.hits > 0
