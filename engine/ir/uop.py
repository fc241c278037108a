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

import numpy as np

from rulec.engine.ir.alu import exec_alu, round_float, wrap
from rulec.engine.ir.dtypes import DType, dtypes, int_limits
from rulec.engine.ir.ops import ALU, BINARY, MOVEMENT, Ops

_ucache: dict[tuple, weakref.ref] = {}
_buffer_uids = itertools.count()   # one counter for every BUFFER, so two buffers never hash-cons into one


_NEW, _REF = object.__new__, weakref.ref


def prod(xs: Iterable[int]) -> int:
  out = 1
  for x in xs: out *= x
  return out


class UOp:
  __slots__ = ("op", "dtype", "src", "arg", "tag", "_memo", "_key", "__weakref__")
  op: Ops
  dtype: DType
  src: tuple[UOp, ...]
  arg: Any
  tag: Any

  def __new__(cls, op: Ops, dtype: DType = dtypes.void, src: tuple[UOp, ...] = (), arg: Any = None, tag: Any = None):
    # (this runs for every node every rewrite builds: no call per node.) The arg's kind keeps equal-hashing args
    # apart in the cache key: CONST 0, 0.0 and False, and 0.0 and -0.0
    kind = type(arg)
    if kind is float and arg == 0.0 and math.copysign(1.0, arg) < 0: kind = "-0.0"
    key = (op, dtype, src, arg, kind, tag)
    wr = _ucache.get(key)
    if wr is not None and (ret := wr()) is not None: return ret
    self = _NEW(cls)
    # (through each slot's own setter: object.__setattr__ would look the name up for every field of every node)
    _SET_OP(self, op)
    _SET_DTYPE(self, dtype)
    _SET_SRC(self, src)
    _SET_ARG(self, arg)
    _SET_TAG(self, tag)
    _SET_MEMO(self, None)
    _SET_KEY(self, key)   # (kept for __del__, which would otherwise build it again for every node freed)
    _ucache[key] = _REF(self)
    return self

  def __setattr__(self, name, value): raise AttributeError(f"UOp is immutable: cannot set {name!r}")
  def __reduce__(self): return (UOp, (self.op, self.dtype, self.src, self.arg, self.tag))

  def __del__(self):
    try:
      key = self._key
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
  def variable(name: str, min_val: Any, max_val: Any, dtype: DType = dtypes.index) -> UOp:
    """A named value in [min_val, max_val]: tinygrad's `Variable` (`UOp.variable`); `.bind(v)` gives it a value."""
    # (integer bounds as ints: hash-consing would take ("n", 0.0, 3) and ("n", 0, 3) for one node, they compare equal)
    if dtype.is_int:
      min_val, max_val = (int(x) if isinstance(x, float) and x.is_integer() else x for x in (min_val, max_val))
    return UOp(Ops.DEFINE_VAR, dtype, (), (name, min_val, max_val))
  @staticmethod
  def range(end: int | UOp, axis: int, kind: str = "loop") -> UOp:
    end = end if isinstance(end, UOp) else UOp.const(dtypes.index, end)
    return UOp(Ops.RANGE, dtypes.index, (end,), (axis, kind))
  @staticmethod
  def sink(*srcs: UOp, arg: Any = None) -> UOp: return UOp(Ops.SINK, dtypes.void, tuple(srcs), arg)

  def alu(self, op: Ops, *srcs: UOp | int | float | bool) -> UOp:
    # (one operand, the common case, without a generator: the symbolic rules build nodes through + and * all pass)
    if len(srcs) == 1:
      s = srcs[0]
      operands = (self, s if s.__class__ is UOp else self.const_like(s))
    else: operands = (self,) + tuple(s if isinstance(s, UOp) else self.const_like(s) for s in srcs)
    if op in _COMPARE: out = dtypes.bool
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

  def __add__(self, x): return self.alu(Ops.ADD, x) if isinstance(x, _OPERAND) else NotImplemented
  def __radd__(self, x): return self.const_like(x).alu(Ops.ADD, self)
  def __sub__(self, x): return self.alu(Ops.SUB, x) if isinstance(x, _OPERAND) else NotImplemented
  def __rsub__(self, x): return self.const_like(x).alu(Ops.SUB, self)
  def __mul__(self, x): return self.alu(Ops.MUL, x) if isinstance(x, _OPERAND) else NotImplemented
  def __rmul__(self, x): return self.const_like(x).alu(Ops.MUL, self)
  def __floordiv__(self, x): return self.alu(Ops.IDIV, x) if isinstance(x, _OPERAND) else NotImplemented
  def __rfloordiv__(self, x): return self.const_like(x).alu(Ops.IDIV, self)
  def __mod__(self, x): return self.alu(Ops.MOD, x) if isinstance(x, _OPERAND) else NotImplemented
  def __rmod__(self, x): return self.const_like(x).alu(Ops.MOD, self)
  def __truediv__(self, x): return self.alu(Ops.FDIV, x) if isinstance(x, _OPERAND) else NotImplemented
  def __neg__(self): return UOp(Ops.NEG, self.dtype, (self,))
  def __and__(self, x): return self.alu(Ops.AND, x)
  def __or__(self, x): return self.alu(Ops.OR, x)
  def __xor__(self, x): return self.alu(Ops.XOR, x)
  def __lshift__(self, x): return self.alu(Ops.SHL, x)
  def __rshift__(self, x): return self.alu(Ops.SHR, x)
  def __bool__(self):
    # a comparison of symbolic values (a Variable, bound or not) is its truth, as in tinygrad (ValueError when the
    # range does not decide it); every other node is true, so `if u:` tests a node's presence
    if self.op in _COMPARE and self.dtype is dtypes.bool and self.is_symbolic: return bool(self._eval())
    return True

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
    """A reduce over axes. Over an axis whose size is a Variable (`sizes`), the elements past that size are
    not part of the value: they are replaced by the reduce's identity first."""
    axes = tuple(sorted(axes))
    x = self
    if (sizes := self.sizes) is not None and any(sizes[a] is not None for a in axes):
      from rulec.engine.ir.alu import identity_element
      keep = None
      for a in axes:
        if sizes[a] is not None:
          m = first_n(sizes[a], self.shape, a)
          keep = m if keep is None else keep.alu(Ops.AND, m)
      if not (x.op is Ops.WHERE and x.src[0] is keep):   # (masked once: a rule that rebuilds the reduce keeps it)
        x = keep.where(x, x.const_like(identity_element(op, x.dtype)))
    return UOp(Ops.REDUCE_AXIS, self.dtype, (x,), (op, axes))

  @property
  def sizes(self) -> tuple[UOp | None, ...] | None:
    """Per axis, the size as an expression of bound Variables where it depends on them (`cache[:, 0:p+1]`), else
    None; None when no axis has one. Such an axis has its largest size in `shape` (the elements past the bound
    size are there, and are no part of the value: reductions skip them, a read on the host drops them)."""
    return self._derive("sizes", _infer_sizes)

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
    if m is None: _SET_MEMO(self, m := {})
    return m

  def memo_root(self, key: str, fn: Callable[[UOp], Any]) -> Any:
    """fn(self), computed once and kept with this node (a value of the node alone, such as a kernel AST's variables
    or written slots: asked on every launch, so a dict lookup on the node rather than a weak mapping keyed by it)."""
    m = self._memo
    if m is not None and key in m: return m[key]
    v = fn(self)
    self._get_memo()[key] = v
    return v

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
    # (the nodes themselves in `seen`: a UOp hashes by identity, so no id() call per visit; the scheduler walks
    # model-sized graphs tens of thousands of times a schedule)
    seen: set[UOp] = set()
    out: list[UOp] = []
    stack: list[tuple[UOp, bool]] = [(self, False)]
    pop, push, add, emit = stack.pop, stack.append, seen.add, out.append
    while stack:
      u, done = pop()
      if done: emit(u); continue
      if u in seen: continue
      add(u)
      push((u, True))
      if gate is None or gate(u):
        for s in reversed(u.src):
          if s not in seen: push((s, False))
    return out

  @property
  def ranges(self) -> list[UOp]:
    """The RANGE nodes this node depends on."""
    return [u for u in self.toposort() if u.op is Ops.RANGE]

  # *** value bounds of index arithmetic (the symbolic rules use these) ***

  # (the kept bounds read straight from the memo: the symbolic rules ask for them tens of thousands of times a pass)
  @property
  def vmin(self):
    m = self._memo
    return m["bounds"][0] if m is not None and "bounds" in m else self._bounds()[0]
  @property
  def vmax(self):
    m = self._memo
    return m["bounds"][1] if m is not None and "bounds" in m else self._bounds()[1]

  def _bounds(self): return self._derive("bounds", _infer_bounds)

  # *** symbolic values: tinygrad's Variable (UOp.variable(name, min, max).bind(value)) ***
  # The Tensor front end specialises a bound value: a shape, offset or scalar given as a bound expression is its int
  # (int() / operator.index), so the graph, its schedule and its kernels are built for that value (docs/api.md,
  # "Symbolic shapes"). Reads of bound values are reported to `BOUND_READS` (TinyJit checks what a capture used).

  def bind(self, val: Any) -> UOp:
    """This Variable with a value: BIND(var, CONST(val)). AssertionError (tinygrad's) when val is out of range."""
    if self.op is not Ops.DEFINE_VAR: raise AssertionError(f"op is {self.op}, need Variable")
    if isinstance(val, UOp): val = int(val)
    elif isinstance(val, bool) or not hasattr(type(val), "__index__"):
      raise TypeError(f"bind takes an int, got {type(val).__name__} {val!r}")
    v = val.__index__()
    _, lo, hi = self.arg
    if not lo <= v <= hi: raise AssertionError(f"bind {v} not in range [{lo}, {hi}]")
    return UOp(Ops.BIND, self.dtype, (self, UOp.const(self.dtype, v)))
  def unbind(self) -> tuple[UOp, int]:
    """(the Variable, its value) of a bound Variable."""
    if self.op is not Ops.BIND: raise AssertionError(f"can't unbind {self}")
    _read(self)
    return self.src[0], self.src[1].arg
  def unbind_all(self) -> tuple[UOp, dict[UOp, int]]:
    """This expression with each bound Variable replaced by the Variable, and {Variable: value}."""
    var_vals: dict[UOp, int] = {}
    new: dict[UOp, UOp] = {}
    for u in self.toposort(gate=lambda x: x.op is not Ops.BIND):
      if u.op is Ops.BIND:
        var, v = u.unbind()
        if var_vals.get(var, v) != v: raise ValueError(f"{var.arg[0]} is bound to both {var_vals[var]} and {v}")
        var_vals[var], new[u] = v, var
      elif u.src: new[u] = u.replace(src=tuple(new[s] for s in u.src))
      else: new[u] = u
    return new[self], var_vals
  def variables(self) -> list[UOp]:
    """The Variables (DEFINE_VAR nodes) this expression depends on, sorted by name."""
    return sorted({u for u in self.toposort() if u.op is Ops.DEFINE_VAR}, key=lambda u: u.arg[0])
  @property
  def expr(self) -> str:
    """A Variable's name (of a bound one too)."""
    if self.op is Ops.BIND: return self.src[0].arg[0]
    if self.op is not Ops.DEFINE_VAR: raise AssertionError(f"expr is only for a Variable, got {self.op}")
    return self.arg[0]
  @property
  def is_symbolic(self) -> bool:
    """Whether this is an expression over Variables (bound or not): a Variable, a bound one, or arithmetic on them."""
    return self._derive("symbolic", _is_symbolic)
  @property
  def val(self) -> Any:
    """A CONST's value, or a bound Variable's (tinygrad 0.14 has it for CONST only)."""
    if self.op is Ops.CONST: return self.arg
    if self.op is Ops.BIND: return self.unbind()[1]
    raise AssertionError(f"val is only for CONST, got {self.op}")
  def render(self) -> str:
    """The expression as tinygrad prints it: `(start_pos+1)`, `(start_pos*2)`, `(start_pos<3)`."""
    return _render_symbolic(self)

  def _eval(self) -> Any:
    """The value of an expression over constants and bound Variables (ValueError, tinygrad's, if it is not one
    number: an unbound Variable whose range does not decide it)."""
    vals: dict[UOp, Any] = {}
    for u in self.toposort(gate=lambda x: x.op is not Ops.BIND):
      if u.op is Ops.CONST: vals[u] = u.arg
      elif u.op is Ops.BIND: vals[u] = u.unbind()[1]
      elif u.op in ALU and all(s in vals for s in u.src) and (u.op is not Ops.FDIV or u.dtype.kind == "f"):
        try: vals[u] = exec_alu(u.op, u.dtype, [vals[s] for s in u.src])
        except (ZeroDivisionError, KeyError, TypeError): pass
      elif u.op is Ops.CAST and u.src[0] in vals: vals[u] = _as_dtype(vals[u.src[0]], u.dtype)
    if self in vals: return vals[self]
    lo, hi = self.vmin, self.vmax
    if lo == hi: return lo
    unbound = [u.arg[0] for u in self.variables() if not any(b.src[0] is u for b in self.toposort() if b.op is Ops.BIND)]
    hint = f" (Variable {', '.join(unbound)} is not bound: .bind(value) it)" if unbound else ""
    raise ValueError(f"eval failed to be a single number, range is {lo} to {hi} in {self.render()}{hint}")
  def __int__(self) -> int:
    if self.dtype.kind not in "iux": raise TypeError(f"int() of a {self.dtype.name} value {self.render()}")
    return int(self._eval())
  def __index__(self) -> int: return self.__int__()
  # comparisons build CMPLT nodes, as tinygrad's (`==` stays identity: UOps are dict keys; `!=` too, unlike tinygrad)
  def __lt__(self, x): return self.alu(Ops.CMPLT, x) if isinstance(x, _OPERAND) else NotImplemented
  def __gt__(self, x):
    return (x if isinstance(x, UOp) else self.const_like(x)).alu(Ops.CMPLT, self) if isinstance(x, _OPERAND) else NotImplemented
  def __le__(self, x): return self.__gt__(x).alu(Ops.CMPNE, True) if isinstance(x, _OPERAND) else NotImplemented
  def __ge__(self, x): return self.__lt__(x).alu(Ops.CMPNE, True) if isinstance(x, _OPERAND) else NotImplemented

  # *** printing ***

  def __repr__(self) -> str: return render(self)


