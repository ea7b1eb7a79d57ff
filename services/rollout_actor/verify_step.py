"""The verify step's inputs and bookkeeping: a batch of drafts laid out for one target forward.

``build_verify_batch`` lays out B running requests' drafts (chains or trees) as one ``[B, N + 1]`` input:
row 0 of request b is its root (the last sampled token, not yet in the KV cache), rows 1..len(draft) its draft
nodes in tree order, the rest padding (token 0, causal). Trees get per-row rotary positions (a node's depth)
and an ancestor attention mask; chains and padding need neither (causal order is their tree order).
``fit_drafts`` cuts drafts so that no row writes past its KV-cache slot; ``record_spec`` counts a verified
draft in a request's ``SpecCounters``; ``chain_accepted`` says what a draft's first-child chain had accepted
(the tuner's counterfactual records); ``committed_rows``, ``committed_logprobs`` and ``committed_hidden`` pick
the committed positions' input rows, logprobs and hidden states.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from services.rollout_actor.requests import RunningRequest, SpecCounters
from services.rollout_actor.sampling import SamplingBatch, logprobs
from services.rollout_actor.speculative.base import Drafter, DraftRequest, DraftTree
from services.rollout_actor.speculative.strategy import Strategy


@dataclass
class VerifyBatch:
    """One verify forward's inputs: B running requests (slot order), N = the longest draft (0: a plain step).

    Input row 0 of request b is its root (last sampled token, not yet in the KV cache), rows 1..len(draft) its
    draft nodes, the rest padding (token 0, causal)."""

    rows: list[RunningRequest]  # [B]
    strategies: list[Strategy]  # [B]
    drafts: list[DraftTree]  # [B], each with <= N nodes
    n: int  # N
    slots: torch.Tensor  # [B] long (device): each request's KV-cache slot
    base: torch.Tensor  # [B] long (device): committed cache length of each slot
    id_rows: list[list[int]]  # [B][N+1] input token ids
    depths: list[list[int]]  # [B][N+1] output-position offset of each input row (root 0, node = its depth)
    positions: torch.Tensor | None  # [B, N+1] rotary positions (trees only; None: base + arange)
    mask: torch.Tensor | None  # [B, N+1, N+1] bool attention among the new tokens (trees only; None: causal)
    sampling: SamplingBatch  # [B] temperature, top-k, top-p


def truncated(d: DraftTree, k: int) -> DraftTree:
    """The first ``k`` nodes of a draft (a tree again: parents precede their children)."""
    probs = d.probs[:k] if d.probs is not None else None
    return DraftTree(d.tokens[:k], d.parents[:k], probs, d.iid_siblings, d.score)


def fit_drafts(drafts: list[DraftTree], base: torch.Tensor, max_len: int) -> list[DraftTree]:
    """Cut drafts so that every row's N + 1 written positions fit its slot of ``max_len`` positions (``base
    [B]``: committed lengths). A tree cut to its first k nodes is still a tree."""
    longest = max((len(d) for d in drafts), default=0)
    if not longest:
        return drafts
    room = max_len - int(base.max()) - 1
    if longest <= room:
        return drafts
    room = max(0, room)
    return [d if len(d) <= room else truncated(d, room) for d in drafts]


def build_verify_batch(
    rows: list[RunningRequest],
    strategies: list[Strategy],
    drafts: list[DraftTree],
    slots: torch.Tensor,
    base: torch.Tensor,
    sampling: SamplingBatch,
) -> VerifyBatch:
    """The verify forward's inputs (module docstring) for drafts that already fit (``fit_drafts``).

    Raises:
        ValueError: a sampled draft (``probs`` set) for a trace-replay request.
    """
    n = max((len(d) for d in drafts), default=0)
    for r, d in zip(rows, drafts):
        if d.probs is not None and r.req.reference is not None:
            raise ValueError(
                f"request {r.req.request_id!r}: trace replay takes deterministic drafts only; a sampled "
                "draft's acceptance depends on the target distribution, which replay replaces"
            )
    id_rows = [[r.root, *d.tokens] + [0] * (n - len(d)) for r, d in zip(rows, drafts)]
    depth_rows = [[0, *d.depths()] + list(range(len(d) + 1, n + 1)) for d in drafts]
    pos = mask = None
    if any(len(d) > 1 and not d.is_chain() for d in drafts):
        mask_rows = []
        for d in drafts:
            m = [[c == 0 or c == j for c in range(n + 1)] for j in range(n + 1)]
            for j, par in enumerate(d.parents):
                m[j + 1] = [x or y for x, y in zip(m[j + 1], m[par + 1])]
            for j in range(len(d) + 1, n + 1):  # padding: causal, like a chain
                m[j] = [c <= j for c in range(n + 1)]
            mask_rows.append(m)
        dev = slots.device
        pos = base.unsqueeze(1) + torch.tensor(depth_rows, device=dev)
        mask = torch.tensor(mask_rows, device=dev)
    return VerifyBatch(rows, strategies, drafts, n, slots, base, id_rows, depth_rows, pos, mask, sampling)


def committed_hidden(
    hs: list[torch.Tensor], rows_idx: list[list[int]], sink_rows: list[int]
) -> tuple[tuple[torch.Tensor, ...], dict[int, torch.Tensor]]:
    """Hidden states after a verify forward, from ``hs`` (one ``[B, N+1, H]`` per kept layer, k layers) and each
    row's committed input rows ``rows_idx[b]`` (root first). Returns each row's state after its last committed
    token (what the learned drafter reads next; ``[H]`` for one layer, else ``[k, H]``), and for each row of
    ``sink_rows`` the states of all its committed positions, ``[len(rows_idx[b]), k, H]``, gathered in one
    indexing op (fresh tensors)."""
    dev = hs[0].device
    at = (torch.arange(len(rows_idx), device=dev), torch.tensor([ri[-1] for ri in rows_idx], device=dev))
    picked = [h[at] for h in hs]
    last = (picked[0] if len(picked) == 1 else torch.stack(picked, 1)).unbind(0)
    if not sink_rows:
        return last, {}
    b = torch.tensor([i for i in sink_rows for _ in rows_idx[i]], device=dev)
    p = torch.tensor([x for i in sink_rows for x in rows_idx[i]], device=dev)
    parts = torch.stack([h[b, p] for h in hs], 1).split([len(rows_idx[i]) for i in sink_rows])
    return last, dict(zip(sink_rows, parts))


def committed_rows(
    batch: VerifyBatch, nxt: list[int], paths: list[list[int]]
) -> tuple[list[list[int]], list[list[int]]]:
    """Per row of a verified batch: the input rows that predicted each committed token (the root, then the
    accepted nodes) and the committed tokens (the accepted nodes', then the next token ``nxt[b]``)."""
    rows_idx = [[0] + [p + 1 for p in path] for path in paths]
    toks = [[d.tokens[p] for p in path] + [nxt[i]] for i, (d, path) in enumerate(zip(batch.drafts, paths))]
    return rows_idx, toks


def committed_logprobs(
    batch: VerifyBatch, logits: torch.Tensor, rows_idx: list[list[int]], toks: list[list[int]]
) -> list[list[float]]:
    """The logprob (``sampling.logprobs``) of each token ``toks[b]`` a verified row commits, from ``logits [B,
    N+1, V]`` at the input rows ``rows_idx[b]`` that predicted them (``committed_rows``). One device read."""
    dev = logits.device
    flat_b = torch.tensor([i for i, ri in enumerate(rows_idx) for _ in ri], device=dev)
    flat_r = torch.tensor([x for ri in rows_idx for x in ri], device=dev)
    flat_t = torch.tensor([x for t in toks for x in t], device=dev)
    lp = logprobs(logits[flat_b, flat_r], batch.sampling.temperature[flat_b]).gather(-1, flat_t.unsqueeze(-1))
    flat = lp.squeeze(-1).tolist()
    out, off = [], 0
    for t in toks:
        out.append(flat[off : off + len(t)])
        off += len(t)
    return out


def chain_accepted(d: DraftTree, path: list[int]) -> int:
    """How many nodes of ``d``'s first-child chain (from the root, each node's first child: the chain of its
    most likely tokens) the accepted nodes ``path`` (root to leaf) hold: a chain's accepted count; for a tree,
    what that chain alone would have had accepted."""
    if not path or d.is_chain():
        return len(path)
    first: dict[int, int] = {}
    for i, p in enumerate(d.parents):
        first.setdefault(p, i)
    node = n = -1
    for n, x in enumerate(path):
        if first.get(node) != x:
            return n
        node = x
    return n + 1


def record_spec(sp: SpecCounters, d: DraftTree, drafter: str, accepted: int) -> None:
    """Count a verified draft ``d`` of ``drafter`` with ``accepted`` accepted nodes in ``sp``."""
    if not len(d):
        return
    sp.drafted += len(d)
    sp.accepted += accepted
    sp.verify_steps += 1
    depth = max(d.depths())
    while len(sp.drafted_by_position) < depth:
        sp.drafted_by_position.append(0)
        sp.accepted_by_position.append(0)
    for k in range(depth):
        sp.drafted_by_position[k] += 1
    for k in range(accepted):
        sp.accepted_by_position[k] += 1
    c = sp.drafter_counts.setdefault(drafter, [0, 0])
    c[0] += len(d)
    c[1] += accepted
    t = sp.tau_counts.setdefault(drafter, {})
    t[accepted + 1] = t.get(accepted + 1, 0) + 1


def propose_drafts(
    drafters: dict[str, Drafter],
    rows: list[RunningRequest],
    dreqs: list[DraftRequest],
    strategies: list[Strategy],
    cache_lengths: torch.Tensor,
    max_seq_len: int,
) -> list[DraftTree]:
    """One draft per row (empty for ``off``): each strategy's drafter proposes for its rows at once, each row's
    budget its strategy's ``max_draft_tokens`` capped by its room (``max_new_tokens`` and ``max_seq_len``;
    ``cache_lengths [slots]``: committed KV lengths). Raises ``ValueError`` for a drafter the engine lacks."""
    drafts: list[DraftTree] = [DraftTree() for _ in rows]
    groups: dict[tuple, list[int]] = {}
    lengths: list[int] = []  # committed cache lengths, read from the device once
    for i, s in enumerate(strategies):
        if not s.is_off:
            groups.setdefault((s.drafter, s.tree_width, s.tree_depth), []).append(i)
    for (name, width, depth), idx in groups.items():
        drafter = drafters.get(name)
        if drafter is None:
            raise ValueError(f"strategy names drafter {name!r}, but the engine has {sorted(drafters)}")
        budgets = []
        lengths = lengths or cache_lengths.tolist()
        for i in idx:
            r = rows[i]
            room = min(
                r.req.params.max_new_tokens - len(r.tokens) - 1,
                max_seq_len - lengths[r.slot] - 2,
            )
            budgets.append(max(0, min(strategies[i].max_draft_tokens, room)))
        for i, tree in zip(idx, drafter.propose([dreqs[i] for i in idx], budgets, width, depth)):
            drafts[i] = tree
    return drafts
