"""The part of an attention mask that does not depend on any input's values, read off entry by
entry: static-shape exports fold it into graph constants.

TorchScript at fixed sizes writes Mistral's mask as ``Where(And(tril, overlay, padding), 0,
-inf)`` with the causal ``LessOrEqual`` of two constant index rows and the sliding-window overlay
``kv_idx > q_idx - W`` already a constant bool ``[1, 1, S, S]``, beside the key padding it gathers
from ``attention_mask``; ONNX Attention's body folds ``is_causal`` and its window the same way; a
mask may also be a constant float ``[1, 1, S, S]`` of 0 / a minimum, added (``Add``, ``Min``) to
the padding mask or chosen by a ``Where``. Neither spelling says "causal", but the values do:

* every leaf of the mask's condition that reads the values of no input and has a fixed size (a
  constant, or computed from constants and fixed shapes: run here at its one size) is a part of
  the **constant part**: their conjunction, broadcast to the mask's last two dims;
* a float leaf (a constant bias) must hold 0 and one fill only, a fill that masks as masks.py's
  ``Where(c, 0, min)`` must (``MASKED_BELOW``), or it is refused with that reason;
* the constant part must be the same for every batch row and head, and, row by row, exactly the
  bottom-right band ``t - W < j <= t`` (``t = Skv - Sq + i``) of one ``W`` (0: no window):
  ``causal = 1`` (``window = W``). A row that breaks it is named in the refusal (a key after
  its position, a hole, a window of another width); all keys visible is no condition.

masks.py then checks the whole claim by running the mask (mask_probes.py) at its one size with
paddings, and the rule checks that size is the attention's query / key lengths.
"""

from __future__ import annotations

import numpy as np

from otfuse.fusions.attention.mask_probes import MASKED_BELOW, input_values_read, probe_session, subgraph_model
from otfuse.rewriter.graph import GraphIndex
from otfuse.rewriter.refuse import Refuse

# A constant part larger than this is not read (the run that checks it would not fit either).
_LARGEST_PART = 1 << 26


def static_value(graph: GraphIndex, value: str, memo: dict) -> np.ndarray | None:
    """``value`` when it reads the values of no input and has one fixed size: a constant, or what
    its subgraph computes from constants and fixed shapes; None otherwise (or if it fails to run)."""
    key = ("static", value)
    if key not in memo:
        memo[key] = _static_value(graph, value, memo)
    return memo[key]


def _static_value(graph: GraphIndex, value: str, memo: dict) -> np.ndarray | None:
    if graph.is_constant(value):
        return np.asarray(graph.constant_value(value))
    if graph.producer.get(value) is None or input_values_read(graph, value, memo):
        return None
    shape = graph.shape(value)
    if shape is None or not all(isinstance(d, int) for d in shape) or int(np.prod(shape)) > _LARGEST_PART:
        return None
    try:
        model = subgraph_model(graph, value)
    except Exception:  # noqa: BLE001 - a leaf that cannot be cut out is read by its structure instead
        return None
    dims = [[d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim]
            for vi in model.graph.input]
    if any(None in d for d in dims):  # read for a shape that varies: not one size
        return None
    from otfuse.run.feeds import make_feeds

    try:
        session, _ = probe_session(model, "constant mask part")
        (got,) = session.run(None, make_feeds(model, {}))
    except Exception:  # noqa: BLE001 - then the structure is read instead
        return None
    return np.asarray(got)


def looks_like_mask(values: np.ndarray) -> bool:
    """A bool tensor, or a float one of 0 and one negative number: what a mask holds, so a
    constant of that form left as a bias is a claim lost (a learned bias is not reported)."""
    if values.dtype == np.bool_:
        return True
    distinct = np.unique(values)
    return distinct.size == 2 and distinct[1] == 0 and distinct[0] < 0


def bias_fill(values: np.ndarray, what: str) -> float:
    """The one fill of a constant additive mask: its entries must be 0 and that fill only, and the
    fill must mask (``MASKED_BELOW`` or -inf); Refuse saying which rule it breaks."""
    distinct = np.unique(values)
    hidden = distinct[distinct != 0]
    if hidden.size == 0:
        raise Refuse(f"{what} is all zeros")
    if hidden.size > 1 or np.isnan(hidden).any():
        shown = ", ".join(f"{v:g}" for v in hidden[:4])
        raise Refuse(f"{what} holds {hidden.size} values besides 0 ({shown}{', ...' if hidden.size > 4 else ''}), "
                     f"not 0 and one fill")
    fill = float(hidden[0])
    if not fill <= MASKED_BELOW:
        raise Refuse(f"{what} fills {fill:g}, too weak to mask a key (not <= {MASKED_BELOW:g} or -inf)")
    if distinct.size == 1:
        raise Refuse(f"{what} masks every key")
    return fill


