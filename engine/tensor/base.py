"""The core every Tensor shares: its graph and device, construction from host data, realizing, assign.

Realizing replaces a tensor's uop with the realized view (`BUFFER.reshape(shape)`), so later graphs start from the
buffer; `_became` carries an executed assign over to every live tensor that holds it."""
from __future__ import annotations

import contextlib
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from rulec.engine import realize as _engine
from rulec.engine.ir.dtypes import DType
from rulec.engine.ir.ops import MOVEMENT, Ops
from rulec.engine.ir.rewrite import substitute
from rulec.engine.sched.early import is_buffer_view
from rulec.engine.sched.multi import copy_to
from rulec.engine.tensor import history as _history
from rulec.engine.tensor import inplace as _inplace
from rulec.engine.tensor import multi as _multi
from rulec.engine.tensor import writes as _writes
from rulec.engine.tensor.args import DeviceError, broadcast_shapes, canon_device, cast_scalar, is_py_scalar, to_dtype, to_numpy
from rulec.engine.tensor.uops import bcast, const
from rulec.engine.ir.uop import UOp, prod
from rulec.runtime.buffer import buffer_of, new_buffer
from rulec.runtime.devices import separate_memory

if TYPE_CHECKING: from rulec.engine.tensor.tensor import Tensor


def _became(done: dict[UOp, UOp], plan: _inplace.Plan | None = None) -> None:
  """After a realize: every live tensor whose graph holds an assign that was carried out reads the assigned
  buffer from now on, so no assign is carried out twice.

  Other tensors that happen to hold the same graph as a realized one (UOps are hash-consed: two
  `Tensor.full((2, 3), -2)` are one node) keep it and compute it again: sharing the buffer would let an assign
  into one of them change the other."""
  assigned = {u: v for u, v in done.items() if u.op is Ops.ASSIGN}
  if not assigned: return
  _writes.carried_out(assigned)
  # a buffer written over no longer holds what its graph computed, and a graph that reads a buffer written over
  # no longer computes what it did: a write that takes part in autograd gives the buffer the graph of its new
  # contents and those graphs the old contents (engine/tensor/inplace.py); any other drops both
  written = {v.base for v in assigned.values()}
  if plan is None: _history.forget_written(written, _multi.parts)
  else: plan.settle(written, _multi.parts)
  for t in list(_LIVE):
    u = t.uop
    if u in assigned: t.uop = assigned[u]
    elif not _engine.is_realized(u):
      new = _writes.substitute(u, assigned)
      if new is not u: t.uop = new


def _hand_back(kept: dict[UOp, UOp]) -> None:
  """After a realize: every live graph that holds an intermediate value the kernels stored into a buffer of its
  own reads that buffer from now on (tinygrad's becomes map), so no later realize computes the value again. A
  model that realizes each layer's KV-cache write (LLaMA, GPT-2) would otherwise compute every layer below the
  one being written, once per layer.

  The buffer keeps the value's graph as its history (autograd reads through it). A value that several live
  tensors hold as themselves (or as a view of themselves) is handed to none of them and to no graph: sharing the
  buffer would let an assign into one tensor change the others (as `_became` keeps realized outputs apart)."""
  if not kept: return
  live = [t for t in list(_LIVE) if not _engine.is_realized(t.uop)]
  views_of: dict[UOp, int] = {}
  for t in live:
    b = t.uop
    while b.op in MOVEMENT: b = b.src[0]
    if b in kept: views_of[b] = views_of.get(b, 0) + 1
  mapping = {x: v for x, v in kept.items() if views_of.get(x, 0) <= 1}
  if not mapping: return
  memo: dict[UOp, UOp] = {}
  for t in live:
    # (nothing inside an ASSIGN: a pending write is known by its node, engine/tensor/writes.py; its value
    # computes what it reads again)
    new = substitute(t.uop, mapping, memo, frozen=lambda x: x.op is Ops.ASSIGN)
    if new is not t.uop: t.uop = new
  # (a kept value's history is its graph over the other kept values' buffers: short, and it keeps no buffer below
  # them alive)
  for x, v in mapping.items():
    if memo.get(x) is v: _history.record(v, x.replace(src=tuple(memo.get(s, s) for s in x.src)))


