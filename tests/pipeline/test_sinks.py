"""trainer.logger: a short run with every sink writes TensorBoard event files and an offline W&B run whose
scalars are metrics.jsonl's rows; unknown or unavailable loggers are refused with one line naming the key."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from services.common.config import ConfigError, load_config
from services.pipeline.sinks import MetricSinks, check_loggers, scalars


def _tensorboard_scalars(log_dir: Path) -> dict[str, dict[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def _wandb_history(root: Path) -> list[dict[str, float]]:
    """The history rows of the offline run under ``root/wandb`` (its ``.wandb`` file: the LevelDB log format,
    32 KiB blocks of CRC-framed chunks, each record a ``wandb_internal_pb2.Record``)."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = root.glob("wandb/offline-run-*/run-*.wandb")
    data = path.read_bytes()
    assert struct.unpack("<4sHB", data[:7]) == (b":W&B", 0xBEE1, 0)
    block, pos, buf, rows = 32768, 7, b"", []
    while pos + 7 <= len(data):
        room = block - pos % block
        if room < 7:
            pos += room
            continue
        _crc, n, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:
            pos += room
            continue
        buf += data[pos + 7 : pos + 7 + n]
        pos += 7 + n
        if kind in (1, 4):  # FULL or LAST chunk: a whole record
            rec = pb.Record()
            rec.ParseFromString(buf)
            buf = b""
            if rec.WhichOneof("record_type") == "history":
                items = {
                    (i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in rec.history.item
                }
                rows.append(
                    {k: v for k, v in items.items() if not k.startswith("_")} | {"_step": items["_step"]}
                )
    return rows


def test_scalars_flatten_rows():
    row = {"step": 3, "a": 1.5, "ok": True, "s": "x", "n": None, "d": {"k": {"x": 2}}, "l": [{"v": 4}, 5]}
    assert scalars(row) == {"step": 3.0, "a": 1.5, "ok": 1.0, "d/k/x": 2.0, "l/0/v": 4.0, "l/1": 5.0}
    assert scalars({"x": float("nan"), "y": float("inf")}) == {}


@pytest.mark.parametrize(
    "names, message",
    [
        (["console", "jsonl", "mlflow"], "unknown logger 'mlflow'"),
        (["console", "tensorboard"], "must include 'jsonl'"),
    ],
)
def test_bad_loggers_are_refused(names, message):
    assert message in check_loggers(names)
    with pytest.raises(ConfigError, match="trainer.logger") as e:
        load_config(None, [f"trainer.logger=[{','.join(names)}]"])
    assert message in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ValueError, match=message):
        MetricSinks(names, Path("/nonexistent"))


def test_default_loggers_are_console_and_jsonl():
    assert load_config(None, []).trainer.logger == ["console", "jsonl"]
    assert check_loggers(["console", "jsonl", "tensorboard", "wandb"]) is None


def test_run_logs_every_sink(train_tiny, capsys):
    run = train_tiny(
        "eval.enabled=false",
        "metrics.enabled=false",
        "trainer.logger=[jsonl,tensorboard,wandb]",
        prompts=2,
        max_new_tokens=8,
    )
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert "step 1/2" not in capsys.readouterr().out  # no console logger: no progress lines

    tb = _tensorboard_scalars(run / "tensorboard")
    want = {r["step"]: scalars(r) for r in rows}
    assert {"reward_mean", "rollout_seconds", "workers/0/tokens"} <= set(tb)
    assert set(tb) == {k for flat in want.values() for k in flat}
    for step, flat in want.items():
        for tag, value in flat.items():
            assert tb[tag][step] == pytest.approx(value, rel=1e-6, abs=1e-30), tag  # float32 in event files

    history = _wandb_history(run)
    assert [h["_step"] for h in history] == [1, 2]
    for h, (step, flat) in zip(history, sorted(want.items())):
        assert {k: v for k, v in h.items() if k != "_step"} == pytest.approx(flat), step
