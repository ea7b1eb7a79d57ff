"""CUDA-graph pool: bucketing, padding, lazy capture, memory budget, fallbacks (CPU, fake backend), and the
graph path of the engine against the eager path (CPU with the fake backend; CUDA with real graphs)."""

from __future__ import annotations

import pytest
import torch

from services.rollout_actor.attention import grouped_attention
from services.rollout_actor.cuda_graphs import (
    CudaGraphPool,
    GraphedForward,
    GraphKey,
    TorchCudaGraphBackend,
    kv_len_buckets,
)
from services.rollout_actor.engine import Engine, GenerationRequest, SamplingParams
from services.rollout_actor.model import Transformer, init_weights
from services.rollout_actor.speculative.ngram import NgramDrafter
from services.rollout_actor.speculative.strategy import FixedStrategy, Strategy
from services.rollout_actor.speculative.suffix_tree import SuffixTreeDrafter
from tests.conftest import tiny_config

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


class FakeGraphBackend:
    """A graph stand-in: ``capture`` runs the function once for its outputs, ``replay`` re-runs it and copies
    the results into those same output tensors (what replaying a graph does). Memory: whatever it is told."""

    def __init__(self, capture_bytes: int = 100, warmup_bytes: int | None = None):
        self.capture_bytes = capture_bytes
        self.warmup_bytes = capture_bytes if warmup_bytes is None else warmup_bytes
        self.warmups = self.captures = self.replays = 0

    def warmup(self, fn):
        self.warmups += 1
        fn()
        return self.warmup_bytes

    def capture(self, fn):
        self.captures += 1
        outputs = fn()

        def replay():
            self.replays += 1
            for name, value in fn().items():
                outputs[name].copy_(value)

        return replay, outputs, self.capture_bytes


class Recorder:
    """A forward of independent rows: ``y = 10 * x + kv_len``; records each call's input and key length."""

    def __init__(self):
        self.calls: list[tuple[torch.Tensor, int]] = []

    def __call__(self, inputs, kv_len):
        x = inputs["x"]
        self.calls.append((x.clone(), kv_len))
        return {"y": 10 * x + kv_len}


def _x(b: int, start: int = 1) -> torch.Tensor:
    return torch.arange(start, start + b).view(b, 1).float()


def _pool(backend=None, **kw) -> CudaGraphPool:
    kw.setdefault("batch_buckets", (1, 2, 4, 8))
    kw.setdefault("kv_buckets", (16, 32))
    return CudaGraphPool(backend or FakeGraphBackend(), **kw)


# ---------------------------------------------------------------------- pool logic (CPU, fake backend)
def test_key_rounds_batch_and_key_length_up_to_buckets():
    pool = _pool(max_width=5)
    assert pool.key(1, 1, 3) == GraphKey(1, 1, 16, False)
    assert pool.key(3, 4, 16) == GraphKey(4, 4, 16, False)
    assert pool.key(5, 5, 17, tree=True) == GraphKey(8, 5, 32, True)
    assert pool.key(9, 1, 10) is None  # batch above the largest bucket
    assert pool.key(2, 6, 10) is None  # wider than max_width
    assert pool.key(2, 1, 33) is None  # key length above the largest bucket
    assert kv_len_buckets(1000) == (128, 256, 512, 1000)
    assert kv_len_buckets(128) == (128,)
    with pytest.raises(ValueError):
        _pool(batch_buckets=(4, 2))


def test_pads_up_to_the_bucket_and_slices_outputs_to_the_real_batch():
    backend, fn = FakeGraphBackend(), Recorder()
    pool = _pool(backend)
    out = pool.run(fn, {"x": _x(3)}, width=1, kv_need=10, pad={"x": -1.0})
    assert out["y"].shape == (3, 1)
    assert out["y"].flatten().tolist() == [26.0, 36.0, 46.0]  # 10 * x + 16: the key-length bucket
    # warm-up and capture saw only padding (no side effects on live rows), the replay the real rows
    x_seen, kv_seen = zip(*fn.calls)
    assert all(x.shape == (4, 1) for x in x_seen) and set(kv_seen) == {16}
    assert x_seen[0].flatten().tolist() == [-1.0] * 4
    assert x_seen[-1].flatten().tolist() == [1.0, 2.0, 3.0, -1.0]
    assert pool.keys() == [GraphKey(4, 1, 16, False)]
    s = pool.stats
    assert (s.calls, s.misses, s.hits, s.captures, s.fallbacks, s.graphs) == (1, 1, 0, 1, 0, 1)


