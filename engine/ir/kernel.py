"""The unit of work a device runs: `Kernel(ast, bufs)`.

`ast` is `SINK(*stores)`; each store is `END(STORE(INDEX(PARAM, idx), value), *ranges)`,
or a plain `STORE` when it has no ranges. A `PARAM` has `arg = (slot, size)` and
the element dtype; `bufs[slot]` is the `BUFFER` UOp (`arg = (uid, device, size)`)
that slot stands for. See docs/architecture.md, "Kernel level".

A kernel may read symbolic values: `DEFINE_VAR` nodes (`UOp.variable(name, lo, hi)`, `arg = (name, lo, hi)`,
an integer dtype) inside its index arithmetic or its values. It is compiled once and run for any value of them:
`Kernel.vars` lists them sorted by name, the order in which a launch passes their values (`var_vals`). A
variable's name comes from user code: renderers never print it, they name variables by position.

`validate(kernel)` checks the structural rules a device relies on and raises
ValueError naming every problem it finds.
"""
from __future__ import annotations

import math
import re
from typing import Iterable

import attrs
import numpy as np

from rulec.engine.ir.dtypes import dtypes
from rulec.engine.ir.ops import ALU, COMPARISON, FIXED_ARITY, Ops
from rulec.engine.ir.uop import UOp, render as render_expr

REDUCE_OPS = (Ops.ADD, Ops.MAX, Ops.MUL)
# the ops a kernel's values may be built from (besides the SINK / END / STORE skeleton)
VALUE_OPS = frozenset(ALU - {Ops.THREEFRY}) | {Ops.CONST, Ops.RANGE, Ops.INDEX, Ops.REDUCE, Ops.CAST, Ops.BITCAST,
                                              Ops.DEFINE_VAR, Ops.RUNMAX}
_INT64 = (-(1 << 63), (1 << 63) - 1)


def _store_of(end: UOp) -> UOp:
  """The STORE of a SINK source (END(STORE, ...) or a plain STORE)."""
  return end.src[0] if end.op is Ops.END else end


def _end_ranges(end: UOp) -> tuple[UOp, ...]:
  return end.src[1:] if end.op is Ops.END else ()


def _range_size(r: UOp) -> int | None:
  e = r.src[0] if r.src else None
  return e.arg if e is not None and e.op is Ops.CONST and isinstance(e.arg, int) else None


def _range_name(r: UOp) -> str:
  axis = r.arg[0] if isinstance(r.arg, tuple) and r.arg else r.arg
  return f"r{axis}[{_range_size(r)}]"




def _var_name(v: UOp) -> str:
  return v.arg[0] if isinstance(v.arg, tuple) and v.arg and isinstance(v.arg[0], str) else ""


