"""TunerService: the central tuner (one actor). Merges rollout actors' observations, publishes tables.

Plain Python, hosted as a Ray actor (or in-process) that serves ``tailspec.v1.TunerService`` over gRPC
(``serve()``; see ``services/tuner/grpc_service.py``): rollout actors report observations there, the driver
fetches tables there. Its state (the bandit's windows and bans) is checkpointed to
``checkpoint_path`` after every merge (atomic write) and restored on start, so a restarted tuner resumes
where it stopped. A new run can start from an earlier run's state instead (``init_state``, config key
``tuner.init_state``): the arms' costs per batch size are a property of the model and the machine, so the
probes (each arm tried, and banned or kept, in every bucket) need not be paid again. The learned drafter's
arms (``learned``, ``hybrid``) start afresh, since the new run trains a new head.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

from services.tuner.arms import Arm, Drafter, TunerConfigError, default_arms, parse_arms
from services.tuner.bandit import BanditConfig, BucketedBandit


def load_state_file(bandit: BucketedBandit, path: str, key: str = "tuner.init_state") -> dict:
    """Load a tuner checkpoint (``TunerService.save``'s JSON) into ``bandit``; returns the file's dict.

    Raises:
        TunerConfigError: the file is missing, not JSON, or its state does not fit ``bandit`` (other bucket
            edges, another format); the message names ``key`` and ``path``.
    """
    try:
        with open(path) as f:
            state = json.load(f)
        bandit.load_state_dict(state["bandit"])
    except FileNotFoundError:
        raise TunerConfigError(f"{key}: no such file {path!r}") from None
    except (OSError, ValueError, KeyError, TypeError, TunerConfigError) as e:
        raise TunerConfigError(f"{key}: cannot load tuner state from {path!r}: {e}") from None
    return state


class TunerService:
    """The central tuner: a ``BucketedBandit`` over ``arms`` (default ``default_arms()``, less the drafters not in
    ``available_drafters``) with ``bandit`` settings (``BanditConfig`` keys), resumed from ``checkpoint_path`` if
    that file exists, else warm-started from ``init_state`` (module docstring).

    Raises:
        TunerConfigError: bad arms or settings, or a state file that is missing or does not fit.
    """

    def __init__(
        self,
        arms: Iterable[Any] | None = None,
        bandit: Mapping[str, Any] | None = None,
        available_drafters: Iterable[str] | None = None,
        checkpoint_path: str | None = None,
        init_state: str | None = None,
    ):
        parsed: list[Arm] = parse_arms(arms, "tuner.arms") if arms is not None else default_arms()
        if available_drafters is not None:
            have = set(available_drafters) | {"off"}
            parsed = [a for a in parsed if str(a.drafter) in have]
        self.arms = parsed
        self.bandit = BucketedBandit(parsed, BanditConfig.from_dict(dict(bandit or {})))
        self.checkpoint_path = checkpoint_path
        self.merged = 0
        self.restored = False  # resumed this run's own checkpoint
        self.warm_started = False  # started from init_state (another run's)
        if checkpoint_path and os.path.isfile(checkpoint_path):
            state = load_state_file(self.bandit, checkpoint_path, "tuner checkpoint")
            self.merged = int(state.get("merged", 0))
            self.restored = True
        elif init_state:
            load_state_file(self.bandit, init_state)
            self.bandit.reset_arms([Drafter.LEARNED, Drafter.HYBRID])  # a new head: their evidence is stale
            self.warm_started = True
        self._table = self.bandit.table()
        self.server = None

    def ping(self) -> int:
        return self.merged

    def pid(self) -> int:
        """This actor's process id (fault tests kill it)."""
        return os.getpid()

    def serve(self, host: str = "127.0.0.1", port: int = 0, token: str | None = None) -> str:
        """Serve ``tailspec.v1.TunerService`` (plus health) from this process; returns ``host:port``. Every
        call must carry ``token`` (required)."""
        # gRPC is imported here, not at the top: the tuner also runs in-process without it (trace replay on a
        # GPU machine whose grpcio is older than the generated stubs need).
        from services.common.grpc_auth import require_token
        from services.common.grpc_server import GrpcServer, expose
        from services.common.proto_gen.tailspec.v1 import tuner_pb2_grpc
        from services.tuner.grpc_service import TunerGrpc

        adapter = TunerGrpc(self)
        self.server = GrpcServer(
            [expose(tuner_pb2_grpc.TunerServiceServicer, adapter)],
            host=host,
            port=port,
            token=require_token(token, "the tuner's gRPC service"),
        )
        self.server.start()
        adapter.address = self.server.address
        return self.server.address

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    def table(self) -> dict:
        """The newest table (its version changes only when observations are merged)."""
        return self._table

    def merge(self, observations: list[dict]) -> dict:
        """Fold a batch of observations into the bandit; checkpoint; return the new table."""
        self.merged += self.bandit.merge(observations) if observations else 0
        self.save()
        self._table = self.bandit.table()
        return self._table

    def stats(self) -> dict:
        return self.bandit.stats()

    def save(self) -> None:
        if not self.checkpoint_path:
            return
        os.makedirs(os.path.dirname(os.path.abspath(self.checkpoint_path)), exist_ok=True)
        tmp = self.checkpoint_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"bandit": self.bandit.state_dict(), "merged": self.merged}, f)
        os.replace(tmp, self.checkpoint_path)
