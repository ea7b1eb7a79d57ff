"""Fixtures for the deploy tests: the tiny random policy folder of the pipeline tests (same recipe)."""

from tests.pipeline.conftest import tiny_policy_dir  # noqa: F401  (re-exported fixture)
