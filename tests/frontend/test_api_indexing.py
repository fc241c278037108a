"""Indexing by tensors, gather/scatter, masked ops, one_hot and nonzero, against numpy (tinygrad 0.14's semantics
where they differ from numpy: out-of-range tensor indices read 0, scatter drops them, duplicates: last wins)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rulec.engine.ir.dtypes import dtypes
from rulec.engine.tensor.args import ShapeError
from rulec import Tensor

SETTINGS = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large]}
DTYPES = [np.float32, np.int32, np.bool_]


def data(rng, shape, dt):
  if dt is np.bool_: return rng.random(shape) < 0.5
  if dt is np.int32: return rng.integers(-50, 50, shape).astype(np.int32)
  return rng.standard_normal(shape).astype(np.float32)


shape_st = st.lists(st.integers(0, 4), min_size=1, max_size=3).map(tuple)
seed_st = st.integers(0, 2**31 - 1)


# *** advanced getitem ***

@settings(max_examples=25, **SETTINGS)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple), st.sampled_from(DTYPES), seed_st, st.data())
def test_getitem_tensor_indices_match_numpy(shape, dt, seed, draw):
  rng = np.random.default_rng(seed)
  a = data(rng, shape, dt)
  nd = len(shape)
  idx_shape = draw.draw(st.sampled_from([(), (0,), (1,), (3,), (2, 1), (1, 3)]))
  items = []
  for ax in range(nd):
    kind = draw.draw(st.sampled_from(["tensor", "list", "slice", "int"]))
    if kind in ("tensor", "list"):
      ishape = draw.draw(st.sampled_from([idx_shape, idx_shape[-1:], ()]))
      i = rng.integers(-shape[ax], shape[ax], ishape).astype(np.int32)   # negative indices wrap, as in numpy
      items.append(Tensor(i) if kind == "tensor" or i.ndim == 0 else i.tolist())
    elif kind == "slice": items.append(slice(draw.draw(st.sampled_from([None, 1, -1])), None, draw.draw(st.sampled_from([None, 2, -1]))))
    else: items.append(int(rng.integers(-shape[ax], shape[ax])))
  if draw.draw(st.booleans()): items.insert(draw.draw(st.integers(0, len(items))), None)
  if not any(isinstance(i, (Tensor, list)) for i in items):
    items[next(k for k, i in enumerate(items) if i is not None)] = Tensor(np.array([0], dtype=np.int32))
  np_items = tuple(i.numpy() if isinstance(i, Tensor) else np.array(i, dtype=np.int32) if isinstance(i, list) else i for i in items)
  want = a[np_items]
  got = Tensor(a)[tuple(items)].numpy()
  if got.shape != want.shape:
    # tinygrad (and rulec) apply int indices first, so an int between a slice and a tensor index does not count as
    # an advanced index (numpy then moves the broadcast axes to the front): numpy's view of that is two steps
    basic = tuple(slice(None) if isinstance(i, np.ndarray) else i for i in np_items)
    adv = tuple(i if isinstance(i, np.ndarray) else slice(None) for i in np_items if not isinstance(i, int))
    want = a[basic][adv]
  np.testing.assert_array_equal(got, want)


def test_getitem_layouts_and_tinygrad_differences():
  a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
  t = Tensor(a)
  np.testing.assert_array_equal(t[[0, 1], :, [1, 2]].numpy(), a[[0, 1], :, [1, 2]])          # separated: front
  np.testing.assert_array_equal(t[:, [2, 0], [1, 3]].numpy(), a[:, [2, 0], [1, 3]])          # adjacent: in place
  np.testing.assert_array_equal(t[Tensor([[1], [0]]), Tensor([0, 2])].numpy(), a[[[1], [0]], [0, 2]])
  np.testing.assert_array_equal(t[..., Tensor(1)].numpy(), a[..., 1])                          # 0-d tensor: like an int
  np.testing.assert_array_equal(t[np.array([1, 0])].numpy(), a[[1, 0]])
  # tinygrad: an int between a slice and a tensor index is collapsed first, the tensor axis stays put
  assert t[0, :, [0, 1]].shape == (3, 2)
  np.testing.assert_array_equal(t[0, :, [0, 1]].numpy(), a[0][:, [0, 1]])
  # out of range: no error; negatives wrap once, anything still outside reads 0
  np.testing.assert_array_equal(Tensor([1, 2, 3])[Tensor([3, -4, -1, 100])].numpy(), [0, 0, 3, 0])
  assert Tensor([1, 2, 3])[[]].shape == (0,)
  assert Tensor([[1.0, 2.0]])[Tensor([0])].dtype is dtypes.float32
  np.testing.assert_array_equal(Tensor([True, False, True])[[2, 1]].numpy(), [True, False])
  np.testing.assert_array_equal(Tensor([np.nan, 1.0, np.inf])[[0, 2]].numpy(), [np.nan, np.inf])


def test_getitem_errors():
  t = Tensor([1.0, 2.0, 3.0])
  with pytest.raises(IndexError, match="float32"): t[Tensor([0.0, 1.0])]
  with pytest.raises(IndexError, match="bool"): t[Tensor([True, False, True])]
  with pytest.raises(IndexError, match="boolean"): t[[True, False, True]]
  with pytest.raises(IndexError, match="float"): t[[1.0]]
  with pytest.raises(IndexError, match=r"\(2,\).*\(3,\)"): Tensor.ones(3, 3)[[0, 1], [0, 1, 2]]
  with pytest.raises(IndexError, match="too many indices"): Tensor.ones(2, 2)[[0], [0], [0]]
  with pytest.raises(IndexError, match="ellipsis"): Tensor.ones(2, 2)[..., [0], ...]


# *** advanced setitem ***

@settings(max_examples=15, **SETTINGS)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple), st.sampled_from(DTYPES), seed_st,
       st.booleans(), st.booleans())
def test_setitem_tensor_indices_match_numpy(shape, dt, seed, two, scalar):
  rng = np.random.default_rng(seed)
  a = data(rng, shape, dt)
  i0 = rng.integers(-shape[0], shape[0], (3,))
  items = (i0,)
  if two and len(shape) > 1: items = (i0, slice(None), rng.integers(0, shape[-1], (3,))) if len(shape) == 3 else (i0, rng.integers(0, shape[1], (1,)))
  want = a.copy()
  v = (data(rng, (), dt).item() if scalar else data(rng, want[items].shape[-1:], dt))
  # numpy leaves the order of repeated writes open; tinygrad (and rulec) let the last one win, which is what numpy
  # does in practice for these small cases
  want[items] = v
  t = Tensor(a)
  t[tuple(Tensor(i.astype(np.int32)) if isinstance(i, np.ndarray) else i for i in items)] = v if scalar else Tensor(v)
  np.testing.assert_array_equal(t.numpy(), want)


def test_setitem_semantics():
  b = Tensor.zeros(3, 4).contiguous().realize()
  b[[0, 0], [1, 1]] = Tensor([5.0, 6.0])       # duplicates: the last write wins (tinygrad)
  b[[5]] = 7.0                                 # out of range: dropped
  b[[-1]] = 2.0                                # negative: wraps
  b[::2, [0, 3]] = Tensor([[1.0, 2.0], [3.0, 4.0]])
  want = np.zeros((3, 4), np.float32)
  want[0, 1] = 6; want[-1] = 2; want[::2, [0, 3]] = [[1, 2], [3, 4]]
  np.testing.assert_array_equal(b.numpy(), want)
  c = Tensor.zeros(2, 3)                       # not realized yet: gets storage first
  c[[1]] += 1
  np.testing.assert_array_equal(c.numpy(), [[0, 0, 0], [1, 1, 1]])
  with pytest.raises(IndexError, match=r"\(3,\)"): Tensor.zeros(3, 4).contiguous().realize()[[0, 1]] = Tensor([1.0, 2.0, 3.0])


# *** gather / scatter ***

@settings(max_examples=25, **SETTINGS)
@given(shape_st, st.sampled_from(DTYPES), seed_st, st.data())
def test_gather_matches_take_along_axis(shape, dt, seed, draw):
  rng = np.random.default_rng(seed)
  a = data(rng, shape, dt)
  dim = draw.draw(st.integers(-len(shape), len(shape) - 1))
  d = dim % len(shape)
  ishape = tuple(draw.draw(st.integers(0, 4)) if ax == d else draw.draw(st.integers(0, s)) for ax, s in enumerate(shape))
  if shape[d] == 0: ishape = tuple(0 if ax == d else s for ax, s in enumerate(ishape))
  idx = rng.integers(0, max(shape[d], 1), ishape).astype(np.int32)
  want = np.take_along_axis(a[tuple(slice(0, s) if ax != d else slice(None) for ax, s in enumerate(ishape))], idx, d)
  got = Tensor(a).gather(dim, Tensor(idx))
  assert got.dtype is Tensor(a).dtype and got.shape == want.shape
  np.testing.assert_array_equal(got.numpy(), want)


def test_gather_out_of_range_and_errors():
  t = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
  np.testing.assert_array_equal(t.gather(1, Tensor([[0, 3], [1, -1], [5, 2]])).numpy(), [[0, 3], [5, 0], [0, 10]])
  with pytest.raises(RuntimeError, match="float32"): t.gather(1, Tensor([[0.0]]))
  with pytest.raises(ShapeError, match=r"\(3, 4\).*\(2,\)"): t.gather(1, Tensor([0, 1]))
  with pytest.raises(ShapeError, match=r"\(1, 5\)"): t.gather(0, Tensor([[0, 0, 0, 0, 0]]))
  with pytest.raises(IndexError, match="axis 2"): t.gather(2, Tensor([[0]]))


def np_scatter(a, dim, idx, src, combine=None, include_self=True, reduce=None):
  """numpy reference: loop over index positions in C order (so for duplicates the last write wins)."""
  out = a.astype(np.float64 if reduce == "mean" else a.dtype).copy()
  acc = {}
  for pos in np.ndindex(*idx.shape):
    tgt = list(pos); tgt[dim] = idx[pos]; tgt = tuple(tgt)
    if not 0 <= idx[pos] < a.shape[dim]: continue
    acc.setdefault(tgt, []).append(src[pos])
  for tgt, vals in acc.items():
    if reduce is None: out[tgt] = vals[-1]; continue
    vals = ([a[tgt]] if include_self else []) + vals
    out[tgt] = {"sum": np.sum, "prod": np.prod, "amax": np.max, "amin": np.min, "mean": np.mean}[reduce](vals)
  return out


@settings(max_examples=30, **SETTINGS)
@given(shape_st, st.sampled_from([np.float32, np.int32]), seed_st, st.data())
def test_scatter_and_scatter_reduce_match_reference(shape, dt, seed, draw):
  rng = np.random.default_rng(seed)
  a, src = data(rng, shape, dt), data(rng, shape, dt)
  if dt is np.int32: src = src % 5   # products stay small
  d = draw.draw(st.integers(0, len(shape) - 1))
  ishape = tuple(draw.draw(st.integers(0, s)) for s in shape)
  idx = rng.integers(-1, shape[d] + 1, ishape).astype(np.int32)   # duplicates and out-of-range ones (dropped)
  reduce = draw.draw(st.sampled_from([None, "sum", "prod", "amax", "amin", "mean"]))
  include_self = draw.draw(st.booleans())
  t = Tensor(a)
  if reduce is None: got = t.scatter(d, Tensor(idx), Tensor(src))
  else: got = t.scatter_reduce(d, Tensor(idx), Tensor(src), reduce, include_self=include_self)
  want = np_scatter(a, d, idx, src, include_self=include_self, reduce=reduce)
  np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)


def test_scatter_forms_and_errors():
  z = Tensor.zeros(2, 4)
  np.testing.assert_array_equal(z.scatter(1, Tensor([[1, 1]]), 5.0, reduce="add").numpy(), [[0, 10, 0, 0], [0, 0, 0, 0]])
  np.testing.assert_array_equal((z + 2).scatter(1, Tensor([[1, 1]]), 5.0, reduce="multiply").numpy(), [[2, 50, 2, 2], [2, 2, 2, 2]])
  np.testing.assert_array_equal(z.scatter(1, Tensor([[1, 2, 3, 0, 1]]), Tensor([[1.0, 2, 3, 4, 5]])).numpy(), [[4, 5, 2, 3], [0, 0, 0, 0]])
  assert Tensor([[1, 1, 1]]).scatter_reduce(1, Tensor([[0, 0]]), Tensor([[2, 3]]), "mean").dtype is dtypes.float32
  with pytest.raises(TypeError, match="sum"): z.scatter(1, Tensor([[1]]), 1.0, reduce="sum")
  with pytest.raises(TypeError, match="scatter_reduce"): z.scatter(1, Tensor([[1]]), Tensor([[1.0]]), reduce="add")
  with pytest.raises(RuntimeError, match="max"): z.scatter_reduce(1, Tensor([[1]]), Tensor([[1.0]]), "max")
  with pytest.raises(RuntimeError, match="int32"): z.scatter(1, Tensor([[1]]), Tensor([[1]]))
  with pytest.raises(ShapeError, match=r"\(2, 4\)"): z.scatter(1, Tensor([1]), Tensor([1.0]))


# *** masks, one_hot, nonzero ***

@settings(max_examples=20, **SETTINGS)
@given(shape_st, st.sampled_from(DTYPES), seed_st, st.booleans(), st.sampled_from([None, 0, 3]))
def test_masked_fill_select_nonzero_match_numpy(shape, dt, seed, bcast, size):
  rng = np.random.default_rng(seed)
  a = data(rng, shape, dt)
  m = rng.random(shape[1:] if bcast else shape) < 0.5
  fill = True if dt is np.bool_ else 7
  np.testing.assert_array_equal(Tensor(a).masked_fill(Tensor(m), fill).numpy(), np.where(m, fill, a))
  sel = a[np.broadcast_to(m, shape)]
  nz = np.argwhere(a)
  if size is None:
    np.testing.assert_array_equal(Tensor(a).masked_select(Tensor(m)).numpy(), sel)
    np.testing.assert_array_equal(Tensor(a).nonzero().numpy(), nz)
  else:
    want = np.concatenate([sel[:size], np.full(max(size - len(sel), 0), fill, a.dtype)])
    np.testing.assert_array_equal(Tensor(a).masked_select(Tensor(m), size=size, fill_value=fill).numpy(), want)
    wnz = np.concatenate([nz[:size], np.full((max(size - len(nz), 0), len(shape)), -1)]).astype(np.int32)
    got = Tensor(a).nonzero(size=size, fill_value=-1)
    assert got.dtype is dtypes.int32
    np.testing.assert_array_equal(got.numpy(), wnz)


def test_masks_edge_cases_and_errors():
  assert Tensor(3).nonzero().shape == (1, 0) and Tensor(0).nonzero().shape == (0, 0)
  np.testing.assert_array_equal(Tensor([np.nan, 0.0]).nonzero().numpy(), [[0]])
  np.testing.assert_array_equal(Tensor([[1.0, 2]]).masked_fill(Tensor([True, False]), Tensor([[9.0], [8.0]])).numpy(), [[9, 2], [8, 2]])
  with pytest.raises(RuntimeError, match="bool"): Tensor([1, 2]).masked_select(Tensor([1, 0]))
  with pytest.raises(RuntimeError, match="bool"): Tensor([1, 2]).masked_fill(Tensor([1, 0]), 3)
  with pytest.raises(ShapeError, match=r"\(3,\).*\(2,\)"): Tensor([1, 2]).masked_select(Tensor([True, False, True]))


@settings(max_examples=15, **SETTINGS)
@given(shape_st, st.sampled_from([np.int32, np.int8, np.int64]), st.integers(0, 5), seed_st)
def test_one_hot_matches_numpy(shape, dt, n, seed):
  c = np.random.default_rng(seed).integers(-2, 7, shape).astype(dt)
  want = (c[..., None] == np.arange(n)).astype(np.int32)    # outside [0, n): an all-zero row (tinygrad)
  got = Tensor(c).one_hot(n)
  assert got.dtype is dtypes.int32
  np.testing.assert_array_equal(got.numpy(), want)


def test_one_hot_errors():
  with pytest.raises(RuntimeError, match="float32"): Tensor([1.0]).one_hot(3)
  with pytest.raises(ValueError, match="-1"): Tensor([1]).one_hot(-1)
