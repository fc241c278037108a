"""tinygrad's activations (engine/tensor/activations.py) and losses (engine/tensor/losses.py) against hand-written
numpy references: values over shapes and float dtypes, large magnitudes, and the losses' ignore_index,
label_smoothing, weights and reductions."""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from rulec.engine.tensor import Tensor
from rulec.engine.tensor.args import ShapeError

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")
FLOATS = [np.float32, np.float64, np.float16]
RTOL = {np.float32: 2e-5, np.float64: 1e-12, np.float16: 3e-3}
ATOL = {np.float32: 1e-6, np.float64: 1e-12, np.float16: 2e-3}
shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4)
EDGES = [0.0, -0.0, 1.0, -1.0, 3.0, -3.0, 6.0, 7.0, 1e-4, -1e-4, 50.0, -50.0, 1000.0, -1000.0]


def farrays(dt, shape=shapes):
  elems = st.one_of(st.sampled_from(EDGES), st.floats(-20, 20, width=32))
  return hnp.arrays(np.float64, shape, elements=elems).map(lambda a: a.astype(dt))


def np_erf(x): return np.vectorize(math.erf, otypes=[np.float64])(x)
def np_sigmoid(x): return np.exp(-np.logaddexp(0, -x))
def np_softplus(x, beta=1.0): return np.logaddexp(0, beta * x) / beta


def np_softmax(x, axis=-1):
  e = np.exp(x - x.max(axis=axis, keepdims=True))
  return e / e.sum(axis=axis, keepdims=True)


REFS = {
  "gelu": lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))),
  "quick_gelu": lambda x: x * np_sigmoid(1.702 * x),
  "silu": lambda x: x * np_sigmoid(x),
  "swish": lambda x: x * np_sigmoid(x),
  "elu": lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0))),
  "celu": lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0))),
  "selu": lambda x: 1.0507 * np.where(x >= 0, x, 1.67326 * np.expm1(np.minimum(x, 0))),
  "leaky_relu": lambda x: np.where(x < 0, 0.01 * x, x),
  "relu6": lambda x: np.clip(x, 0, 6),
  "hardtanh": lambda x: np.clip(x, -1, 1),
  "hardsigmoid": lambda x: np.clip(x / 6 + 0.5, 0, 1),
  "hardswish": lambda x: x * np.clip(x + 3, 0, 6) / 6,
  "mish": lambda x: x * np.tanh(np_softplus(x)),
  "softplus": np_softplus,
  "softsign": lambda x: x / (1 + np.abs(x)),
  "logsigmoid": lambda x: -np_softplus(-x),
}


def check(got, ref, dt):
  assert got.dtype.name == np.dtype(dt).name
  want = np.asarray(ref).astype(dt).astype(np.float64)
  np.testing.assert_allclose(got.numpy().astype(np.float64), want, rtol=RTOL[dt], atol=ATOL[dt])


@pytest.mark.parametrize("dt", FLOATS)
@pytest.mark.parametrize("name", sorted(REFS))
@settings(max_examples=2)
@given(data=st.data())
def test_activation(name, dt, data):
  x = data.draw(farrays(dt))
  check(getattr(Tensor(x), name)(), REFS[name](x.astype(np.float64)), dt)


@pytest.mark.parametrize("dt", FLOATS)
def test_activation_edges_and_parameters(dt):
  x = np.array(EDGES, dtype=dt)
  x64, t = x.astype(np.float64), Tensor(x)
  for name, f in REFS.items(): check(getattr(t, name)(), f(x64), dt)
  check(t.gelu(approximate="none"), 0.5 * x64 * (1 + np_erf(x64 / math.sqrt(2))), dt)
  check(t.elu(alpha=2.0), np.where(x64 > 0, x64, 2 * np.expm1(np.minimum(x64, 0))), dt)
  check(t.celu(alpha=2.0), np.where(x64 > 0, x64, 2 * np.expm1(np.minimum(x64, 0) / 2)), dt)
  check(t.selu(alpha=1.5, gamma=2.0), 2.0 * np.where(x64 >= 0, x64, 1.5 * np.expm1(np.minimum(x64, 0))), dt)
  check(t.leaky_relu(neg_slope=0.2), np.where(x64 < 0, 0.2 * x64, x64), dt)
  check(t.hardtanh(-2.0, 0.5), np.clip(x64, -2, 0.5), dt)
  check(t.hardsigmoid(alpha=0.2, beta=0.4), np.clip(0.2 * x64 + 0.4, 0, 1), dt)
  check(t.softplus(beta=2.0), np_softplus(x64, 2.0), dt)


