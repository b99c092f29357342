"""The package's layout rules (docs/architecture.md), read from the source with ``ast``: imports run
down the layers only, a fusion family never imports another, and no function is over 120 lines."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "otfuse"
MAX_FUNCTION_LINES = 120

# cli -> __init__ -> pipeline -> control_flow -> {verify, fusions, targets} -> {run, canonicalise} -> rewriter
#   -> {errors, domain, ops}
LAYERS = {
    "otfuse.cli": 6,
    "otfuse": 5, "otfuse.ascend_ep": 5,  # the package face and its public alias of run.ascend
    "otfuse.pipeline": 4,
    "otfuse.control_flow": 3.5,  # the pipeline's steps repeated in every body: targets and rewriter below it
    "otfuse.verify": 3, "otfuse.fusions": 3, "otfuse.targets": 3,
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


# --- C++ (kernels/): the same 120-line limit, measured by a brace matcher -------------------------

KERNELS = PACKAGE.parent / "kernels"
CXX_SUFFIXES = (".cc", ".h", ".inc")
CXX_FILES = sorted(p for p in KERNELS.rglob("*") if p.suffix in CXX_SUFFIXES)
# A '{' after `keyword (...)` opens a statement's block, not a function body.
_CONTROL = {"if", "for", "while", "switch", "catch", "constexpr"}  # constexpr: `if constexpr (...)`
# What may stand between a function's ')' and its '{': cv/ref qualifiers, virt-specifiers, noexcept.
_QUALIFIERS = {"const", "volatile", "noexcept", "override", "final", "mutable", "&", "&&", "throw"}
# What a trailing return type (`-> T`) is made of.
_TYPE_TOKENS = {"::", "<", ">", "*", "&", "&&", ",", "const", "volatile"}
_TOKEN = re.compile(r"[A-Za-z_]\w*|\d[\w.']*|->|::|&&|\S")


def _is_identifier(token: str) -> bool:
    return token[0].isalpha() or token[0] == "_"


def _skip_line(text: str, i: int, out: list[str]) -> int:
    """Past the end of a // comment or a preprocessor line at i (backslash-newline continues it);
    only its newlines are kept."""
    while i < len(text) and text[i] != "\n":
        if text[i] == "\\" and text.startswith("\n", i + 1):
            out.append("\n")
            i += 1
        i += 1
    return i


def _skip_quoted(text: str, i: int, quote: str) -> int:
    """Past the string or character literal opening at i (an unterminated one ends at the line)."""
    i += 1
    while i < len(text) and text[i] != quote and text[i] != "\n":
        i += 2 if text[i] == "\\" else 1
    return i + 1 if i < len(text) and text[i] == quote else i


def _raw_string_end(text: str, i: int) -> int:
    """i is at the `"` of R"delim( ... )delim": the index past its end."""
    open_paren = text.find("(", i)
    delimiter = text[i + 1:open_paren]
    end = text.find(")" + delimiter + '"', open_paren)
    return len(text) if end < 0 else end + len(delimiter) + 2


def _opens_raw_string(text: str, i: int) -> bool:
    """Whether the '"' at i follows a raw string's prefix R, u8R, uR, UR or LR that starts a token."""
    prefix = re.search(r"(?:u8|u|U|L)?R$", text[max(0, i - 3):i])
    if prefix is None:
        return False
    start = i - len(prefix.group(0))
    return start == 0 or not (text[start - 1].isalnum() or text[start - 1] == "_")


