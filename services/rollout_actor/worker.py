"""RolloutWorker: one rollout actor's state, plain Python (the pipeline runs it as a Ray actor as it is).

It owns a copy of the policy (``Transformer``), the tokenizer and a decoding ``Engine``; it decodes the shard
of requests the driver assigns it and returns finished responses with per-request timings and the worker's
own start/finish times (the driver derives the long tail and the bubbles from them). New policy weights
arrive versioned (``load_weights``, through the Ray object store) between rollout phases, never during one.

Control plane (gRPC, ``services/rollout_actor/grpc_service.py``): ``serve()`` hosts this actor's
``RolloutService`` (strategy tables, drafter versions, status); ``connect_coordinator()`` registers with the
coordinator and sends heartbeats from a background thread carrying the actor's own view of its state (what a
restarted coordinator rebuilds from); ``connect_tuner()`` makes every finished rollout share report its
decode-step observations to the tuner in one batch.
"""

from __future__ import annotations

import copy
import gc
import logging
import os
import threading
import time
from pathlib import Path

import torch

from services.common.grpc_auth import require_token
from services.common.grpc_server import GrpcServer, expose
from services.common.metrics import bucket_label, process_metrics
from services.common.proto_gen.tailspec.v1 import rollout_pb2_grpc
from services.common.validation import InvalidArgument
from services.coordinator.client import CoordinatorClient
from services.rollout_actor.drafters import build_drafters, published_drafter_folder, strategy_from_config
from services.rollout_actor.engine import Engine, GenerationRequest, SamplingParams
from services.rollout_actor.grpc_service import RolloutGrpc
from services.rollout_actor.model import Transformer
from services.rollout_actor.shard import RolloutRequest, ShardResult, streams_hidden
from services.rollout_actor.speculative.hybrid import HybridDrafter
from services.rollout_actor.speculative.stats import aggregate, long_tail_totals
from services.rollout_actor.speculative.strategy import FixedStrategy, Strategy, StrategySelector
from services.spot_trainer.buffer import Frame
from services.spot_trainer.stream import HiddenStateSender
from services.spot_trainer.trainer import load_published
from services.tuner.bandit import bucket_index, share_allowance
from services.tuner.budgets import BudgetConfig
from services.tuner.grpc_service import TunerClient
from services.tuner.selector import StrategySelector as TunedSelector


class _LiveStepLog(list):
    """``Engine.step_log`` that also hands each decode step's active batch size to ``on_step`` (the live
    ``tailspec_active_batch_size`` gauge) as the engine appends the step's record."""

    def __init__(self, on_step):
        super().__init__()
        self._on_step = on_step

    def append(self, record) -> None:
        super().append(record)
        self._on_step(record.batch_size)


def choices_by_bucket(observations: list[dict], edges: list[int]) -> dict[str, dict[str, int]]:
    """Decode steps per tuner bucket label (``'8-15'``, ``'256+'``) and arm, from the selector's observations
    (each: ``batch_size``, ``arm``, ``steps``; ``edges``: the table's ``bucket_edges``)."""
    out: dict[str, dict[str, int]] = {}
    for ob in observations:
        i = bucket_index(edges, int(ob["batch_size"]))
        label = bucket_label(edges[i], edges[i + 1] if i + 1 < len(edges) else None)
        arms = out.setdefault(label, {})
        arms[ob["arm"]] = arms.get(ob["arm"], 0) + int(ob["steps"])
    return out


