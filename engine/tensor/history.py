"""What a realized value was computed from, kept for autograd.

Realizing a tensor replaces its graph with a view of a buffer. Gradients must still flow through it
(`z = x.exp().realize(); (z * x).sum().backward()`), also when the tensor object itself is gone and only a graph
built from it remains (a function that realizes or writes into a temporary and returns something computed from
it). So the graph is kept here, keyed by the realized node (weakly: an entry lives as long as some graph can
still reach the node), not on the Tensor object.

A history is valid while it computes what the buffer holds, from the buffers it reads as they are now. A write
that takes part in autograd gives the buffer the history of its new contents and makes every history that read
the buffer read the old contents (`rewrite_readers`, engine/tensor/inplace.py); any other write drops both
(`forget_written`): the value stays, as a constant for autograd.

A history may read its own buffer: a write through a view keeps the old contents outside the view as
`DETACH(node)` (engine/tensor/autograd.py). It is stored with the node replaced by a placeholder, or the entry
would keep its own key alive.
"""
from __future__ import annotations

import weakref
from typing import Callable

from rulec.engine.ir.ops import Ops
from rulec.engine.ir.rewrite import substitute
from rulec.engine.ir.uop import UOp

# realized node -> (graph, placeholder standing for the node inside the graph, or None)
_HISTORY: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

# Histories chain: the graph of x2 = (x1 * 0.5 + 1).realize() holds x1's node, which is the key of x1's own history,
# and so on back to the first, so a loop that realizes over and over would keep every buffer it ever made alive.
# A history is only worth keeping while it can lead a gradient to a live tensor: `prune` drops the others. It runs
# after every PRUNE_EVERY new entries, so at most that many dead histories (and the buffers they hold) wait to be
# dropped, however many live ones there are; a pruning costs a walk over the kept histories' graphs.
# `live_values` is set by the Tensor class: the nodes of every live tensor.
live_values = None
# and the nodes of every live tensor that requires a gradient (requires_grad True): `leads_to_gradient`
grad_values = None
# and every node some live tensor's graph holds (its own node included, histories not followed)
held_values = None

# Histories that lead no gradient to a tensor that requires one (requires_grad True) when recorded: a value read
# (`loss.item()`) or realized from tensors left at requires_grad None. Such a history is followed only while its
# node is held by a live tensor's graph, so `print(loss.item()); loss.backward()` and
# `z = x.exp().realize(); (z * x).sum().backward()` still reach x, but a loop that carries a realized value
# (`x = f(x, w).realize()`, w a weight nobody trains) does not chain every step's buffers through w: the step
# before is dropped once no tensor holds it. tinygrad's realize cuts every graph; torch gives such tensors no
# gradient at all. A history that does lead to such a tensor is kept whole (backpropagation through time).
_SHALLOW: weakref.WeakSet = weakref.WeakSet()
PRUNE_EVERY = 16
_PRUNE_AT = [PRUNE_EVERY]


def _read_buffers(u: UOp) -> frozenset:
  """The ids of the buffers u's graph reads (ints, so the memo keeps no node alive)."""
  if u.op is Ops.BUFFER: return frozenset((u.arg[0],))
  out: frozenset = frozenset()
  for s in u.src: out |= s._derive("read_buffers", _read_buffers)
  return out


def reads(u: UOp) -> frozenset: return u._derive("read_buffers", _read_buffers)


def record(node: UOp, graph: UOp | None, rewritten: bool = False) -> None:
  """`node` (a realized value) was computed by `graph` (None: forget what it was computed from).

  A graph that reads the node's own buffer is a value that was realized into a buffer that already held it
  (`a.contiguous()` of a realized `a` is `a`): `a` keeps its own history, if any. Only a write into the buffer
  (`rewritten`, engine/tensor/autograd.py) gives a history that reads the buffer itself."""
  if graph is None or graph is node: _HISTORY.pop(node, None); return
  # only storage has a history: a value that folded to a constant is hash-consed, shared by every graph that
  # holds that constant (and a constant's gradient is zero anyway)
  if not all(p.base.op is Ops.BUFFER for p in (node.src if node.op is Ops.MSTACK else (node,))): return
  # no gradient flows through an integer or bool value: its history would only keep what it read alive
  if not node.dtype.is_float: _HISTORY.pop(node, None); return
  if node.base.op is Ops.BUFFER and node.base.arg[0] in reads(graph):
    if not rewritten: return
    stand = UOp.new_buffer(node.base.arg[1], node.base.arg[2], node.dtype).reshape(node.shape)
    _HISTORY[node] = (substitute(graph, {node: stand}), stand)
  else: _HISTORY[node] = (graph, None)
  if not rewritten and not leads_to_gradient(graph): _SHALLOW.add(node)
  else: _SHALLOW.discard(node)
  if len(_HISTORY) >= _PRUNE_AT[0] and live_values is not None:
    prune(live_values())
    _PRUNE_AT[0] = len(_HISTORY) + PRUNE_EVERY


