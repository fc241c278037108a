"""The scheduling driver: a tensor-level graph -> kernels.

A fixed sequence of passes; every rewrite but one is a rule in rules/ (named
below). Python computes the facts rules decide on (consumer counts, recompute
costs: engine/sched/fusion.py; original nodes: engine/sched/stages.py), redirects
reads of overwritten buffers to snapshots (per kernel region: the one graph pass
still in Python) and orders the kernels.

  1. earliest      rules/early.rules      cleanups, size 0, split reduces, bitcasts, copies, assigns
     reuse_copies  rules/early.rules      reads of a value that has a contiguous copy read the copy
     prepare       rules/early.rules      explicit broadcasts
  2. fusion        rules/fusion.rules     what to realize (decisions over engine/sched/fusion.py's facts)
     stage, place  rules/bufferize.rules  the decisions and the outputs wrapped in STAGE; constants placed
     (snapshots)   Python (stages.py)     a kernel reading a buffer before and after an assign reads a copy
  3. realize       rules/bufferize.rules  STAGE / CONTIGUOUS -> store into a new buffer
  4. rangeify      rules/rangeify.rules   ranges at stores and reduces; INDEX pushed down
  5. symbolic      rules/symbolic.rules   index arithmetic simplified, constants folded
  6. split         rules/kernel.rules     each store becomes a Kernel over PARAMs (to_params, per kernel)
     views         rules/kernel.rules     each target a view of its buffer
"""
from __future__ import annotations

import contextlib
import gc
import os
import threading
import time

from rulec.engine import trace as _trace
from rulec.engine.lang.loader import library_held, load_library
from rulec.engine.ir.ops import ALU, MOVEMENT, Ops
from rulec.engine.ir.rewrite import graph_rewrite
from rulec.engine.sched.fusion import HOISTING_DEVICES, LANE_GUARD_DEVICES, MAX_RECOMPUTE_READS, choose_stages  # noqa: F401 (re-exported)
from rulec.engine.sched.kernels import KernelSplit, order_kernels
from rulec.engine.sched.multi import split_by_device
from rulec.engine.sched.stages import CopyReuse, Placement, StagePlan, snapshot_overwritten_reads
from rulec.engine.ir.uop import UOp
from rulec.runtime.devices import device_kind, rows_shared, tensor_cores, tiles_sums
from rulec.engine.ir.kernel import Kernel

DEBUG = int(os.environ.get("RULEC_DEBUG", "0") or 0)


def _m(*names: str):
  return load_library().matcher(*names)


class _Counting:
  """RULEC_DEBUG: a matcher that also counts which rule made each rewrite (slow; debug only). The rules run
  one at a time, once each (rewrite_named), so a ctx whose methods record sees exactly one rewrite."""
  def __init__(self, matcher):
    self.matcher, self.fired = matcher, {}
  def rewrite(self, u, ctx=None):
    res = self.matcher.rewrite_named(u, ctx)
    if res is None: return None
    r, (name, _) = res
    self.fired[name] = self.fired.get(name, 0) + 1
    return r

  def summary(self) -> str:
    return ", ".join(f"{k} x{v}" for k, v in sorted(self.fired.items(), key=lambda kv: -kv[1]))


def _pass(name: str, sink: UOp, matcher, quiet: bool = False, **kw) -> UOp:
  if _trace.ACTIVE: return _traced_pass(name, sink, matcher, quiet, **kw)
  return _run_pass(name, sink, matcher, quiet, **kw)


def _run_pass(name: str, sink: UOp, matcher, quiet: bool, **kw) -> UOp:
  if not DEBUG or quiet: return graph_rewrite(sink, matcher, **kw)
  counting = _Counting(matcher)
  t0 = time.perf_counter()
  out = graph_rewrite(sink, counting, **kw)
  fired = counting.summary()
  print(f"[schedule] {name:<10} {len(sink.toposort()):>6} -> {len(out.toposort()):>6} nodes  "
        f"{(time.perf_counter() - t0) * 1e3:7.2f} ms  {fired or 'no rules fired'}")
  return out


