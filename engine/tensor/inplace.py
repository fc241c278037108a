"""Gradients through in-place writes: the graph of what a written buffer holds, kept for autograd.

`b += y`, `b *= y`, `b.assign(x)`, `b[1:] += y[1:]`, `b[i] = v` write into b's buffer when they are carried out
(engine/tensor/writes.py says when). From then on the buffer holds a new value and its old one is gone, but a
gradient must read every value as it was when it was used: the new contents are `y` plus the OLD contents, and a
value realized before the write from b (its history, engine/tensor/history.py) was computed from the old
contents too. So, for a write that takes part in autograd (a float tensor outside no_grad, with requires_grad
not False and no `.grad`: TensorBase._tracks_writes, noted by engine/tensor/writes.py's `note`):

- `plan()`, before the realize that carries the write out, finds what will still need the old contents: the
  written value when it reads the buffer, a history that reads the buffer, a value realized in the same call that
  reads it. When the old contents have no graph that computes them without the buffer (a leaf; or a buffer whose
  history reads its own contents outside earlier writes), a copy of the buffer is realized in the same call, which
  reads it before the write as every value of one call does.
- `Plan.history(graph)` is the history of a value realized in that call: its ASSIGN nodes become the values
  they wrote and its reads of a written buffer read the old contents (`as_history`).
- `Plan.settle()`, after it: the buffer's history becomes the written value (a write of the whole buffer) or
  `where(footprint, value, old contents)` (a write through a view, `written_history`), its reads of the buffer
  being the old contents; every other history that reads the buffer reads the old contents instead.
- before a gradient is taken (engine/tensor/autograd.py's `_root`), a loss that holds a write not yet carried out,
  or reads a buffer with one pending, is realized first (`unsettled`), so the gradient is built from graphs of
  values rather than from buffers about to change; a buffer that the gradient reads and that still has a write
  pending is read through a copy (`pinned`).

A write that does not take part (no_grad, integers, requires_grad=False, a parameter update, a device set) drops
the histories of its buffer and of what reads it, as before: its new value is a constant for autograd. So does a
write whose value reads a buffer such a write changes in the same realize (an optimizer's state read from the
gradients of the parameters it updates), and a realize that carries out two writes into one buffer at once (the
front end makes them one at a time)."""
from __future__ import annotations

from rulec.engine import realize as _engine
from rulec.engine.autograd import gradients as _gradients
from rulec.engine.ir.ops import Ops
from rulec.engine.ir.rewrite import substitute
from rulec.engine.tensor import history as _history
from rulec.engine.tensor import writes as _writes
from rulec.engine.tensor.uops import bcast, const
from rulec.engine.ir.uop import UOp


def old_contents(u: UOp) -> UOp:
  """A realized tensor's buffer as a constant for autograd: what it held before a write through a view, read only
  where that write (and every write since) did not reach."""
  return UOp(Ops.DETACH, u.dtype, (u,))


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


def as_history(graph: UOp, olds: dict[UOp, UOp]) -> UOp:
  """`graph` as a history: each ASSIGN is the value it writes (a history must compute a value, never write one
  again), and each BUFFER in `olds` (written by the realize that computed graph) reads its old contents."""
  done: dict[UOp, UOp] = {}
  for u in graph.toposort():
    if u.op is Ops.ASSIGN: done[u] = done[u.src[1]]; continue
    if u in olds: done[u] = olds[u]; continue
    src = tuple(done[s] for s in u.src)
    done[u] = u if all(a is b for a, b in zip(u.src, src)) else UOp(u.op, u.dtype, src, u.arg, u.tag)
  return done[graph]


def _whole(target: UOp) -> UOp:
  """The whole buffer in the shape its tensor holds it (the node a history is kept under) below a view of it."""
  x = target
  while x.op is not Ops.BUFFER:
    if x.op is Ops.RESHAPE and x.src[0].op is Ops.BUFFER: return x
    x = x.src[0]
  return x


def _reads_outside_targets(u: UOp, buf: UOp) -> bool:
  """u reads `buf` other than as the target of an ASSIGN (which writes it)."""
  seen: set[int] = set()
  stack = [u]
  while stack:
    n = stack.pop()
    if id(n) in seen: continue
    seen.add(id(n))
    if n is buf: return True
    stack.extend(n.src[1:] if n.op is Ops.ASSIGN else n.src)
  return False


