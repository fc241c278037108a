"""Autograd: backward(), gradient(), .grad and requires_grad; the gradients themselves are rules/gradient.rules,
walked by engine/autograd/driver.py.

tinygrad's model: `loss.backward()` fills `.grad` of every live float tensor the loss depends on (leaves and
intermediates), adding to what is there; `requires_grad=False` (torch's and older tinygrad's keyword) excludes a
tensor, and nothing flows through it; `detach()` stops the flow; tensors made under `no_grad` get
requires_grad=False. Gradients are lazy graphs like any other, so they fuse with the forward pass when realized.
Only float tensors have gradients."""
from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

from rulec.engine.autograd import gradients as _gradients
from rulec.engine.ir.ops import Ops
from rulec.engine.ir.rewrite import substitute
from rulec.engine import realize as _realize
from rulec.engine.tensor import inplace as _inplace
from rulec.engine.tensor.multi import is_realized as _multi_realized
from rulec.engine.tensor import writes as _writes
from rulec.engine.tensor.base import _LIVE, TensorBase
from rulec.engine.tensor.history import history, reads, recorded
from rulec.engine.tensor.inplace import old_contents
from rulec.engine.tensor.uops import bcast, const
from rulec.engine.ir.uop import UOp

if TYPE_CHECKING: from rulec.engine.tensor.tensor import Tensor


def _nodes(t: TensorBase) -> tuple[UOp, ...]:
  """The graph nodes that stand for t's value: its uop, and the graph it was realized from if it was."""
  h = history(t.uop)
  return (t.uop,) if h is None else (t.uop, h)


# .grad tensors that backward() made by adding to an earlier gradient not yet computed (by id: a WeakSet would
# compare tensors with ==, which is elementwise)
_ACCUMULATED: dict[int, weakref.ref] = {}


def _mark_accumulated(t: TensorBase) -> None:
  key = id(t)
  _ACCUMULATED[key] = weakref.ref(t, lambda _: _ACCUMULATED.pop(key, None))


def _settled(grad: TensorBase) -> TensorBase:
  """The gradient a backward() adds to. A loop that calls backward() every step without using or resetting some
  tensor's .grad (a data tensor left at requires_grad None: every float tensor in scope gets one, as in tinygrad)
  would grow that gradient's graph by a whole backward pass a step, holding every step's buffers: time and memory
  grow without bound. So a gradient that already is such a sum, still not computed, is computed now, detached
  (a .grad made by adding backward passes is not differentiated again: torch's create_graph=False), and the new
  gradient is added to its value. Nothing else changes: the intermediates computed on the way are not handed to
  other lazy values (a loss realized after opt.step() still computes from the updated weights). Not while TinyJit
  captures: the replay would compute it on every call."""
  mark = _ACCUMULATED.get(id(grad))
  if mark is None or mark() is not grad or _multi_realized(grad.uop) or _realize.CAPTURING: return grad
  return grad.detach()._realize(hand_back=False)


def _root(t: TensorBase) -> UOp:
  """The graph to differentiate for a loss t: its value, with every realized value replaced by what it was computed
  from. A loss that holds a write not carried out yet, or reads a buffer with one pending, is realized first, so
  that every graph read is a value (a write's old contents and its value) and not a buffer that is about to
  change; a buffer that still has a write pending is read through a copy (engine/tensor/inplace.py)."""
  if _inplace.unsettled(t.uop): t._realize()
  h = history(t.uop)
  return _inplace.pinned(_unrealized(t.uop if h is None else h))


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



def _shared_constant(t) -> bool:
  """t is a constant no one asked a gradient of (requires_grad None) whose node is not its own: an untagged CONST
  (a backward's seed, `x * 0` folded) is hash-consed with every equal constant of every graph, so it would "be in"
  any graph that uses that number, and take the sum of the gradients of all those uses. A constant made to be a
  leaf (Tensor.full, zeros, ones: tagged) or marked requires_grad=True still gets its gradient. (tinygrad gives one
  to such a tensor too; here it would also keep the buffers its gradient's graph reads: a previous step's
  `loss.grad`, the seed 1.0, took the next step's gradient and held a training step's intermediates.)"""
  base = t.uop.base
  return t.requires_grad is None and base.op is Ops.CONST and not (type(base.tag) is tuple and base.tag[:1] == ("leaf",))

class AutogradMixin:
  """Gradients of tensor graphs."""
  __slots__ = ()

  def _write_view(self, view: Tensor, value: Any, reads_in_place: bool = False, given: Any = None) -> None:
    """Write value through `view` (a view of this tensor's own storage) now. tinygrad's setitem is functional:
    gradients flow to the old contents and to the value, which engine/tensor/inplace.py keeps as the graph of the
    buffer's new contents when the write is carried out (here, at once), as for every other write.

    `reads_in_place` says the value reads the tensor only where the write leaves it as it was (advanced setitem's
    merge of new and old values), so the write needs no copy of the old contents for it; unless `given` (the
    value the caller was given, merged into `value`) reads the tensor too (`b[idx] = b[1:3] * y`, `b[idx] += y`)."""
    tracked = self._tracks_writes()
    if reads_in_place and isinstance(given, TensorBase) and self.uop.base.op is Ops.BUFFER:
      reads_in_place = self.uop.base.arg[0] not in reads(given.uop)
    if isinstance(value, TensorBase) and value.uop.op is Ops.ASSIGN and value.uop.src[0] is view.uop:
      # `b[i] += x`: Python calls setitem with what `b[i].__iadd__(x)` returned, which holds that very write
      _writes.note(value.uop, tracked)
      value._realize()
      return
    view.assign(value)
    _writes.note(view.uop, tracked, reads_in_place)
    view._realize()

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
    scalar); returns self. A .grad that backward() already added to and nobody computed since is computed (detached)
    before the next is added, so a loop that never reads or resets some tensor's .grad keeps it bounded."""
    seed = self._seed(gradient, "backward()")
    root = _root(self)
    graph = set(root.toposort())
    targets = [t for t in list(_LIVE) if t.dtype.is_float and t.requires_grad is not False
               and not _shared_constant(t) and any(n in graph for n in _nodes(t))]
    grads = _gradients(root, seed, [n for t in targets for n in _nodes(t)], _stops())
    for t in targets:
      parts = [grads[n] for n in _nodes(t) if n in grads]
      if not parts: continue
      g = parts[0] if len(parts) == 1 else parts[0] + parts[1]
      gt = t._grad_tensor(g)
      if t.grad is None: t.grad = gt
      else:
        t.grad = _settled(t.grad) + gt
        _mark_accumulated(t.grad)
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
