"""`rulec prove` for gradient rules (rules/gradient.rules): each rule proven by the adjoint identity, in z3's reals.

A gradient rule maps a node y = op(x_1..x_k) and the gradient g flowing into it to one gradient per source. It is
right when, for every direction t_i of each float source (a tangent, as many values as x_i has),

    sum(g * dy) == sum_i sum(grad_i * t_i)

where dy is the forward-mode derivative of op at x in the direction t (its JVP): the reverse result is the adjoint of
the forward one. `jvp` below is that forward derivative, written from the ops' definitions (the textbook derivative
of each), independently of rules/gradient.rules; `RealTerms` gives every value (the node, its sources, the rule's
gradients, g) as z3 terms of real arithmetic, element by element over the instance's concrete shapes. Both sides
are linear in t, so the identity is asked along each basis direction (one element of one source at a time): z3 is
asked for values of the sources and g where the two sides differ; none (unsat) for every direction proves the
instance for every value and every t.

Derivatives are facts of real analysis, so the proof is in z3's reals, not in floats: a float op is its real
counterpart (rounding is not modelled: a CAST between floats is the identity), and the proof says the rule computes
the derivative, not how it rounds. Where an op has no derivative the instance is proven away from it, as
`rulec verify` skips kinks: MAX off ties, a REDUCE_AXIS of MAX where the maximum is unique, FDIV and RECIPROCAL off
a zero divisor, SQRT, LOG2 and POW (its base) on positive values, TRUNC off the integers, and IDIV / MOD of floats
off the points where the quotient is an integer. EXP2, LOG2, SIN, SQRT, POW and the natural log and cosine the derivatives need
are unknown functions (z3's uninterpreted functions) with only these facts, each stated at the terms it is needed
for: ln2 is a positive constant, sqrt(a) > 0 and sqrt(a)^2 = a for a > 0, cos(a) = sin(a + pi/2), ln(a) =
log2(a) * ln2; the float constants nearest ln 2 and pi / 2 (what a rule can write) stand for ln2 and pi / 2.
An infinity or NaN constant has no real value: it is any value (a proof holds whatever it is).

A node whose value is not a float, or with no float source (a comparison, a bitwise op, a BITCAST to integers),
and DETACH carry no gradient: as `rulec verify` checks them, the rule must give None for every float source.

A counterexample from z3 is confirmed in float64 before the rule is called refuted: the directional derivative of
sum(g * node(x)) along t by central differences (engine/verify/gradient.py's check) must differ from the rule's
sum(grad_i * t_i) computed by the reference evaluator.
"""
from __future__ import annotations

import collections
import itertools
import math
import zlib
from fractions import Fraction

import numpy as np
import z3
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable

from rulec.engine.ir.dtypes import DType, dtypes
from rulec.engine.ir.ops import MOVEMENT, Ops
from rulec.engine.ir.uop import UOp, render
from rulec.engine.lang import ast as A
from rulec.engine.lang.runtime import RuleAbort, RuleRuntimeError
from rulec.engine.verify.evaluate import NotModelled, NoValue
from rulec.engine.verify.gradient import _Draw
from rulec.engine.verify.instances import MORE_TRIES, WANTED, Outcome, graph_structure
from rulec.engine.verify.smt import Untranslatable

EXAMPLES = 16        # hypothesis draws per gradient rule
MAX_INSTANCES = 10   # distinct instances proven per rule
NICE = 4             # a counterexample is first looked for among the integers -NICE..NICE (then anywhere)

LN2 = z3.Real("ln2")          # ln 2: positive, otherwise unknown
HALF_PI = z3.Real("half_pi")  # pi / 2: only through sin(a + pi/2) = cos(a)
_NAMED = {math.log(2): LN2, math.pi / 2: HALF_PI}

NO_GRADIENT_OPS = frozenset({Ops.DETACH})   # gradient zero by definition (the value is the identity)


