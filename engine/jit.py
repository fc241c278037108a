"""TinyJit: run a function of Tensors once, capture the kernels it runs, then replay them.

tinygrad 0.14's semantics. Call 1 runs the function as it is. Call 2 runs it again while every kernel that
runs is recorded (engine/realize.py appends to `CAPTURING`), with the buffers it reads and writes. From call
3 on the function is not run at all: the recorded kernels run again, in order, with each input buffer (the
Tensor arguments, also inside a list, tuple or dict argument) replaced by this call's. Everything else a
kernel touches is the same buffer as at capture: parameters and optimizer state reached through the
function's closure (their assigns write them in place, so replays update them), and the intermediates and
outputs the capture allocated, which are reused.

So the function's return value is the same Tensor objects every call, holding the same buffers: an output
is overwritten by the next call (copy it, `.clone().realize()` or `.numpy()`, to keep it). Python side
effects, host data created inside the function (`Tensor(np_array)`) and random draws are baked in at
capture. Tensor state the function leaves unrealized is not updated by replays: realize what must persist.
A returned Tensor that is a view of an input (the function assigned into its argument and returned it) is
re-pointed at this call's input. Gradients the capture's backward left on tensors (`.grad`) are cleared after it
(None), unless returned: replays would not update them, and the memory planner reuses their buffers (below). `RULEC_JIT=0` runs the function on every call; `RULEC_REALIZE=eval` runs no
kernels, so there is nothing to capture (JitError).

Memory: the capture's kernels keep their buffers for as long as the TinyJit lives, so their intermediates (every
buffer no live tensor, kept history, input or output can read after the capture) share buffers where their
lifetimes do not overlap (engine/memory_plan.py, as tinygrad's JIT plans its memory).

Checked on every replay: the same argument names hold Tensors, and each input has the shape, view, dtype
and device it had at capture (else JitError, as in tinygrad). Non-Tensor arguments must equal the captured
ones: tinygrad silently replays with the captured values; rulec raises JitError instead.

Bound Variables (`Variable("start_pos", 1, 1023).bind(n)`, and expressions of them) among the arguments are not
that kind of argument: calls are counted per set of Variables, whatever their values. Where the function kept
them symbolic (slice offsets and sizes: docs/api.md, "Symbolic shapes"), its kernels take their values as
arguments, and the capture replays for every value with this call's (each kernel's `vals`): no scheduling, no
compiling. A capture that read a bound value as an int (its kernels were built for that value) serves that set of
values only: from then on each set counts its own calls (run, capture, replay), at most `max_keys` sets are
remembered (the least recently used is forgotten), and no call replays kernels built for another value. A capture
whose kernels take a Variable the arguments do not bind to the same value (bound in the closure) is never
replayed: calls with those arguments run the function.
"""
from __future__ import annotations

import functools
import os
import weakref
from collections import OrderedDict
from typing import Any, Callable

import numpy as np

from rulec.engine import memory_plan, realize as _realize
from rulec.engine.tensor import base as _base
from rulec.engine.realize import JitError
from rulec.engine.ir.ops import MOVEMENT, Ops
from rulec.engine.ir.rewrite import substitute
from rulec.engine.tensor.base import TensorBase
from rulec.engine.ir import uop as _uop
from rulec.engine.ir.uop import UOp
from rulec.runtime.buffer import buffer_of, new_buffer
from rulec.runtime.devices import launcher
from rulec.engine.ir.kernel import Kernel
from rulec.engine.sched.variables import has_symbolic_args, rebind, unbind_graph, unbound_expr

__all__ = ["TinyJit", "JitError", "jit"]


def _jit_enabled() -> bool: return os.environ.get("RULEC_JIT", "1") != "0"


# *** inputs ***