def arg_key(u: UOp) -> Any:
  """u's arg as part of a structural key (a graph spelled out node by node: the schedule cache's, symbolic's
  shape-keyed fits). A CONST keeps its type (0, 0.0 and False differ) and a float its exact bits as hex, so -0.0
  and 0.0 differ and a NaN equals itself."""
  a = u.arg
  if type(a) is float: return (float, a.hex())
  if u.op is Ops.CONST: return (type(a), a)
  return a


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
    if op is Ops.PAD: return tuple(d + b + a if type(b) is int and type(a) is int else sint_size(d, b, a) for d, (b, a) in zip(s, arg))
    if op is Ops.SHRINK: return tuple(e - b if type(b) is int and type(e) is int else _shrunk_size(b, e) for b, e in arg)
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


# *** symbolic offsets: movement args that are expressions of Variables ***
# A SHRINK or PAD may take an offset that is an expression of Variables (bound or not: `cache[:, p:p+1]` with p a
# bound Variable), as long as the size it gives does not depend on them: shapes stay ints. These find that size.

def linear_form(x: Any) -> tuple[dict[UOp, int], int] | None:
  """x (an int, or an integer expression of Variables) as ({Variable: coefficient}, constant), a BIND counted as
  its Variable; None when x is not a sum of Variables times ints plus an int."""
  if isinstance(x, (int, np.integer)) and not isinstance(x, bool): return {}, int(x)
  if not isinstance(x, UOp) or not x.dtype.is_int: return None
  if x.op is Ops.CONST: return {}, int(x.arg)
  if x.op is Ops.DEFINE_VAR: return {x: 1}, 0
  if x.op is Ops.BIND: return {x.src[0]: 1}, 0
  if x.op is Ops.NEG:
    a = linear_form(x.src[0])
    return None if a is None else ({v: -c for v, c in a[0].items()}, -a[1])
  if x.op in (Ops.ADD, Ops.SUB, Ops.MUL) and len(x.src) == 2:
    a, b = linear_form(x.src[0]), linear_form(x.src[1])
    if a is None or b is None: return None
    if x.op is Ops.MUL:
      if a[0] and b[0]: return None
      (k, (vs, c)) = (a[1], b) if not a[0] else (b[1], a)
      return {v: k * n for v, n in vs.items() if k * n}, k * c
    sign = 1 if x.op is Ops.ADD else -1
    vs = dict(a[0])
    for v, n in b[0].items(): vs[v] = vs.get(v, 0) + sign * n
    return {v: n for v, n in vs.items() if n}, a[1] + sign * b[1]
  return None


