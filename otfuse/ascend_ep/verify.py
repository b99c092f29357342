"""``otfuse verify-ops --device npu MODEL``: every fused op of MODEL, run by its torch_npu
counterpart on the NPU and by otfuse's CPU kernel, on the same random inputs.

The shapes are the ones the model really produces: the fused model runs once on CPU (generated
inputs, ``--dims``) with every fused node's inputs fetched. Nodes of one op with the same input
shapes, dtypes and attributes are checked once. Values are random (seeded): activations normal,
scale in [0.5, 1.5], bias in [-0.5, 0.5]. Outputs compare with ``otfuse diff``'s tolerances.

torch_npu counterparts (Ascend/op-plugin), each the aclnn call the Ascend kernel makes:

    RMSNorm       torch_npu.npu_rms_norm(x, gamma, epsilon)                 -> aclnnRmsNorm
    AddRMSNorm    torch_npu.npu_add_rms_norm(x1, x2, gamma, epsilon)        -> aclnnAddRmsNorm
    LayerNorm     torch.nn.functional.layer_norm(x, shape, w, b, eps)       -> aclnnLayerNorm
    AddLayerNorm  torch_npu.npu_add_layer_norm(x1, x2, gamma, beta, eps, True) -> aclnnAddLayerNorm
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from onnx import helper

from otfuse import OP_DOMAIN, OP_DOMAIN_VERSION
from otfuse.errors import OtfuseError

NORM_OPS = ("RMSNorm", "AddRMSNorm", "LayerNorm", "AddLayerNorm")
# Which node inputs are activations (random normal) and which weights.
_WEIGHT_INPUTS = {"RMSNorm": {1: "scale"}, "AddRMSNorm": {2: "scale"}, "LayerNorm": {1: "scale", 2: "bias"},
                  "AddLayerNorm": {2: "scale", 3: "bias"}}
_OUTPUT_NAMES = {"RMSNorm": ("Y",), "AddRMSNorm": ("Y", "S"), "LayerNorm": ("Y",), "AddLayerNorm": ("Y", "S")}
_DEFAULT_EPSILON = {"RMSNorm": 1e-6, "AddRMSNorm": 1e-6, "LayerNorm": 1e-5, "AddLayerNorm": 1e-5}

Runner = Callable[[str, list, dict], list]


class DeviceUnavailable(OtfuseError):
    """torch_npu (or an NPU) is missing: the check is skipped, not failed."""


@dataclass
class OpCase:
    op: str
    nodes: list[str]
    inputs: list  # np.ndarray, or None for an absent optional input
    attrs: dict

    def describe(self) -> str:
        return ", ".join("-" if a is None else f"{a.dtype.name}{list(a.shape)}" for a in self.inputs)


@dataclass
class OpCheck:
    case: OpCase
    outputs: list = field(default_factory=list)  # compare.TensorDiff per output
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and all(o.ok for o in self.outputs)


def collect_cases(model_path, dims=None, seed=0) -> list[OpCase]:
    """One case per distinct (op, input shapes/dtypes, attributes) among MODEL's fused norm nodes."""
    from otfuse.compare import _with_outputs
    from otfuse.feeds import make_feeds
    from otfuse.rewriter.model_io import load_model
    from otfuse.session import open_session, run

    loaded = load_model(model_path)
    graph = loaded.model.graph
    nodes = [n for n in graph.node if n.domain == OP_DOMAIN and n.op_type in NORM_OPS]
    if not nodes:
        found = sorted({n.op_type for n in graph.node if n.domain == OP_DOMAIN})
        raise OtfuseError(f"{model_path}: no fused norm nodes to verify"
                          + (f" (its otfuse ops: {', '.join(found)} have no NPU check yet)" if found
                             else " (fuse it first: otfuse MODEL -o MODEL_fused.onnx)"))
    initializers = {t.name: t for t in graph.initializer}
    wanted = sorted({name for n in nodes for name in n.input if name and name not in initializers})
    feeds = make_feeds(loaded.model, dims=dims, seed=seed)
    with _with_outputs(loaded, [w for w in wanted if w not in {o.name for o in graph.output}]) as path:
        session = open_session(path, shown_as=model_path)
        values = run(session, feeds, wanted)

    def signature(name):
        if not name:
            return None
        if name in initializers:
            t = initializers[name]
            return tuple(t.dims), np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).name
        return tuple(values[name].shape), np.dtype(values[name].dtype).name

    cases: dict[tuple, OpCase] = {}
    for i, node in enumerate(nodes):
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        sigs = tuple(signature(name) for name in node.input)
        key = (node.op_type, sigs, tuple(sorted(attrs.items())))
        if key in cases:
            cases[key].nodes.append(node.name or f"#{i}")
            continue
        rng = np.random.default_rng(zlib.crc32(repr(key).encode()) ^ seed)
        inputs = [None if s is None else _random(rng, s[0], s[1], _WEIGHT_INPUTS[node.op_type].get(j))
                  for j, s in enumerate(sigs)]
        cases[key] = OpCase(node.op_type, [node.name or f"#{i}"], inputs, attrs)
    return list(cases.values())


