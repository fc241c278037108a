"""Linear algebra and neural-network building blocks: matmul, softmax, layernorm, conv2d, pooling."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from engine.ops import Ops
from engine.tensor.args import (broadcast_shapes, int_arg,
                                lowest, norm_axes, norm_axis, pair_arg, promote_types)
from engine.tensor.uops import (alu, bcast, u_max_reduce, window)
from engine.tensor.base import TensorBase
from engine.uop import UOp

if TYPE_CHECKING: from engine.tensor.tensor import Tensor


class NNMixin:
  """matmul and the neural-network functions."""
  __slots__ = ()


  def matmul(self, other: Any) -> Tensor:
    """numpy's matmul: 1-D operands gain and lose an axis; batch axes broadcast."""
    return self._matmul(self, self._lift(other))

  @staticmethod
  def _matmul(a: Tensor, b: Tensor) -> Tensor:
    a._same_device(b)
    sa, sb = a.shape, b.shape
    if a.ndim == 0 or b.ndim == 0:
      raise ValueError(f"matmul needs operands with at least 1 dimension, got shapes {sa} and {sb}")
    dt = promote_types(a.dtype, b.dtype)
    au, bu = a.uop.cast(dt), b.uop.cast(dt)
    if a.ndim == 1: au = au.reshape((1,) + sa)
    if b.ndim == 1: bu = bu.reshape(sb + (1,))
    (n, k), (k2, m) = au.shape[-2:], bu.shape[-2:]
    if k != k2: raise ValueError(f"matmul: shapes {sa} and {sb} do not align ({k} != {k2})")
    try: batch = broadcast_shapes(au.shape[:-2], bu.shape[:-2])
    except ValueError: raise ValueError(f"matmul: batch axes of shapes {sa} and {sb} cannot be broadcast together") from None
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

  def dot(self, other: Any) -> Tensor: return self.matmul(other)

  def softmax(self, axis: int = -1) -> Tensor:
    x, out = self._half_up()
    ax = norm_axis(axis, self.ndim)
    m = self._new(x._reduce(Ops.MAX, ax, True, numpy_nan=False))  # (a NaN makes the whole slice NaN anyway)
    e = (x - m).exp()
    return (e / e.sum(ax, keepdim=True)).cast(out)

  def log_softmax(self, axis: int = -1) -> Tensor:
    x, out = self._half_up()
    ax = norm_axis(axis, self.ndim)
    s = x - self._new(x._reduce(Ops.MAX, ax, True, numpy_nan=False))
    return (s - s.exp().sum(ax, keepdim=True).log()).cast(out)

  def layernorm(self, axis: Any = -1, eps: float = 1e-5, weight: Any = None, bias: Any = None) -> Tensor:
    """(x - mean) / sqrt(var + eps) over axis, then * weight + bias when given."""
    x, out = self._half_up()
    norm_axes(axis, self.ndim)
    d = x - x.mean(axis, keepdim=True)
    r = (d * (d.square().mean(axis, keepdim=True) + eps).rsqrt()).cast(out)
    if weight is not None: r = r * weight
    if bias is not None: r = r + bias
    return r

  def conv2d(self, weight: Tensor, bias: Tensor | None = None, stride: Any = 1, padding: Any = 0, dilation: Any = 1,
             groups: int = 1) -> Tensor:
    """2-D convolution (cross-correlation) of NCHW input with OIHW weights (O, C/groups, kh, kw)."""
    w = self._lift(weight)
    self._same_device(w)
    if self.ndim != 4: raise ValueError(f"conv2d: input must be 4-D (N, C, H, W), got shape {self.shape}")
    if w.ndim != 4: raise ValueError(f"conv2d: weight must be 4-D (O, C, kh, kw), got shape {w.shape}")
    (sh, sw), (ph, pw), (dh, dw) = pair_arg(stride, "stride"), pair_arg(padding, "padding"), pair_arg(dilation, "dilation")
    groups = int_arg(groups, "groups")
    if min(sh, sw) < 1 or min(dh, dw) < 1 or min(ph, pw) < 0 or groups < 1:
      raise ValueError(f"conv2d: bad stride {stride}, padding {padding}, dilation {dilation} or groups {groups}")
    N, C, H, W = self.shape
    O, Cg, kh, kw = w.shape
    if C != Cg * groups:
      raise ValueError(f"conv2d: input has {C} channels (shape {self.shape}) but weight of shape {w.shape} with "
                       f"groups={groups} expects {Cg * groups}")
    if O % groups: raise ValueError(f"conv2d: {O} output channels (weight shape {w.shape}) do not split into {groups} groups")
    if kh < 1 or kw < 1: raise ValueError(f"conv2d: empty kernel in weight shape {w.shape}")
    Hp, Wp = H + 2 * ph, W + 2 * pw
    if Hp < (kh - 1) * dh + 1 or Wp < (kw - 1) * dw + 1:
      raise ValueError(f"conv2d: kernel {(kh, kw)} (dilation {(dh, dw)}) is larger than the padded input {(Hp, Wp)}")
    b = None
    if bias is not None:
      b = self._lift(bias)
      if b.shape != (O,): raise ValueError(f"conv2d: bias must have shape ({O},), got {b.shape}")
    dt = promote_types(self.dtype, w.dtype)
    x = self.uop.cast(dt).pad(((0, 0), (0, 0), (ph, ph), (pw, pw)))
    x = window(window(x, 2, kh, sh, dh), 4, kw, sw, dw)  # (N, C, Oh, kh, Ow, kw)
    Oh, Ow = x.shape[2], x.shape[4]
    G, Og = groups, O // groups
    full = (N, G, Og, Cg, Oh, kh, Ow, kw)
    x = x.reshape((N, G, 1, Cg, Oh, kh, Ow, kw)).expand(full)
    wu = w.uop.cast(dt).reshape((1, G, Og, Cg, 1, kh, 1, kw)).expand(full)
    r = alu(Ops.AND if dt.is_bool else Ops.MUL, x, wu).r(Ops.ADD, (3, 5, 7)).reshape((N, O, Oh, Ow))
    out = self._new(r)
    return out if b is None else out + b.reshape(1, O, 1, 1)

  def _pool(self, name: str, kernel_size: Any, stride: Any, padding: Any, dilation: Any, fill: Any) -> tuple[UOp, tuple]:
    if self.ndim < 2: raise ValueError(f"{name}: input needs at least 2 dimensions, got shape {self.shape}")
    k = pair_arg(kernel_size, "kernel_size")
    s = k if stride is None else pair_arg(stride, "stride")
    p, d = pair_arg(padding, "padding"), pair_arg(dilation, "dilation")
    if min(k) < 1 or min(s) < 1 or min(p) < 0 or min(d) < 1:
      raise ValueError(f"{name}: bad kernel_size {kernel_size}, stride {stride}, padding {padding} or dilation {dilation}")
    H, W = self.shape[-2:]
    if H + 2 * p[0] < (k[0] - 1) * d[0] + 1 or W + 2 * p[1] < (k[1] - 1) * d[1] + 1:
      raise ValueError(f"{name}: kernel {k} is larger than the padded input {(H + 2 * p[0], W + 2 * p[1])} (shape {self.shape})")
    nd = self.ndim
    x = self.pad(((0, 0),) * (nd - 2) + ((p[0], p[0]), (p[1], p[1])), value=fill).uop
    x = window(window(x, nd - 2, k[0], s[0], d[0]), nd, k[1], s[1], d[1])  # (..., Oh, kh, Ow, kw)
    return x, (nd - 1, nd + 1)

  def max_pool2d(self, kernel_size: Any = 2, stride: Any = None, padding: Any = 0, dilation: Any = 1) -> Tensor:
    """Max over kernel windows of the last two axes; padding counts as -inf (the dtype's lowest value)."""
    x, axes = self._pool("max_pool2d", kernel_size, stride, padding, dilation, lowest(self.dtype))
    sh = x.shape
    return self._new(u_max_reduce(x, axes).reshape(tuple(d for i, d in enumerate(sh) if i not in axes)))

  def avg_pool2d(self, kernel_size: Any = 2, stride: Any = None, padding: Any = 0) -> Tensor:
    """Mean over kernel windows of the last two axes; zero padding is counted (torch's default)."""
    src, out = self._half_up()
    x, axes = src._pool("avg_pool2d", kernel_size, stride, padding, 1, 0)
    sh = x.shape
    s = x.r(Ops.ADD, axes).reshape(tuple(d for i, d in enumerate(sh) if i not in axes))
    return (self._new(s) / (sh[axes[0]] * sh[axes[1]])).cast(out)

  # *** dtype shorthands (last: their names shadow builtins inside the class body) ***
