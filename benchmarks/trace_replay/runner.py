"""Replay one shape's workload at one max batch size under every configuration, on one engine.

``ReplayBench`` holds a single ``Engine`` (one KV cache, one CUDA-graph pool on CUDA) and switches its
``selector`` and ``drafters`` between runs, so every configuration decodes on the same memory and, on CUDA,
replays graphs captured once (a capture's seconds are taken out of the step that paid them).

Configurations: ``plain`` (speculation off), ``plain-again`` (a second plain run: the A/A control), each fixed
deterministic arm of ``FIXED_ARMS`` (suffix chains k4/k8/k16/k32, suffix trees k16 w2 d8 and k24 w3 d8, n-gram
k3/k5), and ``adaptive`` (the tuner: ``StrategySelector`` over a
``TunerService`` table of the shipped arms whose drafters are replayable, with length-aware budgets), warm
(``ReplayBench.warm``): before the measured runs it decodes the measured problems' history epoch and, with their
history epoch in the drafter, the measured epoch of other problems of the trace file, and its observations are
merged into the tuner after every run, measured runs included (the table persists across RL steps in a real
run). With ``warm_ups`` > 1, ``adaptive-2``, ``adaptive-3``, ...: as many tuners warmed up the same way, each
on its own (selector seed ``seed + k``), measured side by side: what the warm-up decides (a table's best arm in
the buckets that few steps reach) varies from one warm-up to the next, and one warm-up is one draw of it. The
learned drafter and ``hybrid`` are left out: their drafts are sampled at temperature > 0, which trace replay
cannot verify (the engine raises).

Every run starts from the same drafter state: the suffix drafter holds the history epoch's responses (their
problem and global tries), the n-gram drafter nothing; within a run they learn online (a request's own tokens,
its siblings as they finish).
"""

from __future__ import annotations

import copy
import gc
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from benchmarks.side_by_side import decode_side_by_side
from benchmarks.trace_replay.workload import (
    HISTORY_EPOCH,
    MEASURED_EPOCH,
    TraceProblem,
    max_seq_len,
    requests,
)
from services.common.metrics import bucket_label
from services.rollout_actor.drafters import build_drafters
from services.rollout_actor.engine import Engine, GenerationRequest, RequestOutput
from services.rollout_actor.model import Transformer
from services.rollout_actor.requests import StepRecord
from services.rollout_actor.speculative.stats import long_tail_tokens, tail_seconds
from services.rollout_actor.speculative.strategy import FixedStrategy, Strategy
from services.tuner.bandit import BanditConfig, bucket_index, gate_table

PLAIN, PLAIN_AGAIN, ADAPTIVE = "plain", "plain-again", "adaptive"


def adaptive_name(k: int) -> str:
    """The configuration of the ``k``-th warmed-up tuner (from 0): ``adaptive``, ``adaptive-2``, ..."""
    return ADAPTIVE if k == 0 else f"{ADAPTIVE}-{k + 1}"


def adaptive_index(config: str) -> int | None:
    """``k`` for ``adaptive_name(k)``, None for another configuration."""
    if config == ADAPTIVE:
        return 0
    head, _, k = config.rpartition("-")
    return int(k) - 1 if head == ADAPTIVE and k.isdigit() and int(k) >= 2 else None


# The fixed deterministic arms replayed: suffix chains of the shipped lengths (services/tuner/arms.py), two
# suffix trees and n-gram chains.
FIXED_ARMS: dict[str, Strategy] = {
    "suffix-k4": Strategy("suffix", 4),
    "suffix-k8": Strategy("suffix", 8),
    "suffix-k16": Strategy("suffix", 16),
    "suffix-k32": Strategy("suffix", 32),
    "suffix-tree-k16w2d8": Strategy("suffix", 16, 2, 8),
    "suffix-tree-k24w3d8": Strategy("suffix", 24, 3, 8),
    "ngram-k3": Strategy("ngram", 3),
    "ngram-k5": Strategy("ngram", 5),
}
DRAFTERS = ("suffix", "ngram")
BATCH_EDGES = tuple(BanditConfig().bucket_edges)  # ``ReplayRun.by_batch``: the tuner's buckets
NOT_REPLAYABLE = {
    "learned / hybrid arms": "sampled drafts (the EAGLE drafter at temperature > 0) cannot be verified against "
    "a trace (the engine raises ValueError), so trace replay leaves them out"
}


