"""The schedule cache: kernels of a graph shape, reused for every graph of that shape.

A training loop builds the same tensor-level graph every step, over other buffers (new inputs, freshly
allocated gradients) or the same ones (parameters). Scheduling it runs every rule pass (tens to hundreds of
ms); the result depends only on the graph's structure, so it is kept here under a key that abstracts each
BUFFER to a parameter slot: its position in first-visit order plus its dtype, device and size (and each
constant's leaf tag, an identity too, to its first-visit number). Constants, args and other tags stay concrete. A hit re-binds the cached kernels to this call's buffers, allocating new
intermediate and output buffers (never one a live tensor holds) and running no rule pass.

`RULEC_SCHEDULE_CACHE=0` turns the cache off; `STATS` counts hits and misses; at most `MAX_ENTRIES` shapes
are kept (least recently used go first). Tracing (engine/trace.py) bypasses it: it exists to record the passes.
With RULEC_DEBUG a miss prints the passes as the driver runs them, and a hit prints one line saying so.
"""
from __future__ import annotations

import os
from collections import OrderedDict
from typing import Sequence

from rulec.engine.sched import driver as _scheduler
from rulec.engine import trace as _trace
from rulec.engine.lang.loader import library_held, load_library
from rulec.engine.ir.ops import Ops
from rulec.engine.ir.rewrite import substitute
from rulec.engine.sched import multi as _multi
from rulec.engine.sched import early as _helpers
from rulec.engine.sched.variables import has_symbolic_args, rebind, unbind_graph
from rulec.engine.ir.uop import UOp, arg_key, with_sizes
from rulec.runtime.buffer import new_buffer
from rulec.runtime.devices import one_pass_groups, rows_shared, split_parts, tensor_cores, tiles_sums
from rulec.engine.ir.kernel import Kernel

__all__ = ["STATS", "MAX_ENTRIES", "enabled", "graph_key", "schedule", "schedule_keeping", "clear"]

STATS = {"hits": 0, "misses": 0}
MAX_ENTRIES = 256


def enabled() -> bool:
  """The cache is on unless RULEC_SCHEDULE_CACHE=0 (read on every call, so tests can switch it)."""
  return os.environ.get("RULEC_SCHEDULE_CACHE", "1") != "0" and not _trace.ACTIVE


def graph_key(targets: Sequence[UOp]) -> tuple[tuple, list[UOp]]:
  """The structure of the graphs of `targets` with buffers as slots, and the buffers in slot order.

  One entry per distinct node in topological order; sources are named by position, so sharing is part of
  the key, and two graphs with equal keys are the same graph up to which buffers they read."""
  entries, bufs, _ = _graph_key(targets)
  return entries, bufs


def _graph_key(targets: Sequence[UOp]) -> tuple[tuple, list[UOp], dict[UOp, int]]:
  """graph_key(), and each node's position in the key (the same node of every graph with this key)."""
  pos: dict[UOp, int] = {}
  bufs: list[UOp] = []
  leaves: dict = {}
  entries = []
  for u in UOp.sink(*targets).toposort():
    tag = u.tag
    # a float constant made by Tensor.full is tagged ("leaf", n) to be a node of its own (engine/tensor/creation.py):
    # an identity like a buffer's, numbered in first-visit order too
    if type(tag) is tuple and tag and tag[0] == "leaf": tag = ("leaf", leaves.setdefault(tag, len(leaves)))
    if u.op is Ops.BUFFER:
      bufs.append(u)
      e = (Ops.BUFFER, u.dtype, u.arg[1], u.arg[2], tag)
    else: e = (u.op, u.dtype, arg_key(u), tag, tuple(pos[s] for s in u.src))
    pos[u] = len(entries)
    entries.append(e)
  return tuple(entries), bufs, pos


def _slot(i: int, b: UOp) -> UOp:
  """A stand-in for buffer slot i in a cached view: a BUFFER whose uid is ('slot', i), never a real one."""
  return UOp(Ops.BUFFER, b.dtype, (), (("slot", i), b.arg[1], b.arg[2]))


class _Entry:
  """One cached schedule: kernel ASTs with their buffers as slot numbers (inputs first, then the fresh buffers
  the schedule allocated, as (device, size, dtype)), and the output views over slot stand-ins; the kept
  intermediate values as (position in the graph key, view over stand-ins) after the outputs' views."""
  __slots__ = ("kernels", "fresh", "views", "stand_ins", "kept_at")

  def __init__(self, inputs: list[UOp], kernels: list[Kernel], views: list[UOp], kept_at: list[int] = ()):
    self.kept_at = list(kept_at)
    slot: dict[UOp, int] = {b: i for i, b in enumerate(inputs)}
    fresh: list[UOp] = []
    def number(b: UOp) -> int:
      if b not in slot:
        slot[b] = len(inputs) + len(fresh)
        fresh.append(b)
      return slot[b]
    self.kernels = [(k.ast, tuple(number(b) for b in k.bufs)) for k in kernels]
    for v in views:
      for b in v.toposort():
        if b.op is Ops.BUFFER: number(b)
    self.fresh = [(b.arg[1], b.arg[2], b.dtype) for b in fresh]
    self.stand_ins = [_slot(i, b) for b, i in slot.items()]
    self.views = [substitute(v, {b: self.stand_ins[i] for b, i in slot.items()}) for v in views]

  def bind(self, inputs: list[UOp]) -> tuple[list[Kernel], list[UOp]]:
    """The kernels and views over this call's input buffers and newly allocated ones."""
    bufs = list(inputs) + [new_buffer(d, n, dt) for d, n, dt in self.fresh]
    kernels = [Kernel(ast, tuple(bufs[i] for i in slots)) for ast, slots in self.kernels]
    # every view, whatever its base: a view left as a graph over buffers (what a later round of realize schedules)
    # reads this call's buffers too; a stand-in that leaked would name a buffer of no call at all
    mapping = {s: bufs[i] for i, s in enumerate(self.stand_ins)}
    return kernels, [substitute(v, mapping) for v in self.views]


