"""Re-make helium_eps.onnx and cohere_qknorm.onnx (run with the export venv, transformers 4.57.6; the
tests never import this): tiny random-weight decoders (1 layer, hidden 32, 4 heads of 8, 2 kv heads,
vocab 64) exported by the dynamo exporter (opset 20, its optimizer on) with dynamic batch and seq.

- helium_eps.onnx: Helium with rms_norm_eps 1e-8. The exporter's optimizer drops the `+ eps` (the
  norms read `Sqrt(ReduceMean(x²))`): tests/fusions/norm/test_new_archs.py fuses them with epsilon 0.
- cohere_qknorm.onnx: Cohere with use_qk_norm: q and k LayerNorm over head_dim with a [heads,
  head_dim] weight (a scale along an axis the norm does not normalise; norm/wide_scale.py).

    /work/venvs/export/bin/python tests/fusions/norm/data/export_new_archs.py
"""

from pathlib import Path

import onnx
import torch
import transformers

SIZES = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=64, vocab_size=64, max_position_embeddings=32, use_cache=False,
             attention_dropout=0.0, pad_token_id=0, bos_token_id=1, eos_token_id=2)


class Logits(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits


def randomise(model: torch.nn.Module, seed: int) -> None:
    """Every parameter redrawn, norm weights 1 + 0.1 randn (so a dropped scale shows)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=gen)
            param.copy_(1.0 + 0.1 * noise if "norm" in name else 0.1 * noise)


def export(config, name: str, seed: int) -> None:
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    randomise(model, seed)
    wrapper = Logits(model).eval()
    ids = torch.randint(3, 64, (2, 7), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones(2, 7, dtype=torch.int64)
    dims = {0: "batch", 1: "seq"}
    with torch.no_grad():
        program = torch.onnx.export(wrapper, (ids, mask), dynamo=True, input_names=["input_ids", "attention_mask"],
                                    output_names=["logits"], dynamic_shapes=(dims, dims), opset_version=20,
                                    optimize=True, external_data=False)
    proto = program.model_proto
    for node in proto.graph.node:
        del node.metadata_props[:]
    del proto.metadata_props[:]
    proto.producer_version = ""
    proto.doc_string = f"otfuse test fixture: tiny random-weight {name}, dynamo opset 20 (export_new_archs.py)"
    onnx.save(proto, Path(__file__).with_name(f"{name}.onnx"))


def main() -> None:
    torch.manual_seed(0)
    export(transformers.HeliumConfig(head_dim=8, rms_norm_eps=1e-8, **SIZES), "helium_eps", 1)
    export(transformers.CohereConfig(layer_norm_eps=1e-5, logit_scale=0.25, use_qk_norm=True, **SIZES),
           "cohere_qknorm", 2)


if __name__ == "__main__":
    main()
