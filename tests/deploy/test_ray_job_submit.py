"""`ray job submit` end to end: start a private head node on loopback, submit the training job through the
Jobs API with deploy/runtime_env.yaml, wait for SUCCEEDED, check the run outputs, stop only that cluster.

The cluster is isolated from any other Ray cluster on the machine: its own short temp dir, its own ports
(nothing left at Ray's fixed defaults 6379/8265/10001/52365), its own token (Ray 2.60 token auth,
``RAY_AUTH_MODE=token`` + ``RAY_AUTH_TOKEN``; ~/.ray/auth_token is neither read nor written), and it is
stopped by signalling the ``ray start --block`` process that owns it, never with a global ``ray stop``.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import GSM8K_DIR
from tests.deploy.clusters import stop_cluster
from tests.deploy.ports import free_ports

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
JOB_TIMEOUT_S = 240
START_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def private_cluster():
    """A head node on 127.0.0.1 with the dashboard (Jobs API) and token auth; yields (address, headers)."""
    from ray.job_submission import JobSubmissionClient

    temp_dir = tempfile.mkdtemp(prefix="tsj", dir="/tmp")  # short: Unix socket paths are limited to 107 chars
    token = secrets.token_hex(32)
    ports = free_ports(("gcs", "dash", "metrics", "agent", "agent_grpc", "client", "rt"))
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    env.pop("RAY_AUTH_TOKEN_PATH", None)
    env.update(
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN=token,
        RAY_USAGE_STATS_ENABLED="0",
        # the job's `python` is this venv's python (the job driver inherits the raylet's environment)
        PATH=f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",
    )
    cmd = [
        str(VENV_BIN / "ray"),
        "start",
        "--head",
        "--block",
        "--node-ip-address=127.0.0.1",
        f"--port={ports['gcs']}",
        "--dashboard-host=127.0.0.1",
        f"--dashboard-port={ports['dash']}",
        f"--metrics-export-port={ports['metrics']}",
        f"--dashboard-agent-listen-port={ports['agent']}",
        f"--dashboard-agent-grpc-port={ports['agent_grpc']}",
        f"--ray-client-server-port={ports['client']}",
        f"--runtime-env-agent-port={ports['rt']}",
        "--num-cpus=2",
        f"--temp-dir={temp_dir}",
        "--include-dashboard=true",
        "--disable-usage-stats",
    ]
    log_path = Path(temp_dir) / "ray_start.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            cmd,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    address = f"http://127.0.0.1:{ports['dash']}"
    headers = {"Authorization": f"Bearer {token}"}
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"ray start exited with {proc.returncode}:\n{log_path.read_text()[-4000:]}")
            try:
                JobSubmissionClient(address, headers=headers)
                break
            except Exception as e:  # dashboard not up yet
                if time.monotonic() > deadline:
                    pytest.fail(f"Ray dashboard at {address} not ready after {START_TIMEOUT_S}s: {e}")
                time.sleep(1)
        yield address, headers
    finally:
        stop_cluster(proc, temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_unauthenticated_submit_is_refused(private_cluster):
    """Token auth is on: a client without the token cannot reach the Jobs API."""
    import urllib.error
    import urllib.request

    address, _ = private_cluster
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"{address}/api/jobs/", timeout=10)
    assert err.value.code in (401, 403)


def test_ray_job_submit_trains(private_cluster, tiny_policy_dir, tmp_path):
    from ray.job_submission import JobStatus, JobSubmissionClient

    address, headers = private_cluster
    runtime_env = yaml.safe_load((REPO / "deploy" / "runtime_env.yaml").read_text())
    runtime_env["working_dir"] = str(REPO)  # the file says "." (the repo root, where `ray job submit` runs)
    run_dir = tmp_path / "run"
    entrypoint = " ".join(
        [
            "python -m services.pipeline.cli train --config configs/gsm8k_tiny.yaml",
            f"--run-dir {run_dir}",
            "trainer.steps=1",
            "trainer.prompts_per_step=2",
            "trainer.group_size=2",
            "rollout.max_new_tokens=16",
            "ray.address=auto",
            f"model.path={tiny_policy_dir}",
            f"data.dir={GSM8K_DIR}",
        ]
    )
    client = JobSubmissionClient(address, headers=headers)
    job_id = client.submit_job(entrypoint=entrypoint, runtime_env=runtime_env)
    deadline = time.monotonic() + JOB_TIMEOUT_S
    status = client.get_job_status(job_id)
    while not status.is_terminal() and time.monotonic() < deadline:
        time.sleep(2)
        status = client.get_job_status(job_id)
    logs = client.get_job_logs(job_id)
    if not status.is_terminal():
        client.stop_job(job_id)
    assert status == JobStatus.SUCCEEDED, f"job {job_id} is {status}; logs:\n{logs[-6000:]}"
    assert "done: 1 steps" in logs

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1]
    assert rows[0]["tokens_generated"] > 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 1
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert cfg["trainer"]["steps"] == 1 and cfg["ray"]["address"] == "auto"
    # the job ran from the uploaded working_dir, not from this checkout
    info = client.get_job_info(job_id)
    assert info.runtime_env.get("working_dir", "").startswith(("gcs://", "file://"))
