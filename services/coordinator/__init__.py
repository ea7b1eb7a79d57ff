"""Coordinator: per-worker state machine, idle-worker grants to the spot trainer, preemption, heartbeats.

Plain Python (no Ray); a Ray actor / gRPC service wrapper stays a thin layer over ``Coordinator``.
"""

from services.coordinator.coordinator import (
    Coordinator,
    Grant,
    Phase,
    Preempt,
    TimelineEvent,
    Transition,
    WorkerReport,
)
from services.coordinator.states import TRANSITIONS, IllegalTransition, WorkerState

__all__ = [
    "TRANSITIONS",
    "Coordinator",
    "Grant",
    "IllegalTransition",
    "Phase",
    "Preempt",
    "TimelineEvent",
    "Transition",
    "WorkerReport",
    "WorkerState",
]
