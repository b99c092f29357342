"""A DiT-style self-attention block with multi-axis ("3D") RoPE, as video/image diffusion
transformers write it (the otfuse fixtures `rope3d` / `rope3d_torchscript`, see
models/export_fixtures.py and models/README.md).

Tokens are a video grid of T x H x W patches flattened frame-major (t, then h, then w). The head
dim is cut into sections (t, h, w) = (4, 6, 6); each section is rotated on its own (rotate_half
inside the section) with cos/sin from that axis's integer position and its own frequencies, and
the three rotated sections are concatenated back:

    q = cat([rope(q[..., :4], cos_t, sin_t), rope(q[..., 4:10], cos_h, sin_h),
             rope(q[..., 10:], cos_w, sin_w)], -1)                         # same for k

cos/sin are computed in forward from `torch.arange` over the (static) grid, full width per
section (`cat(f, f)` as Hugging Face does), shape [1, 1, S, section]. Attention is
`F.scaled_dot_product_attention` (non-causal, no mask).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

GRID = (2, 3, 4)  # (T, H, W) -> 24 tokens
HIDDEN = 64
HEADS = 4
HEAD_DIM = HIDDEN // HEADS  # 16
SECTIONS = (4, 6, 6)  # (t, h, w) widths of the head dim, summing to HEAD_DIM
THETA = 10000.0


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1 = x[..., :half]
    x2 = x[..., half:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos + rotate_half(x) * sin


def axis_inv_freq(dim: int, theta: float = THETA) -> torch.Tensor:
    """The usual RoPE frequencies for one axis's section of width `dim` (dim / 2 of them)."""
    return 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)


class Rope3DAttention(nn.Module):
    """Self-attention over a T x H x W token grid with multi-axis RoPE on q and k.

    Input `hidden_states` [batch, T*H*W, hidden]; output the same shape."""

    def __init__(
        self,
        grid: tuple[int, int, int] = GRID,
        hidden: int = HIDDEN,
        heads: int = HEADS,
        sections: tuple[int, ...] = SECTIONS,
        theta: float = THETA,
    ):
        super().__init__()
        head_dim = hidden // heads
        if sum(sections) != head_dim or any(s % 2 for s in sections) or len(sections) != len(grid):
            raise ValueError(f"sections {sections} must be even, one per grid axis, summing to {head_dim}")
        self.grid = tuple(grid)
        self.heads = heads
        self.head_dim = head_dim
        self.sections = tuple(sections)
        self.theta = theta
        self.to_q = nn.Linear(hidden, hidden)
        self.to_k = nn.Linear(hidden, hidden)
        self.to_v = nn.Linear(hidden, hidden)
        self.to_out = nn.Linear(hidden, hidden)
        # One frequency vector per axis, each over its own section width (float32, not persistent,
        # like HF's inv_freq).
        for axis, width in zip("thw", self.sections):
            self.register_buffer(f"inv_freq_{axis}", axis_inv_freq(width, theta), persistent=False)

    @property
    def seq_len(self) -> int:
        t, h, w = self.grid
        return t * h * w

    def axis_positions(self) -> list[torch.Tensor]:
        """Integer position of every token along each axis, [S] int64 each (frame-major)."""
        t, h, w = self.grid
        pos_t = torch.arange(t).view(t, 1, 1).expand(t, h, w).reshape(-1)
        pos_h = torch.arange(h).view(1, h, 1).expand(t, h, w).reshape(-1)
        pos_w = torch.arange(w).view(1, 1, w).expand(t, h, w).reshape(-1)
        return [pos_t, pos_h, pos_w]

    def rope_tables(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(cos, sin) per axis, full section width, [1, 1, S, section]."""
        tables = []
        for pos, axis in zip(self.axis_positions(), "thw"):
            inv_freq = getattr(self, f"inv_freq_{axis}")
            freqs = pos[:, None].float() * inv_freq[None, :]  # [S, section / 2]
            emb = torch.cat((freqs, freqs), dim=-1)  # [S, section]
            tables.append((emb.cos()[None, None], emb.sin()[None, None]))
        return tables

    def apply_multi_axis_rope(self, x: torch.Tensor, tables) -> torch.Tensor:
        """x [B, N, S, D]: rotate each section with its own axis's cos/sin, concatenate."""
        (cos_t, sin_t), (cos_h, sin_h), (cos_w, sin_w) = tables
        a, b = self.sections[0], self.sections[0] + self.sections[1]
        return torch.cat(
            [
                apply_rope(x[..., :a], cos_t, sin_t),
                apply_rope(x[..., a:b], cos_h, sin_h),
                apply_rope(x[..., b:], cos_w, sin_w),
            ],
            dim=-1,
        )

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = hidden_states.shape
        q = self.to_q(hidden_states).view(batch, seq, self.heads, self.head_dim).transpose(1, 2)
        k = self.to_k(hidden_states).view(batch, seq, self.heads, self.head_dim).transpose(1, 2)
        v = self.to_v(hidden_states).view(batch, seq, self.heads, self.head_dim).transpose(1, 2)
        tables = self.rope_tables()
        q = self.apply_multi_axis_rope(q, tables)
        k = self.apply_multi_axis_rope(k, tables)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=False)  # [B, N, S, D]
        out = out.transpose(1, 2).reshape(batch, seq, hidden)
        return self.to_out(out)


def reference_rope(x: torch.Tensor, grid=GRID, sections=SECTIONS, theta=THETA) -> torch.Tensor:
    """Independent per-lane spelling of the same rotation (complex multiply per pair (i, i+h)
    inside each section), used to check the module's rotation."""
    t, h, w = grid
    coords = torch.stack(
        torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij"), dim=-1
    ).reshape(-1, 3)
    out = []
    start = 0
    for axis, width in enumerate(sections):
        sec = x[..., start : start + width]
        half = width // 2
        angle = coords[:, axis, None].double() * axis_inv_freq(width, theta).double()[None, :]
        z = torch.complex(sec[..., :half].double(), sec[..., half:].double()) * torch.polar(
            torch.ones_like(angle), angle
        )
        out.append(torch.cat((z.real, z.imag), dim=-1).to(x.dtype))
        start += width
    return torch.cat(out, dim=-1)


if __name__ == "__main__":
    torch.manual_seed(0)
    module = Rope3DAttention().eval()
    x = torch.randn(2, HEADS, module.seq_len, HEAD_DIM)
    got = module.apply_multi_axis_rope(x, module.rope_tables())
    want = reference_rope(x)
    print("max |module - reference| =", float((got - want).abs().max()))
    print(module(torch.randn(2, module.seq_len, HIDDEN)).shape)
