"""The GRPO policy trainer: rollouts in, one versioned policy update out.

``PolicyTrainer.train_step(samples)`` takes the step's rollouts (prompt ids, response ids, the response's
group-normalized advantage) and

1. packs them (``packing.py``): micro-batches of at most ``micro_batch_size`` responses, each one flat
   token stream without padding in which the responses of a group share one copy of their prompt, and the
   LM head runs only where a response token is predicted (the loss covers response tokens only);
2. runs ``updates_per_step`` passes; each pass accumulates gradients over the micro-batches so that the
   pass's loss is the token-mean over ALL response tokens of the pass (DAPO's token-level loss, see
   ``grpo.py``), clips the gradient norm to ``max_grad_norm`` and takes one optimizer step. The pass's
   gradient is a sum over all its tokens, so the micro-batch composition and order do not change it (up
   to float round-off).

``old_logprobs`` (GRPO's pi_old, the policy that generated the rollouts, i.e. the weights before this
step's first optimizer step) are the first pass's own log-probs, detached: no separate forward, and the
first pass sees ratio exactly 1. When ``kl_coef > 0`` the reference policy's log-probs come from one
``no_grad`` packed forward per micro-batch.

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
from services.policy_trainer.packing import PackedBatch, PackedPolicy, pack_samples, packed_logits
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

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        """``[M, V]`` logits at the packed batch's target positions (``packing.packed_logits``)."""
        return packed_logits(self.model, batch)

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
        # the engine wraps the packed forward (it hooks the output of ``engine(...)`` for its backward)
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=PackedPolicy(model), optimizer=optimizer, model_parameters=params, config=ds_config
        )
        self.steps = 0

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        """``[M, V]`` logits at the packed batch's target positions, through the engine."""
        return self.engine(batch)

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
        seed: kept for API compatibility (the update is deterministic: it does not shuffle).
    """

    def __init__(
        self, model: Transformer, cfg: TrainerConfig, reference: Transformer | None = None, seed: int = 0
    ):
        self.model = model
        self.cfg = cfg
        self.version = 0
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

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # ------------------------------------------------------------------ the update
    def _token_logprobs(self, logits: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
        """``[M]`` float32 log-probs of ``batch.targets`` under ``[M, V]`` logits."""
        return token_logprobs(logits.unsqueeze(0), batch.targets.unsqueeze(0), chunk_rows=1)[0]

    def train_step(self, samples: list[RolloutSample]) -> dict[str, float]:
        """One GRPO update on the step's rollouts; ``version`` += 1.

        Raises:
            ValueError: no samples, or no response token to train on.
        Returns:
            stats averaged over the ``updates_per_step`` passes: ``loss`` (token-mean), ``clip_fraction``,
            ``kl_mean``, ``ratio_mean``, ``grad_norm`` (pre-clip), plus ``tokens`` (masked response tokens
            per pass), ``samples``, ``passes``, ``seconds`` (wall) and ``version`` (after the update).
        """
        if not samples:
            raise ValueError("train_step needs at least one rollout sample")
        t0 = time.perf_counter()
        cfg = self.cfg
        batches = pack_samples(samples, cfg.micro_batch_size, self.device)
        total_tokens = float(sum(b.num_tokens for b in batches))
        if total_tokens == 0:
            raise ValueError("no response tokens in the rollout samples")
        ref: list[torch.Tensor | None] = [None] * len(batches)
        if cfg.kl_coef > 0 and self.reference is not None:
            ref_dev = next(self.reference.parameters()).device  # may differ from the policy's
            ref_batches = (
                batches if ref_dev == self.device else pack_samples(samples, cfg.micro_batch_size, ref_dev)
            )
            with torch.no_grad():
                for j, b in enumerate(ref_batches):
                    ref[j] = self._token_logprobs(packed_logits(self.reference, b), b).to(self.device)
        old: list[torch.Tensor | None] = [None] * len(batches)
        was_training = self.model.training
        self.model.train()

        sums = {"loss": 0.0, "clip_fraction": 0.0, "kl_mean": 0.0, "ratio_mean": 0.0, "grad_norm": 0.0}
        passes = max(1, cfg.updates_per_step)
        for _ in range(passes):
            self._backend.zero_grad()
            pass_loss = 0.0
            for j, b in enumerate(batches):
                lp = self._token_logprobs(self._backend.forward(b), b)
                if old[j] is None:  # pi_old: the weights before this step's first optimizer step
                    old[j] = lp.detach()
                # one row per token ([M, 1]): grpo_loss's token-mean over the mask is then the same sum
                loss, st = grpo_loss(
                    lp.unsqueeze(1),
                    old[j].unsqueeze(1),
                    b.advantages,
                    torch.ones_like(lp).unsqueeze(1),
                    cfg.clip_eps,
                    ref_logprobs=None if ref[j] is None else ref[j].unsqueeze(1),
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
        stats = {k: v / passes for k, v in sums.items()}
        stats.update(
            tokens=total_tokens,
            samples=float(len(samples)),
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
        ``path/trainer.pt`` (version, optimizer state and steps). Plain
        tensors and numbers only: ``load_state`` reads it with ``torch.load(weights_only=True)``."""
        path = Path(path)
        self.save_checkpoint(path / "policy")
        b = self._backend
        state = {
            "version": self.version,
            "backend": b.name,
            "optimizer_steps": b.steps,
            "optimizer": b.optimizer.state_dict(),
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
