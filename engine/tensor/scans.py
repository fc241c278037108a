"""Cumulative scans along an axis (cumsum, cumprod, cummax, cummin, logcumsumexp).

A scan of an axis of length n is a reduction over a triangular window: row i of an (n, n) view holds x[0..i] and
the op's identity elsewhere, reduced along its last axis, so O(n^2) work. Axes longer than 2 * BLOCK are split
into blocks of BLOCK elements (as tinygrad does): each block is scanned that way, the block totals are scanned
(recursively), and each block is combined with the total of the blocks before it, so O(n * BLOCK) work.

Dtypes follow the matching reduction: cumsum like sum, cumprod like prod, cummax/cummin keep the dtype.
NaNs propagate (numpy's maximum.accumulate; tinygrad's cummax skips NaNs because its max does)."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rulec.engine.ir.dtypes import dtypes
from rulec.engine.tensor.args import lowest, norm_axis

if TYPE_CHECKING: from rulec.engine.tensor.tensor import Tensor

BLOCK = 256


def _identity(kind: str, dt) -> object:
  return {"sum": 0, "prod": 1, "max": lowest(dt), "lse": -math.inf}[kind]


def _tri(x: Tensor, n: int) -> Tensor:
  """(n, n) bool, [i, j] = j <= i: which elements row i of a scan window reads."""
  r = type(x).arange(n, dtype=dtypes.int32, device=x.device)
  return r.reshape((n, 1)) >= r.reshape((1, n))


def _last(t: Tensor, lo: int, hi: int) -> Tensor:
  return t.shrink(tuple((lo, hi) if a == t.ndim - 1 else (0, d) for a, d in enumerate(t.shape)))


def _unsafe_inf(m: Tensor) -> Tensor:
  """m with +-inf made 0: the shift that keeps exp() in range without making inf - inf a NaN."""
  return (m.abs() == math.inf).where(0.0, m)


def _window_scan(x: Tensor, kind: str) -> Tensor:
  """Inclusive scan of the last axis through the (n, n) triangular window: O(n^2)."""
  n = x.shape[-1]
  tri = _tri(x, n)
  w = x.reshape(x.shape[:-1] + (1, n))
  if kind == "sum": return tri.where(w, 0).sum(-1)
  if kind == "prod": return tri.where(w, 1).prod(-1)
  if kind == "max": return tri.where(w, lowest(x.dtype)).max(-1)
  m = _unsafe_inf(tri.where(w, -math.inf).max(-1))               # running max, the shift of each row
  e = tri.where((w - m.reshape(m.shape + (1,))).exp(), 0.0)
  return e.sum(-1).log() + m


def _combine(kind: str, a: Tensor, b: Tensor) -> Tensor:
  if kind == "sum": return a + b
  if kind == "prod": return a * b
  if kind == "max": return a.maximum(b)
  m = _unsafe_inf(a.maximum(b))                                   # logaddexp, stable
  return ((a - m).exp() + (b - m).exp()).log() + m


def _scan_last(x: Tensor, kind: str) -> Tensor:
  """Inclusive scan of the last axis (length >= 1): blocked when the axis is long."""
  n, lead = x.shape[-1], x.shape[:-1]
  if n <= 2 * BLOCK: return _window_scan(x, kind)
  nb = -(-n // BLOCK)
  ident = _identity(kind, x.dtype)
  xb = x.pad(tuple((0, 0) for _ in lead) + ((nb * BLOCK - n, 0),), value=ident).reshape(lead + (nb, BLOCK))
  inner = _scan_last(xb, kind)                                     # (..., nb, BLOCK)
  totals = _last(inner, BLOCK - 1, BLOCK).reshape(lead + (nb,))
  before = _scan_last(totals, kind).pad(tuple((0, 0) for _ in lead) + ((1, 0),), value=_identity(kind, inner.dtype))
  out = _combine(kind, inner, _last(before, 0, nb).reshape(lead + (nb, 1)))
  return _last(out.reshape(lead + (nb * BLOCK,)), nb * BLOCK - n, nb * BLOCK)


class ScansMixin:
  """Cumulative scans along an axis (cumsum, cumprod, cummax, cummin, logcumsumexp)."""
  __slots__ = ()

  def _scan(self, axis: int, kind: str) -> Tensor:
    """The scan along axis (a 0-d tensor scans as one element, axis 0 or -1, like tinygrad)."""
    if self.ndim == 0: return self.reshape((1,))._scan(norm_axis(axis, 1), kind).reshape(())
    ax = norm_axis(axis, self.ndim)
    nd, n = self.ndim, self.shape[ax]
    if n == 0:  # nothing to scan: only the dtype of the matching reduction
      if kind == "max" or kind == "lse": return self
      r = self.sum(ax, keepdim=True) if kind == "sum" else self.prod(ax, keepdim=True)
      return r.shrink(tuple((0, 0) if a == ax else (0, d) for a, d in enumerate(r.shape)))
    order = tuple(nd - 1 if a == ax else ax if a == nd - 1 else a for a in range(nd))  # swap axis and the last
    return _scan_last(self.permute(order), kind).permute(order)

  def _sized_like(self, out: Tensor, axis: int) -> Tensor:
    """A scan's result with the size the scanned axis had when that size is a Variable's (UOp.sizes): the scan
    builds its axis anew (its elements past the size are running totals of nothing), so the size is put back."""
    sizes = self.uop.sizes
    if self.ndim == 0 or sizes is None or (v := sizes[norm_axis(axis, self.ndim)]) is None: return out
    ax = norm_axis(axis, self.ndim)
    return out._new(out.uop.shrink(tuple((0, v) if a == ax else (0, d) for a, d in enumerate(out.shape))))

  def cumsum(self, axis: int = 0) -> Tensor:
    """tinygrad's cumsum(axis=0): running sums along axis, in sum()'s dtype (bool and small ints give int32)."""
    return self._sized_like(self._scan(axis, "sum"), axis)

  def cumprod(self, axis: int) -> Tensor:
    """tinygrad's cumprod(axis): running products along axis (no default axis, as in tinygrad), in prod()'s dtype."""
    return self._sized_like(self._scan(axis, "prod"), axis)

  def cummax(self, axis: int = 0) -> tuple[Tensor, Tensor]:
    """tinygrad's cummax(axis=0): (running maxima, int32 index where each was first reached); ties keep the first
    index. A NaN propagates (numpy, torch) and its index is that of the first NaN; tinygrad skips NaNs."""
    values = self._scan(axis, "max")
    if self.ndim == 0: return values, type(self).zeros((), dtype=dtypes.int32, device=self.device)
    ax = norm_axis(axis, self.ndim)
    n = self.shape[ax]
    if n == 0: return values, type(self).zeros(self.shape, dtype=dtypes.int32, device=self.device)
    # a record is an element above every one before it (or the first NaN); the index of the running max at i is
    # the last record at or before i: itself a running max, of record positions
    pads = tuple((1, 0) if a == ax else (0, 0) for a in range(self.ndim))
    prev = values.pad(pads, value=lowest(self.dtype)).shrink(tuple((0, n) if a == ax else (0, d) for a, d in enumerate(self.shape)))
    rec = self > prev
    if self.dtype.is_float: rec = rec | ((self != self) & (prev == prev))  # noqa: PLR0124 (NaN tests)
    pos = type(self).arange(n, dtype=dtypes.int32, device=self.device).reshape(tuple(n if a == ax else 1 for a in range(self.ndim)))
    return self._sized_like(values, ax), self._sized_like(rec.where(pos, 0)._scan(ax, "max"), ax)

  def cummin(self, axis: int = 0) -> tuple[Tensor, Tensor]:
    """tinygrad's cummin(axis=0): (running minima, int32 index where each was first reached); see cummax."""
    flip = lambda t: t._new(t._flip_order(t.uop))  # noqa: E731  (ReduceMixin's order-reversing bijection)
    values, idx = flip(self).cummax(axis)
    return flip(values), idx

  def logcumsumexp(self, axis: int = 0) -> Tensor:
    """tinygrad's logcumsumexp(axis=0): log(cumsum(exp(x))), each prefix shifted by its own max so it neither
    overflows nor underflows; ints give float32, float16 and bfloat16 are computed in float32. +-inf are exact (tinygrad: NaN)."""
    out = self.dtype if self.dtype.is_float else dtypes.default_float
    x = self.cast(dtypes.float32) if out.is_half or not self.dtype.is_float else self
    return self._sized_like(x._scan(axis, "lse").cast(out), axis)
