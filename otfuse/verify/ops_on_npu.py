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
    RotaryEmbedding    torch_npu.npu_rotary_mul(x, cos, sin, rotary_mode)   -> aclnnRotaryPositionEmbedding
                       (per section, on the first r lanes; x and cos/sin made 4-D)
    RotaryEmbeddingQK  torch_npu.npu_apply_rotary_pos_emb(q, k, cos, sin, layout) when D = 128 and
                       half mode -> aclnnApplyRotaryPosEmbV2, else npu_rotary_mul twice
    Attention          torch_npu.npu_fused_infer_attention_score(q, present_k, present_v, ...)
                       -> aclnnFusedInferAttentionScoreV3 (BNSD, pse_shift, sparse modes 3/4 with
                       the 2048 x 2048 mask, a full mask for key padding, inner_precise 2); float32
                       nodes run in float16 (the kernel's opt-in), so they compare with float16's tolerance
    RopeAttention      the two rotations above, then npu_fused_infer_attention_score
    RMSNormLinear, AddRMSNormLinear, LayerNormLinear, AddLayerNormLinear
                       the norm op's counterpart above (Yn, S), then per projection
                       torch.matmul(Yn, W) -> aclnnMatmul, or torch.addmm(bias, Yn, W) -> aclnnAddmm
                       with a bias (cast to T); a transposed W as W.t(), a strided view, as the kernel
    Gelu               torch.nn.functional.gelu(x, approximate)                 -> aclnnGelu / GeluV2
    QuickGelu          x * torch.sigmoid(alpha * x) (torch_npu has no Swish of its own; the kernel
                       calls aclnnSwish)
    SiLU               torch.nn.functional.silu(x)                               -> aclnnSilu
    SwiGLU             torch_npu.npu_swiglu(a, -1) for one input with the gate first -> aclnnSwiGlu,
                       else silu(gate) * up on the halves or the two inputs
    GeGLU              gelu(gate, approximate) * up (the kernel's aclnnGeGlu / GeluV2 + InplaceMul)

Weights of the norm + linear ops are random too (normal x 0.05, the model's shapes), not the
model's. The rotary, attention and norm + linear runners are untested here (no torch_npu); the
suite exercises ``verify_ops`` with a numpy runner.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from onnx import helper

from otfuse.domain import OP_DOMAIN, OP_DOMAIN_VERSION
from otfuse.errors import OtfuseError

NORM_OPS = ("RMSNorm", "AddRMSNorm", "LayerNorm", "AddLayerNorm")
ROTARY_OPS = ("RotaryEmbedding", "RotaryEmbeddingQK")
ATTENTION_OPS = ("Attention", "RopeAttention")
NORM_LINEAR_OPS = ("RMSNormLinear", "AddRMSNormLinear", "LayerNormLinear", "AddLayerNormLinear")
ACTIVATION_OPS = ("Gelu", "QuickGelu", "SiLU", "SwiGLU", "GeGLU")
VERIFIED_OPS = NORM_OPS + ROTARY_OPS + ATTENTION_OPS + NORM_LINEAR_OPS + ACTIVATION_OPS
# Which node inputs are activations (random normal) and which are something else.
_WEIGHT_INPUTS = {"RMSNorm": {1: "scale"}, "AddRMSNorm": {2: "scale"}, "LayerNorm": {1: "scale", 2: "bias"},
                  "AddLayerNorm": {2: "scale", 3: "bias"},
                  "RotaryEmbedding": {1: "angle", 2: "angle"}, "RotaryEmbeddingQK": {2: "angle", 3: "angle"},
                  # 7 (9): alibi_slopes, 8 (10): sinks
                  "Attention": {3: "bias", 4: "mask", 5: "cache", 6: "cache", 7: "bias", 8: "bias"},
                  "RopeAttention": {3: "angle", 4: "angle", 5: "bias", 6: "mask", 7: "cache", 8: "cache", 9: "bias",
                                    10: "bias"},
                  **{op: {} for op in ACTIVATION_OPS}}
_OUTPUT_NAMES = {"RMSNorm": ("Y",), "AddRMSNorm": ("Y", "S"), "LayerNorm": ("Y",), "AddLayerNorm": ("Y", "S"),
                 "RotaryEmbedding": ("Y",), "RotaryEmbeddingQK": ("Q_out", "K_out"),
                 "Attention": ("Y", "present_key", "present_value"),
                 "RopeAttention": ("Y", "present_key", "present_value"),
                 **{op: ("Y",) for op in ACTIVATION_OPS}}
_DEFAULT_EPSILON = {"RMSNorm": 1e-6, "AddRMSNorm": 1e-6, "LayerNorm": 1e-5, "AddLayerNorm": 1e-5,
                    "RMSNormLinear": 1e-6, "AddRMSNormLinear": 1e-6, "LayerNormLinear": 1e-5,
                    "AddLayerNormLinear": 1e-5}

Runner = Callable[[str, list, dict], list]


class DeviceUnavailable(OtfuseError):
    """torch_npu (or an NPU) is missing: the check is skipped, not failed."""


@dataclass
class OpCase:
    op: str
    nodes: list[str]
    inputs: list  # np.ndarray, or None for an absent optional input
    attrs: dict
    n_outputs: int = 0  # the node's output count (norm + linear: n, n + 1 or n + 2)

    def describe(self) -> str:
        return ", ".join("-" if a is None else f"{a.dtype.name}{list(a.shape)}" for a in self.inputs)


@dataclass
class OpCheck:
    case: OpCase
    outputs: list = field(default_factory=list)  # diff.TensorDiff per output
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and all(o.ok for o in self.outputs)


def collect_cases(model_path, dims=None, seed=0) -> list[OpCase]:
    """One case per distinct (op, input shapes/dtypes, attributes) among MODEL's fused nodes."""
    from otfuse.rewriter.model_io import load_model
    from otfuse.run.feeds import make_feeds
    from otfuse.run.session import open_session, run
    from otfuse.verify.diff import with_outputs

    loaded = load_model(model_path)
    graph = loaded.model.graph
    nodes = [n for n in graph.node if n.domain == OP_DOMAIN and n.op_type in VERIFIED_OPS]
    if not nodes:
        found = sorted({n.op_type for n in graph.node if n.domain == OP_DOMAIN})
        raise OtfuseError(f"{model_path}: no fused norm, norm + linear, rotary, attention or activation nodes to verify"
                          + (f" (its otfuse ops: {', '.join(found)} have no NPU check yet)" if found
                             else " (fuse it first: otfuse MODEL -o MODEL_fused.onnx)"))
    initializers = {t.name: t for t in graph.initializer}
    wanted = sorted({name for n in nodes for name in n.input if name and name not in initializers})
    feeds = make_feeds(loaded.model, dims=dims, seed=seed)
    with with_outputs(loaded, [w for w in wanted if w not in {o.name for o in graph.output}]) as path:
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
        attrs = {a.name: _attribute(a) for a in node.attribute}
        sigs = tuple(signature(name) for name in node.input)
        key = (node.op_type, sigs, tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in attrs.items())),
               len(node.output))
        if key in cases:
            cases[key].nodes.append(node.name or f"#{i}")
            continue
        rng = np.random.default_rng(zlib.crc32(repr(key).encode()) ^ seed)
        roles = _input_roles(node.op_type, attrs)
        inputs = [None if s is None else _random(rng, s[0], s[1], roles.get(j)) for j, s in enumerate(sigs)]
        cases[key] = OpCase(node.op_type, [node.name or f"#{i}"], inputs, attrs, len(node.output))
    return list(cases.values())


def _norm_linear_layout(op: str, attrs: dict) -> tuple[int, int, list[int], list[int]]:
    """(index of W_1, n, transposed, has_bias) of a norm + linear node."""
    n = len(attrs["out_features"])
    first = (3 if op.startswith("Add") else 2) + (1 if op.startswith(("LayerNorm", "AddLayerNorm")) else 0)
    return first, n, list(attrs.get("transposed", [0] * n)), list(attrs.get("has_bias", [0] * n))


def _input_roles(op: str, attrs: dict) -> dict[int, str]:
    """Input index -> role for the inputs that are not activations."""
    if op not in NORM_LINEAR_OPS:
        return _WEIGHT_INPUTS[op]
    first, n, _, has_bias = _norm_linear_layout(op, attrs)
    roles = {first - 1: "bias"} if op.startswith(("LayerNorm", "AddLayerNorm")) else {}
    roles[first - (2 if roles else 1)] = "scale"
    roles.update({first + i: "weight" for i in range(n)})
    roles.update({first + n + i: "bias" for i in range(sum(has_bias))})
    return roles


def _output_names(op: str, attrs: dict, n_outputs: int) -> tuple[str, ...]:
    if op not in NORM_LINEAR_OPS:
        return _OUTPUT_NAMES[op]
    n = len(attrs["out_features"])
    names = [f"Y{i + 1}" for i in range(n)] + (["S"] if op.startswith("Add") else [])
    return tuple(names + ["Yn"] * (n_outputs - len(names)))


def _attribute(attribute):
    value = helper.get_attribute_value(attribute)
    return value.decode() if isinstance(value, bytes) else value


def _random(rng: np.random.Generator, shape, dtype_name: str, role: str | None) -> np.ndarray:
    dtype = _np_dtype(dtype_name)
    if role == "mask":  # key_padding_mask: every key visible
        return np.ones(shape, dtype)
    if role == "angle":  # cos / sin tables: values in [-1, 1]
        return rng.uniform(-1.0, 1.0, shape).astype(np.float32).astype(dtype)
    if role == "cache":
        return (rng.standard_normal(shape) * 0.5).astype(np.float32).astype(dtype)
    if role == "weight":
        return (rng.standard_normal(shape) * 0.05).astype(np.float32).astype(dtype)
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


def cpu_kernel_outputs(op: str, inputs: list, attrs: dict, n_outputs: int = 0) -> list[np.ndarray]:
    """The otfuse CPU kernel's outputs (``_output_names``) for one node."""
    from otfuse.run.session import InferenceSession, run

    names = [f"in{i}" if a is not None else "" for i, a in enumerate(inputs)]
    while names and not names[-1]:
        names.pop()
    graph_inputs = [helper.make_tensor_value_info(f"in{i}", helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape))
                    for i, a in enumerate(inputs) if a is not None]
    outputs = list(_output_names(op, attrs, n_outputs))
    elem = helper.np_dtype_to_tensor_dtype(inputs[0].dtype)
    shape = list(inputs[0].shape) if op in NORM_OPS else None
    graph = helper.make_graph(
        [helper.make_node(op, names, outputs, domain=OP_DOMAIN, name="verify", **attrs)], "verify", graph_inputs,
        [helper.make_tensor_value_info(o, elem, shape) for o in outputs])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(OP_DOMAIN, OP_DOMAIN_VERSION)]
    # The oldest IR that holds opset 17, not the installed onnx's newest, which an older onnxruntime refuses.
    model = helper.make_model(graph, opset_imports=opsets,
                              ir_version=helper.find_min_ir_version_for(opsets, ignore_unknown=True))
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
        if op in ROTARY_OPS or op in ATTENTION_OPS:
            results = _transformer_on_npu(torch, torch_npu, op, t, attrs)
            torch.npu.synchronize()
            return [to_numpy(r, inputs[0].dtype) for r in results]
        if op in NORM_LINEAR_OPS:
            results = _norm_linear_on_npu(torch, torch_npu, op, t, attrs)
            torch.npu.synchronize()
            return [to_numpy(r, inputs[0].dtype) for r in results]
        if op in ACTIVATION_OPS:
            results = [_activation_on_npu(torch, torch_npu, op, t, attrs)]
            torch.npu.synchronize()
            return [to_numpy(r, inputs[0].dtype) for r in results]
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


