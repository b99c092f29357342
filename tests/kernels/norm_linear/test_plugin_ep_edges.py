"""The plugin-EP route (kernels/cpu/norm_linear_ep.cc) where models get awkward: *NormLinear nodes
inside If / Loop / Scan bodies (optimum's merged decoders), one weight read by several nodes, weights
that are not constants, bad inputs at run time, several sessions and threads, caller-chosen
providers, external data. Each case runs real ORT sessions and compares the EP route with the
custom-op route (OTFUSE_NORM_LINEAR_EP=0) and the reference: same bits, or one clear error."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import threading

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import otfuse
from otfuse.run import session as otfuse_session
from otfuse.verify import reference
from kernels.norm_linear.test_cpu import Case
from kernels.norm_linear.test_plugin_ep import MEMORY_CHILD, _block
from models.test_merged_decoders import unpacked

pytestmark = pytest.mark.skipif(not otfuse_session._ort_has_kernel_ep_api(),
                                reason=f"onnxruntime {ort.__version__} has no plugin-EP kernel API (< 1.24)")

EP = otfuse_session.EP_NAME


def _vi(name, elem=TensorProto.FLOAT, shape=None):
    return helper.make_tensor_value_info(name, elem, shape)


def _model(nodes, inputs, outputs, inits, ir_version=9):
    model = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, inits),
                              opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("otfuse", 1)])
    model.ir_version = ir_version
    return model


def _rms_linear(x, y, n, transposed=0, w="w"):
    return helper.make_node("RMSNormLinear", [x, "scale", w], [y], domain="otfuse", epsilon=1e-5, axis=-1,
                            out_features=[n], transposed=[transposed], has_bias=[0])


def _session(model, ep: bool, monkeypatch, **kwargs):
    monkeypatch.setenv("OTFUSE_NORM_LINEAR_EP", "1" if ep else "0")
    source = model if isinstance(model, (str, os.PathLike)) else model.SerializeToString()
    session = otfuse.InferenceSession(source, **kwargs)
    assert (session.get_providers()[0] == EP) == ep, session.get_providers()
    return session


def _both_routes(model, feeds, monkeypatch):
    """(EP outputs, custom-op outputs), asserted bit-identical."""
    got = _session(model, True, monkeypatch).run(None, feeds)
    custom = _session(model, False, monkeypatch).run(None, feeds)
    for a, b in zip(got, custom):
        np.testing.assert_array_equal(a, b)
    return got


def _placements(path, feeds, monkeypatch) -> collections.Counter:
    """(op, provider) -> kernel runs on the EP route, from ORT's profile (nodes inside bodies included)."""
    monkeypatch.setenv("OTFUSE_NORM_LINEAR_EP", "1")
    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(path) + ".profile"
    session = otfuse.InferenceSession(str(path), sess_options=options)
    session.run(None, feeds)
    profile = session.end_profiling()
    with open(profile) as f:
        events = json.load(f)
    os.remove(profile)
    return collections.Counter((e["args"]["op_name"], e["args"]["provider"]) for e in events
                               if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"))


K = 64
_rng = np.random.default_rng(0)
W = (0.1 * _rng.standard_normal((K, K))).astype(np.float32)
SCALE = (1 + 0.1 * _rng.standard_normal(K)).astype(np.float32)


def _inits(w=W):
    return [numpy_helper.from_array(w, "w"), numpy_helper.from_array(SCALE, "scale")]


def _ref(x, transposed=0, w=W):
    return reference.rms_norm_linear(x, SCALE, [w], [None], [transposed], 1e-5)[0][0]


# ---- Control flow: the EP claims nodes in bodies, packs outer-scope weights, results unchanged.

def test_loop_and_scan_bodies_run_on_the_ep(tmp_path, monkeypatch):
    """One outer-scope W read by a Loop body ([K, N]) and a Scan body ([N, K]): both nodes on the EP,
    every iteration right."""
    body = helper.make_graph([_rms_linear("x_in", "x_out", K), helper.make_node("Identity", ["c_in"], ["c_out"])],
                             "loop_body", [_vi("i", TensorProto.INT64, []), _vi("c_in", TensorProto.BOOL, []),
                                           _vi("x_in")], [_vi("c_out", TensorProto.BOOL, []), _vi("x_out")])
    scan_body = helper.make_graph([_rms_linear("s_in", "s_out", K, transposed=1)], "scan_body",
                                  [_vi("s_in", shape=[5, K])], [_vi("s_out", shape=[5, K])])
    model = _model([helper.make_node("Loop", ["trip", "", "x"], ["y"], body=body),
                    helper.make_node("Scan", ["xs"], ["ys"], body=scan_body, num_scan_inputs=1)],
                   [_vi("trip", TensorProto.INT64, []), _vi("x", shape=[2, 5, K]), _vi("xs", shape=[3, 5, K])],
                   [_vi("y"), _vi("ys")], _inits())
    path = tmp_path / "loop_scan.onnx"
    onnx.save(model, path)
    rng = np.random.default_rng(1)
    feeds = {"trip": np.array(3, np.int64), "x": rng.standard_normal((2, 5, K)).astype(np.float32),
             "xs": rng.standard_normal((3, 5, K)).astype(np.float32)}
    assert _placements(path, feeds, monkeypatch)[("RMSNormLinear", EP)] == 6
    y, ys = _both_routes(model, feeds, monkeypatch)
    expected = feeds["x"]
    for _ in range(3):
        expected = _ref(expected)
    np.testing.assert_allclose(y, expected, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(ys, np.stack([_ref(s, transposed=1) for s in feeds["xs"]]), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("name", ["whisper", "t5"])
def test_merged_decoder_branches_run_on_the_ep(tmp_path, monkeypatch, name):
    """optimum's merged decoder (the decoder twice, under an If): every fused node of the branch
    taken runs on the EP, both branches as the custom-op route's bits."""
    from otfuse.run.feeds import make_feeds
    from otfuse.verify.diff import branch_settings

    src = unpacked(name, tmp_path)
    dst = tmp_path / f"{name}_nl.onnx"
    report = otfuse.fuse(src, dst, only=["norm", "norm_linear"])
    fused_per_branch = [sum(n for op, n in body.items() if op.endswith("NormLinear")) for body in report.bodies.values()]
    assert len(fused_per_branch) == 2 and min(fused_per_branch) > 0, report.bodies
    feeds = make_feeds(onnx.load(src), dims={"batch": 2, "seq": 5}, seed=0)
    settings = [feeds] + [flipped for _, flipped in branch_settings(onnx.load(src), feeds)]
    assert len(settings) == 2
    for these in settings:
        on_ep = sum(n for (op, provider), n in _placements(dst, these, monkeypatch).items() if provider == EP)
        assert on_ep in fused_per_branch
        _both_routes(onnx.load(dst), these, monkeypatch)


def _if_model(k, widths):
    """_block as both branches of an If on `cond`, its weights in the outer graph (a merged decoder's
    layout: the two branches read one set of weights)."""
    block = _block(k, widths)
    names = {t.name for t in block.graph.initializer} | {"x"}

    def branch(tag):
        nodes = []
        for node in block.graph.node:
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            copy.output[:] = [f"{tag}_{o}" for o in node.output]
            copy.input[:] = [i if i in names else f"{tag}_{i}" for i in node.input]
            nodes.append(copy)
        return helper.make_graph(nodes, tag, [], [_vi(f"{tag}_{o.name}") for o in block.graph.output])

    node = helper.make_node("If", ["cond"], [o.name for o in block.graph.output], then_branch=branch("then"),
                            else_branch=branch("else"))
    model = helper.make_model(helper.make_graph([node], "main", list(block.graph.input) + [_vi("cond", TensorProto.BOOL, [])],
                                                list(block.graph.output), list(block.graph.initializer)),
                              opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    return model


def _memory_runs(tmp_path, model, k, external: bool):
    """{label: RSS growth at creation (MiB), providers, outputs} of the unfused graph, the EP route and
    the custom-op route, each in a fresh process."""
    src = tmp_path / "src.onnx"
    if external:
        onnx.save_model(model, src, save_as_external_data=True, location="src.data")
    else:
        onnx.save(model, src)
    otfuse.fuse(src, tmp_path / "base.onnx", only=["norm"])
    otfuse.fuse(src, tmp_path / "fused.onnx", only=["norm", "norm_linear"])
    results = {}
    for label, name, ep in (("unfused", "base", "1"), ("ep", "fused", "1"), ("custom", "fused", "0")):
        out = tmp_path / f"{label}.npz"
        run = subprocess.run([sys.executable, "-c", MEMORY_CHILD, str(tmp_path / f"{name}.onnx"), "70", str(k), str(out)],
                             capture_output=True, text=True, env={**os.environ, "OTFUSE_NORM_LINEAR_EP": ep}, check=True)
        results[label] = json.loads(run.stdout.strip().splitlines()[-1])
        results[label]["outputs"] = [v for _, v in sorted(np.load(out).items())]
    assert results["ep"]["providers"][0] == EP and results["custom"]["providers"] == ["CPUExecutionProvider"]
    for a, b in zip(results["ep"]["outputs"], results["custom"]["outputs"]):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(results["ep"]["outputs"], results["unfused"]["outputs"]):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
    return results


def test_if_branches_share_one_packing_of_their_weights(tmp_path):
    """Both branches of an If read the same outer-scope weights (96 MiB): their kernels share one set
    of panels (ORT frees the initializer once), so the session holds the weights once, as the
    unfused graph does; packing per kernel held them twice (+96 MiB)."""
    k = 2048
    results = _memory_runs(tmp_path, _if_model(k, (4096, 4096, 4096)), k, external=False)
    assert results["unfused"]["created"] > 90  # the weights are resident (the check measures something)
    assert results["ep"]["created"] <= results["unfused"]["created"] + 4, results


@pytest.mark.parametrize("if_branches", [False, True], ids=["block", "if"])
def test_external_data_is_packed_once_and_not_doubled(tmp_path, if_branches):
    """A model saved with external data (ORT maps the file): the EP packs each weight once and ORT
    drops the mapped original, so the session holds the weights once, as the unfused graph's does."""
    k, widths = 2048, (4096, 4096, 4096)
    model = _if_model(k, widths) if if_branches else _block(k, widths)
    results = _memory_runs(tmp_path, model, k, external=True)
    assert os.path.getsize(tmp_path / "src.data") > 90 * 2**20
    fused = onnx.load(tmp_path / "fused.onnx", load_external_data=False)
    assert sum(t.data_location == TensorProto.EXTERNAL for t in fused.graph.initializer) >= 3  # the weights
    assert results["ep"]["created"] <= results["unfused"]["created"] + 4, results
    assert results["ep"]["created"] < 96 + 20, results  # packed once: not the mapped file and the panels twice
    # The panels are resident, the mapped weights were never read by the custom-op route's creation:
    # PrePackWeight ran, outer-scope initializers of an If's bodies included.
    assert results["ep"]["created"] > 90 and results["custom"]["created"] < 40, results


# ---- One weight, several readers.

def test_one_weight_read_by_several_nodes(monkeypatch):
    """The same initializer: two *NormLinear nodes in both layouts (separate panels), one more in the
    first layout (shared panels), a MatMul (ORT's own packing), a Transpose and a graph output (ORT must
    keep the original for them)."""
    nodes = [_rms_linear("x", "y0", K), _rms_linear("x", "y1", K, transposed=1),
             helper.make_node("Relu", ["x"], ["xr"]), _rms_linear("xr", "y2", K),
             helper.make_node("MatMul", ["x", "w"], ["y3"]), helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0])]
    model = _model(nodes, [_vi("x", shape=[2, 5, K])], [_vi(o) for o in ("y0", "y1", "y2", "y3", "wt", "w")], _inits())
    x = np.random.default_rng(2).standard_normal((2, 5, K)).astype(np.float32)
    y0, y1, y2, y3, wt, w = _both_routes(model, {"x": x}, monkeypatch)
    for got, expected in ((y0, _ref(x)), (y1, _ref(x, 1)), (y2, _ref(np.maximum(x, 0))), (y3, x @ W)):
        np.testing.assert_allclose(got, expected, rtol=2e-5, atol=2e-5)
    np.testing.assert_array_equal(wt, W.T)
    np.testing.assert_array_equal(w, W)


def test_equal_weights_in_two_initializers_are_each_right(monkeypatch):
    """Two initializers, same shape, different values, one node each: no panels mixed up."""
    other = (W * -3 + 1).astype(np.float32)
    model = _model([_rms_linear("x", "y0", K), _rms_linear("x", "y1", K, w="w2")], [_vi("x", shape=[2, 5, K])],
                   [_vi("y0"), _vi("y1")], _inits() + [numpy_helper.from_array(other, "w2")])
    x = np.random.default_rng(3).standard_normal((2, 5, K)).astype(np.float32)
    y0, y1 = _both_routes(model, {"x": x}, monkeypatch)
    np.testing.assert_allclose(y0, _ref(x), rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(y1, _ref(x, w=other), rtol=2e-4, atol=2e-4)


# ---- Weights that are not constants, bad inputs at run time.

def test_overridable_initializer_reads_the_fed_weight(monkeypatch):
    """An initializer that is also a graph input is not constant: never packed, a fed W is used."""
    model = _model([_rms_linear("x", "y", K)], [_vi("x", shape=[2, 5, K]), _vi("w", shape=[K, K])], [_vi("y")], _inits())
    x = np.random.default_rng(4).standard_normal((2, 5, K)).astype(np.float32)
    fed = (W * -2).astype(np.float32)
    np.testing.assert_allclose(_both_routes(model, {"x": x, "w": fed}, monkeypatch)[0], _ref(x, w=fed), rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(_both_routes(model, {"x": x}, monkeypatch)[0], _ref(x), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("shape", [(2, 0, K), (0, 5, K)], ids=["seq0", "batch0"])
def test_zero_rows(monkeypatch, shape):
    model = _model([_rms_linear("x", "y", K)], [_vi("x", shape=["b", "s", K])], [_vi("y")], _inits())
    (y,) = _both_routes(model, {"x": np.zeros(shape, np.float32)}, monkeypatch)
    assert y.shape == shape


_BAD = {
    # name: (W, x, out_features, the error)
    "x-width": (W, np.zeros((2, 5, K + 1), np.float32), K, r"scale has shape \[64\] but must equal X.shape\[-1:\] = \[65\]"),
    "w-width": (W, np.zeros((2, 5, K), np.float32), K + 1, r"W1 has shape \[64, 64\] but must equal \[K, out_features\] = \[64, 65\]"),
    "w-rank": (W.reshape(1, K, K), np.zeros((2, 5, K), np.float32), K, r"W1 has shape \[1, 64, 64\]"),
    "w-float16": (W.astype(np.float16), np.zeros((2, 5, K), np.float32), K, "W1 has element type float16; expected float32"),
    "w-int32": (W.astype(np.int32), np.zeros((2, 5, K), np.float32), K, "W1 has element type int32; expected float32"),
}


@pytest.mark.parametrize("case", list(_BAD))
def test_bad_weights_are_one_clear_error_on_both_routes(monkeypatch, case):
    w, x, n, message = _BAD[case]
    model = _model([_rms_linear("x", "y", n)], [_vi("x")], [_vi("y")], _inits(w))
    for ep in (True, False):
        session = _session(model, ep, monkeypatch)
        with pytest.raises(Exception, match=message):
            session.run(None, {"x": x})


def test_16_bit_weights_mixed_with_runtime_weights(monkeypatch):
    """float16 weights (not packed) beside a weight fed per run, both layouts: right on the EP."""
    constant = Case("AddLayerNormLinear", np.float16, shape=(3, 9, 40), widths=(17, 5), transposed=[1, 0], keep=True, seed=5)
    model, feeds = constant.model()
    model.graph.input.append(_vi("w1", TensorProto.FLOAT16, [40, 5]))  # W2 overridable: fed per run
    got_feed = {**feeds, "w1": (constant.weights[1] * 2).astype(np.float16)}
    _both_routes(model, feeds, monkeypatch)
    got = _both_routes(model, got_feed, monkeypatch)
    constant.weights[1] = got_feed["w1"]
    np.testing.assert_allclose(got[1].astype(np.float32), constant.expected()[1].astype(np.float32), rtol=2e-3, atol=2e-3)


# ---- Sessions: several, threads, bytes / path, caller-chosen providers.

def test_sessions_in_threads_from_bytes_and_paths(tmp_path):
    """Eight sessions created and run at once in four threads, from bytes and from a path: all on the
    EP (registered once per process), all the custom-op route's bits."""
    case = Case("AddRMSNormLinear", shape=(2, 9, 64))
    model, feeds = case.model()
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    expected = case.run()
    barrier, results, errors = threading.Barrier(4), [], []

    def work(source):
        try:
            barrier.wait()
            for _ in range(2):
                session = otfuse.InferenceSession(source)
                results.append((session.get_providers(), session.run(None, feeds)))
        except Exception as e:  # noqa: BLE001  (reported below)
            errors.append(repr(e))

    threads = [threading.Thread(target=work, args=(s,)) for s in (str(path), path, model.SerializeToString(), str(path))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 8
    for providers, got in results:
        assert providers == [EP, "CPUExecutionProvider"]
        for a, b in zip(got, expected):
            np.testing.assert_array_equal(a, b)


def test_providers_chosen_by_the_caller_are_kept():
    """Options that already hold providers run on those (ORT's providers list would replace them with a
    warning); a CPU EP given options of its own keeps them (the custom-op route); reused options keep
    the EP."""
    model, feeds = Case("RMSNormLinear").model()
    data = model.SerializeToString()
    with_ep = ort.SessionOptions()
    with_ep.add_provider_for_devices(otfuse_session.plugin_ep_devices(otfuse.library_path()), {})
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert otfuse.InferenceSession(data, sess_options=with_ep).get_providers() == [EP, "CPUExecutionProvider"]
    cpu_only = ort.SessionOptions()
    cpu_only.add_provider("CPUExecutionProvider", {})
    assert otfuse.InferenceSession(data, sess_options=cpu_only).get_providers() == ["CPUExecutionProvider"]
    cpu_options = [("CPUExecutionProvider", {"arena_extend_strategy": "kSameAsRequested"})]
    assert otfuse.InferenceSession(data, providers=cpu_options).get_providers() == ["CPUExecutionProvider"]
    reused = ort.SessionOptions()
    for _ in range(2):
        session = otfuse.InferenceSession(data, sess_options=reused)
        assert session.get_providers() == [EP, "CPUExecutionProvider"]
        session.run(None, feeds)
