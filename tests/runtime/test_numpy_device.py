"""The NUMPY reference device and the Kernel structure: hand-built kernels against numpy and rulec.engine.ir.alu."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, strategies as st

from rulec.engine.ir.alu import exec_alu, wrap
from rulec.engine.ir.dtypes import DType, dtypes
from rulec.engine.ir.ops import Ops
from rulec.engine.ir.uop import UOp
from rulec.runtime import numpy_device
from rulec.runtime.buffer import buffer_of, new_buffer, np_dtype
from rulec.engine.ir.kernel import Kernel, validate
from rulec.runtime.numpy_device import _Run, run_kernel, run_schedule

IDX = dtypes.index


# *** helpers ***

def buf(data, dtype: DType) -> UOp:
  arr = np.asarray(data)
  b = new_buffer("NUMPY", arr.size, dtype)
  buffer_of(b).copyin(arr.astype(np_dtype(dtype)))
  return b


def empty(size: int, dtype: DType, fill=0) -> UOp:
  b = new_buffer("NUMPY", size, dtype)
  buffer_of(b).copyin(np.full(size, fill, dtype=np_dtype(dtype)))
  return b


def param(slot: int, b: UOp) -> UOp: return UOp(Ops.PARAM, b.dtype, (), (slot, b.arg[2]))
def params(bufs) -> list[UOp]: return [param(i, b) for i, b in enumerate(bufs)]
def read(b: UOp) -> np.ndarray: return buffer_of(b).numpy_view().copy()
def c(v, dtype: DType = IDX) -> UOp: return UOp.const(dtype, v)
def red(value: UOp, op: Ops, *ranges: UOp) -> UOp: return UOp(Ops.REDUCE, value.dtype, (value, *ranges), op)


def run(bufs, *stores) -> Kernel:
  k = Kernel(UOp.sink(*stores), tuple(bufs))
  run_kernel(k)
  return k


def elementwise(build, inputs: list[np.ndarray], in_dts: list[DType], out_dt: DType) -> np.ndarray:
  """out[r] = build(*[in_i[r]]) over len(inputs[0]) elements."""
  n = len(inputs[0])
  out = empty(n, out_dt)
  bufs = [out] + [buf(a, dt) for a, dt in zip(inputs, in_dts)]
  ps = params(bufs)
  r = UOp.range(n, 0)
  run(bufs, ps[0].index(r).store(build(*[p.index(r) for p in ps[1:]])).end(r))
  return read(out)


NUMERIC = [dtypes.float32, dtypes.float64, dtypes.int8, dtypes.uint8, dtypes.int32, dtypes.int64, dtypes.uint32]


@st.composite
def arrays(draw, dtype: DType, n: int):
  if dtype.is_float:
    xs = draw(st.lists(st.floats(-1e3, 1e3, width=32), min_size=n, max_size=n))
  elif dtype.is_bool:
    xs = draw(st.lists(st.booleans(), min_size=n, max_size=n))
  else:
    xs = draw(st.lists(st.integers(dtype.min(), dtype.max()), min_size=n, max_size=n))
  return np.array(xs, dtype=np_dtype(dtype))


# *** basic kernels against numpy ***

@given(st.sampled_from(NUMERIC), st.integers(0, 40), st.data())
def test_elementwise_add(dt, n, data):
  a, b = data.draw(arrays(dt, n)), data.draw(arrays(dt, n))
  got = elementwise(lambda x, y: x + y, [a, b], [dt, dt], dt)
  with np.errstate(all="ignore"): np.testing.assert_array_equal(got, a + b)


@given(st.integers(0, 9), st.integers(0, 9))
def test_transpose_copy(m, n):
  x = np.arange(m * n, dtype=np.float32) * 1.5
  out, inp = empty(m * n, dtypes.float32), buf(x, dtypes.float32)
  p0, p1 = params([out, inp])
  r0, r1 = UOp.range(n, 0), UOp.range(m, 1)
  # x is (m, n); out is its transpose (n, m)
  run([out, inp], p0.index(r0 * m + r1).store(p1.index(r1 * n + r0)).end(r0, r1))
  np.testing.assert_array_equal(read(out), x.reshape(m, n).T.reshape(-1))


@pytest.mark.parametrize("op,ref", [(Ops.ADD, np.sum), (Ops.MAX, np.max), (Ops.MUL, np.prod)])
@given(m=st.integers(1, 6), n=st.integers(1, 7), data=st.data())
def test_row_reduce(op, ref, m, n, data):
  x = data.draw(st.lists(st.integers(-4, 4), min_size=m * n, max_size=m * n))
  x = np.array(x, dtype=np.int32).reshape(m, n)
  out, inp = empty(m, dtypes.int32), buf(x, dtypes.int32)
  p0, p1 = params([out, inp])
  r0, r1 = UOp.range(m, 0), UOp.range(n, 1)
  run([out, inp], p0.index(r0).store(red(p1.index(r0 * n + r1), op, r1)).end(r0))
  np.testing.assert_array_equal(read(out), ref(x, axis=1))


def test_row_sum_float_and_reduce_of_a_constant():
  x = np.random.default_rng(0).standard_normal((5, 7)).astype(np.float32)
  out, cnt, inp = empty(5, dtypes.float32), empty(5, dtypes.int32), buf(x, dtypes.float32)
  p0, p1, p2 = params([out, cnt, inp])
  r0, r1 = UOp.range(5, 0), UOp.range(7, 1)
  run([out, cnt, inp], p0.index(r0).store(red(p2.index(r0 * 7 + r1), Ops.ADD, r1)).end(r0),
      p1.index(r0).store(red(c(1, dtypes.int32), Ops.ADD, r1)).end(r0))   # a value that ignores its range
  np.testing.assert_allclose(read(out), x.sum(axis=1), rtol=1e-5)
  np.testing.assert_array_equal(read(cnt), [7] * 5)


@given(st.integers(1, 6), st.integers(1, 6), st.integers(0, 6), st.sampled_from([dtypes.int32, dtypes.float32]), st.data())
def test_matmul(m, n, k, dt, data):
  a = data.draw(arrays(dt, m * k)).reshape(m, k) if dt.is_float else \
    np.array(data.draw(st.lists(st.integers(-50, 50), min_size=m * k, max_size=m * k)), np.int32).reshape(m, k)
  b = data.draw(arrays(dt, k * n)).reshape(k, n) if dt.is_float else \
    np.array(data.draw(st.lists(st.integers(-50, 50), min_size=k * n, max_size=k * n)), np.int32).reshape(k, n)
  out, pa, pb = empty(m * n, dt, fill=7), buf(a, dt), buf(b, dt)
  p0, p1, p2 = params([out, pa, pb])
  r0, r1, r2 = UOp.range(m, 0), UOp.range(n, 1), UOp.range(k, 2)
  prod = p1.index(r0 * k + r2) * p2.index(r2 * n + r1)
  run([out, pa, pb], p0.index(r0 * n + r1).store(red(prod, Ops.ADD, r2)).end(r0, r1))
  want = (a.astype(np.float64) @ b.astype(np.float64)).reshape(-1)
  if dt.is_float:
    # the device sums in float32: allow the float32 error of the sum, which scales with sum |a||b| (cancellation)
    bound = (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))).reshape(-1) * k * 1.2e-7 + 1e-2
    assert (np.abs(read(out) - want) <= bound + 1e-4 * np.abs(want)).all(), (read(out), want)
  else: np.testing.assert_array_equal(read(out), want.astype(np.int32))


def test_reduce_over_two_ranges_and_nested_reduce():
  x = np.arange(2 * 3 * 4, dtype=np.int64).reshape(2, 3, 4)
  o1, o2, inp = empty(2, dtypes.int64), empty(2, dtypes.int64), buf(x, dtypes.int64)
  p0, p1, p2 = params([o1, o2, inp])
  r0, r1, r2 = UOp.range(2, 0), UOp.range(3, 1), UOp.range(4, 2)
  load = p2.index(r0 * 12 + r1 * 4 + r2)
  run([o1, o2, inp], p0.index(r0).store(red(load, Ops.ADD, r1, r2)).end(r0),
      p1.index(r0).store(red(red(load, Ops.MAX, r2), Ops.ADD, r1)).end(r0))   # sum over r1 of the max over r2
  np.testing.assert_array_equal(read(o1), x.sum(axis=(1, 2)))
  np.testing.assert_array_equal(read(o2), x.max(axis=2).sum(axis=1))


def test_sibling_reduces_may_share_a_range():
  x = np.arange(12, dtype=np.float64).reshape(3, 4)
  out, inp = empty(3, dtypes.float64), buf(x, dtypes.float64)
  p0, p1 = params([out, inp])
  r0, r1 = UOp.range(3, 0), UOp.range(4, 1)
  v = p1.index(r0 * 4 + r1)
  run([out, inp], p0.index(r0).store(red(v, Ops.ADD, r1) + red(v * v, Ops.ADD, r1)).end(r0))
  np.testing.assert_array_equal(read(out), x.sum(1) + (x * x).sum(1))


# *** kernels with more ranges than numpy has dimensions (ranges share axes: numpy_device._axes) ***

def test_many_sibling_reductions_run_past_numpys_32_dimensions():
  # 25 reductions of their own pair of ranges each, in one store: 51 ranges, but no value spans more than 3
  x = np.random.default_rng(1).standard_normal((3, 4, 5)).astype(np.float64)
  out, inp = empty(3, dtypes.float64), buf(x, dtypes.float64)
  p0, p1 = params([out, inp])
  r0 = UOp.range(3, 0)
  acc, want = c(0.0, dtypes.float64), np.zeros(3)
  for i in range(25):
    a, b = UOp.range(4, 1 + 2 * i), UOp.range(5, 2 + 2 * i)
    v = p1.index(r0 * 20 + a * 5 + b) * float(i + 1)
    acc = acc + (red(v, Ops.MAX, a, b) if i % 2 else red(v, Ops.ADD, a, b))
    want = want + ((x * (i + 1)).max((1, 2)) if i % 2 else (x * (i + 1)).sum((1, 2)))
  k = Kernel(UOp.sink(p0.index(r0).store(acc).end(r0)), (out, inp))
  assert len(k.ranges) == 51 and _Run(k).ndim == 3
  run_kernel(k)
  np.testing.assert_allclose(read(out), want, rtol=1e-12)


def test_nested_and_shared_ranges_keep_their_own_axes():
  # a range a nested REDUCE's value depends on, and one two sibling reduces share, must not be given an axis
  # another live range holds; a reduce whose value ignores the store range may reuse the store range's axis
  x = np.arange(2 * 3 * 4, dtype=np.int64).reshape(2, 3, 4)
  out, inp = empty(2 * 5, dtypes.int64), buf(x, dtypes.int64)
  p0, p1 = params([out, inp])
  r0, s, r1, r2, q = UOp.range(2, 0), UOp.range(5, 1), UOp.range(3, 2), UOp.range(4, 3), UOp.range(24, 4)
  load = p1.index(r0 * 12 + r1 * 4 + r2)
  nested = red(red(load, Ops.MAX, r2) * r1.cast(dtypes.int64), Ops.ADD, r1)   # sum_r1 r1 * max_r2 x
  shared = red(load, Ops.ADD, r1, r2) - red(load * 2, Ops.MAX, r1, r2)
  total = red(p1.index(q), Ops.ADD, q)                                         # independent of r0 and s
  run([out, inp], p0.index(r0 * 5 + s).store(nested + shared + total + s.cast(dtypes.int64)).end(r0, s))
  want = (x.max(2) * np.arange(3)).sum(1) + x.sum((1, 2)) - (2 * x).max((1, 2)) + x.sum()
  np.testing.assert_array_equal(read(out).reshape(2, 5), want[:, None] + np.arange(5))


def test_ranges_of_size_one_need_no_axis():
  # 40 ranges of size 1 (0 everywhere); a reduce over them still folds in the identity: -0.0 sums to 0.0 and a
  # NaN's max is -inf, as over any other range
  x = np.array([-0.0, np.nan, 2.5], np.float32)
  o_sum, o_max, inp = empty(3, dtypes.float32, fill=9), empty(3, dtypes.float32, fill=9), buf(x, dtypes.float32)
  p0, p1, p2 = params([o_sum, o_max, inp])
  r = UOp.range(3, 0)
  ones = [UOp.range(1, 1 + i) for i in range(40)]
  idx = r
  for o in ones[:20]: idx = idx + o
  k = Kernel(UOp.sink(p0.index(idx).store(red(p2.index(r), Ops.ADD, *ones[20:30])).end(r, *ones[:20]),
                      p1.index(r).store(red(p2.index(r + ones[30]), Ops.MAX, *ones[30:])).end(r)), (o_sum, o_max, inp))
  assert _Run(k).ndim == 1
  run_kernel(k)
  assert read(o_sum)[0] == 0.0 and not np.signbit(read(o_sum)[0])
  np.testing.assert_array_equal(read(o_sum), [0.0, np.nan, 2.5])
  np.testing.assert_array_equal(read(o_max), [-0.0, -np.inf, 2.5])


def test_a_kernel_whose_values_truly_span_too_many_ranges_is_refused_cleanly():
  # 33 ranges of size 2 in one store: 2**33 points, beyond what numpy (and memory) can hold at once
  out = empty(1, dtypes.int32)
  (p0,) = params([out])
  rs = [UOp.range(2, i) for i in range(33)]
  with pytest.raises(NotImplementedError, match="33 ranges"):
    run([out], p0.index(c(0)).store(c(1, dtypes.int32)).end(*rs))


@pytest.mark.parametrize("axis", [-1, 0])
def test_fused_tensor_programs_past_32_dimensions_match_numpy(axis):
  # Tensor programs the scheduler may fuse into one kernel with many reductions (a pair of ranges each)
  from rulec.engine.tensor import Tensor
  x = np.random.default_rng(2).random((3, 4)).astype(np.float32)
  t = Tensor(x, device="NUMPY")
  acc, want = t.sum(), x.astype(np.float64).sum()
  for i in range(12):
    acc = acc + (t * (i + 1)).sum() + (t + i).max()
    want = want + (x * (i + 1)).astype(np.float64).sum() + (x + i).max()
  np.testing.assert_allclose(acc.numpy(), want, rtol=1e-5)
  y, ref = t.pad(((1, 1), (2, 2))), np.pad(x, ((1, 1), (2, 2))).astype(np.float64)
  for _ in range(3):
    y = y.log_softmax(axis)
    ref = ref - ref.max(axis, keepdims=True)
    ref = ref - np.log(np.exp(ref).sum(axis, keepdims=True))
  z = y.reshape(5, 2, 4).softmax(1).sum(0)
  e = np.exp(ref.reshape(5, 2, 4) - ref.reshape(5, 2, 4).max(1, keepdims=True))
  np.testing.assert_allclose(y.numpy(), ref, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(z.numpy(), (e / e.sum(1, keepdims=True)).sum(0), rtol=1e-5)


# *** padding and out-of-bounds reads ***

@given(st.integers(0, 10), st.integers(0, 4), st.integers(0, 4))
def test_padded_read(n, before, after):
  x = np.arange(1, n + 1, dtype=np.float32)
  size = before + n + after
  out, inp = empty(size, dtypes.float32, fill=-1), buf(x, dtypes.float32)
  p0, p1 = params([out, inp])
  r = UOp.range(size, 0)
  valid = c(before - 1).lt(r) & r.lt(before + n)
  run([out, inp], p0.index(r).store(valid.where(p1.index(r - before), 0.0)).end(r))
  np.testing.assert_array_equal(read(out), np.pad(x, (before, after)))


def test_padded_2d_read_with_nested_wheres():
  x = np.arange(6, dtype=np.int32).reshape(2, 3) + 1
  out, inp = empty(4 * 5, dtypes.int32), buf(x, dtypes.int32)
  p0, p1 = params([out, inp])
  r0, r1 = UOp.range(4, 0), UOp.range(5, 1)
  i, j = r0 - 1, r1 - 1
  inner = (c(-1).lt(j) & j.lt(3)).where(p1.index(i * 3 + j), 0)
  run([out, inp], p0.index(r0 * 5 + r1).store((c(-1).lt(i) & i.lt(2)).where(inner, 0)).end(r0, r1))
  np.testing.assert_array_equal(read(out).reshape(4, 5), np.pad(x, 1))


def test_out_of_bounds_read_that_is_used_raises():
  out, inp = empty(4, dtypes.float32), buf(np.arange(4), dtypes.float32)
  p0, p1 = params([out, inp])
  r = UOp.range(4, 0)
  with pytest.raises(IndexError, match="out of bounds from p1"):
    run([out, inp], p0.index(r).store(p1.index(r + 1)).end(r))
  # the WHERE keeps the bad read where its condition is true
  with pytest.raises(IndexError, match="out of bounds"):
    run([out, inp], p0.index(r).store(r.lt(4).where(p1.index(r + 1), 0.0)).end(r))


def test_out_of_bounds_read_from_an_empty_buffer_is_fine_when_discarded():
  out, inp = empty(3, dtypes.int32, fill=5), empty(0, dtypes.int32)
  p0, p1 = params([out, inp])
  r = UOp.range(3, 0)
  run([out, inp], p0.index(r).store(r.lt(0).where(p1.index(r), 0)).end(r))
  np.testing.assert_array_equal(read(out), [0, 0, 0])


def test_out_of_bounds_store_raises():
  out = empty(4, dtypes.int32)
  p0, = params([out])
  r = UOp.range(4, 0)
  with pytest.raises(IndexError, match="store to p0 .* index 4"):
    run([out], p0.index(r + 1).store(c(1, dtypes.int32)).end(r))


# *** ALU semantics match rulec.engine.ir.alu exactly ***

INT_BINARY = [Ops.ADD, Ops.SUB, Ops.MUL, Ops.IDIV, Ops.MOD, Ops.MAX, Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR,
              Ops.POW, Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ]
INT_DTYPES = [dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.int32, dtypes.uint32, dtypes.int64, dtypes.uint64]


def _binary_kernel(op: Ops, dt: DType, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, DType]:
  out_dt = dtypes.bool if op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ) else dt
  return elementwise(lambda x, y: UOp(op, out_dt, (x, y)), [a, b], [dt, dt], out_dt), out_dt


def _scalar(op: Ops, dt: DType, *xs) -> list:
  return [exec_alu(op, dt, [v.item() for v in vs]) for vs in zip(*xs)]


@given(st.sampled_from(INT_BINARY), st.sampled_from(INT_DTYPES), st.integers(1, 12), st.data())
def test_integer_binary_ops_match_alu(op, dt, n, data):
  a = data.draw(arrays(dt, n))
  if op in (Ops.SHL, Ops.SHR): b = np.array(data.draw(st.lists(st.integers(0, dt.bits + 3), min_size=n, max_size=n)))
  elif op is Ops.POW:
    b = np.array(data.draw(st.lists(st.integers(-3 if dt.kind == "i" else 0, 70), min_size=n, max_size=n)))
    b = np.where((a == 0) & (b < 0), -b, b)   # Python raises for 0 ** -k
  else: b = data.draw(arrays(dt, n) | st.just(np.resize(np.array([0, 1, dt.max(), dt.min()], dtype=object), n)))
  a, b = a.astype(np_dtype(dt)), b.astype(np_dtype(dt))
  got, out_dt = _binary_kernel(op, dt, a, b)
  np.testing.assert_array_equal(got, np.array(_scalar(op, out_dt, a, b), dtype=np_dtype(out_dt)))


@pytest.mark.parametrize("dt", [dtypes.int8, dtypes.int32, dtypes.int64, dtypes.uint8])
def test_integer_division_and_modulo_by_zero_and_negative(dt):
  a = np.array([7, -7, 7, -7, 0, 5, -5, dt.min(), dt.min()], dtype=object)
  b = np.array([2, 2, -2, -2, 0, 0, 0, -1, 0], dtype=object)
  if dt.is_unsigned: a, b = a % (dt.max() + 1), b % (dt.max() + 1)
  a, b = a.astype(np_dtype(dt)), b.astype(np_dtype(dt))
  q, _ = _binary_kernel(Ops.IDIV, dt, a, b)
  m, _ = _binary_kernel(Ops.MOD, dt, a, b)
  np.testing.assert_array_equal(q, _scalar(Ops.IDIV, dt, a, b))
  np.testing.assert_array_equal(m, _scalar(Ops.MOD, dt, a, b))
  if dt is dtypes.int32:
    np.testing.assert_array_equal(q[:6], [3, -4, -4, 3, 0, 0])
    np.testing.assert_array_equal(m[:6], [1, 1, -1, -1, 0, 0])


FLOAT_BINARY = [Ops.ADD, Ops.SUB, Ops.MUL, Ops.FDIV, Ops.IDIV, Ops.MOD, Ops.MAX, Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ]
FLOAT_UNARY = [Ops.NEG, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.RECIPROCAL, Ops.TRUNC]
# no tiny magnitudes: rulec.engine.ir.alu's float IDIV raises OverflowError when a / b overflows (math.floor(inf))
finite = st.floats(-1e3, 1e3).filter(lambda x: x == 0 or abs(x) > 1e-6) | st.sampled_from([0.0, -0.0, 1.0, -2.5, 0.5])


@given(st.sampled_from(FLOAT_BINARY), st.lists(st.tuples(finite, finite), min_size=1, max_size=12))
def test_float64_binary_ops_match_alu(op, pairs):
  a, b = (np.array(x, dtype=np.float64) for x in zip(*pairs))
  got, out_dt = _binary_kernel(op, dtypes.float64, a, b)
  want = np.array(_scalar(op, out_dt, a, b), dtype=np_dtype(out_dt))
  np.testing.assert_array_equal(got, want)
  if out_dt.is_float: assert (np.signbit(got) == np.signbit(want))[~np.isnan(want)].all()


@given(st.sampled_from(FLOAT_UNARY), st.lists(finite, min_size=1, max_size=12))
def test_float64_unary_ops_match_alu(op, xs):
  a = np.array(xs, dtype=np.float64)
  got = elementwise(lambda x: UOp(op, dtypes.float64, (x,)), [a], [dtypes.float64], dtypes.float64)
  want = np.array(_scalar(op, dtypes.float64, a))
  np.testing.assert_allclose(got, want, rtol=1e-13)
  assert (np.signbit(got) == np.signbit(want))[~np.isnan(want)].all()


@given(st.sampled_from([Ops.ADD, Ops.SUB, Ops.MUL, Ops.IDIV, Ops.MOD, Ops.MAX, Ops.AND, Ops.OR, Ops.XOR, Ops.FDIV,
                        Ops.SHL, Ops.SHR, Ops.POW, Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ]),
       st.lists(st.tuples(st.booleans(), st.booleans()), min_size=1, max_size=8))
def test_bool_ops_match_alu(op, pairs):
  a, b = (np.array(x, dtype=bool) for x in zip(*pairs))
  got, out_dt = _binary_kernel(op, dtypes.bool, a, b)
  np.testing.assert_array_equal(got, _scalar(op, out_dt, a, b))


@given(st.sampled_from([Ops.FDIV, Ops.SQRT, Ops.RECIPROCAL, Ops.NEG, Ops.TRUNC]), st.sampled_from([dtypes.int8, dtypes.int32]),
       st.integers(1, 10), st.data())
def test_integer_ops_through_floats_match_alu(op, dt, n, data):
  a = data.draw(arrays(dt, n))
  if op is Ops.FDIV:
    b = data.draw(arrays(dt, n))
    got, _ = _binary_kernel(op, dt, a, b)
    want = _scalar(op, dt, a, b)
  else:
    got = elementwise(lambda x: UOp(op, dt, (x,)), [a], [dt], dt)
    want = _scalar(op, dt, a)
  np.testing.assert_array_equal(got, want)


def test_where_and_mulacc():
  a = np.array([1.0, -2.0, 3.0, 0.5], np.float32)
  b = np.array([2.0, 2.0, -1.0, 4.0], np.float32)
  got = elementwise(lambda x, y: x.lt(y).where(UOp(Ops.MULACC, x.dtype, (x, y, y)), y), [a, b], [dtypes.float32] * 2,
                    dtypes.float32)
  np.testing.assert_array_equal(got, np.where(a < b, a * b + b, b))


def test_float32_computes_in_float32():
  a = np.array([16777216.0, 1.0], np.float32)
  got = elementwise(lambda x: x + c(1.0, dtypes.float32), [a], [dtypes.float32], dtypes.float32)
  np.testing.assert_array_equal(got, a + np.float32(1))   # 2**24 + 1 rounds back to 2**24 in float32
  assert got[0] == 16777216.0


def test_no_numpy_warnings_escape():
  a = np.array([0.0, -1.0, 1.0], np.float32)
  import warnings
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    got = elementwise(lambda x: UOp(Ops.LOG2, x.dtype, (x,)) / x, [a], [dtypes.float32], dtypes.float32)
    gi = elementwise(lambda x, y: x // y, [np.array([1, 2], np.int32), np.zeros(2, np.int32)], [dtypes.int32] * 2, dtypes.int32)
  assert got[0] == -np.inf and np.isnan(got[1]) and got[2] == 0.0   # log2(0) / 0, log2(-1) / -1, log2(1) / 1
  np.testing.assert_array_equal(gi, [0, 0])


# *** casts ***

CAST_FLOATS = [0.0, -0.0, 1.5, -1.5, 2.9, -2.9, 127.0, 128.0, 255.0, 256.0, 300.7, -129.0, 1e10, -1e10, 3e19,
               float("inf"), float("-inf"), float("nan")]


@pytest.mark.parametrize("dt", [dtypes.int8, dtypes.uint8, dtypes.int32, dtypes.uint32, dtypes.int64, dtypes.uint64])
def test_cast_float_to_int_wraps_like_alu(dt):
  a = np.array(CAST_FLOATS, np.float64)
  got = elementwise(lambda x: x.cast(dt), [a], [dtypes.float64], dt)
  np.testing.assert_array_equal(got, [wrap(v, dt) for v in CAST_FLOATS])


@given(st.sampled_from(NUMERIC + [dtypes.bool, dtypes.float16]), st.sampled_from(NUMERIC + [dtypes.bool, dtypes.float16]),
       st.integers(1, 8), st.data())
def test_casts(src, dst, n, data):
  a = data.draw(arrays(src, n))
  got = elementwise(lambda x: x.cast(dst), [a], [src], dst)
  if dst.is_int and src.is_float: want = [wrap(float(v), dst) for v in a]
  else:
    with np.errstate(over="ignore"): want = a.astype(np_dtype(dst))   # int -> float16 can overflow to inf
  np.testing.assert_array_equal(got, want)


def test_bitcast():
  a = np.array([1.0, -2.0], np.float32)
  got = elementwise(lambda x: x.bitcast(dtypes.int32), [a], [dtypes.float32], dtypes.int32)
  np.testing.assert_array_equal(got, a.view(np.int32))


# *** empty ranges, scalar stores, several stores ***

@pytest.mark.parametrize("op,dt,ident", [(Ops.ADD, dtypes.float32, 0.0), (Ops.MUL, dtypes.float32, 1.0),
                                         (Ops.MAX, dtypes.float32, -math.inf), (Ops.MAX, dtypes.int32, -2**31),
                                         (Ops.MAX, dtypes.uint8, 0), (Ops.ADD, dtypes.int8, 0), (Ops.MUL, dtypes.int64, 1)])
def test_reduce_over_an_empty_range_gives_the_identity(op, dt, ident):
  out, inp = empty(3, dt, fill=9), empty(0, dt)
  p0, p1 = params([out, inp])
  r0, r1 = UOp.range(3, 0), UOp.range(0, 1)
  run([out, inp], p0.index(r0).store(red(p1.index(r1), op, r1)).end(r0))
  np.testing.assert_array_equal(read(out), [ident] * 3)


def test_store_over_an_empty_range_writes_nothing():
  out, inp = empty(4, dtypes.int32, fill=3), empty(0, dtypes.int32)
  p0, p1 = params([out, inp])
  r0, r1 = UOp.range(4, 0), UOp.range(0, 1)
  # the loop over r1 is empty: nothing is written, not even the part that ignores r1
  run([out, inp], p0.index(r0).store(c(5, dtypes.int32)).end(r0, r1))
  np.testing.assert_array_equal(read(out), [3, 3, 3, 3])


def test_max_reduce_skips_nan_like_a_fold_of_alu_max():
  x = np.array([[np.nan, 1.0, 3.0], [np.nan, np.nan, np.nan]], np.float32)
  out, inp = empty(2, dtypes.float32), buf(x, dtypes.float32)
  p0, p1 = params([out, inp])
  r0, r1 = UOp.range(2, 0), UOp.range(3, 1)
  run([out, inp], p0.index(r0).store(red(p1.index(r0 * 3 + r1), Ops.MAX, r1)).end(r0))
  np.testing.assert_array_equal(read(out), [3.0, -np.inf])


def test_scalar_stores_without_ranges():
  out, inp = empty(3, dtypes.float32), buf([1.0, 2.0, 3.0, 4.0], dtypes.float32)
  p0, p1 = params([out, inp])
  k = run([out, inp], p0.index(c(0)).store(p1.index(c(3)) * 2.0), p0.index(c(2)).store(c(7.0, dtypes.float32)))
  np.testing.assert_array_equal(read(out), [8.0, 0.0, 7.0])
  assert k.ranges == () and "ranges ()" in repr(k)


def test_full_reduce_into_a_scalar():
  x = np.arange(10, dtype=np.int32)
  out, inp = empty(1, dtypes.int32), buf(x, dtypes.int32)
  p0, p1 = params([out, inp])
  r = UOp.range(10, 0)
  run([out, inp], p0.index(c(0)).store(red(p1.index(r), Ops.ADD, r)))
  assert read(out)[0] == 45


def test_two_stores_run_in_order_and_see_each_others_writes():
  x = np.arange(5, dtype=np.int32)
  o1, o2, inp = empty(5, dtypes.int32), empty(5, dtypes.int32), buf(x, dtypes.int32)
  p0, p1, p2 = params([o1, o2, inp])
  r = UOp.range(5, 0)
  k = run([o1, o2, inp], p0.index(r).store(p2.index(r) + 1).end(r),
          p1.index(r).store(p0.index(r) * 3 + p2.index(r)).end(r),   # reads what the first store wrote
          p0.index(r).store(p0.index(r) * 10).end(r))                 # in place, after
  np.testing.assert_array_equal(read(o2), (x + 1) * 3 + x)
  np.testing.assert_array_equal(read(o1), (x + 1) * 10)
  assert k.outputs == (0, 1) and k.inputs == (0, 2)


def test_in_place_update():
  b = buf(np.arange(6), dtypes.float32)
  p0, = params([b])
  r = UOp.range(6, 0)
  run([b], p0.index(r).store(p0.index(r) + p0.index(r)).end(r))
  np.testing.assert_array_equal(read(b), np.arange(6) * 2)


def test_deep_graph_does_not_recurse():
  x = buf(np.ones(4), dtypes.float32)
  out = empty(4, dtypes.float32)
  p0, p1 = params([out, x])
  r = UOp.range(4, 0)
  v = p1.index(r)
  for _ in range(5000): v = v + 1.0
  run([out, x], p0.index(r).store(v).end(r))
  np.testing.assert_array_equal(read(out), [5001.0] * 4)


def test_values_only_span_the_ranges_they_depend_on():
  out, inp = empty(4 * 5 * 6, dtypes.float32), buf(np.arange(4), dtypes.float32)
  p0, p1 = params([out, inp])
  r0, r1, r2 = UOp.range(4, 0), UOp.range(5, 1), UOp.range(6, 2)
  a, s = p1.index(r0) * 2.0, r1 * 6 + r2
  k = Kernel(UOp.sink(p0.index(r0 * 30 + s).store(a + s.cast(dtypes.float32)).end(r0, r1, r2)), (out, inp))
  ev = _Run(k)
  assert ev.eval(a).shape == (4, 1, 1)
  assert ev.eval(s).shape == (1, 5, 6)
  assert ev.eval(c(3)).shape == (1, 1, 1)
  run_kernel(k)
  np.testing.assert_array_equal(read(out).reshape(4, 30), np.arange(4)[:, None] * 2.0 + np.arange(30)[None, :])


# *** schedules, counters, debug output ***

def test_run_schedule_in_order_and_counts_kernels():
  x = buf(np.arange(4), dtypes.int32)
  mid, out = empty(4, dtypes.int32), empty(4, dtypes.int32)
  r = UOp.range(4, 0)
  pm, px = params([mid, x])
  k1 = Kernel(UOp.sink(pm.index(r).store(px.index(r) * 2).end(r)), (mid, x))
  po, pm2 = params([out, mid])
  k2 = Kernel(UOp.sink(po.index(r).store(pm2.index(r) + 1).end(r)), (out, mid))
  numpy_device.reset_counters()
  run_schedule([k1, k2])
  np.testing.assert_array_equal(read(out), np.arange(4) * 2 + 1)
  assert numpy_device.kernels_run() == 2


def test_debug_output(monkeypatch, capsys):
  out = empty(2, dtypes.int32)
  p0, = params([out])
  r = UOp.range(2, 0)
  monkeypatch.setenv("RULEC_DEBUG", "3")
  run([out], p0.index(r).store(r.cast(dtypes.int32)).end(r))
  err = capsys.readouterr().err
  assert "<Kernel 1 bufs, ranges (2,), writes p0>" in err and "RANGE" in err and "STORE" in err
  monkeypatch.setenv("RULEC_DEBUG", "1")
  run([out], p0.index(r).store(r.cast(dtypes.int32)).end(r))
  err = capsys.readouterr().err
  assert "<Kernel 1 bufs" in err and "STORE" not in err


def test_kernel_properties_and_render():
  a, b, o = buf(np.zeros(16 * 8), dtypes.float32), buf(np.zeros(8), dtypes.float32), empty(16 * 8, dtypes.float32)
  p0, p1, p2 = params([o, a, b])
  r0, r1 = UOp.range(16, 0), UOp.range(8, 1)
  k = Kernel(UOp.sink(p0.index(r0 * 8 + r1).store(p1.index(r0 * 8 + r1) + p2.index(r1)).end(r0, r1)), [o, a, b])
  assert isinstance(k.bufs, tuple)
  assert repr(k) == "<Kernel 3 bufs, ranges (16, 8), reads p1 p2, writes p0>"
  assert k.outputs == (0,) and k.inputs == (1, 2)
  assert k.params == (p0, p1, p2) and k.ranges == (r0, r1) and k.device == "NUMPY"
  text = k.render()
  assert len(text.splitlines()) == len(k.ast.toposort()) + 1
  assert "PARAM" in text and "p2 size=8" in text and "r1 size=8 loop" in text


# *** validate ***

def _k(bufs, *stores) -> Kernel: return Kernel(UOp.sink(*stores), tuple(bufs))


def _bad(kernel: Kernel, match: str):
  with pytest.raises(ValueError, match=match): validate(kernel)
  with pytest.raises(ValueError, match=match): run_kernel(kernel)


def test_validate_accepts_good_kernels():
  out, inp = empty(4, dtypes.float32), empty(4, dtypes.float32)
  p0, p1 = params([out, inp])
  r = UOp.range(4, 0)
  validate(_k([out, inp], p0.index(r).store(p1.index(r)).end(r)))


def test_validate_param_buffer_mismatches():
  out, inp = empty(4, dtypes.float32), empty(4, dtypes.float32)
  r = UOp.range(4, 0)
  p0 = param(0, out)
  _bad(_k([out], p0.index(r).store(UOp(Ops.PARAM, dtypes.float32, (), (1, 4)).index(r)).end(r)), "p1 has no buffer")
  _bad(_k([out, inp], p0.index(r).store(UOp(Ops.PARAM, dtypes.float32, (), (1, 5)).index(r)).end(r)),
       "p1 has size 5 but bufs\\[1\\] has only 4 elements")
  # a larger buffer is valid (the memory planner stores several intermediates in one): the kernel reads its part
  big = empty(6, dtypes.float32)
  validate(_k([out, big], p0.index(r).store(UOp(Ops.PARAM, dtypes.float32, (), (1, 4)).index(r)).end(r)))
  wrong = UOp(Ops.PARAM, dtypes.int32, (), (1, 4))
  _bad(_k([out, inp], p0.index(r).store(wrong.index(r).cast(dtypes.float32)).end(r)), "p1 is int32 but bufs\\[1\\] holds float32")
  _bad(_k([out, r], p0.index(r).store(c(0.0, dtypes.float32)).end(r)), "bufs\\[1\\] is Ops.RANGE, not a BUFFER")


def test_validate_store_shape():
  out = empty(4, dtypes.float32)
  p0 = param(0, out)
  r = UOp.range(4, 0)
  _bad(_k([out], UOp(Ops.STORE, dtypes.void, (c(0), c(1.0, dtypes.float32))).end(r)), "not INDEX\\(PARAM, idx\\)")
  _bad(_k([out], p0.index(r).store(c(1, dtypes.int32)).end(r)), "stores a int32 value into p0 of float32")
  _bad(_k([out], p0.index(r).end(r)), "not a STORE")
  _bad(_k([out], p0.index(r)), "SINK source is Ops.INDEX")
  _bad(Kernel(UOp.sink(), (out,)), "no stores")


def test_validate_unclosed_ranges():
  out, inp = empty(4, dtypes.float32), empty(16, dtypes.float32)
  p0, p1 = params([out, inp])
  r0, r1 = UOp.range(4, 0), UOp.range(4, 1)
  _bad(_k([out, inp], p0.index(r0).store(p1.index(r0 * 4 + r1)).end(r0)),
       "store 0: its value uses r1\\[4\\], which neither its END nor a REDUCE around it closes")
  _bad(_k([out, inp], p0.index(r0).store(c(1.0, dtypes.float32))), "its index uses r0\\[4\\]")
  # a REDUCE closes r1 for the value only
  ok = p0.index(r0).store(red(p1.index(r0 * 4 + r1), Ops.ADD, r1)).end(r0)
  validate(_k([out, inp], ok))
  _bad(_k([out, inp], p0.index(r0).store(red(p1.index(r0 * 4 + r1), Ops.ADD, r1) + p1.index(r1)).end(r0)), "uses r1")


def test_validate_reduces():
  out, inp = empty(4, dtypes.float32), empty(16, dtypes.float32)
  p0, p1 = params([out, inp])
  r0, r1 = UOp.range(4, 0), UOp.range(4, 1)
  v = p1.index(r0 * 4 + r1)
  _bad(_k([out, inp], p0.index(r0).store(red(v, Ops.SUB, r1)).end(r0)), "REDUCE has arg Ops.SUB")
  _bad(_k([out, inp], p0.index(r0).store(red(v, Ops.ADD, r1, c(3))).end(r0)), "REDUCE reduces over Ops.CONST, not a RANGE")
  _bad(_k([out, inp], p0.index(r0).store(red(v, Ops.ADD, r1, r1)).end(r0)), "lists a range twice")
  _bad(_k([out, inp], p0.index(r0).store(red(v, Ops.ADD, r0, r1)).end(r0)), "closed by its END and also by a REDUCE")
  _bad(_k([out, inp], p0.index(r0).store(red(red(v, Ops.ADD, r1), Ops.ADD, r1)).end(r0)), "a REDUCE inside it already closes")
  bad_dtype = UOp(Ops.REDUCE, dtypes.int32, (v, r1), Ops.ADD)
  _bad(_k([out, inp], p0.index(r0).store(bad_dtype.cast(dtypes.float32)).end(r0)), "REDUCE of a float32 value has dtype int32")


def test_validate_ranges_ops_and_dtypes():
  out, inp = empty(4, dtypes.float32), empty(4, dtypes.float32)
  p0, p1 = params([out, inp])
  r0 = UOp.range(4, 0)
  _bad(_k([out, inp], p0.index(r0).store(p1.index(r0 % UOp.range(2, 0))).end(r0)), "two different RANGEs share axis 0")
  var = UOp.variable("n", 1, 4)
  _bad(_k([out, inp], p0.index(r0).store(p1.index(var.bind(2))).end(r0)), "BIND is not allowed")   # (a kernel's variables are unbound)
  rv = UOp.range(var, 1)
  _bad(_k([out, inp], p0.index(c(0)).store(red(p1.index(rv), Ops.ADD, rv))), "does not end at an integer CONST")
  mixed = UOp(Ops.ADD, dtypes.float32, (p1.index(r0), c(1, dtypes.int32)))
  _bad(_k([out, inp], p0.index(r0).store(mixed).end(r0)), "ADD of float32, int32 has dtype float32")
  _bad(_k([out, inp], p0.index(r0).store(r0.where(p1.index(r0), 0.0)).end(r0)), "WHERE condition has dtype index")
  _bad(_k([out, inp], p0.index(r0).store(p1.index(r0, r0)).end(r0)), "expected one flat index")


def test_validate_lists_every_problem():
  out = empty(4, dtypes.float32)
  p0 = param(0, out)
  r0, r1 = UOp.range(4, 0), UOp.range(4, 1)
  with pytest.raises(ValueError) as e:
    validate(_k([out], p0.index(r0).store(c(1, dtypes.int32)), p0.index(r1).store(c(1.0, dtypes.float32))))
  msg = str(e.value)
  assert "problems" in msg and "store 0" in msg and "store 1" in msg
