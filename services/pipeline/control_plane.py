"""The control plane of one RL job: the service actors and the gRPC calls between them.

Actors (Ray actors, or plain objects in-process with ``ray.use_ray=false``):

- the **coordinator** (``CoordinatorActor``): every worker's state machine, served over gRPC;
- the **rollout actors** (``RolloutWorker``): each serves ``RolloutService``, registers with the
  coordinator and heartbeats it, and reports its decode-step observations to the tuner;
- the **tuner** (``TunerService``): merges observations, serves strategy tables;
- the **spot trainer** replicas (``SpotTrainerService``, one per rollout actor by default): each trains the
  learned drafter on the bubble of the rollout actor it is placed with; rollout actors stream hidden states
  to all replicas over ZeroMQ (round-robin), replicas are averaged (local SGD) before each publish.

Control calls go over gRPC (state reports, grants, preemptions, strategy tables, drafter versions, status);
bulk tensors (policy weights, drafter heads for averaging, rollout results) stay on the Ray object store.

Placement and addresses: under Ray the rollout actors take the bundles of a ``SPREAD`` placement group and
spot-trainer replica ``i`` shares rollout bundle ``i`` (``services/common/placement.py``; the driver owns the
groups and removes them at stop). Every service binds ``grpc.host`` as ``services/common/hosts.py`` resolves it:
``auto`` is each actor's own Ray node IP on a multi-node cluster (bound and advertised, the hidden-state stream
too), ``127.0.0.1`` on one node.

Security: every service requires the run's secret on every call, loopback included. The secret is the
operator's (``grpc.token`` or ``$TAILSPEC_GRPC_TOKEN``) or generated here (``secrets.token_urlsafe``); it
reaches the actors only as Ray call arguments (never a command line, ``config.yaml`` or a log line) and is
written to ``<run_dir>/grpc_token`` (mode 0600) for ``tailspec status --run-dir``. The hidden-state stream is
authenticated with a MAC keyed by it. Rollout actors load drafter versions only from the run's own
``checkpoints/spot_trainer/published`` folder.

A rollout phase (``rollout_phase``): every actor decodes its shard; one that finishes early reports IDLE and,
when the spot trainer's buffer holds enough fresh data, the coordinator lends its bubble (a grant) to that
actor's spot-trainer replica until the phase ends (PREEMPT with deadline ``spot.preempt_deadline_s``). A
rollout actor that dies has its whole shard re-dispatched to a live actor (taken back from training if need
be), so every prompt ends with exactly G responses. A coordinator that stops answering is restarted and
rebuilt from the workers' own reports (they re-register in the state they believe they are in).
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import os
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import grpc

from services.common.config import Config
from services.common.grpc_server import TOKEN_ENV, new_token, write_token_file
from services.common.ray_utils import ActorPool
from services.rollout_actor.worker import RolloutRequest, RolloutWorker, ShardResult

log = logging.getLogger(__name__)


def actor_died(e: BaseException) -> bool:
    try:
        from ray.exceptions import RayActorError
    except ImportError:  # pragma: no cover
        return False
    return isinstance(e, RayActorError)


def _unavailable(e: BaseException) -> bool:
    return isinstance(e, grpc.RpcError) and e.code() in (
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
    )


class ControlPlane:
    """Starts, wires and stops the job's service actors; runs rollout phases and the phase-boundary calls.

    Args:
        cfg: the run config.
        model_path: HF folder of the initial policy.
        run_dir: checkpoints (tuner state, spot-trainer checkpoints and published drafters) go under it.
        learned: the learned-drafter config for the rollout actors (None without one).
        available_drafters: drafters the rollout actors have (tuner arms are filtered by it).
        run_info: the driver's view for the coordinator's ``GetStatus``.
        log_fn: progress lines.
    """

    def __init__(
        self,
        cfg: Config,
        model_path: Path,
        run_dir: Path,
        learned: dict | None,
        available_drafters: list[str],
        run_info: Callable[[], dict],
        log_fn=print,
        placement=None,
    ):
        self.cfg = cfg
        self.model_path = model_path
        self.run_dir = run_dir
        self.learned = learned
        self.available_drafters = available_drafters
        self.run_info = run_info
        self.log = log_fn
        self.use_ray = cfg.ray.use_ray
        # where services bind (grpc.host; services/common/hosts.py): `auto` is settled here, once per run
        # (``node`` on a multi-node Ray cluster: each actor binds and advertises its own node's IP)
        from services.common.hosts import multi_node, run_host

        self.host = run_host(cfg.grpc.host, self.use_ray and multi_node())
        # placement groups (services/common/placement.py): the driver's, else this plane's own
        self.placement = placement
        self._owns_placement = False
        # the run's secret: the operator's, else a fresh one (never logged, never in config.yaml)
        self.token = cfg.grpc.token or os.environ.get(TOKEN_ENV) or new_token()
        self.coordinator_pool: ActorPool | None = None
        self.coordinator = None  # CoordinatorClient
        self.coordinator_address: str | None = None
        self.coordinator_restarts = 0
        self.tuner: ActorPool | None = None
        self.tuner_client = None
        self.initial_table: dict | None = None
        self.tuner_restarts = 0
        self.rollout: ActorPool | None = None
        self.rollout_clients: list = []
        self.worker_ids: list[int] = []
        self.spot: ActorPool | None = None
        self.spot_clients: list = []
        self.spot_grants: list[dict] = []  # grants of the last rollout phase (their PreemptResponse dicts)
        self.spot_restarts = 0
        self.drafter_version = 0
        self.learned_top1: float | None = None  # the spot trainer's latest top-1 accuracy (None: not trained)

    # ------------------------------------------------------------------ start / stop
    @property
    def drafter_dir(self) -> Path:
        """The run's published-drafter folder: the only place rollout actors load drafters from."""
        from services.spot_trainer.service import published_dir

        return published_dir(self.run_dir / "checkpoints" / "spot_trainer")

    def start(self) -> None:
        cfg = self.cfg
        self.run_dir.mkdir(parents=True, exist_ok=True)
        write_token_file(self.run_dir, self.token)
        n = cfg.rollout.num_actors
        self.worker_ids = list(range(n))
        if self.placement is None:
            from services.common.placement import RunPlacement

            self.placement = RunPlacement.from_config(cfg)
            self._owns_placement = True
        self.placement.create()
        self._start_coordinator()
        if cfg.tuner.enabled:
            from services.tuner.grpc_service import TunerClient
            from services.tuner.service import TunerService

            ckpt = str(self.run_dir / "checkpoints" / "tuner_state.json")
            # absolute: the tuner actor's working directory may differ from the driver's
            init = str(Path(cfg.tuner.init_state).resolve()) if cfg.tuner.init_state else None
            self.tuner = ActorPool.create(
                TunerService,
                [(cfg.tuner.arms, dict(cfg.tuner.bandit), self.available_drafters, ckpt, init)],
                self.use_ray,
                num_cpus=0,
            )
            self.tuner_client = TunerClient(self.tuner.call(0, "serve", self.host, 0, self.token), self.token)
        sampling = dict(
            temperature=cfg.rollout.temperature,
            top_p=cfg.rollout.top_p,
            top_k=cfg.rollout.top_k,
            max_new_tokens=cfg.rollout.max_new_tokens,
        )
        table = self.strategy_table() if self.tuner_client is not None else None
        self.initial_table = table  # the first strategy table (its buckets and arms label the arm metrics)
        self.rollout = ActorPool.create(
            RolloutWorker,
            [(i, str(self.model_path), sampling) for i in range(n)],
            self.use_ray,
            num_cpus=cfg.rollout.threads_per_actor,
            num_gpus=cfg.rollout.gpus_per_actor,
            options_list=[self.placement.rollout_options(i) for i in range(n)],
            kwargs_list=[
                dict(
                    max_batch_size=cfg.rollout.max_batch_size,
                    threads=cfg.rollout.threads_per_actor,
                    speculative=asdict(cfg.rollout.speculative),
                    tuner_table=table,
                    tuner_budgets=dict(cfg.tuner.budgets),
                    learned=self.learned,
                    drafter_dir=str(self.drafter_dir),
                    metrics=cfg.metrics.enabled,
                )
                for _ in range(n)
            ],
        )
        from services.rollout_actor.grpc_service import RolloutClient

        addresses = self.rollout.call_all("serve", [(self.host, 0, self.token)] * n)
        self.rollout_clients = [RolloutClient(a, self.token) for a in addresses]
        self.rollout.call_all(
            "connect_coordinator",
            [(self.coordinator_address, self.token, cfg.coordinator.heartbeat_interval_s)] * n,
        )
        if self.tuner is not None:
            self.rollout.call_all("connect_tuner", [(self.tuner_client.address, self.token)] * n)
        self._start_spot_trainer(n)

    def _start_coordinator(self) -> None:
        from services.coordinator.service import CoordinatorActor, CoordinatorClient

        c, s = self.cfg.coordinator, self.cfg.spot
        self.coordinator_pool = ActorPool.create(
            CoordinatorActor,
            [(c.heartbeat_timeout_s, s.preempt_deadline_s, s.min_fresh_samples, c.heartbeat_interval_s)],
            self.use_ray,
            num_cpus=0,
            # the run's workers and the driver's view: anything else reported over gRPC is refused
            kwargs_list=[
                dict(
                    worker_ids=[str(w) for w in self.worker_ids],
                    initial_run=self.run_info(),
                    metrics=self.cfg.metrics.enabled,
                )
            ],
        )
        self.coordinator_address = self.coordinator_pool.call(0, "serve", self.host, c.port, self.token)
        self.coordinator = CoordinatorClient(self.coordinator_address, self.token)
        (self.run_dir / "coordinator_address").write_text(self.coordinator_address + "\n")

    def restart_coordinator(self, why: str = "") -> None:
        """A fresh coordinator actor, rebuilt from the workers' own reports: every live rollout actor
        re-registers in the state it believes it is in (ROLLOUT while decoding, else what the old
        coordinator last told it)."""
        old = self.coordinator_pool
        if old is not None:
            try:
                old.shutdown()
            except Exception:  # already dead
                pass
            self.coordinator.close()
        self.coordinator_restarts += 1
        self._start_coordinator()
        states = self.rollout.call_all(
            "connect_coordinator",
            [(self.coordinator_address, self.token, self.cfg.coordinator.heartbeat_interval_s)]
            * len(self.rollout),
        )
        self.log(
            f"coordinator restarted ({why}) at {self.coordinator_address}; rebuilt from worker reports: "
            + ", ".join(f"{w}={s}" for w, s in zip(self.worker_ids, states))
        )
        self.report_run()

    def coord(self, method: str, *args, **kwargs) -> Any:
        """A coordinator call; a coordinator that is gone is restarted (once per call) and the call retried."""
        try:
            return getattr(self.coordinator, method)(*args, **kwargs)
        except grpc.RpcError as e:
            if not _unavailable(e):
                raise
            self.restart_coordinator(f"{method}: {e.code().name}")
            return getattr(self.coordinator, method)(*args, **kwargs)

    def report_run(self) -> None:
        try:
            self.coord("report_run", self.run_info())
        except grpc.RpcError as e:  # status is best effort; the run goes on
            log.warning("report_run failed: %s", e)

    def _start_spot_trainer(self, n: int) -> None:
        cfg = self.cfg
        if not (cfg.spot.enabled and self.learned is not None):
            return
        from services.spot_trainer.grpc_service import SpotTrainerClient
        from services.spot_trainer.service import SpotTrainerService

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
        from services.spot_trainer.grpc_service import SpotTrainerClient

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

    def stop(self) -> None:
        keep = self.cfg.coordinator.keep_serving
        if self.spot is not None:
            self.spot.call_all("close", [()] * len(self.spot))
        if self.rollout is not None:
            self.rollout.call_all("close", [()] * len(self.rollout))
        if self.tuner is not None:
            try:
                self.tuner.call(0, "close")
            except Exception as e:  # noqa: BLE001 - a dead tuner has nothing left to close
                log.warning("tuner close: %s", e)
        if self.coordinator_pool is not None:
            self.coordinator_pool.call(0, "close", keep)
        for client in [self.coordinator, self.tuner_client, *self.rollout_clients, *self.spot_clients]:
            if client is not None:
                client.close()
        for pool in (self.rollout, self.tuner, self.spot):
            if pool is not None:
                pool.shutdown()
        if self.coordinator_pool is not None and not keep:
            self.coordinator_pool.shutdown()
        if self._owns_placement and self.placement is not None:
            self.placement.remove()

    # ------------------------------------------------------------------ spot trainer
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
            if not _unavailable(e):
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
                if not _unavailable(e):
                    raise
                return {"worker": w, "grant_id": g["grant_id"], "trained_seconds": 0.0, "steps_in_grant": 0}

        with cf.ThreadPoolExecutor(max_workers=len(worker_ids)) as ex:
            outs = list(ex.map(preempt, worker_ids))
        for w, out in zip(worker_ids, outs):
            g = training.pop(w)
            gid = g["grant_id"] if g.get("epoch") == self.coordinator_restarts else None
            self.coord("report_state", w, "IDLE", "training stopped", 0, gid, int(out.get("step") or 0))
        return outs

    # ------------------------------------------------------------------ one rollout phase
    def rollout_phase(
        self, step: int, shards: list[list[RolloutRequest]], keep_snapshot: bool
    ) -> tuple[list[ShardResult], dict[str, float], float]:
        """Decode every shard; lend bubbles to the spot trainer; take them back at the end.

        Returns (results in shard order, trained seconds per worker id, phase end wall time)."""
        self.ensure_spot()
        wids = [str(w) for w in self.worker_ids]
        for w in wids:
            self.coord("report_state", w, "ROLLOUT", "rollout started", step)
        outstanding = {i: 1 for i in range(len(shards))}  # pool index -> shards in flight
        futures = {
            self.rollout.submit(i, "rollout", shard, step, keep_snapshot): (i, i)
            for i, shard in enumerate(shards)
        }
        results: dict[int, ShardResult] = {}
        training: dict[str, dict] = {}  # worker id -> grant (plus the coordinator epoch it came from)
        dead: set[int] = set()
        self.spot_grants = []
        pending = set(futures)
        while pending:
            done, pending = cf.wait(pending, return_when=cf.FIRST_COMPLETED)
            for f in done:
                s_idx, i = futures[f]
                outstanding[i] -= 1
                try:
                    results[s_idx] = f.result()
                except Exception as e:
                    if not actor_died(e) or i in dead:  # a bug in the rollout itself is not retried
                        raise
                    # re-dispatch the whole shard (a shard returns all or nothing: none lost, none doubled)
                    dead.add(i)
                    self.coord("report_state", wids[i], "FAILED", f"rollout actor died: {type(e).__name__}")
                    live = [j for j in range(len(wids)) if j not in dead]
                    if not live:
                        raise RuntimeError("every rollout actor died") from e
                    j = min(live, key=lambda k: (outstanding[k] == 0, -outstanding[k], k))
                    if outstanding[j] == 0:  # an idle (maybe training) actor: take it back first
                        self.spot_grants += self._take_back(
                            training, [wids[j]] if wids[j] in training else [], "re-dispatch"
                        )
                        self.coord("report_state", wids[j], "ROLLOUT", "re-dispatched shard", step)
                    outstanding[j] += 1
                    nf = self.rollout.submit(j, "rollout", shards[s_idx], step, False)
                    futures[nf] = (s_idx, j)
                    pending.add(nf)
                    self.log(
                        f"rollout actor {wids[i]} died; its {len(shards[s_idx])} requests re-dispatched to "
                        f"actor {wids[j]}"
                    )
                    continue
                if outstanding[i] > 0:
                    continue
                r = self.coord("report_state", wids[i], "IDLE", "rollout share finished")
                grants = [r["grant"]] if r["grant"] else []
                if self.spot is not None:
                    grants += self.coord("request_training", self._num_fresh())
                for g in grants:
                    g["epoch"] = self.coordinator_restarts
                    if pending and self._grant(g):  # a bubble exists only while other actors still decode
                        training[g["worker_id"]] = g
                    elif not pending:  # the phase is over: hand the worker straight back
                        self.coord("request_rollout", [g["worker_id"]], "rollout phase over")
                        self.coord("report_state", g["worker_id"], "IDLE", "phase over", 0, g["grant_id"])
        for i in sorted(dead, reverse=True):  # later steps shard over the surviving actors
            self._drop_rollout(i)
        phase_end = time.time()
        self.spot_grants += self._take_back(training, list(training), "rollout phase over: policy update")
        trained: dict[str, float] = {}
        for out in self.spot_grants:
            trained[str(out["worker"])] = trained.get(str(out["worker"]), 0.0) + out["trained_seconds"]
        return [results[i] for i in sorted(results)], trained, phase_end

    def _drop_rollout(self, i: int) -> None:
        """Remove rollout actor ``i`` (pool index, dead) from the pool, its client and the worker ids."""
        self.rollout.remove(i)
        self.rollout_clients.pop(i).close()
        del self.worker_ids[i]

    def _each_rollout(self, what: str, call) -> list:
        """``call(i)`` for every rollout actor, in parallel; an actor found dead (Ray says so, or its gRPC
        server is gone) is reported FAILED to the coordinator and dropped, so later steps run on the survivors.

        Returns the survivors' results in pool order. Raises ``RuntimeError`` if every actor died, and any
        other error as it is (a bug is not a fault)."""
        n = len(self.rollout)
        with cf.ThreadPoolExecutor(max_workers=max(1, n)) as ex:
            futures = [ex.submit(call, i) for i in range(n)]
        out, dead = {}, []
        for i, f in enumerate(futures):
            try:
                out[i] = f.result()
            except Exception as e:
                if not (actor_died(e) or _unavailable(e)):
                    raise
                dead.append(i)
                w = str(self.worker_ids[i])
                self.coord(
                    "report_state", w, "FAILED", f"rollout actor died during {what}: {type(e).__name__}"
                )
                self.log(f"rollout actor {w} died during {what}; later steps run on the survivors")
        if dead and len(dead) == n:
            raise RuntimeError(f"every rollout actor died during {what}")
        for i in reversed(dead):
            self._drop_rollout(i)
        return [out[i] for i in sorted(out)]

    def load_weights(self, state, version: int) -> None:
        """Weight sync: every rollout actor loads the policy ``state`` (a state dict, or its Ray object ref)
        at ``version``; an actor that dies meanwhile is dropped (``_each_rollout``)."""
        self._each_rollout(
            "weight sync", lambda i: self.rollout.submit(i, "load_weights", state, version).result()
        )

    # ------------------------------------------------------------------ phase boundary
    def gated_drafters(self) -> list[str]:
        """Drafters kept out of the table: the learned drafter's (``learned``, ``hybrid``) while the spot
        trainer's latest top-1 accuracy is below ``tuner.learned_min_top1`` (or it has not trained yet)."""
        learned = [d for d in ("learned", "hybrid") if d in self.available_drafters]
        bar = self.cfg.tuner.learned_min_top1
        if not learned or bar <= 0 or (self.learned_top1 is not None and self.learned_top1 >= bar):
            return []
        return learned

    def strategy_table(self) -> dict:
        """The tuner's merged table, gated (``gated_drafters``)."""
        from services.tuner.bandit import gate_table

        return gate_table(self.tuner_client.table(), self.gated_drafters())

    def restart_tuner(self, why: str) -> bool:
        """A fresh tuner actor, resumed from its own checkpoint (``checkpoints/tuner_state.json``, written at
        every merge), served anew and handed to the rollout actors. False (and a warning) when even that fails:
        the run goes on, the actors keep their last table."""
        from services.tuner.grpc_service import TunerClient

        try:
            self.tuner.respawn(0)
            old, self.tuner_client = self.tuner_client, None
            if old is not None:
                old.close()
            self.tuner_client = TunerClient(self.tuner.call(0, "serve", self.host, 0, self.token), self.token)
            n = len(self.rollout)
            self.rollout.call_all("connect_tuner", [(self.tuner_client.address, self.token)] * n)
        except Exception as e:  # noqa: BLE001 - the tuner is advisory: never stop the run for it
            log.warning("tuner restart failed (%s): %s; the rollout actors keep their last table", why, e)
            return False
        self.tuner_restarts += 1
        self.log(f"tuner restarted ({why}) from its checkpoint at {self.tuner_client.address}")
        return True

    def tune(self, results: list[ShardResult]) -> dict:
        """The tuner's merged table to every rollout actor (gRPC); the row's tuner statistics. A tuner that
        died is restarted from its checkpoint; if that fails, the step's row says so and the actors keep their
        last table."""
        try:
            table = self.strategy_table() if self.tuner_client is not None else None
        except Exception as e:
            if not (actor_died(e) or _unavailable(e)):
                raise
            table = self.strategy_table() if self.restart_tuner(type(e).__name__) else None
        if table is None:
            return {"tuner_unavailable": True, "tuner_restarts": self.tuner_restarts}
        self._each_rollout("table update", lambda i: self.rollout_clients[i].set_table(table))
        stats = self.tuner_client.status()
        choices: dict[str, int] = {}
        by_bucket: dict[str, dict[str, int]] = {}
        for res in results:
            for arm, c in (res.choices or {}).items():
                choices[arm] = choices.get(arm, 0) + c
            for bucket, arms in (res.choices_by_bucket or {}).items():
                into = by_bucket.setdefault(bucket, {})
                for arm, c in arms.items():
                    into[arm] = into.get(arm, 0) + c
        buckets = [b for b in stats["buckets"] if b["observations"]]
        chosen = sum(b["chosen"] for b in buckets)
        return {
            "table_version": table["version"],
            "tuner_restarts": self.tuner_restarts,
            "gated_drafters": self.gated_drafters(),
            "observations": sum(res.observations_reported for res in results),
            "choices": choices,
            "choices_by_bucket": by_bucket,
            "best_by_bucket": {bucket_name(b): b["best"] for b in buckets},
            "exploration_fraction": sum(b["explored"] for b in buckets) / chosen if chosen else 0.0,
            "arm_reward_median": {
                bucket_name(b): {a: v["median"] for a, v in b["arms"].items() if v["n"]} for b in buckets
            },
        }

    def after_update(self, state, version: int) -> dict:
        """Phase boundary: the spot trainer follows the policy; replicas that trained are averaged and a new
        drafter version is published and loaded by every rollout actor (never in the middle of a request)."""
        if self.spot is None:
            return {}
        from services.spot_trainer.service import sync_replicas

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

    def timeline(self) -> tuple[list, list]:
        """The coordinator's Gantt bars and rollout phases (since its last restart)."""
        from services.coordinator.coordinator import Phase, TimelineEvent

        events, phases = self.coordinator_pool.call(0, "timeline")
        return [TimelineEvent(*e) for e in events], [Phase(*p) for p in phases]


def bucket_name(b: dict) -> str:
    from services.common.metrics import bucket_label

    return bucket_label(b["lo"], b.get("hi"))
