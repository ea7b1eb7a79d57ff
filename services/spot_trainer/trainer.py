"""The spot trainer: trains the learned drafter on idle ("bubble") workers, step by step, until preempted.

After TLT ("Taming the Long Tail", arXiv 2511.16665): workers that finished their rollout share early lend
their accelerators to drafter training, which must give them back within a short deadline. This module is
plain Python and knows nothing about the drafter itself: it drives

- ``step_fn(batch) -> dict`` (one optimizer step on a batch from ``HiddenStateBuffer.sample``; returns
  metrics), e.g. ``EagleTrainer.train_step``;
- ``module_state``: any object with ``state_dict()`` / ``load_state_dict(sd)`` (drafter + optimizer), saved in
  checkpoints; ``publish_state()`` (default ``module_state.state_dict``) is what rollout actors load.

Contract
--------
- ``run_granted(should_stop, deadline=None, max_steps=None)`` trains until ``should_stop()`` is true (checked
  before every step), the ``deadline`` (``clock`` time) would be passed by one more step (estimated from an
  average of recent step times), ``max_steps`` steps are done, or the buffer holds fewer than ``min_samples``
  fresh rows. A step is never interrupted, so preemption loses at most the in-flight step (when the
  coordinator force-cancels at the deadline). Returns ``dict(steps, seconds, preempted, stop_reason, step,
  metrics)``. On preemption (``should_stop`` or deadline) it also starts an asynchronous checkpoint.
- Checkpoints every ``checkpoint_every`` steps and on preemption, into ``ckpt_dir/step_<step>/``, with
  ``torch.distributed.checkpoint`` (DCP). A checkpoint counts only once its ``COMPLETE`` marker exists; the
  marker is written (atomically, via rename) after DCP has finished writing, so ``resume`` never loads a
  half-written checkpoint. The newest ``keep_checkpoints`` complete checkpoints are kept.
- ``resume()`` loads the newest complete checkpoint into ``module_state`` and restores the step counter, the
  sampling RNG and the drafter version; returns the step (None when there is none).
- ``publish()`` writes ``module_state``'s publishable state to ``publish_dir/v<version>/`` (``save_published``:
  JSON structure + safetensors, never a pickle, since rollout actors load it on request; marker last) and
  returns the new version: ``max(own version, newest on disk) + 1``, so versions only go up, across restarts
  and even without ``resume``. ``latest_published(dir) -> (version, path)`` (``(0, None)`` when nothing is
  published) and ``load_published(path)`` are what rollout actors use; ``DrafterLoader`` loads the newest
  version only when its owner calls ``at_phase_boundary()`` (never in the middle of a request).

Checkpoint implementation choice
--------------------------------
``dcp.async_save`` (torch >= 2.4; ``AsyncCheckpointerType.THREAD`` by default) works *without* a process
group when called with ``no_dist=True`` (checked on torch 2.13 CPU): it stages (copies) the state to CPU
memory synchronously, so training can go on mutating the parameters, and writes the files in a background
thread. We always pass ``no_dist=True``: one process (the leader of the data-parallel replicas, whose states
are equal after averaging) writes the checkpoint, so a preempted peer can never block a collective inside
the save. When ``async_save`` is missing (older torch) the fallback stages with ``clone()`` and runs
``dcp.save`` in our own background thread; ``checkpoint(async_=False)`` calls ``dcp.save`` directly. Our own
single-thread executor waits for DCP's future and only then writes the marker and prunes old checkpoints.

DCP's ``load`` fills a template state dict in place, and the template of a fresh optimizer has no moment
tensors yet. So a checkpoint stores the state tree's *structure* next to the DCP files (``state.json``, a
tagged JSON encoding that keeps int keys and tuples and never unpickles), and the tensors under flat keys;
``resume`` allocates every tensor from the DCP metadata (shape, dtype), loads, and rebuilds the tree. Only
tensors, dicts, lists, tuples, str, int, float, bool and None are supported in a state dict.

Data parallel across several granted workers
--------------------------------------------
``average_parameters(replicas)`` / ``average_state_dicts(sds)``: periodic parameter averaging (local SGD),
not a synchronous gloo all-reduce per step. Bubble workers are lent with a 2-second preemption deadline and
come and go independently; a per-step collective ties every replica's step time to the slowest one and
blocks, or fails, as soon as one member is preempted, and a gloo group cannot shrink. Each replica trains on
its own shard of the data; at the end of a grant (or every few steps) the leader averages the replicas'
floating-point tensors (optionally weighted, e.g. by steps done) and loads the mean into all.

The service (``services/spot_trainer/service.py``) applies this to a pool of ``SpotTrainerService`` replicas:
each has its own buffer, fed by rollout actors whose ZeroMQ PUSH sockets deal frames round-robin across the
replicas (the data sharding); ``sync_replicas`` averages the draft heads of the replicas that trained since
the last sync, weighted by their steps since then, and ``load_head`` installs the mean (optimizer moments stay
local). Replica 0, the leader, is the only one that publishes drafter versions.
"""

