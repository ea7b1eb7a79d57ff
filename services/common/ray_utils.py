"""Ray helpers: start or join a cluster, and call a pool of services that may or may not be Ray actors.

Every core class is plain Python; ``ActorPool`` wraps a list of either plain objects (``use_ray=False``:
in-process, sequential — tests, debugging) or Ray actor handles of the same class (``use_ray=True``:
calls run concurrently on the actors and are gathered with ``ray.get``).
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from services.common.placement import TRAINER_RESOURCE


def init_ray(
    address: str | None = None,
    num_cpus: int | None = None,
    temp_dir: str | None = None,
    start_attempts: int = 3,
) -> str:
    """Join ``address`` (or ``$RAY_ADDRESS``, or ``auto``) if given, else start a local cluster.

    A local start is tried up to ``start_attempts`` times: on a loaded machine the raylet can miss Ray's
    start-up deadline ("node timed out during startup"); each retry shuts the half-started node down first
    and says so on stderr. Joining an existing cluster is not retried (a wrong address should fail at once).

    Returns a short description of what happened. Idempotent when Ray is already initialized.

    Raises:
        RuntimeError / Exception from ``ray.init`` when the last attempt fails.
    """
    import ray

    if ray.is_initialized():
        return "ray already initialized"
    address = address or os.environ.get("RAY_ADDRESS")
    env = {
        "env_vars": {
            "PYTHONPATH": os.pathsep.join(p for p in (_repo_root(), os.environ.get("PYTHONPATH")) if p)
        }
    }
    if address:
        ray.init(address=address, runtime_env=env, log_to_driver=True)
        return f"joined Ray cluster at {address}"
    kw: dict[str, Any] = dict(
        num_cpus=num_cpus or os.cpu_count(),
        include_dashboard=False,
        runtime_env=env,
        log_to_driver=True,
        resources={TRAINER_RESOURCE: 1},  # the policy trainer's own bundle (services/common/placement.py)
    )
    if temp_dir:
        kw["_temp_dir"] = temp_dir
    for attempt in range(1, max(1, start_attempts) + 1):
        try:
            ray.init(**kw)
            break
        except Exception as e:  # noqa: BLE001 - RuntimeError or Exception("node timed out during startup")
            ray.shutdown()
            if attempt >= start_attempts:
                raise
            print(
                f"[tailspec] local Ray start-up failed (attempt {attempt}/{start_attempts}: {e}); retrying",
                file=sys.stderr,
                flush=True,
            )
            time.sleep(2.0 * attempt)
    return f"started local Ray cluster ({kw['num_cpus']} CPUs)"


def _repo_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class ActorPool:
    """Uniform calls over plain objects or Ray actors of one class."""

    def __init__(self, members: Sequence[Any], use_ray: bool):
        self.members = list(members)
        self.use_ray = use_ray
        self._threads: cf.ThreadPoolExecutor | None = None
        self._spawn: tuple | None = None

    @staticmethod
    def create(
        cls,
        args_list: Sequence[tuple],
        use_ray: bool,
        num_cpus: float = 1,
        kwargs_list=None,
        max_concurrency: int = 1,
        num_gpus: float = 0,
        options_list=None,
    ) -> ActorPool:
        """One member per ``args_list`` entry. Under Ray each reserves ``num_cpus`` / ``num_gpus`` and takes
        its ``options_list`` entry (``.options(**opts)``, e.g. a placement-group ``scheduling_strategy`` from
        ``services/common/placement.py``); both are ignored in-process."""
        kwargs_list = kwargs_list or [{} for _ in args_list]
        options_list = list(options_list) if options_list else [{} for _ in args_list]
        if not use_ray:
            pool = ActorPool([cls(*a, **k) for a, k in zip(args_list, kwargs_list)], False)
        else:
            import ray

            remote = ray.remote(
                num_cpus=num_cpus, num_gpus=num_gpus, max_restarts=0, max_concurrency=max_concurrency
            )(cls)
            pool = ActorPool(
                [
                    (remote.options(**o) if o else remote).remote(*a, **k)
                    for a, k, o in zip(args_list, kwargs_list, options_list)
                ],
                True,
            )
            pool.call_all("ping", [() for _ in pool.members])  # surface constructor errors now
        pool._spawn = dict(
            cls=cls,
            args=list(args_list),
            kwargs=list(kwargs_list),
            options=options_list,
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            max_concurrency=max_concurrency,
        )
        return pool

    def respawn(self, i: int) -> None:
        """Replace member ``i`` (dead, or to be restarted) by a fresh one built with its original arguments
        (a service that resumes from its checkpoint folder picks up where the old one stopped). The old one
        is killed first, so the fresh one can take its place in a placement-group bundle."""
        sp = self._spawn
        if self.use_ray:
            import ray

            ray.kill(self.members[i])
        fresh = ActorPool.create(
            sp["cls"],
            [sp["args"][i]],
            self.use_ray,
            sp["num_cpus"],
            [sp["kwargs"][i]],
            sp["max_concurrency"],
            sp["num_gpus"],
            [sp["options"][i]],
        )
        self.members[i] = fresh.members[0]

    def __len__(self) -> int:
        return len(self.members)

    def call(self, i: int, method: str, *args) -> Any:
        return self.call_many([(i, method, args)])[0]

    def call_all(self, method: str, args_list: Sequence[tuple]) -> list[Any]:
        return self.call_many([(i, method, a) for i, a in enumerate(args_list)])

    def call_many(self, calls: Sequence[tuple[int, str, tuple]]) -> list[Any]:
        if not self.use_ray:
            return [getattr(self.members[i], m)(*a) for i, m, a in calls]
        import ray

        return ray.get([getattr(self.members[i], m).remote(*a) for i, m, a in calls])

    def remove(self, i: int) -> None:
        """Drop member ``i`` (a dead actor) from the pool."""
        m = self.members.pop(i)
        if self._spawn is not None:
            for key in ("args", "kwargs", "options"):
                self._spawn[key] = self._spawn[key][:i] + self._spawn[key][i + 1 :]
        if self.use_ray:
            import ray

            ray.kill(m)

    def submit(self, i: int, method: str, *args) -> cf.Future:
        """Start a call without waiting: a ``concurrent.futures.Future`` (in-process calls run in threads, so
        members work concurrently as Ray actors would; torch releases the GIL in its kernels)."""
        if self.use_ray:
            return getattr(self.members[i], method).remote(*args).future()
        if self._threads is None:
            self._threads = cf.ThreadPoolExecutor(max_workers=max(4, 2 * len(self.members)))
        return self._threads.submit(getattr(self.members[i], method), *args)

    def shutdown(self) -> None:
        if self._threads is not None:
            self._threads.shutdown(wait=True)
        if self.use_ray:
            import ray

            for m in self.members:
                ray.kill(m)
