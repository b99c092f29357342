"""A float mask whose form masks.py cannot read, claimed from running it.

HF's mask builder before ``masking_utils`` (optimum's BLOOM export) writes the padding into the
causal mask in place, ``causal[..., :L] = causal[..., :L].masked_fill(causal[..., :L] + m == 0,
min)``: a ``ScatterND`` into ``Trilu(full(min)) * (j > cache_position)``, with no ``Where(condition,
0, min)`` at its root. What such a mask computes can still be proven, from nothing but running it:

* it reads the values of no input but one ``[B, Skv]`` input, the padding candidate (the rest
  for their shapes only, as masks.py requires);
* every number it holds is probed past: each entry of its small constants, each constant's dims
  and each fixed size it reads off a shape (a head size read where the key count should be shows
  only at longer sequences); a number over 8192 cannot be, and refuses the claim unless it is the
  fill itself;
* running its subgraph (mask_probes.py: batches 1 to 3, sequences past those numbers, a cache when
  its inputs take one, paddings of 0 / 1 / 3 values) gives exactly 0 where ``causal and padding``
  or ``padding`` (with a padding candidate; ``causal`` without one), the first that holds at
  every run, leaves a key visible and everywhere else one finite fill that absorbs the scores (at
  most -1e30, or the mask type's minimum: ``empty_rows`` "uniform").

No window is claimed this way: a mask of unread form with a band stays a bias. A mask that is
padding only when fed 0 / 1 (BART's ``1 - m`` of the encoder mask: a 3 masks the key) is refused
saying so; that 0 / 1 run explains a refusal, it never makes a claim.
"""

from __future__ import annotations

import numpy as np

from otfuse.fusions.attention.mask_probes import (LARGEST_PROBED_OFFSET, SENTINEL, MaskClaim, computing_nodes,
                                                  input_values_read, static_dims_read, verify_by_running)
from otfuse.rewriter.graph import GraphIndex
from otfuse.rewriter.refuse import Refuse

_BATCHES = (1, 2, 3)
# s + fill rounds to fill in float32 for |s| < ulp(fill) / 2 (3.8e22 at -1e30): chain_checks' bound.
_ABSORBING = -1e30
# Constants with at most this many entries are read for the numbers they hold (shapes, starts,
# indices); larger ones are tables the run itself covers.
_SMALL_CONSTANT = 16


def claim_by_running(graph: GraphIndex, mask: str, unread: str) -> MaskClaim:
    """The claim running ``mask``'s subgraph proves, or Refuse; ``unread`` says why masks.py could
    not read its form (the refusal starts with it)."""
    reads = sorted(input_values_read(graph, mask, {}))
    if len(reads) > 1 or (reads and graph.rank(reads[0]) != 2):
        raise Refuse(f"{unread}, and it reads the values of {reads}, not of one [B, Skv] padding mask")
    padding = reads[0] if reads else None
    numbers = _numbers(graph, mask) | static_dims_read(graph, mask)
    refusals = []
    # A mask that reads the padding's values is claimed with it: a claim without it would leave
    # those values unprobed (the runs feed all ones where no padding is claimed).
    for causal, key_padding in ((True, padding), (False, padding)) if padding else ((True, None),):
        fill = _Fill()
        try:
            lengths = verify_by_running(graph, mask, MaskClaim(causal, 0, key_padding, "uniform"), fill.visible,
                                        numbers, _BATCHES)
        except Refuse as refusal:
            refusals.append(str(refusal))
            continue
        unprobed = sorted(n for n in numbers if LARGEST_PROBED_OFFSET < n < SENTINEL and n != fill.magnitude)
        if unprobed or fill.value is None:
            raise Refuse(f"{unread}, and it holds {unprobed[0] if unprobed else 'no fill'}, longer than the sequences "
                         f"otfuse runs it at ({LARGEST_PROBED_OFFSET})")
        return MaskClaim(causal, 0, key_padding, "uniform", lengths, float(fill.value))
    if padding and _padding_for_binary_values_only(graph, mask, padding, numbers):
        raise Refuse(f"{unread}, and it is key padding by {padding!r} only where that mask holds 0 or 1: it "
                     f"computes 1 - m (BART's mask builder), so a 3 there masks a key that key_padding_mask attends")
    raise Refuse(f"{unread}, and running it matches no causal / padding claim ({refusals[0]})")


def _padding_for_binary_values_only(graph: GraphIndex, mask: str, padding: str, numbers: set[int]) -> bool:
    """Whether the mask is padding by ``padding`` when fed 0 / 1 only: then it fails the claim only
    for the other values, which the refusal should say (no claim is made from this)."""
    try:
        verify_by_running(graph, mask, MaskClaim(False, 0, padding, "uniform"), _Fill().visible, numbers, _BATCHES,
                          binary_padding=True)
    except Refuse:
        return False
    return True


class _Fill:
    """The one value a mask hides keys with, learned from the runs: each must agree."""

    def __init__(self):
        self.value: float | None = None

    @property
    def magnitude(self) -> int | None:
        return None if self.value is None else int(abs(self.value))

    def visible(self, got: np.ndarray) -> np.ndarray | None:
        """The keys ``got`` leaves visible (0), or None if it holds anything but 0 and the fill."""
        hidden = got[got != 0]
        if hidden.size:
            value = float(hidden.reshape(-1)[0])
            if not np.all(hidden == hidden.reshape(-1)[0]) or not _absorbs(value, got.dtype) or \
                    self.value not in (None, value):
                return None
            self.value = value
        return got == 0


def _absorbs(fill: float, dtype) -> bool:
    """Whether ``s + fill`` is ``fill`` for any ordinary score, so a row with every key hidden is
    uniform in the graph as with ``empty_rows`` "uniform" and a hidden key weighs nothing: a
    finite fill at most -1e30, or the mask type's own minimum (float16's -65504, as masks.py
    takes it). A fill like -1e4 keeps the scores; -inf makes such a row NaN, which the op does not."""
    return np.isfinite(fill) and (fill <= _ABSORBING or fill == float(np.finfo(dtype).min))


def _numbers(graph: GraphIndex, mask: str) -> set[int]:
    """|c| of every finite entry of the small constants the mask's computation uses, and the dims
    of every constant (a buffer sliced to the sequence shows its length only past it); its shape
    reads excluded: what they give is probed by the sequences themselves."""
    found = set()
    for node in computing_nodes(graph, mask):
        for operand in (i for i in node.input if i and graph.is_constant(i)):
            found |= set(graph.constant_shape(operand) or ())
            if (graph.constant_size(operand) or 0) <= _SMALL_CONSTANT:
                values = np.asarray(graph.constant_value(operand), dtype=np.float64).reshape(-1)
                found |= {int(abs(v)) for v in values if np.isfinite(v)}
    return found
