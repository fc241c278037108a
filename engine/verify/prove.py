"""`rulec prove`: every rule proven with z3 for all values of its leaves, on the instances the verifier builds.

For each rule, the verifier's generator (engine/verify/generate.py, driven by hypothesis as `rulec verify`
drives it) builds instances: the pattern's shape at every dtype the rule allows, each free name a fresh
variable (`ProveGen`: a DEFINE_VAR over the whole dtype, or over bounds the guard may ask for; a tensor-level
name a buffer of unknown contents), constants from the generator's list. The rule alone (its compiled
matcher, as the engine runs it: guards and helpers see this very graph) rewrites the root; the graphs
before and after become z3 terms (engine/verify/smt.py) and z3 is asked for values of the leaves, within
their bounds, where the two differ. None: that instance is proven. Some: a counterexample, which the
reference evaluator (engine/verify/evaluate.py) must confirm before the rule is called refuted.

A rule is proven when every instance is; refuted with the first confirmed counterexample; else not
provable, with the reason (a decision rule reading ctx, an op the translation has no meaning for, a
timeout, a pattern no instance satisfies). A gradient rule gives derivatives, not a value equal to its node's:
it is proven by the adjoint identity in real arithmetic instead (engine/verify/adjoint.py), on the instances
`rulec verify` draws for it. `termination()` checks that no rule set can rewrite forever.
"""
from __future__ import annotations

import collections
import math
import os
import time
import zlib
from typing import Any

import attrs
import numpy as np
import z3
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable

from rulec.engine.ir.dtypes import DType, dtypes
from rulec.engine.ir.ops import MOVEMENT, Ops
from rulec.engine.ir.uop import UOp, render
from rulec.engine.lang import ast as A
from rulec.engine.lang.compiler import pattern_ops
from rulec.engine.lang.loader import RuleLibrary
from rulec.engine.lang.runtime import RuleAbort, RuleRuntimeError
from rulec.engine.sched import early
from rulec.engine.verify import expand_rulesets, refuted_lines
from rulec.engine.verify.core import (SPLIT_THRESHOLD, _attrs_read, _graph_text, _location, _node_patterns, _uses_ctx, modes_for,
                                     static_reason)
from rulec.engine.verify.evaluate import NoValue, NotModelled, TensorEval, compiled_rule, eval_scalar, free_leaves
from rulec.engine.verify.generate import ALL, DEVICES, MAX_LEAVES, Gen, Reject, const_values, dtypes_of
from rulec.engine.verify.instances import MAX_INSTANCES, MORE_TRIES, TRIES_PER_DTYPE, WANTED, Outcome, graph_structure
from rulec.engine.verify.smt import REDUCE_LIMIT, IntTerms, Terms, TensorTerms, Untranslatable, python_value

DEFAULT_TIMEOUT_MS = 3000   # per z3 query (the quicker attempts before the exact one get a fraction of it)
RULE_BUDGET_S = 8           # seconds per rule past which, once an instance is not proven, the rest are not asked
KERNEL = "kernel"           # the mode of INDEX(value, i..) instances (rules/rangeify.rules' index algebra)


# *** instances ***

def bound_choices(dt: DType) -> list[tuple[int, int]]:
  """Bounds of an integer leaf, the most general first (the whole dtype: index is 64 bits wide, as it wraps), then
  the ranges guards ask for (non-negative, positive, negative, small, near either end)."""
  lo, hi = dt.min(), dt.max()
  out = [(lo, hi), (0, hi), (1, hi), (lo, -1), (0, 7), (-8, 7), (0, 255), (lo, lo + 7), (hi - 7, hi), (5, 12),
         (0, 1 << 20), (-(1 << 20), 1 << 20)]
  return [b for b in dict.fromkeys(out) if lo <= b[0] <= b[1] <= hi]


RANGE_SIZES = (1 << 31, 8, 1, 16, 1000)
LOAD_SIZES = (4, 1, 16, 1000)   # elements of a PARAM (a kernel's buffer argument) a load reads
MULTI_OPS = frozenset({Ops.MSTACK, Ops.MSELECT})
# the device sets of multi-device instances: plain and indexed names (CPU:n keep their memory apart, docs/multi.md)
MULTI_DEVICES = (("CPU", "CPU:1"), ("CPU:1", "CPU:2", "CPU:3"), ("CPU", "CPU:1", "CPU:2"))


