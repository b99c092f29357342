"""Every otfuse op, declared once: its inputs and outputs by name (in order, optional or variadic),
its attributes (type and default) and its element types. docs/ops.md is the prose of the same
contract, and ``tests/test_ops_contract.py`` checks its tables against this file.

The rules build their fused nodes through it (``ops.Attention(Q=q, K=k, V=v, num_heads=8, Y=y)``
orders the inputs and outputs, drops trailing empty optional ones and refuses unknown names);
``verify/ops_on_npu.py`` and ``verify/reference.py`` read positions and defaults from it. It is a
plain table on purpose, importing nothing, so that a small generator can read it (the C++ schema
is to be generated from it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# Element types: ``T`` is any of FLOAT_TYPES, the same for every input and output typed ``T``.
FLOAT_TYPES = ("float32", "float16", "bfloat16")
T = "T"


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED = _Required()


@dataclass(frozen=True)
class SameAs:
    """A default that is another attribute's value (``kv_num_heads`` defaults to ``num_heads``)."""

    attribute: str


@dataclass(frozen=True)
class ZerosLike:
    """A per-projection ints default: as many zeros as ``attribute`` has entries."""

    attribute: str


@dataclass(frozen=True)
class Input:
    name: str
    types: tuple[str, ...] = (T,)  # "T", or concrete type names
    optional: bool = False  # may be left out (an empty name when an input after it is given)
    variadic: bool = False  # any number of values (a list), one formal in the schema


@dataclass(frozen=True)
class Output:
    name: str
    types: tuple[str, ...] = (T,)
    optional: bool = False
    variadic: bool = False


@dataclass(frozen=True)
class Attribute:
    name: str
    type: str  # "int", "float", "string", "ints"
    default: object = REQUIRED  # a value, REQUIRED, SameAs(...) or ZerosLike(...)


# What a Python value must be for each attribute type (onnx.helper.make_attribute infers the
# attribute's type from the value, so an int given for a float attribute would change the model).
_ATTRIBUTE_CHECKS = {
    "int": lambda v: _is_int(v),
    "float": lambda v: _is_float(v),
    "string": lambda v: isinstance(v, str),
    "ints": lambda v: isinstance(v, Sequence) and not isinstance(v, str) and all(_is_int(i) for i in v),
}


def _is_int(value) -> bool:
    return not isinstance(value, bool) and (isinstance(value, int) or type(value).__name__.startswith(("int", "uint")))


def _is_float(value) -> bool:
    return isinstance(value, float) or type(value).__name__ in ("float16", "float32", "float64")


@dataclass(frozen=True)
class Call:
    """One use of an op, checked against its declaration: ``inputs`` and ``outputs`` positional
    (in the contract's order, variadic ones spread, trailing empty optional ones dropped), by
    name in ``named_inputs`` / ``named_outputs``, and the attributes as given."""

    op: str
    inputs: tuple
    outputs: tuple
    attributes: Mapping[str, object]
    named_inputs: Mapping[str, object]
    named_outputs: Mapping[str, object]


@dataclass(frozen=True)
class Op:
    name: str
    family: str
    inputs: tuple[Input, ...]
    outputs: tuple[Output, ...]
    attributes: tuple[Attribute, ...] = ()
    doc: str = ""

    def __post_init__(self) -> None:
        names = [i.name for i in self.inputs] + [o.name for o in self.outputs] + [a.name for a in self.attributes]
        if len(set(names)) != len(names):
            raise ValueError(f"{self.name}: an input, output or attribute name is used twice: {names}")

    def input_index(self, name: str) -> int:
        """Position of input ``name`` when every input before it is given once (no variadic)."""
        return [i.name for i in self.inputs].index(name)

    def output_names(self) -> tuple[str, ...]:
        return tuple(o.name for o in self.outputs)

    def attribute(self, name: str) -> Attribute:
        for attribute in self.attributes:
            if attribute.name == name:
                return attribute
        raise KeyError(f"{self.name} has no attribute {name!r}")

    def default(self, name: str):
        """The default of attribute ``name`` (a value, or SameAs / ZerosLike)."""
        return self.attribute(name).default

    def __call__(self, **named) -> Call:
        """Check ``named`` (inputs, outputs and attributes by their contract names; an optional
        input or output that is not there may be given as "" or None, an attribute as None) and
        order it."""
        inputs = {i.name: named.pop(i.name) for i in self.inputs if i.name in named}
        outputs = {o.name: named.pop(o.name) for o in self.outputs if o.name in named}
        known = {a.name: a for a in self.attributes}
        unknown = sorted(set(named) - set(known))
        if unknown:
            raise TypeError(f"{self.name} has no input, output or attribute {', '.join(map(repr, unknown))}")
        for name, value in named.items():
            if value is not None and not _ATTRIBUTE_CHECKS[known[name].type](value):
                raise TypeError(f"{self.name} attribute {name!r} is {known[name].type}, got {value!r}")
        for attribute in self.attributes:
            if attribute.default is REQUIRED and named.get(attribute.name) is None:
                raise TypeError(f"{self.name} needs the attribute {attribute.name!r}")
        attributes = {name: value for name, value in named.items() if value is not None}
        return Call(self.name, _positional(self.name, self.inputs, inputs),
                    _positional(self.name, self.outputs, outputs), attributes, inputs, outputs)


