"""`rulec verify` for gradient rules: each rule's gradients against central finite differences, in float64.

For a rule of a `gradients` set, hypothesis draws a node the pattern matches: the op, a small shape, the op's
argument (axes, padding, permutation, ...) and its sources as float64 buffers holding drawn values, plus an
incoming gradient g. The rule gives one gradient per source. The reference is the directional derivative of
L = sum(g * node(sources)) (the node's value as float64), taken element by element with central differences;
points where the function has a kink (the one-sided differences disagree: ties of max, trunc at an integer) are
skipped, since any subgradient is right there. A disagreement is shrunk to a small counterexample.

Two kinds of rule are checked without differences:
- an op whose value is not a float, or whose sources are not floats (comparisons, bitwise ops, bitcasts to
  integers): the driver never sends a gradient through it, so the rule must give None for every float source;
- DETACH, whose gradient is zero by definition (its value is the identity).
"""
from __future__ import annotations

import collections

import numpy as np
from hypothesis import HealthCheck, Phase, given, reject, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable

from rulec.engine.ir.dtypes import DType, dtypes
from rulec.engine.lang import ast as A
from rulec.engine.lang.compiler import pattern_ops
from rulec.engine.lang.runtime import RuleAbort, RuleRuntimeError
from rulec.engine.ir.ops import BINARY, MOVEMENT, UNARY, Ops
from rulec.engine.ir.uop import UOp, prod, render
from rulec.engine.verify.evaluate import NotModelled, NoValue, TensorEval, compiled_rule
from rulec.engine.verify.generate import Gen, Reject
from rulec.runtime.buffer import new_buffer

INT_OPS = frozenset({Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR, Ops.CDIV, Ops.CMOD, Ops.THREEFRY})
REDUCE_OPS = (Ops.ADD, Ops.MUL, Ops.MAX)
EPS = 1e-6


class GradRefuted(Exception):
  def __init__(self, info: dict): super().__init__(info.get("why", "refuted")); self.info = info


class _Leaves:
  """The float64 (or other) buffers of one drawn example, with their values."""
  def __init__(self, data):
    self.data, self.values = data, {}

  def new(self, dt: DType, shape: tuple[int, ...], device: str = "NUMPY") -> UOp:
    b = new_buffer(device, prod(shape), dt)
    n = prod(shape)
    if dt is dtypes.bool: vals = self.data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    elif dt.is_int or dt.is_unsigned:
      vals = self.data.draw(st.lists(st.integers(0 if dt.is_unsigned else -8, 8), min_size=n, max_size=n))
    elif dt is dtypes.float32:   # eighths: exact in float32, and so is a step of 2^-8 away from them
      vals = [v / 8 for v in self.data.draw(st.lists(st.integers(-24, 24), min_size=n, max_size=n))]
    else:
      mag = st.floats(0.25, 3.0, allow_nan=False, allow_infinity=False)
      vals = [m if pos else -m for m, pos in self.data.draw(st.lists(st.tuples(mag, st.booleans()), min_size=n, max_size=n))]
    self.values[b] = np.asarray(vals, dtype=_np(dt)).reshape(n)
    return b.reshape(shape)


def _np(dt: DType):
  from rulec.runtime.buffer import np_dtype
  return np_dtype(dt)


