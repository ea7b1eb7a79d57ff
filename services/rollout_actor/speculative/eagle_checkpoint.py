"""EAGLE draft-head checkpoints (``save_eagle_checkpoint`` / ``load_eagle_checkpoint``).

Contract
--------
* Checkpoints (``save_eagle_checkpoint`` / ``load_eagle_checkpoint``): a folder with ``config.json`` +
  ``model.safetensors`` in the layout of the public EAGLE checkpoints that vLLM and SGLang load; see
  ``save_eagle_checkpoint`` for the exact keys and what was (and was not) verified.
"""

from __future__ import annotations

import json
import logging
import os

import torch
from safetensors.torch import load_file, save_file

from services.rollout_actor.model import ModelConfig, ModelLoadError, Transformer
from services.rollout_actor.speculative.eagle_model import EagleConfig, EagleDraftModel, default_fuse_layers

log = logging.getLogger(__name__)

EAGLE1_ARCH_VLLM = (
    "LlamaForCausalLM"  # vLLM's EAGLEConfig turns it into EagleLlamaForCausalLM (method "eagle")
)
EAGLE1_ARCH_SGLANG = "LlamaForCausalLMEagle"  # SGLang's EAGLE-1 draft class
EAGLE3_ARCH = "LlamaForCausalLMEagle3"  # registered by both vLLM (-> Eagle3LlamaForCausalLM) and SGLang


