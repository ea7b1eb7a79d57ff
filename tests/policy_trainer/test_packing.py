"""The packed GRPO update (services/policy_trainer/packing.py) against the right-padded computation."""

import copy

import pytest
import torch

from services.common.config import TrainerConfig
from services.policy_trainer.grpo import grpo_loss, token_logprobs
from services.policy_trainer.packing import pack_samples, packed_logits
from services.policy_trainer.trainer import PolicyTrainer, RolloutSample
from services.rollout_actor.model import ModelConfig, Transformer, init_weights

GQA = dict(
    architecture="Qwen2ForCausalLM",
    vocab_size=97,
    hidden_size=48,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=6,
    num_key_value_heads=2,
    head_dim=8,
    tie_word_embeddings=True,
    max_position_embeddings=256,
)
QWEN3 = dict(GQA, architecture="Qwen3ForCausalLM", tie_word_embeddings=False)


def model_of(shape: dict, seed: int = 0) -> Transformer:
    return init_weights(Transformer(ModelConfig(**shape)), seed=seed, std=0.2)


def random_samples(seed: int, vocab: int = 97) -> list[RolloutSample]:
    """Groups of 1-5 responses sharing a prompt, lengths 1-40, plus the edge cases: an empty prompt, a
    one-token and an empty response, and a repeated prompt after other groups."""
    g = torch.Generator().manual_seed(seed)

    def ids(n):
        return torch.randint(1, vocab, (n,), generator=g).tolist()

    out = []
    prompts = []
    for _ in range(5):
        prompt = ids(int(torch.randint(1, 30, (1,), generator=g)))
        prompts.append(prompt)
        for _ in range(int(torch.randint(1, 6, (1,), generator=g))):
            resp = ids(int(torch.randint(1, 41, (1,), generator=g)))
            out.append(RolloutSample(prompt, resp, float(torch.randn(1, generator=g))))
    out.append(RolloutSample([], ids(7), 0.7))
    out.append(RolloutSample(ids(4), ids(1), -0.4))
    out.append(RolloutSample(ids(3), [], 0.9))
    out.append(RolloutSample(prompts[0], ids(12), -1.3))
    return out


