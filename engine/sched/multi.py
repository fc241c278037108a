"""Scheduler pass 0: sharded and replicated values (MSTACK, MSELECT; docs/multi.md) become one value per device.

`split_by_device` runs rules/multi.rules on the targets, which leaves every target either an ordinary value on
one device or an MSTACK of them; an MSTACK target becomes one target per device, and `regroup` puts the
realized views back together in the same MSTACK. Graphs with nothing spread over devices pass untouched.
"""
from __future__ import annotations

from typing import Callable

from engine.lang.loader import load_library
from engine.ops import Ops
from engine.uop import UOp
from runtime.devices import separate_memory

_MULTI = (Ops.MSTACK, Ops.MSELECT)


class MultiDeviceError(ValueError, RuntimeError):
  """A value on one device (or device set) meets a value spread over another: nothing moves it."""


def _spread(u: UOp) -> bool: return u.op in _MULTI or isinstance(u.device, tuple)


def _needs_pass(u: UOp) -> bool:
  """Something the multi rules rewrite: a value spread over devices, or a copy of a computed value between
  devices that keep their memory apart (it is stored where it is first)."""
  if _spread(u): return True
  if u.op is not Ops.COPY or not isinstance(u.arg, str) or not isinstance(d := u.src[0].device, str): return False
  x = u.src[0]
  stored = x.op in (Ops.BUFFER, Ops.COPY, Ops.CONTIGUOUS) or (x.op is Ops.RESHAPE and x.src[0].op is Ops.BUFFER)
  return not stored and separate_memory(u.arg, d)


def split_by_device(targets: list[UOp], devices: list[str], run_pass: Callable) -> tuple[list[UOp], list[str], Callable]:
  """(targets with each MSTACK split into its parts, the device of each, regroup(views) -> one view per target)."""
  if not any(_needs_pass(u) for u in UOp.sink(*targets).toposort()): return targets, devices, lambda views: views
  sink = run_pass("multi", UOp.sink(*targets), load_library().matcher("multi"))
  flat: list[UOp] = []
  flat_devices: list[str] = []
  groups: list[UOp | None] = []
  for t, d in zip(sink.src, devices):
    if t.op is Ops.MSTACK:
      groups.append(t)
      flat.extend(t.src)
      flat_devices.extend(t.arg[1])
    else:
      groups.append(None)
      flat.append(t)
      flat_devices.append(d)
  for t in flat:
    for u in t.toposort():
      if _spread(u): raise MultiDeviceError(_leftover(u))
  def regroup(views: list[UOp]) -> list[UOp]:
    out, i = [], 0
    for g in groups:
      if g is None: out.append(views[i]); i += 1
      else:
        out.append(UOp(Ops.MSTACK, g.dtype, tuple(views[i:i + len(g.src)]), g.arg))
        i += len(g.src)
    return out
  return flat, flat_devices, regroup


def _leftover(u: UOp) -> str:
  """What a graph the multi rules could not split mixes."""
  where = sorted({str(s.device) for s in u.src if s.device is not None})
  return (f"{u.op.name} of shape {u._shape} mixes values on {' and '.join(where) or 'no device'}: a value spread over "
          "devices can only meet values on the same devices (or constants); move one with .to() or .shard()")