from __future__ import annotations

import concurrent.futures as cf
import inspect
import json
import os
import re
import shutil
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader

from services.spot_trainer.buffer import HiddenStateBuffer

MARKER = "COMPLETE"
STATE_JSON = "state.json"
CKPT_FORMAT = 1
_STEP_RE = re.compile(r"^step_(\d+)$")
_VER_RE = re.compile(r"^v(\d+)$")


class StateDictLike(Protocol):
    def state_dict(self) -> dict: ...

    def load_state_dict(self, state_dict: dict) -> Any: ...


StepFn = Callable[[dict[str, torch.Tensor]], Mapping[str, Any]]


# ---------------------------------------------------------------------- state tree <-> (skeleton, tensors)
def _split(obj: Any, path: str, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        key = path or "t"
        if key in tensors:
            key = f"{key}#{len(tensors)}"
        tensors[key] = obj.detach()
        return {"__tensor__": key}
    if isinstance(obj, Mapping):
        return {"__dict__": [[_split(k, "", {}), _split(v, f"{path}/{k}", tensors)] for k, v in obj.items()]}
    if isinstance(obj, tuple):
        return {"__tuple__": [_split(v, f"{path}/{i}", tensors) for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [_split(v, f"{path}/{i}", tensors) for i, v in enumerate(obj)]
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    if isinstance(obj, np.integer | np.floating | np.bool_):
        return obj.item()
    raise TypeError(f"unsupported value in a state dict at {path or '/'}: {type(obj).__name__}")


def _join(skel: Any, tensors: Mapping[str, torch.Tensor]) -> Any:
    if isinstance(skel, list):
        return [_join(v, tensors) for v in skel]
    if isinstance(skel, dict):
        if "__tensor__" in skel:
            return tensors[skel["__tensor__"]]
        if "__tuple__" in skel:
            return tuple(_join(v, tensors) for v in skel["__tuple__"])
        return {_join(k, tensors): _join(v, tensors) for k, v in skel["__dict__"]}
    return skel


# We save from one process on purpose (see "Checkpoint implementation choice"); DCP warns about it on every
# save and load, also from its own writer thread, so the filter is process-wide but matches only this message.
warnings.filterwarnings(
    "ignore",
    message=r"torch\.distributed is disabled, unavailable or uninitialized, assuming the intent is to",
    category=UserWarning,
)


_NO_DIST_SAVE = "no_dist" in inspect.signature(dcp.save).parameters
_HAS_ASYNC = hasattr(dcp, "async_save")


def _dist_kw() -> dict:
    return {"no_dist": True} if _NO_DIST_SAVE else {}


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _prepare_dir(path: Path) -> None:
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)


def _stage(state: Mapping[str, Any], path: Path, meta: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """Start a checkpoint at ``path``: (re)create the folder, write ``state.json`` (the tree's structure and
    ``meta``), and return the tree's tensors under their flat keys (contiguous, still sharing memory)."""
    tensors: dict[str, torch.Tensor] = {}
    skel = _split(state, "", tensors)
    _prepare_dir(path)
    _write_atomic(path / STATE_JSON, json.dumps(dict(format=CKPT_FORMAT, skeleton=skel, meta=dict(meta))))
    return {k: v.contiguous() for k, v in tensors.items()}


def save_state(
    state: Mapping[str, Any], path: str | os.PathLike, meta: Mapping[str, Any] | None = None
) -> None:
    """Synchronously write ``state`` (a state tree) as a DCP checkpoint plus ``state.json``, marker last."""
    path = Path(path)
    tensors = _stage(state, path, meta or {})
    dcp.save(tensors, checkpoint_id=str(path), **_dist_kw())
    _write_atomic(path / MARKER, json.dumps(dict(meta or {})))


def load_state(path: str | os.PathLike) -> tuple[Any, dict]:
    """Load a complete checkpoint written by ``save_state`` / ``SpotTrainer``: ``(state tree, meta)``."""
    path = Path(path)
    if not (path / MARKER).exists():
        raise FileNotFoundError(f"{path} is not a complete checkpoint (no {MARKER} marker)")
    doc = json.loads((path / STATE_JSON).read_text())
    if doc.get("format") != CKPT_FORMAT:
        raise ValueError(f"{path}: unsupported checkpoint format {doc.get('format')!r}")
    md = FileSystemReader(str(path)).read_metadata().state_dict_metadata
    keys: list[str] = []

    def collect(s):
        if isinstance(s, list):
            for v in s:
                collect(v)
        elif isinstance(s, dict):
            if "__tensor__" in s:
                keys.append(s["__tensor__"])
            else:
                for v in s.get("__tuple__", []):
                    collect(v)
                for k, v in s.get("__dict__", []):
                    collect(k)
                    collect(v)

    collect(doc["skeleton"])
    tensors = {k: torch.empty(md[k].size, dtype=md[k].properties.dtype) for k in keys}
    if tensors:
        dcp.load(tensors, checkpoint_id=str(path), **_dist_kw())
    return _join(doc["skeleton"], tensors), doc.get("meta", {})


def _complete_dirs(root: Path, pattern: re.Pattern) -> list[tuple[int, Path]]:
    if not root.is_dir():
        return []
    out = []
    for p in root.iterdir():
        m = pattern.match(p.name)
        if m and p.is_dir() and (p / MARKER).exists():
            out.append((int(m.group(1)), p))
    return sorted(out)


def latest_checkpoint(ckpt_dir: str | os.PathLike) -> tuple[int, Path] | None:
    """``(step, path)`` of the newest complete checkpoint, or None."""
    done = _complete_dirs(Path(ckpt_dir), _STEP_RE)
    return done[-1] if done else None


def latest_published(publish_dir: str | os.PathLike) -> tuple[int, Path | None]:
    """``(version, path)`` of the newest complete published drafter; ``(0, None)`` when there is none."""
    done = _complete_dirs(Path(publish_dir), _VER_RE)
    return done[-1] if done else (0, None)


PUBLISHED_TENSORS = "tensors.safetensors"


def save_published(
    state: Mapping[str, Any], path: str | os.PathLike, meta: Mapping[str, Any] | None = None
) -> None:
    """Write one published drafter version: ``state.json`` (the tree's structure and ``meta``), the tensors in
    ``tensors.safetensors``, marker last. Nothing in it is ever unpickled (``load_published``)."""
    from safetensors.torch import save_file

    path = Path(path)
    tensors = _stage(state, path, meta or {})
    tmp = path / (PUBLISHED_TENSORS + ".tmp")
    save_file({k: v.detach().cpu().clone().contiguous() for k, v in tensors.items()}, str(tmp))
    os.replace(tmp, path / PUBLISHED_TENSORS)
    _write_atomic(path / MARKER, json.dumps(dict(meta or {})))


def load_published(path: str | os.PathLike) -> dict:
    """The drafter state dict of one published version (for ``module.load_state_dict``): JSON + safetensors
    only (no pickle). Raises ``FileNotFoundError`` for an incomplete version, ``ValueError`` for a malformed
    one."""
    path = Path(path)
    if not (path / MARKER).is_file():
        raise FileNotFoundError(f"{path} is not a complete published drafter (no {MARKER} marker)")
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        doc = json.loads((path / STATE_JSON).read_text())
        if not isinstance(doc, dict) or doc.get("format") != CKPT_FORMAT:
            raise ValueError(f"unsupported format {doc.get('format') if isinstance(doc, dict) else doc!r}")
        tensors = load_file(str(path / PUBLISHED_TENSORS))
        state = _join(doc["skeleton"], tensors)
    except (SafetensorError, OSError, KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path}: not a published drafter: {type(e).__name__}: {e}") from None
    if not isinstance(state, dict):
        raise ValueError(f"{path}: a published drafter holds a state dict, got {type(state).__name__}")
    return state


class DrafterLoader:
    """Rollout-actor side: load the newest published drafter, only at phase boundaries.

    ``load_fn(state_dict)`` installs the weights (e.g. ``drafter.load_state_dict``). ``at_phase_boundary()``
    is called by the engine between rollout phases (no request in flight) and returns the version now in use.
    """

    def __init__(self, publish_dir: str | os.PathLike, load_fn: Callable[[dict], Any]):
        self.publish_dir = Path(publish_dir)
        self.load_fn = load_fn
        self.version = 0

    def at_phase_boundary(self) -> int:
        version, path = latest_published(self.publish_dir)
        if path is not None and version > self.version:
            self.load_fn(load_published(path))
            self.version = version
        return self.version


# ---------------------------------------------------------------------- data-parallel replicas
def average_state_dicts(
    state_dicts: Sequence[Mapping[str, Any]], weights: Sequence[float] | None = None
) -> dict[str, Any]:
    """Weighted mean of the floating-point tensors of several state trees (same structure); every other
    value (integer tensors such as step counters, scalars) is taken from the first."""
    if not state_dicts:
        raise ValueError("need at least one state dict")
    w = np.ones(len(state_dicts)) if weights is None else np.asarray(weights, dtype=np.float64)
    if len(w) != len(state_dicts) or (w < 0).any() or w.sum() <= 0:
        raise ValueError("weights must be non-negative, one per state dict, not all zero")
    w = (w / w.sum()).tolist()

    def avg(vals: list[Any]) -> Any:
        v0 = vals[0]
        if isinstance(v0, torch.Tensor):
            if not v0.is_floating_point():
                return v0.clone()
            acc = torch.zeros_like(v0, dtype=torch.float64 if v0.dtype == torch.float64 else torch.float32)
            for wi, v in zip(w, vals):
                acc.add_(v.to(acc.dtype), alpha=wi)
            return acc.to(v0.dtype)
        if isinstance(v0, Mapping):
            return {k: avg([v[k] for v in vals]) for k in v0}
        if isinstance(v0, list | tuple):
            return type(v0)(avg([v[i] for v in vals]) for i in range(len(v0)))
        return v0

    return avg(list(state_dicts))


def average_parameters(replicas: Sequence[StateDictLike], weights: Sequence[float] | None = None) -> dict:
    """Average the replicas' states (see ``average_state_dicts``) and load the mean into every replica."""
    mean = average_state_dicts([r.state_dict() for r in replicas], weights)
    for r in replicas:
        r.load_state_dict(mean)
    return mean


# ---------------------------------------------------------------------- the trainer
class SpotTrainer:
    def __init__(
        self,
        step_fn: StepFn,
        module_state: StateDictLike,
        buffer: HiddenStateBuffer,
        ckpt_dir: str | os.PathLike,
        checkpoint_every: int = 50,
        batch_size: int = 32,
        seq_len: int | None = None,
        min_samples: int = 1,
        publish_state: Callable[[], Mapping[str, Any]] | None = None,
        publish_dir: str | os.PathLike | None = None,
        keep_checkpoints: int = 3,
        keep_published: int = 3,
        seed: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ):
        if checkpoint_every < 1 or batch_size < 1 or keep_checkpoints < 1 or keep_published < 1:
            raise ValueError("checkpoint_every, batch_size, keep_checkpoints, keep_published must be >= 1")
        self.step_fn = step_fn
        self.module_state = module_state
        self.buffer = buffer
        self.ckpt_dir = Path(ckpt_dir)
        self.publish_dir = Path(publish_dir) if publish_dir is not None else self.ckpt_dir / "published"
        self.checkpoint_every = int(checkpoint_every)
        self.batch_size = int(batch_size)
        self.seq_len = seq_len
        self.min_samples = max(1, int(min_samples))
        self.publish_state = publish_state or module_state.state_dict
        self.keep_checkpoints = int(keep_checkpoints)
        self.keep_published = int(keep_published)
        self.clock = clock
        self.rng = np.random.default_rng(seed)
        self.step = 0  # drafter training steps done, over all grants and restarts
        self.version = latest_published(self.publish_dir)[0]  # never goes back
        self.step_seconds_ema: float | None = None
        self.checkpointed_step: int | None = None
        self.last_checkpoint_error: BaseException | None = None
        self._executor = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="spot-ckpt")
        self._pending: cf.Future | None = None
        self.ckpt_dir.mkdir(parents=True, exist_ok=True)

    # ------------------------------------------------------------------ training
    def run_granted(
        self,
        should_stop: Callable[[], bool],
        deadline: float | None = None,
        max_steps: int | None = None,
    ) -> dict[str, Any]:
        t0 = self.clock()
        steps, preempted, reason = 0, False, "max_steps"
        metrics: Mapping[str, Any] = {}
        while True:
            if should_stop():
                preempted, reason = True, "preempted"
                break
            if deadline is not None:
                now, est = self.clock(), self.step_seconds_ema or 0.0
                if now + est >= deadline:
                    preempted, reason = True, "deadline"
                    break
            if max_steps is not None and steps >= max_steps:
                break
            if self.buffer.num_fresh() < self.min_samples:
                reason = "no_data"
                break
            ts = self.clock()
            batch = self.buffer.sample(self.batch_size, self.rng, self.seq_len)
            metrics = self.step_fn(batch) or {}
            dt = self.clock() - ts
            self.step_seconds_ema = (
                dt if self.step_seconds_ema is None else 0.8 * self.step_seconds_ema + 0.2 * dt
            )
            self.step += 1
            steps += 1
            if self.step % self.checkpoint_every == 0:
                self.checkpoint(async_=True)
        if preempted and self.checkpointed_step != self.step:
            self.checkpoint(async_=True)
        return dict(
            steps=steps,
            seconds=self.clock() - t0,
            preempted=preempted,
            stop_reason=reason,
            step=self.step,
            metrics=dict(metrics),
        )

    # ------------------------------------------------------------------ checkpoints
    def _trainer_state(self) -> dict[str, Any]:
        return dict(step=self.step, version=self.version, rng=self.rng.bit_generator.state)

    def checkpoint(self, async_: bool = True) -> cf.Future | None:
        """Checkpoint the current state as ``step_<step>``. Async: returns a future that completes after
        the marker is written (the state is staged before this returns). Waits for a previous save first."""
        self.wait()
        step = self.step
        path = self.ckpt_dir / f"step_{step:09d}"
        if self.checkpointed_step == step and (path / MARKER).exists():
            return None
        meta = dict(step=step, version=self.version, time=time.time())
        state = dict(module=self.module_state.state_dict(), trainer=self._trainer_state())
        tensors = _stage(state, path, meta)
        self.checkpointed_step = step
        if not async_:
            dcp.save(tensors, checkpoint_id=str(path), **_dist_kw())
            self._finish(path, meta)
            return None
        if _HAS_ASYNC:
            dcp_future = dcp.async_save(tensors, checkpoint_id=str(path), **_dist_kw())
            if not isinstance(dcp_future, cf.Future):  # AsyncSaveResponse (staging + upload futures)
                dcp_future = dcp_future.upload_completion

            def job():
                dcp_future.result()
                self._finish(path, meta)

        else:
            staged = {k: v.to("cpu", copy=True) for k, v in tensors.items()}

            def job():
                dcp.save(staged, checkpoint_id=str(path), **_dist_kw())
                self._finish(path, meta)

        self._pending = self._executor.submit(job)
        return self._pending

    def _finish(self, path: Path, meta: Mapping[str, Any]) -> None:
        _write_atomic(path / MARKER, json.dumps(dict(meta)))
        self._prune(self.ckpt_dir, _STEP_RE, self.keep_checkpoints)

    @staticmethod
    def _prune(root: Path, pattern: re.Pattern, keep: int) -> None:
        done = _complete_dirs(root, pattern)
        if len(done) <= keep:
            return
        oldest_kept = done[-keep][0]
        for p in root.iterdir():
            m = pattern.match(p.name)
            if m and int(m.group(1)) < oldest_kept:
                shutil.rmtree(p, ignore_errors=True)

    def checkpoint_pending(self) -> bool:
        """True while an asynchronous checkpoint is still being written."""
        fut = self._pending
        return fut is not None and not fut.done()

    def wait(self) -> None:
        """Block until the pending asynchronous checkpoint (if any) is complete; re-raises its error."""
        fut, self._pending = self._pending, None
        if fut is not None:
            try:
                fut.result()
            except BaseException as e:
                self.last_checkpoint_error = e
                raise

    def resume(self) -> int | None:
        """Load the newest complete checkpoint; returns its step, or None when there is none."""
        found = latest_checkpoint(self.ckpt_dir)
        if found is None:
            return None
        step, path = found
        state, _ = load_state(path)
        self.module_state.load_state_dict(state["module"])
        tr = state["trainer"]
        self.step = int(tr["step"])
        self.rng.bit_generator.state = tr["rng"]
        self.version = max(self.version, int(tr["version"]), latest_published(self.publish_dir)[0])
        self.checkpointed_step = self.step
        return step

    # ------------------------------------------------------------------ publishing
    def publish(self) -> int:
        """Write the publishable drafter state as a new version (synchronously); returns the version."""
        version = max(self.version, latest_published(self.publish_dir)[0]) + 1
        meta = dict(
            version=version, step=self.step, policy_version=self.buffer.current_version, time=time.time()
        )
        save_published(dict(self.publish_state()), self.publish_dir / f"v{version:09d}", meta)
        self.version = version
        self._prune(self.publish_dir, _VER_RE, self.keep_published)
        return version

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._executor.shutdown(wait=True)

    def __enter__(self) -> SpotTrainer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
