"""Attention kernels of the cached forward (``model.py``): which SDPA backends CUDA may use, grouped-query
attention with each KV head's query heads stacked (``grouped_attention``), one row at a time over its own keys
(``per_row_attention``, CPU), and FlashAttention-2 over each row's keys in the slot cache in place
(``flash_attention``, CUDA fp16 / bf16 causal steps). Tensor layouts: q ``[B, H, T, D]``, k / v ``[B, KV, K, D]``
(or one layer's cache ``[slots, KV, max_len, D]``), masks ``[B, 1, T, K]`` or stacked ``[B, 1, G*T, K]``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

# Attention kernels allowed on CUDA: every backend but cuDNN's. cuDNN builds an execution plan per input shape,
# and an eager decode step's key length grows by one token per step: measured on an H200 (Qwen2-0.5B shapes,
# bf16, batch 1, 200 cached tokens) 2.2 ms of CPU per attention call, an engine step 48 ms instead of 15 ms.
CUDA_ATTENTION_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kw) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` (same arguments), restricted to ``CUDA_ATTENTION_BACKENDS`` on CUDA."""
    if not q.is_cuda:
        return F.scaled_dot_product_attention(q, k, v, **kw)
    with sdpa_kernel(CUDA_ATTENTION_BACKENDS):
        return F.scaled_dot_product_attention(q, k, v, **kw)


# Batch rows from which the cached forward uses ``grouped_attention`` on CPU (on CUDA: always). Measured on the
# default policy (6 query / 2 KV heads, 200 cached positions), CPU forward time old / grouped: batch 1 0.95-0.97,
# 4: 1.02, 16: 1.05, 64: 1.07 (decode) to 1.09 (5-token verify).
GROUPED_ATTENTION_MIN_BATCH = 8


def grouped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Grouped-query attention with each KV head's query heads stacked as extra query rows.

    q ``[B, H, T, D]``, k / v ``[B, KV, K, D]`` (query head h reads KV head ``h // (H / KV)``), mask ``[B, 1, T,
    K]`` bool, or already in the stacked layout ``[B, 1, G*T, K]`` (``grouped_mask``; bool or additive).
    Returns ``[B, H, T, D]``, the same as ``scaled_dot_product_attention(..., enable_gqa=True)``: one
    ``[G*T, D] x [D, K]`` product per (row, KV head) instead of G products of ``[T, D] x [D, K]``, so each KV
    head's keys are read once per step. Measured at batch 64, 200 cached positions, 2 KV heads of 6: 1.43 ->
    1.16 ms per layer on this CPU (the decode step reads K/V cold from memory). Same result up to float
    round-off (~5e-6 in the logits).
    """
    b, h, t, d = q.shape
    kv = k.shape[1]
    qg = q.reshape(b, kv, (h // kv) * t, d)  # row g' * T + t of KV head j = query head j * G + g', position t
    out = sdpa(qg, k, v, attn_mask=mask if mask.shape[2] != t else grouped_mask(mask, h // kv))
    return out.reshape(b, h, t, d)  # CUDA kernels may return [B, KV, G*T, D] strided as [B, G*T, KV, D]


def grouped_mask(mask: torch.Tensor, groups: int) -> torch.Tensor:
    """``[B, 1, T, K]`` -> ``[B, 1, G*T, K]`` (``G = groups``): the mask of ``grouped_attention``'s stacked rows."""
    b, _, t, k = mask.shape
    return mask.unsqueeze(2).expand(b, 1, groups, t, k).reshape(b, 1, groups * t, k)


def per_row_attention(
    q: torch.Tensor, ck: torch.Tensor, cv: torch.Tensor, mask: torch.Tensor, rows: list[tuple[int, int]]
) -> torch.Tensor:
    """``grouped_attention`` one batch row at a time over that row's own keys: q ``[B, H, T, D]``, ck / cv one
    layer's cache ``[slots, KV, max_len, D]``, mask ``[B, 1, G*T, K]`` (stacked layout), rows ``(slot, keys)``
    per batch row. Returns ``[B, H, T, D]``. Keys past a row's own are masked out in the padded product, so
    skipping them gives the same result (up to float round-off) for less work when lengths differ."""
    out = []
    for j, (slot, n) in enumerate(rows):
        k, v = ck[slot : slot + 1, :, :n].to(q.dtype), cv[slot : slot + 1, :, :n].to(q.dtype)
        out.append(grouped_attention(q[j : j + 1], k, v, mask[j : j + 1, :, :, :n]))
    return torch.cat(out)


