"""The IR node: UOp(op, dtype, src, arg, tag).

UOps are immutable and hash-consed: building a node equal to a live one hands
back that same object. Graph identity is object identity, so rewrite memos and
rule bindings compare with `is` and dicts keyed by UOps are cheap.
"""
from __future__ import annotations

import itertools
import math
import weakref
from typing import Any, Callable, Iterable

from rulec.engine.ir.alu import round_float, wrap
from rulec.engine.ir.dtypes import DType, dtypes
from rulec.engine.ir.ops import ALU, BINARY, MOVEMENT, Ops

_ucache: dict[tuple, weakref.ref] = {}
_buffer_uids = itertools.count()   # one counter for every BUFFER, so two buffers never hash-cons into one


def _arg_kind(arg: Any) -> Any:
  """What keeps equal-hashing args apart in the cache key: CONST 0, 0.0 and False, and 0.0 and -0.0."""
  t = type(arg)
  if t is float and arg == 0.0 and math.copysign(1.0, arg) < 0: return "-0.0"
  return t


def prod(xs: Iterable[int]) -> int:
  out = 1
  for x in xs: out *= x
  return out


class UOp:
  __slots__ = ("op", "dtype", "src", "arg", "tag", "_memo", "__weakref__")
  op: Ops
  dtype: DType
  src: tuple[UOp, ...]
  arg: Any
  tag: Any

  def __new__(cls, op: Ops, dtype: DType = dtypes.void, src: tuple[UOp, ...] = (), arg: Any = None, tag: Any = None):
    key = (op, dtype, src, arg, _arg_kind(arg), tag)
    wr = _ucache.get(key)
    if wr is not None and (ret := wr()) is not None: return ret
    self = object.__new__(cls)
    object.__setattr__(self, "op", op)
    object.__setattr__(self, "dtype", dtype)
    object.__setattr__(self, "src", src)
    object.__setattr__(self, "arg", arg)
    object.__setattr__(self, "tag", tag)
    object.__setattr__(self, "_memo", None)
    _ucache[key] = weakref.ref(self)
    return self

  def __setattr__(self, name, value): raise AttributeError(f"UOp is immutable: cannot set {name!r}")
  def __reduce__(self): return (UOp, (self.op, self.dtype, self.src, self.arg, self.tag))

  def __del__(self):
    try:
      key = (self.op, self.dtype, self.src, self.arg, _arg_kind(self.arg), self.tag)
      wr = _ucache.get(key)
      if wr is not None and wr() in (self, None): del _ucache[key]
    except Exception: pass  # interpreter shutdown or an unhashable arg that never entered the cache

  # *** construction ***

  def replace(self, **kw) -> UOp:
    """This node with some fields changed (returns self when nothing changes)."""
    op, dtype, src, arg, tag = (kw.pop("op", self.op), kw.pop("dtype", self.dtype), kw.pop("src", self.src),
                                kw.pop("arg", self.arg), kw.pop("tag", self.tag))
    if kw: raise TypeError(f"replace() got unknown fields {sorted(kw)}")
    return UOp(op, dtype, tuple(src), arg, tag)

  def rtag(self, tag: Any = True) -> UOp: return self.replace(tag=tag)
  def f(self, op: Ops, **kw) -> UOp:
    """A new `op` node whose first source is this one: `x.f(Ops.NOOP)`."""
    return UOp(op, kw.pop("dtype", self.dtype), (self,) + tuple(kw.pop("src", ())), kw.pop("arg", None), kw.pop("tag", None))

  @staticmethod
  def const(dtype: DType, value: Any) -> UOp: return UOp(Ops.CONST, dtype, (), _as_dtype(value, dtype))
  def const_like(self, value: Any) -> UOp:
    c = UOp.const(self.dtype, value)
    shape = self._shape
    if shape: c = c.reshape((1,) * len(shape)).expand(shape)
    return c

  @staticmethod
  def new_buffer(device: str, size: int, dtype: DType) -> UOp:
    """A BUFFER node naming fresh storage (rulec.runtime.buffer allocates it on first use)."""
    return UOp(Ops.BUFFER, dtype, (), (next(_buffer_uids), device, size))

  @staticmethod
  def variable(name: str, lo: int, hi: int, dtype: DType = dtypes.index) -> UOp:
    return UOp(Ops.DEFINE_VAR, dtype, (), (name, lo, hi))
  @staticmethod
  def range(end: int | UOp, axis: int, kind: str = "loop") -> UOp:
    end = end if isinstance(end, UOp) else UOp.const(dtypes.index, end)
    return UOp(Ops.RANGE, dtypes.index, (end,), (axis, kind))
  @staticmethod
  def sink(*srcs: UOp, arg: Any = None) -> UOp: return UOp(Ops.SINK, dtypes.void, tuple(srcs), arg)

  def alu(self, op: Ops, *srcs: UOp | int | float | bool) -> UOp:
    operands = (self,) + tuple(s if isinstance(s, UOp) else self.const_like(s) for s in srcs)
    if op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ): out = dtypes.bool
    elif op is Ops.WHERE: out = operands[1].dtype
    else: out = self.dtype
    return UOp(op, out, operands)

  def cast(self, dtype: DType) -> UOp: return self if self.dtype is dtype else UOp(Ops.CAST, dtype, (self,))
  def bitcast(self, dtype: DType) -> UOp: return UOp(Ops.BITCAST, dtype, (self,))
  def where(self, a: UOp | int | float, b: UOp | int | float) -> UOp:
    ref = a if isinstance(a, UOp) else b if isinstance(b, UOp) else None
    if ref is None: raise TypeError("where() needs at least one UOp branch")
    a = a if isinstance(a, UOp) else ref.const_like(a)
    b = b if isinstance(b, UOp) else ref.const_like(b)
    return UOp(Ops.WHERE, a.dtype, (self, a, b))
  def index(self, *idxs: UOp, dtype: DType | None = None, arg: Any = None) -> UOp:
    return UOp(Ops.INDEX, self.dtype if dtype is None else dtype, (self,) + tuple(idxs), arg)
  def load(self) -> UOp: return UOp(Ops.LOAD, self.dtype, (self,))
  def store(self, value: UOp) -> UOp: return UOp(Ops.STORE, dtypes.void, (self, value))
  def end(self, *ranges: UOp) -> UOp: return UOp(Ops.END, dtypes.void, (self,) + tuple(ranges)) if ranges else self
  def after(self, *deps: UOp) -> UOp: return UOp(Ops.AFTER, self.dtype, (self,) + tuple(deps))
  def contiguous(self) -> UOp: return UOp(Ops.CONTIGUOUS, self.dtype, (self,))

  def lt(self, x) -> UOp: return self.alu(Ops.CMPLT, x)
  def ne(self, x) -> UOp: return self.alu(Ops.CMPNE, x)
  def eq(self, x) -> UOp: return self.alu(Ops.CMPEQ, x)
  def maximum(self, x) -> UOp: return self.alu(Ops.MAX, x)

  def __add__(self, x): return self.alu(Ops.ADD, x)
  def __radd__(self, x): return self.const_like(x).alu(Ops.ADD, self)
  def __sub__(self, x): return self.alu(Ops.SUB, x)
  def __rsub__(self, x): return self.const_like(x).alu(Ops.SUB, self)
  def __mul__(self, x): return self.alu(Ops.MUL, x)
  def __rmul__(self, x): return self.const_like(x).alu(Ops.MUL, self)
  def __floordiv__(self, x): return self.alu(Ops.IDIV, x)
  def __rfloordiv__(self, x): return self.const_like(x).alu(Ops.IDIV, self)
  def __mod__(self, x): return self.alu(Ops.MOD, x)
  def __rmod__(self, x): return self.const_like(x).alu(Ops.MOD, self)
  def __truediv__(self, x): return self.alu(Ops.FDIV, x)
  def __neg__(self): return UOp(Ops.NEG, self.dtype, (self,))
  def __and__(self, x): return self.alu(Ops.AND, x)
  def __or__(self, x): return self.alu(Ops.OR, x)
  def __xor__(self, x): return self.alu(Ops.XOR, x)
  def __lshift__(self, x): return self.alu(Ops.SHL, x)
  def __rshift__(self, x): return self.alu(Ops.SHR, x)
  def __bool__(self): return True

  # *** movement (static shapes live in arg) ***

  def reshape(self, shape: tuple[int, ...]) -> UOp:
    shape = tuple(shape)
    return self if self._shape == shape else UOp(Ops.RESHAPE, self.dtype, (self,), shape)
  def expand(self, shape: tuple[int, ...]) -> UOp:
    shape = tuple(shape)
    return self if self._shape == shape else UOp(Ops.EXPAND, self.dtype, (self,), shape)
  def permute(self, order: tuple[int, ...]) -> UOp:
    order = tuple(order)
    return self if order == tuple(range(len(order))) else UOp(Ops.PERMUTE, self.dtype, (self,), order)
  def pad(self, padding: tuple[tuple[int, int], ...]) -> UOp:
    padding = tuple(tuple(p) for p in padding)
    return self if all(p == (0, 0) for p in padding) else UOp(Ops.PAD, self.dtype, (self,), padding)
  def shrink(self, bounds: tuple[tuple[int, int], ...]) -> UOp:
    bounds = tuple(tuple(b) for b in bounds)
    return self if bounds == tuple((0, s) for s in self.shape) else UOp(Ops.SHRINK, self.dtype, (self,), bounds)
  def flip(self, axes: tuple[bool, ...]) -> UOp:
    axes = tuple(bool(a) for a in axes)
    return self if not any(axes) else UOp(Ops.FLIP, self.dtype, (self,), axes)
  def r(self, op: Ops, axes: tuple[int, ...]) -> UOp:
    return UOp(Ops.REDUCE_AXIS, self.dtype, (self,), (op, tuple(sorted(axes))))

  @property
  def marg(self) -> Any:
    """The movement argument of a movement op (its arg)."""
    if self.op not in MOVEMENT: raise ValueError(f"{self.op} is not a movement op")
    return self.arg

  @property
  def base(self) -> UOp:
    """The node under any chain of movement ops."""
    x = self
    while x.op in MOVEMENT: x = x.src[0]
    return x

  # *** derived properties (memoised per node) ***

  def _get_memo(self) -> dict:
    m = self._memo
    if m is None: object.__setattr__(self, "_memo", m := {})
    return m

  def _derive(self, key: str, fn: Callable[[UOp], Any]) -> Any:
    """A per-node derived value, computed for this node and any sources that lack it.

    Walks only the part of the graph not yet computed (iteratively, so deep
    graphs are fine) and stores no lists that reference nodes, so memos never
    keep a graph alive.
    """
    m = self._memo
    if m is not None and key in m: return m[key]
    for s in self.src:   # fast path: every source already has it (the common case for new nodes)
      sm = s._memo
      if sm is None or key not in sm: break
    else:
      v = fn(self)
      self._get_memo()[key] = v
      return v
    order: list[UOp] = []
    stack: list[tuple[UOp, bool]] = [(self, False)]
    seen: set[int] = set()
    while stack:
      u, ready = stack.pop()
      if ready: order.append(u); continue
      um = u._memo
      if (um is not None and key in um) or id(u) in seen: continue
      seen.add(id(u))
      stack.append((u, True))
      for s in u.src: stack.append((s, False))
    for u in order: u._get_memo()[key] = fn(u)
    return self._memo[key]

  @property
  def _shape(self) -> tuple[int, ...] | None: return self._derive("shape", _infer_shape)

  @property
  def shape(self) -> tuple[int, ...]:
    if (s := self._shape) is None: raise ValueError(f"{self.op} has no shape")
    return s

  @property
  def size(self) -> int: return prod(self.shape)
  @property
  def device(self) -> str | tuple[str, ...] | None:
    """Where this value lives: a BUFFER's device, a COPY's target, else its sources' (None for constants; a tuple
    of devices for a value spread over several, MSTACK)."""
    return self._derive("device", _infer_device)
  @property
  def ndim(self) -> int: return len(self.shape)

  def toposort(self, gate: Callable[[UOp], bool] | None = None) -> list[UOp]:
    """Every node reachable from this one, sources before users. `gate(u)` False stops descent below u."""
    seen: set[int] = set()
    out: list[UOp] = []
    stack: list[tuple[UOp, bool]] = [(self, False)]
    while stack:
      u, done = stack.pop()
      if done: out.append(u); continue
      if id(u) in seen: continue
      seen.add(id(u))
      stack.append((u, True))
      if gate is None or gate(u):
        for s in reversed(u.src):
          if id(s) not in seen: stack.append((s, False))
    return out

  @property
  def ranges(self) -> list[UOp]:
    """The RANGE nodes this node depends on."""
    return [u for u in self.toposort() if u.op is Ops.RANGE]

  # *** value bounds of index arithmetic (the symbolic rules use these) ***

  @property
  def vmin(self): return self._bounds()[0]
  @property
  def vmax(self): return self._bounds()[1]

  def _bounds(self): return self._derive("bounds", _infer_bounds)

  # *** printing ***

  def __repr__(self) -> str: return render(self)


