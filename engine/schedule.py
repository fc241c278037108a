"""The scheduling driver: a tensor-level graph -> kernels.

A fixed sequence of passes; every rewrite is a rule in rules/ (named below),
and Python only decides what to realize (consumer counting with a recompute
cost model) and cuts the final graph into kernels.

  1. earliest      rules/early.rules      cleanups, size 0, split reduces, copies, assigns
     prepare       rules/early.rules      explicit broadcasts
  2. choose stages (here)                 what to realize so compute is never duplicated
  3. realize       rules/realize.rules    STAGE / CONTIGUOUS -> store into a new buffer
  4. rangeify      rules/indexing.rules   ranges at stores and reduces; INDEX pushed down
  5. symbolic      rules/symbolic.rules   index arithmetic simplified, constants folded
  6. to_params     rules/kernel.rules     each store becomes a Kernel over PARAMs
"""
from __future__ import annotations

import os
import time
from typing import Any

from engine import trace as _trace
from engine.lang.loader import load_library
from engine.ops import ALU, MOVEMENT, Ops
from engine.rewrite import graph_rewrite, substitute
from engine.sched.tensor_helpers import is_buffer_view
from engine.uop import UOp, prod
from runtime.kernel import Kernel

DEBUG = int(os.environ.get("RULEC_DEBUG", "0") or 0)


def _m(*names: str):
  return load_library().matcher(*names)


class _Counting:
  """RULEC_DEBUG: a matcher that also counts which rule made each rewrite (slow; debug only)."""
  def __init__(self, matcher):
    self.matcher, self.fired = matcher, {}
  def rewrite(self, u, ctx=None):
    r = self.matcher.rewrite(u, ctx)
    if r is not None:
      name = (self.matcher.which_rule(u, ctx) or ("?", ""))[0]
      self.fired[name] = self.fired.get(name, 0) + 1
    return r


def _pass(name: str, sink: UOp, matcher, quiet: bool = False, **kw) -> UOp:
  if _trace.ACTIVE: return _traced_pass(name, sink, matcher, quiet, **kw)
  return _run_pass(name, sink, matcher, quiet, **kw)


def _run_pass(name: str, sink: UOp, matcher, quiet: bool, **kw) -> UOp:
  if not DEBUG or quiet: return graph_rewrite(sink, matcher, **kw)
  counting = _Counting(matcher)
  t0 = time.perf_counter()
  out = graph_rewrite(sink, counting, **kw)
  fired = ", ".join(f"{k} x{v}" for k, v in sorted(counting.fired.items(), key=lambda kv: -kv[1]))
  print(f"[schedule] {name:<10} {len(sink.toposort()):>6} -> {len(out.toposort()):>6} nodes  "
        f"{(time.perf_counter() - t0) * 1e3:7.2f} ms  {fired or 'no rules fired'}")
  return out


def _traced_pass(name: str, sink: UOp, matcher, quiet: bool, **kw) -> UOp:
  """RULEC_TRACE / engine.trace.tracing(): the pass with every rewrite recorded (see engine/trace.py)."""
  rec = _trace.Recorder(name, sink, matcher, kw.get("ctx"))
  try: out = _run_pass(name, sink, rec, quiet, **kw)
  except BaseException as e:
    rec.finish(None, e)
    raise
  rec.finish(out)
  return out


def max_kernel_buffers(device: str) -> int:
  """The most buffers one kernel may take on `device` (0 = no limit); RULEC_MAX_KERNEL_BUFFERS overrides."""
  return int(os.environ.get("RULEC_MAX_KERNEL_BUFFERS", DEVICE_MAX_BUFFERS.get(device, 0)))


DEVICE_MAX_BUFFERS: dict[str, int] = {}   # no current device has a limit


# *** what to realize ***

MAX_RECOMPUTE_READS = int(os.environ.get("RULEC_MAX_RECOMPUTE_READS", 3))


def _cheap(u: UOp, staged: set[UOp]) -> bool:
  """Recomputing u is cheap: no reduce inside, and it reads at most MAX_RECOMPUTE_READS buffers
  (realized values count). The seeds' remove-bufferize cost model, with three reads instead of two
  so a residual add feeding a normalisation (x + y - mean) is recomputed, not stored."""
  reads: set[UOp] = set()
  for x in u.toposort(gate=lambda x: x is u or (x not in staged and x.op not in (Ops.CONTIGUOUS, Ops.BUFFER))):
    if x is not u and (x in staged or x.op in (Ops.CONTIGUOUS, Ops.BUFFER)): reads.add(x)
    elif x.op is Ops.REDUCE_AXIS: return False
  return len(reads) <= MAX_RECOMPUTE_READS


def _uses(sink: UOp, staged: set[UOp]) -> dict[UOp, float]:
  """How many times each node's value would be computed: distinct index contexts, weighted by expansion.

  Elementwise users index a value exactly as they are indexed, so they share
  one context; a movement op or a reduce starts a new one; an EXPAND repeats
  its source once per element it adds. A realized node starts afresh."""
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
    for s in u.src:
      if u.op in ALU or u.op in (Ops.CAST, Ops.BITCAST): add = own
      elif u.op in MOVEMENT or u.op is Ops.REDUCE_AXIS:
        f = prod(u.shape) / max(1, prod(s.shape)) if u.op is Ops.EXPAND and s._shape else 1.0
        add = {(k, u): w * f for k, w in own.items()}
      else: add = {(k, u): w for k, w in own.items()}
      tgt = ctxs[s]
      for k, w in add.items(): tgt[k] = max(tgt.get(k, 0.0), w)
  return out


