"""Deploy tests use the root conftest fixtures (tiny_policy_dir)."""