def _as_dtype(value: Any, dtype: DType) -> Any:
  """A Python scalar of the kind `dtype` holds, so equal constants hash-cons together."""
  if isinstance(value, UOp): raise TypeError("const value must be a Python scalar, not a UOp")
  if dtype.kind == "f": return round_float(float(value), dtype)
  if dtype.kind == "b": return bool(value)
  if dtype.kind in "iux":
    if isinstance(value, float) and not value.is_integer(): raise ValueError(f"{value!r} is not an integer for {dtype}")
    return int(value)
  return value


def _infer_shape(u: UOp) -> tuple[int, ...] | None:
  op, src, arg = u.op, u.src, u.arg
  if op in (Ops.RESHAPE, Ops.EXPAND): return tuple(arg)
  if op is Ops.BUFFER: return (arg[-1],) if isinstance(arg, tuple) and arg and isinstance(arg[-1], int) else None
  if op in (Ops.CONST, Ops.DEFINE_VAR, Ops.RANGE, Ops.BIND): return ()
  if op in MOVEMENT:
    s = src[0]._get_memo().get("shape")
    if s is None: return None
    if op is Ops.PERMUTE: return tuple(s[i] for i in arg)
    if op is Ops.PAD: return tuple(d + b + a for d, (b, a) in zip(s, arg))
    if op is Ops.SHRINK: return tuple(e - b for b, e in arg)
    return s  # FLIP
  if op is Ops.REDUCE_AXIS:
    s = src[0]._get_memo().get("shape")
    return None if s is None else tuple(1 if i in arg[1] else d for i, d in enumerate(s))
  if op is Ops.INDEX:
    s = src[0]._get_memo().get("shape")
    return None if s is None else s[len(src) - 1:]
  if op in (Ops.MSTACK, Ops.MSELECT): return _multi_shape(u)
  if op is Ops.BITCAST and src and src[0].dtype.itemsize != u.dtype.itemsize:
    # a bitcast to another item size: the last axis holds the same bytes in more or fewer items
    s = src[0]._get_memo().get("shape")
    return None if not s else s[:-1] + (s[-1] * src[0].dtype.itemsize // u.dtype.itemsize,)
  if op in ALU or op in (Ops.CAST, Ops.BITCAST, Ops.CONTIGUOUS, Ops.CONTIGUOUS_BACKWARD, Ops.DETACH, Ops.FUSE, Ops.COPY,
                         Ops.ASSIGN, Ops.NOOP, Ops.LOAD, Ops.REDUCE, Ops.AFTER, Ops.STAGE):
    # elementwise ops take the shape of their widest source (a CONST source is a scalar)
    best = None
    for s in src:
      ss = s._get_memo().get("shape")
      if ss is not None and (best is None or len(ss) > len(best)): best = ss
    return best
  return None


def _multi_shape(u: UOp) -> tuple[int, ...] | None:
  """MSTACK(x_0..x_n)[(axis, devices)] is the value whose part on devices[i] is x_i: the parts joined along axis
  (axis None: each part is the whole value). MSELECT(v)[(i, axis, n)] is device i's part of v split n ways."""
  s = u.src[0]._get_memo().get("shape") if u.src else None
  axis = u.arg[0] if u.op is Ops.MSTACK else u.arg[1]
  if s is None or axis is None: return s
  n = len(u.arg[1]) if u.op is Ops.MSTACK else u.arg[2]
  return s[:axis] + (s[axis] * n if u.op is Ops.MSTACK else s[axis] // n,) + s[axis + 1:]


def _infer_device(u: UOp) -> str | tuple[str, ...] | None:
  """A device name; a tuple of them for a value spread over several devices (MSTACK, a COPY to several)."""
  if u.op is Ops.BUFFER: return u.arg[1]
  if u.op is Ops.COPY: return u.arg
  if u.op is Ops.MSTACK: return u.arg[1]
  if u.op is Ops.MSELECT:
    d = u.src[0]._memo["device"]
    return d[u.arg[0]] if isinstance(d, tuple) else d
  for s in u.src:
    d = s._memo["device"]
    if d is not None: return d
  return None


def _infer_bounds(u: UOp):
  """Bounds of u's value. Integers wrap around (engine/ir/alu.py), so for an integer dtype (index included: it
  wraps at 64 bits) bounds computed from the sources' bounds that leave the dtype's range give way to that
  whole range: the op may have wrapped, and its value can be anything the dtype holds."""
  lo, hi = _op_bounds(u)
  d = u.dtype
  if d.kind in "iux" and isinstance(lo, int) and isinstance(hi, int) and (lo < d.min() or hi > d.max()):
    return (d.min(), d.max())
  return (lo, hi)


def _op_bounds(u: UOp):
  op, src = u.op, u.src
  if op is Ops.CONST: return (wrap(u.arg, u.dtype),) * 2 if u.dtype.kind in "iux" and isinstance(u.arg, int) else (u.arg, u.arg)
  if op is Ops.DEFINE_VAR: return (u.arg[1], u.arg[2])
  if op is Ops.RANGE:
    hi = src[0]._get_memo()["bounds"][1]
    return (0, hi - 1 if isinstance(hi, int) else hi)
  if op in BINARY or op in (Ops.NEG, Ops.WHERE, Ops.CAST):
    b = [s._get_memo()["bounds"] for s in src]
    try:
      if op is Ops.NEG: return (-b[0][1], -b[0][0])
      if op is Ops.ADD: return (b[0][0] + b[1][0], b[0][1] + b[1][1])
      if op is Ops.SUB: return (b[0][0] - b[1][1], b[0][1] - b[1][0])
      if op is Ops.MUL:
        vals = [x * y for x in b[0] for y in b[1]]
        return (min(vals), max(vals))
      if op is Ops.MAX: return (max(b[0][0], b[1][0]), max(b[0][1], b[1][1]))
      # (integers only: a float // or % by c is not confined to whole steps of c)
      if op is Ops.IDIV and u.dtype.is_int and b[1][0] == b[1][1] and b[1][0] > 0:
        c = b[1][0]
        return (b[0][0] // c, b[0][1] // c)
      if op is Ops.MOD and u.dtype.is_int and b[1][0] == b[1][1] and b[1][0] > 0:
        c, (lo, hi) = b[1][0], b[0]
        # inside one period the remainder moves with x; otherwise it can be anything in [0, c)
        if hi - lo < c and lo % c <= hi % c: return (lo % c, hi % c)
        return (0, c - 1)
      if op is Ops.CMPLT:
        if b[0][1] < b[1][0]: return (True, True)
        if b[0][0] >= b[1][1]: return (False, False)
        return (False, True)
      if op is Ops.WHERE: return (min(b[1][0], b[2][0]), max(b[1][1], b[2][1]))
      if op is Ops.CAST and u.dtype.is_int and all(isinstance(x, int) for x in b[0]): return b[0]
    except TypeError: pass
  d = u.dtype
  if d.kind == "f" or d.kind == "v": return (-math.inf, math.inf)
  return (d.min(), d.max())


# *** printing in .rules syntax ***

_SUGAR = {Ops.ADD: "+", Ops.SUB: "-", Ops.MUL: "*", Ops.IDIV: "//", Ops.MOD: "%", Ops.CMPLT: "<", Ops.CMPNE: "!=",
          Ops.AND: "&", Ops.XOR: "^", Ops.SHL: "<<", Ops.SHR: ">>"}


def render(u: UOp, depth: int = 6) -> str:
  """A node as a .rules-style expression (cut off below `depth` levels)."""
  if u.op is Ops.CONST: return repr(u.arg) if u.dtype in (dtypes.index, dtypes.int32, dtypes.float32, dtypes.bool) \
    else f"{u.arg!r}{{{u.dtype.name}}}"
  if u.op is Ops.DEFINE_VAR: return str(u.arg[0])
  if u.op is Ops.RANGE: return f"r{u.arg[0]}"
  if depth == 0: return f"{u.op.name}(..)"
  if u.op in _SUGAR and len(u.src) == 2:
    return f"({render(u.src[0], depth - 1)} {_SUGAR[u.op]} {render(u.src[1], depth - 1)})"
  inner = ", ".join(render(s, depth - 1) for s in u.src)
  extra = "" if u.arg is None else f"[{u.arg!r}]"
  return f"{u.op.name}({inner}){extra}"
