"""Scans (cumsum, cumprod, cummax, cummin, logcumsumexp) and sorting (sort, argsort, topk) against numpy, with
tinygrad 0.14's signatures, return types and tie behaviour (stable sort; cummax indices at the first maximum)."""
from __future__ import annotations

import inspect

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rulec.engine.ir.dtypes import dtypes
from rulec import Tensor

SETTINGS = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large]}
seed_st = st.integers(0, 2**31 - 1)
shape_st = st.lists(st.integers(0, 5), min_size=0, max_size=3).map(tuple)


def data(rng, shape, dt, ties=True):
  if dt is np.bool_: return rng.random(shape) < 0.5
  if dt is np.int32: return rng.integers(-4 if ties else -1000, 4 if ties else 1000, shape).astype(np.int32)
  a = rng.standard_normal(shape).astype(np.float32)
  return np.round(a, 1) if ties else a


def axis_of(draw, shape):
  nd = max(len(shape), 1)
  return draw.draw(st.integers(-nd, nd - 1))


def first_index_of_running(a, vals, axis):
  """numpy reference for cummax/cummin indices: the first position where each running value is reached."""
  a, vals = np.moveaxis(a, axis, -1), np.moveaxis(vals, axis, -1)
  out = np.zeros(a.shape, np.int32)
  for pos in np.ndindex(*a.shape):
    row, v = a[pos[:-1]][:pos[-1] + 1], vals[pos]
    hit = np.isnan(row) if isinstance(v, (float, np.floating)) and np.isnan(v) else row == v   # (np.float32 is no float)
    out[pos] = np.argmax(hit)
  return np.moveaxis(out, -1, axis)


def test_signatures_are_tinygrads():
  sig = lambda f: str(inspect.signature(f)).replace("'", "").replace(" -> Tensor", "")
  assert "(self, axis: int = 0)" in sig(Tensor.cumsum) and "(self, axis: int)" in sig(Tensor.cumprod)
  assert "(self, axis: int = 0)" in sig(Tensor.cummax) and "(self, axis: int = 0)" in sig(Tensor.logcumsumexp)
  assert "(self, dim: int = -1, descending: bool = False)" in sig(Tensor.sort)
  assert "(self, k: int, dim: int = -1, largest: bool = True, sorted_: bool = True)" in sig(Tensor.topk)


# *** scans ***

@settings(max_examples=30, **SETTINGS)
@given(shape_st, st.sampled_from([np.float32, np.int32, np.bool_]), seed_st, st.data())
def test_cumsum_cumprod_match_numpy(shape, dt, seed, draw):
  rng = np.random.default_rng(seed)
  a = data(rng, shape, dt)
  ax = axis_of(draw, shape)
  t = Tensor(a)
  want_sum = np.cumsum(a.reshape(1) if a.ndim == 0 else a, axis=ax).reshape(a.shape)
  got = t.cumsum(ax)
  if dt is not np.float32: assert got.dtype is dtypes.int32   # tinygrad: sums of bool and int32 are int32
  np.testing.assert_allclose(got.numpy(), want_sum, rtol=1e-5, atol=1e-5)
  want_prod = np.cumprod(a.reshape(1) if a.ndim == 0 else a, axis=ax).reshape(a.shape)
  np.testing.assert_allclose(t.cumprod(ax).numpy(), want_prod, rtol=1e-5, atol=1e-5)


@settings(max_examples=30, **SETTINGS)
@given(shape_st, st.sampled_from([np.float32, np.int32, np.bool_]), seed_st, st.data())
def test_cummax_cummin_values_and_first_indices(shape, dt, seed, draw):
  rng = np.random.default_rng(seed)
  a = data(rng, shape, dt)
  if dt is np.float32 and a.size and draw.draw(st.booleans()): a.flat[rng.integers(a.size)] = np.nan
  ax = axis_of(draw, shape)
  a1 = a.reshape(1) if a.ndim == 0 else a
  for name, acc in (("cummax", np.maximum.accumulate), ("cummin", np.minimum.accumulate)):
    vals, idx = getattr(Tensor(a), name)(ax)
    want = acc(a1, axis=ax).reshape(a.shape)
    assert vals.dtype is Tensor(a).dtype and idx.dtype is dtypes.int32
    np.testing.assert_array_equal(vals.numpy(), want)
    np.testing.assert_array_equal(idx.numpy(), first_index_of_running(a1, want.reshape(a1.shape), ax).reshape(a.shape))


@settings(max_examples=20, **SETTINGS)
@given(shape_st, seed_st, st.data())
def test_logcumsumexp_matches_numpy(shape, seed, draw):
  rng = np.random.default_rng(seed)
  a = (rng.standard_normal(shape) * draw.draw(st.sampled_from([1.0, 100.0]))).astype(np.float32)
  if a.size and draw.draw(st.booleans()): a.flat[rng.integers(a.size)] = draw.draw(st.sampled_from([np.inf, -np.inf]))
  ax = axis_of(draw, shape)
  a1 = a.reshape(1) if a.ndim == 0 else a
  want = np.logaddexp.accumulate(a1.astype(np.float64), axis=ax).reshape(a.shape)
  np.testing.assert_allclose(Tensor(a).logcumsumexp(ax).numpy(), want, rtol=1e-5, atol=1e-5)