def _input_tensors(args: tuple, kwargs: dict) -> tuple[list, list[TensorBase]]:
  """(names, tensors): Tensor arguments by position or keyword, then Tensors inside list/tuple/dict arguments
  (one level deep, not recursive: a model object's weights are state, not inputs)."""
  named = [(n, t) for n, t in list(enumerate(args)) + sorted(kwargs.items()) if isinstance(t, TensorBase)]
  names, tensors = [n for n, _ in named], [t for _, t in named]
  for x in (*args, *kwargs.values()):
    inner = x if isinstance(x, (tuple, list)) else x.values() if isinstance(x, dict) else ()
    tensors += [t for t in inner if isinstance(t, TensorBase) and not any(t is y for y in tensors)]
  return names, tensors


def _view_info(u: UOp) -> tuple:
  """What a replay assumes of one input: its shape, its movement ops down to the buffer, the buffer's size,
  the dtype and the device."""
  shape, chain = u.shape, []
  while u.op in MOVEMENT:
    chain.append((u.op, u.arg))
    u = u.src[0]
  return (shape, tuple(chain), u.arg[2], u.dtype, u.arg[1])


def _describe(info: tuple) -> str:
  shape, chain, size, dtype, device = info
  plain = all(op is Ops.RESHAPE for op, _ in chain)
  view = "" if plain else f" (a view: {', '.join(op.name for op, _ in reversed(chain))} of a buffer of {size})"
  return f"shape {shape}{view}, {dtype.name}, on {device}"


def _prepare(args: tuple, kwargs: dict) -> tuple[list, list[TensorBase], list[UOp], list[tuple]]:
  """Realize the input tensors; (names, tensors, their buffers, their view info)."""
  names, tensors = _input_tensors(args, kwargs)
  todo = [t for t in tensors if not _realize.is_realized(t.uop)]
  if todo: todo[0].realize(*todo[1:])
  for t in tensors:
    if t.uop.base.op is not Ops.BUFFER: raise JitError("JIT inputs must be real buffers; use .clone()")
  bufs = [t.uop.base for t in tensors]
  if len(set(bufs)) != len(bufs): raise JitError("duplicate inputs to JIT")
  return names, tensors, bufs, [_view_info(t.uop) for t in tensors]


def _static(x: Any) -> Any:
  """A non-Tensor argument as compared between calls: Tensors in containers stand for their slot."""
  if isinstance(x, TensorBase): return TensorBase
  if isinstance(x, (tuple, list)): return (type(x), tuple(_static(e) for e in x))
  if isinstance(x, dict): return (dict, tuple((k, _static(v)) for k, v in x.items()))
  # (a bound expression stands for its expression over the Variables: the values are the key's business)
  if isinstance(x, UOp) and x.is_symbolic: return unbound_expr(x)
  return x


def _same(a: Any, b: Any) -> bool:
  if a is b: return True
  if type(a) is not type(b): return False
  if isinstance(a, tuple) and len(a) == len(b): return all(_same(x, y) for x, y in zip(a, b))
  if isinstance(a, np.ndarray): return a.dtype == b.dtype and np.array_equal(a, b)
  try: return bool(a == b)
  except Exception: return False   # (== that does not give a truth value: not the same)


def _statics(args: tuple, kwargs: dict) -> list:
  return [(n, _static(v)) for n, v in list(enumerate(args)) + sorted(kwargs.items()) if not isinstance(v, TensorBase)]


def _bound_key(args: tuple, kwargs: dict) -> tuple[UOp, ...]:
  """The bound Variables among the arguments (also inside lists, tuples and dicts, and in bound expressions): the
  BIND nodes, one per (Variable, value), in a fixed order. Hash-consing makes equal values the same node."""
  found: set[UOp] = set()
  def walk(x: Any) -> None:
    if isinstance(x, UOp):
      if x.is_symbolic: found.update(u for u in x.toposort() if u.op is Ops.BIND)
    elif isinstance(x, (tuple, list)):
      for e in x: walk(e)
    elif isinstance(x, dict):
      for e in x.values(): walk(e)
  for x in (*args, *kwargs.values()): walk(x)
  return tuple(sorted(found, key=lambda b: (b.src[0].arg[0], b.src[1].arg)))


# *** outputs ***