def test_captures_once_per_key_and_replays_after():
    backend, fn = FakeGraphBackend(), Recorder()
    pool = _pool(backend)
    for b, start in ((3, 1), (4, 5), (3, 9), (4, 2)):  # all in bucket 4, key lengths in bucket 16
        out = pool.run(fn, {"x": _x(b, start)}, width=1, kv_need=12)
        assert out["y"].flatten().tolist() == (10 * _x(b, start) + 16).flatten().tolist()
    assert backend.captures == 1 and backend.warmups == 1 and backend.replays == 4
    assert (pool.stats.misses, pool.stats.hits) == (1, 3)
    pool.run(fn, {"x": _x(2)}, width=1, kv_need=12)  # another batch bucket
    pool.run(fn, {"x": _x(3)}, width=3, kv_need=12)  # another width
    pool.run(fn, {"x": _x(3)}, width=1, kv_need=17)  # another key-length bucket
    pool.run(fn, {"x": _x(3)}, width=1, kv_need=12, tree=True)  # tree inputs
    assert backend.captures == 5 and pool.stats.graphs == 5
    assert set(pool.keys()) == {
        GraphKey(4, 1, 16),
        GraphKey(2, 1, 16),
        GraphKey(4, 3, 16),
        GraphKey(4, 1, 32),
        GraphKey(4, 1, 16, True),
    }


def test_rows_left_by_a_larger_batch_get_their_pad_back():
    """A padding row must never carry a stale real row (it would write into that request's KV slot)."""
    fn = Recorder()
    pool = _pool()
    pool.run(fn, {"x": _x(8)}, width=1, kv_need=5, pad={"x": 7.0})
    pool.run(fn, {"x": _x(5, 20)}, width=1, kv_need=5, pad={"x": 7.0})
    assert fn.calls[-1][0].flatten().tolist() == [20.0, 21.0, 22.0, 23.0, 24.0, 7.0, 7.0, 7.0]
    pool.run(fn, {"x": _x(6, 30)}, width=1, kv_need=5, pad={"x": 7.0})
    assert fn.calls[-1][0].flatten().tolist() == [30.0, 31.0, 32.0, 33.0, 34.0, 35.0, 7.0, 7.0]
    assert pool.stats.captures == 1


def test_tensor_pad_values_fill_whole_rows():
    fn_seen = []

    def fn(inputs, kv_len):
        fn_seen.append(inputs["m"].clone())
        return {"s": inputs["m"].sum((1, 2))}

    pool = _pool()
    causal = torch.ones(3, 3).tril()
    out = pool.run(fn, {"m": torch.zeros(3, 3, 3)}, width=3, kv_need=4, pad={"m": causal})
    assert out["s"].tolist() == [0.0, 0.0, 0.0]
    assert fn_seen[-1].shape == (4, 3, 3) and torch.equal(fn_seen[-1][3], causal)


