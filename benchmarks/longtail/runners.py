"""One rollout of a workload under one tailspec configuration, and what is measured of it (``RunResult``).

Configurations: ``plain`` (speculation off); the fixed arms (``FIXED_ARMS``, ``learned-k4`` with a learned
checkpoint); ``adaptive``: the tuner (``StrategySelector`` over a ``TunerService`` table) in its steady state:
after every rollout its observations are merged into the ``TunerService`` and the new table installed, as the
central tuner does across RL steps; ``adaptive-cold``: a fresh tuner every rollout (the first RL step).

Drafter state: every run starts from the same snapshot: the suffix drafter holds the responses of a previous
"RL step" (history prompts x G, decoded once with plain decoding) and then learns online within the run. The
adaptive policy's length history holds those responses' lengths. Nothing carries over between runs.
"""

from __future__ import annotations

import copy
import gc
import hashlib
import json
import math
import statistics
import time
from dataclasses import dataclass, field

from benchmarks.longtail.workload import (
    ADAPTIVE,
    ADAPTIVE_COLD,
    FIXED_ARMS,
    LEARNED_ARMS,
    LONGTAIL_BATCH,
    PLAIN,
    PLAIN_AGAIN,
    Workload,
)
from services.rollout_actor.drafters import build_drafters
from services.rollout_actor.engine import Engine, RequestOutput, StepRecord
from services.rollout_actor.model import Transformer
from services.rollout_actor.speculative.strategy import FixedStrategy
from services.tuner.bandit import gate_table


def pct(xs: list[float], q: float) -> float:
    """The q-quantile by rank (ceil(q n)-th smallest)."""
    s = sorted(xs)
    return s[max(0, min(len(s) - 1, math.ceil(q * len(s)) - 1))]


def token_digest(ids: list[int]) -> str:
    """Short hash of a response's token ids (compared across configurations of one repetition)."""
    return hashlib.blake2b(json.dumps(ids).encode(), digest_size=8).hexdigest()


@dataclass
class RunResult:
    config: str
    batch_size: int
    rep: int
    makespan_s: float
    cpu_s: float
    lengths: list[int]
    eos: list[bool]
    finish_s: list[float]
    longtail_phase_s: float | None = None
    longtail_tokens: int | None = None
    longtail_cpu_s: float | None = None
    drafted: int = 0
    accepted: int = 0
    verify_steps: int = 0
    timeline: list[tuple[float, int]] = field(default_factory=list)  # (t, active batch) per step
    strategies: dict[str, int] = field(default_factory=dict)
    note: str = ""
    digests: list[str] = field(default_factory=list)  # per request (workload order): hash of its token ids

    @property
    def tokens(self) -> int:
        return sum(self.lengths)

    def summary(self) -> dict:
        f = sorted(self.finish_s)
        n = len(self.lengths)

        def rate(tokens, seconds):
            return tokens / seconds if seconds and tokens is not None else None

        d = {
            "config": self.config,
            "batch_size": self.batch_size,
            "rep": self.rep,
            "makespan_s": self.makespan_s,
            "cpu_s": self.cpu_s,
            "tokens": self.tokens,
            "tokens_per_s": rate(self.tokens, self.makespan_s),
            "tail_s": (f[-1] - pct(f, 0.9)) if f else None,
            "longtail_phase_s": self.longtail_phase_s,
            "longtail_tokens": self.longtail_tokens,
            "longtail_cpu_s": self.longtail_cpu_s,
            "longtail_cpu_tokens_per_s": rate(self.longtail_tokens, self.longtail_cpu_s),
            "longtail_tokens_per_s": rate(self.longtail_tokens, self.longtail_phase_s),
            "tau": (self.accepted + self.verify_steps) / self.verify_steps if self.verify_steps else None,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "mean_length": statistics.fmean(self.lengths) if n else None,
            "p90_length": pct(self.lengths, 0.9) if n else None,
            "max_length": max(self.lengths) if n else None,
            "eos_fraction": sum(self.eos) / n if n else None,
            "requests": n,
        }
        if self.strategies:
            d["strategies"] = dict(sorted(self.strategies.items(), key=lambda kv: -kv[1]))
        if self.note:
            d["note"] = self.note
        return d


def result_of(
    config: str,
    b: int,
    rep: int,
    makespan: float,
    cpu: float,
    outs: list[RequestOutput],
    steps: list[StepRecord],
) -> RunResult:
    """A tailspec rollout's ``RunResult`` from its outputs and the engine's step log."""
    tail = [s for s in steps if s.batch_size <= LONGTAIL_BATCH]
    return RunResult(
        config=config,
        batch_size=b,
        rep=rep,
        makespan_s=makespan,
        cpu_s=cpu,
        lengths=[len(o.token_ids) for o in outs],
        eos=[o.finish_reason == "eos" for o in outs],
        finish_s=[o.timings.finish_s for o in outs],
        longtail_phase_s=sum(s.seconds for s in tail) if tail else None,
        longtail_tokens=sum(s.committed for s in tail) if tail else None,
        longtail_cpu_s=sum(s.cpu_seconds for s in tail) if tail else None,
        drafted=sum(o.spec.drafted for o in outs),
        accepted=sum(o.spec.accepted for o in outs),
        verify_steps=sum(o.spec.verify_steps for o in outs),
        timeline=[(s.t_start, s.batch_size) for s in steps],
        digests=[token_digest(o.token_ids) for o in outs],
    )