def _returned(ret: Any) -> list[TensorBase]:
  """The Tensors in a return value (a Tensor, None, or lists, tuples and dicts of them)."""
  if isinstance(ret, TensorBase): return [ret]
  if isinstance(ret, (tuple, list)): return [t for x in ret for t in _returned(x)]
  if isinstance(ret, dict): return [t for x in ret.values() for t in _returned(x)]
  return []


def _check_return(ret: Any) -> None:
  if ret is None or isinstance(ret, TensorBase): return
  if isinstance(ret, (tuple, list, dict)):
    for x in (ret.values() if isinstance(ret, dict) else ret): _check_return(x)
    return
  raise JitError(f"JIT return contains non-Tensor value of type {type(ret).__name__}")


def _realize_returned(ret: Any) -> None:
  ts = _returned(ret)
  if ts: ts[0].realize(*ts[1:])


# *** the captured program ***

class _Captured:
  """The kernels of call 2, each with the positions of its buffers that are inputs, and the outputs."""

  def __init__(self, kernels: list[Kernel], in_bufs: list[UOp], names: list, infos: list[tuple], statics: list,
               ret: Any):
    where = {b: j for j, b in enumerate(in_bufs)}
    # a kernel that touches no input runs as it is; the others get this call's inputs at those positions (the
    # capture's inputs are not kept: nothing holds on to call 2's data). Each runs through its device's prepared
    # launch where it has one (runtime/devices.py `launcher`: a CL launch's host time is most of a decode step)
    # with its Buffers looked up here, an input's at each replay.
    self.plan = []
    for k in kernels:
      subs = tuple((p, where[b]) for p, b in enumerate(k.bufs) if b in where)
      launch = launcher(k, k.bufs[0].arg[1]) if k.bufs else None
      buffers = [None if b in where else buffer_of(b) for b in k.bufs] if launch is not None else None
      self.plan.append((k, subs, launch, buffers, k.vars))
    self.names, self.infos, self.statics, self.ret = names, infos, statics, ret
    # buffers the replay writes that are not inputs: an input that is one of them is copied first
    self.written = {k.bufs[s] for k in kernels for s in k.outputs} - set(in_bufs)
    # the returned tensors' views; those over an input show this call's input (kept as its position)
    self.outs = []
    for t in _returned(ret):
      t._forward = None   # (the graph of call 2, which holds its inputs: no backward through a jitted output)
      self.outs.append((t, t.uop, where.get(t.uop.base)))

  def check(self, names: list, infos: list[tuple], statics: list) -> None:
    if names != self.names: raise JitError(f"args mismatch in JIT: Tensor arguments at {names}, captured at {self.names}")
    if len(infos) != len(self.infos):
      raise JitError(f"args mismatch in JIT: {len(infos)} input Tensors, captured with {len(self.infos)}")
    for j, (got, want) in enumerate(zip(infos, self.infos)):
      if got != want:
        where = f"argument {names[j]!r}" if j < len(names) else f"input tensor {j} (inside a container argument)"
        raise JitError(f"args mismatch in JIT: {where} has {_describe(got)}; it was captured with {_describe(want)}")
    if [n for n, _ in statics] != [n for n, _ in self.statics]:
      raise JitError(f"args mismatch in JIT: non-Tensor arguments {[n for n, _ in statics]}, captured with "
                     f"{[n for n, _ in self.statics]}")
    for (n, got), (_, want) in zip(statics, self.statics):
      if not _same(got, want):
        raise JitError(f"args mismatch in JIT: non-Tensor argument {n!r} is {got!r}, captured with {want!r}; "
                       "a replay would compute with the captured value (tinygrad does so silently)")

  def __call__(self, bufs: list[UOp], var_vals: dict[UOp, int] | None = None) -> Any:
    """Run the kernels on this call's input buffers; var_vals: the bound values of this call (a capture that
    serves every value: each kernel with Variables runs with them)."""
    bufs = [_copy(b) if b in self.written else b for b in bufs]
    for k, subs, launch, buffers, variables in self.plan:
      vals = tuple(var_vals[v] for v in variables) if var_vals and variables else k.vals
      if subs:
        new = list(k.bufs)
        for p, j in subs: new[p] = bufs[j]
        k = Kernel(k.ast, new, vals)
        if launch is not None:
          buffers = list(buffers)
          for p, j in subs: buffers[p] = buffer_of(bufs[j])
      elif vals is not k.vals: k = Kernel(k.ast, k.bufs, vals)
      _realize._run(k, launch, buffers)
    for t, v, j in self.outs:
      if var_vals and has_symbolic_args([v]): v = rebind(unbind_graph([v])[0][0], var_vals)
      t.uop = v if j is None else substitute(v, {v.base: bufs[j]})
    return self.ret