def test_budget_refuses_keys_that_do_not_fit_and_runs_them_eagerly():
    # each graph costs 100 (capture growth) + 16 (static input [4, 1] float32 = 16 bytes)
    backend, fn = FakeGraphBackend(capture_bytes=100), Recorder()
    pool = _pool(backend, memory_budget_bytes=250)
    pool.run(fn, {"x": _x(3)}, width=1, kv_need=5)
    pool.run(fn, {"x": _x(3)}, width=2, kv_need=5)
    assert pool.stats.captures == 2 and pool.stats.captured_bytes == 2 * (100 + 16)
    n_calls = len(fn.calls)
    out = pool.run(fn, {"x": _x(3)}, width=3, kv_need=5)  # 232 + 16 + 100 > 250: refused
    assert out["y"].flatten().tolist() == [15.0, 25.0, 35.0]  # eager: real batch, exact key length
    assert backend.captures == 2
    # one warm-up (padded, bucketed) gave the estimate that refused it, then the eager run
    assert [(x.shape[0], kv) for x, kv in fn.calls[n_calls:]] == [(4, 16), (3, 5)]
    pool.run(fn, {"x": _x(3)}, width=3, kv_need=5)  # refused keys stay eager, without retrying
    assert [(x.shape[0], kv) for x, kv in fn.calls[n_calls + 2 :]] == [(3, 5)]
    s = pool.stats
    assert (s.misses, s.fallbacks, s.captures, s.graphs) == (3, 2, 2, 2)
    assert s.calls == s.hits + s.captures + s.fallbacks + s.unbucketed
    assert s.captured_bytes <= pool.memory_budget_bytes
    pool.run(fn, {"x": _x(2)}, width=1, kv_need=5)  # another new key: refused too
    pool.run(fn, {"x": _x(4)}, width=1, kv_need=5)  # captured keys still replay
    assert backend.captures == 2 and pool.stats.hits == 1 and pool.stats.fallbacks == 3
    pool.memory_budget_bytes = pool.stats.captured_bytes  # spent: new keys are refused without a warm-up
    warmups = backend.warmups
    pool.run(fn, {"x": _x(1)}, width=1, kv_need=5)
    assert backend.warmups == warmups and pool.stats.fallbacks == 4


def test_budget_uses_the_warmup_estimate_and_drops_a_capture_that_overshoots():
    backend, fn = FakeGraphBackend(capture_bytes=10, warmup_bytes=1000), Recorder()
    pool = _pool(backend, memory_budget_bytes=500)
    pool.run(fn, {"x": _x(1)}, width=1, kv_need=5)  # estimate 1000 > 500: warmed up, never captured
    assert (backend.warmups, backend.captures, pool.stats.fallbacks) == (1, 0, 1)
    backend.warmup_bytes, backend.capture_bytes = 10, 1000  # estimate fits, the capture itself does not
    out = pool.run(fn, {"x": _x(2)}, width=1, kv_need=5)
    assert backend.captures == 1 and pool.stats.graphs == 0 and pool.stats.captured_bytes == 0
    assert out["y"].flatten().tolist() == [15.0, 25.0] and pool.stats.fallbacks == 2
    pool.clear()


def test_unbucketed_shapes_run_eagerly():
    backend, fn = FakeGraphBackend(), Recorder()
    pool = _pool(backend, max_width=2)
    assert pool.run(fn, {"x": _x(9)}, width=1, kv_need=5)["y"].shape == (9, 1)
    pool.run(fn, {"x": _x(2)}, width=3, kv_need=5)
    pool.run(fn, {"x": _x(2)}, width=1, kv_need=40)
    assert [(x.shape[0], kv) for x, kv in fn.calls] == [(9, 5), (2, 5), (2, 40)]
    assert (pool.stats.unbucketed, pool.stats.misses, backend.warmups) == (3, 0, 0)


# ---------------------------------------------------------------------- the model's graph path on CPU
def _prefilled(model, prompts, num_slots, max_len=64):
    dev = next(model.parameters()).device
    cache = model.new_cache(num_slots, max_len)
    slots = torch.arange(len(prompts), device=dev)
    lens = torch.tensor([len(p) for p in prompts], device=dev)
    ids = torch.zeros(len(prompts), int(lens.max()), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, : len(p)] = torch.tensor(p)
    model(ids.to(dev), cache=cache, slots=slots)
    cache.commit(slots, lens)
    return cache


