"""CPU kernel of ReluSquared (Y = max(X, 0)^2) against numpy, for each CPU variant the machine runs
(OTFUSE_ACTIVATION_ISA): the contract is exact up to one rounding of the product in T, so the
result must equal the float64 square rounded to T, bit for bit, on a dense float32 grid and on
every float16 / bfloat16 value (special values, signed zeros, overflow to inf included)."""

from __future__ import annotations

import numpy as np
import pytest

from kernels.activation.test_cpu import ALL_ISAS, every_value, float32_grid, use_isa
from kernels.norm.test_cpu import BF16, F16, F32, run_op
from otfuse.verify import reference

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def assert_bits_equal(got: np.ndarray, x: np.ndarray) -> None:
    want = reference.relu_squared_exact(x).astype(x.dtype)
    assert got.dtype == want.dtype and got.shape == want.shape
    same = (got.view(np.uint16 if x.dtype.itemsize == 2 else np.uint32) ==
            want.view(np.uint16 if x.dtype.itemsize == 2 else np.uint32))
    same |= np.isnan(got.astype(np.float64)) & np.isnan(want.astype(np.float64))
    if not same.all():
        i = np.flatnonzero(~same)[0]
        raise AssertionError(f"{(~same).sum()} results differ; first: x {x.flat[i]!r} got {got.flat[i]!r}, "
                             f"want {want.flat[i]!r}")


@pytest.mark.parametrize("isa", ALL_ISAS)
def test_float32_is_the_square_rounded_once(library, monkeypatch, isa):
    use_isa(monkeypatch, isa)
    x = np.concatenate([float32_grid(), np.array([1.9e19, 1.85e19, -1e38, 2.0 ** -64, 2.0 ** -75], F32)])
    (y,) = run_op(library, "ReluSquared", [x])
    assert_bits_equal(y, x)


@pytest.mark.parametrize("isa", ALL_ISAS)
@pytest.mark.parametrize("dtype", [F16, BF16])
def test_every_half_value_is_the_square_rounded_once(library, monkeypatch, dtype, isa):
    use_isa(monkeypatch, isa)
    x = every_value(dtype)
    (y,) = run_op(library, "ReluSquared", [x])
    assert_bits_equal(y, x)


@pytest.mark.parametrize("isa", ALL_ISAS)
@pytest.mark.parametrize("dtype", [F32, F16, BF16])
def test_signed_zero_nan_and_limits(library, monkeypatch, dtype, isa):
    use_isa(monkeypatch, isa)
    x = np.array([-0.0, 0.0, -np.inf, np.inf, np.nan, -1.0, 3.0], dtype)
    (y,) = run_op(library, "ReluSquared", [x])
    y64 = y.astype(np.float64)
    assert list(np.signbit(y64[:4])) == [False] * 4 and list(y64[:4]) == [0.0, 0.0, 0.0, np.inf]
    assert np.isnan(y64[4]) and list(y64[5:]) == [0.0, 9.0]


@pytest.mark.parametrize("isa", ALL_ISAS)
@pytest.mark.parametrize("shape", [(), (0, 5), (3, 17), (2, 1, 40000)])
def test_shapes_and_a_large_float16_tensor(library, monkeypatch, shape, isa):
    # (2, 1, 40000) float16 is past the size where the other one-input ops look results up.
    use_isa(monkeypatch, isa)
    rng = np.random.default_rng(7)
    for dtype in (F32, F16):
        x = np.asarray(rng.standard_normal(shape) * 8).astype(dtype)
        (y,) = run_op(library, "ReluSquared", [x])
        assert y.shape == x.shape
        assert_bits_equal(y, x)