def strip_cxx(text: str) -> str:
    """The code of a C++ file without comments, preprocessor lines and the contents of string,
    character and raw string literals (each becomes an empty literal); newlines are kept, so a
    character's line does not change."""
    out: list[str] = []
    i, line_start = 0, True
    while i < len(text):
        c = text[i]
        if c == "\n":
            out.append(c)
            i, line_start = i + 1, True
            continue
        if text.startswith("//", i) or (c == "#" and line_start):
            i = _skip_line(text, i, out)
            continue
        if text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = len(text) if end < 0 else end + 2
            out.append("\n" * text.count("\n", i, end) or " ")
            i = end
            continue
        line_start = line_start and c.isspace()
        if c == '"' and _opens_raw_string(text, i):
            end = _raw_string_end(text, i)
            out.append('"' + "\n" * text.count("\n", i, end) + '"')
            i = end
        elif c == '"':
            out.append('""')
            i = _skip_quoted(text, i, '"')
        elif c == "'" and re.search(r"(?<![\w.])\d[\w.']*$", text[max(0, i - 40):i]):
            i += 1  # a digit separator: 1'000'000
        elif c == "'":
            out.append("''")
            i = _skip_quoted(text, i, "'")
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _tokens(code: str) -> list[tuple[str, int]]:
    """(token, line) of stripped code."""
    tokens, line, last = [], 1, 0
    for match in _TOKEN.finditer(code):
        line += code.count("\n", last, match.start())
        last = match.start()
        tokens.append((match.group(0), line))
    return tokens


def _matching(tokens: list[tuple[str, int]]) -> dict[int, int]:
    """Index of the opening bracket of every closing ) ] } (unbalanced ones are left out)."""
    pairs, stacks = {}, {")": [], "]": [], "}": []}
    opening = {"(": ")", "[": "]", "{": "}"}
    for k, (token, _) in enumerate(tokens):
        if token in opening:
            stacks[opening[token]].append(k)
        elif token in stacks and stacks[token]:
            pairs[k] = stacks[token].pop()
    return pairs


def _skip_back(tokens, pairs, k: int) -> int:
    """From k (just before a '{'), back over qualifiers and a trailing return type: the index of
    the token that must be a function's ')' or a lambda's ']'."""
    def qualifiers(k: int) -> int:
        while k >= 0:
            if tokens[k][0] in _QUALIFIERS:
                k -= 1
            elif tokens[k][0] == ")" and k in pairs and pairs[k] > 0 and tokens[pairs[k] - 1][0] in ("noexcept", "throw"):
                k = pairs[k] - 2  # noexcept(...)
            else:
                return k
        return k

    k = qualifiers(k)
    j = k  # a trailing return type: -> T, T made of names, ::, <>, *, &, decltype(...)
    while j >= 0 and tokens[j][0] != "->":
        token = tokens[j][0]
        if token == ")" and j in pairs and pairs[j] > 0 and tokens[pairs[j] - 1][0] == "decltype":
            j = pairs[j] - 2
        elif token in _TYPE_TOKENS or _is_identifier(token) or token[0].isdigit():
            j -= 1
        else:
            return k
    return qualifiers(j - 1) if j >= 0 else k


def _opens_function(tokens, pairs, k: int) -> bool:
    """Whether the '{' at token k opens a function or lambda body (not a namespace, class, enum,
    initializer list or statement block)."""
    j = _skip_back(tokens, pairs, k - 1)
    if j < 0:
        return False
    token = tokens[j][0]
    if token == "]":  # [captures] { ... }
        return True
    if token == "}" and j in pairs:  # a constructor whose member-initializer list ends in m_{...}
        opening = pairs[j]
        return opening >= 2 and _is_identifier(tokens[opening - 1][0]) and tokens[opening - 2][0] in (",", ":")
    if token != ")" or j not in pairs:
        return False
    before = tokens[pairs[j] - 1][0] if pairs[j] > 0 else ""
    return before not in _CONTROL


