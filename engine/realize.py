"""Realizing tensor-level graphs: turning lazy values into buffers.

`realize` schedules the graphs into kernels (engine/sched/driver.py, every
rewrite a rule in rules/) and runs the kernels on their device. The numpy
interpreter of tensor graphs (`rulec.engine.tensor_eval`) is the oracle tests
compare against; `RULEC_REALIZE=eval` makes realize use it instead. A graph of a shape scheduled before gets
its kernels from engine/sched/cache.py; engine/jit.py (TinyJit) records the kernels `_run` runs.
"""
from __future__ import annotations

import os
import time
from typing import Sequence

import numpy as np

from rulec.engine.sched import cache as schedule_cache
from rulec.engine import memory_plan, tensor_eval
from rulec.runtime import progress
from rulec.runtime.devices import default_device, prepare, run_kernel
from rulec.engine.ir.ops import MOVEMENT, Ops
from rulec.engine.ir.uop import UOp, concrete_arg, trim_to_sizes, with_sizes
from rulec.runtime.buffer import buffer_of, new_buffer

__all__ = ["COUNTERS", "schedule", "realize", "realize_map", "is_realized", "host_value", "device_of", "view_indices",
           "DEFAULT_DEVICE"]

# kernels scheduled / compiled / run (the evaluator path runs no kernels, so it counts nothing)
COUNTERS = {"scheduled": 0, "compiled": 0, "run": 0}

try: DEFAULT_DEVICE = default_device()
except ValueError: DEFAULT_DEVICE = None   # a bad RULEC_DEVICE is reported where a device is needed, not on import


def schedule(uops: Sequence[UOp], devices: Sequence[str] | None = None):
  """The kernels that realizing `uops` would run."""
  keep = [i for i, u in enumerate(uops) if u.base.op is not Ops.CONST]
  uops, devices = [uops[i] for i in keep], (None if devices is None else [devices[i] for i in keep])
  kernels, _ = schedule_cache.schedule(list(uops), default_device(), devices)
  COUNTERS["scheduled"] += len(kernels)
  return kernels


class JitError(Exception):
  """A TinyJit call that cannot be captured or replayed (tinygrad's name; engine/jit.py re-exports it)."""


# TinyJit's capture (engine/jit.py): while a list is here, every kernel run is appended to the innermost one
CAPTURING: list[list] = []
# called after every kernel run (a JIT replay's too) with the kernel and the host seconds its run took (on CL the
# time to enqueue it): rulec.helpers' GlobalCounters counts through this
RUN_HOOKS: list = []


def _run(kernel, launch=None, buffers=None) -> None:
  """Run one kernel and count it. launch: a device's prepared launch of it (runtime/devices.py `launcher`, what
  TinyJit replays with), called with `buffers` (the Buffers of kernel.bufs) and the kernel's values."""
  start = time.perf_counter() if RUN_HOOKS else 0.0
  # a kernel runs on the device of the buffer it writes (slot 0: the store target is numbered first)
  if launch is not None: launch(buffers, kernel.vals)
  else: run_kernel(kernel, kernel.bufs[0].arg[1] if kernel.bufs else default_device(), kernel.vals)
  COUNTERS["run"] += 1
  if CAPTURING: CAPTURING[-1].append(kernel)
  for hook in RUN_HOOKS: hook(kernel, time.perf_counter() - start)


def is_realized(u: UOp) -> bool:
  """Nothing is left to compute: the value is stored (a buffer, or a view of one: movement ops over a BUFFER), or
  it is a constant (movement ops over a CONST). Realizing either schedules nothing, as in tinygrad; a view's value
  is read through the view, a constant's is made on the host when asked for (a gradient that is a constant, such
  as a bias's under a sum, costs no kernel)."""
  return u.base.op in (Ops.BUFFER, Ops.CONST)


def _through_view(view: UOp, what: str, of_buffer) -> tuple[UOp, np.ndarray]:
  """The BUFFER under a view (movement ops over it) and of_buffer(buffer) moved through the view's ops."""
  chain = []
  x = view
  while x.op in MOVEMENT:
    chain.append(x)
    x = x.src[0]
  if x.op is not Ops.BUFFER: raise ValueError(f"{what} must be a view of a buffer, not of {x.op.name}")
  v = of_buffer(x)
  for m in reversed(chain): v = tensor_eval.apply_movement(m.op, concrete_arg(m), v)
  return x, v


def host_value(view: UOp) -> np.ndarray:
  """The value of a realized view (movement ops over a BUFFER, or over a CONST) as a numpy array of its shape."""
  if CAPTURING:   # (as tinygrad: a value read on the host while capturing would be baked into the replay)
    raise JitError("cannot access tensor data during JIT capture, the value will be baked in")
  if view.base.op is Ops.CONST: return trim_to_sizes(tensor_eval.evaluate([view])[0], view.sizes)
  return trim_to_sizes(_through_view(view, "a realized value", lambda b: buffer_of(b).host_view())[1], view.sizes)


def device_of(u: UOp, default: str | None = DEFAULT_DEVICE) -> str:
  """Where u's value lives (UOp.device), or `default` for a constant."""
  return u.device or default or default_device()


