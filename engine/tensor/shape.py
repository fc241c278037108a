"""Shape functions built from movement ops: repeat, roll, split, unfold, tril/triu, diag, meshgrid, rearrange, ...

Everything here is a composition of RESHAPE / EXPAND / PAD / SHRINK / PERMUTE on the tensor's UOp (or of other
Tensor methods), so it stays lazy, fuses with its neighbours and gets gradients from the movement ops' rules."""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from rulec.engine.ir.ops import Ops
from rulec.engine.tensor.args import ArgError, DuplicateAxisError, ShapeError, int_arg, norm_axes, norm_axis, shape_arg
from rulec.engine.tensor.uops import bcast, window
from rulec.engine.ir.uop import UOp, prod

if TYPE_CHECKING: from rulec.engine.tensor.tensor import Tensor


def _ints(first: Any, rest: tuple, what: str) -> tuple[int, ...]:
  """tinygrad's `f(shape, *args)` convention: f(2, 3) and f((2, 3)) mean the same."""
  return shape_arg((first,) + tuple(rest), what)


def _axis_list(v: Any) -> tuple:
  return tuple(v) if isinstance(v, (tuple, list)) else (v,)


def _tri_mask(t: Tensor, diagonal: int, lower: bool) -> UOp:
  """Bool mask over the last two axes of t: col - row <= diagonal (lower) or >= diagonal (upper)."""
  r, c = t.shape[-2:]
  rows = type(t).arange(r, device=t.device).reshape(r, 1)
  cols = type(t).arange(c, device=t.device).reshape(1, c)
  d = cols - rows
  m = (d <= diagonal) if lower else (d >= diagonal)
  return bcast(m.uop, t.shape)


