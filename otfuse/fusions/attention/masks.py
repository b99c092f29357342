"""Recognise the attention mask an exporter built in the graph, so ``Attention`` can apply it as
``causal`` / ``window`` / ``key_padding_mask`` (no S x S tensor, masked tiles skipped) instead of
adding a materialised ``[B, 1, Sq, Skv]`` bias.

A float mask is ``Where(visible, 0, min)`` or ``Where(masked, min, 0)``, possibly chained
(``Where(c, inner, min)``: both must hold) with one ``min``. Its condition is read as a
conjunction (``And``, ``Or`` under ``Not``, ``Not``, ``Cast`` to bool, ``Expand``) of leaves:

* an **index comparison** (``LessOrEqual``/``Less``/``Greater``/``GreaterOrEqual`` of two values
  computed from shapes only: ``Range``, ``CumSum``, ...): causal; with ``Sub(idx, W)`` or
  ``Add(idx, W)`` on one side: a sliding window of ``W``;
* ``Trilu`` of a constant-filled tensor, or a ``Slice`` of a constant triangular buffer: causal;
* anything reading the **values of one [B, Skv] graph input** (and shapes only otherwise, e.g.
  ``GatherND(Cast(attention_mask, bool), ...)`` or TorchScript's ``Gather(Flatten(...))``):
  key padding by that input;
* constants / ``ConstantOfShape`` that are all true, comparisons of an index with a constant
  (BERT's ``q_idx >= 0``), and ``Equal`` of two values computed from shapes only (transformers'
  packed-sequence test when a decoder is exported with ``input_ids`` only): no condition.

Anything else and the mask stays a bias. The claim is then **checked by running the mask's own
subgraph** in ONNX Runtime at several batch/sequence/cache sizes and paddings (including
sequences longer than the window and than every offset constant the condition uses) against
``causal and window and padding`` with bottom-right alignment: the float mask must be exactly 0
where the claim says visible and exactly ``min`` elsewhere. What the structure suggests must be
what the graph computes, or nothing is claimed. The mask may read the values of no input but the
padding mask (others only for their shapes), so what runs here is what runs in the model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from otfuse.rewriter.graph import GraphIndex
from otfuse.rewriter.pattern import attr
from otfuse.rewriter.refuse import Refuse

BOOL = onnx.TensorProto.BOOL
# A "minimum" at least this negative masks a key for good in float32 and float16 alike.
_MASKED_BELOW = -1e4
# Offsets (and windows) up to this size are probed by running at a longer sequence. A larger one
# cannot be (the [B, 1, S, S] mask would not fit in memory), so no claim is made with it in the
# condition, except sentinels from INT32_MAX up ("no limit": Slice ends, clamps).
_LARGEST_PROBED_OFFSET = 8192
_SENTINEL = 2**31 - 1
# Ops whose constant operand can shift or bound an index by that much.
_OFFSETTING = {"Add", "Sub", "Mul", "Div", "Mod", "Min", "Max", "Clip", "Trilu"}
_COMPARISONS = {"Less", "LessOrEqual", "Greater", "GreaterOrEqual"}
_SHAPE_READERS = {"Shape", "Size"}
# Ops that move a mask's entries into another shape without changing which keys it masks (which
# entry lands where is what the run checks).
_RESHAPING = {"Expand", "Identity", "Unsqueeze", "Reshape", "Squeeze"}


@dataclass(frozen=True)
class MaskClaim:
    causal: bool
    window: int  # 0 = none
    key_padding: str | None  # the graph input holding the [B, Skv] padding mask
    empty_rows: str  # "uniform" for a finite minimum (HF), "zero" for -inf


def classify_mask(graph: GraphIndex, mask: str, memo: dict) -> MaskClaim:
    """A verified claim for the float additive ``mask``; raises Refuse saying why none can be made.
    Memoised per pass: the claim, or the refusal's text (every layer reads the same mask)."""
    def claim() -> MaskClaim:
        conditions, fill = _float_mask_conditions(graph, mask)
        fill = _in_type_of(graph, mask, fill)  # float32's minimum is -inf in float16
        empty_rows = "uniform" if np.isfinite(fill) else "zero"
        return _claim(graph, mask, conditions, empty_rows, lambda got: _visible_where_zero(got, fill))

    return _memoised(memo, ("mask", mask), claim)