def _copy(b: UOp) -> UOp:
  """A new buffer holding b's contents (an input the replay would also overwrite: a previous call's output)."""
  c = new_buffer(b.arg[1], b.arg[2], b.dtype)
  buffer_of(c).copyin(buffer_of(b).host_view())
  return c


# *** the decorator ***

class TinyJit:
  """`@TinyJit` (or `TinyJit(fn)`): call 1 runs fn, call 2 runs it capturing its kernels, later calls replay
  them on the new Tensor arguments without building or scheduling a graph. See this module's docstring for
  what is replayed, what is baked in, and that outputs are overwritten by the next call."""

  def __init__(self, fxn: Callable | None = None, *, prune: bool = False):
    if fxn is None or not callable(fxn): raise TypeError(f"TinyJit needs a function, got {type(fxn).__name__}")
    if prune: raise NotImplementedError("TinyJit(prune=True) is not supported in rulec")
    self.fxn, self.cnt, self.captured = fxn, 0, None
    # per set of bound values among the arguments (() when there are none): how many calls ran the function (1),
    # the capture, or _PLAIN (its capture read bound values from elsewhere: always run the function)
    self.runs: OrderedDict[tuple[UOp, ...], Any] = OrderedDict()
    # per set of Variables among the arguments (() when there are none): calls so far (0, 1), the capture that
    # serves every value of them, or _SPECIALISED (a capture read a bound value: `runs` decides, per value)
    self.general: dict[tuple[UOp, ...], Any] = {}
    functools.update_wrapper(self, fxn)

  max_keys = 64   # how many sets of bound values a TinyJit remembers (least recently used forgotten first)

  def reset(self) -> None:
    """Forget the captures: the next call runs the function again (and the one after captures)."""
    self.cnt, self.captured = 0, None
    self.runs.clear()
    self.general.clear()

  def __get__(self, obj, objtype=None):
    """A jitted method: the instance is passed as the first (non-Tensor) argument."""
    return self if obj is None else functools.partial(self.__call__, obj)

  def __call__(self, *args, **kwargs) -> Any:
    names, _, bufs, infos = _prepare(args, kwargs)
    key = _bound_key(args, kwargs)
    # calls are counted per set of Variables, whatever their values: a capture whose kernels take the Variables
    # as arguments (it read no bound value while it ran) replays for every value
    variables = tuple(b.src[0] for b in key)
    general = self.general.get(variables, 0)
    if _jit_enabled() and general is not _SPECIALISED:
      if general == 0:
        ret = self.fxn(*args, **kwargs)
        _realize_returned(ret)
        self.general[variables] = 1
      elif general == 1: ret = self._capture(args, kwargs, names, bufs, infos, key)
      else:
        general.check(names, infos, _statics(args, kwargs))
        self.captured = general
        ret = general(bufs, {b.src[0]: b.src[1].arg for b in key})
      self.cnt += 1
      return ret
    state = self.runs.get(key, 0)
    if not _jit_enabled() or state == 0 or state is _PLAIN:
      ret = self.fxn(*args, **kwargs)
      _realize_returned(ret)
      if _jit_enabled() and state == 0: self._remember(key, 1)
    elif state == 1: ret = self._capture(args, kwargs, names, bufs, infos, key)
    else:
      state.check(names, infos, _statics(args, kwargs))
      self.runs.move_to_end(key)
      self.captured = state
      ret = state(bufs)
    self.cnt += 1
    return ret

  def _remember(self, key: tuple[UOp, ...], state: Any) -> None:
    self.runs[key] = state
    self.runs.move_to_end(key)
    while len(self.runs) > self.max_keys: self.runs.popitem(last=False)

  def _capture(self, args: tuple, kwargs: dict, names: list, bufs: list[UOp], infos: list[tuple],
               key: tuple[UOp, ...] = ()) -> Any:
    if _realize.CAPTURING: raise RuntimeError("having TinyJit inside another TinyJit is not supported")
    kernels: list[Kernel] = []
    reads: set[UOp] = set()
    # (by id, with a weak reference to tell a tensor from a later one at the same address: Tensors compare elementwise)
    grads_before = {id(t): (weakref.ref(t), id(t.grad)) for t in list(_base._LIVE)}
    _realize.CAPTURING.append(kernels)
    _uop.BOUND_READS.append(reads)
    try:
      ret = self.fxn(*args, **kwargs)
      _realize_returned(ret)
    finally:
      _uop.BOUND_READS.pop()
      _realize.CAPTURING.pop()
    if not kernels: raise JitError("didn't JIT anything!")
    _check_return(ret)
    variables = tuple(b.src[0] for b in key)
    given = {b.src[0]: b.src[1].arg for b in key}
    # a kernel that takes a Variable the arguments do not bind, or binds to another value (bound inside the
    # function): a replay could not give it its value, so it counts as a value read
    for k in kernels:
      for v, n in zip(k.vars, k.vals):
        if given.get(v) != n: reads.add(v)
    if reads and self.general.get(variables) == 1:
      # (a bound value was read as a number: the kernels were built for it; from now on captures are kept per
      # set of values, and this one serves its own values only)
      self.general[variables] = _SPECIALISED
      self.runs[key] = 1
    if not reads <= set(key):   # (built for bound values a replay could not check: never replay it)
      self._remember(key, _PLAIN)
      return ret
    _drop_step_grads(grads_before, ret)
    # the step's intermediates no live tensor or history can read share buffers where their lifetimes allow: a
    # replay keeps only what the step needs at once (engine/memory_plan.py; the realizes inside were not planned,
    # engine/realize.py, so each intermediate's own lifetime is seen here)
    seen, inputs = _base.visible_buffer_ids(), set(bufs)
    kernels = memory_plan.plan(kernels, {b for k in kernels for b in k.bufs if b.arg[0] not in seen and b not in inputs})
    self.captured = _Captured(kernels, bufs, names, infos, _statics(args, kwargs), ret)
    if not reads and self.general.get(variables) == 1: self.general[variables] = self.captured
    else: self._remember(key, self.captured)
    return ret


