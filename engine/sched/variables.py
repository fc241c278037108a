"""Bound Variables in a graph to be scheduled: taken out before scheduling, given back to what comes out.

A SHRINK or PAD may hold an offset that is an expression of bound Variables (`cache[:, p:p+1]` with p =
`Variable("p", 0, 1023).bind(n)`: engine/tensor/args.py's `symbolic_bounds`). The schedule must not depend on n,
so that one schedule (engine/sched/cache.py) and one set of compiled kernels serve every value: before
scheduling, each BIND in a movement arg becomes its Variable (a DEFINE_VAR, which the rules carry into the
kernels' index arithmetic and the kernels take as an argument), and the values are collected here, to be passed
when the kernels run. The views the schedule hands back get their BINDs again: they are the caller's values.
"""
from __future__ import annotations

from typing import Any, Sequence

from rulec.engine.ir.ops import MOVEMENT, Ops
from rulec.engine.ir.uop import UOp

__all__ = ["has_symbolic_args", "unbind_graph", "unbound_expr", "rebind"]


def _symbolic_arg(u: UOp) -> bool:
  return u.op in MOVEMENT and type(u.arg) is tuple and any(
    isinstance(p, tuple) and any(isinstance(x, UOp) for x in p) for p in u.arg)


def has_symbolic_args(targets: Sequence[UOp]) -> bool:
  """Whether the graphs of `targets` hold a movement op with an expression in its arg (memoised per node, so a
  graph asked again costs only its new nodes)."""
  return any(t._derive("symbolic_args", _holds_symbolic_arg) for t in targets)


def _holds_symbolic_arg(u: UOp) -> bool:
  return u.op is Ops.BIND or _symbolic_arg(u) or any(s._get_memo()["symbolic_args"] for s in u.src)


def _map_arg(arg: tuple, f) -> tuple:
  return tuple(tuple(f(x) if isinstance(x, UOp) else x for x in p) if isinstance(p, tuple) else p for p in arg)


def unbound_expr(x: UOp, var_vals: dict[UOp, int] | None = None) -> UOp:
  """An expression with each BIND replaced by its Variable, the values added to var_vals. (Not UOp.unbind_all:
  that reports the values as read, and TinyJit takes a value read for one its kernels were built for.)"""
  if x.op is Ops.BIND:
    v, n = x.src[0], x.src[1].arg
    if var_vals is not None and var_vals.setdefault(v, n) != n:
      raise ValueError(f"Variable {v.arg[0]} is bound to both {var_vals[v]} and {n} in one realize")
    return v
  return x.replace(src=tuple(unbound_expr(s, var_vals) for s in x.src)) if x.src else x


def unbind_graph(targets: Sequence[UOp]) -> tuple[list[UOp], dict[UOp, int], dict[UOp, UOp]]:
  """The targets with every bound Variable in a movement arg replaced by its Variable; {Variable: value}; and
  {new node: the caller's node} for the nodes that changed. ValueError (tinygrad's) when one Variable is bound
  to two values in one graph."""
  var_vals: dict[UOp, int] = {}
  new: dict[UOp, UOp] = {}
  back: dict[UOp, UOp] = {}
  def unbound(x: UOp) -> UOp: return unbound_expr(x, var_vals)
  for u in UOp.sink(*targets).toposort():
    if u.op is Ops.BIND:   # (a bound value used as a value: `x * start_pos`)
      new[u] = unbound(u)
      back[new[u]] = u
      continue
    src = tuple(new.get(s, s) for s in u.src)
    arg = _map_arg(u.arg, unbound) if _symbolic_arg(u) else u.arg
    if src != u.src or arg is not u.arg:
      x = u.replace(src=src, arg=arg)
      if x is not u:
        new[u] = x
        back[x] = u
  return [new.get(t, t) for t in targets], var_vals, back


def rebind(view: UOp, var_vals: dict[UOp, int]) -> UOp:
  """A view handed back by the schedule with each Variable in its movement args bound to its value again."""
  if not var_vals: return view
  binds = {v: v.bind(n) for v, n in var_vals.items()}
  new: dict[UOp, UOp] = {}
  def bound(x: UOp) -> UOp:
    if x.op is Ops.DEFINE_VAR: return binds.get(x, x)
    return x.replace(src=tuple(bound(s) for s in x.src)) if x.src else x
  for u in view.toposort():
    src = tuple(new.get(s, s) for s in u.src)
    arg: Any = _map_arg(u.arg, bound) if _symbolic_arg(u) else u.arg
    new[u] = u.replace(src=src, arg=arg) if (src != u.src or arg is not u.arg) else u
  return new[view]

