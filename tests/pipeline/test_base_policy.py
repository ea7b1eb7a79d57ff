"""The committed embedded default policy (services/pipeline/assets/base_policy) loads with transformers."""

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from services.pipeline.base_model import (
    EOS_TOKEN,
    EOS_TOKEN_ID,
    BaseModelRecipe,
    folder_size_bytes,
    sha256_file,
)
from services.pipeline.base_model_eval import evaluate_base_model, has_final_answer_format
from services.pipeline.datasets import default_dataset_dir, format_prompt, format_response, load_gsm8k

ASSET = Path(__file__).resolve().parents[2] / "services" / "pipeline" / "assets" / "base_policy"


@pytest.fixture(scope="module")
def recipe():
    return json.loads((ASSET / "recipe.json").read_text())


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(ASSET)


@pytest.fixture(scope="module")
def model():
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(ASSET, dtype=torch.float32).eval()


def test_files_present_and_small():
    for name in (
        "config.json",
        "model.safetensors",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "recipe.json",
        "eval.json",
    ):
        assert (ASSET / name).is_file(), name
    assert folder_size_bytes(ASSET) <= 10 * 1024 * 1024


def test_config(model, recipe):
    cfg = model.config
    assert cfg.model_type == "qwen2"
    assert cfg.architectures == ["Qwen2ForCausalLM"]
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    assert head_dim * cfg.num_attention_heads == cfg.hidden_size
    assert head_dim >= 32
    assert cfg.num_attention_heads % cfg.num_key_value_heads == 0
    assert cfg.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert cfg.eos_token_id == EOS_TOKEN_ID
    assert model.generation_config.eos_token_id == EOS_TOKEN_ID
    assert model.generation_config.pad_token_id == EOS_TOKEN_ID
    assert recipe["num_parameters"] == sum(p.numel() for p in model.parameters())
    # pre-transformers-5 spellings for older loaders (vLLM)
    raw = json.loads((ASSET / "config.json").read_text())
    assert raw["rope_theta"] == recipe["recipe"]["rope_theta"]
    assert raw["head_dim"] == head_dim


def test_tokenizer_round_trip(tokenizer, model):
    assert tokenizer.eos_token == EOS_TOKEN
    assert tokenizer.eos_token_id == EOS_TOKEN_ID
    assert tokenizer.pad_token_id == EOS_TOKEN_ID
    assert len(tokenizer) == model.config.vocab_size
    raw = json.loads((ASSET / "tokenizer_config.json").read_text())
    assert raw["tokenizer_class"] == "PreTrainedTokenizerFast"  # loadable by transformers 4.x too
    text = format_prompt("Natalia sold 48 clips, then half as many. Total?") + format_response(
        "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n48+24 = <<48+24=72>>72\n#### 72"
    )
    for s in (text, "ünïcödé ✓ 日本語 \t tabs  and   spaces\n\n", ""):
        ids = tokenizer(s).input_ids
        assert EOS_TOKEN_ID not in ids  # no BOS/EOS added
        assert tokenizer.decode(ids) == s
    # prompt + response tokenize to the concatenation of their separate tokenizations
    prompt = format_prompt("What is 2+3?")
    response = format_response("2+3=<<2+3=5>>5\n#### 5")
    assert (
        tokenizer(prompt + response).input_ids == tokenizer(prompt).input_ids + tokenizer(response).input_ids
    )
    assert tokenizer.decode([EOS_TOKEN_ID], skip_special_tokens=True) == ""


def test_forward_prefers_eos_after_final_answer(tokenizer, model):
    import torch

    text = format_prompt("Tom has 3 apples and buys 2 more. How many apples does he have?") + format_response(
        "Tom has 3+2=<<3+2=5>>5 apples.\n#### 5"
    )
    ids = torch.tensor([tokenizer(text).input_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, -1]
    assert int(logits.argmax()) == EOS_TOKEN_ID


def test_recipe_matches_data(recipe):
    train = default_dataset_dir() / "train.jsonl"
    if not train.is_file():
        pytest.skip(f"GSM8K not found at {train}")
    assert recipe["data"]["train_sha256"] == sha256_file(train)
    assert recipe["data"]["train_examples"] == len(load_gsm8k(train))
    for key in ("seed", "vocab_size", "hidden_size", "steps", "lr", "batch_size"):
        assert key in recipe["recipe"]
    assert recipe["training"]["final_loss"] > 0
    assert recipe["training"]["train_seconds"] > 0


def test_committed_eval(recipe):
    ev = json.loads((ASSET / "eval.json").read_text())
    assert ev["n"] == 200
    assert ev["temperature"] == 0.9
    assert ev["max_new_tokens"] == recipe["recommended_max_new_tokens"]
    assert ev["format_rate"] >= 0.8


@pytest.mark.parametrize(
    "text, ok",
    [
        ("so 5 apples.\n#### 5", True),
        ("#### 1,000.50 \n", True),
        ("#### $12", True),
        ("#### -4", True),
        ("#### 5 apples", False),
        ("#### ", False),
        ("no answer", False),
        ("#### 5\nmore", False),
    ],
)
def test_has_final_answer_format(text, ok):
    assert has_final_answer_format(text) is ok


@pytest.mark.slow
def test_format_rate_200_samples():
    ev = evaluate_base_model(ASSET, n=200, temperature=0.9, seed=1, progress=False)
    assert ev["format_rate"] >= 0.8


def test_code_defaults_reproduce_committed_recipe(recipe):
    assert recipe["recipe"] == asdict(BaseModelRecipe())
