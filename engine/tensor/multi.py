"""Tensors on several devices: `shard`, and what the core (base.py) does differently for them.

A sharded tensor's device is a tuple of device names and its graph is built from MSTACK nodes
(`MSTACK(x_0, .., x_n-1)[(axis, devices)]`: x_i is the part on devices[i]; with an axis the value is the
parts joined along it, with axis None each part is the whole value). Every operation builds the same graph
as on one device, with the full shapes; rules/multi.rules turns it into one graph per device when it is
scheduled (docs/multi.md). Realized, a sharded tensor is an MSTACK of buffer views, one per device.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from rulec.engine.ir.ops import Ops
from rulec.engine import realize as _engine
from rulec.engine.sched.multi import copy_to, select, shard_bounds, stack
from rulec.engine.tensor.args import DeviceError, ShapeError, canon_device, norm_axis
from rulec.engine.ir.uop import UOp
from rulec.runtime.buffer import buffer_of, new_buffer

if TYPE_CHECKING: from rulec.engine.tensor.tensor import Tensor


def parts(u: UOp) -> tuple[UOp, ...]:
  """The per-device parts of a stack (a value on one device is its own only part)."""
  return u.src if u.op is Ops.MSTACK else (u,)


def is_realized(u: UOp) -> bool:
  """Nothing left to compute: a realized view, or a stack of them."""
  return all(_engine.is_realized(p) for p in parts(u))


def holds_assign(u: UOp) -> bool: return any(p.op is Ops.ASSIGN for p in parts(u))


def device_set(devices: Any, what: str) -> tuple[str, ...] | str:
  """A device set as given to shard() / to(): a tuple or list of device names (one device is that device)."""
  if not isinstance(devices, (tuple, list)): raise TypeError(f"{what} takes a tuple or list of devices, got {devices!r}")
  return canon_device(devices)


def _own_part(u: UOp, device: str) -> UOp:
  """u as a part on `device`: copied there, or, already there and a view of a buffer, copied into a buffer of its
  own (writing into the sharded tensor must not write into the tensor it was made from)."""
  if u.device == device and u.base.op is Ops.BUFFER: return UOp(Ops.CONTIGUOUS, u.dtype, (u,), tag="copy")
  return copy_to(u, device)


def on_devices(u: UOp, devices: tuple[str, ...]) -> UOp:
  """A value on one device (or a constant) as a stack replicated on `devices`."""
  return stack([_own_part(u, d) for d in devices], None, devices)


def host_buffers(arr: np.ndarray, dt, devices: tuple[str, ...]) -> UOp:
  """Host data uploaded to a buffer on each device: a replicated stack (each device gets its own copy)."""
  views = []
  for d in devices:
    b = new_buffer(d, arr.size, dt)
    buffer_of(b).copyin(arr)
    views.append(b.reshape(arr.shape))
  return stack(views, None, devices)


def fresh_buffers(shape: tuple[int, ...], dt, devices: tuple[str, ...]) -> UOp:
  """A new, unwritten buffer of the whole shape on each device (a replicated stack)."""
  n = 1
  for s in shape: n *= s
  return stack([new_buffer(d, n, dt).reshape(shape) for d in devices], None, devices)


def host_value(u: UOp) -> np.ndarray:
  """The value of a realized stack, read from each device."""
  vals = [np.asarray(_engine.host_value(p)) for p in u.src]
  return vals[0] if u.arg[0] is None else np.concatenate(vals, axis=u.arg[0])


def stored(t: Tensor, u: UOp | None = None) -> UOp:
  """t's uop (or u, a graph of t's) ready to realize: a constant graph on a device set is replicated first (each
  device stores it)."""
  u = t.uop if u is None else u
  if isinstance(t.device, tuple) and u.op is not Ops.MSTACK and u.device is None: u = on_devices(u, t.device)
  return u


def assign_parts(t: Tensor, value: UOp) -> UOp:
  """`t.assign(value)` for a tensor on a device set: each device writes its part of value into its own buffer."""
  devices = t.device
  u = t.uop
  if u.op is Ops.MSTACK and all(p.base.op is Ops.BUFFER for p in u.src): target = u
  elif _is_view(u): raise DeviceError("assign through a view of a sharded tensor is not supported; assign to the whole tensor")
  else: target = fresh_buffers(t.shape, t.dtype, devices)   # a lazy value: it gets storage of its own
  axis, n = target.arg[0], len(devices)
  return stack([UOp(Ops.ASSIGN, t.dtype, (p, select(value, i, axis, n))) for i, p in enumerate(target.src)], axis, devices)


def _is_view(u: UOp) -> bool:
  """Movement ops over a stack of buffer views."""
  while u.op in (Ops.RESHAPE, Ops.PERMUTE, Ops.EXPAND, Ops.PAD, Ops.SHRINK, Ops.FLIP): u = u.src[0]
  return u.op is Ops.MSTACK and all(p.base.op is Ops.BUFFER for p in u.src)


def _shard_axis(t: Tensor) -> int | None:
  """The axis a sharded tensor is split along (None: replicated). A lazy graph's parts are known once the
  multi-device rules have run, so such a tensor is realized first."""
  if t.uop.op is not Ops.MSTACK: t.realize()
  return t.uop.arg[0]


class MultiMixin:
  """Sharding a tensor over several devices."""
  __slots__ = ()

  def shard(self, devices: tuple[str, ...] | list[str], axis: int | None = None) -> Tensor:
    """shard(devices, axis=None): this tensor spread over `devices`: split along `axis` into equal parts, part i
    on devices[i], or, with axis None, a whole copy on each device (replicated). Operations on sharded tensors
    run on every device (docs/multi.md); a reduce over the shard axis ends in an allreduce."""
    devs = device_set(devices, "shard()")
    if isinstance(self.device, tuple): raise DeviceError(f"can't shard a multi-device tensor (on {self.device})")
    if isinstance(devs, str): return self.to(devs)
    u = self.uop
    if axis is None: return type(self)._from_uop(on_devices(u, devs), devs).is_param_(self.is_param)
    ax, n = norm_axis(axis, self.ndim), len(devs)
    if self.shape[ax] % n:
      raise ShapeError(f"multi axis uneven: axis {ax} of shape {self.shape} ({self.shape[ax]}) does not split "
                       f"into {n} equal parts")
    pieces = [_own_part(u.shrink(shard_bounds(self.shape, ax, n, i)), d) for i, d in enumerate(devs)]
    return type(self)._from_uop(stack(pieces, ax, devs), devs).is_param_(self.is_param)

  def shard_like(self, y: Tensor) -> Tensor:
    """shard_like(y): this tensor placed as y is: on y's device, or sharded over y's devices along y's axis."""
    if isinstance(y.device, str): return self.to(y.device)
    axis = _shard_axis(y)
    if isinstance(self.device, tuple) and self.device == y.device and _shard_axis(self) == axis: return self
    if isinstance(self.device, tuple): raise DeviceError(f"shard_like: this tensor is already spread over {self.device}")
    return self.shard(y.device, axis)

  def shard_(self, devices: tuple[str, ...] | list[str], axis: int | None = None) -> Tensor:
    """shard_(devices, axis=None): shard() in place (this tensor becomes the sharded one); returns self."""
    return self.replace(self.shard(devices, axis))
