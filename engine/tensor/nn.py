"""Linear algebra and neural-network building blocks: matmul, einsum, softmax, normalisation, dropout, attention,
N-d convolutions, pooling, unpooling and interpolation.

Convolutions and pools read their input through `window` (engine/tensor/uops.py), movement ops that turn a
spatial axis into (output position, kernel tap) axes, so they stay lazy and fuse like any other graph."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from rulec.engine.ir.dtypes import dtypes
from rulec.engine.ir.ops import Ops
from rulec.engine.tensor.args import (ArgError, ShapeError, broadcast_shapes, int_arg, lowest, norm_axes, norm_axis, promote_types,
                                to_dtype)
from rulec.engine.tensor.uops import (alu, bcast, window)
from rulec.engine.tensor.base import TensorBase
from rulec.engine.tensor import winograd
from rulec.runtime.devices import winograd_convs
from rulec.engine.ir.uop import UOp, prod

if TYPE_CHECKING: from rulec.engine.tensor.tensor import Tensor


def _tuple(v: Any, n: int, what: str) -> tuple[int, ...]:
  """An int for every one of n dims, or a tuple of n ints."""
  if isinstance(v, (tuple, list)):
    if len(v) != n: raise ValueError(f"{what} must be an int or {n} ints, got {v!r}")
    return tuple(int_arg(x, what) for x in v)
  v = int_arg(v, what)
  return (v,) * n


def _pads(padding: Any, n: int, what: str) -> list[tuple[int, int]]:
  """(before, after) for each of n spatial dims, first dim first, from an int, n ints (each dim both sides) or
  2n ints in torch's flat order (last dim first: (left, right, top, bottom) for 2-D), as tinygrad reads them."""
  if isinstance(padding, (tuple, list)) and len(padding) == 2 * n:
    flat = [int_arg(p, what) for p in padding]
    return [(flat[2 * i], flat[2 * i + 1]) for i in range(n)][::-1]
  return [(p, p) for p in _tuple(padding, n, what)]


def _windows(x: Tensor, k: tuple, s: tuple, d: tuple, pads: list, fill: Any, name: str) -> tuple[UOp, tuple[int, ...]]:
  """x's last len(k) axes padded by pads (fill) and cut into windows: (..., O1, k1, O2, k2, ...); the tap axes."""
  n, nd = len(k), x.ndim
  sp = x.shape[nd - n:]
  for i, (L, kk, dd, (pb, pa)) in enumerate(zip(sp, k, d, pads)):
    if L + pb + pa < (kk - 1) * dd + 1:
      raise ShapeError(f"{name}: kernel {k} (dilation {d}) is larger than the padded input "
                       f"{tuple(L + p + q for L, (p, q) in zip(sp, pads))} (input shape {x.shape})")
  u = x.pad(((0, 0),) * (nd - n) + tuple(pads), value=fill).uop if any(p != (0, 0) for p in pads) else x.uop
  for i in range(n): u = window(u, nd - n + 2 * i, k[i], s[i], d[i])
  return u, tuple(nd - n + 2 * i + 1 for i in range(n))