def classify_bool_mask(graph: GraphIndex, condition: str, memo: dict, masked: bool = False) -> MaskClaim:
    """As ``classify_mask`` for a bool mask (True = attend, or with ``masked`` True = masked, as
    ``masked_fill`` reads it; masked keys count as -inf)."""
    if masked:
        return _memoised(memo, ("masked_bool_mask", condition),
                         lambda: _claim(graph, condition, [(condition, True)], "zero", lambda got: ~got.astype(bool)))
    return _memoised(memo, ("bool_mask", condition),
                     lambda: _claim(graph, condition, [(condition, False)], "zero", lambda got: got.astype(bool)))


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
def _float_mask_conditions(graph: GraphIndex, mask: str) -> tuple[list[tuple[str, bool]], float]:
    """The (condition, negated) pairs a float mask requires for a key to be visible, and its fill.
    Through reshapes, Casts between float types and sums: ``Add(m, zeros)`` is m, ``Add(m1, m2)``
    of two masks with one fill hides what either hides (ONNX Attention's body adds the causal,
    window and padding masks it builds); what the sum computes is checked by running it."""
    node = graph.producer.get(mask)
    while node is not None and (node.op_type in _RESHAPING or (node.op_type == "Cast" and attr(node, "to") != BOOL)):
        node = graph.producer.get(node.input[0])
    if node is not None and node.op_type == "Add":
        parts = [name for name in node.input if not zero_filled(graph, name)]
        if not parts:
            raise Refuse("the mask is all zeros")
        found = [_float_mask_conditions(graph, name) for name in parts]
        if len({fill for _, fill in found}) != 1:
            raise Refuse(f"a sum of masks filling {sorted({fill for _, fill in found})}")
        return [pair for conditions, _ in found for pair in conditions], found[0][1]
    if node is None or node.op_type != "Where":
        raise Refuse("the mask is not Where(condition, 0, minimum)")
    keep, fill = graph.scalar_value(node.input[1]), graph.scalar_value(node.input[2])
    if _masks(fill):  # Where(visible, 0 | inner mask, min)
        negated, inner, fill_value = False, node.input[1], fill
    elif _masks(keep):  # Where(masked, min, 0 | inner mask)
        negated, inner, fill_value = True, node.input[2], keep
    else:
        raise Refuse(f"the mask adds {keep} / {fill}, not 0 / a large negative minimum")
    conditions = [(node.input[0], negated)]
    if graph.scalar_value(inner) == 0.0:
        return conditions, fill_value
    more, inner_fill = _float_mask_conditions(graph, inner)
    if inner_fill != fill_value:
        raise Refuse(f"chained masks fill {fill_value} and {inner_fill}: fully masked rows would differ")
    return conditions + more, fill_value


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
    return value is not None and value <= _MASKED_BELOW


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


def input_values_read(graph: GraphIndex, value: str, memo: dict) -> frozenset[str]:
    """The graph inputs whose values (not just shapes) ``value`` depends on."""
    key = ("reads", value)
    if key in memo:
        return memo[key]
    found, seen, stack = set(), set(), [value]
    while stack:
        name = stack.pop()
        if name in seen or graph.is_constant(name):
            continue
        seen.add(name)
        if name in graph.graph_inputs:
            found.add(name)
            continue
        node = graph.producer.get(name)
        if node is not None and node.op_type not in _SHAPE_READERS:
            stack.extend(i for i in node.input if i)
    memo[key] = frozenset(found)
    return memo[key]


