"""Sampling: the processed target distribution and reproducible per-request draws.

Contract
--------
* ``processed_probs(logits, temperature, top_k, top_p)`` turns raw logits into the exact distribution
  plain sampling draws from: ``softmax(logits / T)`` restricted to the top-k tokens and then to the
  smallest prefix (by descending probability) whose mass reaches top-p, renormalized. Speculative
  verification (``speculative/verify.py``) uses the *same* function, which is what makes it lossless.
  ``temperature == 0`` means greedy: a one-hot distribution on the argmax (ties: lowest id).
* ``sample_from_probs(probs, u)`` draws by inverse CDF from uniforms ``u`` in [0, 1). Each request owns a
  ``torch.Generator`` seeded from its own seed, and the engine draws that request's uniforms from it, so
  a request's tokens depend only on its seed and prompt, never on which other requests share the batch.
* ``SamplingBatch`` holds a batch's parameters as device tensors and as what the host knows of them (any
  top-k, any top-p, which rows are greedy, whether all rows sample at T = 1), so that ``processed_probs``
  branches without reading the device; a batch at T = 1 without top-k or top-p (RL rollouts) takes
  ``softmax(logits)`` directly: the same values (x / 1 == x), without the general path's passes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from services.rollout_actor.requests import SamplingParams


@dataclass(frozen=True)
class SamplingBatch:
    """The sampling parameters of a batch's rows: device tensors, and host flags that spare
    ``processed_probs`` a device read (a synchronization on CUDA) per branch."""

    temperature: torch.Tensor  # [B] float32
    top_k: torch.Tensor  # [B] long
    top_p: torch.Tensor  # [B] float32
    greedy: tuple[bool, ...]  # [B] temperature == 0 (host)
    any_top_k: bool  # some row keeps fewer than the whole vocabulary by top-k
    any_top_p: bool  # some row has top_p < 1
    unit_temperature: bool = False  # every row samples at temperature 1 (host)

    @staticmethod
    def of(params: Sequence[SamplingParams], vocab_size: int, device: torch.device | str) -> SamplingBatch:
        temp = [p.temperature for p in params]
        return SamplingBatch(
            torch.tensor(temp, dtype=torch.float32, device=device),
            torch.tensor([p.top_k for p in params], dtype=torch.long, device=device),
            torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device),
            tuple(t <= 0 for t in temp),
            any(0 < p.top_k < vocab_size for p in params),
            any(p.top_p < 1.0 for p in params),
            all(t == 1.0 for t in temp),
        )

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """``processed_probs`` of ``logits [B, ..., V]`` with row b's parameters; ``[B, ..., V]`` fp32."""
        if self.unit_temperature and not (self.any_top_k or self.any_top_p):
            return torch.softmax(logits.float(), dim=-1)
        lead = (-1,) + (1,) * (logits.dim() - 2)
        shape = logits.shape[:-1]
        return processed_probs(
            logits,
            self.temperature.view(lead).expand(shape),
            self.top_k.view(lead).expand(shape),
            self.top_p.view(lead).expand(shape),
            host_flags=(self.any_top_k, self.any_top_p, any(self.greedy)),
        )


