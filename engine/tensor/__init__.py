"""The Tensor front end: lazy tensors that build tensor-level UOp graphs.

    from rulec import Tensor, dtypes
    x = Tensor([[1.0, 2.0], [3.0, 4.0]])
    y = (x @ x.T).softmax().sum(axis=0)
    y.numpy()

A Tensor holds `.uop` (a tensor-level UOp, see docs/architecture.md) and its
device string. Operations only build graphs; `realize()` (or `numpy()`,
`tolist()`, `item()`) computes them through `rulec.engine.realize`, and replaces the
tensor's uop with the realized view (`BUFFER.reshape(shape)`), so later graphs
start from the buffer.

Conventions of the graphs built here: elementwise ops get operands of equal
shape (broadcast with RESHAPE + EXPAND) and equal dtype (CAST to the promoted
dtype first); comparisons give bool; reductions are REDUCE_AXIS with keepdim
shapes, followed by a RESHAPE when keepdim=False; transcendentals are built
from EXP2, LOG2, SIN, SQRT, RECIPROCAL.

Types follow tinygrad 0.14 (default float float32, default int int32). Concretely:

- Tensor + Tensor promotes in tinygrad's lattice (`promote_types`): the widest
  float if there is one (int32 + float32 gives float32, int64 + float16
  float16); else the narrowest int holding both ranges (uint8 + int8 gives
  int16, uint32 + int32 int64); a signed int with uint64 gives float32
  (tinygrad's weak default float; rulec has no weak dtypes). bool is below all.
- Python scalars are weak: `int8 + 1` stays int8, `float16 + 1.0` stays
  float16, `int32 + 1.5` gives float32, `bool + 1` gives int32. A Python int
  that does not fit the tensor's integer dtype wraps around (int8 + 300 adds
  44), as in tinygrad (numpy raises OverflowError).
- bool arithmetic is tinygrad's: `+` is or, `*` and, unary `-` not, `a - b`
  and `a ** b` are `a or not b`; `//` and `%` of bools give float32; relu,
  floor and ceil of bools give int32.
- `/` of ints or bools gives float32; so do exp, log, sqrt, sin, cos, tanh,
  sigmoid, mean, var, std, softmax of ints.
- float16 transcendentals (exp, log, sin, cos, tanh, sigmoid, ...) and float16
  mean/var/std/softmax/log_softmax/layernorm are computed in float32 and
  rounded to float16.
- sum of bool, int8, int16, int32 gives int32, of uint8, uint16, uint32
  uint32; int64, uint64 and floats keep their dtype. prod keeps the dtype.
  argmax/argmin give int32.
- Nested lists of Python ints become int32 (int64 if a value does not fit),
  of floats float32; numpy arrays keep their dtype. Dtype names are tinygrad's
  too (`'int'`, `'half'`, `'long'`, any case; `dtypes.int`, `dtypes.float`).
- `int ** negative Python int` raises DTypeError (a RuntimeError, as in
  tinygrad: "base needs to be float"); with a tensor exponent it gives 1 for
  base 1, +-1 for base -1, else 0.
- max/min over an axis of size 0 give the identity (the dtype's lowest /
  highest value, -inf / inf for floats), as in tinygrad; argmax/argmin of an
  empty axis raise ValueError.
- Keywords are tinygrad's: `sum(axis=None, keepdim=False, dtype=None)`,
  `var/std(axis, keepdim, correction=1)` (the sample variance by default,
  unlike numpy), `cat/stack(*args, dim=0)`, `squeeze(dim)`, `unsqueeze(dim)`,
  `transpose(dim0=1, dim1=0)`, `pad(padding, mode, value)`; rulec's older
  `axis=` (for dim) and `ddof=` (for correction) stay as aliases. A 0-d
  tensor takes axis 0 and -1 in reductions.
- `//` on floats is the IR's IDIV, floor(a / b) of the rounded quotient
  (engine/ir/alu.py); numpy (and Python) compute it from the remainder, so the
  two can differ by one where the rounding of a / b crosses an integer
  (1.0 // 0.1 is 10.0 here, 9.0 in numpy). `%` on floats is numpy's.
- NaNs propagate through maximum, minimum, clip, max and min as in numpy (the
  IR's MAX keeps its first operand when the second is NaN and its reduction
  skips NaNs, so these add explicit NaN checks). max_pool2d skips NaNs, as
  tinygrad's does: one reduce per window, and its backward needs no second one.

Bad input raises at the call that passes it, with the exception class tinygrad
raises (ShapeError is a ValueError and RuntimeError, AxisError an IndexError,
DuplicateAxisError also a RuntimeError, DTypeNameError an AttributeError and
TypeError) and a message naming the shapes, axes or values involved: the checks are in
engine/tensor/args.py, the UOp builders the methods share in
engine/tensor/uops.py.
"""
from rulec.engine.tensor.args import (AxisError, DTypeError, DTypeNameError, DuplicateAxisError, ShapeError,
                                broadcast_shapes, promote_types, to_dtype)
from rulec.engine.tensor.tensor import Tensor
from rulec.runtime.devices import DEVICES

__all__ = ["Tensor", "DEVICES", "AxisError", "DTypeError", "DTypeNameError", "DuplicateAxisError", "ShapeError",
           "broadcast_shapes", "promote_types", "to_dtype"]
