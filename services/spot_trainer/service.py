"""SpotTrainerService: one replica of the spot trainer, which trains the learned (EAGLE) drafter in rollout
bubbles. Plain Python; the driver runs a pool of replicas as threaded Ray actors (``max_concurrency`` > 1) or
in-process, and drives each over gRPC (``serve()``; ``services/spot_trainer/grpc_service.py``) or directly.

Data path: rollout actors stream ``Frame(policy_version, request_id, positions, hidden, tokens)`` over ZeroMQ
(PUSH) to each replica's ``HiddenStateReceiver`` (PULL, a background thread) into its bounded
``HiddenStateBuffer``. A sender connected to several replicas deals whole frames round-robin across them
(``stream.HiddenStateSender``): that is the data sharding of the pool, each replica trains on its own share.

Grants (non-blocking)
---------------------
- ``grant(g)`` starts ``SpotTrainer.run_granted`` (one ``EagleTrainer.train_step`` per batch of ``seq_len``
  consecutive positions) in a background thread and returns at once. Training stops between steps on
  ``preempt()``, before a step that would pass the grant's deadline, or when the buffer holds fewer than
  ``min_samples`` fresh rows.
- A replica holds at most one grant, from ``grant`` until the ``preempt`` that reports it; a grant that ended
  on its own (deadline, no data) is still held, and reported, until then. So a second ``grant`` before that
  ``preempt`` is refused (``accepted=False`` with a message), as is a grant without enough fresh data.
- ``preempt()`` stops the grant between steps (the in-flight step finishes; a step is never interrupted),
  waits for the training thread (at most ``timeout`` seconds), and reports the grant. ``run_granted`` starts
  an asynchronous checkpoint on preemption (``checkpoint_pending``).

Replicas and parameter averaging
--------------------------------
Data parallel across replicas is periodic parameter averaging (local SGD), as documented in
``services/spot_trainer/trainer.py`` ("Data parallel"): each replica trains on its own shard of the stream
with its own optimizer; at a sync point the caller collects ``head_state()`` of every replica, averages with
``sync_replicas`` (weighted by the steps each did since the last sync) and loads the mean into every replica
with ``load_head`` (optimizer moments stay local). Draft-head weights travel as Python / Ray objects, never
over gRPC.

- Replica 0 is the leader: the only one that ``publish``es drafter versions (into the shared
  ``ckpt_dir/published``); ``publish`` on another replica raises ``RuntimeError``.
- Every replica, the leader included, checkpoints into its own ``ckpt_dir/replica_<i>/`` (one layout for
  all; no replica reads another's checkpoints) and resumes from its newest complete checkpoint there when
  it starts. The published version never goes back: the leader numbers a new version
  ``max(own, newest on disk) + 1``.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from services.common.grpc_auth import require_token
from services.common.grpc_server import GrpcServer, expose
from services.common.hosts import format_address, resolve
from services.common.proto_gen.tailspec.v1 import spot_trainer_pb2_grpc
from services.rollout_actor.model import Transformer
from services.rollout_actor.speculative.eagle_model import EagleConfig, EagleDraftModel, default_fuse_layers
from services.rollout_actor.speculative.eagle_train import EagleTrainer
from services.spot_trainer.buffer import HiddenStateBuffer
from services.spot_trainer.grpc_service import SpotTrainerGrpc
from services.spot_trainer.replicas import (
    lower_thread_priority,
    published_dir,
    replica_ckpt_dir,
)
from services.spot_trainer.stream import HiddenStateReceiver
from services.spot_trainer.trainer import SpotTrainer, latest_published

SERVICE_NAME = "tailspec.v1.SpotTrainerService"


class _TrainerState:
    """state_dict/load_state_dict over the draft head and its optimizer (what checkpoints hold)."""

    def __init__(self, trainer: EagleTrainer):
        self.t = trainer

    def state_dict(self) -> dict:
        return {
            "model": self.t.model.state_dict(),
            "optimizer": self.t.optimizer.state_dict(),
            "steps": self.t.steps,
        }

    def load_state_dict(self, sd: dict) -> None:
        self.t.model.load_state_dict(sd["model"])
        self.t.optimizer.load_state_dict(sd["optimizer"])
        self.t.steps = int(sd.get("steps", 0))


@dataclass
class _Grant:
    grant_id: str
    worker_id: str
    deadline: float | None  # time.time() seconds
    rl_step: int
    policy_version: int
    granted_at: float
    step0: int  # the replica's cumulative step when the grant started
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    result: dict | None = None  # run_granted's answer, once the thread is done
    error: str = ""
    finished_at: float | None = None
    metrics: dict = field(default_factory=dict)  # the grant's last step

    def as_dict(self) -> dict[str, Any]:
        return dict(
            grant_id=self.grant_id,
            worker_id=self.worker_id,
            deadline=self.deadline,
            rl_step=self.rl_step,
            policy_version=self.policy_version,
            granted_at=self.granted_at,
        )


def _metric(m: Mapping[str, Any], key: str) -> float | None:
    v = m.get(key)
    return None if v is None else float(v)


class SpotTrainerService:
    """One spot-trainer replica.

    Args:
        model_path: HF folder of the policy (the draft head shares its embedding and LM head).
        ckpt_dir: root of the pool's checkpoints: this replica's are in ``ckpt_dir/replica_<replica>/``
            (resumed at start when present), published drafters in ``ckpt_dir/published/``.
        eagle3 / seed: draft head shape and init (identical to the rollout actors' initial head; every
            replica starts from the same weights).
        capacity_tokens, keep_versions, batch_size, seq_len, lr, checkpoint_every, min_samples: training knobs
            (``min_samples``: fresh buffer rows needed to accept a grant and to keep training).
        threads: torch threads for training.
        nice: CPU priority (Linux nice increment, 0..19) of each grant's training thread. Bubble training
            must only take cycles the critical path does not want: where the "idle" worker shares cores with
            rollout actors or the policy trainer (a CPU machine), a niced thread yields to them, and runs at
            full speed on a core that is really idle. Ray starts its workers at nice 15, so under Ray the thread
            reaches 19: a 15:36 CPU share against a rollout actor, not a full yield. 0: the process's own
            priority. The stream receiver
            thread keeps the normal priority (it is cheap, and a starved receiver would drop frames).
        address: ZeroMQ endpoint the hidden-state receiver binds (``tcp://127.0.0.1:*`` = any free port).
        stream_host: instead of ``address``: a ``grpc.host`` value (``node``, ``auto``, a wildcard, an IP;
            ``services/common/hosts.py``) resolved on this replica's node; any free port.
        replica: index in the pool; 0 is the leader (publishes drafter versions).
        token: the run's secret (handed over through Ray): the hidden-state receiver accepts only frames
            with its MAC (``stream.py``, "Authentication").
    """

    def __init__(
        self,
        model_path: str,
        ckpt_dir: str,
        eagle3: bool = False,
        seed: int = 0,
        capacity_tokens: int = 200_000,
        keep_versions: int = 2,
        batch_size: int = 32,
        seq_len: int = 4,
        lr: float = 1e-3,
        checkpoint_every: int = 50,
        min_samples: int = 256,
        threads: int = 1,
        nice: int = 19,
        address: str = "tcp://127.0.0.1:*",
        replica: int = 0,
        token: str | None = None,
        stream_host: str | None = None,
    ):
        if int(replica) < 0:
            raise ValueError(f"replica must be >= 0, got {replica}")
        if not 0 <= int(nice) <= 19:
            raise ValueError(f"nice must be in 0..19, got {nice}")
        torch.set_num_threads(max(1, threads))
        self.nice = int(nice)
        self.replica = int(replica)
        self.ckpt_root = Path(ckpt_dir)
        self.started_at = time.time()
        self.target = Transformer.from_pretrained(model_path)
        for p in self.target.parameters():
            p.requires_grad_(False)
        fuse = default_fuse_layers(self.target.config.num_hidden_layers) if eagle3 else None
        self.head = EagleDraftModel(self.target.config, EagleConfig(fuse_layers=fuse, seed=seed))
        self.eagle = EagleTrainer(self.head, self.target, lr=lr, seed=seed)
        self.buffer = HiddenStateBuffer(capacity_tokens, keep_versions=keep_versions)
        self.policy_version = 0  # as told by update_policy / set_policy_version (through Ray, trusted)
        self._stream_advertise = None
        if stream_host is not None:  # grpc.host's rule (services/common/hosts.py), resolved on this node
            bind, self._stream_advertise = resolve(stream_host)
            address = "tcp://" + format_address(bind, 0).rsplit(":", 1)[0] + ":*"
        self.receiver = HiddenStateReceiver(
            address,
            self.buffer,
            token=token,
            policy_version=0,
            hidden_size=self.target.config.hidden_size,
            vocab_size=self.target.config.vocab_size,
        )
        self.receiver.start()
        self.spot = SpotTrainer(
            self._step,
            _TrainerState(self.eagle),
            self.buffer,
            replica_ckpt_dir(ckpt_dir, self.replica),
            checkpoint_every=checkpoint_every,
            batch_size=batch_size,
            seq_len=seq_len,
            min_samples=min_samples,
            publish_state=self.head.state_dict,
            publish_dir=published_dir(ckpt_dir),
            seed=seed + self.replica,  # replicas sample different batches even from equal shards
        )
        self.resumed_step = self.spot.resume()
        self.steps_since_sync = 0
        self.trained_seconds_total = 0.0
        self.last_metrics: dict = {}
        self.message = ""  # last error, for GetStatus
        self._step_lock = threading.Lock()  # one optimizer step / weight read or write at a time
        self._grant_lock = threading.Lock()  # guards self._grant
        self._preempt_lock = threading.Lock()  # one preempt at a time
        self._grant: _Grant | None = None
        self._grpc = None
        self._closed = False

    # ------------------------------------------------------------------ plumbing
    @property
    def leader(self) -> bool:
        return self.replica == 0

    def ping(self) -> int:
        """Cumulative optimizer steps of this replica (a liveness probe)."""
        return self.spot.step

    def address(self) -> str:
        """The ZeroMQ PULL endpoint rollout actors push frames to (with ``stream_host``: the advertised host,
        e.g. the node IP for a wildcard bind)."""
        if self._stream_advertise is None:
            return self.receiver.address
        port = int(self.receiver.address.rsplit(":", 1)[1])
        return "tcp://" + format_address(self._stream_advertise, port)

    def _step(self, batch: dict) -> dict:
        hidden = batch["hidden"]  # [B, L, k, H] (k = fused layers)
        feats = hidden[:, :, 0] if hidden.dim() == 4 and hidden.shape[2] == 1 else hidden
        with self._step_lock:
            m = self.eagle.train_step(
                {
                    "tokens": batch["tokens"],
                    "features": feats,
                    "mask": torch.ones(batch["tokens"].shape, dtype=torch.bool),
                }
            )
            self.steps_since_sync += 1
        self.last_metrics = m
        g = self._grant
        if g is not None:
            g.metrics = m
        return m

    def update_policy(self, state: dict[str, torch.Tensor], version: int) -> int:
        """New policy weights (the head reads the target's embedding and LM head); rows older than the last
        ``keep_versions`` policy versions age out of the buffer. Safe while a grant trains (between steps).
        Returns ``version``."""
        with self._step_lock, torch.no_grad():
            self.target.load_state_dict(state, strict=False)
        self.set_policy_version(version)
        self.buffer.age_out(version)
        return version

    def set_policy_version(self, version: int) -> int:
        """The run's policy version (never goes back): stream frames far ahead of it are dropped, and a grant
        may not claim a newer one. Returns it."""
        self.policy_version = max(self.policy_version, int(version))
        self.receiver.set_policy_version(self.policy_version)
        return self.policy_version

    def num_fresh(self) -> int:
        """Fresh rows in the buffer (hidden states of the last ``keep_versions`` policy versions)."""
        return self.buffer.num_fresh()

    @property
    def drafter_version(self) -> int:
        """Newest published drafter version of the pool (0 = none yet); never goes back."""
        return max(self.spot.version, latest_published(self.spot.publish_dir)[0])

    # ------------------------------------------------------------------ grants
    def grant(self, grant: Mapping[str, Any]) -> dict[str, Any]:
        """Start training under a grant, in a background thread; returns at once.

        Args:
            grant: ``{"grant_id": str, "worker_id": str, "deadline": float | None (time.time() seconds;
                None = until preempted), "rl_step": int, "policy_version": int}`` (``rl_step`` and
                ``policy_version`` default to 0).
        Returns: ``{"accepted": bool, "message": str, "buffered_samples": int (fresh rows),
            "drafter_version": int}``. Not accepted (and nothing started) when the buffer holds fewer than
            ``min_samples`` fresh rows, when this replica still holds a grant (running, or ended on its
            own and not yet reported by ``preempt``), when the deadline has passed, or after ``close()``.
        Raises: ValueError when ``grant_id`` or ``worker_id`` is missing or empty.
        """
        gid, wid = str(grant.get("grant_id") or ""), str(grant.get("worker_id") or "")
        if not gid or not wid:
            raise ValueError(f"a grant needs a grant_id and a worker_id, got {dict(grant)!r}")
        deadline = grant.get("deadline")
        deadline = None if deadline is None else float(deadline)
        fresh = self.buffer.num_fresh()

        def answer(accepted: bool, message: str) -> dict[str, Any]:
            return dict(
                accepted=accepted,
                message=message,
                buffered_samples=fresh,
                drafter_version=self.drafter_version,
            )

        with self._grant_lock:
            if self._closed:
                return answer(False, f"replica {self.replica} is closed")
            held = self._grant
            if held is not None:
                state = "training" if held.result is None else f"ended ({held.result['stop_reason']})"
                return answer(
                    False,
                    f"replica {self.replica} still holds grant {held.grant_id!r} of worker "
                    f"{held.worker_id!r}, {state}: preempt it first",
                )
            if fresh < self.spot.min_samples:
                return answer(
                    False,
                    f"not enough fresh data: {fresh} rows in the buffer, {self.spot.min_samples} needed",
                )
            now = time.time()
            if deadline is not None and deadline <= now:
                return answer(False, f"deadline already passed ({now - deadline:.3f} s ago)")
            g = _Grant(
                grant_id=gid,
                worker_id=wid,
                deadline=deadline,
                rl_step=int(grant.get("rl_step") or 0),
                policy_version=int(grant.get("policy_version") or 0),
                granted_at=now,
                step0=self.spot.step,
            )
            mono_deadline = None if deadline is None else time.monotonic() + (deadline - now)
            g.thread = threading.Thread(
                target=self._run_grant, args=(g, mono_deadline), name=f"spot-grant-{gid}", daemon=True
            )
            self._grant = g
            g.thread.start()
        return answer(True, f"training on replica {self.replica} for worker {wid!r}")

    def _run_grant(self, g: _Grant, mono_deadline: float | None) -> None:
        lower_thread_priority(self.nice)
        try:
            out = self.spot.run_granted(g.stop.is_set, deadline=mono_deadline)
        except Exception as e:  # noqa: BLE001 - reported by the next preempt and GetStatus
            g.error = f"{type(e).__name__}: {e}"
            self.message = f"grant {g.grant_id}: {g.error}"
            out = dict(
                steps=self.spot.step - g.step0,
                seconds=time.time() - g.granted_at,
                preempted=False,
                stop_reason="error",
                step=self.spot.step,
                metrics=dict(g.metrics),
            )
        g.finished_at = time.time()
        self.trained_seconds_total += float(out["seconds"])
        g.result = out

    def _report(self, g: _Grant | None, released: bool, release_seconds: float, message: str) -> dict:
        done = g is not None and g.result is not None
        m = g.metrics if g is not None else {}
        return dict(
            released=released,
            release_seconds=release_seconds,
            steps_in_grant=0 if g is None else (g.result["steps"] if done else self.spot.step - g.step0),
            trained_seconds=float(g.result["seconds"]) if done else 0.0,
            drafter_version=self.drafter_version,
            checkpoint_pending=self.spot.checkpoint_pending(),
            worker="" if g is None else g.worker_id,
            grant_id="" if g is None else g.grant_id,
            started_at=None if g is None else g.granted_at,
            finished_at=None if g is None else g.finished_at,
            step=self.spot.step,
            top1=_metric(m, "top1"),
            loss=_metric(m, "loss"),
            stop_reason=g.result["stop_reason"] if done else "none",
            message=message,
        )

    def preempt(self, grant_id: str | None = None, timeout: float | None = None) -> dict[str, Any]:
        """Take the grant back: stop training between steps, wait for the training thread, report the grant.

        Args:
            grant_id: the grant to release; None = whatever this replica holds. A grant this replica does
                not hold (already reported, never granted) is released already: zero steps, a message.
            timeout: seconds to wait for the in-flight step to finish; None = wait as long as it takes.
        Returns: ``{"released": bool (False: the step still runs after ``timeout``; the grant stays held
            and the next ``preempt`` reports it), "release_seconds": float (this call's wait),
            "steps_in_grant": int, "trained_seconds": float (training time under the grant; 0 while not
            released), "drafter_version": int, "checkpoint_pending": bool (an asynchronous checkpoint is
            still being written), "worker": str (worker_id, "" when none), "grant_id": str ("" when none),
            "started_at": float | None, "finished_at": float | None (time.time() seconds), "step": int
            (cumulative steps of this replica), "top1": float | None, "loss": float | None (the grant's
            last step), "stop_reason": str ("preempted", "deadline", "no_data", "error" or "none"),
            "message": str}``. A grant that ended on its own is reported with its own stop reason.
        """
        t0 = time.monotonic()
        with self._preempt_lock:
            with self._grant_lock:
                g = self._grant
            if g is None or (grant_id is not None and grant_id != g.grant_id):
                held = "" if g is None else f" (holding {g.grant_id!r})"
                what = "no grant" if grant_id is None else f"grant {grant_id!r} not"
                return self._report(
                    None, True, time.monotonic() - t0, f"{what} held{held}: nothing to release"
                )
            g.stop.set()
            assert g.thread is not None
            g.thread.join(timeout)
            if g.thread.is_alive():
                return self._report(
                    g, False, time.monotonic() - t0, f"the in-flight step still runs after {timeout} s"
                )
            with self._grant_lock:
                self._grant = None
            msg = g.error or f"released grant {g.grant_id!r} of worker {g.worker_id!r}"
            return self._report(g, True, time.monotonic() - t0, msg)

    def wait_grant(self, timeout: float | None = None) -> bool:
        """Wait until the held grant's training thread ends on its own (deadline, no data); True when no
        training thread runs afterwards. The grant stays held until ``preempt`` reports it."""
        g = self._grant
        if g is None or g.thread is None:
            return True
        g.thread.join(timeout)
        return not g.thread.is_alive()

    # ------------------------------------------------------------------ replicas: averaging, publishing
    def head_state(self) -> dict[str, Any]:
        """``{"state": draft-head state dict (detached clones), "steps_since_sync": int}``, read between steps
        (consistent even while a grant trains); input of ``sync_replicas``."""
        with self._step_lock:
            return dict(
                state={k: v.detach().clone() for k, v in self.head.state_dict().items()},
                steps_since_sync=self.steps_since_sync,
            )

    def load_head(self, state: Mapping[str, torch.Tensor]) -> None:
        """Load averaged draft-head weights (between steps; the optimizer state stays) and reset
        ``steps_since_sync``. Raises what ``load_state_dict`` raises for a state of another shape."""
        with self._step_lock:
            self.head.load_state_dict(dict(state))
            self.steps_since_sync = 0

    def publish(self) -> tuple[int, str]:
        """A new drafter version (leader only): writes it to ``ckpt_dir/published/v<version>/`` and returns
        ``(version, that folder)``; rollout actors load it from there (``LoadDrafter`` carries the path, the
        weights never travel over gRPC). Raises RuntimeError on a replica other than 0."""
        if not self.leader:
            raise RuntimeError(f"replica {self.replica} is not the leader: only replica 0 publishes")
        with self._step_lock:
            version = self.spot.publish()
        _, path = latest_published(self.spot.publish_dir)
        return version, str(path)

    # ------------------------------------------------------------------ status
    def stats(self) -> dict[str, Any]:
        """``{"step", "version" (newest published drafter), "published_path" (its folder, for the rollout
        actors' LoadDrafter; None before the first), "buffer" (HiddenStateBuffer.stats()), "resumed_step", "pid",
        "replica", "leader", "steps_since_sync", "trained_seconds_total"}``."""
        version, path = latest_published(self.spot.publish_dir)
        return {
            "step": self.spot.step,
            "version": max(version, self.spot.version),
            "published_path": None if path is None else str(path),
            "buffer": self.buffer.stats(),
            "stream": dict(self.receiver.stats(), dropped=dict(self.receiver.dropped)),
            "resumed_step": self.resumed_step,
            "pid": os.getpid(),
            "replica": self.replica,
            "leader": self.leader,
            "steps_since_sync": self.steps_since_sync,
            "trained_seconds_total": self.trained_seconds_total,
        }

    def status(self) -> dict[str, Any]:
        """What GetStatus answers, as a dict: ``{"service", "instance_id", "grpc_address" ("" when not
        serving), "started_at", "uptime_seconds", "message", "replica", "leader", "stream_address",
        "active_grants" (list of {"grant_id", "worker_id", "deadline", "rl_step", "policy_version",
        "granted_at"}), "training" (bool), "drafter_version", "train_steps", "steps_since_sync",
        "buffered_samples", "buffer_capacity", "samples_dropped_stale", "trained_seconds_total",
        "last_loss", "last_accuracy" (0.0 before the first step)}``."""
        g = self._grant
        b = self.buffer.stats()
        now = time.time()
        return dict(
            service=SERVICE_NAME,
            instance_id=f"spot_trainer-{self.replica}",
            grpc_address=self._grpc.address if self._grpc is not None else "",
            started_at=self.started_at,
            uptime_seconds=now - self.started_at,
            message=self.message,
            replica=self.replica,
            leader=self.leader,
            stream_address=self.receiver.address,
            active_grants=[] if g is None else [g.as_dict()],
            training=g is not None and g.result is None,
            drafter_version=self.drafter_version,
            train_steps=self.spot.step,
            steps_since_sync=self.steps_since_sync,
            buffered_samples=self.buffer.num_fresh(),
            buffer_capacity=b["capacity_tokens"],
            samples_dropped_stale=b["aged_out_tokens"],
            trained_seconds_total=self.trained_seconds_total,
            last_loss=float(self.last_metrics.get("loss") or 0.0),
            last_accuracy=float(self.last_metrics.get("top1") or 0.0),
        )

    # ------------------------------------------------------------------ gRPC
    def serve(self, host: str = "127.0.0.1", port: int = 0, token: str | None = None) -> str:
        """Serve ``tailspec.v1.SpotTrainerService`` (Grant, Preempt, GetStatus) from this process, on a
        background thread; returns ``"host:port"``. Serving again returns the running server's address.
        Every call must carry ``token`` (required: ValueError without one)."""
        if self._grpc is not None:
            return self._grpc.address
        adapter = SpotTrainerGrpc(self)
        # The service is thread-safe: no call lock, so GetStatus answers while a Preempt waits for a step.
        server = GrpcServer(
            [
                expose(
                    spot_trainer_pb2_grpc.SpotTrainerServiceServicer, adapter, lock=contextlib.nullcontext()
                )
            ],
            host=host,
            port=port,
            token=require_token(token, "a spot-trainer replica's gRPC service"),
            name=f"spot-trainer-{self.replica}",
        )
        server.start()
        self._grpc = server
        return server.address

    def close(self) -> None:
        """Stop a running grant (between steps), the gRPC server and the receiver; wait for the pending
        checkpoint. Idempotent; re-raises a failed checkpoint's error."""
        with self._grant_lock:
            if self._closed:
                return
            self._closed = True
            g = self._grant
        if g is not None and g.thread is not None:
            g.stop.set()
            g.thread.join()
        if self._grpc is not None:
            self._grpc.stop()
        self.receiver.close()
        self.spot.close()