@torch.inference_mode()
def test_graphed_forward_matches_eager_with_padding_and_static_key_length(tiny_model):
    """Decode, chain verify and tree verify through the pool (fake graphs: padded batch, key-length bucket,
    scratch slot) give the eager logits, hidden states and KV-cache writes."""
    prompts = [[5, 6, 7], [9, 10, 11, 12, 13], [20]]
    eager_cache = _prefilled(tiny_model, prompts, 4)
    graph_cache = _prefilled(tiny_model, prompts, 5)  # slot 4: scratch
    pool = _pool(FakeGraphBackend(), kv_buckets=(8, 16, 64))
    graphed = GraphedForward(tiny_model, graph_cache, 4, pool, hidden_layers=(0, 2))
    slots = torch.arange(3)
    tree_mask = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool).expand(3, 3, 3)
    cases = [
        dict(ids=torch.tensor([[3], [4], [8]])),
        dict(ids=torch.tensor([[3, 4, 5, 6], [7, 8, 9, 10], [1, 2, 3, 4]])),
        dict(ids=torch.tensor([[3, 4, 5], [6, 7, 8], [9, 10, 11]]), mask=tree_mask, depth=[0, 1, 1]),
    ]
    for case in cases:
        ids, mask = case["ids"], case.get("mask")
        pos = None
        if "depth" in case:
            pos = eager_cache.lengths[slots].unsqueeze(1) + torch.tensor(case["depth"])
        ref = tiny_model(
            ids, positions=pos, cache=eager_cache, slots=slots, attn_mask=mask, hidden_layers=(0, 2)
        )
        out = graphed(ids, slots, positions=pos, attn_mask=mask)
        torch.testing.assert_close(out.logits, ref.logits, atol=2e-4, rtol=1e-4)
        assert out.hidden.keys() == {0, 2}
        for layer in (0, 2):
            torch.testing.assert_close(out.hidden[layer], ref.hidden[layer], atol=2e-4, rtol=1e-4)
        n = ids.shape[1]
        for b in range(3):
            start = int(eager_cache.lengths[b])
            torch.testing.assert_close(
                graph_cache.k[:, b, :, start : start + n],
                eager_cache.k[:, b, :, start : start + n],
                atol=1e-4,
                rtol=1e-4,
            )
        keep = torch.ones(3, dtype=torch.long)
        eager_cache.commit(slots, keep)
        graph_cache.commit(slots, keep)
    assert int(graph_cache.lengths[4]) == 0
    assert set(pool.keys()) == {GraphKey(4, 1, 8), GraphKey(4, 4, 16), GraphKey(4, 3, 16, True)}


def _greedy_requests(n=10, vocab=16, max_new=30):
    return [
        GenerationRequest(
            str(i), [i % vocab, (i * 3) % vocab, 5], SamplingParams(0.0, max_new_tokens=max_new), str(i % 3)
        )
        for i in range(n)
    ]


@pytest.mark.parametrize(
    "strategy, drafter",
    [
        (None, None),
        (Strategy("ngram", 3), NgramDrafter),
        (Strategy("suffix", 6, tree_width=2, tree_depth=3), SuffixTreeDrafter),
    ],
)
def test_engine_graph_path_equals_eager_on_cpu(strategy, drafter):
    """The engine's graph path (fake backend: padding rows in the scratch slot, static key lengths, tree
    inputs, hidden states) generates what the eager path generates, token for token."""
    m = init_weights(Transformer(tiny_config(vocab_size=16)), seed=0, std=0.5).eval()
    kw = dict(max_batch_size=3, max_seq_len=160, eos_token_ids=[], hidden_layers=(1,))
    if strategy is not None:
        kw.update(selector=FixedStrategy(strategy))
    plain = Engine(m, drafters={strategy.drafter: drafter()} if drafter else None, **kw)
    ref = plain.generate(_greedy_requests())
    backend = FakeGraphBackend()
    eng = Engine(
        m,
        drafters={strategy.drafter: drafter()} if drafter else None,
        cuda_graphs=True,
        graph_backend=backend,
        **kw,
    )
    outs = eng.generate(_greedy_requests())
    assert [o.token_ids for o in outs] == [o.token_ids for o in ref]
    for a, b in zip(outs, ref):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    s = eng.graphed.pool.stats
    assert s.hits > 0 and s.captures == backend.captures > 0 and s.fallbacks == 0
    assert s.calls == s.hits + s.captures  # every call replayed a graph, captured then or before
    assert all(k.batch in (1, 2, 3) and k.kv_len in (128, 160) for k in eng.graphed.pool.keys())
    assert eng.cache.num_slots == 4 and int(eng.cache.lengths[3]) == 0
    if strategy is not None:
        assert sum(o.spec.drafted for o in outs) > 0
        assert any(k.tree for k in eng.graphed.pool.keys()) == (strategy.tree_width > 1)


