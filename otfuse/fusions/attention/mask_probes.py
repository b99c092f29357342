"""Running a mask's (or a bias's) own subgraph in ONNX Runtime: the half of masks.py and
alibi.py that checks a claim, so what the graph computes is what the claim says.

``subgraph_model`` cuts the nodes computing a value out as a model of its own, whose inputs are
the graph inputs it reads and the values it reads only for their shape (given as inputs of that
shape, so no weights are needed: a present key ``Concat(past, k)`` enters as ``past + seq`` long,
its dims sums of the inputs' dims); ``verify_by_running`` runs it at several batch / sequence /
cache sizes and paddings and compares what it masks with ``causal and window and padding``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from otfuse.rewriter.graph import GraphIndex
from otfuse.rewriter.pattern import attr
from otfuse.rewriter.refuse import Refuse

BOOL = onnx.TensorProto.BOOL
# Offsets (and windows) up to this size are probed by running at a longer sequence. A larger one
# cannot be (the [B, 1, S, S] mask would not fit in memory), so no claim is made with it in the
# condition, except sentinels from INT32_MAX up ("no limit": Slice ends, clamps).
LARGEST_PROBED_OFFSET = 8192
SENTINEL = 2**31 - 1
SHAPE_READERS = {"Shape", "Size"}
# A "minimum" at least this negative masks a key for good in float32 and float16 alike.
MASKED_BELOW = -1e4


@dataclass(frozen=True)
class MaskClaim:
    causal: bool
    window: int  # 0 = none
    key_padding: str | None  # the graph input holding the [B, Skv] padding mask
    empty_rows: str  # "uniform" for a finite minimum (HF), "zero" for -inf
    # (Sq, Skv) when the mask could run at that one size only (a static export): the claim holds
    # there, so the attention's query / key lengths must be those numbers (require_lengths).
    lengths: tuple[int, int] | None = None
    # The finite (or -inf) value the mask adds to a hidden key, in the mask's type, when known
    # (attention sinks need it to absorb the scores: chain_checks.mask_inputs).
    fill: float | None = None


def require_lengths(claim: MaskClaim, scores: tuple) -> None:
    """Refuse a claim proven at one fixed size for scores whose query / key lengths are not
    provably that size: the op would apply it at lengths no run checked."""
    if claim.lengths is None:
        return
    if len(scores) < 2 or tuple(scores[-2:]) != claim.lengths or \
            not all(isinstance(d, int) for d in scores[-2:]):
        raise Refuse(f"the mask was proven at its one size {claim.lengths[0]} x {claim.lengths[1]} (Sq x Skv), "
                     f"and the scores' query / key lengths are {' x '.join(str(d) for d in scores[-2:])}")


def computing_nodes(graph: GraphIndex, value: str):
    """The nodes that compute ``value`` from its values, each once: upstream through every
    non-constant operand, not past a shape read (what a Shape gives is probed by the sequences)."""
    seen, stack = set(), [value]
    while stack:
        name = stack.pop()
        node = graph.producer.get(name)
        if name in seen or node is None or node.op_type in SHAPE_READERS:
            continue
        seen.add(name)
        yield node
        stack.extend(i for i in node.input if i and not graph.is_constant(i))


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
        if node is not None and node.op_type not in SHAPE_READERS:
            stack.extend(i for i in node.input if i)
    memo[key] = frozenset(found)
    return memo[key]


def _walk(graph: GraphIndex, output: str, inputs: set[str]) -> tuple[set[int], dict[str, list]]:
    """The nodes ``output`` depends on, stopping at ``inputs``, and the readers of each value."""
    needed, needed_by, stack = set(), {}, [output]
    while stack:
        value = stack.pop()
        node = graph.producer.get(value)
        if node is None or id(node) in needed or value in inputs:
            continue
        needed.add(id(node))
        for name in node.input:
            if name:
                needed_by.setdefault(name, []).append(node)
                stack.append(name)
    return needed, needed_by


def _shaped_input_dims(graph: GraphIndex, value: str, needed_by: dict, dim_names: dict[str, str]) -> list | None:
    """The dims ``value`` enters the check with when it is read only for its shape and each dim
    read is stated in the inputs' dims (a dim no Shape read reaches is 1: optimum's BLOOM reads
    only Skv of Kᵀ [B*N, D, Skv]); None when it must be computed."""
    shape = graph.shape(value)
    if graph.producer.get(value) is None or not _read_for_shape_only(graph, value, needed_by) or shape is None or \
            not graph.elem_type(value):
        return None
    read = axes_read(graph, value)
    stated = [d if isinstance(d, int) else _stated_dim(d, dim_names) for d in shape]
    if any(stated[axis] is None for axis in read):
        return None
    return [1 if d is None else d for d in stated]


def _stated_dim(dim, dim_names: dict[str, str]) -> str | None:
    """``dim`` in the names the inputs' dims are fed by: one of them, or a sum of them with integer
    coefficients (a present key's ``past + seq``, what the Concat with the cache gives), written as
    feeds.py evaluates it; None when it has another symbol (a fresh unknown) or form. The run
    then feeds that shape at each probe size, and a wrong length shows as a mask of another shape."""
    if str(dim) in dim_names:
        return dim_names[str(dim)]
    expr = getattr(dim, "expr", None)
    if expr is None:
        return None
    terms = []
    for mono, coefficient in expr.terms:
        if not mono:
            terms.append(str(coefficient))
            continue
        if len(mono) != 1 or mono[0][1] != 1:
            return None
        name = dim_names.get(str(getattr(mono[0][0], "name", None)))
        if name is None or not name.isidentifier():
            return None
        terms.append(name if coefficient == 1 else f"{coefficient}*{name}")
    return " + ".join(terms).replace("+ -", "- ") if terms else None


def _read_for_shape_only(graph: GraphIndex, value: str, needed_by: dict) -> bool:
    """Whether the mask subgraph reads ``value`` only through Shape: it can then enter the check
    as an input of that shape (e.g. the token embeddings TorchScript takes batch and seq from),
    without computing it from the weights."""
    users = needed_by.get(value, [])
    return bool(users) and all(user.op_type in SHAPE_READERS for user in users)


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


def axes_read(graph: GraphIndex, value: str) -> set[int]:
    """The axes of ``value`` whose sizes its Shape / Size readers pass on: all of them but where a
    Shape's output goes only to Gathers of constant indices (or the Shape reads a range)."""
    rank = graph.rank(value) or 0
    read: set[int] = set()
    for user in graph.uses(value):
        if user.op_type not in SHAPE_READERS:  # a reader of its values is no part of a shape-only probe
            continue
        axes = list(range(rank))
        if user.op_type == "Shape":
            axes = axes[slice(attr(user, "start", 0), attr(user, "end", None))]
        picked = [_gathered(graph, gather, user.output[0]) for gather in graph.uses(user.output[0])]
        if user.op_type != "Shape" or graph.is_graph_output(user.output[0]) or not picked or None in picked:
            read |= set(axes)
            continue
        for indices in picked:
            if not all(-len(axes) <= i < len(axes) for i in indices):
                return set(range(rank))
            read |= {axes[i] for i in indices}
    return read


def _gathered(graph: GraphIndex, node: onnx.NodeProto, data: str) -> list[int] | None:
    """The constant indices ``Gather(data, indices, axis=0)`` reads, else None."""
    if node.op_type != "Gather" or node.domain not in ("", "ai.onnx") or node.input[0] != data or \
            attr(node, "axis", 0) != 0 or not graph.is_constant(node.input[1]):
        return None
    return [int(i) for i in np.asarray(graph.constant_value(node.input[1])).reshape(-1)]


def static_dims_read(graph: GraphIndex, output: str) -> set[int]:
    """The fixed sizes the subgraph computing ``output`` reads off shapes (a head size read where
    the key count should be): numbers like its constants, which probing must run past."""
    found, seen, stack = set(), set(), [output]
    while stack:
        name = stack.pop()
        node = graph.producer.get(name)
        if name in seen or node is None:
            continue
        seen.add(name)
        if node.op_type in SHAPE_READERS:
            shape, read = graph.shape(node.input[0]) or (), axes_read(graph, node.input[0])
            found |= {d for axis, d in enumerate(shape) if isinstance(d, int) and axis in read}
            continue
        stack.extend(i for i in node.input if i)
    return found


def subgraph_model(graph: GraphIndex, output: str) -> onnx.ModelProto:
    """The nodes computing ``output`` as a model of their own (only small constants allowed)."""
    needed, needed_by = _walk(graph, output, set())
    graph_inputs = [vi for vi in graph.graph.input if vi.name in needed_by and vi.name not in graph.initializers]
    inputs, dim_names = _input_dim_names(graph, graph_inputs)
    declared_dims: dict[str, list] = {}
    while True:  # each value made an input cuts the walk, which may leave others read only for their shape
        more = {value: dims for value in needed_by if value not in declared_dims
                and (dims := _shaped_input_dims(graph, value, needed_by, dim_names)) is not None}
        if not more:
            break
        declared_dims.update(more)
        needed, needed_by = _walk(graph, output, set(declared_dims))
    order = [node for node in graph.graph.node if id(node) in needed]
    reads = {name for node in order for name in node.input if name}
    inputs = [vi for vi in inputs if vi.name in reads]
    inputs += [onnx.helper.make_tensor_value_info(name, graph.elem_type(name), declared_dims[name])
               for name in sorted(set(declared_dims) & reads)]
    initializers = []
    for name in sorted((reads | {output}) & set(graph.initializers)):  # the output itself: a constant mask
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
        if offset + 3 > 12 and offset <= LARGEST_PROBED_OFFSET:
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


def _configurations(claim: MaskClaim, has_past: bool, offsets: set[int], static: tuple[int, int] | None,
                    batches: tuple[int, ...]):
    if static is not None:  # the sequences past the offsets cannot be run: the export fixed its size
        yield static[0], static[1], 0
        return
    pasts = [0, 3] if has_past else [0]
    for seq in _sequence_lengths(claim, offsets):
        for past in pasts:
            for batch in batches:
                yield batch, seq, past


def _padding_patterns(batch: int, total: int, rng, binary: bool = False,
                      floating: bool = False) -> list[np.ndarray]:
    ones = np.ones((batch, total), dtype=np.int64)
    left = ones.copy()
    left[0, : total // 2] = 0
    # Any non-zero value attends (docs/ops.md): a graph testing mask == 1 must not pass for padding.
    # ``binary`` (0 / 1 only) serves only to say why a claim failed, never to make one.
    values = np.array([0, 1, 1] if binary else [0, 1, 3], dtype=np.int64)
    random = rng.choice(values, size=(batch, total), p=[0.3, 0.5, 0.2])
    if not floating or binary:
        return [ones, left, random]
    # A float padding input reaches the op as Cast(m, bool) (chain_checks.padding_input): non-zero,
    # NaN too, attends and -0.0 masks; a graph testing m > 0.5 or m >= 0 must not pass.
    odd = rng.choice(np.array([0.0, -0.0, 1.0, 0.5, -2.0, 0.25, np.nan]), size=(batch, total))
    odd[:, -1] = 1.0  # every row keeps a key: an all-masked row is checked by the patterns above
    return [ones, left, random, odd]


FLOAT_PADDING = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16,
                 onnx.TensorProto.DOUBLE)


def probe_session(model: onnx.ModelProto, what: str):
    """(an ORT session of the subgraph ``model``, whether it has past inputs); refuses if it does
    not run on its own. Graph optimisations off: what runs is what the model computes."""
    import onnxruntime as ort

    names = {vi.name for vi in model.graph.input}
    has_past = any("past" in name or "cache" in name or "key_values" in name for name in names) or \
        _sized_by(model, "past")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - any failure means: no claim
        raise Refuse(f"the {what} subgraph does not run on its own ({type(exc).__name__})") from None
    return session, has_past


def _sized_by(model: onnx.ModelProto, dim: str) -> bool:
    """Whether ``dim`` (``past``, ``batch``) changes the subgraph's inputs: optimum's mask is sized
    by an attention_mask of ``past + seq`` keys and has no past input of its own, yet a cache
    changes what it computes; an export with a fixed batch cannot run at another."""
    from otfuse.run.feeds import make_feeds

    shapes = [{name: value.shape for name, value in make_feeds(model, {"batch": 1, "seq": 2, "past": 0,
                                                                         dim: size}).items()} for size in (1, 3)]
    return shapes[0] != shapes[1]


def verify_by_running(graph: GraphIndex, output: str, claim: MaskClaim, visible_of, offsets: set[int],
                      batches: tuple[int, ...] = (2,), binary_padding: bool = False) -> tuple[int, int] | None:
    """Refuse unless running the subgraph computing ``output`` gives, by ``visible_of`` (the keys
    it leaves visible, or None for a value that is no mask), what ``claim`` says, at sequences
    past every one of ``offsets``, with and without a cache when it has one, at each of ``batches``.
    Returns (Sq, Skv) when the subgraph runs at that one length only (the claim's ``lengths``)."""
    from otfuse.run.feeds import make_feeds

    model = subgraph_model(graph, output)
    session, has_past = probe_session(model, "mask")
    if _sized_by_output(model):
        return _verify_at_own_size(model, session, claim, visible_of)
    rng = np.random.default_rng(0)
    fixed_length = _fixed_length(model)
    static = static_sizes(model)
    batches = batches if _sized_by(model, "batch") else (2,)
    lengths = None
    for batch, seq, past in _configurations(claim, has_past, offsets, static, batches):
        feeds = make_feeds(model, {"batch": batch, "seq": seq, "past": past, **_encoder_dims(model, seq)})
        if fixed_length is not None:  # the export fixed the length, the batch stays free
            seq, past = fixed_length[0], fixed_length[1] - fixed_length[0]
        total = _key_length(claim, feeds, seq, past)
        floating = bool(claim.key_padding) and graph.elem_type(claim.key_padding) in FLOAT_PADDING
        for padding in _padding_patterns(batch, total, rng, binary_padding, floating):
            if claim.key_padding:
                feeds[claim.key_padding] = padding.astype(feeds[claim.key_padding].dtype)
            try:
                (got,) = session.run(None, feeds)
            except Exception as exc:  # noqa: BLE001
                raise Refuse(f"the mask subgraph failed at seq {seq}, past {past} ({type(exc).__name__})") from None
            expected = _expected(claim, batch, seq, total - seq, padding)
            if 2 <= got.ndim < 4:  # added to the [B, N, Sq, Skv] scores right-aligned (SDPA's 2-D attn_mask)
                got = got.reshape((1,) * (4 - got.ndim) + got.shape)
            # one row broadcast over the queries ([B, 1, 1, Skv]: a padding mask) must hold for each
            visible = visible_of(got) if got.ndim == 4 and got.shape[-2] in (seq, 1) and got.shape[-1] == total \
                else None
            if visible is None or not _broadcasts_to_equal(visible, expected):
                raise Refuse(f"running the mask (seq {seq}, past {past}) contradicts "
                               f"causal={claim.causal}, window={claim.window}, padding={claim.key_padding}")
        lengths = (seq, total)
    return lengths if static is not None or fixed_length is not None else None


def _key_length(claim: MaskClaim, feeds: dict, seq: int, past: int) -> int:
    """The key count the run checks: ``past + seq`` (a causal mask aligns to it), or with padding
    alone the padding mask's own length, as the other inputs were sized (a cross-attention's
    encoder keys: neither the query count nor the cache's)."""
    if claim.causal or claim.window or not claim.key_padding or claim.key_padding not in feeds:
        return past + seq
    padding = feeds[claim.key_padding]
    return int(padding.shape[-1]) if padding.ndim == 2 else past + seq


def _encoder_dims(model: onnx.ModelProto, seq: int) -> dict[str, int]:
    """The encoder's sequence dims of the subgraph's inputs (a decoder's ``encoder_sequence_length``)
    sized apart from the decoder's: a mask that reads the decoder's length where the encoder's
    belongs (or the reverse) then has the wrong shape."""
    names = {d.dim_param for vi in model.graph.input for d in vi.type.tensor_type.shape.dim
             if d.dim_param and "encoder" in d.dim_param.lower() and d.dim_param.isidentifier()}
    return {name: seq + 2 for name in names}


def _sized_by_output(model: onnx.ModelProto) -> bool:
    """A static mask subgraph with no [B, S] input to size it (ONNX Attention's body at static
    shapes reads only Q / K / past shapes, or nothing): it runs at its one size, read off its output."""
    shapes = [[d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim]
              for vi in model.graph.input]
    return not any(None in shape for shape in shapes) and not any(len(shape) == 2 for shape in shapes)


def _verify_at_own_size(model: onnx.ModelProto, session, claim: MaskClaim, visible_of) -> tuple[int, int]:
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
    return int(seq), int(total)


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
