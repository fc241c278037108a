"""The NUMPY reference device: runs a Kernel exactly, vectorised with numpy.

Each RANGE of the kernel lies along an axis of a broadcast grid. A RANGE
evaluates to `np.arange(n)` lying along its axis, a CONST to a size-1 array,
and every other node to an array broadcastable to the grid that is only as big
as the ranges it depends on. `REDUCE(value, *ranges)` reduces over those
ranges' axes keeping them as size 1; a store writes `out[idx] = value` at every
point of the grid its END spans. Ranges that no array spans together share an
axis (see `_axes`: numpy handles at most 32 dimensions, and a kernel fusing
many reductions has ranges of its own for each), and a range of size 1 needs
none.

Out-of-bounds reads (padding: `WHERE(valid, INDEX(p, idx), 0)` with `idx`
outside the buffer where `valid` is false) read a clipped index and are
tracked: a value read out of bounds that reaches a store, a store index, or a
WHERE condition instead of being discarded by a WHERE raises IndexError, as
does a store to an out-of-bounds index.

ALU ops follow engine/ir/alu.py (integer results wrap, IDIV/MOD are floor
division/modulo, integer division by zero gives 0, ...), computed in each
node's dtype (`index` is int64). A DEFINE_VAR is its launch value (`var_vals`, in
`Kernel.vars` order), a size-1 array like a CONST.
"""
from __future__ import annotations

import itertools
import os
import sys
from typing import Iterable

import numpy as np

from rulec.codegen.online import running_max
from rulec.engine.ir.alu import float_alu, half_alu, is_bfloat16, wrap
from rulec.engine.ir.dtypes import DType, np_dtype_named
from rulec.engine.ir.ops import Ops
from rulec.engine.ir.uop import UOp
from rulec.runtime.buffer import buffer_of
from rulec.engine.ir.kernel import Kernel, validate

DEVICE = "NUMPY"

_counters = {"kernels": 0, "stores": 0}


def kernels_run() -> int:
  """How many kernels this device has run (since the last reset_counters())."""
  return _counters["kernels"]


def counters() -> dict[str, int]: return dict(_counters)


def reset_counters() -> None:
  for k in _counters: _counters[k] = 0


def run_schedule(kernels: Iterable[Kernel]) -> None:
  """Run kernels in order (a schedule is in dependency order)."""
  for k in kernels: run_kernel(k)


def run_kernel(kernel: Kernel, var_vals: tuple[int, ...] = ()) -> None:
  """Run the kernel, its variables (Kernel.vars, in that order) set to var_vals."""
  validate(kernel)
  var_vals = kernel.check_var_vals(var_vals)
  level = _debug_level()
  if level >= 1: print(f"NUMPY {kernel!r}" + (f" vars={var_vals}" if var_vals else ""), file=sys.stderr)
  if level >= 3: print(kernel.render(), file=sys.stderr)   # (the scheduler already prints every kernel at 2)
  with np.errstate(all="ignore"):
    _Run(kernel, var_vals).run()
  _counters["kernels"] += 1


def _debug_level() -> int:
  try: return int(os.environ.get("RULEC_DEBUG", "0") or 0)
  except ValueError: return 0


# *** dtypes ***

def np_of(dt: DType) -> np.dtype:
  if dt.np_name is None: raise NotImplementedError(f"the NUMPY device cannot compute in {dt.name}")
  return np_dtype_named(dt.np_name)


_TWO63, _TWO64 = 2.0 ** 63, 2.0 ** 64


def _float_to_int(x: np.ndarray, t: np.dtype) -> np.ndarray:
  """A float array as integers of `t` the way rulec.engine.ir.alu.wrap does it: truncate, non-finite -> 0, wrap around."""
  x = x.astype(np.float64)
  x = np.where(np.isfinite(x), np.trunc(x), 0.0)
  if (np.abs(x) >= _TWO63).any():
    x = np.fmod(x, _TWO64)    # exact
    x = np.where(x >= _TWO63, x - _TWO64, np.where(x < -_TWO63, x + _TWO64, x))
  return x.astype(np.int64).astype(t)


def _is_float(x: np.ndarray) -> bool:
  return x.dtype.kind == "f" or is_bfloat16(x.dtype)   # (ml_dtypes' bfloat16 is of numpy kind "V")