def test_engine_reports_capture_time_apart_so_the_selector_can_leave_it_out():
    """A step that captured a graph says how long the capture took (``StepRecord.capture_seconds``, the same in
    the selector's ``StepObservation``): the one-off cost the tuner must not charge to the step's arm."""
    m = init_weights(Transformer(tiny_config(vocab_size=16)), seed=0, std=0.5).eval()
    seen: list = []

    class Recording(FixedStrategy):
        def observe(self, obs):
            seen.append(obs)

    backend = FakeGraphBackend()
    eng = Engine(
        m,
        max_batch_size=3,
        max_seq_len=160,
        eos_token_ids=[],
        cuda_graphs=True,
        graph_backend=backend,
        selector=Recording(Strategy("ngram", 3)),
        drafters={"ngram": NgramDrafter()},
    )
    eng.generate(_greedy_requests(n=5, max_new=40))
    captured = [r for r in eng.step_log if r.capture_seconds > 0]
    assert backend.captures == eng.graphed.pool.stats.captures == len(captured) >= 2
    assert all(0 < r.capture_seconds <= r.seconds for r in captured)
    assert [o.capture_seconds for o in seen] == [r.capture_seconds for r in eng.step_log]
    assert eng.graphed.pool.stats.capture_seconds == pytest.approx(sum(r.capture_seconds for r in captured))


def test_engine_refuses_graphs_without_cuda(tiny_model):
    with pytest.raises(ValueError, match="CUDA"):
        Engine(tiny_model, cuda_graphs=True)
    eng = Engine(tiny_model)  # default: off on CPU, no scratch slot
    assert eng.graphed is None and eng.cache.num_slots == eng.max_batch_size


# ---------------------------------------------------------------------- CUDA
@pytest.fixture
def cuda_model():
    torch.manual_seed(0)
    return init_weights(Transformer(tiny_config(vocab_size=64)), seed=0, std=0.3).eval().cuda()


@pytest.mark.parametrize("width, tree", [(1, False), (4, False), (3, True)])
@pytest.mark.parametrize("batch", [1, 3, 5])  # 3 and 5 are padded (buckets 4 and 8)
@pytest.mark.gpu
@requires_cuda
@torch.inference_mode()
def test_cuda_graph_replay_matches_eager(cuda_model, batch, width, tree):
    """Replayed decode / verify logits equal eager ones (same cache writes), on a padded batch bucket."""
    dev = torch.device("cuda")
    prompts = [[(3 * i + j) % 64 for j in range(2 + i % 5)] for i in range(batch)]
    eager_cache = _prefilled(cuda_model, [list(p) for p in prompts], batch + 1, max_len=96)
    graph_cache = _prefilled(cuda_model, [list(p) for p in prompts], batch + 1, max_len=96)
    pool = CudaGraphPool(TorchCudaGraphBackend(dev), kv_buckets=kv_len_buckets(96, 32))
    graphed = GraphedForward(cuda_model, graph_cache, batch, pool, hidden_layers=(2,))
    slots = torch.arange(batch, device=dev)
    g = torch.Generator().manual_seed(batch * 10 + width)
    mask = None
    if tree:
        mask = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool, device=dev)
        mask = mask.expand(batch, 3, 3)
    for _step in range(3):  # first call captures, the next ones replay
        ids = torch.randint(0, 64, (batch, width), generator=g).to(dev)
        pos = None
        if tree:
            pos = eager_cache.lengths[slots].unsqueeze(1) + torch.tensor([0, 1, 1], device=dev)
        ref = cuda_model(
            ids, positions=pos, cache=eager_cache, slots=slots, attn_mask=mask, hidden_layers=(2,)
        )
        out = graphed(ids, slots, positions=pos, attn_mask=mask)
        # a graph attends over the key-length bucket (extra keys masked): equal up to float reduction order
        torch.testing.assert_close(out.logits, ref.logits, atol=5e-4, rtol=1e-4)
        torch.testing.assert_close(out.hidden[2], ref.hidden[2], atol=5e-4, rtol=1e-4)
        torch.testing.assert_close(graph_cache.k[:, :batch], eager_cache.k[:, :batch], atol=2e-4, rtol=1e-4)
        torch.testing.assert_close(graph_cache.v[:, :batch], eager_cache.v[:, :batch], atol=2e-4, rtol=1e-4)
        keep = torch.ones(batch, dtype=torch.long, device=dev)
        eager_cache.commit(slots, keep)
        graph_cache.commit(slots, keep)
    assert pool.stats.captures == 1 and pool.stats.hits == 2 and pool.stats.fallbacks == 0


