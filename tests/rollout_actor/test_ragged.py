"""The packed (ragged) cached forward: rows of different real lengths, padding skipped (``ragged.py``).

Against transformers on the same random weights (``pair``: Qwen2, Llama, Qwen3) (each row alone, no padding), and against the padded forward of
our own decoder (trees); the engine's lossless tests run it too (every CPU verify batch with enough padding)."""

import pytest
import torch

from services.rollout_actor.ragged import RaggedBatch, ragged_pays


def _prefill(model, ids, committed, slots, max_len=160):
    cache = model.new_cache(num_slots=max(slots) + 1, max_len=max_len)
    for row, (n, slot) in enumerate(zip(committed, slots)):
        sl = torch.tensor([slot])
        model(ids[row : row + 1, :n], cache=cache, slots=sl)
        cache.commit(sl, torch.tensor([n]))
    return cache


def test_packed_rows_match_the_reference_and_write_the_cache(pair):
    """Rows with 90 / 5 / 40 / 12 committed tokens (slots out of order) and 7 / 2 / 1 / 4 real tokens of a width
    of 7: each row's real logits equal the reference's full pass over that row alone, padding logits are 0, and
    the K/V written are the ones the next step reads (a decode step after committing them matches too)."""
    _, ref, ours = pair
    committed, real, t, slots = [90, 5, 40, 12], [7, 2, 1, 4], 7, [3, 0, 5, 1]
    assert ragged_pays(len(real), t, real)
    ids = torch.randint(0, 97, (4, 100), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        cache = _prefill(ours, ids, committed, slots)
        step = torch.stack([ids[r, n : n + t] for r, n in enumerate(committed)])
        sl = torch.tensor(slots)
        out = ours(step, cache=cache, slots=sl, row_lengths=real, hidden_layers=(2,))
        assert out.logits.shape == (4, t, 97) and out.hidden[2].shape == (4, t, 64)
        for r, (n, k) in enumerate(zip(committed, real)):
            want = ref(ids[r : r + 1, : n + k]).logits[0, n:]
            assert (out.logits[r, :k] - want).abs().max().item() <= 1e-4, r
            assert not out.logits[r, k:].any() and not out.hidden[2][r, k:].any()
        cache.commit(sl, torch.tensor(real))
        nxt = torch.stack([ids[r, n + k : n + k + 1] for r, (n, k) in enumerate(zip(committed, real))])
        out = ours(nxt, cache=cache, slots=sl).logits
        for r, (n, k) in enumerate(zip(committed, real)):
            want = ref(ids[r : r + 1, : n + k + 1]).logits[0, -1]
            assert (out[r, 0] - want).abs().max().item() <= 1e-4, r


def test_packed_tree_rows_equal_the_padded_forward(pair):
    """Tree rows (an ancestor mask, rotary positions at depth) packed give the padded forward's logits at every
    real position: the row's tree mask is cut to its real tokens."""
    _, _, ours = pair
    committed, real, t, slots = [30, 8, 50], [6, 3, 1], 6, [2, 0, 1]
    # root 0; nodes 1, 2 children of the root; 3 child of 1; 4 child of 2; 5 child of 3
    parents = [-1, 0, 0, 1, 2, 3]
    mask = torch.zeros(t, t, dtype=torch.bool)
    depth = [0] * t
    for j in range(t):
        mask[j, j] = True
        if j:
            mask[j] |= mask[parents[j]]
            depth[j] = depth[parents[j]] + 1
    mask = mask.expand(3, t, t).clone()
    ids = torch.randint(0, 97, (3, 60), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        a, b = (_prefill(ours, ids, committed, slots) for _ in range(2))
        step = torch.randint(0, 97, (3, t), generator=torch.Generator().manual_seed(4))
        sl = torch.tensor(slots)
        pos = torch.tensor(committed).view(3, 1) + torch.tensor(depth)
        want = ours(step, positions=pos, cache=a, slots=sl, attn_mask=mask).logits
        got = ours(step, positions=pos, cache=b, slots=sl, attn_mask=mask, row_lengths=real).logits
    for r, k in enumerate(real):
        assert (got[r, :k] - want[r, :k]).abs().max().item() <= 1e-5, r


def test_a_batch_without_enough_padding_is_not_packed_and_bad_lengths_raise():
    assert not ragged_pays(8, 9, [9] * 7 + [8])  # one padding token in 8 rows
    assert ragged_pays(8, 9, [9] * 6 + [8, 6])
    assert not ragged_pays(1, 9, [3])  # one row: nothing to pack
    slots, base = torch.tensor([0, 1]), torch.tensor([4, 4])
    for bad in ([3], [0, 2], [4, 2]):
        with pytest.raises(ValueError, match="row_lengths"):
            RaggedBatch.of(slots, base, bad, 3, 2, None, torch.float32)