def _cast(x: np.ndarray, dt: DType) -> np.ndarray:
  t = np_of(dt)
  if dt.is_int and _is_float(x): return _float_to_int(x, t)
  # an integer reaches bfloat16 through float64 (one rounding below 2**53), as the CPU and CL devices convert it;
  # ml_dtypes would round 64-bit integers past that exactly
  if is_bfloat16(t) and x.dtype.kind in "iub": return x.astype(np.float64).astype(t)
  return x.astype(t, copy=False)


def _bitcast(x: np.ndarray, dt: DType) -> np.ndarray:
  t = np_of(dt)
  if t.itemsize != x.dtype.itemsize:
    raise NotImplementedError(f"BITCAST from {x.dtype} to {t} changes the item size")
  return np.ascontiguousarray(x).view(t)


# *** ALU ***

_CMP = {Ops.CMPLT: np.less, Ops.CMPNE: np.not_equal, Ops.CMPEQ: np.equal}
_TO_FLOAT = frozenset({Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.RECIPROCAL, Ops.FDIV})


def _alu(op: Ops, dt: DType, srcs: list[np.ndarray]) -> np.ndarray:
  if op in _CMP:
    a, b = (s.astype(np.float32) if is_bfloat16(s.dtype) else s for s in srcs)
    t = np.result_type(a, b)
    return _CMP[op](a.astype(t, copy=False), b.astype(t, copy=False))
  if op is Ops.WHERE:
    c, a, b = srcs
    t = np_of(dt)
    return np.where(c.astype(bool, copy=False), a.astype(t, copy=False), b.astype(t, copy=False))
  if dt.kind == "b":
    # bools compute as 0/1 numbers and become `value != 0`, as alu.wrap's bool(value) does (nan and inf are True)
    if op in _TO_FLOAT: return _alu_float(op, [s.astype(np.float64) for s in srcs]) != 0
    return _alu_int(op, np.dtype(np.int64), [s.astype(np.int64) for s in srcs]) != 0
  t = np_of(dt)
  xs = [s.astype(t, copy=False) for s in srcs]
  if is_bfloat16(t): return half_alu(op, xs, t)
  if dt.is_float: return np.asarray(_alu_float(op, xs)).astype(t, copy=False)
  return _alu_int(op, t, xs)


# float ops are engine/ir/alu.py's float_alu, the very function constant folding computes with: a folded
# constant is what this device computes, bit for bit
_alu_float = float_alu


def _alu_int(op: Ops, t: np.dtype, xs: list[np.ndarray]) -> np.ndarray:
  if op in _TO_FLOAT: return _float_to_int(_alu_float(op, [x.astype(np.float64) for x in xs]), t)
  if op is Ops.NEG: return np.negative(xs[0])
  if op is Ops.TRUNC: return xs[0].copy()
  if op is Ops.MULACC: return xs[0] * xs[1] + xs[2]
  a, b = xs
  if op is Ops.ADD: return a + b
  if op is Ops.SUB: return a - b
  if op is Ops.MUL: return a * b
  if op is Ops.IDIV: return np.floor_divide(a, b)  # floor division; numpy gives 0 for x // 0
  if op is Ops.MOD: return np.remainder(a, b)      # floor modulo; numpy gives 0 for x % 0
  if op is Ops.MAX: return np.maximum(a, b)
  if op is Ops.AND: return np.bitwise_and(a, b)
  if op is Ops.OR: return np.bitwise_or(a, b)
  if op is Ops.XOR: return np.bitwise_xor(a, b)
  if op in (Ops.SHL, Ops.SHR):
    bits = t.itemsize * 8
    sh = np.clip(b, 0, bits - 1).astype(t)
    if op is Ops.SHL: return np.where(b >= bits, 0, np.left_shift(a, sh)).astype(t)
    r = np.right_shift(a, sh)   # arithmetic for signed: a shift by >= bits gives 0 or -1, as Python's >>
    return np.where(b >= bits, 0, r).astype(t) if t.kind == "u" else r
  if op is Ops.POW:
    if t.kind == "u": return np.power(a, b)
    neg = b < 0
    r = np.power(a, np.where(neg, 0, b).astype(t))   # wraps exactly (repeated squaring mod 2**bits)
    if neg.any():   # a ** -k is a float in Python; truncated it is 1, +-1 or 0
      special = np.where(a == 1, 1, np.where(a == -1, np.where(b % 2 == 0, 1, -1), 0)).astype(t)
      r = np.where(neg, special, r)
    return r
  raise TypeError(f"{op} is not defined on integers")


