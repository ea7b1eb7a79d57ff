"""Spot trainer: the hidden-state buffer and its ZeroMQ stream, the drafter training loop on idle workers
(checkpoints, published drafter versions, parameter averaging), and bubble accounting.

Plain Python (no Ray, no drafter import); the drafter plugs in through ``step_fn`` and a
``state_dict()`` / ``load_state_dict()`` object. Import ``services.spot_trainer.stream`` (pyzmq) and
``services.spot_trainer.bubbles`` (matplotlib for the plot) directly.
"""

from services.spot_trainer.buffer import Frame, HiddenStateBuffer
from services.spot_trainer.trainer import (
    DrafterLoader,
    SpotTrainer,
    average_parameters,
    average_state_dicts,
    latest_checkpoint,
    latest_published,
    load_published,
    save_published,
)

__all__ = [
    "DrafterLoader",
    "Frame",
    "HiddenStateBuffer",
    "SpotTrainer",
    "average_parameters",
    "average_state_dicts",
    "latest_checkpoint",
    "latest_published",
    "load_published",
    "save_published",
]