# ---------------------------------------------------------------------------------------------- checkpoints
def save_eagle_checkpoint(
    model: EagleDraftModel,
    path: str | os.PathLike,
    target: Transformer | ModelConfig,
    engine: str = "vllm",
    include_embeddings: bool = False,
) -> None:
    """Write the draft head as an EAGLE checkpoint folder: ``config.json`` + ``model.safetensors``.

    Layout (draft layer = a 1-layer Llama, the layout of SafeAILab's EAGLE checkpoints):

    * EAGLE-1, ``engine="vllm"``: ``architectures ["LlamaForCausalLM"]`` (vLLM's ``EAGLEConfig`` with
      ``method="eagle"`` maps it to ``EagleLlamaForCausalLM``), ``"bias": false``. Keys ``fc.weight [H, 2H]``
      (input = ``concat(embed, hidden)``), ``layers.0.self_attn.{q,k,v,o}_proj.weight``,
      ``layers.0.mlp.{gate,up,down}_proj.weight``, ``layers.0.post_attention_layernorm.weight`` (no
      ``input_layernorm``: EAGLE-1 has none). No embedding or LM head: both engines share the target's.
    * EAGLE-1, ``engine="sglang"``: ``architectures ["LlamaForCausalLMEagle"]`` and an all-zero ``fc.bias``
      (SGLang builds ``fc`` with a bias; zeros keep the function identical). vLLM's loader rejects that key.
    * EAGLE-3 (either engine): ``architectures ["LlamaForCausalLMEagle3"]``, keys ``fc.weight [H, kH]``,
      ``midlayer.self_attn.{q,k,v}_proj.weight [*, 2H]``, ``midlayer.self_attn.o_proj.weight``,
      ``midlayer.mlp.*``, ``midlayer.{input_layernorm,hidden_norm,post_attention_layernorm}.weight``,
      ``norm.weight`` and, when ``target`` is a ``Transformer``, ``lm_head.weight`` (a copy of the target's:
      EAGLE-3 engines give the draft its own head) with ``draft_vocab_size = vocab_size`` (no d2t/t2d map);
      given only a ``ModelConfig``, neither is written (SGLang then loads the head from the target; whether
      a given vLLM version shares the target's head for such a checkpoint was not verified).
      ``target_hidden_size`` is set. When ``fuse_layers`` differ from EAGLE-3's default, ``eagle_config.
      eagle_aux_hidden_state_layer_ids`` (top level too) = ``fuse_layers + 1`` in vLLM's convention (the index
      of the target layer whose *input* is taken); SGLang reads the same key as layer *outputs* (it adds 1
      itself), so for SGLang such a checkpoint captures one layer higher - keep the default layers there.
      The final normed state (index L) cannot be exported (engines tap the residual stream only).
    * Always: ``tailspec_eagle`` = ``EagleConfig`` plus the target's architecture and depth, so
      ``load_eagle_checkpoint`` restores the head exactly. ``tie_word_embeddings`` is false.

    Verified against: vLLM's ``llama_eagle.py`` / ``llama_eagle3.py`` / ``EAGLEConfig`` / model registry and
    SGLang's ``llama_eagle.py`` / ``llama_eagle3.py`` source (read, not run: no vLLM/SGLang in this
    environment). Not verified by loading in either engine. Note that in those engines the draft layer's KV
    cache covers the whole prefix; a head trained with ``context="chain"`` has only seen draft-local context.

    Args:
        model: the draft head.
        path: output folder (created).
        target: the target ``Transformer`` (needed for EAGLE-3's ``lm_head`` and ``include_embeddings``) or
            its ``ModelConfig``.
        engine: ``"vllm"`` or ``"sglang"`` (only EAGLE-1 differs).
        include_embeddings: also write ``embed_tokens.weight`` (a copy of the target's; engines ignore it when
            they share the target's embedding, as vLLM and SGLang do without pipeline parallelism).
    """
    if engine not in ("vllm", "sglang"):
        raise ValueError(f"engine must be 'vllm' or 'sglang', got {engine!r}")
    tmodel = target if isinstance(target, Transformer) else None
    tcfg = target.config if isinstance(target, Transformer) else target
    cfg, lc = model.config, model.layer_config
    L = tcfg.num_hidden_layers
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    dtype = next(iter(state.values())).dtype
    d = {
        "model_type": "llama",
        "vocab_size": tcfg.vocab_size,
        "hidden_size": tcfg.hidden_size,
        "intermediate_size": lc.intermediate_size,
        "num_hidden_layers": 1,
        "num_attention_heads": lc.num_attention_heads,
        "num_key_value_heads": lc.num_key_value_heads,
        "head_dim": lc.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": lc.rms_norm_eps,
        "rope_theta": lc.rope_theta,
        "rope_parameters": {"rope_theta": lc.rope_theta, "rope_type": "default"},
        "max_position_embeddings": tcfg.max_position_embeddings,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": tcfg.bos_token_id,
        "eos_token_id": tcfg.eos_token_id,
        "pad_token_id": tcfg.pad_token_id,
        "torch_dtype": str(dtype).removeprefix("torch."),
    }
    if model.is_eagle3:
        fl = cfg.fuse_layers
        if fl[-1] >= L:
            raise ValueError(
                f"fuse_layers {fl}: index {fl[-1]} is not a residual-stream tap an EAGLE-3 engine can take "
                f"(layer outputs 0..{L - 2} only); choose lower layers to export"
            )
        d["architectures"] = [EAGLE3_ARCH]
        d["target_hidden_size"] = tcfg.hidden_size
        eagle_cfg: dict = {"use_aux_hidden_state": True}
        if tuple(fl) != default_fuse_layers(L):
            ids = [i + 1 for i in fl]
            d["eagle_aux_hidden_state_layer_ids"] = ids
            eagle_cfg["eagle_aux_hidden_state_layer_ids"] = ids
        d["eagle_config"] = eagle_cfg
        state = {
            ("midlayer." + k[len("layers.0.") :] if k.startswith("layers.0.") else k): v
            for k, v in state.items()
        }
        if tmodel is not None:
            state["lm_head.weight"] = tmodel.lm_head.weight.detach().to(dtype).contiguous().cpu().clone()
            d["draft_vocab_size"] = tcfg.vocab_size
    else:
        d["architectures"] = [EAGLE1_ARCH_VLLM if engine == "vllm" else EAGLE1_ARCH_SGLANG]
        d["bias"] = bool(cfg.fc_bias or engine == "sglang")
        if engine == "sglang" and "fc.bias" not in state:
            state["fc.bias"] = torch.zeros(tcfg.hidden_size, dtype=dtype)
        if engine == "vllm" and "fc.bias" in state:
            raise ValueError("vLLM's EagleLlamaForCausalLM has no fc.bias; train with fc_bias=False for vLLM")
    if include_embeddings:
        if tmodel is None:
            raise ValueError("include_embeddings needs the target Transformer, not only its config")
        state["embed_tokens.weight"] = (
            tmodel.model.embed_tokens.weight.detach().to(dtype).contiguous().cpu().clone()
        )
    d["tailspec_eagle"] = {
        "format": "eagle3" if model.is_eagle3 else "eagle1",
        "config": cfg.to_dict(),
        "target_architecture": tcfg.architecture,
        "target_num_hidden_layers": L,
    }
    os.makedirs(path, exist_ok=True)
    tmp = os.path.join(path, "model.safetensors.tmp")
    save_file(state, tmp, metadata={"format": "pt"})
    os.replace(tmp, os.path.join(path, "model.safetensors"))
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(d, f, indent=2)