# *** running ***

MAX_DIMS = 32   # what numpy's broadcasting and iterators accept


def _axes(kernel: Kernel) -> dict[int, int | None]:
  """The grid axis of each range (by id): None for a range of size 1, which is 0 everywhere.

  Two ranges need different axes when some array spans both: both in the work of one REDUCE (the ranges its
  value depends on and its own) or of one store (its END's ranges and those its index and value depend on);
  every other node's ranges are a subset of one of those. Otherwise they share one (a greedy colouring), so a
  kernel of many sibling reductions needs as many axes as one of them, not as all together. A set of
  MAX_DIMS + 1 ranges of size 2 or more spans at least 2**33 points: no such kernel fits in memory anyway."""
  deps: dict[int, frozenset[int]] = {}   # node -> the ranges its value depends on
  works: list[frozenset[int]] = []
  for u in kernel.ast.toposort():
    if u.op is Ops.RANGE: d = frozenset((id(u),))
    elif u.op is Ops.REDUCE:
      own = frozenset(id(r) for r in u.src[1:])
      works.append(deps[id(u.src[0])] | own)
      d = deps[id(u.src[0])] - own
    else: d = frozenset().union(*(deps[id(x)] for x in u.src))
    deps[id(u)] = d
  for e in kernel.ast.src:
    st = e.src[0] if e.op is Ops.END else e
    works.append(frozenset(id(r) for r in e.src[1:] if e.op is Ops.END) | deps[id(st.src[0].src[1])] | deps[id(st.src[1])])
  size = {id(r): r.src[0].arg for r in kernel.ranges}
  clash: dict[int, set[int]] = {i: set() for i in size}
  for w in works:
    for i in w: clash[i] |= w
  axis: dict[int, int | None] = {}
  for r in kernel.ranges:
    if size[id(r)] == 1: axis[id(r)] = None
    else:
      taken = {axis[j] for j in clash[id(r)] if j in axis}
      axis[id(r)] = next(a for a in itertools.count() if a not in taken)
  return axis


