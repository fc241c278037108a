"""Data-dependent indexing: gather, scatter, masked ops, one_hot, nonzero, indexing by Tensors.

Every gather here is lazy and built from existing ops: the index is compared against `arange(n)` to form a
one-hot mask over the indexed axis and the masked values are reduced (tinygrad's approach), so each output element
reads the whole indexed axis: O(len(index) * n) work, no host computation. Only masked_select and nonzero without
`size` realize something (the count of selected elements), because their output shape depends on the data.

Out-of-range indices follow tinygrad, not numpy: they never raise. Tensor indices in `t[idx]` wrap once when
negative and read 0 when still out of range (a write through them is dropped); gather reads 0 and scatter drops
the write for any index outside [0, n), negative ones included."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from rulec.engine.ir.dtypes import dtypes
from rulec.engine.tensor.args import ShapeError, broadcast_shapes, int_arg, lowest, norm_axis
from rulec.engine.tensor.base import TensorBase
from rulec.engine.ir.uop import prod

if TYPE_CHECKING: from rulec.engine.tensor.tensor import Tensor


class IndexShapeError(ShapeError, IndexError):
  """Index tensors, or an assigned value, whose shapes do not broadcast together: numpy raises IndexError or
  ValueError, tinygrad IndexError, so this is all of them."""


def _highest(dt) -> Any:
  if dt.is_bool: return True
  return float("inf") if dt.is_float else dt.max()


def _index_dtype(dt):
  """Index arithmetic (wrapping, linearising) in int32, or int64 where int32 could not hold the values."""
  return dtypes.int64 if dt.itemsize == 8 or dt is dtypes.uint32 else dtypes.int32


def _pick(mask: Tensor, x: Tensor, axis: int) -> Tensor:
  """The element of x where mask holds along axis (mask holds at most once there); 0 (False) where it never does.
  The reduction stays in x's dtype: summing zeros and one value is exact."""
  if x.dtype.is_bool: return mask.where(x, False).any(axis)
  return mask.where(x, 0).sum(axis, dtype=x.dtype)