def _real(v) -> z3.ArithRef:
  f = Fraction(v)
  return z3.RealVal(f.numerator) if f.denominator == 1 else z3.Q(f.numerator, f.denominator)


class RealTerms:
  """Values of tensor-level graphs as numpy object arrays (the value's shape) of z3 terms: a float is a Real, an
  integer an Int, a bool a Bool. Buffers (and the drawn MSTACK parts) are arrays of fresh variables."""

  def __init__(self):
    self.memo: dict[UOp, np.ndarray] = {}
    self.buffers: dict[UOp, np.ndarray] = {}
    self.functions: dict[str, z3.FuncDeclRef] = {}
    self.facts: list = [LN2 > 0]          # the axioms above, at the terms met
    self.free: list = []                 # constants with no real value

  def buffer(self, b: UOp) -> np.ndarray:
    if b not in self.buffers:
      make = {"f": z3.Real, "b": z3.Bool}.get(b.dtype.kind, z3.Int)
      arr = self.buffers[b] = np.empty(b.arg[-1], dtype=object)
      for k in range(b.arg[-1]): arr[k] = make(f"b{b.arg[0]}_{k}")
    return self.buffers[b]

  def function(self, name: str, arity: int) -> z3.FuncDeclRef:
    if name not in self.functions: self.functions[name] = z3.Function(name, *([z3.RealSort()] * (arity + 1)))
    return self.functions[name]

  # *** the functions the derivatives need, with their facts ***

  def sqrt(self, a):
    s = self.function("sqrt", 1)(a)
    self.facts.append(z3.Implies(a > 0, z3.And(s > 0, s * s == a)))
    return s

  def cos(self, a):
    c = self.function("cos", 1)(a)
    self.facts.append(c == self.function("sin", 1)(a + HALF_PI))
    return c

  def ln(self, a):
    v = self.function("ln", 1)(a)
    self.facts.append(v == self.function("log2", 1)(a) * LN2)
    return v

  def floor(self, a): return z3.ToReal(z3.ToInt(a))

  def const(self, v, dt: DType):
    if dt.kind == "b": return z3.BoolVal(bool(v))
    if dt.kind != "f": return z3.IntVal(int(v))
    v = float(v)
    if not math.isfinite(v):   # (no real value: any value will do)
      self.free.append(z3.FreshReal("nonfinite"))
      return self.free[-1]
    for exact, sym in _NAMED.items():
      if v == _rounded(exact, dt): return sym
    return _real(v)

  # *** values ***

  def value(self, u: UOp) -> np.ndarray:
    for n in u.toposort():
      if n not in self.memo: self.memo[n] = self._node(n, [self.memo[s] for s in n.src])
    return self.memo[u]

  def _node(self, u: UOp, xs: list) -> np.ndarray:
    op, shape = u.op, tuple(u._shape or ())
    if op is Ops.BUFFER: return self.buffer(u)
    if op is Ops.CONST: return _fill(shape, self.const(u.arg, u.dtype))
    if op in MOVEMENT: return self.move(u, xs[0])
    if op in (Ops.CONTIGUOUS, Ops.FUSE, Ops.CONTIGUOUS_BACKWARD, Ops.DETACH, Ops.COPY): return xs[0]
    if op is Ops.ASSIGN: return xs[1]
    if op is Ops.MSTACK: return xs[0] if u.arg[0] is None else np.concatenate(xs, axis=u.arg[0])
    if op is Ops.MSELECT: return part(xs[0], *u.arg)
    if op is Ops.REDUCE_AXIS: return self.reduce(u.arg[0], u.arg[1], xs[0], u.dtype)
    if op is Ops.CAST: return _map(shape, lambda a: self.cast(a, u.src[0].dtype, u.dtype), xs[0])
    return _map(shape, lambda *a: self.alu(op, u.dtype, u.src[0].dtype, a), *xs)

  def move(self, u: UOp, x: np.ndarray) -> np.ndarray:
    """A movement op on an array of terms (the op's own definition: also the JVP of a movement op)."""
    op, arg = u.op, u.arg
    if op is Ops.RESHAPE: return x.reshape(tuple(arg))
    if op is Ops.PERMUTE: return np.transpose(x, tuple(arg))
    if op is Ops.EXPAND: return np.broadcast_to(x, tuple(arg))
    if op is Ops.SHRINK: return x[tuple(slice(b, e) for b, e in arg)]
    if op is Ops.FLIP: return np.flip(x, tuple(i for i, f in enumerate(arg) if f)) if any(arg) else x
    if op is Ops.PAD:
      out = _fill(tuple(d + b + a for d, (b, a) in zip(x.shape, arg)), self.const(0, u.dtype))
      out[tuple(slice(b, b + d) for d, (b, _) in zip(x.shape, arg))] = x
      return out
    raise Untranslatable(f"{op.name} is not a movement op")

  def reduce(self, rop: Ops, axes: tuple, x: np.ndarray, dt: DType) -> np.ndarray:
    shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    out = np.empty(shape, dtype=object)
    for idx in np.ndindex(*shape):
      group = list(x[tuple(slice(None) if i in axes else k for i, k in enumerate(idx))].reshape(-1))
      out[idx] = combine(rop, group, dt, self)
    return out

  def cast(self, a, src: DType, dt: DType):
    if dt.kind == "f":
      if src.kind == "f": return a                       # (rounding is not modelled: the same real)
      if src.kind == "b": return z3.If(a, z3.RealVal(1), z3.RealVal(0))
      return z3.ToReal(a)
    if dt.kind == "b": return a if src.kind == "b" else a != 0
    raise Untranslatable(f"CAST from {src.name} to {dt.name} in real arithmetic")

  def alu(self, op: Ops, dt: DType, src: DType, a: tuple):
    if op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ):
      x, y = a
      if src.kind == "b" and op is Ops.CMPLT: return z3.And(z3.Not(x), y)
      return x < y if op is Ops.CMPLT else x != y if op is Ops.CMPNE else x == y
    if op is Ops.WHERE: return z3.If(*a)
    if dt.kind == "b":
      if op in (Ops.AND, Ops.MUL): return z3.And(*a)
      if op in (Ops.OR, Ops.ADD, Ops.MAX): return z3.Or(*a)
      if op in (Ops.XOR, Ops.CMPNE): return z3.Xor(*a)
      raise Untranslatable(f"{op.name} on bool in real arithmetic")
    if dt.kind != "f": raise Untranslatable(f"{op.name} on {dt.name} in real arithmetic")
    if op is Ops.ADD: return a[0] + a[1]
    if op is Ops.SUB: return a[0] - a[1]
    if op is Ops.MUL: return a[0] * a[1]
    if op is Ops.FDIV: return a[0] / a[1]
    if op is Ops.NEG: return -a[0]
    if op is Ops.MAX: return z3.If(a[1] > a[0], a[1], a[0])
    if op is Ops.MULACC: return a[0] * a[1] + a[2]
    if op is Ops.RECIPROCAL: return 1 / a[0]
    if op is Ops.SQRT: return self.sqrt(a[0])
    if op in (Ops.EXP2, Ops.LOG2, Ops.SIN): return self.function(op.name.lower(), 1)(a[0])
    if op is Ops.POW: return self.function("pow", 2)(*a)
    if op is Ops.IDIV: return self.floor(a[0] / a[1])
    if op is Ops.MOD: return a[0] - self.floor(a[0] / a[1]) * a[1]
    if op is Ops.TRUNC: return z3.If(a[0] >= 0, self.floor(a[0]), -self.floor(-a[0]))
    raise Untranslatable(f"{op.name} in real arithmetic")


