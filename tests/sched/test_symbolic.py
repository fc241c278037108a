"""rules/symbolic.rules is sound: a simplified index expression has the value of
the original at every point of its ranges (checked exhaustively on small ranges)."""
import itertools
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from rulec.engine.ir.dtypes import dtypes
from rulec.engine.ir.index_expr import build, evaluate, leaf_values, leaves_of, random_recipe
from rulec.engine.lang.loader import load_library
from rulec.engine.ir.rewrite import graph_rewrite
from rulec.engine.ir.uop import UOp

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


# *** the classes of rules added for parity with tinygrad's symbolic set: each on concrete graphs, values checked ***

from rulec.engine.ir.ops import Ops  # noqa: E402
from rulec.engine.verify.evaluate import eval_scalar, free_leaves, points, scalars_equal  # noqa: E402

i32 = UOp.variable("i", -8, 8, dtypes.int32)
i8 = UOp.variable("j", -5, 5, dtypes.int8)
b = UOp.variable("b", 0, 1, dtypes.bool)
b2 = UOp.variable("b2", 0, 1, dtypes.bool)
f32 = UOp.variable("f", 0, 1, dtypes.float32)
x = UOp.variable("x", 0, 100)
r0, r1 = UOp.range(4, 0), UOp.range(4, 1)
T, F = UOp.const(dtypes.bool, True), UOp.const(dtypes.bool, False)


def _values(u: UOp, leaves):
  return [eval_scalar(u, env) for env in points(leaves)]


def simplifies(expr: UOp, expected: UOp | None = None) -> UOp:
  """expr rewritten by `symbolic`: the expected graph (when given), and the same value as expr at every point."""
  out = graph_rewrite(expr, symbolic())
  if expected is not None: assert out is expected, f"{expr} => {out}, expected {expected}"
  assert out.dtype is expr.dtype
  leaves = free_leaves(expr)
  assert set(free_leaves(out)) <= set(leaves)
  for env, want, got in zip(points(leaves), _values(expr, leaves), _values(out, leaves)):
    assert scalars_equal(want, got), f"{expr} => {out} at {env}: {want} != {got}"
  return out