def sint_size(*parts: Any) -> Any:
  """The sum of parts (ints and Variable expressions) as an int when the Variables cancel; else that sum as an
  expression (a shape that is not an int: the front end keeps such sizes out of graphs)."""
  vs: dict[UOp, int] = {}
  c = 0
  for p in parts:
    f = linear_form(p)
    if f is None: return sum(parts[1:], parts[0])
    for v, n in f[0].items(): vs[v] = vs.get(v, 0) + n
    c += f[1]
  return c if not any(vs.values()) else sum(parts[1:], parts[0])


def _value(x: UOp) -> int:
  """A bound offset's value (a linear expression: engine/tensor/args.py's symbolic_bounds keeps no other), without
  reporting it read."""
  f = linear_form(x)
  vals = {b.src[0]: b.src[1].arg for b in x.toposort() if b.op is Ops.BIND}
  if f is None or any(v not in vals for v in f[0]): raise ValueError(f"{x.render()} is not a bound offset")
  return f[1] + sum(n * vals[v] for v, n in f[0].items())


def concrete_arg(u: UOp) -> Any:
  """A movement op's arg with each bound offset as its int, and a size that is a Variable's at its largest, as in
  `shape` (host-side views: reading one, checking a write target; the caller drops what `sizes` leaves out)."""
  arg = u.arg
  if type(arg) is not tuple or not any(isinstance(p, tuple) and any(isinstance(x, UOp) for x in p) for p in arg): return arg
  if u.op is Ops.SHRINK:
    starts = [b if type(b) is int else _value(b) for b, _ in arg]
    return tuple((b, b + n) for b, n in zip(starts, u.shape))
  return tuple(tuple(_value(x) if isinstance(x, UOp) else x for x in p) if isinstance(p, tuple) else p for p in arg)