def _rounded(v: float, dt: DType) -> float:
  from rulec.runtime.buffer import np_dtype
  return float(np.asarray(v, dtype=np_dtype(dt)))


def _fill(shape: tuple, v) -> np.ndarray:
  out = np.empty(shape, dtype=object)
  for idx in np.ndindex(*shape): out[idx] = v
  return out


def _map(shape: tuple, f, *xs) -> np.ndarray:
  """f of the elements of xs (broadcast numpy's way to shape), as an object array."""
  xs = [np.broadcast_to(x, shape) for x in xs]
  out = np.empty(shape, dtype=object)
  for idx in np.ndindex(*shape): out[idx] = f(*(x[idx] for x in xs))
  return out


def part(x: np.ndarray, i: int, axis, n: int) -> np.ndarray:
  """Device i's part of x split n ways along axis (all of x for None)."""
  if axis is None: return x
  s = x.shape[axis] // n
  return x[(slice(None),) * axis + (slice(i * s, (i + 1) * s),)]


def combine(rop: Ops, group: list, dt: DType, rt: RealTerms):
  """A reduce's elements combined (the identity for none); MAX's identity is -inf: any value below them all."""
  if dt.kind != "f": raise Untranslatable(f"a reduce of {dt.name} in real arithmetic")
  if rop is Ops.ADD: return z3.Sum(group) if group else z3.RealVal(0)
  if rop is Ops.MUL: return z3.Product(group) if len(group) > 1 else group[0] if group else z3.RealVal(1)
  if rop is Ops.MAX:
    if not group: return rt.const(-math.inf, dt)
    acc = group[0]
    for v in group[1:]: acc = z3.If(v > acc, v, acc)
    return acc
  raise Untranslatable(f"a reduce of {rop}")


