#!/usr/bin/env python
"""Export tiny random-weight Hugging Face models to ONNX as otfuse test fixtures.

Run with a Python that has torch, transformers, onnxscript and onnx installed (never needed
to run the tests, which only read the committed .onnx files and manifest.json):

    python models/export_fixtures.py                      # all fixtures -> models/fixtures
    python models/export_fixtures.py --only llama bert    # a subset (manifest entries merged)
    python models/export_fixtures.py --out /tmp/fixtures

Every model is built from a config (no hub access), weights are drawn from a seeded normal
distribution, and every norm weight is perturbed away from 1 (biases away from 0), so a fusion
that drops the scale or the bias changes the output. The exporter is the torch dynamo exporter
(`torch.onnx.export(..., dynamo=True)`) with dynamic batch and sequence dims.

Besides the Hugging Face models, `rope3d` is a torch module written here (models/rope3d.py: a
DiT-style attention block over a T x H x W video token grid with multi-axis "3D" RoPE), exported
by the dynamo exporter and, as `rope3d_torchscript`, by the TorchScript exporter
(`dynamo=False`), same weights; its sequence is the static grid (24 tokens), only batch is dynamic.
The `legacy_*` fixtures are models/legacy_attention.py: one eager attention spelled as older code
writes it (keys permuted by the head split, soft-capping, repeat_kv by `.repeat` = Tile).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import io
import json
import logging
import sys
import warnings
import zlib
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import onnx
import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent))  # models/rope3d.py, also when imported
import legacy_attention  # noqa: E402
from graph_counts import graph_structure_counts  # noqa: E402
import meta_rope  # noqa: E402
import rope3d  # noqa: E402

OPSET = 20  # torch.onnx's default for the dynamo exporter; onnxruntime >= 1.17 runs it.

# Shared tiny sizes (see models/README.md).
HIDDEN = 64
LAYERS = 2
HEADS = 4
KV_HEADS = 2  # GQA for llama / qwen2 / qwen3 / mistral
HEAD_DIM = HIDDEN // HEADS  # 16
INTERMEDIATE = 128
VOCAB = 256
MAX_POS = 128

WEIGHT_STD = 0.1  # matrices and embeddings
BIAS_STD = 0.05  # non-norm biases
NORM_WEIGHT_STD = 0.1  # norm weight = 1 + NORM_WEIGHT_STD * randn
NORM_BIAS_STD = 0.1  # norm bias = NORM_BIAS_STD * randn

# Sample sizes used while tracing; the exported dims stay symbolic.
SAMPLE_BATCH = 2
SAMPLE_SEQ = 7
SAMPLE_PAST = 5


# --------------------------------------------------------------------------------------------
# Fixture descriptions: one config function per architecture.
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Fixture:
    name: str
    architecture: str  # HF model_type
    make_config: Callable[[], transformers.PretrainedConfig]
    model_kind: str = "causal_lm"  # "causal_lm" (logits) or "base" (last_hidden_state)
    norm: str = "RMSNorm"  # "RMSNorm" or "LayerNorm"
    position_encoding: str = "rope"  # "rope", "alibi" or "learned"
    rotary_style: str | None = "rotate_half"  # "rotate_half" (halves) or "interleaved" (pairs)
    position_ids: bool = True  # the model's forward takes position_ids
    dtype: torch.dtype = torch.float32
    kv_cache: bool = False
    opset: int = OPSET
    exporter: str = "dynamo"  # "dynamo" or "torchscript" (torch.onnx.export(dynamo=False))
    weights_of: str | None = None  # build with this fixture's seed (same model, other exporter)
    attn_implementation: str | None = None  # "sdpa" or "eager" only; None: ATTN_IMPLEMENTATIONS in order
    notes: list[str] = dataclasses.field(default_factory=list)


def _sizes(**specific: Any) -> dict[str, Any]:
    """The tiny sizes every config with Hugging Face's usual key names shares (no cache, no
    attention dropout), plus the architecture's own keys."""
    return {
        "hidden_size": HIDDEN,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "intermediate_size": INTERMEDIATE,
        "vocab_size": VOCAB,
        "max_position_embeddings": MAX_POS,
        "use_cache": False,
        "attention_dropout": 0.0,
        **specific,
    }


def _gqa_sizes(**specific: Any) -> dict[str, Any]:
    """_sizes with KV_HEADS key/value heads (GQA), for the llama-like decoders."""
    return _sizes(num_key_value_heads=KV_HEADS, **specific)


def llama_config() -> transformers.PretrainedConfig:
    return transformers.LlamaConfig(**_gqa_sizes(head_dim=HEAD_DIM, rms_norm_eps=1e-6))


# Released Qwen models use rope_theta 1e6; the tiny ones keep it.
_QWEN_ROPE = {"rope_type": "default", "rope_theta": 1_000_000.0}


def qwen2_config() -> transformers.PretrainedConfig:
    return transformers.Qwen2Config(**_gqa_sizes(
        rope_parameters=_QWEN_ROPE, rms_norm_eps=1e-6, use_sliding_window=False, tie_word_embeddings=False,
    ))


def qwen3_config() -> transformers.PretrainedConfig:
    return transformers.Qwen3Config(**_gqa_sizes(
        head_dim=HEAD_DIM, rope_parameters=_QWEN_ROPE, rms_norm_eps=1e-6, use_sliding_window=False,
        tie_word_embeddings=False,
    ))


def mistral_config() -> transformers.PretrainedConfig:
    return transformers.MistralConfig(**_gqa_sizes(
        head_dim=HEAD_DIM, rms_norm_eps=1e-5,
        sliding_window=4,  # < the test sequence length (7), so the window is exercised
    ))


