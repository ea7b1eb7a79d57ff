"""The cached forward over rows of different lengths, packed: a verify step without its padding (CPU).

A verify batch is laid out ``[B, T]``: row b holds its root and ``len(draft_b)`` draft nodes, padded to the
longest draft (``verify_step.py``). On CPU the forward is compute-bound from a few dozen tokens (the default
policy at batch 8, 9 tokens a row: ~37 GFLOP/s on one core of a 2-core EPYC), so a padding token costs as much as
a real one: 18% of the slots of a suffix-k8 verify at batch 8 on the trace-replay workload are padding. Measured
there (one forward, 8 rows of 9): 59 real tokens 0.87x the padded forward's time, 44 tokens 0.74x.
``Transformer.forward(..., row_lengths=)`` then packs the ``P = sum(row_lengths)`` real tokens into one
``[1, P]`` sequence: embeddings, projections, MLPs and the output head run on P tokens, and attention runs per
row (``ragged_attention``) over that row's own queries and keys (a row's queries are consecutive in P). Its
logits and hidden states come back in the padded ``[B, T, ...]`` layout, zero at padding.

``RaggedBatch.of`` builds the per-forward index tensors and each row's additive mask (committed keys visible;
among the new tokens causal, or the row's tree mask), once for every layer. ``ragged_pays`` says when packing
beats the padded forward.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from services.rollout_actor.attention import attention_bias, grouped_attention, grouped_mask, sdpa

# Padding tokens per row from which the packed forward beats the padded one on CPU (``ragged_pays``): it
# attends one row at a time, which a batch of equal rows does in one call.
RAGGED_MIN_PADDING_PER_ROW = 0.5


@dataclass(frozen=True)
class RaggedBatch:
    """A packed forward's layout: B rows, P tokens, row b's tokens at packed positions ``start .. start + n``."""

    index: torch.Tensor  # [P] long: flat position b * T + t of each packed token in the padded [B, T] layout
    slots: torch.Tensor  # [P] long: cache slot of each packed token
    write_pos: torch.Tensor  # [P] long: cache position of each packed token
    rows: list[tuple[int, int, int, int]]  # [B] (slot, start in P, tokens n, keys = committed + n)
    bias: list[torch.Tensor | None]  # [B] [1, 1, G*n, keys] additive mask (stacked query heads); None: n = 1

    @staticmethod
    def of(
        slots: torch.Tensor,
        base: torch.Tensor,
        lengths: Sequence[int],
        t: int,
        groups: int,
        attn_mask: torch.Tensor | None,
        dtype: torch.dtype,
    ) -> RaggedBatch:
        """The layout of rows in cache ``slots [B]`` with ``base [B]`` committed tokens, ``lengths[b]`` real
        tokens of the padded width ``t``; ``groups``: query heads per KV head; ``attn_mask``: ``[B, T, T]``
        bool among the new tokens (None: causal); ``dtype``: of the additive masks.

        Raises:
            ValueError: a length outside ``1 .. t``, or not one per row.
        """
        b = slots.numel()
        if len(lengths) != b or any(not 1 <= n <= t for n in lengths):
            raise ValueError(f"row_lengths {list(lengths)} must give 1..{t} tokens for each of {b} rows")
        dev = slots.device
        slot_list, base_list = slots.tolist(), base.tolist()
        index, tok_slots, write_pos = [], [], []
        rows, bias, start = [], [], 0
        for i, (slot, committed, n) in enumerate(zip(slot_list, base_list, lengths)):
            index += range(i * t, i * t + n)
            tok_slots += [slot] * n
            write_pos += range(committed, committed + n)
            keys = committed + n
            rows.append((slot, start, n, keys))
            start += n
            if n == 1:  # the root alone sees every committed key and itself
                bias.append(None)
                continue
            m = torch.zeros(1, 1, groups * n, keys, dtype=dtype, device=dev)  # committed keys: visible
            if attn_mask is None:
                m[..., committed:] = _causal_bias(n, groups, dtype, dev)
            else:
                new = attn_mask[i, :n, :n].reshape(1, 1, n, n)
                m[..., committed:] = attention_bias(grouped_mask(new, groups), dtype)
            bias.append(m)
        index, tok_slots, write_pos = (torch.tensor(x, device=dev) for x in (index, tok_slots, write_pos))
        return RaggedBatch(index, tok_slots, write_pos, rows, bias)

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, T, ...]`` -> ``[1, P, ...]``: the real tokens, row after row."""
        return x.reshape(-1, *x.shape[2:])[self.index].unsqueeze(0)

    def unpack(self, x: torch.Tensor, b: int, t: int) -> torch.Tensor:
        """``[1, P, ...]`` -> ``[B, T, ...]``, zeros at padding."""
        out = x.new_zeros(b * t, *x.shape[2:])
        out[self.index] = x[0]
        return out.view(b, t, *x.shape[2:])


@functools.cache
def _causal_bias(n: int, groups: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``[1, 1, G*n, n]`` additive causal mask among n new tokens, in the stacked query-head layout."""
    causal = torch.ones(1, 1, n, n, dtype=torch.bool, device=device).tril()
    return attention_bias(grouped_mask(causal, groups), dtype)


def ragged_pays(b: int, t: int, lengths: Sequence[int]) -> bool:
    """Whether the packed forward beats the padded one on CPU: the batch holds at least
    ``RAGGED_MIN_PADDING_PER_ROW`` padding tokens per row."""
    return b > 1 and b * t - sum(lengths) >= RAGGED_MIN_PADDING_PER_ROW * b


def ragged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache, layer: int, rb: RaggedBatch):
    """Write the packed tokens' keys / values into ``cache`` (a ``KVCache``) at layer ``layer``, then attend each
    row's queries over its slot's keys (committed + its new ones) with its ``rb.bias``.

    q ``[1, H, P, D]``, k / v ``[1, KV, P, D]`` (rotary applied). Returns ``[1, P, H * D]``."""
    cache.k[layer][rb.slots, :, rb.write_pos] = k[0].transpose(0, 1).to(cache.k.dtype)
    cache.v[layer][rb.slots, :, rb.write_pos] = v[0].transpose(0, 1).to(cache.v.dtype)
    ck, cv = cache.k[layer], cache.v[layer]
    _, h, p, d = q.shape
    kv = k.shape[1]
    out = []
    for (slot, start, n, keys), bias in zip(rb.rows, rb.bias):
        kk, vv = ck[slot : slot + 1, :, :keys].to(q.dtype), cv[slot : slot + 1, :, :keys].to(q.dtype)
        qq = q[:, :, start : start + n]
        if bias is None:  # one query, every key: no mask
            out.append(sdpa(qq.reshape(1, kv, h // kv, d), kk, vv).reshape(1, h, 1, d))
        else:
            out.append(grouped_attention(qq, kk, vv, bias))
    return torch.cat(out, dim=2).transpose(1, 2).reshape(1, p, -1)
