"""The schemas the built library registers come from otfuse/ops.py (kernels/contract/generate.py
writes them into a header at build time): for every op, a node with every declared input loads in
ORT, one with an input too many is refused, and each element type ops.py names for an input is
accepted. A schema restated by hand in C++ would drift from the contract; this fails when it does."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

import otfuse
from otfuse import ops
from otfuse.domain import OP_DOMAIN, OP_DOMAIN_VERSION

_ELEM = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "int64": TensorProto.INT64,
         "int32": TensorProto.INT32, "bool": TensorProto.BOOL}
_REQUIRED_ATTRIBUTES = {"num_heads": 1, "out_features": [4]}
FIXED = [name for name, op in sorted(ops.OPS.items()) if not any(f.variadic for f in op.inputs)]


def _model(op: ops.Op, elem: dict[str, int], extra_input: bool = False) -> onnx.ModelProto:
    names = [f.name for f in op.inputs] + (["extra"] if extra_input else [])
    inputs = [helper.make_tensor_value_info(n, elem.get(n, TensorProto.FLOAT), None) for n in names]
    outputs = [helper.make_tensor_value_info(f"{f.name}_out", TensorProto.FLOAT, None) for f in op.outputs]
    attributes = {a.name: _REQUIRED_ATTRIBUTES[a.name] for a in op.attributes if a.default is ops.REQUIRED}
    node = helper.make_node(op.name, names, [o.name for o in outputs], domain=OP_DOMAIN, **attributes)
    graph = helper.make_graph([node], "contract", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                   helper.make_opsetid(OP_DOMAIN, OP_DOMAIN_VERSION)], ir_version=9)


def _loads(model: onnx.ModelProto) -> str | None:
    try:
        otfuse.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as error:  # ORT raises its own exception types
        return str(error)
    return None


@pytest.mark.parametrize("name", FIXED)
def test_a_node_with_every_declared_input_loads(name):
    assert _loads(_model(ops.get(name), {})) is None


@pytest.mark.parametrize("name", FIXED)
def test_an_input_beyond_the_contract_is_refused(name):
    assert _loads(_model(ops.get(name), {}, extra_input=True)) is not None


@pytest.mark.parametrize("name", FIXED)
def test_every_type_the_contract_names_for_an_input_is_accepted(name):
    op = ops.get(name)
    for formal in op.inputs:
        for type_name in formal.types:
            if type_name == ops.T:
                continue
            error = _loads(_model(op, {formal.name: _ELEM[type_name]}))
            assert error is None, (name, formal.name, type_name, error)