def _held(targets: list[UOp]):
  """For realize_map: which of the intermediate values of a realize of `targets` a live graph still holds after it
  (those are handed back to the graphs, _hand_back; the others' buffers may be reused, engine/memory_plan.py). A
  tensor that is a target becomes its buffer; any other graph keeps what it holds, a target's graph included
  (_became replaces only assigns: another tensor holding a realized graph computes it again, from the buffers the
  values under it are handed)."""
  def held(nodes: list[UOp]) -> set[UOp]:
    want, stop, found, seen = set(nodes), set(targets), set(), set()
    for t in list(_LIVE):
      if t.uop in stop: continue
      for x in t.uop.toposort(lambda x: x not in seen and x.op is not Ops.BUFFER):
        seen.add(x)
        if x in want: found.add(x)
    return found
  return held


def visible_buffer_ids() -> set[int]:
  """The ids of every buffer a live tensor can still read: in its graph (realized or not), or through a kept history
  (autograd). TinyJit's capture plans the memory of the other buffers its kernels touch (engine/memory_plan.py)."""
  out = _history.read_by_any()
  seen: set[UOp] = set()
  for t in list(_LIVE):
    for u in t.uop.toposort(lambda u: u not in seen):
      seen.add(u)
      if u.op is Ops.BUFFER: out.add(u.arg[0])
  return out


def _carry_out(writes: list[UOp]) -> None:
  """Carry out pending writes one realize each, in order (each reads the buffers as the ones before left them)."""
  done: dict[UOp, UOp] = {}
  for w in writes:
    now = _writes.substitute(w, done)
    plan = _inplace.plan([now])
    extra, devices = plan.extra() if plan is not None else ([], [])
    kept: dict[UOp, UOp] = {}
    result = _engine.realize_map([now, *extra], [w.src[0].base.arg[1], *devices], kept, _held([now, *extra]))
    if plan is not None: plan.realized(result)
    result[w] = done[w] = result.get(now, now.src[0])
    _became(result, plan)
    _hand_back(kept)


def is_advanced_index(it: Any) -> bool:
  """An index item for advanced (gather-like) indexing: a Tensor, a list, or a numpy array that is not 0-d."""
  return isinstance(it, (TensorBase, list)) or (isinstance(it, np.ndarray) and it.ndim > 0)


# every live Tensor: realizing one graph updates every tensor whose graph holds what was realized
_LIVE: weakref.WeakSet = weakref.WeakSet()
# (the histories keep only what can still lead a gradient to one of these: engine/tensor/history.py's prune)
_history.live_values = lambda: [t.uop for t in list(_LIVE)]
_history.grad_values = lambda: [t.uop for t in list(_LIVE) if t.requires_grad is True]
_history.held_values = lambda: {u for t in list(_LIVE) for u in t.uop.toposort()}



class _Mode(contextlib.ContextDecorator):
  """A context manager (or decorator: `@Tensor.train()`) that sets a class flag (Tensor.training) for its block
  and restores it after."""
  def __init__(self, cls: type, flag: str, value: bool): self.cls, self.flag, self.value = cls, flag, value

  def __enter__(self):
    self.prev = getattr(self.cls, self.flag)
    setattr(self.cls, self.flag, self.value)
    return self

  def __exit__(self, *exc): setattr(self.cls, self.flag, self.prev)


