"""grpc.host resolution (services/common/hosts.py), the servers that follow it, and the placement bundles."""

from __future__ import annotations

import pytest

from services.common import hosts
from services.common.config import ConfigError, load_config
from services.common.grpc_client import health_check
from services.common.grpc_server import GrpcServer, expose
from services.common.hosts import bind_and_advertise, run_host
from services.common.placement import (
    TRAINER_RESOURCE,
    PlacementError,
    RunPlacement,
    rollout_bundles,
    trainer_bundle,
)
from services.common.proto_gen.tailspec.v1 import coordinator_pb2_grpc
from tests.common.fake_services import FakeCoordinator

TOKEN = "test-token-hosts"
NODE_IP = "127.0.0.5"  # a loopback address other than 127.0.0.1: bindable, and tells the two apart


# ------------------------------------------------------------------------------------- the rule itself
@pytest.mark.parametrize(
    ("host", "multi", "want"),
    [
        ("auto", False, "127.0.0.1"),
        ("auto", True, "node"),
        ("AUTO", True, "node"),
        (None, True, "node"),
        ("node", False, "node"),
        ("0.0.0.0", True, "0.0.0.0"),
        ("10.1.2.3", True, "10.1.2.3"),  # an explicit host wins
        ("127.0.0.1", True, "127.0.0.1"),
    ],
)
def test_run_host(host, multi, want):
    assert run_host(host, multi) == want


@pytest.mark.parametrize(
    ("host", "node_ip", "multi", "bind", "advertise"),
    [
        ("node", "10.0.0.7", False, "10.0.0.7", "10.0.0.7"),
        ("node", None, False, "127.0.0.1", "127.0.0.1"),  # no Ray: loopback
        ("0.0.0.0", "10.0.0.7", False, "0.0.0.0", "10.0.0.7"),  # a wildcard advertises the node IP
        ("0.0.0.0", None, False, "0.0.0.0", "127.0.0.1"),
        ("::", "10.0.0.7", False, "::", "10.0.0.7"),
        ("auto", "10.0.0.7", True, "10.0.0.7", "10.0.0.7"),
        ("auto", "10.0.0.7", False, "127.0.0.1", "127.0.0.1"),  # one node keeps loopback
        ("127.0.0.1", "10.0.0.7", True, "127.0.0.1", "127.0.0.1"),
        ("pod-3.svc", "10.0.0.7", True, "pod-3.svc", "pod-3.svc"),
    ],
)
def test_bind_and_advertise(host, node_ip, multi, bind, advertise):
    assert bind_and_advertise(host, node_ip, multi) == (bind, advertise)


def test_outside_ray_everything_is_loopback(monkeypatch):
    import ray

    monkeypatch.setattr(ray, "is_initialized", lambda: False)  # as in a ray.use_ray=false run
    assert hosts.ray_node_ip() is None and hosts.multi_node() is False
    assert hosts.resolve("auto") == ("127.0.0.1", "127.0.0.1")
    assert hosts.resolve("node") == ("127.0.0.1", "127.0.0.1")
    assert hosts.resolve("0.0.0.0") == ("0.0.0.0", "127.0.0.1")
    assert hosts.resolve("10.1.2.3") == ("10.1.2.3", "10.1.2.3")


def test_config_default_is_auto_and_validated():
    assert load_config(None).grpc.host == "auto"
    with pytest.raises(ConfigError, match="grpc.host"):
        load_config(None, ["grpc.host= "])
    with pytest.raises(ConfigError, match="rollout.gpus_per_actor"):
        load_config(None, ["rollout.gpus_per_actor=-1"])
    with pytest.raises(ConfigError, match="trainer.gpus"):
        load_config(None, ["trainer.gpus=-0.5"])
    with pytest.raises(ConfigError, match="ray.placement_timeout_s"):
        load_config(None, ["ray.placement_timeout_s=0"])
    cfg = load_config(None, ["rollout.gpus_per_actor=0.5", "trainer.gpus=1"])
    assert (cfg.rollout.gpus_per_actor, cfg.trainer.gpus) == (0.5, 1)


# ---------------------------------------------------------------------------- servers follow the rule
@pytest.fixture
def on_node(monkeypatch):
    """This process pretends to be an actor on a Ray node whose IP is NODE_IP, in a multi-node cluster."""
    monkeypatch.setattr(hosts, "ray_node_ip", lambda: NODE_IP)
    monkeypatch.setattr(hosts, "multi_node", lambda: True)


@pytest.mark.parametrize("host", ["node", "auto", "0.0.0.0"])
def test_server_advertises_its_node_ip(on_node, host):
    srv = GrpcServer(
        [expose(coordinator_pb2_grpc.CoordinatorServiceServicer, FakeCoordinator())], host=host, token=TOKEN
    )
    srv.start()
    try:
        assert srv.address == f"{NODE_IP}:{srv.port}"  # never 0.0.0.0, never 127.0.0.1
        assert health_check(srv.address, token=TOKEN) == "SERVING"  # and it is reachable there
        assert srv.host == ("0.0.0.0" if host == "0.0.0.0" else NODE_IP)
    finally:
        srv.stop(grace=0.2)


