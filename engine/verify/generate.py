"""Random concrete graphs that match a rule's pattern, drawn with hypothesis.

`Gen(draw, mode).root(pattern)` walks the pattern AST top-down: the wanted
dtype (and, for tensor-level graphs, shape) flows from a node to its sources,
op alternations and groups are narrowed to the ops that can produce it, a
literal becomes that constant, a name bound twice is the same node, and a free
name becomes a random leaf expression. Two modes:

- "scalar": index-level expressions. Leaves are RANGE(n) (n <= 8) and
  DEFINE_VAR(lo..hi) with at most 8 values (at most 3 leaves per graph), and
  constants; every value of every leaf is later enumerated.
- "tensor": tensor-level graphs. Leaves are BUFFERs with random contents (a
  view of them in the wanted shape) and expanded constants; movement ops get
  args that fit the wanted shape (the identity among them, so no-op rules fire).

Everything is drawn through `draw`, so hypothesis can shrink a counterexample:
the first choice of every list is the simplest one.
"""
from __future__ import annotations

import math

import numpy as np
from hypothesis import strategies as st

from rulec.engine.ir.dtypes import DType, dtype_set, dtypes
from rulec.engine.lang import ast as A
from rulec.engine.lang.compiler import pattern_ops
from rulec.engine.ir.ops import ALU, COMMUTATIVE, MOVEMENT, UNARY, Ops
from rulec.engine.ir.uop import UOp, prod

INTS = (dtypes.index, dtypes.int32, dtypes.int8, dtypes.uint8, dtypes.int64, dtypes.uint32, dtypes.int16,
        dtypes.uint16, dtypes.uint64)
FLOATS = (dtypes.float32, dtypes.float64, dtypes.float16)   # bfloat16: no numpy type to round with
ALL = INTS[:2] + FLOATS[:1] + (dtypes.bool,) + INTS[2:] + FLOATS[1:]
NUMERIC = tuple(d for d in ALL if d is not dtypes.bool)
MAX_LEAVES, MAX_VALUES = 3, 8
FLOAT_VALUES = (0.0, 1.0, -2.5, 7.0, -0.0, math.inf, -math.inf, math.nan)   # what a float variable runs through
DEVICES = ("CPU", "NUMPY")

_F, _I, _B = set(FLOATS), set(INTS), {dtypes.bool}
_OUT: dict[Ops, set] = {
  **{o: _I | _F for o in (Ops.ADD, Ops.SUB, Ops.MUL, Ops.MAX, Ops.NEG, Ops.MULACC, Ops.IDIV, Ops.MOD)},
  Ops.CDIV: _I, Ops.CMOD: _I, Ops.SHL: _I, Ops.SHR: _I, Ops.AND: _I | _B, Ops.OR: _I | _B, Ops.XOR: _I | _B,
  **{o: _F for o in (Ops.FDIV, Ops.POW, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.RECIPROCAL, Ops.TRUNC)},
  **{o: _B for o in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ)},
  Ops.WHERE: set(ALL), Ops.CAST: set(ALL),
}
SCALAR_OPS = frozenset(_OUT) | {Ops.CONST, Ops.DEFINE_VAR, Ops.RANGE}
_SAME = {Ops.CONTIGUOUS, Ops.CONTIGUOUS_BACKWARD, Ops.DETACH, Ops.FUSE, Ops.COPY, Ops.STAGE}
TENSOR_OPS = (frozenset(_OUT) - {Ops.CDIV, Ops.CMOD}) | MOVEMENT | _SAME | {Ops.CONST, Ops.BUFFER, Ops.REDUCE_AXIS, Ops.ASSIGN}
MODE_OPS = {"scalar": SCALAR_OPS, "tensor": TENSOR_OPS}


class Reject(Exception):
  """This draw cannot match the pattern (a dtype, shape or op conflict): try another."""


def dtypes_of(dts) -> set | None:
  if dts is None: return None
  out: set = set()
  for n, _ in dts: out |= dtype_set(n) or set()
  return out


