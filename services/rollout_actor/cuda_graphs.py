"""CUDA graphs for the engine's decode and verify forwards: a bucketed pool, captured lazily under a budget.

A decode step of a small model at a small batch is bound by kernel launches, not by the GPU: a forward is a
few hundred short kernels. A CUDA graph records them once and replays them with one launch. A graph has
fixed shapes and fixed addresses, so the pool keeps one graph per shape:

* **Key** ``GraphKey(batch, width, kv_len, tree)``. ``batch``: the real batch padded up to the next batch
  bucket (default edges 1, 2, 4, 8, 16, 32, 64, 128, ...). ``width``: tokens per request in the forward
  (1 for plain decode, k + 1 to verify a k-token chain, n + 1 for an n-node tree), matched exactly.
  ``kv_len``: key positions attended, ``max(lengths[slots]) + width`` rounded up to the next key-length
  bucket (attention has a static key length inside a graph; the bucket keeps it near the real need).
  ``tree``: whether rotary positions and the attention mask are graph inputs (tree drafts) or derived
  inside the graph from the cache lengths (plain decode and chains: nothing to copy in).
* **Lazy capture under a budget.** The first call with a key warms the forward up eagerly (as capture
  requires: lazy initialization, workspace allocation) and measures its transient peak memory; when the
  pool's captured bytes plus static inputs plus that estimate would exceed ``memory_budget_bytes``, the key
  is refused and runs eagerly from then on (``stats.fallbacks``). Otherwise the forward is captured into the
  pool's shared memory pool (graphs replay one at a time, so they share intermediates) and the reserved
  memory the capture added is charged to the pool (``stats.captured_bytes``; a capture that overshoots is
  dropped and refused as well).
* **Replay.** The real rows are copied into the key's static input buffers (padding rows hold fixed pad
  values: the KV-cache slot of a padding row is a scratch slot no request uses), the graph is replayed, and
  the static outputs are returned sliced to the real batch. They are views, valid until the pool's next call.
  ``GraphedForward``'s graphs end at the final norm: the output head (one matrix product) runs after the
  replay, so a graph holds ``[B, T, hidden]`` static outputs, not ``[B, T, vocab]`` logits (for a 152k
  vocabulary at batch 8 and width 17, 1 MB instead of 41 MB), and many more keys fit the memory budget.
* **Key mismatch.** A batch above the largest bucket, a width above ``max_width`` or a key length above the
  largest key-length bucket runs eagerly (``stats.unbucketed``).

What makes the forward capture-safe is ``Transformer.forward(..., kv_len=...)``: with a static key length
it has static shapes, no host synchronization and no Python branching on tensor values; the KV cache is
written by index tensors computed on the device from the slot indices (a static input) and the slot
lengths (``KVCache.lengths``, updated in place by ``commit`` / ``keep_path``, so replays see them). The one
host read, ``max(lengths[slots])`` to pick the key-length bucket, happens before the replay.

The capture mechanism sits behind ``GraphBackend`` (warm-up, capture); ``TorchCudaGraphBackend`` is the real
one (``torch.cuda.CUDAGraph`` with a shared ``graph_pool_handle``), and the pool logic is tested on CPU with
a fake. Graphs read the model's parameters and the cache by address: in-place updates (``load_state_dict``)
are seen by later replays; replaced tensors need ``CudaGraphPool.clear()`` (or a new engine).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import torch

from services.rollout_actor.model import ForwardOutput, KVCache, Transformer

DEFAULT_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)

Outputs = dict[str, torch.Tensor]
ForwardFn = Callable[[Mapping[str, torch.Tensor], int], Outputs]


class GraphKey(NamedTuple):
    """What one graph is specialized to (see the module docstring)."""

    batch: int  # padded batch (a batch bucket)
    width: int  # tokens per request in the forward
    kv_len: int  # key positions attended (a key-length bucket)
    tree: bool = False  # positions and attention mask are inputs


@dataclass
class GraphPoolStats:
    """Counters of one ``CudaGraphPool`` (plain numbers; report them wherever metrics go)."""

    calls: int = 0
    hits: int = 0  # replays of a graph captured by an earlier call
    misses: int = 0  # first call with a bucketed key (then captured, or refused by the budget)
    captures: int = 0  # graphs captured and kept
    fallbacks: int = 0  # eager runs of a bucketed key refused by the memory budget
    unbucketed: int = 0  # eager runs whose batch, width or key length fits no bucket
    graphs: int = 0  # graphs held
    captured_bytes: int = 0  # device bytes charged to the held graphs (static inputs + capture growth)
    capture_seconds: float = 0.0  # wall time of warm-ups and captures (kept or not): one-off, not per step


class GraphBackend(Protocol):
    """How graphs are made: ``TorchCudaGraphBackend`` on CUDA, a fake in CPU tests."""

    def warmup(self, fn: Callable[[], Any]) -> int:
        """Run ``fn`` eagerly as capture requires; return its transient peak device memory in bytes."""
        ...

    def capture(self, fn: Callable[[], Outputs]) -> tuple[Callable[[], None], Outputs, int]:
        """Record ``fn`` into a graph. Returns ``(replay, static outputs, device bytes the capture added)``;
        ``replay()`` recomputes the static outputs from the current contents of ``fn``'s input buffers."""
        ...


