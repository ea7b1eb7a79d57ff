"""Stopping the deploy tests' private Ray clusters: only the cluster a test started, never a global `ray stop`."""

from __future__ import annotations

import os
import signal
import subprocess

import psutil


def _group_and_tagged(pgid: int, tag: str) -> list[psutil.Process]:
    """The processes of process group ``pgid`` and those whose command line names ``tag`` (this one excepted)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if p.pid == os.getpid():
                continue
            if os.getpgid(p.pid) == pgid or any(tag in a for a in (p.info["cmdline"] or [])):
                found.append(p)
        except (psutil.Error, ProcessLookupError):
            pass
    return found


def stop_cluster(proc: subprocess.Popen, temp_dir: str) -> None:
    """SIGTERM the `ray start --block` process (it tears down every process of its node), then sweep what is
    left of *this* cluster only: its process group (start_new_session) or a command line naming its temp dir."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    left = _group_and_tagged(proc.pid, temp_dir)
    for p in left:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(left, timeout=15)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
