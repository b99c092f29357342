"""Randomised cases for every op in docs/ops.md, run by tests/kernels/test_fuzz.py.

One module per op family (norm, norm_linear, rotary, attention) makes, from a seeded generator,
either a valid case (random shapes, dtypes, attributes and optional inputs, with the numpy
reference's outputs) or an invalid one (one mutation of a valid case: a wrong rank, a mismatched
dim, an attribute out of range, a missing input, a wrong dtype, dims whose strides overflow...)
with the error it must produce. `case` holds what a case is, `model` builds and runs it.
"""
