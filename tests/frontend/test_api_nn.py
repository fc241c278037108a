"""tinygrad-style neural-network functions (engine/tensor/nn.py) against plain-numpy loop references: N-d conv2d,
conv_transpose2d, max/avg pools (ceil_mode, count_include_pad, return_indices), max_unpool2d, interpolate,
attention, einsum, batchnorm, normalize, linear, dropout, softmax dtypes, matmul errors."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from rulec.engine.ir.dtypes import dtypes
from rulec.engine.tensor.args import ShapeError
from rulec import Tensor


def rnd(shape, seed=0):
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def close(t, ref, tol=1e-4):
  got = t.numpy()
  assert got.shape == ref.shape, (got.shape, ref.shape)
  np.testing.assert_allclose(got, ref, rtol=tol, atol=tol)


def ref_conv(x, w, stride, dilation, pads, groups):
  """Direct N-d cross-correlation; pads: (before, after) per spatial dim."""
  n = w.ndim - 2
  x = np.pad(x, [(0, 0), (0, 0)] + list(pads))
  N, C = x.shape[:2]
  O, Cg, ks = w.shape[0], w.shape[1], w.shape[2:]
  outs = [(x.shape[2 + i] - (ks[i] - 1) * dilation[i] - 1) // stride[i] + 1 for i in range(n)]
  out = np.zeros((N, O, *outs), np.float64)
  Og = O // groups
  for o in range(O):
    g = o // Og
    xs = x[:, g * Cg:(g + 1) * Cg]
    for pos in itertools.product(*map(range, outs)):
      for tap in itertools.product(*map(range, ks)):
        idx = tuple(p * s + t * d for p, s, t, d in zip(pos, stride, tap, dilation))
        out[(slice(None), o) + pos] += (xs[(slice(None), slice(None)) + idx] * w[(o, slice(None)) + tap]).sum(1)
  return out


def ref_conv_transpose(x, w, stride, dilation, pad, out_pad, groups):
  n = w.ndim - 2
  N, C = x.shape[:2]
  Og, ks = w.shape[1], w.shape[2:]
  Cg = C // groups
  full = [(x.shape[2 + i] - 1) * stride[i] + (ks[i] - 1) * dilation[i] + 1 + out_pad[i] for i in range(n)]
  out = np.zeros((N, Og * groups, *full), np.float64)
  for c in range(C):
    g = c // Cg
    for pos in itertools.product(*map(range, x.shape[2:])):
      for tap in itertools.product(*map(range, ks)):
        idx = tuple(p * s + t * d for p, s, t, d in zip(pos, stride, tap, dilation))
        for oc in range(Og):
          out[(slice(None), g * Og + oc) + idx] += x[(slice(None), c) + pos] * w[(c, oc) + tap]
  return out[(slice(None), slice(None)) + tuple(slice(p, f - p) for p, f in zip(pad, full))]


@settings(max_examples=25)
@given(st.integers(1, 3), st.integers(1, 2), st.sampled_from([1, 2]), st.integers(1, 2), st.integers(1, 2),
       st.integers(0, 2), st.booleans(), st.data())
def test_conv_nd(n, N, groups, cg, og, pad, use_bias, data):
  sp = data.draw(st.lists(st.integers(1, 5), min_size=n, max_size=n))
  ks = data.draw(st.lists(st.integers(1, 3), min_size=n, max_size=n))
  stride = tuple(data.draw(st.lists(st.integers(1, 2), min_size=n, max_size=n)))
  dil = tuple(data.draw(st.lists(st.integers(1, 2), min_size=n, max_size=n)))
  form = data.draw(st.sampled_from(["int", "per-dim", "flat"]))
  pads = [(pad, pad)] * n if form == "int" else [(pad, (pad + i) % 3) for i in range(n)] if form == "flat" else [(pad + i % 2,) * 2 for i in range(n)]
  padding = pad if form == "int" else tuple(v for pr in pads[::-1] for v in pr) if form == "flat" else tuple(p for p, _ in pads)
  if any(L + a + b < (k - 1) * d + 1 for L, k, d, (a, b) in zip(sp, ks, dil, pads)): return
  x, w = rnd((N, groups * cg, *sp), 1), rnd((groups * og, cg, *ks), 2)
  b = rnd((groups * og,), 3) if use_bias else None
  ref = ref_conv(x, w, stride, dil, pads, groups) + (0 if b is None else b.reshape((1, -1) + (1,) * n))
  got = Tensor(x).conv2d(Tensor(w), None if b is None else Tensor(b), groups=groups, stride=stride, dilation=dil, padding=padding)
  close(got, ref.astype(np.float32))


def test_conv_positional_order_and_errors():
  x, w = rnd((1, 4, 5, 5)), rnd((2, 2, 3, 3))
  close(Tensor(x).conv2d(Tensor(w), None, 2, 2, 1, 1), ref_conv(x, w, (2, 2), (1, 1), [(1, 1)] * 2, 2).astype(np.float32))
  with pytest.raises(ShapeError, match=r"\(1, 4, 5, 5\)"): Tensor(x).conv2d(Tensor.ones(2, 3, 3, 3))
  with pytest.raises(ShapeError, match="larger"): Tensor(x).conv2d(Tensor.ones(2, 4, 7, 7))
  with pytest.raises(ShapeError, match="3-D"): Tensor(x).conv2d(Tensor.ones(2, 4, 3))


@settings(max_examples=20)
@given(st.integers(1, 2), st.sampled_from([1, 2]), st.integers(1, 2), st.data())
def test_conv_transpose(n, groups, cg, data):
  sp = data.draw(st.lists(st.integers(1, 4), min_size=n, max_size=n))
  ks = data.draw(st.lists(st.integers(1, 3), min_size=n, max_size=n))
  stride = tuple(data.draw(st.lists(st.integers(1, 3), min_size=n, max_size=n)))
  dil = tuple(data.draw(st.lists(st.integers(1, 2), min_size=n, max_size=n)))
  pad = tuple(data.draw(st.integers(0, (k - 1) * d)) for k, d in zip(ks, dil))
  op = tuple(data.draw(st.integers(0, max(s, d) - 1)) for s, d in zip(stride, dil))
  x, w = rnd((2, groups * cg, *sp), 4), rnd((groups * cg, 2, *ks), 5)
  if any((L - 1) * s - 2 * p + d * (k - 1) + o + 1 < 1 for L, s, p, d, k, o in zip(sp, stride, pad, dil, ks, op)):
    # an output of no elements (input 1, kernel 2, padding 1): refused by name, as torch refuses it
    with pytest.raises(ShapeError, match="conv_transpose2d: the output would have size"):
      Tensor(x).conv_transpose2d(Tensor(w), groups=groups, stride=stride, dilation=dil, padding=pad, output_padding=op)
    return
  ref = ref_conv_transpose(x, w, stride, dil, pad, op, groups)
  got = Tensor(x).conv_transpose2d(Tensor(w), groups=groups, stride=stride, dilation=dil, padding=pad, output_padding=op)
  close(got, ref.astype(np.float32))


def ref_pool(x, k, s, d, pads, ceil_mode, kind, count_include_pad=True):
  n = len(k)
  sp = x.shape[-n:]
  outs = []
  for L, kk, ss, dd, (p, _) in zip(sp, k, s, d, pads):
    span = (kk - 1) * dd + 1
    o = (-(-(L + 2 * p - span) // ss) if ceil_mode else (L + 2 * p - span) // ss) + 1
    if ceil_mode and (o - 1) * ss >= L + p: o -= 1
    outs.append(o)
  out = np.zeros(x.shape[:-n] + tuple(outs), np.float64)
  idx = np.zeros(out.shape, np.int64)
  for pos in itertools.product(*map(range, outs)):
    vals, flat, cnt = [], [], 0
    for tap in itertools.product(*map(range, k)):
      c = [po * ss + t * dd - p for po, ss, t, dd, (p, _) in zip(pos, s, tap, d, pads)]
      inside = all(0 <= ci < L for ci, L in zip(c, sp))
      in_pad = all(-p <= ci < L + p for ci, L, (p, _) in zip(c, sp, pads))
      if inside:
        vals.append(x[(Ellipsis,) + tuple(c)]); flat.append(int(np.ravel_multi_index(c, sp)))
      cnt += inside or (in_pad and count_include_pad)
    if not vals: return None, None  # a window wholly in the padding (torch refuses such pools)
    v = np.stack(vals, -1)
    if kind == "max":
      out[(Ellipsis,) + pos] = v.max(-1)
      idx[(Ellipsis,) + pos] = np.array(flat)[v.argmax(-1)]
    else: out[(Ellipsis,) + pos] = v.sum(-1) / cnt
  return out, idx


@settings(max_examples=20)
@given(st.integers(1, 3), st.booleans(), st.booleans(), st.data())
def test_pools(n, ceil_mode, count_include_pad, data):
  sp = data.draw(st.lists(st.integers(1, 6), min_size=n, max_size=n))
  k = tuple(data.draw(st.lists(st.integers(1, 3), min_size=n, max_size=n)))
  s = tuple(data.draw(st.lists(st.integers(1, 3), min_size=n, max_size=n)))
  d = tuple(data.draw(st.lists(st.integers(1, 2), min_size=n, max_size=n)))
  p = tuple(data.draw(st.integers(0, kk // 2)) for kk in k)  # torch's limit: padding at most half the kernel
  if any(L + 2 * pp < (kk - 1) * dd + 1 for L, kk, dd, pp in zip(sp, k, d, p)): return
  x = rnd((2, *sp), 6)
  pads = [(pp, pp) for pp in p]
  mref, iref = ref_pool(x, k, s, d, pads, ceil_mode, "max")
  if mref is None: return
  v, i = Tensor(x).max_pool2d(k, s, d, p, ceil_mode, return_indices=True)
  close(v, mref.astype(np.float32))
  assert i.dtype is dtypes.int32
  np.testing.assert_array_equal(i.numpy(), iref)
  if all(dd == 1 for dd in d):
    aref, _ = ref_pool(x, k, s, d, pads, ceil_mode, "avg", count_include_pad)
    close(Tensor(x).avg_pool2d(k, s, d, p, ceil_mode, count_include_pad), aref.astype(np.float32))


def test_pool_defaults_and_unpool():
  x = np.arange(25, dtype=np.float32).reshape(1, 1, 5, 5)
  assert Tensor(x).max_pool2d().shape == (1, 1, 2, 2) and Tensor(x).avg_pool2d(ceil_mode=True).shape == (1, 1, 3, 3)
  v, i = Tensor(x).max_pool2d(return_indices=True)
  ref = np.zeros((1, 1, 5, 5), np.float32)
  np.put(ref, i.numpy().ravel(), v.numpy().ravel())
  close(v.max_unpool2d(i, output_size=(5, 5)), ref)
  assert v.max_unpool2d(i).shape == (1, 1, 4, 4)
  with pytest.raises(ShapeError, match="at least 2"): Tensor.ones(6).max_pool2d()


def ref_interp(x, size, mode, align_corners):
  for i, out in enumerate(size):
    a = x.ndim - len(size) + i
    L = x.shape[a]
    o = np.arange(out)
    if mode == "nearest": src = np.minimum(o * L // out, L - 1); x = np.take(x, src, a); continue
    if mode == "nearest-exact": src = np.minimum((2 * o + 1) * L // (2 * out), L - 1); x = np.take(x, src, a); continue
    if align_corners: f = o * ((L - 1) / (out - 1)) if out > 1 else o * 0.0
    else: f = np.maximum((o + 0.5) * (L / out) - 0.5, 0)
    i0 = np.minimum(np.floor(f).astype(int), L - 1); i1 = np.minimum(i0 + 1, L - 1); w = f - i0
    sh = [1] * x.ndim; sh[a] = out
    x = np.take(x, i0, a) * (1 - w).reshape(sh) + np.take(x, i1, a) * w.reshape(sh)
  return x


@settings(max_examples=15)
@given(st.integers(1, 3), st.sampled_from(["linear", "nearest", "nearest-exact"]), st.booleans(), st.data())
def test_interpolate(n, mode, align, data):
  sp = data.draw(st.lists(st.integers(1, 5), min_size=n, max_size=n))
  size = tuple(data.draw(st.lists(st.integers(1, 7), min_size=n, max_size=n)))
  x = rnd((1, 2, *sp), 7)
  close(Tensor(x).interpolate(size, mode, align), ref_interp(x.astype(np.float64), size, mode, align).astype(np.float32), 1e-4)


def test_interpolate_int_and_errors():
  assert Tensor.arange(4).interpolate((7,)).tolist() == [0, 0, 0, 1, 2, 2, 3]  # tinygrad keeps ints (truncated)
  with pytest.raises(ValueError, match="linear"): Tensor.ones(1, 1, 2, 2).interpolate((3, 3), mode="bicubic")


@settings(max_examples=10)
@given(st.integers(1, 4), st.integers(1, 4), st.integers(1, 4), st.sampled_from(["none", "bool", "float", "causal"]))
def test_scaled_dot_product_attention(L, S, D, mask):
  q, k, v = rnd((2, 3, L, D), 8), rnd((2, 3, S, D), 9), rnd((2, 3, S, 5), 10)
  s = q @ np.swapaxes(k, -1, -2) / math.sqrt(D)
  kw = {}
  if mask == "bool":
    m = np.random.default_rng(1).random((L, S)) > 0.3; m[:, 0] = True
    s = np.where(m, s, -np.inf); kw["attn_mask"] = Tensor(m)
  elif mask == "float":
    m = rnd((L, S), 11); s = s + m; kw["attn_mask"] = Tensor(m)
  elif mask == "causal":
    s = np.where(np.tril(np.ones((L, S), bool)), s, -np.inf); kw["is_causal"] = True
  e = np.exp(s - s.max(-1, keepdims=True))
  ref = (e / e.sum(-1, keepdims=True)) @ v
  close(Tensor(q).scaled_dot_product_attention(Tensor(k), Tensor(v), **kw), ref, 1e-4)


def test_sdpa_gqa_and_errors():
  q, k, v = rnd((1, 4, 3, 2), 1), rnd((1, 2, 3, 2), 2), rnd((1, 2, 3, 2), 3)
  kk, vv = np.repeat(k, 2, 1), np.repeat(v, 2, 1)
  want = Tensor(q).scaled_dot_product_attention(Tensor(kk), Tensor(vv)).numpy()
  close(Tensor(q).scaled_dot_product_attention(Tensor(k), Tensor(v), enable_gqa=True), want)
  with pytest.raises(RuntimeError, match="is_causal"):
    Tensor(q).scaled_dot_product_attention(Tensor(kk), Tensor(vv), attn_mask=Tensor.ones(3, 3), is_causal=True)


@pytest.mark.parametrize("formula, shapes", [
  ("ij,jk->ik", [(2, 3), (3, 4)]), ("ij->ji", [(2, 3)]), ("ii->", [(3, 3)]), ("ii->i", [(3, 3)]), ("ij,ij", [(2, 3), (2, 3)]),
  ("...ij,...jk->...ik", [(5, 2, 3), (5, 3, 4)]), ("ba", [(2, 3)]), ("i,j->ij", [(2,), (3,)]), ("bij,bjk->bk", [(2, 2, 3), (2, 3, 4)]),
  ("i j -> j i", [(2, 3)]), ("ijk,ikl,l->j", [(2, 3, 0), (2, 0, 2), (2,)]), ("iji->j", [(2, 3, 2)]), ("...i,...i->...", [(3, 4), (4,)]),
])
def test_einsum(formula, shapes):
  arrs = [rnd(s, i) for i, s in enumerate(shapes)]
  close(Tensor.einsum(formula, *[Tensor(a) for a in arrs]), np.einsum(formula.replace(" ", ""), *arrs).astype(np.float32))
  close(Tensor.einsum(formula, [Tensor(a) for a in arrs]), np.einsum(formula.replace(" ", ""), *arrs).astype(np.float32))


def test_einsum_dtype_and_errors():
  assert Tensor.einsum("ij,jk->ik", Tensor.ones(2, 3, dtype="int32"), Tensor.ones(3, 4, dtype="int32")).dtype is dtypes.int32
  assert Tensor.einsum("ij,jk->ik", Tensor.ones(2, 3), Tensor.ones(3, 4), dtype="float16").dtype is dtypes.float16
  with pytest.raises(RuntimeError, match="sizes"): Tensor.einsum("ij,ij->ij", Tensor.ones(2, 3), Tensor.ones(1, 3))


@settings(max_examples=8)
@given(st.lists(st.integers(1, 4), min_size=2, max_size=4).map(tuple), st.booleans())
def test_batchnorm_normalize_layernorm(shape, affine):
  x = rnd(shape, 12)
  C = shape[1]
  mean, invstd, w, b = rnd((C,), 13), np.abs(rnd((C,), 14)) + 0.5, rnd((C,), 15), rnd((C,), 16)
  bs = (1, C) + (1,) * (len(shape) - 2)
  ref = (x - mean.reshape(bs)) * invstd.reshape(bs)
  if affine: ref = ref * w.reshape(bs) + b.reshape(bs)
  got = Tensor(x).batchnorm(Tensor(w) if affine else None, Tensor(b) if affine else None, Tensor(mean), Tensor(invstd))
  close(got, ref)
  close(Tensor(x).normalize(), x / np.maximum(np.sqrt((x * x).sum(1, keepdims=True)), 1e-12))
  close(Tensor(x).normalize(p=1.0, dim=-1), x / np.maximum(np.abs(x).sum(-1, keepdims=True), 1e-12))
  ln = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
  close(Tensor(x).layernorm(), ln, 1e-3)
  close(Tensor(x).layernorm(weight=Tensor(x[0, 0] * 0 + 2), bias=1.0), ln * 2 + 1, 1e-3)


@settings(max_examples=15)
@given(st.lists(st.integers(0, 3), min_size=0, max_size=2).map(tuple), st.integers(1, 4), st.integers(0, 4))
def test_linear_matmul_dot(batch, k, m):
  x, w, b = rnd(batch + (k,), 17), rnd((k, m), 18), rnd((m,), 19)
  close(Tensor(x).linear(Tensor(w), Tensor(b)), x @ w + b)
  close(Tensor(x).linear(Tensor(w[:, 0] if m else np.ones(k, np.float32))), x * (w[:, 0] if m else 1))
  close(Tensor(x).dot(Tensor(w)), x @ w)
  close(Tensor(w).matmul(Tensor(x), reverse=True), x @ w)
  assert Tensor(x).matmul(Tensor(w), dtype="float16").dtype is dtypes.float16


def test_matmul_errors():
  with pytest.raises(ShapeError, match=r"\(2, 3\) and \(2, 3\)"): Tensor.ones(2, 3) @ Tensor.ones(2, 3)
  with pytest.raises(RuntimeError, match="dot"): Tensor.ones(2, 3).matmul(Tensor.ones(4))
  with pytest.raises(ShapeError, match="1-D"): Tensor.ones(2) @ Tensor(1.0)


def test_softmax_dtypes():
  a = Tensor([[1, 2, 3], [4, 5, 6]])
  x = np.array([[1, 2, 3], [4, 5, 6]], np.float64)
  assert a.softmax().dtype is dtypes.float32 and a.float().softmax(dtype="float16").dtype is dtypes.float16
  assert a.log_softmax(0, dtype="float64").dtype is dtypes.float64
  e = np.exp(x - x.max(0, keepdims=True))
  close(a.log_softmax(0, dtype="float64"), np.log(e / e.sum(0, keepdims=True)))
  close(a.softmax(axis=-1), (np.exp(x) / np.exp(x).sum(-1, keepdims=True)).astype(np.float32))


def test_dropout():
  x = Tensor.ones(2000)
  assert x.dropout(0.5) is x  # not training
  T = type(x)
  old = getattr(T, "training", None)
  T.training = True
  try:
    T.manual_seed(3)
    d = x.dropout(0.25).numpy()
    assert set(np.unique(d).tolist()) <= {0.0, float(np.float32(1 / 0.75))} and abs((d == 0).mean() - 0.25) < 0.04
    assert x.dropout(1.0).numpy().max() == 0 and x.dropout(0).numpy().min() == 1
    with pytest.raises(ValueError, match="range"): x.dropout(1.5)
  finally:
    if old is None: del T.training
    else: T.training = old


def test_max_pool2d_skips_nans_as_tinygrad():
  # tinygrad's max_pool2d skips NaNs (one reduce per window); max() keeps numpy's NaN propagation
  x = Tensor(np.array([[[[1.0, np.nan], [2.0, 3.0]], [[np.nan, np.nan], [np.nan, np.nan]]]], dtype=np.float32))
  out = x.max_pool2d(2).numpy()
  assert out[0, 0, 0, 0] == 3.0 and out[0, 1, 0, 0] == -np.inf
  assert np.isnan(x.max().item())
