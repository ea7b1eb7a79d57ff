"""Stopping a run on SIGINT / SIGTERM: the step in flight finishes, a checkpoint is written, the run stops.

``SignalFlag`` records the signal while the run is in progress; the driver checks it after every step and
raises ``RunInterrupted`` (``tailspec train`` exits with 128 + the signal number).
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path


class RunInterrupted(Exception):
    """SIGINT / SIGTERM: the run stopped after a step and wrote a checkpoint (``exit_code`` = 128 + signal)."""

    def __init__(self, signum: int, step: int, run_dir: Path):
        self.exit_code = 128 + signum
        name = signal.Signals(signum).name
        super().__init__(
            f"interrupted by {name} after step {step}; checkpoint written. Resume with: "
            f"tailspec train --resume {run_dir}"
        )


class SignalFlag:
    """While a run is in progress, SIGINT and SIGTERM only record the signal (``signum``); the loop finishes
    the step, writes a checkpoint and stops. Only the main thread can install handlers; elsewhere a no-op."""

    def __init__(self):
        self.signum = 0
        self._old = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._set)

    def _set(self, signum, frame) -> None:
        self.signum = signum

    def restore(self) -> None:
        """Put back the handlers that were installed before."""
        for sig, handler in self._old.items():
            signal.signal(sig, handler)