def all_configs(fixed: Sequence[str] | None = None, warm_ups: int = 1) -> list[str]:
    """``plain``, ``plain-again``, the fixed arms (default: all of ``FIXED_ARMS``), ``adaptive`` (and
    ``adaptive-2`` .. ``adaptive-<warm_ups>``). Raises ``ValueError`` for an unknown arm or ``warm_ups`` < 1."""
    if warm_ups < 1:
        raise ValueError(f"warm_ups must be >= 1, got {warm_ups}")
    fixed = list(FIXED_ARMS) if fixed is None else list(fixed)
    bad = [a for a in fixed if a not in FIXED_ARMS]
    if bad:
        raise ValueError(f"unknown fixed arm(s) {bad}; known: {', '.join(FIXED_ARMS)}")
    return [PLAIN, PLAIN_AGAIN, *fixed, *(adaptive_name(k) for k in range(warm_ups))]


@dataclass
class ReplayRun:
    """One rollout of the measured epoch under one configuration. Seconds are wall time (``cpu_s``: this
    process's CPU time). ``longtail_s``: the seconds this run took for the rollout's last ``longtail_tokens``
    tokens, the tokens plain decoding commits with at most ``longtail_batch`` requests active
    (``stats.long_tail_speedup``). ``phase_*``: this run's own decode steps with at most ``longtail_batch``
    active requests (what a step there costs)."""

    config: str
    batch: int
    rep: int
    makespan_s: float
    cpu_s: float
    longtail_s: float
    longtail_cpu_s: float
    longtail_tokens: int
    steps: int
    tokens: int
    drafted: int
    accepted: int
    verify_steps: int
    accepted_by_position: list[int]
    drafted_by_position: list[int]
    exact: int  # outputs equal to their trace followed by EOS
    requests: int
    capture_s: float = 0.0
    strategies: dict[str, int] = field(default_factory=dict)
    phase_steps: int = 0
    phase_s: float = 0.0
    phase_draft_s: float = 0.0  # of ``phase_s``: proposing drafts (the selector's choice included)
    phase_forward_s: float = 0.0  # of ``phase_s``: the target forward (``StepRecord.forward_seconds``)
    # with CUDA graphs: forwards that ran eagerly (keys the graph memory budget refused, or without a bucket)
    eager_forwards: int | None = None
    # per active-batch-size bucket (``by_batch``): [steps, committed tokens, seconds, {strategy: steps}]
    by_batch: dict[str, list] = field(default_factory=dict)

    @property
    def tau(self) -> float | None:
        """Committed tokens per verify step of the drafted steps: ``1 + accepted / verify_steps``."""
        return 1 + self.accepted / self.verify_steps if self.verify_steps else None

    def to_dict(self) -> dict:
        return {**asdict(self), "tau": self.tau}


def batch_label(i: int, edges: Sequence[int] = BATCH_EDGES) -> str:
    """Bucket ``i``'s label: the metrics' ``bucket_label`` (``"2-3"``, ``"256+"``), ``"lo"`` for one size."""
    hi = edges[i + 1] if i + 1 < len(edges) else None
    return str(edges[i]) if hi == edges[i] + 1 else bucket_label(edges[i], hi)


def by_batch(steps: Sequence[StepRecord]) -> dict[str, list]:
    """Decode steps pooled by active batch size bucket (the tuner's default buckets), smallest first:
    label -> [steps, committed tokens, seconds without graph captures, {strategy: steps}]."""
    rows: dict[int, list] = {}
    for s in steps:
        row = rows.setdefault(bucket_index(BATCH_EDGES, s.batch_size), [0, 0, 0.0, {}])
        row[0] += 1
        row[1] += s.committed
        row[2] += s.seconds - s.capture_seconds
        row[3][s.strategy] = row[3].get(s.strategy, 0) + 1
    return {batch_label(i): rows[i] for i in sorted(rows)}


def replay_exact(out: RequestOutput, req: GenerationRequest, eos_ids: set[int]) -> bool:
    """Whether ``out`` is exactly ``req.reference`` followed by one EOS id (finish reason ``eos``)."""
    ref = list(req.reference or [])
    return (
        out.finish_reason == "eos"
        and out.token_ids[:-1] == ref
        and bool(out.token_ids)
        and out.token_ids[-1] in eos_ids
    )


def _sum_positions(outs: Sequence[RequestOutput], attr: str) -> list[int]:
    total: list[int] = []
    for o in outs:
        xs = getattr(o.spec, attr)
        total += [0] * (len(xs) - len(total))
        for i, x in enumerate(xs):
            total[i] += x
    return total


