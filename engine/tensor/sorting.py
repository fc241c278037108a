"""Sorting: sort, argsort, topk.

A bitonic sorting network over the axis padded to a power of two, N = 2^s: s(s+1)/2 compare-exchange steps, each
of which pairs every element with a partner found by movement ops alone (a reshape and a flip) and keeps the
smaller or the larger of the two with a where. The network sorts (value, original index) pairs, so ties keep their
original order (a stable sort, as tinygrad promises) and the indices come out with the values: O(N log^2 N) work,
one kernel per step (each step is made contiguous, else every step would recompute all steps before it).

NaN counts as larger than every number: last when ascending, first when descending (numpy puts it last in an
ascending sort, torch as here; tinygrad's network mishandles NaNs)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from rulec.engine.ir.dtypes import dtypes
from rulec.engine.tensor.args import int_arg, norm_axis

if TYPE_CHECKING: from rulec.engine.tensor.tensor import Tensor


def _before(a: Tensor, ia: Tensor, b: Tensor, ib: Tensor, n: int, descending: bool) -> Tensor:
  """Whether (a, ia) comes before (b, ib) in the sorted order: by value (NaN largest), then by index; padding
  (index >= n) always comes last."""
  if descending: a, b = b, a   # the value order flips; the index tie-break does not
  less, same = a < b, a == b
  if a.dtype.is_float:
    na, nb = a != a, b != b  # noqa: PLR0124 (NaN tests)
    less, same = less | (nb & ~na), same | (na & nb)
  idx_first = ia < ib
  real = (ia < n) & (ib < n)
  return real.where(less | (same & idx_first), idx_first)


def _step(x: Tensor, ix: Tensor, block: int, mirror: bool, n: int, descending: bool) -> tuple[Tensor, Tensor]:
  """One compare-exchange step over blocks of `block` elements of the last axis: element k of a block pairs with
  element block-1-k (mirror) or with k +- block/2, and the first half of the block keeps the smaller one."""
  lead, size = x.shape[:-1], x.shape[-1]
  shape = lead + (size // block, 2, block // 2)
  def partner(t: Tensor) -> Tensor:
    t = t.reshape(shape)
    t = t.flip((len(lead) + 1, len(lead) + 2)) if mirror else t.flip((len(lead) + 1,))
    return t.reshape(x.shape)
  px, pi = partner(x), partner(ix)
  half = type(x).arange(2, dtype=dtypes.int32, device=x.device).reshape((1,) * len(lead) + (1, 2, 1))
  lower = (half == 0).expand(shape).reshape(x.shape)
  take = _before(x, ix, px, pi, n, descending) ^ lower   # lower half: take the partner when it comes first
  return take.where(px, x).contiguous(), take.where(pi, ix).contiguous()


class SortingMixin:
  """Sorting: sort, argsort, topk."""
  __slots__ = ()

  def sort(self, dim: int = -1, descending: bool = False) -> tuple[Tensor, Tensor]:
    """tinygrad's sort(dim=-1, descending=False): (sorted values, int32 indices into the original axis). Stable:
    equal values keep their original order, in both directions. NaN sorts as the largest value."""
    d = norm_axis(dim, self.ndim)
    nd, n = self.ndim, self.shape[d]
    if n <= 1: return self, type(self).zeros(self.shape, dtype=dtypes.int32, device=self.device)
    order = tuple(nd - 1 if a == d else d if a == nd - 1 else a for a in range(nd))   # swap dim and the last
    x = self.permute(order)
    lead, s = x.shape[:-1], (n - 1).bit_length()
    size = 1 << s
    ix = type(self).arange(size, dtype=dtypes.int32, device=self.device).reshape((1,) * len(lead) + (size,)).expand(lead + (size,))
    x = x.pad(tuple((0, 0) for _ in lead) + ((0, size - n),))   # padding is told apart by its index >= n
    for stage in range(1, s + 1):
      x, ix = _step(x, ix, 1 << stage, True, n, descending)
      for sub in range(stage - 1, 0, -1): x, ix = _step(x, ix, 1 << sub, False, n, descending)
    keep = tuple((0, dd) for dd in lead) + ((0, n),)
    return x.shrink(keep).permute(order), ix.shrink(keep).permute(order)

  def argsort(self, dim: int = -1, descending: bool = False) -> Tensor:
    """tinygrad's argsort(dim=-1, descending=False): the int32 indices of sort() (stable)."""
    return self.sort(dim, descending)[1]

  def topk(self, k: int, dim: int = -1, largest: bool = True, sorted_: bool = True) -> tuple[Tensor, Tensor]:
    """tinygrad's topk(k, dim=-1, largest=True, sorted_=True): (values, int32 indices) of the k largest (or
    smallest) along dim, in sorted order; ties keep the lower index first. sorted_=False raises
    NotImplementedError and k outside [0, size] ValueError, as in tinygrad."""
    if not sorted_: raise NotImplementedError("topk with sorted_=False is not supported")
    d = norm_axis(dim, self.ndim)
    k = int_arg(k, "topk k")
    if not 0 <= k <= self.shape[d]: raise ValueError(f"selected index k={k} is out of range for dim {d} of size {self.shape[d]}")
    x, idx = self.sort(d, descending=largest)
    keep = tuple((0, k) if a == d else (0, s) for a, s in enumerate(self.shape))
    return x.shrink(keep), idx.shrink(keep)