# *** the forward derivative ***

def jvp(u: UOp, xs: list, ts: list, rt: RealTerms) -> tuple[np.ndarray, list]:
  """The derivative of u's value at its sources' values xs in the directions ts (None: a source that is not a
  float, which does not vary), and the conditions under which it exists. Written from each op's definition."""
  op, shape = u.op, tuple(u._shape or ())
  zero = z3.RealVal(0)
  ts = [t if t is not None else _fill(tuple(x.shape), zero) for x, t in zip(xs, ts)]
  dom: list = []

  def each(f, *arrays): return _map(shape, f, *arrays)

  def where(f, *arrays):   # a domain condition on each element
    dom.extend(_map(shape, f, *arrays).reshape(-1))

  if op in MOVEMENT: return rt.move(u, ts[0]), dom
  if op in (Ops.CONTIGUOUS, Ops.FUSE, Ops.CONTIGUOUS_BACKWARD, Ops.COPY): return ts[0], dom
  if op is Ops.ASSIGN: return ts[1], dom   # (the value written; the target's old contents are gone)
  if op is Ops.MSTACK: return (ts[0] if u.arg[0] is None else np.concatenate(ts, axis=u.arg[0])), dom
  if op is Ops.MSELECT: return part(ts[0], *u.arg), dom
  if op is Ops.CAST: return (ts[0] if u.src[0].dtype.kind == "f" else _fill(shape, zero)), dom
  if op is Ops.REDUCE_AXIS: return _jvp_reduce(u, xs[0], ts[0], dom), dom
  a = xs[0]
  ta = ts[0]
  if op is Ops.NEG: return each(lambda d: -d, ta), dom
  if op is Ops.ADD: return each(lambda p, q: p + q, ta, ts[1]), dom
  if op is Ops.SUB: return each(lambda p, q: p - q, ta, ts[1]), dom
  if op is Ops.MUL: return each(lambda x, y, p, q: p * y + x * q, a, xs[1], ta, ts[1]), dom
  if op is Ops.MULACC: return each(lambda x, y, p, q, r: p * y + x * q + r, a, xs[1], ta, ts[1], ts[2]), dom
  if op is Ops.FDIV:
    where(lambda y: y != 0, xs[1])
    return each(lambda x, y, p, q: (p * y - x * q) / (y * y), a, xs[1], ta, ts[1]), dom
  if op is Ops.MAX:   # the larger source's change; at a tie there is no derivative
    where(lambda x, y: x != y, a, xs[1])
    return each(lambda x, y, p, q: z3.If(x > y, p, q), a, xs[1], ta, ts[1]), dom
  if op is Ops.WHERE: return each(lambda c, p, q: z3.If(c, p, q), a, ts[1], ts[2]), dom
  if op is Ops.RECIPROCAL:
    where(lambda x: x != 0, a)
    return each(lambda x, p: -p / (x * x), a, ta), dom
  if op is Ops.SQRT:
    where(lambda x: x > 0, a)
    return each(lambda x, p: p / (2 * rt.sqrt(x)), a, ta), dom
  if op is Ops.EXP2: return each(lambda x, p: rt.function("exp2", 1)(x) * LN2 * p, a, ta), dom
  if op is Ops.LOG2:
    where(lambda x: x > 0, a)
    return each(lambda x, p: p / (x * LN2), a, ta), dom
  if op is Ops.SIN: return each(lambda x, p: rt.cos(x) * p, a, ta), dom
  if op is Ops.POW:   # d(x^y) = y x^(y-1) dx + x^y ln(x) dy, for x > 0
    where(lambda x: x > 0, a)
    pw = rt.function("pow", 2)
    return each(lambda x, y, p, q: y * pw(x, y - 1) * p + pw(x, y) * rt.ln(x) * q, a, xs[1], ta, ts[1]), dom
  if op is Ops.TRUNC:   # piecewise constant: 0 off the integers
    where(lambda x: z3.Not(z3.IsInt(x)), a)
    return _fill(shape, zero), dom
  if op in (Ops.IDIV, Ops.MOD):   # floor(x / y) is piecewise constant: 0 where x / y is not an integer
    where(lambda x, y: z3.And(y != 0, z3.Not(z3.IsInt(x / y))), a, xs[1])
    if op is Ops.IDIV: return _fill(shape, zero), dom
    return each(lambda x, y, p, q: p - rt.floor(x / y) * q, a, xs[1], ta, ts[1]), dom
  raise Untranslatable(f"no forward derivative for {op.name}")


