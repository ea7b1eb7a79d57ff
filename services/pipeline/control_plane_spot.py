"""The control plane's spot-trainer side: the replicas that train the learned drafter in rollout bubbles.

Starting the replicas (one per rollout actor by default, each placed with its rollout actor) and the
rollout actors' hidden-state streams to them; lending a bubble (a coordinator grant) to a replica and taking
it back; restarting replicas that died; and at each phase boundary following the policy, averaging the
replicas that trained and publishing a new drafter version to every rollout actor.

``ControlPlaneSpot`` is a part of ``ControlPlane`` (``services/pipeline/control_plane.py``): it uses the
plane's ``cfg``, ``run_dir``, ``model_path``, ``host``, ``token``, ``use_ray``, ``learned``, ``placement``,
``rollout``, ``rollout_clients``, ``run_info``, ``log``, ``coord``, ``coordinator_restarts`` and
``_each_rollout``, and owns ``spot`` (the replicas' ``ActorPool``, None without spot training),
``spot_clients``, ``spot_grants``, ``spot_restarts``, ``drafter_version`` and ``learned_top1``.
"""

from __future__ import annotations

import concurrent.futures as cf
import time
from pathlib import Path

import grpc

from services.common.ray_utils import ActorPool
from services.pipeline.faults import actor_died, unavailable
from services.spot_trainer.grpc_service import SpotTrainerClient
from services.spot_trainer.replicas import published_dir, sync_replicas
from services.spot_trainer.service import SpotTrainerService