def representable(v, dt: DType) -> bool:
  if isinstance(v, str) or v is None: return False
  if dt.kind == "b": return v in (0, 1)
  if dt.kind == "f": return True
  if isinstance(v, float) and not v.is_integer(): return False
  return dt.min() <= v <= dt.max()


def int_limits(dt: DType) -> tuple[int, int]:
  """The extremes generated for an integer dtype. `index` is narrowed to int32 or int64 by codegen and its
  values are sizes and offsets: its extremes are int32's, so 64-bit wrap-around is not what is tested there."""
  return (-(2 ** 31), 2 ** 31 - 1) if dt is dtypes.index else (dt.min(), dt.max())


def const_values(dt: DType) -> list:
  if dt.kind == "b": return [False, True]
  if dt.kind == "f": return [0.0, 1.0, 2.0, -1.0, 0.5, 3.0, -0.0, math.inf, math.nan]
  small = [0, 1, 2, 3, 4, -1, 5, 8, 16, -2, 7, -8, 6]
  lo, hi = int_limits(dt)
  return [v for v in small if representable(v, dt)] + [lo, hi, lo + 1, hi - 1]


class Gen:
  def __init__(self, draw, mode: str, tags: bool = False):
    self.draw, self.mode, self.tags = draw, mode, tags
    self.env: dict[str, UOp] = {}
    self.leaves: list[UOp] = []
    self.buffers: list[UOp] = []

  def pick(self, seq):
    seq = list(seq)
    if not seq: raise Reject("nothing to choose from")
    return seq[0] if len(seq) == 1 else self.draw(st.sampled_from(seq))

  def flag(self) -> bool: return self.draw(st.booleans())

  # *** the root ***

  def root(self, p) -> UOp:
    shape = None
    if self.mode == "tensor":
      if isinstance(p, A.PNode) and p.has_arg and isinstance(p.arg, tuple) and pattern_ops(p) <= {Ops.RESHAPE, Ops.EXPAND}:
        shape = p.arg
      else: shape = self.shape()
    u = self.node(p, None, shape)
    return u.replace(tag=self.pick((None, "tag"))) if self.tags and u.op not in (Ops.RANGE, Ops.DEFINE_VAR) else u

  def shape(self) -> tuple[int, ...]:
    return tuple(self.pick((1, 2, 3, 4, 6, 0)) for _ in range(self.pick((1, 2, 0, 3))))

  # *** patterns ***

  def node(self, p, want: DType | None, shape) -> UOp:
    if isinstance(p, A.PName):
      if p.name in self.env: return self._reuse(self.env[p.name], want, shape, dtypes_of(p.dtypes))
      u = self.filler(self._dtype(want, dtypes_of(p.dtypes), ALL), shape)
      if p.name != "_": self.env[p.name] = u
      return u
    if p.name is not None and p.name in self.env: return self._reuse(self.env[p.name], want, shape, None, p)
    if isinstance(p, A.PConst):
      if shape: raise Reject("a literal is a scalar")
      ok = [d for d in ALL if representable(p.value, d)]
      u = UOp.const(self._dtype(want, dtypes_of(p.dtypes), ok), p.value)
    else: u = self._pnode(p, want, shape)
    if p.name is not None: self.env[p.name] = u
    return u

  def _reuse(self, u: UOp, want, shape, dts, p=None) -> UOp:
    if (want is not None and u.dtype is not want) or (dts is not None and u.dtype not in dts): raise Reject("dtype")
    if shape is not None and u._shape != shape: raise Reject("shape")
    if p is not None:
      from rulec.engine.lang.interp import match
      if not any(True for _ in match(p, u, {})): raise Reject("a name bound twice to different shapes")
    return u

  def _dtype(self, want, allowed, choices) -> DType:
    opts = [d for d in choices if (allowed is None or d in allowed) and (want is None or d is want)]
    if not opts: raise Reject("dtype")
    return self.pick(opts)

  def _pnode(self, p: A.PNode, want, shape) -> UOp:
    allowed = dtypes_of(p.dtypes)
    ops = sorted(pattern_ops(p) & MODE_OPS[self.mode], key=int)
    if want is not None: ops = [o for o in ops if o not in _OUT or want in _OUT[o]]
    if self.mode == "tensor" and shape is None: shape = self.shape()
    if shape is not None and shape != (): ops = [o for o in ops if o is not Ops.CONST]
    op = self.pick(ops)
    if op in _OUT: dt = self._dtype(want, allowed, [d for d in ALL if d in _OUT[op]])
    else: dt = self._dtype(want, allowed, ALL)
    if op is Ops.CONST:
      arg = p.arg if p.has_arg else self.pick(const_values(dt))
      if not representable(arg, dt): raise Reject("const")
      return UOp.const(dt, arg)
    if op is Ops.DEFINE_VAR: return self.leaf(dt, "var")
    if op is Ops.RANGE:
      if dt is not dtypes.index: raise Reject("a RANGE is an index")
      return self.leaf(dt, "range")
    if op is Ops.BUFFER:
      if shape is not None and len(shape) != 1: raise Reject("a BUFFER is 1-D")
      return self.buffer(dt, shape[0] if shape else self.pick((4, 1, 6, 0)))
    arg, src_specs = self._layout(op, p, dt, shape)
    srcs = self._sources(p, op, src_specs)
    return UOp(op, dt, tuple(srcs), arg)

  def _sources(self, p: A.PNode, op, specs) -> list[UOp]:
    """specs: (dtype or None, shape) per source the op needs."""
    if p.each is not None:
      saved, self.env = self.env, {}
      try: return [self.node(p.each, d, s) for d, s in specs]
      finally: self.env = saved
    if p.srcs is None: return [self.filler(d or self._any_dtype(), s, broadcast=op in ALU) for d, s in specs]
    if len(p.srcs) > len(specs) or (p.tail is None and len(p.srcs) != len(specs)): raise Reject("source count")
    order = list(range(len(specs)))
    if op in COMMUTATIVE and len(p.srcs) == 2 and self.flag(): order = [1, 0]   # the swapped order matches too
    out: list = [None] * len(specs)
    for k, sp in enumerate(p.srcs):
      d, s = specs[order[k]]
      out[order[k]] = self.node(sp, d, s)
    for k in range(len(p.srcs), len(specs)): out[k] = self.filler(specs[k][0] or self._any_dtype(), specs[k][1])
    return out

  def _any_dtype(self) -> DType: return self.pick(ALL)

  def _layout(self, op, p: A.PNode, dt: DType, shape):
    """The op's arg and (dtype, shape) of each source, for an output of dtype dt and shape `shape`."""
    fixed = p.arg if p.has_arg else None
    if op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ):
      d = self.pick(ALL)
      return fixed, [(d, shape), (d, shape)]
    if op is Ops.WHERE: return fixed, [(dtypes.bool, shape), (dt, shape), (dt, shape)]
    if op is Ops.CAST: return fixed, [(self.pick(ALL), shape)]
    if op in _OUT: return fixed, [(dt, shape)] * (1 if op in UNARY else 3 if op is Ops.MULACC else 2)
    if op in _SAME:
      arg = fixed if p.has_arg else self.pick(DEVICES) if op in (Ops.COPY, Ops.STAGE) else None
      return arg, [(dt, shape)]
    if op is Ops.ASSIGN: return fixed, [(dt, shape), (dt, shape)]
    if op is Ops.REDUCE_AXIS: return self._reduce(fixed, p.has_arg, dt, shape)
    arg, ((_, src),) = self._movement(op, fixed, p, shape)
    return arg, [(dt, src)]

  def _reduce(self, fixed, has_arg, dt, shape):
    if has_arg: rop, axes = fixed
    else:
      rop = self.pick((Ops.ADD, Ops.MAX, Ops.MUL))
      axes = tuple(i for i, d in enumerate(shape) if d == 1 and self.flag())
    if any(a >= len(shape) or shape[a] != 1 for a in axes): raise Reject("reduced axes have size 1")
    src = tuple(self.pick((2, 3, 1, 0, 4, 16, 24, 32)) if i in axes else d for i, d in enumerate(shape))
    return (rop, axes), [(dt, src)]

  def _movement(self, op, fixed, p: A.PNode, shape):
    n = len(shape)
    if op is Ops.RESHAPE:
      if fixed is not None and tuple(fixed) != shape: raise Reject("reshape arg")
      child = p.srcs[0] if p.srcs else None
      if isinstance(child, A.PNode) and pattern_ops(child) == {Ops.BUFFER}: src = (prod(shape),)
      else: src = self.pick([shape, (prod(shape),), self._factor(prod(shape))])
      return shape, [(None, src)]
    if op is Ops.EXPAND:
      if fixed is not None and tuple(fixed) != shape: raise Reject("expand arg")
      return shape, [(None, tuple(1 if d != 1 and self.flag() else d for d in shape))]
    if op is Ops.PERMUTE:
      perm = tuple(fixed) if fixed is not None else tuple(self.draw(st.permutations(range(n))))
      if sorted(perm) != list(range(n)): raise Reject("permute arg")
      src = [0] * n
      for i, q in enumerate(perm): src[q] = shape[i]
      return perm, [(None, tuple(src))]
    if op is Ops.FLIP:
      arg = tuple(fixed) if fixed is not None else tuple(self.flag() for _ in shape)
      return arg, [(None, shape)]
    if op is Ops.PAD:
      arg = fixed if fixed is not None else tuple(self._pad(d) for d in shape)
      if len(arg) != n or any(b + a > d for (b, a), d in zip(arg, shape)): raise Reject("pad arg")
      return tuple(arg), [(None, tuple(d - b - a for (b, a), d in zip(arg, shape)))]
    if op is Ops.SHRINK:
      if fixed is not None:
        if tuple(e - b for b, e in fixed) != shape: raise Reject("shrink arg")
        return tuple(fixed), [(None, tuple(e + self.pick((0, 1, 2)) for _, e in fixed))]
      extra = [self.pick((0, 1, 2)) for _ in shape]
      starts = [self.draw(st.integers(0, e)) for e in extra]
      return tuple((b, b + d) for b, d in zip(starts, shape)), [(None, tuple(d + e for d, e in zip(shape, extra)))]
    raise Reject(f"no generator for {op.name}")

  def _pad(self, d: int) -> tuple[int, int]:
    b = self.draw(st.integers(0, min(2, d)))
    return (b, self.draw(st.integers(0, min(2, d - b))))

  def _factor(self, size: int) -> tuple[int, ...]:
    if size == 0: return (self.pick((2, 1, 3)), 0)
    dims, k = [], size
    for f in range(2, size + 1):
      while k % f == 0:
        k //= f
        if dims and self.flag(): dims[-1] *= f
        else: dims.append(f)
    return tuple(dims) or (1,)

  # *** leaves and fillers ***

  def filler(self, dt: DType, shape, broadcast: bool = False, depth: int = 2) -> UOp:
    """A random expression of dtype dt (of that shape, in tensor mode) for a free name."""
    if self.mode == "tensor": return self._tensor_filler(dt, shape, broadcast, depth)
    # a free name of the pattern is a leaf or an expression (a counterexample shrinks to a leaf, not a constant)
    kind = self.pick(("leaf", "expr") if depth == 2 else ("leaf", "const", "expr") if depth else ("leaf", "const"))
    if kind == "const": return UOp.const(dt, self.pick(const_values(dt)))
    if kind == "leaf":
      same = [u for u in self.leaves if u.dtype is dt]
      opts = same + (["new"] if len(self.leaves) < MAX_LEAVES else [])
      if not opts: return UOp.const(dt, self.pick(const_values(dt)))
      choice = self.pick(["new"] + same if "new" in opts else same)
      if choice != "new": return choice
      return self.leaf(dt, self.pick(("range", "var")) if dt is dtypes.index else "var")
    if dt is dtypes.bool:
      a = self.filler(dtypes.index, (), depth=depth - 1)
      return UOp(self.pick((Ops.CMPLT, Ops.CMPNE)), dt, (a, self.filler(dtypes.index, (), depth=depth - 1)))
    op = self.pick((Ops.ADD, Ops.MUL, Ops.IDIV, Ops.MOD, Ops.SUB) if dt.is_int else (Ops.ADD, Ops.MUL, Ops.SUB))
    a = self.filler(dt, (), depth=depth - 1)
    b = UOp.const(dt, self.pick(const_values(dt)[1:])) if op in (Ops.IDIV, Ops.MOD) or self.flag() else \
      self.filler(dt, (), depth=depth - 1)
    return UOp(op, dt, (a, b))

  def leaf(self, dt: DType, kind: str) -> UOp:
    if len(self.leaves) >= MAX_LEAVES: raise Reject("too many leaves")
    k = len(self.leaves)
    if kind == "range": u = UOp.range(self.pick(range(1, MAX_VALUES + 1)), k)
    elif dt.kind == "f": u = UOp.variable("abc"[k], -math.inf, math.inf, dt)
    elif dt.kind == "b": u = UOp.variable("abc"[k], False, True, dt)
    else:
      mn, mx = int_limits(dt)
      lo = self.pick([0, -3, 1, mn, mx - MAX_VALUES + 1, -MAX_VALUES, 5])
      lo = max(mn, min(lo, mx - 1))
      hi = min(mx, lo + self.draw(st.integers(0, MAX_VALUES - 1)))
      u = UOp.variable("abc"[k], lo, hi, dt)
    self.leaves.append(u)
    return u

  def buffer(self, dt: DType, size: int) -> UOp:
    from rulec.runtime.buffer import new_buffer
    b = new_buffer(self.pick(DEVICES), size, dt)
    rng = np.random.default_rng(self.draw(st.integers(0, 2 ** 16)))
    if dt.kind == "f": data = rng.choice(np.array([0.0, 1.0, -2.5, 3.0, 0.5, -1.0, 7.25, -0.0]), size)
    elif dt.kind == "b": data = rng.integers(0, 2, size).astype(bool)
    else: data = rng.integers(0 if dt.kind == "u" else -5, 10, size)
    from rulec.runtime.buffer import buffer_of
    buffer_of(b).copyin(np.asarray(data))
    self.buffers.append(b)
    return b

  def _tensor_filler(self, dt: DType, shape, broadcast: bool, depth: int) -> UOp:
    if broadcast and shape and self.flag():   # a broadcastable source: some axes 1, leading axes maybe dropped
      drop = self.draw(st.integers(0, len(shape)))
      shape = tuple(1 if self.flag() else d for d in shape[drop:])
    kind = self.pick(("buffer", "const", "expr", "view") if depth else ("buffer", "const"))
    if kind == "buffer" and self.buffers and self.flag():   # a view of a buffer already in the graph
      same = [b for b in self.buffers if b.dtype is dt and b.arg[-1] == prod(shape)]
      if same: return self.pick(same).reshape(shape)
    if kind == "const":
      c = UOp.const(dt, self.pick(const_values(dt)))
      return c.reshape((1,) * len(shape)).expand(shape) if shape else c
    if kind == "buffer": return self.buffer(dt, prod(shape)).reshape(shape)
    if kind == "view":
      op = self.pick((Ops.PERMUTE, Ops.SHRINK, Ops.FLIP, Ops.PAD, Ops.EXPAND))
      arg, ((_, src),) = self._movement(op, None, A.PNode(None, ()), shape)
      return UOp(op, dt, (self._tensor_filler(dt, src, False, 0),), arg)
    if dt is dtypes.bool:
      a, b = (self._tensor_filler(dtypes.int32, shape, False, depth - 1) for _ in range(2))
      return UOp(Ops.CMPLT, dt, (a, b))
    op = self.pick((Ops.ADD, Ops.MUL, Ops.MAX))
    return UOp(op, dt, tuple(self._tensor_filler(dt, shape, False, depth - 1) for _ in range(2)))