def cxx_functions(text: str) -> list[tuple[int, int]]:
    """(line of the opening brace, lines from it to the closing brace) of every outermost function
    body in C++ source: free and member functions, lambdas outside functions; a lambda or local
    class inside a function counts as part of it."""
    tokens = _tokens(strip_cxx(text))
    pairs = _matching(tokens)
    closer_of = {opening: closing for closing, opening in pairs.items()}
    found, k = [], 0
    while k < len(tokens):
        if tokens[k][0] == "{" and k in closer_of and _opens_function(tokens, pairs, k):
            end = closer_of[k]
            found.append((tokens[k][1], tokens[end][1] - tokens[k][1] + 1))
            k = end  # what is inside belongs to this function
        k += 1
    return found


@pytest.mark.parametrize("path", CXX_FILES, ids=[str(p.relative_to(KERNELS)) for p in CXX_FILES])
def test_no_cxx_function_is_over_120_lines(path):
    long = [f"{path.relative_to(KERNELS.parent)}:{line} ({length} lines)"
            for line, length in cxx_functions(path.read_text()) if length > MAX_FUNCTION_LINES]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_the_cxx_check_sees_the_kernels_functions():
    """The matcher cannot silently count nothing: kernels/ has hundreds of functions."""
    count = sum(len(cxx_functions(p.read_text())) for p in CXX_FILES)
    assert len(CXX_FILES) > 50 and count > 300, (len(CXX_FILES), count)


def _lengths(code: str) -> list[tuple[int, int]]:
    return cxx_functions(code.lstrip("\n"))


def test_the_cxx_check_counts_function_bodies():
    """The matcher itself, on small snippets: (line of '{', lines to '}') per outermost function."""
    assert _lengths("""
namespace a::b {
int f(int x) {
  if (x) {
    return 1;
  }
  for (;;) { break; }
  return 0;
}
}  // namespace a::b
""") == [(2, 7)]
    # Member functions, qualifiers, trailing return types, operator(), noexcept(...); not the class.
    assert _lengths("""
template <typename T>
class K : public Base<T> {
 public:
  explicit K(int n) : n_(n), v_{1, 2} {
    n_ += 1;
  }
  int Get() const noexcept { return n_; }
  auto Dims() const -> std::vector<int64_t> { return {n_}; }
  bool operator()(int) const & noexcept(true) { return true; }
 private:
  struct Inner { int x = 0; int y{}; };
  enum class E { kA, kB };
  int n_;
};
""") == [(4, 3), (7, 1), (8, 1), (9, 1)]
    # Nested lambdas count as part of their function; a lambda outside any function counts alone.
    assert _lengths("""
const auto kTwice = [](int x) -> int {
  return 2 * x;
};
void Run() {
  auto outer = [&] {
    auto inner = [](int y) mutable { return y; };
    return inner(1);
  };
  outer();
}
""") == [(1, 3), (4, 7)]
    # if constexpr, switch, catch, do/while/else, initializer lists: blocks, not functions.
    assert _lengths("""
void G() {
  if constexpr (kRope) { x = Shape{1, 2}; }
  switch (t) { case 1: { break; } default: break; }
  try { do { } while (0); } catch (const Error& e) { }
  std::vector<int> v = {1, 2, 3};
}
const int kTable[][2] = {{1, 2}, {3, 4}};
struct S { int a; } s{1};
""") == [(1, 6)]


def test_the_cxx_check_ignores_braces_in_comments_strings_and_the_preprocessor():
    assert _lengths(r'''
// void NotAFunction() {
/* int g() {
   } */
#define OPEN(x) void x() {
#if defined(X) \
    || defined(Y) {
#endif
void H() {
  const char* s = "}{ \" }";
  const char c = '{', d = '\'', e = '"';
  const char* raw = R"sep(
  } ) " }
  )sep";
  const char* wide = u8R"(})";
  long big = 1'000'000;  // a digit separator, not a character literal
  char f = '}';
}
int K() { return 0; }
''') == [(8, 10), (18, 1)]
    assert "}" not in strip_cxx('x = "}"; y = \'}\'; /* } */ // }\nz = R"a(})a";')
    assert strip_cxx('a /* 1\n2 */ b\n"x\\\ny"').count("\n") == 2