def gemma2_config() -> transformers.PretrainedConfig:
    return transformers.Gemma2Config(**_gqa_sizes(  # layer 0 sliding_attention, layer 1 full_attention
        head_dim=HEAD_DIM, rms_norm_eps=1e-6,
        query_pre_attn_scalar=8,  # scale 8**-0.5, not 1/sqrt(head_dim): the scale must come from the graph
        # Small caps (released Gemma2: 50 / 30) so that tanh bends these tiny models' scores and
        # logits: a fusion that dropped the soft-capping would change the outputs measurably.
        attn_logit_softcapping=5.0,
        final_logit_softcapping=3.0,
        sliding_window=4,  # < the test sequence length (7), so the window is exercised
    ))


def gpt_neox_config() -> transformers.PretrainedConfig:
    return transformers.GPTNeoXConfig(**_sizes(
        rotary_pct=0.25,  # rotary on the first 4 of 16 head dims
        layer_norm_eps=1e-5, use_parallel_residual=True, hidden_dropout=0.0,
    ))


def _gpt_sizes(**specific: Any) -> dict[str, Any]:
    """The same sizes under GPT-2's key names (n_embd, n_layer, ...), shared by GPT-2 and GPT-J."""
    return {
        "n_embd": HIDDEN,
        "n_layer": LAYERS,
        "n_head": HEADS,
        "n_inner": INTERMEDIATE,
        "vocab_size": VOCAB,
        "n_positions": MAX_POS,
        "layer_norm_epsilon": 1e-5,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "use_cache": False,
        **specific,
    }


def gptj_config() -> transformers.PretrainedConfig:
    return transformers.GPTJConfig(**_gpt_sizes(rotary_dim=8))  # interleaved rotary on 8 of 16 head dims


def phi_config() -> transformers.PretrainedConfig:
    return transformers.PhiConfig(**_sizes(
        partial_rotary_factor=0.5,  # rotary on the first 8 of 16 head dims
        layer_norm_eps=1e-5, resid_pdrop=0.0, embd_pdrop=0.0,
    ))


def bert_config() -> transformers.PretrainedConfig:
    return transformers.BertConfig(
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=INTERMEDIATE,
        vocab_size=VOCAB,
        max_position_embeddings=MAX_POS,
        layer_norm_eps=1e-12,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        add_pooling_layer=False,
    )


def gpt2_config() -> transformers.PretrainedConfig:
    return transformers.GPT2Config(**_gpt_sizes())


def bloom_config() -> transformers.PretrainedConfig:
    # Bloom's MLP width is fixed at 4 * hidden (256); there is no intermediate_size knob.
    return transformers.BloomConfig(
        hidden_size=HIDDEN,
        n_layer=LAYERS,
        n_head=HEADS,
        vocab_size=VOCAB,
        layer_norm_epsilon=1e-5,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        use_cache=False,
    )


FIXTURES: list[Fixture] = [
    Fixture("llama", "llama", llama_config),
    Fixture("qwen2", "qwen2", qwen2_config),
    Fixture("qwen3", "qwen3", qwen3_config),
    Fixture("mistral", "mistral", mistral_config),
    Fixture(
        "gemma2", "gemma2", gemma2_config,
        notes=["transformers has no sdpa attention for Gemma2 (soft-capping): exported with eager attention",
               "attention logits soft-capped (tanh, cap 5.0), final logits too (cap 3.0); "
               "RMSNorm scales by (1 + w); layer 0 slides (window 4), layer 1 is full"],
    ),
    Fixture("gpt_neox", "gpt_neox", gpt_neox_config, norm="LayerNorm"),
    Fixture("gptj", "gptj", gptj_config, norm="LayerNorm", rotary_style="interleaved"),
    Fixture("phi", "phi", phi_config, norm="LayerNorm"),
    Fixture(
        "bert", "bert", bert_config, model_kind="base", norm="LayerNorm",
        position_encoding="learned", rotary_style=None,
    ),
    Fixture(
        "gpt2", "gpt2", gpt2_config, norm="LayerNorm", position_encoding="learned",
        rotary_style=None,
    ),
    Fixture(
        "bloom", "bloom", bloom_config, norm="LayerNorm", position_encoding="alibi",
        rotary_style=None, position_ids=False,
        notes=[
            "transformers has no sdpa attention for Bloom: exported with eager attention",
            "Bloom's MLP width is fixed at 4 * hidden = 256 (no intermediate_size)",
        ],
    ),
    Fixture(
        "llama_fp16", "llama", llama_config, dtype=torch.float16,
        notes=["built with from_config(dtype=float16): weights fp16, rotary inv_freq stays float32"],
    ),
    Fixture(
        "llama_fp16_eager", "llama", llama_config, dtype=torch.float16, weights_of="llama_fp16",
        attn_implementation="eager",
        notes=["same model and weights as llama_fp16, eager attention: softmax(scores + mask, dtype=float32)"
               ".to(float16); torchlib writes Softmax(float16) -> Cast(float) -> Cast(float16) and the "
               "exporter's optimizer drops that no-op Cast pair: a float16 Softmax is left"],
    ),
    Fixture(
        "llama_fp16_eager_torchscript", "llama", llama_config, dtype=torch.float16, weights_of="llama_fp16",
        attn_implementation="eager", exporter="torchscript",
        notes=["same model and weights as llama_fp16, eager attention, TorchScript exporter (dynamo=False): "
               "softmax(..., dtype=float32).to(float16) stays Softmax(float16) -> Cast(float) -> Cast(float16)"],
    ),
    Fixture(
        "llama_kv", "llama", llama_config, kv_cache=True,
        notes=["decoder step: flat past_key_values.{i}.{key,value} in, present.{i}.{key,value} out "
               "(wrapped in a DynamicCache); attention_mask covers past + new tokens"],
    ),
    # At opset 23 the exporter emits the ONNX RMSNormalization, RotaryEmbedding and Attention
    # ops instead of the decomposed graphs above.
    Fixture(
        "llama_opset23", "llama", llama_config, opset=23,
        notes=["opset 23: the exporter emits ONNX RMSNormalization, RotaryEmbedding and Attention ops"],
    ),
    # What users still run: torch.onnx.export(..., dynamo=False). Same models and weights.
    Fixture(
        "llama_torchscript", "llama", llama_config, exporter="torchscript", weights_of="llama",
        notes=["TorchScript exporter (dynamo=False); same model and weights as llama"],
    ),
    Fixture(
        "mistral_torchscript", "mistral", mistral_config, exporter="torchscript", weights_of="mistral",
        notes=["TorchScript exporter (dynamo=False); same model and weights as mistral (sliding_window 4)"],
    ),
]


