"""Movement and indexing: reshape, permute, expand, pad, shrink, flip, basic indexing, cat and stack."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.dtypes import dtypes
from engine.ops import Ops
from engine.tensor.args import (cast_scalar, norm_axes, norm_axis, norm_new_axis, pair_arg, promote_types,
                                shape_arg)
from engine.tensor.uops import (alu, bcast, const, take_every)
from engine.tensor.base import TensorBase, is_advanced_index
from engine.uop import UOp, prod

if TYPE_CHECKING: from engine.tensor.tensor import Tensor


class MovementMixin:
  """Shape-changing views and joins."""
  __slots__ = ()


  def reshape(self, *shape) -> Tensor:
    new = shape_arg(shape, "reshape")
    n = self.numel()
    if sum(1 for s in new if s == -1) > 1: raise ValueError(f"reshape: only one dimension can be -1, got {new}")
    if any(s < -1 for s in new): raise ValueError(f"reshape: negative dimension in {new}")
    if -1 in new:
      known = prod(s for s in new if s != -1)
      if known == 0 or n % known != 0:
        raise ValueError(f"cannot reshape a tensor of shape {self.shape} (size {n}) into shape {new}")
      new = tuple(n // known if s == -1 else s for s in new)
    if prod(new) != n: raise ValueError(f"cannot reshape a tensor of shape {self.shape} (size {n}) into shape {new}")
    return self._new(self.uop.reshape(new))

  def permute(self, *order) -> Tensor:
    order = shape_arg(order, "permute")
    nd = self.ndim
    if len(order) != nd:
      raise ValueError(f"permute order {order} does not name each of the {nd} axes of shape {self.shape} once")
    norm = tuple(norm_axis(a, nd) for a in order)
    if sorted(norm) != list(range(nd)):
      raise ValueError(f"permute order {order} does not name each of the {nd} axes of shape {self.shape} once")
    return self._new(self.uop.permute(norm))

  def transpose(self, ax0: int | None = None, ax1: int | None = None) -> Tensor:
    """transpose() reverses the axes (numpy); transpose(a, b) swaps axes a and b."""
    if ax0 is None and ax1 is None: return self.T
    if ax0 is None or ax1 is None: raise TypeError("transpose takes no axes or two axes to swap")
    a, b = norm_axis(ax0, self.ndim), norm_axis(ax1, self.ndim)
    order = list(range(self.ndim))
    order[a], order[b] = order[b], order[a]
    return self.permute(order)

  def expand(self, *shape) -> Tensor:
    """Broadcast to shape (numpy's broadcast_to; -1 keeps a dimension)."""
    new = shape_arg(shape, "expand")
    old = self.shape
    if len(new) < len(old): raise ValueError(f"cannot expand shape {old} to {new}: fewer dimensions")
    lead = len(new) - len(old)
    full = []
    for i, s in enumerate(new):
      o = old[i - lead] if i >= lead else None
      if s == -1:
        if o is None: raise ValueError(f"cannot expand shape {old} to {new}: -1 for a new leading dimension")
        s = o
      if s < 0: raise ValueError(f"cannot expand shape {old} to {new}: negative dimension")
      if o is not None and o != s and o != 1: raise ValueError(f"cannot expand shape {old} to {new}: axis {i} has size {o}")
      full.append(s)
    return self._new(bcast(self.uop, tuple(full)))

  def broadcast_to(self, *shape) -> Tensor: return self.expand(*shape)

  def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    if self.ndim == 0: return self.reshape(1)
    s, e = norm_axis(start_dim, self.ndim), norm_axis(end_dim, self.ndim)
    if s > e: raise ValueError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim} (shape {self.shape})")
    sh = self.shape
    return self.reshape(sh[:s] + (prod(sh[s:e + 1]),) + sh[e + 1:])

  def squeeze(self, axis: Any = None) -> Tensor:
    sh = self.shape
    if axis is None: axes = tuple(i for i, d in enumerate(sh) if d == 1)
    else:
      axes = norm_axes(axis, self.ndim)
      for a in axes:
        if sh[a] != 1: raise ValueError(f"cannot squeeze axis {a} of size {sh[a]} (shape {sh}): only size-1 axes can be squeezed")
    return self.reshape(tuple(d for i, d in enumerate(sh) if i not in axes))

  def unsqueeze(self, axis: int) -> Tensor:
    a = norm_new_axis(axis, self.ndim)
    sh = self.shape
    return self.reshape(sh[:a] + (1,) + sh[a:])

  def pad(self, padding: Any, value: Any = 0) -> Tensor:
    """numpy-style padding: ((before, after), ...) per axis (None for none), or one int for every side.

    Negative amounts crop. The fill is `value` cast to the tensor's dtype."""
    nd = self.ndim
    if isinstance(padding, (int, np.integer)) and not isinstance(padding, bool): pads = ((int(padding),) * 2,) * nd
    else:
      pads = tuple(padding)
      if len(pads) != nd: raise ValueError(f"pad: {len(pads)} (before, after) pairs given for a tensor of shape {self.shape}")
      pads = tuple((0, 0) if p is None else pair_arg(p, "pad amount") for p in pads)
    sh = self.shape
    for i, ((b, a), d) in enumerate(zip(pads, sh)):
      if min(b, 0) + min(a, 0) + d < 0: raise ValueError(f"pad: cropping {pads[i]} is more than axis {i} of shape {sh} holds")
    u = self.uop.shrink(tuple((-min(b, 0), d + min(a, 0)) for (b, a), d in zip(pads, sh)))
    pos = tuple((max(b, 0), max(a, 0)) for b, a in pads)
    padded = u.pad(pos)
    fill = cast_scalar(value, self.dtype)
    zero_fill = fill == 0 and not (self.dtype.is_float and math.copysign(1.0, fill) < 0)
    if zero_fill or padded is u: return self._new(padded)
    mask = const(True, dtypes.bool, u.shape).pad(pos)
    return self._new(UOp(Ops.WHERE, self.dtype, (mask, padded, padded.const_like(fill))))

  def shrink(self, bounds: Any) -> Tensor:
    """Keep [start, end) along each axis: ((start, end) or None, ...)."""
    bounds = tuple(bounds)
    sh = self.shape
    if len(bounds) != len(sh): raise ValueError(f"shrink: {len(bounds)} bounds given for a tensor of shape {sh}")
    out = []
    for i, (b, d) in enumerate(zip(bounds, sh)):
      s, e = (0, d) if b is None else pair_arg(b, "shrink bound")
      if not 0 <= s <= e <= d: raise ValueError(f"shrink: bounds ({s}, {e}) do not fit axis {i} of shape {sh}")
      out.append((s, e))
    return self._new(self.uop.shrink(tuple(out)))

  def flip(self, axis: Any = None) -> Tensor:
    axes = norm_axes(axis, self.ndim)
    return self._new(self.uop.flip(tuple(i in axes for i in range(self.ndim))))

  def __getitem__(self, idx: Any) -> Tensor:
    """Indexing: ints (negative ok), slices (any step), None and one Ellipsis; integer or boolean Tensors (and
    lists of them) go to advanced indexing (engine/tensor/indexing.py)."""
    items = idx if isinstance(idx, tuple) else (idx,)
    if any(is_advanced_index(it) for it in items): return self._getitem_advanced(items)
    for it in items:
      if it is None or it is Ellipsis or isinstance(it, slice): continue
      if isinstance(it, (bool, np.bool_)): raise TypeError("indexing with booleans is not supported")
      if isinstance(it, (int, np.integer)): continue
      if isinstance(it, TensorBase): raise TypeError("indexing with a Tensor is not supported; use where() or matmul with a one-hot")
      raise TypeError(f"unsupported index {it!r} of type {type(it).__name__}: use ints, slices, None and ...")
    if sum(1 for it in items if it is Ellipsis) > 1: raise IndexError("an index can only have a single ellipsis ('...')")
    used = sum(1 for it in items if it is not None and it is not Ellipsis)
    nd = self.ndim
    if used > nd: raise IndexError(f"too many indices for tensor: tensor is {nd}-dimensional, but {used} were indexed")
    if any(it is Ellipsis for it in items):
      k = next(i for i, it in enumerate(items) if it is Ellipsis)
      items = items[:k] + (slice(None),) * (nd - used) + items[k + 1:]
    else: items = items + (slice(None),) * (nd - used)
    u, sh = self.uop, self.shape
    flips, bounds, steps, out_shape = [], [], [], []
    ax = 0
    for it in items:
      if it is None: out_shape.append(1); continue
      d = sh[ax]
      if isinstance(it, slice):
        start, stop, step = it.indices(d)
        n = len(range(start, stop, step))
        if step < 0: start, step = d - 1 - start, -step  # read the flipped axis forwards
        flips.append(it.indices(d)[2] < 0)
        bounds.append((start, start + (n - 1) * step + 1) if n > 0 else (0, 0))
        steps.append((step, n))
        out_shape.append(n)
      else:
        i = int(it)
        if not -d <= i < d: raise IndexError(f"index {i} is out of bounds for axis {ax} with size {d}")
        i = i + d if i < 0 else i
        flips.append(False)
        bounds.append((i, i + 1))
        steps.append((1, 1))
      ax += 1
    u = u.flip(tuple(flips)).shrink(tuple(bounds))
    for a, (step, n) in enumerate(steps):
      if step > 1 and n > 1: u = take_every(u, a, n, step)
    return self._new(u.reshape(tuple(out_shape)))

  # *** joining ***

  def cat(self, *others: Tensor, axis: int = 0) -> Tensor:
    """numpy's concatenate: `Tensor.cat(a, b, axis=1)`, `a.cat(b, c)` or `Tensor.cat([a, b])`."""
    ts = (list(self) if isinstance(self, (list, tuple)) else [self]) + list(others)
    if not ts: raise ValueError("cat needs at least one tensor")
    for t in ts:
      if not isinstance(t, TensorBase): raise TypeError(f"cat takes Tensors, got {type(t).__name__}")
      ts[0]._same_device(t)
    nd = ts[0].ndim
    shapes = [t.shape for t in ts]
    if nd == 0: raise ValueError("zero-dimensional tensors cannot be concatenated")
    a = norm_axis(axis, nd)
    for s in shapes:
      if len(s) != nd or any(s[i] != shapes[0][i] for i in range(nd) if i != a):
        raise ValueError(f"cat along axis {axis}: shapes {' and '.join(map(str, shapes))} differ off that axis")
    dt = promote_types(*(t.dtype for t in ts))
    total = sum(s[a] for s in shapes)
    out, off = None, 0
    for t in ts:
      n = t.shape[a]
      p = t.uop.cast(dt).pad(tuple((off, total - off - n) if i == a else (0, 0) for i in range(nd)))
      out = p if out is None else alu(Ops.OR if dt.is_bool else Ops.ADD, out, p)
      off += n
    return ts[0]._new(out)

  def stack(self, *others: Tensor, axis: int = 0) -> Tensor:
    """numpy's stack: `Tensor.stack(a, b, axis=0)` or `Tensor.stack([a, b])`."""
    ts = (list(self) if isinstance(self, (list, tuple)) else [self]) + list(others)
    if not ts: raise ValueError("stack needs at least one tensor")
    for t in ts:
      if not isinstance(t, TensorBase): raise TypeError(f"stack takes Tensors, got {type(t).__name__}")
    shapes = [t.shape for t in ts]
    if any(s != shapes[0] for s in shapes):
      raise ValueError(f"stack needs tensors of one shape, got {' and '.join(map(str, shapes))}")
    a = norm_new_axis(axis, ts[0].ndim)
    return type(ts[0]).cat(*[t.unsqueeze(a) for t in ts], axis=a)

  # *** linear algebra and nn ***
