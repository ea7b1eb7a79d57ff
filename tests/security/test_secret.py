"""The run's secret: generated per run unless the operator chose one, required by every service (loopback
included), kept out of config.yaml, written to the run folder with mode 0600 for ``tailspec status`` (which
refuses a copy others can read)."""

from __future__ import annotations

import os

import grpc
import pytest

from services.common.config import load_config, to_yaml
from services.common.grpc_auth import TOKEN_ENV, read_token_file, write_token_file
from services.common.status_cli import main as status_main
from services.coordinator.client import CoordinatorClient
from services.coordinator.service import CoordinatorActor
from services.pipeline.control_plane import ControlPlane
from services.tuner.service import TunerService


def _plane(tmp_path, *overrides) -> ControlPlane:
    cfg = load_config(None, list(overrides))
    return ControlPlane(cfg, tmp_path / "model", tmp_path / "run", None, [], lambda: {})


def test_a_fresh_secret_per_run_unless_the_operator_chose_one(tmp_path, monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    a, b = _plane(tmp_path).token, _plane(tmp_path).token
    assert a != b and len(a) >= 32
    assert _plane(tmp_path, "grpc.token=chosen-by-operator").token == "chosen-by-operator"
    monkeypatch.setenv(TOKEN_ENV, "from-the-environment")
    assert _plane(tmp_path).token == "from-the-environment"


def test_config_yaml_redacts_the_token():
    cfg = load_config(None, ["grpc.token=hunter2-operator-token"])
    text = to_yaml(cfg)
    assert "hunter2-operator-token" not in text and "<redacted>" in text
    assert "hunter2-operator-token" in to_yaml(cfg, redact=False)


def test_token_file_is_private_and_a_readable_copy_is_refused(tmp_path, capsys):
    path = write_token_file(tmp_path, "s3cret-token")
    assert path.stat().st_mode & 0o777 == 0o600 and read_token_file(tmp_path) == "s3cret-token"
    os.chmod(path, 0o644)
    with pytest.raises(PermissionError, match="readable by others"):
        read_token_file(tmp_path)
    (tmp_path / "coordinator_address").write_text("127.0.0.1:1\n")
    assert status_main(["--run-dir", str(tmp_path)]) == 2
    assert "readable by others" in capsys.readouterr().err


def test_every_service_requires_a_token_even_on_loopback():
    for serve in (CoordinatorActor().serve, TunerService().serve):
        with pytest.raises(ValueError, match="token"):
            serve()
        with pytest.raises(ValueError, match="token"):
            serve("127.0.0.1", 0, "")


def test_status_reads_the_run_folder_and_is_refused_without_it(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    actor = CoordinatorActor()
    address = actor.serve(token="run-secret")
    try:
        write_token_file(tmp_path, "run-secret")
        (tmp_path / "coordinator_address").write_text(address + "\n")
        assert status_main(["--run-dir", str(tmp_path)]) == 0
        assert "no workers registered" in capsys.readouterr().out
        assert status_main(["--address", address]) == 2
        err = capsys.readouterr().err
        assert "UNAUTHENTICATED" in err and "--run-dir" in err
        with pytest.raises(grpc.RpcError) as e:
            CoordinatorClient(address, "wrong", timeout=10).states()
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        actor.close()
