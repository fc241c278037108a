"""Constant folding gives what the device computes, bit for bit (issue #32, item 8).

A program on constants (Tensor.full: CONSTs the scheduler folds, rules/symbolic.rules fold_alu) and the same
program on a realized buffer holding the same values give the same bits (every NaN counts as one value), on the
CPU and the NUMPY device, for every unary and binary float op, in float32, float16 and float64: overflow is an
infinity of the right sign, underflow zero or a subnormal, every result rounded in its own dtype. EXP2, LOG2, SIN
and float POW are left to the device (engine/ir/alu.py DEVICE_DEFINED: each device approximates them its own
way), so there the constant's value is what the device computes too (on the CPU, LLVM folds what it is given:
the float32 libm functions go through float64 and the exp2 polynomial's steps are fmas or not by the target, so
LLVM's folding and the running code agree)."""
import math
import operator

import ml_dtypes  # noqa: F401  (registers np.dtype("bfloat16"))
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rulec import Tensor
from rulec.engine.ir.alu import DEVICE_DEFINED, FLOAT_OPS, exec_alu
from rulec.engine.ir.dtypes import dtypes
from rulec.engine.ir.ops import Ops
from rulec.engine.ir.uop import UOp
from rulec.engine.sched.symbolic import fold_constants

DEVICES = ["CPU", "NUMPY"]
DTYPES = {"float32": (dtypes.float32, 32), "float16": (dtypes.float16, 16), "float64": (dtypes.float64, 64)}
SPECIAL = [0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 0.5, 3.0, -3.0, 1000.0, -1000.0, 1025.0, 127.5, 128.0, -149.5, -150.0,
           1e-45, -1e-45, 1e-38, 6e-8, 65504.0, 3.4e38, -3.4e38, 1.7e308, -1.7e308, 5e-324, math.inf, -math.inf, math.nan]

UNARY = {"neg": operator.neg, "exp2": Tensor.exp2, "log2": Tensor.log2, "sin": Tensor.sin, "sqrt": Tensor.sqrt,
         "reciprocal": Tensor.reciprocal, "trunc": Tensor.trunc, "exp": Tensor.exp, "sigmoid": Tensor.sigmoid}
BINARY = {"add": operator.add, "sub": operator.sub, "mul": operator.mul, "truediv": operator.truediv,
          "floordiv": operator.floordiv, "mod": operator.mod, "maximum": Tensor.maximum, "pow": operator.pow,
          "lt": operator.lt, "ne": operator.ne, "eq": operator.eq}


def values(width: int):
  return st.one_of(st.sampled_from(SPECIAL), st.floats(width=width))


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
  if a.dtype != b.dtype or a.shape != b.shape: return False
  if a.dtype.kind != "f": return bool(np.array_equal(a, b))
  return bool(np.all((a.view(f"u{a.itemsize}") == b.view(f"u{b.itemsize}")) | (np.isnan(a) & np.isnan(b))))


def folded_and_computed(fn, xs, dt, device):
  """fn on constants (folded) and on realized buffers holding the same values (computed)."""
  npdt = np.dtype(dt.np_name)
  with np.errstate(all="ignore"): vals = [npdt.type(x) for x in xs]
  consts = [Tensor.full((3,), float(v), dtype=dt, device=device) for v in vals]
  bufs = [Tensor(np.full((3,), v, npdt), device=device).realize() for v in vals]
  return fn(*consts).numpy(), fn(*bufs).numpy()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", UNARY)
@settings(max_examples=20, deadline=None)
@given(data=st.data())
def test_unary_folded_is_computed(name, dtype, device, data):
  dt, width = DTYPES[dtype]
  x = data.draw(values(width), "x")
  folded, computed = folded_and_computed(UNARY[name], [x], dt, device)
  assert same_bits(folded, computed), f"{name}({x!r}) {dtype} on {device}: folded {folded[0]!r}, computed {computed[0]!r}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", BINARY)
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_binary_folded_is_computed(name, dtype, device, data):
  dt, width = DTYPES[dtype]
  x = data.draw(values(width), "x")
  # y often related to x: exact quotients and zero remainders (whose sign is the divisor's), x - x, x ** +-1
  y = data.draw(st.one_of(values(width), st.sampled_from([x, -x, 2 * x, x / 2, 1.0, -1.0])), "y")
  folded, computed = folded_and_computed(BINARY[name], [x, y], dt, device)
  assert same_bits(folded, computed), f"{x!r} {name} {y!r} {dtype} on {device}: folded {folded[0]!r}, computed {computed[0]!r}"