def test_scans_dtypes_long_axes_and_errors():
  assert Tensor([1, 2], dtype=dtypes.int8).cumsum().dtype is dtypes.int32
  assert Tensor([1.0, 2.0], dtype=dtypes.float16).cumsum().dtype is dtypes.float16
  assert Tensor([1, 2]).logcumsumexp().dtype is dtypes.float32
  h = Tensor([1.0, 2.0], dtype=dtypes.float16).logcumsumexp()
  assert h.dtype is dtypes.float16
  np.testing.assert_allclose(h.numpy(), np.logaddexp.accumulate([1.0, 2.0]), rtol=1e-3)
  np.testing.assert_allclose(Tensor([-1000.0, 0.0]).logcumsumexp().numpy(), [-1000, 0])   # each prefix its own shift
  rng = np.random.default_rng(0)
  a = rng.standard_normal((2, 1300)).astype(np.float32)                 # longer than two blocks: the blocked scan
  t = Tensor(a)
  np.testing.assert_allclose(t.cumsum(1).numpy(), np.cumsum(a, 1), rtol=1e-4, atol=1e-3)
  np.testing.assert_array_equal(t.cummax(1)[0].numpy(), np.maximum.accumulate(a, 1))
  np.testing.assert_array_equal(t.cummin(-1)[1].numpy(), first_index_of_running(a, np.minimum.accumulate(a, 1), 1))
  np.testing.assert_allclose(t.logcumsumexp(1).numpy(), np.logaddexp.accumulate(a.astype(np.float64), 1), rtol=1e-5)
  i = Tensor(rng.integers(0, 3, 1100).astype(np.int32))
  np.testing.assert_array_equal(i.cumsum().numpy(), np.cumsum(i.numpy()))
  with pytest.raises(IndexError, match="axis 2"): Tensor.ones(2, 3).cumsum(2)
  with pytest.raises(IndexError, match="axis 1"): Tensor(3).cumsum(1)
  with pytest.raises(TypeError): Tensor.ones(3).cumprod()


# *** sorting ***

def ref_argsort(row, descending):
  """A stable argsort with NaN as the largest value (last ascending, first descending), equal values in order."""
  isn = np.isnan(row) if row.dtype.kind == "f" else np.zeros(row.shape, bool)
  vals = np.where(isn, 0, row).astype(np.float64)
  return np.lexsort((-vals, ~isn)) if descending else np.lexsort((vals, isn))


@settings(max_examples=8, **SETTINGS)
@given(st.lists(st.integers(0, 6), min_size=1, max_size=2).map(tuple), st.sampled_from([np.float32, np.int32, np.bool_]),
       seed_st, st.booleans(), st.data())
def test_sort_argsort_stable_like_numpy(shape, dt, seed, descending, draw):
  rng = np.random.default_rng(seed)
  a = data(rng, shape, dt)
  if dt is np.float32 and a.size and draw.draw(st.booleans()):
    a.flat[rng.integers(a.size, size=2)] = np.nan
    a.flat[rng.integers(a.size)] = np.inf
  dim = draw.draw(st.integers(-len(shape), len(shape) - 1))
  if a.size: want_i = np.apply_along_axis(ref_argsort, dim, a, descending).astype(np.int32)
  else: want_i = np.zeros(a.shape, np.int32)
  want_v = np.take_along_axis(a, want_i, dim)
  v, i = Tensor(a).sort(dim, descending)
  assert v.dtype is Tensor(a).dtype and i.dtype is dtypes.int32
  np.testing.assert_array_equal(v.numpy(), want_v)
  np.testing.assert_array_equal(i.numpy(), want_i)
  np.testing.assert_array_equal(Tensor(a).argsort(dim, descending).numpy(), want_i)


@settings(max_examples=6, **SETTINGS)
@given(st.lists(st.integers(1, 6), min_size=1, max_size=2).map(tuple), st.sampled_from([np.float32, np.int32]), seed_st,
       st.booleans(), st.data())
def test_topk_matches_numpy(shape, dt, seed, largest, draw):
  rng = np.random.default_rng(seed)
  a = data(rng, shape, dt)
  dim = draw.draw(st.integers(-len(shape), len(shape) - 1))
  k = draw.draw(st.integers(0, shape[dim]))
  want_i = np.argsort(-a if largest else a, axis=dim, kind="stable")
  want_i = np.take(want_i, np.arange(k), axis=dim)
  v, i = Tensor(a).topk(k, dim, largest)
  np.testing.assert_array_equal(i.numpy(), want_i)
  np.testing.assert_array_equal(v.numpy(), np.take_along_axis(a, want_i, dim))


def test_sort_edge_cases_and_errors():
  v, i = Tensor([3.0, np.nan, 1.0, np.nan, 2.0]).sort()
  np.testing.assert_array_equal(v.numpy(), [1, 2, 3, np.nan, np.nan])
  np.testing.assert_array_equal(i.numpy(), [2, 4, 0, 1, 3])
  v, i = Tensor([1, 2, 1, 2, 1]).sort(descending=True)
  np.testing.assert_array_equal(i.numpy(), [1, 3, 0, 2, 4])
  v, i = Tensor([np.inf, 1.0, -np.inf, np.inf]).sort()
  np.testing.assert_array_equal(i.numpy(), [2, 1, 0, 3])
  assert Tensor.ones(2, 0).sort()[1].shape == (2, 0)
  a = np.random.default_rng(1).standard_normal(300).astype(np.float32)
  v, i = Tensor(a).sort(descending=True)
  np.testing.assert_array_equal(i.numpy(), np.argsort(-a, kind="stable"))
  with pytest.raises(IndexError): Tensor(3.0).sort()
  with pytest.raises(ValueError, match="k=5"): Tensor([1, 2, 3]).topk(5)
  with pytest.raises(ValueError, match="k=-1"): Tensor([1, 2, 3]).topk(-1)
  with pytest.raises(NotImplementedError): Tensor([1, 2, 3]).topk(1, sorted_=False)
