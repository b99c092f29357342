"""Export a tiny random-weight LLaMA decoder that takes ``input_ids`` only (no ``attention_mask``
input): transformers then builds the causal mask from the input's shape alone (Range / CumSum /
comparisons / Where), the form issue #10 asks otfuse to claim as ``causal = 1``.

Run with the export venv (torch, transformers, onnxscript):

    python models/input_ids_only.py --out models/fixtures          # llama_ids_only.onnx (dynamo)

One layer, hidden 32, 4 heads (2 kv heads), vocab 64: a few tens of KiB each. Dynamic batch and
sequence. The dynamo exporter at opset 20 (its optimizer on), the TorchScript exporter at opset 17.
"""

from __future__ import annotations

import argparse
import io
from pathlib import Path

import onnx
import torch
from export_fixtures import strip_metadata
from transformers import LlamaConfig, LlamaForCausalLM


# With transformers 4.57 the TorchScript export fails for either attention (IndexError
# unordered_map::at): without an attention_mask, masking_utils adds its packed-sequence test and
# vmaps the mask functions, which tracing cannot do. Kept here so a newer transformers is tried.
ATTENTION = {"dynamo": "sdpa", "torchscript": "eager"}


class IdsOnly(torch.nn.Module):
    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids, use_cache=False, return_dict=True).logits


def tiny_llama(attn: str = "sdpa") -> torch.nn.Module:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         attn_implementation=attn)
    return IdsOnly(LlamaForCausalLM(config).eval())


def export(model: torch.nn.Module, exporter: str) -> onnx.ModelProto:
    ids = torch.randint(3, 64, (2, 7))
    with torch.no_grad():
        if exporter == "dynamo":
            batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq")
            program = torch.onnx.export(model, (ids,), dynamo=True, input_names=["input_ids"],
                                        output_names=["logits"], dynamic_shapes=({0: batch, 1: seq},),
                                        opset_version=20, optimize=True, external_data=False)
            return program.model_proto
        buffer = io.BytesIO()
        torch.onnx.export(model, (ids,), buffer, dynamo=False, input_names=["input_ids"], output_names=["logits"],
                          dynamic_axes={"input_ids": {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "seq"}},
                          opset_version=17, do_constant_folding=True)
        return onnx.load_from_string(buffer.getvalue())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("models/fixtures"))
    args = parser.parse_args()
    for exporter, name in (("dynamo", "llama_ids_only"), ("torchscript", "llama_ids_only_torchscript")):
        try:
            proto = export(tiny_llama(ATTENTION[exporter]), exporter)
        except Exception as exc:  # noqa: BLE001 - report and go on (TorchScript: see ATTENTION)
            print(f"{name}: export failed: {type(exc).__name__}: {exc}")
            continue
        strip_metadata(proto)
        proto.doc_string = f"otfuse fixture {name}: tiny random-weight LLaMA, input_ids only (models/input_ids_only.py)"
        path = args.out / f"{name}.onnx"
        onnx.save(proto, path)
        print(path, path.stat().st_size)


if __name__ == "__main__":
    main()