def _leaf_kind(graph: GraphIndex, value: str, negated: bool, memo: dict) -> tuple[str, object]:
    reads = input_values_read(graph, value, memo)
    if reads:
        name = next(iter(reads))
        if len(reads) == 1 and graph.rank(name) == 2:
            return "padding", name
        return "unknown", f"a condition reading the values of {sorted(reads)}"
    if graph.is_constant(value):
        const = np.asarray(graph.constant_value(value)).astype(bool)
        if const.size and (const.all() if not negated else not const.any()):
            return "true", None
        if _triangular_constant(graph, value):  # a causal comparison folded at static shapes
            return "causal", None
        band = _band_constant(graph, value, negated)
        if band is not None:
            return ("band", band) if band else ("causal", None)
        if _band_constant(graph, value, negated, aligned="any") is not None:
            return "unknown", ("a causal mask aligned to the past length, not to the bottom right (ONNX is_causal "
                               "with a query count other than the new keys')")
        return "unknown", "a constant condition"
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
    constants = [graph.scalar_value(name) for name in node.input]
    if any(c is not None for c in constants):
        return "versus_constant", None  # e.g. BERT's q_idx >= 0: true, if running agrees
    for name in node.input:
        offset = _index_offset(graph, name)
        if offset is not None:
            if offset == int(offset) and offset > 0:
                return "window", int(offset)
            return "unknown", f"an index compared with an offset of {offset}"
    return "causal", None  # which side is the query is settled by running the graph


def _index_offset(graph: GraphIndex, value: str) -> float | None:
    """W of ``Sub(idx, W)`` or ``Add(idx, W)`` / ``Add(W, idx)``, else None."""
    node = graph.producer.get(value)
    if node is None or node.op_type not in ("Sub", "Add"):
        return None
    right = graph.scalar_value(node.input[1])
    if right is not None:
        return abs(right)
    left = graph.scalar_value(node.input[0])
    return abs(left) if node.op_type == "Add" and left is not None else None


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


def _band_constant(graph: GraphIndex, value: str, negated: bool, aligned: str = "bottom_right") -> int | None:
    """The window W (0: none) of a constant [Sq, Skv] condition equal to the bottom-right causal
    band ``t - W < j <= t`` (t = Skv - Sq + i): comparisons of ONNX Attention's body folded at
    static shapes. None for any other constant (the top-left causal mask of Sq != Skv included);
    ``aligned="any"``: the band for any row offset t = P + i (to name that in a refusal)."""
    if not graph.is_constant(value):
        return None
    const = np.asarray(graph.constant_value(value))
    if const.ndim < 2 or const.size != np.prod(const.shape[-2:]) or 0 in const.shape:
        return None
    visible = (const.reshape(const.shape[-2:]) != 0) != negated  # negated: the condition masks
    rows, keys = visible.shape
    j = np.arange(keys)[None, :]
    for offset in [keys - rows] if aligned == "bottom_right" else range(-rows, keys + 1):
        t = offset + np.arange(rows)[:, None]
        for window in [0, *range(1, keys + 1)]:
            band = (j <= t) & ((j > t - window) if window else True)
            if np.array_equal(visible, band):
                return window
    return None


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
    found, seen, stack = set(), set(), [value]
    while stack:
        name = stack.pop()
        node = graph.producer.get(name)
        if name in seen or node is None or node.op_type in _SHAPE_READERS:
            continue
        seen.add(name)
        if node.op_type in _COMPARISONS | _OFFSETTING | {"Equal"}:
            for operand in node.input[1:] if node.op_type == "Trilu" else node.input:
                c = graph.scalar_value(operand) if operand else None
                if c is not None and np.isfinite(c):
                    found.add(int(abs(c)))
        stack.extend(i for i in node.input if i and not graph.is_constant(i))
    return found


def _claim(graph: GraphIndex, output: str, conditions: list[tuple[str, bool]], empty_rows: str,
           visible_of) -> MaskClaim:
    memo: dict = {}
    causal, windows, paddings = False, set(), set()
    for condition, negated in conditions:
        for leaf, leaf_negated in _conjuncts(graph, condition, negated):
            kind, value = _leaf_kind(graph, leaf, leaf_negated, memo)
            if kind == "causal":
                causal = True
            elif kind == "band":  # causal with a window, folded
                causal = True
                windows.add(value)
            elif kind == "window":
                windows.add(value)
            elif kind == "padding":
                paddings.add(value)
            elif kind not in ("true", "versus_constant", "shape_equal"):
                raise Refuse(f"the mask has a condition otfuse does not know ({value})")
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
    unprobed = sorted(c for c in offsets | {window} if _LARGEST_PROBED_OFFSET < c < _SENTINEL)
    if unprobed:
        raise Refuse(f"the mask uses {unprobed[0]}, longer than the sequences otfuse runs it at "
                       f"({_LARGEST_PROBED_OFFSET})")
    _verify_by_running(graph, output, claim, visible_of, offsets)
    return claim