def _activation_on_npu(torch, torch_npu, op: str, t: list, attrs: dict):
    """The activation kernel's counterpart (module docstring)."""
    approximate = attrs.get("approximate", "none")
    if op == "Gelu":
        return torch.nn.functional.gelu(t[0], approximate=approximate)
    if op == "QuickGelu":
        return t[0] * torch.sigmoid(float(attrs.get("alpha", 1.702)) * t[0])
    if op == "SiLU":
        return torch.nn.functional.silu(t[0])
    gate_half = int(attrs.get("gate_half", 0))
    if len(t) > 1 and t[1] is not None:
        gate, up = t[0], t[1]
    else:
        if op == "SwiGLU" and gate_half == 0:
            return torch_npu.npu_swiglu(t[0], -1)
        halves = t[0].chunk(2, dim=-1)
        gate, up = halves[gate_half], halves[1 - gate_half]
    act = torch.nn.functional.silu(gate) if op == "SwiGLU" else torch.nn.functional.gelu(gate, approximate=approximate)
    return act * up


def _norm_linear_on_npu(torch, torch_npu, op: str, t: list, attrs: dict) -> list:
    """The norm + linear kernel's calls: the norm op's counterpart, then per projection
    torch.matmul (aclnnMatmul) or torch.addmm (aclnnAddmm). Returns Y_1..Y_n, [S], Yn: the caller
    compares as many as the node outputs."""
    first, n, transposed, has_bias = _norm_linear_layout(op, attrs)
    eps = float(attrs.get("epsilon", _DEFAULT_EPSILON[op]))
    s = None
    if op == "RMSNormLinear":
        yn = torch_npu.npu_rms_norm(t[0], t[1], epsilon=eps)[0]
    elif op == "AddRMSNormLinear":
        yn, _, s = torch_npu.npu_add_rms_norm(t[0], t[1], t[2], epsilon=eps)
    elif op == "LayerNormLinear":
        yn = torch.nn.functional.layer_norm(t[0], tuple(t[1].shape), t[1], t[2], eps)
    else:
        beta = t[3] if t[3] is not None else torch.zeros_like(t[2])
        yn, _, _, s = torch_npu.npu_add_layer_norm(t[0], t[1], t[2], beta, eps, True)
    k = yn.shape[-1]
    rows = yn.reshape(-1, k)
    biases = iter(t[first + n:])
    ys = []
    for i in range(n):
        w = t[first + i].t() if transposed[i] else t[first + i]  # a strided view, as the kernel's
        if has_bias[i]:
            y = torch.addmm(next(biases).to(yn.dtype), rows, w)
        else:
            y = torch.matmul(rows, w)
        ys.append(y.reshape(*yn.shape[:-1], w.shape[1]))
    return ys + ([s] if s is not None else []) + [yn]