@dataclasses.dataclass
class ModuleFixture:
    """A torch module written in models/ (not a Hugging Face model), exported as it is: one
    input `hidden_states [batch, seq, hidden]` with a static seq, one output."""

    name: str
    architecture: str
    build: Callable[[], torch.nn.Module]
    exporter: str = "dynamo"  # "dynamo" or "torchscript" (torch.onnx.export(dynamo=False))
    weights_of: str | None = None  # draw the weights with this fixture's seed (same module, other exporter)
    dtype: torch.dtype = torch.float32
    kv_cache: bool = False
    opset: int = OPSET
    notes: list[str] = dataclasses.field(default_factory=list)
    doc: str = "multi-axis (3D) RoPE attention module"  # the model's doc_string
    source: str = "models/rope3d.py"


_ROPE3D_NOTES = [
    "models/rope3d.py: DiT-style self-attention over a T x H x W = 2 x 3 x 4 token grid (24 tokens, "
    "frame-major), multi-axis RoPE: head_dim 16 cut into (t, h, w) sections (4, 6, 6), each rotated "
    "(rotate_half inside the section) by its own axis's cos/sin, then concatenated; non-causal SDPA",
    "the grid is static, so cos/sin (computed in forward from torch.arange) are constant-folded into "
    "[1, 1, 24, section] tables; only batch is dynamic",
]

MODULE_FIXTURES: list[ModuleFixture] = [
    ModuleFixture("rope3d", "rope3d", rope3d.Rope3DAttention, notes=list(_ROPE3D_NOTES)),
    ModuleFixture(
        "rope3d_torchscript", "rope3d", rope3d.Rope3DAttention, exporter="torchscript",
        weights_of="rope3d",
        notes=[*_ROPE3D_NOTES, "TorchScript exporter (dynamo=False); same module and weights as rope3d, "
               "the same input gives the same output"],
    ),
    # Eager attention as older / hand-written code spells it (models/legacy_attention.py).
    *(ModuleFixture(name, "legacy_attention", functools.partial(legacy_attention.LegacyAttention, **kwargs),
                    notes=[note], doc="eager attention module", source="models/legacy_attention.py")
      for name, kwargs, note in [
          ("legacy_kt_softcap", dict(kt="permute", softcap=2.0),
           "keys transposed by the head split (key.view(B, S, N, D).permute(0, 2, 3, 1), older GPT-2), "
           "scores soft-capped as tanh(scores * (1 / 2)) * 2; 4 heads, no mask"),
          ("legacy_tile_gqa", dict(kv_heads=2),
           "2 kv heads repeated by k[:, :, None].repeat(1, 1, 2, 1, 1).reshape(B, 4, S, D) (Tile); no mask"),
          ("legacy_tile_mqa", dict(kv_heads=1, repeat="tile_heads"),
           "1 kv head repeated by k.repeat(1, 4, 1, 1) (a bare Tile of the head axis); no mask"),
          ("legacy_where_causal", dict(kv_heads=2, mask="where"),
           "causal as GPT-2 before transformers 4.4x: torch.where(tril_buffer[:, :, :S, :S], scores, "
           "finfo(float32).min); 2 kv heads (Tile)"),
      ]),
    ModuleFixture(
        "legacy_fp16_upcast", "legacy_attention",
        functools.partial(legacy_attention.LegacyAttention, kv_heads=2, upcast=True), dtype=torch.float16,
        notes=["float16 module, softmax(scores.float(), dim=-1).type_as(q) as Meta's reference LLaMA: "
               "Cast(float) -> Softmax -> Cast(float16); 2 kv heads (Tile); no mask"],
        doc="eager attention module", source="models/legacy_attention.py",
    ),
    # Meta's reference LLaMA rotary: lane pairs (interleaved) by view_as_complex (models/meta_rope.py).
    *(ModuleFixture(name, "meta_rope", functools.partial(meta_rope.MetaRopeAttention, style=style),
                    notes=[note], doc="interleaved rotary on lane pairs + SDPA", source="models/meta_rope.py")
      for name, style, note in [
          ("meta_rope_complex", "complex",
           "Meta's apply_rotary_emb: view_as_complex(x.reshape(B, S, N, 8, 2)) * freqs_cis, view_as_real, "
           "flatten(3) -> Reshape [.., 8, 2], Slice 0:1 / 1:2, x0*c - x1*s and x1*c + x0*s, Concat, Reshape; "
           "2 heads of 16, hidden 32, 8 tokens (static), non-causal SDPA"),
          ("meta_rope_pairs", "pairs",
           "the complex-free port: x.reshape(.., 8, 2), x[..., 0] / x[..., 1] (Gather), "
           "stack([a*c - b*s, b*c + a*s], -1).flatten(-2) (Unsqueeze, Concat, Reshape); as meta_rope_complex"),
      ]),
    ModuleFixture(
        "meta_rope_causal", "meta_rope", functools.partial(meta_rope.MetaRopeAttention, style="complex", causal=True),
        weights_of="meta_rope_complex",
        notes=["as meta_rope_complex with is_causal=True (Meta's model is causal): the exported mask reads "
               "Shape(transpose(q_rot)), so the rotation cannot fold into the attention (BSND) and stays a "
               "RotaryEmbeddingQK in front of it"],
        doc="interleaved rotary on lane pairs + causal SDPA", source="models/meta_rope.py",
    ),
]

