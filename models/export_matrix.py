#!/usr/bin/env python
"""Export a wide corpus of tiny random-weight models: architectures x exporters x tool chains.

Run with the export venv (torch, transformers, onnxscript, onnxsim, onnxslim, onnxconverter-common):

    python models/export_matrix.py --out /work/corpus                  # the wide corpus (not committed)
    python models/export_matrix.py --out /work/corpus --arch llama bert  # a subset (manifest merged)
    python models/export_matrix.py --preset matrix                     # the committed matrix:
                                          # models/fixtures/matrix (weights packed per family)
    python models/export_matrix.py --preset matrix --staging /work/corpus   # pack existing exports

Every architecture is exported by the dynamo exporter (opset 20) and the TorchScript exporter at
opsets 14, 17 and 20, with and without a `position_ids` input (where the model's forward takes one),
with dynamic and static shapes. Some exports then go through tool chains (`CHAINS`): the dynamo
exporter without its optimizer (onnxscript's raw output), onnxsim, onnxslim, ONNX Runtime's offline
optimisation (basic, extended), fp16 (onnxconverter-common, keep_io_types=True), and optimum-onnx's
decoder export with and without past (models/optimum_export.py, in its own transformers: see
`OPTIMUM_TARGET`).

Each model gets a sidecar `<name>.json` with the sites it must contain (`expected`: rope, attention,
norm, residual_norm, per layer and in all), counted on the torch model while it runs (models/sites.py),
never from otfuse. Every export that fails is recorded under `failed` in the manifest with its error.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import io
import json
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any, Callable

import onnx
import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent))
import decoder_configs as dc  # noqa: E402
import export_fixtures as ef  # noqa: E402
import matrix_pack  # noqa: E402
import sites  # noqa: E402
import traceable_masks  # noqa: E402

HERE = Path(__file__).resolve().parent
MATRIX_DIR = HERE / "fixtures" / "matrix"
OPTIMUM_TARGET = Path(os.environ.get("OTFUSE_OPTIMUM_TARGET", "/work/venvs/optimum-target"))

# --------------------------------------------------------------------------------------------
# Architectures: the fixtures' configs (export_fixtures.py) and more, at the same tiny sizes.
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Arch:
    name: str
    make_config: Callable[[], transformers.PretrainedConfig]
    kind: str = "causal_lm"  # causal_lm | base (text encoder) | vision | audio | t5_encoder
    position_ids: bool = True  # the forward takes position_ids
    attn_implementation: str | None = None  # None: sdpa, else eager
    model_class: str | None = None  # a transformers class name instead of the Auto class
    submodule: str | None = None  # export this child (whisper: the encoder)
    seed_name: str | None = None  # the fixture whose seed (and so weights) this model shares
    # Exporters ("dynamo", "torchscript") known not to give a faithful model, with the reason: recorded
    # as failed without trying (TorchScript traces MoE routing as constants: a wrong model that can pass
    # the checks on the few inputs verify_with_torch runs)
    not_exported_by: dict[str, str] = dataclasses.field(default_factory=dict)
    # transformers 5's experts: "batched_mm" gathers each token's experts' weights (no data-dependent
    # shapes); the default grouped_mm is a transformers custom op torch.onnx has no translation for
    experts_implementation: str | None = None


def gemma_config():
    return transformers.GemmaConfig(**ef._gqa_sizes(head_dim=ef.HEAD_DIM, rms_norm_eps=1e-6))


def phi3_config():
    return transformers.Phi3Config(**ef._gqa_sizes(rms_norm_eps=1e-5, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                                   resid_pdrop=0.0, embd_pdrop=0.0))


def falcon_config():  # falcon-7b's layout: multi-query (1 kv head), parallel attention, rotary
    return transformers.FalconConfig(hidden_size=ef.HIDDEN, num_hidden_layers=ef.LAYERS, num_attention_heads=ef.HEADS,
                                     vocab_size=ef.VOCAB, multi_query=True, parallel_attn=True, alibi=False,
                                     new_decoder_architecture=False, bias=False, use_cache=False,
                                     hidden_dropout=0.0, attention_dropout=0.0, max_position_embeddings=ef.MAX_POS)


def mpt_config():  # ALiBi, bias-free LayerNorm
    return transformers.MptConfig(d_model=ef.HIDDEN, n_heads=ef.HEADS, n_layers=ef.LAYERS, expansion_ratio=2,
                                  max_seq_len=ef.MAX_POS, vocab_size=ef.VOCAB, use_cache=False,
                                  attn_config={"alibi": True})


def opt_config():
    return transformers.OPTConfig(hidden_size=ef.HIDDEN, num_hidden_layers=ef.LAYERS, ffn_dim=ef.INTERMEDIATE,
                                  num_attention_heads=ef.HEADS, vocab_size=ef.VOCAB, max_position_embeddings=ef.MAX_POS,
                                  word_embed_proj_dim=ef.HIDDEN, do_layer_norm_before=True, dropout=0.0,
                                  attention_dropout=0.0, use_cache=False, pad_token_id=1, bos_token_id=2, eos_token_id=2)


def stablelm_config():
    return transformers.StableLmConfig(**ef._gqa_sizes(partial_rotary_factor=0.25, layer_norm_eps=1e-5))


def starcoder2_config():
    return transformers.Starcoder2Config(**ef._gqa_sizes(norm_epsilon=1e-5, sliding_window=None, use_bias=True,
                                                         residual_dropout=0.0, embedding_dropout=0.0))


def olmo_config():  # non-parametric LayerNorm (no weight, no bias)
    return transformers.OlmoConfig(**ef._gqa_sizes(pad_token_id=1, bos_token_id=None, eos_token_id=2))


def granite_config():  # llama with multipliers on embeddings, residuals, attention and logits
    return transformers.GraniteConfig(**ef._gqa_sizes(embedding_multiplier=2.0, residual_multiplier=0.5,
                                                      attention_multiplier=0.2, logits_scaling=4.0))


def roberta_config():  # positions from the padding mask (cumsum), offset by pad_token_id + 1
    return transformers.RobertaConfig(hidden_size=ef.HIDDEN, num_hidden_layers=ef.LAYERS,
                                      num_attention_heads=ef.HEADS, intermediate_size=ef.INTERMEDIATE,
                                      vocab_size=ef.VOCAB, max_position_embeddings=ef.MAX_POS + 2, pad_token_id=1,
                                      hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                      add_pooling_layer=False)


def distilbert_config():
    return transformers.DistilBertConfig(dim=ef.HIDDEN, n_layers=ef.LAYERS, n_heads=ef.HEADS,
                                         hidden_dim=ef.INTERMEDIATE, vocab_size=ef.VOCAB,
                                         max_position_embeddings=ef.MAX_POS, dropout=0.0, attention_dropout=0.0)


VIT_IMAGE, VIT_PATCH = 32, 8  # 16 patches + CLS = 17 tokens


def vit_config():
    return transformers.ViTConfig(hidden_size=ef.HIDDEN, num_hidden_layers=ef.LAYERS, num_attention_heads=ef.HEADS,
                                  intermediate_size=ef.INTERMEDIATE, image_size=VIT_IMAGE, patch_size=VIT_PATCH,
                                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


WHISPER_MELS, WHISPER_POSITIONS = 16, 16  # the encoder reads 2 * 16 = 32 frames


def whisper_config():
    return transformers.WhisperConfig(d_model=ef.HIDDEN, encoder_layers=ef.LAYERS, decoder_layers=ef.LAYERS,
                                      encoder_attention_heads=ef.HEADS, decoder_attention_heads=ef.HEADS,
                                      encoder_ffn_dim=ef.INTERMEDIATE, decoder_ffn_dim=ef.INTERMEDIATE,
                                      num_mel_bins=WHISPER_MELS, max_source_positions=WHISPER_POSITIONS,
                                      max_target_positions=ef.MAX_POS, vocab_size=ef.VOCAB, dropout=0.0,
                                      attention_dropout=0.0, use_cache=False, pad_token_id=0, bos_token_id=1,
                                      eos_token_id=2, decoder_start_token_id=1)


def t5_config():  # RMS norm without mean (T5LayerNorm), relative position bias, unscaled scores
    return transformers.T5Config(d_model=ef.HIDDEN, d_kv=ef.HEAD_DIM, d_ff=ef.INTERMEDIATE, num_layers=ef.LAYERS,
                                 num_heads=ef.HEADS, vocab_size=ef.VOCAB, dropout_rate=0.0, use_cache=False,
                                 feed_forward_proj="relu")


ARCHS: list[Arch] = [
    Arch("llama", ef.llama_config),
    Arch("qwen2", ef.qwen2_config),
    Arch("qwen3", ef.qwen3_config),
    Arch("mistral", ef.mistral_config),
    Arch("gemma", gemma_config),
    Arch("gemma2", ef.gemma2_config, attn_implementation="eager"),
    Arch("phi", ef.phi_config),
    Arch("phi3", phi3_config),
    Arch("gpt_neox", ef.gpt_neox_config),
    Arch("gptj", ef.gptj_config),
    Arch("gpt2", ef.gpt2_config),
    Arch("bloom", ef.bloom_config, position_ids=False, attn_implementation="eager"),
    Arch("falcon", falcon_config),
    Arch("mpt", mpt_config, position_ids=False, attn_implementation="eager"),
    Arch("opt", opt_config),
    Arch("stablelm", stablelm_config),
    Arch("starcoder2", starcoder2_config),
    Arch("olmo", olmo_config),
    Arch("granite", granite_config),
    Arch("bert", ef.bert_config, kind="base"),
    Arch("roberta", roberta_config, kind="base"),
    Arch("distilbert", distilbert_config, kind="base", position_ids=False),
    Arch("vit", vit_config, kind="vision", position_ids=False),
    Arch("whisper_encoder", whisper_config, kind="audio", position_ids=False, model_class="WhisperModel",
         submodule="encoder"),
    Arch("t5_encoder", t5_config, kind="t5_encoder", position_ids=False, model_class="T5EncoderModel"),
    # Decoders spelling RoPE / attention / norms / activations differently (models/decoder_configs.py).
    Arch("cohere", dc.cohere_config),
    Arch("cohere_qknorm", dc.cohere_qknorm_config),
    Arch("olmo2", dc.olmo2_config),
    Arch("gemma3", dc.gemma3_config, model_class="Gemma3ForCausalLM"),
    Arch("llama3_rope", dc.llama3_rope_config),
    Arch("llama_yarn", dc.llama_yarn_config),
    Arch("llama_dynamic", dc.llama_dynamic_config),
    Arch("phi3_longrope", dc.phi3_longrope_config),
    Arch("nemotron", dc.nemotron_config),
    Arch("glm", dc.glm_config),
    Arch("glm4", dc.glm4_config),
    Arch("helium", dc.helium_config),
    Arch("exaone4", dc.exaone4_config),
    Arch("smollm3", dc.smollm3_config),
    Arch("arcee", dc.arcee_config),
    Arch("apertus", dc.apertus_config),
    Arch("mixtral", dc.mixtral_config, not_exported_by=dc.MOE_TRACE),
    Arch("qwen2_moe", dc.qwen2_moe_config, not_exported_by=dc.MOE_TRACE),
    Arch("granitemoe", dc.granitemoe_config, not_exported_by=dc.MOE_TRACE),
    Arch("qwen2_vl_text", dc.qwen2_vl_text_config, kind="base", model_class="Qwen2VLTextModel"),
    Arch("deepseek_v3", dc.deepseek_v3_config),
    Arch("persimmon", dc.persimmon_config),
    # transformers 5.x decoders (models/decoder_configs.py, 5.24's keys).
    Arch("gpt_oss", dc.gpt_oss_config, attn_implementation="eager", experts_implementation="batched_mm"),
    Arch("qwen3_moe", dc.qwen3_moe_config, experts_implementation="batched_mm"),
    Arch("qwen3_next", dc.qwen3_next_config, experts_implementation="batched_mm"),
    Arch("llama4_text", dc.llama4_text_config, model_class="Llama4ForCausalLM"),
    Arch("gemma3n_text", dc.gemma3n_text_config, model_class="Gemma3nForCausalLM"),
    Arch("olmo3", dc.olmo3_config),
    Arch("ernie4_5", dc.ernie4_5_config),
    Arch("hunyuan_v1_dense", dc.hunyuan_v1_dense_config),
    Arch("seed_oss", dc.seed_oss_config),
    Arch("glm4_moe", dc.glm4_moe_config, experts_implementation="batched_mm"),
    Arch("dots1", dc.dots1_config, experts_implementation="batched_mm"),
    Arch("minimax", dc.minimax_config, experts_implementation="batched_mm"),
    Arch("falcon_h1", dc.falcon_h1_config),
    Arch("bamba", dc.bamba_config),
    Arch("granitemoehybrid", dc.granitemoehybrid_config, experts_implementation="batched_mm"),
    Arch("lfm2", dc.lfm2_config),
    Arch("deepseek_v2", dc.deepseek_v2_config),
]
# The committed fixtures of new forms (models/fixtures/arch5): shrunk configs, kept out of the corpus.
FIXTURE_ARCHS: list[Arch] = [
    Arch("gpt_oss_fx", dc.fixture_config(dc.gpt_oss_config), attn_implementation="eager",
         experts_implementation="batched_mm"),
    Arch("hunyuan_v1_dense_fx", dc.fixture_config(dc.hunyuan_v1_dense_config)),
    Arch("gemma3n_text_fx", dc.fixture_config(dc.gemma3n_text_config), model_class="Gemma3nForCausalLM"),
    Arch("bamba_fx", dc.fixture_config(dc.bamba_config)),
]
ARCH_BY_NAME = {a.name: a for a in [*ARCHS, *FIXTURE_ARCHS]}
# Tried and left out, with the reason (transformers 4.57.6, torch 2.15).
NOT_BUILT = {
    "stablelm_qk": "StableLmConfig(qk_layernorm=True): StableLmPreTrainedModel._init_weights zeroes the bias of "
                   "its bias-free per-head nn.LayerNorm (AttributeError: 'NoneType' object has no attribute 'data')",
}

# The committed matrix (models/fixtures/matrix): the families issue 10 names.
MATRIX_ARCHS = ["llama", "qwen2", "mistral", "gpt_neox", "gptj", "phi", "bert", "gpt2", "bloom"]
# Families with only a few variants in the matrix, for a spelling no matrix family writes: Falcon's
# one kv head broadcast by the MatMuls (no repeat_kv), MPT's ALiBi added before its masked_fill.
MATRIX_EXTRA = {"falcon": ["dynamo_pos_dyn", "ts17_pos_dyn"], "mpt": ["dynamo_nopos_dyn", "ts17_nopos_dyn"]}

# --------------------------------------------------------------------------------------------
# Variants
# --------------------------------------------------------------------------------------------

EXPORTERS = {"dynamo": ("dynamo", ef.OPSET), "ts14": ("torchscript", 14), "ts17": ("torchscript", 17),
             "ts20": ("torchscript", 20)}
# Tool chains applied to a base export (the part of the name after the first '.').
CHAINS = ["unoptimised", "onnxsim", "onnxslim", "ort_basic", "ort_extended", "fp16"]
CHAIN_BASES = {"corpus": ["dynamo_pos_dyn", "ts17_pos_dyn"], "matrix": ["dynamo_pos_dyn"]}
LEAN_STATIC = {"ts17_pos_static", "ts17_nopos_static"}  # the static shapes kept outside MATRIX_ARCHS
OPTIMUM_TASKS = {"optimum_nopast": "text-generation", "optimum_past": "text-generation-with-past"}


@dataclasses.dataclass(frozen=True)
class Variant:
    exporter: str  # a key of EXPORTERS, or "optimum"
    position_ids: bool = True
    dynamic: bool = True
    chain: str | None = None  # one of CHAINS applied to the base export, or an OPTIMUM_TASKS key

    @property
    def base(self) -> str:
        return f"{self.exporter}_{'pos' if self.position_ids else 'nopos'}_{'dyn' if self.dynamic else 'static'}"

    @property
    def name(self) -> str:
        if self.exporter == "optimum":
            return self.chain
        return f"{self.base}.{self.chain}" if self.chain else self.base


def variants_for(arch: Arch, preset: str) -> list[Variant]:
    """Every exporter x position_ids x shapes, then the tool chains on CHAIN_BASES. Outside
    MATRIX_ARCHS the corpus is leaner (`LEAN_STATIC`, chains on dynamo only): a dynamo export takes
    ~45 s on the shared 2-core machine, a TorchScript one ~6 s."""
    lean = preset == "corpus" and arch.name not in MATRIX_ARCHS
    out = []
    for exporter in EXPORTERS:
        for pos in ([True, False] if arch.position_ids else [False]):
            for dynamic in (True, False):
                variant = Variant(exporter, pos, dynamic)
                if dynamic or not lean or variant.base in LEAN_STATIC:
                    out.append(variant)
    for base in CHAIN_BASES[preset][:1] if lean else CHAIN_BASES[preset]:
        exporter, pos, _ = base.split("_")
        pos_ok = pos == "pos" if arch.position_ids else False
        for chain in CHAINS:
            if chain in ("unoptimised", "fp16") and exporter != "dynamo":
                continue  # fp16 of a TorchScript export: onnxconverter-common ran 16 CPU-minutes without end
            out.append(Variant(exporter, pos_ok, True, chain))
    if arch.kind == "causal_lm":
        out += [Variant("optimum", arch.position_ids, chain=task) for task in OPTIMUM_TASKS]
    return list(dict.fromkeys(out))  # position_ids-less models: pos and nopos bases coincide


# --------------------------------------------------------------------------------------------
# Models, inputs, wrappers
# --------------------------------------------------------------------------------------------


def seed_of(arch: Arch) -> int:
    return ef.fixture_seed(arch.seed_name or arch.name)  # matrix families: the committed fixture's seed


def build(arch: Arch) -> torch.nn.Module:
    config = arch.make_config()
    seed = seed_of(arch)
    torch.manual_seed(seed)
    attn = arch.attn_implementation or "sdpa"
    kwargs = {"experts_implementation": arch.experts_implementation} if arch.experts_implementation else {}
    if arch.model_class:
        model = getattr(transformers, arch.model_class)._from_config(config, attn_implementation=attn, **kwargs)
    elif arch.kind == "causal_lm":
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attn, **kwargs)
    else:
        model = transformers.AutoModel.from_config(config, attn_implementation=attn, **kwargs)
    if arch.submodule:
        model = getattr(model, arch.submodule)
    ef.randomize_weights(model, seed)
    return model.eval()


class Wrapper(torch.nn.Module):
    """Calls the model with keyword inputs; returns its main output tensor."""

    def __init__(self, model: torch.nn.Module, arch: Arch, names: list[str]):
        super().__init__()
        self.model, self.arch, self.names = model, arch, names

    def forward(self, *args):
        kwargs = dict(zip(self.names, args))
        if self.arch.kind == "causal_lm":
            kwargs["use_cache"] = False
        out = self.model(**kwargs, return_dict=True)
        return out.logits if self.arch.kind == "causal_lm" else out.last_hidden_state


def make_inputs(arch: Arch, config, variant: Variant, batch: int, seq: int, seed: int,
                left_pad: int = 0) -> tuple[list[str], list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    if arch.kind == "vision":
        return ["pixel_values"], [torch.randn(batch, 3, VIT_IMAGE, VIT_IMAGE, generator=gen)]
    if arch.kind == "audio":
        return ["input_features"], [torch.randn(batch, WHISPER_MELS, 2 * WHISPER_POSITIONS, generator=gen)]
    mask = torch.ones(batch, seq, dtype=torch.int64)
    mask[0, :left_pad] = 0
    ids = torch.randint(3, config.vocab_size, (batch, seq), generator=gen)  # 0..2: pad / bos / eos
    names, values = ["input_ids", "attention_mask"], [ids, mask]
    if variant.position_ids:
        names.append("position_ids")
        values.append(torch.arange(seq, dtype=torch.int64).unsqueeze(0).expand(batch, seq).contiguous())
    return names, values


def dynamic_axes(arch: Arch, names: list[str]) -> dict[str, dict[int, str]]:
    if arch.kind in ("vision", "audio"):
        return {names[0]: {0: "batch"}}
    return {name: {0: "batch", 1: "seq"} for name in names}


def output_name(arch: Arch) -> str:
    return "logits" if arch.kind == "causal_lm" else "last_hidden_state"


# (batch, seq, left_pad) at which onnxruntime must reproduce torch; static exports: the first only.
VERIFY = [(ef.SAMPLE_BATCH, ef.SAMPLE_SEQ, 0), (3, 5, 2)]


@dataclasses.dataclass
class _Checked:  # what ef.compare_with_ort reads of a fixture
    name: str
    dtype: torch.dtype = torch.float32


def export_base(arch: Arch, model: torch.nn.Module, variant: Variant, optimize: bool = True) -> bytes:
    exporter, opset = EXPORTERS[variant.exporter]
    names, args = make_inputs(arch, model.config, variant, ef.SAMPLE_BATCH, ef.SAMPLE_SEQ, seed_of(arch) + 1)
    wrapper = Wrapper(model, arch, names).eval()
    axes = dynamic_axes(arch, names) if variant.dynamic else None
    with torch.no_grad():
        if exporter == "dynamo":
            program = torch.onnx.export(
                wrapper, tuple(args), dynamo=True, input_names=names, output_names=[output_name(arch)],
                dynamic_shapes=(tuple(axes[n] for n in names),) if axes else None, opset_version=opset,
                optimize=optimize, external_data=False, verbose=False)
            proto = program.model_proto
        else:
            buffer = io.BytesIO()
            if axes:
                axes = {**axes, output_name(arch): {0: "batch", 1: "seq"} if arch.kind in ("causal_lm", "base",
                                                                                             "t5_encoder")
                        else {0: "batch"}}
            with traceable_masks.broadcast_masks():  # transformers 4.57's vmap masks do not trace
                torch.onnx.export(wrapper, tuple(args), buffer, dynamo=False, input_names=names,
                                  output_names=[output_name(arch)], dynamic_axes=axes, opset_version=opset,
                                  do_constant_folding=True, verbose=False)
            proto = onnx.load_from_string(buffer.getvalue())
    ef.strip_metadata(proto)
    proto.doc_string = f"otfuse corpus {arch.name} {variant.name}: tiny random-weight model (models/export_matrix.py)"
    data = proto.SerializeToString()
    verify_with_torch(arch, wrapper, variant, data)
    return data


def verify_with_torch(arch: Arch, wrapper, variant: Variant, data: bytes) -> None:
    shapes = VERIFY if variant.dynamic else VERIFY[:1]
    for batch, seq, pad in shapes:
        if arch.kind in ("vision", "audio"):
            pad = 0
        names, values = make_inputs(arch, wrapper.model.config, variant, batch, seq, seed_of(arch) + batch, pad)
        with torch.no_grad():
            reference = wrapper(*values)
        ef.compare_with_ort(_Checked(f"{arch.name}/{variant.name}"), data, names, values, reference,
                            padded_queries=pad, label=f"batch={batch} seq={seq} pad={pad}")


def feeds_for(arch: Arch, config, variant: Variant) -> dict[str, Any]:
    names, values = make_inputs(arch, config, variant, ef.SAMPLE_BATCH, ef.SAMPLE_SEQ, seed_of(arch) + 7)
    return {n: v.numpy() for n, v in zip(names, values)}


# --------------------------------------------------------------------------------------------
# Tool chains
# --------------------------------------------------------------------------------------------


def apply_chain(chain: str, base: Path, out: Path) -> None:
    """Write `out` = `chain` applied to the model at `base` (all weights inline)."""
    if chain == "onnxsim":
        import onnxsim

        model, ok = onnxsim.simplify(onnx.load(base))
        if not ok:
            raise RuntimeError("onnxsim could not validate the simplified model")
        onnx.save(model, out)
    elif chain == "onnxslim":
        import onnxslim

        onnx.save(onnxslim.slim(onnx.load(base)), out)
    elif chain in ("ort_basic", "ort_extended"):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_BASIC if chain == "ort_basic"
                                            else ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED)
        options.optimized_model_filepath = str(out)
        ort.InferenceSession(str(base), options, providers=["CPUExecutionProvider"])
    elif chain == "fp16":
        from onnxconverter_common import float16

        # Cast kept in float32 (blocked): with the default list the converter retypes a Cast(to=FLOAT)'s
        # output as float16 and ONNX Runtime refuses the model (every RMSNorm here has one).
        blocked = [*float16.DEFAULT_OP_BLOCK_LIST, "Cast"]
        with time_limit(CHAIN_SECONDS, "onnxconverter-common's float16 conversion"):  # TorchScript: no end seen
            model = float16.convert_float_to_float16(onnx.load(base), keep_io_types=True, op_block_list=blocked)
        onnx.save(model, out)
    else:
        raise ValueError(f"unknown chain {chain!r}")


CHAIN_SECONDS = 180


@contextlib.contextmanager
def time_limit(seconds: int, what: str):
    """Raise TimeoutError in the (pure Python) tool after `seconds`, so the export is recorded as failed."""
    def expire(signum, frame):
        raise TimeoutError(f"{what} did not finish in {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def check_against(base: Path, derived: Path, feeds: dict[str, Any], tol: float) -> float:
    """Run both models in ORT (optimisations off); the largest difference of the first output.
    Raises when it exceeds `tol` (fp16 is recorded, never raised: see the sidecar)."""
    import numpy as np
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    outs = []
    for path in (base, derived):
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        wanted = {i.name for i in session.get_inputs()}
        outs.append(session.run(None, {k: v for k, v in feeds.items() if k in wanted})[0].astype(np.float32))
    diff = float(np.max(np.abs(outs[0] - outs[1])))
    if not np.isfinite(outs[1]).all() or diff > tol:
        raise RuntimeError(f"the derived model differs from its base by {diff:.3g} (> {tol})")
    return diff


def with_empty_past(path: Path, feeds: dict[str, Any]) -> dict[str, Any]:
    """`feeds` plus a zero-length past for every `past_key_values.*` input of the model at `path`."""
    import numpy as np

    model = onnx.load(path, load_external_data=False)
    out = dict(feeds)
    for value in model.graph.input:
        if value.name.startswith("past_key_values"):
            dims = [d.dim_value if d.HasField("dim_value") else 0 for d in value.type.tensor_type.shape.dim]
            dims[0] = next(iter(feeds.values())).shape[0]
            out[value.name] = np.zeros(dims, dtype=np.float32)
    return out


def export_optimum(arch: Arch, model: torch.nn.Module, task: str, workdir: Path, out: Path) -> None:
    """optimum-onnx exports from a saved checkpoint, in its own (older) transformers."""
    if not OPTIMUM_TARGET.is_dir():
        raise RuntimeError(f"optimum-onnx is not installed in {OPTIMUM_TARGET} (see models/README.md)")
    checkpoint = workdir / f"{arch.name}_hf"
    if not checkpoint.is_dir():
        model.save_pretrained(checkpoint)
        legacy_config_keys(checkpoint / "config.json")
    env = {**os.environ, "PYTHONPATH": str(OPTIMUM_TARGET)}
    done = subprocess.run([sys.executable, str(HERE / "optimum_export.py"), str(checkpoint), task, str(out)],
                          env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        lines = [line for line in (done.stderr or done.stdout).strip().splitlines() if line.strip()]
        raise RuntimeError(f"optimum export failed: {lines[-1] if lines else done.returncode}")


def legacy_config_keys(path: Path) -> None:
    """transformers 5 writes rope_parameters; the transformers optimum pins reads rope_theta and
    partial_rotary_factor: write both spellings so the older library builds the same model."""
    config = json.loads(path.read_text())
    rope = config.get("rope_parameters") or {}
    for key in ("rope_theta", "partial_rotary_factor"):
        if key in rope and key not in config:
            config[key] = rope[key]
    path.write_text(json.dumps(config, indent=2))


# --------------------------------------------------------------------------------------------
# One architecture, all its variants
# --------------------------------------------------------------------------------------------


def export_arch(arch: Arch, variants: list[Variant], out_dir: Path, workdir: Path) -> tuple[dict, dict]:
    """Export every variant of `arch` into out_dir/<arch>/; returns (entries, failures) by name.
    A failure is also left as <variant>.failed (its one-line reason), so a manifest can be rebuilt
    from the folder alone (`manifest_from_folder`)."""
    folder = out_dir / arch.name
    folder.mkdir(parents=True, exist_ok=True)
    if not variants:
        return {}, {}
    model = build(arch)
    expected = {pos: expected_for(arch, model, pos) for pos in {v.position_ids for v in variants}}
    feeds = feeds_for(arch, model.config, Variant("dynamo", arch.position_ids))
    entries, failures = {}, {}
    for variant in variants:
        key = f"{arch.name}/{variant.name}"
        path = folder / f"{variant.name}.onnx"
        print(f"[export] {key} ...", flush=True)
        try:
            exporter = EXPORTERS[variant.exporter][0] if variant.exporter in EXPORTERS else variant.exporter
            if exporter in arch.not_exported_by:
                raise RuntimeError(f"not exported by {exporter}: {arch.not_exported_by[exporter]}")
            notes = produce(arch, model, variant, path, folder, workdir, feeds)
        except Exception as exc:  # recorded, never hidden
            reason = short_error(exc)
            print(f"[failed] {key}: {reason}", flush=True)
            failures[key] = reason
            path.unlink(missing_ok=True)
            (folder / f"{variant.name}.json").unlink(missing_ok=True)
            (folder / f"{variant.name}.failed").write_text(reason + "\n")
            continue
        entries[key] = sidecar(arch, model, variant, path, expected[variant.position_ids], notes)
        (folder / f"{variant.name}.json").write_text(json.dumps(entries[key], indent=2) + "\n")
        (folder / f"{variant.name}.failed").unlink(missing_ok=True)
    return entries, failures


def short_error(exc: BaseException) -> str:
    """One line: torch.export's own summary line where it gives one, else the first line."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if "## Exception summary" in lines:
        lines = lines[lines.index("## Exception summary") + 1:]
    return f"{type(exc).__name__}: {lines[0][:300] if lines else ''}"


