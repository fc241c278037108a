"""Autograd: backward(), gradient(), .grad and requires_grad; the gradients themselves are rules/gradient.rules,
walked by engine/autograd/driver.py.

tinygrad's model: `loss.backward()` fills `.grad` of every live float tensor the loss depends on (leaves and
intermediates), adding to what is there; `requires_grad=False` (torch's and older tinygrad's keyword) excludes a
tensor, and nothing flows through it; `detach()` stops the flow; tensors made under `no_grad` get
requires_grad=False. Gradients are lazy graphs like any other, so they fuse with the forward pass when realized.
Only float tensors have gradients."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from engine.autograd import gradients as _gradients
from engine.ops import Ops
from engine.rewrite import substitute
from engine.tensor.base import _LIVE, TensorBase
from engine.tensor.uops import bcast, const
from engine.uop import UOp

if TYPE_CHECKING: from engine.tensor.tensor import Tensor


def _nodes(t: TensorBase) -> tuple[UOp, ...]:
  """The graph nodes that stand for t's value: its uop, and the graph it was realized from if it was."""
  return (t.uop,) if t._forward is None else (t.uop, t._forward)


def _root(t: TensorBase) -> UOp: return _unrealized(t._forward if t._forward is not None else t.uop)


def _unrealized(root: UOp) -> UOp:
  """root with each realized tensor's buffer replaced by the graph it was computed from (while that buffer holds
  what the graph computed: an assign into it drops the graph), so gradients flow through values realized
  before the loss was built (`z = x.exp().realize(); (z * x).sum().backward()`)."""
  back = {t.uop: t._forward for t in list(_LIVE) if t._forward is not None and t.uop is not t._forward}
  for _ in range(len(back) + 1):
    new = substitute(root, back)
    if new is root: break
    root = new
  return root


def _stops() -> set[UOp]:
  return {n for t in list(_LIVE) if t.requires_grad is False for n in _nodes(t)}


class AutogradMixin:
  """Gradients of tensor graphs."""
  __slots__ = ()

  def requires_grad_(self, requires_grad: bool = True) -> Tensor:
    """Mark this tensor as needing a gradient (True) or as a constant for autograd (False); returns self."""
    self.requires_grad = bool(requires_grad)
    return self

  def _seed(self, gradient: Any, call: str) -> UOp:
    if type(self).no_grad: raise RuntimeError(f"{call} with Tensor.no_grad set: gradients are switched off")
    if not self.dtype.is_float:
      raise RuntimeError(f"only float Tensors have gradient: {call} of a {self.dtype.name} tensor")
    if self.requires_grad is False: raise RuntimeError(f"{call} of a tensor with requires_grad=False")
    if gradient is None:
      if self.numel() != 1:
        raise RuntimeError(f"{call} without a gradient needs a scalar, got shape {self.shape}; pass gradient= "
                           "(the gradient of the result, of the same shape)")
      return bcast(const(1.0, self.dtype, ()), self.shape)
    g = self._lift(gradient)
    if g.shape != self.shape:
      raise RuntimeError(f"{call}: the gradient has shape {g.shape}, the tensor {self.shape}")
    return g.uop.cast(self.dtype)

  def backward(self, gradient: Any = None) -> Tensor:
    """Add d self / d t to `t.grad` for every float tensor t that self depends on (seed: `gradient`, or 1 for a
    scalar); returns self."""
    seed = self._seed(gradient, "backward()")
    root = _root(self)
    graph = set(root.toposort())
    targets = [t for t in list(_LIVE) if t.dtype.is_float and t.requires_grad is not False
               and any(n in graph for n in _nodes(t))]
    grads = _gradients(root, seed, [n for t in targets for n in _nodes(t)], _stops())
    for t in targets:
      parts = [grads[n] for n in _nodes(t) if n in grads]
      if not parts: continue
      g = parts[0] if len(parts) == 1 else parts[0] + parts[1]
      gt = t._grad_tensor(g)
      t.grad = gt if t.grad is None else t.grad + gt
    return self

  def gradient(self, *targets: Tensor, gradient: Any = None) -> list[Tensor]:
    """d self / d target for each target, without touching `.grad` (zeros for a target self does not depend on)."""
    for t in targets:
      if not isinstance(t, TensorBase): raise TypeError(f"gradient() takes Tensors, got {type(t).__name__}")
      if not t.dtype.is_float: raise RuntimeError(f"only float Tensors have gradient: a target is {t.dtype.name}")
    seed = self._seed(gradient, "gradient()")
    grads = _gradients(_root(self), seed, [n for t in targets for n in _nodes(t)], _stops())
    out = []
    for t in targets:
      parts = [grads[n] for n in _nodes(t) if n in grads]
      if not parts: out.append(t.zeros_like()); continue
      out.append(t._grad_tensor(parts[0] if len(parts) == 1 else parts[0] + parts[1]))
    return out

  def _grad_tensor(self, g: UOp) -> Tensor:
    """A gradient graph as a tensor on this tensor's device."""
    dev = g.device
    if dev is not None and dev != self.device: g = UOp(Ops.COPY, g.dtype, (g,), self.device)
    return self._new(g)


class no_grad:
  """`with no_grad():` (torch's spelling): tensors made inside get requires_grad=False, and backward() refuses."""
  def __init__(self, cls: type | None = None): self.cls = cls

  def __enter__(self):
    from engine.tensor.tensor import Tensor
    self.cls = self.cls or Tensor
    self.prev, self.cls.no_grad = self.cls.no_grad, True
    return self

  def __exit__(self, *exc): self.cls.no_grad = self.prev