def _positional(op: str, formals, given: dict) -> tuple:
    values: list = []
    for formal in formals:
        value = given.get(formal.name)
        if formal.variadic:
            values.extend(value or ())
            continue
        if value is None or value == "":
            if not formal.optional:
                raise TypeError(f"{op} needs {formal.name!r}")
            value = ""
        values.append(value)
    while values and values[-1] == "":
        values.pop()
    return tuple(values)


def _op(name: str, family: str, inputs, outputs, attributes=(), doc: str = "") -> Op:
    return Op(name, family, tuple(inputs), tuple(outputs), tuple(attributes), doc)


# -- norm family ------------------------------------------------------------------------------
_WEIGHT = (T, "float32")


def _norm_attributes(epsilon: float) -> tuple[Attribute, ...]:
    return (Attribute("epsilon", "float", epsilon), Attribute("axis", "int", -1))


RMSNorm = _op("RMSNorm", "norm", [Input("X"), Input("scale", _WEIGHT)], [Output("Y")], _norm_attributes(1e-6),
              "Y = X / sqrt(mean(X^2) + epsilon) * scale over the axes [axis, rank)")
AddRMSNorm = _op("AddRMSNorm", "norm", [Input("A"), Input("B"), Input("scale", _WEIGHT)],
                 [Output("Y"), Output("S", optional=True)], _norm_attributes(1e-6), "S = A + B; Y = RMSNorm(S)")
LayerNorm = _op("LayerNorm", "norm", [Input("X"), Input("scale", _WEIGHT), Input("bias", _WEIGHT, optional=True)],
                [Output("Y")], _norm_attributes(1e-5), "Y = (X - mean) / sqrt(var + epsilon) * scale + bias")
AddLayerNorm = _op("AddLayerNorm", "norm", [Input("A"), Input("B"), Input("scale", _WEIGHT),
                                            Input("bias", _WEIGHT, optional=True)],
                   [Output("Y"), Output("S", optional=True)], _norm_attributes(1e-5), "S = A + B; Y = LayerNorm(S)")


# -- norm + linear family -----------------------------------------------------------------------
def _norm_linear(name: str, norm: Op) -> Op:
    """The norm op's inputs (a LayerNorm's bias named norm_bias), then the projections' weights
    and biases; outputs Y_1..Y_n, the residual sum (Add forms, always) and Yn (optional)."""
    leading = [Input("norm_bias", _WEIGHT, optional=True) if i.name == "bias" else i for i in norm.inputs]
    outputs = [Output("Y", variadic=True)]
    if any(o.name == "S" for o in norm.outputs):
        outputs.append(Output("S"))
    outputs.append(Output("Yn", optional=True))
    epsilon = norm.default("epsilon")
    attributes = (Attribute("epsilon", "float", epsilon), Attribute("axis", "int", -1),
                  Attribute("out_features", "ints"), Attribute("transposed", "ints", ZerosLike("out_features")),
                  Attribute("has_bias", "ints", ZerosLike("out_features")),
                  Attribute("shared_weight", "ints", ZerosLike("out_features")))
    return _op(name, "norm_linear", [*leading, Input("W", variadic=True), Input("bias", _WEIGHT, variadic=True)],
               outputs, attributes, f"{norm.name}, then Y_i = Yn @ W_i (+ bias_i) for every projection")


RMSNormLinear = _norm_linear("RMSNormLinear", RMSNorm)
AddRMSNormLinear = _norm_linear("AddRMSNormLinear", AddRMSNorm)
LayerNormLinear = _norm_linear("LayerNormLinear", LayerNorm)
AddLayerNormLinear = _norm_linear("AddLayerNormLinear", AddLayerNorm)


# -- rotary embedding family --------------------------------------------------------------------
ROTARY_ATTRIBUTES = (Attribute("mode", "string", "half"), Attribute("rotary_dim", "int", 0),
                     Attribute("sections", "ints", ()))
_TABLE = (T, "float32")