class _Draw:
  """A node for the rule's pattern: its op, shape, argument and leaf sources."""
  def __init__(self, data, rule: A.Rule):
    self.data, self.rule, self.leaves = data, rule, _Leaves(data)
    self.gen = Gen(data.draw, "tensor")

  def shape(self) -> tuple[int, ...]:
    return tuple(self.data.draw(st.lists(st.integers(1, 3), min_size=0, max_size=3)))

  def node(self) -> UOp:
    p = self.rule.pattern
    ops = sorted(pattern_ops(p), key=int)
    op = self.data.draw(st.sampled_from(ops))
    shape = self.shape()
    f64, lv = dtypes.float64, self.leaves
    if op in INT_OPS:
      dt = dtypes.uint64 if op is Ops.THREEFRY else dtypes.int32
      return UOp(op, dt, (lv.new(dt, shape), lv.new(dt, shape)))
    if op in UNARY or op in (Ops.CONTIGUOUS, Ops.FUSE, Ops.CONTIGUOUS_BACKWARD, Ops.DETACH):
      return UOp(op, f64, (lv.new(f64, shape),))
    if op in BINARY:
      out = dtypes.bool if op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ) else f64
      return UOp(op, out, (lv.new(f64, shape), lv.new(f64, shape)))
    if op is Ops.WHERE: return UOp(op, f64, (lv.new(dtypes.bool, shape), lv.new(f64, shape), lv.new(f64, shape)))
    if op is Ops.MULACC: return UOp(op, f64, tuple(lv.new(f64, shape) for _ in range(3)))
    if op is Ops.CAST:
      src = self.data.draw(st.sampled_from((dtypes.float32, dtypes.int32)))
      return UOp(op, f64, (lv.new(src, shape),))
    if op is Ops.BITCAST: return UOp(op, dtypes.int64, (lv.new(f64, shape),))
    if op is Ops.REDUCE_AXIS:
      if not shape: shape = (2,)
      axes = tuple(i for i in range(len(shape)) if self.data.draw(st.booleans())) or (0,)
      rop = self.data.draw(st.sampled_from(REDUCE_OPS))
      return lv.new(f64, shape).r(rop, axes)
    if op in MOVEMENT:
      if not shape: shape = (2,)
      try: arg, ((_, src),) = self.gen._movement(op, None, A.PNode(None, ()), shape)
      except Reject: reject()
      return UOp(op, f64, (lv.new(f64, src),), arg)
    if op is Ops.COPY: return UOp(op, f64, (lv.new(f64, shape),), "NUMPY")
    if op is Ops.ASSIGN: return UOp(op, f64, (lv.new(f64, shape), lv.new(f64, shape)))
    if op in (Ops.MSTACK, Ops.MSELECT):
      stacked = self.stack(shape)
      if op is Ops.MSTACK: return stacked
      axis, devices = stacked.arg
      return UOp(op, f64, (stacked,), (self.data.draw(st.integers(0, len(devices) - 1)), axis, len(devices)))
    raise NotModelled(f"no generator for {op.name} nodes")


  def stack(self, shape: tuple[int, ...]) -> UOp:
    """A value spread over 2 or 3 devices: each part of `shape`, joined along an axis or replicated (None)."""
    n = self.data.draw(st.integers(2, 3))
    axis = self.data.draw(st.sampled_from((None,) + tuple(range(len(shape)))))
    devices = tuple(f"NUMPY:{k}" for k in range(n))
    return UOp(Ops.MSTACK, dtypes.float64, tuple(self.leaves.new(dtypes.float64, shape, d) for d in devices),
               (axis, devices))


def _value(u: UOp, values: dict) -> np.ndarray:
  ev = TensorEval()
  ev.mem.update({b: v.copy() for b, v in values.items()})
  return np.asarray(ev.value(u))


def _objective(node: UOp, g: np.ndarray, values: dict) -> float:
  with np.errstate(all="ignore"):
    return float(np.sum(g * _value(node, values).astype(np.float64)))


