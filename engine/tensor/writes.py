"""Writes through views that are waiting to be carried out.

`b[1:2].assign(x)` is lazy, and the tensor holding the write may never be realized itself. As in tinygrad, the
write is still seen: whenever a realize reads a buffer, the writes pending on that buffer are carried out first,
each in the order it was made. Carrying out a write is itself a realize, so its value sees the writes pending on
the buffers it reads (`a[0:1].assign(b[1:2]); b[1:2].assign(z)` then `a.numpy()` gives a row of z, as tinygrad).

A write of the whole buffer in its own shape (`b.assign(x)`, `b[:].assign(x)`) is held apart: a tensor that is
that buffer shows it when realized, and other lazy readers see the old contents until it is carried out
(tinygrad again).

This module only keeps the record (with, for each write, whether it takes part in autograd: `note`) and works out
the order; engine/tensor/base.py runs the writes, engine/tensor/inplace.py keeps their histories."""
from __future__ import annotations

import weakref

from rulec.engine.ir.ops import Ops
from rulec.engine.sched.early import is_buffer_view
from rulec.engine.ir.uop import UOp

# BUFFER -> the writes through its views not yet carried out, oldest first
_PENDING: dict[UOp, list[UOp]] = {}
# BUFFER -> (the whole buffer in its own shape, a write of all of it not yet carried out)
_WHOLE: dict[UOp, tuple[UOp, UOp]] = {}


# the writes that take part in autograd (engine/tensor/inplace.py): ASSIGN -> whether its value reads the written
# tensor only where the write leaves it as it was (advanced setitem's merge). Weak: a write nothing holds any more
# leaves no entry behind
_NOTED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def note(write: UOp, tracked: bool, reads_in_place: bool = False) -> None:
  """Whether `write` (an ASSIGN just made) takes part in autograd: its buffer's history is kept when it is carried
  out (engine/tensor/inplace.py). A write not noted keeps none."""
  if tracked and write.dtype.is_float: _NOTED[write] = reads_in_place
  else: _NOTED.pop(write, None)


def noted(write: UOp) -> bool | None:
  """None for a write that keeps no history; else whether its value reads its tensor only where it is unchanged."""
  return _NOTED.get(write)


def substitute(sink: UOp, mapping: dict[UOp, UOp]) -> UOp:
  """engine/ir/rewrite.py's substitute, keeping the note of every noted ASSIGN it rebuilds (a pending write whose
  value held a write just carried out is a new node for the same write)."""
  done: dict[UOp, UOp] = {}
  for u in sink.toposort():
    if u in mapping: done[u] = mapping[u]; continue
    new_src = tuple(done[s] for s in u.src)
    if all(a is b for a, b in zip(u.src, new_src)): done[u] = u; continue
    done[u] = UOp(u.op, u.dtype, new_src, u.arg, u.tag)
    if u.op is Ops.ASSIGN and u in _NOTED: _NOTED[done[u]] = _NOTED[u]
  return done[sink]


def pending_on(buf: UOp) -> bool:
  """A write into `buf` (a BUFFER) is waiting to be carried out."""
  return buf in _PENDING or buf in _WHOLE


def pending_buffers() -> list[UOp]:
  """The buffers with a write waiting."""
  return list(_PENDING) + [b for b in _WHOLE if b not in _PENDING]


def record(write: UOp) -> None:
  """Note a lazy ASSIGN whose target is a view of a buffer (engine/tensor/base.py has carried out `first(write)`)."""
  target = write.src[0]
  if is_buffer_view(target): _WHOLE[target.base] = (target, write)
  else: _PENDING.setdefault(target.base, []).append(write)


def whole(u: UOp) -> UOp | None:
  """The whole-buffer write waiting on u, if u is the buffer it writes in its own shape: a tensor that is that
  buffer (`b`, `b[:]`, `b.contiguous()`) shows the write when it is realized; other readers do not (tinygrad)."""
  if not _WHOLE or u.op not in (Ops.BUFFER, Ops.RESHAPE): return None
  target, write = _WHOLE.get(u.base, (None, None))
  return write if target is u else None


def first(write: UOp) -> list[UOp]:
  """What to carry out before `write` is recorded: a whole-buffer write waiting on its buffer (it came first),
  and everything waiting on it if the same write is already waiting (one node: UOps are hash-consed)."""
  buf = write.src[0].base
  out = [_WHOLE[buf][1]] if buf in _WHOLE else []
  if write in _PENDING.get(buf, ()): out += [w for w in before([write.src[0]]) if w not in out]
  return out


def carried_out(assigned: dict[UOp, UOp]) -> None:
  """After a realize: the writes it carried out are no longer pending, and a pending write whose graph holds one
  of them reads the buffer it wrote instead (so no write is carried out twice)."""
  for b in [b for b, (_, w) in _WHOLE.items() if w in assigned]: del _WHOLE[b]
  for buf in list(_PENDING):
    kept = [substitute(w, assigned) for w in _PENDING[buf] if w not in assigned]
    if kept: _PENDING[buf] = kept
    else: del _PENDING[buf]


def _buffers_read(u: UOp) -> list[UOp]:
  return [n for n in u.toposort() if n.op is Ops.BUFFER]


def _together(roots: list[UOp], own: set[UOp], read: list[UOp]) -> bool:
  """Whether one realize may carry out the writes pending on `read`: each of those buffers has at most one, it is
  one of the graphs' own ASSIGN nodes, and nothing else reads its buffer except through that node (in one
  realize, values read the buffers as they were before its writes)."""
  mine: dict[UOp, UOp] = {}
  for b in read:
    ws = _PENDING.get(b, ())
    if len(ws) > 1 or any(w not in own for w in ws): return False
    if ws: mine[b] = ws[0]
  for w in mine.values():
    if any(b in mine and mine[b] is not w for b in _direct_reads(w.src[1])): return False
  return not any(b in mine for u in roots for b in _direct_reads(u))


def _direct_reads(u: UOp) -> set[UOp]:
  """The buffers `u` reads other than through an ASSIGN's result."""
  out, seen, stack = set(), set(), [u]
  while stack:
    n = stack.pop()
    if n in seen: continue
    seen.add(n)
    if n.op is Ops.BUFFER: out.add(n)
    elif n.op is not Ops.ASSIGN: stack.extend(n.src)
  return out


def before(uops: list[UOp]) -> list[UOp]:
  """The pending writes to carry out, one at a time and in this order, before the graphs `uops` are realized.

  [] when every write pending on a buffer the graphs read is one of their own ASSIGN nodes: one realize
  carries those out together (an optimizer's step), as it always has."""
  if not _PENDING: return []
  nodes = UOp.sink(*uops).toposort()
  read = [n for n in nodes if n.op is Ops.BUFFER]
  if _together(uops, {n for n in nodes if n.op is Ops.ASSIGN}, read): return []
  left = {b: list(ws) for b, ws in _PENDING.items()}
  order: list[UOp] = []
  busy: set[UOp] = set()

  def settle(buf: UOp) -> None:
    # a buffer being settled is not entered again: its earlier writes are done, and its later ones wait for the
    # write in progress (two writes that read each other's buffers run in the order they are reached)
    if buf in busy: return
    busy.add(buf)
    while left.get(buf):
      w = left[buf].pop(0)
      for b in _buffers_read(w.src[1]):
        if b is not buf: settle(b)
      order.append(w)
    busy.discard(buf)

  for b in read: settle(b)
  return order
