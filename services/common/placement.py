"""Where a run's actors go on a Ray cluster: placement groups for the rollout actors and the policy trainer.

- **Rollout actors**: one placement group, ``rollout.num_actors`` bundles of ``{CPU: threads_per_actor,
  GPU: gpus_per_actor}`` (GPU only when > 0), strategy ``SPREAD``: across nodes where there is room (a soft
  spread, so one node holding them all is fine). Rollout actor ``i`` takes bundle ``i``; spot-trainer
  replica ``i`` shares bundle ``i % num_actors`` with no reservation of its own (it trains in that actor's
  bubble, on that actor's cores).
- **Policy trainer**: its own placement group of one bundle: ``GPU: trainer.gpus`` when > 0 (a GPU node),
  plus ``tailspec_trainer: 1`` when some node advertises that resource (the local cluster tailspec starts
  does, so do the Helm chart's workers; a head started with ``num-cpus=0`` does not, so the trainer never
  lands there). When neither applies (a joined cluster without the marker, no GPUs) the trainer shares
  rollout bundle 0 with no reservation: a node that holds CPUs, never a 0-CPU head.
- The coordinator and the tuner reserve nothing and go wherever Ray puts them; every service binds and
  advertises its own node's address (``services/common/hosts.py``), so they are reachable from anywhere.

A placement group that cannot be placed within ``ray.placement_timeout_s`` fails the run with
``PlacementError`` naming the bundles and the cluster's resources, instead of hanging. Everything is removed
by ``remove()`` (the driver's ``_stop_services``). With ``ray.use_ray=false`` nothing is created and every
option is empty.
"""

from __future__ import annotations

from typing import Any

TRAINER_RESOURCE = "tailspec_trainer"  # custom resource marking nodes the policy trainer may use


class PlacementError(RuntimeError):
    """A placement group the cluster cannot hold (within ``ray.placement_timeout_s``)."""


def rollout_bundles(num_actors: int, threads_per_actor: float, gpus_per_actor: float) -> list[dict]:
    bundle: dict[str, float] = {"CPU": float(threads_per_actor)}
    if gpus_per_actor > 0:
        bundle["GPU"] = float(gpus_per_actor)
    return [dict(bundle) for _ in range(int(num_actors))]


def trainer_bundle(gpus: float, marker_available: bool) -> dict | None:
    """The trainer's own bundle, or None (share rollout bundle 0) when it would hold nothing."""
    bundle: dict[str, float] = {}
    if gpus > 0:
        bundle["GPU"] = float(gpus)
    if marker_available:
        bundle[TRAINER_RESOURCE] = 1.0
    return bundle or None


class RunPlacement:
    """The placement groups of one run (see the module docstring). ``create()`` then ``*_options(i)`` for
    ``ray.remote(...).options(**opts)``; ``remove()`` at the end (idempotent)."""

    def __init__(
        self,
        use_ray: bool,
        num_actors: int,
        threads_per_actor: float = 1,
        gpus_per_actor: float = 0,
        trainer_gpus: float = 0,
        timeout_s: float = 300.0,
    ):
        self.use_ray = use_ray
        self.num_actors = int(num_actors)
        self.threads_per_actor = threads_per_actor
        self.gpus_per_actor = gpus_per_actor
        self.trainer_gpus = trainer_gpus
        self.timeout_s = float(timeout_s)
        self.rollout_pg = None
        self.trainer_pg = None
        self.trainer_bundle: dict | None = None

    @classmethod
    def from_config(cls, cfg) -> RunPlacement:
        return cls(
            cfg.ray.use_ray,
            cfg.rollout.num_actors,
            cfg.rollout.threads_per_actor,
            cfg.rollout.gpus_per_actor,
            cfg.trainer.gpus,
            cfg.ray.placement_timeout_s,
        )

    def create(self) -> RunPlacement:
        if not self.use_ray or self.rollout_pg is not None:
            return self
        import ray
        from ray.util.placement_group import placement_group

        try:
            bundles = rollout_bundles(self.num_actors, self.threads_per_actor, self.gpus_per_actor)
            self.rollout_pg = placement_group(bundles, strategy="SPREAD", name="tailspec-rollout")
            self._wait(self.rollout_pg, "the rollout actors", bundles)
            marker = ray.cluster_resources().get(TRAINER_RESOURCE, 0) > 0
            self.trainer_bundle = trainer_bundle(self.trainer_gpus, marker)
            if self.trainer_bundle is not None:
                self.trainer_pg = placement_group([self.trainer_bundle], name="tailspec-trainer")
                self._wait(self.trainer_pg, "the policy trainer", [self.trainer_bundle])
        except BaseException:
            self.remove()
            raise
        return self

    def _wait(self, pg, what: str, bundles: list[dict]) -> None:
        import ray
        from ray.exceptions import GetTimeoutError

        try:
            ray.get(pg.ready(), timeout=self.timeout_s)
        except GetTimeoutError:
            raise PlacementError(
                f"the Ray cluster cannot place {what}: bundles {bundles} not placed within "
                f"{self.timeout_s:g}s (ray.placement_timeout_s); cluster resources "
                f"{_short(ray.cluster_resources())}, available {_short(ray.available_resources())}"
            ) from None

    # -- actor options (empty without Ray)
    def _in(self, pg, index: int) -> dict[str, Any]:
        if pg is None:
            return {}
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return {
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=pg, placement_group_bundle_index=index
            )
        }

    def rollout_options(self, i: int) -> dict[str, Any]:
        return self._in(self.rollout_pg, i)

    def spot_options(self, i: int) -> dict[str, Any]:
        return self._in(self.rollout_pg, i % max(1, self.num_actors))

    def trainer_options(self) -> dict[str, Any]:
        if self.trainer_pg is not None:
            return self._in(self.trainer_pg, 0)
        return self._in(self.rollout_pg, 0)

    def remove(self) -> None:
        """Remove the placement groups (their actors are killed with them). Idempotent."""
        if not self.use_ray:
            return
        import ray
        from ray.util.placement_group import remove_placement_group

        for attr in ("trainer_pg", "rollout_pg"):
            pg = getattr(self, attr)
            setattr(self, attr, None)
            if pg is not None and ray.is_initialized():
                try:
                    remove_placement_group(pg)
                except Exception:  # noqa: BLE001 - already gone with its cluster
                    pass


def _short(resources: dict) -> dict:
    """Cluster resources without Ray's per-node ``node:<ip>`` entries and memory byte counts."""
    return {
        k: v
        for k, v in sorted(resources.items())
        if not k.startswith("node:") and k not in ("memory", "object_store_memory")
    }


__all__ = ["PlacementError", "RunPlacement", "TRAINER_RESOURCE", "rollout_bundles", "trainer_bundle"]