def view_indices(target: UOp) -> tuple[UOp, np.ndarray]:
  """The buffer under a view and, for each element of the view, its flat position in that buffer.

  The view is a chain of movement ops over a BUFFER. Padding may appear inside
  the chain (strided slices pad and shrink) but no padded position and no
  repeated position may be visible in the view: writing through it must be a
  one-to-one copy. ValueError otherwise."""
  if target.op is Ops.BUFFER or (target.op is Ops.RESHAPE and target.src[0].op is Ops.BUFFER):
    # a whole buffer in order (an optimizer's parameter): nothing to check (the check costs a sort per element)
    b = target if target.op is Ops.BUFFER else target.src[0]
    return b, np.arange(b.arg[-1]).reshape(target.shape)
  if target.sizes is not None:
    raise ValueError("cannot assign through a view whose size is a Variable's (a slice ending at a bound expression)")
  # positions + 1, so that PAD's zeros stand for "no element"
  x, idx = _through_view(target, "assign target", lambda b: np.arange(1, b.arg[-1] + 1))
  idx = idx - 1
  if (idx < 0).any(): raise ValueError("cannot assign through a padded view: some of its elements are padding")
  if np.unique(idx).size != idx.size: raise ValueError("cannot assign through an expanded view: it repeats elements")
  return x, idx


def _toposort(roots: Sequence[UOp]) -> list[UOp]:
  return UOp.sink(*roots).toposort()[:-1]


def realize(uops: Sequence[UOp], devices: Sequence[str] | None = None) -> list[UOp]:
  """For each tensor-level UOp, a realized view (movement ops over a BUFFER) holding its value."""
  done = realize_map(uops, devices)
  return [done.get(u, u) for u in uops]


def realize_map(uops: Sequence[UOp], devices: Sequence[str] | None = None,
                kept: dict[UOp, UOp] | None = None, held=None) -> dict[UOp, UOp]:
  """Realize `uops`; the realized view of each one not realized before, and of every ASSIGN that was carried out.

  `devices[i]` is where uops[i] is stored when its graph names no device (constants only). ASSIGN nodes write
  their value into their target's buffer. In one call every value is computed from the buffers as they were
  before the call's assigns, except through an assign's own result; an output that is a view of a buffer
  computes nothing and shows the buffer as written. A lazy value realized in a later call reads the buffers
  as they are then. An ASSIGN maps to its target view: a tensor still holding it must read the buffer now,
  not write it again (the caller substitutes these in every live graph).

  `kept`, when given, receives the intermediate values of the graphs the kernels stored into buffers of their
  own, each with its realized view (engine/sched/driver.py's `_kept_values`): the caller may substitute those
  in every live graph too, so that no later realize computes them again. `held(nodes)`, when given, says which of
  those values a live graph still holds: the others' buffers are nobody's after the call, and the memory planner
  may give them to other intermediates (engine/memory_plan.py); without it every kept value keeps its buffer."""
  uops = list(uops)
  devices = list(devices) if devices is not None else [default_device()] * len(uops)
  todo = [(u, d) for u, d in zip(uops, devices) if not is_realized(u)]
  if not todo: return {}
  nodes = _toposort([u for u, _ in todo])
  assigns = [a for a in nodes if a.op is Ops.ASSIGN]
  for a in assigns: view_indices(a.src[0])   # rejects padded or expanded targets with a clear error
  done = {a: a.src[0] for a in assigns if a.src[0].base.op is Ops.BUFFER}
  if os.environ.get("RULEC_REALIZE", "") == "eval":
    done.update(_realize_by_evaluation([u for u, _ in todo], [d for _, d in todo], assigns))
    return done
  # a progress line on stderr when this takes over a second and stderr is a terminal (runtime/progress.py)
  with progress.job("realize", "scheduling") as job:
    kernels, views, handed = schedule_cache.schedule_keeping([u for u, _ in todo], default_device(),
                                                             [d for _, d in todo], keep=kept is not None)
    COUNTERS["scheduled"] += len(kernels)
    # intermediates no one sees after this realize share buffers where their lifetimes allow (engine/memory_plan.py):
    # not a buffer the graphs read (inputs, assign targets), nor one under an output's view or a value handed back
    seen = {u for u in nodes if u.op is Ops.BUFFER}
    wanted = held([x for x, _ in handed]) if held is not None and handed else None
    for v in [*views, *(v for x, v in handed if wanted is None or x in wanted)]:
      seen.update(b for b in v.toposort() if b.op is Ops.BUFFER)
    # (not while TinyJit captures: it plans the whole step from each intermediate's own lifetime, which a buffer
    # shared here would blur into one long one)
    if not CAPTURING: kernels = memory_plan.plan(kernels, {b for k in kernels for b in k.bufs if b not in seen})
    job.phase = "compiling kernels"
    prepare(kernels)   # (the CPU builds new kernels' objects in worker processes, runtime/cpu_device.py)
    job.phase, job.total = "running kernels", len(kernels)
    for k in kernels:
      _run(k)
      job.advance()
  done.update((u, v) for (u, _), v in zip(todo, views))
  if kept is not None: kept.update(handed)
  return done


def _realize_by_evaluation(todo: list[UOp], devices: list[str], assigns: list[UOp]) -> dict[UOp, UOp]:
  targets = [view_indices(a.src[0]) for a in assigns]  # checked before anything is written
  values = tensor_eval.evaluate(todo + assigns)
  for (buf, idx), v in zip(targets, values[len(todo):]):
    buffer_of(buf).numpy_view()[idx.reshape(-1)] = v.reshape(-1)
  out: dict[UOp, UOp] = {}
  for u, d, v in zip(todo, devices, values):
    if u.op is Ops.ASSIGN and u.src[0].base.op is Ops.BUFFER: out[u] = u.src[0]; continue
    b = new_buffer(u.device or d, v.size, u.dtype)
    buffer_of(b).copyin(v)
    out[u] = with_sizes(b.reshape(u.shape), u.sizes)
  return out
