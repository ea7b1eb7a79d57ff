"""TunerService: the central tuner (one actor). Merges rollout actors' observations, publishes tables.

Plain Python, hosted as a Ray actor (or in-process) that serves ``tailspec.v1.TunerService`` over gRPC
(``serve()``; see ``services/tuner/grpc_service.py``): rollout actors report observations there, the driver
fetches tables there. Its state (the bandit's windows, guards and RNG) is checkpointed to
``checkpoint_path`` after every merge (atomic write) and restored on start, so a restarted tuner resumes
where it stopped.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

from services.tuner.arms import Arm, default_arms, parse_arms
from services.tuner.bandit import BanditConfig, BucketedBandit


class TunerService:
    def __init__(
        self,
        arms: Iterable[Any] | None = None,
        bandit: Mapping[str, Any] | None = None,
        available_drafters: Iterable[str] | None = None,
        checkpoint_path: str | None = None,
    ):
        parsed: list[Arm] = parse_arms(arms, "tuner.arms") if arms is not None else default_arms()
        if available_drafters is not None:
            have = set(available_drafters) | {"off"}
            parsed = [a for a in parsed if str(a.drafter) in have]
        self.arms = parsed
        self.bandit = BucketedBandit(parsed, BanditConfig.from_dict(dict(bandit or {}), "tuner.bandit"))
        self.checkpoint_path = checkpoint_path
        self.merged = 0
        self.restored = False
        if checkpoint_path and os.path.isfile(checkpoint_path):
            with open(checkpoint_path) as f:
                state = json.load(f)
            self.bandit.load_state_dict(state["bandit"])
            self.merged = int(state.get("merged", 0))
            self.restored = True
        self._table = self.bandit.table()
        self.server = None

    def ping(self) -> int:
        return self.merged

    def serve(self, host: str = "127.0.0.1", port: int = 0, token: str | None = None) -> str:
        """Serve ``tailspec.v1.TunerService`` (plus health) from this process; returns ``host:port``."""
        from services.common.grpc_server import GrpcServer, expose
        from services.common.proto_gen.tailspec.v1 import tuner_pb2_grpc
        from services.tuner.grpc_service import TunerGrpc

        adapter = TunerGrpc(self)
        self.server = GrpcServer(
            [expose(tuner_pb2_grpc.TunerServiceServicer, adapter)], host=host, port=port, token=token
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
