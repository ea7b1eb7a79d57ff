"""The ``tailspec`` command.

    tailspec train --config configs/gsm8k_tiny.yaml [--run-dir DIR] [dotted.key=value ...]
    tailspec base-model --out DIR [--seed N] [--evaluate]
    tailspec status [--run-dir DIR] [--address HOST:PORT] [--token T]

Bad input (config typo, wrong type, missing dataset, malformed JSONL, bad model folder, tokenizer mismatch)
prints one clear ``error:`` line and exits with status 2; no summary.json is written.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from services.common.config import REDACTED, REPO_ROOT, ConfigError, load_config
from services.common.grpc_auth import read_token_file
from services.common.placement import PlacementError
from services.common.status_cli import main as status_main
from services.pipeline.datasets import DatasetError
from services.pipeline.interrupts import RunInterrupted


def _console():
    try:
        from rich.console import Console

        return Console(highlight=False, width=max(120, Console().width))
    except ImportError:  # pragma: no cover
        return None


def cmd_train(args) -> int:
    # these modules load torch and Ray: imported here so that `tailspec status` and `tailspec --help`
    # start without them
    from ray.exceptions import RayError

    from services.pipeline.driver import RLDriver, TrainingError
    from services.pipeline.preflight import PreflightError
    from services.rollout_actor.model import ModelLoadError

    try:
        if args.resume:
            if args.run_dir and Path(args.run_dir) != Path(args.resume):
                raise ConfigError("--resume names the run folder; leave --run-dir out")
            # the run's own resolved config, plus any overrides given now (e.g. more trainer.steps)
            cfg = load_config(Path(args.resume) / "config.yaml", args.overrides)
            if cfg.grpc.token == REDACTED:  # an operator's token: config.yaml never holds it, its file does
                try:
                    cfg.grpc.token = os.environ.get("TAILSPEC_GRPC_TOKEN") or read_token_file(args.resume)
                except OSError as e:
                    raise ConfigError(
                        f"--resume {args.resume}: the run's grpc token is unreadable ({e})"
                    ) from None
            driver = RLDriver(cfg, run_dir=Path(args.resume), console=_console(), resume=True)
        else:
            cfg = load_config(args.config, args.overrides)
            driver = RLDriver(cfg, run_dir=args.run_dir, console=_console())
        summary = driver.run()
    except (
        ConfigError,
        DatasetError,
        PreflightError,
        ModelLoadError,
        FileExistsError,
        TrainingError,
        PlacementError,
    ) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except RunInterrupted as e:
        print(f"stopped: {e}", file=sys.stderr)
        return e.exit_code
    except RayError as e:  # a service actor failed: its name and cause in one line, not a remote traceback
        print(f"error: {_actor_error(e)}", file=sys.stderr)
        return 2
    print(
        f"done: {summary['steps']} steps in {summary['wall_seconds']:.1f}s, reward "
        f"{summary['reward_mean_first']:.3f} -> {summary['reward_mean_last']:.3f}"
    )
    return 0


def _actor_error(e: Exception) -> str:
    """One line for a Ray error: the failing actor method (when Ray names it) and the cause's message."""
    cause = getattr(e, "cause", None) or e
    text = str(cause).strip() or type(cause).__name__
    where = getattr(e, "function_name", None)
    lines = [ln for ln in text.splitlines() if ln.strip()]
    msg = lines[-1] if getattr(e, "cause", None) is not None else lines[0]
    return f"{where}: {type(cause).__name__}: {msg}" if where else f"{type(cause).__name__}: {msg}"


def cmd_base_model(args) -> int:
    # imported here, like cmd_train's modules (the recipe's evaluation loads torch)
    from services.pipeline.base_model import main as base_main

    argv = ["--out", args.out, "--seed", str(args.seed), "--task", args.task]
    argv += ["--evaluate"] if args.evaluate else []
    return int(base_main(argv) or 0)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["status"]:  # the coordinator's gRPC status, see services/common/status_cli.py
        return int(status_main(argv[1:]) or 0)
    ap = argparse.ArgumentParser(
        prog="tailspec", description="GRPO with adaptive lossless speculative rollouts"
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train", help="run GRPO training (the main job)")
    t.add_argument("--config", default=str(REPO_ROOT / "configs" / "gsm8k_tiny.yaml"))
    t.add_argument("--run-dir", default=None, help="output folder (default runs/<run_id>)")
    t.add_argument(
        "--resume", default=None, metavar="RUN_DIR", help="continue a run from its newest checkpoint"
    )
    t.add_argument("overrides", nargs="*", help="dotted.key=value config overrides, e.g. trainer.steps=2")
    t.set_defaults(fn=cmd_train)
    b = sub.add_parser(
        "base-model", help="build a task's base policy (tokenizer + SFT), e.g. --task running_total"
    )
    b.add_argument("--out", required=True)
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--task", default="gsm8k", help="gsm8k | running_total (the recipe and its data)")
    b.add_argument("--evaluate", action="store_true", help="also report format rate and length quantiles")
    b.set_defaults(fn=cmd_base_model)
    sub.add_parser("status", help="ask the coordinator over gRPC for workers, states, versions and the step")
    args = ap.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
