"""A run on two Ray nodes on this machine, told apart by their loopback addresses: every service binds and
advertises its own node's IP, the rollout actors spread over both nodes, the trainer takes the node marked
``tailspec_trainer``, and the run completes (issue #30 item 5).

Nodes: a head on ``127.0.0.3`` and a worker on ``127.0.0.2`` (``--node-ip-address``), each with its own temp
dir, every Ray port chosen free here, 2 CPUs each, token auth with a token of their own (``RAY_AUTH_MODE=token``,
``RAY_AUTH_TOKEN``: ~/.ray/auth_token is neither read nor written). The head is not on ``127.0.0.1``: Ray 2.60's
``ray start`` rewrites ``127.0.0.1``/``localhost`` to the machine's routable address
(``ray._private.services.resolve_ip_for_localhost``), so the head would not be a loopback node. Only the
worker advertises ``tailspec_trainer`` (as the Helm chart's workers do, and its ``num-cpus=0`` head does not).

Stopped by SIGTERM to the two ``ray start --block`` processes (worker first), then whatever is left of *these*
nodes (their process groups, or a command line naming their temp dir); never a global ``ray stop``.
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

from tests.conftest import GSM8K_DIR
from tests.deploy.clusters import stop_cluster
from tests.deploy.ports import free_ports

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
HEAD_IP, WORKER_IP = "127.0.0.3", "127.0.0.2"
START_TIMEOUT_S = 120
RUN_TIMEOUT_S = 420


NODE_PORTS = ("metrics", "agent", "agent_grpc", "rt", "nm", "om", "client")


def _node_cmd(ip: str, temp_dir: str, gcs_port: int, head: bool, ports: dict[str, int]) -> list[str]:
    cmd = [
        str(VENV_BIN / "ray"),
        "start",
        "--block",
        f"--node-ip-address={ip}",
        f"--temp-dir={temp_dir}",
        "--num-cpus=2",
        f"--metrics-export-port={ports['metrics']}",
        f"--dashboard-agent-listen-port={ports['agent']}",
        f"--dashboard-agent-grpc-port={ports['agent_grpc']}",
        f"--runtime-env-agent-port={ports['rt']}",
        f"--node-manager-port={ports['nm']}",
        f"--object-manager-port={ports['om']}",
        "--disable-usage-stats",
    ]
    if head:
        cmd += [
            "--head",
            f"--port={gcs_port}",
            "--include-dashboard=false",
            f"--ray-client-server-port={ports['client']}",
        ]
    else:
        cmd += [f"--address={HEAD_IP}:{gcs_port}", '--resources={"tailspec_trainer": 1}']
    return cmd


def _node_ports(ports: dict[str, int], node: str) -> dict[str, int]:
    return {n: ports[f"{node}_{n}"] for n in NODE_PORTS}


@pytest.fixture(scope="module")
def two_nodes():
    """(gcs address, env for processes joining it); both nodes stopped and their temp dirs removed after."""
    temps = [tempfile.mkdtemp(prefix=p, dir="/tmp") for p in ("tsh", "tsw")]  # short: Unix socket paths
    env = dict(os.environ)
    for k in ("RAY_ADDRESS", "RAY_AUTH_TOKEN_PATH"):
        env.pop(k, None)
    env.update(
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN=secrets.token_hex(32),
        RAY_USAGE_STATS_ENABLED="0",
        PATH=f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",
    )
    # every port of both nodes and the GCS picked at once: all distinct
    ports = free_ports(("gcs", *(f"{node}_{n}" for node in ("head", "worker") for n in NODE_PORTS)))
    gcs = ports["gcs"]
    procs: list[tuple[subprocess.Popen, str]] = []
    try:
        for ip, tmp, head in ((HEAD_IP, temps[0], True), (WORKER_IP, temps[1], False)):
            log = open(Path(tmp) / "ray_start.log", "wb")  # noqa: SIM115 - the node writes it until stopped
            procs.append(
                (
                    subprocess.Popen(
                        _node_cmd(ip, tmp, gcs, head, _node_ports(ports, "head" if head else "worker")),
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,
                    ),
                    tmp,
                )
            )
            log.close()
            if head:  # the worker needs the GCS up: wait for the head's "Ray runtime started"
                deadline = time.monotonic() + START_TIMEOUT_S
                while "Ray runtime started" not in (Path(tmp) / "ray_start.log").read_text(errors="replace"):
                    if procs[0][0].poll() is not None or time.monotonic() > deadline:
                        pytest.fail(f"head node did not start:\n{_log(tmp)}")
                    time.sleep(1)
        yield f"{HEAD_IP}:{gcs}", env, temps
    finally:
        for proc, tmp in reversed(procs):  # worker first
            stop_cluster(proc, tmp)
        for tmp in temps:
            shutil.rmtree(tmp, ignore_errors=True)


def _log(tmp: str) -> str:
    p = Path(tmp) / "ray_start.log"
    return p.read_text(errors="replace")[-4000:] if p.exists() else "(no log)"


def test_two_node_run(two_nodes, tiny_policy_dir, tmp_path):
    address, env, temps = two_nodes
    record_path, run_dir = tmp_path / "record.json", tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "tests.deploy.two_node_run",
        str(record_path),
        "2",
        "--run-dir",
        str(run_dir),
        f"ray.address={address}",
        f"model.path={tiny_policy_dir}",
        f"data.dir={GSM8K_DIR}",
        "trainer.steps=1",
        "trainer.prompts_per_step=2",
        "trainer.group_size=2",
        "rollout.max_new_tokens=12",
        "rollout.num_actors=2",
        "rollout.speculative.speedup_sample_prompts=0",
    ]
    proc = subprocess.run(
        cmd,
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
    )
    out = proc.stdout[-6000:] + proc.stderr[-6000:]
    assert proc.returncode == 0, f"run failed ({proc.returncode}):\n{out}\nhead:\n{_log(temps[0])}"
    assert "done: 1 steps" in proc.stdout, out
    assert (run_dir / "summary.json").is_file()

    rec = json.loads(record_path.read_text())
    assert rec["nodes"] == sorted([HEAD_IP, WORKER_IP]), rec["nodes"]
    assert rec["host"] == "node"  # grpc.host=auto on two nodes
    by_name = {s["name"]: s for s in rec["services"]}
    assert {"coordinator", "tuner", "rollout-0", "rollout-1", "spot-0", "spot-1"} <= set(by_name)
    for s in rec["services"]:  # every advertised address is its own node's IP (Ray's record of the actor)
        host = s["address"].removeprefix("tcp://").rsplit(":", 1)[0]
        assert host == s["node_ip"], s
        assert host in (HEAD_IP, WORKER_IP), s
    # the rollout actors spread over both nodes (placement group, SPREAD)
    assert {by_name["rollout-0"]["node_ip"], by_name["rollout-1"]["node_ip"]} == {HEAD_IP, WORKER_IP}
    # spot-trainer replica i shares rollout actor i's bundle
    for i in (0, 1):
        assert by_name[f"spot-{i}"]["node_ip"] == by_name[f"rollout-{i}"]["node_ip"]
    # the trainer's own bundle asks for the marker only the worker node advertises
    assert rec["trainer_bundle"] == {"tailspec_trainer": 1.0}
    assert rec["trainer_node_ip"] == WORKER_IP
    # reachable from the driver at the advertised addresses, and the coordinator's view agrees
    assert set(rec["health"].values()) == {"SERVING"}, rec["health"]
    assert rec["status"]["coordinator"] == by_name["coordinator"]["address"]
    assert rec["status"]["workers"] == {str(i): by_name[f"rollout-{i}"]["address"] for i in (0, 1)}