class Cases(tuple):
  """A domain condition that is a disjunction of cases (which element of a reduce is the largest): the solver is
  asked once per case, where z3 settles each alone quickly and the disjunction slowly."""


def _jvp_reduce(u: UOp, x: np.ndarray, t: np.ndarray, dom: list) -> np.ndarray:
  rop, axes = u.arg
  shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
  out = np.empty(shape, dtype=object)
  for idx in np.ndindex(*shape):
    sel = tuple(slice(None) if i in axes else k for i, k in enumerate(idx))
    xg, tg = list(x[sel].reshape(-1)), list(t[sel].reshape(-1))
    if not xg: out[idx] = z3.RealVal(0); continue
    if rop is Ops.ADD: out[idx] = z3.Sum(tg)
    elif rop is Ops.MUL:   # the product rule: each element's change times the others
      out[idx] = z3.Sum([tk * z3.Product([xj for j, xj in enumerate(xg) if j != k] or [z3.RealVal(1)])
                         for k, tk in enumerate(tg)])
    elif rop is Ops.MAX:   # the change of the largest element, where exactly one is largest
      top = [z3.And([xk > xj for j, xj in enumerate(xg) if j != k]) for k, xk in enumerate(xg)]
      dom.append(Cases(top))
      out[idx] = z3.Sum([z3.If(c, tk, z3.RealVal(0)) for c, tk in zip(top, tg)])
    else: raise Untranslatable(f"no forward derivative for a reduce of {rop}")
  return out


# *** instances ***

