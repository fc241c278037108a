"""Autograd: backward(), gradient(), .grad and requires_grad; the gradients themselves are rules/gradient.rules,
walked by engine/autograd/driver.py.

tinygrad's model: `loss.backward()` fills `.grad` of every live float tensor the loss depends on (leaves and
intermediates), adding to what is there; `requires_grad=False` (torch's and older tinygrad's keyword) excludes a
tensor, and nothing flows through it; `detach()` stops the flow; tensors made under `no_grad` get
requires_grad=False. Gradients are lazy graphs like any other, so they fuse with the forward pass when realized.
Only float tensors have gradients."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rulec.engine.autograd import gradients as _gradients
from rulec.engine.ir.ops import Ops
from rulec.engine.ir.rewrite import substitute
from rulec.engine.tensor.base import _LIVE, TensorBase
from rulec.engine.tensor.history import history, reads, record, recorded
from rulec.engine.tensor.uops import bcast, const
from rulec.engine.ir.uop import UOp

if TYPE_CHECKING: from rulec.engine.tensor.tensor import Tensor


def _nodes(t: TensorBase) -> tuple[UOp, ...]:
  """The graph nodes that stand for t's value: its uop, and the graph it was realized from if it was."""
  h = history(t.uop)
  return (t.uop,) if h is None else (t.uop, h)


def _root(t: TensorBase) -> UOp:
  h = history(t.uop)
  return _unrealized(t.uop if h is None else h)


def _unrealized(root: UOp) -> UOp:
  """root with each realized value replaced by the graph it was computed from (engine/tensor/history.py), and
  so on down, so gradients flow through values realized before the loss was built.

  Each history is expanded once, after the histories it reads (a chain of realized steps is linear work, not
  a pass over the whole graph per step). A graph left by a write through a view reads its own buffer's old
  contents as `old_contents(node)`: that read stays the buffer, or the graph would contain itself."""
  found = recorded(root.toposort())
  if not found: return root
  deps: dict[UOp, list[UOp]] = {}
  todo = list(found)
  while todo:
    n = todo.pop()
    if n in deps: continue
    own = old_contents(n)
    inner = recorded(found[n].toposort(lambda m: m is not own))
    found.update(inner)
    deps[n] = [m for m in inner if m is not n]
    todo.extend(m for m in deps[n] if m not in deps)
  expanded: dict[UOp, UOp] = {}
  opened: set[UOp] = set()   # (a cycle cannot arise, since a write drops the histories that read it; if one did,
  for start in list(found):  # it is cut, not followed forever) depth-first, each history after the ones it reads
    stack = [(start, False)]
    while stack:
      n, ready = stack.pop()
      if n in expanded: continue
      if not ready:
        if n in opened: continue
        opened.add(n)
        stack.append((n, True))
        stack.extend((m, False) for m in deps[n] if m not in expanded)
        continue
      mapping = {m: expanded[m] for m in deps[n] if m in expanded}
      mapping[old_contents(n)] = old_contents(n)
      expanded[n] = substitute(found[n], mapping)
  return substitute(root, expanded)


def _stops() -> set[UOp]:
  return {n for t in list(_LIVE) if t.requires_grad is False for n in _nodes(t)}


def old_contents(u: UOp) -> UOp:
  """A realized tensor's buffer as a constant for autograd: what it held before a write through a view, read only
  where that write (and every write since) did not reach."""
  return UOp(Ops.DETACH, u.dtype, (u,))


def _reads(graph: UOp, u: UOp) -> bool:
  """graph reads u: u's buffer (through any view of it), or u itself for a node that is not storage."""
  if u.base.op is Ops.BUFFER and u.op is not Ops.DETACH: return u.base.arg[0] in reads(graph)
  return any(n is u for n in graph.toposort())


def written_history(whole: UOp, target: UOp, value: UOp, old: UOp) -> UOp | None:
  """The graph of a tensor's contents after `value` was written into it through `target` (a view of `whole`,
  the tensor's own whole buffer): `old` (the graph of its contents before) where the view does not reach, value
  where it does; the value's reads of the tensor are reads of `old`. The view's footprint and the placed value
  are the view's gradient (its adjoint) applied to ones and to value, so every view the indexing front end
  builds is handled by the movement rules of rules/gradient.rules."""
  value = substitute(value, {whole: old})
  base = whole.base
  stand = UOp.new_buffer(base.arg[1], base.arg[2], base.dtype)   # a placeholder for the buffer (no storage)
  view = substitute(target, {base: stand})
  placed = _gradients(view, value, [stand]).get(stand)
  hit = _gradients(view, bcast(const(1.0, value.dtype, ()), value.shape), [stand]).get(stand)
  if placed is None or hit is None: return None
  shape = whole.shape
  return hit.reshape(shape).ne(0.0).where(placed.reshape(shape), old)


class AutogradMixin:
  """Gradients of tensor graphs."""
  __slots__ = ()

  def _write_view(self, view: Tensor, value: Any, reads_in_place: bool = False) -> None:
    """Write value through `view` (a view of this tensor's own storage) now, and keep, for autograd, the graph of
    this tensor's new contents: tinygrad's setitem is functional, so gradients flow to the old contents and to
    the value.

    The old contents are the graph the tensor held, or for a leaf its buffer (DETACH) outside the view, which
    the write leaves alone. A value that reads a leaf's buffer where a write lands (`y[0:2] = y[1:3] * w`)
    would read new contents when the history is evaluated, so it reads a copy made before the write instead;
    `reads_in_place` says the value reads the tensor only where it leaves it as it was (advanced setitem's
    merge of new and old values), which needs no copy."""
    whole = self.uop
    tracked = (self.dtype.is_float and not type(self).no_grad and self.requires_grad is not False
               and (whole.op is Ops.BUFFER or (whole.op is Ops.RESHAPE and whole.src[0].op is Ops.BUFFER)))
    old = self._forward
    snap = None
    if tracked:
      stale = old_contents(whole)
      if old is None: old = stale
      # (the copy is made before the write is recorded: realizing it would carry a recorded write out)
      if not reads_in_place and isinstance(value, type(self)) and _reads(value.uop, whole) and _reads(old, stale):
        snap = self.clone().realize()
        snap._forward = None   # (a constant: its graph reads the buffer this write changes)
    view.assign(value)
    target, written = view.uop.src
    if snap is not None: written = substitute(written, {whole: substitute(old, {stale: snap.uop})})
    view.realize()
    record(self.uop, written_history(whole, target, written, old) if tracked else None, rewritten=True)

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
