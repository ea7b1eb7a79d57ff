"""EAGLE drafter: the draft head, its chains and dynamic trees, the trainer, checkpoints, and the engine.

* shapes and sharing: the embedding and LM head are the target's own objects and get no gradient;
* chains and trees obey the ``DraftTree`` invariants, and every node's token/probability equals what the
  head computes along that node's path alone (so the batched tree attention mask is right);
* EAGLE-3 fusion of three target layers, also picked out of a larger engine ``hidden_layers`` set;
* save/load in the vLLM/SGLang EAGLE layout round-trips to identical proposals;
* warm-up on a tiny random target's own greedy outputs lifts held-out top-1 agreement from chance (1/64)
  to many times chance; plugged into the engine, greedy output equals plain decoding and drafts are accepted.

Run: ``python -m pytest tests/rollout_actor/test_eagle.py -q``
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from services.rollout_actor.engine import Engine, GenerationRequest, SamplingParams
from services.rollout_actor.model import ModelLoadError, Transformer, init_weights
from services.rollout_actor.speculative.base import DraftRequest
from services.rollout_actor.speculative.eagle import EagleDrafter
from services.rollout_actor.speculative.eagle_checkpoint import load_eagle_checkpoint, save_eagle_checkpoint
from services.rollout_actor.speculative.eagle_model import EagleConfig, EagleDraftModel, default_fuse_layers
from services.rollout_actor.speculative.eagle_train import EagleBatch, EagleTrainer, record_features, warmup
from services.rollout_actor.speculative.strategy import FixedStrategy, Strategy
from tests.conftest import tiny_config

V = 64
TARGET_STD = 0.15  # a random target whose greedy text is neither constant nor chaotic (bigram acc ~0.4)


def _target(layers: int = 2, std: float = TARGET_STD, seed: int = 0) -> Transformer:
    return init_weights(Transformer(tiny_config(num_hidden_layers=layers)), seed=seed, std=std).eval()


def _greedy(target, prompts, n_new, **engine_kw):
    eng = Engine(target, max_batch_size=64, max_seq_len=64, eos_token_ids=[], **engine_kw)
    reqs = [
        GenerationRequest(str(i), p, SamplingParams(0.0, max_new_tokens=n_new)) for i, p in enumerate(prompts)
    ]
    return eng.generate(reqs)


def _prompts(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(2, V, (4,), generator=g).tolist() for _ in range(n)]


def _requests(target, layers, n=4, seed=0, hidden_none=()):
    """DraftRequests with real target hidden states at the root (rows = ``layers``)."""
    out = []
    for i, p in enumerate(_prompts(n, seed=seed + 7)):
        with torch.no_grad():
            o = target(torch.tensor([p]), hidden_layers=layers)
        hs = [o.hidden[j][0, -2] for j in layers]  # state at the position that produced the root p[-1]
        h = hs[0] if len(hs) == 1 else torch.stack(hs)
        out.append(DraftRequest(str(i), "p", p, 3, None if i in hidden_none else h))
    return out


def _path_dist(drafter: EagleDrafter, req: DraftRequest, path: list[int]) -> torch.Tensor:
    """log q at the end of ``path`` (draft tokens below the root), recomputed as a plain causal chain."""
    m = drafter.model
    hid = drafter._request_hidden(req.hidden).unsqueeze(0)
    f = m.fuse(hid)  # [1, H]
    toks = [req.token_ids[-1]] + path
    embeds, feats = [], [f]
    with torch.no_grad():
        for d in range(len(toks)):
            embeds.append(drafter.embed_tokens(torch.tensor([toks[d]])))
            h = m(torch.stack(embeds, 1), torch.stack(feats, 1))[:, -1]
            feats.append(h)
        logits = drafter.lm_head(m.head_input(h))[0].float()
    t = m.config.temperature
    return torch.log_softmax(logits / (t if t > 0 else 1.0), -1)


def _check_tree(tree, k, width, depth_limit):
    n = len(tree)
    assert n <= k
    assert len(tree.parents) == n
    assert all(-1 <= p < i for i, p in enumerate(tree.parents))
    kids: dict[int, list[int]] = {}
    for i, p in enumerate(tree.parents):
        kids.setdefault(p, []).append(i)
    assert all(len(c) <= width for c in kids.values())
    if n:
        assert max(tree.depths()) <= depth_limit
    return kids


def _path(tree, i):
    out = []
    while i >= 0:
        out.append(tree.tokens[i])
        i = tree.parents[i]
    return out[::-1]


# ------------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def trained():
    """A 2-layer random target, its greedy outputs, and an EAGLE-1 head warmed up on them (once)."""
    torch.manual_seed(0)
    target = _target()
    outs = _greedy(target, _prompts(136), 28)
    seqs = [o.prompt_ids + o.token_ids for o in outs]
    model = EagleDraftModel(target.config, EagleConfig(seed=3))
    held = record_features(target, seqs[120:])
    before = EagleTrainer(model, target).evaluate(held.batch(torch.arange(len(held))))
    tr = warmup(target, seqs[:120], steps=160, model=model, batch_size=16, lr=3e-3, train_depth=2)
    after = tr.evaluate(held.batch(torch.arange(len(held))))
    return target, tr, before, after


# ------------------------------------------------------------------------------------------ model
def test_shapes_and_frozen_shared_embedding_and_head():
    target = _target()
    drafter = EagleDrafter(target)
    m = drafter.model
    assert drafter.embed_tokens is target.model.embed_tokens and drafter.lm_head is target.lm_head
    assert drafter.required_hidden_layers == (target.config.num_hidden_layers,)
    target_ptrs = {p.data_ptr() for p in target.parameters()}
    assert not any(p.data_ptr() in target_ptrs for p in m.parameters())  # nothing shared, nothing copied in
    names = set(m.state_dict())
    assert "fc.weight" in names and "layers.0.post_attention_layernorm.weight" in names
    assert not any("embed" in k or "lm_head" in k or "input_layernorm" in k for k in names)
    h = target.config.hidden_size
    assert m.fc.weight.shape == (h, 2 * h) and m.fc.bias is None
    out = m(torch.randn(3, 5, h), torch.randn(3, 5, h))
    assert out.shape == (3, 5, h)
    # a train step moves the head and leaves the target alone
    before = {k: v.clone() for k, v in target.state_dict().items()}
    head_before = m.fc.weight.detach().clone()
    tokens = torch.randint(0, V, (2, 6))
    with torch.no_grad():
        feats = target(tokens, hidden_layers=(2,)).hidden[2]
    stats = EagleTrainer(m, target, lr=1e-2).train_step((tokens, feats, torch.ones(2, 6, dtype=torch.bool)))
    assert set(stats) >= {"loss", "feature_loss", "ce_loss", "top1", "top1_by_depth", "tokens"}
    assert all(p.grad is None for p in target.parameters())
    assert all(torch.equal(v, before[k]) for k, v in target.state_dict().items())
    assert not torch.equal(m.fc.weight, head_before)


def test_config_validation():
    with pytest.raises(ValueError):
        EagleConfig(fuse_layers=(2, 1, 3))
    with pytest.raises(ValueError):
        EagleConfig(temperature=-1.0)
    with pytest.raises(ValueError):
        EagleDraftModel(tiny_config(), EagleConfig(fuse_layers=(0, 1, 5)))
    assert default_fuse_layers(32) == (1, 15, 28)  # inputs of layers (2, 16, 29), EAGLE-3's choice
    assert default_fuse_layers(2) == (0, 1, 2)
    with pytest.raises(ValueError):
        EagleDrafter(_target(), hidden_layers=(0, 1))  # lacks the final state the EAGLE-1 head reads


# ------------------------------------------------------------------------------------------ drafts
def test_chain_greedy_matches_path_recompute_and_respects_budgets():
    target = _target()
    drafter = EagleDrafter(target, EagleDraftModel(target.config, EagleConfig(seed=5)))
    reqs = _requests(target, (2,), n=5, hidden_none=(3,))
    budgets = [4, 0, 1, 5, 6]
    trees = drafter.propose(reqs, budgets, width=1, depth=0)
    assert [len(t) for t in trees] == [4, 0, 1, 0, 6]  # request 3 has no hidden state
    for r, t, k in zip(reqs, trees, budgets):
        _check_tree(t, k, 1, k)
        assert t.is_chain() and t.probs is None
        logp_sum = 0.0
        for i in range(len(t)):
            lq = _path_dist(drafter, r, t.tokens[:i])
            assert t.tokens[i] == int(lq.argmax())
            logp_sum += float(lq[t.tokens[i]])
        if len(t):
            assert t.score > 0
    again = drafter.propose(reqs, budgets, width=1, depth=0)
    assert [t.tokens for t in again] == [t.tokens for t in trees]  # deterministic
    capped = drafter.propose(reqs, budgets, width=1, depth=2)
    assert all(
        len(c) == min(2, len(t)) and c.tokens == t.tokens[:2] for c, t in zip(capped, trees) if t.tokens
    )


@pytest.mark.parametrize("width,depth,budget", [(2, 3, 6), (3, 0, 8), (4, 2, 20), (2, 4, 3)])
def test_dynamic_tree_invariants(width, depth, budget):
    target = _target()
    drafter = EagleDrafter(target, EagleDraftModel(target.config, EagleConfig(seed=11)))
    reqs = _requests(target, (2,), n=3, seed=width)
    budgets = [budget, max(1, budget // 2), budget]
    trees = drafter.propose(reqs, budgets, width=width, depth=depth)
    for r, t, k in zip(reqs, trees, budgets):
        limit = min(k, depth or k)
        kids = _check_tree(t, k, width, limit)
        assert t.probs is None and len(t) == min(k, _pool_size(width, limit))
        for sibs in kids.values():
            toks = [t.tokens[i] for i in sibs]
            assert len(set(toks)) == len(toks)  # distinct siblings: the point-mass rule applies
        # every node is among its parent's top-`width` tokens, siblings in decreasing probability
        cums = []
        for i in range(len(t)):
            p = t.parents[i]
            lq = _path_dist(drafter, r, _path(t, p) if p >= 0 else [])
            top = lq.topk(width).indices.tolist()
            assert t.tokens[i] in top
            cums.append((cums[p] if p >= 0 else 0.0) + float(lq[t.tokens[i]]))
        for sibs in kids.values():
            assert [cums[i] for i in sibs] == sorted((cums[i] for i in sibs), reverse=True)
        assert t.score == pytest.approx(sum(torch.tensor(cums).exp().tolist()), rel=1e-4)
        assert len(t) == 0 or len(kids[-1]) == min(width, len(t))  # the root's best children come first


def _pool_size(width, depth):
    return width + (depth - 1) * width * width


def test_sampled_drafts_report_q_and_iid_siblings():
    target = _target()
    drafter = EagleDrafter(target, EagleDraftModel(target.config, EagleConfig(temperature=0.8, seed=2)))
    reqs = _requests(target, (2,), n=3)
    for width, depth in [(1, 0), (3, 2)]:
        trees = drafter.propose(reqs, [5, 5, 2], width=width, depth=depth)
        for r, t, k in zip(reqs, trees, [5, 5, 2]):
            _check_tree(t, k, width, depth or k)
            assert t.iid_siblings and t.probs.shape == (len(t), V) and t.probs.dtype == torch.float32
            assert torch.allclose(t.probs.sum(-1), torch.ones(len(t)), atol=1e-5)
            for i in range(len(t)):
                p = t.parents[i]
                q = _path_dist(drafter, r, _path(t, p) if p >= 0 else []).exp()
                assert torch.allclose(t.probs[i], q, atol=1e-5)
                assert t.probs[i, t.tokens[i]] > 0


def test_eagle3_fusion_of_three_layers():
    target = _target(layers=4)
    cfg = EagleConfig(fuse_layers=(0, 1, 2), seed=4)
    model = EagleDraftModel(target.config, cfg)
    h = target.config.hidden_size
    assert model.fc.weight.shape == (h, 3 * h) and model.layers[0].self_attn.q_proj.weight.shape[1] == 2 * h
    assert {"layers.0.hidden_norm.weight", "layers.0.input_layernorm.weight", "norm.weight"} <= set(
        model.state_dict()
    )
    drafter = EagleDrafter(target, model)
    assert drafter.required_hidden_layers == (0, 1, 2)
    reqs = _requests(target, (0, 1, 2), n=3)
    assert reqs[0].hidden.shape == (3, h)
    trees = drafter.propose(reqs, [4, 4, 4], width=2, depth=2)
    for r, t in zip(reqs, trees):
        _check_tree(t, 4, 2, 2)
        assert len(t) == 4 and t.tokens[0] == int(_path_dist(drafter, r, []).argmax())
    # the engine may keep more layers than the head reads: rows are picked by index
    wide = EagleDrafter(target, model, hidden_layers=(0, 1, 2, 4))
    reqs_wide = _requests(target, (0, 1, 2, 4), n=3)
    assert [t.tokens for t in wide.propose(reqs_wide, [4] * 3, 2, 2)] == [t.tokens for t in trees]
    # a train step on [N, T, 3, H] features with the final state for the token targets
    tokens = torch.randint(0, V, (2, 7))
    data = record_features(target, tokens, model.feature_layers)
    assert data.features.shape == (2, 7, 3, h) and data.final.shape == (2, 7, h)
    stats = EagleTrainer(model, target).train_step(data.batch(torch.arange(2)))
    assert stats["feature_loss"] == 0.0 and stats["ce_loss"] > 0
    with pytest.raises(ValueError):
        EagleTrainer(model, target).train_step((data.tokens, data.features, data.mask))  # no final states
    # greedy engine output is unchanged with the EAGLE-3 head
    prompts = _prompts(3, seed=9)
    plain = _greedy(target, prompts, 10)
    spec = _greedy(
        target,
        prompts,
        10,
        drafters={"learned": drafter},
        selector=FixedStrategy(Strategy("learned", 4, 2, 2)),
        hidden_layers=(0, 1, 2),
    )
    assert [o.token_ids for o in spec] == [o.token_ids for o in plain]


# ------------------------------------------------------------------------------------------ checkpoints
@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_eagle1_checkpoint_roundtrip(tmp_path, engine):
    target = _target()
    model = EagleDraftModel(target.config, EagleConfig(seed=8))
    save_eagle_checkpoint(model, tmp_path, target, engine=engine)
    cfg = json.loads((tmp_path / "config.json").read_text())
    keys = set(load_file(tmp_path / "model.safetensors"))
    want = {
        "fc.weight",
        "layers.0.self_attn.q_proj.weight",
        "layers.0.self_attn.k_proj.weight",
        "layers.0.self_attn.v_proj.weight",
        "layers.0.self_attn.o_proj.weight",
        "layers.0.mlp.gate_proj.weight",
        "layers.0.mlp.up_proj.weight",
        "layers.0.mlp.down_proj.weight",
        "layers.0.post_attention_layernorm.weight",
    }
    if engine == "vllm":
        assert keys == want and cfg["architectures"] == ["LlamaForCausalLM"] and cfg["bias"] is False
    else:
        assert keys == want | {"fc.bias"} and cfg["architectures"] == ["LlamaForCausalLMEagle"]
    assert cfg["num_hidden_layers"] == 1 and cfg["model_type"] == "llama"
    assert cfg["hidden_size"] == target.config.hidden_size and cfg["vocab_size"] == V
    loaded = load_eagle_checkpoint(tmp_path, target)
    assert loaded.config == model.config
    reqs = _requests(target, (2,), n=3)
    a = EagleDrafter(target, model).propose(reqs, [6] * 3, 2, 3)
    b = EagleDrafter(target, loaded).propose(reqs, [6] * 3, 2, 3)
    assert [(t.tokens, t.parents) for t in a] == [(t.tokens, t.parents) for t in b]


def test_eagle3_checkpoint_roundtrip_and_foreign_layout(tmp_path):
    target = _target(layers=4)
    model = EagleDraftModel(target.config, EagleConfig(fuse_layers=(0, 1, 2), seed=6))
    save_eagle_checkpoint(model, tmp_path / "ours", target)
    cfg = json.loads((tmp_path / "ours" / "config.json").read_text())
    st = load_file(tmp_path / "ours" / "model.safetensors")
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["draft_vocab_size"] == V
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [
        1,
        2,
        3,
    ]  # vLLM: index of the layer whose input is taken
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    assert {
        "fc.weight",
        "midlayer.hidden_norm.weight",
        "midlayer.input_layernorm.weight",
        "norm.weight",
    } <= set(st)
    assert torch.equal(st["lm_head.weight"], target.lm_head.weight.detach())
    assert not any(k.startswith("layers.") for k in st)
    reqs = _requests(target, (0, 1, 2), n=2)
    ref = [t.tokens for t in EagleDrafter(target, model).propose(reqs, [5, 5], 2, 3)]
    loaded = load_eagle_checkpoint(tmp_path / "ours", target)
    assert [t.tokens for t in EagleDrafter(target, loaded).propose(reqs, [5, 5], 2, 3)] == ref
    # a foreign checkpoint: "model." prefixes, pytorch_model.bin, no tailspec block
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    torch.save({"model." + k: v for k, v in st.items()}, foreign / "pytorch_model.bin")
    cfg.pop("tailspec_eagle")
    (foreign / "config.json").write_text(json.dumps(cfg))
    f_loaded = load_eagle_checkpoint(foreign, target)
    assert f_loaded.config.fuse_layers == (0, 1, 2)
    assert [t.tokens for t in EagleDrafter(target, f_loaded).propose(reqs, [5, 5], 2, 3)] == ref
    # what cannot be exported / loaded
    with pytest.raises(ValueError):
        save_eagle_checkpoint(
            EagleDraftModel(target.config, EagleConfig(fuse_layers=(0, 2, 4))), tmp_path / "x", target
        )
    bad = _target(layers=4)
    bad.config.hidden_size = 96
    with pytest.raises(ModelLoadError):
        load_eagle_checkpoint(tmp_path / "ours", bad)
    with pytest.raises(ModelLoadError):
        load_eagle_checkpoint(tmp_path / "missing", target)


def _rms(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _attn_one_token(st, pre, x, heads=2, kv=1):
    """Attention over a single position is o_proj(v) (GQA: each kv head serves heads // kv query heads)."""
    v = x @ st[pre + "self_attn.v_proj.weight"].T
    v = v.view(-1, kv, v.shape[-1] // kv).repeat_interleave(heads // kv, 1).flatten(1)
    return v @ st[pre + "self_attn.o_proj.weight"].T


def _mlp(st, pre, x):
    g, u = x @ st[pre + "mlp.gate_proj.weight"].T, x @ st[pre + "mlp.up_proj.weight"].T
    return (torch.nn.functional.silu(g) * u) @ st[pre + "mlp.down_proj.weight"].T


def test_saved_weights_follow_vllm_eagle_forward(tmp_path):
    """Re-derive one draft step from the saved tensors alone, wired as vLLM's llama_eagle.py and
    llama_eagle3.py wire them (one position, so attention reduces to o_proj(v) and rotary drops out)."""
    target = _target(layers=4)
    e = torch.randn(3, 64)
    for fl in (None, (0, 1, 2)):
        model = EagleDraftModel(target.config, EagleConfig(fuse_layers=fl, seed=12))
        with torch.no_grad():  # non-trivial norm weights, so a swapped norm would show
            for name, p in model.named_parameters():
                if "norm" in name:
                    p.uniform_(0.5, 1.5)
        save_eagle_checkpoint(model, tmp_path / str(fl), target)
        st = load_file(tmp_path / str(fl) / "model.safetensors")
        with torch.no_grad():
            if fl is None:
                f = torch.randn(3, 64)
                x = (
                    torch.cat((e, f), -1) @ st["fc.weight"].T
                )  # EAGLE-1: fc(cat(embed, hidden)), no input norm
                r = x + _attn_one_token(st, "layers.0.", x)
                ref = r + _mlp(st, "layers.0.", _rms(r, st["layers.0.post_attention_layernorm.weight"]))
                ref_logits = ref @ target.lm_head.weight.T
            else:
                aux = torch.randn(3, 3, 64)
                f = aux.flatten(1) @ st["fc.weight"].T  # EAGLE-3: fc over the aux states in layer order
                x = torch.cat(
                    (
                        _rms(e, st["midlayer.input_layernorm.weight"]),
                        _rms(f, st["midlayer.hidden_norm.weight"]),
                    ),
                    -1,
                )
                r = f + _attn_one_token(st, "midlayer.", x)
                ref = r + _mlp(st, "midlayer.", _rms(r, st["midlayer.post_attention_layernorm.weight"]))
                ref_logits = _rms(ref, st["norm.weight"]) @ st["lm_head.weight"].T
                f = model.fuse(aux)
            h = model(e.unsqueeze(1), f.unsqueeze(1))[:, 0]
            logits = torch.nn.functional.linear(model.head_input(h), target.lm_head.weight)
        assert torch.allclose(h, ref, atol=1e-5) and torch.allclose(logits, ref_logits, atol=1e-4)


def test_drafter_state_dict_roundtrip():
    target = _target()
    a = EagleDrafter(target, EagleDraftModel(target.config, EagleConfig(seed=1)))
    b = EagleDrafter(target, EagleDraftModel(target.config, EagleConfig(seed=2)))
    b.load_state_dict(a.state_dict())
    reqs = _requests(target, (2,), n=2)
    assert [t.tokens for t in a.propose(reqs, [4, 4])] == [t.tokens for t in b.propose(reqs, [4, 4])]


# ------------------------------------------------------------------------------------------ training
def test_trainer_batch_formats_contexts_and_inference_tensors():
    target = _target()
    tokens = torch.randint(0, V, (3, 8))
    mask = torch.ones(3, 8, dtype=torch.bool)
    mask[2, 5:] = False
    with torch.inference_mode():  # what the engine's hidden sink hands over
        feats = target(tokens, hidden_layers=(2,)).hidden[2]
    for ctx, depth in [("chain", 3), ("prefix", 1)]:
        tr = EagleTrainer(EagleDraftModel(target.config), target, context=ctx, train_depth=depth)
        s1 = tr.train_step({"tokens": tokens, "features": feats, "mask": mask})
        s2 = tr.train_step(EagleBatch(tokens, feats, mask))
        assert len(s1["top1_by_depth"]) == depth and s2["step"] == 2
        assert s1["tokens"] == 2 * 7 + 4  # (t, t+1) pairs inside the mask
        assert all(
            torch.isfinite(torch.tensor(s[k])) for s in (s1, s2) for k in ("loss", "feature_loss", "ce_loss")
        )
    with pytest.raises(ValueError):
        EagleTrainer(EagleDraftModel(target.config), target, context="prefix", train_depth=2)


def test_warmup_raises_top1_agreement_far_above_chance(trained):
    _, tr, before, after = trained
    chance = 1.0 / V
    assert before["top1"] < 3 * chance  # an untrained head is at chance level
    assert after["top1"] > 8 * chance and after["top1"] > 4 * before["top1"]  # held-out sequences
    assert after["top1_by_depth"][1] > 4 * chance  # the unrolled second step learned too
    assert tr.history[-1]["loss"] < tr.history[0]["loss"]


def test_engine_greedy_identical_and_learned_drafts_accepted(trained):
    target, tr, _, _ = trained
    drafter = EagleDrafter(target, tr.model)
    L = target.config.num_hidden_layers
    prompts = _prompts(12, seed=5)
    plain = _greedy(target, prompts, 24)
    for strategy in (Strategy("learned", 4), Strategy("learned", 6, 2, 3)):
        spec = _greedy(
            target,
            prompts,
            24,
            drafters={"learned": drafter},
            selector=FixedStrategy(strategy),
            hidden_layers=(L,),
        )
        assert [o.token_ids for o in spec] == [o.token_ids for o in plain]
        accepted = sum(o.spec.accepted for o in spec)
        steps = sum(o.spec.verify_steps for o in spec)
        assert accepted > 0 and steps > 0
    # sampled requests also run through (losslessness of sampling is tested in test_engine_speculative.py)
    eng = Engine(
        target,
        max_batch_size=4,
        max_seq_len=64,
        eos_token_ids=[],
        drafters={"learned": drafter},
        selector=FixedStrategy(Strategy("learned", 3)),
        hidden_layers=(L,),
    )
    outs = eng.generate(
        [
            GenerationRequest(str(i), p, SamplingParams(1.0, max_new_tokens=8, seed=i))
            for i, p in enumerate(prompts[:4])
        ]
    )
    assert all(len(o.token_ids) == 8 for o in outs)