class _Run:
  def __init__(self, kernel: Kernel, var_vals: tuple[int, ...] = ()):
    self.kernel = kernel
    self.var_vals = dict(zip(kernel.vars, var_vals))
    self.ranges = kernel.ranges
    self.size = {id(r): r.src[0].arg for r in self.ranges}
    self.axis = _axes(kernel)
    # no ranges: one axis of size 1, so values stay arrays
    self.ndim = 1 + max([a for a in self.axis.values() if a is not None], default=0)
    if self.ndim > MAX_DIMS:
      raise NotImplementedError(f"the NUMPY device cannot run a kernel whose values span {self.ndim} ranges at once")
    self.val: dict[int, np.ndarray] = {}
    self.prefix_max: dict[int, np.ndarray] = {}   # RUNMAX node -> its max so far at each step, -inf included
    self.runs = any(u.op is Ops.RUNMAX for u in kernel.ast.toposort())   # (else no reduce is searched for one)
    self.poison: dict[int, tuple[np.ndarray, frozenset[int]]] = {}  # out-of-bounds reads: (mask, slots)
    self.reads: dict[int, frozenset[int]] = {}                       # slots a node loads from
    self.views = {slot: buffer_of(b).numpy_view() if slot in kernel.outputs else buffer_of(b).host_view()
                  for slot, b in enumerate(kernel.bufs)}

  def run(self):
    for e in self.kernel.ast.src:
      st = e.src[0] if e.op is Ops.END else e
      ends = e.src[1:] if e.op is Ops.END else ()
      tgt, value = st.src
      param, idx = tgt.src
      self.eval(idx)
      self.eval(value)
      if any(self.size[id(r)] == 0 for r in ends): continue   # an empty loop writes nothing
      self.store(param.arg[0], idx, value)
      _counters["stores"] += 1

  def eval(self, root: UOp) -> np.ndarray:
    val = self.val
    for u in root.toposort(lambda x: id(x) not in val and x.op is not Ops.PARAM):
      if id(u) in val or u.op is Ops.PARAM: continue
      val[id(u)] = self.compute(u)
      reads = frozenset().union(*(self.reads.get(id(s), frozenset()) for s in u.src))
      if u.op is Ops.INDEX: reads |= {u.src[0].arg[0]}
      if reads: self.reads[id(u)] = reads
    return val[id(root)]

  def compute(self, u: UOp) -> np.ndarray:
    op, val = u.op, self.val
    if op is Ops.CONST: return np.full((1,) * self.ndim, wrap(u.arg, u.dtype), dtype=np_of(u.dtype))
    if op is Ops.DEFINE_VAR:
      if u not in self.var_vals: raise ValueError(f"no value for variable {u.arg[0]!r}")
      return np.full((1,) * self.ndim, self.var_vals[u], dtype=np_of(u.dtype))
    if op is Ops.RANGE:
      shape = [1] * self.ndim
      ax = self.axis[id(u)]
      if ax is not None: shape[ax] = self.size[id(u)]
      return np.arange(self.size[id(u)], dtype=np.int64).reshape(shape).astype(np_of(u.dtype), copy=False)
    if op is Ops.INDEX: return self.load(u)
    srcs = [val[id(s)] for s in u.src]
    if op is Ops.REDUCE: return self.reduce(u, srcs[0])
    if op is Ops.RUNMAX: return self.prefix(u, srcs[0])
    self.propagate_poison(u)
    if op is Ops.CAST: return _cast(srcs[0], u.dtype)
    if op is Ops.BITCAST: return _bitcast(srcs[0], u.dtype)
    return _alu(op, u.dtype, srcs)

  def load(self, u: UOp) -> np.ndarray:
    param, idx = u.src
    slot = param.arg[0]
    data = self.views[slot]
    i = self.val[id(idx)].astype(np.int64, copy=False)
    self.propagate_poison(u)
    bad = (i < 0) | (i >= data.shape[0])
    if not bad.any(): return data[i]
    self.add_poison(u, bad, {slot})
    if data.shape[0] == 0: return np.zeros(i.shape, dtype=data.dtype)
    return data[np.clip(i, 0, data.shape[0] - 1)]

  def prefix(self, u: UOp, t: np.ndarray) -> np.ndarray:
    """RUNMAX(t, r): at each step of r the max of t over the steps so far (a NaN never wins, as in MAX), as the
    renderers' one-pass loop has it when it computes that step's term; 0 where that max is still -inf (the
    renderers' stand-in; those terms are exp2(-inf) = 0). The raw prefix max is kept for the sum that rescales."""
    r = u.src[1]
    ax = self.axis[id(r)]
    t = np.where(np.isnan(t), -np.inf, t)
    if ax is not None:
      shape = list(t.shape)
      shape[ax] = self.size[id(r)]
      t = np.fmax.accumulate(np.broadcast_to(t, shape), axis=ax)
    self.prefix_max[id(u)] = t
    return np.where(t == -np.inf, 0, t).astype(t.dtype, copy=False)

  def _running_sum(self, u: UOp, run: UOp, v: np.ndarray) -> np.ndarray:
    """A sum with a running max (rules/online.rules) as the one-pass loop computes it: each step's term was computed
    with the max so far, m_j, and is rescaled by exp2(a * (m_j - M)) by the time the loop ends (M the last max); a
    row whose max stays -inf is NaN."""
    r = u.src[1]
    ax = self.axis[id(r)]
    prefix = self.prefix_max[id(run)]
    last = prefix if ax is None else np.take(prefix, [-1], axis=ax)
    with np.errstate(invalid="ignore", over="ignore"):
      scale = np.exp2((prefix - last) * prefix.dtype.type(run.arg))
      terms = v * scale
      total = terms if ax is None else np.add.reduce(terms, axis=ax, keepdims=True, dtype=v.dtype)
    return np.where(last == -np.inf, np.nan, total).astype(v.dtype, copy=False)

  def reduce(self, u: UOp, v: np.ndarray) -> np.ndarray:
    if self.runs and (run := running_max(u)) is not None: return self._running_sum(u, run, v)
    if len(u.src) == 1:
      if (p := self.poison.get(id(u.src[0]))) is not None: self.poison[id(u)] = p
      return v
    # ranges of size 1 have no axis: reducing over none still folds the identity in (numpy applies `initial`)
    axes = tuple(self.axis[id(r)] for r in u.src[1:] if self.axis[id(r)] is not None)
    shape = list(v.shape)
    for r in u.src[1:]:
      if self.axis[id(r)] is not None: shape[self.axis[id(r)]] = self.size[id(r)]
    vb = np.broadcast_to(v, shape)
    if (p := self.poison.get(id(u.src[0]))) is not None:
      self.add_poison(u, np.logical_or.reduce(np.broadcast_to(p[0], shape), axis=axes, keepdims=True), p[1])
    t = v.dtype
    if is_bfloat16(t):   # a bfloat16 sum or product runs in float32 and rounds once, as the devices' accumulators do
      return self._reduce_values(u, vb.astype(np.float32), axes).astype(t)
    return self._reduce_values(u, vb, axes)

  def _reduce_values(self, u: UOp, vb: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    t = vb.dtype
    if u.arg is Ops.ADD: return np.add.reduce(vb, axis=axes, keepdims=True, dtype=t, initial=0)
    if u.arg is Ops.MUL: return np.multiply.reduce(vb, axis=axes, keepdims=True, dtype=t, initial=1)
    # MAX folds alu's max from the identity: a nan never wins (np.fmax); empty gives -inf / the dtype's min
    if t.kind == "f": return np.fmax.reduce(vb, axis=axes, keepdims=True, initial=-np.inf).astype(t, copy=False)
    ident = False if t.kind == "b" else np.iinfo(t).min
    return np.maximum.reduce(vb, axis=axes, keepdims=True, initial=ident)

  def store(self, slot: int, idx: UOp, value: UOp):
    out = self.views[slot]
    i, v = self.val[id(idx)], self.val[id(value)]
    shape = np.broadcast_shapes(i.shape, v.shape)
    for what, part in (("index", idx), ("value", value)):
      if (p := self.poison.get(id(part))) is not None and np.broadcast_to(p[0], shape).any():
        raise IndexError(f"a store to p{slot} uses a value read out of bounds from "
                         f"{', '.join(f'p{s}' for s in sorted(p[1]))} in its {what} (no WHERE discards it)")
    ii = np.broadcast_to(i, shape).reshape(-1).astype(np.int64, copy=False)
    bad = (ii < 0) | (ii >= out.shape[0])
    if bad.any():
      raise IndexError(f"store to p{slot} (size {out.shape[0]}) at out-of-bounds index {int(ii[bad][0])}")
    out[ii] = np.broadcast_to(v, shape).reshape(-1).astype(out.dtype, copy=False)
    # values already computed from the old contents of this buffer are stale for later stores
    stale = [k for k, r in self.reads.items() if slot in r]
    for k in stale:
      self.val.pop(k, None); self.poison.pop(k, None); self.reads.pop(k, None)

  # *** out-of-bounds tracking ***

  def add_poison(self, u: UOp, mask: np.ndarray, slots: Iterable[int]):
    if not mask.any(): return
    if (old := self.poison.get(id(u))) is not None: mask, slots = mask | old[0], old[1] | frozenset(slots)
    self.poison[id(u)] = (mask, frozenset(slots))

  def propagate_poison(self, u: UOp):
    ps = [self.poison.get(id(s)) for s in u.src]
    if not any(p is not None for p in ps): return
    if u.op is Ops.WHERE:   # a WHERE discards the poisoned side it does not pick
      cond = self.val[id(u.src[0])]
      pc, pa, pb = ps
      picked = np.where(cond, pa[0] if pa else False, pb[0] if pb else False)
      slots = frozenset().union(*(p[1] for p in (pa, pb) if p))
      self.add_poison(u, picked, slots)
      if pc: self.add_poison(u, pc[0], pc[1])
      return
    for p in ps:
      if p is not None: self.add_poison(u, p[0], p[1])


__all__ = ["DEVICE", "run_kernel", "run_schedule", "kernels_run", "counters", "reset_counters"]