@pytest.mark.parametrize("dt", FLOATS)
@settings(max_examples=3)
@given(data=st.data())
def test_softmin(dt, data):
  x = data.draw(farrays(dt, hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4)))
  axis = data.draw(st.integers(-x.ndim, x.ndim - 1))
  check(Tensor(x).softmin(axis), np_softmax(-x.astype(np.float64), axis), dt)


def test_activation_dtypes():
  i = Tensor([-4, 1, 8])
  assert i.relu6().dtype.name == "int32" and i.relu6().tolist() == [0, 1, 6]
  assert i.hardtanh().dtype.name == "int32" and i.hardtanh().tolist() == [-1, 1, 1]
  for name in ("silu", "leaky_relu", "softsign", "gelu", "elu", "softplus"):
    r = getattr(i, name)()
    assert r.dtype.name == "float32", name
    np.testing.assert_allclose(r.numpy(), REFS[name](np.array([-4.0, 1.0, 8.0])), rtol=1e-5, atol=1e-6)
  r = Tensor([1, 2, 3]).softmin(dtype="float16")
  assert r.dtype.name == "float16"
  np.testing.assert_allclose(r.numpy(), np_softmax(-np.array([1.0, 2, 3])), rtol=2e-3)
  with pytest.raises(RuntimeError, match="approximate"): Tensor([1.0]).gelu(approximate="erf")


# *** losses ***

def np_log_softmax(x, axis):
  m = x.max(axis=axis, keepdims=True)
  return x - m - np.log(np.exp(x - m).sum(axis=axis, keepdims=True))


def np_reduce(loss, reduction, denom=None):
  if reduction == "none": return loss
  if reduction == "sum": return loss.sum()
  return loss.sum() / (loss.size if denom is None else denom)


def one_hot(y, C, axis):
  return np.moveaxis(np.arange(C) == y[..., None], -1, axis).astype(np.float64)


def np_cross_entropy(x, y, reduction, ls):
  ax = 1 if x.ndim > 1 else 0
  C = x.shape[ax]
  target = y if y.ndim == x.ndim else one_hot(y, C, ax)
  target = target * (1 - ls) + ls / C
  return np_reduce(-(np_log_softmax(x, ax) * target).sum(axis=ax), reduction)


def np_nll(x, y, weight, ignore_index, reduction):
  ax = 1 if x.ndim > 1 else 0
  hot = one_hot(y, x.shape[ax], ax)
  picked = -(x * hot).sum(axis=ax)
  w = np.ones(y.shape) if weight is None else (hot * weight.reshape([-1 if i == ax else 1 for i in range(x.ndim)])).sum(axis=ax)
  if ignore_index is not None: w = np.where(y == ignore_index, 0.0, w)
  return np_reduce(picked * w, reduction, w.sum())


def np_scce(x, y, ignore_index, ls, reduction):
  lsm = np_log_softmax(x, -1)
  loss = -(lsm * one_hot(y, x.shape[-1], -1)).sum(-1) * (1 - ls) - lsm.mean(-1) * ls
  keep = np.ones(y.shape, bool) if ignore_index == -1 else y != ignore_index
  loss = np.where(keep, loss, 0.0)
  return np_reduce(loss, reduction, keep.sum())


REDS = ["mean", "sum", "none"]
logit_shapes = st.tuples(st.integers(0, 4), st.integers(1, 5), st.sampled_from([(), (2,), (1, 3)]))


