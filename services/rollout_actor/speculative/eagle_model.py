"""The EAGLE draft head: ``EagleConfig`` and ``EagleDraftModel`` (one decoder layer over the target's own
hidden states), shared by the drafter (``eagle.py``), its trainer (``eagle_train.py``) and its checkpoints
(``eagle_checkpoint.py``).

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
* ``target_embed`` / ``draft_logits``: the target's frozen embedding and LM head applied through
  ``.detach()`` (never trained, never copied).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import torch
import torch.nn.functional as F
from torch import nn

from services.rollout_actor.model import DecoderLayer, ModelConfig, RMSNorm, Transformer, rope_cos_sin


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


def target_embed(target: Transformer, ids: torch.Tensor) -> torch.Tensor:
    return F.embedding(ids, target.model.embed_tokens.weight.detach())


def draft_logits(target: Transformer, model: EagleDraftModel, h: torch.Tensor) -> torch.Tensor:
    return F.linear(model.head_input(h), target.lm_head.weight.detach())


__all__ = ["EagleConfig", "EagleDraftModel", "default_fuse_layers", "draft_logits", "target_embed"]
