#!/usr/bin/env bash
# The GPU checks in one run, within a time budget (no Ray: the engine, drafters and tuner run in-process).
#
#   benchmarks/gpu_checks.sh OUT_DIR [SECONDS]      (from the repository root; default 560 s)
#
# Stages, in order, each cut to the time left (what a stage wrote before a cut is kept):
#   1. the CUDA tests (CUDA-graph replay = eager, engine with graphs = without, attention kernels);
#   2. plain decode against the card's memory bound, Qwen2.5-7B shape, batch 1/8/32, with the forward's kernel
#      count and device time, the engine step's device-busy time and three decode attention kernels
#      (benchmarks/cuda_graphs.py -> OUT_DIR/cuda_graphs.{json,png});
#   3. trace replay at the Qwen2.5-7B shape, bf16, CUDA graphs, max batch 8 on 8 problems (history decoded,
#      3 passes over 8 warm-up problems), 2 interleaved rounds -> OUT_DIR/trace_replay_cuda.{json,png};
#   4. the same at max batch 128 on 32 problems (128 requests fill it), the history epoch from the trace
#      (decoding it, with its 6k-token response, took ~4 min), the tuner warmed up by 8 passes over the other
#      18 problems (one pass leaves the tuner with no drafting estimate in most batch-size buckets: a bucket
#      explores within a regret budget of its own decode time) -> OUT_DIR/trace_replay_cuda_b128.{json,png}.
# STAGES (default: all four, "tests decode_bound trace_replay trace_replay_b128") names the stages to run.
# Everything printed goes to OUT_DIR/log as well. PYTHON (default python3) runs the stages; EXTRA_PYTHONPATH is
# appended to PYTHONPATH (e.g. a folder holding omegaconf for the tests where it is not installed).
set -u
OUT=${1:?usage: benchmarks/gpu_checks.sh OUT_DIR [SECONDS]}
BUDGET=${2:-560}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONPATH=".:${EXTRA_PYTHONPATH:-}" PYTHONUNBUFFERED=1
end=$(($(date +%s) + BUDGET))
exec > >(tee -a "$OUT/log") 2>&1

stage() { # stage NAME MAX_SECONDS COMMAND...: run COMMAND for at most MAX_SECONDS and the time left
    local name=$1 max=$2 t0 rc
    shift 2
    if [[ " ${STAGES:-tests decode_bound trace_replay trace_replay_b128} " != *" $name "* ]]; then
        return
    fi
    local left=$((end - $(date +%s)))
    ((left < max)) && max=$left
    if ((max < 30)); then
        echo "[gpu_checks] $name: skipped (${left}s left)"
        return
    fi
    echo "[gpu_checks] $name: at most ${max}s"
    t0=$(date +%s)
    timeout "$max" "$@"
    rc=$?
    echo "[gpu_checks] $name: exit $rc after $(($(date +%s) - t0))s"
}

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"
stage tests 80 $PY -m pytest -q -p no:cacheprovider tests/rollout_actor/test_cuda_graphs.py \
    tests/rollout_actor/test_verify.py tests/rollout_actor/test_shapes.py tests/rollout_actor/test_model.py
stage decode_bound 110 $PY -m benchmarks.cuda_graphs --models qwen2.5-7b --batches 1,8,32 \
    --context 512 --rounds 5 --steps 30 --out "$OUT/cuda_graphs.json"
stage trace_replay 200 $PY -m benchmarks.trace_replay --device cuda --shapes qwen2.5-7b --batches 8 --problems 8 \
    --warm-problems 8 --warm-passes 3 --rounds 2 --arms suffix-k8,suffix-k16 \
    --out-dir "$OUT" --name trace_replay_cuda
stage trace_replay_b128 600 $PY -m benchmarks.trace_replay --device cuda --shapes qwen2.5-7b --batches 128 \
    --problems 32 --warm-problems 18 --warm-passes 8 --history-from-trace --rounds 1 --arms suffix-k8,suffix-k16 \
    --out-dir "$OUT" --name trace_replay_cuda_b128
# at most 8 files come back from the device machine: rebuild the markdown with
# python -m benchmarks.trace_replay.report OUT_DIR/trace_replay_cuda*.json
rm -f "$OUT"/*.md
echo "[gpu_checks] done, $((end - $(date +%s)))s of the budget left"
