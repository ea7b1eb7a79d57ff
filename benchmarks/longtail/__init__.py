"""Rollout long-tail benchmark (``python -m benchmarks.longtail``): workload, runners (tailspec and peers),
tables, lock-step rounds, limits and report; ``__main__`` runs it."""