ALL_FIXTURES: list[Fixture | ModuleFixture] = [*FIXTURES, *MODULE_FIXTURES]


# --------------------------------------------------------------------------------------------
# Model construction
# --------------------------------------------------------------------------------------------


def fixture_seed(name: str) -> int:
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


def is_norm_module(module: torch.nn.Module) -> bool:
    cls = type(module).__name__
    return isinstance(module, torch.nn.LayerNorm) or cls.endswith("RMSNorm") or cls.endswith("LayerNorm")


@torch.no_grad()
def randomize_weights(model: torch.nn.Module, seed: int) -> None:
    """Overwrite every parameter from a seeded generator; norm weights ~ 1 + 0.1 randn."""
    gen = torch.Generator().manual_seed(seed)
    norm_params: set[str] = set()
    for mod_name, module in model.named_modules():
        if is_norm_module(module):
            for p_name, _ in module.named_parameters(recurse=False):
                norm_params.add(f"{mod_name}.{p_name}" if mod_name else p_name)
    seen: set[int] = set()  # tied parameters are visited once
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in seen:
            continue
        seen.add(id(param))
        noise = torch.randn(param.shape, generator=gen, dtype=torch.float32)
        if name in norm_params:
            if name.endswith("bias"):
                value = NORM_BIAS_STD * noise
            else:
                value = 1.0 + NORM_WEIGHT_STD * noise
        elif param.ndim >= 2:
            value = WEIGHT_STD * noise
        else:
            value = BIAS_STD * noise
        param.copy_(value.to(param.dtype))


def build_model(fx: Fixture, attn_impl: str) -> tuple[torch.nn.Module, transformers.PretrainedConfig]:
    """Build the model from its config with seeded random weights.

    The dtype is given to from_config (as from_pretrained(dtype=...) would) rather than
    applied with model.half(): that keeps the rotary inv_freq buffer in float32, as in real
    fp16 checkpoints."""
    config = fx.make_config()
    auto = transformers.AutoModelForCausalLM if fx.model_kind == "causal_lm" else transformers.AutoModel
    seed = fixture_seed(fx.weights_of or fx.name)
    torch.manual_seed(seed)
    model = auto.from_config(config, attn_implementation=attn_impl, dtype=fx.dtype)
    randomize_weights(model, seed)
    return model.eval(), model.config


def norm_inventory(model: torch.nn.Module, config: transformers.PretrainedConfig) -> dict[str, Any]:
    """Count the norm modules, split by normalised width (the export checks that the graph
    has exactly as many norms, so every one of them is used)."""
    counts: Counter[str] = Counter()
    eps_values: set[float] = set()
    classes: set[str] = set()
    for name, module in model.named_modules():
        if not is_norm_module(module):
            continue
        weight = getattr(module, "weight", None)
        width = int(weight.shape[-1]) if weight is not None else -1
        role = "hidden" if width == config.hidden_size else f"width_{width}"
        if width == head_dim_of(config) and width != config.hidden_size:
            role = "per_head"  # qwen3 q_norm / k_norm
        counts[role] += 1
        classes.add(type(module).__name__)
        eps = getattr(module, "variance_epsilon", None)
        if eps is None:
            eps = getattr(module, "eps", None)
        if eps is not None:
            eps_values.add(float(eps))
    return {"counts": dict(counts), "classes": sorted(classes), "eps": sorted(eps_values)}


def head_dim_of(config: transformers.PretrainedConfig) -> int:
    hd = getattr(config, "head_dim", None)
    if hd:
        return int(hd)
    return config.hidden_size // config.num_attention_heads


# --------------------------------------------------------------------------------------------
# Export wrappers
# --------------------------------------------------------------------------------------------


class LogitsWrapper(torch.nn.Module):
    """Calls the HF model with keyword inputs and returns one tensor (no cache)."""

    def __init__(self, model: torch.nn.Module, model_kind: str):
        super().__init__()
        self.model = model
        self.model_kind = model_kind

    def forward(self, input_ids, attention_mask, position_ids=None):
        kwargs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if position_ids is not None:
            kwargs["position_ids"] = position_ids
        if self.model_kind == "causal_lm":
            kwargs["use_cache"] = False
        out = self.model(**kwargs, return_dict=True)
        return out.logits if self.model_kind == "causal_lm" else out.last_hidden_state


class KVCacheWrapper(torch.nn.Module):
    """Decoder step with flat past tensors: (ids, mask, pos, past_k0, past_v0, ...) ->
    (logits, present_k0, present_v0, ...). The past is wrapped in a DynamicCache."""

    def __init__(self, model: torch.nn.Module, num_layers: int):
        super().__init__()
        self.model = model
        self.num_layers = num_layers

    def forward(self, input_ids, attention_mask, position_ids, *past):
        pairs = [(past[2 * i], past[2 * i + 1]) for i in range(self.num_layers)]
        cache = transformers.DynamicCache(ddp_cache_data=pairs, config=self.model.config)
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            use_cache=True,
            return_dict=True,
        )
        present = []
        for layer in out.cache.layers:
            present += [layer.keys, layer.values]
        return (out.logits, *present)