class ControlPlaneSpot:
    """The spot trainer's replicas and calls (a part of ``ControlPlane``)."""

    @property
    def drafter_dir(self) -> Path:
        """The run's published-drafter folder: the only place rollout actors load drafters from."""
        return published_dir(self.run_dir / "checkpoints" / "spot_trainer")

    def _start_spot_trainer(self, n: int) -> None:
        cfg = self.cfg
        if not (cfg.spot.enabled and self.learned is not None):
            return
        s = cfg.spot
        replicas = s.replicas if s.replicas is not None else n
        kwargs = dict(
            eagle3=cfg.rollout.speculative.eagle3,
            seed=cfg.run.seed,
            capacity_tokens=s.capacity_tokens,
            keep_versions=s.keep_versions,
            batch_size=s.batch_size,
            seq_len=s.seq_len,
            lr=s.lr,
            checkpoint_every=s.checkpoint_every,
            min_samples=s.min_fresh_samples,
            nice=s.nice,
            token=self.token,  # the stream's MAC key (a Ray call argument, like the gRPC token)
            stream_host=self.host,  # the hidden-state stream binds like the gRPC services
        )
        ckpt = str(self.run_dir / "checkpoints" / "spot_trainer")
        self.spot = ActorPool.create(
            SpotTrainerService,
            [(str(self.model_path), ckpt) for _ in range(replicas)],
            self.use_ray,
            num_cpus=0,
            kwargs_list=[dict(kwargs, replica=i) for i in range(replicas)],
            max_concurrency=4,
            options_list=[self.placement.spot_options(i) for i in range(replicas)],
        )
        addresses = self.spot.call_all("serve", [(self.host, 0, self.token)] * replicas)
        self.spot_clients = [SpotTrainerClient(a, self.token) for a in addresses]
        self._connect_streams()

    def _connect_streams(self) -> None:
        streams = self.spot.call_all("address", [()] * len(self.spot))
        fraction = self.cfg.spot.stream_fraction
        self.rollout.call_all("connect_spot_trainer", [(streams, fraction, self.token)] * len(self.rollout))

    def ensure_spot(self) -> list[int]:
        """At a phase boundary: every spot-trainer replica that died is started again on its checkpoint
        folder (it resumes its newest checkpoint; published versions never go back) and the rollout actors'
        hidden-state streams are re-pointed. Returns the replicas restarted."""
        if self.spot is None:
            return []
        dead = []
        for i in range(len(self.spot)):
            try:
                self.spot.call(i, "ping")
            except Exception as e:
                if not actor_died(e):
                    raise
                dead.append(i)
        for i in dead:
            self.spot.respawn(i)
            self.spot_clients[i].close()
            self.spot_clients[i] = SpotTrainerClient(
                self.spot.call(i, "serve", self.host, 0, self.token), self.token
            )
            self.spot_restarts += 1
            self.spot.call(i, "set_policy_version", int(self.run_info().get("policy_version", 0)))
            st = self.spot.call(i, "stats")
            self.log(
                f"spot-trainer replica {i} died; restarted from its checkpoint at step {st['resumed_step']} "
                f"(published drafter version {st['version']})"
            )
        if dead:
            self._connect_streams()
        return dead

    def _replica(self, worker_id: str) -> int:
        """The spot-trainer replica placed with this rollout actor."""
        return int(worker_id) % len(self.spot_clients)

    def _num_fresh(self) -> int:
        """Fresh samples per replica (the least-fed one: every granted replica must have data); 0 while a
        replica is down (it is restarted at the next phase boundary)."""
        try:
            return min(self.spot.call_all("num_fresh", [()] * len(self.spot)))
        except Exception as e:
            if not actor_died(e):
                raise
            return 0

    def _grant(self, g: dict) -> bool:
        """Hand a coordinator grant to the worker's replica, bounded by ``spot.grant_deadline_s`` (the phase
        end preempts it sooner); False (and the worker released) if refused."""
        g = dict(g, deadline=time.time() + self.cfg.spot.grant_deadline_s)
        try:
            out = self.spot_clients[self._replica(g["worker_id"])].grant(g)
        except grpc.RpcError as e:  # the replica is down: no training on this bubble
            if not unavailable(e):
                raise
            out = {"accepted": False, "message": f"replica unavailable ({e.code().name})"}
        if not out["accepted"]:
            self.coord(
                "report_state", g["worker_id"], "IDLE", f"grant refused: {out['message']}", 0, g["grant_id"]
            )
        return bool(out["accepted"])

    def _take_back(self, training: dict[str, dict], worker_ids: list[str], reason: str) -> list[dict]:
        """Preempt the training on ``worker_ids`` (coordinator first, then the replicas, in parallel) and
        report them IDLE; returns the replicas' PreemptResponse dicts."""
        if not worker_ids:
            return []
        req = self.coord("request_rollout", worker_ids, reason)
        release_by = {p["worker_id"]: p["release_by"] for p in req["preemptions"]}
        deadline = self.cfg.spot.preempt_deadline_s

        def preempt(w: str) -> dict:
            g = training[w]
            try:
                return self.spot_clients[self._replica(w)].preempt(
                    g["grant_id"], release_by.get(w), deadline + 60
                )
            except grpc.RpcError as e:  # the replica died while training: its grant's work is lost
                if not unavailable(e):
                    raise
                return {"worker": w, "grant_id": g["grant_id"], "trained_seconds": 0.0, "steps_in_grant": 0}

        with cf.ThreadPoolExecutor(max_workers=len(worker_ids)) as ex:
            outs = list(ex.map(preempt, worker_ids))
        for w, out in zip(worker_ids, outs):
            g = training.pop(w)
            gid = g["grant_id"] if g.get("epoch") == self.coordinator_restarts else None
            self.coord("report_state", w, "IDLE", "training stopped", 0, gid, int(out.get("step") or 0))
        return outs

    def after_update(self, state, version: int) -> dict:
        """Phase boundary: the spot trainer follows the policy; replicas that trained are averaged and a new
        drafter version is published and loaded by every rollout actor (never in the middle of a request)."""
        if self.spot is None:
            return {}
        self.ensure_spot()
        k = len(self.spot)
        self.spot.call_all("update_policy", [(state, version)] * k)
        out: dict = {
            "spot_grants": len(self.spot_grants),
            "spot_replicas": k,
            "spot_restarts": self.spot_restarts,
        }
        if any(g.get("steps_in_grant", 0) > 0 for g in self.spot_grants):
            avg = sync_replicas(self.spot.call_all("head_state", [()] * k))
            if avg is not None:
                self.spot.call_all("load_head", [(avg,)] * k)
            dv, path = self.spot.call(0, "publish")
            self._each_rollout("drafter load", lambda i: self.rollout_clients[i].load_drafter(dv, path))
            self.drafter_version = dv
            trained = [g for g in self.spot_grants if g.get("steps_in_grant", 0) > 0]
            if trained[-1].get("top1") is not None:
                self.learned_top1 = float(trained[-1]["top1"])
            out.update(
                spot_train_steps=sum(g["steps_in_grant"] for g in self.spot_grants),
                spot_top1=trained[-1].get("top1"),
                spot_loss=trained[-1].get("loss"),
            )
        stats = self.spot.call_all("stats", [()] * k)
        out["spot_buffer_tokens"] = sum(st["buffer"].get("tokens", 0) for st in stats)
        out["spot_buffer_dropped"] = sum(st["buffer"].get("dropped", 0) for st in stats)
        return out
