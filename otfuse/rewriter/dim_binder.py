"""Bind the dims of several values by name, as a rule states them: ``q="B N Sq D"``,
``k="B Nkv Skv D"``. Each value must have a known shape of that rank; a name used twice must be
one dim (proven equal by ``checks.dims_equal``: the same number, or symbolic dims the shapes
prove equal), else the binder refuses, naming the value and the two dims.

Spec tokens, separated by spaces: a name (bound, or checked against its binding), an integer (the
dim must be that number), ``_`` (any dim, not bound), and ``...`` first (any leading dims).
"""

from __future__ import annotations

from collections.abc import Mapping

from otfuse.rewriter import checks
from otfuse.rewriter.graph import GraphIndex
from otfuse.rewriter.pattern import Match
from otfuse.rewriter.refuse import Refuse


class Dims(Mapping):
    """The bound dims (``dims["N"]``), where each came from (``dims.source("N")``), and the shapes
    read (``dims.shape("q")``). ``bind`` adds more values against the same bindings."""

    def __init__(self, graph: GraphIndex, match: Match | None):
        self._graph, self._match = graph, match
        self._dims: dict[str, object] = {}
        self._sources: dict[str, str] = {}
        self._shapes: dict[str, tuple] = {}

    def __getitem__(self, name: str):
        return self._dims[name]

    def __iter__(self):
        return iter(self._dims)

    def __len__(self) -> int:
        return len(self._dims)

    def shape(self, label: str) -> tuple:
        return self._shapes[label]

    def source(self, name: str) -> str:
        return self._sources[name]

    def bind(self, **specs: str | tuple[str, str]) -> "Dims":
        for label, spec in specs.items():
            value, text = spec if isinstance(spec, tuple) else (self._value(label), spec)
            self._bind_one(label, value, text.split())
        return self

    def _value(self, label: str) -> str:
        match = self._match
        if match is not None and label in match.values:
            return match.values[label]
        if match is not None and label in match.nodes:
            return match.nodes[label].output[0]
        raise KeyError(f"dims: {label!r} is not a value of the match; pass (value, spec)")

    def _bind_one(self, label: str, value: str, tokens: list[str]) -> None:
        shape = self._graph.shape(value)
        leading = bool(tokens) and tokens[0] == "..."
        tokens = tokens[1:] if leading else tokens
        if shape is None or (len(shape) < len(tokens) if leading else len(shape) != len(tokens)):
            rank = f"rank >= {len(tokens)}" if leading else f"rank-{len(tokens)}"
            raise Refuse(f"{label} {value!r} must have a known {rank} shape, has {shape}")
        shape = tuple(shape)
        self._shapes[label] = shape
        offset = len(shape) - len(tokens)
        for index, token in enumerate(tokens):
            axis, dim = offset + index, shape[offset + index]
            if token == "_":
                continue
            if token.lstrip("-").isdigit():
                if not checks.dims_equal(dim, int(token)):
                    raise Refuse(f"{label} {value!r} has {_text(dim)} at dim {axis} of {list(shape)}, not {token}")
                continue
            if token not in self._dims:
                self._dims[token], self._sources[token] = dim, f"{label} {value!r}"
                continue
            bound = self._dims[token]
            if not checks.dims_equal(bound, dim):
                raise Refuse(f"{label} {value!r} has {token} = {_text(dim)} (dim {axis} of {list(shape)}), but "
                             f"{self._sources[token]} has {token} = {_text(bound)}: not proven equal")


def _text(dim) -> str:
    return "?" if dim is None else str(dim)


def bind_dims(graph: GraphIndex, match: Match | None, specs: Mapping[str, str | tuple[str, str]]) -> Dims:
    return Dims(graph, match).bind(**specs)