@pytest.mark.parametrize(
    "strategy, drafter",
    [
        (None, None),
        (Strategy("ngram", 3), NgramDrafter),
        (Strategy("suffix", 6, tree_width=2, tree_depth=3), SuffixTreeDrafter),
    ],
)
@pytest.mark.gpu
@requires_cuda
def test_cuda_engine_greedy_with_graphs_equals_without(strategy, drafter):
    m = init_weights(Transformer(tiny_config(vocab_size=16)), seed=0, std=0.5).eval().cuda()
    kw = dict(max_batch_size=6, max_seq_len=160, eos_token_ids=[])
    if strategy is not None:
        kw.update(selector=FixedStrategy(strategy))

    def run(graphs: bool):
        drafters = {strategy.drafter: drafter()} if drafter else None
        eng = Engine(m, drafters=drafters, cuda_graphs=graphs, **kw)
        return eng, eng.generate(_greedy_requests(n=14, max_new=40))

    _, off = run(False)
    eng, on = run(True)
    assert [o.token_ids for o in on] == [o.token_ids for o in off]
    for a, b in zip(on, off):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-3)
    assert eng.graphed is not None and eng.graphed.pool.stats.hits > 0
    assert Engine(m, max_batch_size=2).graphed is not None  # on by default on CUDA


@pytest.mark.parametrize(
    "b, heads, kv, t, k_len",
    [(16, 6, 2, 200, 200), (16, 6, 2, 1, 201), (64, 14, 2, 5, 300), (1, 28, 4, 1, 568), (2, 28, 4, 9, 576)],
)
@pytest.mark.gpu
@requires_cuda
def test_cuda_grouped_attention_matches_sdpa(b, heads, kv, t, k_len):
    """The grouped path (the cached forward's at every batch size on CUDA), prefill and decode / verify shapes:
    CUDA's attention kernels return a non-contiguous output for some of them (a ``view`` failed at 16 x 200)."""
    g = torch.Generator(device="cuda").manual_seed(b + t)
    q = torch.randn(b, heads, t, 64, device="cuda", generator=g)
    k, v = (torch.randn(b, kv, k_len, 64, device="cuda", generator=g) for _ in range(2))
    causal = torch.ones(t, k_len, dtype=torch.bool, device="cuda").tril(k_len - t)
    mask = causal.expand(b, 1, t, k_len)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    torch.testing.assert_close(grouped_attention(q, k, v, mask), ref, atol=1e-4, rtol=1e-4)