class TorchCudaGraphBackend:
    """``torch.cuda.CUDAGraph`` capture on a side stream, all graphs in one shared memory pool.

    Memory: the warm-up estimate is the peak of ``memory_allocated`` over the warm-up runs after the first
    (which does the one-off lazy initialization) above the allocation before them; this resets the
    device's peak-memory statistics. The charge of a capture is the growth of ``memory_reserved`` across it,
    after releasing the caching allocator's unused blocks (``torch.cuda.graph`` releases them too).
    """

    def __init__(self, device: torch.device | str | int | None = None, warmup_iters: int = 2):
        dev = torch.device("cuda" if device is None else device)
        if dev.type != "cuda":
            raise ValueError(f"TorchCudaGraphBackend needs a CUDA device, got {dev}")
        self.device = dev if dev.index is not None else torch.device("cuda", torch.cuda.current_device())
        self.warmup_iters = warmup_iters
        self.stream = torch.cuda.Stream(self.device)
        self.mempool = torch.cuda.graph_pool_handle()

    def warmup(self, fn: Callable[[], Any]) -> int:
        dev = self.device
        self.stream.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(self.stream):
            fn()  # first run: lazy initialization (cuBLAS workspace of this stream, ...), not counted
            torch.cuda.synchronize(dev)
            start = torch.cuda.memory_allocated(dev)
            torch.cuda.reset_peak_memory_stats(dev)
            for _ in range(max(1, self.warmup_iters - 1)):
                fn()
        torch.cuda.current_stream(dev).wait_stream(self.stream)
        torch.cuda.synchronize(dev)
        return max(0, torch.cuda.max_memory_allocated(dev) - start)

    def capture(self, fn: Callable[[], Outputs]) -> tuple[Callable[[], None], Outputs, int]:
        dev = self.device
        torch.cuda.synchronize(dev)
        gc.collect()
        torch.cuda.empty_cache()
        before = torch.cuda.memory_reserved(dev)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.mempool, stream=self.stream):
            outputs = fn()
        torch.cuda.synchronize(dev)
        return graph.replay, outputs, max(0, torch.cuda.memory_reserved(dev) - before)


@dataclass
class _Entry:
    inputs: dict[str, torch.Tensor]  # static, [key.batch, ...]
    pad: dict[str, Any]  # name -> value of padding rows
    outputs: Outputs  # static, [key.batch, ...]
    replay: Callable[[], None]
    nbytes: int
    live: int = 0  # rows [0, live) hold real rows of the last call; the rest hold pad values


