"""A compact decoder for the Llama / Qwen2 / Qwen3 family, with a slot KV cache for speculative decoding.

One file, no magic: RMSNorm, rotary embeddings with the checkpoint's theta, grouped-query attention,
SwiGLU MLP, tied or untied embeddings, Qwen2's qkv bias, Qwen3's per-head q/k RMSNorm. Module and parameter
names match Hugging Face's, so ``model.safetensors`` loads and saves unchanged (``from_pretrained`` /
``save_pretrained`` work on local folders holding config.json, model.safetensors, tokenizer.json).

The KV cache is a set of *slots* (one per running sequence) with per-slot committed lengths:
``k, v: [layers, slots, kv_heads, max_len, head_dim]`` and ``lengths: [slots]``. A forward with a cache
writes the new tokens' keys/values at cache positions ``lengths[slot] + t`` (t < T) and does not move
``lengths``: the caller commits what it keeps (``KVCache.commit``), so rolling back rejected draft tokens
costs nothing, and a token tree is compacted to its accepted path with ``KVCache.keep_path``.

Attention of new token i of row b may see every committed position of its slot plus the new tokens t with
``attn_mask[b, i, t]`` (default: causal). Rotary positions are passed explicitly (``positions``), so a
tree's nodes take ``length + depth`` while sitting at consecutive cache positions.
On CUDA in fp16 / bf16 a causal step (plain decode, chain verify, prefill) attends with FlashAttention-2 over each
row's own keys in place (``attention.flash_attention``); a tree mask, CPU or fp32 build the mask and gather the keys.
On CPU a verify batch whose rows hold different numbers of real tokens (``row_lengths``) runs packed, without its
padding (``ragged.py``).

Check against transformers: ``tests/rollout_actor/test_model.py``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from services.rollout_actor import attention
from services.rollout_actor.attention import (
    GROUPED_ATTENTION_MIN_BATCH,
    attention_bias,
    grouped_attention,
    grouped_mask,
    per_row_attention,
    per_row_pays,
    sdpa,
)
from services.rollout_actor.fused import fused_linear, fused_product, linear_residual
from services.rollout_actor.ragged import RaggedBatch, ragged_attention, ragged_pays

SUPPORTED_ARCHITECTURES = ("Qwen2ForCausalLM", "LlamaForCausalLM", "Qwen3ForCausalLM")
_REQUIRED_KEYS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
)
_KNOWN_KEYS = {  # config.json keys ModelConfig reads (the others are kept in ``extra``)
    *_REQUIRED_KEYS,
    *"architectures model_type num_key_value_heads head_dim rms_norm_eps rope_theta rope_parameters".split(),
    *"tie_word_embeddings attention_bias mlp_bias max_position_embeddings bos_token_id eos_token_id".split(),
    "pad_token_id",
}


class ModelLoadError(ValueError):
    """A model folder is missing, incomplete or holds an unsupported checkpoint."""


@dataclass
class ModelConfig:
    """The fields of a Hugging Face config.json this decoder uses."""

    architecture: str = "Qwen2ForCausalLM"
    vocab_size: int = 2048
    hidden_size: int = 256
    intermediate_size: int = 768
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = True
    attention_bias: bool = True  # q/k/v bias: always on for Qwen2, from config for Llama/Qwen3
    qk_norm: bool = False  # Qwen3
    mlp_bias: bool = False
    max_position_embeddings: int = 2048
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None
    extra: dict = field(default_factory=dict)  # other config.json keys, written back unchanged

    @staticmethod
    def from_hf_dict(d: dict, source: str = "config.json") -> ModelConfig:
        archs = d.get("architectures") or []
        arch = (
            archs[0]
            if archs
            else {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}.get(
                d.get("model_type", ""), ""
            )
        )
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ModelLoadError(
                f"{source}: architecture {arch or d.get('model_type')!r} is not supported "
                f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
            )
        for key in _REQUIRED_KEYS:
            if key not in d:
                raise ModelLoadError(f"{source}: missing key {key!r}")
        rope = d.get("rope_parameters") or {}
        scaling = d.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", scaling.get("rope_type", scaling.get("type", "default")))
        if rope_type not in ("default", None):
            raise ModelLoadError(f"{source}: rope_type {rope_type!r} is not supported (only 'default')")
        heads = d["num_attention_heads"]
        return ModelConfig(
            architecture=arch,
            vocab_size=d["vocab_size"],
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_hidden_layers=d["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=d.get("num_key_value_heads") or heads,
            head_dim=d.get("head_dim") or d["hidden_size"] // heads,
            rms_norm_eps=d.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope.get("rope_theta", d.get("rope_theta", 10000.0))),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            attention_bias=True if arch == "Qwen2ForCausalLM" else bool(d.get("attention_bias", False)),
            qk_norm=arch == "Qwen3ForCausalLM",
            mlp_bias=bool(d.get("mlp_bias", False)),
            max_position_embeddings=d.get("max_position_embeddings", 2048),
            bos_token_id=d.get("bos_token_id"),
            eos_token_id=d.get("eos_token_id"),
            pad_token_id=d.get("pad_token_id"),
            extra={k: v for k, v in d.items() if k not in _KNOWN_KEYS},
        )

    def to_hf_dict(self) -> dict:
        model_type = {"Qwen2ForCausalLM": "qwen2", "LlamaForCausalLM": "llama", "Qwen3ForCausalLM": "qwen3"}
        d = dict(self.extra)
        d.update(
            architectures=[self.architecture],
            model_type=model_type[self.architecture],
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            rms_norm_eps=self.rms_norm_eps,
            rope_parameters={"rope_theta": self.rope_theta, "rope_type": "default"},
            rope_theta=self.rope_theta,
            tie_word_embeddings=self.tie_word_embeddings,
            max_position_embeddings=self.max_position_embeddings,
            bos_token_id=self.bos_token_id,
            eos_token_id=self.eos_token_id,
            pad_token_id=self.pad_token_id,
            hidden_act="silu",
            torch_dtype="float32",
        )
        if self.architecture != "Qwen2ForCausalLM":
            d.update(attention_bias=self.attention_bias, mlp_bias=self.mlp_bias)
        return d

    def eos_ids(self) -> list[int]:
        e = self.eos_token_id
        return [] if e is None else ([e] if isinstance(e, int) else list(e))

    def as_dict(self) -> dict:
        return asdict(self)


class KVCache:
    """Slot KV cache.

    k, v:    ``[layers, slots, kv_heads, max_len, head_dim]``
    lengths: ``[slots]`` long, committed tokens per slot.
    """

    def __init__(self, cfg: ModelConfig, num_slots: int, max_len: int, dtype=torch.float32, device="cpu"):
        shape = (cfg.num_hidden_layers, num_slots, cfg.num_key_value_heads, max_len, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.lengths = torch.zeros(num_slots, dtype=torch.long, device=device)
        self.max_len = max_len
        self.num_slots = num_slots
        self._scratch: torch.Tensor | None = None  # ``read``'s CPU gather buffer: [2, slots * kv * len * D]

    def read(self, layer: int, rows: slice | torch.Tensor, keys: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of ``layer`` at positions ``0 .. keys - 1`` of ``rows`` (a slice of slots: a view; a ``[B]`` long
        tensor: gathered), ``[B, kv_heads, keys, head_dim]`` each. On CPU without autograd a gather fills one buffer
        that the next ``read`` overwrites: a fresh 1-10 MB copy per layer costs its page faults (8 rows of 1,000
        positions: the default policy's decode forward ~1.5x slower)."""
        k, v = self.k[layer][:, :, :keys], self.v[layer][:, :, :keys]
        if isinstance(rows, slice) or self.k.is_cuda or torch.is_grad_enabled():
            return k[rows], v[rows]
        if self._scratch is None:
            self._scratch = torch.empty(2, self.k[0].numel(), dtype=self.k.dtype)
        shape, n = (rows.numel(), *k.shape[1:]), rows.numel() * k[0].numel()
        ko, vo = self._scratch[0, :n].view(shape), self._scratch[1, :n].view(shape)
        return torch.index_select(k, 0, rows, out=ko), torch.index_select(v, 0, rows, out=vo)

    def reset(self, slots: torch.Tensor | Sequence[int]) -> None:
        self.lengths[torch.as_tensor(slots, dtype=torch.long)] = 0

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        """Make slot ``dst`` hold the first ``n`` committed tokens of slot ``src`` (K/V copied, length ``n``)."""
        if dst != src:
            self.k[:, dst, :, :n] = self.k[:, src, :, :n]
            self.v[:, dst, :, :n] = self.v[:, src, :, :n]
        self.lengths[dst] = n

    def commit(self, slots: torch.Tensor, n: torch.Tensor | int) -> None:
        """Keep the first ``n[b]`` of the tokens last written to ``slots[b]`` (the rest are rolled back)."""
        self.lengths[slots] += n

    def rollback(self, slots: torch.Tensor, n: torch.Tensor) -> None:
        """Drop the last ``n[b]`` committed tokens of ``slots[b]`` (O(1): only the lengths move)."""
        self.lengths[slots] -= n

    def keep_path(self, slot: int, src_offsets: Sequence[int]) -> None:
        """Compact a tree: move new-token cache entries at ``lengths[slot] + src_offsets[j]`` to
        ``lengths[slot] + j`` and commit ``len(src_offsets)`` tokens. ``src_offsets`` must be increasing."""
        base = int(self.lengths[slot])
        src = torch.as_tensor(src_offsets, dtype=torch.long) + base
        n = len(src_offsets)
        if n and not bool((src == torch.arange(base, base + n)).all()):
            self.k[:, slot, :, base : base + n] = self.k[:, slot, :, src]
            self.v[:, slot, :, base : base + n] = self.v[:, slot, :, src]
        self.lengths[slot] += n


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # weight * x * rsqrt(mean(x^2) + eps), the statistics in fp32 (as HF's), one fused op: on CPU five
        # separate ones cost ~20 us per call; on CUDA the casts around it were three more kernels per call
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos / signed sin ``[B, T, head_dim]`` for integer ``positions [B, T]`` (RoFormer, arXiv 2104.09864, in
    HF's rotate-half layout): ``sin``'s first half is negated, which ``_apply_rope`` relies on."""
    inv_freq = 1.0 / (
        theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim)
    )
    freqs = positions.float().unsqueeze(-1) * inv_freq
    return torch.cat((freqs, freqs), dim=-1).cos(), torch.cat((-freqs.sin(), freqs.sin()), dim=-1)


def _apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """HF's ``x * cos + rotate_half(x) * sin`` with ``rotate_half(x) = cat(-x2, x1)``: as ``sin`` (from
    ``rope_cos_sin``) carries the sign, that is ``x * cos + roll(x, D/2) * sin``, three kernels instead of five.
    x: ``[B, heads, T, D]``; cos / sin: ``[B, 1, T, D]``."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, -1), sin)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        h, d, kv = cfg.num_attention_heads, cfg.head_dim, cfg.num_key_value_heads
        self.n_heads, self.n_kv, self.head_dim = h, kv, d
        self.q_proj = nn.Linear(cfg.hidden_size, h * d, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, kv * d, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, kv * d, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(
            h * d,
            cfg.hidden_size,
            bias=False if cfg.architecture == "Qwen2ForCausalLM" else cfg.attention_bias,
        )
        if cfg.qk_norm:
            self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.qk_norm = cfg.qk_norm

    def forward(
        self,
        x,
        cos,
        sin,
        mask,
        cache: KVCache | None,
        layer: int,
        slots,
        write_pos,
        kv_read=None,
        residual=None,
    ):
        """Self-attention of ``x [B, T, hidden]``; returns ``o_proj``'s output ``[B, T, hidden]``, plus ``residual``
        (same shape) when given, added inside the product (``linear_residual``)."""
        b, t, _ = x.shape
        qkv = fused_product(self, "qkv", x)  # None: the separate products
        split = (self.n_heads + self.n_kv) * self.head_dim
        if qkv is not None and not self.qk_norm:  # rotary on q and k as one tensor: 3 kernels, not 6
            qk = _apply_rope(qkv[..., :split].view(b, t, -1, self.head_dim).transpose(1, 2), cos, sin)
            q, k = qk[:, : self.n_heads], qk[:, self.n_heads :]  # [B, H, T, D], [B, KV, T, D]
            v = qkv[..., split:].view(b, t, -1, self.head_dim).transpose(1, 2)
        else:
            d_q = self.n_heads * self.head_dim
            parts = None if qkv is None else (qkv[..., :d_q], qkv[..., d_q:split], qkv[..., split:])
            q, k, v = parts or (self.q_proj(x), self.k_proj(x), self.v_proj(x))
            q, k, v = (y.view(b, t, -1, self.head_dim) for y in (q, k, v))
            if self.qk_norm:
                q, k = self.q_norm(q), self.k_norm(k)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            q, k = _apply_rope(q, cos, sin), _apply_rope(k, cos, sin)
        return linear_residual(
            self.o_proj, self._attend(q, k, v, mask, cache, layer, slots, write_pos, kv_read), residual
        )

    def _attend(self, q, k, v, mask, cache: KVCache | None, layer: int, slots, write_pos, kv_read):
        """Attention output ``[B, T, H * D]`` of q ``[B, H, T, D]`` over k / v ``[B, KV, T, D]`` and the cache."""
        b, _, t, _ = q.shape
        if isinstance(mask, RaggedBatch):  # packed rows (ragged.py): writes K/V, each row over its own keys
            return ragged_attention(q, k, v, cache, layer, mask)
        if cache is not None:
            # write new K/V at [slot, :, lengths[slot] + t], then read the slots' prefixes (to the longest row's end)
            cache.k[layer][slots.unsqueeze(1), :, write_pos] = k.transpose(1, 2).to(cache.k.dtype)
            cache.v[layer][slots.unsqueeze(1), :, write_pos] = v.transpose(1, 2).to(cache.v.dtype)
            if isinstance(mask, attention.FlashBatch):  # attention.flash_attention_applies
                out = attention.flash_attention(q, cache.k[layer], cache.v[layer], mask)
                return out.transpose(1, 2).reshape(b, t, -1)
            if isinstance(kv_read, list):  # (slot, keys) per row: each row over its own keys (per_row_pays)
                out = per_row_attention(q, cache.k[layer], cache.v[layer], mask, kv_read)
                return out.transpose(1, 2).reshape(b, t, -1)
            kmax = mask.shape[-1]
            # consecutive slots (a full batch, or one request): read a view; else gather (a copy)
            rows = kv_read if kv_read is not None else slots
            k, v = (x.to(q.dtype) for x in cache.read(layer, rows, kmax))
            if mask.shape[2] != t:  # grouped layout (Transformer.forward): [B, 1, G*T, K]
                return grouped_attention(q, k, v, mask).transpose(1, 2).reshape(b, t, -1)
        out = sdpa(q, k, v, attn_mask=mask, is_causal=mask is None, enable_gqa=self.n_kv != self.n_heads)
        return out.transpose(1, 2).reshape(b, t, -1)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)

    def forward(self, x, residual=None):
        """SwiGLU of ``x [..., hidden]``, plus ``residual`` when given (``linear_residual``)."""
        gate, up = fused_linear(self, "gate_up", x) or (self.gate_proj(x), self.up_proj(x))
        return linear_residual(self.down_proj, F.silu(gate) * up, residual)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, mask, cache, layer, slots, write_pos, kv_read=None):
        x = self.self_attn(
            self.input_layernorm(x), cos, sin, mask, cache, layer, slots, write_pos, kv_read, residual=x
        )
        return self.mlp(self.post_attention_layernorm(x), residual=x)


