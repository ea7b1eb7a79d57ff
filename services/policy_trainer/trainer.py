"""The GRPO policy trainer: rollouts in, one versioned policy update out.

``PolicyTrainer.train_step(samples)`` takes the step's rollouts (prompt ids, response ids, the response's
group-normalized advantage) and

1. builds right-padded sequences ``prompt + response``; the loss mask covers the response tokens only
   (targets at positions ``len(prompt) .. len(seq) - 1``; prompt and padding never count);
2. computes ``old_logprobs`` with the current policy under ``no_grad`` (GRPO's pi_old: the policy that
   generated the rollouts, so the first pass has ratio exactly 1) and, when ``kl_coef > 0``, the reference
   policy's log-probs;
3. runs ``updates_per_step`` passes; each pass shuffles the sequences into micro-batches of
   ``micro_batch_size``, accumulates gradients so that the pass's loss is the token-mean over ALL response
   tokens of the pass (DAPO's token-level loss, see ``grpo.py``), clips the gradient norm to
   ``max_grad_norm`` and takes one optimizer step.

The optimizer lives behind a small backend interface (``forward`` / ``backward`` / ``step`` / ``zero_grad``
/ ``state``): ``_TorchBackend`` (``torch.optim.AdamW``) and ``_DeepSpeedBackend`` (DeepSpeed ZeRO stage 1 or
2, fp32; on a machine without a GPU it runs on CPU over a one-process gloo group).
"""

from __future__ import annotations

import copy
import math
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from services.common.config import TrainerConfig
from services.policy_trainer.grpo import grpo_loss, token_logprobs
from services.rollout_actor.model import Transformer

__all__ = ["RolloutSample", "PolicyTrainer"]


@dataclass
class RolloutSample:
    """One response of a GRPO group, as token ids, with its group-normalized advantage."""

    prompt_ids: list[int]
    response_ids: list[int]
    advantage: float


# ---------------------------------------------------------------------------------------------- backends


class _TorchBackend:
    """Plain PyTorch: AdamW, gradient clipping with ``clip_grad_norm_``."""

    name = "torch"

    def __init__(self, model: nn.Module, cfg: TrainerConfig):
        self.model = model
        self.max_grad_norm = cfg.max_grad_norm
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            self.params, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay
        )
        self.steps = 0

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids).logits

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self) -> float:
        """Clip (if ``max_grad_norm > 0``), step, return the pre-clip global grad norm."""
        max_norm = self.max_grad_norm if self.max_grad_norm and self.max_grad_norm > 0 else math.inf
        norm = torch.nn.utils.clip_grad_norm_(self.params, max_norm)
        self.optimizer.step()
        self.steps += 1
        return float(norm)

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def state(self) -> dict[str, Any]:
        return {"backend": self.name, "optimizer_steps": self.steps, "optimizer": self.optimizer.state_dict()}

    def checkpoint_globals(self) -> list:
        """Classes besides tensors and plain data in the optimizer's state dict (none for AdamW)."""
        return []


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ensure_single_process_group() -> None:
    """Initialize a world_size-1 torch.distributed group (gloo, localhost) unless one exists.

    Sets ``MASTER_ADDR`` (127.0.0.1), ``MASTER_PORT`` (a free port), ``RANK``/``LOCAL_RANK`` (0) and
    ``WORLD_SIZE`` (1) where they are unset; DeepSpeed reads them too.
    """
    import torch.distributed as dist

    if dist.is_initialized():
        return
    if os.environ.get("WORLD_SIZE", "1") != "1":
        raise RuntimeError(
            f"WORLD_SIZE={os.environ['WORLD_SIZE']} is set but torch.distributed is not "
            "initialized; the DeepSpeed backend only sets up a single-process group itself"
        )
    defaults = {"MASTER_ADDR": "127.0.0.1", "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}
    for key, value in defaults.items():
        os.environ.setdefault(key, value)
    if "MASTER_PORT" not in os.environ:
        os.environ["MASTER_PORT"] = str(_free_port())
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend=backend, init_method="env://", rank=0, world_size=1)