def with_sizes(view: UOp, sizes: tuple | None) -> UOp:
  """A realized view of a value whose sizes are Variables' (UOp.sizes): shrunk to them, so that it keeps them."""
  if sizes is None: return view
  return view.shrink(tuple((0, n) if v is None else (0, v) for v, n in zip(sizes, view.shape)))


def trim_to_sizes(a: np.ndarray, sizes: tuple | None) -> np.ndarray:
  """A host array of a value's largest shape cut to its sizes (the bound values of UOp.sizes)."""
  if sizes is None: return a
  return a[tuple(slice(None) if v is None else slice(0, _value(v)) for v in sizes)]


def _shrunk_size(b: Any, e: Any) -> int:
  """The size of a SHRINK to [b, e) with an expression of Variables at an end: e - b when the Variables cancel
  (an offset that moves), else the largest e - b can be (a size that is a Variable: `sizes` has the real one)."""
  n = sint_size(e, -1 * b)
  return n if isinstance(n, int) else int(n.vmax)


def first_n(n: UOp, shape: tuple[int, ...], axis: int) -> UOp:
  """A bool of `shape`: True where the index along `axis` is below n (an expression of bound Variables, at most
  shape[axis]). Static shapes only: N ones and N zeros, read from offset N - n (a symbolic offset)."""
  N = shape[axis]
  line = UOp.const(dtypes.bool, True).reshape((1,)).expand((N,)).pad(((0, N),))
  line = line.shrink(((N - n, 2 * N - n),))
  return line.reshape(tuple(N if i == axis else 1 for i in range(len(shape)))).expand(shape)