@attrs.frozen(repr=False)
class Kernel:
  ast: UOp
  bufs: tuple[UOp, ...] = attrs.field(converter=tuple)
  # the values of `vars` this kernel runs with (the scheduler fills them from the bound Variables of the graph it
  # scheduled; TinyJit's replays put in the call's); the AST, and so the compiled program, is the same for all
  vals: tuple[int, ...] = attrs.field(default=(), converter=tuple)

  def with_vals(self, var_vals: dict) -> "Kernel":
    """This kernel with its variables' values taken from var_vals ({DEFINE_VAR: int})."""
    vs = self.vars
    if not vs: return self
    missing = [v.arg[0] for v in vs if v not in var_vals]
    if missing: raise ValueError(f"no value for variable{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))} of this kernel")
    return Kernel(self.ast, self.bufs, tuple(var_vals[v] for v in vs))

  # *** structure ***

  @property
  def stores(self) -> tuple[UOp, ...]:
    """The STORE nodes, in the order they run."""
    return tuple(_store_of(e) for e in self.ast.src)

  @property
  def params(self) -> tuple[UOp, ...]:
    """Every distinct PARAM node, ordered by slot."""
    ps = {id(u): u for u in self.ast.toposort() if u.op is Ops.PARAM}
    return tuple(sorted(ps.values(), key=lambda u: (u.arg[0], id(u)) if isinstance(u.arg, tuple) else (-1, id(u))))

  @property
  def outputs(self) -> tuple[int, ...]:
    """The slots the STOREs write, in store order, each once (asked on every launch: memoised per AST)."""
    def written(ast: UOp) -> tuple[int, ...]:
      out: list[int] = []
      for st in self.stores:
        slot = st.src[0].src[0].arg[0]
        if slot not in out: out.append(slot)
      return tuple(out)
    return self.ast.memo_root("kernel_outputs", written)

  @property
  def inputs(self) -> tuple[int, ...]:
    """The slots read (INDEX nodes that are not store targets), sorted (memoised per AST: the memory planner asks
    for every kernel of every realize)."""
    def read(ast: UOp) -> tuple[int, ...]:
      # (a load and a store target with the same index are one hash-consed node, so look below the targets only)
      slots: set[int] = set()
      for st in self.stores:
        for part in st.src[0].src[1:] + st.src[1:]:
          for u in part.toposort():
            if u.op is Ops.INDEX and u.src and u.src[0].op is Ops.PARAM: slots.add(u.src[0].arg[0])
      return tuple(sorted(slots))
    return self.ast.memo_root("kernel_inputs", read)

  @property
  def ranges(self) -> tuple[UOp, ...]:
    """Every RANGE node in the kernel, ordered by axis."""
    rs = {id(u): u for u in self.ast.toposort() if u.op is Ops.RANGE}
    return tuple(sorted(rs.values(), key=lambda u: (u.arg[0] if isinstance(u.arg, tuple) else 0, id(u))))

  @property
  def vars(self) -> tuple[UOp, ...]:
    """The distinct DEFINE_VAR nodes, sorted by name: the order of their values at launch (`var_vals`). Asked on
    every launch: memoised per AST."""
    def variables(ast: UOp) -> tuple[UOp, ...]:
      vs = {id(u): u for u in ast.toposort() if u.op is Ops.DEFINE_VAR}
      return tuple(sorted(vs.values(), key=lambda u: (_var_name(u), repr(u.arg), u.dtype.name)))
    return self.ast.memo_root("kernel_vars", variables)

  def check_var_vals(self, var_vals=()) -> tuple[int, ...]:
    """`var_vals` (one int per var, in `vars` order) as a tuple of ints; ValueError naming the variable when a value
    is outside its var's [lo, hi] (TypeError when it is no int), ValueError when the count is not len(vars). No
    values given: the kernel's own `vals` (what the scheduler filled in), so callers that pass none still run it."""
    if type(var_vals) is not tuple: var_vals = tuple(var_vals)
    if not var_vals: var_vals = self.vals
    vs = self.vars
    if not vs and not var_vals: return ()
    if len(var_vals) != len(vs):
      names = ", ".join(repr(_var_name(v)) for v in vs) or "none"
      raise ValueError(f"the kernel takes {len(vs)} variable value{'' if len(vs) == 1 else 's'} ({names}), "
                       f"got {len(var_vals)}")
    out = []
    for v, x in zip(vs, var_vals):
      if isinstance(x, (bool, np.bool_)) or not hasattr(type(x), "__index__"):
        raise TypeError(f"the value of variable {_var_name(v)!r} must be an int, got {type(x).__name__} {x!r}")
      x = x.__index__()
      if arg_problem(v) is not None: raise ValueError(f"invalid kernel: {arg_problem(v)}")
      _, lo, hi = v.arg
      if not lo <= x <= hi: raise ValueError(f"variable {_var_name(v)!r} is {x}, outside its range [{lo}, {hi}]")
      out.append(x)
    return tuple(out)

  @property
  def device(self) -> str | None:
    """The device of the buffers (the first one's; None for a kernel without buffers)."""
    return self.bufs[0].arg[1] if self.bufs else None

  # *** printing ***

  def __repr__(self) -> str:
    rs = ", ".join(str(_range_size(r)) for r in self.ranges)
    rs = f"({rs},)" if len(self.ranges) == 1 else f"({rs})"
    parts = [f"{len(self.bufs)} bufs", f"ranges {rs}"]
    if (vs := self.vars): parts.append("vars " + " ".join(_var_desc(v) for v in vs))
    if (ins := self.inputs): parts.append("reads " + " ".join(f"p{s}" for s in ins))
    parts.append("writes " + " ".join(f"p{s}" for s in self.outputs))
    return f"<Kernel {', '.join(parts)}>"

  def render(self) -> str:
    """The AST one node per line, sources before users (`%n` names a node)."""
    names: dict[int, str] = {}
    lines = [repr(self)]
    for i, u in enumerate(self.ast.toposort()):
      names[id(u)] = name = f"%{i}"
      srcs = " ".join(names[id(s)] for s in u.src)
      if u.op is Ops.PARAM:
        slot, size = u.arg if isinstance(u.arg, tuple) and len(u.arg) == 2 else (u.arg, "?")
        buf = self.bufs[slot] if isinstance(slot, int) and 0 <= slot < len(self.bufs) else None
        where = f" <- BUFFER #{buf.arg[0]} on {buf.arg[1]}" if buf is not None and isinstance(buf.arg, tuple) else ""
        extra = f"p{slot} size={size}{where}"
      elif u.op is Ops.RANGE: extra = f"r{u.arg[0]} size={_range_size(u)} {u.arg[1]}  ({srcs})"
      elif u.op is Ops.CONST: extra = repr(u.arg)
      elif u.op is Ops.DEFINE_VAR: extra = _var_desc(u)
      elif u.op is Ops.REDUCE: extra = f"{srcs}  {u.arg.name if isinstance(u.arg, Ops) else u.arg}"
      else: extra = srcs if u.arg is None else f"{srcs}  arg={u.arg!r}"
      lines.append(f"{name:>5} = {u.op.name:<10} {u.dtype.name:<8} {extra}")
    return "\n".join(lines)


