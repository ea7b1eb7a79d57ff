"""The control plane's tuner side: starting the tuner actor, the gated strategy table it hands the rollout
actors at each phase boundary, and restarting it from its checkpoint when it dies.

``ControlPlaneTuner`` is a part of ``ControlPlane`` (``services/pipeline/control_plane.py``): it uses the
plane's ``cfg``, ``run_dir``, ``host``, ``token``, ``use_ray``, ``available_drafters``, ``rollout``,
``rollout_clients``, ``learned_top1``, ``log`` and ``_each_rollout``, and owns ``tuner`` (the tuner's
``ActorPool``, None without ``tuner.enabled``), ``tuner_client`` and ``tuner_restarts``.
"""

from __future__ import annotations

import logging
from pathlib import Path

from services.common.metrics import bucket_label
from services.common.ray_utils import ActorPool
from services.pipeline.faults import actor_died, unavailable
from services.rollout_actor.shard import ShardResult
from services.tuner.bandit import gate_table, share_allowance
from services.tuner.grpc_service import TunerClient
from services.tuner.service import TunerService

log = logging.getLogger(__name__)


def bucket_name(b: dict) -> str:
    """A batch-size bucket's name in the step row: ``lo-hi`` (inclusive), or ``lo+`` for the last one."""
    return bucket_label(b["lo"], b.get("hi"))


class ControlPlaneTuner:
    """The tuner's actor and calls (a part of ``ControlPlane``)."""

    def _start_tuner(self) -> None:
        """With ``tuner.enabled``: the tuner actor (resuming ``tuner.init_state`` when given), served over
        gRPC."""
        cfg = self.cfg
        if not cfg.tuner.enabled:
            return
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

    def gated_drafters(self) -> list[str]:
        """Drafters kept out of the table: the learned drafter's (``learned``, ``hybrid``) while the spot
        trainer's latest top-1 accuracy is below ``tuner.learned_min_top1`` (or it has not trained yet)."""
        learned = [d for d in ("learned", "hybrid") if d in self.available_drafters]
        bar = self.cfg.tuner.learned_min_top1
        if not learned or bar <= 0 or (self.learned_top1 is not None and self.learned_top1 >= bar):
            return []
        return learned

    def strategy_table(self) -> dict:
        """The tuner's merged table, gated (``gated_drafters``), each rollout actor's share of its regret
        allowance (``share_allowance``)."""
        table = gate_table(self.tuner_client.table(), self.gated_drafters())
        return share_allowance(table, 1.0 / max(1, self.cfg.rollout.num_actors))

    def restart_tuner(self, why: str) -> bool:
        """A fresh tuner actor, resumed from its own checkpoint (``checkpoints/tuner_state.json``, written at
        every merge), served anew and handed to the rollout actors. False (and a warning) when even that fails:
        the run goes on, the actors keep their last table."""
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
            if not (actor_died(e) or unavailable(e)):
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
