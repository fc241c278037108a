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


def _wrap_stages(sink: UOp, staged: set[UOp], devices: list[str]) -> UOp:
  """Each chosen node wrapped in STAGE, and each target realized into a buffer of its own.

  A target that is a whole or partial view of a buffer (realized before, or
  written by an assign in this schedule), of a chosen stage, or of a constant
  needs no kernel: it stays that view. Any other target is wrapped in a STAGE tagged "target"
  (no rule folds it away: the caller reads that buffer), and that same node
  replaces the target everywhere, so a value that is both an output and used by
  another output is computed once. CONTIGUOUS of a value that is staged anyway
  is that stage: one buffer, not a copy of one."""
  targets = list(sink.src)
  target_of: dict[UOp, str] = {}   # node -> device of the buffer its target stage writes
  for t, dev in zip(targets, devices):
    if t.size == 0 or t.base.op in (Ops.BUFFER, Ops.AFTER): continue
    if t.base.op is Ops.CONST: continue   # a constant (one the earlier passes folded, too) stays a constant
    if t.op is not Ops.CONTIGUOUS and t.base in staged: continue
    # a copy of a computed value is that value's stage; a copy of a view of a buffer stages the CONTIGUOUS
    # itself, so the view (an assign's target, say) stays what it is everywhere else
    # (a tagged CONTIGUOUS is a copy asked for: a buffer of its own)
    x = t.src[0] if t.op is Ops.CONTIGUOUS and t.tag is None and t.src[0].base.op not in (Ops.BUFFER, Ops.AFTER) else t
    target_of.setdefault(x, x.device or dev)
  done: dict[UOp, UOp] = {}
  for u in sink.toposort():
    if u is sink: break
    new_src = tuple(done[s] for s in u.src)
    x = u if new_src == u.src else UOp(u.op, u.dtype, new_src, u.arg, u.tag)
    if u in target_of: x = UOp(Ops.STAGE, x.dtype, x.src if x.op is Ops.CONTIGUOUS else (x,), target_of[u], tag="target")
    elif u in staged: x = UOp(Ops.STAGE, x.dtype, (x,), x.device)
    elif u.op is Ops.CONTIGUOUS and u.tag is None and x.src[0].op is Ops.STAGE: x = x.src[0]
    done[u] = x
  outs = []
  for t, dev in zip(targets, devices):
    if t.size == 0: outs.append(UOp.new_buffer(t.device or dev, 0, t.dtype).reshape(t.shape))
    elif t.op is Ops.CONTIGUOUS and done[t].op is Ops.STAGE: outs.append(done[t])
    else: outs.append(done[t.src[0]] if t.op is Ops.CONTIGUOUS and t.src[0] in target_of else done[t])
  return sink.replace(src=tuple(outs))


def _reuse_contiguous_copies(sink: UOp) -> UOp:
  """An elementwise op reading x reads a contiguous copy of x's permute/reshape instead, through the inverse
  view, when the program makes one: the copy's kernel computes x once (the seeds' replace_contiguous)."""
  found: dict[UOp, UOp] = {}
  for u in sink.toposort():
    if u.op is not Ops.CONTIGUOUS or u.tag is not None or u.src[0].op not in (Ops.PERMUTE, Ops.RESHAPE): continue
    x, view, views = u.src[0], u, {}
    while x.op in (Ops.PERMUTE, Ops.RESHAPE):
      view = view.permute(tuple(sorted(range(len(x.arg)), key=lambda i: x.arg[i]))) if x.op is Ops.PERMUTE \
        else view.reshape(x.src[0].shape)
      x = x.src[0]
      views[x] = view   # each level of the chain (a matmul's value is a RESHAPE of its reduce)
    if x.op in ALU or x.op is Ops.REDUCE_AXIS:
      for k, v in views.items(): found.setdefault(k, v)
  if not found: return sink
  def via_copy(s: UOp) -> UOp | None:
    """s (a permute/reshape chain over a value that has a copy) read from that copy."""
    chain = []
    while s not in found and s.op in (Ops.PERMUTE, Ops.RESHAPE):
      chain.append(s)
      s = s.src[0]
    if s not in found: return None
    out = found[s]
    for m in reversed(chain): out = m.replace(src=(out,))
    return out
  done: dict[UOp, UOp] = {}
  for u in sink.toposort():
    new_src = tuple((via_copy(s) or done[s]) if u.op in ALU else done[s] for s in u.src)
    done[u] = u if new_src == u.src else UOp(u.op, u.dtype, new_src, u.arg, u.tag)
  return done[sink]


def _place_constants(sink: UOp, devices: list[str]) -> UOp:
  """A buffer for a value that lives on no device (a CONTIGUOUS of constants, a split reduce of
  ones) goes where its nearest consumer lives: that consumer's device, or the target's."""
  order = sink.toposort()
  if all(u.device is not None for u in order if u.op in (Ops.STAGE, Ops.CONTIGUOUS)): return sink
  where: dict[UOp, str] = dict(zip(sink.src, devices))
  for u in reversed(order):
    here = u.arg if u.op is Ops.COPY else u.device or where.get(u)
    for s in u.src:
      if here is not None: where.setdefault(s, here)
  done: dict[UOp, UOp] = {}
  for u in order:
    new_src = tuple(done[s] for s in u.src)
    x = u if new_src == u.src else UOp(u.op, u.dtype, new_src, u.arg, u.tag)
    if u.device is None and u in where and u.op in (Ops.STAGE, Ops.CONTIGUOUS) and (u.op is Ops.CONTIGUOUS or u.arg is None):
      x = UOp(Ops.STAGE, x.dtype, x.src, where[u], x.tag)
    done[u] = x
  return done[sink]