def _ceil_pads(sp: tuple, k: tuple, s: tuple, d: tuple, pads: list) -> list[tuple[int, int]]:
  """Extra padding after each axis so ceil_mode's last, partial window exists (torch's rule: it must start
  inside the input or its left padding)."""
  out = []
  for L, kk, ss, dd, (pb, pa) in zip(sp, k, s, d, pads):
    span, tot = (kk - 1) * dd + 1, L + pb + pa
    o = max(0, -(-(tot - span) // ss)) + 1
    if (o - 1) * ss >= L + pb: o -= 1
    out.append((pb, pa + max(0, (o - 1) * ss + span - tot)))
  return out


def _einsum_parse(formula: str, ndims: list[int]) -> tuple[list[list[str]], list[str]]:
  """The index letters of each input and of the output; '...' becomes private letters (>= U+0100), right-aligned."""
  f = formula.replace(" ", "")
  lhs, rhs = f.split("->") if "->" in f else (f, None)
  parts = lhs.split(",")
  if len(parts) != len(ndims): raise ValueError(f"einsum: {formula!r} names {len(parts)} operands, {len(ndims)} given")
  for p in parts + ([rhs] if rhs is not None else []):
    if p.count("...") > 1: raise ArgError(f"einsum: {p!r} in {formula!r} has more than one '...'")
  n_ell = max([nd - len(p.replace("...", "")) for p, nd in zip(parts, ndims) if "..." in p], default=0)
  ell = [chr(0x100 + i) for i in range(n_ell)]
  def letters(p: str, nd: int | None) -> list[str]:
    if "..." not in p: return list(p)
    a, b = p.split("...")
    k = n_ell if nd is None else nd - len(a) - len(b)
    return list(a) + ell[n_ell - k:] + list(b)
  ins = [letters(p, nd) for p, nd in zip(parts, ndims)]
  for p, ls, nd in zip(parts, ins, ndims):
    if len(ls) != nd or not all(c.isalpha() or c >= "\u0100" for c in ls):
      raise ValueError(f"einsum: {p!r} in {formula!r} does not fit an operand of {nd} dimensions")
  if rhs is None:
    flat = [c for ls in ins for c in ls]
    out = ell + sorted(c for c in set(flat) if flat.count(c) == 1 and c < "\u0100")
  else: out = letters(rhs, None)
  if len(set(out)) != len(out): raise ValueError(f"einsum: output {rhs!r} of {formula!r} repeats an index")
  return ins, out


def _einsum_diagonals(t: Tensor, letters: list[str]) -> tuple[Tensor, list[str]]:
  """A letter repeated in one operand ('ii') reads that operand's diagonal."""
  letters = list(letters)
  while len(set(letters)) != len(letters):
    c = next(c for c in letters if letters.count(c) > 1)
    i = letters.index(c)
    j = letters.index(c, i + 1)
    if t.shape[i] != t.shape[j]: raise ShapeError(f"einsum: index {c!r} has sizes {t.shape[i]} and {t.shape[j]} in shape {t.shape}")
    t = t.diagonal(0, i, j)
    letters = [x for k, x in enumerate(letters) if k not in (i, j)] + [c]
  return t, letters


def _drop(shape: tuple, axes: tuple) -> tuple:
  return tuple(d for i, d in enumerate(shape) if i not in axes)


class NNMixin:
  """matmul and the neural-network functions."""
  __slots__ = ()

  # *** linear algebra ***

  def matmul(self, x: Any, reverse: bool = False, dtype: Any = None) -> Tensor:
    """matmul(x, reverse=False, dtype=None): numpy's matmul (1-D operands gain and lose an axis, batch axes
    broadcast); reverse computes x @ self; dtype is the dtype to multiply and accumulate in."""
    a, b = self, self._lift(x)
    if reverse: a, b = b, a
    return self._matmul(a, b, dtype)

  @staticmethod
  def _matmul(a: Tensor, b: Tensor, dtype: Any = None) -> Tensor:
    a._same_device(b)
    sa, sb = a.shape, b.shape
    if a.ndim == 0 or b.ndim == 0:
      raise ShapeError(f"matmul: both tensors need to be at least 1-D, got shapes {sa} and {sb}")
    dt = promote_types(a.dtype, b.dtype) if dtype is None else to_dtype(dtype)
    au, bu = a.uop.cast(dt), b.uop.cast(dt)
    if a.ndim == 1: au = au.reshape((1,) + sa)
    if b.ndim == 1: bu = bu.reshape(sb + (1,))
    (n, k), (k2, m) = au.shape[-2:], bu.shape[-2:]
    if k != k2: raise ShapeError(f"matmul: cannot dot {sa} and {sb} ({k} != {k2})")
    try: batch = broadcast_shapes(au.shape[:-2], bu.shape[:-2])
    except ValueError: raise ShapeError(f"matmul: batch axes of shapes {sa} and {sb} cannot be broadcast together") from None
    au = bcast(au.reshape(au.shape[:-1] + (1, k)), batch + (n, m, k))
    nb = len(bu.shape)
    bu = bu.permute(tuple(range(nb - 2)) + (nb - 1, nb - 2))
    bu = bcast(bu.reshape(bu.shape[:-2] + (1, m, k)), batch + (n, m, k))
    r = alu(Ops.AND if dt.is_bool else Ops.MUL, au, bu).r(Ops.ADD, (len(batch) + 2,))
    out = batch + ((n,) if a.ndim > 1 else ()) + ((m,) if b.ndim > 1 else ())
    return a._new(r.reshape(out))

  def __matmul__(self, o):
    if not isinstance(o, (TensorBase, np.ndarray, list, tuple)): return NotImplemented
    return self.matmul(o)

  def __rmatmul__(self, o):
    if not isinstance(o, (np.ndarray, list, tuple)): return NotImplemented
    return self._matmul(self._lift(o), self)

  def dot(self, w: Any, dtype: Any = None) -> Tensor:
    """dot(w, dtype=None): matmul (tinygrad's dot is matmul, not numpy's dot of N-d arrays)."""
    return self.matmul(w, dtype=dtype)

  def linear(self, weight: Any, bias: Any = None, dtype: Any = None) -> Tensor:
    """linear(weight, bias=None, dtype=None): self @ weight + bias; a 1-D weight scales elementwise (tinygrad)."""
    w = self._lift(weight)
    x = self * w if w.ndim == 1 else self.matmul(w, dtype=dtype)
    return x if bias is None else x + bias

  @classmethod
  def einsum(cls, formula: str, *operands: Any, dtype: Any = None) -> Tensor:
    """einsum(formula, *operands, dtype=None): numpy's einsum ('ij,jk->ik', implicit output, '...', repeated
    indices take diagonals); operands may also be passed as one list. Sizes of a letter must match exactly."""
    ops = list(operands[0]) if len(operands) == 1 and isinstance(operands[0], (list, tuple)) else list(operands)
    if not ops or not all(isinstance(t, TensorBase) for t in ops): raise TypeError("einsum: operands must be Tensors")
    ins, out = _einsum_parse(formula, [t.ndim for t in ops])
    sizes: dict[str, int] = {}
    xs = []
    for t, letters in zip(ops, ins):
      if dtype is not None: t = t.cast(dtype)
      t, letters = _einsum_diagonals(t, letters)
      for c, n in zip(letters, t.shape):
        if sizes.setdefault(c, n) != n and not (c >= "\u0100" and 1 in (n, sizes[c])):
          raise ShapeError(f"einsum: index {c!r} of {formula!r} has sizes {sizes[c]} and {n} (shapes {[o.shape for o in ops]})")
        if c >= "\u0100": sizes[c] = max(sizes[c], n)
      xs.append((t, letters))
    for c in out:
      if c not in sizes: raise ValueError(f"einsum: output index {c!r} of {formula!r} is not in any input")
    order = list(out) + sorted(set(sizes) - set(out))
    r = None
    for t, letters in xs:  # each operand laid out over all indices (1 where it lacks one), then multiplied
      have = sorted(letters, key=order.index)
      t = t.permute(tuple(letters.index(c) for c in have)) if have else t
      t = t.reshape(tuple(t.shape[have.index(c)] if c in have else 1 for c in order))
      r = t if r is None else r * t
    r = r.expand(tuple(sizes[c] for c in order))
    return r.sum(tuple(range(len(out), len(order)))) if len(order) > len(out) else r

  # *** softmax and normalisation ***

  def _soft_in(self, dtype: Any) -> tuple[Tensor, Any]:
    if dtype is None: return self._half_up()
    dt = to_dtype(dtype)
    return self.cast(dt)._half_up()[0], dt

  def softmax(self, axis: int = -1, dtype: Any = None) -> Tensor:
    """softmax(axis=-1, dtype=None): exp(x - max) / sum(exp(x - max)) along axis, computed in dtype if given."""
    if self.ndim == 0: return self.reshape(1).softmax(norm_axis(axis, 1), dtype).reshape(())   # 0-d: 1.0 (tinygrad)
    x, out = self._soft_in(dtype)
    ax = norm_axis(axis, self.ndim)
    # (a NaN makes the whole slice NaN anyway.) The max only keeps exp in range: softmax does not change when every
    # input moves by one amount, so no gradient flows through it, and tinygrad detaches it too; a gradient taken
    # through it is zero up to rounding and cost the backward pass two kernels (the max's own gradient)
    m = self._new(x._reduce(Ops.MAX, ax, True, numpy_nan=False)).detach()
    e = (x - m).exp()
    # times the row's reciprocal, as tinygrad computes it: one divide per row, not per element (a vector divide
    # costs about what the whole exp does), at most an ulp from e / sum
    return (e * e.sum(ax, keepdim=True).reciprocal()).cast(out)

  def log_softmax(self, axis: int = -1, dtype: Any = None) -> Tensor:
    """log_softmax(axis=-1, dtype=None): x - max - log(sum(exp(x - max))) along axis."""
    if self.ndim == 0: return self.reshape(1).log_softmax(norm_axis(axis, 1), dtype).reshape(())
    x, out = self._soft_in(dtype)
    ax = norm_axis(axis, self.ndim)
    s = x - self._new(x._reduce(Ops.MAX, ax, True, numpy_nan=False)).detach()   # (no gradient: as in softmax)
    return (s - s.exp().sum(ax, keepdim=True).log()).cast(out)

  def layernorm(self, axis: Any = -1, eps: float = 1e-5, weight: Any = None, bias: Any = None) -> Tensor:
    """layernorm(axis=-1, eps=1e-5): (x - mean) / sqrt(var + eps) over axis (biased var); rulec's extra
    weight / bias keywords scale and shift after (tinygrad does that in nn.LayerNorm)."""
    x, out = self._half_up()
    norm_axes(axis, self.ndim)
    d = x - x.mean(axis, keepdim=True)
    r = (d * (d.square().mean(axis, keepdim=True) + eps).rsqrt()).cast(out)
    if weight is not None: r = r * weight
    if bias is not None: r = r + bias
    return r

  def batchnorm(self, weight: Any, bias: Any, mean: Any, invstd: Any, axis: Any = 1) -> Tensor:
    """batchnorm(weight, bias, mean, invstd, axis=1): (x - mean) * weight * invstd + bias, the parameters laid
    along axis (weight and bias may be None)."""
    axes = norm_axes(axis, self.ndim)
    shape = tuple(d if i in axes else 1 for i, d in enumerate(self.shape))
    def fit(p): return self._lift(p).reshape(shape)
    x = self - fit(mean)
    if weight is not None: x = x * fit(weight)
    x = x * fit(invstd)
    return x if bias is None else x + fit(bias)

  def normalize(self, p: float = 2.0, dim: int = 1, eps: float = 1e-12) -> Tensor:
    """normalize(p=2.0, dim=1, eps=1e-12): x / max(||x||_p over dim, eps) (torch's F.normalize). As torch's norm,
    p=0 counts the nonzero elements (tinygrad too), p=inf takes the largest |x| and p=-inf the smallest."""
    a = norm_axis(dim, self.ndim)
    x = self if self.dtype.is_float else self.float()
    if p == 2: n = x.square().sum(a, keepdim=True).sqrt()
    elif p == 0: n = (x != 0).sum(a, keepdim=True, dtype=x.dtype)
    elif p == math.inf: n = x.abs().max(a, keepdim=True)
    elif p == -math.inf: n = x.abs().min(a, keepdim=True)
    else: n = (x.abs() ** p).sum(a, keepdim=True) ** (1 / p)
    return x / n.maximum(eps)

  def dropout(self, p: float = 0.5) -> Tensor:
    """dropout(p=0.5): in training (Tensor.training; tinygrad's Context(TRAINING=1)) zero each element with
    probability p and scale the rest by 1/(1-p); otherwise the tensor itself."""
    if not 0 <= p <= 1: raise ValueError(f"dropout: p={p} is out of range [0, 1]")
    if not getattr(type(self), "training", False) or p == 0: return self
    if p == 1: return self.zeros_like()
    keep = type(self).rand(*self.shape, device=self.device) >= p
    return keep.where(self, 0) * (1 / (1 - p))

  def scaled_dot_product_attention(self, key: Any, value: Any, attn_mask: Any = None, dropout_p: float = 0.0,
                                   is_causal: bool = False, enable_gqa: bool = False) -> Tensor:
    """scaled_dot_product_attention(key, value, attn_mask=None, dropout_p=0.0, is_causal=False, enable_gqa=False):
    softmax(q @ k^T / sqrt(d) + mask) @ v; a bool mask keeps where True, a float mask is added."""
    k, v = self._lift(key), self._lift(value)
    if is_causal and attn_mask is not None: raise RuntimeError("scaled_dot_product_attention: cannot set attn_mask when is_causal=True")
    if enable_gqa and self.ndim >= 3 and k.ndim >= 3 and self.shape[-3] != k.shape[-3]:
      rep = self.shape[-3] // k.shape[-3]
      k, v = k.repeat_interleave(rep, -3), v.repeat_interleave(rep, -3)
    qk = self.matmul(k.transpose(-2, -1)) / math.sqrt(self.shape[-1])
    if is_causal: attn_mask = type(self).ones(qk.shape[-2], qk.shape[-1], dtype=dtypes.bool, device=self.device).tril()
    if attn_mask is not None:
      m = self._lift(attn_mask)
      qk = qk + (m.where(0.0, -math.inf) if m.dtype.is_bool else m)
    return qk.softmax(-1).dropout(dropout_p) @ v

  # *** convolutions ***

  def conv2d(self, weight: Any, bias: Any = None, groups: int = 1, stride: Any = 1, dilation: Any = 1,
             padding: Any = 0, dtype: Any = None) -> Tensor:
    """conv2d(weight, bias=None, groups=1, stride=1, dilation=1, padding=0, dtype=None): N-d cross-correlation
    of (N, C, *spatial) input with (O, C/groups, *kernel) weights, 1-D to 3-D and beyond. padding is an int, one
    int per spatial dim, or 2 per dim in torch's flat order (last dim first). Positional order is tinygrad's."""
    w = self._lift(weight)
    self._same_device(w)
    x = self
    n = w.ndim - 2
    if n < 1 or x.ndim != w.ndim:
      raise ShapeError(f"conv2d: a {w.ndim}-D weight of shape {w.shape} needs {w.ndim}-D input (N, C, *spatial), "
                       f"got {x.ndim}-D input of shape {x.shape}; weights are (O, C/groups, *kernel), e.g. 4-D for 2-D conv")
    s, d, pads = _tuple(stride, n, "stride"), _tuple(dilation, n, "dilation"), _pads(padding, n, "padding")
    groups = int_arg(groups, "groups")
    if min(s) < 1 or min(d) < 1 or groups < 1:
      raise ValueError(f"conv2d: stride {stride}, dilation {dilation} and groups {groups} must be positive")
    N, C = x.shape[:2]
    O, Cg, ks = w.shape[0], w.shape[1], w.shape[2:]
    if C != Cg * groups:
      raise ShapeError(f"conv2d: input has {C} channels (shape {x.shape}) but weight of shape {w.shape} with "
                       f"groups={groups} expects {Cg * groups}")
    if O % groups: raise ShapeError(f"conv2d: {O} output channels (weight shape {w.shape}) do not split into {groups} groups")
    if min(ks) < 1: raise ShapeError(f"conv2d: empty kernel in weight shape {w.shape}")
    b = None
    if bias is not None:
      b = self._lift(bias)
      if b.shape != (O,): raise ShapeError(f"conv2d: bias must have shape ({O},), got {b.shape}")
    dt = promote_types(x.dtype, w.dtype) if dtype is None else to_dtype(dtype)
    sp_out = tuple(L + p + q - (k - 1) for L, (p, q), k in zip(x.shape[2:], pads, ks))
    if (winograd.fits(ks, s, d, groups, C, O, sp_out, dt == dtypes.float32) and isinstance(self.device, str)
        and winograd_convs(self.device)):
      out = winograd.conv3x3(x.cast(dt), w.cast(dt), pads)
      return out if b is None else out + b.reshape((1, O, 1, 1))
    u, taps = _windows(x.cast(dt), ks, s, d, pads, 0, "conv2d")  # (N, C, O1, k1, O2, k2, ...)
    outs = tuple(u.shape[a - 1] for a in taps)
    G, Og = groups, O // groups
    win = tuple(v for o, k in zip(outs, ks) for v in (o, k))
    full = (N, G, Og, Cg) + win
    xu = u.reshape((N, G, 1, Cg) + win).expand(full)
    wu = w.uop.cast(dt).reshape((1, G, Og, Cg) + tuple(v for k in ks for v in (1, k))).expand(full)
    red = (3,) + tuple(4 + 2 * i + 1 for i in range(n))
    r = alu(Ops.AND if dt.is_bool else Ops.MUL, xu, wu).r(Ops.ADD, red).reshape((N, O) + outs)
    out = self._new(r)
    return out if b is None else out + b.reshape((1, O) + (1,) * n)

  def conv_transpose2d(self, weight: Any, bias: Any = None, groups: int = 1, stride: Any = 1, dilation: Any = 1,
                       padding: Any = 0, output_padding: Any = 0) -> Tensor:
    """conv_transpose2d(weight, bias=None, groups=1, stride=1, dilation=1, padding=0, output_padding=0): the
    N-d transposed convolution (torch's), weight (C, O/groups, *kernel): a conv2d over the input with stride-1
    zeros between elements, padded by dilation*(k-1) - padding, with the flipped, regrouped kernel."""
    w = self._lift(weight)
    n = w.ndim - 2
    if n < 1 or self.ndim != w.ndim:
      raise ShapeError(f"conv_transpose2d: a {w.ndim}-D weight of shape {w.shape} needs {w.ndim}-D input, got shape {self.shape}")
    s, d = _tuple(stride, n, "stride"), _tuple(dilation, n, "dilation")
    p, op = _pads(padding, n, "padding"), _tuple(output_padding, n, "output_padding")
    groups = int_arg(groups, "groups")
    if min(s) < 1 or min(d) < 1 or groups < 1: raise ValueError(f"conv_transpose2d: bad stride {stride}, dilation {dilation} or groups {groups}")
    C, Og, ks = w.shape[0], w.shape[1], w.shape[2:]
    if self.shape[1] != C or C % groups:
      raise ShapeError(f"conv_transpose2d: input of shape {self.shape} does not fit weight of shape {w.shape} with groups={groups}")
    outs = tuple((L - 1) * si - pb - pa + di * (k - 1) + o + 1 for L, si, di, k, (pb, pa), o in zip(self.shape[2:], s, d, ks, p, op))
    if min(outs) < 1:   # (torch refuses these too: "output size is too small")
      raise ShapeError(f"conv_transpose2d: the output would have size {outs} (input shape {self.shape}, kernel {ks}, stride {s}, "
                       f"dilation {d}, padding {padding}, output_padding {output_padding}): the padding takes more than it has")
    # regroup (G, C/G, O/G, *k) -> (G, O/G, C/G, *k), flip the taps
    wt = w.reshape((groups, C // groups, Og) + ks).transpose(1, 2).flip(tuple(range(3, 3 + n)))
    wt = wt.reshape((groups * Og, C // groups) + ks)
    x, nd = self, self.ndim
    for i, si in enumerate(s):  # stride-1 zeros between input elements
      if si == 1: continue
      a, L = 2 + i, x.shape[2 + i]
      sh = x.shape
      x = x.reshape(sh[:a + 1] + (1,) + sh[a + 1:]).pad(tuple((0, si - 1) if j == a + 1 else (0, 0) for j in range(nd + 1)))
      x = x.reshape(sh[:a] + (L * si,) + sh[a + 1:]).shrink(tuple((0, max(L * si - si + 1, 0)) if j == a else None for j in range(nd)))
    full = [(di * (k - 1) - pb, di * (k - 1) - pa + o) for di, k, (pb, pa), o in zip(d, ks, p, op)]
    x = x.pad(((0, 0), (0, 0)) + tuple(full))
    return x.conv2d(wt, bias, groups=groups, dilation=d)

  # *** pooling ***

  def _pool_args(self, name: str, kernel_size: Any, stride: Any, dilation: Any, padding: Any, ceil_mode: bool):
    n = len(kernel_size) if isinstance(kernel_size, (tuple, list)) else 2
    if self.ndim < n:
      raise ShapeError(f"{name}: input needs at least {n} dimensions for a {n}-D kernel, got shape {self.shape}")
    k = _tuple(kernel_size, n, "kernel_size")
    s = k if stride is None else _tuple(stride, n, "stride")
    d, pads = _tuple(dilation, n, "dilation"), _pads(padding, n, "padding")
    if min(k) < 1 or min(s) < 1 or min(d) < 1 or min(min(q) for q in pads) < 0:
      raise ValueError(f"{name}: bad kernel_size {kernel_size}, stride {stride}, padding {padding} or dilation {dilation}")
    full = _ceil_pads(self.shape[self.ndim - n:], k, s, d, pads) if ceil_mode else pads
    return k, s, d, pads, full

  def max_pool2d(self, kernel_size: Any = (2, 2), stride: Any = None, dilation: Any = 1, padding: Any = 0,
                 ceil_mode: bool = False, return_indices: bool = False) -> Any:
    """max_pool2d(kernel_size=(2, 2), stride=None, dilation=1, padding=0, ceil_mode=False, return_indices=False):
    max over windows of the last len(kernel_size) axes (padding counts as -inf); return_indices also gives each
    max's flat index into those axes (int32, first max wins), as torch and tinygrad. Positional order is tinygrad's.
    NaNs are skipped, as in tinygrad (a window of NaNs only gives -inf); `max()` propagates them, as numpy. One
    reduce per window, so a backward pass needs the window max and nothing else (tinygrad's kernel count)."""
    k, s, d, _, full = self._pool_args("max_pool2d", kernel_size, stride, dilation, padding, ceil_mode)
    u, taps = _windows(self, k, s, d, full, lowest(self.dtype), "max_pool2d")
    vals = self._new(u.r(Ops.MAX, taps).reshape(_drop(u.shape, taps)))
    if not return_indices: return vals
    sp = self.shape[self.ndim - len(k):]
    idx = type(self).arange(prod(sp), device=self.device).reshape(sp).expand(self.shape)
    iu, _ = _windows(idx, k, s, d, full, prod(sp), "max_pool2d")
    m = self._new(u).max(taps, keepdim=True)
    hit = self._new(u) == m
    return vals, hit.where(self._new(iu), prod(sp)).min(taps)

  def avg_pool2d(self, kernel_size: Any = (2, 2), stride: Any = None, dilation: Any = 1, padding: Any = 0,
                 ceil_mode: bool = False, count_include_pad: bool = True) -> Tensor:
    """avg_pool2d(kernel_size=(2, 2), stride=None, dilation=1, padding=0, ceil_mode=False, count_include_pad=True):
    mean over windows of the last len(kernel_size) axes; padding counts in the divisor when count_include_pad,
    the extra cells ceil_mode adds never do (torch's rule)."""
    src, out = self._half_up()
    k, s, d, pads, full = src._pool_args("avg_pool2d", kernel_size, stride, dilation, padding, ceil_mode)
    u, taps = _windows(src, k, s, d, full, 0, "avg_pool2d")
    total = self._new(u.r(Ops.ADD, taps).reshape(_drop(u.shape, taps)))
    n = len(k)
    if all(f == p for f, p in zip(full, pads)) and (count_include_pad or not any(any(p) for p in pads)):
      # every window counts all its cells (no ceil_mode cells, and padding counts or there is none): the divisor is
      # the window's size, a constant (the mean is then an epilogue of the sum, in its kernel)
      return (total / float(math.prod(k))).cast(out)
    # the divisor: ones over the cells that count (input, and padding if count_include_pad), windowed the same way
    one = type(self).ones(*self.shape[self.ndim - n:], dtype=src.dtype, device=self.device)
    if count_include_pad: one = one.pad(tuple(pads), value=1.0)
    extra = [(f[0] - (p[0] if count_include_pad else 0), f[1] - (p[1] if count_include_pad else 0)) for f, p in zip(full, pads)]
    cu, ctaps = _windows(one, k, s, d, extra, 0, "avg_pool2d")
    cnt = self._new(cu.r(Ops.ADD, ctaps).reshape(_drop(cu.shape, ctaps)))
    return (total / cnt).cast(out)

  def max_unpool2d(self, indices: Any, kernel_size: Any = (2, 2), stride: Any = None, dilation: Any = 1,
                   padding: Any = 0, output_size: Any = None) -> Tensor:
    """max_unpool2d(indices, kernel_size=(2, 2), stride=None, dilation=1, padding=0, output_size=None): put each
    value at its flat index (max_pool2d's return_indices) in a zero tensor of the pre-pool spatial size."""
    idx = self._lift(indices)
    n = len(kernel_size) if isinstance(kernel_size, (tuple, list)) else 2
    if idx.shape != self.shape: raise ShapeError(f"max_unpool2d: indices of shape {idx.shape} do not match input of shape {self.shape}")
    k = _tuple(kernel_size, n, "kernel_size")
    s = k if stride is None else _tuple(stride, n, "stride")
    d, pads = _tuple(dilation, n, "dilation"), _pads(padding, n, "padding")
    lead, sp = self.shape[:self.ndim - n], self.shape[self.ndim - n:]
    if output_size is None: osp = tuple((L - 1) * ss - pb - pa + dd * (kk - 1) + 1 for L, ss, (pb, pa), dd, kk in zip(sp, s, pads, d, k))
    else: osp = tuple(int_arg(v, "output_size") for v in tuple(output_size)[-n:])
    P, Q = prod(sp), prod(osp)
    where = idx.reshape(lead + (P, 1)) == type(self).arange(Q, device=self.device)
    return where.where(self.reshape(lead + (P, 1)), 0).sum(len(lead), dtype=self.dtype).reshape(lead + osp)

  def interpolate(self, size: Any, mode: str = "linear", align_corners: bool = False) -> Tensor:
    """interpolate(size, mode='linear', align_corners=False): resize the last len(size) axes; modes 'linear'
    (linear along each axis: bilinear, trilinear), 'nearest', 'nearest-exact', as tinygrad (and torch)."""
    if mode not in ("linear", "nearest", "nearest-exact"):
      raise ValueError(f"interpolate: only supports linear, nearest or nearest-exact, got mode={mode!r}")
    size = tuple(int_arg(v, "interpolate size") for v in size)
    if len(size) > self.ndim: raise ShapeError(f"interpolate: size {size} has more axes than shape {self.shape}")
    # the last axis first, as tinygrad and torch; an integer tensor is resized in float32 and truncated once at the
    # end (tinygrad), except uint8, which rounds each axis's result to the nearest integer (half up), as torch and
    # tinygrad do for images
    x = self if mode != "linear" or self.dtype.is_float or self.dtype is dtypes.uint8 else self.float()
    for i in reversed(range(len(size))):
      x = x._resize_axis(self.ndim - len(size) + i, size[i], mode, align_corners)
    return x.cast(self.dtype)

  def _resize_axis(self, a: int, out: int, mode: str, align_corners: bool) -> Tensor:
    """One axis resized by a (out, in) weight matrix built lazily from aranges, contracted along the axis."""
    L, T = self.shape[a], type(self)
    if out == L: return self
    o = T.arange(out, device=self.device).reshape(out, 1)
    i = T.arange(L, device=self.device).reshape(1, L)
    if mode == "nearest": w = i == (o * L) // out
    elif mode == "nearest-exact": w = i == ((2 * o + 1) * L // (2 * out)).minimum(L - 1)
    else:
      of = o.float()
      src = of * ((L - 1) / (out - 1)) if align_corners and out > 1 else \
        (of * 0.0 if align_corners else ((of + 0.5) * (L / out) - 0.5).maximum(0.0))
      i0 = src.floor().minimum(L - 1)
      frac = src - i0
      i1 = (i0 + 1).minimum(L - 1)
      fi = i.float()
      w = (fi == i0).where(1 - frac, 0.0) + (fi == i1).where(frac, 0.0)
    x = self.movedim(a, -1)
    if mode == "linear" and not self.dtype.is_float:   # uint8 (interpolate): to the nearest integer, half up
      r = ((x.float().unsqueeze(-2) * w).sum(-1) + 0.5).floor().cast(self.dtype)
    elif mode == "linear": r = (x.unsqueeze(-2) * w.cast(self.dtype)).sum(-1)
    else: r = w.where(x.unsqueeze(-2), False if self.dtype.is_bool else 0).sum(-1, dtype=self.dtype) if not self.dtype.is_bool \
      else w.where(x.unsqueeze(-2), False).any(-1)
    return r.movedim(-1, a)
