"""tinygrad's elementwise math methods (engine/tensor/math.py) against numpy and math references: operators as
methods, trigonometry and hyperbolics, erf, rounding, the isnan/isinf/isclose tests, logaddexp and logsumexp."""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from rulec.engine.tensor import Tensor
from rulec.engine.tensor.args import AxisError

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")   # float16 casts of 1e30, numpy on inf - inf
inf, nan = math.inf, math.nan
EDGES = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1.5, -2.5, 0.99, -0.99, 1e-6, -1e-6, 3.0, 20.0, -20.0, 1e30, -1e30, inf, -inf, nan]
FLOATS = [np.float32, np.float64, np.float16]
RTOL = {np.float32: 3e-6, np.float64: 1e-13, np.float16: 2e-3}
shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4)


def values(lo=-30.0, hi=30.0):
  return st.one_of(st.sampled_from(EDGES), st.floats(lo, hi, width=32))


def farrays(dt, shape=shapes, lo=-30.0, hi=30.0):
  return hnp.arrays(np.float64, shape, elements=values(lo, hi)).map(lambda a: a.astype(dt))


def check(got, ref, dt, rtol=None, atol=0.0):
  """got (a Tensor) equals the float64 reference rounded to dt, NaNs where the reference has them."""
  assert got.dtype.name == np.dtype(dt).name
  with np.errstate(all="ignore"): want = np.asarray(ref).astype(dt).astype(np.float64)
  np.testing.assert_allclose(got.numpy().astype(np.float64), want, rtol=rtol or RTOL[dt], atol=atol, equal_nan=True)


def np_erf(x): return np.vectorize(lambda v: math.erf(v) if not math.isnan(v) else nan, otypes=[np.float64])(x)


UNARY = {"atan": np.arctan, "asin": np.arcsin, "acos": np.arccos, "asinh": np.arcsinh, "acosh": np.arccosh,
         "atanh": np.arctanh, "erf": np_erf, "log10": np.log10, "round": np.round, "sign": np.sign}


@pytest.mark.parametrize("dt", FLOATS)
@pytest.mark.parametrize("name", sorted(UNARY))
@settings(max_examples=3)
@given(data=st.data())
def test_unary_against_numpy(name, dt, data):
  x = data.draw(farrays(dt))
  with np.errstate(all="ignore"): ref = UNARY[name](x.astype(np.float64))
  check(getattr(Tensor(x), name)(), ref, dt, atol=1e-7 if dt is np.float32 and name == "erf" else 0.0)


@pytest.mark.parametrize("dt", FLOATS)
@pytest.mark.parametrize("name", ["atan", "asin", "acos", "asinh", "acosh", "atanh", "erf", "sinh", "cosh", "round", "sign"])
def test_unary_edge_values(name, dt):
  """Every edge value at once: +-0, +-1 (acos, atanh), huge (atan, asinh), +-inf, NaN."""
  x = np.array(EDGES, dtype=dt)
  f = {**UNARY, "sinh": np.sinh, "cosh": np.cosh}[name]
  with np.errstate(all="ignore"): ref = f(x.astype(np.float64))
  # e^|x| is computed as exp2 of a rounded product: relative error ~ eps * |x| for large |x|
  rtol = {np.float32: 2e-5, np.float64: 1e-13, np.float16: 2e-3}[dt] if name in ("sinh", "cosh") else None
  check(getattr(Tensor(x), name)(), ref, dt, rtol=rtol)


def test_inverse_trig_exact_points():
  x = Tensor([-1.0, 1.0, 0.0, 2.0, -2.0])
  np.testing.assert_allclose(x.acos().numpy(), [math.pi, 0.0, math.pi / 2, nan, nan], rtol=1e-7)
  np.testing.assert_allclose(x.asin().numpy(), [-math.pi / 2, math.pi / 2, 0.0, nan, nan], rtol=1e-7)
  np.testing.assert_allclose(Tensor([inf, -inf, 1e38]).atan().numpy(), [math.pi / 2, -math.pi / 2, math.pi / 2], rtol=1e-7)
  np.testing.assert_allclose(x.atanh().numpy()[:3], [-inf, inf, 0.0])


def test_erf_accuracy_float32():
  xs = np.concatenate([np.linspace(-6, 6, 4001), np.logspace(-8, 0.5, 200)]).astype(np.float32)
  ref = np_erf(xs.astype(np.float64))
  got = Tensor(xs).erf().numpy().astype(np.float64)
  assert np.max(np.abs(got - ref) / np.maximum(np.abs(ref), 1e-30)) < 1e-6


