"""tinygrad-style shape functions (engine/tensor/shape.py) against numpy: repeat, repeat_interleave, roll, split,
chunk, unflatten, unfold, view, diag, diagonal, tril/triu, meshgrid, movedim, pad_to/shrink_to, rearrange."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from rulec.engine.tensor.args import AxisError, ShapeError
from rulec import Tensor

DTYPES = [np.float32, np.int32, np.bool_]
shapes = st.lists(st.integers(0, 4), min_size=1, max_size=3).map(tuple)


def arr(shape, dt, seed=0):
  a = np.random.default_rng(seed).integers(-5, 6, size=shape)
  return (a > 0) if dt is np.bool_ else a.astype(dt)


def check(t, ref):
  got = t.numpy()
  assert got.shape == ref.shape, (got.shape, ref.shape)
  np.testing.assert_array_equal(got, ref)


@settings(max_examples=20)
@given(shapes, st.lists(st.integers(0, 3), min_size=0, max_size=2), st.sampled_from(DTYPES))
def test_repeat_is_tile(shape, extra, dt):
  a = arr(shape, dt)
  reps = tuple(extra) + tuple((i % 3) + 1 for i in range(len(shape)))
  check(Tensor(a).repeat(reps), np.tile(a, reps))
  check(Tensor(a).repeat(*reps), np.tile(a, reps))


@settings(max_examples=20)
@given(shapes, st.integers(0, 3), st.data())
def test_repeat_interleave(shape, n, data):
  a = arr(shape, np.float32)
  dim = data.draw(st.one_of(st.none(), st.integers(-len(shape), len(shape) - 1)))
  check(Tensor(a).repeat_interleave(n, dim), np.repeat(a, n, axis=dim))


@settings(max_examples=20)
@given(shapes, st.integers(-7, 7), st.data())
def test_roll(shape, shift, data):
  a = arr(shape, np.int32)
  check(Tensor(a).roll(shift), np.roll(a, shift))
  d = data.draw(st.integers(-len(shape), len(shape) - 1))
  check(Tensor(a).roll(shift, d), np.roll(a, shift, d))
  if len(shape) >= 2: check(Tensor(a).roll((shift, 1), (0, -1)), np.roll(a, (shift, 1), (0, -1)))


@settings(max_examples=20)
@given(shapes, st.integers(1, 5), st.data())
def test_split_and_chunk(shape, k, data):
  a = arr(shape, np.float32)
  d = data.draw(st.integers(0, len(shape) - 1))
  n = shape[d]
  parts = Tensor(a).split(k, d)
  assert isinstance(parts, tuple)
  cuts = list(range(k, n, k))
  refs = np.split(a, cuts, axis=d) if n else [a]
  assert len(parts) == len(refs)
  for p, r in zip(parts, refs): check(p, r)
  sizes = data.draw(st.lists(st.integers(0, n), min_size=1, max_size=3).filter(lambda s: sum(s) == n) if n else st.just([0]))
  for p, r in zip(Tensor(a).split(sizes, d), np.split(a, np.cumsum(sizes)[:-1], axis=d)): check(p, r)
  ch = Tensor(a).chunk(k, d)
  assert isinstance(ch, list)
  if n:
    step = -(-n // k)
    for p, r in zip(ch, np.split(a, list(range(step, n, step)), axis=d)): check(p, r)
  else: assert len(ch) == k and all(c.shape == a.shape for c in ch)


def test_split_errors():
  with pytest.raises(ShapeError, match=r"sum to 3.*length 4"): Tensor.ones(4).split([1, 2])
  with pytest.raises(ValueError, match="greater than 0"): Tensor.ones(4).chunk(0)
  with pytest.raises(AxisError): Tensor.ones(4).split(2, 1)


@settings(max_examples=20)
@given(st.lists(st.integers(0, 6), min_size=1, max_size=3).map(tuple), st.integers(1, 3), st.integers(1, 3), st.data())
def test_unfold_is_sliding_window(shape, size, step, data):
  d = data.draw(st.integers(0, len(shape) - 1))
  a = arr(shape, np.int32)
  if size > shape[d]:
    with pytest.raises(ShapeError): Tensor(a).unfold(d, size, step)
    return
  ref = np.lib.stride_tricks.sliding_window_view(a, size, axis=d)
  ref = np.take(ref, range(0, ref.shape[d], step), axis=d)
  check(Tensor(a).unfold(d, size, step), ref)


def test_view_unflatten_size():
  a = np.arange(24).reshape(2, 12)
  check(Tensor(a).view(2, 3, 4), a.reshape(2, 3, 4))
  check(Tensor(a).view((4, -1)), a.reshape(4, -1))
  check(Tensor(a).unflatten(1, (3, -1)), a.reshape(2, 3, 4))
  check(Tensor(a).unflatten(-1, (2, 2, 3)), a.reshape(2, 2, 2, 3))
  assert Tensor(a).size() == (2, 12) and Tensor(a).size(-1) == 12


@settings(max_examples=15)
@given(st.integers(0, 5), st.sampled_from(DTYPES))
def test_diag(n, dt):
  a = arr((n,), dt)
  check(Tensor(a).diag(), np.diag(a))
  with pytest.raises(ValueError, match="1-D"): Tensor(np.ones((2, 2))).diag()


@settings(max_examples=25)
@given(st.lists(st.integers(0, 4), min_size=2, max_size=3).map(tuple), st.integers(-5, 5), st.data())
def test_diagonal(shape, off, data):
  nd = len(shape)
  d1 = data.draw(st.integers(-nd, nd - 1))
  d2 = data.draw(st.integers(-nd, nd - 1).filter(lambda x: x % nd != d1 % nd))
  a = arr(shape, np.float32)
  check(Tensor(a).diagonal(off, d1, d2), np.diagonal(a, off, d1, d2))


@settings(max_examples=20)
@given(st.lists(st.integers(0, 4), min_size=2, max_size=3).map(tuple), st.integers(-4, 4), st.sampled_from(DTYPES))
def test_tril_triu(shape, k, dt):
  a = arr(shape, dt)
  check(Tensor(a).tril(k), np.tril(a, k))
  check(Tensor(a).triu(k), np.triu(a, k))
  check(Tensor(a).tril(), np.tril(a))
  assert Tensor(a).tril().dtype == Tensor(a).dtype


@settings(max_examples=15)
@given(st.lists(st.integers(0, 4), min_size=1, max_size=3), st.sampled_from(["ij", "xy"]))
def test_meshgrid(ns, indexing):
  arrs = [np.arange(n, dtype=np.float32) * (i + 1) for i, n in enumerate(ns)]
  ts = [Tensor(x) for x in arrs]
  got = ts[0].meshgrid(*ts[1:], indexing=indexing)
  assert isinstance(got, tuple)
  for g, r in zip(got, np.meshgrid(*arrs, indexing=indexing)): check(g, r)


def test_meshgrid_default_is_ij_and_errors():
  x, y = Tensor.arange(2).meshgrid(Tensor.arange(3))
  assert x.shape == (2, 3)
  with pytest.raises(ValueError, match="indexing"): Tensor.arange(2).meshgrid(indexing="foo")


@settings(max_examples=15)
@given(st.lists(st.integers(0, 3), min_size=3, max_size=3).map(tuple))
def test_movedim_swapaxes_pad_shrink_to(shape):
  a = arr(shape, np.int32)
  check(Tensor(a).movedim(0, -1), np.moveaxis(a, 0, -1))
  check(Tensor(a).movedim((0, 1), (2, 0)), np.moveaxis(a, (0, 1), (2, 0)))
  check(Tensor(a).swapaxes(0, 2), np.swapaxes(a, 0, 2))
  big = tuple(s + i for i, s in enumerate(shape))
  check(Tensor(a).pad_to(big), np.pad(a, [(0, b - s) for s, b in zip(shape, big)]))
  check(Tensor(a).pad_to(None, shape[1] + 1, None, value=7), np.pad(a, [(0, 0), (0, 1), (0, 0)], constant_values=7))
  small = tuple(s // 2 for s in shape)
  check(Tensor(a).shrink_to(*small), a[tuple(slice(0, s) for s in small)])
  with pytest.raises(ShapeError): Tensor(a).shrink_to(*(s + 1 for s in shape))


def test_rearrange():
  a = np.arange(2 * 6 * 4).reshape(2, 6, 4)
  t = Tensor(a)
  check(t.rearrange("a b c -> (a b) c"), a.reshape(12, 4))
  check(t.rearrange("a (h w) c -> a c h w", h=2), a.reshape(2, 2, 3, 4).transpose(0, 3, 1, 2))
  check(t.rearrange("a b c -> c b a"), a.transpose(2, 1, 0))
  check(t.rearrange("... c -> c ..."), np.moveaxis(a, -1, 0))
  check(t.rearrange("a b c -> a 1 (c b)"), a.transpose(0, 2, 1).reshape(2, 1, 24))
  with pytest.raises(ValueError): t.rearrange("a b c -> a b")
  with pytest.raises(ShapeError): t.rearrange("a (h w) c -> a h w c", h=4)


def test_repeat_errors_and_lazy():
  with pytest.raises(ShapeError, match=r"\(2, 3\)"): Tensor.ones(2, 3).repeat(2)
  t = Tensor.ones(2, 3).repeat(2, 1).roll(1, 0).tril()
  from rulec.engine.ir.ops import Ops
  assert t.uop.op is not Ops.BUFFER  # built lazily, not computed on the host
