"""`tailspec status`: asks the coordinator over gRPC and prints workers, states, versions, the RL step."""

from __future__ import annotations

import io
import json
import socket

import pytest
from rich.console import Console

from services.common import status_cli
from services.common.grpc_server import GrpcServer, expose
from services.common.proto_gen.tailspec.v1 import coordinator_pb2_grpc
from tests.common.fake_services import FakeCoordinator

TOKEN = "cli-token"


@pytest.fixture(scope="module")
def coordinator():
    srv = GrpcServer(
        [expose(coordinator_pb2_grpc.CoordinatorServiceServicer, FakeCoordinator())], token=TOKEN
    )
    srv.start()
    yield srv
    srv.stop(grace=0.2)


def test_fetch_and_print_status(coordinator):
    resp = status_cli.fetch_status(coordinator.address, TOKEN)
    assert resp.rl_step == 4 and len(resp.workers) == 3
    buf = io.StringIO()
    status_cli.print_status(resp, console=Console(file=buf, width=200, color_system=None))
    out = buf.getvalue()
    for text in ("step 4", "rollout-0", "rollout-1", "rollout-2", "ROLLOUT", "TRAINING", "IDLE", "v3", "v2"):
        assert text in out, text
    row = next(line for line in out.splitlines() if "rollout-1" in line)
    assert "TRAINING" in row and "v3" in row


def test_main_prints_table(coordinator, capsys, monkeypatch):
    monkeypatch.delenv("TAILSPEC_GRPC_TOKEN", raising=False)
    assert status_cli.main(["--address", coordinator.address, "--token", TOKEN]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    for wid, state in (("rollout-0", "ROLLOUT"), ("rollout-1", "TRAINING"), ("rollout-2", "IDLE")):
        assert any(wid in line and state in line for line in lines), (wid, state, out)
    assert "step 4" in out and "phase ROLLOUT" in out


def test_main_token_from_env_and_json(coordinator, capsys, monkeypatch):
    monkeypatch.setenv("TAILSPEC_GRPC_TOKEN", TOKEN)
    assert status_cli.main(["--address", coordinator.address, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["rl_step"] == "4" and len(data["workers"]) == 3


def test_main_reports_errors(coordinator, capsys, monkeypatch):
    monkeypatch.delenv("TAILSPEC_GRPC_TOKEN", raising=False)
    assert status_cli.main(["--address", coordinator.address]) == 2
    err = capsys.readouterr().err
    assert "UNAUTHENTICATED" in err and "--token" in err

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    assert status_cli.main(["--address", f"127.0.0.1:{free}", "--timeout", "2"]) == 2
    err = capsys.readouterr().err
    assert "UNAVAILABLE" in err or "DEADLINE_EXCEEDED" in err
