"""RolloutWorker: one rollout actor's state, plain Python (the Ray actor in ``actor.py`` only wraps it).

It owns a copy of the policy (``Transformer``), the tokenizer and a decoding ``Engine``; it decodes the shard
of requests the driver assigns it and returns finished responses with per-request timings and the worker's
own start/finish times (the driver derives the long tail and the bubbles from them). New policy weights
arrive versioned (``load_weights``) between rollout phases, never during one.
"""

from __future__ import annotations

import copy
import os
import time
from dataclasses import asdict, dataclass

import torch

from services.rollout_actor.engine import Engine, GenerationRequest, RequestOutput, SamplingParams, StepRecord
from services.rollout_actor.model import Transformer
from services.rollout_actor.speculative.base import Drafter
from services.rollout_actor.speculative.strategy import FixedPolicy, Strategy, StrategyPolicy


def build_drafters(
    target: Transformer | None = None,
    names: list[str] | tuple[str, ...] = ("suffix", "ngram"),
    learned: dict | None = None,
) -> dict[str, Drafter]:
    """Drafters by name: ``suffix``, ``ngram``, and with ``learned`` (and a target) ``learned`` + ``hybrid``.

    ``learned``: {checkpoint: EAGLE folder or None (a fresh, seeded draft head), eagle3: bool, seed: int,
    hybrid_threshold: float}. ``hybrid`` shares the ``suffix`` and ``learned`` instances (no duplicate history).
    """
    from services.rollout_actor.speculative.ngram import NgramDrafter
    from services.rollout_actor.speculative.suffix_tree import SuffixTreeDrafter

    make = {"suffix": SuffixTreeDrafter, "ngram": NgramDrafter}
    unknown = [n for n in names if n not in make]
    if unknown:
        raise ValueError(f"unknown drafter(s) {unknown}; known: {sorted(make)}")
    out: dict[str, Drafter] = {n: make[n]() for n in names}
    if learned is not None and target is not None:
        from services.rollout_actor.speculative.eagle import EagleConfig, EagleDrafter, default_fuse_layers
        from services.rollout_actor.speculative.hybrid import HybridDrafter

        if learned.get("checkpoint"):
            eagle = EagleDrafter.from_pretrained(learned["checkpoint"], target)
        else:
            fuse = default_fuse_layers(target.config.num_hidden_layers) if learned.get("eagle3") else None
            eagle = EagleDrafter(
                target, config=EagleConfig(fuse_layers=fuse, seed=int(learned.get("seed", 0)))
            )
        out["learned"] = eagle
        if "suffix" in out:
            out["hybrid"] = HybridDrafter(
                out["suffix"], eagle, float(learned.get("hybrid_threshold", 1.0)), forward_events=False
            )
    return out


def strategy_from_config(spec: dict | None) -> Strategy:
    """``rollout.speculative`` (enabled, drafter, max_draft_tokens, tree_width, tree_depth) -> Strategy."""
    if not spec or not spec.get("enabled") or spec.get("drafter", "off") == "off":
        return Strategy()
    return Strategy(
        spec["drafter"],
        int(spec["max_draft_tokens"]),
        int(spec.get("tree_width", 1)),
        int(spec.get("tree_depth", 0)),
    )


@dataclass
class RolloutRequest:
    """A request as the driver sends it (plain data, picklable)."""

    request_id: str
    problem_id: str
    prompt_ids: list[int]
    seed: int


@dataclass
class ShardResult:
    worker: int
    policy_version: int
    started_at: float  # wall clock (time.time()) when decoding started
    finished_at: float  # wall clock when the worker's last request finished
    outputs: list[RequestOutput]
    steps: list[StepRecord]

    def to_dict(self) -> dict:
        return asdict(self)


