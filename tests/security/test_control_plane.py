"""A real run's gRPC services, driven from another process while the run is between its two steps:

(a) without the run's secret (none, or a wrong one) every RPC of every service (enumerated from the generated
    ``*_pb2_grpc`` descriptors, so a new RPC or service cannot be missed) and the health check answer
    UNAUTHENTICATED;
(b) with the secret, ``LoadDrafter`` pointing outside the run folder, at a crafted pickle, at a crafted version
    inside the run folder, through a symlink or ``..``, or at a version that does not exist is refused, and the
    pickle never runs (its marker file never appears);
(d) with the secret, bad field values (the reported attacks among them: ``Register(worker_id="evil",
    state=IDLE)``, ``ReportRun`` at step 999, a spot-trainer ``Grant`` without a deadline) get INVALID_ARGUMENT;

and the run then completes normally: every step, one metrics row each, the coordinator knowing only the run's
workers at the run's last step.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
import torch
from google.protobuf.timestamp_pb2 import Timestamp

from services.common.config import load_config
from services.coordinator.client import CoordinatorClient
from services.pipeline.driver import RLDriver
from services.spot_trainer.trainer import MARKER, PUBLISHED_TENSORS, STATE_JSON
from tests.security.conftest import Payload, attack, hostile_pickle

COORD = "tailspec.v1.CoordinatorService"
ROLLOUT = "tailspec.v1.RolloutService"
TUNER = "tailspec.v1.TunerService"
SPOT = "tailspec.v1.SpotTrainerService"


def _ts(t: float) -> str:
    ts = Timestamp()
    ts.FromNanoseconds(int(t * 1e9))
    return ts.ToJsonString()


def _targets(plane) -> dict[str, list[str]]:
    return {
        COORD: [plane.coordinator_address],
        TUNER: [plane.tuner_client.address],
        ROLLOUT: [c.address for c in plane.rollout_clients],
        SPOT: [c.address for c in plane.spot_clients],
    }


def _craft_checkpoints(run_dir, outside, marker) -> dict[str, str]:
    """Hostile drafter checkpoints: outside the run folder, and planted inside its published folder."""
    evil = hostile_pickle(marker)
    outside.mkdir()
    torch.save(Payload(str(marker)), outside / "evil.pt")  # a torch checkpoint that runs code on torch.load
    fake = outside / "v000000001"
    fake.mkdir()
    (fake / ".metadata").write_bytes(evil)  # what DCP's reader would unpickle
    (fake / STATE_JSON).write_text(json.dumps({"format": 1, "skeleton": {"__tensor__": "w"}, "meta": {}}))
    (fake / PUBLISHED_TENSORS).write_bytes(evil)
    (fake / MARKER).write_text("{}")
    published = run_dir / "checkpoints" / "spot_trainer" / "published"
    published.mkdir(parents=True, exist_ok=True)
    inside = published / "v000000999"
    shutil.copytree(fake, inside)
    (published / "v000000998").symlink_to(fake, target_is_directory=True)
    return {
        "outside_dir": str(fake),
        "outside_pt": str(outside / "evil.pt"),
        "inside": str(inside),
        "dotdot": str(published / ".." / ".." / ".." / "outside" / "v000000001"),
        "published": str(published),
    }


def _load_drafter_attacks(addr: str, paths: dict) -> list[tuple[dict, str]]:
    def ld(version, path=""):
        return dict(
            service=ROLLOUT,
            method="LoadDrafter",
            address=addr,
            request={"drafter": {"version": version, "checkpoint_path": path}},
        )

    return [
        (ld(1, paths["outside_dir"]), "INVALID_ARGUMENT"),  # outside the run folder
        (ld(1, paths["outside_pt"]), "INVALID_ARGUMENT"),  # a crafted torch pickle
        (ld(1, paths["dotdot"]), "INVALID_ARGUMENT"),  # .. out of the run folder
        (ld(5, paths["inside"]), "INVALID_ARGUMENT"),  # another version's folder
        (ld(999, paths["inside"]), "INVALID_ARGUMENT"),  # planted inside: no pickle is read, it does not load
        (ld(999), "INVALID_ARGUMENT"),
        (ld(998), "NOT_FOUND"),  # a symlink out of the folder: not published there
        (ld(12345), "NOT_FOUND"),  # a version that does not exist
        (ld(0), "INVALID_ARGUMENT"),
    ]


def _bad_field_attacks(t: dict[str, list[str]]) -> list[tuple[dict, str]]:
    coord, tuner, rollout, spot = t[COORD][0], t[TUNER][0], t[ROLLOUT][0], t[SPOT][0]
    now = time.time()

    def c(service, method, address, request):
        return dict(service=service, method=method, address=address, request=request)

    good_grant = {"grant_id": "77", "worker_id": "0", "deadline": _ts(now + 60)}
    table = {
        "version": 10**6,
        "arms": [{"name": "off", "drafter": "DRAFTER_OFF"}],
        "buckets": [{"bucket": 0, "lo": 1, "best": "nope"}],
    }
    return [
        (
            c(COORD, "Register", coord, {"worker_id": "evil", "state": "WORKER_STATE_IDLE"}),
            "INVALID_ARGUMENT",
        ),
        (c(COORD, "Register", coord, {"worker_id": "0", "state": 42}), "INVALID_ARGUMENT"),
        (c(COORD, "Register", coord, {"worker_id": "../0"}), "INVALID_ARGUMENT"),
        (c(COORD, "ReportRun", coord, {"rl_step": 999, "phase": "STEP_PHASE_TRAIN"}), "INVALID_ARGUMENT"),
        (c(COORD, "ReportRun", coord, {"rl_step": 1, "phase": 99}), "INVALID_ARGUMENT"),
        (
            c(COORD, "ReportState", coord, {"worker_id": "0", "state": "WORKER_STATE_TRAINING"}),
            "INVALID_ARGUMENT",
        ),
        (c(COORD, "ReportState", coord, {"worker_id": "0", "state": 17}), "INVALID_ARGUMENT"),
        (
            c(COORD, "ReportState", coord, {"worker_id": "0", "state": "WORKER_STATE_IDLE", "rl_step": 999}),
            "INVALID_ARGUMENT",
        ),  # fmt: skip
        (
            c(COORD, "Heartbeat", coord, {"worker_id": "0", "versions": {"policy_version": 10**12}}),
            "INVALID_ARGUMENT",
        ),  # fmt: skip
        (c(COORD, "RequestResources", coord, {"purpose": 9}), "INVALID_ARGUMENT"),
        (
            c(
                COORD,
                "RequestResources",
                coord,
                {"purpose": "RESOURCE_PURPOSE_ROLLOUT", "worker_ids": ["evil"]},
            ),
            "INVALID_ARGUMENT",
        ),  # fmt: skip
        (
            c(SPOT, "Grant", spot, {"grant": {"grant_id": "77", "worker_id": "0"}}),
            "INVALID_ARGUMENT",
        ),  # no deadline
        (c(SPOT, "Grant", spot, {"grant": dict(good_grant, deadline=_ts(now - 5))}), "INVALID_ARGUMENT"),
        (c(SPOT, "Grant", spot, {"grant": dict(good_grant, policy_version=999)}), "INVALID_ARGUMENT"),
        (c(SPOT, "Grant", spot, {"grant": dict(good_grant, worker_id="")}), "INVALID_ARGUMENT"),
        (c(SPOT, "Preempt", spot, {"preemption": {"grant_id": "x/../y"}}), "INVALID_ARGUMENT"),
        (
            c(
                TUNER,
                "ReportObservations",
                tuner,
                {
                    "worker_id": "0",
                    "observations": [
                        {"batch_size": 1, "arm": "off", "committed_tokens": 1, "seconds": "NaN"}
                    ],
                },
            ),
            "INVALID_ARGUMENT",
        ),  # fmt: skip
        (
            c(TUNER, "ReportObservations", tuner, {"worker_id": "0", "strategy_table_version": 10**9}),
            "INVALID_ARGUMENT",
        ),  # fmt: skip
        (c(ROLLOUT, "SetStrategyTable", rollout, {"table": table}), "INVALID_ARGUMENT"),
        (
            c(
                ROLLOUT,
                "SetStrategyTable",
                rollout,
                {
                    "table": dict(
                        table, buckets=[dict(table["buckets"][0], best="off")], ledger={"budget": "Infinity"}
                    )
                },
            ),
            "INVALID_ARGUMENT",
        ),
    ]


@pytest.mark.parametrize("use_ray", [False, True], ids=["in-process", "ray-actors"])
def test_a_runs_services_refuse_strangers_and_bad_input(
    use_ray, tmp_path, tiny_policy_dir, marker, capsys, monkeypatch, request
):
    """In-process services, and the same run with every service a Ray actor (the secret handed over as Ray
    call arguments)."""
    monkeypatch.delenv("TAILSPEC_GRPC_TOKEN", raising=False)  # a secret generated for the run
    if use_ray:
        request.getfixturevalue("ray_cluster")
    run_dir = tmp_path / "run"
    steps = 2
    cfg = load_config(
        None,
        [
            f"model.path={tiny_policy_dir}",
            f"trainer.steps={steps}",
            "trainer.prompts_per_step=3",
            "trainer.group_size=2",
            "rollout.max_new_tokens=12",
            f"ray.use_ray={str(use_ray).lower()}",
            "coordinator.keep_serving=true",
        ],
    )
    driver = RLDriver(cfg, run_dir=run_dir)
    seen: dict = {}
    step = driver.step

    def step_then_attack(i: int) -> dict:
        row = step(i)
        if i == 1:  # between the steps: every service is up
            plane = driver.plane
            token = (run_dir / "grpc_token").read_text().strip()
            assert token == plane.token and (run_dir / "grpc_token").stat().st_mode & 0o777 == 0o600
            targets = _targets(plane)
            seen["every_rpc"] = attack({"mode": "every_rpc", "targets": targets, "token": "not-the-token"})
            paths = _craft_checkpoints(run_dir, tmp_path / "outside", marker)
            cases = _load_drafter_attacks(targets[ROLLOUT][0], paths) + _bad_field_attacks(targets)
            seen["cases"] = cases
            seen["answers"] = attack({"mode": "calls", "token": token, "calls": [c for c, _ in cases]})
            seen["drafter_version"] = plane.rollout_clients[0].status()["drafter_version"]
            # the planted folders go (the attacker owning the run folder is out of scope)
            shutil.rmtree(paths["inside"])
            (run_dir / "checkpoints" / "spot_trainer" / "published" / "v000000998").unlink()
        return row

    driver.step = step_then_attack
    summary = driver.run()

    # (a) every RPC of every generated service, at every address of the run, without the secret
    out = seen["every_rpc"]
    assert {COORD, ROLLOUT, TUNER, SPOT} <= set(out["services"])
    targets_served = {key.split("/")[0] for key in out["codes"]}
    assert set(out["services"]) <= targets_served, "a service of the protos is not served by the run"
    from tests.security.attacker import service_descriptors

    n_rpcs = sum(len(d.methods) for d in service_descriptors().values())
    assert n_rpcs >= 16
    assert len([k for k in out["codes"] if not k.startswith("grpc.health")]) >= n_rpcs
    bad = {k: v for k, v in out["codes"].items() if v != ["UNAUTHENTICATED", "UNAUTHENTICATED"]}
    assert not bad, bad

    # (b) + (d) with the secret: refused, nothing ran, nothing changed
    got = seen["answers"]["codes"]
    assert len(got) == len(seen["cases"])
    mismatches = [
        (c["service"].rsplit(".", 1)[-1], c["method"], c["request"], g, w, d)
        for (c, w), g, d in zip(seen["cases"], got, seen["answers"]["details"])
        if g != w
    ]
    assert not mismatches, mismatches
    assert not marker.exists()
    assert seen["drafter_version"] == 0

    # the run went on to the end, undisturbed
    assert summary["steps"] == steps
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    client = CoordinatorClient(driver.plane.coordinator_address, driver.plane.token)
    try:
        st = client.status()
    finally:
        client.close()
        driver.plane.coordinator_pool.call(0, "close")
        driver.plane.coordinator_pool.shutdown()
    assert st.rl_step == steps and st.versions.policy_version == steps
    assert sorted(w.worker_id for w in st.workers) == ["0", "1"]
    assert driver.plane.token not in (run_dir / "config.yaml").read_text()
    printed = capsys.readouterr()
    assert driver.plane.token not in printed.out + printed.err  # never in the run's output
    if use_ray:  # nor in Ray's logs (actor output, task events)
        import ray

        logs = Path(ray._private.worker._global_node.get_session_dir_path()) / "logs"
        files = [p for p in logs.rglob("*") if p.is_file()]
        assert files
        assert not [p for p in files if driver.plane.token.encode() in p.read_bytes()]