def expected_for(arch: Arch, model, position_ids: bool) -> dict[str, Any]:
    """The sites of the model as called with (or without) position_ids: BERT's and GPT-2's position
    embeddings broadcast over the batch without them, so their sum is no AddLayerNorm site."""
    variant = Variant("dynamo", position_ids)
    names, values = make_inputs(arch, model.config, variant, ef.SAMPLE_BATCH, ef.SAMPLE_SEQ, seed_of(arch))
    return sites.expected_sites(model, lambda: Wrapper(model, arch, names)(*values))


def produce(arch: Arch, model, variant: Variant, path: Path, folder: Path, workdir: Path, feeds) -> list[str]:
    if variant.exporter == "optimum":
        export_optimum(arch, model, OPTIMUM_TASKS[variant.chain], workdir, path)
        base = folder / f"{Variant('dynamo', arch.position_ids).base}.onnx"
        diff = check_against(base, path, with_empty_past(path, feeds), tol=1e-3)
        return [f"optimum-onnx main_export(task={OPTIMUM_TASKS[variant.chain]!r}) in transformers from "
                f"{OPTIMUM_TARGET}; max |difference| from {base.stem} in ORT {diff:.3g} (empty past)"]
    if variant.chain is None:
        path.write_bytes(export_base(arch, model, variant))
        return []
    base = folder / f"{variant.base}.onnx"
    if variant.chain == "unoptimised":
        path.write_bytes(export_base(arch, model, dataclasses.replace(variant, chain=None), optimize=False))
        return ["torch.onnx.export(dynamo=True, optimize=False): onnxscript's output before its optimizer"]
    if not base.exists():
        raise RuntimeError(f"base export {variant.base} failed")
    apply_chain(variant.chain, base, path)
    diff = check_against(base, path, feeds, tol=float("inf") if variant.chain == "fp16" else 1e-3)
    return [f"{variant.chain} applied to {variant.base}; max |difference| from it in ORT {diff:.3g}"]


