"""GRPO as pure tensor functions: group-normalized advantages, token log-probs, the clipped loss.

Sources:

- GRPO (Group Relative Policy Optimization): Shao et al. 2024, "DeepSeekMath: Pushing the Limits of
  Mathematical Reasoning in Open Language Models", arXiv 2402.03300, Sec. 4.1. Outcome supervision: every
  token of response i gets the advantage ``A_i = (r_i - mean(r)) / std(r)`` over the G responses of its
  group; the objective is PPO's clipped surrogate (Schulman et al. 2017, arXiv 1707.06347) with a KL
  penalty to the reference policy.
- KL estimator "k3": Schulman 2020, "Approximating KL divergence" (http://joschu.net/blog/kl-approx.html):
  with ``log_ratio = log pi_ref(o_t) - log pi_theta(o_t)``, ``k3 = exp(log_ratio) - log_ratio - 1``, an
  unbiased, always non-negative estimate of ``KL(pi_theta || pi_ref)`` on samples from ``pi_theta``
  (DeepSeekMath eq. 4 uses exactly this form).
- Token-mean aggregation: DAPO, Yu et al. 2025, arXiv 2503.14476, Sec. 3.3 ("token-level policy gradient
  loss"): the loss is averaged over all response tokens of the batch, not per sequence first, so long
  responses weigh in proportion to their length.
"""

from __future__ import annotations

import torch

__all__ = ["group_advantages", "token_logprobs", "grpo_loss"]


