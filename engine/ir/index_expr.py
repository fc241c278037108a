"""Index expressions as data: random recipes, building them as UOps, and
evaluating a UOp expression at concrete values. Used by `rulec demo`, the
benchmarks (which build the same recipes in other IRs) and the tests."""
from __future__ import annotations

import random
from typing import Any

from rulec.engine.ir.alu import exec_alu
from rulec.engine.ir.dtypes import dtypes
from rulec.engine.ir.ops import Ops
from rulec.engine.ir.uop import UOp

# a recipe is ("var", name, lo, hi) | ("range", axis, size) | ("const", v) | (op_name, recipe, recipe)
Recipe = tuple

_BIN = ("ADD", "ADD", "MUL", "IDIV", "MOD", "ADD", "MUL")


def random_recipe(rng: random.Random, depth: int = 5, leaves: list[Recipe] | None = None) -> Recipe:
  """A random index expression shaped like real ones: reshapes (x//a)%b*c, sums of strides, foldable identities."""
  leaves = leaves or [("range", 0, 16), ("range", 1, 8), ("var", "n", 1, 64)]
  if depth == 0 or rng.random() < 0.2:
    return rng.choice(leaves) if rng.random() < 0.75 else ("const", rng.choice([0, 1, 2, 3, 4, 8, 16]))
  kind = rng.random()
  if kind < 0.15:   # a reshape-style split: (x // a) % b * s + (x % a)
    x, a, b = random_recipe(rng, depth - 1, leaves), rng.choice([2, 4, 8]), rng.choice([2, 4, 16])
    return ("ADD", ("MUL", ("MOD", ("IDIV", x, ("const", a)), ("const", b)), ("const", a)), ("MOD", x, ("const", a)))
  if kind < 0.25:   # identities the rules remove
    x = random_recipe(rng, depth - 1, leaves)
    return rng.choice([("ADD", x, ("const", 0)), ("MUL", x, ("const", 1)), ("IDIV", x, ("const", 1)),
                       ("ADD", ("ADD", x, ("const", rng.randint(1, 9))), ("const", rng.randint(1, 9)))])
  op = rng.choice(_BIN)
  left = random_recipe(rng, depth - 1, leaves)
  right = ("const", rng.choice([1, 2, 3, 4, 8, 16])) if op in ("IDIV", "MOD") or rng.random() < 0.5 \
    else random_recipe(rng, depth - 1, leaves)
  return (op, left, right)


def build(recipe: Recipe, memo: dict | None = None) -> UOp:
  """The recipe as a rulec UOp of dtype index."""
  kind = recipe[0]
  if kind == "var": return UOp.variable(recipe[1], recipe[2], recipe[3])
  if kind == "range": return UOp.range(recipe[2], recipe[1])
  if kind == "const": return UOp.const(dtypes.index, recipe[1])
  a, b = build(recipe[1]), build(recipe[2])
  return UOp(Ops[kind], dtypes.index, (a, b))


def leaves_of(u: UOp) -> list[UOp]:
  return [x for x in u.toposort() if x.op in (Ops.RANGE, Ops.DEFINE_VAR)]


def evaluate(u: UOp, env: dict[UOp, Any]) -> Any:
  """The value of expression u with RANGE/DEFINE_VAR nodes set from env."""
  vals: dict[UOp, Any] = {}
  for x in u.toposort():
    if x in env: vals[x] = env[x]
    elif x.op is Ops.CONST: vals[x] = x.arg
    elif x.op in (Ops.RANGE, Ops.DEFINE_VAR): raise KeyError(f"no value for {x}")
    else: vals[x] = exec_alu(x.op, x.dtype, [vals[s] for s in x.src])
  return vals[u]


def leaf_values(leaf: UOp) -> range:
  if leaf.op is Ops.RANGE: return range(0, leaf.src[0].arg)
  return range(leaf.arg[1], leaf.arg[2] + 1)
