"""Every committed fixture, rewritten the way other exporters and tools leave models
(tests/fusions/fixture_variants.py: no value_info and blank output dims, then the input dims unnamed,
``-1``, renamed, or all static), fuses like the original and diffs clean: the rewriter's shape
facts come from the dimension engine, not from what an exporter happened to write.

One difference is allowed, and reported: when the input dims are unnamed, nothing says that
``input_ids`` and ``position_ids`` have the same batch any more (the original said so by naming
both ``batch``), so a residual Add that joins values sized from two different inputs may
broadcast; its norm is then fused without the Add and the report lists that downgrade, naming
the two dims. Every other fusion must be the original's."""

from __future__ import annotations

import re
from collections import Counter
from functools import lru_cache

import onnx
import pytest
from fusions.fixture_variants import DIFF_DIMS, VARIANTS, variant
from fixtures import fixture_entries, fixture_path

import otfuse
from otfuse.run.feeds import make_feeds

NAMES = sorted(fixture_entries())
_INPUT_OF_DIM = re.compile(r"([A-Za-z_][\w.]*?)\.dim\d+")


def _fuse(src, dst):
    return otfuse.fuse(src, dst)


@lru_cache(maxsize=None)
def _original(name: str) -> tuple[dict, frozenset]:
    """The original's fusions and its downgrades (pattern, location)."""
    report = _fuse(fixture_path(name), None)
    return dict(report.fusions), frozenset(_site(m) for m in report.near_misses if m.get("fused_as"))


def _site(miss: dict) -> tuple:
    return miss["pattern"], miss["location"], miss["fused_as"]


def _expected_with_downgrades(original: dict, misses: list[dict]) -> dict:
    expected = Counter(original)
    for miss in misses:
        if miss.get("fused_as") in ("RMSNorm", "LayerNorm"):
            expected[f"Add{miss['fused_as']}"] -= 1
            expected[miss["fused_as"]] += 1
    return {op: n for op, n in expected.items() if n}


def _norms_folded(fusions: dict) -> dict:
    """Fusions with each norm + linear op counted as its norm op: a downgraded norm that feeds
    projections is fused as the Linear form of the downgrade, which the near miss (written by the
    norm family) does not name."""
    folded = Counter()
    for op, n in fusions.items():
        folded[op.removesuffix("Linear") if op.endswith("NormLinear") else op] += n
    return dict(folded)


def _check_downgrades(misses: list[dict]) -> None:
    """Each downgrade names two dims that involve two different inputs."""
    for miss in misses:
        assert miss.get("fused_as") in ("RMSNorm", "LayerNorm"), miss
        found = re.search(r"dim \d+: (.*) vs (.*) not proven equal", miss["reason"])
        assert found, miss
        inputs = set(_INPUT_OF_DIM.findall(found.group(1))) | set(_INPUT_OF_DIM.findall(found.group(2)))
        assert len(inputs) >= 2, miss


@pytest.mark.parametrize("kind", VARIANTS)
@pytest.mark.parametrize("name", NAMES)
def test_fixture_variant_fuses_like_the_original(tmp_path, name, kind):
    original, original_downgrades = _original(name)
    src, out = tmp_path / f"{name}_{kind}.onnx", tmp_path / f"{name}_{kind}_fused.onnx"
    model = onnx.load(fixture_path(name))
    onnx.save(variant(model, kind), src)
    report = _fuse(src, out)
    if kind in ("unnamed", "minus_one"):
        downgrades = [m for m in report.near_misses if m.get("fused_as") and _site(m) not in original_downgrades]
        _check_downgrades(downgrades)
        expected = _expected_with_downgrades(_norms_folded(original), downgrades)
        assert _norms_folded(report.fusions) == expected, report.near_misses
    else:
        assert report.fusions == original, report.near_misses
    feeds = make_feeds(model, dims=DIFF_DIMS)
    result = otfuse.diff(src, out, inputs=feeds)
    assert result.ok, [row.to_dict() for row in result.outputs]