def loss_check(got, ref, dt=np.float32):
  ref = np.asarray(ref)
  assert got.shape == ref.shape
  np.testing.assert_allclose(got.numpy().astype(np.float64), ref, rtol=RTOL[dt] * 5, atol=ATOL[dt] * 5)


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@settings(max_examples=6)
@given(data=st.data())
def test_cross_entropy(dt, data):
  (n, C, rest), reduction = data.draw(logit_shapes), data.draw(st.sampled_from(REDS))
  ls = data.draw(st.sampled_from([0.0, 0.1, 0.5]))
  rng = np.random.default_rng(data.draw(st.integers(0, 100)))
  x = (rng.standard_normal((n, C) + rest) * 3).astype(dt)
  y = rng.integers(0, C, (n,) + rest).astype(np.int32)
  loss_check(Tensor(x).cross_entropy(Tensor(y), reduction, ls), np_cross_entropy(x.astype(np.float64), y, reduction, ls), dt)
  p = rng.random(x.shape).astype(dt)
  loss_check(Tensor(x).cross_entropy(Tensor(p), reduction, label_smoothing=ls),
             np_cross_entropy(x.astype(np.float64), p.astype(np.float64), reduction, ls), dt)


def test_cross_entropy_1d_and_half():
  x = np.array([1.0, 2.0, 3.0], np.float32)
  loss_check(Tensor(x).cross_entropy(Tensor(1)), np_cross_entropy(x.astype(np.float64), np.array(1), "mean", 0.0))
  loss_check(Tensor(x).cross_entropy(Tensor([0.0, 1.0, 0.0])), np_cross_entropy(x.astype(np.float64), np.array([0.0, 1, 0]), "mean", 0.0))
  h = Tensor(np.array([[1.0, 2.0, 0.5]], np.float16)).cross_entropy(Tensor([2]))
  np.testing.assert_allclose(h.numpy(), np_cross_entropy(np.array([[1.0, 2.0, 0.5]]), np.array([2]), "mean", 0.0), rtol=3e-3)


@settings(max_examples=8)
@given(data=st.data())
def test_nll_loss(data):
  (n, C, rest), reduction = data.draw(logit_shapes), data.draw(st.sampled_from(REDS))
  rng = np.random.default_rng(data.draw(st.integers(0, 100)))
  x = np_log_softmax(rng.standard_normal((n, C) + rest), 1).astype(np.float32)
  y = rng.integers(0, C, (n,) + rest).astype(np.int32)
  weight = data.draw(st.sampled_from([None, rng.random(C).astype(np.float32) + 0.1]))
  ignore = data.draw(st.sampled_from([None, 0, C - 1]))
  got = Tensor(x).nll_loss(Tensor(y), None if weight is None else Tensor(weight), ignore, reduction)
  ref = np_nll(x.astype(np.float64), y, weight, ignore, reduction)
  if reduction == "mean" and not np.isfinite(ref): assert np.isnan(got.numpy())   # all ignored (or empty): 0 / 0
  else: loss_check(got, ref)


@settings(max_examples=8)
@given(data=st.data())
def test_sparse_categorical_crossentropy(data):
  (n, C, rest), reduction = data.draw(logit_shapes), data.draw(st.sampled_from(REDS))
  rng = np.random.default_rng(data.draw(st.integers(0, 100)))
  x = (rng.standard_normal((n,) + rest + (C,)) * 3).astype(np.float32)
  y = rng.integers(-1, C + 1, (n,) + rest).astype(np.int32)   # -1 and C select no class
  ignore = data.draw(st.sampled_from([-1, 0, C]))
  ls = data.draw(st.sampled_from([0.0, 0.2]))
  got = Tensor(x).sparse_categorical_crossentropy(Tensor(y), ignore, ls, reduction)
  ref = np_scce(x.astype(np.float64), y, ignore, ls, reduction)
  if reduction == "mean" and not np.isfinite(ref): assert np.isnan(got.numpy())
  else: loss_check(got, ref)


