"""Bounded buffer of the policy's hidden states, the training data of the learned drafter.

Rollout actors sample accepted tokens' hidden states during decoding and stream them here (``stream.py``) as
*frames*; the spot trainer samples batches from the buffer while it holds a grant (idle "bubble" workers,
after TLT, arXiv 2511.16665, which trains an EAGLE-style drafter on the target's hidden states).

Contract
--------
- A ``Frame`` is ``(policy_version: int, request_id: str, positions [n] int64, hidden [n, ...] float,
  tokens [n] int64)``: ``n`` consecutive-in-order rows of one request, all produced by one policy version.
- Capacity is counted in tokens (rows). ``add`` evicts the oldest frames (insertion order) until the new one
  fits and counts them in ``dropped`` (frames) / ``dropped_tokens``; a single frame longer than the capacity
  keeps only its last ``capacity_tokens`` rows (the cut rows count in ``dropped_tokens``). Nothing blocks.
- Freshness: the buffer keeps the last ``keep_versions`` (K) policy versions. ``current_version`` is the
  largest version given to ``age_out`` or seen in a frame; frames with ``policy_version < current - K + 1``
  are dropped (``aged_out`` / ``aged_out_tokens``) as soon as the current version moves, and a stale frame
  arriving late is dropped on arrival. So every stored row is fresh: ``num_fresh() == len(buffer)``.
- ``sample(batch_size, rng, seq_len=None)`` draws uniformly over rows (``seq_len=None``: tensors
  ``[B, ...]``) or over windows of ``seq_len`` consecutive rows of one frame (``[B, L, ...]``; e.g.
  ``seq_len=2`` gives EAGLE's (f_t, x_{t+1}) -> f_{t+1} pairs). Sampling is with replacement; the batch is a
  fresh copy (stored tensors are never handed out).
- Stored tensors may be zero-copy views of received ZeroMQ frames: treat them as read-only.
- Thread-safe (one lock): the stream receiver adds while the trainer samples.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


def _as_tensor(x: Any) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x
    return torch.as_tensor(np.asarray(x))


@dataclass(frozen=True)
class Frame:
    policy_version: int
    request_id: str
    positions: torch.Tensor  # [n] int64
    hidden: torch.Tensor  # [n, ...] floating
    tokens: torch.Tensor  # [n] int64

    def __post_init__(self):
        pos, hid, tok = _as_tensor(self.positions), _as_tensor(self.hidden), _as_tensor(self.tokens)
        object.__setattr__(self, "positions", pos)
        object.__setattr__(self, "hidden", hid)
        object.__setattr__(self, "tokens", tok)
        object.__setattr__(self, "policy_version", int(self.policy_version))
        object.__setattr__(self, "request_id", str(self.request_id))
        if pos.dim() != 1 or tok.dim() != 1 or hid.dim() < 1:
            raise ValueError("positions and tokens must be 1-D, hidden at least 1-D")
        if not (pos.shape[0] == tok.shape[0] == hid.shape[0]):
            raise ValueError(
                f"row counts differ: positions {pos.shape[0]}, hidden {hid.shape[0]}, tokens {tok.shape[0]}"
            )
        if not hid.is_floating_point():
            raise ValueError(f"hidden must be floating point, got {hid.dtype}")
        if pos.dtype != torch.int64 or tok.dtype != torch.int64:
            raise ValueError(f"positions and tokens must be int64, got {pos.dtype}, {tok.dtype}")

    @property
    def n(self) -> int:
        return int(self.tokens.shape[0])

    @staticmethod
    def coerce(frame: Frame | Sequence[Any]) -> Frame:
        """A ``Frame`` or a 5-tuple ``(policy_version, request_id, positions, hidden, tokens)``."""
        return frame if isinstance(frame, Frame) else Frame(*frame)

    def tail(self, k: int) -> Frame:
        """The last ``k`` rows."""
        return Frame(
            self.policy_version, self.request_id, self.positions[-k:], self.hidden[-k:], self.tokens[-k:]
        )


def _rng(rng: np.random.Generator | int | None) -> np.random.Generator:
    return rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)


class HiddenStateBuffer:
    def __init__(self, capacity_tokens: int, keep_versions: int = 2):
        if capacity_tokens < 1 or keep_versions < 1:
            raise ValueError("capacity_tokens and keep_versions must be >= 1")
        self.capacity_tokens = int(capacity_tokens)
        self.keep_versions = int(keep_versions)
        self.current_version: int | None = None
        self._frames: deque[Frame] = deque()
        self._tokens = 0
        self._lock = threading.Lock()
        self.added = 0  # frames accepted
        self.added_tokens = 0
        self.dropped = 0  # frames evicted because the buffer was full
        self.dropped_tokens = 0  # rows evicted (including rows cut from an oversized frame)
        self.aged_out = 0  # frames dropped as older than the last K policy versions
        self.aged_out_tokens = 0

    # ------------------------------------------------------------------ sizes
    def __len__(self) -> int:
        return self._tokens

    @property
    def num_frames(self) -> int:
        return len(self._frames)

    def frames(self) -> list[Frame]:
        """A snapshot of the held frames, oldest first (the frames themselves, not copies)."""
        with self._lock:
            return list(self._frames)

    def _oldest_fresh(self, current_version: int | None) -> int | None:
        return None if current_version is None else current_version - self.keep_versions + 1

    def num_fresh(self, current_version: int | None = None) -> int:
        """Rows whose policy version is within the last K versions of ``current_version`` (default: the
        buffer's own ``current_version``)."""
        cur = self.current_version if current_version is None else current_version
        lo = self._oldest_fresh(cur)
        with self._lock:
            if lo is None:
                return self._tokens
            return sum(f.n for f in self._frames if f.policy_version >= lo)

    # ------------------------------------------------------------------ writes
    def add(self, frame: Frame | Sequence[Any]) -> bool:
        """Store one frame (evicting the oldest when full). Returns False if it was stale on arrival."""
        f = Frame.coerce(frame)
        with self._lock:
            if self.current_version is None or f.policy_version > self.current_version:
                self._age_out_locked(f.policy_version)
            lo = self._oldest_fresh(self.current_version)
            if lo is not None and f.policy_version < lo:
                self.aged_out += 1
                self.aged_out_tokens += f.n
                return False
            if f.n > self.capacity_tokens:
                self.dropped_tokens += f.n - self.capacity_tokens
                f = f.tail(self.capacity_tokens)
            while self._frames and self._tokens + f.n > self.capacity_tokens:
                old = self._frames.popleft()
                self._tokens -= old.n
                self.dropped += 1
                self.dropped_tokens += old.n
            self._frames.append(f)
            self._tokens += f.n
            self.added += 1
            self.added_tokens += f.n
            return True

    def age_out(self, current_version: int) -> int:
        """The policy is now at ``current_version``: drop frames older than the last K versions.
        Returns the number of rows dropped. The current version never goes back."""
        with self._lock:
            return self._age_out_locked(current_version)

    def _age_out_locked(self, current_version: int) -> int:
        if self.current_version is not None and current_version < self.current_version:
            current_version = self.current_version
        self.current_version = int(current_version)
        lo = self._oldest_fresh(self.current_version)
        keep: deque[Frame] = deque()
        gone = 0
        for f in self._frames:
            if f.policy_version >= lo:
                keep.append(f)
            else:
                gone += f.n
                self.aged_out += 1
        self._frames = keep
        self._tokens -= gone
        self.aged_out_tokens += gone
        return gone

    def clear(self) -> None:
        with self._lock:
            self._frames.clear()
            self._tokens = 0

    # ------------------------------------------------------------------ reads
    def sample(
        self,
        batch_size: int,
        rng: np.random.Generator | int | None = None,
        seq_len: int | None = None,
    ) -> dict[str, torch.Tensor]:
        """Draw ``batch_size`` rows (or windows of ``seq_len`` consecutive rows) uniformly with replacement.

        Returns ``hidden [B, (L,) ...]``, ``tokens [B, (L)]``, ``positions [B, (L)]`` and
        ``policy_version [B]``. Raises ``ValueError`` when no frame has ``seq_len`` rows."""
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        L = 1 if seq_len is None else int(seq_len)
        if L < 1:
            raise ValueError("seq_len must be >= 1")
        gen = _rng(rng)
        with self._lock:
            frames = [f for f in self._frames if f.n >= L]
            counts = np.array([f.n - L + 1 for f in frames], dtype=np.int64)
            total = int(counts.sum()) if len(frames) else 0
            if total == 0:
                raise ValueError(f"buffer has no frame with >= {L} rows ({self._tokens} rows stored)")
            flat = gen.integers(0, total, size=batch_size)
            ends = np.cumsum(counts)
            which = np.searchsorted(ends, flat, side="right")
            offs = flat - (ends[which] - counts[which])
            hid, tok, pos, ver = [], [], [], []
            for i, o in zip(which.tolist(), offs.tolist()):
                f = frames[i]
                hid.append(f.hidden[o : o + L])
                tok.append(f.tokens[o : o + L])
                pos.append(f.positions[o : o + L])
                ver.append(f.policy_version)
            batch = dict(
                hidden=torch.stack(hid),
                tokens=torch.stack(tok),
                positions=torch.stack(pos),
                policy_version=torch.tensor(ver, dtype=torch.int64),
            )
        if seq_len is None:
            for k in ("hidden", "tokens", "positions"):
                batch[k] = batch[k].squeeze(1)
        return batch

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return dict(
                tokens=self._tokens,
                frames=len(self._frames),
                capacity_tokens=self.capacity_tokens,
                current_version=self.current_version,
                added=self.added,
                added_tokens=self.added_tokens,
                dropped=self.dropped,
                dropped_tokens=self.dropped_tokens,
                aged_out=self.aged_out,
                aged_out_tokens=self.aged_out_tokens,
            )
