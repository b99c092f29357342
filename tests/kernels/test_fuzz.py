"""Randomised cases for every op in docs/ops.md, on the CPU kernels and on the Ascend kernels
against the fake CANN runtime (tests/fake_cann), in real ORT sessions on one-node models.

Valid cases (random shapes, dtypes, attributes, optional inputs and kernel knobs) must match the
numpy reference within the docs/ops.md tolerance; invalid ones (one mutation each, tests/kernels/fuzz)
must fail with an ORT error that names the problem (and, when the kernel refuses, the op and the
node), never crash. `.ci/sanitize` runs this file against the AddressSanitizer +
UndefinedBehaviorSanitizer build with more cases.

Deterministic: case `i` of (backend, op, kind) is drawn from a generator seeded with
crc32("{seed}/{backend}/{op}/{kind}/{i}"); a family may add CPU kinds of its own (CPU_KINDS: the
attention's decode key splits). OTFUSE_FUZZ_CASES (default 6) sets the cases per
(backend, op, kind), OTFUSE_FUZZ_SEED (default 0) the seed. A failing case reruns alone with
`pytest tests/kernels/test_fuzz.py -k "cpu-RMSNorm-invalid-3"`.
"""

from __future__ import annotations

import os
import zlib

import numpy as np
import onnxruntime as ort
import pytest
from fake_cann import fake_mode_options
from kernels.fuzz import activation, attention, model, norm, norm_linear, rotary
from kernels.fuzz.regressions import REGRESSIONS

FAMILIES = (norm, norm_linear, rotary, attention, activation)
BACKENDS = ("cpu", "ascend")
KINDS = ("valid", "invalid")
CASES = int(os.environ.get("OTFUSE_FUZZ_CASES", "6"))
SEED = int(os.environ.get("OTFUSE_FUZZ_SEED", "0"))
# The reference warns on what the cases do on purpose: empty rows, float16 overflow to inf.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def _params():
    for family in FAMILIES:
        for op in family.OPS:
            for backend in BACKENDS:
                for kind in KINDS + (getattr(family, "CPU_KINDS", ()) if backend == "cpu" else ()):
                    for index in range(CASES):
                        yield pytest.param(family, op, backend, kind, index, id=f"{backend}-{op}-{kind}-{index}")


@pytest.mark.parametrize("family, op, backend, kind, index", list(_params()))
def test_case(request, monkeypatch, library, family, op, backend, kind, index):
    rng = np.random.default_rng(zlib.crc32(f"{SEED}/{backend}/{op}/{kind}/{index}".encode()))
    check(request, monkeypatch, library, getattr(family, kind)(rng, op, backend), backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", REGRESSIONS)
def test_regression(request, monkeypatch, library, name, backend):
    """The defects the fuzz cases found, one fixed case each (tests/kernels/fuzz/regressions.py)."""
    check(request, monkeypatch, library, REGRESSIONS[name](), backend)


def check(request, monkeypatch, library, case, backend):
    for name, value in case.env.items():
        monkeypatch.setenv(name, value)
    if backend == "ascend":
        request.getfixturevalue("fake")  # the Ascend kernels load the test double
        options = fake_mode_options(library, case.threads)
    else:
        options = ort.SessionOptions()
        options.register_custom_ops_library(library)
    options = model.session_options(options, case.threads)
    if case.error is None:
        try:
            outputs = model.run(case, options)
        except Exception as error:  # noqa: BLE001 - ORT raises several exception types
            if case.may_refuse is None:
                raise
            case.error = case.may_refuse  # an Ascend limit the docs name: the node runs on CPU instead
            model.check_error(case, str(error))
            return
        model.check_outputs(case, outputs)
        return
    try:
        model.run(case, options)
    except Exception as error:  # noqa: BLE001 - ORT raises several exception types
        model.check_error(case, str(error))
        return
    pytest.fail(f"no error for {case.describe()}")