def _drop_step_grads(before: dict[int, tuple], ret: Any) -> None:
  """The gradients the captured call left on tensors (`.grad` set or replaced by its backward) are cleared, unless
  the function returned them. A replay runs no Python, so it would not set them again: they would show call 2's
  values for ever, or hold buffers the memory planner must leave alone (a layernorm weight's gradient left as a
  graph reads a training step's activations). tinygrad's are stale graphs after a replay; here they are None, so
  reading one fails at once instead of giving old numbers. Return a gradient to read it after each call."""
  returned = {id(t) for t in _returned(ret)}
  for t in list(_base._LIVE):
    g = t.grad
    if g is None or id(g) in returned: continue
    ref, was = before.get(id(t), (None, None))
    if ref is None or ref() is not t or was != id(g): t.grad = None


_PLAIN = object()   # a TinyJit.runs state: run the function on every call
_SPECIALISED = object()   # a TinyJit.general state: this set of Variables is captured per set of values (runs)


def jit(fxn: Callable | None = None, **kw) -> TinyJit | Callable[[Callable], TinyJit]:
  """`@jit` or `@jit(prune=False)`: TinyJit as a decorator that also takes options."""
  return (lambda f: TinyJit(f, **kw)) if fxn is None else TinyJit(fxn, **kw)
