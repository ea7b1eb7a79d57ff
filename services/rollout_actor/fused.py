"""Fused products for inference: q / k / v as one matrix product, the MLP's gate / up as one, and a residual
add inside a product (``linear_residual``).

A decode step at small batch reads every weight once, and each ``nn.Linear`` is a kernel; three small products
(q, k, v) run below the card's bandwidth where one product of the stacked weights does not (``benchmarks.
cuda_graphs`` on an H100, Qwen2.5-7B shape, batch 1: the forward's matrix products 5.8 ms -> 5.3 ms).

``fuse_projections(model)`` concatenates each group's weights (and biases) into one tensor and points the
original parameters' ``.data`` at views of it: the parameters keep their objects, names and shapes, so
``state_dict``, ``load_state_dict`` and in-place updates (``copy_``, an optimizer step) work unchanged and reach
the fused tensor. ``fused_linear`` is the product the forward uses (``fused_product``: before its split). It
returns None (the caller runs the separate products) while autograd records (training: the gradients belong to
the separate parameters) or when a parameter no longer aliases the fused tensor (its ``.data`` was replaced,
e.g. by ``Module.to``: fuse again).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

GROUPS = {"qkv": ("self_attn", ("q_proj", "k_proj", "v_proj")), "gate_up": ("mlp", ("gate_proj", "up_proj"))}


class FusedProjection:
    """One group's stacked ``weight [sum(sizes), in]`` and ``bias [sum(sizes)]`` (or None), and the parameters
    that must still alias them (their data pointers at fusion time)."""

    def __init__(
        self, weight: torch.Tensor, bias: torch.Tensor | None, sizes: list[int], params: list
    ) -> None:
        self.weight, self.bias, self.sizes, self.params = weight, bias, sizes, params
        self.ptrs = [p.data_ptr() for p in params]

    def aliased(self) -> bool:
        return all(p.data_ptr() == ptr for p, ptr in zip(self.params, self.ptrs))


def _stack(linears: Sequence[nn.Linear], attr: str) -> torch.Tensor:
    parts = [getattr(lin, attr) for lin in linears]
    fused = torch.cat([p.detach() for p in parts])
    for p, view in zip(parts, fused.split([p.shape[0] for p in parts])):
        p.data = view
    return fused


def fuse_group(module: nn.Module, name: str, linears: Sequence[nn.Linear]) -> bool:
    """Fuse ``linears`` (same input, device and dtype) of ``module`` as group ``name``. Returns False when they
    cannot be (mixed biases, devices or dtypes) or are fused already."""
    current = module.__dict__.get(f"_fused_{name}")
    if current is not None and current.aliased():
        return False
    biased = {lin.bias is not None for lin in linears}
    if len(biased) != 1 or len({(lin.weight.device, lin.weight.dtype) for lin in linears}) != 1:
        return False
    with torch.no_grad():
        weight = _stack(linears, "weight")
        bias = _stack(linears, "bias") if biased == {True} else None
    params = [lin.weight for lin in linears] + ([lin.bias for lin in linears] if bias is not None else [])
    module.__dict__[f"_fused_{name}"] = FusedProjection(
        weight, bias, [lin.out_features for lin in linears], params
    )
    return True


def fuse_projections(model: nn.Module) -> int:
    """Fuse every decoder layer's q / k / v and gate / up projections (``model.model.layers``, the module
    docstring). Idempotent. Returns how many groups it fused now."""
    n = 0
    for layer in model.model.layers:
        for name, (owner, names) in GROUPS.items():
            module = getattr(layer, owner)
            n += fuse_group(module, name, [getattr(module, a) for a in names])
    return n


def fused_linear(module: nn.Module, name: str, x: torch.Tensor) -> tuple[torch.Tensor, ...] | None:
    """The outputs of ``module``'s group ``name`` for input ``x [..., in]`` from one product, split per
    projection (``[..., size_i]`` each); None when not fused, while autograd records, or when a parameter no
    longer aliases the fused tensor."""
    out = fused_product(module, name, x)
    return None if out is None else out.split(module.__dict__[f"_fused_{name}"].sizes, dim=-1)


def fused_product(module: nn.Module, name: str, x: torch.Tensor) -> torch.Tensor | None:
    """``fused_linear``'s product before the split: ``[..., sum(sizes)]``, the projections' outputs side by side
    in the group's order (``GROUPS``); None when ``fused_linear`` would return None."""
    f = module.__dict__.get(f"_fused_{name}")
    if f is None or torch.is_grad_enabled() or not f.aliased():
        return None
    return F.linear(x, f.weight, f.bias)


def linear_residual(linear: nn.Linear, x: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
    """``residual + linear(x)`` for x ``[..., in]`` and residual ``[..., out]`` (None: ``linear(x)``). For
    inference through a linear without bias, one ``torch.addmm``: the matrix product accumulates onto
    ``residual`` (cuBLAS beta = 1; on CUDA PyTorch first copies ``residual`` into the output, a device copy
    cheaper than the add kernel it replaces). While autograd records, the module is called (its hooks run, as a
    training wrapper such as DeepSpeed's may need)."""
    if residual is None:
        return linear(x)
    if linear.bias is not None or torch.is_grad_enabled():
        return residual + linear(x)
    out = torch.addmm(residual.reshape(-1, residual.shape[-1]), x.reshape(-1, x.shape[-1]), linear.weight.t())
    return out.view(residual.shape)


__all__ = [
    "FusedProjection",
    "fuse_group",
    "fuse_projections",
    "fused_linear",
    "fused_product",
    "linear_residual",
]
