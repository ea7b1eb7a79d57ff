"""Learned drafter: an EAGLE-style draft head over the policy's own hidden states.

After EAGLE-1 (Li, Wei, Zhang, Zhang, "EAGLE: Speculative Sampling Requires Rethinking Feature
Uncertainty", ICML 2024, arXiv 2401.15077), EAGLE-2 ("EAGLE-2: Faster Inference of Language Models with
Dynamic Draft Trees", EMNLP 2024, arXiv 2406.16858) and EAGLE-3 ("EAGLE-3: Scaling up Inference Acceleration
of Large Language Models via Training-Time Test", arXiv 2503.01840).

Contract
--------
* ``EagleDraftModel`` is ONE decoder layer (model.py's ``DecoderLayer``, Llama flavour: no q/k/v bias) plus a
  linear ``fc``. It owns no embedding and no LM head: it reads the target's frozen ``model.embed_tokens`` and
  ``lm_head`` (used through ``.detach()``, so they never receive gradients and are never copied).

  - EAGLE-1 (``EagleConfig.fuse_layers = None``): feature ``f_t`` = the target's final normed hidden state
    at position t (engine hidden index ``num_hidden_layers``). ``x = fc(concat(embed(token_{t+1}), f_t))``
    (``fc: 2H -> H``), the layer runs on x without its input RMSNorm (EAGLE-1 drops it), the output
    ``h`` is the predicted ``f_{t+1}`` and ``lm_head(h)`` the draft logits for token t+2.
  - EAGLE-3 (``fuse_layers = (low, mid, high)``, engine hidden indices, strictly increasing): ``g_t =
    fc(concat(h_low, h_mid, h_high))`` (``fc: 3H -> H``); the layer's attention reads
    ``concat(input_layernorm(embed(token_{t+1})), hidden_norm(g_t))`` (q/k/v: ``2H -> heads``), the residual
    stream starts at ``g_t``; draft logits are ``lm_head(norm(h))`` and the next step's feature is the
    pre-norm ``h``.

  In both, a deeper draft step feeds the drafter's own output ``h`` back as the next feature (EAGLE's
  autoregression at the feature level).
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
* ``EagleTrainer.train_step(batch)`` on recorded target states (``record_features``): ``tokens [N, T]``,
  ``features [N, T, H]`` (EAGLE-1) or ``[N, T, k, H]`` (EAGLE-3), ``mask [N, T]``, optional ``final
  [N, T, H]`` (the target's final normed state; EAGLE-1 features are it). From ``(feature_t, token_{t+1})``
  predict ``f_{t+1}``; unrolled ``train_depth`` steps on the drafter's own features (EAGLE-3's training-time
  test). Loss per step: EAGLE-1 ``SmoothL1(h, f_{t+1}) + ce_weight * CE(softmax(lm_head(f_{t+1})),
  lm_head(h))`` (``ce_weight = 0.1`` as in EAGLE-1); EAGLE-3 the soft cross-entropy alone. Steps are
  weighted ``step_decay ** j``. AdamW, gradient clipping. Returns the loss parts and the top-1 agreement
  (draft argmax == target argmax), overall and per unrolled step.
* Checkpoints (``save_eagle_checkpoint`` / ``load_eagle_checkpoint``): a folder with ``config.json`` +
  ``model.safetensors`` in the layout of the public EAGLE checkpoints that vLLM and SGLang load; see
  ``save_eagle_checkpoint`` for the exact keys and what was (and was not) verified.

Run:

    python -m pytest tests/rollout_actor/test_eagle.py -q
    python -m services.rollout_actor.speculative.eagle --model <hf model folder> --out runs/eagle --steps 300
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from services.rollout_actor.model import (
    DecoderLayer,
    ModelConfig,
    ModelLoadError,
    RMSNorm,
    Transformer,
    rope_cos_sin,
)
from services.rollout_actor.speculative.base import Drafter, DraftRequest, DraftTree

__all__ = [
    "EagleBatch",
    "EagleConfig",
    "EagleDataset",
    "EagleDraftModel",
    "EagleDrafter",
    "EagleTrainer",
    "default_fuse_layers",
    "load_eagle_checkpoint",
    "record_features",
    "save_eagle_checkpoint",
    "warmup",
]

log = logging.getLogger(__name__)

EAGLE1_ARCH_VLLM = (
    "LlamaForCausalLM"  # vLLM's EAGLEConfig turns it into EagleLlamaForCausalLM (method "eagle")
)
EAGLE1_ARCH_SGLANG = "LlamaForCausalLMEagle"  # SGLang's EAGLE-1 draft class
EAGLE3_ARCH = "LlamaForCausalLMEagle3"  # registered by both vLLM (-> Eagle3LlamaForCausalLM) and SGLang


# ---------------------------------------------------------------------------------------------- config
@dataclass
class EagleConfig:
    """Draft head configuration.

    fuse_layers: None = EAGLE-1 on the target's final normed hidden state; a strictly increasing tuple of
        engine hidden indices (``i`` = output of target layer ``i``; ``num_hidden_layers`` = final normed
        state) = EAGLE-3 fusion of those layers (3 in EAGLE-3; see ``default_fuse_layers``).
    temperature: 0 = deterministic drafts (top-k / greedy, ``probs=None``); > 0 = sampled drafts with q.
    max_depth: hard cap on draft levels.
    fc_bias: EAGLE-1 ``fc`` with a bias (vLLM's EagleLlamaForCausalLM has none; keep False for vLLM).
    intermediate_size, num_attention_heads, num_key_value_heads, head_dim, rope_theta, rms_norm_eps: the
        draft layer's shape; None = the target's.
    seed: initialisation and sampled-draft generator seed.
    """

    fuse_layers: tuple[int, ...] | None = None
    temperature: float = 0.0
    max_depth: int = 16
    fc_bias: bool = False
    intermediate_size: int | None = None
    num_attention_heads: int | None = None
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    rope_theta: float | None = None
    rms_norm_eps: float | None = None
    seed: int = 0

    def __post_init__(self):
        if self.fuse_layers is not None:
            self.fuse_layers = tuple(int(i) for i in self.fuse_layers)
            fl = self.fuse_layers
            if len(fl) < 2 or any(b <= a for a, b in zip(fl, fl[1:])) or fl[0] < 0:
                raise ValueError(
                    f"EagleConfig.fuse_layers must be >= 2 strictly increasing non-negative layer indices, "
                    f"got {fl}"
                )
        if self.temperature < 0:
            raise ValueError(f"EagleConfig.temperature must be >= 0, got {self.temperature}")
        if self.max_depth < 1:
            raise ValueError(f"EagleConfig.max_depth must be >= 1, got {self.max_depth}")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["fuse_layers"] = list(self.fuse_layers) if self.fuse_layers is not None else None
        return d

    @staticmethod
    def from_dict(d: dict) -> EagleConfig:
        names = {f.name for f in fields(EagleConfig)}
        kw = {k: v for k, v in d.items() if k in names}
        if kw.get("fuse_layers") is not None:
            kw["fuse_layers"] = tuple(kw["fuse_layers"])
        return EagleConfig(**kw)


def default_fuse_layers(num_hidden_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's low/mid/high choice in engine hidden indices.

    EAGLE-3, vLLM and SGLang take the residual stream *entering* target layers ``(2, L // 2, L - 3)``, i.e.
    the outputs of layers ``(1, L // 2 - 1, L - 4)``. For targets too shallow for that (L < 7), evenly spaced
    distinct indices in ``[0, L]`` are returned instead (``L`` = the final normed state).
    """
    n = num_hidden_layers
    cand = (1, n // 2 - 1, n - 4)
    if cand[0] >= 0 and all(b > a for a, b in zip(cand, cand[1:])):
        return cand
    if n < 2:
        raise ValueError(f"a target with {n} layers has too few hidden states for a 3-layer fusion")
    return (0, n // 2, n)


def _layer_config(target: ModelConfig, cfg: EagleConfig) -> ModelConfig:
    """ModelConfig of the draft decoder layer: Llama flavour (no attention/MLP bias), target's width."""
    heads = cfg.num_attention_heads or target.num_attention_heads
    return ModelConfig(
        architecture="LlamaForCausalLM",
        vocab_size=target.vocab_size,
        hidden_size=target.hidden_size,
        intermediate_size=cfg.intermediate_size or target.intermediate_size,
        num_hidden_layers=1,
        num_attention_heads=heads,
        num_key_value_heads=cfg.num_key_value_heads or target.num_key_value_heads,
        head_dim=cfg.head_dim or target.head_dim,
        rms_norm_eps=cfg.rms_norm_eps if cfg.rms_norm_eps is not None else target.rms_norm_eps,
        rope_theta=cfg.rope_theta if cfg.rope_theta is not None else target.rope_theta,
        tie_word_embeddings=False,
        attention_bias=False,
        qk_norm=False,
        mlp_bias=False,
        max_position_embeddings=target.max_position_embeddings,
        bos_token_id=target.bos_token_id,
        eos_token_id=target.eos_token_id,
        pad_token_id=target.pad_token_id,
    )


# ---------------------------------------------------------------------------------------------- model
class EagleDraftModel(nn.Module):
    """One decoder layer + ``fc`` (EAGLE-1) or + fusion ``fc`` and output ``norm`` (EAGLE-3).

    Parameters (state_dict keys): EAGLE-1 ``fc.weight [H, 2H]`` (+ ``fc.bias``), ``layers.0.self_attn.
    {q,k,v,o}_proj.weight``, ``layers.0.mlp.{gate,up,down}_proj.weight``, ``layers.0.post_attention_layernorm.
    weight``. EAGLE-3 ``fc.weight [H, kH]``, ``layers.0.self_attn.{q,k,v}_proj.weight [*, 2H]``, ``o_proj``,
    ``layers.0.mlp.*``, ``layers.0.{input_layernorm,hidden_norm,post_attention_layernorm}.weight``,
    ``norm.weight``. Embedding and LM head are the target's (passed in as tensors by the caller).
    """

    def __init__(self, target_config: ModelConfig, config: EagleConfig | None = None):
        super().__init__()
        self.config = config or EagleConfig()
        self.target_config = target_config
        cfg = self.config
        lc = _layer_config(target_config, cfg)
        self.layer_config = lc
        h = target_config.hidden_size
        if cfg.fuse_layers is not None and cfg.fuse_layers[-1] > target_config.num_hidden_layers:
            raise ValueError(
                f"fuse_layers {cfg.fuse_layers} exceed the target's hidden indices "
                f"0..{target_config.num_hidden_layers}"
            )
        layer = DecoderLayer(lc)
        if self.is_eagle3:
            self.fc = nn.Linear(len(cfg.fuse_layers) * h, h, bias=False)
            att = layer.self_attn
            att.q_proj = nn.Linear(2 * h, lc.num_attention_heads * lc.head_dim, bias=False)
            att.k_proj = nn.Linear(2 * h, lc.num_key_value_heads * lc.head_dim, bias=False)
            att.v_proj = nn.Linear(2 * h, lc.num_key_value_heads * lc.head_dim, bias=False)
            layer.hidden_norm = RMSNorm(h, lc.rms_norm_eps)
            self.norm = RMSNorm(h, lc.rms_norm_eps)
        else:
            self.fc = nn.Linear(2 * h, h, bias=cfg.fc_bias)
            layer.input_layernorm = nn.Identity()  # EAGLE-1 drops layer 0's input RMSNorm
        self.layers = nn.ModuleList([layer])
        self.reset_parameters()

    @property
    def is_eagle3(self) -> bool:
        return self.config.fuse_layers is not None

    @property
    def feature_layers(self) -> tuple[int, ...]:
        """Engine hidden indices this head reads, in the order ``DraftRequest.hidden`` must hold them."""
        fl = self.config.fuse_layers
        return tuple(fl) if fl is not None else (self.target_config.num_hidden_layers,)

    def reset_parameters(self, std: float = 0.02) -> None:
        """Normal(0, std) linear weights (seeded by ``config.seed``), zero biases, unit norms."""
        g = torch.Generator().manual_seed(int(self.config.seed))
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("norm.weight"):
                    p.fill_(1.0)
                elif name.endswith("bias"):
                    p.zero_()
                else:
                    p.copy_((torch.randn(p.shape, generator=g) * std).to(p.dtype))

    def fuse(self, hidden: torch.Tensor) -> torch.Tensor:
        """Target hidden state(s) -> draft feature: ``[..., H]`` (EAGLE-1, unchanged) or ``[..., k, H]``
        (EAGLE-3, k = len(fuse_layers), concatenated in layer order, projected by ``fc``) -> ``[..., H]``."""
        if not self.is_eagle3:
            return hidden
        return self.fc(hidden.flatten(-2))

    def forward(
        self,
        embeds: torch.Tensor,
        features: torch.Tensor,
        positions: torch.Tensor | None = None,
        attn_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Run the draft layer.

        Args:
            embeds: ``[B, T, H]`` target embeddings of the input tokens (token t+1 at position t).
            features: ``[B, T, H]`` draft features (``fuse``d target states, or the head's own outputs).
            positions: ``[B, T]`` rotary positions (default ``arange(T)``).
            attn_mask: ``[B, T, T]`` bool, which positions each position attends to (default causal).

        Returns:
            ``[B, T, H]`` the predicted next features (pre-norm for EAGLE-3).
        """
        b, t, _ = embeds.shape
        lc = self.layer_config
        if positions is None:
            positions = torch.arange(t, device=embeds.device).expand(b, t)
        cos, sin = rope_cos_sin(positions, lc.head_dim, lc.rope_theta)
        cos, sin = cos.unsqueeze(1).to(embeds.dtype), sin.unsqueeze(1).to(embeds.dtype)
        mask = attn_mask.unsqueeze(1) if attn_mask is not None else None
        layer = self.layers[0]
        if not self.is_eagle3:
            x = self.fc(torch.cat((embeds, features), dim=-1))
            return layer(x, cos, sin, mask, None, 0, None, None)
        x = torch.cat((layer.input_layernorm(embeds), layer.hidden_norm(features)), dim=-1)
        h = features + layer.self_attn(x, cos, sin, mask, None, 0, None, None)
        return h + layer.mlp(layer.post_attention_layernorm(h))

    def head_input(self, h: torch.Tensor) -> torch.Tensor:
        """What the LM head reads: ``h`` (EAGLE-1) or ``norm(h)`` (EAGLE-3)."""
        return self.norm(h) if self.is_eagle3 else h

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


def _embed(target: Transformer, ids: torch.Tensor) -> torch.Tensor:
    return F.embedding(ids, target.model.embed_tokens.weight.detach())


def _logits(target: Transformer, model: EagleDraftModel, h: torch.Tensor) -> torch.Tensor:
    return F.linear(model.head_input(h), target.lm_head.weight.detach())


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
        embeds = [_embed(target, roots)]  # computed nodes' inputs, each [B, H]
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
            logits = _logits(target, model, h[:, new_cols]).float()  # [B, n, V]
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
            f_emb = _embed(target, pool_tok[-1].gather(1, order))
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


# ---------------------------------------------------------------------------------------------- data
@dataclass
class EagleDataset:
    """Recorded target states. tokens ``[N, T]`` long; features ``[N, T, H]`` or ``[N, T, k, H]`` (the head's
    ``feature_layers``); final ``[N, T, H]`` the target's final normed state; mask ``[N, T]`` bool (valid
    positions, a prefix of each row)."""

    tokens: torch.Tensor
    features: torch.Tensor
    final: torch.Tensor
    mask: torch.Tensor

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def batch(self, rows: torch.Tensor) -> EagleBatch:
        return EagleBatch(self.tokens[rows], self.features[rows], self.mask[rows], self.final[rows])


@dataclass
class EagleBatch:
    """One training batch (see ``EagleDataset``); ``final`` may be None for EAGLE-1 (then = features).

    Alignment: ``features[n, t]`` (and ``final[n, t]``) is the target state after reading ``tokens[n, t]``
    (the state that predicts ``tokens[n, t + 1]``). The engine's ``hidden_sink`` reports each state with
    the token that *follows* it, so a buffer fed by the sink shifts tokens by one position.
    """

    tokens: torch.Tensor
    features: torch.Tensor
    mask: torch.Tensor
    final: torch.Tensor | None = None


@torch.no_grad()
def record_features(
    target: Transformer,
    sequences: Sequence[Sequence[int]] | torch.Tensor,
    feature_layers: Sequence[int] | None = None,
    batch_size: int = 16,
) -> EagleDataset:
    """Run the target over token sequences and keep what the trainer needs.

    Args:
        target: the policy.
        sequences: token lists (any lengths) or a ``[N, T]`` tensor.
        feature_layers: engine hidden indices to record as features (default: the final normed state, i.e.
            EAGLE-1); for EAGLE-3 pass ``EagleDraftModel.feature_layers``.
        batch_size: sequences per target forward.

    Returns:
        ``EagleDataset`` on CPU (float32), right-padded with mask.
    """
    L = target.config.num_hidden_layers
    layers = tuple(feature_layers) if feature_layers is not None else (L,)
    seqs = [list(map(int, s)) for s in (sequences.tolist() if torch.is_tensor(sequences) else sequences)]
    seqs = [s for s in seqs if len(s) >= 2]
    if not seqs:
        raise ValueError("record_features needs at least one sequence of >= 2 tokens")
    t = max(len(s) for s in seqs)
    n = len(seqs)
    tokens = torch.zeros(n, t, dtype=torch.long)
    mask = torch.zeros(n, t, dtype=torch.bool)
    for i, s in enumerate(seqs):
        tokens[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = True
    h = target.config.hidden_size
    shape = (n, t, h) if len(layers) == 1 else (n, t, len(layers), h)
    features = torch.zeros(shape)
    final = torch.zeros(n, t, h)
    dev = next(target.parameters()).device
    for s in range(0, n, batch_size):
        ids = tokens[s : s + batch_size].to(dev)
        out = target(ids, hidden_layers=tuple(set(layers) | {L}))
        hs = [out.hidden[i].float().cpu() for i in layers]
        features[s : s + batch_size] = hs[0] if len(layers) == 1 else torch.stack(hs, 2)
        final[s : s + batch_size] = out.hidden[L].float().cpu()
    return EagleDataset(tokens, features, final, mask)


# ---------------------------------------------------------------------------------------------- trainer
class EagleTrainer:
    """Offline warm-up and the spot trainer's step function for an ``EagleDraftModel``.

    Args:
        model: the draft head (trained in place).
        target: the policy (frozen embedding and LM head are read through ``.detach()``).
        lr, weight_decay, betas: AdamW.
        ce_weight: weight of the soft cross-entropy next to SmoothL1 (EAGLE-1: 0.1). EAGLE-3 uses CE alone.
        feature_weight: weight of the SmoothL1 feature regression (EAGLE-1 only).
        train_depth: unrolled draft steps per start position (training-time test); 1 = plain EAGLE-1.
        step_decay: loss weight of unrolled step j is ``step_decay ** j``.
        context: ``"chain"`` (default) = each start position is its own short draft, exactly the context the
            drafter sees in ``propose``; ``"prefix"`` = standard EAGLE teacher forcing with causal attention
            over the whole recorded sequence (what vLLM/SGLang run, whose draft KV covers the prefix);
            needs ``train_depth == 1``.
        grad_clip: max gradient norm (EAGLE: 0.5).
        feature_noise: uniform noise ``U(-a, a)`` added to the target features (EAGLE-1 used 0.1 on raw
            states); 0 disables.
        seed: minibatch sampling and noise seed.
    """

    def __init__(
        self,
        model: EagleDraftModel,
        target: Transformer,
        lr: float = 3e-4,
        weight_decay: float = 0.0,
        betas: tuple[float, float] = (0.9, 0.95),
        ce_weight: float = 0.1,
        feature_weight: float = 1.0,
        train_depth: int = 2,
        step_decay: float = 0.8,
        context: str = "chain",
        grad_clip: float = 0.5,
        feature_noise: float = 0.0,
        seed: int = 0,
    ):
        if context not in ("chain", "prefix"):
            raise ValueError(f"context must be 'chain' or 'prefix', got {context!r}")
        if train_depth < 1 or (context == "prefix" and train_depth != 1):
            raise ValueError(f"train_depth must be >= 1 (and 1 with context='prefix'), got {train_depth}")
        self.model = model
        self.target = target
        self.ce_weight = ce_weight
        self.feature_weight = feature_weight
        self.train_depth = train_depth
        self.step_decay = step_decay
        self.context = context
        self.grad_clip = grad_clip
        self.feature_noise = feature_noise
        self.gen = torch.Generator().manual_seed(seed)
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=betas, weight_decay=weight_decay)
        self.steps = 0
        self.history: list[dict] = []

    def record_features(self, sequences, batch_size: int = 16) -> EagleDataset:
        """``record_features(target, sequences, model.feature_layers)``."""
        return record_features(self.target, sequences, self.model.feature_layers, batch_size)

    # ------------------------------------------------------------------ loss
    @staticmethod
    def _as_batch(batch) -> EagleBatch:
        if isinstance(batch, EagleBatch):
            return batch
        if isinstance(batch, dict):
            return EagleBatch(batch["tokens"], batch["features"], batch["mask"], batch.get("final"))
        return EagleBatch(*batch)

    def _prepare(self, batch) -> EagleBatch:
        b = self._as_batch(batch)
        p = next(self.model.parameters())

        def mv(x, dtype=None):
            if x is None:
                return None
            x = x.clone() if x.is_inference() else x  # engine/sink tensors are inference tensors
            return x.to(p.device, dtype if dtype is not None else x.dtype)

        final = b.final
        if final is None:
            if self.model.is_eagle3:
                raise ValueError("EAGLE-3 training needs the target's final hidden states (batch.final)")
            final = b.features
        return EagleBatch(
            mv(b.tokens, torch.long), mv(b.features, p.dtype), mv(b.mask, torch.bool), mv(final, p.dtype)
        )

    def _losses(self, b: EagleBatch) -> tuple[torch.Tensor, dict]:
        model, target = self.model, self.target
        tokens, feats, mask, final = b.tokens, b.features, b.mask, b.final
        n, t = tokens.shape
        if t < 2:
            raise ValueError("sequences must have at least 2 positions")
        if self.feature_noise > 0:
            noise = torch.rand(feats.shape, generator=self.gen) * 2 - 1
            feats = feats + (noise * self.feature_noise).to(feats.device, feats.dtype)
        fused = model.fuse(feats)  # [N, T, H]
        hdim = fused.shape[-1]
        steps = []  # (h [*, H], target final [*, H], valid [*])
        if self.context == "prefix":
            e = _embed(target, tokens[:, 1:])
            h = model(e, fused[:, :-1])
            steps.append((h, final[:, 1:], mask[:, :-1] & mask[:, 1:]))
        else:
            s = t - 1  # start positions 0..T-2
            start = torch.arange(s, device=tokens.device)
            emb_in, feat_in = [], []
            feat = fused[:, :-1].reshape(n * s, 1, hdim)
            for j in range(self.train_depth):
                tgt_idx = (start + 1 + j).clamp(max=t - 1)
                valid = (start + 1 + j <= t - 1).unsqueeze(0) & mask[:, :-1] & mask[:, tgt_idx]
                emb_in.append(_embed(target, tokens[:, tgt_idx]).reshape(n * s, 1, hdim))
                feat_in.append(feat)
                h = model(torch.cat(emb_in, 1), torch.cat(feat_in, 1))[:, -1:]  # [N*S, 1, H]
                steps.append((h.view(n, s, hdim), final[:, tgt_idx], valid))
                feat = h
        total = 0.0
        wsum = 0.0
        parts = {"feature_loss": 0.0, "ce_loss": 0.0, "top1_by_depth": []}
        tokens_valid = 0
        for j, (h, tgt, valid) in enumerate(steps):
            w = self.step_decay**j
            v = valid.float()
            cnt = v.sum().clamp(min=1.0)
            with torch.no_grad():
                p_tgt = torch.softmax(F.linear(tgt, target.lm_head.weight.detach()).float(), dim=-1)
            logp = torch.log_softmax(_logits(target, model, h).float(), dim=-1)
            ce = (-(p_tgt * logp).sum(-1) * v).sum() / cnt
            if model.is_eagle3:
                loss_j = ce
                fl = torch.zeros((), device=ce.device)
            else:
                fl = (F.smooth_l1_loss(h.float(), tgt.float(), reduction="none").mean(-1) * v).sum() / cnt
                loss_j = self.feature_weight * fl + self.ce_weight * ce
            total = total + w * loss_j
            wsum += w
            with torch.no_grad():
                agree = ((logp.argmax(-1) == p_tgt.argmax(-1)).float() * v).sum() / cnt
            parts["top1_by_depth"].append(float(agree))
            if j == 0:
                parts["feature_loss"] = float(fl.detach())
                parts["ce_loss"] = float(ce.detach())
                tokens_valid = int(valid.sum())
        loss = total / wsum
        parts["loss"] = float(loss.detach())
        parts["top1"] = parts["top1_by_depth"][0]
        parts["tokens"] = tokens_valid
        return loss, parts

    def train_step(self, batch) -> dict:
        """One AdamW step on ``batch`` (``EagleBatch``, dict or tuple ``(tokens, features, mask[, final])``).

        Returns ``{"loss", "feature_loss", "ce_loss", "top1", "top1_by_depth", "tokens", "grad_norm",
        "step"}`` (loss parts and top-1 agreement of the first draft step; ``top1_by_depth`` per unrolled
        step), measured before the update.
        """
        self.model.train()
        b = self._prepare(batch)
        loss, parts = self._losses(b)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        self.optimizer.step()
        self.model.eval()
        self.steps += 1
        parts["grad_norm"] = float(gn)
        parts["step"] = self.steps
        self.history.append(parts)
        return parts

    @torch.no_grad()
    def evaluate(self, batch) -> dict:
        """The ``train_step`` metrics without an update."""
        self.model.eval()
        return self._losses(self._prepare(batch))[1]

    def fit(self, data: EagleDataset, steps: int, batch_size: int = 16) -> list[dict]:
        """``steps`` train steps on random minibatches of ``data``; returns their metrics."""
        out = []
        for _ in range(steps):
            rows = torch.randint(len(data), (min(batch_size, len(data)),), generator=self.gen)
            out.append(self.train_step(data.batch(rows)))
        return out


def warmup(
    target: Transformer,
    sequences: Sequence[Sequence[int]] | torch.Tensor,
    steps: int = 200,
    model: EagleDraftModel | None = None,
    config: EagleConfig | None = None,
    batch_size: int = 16,
    **trainer_kw,
) -> EagleTrainer:
    """Offline warm-up: record the target's states over ``sequences`` and train a draft head on them.

    Returns the ``EagleTrainer`` (``.model`` is the trained head, ``.history`` the per-step metrics).
    """
    model = model if model is not None else EagleDraftModel(target.config, config)
    p = next(target.parameters())
    model.to(device=p.device, dtype=p.dtype)
    trainer = EagleTrainer(model, target, **trainer_kw)
    data = trainer.record_features(sequences)
    trainer.fit(data, steps, batch_size)
    return trainer


# ---------------------------------------------------------------------------------------------- checkpoints
def save_eagle_checkpoint(
    model: EagleDraftModel,
    path: str | os.PathLike,
    target: Transformer | ModelConfig,
    engine: str = "vllm",
    include_embeddings: bool = False,
) -> None:
    """Write the draft head as an EAGLE checkpoint folder: ``config.json`` + ``model.safetensors``.

    Layout (draft layer = a 1-layer Llama, the layout of SafeAILab's EAGLE checkpoints):

    * EAGLE-1, ``engine="vllm"``: ``architectures ["LlamaForCausalLM"]`` (vLLM's ``EAGLEConfig`` with
      ``method="eagle"`` maps it to ``EagleLlamaForCausalLM``), ``"bias": false``. Keys ``fc.weight [H, 2H]``
      (input = ``concat(embed, hidden)``), ``layers.0.self_attn.{q,k,v,o}_proj.weight``,
      ``layers.0.mlp.{gate,up,down}_proj.weight``, ``layers.0.post_attention_layernorm.weight`` (no
      ``input_layernorm``: EAGLE-1 has none). No embedding or LM head: both engines share the target's.
    * EAGLE-1, ``engine="sglang"``: ``architectures ["LlamaForCausalLMEagle"]`` and an all-zero ``fc.bias``
      (SGLang builds ``fc`` with a bias; zeros keep the function identical). vLLM's loader rejects that key.
    * EAGLE-3 (either engine): ``architectures ["LlamaForCausalLMEagle3"]``, keys ``fc.weight [H, kH]``,
      ``midlayer.self_attn.{q,k,v}_proj.weight [*, 2H]``, ``midlayer.self_attn.o_proj.weight``,
      ``midlayer.mlp.*``, ``midlayer.{input_layernorm,hidden_norm,post_attention_layernorm}.weight``,
      ``norm.weight`` and, when ``target`` is a ``Transformer``, ``lm_head.weight`` (a copy of the target's:
      EAGLE-3 engines give the draft its own head) with ``draft_vocab_size = vocab_size`` (no d2t/t2d map);
      given only a ``ModelConfig``, neither is written (SGLang then loads the head from the target; whether
      a given vLLM version shares the target's head for such a checkpoint was not verified).
      ``target_hidden_size`` is set. When ``fuse_layers`` differ from EAGLE-3's default, ``eagle_config.
      eagle_aux_hidden_state_layer_ids`` (top level too) = ``fuse_layers + 1`` in vLLM's convention (the index
      of the target layer whose *input* is taken); SGLang reads the same key as layer *outputs* (it adds 1
      itself), so for SGLang such a checkpoint captures one layer higher - keep the default layers there.
      The final normed state (index L) cannot be exported (engines tap the residual stream only).
    * Always: ``tailspec_eagle`` = ``EagleConfig`` plus the target's architecture and depth, so
      ``load_eagle_checkpoint`` restores the head exactly. ``tie_word_embeddings`` is false.

    Verified against: vLLM's ``llama_eagle.py`` / ``llama_eagle3.py`` / ``EAGLEConfig`` / model registry and
    SGLang's ``llama_eagle.py`` / ``llama_eagle3.py`` source (read, not run: no vLLM/SGLang in this
    environment). Not verified by loading in either engine. Note that in those engines the draft layer's KV
    cache covers the whole prefix; a head trained with ``context="chain"`` has only seen draft-local context.

    Args:
        model: the draft head.
        path: output folder (created).
        target: the target ``Transformer`` (needed for EAGLE-3's ``lm_head`` and ``include_embeddings``) or
            its ``ModelConfig``.
        engine: ``"vllm"`` or ``"sglang"`` (only EAGLE-1 differs).
        include_embeddings: also write ``embed_tokens.weight`` (a copy of the target's; engines ignore it when
            they share the target's embedding, as vLLM and SGLang do without pipeline parallelism).
    """
    if engine not in ("vllm", "sglang"):
        raise ValueError(f"engine must be 'vllm' or 'sglang', got {engine!r}")
    tmodel = target if isinstance(target, Transformer) else None
    tcfg = target.config if isinstance(target, Transformer) else target
    cfg, lc = model.config, model.layer_config
    L = tcfg.num_hidden_layers
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    dtype = next(iter(state.values())).dtype
    d = {
        "model_type": "llama",
        "vocab_size": tcfg.vocab_size,
        "hidden_size": tcfg.hidden_size,
        "intermediate_size": lc.intermediate_size,
        "num_hidden_layers": 1,
        "num_attention_heads": lc.num_attention_heads,
        "num_key_value_heads": lc.num_key_value_heads,
        "head_dim": lc.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": lc.rms_norm_eps,
        "rope_theta": lc.rope_theta,
        "rope_parameters": {"rope_theta": lc.rope_theta, "rope_type": "default"},
        "max_position_embeddings": tcfg.max_position_embeddings,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": tcfg.bos_token_id,
        "eos_token_id": tcfg.eos_token_id,
        "pad_token_id": tcfg.pad_token_id,
        "torch_dtype": str(dtype).removeprefix("torch."),
    }
    if model.is_eagle3:
        fl = cfg.fuse_layers
        if fl[-1] >= L:
            raise ValueError(
                f"fuse_layers {fl}: index {fl[-1]} is not a residual-stream tap an EAGLE-3 engine can take "
                f"(layer outputs 0..{L - 2} only); choose lower layers to export"
            )
        d["architectures"] = [EAGLE3_ARCH]
        d["target_hidden_size"] = tcfg.hidden_size
        eagle_cfg: dict = {"use_aux_hidden_state": True}
        if tuple(fl) != default_fuse_layers(L):
            ids = [i + 1 for i in fl]
            d["eagle_aux_hidden_state_layer_ids"] = ids
            eagle_cfg["eagle_aux_hidden_state_layer_ids"] = ids
        d["eagle_config"] = eagle_cfg
        state = {
            ("midlayer." + k[len("layers.0.") :] if k.startswith("layers.0.") else k): v
            for k, v in state.items()
        }
        if tmodel is not None:
            state["lm_head.weight"] = tmodel.lm_head.weight.detach().to(dtype).contiguous().cpu().clone()
            d["draft_vocab_size"] = tcfg.vocab_size
    else:
        d["architectures"] = [EAGLE1_ARCH_VLLM if engine == "vllm" else EAGLE1_ARCH_SGLANG]
        d["bias"] = bool(cfg.fc_bias or engine == "sglang")
        if engine == "sglang" and "fc.bias" not in state:
            state["fc.bias"] = torch.zeros(tcfg.hidden_size, dtype=dtype)
        if engine == "vllm" and "fc.bias" in state:
            raise ValueError("vLLM's EagleLlamaForCausalLM has no fc.bias; train with fc_bias=False for vLLM")
    if include_embeddings:
        if tmodel is None:
            raise ValueError("include_embeddings needs the target Transformer, not only its config")
        state["embed_tokens.weight"] = (
            tmodel.model.embed_tokens.weight.detach().to(dtype).contiguous().cpu().clone()
        )
    d["tailspec_eagle"] = {
        "format": "eagle3" if model.is_eagle3 else "eagle1",
        "config": cfg.to_dict(),
        "target_architecture": tcfg.architecture,
        "target_num_hidden_layers": L,
    }
    os.makedirs(path, exist_ok=True)
    tmp = os.path.join(path, "model.safetensors.tmp")
    save_file(state, tmp, metadata={"format": "pt"})
    os.replace(tmp, os.path.join(path, "model.safetensors"))
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(d, f, indent=2)


def _read_weights(path: str) -> dict[str, torch.Tensor]:
    st = os.path.join(path, "model.safetensors")
    if os.path.isfile(st):
        return load_file(st)
    pt = os.path.join(path, "pytorch_model.bin")
    if os.path.isfile(pt):
        return torch.load(pt, map_location="cpu", weights_only=True)
    raise ModelLoadError(f"{path!r} has neither model.safetensors nor pytorch_model.bin")


def load_eagle_checkpoint(path: str | os.PathLike, target: Transformer) -> EagleDraftModel:
    """Load an EAGLE-1 or EAGLE-3 draft head for ``target`` (ours, or a public 1-layer Llama EAGLE one).

    Accepts ``model.safetensors`` or ``pytorch_model.bin``; keys with or without ``model.``; ``layers.0.`` or
    ``midlayer.``. ``embed_tokens``/``lm_head`` in the file are ignored (the target's are used; a differing
    ``lm_head`` is logged). Raises ``ModelLoadError`` for a missing folder, a width/vocabulary mismatch, a
    reduced draft vocabulary (non-trivial ``d2t``) or missing/unexpected weights. The head is returned on
    the target's device and dtype, in eval mode.
    """
    path = os.fspath(path)
    cfg_path = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_path):
        raise ModelLoadError(f"{path!r} has no config.json")
    with open(cfg_path) as f:
        d = json.load(f)
    tcfg = target.config
    for key in ("hidden_size", "vocab_size"):
        if key in d and d[key] != getattr(tcfg, key):
            raise ModelLoadError(f"{cfg_path}: {key} {d[key]} != target's {getattr(tcfg, key)}")
    raw = _read_weights(path)
    state: dict[str, torch.Tensor] = {}
    extra: dict[str, torch.Tensor] = {}
    for k, v in raw.items():
        k = k.removeprefix("model.")
        if k.startswith("midlayer."):
            k = "layers.0." + k[len("midlayer.") :]
        if k in ("embed_tokens.weight", "lm_head.weight", "d2t", "t2d"):
            extra[k] = v
        else:
            state[k] = v
    if "d2t" in extra and bool(extra["d2t"].ne(0).any()):
        raise ModelLoadError(f"{path}: reduced draft vocabulary (d2t) is not supported")
    if "lm_head.weight" in extra and not torch.equal(
        extra["lm_head.weight"].float(), target.lm_head.weight.detach().float().cpu()
    ):
        log.warning("%s: checkpoint lm_head differs from the target's; the target's head is used", path)
    ours = d.get("tailspec_eagle") or {}
    if "config" in ours:
        ecfg = EagleConfig.from_dict(ours["config"])
    else:
        fc = state.get("fc.weight")
        if fc is None:
            raise ModelLoadError(f"{path}: no fc.weight")
        k = fc.shape[1] // tcfg.hidden_size
        fuse = None
        if k != 2 or "layers.0.hidden_norm.weight" in state:
            ec = d.get("eagle_config") or {}
            ids = d.get("eagle_aux_hidden_state_layer_ids") or ec.get("eagle_aux_hidden_state_layer_ids")
            fuse = tuple(i - 1 for i in ids) if ids else default_fuse_layers(tcfg.num_hidden_layers)
            if len(fuse) != k:
                raise ModelLoadError(f"{path}: fc reads {k} layers but {len(fuse)} aux layers are configured")
        ecfg = EagleConfig(
            fuse_layers=fuse,
            fc_bias="fc.bias" in state and fuse is None,
            intermediate_size=d.get("intermediate_size"),
            num_attention_heads=d.get("num_attention_heads"),
            num_key_value_heads=d.get("num_key_value_heads"),
            head_dim=d.get("head_dim"),
            rope_theta=d.get("rope_theta"),
            rms_norm_eps=d.get("rms_norm_eps"),
        )
    if ecfg.fuse_layers is None and "fc.bias" in state and not ecfg.fc_bias:
        if bool(state["fc.bias"].ne(0).any()):
            ecfg.fc_bias = True
        else:
            state.pop("fc.bias")  # the zero bias written for SGLang
    try:
        model = EagleDraftModel(tcfg, ecfg)
    except ValueError as e:
        raise ModelLoadError(f"{path}: {e}") from None
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ModelLoadError(f"{path}: missing {sorted(missing)[:6]} unexpected {sorted(unexpected)[:6]}")
    p = next(target.parameters())
    return model.to(device=p.device, dtype=p.dtype).eval()


# ---------------------------------------------------------------------------------------------- CLI
def _main(argv=None) -> None:
    import argparse
    import random

    from services.rollout_actor.engine import Engine, GenerationRequest, SamplingParams

    ap = argparse.ArgumentParser(description="Warm up an EAGLE draft head on the target's own greedy outputs")
    ap.add_argument("--model", required=True, help="HF model folder of the target")
    ap.add_argument("--out", required=True, help="output folder for the EAGLE checkpoint")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--eagle3", action="store_true", help="fuse three layers (EAGLE-3) instead of EAGLE-1")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--engine", default="vllm", choices=["vllm", "sglang"])
    args = ap.parse_args(argv)
    target = Transformer.from_pretrained(args.model)
    rng = random.Random(0)
    v = target.config.vocab_size
    reqs = [
        GenerationRequest(
            str(i), [rng.randrange(v) for _ in range(4)], SamplingParams(0.0, max_new_tokens=args.new_tokens)
        )
        for i in range(args.prompts)
    ]
    outs = Engine(target, max_batch_size=32, max_seq_len=args.new_tokens + 8, eos_token_ids=[]).generate(reqs)
    seqs = [o.prompt_ids + o.token_ids for o in outs]
    cfg = EagleConfig(
        fuse_layers=default_fuse_layers(target.config.num_hidden_layers) if args.eagle3 else None
    )
    tr = warmup(target, seqs, args.steps, config=cfg, lr=args.lr)
    h = tr.history
    print(f"top1 {h[0]['top1']:.3f} -> {sum(x['top1'] for x in h[-10:]) / min(10, len(h)):.3f}")
    save_eagle_checkpoint(tr.model, args.out, target, engine=args.engine)
    print(f"saved {args.out}")


if __name__ == "__main__":
    _main()