@pytest.mark.parametrize("dt", FLOATS)
@settings(max_examples=4)
@given(data=st.data())
def test_sinh_cosh_tan(dt, data):
  x = data.draw(farrays(dt, lo=-10, hi=10))
  x64 = x.astype(np.float64)
  with np.errstate(all="ignore"):
    check(Tensor(x).sinh(), np.sinh(x64), dt, rtol=1e-5 if dt is np.float32 else None)
    check(Tensor(x).cosh(), np.cosh(x64), dt, rtol=1e-5 if dt is np.float32 else None)
  small = np.clip(np.nan_to_num(x64, nan=0.0), -1.4, 1.4).astype(dt)
  check(Tensor(small).tan(), np.tan(small.astype(np.float64)), dt, rtol={np.float32: 2e-5, np.float64: 1e-12, np.float16: 3e-3}[dt])


def test_int_inputs_give_float32():
  x = Tensor([0, 1, 2])
  for name in ("atan", "asinh", "erf", "log10", "sinh", "round"):
    assert getattr(x, name)().dtype.name == "float32", name
  np.testing.assert_allclose(x.acos().numpy()[:2], [math.pi / 2, 0.0], rtol=1e-7)
  np.testing.assert_allclose(x.round().numpy(), [0.0, 1.0, 2.0])
  assert Tensor([-3, 0, 5]).sign().tolist() == [-1, 0, 1] and Tensor([-3, 0, 5]).sign().dtype.name == "int32"
  assert Tensor([True, False]).sign().tolist() == [True, False]


def test_round_half_even():
  x = [-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5, 0.49999997, 2.0**23 + 1, -(2.0**52) - 1]
  np.testing.assert_array_equal(Tensor(np.array(x)).round().numpy(), np.round(np.array(x)))


@pytest.mark.parametrize("dt", FLOATS)
def test_isnan_isinf_isfinite(dt):
  x = np.array(EDGES, dtype=dt)
  t = Tensor(x)
  np.testing.assert_array_equal(t.isnan().numpy(), np.isnan(x))
  np.testing.assert_array_equal(t.isinf().numpy(), np.isinf(x))
  np.testing.assert_array_equal(t.isinf(detect_negative=False).numpy(), np.isposinf(x))
  np.testing.assert_array_equal(t.isinf(detect_positive=False).numpy(), np.isneginf(x))
  np.testing.assert_array_equal(t.isinf(False, False).numpy(), np.zeros(len(x), bool))
  np.testing.assert_array_equal(t.isfinite().numpy(), np.isfinite(x))
  i = Tensor([1, -2, 0])
  assert i.isnan().tolist() == [False] * 3 and i.isinf().tolist() == [False] * 3 and i.isfinite().tolist() == [True] * 3


binary_shapes = hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3, min_side=0, max_side=3)


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@settings(max_examples=4)
@given(data=st.data())
def test_isclose_logaddexp_copysign_broadcast(dt, data):
  sa, sb = data.draw(binary_shapes).input_shapes
  a, b = data.draw(farrays(dt, sa)), data.draw(farrays(dt, sb))
  b = np.where(np.random.default_rng(0).random(b.shape) < 0.3, b * (1 + 1e-7), b).astype(dt) if b.size else b
  A, B = Tensor(a), Tensor(b)
  np.testing.assert_array_equal(A.isclose(B).numpy(), np.isclose(a, b))
  np.testing.assert_array_equal(A.isclose(B, rtol=1e-3, atol=0.1, equal_nan=True).numpy(), np.isclose(a, b, 1e-3, 0.1, True))
  assert bool(A.allclose(B)) == np.allclose(a, b)
  with np.errstate(all="ignore"): ref = np.logaddexp(a.astype(np.float64), b.astype(np.float64))
  check(A.logaddexp(B), ref, dt)
  got = A.copysign(B).numpy()
  np.testing.assert_array_equal(got, np.copysign(a, b))
  np.testing.assert_array_equal(np.signbit(got), np.signbit(np.copysign(a, b)))


