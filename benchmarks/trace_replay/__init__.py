"""Trace-replay benchmark (``python -m benchmarks.trace_replay``): real sampled rollouts replayed token for token
at real model shapes; ``workload.py`` (the GRPO steps), ``runner.py`` (one engine, every configuration),
``report.py`` (summaries, headline, markdown, plot), ``train_tokenizer.py`` (the real shapes' BPE)."""