def _nbytes(tensors: Mapping[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def _first_edge(edges: Sequence[int], need: int) -> int | None:
    return next((e for e in edges if e >= need), None)


def kv_len_buckets(max_len: int, smallest: int = 128) -> tuple[int, ...]:
    """Key-length bucket edges ``smallest, 2 * smallest, ...`` below ``max_len``, then ``max_len``."""
    edges = []
    e = smallest
    while e < max_len:
        edges.append(e)
        e *= 2
    return (*edges, max_len)


class CudaGraphPool:
    """Graphs of one forward, keyed by ``GraphKey``, captured lazily under a memory budget.

    Args:
        backend: ``GraphBackend`` (``TorchCudaGraphBackend`` on CUDA).
        batch_buckets: increasing batch sizes a batch is padded up to; a larger batch runs eagerly.
        kv_buckets: increasing key lengths the need is rounded up to; a larger need runs eagerly.
        max_width: the widest forward (tokens per request) that gets graphs; None: any.
        memory_budget_bytes: device bytes the held graphs may take (static inputs + capture growth).
    """

    def __init__(
        self,
        backend: GraphBackend,
        batch_buckets: Sequence[int] = DEFAULT_BATCH_BUCKETS,
        kv_buckets: Sequence[int] = (4096,),
        max_width: int | None = None,
        memory_budget_bytes: int = 1 << 30,
    ):
        for name, edges in (("batch_buckets", batch_buckets), ("kv_buckets", kv_buckets)):
            if not edges or list(edges) != sorted(set(edges)) or edges[0] < 1:
                raise ValueError(f"{name} must be increasing positive integers, got {list(edges)}")
        self.backend = backend
        self.batch_buckets = tuple(batch_buckets)
        self.kv_buckets = tuple(kv_buckets)
        self.max_width = max_width
        self.memory_budget_bytes = memory_budget_bytes
        self.stats = GraphPoolStats()
        self._graphs: dict[GraphKey, _Entry] = {}
        self._refused: set[GraphKey] = set()

    def key(self, batch: int, width: int, kv_need: int, tree: bool = False) -> GraphKey | None:
        """The key a forward of ``batch`` rows x ``width`` tokens needing ``kv_need`` key positions replays,
        or None when it fits no bucket."""
        b = _first_edge(self.batch_buckets, batch)
        k = _first_edge(self.kv_buckets, kv_need)
        if b is None or k is None or width < 1 or (self.max_width is not None and width > self.max_width):
            return None
        return GraphKey(b, width, k, bool(tree))

    def keys(self) -> list[GraphKey]:
        """Keys with a captured graph."""
        return list(self._graphs)

    def clear(self) -> None:
        """Drop every graph and refusal (the budget is free again)."""
        self._graphs.clear()
        self._refused.clear()
        self.stats.graphs = 0
        self.stats.captured_bytes = 0

    def run(
        self,
        fn: ForwardFn,
        inputs: Mapping[str, torch.Tensor],
        *,
        width: int,
        kv_need: int,
        tree: bool = False,
        pad: Mapping[str, Any] | None = None,
    ) -> Outputs:
        """Run ``fn`` on ``inputs``: replay its graph for this key (capturing it on first use), else eagerly.

        Args:
            fn: ``fn(inputs, kv_len) -> outputs``, the forward for a (padded) batch attending over ``kv_len``
                key positions; capture-safe for fixed input shapes. Every input and output has the batch as
                dim 0 and rows are independent.
            inputs: name -> ``[B, ...]`` device tensors of the real batch B (B >= 1).
            width: tokens per request (part of the key).
            kv_need: key positions the real batch needs, ``max(lengths) + width``; an eager run gets exactly
                this, a replay the key-length bucket above it.
            tree: part of the key (which inputs there are).
            pad: name -> value of padding rows (a scalar or a tensor broadcastable to one row); default 0.

        Returns:
            name -> ``[B, ...]`` outputs. After a replay, views into the graph's static outputs, overwritten
            by the pool's next call.
        """
        self.stats.calls += 1
        b = next(iter(inputs.values())).shape[0]
        key = self.key(b, width, kv_need, tree)
        if key is None:
            self.stats.unbucketed += 1
            return fn(inputs, kv_need)
        entry = self._graphs.get(key)
        if entry is not None:
            self.stats.hits += 1
        elif key in self._refused:
            self.stats.fallbacks += 1
            return fn(inputs, kv_need)
        else:
            self.stats.misses += 1
            t0 = time.perf_counter()
            entry = self._capture(key, fn, inputs, dict(pad or {}))
            self.stats.capture_seconds += time.perf_counter() - t0
            if entry is None:
                self._refused.add(key)
                self.stats.fallbacks += 1
                return fn(inputs, kv_need)
        self._load(entry, inputs, b)
        entry.replay()
        return {name: out[:b] for name, out in entry.outputs.items()}

    # ------------------------------------------------------------------ internals
    def _capture(
        self, key: GraphKey, fn: ForwardFn, inputs: Mapping[str, torch.Tensor], pad: dict[str, Any]
    ) -> _Entry | None:
        budget = self.memory_budget_bytes
        if self.stats.captured_bytes >= budget:
            return None
        # Static inputs hold only padding while warming up and capturing: the padded forward touches nothing
        # but the scratch slot, so neither has side effects on live requests.
        static = {}
        for name, x in inputs.items():
            buf = x.new_empty((key.batch, *x.shape[1:]))
            buf[:] = pad.get(name, 0)
            static[name] = buf
        in_bytes = _nbytes(static)

        def forward() -> Outputs:
            return fn(static, key.kv_len)

        estimate = self.backend.warmup(forward)
        if self.stats.captured_bytes + in_bytes + estimate > budget:
            return None
        replay, outputs, grown = self.backend.capture(forward)
        cost = in_bytes + grown
        if self.stats.captured_bytes + cost > budget:
            return None  # dropped: its blocks return to the shared pool for later captures
        entry = _Entry(static, pad, outputs, replay, cost)
        self._graphs[key] = entry
        self.stats.captures += 1
        self.stats.graphs = len(self._graphs)
        self.stats.captured_bytes += cost
        return entry

    @staticmethod
    def _load(entry: _Entry, inputs: Mapping[str, torch.Tensor], b: int) -> None:
        """Copy the real rows in; rows a larger earlier batch left behind get their pad values back."""
        for name, buf in entry.inputs.items():
            if b < entry.live:
                buf[b : entry.live] = entry.pad.get(name, 0)
            buf[:b].copy_(inputs[name])
        entry.live = b


class GraphedForward:
    """The target's decode / verify forward over a slot KV cache, replayed from a ``CudaGraphPool``.

    Call it like ``Transformer.forward`` with a cache (``positions`` / ``attn_mask`` only for trees); what
    differs is that padding rows of a graph write their K/V into ``scratch_slot``, a slot no request uses
    (its length stays 0).

    Args:
        model: the target (on the pool's device).
        cache: its slot KV cache.
        scratch_slot: a cache slot reserved for padding rows.
        pool: the ``CudaGraphPool`` (its key-length buckets should end at ``cache.max_len``).
        hidden_layers: as ``Transformer.forward`` (fixed: part of what the graphs compute).
    """

    def __init__(
        self,
        model: Transformer,
        cache: KVCache,
        scratch_slot: int,
        pool: CudaGraphPool,
        hidden_layers: Sequence[int] = (),
    ):
        if not 0 <= scratch_slot < cache.num_slots:
            raise ValueError(f"scratch_slot {scratch_slot} outside the cache's {cache.num_slots} slots")
        self.model = model
        self.cache = cache
        self.scratch_slot = scratch_slot
        self.pool = pool
        self.hidden_layers = tuple(hidden_layers)
        self._causal: dict[int, torch.Tensor] = {}

    def __call__(
        self,
        input_ids: torch.Tensor,
        slots: torch.Tensor,
        positions: torch.Tensor | None = None,
        attn_mask: torch.Tensor | None = None,
    ) -> ForwardOutput:
        """Forward of new tokens against the cache (lengths unchanged; the caller commits).

        Args:
            input_ids: ``[B, T]`` long token ids (device).
            slots: ``[B]`` long cache slots (device).
            positions: ``[B, T]`` rotary positions, or None: ``lengths[slot] + arange(T)``.
            attn_mask: ``[B, T, T]`` bool mask among the new tokens, or None: causal.

        Returns:
            ``ForwardOutput`` with logits ``[B, T, V]`` (the output head runs after the replay, outside the
            graph: a graph holding ``[B, T, V]`` static logits would take vocab / hidden times the memory) and
            the hidden states ``[B, T, H]`` of ``hidden_layers``, valid until the next call. Raises
            ``ValueError`` when the cache would overflow.
        """
        b, t = input_ids.shape
        base = self.cache.lengths[slots]
        longest = int(base.max())  # the one host read: picks the key-length bucket
        if longest + t > self.cache.max_len:
            raise ValueError(f"KV cache overflow: {longest} + {t} > max_len {self.cache.max_len}")
        inputs = {"input_ids": input_ids, "slots": slots}
        pad: dict[str, Any] = {"input_ids": 0, "slots": self.scratch_slot}
        tree = positions is not None or attn_mask is not None
        if tree:
            if positions is None:
                positions = base.unsqueeze(1) + torch.arange(t, device=input_ids.device)
            causal = self._causal_mask(t, input_ids.device)
            inputs["positions"] = positions
            inputs["attn_mask"] = causal.expand(b, t, t) if attn_mask is None else attn_mask
            pad.update(positions=0, attn_mask=causal)
        outs = self.pool.run(self._forward, inputs, width=t, kv_need=longest + t, tree=tree, pad=pad)
        final = outs[f"hidden.{self.model.config.num_hidden_layers}"]
        hidden = {int(name.split(".", 1)[1]): h for name, h in outs.items() if name.startswith("hidden.")}
        hidden = {layer: h for layer, h in hidden.items() if layer in self.hidden_layers}
        return ForwardOutput(self.model.lm_head(final), hidden)

    def _forward(self, inputs: Mapping[str, torch.Tensor], kv_len: int) -> Outputs:
        out = self.model(
            inputs["input_ids"],
            positions=inputs.get("positions"),
            cache=self.cache,
            slots=inputs["slots"],
            attn_mask=inputs.get("attn_mask"),
            hidden_layers=(*self.hidden_layers, self.model.config.num_hidden_layers),
            kv_len=kv_len,
            head=False,
        )
        return {f"hidden.{layer}": h for layer, h in out.hidden.items()}

    def _causal_mask(self, t: int, device: torch.device) -> torch.Tensor:
        m = self._causal.get(t)
        if m is None:
            m = self._causal[t] = torch.ones(t, t, dtype=torch.bool, device=device).tril()
        return m


__all__ = [
    "DEFAULT_BATCH_BUCKETS",
    "CudaGraphPool",
    "GraphBackend",
    "GraphKey",
    "GraphPoolStats",
    "GraphedForward",
    "TorchCudaGraphBackend",
    "kv_len_buckets",
]