def _rotate_on_npu(torch, torch_npu, x, cos, sin, mode: str, rotary_dim: int, sections) -> object:
    """RotaryEmbedding with npu_rotary_mul (aclnnRotaryPositionEmbedding): per section, on the
    first r lanes, with x and cos/sin made 4-D (leading ones)."""
    d = x.shape[-1]
    r = rotary_dim or d
    shape = x.shape
    x4 = x.reshape((1,) * (4 - x.dim()) + tuple(shape)) if x.dim() < 4 else x
    if x4.dim() != 4:
        raise ValueError(f"the torch_npu check takes X of rank <= 4, got {tuple(shape)}")
    c4 = cos.reshape((1,) * (4 - cos.dim()) + tuple(cos.shape))
    s4 = sin.reshape((1,) * (4 - sin.dim()) + tuple(sin.shape))
    npu_mode = "interleave" if mode == "interleaved" else "half"
    widths = [r] if mode == "interleaved" or not sections else [w for w in sections]
    pieces, offset = [], 0
    for w in widths:
        if w:
            pieces.append(torch_npu.npu_rotary_mul(x4[..., offset:offset + w].contiguous(),
                                                   c4[..., offset:offset + w].contiguous(),
                                                   s4[..., offset:offset + w].contiguous(), rotary_mode=npu_mode))
        offset += w
    if r < d:
        pieces.append(x4[..., r:])
    return torch.cat(pieces, dim=-1).reshape(shape)