def _skip_cpu_shm_comm_build(deepspeed) -> None:
    """On CPU, DeepSpeed's torch comm backend JIT-compiles its shared-memory allreduce op
    (``deepspeed_shm_comm``, ~90 s with g++, and a crash without a compiler) when it first wraps the
    process group. That op only speeds up multi-process CPU collectives; with world size 1 mark it
    incompatible in ``deepspeed.ops.__compatible_ops__`` (DeepSpeed's module-level op probe cache, which
    ``build_shm_op`` consults and whose edits persist by design), so DeepSpeed uses plain torch.distributed
    (gloo) collectives."""
    import torch.distributed as dist

    if torch.cuda.is_available() or dist.get_world_size() != 1:
        return
    try:
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    except Exception:  # a DeepSpeed without this probe cache: let it build the op
        pass


class _DeepSpeedBackend:
    """DeepSpeed ZeRO stage 1/2 in fp32 with a client ``torch.optim.AdamW`` (no DeepSpeed op is compiled).

    Gradient accumulation is caller-owned (``managed_gradient_accumulation: false``): ``backward`` only
    accumulates, ``step`` reduces, clips (``gradient_clipping`` in the DeepSpeed config) and updates, so the
    number of micro-batches per pass may vary between steps.
    """

    name = "deepspeed"

    def __init__(self, model: nn.Module, cfg: TrainerConfig):
        import deepspeed

        if cfg.zero_stage not in (1, 2):
            raise ValueError(f"zero_stage must be 1 or 2, got {cfg.zero_stage}")
        _ensure_single_process_group()
        _skip_cpu_shm_comm_build(deepspeed)
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(
            params, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay
        )
        clip = float(cfg.max_grad_norm) if cfg.max_grad_norm and cfg.max_grad_norm > 0 else 0.0  # 0: off
        ds_config = {
            "train_micro_batch_size_per_gpu": cfg.micro_batch_size,
            "gradient_accumulation_steps": 1,
            "managed_gradient_accumulation": False,
            "gradient_clipping": clip,
            "zero_optimization": {"stage": cfg.zero_stage, "overlap_comm": False},
            "zero_allow_untested_optimizer": True,
            "fp16": {"enabled": False},
            "bf16": {"enabled": False},
            "steps_per_print": 2**31 - 1,
            "wall_clock_breakdown": False,
        }
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=model, optimizer=optimizer, model_parameters=params, config=ds_config
        )
        self.steps = 0

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.engine(input_ids).logits

    def backward(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss, scale_wrt_gas=False)

    def step(self) -> float:
        """Reduce, clip, step; return the global grad norm DeepSpeed computed (pre-clip; NaN if unavailable)."""
        self.engine.step()
        self.steps += 1
        norm = self.engine.get_global_grad_norm()
        return float(norm) if norm is not None else math.nan

    def zero_grad(self) -> None:
        self.engine.zero_grad()
        self.optimizer.zero_grad()

    def state(self) -> dict[str, Any]:
        return {
            "backend": self.name,
            "optimizer_steps": self.steps,
            "zero_stage": self.engine.zero_optimization_stage(),
            "optimizer": self.optimizer.state_dict(),
        }

    def checkpoint_globals(self) -> list:
        """DeepSpeed classes in the ZeRO optimizer's state dict, allowed by name when a checkpoint is read
        (``torch.load(weights_only=True)`` constructs nothing else)."""
        from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
        from deepspeed.runtime.zero.config import ZeroStageEnum
        from deepspeed.utils.tensor_fragment import fragment_address

        return [LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address]


# ---------------------------------------------------------------------------------------------- trainer