class TailspecRunner:
    """Runs one rollout of a workload with one configuration on the tailspec engine."""

    def __init__(self, model: Transformer, max_seq_len: int, learned_path=None):
        self.model = model
        self.max_seq_len = max_seq_len
        self.suffix_state: dict | None = None
        self.plain_samples: list[tuple[list[int], list[int]]] = []  # (prompt, output) of plain runs
        self.history_lengths: list[tuple[str, int]] = []
        self.learned = None
        self.learned_path = learned_path
        if learned_path is not None:
            from services.rollout_actor.speculative.eagle import EagleDrafter

            self.learned = EagleDrafter.from_pretrained(learned_path, model)
        self.drafter_names = ["suffix", "ngram"] + (["learned"] if self.learned is not None else [])
        self.gated: list[str] = []  # drafters kept out of the adaptive tables (learned_gate)
        self.seed = 0
        self.tuner = None
        self.adaptive = None

    def fresh_drafters(self, own_learned: bool = False) -> dict:
        """The drafters in the history snapshot's state (``own_learned``: a private copy of the learned one)."""
        ds = build_drafters(names=("suffix", "ngram"))
        if self.suffix_state is not None:
            ds["suffix"].load_state_dict(copy.deepcopy(self.suffix_state))
            ds["suffix"].new_step(1)  # the history is the previous RL step's
        if self.learned is not None:
            ds["learned"] = self.learned
            if own_learned:
                from services.rollout_actor.speculative.eagle import EagleDrafter

                ds["learned"] = EagleDrafter.from_pretrained(self.learned_path, self.model)
        return ds

    def build_history(self, workload: Workload, sampling: dict, seed: int) -> dict:
        """Decode the history prompts once (plain) and keep the suffix drafter's state and the lengths."""
        ds = build_drafters(names=("suffix",))
        eng = Engine(self.model, workload.batch_size, self.max_seq_len, drafters=ds, selector=FixedStrategy())
        t = time.perf_counter()
        outs = eng.generate(workload.requests(sampling, seed))
        self.suffix_state = ds["suffix"].state_dict()
        self.history_lengths = [(o.problem_id, len(o.token_ids)) for o in outs]
        lens = [len(o.token_ids) for o in outs]
        return {
            "prompts": len(workload.prompts),
            "responses": len(outs),
            "seconds": time.perf_counter() - t,
            "mean_length": statistics.fmean(lens) if lens else None,
            "eos_fraction": sum(o.finish_reason == "eos" for o in outs) / max(1, len(outs)),
        }

    def new_adaptive(self, seed: int):
        """A fresh tuner (nothing learned) and the rollout actor's policy over its table."""
        from services.tuner.selector import StrategySelector
        from services.tuner.service import TunerService

        tuner = TunerService(available_drafters=self.drafter_names)
        policy = StrategySelector(gate_table(tuner.table(), self.gated), seed=seed)
        if self.history_lengths:
            policy.record_lengths(self.history_lengths)
        return tuner, policy

    def init_adaptive(self, seed: int) -> None:
        self.seed = seed
        self.tuner, self.adaptive = self.new_adaptive(seed)

    def learn(self) -> int:
        """Merge the adaptive policy's drained observations into the tuner; install the new table."""
        obs = self.adaptive.drain_observations()
        self.adaptive.update_table(gate_table(self.tuner.merge(obs), self.gated))
        self.adaptive.drain_choices()
        return len(obs)

    def engine(self, config: str, workload: Workload, rep: int, own_learned: bool = False):
        """The engine and policy of one rollout of ``config`` (each decode step's CPU time recorded:
        ``Engine(cpu_clock=True)``). ``own_learned``: a private copy of the learned drafter (engines decoding
        side by side must not share its generator)."""
        plain = config in (PLAIN, PLAIN_AGAIN)
        drafters = {} if plain else self.fresh_drafters(own_learned)
        if plain:
            policy = FixedStrategy()
        elif config in (ADAPTIVE, ADAPTIVE_COLD):
            policy = self.adaptive if config == ADAPTIVE else self.new_adaptive(self.seed + 1 + rep)[1]
            # a gated drafter is not in the table: not attached, so the engine keeps no hidden states for it
            drafters = {n: d for n, d in drafters.items() if n not in self.gated}
        else:
            strat = {**FIXED_ARMS, **LEARNED_ARMS}[config]
            policy = FixedStrategy(strat)
            drafters = {strat.drafter: drafters[strat.drafter]}
        eng = Engine(
            self.model,
            max_batch_size=workload.batch_size,
            max_seq_len=self.max_seq_len,
            drafters=drafters,
            selector=policy,
            cpu_clock=True,
            hidden_layers=self.learned.required_hidden_layers if "learned" in drafters else (),
        )
        return eng, policy

    def finish(self, config, workload, rep, makespan, cpu, outs, eng, policy) -> RunResult:
        """The run's ``RunResult``; the adaptive policy's choices, and its lesson merged into the tuner."""
        res = result_of(config, workload.batch_size, rep, makespan, cpu, outs, eng.step_log)
        if config == ADAPTIVE:
            res.strategies = self.adaptive.drain_choices()
            self.learn()
        elif config == ADAPTIVE_COLD:
            res.strategies = policy.drain_choices()
        return res

    def run(self, config: str, workload: Workload, sampling: dict, seed: int, rep: int) -> RunResult:
        eng, policy = self.engine(config, workload, rep)
        reqs = workload.requests(sampling, seed)
        gc.collect()
        c0, t0 = time.process_time(), time.perf_counter()
        outs = eng.generate(reqs)
        makespan, cpu = time.perf_counter() - t0, time.process_time() - c0
        if config == PLAIN and len(self.plain_samples) < 256:
            self.plain_samples += [(o.prompt_ids, o.token_ids) for o in outs]
        return self.finish(config, workload, rep, makespan, cpu, outs, eng, policy)
