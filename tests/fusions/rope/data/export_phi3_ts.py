"""Re-make phi3_ts17.onnx (run with the export venv, transformers 4.57.6; the tests never import this):
a tiny random-weight Phi-3 (1 layer, hidden 32, 4 heads of 8, 2 kv heads, vocab 64) exported by
TorchScript at opset 17 with dynamic batch and seq. Phi-3 rotates `x[..., :cos.shape[-1]]` and
concatenates `x[..., cos.shape[-1]:]`, which is empty here (every lane rotates): TorchScript keeps
that Concat of an empty part (tests/fusions/rope/test_empty_pass_through.py).

    /work/venvs/export/bin/python tests/fusions/rope/data/export_phi3_ts.py
"""

import io
import sys
from pathlib import Path

import onnx
import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "models"))
import traceable_masks  # noqa: E402  transformers 4.57's vmap masks do not trace


class Logits(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits


def main() -> None:
    torch.manual_seed(0)
    config = transformers.Phi3Config(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                                     intermediate_size=64, vocab_size=64, max_position_embeddings=32,
                                     use_cache=False, attention_dropout=0.0, resid_pdrop=0.0, embd_pdrop=0.0,
                                     pad_token_id=0, bos_token_id=1, eos_token_id=2)
    model = Logits(transformers.Phi3ForCausalLM(config).eval()).eval()
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=gen)
            param.copy_(1.0 + 0.1 * noise if "norm" in name else 0.1 * noise)
    ids = torch.randint(3, 64, (2, 7), generator=gen)
    mask = torch.ones(2, 7, dtype=torch.int64)
    axes = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"},
            "logits": {0: "batch", 1: "seq"}}
    buffer = io.BytesIO()
    with torch.no_grad(), traceable_masks.broadcast_masks():
        torch.onnx.export(model, (ids, mask), buffer, dynamo=False, input_names=["input_ids", "attention_mask"],
                          output_names=["logits"], dynamic_axes=axes, opset_version=17, do_constant_folding=True)
    proto = onnx.load_from_string(buffer.getvalue())
    del proto.metadata_props[:]
    proto.producer_version = ""
    proto.doc_string = "otfuse test fixture: tiny random-weight Phi-3, TorchScript opset 17 (export_phi3_ts.py)"
    onnx.save(proto, Path(__file__).with_name("phi3_ts17.onnx"))


if __name__ == "__main__":
    main()
