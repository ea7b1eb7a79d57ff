"""Packed GRPO micro-batches: each response token trained once, no padding, each group's prompt once.

The G responses of a GRPO group share one prompt (DeepSeekMath, Shao et al. 2024, arXiv 2402.03300,
Sec. 4.1). A right-padded batch of ``prompt + response`` rows computes the prompt G times and every
padding position up to the longest row; this module lays a micro-batch out as one flat token stream
instead:

``[prompt_1, block_1_1, ..., block_1_G, prompt_2, block_2_1, ...]``

where ``block_i_j`` holds the inputs of response j of group i (``response[:-1]``, rotary positions
``P_i .. P_i + R_ij - 2``, continuing its prompt's ``0 .. P_i - 1``). Linear layers, norms, the MLP and
the embedding run on the ``N`` packed tokens; attention runs per segment (``varlen`` style): the prompt
causally over itself, each response block over its prompt's keys plus its own causal prefix, so every
position attends to exactly the keys it attends to in its own padded row. The LM head runs only at the
``M`` positions that predict a response token: the prompt's last position (once per response: its
target is that response's first token) and the block positions.

The per-token log-probs therefore equal those of the padded forward over ``prompt + response`` up to
float round-off; ``tests/policy_trainer/test_packing.py`` checks the loss and its gradients against the
padded computation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from services.rollout_actor.attention import sdpa
from services.rollout_actor.model import Attention, Transformer, _apply_rope, rope_cos_sin

__all__ = ["PackedBatch", "pack_samples", "packed_logits", "PackedPolicy"]


@dataclass
class PackedBatch:
    """One packed micro-batch (see the module docstring for the layout).

    Attributes:
        input_ids: ``[N]`` long, the packed input tokens.
        positions: ``[N]`` long, their rotary positions (each segment restarts at 0).
        segments: per prompt segment ``(prompt_start, prompt_len, ((block_start, block_len), ...))``,
            python ints; blocks may be empty (a one-token response is predicted by its prompt's last
            position alone).
        logit_index: ``[M]`` long, the packed position whose output predicts target ``m``.
        targets: ``[M]`` long, the response tokens, in sample order.
        advantages: ``[M]`` float32, the advantage of the sample each target belongs to.
        sample_index: ``[M]`` long, the index (into the ``samples`` given to ``pack_samples``) of that
            sample.
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    segments: tuple[tuple[int, int, tuple[tuple[int, int], ...]], ...]
    logit_index: torch.Tensor
    targets: torch.Tensor
    advantages: torch.Tensor
    sample_index: torch.Tensor

    @property
    def num_tokens(self) -> int:
        """``M``: the response tokens this micro-batch trains."""
        return int(self.targets.numel())


def pack_samples(
    samples: Sequence, micro_batch_size: int, device: torch.device | str = "cpu"
) -> list[PackedBatch]:
    """Pack rollouts into micro-batches of at most ``micro_batch_size`` responses.

    Responses with identical ``prompt_ids`` share one prompt segment (in order of first appearance); a
    group with more than ``micro_batch_size`` responses is split into segments that each repeat the
    prompt. A sample with an empty prompt trains on ``response[1:]`` (nothing predicts its first token,
    as in the padded layout); samples left with no target are skipped.

    Args:
        samples: objects with ``prompt_ids`` (list of int), ``response_ids`` (list of int) and
            ``advantage`` (float), e.g. ``RolloutSample``.
        micro_batch_size: responses per micro-batch (>= 1).
        device: where the tensors are placed.
    Returns:
        the micro-batches; empty when no sample has a response token to train on.
    """
    mb = max(1, int(micro_batch_size))
    groups: dict[tuple[int, ...], list[tuple[int, list[int], float]]] = {}
    for i, s in enumerate(samples):
        prompt, response = list(s.prompt_ids), list(s.response_ids)
        if not prompt:
            prompt, response = response[:1], response[1:]
        if not response:
            continue
        groups.setdefault(tuple(prompt), []).append((i, response, float(s.advantage)))
    batches: list[list[tuple[tuple[int, ...], list]]] = [[]]
    count = 0
    for prompt, members in groups.items():
        for c in range(0, len(members), mb):
            chunk = members[c : c + mb]
            if count + len(chunk) > mb and batches[-1]:
                batches.append([])
                count = 0
            batches[-1].append((prompt, chunk))
            count += len(chunk)
    return [_build(segs, device) for segs in batches if segs]


