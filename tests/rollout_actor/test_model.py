"""Our decoder vs transformers on the same random weights (fp32, max abs diff <= 1e-4), with and without cache."""

import pytest
import torch

from services.rollout_actor.model import ModelLoadError, Transformer


def test_logits_match_without_cache(pair):
    name, ref, ours = pair
    ids = torch.randint(0, 97, (3, 17), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = ref(ids).logits
        got = ours(ids).logits
    assert (got - want).abs().max().item() <= 1e-4, name


def test_logits_match_with_cache_incremental(pair):
    """Prefill 10 tokens into slots, then feed 1, 3 and 1 more tokens; compare each chunk with the full pass."""
    name, ref, ours = pair
    ids = torch.randint(0, 97, (2, 15), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = ref(ids).logits
        cache = ours.new_cache(num_slots=4, max_len=32)
        slots = torch.tensor([3, 1])
        start = 0
        for chunk in (10, 1, 3, 1):
            out = ours(ids[:, start : start + chunk], cache=cache, slots=slots).logits
            assert (out - want[:, start : start + chunk]).abs().max().item() <= 1e-4, (name, start)
            cache.commit(slots, torch.full((2,), chunk))
            start += chunk


def test_rollback_and_tree_mask(pair):
    """Write a 2-branch tree, keep one branch: logits after compaction equal a plain pass of that branch."""
    name, ref, ours = pair
    prefix = torch.randint(0, 97, (1, 6), generator=torch.Generator().manual_seed(3))
    a, b, c = 5, 7, 11
    with torch.no_grad():
        cache = ours.new_cache(num_slots=1, max_len=32)
        slots = torch.tensor([0])
        ours(prefix, cache=cache, slots=slots)
        cache.commit(slots, torch.tensor([6]))
        # tree: root token a at depth 0; children b (node 1) and c (node 2); the same depth for b and c.
        toks = torch.tensor([[a, b, c]])
        pos = torch.tensor([[6, 7, 7]])
        mask = torch.tensor([[[1, 0, 0], [1, 1, 0], [1, 0, 1]]], dtype=torch.bool)
        tree = ours(toks, positions=pos, cache=cache, slots=slots, attn_mask=mask).logits
        want_c = ref(torch.cat([prefix, torch.tensor([[a, c]])], 1)).logits
        assert (tree[0, 2] - want_c[0, -1]).abs().max().item() <= 1e-4
        cache.keep_path(0, [0, 2])  # keep a, c
        assert int(cache.lengths[0]) == 8
        nxt = ours(torch.tensor([[b]]), cache=cache, slots=slots).logits
        want = ref(torch.cat([prefix, torch.tensor([[a, c, b]])], 1)).logits
        assert (nxt[0, -1] - want[0, -1]).abs().max().item() <= 1e-4
        cache.rollback(slots, torch.tensor([2]))  # drop a, c
        again = ours(torch.tensor([[c]]), cache=cache, slots=slots).logits
        want = ref(torch.cat([prefix, torch.tensor([[c]])], 1)).logits
        assert (again[0, -1] - want[0, -1]).abs().max().item() <= 1e-4


def test_hidden_states_match(pair):
    name, ref, ours = pair
    ids = torch.randint(0, 97, (1, 9), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        hs = ref(ids, output_hidden_states=True).hidden_states  # embeddings, layer0, layer1(normed)
        out = ours(ids, hidden_layers=(0, 2))
    assert (out.hidden[0] - hs[1]).abs().max().item() <= 1e-4
    assert (out.hidden[2] - hs[2]).abs().max().item() <= 1e-4


def test_save_roundtrip(pair, tmp_path):
    name, ref, ours = pair
    ours.save_pretrained(tmp_path / "copy")
    again = Transformer.from_pretrained(tmp_path / "copy")
    ids = torch.randint(0, 97, (1, 5))
    with torch.no_grad():
        assert torch.equal(ours(ids).logits, again(ids).logits)


def test_bad_model_dirs(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        Transformer.from_pretrained(tmp_path / "nope")
    with pytest.raises(ModelLoadError, match="no config.json"):
        Transformer.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text('{"architectures": ["GPT2LMHeadModel"]}')
    with pytest.raises(ModelLoadError, match="not supported"):
        Transformer.from_pretrained(tmp_path)


@pytest.mark.parametrize("t", [1, 4])
def test_grouped_attention_equals_sdpa_gqa(t):
    """The decode / verify attention (query heads stacked per KV head) equals SDPA's grouped-query attention,
    with a per-row tree mask over the new tokens."""
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    from services.rollout_actor.attention import grouped_attention

    g = torch.Generator().manual_seed(5)
    b, h, kv, d, k = 3, 6, 2, 8, 11
    q = torch.randn(b, h, t, d, generator=g)
    kk, vv = torch.randn(b, kv, k, d, generator=g), torch.randn(b, kv, k, d, generator=g)
    mask = torch.rand(b, 1, t, k, generator=g) < 0.6
    mask[..., 0] = True  # every row sees at least one key
    want = sdpa(q, kk, vv, attn_mask=mask, enable_gqa=True)
    got = grouped_attention(q, kk, vv, mask)
    assert got.shape == want.shape and (got - want).abs().max().item() <= 1e-5
    # a different head -> KV-head assignment (not the contiguous groups GQA uses) does not match: not vacuous
    wrong = sdpa(q, kk.repeat(1, h // kv, 1, 1), vv.repeat(1, h // kv, 1, 1), attn_mask=mask)
    assert (wrong - want).abs().max().item() > 1e-3


@pytest.mark.parametrize("slots", [list(range(9)), [10, 3, 7, 0, 12, 5, 1, 8, 2]])
def test_logits_match_with_cache_at_grouped_batch(pair, slots):
    """From GROUPED_ATTENTION_MIN_BATCH rows the cached forward takes the grouped attention path: decode and
    multi-token chunks of 9 rows, consecutive slots (KV read as a view) or scattered (gathered), equal the
    reference's full pass."""
    from services.rollout_actor.attention import GROUPED_ATTENTION_MIN_BATCH

    name, ref, ours = pair
    assert len(slots) >= GROUPED_ATTENTION_MIN_BATCH
    ids = torch.randint(0, 97, (len(slots), 14), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        want = ref(ids).logits
        cache = ours.new_cache(num_slots=13, max_len=32)
        sl = torch.tensor(slots)
        start = 0
        for chunk in (8, 1, 4, 1):
            out = ours(ids[:, start : start + chunk], cache=cache, slots=sl).logits
            assert (out - want[:, start : start + chunk]).abs().max().item() <= 1e-4, (name, start)
            cache.commit(sl, torch.full((len(slots),), chunk))
            start += chunk


def test_rows_of_unequal_lengths_attend_over_their_own_keys_and_match_the_reference(pair):
    """A cached step whose rows hold very different numbers of keys (per_row_pays: each row attends over its own
    keys, scattered slots) gives every row the logits of the reference's full pass over that row alone."""
    from services.rollout_actor.attention import per_row_pays

    name, ref, ours = pair
    lengths, t, slots = [120, 8, 60, 20], 6, [5, 0, 3, 1]
    assert per_row_pays(len(lengths), t, [n + t for n in lengths])
    ids = torch.randint(0, 97, (len(lengths), max(lengths) + t), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        cache = ours.new_cache(num_slots=6, max_len=128)
        for row, (n, slot) in enumerate(zip(lengths, slots)):  # each row's prefix, alone
            sl = torch.tensor([slot])
            ours(ids[row : row + 1, :n], cache=cache, slots=sl)
            cache.commit(sl, torch.tensor([n]))
        step = torch.stack([ids[row, n : n + t] for row, n in enumerate(lengths)])
        out = ours(step, cache=cache, slots=torch.tensor(slots)).logits
        for row, n in enumerate(lengths):
            want = ref(ids[row : row + 1, : n + t]).logits[0, n:]
            assert (out[row] - want).abs().max().item() <= 1e-4, (name, row)


def test_bfloat16_model_runs_with_cache_and_stays_close_to_float32(pair):
    """A model cast to bf16 (how GPU rollouts run) keeps every activation in bf16: the float32 rotary tables are
    cast as transformers does (a bf16 forward with a cache failed in ``o_proj`` with float activations)."""
    name, ref, ours = pair
    ids = torch.randint(0, 97, (9, 10), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        want = ref(ids).logits
        bf = ours.to(torch.bfloat16)
        cache = bf.new_cache(num_slots=9, max_len=16)
        assert cache.k.dtype == torch.bfloat16
        sl = torch.arange(9)
        prefill = bf(ids[:, :8], cache=cache, slots=sl).logits
        cache.commit(sl, torch.full((9,), 8))
        step = bf(ids[:, 8:9], cache=cache, slots=sl).logits
    got = torch.cat([prefill, step], dim=1)
    assert got.dtype == torch.bfloat16
    err = (got.float() - want[:, :9]).abs().max().item()
    assert err <= 0.03 * want.abs().max().item(), (name, err)


def test_kv_cache_read_gathers_scattered_slots_and_views_a_slice(pair):
    """``KVCache.read``: scattered slots are gathered (on CPU into a reused buffer) with the values advanced
    indexing gives; a slice is a view of the cache."""
    _, _, ours = pair
    cache = ours.new_cache(num_slots=6, max_len=16)
    cache.k.normal_(generator=torch.Generator().manual_seed(1))
    cache.v.normal_(generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        for layer, rows in ((0, [4, 1, 3]), (1, [0, 5])):
            k, v = cache.read(layer, torch.tensor(rows), 11)
            assert torch.equal(k, cache.k[layer][rows, :, :11]) and torch.equal(
                v, cache.v[layer][rows, :, :11]
            )
        k, _ = cache.read(1, slice(2, 4), 7)
        assert k.data_ptr() == cache.k[1, 2].data_ptr() and k.shape[0] == 2 and k.shape[2] == 7