def _var_desc(v: UOp) -> str:
  """A DEFINE_VAR for a person to read: `'n'[1..1023]` (its name as a repr: it is text from user code)."""
  a = v.arg
  return f"{a[0]!r}[{a[1]}..{a[2]}]" if isinstance(a, tuple) and len(a) == 3 else f"?{a!r}"


# *** validation ***

def _desc(u: UOp) -> str: return render_expr(u, depth=3)


# a RANGE's kind: a word, then colon-separated words or numbers (e.g. "loop", "group:4:2"; codegen/opt reads them)
_RANGE_KIND = re.compile(r"[a-z_]{1,32}(:[A-Za-z0-9_]{1,32}){0,6}")
# the args other value ops may carry: none, an op (REDUCE, a reduction's op), or a marker a rule set leaves
_MARKERS = frozenset({"guarded", "store", "clamped", "slack", "fma"})


def arg_problem(u: UOp) -> str | None:
  """Why `u`'s arg is not of a type the IR allows for its op, or None. Renderers print RANGE axes, CONST values and
  PARAM slots into source text: only these checked types may reach them (a rule could put any Python value in an
  arg, and a string there would be printed into the kernel's source)."""
  a = u.arg
  if u.op is Ops.RANGE:
    if not (isinstance(a, tuple) and len(a) == 2): return f"RANGE has arg {a!r}; a RANGE's arg is (axis, kind)"
    if type(a[0]) is not int or a[0] < 0: return f"RANGE has axis {a[0]!r}; an axis is a non-negative int"
    if not (isinstance(a[1], str) and _RANGE_KIND.fullmatch(a[1])): return f"RANGE r{a[0]} has kind {a[1]!r}, not a range kind"
    return None
  if u.op is Ops.CONST:
    if u.dtype.is_float: ok = isinstance(a, (bool, int, float, np.integer, np.floating, np.bool_))
    else: ok = isinstance(a, (bool, int, np.integer, np.bool_))
    return None if ok else f"CONST of {u.dtype.name} has arg {a!r} of type {type(a).__name__}"
  if u.op is Ops.DEFINE_VAR:
    if not (isinstance(a, tuple) and len(a) == 3): return f"DEFINE_VAR has arg {a!r}; a DEFINE_VAR's arg is (name, lo, hi)"
    name, lo, hi = a
    if type(name) is not str: return f"DEFINE_VAR has name {name!r}; a variable's name is a str"
    if type(lo) is not int or type(hi) is not int: return f"DEFINE_VAR {name!r} has bounds {lo!r}, {hi!r}; bounds are ints"
    if lo > hi: return f"DEFINE_VAR {name!r} has bounds [{lo}, {hi}]: lo > hi"
    if lo < _INT64[0] or hi > _INT64[1]: return f"DEFINE_VAR {name!r} has bounds [{lo}, {hi}], beyond int64"
    return None
  if u.op is Ops.RUNMAX:
    ok = type(a) is float and math.isfinite(a) and a > 0
    return None if ok else f"RUNMAX has arg {a!r}; a RUNMAX's arg is its sum's exp2 scale, a positive finite float"
  if u.op is Ops.PARAM or a is None or isinstance(a, Ops) or (isinstance(a, str) and a in _MARKERS): return None
  return f"{u.op} has arg {a!r}; only RANGE, CONST, PARAM and DEFINE_VAR carry values in a kernel"


