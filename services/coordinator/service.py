"""The coordinator as its own Ray actor, ``CoordinatorActor``: the state machine (``Coordinator``), its gRPC
server (``serve()``: ``CoordinatorService`` from ``services/coordinator/grpc_service.py``), and a ticker thread
that applies heartbeat timeouts and preempt deadlines (``Coordinator.tick``) every ``tick_interval_s``.
Everything else talks to it over gRPC (``services/coordinator/client.py``); only the bulk Gantt-chart history
(``timeline()``) is fetched through Ray.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Any

from services.common.grpc_auth import require_token
from services.common.grpc_server import GrpcServer, expose
from services.common.metrics import process_metrics
from services.common.proto_gen.tailspec.v1 import coordinator_pb2_grpc
from services.coordinator.coordinator import Coordinator
from services.coordinator.grpc_service import CoordinatorService


class CoordinatorActor:
    """The coordinator as its own actor: state machine + gRPC server + ticker (heartbeat timeouts, preempt
    deadlines). Args are ``Coordinator``'s; ``tick_interval_s`` is how often ``tick`` runs; ``worker_ids`` and
    ``initial_run`` are ``CoordinatorService``'s (the run's workers, and the driver's view to anchor to);
    ``metrics``: export ``tailspec_worker_state`` on every transition (``process_metrics``)."""

    def __init__(
        self,
        heartbeat_timeout_s: float = 30.0,
        preempt_deadline_s: float = 2.0,
        min_fresh_samples: int = 1,
        heartbeat_interval_s: float = 1.0,
        tick_interval_s: float = 0.25,
        worker_ids: Iterable[str] | None = None,
        initial_run: Mapping[str, Any] | None = None,
        metrics: bool = False,
    ):
        tm = process_metrics(metrics)
        self.coordinator = Coordinator(
            heartbeat_timeout_s=heartbeat_timeout_s,
            preempt_deadline_s=preempt_deadline_s,
            min_fresh_samples=min_fresh_samples,
            on_state=None if tm is None else (lambda w, state: tm.set_worker_state(w, state.value)),
        )
        self.service = CoordinatorService(
            self.coordinator,
            heartbeat_interval_s=heartbeat_interval_s,
            worker_ids=worker_ids,
            initial_run=initial_run,
        )
        self.server = None
        self._stop = threading.Event()
        self._ticker = threading.Thread(target=self._tick, args=(tick_interval_s,), daemon=True)
        self._ticker.start()

    def _tick(self, interval: float) -> None:
        while not self._stop.wait(interval):
            self.coordinator.tick()

    def serve(self, host: str = "127.0.0.1", port: int = 0, token: str | None = None) -> str:
        """Serve ``tailspec.v1.CoordinatorService`` (plus health); returns ``host:port``. Every call must carry
        ``token`` (required: ``ValueError`` without one)."""
        self.server = GrpcServer(
            [expose(coordinator_pb2_grpc.CoordinatorServiceServicer, self.service)],
            host=host,
            port=port,
            token=require_token(token, "the coordinator's gRPC service"),
            name="coordinator",
        )
        self.server.start()
        self.service.address = self.server.address
        return self.server.address

    def ping(self) -> int:
        return len(self.coordinator.snapshot())

    def timeline(self) -> tuple[list[tuple], list[tuple]]:
        """(Gantt bars as ``TimelineEvent`` tuples, rollout ``Phase`` tuples), coordinator clock."""
        return [tuple(e) for e in self.coordinator.timeline()], [tuple(p) for p in self.coordinator.phases]

    def close(self, keep_serving: bool = False) -> None:
        """Stop ticking (state is frozen); stop serving unless ``keep_serving``."""
        self._stop.set()
        if self.server is not None and not keep_serving:
            self.server.stop()