def processed_probs(
    logits: torch.Tensor,
    temperature: torch.Tensor | float,
    top_k: torch.Tensor | int = 0,
    top_p: torch.Tensor | float = 1.0,
    *,
    host_flags: tuple[bool, bool, bool] | None = None,
) -> torch.Tensor:
    """Processed sampling distribution.

    Args:
        logits: ``[..., V]`` raw logits (any float dtype; computed in fp32).
        temperature: scalar or ``[...]`` (broadcast over the leading dims); 0 means greedy.
        top_k: scalar or ``[...]``; 0 (or >= V) disables it.
        top_p: scalar or ``[...]`` in (0, 1]; 1 disables it.
        host_flags: (any row with top-k, any with top-p, any greedy) as the caller knows them; None: read
            from the tensors (a device read each). A flag that is False where a row needs it drops that
            row's processing.

    Returns:
        ``[..., V]`` fp32 probabilities summing to 1 along the last dim.
    """
    x = logits.float()
    lead = x.shape[:-1]
    vocab = x.shape[-1]

    def _bcast(v, dtype):
        t = torch.as_tensor(v, dtype=dtype, device=x.device)
        return t.expand(lead) if t.dim() == 0 else t.reshape(lead)

    temp = _bcast(temperature, torch.float32)
    k = _bcast(top_k, torch.long)
    p_top = _bcast(top_p, torch.float32)

    greedy = temp <= 0
    safe_t = torch.where(greedy, torch.ones_like(temp), temp)
    x = x / safe_t.unsqueeze(-1)

    # top-k: keep logits >= the k-th largest (ties at the boundary are all kept, like HF's TopKLogitsWarper).
    k_eff = torch.where((k <= 0) | (k >= vocab), torch.full_like(k, vocab), k)
    any_top_k, any_top_p, any_greedy = host_flags or (None, None, None)
    if any_top_k if host_flags else bool((k_eff < vocab).any()):
        sorted_desc = torch.sort(x, dim=-1, descending=True).values
        kth = sorted_desc.gather(-1, (k_eff - 1).clamp(min=0).unsqueeze(-1))
        x = torch.where(x < kth, torch.full_like(x, float("-inf")), x)

    probs = torch.softmax(x, dim=-1)

    # top-p (nucleus): keep the smallest descending prefix with mass >= top_p (always >= 1 token).
    if any_top_p if host_flags else bool((p_top < 1.0).any()):
        sp, idx = torch.sort(probs, dim=-1, descending=True, stable=True)
        cum = sp.cumsum(-1)
        drop_sorted = (cum - sp) >= p_top.unsqueeze(-1)
        drop = torch.zeros_like(drop_sorted).scatter(-1, idx, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)

    if any_greedy if host_flags else bool(greedy.any()):
        onehot = torch.zeros_like(probs).scatter(-1, logits.float().argmax(-1, keepdim=True), 1.0)
        probs = torch.where(greedy.unsqueeze(-1), onehot, probs)
    return probs


def sample_from_probs(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling.

    Args:
        probs: ``[N, V]`` non-negative weights (need not be normalized; each row must have positive mass).
        u: ``[N]`` uniforms in [0, 1).

    Returns:
        ``[N]`` long token ids; a token with zero weight is never returned.
    """
    cdf = probs.float().cumsum(-1)
    total = cdf[:, -1:]
    target = u.float().unsqueeze(-1) * total
    idx = torch.searchsorted(cdf, target, right=True).squeeze(-1)
    idx = idx.clamp(max=probs.shape[-1] - 1)
    # Guard against float round-off landing on a zero-weight tail token.
    bad = probs.gather(-1, idx.unsqueeze(-1)).squeeze(-1) <= 0
    if bool(bad.any()):
        last_pos = (probs > 0).float().cumsum(-1).argmax(-1)
        idx = torch.where(bad, last_pos, idx)
    return idx


def logprobs(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """``log_softmax(logits / T)`` in fp32, ``T = 1`` for greedy rows (``temperature <= 0``): the logprobs the
    engine reports. logits ``[B, ..., V]``, temperature ``[B]``; returns ``[B, ..., V]``."""
    t = torch.where(temperature > 0, temperature, torch.ones_like(temperature))
    return torch.log_softmax(logits.float() / t.view(-1, *([1] * (logits.dim() - 1))), dim=-1)


def draw_uniforms(generators: list[torch.Generator], n: int) -> torch.Tensor:
    """``[len(generators), n]`` uniforms, row i drawn from ``generators[i]`` (per-request reproducibility)."""
    if not generators:
        return torch.empty(0, n)
    return torch.stack([torch.rand(n, generator=g) for g in generators])
