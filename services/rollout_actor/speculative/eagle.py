"""Learned drafter: an EAGLE-style draft head over the policy's own hidden states.

After EAGLE-1 (Li, Wei, Zhang, Zhang, "EAGLE: Speculative Sampling Requires Rethinking Feature
Uncertainty", ICML 2024, arXiv 2401.15077), EAGLE-2 ("EAGLE-2: Faster Inference of Language Models with
Dynamic Draft Trees", EMNLP 2024, arXiv 2406.16858) and EAGLE-3 ("EAGLE-3: Scaling up Inference Acceleration
of Large Language Models via Training-Time Test", arXiv 2503.01840).

Modules: ``eagle_model.py`` (the draft head), ``eagle.py`` (the drafter, here), ``eagle_train.py`` (training
on recorded target states, and the warm-up command line), ``eagle_checkpoint.py`` (the EAGLE checkpoint layout
of vLLM and SGLang).

Contract
--------
* ``EagleDrafter`` (``Drafter``, name ``"learned"``): ``propose`` is batched over requests. It needs
  ``DraftRequest.hidden`` = the target hidden state(s) at the position that produced the root token
  (``[H]``, or ``[k, H]`` for the layers in ``EagleDrafter.hidden_layers``, which must equal the engine's
  ``hidden_layers``; ``EagleDrafter.required_hidden_layers`` says what to give the engine). Requests without
  hidden (or with budget 0) get an empty draft.

  - ``width == 1``: a chain; ``width > 1``: an EAGLE-2 dynamic tree: level 1 = the top-``width`` children of
    the root; at every further level the ``width`` nodes of the previous level with the highest cumulative
    log-probability are expanded, each into its top-``width`` children; at the end the ``max_tokens``
    nodes with the highest cumulative log-probability over all levels are kept (an ancestor-closed set,
    because a child never scores above its parent; ties go to the earlier node). At most ``depth`` levels
    (0 = ``max_tokens``; never more than ``EagleConfig.max_depth``).
  - ``EagleConfig.temperature == 0`` (default): deterministic drafts, ``probs = None`` (siblings are
    distinct tokens), so the verifier uses the point-mass rule. ``temperature > 0``: sampled drafts;
    every node's ``probs`` row is q = softmax(logits / temperature) at its parent, the ``width`` children
    of an expanded node are drawn i.i.d. from q (``iid_siblings = True``) and the tree is cut by node count
    in level order (never by the children's own values), which keeps the SpecInfer rule lossless. Draws
    use the drafter's own generator (``EagleConfig.seed``), so sampled drafts are lossless but not
    reproducible per request seed.
  - ``DraftTree.score`` = the sum over the drafted nodes of their cumulative draft probability, i.e. the
    expected number of accepted tokens under the drafter's own model (the same quantity the suffix drafter
    reports, so ``hybrid`` can compare them). Nodes are in level order, siblings by decreasing probability.
  - The draft layer attends only over the draft itself (root + ancestors, tree attention mask), recomputed
    at each level; rotary positions are the node depths. Training (``context="chain"``) uses exactly this
    context, so what is trained is what runs.

Run:

    python -m pytest tests/rollout_actor/test_eagle.py -q
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

from services.rollout_actor.model import Transformer
from services.rollout_actor.speculative.base import Drafter, DraftRequest, DraftTree

# EagleConfig, EagleDraftModel, default_fuse_layers and save_eagle_checkpoint stay importable from here (the
# drafter's own names; the benchmarks import them from this module).
from services.rollout_actor.speculative.eagle_checkpoint import load_eagle_checkpoint, save_eagle_checkpoint  # noqa: F401
from services.rollout_actor.speculative.eagle_model import (  # noqa: F401
    EagleConfig,
    EagleDraftModel,
    default_fuse_layers,
    draft_logits,
    target_embed,
)


# ---------------------------------------------------------------------------------------------- drafter
class EagleDrafter(Drafter):
    """The learned drafter (``name = "learned"``).

    Args:
        target: the policy ``Transformer``; its ``model.embed_tokens`` and ``lm_head`` are shared (same
            objects, read through ``.detach()``).
        model: the draft head (default: a fresh ``EagleDraftModel(target.config, config)``); moved to the
            target's device and dtype.
        config: used only when ``model`` is None.
        hidden_layers: the engine's ``hidden_layers`` (what ``DraftRequest.hidden`` rows are); default
            ``model.feature_layers``. Must contain every layer the head reads.
    """

    name = "learned"

    def __init__(
        self,
        target: Transformer,
        model: EagleDraftModel | None = None,
        config: EagleConfig | None = None,
        hidden_layers: Sequence[int] | None = None,
    ):
        self.target = target
        self.embed_tokens = target.model.embed_tokens
        self.lm_head = target.lm_head
        p = next(target.parameters())
        model = model if model is not None else EagleDraftModel(target.config, config)
        self.model = model.to(device=p.device, dtype=p.dtype)
        self.model.eval()
        self.hidden_layers = tuple(hidden_layers) if hidden_layers is not None else self.model.feature_layers
        missing = [i for i in self.model.feature_layers if i not in self.hidden_layers]
        if missing:
            raise ValueError(f"hidden_layers {self.hidden_layers} lack the draft head's layers {missing}")
        self._rows = [self.hidden_layers.index(i) for i in self.model.feature_layers]
        self._gen = torch.Generator(device=p.device).manual_seed(int(self.model.config.seed))

    @property
    def required_hidden_layers(self) -> tuple[int, ...]:
        """Pass this as ``Engine(hidden_layers=...)``."""
        return self.model.feature_layers

    @staticmethod
    def from_pretrained(path: str | os.PathLike, target: Transformer, **kw) -> EagleDrafter:
        """``EagleDrafter(target, load_eagle_checkpoint(path, target), **kw)``."""
        return EagleDrafter(target, load_eagle_checkpoint(path, target), **kw)

    # ------------------------------------------------------------------ propose
    def _request_hidden(self, h: torch.Tensor) -> torch.Tensor:
        """One request's hidden -> ``[H]`` (EAGLE-1) or ``[k, H]`` (EAGLE-3) in ``feature_layers`` order."""
        if h.dim() == 1:
            if len(self._rows) != 1:
                raise ValueError(f"draft head needs {len(self._rows)} hidden layers, request has one")
            return h
        if h.shape[0] != len(self.hidden_layers):
            raise ValueError(
                f"DraftRequest.hidden has {h.shape[0]} layers, "
                f"EagleDrafter.hidden_layers is {self.hidden_layers}"
            )
        sel = h[self._rows]
        return sel[0] if not self.model.is_eagle3 else sel

    @torch.no_grad()
    def propose(
        self, requests: list[DraftRequest], max_tokens: list[int], width: int = 1, depth: int = 0
    ) -> list[DraftTree]:
        """One draft per request (see the module docstring); ``len(tree) <= max_tokens[i]``, at most
        ``width`` children per node, at most ``depth`` levels (0 = ``max_tokens[i]``)."""
        out = [DraftTree() for _ in requests]
        idx = [i for i, (r, k) in enumerate(zip(requests, max_tokens)) if k > 0 and r.hidden is not None]
        if not idx:
            return out
        width = max(1, min(int(width), self.target.config.vocab_size))
        cap = self.model.config.max_depth
        budgets = [int(max_tokens[i]) for i in idx]
        depths = [min(k, depth if depth > 0 else k, cap) for k in budgets]
        p = next(self.model.parameters())
        hidden = torch.stack([self._request_hidden(requests[i].hidden) for i in idx]).to(p.device, p.dtype)
        roots = torch.tensor([requests[i].token_ids[-1] for i in idx], dtype=torch.long, device=p.device)
        trees = self._draft(hidden, roots, budgets, depths, width)
        for i, t in zip(idx, trees):
            out[i] = t
        return out

    def _draft(
        self, hidden: torch.Tensor, roots: torch.Tensor, budgets: list[int], depths: list[int], width: int
    ) -> list[DraftTree]:
        """Batched dynamic tree (a chain when ``width == 1``) for B requests. hidden ``[B, (k,) H]``.

        "Computed" nodes (the root and every expanded frontier node) are run through the draft layer; all
        of them are recomputed at each level over the tree mask (drafts are short). Every computed node
        offers ``width`` candidate children; candidates form the pool the final tree is chosen from.
        """
        model, target = self.model, self.target
        temp = float(model.config.temperature)
        sample = temp > 0
        b = roots.shape[0]
        dev = roots.device
        d_max = max(depths)
        bi = torch.arange(b, device=dev).unsqueeze(1)
        embeds = [target_embed(target, roots)]  # computed nodes' inputs, each [B, H]
        feats = [model.fuse(hidden)]
        node_depth = [0]
        anc = torch.ones(b, 1, 1, dtype=torch.bool, device=dev)  # [B, M, M]: row attends to column
        new_cols = [0]  # computed nodes expanded at this level
        q_nodes: list[torch.Tensor] = []  # sampled mode: q of every computed node, [B, V] each
        pool_tok: list[torch.Tensor] = []  # per level [B, n * width]
        pool_cum: list[torch.Tensor] = []  # cumulative log-probability
        pool_par: list[torch.Tensor] = []  # pool index of the parent candidate (-1 = root)
        pool_comp: list[torch.Tensor] = []  # computed index of the parent
        base_cum = torch.zeros(b, 1, device=dev)
        base_par = torch.full((b, 1), -1, dtype=torch.long, device=dev)
        level_start = 0  # pool index of the current level's first candidate
        for level in range(1, d_max + 1):
            pos = torch.tensor(node_depth, device=dev).expand(b, -1)
            h = model(torch.stack(embeds, 1), torch.stack(feats, 1), pos, anc)  # [B, M, H]
            logits = draft_logits(target, model, h[:, new_cols]).float()  # [B, n, V]
            n = logits.shape[1]
            if sample:
                logq = torch.log_softmax(logits / temp, dim=-1)
                q = logq.exp()
                q_nodes.extend(q.unbind(1))
                draws = torch.multinomial(q.reshape(b * n, -1), width, replacement=True, generator=self._gen)
                tok = draws.view(b, n, width)
                lp = logq.gather(-1, tok)
            else:
                lp, tok = torch.log_softmax(logits, dim=-1).topk(width, dim=-1)  # siblings by probability
            cum = (base_cum.unsqueeze(-1) + lp).reshape(b, n * width)
            comp = torch.tensor(new_cols, device=dev).view(1, n, 1).expand(b, n, width).reshape(b, -1)
            pool_tok.append(tok.reshape(b, n * width))
            pool_cum.append(cum)
            pool_par.append(base_par.unsqueeze(-1).expand(b, n, width).reshape(b, -1))
            pool_comp.append(comp)
            if level == d_max:
                break
            # frontier: the `width` best candidates of this level (stable sort: ties -> earlier candidate)
            k = min(width, cum.shape[1])
            order = torch.sort(-cum, dim=1, stable=True).indices[:, :k]  # [B, k]
            f_comp = comp.gather(1, order)  # computed index of each frontier node's parent
            m = anc.shape[1]
            grown = torch.zeros(b, m + k, m + k, dtype=torch.bool, device=dev)
            grown[:, :m, :m] = anc
            grown[:, m:, :m] = anc[bi, f_comp]  # the parent's ancestors, the parent included
            diag = torch.arange(m, m + k, device=dev)
            grown[:, diag, diag] = True
            anc = grown
            f_emb = target_embed(target, pool_tok[-1].gather(1, order))
            f_feat = h[bi, f_comp]  # the parent's output is the frontier node's input feature
            for j in range(k):
                embeds.append(f_emb[:, j])
                feats.append(f_feat[:, j])
                node_depth.append(level)
            new_cols = list(range(m, m + k))
            base_cum = cum.gather(1, order)
            base_par = order + level_start
            level_start += cum.shape[1]
        q_all = torch.stack(q_nodes, 1) if sample else None
        return self._select(pool_tok, pool_cum, pool_par, pool_comp, q_all, budgets, depths)

    @staticmethod
    def _select(pool_tok, pool_cum, pool_par, pool_comp, q_all, budgets, depths) -> list[DraftTree]:
        """Pick each request's nodes from the candidate pool and emit topologically ordered trees."""
        sample = q_all is not None
        tok = torch.cat(pool_tok, 1).cpu()
        cum = torch.cat(pool_cum, 1).float().cpu()
        par = torch.cat(pool_par, 1).cpu()
        comp = torch.cat(pool_comp, 1).cpu()
        lvl = torch.cat([torch.full_like(t, i + 1) for i, t in enumerate(pool_tok)], 1).cpu()
        trees = []
        for r in range(tok.shape[0]):
            allowed = (lvl[r] <= depths[r]).nonzero().flatten()
            m = min(budgets[r], allowed.numel())
            if sample:
                chosen = allowed[:m]  # cut by count in level order, never by the children's own values
            else:
                order = torch.sort(-cum[r, allowed], stable=True).indices[:m]
                chosen = allowed[order].sort().values  # pool order = level order, siblings by probability
            cl = chosen.tolist()
            pos = {c: j for j, c in enumerate(cl)}
            parents = [-1 if int(par[r, c]) < 0 else pos[int(par[r, c])] for c in cl]
            probs = q_all[r, comp[r, chosen].to(q_all.device)].float() if sample and m else None
            score = float(cum[r, chosen].exp().sum())
            trees.append(DraftTree(tok[r, chosen].tolist(), parents, probs, sample, score))
        return trees

    # ------------------------------------------------------------------ state
    def load_model_state(self, state: dict[str, torch.Tensor]) -> None:
        """Load new draft-head weights (e.g. a version published by the spot trainer)."""
        self.model.load_state_dict(state)

    def state_dict(self) -> dict:
        return {
            "config": self.model.config.to_dict(),
            "model": {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()},
        }

    def load_state_dict(self, state: dict) -> None:
        if (
            state.get("config")
            and EagleConfig.from_dict(state["config"]).fuse_layers != self.model.config.fuse_layers
        ):
            raise ValueError("state_dict is for a draft head with different fuse_layers")
        if state.get("model"):
            self.load_model_state(state["model"])


__all__ = ["EagleDrafter"]