# --------------------------------------------------------------------------------------------
# Shared export routine
# --------------------------------------------------------------------------------------------


def _dtype_name(elem_type: int) -> str:
    return onnx.helper.tensor_dtype_to_np_dtype(elem_type).name


def _value_info(vi: onnx.ValueInfoProto) -> dict[str, Any]:
    tt = vi.type.tensor_type
    shape = [d.dim_param if d.HasField("dim_param") else int(d.dim_value) for d in tt.shape.dim]
    return {"name": vi.name, "dtype": _dtype_name(tt.elem_type), "shape": shape}


ATTN_IMPLEMENTATIONS = ("sdpa", "eager")  # tried in this order


def export_fixture(fx: Fixture | ModuleFixture, out_dir: Path) -> dict[str, Any]:
    """Export with sdpa attention; fall back to eager if the model or the export rejects it."""
    if isinstance(fx, ModuleFixture):
        return export_module_fixture(fx, out_dir)
    errors = []
    for attn_impl in [fx.attn_implementation] if fx.attn_implementation else ATTN_IMPLEMENTATIONS:
        try:
            entry = export_with_attention(fx, out_dir, attn_impl)
        except Exception as exc:
            errors.append(f"{attn_impl}: {_short_error(exc)}")
            continue
        entry["attn_fallback_reasons"] = errors
        return entry
    raise RuntimeError("; ".join(errors))


def _short_error(exc: BaseException) -> str:
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    return f"{type(exc).__name__}: {first[:300]}"


def strip_metadata(proto: onnx.ModelProto) -> None:
    """Drop the exporter's per-node debug metadata (stack traces with local paths, fx node
    text, module namespaces): it is ~40% of a tiny model's bytes and not reproducible across
    machines. Graph structure, names and values are untouched."""
    for node in proto.graph.node:
        del node.metadata_props[:]
    for vi in list(proto.graph.value_info) + list(proto.graph.input) + list(proto.graph.output):
        del vi.metadata_props[:]
    for init in proto.graph.initializer:
        del init.metadata_props[:]
    del proto.graph.metadata_props[:]
    del proto.metadata_props[:]


def make_inputs(
    fx: Fixture, config, batch: int, seq: int, past: int, seed: int, left_pad: int = 0
) -> tuple[list[str], list[torch.Tensor]]:
    """Model inputs in export order. `left_pad` zeroes the first mask entries of row 0."""
    gen = torch.Generator().manual_seed(seed)
    names = ["input_ids", "attention_mask"]
    mask = torch.ones(batch, past + seq, dtype=torch.int64)
    mask[0, :left_pad] = 0
    values = [torch.randint(0, config.vocab_size, (batch, seq), generator=gen), mask]
    if fx.position_ids or fx.kv_cache:
        names.append("position_ids")
        values.append(torch.arange(past, past + seq, dtype=torch.int64).unsqueeze(0).expand(batch, seq).contiguous())
    if fx.kv_cache:
        kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        for i in range(config.num_hidden_layers):
            for kind in ("key", "value"):
                names.append(f"past_key_values.{i}.{kind}")
                values.append(torch.randn(batch, kv_heads, past, head_dim_of(config), generator=gen).to(fx.dtype))
    return names, values


def dynamic_shapes_for(fx: Fixture, names: list[str]) -> tuple[Any, ...]:
    """Symbolic dims by name (the exporter turns them into Dim.DYNAMIC and keeps the names).
    torch.export wants the shapes of the wrapper's `*past` as one nested tuple."""
    by_name = {
        "input_ids": {0: "batch", 1: "seq"},
        "attention_mask": {0: "batch", 1: "total_seq" if fx.kv_cache else "seq"},
        "position_ids": {0: "batch", 1: "seq"},
    }
    head = [by_name[n] for n in names if n in by_name]
    past = [{0: "batch", 2: "past_seq"} for n in names if n.startswith("past_key_values.")]
    return (*head, tuple(past)) if fx.kv_cache else tuple(head)


def output_names_for(fx: Fixture, config) -> list[str]:
    names = ["logits" if fx.model_kind == "causal_lm" else "last_hidden_state"]
    if fx.kv_cache:
        names += [f"present.{i}.{k}" for i in range(config.num_hidden_layers) for k in ("key", "value")]
    return names


# (batch, seq, past, left_pad) shapes at which onnxruntime must reproduce torch.
VERIFY_SHAPES = [(SAMPLE_BATCH, SAMPLE_SEQ, SAMPLE_PAST, 0), (3, 5, 3, 2), (1, 1, 9, 0), (2, 4, 0, 0)]


def export_with_attention(fx: Fixture, out_dir: Path, attn_impl: str) -> dict[str, Any]:
    model, config = build_model(fx, attn_impl)
    if fx.kv_cache:
        wrapper: torch.nn.Module = KVCacheWrapper(model, config.num_hidden_layers)
    else:
        wrapper = LogitsWrapper(model, fx.model_kind)
    wrapper.eval()

    seed = fixture_seed(fx.name) + 1
    past = SAMPLE_PAST if fx.kv_cache else 0
    input_names, args = make_inputs(fx, config, SAMPLE_BATCH, SAMPLE_SEQ, past, seed)
    with torch.no_grad():
        if fx.exporter == "torchscript":
            proto = export_torchscript(fx, config, wrapper, input_names, args)
        else:
            program = torch.onnx.export(
                wrapper,
                tuple(args),
                dynamo=True,
                input_names=input_names,
                output_names=output_names_for(fx, config),
                dynamic_shapes=dynamic_shapes_for(fx, input_names),
                opset_version=fx.opset,
                optimize=True,
                external_data=False,
                verbose=False,
            )
            proto = program.model_proto
    strip_metadata(proto)
    proto.doc_string = f"otfuse fixture {fx.name}: tiny random-weight {fx.architecture} (models/export_fixtures.py)"
    onnx.checker.check_model(proto, full_check=True)
    data = proto.SerializeToString()

    # onnxruntime must reproduce torch at the tracing shape and at other shapes, with padding.
    for batch, seq, past_len, pad in VERIFY_SHAPES:
        past_len = past_len if fx.kv_cache else 0
        names, values = make_inputs(fx, config, batch, seq, past_len, seed + batch, left_pad=pad)
        with torch.no_grad():
            reference = wrapper(*values)
        compare_with_ort(
            fx, data, names, values, reference, padded_queries=max(0, pad - past_len),
            label=f"batch={batch} seq={seq} past={past_len} pad={pad}",
        )

    out_path = out_dir / f"{fx.name}.onnx"
    out_path.write_bytes(data)
    return manifest_entry(fx, proto, config, model, attn_impl, out_path, data)