def collect(rule: A.Rule, fn, examples: int = EXAMPLES) -> tuple[list, collections.Counter, list]:
  """Nodes the rule fires on, drawn as `rulec verify` draws them (engine/verify/gradient.py: the op, a small shape,
  its argument and its sources, as buffers), with g and the rule's gradients: (at most MAX_INSTANCES distinct
  instances, why the other draws gave none, failures of the rule). With few instances (a REDUCE_AXIS rule fires on
  one reduce op of three), MORE_TRIES times as many draws again."""
  found: dict = {}
  why_not: collections.Counter = collections.Counter()
  failures: list = []

  def run(n: int, attempt: int) -> None:
    @seed(zlib.crc32(f"adjoint/{rule.name}/{attempt}".encode()))
    @settings(max_examples=n, database=None, deadline=None, suppress_health_check=list(HealthCheck),
              phases=(Phase.generate,), print_blob=False)
    @given(st.data())
    def once(data):
      d = _Draw(data, rule)
      try: node = d.node()
      except NotModelled as e:
        why_not[f"generator: {e}"] += 1
        return
      g = d.leaves.new(node.dtype if node.dtype.is_float else dtypes.float64, node.shape)
      try: grads = fn(node, g if node.dtype.is_float else g.cast(node.dtype))
      except RuleAbort: grads = None
      except RuleRuntimeError as e:
        failures.append((node, f"the rule raised {type(e.cause).__name__}: {e.cause}"))
        return
      if grads is None:
        why_not["pattern/guard not satisfied"] += 1
        return
      key = graph_structure(node, g, *[x for x in grads if x is not None]) + (tuple(x is None for x in grads),)
      found.setdefault(key, (node, g, tuple(grads)))
    try: once()
    except Unsatisfiable: pass

  run(examples, 0)
  if len(found) < WANTED: run(examples * MORE_TRIES, 1)
  return _spread(list(found.values())), why_not, failures


def _spread(instances: list) -> list:
  """At most MAX_INSTANCES, the smallest first, each op (of an alternation) and each number of axes taken before a
  second instance of the same."""
  instances = sorted(instances, key=lambda i: len(i[0].toposort()))
  taken, kinds = [], set()
  for inst in instances:
    kind = (inst[0].op, len(inst[0]._shape or ()))
    if kind not in kinds: taken.append(inst); kinds.add(kind)
  taken += [i for i in instances if not any(i is t for t in taken)]
  return taken[:MAX_INSTANCES]


# *** one instance ***