class IndexingMixin:
  """Data-dependent indexing: gather, scatter, masked ops, one_hot, nonzero, indexing by Tensors."""
  __slots__ = ()

  def _arange_at(self, n: int, axis: int, ndim: int) -> Tensor:
    """0..n-1 (int32) laid along axis of an ndim-dimensional shape of 1s, for broadcasting against an index."""
    r = type(self).arange(n, dtype=dtypes.int32, device=self.device)
    return r.reshape(tuple(n if i == axis else 1 for i in range(ndim)))

  def _int_index(self, index: Any, what: str) -> Tensor:
    """index as an integer Tensor on this device (tinygrad raises RuntimeError for other dtypes)."""
    idx = self._lift(index)
    self._same_device(idx)
    if not idx.dtype.is_int: raise RuntimeError(f"{what} expects an integer index tensor, got {idx.dtype.name}")
    return idx.cast(_index_dtype(idx.dtype))

  # *** indexing by tensors ***

  def _index_item(self, it: Any) -> Any:
    """One index item with lists and numpy arrays made Tensors; Tensors checked. Other items pass unchanged."""
    if isinstance(it, np.ndarray) and it.ndim == 0: it = it.item()
    if isinstance(it, TensorBase):
      self._same_device(it)
      if not it.dtype.is_int:
        hint = "; use masked_select() for a boolean mask" if it.dtype.is_bool else ""
        raise IndexError(f"index dtype {it.dtype.name} is not supported{hint}")
      return it
    if not isinstance(it, (list, tuple, np.ndarray)): return it
    try: arr = np.asarray(it)
    except ValueError: raise IndexError(f"index {it!r:.60} is not a rectangular list of ints") from None
    if arr.size == 0: arr = arr.astype(np.int32)
    if arr.dtype.kind == "b": raise IndexError(f"index {it!r:.60} holds booleans: boolean masks are not supported; use masked_select()")
    if arr.dtype.kind == "f": raise IndexError(f"index {it!r:.60} holds floats: float indexing is not supported")
    if arr.dtype.kind not in "iu": raise IndexError(f"index {it!r:.60} holds non-int elements")
    return self._lift(arr)

  def _split_index(self, items: tuple) -> tuple[tuple, list[int], list[Tensor]]:
    """(the basic index with every tensor item made a full slice, the axes of the basic result that tensors index,
    those tensors)."""
    if len(items) == 1 and isinstance(items[0], list) and any(isinstance(i, (TensorBase, slice)) or i is None or
                                                              i is Ellipsis for i in items[0]):
      items = tuple(items[0])  # tinygrad (and old numpy): a list holding Tensors or slices is a tuple of indices
    conv = [self._index_item(it) for it in items]
    if sum(1 for it in conv if it is Ellipsis) > 1: raise IndexError("an index can only have a single ellipsis ('...')")
    used = sum(1 for it in conv if it is not None and it is not Ellipsis)
    nd = self.ndim
    if used > nd: raise IndexError(f"too many indices for tensor: tensor is {nd}-dimensional, but {used} were indexed")
    if Ellipsis in [it for it in conv if not isinstance(it, TensorBase)]:
      k = next(i for i, it in enumerate(conv) if it is Ellipsis)
      conv = conv[:k] + [slice(None)] * (nd - used) + conv[k + 1:]
    basic, dims, tensors, out = [], [], [], 0
    for it in conv:
      if isinstance(it, TensorBase):
        dims.append(out); tensors.append(it); basic.append(slice(None)); out += 1
      else:
        basic.append(it)
        if it is None or isinstance(it, slice): out += 1
    return tuple(basic), dims, tensors

  @staticmethod
  def _linear_index(x: Tensor, dims: list[int], tensors: list[Tensor]) -> tuple[Tensor, tuple]:
    """The tensors' positions in x's indexed axes flattened to one index (C order), -1 where any is out of
    range after wrapping negatives once; and the shape the index tensors broadcast to."""
    try: big = broadcast_shapes(*(t.shape for t in tensors))
    except ValueError:
      raise IndexShapeError(f"shape mismatch: indexing tensors of shapes {', '.join(str(t.shape) for t in tensors)} "
                            f"cannot be broadcast together") from None
    lin, ok, stride = None, None, 1
    for d, t in reversed(list(zip(dims, tensors))):
      s = x.shape[d]
      t = t.cast(_index_dtype(t.dtype))
      t = (t < 0).where(t + s, t)
      inside = (t >= 0) & (t < s)
      lin = t * stride if lin is None else lin + t * stride
      ok = inside if ok is None else ok & inside
      stride *= s
    return ok.where(lin, -1).expand(big) if big else ok.where(lin, -1), big

  @staticmethod
  def _adv_layout(x: Tensor, dims: list[int]) -> tuple[list[int], bool]:
    """The axes of x not indexed by tensors, and whether the tensors' axes stay where they were (numpy and
    tinygrad: when the tensor-indexed axes are adjacent, else the broadcast index axes go first)."""
    rest = [d for d in range(x.ndim) if d not in dims]
    return rest, dims == list(range(dims[0], dims[0] + len(dims))) and dims[0] > 0

  def _advanced_parts(self, items: tuple):
    """The basic view an advanced index applies to, the tensor-indexed axes, the linear index over them and its
    broadcast shape, the other axes, whether the indexed axes stay in place, and the other axes' sizes."""
    basic, dims, tensors = self._split_index(items)
    x = self[basic]
    lin, big = self._linear_index(x, dims, tensors)
    rest, in_place = self._adv_layout(x, dims)
    return x, dims, lin, big, rest, in_place, tuple(x.shape[d] for d in rest)

  def _getitem_advanced(self, items: tuple) -> Tensor:
    x, dims, lin, big, rest, in_place, rshape = self._advanced_parts(items)
    n = prod(x.shape[d] for d in dims)
    xs = x.permute(tuple(dims + rest)).reshape((1,) * len(big) + (n,) + rshape)
    hot = lin.reshape(big + (1,) * (1 + len(rest))) == x._arange_at(n, len(big), len(big) + 1 + len(rest))
    r = _pick(hot, xs, len(big))   # big + rest
    if in_place:
      nb, d0 = len(big), dims[0]
      r = r.permute(tuple(range(nb, nb + d0)) + tuple(range(nb)) + tuple(range(nb + d0, r.ndim)))
    return r

  def _setitem_advanced(self, items: tuple, value: Any) -> None:
    """Writes through tensor indices (tinygrad's semantics): where an index repeats, the value that comes last in
    the broadcast index order wins; out-of-range positions are dropped. The tensor must hold storage: it is
    realized first if it does not."""
    self._ensure_storage()
    view, dims, lin, big, rest, in_place, rshape = self._advanced_parts(items)
    sizes = tuple(view.shape[d] for d in dims)
    n, b = prod(sizes), prod(big)
    out_shape = rshape[:dims[0]] + big + rshape[dims[0]:] if in_place else big + rshape
    v = value if isinstance(value, TensorBase) else self._lift(value)
    self._same_device(v)
    try: bshape = broadcast_shapes(v.shape, out_shape)
    except ValueError: bshape = None
    if bshape != out_shape:
      raise IndexShapeError(f"shape mismatch: a value of shape {v.shape} cannot be broadcast to the indexed shape {out_shape}")
    if n == 0 or b == 0: return
    v = v.cast(view.dtype).expand(out_shape)
    if in_place:
      nb, d0 = len(big), dims[0]
      v = v.permute(tuple(range(d0, d0 + nb)) + tuple(range(d0)) + tuple(range(d0 + nb, v.ndim)))
    nr = len(rshape)
    hits = lin.reshape((b, 1)) == view._arange_at(n, 1, 2)            # (b, n): index b writes position n
    order = view._arange_at(b, 0, 2) + 1
    last = hits.where(order, 0).max(0)                                 # (n,): 1 + the last b writing there, or 0
    sel = hits & (order == last.reshape((1, n)))
    new = _pick(sel.reshape((b, n) + (1,) * nr), v.reshape((b, 1) + rshape), 0)   # (n,) + rest
    xs = view.permute(tuple(dims + rest)).reshape((n,) + rshape)
    merged = (last > 0).reshape((n,) + (1,) * nr).where(new, xs).reshape(sizes + rshape)
    inv = [0] * view.ndim
    for i, d in enumerate(dims + rest): inv[d] = i
    self._write_view(view, merged.permute(tuple(inv)), reads_in_place=True, given=v)   # (xs: only where nothing lands)

  # *** gather and scatter ***

  def gather(self, dim: int, index: Tensor) -> Tensor:
    """tinygrad's gather(dim, index): out[i][j][k] = self[i][index[i][j][k]][k] for dim=1 (torch's gather).

    index has self's number of dimensions and may be smaller than self off `dim`; indices outside [0, n) read 0
    (tinygrad: no error and no wrapping of negative indices)."""
    idx = self._int_index(index, "gather")
    if idx.ndim != self.ndim: raise ShapeError(f"gather: self.ndim must equal index.ndim, got shapes {self.shape} and {idx.shape}")
    d = norm_axis(dim, self.ndim)
    if any(i > s for a, (s, i) in enumerate(zip(self.shape, idx.shape)) if a != d):
      raise ShapeError(f"gather: index of shape {idx.shape} is larger than self of shape {self.shape} off dim {d}")
    nd, n = self.ndim, self.shape[d]
    x = self.shrink(tuple((0, n) if a == d else (0, i) for a, i in enumerate(idx.shape)))
    swap = tuple(nd if a == d else d if a == nd else a for a in range(nd + 1))
    x = x.reshape(x.shape + (1,)).permute(swap)             # the gathered axis last, a 1 in its place
    hot = idx.reshape(idx.shape + (1,)) == self._arange_at(n, nd, nd + 1)
    return _pick(hot, x, nd)

  def _scatter_parts(self, dim: int, index: Any, src: Tensor, what: str) -> tuple[Tensor, Tensor, Tensor]:
    """(mask, values): both of self's shape plus a last axis j over index's positions along dim (and one more,
    always unmasked, so reductions over it are never empty); mask[..., c, ..., j] says index position j writes
    position c of dim, values holds src's element there. Also the positions some index writes."""
    idx = self._int_index(index, what)
    self._same_device(src)
    if not idx.ndim == self.ndim == src.ndim:
      raise ShapeError(f"{what}: self, index and src must have one number of dimensions, got shapes {self.shape}, {idx.shape} and {src.shape}")
    d = norm_axis(dim, self.ndim)
    if any(i > s for s, i in zip(src.shape, idx.shape)) or any(i > s for a, (s, i) in enumerate(zip(self.shape, idx.shape)) if a != d):
      raise ShapeError(f"{what}: index of shape {idx.shape} must fit in src of shape {src.shape} and in self of "
                       f"shape {self.shape} off dim {d}")
    if src.dtype != self.dtype: raise RuntimeError(f"{what}: self.dtype={self.dtype.name} must equal src.dtype={src.dtype.name}")
    nd, n, shape = self.ndim, self.shape[d], idx.shape
    src = src.shrink(tuple((0, s) for s in shape))
    swap = tuple(nd if a == d else d if a == nd else a for a in range(nd + 1))
    il, sl = (t.reshape(shape + (1,)).permute(swap) for t in (idx, src))  # j last, a 1 at dim
    mask = il == self._arange_at(n, d, nd + 1)
    sl = sl.expand(mask.shape)
    pads = tuple((0, 1) if a == nd else (0, 0) if a == d else (0, self.shape[a] - shape[a]) for a in range(nd + 1))
    mask, sl = mask.pad(pads, value=False), sl.pad(pads, value=0)
    return mask, sl, mask.any(nd)

  def scatter(self, dim: int, index: Tensor, src: Any, reduce: str | None = None) -> Tensor:
    """tinygrad's scatter(dim, index, src, reduce=None): self with self[index[i][j]][j] = src[i][j] for dim=0.

    src is a Tensor of self's dtype (RuntimeError otherwise) or a Python scalar; reduce='add' / 'multiply'
    (scalar src only) combine with self instead. Where index repeats a position, the last one along dim wins;
    indices outside [0, n) are dropped (tinygrad; torch raises)."""
    if reduce not in (None, "add", "multiply"): raise TypeError(f"reduce={reduce!r} must be one of None, 'multiply', or 'add'")
    if isinstance(src, (bool, int, float)):
      src = type(self).full(self._lift(index).shape, src, dtype=self.dtype, device=self.device)
    elif reduce: raise TypeError("non-scalar src is not supported with reduce arg. use scatter_reduce")
    if reduce == "add": return self.scatter_reduce(dim, index, src, "sum", include_self=True)
    if reduce == "multiply": return self.scatter_reduce(dim, index, src, "prod", include_self=True)
    mask, vals, hit = self._scatter_parts(dim, index, self._lift(src), "scatter")
    nd = self.ndim
    order = self._arange_at(mask.shape[-1], nd, nd + 1) + 1
    last = mask.where(order, 0).max(nd, keepdim=True)
    return hit.where(_pick(mask & (order == last), vals, nd), self)

  def scatter_reduce(self, dim: int, index: Tensor, src: Tensor, reduce: str, include_self: bool = True) -> Tensor:
    """tinygrad's scatter_reduce(dim, index, src, reduce, include_self=True), reduce one of 'sum', 'prod', 'mean',
    'amax', 'amin': every src element sent to a position (duplicates all count) is combined with it, and with
    self's element there unless include_self=False. Dtypes follow sum/prod; 'mean' of ints gives floats; indices
    outside [0, n) are dropped."""
    if reduce not in ("sum", "prod", "mean", "amax", "amin"):
      raise RuntimeError(f"reduce={reduce!r} must be one of 'sum', 'prod', 'mean', 'amax', 'amin'")
    mask, vals, hit = self._scatter_parts(dim, index, self._lift(src), "scatter_reduce")
    nd = self.ndim
    def base(identity: Any) -> Any: return self if include_self else hit.where(identity, self)
    if reduce == "sum": return mask.where(vals, 0).sum(nd) + base(0)
    if reduce == "prod": return mask.where(vals, 1).prod(nd) * base(1)
    if reduce == "amax": return mask.where(vals, lowest(self.dtype)).max(nd).maximum(base(lowest(self.dtype)))
    if reduce == "amin": return mask.where(vals, _highest(self.dtype)).min(nd).minimum(base(_highest(self.dtype)))
    count = mask.sum(nd) + (1 if include_self else hit.where(0, 1))
    total = mask.where(vals, 0).sum(nd) + base(0)
    return total / (count.cast(self.dtype) if self.dtype.is_float else count)

  # *** masks ***

  def masked_fill(self, mask: Tensor, value: Any) -> Tensor:
    """tinygrad's masked_fill(mask, value): value where the bool mask holds, else self (mask.where(value, self))."""
    m = self._lift(mask)
    if not m.dtype.is_bool: raise RuntimeError(f"masked_fill expects a bool mask, got {m.dtype.name}")
    return m.where(value, self)

  def _mask_for(self, mask: Any, what: str) -> Tensor:
    m = self._lift(mask)
    self._same_device(m)
    if not m.dtype.is_bool: raise RuntimeError(f"{what} expects a bool mask tensor, got {m.dtype.name}")
    try: shape = broadcast_shapes(m.shape, self.shape)
    except ValueError: shape = None
    if shape != self.shape: raise ShapeError(f"{what}: a mask of shape {m.shape} does not broadcast to shape {self.shape}")
    return m.expand(self.shape)

  def _compact(self, vals: Tensor, keep: Tensor, size: int | None, fill_value: Any) -> Tensor:
    """The rows of vals (n, w) where keep (n,) holds, in order: (count, w). With size=None the count is read
    from the device (realizes keep); with a size, `size` rows, cut short or filled with fill_value."""
    n, w = vals.shape
    k = int(keep.sum().item()) if size is None else int_arg(size, "size")
    if k < 0: raise ValueError(f"size must be non-negative, got {k}")
    pos = keep.cumsum(0) - 1                                       # where each kept row lands
    sel = keep.reshape((1, n)) & (pos.reshape((1, n)) == self._arange_at(k, 0, 2))
    out = _pick(sel.reshape((k, n, 1)), vals.reshape((1, n, w)), 1)
    if size is None: return out
    filled = (self._arange_at(k, 0, 2) < keep.sum()).where(out, fill_value)
    return filled.cast(vals.dtype)

  def masked_select(self, mask: Tensor, size: int | None = None, fill_value: Any = 0) -> Tensor:
    """tinygrad's masked_select(mask, size=None, fill_value=0): the elements where mask (bool, broadcast to self)
    holds, as a 1-D tensor in C order. Without size the length depends on the data, so the mask's count is
    realized here; with size the result has that length, cut short or padded with fill_value (nothing realized)."""
    m = self._mask_for(mask, "masked_select")
    n = self.numel()
    return self._compact(self.reshape((n, 1)), m.reshape((n,)), size, fill_value).reshape((-1,))

  def nonzero(self, size: int | None = None, fill_value: Any = 0) -> Tensor:
    """tinygrad's nonzero(size=None, fill_value=0): the (count, ndim) int32 coordinates of the non-zero elements
    (NaN counts as non-zero) in C order. Without size the count is realized (data-dependent shape); with size the
    result has `size` rows, padded with fill_value."""
    n, shape = self.numel(), self.shape
    keep = (self if self.dtype.is_bool else self != 0).reshape((n,))
    strides = [prod(shape[a + 1:]) for a in range(len(shape))]
    lin = self._arange_at(n, 0, 2)
    coords = (lin // self._lift(np.array(strides, dtype=np.int32)).reshape((1, -1))) % \
      self._lift(np.array(shape, dtype=np.int32)).reshape((1, -1)) if shape else lin.shrink(((0, n), (0, 0)))
    return self._compact(coords.cast(dtypes.int32), keep, size, fill_value)

  def one_hot(self, num_classes: int) -> Tensor:
    """tinygrad's one_hot(num_classes): int32 with a new last axis of num_classes, 1 at each element's class.
    Classes outside [0, num_classes) (negative ones too) give an all-zero row, as in tinygrad."""
    if not self.dtype.is_int: raise RuntimeError(f"one_hot expects an integer dtype, got {self.dtype.name}")
    n = int_arg(num_classes, "num_classes")
    if n < 0: raise ValueError(f"num_classes must be non-negative, got {n}")
    hot = self.reshape(self.shape + (1,)) == self._arange_at(n, self.ndim, self.ndim + 1)
    return hot.where(1, 0)
