"""onnx's own node test cases (``onnx.backend.test.case.node``), generated in process, torch-free.

The onnx wheel ships no test data files, but it ships the code that writes them: collecting it
builds every case's model (function-bodied ops also as ``*_expanded`` / ``*_expanded_verNN``, the
op's function body inlined) and its input / output arrays. The families' coverage tests
(tests/fusions/<family>/test_onnx_expanded.py) fuse those models and compare them with the
original in ONNX Runtime.

Collecting takes tens of seconds (every case's reference output is computed), so it runs once per
process and is shared by every caller. onnx keeps the cases in one module-level list filled at
first import, so ``collect_testcases(op_type)`` cannot be called twice with different op types:
this module always collects everything and filters by name.
"""

from __future__ import annotations

import functools
import re
import warnings
from collections.abc import Iterable

import numpy as np
import onnx
import pytest

_EXPANDED = re.compile(r"_expanded(_ver\d+)?$")


@functools.lru_cache(maxsize=1)
def _collected() -> tuple | str:
    """Every case, or why onnx could not generate them: some onnx releases' generators fail with
    some numpy releases (onnx 1.18 calls `np.bool`, which numpy 1.24-1.26 do not have), and a
    second attempt in the same process then trips over the cases the first one registered."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # onnx's generators cast NaN/inf on purpose
        from onnx.backend.test.case import node

        try:
            return tuple(node.collect_testcases(None))
        except Exception as error:  # onnx's own code, not ours: report it as the reason to skip
            return (f"onnx {onnx.__version__}'s node test case generator fails with numpy {np.__version__}: "
                    f"{type(error).__name__}: {error}")


def _all_cases() -> tuple:
    collected = _collected()
    if isinstance(collected, str):
        pytest.skip(collected, allow_module_level=True)
    return collected


def is_expanded(name: str) -> bool:
    """A case whose model is the op's function body (``_expanded`` or ``_expanded_verNN``)."""
    return bool(_EXPANDED.search(name))


def cases(prefixes: Iterable[str], *, expanded: bool | None = True) -> list:
    """The node test cases whose name starts with one of ``prefixes`` (e.g.
    ``"test_layer_normalization_"``), sorted by name; ``expanded`` True: only the function-body
    forms, False: only the op forms, None: both."""
    prefixes = tuple(prefixes)
    chosen = [case for case in _all_cases() if case.name.startswith(prefixes)
              and (expanded is None or is_expanded(case.name) == expanded)]
    return sorted(chosen, key=lambda case: case.name)


def case_model(case) -> onnx.ModelProto:
    """A copy of the case's model (callers may change it)."""
    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    return model


def case_inputs(case, data_set: int = 0) -> dict[str, np.ndarray]:
    """The case's input arrays by graph input name (data set ``data_set``)."""
    arrays = case.data_sets[data_set][0]
    return {value.name: array for value, array in zip(case.model.graph.input, arrays)}


def case_outputs(case, data_set: int = 0) -> dict[str, np.ndarray]:
    """onnx's reference outputs by graph output name."""
    arrays = case.data_sets[data_set][1]
    return {value.name: array for value, array in zip(case.model.graph.output, arrays)}


def keep_outputs(model: onnx.ModelProto, names: Iterable[str]) -> onnx.ModelProto:
    """``model`` with only the graph outputs ``names`` and without the nodes no output needs
    (a case that writes an op's optional outputs, cut to the outputs a model would read)."""
    names = set(names)
    kept = [value for value in model.graph.output if value.name in names]
    del model.graph.output[:]
    model.graph.output.extend(kept)
    needed = set(names)
    live = []
    for node in reversed(model.graph.node):
        if any(out in needed for out in node.output):
            live.append(node)
            needed.update(name for name in node.input if name)
    del model.graph.node[:]
    model.graph.node.extend(reversed(live))
    return model