def _random(rng: np.random.Generator, shape, dtype_name: str, role: str | None) -> np.ndarray:
    dtype = _np_dtype(dtype_name)
    if role == "scale":
        values = rng.uniform(0.5, 1.5, shape)
    elif role == "bias":
        values = rng.uniform(-0.5, 0.5, shape)
    else:
        values = rng.standard_normal(shape) * 2 + 0.5
    return values.astype(np.float32).astype(dtype)


def _np_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def cpu_kernel_outputs(op: str, inputs: list, attrs: dict) -> list[np.ndarray]:
    """The otfuse CPU kernel's outputs (Y, and S for the Add ops) for one node."""
    from otfuse.session import InferenceSession, run

    names = [f"in{i}" if a is not None else "" for i, a in enumerate(inputs)]
    while names and not names[-1]:
        names.pop()
    graph_inputs = [helper.make_tensor_value_info(f"in{i}", helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape))
                    for i, a in enumerate(inputs) if a is not None]
    outputs = list(_OUTPUT_NAMES[op])
    elem = helper.np_dtype_to_tensor_dtype(inputs[0].dtype)
    graph = helper.make_graph(
        [helper.make_node(op, names, outputs, domain=OP_DOMAIN, name="verify", **attrs)], "verify", graph_inputs,
        [helper.make_tensor_value_info(o, elem, list(inputs[0].shape)) for o in outputs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid(OP_DOMAIN, OP_DOMAIN_VERSION)])
    session = InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = run(session, {f"in{i}": a for i, a in enumerate(inputs) if a is not None}, outputs)
    return [got[o] for o in outputs]


def torch_npu_runner(device_id: int = 0) -> Runner:
    """A runner calling the torch_npu counterparts on ``npu:device_id``; DeviceUnavailable when
    torch_npu is not installed or sees no NPU."""
    try:
        import torch
        import torch_npu  # registers the npu device and the npu_* ops
    except ImportError as e:
        raise DeviceUnavailable(f"torch_npu not installed ({e}): skipping the NPU check; on an Ascend machine "
                                "pip install 'otfuse[npu]' (torch_npu matching your CANN)") from None
    if not torch.npu.is_available():
        raise DeviceUnavailable("torch_npu is installed but no NPU is visible: skipping the NPU check")
    device = f"npu:{device_id}"

    def to_npu(a):
        if a is None:
            return None
        if a.dtype.name == "bfloat16":
            return torch.from_numpy(a.astype(np.float32)).to(torch.bfloat16).to(device)
        return torch.from_numpy(np.ascontiguousarray(a)).to(device)

    def to_numpy(t, dtype):
        if dtype.name == "bfloat16":
            return t.float().cpu().numpy().astype(dtype)
        return t.cpu().numpy().astype(dtype)

    def runner(op: str, inputs: list, attrs: dict) -> list:
        t = [to_npu(a) for a in inputs]
        eps = float(attrs.get("epsilon", _DEFAULT_EPSILON[op]))
        if op == "RMSNorm":
            results = [torch_npu.npu_rms_norm(t[0], t[1], epsilon=eps)[0]]
        elif op == "AddRMSNorm":
            y, _, s = torch_npu.npu_add_rms_norm(t[0], t[1], t[2], epsilon=eps)
            results = [y, s]
        elif op == "LayerNorm":
            bias = t[2] if len(t) > 2 else None
            results = [torch.nn.functional.layer_norm(t[0], tuple(t[1].shape), t[1], bias, eps)]
        else:
            beta = t[3] if len(t) > 3 and t[3] is not None else torch.zeros_like(t[2])
            y, _, _, s = torch_npu.npu_add_layer_norm(t[0], t[1], t[2], beta, eps, True)
            results = [y, s]
        torch.npu.synchronize()
        return [to_numpy(r, inputs[0].dtype) for r in results]

    return runner


def verify_ops(model_path, *, dims=None, seed=0, device_id=0, runner: Runner | None = None) -> list[OpCheck]:
    """Check every distinct fused norm op of MODEL on the device against the CPU kernels."""
    from otfuse.compare import compare_arrays, tolerance_for

    if not Path(model_path).exists():
        raise OtfuseError(f"input model {str(model_path)!r} does not exist")
    runner = runner or torch_npu_runner(device_id)  # before any work: a missing torch_npu skips fast
    checks = []
    for case in collect_cases(model_path, dims=dims, seed=seed):
        check = OpCheck(case)
        try:
            device = runner(case.op, case.inputs, case.attrs)
        except Exception as e:  # noqa: BLE001  (a refusal or failure on the device is a result, not a crash)
            check.error = f"{type(e).__name__}: {' '.join(str(e).split())}"
            checks.append(check)
            continue
        cpu = cpu_kernel_outputs(case.op, case.inputs, case.attrs)
        for name, want, got in zip(_OUTPUT_NAMES[case.op], cpu, device):
            rtol, atol = tolerance_for(want.dtype)
            check.outputs.append(compare_arrays(name, want, np.asarray(got), rtol, atol))
        checks.append(check)
    return checks
