"""Scheduler pass 0: sharded and replicated values (MSTACK, MSELECT; docs/multi.md) become one value per device.

`split_by_device` runs rules/multi.rules on the targets, which leaves every target either an ordinary value on
one device or an MSTACK of them; an MSTACK target becomes one target per device, and `regroup` puts the
realized views back together in the same MSTACK. Graphs with nothing spread over devices pass untouched.

The rest of the module serves rules/multi.rules (its helpers): the arithmetic of shards (bounds, axes
through a reshape) and the graphs of copies an allgather or an allreduce is made of.

A value spread over devices is `MSTACK(x_0, .., x_{n-1})[(axis, devices)]`: x_i lives on devices[i]; with an
axis the value is the parts joined along it (equal parts), with axis None every part is the whole value.
`MSELECT(v)[(i, axis, n)]` is device i's part of v split n ways along axis (the whole v for None). Every
copy made here copies a value that was computed on its own device (a contiguous buffer), so a copy between
devices is always a whole buffer moved, never a kernel that reads another device's memory.
"""
from __future__ import annotations

import itertools
import os
from typing import Callable

from rulec.engine.lang.capability import rule_helper
from rulec.engine.lang.loader import load_library
from rulec.engine.ir.ops import Ops
from rulec.engine.ir.uop import UOp, prod
from rulec.runtime.devices import separate_memory

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


# *** helpers of rules/multi.rules ***

def stack(parts, axis, devices, dtype=None) -> UOp:
  parts = tuple(parts)
  return UOp(Ops.MSTACK, parts[0].dtype if dtype is None else dtype, parts, (axis, tuple(devices)))


def select(v: UOp, i: int, axis, n: int) -> UOp: return UOp(Ops.MSELECT, v.dtype, (v,), (i, axis, n))


def shard_bounds(shape: tuple[int, ...], axis: int, n: int, i: int) -> tuple[tuple[int, int], ...]:
  """The SHRINK bounds of part i of a value of `shape` split n ways along axis."""
  s = shape[axis] // n
  return tuple((i * s, (i + 1) * s) if a == axis else (0, d) for a, d in enumerate(shape))


@rule_helper
def copy_to(x: UOp, device: str) -> UOp:
  """x on `device`: itself when it is there already or lives nowhere (a constant), else a copy of it computed
  where it is (CONTIGUOUS first, unless it is a buffer already)."""
  if x.device is None or x.device == device: return x
  stored = x.op in (Ops.BUFFER, Ops.COPY, Ops.CONTIGUOUS) or (x.op is Ops.RESHAPE and x.src[0].op is Ops.BUFFER)
  return UOp(Ops.COPY, x.dtype, (x if stored else x.contiguous(),), device)


def _alu(op: Ops, a: UOp, b: UOp) -> UOp:
  return UOp(Ops.OR if op is Ops.ADD and a.dtype.is_bool else op, a.dtype, (a, b))


def _join(pieces: list[UOp], axis: int, total: int) -> UOp:
  """Pieces joined along axis: each padded to the whole, then added. A float piece is padded with -0.0 (negated,
  padded with 0, negated back), the one value adding which changes nothing: padded with +0.0, a -0.0 element of a
  sharded value came back +0.0 once gathered (rulec prove refuted select_resharded, move_gathered, copy_gather)."""
  out, off = None, 0
  for p in pieces:
    n = p.shape[axis]
    pad = tuple((off, total - off - n) if a == axis else (0, 0) for a in range(p.ndim))
    q = -(-p).pad(pad) if p.dtype.is_float else p.pad(pad)
    out = q if out is None else _alu(Ops.ADD, out, q)
    off += n
  return out


@rule_helper
def gathered(m: UOp, device: str) -> UOp:
  """The whole value of the stack m on one device: a part already there, or every part copied there and
  joined (an allgather's share for that device)."""
  axis, devices = m.arg
  if axis is None:
    return m.src[devices.index(device)] if device in devices else copy_to(m.src[0], device)
  return _join([copy_to(x, device) for x in m.src], axis, m.shape[axis])


@rule_helper
def shard_of(x: UOp, sel: tuple) -> UOp:
  """Part i of the whole value x (on the right device already, or a constant), for MSELECT's arg (i, axis, n)."""
  i, axis, n = sel
  return x if axis is None else x.shrink(shard_bounds(x.shape, axis, n, i))


