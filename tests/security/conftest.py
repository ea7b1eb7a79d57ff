"""Helpers of the security tests: the attacker process, hostile checkpoint files."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys

import pytest

from services.common.config import REPO_ROOT


class Payload:
    """Unpickling this creates ``marker`` (stands for any code an attacker would run)."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def hostile_pickle(marker) -> bytes:
    return pickle.dumps(Payload(str(marker)))


def attack(doc: dict, timeout: float = 600) -> dict:
    """Run ``tests/security/attacker.py`` in another process with ``doc`` on stdin; its JSON answer."""
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    env.pop("TAILSPEC_GRPC_TOKEN", None)
    out = subprocess.run(
        [sys.executable, "-m", "tests.security.attacker"],
        input=json.dumps(doc),
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=env,
        timeout=timeout,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


@pytest.fixture
def marker(tmp_path):
    """A path hostile payloads would create; the fixture proves the payload works (it does create a control
    marker when unpickled), so a test asserting the real marker is absent can fail."""
    control = tmp_path / "control-marker"
    pickle.loads(hostile_pickle(control))
    assert control.exists()
    return tmp_path / "pwned-marker"
