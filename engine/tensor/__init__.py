"""The Tensor front end: lazy tensors that build tensor-level UOp graphs.

    from rulec import Tensor, dtypes
    x = Tensor([[1.0, 2.0], [3.0, 4.0]])
    y = (x @ x.T).softmax().sum(axis=0)
    y.numpy()

A Tensor holds `.uop` (a tensor-level UOp, see docs/architecture.md) and its
device string. Operations only build graphs; `realize()` (or `numpy()`,
`tolist()`, `item()`) computes them through `engine.realize`, and replaces the
tensor's uop with the realized view (`BUFFER.reshape(shape)`), so later graphs
start from the buffer.

Conventions of the graphs built here: elementwise ops get operands of equal
shape (broadcast with RESHAPE + EXPAND) and equal dtype (CAST to the promoted
dtype first); comparisons give bool; reductions are REDUCE_AXIS with keepdim
shapes, followed by a RESHAPE when keepdim=False; transcendentals are built
from EXP2, LOG2, SIN, SQRT, RECIPROCAL.

Types follow numpy 2 (NEP 50) with two changes: the default float is float32
and the default int is int32. Concretely:

- Tensor + Tensor promotes like numpy (`np.result_type`), e.g. int32 + float32
  gives float64, uint8 + int8 gives int16.
- Python scalars are weak: `int8 + 1` stays int8, `float16 + 1.0` stays
  float16, `int32 + 1.5` gives float32 (numpy: float64), `bool + 1` gives
  int32 (numpy: int64). A Python int that does not fit the tensor's integer
  dtype raises OverflowError, as in numpy.
- bool arithmetic is numpy's: `+` is logical or, `*` logical and, `-` and
  unary `-` raise TypeError; `//`, `%`, `**` of bools give int8.
- `/` of ints or bools gives float32 (numpy: float64); so do exp, log, sqrt,
  sin, cos, tanh, sigmoid, mean, var, std, softmax of ints (numpy: float64).
- float16 transcendentals (exp, log, sin, cos, tanh, sigmoid, ...) and float16
  mean/var/std/softmax/log_softmax/layernorm are computed in float32 and
  rounded to float16 (numpy's float16 ufuncs do the same).
- sum/prod of bool, int8, int16, int32 give int32, of uint8, uint16, uint32
  give uint32 (numpy: int64 / uint64); int64, uint64 and floats keep their
  dtype. argmax/argmin give int32 (numpy: int64).
- Nested lists of Python ints become int32 (int64 if a value does not fit),
  of floats float32; numpy arrays keep their dtype.
- `int ** negative int` with a Python exponent raises ValueError like numpy;
  with a tensor exponent it gives 1 for base 1, +-1 for base -1, else 0.
- max/min over an axis of size 0 raise ValueError, as in numpy.
- `//` on floats is the IR's IDIV, floor(a / b) of the rounded quotient
  (engine/alu.py); numpy (and Python) compute it from the remainder, so the
  two can differ by one where the rounding of a / b crosses an integer
  (1.0 // 0.1 is 10.0 here, 9.0 in numpy). `%` on floats is numpy's.
- NaNs propagate through maximum, minimum, clip, max, min and max_pool2d as
  in numpy (the IR's MAX keeps its first operand when the second is NaN and
  its reduction skips NaNs, so these add explicit NaN checks).

Bad input raises at the call that passes it (ValueError, IndexError, TypeError
with a message naming the shapes, axes or values involved): the checks are in
engine/tensor/args.py, the UOp builders the methods share in
engine/tensor/uops.py.
"""
from engine.tensor.args import AxisError, broadcast_shapes, promote_types, to_dtype
from engine.tensor.tensor import Tensor
from runtime.devices import DEVICES

__all__ = ["Tensor", "DEVICES", "AxisError", "broadcast_shapes", "promote_types", "to_dtype"]