def export_torchscript(fx: Fixture, config, wrapper, input_names, args) -> onnx.ModelProto:
    """torch.onnx.export(dynamo=False): the dims named as in the dynamo fixtures."""
    if fx.kv_cache:
        raise ValueError(f"{fx.name}: TorchScript export of a KV cache is not set up")
    axes = {name: dims for name, dims in zip(input_names, dynamic_shapes_for(fx, input_names))}
    output_names = output_names_for(fx, config)
    axes.update({name: {0: "batch", 1: "seq"} for name in output_names})
    buffer = io.BytesIO()
    torch.onnx.export(
        wrapper, tuple(args), buffer, dynamo=False, input_names=input_names, output_names=output_names,
        dynamic_axes=axes, opset_version=fx.opset, do_constant_folding=True, verbose=False,
    )
    return onnx.load_from_string(buffer.getvalue())


def compare_with_ort(
    fx: Fixture | ModuleFixture, data: bytes, names, values, reference, padded_queries: int, label: str
) -> None:
    """Outputs must match torch, except at padded query positions (row 0, the first
    `padded_queries` tokens) whose values are unspecified (fully masked softmax rows; fp16
    torch and onnxruntime disagree there)."""
    import numpy as np
    import onnxruntime as ort

    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    outs = sess.run(None, {n: v.numpy() for n, v in zip(names, values)})
    refs = reference if isinstance(reference, tuple) else (reference,)
    tol = 2e-2 if fx.dtype == torch.float16 else 1e-4
    for i, (out, ref) in enumerate(zip(outs, refs, strict=True)):
        ref = ref.float().numpy()
        out = out.astype(np.float32)
        if out.shape != ref.shape:
            raise RuntimeError(f"{fx.name} [{label}]: onnxruntime shape {out.shape} != torch {ref.shape}")
        if i == 0 and padded_queries:
            out, ref = out.copy(), ref.copy()
            out[0, :padded_queries] = ref[0, :padded_queries] = 0.0
        if not np.isfinite(out).all() or not np.allclose(out, ref, rtol=tol, atol=tol):
            diff = float(np.nanmax(np.abs(out - ref)))
            raise RuntimeError(f"{fx.name} [{label}]: onnxruntime differs from torch (max abs diff {diff:.3g})")


# --------------------------------------------------------------------------------------------
# Modules written here (models/rope3d.py)
# --------------------------------------------------------------------------------------------


MODULE_VERIFY_BATCHES = [SAMPLE_BATCH, 3, 1]  # onnxruntime must reproduce torch at these batches


def build_module(fx: ModuleFixture) -> torch.nn.Module:
    seed = fixture_seed(fx.weights_of or fx.name)
    torch.manual_seed(seed)
    module = fx.build()
    randomize_weights(module, seed)
    return module.to(fx.dtype).eval()