class TensorBase:
  """What every Tensor is: a tensor-level UOp graph, the device its value lives on, and how it is realized.
  The operations come from the family mixins (engine/tensor/tensor.py puts them together)."""
  # grad: the accumulated gradient (autograd.py); requires_grad: None (any float tensor gets one, as tinygrad),
  # True, or False (no gradient flows into or through it). What a realized tensor was computed from is kept by
  # engine/tensor/history.py (its `_forward`), so backward() still works after the loss was printed. is_param:
  # tinygrad 0.14's optimizer flag (True unless is_param_(False)): an optimizer updates the tensors that have it
  __slots__ = ("uop", "device", "grad", "requires_grad", "is_param", "__weakref__")
  _rng: np.random.Generator = np.random.default_rng()
  no_grad: bool = False   # older tinygrad's switch: tensors made while it is True get requires_grad=False
  training: bool = False  # training mode: dropout drops, BatchNorm uses and updates batch statistics

  @classmethod
  def train(cls, mode: bool = True) -> _Mode:
    """`with Tensor.train():` runs its block in training mode (`Tensor.training` is True), then restores it."""
    return _Mode(cls, "training", bool(mode))

  @classmethod
  def test(cls) -> _Mode:
    """`with Tensor.test():` runs its block out of training mode."""
    return _Mode(cls, "training", False)

  def __init__(self, data: Any, device: str | None = None, dtype: Any = None, requires_grad: bool | None = None):
    """tinygrad's signature. For rulec code that passed the dtype second, a dtype there is taken as the dtype."""
    _LIVE.add(self)
    self.grad, self.is_param = None, True
    self.requires_grad = False if requires_grad is None and type(self).no_grad else requires_grad
    if device is not None and not isinstance(device, (str, tuple, list)): device, dtype = dtype, device
    dt = None if dtype is None else to_dtype(dtype)
    if isinstance(data, TensorBase):
      t = data if dt is None else data.cast(dt)
      t = t if device is None else t.to(device)
      self.uop, self.device = t.uop, t.device
      return
    dev = canon_device(device)
    if isinstance(data, UOp) and data.is_symbolic: data = int(data)   # (a bound Variable: a 0-d tensor of its value)
    if isinstance(data, UOp):
      self.uop, self.device = (data if dt is None else data.cast(dt)), dev
      return
    arr, dt = to_numpy(data, dt)
    if isinstance(dev, tuple):   # a device set: the data goes to every device
      self.uop, self.device = _multi.host_buffers(arr, dt, dev), dev
      return
    buf = new_buffer(dev, arr.size, dt)
    buffer_of(buf).copyin(arr)
    self.uop, self.device = buf.reshape(arr.shape), dev

  @classmethod
  def _from_uop(cls, u: UOp, device: str) -> Tensor:
    t = object.__new__(cls)
    t.uop, t.device = u, device
    t.grad, t.requires_grad, t.is_param = None, (False if cls.no_grad else None), True
    _LIVE.add(t)
    return t

  def _new(self, u: UOp) -> Tensor: return type(self)._from_uop(u, self.device)

  def is_param_(self, is_param: bool = True) -> Tensor:
    """is_param_(is_param=True): set tinygrad 0.14's optimizer flag and return self. An optimizer given this tensor
    updates it when is_param is True (every tensor starts so) and only realizes it, as a buffer, when False
    (BatchNorm's running statistics, a rotary table). Gradients do not depend on it (requires_grad does that)."""
    self.is_param = bool(is_param)
    return self

  def _lift(self, x: Any) -> Tensor:
    """x as a Tensor on this tensor's device (Tensors are returned as they are)."""
    return x if isinstance(x, TensorBase) else type(self)(x, device=self.device)

  # *** properties ***

  @property
  def shape(self) -> tuple[int, ...]:
    """The tensor's shape, a tuple of ints."""
    return self.uop.shape
  @property
  def dtype(self) -> DType:
    """The element type (a `dtypes` member)."""
    return self.uop.dtype
  @property
  def ndim(self) -> int:
    """The number of axes."""
    return len(self.shape)
  def numel(self) -> int:
    """The number of elements."""
    return prod(self.shape)
  @property
  def max_shape(self) -> tuple[int, ...]:
    """tinygrad's shape with symbolic sizes at their maximum; rulec's shapes are all concrete, so the shape."""
    return self.shape
  def max_numel(self) -> int:
    """The number of elements of `max_shape` (numel(): rulec's shapes are concrete)."""
    return self.numel()
  @property
  def T(self) -> Tensor:
    """The axes reversed (a view)."""
    return self.permute(tuple(range(self.ndim))[::-1])

  def __repr__(self) -> str:
    return f"<Tensor shape={self.shape} dtype={self.dtype.name} device={self.device!r}>"

  def __len__(self) -> int:
    """The size of the first axis (TypeError for a 0-d tensor)."""
    if self.ndim == 0: raise TypeError("len() of a 0-d tensor")
    return self.shape[0]

  def __iter__(self):
    """The sub-tensors along the first axis."""
    for i in range(len(self)): yield self[i]

  __hash__ = object.__hash__

  def __bool__(self) -> bool:
    """The truth of a one-element tensor (realizes it)."""
    if self.numel() != 1:
      raise ValueError(f"the truth value of a tensor of shape {self.shape} is ambiguous; use .any() or .all()")
    return bool(self.item())

  def __float__(self) -> float:
    """float() of a one-element tensor."""
    return float(self.item())
  def __int__(self) -> int:
    """int() of a one-element tensor."""
    return int(self.item())


  def realize(self, *others: Tensor) -> Tensor:
    """Compute this tensor (and others: `Tensor.realize(a, b, c)`) into buffers; returns self.

    Writes through views pending on a buffer these read are carried out first (engine/tensor/writes.py).

    A write realized here (`cache[:, pos].assign(kv).realize()`) into a realized tensor, where no gradient could
    flow through it to a tensor that requires one (requires_grad True), is carried out as a constant for autograd:
    tinygrad's realize cuts the graph there too. Otherwise a loop that writes a buffer from weights nobody trains
    (a decoder's KV cache) would keep each step's graph as the buffer's history, and copy the buffer before every
    write for the histories that read it (engine/tensor/inplace.py). Writes realized any other way (setitem,
    reading a value) keep their history, as before."""
    for t in (self, *others):
      u = t.uop if isinstance(t, TensorBase) else None
      if (u is not None and u.op is Ops.ASSIGN and u.src[0].base.op is Ops.BUFFER and _writes.noted(u) is not None
          and not _history.leads_to_gradient(u)):
        _writes.note(u, False)
    self._realize(*others)
    # a value that folded to a constant while scheduling (a matmul over an empty axis: zeros) was realized as that
    # constant; asked for by realize(), it gets storage as a constant does, so that a view of it can be written
    # through (`v = (a @ b).realize(); v.reshape(3).assign(5)` changes v, as in tinygrad). One fill kernel.
    folded = [t for t in (self, *others) if t.uop.base.op is Ops.CONST and not isinstance(t.device, tuple)]
    if folded: folded[0]._realize(*folded[1:])
    return self

  def _realize(self, *others: Tensor, hand_back: bool = True) -> Tensor:
    """realize() for the front end's own uses: every write keeps the history it was noted with. `hand_back` False
    leaves the other live graphs as they are (no intermediate value stored here is handed to them): a realize the
    user did not ask for must not change what their lazy values compute (engine/tensor/autograd.py _settled)."""
    ts = (self, *others)
    for t in ts:
      if not isinstance(t, TensorBase): raise TypeError(f"realize() takes Tensors, got {type(t).__name__}")
      # a tensor that is a buffer a whole-buffer write waits on holds that write (b[:].assign(x))
      if (w := _writes.whole(t.uop)) is not None: t.uop = w
    if (first := _writes.before([t.uop for t in ts])): _carry_out(first)   # (a realized tensor reads its buffer too)
    pending = _pending(ts, "realize")
    todo = []
    for t, u in pending:
      t.uop = u
      todo.append(t)
    if todo:
      uops = _kept_apart([t.uop for t in todo])
      # (a device set's parts say where they live: the device here is for values that live nowhere)
      devices = [t.device if isinstance(t.device, str) else t.device[0] for t in todo]
      # (copies of old contents that the gradients through the writes carried out here will read)
      plan = _inplace.plan(uops)
      extra, extra_devices = plan.extra() if plan is not None else ([], [])
      kept: dict[UOp, UOp] = {}
      done = _engine.realize_map(uops + extra, devices + extra_devices, kept if hand_back else None,
                                 _held(uops + extra) if hand_back else None)
      if plan is not None: plan.realized(done)
      for t, u in zip(todo, uops):
        graph = t.uop
        t.uop = done.get(u, u)
        # (an assign is kept as its buffer's history, by the plan)
        if not _multi.holds_assign(u): _history.record(t.uop, graph if plan is None else plan.history(graph))
      _became(done, plan)
      _hand_back(kept)   # (empty without hand_back: realize_map was given no dict to fill)
    return self

  def schedule(self, *others: Tensor):
    """The kernels realizing these tensors would run (`Tensor.schedule(a, b)`)."""
    todo = _pending((self, *others), "schedule")   # (what realize() would compute, the tensors left as they are)
    return _engine.schedule(_kept_apart([u for _, u in todo]),
                            [t.device if isinstance(t.device, str) else t.device[0] for t, _ in todo])

  def numpy(self) -> np.ndarray:
    """The value as a new numpy array (realizes the tensor)."""
    self._realize()
    if self.uop.op is Ops.MSTACK: return np.array(_multi.host_value(self.uop), copy=True).reshape(self.shape)
    a = np.array(_engine.host_value(self.uop), copy=True)
    return a if self.uop.sizes is not None else a.reshape(self.shape)   # (a size that is a Variable's: its value)

  def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
    """numpy's conversion protocol: np.asarray(t) (realizes the tensor)."""
    a = self.numpy()
    return a if dtype is None else a.astype(dtype)

  def tolist(self) -> Any:
    """The value as nested Python lists (realizes the tensor)."""
    return self.numpy().tolist()

  def item(self) -> Any:
    """The Python scalar of a one-element tensor (realizes it)."""
    if self.numel() != 1: raise ValueError(f"item() needs a tensor with exactly one element, got shape {self.shape}")
    return self.numpy().reshape(()).item()

  def to(self, device: str | tuple[str, ...]) -> Tensor:
    """This value on another device ('CPU', 'CL', 'NUMPY', with an index: 'CPU:1'; a lazy copy). A tuple of
    devices replicates it on each (`shard(devices)`); a sharded tensor to one device is gathered there."""
    d = canon_device(device)
    if d == self.device: return self
    if isinstance(d, tuple) and not isinstance(self.device, tuple): return self.shard(d)
    if isinstance(d, str) and isinstance(self.device, str) and separate_memory(self.device, d):
      return type(self)._from_uop(copy_to(self.uop, d), d).is_param_(self.is_param)   # computed where it is, then the buffer moves
    return type(self)._from_uop(UOp(Ops.COPY, self.dtype, (self.uop,), d), d).is_param_(self.is_param)

  def contiguous(self) -> Tensor:
    """This value laid out in order in a buffer. A realized tensor that already is (a whole buffer) is returned
    as itself, sharing the buffer, as in tinygrad and torch; `clone()` always copies."""
    return self._new(self.uop if is_buffer_view(self.uop) else self.uop.contiguous())
  def detach(self) -> Tensor:
    """The same value with no gradient flowing through it."""
    return self._new(UOp(Ops.DETACH, self.dtype, (self.uop,)))
  def clone(self) -> Tensor:
    """A copy in a buffer of its own (contiguous() of a realized tensor is that tensor's buffer; this never is)."""
    return self._new(UOp(Ops.CONTIGUOUS, self.dtype, (self.uop,), tag="copy")).is_param_(self.is_param)

  def assign(self, x: Any) -> Tensor:
    """Write x (broadcast and cast to this tensor's shape and dtype) into this tensor's storage.

    Lazy like everything else: the write happens when the tensor is realized.
    When this tensor is a view of a buffer (a realized tensor, a slice or
    transpose of one) the write goes through the view into that buffer, and
    (as in tinygrad) a write through a slice or transpose is also made, in
    the order the writes were made, as soon as anything that reads the buffer
    is realized; otherwise the tensor gets a fresh buffer."""
    if self.uop.base.op is Ops.ASSIGN or _multi.holds_assign(self.uop): self._realize()   # an earlier assign is carried out first, not lost
    if isinstance(x, TensorBase): self._same_device(x); v = x
    elif is_py_scalar(x) or isinstance(x, np.generic):
      v = self._new(const(cast_scalar(x, self.dtype), self.dtype, ()))
    else: v = self._lift(x)
    try: shape = broadcast_shapes(v.shape, self.shape)
    except ValueError: shape = None
    if shape != self.shape:
      raise ValueError(f"assign: a value of shape {v.shape} does not fit a tensor of shape {self.shape}")
    value = bcast(v.uop.cast(self.dtype), self.shape)
    if isinstance(self.device, tuple):
      self.uop = _multi.assign_parts(self, value)
      return self
    target = self.uop
    if target.base.op is Ops.BUFFER:
      try: _engine.view_indices(target)
      except ValueError as e: raise ValueError(f"assign to a tensor of shape {self.shape}: {e}") from None
    else: target = new_buffer(self.device, self.numel(), self.dtype).reshape(self.shape)
    write = UOp(Ops.ASSIGN, self.dtype, (target, value))
    # a write of the whole buffer waiting is made first (it came first); so is the same write waiting already,
    # which is the same node (UOps are hash-consed), so that this one is a write of its own
    if (first := _writes.first(write)): _carry_out(first)
    self.uop = write
    _writes.record(write)
    _writes.note(write, self._tracks_writes())
    return self

  def _tracks_writes(self) -> bool:
    """Whether a write into this tensor keeps, for autograd, the graph of its new contents (engine/tensor/inplace.py):
    a float tensor outside no_grad, not marked requires_grad=False, and with no `.grad`. A tensor that has one was
    differentiated as a leaf: a write into it is a parameter update (`p.assign(p - lr * p.grad)`), after which
    it is a leaf again, as torch's optimizer step (under no_grad) leaves it; a history would chain every step of a
    training loop into the next one's gradient."""
    return not type(self).no_grad and self.requires_grad is not False and self.grad is None

  @property
  def _forward(self) -> UOp | None:
    """The graph this realized tensor was computed from (None if it was not, or if that no longer holds)."""
    return _history.history(self.uop)

  @_forward.setter
  def _forward(self, graph: UOp | None) -> None: _history.record(self.uop, graph)

  def _ensure_storage(self) -> None:
    """Realize this tensor into a buffer of its own if it has none (writes go through storage; a constant is
    realized without any, so it is made contiguous first)."""
    if self.uop.base.op is Ops.BUFFER: return
    if self.uop.base.op is Ops.CONST: self.uop = self.uop.contiguous()
    self._realize()

  def __setitem__(self, idx: Any, value: Any) -> None:
    """t[idx] = value: writes value into this tensor's storage through the view t[idx] (realizes at once)."""
    items = idx if isinstance(idx, tuple) else (idx,)
    if isinstance(self.device, tuple): raise DeviceError("setitem on a sharded tensor is not supported; assign() the whole tensor")
    if any(is_advanced_index(it) for it in items): return self._setitem_advanced(items, value)
    self._ensure_storage()
    self._write_view(self[idx], value)

  def _same_device(self, other: Tensor) -> None:
    if other.device != self.device:
      raise DeviceError(f"tensors are on different devices: {self.device} and {other.device}; move one with .to()"
                        + (" or .shard()" if isinstance(self.device, tuple) or isinstance(other.device, tuple) else ""))


