"""Self-attention blocks written the way older / hand-written eager code writes them (the otfuse
fixtures `legacy_kt_softcap`, `legacy_tile_gqa`, `legacy_tile_mqa`, `legacy_fp16_upcast`,
`legacy_where_causal`; see models/export_fixtures.py and models/README.md):

- ``kt="permute"``: the keys are transposed straight from the head split,
  ``key.view(B, S, N, D).permute(0, 2, 3, 1)`` (older GPT-2 ``_split_heads(key, k=True)``), and
  the scores are soft-capped as ``tanh(scores * (1 / cap)) * cap``.
- ``repeat="tile"``: grouped kv heads repeated by ``k[:, :, None].repeat(1, 1, rep, 1, 1)
  .reshape(B, N, S, D)`` (HF's grouping: query head h reads kv head h // rep).
- ``repeat="tile_heads"``: a single kv head repeated by ``k.repeat(1, N, 1, 1)`` (MQA).
- ``upcast=True``: the softmax in float32 as Meta's reference LLaMA writes it,
  ``softmax(scores.float(), dim=-1).type_as(q)`` (for a float16 / bfloat16 module).
- ``mask="where"``: causal, as GPT-2 wrote it before transformers 4.4x: a ``tril`` bool buffer
  sliced to the sequence, ``torch.where(causal, scores, torch.finfo(scores.dtype).min)``.

No RoPE, no norm: one attention (non-causal unless ``mask="where"``) over a static sequence.
"""

from __future__ import annotations

import torch
from torch import nn

SEQ = 8
HIDDEN = 64
HEADS = 4
HEAD_DIM = HIDDEN // HEADS  # 16


class LegacyAttention(nn.Module):
    """Input `hidden_states` [batch, SEQ, hidden]; output the same shape."""

    attn_implementation = "eager"  # matmul / softmax / matmul written out

    def __init__(self, kv_heads: int = HEADS, kt: str = "transpose", repeat: str = "tile",
                 softcap: float | None = None, upcast: bool = False, mask: str | None = None,
                 hidden: int = HIDDEN, heads: int = HEADS, seq: int = SEQ):
        super().__init__()
        if kt == "permute" and kv_heads != heads:
            raise ValueError("keys permuted from the head split: no kv head repeat")
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, hidden // heads
        self.kt, self.repeat, self.softcap, self.seq = kt, repeat, softcap, seq
        self.upcast, self.mask = upcast, mask
        if mask == "where":  # GPT-2's causal buffer (bool, [1, 1, max_positions, max_positions])
            positions = 4 * seq
            causal = torch.tril(torch.ones(positions, positions, dtype=torch.bool))
            self.register_buffer("bias", causal.view(1, 1, positions, positions), persistent=False)
        elif mask is not None:
            raise ValueError(f"unknown mask {mask!r}")
        self.to_q = nn.Linear(hidden, hidden)
        self.to_k = nn.Linear(hidden, kv_heads * self.head_dim)
        self.to_v = nn.Linear(hidden, kv_heads * self.head_dim)
        self.to_out = nn.Linear(hidden, hidden)

    @property
    def seq_len(self) -> int:
        return self.seq

    def _repeat(self, x: torch.Tensor) -> torch.Tensor:
        """[B, Nkv, S, D] -> [B, N, S, D], query head h reading kv head h // (N / Nkv)."""
        rep = self.heads // self.kv_heads
        if rep == 1:
            return x
        b, _, s, d = x.shape
        if self.repeat == "tile_heads":
            assert self.kv_heads == 1, "Tile of the head axis is HF's grouping only for one kv head"
            return x.repeat(1, rep, 1, 1)
        return x[:, :, None, :, :].repeat(1, 1, rep, 1, 1).reshape(b, self.heads, s, d)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        b, s, _ = hidden_states.shape
        d = self.head_dim
        q = self.to_q(hidden_states).view(b, s, self.heads, d).permute(0, 2, 1, 3)
        k = self.to_k(hidden_states).view(b, s, self.kv_heads, d)
        v = self.to_v(hidden_states).view(b, s, self.kv_heads, d).permute(0, 2, 1, 3)
        if self.kt == "permute":
            kt = k.permute(0, 2, 3, 1)
        else:
            kt = self._repeat(k.permute(0, 2, 1, 3)).transpose(-1, -2)
            v = self._repeat(v)
        scores = torch.matmul(q, kt) / (d ** 0.5)
        if self.softcap is not None:
            scores = torch.tanh(scores * (1.0 / self.softcap)) * self.softcap
        if self.mask == "where":
            causal = self.bias[:, :, :s, :s]  # key_length - query_length = 0: no cache here
            fill = torch.full([], torch.finfo(scores.dtype).min, dtype=scores.dtype, device=scores.device)
            scores = torch.where(causal, scores, fill)
        if self.upcast:
            probs = torch.softmax(scores.float(), dim=-1).type_as(q)
        else:
            probs = torch.softmax(scores, dim=-1)
        out = torch.matmul(probs, v).permute(0, 2, 1, 3).reshape(b, s, self.heads * d)
        return self.to_out(out)
