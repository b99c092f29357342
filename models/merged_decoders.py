#!/usr/bin/env python
"""optimum-onnx's merged decoders (the decoder twice, inside an ``If`` on ``use_cache_branch``)
of tiny random-weight encoder-decoder models, as otfuse fixtures for fusing inside control flow.

Run with the export venv (torch, transformers 4.57, optimum-onnx; no hub access):

    /work/venvs/export/bin/python models/merged_decoders.py            # -> models/fixtures/merged
    /work/venvs/export/bin/python models/merged_decoders.py --only t5 --out /tmp/merged

Each model is built from a config, its weights redrawn from a generator seeded by its name (as
export_fixtures.py does: norm weights 1 + 0.1 randn), saved with ``save_pretrained`` and exported
by ``optimum.exporters.onnx.main_export`` with the ``*-with-past`` task; only
``decoder_model_merged.onnx`` is kept, metadata stripped, gzip-compressed (mtime 0; each model
exported in a process of its own: byte for byte reproducible). Before writing, onnxruntime must reproduce torch's logits on both branches:
without cache (``use_cache_branch = False``: the whole prefix) and with it (one new token after
the first step's ``present.*`` fed back as ``past_key_values.*``).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent))
from export_fixtures import fixture_seed, is_norm_module, randomize_weights, strip_metadata  # noqa: E402

OUT = Path(__file__).resolve().parent / "fixtures" / "merged"
LAYERS = 2  # decoder layers; the encoder (not kept) has one
D_MODEL, HEADS, FFN, VOCAB = 32, 2, 64, 128
BATCH, PREFIX, ENCODER_SEQ = 2, 5, 6


def whisper():
    config = transformers.WhisperConfig(
        vocab_size=VOCAB, d_model=D_MODEL, encoder_layers=1, decoder_layers=LAYERS,
        encoder_attention_heads=HEADS, decoder_attention_heads=HEADS, encoder_ffn_dim=FFN,
        decoder_ffn_dim=FFN, num_mel_bins=8, max_source_positions=1500,  # optimum's dummy: 3000 frames
        max_target_positions=32, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        decoder_start_token_id=1, suppress_tokens=None, begin_suppress_tokens=None)
    return transformers.WhisperForConditionalGeneration(config), "automatic-speech-recognition-with-past"


def t5():
    config = transformers.T5Config(vocab_size=VOCAB, d_model=D_MODEL, d_kv=D_MODEL // HEADS, d_ff=FFN,
                                   num_layers=1, num_decoder_layers=LAYERS, num_heads=HEADS,
                                   decoder_start_token_id=0)
    return transformers.T5ForConditionalGeneration(config), "text2text-generation-with-past"


def bart():
    config = transformers.BartConfig(vocab_size=VOCAB, d_model=D_MODEL, encoder_layers=1, decoder_layers=LAYERS,
                                     encoder_attention_heads=HEADS, decoder_attention_heads=HEADS,
                                     encoder_ffn_dim=FFN, decoder_ffn_dim=FFN, max_position_embeddings=64)
    return transformers.BartForConditionalGeneration(config), "text2text-generation-with-past"


MODELS = {"whisper": whisper, "t5": t5, "bart": bart}


def decoder_of(model):
    return model.get_decoder()


def torch_logits(model, name: str, tokens: torch.Tensor, encoder_states: torch.Tensor,
                 encoder_mask: torch.Tensor) -> np.ndarray:
    kwargs = {"decoder_input_ids": tokens, "encoder_outputs": (encoder_states,), "use_cache": False}
    if name != "whisper":
        kwargs["attention_mask"] = encoder_mask
    with torch.no_grad():
        return model(**kwargs).logits.numpy()


def feeds(session, name: str, tokens, encoder_states, encoder_mask, past: dict | None) -> dict:
    """Inputs for one call: without ``past``, the no-cache branch (past inputs of length 0... the
    branch never reads them)."""
    out = {}
    for value in session.get_inputs():
        if value.name == "input_ids":
            out[value.name] = tokens.numpy()
        elif value.name == "encoder_hidden_states":
            out[value.name] = encoder_states.numpy()
        elif value.name == "encoder_attention_mask":
            out[value.name] = encoder_mask.numpy()
        elif value.name == "use_cache_branch":
            out[value.name] = np.array([past is not None])
        elif value.name.startswith("past_key_values."):
            if past is not None:
                out[value.name] = past[value.name.replace("past_key_values", "present")]
            else:
                length = ENCODER_SEQ if ".encoder." in value.name else 1
                out[value.name] = np.zeros((BATCH, HEADS, length, D_MODEL // HEADS), np.float32)
    return out


def check_branches(model, name: str, data: bytes) -> dict:
    """onnxruntime against torch on both branches; max abs error 1e-4."""
    import onnxruntime as ort

    gen = torch.Generator().manual_seed(fixture_seed(name) + 1)
    tokens = torch.randint(3, VOCAB, (BATCH, PREFIX + 1), generator=gen)
    encoder_states = torch.randn(BATCH, ENCODER_SEQ, D_MODEL, generator=gen)
    encoder_mask = torch.ones(BATCH, ENCODER_SEQ, dtype=torch.int64)
    encoder_mask[1, -2:] = 0
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    reference = torch_logits(model, name, tokens, encoder_states, encoder_mask)
    first = dict(zip(names, session.run(None, feeds(session, name, tokens[:, :PREFIX], encoder_states,
                                                    encoder_mask, None))))
    second = dict(zip(names, session.run(None, feeds(session, name, tokens[:, PREFIX:], encoder_states,
                                                     encoder_mask, first))))
    errors = {"no_cache": float(np.abs(first["logits"] - reference[:, :PREFIX]).max()),
              "cache": float(np.abs(second["logits"] - reference[:, PREFIX:]).max())}
    if max(errors.values()) > 1e-4:
        raise RuntimeError(f"{name}: onnxruntime differs from torch: {errors}")
    return errors


def branch_ops(proto: onnx.ModelProto) -> dict:
    out = {}
    for node in proto.graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                out[f"{node.op_type} {node.name!r} {attr.name}"] = dict(sorted(Counter(
                    n.op_type for n in attr.g.node).items()))
    return out


def expected_sites(model, name: str) -> dict:
    """Counted on the torch decoder (per branch: both branches hold the whole decoder)."""
    decoder = decoder_of(model)
    norms = [m for m in decoder.modules() if is_norm_module(m)]
    return {"norm": len(norms), "norm_classes": sorted({type(m).__name__ for m in norms}),
            "attention": 2 * LAYERS,  # self + cross per layer
            "activation": LAYERS, "activation_kind": {"t5": "relu"}.get(name, "gelu")}


def export(name: str, out_dir: Path) -> dict:
    from optimum.exporters.onnx import main_export

    model, task = MODELS[name]()
    randomize_weights(model, fixture_seed(name))
    model.eval()
    with tempfile.TemporaryDirectory(prefix="otfuse-merged-") as tmp:
        checkpoint, exported = Path(tmp) / "checkpoint", Path(tmp) / "onnx"
        model.save_pretrained(checkpoint)
        main_export(str(checkpoint), output=str(exported), task=task, device="cpu",
                    library_name="transformers", do_validation=False)
        proto = onnx.load(exported / "decoder_model_merged.onnx")
    strip_metadata(proto)
    for node in proto.graph.node:  # the branches' nodes carry the same debug metadata
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                for inner in attr.g.node:
                    del inner.metadata_props[:]
    data = proto.SerializeToString()
    errors = check_branches(model, name, data)
    packed = gzip.compress(data, mtime=0)
    path = out_dir / f"{name}_decoder_merged.onnx.gz"
    path.write_bytes(packed)

    def value(v):
        dims = [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
        return {"name": v.name, "dtype": onnx.TensorProto.DataType.Name(v.type.tensor_type.elem_type).lower(),
                "shape": dims}

    return {"file": path.name, "task": task, "model_class": type(model).__name__,
            "size_bytes": len(data), "packed_bytes": len(packed), "sha256": hashlib.sha256(data).hexdigest(),
            "opset": [(e.domain, e.version) for e in proto.opset_import],
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                         "onnx": onnx.__version__},
            "config": {"d_model": D_MODEL, "heads": HEADS, "decoder_layers": LAYERS, "ffn": FFN, "vocab": VOCAB},
            "seed": fixture_seed(name), "inputs": [value(v) for v in proto.graph.input],
            "outputs": [value(v) for v in proto.graph.output], "expected_per_branch": expected_sites(model, name),
            "branch_op_counts": branch_ops(proto), "ort_vs_torch_max_abs": errors}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", choices=sorted(MODELS))
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--one", choices=sorted(MODELS), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    args.out.mkdir(parents=True, exist_ok=True)
    manifest_path = args.out / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {"fixtures": {}, "failed": {}}
    if args.one:  # the child: one export, its manifest entry on the last line of stdout
        print(json.dumps(export(args.one, args.out)))
        return 0
    for name in args.only or sorted(MODELS):
        # A process of its own per model: the TorchScript exporter numbers weight names
        # (onnx::MatMul_500) by a process-wide counter, so a file must not depend on what ran before.
        # PYTHONHASHSEED fixed too: optimum's merge walks sets of names, whose order is the hash's.
        done = subprocess.run([sys.executable, __file__, "--one", name, "--out", str(args.out)],
                              capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": "0"})
        if done.returncode == 0:
            manifest["fixtures"][name] = json.loads(done.stdout.strip().splitlines()[-1])
            manifest["failed"].pop(name, None)
        else:  # recorded, never dropped
            lines = done.stderr.strip().splitlines()
            manifest["failed"][name] = (lines[-1] if lines else f"exit {done.returncode}")[:300]
        print(name, manifest["failed"].get(name, "ok"), flush=True)
    manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return 1 if manifest["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
