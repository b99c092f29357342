"""The package's layout rules (docs/architecture.md), read from the source with ``ast``: imports run
down the layers only, a fusion family never imports another, and no function is over 120 lines."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "otfuse"
MAX_FUNCTION_LINES = 120

# cli -> __init__ -> pipeline -> {verify, fusions} -> {run, canonicalise} -> rewriter -> {errors, domain, ops}
LAYERS = {
    "otfuse.cli": 6,
    "otfuse": 5, "otfuse.ascend_ep": 5,  # the package face and its public alias of run.ascend
    "otfuse.pipeline": 4,
    "otfuse.verify": 3, "otfuse.fusions": 3,
    "otfuse.run": 2, "otfuse.canonicalise": 2,
    "otfuse.rewriter": 1,
    "otfuse.errors": 0, "otfuse.domain": 0, "otfuse.ops": 0,
}


def _modules() -> dict[str, Path]:
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = ("otfuse", *path.relative_to(PACKAGE).with_suffix("").parts)
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


MODULES = _modules()


def _area(module: str) -> str:
    """The entry of LAYERS a module belongs to (its longest prefix)."""
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in LAYERS:
            return ".".join(parts[:end])
    raise AssertionError(f"{module} is in no layer of LAYERS: add it there and to docs/architecture.md")


def _unit(module: str) -> str:
    """Modules of one unit may import each other: one subpackage, and each family on its own."""
    parts = module.split(".")
    if parts[:2] == ["otfuse", "fusions"] and len(parts) > 2:
        return ".".join(parts[:3])
    return _area(module)


def _imports(module: str, path: Path) -> list[tuple[int, str]]:
    """(line, imported otfuse module) for every import in the file, function bodies included;
    ``from otfuse.x import name`` counts as ``otfuse.x.name`` when that is a module."""
    found = []
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name.split(".")[0] == "otfuse"]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            if base.split(".")[0] != "otfuse":
                continue
            for alias in node.names:
                found.append((node.lineno, f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base))
    return found


def _allowed(importer: str, imported: str) -> bool:
    if imported == importer or imported.startswith(importer + "."):  # a package and its own modules
        return True
    if _unit(importer) == _unit(imported):
        return True
    return LAYERS[_area(imported)] < LAYERS[_area(importer)]


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_run_down_the_layers(module):
    wrong = [f"line {line}: {imported}" for line, imported in _imports(module, MODULES[module])
             if not _allowed(module, imported)]
    assert not wrong, f"{module} imports upward or across: {wrong}"


def test_a_family_imports_no_other_family():
    families = {m for m in MODULES if m.count(".") == 2 and m.startswith("otfuse.fusions.")}
    assert families == {"otfuse.fusions.norm", "otfuse.fusions.norm_linear", "otfuse.fusions.rope",
                        "otfuse.fusions.attention", "otfuse.fusions.activation"}
    for module, path in MODULES.items():
        if _unit(module) in families:
            others = [m for _, m in _imports(module, path) if _unit(m) in families and _unit(m) != _unit(module)]
            assert not others, f"{module} imports another family: {others}"


def test_the_layer_check_sees_a_wrong_import():
    """The check itself: the engine importing a family, a family another, run importing verify."""
    assert not _allowed("otfuse.rewriter.passes", "otfuse.fusions.norm.rules")
    assert not _allowed("otfuse.fusions.rope.rotations", "otfuse.fusions.attention.sdpa")
    assert not _allowed("otfuse.run.session", "otfuse.verify.diff")
    assert not _allowed("otfuse.verify.diff", "otfuse.fusions")
    assert _allowed("otfuse.fusions.attention.masks", "otfuse.run.feeds")
    assert _allowed("otfuse.fusions.rope", "otfuse.fusions.rope.rotations")


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_function_is_over_120_lines(module):
    tree = ast.parse(MODULES[module].read_text())
    long = [f"{node.name} ({node.end_lineno - node.lineno + 1} lines, line {node.lineno})"
            for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, f"{module}: {long}"
