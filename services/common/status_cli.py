"""``tailspec status [--run-dir DIR] [--address HOST:PORT] [--token T]``: ask the coordinator over gRPC, print a
table.

Prints the current RL step and phase, the newest policy / drafter / strategy-table versions, bubble totals,
and one row per worker: id, role, state, policy and drafter version, active batch, pending requests, last
heartbeat, address. ``--json`` prints the raw ``CoordinatorStatus`` instead.

Every call is authenticated with the run's secret. ``--run-dir`` reads it from the run folder's
``grpc_token`` (mode 0600; refused when others can read it) and the coordinator's address from its
``coordinator_address``. Defaults otherwise: ``--address`` = ``$TAILSPEC_COORDINATOR_ADDRESS`` or
``127.0.0.1:50051``; ``--token`` = ``$TAILSPEC_GRPC_TOKEN``; ``--token`` and ``--address`` win over the run
folder. Exit status: 0 ok, 2 when the coordinator cannot be asked (the error is printed).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import grpc
from google.protobuf import json_format

from services.common.grpc_auth import TOKEN_ENV, read_token_file
from services.common.grpc_client import DEFAULT_COORDINATOR_PORT, channel
from services.common.proto_gen.tailspec.v1 import common_pb2, coordinator_pb2, coordinator_pb2_grpc

ADDRESS_ENV = "TAILSPEC_COORDINATOR_ADDRESS"
DEFAULT_ADDRESS = f"127.0.0.1:{DEFAULT_COORDINATOR_PORT}"

_STATE_STYLE = {
    "STARTING": "blue",
    "ROLLOUT": "green",
    "IDLE": "yellow",
    "TRAINING": "cyan",
    "PREEMPTING": "magenta",
    "FAILED": "bold red",
    "STOPPED": "dim",
}


def fetch_status(
    address: str = DEFAULT_ADDRESS,
    token: str | None = None,
    *,
    timeout: float = 5.0,
    verbose: bool = False,
    tls_root_certificates: bytes | str | None = None,
) -> coordinator_pb2.CoordinatorStatus:
    """``CoordinatorService.GetStatus`` at ``address``. Raises ``grpc.RpcError`` on failure."""
    with channel(address, token, tls_root_certificates=tls_root_certificates) as ch:
        stub = coordinator_pb2_grpc.CoordinatorServiceStub(ch)
        return stub.GetStatus(common_pb2.GetStatusRequest(verbose=verbose), timeout=timeout)


def _enum_name(enum, value: int, prefix: str) -> str:
    try:
        name = enum.Name(value)
    except ValueError:
        return str(value)
    return name.removeprefix(prefix) if not name.endswith("UNSPECIFIED") else "-"


def state_name(state: int) -> str:
    """``WORKER_STATE_IDLE`` -> ``IDLE``."""
    return _enum_name(common_pb2.WorkerState, state, "WORKER_STATE_")


def _age(ts, now: float) -> str:
    if not ts.seconds and not ts.nanos:
        return "-"
    return f"{max(0.0, now - ts.ToNanoseconds() / 1e9):.1f}s ago"


def _version(v: int) -> str:
    """Drafter / strategy-table versions: 0 = none yet (the policy's v0 is the initial policy)."""
    return f"v{v}" if v else "-"


def print_status(resp: coordinator_pb2.CoordinatorStatus, console=None) -> None:
    """Render ``resp`` as a rich table (to stdout unless ``console`` is given)."""
    from rich.console import Console
    from rich.table import Table

    if console is None:
        console = Console(highlight=False)
        if not console.is_terminal:
            console.width = max(console.width, 160)  # captured / piped: do not squeeze the table
    now = resp.now.ToNanoseconds() / 1e9 if resp.HasField("now") else time.time()
    v = resp.versions
    phase = _enum_name(common_pb2.StepPhase, resp.phase, "STEP_PHASE_")
    where = f" (coordinator {resp.info.address})" if resp.info.address else ""
    console.print(
        f"[bold]tailspec[/bold]{where}: step [bold]{resp.rl_step}[/bold]  phase {phase}"
        f"  policy v{v.policy_version}  drafter {_version(v.drafter_version)}"
        f"  strategy table {_version(v.strategy_table_version)}"
    )
    console.print(
        f"bubble {resp.bubble_seconds_total:.1f}s, of which trained {resp.bubble_trained_seconds_total:.1f}s"
        f"  active grants {len(resp.active_grants)}"
    )
    table = Table(show_lines=False)
    for col, kw in (
        ("Worker", dict(no_wrap=True)),
        ("Role", {}),
        ("State", dict(no_wrap=True)),
        ("Policy", dict(justify="right")),
        ("Drafter", dict(justify="right")),
        ("Batch", dict(justify="right")),
        ("Pending", dict(justify="right")),
        ("Heartbeat", dict(justify="right")),
        ("Address", {}),
        ("Note", {}),
    ):
        table.add_column(col, **kw)
    for w in sorted(resp.workers, key=lambda w: w.worker_id):
        st = state_name(w.state)
        style = _STATE_STYLE.get(st)
        table.add_row(
            w.worker_id,
            _enum_name(common_pb2.WorkerRole, w.role, "WORKER_ROLE_").lower(),
            f"[{style}]{st}[/{style}]" if style else st,
            f"v{w.versions.policy_version}",
            _version(w.versions.drafter_version),
            str(w.active_batch_size),
            str(w.pending_requests),
            _age(w.last_heartbeat, now),
            w.address or "-",
            w.message,
        )
    if resp.workers:
        console.print(table)
    else:
        console.print("no workers registered")
    if resp.recent_transitions:
        console.print("[bold]recent transitions[/bold]")
        for t in resp.recent_transitions:
            console.print(
                f"  step {t.rl_step}  {t.worker_id}: {state_name(t.from_state)} -> {state_name(t.to_state)}"
                f"  {t.reason}"
            )


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="tailspec status", description="Show the coordinator's workers, states, versions and RL step."
    )
    ap.add_argument(
        "--run-dir",
        default=None,
        help="a run folder: its grpc_token (mode 0600) and coordinator_address are used",
    )
    ap.add_argument(
        "--address",
        default=None,
        help=f"coordinator HOST:PORT (default: the run folder's, ${ADDRESS_ENV} or {DEFAULT_ADDRESS})",
    )
    ap.add_argument(
        "--token",
        default=None,
        help=f"the run's token (default: the run folder's grpc_token, or ${TOKEN_ENV})",
    )
    ap.add_argument("--tls-ca", default=None, help="PEM file of the CA to verify a TLS coordinator with")
    ap.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the answer")
    ap.add_argument("--verbose", action="store_true", help="also show recent state transitions")
    ap.add_argument("--json", action="store_true", help="print the raw status as JSON")
    args = ap.parse_args(argv)
    if args.run_dir is not None:
        run = Path(args.run_dir)
        try:
            if args.token is None:
                args.token = read_token_file(run)
            if args.address is None:
                args.address = (run / "coordinator_address").read_text().strip()
        except OSError as exc:
            print(f"tailspec status: cannot read the run folder {run}: {exc}", file=sys.stderr)
            return 2
    if args.address is None:
        args.address = os.environ.get(ADDRESS_ENV, DEFAULT_ADDRESS)
    if args.token is None:
        args.token = os.environ.get(TOKEN_ENV)
    try:
        resp = fetch_status(
            args.address,
            args.token,
            timeout=args.timeout,
            verbose=args.verbose,
            tls_root_certificates=args.tls_ca,
        )
    except grpc.RpcError as exc:
        code = exc.code() if hasattr(exc, "code") else None
        hint = ""
        if code == grpc.StatusCode.UNAUTHENTICATED:
            hint = f" (pass --run-dir RUN, --token, or set ${TOKEN_ENV})"
        elif code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            hint = " (is the coordinator running? set --address)"
        details = exc.details() if hasattr(exc, "details") else str(exc)
        print(
            f"tailspec status: cannot get status from {args.address}: "
            f"{code.name if code else 'error'}: {details}{hint}",
            file=sys.stderr,
        )
        return 2
    if args.json:
        print(json_format.MessageToJson(resp, preserving_proto_field_name=True))
    else:
        print_status(resp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
