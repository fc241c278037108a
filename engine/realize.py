"""Realizing tensor-level graphs: turning lazy values into buffers.

`realize` schedules the graphs into kernels (engine/schedule.py, every
rewrite a rule in rules/) and runs the kernels on their device. The numpy
interpreter of tensor graphs (`engine.tensor_eval`) is the oracle tests
compare against; `RULEC_REALIZE=eval` makes realize use it instead.
"""
from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from engine import schedule as _scheduler
from engine import tensor_eval
from engine.sched.tensor_helpers import is_buffer_view
from runtime.devices import default_device, run_kernel
from engine.ops import MOVEMENT, Ops
from engine.uop import UOp
from runtime.buffer import buffer_of, new_buffer

__all__ = ["COUNTERS", "schedule", "realize", "is_realized", "device_of", "view_indices", "DEFAULT_DEVICE"]

# kernels scheduled / compiled / run (the evaluator path runs no kernels, so it counts nothing)
COUNTERS = {"scheduled": 0, "compiled": 0, "run": 0}

DEFAULT_DEVICE = default_device()


def schedule(uops: Sequence[UOp]):
  """The kernels that realizing `uops` would run."""
  kernels, _ = _scheduler.schedule(list(uops), default_device())
  COUNTERS["scheduled"] += len(kernels)
  return kernels


def _run(kernel) -> None:
  # a kernel runs on the device of the buffer it writes (slot 0: the store target is numbered first)
  run_kernel(kernel, kernel.bufs[0].arg[1] if kernel.bufs else default_device())
  COUNTERS["run"] += 1


# a whole buffer, or a plain reshape of one: the value is stored, nothing to compute
is_realized = is_buffer_view


def device_of(u: UOp, default: str = DEFAULT_DEVICE) -> str:
  """Where u's value lives (UOp.device), or `default` for a constant."""
  return u.device or default


def view_indices(target: UOp) -> tuple[UOp, np.ndarray]:
  """The buffer under a view and, for each element of the view, its flat position in that buffer.

  The view is a chain of movement ops over a BUFFER. Padding may appear inside
  the chain (strided slices pad and shrink) but no padded position and no
  repeated position may be visible in the view: writing through it must be a
  one-to-one copy. ValueError otherwise."""
  chain = []
  x = target
  while x.op in MOVEMENT:
    chain.append(x)
    x = x.src[0]
  if x.op is not Ops.BUFFER: raise ValueError(f"assign target must be a view of a buffer, not of {x.op.name}")
  idx = np.arange(1, x.arg[-1] + 1)  # positions + 1, so that PAD's zeros stand for "no element"
  for m in reversed(chain): idx = tensor_eval.apply_movement(m.op, m.arg, idx)
  idx = idx - 1
  if (idx < 0).any(): raise ValueError("cannot assign through a padded view: some of its elements are padding")
  if np.unique(idx).size != idx.size: raise ValueError("cannot assign through an expanded view: it repeats elements")
  return x, idx


def _toposort(roots: Sequence[UOp]) -> list[UOp]:
  return UOp.sink(*roots).toposort()[:-1]


def realize(uops: Sequence[UOp]) -> list[UOp]:
  """For each tensor-level UOp, a realized view (`BUFFER.reshape(shape)`) holding its value.

  Already realized inputs come back unchanged. ASSIGN nodes write their value
  into their target's buffer; reads of that buffer elsewhere in the same call
  see the old contents.
  """
  uops = list(uops)
  if os.environ.get("RULEC_REALIZE", "") != "eval":
    todo = [u for u in uops if not is_realized(u)]
    if not todo: return uops
    for a in _toposort(todo):
      if a.op is Ops.ASSIGN: view_indices(a.src[0])   # rejects padded or expanded targets with a clear error
    kernels, views = _scheduler.schedule(todo, default_device())
    COUNTERS["scheduled"] += len(kernels)
    for k in kernels: _run(k)
    it = iter(views)
    return [u if is_realized(u) else next(it) for u in uops]
  return _realize_by_evaluation(uops)


def _realize_by_evaluation(uops: list[UOp]) -> list[UOp]:
  todo = [u for u in uops if not is_realized(u)]
  if not todo: return uops
  assigns = [u for u in _toposort(todo) if u.op is Ops.ASSIGN]
  targets = [view_indices(a.src[0]) for a in assigns]  # checked before anything is written
  values = tensor_eval.evaluate(todo + assigns)
  vals = dict(zip(map(id, todo), values[:len(todo)]))
  for (buf, idx), v in zip(targets, values[len(todo):]):
    buffer_of(buf).numpy_view()[idx.reshape(-1)] = v.reshape(-1)
  out: list[UOp] = []
  for u in uops:
    if is_realized(u): out.append(u); continue
    if u.op is Ops.ASSIGN and is_realized(u.src[0]): out.append(u.src[0]); continue
    v = vals[id(u)]
    b = new_buffer(device_of(u), v.size, u.dtype)
    buffer_of(b).copyin(v)
    out.append(b.reshape(u.shape))
  return out