class _Backbone(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


@dataclass
class ForwardOutput:
    """logits: ``[B, T, V]`` (or ``[B, 1, V]`` with ``last_only``; None with ``head=False``); hidden: layer index ->
    ``[B, T, H]``."""

    logits: torch.Tensor | None
    hidden: dict[int, torch.Tensor]


class Transformer(nn.Module):
    """Decoder-only causal LM (Qwen2 / Llama / Qwen3)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.model = _Backbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor | None = None,
        cache: KVCache | None = None,
        slots: torch.Tensor | None = None,
        attn_mask: torch.Tensor | None = None,
        hidden_layers: Sequence[int] = (),
        last_only: bool = False,
        logits_at: torch.Tensor | None = None,
        kv_len: int | None = None,
        head: bool = True,
        row_lengths: Sequence[int] | None = None,
    ) -> ForwardOutput:
        """Run the decoder.

        Args:
            input_ids: ``[B, T]`` token ids.
            positions: ``[B, T]`` rotary positions; default ``lengths[slot] + arange(T)`` with a cache, else
                ``arange(T)``.
            cache: slot KV cache; new K/V are written at ``lengths[slots[b]] + t`` (lengths unchanged).
            slots: ``[B]`` long, the cache slot of each row (required with ``cache``).
            attn_mask: ``[B, T, T]`` bool, which new tokens each new token attends to (default causal). With a
                cache, committed positions are always visible. Padding rows must attend to at least themselves.
            hidden_layers: layer indices whose output hidden states to return; index ``num_hidden_layers``
                means the final normed hidden state (what the LM head reads).
            last_only: compute logits for the last position only.
            logits_at: ``[B]`` long; compute logits only at this position of each row (``[B, 1, V]``).
            kv_len: with a cache, a fixed number of key positions (cache positions ``0 .. kv_len - 1`` of each
                slot) to attend over, masked per row; the caller guarantees ``max(lengths[slots]) + T <=
                kv_len <= max_len``. The forward then has static shapes and no host synchronization (no
                ``.item()``, no branching on tensor values), as CUDA-graph capture requires
                (``cuda_graphs.GraphedForward``). Default: ``max(lengths[slots]) + T``, checked on the host.
            head: False skips the output head (``logits`` is None; ask for the final state with
                ``hidden_layers``): ``GraphedForward`` runs it after the graph, which then holds no logits.
            row_lengths: ``[B]`` ints, the real tokens of each row (the rest is padding): on CPU with a cache,
                when ``ragged_pays``, the forward packs them (``ragged.py``); logits and hidden states at
                padding are then 0.

        Returns:
            ``ForwardOutput``. Raises ``ValueError`` when the cache would overflow.
        """
        b, t = input_ids.shape
        cfg = self.config
        # cache reads: consecutive slots (a view), None (gather by slots), or (slot, keys) per row (per_row_pays)
        write_pos = mask = kv_read = None
        # packed rows (ragged.py) read each row's keys themselves: no kv_read to choose
        ragged = (
            row_lengths is not None
            and cache is not None
            and kv_len is None
            and not (last_only or logits_at is not None or input_ids.is_cuda)
            and ragged_pays(b, t, row_lengths)
        )
        if cache is not None:
            if slots is None:
                raise ValueError("slots is required with a cache")
            base = cache.lengths[slots]  # [B]
            if kv_len is None:
                keys = [n + t for n in base.tolist()]
                kmax = max(keys)
                if kmax > cache.max_len:
                    raise ValueError(f"KV cache overflow: {kmax - t} + {t} > max_len {cache.max_len}")
                first = int(slots[0])
                if not ragged and not input_ids.is_cuda and per_row_pays(b, t, keys):
                    kv_read = list(zip(slots.tolist(), keys))
                elif not ragged and (
                    b == 1 or bool((slots == torch.arange(first, first + b, device=slots.device)).all())
                ):
                    kv_read = slice(first, first + b)
            elif t <= kv_len <= cache.max_len:
                kmax = kv_len
            else:
                raise ValueError(f"kv_len {kv_len} outside [T={t}, max_len={cache.max_len}]")
            write_pos = base.unsqueeze(1) + torch.arange(t, device=input_ids.device)  # [B, T]
            if positions is None:
                positions = write_pos
        if ragged:
            groups = cfg.num_attention_heads // cfg.num_key_value_heads
            dtype = self.lm_head.weight.dtype
            mask = RaggedBatch.of(slots, base, row_lengths, t, groups, attn_mask, dtype)
            input_ids, positions = mask.pack(input_ids), mask.pack(positions)
        elif cache is not None and attention.flash_attention_applies(self.lm_head.weight, cache.k, attn_mask):
            # each row's own keys, read in place (attention.flash_attention); the index tensors once per forward
            mask = attention.FlashBatch.of(slots, base + t, t, cfg.num_key_value_heads, cache.max_len, kmax)
        elif cache is not None:
            key_idx = torch.arange(kmax, device=input_ids.device)
            committed = key_idx.view(1, 1, kmax) < base.view(b, 1, 1)  # [B, 1, K]
            new = (
                attn_mask
                if attn_mask is not None
                else torch.ones(t, t, dtype=torch.bool, device=input_ids.device).tril().expand(b, t, t)
            )
            # scatter the [B, T, T] new-token mask into key positions base..base+T-1
            rel = key_idx.view(1, 1, kmax) - base.view(b, 1, 1)  # [B, 1, K]
            in_new = (rel >= 0) & (rel < t)
            gathered = new.gather(2, rel.clamp(0, t - 1).expand(b, t, kmax))
            mask = (committed | (in_new & gathered)).unsqueeze(1)  # [B, 1, T, K]
            groups = cfg.num_attention_heads // cfg.num_key_value_heads
            grouped = groups > 1 and (input_ids.is_cuda or b >= GROUPED_ATTENTION_MIN_BATCH)
            if isinstance(kv_read, list) or grouped:
                mask = grouped_mask(mask, groups)  # [B, 1, G*T, K], once for every layer
            mask = attention_bias(mask, self.lm_head.weight.dtype)  # once, not once per layer inside SDPA
        else:
            if positions is None:
                positions = torch.arange(t, device=input_ids.device).expand(b, t)
            if attn_mask is not None:
                mask = attn_mask.unsqueeze(1)
        x = self.model.embed_tokens(input_ids)
        cos, sin = rope_cos_sin(positions, cfg.head_dim, cfg.rope_theta)  # float32, cast as HF does
        cos, sin = cos.unsqueeze(1).to(x.dtype), sin.unsqueeze(1).to(x.dtype)
        hidden: dict[int, torch.Tensor] = {}
        want = set(hidden_layers)
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, mask, cache, i, slots, write_pos, kv_read)
            if i in want:
                hidden[i] = x
        x = self.model.norm(x)
        if cfg.num_hidden_layers in want:
            hidden[cfg.num_hidden_layers] = x
        if ragged:
            hidden = {i: mask.unpack(h, b, t) for i, h in hidden.items()}
        if not head:
            return ForwardOutput(None, hidden)
        if ragged:
            return ForwardOutput(mask.unpack(self.lm_head(x), b, t), hidden)
        if last_only:
            x = x[:, -1:]
        elif logits_at is not None:
            x = x[torch.arange(b, device=x.device), logits_at].unsqueeze(1)
        return ForwardOutput(self.lm_head(x), hidden)

    def new_cache(self, num_slots: int, max_len: int, dtype=None) -> KVCache:
        p = next(self.parameters())
        return KVCache(self.config, num_slots, max_len, dtype or p.dtype, p.device)

    # ------------------------------------------------------------------ I/O
    @staticmethod
    def from_pretrained(path: str | os.PathLike, dtype=torch.float32) -> Transformer:
        """Load a Hugging Face folder (config.json + model.safetensors). Raises ``ModelLoadError``."""
        path = os.fspath(path)
        cfg_path = os.path.join(path, "config.json")
        if not os.path.isdir(path):
            raise ModelLoadError(f"model directory {path!r} does not exist")
        if not os.path.isfile(cfg_path):
            raise ModelLoadError(f"model directory {path!r} has no config.json")
        try:
            with open(cfg_path) as f:
                cfg = ModelConfig.from_hf_dict(json.load(f), cfg_path)
        except json.JSONDecodeError as e:
            raise ModelLoadError(f"{cfg_path}: invalid JSON ({e})") from None
        weights = os.path.join(path, "model.safetensors")
        if not os.path.isfile(weights):
            raise ModelLoadError(f"model directory {path!r} has no model.safetensors")
        model = Transformer(cfg)
        state = load_file(weights)
        if cfg.tie_word_embeddings:
            state.pop("lm_head.weight", None)
        missing, unexpected = model.load_state_dict(state, strict=False)
        missing = [m for m in missing if not (cfg.tie_word_embeddings and m == "lm_head.weight")]
        if missing or unexpected:
            raise ModelLoadError(f"{weights}: missing {missing[:5]} unexpected {unexpected[:5]}")
        return model.to(dtype).eval()

    def save_pretrained(self, path: str | os.PathLike) -> None:
        """Write config.json and model.safetensors (tied weights stored once) to ``path``."""
        os.makedirs(path, exist_ok=True)
        state = {k: v.detach().cpu().clone() for k, v in self.state_dict().items()}  # own storage (fused.py)
        if self.config.tie_word_embeddings:
            state.pop("lm_head.weight", None)
        tmp = os.path.join(path, "model.safetensors.tmp")
        save_file(state, tmp, metadata={"format": "pt"})
        os.replace(tmp, os.path.join(path, "model.safetensors"))
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump(self.config.to_hf_dict(), f, indent=2)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in {id(p): p for p in self.parameters()}.values())


def fill_weights(model: Transformer, fill_normal) -> Transformer:
    """Norms one, biases zero, every other parameter ``fill_normal(p)`` (in place), without autograd."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith("bias"):
                p.zero_()
            else:
                fill_normal(p)
    return model


def init_weights(model: Transformer, seed: int = 0, std: float = 0.02) -> Transformer:
    """Normal(0, std) init of linear/embedding weights (biases zero, norms one), seeded; drawn on the host."""
    g = torch.Generator().manual_seed(seed)
    return fill_weights(model, lambda p: p.copy_(torch.randn(p.shape, generator=g) * std))


__all__ = ["ModelConfig", "KVCache", "Transformer", "ForwardOutput", "ModelLoadError"]
__all__ += ["fill_weights", "init_weights", "rope_cos_sin"]
