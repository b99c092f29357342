"""Re-make opt_ts17.onnx (run with the export venv; the tests never import this): a tiny random-weight
OPT (2 layers, hidden 16, vocab 64) exported by TorchScript at opset 17 with dynamic batch and seq.
OPT views its hidden states as (-1, hidden) around the residual Adds, so each LayerNormalization but
the first reads a Reshape of the residual sum (tests/fusions/norm/test_reshaped_residual.py).

    /work/venvs/export/bin/python tests/fusions/norm/data/export_opt.py
"""

import io
from pathlib import Path

import onnx
import torch
import transformers


class Logits(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask).logits


def main() -> None:
    torch.manual_seed(0)
    config = transformers.OPTConfig(hidden_size=16, num_hidden_layers=2, ffn_dim=32, num_attention_heads=2,
                                    vocab_size=64, max_position_embeddings=32, word_embed_proj_dim=16,
                                    do_layer_norm_before=True, dropout=0.0, attention_dropout=0.0, use_cache=False,
                                    pad_token_id=1, bos_token_id=2, eos_token_id=2)
    model = Logits(transformers.OPTForCausalLM(config).eval()).eval()
    ids = torch.randint(3, 64, (2, 7))
    mask = torch.ones(2, 7, dtype=torch.int64)
    buffer = io.BytesIO()
    axes = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"},
            "logits": {0: "batch", 1: "seq"}}
    with torch.no_grad():
        torch.onnx.export(model, (ids, mask), buffer, dynamo=False, input_names=["input_ids", "attention_mask"],
                          output_names=["logits"], dynamic_axes=axes, opset_version=17, do_constant_folding=True)
    proto = onnx.load_from_string(buffer.getvalue())
    del proto.metadata_props[:]
    proto.producer_version = ""
    proto.doc_string = "otfuse test fixture: tiny random-weight OPT, TorchScript opset 17 (export_opt.py)"
    onnx.save(proto, Path(__file__).with_name("opt_ts17.onnx"))


if __name__ == "__main__":
    main()
