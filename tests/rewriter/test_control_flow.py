"""Fusing inside control-flow bodies (otfuse/control_flow.py, otfuse/rewriter/scopes.py) on hand-built
If and Loop models: a body's sites fuse and are counted by body; outer values are visible inputs,
outer constants readable; nothing the enclosing graph needs is removed; a site the boundary cuts,
or a body fused only in part, is reported with the body in its location."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import otfuse
from otfuse.rewriter.scopes import free_values

F32 = TensorProto.FLOAT
HIDDEN = 16
RNG = np.random.default_rng(0)
ANY3 = [None, None, None]  # rank 3, sizes left to shape inference
WEIGHT = (1 + 0.1 * RNG.standard_normal(HIDDEN)).astype(np.float32)


class Nodes:
    """Nodes of one graph (the main graph or a body), named uniquely across the model."""

    counter = [0]

    def __init__(self):
        self.nodes: list[onnx.NodeProto] = []

    def __call__(self, op: str, inputs, **attrs) -> str:
        Nodes.counter[0] += 1
        out = f"{op.lower()}_{Nodes.counter[0]}"
        self.nodes.append(helper.make_node(op, list(inputs), [out], name=f"{op}_{Nodes.counter[0]}", **attrs))
        return out


def outer_constants(eps_as_input: bool = False) -> tuple[list, list]:
    """(initializers, extra inputs) of the main graph, read by the bodies from outer scope."""
    inits = [numpy_helper.from_array(WEIGHT, "weight"), numpy_helper.from_array(np.float32(2.0), "two"),
             numpy_helper.from_array(np.array([-1], np.int64), "axes")]
    inputs = []
    if eps_as_input:
        inputs.append(helper.make_tensor_value_info("eps", F32, []))
    else:
        inits.append(numpy_helper.from_array(np.float32(1e-6), "eps"))
    return inits, inputs


def mean_square(n: Nodes, x: str) -> str:
    return n("ReduceMean", [n("Pow", [x, "two"]), "axes"], keepdims=1)


def rms_rest(n: Nodes, x: str, ms: str) -> str:
    """The spelled-out RMSNorm after the mean square: Add(eps) -> Sqrt -> Div -> Mul(weight)."""
    return n("Mul", ["weight", n("Div", [x, n("Sqrt", [n("Add", [ms, "eps"])])])])


def branch(n: Nodes, outputs: list[str], name: str) -> onnx.GraphProto:
    return helper.make_graph(n.nodes, name, [], [helper.make_tensor_value_info(o, F32, ANY3) for o in outputs])


def if_model(then_graph: onnx.GraphProto, else_graph: onnx.GraphProto, main: Nodes | None = None,
             eps_as_input: bool = False, outputs=("y",), scalars=()) -> onnx.ModelProto:
    inits, extra = outer_constants(eps_as_input)
    extra += [helper.make_tensor_value_info(name, F32, []) for name in scalars]
    main = main or Nodes()
    main.nodes.append(helper.make_node("If", ["cond"], list(outputs), name="branches",
                                       then_branch=then_graph, else_branch=else_graph))
    declared = [helper.make_tensor_value_info(o, F32, ANY3) for o in outputs]
    graph = helper.make_graph(main.nodes, "g", [helper.make_tensor_value_info("x", F32, [2, "seq", HIDDEN]),
                                                helper.make_tensor_value_info("cond", TensorProto.BOOL, [1])]
                              + extra, declared, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    return model


def identity_branch(name: str) -> onnx.GraphProto:
    n = Nodes()
    return branch(n, [n("Identity", ["x"])], name)


def rms_branch(name: str) -> onnx.GraphProto:
    n = Nodes()
    return branch(n, [rms_rest(n, "x", mean_square(n, "x"))], name)


def fuse_file(tmp_path, model, name="m", **kwargs):
    src, dst = tmp_path / f"{name}.onnx", tmp_path / f"{name}_fused.onnx"
    onnx.save(model, src)
    return src, dst, otfuse.fuse(src, dst, **kwargs)


def body_of(model: onnx.ModelProto, attribute: str) -> onnx.GraphProto:
    node = next(n for n in model.graph.node if n.op_type in ("If", "Loop", "Scan"))
    return next(a.g for a in node.attribute if a.name == attribute)


def ops(graph: onnx.GraphProto) -> list[str]:
    return [n.op_type for n in graph.node]


def test_rms_norm_in_a_then_branch_fuses_and_diff_runs_both_branches(tmp_path):
    src, dst, report = fuse_file(tmp_path, if_model(rms_branch("then"), identity_branch("else")), only=["norm"])
    assert report.fusions == {"RMSNorm": 1}
    assert report.bodies == {"If 'branches' then_branch": {"RMSNorm": 1}}
    fused = onnx.load(dst)
    then = body_of(fused, "then_branch")
    assert ops(then) == ["RMSNorm"]
    assert then.node[0].domain == "otfuse" and list(then.node[0].input)[1:] == ["weight"]
    assert not then.initializer  # the outer constants stay outside: the body reads them from there
    # eps, the exponent and the axes were read by the branch only: gone with the spelled-out norm
    assert {t.name for t in fused.graph.initializer} == {"weight"}
    assert any(o.domain == "otfuse" for o in fused.opset_import)
    onnx.checker.check_model(fused)
    result = otfuse.diff(src, dst, dims={"seq": 5})
    assert result.ok and result.branches == ["cond=False"]
    assert len(result.outputs) == 2  # y with cond True (generated), y [cond=False]


def test_outer_value_is_an_input_of_the_body_not_a_constant(tmp_path):
    # eps is a main-graph input: inside the branch it is a visible value, never a constant to read.
    _, _, report = fuse_file(tmp_path, if_model(rms_branch("then"), identity_branch("else"), eps_as_input=True),
                             only=["norm"])
    assert report.fusions == {}
    located = [m for m in report.near_misses if m["location"].startswith("If 'branches' then_branch: ")]
    assert located and all(m["body"] == "If 'branches' then_branch" for m in located)
    assert any("eps" in m["reason"] or "constant" in m["reason"] for m in located), located


def test_interior_value_the_outer_graph_reads_is_not_removed(tmp_path):
    # The branch also returns sqrt(ms + eps): the main graph reads it through the If's second output.
    n = Nodes()
    ms = mean_square(n, "x")
    std = n("Sqrt", [n("Add", [ms, "eps"])])
    y = n("Mul", ["weight", n("Div", ["x", std])])
    m = Nodes()
    other = branch(m, [m("Identity", ["x"]), m("ReduceMean", ["x", "axes"], keepdims=1)], "else")
    model = if_model(branch(n, [y, std], "then"), other, outputs=("y", "std"))
    src, dst, report = fuse_file(tmp_path, model, only=["norm"])
    assert report.fusions == {}
    then = body_of(onnx.load(dst), "then_branch")
    assert std in {o for node in then.node for o in node.output}
    assert any(m["location"].startswith("If 'branches' then_branch: ") and "graph output" in m["reason"]
               for m in report.near_misses), report.near_misses


def test_interior_value_a_nested_body_reads_is_not_removed(tmp_path):
    # A nested If inside the then-branch reads the mean square: the norm around it must stay.
    n = Nodes()
    ms = mean_square(n, "x")
    y = rms_rest(n, "x", ms)
    inner = Nodes()
    inner_then = branch(inner, [inner("Identity", [ms])], "inner_then")
    inner2 = Nodes()
    inner_else = branch(inner2, [inner2("Neg", [ms])], "inner_else")
    n.nodes.append(helper.make_node("If", ["cond"], ["nested_out"], name="nested",
                                    then_branch=inner_then, else_branch=inner_else))
    y2 = n("Add", [y, "nested_out"])
    src, dst, report = fuse_file(tmp_path, if_model(branch(n, [y2], "then"), identity_branch("else")),
                                 only=["norm"])
    assert report.fusions == {}
    assert any("If 'branches' then_branch: " in m["location"] and "nested" in m["reason"]
               for m in report.near_misses), report.near_misses
    assert otfuse.diff(src, src, dims={"seq": 5}).ok


def test_site_straddling_the_boundary_is_reported_not_fused(tmp_path):
    # Pow -> ReduceMean in the main graph, Add -> Sqrt -> Div -> Mul in the then-branch.
    main = Nodes()
    ms = mean_square(main, "x")
    n = Nodes()
    then = branch(n, [rms_rest(n, "x", ms)], "then")
    src, dst, report = fuse_file(tmp_path, if_model(then, identity_branch("else"), main=main), only=["norm"])
    assert report.fusions == {}
    cut = [m for m in report.near_misses if "straddles the body boundary" in m["reason"]]
    assert len(cut) == 1, report.near_misses
    assert cut[0]["location"].startswith("If 'branches' then_branch: RMSNorm")
    assert "ReduceMean" in cut[0]["reason"] and cut[0]["family"] == "norm"
    fused = onnx.load(dst)
    assert "ReduceMean" in ops(fused.graph) and ops(body_of(fused, "then_branch")) == ops(then)


def test_body_fused_in_part_reports_why(tmp_path):
    # Two norms in the branch: one with the outer constant eps, one whose epsilon is computed
    # from a main-graph input (not a constant): one fuses, the other is reported with the body.
    n = Nodes()
    first = rms_rest(n, "x", mean_square(n, "x"))
    odd_eps = n("Abs", ["x_eps"])
    second = n("Mul", ["weight", n("Div", [first, n("Sqrt", [n("Add", [mean_square(n, first), odd_eps])])])])
    model = if_model(branch(n, [second], "then"), identity_branch("else"), scalars=["x_eps"])
    src, dst, report = fuse_file(tmp_path, model, only=["norm"])
    assert report.bodies == {"If 'branches' then_branch": {"RMSNorm": 1}}
    located = [m for m in report.near_misses if m.get("body") == "If 'branches' then_branch"]
    assert located, report.near_misses
    assert otfuse.diff(src, dst, dims={"seq": 5}).ok


def loop_model() -> onnx.ModelProto:
    """v <- rms_norm(v) + v, three times (trip count a constant); the norm reads outer constants."""
    n = Nodes()
    v_in = "v_in"
    y = rms_rest(n, v_in, mean_square(n, v_in))
    v_out = n("Add", [y, v_in])
    cond_out = n("Identity", ["cond_in"])
    body = helper.make_graph(n.nodes, "body",
                             [helper.make_tensor_value_info("iter", TensorProto.INT64, []),
                              helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                              helper.make_tensor_value_info(v_in, F32, [2, "seq", HIDDEN])],
                             [helper.make_tensor_value_info(cond_out, TensorProto.BOOL, []),
                              helper.make_tensor_value_info(v_out, F32, [2, "seq", HIDDEN])])
    inits, _ = outer_constants()
    inits += [numpy_helper.from_array(np.array(3, np.int64), "trips"),
              numpy_helper.from_array(np.array(True), "go")]
    loop = helper.make_node("Loop", ["trips", "go", "x"], ["v_final"], name="steps", body=body)
    graph = helper.make_graph([loop], "g", [helper.make_tensor_value_info("x", F32, [2, "seq", HIDDEN])],
                              [helper.make_tensor_value_info("v_final", F32, [2, "seq", HIDDEN])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    return model


def test_rms_norm_in_a_loop_body_fuses(tmp_path):
    src, dst, report = fuse_file(tmp_path, loop_model(), only=["norm"])
    assert report.bodies == {"Loop 'steps' body": {"RMSNorm": 1}}
    body = body_of(onnx.load(dst), "body")
    assert "RMSNorm" in ops(body) and "ReduceMean" not in ops(body)
    assert [i.name for i in body.input] == ["iter", "cond_in", "v_in"]
    assert otfuse.diff(src, dst, dims={"seq": 5}).ok


def test_nested_bodies_are_fused_and_named(tmp_path):
    inner = rms_branch("inner_then")
    n = Nodes()
    n.nodes.append(helper.make_node("If", ["cond"], ["inner_y"], name="inner", then_branch=inner,
                                    else_branch=identity_branch("inner_else")))
    outer_then = branch(n, [n("Identity", ["inner_y"])], "then")
    src, dst, report = fuse_file(tmp_path, if_model(outer_then, identity_branch("else")), only=["norm"])
    assert report.bodies == {"If 'branches' then_branch / If 'inner' then_branch": {"RMSNorm": 1}}
    assert otfuse.diff(src, dst, dims={"seq": 5}).ok


def test_free_values_include_nested_reads():
    model = if_model(rms_branch("then"), identity_branch("else"))
    assert set(free_values(body_of(model, "then_branch"))) == {"x", "two", "axes", "eps", "weight"}


@pytest.mark.parametrize("target", ["ort", "onnx"])
def test_targets_lower_body_sites(tmp_path, target):
    src, dst, report = fuse_file(tmp_path, if_model(rms_branch("then"), identity_branch("else")),
                                 only=["norm"], target=target)
    fused = onnx.load(dst)
    then = body_of(fused, "then_branch")
    assert not any(n.domain == "otfuse" for n in then.node)
    assert not any(o.domain == "otfuse" for o in fused.opset_import)
    assert report.bodies == {"If 'branches' then_branch": {"RMSNorm": 1}}
    if target == "onnx":
        assert ops(then) == ["RMSNormalization"]
        onnx.checker.check_model(fused)
    assert otfuse.diff(src, dst, dims={"seq": 5}).ok


def test_rms_norm_in_a_scan_body_fuses(tmp_path):
    # Scan over the first axis of x: each [seq, hidden] slice normed; a running sum as the state.
    n = Nodes()
    y = rms_rest(n, "row", mean_square(n, "row"))
    total = n("Add", ["acc", y])
    kept = n("Identity", [y])
    body = helper.make_graph(n.nodes, "scan_body",
                             [helper.make_tensor_value_info("acc", F32, ["seq", HIDDEN]),
                              helper.make_tensor_value_info("row", F32, ["seq", HIDDEN])],
                             [helper.make_tensor_value_info(total, F32, ["seq", HIDDEN]),
                              helper.make_tensor_value_info(kept, F32, ["seq", HIDDEN])])
    inits, _ = outer_constants()
    scan = helper.make_node("Scan", ["zeros", "x"], ["acc_final", "rows"], name="rows_scan", body=body,
                            num_scan_inputs=1)
    zeros = helper.make_node("ConstantOfShape", ["row_shape"], ["zeros"], name="zeros",
                             value=numpy_helper.from_array(np.zeros(1, np.float32)))
    shape = helper.make_node("Shape", ["x"], ["row_shape"], name="row_shape", start=1)
    graph = helper.make_graph([shape, zeros, scan], "g", [helper.make_tensor_value_info("x", F32, [2, "seq", HIDDEN])],
                              [helper.make_tensor_value_info("acc_final", F32, ["seq", HIDDEN]),
                               helper.make_tensor_value_info("rows", F32, [2, "seq", HIDDEN])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    src, dst, report = fuse_file(tmp_path, model, only=["norm"])
    assert report.bodies == {"Scan 'rows_scan' body": {"RMSNorm": 1}}
    assert otfuse.diff(src, dst, dims={"seq": 5}).ok


def test_outer_values_are_declared_with_the_enclosing_graphs_shapes():
    # t = Transpose(x) has no value_info: its shape comes from the dimension engine.
    from otfuse.rewriter.graph import GraphIndex
    from otfuse.rewriter.scopes import bodies, open_scope

    main = Nodes()
    t = main("Transpose", ["x"], perm=[1, 0, 2])
    n = Nodes()
    model = if_model(branch(n, [n("Neg", [t])], "then"), identity_branch("else"), main=main)
    body = next(b for b in bodies(model.graph) if b.attribute == "then_branch")
    scope = open_scope(model, GraphIndex(model), body)
    assert scope.outer_inputs == [t] and not scope.outer_constants
    declared = next(i for i in scope.model.graph.input if i.name == t).type.tensor_type
    assert declared.elem_type == F32
    assert [d.dim_value or d.dim_param for d in declared.shape.dim] == ["seq", 2, HIDDEN]


def test_closing_a_scope_refuses_a_body_reading_what_it_cannot_see():
    from otfuse.errors import InternalError
    from otfuse.rewriter.graph import GraphIndex
    from otfuse.rewriter.scopes import bodies, close_scope, defined_names, open_scope

    model = if_model(rms_branch("then"), identity_branch("else"))
    body = next(b for b in bodies(model.graph) if b.attribute == "then_branch")
    scope = open_scope(model, GraphIndex(model), body)
    scope.model.graph.node[0].input[0] = "ghost"
    with pytest.raises(InternalError, match="ghost"):
        close_scope(model, scope, defined_names(model.graph))


def test_graph_of_another_op_is_reported_not_fused():
    from otfuse.pipeline import fuse_families
    from otfuse.control_flow import fuse_bodies

    model = if_model(rms_branch("then"), identity_branch("else"))
    model.graph.node[0].domain = "com.example"
    outcome = fuse_bodies(model, ["norm"], None, fuse_families)
    assert not outcome.fusions
    assert {m["location"] for m in outcome.near_misses} == {"If 'branches' then_branch", "If 'branches' else_branch"}
    assert all("only If, Loop and Scan bodies" in m["reason"] for m in outcome.near_misses)


def test_onnx_target_keeps_body_sites_when_the_model_opset_cannot_be_raised(tmp_path):
    # The main graph also runs a DequantizeLinear, changed in opsets 19-23 in ways otfuse does not
    # carry over: the branch's RMSNormalization-23 would need the whole model raised.
    main = Nodes()
    model = if_model(rms_branch("then"), identity_branch("else"), main=main)
    model.graph.initializer.extend([numpy_helper.from_array(np.array([1, 2], np.int8), "q"),
                                    numpy_helper.from_array(np.float32(0.5), "q_scale")])
    model.graph.node.append(helper.make_node("DequantizeLinear", ["q", "q_scale"], ["dq"], name="dq"))
    model.graph.output.append(helper.make_tensor_value_info("dq", F32, [2]))
    src, dst, report = fuse_file(tmp_path, model, only=["norm"], target="onnx")
    assert report.fusions == {} and report.bodies == {}
    assert report.notes == ["no fused site is expressible in target onnx (the near misses say why); "
                            "the output is an unchanged copy"]
    refused = [m for m in report.near_misses if m.get("body") == "If 'branches' then_branch"]
    assert any("cannot be raised" in m["reason"] and "DequantizeLinear" in m["reason"] for m in refused), refused
    fused = onnx.load(dst)
    assert ops(body_of(fused, "then_branch")) == ops(body_of(model, "then_branch"))
    assert fused.opset_import[0].version == 18