def module_inputs(module: torch.nn.Module, batch: int, seed: int, dtype: torch.dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    hidden = module.to_q.in_features
    return torch.randn(batch, module.seq_len, hidden, generator=gen).to(dtype)


def export_module_fixture(fx: ModuleFixture, out_dir: Path) -> dict[str, Any]:
    module = build_module(fx)
    seed = fixture_seed(fx.weights_of or fx.name) + 1
    sample = module_inputs(module, SAMPLE_BATCH, seed, fx.dtype)
    names = {"input_names": ["hidden_states"], "output_names": ["output"]}
    with torch.no_grad():
        if fx.exporter == "dynamo":
            program = torch.onnx.export(
                module, (sample,), dynamo=True, **names, dynamic_shapes=({0: "batch"},),
                opset_version=fx.opset, optimize=True, external_data=False, verbose=False,
            )
            proto = program.model_proto
        elif fx.exporter == "torchscript":
            buffer = io.BytesIO()
            torch.onnx.export(
                module, (sample,), buffer, dynamo=False, **names,
                dynamic_axes={"hidden_states": {0: "batch"}, "output": {0: "batch"}},
                opset_version=fx.opset, do_constant_folding=True, verbose=False,
            )
            proto = onnx.load_from_string(buffer.getvalue())
        else:
            raise ValueError(f"{fx.name}: unknown exporter {fx.exporter!r}")
    strip_metadata(proto)
    proto.doc_string = (
        f"otfuse fixture {fx.name}: {fx.doc}, random weights, "
        f"{fx.exporter} exporter (models/export_fixtures.py, {fx.source})"
    )
    onnx.checker.check_model(proto, full_check=True)
    data = proto.SerializeToString()

    for batch in MODULE_VERIFY_BATCHES:
        x = module_inputs(module, batch, seed + batch, fx.dtype)
        with torch.no_grad():
            reference = module(x)
        compare_with_ort(fx, data, ["hidden_states"], [x], reference, padded_queries=0, label=f"batch={batch}")

    out_path = out_dir / f"{fx.name}.onnx"
    out_path.write_bytes(data)
    return module_manifest_entry(fx, proto, module, out_path, data)


def module_rotary_details(module: torch.nn.Module) -> dict[str, Any]:
    """The multi-axis rotary block; the per-axis inv_freq buffers must be the default RoPE
    frequencies of each section at the module's theta."""
    for axis, width in zip("thw", module.sections):
        inv_freq = getattr(module, f"inv_freq_{axis}")
        if not torch.equal(inv_freq, rope3d.axis_inv_freq(width, module.theta)) or 2 * inv_freq.numel() != width:
            raise RuntimeError(f"inv_freq_{axis} does not match section {width}, theta {module.theta}")
    return {
        "style": "sections",
        "sections": list(module.sections),
        "section_axes": ["t", "h", "w"],
        "section_mode": "rotate_half",  # rotate_half inside each section
        "rotary_dim": sum(module.sections),
        "head_dim": module.head_dim,
        "partial": sum(module.sections) < module.head_dim,
        "theta": float(module.theta),
        "rope_type": "default",
        "grid": list(module.grid),
    }


def module_manifest_entry(fx: ModuleFixture, proto, module, path: Path, data: bytes) -> dict[str, Any]:
    import onnxscript

    # One attention (with RoPE on q and on k where the module has sections), no norms (derived
    # from the module, not the graph).
    rotary = module_rotary_details(module) if hasattr(module, "sections") else None
    if hasattr(module, "rotary_details"):  # models/meta_rope.py: interleaved pairs
        rotary = module.rotary_details()
    expected = {
        "rmsnorm": 0,
        "layernorm": 0,
        "hidden_norms": 0,
        "per_head_norms": 0,
        "attention": 1,
        "rotary_sites": 1 if rotary else 0,
        "rotary_applications": 2 if rotary else 0,
        "alibi_sites": 0,
    }
    if any(is_norm_module(m) for m in module.modules()):
        raise RuntimeError(f"{fx.name}: the module has norms; expected counts assume none")
    observed = graph_structure_counts(proto)
    mismatched = {k: (v, expected[k]) for k, v in observed.items() if v != expected[k]}
    if mismatched:
        raise RuntimeError(f"{fx.name}: graph structure counts (observed, expected) differ: {mismatched}")
    opset = {imp.domain or "ai.onnx": imp.version for imp in proto.opset_import}
    exporter = (
        "torch.onnx.export(dynamo=True, optimize=True)" if fx.exporter == "dynamo"
        else "torch.onnx.export(dynamo=False, do_constant_folding=True)"
    )
    hidden = module.to_q.in_features
    return {
        "file": path.name,
        "architecture": fx.architecture,
        "model_class": type(module).__name__,
        "dtype": str(fx.dtype).replace("torch.", ""),
        "kv_cache": fx.kv_cache,
        "exporter": exporter,
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "onnxscript": onnxscript.__version__,
            "onnx": onnx.__version__,
        },
        "opset": opset.get("ai.onnx"),
        "opset_imports": opset,
        "attn_implementation": getattr(module, "attn_implementation", "sdpa"),  # rope3d: F.scaled_dot_product_attention
        "seed": fixture_seed(fx.weights_of or fx.name),
        "size_bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "inputs": [_value_info(v) for v in proto.graph.input],
        "outputs": [_value_info(v) for v in proto.graph.output],
        "config": {
            "hidden_size": hidden,
            "num_layers": 1,
            "num_heads": module.heads,
            "num_kv_heads": getattr(module, "kv_heads", module.heads),
            "head_dim": module.head_dim,
            "intermediate_size": None,
            "vocab_size": None,
            "max_position_embeddings": None,
            "norm": None,
            "norm_classes": [],
            "norm_eps": None,
            "position_encoding": "rope" if rotary else None,
            "rotary": rotary,
            "sliding_window": None,
            "tie_word_embeddings": False,
        },
        "expected": expected,
        "graph_counts": observed,
        "graph_op_counts": graph_op_counts(proto),
        "notes": fx.notes,
        "attn_fallback_reasons": [],
    }


# --------------------------------------------------------------------------------------------
# Manifest
# --------------------------------------------------------------------------------------------


def rotary_details(fx: Fixture, config: transformers.PretrainedConfig) -> dict[str, Any] | None:
    if fx.position_encoding != "rope":
        return None
    head_dim = head_dim_of(config)
    rope = dict(getattr(config, "rope_parameters", None) or {})
    if fx.architecture == "gptj":
        rotary_dim = int(config.rotary_dim)
        theta = 10000.0
    else:
        factor = float(rope.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0)) or 1.0)
        rotary_dim = int(head_dim * factor)
        theta = float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0)))
    return {
        "style": fx.rotary_style,
        "rotary_dim": rotary_dim,
        "head_dim": head_dim,
        "partial": rotary_dim < head_dim,
        "theta": theta,
        "rope_type": rope.get("rope_type", "default"),
    }


def check_rotary_against_model(model: torch.nn.Module, rotary: dict[str, Any] | None) -> None:
    """The config-derived rotary width and theta must match the model's inv_freq buffer."""
    inv_freqs = [b for name, b in model.named_buffers() if name.endswith("inv_freq")]
    if rotary is None or not inv_freqs:
        return
    inv_freq = inv_freqs[0].float()
    if 2 * inv_freq.numel() != rotary["rotary_dim"]:
        raise RuntimeError(f"rotary_dim {rotary['rotary_dim']} != 2 * len(inv_freq) {2 * inv_freq.numel()}")
    theta = float(inv_freq[1]) ** (-rotary["rotary_dim"] / 2)
    if abs(theta / rotary["theta"] - 1) > 1e-3:
        raise RuntimeError(f"rope theta {rotary['theta']} != {theta} derived from inv_freq")