def _traced_pass(name: str, sink: UOp, matcher, quiet: bool, **kw) -> UOp:
  """RULEC_TRACE / rulec.engine.trace.tracing(): the pass with every rewrite recorded (see engine/trace.py)."""
  rec = _trace.Recorder(name, sink, matcher, kw.get("ctx"))
  try: out = _run_pass(name, sink, rec, quiet, **kw)
  except BaseException as e:
    rec.finish(None, e)
    raise
  rec.finish(out)
  return out


# the fusion rule sets (rules/fusion.rules), offered every node in this order
FUSION_SETS = ("fuse_reduces", "fuse_values")
# ... and then these, producers first
FUSION_UPWARD_SETS = ("bound_kernels",)


def _fusion(sink: UOp, hoists: bool, hoists_rows: bool, lane_guards: bool, tiled_epilogues: bool = False,
            tensor_cores: bool = False) -> set[UOp]:
  """Pass 2: the nodes the fusion rules store (decision rules: they record, the graph is not rewritten)."""
  sets, upward = [_m(name) for name in FUSION_SETS], [_m(name) for name in FUSION_UPWARD_SETS]
  if not DEBUG: return choose_stages(sink, sets, hoists, hoists_rows, lane_guards, tiled_epilogues, tensor_cores, upward_sets=upward)
  counting, counting_up = [_Counting(m) for m in sets], [_Counting(m) for m in upward]
  t0 = time.perf_counter()
  staged = choose_stages(sink, counting, hoists, hoists_rows, lane_guards, tiled_epilogues, tensor_cores,
                         upward_sets=counting_up)
  fired = ", ".join(s for s in (c.summary() for c in counting + counting_up) if s)
  print(f"[schedule] {'fusion':<10} {len(staged):>6} stores {' ' * 10}{(time.perf_counter() - t0) * 1e3:7.2f} ms  "
        f"{fired or 'no rules fired'}")
  return staged


def max_kernel_buffers(device: str) -> int:
  """The most buffers one kernel may take on `device` (0 = no limit); RULEC_MAX_KERNEL_BUFFERS overrides."""
  return int(os.environ.get("RULEC_MAX_KERNEL_BUFFERS", DEVICE_MAX_BUFFERS.get(device, 0)))


DEVICE_MAX_BUFFERS: dict[str, int] = {}   # no current device has a limit


def schedule(targets: list[UOp], default_device: str = "NUMPY",
             devices: list[str] | None = None) -> tuple[list[Kernel], list[UOp]]:
  """Kernels that realize `targets`, in run order, and each target's realized view (movement ops over a BUFFER).

  `devices` names, per target, where a value that lives on no device (a graph of constants) is stored."""
  kernels, views, _ = schedule_keeping(targets, default_device, devices)
  return kernels, views


# the ops of a value worth handing back when the fusion rules store it: computed values (a view, a buffer, a
# constant, a write or a copy to another device is none, or is handed back already)
_NOT_KEPT = MOVEMENT | {Ops.BUFFER, Ops.CONST, Ops.ASSIGN, Ops.AFTER, Ops.COPY, Ops.STAGE, Ops.SINK, Ops.MSTACK}