def sidecar(arch: Arch, model, variant: Variant, path: Path, expected: dict, notes: list[str]) -> dict[str, Any]:
    proto = onnx.load(path, load_external_data=False)
    opsets = {imp.domain or "ai.onnx": imp.version for imp in proto.opset_import}
    data = path.read_bytes()
    return {
        "file": f"{arch.name}/{path.name}",
        "architecture": arch.name,
        "model_type": model.config.model_type,
        "kind": arch.kind,
        "variant": variant.name,
        "exporter": variant.exporter,
        "opset": opsets.get("ai.onnx"),
        "opset_imports": opsets,
        "position_ids": variant.position_ids,
        "shapes": "dynamic" if variant.dynamic else "static",
        "chain": variant.chain,
        "attn_implementation": arch.attn_implementation or "sdpa",
        "seed": seed_of(arch),
        "size_bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "inputs": [ef._value_info(v) for v in proto.graph.input],
        "outputs": [ef._value_info(v) for v in proto.graph.output],
        "expected": expected,
        "graph_op_counts": ef.graph_op_counts(proto),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "onnx": onnx.__version__},
        "notes": notes,
    }


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="corpus folder (default /work/corpus; --preset matrix: "
                        "models/fixtures/matrix)")
    parser.add_argument("--preset", choices=["corpus", "matrix"], default="corpus")
    parser.add_argument("--arch", nargs="+", metavar="NAME", help=f"only these of {[a.name for a in ARCHS]}")
    parser.add_argument("--variant", nargs="+", metavar="NAME", help="only these variants (e.g. ts14_nopos_dyn)")
    parser.add_argument("--resume", action="store_true", help="keep the variants already exported (sidecar "
                        "present) or failed (.failed present) in --out")
    parser.add_argument("--staging", type=Path, help="--preset matrix: pack the exports found here instead of "
                        "exporting again (those missing are exported)")
    opts = parser.parse_args(argv)
    names = opts.arch or (MATRIX_ARCHS + list(MATRIX_EXTRA) if opts.preset == "matrix" else [a.name for a in ARCHS])
    unknown = sorted(set(names) - set(ARCH_BY_NAME))
    if unknown:
        parser.error(f"unknown architecture(s) {unknown}")
    warnings.filterwarnings("ignore")
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    transformers.logging.set_verbosity_error()
    torch.set_num_threads(1)  # the machine is shared

    if opts.preset == "matrix":
        out = opts.out or MATRIX_DIR
        with tempfile.TemporaryDirectory(prefix="otfuse-matrix-") as tmp:
            staging = opts.staging or Path(tmp)
            entries, failures = export_all(names, opts.variant, staging, "matrix", Path(tmp), reuse=opts.staging)
            matrix_pack.pack(entries, staging, out, failures)
        return 1 if failures else 0
    out = opts.out or Path("/work/corpus")
    with tempfile.TemporaryDirectory(prefix="otfuse-corpus-") as tmp:
        entries, failures = export_all(names, opts.variant, out, "corpus", Path(tmp),
                                       skip_done=out if opts.resume else None)
    manifest = manifest_from_folder(out)
    print(f"{len(entries)} models exported, {len(failures)} failed; the corpus in {out}: "
          f"{len(manifest['models'])} models, {len(manifest['failed'])} failed exports")
    return 1 if failures else 0