def _infer_sizes(u: UOp) -> tuple | None:
  op, src, arg = u.op, u.src, u.arg
  below = [s._get_memo().get("sizes") for s in src]
  if op is Ops.SHRINK:
    own = tuple(None if type(b) is int and type(e) is int or isinstance(sint_size(e, -1 * b), int) else
                e if type(b) is int and b == 0 else e - b for b, e in arg)
    if below[0] is not None:
      for i, (v, (b, e)) in enumerate(zip(below[0], arg)):
        if v is not None and (b, e) != (0, src[0].shape[i]):
          raise ValueError(f"cannot shrink axis {i}: its size is {v.render()}, a Variable's")
      own = tuple(o if o is not None else v for o, v in zip(own, below[0]))
    return own if any(x is not None for x in own) else None
  if all(b is None for b in below): return None
  if op is Ops.REDUCE_AXIS: return tuple(None if i in arg[1] else v for i, v in enumerate(below[0]))
  if op is Ops.PERMUTE: return tuple(below[0][i] for i in arg)
  if op is Ops.EXPAND: return below[0]
  if op in (Ops.PAD, Ops.FLIP):
    for i, v in enumerate(below[0]):
      if v is not None and (arg[i] if op is Ops.FLIP else arg[i] != (0, 0)):
        raise ValueError(f"cannot {op.name.lower()} axis {i}: its size is {v.render()}, a Variable's")
    return below[0]
  if op is Ops.RESHAPE: return _reshaped_sizes(src[0].shape, tuple(arg), below[0])
  if op is Ops.WHERE and below[0] is None and below[2] is None and below[1] is not None and len(below[1]) == len(u.shape):
    # WHERE(first_n(n) along an axis, x, c): x's value extended with c past n, a value of the axis's whole size
    kept = tuple(None if v is not None and src[0] is first_n(v, u.shape, i) else v for i, v in enumerate(below[1]))
    return kept if any(x is not None for x in kept) else None
  if op in (Ops.BUFFER, Ops.CONST, Ops.DEFINE_VAR, Ops.BIND, Ops.RANGE): return None
  # elementwise (and the ops that keep their source's shape; a scalar source has no axes): one size per axis,
  # and two different ones do not mix
  n = len(u.shape) if u._shape is not None else 0
  out: list = [None] * n
  for b in below:
    if b is None or len(b) != n: continue
    for i, x in enumerate(b):
      if x is None: continue
      if out[i] is not None and out[i] is not x:
        raise ValueError(f"axis {i} has two sizes that are Variables': {out[i].render()} and {x.render()}")
      out[i] = x
  return tuple(out) if any(x is not None for x in out) else None