# -- verification -------------------------------------------------------------------------------
def _read_for_shape_only(graph: GraphIndex, value: str, needed_by: dict) -> bool:
    """Whether the mask subgraph reads ``value`` only through Shape: it can then enter the check
    as an input of that shape (e.g. the token embeddings TorchScript takes batch and seq from),
    without computing it from the weights."""
    users = needed_by.get(value, [])
    return bool(users) and all(user.op_type in _SHAPE_READERS for user in users)


def _input_dim_names(graph: GraphIndex, inputs: list[onnx.ValueInfoProto]) -> tuple[list, dict[str, str]]:
    """The mask model's inputs, each dim a number or a name feeds.py sizes (the declared name;
    for an unnamed one, its class by position: ``batch``, ``seq``, ...), and the map from the
    engine's dims to those names, so inputs the check adds for their shapes agree with them."""
    from otfuse.run.feeds import InputSpec, has_past_inputs, position_class

    specs = [InputSpec(vi.name, vi.type.tensor_type.elem_type, tuple(d.dim_value if d.HasField("dim_value") else
                                                                     (d.dim_param or None)
                                                                     for d in vi.type.tensor_type.shape.dim))
             for vi in inputs]
    has_past = has_past_inputs(specs)
    names: dict[str, str] = {}
    declared = []
    for vi, spec in zip(inputs, specs):
        shape = graph.shape(vi.name)
        if shape is None or len(shape) != len(spec.shape):
            declared.append(vi)
            continue
        dims = []
        for axis, (dim, stated) in enumerate(zip(shape, spec.shape)):
            if isinstance(dim, int):
                dims.append(dim)
                continue
            name = stated if isinstance(stated, str) and stated else position_class(spec, axis, has_past)
            names.setdefault(str(dim), name)
            dims.append(names[str(dim)])
        declared.append(onnx.helper.make_tensor_value_info(vi.name, spec.elem_type, dims))
    return declared, names


def subgraph_model(graph: GraphIndex, output: str) -> onnx.ModelProto:
    """The nodes computing ``output`` as a model of their own (only small constants allowed)."""
    needed, needed_by, stack = set(), {}, [output]
    shaped_inputs: set[str] = set()
    while stack:
        value = stack.pop()
        node = graph.producer.get(value)
        if node is None or id(node) in needed:
            continue
        needed.add(id(node))
        for name in node.input:
            if name:
                needed_by.setdefault(name, []).append(node)
                stack.append(name)
    graph_inputs = [vi for vi in graph.graph.input if vi.name in needed_by and vi.name not in graph.initializers]
    inputs, dim_names = _input_dim_names(graph, graph_inputs)
    # Values read only for their shape become inputs when their shape is stated in the inputs' dims.
    for value in list(needed_by):
        shape = graph.shape(value)
        node = graph.producer.get(value)
        if node is not None and _read_for_shape_only(graph, value, needed_by) and shape is not None and \
                all(isinstance(d, int) or str(d) in dim_names for d in shape) and graph.elem_type(value):
            shaped_inputs.add(value)
    needed, stack = set(), [output]
    while stack:  # again, stopping at the shape-only values
        value = stack.pop()
        node = graph.producer.get(value)
        if node is None or id(node) in needed or value in shaped_inputs:
            continue
        needed.add(id(node))
        stack.extend(name for name in node.input if name)
    order = [node for node in graph.graph.node if id(node) in needed]
    reads = {name for node in order for name in node.input if name}
    inputs = [vi for vi in inputs if vi.name in reads]
    inputs += [onnx.helper.make_tensor_value_info(
        name, graph.elem_type(name), [d if isinstance(d, int) else dim_names[str(d)] for d in graph.shape(name)])
        for name in sorted(shaped_inputs & reads)]
    initializers = []
    for name in sorted(reads & set(graph.initializers)):
        if (graph.constant_size(name) or 0) > 4096:
            raise Refuse("the mask is computed from large weights")
        initializers.append(onnx.numpy_helper.from_array(graph.constant_value(name), name))
    out = onnx.helper.make_tensor_value_info(output, graph.elem_type(output) or BOOL, None)
    model = onnx.helper.make_model(onnx.helper.make_graph(order, "mask", inputs, [out], initializers),
                                   opset_imports=[e for e in graph.model.opset_import if e.domain in ("", "ai.onnx")])
    model.ir_version = graph.model.ir_version
    return model