def prove_gradient_instance(node: UOp, g: UOp, grads: tuple, timeout_ms: int):
  """Whether the rule's gradients are the adjoint of node's forward derivative, for every value of its sources, g
  and every direction; an Outcome of engine/verify/prove.py."""
  floats = [i for i, s in enumerate(node.src) if s.dtype.is_float]
  info = {"before": f"{render(node, depth=6)}  # shape {node._shape}"}
  if len(grads) != len(node.src):
    return Outcome("refuted", counterexample={"why": f"{len(grads)} gradients for {len(node.src)} sources", **info})
  if not node.dtype.is_float or not floats or node.op in NO_GRADIENT_OPS:
    for i in floats:
      if grads[i] is not None:
        what = " (its value is not a float)" if not node.dtype.is_float else ""
        return Outcome("refuted", counterexample={"why": f"gives a gradient for source {i}, but no gradient flows "
                                                         f"through {node.op.name}{what}", **info})
    return Outcome("proven")
  for i in floats:
    if grads[i] is not None and tuple(grads[i]._shape or ()) != tuple(node.src[i]._shape or ()):
      return Outcome("refuted", counterexample={"why": f"gradient {i} has shape {grads[i]._shape}, source {i} has shape "
                                                       f"{node.src[i]._shape}", **info})
  rt = RealTerms()
  try:
    xs = [rt.value(s) for s in node.src]
    ts: list = [None] * len(xs)
    for i in floats:
      t = ts[i] = np.empty(xs[i].shape, dtype=object)
      for k, idx in enumerate(np.ndindex(*t.shape)): t[idx] = z3.Real(f"t{i}_{k}")
    dy, dom = jvp(node, xs, ts, rt)
    gv = rt.value(g)
    lhs = z3.Sum([gk * dk for gk, dk in zip(gv.reshape(-1), dy.reshape(-1))] + [z3.RealVal(0)])
    rhs = [z3.RealVal(0)]
    for i in floats:
      if grads[i] is None: continue
      rhs += [a * b for a, b in zip(rt.value(grads[i]).reshape(-1), ts[i].reshape(-1))]
  except Untranslatable as e: return Outcome("untranslatable", str(e))
  # Both sides are linear in the directions (each JVP above is a sum of tangents times terms of x; the rule's side
  # is sum(grad_i * t_i)), so the identity holds for every t exactly when it holds along each basis direction, one
  # element of one source at a time: many small queries, each with the few variables that element's derivative reads.
  pre = dom + rt.facts
  tvars = [(i, k, v) for i in floats for k, v in enumerate(ts[i].reshape(-1))]
  diff = lhs - z3.Sum(rhs)
  for i, k, v in tvars:
    goal = z3.simplify(z3.substitute(diff, *[(w, z3.RealVal(1 if w is v else 0)) for _, _, w in tvars]))
    if z3.is_rational_value(goal) and goal.as_fraction() == 0: continue
    result, s = _solve(_relevant(goal, pre) + [goal != 0], timeout_ms)
    if result == z3.sat: result, s = _solve(pre + [goal != 0], timeout_ms)   # (a model must meet every condition)
    if result == z3.unsat: continue
    if result == z3.unknown:
      return Outcome("unknown", f"z3 gave no answer within {timeout_ms} ms ({s.reason_unknown()}) along source {i}, element {k}")
    model = s.model()
    # (small integers where there are some: a counterexample easy to read and exact in float64)
    small = [x for arr in rt.buffers.values() for x in arr.reshape(-1) if z3.is_real(x)]
    s.push()
    s.add(*[z3.And(z3.IsInt(x), x >= -NICE, x <= NICE) for x in small])
    s.set("timeout", max(1, timeout_ms // 4))
    if s.check() == z3.sat: model = s.model()
    s.pop()
    direction = {i2: np.asarray([1.0 if (i2, k2) == (i, k) else 0.0 for k2 in range(ts[i2].size)]) for i2 in floats}
    return _confirm(node, g, grads, floats, rt, direction, model, info)
  result, _ = _solve(pre, timeout_ms)
  return Outcome("vacuous", "no values satisfy the domain") if result == z3.unsat else Outcome("proven")


def _solve(constraints: list, timeout_ms: int, split_limit: int = 64):
  """z3's answer for the constraints; a Cases among them is split into its cases (at most split_limit queries in
  all, else asked as one disjunction): unsat when every case is, else the first case's sat or unknown."""
  plain = [c for c in constraints if not isinstance(c, Cases)]
  cases = [c for c in constraints if isinstance(c, Cases)]
  if math.prod(len(c) for c in cases) > split_limit: plain, cases = plain + [z3.Or(*c) for c in cases], []
  for combo in itertools.product(*cases):
    s = z3.Solver()
    s.set("timeout", timeout_ms)
    s.add(*plain, *combo)
    result = s.check()
    if result != z3.unsat: return result, s
  return z3.unsat, s


def _symbols(e, out: set) -> set:
  """The uninterpreted constants (and function applications' constants) a term reads."""
  todo, seen = list(e) if isinstance(e, Cases) else [e], set()
  while todo:
    x = todo.pop()
    if x.get_id() in seen: continue
    seen.add(x.get_id())
    if z3.is_const(x) and x.decl().kind() == z3.Z3_OP_UNINTERPRETED: out.add(x.get_id())
    todo.extend(x.children())
  return out


def _relevant(goal, constraints: list) -> list:
  """The constraints that share a variable with the goal, or with those (transitively): the others constrain only
  variables the goal does not read, so a proof without them is a proof."""
  cons = [(c, _symbols(c, set())) for c in constraints]
  names, picked, grew = _symbols(goal, set()), [], True
  while grew:
    grew = False
    for k, (c, vs) in enumerate(cons):
      if c is not None and vs & names:
        picked.append(c)
        names |= vs
        cons[k] = (None, vs)
        grew = True
  return picked


def _number(model, term, dt: DType):
  v = model.eval(term, model_completion=True)
  if dt.kind == "b": return bool(z3.is_true(v))
  if dt.kind != "f": return v.as_long()
  if z3.is_algebraic_value(v): v = v.approx(30)
  return float(Fraction(v.numerator_as_long(), v.denominator_as_long()))


def _confirm(node: UOp, g: UOp, grads: tuple, floats: list, rt: RealTerms, tangents: dict, model, info: dict):
  """z3's values in float64: refuted only if the rule's sum(grad_i * t_i) differs from the directional derivative of
  sum(g * node) along t by central differences, at a point where that function is smooth."""
  from rulec.engine.verify.gradient import _objective, _value
  from rulec.runtime.buffer import new_buffer, np_dtype
  values = {b: np.asarray([_number(model, v, b.dtype) for v in arr], dtype=np_dtype(b.dtype)) for b, arr in rt.buffers.items()}
  try: inputs = {f"source {i}": _value(s, values).reshape(-1).tolist() for i, s in enumerate(node.src)}
  except (NoValue, NotModelled, ValueError) as e:
    return Outcome("unconfirmed", f"the reference evaluator has no value at z3's counterexample: {e}", info)
  inputs["g"] = values[g.base].tolist() if g.base in values else []
  info["where"] = [f"{k} = {v}" for k, v in inputs.items()]
  info["inputs"] = inputs
  info["shapes"] = {**{f"source {i}": tuple(s._shape or ()) for i, s in enumerate(node.src)}, "g": tuple(g._shape or ())}
  i, k = next((i, int(np.argmax(t))) for i, t in tangents.items() if t.any())
  info["at"] = f"along source {i}, element {k} (the derivative by that element)"
  try:
    gv = _value(g, values)
    adjoint = 0.0
    for i in floats:
      if grads[i] is not None: adjoint += float(np.sum(_value(grads[i], values).astype(np.float64).reshape(-1) * tangents[i]))
    leaves, xs = {}, {}
    for i in floats:
      src = node.src[i]
      xs[i] = np.asarray(_value(src, values), dtype=np.float64).reshape(-1)
      leaves[i] = new_buffer("NUMPY", xs[i].size, src.dtype)
    probe = node.replace(src=tuple(leaves[i].reshape(s.shape) if i in leaves else s for i, s in enumerate(node.src)))

    def at(h: float) -> float:
      v = dict(values)
      for i, leaf in leaves.items(): v[leaf] = (xs[i] + h * tangents[i]).astype(np_dtype(leaf.dtype))
      return _objective(probe, gv, v)
    step = 2.0 ** -8 if any(node.src[i].dtype is dtypes.float32 for i in floats) else 1e-6
    base, up, down = at(0.0), at(step), at(-step)
  except (NoValue, NotModelled, ValueError) as e:
    return Outcome("unconfirmed", f"the reference evaluator has no value at z3's counterexample: {e}", info)
  central = (up - down) / (2 * step)
  info["why"] = "the gradient differs from the derivative (the adjoint identity fails)"
  info["results"] = {"rule": repr(adjoint), "finite differences": repr(central)}
  info["values"] = f"the rule's gradient = {adjoint!r}, finite differences of sum(g * node) = {central!r}"
  smooth = all(map(math.isfinite, (base, up, down))) and abs((up - base) - (base - down)) / step <= 1e-3 * (1 + abs(central))
  if not smooth:
    return Outcome("unconfirmed", f"z3's counterexample is at a kink or a non-finite value in float64 ({info['values']})", info)
  if abs(adjoint - central) <= 1e-4 * (1 + abs(central)):
    return Outcome("unconfirmed", f"z3's counterexample is not one in float64: {info['values']}", info)
  return Outcome("refuted", counterexample=info)
