"""The machine a benchmark ran on, and its measured memory bandwidth.

Every benchmark JSON carries ``describe_machine()`` (CPU model, cores, torch threads and version, load
average at the time), so that ratios measured side by side can be read in context.
``measure_memory_bandwidth()`` measures what one decode step at batch 1 can at best achieve: reading the
weights once from memory. It times a sum over (read) and a copy of (read + write) a tensor much larger than
the last-level cache, with the current number of torch threads, and reports the best and the median of a
few repetitions in GB/s (1e9 bytes/s).

Run: ``python -m benchmarks.machine``.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time

import torch

__all__ = ["cpu_model", "describe_machine", "measure_memory_bandwidth"]


def cpu_model() -> str:
    """The CPU model name (/proc/cpuinfo), else ``platform.processor()``, else the machine type."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def describe_machine() -> dict:
    """Plain-data description of this machine and process (JSON-serializable)."""
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    try:
        import transformers

        tf_version = transformers.__version__
    except Exception:  # noqa: BLE001 - optional for the description
        tf_version = None
    return {
        "cpu_model": cpu_model(),
        "processor": platform.processor(),
        "machine": platform.machine(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "usable_cores": _usable_cores(),
        "torch_version": torch.__version__,
        "torch_num_threads": torch.get_num_threads(),
        "transformers_version": tf_version,
        "cuda_available": torch.cuda.is_available(),
        "load_average_1_5_15": load,
    }


def measure_memory_bandwidth(mib: int = 256, repeats: int = 5, device: str | torch.device = "cpu") -> dict:
    """Memory bandwidth of ``device`` in GB/s: ``read`` (a float32 sum over ``mib`` MiB) and ``copy``
    (``dst.copy_(src)``, counted as read + write = 2x the size). Best and median of ``repeats`` timed runs after
    one warm-up, with ``torch.get_num_threads()`` threads on CPU (on a shared machine the best run is the least
    disturbed); on CUDA each run is timed between two device synchronizations."""
    device = torch.device(device)
    n = mib * (1 << 20) // 4
    src = torch.ones(n, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    nbytes = src.numel() * src.element_size()

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    read, copy = [], []
    for i in range(repeats + 1):
        sync()
        t = time.perf_counter()
        s = src.sum()
        sync()
        t_read = time.perf_counter() - t
        t = time.perf_counter()
        dst.copy_(src)
        sync()
        t_copy = time.perf_counter() - t
        if i:  # the first pass faults the pages in
            read.append(nbytes / t_read / 1e9)
            copy.append(2 * nbytes / t_copy / 1e9)
    del s
    return {
        "read_gbps_best": max(read),
        "read_gbps_median": statistics.median(read),
        "copy_gbps_best": max(copy),
        "copy_gbps_median": statistics.median(copy),
        "tensor_mib": mib,
        "repeats": repeats,
        "torch_num_threads": torch.get_num_threads(),
        "device": str(device),
        "method": "float32 sum (read) and copy_ (read+write) over a tensor larger than the caches",
    }


if __name__ == "__main__":
    torch.set_num_threads(1)
    print(json.dumps({"machine": describe_machine(), "bandwidth": measure_memory_bandwidth()}, indent=2))