class RolloutWorker:
    """Decodes shards of requests with one engine.

    Args:
        worker_id: index of this worker in the pool.
        model_path: HF folder of the initial policy.
        sampling: temperature / top_p / top_k / max_new_tokens used for every request.
        max_batch_size: KV slots.
        threads: torch intra-op threads for this worker.
        policy: speculation strategy policy (default off).
        drafters: name -> Drafter.
    """

    def __init__(
        self,
        worker_id: int,
        model_path: str,
        sampling: dict,
        max_batch_size: int = 64,
        threads: int = 1,
        policy: StrategyPolicy | None = None,
        drafters: dict | None = None,
        max_seq_len: int | None = None,
        speculative: dict | None = None,
        tuner_table: dict | None = None,
        tuner_budgets: dict | None = None,
        learned: dict | None = None,
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
        self.drafters = drafters if drafters is not None else build_drafters(self.model, learned=learned)
        learned_drafter = self.drafters.get("learned")
        self.hidden_layers = tuple(getattr(learned_drafter, "required_hidden_layers", ()))
        self.drafter_version = 0
        self._pre_rollout_state: dict | None = None
        self.tuned = None
        if tuner_table is not None and policy is None:
            from services.tuner.budgets import BudgetConfig
            from services.tuner.policy import TunedStrategyPolicy

            self.tuned = TunedStrategyPolicy(
                tuner_table, BudgetConfig.from_dict(tuner_budgets or {}), seed=worker_id
            )
            policy = self.tuned
        self.engine = self._new_engine(self.drafters, policy or FixedPolicy(self.strategy))

    # ------------------------------------------------------------------ tuner (in-process table copy)
    def update_table(self, table: dict) -> int:
        """Install the central tuner's newer strategy table (between rollout phases)."""
        if self.tuned is not None:
            self.tuned.update_table(table)
        return int(table.get("version", 0))

    def drain_observations(self) -> dict:
        """This actor's per-step observations since the last drain (sent to the tuner in one batch)."""
        if self.tuned is None:
            return {"observations": [], "choices": {}}
        choices, self.tuned.choices = self.tuned.choices, {}
        return {"observations": self.tuned.drain_observations(), "choices": choices}

    def _replay_policy(self) -> StrategyPolicy:
        if self.tuned is None:
            return FixedPolicy(self.strategy)
        return copy.deepcopy(self.tuned)

    def _new_engine(self, drafters: dict, policy: StrategyPolicy) -> Engine:
        return Engine(
            self.model,
            max_batch_size=self.max_batch_size,
            max_seq_len=self.max_seq_len,
            tokenizer=self.tokenizer,
            drafters=drafters,
            policy=policy,
            hidden_layers=self.hidden_layers if "learned" in drafters else (),
            hidden_sink=self.hidden_sink if "learned" in drafters else None,
        )

    # ------------------------------------------------------------------ hidden states -> spot trainer
    def connect_spot_trainer(self, address: str) -> bool:
        """Stream committed tokens' hidden states (one frame per finished request) to the spot trainer."""
        if "learned" not in self.drafters:
            return False
        from services.spot_trainer.stream import HiddenStateSender

        self._sender = HiddenStateSender(address, hwm=1024)
        self._pending_hidden: dict[str, list] = {}
        self.hidden_sink = self._collect_hidden
        self.engine = self._new_engine(self.drafters, self.engine.policy)
        return True

    hidden_sink = None

    def _collect_hidden(self, request_id: str, positions: list[int], tokens: list[int], hidden) -> None:
        self._pending_hidden.setdefault(request_id, []).append((positions, tokens, hidden.clone()))

    def _flush_hidden(self, out) -> None:
        parts = self._pending_hidden.pop(out.request_id, None) if self.hidden_sink else None
        if not parts:
            return
        from services.spot_trainer.buffer import Frame

        pos = torch.tensor([p for ps, _, _ in parts for p in ps], dtype=torch.long)
        tok = torch.tensor([t for _, ts, _ in parts for t in ts], dtype=torch.long)
        hid = torch.cat([h for _, _, h in parts])
        self._sender.send(Frame(self.policy_version, out.request_id, pos, hid, tok))

    def load_drafter(self, state: dict, version: int) -> int:
        """Install a newer learned-drafter head (between rollout phases, never mid-request)."""
        d = self.drafters.get("learned")
        if d is None:
            raise ValueError(f"worker {self.worker_id} has no learned drafter")
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
            from services.rollout_actor.speculative.hybrid import HybridDrafter

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
        reqs = self._requests(requests)
        self.engine.step_log = []
        started = time.time()
        outs = self.engine.generate(reqs, on_finish=self._flush_hidden) if reqs else []
        finished = time.time()
        if self.tuned is not None:
            self.tuned.record_lengths([(o.problem_id, len(o.token_ids)) for o in outs])
        return ShardResult(
            self.worker_id, self.policy_version, started, finished, outs, list(self.engine.step_log)
        )

    def measure_speedup(self, requests: list[RolloutRequest], repeats: int = 1) -> dict:
        """Replay ``requests`` with speculation off and with this worker's strategy, same seeds, side by side.

        Drafters start from their pre-rollout snapshot (``rollout(..., keep_drafter_snapshot=True)``), and
        the replay uses fresh seeds so it never sees its own earlier outputs. Returns seconds and tokens
        of both, and ``speedup = plain_seconds / spec_seconds`` (a *replayed sample*, not the live rollout).
        """
        if self.strategy.is_off and self.tuned is None:
            return {}
        out = {"plain_seconds": 0.0, "spec_seconds": 0.0, "plain_tokens": 0, "spec_tokens": 0, "requests": 0}
        for rep in range(repeats):
            reqs = self._requests(requests, seed_offset=1_000_000 * (rep + 1))
            drafters = self._replay_drafters()
            for mode in ("plain", "spec") if rep % 2 == 0 else ("spec", "plain"):
                policy = self._replay_policy() if mode == "spec" else FixedPolicy(Strategy())
                eng = self._new_engine(drafters if mode == "spec" else {}, policy)
                t0 = time.perf_counter()
                outs = eng.generate(reqs)
                out[f"{mode}_seconds"] += time.perf_counter() - t0
                out[f"{mode}_tokens"] += sum(len(o.token_ids) for o in outs)
            out["requests"] += len(reqs)
        out["speedup"] = out["plain_seconds"] / max(out["spec_seconds"], 1e-9)
        return out

    def ping(self) -> int:
        return self.worker_id