def test_bitwise_and_boolean_identities():
  simplifies(i32 ^ 0, i32)
  simplifies(i32 & 0, UOp.const(dtypes.int32, 0))
  simplifies(i32 & -1, i32)
  simplifies(i32 | -1, UOp.const(dtypes.int32, -1))
  simplifies((i32 & i32) | i32, i32)
  simplifies((i32 ^ i8.cast(dtypes.int32)) ^ i8.cast(dtypes.int32), i32)
  simplifies((i32 & 12) & 10, i32 & 8)
  simplifies(i32 & (i32 | 5), i32)
  simplifies(b & True, b)
  simplifies(b | False, b)
  simplifies(b | True, T)
  simplifies(b.ne(True), b ^ True)
  simplifies(b.ne(True).ne(True), b)
  simplifies(b.eq(False), b ^ True)
  simplifies(b.ne(False), b)
  simplifies(b & (b ^ True), F)
  simplifies(b | (b ^ True), T)
  simplifies(b.cast(dtypes.int32).ne(1), b ^ True)
  simplifies(b.cast(dtypes.int32).ne(7), T)
  simplifies((i32 & -16) >> 4, i32 >> 4)
  simplifies((i32 & -4) // 4, i32 // 4)
  simplifies((i32 & 5) >> 4)                  # the mask clears bit 2, which the shift keeps: no fold (values still checked)
  assert graph_rewrite((i32 & 6) >> 1, symbolic()) is (i32 & 6) >> 1


def test_self_ops():
  pos = UOp.variable("p", 1, 10)
  simplifies(pos // pos, UOp.const(dtypes.index, 1))
  assert graph_rewrite(x // x, symbolic()) is x // x      # x may be 0, and 0 // 0 is 0
  simplifies(x % x, UOp.const(dtypes.index, 0))
  simplifies(x.lt(x), F)
  simplifies(f32.lt(f32), F)
  simplifies(i32.ne(i32), F)
  simplifies(i32.eq(i32), T)
  assert graph_rewrite(f32.ne(f32), symbolic()) is f32.ne(f32)   # nan != nan
  simplifies(i32 // -1, i32 * -1)
  simplifies(i32 % -1, UOp.const(dtypes.int32, 0))
  simplifies((i32 % i8.cast(dtypes.int32)) % i8.cast(dtypes.int32), i32 % i8.cast(dtypes.int32))
  simplifies(f32 / 1.0, f32)


def test_cast_folding():
  simplifies(UOp.const(dtypes.index, 3).cast(dtypes.float32), UOp.const(dtypes.float32, 3.0))
  simplifies(UOp.const(dtypes.int32, 300).cast(dtypes.uint8), UOp.const(dtypes.uint8, 44))
  simplifies(UOp.const(dtypes.float32, -2.5).cast(dtypes.int32), UOp.const(dtypes.int32, -2))
  big = UOp.const(dtypes.float32, 1e10).cast(dtypes.int32)
  assert graph_rewrite(big, symbolic()) is big           # out of int32's range: C leaves it undefined
  simplifies(i8.cast(dtypes.int32).cast(dtypes.int8), i8)
  simplifies(i8.cast(dtypes.int32).cast(dtypes.float32), i8.cast(dtypes.float32))
  simplifies(f32.cast(dtypes.float64).cast(dtypes.float32), f32)
  lossy = f32.cast(dtypes.float16).cast(dtypes.float32)
  assert graph_rewrite(lossy, symbolic()) is lossy
  simplifies(r0.cast(dtypes.int8).cast(dtypes.int32), r0.cast(dtypes.int32))
  wide = UOp.variable("w", 0, 1000, dtypes.int32)
  assert graph_rewrite(wide.cast(dtypes.int8).cast(dtypes.int32), symbolic()) is wide.cast(dtypes.int8).cast(dtypes.int32)
  simplifies(i32.cast(dtypes.bool), i32.ne(0))
  simplifies(f32.cast(dtypes.bool), f32.ne(0.0))


def test_where_folding():
  y = UOp.variable("y", 0, 10)
  simplifies((b ^ True).where(x, y), b.where(y, x))
  simplifies(b.ne(True).where(x, y), b.where(y, x))
  simplifies(b.where(T, F), b)
  simplifies(b.where(F, T), b ^ True)
  simplifies(b.where(b2.where(x, y), y), (b & b2).where(x, y))
  simplifies(b.where(x, b2.where(x, y)), (b | b2).where(x, y))
  simplifies(b.where(b.where(x, 3), y), b.where(x, y))
  simplifies(b.where(x, b.where(3, y)), b.where(x, y))
  simplifies(x.lt(4).where(4, x), x.maximum(4))
  simplifies(i32.lt(y.cast(dtypes.int32)).where(y.cast(dtypes.int32), i32), i32.maximum(y.cast(dtypes.int32)))
  fmax = f32.lt(1.0).where(UOp.const(dtypes.float32, 1.0), f32)
  assert graph_rewrite(fmax, symbolic()) is fmax        # not for floats: nan
  simplifies(b.where(x, 1) + b.where(y, 2), b.where(x + y, 3))
  simplifies((r0 + b.where(x, 1)) + b.where(y, 2), r0 + b.where(x + y, 3))
  simplifies(b.where(x, 0) + b.where(0, y), b.where(x, y))


def test_comparisons():
  r, s = UOp.range(16, 2), UOp.range(4, 3)
  simplifies((r + 3).lt(7), r.lt(4))
  simplifies(UOp.const(dtypes.index, 5).lt(r + 3), UOp.const(dtypes.index, 2).lt(r))
  simplifies((r * 4).lt(10), r.lt(3))
  simplifies(UOp.const(dtypes.index, 5).lt(r * 4), UOp.const(dtypes.index, 1).lt(r))
  simplifies((x // 4).lt(3), x.lt(12))
  simplifies(UOp.const(dtypes.index, 2).lt(x // 4), UOp.const(dtypes.index, 11).lt(x))
  simplifies((i32 // -2).lt(2))
  simplifies((r * 4 + s).lt(8), r.lt(2))
  simplifies((x + 3).ne(5), x.ne(2))
  simplifies((x + 3).eq(5), x.eq(2))
  simplifies(r.ne(16), T)
  simplifies(r.eq(-1), F)
  simplifies(r0.lt(r1 + 4), T)
  simplifies((i32 * -1).lt(i8.cast(dtypes.int32) * -1), i8.cast(dtypes.int32).lt(i32))
  # int8 wraps: x + 100 < 50 is not x < -50 (x = 100 gives -56 < 50)
  k = UOp.variable("k", 0, 120, dtypes.int8)
  simplifies((k + 100).lt(50))
  assert graph_rewrite((k + 100).lt(50), symbolic()).src[0].op is Ops.ADD


def test_div_mod_of_sums_and_negatives():
  simplifies((x + 8) // 4, x // 4 + 2)
  simplifies((x + 9) // 4, (x + 1) // 4 + 2)
  simplifies((x + -3) // 4, (x + 1) // 4 + -1)
  simplifies((x * 2) // 8, x // 4)
  simplifies((x * 2) % 8, (x % 4) * 2)
  simplifies(i32 // -4, (i32 * -1) // 4)
  simplifies(i32 % -4, ((i32 * -1) % 4) * -1)
  lo = UOp.variable("lo", -128, 0, dtypes.int8)
  assert graph_rewrite(lo // -4, symbolic()) is lo // -4      # -(-128) wraps around in int8
  simplifies((x + r0) * -1, x * -1 + r0 * -1)
  simplifies(-i32, i32 * -1)
  simplifies(i32 - 5, i32 + -5)


def test_like_terms_over_three():
  simplifies((r0 + r1 * 2) + r1 * 3, r0 + r1 * 5)
  simplifies((r0 + r1) + r1, r0 + r1 * 2)
  simplifies((r0 + r1) + r1 * 3, r0 + r1 * 4)
  simplifies((r0 + r1 * 3) + r1, r0 + r1 * 4)
  simplifies((r0 * 3) * r1, (r0 * r1) * 3)
  simplifies((i32 + i8.cast(dtypes.int32)) - i8.cast(dtypes.int32), i32)
  # floats: reassociating would round differently
  g = UOp.variable("g", 0, 1, dtypes.float32)
  assert graph_rewrite((f32 + g) + g, symbolic()) is (f32 + g) + g


def test_nested_where_keeps_a_load_under_its_gate():
  # WHERE(valid, WHERE(load != 0, ..), ..): the load may be out of bounds where valid is false, so its
  # condition must not be evaluated there (as (valid & (load != 0)) would)
  y = UOp.variable("y", 0, 10)
  load = UOp.new_buffer("NUMPY", 4, dtypes.int32).index(r0).load()
  valid = r0.lt(UOp.variable("n", 0, 4))
  gated = valid.where(load.ne(0).where(x, y), y)
  assert graph_rewrite(gated, symbolic()) is gated
  simplifies(b.where(b2.where(x, y), y), (b & b2).where(x, y))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(-3, 3), st.integers(1, 5)), min_size=1, max_size=3), st.integers(-20, 20),
       st.integers(2, 6), st.integers(1, 4), st.booleans())
def test_a_sum_with_a_coefficient_dividing_the_divisor_keeps_its_value(smalls, k, g, m, div):
  # x = g*(terms) + small terms + k, divided by c = g*m: fold_div_parts' common-factor split (grouped-query heads,
  # (h*16384 + p*64 + d) // 49152 = h // 3) where the small terms stay in [0, g), and no rewrite where they do not
  h = UOp.range(7, 0)
  small = [UOp.range(n, i + 1) * coef for i, (coef, n) in enumerate(smalls)]
  x = h * g + k
  for t in small: x = x + t
  c = g * m
  e = (x // c) if div else (x % c)
  simple = graph_rewrite(e, symbolic())
  leaves = leaves_of(e)
  for values in itertools.product(*(leaf_values(leaf) for leaf in leaves)):
    env = dict(zip(leaves, values))
    assert evaluate(simple, env) == evaluate(e, env), f"{e} => {simple} at {env}"


def test_grouped_query_heads_are_a_division_of_the_head_alone():
  h, p, d = UOp.range(12, 0), UOp.range(256, 1), UOp.range(64, 2)
  x = h * 16384 + p * 64 + d
  assert graph_rewrite(x // 49152, symbolic()) is graph_rewrite(h // 3, symbolic())
  from rulec.engine.ir.ops import Ops
  mods = [u for u in graph_rewrite(x % 49152, symbolic()).toposort() if u.op in (Ops.MOD, Ops.IDIV)]
  assert mods == [h % 3]   # ((h % 3) * 16384 + p * 64 + d, in some order of its terms)