# the nodes that become kernels at the tensor level: stages, contiguous copies, device copies, stores
_KERNEL_ROOTS = (Ops.STAGE, Ops.CONTIGUOUS, Ops.COPY, Ops.STORE)


def _snapshot_overwritten_reads(sink: UOp) -> UOp:
  """Reads of a buffer's old contents in a kernel that must run after an assign overwrites that buffer.

  In one realize, every value is computed from the buffers as they were before the call's assigns, except
  through an assign's own result (as `RULEC_REALIZE=eval` does: `old = b + 0; b.assign(b * 10)` then
  `old + b`: old is b as it was). A kernel that reads b raw while its region depends on the written b
  (through the AFTER, directly or through another kernel) cannot be ordered: before the store it misses the
  new contents, after it the old ones. Those raw reads go to a copy of b taken first (a STAGE tagged
  "snapshot", which no rule folds away): the seeds' find_bufs guard, resolved by a copy instead of an
  error. Outputs that are views of b compute nothing: they are the buffer, and show the write."""
  order = sink.toposort()
  afters = {u.src[0]: u for u in order if u.op is Ops.AFTER}
  if not afters: return sink
  after_of: dict[UOp, frozenset] = {}   # the buffers whose written contents each node depends on
  for u in order:
    acc = frozenset({u.src[0]}) if u.op is Ops.AFTER else frozenset()
    for x in u.src: acc |= after_of[x]
    after_of[u] = acc
  snaps: dict[UOp, UOp] = {}
  done: dict[UOp, UOp] = {}

  def read(site: UOp, s: UOp) -> UOp | None:
    """The source s of site, when it is a view of a written buffer read raw in a kernel after the write."""
    chain = []
    x = s
    while x.op in MOVEMENT:
      chain.append(x)
      x = x.src[0]
    if x.op is not Ops.BUFFER or x not in afters: return None
    out = snaps.setdefault(x, UOp(Ops.STAGE, x.dtype, (x,), x.arg[1], tag="snapshot"))
    for m in reversed(chain): out = m.replace(src=(out,))
    return out

  for root in order:
    if not (root.op in _KERNEL_ROOTS or root.op is Ops.AFTER or root is sink): continue
    needs = root.op in _KERNEL_ROOTS and any(b in after_of[root] for b in afters)
    done[root] = _rebuild_region(root, done, read if needs else None)
  return done[sink]


def _rebuild_region(root: UOp, done: dict[UOp, UOp], read) -> UOp:
  """root over its region's nodes rebuilt: kernels and AFTERs below it as already rebuilt (`done`), and each
  source of a value (not of a movement op) that read(value, source) redirects. A store's target (src[0]) is
  written, not read: it stays."""
  keep = root.src[:1] if root.op is Ops.STORE else ()
  srcs = root.src[len(keep):]
  boundary = lambda x: x.op in _KERNEL_ROOTS or x.op is Ops.AFTER
  memo: dict[UOp, UOp] = {}
  def sources(x: UOp, xs: tuple[UOp, ...]) -> tuple[UOp, ...]:
    if read is None or x.op in MOVEMENT: return tuple(memo[s] for s in xs)
    return tuple(read(x, s) or memo[s] for s in xs)
  for x in UOp.sink(*srcs).toposort(gate=lambda x: x.op is Ops.SINK or not boundary(x))[:-1]:
    if boundary(x): memo[x] = done.get(x, x)
    else:
      new_src = sources(x, x.src)
      memo[x] = x if new_src == x.src else x.replace(src=new_src)
  new = keep + sources(root, srcs)
  return root if new == root.src else root.replace(src=new)


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


def schedule(targets: list[UOp], default_device: str = "NUMPY",
             devices: list[str] | None = None) -> tuple[list[Kernel], list[UOp]]:
  """Kernels that realize `targets`, in run order, and each target's realized view (movement ops over a BUFFER).

  `devices` names, per target, where a value that lives on no device (a graph of constants) is stored."""
  devices = list(devices) if devices is not None else [default_device] * len(targets)
  devices = [t.device or d or default_device for t, d in zip(targets, devices)]
  if _trace.ACTIVE: _trace.begin_schedule(default_device, len(targets))
  # every assign is carried out, also one whose value no output ends up reading (x - x, a size-0 slice of it):
  # each is an output of its own
  n = len(targets)
  assigns = [u for u in UOp.sink(*targets).toposort() if u.op is Ops.ASSIGN and u not in targets]
  devices += [a.device or default_device for a in assigns]
  sink = _pass("earliest", UOp.sink(*targets, *assigns), _m("earliest"))
  sink = _reuse_contiguous_copies(sink)
  sink = _pass("prepare", sink, _m("prepare"))
  hoists = all(d in HOISTING_DEVICES for d in {*devices, *(u.arg[1] for u in sink.toposort() if u.op is Ops.BUFFER)})
  sink = _wrap_stages(sink, choose_stages(sink, hoists), devices)
  if (limit := max_kernel_buffers(default_device)): sink = _pass("limit", sink, _m("limit_buffers"), ctx=limit)
  sink = _place_constants(sink, devices)
  sink = _snapshot_overwritten_reads(sink)
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
  views = [substitute(s, {a: a.src[0] for a in s.toposort() if a.op is Ops.AFTER}) for s in sink.src[:n]]
  if DEBUG: print(f"[schedule] {len(kernels)} kernels")
  if DEBUG >= 2:
    for k in kernels: print(k.render())
  return kernels, views
