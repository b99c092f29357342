#!/usr/bin/env python
"""Export single blocks of diffusers' video / image diffusion transformers (DiTs) to ONNX: the
fixtures of models/fixtures/dit (see models/README.md, "models/fixtures/dit").

Run with the export venv (torch, diffusers, onnxscript, onnx, onnxruntime; no hub access):

    python models/dit_blocks.py                       # all -> models/fixtures/dit
    python models/dit_blocks.py --only flux_attention --out /tmp/dit

Whole tiny DiTs are 0.7-1.4 MB (timestep embeddings, patch embeddings, AdaLN tables), so the
committed fixtures are one real diffusers block or attention each, at hidden 32 (2 heads of 16),
with the block's own rotary tables computed in forward from fixed positions (constant-folded into
initializers) and a dynamic batch. Each keeps the spelling a whole-model export writes:

- flux_attention: `FluxAttention` (joint text + image attention) with `FluxPosEmbed` tables,
  dynamo: diffusers' `apply_rotary_emb(use_real_unbind_dim=-1)` = `x.reshape(.., D/2, 2).unbind(-1)`,
  `stack([-x1, x0], -1).flatten(3)` (Slice 0:1 / 1:2 + Squeeze, Unsqueeze, Concat, Reshape), BSND.
- ltx_block: `LTXVideoTransformerBlock`, dynamo: the same rotation on `[B, S, N*D]` (before the
  head split), and `RMSNorm(elementwise_affine=False)` followed by the AdaLN modulation
  `norm(x) * (1 + scale) + shift` with a computed `[B, 1, C]` scale (plain and after the residual).
- cogvideox_block_torchscript: `CogVideoXBlock`, TorchScript exporter: the rotation with
  `Squeeze`/`Unsqueeze` of `Constant` axes and a flatten shape computed from `Shape`.
- wan_attention: `WanAttention` + `WanRotaryPosEmbed`, dynamo: Wan writes the rotated pairs back
  by `out[..., 0::2] = ...; out[..., 1::2] = ...` (ScatterND of `Range`-computed lane indices
  between Transposes; rope/scatter_pairs.py).
- sana_block_torchscript: `SanaTransformerBlock`, TorchScript exporter: its linear attention's
  `unflatten(1, (heads, -1))` slices the shape at `Mod(4, 3)` (the dimension engine folds integer
  Mod of known values; before, every shape after it was unknown and the block's norms and SiLU
  gates were refused), LayerNorm without affine + AdaLN modulation (the LayerNormalization op).
- wan_attention_static: the same module and weights, static batch 2 (no dynamic dim): the
  exporter's optimizer folds `Transpose(empty_like)` into a constant already lanes first, the
  Transpose pair between the two scatters into an `Identity`, and the head split into the pairs
  `Reshape` (`[B, S, N*D]` -> `[B, S, N, D/2, 2]`), as a whole static Wan export does.

Weights are redrawn from a generator seeded by the fixture's name (matrices `0.1·randn`, other
biases `0.05·randn`, norm weights `1 + 0.1·randn`, norm biases `0.1·randn`). Before writing,
onnxruntime must match torch (max abs 1e-4) at batch 2 and 3 (the static one at 2). The expected sites are counted on
the torch module while it runs (norm modules called, attention calls, rotations applied,
activation calls).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import sys
import warnings
import zlib
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import torch
from torch import nn
from torch.overrides import TorchFunctionMode

warnings.filterwarnings("ignore")
OPSET = 20
DIM, HEADS, HEAD_DIM = 32, 2, 16
OUT = Path(__file__).resolve().parent / "fixtures" / "dit"


def seed_of(name: str) -> int:
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


def is_norm(module: nn.Module) -> bool:
    cls = type(module).__name__
    return isinstance(module, (nn.LayerNorm, nn.GroupNorm)) or cls.endswith(("RMSNorm", "LayerNorm"))


@torch.no_grad()
def randomize(model: nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    norm_params = {f"{mn}.{pn}" if mn else pn for mn, m in model.named_modules() if is_norm(m)
                   for pn, _ in m.named_parameters(recurse=False)}
    for name, param in model.named_parameters():
        noise = torch.randn(param.shape, generator=gen)
        if name in norm_params:
            value = 0.1 * noise if name.endswith("bias") else 1 + 0.1 * noise
        else:
            value = (0.1 if param.ndim >= 2 else 0.05) * noise
        param.copy_(value)


class FluxAttentionFixture(nn.Module):
    """FluxAttention over 6 text + 16 image tokens (a 4x4 latent), rotary from FluxPosEmbed."""

    def __init__(self):
        super().__init__()
        from diffusers.models.transformers.transformer_flux import FluxAttention, FluxPosEmbed
        self.attn = FluxAttention(query_dim=DIM, heads=HEADS, dim_head=HEAD_DIM, added_kv_proj_dim=DIM,
                                  context_pre_only=False, bias=True, out_dim=DIM)
        self.pos = FluxPosEmbed(theta=10000, axes_dim=[4, 6, 6])
        img = torch.zeros(4, 4, 3)
        img[..., 1] = torch.arange(4)[:, None]
        img[..., 2] = torch.arange(4)[None, :]
        self.register_buffer("ids", torch.cat([torch.zeros(6, 3), img.reshape(16, 3)]), persistent=False)

    def forward(self, hidden_states, encoder_hidden_states):
        rotary = self.pos(self.ids)
        return self.attn(hidden_states, encoder_hidden_states, image_rotary_emb=rotary)


class LTXBlockFixture(nn.Module):
    """LTXVideoTransformerBlock over a 2x2x4 video grid (16 tokens) and 6 text tokens."""

    def __init__(self):
        super().__init__()
        from diffusers.models.transformers.transformer_ltx import LTXVideoRotaryPosEmbed, LTXVideoTransformerBlock
        self.block = LTXVideoTransformerBlock(dim=DIM, num_attention_heads=HEADS, attention_head_dim=HEAD_DIM,
                                              cross_attention_dim=DIM)
        self.rope = LTXVideoRotaryPosEmbed(dim=DIM, base_num_frames=2, base_height=2, base_width=4)

    def forward(self, hidden_states, encoder_hidden_states, temb):
        rotary = self.rope(hidden_states[:1], num_frames=2, height=2, width=4)
        return self.block(hidden_states, encoder_hidden_states, temb, image_rotary_emb=rotary)


class CogVideoXBlockFixture(nn.Module):
    """CogVideoXBlock over 3 frames of 2x2 patches (12 tokens) after 4 text tokens."""

    def __init__(self):
        super().__init__()
        from diffusers.models.embeddings import get_3d_rotary_pos_embed
        from diffusers.models.transformers.cogvideox_transformer_3d import CogVideoXBlock
        self.block = CogVideoXBlock(dim=DIM, num_attention_heads=HEADS, attention_head_dim=HEAD_DIM, time_embed_dim=4,
                                    ff_inner_dim=DIM // 2)
        cos, sin = get_3d_rotary_pos_embed(embed_dim=HEAD_DIM, crops_coords=((0, 0), (2, 2)), grid_size=(2, 2),
                                           temporal_size=3, device="cpu")
        self.register_buffer("cos", cos.float(), persistent=False)
        self.register_buffer("sin", sin.float(), persistent=False)

    def forward(self, hidden_states, encoder_hidden_states, temb):
        return self.block(hidden_states, encoder_hidden_states, temb, image_rotary_emb=(self.cos, self.sin))


class WanAttentionFixture(nn.Module):
    """WanAttention (self-attention, q/k RMSNorm across heads) over a 2x2x2 latent grid (8 tokens),
    rotary from WanRotaryPosEmbed."""

    def __init__(self):
        super().__init__()
        from diffusers.models.transformers.transformer_wan import WanAttention, WanAttnProcessor, WanRotaryPosEmbed
        self.attn = WanAttention(dim=DIM, heads=HEADS, dim_head=HEAD_DIM, eps=1e-6, processor=WanAttnProcessor())
        self.rope = WanRotaryPosEmbed(attention_head_dim=HEAD_DIM, patch_size=(1, 2, 2), max_seq_len=32)
        self.register_buffer("latent", torch.zeros(1, 1, 2, 4, 4), persistent=False)

    def forward(self, hidden_states):
        return self.attn(hidden_states, None, None, self.rope(self.latent))


class SanaBlockFixture(nn.Module):
    """SanaTransformerBlock (linear ReLU self-attention, SDPA cross-attention, GLUMBConv MLP with a
    SiLU gate) over a 4x4 latent (16 tokens) and 6 text tokens."""

    def __init__(self):
        super().__init__()
        from diffusers.models.transformers.sana_transformer import SanaTransformerBlock
        self.block = SanaTransformerBlock(dim=DIM, num_attention_heads=HEADS, attention_head_dim=HEAD_DIM,
                                          num_cross_attention_heads=HEADS, cross_attention_head_dim=HEAD_DIM,
                                          cross_attention_dim=DIM, mlp_ratio=1.0)

    def forward(self, hidden_states, encoder_hidden_states, timestep):
        return self.block(hidden_states, encoder_hidden_states=encoder_hidden_states, timestep=timestep,
                          height=4, width=4)


def _inputs(name: str, batch: int, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    rnd = lambda *shape: torch.randn(*shape, generator=gen)  # noqa: E731
    if name == "flux_attention":
        return {"hidden_states": rnd(batch, 16, DIM), "encoder_hidden_states": rnd(batch, 6, DIM)}
    if name == "ltx_block":
        return {"hidden_states": rnd(batch, 16, DIM), "encoder_hidden_states": rnd(batch, 6, DIM),
                "temb": rnd(batch, 1, 6 * DIM)}
    if name == "cogvideox_block_torchscript":
        return {"hidden_states": rnd(batch, 12, DIM), "encoder_hidden_states": rnd(batch, 4, DIM),
                "temb": rnd(batch, 4)}
    if name == "sana_block_torchscript":
        return {"hidden_states": rnd(batch, 16, DIM), "encoder_hidden_states": rnd(batch, 6, DIM),
                "timestep": rnd(batch, 6 * DIM)}
    return {"hidden_states": rnd(batch, 8, DIM)}


FIXTURES = {
    "flux_attention": (FluxAttentionFixture, "dynamo", ["out_image", "out_text"]),
    "ltx_block": (LTXBlockFixture, "dynamo", ["output"]),
    "cogvideox_block_torchscript": (CogVideoXBlockFixture, "torchscript", ["out_video", "out_text"]),
    "wan_attention": (WanAttentionFixture, "dynamo", ["output"]),
    "wan_attention_static": (WanAttentionFixture, "dynamo_static", ["output"]),
    "sana_block_torchscript": (SanaBlockFixture, "torchscript", ["output"]),
}


class _Calls(TorchFunctionMode):
    """Counts attention calls and activation calls of one forward."""

    def __init__(self):
        super().__init__()
        self.counts = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = getattr(func, "__name__", "")
        if name == "scaled_dot_product_attention" or (name == "softmax" and args[0].ndim >= 3):
            self.counts["attention"] += 1
        elif name in ("gelu", "silu", "relu"):
            self.counts["activation"] += 1
        return out


def expected_sites(module: nn.Module, inputs: dict) -> dict[str, int]:
    """Norm modules called, attention calls, rotary applications (2 per attention given rotary
    tables: q and k) and activation calls, counted while the torch module runs."""
    counts = Counter()

    def norm_hook(mod, args):
        counts["norm"] += 1

    def attention_hook(mod, args, kwargs):
        rotary = kwargs.get("image_rotary_emb", kwargs.get("rotary_emb"))
        if rotary is None and len(args) >= 4:
            rotary = args[3]
        counts["rope_applications"] += 2 * (rotary is not None)

    hooks = []
    for _, mod in module.named_modules():
        if is_norm(mod) and not any(is_norm(child) for child in mod.children()):
            hooks.append(mod.register_forward_pre_hook(norm_hook))
        elif type(mod).__name__ in ("FluxAttention", "LTXAttention", "Attention", "WanAttention"):
            hooks.append(mod.register_forward_pre_hook(attention_hook, with_kwargs=True))
    calls = _Calls()
    try:
        with torch.no_grad(), calls:
            module(**inputs)
    finally:
        for hook in hooks:
            hook.remove()
    return {"norm": counts["norm"], "attention": calls.counts["attention"],
            "rope_applications": counts["rope_applications"], "activation": calls.counts["activation"]}


def strip_metadata(proto: onnx.ModelProto) -> None:
    for node in proto.graph.node:
        del node.metadata_props[:]
    for value in [*proto.graph.value_info, *proto.graph.input, *proto.graph.output, *proto.graph.initializer]:
        del value.metadata_props[:]
    del proto.graph.metadata_props[:]
    del proto.metadata_props[:]


def export(name: str, out_dir: Path) -> dict:
    cls, exporter, outputs = FIXTURES[name]
    weights = name.removesuffix("_static")  # the static variant: the same weights
    torch.manual_seed(seed_of(weights))
    module = cls().eval()
    randomize(module, seed_of(weights))
    sample = _inputs(name, 2, seed_of(name) + 2)
    names = list(sample)
    with torch.no_grad():
        if exporter.startswith("dynamo"):
            batch = torch.export.Dim("batch", min=1, max=64)
            dynamic = None if exporter == "dynamo_static" else {k: {0: batch} for k in names}
            program = torch.onnx.export(module, (), kwargs=sample, dynamo=True, input_names=names,
                                        output_names=outputs, dynamic_shapes=dynamic,
                                        opset_version=OPSET, optimize=True, external_data=False, verbose=False)
            proto = program.model_proto
        else:
            buffer = io.BytesIO()
            axes = {k: {0: "batch"} for k in names + outputs}
            torch.onnx.export(module, tuple(sample.values()), buffer, dynamo=False, input_names=names,
                              output_names=outputs, dynamic_axes=axes, opset_version=OPSET, do_constant_folding=True)
            proto = onnx.load_from_string(buffer.getvalue())
    strip_metadata(proto)
    proto.doc_string = f"otfuse fixture {name}: diffusers block, random weights, {exporter} exporter (models/dit_blocks.py)"
    onnx.checker.check_model(proto, full_check=True)
    data = proto.SerializeToString()
    import onnxruntime as ort
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    worst = 0.0
    for batch in (2, 3) if exporter != "dynamo_static" else (2,):
        feeds = _inputs(name, batch, seed_of(name) + batch)
        with torch.no_grad():
            want = module(**feeds)
        want = [want] if isinstance(want, torch.Tensor) else list(want)
        got = session.run(None, {k: v.numpy() for k, v in feeds.items()})
        worst = max([worst] + [float(np.abs(g - w.numpy()).max()) for g, w in zip(got, want)])
    if worst > 1e-4:
        raise RuntimeError(f"{name}: onnxruntime differs from torch by {worst}")
    (out_dir / f"{name}.onnx").write_bytes(data)
    import diffusers
    return {
        "file": f"{name}.onnx", "module": type(getattr(module, "attn", getattr(module, "block", module))).__name__,
        "exporter": exporter, "opset": OPSET, "size_bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
        "inputs": [[k, [("batch" if i == 0 and exporter != "dynamo_static" else d) for i, d in enumerate(v.shape)]]
                   for k, v in sample.items()],
        "outputs": outputs, "seed": seed_of(weights), "ort_vs_torch_max_abs": worst,
        "expected": expected_sites(module, sample),
        "versions": {"torch": torch.__version__.split("+")[0], "diffusers": diffusers.__version__,
                     "onnx": onnx.__version__, "onnxruntime": ort.__version__},
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    manifest_path = args.out / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {"fixtures": {}}
    for name in args.only or FIXTURES:
        manifest["fixtures"][name] = export(name, args.out)
        print(name, manifest["fixtures"][name]["size_bytes"], manifest["fixtures"][name]["expected"], flush=True)
    manifest["generator"] = "models/dit_blocks.py"
    manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
