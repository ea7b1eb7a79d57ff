"""Training the EAGLE draft head on recorded target states: ``record_features``, ``EagleTrainer``,
``warmup``, and a command line that warms a head up on the target's own greedy outputs.

Contract
--------
* ``EagleTrainer.train_step(batch)`` on recorded target states (``record_features``): ``tokens [N, T]``,
  ``features [N, T, H]`` (EAGLE-1) or ``[N, T, k, H]`` (EAGLE-3), ``mask [N, T]``, optional ``final
  [N, T, H]`` (the target's final normed state; EAGLE-1 features are it). From ``(feature_t, token_{t+1})``
  predict ``f_{t+1}``; unrolled ``train_depth`` steps on the drafter's own features (EAGLE-3's training-time
  test). Loss per step: EAGLE-1 ``SmoothL1(h, f_{t+1}) + ce_weight * CE(softmax(lm_head(f_{t+1})),
  lm_head(h))`` (``ce_weight = 0.1`` as in EAGLE-1); EAGLE-3 the soft cross-entropy alone. Steps are
  weighted ``step_decay ** j``. AdamW, gradient clipping. Returns the loss parts and the top-1 agreement
  (draft argmax == target argmax), overall and per unrolled step.

Run:

    python -m services.rollout_actor.speculative.eagle_train --model <hf model folder> --out runs/eagle --steps 300
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from services.rollout_actor.engine import Engine, GenerationRequest, SamplingParams
from services.rollout_actor.model import Transformer
from services.rollout_actor.speculative.eagle_checkpoint import save_eagle_checkpoint
from services.rollout_actor.speculative.eagle_model import (
    EagleConfig,
    EagleDraftModel,
    default_fuse_layers,
    draft_logits,
    target_embed,
)


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
            e = target_embed(target, tokens[:, 1:])
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
                emb_in.append(target_embed(target, tokens[:, tgt_idx]).reshape(n * s, 1, hdim))
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
            logp = torch.log_softmax(draft_logits(target, model, h).float(), dim=-1)
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


__all__ = ["EagleBatch", "EagleDataset", "EagleTrainer", "record_features", "warmup"]


# ---------------------------------------------------------------------------------------------- CLI
def _main(argv=None) -> None:
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