class Plan:
  """The tracked writes one realize carries out, and the copies of old contents it must take with them."""
  __slots__ = ("writes", "untracked", "snaps", "olds")

  def __init__(self):
    self.writes: list[tuple[UOp, UOp, UOp, UOp | None, bool]] = []   # (ASSIGN, BUFFER, whole, old graph, in place)
    self.untracked: set[UOp] = set()     # buffers written by writes that keep no history
    self.snaps: dict[UOp, UOp] = {}      # BUFFER -> the copy of its contents to realize with the write
    self.olds: dict[UOp, UOp] = {}       # BUFFER -> its old contents as a graph that does not read it (flat)

  def extra(self) -> tuple[list[UOp], list[str]]:
    """The copies to realize in the same call as the writes, and their devices."""
    return list(self.snaps.values()), [b.arg[1] for b in self.snaps]

  def realized(self, done: dict[UOp, UOp]) -> None:
    """After the call: each written buffer's old contents, from its old graph or from the copy, as a graph that
    reads no buffer written in the call (an old graph reads the other buffers as they were: their old contents)."""
    for _, buf, whole, old, _ in self.writes:
      snap = done.get(self.snaps[buf]) if buf in self.snaps else None
      flat = None if snap is None else snap.reshape(buf.shape)
      if old is None: closed = snap
      elif buf.arg[0] in _history.reads(old): closed = None if flat is None else substitute(old, {buf: flat})
      else: closed = old
      if closed is not None: self.olds[buf] = closed.reshape(buf.shape)
    for _ in range(len(self.olds)):   # (each old graph was recorded after the ones it reads: no cycle)
      ids = {b.arg[0] for b in self.olds}
      if all(ids.isdisjoint(_history.reads(o)) for o in self.olds.values()): break
      self.olds = {b: self._others(o, b) for b, o in self.olds.items()}

  def _others(self, graph: UOp, buf: UOp | None = None) -> UOp:
    """graph with its reads of the buffers written in the call, other than buf, reading their old contents."""
    return as_history(graph, {b: o for b, o in self.olds.items() if b is not buf})

  def history(self, graph: UOp) -> UOp:
    """The history of a value realized in this call (from the buffers as they were before its writes)."""
    return as_history(graph, self.olds)

  def settle(self, written: set[UOp], parts) -> None:
    """After the call carried out the writes into `written`: the histories of the tracked ones, and every history
    that read one of them reads the old contents; the untracked ones drop the histories, as before."""
    tracked = {buf for _, buf, *_ in self.writes}
    dropped = written - tracked
    if dropped: _history.forget_written(dropped, parts)
    if not tracked & written: return
    gone = {b.arg[0] for b in dropped}
    new: list[tuple[UOp, UOp | None]] = []
    for write, buf, whole, old, in_place in self.writes:
      if buf not in written: continue
      target, value = write.src
      # where no write since reached, the old contents: its old graph, or the buffer itself as a constant
      outside = self._others(old, buf) if old is not None else old_contents(whole)
      if in_place:   # (it reads the buffer only where this write leaves it as it was: no copy was needed)
        value = substitute(self._others(value, buf), {buf: outside.reshape(buf.shape)})
      else: value = self.history(value)
      h = value if target is whole else written_history(whole, target, value, outside)
      # (a history that reads a buffer written with no history kept would see its new contents)
      new.append((whole, None if h is None or not gone.isdisjoint(_history.reads(h)) else h))
    _history.forget_written(tracked & written, parts, readers=False)
    _history.rewrite_readers({b.arg[0] for b in tracked & written}, self.history)
    for whole, h in new: _history.record(whole, h, rewritten=True)


def plan(uops: list[UOp]) -> Plan | None:
  """What realizing `uops` must do for the tracked writes among them (None: they hold no write)."""
  nodes = UOp.sink(*uops).toposort()
  assigns = [a for a in nodes if a.op is Ops.ASSIGN and a.src[0].base.op is Ops.BUFFER]
  if not assigns: return None
  p = Plan()
  count: dict[UOp, int] = {}
  for a in assigns: count[a.src[0].base] = count.get(a.src[0].base, 0) + 1
  for a in assigns:
    if _writes.noted(a) is None or count[a.src[0].base] > 1: p.untracked.add(a.src[0].base)
  while True:   # a value that reads a buffer written with no history kept would read its new contents: none either
    more = {a.src[0].base for a in assigns if a.src[0].base not in p.untracked
            and not {b.arg[0] for b in p.untracked}.isdisjoint(_history.reads(a.src[1]))}
    if not more: break
    p.untracked |= more
  for a in assigns:
    buf = a.src[0].base
    in_place = _writes.noted(a)
    if buf in p.untracked: continue
    whole = _whole(a.src[0])
    old = _history.history(whole)
    if old is None and whole is not buf and (flat := _history.history(buf)) is not None: old = flat.reshape(whole.shape)
    p.writes.append((a, buf, whole, old, in_place))
    if old is not None and buf.arg[0] not in _history.reads(old): continue   # the old contents have their graph
    if ((not in_place and buf.arg[0] in _history.reads(a.src[1])) or _history.read_elsewhere(buf)
        or any(_reads_outside_targets(u, buf) for u in uops if u is not a)):
      p.snaps[buf] = UOp(Ops.CONTIGUOUS, whole.dtype, (whole,), tag="copy")
  return p


def unsettled(u: UOp) -> bool:
  """u holds a write not yet carried out, or reads a buffer with a write pending."""
  return any(n.op is Ops.ASSIGN or (n.op is Ops.BUFFER and _writes.pending_on(n)) for n in u.toposort())


def pinned(root: UOp) -> UOp:
  """root with every buffer that has a write pending read through a copy of what it holds now (a gradient
  realized after that write must still see the contents the loss saw). No pending write is carried out."""
  ids = _history.reads(root)
  bufs = [b for b in _writes.pending_buffers() if b.arg[0] in ids]
  if not bufs: return root
  copies = [UOp(Ops.CONTIGUOUS, b.dtype, (b,), tag="copy") for b in bufs]
  done = _engine.realize_map(copies, [b.arg[1] for b in bufs])
  return substitute(root, {b: done[c].reshape(b.shape) for b, c in zip(bufs, copies)})

