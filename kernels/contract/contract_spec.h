// The ORT schema of an otfuse op, built from the contract generated out of otfuse/ops.py
// (contract/ops_contract.h, written by contract/generate.py at build time).
#pragma once

#include "common/custom_op.h"
#include "contract/ops_contract.h"

namespace otfuse {

// The contract of op `name`; throws Error when otfuse/ops.py declares no such op.
const contract::OpContract& FindContract(const char* name);

// The schema of contract op `name` for element type t: inputs and outputs in the contract's order,
// "T" ones typed t, those of other or several types UNDEFINED (the kernel checks them at run time).
// ORT lets only the last input / output be variadic, so the contract's variadic tail (norm_linear's
// W..., bias...; Y..., S, Yn) is one variadic formal: of type t if every formal in it is T.
OpSpec ContractOpSpec(const char* name, const char* execution_provider, ONNXTensorElementDataType t);

}  // namespace otfuse