def group_advantages(rewards: torch.Tensor, eps: float = 1e-6, scale_by_std: bool = True) -> torch.Tensor:
    """Group-normalized advantages (DeepSeekMath, arXiv 2402.03300, Sec. 4.1.2, outcome supervision).

    ``A[g, i] = (r[g, i] - mean_i r[g, :]) / (std_i r[g, :] + eps)``

    The std is the **population** std (``unbiased=False``, divide by G): rewards ``[1, 0, 0, 1]`` give
    mean 0.5, std 0.5 and advantages ``±1 / (1 + 2 eps)`` ~ ``±1``. (TRL uses the unbiased std, which
    differs by the constant factor ``sqrt((G-1)/G)``; Adam is nearly invariant to that scale.)

    With ``scale_by_std=False`` the advantage is just ``r - mean`` (Dr. GRPO, arXiv 2503.20783). A group
    whose rewards are all equal carries no signal and gets exact zeros (no ``0 / eps`` round-off blow-up).

    Args:
        rewards: ``[num_groups, G]`` float.
    Returns:
        ``[num_groups, G]`` float32 (or the input's floating dtype).
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [num_groups, G], got shape {tuple(rewards.shape)}")
    r = rewards if rewards.is_floating_point() else rewards.float()
    centered = r - r.mean(dim=1, keepdim=True)
    adv = centered / (r.std(dim=1, unbiased=False, keepdim=True) + eps) if scale_by_std else centered
    constant = r.max(dim=1, keepdim=True).values == r.min(dim=1, keepdim=True).values
    return torch.where(constant, torch.zeros_like(adv), adv)


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, chunk_rows: int = 8) -> torch.Tensor:
    """``log softmax(logits)[n, t, targets[n, t]]`` without materializing the ``[N, T, V]`` log-softmax.

    Computed as ``logits[target] - logsumexp(logits)`` in float32, ``chunk_rows`` sequences at a time, so
    the extra memory is one float32 ``[chunk_rows, T, V]`` temporary (relevant for bf16 logits and large
    vocabularies). Differentiable.

    Args:
        logits: ``[N, T, V]``.
        targets: ``[N, T]`` long, token ids in ``[0, V)``.
    Returns:
        ``[N, T]`` float32 log-probabilities.
    """
    if logits.shape[:2] != targets.shape:
        raise ValueError(
            f"logits {tuple(logits.shape)} and targets {tuple(targets.shape)} disagree on [N, T]"
        )
    out = []
    for s in range(0, logits.shape[0], max(1, chunk_rows)):
        lg = logits[s : s + chunk_rows].float()
        tg = targets[s : s + chunk_rows].unsqueeze(-1)
        out.append(lg.gather(-1, tg).squeeze(-1) - torch.logsumexp(lg, dim=-1))
    return torch.cat(out, dim=0) if len(out) != 1 else out[0]


def grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    num_tokens: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GRPO's clipped surrogate with a k3 KL penalty, token-mean over the batch.

    Per response token t of sequence n (DeepSeekMath eq. 3, signs flipped to a loss):

    ``ratio = exp(logprobs - old_logprobs)``

    ``pg = -min(ratio * A_n, clip(ratio, 1 - clip_eps, 1 + clip_eps) * A_n)``

    ``k3 = exp(ref - logprobs) - (ref - logprobs) - 1``  (Schulman 2020; ``0`` without ``ref_logprobs``)

    ``loss = sum_{n,t} mask * (pg + kl_coef * k3) / num_tokens``  (DAPO token-mean)

    Args:
        logprobs: ``[N, T]`` log pi_theta of the sampled tokens (with grad).
        old_logprobs: ``[N, T]`` log pi_old (the policy that generated the rollouts; no grad needed).
        advantages: ``[N]`` one advantage per sequence, shared by all its tokens.
        mask: ``[N, T]`` bool or float, nonzero on the response tokens that count (prompt and padding are 0;
            the values at masked-out positions of the other inputs are ignored, even if inf/NaN).
        clip_eps: PPO clip range.
        ref_logprobs: ``[N, T]`` log pi_ref, required when ``kl_coef > 0``.
        kl_coef: weight of the k3 term.
        num_tokens: the denominator; default ``mask.sum()`` of this call. Gradient accumulation over
            micro-batches passes the masked-token count of the whole pass, so that the summed micro-batch
            losses equal the token-mean over all tokens of the pass.

    Returns:
        ``(loss, stats)``: ``loss`` a scalar tensor; ``stats`` python floats, all masked means over this
        call's tokens except ``loss`` (the returned value): ``loss``, ``clip_fraction`` (share of tokens
        where the clipped term is the active one, i.e. the gradient is zero: ``ratio > 1 + eps`` with
        ``A > 0`` or ``ratio < 1 - eps`` with ``A < 0``), ``kl_mean`` (mean k3; 0 without a reference),
        ``ratio_mean``, ``tokens`` (masked tokens of this call).
    """
    if kl_coef > 0 and ref_logprobs is None:
        raise ValueError("kl_coef > 0 needs ref_logprobs")
    if logprobs.shape != old_logprobs.shape or logprobs.shape != mask.shape:
        raise ValueError(
            f"shape mismatch: logprobs {tuple(logprobs.shape)}, old {tuple(old_logprobs.shape)}, "
            f"mask {tuple(mask.shape)}"
        )
    if advantages.shape != logprobs.shape[:1]:
        raise ValueError(f"advantages must be [N]={logprobs.shape[0]}, got {tuple(advantages.shape)}")
    keep = mask.bool()
    m = keep.to(logprobs.dtype)
    adv = advantages.to(logprobs.dtype).unsqueeze(1)  # [N, 1]
    # Masked positions get log-ratio 0 *before* exp, so whatever they hold (padding, -inf) can neither leak
    # into the loss nor turn gradients into NaN (0 * inf).
    ratio = torch.exp(torch.where(keep, logprobs - old_logprobs.detach(), 0.0))
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
    per_token = torch.maximum(-ratio * adv, -clipped * adv)  # = -min(ratio A, clip(ratio) A)
    if ref_logprobs is not None:
        log_r = torch.where(keep, ref_logprobs.detach() - logprobs, 0.0)
        k3 = torch.exp(log_r) - log_r - 1.0
        if kl_coef > 0:
            per_token = per_token + kl_coef * k3
    else:
        k3 = None
    count = m.sum()
    denom = torch.as_tensor(num_tokens, dtype=logprobs.dtype) if num_tokens is not None else count
    loss = (per_token * m).sum() / denom.clamp_min(1.0)
    with torch.no_grad():
        n = count.clamp_min(1.0)
        is_clipped = ((ratio > 1.0 + clip_eps) & (adv > 0)) | ((ratio < 1.0 - clip_eps) & (adv < 0))
        stats = {
            "loss": float(loss.detach()),
            "clip_fraction": float((is_clipped.to(m.dtype) * m).sum() / n),
            "kl_mean": float((k3 * m).sum() / n) if k3 is not None else 0.0,
            "ratio_mean": float((ratio * m).sum() / n),
            "tokens": float(count),
        }
    return loss, stats