def test_logaddexp_infinities_and_ints():
  a, b = [-inf, inf, -inf, 1000.0, nan], [-inf, inf, 3.0, 1000.0, 1.0]
  np.testing.assert_allclose(Tensor(a).logaddexp(Tensor(b)).numpy(), np.logaddexp(a, b), rtol=1e-6)
  r = Tensor([1, 2]).logaddexp(Tensor([3, 4]))
  assert r.dtype.name == "float32"
  np.testing.assert_allclose(r.numpy(), np.logaddexp([1, 2], [3, 4]), rtol=1e-6)
  np.testing.assert_allclose(Tensor([1.0, 2.0]).logaddexp(0.5).numpy(), np.logaddexp([1.0, 2.0], 0.5), rtol=1e-6)


def np_logsumexp(x, axis, keepdim):
  with np.errstate(all="ignore"):
    m = np.max(x, axis=axis, keepdims=True) if x.size else np.zeros([1] * x.ndim)
    m = np.where(np.isfinite(m), m, 0.0)
    r = np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)) + m
  return r if keepdim else np.squeeze(r, axis=axis) if axis is not None else r.reshape(())


@pytest.mark.parametrize("dt", FLOATS)
@settings(max_examples=5)
@given(data=st.data())
def test_logsumexp(dt, data):
  x = data.draw(farrays(dt, hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4), lo=-100, hi=100))
  axis = data.draw(st.one_of(st.none(), st.integers(-x.ndim, x.ndim - 1)))
  keepdim = data.draw(st.booleans())
  got = Tensor(x).logsumexp(axis, keepdim)
  ref = np_logsumexp(x.astype(np.float64), axis, keepdim)
  assert got.shape == ref.shape
  # (log(sum(exp(x - max))) + max, as tinygrad computes it: a result near 0 is the log of a sum near 1, whose rounding
  # is an absolute error of about dt's epsilon: logsumexp([0, -6]) in float32 is 140 ulps of its own value off)
  check(got, ref, dt, rtol={np.float32: 1e-5, np.float64: 1e-12, np.float16: 3e-3}[dt], atol=2 * float(np.finfo(dt).eps))


def test_logsumexp_edges():
  x = Tensor([[-inf, -inf], [1.0, 2.0], [inf, 1.0], [1000.0, 1000.0]])
  np.testing.assert_allclose(x.logsumexp(1).numpy(), [-inf, np.logaddexp(1, 2), inf, 1000 + math.log(2)], rtol=1e-6)
  np.testing.assert_array_equal(Tensor(np.ones((2, 0), np.float32)).logsumexp(1).numpy(), [-inf, -inf])
  assert Tensor(np.ones((2, 3), np.float16)).logsumexp().dtype.name == "float16"
  assert Tensor([1, 2]).logsumexp().dtype.name == "float32"
  with pytest.raises(AxisError): Tensor([1.0, 2.0]).logsumexp(1)


# *** operators as methods ***

ints = hnp.arrays(np.int32, hnp.array_shapes(min_dims=1, max_dims=2, min_side=0, max_side=4), elements=st.integers(-50, 50))


