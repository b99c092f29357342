"""CPU kernels of the activation family (Gelu, QuickGelu, SiLU, SwiGLU, GeGLU) against the exact
formulas (otfuse.verify.reference, float64), through real ONNX Runtime sessions with the
custom-op library: the error bounds docs/ops.md states, on a dense float32 grid and on every
float16 / bfloat16 value, for each CPU variant (OTFUSE_ACTIVATION_ISA), plus the gated forms'
layouts, special values and refusals."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from cpu_isa import cpu_isas

from kernels.norm.test_cpu import BF16, F16, F32, run_op
from otfuse.verify import reference

DTYPES = [F32, F16, BF16]
# The exact formulas meet NaN and infinities on purpose (the special values of the grids).
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")
MIN_NORMAL = 2.0 ** -126

# docs/ops.md, "CPU kernels (activation family)": relative error of the float32 result against the
# exact formula; the tanh form's grows with its sigmoid argument t (float32 rounding of t, which
# the function amplifies by |t| for x < 0).
RELATIVE_BOUND = {"gelu_none": 2.0 ** -20, "gelu_tanh": 2.0 ** -21, "silu": 2.0 ** -21, "quick_gelu": 2.0 ** -21}
# float16 rows take the float16-result math (activation_math.h, *Half): one flat bound for every op.
HALF_MATH_BOUND = 2.0 ** -16
# Half an ulp of the output type (the final rounding) and the absolute floor below its normals.
HALF_ULP = {F32: 0.0, F16: 2.0 ** -11, BF16: 2.0 ** -8}
ABS_FLOOR = {F32: MIN_NORMAL, F16: 2.0 ** -25, BF16: MIN_NORMAL}


def tanh_argument(x: np.ndarray) -> np.ndarray:
    x64 = x.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        return 2.0 * np.sqrt(2.0 / np.pi) * (x64 + 0.044715 * x64 ** 3)


def relative_bound(kind: str, gate: np.ndarray, dtype=F32) -> np.ndarray | float:
    if dtype == F16:
        return HALF_MATH_BOUND
    if kind == "gelu_tanh":
        return RELATIVE_BOUND[kind] * (1.0 + np.minimum(np.abs(tanh_argument(gate)), 1e30))
    return RELATIVE_BOUND[kind]


def assert_within_bound(got: np.ndarray, exact: np.ndarray, relative, dtype, gated: bool = False) -> None:
    """|got - exact| <= (relative [+ 2^-24 for the gated product] + half an ulp of T) |exact| + floor;
    NaN where the exact value is NaN, infinities exact."""
    got64 = got.astype(np.float64)
    assert np.array_equal(np.isnan(got64), np.isnan(exact)), "NaN where the formula has none, or missing"
    infinite = np.isinf(exact)
    np.testing.assert_array_equal(got64[infinite], exact[infinite])
    finite = np.isfinite(exact)
    rel = relative + (2.0 ** -24 if gated else 0.0) + HALF_ULP[dtype]
    limit = rel * np.abs(exact) + ABS_FLOOR[dtype]
    with np.errstate(invalid="ignore"):
        err = np.abs(got64 - exact)
    bad = finite & ~(err <= limit)
    if bad.any():
        i = np.flatnonzero(bad)[0]
        raise AssertionError(f"{bad.sum()} values outside the bound; first: got {got64.flat[i]!r}, "
                             f"exact {exact.flat[i]!r}, error {err.flat[i]:.3e} > {np.broadcast_to(limit, err.shape).flat[i]:.3e}")


def float32_grid(step: int = 1021) -> np.ndarray:
    """Every step-th float32 in [0, 48] and its negation, plus special values."""
    positive = np.arange(0, 0x42400000, step, dtype=np.uint32).view(np.float32)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e30, -1e30, 3.4e38, -3.4e38, 1e-40, -1e-40,
                        13.2, -13.2, 13.5, -13.5, 19.0, -19.0, 87.0, -87.0, 88.7, -88.7, 190.0, -190.0],
                       np.float32)
    return np.concatenate([positive, -positive, special])


def every_value(dtype: np.dtype) -> np.ndarray:
    """All 65536 float16 or bfloat16 bit patterns."""
    return np.arange(65536, dtype=np.uint32).astype(np.uint16).view(dtype)


UNARY = {  # kind -> (op, attrs, exact)
    "gelu_none": ("Gelu", {}, lambda x: reference.gelu_exact(x, "none")),
    "gelu_tanh": ("Gelu", {"approximate": "tanh"}, lambda x: reference.gelu_exact(x, "tanh")),
    "silu": ("SiLU", {}, reference.silu_exact),
    "quick_gelu": ("QuickGelu", {}, lambda x: reference.quick_gelu_exact(x, 1.702)),
}


def isas() -> list[str]:
    """The CPU variants this machine runs (the others are tested where the CPU has them)."""
    return list(cpu_isas())


ALL_ISAS = ["baseline", "avx2", "avx512"]


def use_isa(monkeypatch, isa: str) -> None:
    if isa not in isas():
        pytest.skip(f"this CPU has no {isa}: its variant is tested where it runs")
    monkeypatch.setenv("OTFUSE_ACTIVATION_ISA", isa)


@pytest.mark.parametrize("isa", ALL_ISAS)
@pytest.mark.parametrize("kind", UNARY)
def test_float32_error_bound_on_a_dense_grid(library, monkeypatch, kind, isa):
    use_isa(monkeypatch, isa)
    op, attrs, exact = UNARY[kind]
    x = float32_grid()
    (y,) = run_op(library, op, [x], attrs=attrs)
    assert_within_bound(y, exact(x), relative_bound(kind, x), F32)


@pytest.mark.parametrize("isa", ALL_ISAS)
def test_gelu_erf_lanes_do_not_depend_on_their_neighbours(library, monkeypatch, isa):
    # The FMA variants take a shorter path when every lane of a vector has |x| < 12.5 and the wide
    # one otherwise (activation_math.h, GeluErf): a wide lane or a NaN next to ordinary values must
    # not change their bits, and both sides of the switch keep the bound.
    use_isa(monkeypatch, isa)
    edge = np.float32(12.5)
    around = np.array([np.nextafter(edge, np.float32(0)), edge, np.nextafter(edge, np.float32(20))], np.float32)
    ordinary = seeded("gelu_erf_lanes").uniform(-12.4, 12.4, 64).astype(np.float32)
    op, attrs, exact = UNARY["gelu_none"]
    (alone,) = run_op(library, op, [ordinary], attrs=attrs)
    assert_within_bound(alone, exact(ordinary), RELATIVE_BOUND["gelu_none"], F32)
    for odd in [*around, *-around, 13.0, -13.2, -19.5, -88.0, np.inf, -np.inf, np.nan]:
        mixed = ordinary.copy()
        mixed[5::16] = odd  # one lane in every AVX-512 vector (and in every other AVX2 one)
        (y,) = run_op(library, op, [mixed], attrs=attrs)
        assert_within_bound(y, exact(mixed), RELATIVE_BOUND["gelu_none"], F32)
        keep = np.ones(mixed.size, bool)
        keep[5::16] = False
        np.testing.assert_array_equal(y[keep].view(np.uint32), alone[keep].view(np.uint32), err_msg=repr(odd))


@pytest.mark.parametrize("isa", ALL_ISAS)
@pytest.mark.parametrize("dtype", [F16, BF16], ids=lambda d: d.name)
@pytest.mark.parametrize("kind", UNARY)
def test_every_half_value(library, monkeypatch, kind, dtype, isa):
    use_isa(monkeypatch, isa)
    op, attrs, exact = UNARY[kind]
    x = every_value(dtype)
    (y,) = run_op(library, op, [x], attrs=attrs)
    assert y.dtype == dtype
    assert_within_bound(y, exact(x.astype(np.float32)), relative_bound(kind, x.astype(np.float32), dtype), dtype)


@pytest.mark.parametrize("isa", ALL_ISAS)
@pytest.mark.parametrize("alpha", [1.702, 1.0, -0.37, 0.0, 2.5e-3, 40.0])
def test_quick_gelu_alpha(library, monkeypatch, alpha, isa):
    # alpha = 0 with |x| near the float32 maximum: the baseline's Dekker split of x overflowed (NaN).
    use_isa(monkeypatch, isa)
    x = float32_grid(4099)
    (y,) = run_op(library, "QuickGelu", [x], attrs={"alpha": alpha})
    assert_within_bound(y, reference.quick_gelu_exact(x, alpha), RELATIVE_BOUND["quick_gelu"], F32)


@pytest.mark.parametrize("isa", ALL_ISAS)
@pytest.mark.parametrize("alpha", [1.702, -0.37, 0.0, 2.5e-3, 40.0])
def test_quick_gelu_alpha_every_float16(library, monkeypatch, alpha, isa):
    # The float16 math's sigmoid cut-off (t < -80) and clamps, for either sign of alpha * x.
    use_isa(monkeypatch, isa)
    x = every_value(F16)
    (y,) = run_op(library, "QuickGelu", [x], attrs={"alpha": alpha})
    assert_within_bound(y, reference.quick_gelu_exact(x.astype(np.float32), alpha), HALF_MATH_BOUND, F16)


# From this many elements on, the float16 one-input ops look their results up in a table of the
# float16 math over every bit pattern (activation_kernel.cc, kHalfTableMinElements).
HALF_TABLE_MIN_ELEMENTS = 1 << 18


@pytest.mark.parametrize("isa", ALL_ISAS)
@pytest.mark.parametrize("case", [*UNARY, "quick_gelu/-0.37", "quick_gelu/0"])
def test_float16_table_gives_the_math_bits(library, monkeypatch, case, isa):
    # Every float16 value, alone (the math) and repeated past the table threshold with an odd tail
    # (the lookup, rows of 16384 plus a partial one): the same bits, NaN payloads included.
    use_isa(monkeypatch, isa)
    kind, _, alpha = case.partition("/")
    op, attrs, exact = UNARY[kind]
    if alpha:
        attrs = {"alpha": float(alpha)}
    x = every_value(F16)
    (computed,) = run_op(library, op, [x], attrs=attrs)
    repeats = HALF_TABLE_MIN_ELEMENTS // x.size + 1
    tiled = np.concatenate([np.tile(x, repeats), x[:1001]])
    (looked_up,) = run_op(library, op, [tiled], attrs=attrs)
    np.testing.assert_array_equal(looked_up.view(np.uint16).reshape(-1)[:repeats * x.size],
                                  np.tile(computed.view(np.uint16), repeats))
    np.testing.assert_array_equal(looked_up.view(np.uint16)[-1001:], computed.view(np.uint16)[:1001])
    if not alpha:
        assert_within_bound(looked_up[:x.size], exact(x.astype(np.float32)), HALF_MATH_BOUND, F16)


@pytest.mark.parametrize("isa", ALL_ISAS)
@pytest.mark.parametrize("dtype", [F32, F16], ids=lambda d: d.name)
def test_signed_zero_and_limits(library, monkeypatch, dtype, isa):
    use_isa(monkeypatch, isa)
    x = np.array([0.0, -0.0, np.inf, -np.inf], dtype)
    for op, attrs in [("Gelu", {}), ("Gelu", {"approximate": "tanh"}), ("SiLU", {}), ("QuickGelu", {})]:
        (y,) = run_op(library, op, [x], attrs=attrs)
        np.testing.assert_array_equal(y, [0.0, -0.0, np.inf, -0.0])
        assert np.signbit(y).tolist() == [False, True, False, True], op


GATED = {  # op -> (kind, attrs, exact)
    "SwiGLU": ("silu", {}, lambda a, b, g: reference.swiglu_exact(a, b, g)),
    "GeGLU": ("gelu_none", {}, lambda a, b, g: reference.geglu_exact(a, b, g, "none")),
    "GeGLU/tanh": ("gelu_tanh", {"approximate": "tanh"}, lambda a, b, g: reference.geglu_exact(a, b, g, "tanh")),
}


def seeded(*key) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


@pytest.mark.parametrize("isa", ALL_ISAS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("shape", [(3, 37), (2, 5, 128), (70000,), (1,)], ids=str)
@pytest.mark.parametrize("name", GATED)
def test_gated_two_inputs(library, monkeypatch, name, shape, dtype, isa):
    use_isa(monkeypatch, isa)
    kind, attrs, exact = GATED[name]
    rng = seeded(name, shape, dtype.name)
    a = (rng.standard_normal(shape, dtype=np.float32) * 3).astype(dtype)
    b = (rng.standard_normal(shape, dtype=np.float32) * 2).astype(dtype)
    (y,) = run_op(library, name.split("/")[0], [a, b], attrs=attrs)
    assert y.shape == shape and y.dtype == dtype
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    assert_within_bound(y, exact(a32, b32, 0), relative_bound(kind, a32, dtype), dtype, gated=True)


@pytest.mark.parametrize("isa", ALL_ISAS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("gate_half", [0, 1])
@pytest.mark.parametrize("shape", [(4, 2 * 37), (2, 3, 2 * 1100), (2,)], ids=str)
@pytest.mark.parametrize("name", GATED)
def test_gated_halves_of_one_input(library, monkeypatch, name, shape, gate_half, dtype, isa):
    use_isa(monkeypatch, isa)
    kind, attrs, exact = GATED[name]
    rng = seeded(name, shape, gate_half, dtype.name)
    a = (rng.standard_normal(shape, dtype=np.float32) * 3).astype(dtype)
    (y,) = run_op(library, name.split("/")[0], [a], attrs={**attrs, "gate_half": gate_half})
    assert y.shape == shape[:-1] + (shape[-1] // 2,) and y.dtype == dtype
    a32 = a.astype(np.float32)
    gate = np.split(a32, 2, axis=-1)[gate_half]
    assert_within_bound(y, exact(a32, None, gate_half), relative_bound(kind, gate, dtype), dtype, gated=True)


def test_gate_half_selects_the_gate(library):
    # Swapping the halves and flipping gate_half computes the same thing, bit for bit.
    rng = seeded("swap")
    gate, up = (rng.standard_normal((5, 64), dtype=np.float32) for _ in range(2))
    (first,) = run_op(library, "SwiGLU", [np.concatenate([gate, up], -1)], attrs={"gate_half": 0})
    (second,) = run_op(library, "SwiGLU", [np.concatenate([up, gate], -1)], attrs={"gate_half": 1})
    (two,) = run_op(library, "SwiGLU", [gate, up])
    np.testing.assert_array_equal(first, second)
    np.testing.assert_array_equal(first, two)


@pytest.mark.parametrize("op, inputs", [("Gelu", 1), ("SwiGLU", 2), ("SwiGLU", 1)])
def test_threads_do_not_change_results(library, op, inputs):
    rng = seeded("threads", op, inputs)
    args = [rng.standard_normal((300, 1000), dtype=np.float32) for _ in range(inputs)]
    one = run_op(library, op, args, threads=1)
    two = run_op(library, op, args, threads=2)
    np.testing.assert_array_equal(one[0], two[0])


@pytest.mark.parametrize("op, inputs, out_shape", [("Gelu", [(0, 8)], (0, 8)), ("SwiGLU", [(4, 0)], (4, 0)),
                                                   ("GeGLU", [(0, 6), (0, 6)], (0, 6)), ("SiLU", [()], ())])
def test_empty_and_scalar_tensors(library, op, inputs, out_shape):
    args = [np.full(shape, 0.5, np.float32) for shape in inputs]
    (y,) = run_op(library, op, args)
    assert y.shape == out_shape


def test_forced_isa_knob_errors(library, monkeypatch):
    monkeypatch.setenv("OTFUSE_ACTIVATION_ISA", "sse9")
    with pytest.raises(Exception, match="not baseline, avx2 or avx512"):
        run_op(library, "SiLU", [np.ones(4, np.float32)])
    missing = [isa for isa in ALL_ISAS if isa not in isas()]
    if missing:
        monkeypatch.setenv("OTFUSE_ACTIVATION_ISA", missing[-1])
        with pytest.raises(Exception, match="cannot run it"):
            run_op(library, "SiLU", [np.ones(4, np.float32)])


ERRORS = [
    ("Gelu", [np.ones(4, np.float32)], {"approximate": "fast"}, r"'approximate' must be \"none\" or \"tanh\""),
    ("QuickGelu", [np.ones(4, np.float32)], {"alpha": float("inf")}, "'alpha' must be finite"),
    ("SwiGLU", [np.ones((2, 4), np.float32)], {"gate_half": 2}, "'gate_half' must be 0 or 1"),
    ("SwiGLU", [np.ones(4, np.float32)] * 2, {"gate_half": 1}, "applies to the one-input form only"),
    ("SwiGLU", [np.ones((2, 5), np.float32)], {}, "even last dimension"),
    ("GeGLU", [np.ones((2, 4), np.float32), np.ones((2, 3), np.float32)], {}, "B has shape"),
]


@pytest.mark.parametrize("op, inputs, attrs, message", ERRORS, ids=[e[3][:30] for e in ERRORS])
def test_refusals_name_the_problem(library, op, inputs, attrs, message):
    with pytest.raises(Exception, match=message):
        run_op(library, op, inputs, attrs=attrs)