class PolicyTrainer:
    """GRPO updates of a ``Transformer`` policy (see the module docstring for the algorithm).

    Args:
        model: the policy, trained in place (its device is used for all tensors).
        cfg: ``TrainerConfig`` (lr, betas, weight_decay, max_grad_norm, micro_batch_size, updates_per_step,
            clip_eps, kl_coef, backend, zero_stage).
        reference: the frozen reference policy for the k3 KL term. Used only when ``cfg.kl_coef > 0``; if it
            is None then, a frozen copy of ``model`` as given (the initial policy) is made.
        seed: seeds the micro-batch shuffling.
    """

    def __init__(
        self, model: Transformer, cfg: TrainerConfig, reference: Transformer | None = None, seed: int = 0
    ):
        self.model = model
        self.cfg = cfg
        self.version = 0
        self._gen = torch.Generator().manual_seed(seed)
        self.reference: Transformer | None = None
        if cfg.kl_coef > 0:
            self.reference = reference if reference is not None else copy.deepcopy(model)
            self.reference.eval()
            for p in self.reference.parameters():
                p.requires_grad_(False)
        if cfg.backend == "torch":
            self._backend: _TorchBackend | _DeepSpeedBackend = _TorchBackend(model, cfg)
        elif cfg.backend == "deepspeed":
            self._backend = _DeepSpeedBackend(model, cfg)
        else:
            raise ValueError(f"unknown trainer backend {cfg.backend!r} (expected 'torch' or 'deepspeed')")
        pad = model.config.pad_token_id
        self.pad_id = pad if isinstance(pad, int) and 0 <= pad < model.config.vocab_size else 0

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # ------------------------------------------------------------------ batching
    def _build_batch(self, samples: list[RolloutSample]):
        """inputs/targets ``[N, T]`` (right-padded, ``T = max len - 1``), mask ``[N, T]`` float over response
        targets, per-row valid length ``[N]``, advantages ``[N]``."""
        seqs = [list(s.prompt_ids) + list(s.response_ids) for s in samples]
        t = max(len(s) for s in seqs) - 1
        if t < 1:
            raise ValueError("every sequence has fewer than 2 tokens: nothing to train on")
        n = len(seqs)
        inputs = torch.full((n, t), self.pad_id, dtype=torch.long)
        targets = torch.full((n, t), self.pad_id, dtype=torch.long)
        mask = torch.zeros(n, t)
        lengths = torch.zeros(n, dtype=torch.long)
        for i, (s, seq) in enumerate(zip(samples, seqs)):
            L = len(seq) - 1
            if L <= 0:
                continue
            row = torch.as_tensor(seq, dtype=torch.long)
            inputs[i, :L] = row[:-1]
            targets[i, :L] = row[1:]
            # target position j predicts seq[j + 1]: a response token iff j + 1 >= len(prompt)
            mask[i, max(len(s.prompt_ids) - 1, 0) : L] = 1.0
            lengths[i] = L
        adv = torch.tensor([float(s.advantage) for s in samples])
        dev = self.device
        return inputs.to(dev), targets.to(dev), mask.to(dev), lengths, adv.to(dev)

    def _micro_batches(self, order: torch.Tensor) -> list[torch.Tensor]:
        mb = max(1, int(self.cfg.micro_batch_size))
        return [order[i : i + mb] for i in range(0, len(order), mb)]

    @torch.no_grad()
    def _logprobs(self, model: nn.Module, batches, inputs, targets, lengths) -> torch.Tensor:
        """``[N, T]`` log-probs of ``targets`` under ``model`` (which may sit on another device), computed in
        the given micro-batch layout; zeros past each row's length."""
        dev = next(model.parameters()).device
        out = torch.zeros(inputs.shape, dtype=torch.float32, device=inputs.device)
        for rows in batches:
            tm = int(lengths[rows].max())
            r = rows.to(inputs.device)
            ids, tg = inputs[r, :tm].to(dev), targets[r, :tm].to(dev)
            out[r, :tm] = token_logprobs(model(ids).logits, tg).to(out.device)
        return out

    # ------------------------------------------------------------------ the update
    def train_step(self, samples: list[RolloutSample]) -> dict[str, float]:
        """One GRPO update on the step's rollouts; ``version`` += 1.

        Returns:
            stats averaged over the ``updates_per_step`` passes: ``loss`` (token-mean), ``clip_fraction``,
            ``kl_mean``, ``ratio_mean``, ``grad_norm`` (pre-clip), plus ``tokens`` (masked response tokens
            per pass), ``samples``, ``passes``, ``seconds`` (wall) and ``version`` (after the update).
        """
        if not samples:
            raise ValueError("train_step needs at least one rollout sample")
        t0 = time.perf_counter()
        cfg = self.cfg
        inputs, targets, mask, lengths, adv = self._build_batch(samples)
        total_tokens = float(mask.sum())
        if total_tokens == 0:
            raise ValueError("no response tokens in the rollout samples")
        n = len(samples)
        orders = [torch.randperm(n, generator=self._gen) for _ in range(max(1, cfg.updates_per_step))]
        # pi_old in the first pass's micro-batch layout: the first pass sees ratio == 1 exactly.
        first = self._micro_batches(orders[0])
        was_training = self.model.training
        self.model.eval()
        old = self._logprobs(self.model, first, inputs, targets, lengths)
        ref = None
        if cfg.kl_coef > 0 and self.reference is not None:
            ref = self._logprobs(self.reference, first, inputs, targets, lengths)
        self.model.train()

        sums = {"loss": 0.0, "clip_fraction": 0.0, "kl_mean": 0.0, "ratio_mean": 0.0, "grad_norm": 0.0}
        for order in orders:
            self._backend.zero_grad()
            pass_loss = 0.0
            for rows in self._micro_batches(order):
                tm = int(lengths[rows].max())
                r = rows.to(inputs.device)
                logits = self._backend.forward(inputs[r, :tm])
                lp = token_logprobs(logits, targets[r, :tm])
                loss, st = grpo_loss(
                    lp,
                    old[r, :tm],
                    adv[r],
                    mask[r, :tm],
                    cfg.clip_eps,
                    ref_logprobs=None if ref is None else ref[r, :tm],
                    kl_coef=cfg.kl_coef,
                    num_tokens=total_tokens,
                )
                self._backend.backward(loss)
                pass_loss += st["loss"]
                w = st["tokens"] / total_tokens
                for key in ("clip_fraction", "kl_mean", "ratio_mean"):
                    sums[key] += st[key] * w
            sums["grad_norm"] += self._backend.step()
            sums["loss"] += pass_loss
        self._backend.zero_grad()
        self.model.train(was_training)
        self.version += 1
        passes = len(orders)
        stats = {k: v / passes for k, v in sums.items()}
        stats.update(
            tokens=total_tokens,
            samples=float(n),
            passes=float(passes),
            version=float(self.version),
            seconds=time.perf_counter() - t0,
        )
        return stats

    # ------------------------------------------------------------------ weights out
    def policy_state_dict(self) -> dict[str, torch.Tensor]:
        """Detached CPU copies of the policy's weights (what the rollout actors load)."""
        return {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}

    def save_checkpoint(self, path: str | os.PathLike) -> None:
        """Write the policy in Hugging Face format (config.json + model.safetensors) to ``path``."""
        self.model.save_pretrained(path)

    def optimizer_state(self) -> dict[str, Any]:
        """The backend's state: name, optimizer steps taken, the optimizer's state_dict."""
        return self._backend.state()

    def save_state(self, path: str | os.PathLike) -> None:
        """Everything a resumed run needs to continue exactly: ``path/policy`` (Hugging Face format) and
        ``path/trainer.pt`` (version, optimizer state and steps, the micro-batch shuffling generator). Plain
        tensors and numbers only: ``load_state`` reads it with ``torch.load(weights_only=True)``."""
        path = Path(path)
        self.save_checkpoint(path / "policy")
        b = self._backend
        state = {
            "version": self.version,
            "backend": b.name,
            "optimizer_steps": b.steps,
            "optimizer": b.optimizer.state_dict(),
            "generator": self._gen.get_state(),
        }
        torch.save(state, path / "trainer.pt")

    def load_state(self, path: str | os.PathLike) -> None:
        """Restore what ``save_state`` wrote into this trainer (same model shape and backend).

        Raises:
            ValueError: the checkpoint was written by another backend, or its weights do not fit the model.
        """
        path = Path(path)
        b = self._backend
        with torch.serialization.safe_globals(b.checkpoint_globals()):
            state = torch.load(path / "trainer.pt", weights_only=True)
        if state["backend"] != b.name:
            raise ValueError(f"{path}: written by the {state['backend']} backend, this trainer uses {b.name}")
        weights = Transformer.from_pretrained(path / "policy").state_dict()
        with torch.no_grad():
            self.model.load_state_dict(weights)
        # DeepSpeed's ZeRO optimizer takes one state dict per data-parallel rank (a single rank here)
        b.optimizer.load_state_dict([state["optimizer"]] if b.name == "deepspeed" else state["optimizer"])
        b.steps = int(state["optimizer_steps"])
        self.version = int(state["version"])
        self._gen.set_state(state["generator"])