def _reshaped_sizes(old: tuple[int, ...], new: tuple[int, ...], sizes: tuple) -> tuple | None:
  """A reshape's sizes: an axis whose size is a Variable stays one axis of the same extent, or leads a group of
  axes merged into one (its size times the rest's); any other reshape of it is an error."""
  out: list = [None] * len(new)
  for i, v in enumerate(sizes):
    if v is None: continue
    before = prod(old[:i])
    j, acc = 0, 1
    while j < len(new) and acc < before: acc *= new[j]; j += 1
    while j < len(new) and new[j] == 1 and old[i] != 1: j += 1
    if acc != before or j >= len(new): j = -1
    elif new[j] == old[i]: out[j] = v; continue
    else:
      # merged with the axes after it: the new axis must hold exactly old[i:k] for some k
      k, ext = i + 1, old[i]
      while k < len(old) and ext < new[j]: ext *= old[k]; k += 1
      if ext == new[j]:
        out[j] = v * (ext // old[i])
        continue
    raise ValueError(f"cannot reshape {old} to {new}: axis {i}'s size is {v.render()}, a Variable's, and the reshape "
                     "would split it or put it inside a merged axis")
  return tuple(out) if any(x is not None for x in out) else None


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
  if d.kind in "iux" and isinstance(lo, int) and isinstance(hi, int):
    limits = int_limits(d)
    if lo < limits[0] or hi > limits[1]: return limits
  return (lo, hi)


def _truncated(x: int, c: int) -> int:
  """x / c rounded toward zero (C's division), for c > 0."""
  return x // c if x >= 0 else -(-x // c)


def _op_bounds(u: UOp):
  op, src = u.op, u.src
  if op is Ops.CONST: return (wrap(u.arg, u.dtype),) * 2 if u.dtype.kind in "iux" and isinstance(u.arg, int) else (u.arg, u.arg)
  if op is Ops.DEFINE_VAR: return (u.arg[1], u.arg[2])
  if op is Ops.BIND: return src[0]._get_memo()["bounds"]   # (the Variable's range: a bound value is not a constant)
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
      # (integers only: a float // or % by c is not confined to whole steps of c). CDIV / CMOD are C's truncating
      # division and remainder, which rules/decomp.rules writes for // and % of a value that cannot be negative:
      # without their bounds every load indexed through one was clamped (LLaMA's grouped-query heads, rotary pairs)
      if op in (Ops.IDIV, Ops.CDIV) and u.dtype.is_int and b[1][0] == b[1][1] and b[1][0] > 0:
        c = b[1][0]
        div = (lambda x: x // c) if op is Ops.IDIV else (lambda x: _truncated(x, c))
        return (div(b[0][0]), div(b[0][1]))
      if op in (Ops.MOD, Ops.CMOD) and u.dtype.is_int and b[1][0] == b[1][1] and b[1][0] > 0:
        c, (lo, hi) = b[1][0], b[0]
        if op is Ops.CMOD and lo < 0:   # (C's remainder takes the dividend's sign, and is smaller than c)
          return (max(lo, 1 - c), 0) if hi <= 0 else (max(lo, 1 - c), min(hi, c - 1))
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


# *** symbolic values ***

# what UOp arithmetic takes as its other operand; anything else (a Tensor) gets NotImplemented, so Python asks it
_OPERAND = (UOp, int, float, np.generic)
_SET_OP, _SET_DTYPE, _SET_SRC, _SET_ARG, _SET_TAG, _SET_MEMO, _SET_KEY = (
  UOp.__dict__[f].__set__ for f in ("op", "dtype", "src", "arg", "tag", "_memo", "_key"))

_COMPARE = frozenset({Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ})

# TinyJit pushes a set here while it captures; every read of a bound value (int() of a bound expression, unbind(),
# .val) adds the BIND node to the innermost set, so a capture knows which bound values its kernels were built for
BOUND_READS: list[set] = []


def _read(bind: UOp) -> None:
  if BOUND_READS: BOUND_READS[-1].add(bind)


def _is_symbolic(u: UOp) -> bool:
  return u.op in (Ops.DEFINE_VAR, Ops.BIND) or any(s._get_memo()["symbolic"] for s in u.src)


_TG_SUGAR = {Ops.ADD: "+", Ops.MUL: "*", Ops.IDIV: "//", Ops.MOD: "%", Ops.CMPLT: "<", Ops.CMPNE: "!=", Ops.CMPEQ: "==",
             Ops.AND: "&", Ops.OR: "|", Ops.XOR: "^", Ops.SHL: "<<", Ops.SHR: ">>"}


def _render_symbolic(u: UOp) -> str:
  """tinygrad's rendering of an index expression: variables by name, a bound one too, `(a+b)`, `(a+-1)`."""
  if u.op is Ops.CONST: return str(u.arg)
  if u.op is Ops.DEFINE_VAR: return str(u.arg[0])
  if u.op is Ops.BIND: return str(u.src[0].arg[0])
  if u.op is Ops.SUB and len(u.src) == 2:
    b = u.src[1]
    rb = str(-b.arg) if b.op is Ops.CONST and isinstance(b.arg, (int, float)) else f"({_render_symbolic(b)}*-1)"
    return f"({_render_symbolic(u.src[0])}+{rb})"
  if u.op is Ops.NEG: return f"({_render_symbolic(u.src[0])}*-1)"
  if u.op is Ops.MAX: return f"max({_render_symbolic(u.src[0])}, {_render_symbolic(u.src[1])})"
  if u.op in _TG_SUGAR and len(u.src) == 2:
    a, b = u.src
    if u.op in (Ops.ADD, Ops.MUL) and a.op is Ops.CONST and b.op is not Ops.CONST: a, b = b, a   # (tinygrad's order)
    return f"({_render_symbolic(a)}{_TG_SUGAR[u.op]}{_render_symbolic(b)})"
  return render(u)


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
