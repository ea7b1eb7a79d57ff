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

``ControlPlane`` is this module (coordinator, rollout actors, rollout phases) plus its tuner side
(``control_plane_tuner.py``) and its spot-trainer side (``control_plane_spot.py``).
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
from services.common.grpc_auth import TOKEN_ENV, new_token, write_token_file
from services.common.hosts import multi_node, run_host
from services.common.placement import RunPlacement
from services.common.ray_utils import ActorPool
from services.coordinator.client import CoordinatorClient
from services.coordinator.coordinator import Phase, TimelineEvent
from services.coordinator.service import CoordinatorActor
from services.pipeline.control_plane_spot import ControlPlaneSpot
from services.pipeline.control_plane_tuner import ControlPlaneTuner
from services.pipeline.faults import actor_died, unavailable
from services.rollout_actor.grpc_service import RolloutClient
from services.rollout_actor.shard import RolloutRequest, ShardResult
from services.rollout_actor.worker import RolloutWorker

log = logging.getLogger(__name__)


class ControlPlane(ControlPlaneTuner, ControlPlaneSpot):
    """Starts, wires and stops the job's service actors; runs rollout phases and the phase-boundary calls.

    Args:
        cfg: the run config.
        model_path: HF folder of the initial policy.
        run_dir: checkpoints (tuner state, spot-trainer checkpoints and published drafters) go under it.
        learned: the learned-drafter config for the rollout actors (None without one).
        available_drafters: drafters the rollout actors have (tuner arms are filtered by it).
        run_info: the driver's view for the coordinator's ``GetStatus``.
        log_fn: progress lines.
        placement: the run's placement groups (``RunPlacement``; None: the plane makes and removes its own).
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
    def start(self) -> None:
        cfg = self.cfg
        self.run_dir.mkdir(parents=True, exist_ok=True)
        write_token_file(self.run_dir, self.token)
        n = cfg.rollout.num_actors
        self.worker_ids = list(range(n))
        if self.placement is None:
            self.placement = RunPlacement.from_config(cfg)
            self._owns_placement = True
        self.placement.create()
        self._start_coordinator()
        self._start_tuner()
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
            if not unavailable(e):
                raise
            self.restart_coordinator(f"{method}: {e.code().name}")
            return getattr(self.coordinator, method)(*args, **kwargs)

    def report_run(self) -> None:
        try:
            self.coord("report_run", self.run_info())
        except grpc.RpcError as e:  # status is best effort; the run goes on
            log.warning("report_run failed: %s", e)

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
                if not (actor_died(e) or unavailable(e)):
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

    # ------------------------------------------------------------------ end of the run
    def timeline(self) -> tuple[list, list]:
        """The coordinator's Gantt bars and rollout phases (since its last restart)."""
        events, phases = self.coordinator_pool.call(0, "timeline")
        return [TimelineEvent(*e) for e in events], [Phase(*p) for p in phases]