def constant_part(parts: list[tuple[np.ndarray, bool]], shape) -> np.ndarray:
    """The [Sq, Skv] visibility the constant leaves (value, negated) leave together: a key is
    visible where every leaf's value is non-zero (zero when negated: the leaf masks), broadcast to
    the mask's last two dims ``shape`` when they are known numbers."""
    visible = None
    for values, negated in parts:
        leaf = (np.asarray(values) != 0) != negated
        try:
            visible = leaf if visible is None else np.logical_and(visible, leaf)
        except ValueError:
            raise Refuse(f"the constant parts of the mask have shapes that do not broadcast "
                         f"({list(visible.shape)} and {list(leaf.shape)})") from None
    if visible.ndim < 2:
        visible = visible.reshape((1,) * (2 - visible.ndim) + visible.shape)
    lead = visible.reshape((-1,) + visible.shape[-2:])
    if not all(np.array_equal(lead[0], other) for other in lead[1:]):
        raise Refuse(f"the constant part of the mask {list(visible.shape)} differs between batch rows or heads")
    rows = lead[0]
    target = tuple(shape[-2:]) if shape is not None and len(shape) >= 2 else rows.shape
    target = tuple(t if isinstance(t, int) else r for t, r in zip(target, rows.shape))
    try:
        return np.broadcast_to(rows, target)
    except ValueError:
        raise Refuse(f"the constant part of the mask {list(rows.shape)} does not broadcast to its "
                     f"[Sq, Skv] {list(target)}") from None


def band_window(visible: np.ndarray) -> int:
    """W of a [Sq, Skv] visibility that is exactly the bottom-right causal band ``t - W < j <= t``
    (W = 0: causal, no window); Refuse naming the first row that breaks it. A band aligned to
    another row offset is named as such (ONNX's ``is_causal`` with a past: ``j <= i + P``)."""
    rows, keys = visible.shape
    try:
        return _band(visible, keys - rows)
    except Refuse as refusal:
        for offset in range(-rows, keys + 1):
            if offset != keys - rows and _band_or_none(visible, offset) is not None:
                raise Refuse(f"a causal mask aligned to the past length, not to the bottom right (query row i sees "
                             f"the keys up to {_plus(offset)}, not {_plus(keys - rows)}: ONNX is_causal with a "
                             f"query count other than the new keys')") from None
        raise refusal


def _plus(offset: int) -> str:
    return "i" if offset == 0 else f"i + {offset}" if offset > 0 else f"i - {-offset}"


def _band_or_none(visible: np.ndarray, offset: int) -> int | None:
    try:
        return _band(visible, offset)
    except Refuse:
        return None


def _band(visible: np.ndarray, offset: int) -> int:
    """W when row i sees exactly the keys ``t - W < j <= t``, t = offset + i."""
    what = "the constant part of the mask"
    windows: dict[int, int] = {}  # row -> the window its first visible key fixes
    full = None  # (row, t + 1) of the longest row that reaches key 0: a window must hold it
    for i, row in enumerate(visible):
        t = offset + i
        seen = np.flatnonzero(row)
        if seen.size and seen[-1] > t:
            raise Refuse(f"{what} is not causal: query row {i} (position {t}) sees key {seen[-1]}")
        if t < 0:
            continue  # a row before every key sees none (checked just above)
        if not seen.size or seen[-1] != t:
            raise Refuse(f"{what}: query row {i} does not see its own position {t}")
        if seen.size != t - seen[0] + 1:
            hole = next(j for j in range(seen[0], t + 1) if not row[j])
            raise Refuse(f"{what}: query row {i} sees keys {seen[0]}..{t} except key {hole}, not one band")
        if seen[0] > 0:
            windows[i] = t - seen[0] + 1
        elif full is None or t + 1 > full[1]:
            full = (i, t + 1)
    widths = sorted(set(windows.values()))
    if len(widths) > 1:
        a = next(i for i, w in windows.items() if w == widths[0])
        b = next(i for i, w in windows.items() if w == widths[1])
        raise Refuse(f"{what} has a window that differs per row: query row {a} sees its last {widths[0]} keys, "
                     f"row {b} its last {widths[1]}")
    if not widths:
        return 0
    if full is not None and full[1] > widths[0]:
        raise Refuse(f"{what} has a window that differs per row: query row {full[0]} sees all its {full[1]} keys, "
                     f"more than the window of {widths[0]} the other rows keep")
    return widths[0]
