"""Enums the services share, and their proto <-> Python converters (``protos/tailspec/v1/common.proto``).

Imports no service module (only the generated protos), so any service's gRPC face can use these without
pulling in another service: the rollout actor reports its ``WorkerState`` with ``state_pb``, the coordinator
reads it back with ``state_from_pb``, the driver's step phase travels as ``phase_pb`` / ``phase_name``, and a
strategy arm's drafter as ``drafter_pb`` / ``drafter_name``.

Contract
--------
- ``WorkerState`` is a ``StrEnum`` whose values are the proto names without ``WORKER_STATE_``
  (``WorkerState.IDLE == "IDLE"`` <-> ``WORKER_STATE_IDLE``). The coordinator's legal transitions between
  these states live in ``services/coordinator/states.py``.
- ``state_from_pb(WORKER_STATE_UNSPECIFIED)`` is None; an unknown number raises ``ValueError``.
- ``phase_pb`` maps an unknown or empty phase name to ``STEP_PHASE_UNSPECIFIED``; ``phase_name`` maps
  UNSPECIFIED (and unknown numbers) to ``""``.
- ``drafter_name`` gives the lower-case drafter name (``DRAFTER_SUFFIX`` -> ``"suffix"``, ``DRAFTER_OFF`` ->
  ``"off"``); ``drafter_pb`` is its inverse (``ValueError`` for a name the proto does not define).
"""

from __future__ import annotations

from enum import StrEnum

from services.common.proto_gen.tailspec.v1 import common_pb2


class WorkerState(StrEnum):
    """A ``str`` enum (``StrEnum``): ``WorkerState.IDLE == "IDLE"``, JSON-friendly."""

    STARTING = "STARTING"
    ROLLOUT = "ROLLOUT"
    IDLE = "IDLE"
    TRAINING = "TRAINING"
    PREEMPTING = "PREEMPTING"
    FAILED = "FAILED"
    STOPPED = "STOPPED"


#: The driver's step phases (``run_info["phase"]``) and their proto values.
PHASES: dict[str, int] = {
    "rollout": common_pb2.STEP_PHASE_ROLLOUT,
    "reward": common_pb2.STEP_PHASE_REWARD,
    "train": common_pb2.STEP_PHASE_TRAIN,
    "weight_sync": common_pb2.STEP_PHASE_WEIGHT_SYNC,
    "done": common_pb2.STEP_PHASE_DONE,
}
_PHASE_NAMES = {v: k for k, v in PHASES.items()}


def state_pb(state: WorkerState | str) -> int:
    """``WorkerState`` (or its value) -> ``common_pb2.WorkerState`` number; ``ValueError`` for another str."""
    return common_pb2.WorkerState.Value(f"WORKER_STATE_{WorkerState(state).value}")


def state_from_pb(value: int) -> WorkerState | None:
    """``common_pb2.WorkerState`` number -> ``WorkerState``; None for WORKER_STATE_UNSPECIFIED."""
    name = common_pb2.WorkerState.Name(value).removeprefix("WORKER_STATE_")
    return None if name == "UNSPECIFIED" else WorkerState(name)


def phase_pb(name: str) -> int:
    """A step phase name (``"rollout"``, ...) -> ``common_pb2.StepPhase``; UNSPECIFIED for any other."""
    return PHASES.get(name, common_pb2.STEP_PHASE_UNSPECIFIED)


def phase_name(value: int) -> str:
    """``common_pb2.StepPhase`` number -> phase name; ``""`` for UNSPECIFIED or an unknown number."""
    return _PHASE_NAMES.get(value, "")


def drafter_name(value: int) -> str:
    """``common_pb2.Drafter`` number -> lower-case drafter name (``DRAFTER_NGRAM`` -> ``"ngram"``)."""
    return common_pb2.Drafter.Name(value).removeprefix("DRAFTER_").lower()


def drafter_pb(name: str) -> int:
    """Drafter name (any case) -> ``common_pb2.Drafter`` number; ``ValueError`` for an unknown name."""
    return common_pb2.Drafter.Value(f"DRAFTER_{str(name).upper()}")


__all__ = [
    "PHASES",
    "WorkerState",
    "drafter_name",
    "drafter_pb",
    "phase_name",
    "phase_pb",
    "state_from_pb",
    "state_pb",
]