def prune(live) -> None:
  """Drop every history that cannot lead a gradient to one of the nodes `live` (the live tensors' values): one
  whose graph holds none of them and no node whose own history can. Those graphs are all that kept the realized
  nodes they read (and so their buffers) alive."""
  held = _held_once()
  if _SHALLOW and held_values is not None:   # (a shallow history no live tensor holds is never followed again)
    for node in [n for n in list(_SHALLOW) if n not in held()]: _HISTORY.pop(node, None); _SHALLOW.discard(node)
  # a live tensor's gradient is found at its node, or at the graph its node was realized from (autograd's _nodes):
  # both count, except a node's own graph for its own history
  owners: dict[UOp, set] = {}
  for n in live:
    owners.setdefault(n, set()).add(None)
    if (h := history(n, held)) is not None: owners.setdefault(h, set()).add(n)
  reaches: dict[UOp, bool] = {}
  users: dict[UOp, list[UOp]] = {}       # realized node -> the nodes whose history graph holds it
  todo: list[UOp] = []
  for node, (graph, _) in list(_HISTORY.items()):
    hit = False
    for u in graph.toposort():
      if u is node: continue
      if (who := owners.get(u)) is not None and who - {node}: hit = True; break
      if u in _HISTORY: users.setdefault(u, []).append(node)
    reaches[node] = hit
    if hit: todo.append(node)
  while todo:                            # a history that holds a node whose history reaches a live one reaches it too
    for user in users.get(todo.pop(), ()):
      if not reaches[user]: reaches[user] = True; todo.append(user)
  for node, ok in reaches.items():
    if not ok: _HISTORY.pop(node, None)


def leads_to_gradient(graph: UOp) -> bool:
  """graph can lead a gradient to a live tensor that requires one (requires_grad True): it holds one's node or the
  graph that node was realized from, or a realized node whose history, followed down, does."""
  if grad_values is None: return True
  held = _held_once()
  wanted = set()
  for n in grad_values():
    wanted.add(n)
    if (h := history(n, held)) is not None: wanted.add(h)
  if not wanted: return False
  seen: set[UOp] = set()
  todo = [graph]
  while todo:
    for u in todo.pop().toposort(lambda u: u not in seen):
      if u in seen: continue
      seen.add(u)
      if u in wanted: return True
      if u in _HISTORY and (h := history(u, held)) is not None and h not in seen: todo.append(h)
  return False


def read_by_any() -> set[int]:
  """The ids of every buffer some kept history reads (what a backward through a realized value could still read)."""
  out: set[int] = set()
  for graph, _ in list(_HISTORY.values()): out |= reads(graph)
  return out


def _held_once() -> Callable[[], set]:
  """held_values(), walked at the first call and kept for the rest of one pass over many nodes (it walks every
  live tensor's graph: once a pass, not once per shallow node met)."""
  got: list[set] = []
  def held() -> set:
    if not got: got.append(held_values() if held_values is not None else set())
    return got[0]
  return held


def history(node: UOp, held: Callable[[], set] | None = None) -> UOp | None:
  """What `node` was computed from, or None (`held`: a _held_once() the caller shares between many nodes)."""
  entry = _HISTORY.get(node)
  if entry is None: return None
  if node in _SHALLOW and held_values is not None and node not in (held or _held_once())():
    return None
  graph, stand = entry
  return graph if stand is None else substitute(graph, {stand: node})


def recorded(nodes) -> dict[UOp, UOp]:
  """The history of every node among `nodes` that has one."""
  held = _held_once()
  return {n: h for n in nodes if n in _HISTORY and (h := history(n, held)) is not None}


def forget_written(written: set[UOp], parts, readers: bool = True) -> None:
  """After writes into the buffers `written`: drop every history of such a buffer, or (`readers`) that reads one."""
  ids = {b.arg[0] for b in written}
  for node, (graph, _) in list(_HISTORY.items()):
    if any(p.base in written for p in parts(node)) or (readers and not ids.isdisjoint(reads(graph))):
      _HISTORY.pop(node, None)


def read_elsewhere(buf: UOp) -> bool:
  """Some history other than the buffer's own reads `buf` (a BUFFER)."""
  return any(buf.arg[0] in reads(graph) and node.base is not buf for node, (graph, _) in list(_HISTORY.items()))


def rewrite_readers(ids: set[int], fn) -> None:
  """Before writes into the buffers `ids` are seen: each history that reads one becomes fn(history), which reads
  their old contents instead (engine/tensor/inplace.py). The written buffers' own histories are gone already."""
  for node, (graph, stand) in list(_HISTORY.items()):
    if ids.isdisjoint(reads(graph)) or (old := history(node)) is None: continue   # (None: pruned meanwhile)
    new = fn(old)
    _HISTORY.pop(node, None)
    record(node, new, rewritten=stand is not None)
