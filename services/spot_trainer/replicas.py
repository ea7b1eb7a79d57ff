"""The spot trainer's pool of replicas: where each replica checkpoints and the leader publishes, the
parameter averaging that syncs the replicas' draft heads (local SGD), and the training thread's priority.

Plain Python (torch only); ``services/spot_trainer/service.py`` (one replica, run as a Ray actor) and the
pipeline's control plane (which syncs the pool) use these.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from services.spot_trainer.trainer import average_state_dicts

PUBLISHED_DIR = "published"


def replica_ckpt_dir(ckpt_dir: str | os.PathLike, replica: int) -> Path:
    """Checkpoint folder of one replica: ``ckpt_dir/replica_<replica>``."""
    return Path(ckpt_dir) / f"replica_{int(replica)}"


def published_dir(ckpt_dir: str | os.PathLike) -> Path:
    """Folder of the published drafter versions, shared by the pool: ``ckpt_dir/published``."""
    return Path(ckpt_dir) / PUBLISHED_DIR


def sync_replicas(replicas_states: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor] | None:
    """Parameter averaging across replicas (local SGD): the weighted mean of the draft-head states of the
    replicas that trained since the last sync.

    Args:
        replicas_states: ``head_state()`` answers, one per replica: ``{"state": state dict,
            "steps_since_sync": int}``.
    Returns: the mean state dict (weights = ``steps_since_sync``; ``trainer.average_state_dicts``), to be
        loaded into every replica with ``load_head``; None when no replica trained since the last sync.
    Raises: ValueError when a state lacks a key or the states' structures differ.
    """
    trained = [s for s in replicas_states if int(s["steps_since_sync"]) > 0]
    if not trained:
        return None
    return average_state_dicts([s["state"] for s in trained], [int(s["steps_since_sync"]) for s in trained])


def lower_thread_priority(increment: int) -> int | None:
    """Raise the calling thread's nice value by ``increment`` (Linux keeps nice per thread; threads it starts
    later inherit it). Returns the new nice value, or None where the OS does not support it (then nothing
    changes: lower priority is an optimisation, never a requirement)."""
    if increment <= 0 or not hasattr(os, "setpriority"):
        return None
    try:
        tid = threading.get_native_id()
        now = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, min(19, now + increment))
        return os.getpriority(os.PRIO_PROCESS, tid)
    except OSError:
        return None


__all__ = ["PUBLISHED_DIR", "lower_thread_priority", "published_dir", "replica_ckpt_dir", "sync_replicas"]
