"""Decoding several engines side by side in one process: the lock-step rounds that benchmarks compare
configurations with (``benchmarks.longtail.lockstep``, ``benchmarks.trace_replay``).

Runs seconds apart see this machine's speed drift by 20-40%, more than the differences being measured. In lock
step each engine takes one ``step()`` per round, in an order shuffled every round, and is charged the seconds of
its own calls only, so every configuration sees the machine's speed of the same moments.
"""

from __future__ import annotations

import gc
import random
import time
from collections.abc import Mapping, Sequence

from services.rollout_actor.engine import Engine, GenerationRequest, RequestOutput


def decode_side_by_side(
    engines: Mapping[str, Engine], requests: Mapping[str, Sequence[GenerationRequest]], rng: random.Random
) -> tuple[dict[str, list[RequestOutput]], dict[str, float], dict[str, float]]:
    """Decode ``requests[c]`` on ``engines[c]`` for every configuration ``c``, in lock step: ``start()`` each,
    then rounds in which every engine with unfinished requests takes one ``step()``, in an order shuffled by
    ``rng`` every round (a fixed order would let one engine always follow the same other, whose steps leave
    the caches cold: 4-7% slower steps measured). The automatic GC is off over the rounds (a full collection
    walks every engine's suffix history, 250-370 ms charged to whichever step set it off) and runs after.

    Returns, per configuration: its outputs in request order, the wall seconds and the process CPU seconds of
    its own ``start()`` and ``step()`` calls (its makespan, measured in the same moments as the others')."""
    configs = list(engines)
    wall, cpu = dict.fromkeys(configs, 0.0), dict.fromkeys(configs, 0.0)
    done: dict[str, dict[str, RequestOutput]] = {c: {} for c in configs}

    def timed(c: str, call):
        c0, t0 = time.process_time(), time.perf_counter()
        out = call()
        wall[c] += time.perf_counter() - t0
        cpu[c] += time.process_time() - c0
        return out

    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        for c in configs:
            timed(c, lambda c=c: engines[c].start(requests[c]))
        live = list(configs)
        while live:
            order = list(live)
            rng.shuffle(order)
            for c in order:
                for o in timed(c, engines[c].step):
                    done[c][o.request_id] = o
                if not engines[c].has_unfinished():
                    live.remove(c)
    finally:
        gc.enable()
        gc.unfreeze()  # collectable again once dropped (this also thaws what the caller froze)
        gc.collect()
    outs = {c: [done[c][r.request_id] for r in requests[c]] for c in configs}
    return outs, wall, cpu
