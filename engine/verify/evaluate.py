"""Values of generated graphs, before and after a rewrite.

Scalar (index-level) expressions are evaluated at every point of their free
leaves (RANGE and DEFINE_VAR) with engine/ir/alu.py's meaning of each op; results
are held in their dtype (integers wrap, float16/float32 round). Tensor-level
graphs are evaluated with engine/tensor_eval.py, extended by a small memory
model for what the scheduler adds on top of it: STAGE (a copy), STORE into a
view of a buffer, and AFTER (the buffer once its stores are done).
"""
from __future__ import annotations

import itertools
import math
import warnings
from typing import Any

import numpy as np

from rulec.engine.ir.alu import PYTHON_ALU, exec_alu, wrap
from rulec.engine.ir.dtypes import DType, np_dtype_named
from rulec.engine.ir.ops import ALU, MOVEMENT, Ops
from rulec.engine.ir.uop import UOp
from rulec.engine.lang import ast as A
from rulec.engine.lang.compiler import per_rule_functions
from rulec.engine.lang.interp import InterpretedMatcher
from rulec.engine.verify.generate import FLOAT_VALUES


class NotModelled(Exception):
  """The graph has an op (or a form of one) the evaluator does not know the meaning of."""


class NoValue(Exception):
  """The graph has no value (a malformed graph, an out-of-bounds read, ...)."""


# *** scalars ***

SCALAR_EVAL_OPS = (ALU - {Ops.THREEFRY}) | {Ops.CAST, Ops.CONST, Ops.RANGE, Ops.DEFINE_VAR}


def free_leaves(u: UOp) -> list[UOp]:
  return [x for x in u.toposort() if x.op in (Ops.RANGE, Ops.DEFINE_VAR)]


def leaf_values(leaf: UOp) -> list:
  if leaf.op is Ops.RANGE: return list(range(leaf.src[0].arg))
  if leaf.dtype.kind == "f": return list(FLOAT_VALUES)
  if leaf.dtype.kind == "b": return [False, True]
  return list(range(leaf.arg[1], leaf.arg[2] + 1))


def points(leaves: list[UOp]):
  for vals in itertools.product(*(leaf_values(x) for x in leaves)): yield dict(zip(leaves, vals))


def canon(v, dt: DType):
  """v as a value of dtype dt holds it."""
  v = wrap(v, dt)
  if dt.kind == "f" and dt.np_name in ("float16", "bfloat16", "float32"):
    with np.errstate(all="ignore"): v = float(np_dtype_named(dt.np_name).type(v))
  return v


def _alu(op: Ops, dt: DType, xs: list, exact: bool = False):
  if dt.is_int and all(isinstance(x, int) for x in xs):
    if op is Ops.SHL: return xs[0] << min(xs[1], dt.bits + 1) if xs[1] >= 0 else xs[0]
    if op is Ops.POW and xs[1] >= 0: return pow(xs[0], xs[1], 1 << dt.bits)
    if exact: return PYTHON_ALU[op](*xs)
  return exec_alu(op, dt, xs)


def eval_scalar(root: UOp, env: dict[UOp, object], exact: bool = False):
  """root's value with the leaves set from env; exact=True: integers do not wrap (to tell overflow apart)."""
  vals: dict[UOp, object] = {}
  for u in root.toposort():
    if u in env: v = env[u]
    elif u.op is Ops.CONST: v = u.arg if exact and u.dtype.is_int else canon(u.arg, u.dtype)
    elif u.op in (Ops.RANGE, Ops.DEFINE_VAR): raise NoValue(f"{u!r} has no value here")
    elif u.op is Ops.CAST: v = vals[u.src[0]]
    elif u.op in SCALAR_EVAL_OPS:
      try: v = _alu(u.op, u.dtype, [vals[s] for s in u.src], exact)
      except (ArithmeticError, TypeError, ValueError) as e: raise NoValue(f"{u.op.name}: {type(e).__name__}: {e}") from e
    else: raise NotModelled(f"{u.op.name} has no scalar value")
    if u.dtype.kind != "v" and u.op not in (Ops.RANGE, Ops.DEFINE_VAR) and not (exact and u.dtype.is_int): v = canon(v, u.dtype)
    vals[u] = v
  return vals[root]


def scalars_equal(a, b) -> bool:
  if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b): return True
  return type(a) is type(b) and a == b


# *** tensors ***