def per_row_pays(b: int, t: int, keys: list[int]) -> bool:
    """Whether ``per_row_attention`` beats one padded product on CPU: the key positions it skips outweigh one SDPA
    call per row. Measured (6 query / 2 KV heads of 32, 1 thread), 8 rows of 300-1000 keys: 0.47 -> 0.36 ms at
    T = 1, 1.22 -> 0.89 ms at T = 9; of 860-1000 keys: 0.36 -> 0.46 ms at T = 1, equal at T = 9."""
    return b > 1 and b * max(keys) - sum(keys) > b * max(64, 384 // t)


def attention_bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean attention mask (True = attend) as the additive mask SDPA turns it into (0 / -inf in ``dtype``).
    The cached forward converts once per forward rather than once per layer inside every SDPA call."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))


# The cached forward on CUDA in fp16 / bf16 without a tree mask attends with FlashAttention-2 (``flash_attention``)
# instead of gathering each row's keys and masking the padding: measured on an H200 (Qwen2.5-7B shapes, one
# decode token, a 1,024-key bucket holding ~512 keys) the gather plus masked SDPA took 50 / 53 / 92 / 271 us a
# layer at batch 1 / 8 / 32 / 128, FlashAttention over exactly the cached keys 9-18 us at batch 1-32.
# ``TAILSPEC_FLASH_ATTENTION=0`` turns it off (the masked path everywhere).
FLASH_ATTENTION = os.environ.get("TAILSPEC_FLASH_ATTENTION", "1") != "0"


def flash_attention_applies(
    x: torch.Tensor, cache_k: torch.Tensor | None, attn_mask: torch.Tensor | None
) -> bool:
    """Whether a cached forward of activations ``x`` over a KV cache whose keys are ``cache_k`` (``KVCache.k``;
    None: no cache) uses ``flash_attention``: on CUDA, fp16 / bf16, a causal (chain) step (``attn_mask`` None), a
    head size FlashAttention-2 takes, and ``FLASH_ATTENTION`` on."""
    return (
        FLASH_ATTENTION
        and cache_k is not None
        and attn_mask is None
        and x.is_cuda
        and x.dtype in (torch.float16, torch.bfloat16)
        and cache_k.dtype == x.dtype
        and cache_k.shape[-1] % 8 == 0
        and cache_k.shape[-1] <= 256
    )


def varlen_flash(q, k, v, cu_q, cu_k, max_q: int, max_k: int, used_k) -> torch.Tensor:
    """FlashAttention-2's variable-length forward (causal, aligned to the end of each key sequence): q
    ``[total_q, heads, D]``, k / v ``[total_k, kv_heads, D]``, sequence i's queries at rows ``cu_q[i] ..
    cu_q[i + 1] - 1`` and its keys at rows ``cu_k[i] .. cu_k[i] + used_k[i] - 1``. Returns ``[total_q, heads,
    D]``."""
    return torch.ops.aten._flash_attention_forward(
        q, k, v, cu_q, cu_k, max_q, max_k, 0.0, True, False, seqused_k=used_k
    )[0]


@dataclass(frozen=True)
class FlashBatch:
    """``flash_attention``'s index tensors for one forward (the same in every layer, built once): each (row, KV
    head) is one sequence of ``varlen_flash``, its G = H / KV query heads over T tokens against the keys of that
    slot and head, which sit at row ``(slot * KV + head) * L`` of the flattened layer cache (the lengths come
    from ``used_k``, so these starts need not increase)."""

    cu_q: torch.Tensor  # [B*KV + 1] int32: query rows of sequence i start at cu_q[i]
    cu_k: torch.Tensor  # [B*KV + 1] int32: key rows of sequence i start at cu_k[i] (the last entry unused)
    used_k: torch.Tensor  # [B*KV] int32: keys sequence i attends
    max_k: int  # >= max(used_k)

    @staticmethod
    def of(slots: torch.Tensor, used: torch.Tensor, t: int, kv: int, length: int, max_k: int) -> FlashBatch:
        """For rows in cache ``slots [B]`` (long) attending ``used [B]`` keys each (committed + T; new token t
        sees the first ``used - T + t + 1``), T new tokens, ``kv`` KV heads, cache slots of ``length``
        positions."""
        b, dev = slots.numel(), slots.device
        cu_q = torch.arange(0, (b * kv + 1) * t, t, dtype=torch.int32, device=dev)
        start = (slots.view(b, 1) * kv + torch.arange(kv, device=dev)).view(-1) * length
        cu_k = torch.cat([start, start[-1:]]).to(torch.int32)
        used_k = used.view(b, 1).expand(b, kv).reshape(-1).to(torch.int32)
        return FlashBatch(cu_q, cu_k, used_k, max_k)


def flash_attention(q: torch.Tensor, ck: torch.Tensor, cv: torch.Tensor, fb: FlashBatch) -> torch.Tensor:
    """Attention of T new tokens per row over that row's own cached keys, read in place from the slot cache.

    q ``[B, H, T, D]`` (rotary applied), ck / cv one layer's cache ``[slots, KV, L, D]`` holding the new tokens'
    keys / values already, fb the forward's ``FlashBatch``. No gather and no mask. Returns ``[B, H, T, D]``."""
    b, h, t, d = q.shape
    n_slots, kv, length, _ = ck.shape
    g = h // kv
    qs = q.view(b, kv, g, t, d).permute(0, 1, 3, 2, 4).reshape(b * kv * t, g, d)
    flat = (n_slots * kv * length, 1, d)
    out = varlen_flash(qs, ck.view(flat), cv.view(flat), fb.cu_q, fb.cu_k, t, fb.max_k, fb.used_k)
    return out.view(b, kv, t, g, d).permute(0, 1, 3, 2, 4).reshape(b, h, t, d)
