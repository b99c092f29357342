"""docs/ops.md is the prose of the contract that otfuse/ops.py declares as data: each op's section
names the same inputs and outputs at the same positions (optional where ops.py says so), and the
same attributes with the same types and defaults. A change to one without the other fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from otfuse import ops

DOC = (Path(__file__).resolve().parents[1] / "docs" / "ops.md").read_text()

_POSITION_ROW = re.compile(r"^\| (input|output)s? (\d+)(?:[–-](\d+))? \| ([^|]*) \|(.*)$")
_ATTRIBUTE_ROW = re.compile(r"^\| `(\w+)` \| (int|float|string|ints) \| ([^|]*) \|")
_NORM_LINEAR = {"RMSNormLinear", "AddRMSNormLinear", "LayerNormLinear", "AddLayerNormLinear"}


def _section(title: str) -> str:
    """The text under ``### title`` (or ``## title``) up to the next heading of that level or above."""
    match = re.search(rf"^(#+) {re.escape(title)}\n(.*?)(?=^#{{1,3}} )", DOC + "\n## end\n", re.M | re.S)
    assert match, f"docs/ops.md has no section for {title}"
    return match.group(2)


def _op_section(op: ops.Op) -> str:
    return _section("Norm + Linear family") if op.name in _NORM_LINEAR else _section(op.name)


def _positions(text: str, kind: str) -> dict[int, tuple[str, str]]:
    """{position: (name, notes)} of the ``input N`` / ``inputs N–M`` rows of ``kind``."""
    found = {}
    for line in text.splitlines():
        row = _POSITION_ROW.match(line)
        if not row or row.group(1) != kind:
            continue
        names = re.findall(r"`([^`]+)`", row.group(4))
        first, last = int(row.group(2)), int(row.group(3) or row.group(2))
        assert len(names) == last - first + 1, line
        for offset, name in enumerate(names):
            found[first + offset] = (name, row.group(5))
    return found


def _attribute_rows(text: str) -> dict[str, tuple[str, str]]:
    return {row.group(1): (row.group(2), row.group(3).strip())
            for row in map(_ATTRIBUTE_ROW.match, text.splitlines()) if row}


def _documented_default(text: str):
    """A default cell of the docs as ops.py writes it (None: prose, compared by hand)."""
    text = text.strip("` ")
    if text == "required":
        return ops.REQUIRED
    if text == "[]":
        return ()
    if text.startswith('"'):
        return text.strip('"')
    if text == "all 0":
        return "zeros"
    try:
        return float(text) if any(c in text for c in ".e") else int(text)
    except ValueError:
        return text  # an attribute's name (SameAs)


def _declared_default(default):
    if isinstance(default, ops.SameAs):
        return default.attribute
    if isinstance(default, ops.ZerosLike):
        return "zeros"
    return tuple(default) if isinstance(default, (list, tuple)) else default


OPS = sorted(ops.OPS)


@pytest.mark.parametrize("name", OPS)
def test_positional_rows_name_the_declared_inputs_and_outputs(name):
    op = ops.get(name)
    text = _op_section(op)
    for kind, formals in (("input", op.inputs), ("output", op.outputs)):
        documented = _positions(text, kind)
        if op.name in _NORM_LINEAR or not documented:
            continue  # a shared table (norm + linear) or prose: checked by name below
        declared = {i: f for i, f in enumerate(formals)}
        assert {i: n for i, (n, _) in documented.items()} == {i: f.name for i, f in declared.items()}, name
        for i, (_, notes) in documented.items():
            if "as `Attention`" in notes or notes.strip(" |") == "":
                continue
            assert ("optional" in notes) == declared[i].optional, (name, kind, i, notes)


def _named_in_code(text: str) -> set[str]:
    """Every identifier inside a `code span` of ``text``."""
    return {word for span in re.findall(r"`([^`]+)`", text) for word in re.findall(r"[A-Za-z_]\w*", span)}


def _attributes_as(text: str) -> ops.Op | None:
    """The op whose attributes the section says it shares ("Attributes as `RMSNorm`")."""
    match = re.search(r"[Aa]ttributes(?:\s+and\s+computation)?\s+as\s+`(\w+)`|[Aa]ttributes:\s+those\s+of\s+`(\w+)`", text)
    return ops.get(match.group(1) or match.group(2)) if match else None


@pytest.mark.parametrize("name", OPS)
def test_every_declared_name_appears_in_the_ops_section(name):
    op = ops.get(name)
    text = _op_section(op)
    names = [f.name for f in op.inputs + op.outputs] + [a.name for a in op.attributes]
    if op.name in _NORM_LINEAR:
        names = [n for n in names if n not in ("W", "Y", "bias", "X", "A", "B", "scale")]  # as the norm op
    shared = _attributes_as(text)
    if shared:
        declared = {a.name: a.default for a in op.attributes}
        assert all(declared.get(a.name) == a.default for a in shared.attributes), (name, shared.name)
        names = [n for n in names if n not in {a.name for a in shared.attributes}]
    missing = [n for n in names if n not in _named_in_code(text)]
    assert not missing, f"docs/ops.md's {name} section never names {missing}"


@pytest.mark.parametrize("name", OPS)
def test_attribute_tables_match_the_declared_types_and_defaults(name):
    op = ops.get(name)
    documented = _attribute_rows(_op_section(op))
    if not documented:
        return  # attributes in prose (RopeAttention, RotaryEmbeddingQK): the name check above
    declared = {a.name: a for a in op.attributes}
    assert set(documented) == set(declared), name
    for attr, (kind, default) in documented.items():
        assert kind == declared[attr].type, (name, attr)
        if attr == "epsilon" and op.name in _NORM_LINEAR:
            continue  # "as the norm op": the norm op's own row is checked
        assert _documented_default(default) == _declared_default(declared[attr].default), (name, attr, default)


def test_every_documented_op_section_is_declared():
    family_ops = set(re.findall(r"^### (\w+)\s*$", DOC, re.M))
    headings_that_are_not_ops = {h for h in family_ops if not h[0].isupper() or h.startswith(("Ascend", "CPU", "Matched"))}
    assert family_ops - headings_that_are_not_ops - set(ops.OPS) == set()
