"""Shared fixtures: tiny random models (CPU), the committed base policy, the GSM8K data folder."""

from __future__ import annotations

import pytest
import torch

from services.common.config import REPO_ROOT
from services.rollout_actor.model import ModelConfig, Transformer, init_weights

# One intra-op thread: tiny models gain nothing from two, and on a loaded 2-core box OpenMP thread
# hand-offs make small ops up to 100x slower.
torch.set_num_threads(1)

BASE_POLICY = REPO_ROOT / "services" / "pipeline" / "assets" / "base_policy"
GSM8K_DIR = REPO_ROOT / "data" / "gsm8k"


def tiny_config(**kw) -> ModelConfig:
    base = dict(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        eos_token_id=1,
        max_position_embeddings=512,
    )
    base.update(kw)
    return ModelConfig(**base)


@pytest.fixture
def tiny_model() -> Transformer:
    return init_weights(Transformer(tiny_config()), seed=0, std=0.3).eval()


def pytest_collection_modifyitems(config, items):
    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs CUDA")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray cluster for the whole pytest run, in its own short temp dir (Unix socket path limits)."""
    import shutil
    import tempfile

    import ray

    tmp = None
    for attempt in range(3):  # a loaded 2-core box can miss Ray's start-up deadline: try again, fresh dir
        tmp = tempfile.mkdtemp(prefix="tsray", dir="/tmp")
        try:
            ray.init(num_cpus=2, include_dashboard=False, _temp_dir=tmp, log_to_driver=False)
            break
        except Exception:  # RuntimeError (GCS port file) or Exception ("node timed out during startup")
            ray.shutdown()
            shutil.rmtree(tmp, ignore_errors=True)
            if attempt == 2:
                raise
    yield ray
    ray.shutdown()
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def train_tiny(tmp_path, tiny_policy_dir):
    """``train_tiny(*overrides, steps=2, prompts=3, group=2, max_new_tokens=12)``: a short ``tailspec train`` job
    on the tiny policy, without Ray unless an override says ``ray.use_ray=true``, in ``tmp_path / "run"``;
    asserts exit code 0 and returns the run folder. ``overrides``: more ``key=value`` settings."""
    from services.pipeline.cli import main

    def train(*overrides: str, steps: int = 2, prompts: int = 3, group: int = 2, max_new_tokens: int = 12):
        run = tmp_path / "run"
        args = [
            f"model.path={tiny_policy_dir}",
            f"trainer.steps={steps}",
            f"trainer.prompts_per_step={prompts}",
            f"trainer.group_size={group}",
            f"rollout.max_new_tokens={max_new_tokens}",
            "ray.use_ray=false",
        ]
        assert main(["train", "--run-dir", str(run), *args, *overrides]) == 0
        return run

    return train


@pytest.fixture(scope="session")
def tiny_policy_dir(tmp_path_factory):
    """A tiny random policy folder (HF format, real BPE tokenizer trained on a GSM8K slice) for fast tests."""
    from services.pipeline.base_model import save_tokenizer, train_tokenizer
    from services.pipeline.datasets import format_prompt, format_response, load_gsm8k

    out = tmp_path_factory.mktemp("tiny_policy")
    ex = load_gsm8k(GSM8K_DIR / "train.jsonl")[:300]
    tok = train_tokenizer([format_prompt(e.question) + format_response(e.answer) for e in ex], 320)
    save_tokenizer(tok, out, 512)
    cfg = tiny_config(vocab_size=320, eos_token_id=0, pad_token_id=0)
    init_weights(Transformer(cfg), seed=0, std=0.05).save_pretrained(out)
    return out