def validate(kernel: Kernel) -> None:
  """Check the structural rules of a kernel and the types of its nodes' args; raise ValueError listing the
  problems. (Index bounds are not checked: loads outside a buffer sit under the WHERE that guards them.)"""
  problems: list[str] = []
  err = problems.append
  ast, bufs = kernel.ast, kernel.bufs

  for i, b in enumerate(bufs):
    if not isinstance(b, UOp) or b.op is not Ops.BUFFER:
      err(f"bufs[{i}] is {getattr(b, 'op', type(b).__name__)}, not a BUFFER UOp")
    elif not (isinstance(b.arg, tuple) and len(b.arg) == 3 and isinstance(b.arg[2], int)):
      err(f"bufs[{i}] has arg {b.arg!r}; a BUFFER's arg is (uid, device, size)")

  if not isinstance(ast, UOp) or ast.op is not Ops.SINK: return _raise([f"ast is {getattr(ast, 'op', ast)}, not a SINK"])
  if not ast.src: err("the SINK has no stores")

  # the skeleton: SINK(END(STORE(INDEX(PARAM, idx), value), *ranges) | STORE, ...)
  skeleton: set[int] = {id(ast)}
  stores: list[tuple[int, UOp, UOp | None, UOp | None, tuple[UOp, ...]]] = []  # (n, store, idx, value, end ranges)
  for n, e in enumerate(ast.src):
    if e.op is Ops.END:
      skeleton.add(id(e))
      st, ends = e.src[0] if e.src else None, e.src[1:]
      if st is None or st.op is not Ops.STORE:
        err(f"store {n}: END's first source is {getattr(st, 'op', None)}, not a STORE"); continue
      for r in ends:
        if r.op is not Ops.RANGE: err(f"store {n}: END closes {r.op} {_desc(r)}, not a RANGE")
      if len({id(r) for r in ends}) != len(ends): err(f"store {n}: END lists a range twice")
    elif e.op is Ops.STORE: st, ends = e, ()
    else: err(f"store {n}: SINK source is {e.op}, not END or STORE"); continue
    skeleton.add(id(st))
    if len(st.src) != 2: err(f"store {n}: STORE has {len(st.src)} sources, expected (INDEX, value)"); continue
    tgt, value = st.src
    if tgt.op is not Ops.INDEX or not tgt.src or tgt.src[0].op is not Ops.PARAM:
      err(f"store {n}: STORE target is {_desc(tgt)}, not INDEX(PARAM, idx)"); continue
    if len(tgt.src) != 2: err(f"store {n}: STORE target INDEX has {len(tgt.src) - 1} indices, expected one flat index"); continue
    if value.dtype is not tgt.src[0].dtype:
      err(f"store {n}: stores a {value.dtype.name} value into p{tgt.src[0].arg[0] if isinstance(tgt.src[0].arg, tuple) else '?'}"
          f" of {tgt.src[0].dtype.name}")
    stores.append((n, st, tgt.src[1], value, tuple(r for r in ends if r.op is Ops.RANGE)))

  # every node under the skeleton
  params: dict[int, UOp] = {}
  axes: dict[object, UOp] = {}
  variables: dict[str, UOp] = {}
  for u in ast.toposort():
    if id(u) in skeleton: continue
    if u.op in (Ops.SINK, Ops.END, Ops.STORE):
      err(f"{u.op} inside a value: {_desc(u)}"); continue
    if u.op is Ops.PARAM:
      if u.src: err(f"PARAM {u.arg!r} has sources")
      if not (isinstance(u.arg, tuple) and len(u.arg) == 2 and all(isinstance(x, int) for x in u.arg)):
        err(f"PARAM has arg {u.arg!r}; a PARAM's arg is (slot, size)"); continue
      slot, size = u.arg
      if slot in params and params[slot] is not u:
        err(f"two different PARAMs for slot {slot}: {params[slot].arg}/{params[slot].dtype.name} and {u.arg}/{u.dtype.name}")
      params[slot] = u
      if not 0 <= slot < len(bufs): err(f"PARAM p{slot} has no buffer (the kernel has {len(bufs)} bufs)"); continue
      b = bufs[slot]
      if not isinstance(b, UOp) or b.op is not Ops.BUFFER or not isinstance(b.arg, tuple): continue
      if b.dtype is not u.dtype: err(f"PARAM p{slot} is {u.dtype.name} but bufs[{slot}] holds {b.dtype.name}")
      # (a larger buffer is allowed: the memory planner stores several intermediates in one, engine/memory_plan.py)
      if b.arg[-1] < size: err(f"PARAM p{slot} has size {size} but bufs[{slot}] has only {b.arg[-1]} elements")
      continue
    if u.op not in VALUE_OPS:
      err(f"{u.op} is not allowed in a kernel: {_desc(u)}"); continue
    if u.dtype is dtypes.void: err(f"{u.op} has dtype void: {_desc(u)}")
    if (bad := arg_problem(u)) is not None: err(bad); continue
    if u.op in FIXED_ARITY and len(u.src) != FIXED_ARITY[u.op]:
      err(f"{u.op} has {len(u.src)} sources, expected {FIXED_ARITY[u.op]}: {_desc(u)}"); continue
    if u.op is Ops.CONST:
      if u.dtype.np_name is None and u.dtype is not dtypes.index: err(f"CONST of {u.dtype.name} has no numpy equivalent")
    elif u.op is Ops.DEFINE_VAR:
      name, lo, hi = u.arg
      if u.src: err(f"DEFINE_VAR {name!r} has sources")
      if not u.dtype.is_int: err(f"DEFINE_VAR {name!r} has dtype {u.dtype.name}, not an integer")
      elif u.dtype is not dtypes.index and not (u.dtype.min() <= lo and hi <= u.dtype.max()):
        err(f"DEFINE_VAR {name!r} has bounds [{lo}, {hi}], beyond its dtype {u.dtype.name}")
      if name in variables and variables[name] is not u:
        o = variables[name]
        err(f"two different DEFINE_VARs named {name!r}: {_var_desc(o)} of {o.dtype.name} and {_var_desc(u)} of {u.dtype.name}")
      variables.setdefault(name, u)
    elif u.op is Ops.RANGE:
      if not (isinstance(u.arg, tuple) and len(u.arg) == 2): err(f"RANGE has arg {u.arg!r}; a RANGE's arg is (axis, kind)"); continue
      size = _range_size(u)
      if size is None: err(f"RANGE r{u.arg[0]} does not end at an integer CONST: {_desc(u)}")
      elif size < 0: err(f"RANGE r{u.arg[0]} has negative size {size}")
      if not u.dtype.is_int: err(f"RANGE r{u.arg[0]} has dtype {u.dtype.name}, not an integer")
      if u.arg[0] in axes and axes[u.arg[0]] is not u:
        err(f"two different RANGEs share axis {u.arg[0]}: {_range_name(axes[u.arg[0]])} and {_range_name(u)}")
      axes[u.arg[0]] = u
    elif u.op is Ops.INDEX:
      if not u.src or u.src[0].op is not Ops.PARAM: err(f"INDEX of {u.src[0].op if u.src else 'nothing'}, not a PARAM: {_desc(u)}"); continue
      if len(u.src) != 2: err(f"INDEX has {len(u.src) - 1} indices, expected one flat index: {_desc(u)}"); continue
      if not u.src[1].dtype.is_int: err(f"INDEX index has dtype {u.src[1].dtype.name}, not an integer: {_desc(u)}")
      if u.dtype is not u.src[0].dtype: err(f"INDEX of a {u.src[0].dtype.name} PARAM has dtype {u.dtype.name}: {_desc(u)}")
    elif u.op is Ops.REDUCE:
      if u.arg not in REDUCE_OPS: err(f"REDUCE has arg {u.arg!r}; expected one of ADD, MAX, MUL"); continue
      if not u.src: err("REDUCE without a value"); continue
      if u.dtype is not u.src[0].dtype: err(f"REDUCE of a {u.src[0].dtype.name} value has dtype {u.dtype.name}")
      for r in u.src[1:]:
        if r.op is not Ops.RANGE: err(f"REDUCE reduces over {r.op}, not a RANGE: {_desc(u)}")
      if len({id(r) for r in u.src[1:]}) != len(u.src) - 1: err(f"REDUCE lists a range twice: {_desc(u)}")
    elif u.op is Ops.RUNMAX:
      if len(u.src) != 2 or u.src[1].op is not Ops.RANGE: err(f"RUNMAX takes a value and a RANGE: {_desc(u)}"); continue
      if u.dtype.kind != "f" or u.src[0].dtype is not u.dtype: err(f"RUNMAX of {u.src[0].dtype.name} has dtype {u.dtype.name}: {_desc(u)}")
    elif u.op in ALU:
      if u.op in COMPARISON:
        if u.dtype is not dtypes.bool: err(f"{u.op} has dtype {u.dtype.name}, not bool")
        if u.src[0].dtype is not u.src[1].dtype:
          err(f"{u.op} compares {u.src[0].dtype.name} with {u.src[1].dtype.name}: {_desc(u)}")
      elif u.op is Ops.WHERE:
        if u.src[0].dtype is not dtypes.bool: err(f"WHERE condition has dtype {u.src[0].dtype.name}, not bool: {_desc(u)}")
        if not (u.src[1].dtype is u.src[2].dtype is u.dtype):
          err(f"WHERE of {u.src[1].dtype.name} and {u.src[2].dtype.name} has dtype {u.dtype.name}: {_desc(u)}")
      elif any(s.dtype is not u.dtype for s in u.src):
        err(f"{u.op} of {', '.join(s.dtype.name for s in u.src)} has dtype {u.dtype.name}: {_desc(u)}")

  # ranges: each store's idx and value may only depend on ranges its END or an enclosing REDUCE closes
  open_: dict[int, frozenset] = {}    # id(node) -> ids of ranges open in it
  bound: dict[int, frozenset] = {}    # id(node) -> ids of ranges some REDUCE inside it closes
  runs: dict[int, frozenset] = {}     # id(node) -> RUNMAX nodes inside it that no float sum closes yet
  names: dict[int, UOp] = {}
  def walk(root: UOp):
    for u in root.toposort(lambda x: x.op is not Ops.PARAM):
      if id(u) in open_: continue
      inner_runs = frozenset().union(*(runs.get(id(s), frozenset()) for s in u.src))
      if u.op is Ops.RANGE:
        names[id(u)] = u
        open_[id(u)], bound[id(u)] = frozenset({id(u)}), frozenset()
      elif u.op is Ops.REDUCE and u.src:
        red = frozenset(id(r) for r in u.src[1:] if r.op is Ops.RANGE)
        inner_open, inner_bound = open_.get(id(u.src[0]), frozenset()), bound.get(id(u.src[0]), frozenset())
        if (again := red & inner_bound):
          err(f"REDUCE closes {_names(again, names)} which a REDUCE inside it already closes: {_desc(u)}")
        open_[id(u)], bound[id(u)] = inner_open - red, inner_bound | red
        # (a running max belongs to the one-range float sum over its range: the sum it rescales)
        mine = frozenset(m for m in inner_runs if id(m.src[1]) in red)
        if mine and (u.arg is not Ops.ADD or len(u.src) != 2 or u.dtype.kind != "f" or len(mine) != 1):
          err(f"a RUNMAX over {_names(red, names)} is inside a REDUCE that is not one float sum over it, with one running max: {_desc(u)}")
        inner_runs = inner_runs - mine
      else:
        open_[id(u)] = frozenset().union(*(open_.get(id(s), frozenset()) for s in u.src))
        bound[id(u)] = frozenset().union(*(bound.get(id(s), frozenset()) for s in u.src))
        if u.op is Ops.RUNMAX: inner_runs = inner_runs | {u}
      runs[id(u)] = inner_runs
  for n, st, idx, value, ends in stores:
    walk(idx); walk(value)
    closed = frozenset(id(r) for r in ends)
    for what, part in (("index", idx), ("value", value)):
      if runs[id(part)]: err(f"store {n}: its {what} holds a RUNMAX that no float sum over its range encloses")
      if (loose := open_[id(part)] - closed):
        err(f"store {n}: its {what} uses {_names(loose, names)}, which neither its END nor a REDUCE around it closes")
      if (twice := bound[id(part)] & closed):
        err(f"store {n}: {_names(twice, names)} is closed by its END and also by a REDUCE inside its {what}")

  if problems: _raise(list(dict.fromkeys(problems)))


def _names(ids: Iterable[int], names: dict[int, UOp]) -> str:
  return ", ".join(sorted(_range_name(names[i]) for i in ids))


def _raise(problems: list[str]):
  head = f"invalid kernel: {problems[0]}" if len(problems) == 1 else \
    f"invalid kernel ({len(problems)} problems):\n" + "\n".join(f"  - {p}" for p in problems[:20])
  if len(problems) > 20: head += f"\n  ... and {len(problems) - 20} more"
  raise ValueError(head)


def structure(ast) -> str:
  """A kernel AST as text that is the same in every process for the same graph: each node's op, dtype, arg, tag
  and sources (by position in the topological order). Buffer identities are not in it (PARAMs name slots)."""
  pos: dict[int, int] = {}
  lines = []
  for i, u in enumerate(ast.toposort()):
    pos[id(u)] = i
    lines.append(f"{u.op.name} {u.dtype.name} {u.arg!r} {u.tag!r} {[pos[id(x)] for x in u.src]}")
  return "\n".join(lines)


__all__ = ["Kernel", "validate", "arg_problem", "structure", "REDUCE_OPS"]
