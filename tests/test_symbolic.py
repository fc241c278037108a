"""rules/symbolic.rules is sound: a simplified index expression has the value of
the original at every point of its ranges (checked exhaustively on small ranges)."""
import itertools
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.dtypes import dtypes
from engine.index_expr import build, evaluate, leaf_values, leaves_of, random_recipe
from engine.lang.loader import load_library
from engine.rewrite import graph_rewrite
from engine.uop import UOp

SMALL_LEAVES = [("range", 0, 6), ("range", 1, 4), ("var", "n", -3, 5)]


def symbolic():
  return load_library().matcher("symbolic")


@settings(max_examples=300)
@given(st.integers(0, 2**32 - 1), st.integers(1, 6))
def test_simplified_expressions_keep_their_value(seed, depth):
  expr = build(random_recipe(random.Random(seed), depth, SMALL_LEAVES))
  simple = graph_rewrite(expr, symbolic())
  leaves = leaves_of(expr)
  assert set(leaves_of(simple)) <= set(leaves)
  for values in itertools.product(*(leaf_values(leaf) for leaf in leaves)):
    env = dict(zip(leaves, values))
    assert evaluate(simple, env) == evaluate(expr, env), f"{expr} => {simple} at {env}"


def test_known_simplifications():
  m = symbolic()
  x, r = UOp.variable("x", 0, 100), UOp.range(16, 0)
  c = lambda v: UOp.const(dtypes.index, v)  # noqa: E731
  assert graph_rewrite((x // 4) * 4 + x % 4, m) is x
  assert graph_rewrite((r * 4 + 3) // 4, m) is r
  assert graph_rewrite((r * 4 + 3) % 4, m) is c(3)
  assert graph_rewrite((x + 3) + 5, m) is x + 8
  assert graph_rewrite(r // 16, m) is c(0)
  assert graph_rewrite(r.lt(16), m) is UOp.const(dtypes.bool, True)
  assert graph_rewrite((x * 0) + r * 1, m) is r
  assert graph_rewrite(c(7) + x, m) is x + 7
  # value bounds: x in [0, 100] is not below 16, so the mod stays
  assert graph_rewrite(x % 16, m) is x % 16


def test_fixed_point_is_stable():
  m = symbolic()
  rng = random.Random(5)
  sink = UOp.sink(*[build(random_recipe(rng)) for _ in range(300)])
  once = graph_rewrite(sink, m)
  assert graph_rewrite(once, m) is once
