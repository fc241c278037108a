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

import os
import time

from rulec.engine import trace as _trace
from rulec.engine.lang.loader import load_library
from rulec.engine.ir.ops import Ops
from rulec.engine.ir.rewrite import graph_rewrite
from rulec.engine.sched.fusion import HOISTING_DEVICES, MAX_RECOMPUTE_READS, choose_stages  # noqa: F401 (re-exported)
from rulec.engine.sched.kernels import KernelSplit, order_kernels
from rulec.engine.sched.multi import split_by_device
from rulec.engine.sched.stages import CopyReuse, Placement, StagePlan, snapshot_overwritten_reads
from rulec.engine.ir.uop import UOp
from rulec.runtime.devices import device_kind, rows_shared
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


def _fusion(sink: UOp, hoists: bool, hoists_rows: bool) -> set[UOp]:
  """Pass 2: the nodes the fusion rules store (decision rules: they record, the graph is not rewritten)."""
  sets = [_m(name) for name in FUSION_SETS]
  if not DEBUG: return choose_stages(sink, sets, hoists, hoists_rows)
  counting = [_Counting(m) for m in sets]
  t0 = time.perf_counter()
  staged = choose_stages(sink, counting, hoists, hoists_rows)
  fired = ", ".join(s for s in (c.summary() for c in counting) if s)
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
  sink = _pass("earliest", UOp.sink(*targets, *assigns), _m("earliest"))
  if (copies := CopyReuse(sink)).found: sink = _pass("reuse_copies", sink, _m("reuse_copies"), ctx=copies)
  sink = _pass("prepare", sink, _m("prepare"))
  used = {*devices, *(u.arg[1] for u in sink.toposort() if u.op is Ops.BUFFER)}
  hoists = all(device_kind(d) in HOISTING_DEVICES for d in used)
  hoists_rows = all(device_kind(d) in HOISTING_DEVICES or rows_shared(d) for d in used)
  sink = _pass("stage", sink, _m("stage"), ctx=StagePlan(sink, _fusion(sink, hoists, hoists_rows), devices))
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
  views = list(_pass("views", UOp.sink(*sink.src[:n]), _m("kernel_views")).src)
  if DEBUG: print(f"[schedule] {len(kernels)} kernels")
  if DEBUG >= 2:
    for k in kernels: print(k.render())
  return kernels, regroup(views)
