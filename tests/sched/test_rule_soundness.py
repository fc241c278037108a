"""Regressions for rules that `rulec verify` refuted: each program below was miscompiled (the simplified kernel
gave another value than numpy) until the rule or the bounds it relies on took integer wrap-around into account."""
from __future__ import annotations

import math

import numpy as np
import pytest

from rulec.engine.ir.alu import exec_alu
from rulec.engine.ir.dtypes import dtypes
from rulec.engine.ir.ops import Ops
from rulec.engine.ir.uop import UOp
from rulec import Tensor

DEVICES = ("NUMPY", "CPU")

A32 = np.array([-2 ** 31, -7, 5, 2 ** 30, 2 ** 31 - 1], dtype=np.int32)


def _np(f):
  with np.errstate(all="ignore"): return f()


@pytest.mark.parametrize("device", DEVICES)
def test_int8_mul_then_div_wraps(device):
  # mul_div / fold_div_parts turned (x * 2) // 2 into x: 100 * 2 wraps to -56 in int8, and -56 // 2 is -28
  xv = np.array([100, -100, 3, 127, -128], dtype=np.int8)
  x = Tensor(xv, device=device)
  np.testing.assert_array_equal(((x * 2) // 2).numpy(), _np(lambda: (xv * np.int8(2)) // np.int8(2)))
  np.testing.assert_array_equal(((x * 6) % 3).numpy(), _np(lambda: (xv * np.int8(6)) % np.int8(3)))
  np.testing.assert_array_equal(((x + 100) % 7).numpy(), _np(lambda: (xv + np.int8(100)) % np.int8(7)))


@pytest.mark.parametrize("device", DEVICES)
def test_int32_bounds_after_wrap(device):
  # b's bounds were [2**31, 2**32 - 2] (no wrap-around): max_bounds took MAX(b, a) for b and lt_bounds folded b < 0
  # to False, but b = 2**30 * 2 wraps to -2**31
  a = Tensor(A32, device=device)
  b = a.maximum(2 ** 30) * 2
  bn = _np(lambda: np.maximum(A32, np.int32(2 ** 30)) * np.int32(2))
  np.testing.assert_array_equal(b.maximum(a).numpy(), np.maximum(bn, A32))
  np.testing.assert_array_equal((b < 0).numpy(), bn < 0)
  # a + 1 wraps for a = 2**31 - 1; its bounds said it was at least -2**31 + 1
  np.testing.assert_array_equal(((a + 1) < -2 ** 31 + 1).numpy(), _np(lambda: (A32 + np.int32(1)) < -2 ** 31 + 1))


@pytest.mark.parametrize("device", DEVICES)
def test_int32_division_of_wrapped_value(device):
  # idiv_nonneg / mod_nonneg (decomp.rules, CPU) used the truncating CDIV / CMOD for a "non-negative" value that wraps
  a = Tensor(A32, device=device)
  b = a.maximum(2 ** 30) * 2
  bn = _np(lambda: np.maximum(A32, np.int32(2 ** 30)) * np.int32(2))
  np.testing.assert_array_equal((b // 3).numpy(), bn // np.int32(3))
  np.testing.assert_array_equal((b % 3).numpy(), bn % np.int32(3))


@pytest.mark.parametrize("device", DEVICES)
def test_size_zero_broadcast(device):
  # the front end broadcasts itself, so this never reached expand_broadcast's failure (see the helper test below)
  x = Tensor.zeros(1, 0, dtype=dtypes.int32, device=device)
  assert (x + Tensor([[3]], dtype=dtypes.int32, device=device)).numpy().shape == (1, 0)


def test_index_arithmetic_still_simplifies():
  # the no-wrap guards hold for index expressions: kernel indexing keeps its simplifications
  from rulec.engine.lang.loader import load_library
  from rulec.engine.ir.rewrite import graph_rewrite
  m = load_library().matcher("symbolic")
  r, s = UOp.range(16, 0), UOp.range(8, 1)
  assert graph_rewrite((r * 6) // 3, m) is r * 2
  assert graph_rewrite(((r * 8 + s) // 8) * 8 + (r * 8 + s) % 8, m) is r * 8 + s
  assert graph_rewrite((r * 8 + s) % 8, m) is s
  big = UOp.variable("n", 0, 2 ** 62)   # n * 4 may exceed int64: no longer simplified
  assert graph_rewrite((big * 4) // 4, m) is not big


def test_broadcast_helper_size_zero():
  # expand_broadcast raised "cannot broadcast shapes": 1 and 0 broadcast to 0, not to max(1, 0)
  from rulec.engine.sched.early import broadcast_sources
  z = UOp.const(dtypes.int32, 0)
  x = UOp(Ops.ADD, dtypes.int32, (z.reshape((1, 1, 1)).expand((1, 1, 0)), z))
  assert [s.shape for s in broadcast_sources(x).src] == [(1, 1, 0), (1, 1, 0)]


def test_cmod_of_infinity_is_nan():
  # C's fmod and LLVM's frem give NaN; math.fmod raises
  assert math.isnan(exec_alu(Ops.CMOD, dtypes.float32, [math.inf, 2.0]))
  assert math.isnan(exec_alu(Ops.CMOD, dtypes.float32, [-math.inf, 2.0]))
  assert exec_alu(Ops.CMOD, dtypes.float32, [-7.5, math.inf]) == -7.5


# *** where_given: the true branch simplified under its guard is the same function wherever the guard holds ***

def _guarded_cases():
  from hypothesis import strategies as st
  @st.composite
  def case(draw):
    x, y = UOp.variable("x", 0, draw(st.integers(5, 60))), UOp.variable("y", 0, draw(st.integers(0, 9)))
    m = draw(st.integers(2, 13))
    k = draw(st.integers(1, m - 1))
    guarded = x * draw(st.integers(1, 12)) + y + draw(st.integers(0, 5))
    g = guarded % m
    a, b = draw(st.integers(1, 12)), draw(st.integers(1, 40))
    body = [g % k, (g * a + y) // b, (g * a + y) % b, ((g % k) * a + g) // (k * a), g // k + y][draw(st.integers(0, 4))]
    return x, y, g.lt(k), body
  return case()


def test_where_given_is_sound():
  from hypothesis import given, settings
  from rulec.engine.ir.index_expr import evaluate
  from rulec.engine.lang.loader import load_library
  from rulec.engine.ir.rewrite import graph_rewrite
  sym = load_library().matcher("symbolic")

  @settings(max_examples=150, derandomize=True, deadline=None, database=None)
  @given(_guarded_cases())
  def check(c):
    x, y, cond, body = c
    w = cond.where(body, -1)
    out = graph_rewrite(w, sym)
    for xv in range(x.arg[1], x.arg[2] + 1):
      for yv in range(y.arg[1], y.arg[2] + 1):
        env = {x: xv, y: yv}
        assert evaluate(out, env) == evaluate(w, env), (w, out, xv, yv)
  check()


def test_where_given_folds_a_guarded_mod():
  from rulec.engine.lang.loader import load_library
  from rulec.engine.ir.rewrite import graph_rewrite
  x = UOp.variable("x", 0, 100)
  g = x % 11
  out = graph_rewrite(g.lt(8).where((g % 8) * 3 + g // 8, 0), load_library().matcher("symbolic"))
  assert out is g.lt(8).where(g * 3, 0), out


def test_conv_input_gradient_reads_through_affine_indices():
  """A convolution's input gradient reaches its window taps through // and % of the padded, repeated view;
  under the kernel's guards they are affine (where_affine), so no load index keeps a // or a %."""
  from rulec import Tensor
  x = Tensor(np.random.default_rng(0).random((2, 3, 6, 6)).astype(np.float32), requires_grad=True)
  w = Tensor(np.random.default_rng(1).random((4, 3, 3, 3)).astype(np.float32), requires_grad=True)
  x.conv2d(w, padding=1).relu().sum().backward()
  kernels = Tensor.schedule(x.grad)
  loads = [n for k in kernels for n in k.ast.toposort() if n.op is Ops.INDEX and n.src[0].op is Ops.PARAM]
  assert loads
  for n in loads:
    assert not any(m.op in (Ops.IDIV, Ops.MOD) for m in n.src[1].toposort()), n.src[1]


def test_where_given_is_sound_in_both_branches_and_for_ranges():
  # the false branch of a single comparison knows its negation; a negated conjunct bounds from below; a guard on a
  # plain range bounds it where a // or % of the branch reads it (a concatenation's parts)
  from hypothesis import given, settings, strategies as st
  from rulec.engine.ir.index_expr import evaluate
  from rulec.engine.lang.loader import load_library
  from rulec.engine.ir.rewrite import graph_rewrite
  sym = load_library().matcher("symbolic")

  @settings(max_examples=200, derandomize=True, deadline=None, database=None)
  @given(st.integers(4, 40), st.integers(1, 39), st.integers(1, 39), st.integers(2, 9), st.integers(1, 12),
         st.integers(-20, 20), st.sampled_from(["true", "false", "band"]))
  def check(n, k1, k2, m, a, off, form):
    r, y = UOp.range(n, 0), UOp.range(3, 1)
    body = ((r + off) // m) * a + ((r // m) % 5) * 7 + (r + y) % m + y
    lo, hi = sorted((k1 % n, k2 % n))
    if form == "true": w = r.lt(hi).where(body, -1)
    elif form == "false": w = r.lt(lo).where(-1, body)
    else: w = (r.lt(lo).ne(True) & r.lt(hi)).where(body, -1)
    out = graph_rewrite(w, sym)
    for rv in range(n):
      for yv in range(3):
        env = {r: rv, y: yv}
        assert evaluate(out, env) == evaluate(w, env), (form, w, out, rv, yv)
  check()


def test_a_concatenations_parts_load_through_affine_indices():
  """GPT-2's q, k and v gradients concatenated into one (B, T, 3C) buffer: each part's guard narrows the column,
  and the part's load index, full of // 64, % 12 and // (T*C) through the heads' permute, is the head's plain
  layout there, and the values are numpy's."""
  from rulec import Tensor
  from rulec.engine.ir.ops import Ops as O
  rng = np.random.default_rng(3)
  parts = [rng.standard_normal((2, 3, 8, 4)).astype(np.float32) for _ in range(3)]   # (B, H, T, D)
  t = Tensor.cat(*[Tensor(p).permute(0, 2, 1, 3).reshape(2, 8, 12) for p in parts], dim=2)
  (k,) = t.schedule()
  # (the head and the column within it, c // 4 and c % 4, are the layout's own; nothing else divides)
  divs = {u for u in k.ast.toposort() if u.op in (O.IDIV, O.MOD)}
  assert {(u.op, u.src[0].op, u.src[1].arg) for u in divs} == {(O.IDIV, O.RANGE, 4), (O.MOD, O.RANGE, 4)}, divs
  want = np.concatenate([p.transpose(0, 2, 1, 3).reshape(2, 8, 12) for p in parts], axis=2)
  np.testing.assert_array_equal(t.numpy(), want)