def padded_response_logprobs(model: Transformer, samples) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference: right-padded ``prompt + response`` rows, one causal forward; returns the ``[N, T]``
    log-probs and the ``[N, T]`` mask of response targets (target j predicts token j + 1)."""
    seqs = [list(s.prompt_ids) + list(s.response_ids) for s in samples]
    t = max(len(s) for s in seqs) - 1
    inputs = torch.zeros(len(seqs), t, dtype=torch.long)
    targets = torch.zeros(len(seqs), t, dtype=torch.long)
    mask = torch.zeros(len(seqs), t)
    for i, (s, seq) in enumerate(zip(samples, seqs)):
        n = len(seq) - 1
        if n > 0:
            inputs[i, :n] = torch.tensor(seq[:-1])
            targets[i, :n] = torch.tensor(seq[1:])
            mask[i, max(len(s.prompt_ids) - 1, 0) : n] = 1.0
    return token_logprobs(model(inputs).logits, targets), mask


def grads(model) -> dict[str, torch.Tensor]:
    return {k: p.grad.detach().clone() for k, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("shape", [GQA, QWEN3], ids=["qwen2-gqa", "qwen3-qknorm-untied"])
@pytest.mark.parametrize("micro_batch_size", [3, 64])
def test_packed_loss_and_grads_equal_padded(shape, micro_batch_size):
    torch.manual_seed(0)
    samples = random_samples(seed=1, vocab=shape["vocab_size"])
    model = model_of(shape)
    # pi_old and pi_ref away from pi_theta, so ratios clip on both sides and the k3 term is nonzero
    old_model, ref_model = model_of(shape, seed=2), model_of(shape, seed=3)
    with torch.no_grad():
        old_pad, _ = padded_response_logprobs(old_model, samples)
        ref_pad, _ = padded_response_logprobs(ref_model, samples)

    model.zero_grad()
    lp, mask = padded_response_logprobs(model, samples)
    adv = torch.tensor([s.advantage for s in samples])
    loss_pad, st_pad = grpo_loss(lp, old_pad, adv, mask, 0.1, ref_logprobs=ref_pad, kl_coef=0.3)
    loss_pad.backward()
    g_pad = grads(model)
    assert 0 < st_pad["clip_fraction"] < 1 and st_pad["kl_mean"] > 0

    # packed: the same per-token quantities, looked up by (sample, response position)
    batches = pack_samples(samples, micro_batch_size)
    assert len(batches) == 1 if micro_batch_size == 64 else len(batches) > 1
    total = float(sum(b.num_tokens for b in batches))
    assert total == float(mask.sum())
    rows, cols = mask.nonzero(as_tuple=True)  # response targets in sample order, then position order
    old_of, ref_of = {}, {}
    for i in range(len(samples)):
        sel = rows == i
        old_of[i], ref_of[i] = old_pad[i, cols[sel]], ref_pad[i, cols[sel]]
    model.zero_grad()
    loss_packed = 0.0
    for b in batches:
        lp_b = token_logprobs(packed_logits(model, b).unsqueeze(0), b.targets.unsqueeze(0))[0]
        old_b = torch.cat([old_of[i] for i in b.sample_index.unique_consecutive().tolist()])
        ref_b = torch.cat([ref_of[i] for i in b.sample_index.unique_consecutive().tolist()])
        ones = torch.ones(b.num_tokens, 1)
        loss_b, _ = grpo_loss(
            lp_b[:, None], old_b[:, None], b.advantages, ones, 0.1, ref_b[:, None], 0.3, num_tokens=total
        )
        loss_b.backward()
        loss_packed += float(loss_b.detach())
    g_packed = grads(model)
    # float32 round-off of two summation orders: a few ulps of a ~4.4 loss (one ulp is 4.8e-7; kernels differ by
    # CPU model: 2.2e-6 on a Xeon); a wrong token or mask moves it by orders of magnitude more
    assert loss_packed == pytest.approx(float(loss_pad.detach()), rel=1e-6)
    assert g_packed.keys() == g_pad.keys()
    scale = max(float(g.abs().max()) for g in g_pad.values())
    for k in g_pad:  # float round-off: summation order differs (per-segment attention, another layout)
        torch.testing.assert_close(g_packed[k], g_pad[k], rtol=1e-4, atol=1e-5 * scale)


def test_packed_log_probs_equal_padded_per_token():
    samples = random_samples(seed=4)
    model = model_of(GQA)
    with torch.no_grad():
        lp, mask = padded_response_logprobs(model, samples)
        (b,) = pack_samples(samples, 1000)
        packed = token_logprobs(packed_logits(model, b).unsqueeze(0), b.targets.unsqueeze(0))[0]
    # packed order is group order (the last sample joins the first group); lp[mask] is sample order
    assert not torch.equal(b.sample_index, b.sample_index.sort().values)
    by_sample = packed[torch.argsort(b.sample_index, stable=True)]
    torch.testing.assert_close(by_sample, lp[mask.bool()], rtol=0, atol=2e-5)


def test_layout_shares_prompts_and_trains_response_tokens_only():
    s = [
        RolloutSample([1, 2, 3], [10, 11, 12], 1.0),
        RolloutSample([4, 5], [20], -1.0),
        RolloutSample([1, 2, 3], [30, 31], 0.5),
        RolloutSample([], [40, 41, 42], 2.0),  # nothing predicts 40: trains 41, 42
        RolloutSample([6], [], 3.0),  # nothing to train
    ]
    (b,) = pack_samples(s, 8)
    # group [1, 2, 3]: prompt once, then the blocks [10, 11] and [30]; [4, 5] (block empty); [40] + [41]
    assert b.input_ids.tolist() == [1, 2, 3, 10, 11, 30, 4, 5, 40, 41]
    assert b.positions.tolist() == [0, 1, 2, 3, 4, 3, 0, 1, 0, 1]
    assert b.targets.tolist() == [10, 11, 12, 30, 31, 20, 41, 42]
    # a response's first token is predicted at its prompt's last position, the rest inside its block
    assert b.logit_index.tolist() == [2, 3, 4, 2, 5, 7, 8, 9]
    assert b.sample_index.tolist() == [0, 0, 0, 2, 2, 1, 3, 3]
    assert b.advantages.tolist() == [1.0, 1.0, 1.0, 0.5, 0.5, -1.0, 2.0, 2.0]
    # a group larger than the micro-batch is split; each part carries its own copy of the prompt
    parts = pack_samples(s[:3], 1)
    assert [p.input_ids.tolist() for p in parts] == [[1, 2, 3, 10, 11], [1, 2, 3, 30], [4, 5]]
    assert pack_samples([RolloutSample([1], [], 1.0)], 4) == []


def padded_reference_step(model, samples, cfg: TrainerConfig, reference) -> tuple[float, float]:
    """The update the trainer documents, written the padded way: ``updates_per_step`` AdamW steps on the
    token-mean clipped loss + k3 KL, pi_old = the weights before the first step. Returns the loss and
    the pre-clip gradient norm, each averaged over the passes."""
    opt = torch.optim.AdamW(
        model.parameters(), lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay
    )
    adv = torch.tensor([s.advantage for s in samples])
    with torch.no_grad():
        old, _ = padded_response_logprobs(model, samples)
        ref, _ = padded_response_logprobs(reference, samples)
    losses, norms = [], []
    for _ in range(cfg.updates_per_step):
        opt.zero_grad()
        lp, mask = padded_response_logprobs(model, samples)
        loss, _ = grpo_loss(lp, old, adv, mask, cfg.clip_eps, ref_logprobs=ref, kl_coef=cfg.kl_coef)
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(list(model.parameters()), cfg.max_grad_norm)))
        losses.append(float(loss.detach()))
        opt.step()
    return sum(losses) / len(losses), sum(norms) / len(norms)


def test_trainer_update_equals_padded_reference_update():
    samples = random_samples(seed=5)
    cfg = TrainerConfig(
        lr=1e-2, micro_batch_size=4, updates_per_step=3, clip_eps=0.2, kl_coef=0.2, max_grad_norm=5.0
    )
    start = model_of(GQA)
    reference = model_of(GQA, seed=9)
    packed, padded = copy.deepcopy(start), copy.deepcopy(start)
    stats = PolicyTrainer(packed, cfg, reference=reference).train_step(samples)
    loss, grad_norm = padded_reference_step(padded, samples, cfg, reference)
    assert stats["passes"] == 3 and stats["kl_mean"] > 0
    # the loss and the gradient norm pin the update's scale (Adam's step is nearly scale-invariant)
    assert stats["loss"] == pytest.approx(loss, rel=1e-4, abs=1e-6)
    assert stats["grad_norm"] == pytest.approx(grad_norm, rel=1e-4)
    moved = 0
    for (k, a), b in zip(packed.state_dict().items(), padded.state_dict().values()):
        if k.endswith("k_proj.bias"):  # exact gradient 0 (softmax cancels it): its Adam step is round-off
            continue
        # 3 Adam steps move an element up to ~3 lr = 0.03. An element whose gradient is near round-off can take
        # another step in the other implementation (Adam divides by its small second moment), and which ones do
        # depends on the CPU's kernels (one of 2,304 on an AVX-512 Xeon, none on an AVX-only EPYC): all but 0.5%
        # of each tensor's elements agree within a tenth of the total movement, and none beyond the movement
        diff = (a - b).abs()
        assert (diff > 3e-3).float().mean() <= 0.005, (k, diff.max())
        assert diff.max() <= 3 * cfg.lr * 1.01, (k, diff.max())
        moved += int(not torch.equal(a, start.state_dict()[k]))
    assert moved > 0