class ReplayBench:
    """One model shape at one max batch size (``Engine.max_batch_size``: continuous batching).

    Args:
        model: the target (``services.rollout_actor.shapes.build_model``).
        problems: the tokenized workload (``workload.tokenize``).
        batch: max batch size (KV slots).
        longtail_batch: a decode step with at most this many active requests is in the long-tail phase.
        seed: the adaptive policy's seed.
        warm_problems: other problems, for the adaptive policy's warm-up (``warm``).
    """

    def __init__(
        self,
        model: Transformer,
        problems: Sequence[TraceProblem],
        batch: int,
        longtail_batch: int = 8,
        seed: int = 0,
        warm_problems: Sequence[TraceProblem] = (),
    ):
        self.problems = list(problems)
        self.warm_problems = list(warm_problems)
        self.batch = batch
        self.longtail_batch = longtail_batch
        self.seed = seed
        self.engine = Engine(
            model,
            max_batch_size=batch,
            max_seq_len=max_seq_len(self.problems + self.warm_problems),
            cpu_clock=True,
        )
        self.suffix_state: dict | None = None
        self.tail_tokens: int | None = None  # plain's long-tail tokens (``ReplayRun.longtail_tokens``)
        self.history_lengths: list[tuple[str, int]] = []
        self.tuners: list = []  # per warm-up: its ``TunerService`` and ``StrategySelector`` (``warm``)
        self.adaptives: list = []

    # ------------------------------------------------------------------ drafters and the adaptive policy
    def drafters(self) -> dict:
        """Fresh drafters in the history snapshot's state (empty before ``warm``)."""
        ds = build_drafters(names=DRAFTERS)
        if self.suffix_state is not None:
            ds["suffix"].load_state_dict(copy.deepcopy(self.suffix_state))
            ds["suffix"].new_step(1)  # the history is the previous RL step's
        return ds

    def _learn(self, k: int = 0) -> int:
        """Merge warm-up ``k``'s selector's observations into its tuner and install the new table."""
        obs = self.adaptives[k].drain_observations()
        self.adaptives[k].update_table(gate_table(self.tuners[k].merge(obs), []))
        return len(obs)

    def warm(self, passes: int = 1, decode_history: bool = True, warm_ups: int = 1) -> dict:
        """Warm ``warm_ups`` adaptive policies up (``_warm_one``), each on its own tuner. Returns what the first
        did, with the seconds of all."""
        t0 = time.perf_counter()
        self.tuners, self.adaptives = [], []
        done = [self._warm_one(k, passes, decode_history) for k in range(warm_ups)]
        return done[0] | {"warm_ups": warm_ups, "seconds": time.perf_counter() - t0}

    def _warm_one(self, k: int, passes: int, decode_history: bool) -> dict:
        """Warm the ``k``-th adaptive policy up as a long run would have, and (the first) record the drafters'
        history.

        1. the measured problems' history epoch (from fresh drafters: the RL step before the measured one); the
           suffix drafter's state after the first warm-up's (those responses in its problem and global tries) and
           the responses' lengths (the length classes) are what every measured run starts from. With
           ``decode_history=False`` the epoch is not decoded: its responses (trace + EOS, what an exact replay
           emits) go into the suffix drafter as ``finish_request`` would put them (``add_history``), and the
           tuner learns from the warm-up problems alone (a history epoch holding one 6k-token response costs
           minutes at 7B shapes);
        2. ``passes`` times, on the ``warm_problems`` (other than the measured ones; may be none): their
           history epoch into fresh drafters from the trace (``add_history``, not decoded), then their measured
           epoch decoded, drafting with that history, as every RL step after the first does in a long run (the
           measured runs draft with one).

        Every rollout runs under the adaptive policy, its observations merged into the tuner after it. Every
        warm-up replays the same tokens: the history the first leaves is every warm-up's. Returns what it did,
        with seconds."""
        from services.tuner.selector import StrategySelector
        from services.tuner.service import TunerService

        self.tuners.append(TunerService(available_drafters=DRAFTERS))
        self.adaptives.append(StrategySelector(self.tuners[k].table(), seed=self.seed + k))
        policy = self.adaptives[k]
        t0 = time.perf_counter()
        ds = build_drafters(names=DRAFTERS)
        reqs = requests(self.problems, HISTORY_EPOCH)
        if decode_history:
            history = self._generate(reqs, ds, policy)[0]
            self._learn(k)
            exact = sum(replay_exact(o, r, self.engine.eos) for o, r in zip(history, reqs))
            lengths = [(o.problem_id, len(o.token_ids)) for o in history]
        else:
            exact = None
            lengths = self._history_from_trace(ds, reqs)
        if k == 0:
            self.suffix_state, self.history_lengths = ds["suffix"].state_dict(), lengths
        policy.record_lengths(self.history_lengths)
        warm_problems, warm_reqs = self.warm_problems, 0
        for _ in range(max(1, passes) if warm_problems else 0):
            ds = build_drafters(names=DRAFTERS)
            policy.record_lengths(self._history_from_trace(ds, requests(warm_problems, HISTORY_EPOCH)))
            ds["suffix"].new_step(HISTORY_EPOCH + 1)
            wreqs = requests(warm_problems, MEASURED_EPOCH)
            outs = self._generate(wreqs, ds, policy)[0]
            policy.record_lengths([(o.problem_id, len(o.token_ids)) for o in outs])
            self._learn(k)
            ds["suffix"].new_step(MEASURED_EPOCH + 1)
            warm_reqs += len(wreqs)
        policy.drain_choices()
        return {
            "passes": max(1, passes) if warm_problems else 0,
            "warm_problems": len(warm_problems),
            "warm_requests": warm_reqs,
            "history_requests": len(reqs),
            "history_decoded": decode_history,
            "exact": exact,
            "seconds": time.perf_counter() - t0,
        }

    def _history_from_trace(self, drafters: dict, reqs: list[GenerationRequest]) -> list[tuple[str, int]]:
        """Put ``reqs``' responses (trace + EOS, what an exact replay emits) into the suffix drafter as
        ``finish_request`` would (``add_history``), without decoding them. Returns ``(problem_id, length)``."""
        for r in reqs:
            drafters["suffix"].add_history(r.problem_id, r.prompt_ids, [*r.reference, self.engine.replay_eos])
        return [(r.problem_id, len(r.reference) + 1) for r in reqs]

    # ------------------------------------------------------------------ runs
    def _generate(self, reqs, drafters, selector) -> tuple[list[RequestOutput], float, float, list]:
        eng = self.engine
        eng.drafters = dict(drafters)
        eng.selector = selector
        n0 = len(eng.step_log)
        gc.collect()
        gc.freeze()  # as the rollout worker does: a full collection would walk the drafters' history in a step
        try:
            c0, t0 = time.process_time(), time.perf_counter()
            outs = eng.generate(reqs)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        finally:
            gc.unfreeze()
        steps = eng.step_log[n0:]
        del eng.step_log[:]  # the log of a finished run is not kept (memory)
        return outs, wall, cpu, steps

    def _eager_forwards(self) -> int | None:
        """The engine's graph pool's eager forwards so far (``GraphPoolStats``); None without graphs."""
        g = self.engine.graphed
        return None if g is None else g.pool.stats.fallbacks + g.pool.stats.unbucketed

    def _setup(self, config: str) -> tuple[dict, object]:
        """The drafters and selector of ``config``. Raises ``ValueError`` for an unknown configuration,
        ``RuntimeError`` for ``adaptive`` before ``warm``."""
        if config in (PLAIN, PLAIN_AGAIN):
            return {}, FixedStrategy()
        if (k := adaptive_index(config)) is not None:
            if k >= len(self.adaptives):
                raise RuntimeError(f"ReplayBench.run({config!r}) needs warm(warm_ups={k + 1}) first")
            return self.drafters(), self.adaptives[k]
        if config in FIXED_ARMS:
            strat = FIXED_ARMS[config]
            return {strat.drafter: self.drafters()[strat.drafter]}, FixedStrategy(strat)
        raise ValueError(f"unknown configuration {config!r}")

    def run(self, config: str, rep: int) -> ReplayRun:
        """One rollout of the measured epoch under ``config`` (``all_configs``), alone on the machine. Raises
        ``ValueError`` for an unknown configuration, ``RuntimeError`` when ``adaptive`` runs before ``warm``."""
        drafters, selector = self._setup(config)
        reqs = requests(self.problems, MEASURED_EPOCH)
        self._untimed_plain_tail(reqs, [config])
        eager0 = self._eager_forwards()
        outs, wall, cpu, steps = self._generate(reqs, drafters, selector)
        eager = None if eager0 is None else self._eager_forwards() - eager0
        if self.tail_tokens is None:
            self.tail_tokens = long_tail_tokens(steps, self.longtail_batch)
        return self._result(config, rep, reqs, outs, wall, cpu, steps, eager)

    def _untimed_plain_tail(self, reqs: list[GenerationRequest], configs: Sequence[str]) -> None:
        """N, the long tail's tokens, is plain decoding's: its schedule is the trace's, the same in every plain
        run, so the first plain run gives it; when ``configs`` has none and N is still unknown, an untimed plain
        run of ``reqs`` gives it now."""
        if self.tail_tokens is None and not any(c in (PLAIN, PLAIN_AGAIN) for c in configs):
            steps = self._generate(reqs, {}, FixedStrategy())[3]
            self.tail_tokens = long_tail_tokens(steps, self.longtail_batch)

    def run_lockstep(self, configs: Sequence[str], rep: int) -> list[ReplayRun]:
        """One rollout of the measured epoch under each of ``configs`` (distinct), in lock step
        (``benchmarks.side_by_side``: every configuration charged its own steps' seconds, all in the same
        moments), the round's order seeded by ``seed`` and ``rep``. One engine per configuration, on this bench's
        model: CPU only (on CUDA ``run``: one engine and graph pool). Raises ``ValueError`` for repeated or
        unknown configurations, ``RuntimeError`` for ``adaptive`` before ``warm``."""
        if len(set(configs)) != len(configs):
            raise ValueError(f"lock-step configurations must be distinct: {list(configs)}")
        rng = random.Random(self.seed * 1_000_003 + rep)
        engines = {}
        for c in configs:
            drafters, selector = self._setup(c)
            engines[c] = Engine(
                self.engine.model,
                max_batch_size=self.batch,
                max_seq_len=self.engine.max_seq_len,
                drafters=drafters,
                selector=selector,
                cpu_clock=True,
            )
        reqs = requests(self.problems, MEASURED_EPOCH)
        self._untimed_plain_tail(reqs, configs)
        outs, wall, cpu = decode_side_by_side(engines, dict.fromkeys(configs, reqs), rng)
        if self.tail_tokens is None:
            plain = next(c for c in configs if c in (PLAIN, PLAIN_AGAIN))
            self.tail_tokens = long_tail_tokens(engines[plain].step_log, self.longtail_batch)
        return [
            self._result(c, rep, reqs, outs[c], wall[c], cpu[c], engines[c].step_log, None) for c in configs
        ]

    def _result(self, config, rep, reqs, outs, wall, cpu, steps, eager) -> ReplayRun:
        """``config``'s ``ReplayRun`` from its outputs, seconds and step log (the adaptive policy's choices are
        drained and its observations merged into the tuner)."""
        n = self.tail_tokens
        capture = sum(s.capture_seconds for s in steps)
        tail = [s for s in steps if s.batch_size <= self.longtail_batch]
        res = ReplayRun(
            config=config,
            batch=self.batch,
            rep=rep,
            makespan_s=wall - capture,
            cpu_s=cpu,
            longtail_s=tail_seconds(steps, n),
            longtail_cpu_s=tail_seconds(steps, n, cpu=True),
            longtail_tokens=n,
            steps=len(steps),
            tokens=sum(len(o.token_ids) for o in outs),
            drafted=sum(o.spec.drafted for o in outs),
            accepted=sum(o.spec.accepted for o in outs),
            verify_steps=sum(o.spec.verify_steps for o in outs),
            accepted_by_position=_sum_positions(outs, "accepted_by_position"),
            drafted_by_position=_sum_positions(outs, "drafted_by_position"),
            exact=sum(replay_exact(o, r, self.engine.eos) for o, r in zip(outs, reqs)),
            requests=len(reqs),
            capture_s=capture,
            phase_steps=len(tail),
            phase_s=sum(s.seconds - s.capture_seconds for s in tail),
            phase_draft_s=sum(s.draft_seconds for s in tail),
            phase_forward_s=sum(s.forward_seconds for s in tail),
            eager_forwards=eager,
            by_batch=by_batch(steps),
        )
        if (k := adaptive_index(config)) is not None:
            res.strategies = self.adaptives[k].drain_choices()
            self._learn(k)
        return res

    def tuner_snapshot(self) -> list[dict]:
        """The (first) adaptive policy's table as the JSON keeps it: per bucket of active batch size its best arm
        and each arm's throughput in the table's window (tokens/s over its records, the record count). Empty
        before ``warm``."""
        if not self.adaptives:
            return []
        out = []
        for row in self.adaptives[0].table["buckets"]:
            rates = {
                arm: [w[1] / w[2] if w[2] > 0 else None, int(w[0])]
                for arm, w in row.get("windows", {}).items()
            }
            out.append({"lo": row["lo"], "hi": row["hi"], "best": row["best"], "rates": rates})
        return out

    def outputs(self, config: str) -> tuple[list[GenerationRequest], list[RequestOutput]]:
        """The measured epoch's requests and outputs under ``config`` (a fixed arm or plain), untimed: for
        checking replay against the trace."""
        drafters, selector = self._setup(config)
        reqs = requests(self.problems, MEASURED_EPOCH)
        return reqs, self._generate(reqs, drafters, selector)[0]