@settings(max_examples=6)
@given(a=ints, data=st.data())
def test_integer_methods(a, data):
  b = data.draw(hnp.arrays(np.int32, a.shape, elements=st.integers(-9, 9).filter(lambda v: v != 0)))
  A, B = Tensor(a), Tensor(b)
  np.testing.assert_array_equal(A.div(B, rounding_mode="trunc").numpy(), np.trunc(a / b).astype(np.int32))
  np.testing.assert_array_equal(A.div(B, rounding_mode="floor").numpy(), a // b)
  assert A.div(B, rounding_mode="trunc").dtype.name == "int32"
  np.testing.assert_allclose(A.div(B).numpy(), (a / b).astype(np.float32), rtol=1e-6)
  np.testing.assert_array_equal(A.mod(B).numpy(), np.mod(a, b))
  np.testing.assert_array_equal(A.fmod(B).numpy(), np.fmod(a, b))
  np.testing.assert_array_equal(B.mod(7, reverse=True).numpy(), np.mod(7, b))
  np.testing.assert_array_equal(B.div(7, reverse=True, rounding_mode="trunc").numpy(), np.trunc(7 / b).astype(np.int32))
  np.testing.assert_array_equal(A.add(B).numpy(), a + b)
  np.testing.assert_array_equal(A.sub(3, reverse=True).numpy(), 3 - a)
  np.testing.assert_array_equal(A.mul(B).numpy(), a * b)
  np.testing.assert_array_equal(A.pow(2).numpy(), a ** 2)
  np.testing.assert_array_equal(A.neg().numpy(), -a)
  np.testing.assert_array_equal(A.bitwise_and(B).numpy(), a & b)
  np.testing.assert_array_equal(A.bitwise_or(6, reverse=True).numpy(), 6 | a)
  np.testing.assert_array_equal(A.bitwise_xor(B).numpy(), a ^ b)
  np.testing.assert_array_equal(A.bitwise_not().numpy(), ~a)
  np.testing.assert_array_equal(A.lshift(2).numpy(), a << 2)
  np.testing.assert_array_equal(A.rshift(1).numpy(), a >> 1)
  np.testing.assert_array_equal(A.logical_not().numpy(), a == 0)
  np.testing.assert_array_equal(A.eq(B).numpy(), a == b)
  np.testing.assert_array_equal(A.ne(B).numpy(), a != b)
  np.testing.assert_array_equal(A.copysign(B).numpy(), np.where(b < 0, -np.abs(a), np.abs(a)))
  assert A.copysign(B).dtype.name == "int32"


@pytest.mark.parametrize("dt", [np.float32, np.float64, np.float16])
@settings(max_examples=4)
@given(data=st.data())
def test_float_methods_broadcast(dt, data):
  sa, sb = data.draw(binary_shapes).input_shapes
  a = data.draw(farrays(dt, sa, lo=-100, hi=100))
  b = data.draw(hnp.arrays(np.float64, sb, elements=st.one_of(st.floats(0.25, 50), st.floats(-50, -0.25)))).astype(dt)
  A, B = Tensor(a), Tensor(b)
  a64, b64 = a.astype(np.float64), b.astype(np.float64)
  tol = {np.float32: 1e-6, np.float64: 1e-13, np.float16: 1e-3}[dt]
  with np.errstate(all="ignore"):
    check(A.div(B), a64 / b64, dt, rtol=tol)
    check(A.div(B, rounding_mode="trunc"), np.trunc((a / b).astype(dt).astype(np.float64)), dt)
    check(A.div(B, rounding_mode="floor"), np.floor((a / b).astype(dt).astype(np.float64)), dt)
    check(A.fmod(B), np.fmod(a, b), dt)
    check(A.mod(B), np.mod(a, b), dt)
    w = 0.25
    check(A.lerp(B, w), a64 + (b64 - a64) * w, dt, rtol=tol, atol=tol)
    check(A.sub(B, reverse=True), b64 - a64, dt)
    check(A.add(B), a64 + b64, dt)
    check(A.mul(B), a64 * b64, dt)
    check(B.abs().pow(0.5), np.abs(b64) ** 0.5, dt, rtol=tol * 4)
    check(B.pow(2.0, reverse=True), 2.0 ** b64, dt, rtol=tol * 60)
  np.testing.assert_array_equal(A.logical_not().numpy(), a == 0)
  np.testing.assert_array_equal(A.eq(B).numpy(), a == b)


def test_operator_method_details():
  assert Tensor([True, False]).neg().tolist() == [False, True]
  assert Tensor([True, False]).logical_not().tolist() == [False, True]
  assert Tensor([True, False]).bitwise_not().tolist() == [False, True]
  np.testing.assert_allclose(Tensor([1.0, 2.0]).lerp(Tensor([3.0, 6.0]), Tensor([0.25, 2.0])).numpy(), [1.5, 10.0])
  np.testing.assert_allclose(Tensor([2.0, 4.0]).div(1.0, reverse=True).numpy(), [0.5, 0.25])
  r = Tensor([1.0, -2.0, 0.0, 3.0, nan]).copysign(Tensor([-1.0, -0.0, -1.0, nan, -1.0])).numpy()
  np.testing.assert_array_equal(np.signbit(r), [True, True, True, False, True])
  np.testing.assert_array_equal(np.signbit(Tensor([-0.0, 1.0]).fmod(3.0).numpy()), [True, False])
  assert np.isnan(Tensor([1.0]).fmod(0.0).numpy()).all()
  with pytest.raises(RuntimeError, match="rounding_mode"): Tensor([1.0]).div(2, rounding_mode="round")
  with pytest.raises(TypeError): Tensor([1.0]).bitwise_not()
  with pytest.raises(TypeError): Tensor([1.0]).lshift(1)
  with pytest.raises(TypeError): Tensor([1.0]).add("a")
  with pytest.raises(TypeError): Tensor([1.0]).eq(object())