def choose_stages(sink: UOp) -> set[UOp]:
  """Nodes to realize so that no expensive value is computed twice.

  First reduces (expensive by nature) used more than once are realized; then
  ALU values used more than once are realized unless recomputing them is cheap."""
  staged: set[UOp] = set()
  uses = _uses(sink, staged)
  for u in sink.toposort():
    if u.op is Ops.REDUCE_AXIS and uses[u] > 1 and u.device is not None: staged.add(u)
  uses = _uses(sink, staged)
  for u in reversed(sink.toposort()):
    if u.op in ALU and uses.get(u, 0) > 1 and u.device is not None and not _cheap(u, staged):
      staged.add(u)
      uses = _uses(sink, staged)
  return staged


# *** kernels ***

class KernelBuilder:
  """ctx of rules/kernel.rules: numbers the buffers and ranges of one kernel."""
  def __init__(self):
    self.bufs: list[UOp] = []
    self.slots: dict[UOp, UOp] = {}
    self.ranges = 0
    self.after_reads: set[UOp] = set()   # buffers read as written by an earlier kernel (AFTER)

  def param_after(self, buf: UOp) -> UOp:
    self.after_reads.add(buf)
    return self.param(buf)

  def param(self, buf: UOp) -> UOp:
    if buf not in self.slots:
      self.slots[buf] = UOp(Ops.PARAM, buf.dtype, (), (len(self.bufs), buf.arg[2]))
      self.bufs.append(buf)
    return self.slots[buf]

  def renumber(self, r: UOp) -> UOp:
    self.ranges += 1
    return r.replace(arg=(self.ranges - 1, r.arg[1]), tag="k")


def _wrap_stages(sink: UOp, staged: set[UOp]) -> UOp:
  """Each chosen node wrapped in STAGE, with the stages inside it wrapped too."""
  if not staged: return sink
  done: dict[UOp, UOp] = {}
  for u in sink.toposort():
    new_src = tuple(done[s] for s in u.src)
    x = u if new_src == u.src else UOp(u.op, u.dtype, new_src, u.arg, u.tag)
    done[u] = UOp(Ops.STAGE, x.dtype, (x,), x.device) if u in staged else x
  return done[sink]


def _order(built: list[tuple[Kernel, KernelBuilder, UOp]]) -> list[Kernel]:
  """Kernels in an order that respects reads after writes (AFTER) and writes after reads:
  a kernel that overwrites an existing buffer (an assign) runs after every kernel
  that reads that buffer's old contents."""
  n = len(built)
  writer = {buf: i for i, (_, _, buf) in enumerate(built)}
  deps: list[set[int]] = [set() for _ in range(n)]
  for i, (_, ctx, out) in enumerate(built):
    for b in ctx.bufs:
      if b is out: continue
      if b in ctx.after_reads and b in writer: deps[i].add(writer[b])         # read after write
      elif b not in ctx.after_reads and b in writer: deps[writer[b]].add(i)   # the overwrite waits for this read
  order, done = [], set()
  while len(order) < n:
    ready = [i for i in range(n) if i not in done and deps[i] <= done]
    if not ready: raise RuntimeError("cycle in the kernel graph: two kernels each need the other's buffer first")
    done.add(ready[0])
    order.append(ready[0])
  return [built[i][0] for i in order]


def _realized_view(t: UOp) -> bool:
  """Already stored: a whole buffer, or a view of a buffer after an assign's store."""
  return is_buffer_view(t) or t.base.op is Ops.AFTER


def schedule(targets: list[UOp], default_device: str = "NUMPY") -> tuple[list[Kernel], list[UOp]]:
  """Kernels that realize `targets`, in run order, and each target's realized view (a BUFFER reshape)."""
  if _trace.ACTIVE: _trace.begin_schedule(default_device, len(targets))
  sink = _pass("earliest", UOp.sink(*targets), _m("earliest"))
  sink = _pass("prepare", sink, _m("prepare"))
  sink = _wrap_stages(sink, choose_stages(sink))
  if (limit := max_kernel_buffers(default_device)): sink = _pass("limit", sink, _m("limit_buffers"), ctx=limit)
  # every target that is not already a buffer is realized into one of its own (tagged, so no rule folds it away)
  def target(t: UOp) -> UOp:
    if _realized_view(t): return t
    if t.size == 0: return UOp.new_buffer(t.device or default_device, 0, t.dtype).reshape(t.shape)
    return UOp(Ops.STAGE, t.dtype, (t.src[0] if t.op is Ops.STAGE else t,), t.device or default_device, tag="target")
  sink = sink.replace(src=tuple(target(t) for t in sink.src))
  sink = _pass("realize", sink, _m("realize"))
  sink = _pass("rangeify", sink, _m("rangeify"), bottom_up=True)
  sink = _pass("symbolic", sink, _m("symbolic"))
  built: list[tuple[Kernel, KernelBuilder, UOp]] = []
  to_params, untag = _m("to_params"), _m("untag")
  for u in sink.toposort():
    if u.op is not Ops.AFTER: continue
    ctx = KernelBuilder()
    ast = _pass("to_params", UOp.sink(*u.src[1:]), to_params, quiet=True, ctx=ctx, bottom_up=True)
    built.append((Kernel(_pass("untag", ast, untag, quiet=True), tuple(ctx.bufs)), ctx, u.src[0]))
  kernels = _order(built)
  # each target reads its buffer directly from now on (the AFTERs are done)
  views = [substitute(s, {a: a.src[0] for a in s.toposort() if a.op is Ops.AFTER}) for s in sink.src]
  if DEBUG: print(f"[schedule] {len(kernels)} kernels")
  if DEBUG >= 2:
    for k in kernels: print(k.render())
  return kernels, views