def test_sparse_categorical_ignore_index_semantics():
  x = Tensor(np.array([[1.0, 2.0, 3.0], [0.5, 0.0, -1.0], [2.0, 2.0, 2.0]], np.float32))
  lsm = np_log_softmax(x.numpy().astype(np.float64), -1)
  r = x.sparse_categorical_crossentropy(Tensor([0, 2, 1]), ignore_index=2, reduction="none").numpy()
  np.testing.assert_allclose(r, [-lsm[0, 0], 0.0, -lsm[2, 1]], rtol=1e-6)
  m = x.sparse_categorical_crossentropy(Tensor([0, 2, 1]), ignore_index=2).item()
  np.testing.assert_allclose(m, (-lsm[0, 0] - lsm[2, 1]) / 2, rtol=1e-6)
  # the default ignore_index=-1 ignores nothing: -1 selects no class and counts toward the mean
  d = x.sparse_categorical_crossentropy(Tensor([0, -1, 1])).item()
  np.testing.assert_allclose(d, (-lsm[0, 0] - lsm[2, 1]) / 3, rtol=1e-6)


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@settings(max_examples=5)
@given(data=st.data())
def test_binary_crossentropy(dt, data):
  shape, reduction = data.draw(hnp.array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=4)), data.draw(st.sampled_from(REDS))
  rng = np.random.default_rng(data.draw(st.integers(0, 100)))
  z = (rng.standard_normal(shape) * 4).astype(dt)
  y = rng.random(shape).astype(dt)
  p = np.clip(1 / (1 + np.exp(-z.astype(np.float64))), 1e-6, 1 - 1e-6).astype(dt)
  p64, y64, z64 = p.astype(np.float64), y.astype(np.float64), z.astype(np.float64)
  bce = -(y64 * np.log(p64) + (1 - y64) * np.log(1 - p64))
  loss_check(Tensor(p).binary_crossentropy(Tensor(y), reduction), np_reduce(bce, reduction), dt)
  logits = y64 * np_softplus(-z64) + (1 - y64) * np_softplus(z64)
  loss_check(Tensor(z).binary_crossentropy_logits(Tensor(y), reduction), np_reduce(logits, reduction), dt)
  pw = (rng.random(shape[-1:]) + 0.5).astype(dt)
  weighted = pw.astype(np.float64) * y64 * np_softplus(-z64) + (1 - y64) * np_softplus(z64)
  loss_check(Tensor(z).binary_crossentropy_logits(Tensor(y), reduction, Tensor(pw)), np_reduce(weighted, reduction), dt)


def test_binary_crossentropy_logits_large():
  z, y = Tensor([-1000.0, -100.0, 0.0, 100.0, 1000.0]), Tensor([0.0, 1.0, 1.0, 0.0, 1.0])
  np.testing.assert_allclose(z.binary_crossentropy_logits(y, "none").numpy(), [0.0, 100.0, math.log(2), 100.0, 0.0], atol=1e-6)


def test_loss_errors():
  x = Tensor(np.zeros((3, 4), np.float32))
  for f in (lambda: x.cross_entropy(Tensor([0, 1, 2]), reduction="foo"),
            lambda: x.nll_loss(Tensor([0, 1, 2]), reduction="avg"),
            lambda: x.sparse_categorical_crossentropy(Tensor([0, 1, 2]), reduction="Mean"),
            lambda: x.binary_crossentropy(x, reduction="x"),
            lambda: x.binary_crossentropy_logits(x, reduction="x")):
    with pytest.raises(ValueError, match="must be one of"): f()
  with pytest.raises(ShapeError, match=r"\(2,\)"): x.cross_entropy(Tensor([0, 1]))
  with pytest.raises(RuntimeError, match=r"\(3, 5\)"): x.cross_entropy(Tensor(np.zeros((3, 5), np.float32)))
  with pytest.raises(RuntimeError, match="integer"): x.cross_entropy(Tensor([0.0, 1.0, 2.0]))
  with pytest.raises(ShapeError): x.sparse_categorical_crossentropy(Tensor([[0, 1, 2]]))