class TensorEval:
  """Values of tensor-level graphs; one instance keeps one memory (buffer contents) for a before/after pair."""

  def __init__(self):
    self.mem: dict[UOp, np.ndarray] = {}

  def buf(self, b: UOp) -> np.ndarray:
    if b not in self.mem:
      from rulec.runtime.buffer import buffer_of
      self.mem[b] = buffer_of(b).numpy_view().copy()
    return self.mem[b]

  def value(self, root: UOp) -> np.ndarray:
    from rulec.engine import tensor_eval
    vals: dict[UOp, object] = {}
    with np.errstate(all="ignore"), warnings.catch_warnings():
      warnings.simplefilter("ignore")
      for u in root.toposort():
        xs = [vals[s] for s in u.src]
        if u.op is Ops.BUFFER: v = self.buf(u)
        elif u.op is Ops.STAGE: v = np.array(xs[0], copy=True)
        elif u.op is Ops.STORE: v = self._store(u.src[0], xs[1])
        elif u.op is Ops.AFTER:
          if u.src[0].op is not Ops.BUFFER: raise NotModelled("AFTER of something other than a BUFFER")
          v = self.buf(u.src[0]).copy()
        elif u.op is Ops.ASSIGN and any(m.op in (Ops.EXPAND, Ops.PAD) for m in u.src[0].toposort(lambda m: m.op in MOVEMENT)):
          raise NoValue("an ASSIGN into an expanded or padded view (the front end refuses these)")
        elif u.op in _TENSOR_EVAL_OPS:
          if any(x is None for x in xs): raise NotModelled(f"{u.op.name} of a STORE")
          try: v = tensor_eval._eval_node(u, xs)
          except NotImplementedError as e: raise NotModelled(str(e)) from e
          except (ValueError, TypeError, IndexError) as e: raise NoValue(f"{u.op.name}: {e}") from e
        else: raise NotModelled(f"{u.op.name} is not a tensor-level op tensor_eval knows")
        vals[u] = v
    return vals[root]

  def _store(self, target: UOp, value: np.ndarray) -> None:
    """STORE(view of a buffer, value): value written through the view."""
    from rulec.engine.tensor_eval import apply_movement
    chain, x = [], target
    while x.op in MOVEMENT:
      if x.op is Ops.PAD: raise NotModelled("a STORE through a PAD")
      chain.append(x)
      x = x.src[0]
    if x.op is not Ops.BUFFER: raise NotModelled(f"a STORE into {x.op.name}")
    idx = np.arange(x.arg[-1])
    for m in reversed(chain): idx = apply_movement(m.op, m.arg, idx)
    self.buf(x)[idx] = np.broadcast_to(value, idx.shape)
    return None


_TENSOR_EVAL_OPS = (ALU - {Ops.THREEFRY}) | MOVEMENT | {Ops.CONST, Ops.CAST, Ops.BITCAST, Ops.REDUCE_AXIS, Ops.CONTIGUOUS,
                                                       Ops.COPY, Ops.DETACH, Ops.CONTIGUOUS_BACKWARD, Ops.FUSE, Ops.NOOP,
                                                       Ops.ASSIGN, Ops.MSTACK, Ops.MSELECT}


def arrays_equal(a: np.ndarray, b: np.ndarray) -> bool:
  if a.shape != b.shape or a.dtype != b.dtype: return False
  if a.dtype.kind == "f": return bool(np.array_equal(a, b, equal_nan=True))
  return bool(np.array_equal(a, b))


def first_difference(a: np.ndarray, b: np.ndarray) -> str:
  if a.shape != b.shape: return f"shape {a.shape} != {b.shape}"
  if a.dtype != b.dtype: return f"dtype {a.dtype} != {b.dtype}"
  diff = ~((a == b) | ((a != a) & (b != b))) if a.dtype.kind == "f" else a != b
  at = tuple(int(i) for i in np.argwhere(diff)[0])
  return f"at {at}: before = {a[at]!r}, after = {b[at]!r}"


def compiled_rule(rule: A.Rule, helpers_of) -> tuple[Any, InterpretedMatcher]:
  """The rule alone as a compiled matcher function fn(node, ctx), and the reference interpreter of it."""
  ns: dict[str, Any] = {"__name__": f"rulec_verify_{rule.name}"}
  exec(compile(per_rule_functions([rule], helpers_of), f"<rulec verify {rule.name}>", "exec"), ns)
  return ns["RULE_FNS"][0], InterpretedMatcher([rule], helpers_of)