@rule_helper
def on_each_device(x: UOp) -> UOp | None:
  """An elementwise op with sharded sources as a stack of the op on each device. The parts follow the first
  sharded source's axis (replicated if none is); every source is asked for its part with MSELECT, which the
  select rules resolve: a source sharded alike gives its part, a replicated one or a constant is sliced where
  it is, one sharded another way is gathered first. None (no rewrite) when sources live on other device sets
  or on a single device: the scheduler reports that mix."""
  stacks = [s for s in x.src if s.op is Ops.MSTACK]
  devices = stacks[0].arg[1]
  if any(s.arg[1] != devices for s in stacks) or any(s.op is not Ops.MSTACK and s.device is not None for s in x.src):
    return None
  axis = next((s.arg[0] for s in stacks if s.arg[0] is not None), None)
  n = len(devices)
  parts = [x.replace(src=tuple(select(s, i, axis, n) for s in x.src)) for i in range(n)]
  return stack(parts, axis, devices, x.dtype)


@rule_helper
def each_part(m: UOp, x: UOp, axis) -> UOp:
  """x (an op whose first source is the stack m) applied to each part of m; the result is sharded along axis."""
  return stack([x.replace(src=(p,) + x.src[1:]) for p in m.src], axis, m.arg[1], x.dtype)


@rule_helper
def same_memory(a, b) -> bool:
  """Whether a kernel on device a may read a buffer of device b in place (rulec.runtime.devices.separate_memory)."""
  return not (isinstance(a, str) and isinstance(b, str) and separate_memory(a, b))


# *** movement ***

@rule_helper
def keeps_shards(x: UOp, m: UOp) -> bool:
  """A PAD, SHRINK, FLIP or EXPAND that leaves the shard axis alone (each device moves its own part)."""
  axis = m.arg[0]
  if axis is None or x.op is Ops.EXPAND: return True
  a = x.arg[axis]
  return a == (0, 0) if x.op is Ops.PAD else a == (0, m.shape[axis]) if x.op is Ops.SHRINK else not a


@rule_helper
def moved_locally(x: UOp, m: UOp) -> UOp:
  """x applied to each part, its argument on the shard axis made the identity of the part."""
  axis, devices = m.arg
  if axis is None: return each_part(m, x, None)
  local = m.src[0].shape[axis]
  arg = list(x.arg)
  arg[axis] = {Ops.PAD: (0, 0), Ops.SHRINK: (0, local), Ops.FLIP: False, Ops.EXPAND: local}[x.op]
  return stack([p.f(x.op, arg=tuple(arg)) for p in m.src], axis, devices)


@rule_helper
def within_one_shard(x: UOp, m: UOp) -> int | None:
  """The part a SHRINK on the shard axis takes all its elements from, or None."""
  axis = m.arg[0]
  if axis is None: return None
  lo, hi = x.arg[axis]
  s = m.src[0].shape[axis]
  return lo // s if hi > lo and lo // s == (hi - 1) // s else None


@rule_helper
def one_shard(x: UOp, m: UOp, j: int) -> UOp:
  """A SHRINK inside part j: that part shrunk where it lives, then copied to every device (replicated)."""
  axis, devices = m.arg
  s = m.src[0].shape[axis]
  piece = m.src[j].shrink(tuple((lo - j * s, hi - j * s) if a == axis else (lo, hi) for a, (lo, hi) in enumerate(x.arg)))
  return stack([copy_to(piece, d) for d in devices], None, devices)


@rule_helper
def on_gathered(x: UOp, m: UOp) -> UOp:
  """x applied on every device to the whole value, gathered there: what is left when x mixes the parts."""
  return stack([x.replace(src=(gathered(m, d),) + x.src[1:]) for d in m.arg[1]], None, m.arg[1], x.dtype)


@rule_helper
def reshaped_axis(x: UOp, m: UOp) -> int | None:
  """Where the shard axis of m goes through the reshape x, when each part stays a contiguous block of the
  reshaped value: an axis of the new shape with the same number of elements before it, divisible by the
  device count. None when no axis keeps the parts apart (the reshape moves elements between devices)."""
  axis, devices = m.arg
  before = prod(m.shape[:axis])
  for b, d in enumerate(x.arg):
    if prod(x.arg[:b]) == before and d % len(devices) == 0: return b
  return None