def test_wildcard_outside_ray_advertises_loopback(monkeypatch):
    monkeypatch.setattr(hosts, "ray_node_ip", lambda: None)  # no Ray here (another test may have started it)
    monkeypatch.setattr(hosts, "multi_node", lambda: False)
    srv = GrpcServer(
        [expose(coordinator_pb2_grpc.CoordinatorServiceServicer, FakeCoordinator())], "0.0.0.0", token=TOKEN
    )
    srv.start()
    try:
        assert srv.address == f"127.0.0.1:{srv.port}"
    finally:
        srv.stop(grace=0.2)


def test_node_host_needs_a_token_off_loopback(on_node, monkeypatch):
    monkeypatch.setattr(hosts, "ray_node_ip", lambda: "10.9.8.7")
    with pytest.raises(ValueError, match="token"):
        GrpcServer([expose(coordinator_pb2_grpc.CoordinatorServiceServicer, FakeCoordinator())], "node")


def test_spot_stream_advertises_its_node_ip(on_node, tiny_policy_dir, tmp_path):
    from services.spot_trainer.service import SpotTrainerService

    svc = SpotTrainerService(str(tiny_policy_dir), str(tmp_path / "ckpt"), token=TOKEN, stream_host="0.0.0.0")
    try:
        assert svc.receiver.address.startswith("tcp://0.0.0.0:")
        port = svc.receiver.address.rsplit(":", 1)[1]
        assert svc.address() == f"tcp://{NODE_IP}:{port}"
    finally:
        svc.close()


# -------------------------------------------------------------------------------------------- placement
def test_bundles():
    assert rollout_bundles(2, 1, 0) == [{"CPU": 1.0}, {"CPU": 1.0}]
    assert rollout_bundles(3, 2, 0.5) == [{"CPU": 2.0, "GPU": 0.5}] * 3
    assert trainer_bundle(0, False) is None  # shares rollout bundle 0: a node with CPUs
    assert trainer_bundle(0, True) == {TRAINER_RESOURCE: 1.0}
    assert trainer_bundle(2, False) == {"GPU": 2.0}
    assert trainer_bundle(1, True) == {"GPU": 1.0, TRAINER_RESOURCE: 1.0}


def test_no_ray_no_placement():
    cfg = load_config(None, ["ray.use_ray=false", "rollout.gpus_per_actor=1"])
    p = RunPlacement.from_config(cfg).create()
    assert p.rollout_pg is None and p.trainer_pg is None
    assert p.rollout_options(0) == {} and p.spot_options(3) == {} and p.trainer_options() == {}
    p.remove()


def test_placement_groups_on_ray(ray_cluster):
    """On the 2-CPU test cluster: the make-run shape (2 actors x 1 CPU + the trainer) is placed without a
    deadlock (no tailspec_trainer marker here: the trainer shares rollout bundle 0); everything is removed."""
    from ray.util import placement_group_table

    p = RunPlacement(True, num_actors=2, threads_per_actor=1, timeout_s=120).create()
    try:
        assert p.trainer_bundle is None and p.trainer_pg is None
        assert [b for b in placement_group_table(p.rollout_pg)["bundles"].values()] == [{"CPU": 1.0}] * 2
        opts = p.trainer_options()["scheduling_strategy"]
        assert opts.placement_group == p.rollout_pg and opts.placement_group_bundle_index == 0
        assert p.spot_options(3)["scheduling_strategy"].placement_group_bundle_index == 1
        pg_id = p.rollout_pg.id
    finally:
        p.remove()
    assert p.rollout_pg is None
    assert placement_group_table()[pg_id.hex()]["state"] == "REMOVED"


def test_a_cluster_too_small_fails_with_what_is_missing(ray_cluster):
    from ray.util import placement_group_table

    before = {k for k, v in placement_group_table().items() if v["state"] != "REMOVED"}
    p = RunPlacement(True, num_actors=3, threads_per_actor=1, timeout_s=3)
    with pytest.raises(PlacementError, match=r"cannot place the rollout actors.*'CPU': 2\.0"):
        p.create()
    assert p.rollout_pg is None  # removed, not left pending
    after = {k for k, v in placement_group_table().items() if v["state"] != "REMOVED"}
    assert after <= before


def test_more_gpus_than_the_machine_has(tmp_path, tiny_policy_dir, capsys, monkeypatch):
    import torch

    from services.pipeline.cli import main

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    run = tmp_path / "run"
    rc = main(
        ["train", "--run-dir", str(run), f"model.path={tiny_policy_dir}", "ray.num_cpus=2"]
        + ["rollout.gpus_per_actor=1", "trainer.steps=1"]
    )
    err = capsys.readouterr().err
    assert rc == 2 and not run.exists(), err
    assert err.count("error:") == 1 and "needs 2 GPUs" in err and "has 0" in err, err