# cases that were folded wrongly (each also a hypothesis find): a zero remainder's sign, a quotient that rounds to
# -0.0 in float32 before the floor, trunc's -0.0, NaN // 0 (NaN) and 1 // -0.0 (-inf), overflow of each kind
CASES = [("mod", 3.0, -1.0), ("mod", -3.0, 3.0), ("mod", -0.0, 1.0), ("mod", 0.0, -150.0), ("mod", -0.0, math.inf),
         ("floordiv", -1e-45, 2.0), ("floordiv", 1e-45, -7.3), ("floordiv", math.nan, 0.0), ("floordiv", 1.0, -0.0),
         ("trunc", -0.0), ("trunc", -0.5), ("exp2", 1025.0), ("exp2", 3.4e38), ("exp", 100.0), ("sigmoid", -1000.0),
         ("pow", -2.0, 1025.0), ("pow", -7.3, 1025.0), ("pow", -0.0, -1.0), ("pow", -1e-45, -7.3), ("pow", 0.1, -1.0),
         ("sin", 1.0), ("sin", 128.0), ("pow", 128.0, 7.3), ("mul", 3e38, -10.0), ("truediv", -1.0, 0.0)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}{c[1:]}")
def test_known_cases(case, dtype, device):
  name, *xs = case
  folded, computed = folded_and_computed(UNARY.get(name) or BINARY[name], xs, DTYPES[dtype][0], device)
  assert same_bits(folded, computed), f"{case} {dtype} on {device}: folded {folded[0]!r}, computed {computed[0]!r}"


@pytest.mark.parametrize("device", DEVICES)
def test_issue_examples(device):
  # exp of a large constant is inf (Python's 2.0 ** 1442.7 raises OverflowError: it used to fold to NaN), the
  # sigmoid of a very negative one 0, and an odd power of a negative base past the range -inf
  assert np.array_equal(Tensor.full((2,), 1000.0, device=device).exp().numpy(), [np.inf, np.inf])
  assert same_bits(Tensor.full((2,), -1000.0, device=device).sigmoid().numpy(), np.zeros(2, np.float32))
  assert np.array_equal((Tensor.full((2,), -2.0, device=device) ** 1025).numpy(), [-np.inf, -np.inf])


def test_exec_alu_rounds_in_the_dtype():
  f32, f16 = dtypes.float32, dtypes.float16
  assert exec_alu(Ops.EXP2, f32, [1000.0]) == math.inf
  assert exec_alu(Ops.POW, f32, [-2.0, 1025.0]) == -math.inf
  assert exec_alu(Ops.POW, dtypes.float64, [-2.0, 1025.0]) == -math.inf
  assert exec_alu(Ops.MUL, f32, [3e38, 10.0]) == math.inf and exec_alu(Ops.MUL, f32, [-3e38, 10.0]) == -math.inf
  assert exec_alu(Ops.MUL, f16, [300.0, 300.0]) == math.inf
  # the quotient rounds to float32 (-0.0) before the floor: 0.0, not -1.0 (float64's quotient is below zero)
  assert exec_alu(Ops.IDIV, f32, [-1e-45, 2.0]) == 0.0
  assert math.isnan(exec_alu(Ops.ADD, f32, [math.inf, -math.inf]))
  assert math.copysign(1.0, exec_alu(Ops.MOD, f32, [3.0, -1.0])) == -1.0   # a zero remainder has the divisor's sign
  assert math.copysign(1.0, exec_alu(Ops.TRUNC, f32, [-0.25])) == 1.0      # trunc never gives -0.0
  assert exec_alu(Ops.ADD, f32, [1.0, 2.0 ** -24]) == 1.0                   # rounded to float32, not float64
  assert exec_alu(Ops.ADD, dtypes.int8, [100, 100]) == -56                  # integers still wrap


@pytest.mark.parametrize("op", sorted(FLOAT_OPS - {Ops.MULACC}, key=lambda o: o.name))
def test_fold_refuses_only_device_defined_ops(op):
  n = 1 if op in (Ops.NEG, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.RECIPROCAL, Ops.TRUNC) else 2
  for dt in (dtypes.float32, dtypes.float16, dtypes.float64):
    u = UOp(op, dt, tuple(UOp.const(dt, 1.5) for _ in range(n)))
    folded = fold_constants(u)
    assert (folded is None) == (op in DEVICE_DEFINED), f"{op} {dt.name}: {folded!r}"
  # on integers every op folds (the device computes those exactly)
  assert fold_constants(UOp(Ops.POW, dtypes.int32, (UOp.const(dtypes.int32, 3), UOp.const(dtypes.int32, 4)))).arg == 81
