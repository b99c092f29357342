"""Norm-family ops in ORT's contrib ops and in standard ONNX (docs/ops.md, "Targets").

ORT: ``RMSNorm`` -> ``SimplifiedLayerNormalization`` (ORT's op in the default domain),
``AddRMSNorm`` -> ``com.microsoft.SkipSimplifiedLayerNormalization`` (rank 2/3, last axis, scale of
the input's type) or ``Add`` + ``SimplifiedLayerNormalization``; ``LayerNorm`` ->
``LayerNormalization``; ``AddLayerNorm`` -> ``com.microsoft.SkipLayerNormalization`` (rank 3, last
axis, weights of the input's type) or ``Add`` + ``LayerNormalization``.
ONNX: ``RMSNormalization`` (opset 23) and ``LayerNormalization`` (opset 17), after an ``Add``
for the residual forms.

Both normalisations compute in float32 (``stash_type = 1``). A float32 scale with a float16 /
bfloat16 input is kept float32 where the op lets its output take the scale's type
(SimplifiedLayerNormalization: ``Y`` is then float32, cast to the input's type once, as the otfuse
op rounds once; RMSNormalization, which ORT runs with one type only, reads the input widened to
float32, exactly); the LayerNorm ops want one type and refuse it.
"""

from __future__ import annotations

from otfuse.rewriter.checks import type_name
from otfuse.targets.build import MS_DOMAIN, CannotExpress, Emitter
from otfuse.targets.call import FusedCall


def _axis_is_last(em: Emitter, call: FusedCall, x: str) -> bool:
    axis, rank = call.attributes["axis"], em.graph.rank(x)
    return axis == -1 or (rank is not None and axis == rank - 1)


def _input_type(em: Emitter, call: FusedCall) -> int:
    """The normalised input's type, from the call's own input: the residual forms normalise a sum
    the emitter makes (``_residual_sum``), a value the graph index has never seen."""
    return em.graph.elem_type(call.input("X") or call.input("A"))


def _rms(em: Emitter, call: FusedCall, x: str, y: str, op_type: str, opset: int) -> None:
    scale = call.input("scale")
    tx, ts = _input_type(em, call), em.graph.elem_type(scale)
    kw = dict(axis=call.attributes["axis"], epsilon=float(call.attributes["epsilon"]), stash_type=1, opset=opset)
    if ts == tx:
        em.op(op_type, [x, scale], [y], **kw)
        return
    if op_type == "RMSNormalization":  # ORT runs the ONNX op with one type only: widen X (exact)
        x = em.cast(x, ts)
    wide = em.op1(op_type, [x, scale], **kw)  # Y takes the scale's type (float32): round once
    em.op1("Cast", [wide], y, to=tx)


def _layer(em: Emitter, call: FusedCall, x: str, y: str, opset: int) -> None:
    scale, bias = call.input("scale"), call.input("bias")
    tx = _input_type(em, call)
    for name in (scale, bias):
        if name and em.graph.elem_type(name) != tx:
            raise CannotExpress(f"LayerNormalization wants weights of the input's type; {name!r} is "
                                f"{type_name(em.graph.elem_type(name))}, the input {type_name(tx)}")
    inputs = [x, scale] + ([bias] if bias else [])
    em.op("LayerNormalization", inputs, [y], axis=call.attributes["axis"],
          epsilon=float(call.attributes["epsilon"]), stash_type=1, opset=opset)


def _residual_sum(em: Emitter, call: FusedCall) -> str:
    return em.op1("Add", [call.input("A"), call.input("B")], call.output("S") or None)


def _skip_fits(em: Emitter, call: FusedCall, ranks: tuple[int, ...]) -> bool:
    a = call.input("A")
    weights = [call.input("scale")] + ([call.input("bias")] if call.input("bias") else [])
    return (em.graph.rank(a) in ranks and _axis_is_last(em, call, a)
            and all(em.graph.elem_type(w) == em.graph.elem_type(a) and em.graph.rank(w) == 1 for w in weights))


def ort_rms_norm(em: Emitter, call: FusedCall) -> None:
    _rms(em, call, call.input("X"), call.output("Y"), "SimplifiedLayerNormalization", 0)


def ort_add_rms_norm(em: Emitter, call: FusedCall) -> None:
    if _skip_fits(em, call, (2, 3)):
        outputs = [call.output("Y")] + (["", "", call.output("S")] if call.output("S") else [])
        em.op("SkipSimplifiedLayerNormalization", [call.input("A"), call.input("B"), call.input("scale")], outputs,
              domain=MS_DOMAIN, epsilon=float(call.attributes["epsilon"]), opset=1)
        return
    _rms(em, call, _residual_sum(em, call), call.output("Y"), "SimplifiedLayerNormalization", 0)


def ort_layer_norm(em: Emitter, call: FusedCall) -> None:
    _layer(em, call, call.input("X"), call.output("Y"), 0)


def ort_add_layer_norm(em: Emitter, call: FusedCall) -> None:
    if _skip_fits(em, call, (3,)):
        outputs = [call.output("Y")] + (["", "", call.output("S")] if call.output("S") else [])
        inputs = [call.input("A"), call.input("B"), call.input("scale")] + ([call.input("bias")] if call.input("bias") else [])
        em.op("SkipLayerNormalization", inputs, outputs, domain=MS_DOMAIN,
              epsilon=float(call.attributes["epsilon"]), opset=1)
        return
    _layer(em, call, _residual_sum(em, call), call.output("Y"), 0)


def onnx_rms_norm(em: Emitter, call: FusedCall) -> None:
    _rms(em, call, call.input("X"), call.output("Y"), "RMSNormalization", 23)


def onnx_add_rms_norm(em: Emitter, call: FusedCall) -> None:
    _rms(em, call, _residual_sum(em, call), call.output("Y"), "RMSNormalization", 23)


def onnx_layer_norm(em: Emitter, call: FusedCall) -> None:
    _layer(em, call, call.input("X"), call.output("Y"), 17)


def onnx_add_layer_norm(em: Emitter, call: FusedCall) -> None:
    _layer(em, call, _residual_sum(em, call), call.output("Y"), 17)


ORT = {"RMSNorm": ort_rms_norm, "AddRMSNorm": ort_add_rms_norm, "LayerNorm": ort_layer_norm,
       "AddLayerNorm": ort_add_layer_norm}
ONNX = {"RMSNorm": onnx_rms_norm, "AddRMSNorm": onnx_add_rms_norm, "LayerNorm": onnx_layer_norm,
        "AddLayerNorm": onnx_add_layer_norm}