def _read_weights(path: str) -> dict[str, torch.Tensor]:
    st = os.path.join(path, "model.safetensors")
    if os.path.isfile(st):
        return load_file(st)
    pt = os.path.join(path, "pytorch_model.bin")
    if os.path.isfile(pt):
        return torch.load(pt, map_location="cpu", weights_only=True)
    raise ModelLoadError(f"{path!r} has neither model.safetensors nor pytorch_model.bin")


def load_eagle_checkpoint(path: str | os.PathLike, target: Transformer) -> EagleDraftModel:
    """Load an EAGLE-1 or EAGLE-3 draft head for ``target`` (ours, or a public 1-layer Llama EAGLE one).

    Accepts ``model.safetensors`` or ``pytorch_model.bin``; keys with or without ``model.``; ``layers.0.`` or
    ``midlayer.``. ``embed_tokens``/``lm_head`` in the file are ignored (the target's are used; a differing
    ``lm_head`` is logged). Raises ``ModelLoadError`` for a missing folder, a width/vocabulary mismatch, a
    reduced draft vocabulary (non-trivial ``d2t``) or missing/unexpected weights. The head is returned on
    the target's device and dtype, in eval mode.
    """
    path = os.fspath(path)
    cfg_path = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_path):
        raise ModelLoadError(f"{path!r} has no config.json")
    with open(cfg_path) as f:
        d = json.load(f)
    tcfg = target.config
    for key in ("hidden_size", "vocab_size"):
        if key in d and d[key] != getattr(tcfg, key):
            raise ModelLoadError(f"{cfg_path}: {key} {d[key]} != target's {getattr(tcfg, key)}")
    raw = _read_weights(path)
    state: dict[str, torch.Tensor] = {}
    extra: dict[str, torch.Tensor] = {}
    for k, v in raw.items():
        k = k.removeprefix("model.")
        if k.startswith("midlayer."):
            k = "layers.0." + k[len("midlayer.") :]
        if k in ("embed_tokens.weight", "lm_head.weight", "d2t", "t2d"):
            extra[k] = v
        else:
            state[k] = v
    if "d2t" in extra and bool(extra["d2t"].ne(0).any()):
        raise ModelLoadError(f"{path}: reduced draft vocabulary (d2t) is not supported")
    if "lm_head.weight" in extra and not torch.equal(
        extra["lm_head.weight"].float(), target.lm_head.weight.detach().float().cpu()
    ):
        log.warning("%s: checkpoint lm_head differs from the target's; the target's head is used", path)
    ours = d.get("tailspec_eagle") or {}
    if "config" in ours:
        ecfg = EagleConfig.from_dict(ours["config"])
    else:
        fc = state.get("fc.weight")
        if fc is None:
            raise ModelLoadError(f"{path}: no fc.weight")
        k = fc.shape[1] // tcfg.hidden_size
        fuse = None
        if k != 2 or "layers.0.hidden_norm.weight" in state:
            ec = d.get("eagle_config") or {}
            ids = d.get("eagle_aux_hidden_state_layer_ids") or ec.get("eagle_aux_hidden_state_layer_ids")
            fuse = tuple(i - 1 for i in ids) if ids else default_fuse_layers(tcfg.num_hidden_layers)
            if len(fuse) != k:
                raise ModelLoadError(f"{path}: fc reads {k} layers but {len(fuse)} aux layers are configured")
        ecfg = EagleConfig(
            fuse_layers=fuse,
            fc_bias="fc.bias" in state and fuse is None,
            intermediate_size=d.get("intermediate_size"),
            num_attention_heads=d.get("num_attention_heads"),
            num_key_value_heads=d.get("num_key_value_heads"),
            head_dim=d.get("head_dim"),
            rope_theta=d.get("rope_theta"),
            rms_norm_eps=d.get("rms_norm_eps"),
        )
    if ecfg.fuse_layers is None and "fc.bias" in state and not ecfg.fc_bias:
        if bool(state["fc.bias"].ne(0).any()):
            ecfg.fc_bias = True
        else:
            state.pop("fc.bias")  # the zero bias written for SGLang
    try:
        model = EagleDraftModel(tcfg, ecfg)
    except ValueError as e:
        raise ModelLoadError(f"{path}: {e}") from None
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ModelLoadError(f"{path}: missing {sorted(missing)[:6]} unexpected {sorted(unexpected)[:6]}")
    p = next(target.parameters())
    return model.to(device=p.device, dtype=p.dtype).eval()


__all__ = [
    "EAGLE1_ARCH_SGLANG",
    "EAGLE1_ARCH_VLLM",
    "EAGLE3_ARCH",
    "load_eagle_checkpoint",
    "save_eagle_checkpoint",
]
