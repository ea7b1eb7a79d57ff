"""The services of one RL run, started and stopped together, and the policy-trainer calls that survive the
trainer actor's death.

``RunServices.start``: Ray (when used and not running yet), the metrics exporter, bubble accounting, the
placement groups, the control plane (coordinator, tuner, rollout actors, spot trainer, all speaking gRPC:
``services/pipeline/control_plane.py``), then the policy-trainer actor. ``stop`` takes them down in reverse.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from services.common.config import Config, resolve_path
from services.common.metrics import TailspecMetrics, install_process_metrics, table_arm_buckets
from services.common.placement import RunPlacement
from services.common.ray_utils import ActorPool, init_ray
from services.pipeline.checkpoints import latest_checkpoint
from services.pipeline.control_plane import ControlPlane
from services.pipeline.faults import actor_died
from services.policy_trainer.actor import PolicyTrainerService
from services.spot_trainer.bubbles import BubbleAccounting
from services.spot_trainer.stream import DROP_REASONS


def learned_drafter_config(cfg: Config) -> dict | None:
    """The learned-drafter config the rollout actors get (None when ``rollout.speculative.learned`` is off)."""
    spec = cfg.rollout.speculative
    if not spec.learned:
        return None
    ckpt = str(resolve_path(spec.learned_checkpoint)) if spec.learned_checkpoint else None
    return {
        "checkpoint": ckpt,
        "eagle3": spec.eagle3,
        "seed": cfg.run.seed,
        "hybrid_threshold": spec.hybrid_threshold,
    }


def speculating(cfg: Config) -> bool:
    """Whether the run drafts at all (the tuner, or a fixed speculative strategy)."""
    return cfg.tuner.enabled or (cfg.rollout.speculative.enabled and cfg.rollout.speculative.drafter != "off")


def available_drafters(cfg: Config) -> list[str]:
    """The drafters the rollout actors have (tuner arms are filtered by it)."""
    return ["suffix", "ngram"] + (["learned", "hybrid"] if cfg.rollout.speculative.learned else [])


class RunServices:
    """The run's services. ``run_info``: the driver's view for the coordinator's ``GetStatus``.

    After ``start``: ``metrics`` (None when ``metrics.enabled`` is off) and ``metrics_endpoint`` (the
    Prometheus URL, when served here), ``bubbles``, ``placement``, ``plane`` and ``trainer`` (the
    policy-trainer ``ActorPool``). ``updates_since_checkpoint`` holds each GRPO update's samples since the
    newest step checkpoint (the driver appends and clears it), for ``restart_trainer`` to replay.
    """

    def __init__(self, cfg: Config, model_path: Path, run_dir: Path, run_info: Callable[[], dict], log=print):
        self.cfg, self.model_path, self.run_dir = cfg, model_path, run_dir
        self.run_info, self.log = run_info, log
        self.owns_ray = False
        self.metrics: TailspecMetrics | None = None
        self.metrics_endpoint: str | None = None
        self.bubbles = BubbleAccounting()
        self.placement: RunPlacement | None = None
        self.plane: ControlPlane | None = None
        self.trainer: ActorPool | None = None
        self.updates_since_checkpoint: list[list[dict]] = []
        self.trainer_restarts = 0

    def start(self) -> None:
        cfg = self.cfg
        if cfg.ray.use_ray:
            import ray  # Ray loads only for runs that use it (ray.use_ray=false runs in-process)

            if not ray.is_initialized():
                self.owns_ray = True
                self.log(init_ray(cfg.ray.address, cfg.ray.num_cpus, cfg.ray.temp_dir))
        if cfg.metrics.enabled:
            backend = "ray" if cfg.ray.use_ray else "prometheus"
            self.metrics = TailspecMetrics(backend=backend)
            install_process_metrics(self.metrics)  # in-process services export live through the driver's
            if cfg.metrics.port is not None and backend == "prometheus":
                port = self.metrics.start_http_server(cfg.metrics.port, cfg.metrics.host)
                self.metrics_endpoint = f"http://{cfg.metrics.host}:{port}/metrics"
                self.log(f"metrics: {self.metrics_endpoint}")
        # placement groups (rollout actors spread, the trainer in its own bundle): created by the plane's
        # start, removed by stop
        self.placement = RunPlacement.from_config(cfg)
        self.plane = ControlPlane(
            cfg,
            self.model_path,
            self.run_dir,
            learned_drafter_config(cfg),
            available_drafters(cfg),
            self.run_info,
            self.log,
            placement=self.placement,
        )
        self.plane.start()
        if self.metrics is not None:  # every labelled series at zero, so that increase() counts step 1
            table = self.plane.initial_table
            self.metrics.init_series(
                [str(w) for w in self.plane.worker_ids],
                available_drafters(cfg) if speculating(cfg) else (),
                table_arm_buckets(table) if table else (),
                DROP_REASONS if self.plane.spot is not None else (),
            )
        self.log(
            f"coordinator at {self.plane.coordinator_address}: tailspec status --run-dir {self.run_dir} "
            "(the run's token is in its grpc_token file, mode 0600)"
        )
        self.trainer = ActorPool.create(
            PolicyTrainerService,
            [(str(self.model_path), asdict(cfg.trainer), cfg.run.seed)],
            cfg.ray.use_ray,
            num_cpus=0,
            num_gpus=cfg.trainer.gpus,
            options_list=[self.placement.trainer_options()],
        )

    def stop(self) -> None:
        """Stop whatever ``start`` got to: the control plane (after a last ``report_run``), the trainer, the
        placement groups, and Ray when it was started here."""
        if self.metrics is not None:
            install_process_metrics(None)
        if self.plane is not None:
            self.plane.report_run()
            self.plane.stop()
        if self.trainer is not None:
            self.trainer.shutdown()
        if self.placement is not None:
            self.placement.remove()
        if self.owns_ray:
            import ray  # started by ``start``, so already loaded

            ray.shutdown()

    def trainer_call(self, method: str, *args):
        """A policy-trainer call; a trainer actor that died is restarted once (``restart_trainer``) and the
        call repeated, so the run goes on with the step in flight redone."""
        try:
            return self.trainer.call(0, method, *args)
        except Exception as e:
            if not actor_died(e):
                raise
            self.restart_trainer(f"{method}: {type(e).__name__}")
            return self.trainer.call(0, method, *args)

    def restart_trainer(self, why: str) -> None:
        """A fresh trainer actor, restored to the policy version the run had: the newest checkpoint, then the
        updates since it replayed on their own samples (same samples, same shuffling state: same weights)."""
        self.trainer.respawn(0)
        ckpt = latest_checkpoint(self.run_dir)
        if ckpt is not None:
            self.trainer.call(0, "load_state", str(ckpt / "trainer"))
        for samples in self.updates_since_checkpoint:
            self.trainer.call(0, "train_step", samples)
        self.trainer_restarts += 1
        self.log(
            f"policy trainer died ({why}); restarted from {ckpt.name if ckpt else 'the initial policy'} "
            f"+ {len(self.updates_since_checkpoint)} replayed update(s)"
        )
