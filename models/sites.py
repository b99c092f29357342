"""The fusion sites a model contains, counted on the torch model while it runs.

These are the expectations the export matrix and bench/coverage.py hold otfuse (and OpenVINO) to:
counted from what the torch model computes, never from an ONNX graph or from otfuse.

- norm: every call of a norm module (`nn.LayerNorm`, a class named `*RMSNorm` / `*LayerNorm`).
- residual_norm: every distinct sum `a + b` of two tensors of one shape (no broadcasting, as
  AddRMSNorm / AddLayerNorm take them, docs/ops.md) that some norm normalises, directly or through a
  view / reshape that keeps the last axis (OPT regroups the rows first); two norms reading one sum
  (parallel blocks) are one site, since one fused node can give the sum to the other. A rotation's
  `x*cos + rotate_half(x)*sin` (an operand carrying a negation) is no residual sum (HunYuan
  normalises the rotated q and k).
- attention: every `scaled_dot_product_attention` or `softmax` call of rank 3 or more (one per
  attention; a 2-D softmax is a MoE router's).
- rope: one site per attention of a rotary model (q and k rotated, 2 applications); checked
  against the rotations seen (`neg` calls: rotate_half / rotate_every_two negate one half; a complex
  product read back by `view_as_real`: llama4, deepseek_v2). Fewer rotations than attentions (an
  even number) are NoPE layers: one site per two rotations.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode

_ADDS = {"add", "__add__", "__radd__", "add_", "__iadd__"}
_ATTENTION = {"scaled_dot_product_attention", "softmax"}
_VIEWS = {"view", "reshape", "contiguous"}
_NEGS = {"neg", "__neg__", "negative"}
_COMPLEX_ROTATIONS = {"view_as_real"}  # x_complex * freqs_cis read back as real pairs
# What carries a negated half into rotate_half(x) * sin: cat / stack, flatten / views, the product
_ROTATION_STEPS = {"cat", "concat", "concatenate", "stack", "flatten", "view", "reshape", "mul", "__mul__",
                   "__rmul__", "type_as", "to", "contiguous"}
_LAYER_INDEX = re.compile(r"\.(\d+)(\.|$)")


class _Recorder(TorchFunctionMode):
    """Records the same-shape sums, attention calls and negations of one forward."""

    def __init__(self):
        super().__init__()
        self.sums: dict[int, tuple[int, torch.Tensor]] = {}  # id -> (the sum's site, the tensor kept alive)
        self.attention = 0
        self.negs = 0
        # rotate_half(x) and rotate_half(x) * sin (id -> the tensor, kept alive): x*cos + that is a
        # rotation's sum, no residual, even when a norm reads it (HunYuan's q/k norms after RoPE)
        self.rotated: dict[int, torch.Tensor] = {}

    def _mark_rotated(self, name, args, out) -> None:
        tensors = [a for a in _flat(args) if isinstance(a, torch.Tensor)]
        if name in _NEGS or (name in _ROTATION_STEPS and any(id(t) in self.rotated for t in tensors)):
            self.rotated[id(out)] = out

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = getattr(func, "__name__", "")
        if isinstance(out, torch.Tensor):
            self._mark_rotated(name, args, out)
        if name in _ADDS and len(args) >= 2 and isinstance(out, torch.Tensor):
            a, b = args[0], args[1]
            if (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and out.is_floating_point()
                    and a.shape == b.shape == out.shape and id(a) not in self.rotated
                    and id(b) not in self.rotated):
                self.sums[id(out)] = (id(out), out)
        elif name in _VIEWS and isinstance(out, torch.Tensor) and id(args[0]) in self.sums:
            if out.shape[-1] == args[0].shape[-1]:  # rows regrouped, each row still the sum's
                self.sums[id(out)] = (self.sums[id(args[0])][0], out)
        elif name in _ATTENTION and (name != "softmax" or _rank(args) >= 3):
            self.attention += 1  # a 2-D softmax is a MoE router's (tokens x experts), no attention
        elif name in _NEGS or name in _COMPLEX_ROTATIONS:
            self.negs += 1  # one rotated tensor
        return out


def _flat(args):
    for a in args:
        if isinstance(a, (list, tuple)):
            yield from a
        else:
            yield a


def _rank(args) -> int:
    return args[0].ndim if args and isinstance(args[0], torch.Tensor) else 0


def is_norm(module: torch.nn.Module) -> bool:
    cls = type(module).__name__
    # *RMSNormGated: Mamba2's / Qwen3-Next's gated norms, rms(x * silu(gate)) * w
    return isinstance(module, torch.nn.LayerNorm) or cls.endswith(("RMSNorm", "LayerNorm", "RMSNormGated"))


def norm_kind(module: torch.nn.Module) -> str:
    cls = type(module).__name__
    return "rms" if "RMS" in cls or cls == "T5LayerNorm" else "layer"


def has_rotary(model: torch.nn.Module) -> bool:
    names = [n for n, _ in model.named_buffers()]
    return (any(n.endswith("inv_freq") for n in names) or any("Rotary" in type(m).__name__ for m in model.modules())
            or any(n.endswith("embed_positions") for n in names))  # GPT-J's sin/cos table


def expected_sites(model: torch.nn.Module, forward: Callable[[], Any]) -> dict[str, Any]:
    """Count the sites of `model` (see the module doc) while `forward()` runs it once."""
    calls: list[tuple[str, str, int, bool]] = []  # (module name, kind, width, reads a sum)
    residual_sums: dict[int, str] = {}
    recorder = _Recorder()

    def hook(name):
        def pre(module, args):
            x = args[0]
            is_sum = id(x) in recorder.sums
            if is_sum:
                residual_sums.setdefault(recorder.sums[id(x)][0], name)
            calls.append((name, norm_kind(module), int(x.shape[-1]), is_sum))
        return pre

    handles = [m.register_forward_pre_hook(hook(n)) for n, m in model.named_modules() if is_norm(m)]
    try:
        with torch.no_grad(), recorder:
            forward()
    finally:
        for h in handles:
            h.remove()
    layers = int(model.config.num_hidden_layers)
    rope = recorder.attention if has_rotary(model) else 0
    if 0 < recorder.negs < 2 * rope and recorder.negs % 2 == 0:
        rope = recorder.negs // 2  # NoPE layers (SmolLM3, EXAONE 4's global layers) rotate nothing
    hidden = int(getattr(model.config, "hidden_size", 0) or 0)
    in_layers = Counter()
    for name, _, _, _ in calls:
        in_layers["norm"] += bool(_LAYER_INDEX.search(name))
    for name in residual_sums.values():
        in_layers["residual_norm"] += bool(_LAYER_INDEX.search(name))
    total = {"rope": rope, "attention": recorder.attention, "norm": len(calls), "residual_norm": len(residual_sums)}
    per_layer = {"rope": rope / layers, "attention": recorder.attention / layers,
                 "norm": in_layers["norm"] / layers, "residual_norm": in_layers["residual_norm"] / layers}
    notes = []
    if rope and recorder.negs != 2 * rope:
        notes.append(f"{recorder.negs} negations seen for {rope} rotary sites (2 rotations each)")
    return {
        **total,
        "layers": layers,
        "per_layer": per_layer,
        "outside_layers": {k: total[k] - round(per_layer[k] * layers) for k in ("norm", "residual_norm")}
        | {k: 0 for k in ("rope", "attention")},
        "rope_applications": 2 * rope,
        "norm_kinds": dict(Counter(kind for _, kind, _, _ in calls)),
        "per_head_norms": sum(1 for _, _, width, _ in calls if hidden and width != hidden),
        "notes": notes,
    }