def _knobs(devices: set) -> tuple:
  """The settings besides the graph that a schedule depends on (tests change them): the kernel-buffer limit,
  the reduce-split threshold and parts per device, the recompute cost model, the hoisting devices, the allreduce
  form, the rules."""
  ds = sorted(d for d in devices if d)
  return (tuple(_scheduler.max_kernel_buffers(d) for d in ds), tuple(split_parts(d) for d in ds),
          tuple(one_pass_groups(d) for d in ds), tuple(rows_shared(d) for d in ds), tuple(tiles_sums(d) for d in ds),
          tuple(tensor_cores(d) for d in ds),
          _helpers.REDUCE_SPLIT_THRESHOLD, _scheduler.MAX_RECOMPUTE_READS, _scheduler.HOISTING_DEVICES,
          _scheduler.LANE_GUARD_DEVICES,
          _multi._ring_setting(),   # which allreduce form (RULEC_RING, RULEC_RING_THRESHOLD)
          load_library().digest)   # the rules themselves: RULEC_RULES may change between calls


_entries: "OrderedDict[tuple, _Entry]" = OrderedDict()


def clear() -> None:
  """Forget every cached schedule and reset the counters."""
  _entries.clear()
  STATS.update(hits=0, misses=0)


def schedule(targets: list[UOp], default_device: str, devices: Sequence[str] | None = None) -> tuple[list[Kernel], list[UOp]]:
  """engine.schedule.schedule(targets, default_device, devices), from the cache when a graph of the same
  shape was scheduled before."""
  kernels, views, _ = schedule_keeping(targets, default_device, devices, keep=False)
  return kernels, views


def schedule_keeping(targets: list[UOp], default_device: str, devices: Sequence[str] | None = None,
                     keep: bool = True) -> tuple[list[Kernel], list[UOp], list[tuple[UOp, UOp]]]:
  """driver.schedule_keeping (the kernels, the targets' views, the kept intermediate values with their views),
  from the cache when a graph of the same shape was scheduled before (keeping or not is part of the key)."""
  # (the graph's key is computed with the collector held too (driver.collector_held): it walks the whole graph)
  with _scheduler.collector_held(), library_held(): return _schedule_or_bind(targets, default_device, devices, keep)


def _schedule_or_bind(targets: list[UOp], default_device: str, devices: Sequence[str] | None,
                      keep: bool) -> tuple[list[Kernel], list[UOp], list[tuple[UOp, UOp]]]:
  devices = list(devices) if devices is not None else [default_device] * len(targets)
  if has_symbolic_args(targets):   # bound offsets: scheduled with the Variables, the values go to the kernels
    unbound, var_vals, back = unbind_graph(targets)
    kernels, views, kept = _schedule_keeping(unbound, default_device, devices, keep)
    # (a target whose size is a Variable's is stored at its largest: its view is cut back to that size)
    return ([k.with_vals(var_vals) for k in kernels],
            [with_sizes(rebind(v, var_vals), t.sizes) for t, v in zip(targets, views)],
            [(back.get(x, x), rebind(v, var_vals)) for x, v in kept])
  return _schedule_keeping(targets, default_device, devices, keep)


def _schedule_keeping(targets: list[UOp], default_device: str, devices: list[str],
                      keep: bool) -> tuple[list[Kernel], list[UOp], list[tuple[UOp, UOp]]]:
  if not enabled(): return _scheduler.schedule_keeping(targets, default_device, devices, keep)
  structure, inputs, pos = _graph_key(targets)
  key = (structure, default_device, tuple(devices), keep,
         _knobs({default_device, *devices, *(b.arg[1] for b in inputs)}))
  entry = _entries.get(key)
  if entry is not None:
    _entries.move_to_end(key)
    STATS["hits"] += 1
    if _scheduler.DEBUG:
      n = len(entry.kernels)
      print(f"[schedule] cache hit: {n} kernel{'s' if n != 1 else ''} of a graph of this shape scheduled before, "
            "no pass run (RULEC_SCHEDULE_CACHE=0 runs them)")
    kernels, views = entry.bind(inputs)
    n = len(targets)
    nodes = list(pos) if entry.kept_at else []
    return kernels, views[:n], [(nodes[i], v) for i, v in zip(entry.kept_at, views[n:])]
  STATS["misses"] += 1
  kernels, views, kept = _scheduler.schedule_keeping(targets, default_device, devices, keep)
  _entries[key] = _Entry(inputs, kernels, views + [v for _, v in kept], [pos[x] for x, _ in kept])
  while len(_entries) > MAX_ENTRIES: _entries.popitem(last=False)
  return kernels, views, kept