class RolloutWorker:
    """Decodes shards of requests with one engine.

    Args:
        worker_id: index of this worker in the pool.
        model_path: HF folder of the initial policy.
        sampling: temperature / top_p / top_k / max_new_tokens used for every request.
        max_batch_size: KV slots.
        threads: torch intra-op threads for this worker.
        selector: per-step speculation ``StrategySelector`` (default: ``rollout.speculative``'s fixed strategy).
        drafters: name -> Drafter.
        drafter_dir: the run's published-drafter folder (``<run>/checkpoints/spot_trainer/published``);
            ``LoadDrafter`` loads a version only from there (None: it loads none).
        metrics: export ``tailspec_active_batch_size`` at every decode step (``process_metrics``).
    """

    def __init__(
        self,
        worker_id: int,
        model_path: str,
        sampling: dict,
        max_batch_size: int = 64,
        threads: int = 1,
        selector: StrategySelector | None = None,
        drafters: dict | None = None,
        max_seq_len: int | None = None,
        speculative: dict | None = None,
        tuner_table: dict | None = None,
        tuner_budgets: dict | None = None,
        learned: dict | None = None,
        drafter_dir: str | None = None,
        metrics: bool = False,
    ):
        torch.set_num_threads(max(1, threads))
        from tokenizers import Tokenizer

        self.worker_id = worker_id
        self.model = Transformer.from_pretrained(model_path)
        self.tokenizer = Tokenizer.from_file(os.path.join(model_path, "tokenizer.json"))
        self.sampling = dict(sampling)
        self.policy_version = 0
        self.max_seq_len = max_seq_len or min(self.model.config.max_position_embeddings, 1024)
        self.max_batch_size = max_batch_size
        self.strategy = strategy_from_config(speculative)
        self.learned_cfg = learned
        # the run's published-drafter folder: LoadDrafter loads only versions published there
        self.drafter_dir = None if drafter_dir is None else Path(drafter_dir).resolve()
        self.drafters = drafters if drafters is not None else build_drafters(self.model, learned=learned)
        learned_drafter = self.drafters.get("learned")
        self.hidden_layers = tuple(getattr(learned_drafter, "required_hidden_layers", ()))
        self.drafter_version = 0
        self._pre_rollout_state: dict | None = None
        self.tuned = None
        if tuner_table is not None and selector is None:
            self.tuned = TunedSelector(
                tuner_table, BudgetConfig.from_dict(tuner_budgets or {}), seed=worker_id
            )
            selector = self.tuned
        self.engine = self._new_engine(self.drafters, selector or FixedStrategy(self.strategy))
        # control plane: rollout() holds _busy; gRPC updates arriving meanwhile wait in _pending
        self._busy = threading.Lock()
        self._pending: dict[str, tuple] = {}
        self._in_rollout = False
        self._coord_state = "STARTING"
        self.rl_step = 0
        self.counters = dict(finished_requests=0, generated_tokens=0, drafted_tokens=0, accepted_tokens=0)
        self.server = None
        self._coordinator = None
        self._tuner = None
        self._hb_stop = threading.Event()
        self._hb_thread: threading.Thread | None = None
        self._history_thread: threading.Thread | None = None  # indexes a rollout's responses afterwards
        self._metrics = process_metrics(metrics)  # live tailspec_active_batch_size (None: metrics off)
        self._set_batch_size(0)

    # ------------------------------------------------------------------ control plane (gRPC)
    def serve(self, host: str = "127.0.0.1", port: int = 0, token: str | None = None) -> str:
        """Serve ``tailspec.v1.RolloutService`` (plus health) from this process; returns ``host:port``. Every
        call must carry ``token`` (required)."""
        adapter = RolloutGrpc(self)
        self.server = GrpcServer(
            [expose(rollout_pb2_grpc.RolloutServiceServicer, adapter)],
            host=host,
            port=port,
            token=require_token(token, "a rollout actor's gRPC service"),
            name=f"rollout-{self.worker_id}",
        )
        self.server.start()
        adapter.address = self.server.address
        return self.server.address

    @property
    def state(self) -> str:
        """This actor's own view: ROLLOUT while decoding a shard, else the coordinator's last answer."""
        return "ROLLOUT" if self._in_rollout else self._coord_state

    def _versions(self) -> dict:
        table = self.tuned.version if self.tuned is not None else 0
        return dict(
            policy_version=self.policy_version,
            drafter_version=self.drafter_version,
            strategy_table_version=table,
        )

    def connect_coordinator(
        self, address: str, token: str | None = None, heartbeat_interval_s: float | None = None
    ) -> str:
        """Register with the coordinator at ``address`` and heartbeat it from a background thread.

        A first registration is followed by ``ReportState(IDLE)`` (model loaded, ready). Called again with a
        restarted coordinator's address, the actor re-registers in its own view of its state (ROLLOUT while
        decoding, else the last state the coordinator told it), which the new coordinator adopts. Returns
        the state the coordinator holds for this actor."""
        old, self._coordinator = self._coordinator, CoordinatorClient(address, token)
        if old is not None:
            old.close()
        wid = str(self.worker_id)
        fresh = self._coord_state == "STARTING" and not self._in_rollout
        reg = self._coordinator.register(
            wid,
            cpus=torch.get_num_threads(),
            state=None if fresh else self.state,
            rl_step=self.rl_step,
            versions=self._versions(),
            address=self.server.address if self.server is not None else "",
        )
        state = reg["state"]
        if state == "STARTING":
            state = self._coordinator.report_state(wid, "IDLE", "ready: model loaded")["state"]
        if not self._in_rollout:
            self._coord_state = str(state)
        if self._hb_thread is None:
            interval = heartbeat_interval_s or reg["heartbeat_interval_s"] or 1.0
            self._hb_thread = threading.Thread(target=self._heartbeats, args=(interval,), daemon=True)
            self._hb_thread.start()
        return str(state)

    def _heartbeats(self, interval: float) -> None:
        log = logging.getLogger(__name__)
        failing = False
        while not self._hb_stop.wait(interval):
            client = self._coordinator
            try:
                hb = client.heartbeat(str(self.worker_id), self.state, self._versions())
                failing = False
            except Exception as e:  # coordinator down or restarting: keep trying, log once
                if not failing:
                    log.warning("worker %s: heartbeat to %s failed: %s", self.worker_id, client.address, e)
                failing = True
                continue
            if hb["known"] and not self._in_rollout and hb["state"] is not None:
                self._coord_state = str(hb["state"])

    def connect_tuner(self, address: str, token: str | None = None) -> bool:
        """Report this actor's decode-step observations to the tuner at the end of every rollout share."""
        self._tuner = TunerClient(address, token)
        return self.tuned is not None

    def apply_table(self, table: dict) -> tuple[bool, bool, int]:
        """Install the tuner's newer strategy table now, or at the next rollout when one is running.
        Returns (accepted, deferred, active table version)."""
        if self.tuned is None:
            return False, False, 0
        if int(table.get("version", 0)) <= self.tuned.version:
            return False, False, self.tuned.version
        if not self._busy.acquire(blocking=False):
            self._pending["table"] = (table,)
            return True, True, self.tuned.version
        try:
            self.tuned.update_table(table)
        finally:
            self._busy.release()
        return True, False, self.tuned.version

    def published_drafter(self, version: int, path: str | None = None) -> Path:
        """The folder of drafter ``version`` in the run's published-drafter folder (``drafter_dir``).

        ``path`` (optional, as ``LoadDrafter`` carries it) must name that very folder. Raises
        ``InvalidArgument`` for a version < 1, a relative path, a path outside the run's folder (symlinks
        resolved) or another version's folder, and when this actor has no learned drafter or no folder;
        ``Refused`` (NOT_FOUND) when the version is not published there (complete, marker written)."""
        if "learned" not in self.drafters:
            raise InvalidArgument(f"worker {self.worker_id} has no learned drafter")
        if self.drafter_dir is None:
            raise InvalidArgument(f"worker {self.worker_id} has no published-drafter folder to load from")
        return published_drafter_folder(self.drafter_dir, version, path)

    def apply_drafter(self, version: int, path: str | None = None) -> tuple[bool, bool, int]:
        """Load the learned drafter ``version`` from the run's published-drafter folder now, or at the next
        rollout when one is running (``path``, optional, must name that version's folder there:
        ``published_drafter``). Returns (accepted, deferred, active drafter version)."""
        folder = self.published_drafter(version, path)
        if version <= self.drafter_version:
            return False, False, self.drafter_version
        if not self._busy.acquire(blocking=False):
            self._pending["drafter"] = (version, str(folder))
            return True, True, self.drafter_version
        try:
            self._load_published(version, str(folder))
        finally:
            self._busy.release()
        return True, False, self.drafter_version

    def _load_published(self, version: int, path: str) -> None:
        """Load a published drafter (JSON + safetensors, never a pickle); ``ValueError`` leaves the drafter
        as it was."""
        self.load_drafter(load_published(path), version)

    def _apply_pending(self) -> None:
        """At a phase boundary (start of a rollout): what gRPC delivered while the last one ran. A drafter
        version that no longer loads (pruned, malformed) is logged and skipped: the rollout goes on with the
        drafter it has."""
        pending, self._pending = self._pending, {}
        if "table" in pending and self.tuned is not None:
            self.tuned.update_table(pending["table"][0])
        if "drafter" in pending:
            version, path = pending["drafter"]
            try:
                self._load_published(version, str(self.published_drafter(version, path)))
            except (OSError, ValueError) as e:
                logging.getLogger(__name__).warning(
                    "worker %s: drafter version %s not loaded: %s", self.worker_id, version, e
                )

    def status(self) -> dict:
        return dict(
            worker_id=self.worker_id,
            state=self.state,
            rl_step=self.rl_step,
            max_batch_size=self.max_batch_size,
            policy_version=self.policy_version,
            drafter_version=self.drafter_version,
            table_version=self._versions()["strategy_table_version"],
            **self.counters,
        )

    def _set_batch_size(self, n: int) -> None:
        """``tailspec_active_batch_size{worker}`` := ``n`` requests decoding (no-op with metrics off)."""
        if self._metrics is not None:
            self._metrics.set_active_batch_size(str(self.worker_id), n)

    def _report_observations(self) -> tuple[dict | None, dict | None, int]:
        """This shard's tuner choices, per arm and per (bucket, arm) (None without a tuner connection); its
        observations go to the tuner (when connected) in one batch."""
        if self.tuned is None:
            return None, None, 0
        choices = self.tuned.drain_choices()
        if self._tuner is None:
            return choices, None, 0
        obs = self.tuned.drain_observations()
        by_bucket = choices_by_bucket(obs, self.tuned.edges)
        if not obs:
            return choices, by_bucket, 0
        try:
            self._tuner.report(str(self.worker_id), obs, self.tuned.version)
        except Exception as e:  # the tuner is advisory: a lost batch costs tuning data, never the rollout
            logging.getLogger(__name__).warning(
                "worker %s: %d observations not reported to the tuner: %s", self.worker_id, len(obs), e
            )
            return choices, by_bucket, 0
        return choices, by_bucket, len(obs)

    def _index_history_async(self) -> None:
        """Index the rollout's finished responses into the drafters' history (the suffix drafter's problem and
        global tries: ~1.5 ms per response) in a background thread, while the driver scores the rollout and the
        policy trainer updates, instead of on the decode thread or at the next rollout's start."""
        ds = list(self.drafters.values())
        self._history_thread = threading.Thread(
            target=lambda: [d.flush() for d in ds], name=f"drafter-history-{self.worker_id}", daemon=True
        )
        self._history_thread.start()

    def _join_history(self) -> None:
        if self._history_thread is not None:
            self._history_thread.join()
            self._history_thread = None

    def close(self) -> None:
        self._join_history()
        self._hb_stop.set()
        for c in (self._coordinator, self._tuner):
            if c is not None:
                c.close()
        if self.server is not None:
            self.server.stop()

    def _replay_selector(self) -> StrategySelector:
        """The live selector's copy with its table as the rollout started, no regret allowance (a short replay
        would spend in a second what the live rollout spends over its length: ``share_allowance``)."""
        if self.tuned is None:
            return FixedStrategy(self.strategy)
        replay = copy.deepcopy(self.tuned)
        replay.update_table(share_allowance(self.tuned.table, 0.0))
        return replay

    def _new_engine(self, drafters: dict, selector: StrategySelector, stream: bool = True) -> Engine:
        """An engine over this worker's model; ``stream``: the live rollout's hidden states feed the spot
        trainer's stream (a replay's never do: nothing would send them)."""
        return Engine(
            self.model,
            max_batch_size=self.max_batch_size,
            max_seq_len=self.max_seq_len,
            tokenizer=self.tokenizer,
            drafters=drafters,
            selector=selector,
            hidden_layers=self.hidden_layers if "learned" in drafters else (),
            hidden_sink=self.hidden_sink if stream and "learned" in drafters else None,
            hidden_filter=self._streams,
        )

    # ------------------------------------------------------------------ hidden states -> spot trainer
    def connect_spot_trainer(
        self, address: str | list[str], stream_fraction: float = 1.0, token: str | None = None
    ) -> bool:
        """Stream committed tokens' hidden states (one frame per finished request) to the spot trainer (one
        ZeroMQ endpoint, or several replicas' endpoints: frames are spread round-robin over them). With
        ``token`` (the run's secret) every frame carries an HMAC-SHA256 the receivers check.

        Only requests selected by ``streams_hidden(request_id, stream_fraction)`` are collected and sent
        (``spot.stream_fraction``). Raises ValueError if ``stream_fraction`` is not in (0, 1]."""
        if not 0.0 < stream_fraction <= 1.0:
            raise ValueError(f"stream_fraction must be in (0, 1], got {stream_fraction}")
        if "learned" not in self.drafters:
            return False
        self._stream_fraction = float(stream_fraction)
        if getattr(self, "_sender", None) is not None:  # re-pointed after a replica restart
            self._sender.close()
        self._sender = HiddenStateSender(address, hwm=1024, token=token)
        self._pending_hidden: dict[str, list] = {}  # request id -> its parts so far (streamed requests only)
        self.hidden_sink = self._collect_hidden
        self.engine = self._new_engine(self.drafters, self.engine.selector)
        return True

    hidden_sink = None
    _stream_fraction = 1.0

    def _streams(self, request_id: str) -> bool:
        """The engine's ``hidden_filter``: whether this request's hidden states are streamed."""
        return streams_hidden(request_id, self._stream_fraction)

    def _collect_hidden(self, request_id: str, positions: list[int], tokens: list[int], hidden) -> None:
        self._pending_hidden.setdefault(request_id, []).append((positions, tokens, hidden))

    def _flush_hidden(self, out) -> None:
        parts = self._pending_hidden.pop(out.request_id, None) if self.hidden_sink else None
        if not parts:
            return
        pos = torch.tensor([p for ps, _, _ in parts for p in ps], dtype=torch.long)
        tok = torch.tensor([t for _, ts, _ in parts for t in ts], dtype=torch.long)
        hid = torch.cat([h for _, _, h in parts])
        self._sender.send(Frame(self.policy_version, out.request_id, pos, hid, tok))

    def load_drafter(self, state: dict, version: int) -> int:
        """Install a newer learned-drafter head (between rollout phases, never mid-request)."""
        d = self.drafters.get("learned")
        if d is None:
            raise ValueError(f"worker {self.worker_id} has no learned drafter")
        own = d.model.state_dict()
        bad = sorted(set(own) ^ set(state)) or [
            k
            for k, v in own.items()
            if not isinstance(state[k], torch.Tensor)
            or state[k].shape != v.shape
            or state[k].dtype != v.dtype
        ]
        if bad:  # checked before loading: a half-loaded head would be worse than the old one
            raise ValueError(f"worker {self.worker_id}: drafter state does not match the head: {bad[:3]}")
        d.model.load_state_dict(state)
        self.drafter_version = version
        return version

    def _replay_drafters(self) -> dict:
        """Drafters for a replay, starting from the pre-rollout snapshot of the history-based ones."""
        out: dict = {}
        for name, d in self.drafters.items():
            if name in ("learned", "hybrid"):
                continue
            fresh = type(d)()
            if self._pre_rollout_state is not None:
                fresh.load_state_dict(copy.deepcopy(self._pre_rollout_state[name]))
            out[name] = fresh
        if "learned" in self.drafters:
            out["learned"] = self.drafters["learned"]
            if "hybrid" in self.drafters and "suffix" in out:
                h = self.drafters["hybrid"]
                out["hybrid"] = HybridDrafter(
                    out["suffix"], out["learned"], h.threshold, forward_events=False
                )
        return out

    def load_weights(self, state: dict[str, torch.Tensor], version: int) -> int:
        """Install new policy weights (between rollout phases). Returns the installed version."""
        with torch.no_grad():
            missing, unexpected = self.model.load_state_dict(state, strict=False)
        if unexpected or [m for m in missing if m != "lm_head.weight"]:
            raise ValueError(
                f"worker {self.worker_id}: weight mismatch missing={missing[:3]} unexpected={unexpected[:3]}"
            )
        self.engine.forget_prompts()  # held prompt KV and logits are the old policy's
        self.policy_version = version
        return version

    def _requests(self, requests: list[RolloutRequest], seed_offset: int = 0) -> list[GenerationRequest]:
        p = self.sampling
        params = dict(
            temperature=p["temperature"],
            top_p=p["top_p"],
            top_k=p["top_k"],
            max_new_tokens=p["max_new_tokens"],
        )
        return [
            GenerationRequest(
                r.request_id, r.prompt_ids, SamplingParams(**params, seed=r.seed + seed_offset), r.problem_id
            )
            for r in requests
        ]

    def rollout(
        self, requests: list[RolloutRequest], step: int = 0, keep_drafter_snapshot: bool = False
    ) -> ShardResult:
        """Decode every request to completion (continuous batching).

        ``keep_drafter_snapshot`` keeps a copy of the drafters' state from before this rollout, so that
        ``measure_speedup`` can replay a sample with the knowledge the live rollout started from.
        """
        self._join_history()
        for d in self.drafters.values():
            d.new_step(step)
        self._pre_rollout_state = (
            {
                n: copy.deepcopy(d.state_dict())
                for n, d in self.drafters.items()
                if n not in ("learned", "hybrid")
            }
            if keep_drafter_snapshot
            else None
        )
        with self._busy:
            self._apply_pending()
            self._in_rollout, self.rl_step = True, step
            # Freeze the GC's generations over the decode loop: what exists now (the drafters' history, up to
            # 65k tokens of suffix-trie nodes, the model, the tables) is skipped by the collections the decode
            # loop's allocations set off; a full collection walking the history is a 30-370 ms stall inside
            # one decode step (measured in the long-tail benchmark's lock step, `238409b`). Unfrozen after,
            # so history that is later replaced can be collected. vLLM freezes after start-up likewise.
            gc.freeze()
            try:
                reqs = self._requests(requests)
                self.engine.step_log = [] if self._metrics is None else _LiveStepLog(self._set_batch_size)
                started = time.time()
                outs = self.engine.generate(reqs, on_finish=self._flush_hidden) if reqs else []
                finished = time.time()
            finally:
                gc.unfreeze()
                self._in_rollout = False
                self._set_batch_size(0)
            if self.tuned is not None:
                self.tuned.record_lengths([(o.problem_id, len(o.token_ids)) for o in outs])
            steps = list(self.engine.step_log)
            c = self.counters
            c["finished_requests"] += len(outs)
            c["generated_tokens"] += sum(len(o.token_ids) for o in outs)
            c["drafted_tokens"] += sum(s.drafted for s in steps)
            c["accepted_tokens"] += sum(s.accepted for s in steps)
            choices, by_bucket, reported = self._report_observations()
        self._index_history_async()
        return ShardResult(
            self.worker_id, self.policy_version, started, finished, outs, steps, choices, by_bucket, reported
        )

    def measure_speedup(self, requests: list[RolloutRequest], repeats: int = 1) -> dict:
        """Replay ``requests`` with speculation off and with this worker's strategy, same seeds, side by side.

        Drafters start from their pre-rollout snapshot (``rollout(..., keep_drafter_snapshot=True)``), and the
        replay uses fresh seeds so it never sees its own earlier outputs. Returns both modes' seconds and tokens,
        ``speedup`` (plain / spec seconds), ``long_tail`` (``stats.long_tail_totals``) and ``long_tail_speedup``."""
        if self.strategy.is_off and self.tuned is None:
            return {}
        with self._busy:
            return self._measure_speedup(requests, repeats)

    def _measure_speedup(self, requests: list[RolloutRequest], repeats: int) -> dict:
        out = {"plain_seconds": 0.0, "spec_seconds": 0.0, "plain_tokens": 0, "spec_tokens": 0, "requests": 0}
        spec_outs, tail_logs = [], []  # speculative outputs; (plain, spec) step logs per repeat
        for rep in range(repeats):
            reqs = self._requests(requests, seed_offset=1_000_000 * (rep + 1))
            drafters = self._replay_drafters()
            logs = {}
            for mode in ("plain", "spec") if rep % 2 == 0 else ("spec", "plain"):
                selector = self._replay_selector() if mode == "spec" else FixedStrategy(Strategy())
                eng = self._new_engine(drafters if mode == "spec" else {}, selector, stream=False)
                t0 = time.perf_counter()
                outs = eng.generate(reqs)
                out[f"{mode}_seconds"] += time.perf_counter() - t0
                out[f"{mode}_tokens"] += sum(len(o.token_ids) for o in outs)
                logs[mode] = eng.step_log
                if mode == "spec":
                    spec_outs += outs
            tail_logs.append((logs["plain"], logs["spec"]))
            out["requests"] += len(reqs)
        out["speedup"] = out["plain_seconds"] / max(out["spec_seconds"], 1e-9)
        out["long_tail"] = long_tail_totals(tail_logs)
        out["long_tail_speedup"] = out["long_tail"]["speedup"]
        out["tau"] = aggregate(spec_outs)["acceptance_length_mean"]
        return out

    def evaluate(self, requests: list[RolloutRequest], temperature: float, max_new_tokens: int) -> list:
        """Decode ``requests`` at ``temperature`` (0 = greedy) with speculation off, for held-out evaluation:
        the drafters' history, the tuner and the counters never see them. Returns the outputs in order."""
        with self._busy:
            self._apply_pending()
            p = dict(temperature=temperature, top_p=self.sampling["top_p"], top_k=self.sampling["top_k"])
            reqs = [
                GenerationRequest(
                    r.request_id,
                    r.prompt_ids,
                    SamplingParams(**p, max_new_tokens=max_new_tokens, seed=r.seed),
                    r.problem_id,
                )
                for r in requests
            ]
            return self._new_engine({}, FixedStrategy(Strategy())).generate(reqs) if reqs else []

    def ping(self) -> int:
        return self.worker_id