def _sequence_lengths(claim: MaskClaim, offsets: set[int]) -> list[int]:
    seqs = {1, 5, 12}
    for offset in offsets | {claim.window}:
        if offset + 3 > 12 and offset <= _LARGEST_PROBED_OFFSET:
            seqs |= {offset + 3, 2 * offset + 1} if offset <= 1024 else {offset + 3}
    return sorted(seqs)


def static_sizes(model: onnx.ModelProto) -> tuple[int, int] | None:
    """(batch, seq) when every input of the subgraph ``model`` has fixed dims (a static export can
    run at its own size only), read from its [B, S] inputs; None when some dim is symbolic."""
    shapes = [[d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim]
              for vi in model.graph.input]
    if any(None in shape for shape in shapes):
        return None
    pairs = {tuple(shape) for shape in shapes if len(shape) == 2}
    if len(pairs) != 1:
        raise Refuse(f"a static subgraph whose [B, S] size cannot be told from its inputs {shapes}")
    return next(iter(pairs))


def _fixed_length(model: onnx.ModelProto) -> tuple[int, int] | None:
    """(Sq, Skv) of the mask when no input dim of its subgraph varies with the sequence (only the
    batch is free: a static-length export sized by [B, N, S, D] values), read from one run; None
    when the inputs follow the sequence length."""
    from otfuse.run.feeds import make_feeds

    shapes = [{name: value.shape for name, value in make_feeds(model, {"batch": 2, "seq": seq, "past": 0}).items()}
              for seq in (5, 12)]
    if shapes[0] != shapes[1]:
        return None
    session, _ = probe_session(model, "mask")
    try:
        (got,) = session.run(None, make_feeds(model, {"batch": 2, "seq": 5, "past": 0}))
    except Exception:  # noqa: BLE001 - the configurations' own runs then say why
        return None
    return (int(got.shape[-2]), int(got.shape[-1])) if got.ndim >= 2 else None


def _configurations(claim: MaskClaim, has_past: bool, offsets: set[int], static: tuple[int, int] | None):
    if static is not None:  # the sequences past the offsets cannot be run: the export fixed its size
        yield static[0], static[1], 0
        return
    pasts = [0, 3] if has_past else [0]
    for seq in _sequence_lengths(claim, offsets):
        for past in pasts:
            yield 2, seq, past