@rule_helper
def reshape_each(x: UOp, m: UOp, b: int) -> UOp:
  n = len(m.arg[1])
  local = tuple(d // n if a == b else d for a, d in enumerate(x.arg))
  return stack([p.reshape(local) for p in m.src], b, m.arg[1])


@rule_helper
def permuted(x: UOp, m: UOp) -> UOp:
  axis = m.arg[0]
  return each_part(m, x, None if axis is None else x.arg.index(axis))


# *** copies ***

@rule_helper
def copied_to_devices(x: UOp, devices: tuple) -> UOp:
  """COPY(x) to a device set: a stack with x on each of them (a stack on other devices keeps its axis when the
  counts agree, and is gathered onto each otherwise)."""
  if x.op is not Ops.MSTACK: return stack([copy_to(x, d) for d in devices], None, devices)
  if x.arg[1] == devices: return x
  if len(x.arg[1]) == len(devices): return stack([copy_to(p, d) for p, d in zip(x.src, devices)], x.arg[0], devices)
  return stack([gathered(x, d) for d in devices], None, devices)


# *** gradients (rules/gradient.rules) ***

@rule_helper
def unselected(s: UOp, g: UOp, devices: tuple) -> UOp:
  """The gradient of MSELECT(v)[(i, axis, n)] for v: g as part i and zeros elsewhere; for a whole copy (axis None)
  g itself, on every device."""
  i, axis, _ = s.arg
  if axis is None: return stack([copy_to(g, d) for d in devices], None, devices)
  return stack([g if j == i else g.const_like(0) for j in range(len(devices))], axis, devices)


# *** allreduce ***

def _ring_setting() -> tuple[int, int]:
  """RULEC_RING: 0 never the ring, 1 (default) when it pays, 2 always; RULEC_RING_THRESHOLD: elements."""
  return int(os.environ.get("RULEC_RING", "1") or 1), int(os.environ.get("RULEC_RING_THRESHOLD", "256000") or 256000)


@rule_helper
def ring_wanted(r: UOp, m: UOp) -> bool:
  """tinygrad's choice: the ring beats copying everything everywhere only for more than two devices and big
  values (256k elements); RULEC_RING=2 forces it, 0 forbids it."""
  mode, threshold = _ring_setting()
  n, size = len(m.src), prod(r.shape)
  if size < n: return False   # (every device must get a chunk)
  return mode >= 2 or (mode >= 1 and n > 2 and size > threshold)


def _partials(r: UOp, m: UOp) -> list[UOp]:
  """Each device's reduce of its own part, stored there (it is read by copies)."""
  return [r.replace(src=(p,)).contiguous() for p in m.src]


@rule_helper
def allreduce_naive(r: UOp, m: UOp) -> UOp:
  """Every device reduces its part, copies every other device's result to itself and combines them all, in
  device order (so every device computes the bit-identical value): n * (n - 1) copies of the whole result."""
  devices, op = m.arg[1], r.arg[0]
  parts = _partials(r, m)
  out = []
  for d in devices:
    acc = None
    for p in parts:
      q = copy_to(p, d)
      acc = q if acc is None else _alu(op, acc, q)
    out.append(acc)
  return stack(out, None, devices)


def _chunks(size: int, n: int) -> list[tuple[int, int]]:
  """n contiguous chunks of range(size), multiples of a small power of two where that divides."""
  f = next((f for f in (32, 16, 8, 4, 2) if size % f == 0 and size // f >= n), 1)
  base, extra = divmod(size // f, n)
  sizes = [(base + (1 if i < extra else 0)) * f for i in range(n)]
  return list(itertools.pairwise(itertools.accumulate(sizes, initial=0)))


@rule_helper
def allreduce_ring(r: UOp, m: UOp) -> UOp:
  """The result split into one chunk per device. Reduce-scatter: chunk c starts on device c and travels the ring,
  each device adding its own share of it, so it is complete on device c - 1 after n - 1 steps. Allgather: each
  complete chunk travels on around the ring to every other device. Each device then joins the chunks.
  2 * n * (n - 1) copies, each of 1/n of the result: every device sends and receives 2 (n - 1) / n of it."""
  devices, op = m.arg[1], r.arg[0]
  n, size = len(devices), prod(r.shape)
  flat = [p.reshape((size,)) for p in _partials(r, m)]
  chunks = _chunks(size, n)
  have: list[dict[int, UOp]] = [{} for _ in range(n)]   # device -> chunk index -> that complete chunk there
  for c, (lo, hi) in enumerate(chunks):
    acc = flat[c].shrink(((lo, hi),))
    for step in range(1, n):
      d = (c + step) % n
      acc = _alu(op, copy_to(acc, devices[d]), flat[d].shrink(((lo, hi),)))
    at = (c + n - 1) % n
    have[at][c] = acc
    for step in range(1, n):
      d = (at + step) % n
      acc = copy_to(acc, devices[d])
      have[d][c] = acc
  return stack([_join([have[d][c] for c in range(n)], 0, size).reshape(r.shape) for d in range(n)], None, devices)


__all__ = ["stack", "select", "shard_bounds", "copy_to", "gathered", "shard_of", "on_each_device", "each_part",
           "keeps_shards", "moved_locally", "within_one_shard", "one_shard", "on_gathered", "reshaped_axis",
           "reshape_each", "permuted", "copied_to_devices", "ring_wanted", "allreduce_naive", "allreduce_ring", "unselected", "same_memory"]
