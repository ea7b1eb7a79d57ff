"""Lossless acceptance of draft chains and trees (speculative sampling), batched over requests.

Contract
--------
Given the target's *processed* distribution p (``sampling.processed_probs``: temperature, top-k, top-p exactly
as plain sampling uses them) at the root and after every draft node, ``verify_tree`` decides which draft nodes
to accept and draws one more token, such that the emitted tokens
``[tree.tokens[i] for i in accepted_nodes[b]] + [next_token[b]]`` have *exactly* the distribution of plain
sampling from p, token after token (marginalizing over the draft's own randomness for sampled drafts).
The acceptance length of the step (tau) is ``num_accepted + 1``.

The rule, per request, starting at the root with ``p = target_probs[b, 0]``:

* Try the children of the current node in their tree order (siblings appear in try order in ``DraftTree``).
  For a child with token x:

  - **sampled node** (``tree.probs`` set, q = ``tree.probs[i]`` = the draft distribution x was drawn from):
    accept with probability ``min(1, p(x) / q(x))``; on rejection ``p <- norm(max(0, p - q))`` (``residual``).
    This is Leviathan et al. 2023 / Chen et al. 2023 for a chain, and SpecInfer's multi-candidate rule
    (Miao et al. 2023) for i.i.d. siblings. It is lossless only when the siblings were drawn i.i.d. from q
    (``tree.iid_siblings=True``) - e.g. not when drawn without replacement or deduplicated. So when
    ``probs`` is set but ``iid_siblings`` is False, nodes that *have siblings* use the point-mass rule below
    (which is lossless for any fixed set of candidates); only-children still use the q rule.
    If ``q(x) == 0`` (impossible for a token really drawn from q; it signals an inconsistent drafter) the
    ratio is taken as 0: the node is never accepted and p is left unchanged (a test that always rejects
    carries no information, so this keeps the output distribution exact).
  - **point-mass node** (``tree.probs is None``: suffix tree, n-gram, greedy heads; or the fallback above):
    q is a point mass at x: accept with probability p(x); on rejection ``p <- p`` with x removed and
    renormalized (``point_mass_residual``).

  On acceptance move to that child with ``p = target_probs[b, 1 + child]`` (a fresh target row) and repeat.
* When the current node has no (more) children to try, draw ``next_token`` from the current p: that is the
  bonus token if the last step was an acceptance of a leaf (or the root has no children), and the correction
  token from the residual otherwise.
* p(x) = 0 is never accepted (top-k/top-p-truncated targets included); a residual with zero mass (p == q, or
  p(x) == 1 for a point mass; impossible on a rejection in exact arithmetic) falls back to p.
* **Greedy** requests (``greedy[b]``): accept a child iff its token is ``argmax p`` of the current node's
  target row (ties -> lowest id), siblings tried in order; ``next_token = argmax p``. No uniforms are used.

Coupled form of the point-mass rule (``coupled=True``; what the engine uses)
-----------------------------------------------------------------------------
For a request whose draft is all point masses (``tree.probs is None``), draw ``y`` from the current node's
target row by inverse CDF with the uniform of that *depth* (``uniforms[b, d]``, d = 0 at the root); if a child
of the current node has token y, accept it and go on one level deeper; otherwise y is the next token and the
step ends. This is the rule above, only computed differently: a child x_j is accepted with probability
p(x_j) (for siblings tried in order, (1 - sum of earlier siblings) * p(x_j) / (1 - sum of earlier siblings));
after rejecting every child the next token is distributed as p without those children, renormalized, which
is the point-mass residual applied sibling by sibling. So every emitted token is exactly a draw from p at its
position. What coupling adds: the token at output position t is a function of the target row there and of
``u_t`` only, whatever was drafted. With uniforms keyed by output position (the engine's per-request buffer),
speculative decoding with any deterministic drafter emits the *same tokens* as plain sampling with the same
seed, up to float round-off between a batched verify forward and a one-token decode (a flip needs ``u_t``
within ~1e-6 of a CDF boundary). That makes lossless a per-token identity one can check, and makes makespans
of different drafters comparable on identical work. Requests with sampled drafts (``probs`` set) keep the
sequential rule above, with their row of ``uniforms`` as the sequential rule reads it.

*Forced tokens* (``forced [B, M]`` long, -1: none; trace replay): the token drawn at depth d of request b is
replaced by ``forced[b, d]`` when that is >= 0, after the draw (a forced step costs what a sampled one does).
The step then emits the forced tokens: a draft node is accepted iff it is the forced token of its depth, and
the next token is the forced one of the first depth without such a child. Point-mass drafts only.

Uniforms (reproducibility)
--------------------------
Request b consumes its own row ``uniforms[b]`` in a fixed order: ``uniforms[b, j]`` decides its j-th accept
test (j = 0, 1, ...), and ``uniforms[b, t]`` draws the final token, t = the number of tests made (so a
request never needs more than ``len(drafts[b]) + 1`` uniforms). Its outcome depends only on its own row of
every input, never on the batch it shares or on padding. To keep a request's random stream independent of
the batch, the engine should draw a per-request count (e.g. ``len(drafts[b]) + 1``, or a fixed maximum) from
the request's own generator, not a batch-dependent count.

Shapes
------
``target_probs [B, N+1, V]`` (row 0 at the root = after the last committed token, row 1+i after draft node
i), ``uniforms [B, M]`` with ``M >= max_b len(drafts[b]) + 1``, ``greedy [B]`` bool. Rows beyond a request's
draft length are padding and ignored. ``verify_chain`` is the vectorized special case for chains (the hot
path); ``verify_tree`` uses it automatically when every draft is a chain.

References: Leviathan, Kalman, Matias, "Fast Inference from Transformers via Speculative Decoding" (ICML
2023); Chen et al., "Accelerating Large Language Model Decoding with Speculative Sampling" (2023); Miao et al.,
"SpecInfer: Accelerating Generative LLM Serving with Tree-based Speculative Inference and Verification"
(ASPLOS 2024).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from services.rollout_actor.sampling import sample_from_probs
from services.rollout_actor.speculative.base import DraftTree
from services.rollout_actor.speculative.residual import point_mass_residual, residual, work_dtype

__all__ = ["VerifyResult", "point_mass_residual", "residual", "verify_chain", "verify_tree"]


@dataclass
class VerifyResult:
    """Outcome of one verification step for a batch of B requests.

    accepted_nodes: per request, indices of the accepted draft nodes along the accepted path (root-to-leaf).
    next_token: ``[B]`` long: the correction token (after a rejection) or the bonus token (path fully accepted).
    num_accepted: ``[B]`` long: ``len(accepted_nodes[b])``.
    """

    accepted_nodes: list[list[int]]
    next_token: torch.Tensor
    num_accepted: torch.Tensor


def _check_uniforms_greedy(
    uniforms: torch.Tensor, greedy: torch.Tensor | None, batch: int, needed: int, fn: str
) -> torch.Tensor:
    if uniforms.dim() != 2 or uniforms.shape[0] != batch:
        raise ValueError(f"{fn}: uniforms must have shape [B={batch}, M], got {tuple(uniforms.shape)}")
    if uniforms.shape[1] < needed:
        raise ValueError(
            f"{fn}: uniforms has {uniforms.shape[1]} columns but the longest draft needs {needed} (len + 1)"
        )
    if greedy is None:
        return torch.zeros(batch, dtype=torch.bool, device=uniforms.device)
    if tuple(greedy.shape) != (batch,):
        raise ValueError(f"{fn}: greedy must have shape [B={batch}], got {tuple(greedy.shape)}")
    return greedy.bool()


def _chain_core(
    target_probs: torch.Tensor,
    tokens: torch.Tensor,
    num_draft: torch.Tensor,
    q: torch.Tensor | None,
    sampled: torch.Tensor,
    uniforms: torch.Tensor,
    greedy: torch.Tensor,
) -> VerifyResult:
    """Vectorized chain verification (inputs already validated; see ``verify_chain``).

    sampled: ``[B]`` bool: request uses its q rows (``q`` must then be set); else point masses.
    """
    B, _, V = target_probs.shape
    K = tokens.shape[1]
    dev = target_probs.device
    wdt = work_dtype(target_probs.dtype)
    ar = torch.arange(B, device=dev)
    num_draft = num_draft.to(dev).long()
    greedy = greedy.to(dev)
    sampled = sampled.to(dev)
    u_all = uniforms.to(dev, torch.float64)

    if K > 0:
        pos = torch.arange(K, device=dev)
        valid = pos.unsqueeze(0) < num_draft.unsqueeze(1)  # [B, K]
        tok = torch.where(valid, tokens.to(dev).long(), torch.zeros_like(tokens, device=dev).long())
        rows = target_probs[:, :K]
        px = rows.gather(2, tok.unsqueeze(-1)).squeeze(-1).double()  # [B, K]
        u = u_all[:, :K]
        if u.shape[1] < K:  # positions past M are never valid (M >= max(num_draft) + 1)
            u = torch.cat([u, u.new_ones(B, K - u.shape[1])], 1)
        accept = u < px
        if q is not None:
            qx = q.gather(2, tok.unsqueeze(-1)).squeeze(-1).double()
            acc_q = (qx > 0) & (u * qx < px)
            accept = torch.where(sampled.unsqueeze(1), acc_q, accept)
        if bool(greedy.any()):
            accept = torch.where(greedy.unsqueeze(1), tok == rows.argmax(-1), accept)
        accept = accept & valid
        n = accept.long().cumprod(1).sum(1)  # [B] accepted prefix length
    else:
        tok = torch.zeros(B, 0, dtype=torch.long, device=dev)
        n = torch.zeros(B, dtype=torch.long, device=dev)

    rejected = n < num_draft
    p_n = target_probs[ar, n].to(wdt)  # [B, V]: target row at the last accepted node
    dist = p_n.clone()
    fix = (rejected & ~greedy).nonzero().squeeze(1)
    if fix.numel():
        nf = n[fix]
        x = tok[fix, nf]
        new = point_mass_residual(p_n[fix], x)
        if q is not None:
            q_rows = q[fix, nf].to(wdt)
            qx = q_rows.gather(1, x.unsqueeze(1)).squeeze(1)
            samp = sampled[fix]
            new = torch.where((samp & (qx > 0)).unsqueeze(1), residual(p_n[fix], q_rows), new)
            new = torch.where((samp & (qx <= 0)).unsqueeze(1), p_n[fix], new)
        dist[fix] = new
    u_final = u_all[ar, n + rejected.long()]
    next_token = sample_from_probs(dist, u_final)
    if bool(greedy.any()):
        next_token = torch.where(greedy, p_n.argmax(-1), next_token)
    n_list = n.tolist()
    return VerifyResult([list(range(k)) for k in n_list], next_token.long(), n)


def verify_chain(
    target_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    num_draft: torch.Tensor,
    draft_probs: torch.Tensor | None,
    uniforms: torch.Tensor,
    greedy: torch.Tensor | None = None,
) -> VerifyResult:
    """Verify a batch of draft chains (fully vectorized; same rule and uniform use as ``verify_tree``).

    Args:
        target_probs: ``[B, K+1, V]`` processed target distribution; row 0 at the root, row 1+i after draft
            token i.
        draft_tokens: ``[B, K]`` long draft tokens; only the first ``num_draft[b]`` of row b are used.
        num_draft: ``[B]`` long, each in ``[0, K]``.
        draft_probs: ``[B, K, V]`` draft distribution q each token was sampled from, or None (point masses).
        uniforms: ``[B, M]`` per-request uniforms in [0, 1), ``M >= max(num_draft) + 1``.
        greedy: ``[B]`` bool or None (no greedy request).

    Returns:
        ``VerifyResult`` with ``accepted_nodes[b] == list(range(num_accepted[b]))``.

    Raises:
        ValueError: on any shape mismatch, ``num_draft`` outside ``[0, K]``, or a used token outside ``[0, V)``.
    """
    if target_probs.dim() != 3:
        raise ValueError(f"verify_chain: target_probs must be [B, K+1, V], got {tuple(target_probs.shape)}")
    B, R, V = target_probs.shape
    if draft_tokens.dim() != 2 or draft_tokens.shape[0] != B or draft_tokens.shape[1] != R - 1:
        raise ValueError(
            f"verify_chain: draft_tokens must be [B={B}, K={R - 1}] (target_probs has K+1={R} rows), "
            f"got {tuple(draft_tokens.shape)}"
        )
    K = R - 1
    if tuple(num_draft.shape) != (B,):
        raise ValueError(f"verify_chain: num_draft must have shape [B={B}], got {tuple(num_draft.shape)}")
    num_draft = num_draft.long()
    if B and (int(num_draft.min()) < 0 or int(num_draft.max()) > K):
        raise ValueError(f"verify_chain: num_draft must lie in [0, K={K}]")
    if draft_probs is not None and tuple(draft_probs.shape) != (B, K, V):
        raise ValueError(
            f"verify_chain: draft_probs must be [B={B}, K={K}, V={V}], got {tuple(draft_probs.shape)}"
        )
    needed = int(num_draft.max()) + 1 if B else 1
    greedy_t = _check_uniforms_greedy(uniforms, greedy, B, needed, "verify_chain")
    if B and K:
        valid = (
            torch.arange(K, device=draft_tokens.device).unsqueeze(0)
            < num_draft.to(draft_tokens.device)[:, None]
        )
        used = draft_tokens[valid]
        if used.numel() and (int(used.min()) < 0 or int(used.max()) >= V):
            raise ValueError(f"verify_chain: draft token ids must lie in [0, V={V})")
    dev = target_probs.device
    q = None if draft_probs is None else draft_probs.to(dev)
    sampled = torch.full((B,), draft_probs is not None, dtype=torch.bool, device=dev)
    return _chain_core(target_probs, draft_tokens.to(dev), num_draft, q, sampled, uniforms, greedy_t)


def _pad_rows(rows: list[list[int]], width: int, fill: int, device) -> torch.Tensor:
    if all(len(r) == width for r in rows):
        return torch.tensor(rows, dtype=torch.long, device=device).reshape(len(rows), width)
    return torch.tensor(
        [r + [fill] * (width - len(r)) for r in rows], dtype=torch.long, device=device
    ).reshape(len(rows), width)


def _first_bad(mask: torch.Tensor) -> tuple[int, int]:
    b, i = mask.nonzero()[0].tolist()
    return b, i


def verify_tree(
    target_probs: torch.Tensor,
    drafts: list[DraftTree],
    uniforms: torch.Tensor,
    greedy: torch.Tensor | None = None,
    coupled: bool = False,
    forced: torch.Tensor | None = None,
) -> VerifyResult:
    """Verify a batch of draft trees (chains included) losslessly; see the module docstring for the rule.

    The walk is a loop over accept tests (at most ``max len(drafts[b])`` iterations), vectorized over the
    batch. When every draft is a chain this dispatches to the fully vectorized chain path (same results).

    Args:
        target_probs: ``[B, N+1, V]`` processed target distribution; row 0 at the root, row 1+i after draft
            node i. Rows past ``len(drafts[b])`` are ignored.
        drafts: B ``DraftTree`` s with ``len(drafts[b]) <= N``; ``probs`` (if set) ``[len, V]``.
        uniforms: ``[B, M]`` per-request uniforms in [0, 1), ``M >= max_b len(drafts[b]) + 1``.
        greedy: ``[B]`` bool or None.
        coupled: point-mass requests use the coupled form of the rule (``uniforms[b, d]`` = the uniform of
            depth d; module docstring); requests with ``probs`` keep the sequential rule.
        forced: ``[B, M]`` long or None: forced tokens (module docstring), with ``coupled`` only.

    Returns:
        ``VerifyResult``.

    Raises:
        ValueError: on shape mismatches (target_probs not 3-D, ``len(drafts) != B``, a draft longer than N,
            ``len(parents) != len(tokens)``, parents not topological, token ids outside ``[0, V)``, probs not
            ``[len, V]``, uniforms not ``[B, M]`` or too short, greedy not ``[B]``, forced not ``[B, >= longest
            draft + 1]``, without ``coupled``, or >= 0 for a request with ``probs``).
    """
    return _verify_tree_impl(
        target_probs, drafts, uniforms, greedy, chain_fast_path=True, coupled=coupled, forced=forced
    )


def _verify_tree_impl(
    target_probs: torch.Tensor,
    drafts: list[DraftTree],
    uniforms: torch.Tensor,
    greedy: torch.Tensor | None,
    chain_fast_path: bool,
    coupled: bool = False,
    forced: torch.Tensor | None = None,
) -> VerifyResult:
    if target_probs.dim() != 3:
        raise ValueError(f"verify_tree: target_probs must be [B, N+1, V], got {tuple(target_probs.shape)}")
    B, R, V = target_probs.shape
    if len(drafts) != B:
        raise ValueError(f"verify_tree: got {len(drafts)} drafts for B={B} target rows")
    lens = [len(t.tokens) for t in drafts]
    for b, t in enumerate(drafts):
        if len(t.parents) != lens[b]:
            raise ValueError(f"verify_tree: drafts[{b}] has {lens[b]} tokens but {len(t.parents)} parents")
        if lens[b] > R - 1:
            raise ValueError(
                f"verify_tree: drafts[{b}] has {lens[b]} nodes but target_probs has room for N={R - 1}"
            )
        if t.probs is not None and tuple(t.probs.shape) != (lens[b], V):
            raise ValueError(
                f"verify_tree: drafts[{b}].probs must be [{lens[b]}, V={V}], got {tuple(t.probs.shape)}"
            )
    n_max = max(lens, default=0)
    greedy_t = _check_uniforms_greedy(uniforms, greedy, B, n_max + 1, "verify_tree")
    dev = target_probs.device
    greedy_t = greedy_t.to(dev)

    # Padded structure; padding parents are -2 so that they never match a real slot.
    tokens = _pad_rows([t.tokens for t in drafts], n_max, 0, dev)
    parents = _pad_rows([t.parents for t in drafts], n_max, -2, dev)
    pos = torch.arange(n_max, device=dev)
    lens_t = torch.tensor(lens, dtype=torch.long, device=dev)
    valid = pos.unsqueeze(0) < lens_t.unsqueeze(1)  # [B, n_max]
    bad = valid & ((parents < -1) | (parents >= pos))
    if bool(bad.any()):
        b, i = _first_bad(bad)
        raise ValueError(
            f"verify_tree: drafts[{b}].parents[{i}]={int(parents[b, i])} must satisfy -1 <= parent < {i}"
        )
    bad = valid & ((tokens < 0) | (tokens >= V))
    if bool(bad.any()):
        b, i = _first_bad(bad)
        raise ValueError(f"verify_tree: drafts[{b}].tokens[{i}]={int(tokens[b, i])} outside [0, V={V})")

    with_probs = [b for b, t in enumerate(drafts) if t.probs is not None]
    if forced is not None:
        if not coupled or forced.dim() != 2 or forced.shape[0] != B or forced.shape[1] < n_max + 1:
            raise ValueError(
                f"verify_tree: forced must be [B={B}, >= {n_max + 1}] with coupled=True, got "
                f"{tuple(forced.shape)} (coupled={coupled})"
            )
        if with_probs and bool((forced[with_probs] >= 0).any()):
            raise ValueError("verify_tree: forced tokens for a request with a sampled draft (probs set)")
        forced = forced.to(dev)
    if coupled and 0 < len(with_probs) < B:
        # mixed batch: sampled drafts take the sequential rule, point-mass drafts the coupled one; each rule
        # runs on its own rows only
        point = [b for b in range(B) if drafts[b].probs is None]
        nodes: list[list[int]] = [[] for _ in range(B)]
        next_token = torch.empty(B, dtype=torch.long, device=dev)
        num_accepted = torch.empty(B, dtype=torch.long, device=dev)
        for rows, rule in ((with_probs, False), (point, True)):
            sub = [drafts[b] for b in rows]
            sub_forced = forced[point] if rule and forced is not None else None
            r = _verify_tree_impl(
                target_probs[rows], sub, uniforms[rows], greedy_t[rows], chain_fast_path, rule, sub_forced
            )
            for j, b in enumerate(rows):
                nodes[b] = r.accepted_nodes[j]
            idx = torch.tensor(rows, dtype=torch.long, device=dev)
            next_token[idx] = r.next_token.to(dev)
            num_accepted[idx] = r.num_accepted.to(dev)
        return VerifyResult(nodes, next_token, num_accepted)
    has_probs = torch.zeros(B, dtype=torch.bool, device=dev)
    q = None
    if with_probs:
        has_probs[with_probs] = True
        q = torch.zeros(B, n_max, V, dtype=work_dtype(target_probs.dtype), device=dev)
        rows = torch.cat([drafts[b].probs for b in with_probs]).to(device=dev, dtype=q.dtype)
        node_idx = valid[has_probs].nonzero()  # [total nodes, 2]: (index into with_probs, node)
        q[torch.tensor(with_probs, dtype=torch.long, device=dev)[node_idx[:, 0]], node_idx[:, 1]] = rows

    is_chain = bool(((parents == pos - 1) | ~valid).all())
    if not coupled or with_probs:  # the sequential rule (every request here has a sampled draft if coupled)
        if chain_fast_path and is_chain:
            return _chain_core(target_probs[:, : n_max + 1], tokens, lens_t, q, has_probs, uniforms, greedy_t)
        iid = torch.tensor([t.iid_siblings for t in drafts], dtype=torch.bool, device=dev)
        return _walk(target_probs, tokens, parents, valid, q, has_probs, iid, uniforms, greedy_t)
    if chain_fast_path and is_chain:
        return _coupled_chain(target_probs[:, : n_max + 1], tokens, lens_t, uniforms, greedy_t, forced)
    return _coupled_walk(target_probs, tokens, parents, valid, uniforms, greedy_t, forced)


def _sample_or_argmax(p: torch.Tensor, u: torch.Tensor, greedy: torch.Tensor) -> torch.Tensor:
    """``[N]`` tokens: inverse-CDF draws from rows ``p [N, V]`` with ``u [N]``; argmax where ``greedy [N]``."""
    y = sample_from_probs(p, u)
    return torch.where(greedy, p.argmax(-1), y) if bool(greedy.any()) else y


def _coupled_chain(
    target_probs: torch.Tensor,
    tokens: torch.Tensor,
    num_draft: torch.Tensor,
    uniforms: torch.Tensor,
    greedy: torch.Tensor,
    forced: torch.Tensor | None = None,
) -> VerifyResult:
    """Coupled rule for chains, vectorized: draw every depth's token at once (``forced`` ones replaced), accept
    the matching prefix."""
    B, R, V = target_probs.shape
    K = R - 1
    dev = target_probs.device
    u = uniforms.to(dev)[:, :R]  # M >= R: checked by the caller (rows were cut to the longest draft + 1)
    g = greedy.view(B, 1).expand(B, R).reshape(-1)
    y = _sample_or_argmax(target_probs.reshape(B * R, V), u.reshape(-1), g).view(B, R)
    if forced is not None:
        y = torch.where(forced[:, :R] >= 0, forced[:, :R], y)
    valid = torch.arange(K, device=dev).unsqueeze(0) < num_draft.to(dev).unsqueeze(1)
    n = ((y[:, :K] == tokens) & valid).long().cumprod(1).sum(1) if K else y.new_zeros(B)
    next_token = y[torch.arange(B, device=dev), n]
    return VerifyResult([list(range(k)) for k in n.tolist()], next_token.long(), n)


def _coupled_walk(
    target_probs: torch.Tensor,
    tokens: torch.Tensor,
    parents: torch.Tensor,
    valid: torch.Tensor,
    uniforms: torch.Tensor,
    greedy: torch.Tensor,
    forced: torch.Tensor | None = None,
) -> VerifyResult:
    """Coupled rule for trees: one draw per depth (``forced`` ones replaced); descend into the first child whose
    token matches it."""
    B, n_max = tokens.shape
    dev = target_probs.device
    ar = torch.arange(B, device=dev)
    u_all = uniforms.to(dev)
    slot = torch.zeros(B, dtype=torch.long, device=dev)  # 0 = root, 1 + i = node i
    depth = torch.zeros(B, dtype=torch.long, device=dev)
    walking = torch.ones(B, dtype=torch.bool, device=dev)
    next_token = torch.zeros(B, dtype=torch.long, device=dev)
    path = torch.full((B, max(n_max, 1)), -1, dtype=torch.long, device=dev)
    for _ in range(n_max + 1):
        y = _sample_or_argmax(target_probs[ar, slot], u_all[ar, depth], greedy)
        if forced is not None:
            y = torch.where(forced[ar, depth] >= 0, forced[ar, depth], y)
        match = valid & (parents == (slot - 1).unsqueeze(1)) & (tokens == y.unsqueeze(1))
        has = match.any(1) & walking
        stop = walking & ~has
        next_token = torch.where(stop, y, next_token)
        walking = has
        if not bool(walking.any()):
            break
        node = match.long().argmax(1)  # first matching child in tree order
        idx = walking.nonzero().squeeze(1)
        path[idx, depth[idx]] = node[idx]
        slot = torch.where(walking, node + 1, slot)
        depth = depth + walking.long()
    depth_list = depth.tolist()
    path_list = path.tolist()
    return VerifyResult([path_list[b][: depth_list[b]] for b in range(B)], next_token.long(), depth)


def _walk(
    target_probs: torch.Tensor,
    tokens: torch.Tensor,
    parents: torch.Tensor,
    valid: torch.Tensor,
    q: torch.Tensor | None,
    has_probs: torch.Tensor,
    iid: torch.Tensor,
    uniforms: torch.Tensor,
    greedy: torch.Tensor,
) -> VerifyResult:
    """General tree walk over validated padded inputs (all ``[B, n_max]``; ``q [B, n_max, V]`` or None)."""
    B = target_probs.shape[0]
    n_max = tokens.shape[1]
    dev = target_probs.device
    wdt = work_dtype(target_probs.dtype)

    # Tree structure: first child of each slot (slot 0 = root, 1+i = node i) and next sibling of each node.
    pos = torch.arange(n_max, device=dev)
    slots = torch.arange(-1, n_max, device=dev)
    is_child = parents.unsqueeze(2) == slots.view(1, 1, -1)  # [B, node, slot]
    first = (
        torch.where(is_child, pos.view(1, -1, 1), n_max).amin(1) if n_max else is_child.new_zeros(B, 1).long()
    )
    first_child = torch.where(first >= n_max, -1, first)  # [B, n_max + 1]
    later_sib = (
        (parents.unsqueeze(2) == parents.unsqueeze(1))
        & (pos.view(1, 1, -1) > pos.view(1, -1, 1))
        & valid.unsqueeze(1)
        & valid.unsqueeze(2)
    )  # [B, node, other]
    nxt = torch.where(later_sib, pos.view(1, 1, -1), n_max).amin(2) if n_max else parents
    next_sib = torch.where(nxt >= n_max, -1, nxt)  # [B, n_max]
    n_children = is_child.sum(1)  # [B, n_max + 1]
    only_child = n_children.gather(1, (parents + 1).clamp(min=0)) == 1
    # q rule for i.i.d. siblings and only-children; point mass for siblings that are not i.i.d.
    q_rule = valid & has_probs.unsqueeze(1) & (iid.unsqueeze(1) | only_child)

    ar = torch.arange(B, device=dev)
    u_all = uniforms.to(dev, torch.float64)
    cur_p = target_probs[:, 0].to(wdt).clone()  # [B, V] current (possibly residual) distribution
    cand = first_child[:, 0].clone()  # next child to test, -1 when none is left
    n_tests = torch.zeros(B, dtype=torch.long, device=dev)
    depth = torch.zeros(B, dtype=torch.long, device=dev)
    path = torch.full((B, max(n_max, 1)), -1, dtype=torch.long, device=dev)
    any_greedy = bool(greedy.any())

    for _ in range(n_max):  # every iteration tests one node per still-testing request
        testing = cand >= 0
        if not bool(testing.any()):
            break
        c = cand.clamp(min=0)
        x = tokens[ar, c]
        px = cur_p.gather(1, x.unsqueeze(1)).squeeze(1).double()
        u = u_all[ar, n_tests]
        accept = u < px
        if q is not None:
            q_rows = q[ar, c]
            qx = q_rows.gather(1, x.unsqueeze(1)).squeeze(1).double()
            use_q = q_rule[ar, c]
            accept = torch.where(use_q, (qx > 0) & (u * qx < px), accept)
        if any_greedy:
            accept = torch.where(greedy, x == cur_p.argmax(-1), accept)
        accept = accept & testing
        reject = testing & ~accept

        fix = (reject & ~greedy).nonzero().squeeze(1)
        if fix.numel():
            new = point_mass_residual(cur_p[fix], x[fix])
            if q is not None:
                uq, qf = use_q[fix], qx[fix]
                new = torch.where((uq & (qf > 0)).unsqueeze(1), residual(cur_p[fix], q_rows[fix]), new)
                new = torch.where((uq & (qf <= 0)).unsqueeze(1), cur_p[fix], new)
            cur_p[fix] = new
        acc = accept.nonzero().squeeze(1)
        if acc.numel():
            ca = c[acc]
            cur_p[acc] = target_probs[acc, ca + 1].to(wdt)
            path[acc, depth[acc]] = ca
            depth = depth + accept.long()
        cand = torch.where(accept, first_child[ar, c + 1], torch.where(reject, next_sib[ar, c], cand))
        n_tests = n_tests + testing.long()

    next_token = sample_from_probs(cur_p, u_all[ar, n_tests])
    if any_greedy:
        next_token = torch.where(greedy, cur_p.argmax(-1), next_token)
    depth_list = depth.tolist()
    path_list = path.tolist()
    accepted = [path_list[b][: depth_list[b]] for b in range(B)]
    return VerifyResult(accepted, next_token.long(), depth)