def _attention_on_npu(torch, torch_npu, q, k, v, bias, key_mask, past_k, past_v, attrs: dict, fp32_as=None):
    """Attention as aclnnFusedInferAttentionScoreV3 through npu_fused_infer_attention_score, with
    the kernel's mapping: BNSD present_* as key/value, pse_shift, sparse modes, inner_precise."""
    n = int(attrs["num_heads"])
    nkv = int(attrs.get("kv_num_heads", n))
    layout = attrs.get("layout", "BNSD")
    out_layout = attrs.get("output_layout", layout)
    causal, window = int(attrs.get("causal", 0)), int(attrs.get("window", 0))
    if float(attrs.get("softcap", 0.0)) > 0.0:  # as the Ascend kernel: FIA cannot soft-cap
        raise ValueError("aclnnFusedInferAttentionScoreV3 has no logit soft-capping (softcap > 0)")
    dtype = q.dtype
    rank3 = q.dim() == 3

    def bnsd(x, heads):
        if layout == "BNSD":
            return x
        if x.dim() == 3:
            x = x.reshape(x.shape[0], x.shape[1], heads, x.shape[2] // heads)
        return x.transpose(1, 2)

    qb, kb, vb = bnsd(q, n), bnsd(k, nkv), bnsd(v, nkv)
    present_k = torch.cat([past_k, kb], dim=2) if past_k is not None else kb
    present_v = torch.cat([past_v, vb], dim=2) if past_v is not None else vb
    compute = dtype if dtype != torch.float32 else (fp32_as or torch.float16)
    b, _, sq, d = qb.shape
    skv = present_k.shape[2]
    scale = float(attrs.get("scale", 0.0)) or 1.0 / float(d) ** 0.5
    pse = None
    if bias is not None:
        b4 = bias.reshape((1,) * (4 - bias.dim()) + tuple(bias.shape))
        pse = b4.expand(b if b4.shape[0] == b else 1, n, sq, skv).to(compute).contiguous()
    sparse, pre, nxt, mask = 0, 2147483647, 2147483647, None
    j = torch.arange(skv, device=q.device)
    t = torch.arange(sq, device=q.device)[:, None] + (skv - sq)
    if key_mask is not None or (window > 0 and sq == 1):
        hidden = torch.zeros(sq, skv, dtype=torch.bool, device=q.device)
        if causal:
            hidden |= j[None, :] > t
        if window > 0:
            hidden |= j[None, :] <= t - window
        hidden = hidden[None, None].expand(b, 1, sq, skv)
        if key_mask is not None:
            hidden = hidden | (key_mask == 0)[:, None, None, :]
        mask = hidden.contiguous()
    elif causal and sq > 1:
        mask = torch.triu(torch.ones(2048, 2048, dtype=torch.bool, device=q.device), diagonal=1)
        sparse, pre, nxt = (4, window - 1, 0) if window > 0 else (3, pre, nxt)
    inner = 2 if (key_mask is not None or bias is not None or window > 0 or (causal and sq > skv)) else 0
    out, _ = torch_npu.npu_fused_infer_attention_score(
        qb.to(compute).contiguous(), present_k.to(compute).contiguous(), present_v.to(compute).contiguous(),
        pse_shift=pse, atten_mask=mask, num_heads=n, scale=scale, pre_tokens=pre, next_tokens=nxt,
        input_layout="BNSD", num_key_value_heads=0 if nkv == n else nkv, sparse_mode=sparse, inner_precise=inner)
    if attrs.get("empty_rows", "zero") == "uniform" and skv > 0:
        # the kernel's post-process: rows that see no key get the mean of V (FIA with a zero query)
        visible = torch.ones(sq, skv, dtype=torch.bool, device=q.device)
        if causal:
            visible &= j[None, :] <= t
        if window > 0:
            visible &= j[None, :] > t - window
        visible = visible[None, None].expand(b, n, sq, skv)
        if key_mask is not None:
            visible = visible & (key_mask != 0)[:, None, None, :]
        if bias is not None:
            visible = visible & (b4.expand(b, n, sq, skv) != float("-inf"))
        mean, _ = torch_npu.npu_fused_infer_attention_score(
            torch.zeros(b, nkv, 1, d, dtype=compute, device=q.device), present_k.to(compute).contiguous(),
            present_v.to(compute).contiguous(), num_heads=nkv, scale=1.0, input_layout="BNSD")
        out = torch.where(~visible.any(-1, keepdim=True), mean.repeat_interleave(n // nkv, dim=1), out)
    y = out.to(dtype)
    if out_layout == "BSND":
        y = y.transpose(1, 2)
        if rank3:
            y = y.reshape(b, sq, -1)
    return [y.contiguous(), present_k, present_v]


def _transformer_on_npu(torch, torch_npu, op: str, t: list, attrs: dict) -> list:
    t = t + [None] * (9 - len(t))
    mode = attrs.get("mode", attrs.get("rotary_mode", "half"))
    rotary_dim = int(attrs.get("rotary_dim", 0))
    sections = attrs.get("sections", attrs.get("rotary_sections", []))
    if op == "RotaryEmbedding":
        return [_rotate_on_npu(torch, torch_npu, t[0], t[1], t[2], mode, rotary_dim, sections)]
    if op == "RotaryEmbeddingQK":
        q, k, cos, sin = t[:4]
        if (mode == "half" and not rotary_dim and not sections and q.dim() == 4 and q.shape[-1] == 128
                and cos.dim() == 4 and cos.shape[2] == 1):
            q_out, k_out = q.clone(), k.clone()  # in place
            torch_npu.npu_apply_rotary_pos_emb(q_out, k_out, cos.contiguous(), sin.contiguous(), layout="BSND")
            return [q_out, k_out]
        return [_rotate_on_npu(torch, torch_npu, x, cos, sin, mode, rotary_dim, sections) for x in (q, k)]
    if op == "Attention":
        return _attention_on_npu(torch, torch_npu, *t[:7], attrs)
    q, k, v, cos, sin = t[:5]
    layout = attrs.get("layout", "BNSD")
    n, nkv = int(attrs["num_heads"]), int(attrs.get("kv_num_heads", attrs["num_heads"]))

    def four(x, heads):  # a rank-3 BSND input as [B, S, N, D] for the rotation
        return x.reshape(x.shape[0], x.shape[1], heads, x.shape[2] // heads) if x.dim() == 3 else x

    q_rot = _rotate_on_npu(torch, torch_npu, four(q, n), cos, sin, mode, rotary_dim, sections).reshape(q.shape)
    k_rot = _rotate_on_npu(torch, torch_npu, four(k, nkv), cos, sin, mode, rotary_dim, sections).reshape(k.shape)
    rest = {key: value for key, value in attrs.items() if not key.startswith("rotary_")}
    rest["layout"] = layout
    return _attention_on_npu(torch, torch_npu, q_rot, k_rot, v, *t[5:9], rest)


def verify_ops(model_path, *, dims=None, seed=0, device_id=0, runner: Runner | None = None) -> list[OpCheck]:
    """Check every distinct fused norm, norm + linear, rotary and attention op of MODEL on the device
    against the CPU kernels. float32 attention runs in float16 on the device (the kernel's opt-in), so those
    outputs compare with float16's tolerance."""
    from otfuse.verify.diff import compare_arrays, tolerance_for

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
        cpu = cpu_kernel_outputs(case.op, case.inputs, case.attrs, case.n_outputs)
        half = case.op in ATTENTION_OPS and case.inputs[0].dtype == np.float32
        for name, want, got in zip(_output_names(case.op, case.attrs, case.n_outputs), cpu, device):
            rtol, atol = tolerance_for(np.dtype(np.float16) if half and name == "Y" else want.dtype)
            check.outputs.append(compare_arrays(name, want, np.asarray(got), rtol, atol))
        checks.append(check)
    return checks