def expected_counts(fx: Fixture, config, inventory: dict[str, Any]) -> dict[str, int]:
    layers = config.num_hidden_layers
    counts = inventory["counts"]
    total_norms = sum(counts.values())
    exp = {
        "rmsnorm": total_norms if fx.norm == "RMSNorm" else 0,
        "layernorm": total_norms if fx.norm == "LayerNorm" else 0,
        "hidden_norms": counts.get("hidden", 0),
        "per_head_norms": counts.get("per_head", 0),
        "attention": layers,
        "rotary_sites": layers if fx.position_encoding == "rope" else 0,
        "rotary_applications": 2 * layers if fx.position_encoding == "rope" else 0,
        "alibi_sites": layers if fx.position_encoding == "alibi" else 0,
    }
    return exp


def graph_op_counts(proto: onnx.ModelProto) -> dict[str, int]:
    return dict(sorted(Counter(n.op_type for n in proto.graph.node).items()))


def manifest_entry(fx, proto, config, model, attn_impl, path: Path, data: bytes) -> dict[str, Any]:
    import onnxscript

    inventory = norm_inventory(model, config)
    num_heads = config.num_attention_heads
    expected = expected_counts(fx, config, inventory)
    observed = graph_structure_counts(proto)
    mismatched = {k: (v, expected[k]) for k, v in observed.items() if v != expected[k]}
    if mismatched:
        raise RuntimeError(f"{fx.name}: graph structure counts (observed, expected) differ: {mismatched}")
    rotary = rotary_details(fx, config)
    check_rotary_against_model(model, rotary)
    opset = {imp.domain or "ai.onnx": imp.version for imp in proto.opset_import}
    entry = {
        "file": path.name,
        "architecture": fx.architecture,
        "model_class": type(model).__name__,
        "dtype": str(fx.dtype).replace("torch.", ""),
        "kv_cache": fx.kv_cache,
        "exporter": "torch.onnx.export(dynamo=True, optimize=True)" if fx.exporter == "dynamo"
        else "torch.onnx.export(dynamo=False, do_constant_folding=True)",
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "onnxscript": onnxscript.__version__,
            "onnx": onnx.__version__,
        },
        "opset": opset.get("ai.onnx"),
        "opset_imports": opset,
        "attn_implementation": attn_impl,
        "seed": fixture_seed(fx.weights_of or fx.name),
        "size_bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "inputs": [_value_info(v) for v in proto.graph.input],
        "outputs": [_value_info(v) for v in proto.graph.output],
        "config": {
            "hidden_size": config.hidden_size,
            "num_layers": config.num_hidden_layers,
            "num_heads": num_heads,
            "num_kv_heads": getattr(config, "num_key_value_heads", None) or num_heads,
            "head_dim": head_dim_of(config),
            "intermediate_size": intermediate_size_of(config),
            "vocab_size": config.vocab_size,
            "max_position_embeddings": getattr(config, "max_position_embeddings", None)
            or getattr(config, "n_positions", None),
            "norm": fx.norm,
            "norm_classes": inventory["classes"],
            "norm_eps": inventory["eps"][0] if len(inventory["eps"]) == 1 else inventory["eps"],
            "position_encoding": fx.position_encoding,
            "rotary": rotary,
            "sliding_window": getattr(config, "sliding_window", None)
            if getattr(config, "use_sliding_window", True)
            else None,
            "tie_word_embeddings": bool(getattr(config, "tie_word_embeddings", False)),
        },
        "expected": expected,
        "graph_counts": observed,
        "graph_op_counts": graph_op_counts(proto),
        "notes": fx.notes,
    }
    return entry


def intermediate_size_of(config) -> int:
    for key in ("intermediate_size", "n_inner"):
        value = getattr(config, key, None)
        if value:
            return int(value)
    return 4 * config.hidden_size


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", metavar="NAME", help="export only these fixtures")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "fixtures")
    opts = parser.parse_args(argv)

    names = [fx.name for fx in ALL_FIXTURES]
    selected = ALL_FIXTURES
    if opts.only:
        unknown = sorted(set(opts.only) - set(names))
        if unknown:
            parser.error(f"unknown fixture(s) {unknown}; known: {names}")
        selected = [fx for fx in ALL_FIXTURES if fx.name in opts.only]

    opts.out.mkdir(parents=True, exist_ok=True)
    manifest_path = opts.out / "manifest.json"
    manifest: dict[str, Any] = {"fixtures": {}, "failed": {}}
    if manifest_path.exists():
        manifest = json.loads(manifest_path.read_text())
        manifest.setdefault("fixtures", {})
        manifest.setdefault("failed", {})

    warnings.filterwarnings("ignore")
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)  # "torchvision is not installed" noise
    transformers.logging.set_verbosity_error()
    status = 0
    for fx in selected:
        print(f"[export] {fx.name} ...", flush=True)
        try:
            entry = export_fixture(fx, opts.out)
        except Exception as exc:  # record the failure; keep exporting the rest
            status = 1
            reason = _short_error(exc)
            print(f"[failed] {fx.name}: {reason}", flush=True)
            manifest["fixtures"].pop(fx.name, None)
            manifest["failed"][fx.name] = reason
            continue
        manifest["failed"].pop(fx.name, None)
        manifest["fixtures"][fx.name] = entry
        print(f"[ok]     {fx.name}: {entry['size_bytes'] / 1024:.0f} KiB, opset {entry['opset']}", flush=True)

    manifest["fixtures"] = dict(sorted(manifest["fixtures"].items()))
    manifest["failed"] = dict(sorted(manifest["failed"].items()))
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
