"""Recognise the attention mask an exporter built in the graph, so ``Attention`` can apply it as
``causal`` / ``window`` / ``key_padding_mask`` (no S x S tensor, masked tiles skipped) instead of
adding a materialised ``[B, 1, Sq, Skv]`` bias.

A float mask is ``Where(visible, 0, min)`` or ``Where(masked, min, 0)``, possibly chained
(``Where(c, inner, min)``: both must hold) or combined (``Add``, ``Min``) with one ``min``. Its
condition is read as a conjunction (``And``, ``Or`` under ``Not``, ``Not``, ``Cast`` to bool,
``Expand``, a ``Slice`` of a computed condition: optimum's ``cond[..., :Shape(K)[2]]``) of leaves:

* an **index comparison** (``LessOrEqual``/``Less``/``Greater``/``GreaterOrEqual`` of two values
  computed from shapes only: ``Range``, ``CumSum``, ...): causal; with constants added to either
  side (through reshapes, ``Add``, ``Sub``, ``Neg``, a cache offset added to an index): the sliding
  window that bounds ``q - kv`` (``kv > q - W``, ``q - kv < W``, ``kv >= q - W + 1``, ... are all W);
* ``Trilu`` of a constant-filled tensor, or a ``Slice`` of a constant triangular buffer: causal;
* every leaf that reads the values of no input at a fixed size (a constant, or computed from
  constants and fixed shapes: static-shape exports fold the causal comparison and the window
  overlay into such constants) joins the **constant part**, read off entry by entry by
  constant_masks.py: exactly the bottom-right band of one window W, row by row, or refused
  naming the row that breaks it. A constant float part of a sum / minimum / ``Where`` (a
  ``[1, 1, S, S]`` bias of 0 and one fill) is such a leaf too, visible where it is 0;
* anything reading the **values of one [B, Skv] graph input** (and shapes only otherwise, e.g.
  ``GatherND(Cast(attention_mask, bool), ...)`` or TorchScript's ``Gather(Flatten(...))``):
  key padding by that input;
* constants / ``ConstantOfShape`` that are all true, comparisons of an index with a constant
  (BERT's ``q_idx >= 0``), and ``Equal`` of two values computed from shapes only (transformers'
  packed-sequence test when a decoder is exported with ``input_ids`` only): no condition.

A float mask of no such form (HF's in-place ``mask[..., :L] = mask[..., :L].masked_fill(...)``,
a ScatterND) is left to opaque_masks.py, which takes the claim from running it. Any other
condition and the mask stays a bias. The claim is then **checked by running the mask's own
subgraph** (mask_probes.py) in ONNX Runtime at several batch/sequence/cache sizes and paddings
(including sequences longer than the window and than every offset constant the condition uses)
against ``causal and window and padding`` with bottom-right alignment: the float mask must be
exactly 0 where the claim says visible and exactly ``min`` elsewhere. What the structure suggests
must be what the graph computes, or nothing is claimed. The mask may read the values of no input
but the padding mask (others only for their shapes), so what runs here is what runs in the model.
A mask that can run at one size only (a static export) is proven at that size, and the claim
holds for scores of that Sq x Skv only (``MaskClaim.lengths``, checked against the scores).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import onnx

from otfuse.fusions.attention.constant_masks import band_window, bias_fill, constant_part, static_value
from otfuse.fusions.attention.mask_probes import (LARGEST_PROBED_OFFSET, MASKED_BELOW, SENTINEL, MaskClaim,
                                                  computing_nodes, input_values_read, require_lengths,
                                                  static_dims_read, verify_by_running)
from otfuse.fusions.attention.opaque_masks import claim_by_running
from otfuse.rewriter.graph import GraphIndex
from otfuse.rewriter.pattern import attr
from otfuse.rewriter.refuse import Refuse

BOOL = onnx.TensorProto.BOOL
# Ops whose constant operand can shift or bound an index by that much.
_OFFSETTING = {"Add", "Sub", "Mul", "Div", "Mod", "Min", "Max", "Clip", "Trilu"}
_COMPARISONS = {"Less", "LessOrEqual", "Greater", "GreaterOrEqual"}
# Ops that move a mask's entries into another shape without changing which keys it masks (which
# entry lands where is what the run checks).
_RESHAPING = {"Expand", "Identity", "Unsqueeze", "Reshape", "Squeeze"}


def classify_mask(graph: GraphIndex, mask: str, memo: dict, scores: tuple) -> MaskClaim:
    """A verified claim for the float additive ``mask`` added to ``scores`` (their shape); raises
    Refuse saying why none can be made. Memoised per pass: the claim, or the refusal's text (every
    layer reads the same mask)."""
    def claim() -> MaskClaim:
        try:  # the pass memo also keeps the constant parts' values: every layer's mask reads the same
            conditions, fill = _float_mask_conditions(graph, mask, memo)
        except Refuse as unread:  # no form read: what it computes may still be proven by running it
            return claim_by_running(graph, mask, str(unread))
        fill = _in_type_of(graph, mask, fill)  # float32's minimum is -inf in float16
        empty_rows = "uniform" if np.isfinite(fill) else "zero"
        return replace(_claim(graph, mask, conditions, empty_rows, lambda got: _visible_where_zero(got, fill), memo),
                       fill=float(fill))

    found = _memoised(memo, ("mask", mask), claim)
    require_lengths(found, scores)
    return found


def classify_bool_mask(graph: GraphIndex, condition: str, memo: dict, scores: tuple,
                       masked: bool = False) -> MaskClaim:
    """As ``classify_mask`` for a bool mask (True = attend, or with ``masked`` True = masked, as
    ``masked_fill`` reads it; masked keys count as -inf)."""
    if masked:
        found = _memoised(memo, ("masked_bool_mask", condition),
                          lambda: _claim(graph, condition, [(condition, True)], "zero",
                                         lambda got: ~got.astype(bool), memo))
    else:
        found = _memoised(memo, ("bool_mask", condition),
                          lambda: _claim(graph, condition, [(condition, False)], "zero",
                                         lambda got: got.astype(bool), memo))
    require_lengths(found, scores)
    return found


def _in_type_of(graph: GraphIndex, mask: str, fill: float) -> float:
    """The fill as the mask holds it, after the Casts between the Where and the mask."""
    elem = graph.elem_type(mask)
    if not elem:
        return fill
    with np.errstate(over="ignore"):
        return float(np.asarray(fill).astype(onnx.helper.tensor_dtype_to_np_dtype(elem)))


def _memoised(memo: dict, key: tuple, claim) -> MaskClaim:
    if key not in memo:
        try:
            memo[key] = claim()
        except Refuse as refusal:
            memo[key] = _Refused(str(refusal))
    found = memo[key]
    if isinstance(found, _Refused):
        raise Refuse(found.reason)
    return found


@dataclass(frozen=True)
class _Refused:
    reason: str


# -- structure ----------------------------------------------------------------------------------
def _float_mask_conditions(graph: GraphIndex, mask: str, memo: dict) -> tuple[list[tuple[str, bool]], float]:
    """The (condition, negated) pairs a float mask requires for a key to be visible, and its fill.
    Through reshapes, Casts between float types, sums and minimums: ``Add(m, zeros)`` is m,
    ``Add(m1, m2)`` / ``Min(m1, m2)`` of two masks with one fill hides what either hides (ONNX
    Attention's body adds the causal, window and padding masks it builds); what the sum computes
    is checked by running it. A part that reads no input's values at a fixed size (a constant
    [1, 1, S, S] bias of 0 / min) is its own condition, ``(part, True)``: visible where it is 0."""
    node = graph.producer.get(mask)
    while node is not None and (node.op_type in _RESHAPING or (node.op_type == "Cast" and attr(node, "to") != BOOL)):
        node = graph.producer.get(node.input[0])
    if node is not None and node.op_type in ("Add", "Min"):
        parts = [name for name in node.input if not zero_filled(graph, name)]
        if not parts:
            raise Refuse("the mask is all zeros")
        found = [_float_mask_conditions(graph, name, memo) for name in parts]
        if len({fill for _, fill in found}) != 1:
            raise Refuse(f"masks combined by {node.op_type} filling {sorted({fill for _, fill in found})}")
        return [pair for conditions, _ in found for pair in conditions], found[0][1]
    if node is None or node.op_type != "Where":
        values = static_value(graph, mask, memo)
        if values is None:
            raise Refuse("the mask is not Where(condition, 0, minimum)")
        return [(mask, True)], bias_fill(values, f"the constant mask {mask!r}")
    keep, fill = _filled_value(graph, node.input[1]), _filled_value(graph, node.input[2])
    if _masks(fill):  # Where(visible, 0 | inner mask, min)
        negated, inner, fill_value = False, node.input[1], fill
    elif _masks(keep):  # Where(masked, min, 0 | inner mask)
        negated, inner, fill_value = True, node.input[2], keep
    else:
        raise Refuse(f"the mask adds {keep} / {fill}, not 0 / a large negative minimum")
    conditions = [(node.input[0], negated)]
    if _filled_value(graph, inner) == 0.0:
        return conditions, fill_value
    more, inner_fill = _float_mask_conditions(graph, inner, memo)
    if inner_fill != fill_value:
        raise Refuse(f"chained masks fill {fill_value} and {inner_fill}: fully masked rows would differ")
    return conditions + more, fill_value


def _filled_value(graph: GraphIndex, value: str) -> float | None:
    """The one number of a scalar constant, or of ``Expand(scalar constant, shape)``: the
    unoptimised dynamo export's ``torch.zeros(())`` (which of the two broadcasts is what the run
    checks); None for anything else."""
    node = graph.producer.get(value)
    if node is not None and node.op_type == "Expand" and node.domain in ("", "ai.onnx"):
        return graph.scalar_value(node.input[0])
    return graph.scalar_value(value)


def zero_filled(graph: GraphIndex, value: str) -> bool:
    """A tensor of zeros (a constant, or ``ConstantOfShape`` with no value or 0, through Casts):
    ONNX's function body adds one as the bias of an attention without a mask. ``s + 0`` is s
    (the caller checks it widens nothing)."""
    node = graph.producer.get(value)
    while node is not None and node.op_type == "Cast":
        value, node = node.input[0], graph.producer.get(node.input[0])
    if graph.is_constant(value):
        const = graph.constant_value(value)
        return const is not None and const.size > 0 and not np.any(const)
    if node is None or node.op_type != "ConstantOfShape":
        return False
    fill = attr(node, "value")
    return fill is None or not np.any(onnx.numpy_helper.to_array(fill))


def _masks(value: float | None) -> bool:
    return value is not None and value <= MASKED_BELOW


def _conjuncts(graph: GraphIndex, value: str, negated: bool) -> list[tuple[str, bool]]:
    """The leaves whose conjunction is ``value`` (or its negation); broadcasts and casts to bool
    do not change a condition."""
    node = graph.producer.get(value)
    if node is None:
        return [(value, negated)]
    if (node.op_type == "And" and not negated) or (node.op_type == "Or" and negated):
        return _conjuncts(graph, node.input[0], negated) + _conjuncts(graph, node.input[1], negated)
    if node.op_type == "Not":
        return _conjuncts(graph, node.input[0], not negated)
    compared = _compared_with_zero(graph, node)
    if compared is not None:  # Equal(v, 0) is Not(v): torch's `tril(ones) == 0` before masked_fill
        return _conjuncts(graph, compared, not negated)
    if node.op_type in _RESHAPING or (node.op_type == "Cast" and attr(node, "to") == BOOL):
        return _conjuncts(graph, node.input[0], negated)
    if node.op_type == "Slice" and not graph.is_constant(node.input[0]):
        # optimum's cond[..., :Shape(K)[2]]: a slice keeps the condition of each entry it keeps (a
        # constant buffer's slice is a leaf of its own)
        return _conjuncts(graph, node.input[0], negated)
    picked = _picks_zero_or_not(graph, node)
    if picked is not None:  # a float mask read as a condition (MPT: Cast(Where(visible, 0, min), bool))
        return _conjuncts(graph, node.input[0], negated if picked else not negated)
    return [(value, negated)]


def _picks_zero_or_not(graph: GraphIndex, node: onnx.NodeProto) -> bool | None:
    """For ``Where(c, a, b)`` of two scalar constants, one of them 0: whether the result is non-zero
    exactly where c holds (True) or exactly where it does not (False); None for anything else."""
    if node.op_type != "Where" or node.domain not in ("", "ai.onnx"):
        return None
    a, b = graph.scalar_value(node.input[1]), graph.scalar_value(node.input[2])
    if a is None or b is None or (a == 0) == (b == 0):
        return None
    return b == 0


def _compared_with_zero(graph: GraphIndex, node: onnx.NodeProto) -> str | None:
    """v of ``Equal(v, 0)`` / ``Equal(0, v)``: true exactly where v is false (as a condition)."""
    if node.op_type != "Equal" or node.domain not in ("", "ai.onnx"):
        return None
    for this, other in ((0, 1), (1, 0)):
        if graph.scalar_value(node.input[other]) == 0.0 and not graph.is_constant(node.input[this]):
            return node.input[this]
    return None


def _leaf_kind(graph: GraphIndex, value: str, negated: bool, memo: dict) -> tuple[str, object]:
    reads = input_values_read(graph, value, memo)
    if reads:
        name = next(iter(reads))
        if len(reads) == 1 and graph.rank(name) == 2:
            return "padding", name
        return "unknown", f"a condition reading the values of {sorted(reads)}"
    node = graph.producer.get(value)
    if node is None:
        return "unknown", f"graph input {value!r}"
    if node.op_type == "ConstantOfShape":
        fill = attr(node, "value")
        filled = bool(onnx.numpy_helper.to_array(fill).reshape(-1)[0]) if fill is not None else False
        return ("true", None) if filled != negated else ("unknown", "an all-false condition")
    if node.op_type in _COMPARISONS:
        return _comparison_kind(graph, node)
    if node.op_type == "Equal":
        # Of values computed from shapes only (no input's values, checked above): transformers'
        # packed-sequence test of positions it builds by Range (same sequence index on both
        # sides). It must hold for every query and key, which running checks.
        return "shape_equal", None
    if node.op_type == "Trilu" and _filled_with_nonzero(graph, node.input[0]):
        return "causal", None
    if node.op_type == "Slice" and _triangular_constant(graph, node.input[0]):
        return "causal", None
    return "unknown", f"{node.op_type} {node.name!r}"


def _comparison_kind(graph: GraphIndex, node: onnx.NodeProto) -> tuple[str, object]:
    """Read ``a op b`` as ``x - y op k``: x and y the index terms (Range, CumSum, their reshapes,
    a cache offset added to one), k the constants added to either side. No constant: causal (which
    side is the query is settled by running). Otherwise the window it bounds q - kv by, the
    exporter's ``kv > q - W``, ``q - W < kv``, ``q - kv < W``, ``kv + W > q`` alike: only an upper
    bound of q - kv is a window, so Less / LessOrEqual put the query in x and Greater /
    GreaterOrEqual in y, and a non-strict bound admits one key more. Running checks the reading."""
    (left, left_c), (right, right_c) = (_linear(graph, name) for name in node.input)
    terms = [sign for _, sign in left] + [-sign for _, sign in right]
    if len(terms) <= 1:
        return "versus_constant", None  # e.g. BERT's q_idx >= 0: true, if running agrees
    if not (1 in terms and -1 in terms):
        return "unknown", f"{node.op_type} {node.name!r} of a sum of indices, not a difference"
    k = right_c - left_c  # x - y op k
    if k == 0:
        return "causal", None
    strict = node.op_type in ("Less", "Greater")
    window = (k if node.op_type in ("Less", "LessOrEqual") else -k) + (0 if strict else 1)
    if window != int(window) or window <= 0:
        return "unknown", f"an index compared with an offset of {k:g} ({node.op_type} {node.name!r})"
    return "window", int(window)


_LINEAR_STEPS = _RESHAPING | {"Cast"}


def _linear(graph: GraphIndex, value: str, sign: int = 1) -> tuple[list, float]:
    """``value`` as a sum of signed terms and a constant, through reshapes, Casts, ``Add``, ``Sub``
    and ``Neg``: ([(term, +1 | -1)], constant); a term is any other value (an index, a constant
    row: what it holds is for the run to check)."""
    c = graph.scalar_value(value)
    if c is not None:
        return [], sign * c
    node = graph.producer.get(value)
    if node is not None and node.op_type in _LINEAR_STEPS and node.domain in ("", "ai.onnx") \
            and (node.op_type != "Cast" or attr(node, "to") != BOOL):
        return _linear(graph, node.input[0], sign)
    if node is not None and node.op_type == "Neg":
        return _linear(graph, node.input[0], -sign)
    if node is not None and node.op_type in ("Add", "Sub") and node.domain in ("", "ai.onnx"):
        first = _linear(graph, node.input[0], sign)
        second = _linear(graph, node.input[1], sign if node.op_type == "Add" else -sign)
        return first[0] + second[0], first[1] + second[1]
    return [(value, sign)], 0.0


def _filled_with_nonzero(graph: GraphIndex, value: str) -> bool:
    """A tensor of one non-zero value: a constant, or ConstantOfShape (through casts)."""
    node = graph.producer.get(value)
    while node is not None and node.op_type in ("Cast", "Expand"):  # a broadcast keeps the one value
        value, node = node.input[0], graph.producer.get(node.input[0])
    if graph.is_constant(value):
        const = np.asarray(graph.constant_value(value))
        return bool(const.size) and bool(np.all(const != 0))
    if node is not None and node.op_type == "ConstantOfShape":
        fill = attr(node, "value")
        return fill is not None and bool(onnx.numpy_helper.to_array(fill).reshape(-1)[0] != 0)
    return False


def _triangular_constant(graph: GraphIndex, value: str) -> bool:
    """A precomputed causal buffer: a square constant equal to tril(ones) or its complement."""
    if not graph.is_constant(value):
        return False
    const = np.asarray(graph.constant_value(value))
    square = const.reshape(const.shape[-2:]) if const.ndim >= 2 and const.size == np.prod(const.shape[-2:]) \
        else None
    if square is None or square.shape[0] != square.shape[1]:
        return False
    lower = np.tril(np.ones(square.shape, dtype=bool))
    return bool(np.array_equal(square != 0, lower) or np.array_equal(square != 0, ~lower))


def _offset_constants(graph: GraphIndex, value: str) -> set[int]:
    """Scalar constants combined with or compared to anything in the condition's computation
    (shape reads excluded): a band, shift or bound of that size shows only at sequences longer
    than it, so the check runs there too."""
    found = set()
    for node in computing_nodes(graph, value):
        if node.op_type in _COMPARISONS | _OFFSETTING | {"Equal"}:
            for operand in node.input[1:] if node.op_type == "Trilu" else node.input:
                c = graph.scalar_value(operand) if operand else None
                if c is not None and np.isfinite(c):
                    found.add(int(abs(c)))
    return found


def _claim(graph: GraphIndex, output: str, conditions: list[tuple[str, bool]], empty_rows: str,
           visible_of, memo: dict) -> MaskClaim:
    causal, windows, paddings = False, set(), set()
    constants = []  # (values, negated) of the leaves that read no input at a fixed size
    for condition, negated in conditions:
        for leaf, leaf_negated in _conjuncts(graph, condition, negated):
            values = static_value(graph, leaf, memo)
            if values is not None:
                constants.append((values, leaf_negated))
                continue
            kind, value = _leaf_kind(graph, leaf, leaf_negated, memo)
            if kind == "causal":
                causal = True
            elif kind == "window":
                windows.add(value)
            elif kind == "padding":
                paddings.add(value)
            elif kind not in ("true", "versus_constant", "shape_equal"):
                raise Refuse(f"the mask has a condition otfuse does not know ({value})")
    if constants:  # read off together, entry by entry: a causal band of one window, or all visible
        visible = constant_part(constants, graph.shape(output))
        if not visible.all():
            causal = True
            windows |= {band_window(visible)} - {0}
    if len(windows) > 1 or len(paddings) > 1:
        raise Refuse(f"the mask has several windows {sorted(windows)} or padding inputs {sorted(paddings)}")
    window, padding = (windows or {0}).pop(), (paddings or {None}).pop()
    if window and not causal:
        raise Refuse("a sliding window without the causal condition")
    if not causal and padding is None:
        raise Refuse("the mask is neither causal nor padding")
    claim = MaskClaim(causal, window, padding, empty_rows)
    offsets = set()
    for condition, _ in conditions:
        offsets |= _offset_constants(graph, condition)
    unprobed = sorted(c for c in offsets | {window} if LARGEST_PROBED_OFFSET < c < SENTINEL)
    if unprobed:
        raise Refuse(f"the mask uses {unprobed[0]}, longer than the sequences otfuse runs it at "
                       f"({LARGEST_PROBED_OFFSET})")
    # and past each fixed size it reads off a shape (a head size read where the key count belongs)
    lengths = verify_by_running(graph, output, claim, visible_of, offsets | static_dims_read(graph, output))
    return replace(claim, lengths=lengths)


def _visible_where_zero(got: np.ndarray, fill: float) -> np.ndarray | None:
    """Keys an additive mask leaves visible (0), or None if it adds anything but 0 and ``fill``."""
    visible = got == 0
    masked = got == np.asarray(fill, dtype=got.dtype)
    return visible if np.all(visible | masked) else None
