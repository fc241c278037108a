"""Pass 2 of the scheduler: what to realize (fusion), so that no expensive value is computed twice.

The cost facts live here: how many times each node's value would be computed (distinct index contexts,
weighted by expansion), whether recomputing it is cheap, the elementwise tails of reduces.
"""
from __future__ import annotations

import os
from typing import Any

from engine.ops import ALU, MOVEMENT, Ops
from engine.uop import UOp, prod

MAX_RECOMPUTE_READS = int(os.environ.get("RULEC_MAX_RECOMPUTE_READS", 5))


def _cheap(u: UOp, staged: set[UOp]) -> bool:
  """Recomputing u is cheap: no reduce inside, and it reads at most MAX_RECOMPUTE_READS buffers
  (realized values count). The seeds' remove-bufferize cost model, with five reads instead of two: a residual
  add feeding a normalisation (x + y - mean) is recomputed, not stored, and so are the elementwise gradients of
  a layernorm and a softmax (x, mean, rstd, g and a row sum), which puts the attention block's backward at
  tinygrad's kernel count (bench/schedule.py)."""
  reads: set[UOp] = set()
  for x in u.toposort(gate=lambda x: x is u or (x not in staged and x.op not in (Ops.CONTIGUOUS, Ops.BUFFER))):
    if x is not u and (x in staged or x.op in (Ops.CONTIGUOUS, Ops.BUFFER)): reads.add(x)
    elif x.op is Ops.REDUCE_AXIS: return False
  return len(reads) <= MAX_RECOMPUTE_READS


def _uses(sink: UOp, staged: set[UOp], contexts: dict[UOp, int] | None = None) -> dict[UOp, float]:
  """How many times each node's value would be computed: distinct index contexts, weighted by expansion.

  Elementwise users index a value exactly as they are indexed, so they share
  one context; a movement op or a reduce starts a new one; an EXPAND repeats
  its source once per element it adds. A realized node starts afresh.
  `contexts`, if given, receives each node's number of contexts, unweighted."""
  order = sink.toposort()
  ctxs: dict[UOp, dict[Any, float]] = {u: {} for u in order}
  ctxs[sink] = {(): 1.0}
  out: dict[UOp, float] = {}
  for u in reversed(order):
    mine = ctxs[u]
    if u in staged or u.op in (Ops.CONTIGUOUS, Ops.STORE) or u is sink: own = {(u,): 1.0}
    else: own = mine
    if len(own) > 16: own = {(u,): float(sum(own.values()))}   # too many paths to track: collapse them
    out[u] = sum(mine.values())
    if contexts is not None: contexts[u] = len(mine)
    for s in u.src:
      if u.op in ALU or u.op in (Ops.CAST, Ops.BITCAST): add = own
      elif u.op in MOVEMENT or u.op is Ops.REDUCE_AXIS:
        f = prod(u.shape) / max(1, prod(s.shape)) if u.op is Ops.EXPAND and s._shape else 1.0
        add = {(k, u): w * f for k, w in own.items()}
      else: add = {(k, u): w for k, w in own.items()}
      tgt = ctxs[s]
      for k, w in add.items(): tgt[k] = max(tgt.get(k, 0.0), w)
  return out


def _reduce_epilogues(order: list[UOp]) -> set[UOp]:
  """Elementwise ops over reduce results at the reduced shape: every source is a reduce, another such op, a
  constant or a realized buffer (numpy's NaN-aware max: WHERE(any nan, nan, max); a mean: sum * 1/n).
  Storing the top of such a tail stores the reduces below it in the same kernel."""
  out: set[UOp] = set()
  for u in order:
    if not (u.op in ALU or u.op is Ops.CAST): continue
    ok, any_reduce = True, False
    for s in u.src:
      x = s
      while x.op is Ops.RESHAPE: x = x.src[0]
      if x.op is Ops.REDUCE_AXIS or x in out: any_reduce = True
      elif x.base.op not in (Ops.CONST, Ops.BUFFER): ok = False
    if ok and any_reduce: out.add(u)
  return out


def choose_stages(sink: UOp, hoists: bool = False) -> set[UOp]:
  """Nodes to realize so that no expensive value is computed twice.

  First reduces used more than once (expensive by nature), outputs first: the top of a reduce's elementwise
  tail is stored rather than the reduce alone (one kernel stores both halves of a NaN-aware max), and a reduce
  whose only user is stored is used once. Then ALU values used more than once are realized unless recomputing
  them is cheap. Uses are counted again after each choice: a realized value starts afresh.

  `hoists`: every device here computes a reduce that depends on no loop around it once per kernel (CPU,
  NUMPY), so a whole-tensor reduce with one consumer stays in that consumer's kernel however far its value
  is broadcast (`x.argmax()`, `x - x.mean()`: one kernel, as in tinygrad)."""
  staged: set[UOp] = set()
  order = sink.toposort()
  contexts: dict[UOp, int] = {}
  uses = _uses(sink, staged, contexts)
  epilogues = _reduce_epilogues(order)
  # a whole-tensor value with one consumer, on devices that hoist it, is computed once in that consumer's
  # kernel: like a stage, what it reads is used once per computation of it, however far it is broadcast
  hoisted: set[UOp] = set()
  def choose(u: UOp) -> None:
    nonlocal uses
    if hoists and u.size == 1 and contexts.get(u, 0) <= 1: hoisted.add(u)
    else: staged.add(u)
    uses = _uses(sink, staged | hoisted, contexts)
  for u in reversed(order):
    if (u.op is Ops.REDUCE_AXIS or u in epilogues) and uses.get(u, 0) > 1 and u.device is not None:
      # an epilogue over a lower epilogue value that is needed more often than it (relu(x @ w + b) when the
      # backward pass reads x @ w + b too): that lower value is stored, and this one recomputed from it if cheap
      if u.op is not Ops.REDUCE_AXIS and _needed_below(u, epilogues, uses): continue
      choose(u)
  for u in reversed(order):
    if u.op in ALU and uses.get(u, 0) > 1 and u.device is not None and u not in hoisted and not _cheap(u, staged):
      choose(u)
  return staged


def _needed_below(u: UOp, epilogues: set[UOp], uses: dict[UOp, float]) -> bool:
  """A reduce inside u's epilogue is used more often than u, or an epilogue value below u at least as often:
  then that value is the one to store, and u is recomputed from it."""
  seen, todo = set(), [s for s in u.src]
  while todo:
    v = todo.pop()
    if v in seen or not (v in epilogues or v.op is Ops.REDUCE_AXIS): continue
    seen.add(v)
    # (an elementwise value below that is needed as often is stored instead: the one nearest the reduce is)
    if uses.get(v, 0) > uses.get(u, 0) or (v.op is not Ops.REDUCE_AXIS and uses.get(v, 0) >= uses.get(u, 0)): return True
    if v.op is not Ops.REDUCE_AXIS: todo += v.src
  return False


# devices whose kernels compute a reduce that depends on no enclosing loop once, before the loops (the CPU
# renderer hoists it, the NUMPY device evaluates each value over only the ranges it depends on); OpenCL
# work-items would each compute it
HOISTING_DEVICES = frozenset({"CPU", "NUMPY"})
