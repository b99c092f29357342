"""Write the C++ view of the op contract (otfuse/ops.py) as one header: the kernels' schemas, their
input and output positions by contract name, and the attribute defaults come from the same
declarations the rewriter builds its nodes with, so neither side can drift from the other.

Run by CMake at build time: ``python generate.py <otfuse/ops.py> <out.h>``. ops.py imports
nothing of otfuse, so it is loaded by path (the package is not importable during a wheel build).
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path


def load_ops(path: Path):
    spec = importlib.util.spec_from_file_location("otfuse_ops_contract", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def constant(name: str) -> str:
    """`past_key` -> `kPastKey`, `Q_out` -> `kQOut`, `Y` -> `kY`."""
    return "k" + "".join(part[:1].upper() + part[1:] for part in re.split(r"_+", name) if part)


def types_literal(types: tuple[str, ...]) -> str:
    return '"' + "|".join(types) + '"'


def formal_rows(formals) -> list[str]:
    return [f'    {{"{f.name}", {types_literal(f.types)}, {str(f.optional).lower()}, {str(f.variadic).lower()}}},'
            for f in formals]


def positions(formals) -> list[str]:
    """Positions up to the first variadic formal (after it, positions depend on the node)."""
    rows = []
    for index, formal in enumerate(formals):
        if formal.variadic:
            rows.append(f"  inline constexpr int {constant(formal.name)} = {index};  // first of a variadic list")
            break
        rows.append(f"  inline constexpr int {constant(formal.name)} = {index};")
    return rows


def attribute_defaults(module, op) -> list[str]:
    rows = []
    for attribute in op.attributes:
        default = attribute.default
        if default is module.REQUIRED or isinstance(default, (module.SameAs, module.ZerosLike)):
            continue
        if attribute.type == "int":
            rows.append(f"  inline constexpr int64_t {constant(attribute.name)} = {default};")
        elif attribute.type == "float":
            rows.append(f"  inline constexpr float {constant(attribute.name)} = {float(default)!r}f;")
        elif attribute.type == "string":
            rows.append(f'  inline constexpr const char* {constant(attribute.name)} = "{default}";')
    return rows


def op_block(module, op) -> list[str]:
    lines = [f"// {op.name} ({op.family}): {op.doc}", f"namespace {op.name} {{",
             "inline constexpr Formal kInputs[] = {", *formal_rows(op.inputs), "};",
             "inline constexpr Formal kOutputs[] = {", *formal_rows(op.outputs), "};",
             "namespace in {", *positions(op.inputs), "}  // namespace in",
             "namespace out {", *positions(op.outputs), "}  // namespace out",
             "namespace defaults {", *attribute_defaults(module, op), "}  // namespace defaults",
             f"}}  // namespace {op.name}", ""]
    return lines


def header(module) -> str:
    ops = list(module.OPS.values())
    table = [f'    {{"{op.name}", {op.name}::kInputs, {len(op.inputs)}, {op.name}::kOutputs, {len(op.outputs)}}},'
             for op in ops]
    lines = ["// Generated from otfuse/ops.py by kernels/contract/generate.py at build time. Do not edit:",
             "// change otfuse/ops.py (and docs/ops.md, which tests/test_ops_contract.py checks against it).",
             "#pragma once", "", "#include <cstddef>", "#include <cstdint>", "", "namespace otfuse::contract {", "",
             "// One input or output: its contract name, its element types (\"T\", or type names joined by",
             "// '|'), and whether it may be left out or takes any number of values.",
             "struct Formal {", "  const char* name;", "  const char* types;", "  bool optional;",
             "  bool variadic;", "};", "",
             "struct OpContract {", "  const char* name;", "  const Formal* inputs;", "  size_t input_count;",
             "  const Formal* outputs;", "  size_t output_count;", "};", ""]
    for op in ops:
        lines += op_block(module, op)
    lines += ["inline constexpr OpContract kOps[] = {", *table, "};", "", "}  // namespace otfuse::contract", ""]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    ops_py, out = Path(argv[1]), Path(argv[2])
    text = header(load_ops(ops_py))
    out.parent.mkdir(parents=True, exist_ok=True)
    if not out.exists() or out.read_text() != text:  # unchanged: no rebuild of every kernel
        out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