def _build(segs, device) -> PackedBatch:
    ids: list[int] = []
    pos: list[int] = []
    logit_index: list[int] = []
    targets: list[int] = []
    adv: list[float] = []
    sample: list[int] = []
    segments = []
    for prompt, chunk in segs:
        ps, p = len(ids), len(prompt)
        ids.extend(prompt)
        pos.extend(range(p))
        blocks = []
        for i, response, a in chunk:
            r, bs = len(response), len(ids)
            ids.extend(response[:-1])
            pos.extend(range(p, p + r - 1))
            logit_index.append(ps + p - 1)
            logit_index.extend(range(bs, bs + r - 1))
            targets.extend(response)
            adv.extend([a] * r)
            sample.extend([i] * r)
            blocks.append((bs, r - 1))
        segments.append((ps, p, tuple(blocks)))

    def t(x, dtype=torch.long):
        return torch.tensor(x, dtype=dtype, device=device)

    return PackedBatch(
        input_ids=t(ids),
        positions=t(pos),
        segments=tuple(segments),
        logit_index=t(logit_index),
        targets=t(targets),
        advantages=t(adv, torch.float32),
        sample_index=t(sample),
    )


def _prefix_causal_mask(p: int, n: int, device) -> torch.Tensor:
    """``[n, p + n]`` bool: query i of a block sees the ``p`` prompt keys and block keys ``0 .. i``."""
    return torch.arange(p + n, device=device).unsqueeze(0) <= torch.arange(p, p + n, device=device).unsqueeze(
        1
    )


def _packed_attention(attn: Attention, h, cos, sin, segments, masks) -> torch.Tensor:
    n = h.shape[0]
    q = attn.q_proj(h).view(1, n, attn.n_heads, attn.head_dim)
    k = attn.k_proj(h).view(1, n, attn.n_kv, attn.head_dim)
    v = attn.v_proj(h).view(1, n, attn.n_kv, attn.head_dim)
    if attn.qk_norm:
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [1, heads, N, D]
    q, k = _apply_rope(q, cos, sin), _apply_rope(k, cos, sin)
    gqa = attn.n_kv != attn.n_heads
    # split, not slice: a slice's backward writes a zero-filled [1, heads, N, D] gradient per slice (quadratic
    # in the number of segments), split's backward concatenates the pieces' gradients once
    sizes = [n for _, p, blocks in segments for n in (p, *(bn for _, bn in blocks))]
    qs, ks, vs = q.split(sizes, dim=2), k.split(sizes, dim=2), v.split(sizes, dim=2)
    outs = []
    i = 0
    for _, p, blocks in segments:
        kp, vp = ks[i], vs[i]
        outs.append(sdpa(qs[i], kp, vp, is_causal=True, enable_gqa=gqa))
        i += 1
        for _, bn in blocks:
            j, i = i, i + 1
            if bn == 0:
                continue
            kk, vv = torch.cat((kp, ks[j]), dim=2), torch.cat((vp, vs[j]), dim=2)
            mask = masks.get((p, bn))
            if mask is None:
                mask = masks[(p, bn)] = _prefix_causal_mask(p, bn, h.device)
            outs.append(sdpa(qs[j], kk, vv, attn_mask=mask, enable_gqa=gqa))
    out = torch.cat(outs, dim=2) if len(outs) > 1 else outs[0]  # [1, heads, N, D], packed order
    return attn.o_proj(out.transpose(1, 2).reshape(n, -1))


def packed_logits(model: Transformer, batch: PackedBatch) -> torch.Tensor:
    """The policy's logits at the packed batch's target positions.

    Same decoder as ``Transformer.forward`` (RMSNorm, rotary, grouped-query attention, SwiGLU), run on
    the packed stream with per-segment attention; row ``m`` equals the padded forward's logits at the
    position that predicts ``batch.targets[m]`` (up to float round-off). Differentiable.

    Args:
        model: the policy (its modules are called directly; the weights are not copied).
        batch: from ``pack_samples``, on the model's device.
    Returns:
        ``[M, V]`` logits in the model's dtype.
    """
    cfg = model.config
    x = model.model.embed_tokens(batch.input_ids)  # [N, H]
    cos, sin = rope_cos_sin(batch.positions.unsqueeze(0), cfg.head_dim, cfg.rope_theta)
    cos, sin = cos.unsqueeze(1).to(x.dtype), sin.unsqueeze(1).to(x.dtype)  # [1, 1, N, D]
    masks: dict[tuple[int, int], torch.Tensor] = {}
    for layer in model.model.layers:
        x = x + _packed_attention(layer.self_attn, layer.input_layernorm(x), cos, sin, batch.segments, masks)
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    x = model.model.norm(x)
    return model.lm_head(x[batch.logit_index])


class PackedPolicy(nn.Module):
    """``forward(batch) = packed_logits(policy, batch)``: a module (sharing the policy's parameters) that
    an engine wrapping ``forward`` (DeepSpeed) can drive."""

    def __init__(self, policy: Transformer):
        super().__init__()
        self.policy = policy

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        return packed_logits(self.policy, batch)
