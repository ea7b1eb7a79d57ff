"""`tailspec status` asks a job's coordinator over gRPC and prints its workers, states, versions and step."""

import json

from services.common.status_cli import fetch_status
from services.common.status_cli import main as status_main


def test_status_of_a_run(train_tiny, capsys):
    run = train_tiny("coordinator.keep_serving=true")
    summary = json.loads((run / "summary.json").read_text())
    address = summary["coordinator_address"]
    token_file = run / "grpc_token"
    assert token_file.stat().st_mode & 0o777 == 0o600  # the run's secret, for its owner only
    token = token_file.read_text().strip()
    assert token not in (run / "config.yaml").read_text()
    st = fetch_status(address, token)
    assert st.rl_step == 2 and st.versions.policy_version == 2
    assert sorted(w.worker_id for w in st.workers) == ["0", "1"]
    capsys.readouterr()
    assert status_main(["--run-dir", str(run)]) in (0, None)  # token and address from the run folder
    out = capsys.readouterr().out
    assert "IDLE" in out and "0" in out and "1" in out
    assert status_main(["--address", address, "--token", token]) in (0, None)
    assert "IDLE" in capsys.readouterr().out
    assert status_main(["--address", address, "--token", "wrong"]) == 2  # UNAUTHENTICATED
    assert "UNAUTHENTICATED" in capsys.readouterr().err