def _kept_values(originals: UOp, became: list[dict], staged: set[UOp], sink: UOp) -> list[tuple[UOp, UOp]]:
  """The values the schedule stores into buffers of their own that are nodes of the caller's graphs too (the
  graphs `originals` holds), as (the caller's node, the node the fusion rules saw): what a later realize of a
  graph that holds them can read from those buffers instead of computing them again (tinygrad's becomes map: a
  model that realizes each layer's KV-cache write would otherwise compute every layer below it again, per
  layer). `became` holds what each node became in each pass before the fusion rules ran.

  Left out: views, buffers, constants and writes; a value of size 0; a copy of a view of a buffer or a constant
  (it stays a copy of its own) or of an expanded value (a kept value is an output, and outputs are stored whole);
  a value that reads a buffer this schedule writes (its value is the buffer's old contents, which a graph holding
  it reads no more)."""
  order = originals.toposort()
  written = {u.src[0].base for u in order if u.op is Ops.ASSIGN}
  outputs = set(originals.src)   # (an output is stored already, its buffer kept apart: engine/tensor/base.py)
  reads_written: dict[UOp, bool] = {}
  now: dict[UOp, UOp] = {}   # node the fusion rules saw -> the first of the caller's nodes that became it
  for o in order:
    reads_written[o] = o in written or any(reads_written[s] for s in o.src)
    if o in outputs or o.op in _NOT_KEPT or reads_written[o] or o.size == 0 or not isinstance(o.device, str) or \
       o.sizes is not None: continue   # (a value whose size is a Variable's would need its view cut back to it)
    x = o
    for m in became: x = m.get(x, x)
    if x.op is Ops.CONTIGUOUS: ok = x.src[0].op is not Ops.EXPAND and x.src[0].base.op not in (Ops.BUFFER, Ops.CONST)
    else: ok = x in staged and x.op not in _NOT_KEPT
    if ok and x.shape == o.shape: now.setdefault(x, o)
  return [(o, x) for x, o in now.items()]


def _computes(t: UOp) -> bool:
  """t, under its movement ops, is a reduction or an ALU op: a value of its own, never an alias of a buffer."""
  while t.op in MOVEMENT: t = t.src[0]
  return t.op is Ops.REDUCE_AXIS or t.op in ALU


_PAUSE_LOCK = threading.Lock()
_PAUSED = [0, False]   # schedules running, and whether the collector was on before the first of them


@contextlib.contextmanager
def collector_held():
  """Python's cyclic garbage collector held off while a schedule runs, and turned back on after (if it was on).
  A collection walks the live objects of its generations, and a model's schedule keeps hundreds of thousands of
  nodes alive while it builds more: a ResNet-50 training step's schedule spent 1.45 of its 4.04 s in 1,096
  collections (7 of them full: 1.14 s), and 2.66 s with the collector off (bench/schedule.py --models program).
  The scheduler's nodes are freed by reference counting: that schedule left no cyclic garbage at all (gc.collect()
  after it found 0 objects), and any a schedule did leave is collected by the first collection after it."""
  with _PAUSE_LOCK:
    if _PAUSED[0] == 0:
      _PAUSED[1] = gc.isenabled()
      gc.disable()
    _PAUSED[0] += 1
  try: yield
  finally:
    with _PAUSE_LOCK:
      _PAUSED[0] -= 1
      if _PAUSED[0] == 0 and _PAUSED[1]: gc.enable()


def schedule_keeping(targets: list[UOp], default_device: str = "NUMPY", devices: list[str] | None = None,
                     keep: bool = True) -> tuple[list[Kernel], list[UOp], list[tuple[UOp, UOp]]]:
  """schedule(), and (node, its view) for every intermediate value of the targets' graphs the kernels store
  into a buffer of their own (`_kept_values`; none when `keep` is False or the values span devices)."""
  with collector_held(), library_held(): return _schedule_keeping(targets, default_device, devices, keep)


