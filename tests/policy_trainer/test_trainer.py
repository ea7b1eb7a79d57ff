"""PolicyTrainer on a tiny random Qwen2 Transformer (services/policy_trainer/trainer.py)."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from services.common.config import TrainerConfig
from services.policy_trainer.grpo import grpo_loss, token_logprobs
from services.policy_trainer.trainer import PolicyTrainer, RolloutSample
from services.rollout_actor.model import ModelConfig, Transformer, init_weights

REPO = Path(__file__).resolve().parents[2]

TINY = dict(
    architecture="Qwen2ForCausalLM",
    vocab_size=64,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=2,
    head_dim=32,
    tie_word_embeddings=True,
    max_position_embeddings=128,
)


def tiny_model(seed: int = 0) -> Transformer:
    return init_weights(Transformer(ModelConfig(**TINY)), seed=seed, std=0.1)


def cfg(**kw) -> TrainerConfig:
    base = dict(lr=1e-3, micro_batch_size=2, updates_per_step=1, max_grad_norm=1.0, clip_eps=0.2)
    base.update(kw)
    return TrainerConfig(**base)


SAMPLES = [
    RolloutSample([1, 2, 3], [10, 11, 12, 13], 1.0),
    RolloutSample([1, 2], [20, 21], -1.0),
    RolloutSample([5], [30, 31, 32, 33, 34], 0.5),
]


@torch.no_grad()
def response_logprob(model: Transformer, s: RolloutSample) -> float:
    seq = torch.tensor([s.prompt_ids + s.response_ids])
    lp = token_logprobs(model(seq[:, :-1]).logits, seq[:, 1:])
    return float(lp[0, len(s.prompt_ids) - 1 :].sum())


def signal_params(state: dict) -> list[str]:
    """Parameter names whose gradient is not identically zero. The k_proj bias adds q.b to every score of a
    query, a constant that softmax cancels: its exact gradient is 0, so its computed gradient is pure
    round-off, which Adam blows up to a full +-lr step of arbitrary sign. Comparisons of two runs skip it."""
    return [k for k in state if not k.endswith("self_attn.k_proj.bias")]


def weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_torch_step_changes_weights_and_version():
    model = tiny_model()
    before = weights(model)
    tr = PolicyTrainer(model, cfg())
    stats = tr.train_step(SAMPLES)
    assert tr.version == 1 and stats["version"] == 1
    changed = [k for k in before if not torch.equal(before[k], model.state_dict()[k])]
    assert len(changed) == len(before)
    for key in ("loss", "clip_fraction", "kl_mean", "grad_norm", "tokens", "seconds"):
        assert key in stats
    # first (only) pass: ratio exactly 1 -> nothing clipped
    assert stats["ratio_mean"] == pytest.approx(1.0, abs=1e-6) and stats["clip_fraction"] == 0.0
    assert stats["grad_norm"] > 0


def test_positive_advantage_raises_logprob_negative_lowers_it():
    model = tiny_model()
    pos, neg = RolloutSample([1, 2, 3], [7, 8, 9, 10], 1.0), RolloutSample([4, 5], [11, 12, 13], -1.0)
    tr = PolicyTrainer(model, cfg(lr=3e-3))
    lp_pos, lp_neg = [response_logprob(model, pos)], [response_logprob(model, neg)]
    for _ in range(4):
        tr.train_step([pos, neg])
        lp_pos.append(response_logprob(model, pos))
        lp_neg.append(response_logprob(model, neg))
    assert all(b > a for a, b in zip(lp_pos, lp_pos[1:])), lp_pos
    assert all(b < a for a, b in zip(lp_neg, lp_neg[1:])), lp_neg
    assert tr.version == 4


def test_mask_covers_response_tokens_only():
    tr = PolicyTrainer(tiny_model(), cfg())
    inputs, targets, mask, lengths, adv = tr._build_batch(SAMPLES)
    # T = longest sequence (3 + 4) - 1 = 6; target j predicts token j + 1
    assert inputs.shape == targets.shape == mask.shape == (3, 6)
    assert mask.tolist() == [
        [0, 0, 1, 1, 1, 1],  # prompt 3 tokens: targets 2..5 are the 4 response tokens
        [0, 1, 1, 0, 0, 0],  # prompt 2, response 2, then padding
        [1, 1, 1, 1, 1, 0],  # prompt 1, response 5, then padding
    ]
    assert targets[0, 2:].tolist() == [10, 11, 12, 13] and lengths.tolist() == [7 - 1, 4 - 1, 6 - 1]
    # changing the targets at prompt (and padding) positions does not change the loss
    model = tr.model
    logits = model(inputs).logits
    old = token_logprobs(logits, targets).detach()
    loss, _ = grpo_loss(token_logprobs(logits, targets), old, adv, mask, 0.2)
    scrambled = torch.where(mask.bool(), targets, (targets + 17) % 64)
    assert not torch.equal(scrambled, targets)
    loss2, _ = grpo_loss(token_logprobs(logits, scrambled), old, adv, mask, 0.2)
    assert loss2.item() == loss.item()


def test_first_pass_loss_is_token_mean_over_response_tokens():
    # ratio 1 on the first pass -> loss = -sum_n A_n * |response_n| / sum_n |response_n|
    # = -(1 * 4 + (-1) * 2 + 0.5 * 5) / 11 = -4.5 / 11; counting prompt tokens would change it
    tr = PolicyTrainer(tiny_model(), cfg(micro_batch_size=2))
    stats = tr.train_step(SAMPLES)
    assert stats["tokens"] == 11
    assert stats["loss"] == pytest.approx(-4.5 / 11, abs=1e-6)


def test_micro_batch_size_does_not_change_the_update():
    # gradient accumulation normalizes by the pass's total token count: 1, 2 or 3 sequences per micro-batch
    # give the same update (two passes, so shuffling and the second pass's ratios are exercised too)
    results = []
    for mb in (1, 2, 3):
        model = tiny_model()
        PolicyTrainer(model, cfg(micro_batch_size=mb, updates_per_step=2, lr=1e-2)).train_step(SAMPLES)
        results.append(weights(model))
    for other in results[1:]:
        for k in signal_params(other):
            # Adam normalizes each element's step to ~lr: allow 1% of one step for float round-off
            torch.testing.assert_close(other[k], results[0][k], rtol=0, atol=1e-4)


def test_kl_to_reference_zero_at_start_then_positive():
    model = tiny_model()
    tr = PolicyTrainer(model, cfg(kl_coef=0.1, lr=1e-2))  # reference: frozen copy of the initial policy
    assert tr.reference is not None and tr.reference is not model
    s1 = tr.train_step(SAMPLES)
    s2 = tr.train_step(SAMPLES)
    assert s1["kl_mean"] == pytest.approx(0.0, abs=1e-7)
    assert s2["kl_mean"] > 0
    assert PolicyTrainer(tiny_model(), cfg()).reference is None  # kl_coef 0: no reference forward


def test_policy_state_dict_and_checkpoint(tmp_path):
    model = tiny_model()
    tr = PolicyTrainer(model, cfg())
    tr.train_step(SAMPLES)
    sd = tr.policy_state_dict()
    for k, v in model.state_dict().items():
        assert sd[k].device.type == "cpu" and not sd[k].requires_grad
        assert torch.equal(sd[k], v) and sd[k].data_ptr() != v.data_ptr()
    sd["model.norm.weight"].add_(1.0)  # a copy: the policy is untouched
    assert not torch.equal(sd["model.norm.weight"], model.model.norm.weight)
    tr.save_checkpoint(tmp_path / "ckpt")
    loaded = Transformer.from_pretrained(tmp_path / "ckpt")
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits)
    assert tr.optimizer_state()["optimizer_steps"] == 1


def test_bad_inputs():
    tr = PolicyTrainer(tiny_model(), cfg())
    with pytest.raises(ValueError):
        tr.train_step([])
    with pytest.raises(ValueError):
        tr.train_step([RolloutSample([1, 2], [], 1.0)])
    with pytest.raises(ValueError):
        PolicyTrainer(tiny_model(), cfg(backend="jax"))


# DeepSpeed runs in a subprocess: it initializes a torch.distributed group and sets MASTER_ADDR/PORT, RANK,
# WORLD_SIZE, LOCAL_RANK in the environment, which must not leak into the other tests of the run.
_DS_SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    t0 = time.perf_counter()
    import torch
    sys.path.insert(0, sys.argv[1])
    from tests.policy_trainer.test_trainer import SAMPLES, cfg, tiny_model, weights
    from services.policy_trainer.trainer import PolicyTrainer

    out = {}
    for backend in ("torch", "deepspeed"):
        model = tiny_model()
        before = weights(model)
        tr = PolicyTrainer(model, cfg(backend=backend, zero_stage=1, micro_batch_size=2, lr=1e-2))
        stats = tr.train_step(SAMPLES)
        after = weights(model)
        out[backend] = {"changed": sum(not torch.equal(before[k], after[k]) for k in before),
                        "total": len(before), "stats": stats, "state": tr.optimizer_state()["optimizer_steps"],
                        "w": {k: v.flatten()[:64].tolist() for k, v in after.items()}}
    out["seconds"] = time.perf_counter() - t0
    print("RESULT " + json.dumps(out))
    """
)


def test_deepspeed_zero1_step_runs_and_matches_torch(tmp_path):
    pytest.importorskip("deepspeed")
    env = dict(os.environ)
    for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(key, None)
    proc = subprocess.run(
        [sys.executable, "-c", _DS_SCRIPT, str(REPO)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT ") :])
    ds, ref = out["deepspeed"], out["torch"]
    assert ds["changed"] == ds["total"] and ds["state"] == 1
    assert ds["stats"]["loss"] == pytest.approx(ref["stats"]["loss"], abs=1e-6)
    assert ds["stats"]["grad_norm"] == pytest.approx(ref["stats"]["grad_norm"], rel=1e-4)
    for k in signal_params(ref["w"]):  # same AdamW step on the same gradients
        w = ref["w"][k]
        assert ds["w"][k] == pytest.approx(w, abs=1e-5), k
