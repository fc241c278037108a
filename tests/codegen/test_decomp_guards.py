"""Integer division, remainder and shifts are guarded once, by rules/decomp.rules, for both backends.

The IR's meaning (engine/ir/alu.py): x // 0 and x % 0 are 0, INT_MIN // -1 wraps, a negative shift amount leaves
x alone, a shift past the width shifts every bit out (a signed right shift leaves the sign). C and LLVM leave all
of these undefined, so the decomp rules wrap an op that may meet one and hand the renderers an operand that
cannot (a CDIV / CMOD / SHL / SHR with arg "guarded"); the renderers print the machine's own instruction. Checked
on every integer dtype, array and constant operands, against the NUMPY reference device (which runs kernels as
they are, with alu.py's semantics), on the CPU and on CL; and by structure: what gets a guard and what does not.
"""
import operator

import ml_dtypes  # noqa: F401  (registers np.dtype("bfloat16"))
import numpy as np
import pytest

from rulec.codegen.decomp import decomposed
from rulec.engine.ir.dtypes import dtypes
from rulec.engine.ir.ops import Ops
from rulec.engine.ir.uop import UOp
from rulec.engine.tensor import Tensor
from tests.helpers import same_as_reference

INTS = [dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64, dtypes.uint8, dtypes.uint16, dtypes.uint32, dtypes.uint64]


def _devices() -> list[str]:
  """The CPU, and CL where pyopencl finds a device (PoCL on CPU machines)."""
  try:
    from rulec.runtime import cl_device
    cl_device.get_device()
  except Exception: return ["CPU"]   # no pyopencl, or no OpenCL device: CL is tested where there is one
  return ["CPU", "CL"]


DEVICES = _devices()


def _edges(d) -> np.ndarray:
  info = np.iinfo(d.np_name)
  vals = [0, 1, 2, 3, 7, info.max, info.max - 1, info.min]
  if info.min < 0: vals += [-1, -2, -7, info.min + 1]
  return np.array(vals, dtype=d.np_name)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("d", INTS, ids=lambda d: d.name)
def test_division_and_remainder_by_every_edge_value(device, d):
  a = _edges(d)
  x, y = np.repeat(a, len(a)), np.tile(a, len(a))   # every pair, zero and -1 divisors and INT_MIN included
  for op in (operator.floordiv, operator.mod):
    got = same_as_reference(device, x, d, lambda t: op(t, Tensor(y, dtype=d, device=t.device)))
    nz = y != 0
    with np.errstate(all="ignore"): np.testing.assert_array_equal(got[nz], op(x, y)[nz])
    assert (got[~nz] == 0).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("d", INTS, ids=lambda d: d.name)
def test_constant_divisors(device, d):
  a = _edges(d)
  for c in ([0, 1, 3] + ([-1, -3] if np.iinfo(d.np_name).min < 0 else [])):
    for op in (operator.floordiv, operator.mod):
      got = same_as_reference(device, a, d, lambda t: op(t, c))
      if c == 0: assert (got == 0).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("d", INTS, ids=lambda d: d.name)
def test_shifts_by_every_amount(device, d):
  bits = d.itemsize * 8
  amounts = [0, 1, bits // 2, bits - 1, bits, bits + 3] + ([-1, -bits] if np.iinfo(d.np_name).min < 0 else [])
  a = _edges(d)
  x, n = np.repeat(a, len(amounts)), np.tile(np.array(amounts).astype(d.np_name), len(a))
  for op in (operator.lshift, operator.rshift):
    same_as_reference(device, x, d, lambda t: op(t, Tensor(n, dtype=d, device=t.device)))
  for k in amounts:   # constant amounts
    for op in (operator.lshift, operator.rshift):
      same_as_reference(device, a, d, lambda t: op(t, k))


def _var(name, lo, hi, d=dtypes.int32): return UOp.variable(name, lo, hi, d)


def _decomposed(expr: UOp) -> UOp:
  from rulec.engine.lang.loader import load_library
  from rulec.engine.ir.rewrite import graph_rewrite
  return graph_rewrite(expr, load_library().matcher("decomp"), ctx=frozenset())


def _guarded(u: UOp) -> list[UOp]: return [n for n in u.toposort() if n.arg == "guarded" and n.op in (Ops.CDIV, Ops.CMOD, Ops.SHL, Ops.SHR)]


def test_only_what_may_meet_an_undefined_case_is_guarded():
  x = _var("x", -100, 100)
  # divisors whose bounds exclude 0 and -1: no guard
  for y in (_var("y", 1, 9), _var("y", -9, -2)):
    out = _decomposed(UOp(Ops.CDIV, dtypes.int32, (x, y)))
    assert not _guarded(out) and out.op is Ops.CDIV
  # a divisor that may be 0 or -1: one guarded division, and the result stays guarded after a second pass
  y = _var("y", -3, 3)
  for op in (Ops.CDIV, Ops.CMOD):
    out = _decomposed(UOp(op, dtypes.int32, (x, y)))
    (g,) = _guarded(out)
    assert g.op is op and _decomposed(out) is out
  # unsigned: only zero matters
  xu, yu = _var("x", 0, 100, dtypes.uint32), _var("y", 0, 5, dtypes.uint32)
  assert len(_guarded(_decomposed(UOp(Ops.CDIV, dtypes.uint32, (xu, yu))))) == 1
  assert not _guarded(_decomposed(UOp(Ops.CDIV, dtypes.uint32, (xu, _var("y", 1, 5, dtypes.uint32)))))
  # shifts: an amount within [0, width) needs none; one that may leave it does
  assert not _guarded(_decomposed(UOp(Ops.SHL, dtypes.int32, (x, _var("n", 0, 31)))))
  assert _guarded(_decomposed(UOp(Ops.SHL, dtypes.int32, (x, _var("n", 0, 32)))))
  assert _guarded(_decomposed(UOp(Ops.SHR, dtypes.int32, (x, _var("n", -1, 5)))))


def test_a_scheduled_kernel_is_guarded_where_its_divisor_may_be_zero():
  """In a whole kernel: a divisor read from a buffer may be anything (one guarded division); a divisor built from
  the kernel's own ranges, known to be at least 1, gets none (the renderers used to guard every division). A
  signed floor division is a truncating division and a remainder (its sign fix-up), both guarded."""
  a = Tensor(np.arange(1, 65, dtype=np.int32).reshape(8, 8), device="NUMPY")
  (k,) = (a // Tensor.arange(1, 9, dtype=dtypes.int32, device="NUMPY")).schedule()
  assert not [n for n in decomposed(k).ast.toposort() if n.arg == "guarded"]
  (k,) = (a // a.flip(0)).schedule()
  assert sorted(n.op.name for n in decomposed(k).ast.toposort() if n.arg == "guarded") == ["CDIV", "CMOD"]