class ProveGen(Gen):
  """The verifier's generator with symbolic leaves: a free name is a variable over the bounds drawn from
  bound_choices (or a RANGE), a buffer has no contents (z3 gives it any); `prefer` is the dtype the first dtype
  choice takes when it may (the root's, or its operands' for a comparison), so that each run of one preferred
  dtype covers that dtype. In the KERNEL mode the root is INDEX(value, i..) (rules/rangeify.rules)."""

  def __init__(self, draw, mode: str, prefer: DType | None, tags: bool = False, multi: bool = False):
    super().__init__(draw, "tensor" if mode == KERNEL else mode, tags=tags)
    self.prefer, self.kernel, self.multi = prefer, mode == KERNEL, multi and mode == "tensor"
    self.devices: tuple | None = None   # (multi) the devices every stack of the graph is spread over

  def root(self, p) -> UOp:
    if self.multi: self.devices = self.pick(MULTI_DEVICES)
    if not self.kernel: return super().root(p)
    if _load_pattern(p): return self._load(p)
    # INDEX(x, i..): x a tensor-level value (its pattern), each index a variable over its axis
    if not (isinstance(p, A.PNode) and p.srcs and len(p.srcs) == 1): raise Reject("an INDEX pattern with index patterns")
    shape = () if p.tail is None else self.shape()
    x = self.node(p.srcs[0], None, shape)
    if isinstance(p.srcs[0], A.PName) and self.pick(("as drawn", "copied")) == "copied": x = x.contiguous()   # (a realized value)
    shape = x._shape or ()
    if 0 in shape: raise Reject("an empty value has no element to index")
    idxs = [UOp.variable(f"i{k}", 0, d - 1) for k, d in enumerate(shape)]
    return x.index(*idxs, arg=p.arg if p.has_arg else None)

  def _load(self, p: A.PNode) -> UOp:
    """INDEX(PARAM, idx): a kernel's load from its buffer argument (PARAM[(slot, size)]) at an index expression, of
    the leaves this generator draws (bounds as a guard may want them, inside the buffer or not)."""
    if p.tail is not None or len(p.srcs) != 2: raise Reject("a load pattern with other than one index")
    dt = self._dtype(None, dtypes_of(p.srcs[0].dtypes), [d for d in ALL if d is not dtypes.index])
    param = UOp(Ops.PARAM, dt, (), (0, self.pick(LOAD_SIZES)))
    if p.srcs[0].name is not None: self.env[p.srcs[0].name] = param
    self.mode = "scalar"   # (the index is an index-level expression)
    try: idx = self.node(p.srcs[1], dtypes.index, None)
    finally: self.mode = "tensor"
    return param.index(idx, arg=p.arg if p.has_arg else None)

  def node(self, p, want, shape) -> UOp:
    u = super().node(p, want, shape)
    # a literal 0 matches a float -0.0 too (the matcher compares with ==): both are instances
    if isinstance(p, A.PConst) and u.op is Ops.CONST and u.dtype.kind == "f" and u.arg == 0 and \
       self.pick(("as written", "negative zero")) == "negative zero":
      u = UOp.const(u.dtype, -0.0)
      if p.name is not None: self.env[p.name] = u
    return u

  def _pnode(self, p: A.PNode, want, shape) -> UOp:
    if self.devices is not None and pattern_ops(p) & MULTI_OPS: return self._multi(p, want, shape)
    if self.mode == "tensor" and pattern_ops(p) == {Ops.STORE}: return self._store(p, shape)
    if self.kernel and pattern_ops(p) == {Ops.DEFINE_VAR}:   # a Variable used as a value (a kernel's argument)
      if shape: raise Reject("a Variable is a scalar")
      return self.leaf(self._dtype(want, None, [d for d in ALL if d.is_int]), "var")
    if self.mode == "tensor" and pattern_ops(p) == {Ops.BITCAST}: return self._bitcast(p, want, shape)
    return super()._pnode(p, want, shape)

  # *** values spread over devices (rules/multi.rules, docs/multi.md) ***

  def _multi(self, p: A.PNode, want, shape) -> UOp:
    """MSTACK: a value spread over the graph's devices (stack); MSELECT(v)[(i, axis, n)]: device i's part of v, v of
    the shape whose part along axis is `shape`."""
    op = self.pick(sorted(pattern_ops(p) & MULTI_OPS, key=int))
    dt = self._dtype(want, dtypes_of(p.dtypes), ALL)
    if op is Ops.MSTACK:
      if p.srcs or p.each is not None or p.has_arg: raise Reject("an MSTACK pattern with sources or an argument")
      return self.stack(dt, shape)
    if p.has_arg: raise Reject("an MSELECT pattern with an argument")
    n = len(self.devices)
    axis = self.pick([None] + list(range(len(shape))))
    whole = shape if axis is None else shape[:axis] + (shape[axis] * n,) + shape[axis + 1:]
    child = p.srcs[0] if p.srcs else A.PName(p.span, "_")
    return UOp(Ops.MSELECT, dt, (self.node(child, dt, whole),), (self.pick(range(n)), axis, n))

  def stack(self, dt: DType, shape) -> UOp:
    """MSTACK(x_0..x_n-1)[(axis, devices)], x_i a buffer on devices[i]: split along an axis that n divides, or
    replicated (axis None: every part holds the whole value, which prove_instance takes as a precondition)."""
    n = len(self.devices)
    axis = self.pick([None] + [a for a, d in enumerate(shape) if d > 0 and d % n == 0])
    part = shape if axis is None else shape[:axis] + (shape[axis] // n,) + shape[axis + 1:]
    return UOp(Ops.MSTACK, dt, tuple(self.on_device(dt, part, d) for d in self.devices), (axis, self.devices))

  def on_device(self, dt: DType, shape, device: str) -> UOp:
    b = UOp.new_buffer(device, math.prod(shape), dt)
    self.buffers.append(b)
    return b.reshape(shape)

  def _layout(self, op, p: A.PNode, dt: DType, shape):
    if self.devices is not None and op is Ops.COPY and not p.has_arg:   # (to one of the devices, another, or all of them)
      return self.pick(DEVICES + self.devices + (self.devices,)), [(dt, shape)]
    return super()._layout(op, p, dt, shape)

  def _store(self, p: A.PNode, shape) -> UOp:
    """STORE(view, value): a value written through a view of a buffer (a reshape, maybe permuted or flipped: never
    padded or expanded, which the front end refuses to write through)."""
    if p.srcs is None or len(p.srcs) != 2 or p.tail is not None: raise Reject("a STORE pattern with other than two sources")
    dt = self._dtype(None, dtypes_of(p.srcs[1].dtypes) if isinstance(p.srcs[1], A.PName) else None, ALL)
    view = self.buffer(dt, math.prod(shape)).reshape(shape)
    how = self.pick(("as it is", "permuted", "flipped"))
    if how == "permuted" and len(shape) > 1: view = view.reshape(shape[::-1]).permute(tuple(reversed(range(len(shape)))))
    if how == "flipped": view = view.flip(tuple(self.flag() for _ in shape))
    if isinstance(p.srcs[0], A.PName) and p.srcs[0].name != "_": self.env[p.srcs[0].name] = view
    elif not isinstance(p.srcs[0], A.PName): raise Reject("a STORE pattern with a target pattern")
    return view.store(self.node(p.srcs[1], dt, shape))

  def _bitcast(self, p: A.PNode, want, shape) -> UOp:
    """BITCAST(x) to a dtype of another item size (the generator builds none): the last axis holds the same bytes."""
    if not shape: raise Reject("a bitcast to another item size needs an axis")
    numeric = [d for d in ALL if d.kind in "iuf"]
    dt = self._dtype(want, dtypes_of(p.dtypes), numeric)
    src_dt = self.pick([d for d in numeric if d.itemsize != dt.itemsize])
    bytes_ = shape[-1] * dt.itemsize
    if bytes_ % src_dt.itemsize: raise Reject("the last axis does not hold whole items of the source")
    child = p.srcs[0] if p.srcs else A.PName(p.span, "_")
    x = self.node(child, src_dt, shape[:-1] + (bytes_ // src_dt.itemsize,))
    return x.bitcast(dt)

  def shape(self) -> tuple[int, ...]:
    # (axes of size 1 more often than the generator draws them: a reduce keeps its reduced axes as 1s)
    return tuple(self.pick((1, 2, 1, 3, 4, 1, 6, 0)) for _ in range(self.pick((1, 2, 0, 3))))

  def _reduce(self, fixed, has_arg, dt, shape):
    # (the generator reduces a size-1 axis only now and then; here reducing all of them is the first choice, so
    # that reduces over something, empty or large, come up in few tries)
    ones = [i for i, d in enumerate(shape) if d == 1]
    if has_arg or not ones: return super()._reduce(fixed, has_arg, dt, shape)
    rop = self.pick((Ops.ADD, Ops.MAX, Ops.MUL))
    axes = self.pick([tuple(ones)] + [(i,) for i in ones] + [()])
    src, count = [], 1
    for i, d in enumerate(shape):
      if i in axes:   # (at most REDUCE_LIMIT elements to a reduce: the translation unrolls it)
        d = self.pick([n for n in (2, 3, 0, 16, 24, 32, 1, 4) if count * n <= REDUCE_LIMIT])
        count *= d
      src.append(d)
    return (rop, axes), [(dt, tuple(src))]

  def _tensor_filler(self, dt: DType, shape, broadcast: bool, depth: int) -> UOp:
    if self.devices is not None:   # a value spread over the devices, a constant (on none), or a value on one of them
      kind = self.pick(("stack", "const", "one device"))
      if kind == "stack": return self.stack(dt, shape)
      if kind == "one device": return self.on_device(dt, shape, self.pick(self.devices))
      c = UOp.const(dt, self.pick(const_values(dt)))
      return c.reshape((1,) * len(shape)).expand(shape) if shape else c
    # (kernel-level graphs have every elementwise source in its op's shape: rules/early.rules expand_broadcast)
    return super()._tensor_filler(dt, shape, broadcast and not self.kernel, depth)

  def pick(self, seq):
    seq = list(seq)
    if self.prefer is not None and len(seq) > 1 and all(isinstance(x, DType) for x in seq) and self.prefer in seq:
      # (the first dtype choice only, the root's or its operands': patterns that mix dtypes draw the rest)
      choice, self.prefer = self.prefer, None
      return choice
    return super().pick(seq)

  def leaf(self, dt: DType, kind: str) -> UOp:
    if len(self.leaves) >= MAX_LEAVES: raise Reject("too many leaves")
    k = len(self.leaves)
    if kind == "range": u = UOp.range(self.pick(RANGE_SIZES), k)
    elif dt.kind == "f": u = UOp.variable("abc"[k], -math.inf, math.inf, dt)
    elif dt.kind == "b": u = UOp.variable("abc"[k], False, True, dt)
    else:
      lo, hi = self.pick(bound_choices(dt))
      u = UOp.variable("abc"[k], lo, hi, dt)
    self.leaves.append(u)
    return u

  def buffer(self, dt: DType, size: int) -> UOp:
    b = UOp.new_buffer(self.pick(DEVICES), size, dt)
    self.buffers.append(b)
    return b


@attrs.define
class Collector:
  """The distinct instances (before, after) one rule fires on, and why the others did not. An instance on which an
  earlier rule of its set fires is left out: the engine never rewrites that node with this rule."""
  rule: A.Rule
  fn: Any
  interp: Any
  earlier: list = attrs.field(factory=list)   # (name, compiled fn) of the rules before it in its set
  instances: dict = attrs.field(factory=dict)
  tries: int = 0
  why_not: collections.Counter = attrs.field(factory=collections.Counter)
  failures: list = attrs.field(factory=list)
  built: collections.Counter = attrs.field(factory=collections.Counter)   # graphs built per preferred dtype

  def once(self, data, mode: str, prefer: DType | None) -> None:
    self.tries += 1
    try: node = ProveGen(data.draw, mode, prefer, tags=self.tags, multi=self.multi).root(self.rule.pattern)
    except Reject as e:
      self.why_not[f"generator: {e}"] += 1
      return
    self.built[prefer] += 1
    self.add(node, mode, prefer)

  def add(self, node: UOp, mode: str, prefer) -> None:
    """The rule applied to the root of `node`, unless an earlier rule of the set takes it."""
    if _assigns_into_a_broadcast(node):
      self.why_not["no value: an ASSIGN into an expanded or padded view"] += 1
      return
    for name, fn in self.earlier:
      try: first = fn(node, None)
      except Exception:  # noqa: BLE001 - a rule that fails here (it wants its ctx) does not fire
        first = None
      if first is not None and first is not node:
        self.why_not[f"an earlier rule fires first ({name})"] += 1
        return
    try: out = self.fn(node, None)
    except RuleAbort: out = None
    except RuleRuntimeError as e:
      self.failures.append((node, f"the rule raised {type(e.cause).__name__}: {e.cause}"))
      return
    if out is None or out is node:
      self.why_not["pattern/guard not satisfied"] += 1
      return
    self.instances.setdefault(graph_structure(node, out), (node, out, mode, prefer))

  @property
  def tags(self) -> bool: return "tag" in _attrs_read(self.rule)   # (only a rule that reads tags sees tagged roots)

  @property
  def multi(self) -> bool: return _multi_rule(self.rule)


def _multi_rule(rule: A.Rule) -> bool:
  """A rule of values spread over devices: its pattern or its replacement has MSTACK / MSELECT, or it is of the multi
  rule set (rules/multi.rules: a copy between devices): its instances are built on a set of devices (ProveGen.stack)."""
  named = any(isinstance(e, A.EName) and e.id in ("MSTACK", "MSELECT") for e in A.iter_exprs((rule.guard, rule.replacement)))
  return named or rule.ruleset == "multi" or any(pattern_ops(p) & MULTI_OPS for p in _node_patterns(rule.pattern))


def _assigns_into_a_broadcast(node: UOp) -> bool:
  """An ASSIGN into an expanded or padded view: the front end refuses these, and such a graph has no value
  (engine/verify/evaluate.py TensorEval says so too)."""
  return any(u.op is Ops.ASSIGN and any(m.op in (Ops.EXPAND, Ops.PAD) for m in u.src[0].toposort(lambda m: m.op in MOVEMENT))
             for u in node.toposort())


def _load_pattern(p) -> bool:
  """INDEX(PARAM, idx): a kernel's load from a buffer argument (rules/decomp.rules clamp_load)."""
  return (isinstance(p, A.PNode) and pattern_ops(p) == {Ops.INDEX} and p.srcs is not None and len(p.srcs) >= 1
          and isinstance(p.srcs[0], A.PNode) and pattern_ops(p.srcs[0]) == {Ops.PARAM})


def _kernel_pattern(p) -> bool:
  """INDEX(value, ..): an element of a tensor-level value (a kernel-level INDEX of a PARAM is not one)."""
  return (isinstance(p, A.PNode) and pattern_ops(p) == {Ops.INDEX} and p.srcs is not None and len(p.srcs) == 1
          and not (isinstance(p.srcs[0], A.PNode) and pattern_ops(p.srcs[0]) & {Ops.PARAM, Ops.DEFINE_GLOBAL}))


def example_instances(rule: A.Rule, col: Collector) -> None:
  """The rule's own `example:` inputs, where the rule fires on them: hand-made graphs of the shapes (a guarded
  WHERE, a sum of ranges) the generator rarely builds."""
  from rulec.engine.lang.examples import ExampleError, GraphBuilder
  for ex in rule.examples:
    try: node = GraphBuilder().build(ex.input)
    except (ExampleError, TypeError, ValueError): continue
    nodes = node.toposort()
    mode = KERNEL if node.op is Ops.INDEX else "tensor" if any(u.op in TENSOR_ONLY for u in nodes) else "scalar"
    col.add(node, mode, "example")


_PROGRAM_NODES: dict[str, list[UOp]] | None = None
PROGRAM_INSTANCES = 4   # nodes kept per rule from the programs below


def _programs() -> None:
  """A few small programs whose schedules reach kernel-level patterns the generator does not build: Tensor.arange's
  iota (a sum of digit patterns), a gather's one-hot sum, of integers and of floats (an Embedding), and guarded sums. (A strided
  convolution's gradient reaches where_affine's guarded loads, where z3 runs past the time limit on 64-bit division
  by constants: it is left out, for the time it would take.)"""
  from rulec.engine.tensor import Tensor
  Tensor.arange(8).schedule()
  for dt in (np.int32, np.float32):
    Tensor(np.arange(12, dtype=dt).reshape(4, 3))[Tensor([1, 3, 0])].schedule()
  # a padded sum of sums: its guard `1 <= r < 4` ends the outer range early (narrow_reduce), and the guarded sum
  # of a sum is one sum (merge_reduce); integers, so that regrouping the sum is exact
  Tensor(np.arange(12, dtype=np.int32).reshape(3, 4)).sum(1).pad(((1, 1),)).sum().schedule()


def program_nodes(rule: A.Rule) -> list[UOp]:
  """The nodes the rule rewrote while the programs above were scheduled (engine/trace.py records every rewrite,
  with the nodes in its table): real instances, of rules the generator builds no instance for."""
  global _PROGRAM_NODES
  if _PROGRAM_NODES is None:
    from rulec.engine.trace import tracing
    nodes: dict[str, dict[UOp, None]] = collections.defaultdict(dict)
    with tracing("rulec prove") as tr: _programs()
    for rec in tr.passes:
      node_of = {i: u for u, i in rec.table.ids.items()}
      for rw in rec.rewrites:
        if rw["before"] in node_of: nodes[rw["rule"]].setdefault(node_of[rw["before"]])
    _PROGRAM_NODES = {k: list(v)[:PROGRAM_INSTANCES] for k, v in nodes.items()}
  return _PROGRAM_NODES.get(rule.name, [])


def program_instances(rule: A.Rule, col: Collector) -> None:
  from rulec.engine.verify.generate import SCALAR_OPS
  for node in program_nodes(rule):
    ops = {u.op for u in node.toposort()}
    col.add(node, KERNEL if node.op is Ops.INDEX else "scalar" if ops <= SCALAR_OPS else "tensor", "program")


TENSOR_ONLY = frozenset({Ops.BUFFER, Ops.RESHAPE, Ops.PERMUTE, Ops.EXPAND, Ops.PAD, Ops.SHRINK, Ops.FLIP, Ops.REDUCE_AXIS,
                         Ops.CONTIGUOUS, Ops.COPY, Ops.ASSIGN, Ops.STAGE, Ops.AFTER, Ops.STORE})


def _store_pattern(p) -> bool:
  """STORE(target, value) at the tensor level (rules/rangeify.rules store_loops)."""
  return isinstance(p, A.PNode) and pattern_ops(p) == {Ops.STORE}


def prove_modes(rule: A.Rule) -> list[str]:
  if _kernel_pattern(rule.pattern) or _load_pattern(rule.pattern): return [KERNEL]
  if _store_pattern(rule.pattern): return ["tensor"]
  if _multi_rule(rule): return ["tensor"]
  modes = modes_for(rule)
  if not modes and isinstance(rule.pattern, A.PNode) and Ops.BITCAST in pattern_ops(rule.pattern): modes = ["tensor"]
  return modes


_COMPILED: dict[tuple, Any] = {}


def compiled(rule: A.Rule, helpers_of):
  key = (rule.name, rule.span)
  if key not in _COMPILED: _COMPILED[key] = compiled_rule(rule, helpers_of)
  return _COMPILED[key]


def collect(rule: A.Rule, helpers_of, tries: int, earlier: list[A.Rule] = ()) -> Collector:
  """Instances of the rule: its examples', then hypothesis runs the generator `tries` times per preferred dtype,
  and more times for the dtypes that built graphs when few instances fired."""
  fn, interp = compiled(rule, helpers_of)
  col = Collector(rule, fn, interp, [(r.name, compiled(r, helpers_of)[0]) for r in earlier if r.grad is None])
  example_instances(rule, col)

  def run(mode: str, prefer: DType, n: int) -> None:
    # (a seed of its own per rule, mode, dtype and pass: derandomize would draw the same choices for every dtype)
    @seed(zlib.crc32(f"{rule.name}/{mode}/{prefer.name}/{n}".encode()))
    @settings(max_examples=n, database=None, deadline=None, suppress_health_check=list(HealthCheck),
              phases=(Phase.generate,), print_blob=False)
    @given(st.data())
    def once(data): col.once(data, mode, prefer)
    try: once()
    except Unsatisfiable: pass

  for mode in prove_modes(rule):
    for prefer in ALL: run(mode, prefer, tries)
    if len(col.instances) < WANTED:
      for prefer in [d for d in ALL if col.built[d]]: run(mode, prefer, tries * MORE_TRIES)
    if col.instances: break   # (as the verifier: the first mode whose graphs the rule fires on)
  if not col.instances: program_instances(rule, col)
  return col


def pick_instances(col: Collector, limit: int) -> list[tuple[UOp, UOp, str]]:
  """At most `limit` instances, spread over the preferred dtypes (round robin) and, within one, over shapes: each
  turn takes a dtype's smallest instance whose structure (dtypes aside) no instance taken has, else its smallest."""
  by_dtype: dict = collections.defaultdict(list)
  for before, after, mode, prefer in col.instances.values(): by_dtype[prefer].append((before, after, mode))
  taken: list = []
  shapes: set = set()
  # (the smallest graphs first: a name that is a bare leaf is the most general instance there is)
  queues = [sorted(q, key=lambda i: len(i[0].toposort())) for q in by_dtype.values()]
  while queues and len(taken) < limit:
    for q in list(queues):
      if len(taken) >= limit: break
      k = next((k for k, (b, a, _) in enumerate(q) if _untyped(b, a) not in shapes), 0)
      b, a, m = q.pop(k)
      taken.append((b, a, m))
      shapes.add(_untyped(b, a))
      if not q: queues.remove(q)
  return taken


def _untyped(before: UOp, after: UOp) -> tuple:
  return tuple((op, arg, src) for op, _, arg, _, src in graph_structure(before, after))


# *** one instance ***

def _strict_equal(a, b) -> bool:
  if isinstance(a, float) and isinstance(b, float):
    if math.isnan(a) and math.isnan(b): return True
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
  return type(a) is type(b) and a == b


def _leaf_name(u: UOp) -> str: return f"r{u.arg[0]}" if u.op is Ops.RANGE else str(u.arg[0])


def _leaf_text(u: UOp) -> str:
  if u.op is Ops.RANGE: return f"{_leaf_name(u)} = RANGE(0..{u.src[0].arg - 1})"
  if u.dtype.kind in "fb": return f"{u.arg[0]} = DEFINE_VAR{{{u.dtype.name}}}"
  return f"{u.arg[0]} = DEFINE_VAR{{{u.dtype.name}}}({u.arg[1]}..{u.arg[2]})"


def _show(v) -> str:
  if isinstance(v, float) and v == 0: return "-0.0" if math.copysign(1.0, v) < 0 else "0.0"
  return repr(v)


def _solve(terms, goal, timeout_ms: int):
  s = z3.Solver()
  s.set("timeout", timeout_ms)
  s.add(*terms.constraints(), *terms.definitions, goal)
  return s.check(), s


def generalized(before: UOp, after: UOp) -> frozenset:
  """The largest subgraphs the rewrite keeps as they are (a name of the pattern, usually): proving the rule for
  any value of them (any function of the index, for a tensor) proves it for the values they have, and spares z3
  what is inside (a * a + b)."""
  # (not a stack: the rewrite reads its parts, which an opaque value of the whole would not tie to it)
  shared = {u for u in before.toposort() if u.src and u.op not in (Ops.RANGE, Ops.DEFINE_VAR, Ops.CONST, Ops.BUFFER, Ops.MSTACK)}
  shared &= set(after.toposort())
  top = {g for g in (before, after) if g in shared}
  for g in (before, after):
    for u in g.toposort():
      if u not in shared: top.update(s for s in u.src if s in shared)
  return frozenset(top)


def prove_instance(before: UOp, after: UOp, mode: str, timeout_ms: int, pattern=None) -> Outcome:
  """Whether before and after have the same value for every value of the leaves (within their bounds)."""
  graphs = {"before": _graph_text(before), "after": _graph_text(after)}
  if before.op is Ops.STORE: return _prove_writes(before, after, timeout_ms)
  if after.dtype is not before.dtype:
    return Outcome("refuted", counterexample={"why": f"the dtype changed: {before.dtype.name} -> {after.dtype.name}", **graphs})
  if mode == "tensor":
    try: shapes = [TensorTerms(False, [g]).shape(g) for g in (before, after)]
    except Untranslatable as e: return Outcome("untranslatable", str(e))
    if shapes[0] != shapes[1]:
      return Outcome("refuted", counterexample={"why": f"the shape changed: {shapes[0]} -> {shapes[1]}", **graphs})
    if 0 in shapes[0]: return Outcome("proven")   # (no elements: equal shapes and dtypes are all there is)
    if after.op is Ops.MSTACK and after.arg[0] is None and before.op is not Ops.MSTACK:
      # a replicated result: every device holds the whole value, so each part must be it (the value of a replicated
      # stack is its first part; the others are what the other devices compute)
      first = None
      for device, x in zip(after.arg[1], after.src):
        out = prove_instance(before, x, mode, timeout_ms, pattern)
        if out.status not in ("proven", "vacuous"):
          if out.counterexample is not None:
            note = out.counterexample.get("note")
            out.counterexample["note"] = f"on device {device} (its part of the replicated result)" + (f"; {note}" if note else "")
          return out
        first = first or out
      return first
  leaves = free_leaves(before)
  new = [x for x in free_leaves(after) if x not in leaves and not _reduced(x, after)]
  if new:
    return Outcome("refuted", counterexample={"why": f"the rewrite introduced free leaves: {', '.join(render(x) for x in new)}",
                                              **graphs})
  # Quick attempts first, each an abstraction (engine/verify/smt.py Terms): kept subgraphs as any value, division
  # by its facts. A proof there is a proof; anything else is asked again, finally of the exact translation.
  # Linear integer graphs go to z3's integer arithmetic first (IntTerms: exact too, and quick with division by
  # constants); an op it has no meaning for sends them on to the bit-vectors.
  kept = generalized(before, after)
  attempts = [("int", kept), ("int", frozenset())] if mode == "scalar" else []
  attempts += [("abstract", kept), ("abstract", frozenset()), ("exact", frozenset())]
  for kind, opaque in attempts:
    try:
      if kind == "int": terms = IntTerms(False, opaque)
      elif mode == "scalar": terms = Terms(kind == "abstract", opaque)
      else: terms = TensorTerms(kind == "abstract", [before, after], opaque)
      goal = terms.differ(before, after)
    except Untranslatable as e:
      if kind == "int": continue
      return Outcome("untranslatable", str(e))
    exact = kind == "exact" or (not terms.abstractions and not opaque)
    try: result, solver = _solve(terms, goal, timeout_ms if kind == "exact" else max(1, timeout_ms // (4 if kind == "int" else 2)))
    except z3.Z3Exception as e: return Outcome("untranslatable", f"z3: {e}")
    if result == z3.unsat:
      # (no values at all satisfy the leaves' bounds: nothing was proven)
      if _solve(terms, z3.BoolVal(True), timeout_ms)[0] == z3.unsat: return Outcome("vacuous", "no values satisfy the bounds")
      return Outcome("proven")
    if not exact or (result == z3.unknown and kind != "exact"): continue   # (an abstraction may allow what the exact meaning does not)
    if result == z3.unknown:
      return Outcome("unknown", f"z3 gave no answer within {timeout_ms} ms ({solver.reason_unknown()})")
    return _counterexample(before, after, mode, terms, solver.model(), pattern)
  raise AssertionError("unreachable")


def _prove_writes(before: UOp, after: UOp, timeout_ms: int) -> Outcome:
  """A store rewritten (into a loop of element stores): the buffers it writes hold the same contents afterwards, for
  any contents they held before and any value stored."""
  try:
    terms = TensorTerms(False, [before, after])
    goal = terms.differ_writes(before, after)
    result, solver = _solve(terms, goal, timeout_ms)
  except Untranslatable as e: return Outcome("untranslatable", str(e))
  except z3.Z3Exception as e: return Outcome("untranslatable", f"z3: {e}")
  if result == z3.unsat: return Outcome("proven")
  if result == z3.unknown: return Outcome("unknown", f"z3 gave no answer within {timeout_ms} ms ({solver.reason_unknown()})")
  (buf, k), _, _ = terms.witness(solver.model())
  return Outcome("unconfirmed", f"z3 finds element {k} of buffer {buf} different after the stores: kernel-level stores "
                 "have no reference evaluator to confirm it")


def _reduced(leaf: UOp, graph: UOp) -> bool:
  """A RANGE a REDUCE of the graph runs over (a loop of the rewrite's own, not a free leaf)."""
  return leaf.op is Ops.RANGE and any(u.op is Ops.REDUCE and leaf in u.src[1:] for u in graph.toposort())


def _counterexample(before: UOp, after: UOp, mode: str, terms, model, pattern=None) -> Outcome:
  """The model as leaf values, confirmed by the reference evaluator: a counterexample only if it agrees."""
  device = tuple(sorted(terms.device_ops))
  info: dict[str, Any] = {"why": "different values", "before": _graph_text(before), "after": _graph_text(after)}
  leaves = free_leaves(before)
  if leaves: info["where"] = [_leaf_text(x) for x in leaves]
  env = {u: python_value(model.eval(terms.leaf(u), model_completion=True), u.dtype) for u in leaves}
  index, value_before, value_after = terms.witness(model)
  solver_values = (python_value(model.eval(value_before, model_completion=True), before.dtype),
                   python_value(model.eval(value_after, model_completion=True), before.dtype))
  if mode == KERNEL:
    at = ", ".join(f"{_leaf_name(u)} = {_show(v)}" for u, v in env.items())
    info["at"] = at
    info["values"] = f"before = {_show(solver_values[0])}, after = {_show(solver_values[1])} (z3's)"
    return Outcome("unconfirmed", f"z3 finds {info['values']} at {at}: kernel-level graphs have no reference "
                   "evaluator to confirm it", info, device)
  if mode == "tensor": return _tensor_counterexample(before, after, terms, model, env, info, solver_values, device, index)
  at = ", ".join(f"{_leaf_name(u)} = {_show(v)}" for u, v in env.items())
  if at: info["at"] = at
  try: want, got = eval_scalar(before, env), eval_scalar(after, env)
  except (NoValue, NotModelled, OverflowError) as e:
    return Outcome("unconfirmed", f"the reference evaluator has no value at z3's counterexample ({at}): {e}",
                   device_defined=device)
  info["inputs"] = {_leaf_name(u): _show(v) for u, v in env.items()}
  info["results"] = {"before": _show(want), "after": _show(got)}
  names = _pattern_values(pattern, before, env)
  if names: info["names"] = names
  return _confirm(info, want, got, solver_values, device, lambda: (eval_scalar(before, env, exact=True),
                                                                   eval_scalar(after, env, exact=True)))


def _pattern_values(pattern, before: UOp, env: dict) -> dict[str, str]:
  """The value of each name of the pattern at the counterexample (x = 7 where x matched a + 5)."""
  if pattern is None: return {}
  from rulec.engine.lang.interp import match
  for binding in match(pattern, before, {}):
    out = {}
    for name, u in binding.items():
      if isinstance(u, UOp) and u.op is not Ops.CONST:
        try: out[name] = _show(eval_scalar(u, env))
        except (NoValue, NotModelled, OverflowError): pass
    return out
  return {}


def _confirm(info: dict, want, got, solver_values, device: tuple, exact=None) -> Outcome:
  if _strict_equal(want, got):
    what = (f"z3 finds before = {_show(solver_values[0])}, after = {_show(solver_values[1])} "
            f"at {info.get('at', 'the only point')}, where the reference evaluator gives {_show(want)} for both")
    return Outcome("unconfirmed", what, info, device_defined=device)
  info["values"] = f"before = {_show(want)}, after = {_show(got)}"
  if any(d.startswith("a float REDUCE") for d in device):
    # (the reference reduces in numpy's order; another order rounds otherwise: a difference here is no refutation)
    return Outcome("unconfirmed", f"the reference evaluator gives {info['values']} at {info.get('at', 'the only point')}, "
                   "where the two orders of a float reduction round differently", info, device_defined=device)
  if isinstance(want, float) and isinstance(got, float) and want == got:
    info["note"] = "the values differ only in the sign of zero"
  elif exact is not None:
    try:
      if _strict_equal(*exact()): info["note"] = "equal without integer wrap-around: the rule assumes no overflow"
    except (NoValue, NotModelled, OverflowError): pass
  return Outcome("refuted", counterexample=info)


def _tensor_counterexample(before, after, terms, model, env, info, solver_values, device, index) -> Outcome:
  from rulec.runtime.buffer import buffer_of
  info["at"] = f"index {index}" + "".join(f", {_leaf_name(u)} = {_show(v)}" for u, v in env.items())
  contents = []
  for b in terms.buffers:
    vals = [python_value(model.eval(terms.buffer_element(b, k), model_completion=True), b.dtype) for k in range(b.arg[-1])]
    contents.append(f"buffer {b.arg[0]} = [{', '.join(_show(v) for v in vals)}]")
    buffer_of(b).copyin(np.asarray(vals, dtype=_np_dtype(b.dtype)))
  if contents: info["where"] = info.get("where", []) + contents
  if env:
    return Outcome("unconfirmed", "a tensor graph with variables: the reference evaluator cannot be asked", info, device)
  try:
    want = TensorEval().value(before)
    got = TensorEval().value(after)
    want_v, got_v = want[index].item(), got[index].item()
  except (NoValue, NotModelled, IndexError, ValueError, TypeError) as e:
    return Outcome("unconfirmed", f"the reference evaluator has no value at z3's counterexample: {e}", info, device)
  return _confirm(info, _py(want_v), _py(got_v), solver_values, device)


def _py(v):
  if isinstance(v, (np.floating, float)): return float(v)
  if isinstance(v, (np.bool_, bool)): return bool(v)
  return int(v)


def _np_dtype(dt: DType):
  from rulec.runtime.buffer import np_dtype
  return np_dtype(dt)


# *** one rule ***

@attrs.define
class ProofResult:
  name: str
  location: str
  ruleset: str
  status: str                     # "proven" | "refuted" | "not provable"
  instances: int = 0              # instances proven
  reason: str | None = None       # why not provable
  counterexample: dict | None = None
  seconds: float = 0.0
  span: Any = None                # (the rule's span, for SARIF; not in JSON)
  pairs: list = attrs.field(factory=list)   # (before, after) of the instances, for the termination check

  def to_json(self) -> dict[str, Any]:
    out = {"name": self.name, "location": self.location, "status": self.status, "instances": self.instances}
    if self.reason is not None: out["reason"] = self.reason
    if self.counterexample is not None: out["counterexample"] = self.counterexample
    return out


DEVICE_DEFINED_NOTE = ("the rewrite replaces an op each device computes its own way (EXP2, LOG2, SIN, POW: engine/ir/alu.py "
                       "DEVICE_DEFINED) by an approximation, so no equality holds to prove; ")


def _static(rule: A.Rule) -> str | None:
  """Why no instance of this rule can be proven, when that is clear before building any."""
  if _uses_ctx(rule):
    called = {e.func.id for e in A.iter_exprs(rule.replacement) if isinstance(e, A.ECall) and isinstance(e.func, A.EName)}
    if called & {"exp2_bits", "log2_bits"}:
      return (DEVICE_DEFINED_NOTE + "tests/codegen/test_decomp_exp.py checks it against numpy instead (every float16 "
              "value bit for bit, the float32 ulp bound across every binade); and it reads ctx")
    if any(isinstance(e, A.EName) and e.id == "MULACC" for e in A.iter_exprs(rule.guard)):
      return ("it settles whether a MULACC marked fma rounds once or twice (the device's choice, from ctx): the two "
              "roundings differ by design, no equality holds to prove")
    return "reads ctx (the state of its pass): a decision rule, whose rewrite depends on what the pass knows"
  if _kernel_pattern(rule.pattern) or _load_pattern(rule.pattern) or _store_pattern(rule.pattern) or _multi_rule(rule):
    return None
  if isinstance(rule.pattern, A.PNode) and pattern_ops(rule.pattern) == {Ops.AFTER}:
    return ("it makes AFTER(buffer, stores) the buffer itself: a kernel's reference to memory, read once the stores are "
            "done (the schedule orders them), not a value: no equality of values to prove")
  why = static_reason(rule)
  # (BITCAST: ProveGen builds it, where the verifier's generator does not)
  return None if why is not None and why.startswith("the pattern needs BITCAST nodes") else why


def prove_rule(rule: A.Rule, helpers_of, timeout_ms: int = DEFAULT_TIMEOUT_MS, tries: int = TRIES_PER_DTYPE,
               max_instances: int = MAX_INSTANCES, earlier: list[A.Rule] = ()) -> ProofResult:
  """Prove one rule; `earlier`: the rules its set tries first (an instance one of them rewrites is not this rule's)."""
  saved = early.REDUCE_SPLIT_THRESHOLD
  early.REDUCE_SPLIT_THRESHOLD = SPLIT_THRESHOLD   # (as the verifier: small generated reduces reach the split)
  # (likewise the ring allreduce, which the engine picks for more than 256k elements on more than two devices: its
  # rule is proven on small values with RULEC_RING=2, always the ring; the other rules see the default)
  ring = os.environ.get("RULEC_RING")
  if _calls(rule, "ring_wanted"): os.environ["RULEC_RING"] = "2"
  start = time.perf_counter()
  try: res = _prove_rule(rule, helpers_of, timeout_ms, tries, max_instances, earlier)
  finally:
    early.REDUCE_SPLIT_THRESHOLD = saved
    if ring is None: os.environ.pop("RULEC_RING", None)
    else: os.environ["RULEC_RING"] = ring
  res.seconds = time.perf_counter() - start
  return res


def _calls(rule: A.Rule, name: str) -> bool:
  return any(isinstance(e, A.ECall) and isinstance(e.func, A.EName) and e.func.id == name
             for e in A.iter_exprs((rule.guard, rule.replacement)))


def _prove_rule(rule: A.Rule, helpers_of, timeout_ms: int, tries: int, max_instances: int, earlier) -> ProofResult:
  res = ProofResult(rule.name, _location(rule.span), rule.ruleset, "not provable", span=rule.span)
  if rule.grad is not None: return _prove_gradient_rule(rule, helpers_of, timeout_ms, res)
  if (why := _static(rule)) is not None and not (why.startswith("the pattern needs") and program_nodes(rule)):
    res.reason = why
    return res
  col = collect(rule, helpers_of, tries, earlier)
  for node, why in col.failures[:1]:
    res.status, res.counterexample = "refuted", {"why": why, "before": _graph_text(node)}
    return res
  picked = pick_instances(col, max_instances)
  res.pairs = [(b, a) for b, a, _ in picked]
  if not picked:
    top = ", ".join(f"{k} x{n}" for k, n in col.why_not.most_common(2))
    res.reason = f"the generator could not satisfy the pattern/guard in {col.tries} tries ({top})"
    return res
  outcomes = collections.defaultdict(list)
  start = time.perf_counter()
  for k, (before, after, mode) in enumerate(picked):
    failed = any(st not in ("proven", "vacuous") for st in outcomes)
    if failed and time.perf_counter() - start > RULE_BUDGET_S:
      outcomes["not asked"] = [(b, None) for b, _, _ in picked[k:]]
      break
    # (once an instance is not proven, the rule is not: the rest can only refute it, which z3 does quickly if at all)
    out = prove_instance(before, after, mode, max(1, timeout_ms // 8) if failed else timeout_ms, rule.pattern)
    if out.status == "refuted":
      res.status, res.counterexample, res.instances = "refuted", out.counterexample, len(outcomes["proven"])
      return res
    outcomes[out.status].append((before, out))
  res.instances = len(outcomes["proven"])
  if outcomes["proven"] and len(outcomes["proven"]) + len(outcomes["vacuous"]) == len(picked):
    res.status = "proven"
    return res
  res.reason = _why_not(outcomes, len(picked))
  return res


def _prove_gradient_rule(rule: A.Rule, helpers_of, timeout_ms: int, res: ProofResult) -> ProofResult:
  """A gradient rule, by the adjoint identity in real arithmetic (engine/verify/adjoint.py), on the instances the
  gradient verifier draws."""
  from rulec.engine.verify import adjoint
  picked, why_not, failures = adjoint.collect(rule, compiled(rule, helpers_of)[0])
  for node, why in failures[:1]:
    res.status, res.counterexample = "refuted", {"why": why, "before": _graph_text(node)}
    return res
  if not picked:
    top = ", ".join(f"{k} x{n}" for k, n in why_not.most_common(2))
    res.reason = f"the generator could not satisfy the pattern/guard ({top})"
    return res
  outcomes = collections.defaultdict(list)
  for node, g, grads in picked:
    out = adjoint.prove_gradient_instance(node, g, grads, timeout_ms)
    if out.status == "refuted":
      res.status, res.counterexample, res.instances = "refuted", out.counterexample, len(outcomes["proven"])
      return res
    outcomes[out.status].append((node, out))
  res.instances = len(outcomes["proven"])
  if outcomes["proven"] and len(outcomes["proven"]) + len(outcomes["vacuous"]) == len(picked): res.status = "proven"
  else: res.reason = _why_not(outcomes, len(picked))
  return res


def _why_not(outcomes: dict, total: int) -> str:
  """The reason a rule is not provable, from its instances' outcomes (the worst kind first)."""
  parts = []
  for status, lead in (("untranslatable", "the translation has no meaning for it"), ("unconfirmed", "not confirmed"),
                       ("unknown", "z3 timed out")):
    got = outcomes.get(status) or []
    if not got: continue
    before, out = got[0]
    if status == "unconfirmed" and out.device_defined:
      text = (f"holds only for some of the answers the device may give for {', '.join(out.device_defined)} (the translation "
              f"leaves them unknown: engine/ir/alu.py DEVICE_DEFINED): {out.reason}")
    elif status == "unconfirmed":
      text = f"z3's counterexample is not one for the reference evaluator: {out.reason}"
    else: text = f"{lead}: {out.reason}"
    parts.append(f"{text} ({len(got)} of {total} instances, e.g. {render(before, depth=4)})")
  proven = len(outcomes.get("proven") or [])
  if not parts: return f"no values satisfy the bounds of any of its {total} instances: nothing was proven"
  skipped = len(outcomes.get("not asked") or [])
  return "; ".join(parts) + (f"; the other {proven} instances are proven" if proven else "") + \
    (f"; {skipped} were not asked (past the rule's {RULE_BUDGET_S} s, once it was not provable)" if skipped else "")


# *** termination ***

# An order on ops for the termination measure, lowest first (leaves and constants below all of them): a rule
# that trades an op for any number of lower ones decreases the multiset of its graph's ops (Dershowitz-Manna).
# Decompositions lower IDIV / MOD to CDIV / CMOD and comparisons; the symbolic rules move toward ADD, MUL and MAX.
OP_ORDER = (Ops.AND, Ops.OR, Ops.XOR, Ops.CMPNE, Ops.CMPEQ, Ops.CMPLT, Ops.CAST, Ops.MUL, Ops.ADD, Ops.MAX, Ops.SHL,
            Ops.SHR, Ops.CDIV, Ops.CMOD, Ops.SUB, Ops.NEG, Ops.MULACC, Ops.TRUNC, Ops.SQRT, Ops.RECIPROCAL, Ops.FDIV,
            Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.WHERE, Ops.MOD, Ops.IDIV, Ops.POW)
_RANK = {op: k + 1 for k, op in enumerate(OP_ORDER)}
# how deep an op sits matters too: (x + c1) * c2 -> x * c2 + c3 moves the MUL below the ADD (a polynomial's
# normal form), (x + y*c) // d -> x // d + y*e moves the division down
_NESTING = {Ops.IDIV: 4, Ops.MOD: 4, Ops.MUL: 3}


def _rank(u: UOp) -> int:
  if u.op in _RANK: return _RANK[u.op]
  return 0 if not u.src else len(_RANK) + 1   # (a leaf; an op outside the order counts as the largest)


def measure(u: UOp, node_count_first: bool) -> tuple:
  """The well-founded measure a rule must decrease, compared lexicographically: the multiset of op ranks (as a
  descending sequence: for a total order, comparing those is the multiset order) and the number of nodes, in
  either order; then constants on the left of a binary op (c + x -> x + c); then the depths of constants (they
  move up: (x + c) + y -> (x + y) + c); then the nesting weight (each op of _NESTING times the size of what it
  applies to: they move down)."""
  nodes = u.toposort()
  ops = tuple(sorted((_rank(n) for n in nodes), reverse=True))
  size: dict[UOp, int] = {}
  for n in nodes: size[n] = 1 + sum(size[s] for s in n.src)
  nested = sum(_NESTING.get(n.op, 0) * size[n] for n in nodes)
  left = sum(1 for n in nodes if len(n.src) == 2 and n.src[0].op is Ops.CONST and n.src[1].op is not Ops.CONST)
  depth = {u: 0}
  for n in reversed(nodes):
    for s in n.src: depth[s] = max(depth.get(s, 0), depth[n] + 1)
  const_depth = sum(depth[n] for n in nodes if n.op is Ops.CONST)
  first = (len(nodes), ops) if node_count_first else (ops, len(nodes))
  return first + (left, const_depth, nested)


@attrs.define
class Termination:
  ruleset: str
  measure: str                 # which measure decreased most
  decreasing: list[str]
  not_decreasing: list[tuple[str, str]]   # (rule, an instance it does not decrease)
  cycles: list[tuple[str, ...]]           # rules whose rewrites lead back to a graph they started from

  def to_json(self) -> dict:
    return {"ruleset": self.ruleset, "measure": self.measure, "decreasing": len(self.decreasing),
            "not_decreasing": [{"rule": r, "instance": i} for r, i in self.not_decreasing],
            "cycles": [list(c) for c in self.cycles]}


MEASURE_NAMES = {True: "node count, then the multiset of ops (OP_ORDER)", False: "the multiset of ops (OP_ORDER), then node count"}


def termination(lib: RuleLibrary, name: str, results: list[ProofResult], steps: int = 64) -> Termination:
  """Whether the rule set can rewrite forever, on the proof's instances. Each rule should decrease one measure
  (see `measure`); of the two orders the one fewer rules fail is reported. The instances of a rule that does not
  are rewritten by the whole set (graph_rewrite, within `steps` rewrites): a loop is reported with the rules that
  kept firing (a pair of rules that undo each other, a rule that grows its own match)."""
  pairs = [(r.name, b, a) for r in results for b, a in r.pairs]
  best = None
  for first in (True, False):
    bad = [(rule, before) for rule, before, after in pairs if not measure(after, first) < measure(before, first)]
    if best is None or len({r for r, _ in bad}) < len({r for r, _ in best[1]}): best = (first, bad)
  first, bad = best
  failing = list(dict.fromkeys(r for r, _ in bad))
  shown = {r: render(b, depth=4) for r, b in reversed(bad)}
  cycles = _cycles(lib, name, [(rule, before, after) for rule, before, after in pairs if rule in failing], steps)
  decreasing = [r.name for r in results if r.pairs and r.name not in failing]
  return Termination(name, MEASURE_NAMES[first], decreasing, [(r, shown[r]) for r in failing], cycles)


class _Recorder:
  """The set's rules in order, as a matcher for graph_rewrite that remembers which rule fired."""
  def __init__(self, fns): self.fns, self.fired = fns, []

  def rewrite(self, u: UOp, ctx=None):
    for name, fn in self.fns:
      try: out = fn(u, None)
      except (RuleAbort, RuleRuntimeError): out = None
      if out is not None and out is not u:
        self.fired.append(name)
        return out
    return None


def _cycles(lib: RuleLibrary, name: str, pairs, steps: int) -> list[tuple[str, ...]]:
  """Rewrite each instance's graph with the whole set (graph_rewrite, at every node, to a fixed point) within a
  small step budget: a rewrite that leads back to a node being rewritten, or that goes on past the budget, is a
  loop, reported with the rules that kept firing."""
  from rulec.engine.ir.rewrite import RewriteLoopError, graph_rewrite
  if not pairs: return []
  fns = [(r.name, compiled(r, lib.checked.helpers_of)[0]) for r in lib.rules_of((name,)) if not _uses_ctx(r) and r.grad is None]
  found: dict[frozenset, tuple[str, ...]] = {}
  for _rule, before, _after in pairs:
    rec = _Recorder(fns)
    try: graph_rewrite(before, rec, max_steps=steps)
    except RewriteLoopError:
      cycle = tuple(dict.fromkeys(rec.fired[-16:]))
      found.setdefault(frozenset(cycle), cycle)
    except Exception:  # noqa: BLE001 - a rule that fails on another's result is not a loop; prove_rule reports failures
      continue
  return list(found.values())


# *** a library ***

@attrs.define
class ProveSetResult:
  name: str
  file: str
  rules: list[ProofResult]
  termination: Termination | None = None

  def count(self, status: str) -> int: return sum(r.status == status for r in self.rules)

  def summary(self) -> str:
    return (f"{self.name}: {self.count('proven')} proven, {self.count('refuted')} refuted, "
            f"{self.count('not provable')} not provable")


def prove_library(lib: RuleLibrary, names: list[str] | None = None, timeout_ms: int = DEFAULT_TIMEOUT_MS,
                  tries: int = TRIES_PER_DTYPE, progress=None) -> list[ProveSetResult]:
  """Prove every rule of the named rule sets (each reported under the set that defines it), then check each
  set's termination."""
  lib.require_clean()
  ck = lib.checked
  out = []
  for n in expand_rulesets(lib, list(names or ())):
    rs = ck.rulesets[n]
    results = []
    order = lib.rules_of((n,))   # (the order the set's matcher tries them in, its includes' rules first)
    for rule in rs.rules:
      earlier = order[:next((k for k, r in enumerate(order) if r.name == rule.name), 0)]
      results.append(prove_rule(rule, ck.helpers_of, timeout_ms, tries, earlier=earlier))
      if progress is not None: progress(results[-1])
    res = ProveSetResult(n, _location(rs.span).rsplit(":", 2)[0], results)
    if rs.grad is None: res.termination = termination(lib, n, results)
    out.append(res)
  return out


# *** output ***

def format_rule(r: ProofResult) -> list[str]:
  if r.status == "proven": return [f"  proven         {r.name} ({r.location}): {r.instances} instances"]
  if r.status == "not provable": return [f"  not provable   {r.name} ({r.location}): {r.reason}"]
  # (a refuted rule's "at", when there is one, is never empty: counterexample_lines prints it as verify does)
  return refuted_lines(r.name, r.location, r.counterexample)


def format_termination(t: Termination) -> list[str]:
  if not t.not_decreasing and not t.decreasing: return ["  termination: nothing to check (no rule of the set has instances)"]
  if not t.not_decreasing:
    return [f"  termination: every rule with instances ({len(t.decreasing)}) decreases {t.measure}"]
  lines = [f"  termination: {len(t.decreasing)} rules decrease {t.measure}; {len(t.not_decreasing)} do not: "
           + ", ".join(r for r, _ in t.not_decreasing)]
  for cycle in t.cycles: lines.append(f"  LOOP: {_loop_text(cycle)}")
  if not t.cycles: lines.append("    (the set rewrites each of their instances to a fixed point: no loop found)")
  return lines


def _loop_text(cycle: tuple[str, ...]) -> str:
  if len(cycle) == 1: return f"{cycle[0]} rewrites its own result again, without end"
  return f"{' -> '.join(cycle)} -> {cycle[0]}: these rules undo each other"


def totals(results: list[ProveSetResult]) -> dict[str, int]:
  rules = [r for rs in results for r in rs.rules]
  return {k: sum(r.status == s for r in rules) for k, s in (("proven", "proven"), ("refuted", "refuted"),
                                                             ("not_provable", "not provable"))}


def format_human(results: list[ProveSetResult]) -> str:
  lines: list[str] = []
  for rs in results:
    lines.append(f"ruleset {rs.name} ({rs.file})")
    for r in rs.rules: lines += format_rule(r)
    if rs.termination is not None: lines += format_termination(rs.termination)
  lines.append("")
  lines += [rs.summary() for rs in results]
  t = totals(results)
  lines.append(f"total: {t['proven']} proven, {t['refuted']} refuted, {t['not_provable']} not provable")
  cycles = [c for rs in results if rs.termination for c in rs.termination.cycles]
  if cycles: lines.append(f"termination: {len(cycles)} loops (rule sets that may rewrite forever)")
  return "\n".join(lines)


def format_json(results: list[ProveSetResult]) -> dict:
  return {"rulesets": [{"name": rs.name, "file": rs.file, "proven": rs.count("proven"), "refuted": rs.count("refuted"),
                        "not_provable": rs.count("not provable"), "rules": [r.to_json() for r in rs.rules],
                        **({"termination": rs.termination.to_json()} if rs.termination else {})}
                       for rs in results], **totals(results)}


PROVE_CODES = {"P001": "rule refuted: z3 found values of its leaves on which the rewrite changes the value",
               "P002": "rule set may not terminate: rules whose rewrites lead back to a graph they started from"}


def format_sarif(lib: RuleLibrary, results: list[ProveSetResult], tool_version: str | None = None) -> dict:
  """A SARIF 2.1.0 log: each refuted rule at its file:line:col (P001, with the counterexample), each termination
  cycle at its first rule (P002)."""
  from rulec.engine.lang.sarif import refutation_message, sarif_log, span_result
  log = sarif_log([], tool_version=tool_version)
  run = log["runs"][0]
  rules_meta = run["tool"]["driver"]["rules"]
  base = len(rules_meta)
  for k, (code, text) in enumerate(PROVE_CODES.items()):
    rules_meta.append({"id": code, "name": "".join(w.capitalize() for w in text.split(":")[0].split()),
                       "shortDescription": {"text": text}, "fullDescription": {"text": text + " (docs/verify.md)"},
                       "defaultConfiguration": {"level": "error"}, "properties": {"tags": ["rulec", "prove"]}})
  spans = {r.name: r.span for rs in lib.checked.rulesets.values() for r in rs.rules}
  for rs in results:
    for r in rs.rules:
      if r.status != "refuted": continue
      run["results"].append(span_result("P001", base, refutation_message(r.name, r.counterexample or {}), r.span))
    for cycle in (rs.termination.cycles if rs.termination else ()):
      msg = f"rule set '{rs.name}' may not terminate: {_loop_text(cycle)}"
      run["results"].append(span_result("P002", base + 1, msg, spans[cycle[0]]))
  return log