def _pending(ts, caller: str) -> list[tuple[TensorBase, UOp]]:
  """The tensors realize() computes (each once, the realized left out), each with its graph as realize() computes
  it. A constant asked to be realized gets storage (a view of it can then be written through, as before it was
  realized it could not); a value that only folds to a constant while scheduling stays one (no kernel)."""
  for t in ts:
    if not isinstance(t, TensorBase): raise TypeError(f"{caller}() takes Tensors, got {type(t).__name__}")
  out, seen = [], set()
  for t in ts:
    u = _multi.stored(t, t.uop.contiguous() if t.uop.base.op is Ops.CONST else t.uop)
    if id(t) not in seen and not _multi.is_realized(u): seen.add(id(t)); out.append((t, u))
  return out


def _kept_apart(uops: list[UOp]) -> list[UOp]:
  """The graphs to realize, each with a buffer of its own: two tensors holding one (hash-consed) graph get a buffer
  each (an assign into one must not show in the other), and so does a copy (contiguous()) of a lazy value realized
  beside it (the scheduler would otherwise store the value once and let both tensors hold that buffer)."""
  out, firsts, held = [], set(), set(uops)
  for u0 in uops:
    u = u0
    if u in firsts: u = UOp(Ops.CONTIGUOUS, u.dtype, (u,), tag="copy")
    elif u.op is Ops.CONTIGUOUS and u.tag is None and u.src[0] in held: u = UOp(Ops.CONTIGUOUS, u.dtype, u.src, tag="copy")
    out.append(u)
    firsts.add(u0)
  return out
