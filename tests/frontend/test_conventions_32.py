"""tinygrad conventions that rulec missed (issue #32, item 9): gradients at singular points, the exception classes
of common mistakes, arange's overflow, a tuple as an index array, reflect / replicate padding that crops and pads
one axis, normalize(p=0), uint8 bilinear interpolation, and `requires_grad=` on the constructors.

Expected values were measured on tinygrad 0.14 (its PYTHON device) or follow torch's gradient formulas, and are
checked against numpy references and float64 finite differences; tinygrad is not imported here."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rulec import Tensor
from rulec.engine.ir.dtypes import dtypes


def grad(fn, x, *others):
  """d sum(fn(x, *others)) / dx at x (float32)."""
  t = Tensor(np.asarray(x, np.float32))
  return fn(t, *others).sum().gradient(t)[0].numpy()


def fd(f, x: np.ndarray, h: float = 1e-6) -> np.ndarray:
  """Central finite differences of an elementwise float64 function."""
  return (f(x + h) - f(x - h)) / (2 * h)


SPECIAL = [0.0, -0.0, 1.0, -2.0, math.inf, -math.inf]


# *** gradients at singular points ***

def test_abs_sign_copysign_gradients_at_zero():
  # tinygrad (abs = x * sign(x)) and torch: the gradient of |x| is sign(x), 0 at +-0.0
  np.testing.assert_array_equal(grad(Tensor.abs, SPECIAL), [0, 0, 1, -1, 1, -1])
  np.testing.assert_array_equal(grad(Tensor.sign, SPECIAL), [0] * 6)
  signs = Tensor(np.array([1, -1, 1, -1, 1, -1], np.float32))
  np.testing.assert_array_equal(grad(lambda t: t.copysign(signs), SPECIAL), [0, 0, 1, 1, 1, 1])
  np.testing.assert_array_equal(grad(lambda t: t.copysign(-1.0), SPECIAL), [0, 0, -1, 1, -1, 1])
  np.testing.assert_array_equal(grad(lambda t: t.copysign(Tensor(np.full(6, -0.0, np.float32))), SPECIAL), [0, 0, -1, 1, -1, 1])
  # the sign's own source gets a zero gradient
  y = Tensor(np.array(SPECIAL, np.float32))
  np.testing.assert_array_equal(Tensor.ones(6).copysign(y).sum().gradient(y)[0].numpy(), [0] * 6)


def test_functions_built_on_abs_keep_their_gradient_at_zero():
  # odd functions are built from their value at |x|: their gradient at +-0 is still f'(0), not 0
  z = [0.0, -0.0]
  np.testing.assert_allclose(grad(Tensor.asinh, z), [1, 1])
  np.testing.assert_allclose(grad(Tensor.atan, z), [1, 1])
  np.testing.assert_allclose(grad(Tensor.erf, z), [2 / math.sqrt(math.pi)] * 2, rtol=1e-6)
  np.testing.assert_allclose(grad(Tensor.sinh, z), [1, 1])
  np.testing.assert_allclose(grad(Tensor.tanh, z), [1, 1])
  np.testing.assert_allclose(grad(Tensor.cosh, z), [0, 0])
  np.testing.assert_allclose(grad(lambda t: t.fmod(3.0), z + [4.0, -4.0]), [1, 1, 1, 1])
  # and those that tinygrad builds from logaddexp now agree with it at 0 (the maximum's tie sends half each way)
  np.testing.assert_allclose(grad(Tensor.softplus, z), [0.5, 0.5])
  np.testing.assert_allclose(grad(Tensor.logsigmoid, [0.0]), [0.5])


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(0.05, 20.0) | st.floats(-20.0, -0.05), min_size=1, max_size=8))
def test_abs_sign_copysign_gradients_match_finite_differences(xs):
  x = np.array(xs, np.float32).astype(np.float64)
  np.testing.assert_allclose(grad(Tensor.abs, x), fd(np.abs, x), rtol=1e-5)
  np.testing.assert_allclose(grad(Tensor.sign, x), 0.0)
  np.testing.assert_allclose(grad(lambda t: t.copysign(-2.0), x), fd(lambda v: np.copysign(v, -2.0), x), rtol=1e-5)


def test_pow_gradient_of_a_zero_exponent_is_zero():
  for f in (lambda t: t ** 0, lambda t: t ** 0.0, lambda t: t ** Tensor.zeros(6)):
    np.testing.assert_array_equal(grad(f, SPECIAL), [0] * 6)
  # the base's gradient where it is 0, for exponents -1, -0.5, 0, 0.5, 2, 3 (tinygrad, torch)
  ys = Tensor(np.array([-1.0, -0.5, 0.0, 0.5, 2.0, 3.0], np.float32))
  np.testing.assert_array_equal(grad(lambda t: t ** ys, [0.0] * 6), [-math.inf, -math.inf, 0, math.inf, 0, 0])


def test_pow_gradient_of_the_exponent_of_zero():
  # d/dy 0 ** y: -inf for y < 0 (0^y is inf, log 0 is -inf), 0 for y >= 0 (tinygrad and torch)
  ys = [-2.0, -1.0, -0.5, 0.0, 0.5, 2.0]
  want = [-math.inf, -math.inf, -math.inf, 0, 0, 0]
  np.testing.assert_array_equal(grad(lambda t: Tensor.zeros(6) ** t, ys), want)
  np.testing.assert_array_equal(grad(lambda t: 0.0 ** t, ys), want)
  # a zero gradient flowing in stays zero (no 0 * inf)
  np.testing.assert_array_equal(grad(lambda t: (Tensor.zeros(6) ** t) * 0.0, ys), [0] * 6)


@pytest.mark.parametrize("x", [-math.inf, 0.0, 1.0, math.inf, -2.0])
def test_pow_constant_exponent_gradient_is_torchs(x):
  # torch: c * x ** (c - 1), and 0 for c == 0 (tinygrad's test_pow_const_direct)
  for c in (-1, 0, 0.3, 1, 2):
    t = Tensor([x])
    got = (t ** c)[0].gradient(t)[0].item()
    with np.errstate(all="ignore"): want = 0.0 if c == 0 else float(c * np.power(np.float32(x), np.float32(c - 1)))
    assert got == want or (math.isnan(got) and math.isnan(want)), (x, c, got, want)


def test_sigmoid_gradient_far_out_is_zero():
  for v in (300.0, -300.0, 350.0, -400.0):
    x = Tensor([v])
    assert x.sigmoid()[0].gradient(x)[0].item() == 0.0


def test_acosh_and_atanh_gradients_outside_their_domain():
  # torch's and tinygrad's: 1 / sqrt(x^2 - 1) and 1 / (1 - x^2) wherever those are defined, even where the value
  # is NaN (acosh below -1, atanh outside [-1, 1]); NaN between -1 and 1 for acosh, inf at +-1; NaN at +-1 for atanh
  xs = [0.5, 1.0, 2.0, -2.0, -1.0, -300.0, 300.0, 5000.0]
  got = grad(Tensor.acosh, xs)
  with np.errstate(all="ignore"): want = 1 / np.sqrt(np.float64(xs) ** 2 - 1)
  np.testing.assert_allclose(got, want, rtol=1e-5)
  xs = [1.5, 1.0, -1.0, 0.5, -2.0, 300.0, -300.0, 0.0]
  got = grad(Tensor.atanh, xs)
  with np.errstate(all="ignore"): want = 1 / (1 - np.float64(xs) ** 2)
  want[1:3] = np.nan
  np.testing.assert_allclose(got, want, rtol=1e-5)
  # the values themselves are unchanged: NaN outside the domain, +-inf at atanh's ends
  with np.errstate(all="ignore"):
    np.testing.assert_allclose(Tensor([0.5, 1.0, 2.0, -2.0]).acosh().numpy(), np.arccosh(np.float32([0.5, 1, 2, -2])), rtol=1e-6)
    np.testing.assert_allclose(Tensor([1.5, 1.0, -1.0, 0.5]).atanh().numpy(), np.arctanh(np.float32([1.5, 1, -1, 0.5])), rtol=1e-6)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(1.01, 200.0) | st.floats(-200.0, -1.01), min_size=1, max_size=8))
def test_acosh_atanh_gradients_match_finite_differences(xs):
  x = np.array(xs, np.float32).astype(np.float64)
  # acosh below -1 has no real value; its gradient is that of -acosh(-x) there
  np.testing.assert_allclose(grad(Tensor.acosh, x), fd(lambda v: np.sign(v) * np.arccosh(np.abs(v)), x), rtol=1e-4)
  np.testing.assert_allclose(grad(Tensor.atanh, x), 1 / (1 - x * x), rtol=1e-4)
  inside = np.clip(x / 250.0, -0.99, 0.99)
  np.testing.assert_allclose(grad(Tensor.atanh, inside), fd(np.arctanh, inside.astype(np.float32).astype(np.float64)),
                             rtol=1e-4)


# *** exception classes (tinygrad's) ***

def test_exception_classes():
  x = Tensor(np.ones((3, 3), np.float32))
  with pytest.raises(RuntimeError): x.diagonal(dim1=0, dim2=0)
  with pytest.raises(RuntimeError): x.diagonal(dim1=-1, dim2=1)
  with pytest.raises(IndexError): Tensor(3.14).cat(Tensor(3.14))
  with pytest.raises(IndexError): Tensor.cat(Tensor(1.0), Tensor(2.0))
  with pytest.raises(RuntimeError): Tensor.ones(2, 4).roll((1, 2))
  with pytest.raises(RuntimeError): x.roll(shifts=1, dims=(0, 1))
  with pytest.raises(RuntimeError): Tensor.ones(10).roll(shifts=(1, 2), dims=0)
  with pytest.raises(IndexError): x.roll(1, 5)
  u = Tensor.ones(8)
  with pytest.raises(RuntimeError): u.unfold(0, 9, 3)
  with pytest.raises(IndexError): u.unfold(1, 8, 3)
  with pytest.raises(RuntimeError): u.unfold(0, 1, -1)
  with pytest.raises(RuntimeError): u.unfold(0, 1, 0)
  with pytest.raises(RuntimeError): u.unfold(0, -1, 1)
  with pytest.raises(RuntimeError): Tensor([0.0, 1.0]).meshgrid(indexing="bad")
  for method in (Tensor.kaiming_uniform, Tensor.kaiming_normal):
    with pytest.raises(ValueError): method(-3, 3)
    with pytest.raises(ValueError): method((-3, 3), 3)
    with pytest.raises(ValueError): method((3, 3), 3)
  a = Tensor.ones(2, 3, 4)
  with pytest.raises((RuntimeError, IndexError)): Tensor.einsum("...ik..., ...jk ->", [a, a])
  with pytest.raises((RuntimeError, IndexError)): Tensor.einsum("...i,...i->......", a, a)
  with pytest.raises(RuntimeError): Tensor.einsum("i...j,ji...->...", [a, a])
  with pytest.raises(RuntimeError): Tensor.einsum("pqrs,tuqvr->pstuv", [Tensor.ones(3, 8, 10, 5), Tensor.ones(11, 5, 13, 16, 8)])
  # the classes rulec raised before still catch them (each error class keeps its older base)
  with pytest.raises(ValueError): x.diagonal(dim1=0, dim2=0)
  with pytest.raises(ValueError): Tensor.ones(10).roll(shifts=(1, 2), dims=0)
  with pytest.raises(TypeError): Tensor.kaiming_uniform((3, 3), 3)
  with pytest.raises(ValueError): Tensor(3.14).cat(Tensor(3.14))


def test_arange_that_overflows_its_dtype_raises_overflow_error():
  with pytest.raises(OverflowError): Tensor.arange(2**33, dtype=dtypes.int32)
  with pytest.raises(OverflowError): Tensor.arange(129, dtype=dtypes.int8)            # last = 128
  with pytest.raises(OverflowError): Tensor.arange(-129, 128, dtype=dtypes.int8)      # first = -129
  with pytest.raises(OverflowError): Tensor.arange(128, 0, -1, dtype=dtypes.int8)     # first = 128
  with pytest.raises(OverflowError): Tensor.arange(127, -130, -1, dtype=dtypes.int8)  # last = -129
  with pytest.raises(OverflowError): Tensor.arange(0, 300.5, 1.5, dtype=dtypes.uint8)
  with pytest.raises(OverflowError): Tensor.arange(-1, 3, dtype=dtypes.uint16)
  with pytest.raises(OverflowError): Tensor.arange(2**63, 2**63 + 2)                  # past int64
  # what fits is made, exactly at the edges
  np.testing.assert_array_equal(Tensor.arange(128, dtype=dtypes.int8).numpy(), np.arange(128, dtype=np.int8))
  np.testing.assert_array_equal(Tensor.arange(-128, 128, dtype=dtypes.int8).numpy(), np.arange(-128, 128, dtype=np.int8))
  np.testing.assert_array_equal(Tensor.arange(127, -129, -1, dtype=dtypes.int8).numpy(), np.arange(127, -129, -1, dtype=np.int8))
  np.testing.assert_array_equal(Tensor.arange(0, 256, 100, dtype=dtypes.uint8).numpy(), [0, 100, 200])
  assert Tensor.arange(300, 0, dtype=dtypes.int8).shape == (0,)   # empty: nothing to overflow
  assert Tensor.arange(2**31, 2**31 + 3).dtype is dtypes.int64
  assert Tensor.arange(0, 70000, 1000, dtype=dtypes.float16).shape == (70,)   # floats are not checked


def test_linspace_bool_and_stack_of_a_list_and_a_tensor_are_refused():
  with pytest.raises(ValueError): Tensor.linspace(5, 10, 3, dtype="bool")
  with pytest.raises(ValueError): Tensor.linspace(5, 10, 3, dtype=dtypes.bool)
  a, b, c = Tensor([1, 2]), Tensor([3, 4]), Tensor([5, 6])
  with pytest.raises(ValueError): Tensor.stack((a, b), c)   # torch's stack(tensors, dim): c is no third tensor
  with pytest.raises(ValueError): Tensor.cat([a, b], c)
  np.testing.assert_array_equal(Tensor.stack((a, b), dim=1).numpy(), [[1, 3], [2, 4]])
  np.testing.assert_array_equal(Tensor.stack([a, b, c]).numpy(), [[1, 2], [3, 4], [5, 6]])
  np.testing.assert_array_equal(a.stack(b, c).numpy(), [[1, 2], [3, 4], [5, 6]])


# *** a tuple inside an index is an index array ***

XN = np.arange(2 * 5 * 6 * 5 * 3 * 4, dtype=np.float32).reshape(2, 5, 6, 5, 3, 4)
J, K, O = np.array([[0], [1]]), np.array([[1, 2]]), np.array([0, 3])


@pytest.mark.parametrize("index", [
  lambda j, k, o: ((0,), j, k, o, slice(None)),
  lambda j, k, o: ((1, 0), j, k, o, slice(None)),
  lambda j, k, o: (((0,),),),
  lambda j, k, o: ((0,),),
  lambda j, k, o: ((0,), 1, Ellipsis),
  lambda j, k, o: ((0,), slice(None), 1),
  lambda j, k, o: ((1, 0), Ellipsis),
  lambda j, k, o: (1, (0, 2)),
  lambda j, k, o: ((0,), None, 1),
  lambda j, k, o: (((0, 1), (1, 0)),),
  lambda j, k, o: (j, (2, 1), Ellipsis, (3, 0)),
])
def test_tuple_as_an_advanced_index(index):
  x = Tensor(XN)
  got = x[index(Tensor(J.astype(np.int32)), Tensor(K.astype(np.int32)), Tensor(O.astype(np.int32)))].numpy()
  want = XN[index(J, K, O)]
  assert got.shape == want.shape
  np.testing.assert_array_equal(got, want)


# *** reflect / replicate padding with a crop and a pad on one axis ***

def _pad_ref(x: np.ndarray, pads, mode: str) -> np.ndarray:
  """tinygrad's (and torch's) meaning: pad from the whole axis, then crop."""
  np_mode = {"reflect": "reflect", "replicate": "edge"}[mode]
  p = np.pad(x, [(max(b, 0), max(a, 0)) for b, a in pads], mode=np_mode)
  return p[tuple(slice(-min(b, 0), p.shape[i] + min(a, 0)) for i, (b, a) in enumerate(pads))]


@pytest.mark.parametrize("mode", ["reflect", "replicate"])
def test_pad_that_crops_and_pads_one_axis(mode):
  x = np.arange(25, dtype=np.float32).reshape(1, 1, 5, 5)
  # tinygrad's test_pad_reflect_mode / test_pad_replicate_mode cases (torch's flat order: last axis first)
  for flat in [(-1, 2, 2, -1), (3, -3, 0, -3), (3, -5, 1, -5), (0, 0, 0, -5), (4, 4, 0, 4), (-2, 3, 0, 0), (2, -4, -1, 4)]:
    pads = [(0, 0), (0, 0), (flat[2], flat[3]), (flat[0], flat[1])]
    np.testing.assert_array_equal(Tensor(x).pad(flat, mode=mode).numpy(), _pad_ref(x, pads, mode), err_msg=str(flat))
  # 1-d: reflecting into what the crop removes ([0..4] padded by 3 on the right, then its first 2 cropped)
  v = np.arange(5, dtype=np.float32)
  np.testing.assert_array_equal(Tensor(v).pad(((-2, 3),), mode=mode).numpy(), _pad_ref(v, [(-2, 3)], mode))
  if mode == "reflect":
    with pytest.raises(ValueError): Tensor(x).pad((3, 5, 0, 0), mode=mode)   # a pad as long as the axis


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["reflect", "replicate"]), st.integers(1, 6),
       st.lists(st.tuples(st.integers(-5, 5), st.integers(-5, 5)), min_size=2, max_size=2))
def test_pad_crop_matches_numpy(mode, n, pads):
  x = np.arange(n * 4, dtype=np.float32).reshape(n, 4)
  shape = x.shape
  if any(max(b, 0) >= d or max(a, 0) >= d for (b, a), d in zip(pads, shape)) and mode == "reflect": return
  if any(d + max(b, 0) + max(a, 0) + min(b, 0) + min(a, 0) < 0 for (b, a), d in zip(pads, shape)): return
  np.testing.assert_array_equal(Tensor(x).pad(tuple(pads), mode=mode).numpy(), _pad_ref(x, pads, mode))


# *** normalize ***

def test_normalize_p0_and_infinite_p():
  q = np.array([[3.0, 0.0, -4.0], [0.0, 0.0, 0.0], [1.0, 2.0, 0.0]], np.float32)
  nz = np.maximum((q != 0).sum(1, keepdims=True), 1e-12)
  np.testing.assert_allclose(Tensor(q).normalize(p=0).numpy(), q / nz)   # tinygrad: [[1.5, 0, -2], [0, 0, 0], [.5, 1, 0]]
  np.testing.assert_allclose(Tensor(q).normalize(p=0, dim=0).numpy(), q / np.maximum((q != 0).sum(0, keepdims=True), 1e-12))
  np.testing.assert_allclose(Tensor(q).normalize(p=math.inf).numpy(), q / np.maximum(np.abs(q).max(1, keepdims=True), 1e-12))
  np.testing.assert_allclose(Tensor(q).normalize(p=-math.inf, dim=0).numpy(),
                             q / np.maximum(np.abs(q).min(0, keepdims=True), 1e-12))
  np.testing.assert_allclose(Tensor(q).normalize(p=1).numpy(), q / np.maximum(np.abs(q).sum(1, keepdims=True), 1e-12),
                             rtol=1e-6)
  # p=0's norm is a count: the gradient is 1 / count (torch's norm(p=0) has a zero gradient)
  t = Tensor(np.array([[3.0, 0.0, -4.0]], np.float32))
  np.testing.assert_allclose(t.normalize(p=0).sum().gradient(t)[0].numpy(), [[0.5, 0.5, 0.5]])


# *** uint8 bilinear interpolation rounds each axis to the nearest integer ***

def _linear_weights(n_in: int, n_out: int, align_corners: bool) -> np.ndarray:
  o = np.arange(n_out, dtype=np.float64)
  src = o * (n_in - 1) / (n_out - 1) if align_corners and n_out > 1 else \
    (np.zeros(n_out) if align_corners else np.maximum((o + 0.5) * n_in / n_out - 0.5, 0.0))
  i0 = np.minimum(np.floor(src), n_in - 1).astype(int)
  i1 = np.minimum(i0 + 1, n_in - 1)
  w = np.zeros((n_out, n_in))
  np.add.at(w, (np.arange(n_out), i0), 1 - (src - i0))
  np.add.at(w, (np.arange(n_out), i1), src - i0)
  return w


def _bilinear_u8_ref(x: np.ndarray, size, align_corners=False) -> tuple[np.ndarray, bool]:
  """torch's (and tinygrad's) uint8 resize: one axis at a time, the last first, each result rounded half up; and
  whether some value before its rounding lay within 1e-4 of a tie (rounding errors in the weights decide its side)."""
  y, near_tie = x.astype(np.float64), False
  for ax in range(-1, -len(size) - 1, -1):
    w = _linear_weights(y.shape[ax], size[ax], align_corners)
    v = np.moveaxis(np.moveaxis(y, ax, -1) @ w.T, -1, ax)
    # (a tie of the exact arithmetic too: 19/6 + 4 * 5/6 is 6.5, which float64 computes as 6.4999..., float32 6.50...1)
    near_tie |= bool((np.abs(v - np.floor(v) - 0.5) < 1e-4).any())
    y = np.floor(v + 0.5)
  return y.astype(np.uint8), near_tie


def test_uint8_bilinear_rounds_to_nearest():
  x = np.array([[[[0, 1], [1, 3]]]], np.uint8)
  # tinygrad 0.14: [[0, 0, 1, 1], [0, 1, 2, 2], [1, 2, 3, 3], [1, 2, 3, 3]] (before: 0.5 and 1.5 were truncated)
  want = [[[[0, 0, 1, 1], [0, 1, 2, 2], [1, 2, 3, 3], [1, 2, 3, 3]]]]
  np.testing.assert_array_equal(Tensor(x).interpolate((4, 4), mode="linear").numpy(), want)
  np.testing.assert_array_equal(_bilinear_u8_ref(x, (4, 4))[0], want)
  big = np.array([[[[0, 255], [255, 0]]]], np.uint8)
  np.testing.assert_array_equal(Tensor(big).interpolate((3, 3)).numpy(), [[[[0, 128, 255], [128, 128, 128], [255, 128, 0]]]])
  # int32: computed in float across both axes and truncated once (tinygrad)
  np.testing.assert_array_equal(Tensor(x.astype(np.int32)).interpolate((4, 4)).numpy(),
                                [[[[0, 0, 0, 1], [0, 0, 1, 1], [0, 1, 2, 2], [1, 1, 2, 3]]]])


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2**32 - 1), st.tuples(st.integers(1, 9), st.integers(1, 9)), st.tuples(st.integers(1, 12), st.integers(1, 12)),
       st.booleans())
def test_uint8_bilinear_against_reference(seed, shape, size, align_corners):
  # tinygrad's TestOpsUint8.test_interpolate_bilinear draws (10 * x).relu() as uint8 and compares with torch
  x = np.random.default_rng(seed).integers(0, 256, (2,) + shape).astype(np.uint8)
  got = Tensor(x).interpolate(size, mode="linear", align_corners=align_corners).numpy()
  want, near_tie = _bilinear_u8_ref(x, size, align_corners)
  if near_tie: assert np.abs(got.astype(int) - want).max() <= 1   # a tie's side is the weights' last bit
  else: np.testing.assert_array_equal(got, want)


# *** requires_grad= on the constructors ***

@pytest.mark.parametrize("make", [
  lambda **k: Tensor.rand(2, 3, **k), lambda **k: Tensor.randn(3, **k), lambda **k: Tensor.zeros(2, 3, **k),
  lambda **k: Tensor.ones(4, **k), lambda **k: Tensor.full((2,), 1.5, **k), lambda **k: Tensor.empty(2, **k),
  lambda **k: Tensor.uniform(3, low=-1, high=1, **k), lambda **k: Tensor.normal(3, **k), lambda **k: Tensor.eye(2, **k),
  lambda **k: Tensor.arange(3.0, **k), lambda **k: Tensor.linspace(0, 1, 3, **k), lambda **k: Tensor.kaiming_uniform(2, 3, **k),
  lambda **k: Tensor.glorot_uniform(2, 3, **k), lambda **k: Tensor.zeros_like(Tensor([1.0, 2.0]), **k),
  lambda **k: Tensor.rand_like(Tensor([1.0, 2.0]), **k),
])
def test_constructors_take_requires_grad(make):
  t = make(requires_grad=True)
  assert t.requires_grad is True
  (t * t).sum().backward()
  assert t.grad is not None and t.grad.shape == t.shape
  np.testing.assert_allclose(t.grad.numpy(), 2 * t.numpy(), rtol=1e-6)
  assert make(requires_grad=False).requires_grad is False
  assert make().requires_grad is None   # as made: any float tensor gets a gradient (tinygrad)
