"""Self-attention with rotary embeddings as Meta's reference LLaMA writes them (the otfuse fixtures
`meta_rope_complex` / `meta_rope_pairs`; see models/export_fixtures.py and models/README.md).

Meta's `llama/model.py` rotates *pairs* of adjacent lanes (2j, 2j+1) — the interleaved mode of
docs/ops.md — through complex arithmetic on a `freqs_cis` table:

    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)

``style="complex"`` is exactly that; ``style="pairs"`` is the complex-free spelling written by
hand (ports for runtimes without complex tensors):

    x = x.reshape(*x.shape[:-1], -1, 2); a, b = x[..., 0], x[..., 1]
    torch.stack([a * cos - b * sin, b * cos + a * sin], -1).flatten(-2)

Layout as Meta's: q/k `[B, S, N, D]` rotated, then transposed to `[B, N, S, D]` for
`F.scaled_dot_product_attention`, non-causal, or causal (``causal=True``, as Meta's model): then
the dynamo export builds the mask from ``Shape(transpose(q_rot))``, a value inside the BSND
RopeAttention match that the mask (read by the fused node) still needs, so that fold is refused
and the rotation stays a RotaryEmbeddingQK in front of the Attention (fixture
`meta_rope_causal`). The sequence is static, so the tables fold to constants; only batch is dynamic.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

SEQ = 8
HIDDEN = 32
HEADS = 2
HEAD_DIM = HIDDEN // HEADS  # 16
THETA = 10000.0


def precompute_freqs_cis(dim: int, end: int, theta: float = THETA) -> torch.Tensor:
    """Meta's `precompute_freqs_cis`: [end, dim / 2] complex64."""
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    t = torch.arange(end, device=freqs.device)
    freqs = torch.outer(t, freqs).float()
    return torch.polar(torch.ones_like(freqs), freqs)


def reshape_for_broadcast(table: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """[S, D/2] -> [1, S, 1, D/2] against x [B, S, N, D/2] (Meta's helper)."""
    shape = [d if i == 1 or i == x.ndim - 1 else 1 for i, d in enumerate(x.shape)]
    return table.view(*shape)


def apply_rotary_emb_complex(x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
    x_ = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    freqs_cis = reshape_for_broadcast(freqs_cis, x_)
    return torch.view_as_real(x_ * freqs_cis).flatten(3).type_as(x)


def apply_rotary_emb_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    pairs = x.reshape(*x.shape[:-1], -1, 2)
    a, b = pairs[..., 0], pairs[..., 1]
    cos, sin = reshape_for_broadcast(cos, a), reshape_for_broadcast(sin, a)
    return torch.stack([a * cos - b * sin, b * cos + a * sin], -1).flatten(-2)


class MetaRopeAttention(nn.Module):
    """Input `hidden_states` [batch, SEQ, hidden]; output the same shape."""

    def __init__(self, style: str = "complex", hidden: int = HIDDEN, heads: int = HEADS, seq: int = SEQ,
                 theta: float = THETA, causal: bool = False):
        super().__init__()
        if style not in ("complex", "pairs"):
            raise ValueError(f"unknown style {style!r}")
        self.style, self.heads, self.head_dim, self.seq, self.theta = style, heads, hidden // heads, seq, theta
        self.causal = causal
        self.to_q = nn.Linear(hidden, hidden)
        self.to_k = nn.Linear(hidden, hidden)
        self.to_v = nn.Linear(hidden, hidden)
        self.to_out = nn.Linear(hidden, hidden)

    @property
    def seq_len(self) -> int:
        return self.seq

    def rotary_details(self) -> dict:
        """The manifest's `config.rotary` (models/export_fixtures.py)."""
        return {"style": "interleaved_pairs", "spelling": self.style, "rotary_dim": self.head_dim,
                "head_dim": self.head_dim, "partial": False, "theta": float(self.theta), "rope_type": "default"}

    def rotate(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, S, N, D] rotated pairwise by position (tables computed in forward, folded)."""
        freqs_cis = precompute_freqs_cis(self.head_dim, self.seq, self.theta)
        if self.style == "complex":
            return apply_rotary_emb_complex(x, freqs_cis)
        return apply_rotary_emb_pairs(x, freqs_cis.real, freqs_cis.imag)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        b, s, hidden = hidden_states.shape
        q = self.to_q(hidden_states).view(b, s, self.heads, self.head_dim)
        k = self.to_k(hidden_states).view(b, s, self.heads, self.head_dim)
        v = self.to_v(hidden_states).view(b, s, self.heads, self.head_dim)
        q, k = self.rotate(q), self.rotate(k)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                             is_causal=self.causal)
        return self.to_out(out.transpose(1, 2).reshape(b, s, hidden))


def reference_rotation(x: torch.Tensor, theta: float = THETA) -> torch.Tensor:
    """Per-lane spelling of docs/ops.md interleaved mode (float64), to check both styles."""
    d, s = x.shape[-1], x.shape[1]
    angle = torch.arange(s).double()[:, None] * (1.0 / theta ** (torch.arange(0, d, 2).double() / d))[None, :]
    cos = angle.cos().repeat_interleave(2, -1)[None, :, None, :]
    sin = angle.sin().repeat_interleave(2, -1)[None, :, None, :]
    xd = x.double()
    rotated = torch.stack([-xd[..., 1::2], xd[..., 0::2]], -1).flatten(-2)
    return (xd * cos + rotated * sin).to(x.dtype)


if __name__ == "__main__":
    torch.manual_seed(0)
    x = torch.randn(2, SEQ, HEADS, HEAD_DIM)
    for style in ("complex", "pairs"):
        module = MetaRopeAttention(style).eval()
        print(style, "max |module - reference| =", float((module.rotate(x) - reference_rotation(x)).abs().max()))