RotaryEmbedding = _op("RotaryEmbedding", "rope", [Input("X"), Input("cos", _TABLE), Input("sin", _TABLE)],
                      [Output("Y")], ROTARY_ATTRIBUTES, "Y = cos * X + sin * (M X) on the rotary lanes")
RotaryEmbeddingQK = _op("RotaryEmbeddingQK", "rope",
                        [Input("Q"), Input("K"), Input("cos", _TABLE), Input("sin", _TABLE)],
                        [Output("Q_out"), Output("K_out")], ROTARY_ATTRIBUTES,
                        "RotaryEmbedding of Q and of K by the same tables")


# -- attention family ---------------------------------------------------------------------------
ATTENTION_ATTRIBUTES = (
    Attribute("num_heads", "int"),
    Attribute("kv_num_heads", "int", SameAs("num_heads")),
    Attribute("scale", "float", 0.0),
    Attribute("causal", "int", 0),
    Attribute("window", "int", 0),
    Attribute("softcap", "float", 0.0),
    Attribute("layout", "string", "BNSD"),
    Attribute("output_layout", "string", SameAs("layout")),
    Attribute("empty_rows", "string", "zero"),
    Attribute("alibi_positions", "string", "index"),
    Attribute("alibi_round", "int", 0),
)
_ATTENTION_TAIL = (Input("attn_bias", (T, "float32"), optional=True),
                   Input("key_padding_mask", ("int64", "int32", "bool"), optional=True),
                   Input("past_key", optional=True), Input("past_value", optional=True),
                   Input("alibi_slopes", ("float32",), optional=True),
                   Input("sinks", ("float32",), optional=True))
_ATTENTION_OUTPUTS = (Output("Y"), Output("present_key", optional=True), Output("present_value", optional=True))

Attention = _op("Attention", "attention", [Input("Q"), Input("K"), Input("V"), *_ATTENTION_TAIL],
                _ATTENTION_OUTPUTS, ATTENTION_ATTRIBUTES, "softmax(scale * Q K^T + ALiBi + bias, masked; + sink_h in the denominator) V")
RopeAttention = _op("RopeAttention", "attention",
                    [Input("Q"), Input("K"), Input("V"), Input("cos", _TABLE), Input("sin", _TABLE), *_ATTENTION_TAIL],
                    _ATTENTION_OUTPUTS,
                    ATTENTION_ATTRIBUTES + (Attribute("rotary_mode", "string", "half"),
                                            Attribute("rotary_dim", "int", 0),
                                            Attribute("rotary_sections", "ints", ())),
                    "Attention(RotaryEmbedding(Q), RotaryEmbedding(K), V, ...)")



# -- activation family --------------------------------------------------------------------------
_APPROXIMATE = Attribute("approximate", "string", "none")
_GATE_HALF = Attribute("gate_half", "int", 0)
_GATED_INPUTS = (Input("A"), Input("B", optional=True))

Gelu = _op("Gelu", "activation", [Input("X")], [Output("Y")], (_APPROXIMATE,),
           "Y = X * Phi(X), Phi by erf (none) or its tanh approximation (tanh)")
QuickGelu = _op("QuickGelu", "activation", [Input("X")], [Output("Y")], (Attribute("alpha", "float", 1.702),),
                "Y = X * sigmoid(alpha * X)")
SiLU = _op("SiLU", "activation", [Input("X")], [Output("Y")], (), "Y = X * sigmoid(X)")
ReluSquared = _op("ReluSquared", "activation", [Input("X")], [Output("Y")], (), "Y = max(X, 0)^2")
SwiGLU = _op("SwiGLU", "activation", _GATED_INPUTS, [Output("Y")], (_GATE_HALF,),
             "Y = SiLU(gate) * up; gate, up = A, B or the halves of A's last axis")
GeGLU = _op("GeGLU", "activation", _GATED_INPUTS, [Output("Y")], (_APPROXIMATE, _GATE_HALF),
            "Y = Gelu(gate) * up; gate, up = A, B or the halves of A's last axis")

OPS: dict[str, Op] = {op.name: op for op in (
    RMSNorm, AddRMSNorm, LayerNorm, AddLayerNorm,
    RMSNormLinear, AddRMSNormLinear, LayerNormLinear, AddLayerNormLinear,
    RotaryEmbedding, RotaryEmbeddingQK,
    Attention, RopeAttention,
    Gelu, QuickGelu, SiLU, ReluSquared, SwiGLU, GeGLU,
)}


def get(name: str) -> Op:
    return OPS[name]


__all__ = ["OPS", "Op", "Input", "Output", "Attribute", "Call", "REQUIRED", "SameAs", "ZerosLike", "get",
           "FLOAT_TYPES", "T"]
