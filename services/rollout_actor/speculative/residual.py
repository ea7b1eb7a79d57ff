"""The residual distributions of speculative sampling's rejection step (``verify.py``'s rule).

After a draft token drawn from q is rejected, the next token is drawn from ``norm(max(0, p - q))``
(``residual``; Leviathan et al. 2023, Chen et al. 2023); after a deterministic (point-mass) draft x is rejected,
from p without x, renormalized (``point_mass_residual``). Both are computed in fp32 (fp64 for fp64 input).
"""

from __future__ import annotations

import torch

# A residual whose total mass is at most this is treated as empty (falls back to p).
_MASS_EPS = 1e-12


def work_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype residuals and acceptance tests are computed in: fp64 for fp64 input, else fp32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _normalize_or_fallback(w: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """``w / w.sum(-1)`` per row; rows whose mass is <= _MASS_EPS are replaced by ``p / p.sum(-1)``."""
    mass = w.sum(-1, keepdim=True)
    ok = mass > _MASS_EPS
    p_norm = p / p.sum(-1, keepdim=True)
    return torch.where(ok, w / torch.where(ok, mass, torch.ones_like(mass)), p_norm)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Residual distribution after rejecting a draw from q: ``norm(max(0, p - q))``.

    Args:
        p: ``[..., V]`` target probabilities.
        q: ``[..., V]`` draft probabilities (same shape as p).

    Returns:
        ``[..., V]`` probabilities summing to 1 (fp32, or fp64 for fp64 input). Rows where ``max(0, p - q)``
        has no mass (p == q; a rejection cannot happen there in exact arithmetic) fall back to ``norm(p)``.

    Raises:
        ValueError: if the shapes differ.
    """
    if p.shape != q.shape:
        raise ValueError(
            f"residual: p and q must have the same shape, got {tuple(p.shape)} and {tuple(q.shape)}"
        )
    dt = work_dtype(torch.promote_types(p.dtype, q.dtype))
    p = p.to(dt)
    return _normalize_or_fallback((p - q.to(dt)).clamp(min=0), p)


def point_mass_residual(p: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Residual after rejecting a point-mass draft at x: p with token x removed, renormalized.

    Equals ``residual(p, onehot(x) * p(x))``.

    Args:
        p: ``[..., V]`` target probabilities.
        x: ``[...]`` long token ids (the leading shape of p).

    Returns:
        ``[..., V]`` probabilities (fp32, or fp64 for fp64 input). Rows where p(x) == 1 (nothing left; a
        rejection cannot happen there) fall back to ``norm(p)``.

    Raises:
        ValueError: if x's shape is not ``p.shape[:-1]`` or a token id is outside ``[0, V)``.
    """
    if tuple(x.shape) != tuple(p.shape[:-1]):
        raise ValueError(
            f"point_mass_residual: x must have shape {tuple(p.shape[:-1])} (p's leading dims), got {tuple(x.shape)}"
        )
    if x.numel() and (int(x.min()) < 0 or int(x.max()) >= p.shape[-1]):
        raise ValueError(f"point_mass_residual: token ids must lie in [0, {p.shape[-1]})")
    p = p.to(work_dtype(p.dtype))
    w = p.scatter(-1, x.long().unsqueeze(-1), 0.0)
    return _normalize_or_fallback(w, p)
