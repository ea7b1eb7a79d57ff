"""Reproducible benchmarks (run each with ``python -m benchmarks.<name>``)."""
