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
    assert d["skipped"] is False  # the committed result was measured (on an H200)
    md = cuda_graphs_markdown(MEASURED)
    assert d["gpu"] in md
    rows = [line for line in md.splitlines() if line.startswith("| ") and "x |" in line]
    assert len(rows) == sum(len(m["rows"]) for m in d["models"].values())
    assert all(line.endswith("| True |") for line in rows)  # graphs on and off gave the same tokens
    skipped = tmp_path / "skipped.json"
    skipped.write_text(json.dumps({"benchmark": "cuda_graphs", "skipped": True, "reason": "no CUDA"}))
    assert "Skipped: no CUDA" in cuda_graphs_markdown(skipped)
