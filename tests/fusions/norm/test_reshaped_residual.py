"""OPT's residual Adds reach their norms through a Reshape that merges (or splits) the leading dims
and keeps the normalised one: ``(residual + h).reshape(-1, hidden)`` -> LayerNorm. The Add is
absorbed (the fused node normalises the sum in its own shape and a copy of the Reshape shapes the
result); the Reshape stays where its output is read elsewhere (the next residual Add). A Reshape
that changes the normalised dim, a broadcasting Add, or a view no rule models leaves the plain
norm fused and the report says why (the downgrade, ``fused_as``)."""

from __future__ import annotations

import pytest
from fusing import assert_same_outputs, fuse_model, fused_nodes
from fusions.norm.graphs import reshaped_residual_model

RESIDUAL_OP = {"op": "AddLayerNorm", "ln": "AddLayerNorm", "rms": "AddRMSNorm"}


def _dims(form: str = "merge", **_) -> dict:
    return {"rows": 6} if form == "split" else {"batch": 2, "seq": 3}


def _reshapes(model) -> int:
    return sum(node.op_type == "Reshape" for node in model.graph.node)


@pytest.mark.parametrize("norm", RESIDUAL_OP)
@pytest.mark.parametrize("form", ["merge", "split"])
@pytest.mark.parametrize("shape_from_sum", [False, True])
def test_residual_through_a_row_keeping_reshape_fuses(tmp_path, norm, form, shape_from_sum):
    model = reshaped_residual_model(norm, form=form, shape_from_sum=shape_from_sum)
    fused, report = fuse_model(tmp_path, model, only=["norm"])
    assert report.fusions == {RESIDUAL_OP[norm]: 1}, report.near_misses
    assert not report.near_misses
    (node,) = fused_nodes(fused)
    assert list(node.input[:2]) == ["x", "r"] and node.output[1] == "sum_1"
    # the Reshape stays for the next residual Add; a copy shapes the normalised sum
    assert _reshapes(fused) == 2
    assert_same_outputs(tmp_path, dims=_dims(form))


@pytest.mark.parametrize("norm", RESIDUAL_OP)
def test_reshape_read_only_by_the_norm_is_absorbed(tmp_path, norm):
    fused, report = fuse_model(tmp_path, reshaped_residual_model(norm, reshaped_read=False), only=["norm"])
    assert report.fusions == {RESIDUAL_OP[norm]: 1} and not report.near_misses
    assert _reshapes(fused) == 1  # only the copy behind the fused node
    assert_same_outputs(tmp_path, dims=_dims())


@pytest.mark.parametrize("norm", RESIDUAL_OP)
def test_sum_read_elsewhere_keeps_its_values(tmp_path, norm):
    """A third reader of the Add reads the fused node's sum output, in the Add's own shape."""
    fused, report = fuse_model(tmp_path, reshaped_residual_model(norm, sum_read=True), only=["norm"])
    assert report.fusions == {RESIDUAL_OP[norm]: 1} and not report.near_misses
    assert_same_outputs(tmp_path, dims=_dims())


# -- mutations: the Add is not absorbed, the plain norm is fused and the downgrade reported ------
PLAIN_OP = {"op": "LayerNorm", "ln": "LayerNorm", "rms": "RMSNorm"}
MUTATIONS = {
    "reshape_changes_the_normalised_dim": (dict(form="narrow"), "changes the normalised dims from [16] to [8]"),
    "broadcasting_add": (dict(r_shape=[1, "seq", 16]), "residual Add may broadcast"),
    "transpose_between": (dict(view="Transpose"), "reaches the norm through Transpose"),
}


@pytest.mark.parametrize("norm", RESIDUAL_OP)
@pytest.mark.parametrize("mutation", MUTATIONS)
def test_unabsorbed_residual_is_a_reported_downgrade(tmp_path, norm, mutation):
    kwargs, reason = MUTATIONS[mutation]
    fused, report = fuse_model(tmp_path, reshaped_residual_model(norm, **kwargs), only=["norm"])
    assert report.fusions == {PLAIN_OP[norm]: 1}, report.near_misses
    (miss,) = report.near_misses
    assert miss["fused_as"] == PLAIN_OP[norm] and "Add" in miss["pattern"], miss
    assert reason in miss["reason"], miss
    assert_same_outputs(tmp_path, dims=_dims(**kwargs))