def _padding_patterns(batch: int, total: int, rng) -> list[np.ndarray]:
    ones = np.ones((batch, total), dtype=np.int64)
    left = ones.copy()
    left[0, : total // 2] = 0
    # Any non-zero value attends (docs/ops.md): a graph testing mask == 1 must not pass for padding.
    random = rng.choice(np.array([0, 1, 3], dtype=np.int64), size=(batch, total), p=[0.3, 0.5, 0.2])
    return [ones, left, random]


def _visible_where_zero(got: np.ndarray, fill: float) -> np.ndarray | None:
    """Keys an additive mask leaves visible (0), or None if it adds anything but 0 and ``fill``."""
    visible = got == 0
    masked = got == np.asarray(fill, dtype=got.dtype)
    return visible if np.all(visible | masked) else None


def probe_session(model: onnx.ModelProto, what: str):
    """(an ORT session of the subgraph ``model``, whether it has past inputs); refuses if it does
    not run on its own. Graph optimisations off: what runs is what the model computes."""
    import onnxruntime as ort

    names = {vi.name for vi in model.graph.input}
    has_past = any("past" in name or "cache" in name or "key_values" in name for name in names)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - any failure means: no claim
        raise Refuse(f"the {what} subgraph does not run on its own ({type(exc).__name__})") from None
    return session, has_past


def _verify_by_running(graph: GraphIndex, output: str, claim: MaskClaim, visible_of, offsets: set[int]) -> None:
    from otfuse.run.feeds import make_feeds

    model = subgraph_model(graph, output)
    session, has_past = probe_session(model, "mask")
    if _sized_by_output(model):
        return _verify_at_own_size(model, session, claim, visible_of)
    rng = np.random.default_rng(0)
    fixed_length = _fixed_length(model)
    for batch, seq, past in _configurations(claim, has_past, offsets, static_sizes(model)):
        feeds = make_feeds(model, {"batch": batch, "seq": seq, "past": past})
        if fixed_length is not None:  # the export fixed the length, the batch stays free
            seq, past = fixed_length[0], fixed_length[1] - fixed_length[0]
        total = past + seq
        for padding in _padding_patterns(batch, total, rng):
            if claim.key_padding:
                feeds[claim.key_padding] = padding.astype(feeds[claim.key_padding].dtype)
            try:
                (got,) = session.run(None, feeds)
            except Exception as exc:  # noqa: BLE001
                raise Refuse(f"the mask subgraph failed at seq {seq}, past {past} ({type(exc).__name__})") from None
            expected = _expected(claim, batch, seq, past, padding)
            if 2 <= got.ndim < 4:  # added to the [B, N, Sq, Skv] scores right-aligned (SDPA's 2-D attn_mask)
                got = got.reshape((1,) * (4 - got.ndim) + got.shape)
            visible = visible_of(got) if got.ndim == 4 and got.shape[-2:] == (seq, total) else None
            if visible is None or not _broadcasts_to_equal(visible, expected):
                raise Refuse(f"running the mask (seq {seq}, past {past}) contradicts "
                               f"causal={claim.causal}, window={claim.window}, padding={claim.key_padding}")


def _sized_by_output(model: onnx.ModelProto) -> bool:
    """A static mask subgraph with no [B, S] input to size it (ONNX Attention's body at static
    shapes reads only Q / K / past shapes, or nothing): it runs at its one size, read off its output."""
    shapes = [[d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim]
              for vi in model.graph.input]
    return not any(None in shape for shape in shapes) and not any(len(shape) == 2 for shape in shapes)


def _verify_at_own_size(model: onnx.ModelProto, session, claim: MaskClaim, visible_of) -> None:
    """No padding input here (it would be [B, S]): the output's last two dims are Sq and Skv."""
    from otfuse.run.feeds import make_feeds

    try:
        (got,) = session.run(None, make_feeds(model, {}))
    except Exception as exc:  # noqa: BLE001
        raise Refuse(f"the mask subgraph failed at its own size ({type(exc).__name__})") from None
    seq, total = got.shape[-2:] if got.ndim >= 2 else (0, 0)
    visible = visible_of(got) if got.ndim >= 2 and 0 < seq <= total and not claim.key_padding else None
    batch = got.shape[0] if got.ndim == 4 else 1
    expected = _expected(claim, batch, seq, total - seq, np.ones((batch, total), np.int64)) if visible is not None \
        else None
    if visible is None or not _broadcasts_to_equal(visible, expected):
        raise Refuse(f"running the mask at its own size {list(got.shape)} contradicts causal={claim.causal}, "
                     f"window={claim.window} (bottom-right aligned)")


def _broadcasts_to_equal(visible: np.ndarray, expected: np.ndarray) -> bool:
    try:
        return bool(np.array_equal(np.broadcast_to(visible, expected.shape), expected))
    except ValueError:  # a shape that does not broadcast to [B, 1, Sq, Skv]
        return False


def _expected(claim: MaskClaim, batch: int, seq: int, past: int, padding: np.ndarray) -> np.ndarray:
    t = past + np.arange(seq)[:, None]  # query positions, bottom-right aligned
    j = np.arange(past + seq)[None, :]
    visible = np.ones((seq, past + seq), dtype=bool)
    if claim.causal:
        visible &= j <= t
    if claim.window:
        visible &= j > t - claim.window
    visible = np.broadcast_to(visible, (batch, 1, seq, past + seq)).copy()
    if claim.key_padding:
        visible &= padding[:, None, None, :] != 0
    return visible