def _schedule_keeping(targets: list[UOp], default_device: str, devices: list[str] | None,
                      keep: bool) -> tuple[list[Kernel], list[UOp], list[tuple[UOp, UOp]]]:
  originals = UOp.sink(*targets)
  devices = list(devices) if devices is not None else [default_device] * len(targets)
  # values spread over devices (rules/multi.rules): one target per device, put back together at the end
  targets, devices, regroup = split_by_device(list(targets), devices, _pass)
  devices = [t.device or d or default_device for t, d in zip(targets, devices)]
  if _trace.ACTIVE: _trace.begin_schedule(default_device, len(targets))
  # every assign is carried out, also one whose value no output ends up reading (x - x, a size-0 slice of it):
  # each is an output of its own
  n = len(targets)
  assigns = [u for u in UOp.sink(*targets).toposort() if u.op is Ops.ASSIGN and u not in targets]
  devices += [a.device or default_device for a in assigns]
  # (what each node of the caller's graphs became in the first passes: a value the fusion rules store is handed
  # back to the caller's graphs through these)
  became: list[dict] = [{}, {}, {}]
  # (outputs that compute a value: one the first passes fold to a view of a buffer, a sum over size-1 axes, is
  # still stored apart, or a later assign to that buffer would show through it)
  computed = frozenset(i for i, t in enumerate(targets) if _computes(t))
  sink = _pass("earliest", UOp.sink(*targets, *assigns), _m("earliest"), memo=became[0])
  if (copies := CopyReuse(sink)).found:
    sink = _pass("reuse_copies", sink, _m("reuse_copies"), ctx=copies, memo=became[1])
  sink = _pass("prepare", sink, _m("prepare"), memo=became[2])
  used = {*devices, *(u.arg[1] for u in sink.toposort() if u.op is Ops.BUFFER)}
  hoists = all(device_kind(d) in HOISTING_DEVICES for d in used)
  hoists_rows = all(device_kind(d) in HOISTING_DEVICES or rows_shared(d) for d in used)
  lane_guards = all(device_kind(d) in LANE_GUARD_DEVICES for d in used)
  tiled_epilogues = all(tiles_sums(d) for d in used)
  staged = _fusion(sink, hoists, hoists_rows, lane_guards, tiled_epilogues, all(tensor_cores(d) for d in used))
  # (values spread over devices are regrouped per target: what they keep is not handed back)
  one_device = tuple(targets) == originals.src and all(isinstance(t.device, str) for t in targets)
  kept = _kept_values(originals, became, staged, sink) if keep and one_device else []
  # (a value of constants alone lives on no device: it would be kept in a buffer placed nowhere, and costs nothing
  # to compute again; `x.all()` of an empty x, made contiguous, is one)
  kept = [(o, x) for o, x in kept if x.device is not None]
  if kept:
    first_kept = len(sink.src)
    sink = UOp.sink(*sink.src, *(x for _, x in kept))
    devices = devices + [x.device for _, x in kept]
  if (aliased := [i for i in computed if sink.src[i].base.op in (Ops.BUFFER, Ops.AFTER)]):
    sink = sink.replace(src=tuple(UOp(Ops.CONTIGUOUS, x.dtype, (x,), tag="copy") if i in aliased else x
                                  for i, x in enumerate(sink.src)))
  sink = _pass("stage", sink, _m("stage"), ctx=StagePlan(sink, staged, devices))
  if (limit := max_kernel_buffers(default_device)): sink = _pass("limit", sink, _m("limit_buffers"), ctx=limit)
  if Placement.needed(sink): sink = _pass("place", sink, _m("place"), ctx=Placement(sink, devices))
  sink = snapshot_overwritten_reads(sink)
  sink = _pass("realize", sink, _m("realize"))
  sink = _pass("rangeify", sink, _m("rangeify"), bottom_up=True)
  sink = _pass("symbolic", sink, _m("symbolic"))
  split = KernelSplit(_m("to_params"), _m("untag"), _pass)
  sink = _pass("split", sink, _m("split_kernels"), ctx=split)
  kernels = order_kernels(split.built)
  # each target reads its buffer directly from now on (the kernels are split off)
  views = list(_pass("views", UOp.sink(*sink.src[:n], *(sink.src[first_kept:] if kept else ())),
                     _m("kernel_views")).src)
  # (a kept value some rule folded back into a computation, not a buffer, is no use to hand back; nor is one stored
  # in an output's buffer: that buffer is the output's alone)
  outputs = {v.base for v in views[:n]}
  handed = [(o, v) for (o, _), v in zip(kept, views[n:]) if v.base.op is Ops.BUFFER and v.base not in outputs]
  if DEBUG: print(f"[schedule] {len(kernels)} kernels" + (f", {len(handed)} intermediate values kept" if handed else ""))
  if DEBUG >= 2:
    for k in kernels: print(k.render())
  return kernels, regroup(views[:n]), handed
