"""``benchmarks.cuda_graphs`` without CUDA, and its table in ``make bench``'s summary: a skip never overwrites
a result measured on a GPU, and the summary shows that result with the GPU it ran on."""

import json
import shutil

import pytest
import torch

from benchmarks import cuda_graphs
from benchmarks.run_all import RESULTS, cuda_graphs_markdown

MEASURED = RESULTS / "cuda_graphs.json"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-CUDA path")
def test_without_cuda_a_skip_keeps_a_measured_result(tmp_path, capsys):
    out = tmp_path / "cuda_graphs.json"
    assert cuda_graphs.main(["--out", str(out)]) == 0
    assert "skipped: no CUDA" in capsys.readouterr().out
    assert json.loads(out.read_text())["skipped"] is True
    shutil.copy(MEASURED, out)
    assert cuda_graphs.main(["--out", str(out)]) == 0
    assert out.read_text() == MEASURED.read_text()


def test_summary_table_names_the_gpu_and_every_row(tmp_path):
    d = json.loads(MEASURED.read_text())
    assert d["skipped"] is False  # the committed result was measured on a GPU
    md = cuda_graphs_markdown(MEASURED)
    assert d["gpu"] in md and f"{d['bound_gbps']:.0f} GB/s" in md
    rows = [line for line in md.splitlines() if line.startswith("| ") and "x |" in line]
    want = [
        (r["engine_same_tokens"], r["forward_graph_vs_bound"], r["engine_step_graph_vs_bound"])
        for m in d["models"].values()
        for r in m["rows"]
    ]
    assert len(rows) == len(want)
    for line, (same, fwd, step) in zip(rows, want):
        assert line.endswith(f"| {same} |") and f"| {fwd:.2f}x | {step:.2f}x |" in line
    skipped = tmp_path / "skipped.json"
    skipped.write_text(json.dumps({"benchmark": "cuda_graphs", "skipped": True, "reason": "no CUDA"}))
    assert "Skipped: no CUDA" in cuda_graphs_markdown(skipped)


def test_decode_bytes_counts_each_weight_once_and_the_cache_per_token():
    from benchmarks.cuda_graphs import decode_bytes
    from services.rollout_actor.model import Transformer, init_weights
    from tests.conftest import tiny_config

    for tied in (True, False):
        cfg = tiny_config(tie_word_embeddings=tied)
        m = init_weights(Transformer(cfg), seed=0)
        emb = cfg.vocab_size * cfg.hidden_size * 4  # float32
        weights = sum(p.numel() * 4 for p in {id(p): p for p in m.parameters()}.values())
        per_token = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * cfg.head_dim * 4
        assert decode_bytes(m, 1, 0) == weights - (0 if tied else emb)
        assert decode_bytes(m, 3, 10) - decode_bytes(m, 1, 0) == 3 * 10 * per_token


def test_kernel_names_sorted_into_matrix_products_and_the_rest():
    d = json.loads(MEASURED.read_text())
    for m in d["models"].values():
        layers = m["config"]["num_hidden_layers"]
        for r in m["rows"]:
            k = r["forward_kernels"]
            gemm = [t for t in k["top"] if cuda_graphs.is_gemm(t["name"])]
            # split-K products finish in a cuBLASLt reduction kernel: part of the product, not one of its own
            products = [t for t in gemm if "splitkreduce" not in t["name"].lower()]
            # 4 weight products a layer (q / k / v fused, o, gate / up fused, down: fused.py) and the output head
            assert sum(t["calls"] for t in products) == 4 * layers + 1
            assert k["gemm_us"] >= sum(t["us"] for t in gemm) - 1e-6 and k["other_us"] > 0
    assert not cuda_graphs.is_gemm(
        "fmha_cutlassF_bf16_aligned_64x128_rf_sm80(PyTorchMemEffAttention::AttentionKernel"
    )
    assert not cuda_graphs.is_gemm(
        "void at::native::vectorized_elementwise_kernel<4, at::native::AUnaryFunctor"
    )