class ShapeMixin:
  """Shape functions built from movement ops: repeat, roll, split, unfold, tril/triu, diag, meshgrid, ..."""
  __slots__ = ()

  def view(self, shape: Any, *args) -> Tensor:
    """view(shape, *args): tinygrad's (and torch's) name for reshape."""
    return self.reshape(_ints(shape, args, "view"))

  def size(self, dim: int | None = None) -> Any:
    """size(dim=None): the shape, or the length of one axis."""
    return self.shape if dim is None else self.shape[norm_axis(dim, self.ndim)]

  def repeat(self, repeats: Any, *args) -> Tensor:
    """repeat(repeats, *args): tile the tensor repeats[i] times along axis i (numpy's tile; torch's repeat).

    Unlike np.tile, len(repeats) must be at least ndim (tinygrad and torch); extra repeats add leading axes."""
    reps = _ints(repeats, args, "repeat")
    if len(reps) < self.ndim:
      raise ShapeError(f"repeat: {len(reps)} repeats {reps} given for a tensor of shape {self.shape}; need at least {self.ndim}")
    if any(r < 0 for r in reps): raise ValueError(f"repeat: negative repeat count in {reps}")
    sh = (1,) * (len(reps) - self.ndim) + self.shape
    # (s0, s1) -> (1, s0, 1, s1) -> (r0, s0, r1, s1) -> (r0*s0, r1*s1): each axis repeated whole
    u = self.uop.reshape(tuple(d for s in sh for d in (1, s)))
    u = u.expand(tuple(d for r, s in zip(reps, sh) for d in (r, s)))
    return self._new(u.reshape(tuple(r * s for r, s in zip(reps, sh))))

  def repeat_interleave(self, repeats: int, dim: int | None = None) -> Tensor:
    """repeat_interleave(repeats, dim=None): each element repeats times in a row along dim (numpy's repeat);
    dim=None flattens first. repeats is an int (tinygrad has no per-element counts)."""
    n = int_arg(repeats, "repeat_interleave repeats")
    if n < 0: raise ValueError(f"repeat_interleave: repeats must be non-negative, got {n}")
    x = self.flatten() if dim is None else self
    a = 0 if dim is None else norm_axis(dim, self.ndim)
    sh = x.shape
    u = x.uop.reshape(sh[:a + 1] + (1,) + sh[a + 1:]).expand(sh[:a + 1] + (n,) + sh[a + 1:])
    return self._new(u.reshape(sh[:a] + (sh[a] * n,) + sh[a + 1:]))

  def roll(self, shifts: Any, dims: Any = None) -> Tensor:
    """roll(shifts, dims=None): shift elements along dims, wrapping around (numpy's roll); dims=None rolls the
    flattened tensor and restores the shape."""
    if dims is None: return self.flatten().roll(shifts, 0).reshape(self.shape)
    sh_list, dim_list = _axis_list(shifts), _axis_list(dims)
    if len(sh_list) != len(dim_list):
      raise ArgError(f"roll: {len(sh_list)} shifts {shifts!r} for {len(dim_list)} dims {dims!r}")
    u = self.uop
    for s, d in zip(sh_list, dim_list):
      a, s = norm_axis(d, self.ndim), int_arg(s, "roll shift")
      n = u.shape[a]
      if n == 0 or s % n == 0: continue
      s %= n
      # two copies end to end, then the window of length n starting at n - s
      sh = u.shape
      u = u.reshape(sh[:a] + (1,) + sh[a:]).expand(sh[:a] + (2,) + sh[a:]).reshape(sh[:a] + (2 * n,) + sh[a + 1:])
      u = u.shrink(tuple((n - s, 2 * n - s) if i == a else (0, d) for i, d in enumerate(sh)))
    return self._new(u)

  def split(self, sizes: Any, dim: int = 0) -> tuple[Tensor, ...]:
    """split(sizes, dim=0): pieces of `sizes` elements along dim (the last may be shorter), or of the listed sizes
    (which must sum to the axis length). Note numpy's split takes section counts or cut points instead."""
    a = norm_axis(dim, self.ndim)
    n = self.shape[a]
    if isinstance(sizes, (tuple, list)):
      parts = tuple(int_arg(s, "split size") for s in sizes)
      if any(s < 0 for s in parts): raise ValueError(f"split: negative size in {parts}")
      if sum(parts) != n:
        raise ShapeError(f"split: sizes {parts} sum to {sum(parts)}, not to the length {n} of axis {a} of shape {self.shape}")
    else:
      k = int_arg(sizes, "split size")
      if k <= 0: raise ValueError(f"split: size must be positive, got {k}")
      parts = tuple(min(k, n - i) for i in range(0, n, k)) or (0,)
    out, off = [], 0
    for p in parts:
      out.append(self._new(self.uop.shrink(tuple((off, off + p) if i == a else (0, d) for i, d in enumerate(self.shape)))))
      off += p
    return tuple(out)

  def chunk(self, chunks: int, dim: int = 0) -> list[Tensor]:
    """chunk(chunks, dim=0): at most `chunks` pieces of ceil(n / chunks) elements along dim (a list, as tinygrad)."""
    c = int_arg(chunks, "chunks")
    if c <= 0: raise ValueError(f"chunk: chunks must be greater than 0, got {c}")
    a = norm_axis(dim, self.ndim)
    n = self.shape[a]
    if n == 0: return [self] * c   # torch and tinygrad: c empty pieces
    return list(self.split(-(-n // c), a))

  def unflatten(self, dim: int, sizes: Any) -> Tensor:
    """unflatten(dim, sizes): axis dim becomes the axes `sizes` (one of them may be -1)."""
    a = norm_axis(dim, self.ndim)
    sh = self.shape
    return self.reshape(sh[:a] + tuple(shape_arg(tuple(sizes), "unflatten")) + sh[a + 1:])

  def unfold(self, dim: int, size: int, step: int) -> Tensor:
    """unfold(dim, size, step): windows of `size` elements every `step` along dim; dim becomes the window count
    and a new last axis of length size holds each window (torch's unfold)."""
    a = norm_axis(dim, self.ndim)
    size, step = int_arg(size, "unfold size"), int_arg(step, "unfold step")
    n = self.shape[a]
    if step <= 0: raise ArgError(f"unfold: step must be > 0, got {step}")
    if not 0 <= size <= n: raise ShapeError(f"unfold: size {size} does not fit axis {a} of length {n} (shape {self.shape})")
    if size == 0 or n == 0:  # no elements to read: only the shape matters
      sh = self.shape[:a] + ((n - size) // step + 1,) + self.shape[a + 1:] + (size,)
      return type(self).zeros(sh, dtype=self.dtype, device=self.device)
    u = window(self.uop, a, size, step, 1)  # (..., out, size, ...)
    nd = self.ndim + 1
    return self._new(u.permute(tuple(i for i in range(nd) if i != a + 1) + (a + 1,)))

  def diag(self) -> Tensor:
    """diag(): the square matrix with this 1-D tensor on its diagonal (tinygrad takes 1-D input only; numpy's diag
    of a matrix is diagonal())."""
    if self.ndim != 1: raise ValueError(f"diag: expect input to be 1-D, got shape {self.shape}")
    n = self.shape[0]
    # row i of (n, 1) padded to n+1 wide, read flat: element i lands at i*(n+1), i.e. at (i, i) of n x n
    u = self.uop.reshape((n, 1)).pad(((0, 0), (0, n))).reshape((n * (n + 1),)).shrink(((0, n * n),))
    return self._new(u.reshape((n, n)))

  def diagonal(self, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
    """diagonal(offset=0, dim1=0, dim2=1): the diagonal over axes dim1, dim2, as a new last axis (numpy, torch).
    An offset past the edge gives an empty diagonal (torch; tinygrad raises)."""
    a, b = norm_axis(dim1, self.ndim), norm_axis(dim2, self.ndim)
    if a == b: raise DuplicateAxisError(f"diagonal: dim1 and dim2 cannot be the same axis, got {dim1} and {dim2}")
    off = int_arg(offset, "diagonal offset")
    rest = tuple(i for i in range(self.ndim) if i not in (a, b))
    u = self.uop.permute(rest + (a, b))
    r, c = u.shape[-2:]
    m = max(0, min(r - max(-off, 0), c - max(off, 0)))
    lead = tuple((0, d) for d in u.shape[:-2])
    r0, c0 = max(-off, 0), max(off, 0)
    u = u.shrink(lead + ((min(r0, r), min(r0, r) + m), (min(c0, c), min(c0, c) + m)))
    ls = u.shape[:-2]
    # (m, m) read flat with rows of m+1: the diagonal is the first column
    u = u.reshape(ls + (m * m,)).pad(tuple((0, 0) for _ in ls) + ((0, m),)).reshape(ls + (m, m + 1))
    return self._new(u.shrink(lead + ((0, m), (0, 1))).reshape(ls + (m,)))

  def _tri(self, diagonal: Any, lower: bool) -> Tensor:
    if self.ndim < 2: raise ValueError(f"{'tril' if lower else 'triu'}: input needs at least 2 dimensions, got shape {self.shape}")
    k = int_arg(diagonal, "diagonal")
    zero = self.uop.const_like(False if self.dtype.is_bool else 0)
    return self._new(UOp(Ops.WHERE, self.dtype, (_tri_mask(self, k, lower), self.uop, bcast(zero, self.shape))))

  def tril(self, diagonal: int = 0) -> Tensor:
    """tril(diagonal=0): zero the elements above the diagonal-th diagonal of the last two axes (numpy's tril)."""
    return self._tri(diagonal, True)

  def triu(self, diagonal: int = 0) -> Tensor:
    """triu(diagonal=0): zero the elements below the diagonal-th diagonal of the last two axes (numpy's triu)."""
    return self._tri(diagonal, False)

  def meshgrid(self, *args: Tensor, indexing: str = "ij") -> tuple[Tensor, ...]:
    """meshgrid(*args, indexing='ij'): coordinate grids from this and the other tensors (each flattened).

    The default indexing is 'ij' (tinygrad and torch); numpy's default is 'xy'."""
    if indexing not in ("ij", "xy"): raise ArgError(f'meshgrid: indexing must be in ("ij", "xy"), got {indexing!r}')
    ts = [t.flatten() for t in (self, *args)]
    shape = tuple(t.shape[0] for t in ts)
    if indexing == "xy" and len(ts) >= 2: shape = (shape[1], shape[0]) + shape[2:]
    out = []
    for i, t in enumerate(ts):
      ax = {0: 1, 1: 0}.get(i, i) if indexing == "xy" and len(ts) >= 2 else i
      out.append(t.reshape(tuple(-1 if j == ax else 1 for j in range(len(ts)))).expand(shape))
    return tuple(out)

  def swapaxes(self, axis1: int, axis2: int) -> Tensor:
    """swapaxes(axis1, axis2): numpy's name for transpose(axis1, axis2) (tinygrad has transpose only)."""
    a, b = norm_axis(axis1, self.ndim), norm_axis(axis2, self.ndim)
    order = list(range(self.ndim))
    order[a], order[b] = order[b], order[a]
    return self.permute(tuple(order))

  def movedim(self, source: Any, destination: Any) -> Tensor:
    """movedim(source, destination): move axes to new places, the rest keep their order (numpy's moveaxis, torch)."""
    src, dst = _axis_list(source), _axis_list(destination)
    if len(src) != len(dst): raise ValueError(f"movedim: {len(src)} source axes {source!r} for {len(dst)} destinations {destination!r}")
    s, d = norm_axes(src, self.ndim), norm_axes(dst, self.ndim)
    order = [i for i in range(self.ndim) if i not in s]
    for dd, ss in sorted(zip(d, s)): order.insert(dd, ss)
    return self.permute(tuple(order))

  moveaxis = movedim

  def pad_to(self, shape: Any, *args, value: Any = 0) -> Tensor:
    """pad_to(shape, *args, value=0): pad at the end of each axis up to shape (None keeps an axis)."""
    new = (tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)) + tuple(args)
    if len(new) != self.ndim: raise ShapeError(f"pad_to: shape {new} does not have the {self.ndim} axes of {self.shape}")
    full = tuple(s if n is None else int_arg(n, "pad_to size") for s, n in zip(self.shape, new))
    if any(n < s for s, n in zip(self.shape, full)): raise ShapeError(f"pad_to: cannot pad shape {self.shape} to the smaller {full}")
    return self.pad(tuple((0, n - s) for s, n in zip(self.shape, full)), value=value)

  def shrink_to(self, shape: Any, *args) -> Tensor:
    """shrink_to(shape, *args): keep the first shape[i] elements of each axis (None keeps an axis)."""
    new = (tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)) + tuple(args)
    if len(new) != self.ndim: raise ShapeError(f"shrink_to: shape {new} does not have the {self.ndim} axes of {self.shape}")
    full = tuple(s if n is None else int_arg(n, "shrink_to size") for s, n in zip(self.shape, new))
    if any(not 0 <= n <= s for s, n in zip(self.shape, full)): raise ShapeError(f"shrink_to: cannot shrink shape {self.shape} to {full}")
    return self.shrink(tuple((0, n) for n in full))

  def rearrange(self, formula: str, **sizes: int) -> Tensor:
    """rearrange(formula, **sizes): einops' rearrange, e.g. 'b (h w) c -> b c h w' with h=4; '...' is allowed,
    and 1 or () on the right-hand side adds an axis."""
    if formula.count("->") != 1: raise ValueError(f"rearrange: formula {formula!r} needs exactly one '->'")
    lhs, rhs = (_parse_side(s, formula) for s in formula.split("->"))
    names_l = [n for g in lhs for n in g]
    if "..." in names_l:
      k = self.ndim - (len(lhs) - 1)
      if k < 0: raise ShapeError(f"rearrange: {formula!r} names more axes than shape {self.shape} has")
      ell = [f"...{i}" for i in range(k)]
      lhs, rhs = _expand_ellipsis(lhs, ell), _expand_ellipsis(rhs, ell)
      names_l = [n for g in lhs for n in g]
    if len(lhs) != self.ndim: raise ShapeError(f"rearrange: {formula!r} has {len(lhs)} axes on the left, shape {self.shape} has {self.ndim}")
    names_r = [n for g in rhs for n in g if n != "1"]
    if sorted(names_l) != sorted(names_r) or len(set(names_l)) != len(names_l):
      raise ValueError(f"rearrange: {formula!r} must name the same axes once on each side")
    for n in sizes:
      if n not in names_l: raise ValueError(f"rearrange: size given for {n!r}, which {formula!r} does not name")
    dims = {}
    for g, d in zip(lhs, self.shape):
      unknown = [n for n in g if n not in sizes]
      known = prod(sizes[n] for n in g if n in sizes)
      if len(unknown) > 1: raise ValueError(f"rearrange: cannot infer the sizes of {unknown} in {formula!r}")
      if unknown: dims[unknown[0]] = d // known if known and d % known == 0 else -1
      if (unknown and dims[unknown[0]] < 0) or (not unknown and known != d):
        raise ShapeError(f"rearrange: axis ({' '.join(g)}) of length {d} does not split as {formula!r} with {sizes}")
      dims.update({n: sizes[n] for n in g if n in sizes})
    x = self.reshape(tuple(dims[n] for n in names_l)).permute(tuple(names_l.index(n) for n in names_r))
    return x.reshape(tuple(prod(dims.get(n, 1) for n in g if n != "1") for g in rhs))


def _parse_side(side: str, formula: str) -> list[list[str]]:
  """One side of a rearrange formula as groups of axis names: 'b (h w) c' -> [['b'], ['h', 'w'], ['c']]."""
  groups, cur = [], None
  for tok in re.findall(r"\.\.\.|\(|\)|[A-Za-z_][A-Za-z0-9_]*|\d+|\S", side):
    if tok == "(":
      if cur is not None: raise ValueError(f"rearrange: nested parentheses in {formula!r}")
      cur = []
    elif tok == ")":
      if cur is None: raise ValueError(f"rearrange: unbalanced parentheses in {formula!r}")
      groups.append(cur); cur = None
    elif tok == "1" or tok == "..." or tok[0].isalpha() or tok[0] == "_":
      (groups.append([tok]) if cur is None else cur.append(tok))
    else: raise ValueError(f"rearrange: unexpected {tok!r} in {formula!r}")
  if cur is not None: raise ValueError(f"rearrange: unbalanced parentheses in {formula!r}")
  return [[n for n in g if n != "1"] if len(g) > 1 else g for g in groups]


def _expand_ellipsis(groups: list[list[str]], ell: list[str]) -> list[list[str]]:
  out = []
  for g in groups:
    if g == ["..."]: out.extend([e] for e in ell)
    else: out.append([e for n in g for e in (ell if n == "..." else [n])])
  return out