class GradChecker:
  def __init__(self, rule: A.Rule, helpers_of, examples: int):
    self.rule, self.examples = rule, examples
    self.fn, self.interp = compiled_rule(rule, helpers_of)
    self.compared, self.tries = 0, 0
    self.why_not: collections.Counter = collections.Counter()

  def _apply(self, node: UOp, g: UOp):
    try: out = self.fn(node, g)
    except RuleAbort: return None
    except RuleRuntimeError as e:
      raise GradRefuted({"why": f"the rule raised {type(e.cause).__name__}: {e.cause}", "before": render(node, depth=6)})
    try: other = self.interp.rewrite(node, g)
    except (RuleAbort, RuleRuntimeError): other = None
    if (out is None) != (other is None):
      raise GradRefuted({"why": "the compiled matcher and the reference interpreter disagree on whether the rule fires",
                         "before": render(node, depth=6)})
    return out

  def check_once(self, data) -> None:
    self.tries += 1
    d = _Draw(data, self.rule)
    node = d.node()
    g = d.leaves.new(node.dtype if node.dtype.is_float else dtypes.float64, node.shape)
    values = d.leaves.values
    self.g_leaf = g.base
    grads = self._apply(node, g if node.dtype.is_float else g.cast(node.dtype))
    if grads is None: self.why_not["pattern/guard not satisfied"] += 1; reject()
    floats = [i for i, s in enumerate(node.src) if s.dtype.is_float]
    if not node.dtype.is_float or not floats or node.op is Ops.DETACH:
      # no gradient may flow: the driver never asks (not a float), or by definition (DETACH)
      for i in floats:
        if grads[i] is not None:
          self._fail(node, values, f"gives a gradient for source {i}, but no gradient flows through "
                     f"{node.op.name}{' (its value is not a float)' if not node.dtype.is_float else ''}")
      self.compared += 1
      return
    try: gv = _value(g, values)
    except (NoValue, NotModelled) as e: self.why_not[f"not modelled: {e}"] += 1; reject()
    try: base = _objective(node, gv, values)
    except NoValue: self.why_not["no value"] += 1; reject()
    if not np.isfinite(base): self.why_not["value not finite"] += 1; reject()
    checked = False
    for i in floats:
      # the source's value stands in a buffer of its own, so a source built of several buffers (a stack of
      # parts on several devices) is perturbed as the one value the op sees
      src = node.src[i]
      try: x = np.asarray(_value(src, values)).reshape(-1).copy()
      except (NoValue, NotModelled) as e: self.why_not[f"not modelled: {e}"] += 1; reject()
      leaf = new_buffer("NUMPY", x.size, src.dtype)
      probe = node.replace(src=node.src[:i] + (leaf.reshape(src.shape),) + node.src[i + 1:])
      if grads[i] is None: want = np.zeros(x.shape)
      else:
        try: want = _value(grads[i], values).astype(np.float64).reshape(-1)
        except (NoValue, NotModelled) as e: self.why_not[f"not modelled: {e}"] += 1; reject()
        if want.size != x.size:
          self._fail(node, values, f"gradient {i} has {want.size} elements, source {i} has {x.size}")
      step = 2.0 ** -8 if x.dtype == np.float32 else EPS
      for j in range(x.size):
        def at(delta):
          v = dict(values)
          y = x.copy(); y[j] = y[j] + delta; v[leaf] = y
          return _objective(probe, gv, v)
        up, down = at(step), at(-step)
        fwd, bwd = (up - base) / step, (base - down) / step
        if not (np.isfinite(fwd) and np.isfinite(bwd)): continue
        central = (up - down) / (2 * step)
        if abs(fwd - bwd) > 1e-3 * (1 + abs(central)): continue   # a kink: any subgradient will do
        checked = True
        if not abs(want[j] - central) <= 1e-4 * (1 + abs(central)):
          self._fail(node, values, f"the gradient of source {i} differs from finite differences",
                     at=f"source {i}, element {j}", got=f"rule = {float(want[j])!r}, finite differences = {float(central)!r}",
                     g=gv)
    if not checked: self.why_not["no smooth point"] += 1; reject()
    self.compared += 1

  def _fail(self, node: UOp, values: dict, why: str, g=None, at: str = "", got: str = ""):
    leaves = sorted(values.items(), key=lambda kv: kv[0].arg[0])
    info = {"why": why, "before": f"{render(node, depth=6)}  # shape {node._shape}",
            "where": [f"{'g (the incoming gradient)' if b is self.g_leaf else f'buffer {b.arg[0]}'} = "
                      f"{np.array2string(v, precision=4)}" for b, v in leaves]}
    if at: info["at"] = at
    if got: info["values"] = got
    raise GradRefuted(info)

  def run(self) -> dict | None:
    @settings(max_examples=self.examples, derandomize=True, database=None, deadline=None, report_multiple_bugs=False,
              suppress_health_check=list(HealthCheck), phases=(Phase.generate, Phase.shrink), print_blob=False)
    @given(st.data())
    def prop(data): self.check_once(data)
    try: prop()
    except GradRefuted as e: return e.info
    except Unsatisfiable: pass
    return None


def verify_gradient_rule(rule: A.Rule, helpers_of, examples: int, result):
  """Fill `result` (a RuleResult) for a gradient rule."""
  chk = GradChecker(rule, helpers_of, examples)
  try: info = chk.run()
  except NotModelled as e:
    result.reason = f"the evaluator cannot evaluate: {e}"
    return result
  result.examples = chk.compared
  if info is not None:
    result.status, result.counterexample = "refuted", info
  elif chk.compared: result.status = "verified"
  else:
    top = ", ".join(f"{k} x{n}" for k, n in chk.why_not.most_common(2))
    result.reason = f"generator could not satisfy the pattern/guard in {chk.tries} tries ({top})"
  return result