@pytest.mark.gpu
@requires_cuda
def test_cuda_eager_engine_keeps_attention_off_cudnn():
    """An eager decode step's key length grows each step, and cuDNN attention plans every new shape (2.2 ms of
    CPU per call on an H200): the model's attention must not dispatch to it. Control: plain SDPA on the same
    bf16 shapes does pick cuDNN here (else the check would prove nothing and is skipped)."""
    from torch.profiler import ProfilerActivity, profile

    cfg = tiny_config(
        vocab_size=64, hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64
    )
    m = init_weights(Transformer(cfg), seed=0, std=0.05).eval().cuda().to(torch.bfloat16)

    def cudnn_calls(fn) -> int:
        with profile(activities=[ProfilerActivity.CPU]) as p:
            fn()
            torch.cuda.synchronize()
        return sum(e.count for e in p.key_averages() if "cudnn_attention" in e.key)

    q = torch.randn(1, 4, 1, 64, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(1, 4, 37, 64, device="cuda", dtype=torch.bfloat16)
    mask = torch.ones(1, 1, 1, 37, dtype=torch.bool, device="cuda")
    if cudnn_calls(lambda: torch.nn.functional.scaled_dot_product_attention(q, kv, kv, attn_mask=mask)) == 0:
        pytest.skip("this GPU / torch does not pick cuDNN attention for these shapes")
    eng = Engine(m, max_batch_size=2, max_seq_len=96, eos_token_ids=[], cuda_graphs=False)
    outs = []
    assert cudnn_calls(lambda: outs.extend(eng.generate(_greedy_requests(n=2, max_new=12)))) == 0
    assert [len(o.token_ids) for o in outs] == [12, 12]


@pytest.mark.gpu
@requires_cuda
def test_cuda_graph_memory_budget_is_respected(cuda_model):
    def generate(budget: int) -> tuple[Engine, list]:
        eng = Engine(
            cuda_model, max_batch_size=8, max_seq_len=96, eos_token_ids=[], cuda_graph_memory_bytes=budget
        )
        reqs = [
            GenerationRequest(str(i), [i + 2, i + 3], SamplingParams(0.0, max_new_tokens=4 + 5 * i))
            for i in range(8)
        ]  # finishing one by one: batches 8 .. 1 use several batch buckets
        return eng, eng.generate(reqs)

    free, ref = generate(1 << 40)
    fs = free.graphed.pool.stats
    assert fs.captures >= 4 and fs.fallbacks == 0  # batch buckets 8, 4, 2, 1
    for budget in (0, fs.captured_bytes - 1):  # nothing; less than all the graphs take
        eng, outs = generate(budget)
        s = eng.graphed.pool.stats
        assert s.captured_bytes <= budget and s.fallbacks > 0 and s.captures < fs.captures
        assert s.calls == s.hits + s.captures + s.fallbacks
        if budget == 0:
            assert s.captures == 0 and s.fallbacks == s.calls
        assert [o.token_ids for o in outs] == [o.token_ids for o in ref]


class ShapeRecordingBackend(FakeGraphBackend):
    """A fake backend that records the shapes of each captured graph's static outputs."""

    def __init__(self):
        super().__init__()
        self.output_shapes: list[dict[str, tuple]] = []

    def capture(self, fn):
        replay, outputs, nbytes = super().capture(fn)
        self.output_shapes.append({k: tuple(v.shape) for k, v in outputs.items()})
        return replay, outputs, nbytes


def test_graphs_hold_no_logits_the_output_head_runs_after_the_replay():
    m = init_weights(Transformer(tiny_config(vocab_size=512, hidden_size=32)), seed=0, std=0.3).eval()
    prompts = [[5, 6, 7], [9, 10, 11, 12]]
    eager_cache, graph_cache = _prefilled(m, prompts, 2), _prefilled(m, prompts, 3)
    backend = ShapeRecordingBackend()
    graphed = GraphedForward(m, graph_cache, 2, _pool(backend, kv_buckets=(16,)), hidden_layers=(1,))
    ids, slots = torch.tensor([[3, 4, 5], [6, 7, 8]]), torch.arange(2)
    out = graphed(ids, slots)
    ref = m(ids, cache=eager_cache, slots=slots, hidden_layers=(1,))
    torch.testing.assert_close(out.logits, ref.logits, atol=2e-4, rtol=1e-4)
    assert out.hidden.keys() == {1}
    assert backend.output_shapes and all(
        shape[-1] == 32 for shapes in backend.output_shapes for shape in shapes.values()
    )