def export_all(names, only_variants, out: Path, preset: str, workdir: Path, reuse: Path | None = None,
               skip_done: Path | None = None):
    entries, failures = {}, {}
    for name in names:
        arch = ARCH_BY_NAME[name]
        variants = [v for v in variants_for(arch, preset) if not only_variants or v.name in only_variants]
        if preset == "matrix" and name in MATRIX_EXTRA:
            variants = [v for v in variants if v.name in MATRIX_EXTRA[name]]
        if reuse is not None:
            found = {v for v in variants if (reuse / arch.name / f"{v.name}.json").exists()}
            for v in found:
                key = f"{arch.name}/{v.name}"
                entries[key] = json.loads((reuse / arch.name / f"{v.name}.json").read_text())
            variants = [v for v in variants if v not in found]
        if skip_done is not None:
            folder = skip_done / arch.name
            variants = [v for v in variants if not (folder / f"{v.name}.json").exists()
                        and not (folder / f"{v.name}.failed").exists()]
        got, failed = export_arch(arch, variants, out, workdir)
        entries.update(got)
        failures.update(failed)
    return entries, failures


def manifest_from_folder(out: Path) -> dict:
    """manifest.json of a corpus folder, from its sidecars and .failed files."""
    manifest = {"models": {}, "failed": {}}
    for sidecar in sorted(out.glob("*/*.json")):
        entry = json.loads(sidecar.read_text())
        key = f"{sidecar.parent.name}/{sidecar.stem}"
        manifest["models"][key] = {k: entry[k] for k in ("file", "architecture", "variant", "expected")}
    for failed in sorted(out.glob("*/*.failed")):
        manifest["failed"][f"{failed.parent.name}/{failed.stem}"] = failed.read_text().strip()
    fd, tmp = tempfile.mkstemp(prefix=".manifest.", dir=out)  # two runs may end at once
    with os.fdopen(fd, "w") as handle:
        handle.write(json.dumps(manifest, indent=2) + "\n")
    os.replace(tmp, out / "manifest.json")
    return manifest


if __name__ == "__main__":
    sys.exit(main())
