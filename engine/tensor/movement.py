"""Movement and indexing: reshape, permute, expand, pad, shrink, flip, basic indexing, cat and stack.

Names and defaults are tinygrad's (`dim=` for cat/stack/squeeze/unsqueeze, `transpose(dim0=1, dim1=0)`,
`pad(padding, mode, value)`); rulec's older `axis=` keywords stay as aliases."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from rulec.engine.ir.dtypes import dtypes
from rulec.engine.ir.ops import Ops
from rulec.engine.tensor.args import (AxisError, DefaultInt, DuplicateAxisError, ShapeError, ZeroDimError, alias_arg, cast_scalar, int_arg, is_py_scalar, norm_axes,
                                norm_axis, norm_new_axis, pair_arg, promote_types, shape_arg, specialise, specialise_index, symbolic_bounds,
                                symbolic_enabled, bound_expr, weak_dtype)
from rulec.engine.tensor.uops import (alu, bcast, const, take_every)
from rulec.engine.tensor.base import TensorBase, is_advanced_index
from rulec.engine.ir.uop import UOp, linear_form, prod

if TYPE_CHECKING: from rulec.engine.tensor.tensor import Tensor

_ZERO = DefaultInt(0)   # cat's and stack's dim default: passing dim= and axis= together is a TypeError


class MovementMixin:
  """Shape-changing views and joins."""
  __slots__ = ()


  def reshape(self, shape, *args) -> Tensor:
    """reshape(shape, *args): the same elements in a new shape (a tuple or ints; one -1 is inferred; None keeps the
    size of the axis at its position, as tinygrad: `x.reshape(None, None, 3, -1)`)."""
    raw = (shape,) + args
    if len(raw) == 1 and isinstance(raw[0], (tuple, list)): raw = tuple(raw[0])
    if any(s is None for s in raw):
      if (i := max(i for i, s in enumerate(raw) if s is None)) >= self.ndim:
        raise AxisError(f"reshape: None at position {i} keeps axis {i}, but a tensor of shape {self.shape} has "
                        f"{self.ndim} ax{'is' if self.ndim == 1 else 'es'}")
      raw = tuple(self.shape[i] if s is None else s for i, s in enumerate(raw))
    raw = self._sized_dims(raw)
    new = shape_arg(raw, "reshape")
    n = self.numel()
    if sum(1 for s in new if s == -1) > 1: raise ShapeError(f"reshape: only one dimension can be inferred using -1, got {new}")
    if any(s < -1 for s in new): raise ShapeError(f"reshape: negative dimension in {new}")
    if -1 in new:
      known = prod(s for s in new if s != -1)
      if known == 0 or n % known != 0:
        raise ShapeError(f"cannot reshape a tensor of shape {self.shape} (size {n}) into shape {new}")
      new = tuple(n // known if s == -1 else s for s in new)
    if prod(new) != n: raise ShapeError(f"cannot reshape a tensor of shape {self.shape} (size {n}) into shape {new}")
    return self._new(self.uop.reshape(new))

  def _multi_device(self) -> bool:
    """A value spread over several devices: its bound offsets are specialised (rules/multi.rules splits shrinks
    by their int bounds)."""
    return isinstance(self.device, tuple)

  def _sized_dims(self, dims: tuple) -> tuple:
    """A new shape's dims with each bound expression that is the size of one of this tensor's axes (UOp.sizes:
    `x[:, 0:p+1].reshape(2, p+1, 2, 2)`, tinygrad's symbolic shapes) as that axis's extent in `shape`."""
    sizes = self.uop.sizes
    if sizes is None or not any(isinstance(d, UOp) for d in dims): return dims
    extent = {_linear_key(v): n for v, n in zip(sizes, self.shape) if v is not None}
    return tuple(extent.get(_linear_key(d), d) if isinstance(d, UOp) else d for d in dims)

  def view(self, shape, *args) -> Tensor:
    """view(shape, *args): the same as reshape."""
    return self.reshape(shape, *args)

  def permute(self, order, *args) -> Tensor:
    """permute(order, *args): the axes in a new order (a tuple or ints; negative axes count from the end)."""
    order = shape_arg((order,) + args, "permute")
    nd = self.ndim
    norm = tuple(norm_axis(a, nd) for a in order)
    if len(order) != nd: raise ShapeError(f"permute order {order} is not a valid permutation of the {nd} axes of shape {self.shape}")
    if sorted(norm) != list(range(nd)):
      raise DuplicateAxisError(f"permute order {order} is not a valid permutation of the {nd} axes of shape {self.shape}")
    return self._new(self.uop.permute(norm))

  def transpose(self, dim0: int = 1, dim1: int = 0) -> Tensor:
    """transpose(dim0=1, dim1=0): axes dim0 and dim1 swapped (tinygrad's default swaps the first two axes; numpy's
    transpose() reverses them all, which is `.T` or `permute` here)."""
    a, b = norm_axis(dim0, self.ndim), norm_axis(dim1, self.ndim)
    order = list(range(self.ndim))
    order[a], order[b] = order[b], order[a]
    return self.permute(order)

  def expand(self, shape, *args) -> Tensor:
    """expand(shape, *args): broadcast to shape (numpy's broadcast_to; -1 keeps a dimension)."""
    raw = (shape,) + args
    if len(raw) == 1 and isinstance(raw[0], (tuple, list)): raw = tuple(raw[0])
    new = shape_arg(self._sized_dims(raw), "expand")
    old = self.shape
    if len(new) < len(old): raise ShapeError(f"cannot broadcast {old} to new_shape={new}: fewer dimensions")
    lead = len(new) - len(old)
    full = []
    for i, s in enumerate(new):
      o = old[i - lead] if i >= lead else None
      if s == -1:
        if o is None: raise ShapeError(f"cannot broadcast {old} to new_shape={new}: -1 for a new leading dimension")
        s = o
      if s < 0: raise ShapeError(f"cannot broadcast {old} to new_shape={new}: negative dimension")
      if o is not None and o != s and o != 1: raise ShapeError(f"cannot broadcast {old} to new_shape={new}: axis {i} has size {o}")
      full.append(s)
    return self._new(bcast(self.uop, tuple(full)))

  def broadcast_to(self, shape, *args) -> Tensor:
    """broadcast_to(shape, *args): the same as expand (torch's name)."""
    return self.expand(shape, *args)

  def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    """flatten(start_dim=0, end_dim=-1): axes start_dim..end_dim merged into one; a 0-d tensor becomes shape (1,)."""
    if self.ndim == 0: return self.reshape(1)
    s, e = norm_axis(start_dim, self.ndim), norm_axis(end_dim, self.ndim)
    if s > e: raise ShapeError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim} (shape {self.shape})")
    sh = self.shape
    return self.reshape(sh[:s] + (prod(sh[s:e + 1]),) + sh[e + 1:])

  def squeeze(self, dim: Any = None, *, axis: Any = None) -> Tensor:
    """squeeze(dim=None): without dim every size-1 axis removed; with dim that axis if it has size 1, else the
    tensor unchanged (tinygrad; numpy raises). rulec also takes a tuple of axes, and `axis=` as an alias."""
    dim = alias_arg(dim, axis, "dim", "axis", "squeeze")
    sh = self.shape
    if dim is None: axes = tuple(i for i, d in enumerate(sh) if d == 1)
    else: axes = tuple(a for a in norm_axes(dim, self.ndim) if sh[a] == 1)
    return self.reshape(tuple(d for i, d in enumerate(sh) if i not in axes))

  def unsqueeze(self, dim: Any = None, *, axis: Any = None) -> Tensor:
    """unsqueeze(dim): a size-1 axis inserted at dim (-ndim-1 .. ndim); `axis=` is an alias."""
    dim = alias_arg(dim, axis, "dim", "axis", "unsqueeze")
    if dim is None: raise TypeError("unsqueeze() missing the axis: unsqueeze(dim)")
    a = norm_new_axis(dim, self.ndim)
    sh = self.shape
    return self.reshape(sh[:a] + (1,) + sh[a:])

  def pad(self, padding: Any, mode: str = "constant", value: Any = 0.0) -> Tensor:
    """pad(padding, mode='constant', value=0.0): pad (or, negative, crop) the axes.

    padding is a flat sequence of ints, (left, right) of the last axis first, then of the one before
    (torch's form: `(1, 2, 0, 1)`), or one (before, after) pair or None per axis (`((0, 1), (1, 2))`); rulec also
    takes one int for every side. mode is 'constant' (fill with value; a Python float on an int tensor makes
    it float32, as in tinygrad), 'reflect' (mirror without the edge, like np.pad's 'reflect'), 'replicate'
    (np.pad's 'edge') or 'circular' (np.pad's 'wrap'). A crop and a pad on one axis: 'reflect' and 'replicate' pad
    from the whole axis and crop after (so the padding may mirror what is cropped, as tinygrad's and torch's);
    'constant' and 'circular' crop first."""
    if mode not in _PAD_MODES: raise NotImplementedError(f"pad mode={mode!r} is not supported; modes: {', '.join(_PAD_MODES)}")
    if mode == "constant" and (sym := self._symbolic_pads(padding)) is not None:
      return self._padded(self, sym, value)
    pads = self._pad_pairs(padding)
    if mode in ("reflect", "replicate") and any(min(p) < 0 < max(p) for p in pads):
      pos = tuple((max(b, 0), max(a, 0)) for b, a in pads)
      return self._pad_views(pos, mode).pad(tuple((min(b, 0), min(a, 0)) for b, a in pads))
    sh = self.shape
    for i, ((b, a), d) in enumerate(zip(pads, sh)):
      if min(b, 0) + min(a, 0) + d < 0: raise ShapeError(f"pad: cropping {pads[i]} is more than axis {i} of shape {sh} holds")
    x = self.shrink(tuple((-min(b, 0), d + min(a, 0)) for (b, a), d in zip(pads, sh)))
    pos = tuple((max(b, 0), max(a, 0)) for b, a in pads)
    if mode != "constant": return x._pad_views(pos, mode)
    return self._padded(x, pos, value)

  def _padded(self, x: Tensor, pos: tuple, value: Any) -> Tensor:
    """x padded by pos (non-negative (before, after) pairs) with value."""
    dt = self.dtype if not is_py_scalar(value) or value == 0 else weak_dtype(self.dtype, value)
    if dt is not self.dtype: x = x.cast(dt)
    u = x.uop
    padded = u.pad(pos)
    fill = cast_scalar(value, dt)
    zero_fill = fill == 0 and not (dt.is_float and math.copysign(1.0, fill) < 0)
    if zero_fill or padded is u: return self._new(padded)
    mask = const(True, dtypes.bool, u.shape).pad(pos)
    return self._new(UOp(Ops.WHERE, dt, (mask, padded, padded.const_like(fill))))

  def _symbolic_pads(self, padding: Any) -> tuple | None:
    """(before, after) pairs kept symbolic, or None (the caller specialises): one pair or None per axis, some
    holding bound expressions (`a*v + b`) whose sum per pair is an int and which are never negative for any value
    in the Variables' ranges (`x.pad(((p, n - p), None))`: the value moves, the shape does not)."""
    if not symbolic_enabled() or self._multi_device() or not isinstance(padding, (tuple, list)) or len(padding) != self.ndim:
      return None
    out, seen = [], False
    for p in padding:
      if p is None: out.append((0, 0)); continue
      if not isinstance(p, (tuple, list)) or len(p) != 2: return None
      fb, fa = linear_form(p[0]), linear_form(p[1])
      if fb is None or fa is None: return None
      if any(isinstance(x, UOp) for x in p):
        if not all(isinstance(x, UOp) and x.is_symbolic and bound_expr(x) or not isinstance(x, UOp) for x in p): return None
        if any(fb[0].get(v, 0) + n for v, n in fa[0].items()) or any(fa[0].get(v, 0) + n for v, n in fb[0].items()): return None
        if any((x.vmin if isinstance(x, UOp) else x) < 0 for x in p): return None
        seen = True
      elif min(p) < 0: return None
      out.append(tuple(x if isinstance(x, UOp) else int(x) for x in p))
    return tuple(out) if seen else None

  def _pad_pairs(self, padding: Any) -> tuple[tuple[int, int], ...]:
    """pad's padding argument as one (before, after) pair per axis."""
    nd = self.ndim
    padding = specialise(padding)
    if isinstance(padding, (int, np.integer)) and not isinstance(padding, bool): return ((int(padding),) * 2,) * nd
    pads = tuple(specialise(p) for p in padding)
    if all(isinstance(p, (int, np.integer)) for p in pads):   # flat, torch style: last axis first
      if len(pads) % 2: raise ValueError(f"pad: flat padding must have an even number of pads, got {pads}")
      if len(pads) > 2 * nd: raise ValueError(f"pad: padding length is improper: {pads} for a tensor of shape {self.shape}")
      flat = [int_arg(p, "pad amount") for p in pads]
      pairs = [(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)][::-1]
      return ((0, 0),) * (nd - len(pairs)) + tuple(pairs)
    if len(pads) != nd:
      raise ValueError(f"pad: padding length is improper: {len(pads)} (before, after) pairs for a tensor of shape {self.shape}")
    return tuple((0, 0) if p is None else pair_arg(p, "pad amount") for p in pads)

  def _pad_views(self, pos: tuple[tuple[int, int], ...], mode: str) -> Tensor:
    """reflect / replicate / circular padding, axis by axis, from shrinks, flips and expands of self, joined by cat."""
    x = self
    for ax, (b, a) in enumerate(pos):
      if not b and not a: continue
      n = x.shape[ax]
      if mode == "reflect" and max(b, a) >= n:
        raise ValueError(f"pad: reflect padding ({b}, {a}) must be less than the size {n} of axis {ax}")
      if mode == "circular" and max(b, a) > n:
        raise ValueError(f"pad: circular padding ({b}, {a}) wraps around axis {ax} of size {n} more than once")
      if mode == "replicate" and n == 0: raise ValueError(f"pad: cannot replicate the edge of axis {ax}, which is empty")
      part = lambda s, e: x.shrink(tuple((s, e) if i == ax else None for i in range(x.ndim)))  # noqa: E731
      if mode == "reflect": lo, hi = part(1, b + 1).flip(ax), part(n - 1 - a, n - 1).flip(ax)
      elif mode == "circular": lo, hi = part(n - b, n), part(0, a)
      else:
        grow = lambda t, k: t.expand(tuple(k if i == ax else d for i, d in enumerate(t.shape)))  # noqa: E731
        lo, hi = grow(part(0, 1), b), grow(part(n - 1, n), a)
      x = type(x).cat(lo, x, hi, dim=ax)
    return x

  def shrink(self, arg: Any) -> Tensor:
    """shrink(arg): keep [start, end) along each axis: ((start, end) or None, ...)."""
    bounds = arg
    bounds = tuple(bounds)
    sh = self.shape
    if len(bounds) != len(sh): raise ShapeError(f"shrink: {len(bounds)} bounds given for a tensor of shape {sh}")
    out = []
    for i, (b, d) in enumerate(zip(bounds, sh)):
      if b is not None and not self._multi_device() and (sym := symbolic_bounds(b, d)) is not None:   # (kept symbolic)
        out.append(sym)
        continue
      s, e = (0, d) if b is None else pair_arg(b, "shrink bound")
      if not 0 <= s <= e <= d: raise ShapeError(f"shrink: bounds ({s}, {e}) do not fit axis {i} of shape {sh}")
      out.append((s, e))
    return self._new(self.uop.shrink(tuple(out)))

  def flip(self, axis: Any = None, *args) -> Tensor:
    """flip(axis, *args): the order reversed along the axes given (ints or a tuple; each at most once). rulec
    also takes flip() for every axis (tinygrad needs the axes)."""
    axes = norm_axes(axis if not args else (axis, *args), self.ndim)
    return self._new(self.uop.flip(tuple(i in axes for i in range(self.ndim))))

  def __getitem__(self, idx: Any) -> Tensor:
    """Indexing: ints (negative ok), slices (any step), None and one Ellipsis; integer or boolean Tensors (and
    lists of them) go to advanced indexing (engine/tensor/indexing.py)."""
    items = idx if isinstance(idx, tuple) else (idx,)
    # (bound Variables: a slice start:start+n or an int index keeps a bound offset symbolic where it can, below;
    # every other use of a bound value is specialised to its value here)
    items = tuple(it if _maybe_symbolic(it) and not self._multi_device() else specialise_index(it) for it in items)
    # a tuple inside the index is an index array, as a list is (numpy, tinygrad): x[(0,), j, ...], x[((0,),)]
    if any(is_advanced_index(it) or isinstance(it, tuple) for it in items): return self._getitem_advanced(items)
    for it in items:
      if it is None or it is Ellipsis or isinstance(it, slice): continue
      if isinstance(it, (bool, np.bool_)): raise TypeError("indexing with booleans is not supported")
      if isinstance(it, (int, np.integer, UOp)): continue
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
      if _maybe_symbolic(it):
        pair = (it, it + 1) if isinstance(it, UOp) else (0 if it.start is None else it.start, d if it.stop is None else it.stop)
        if (sym := symbolic_bounds(pair, d)) is not None:
          flips.append(False)
          bounds.append(sym)
          steps.append((1, 1))
          if not isinstance(it, UOp): out_shape.append(u.shrink(tuple(sym if i == ax else (0, n) for i, n in enumerate(sh))).shape[ax])
          ax += 1
          continue
        it = specialise_index(it)
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

  def cat(self, *args: Tensor, dim: int = _ZERO, axis: Any = None) -> Tensor:
    """cat(*args, dim=0): self and args joined along dim (`a.cat(b, c, dim=1)`, `Tensor.cat(a, b)`, and rulec's
    `Tensor.cat([a, b])`); dtypes are promoted; `axis=` is an alias of dim."""
    a = alias_arg(dim, axis, "dim", "axis", "cat")
    ts = _tensor_list(self, args, "cat")
    for t in ts:
      if not isinstance(t, TensorBase): raise TypeError(f"cat takes Tensors, got {type(t).__name__}")
      ts[0]._same_device(t)
    nd = ts[0].ndim
    shapes = [t.shape for t in ts]
    if nd == 0: raise ZeroDimError("zero-dimensional tensors cannot be concatenated")
    a = norm_axis(a, nd)
    for s in shapes:
      if len(s) != nd or any(s[i] != shapes[0][i] for i in range(nd) if i != a):
        raise ShapeError(f"cat along dim {a}: shapes {' and '.join(map(str, shapes))} differ off that axis")
    dt = promote_types(*(t.dtype for t in ts))
    total = sum(s[a] for s in shapes)
    out, off = None, 0
    for t in ts:
      n = t.shape[a]
      p = t.uop.cast(dt).pad(tuple((off, total - off - n) if i == a else (0, 0) for i in range(nd)))
      out = p if out is None else alu(Ops.OR if dt.is_bool else Ops.ADD, out, p)
      off += n
    return ts[0]._new(out)

  def stack(self, *args: Tensor, dim: int = _ZERO, axis: Any = None) -> Tensor:
    """stack(*args, dim=0): self and args (of one shape) joined along a new axis dim; `axis=` is an alias."""
    a = alias_arg(dim, axis, "dim", "axis", "stack")
    ts = _tensor_list(self, args, "stack")
    for t in ts:
      if not isinstance(t, TensorBase): raise TypeError(f"stack takes Tensors, got {type(t).__name__}")
    shapes = [t.shape for t in ts]
    if any(s != shapes[0] for s in shapes):
      raise ShapeError(f"all shapes must match for stack, got {' and '.join(map(str, shapes))}")
    a = norm_new_axis(a, ts[0].ndim)
    return type(ts[0]).cat(*[t.unsqueeze(a) for t in ts], dim=a)


_PAD_MODES = ("constant", "reflect", "replicate", "circular")


def _linear_key(v: UOp) -> Any:
  """An expression of Variables as a key: equal for equal linear expressions (`p + 1` built twice, `1 + p`)."""
  f = linear_form(v)
  return v if f is None else (frozenset(f[0].items()), f[1])


def _maybe_symbolic(it: Any) -> bool:
  """An index item that may keep a bound offset symbolic: a bound int expression, or a slice with step 1 whose
  start or stop is one (Tensor.__getitem__ decides once it knows the axis)."""
  if isinstance(it, UOp): return it.is_symbolic and it.dtype.is_int and symbolic_enabled()
  return isinstance(it, slice) and it.step in (None, 1) and symbolic_enabled() and \
    any(isinstance(x, UOp) and x.is_symbolic for x in (it.start, it.stop))


def _tensor_list(first: Any, args: tuple, name: str) -> list:
  """cat's and stack's tensors: given one by one, or as one list or tuple, not both (tinygrad's ValueError: in
  `Tensor.stack((a, b), c)` c is the dim, in torch's order, not a third tensor)."""
  if isinstance(first, (list, tuple)):
    if args: raise ValueError(f"{name}: pass the tensors one by one or as one list, not a list and then {len(args)} more")
    return list(first)
  return [first] + list(args)
