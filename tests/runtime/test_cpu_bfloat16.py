"""bfloat16 on the CPU (LLVM) device against the NUMPY reference device (ml_dtypes' bfloat16, computed in float32
and rounded once: engine/ir/alu.py half_alu), bit for bit: every bfloat16 through every conversion, the rounding
edges of float32, float64 and the integers, elementwise ops, reductions, a TinyJit replay, and the baseline target
(codegen/llvmir.py converts with integer code of its own, never LLVM's `bfloat`)."""
import math
import operator

import ml_dtypes  # noqa: F401  (registers np.dtype("bfloat16"))
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rulec.engine.ir.dtypes import dtypes
from rulec.engine.tensor import Tensor
from rulec.runtime import cpu_device
from rulec.codegen.decomp import decomposed
from tests.helpers import on

BF = np.dtype("bfloat16")
BF16 = dtypes.bfloat16
EVERY_BF16 = np.arange(1 << 16, dtype=np.uint16).view(BF)
NP = {dtypes.bool: np.dtype(bool), dtypes.int32: np.dtype(np.int32), dtypes.int64: np.dtype(np.int64),
      dtypes.uint64: np.dtype(np.uint64), dtypes.float16: np.dtype(np.float16), dtypes.float32: np.dtype(np.float32),
      dtypes.float64: np.dtype(np.float64), BF16: BF}


def bits(a: np.ndarray) -> np.ndarray:
  a = np.ascontiguousarray(a)
  return a.view(f"u{a.dtype.itemsize}") if a.dtype.kind in "fV" else a


def same_bits(got: np.ndarray, want: np.ndarray, what: str = ""):
  """Every bit the same, NaN payloads and signs included (ml_dtypes' NaNs are what the CPU code computes)."""
  assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, want.dtype, got.shape, want.shape)
  gb, wb = bits(got).ravel(), bits(want).ravel()
  bad = np.flatnonzero(gb != wb)
  assert bad.size == 0, f"{what}: {bad.size} differ, first at {bad[:5]}: got {[hex(v) for v in gb[bad[:5]]]}, " \
                        f"want {[hex(v) for v in wb[bad[:5]]]}"


def both(data, dtype, fn, what: str = "") -> np.ndarray:
  """fn on the CPU, checked bit for bit against the NUMPY device."""
  got, ref = on("CPU", data, dtype, fn), on("NUMPY", data, dtype, fn)
  same_bits(got, ref, what)
  return got


# *** (a) every bfloat16 through every conversion, and back ***

@pytest.mark.parametrize("dst", [dtypes.float32, dtypes.float64, dtypes.float16, dtypes.int32, dtypes.int64, dtypes.bool],
                         ids=lambda d: d.name)
def test_every_bfloat16_converts_and_comes_back(dst):
  out = both(EVERY_BF16, BF16, lambda t: t.cast(dst), f"bfloat16 -> {dst.name}")
  if dst in (dtypes.float32, dtypes.float64):   # exact: the value itself (a NaN keeps its payload in float32)
    fin = ~np.isnan(EVERY_BF16)
    np.testing.assert_array_equal(out[fin], EVERY_BF16[fin].astype(NP[dst]))
    if dst is dtypes.float32: np.testing.assert_array_equal(bits(out), EVERY_BF16.view(np.uint16).astype(np.uint32) << 16)
  both(out, dst, lambda t: t.cast(BF16), f"{dst.name} -> bfloat16")
  if dst is dtypes.float32:   # a round trip through float32 or float64 is the identity but for NaN payloads
    back = on("CPU", out, dst, lambda t: t.cast(BF16))
    ok = ~np.isnan(EVERY_BF16)
    np.testing.assert_array_equal(bits(back)[ok], EVERY_BF16.view(np.uint16)[ok])


def test_bfloat16_bitcasts_are_its_bits():
  u = EVERY_BF16.view(np.uint16)
  same_bits(on("CPU", EVERY_BF16, BF16, lambda t: t.bitcast(dtypes.uint16)), u)
  same_bits(on("CPU", EVERY_BF16, BF16, lambda t: t.bitcast(dtypes.int16)), u.view(np.int16))
  same_bits(on("CPU", EVERY_BF16, BF16, lambda t: t.bitcast(dtypes.float16)), u.view(np.float16))
  same_bits(on("CPU", u, dtypes.uint16, lambda t: t.bitcast(BF16)), EVERY_BF16)
  same_bits(on("CPU", u.view(np.float16), dtypes.float16, lambda t: t.bitcast(BF16)), EVERY_BF16)


def test_every_float16_to_bfloat16():
  every_half = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
  both(every_half, dtypes.float16, lambda t: t.cast(BF16), "float16 -> bfloat16")


# *** (b) float32 -> bfloat16 at its rounding edges ***

def float32_edges() -> np.ndarray:
  """Every tie between neighbouring bfloat16s (in float32), a float32 ulp either side of each, the largest finite
  bfloat16 and the values around its overflow threshold, subnormals, NaNs with payloads, signed zeros, infinities,
  and random bit patterns."""
  fin = EVERY_BF16[np.isfinite(EVERY_BF16)].view(np.uint16).astype(np.uint32) << 16
  ties = (fin | 0x8000).view(np.float32)   # halfway to the next bfloat16 away from zero
  up, down = np.nextafter(ties, np.float32(np.inf)), np.nextafter(ties, np.float32(-np.inf))
  u32 = lambda *v: np.array(v, np.uint32).view(np.float32)  # noqa: E731
  edges = u32(0x7f7f0000, 0x7f7f7fff, 0x7f7f8000, 0x7f7f8001, 0x7f7fffff, 0x7f800000, 0x00000001, 0x00007fff, 0x00008000,
              0x00008001, 0x00018000, 0x0000ffff, 0x007fffff, 0x00800000, 0x7f800001, 0x7fbfffff, 0x7fc00000, 0x7fc00001,
              0x7fffffff, 0x7f810000, 0x00000000, 0x3f808000, 0x3f818000, 0x3f808001, 0x3f807fff)
  edges = np.concatenate([edges, -edges])
  rand = np.random.default_rng(11).integers(0, 1 << 32, 1 << 14, dtype=np.uint32).view(np.float32)
  return np.concatenate([ties, up, down, edges, rand])


def test_float32_to_bfloat16_rounds_to_nearest_even():
  x = float32_edges()
  got = both(x, dtypes.float32, lambda t: t.cast(BF16), "float32 -> bfloat16")
  same_bits(got, x.astype(BF))
  spot = {0x3f808000: 0x3f80, 0x3f818000: 0x3f82, 0x3f808001: 0x3f81, 0x7f7f7fff: 0x7f7f, 0x7f7f8000: 0x7f80,
          0x00008000: 0x0000, 0x00018000: 0x0002, 0x7f800001: 0x7fc0, 0xffc12345: 0xffc0, 0x80000000: 0x8000}
  x = np.array(list(spot), np.uint32).view(np.float32)
  assert [hex(v) for v in bits(on("CPU", x, dtypes.float32, lambda t: t.cast(BF16)))] == [hex(v) for v in spot.values()]


# *** (c) float64 -> bfloat16 rounds once ***

def test_float64_to_bfloat16_rounds_once():
  want = {1 + 2 ** -8: 0x3f80,                  # a tie: to even
          1 + 2 ** -8 + 2 ** -30: 0x3f81,       # just above it: through float32 to nearest it would be the tie
          1 + 2 ** -8 - 2 ** -40: 0x3f80, 1 + 3 * 2 ** -8: 0x3f82, 1 + 3 * 2 ** -8 - 2 ** -30: 0x3f81,
          3.3895313892515355e38: 0x7f7f, 3.3961e38: 0x7f7f, 3.3963e38: 0x7f80, 1e39: 0x7f80, 1e300: 0x7f80, -1e300: 0xff80,
          2.0 ** -133: 0x0001, 2.0 ** -134: 0x0000, 2.0 ** -134 + 2.0 ** -160: 0x0001, 3 * 2.0 ** -134: 0x0002,
          2.0 ** -149 * 0.75: 0x0000, 5e-324: 0x0000, -5e-324: 0x8000, -0.0: 0x8000,
          math.inf: 0x7f80, -math.inf: 0xff80, math.nan: 0x7fc0, -math.nan: 0xffc0}
  x = np.array(list(want), np.float64)
  x[-1] = np.copysign(np.nan, -1)
  got = both(x, dtypes.float64, lambda t: t.cast(BF16), "float64 -> bfloat16")
  assert [hex(v) for v in bits(got)] == [hex(v) for v in want.values()]
  same_bits(got, x.astype(BF))


def test_random_float64_to_bfloat16():
  rng = np.random.default_rng(12)
  x = np.concatenate([rng.integers(0, 1 << 64, 1 << 14, dtype=np.uint64).view(np.float64),   # any exponent, NaNs
                      rng.standard_normal(4096) * 10.0 ** rng.integers(-45, 39, 4096),
                      (rng.integers(1 << 7, 1 << 8, 2048) + 0.5 + rng.choice([-1, 1, 0], 2048) * 2.0 ** -40) * 2.0 ** rng.integers(-140, 120, 2048)])
  with np.errstate(all="ignore"): same_bits(both(x, dtypes.float64, lambda t: t.cast(BF16)), x.astype(BF))


# *** (d) integers -> bfloat16: through float64, as the NUMPY device converts ***

@pytest.mark.parametrize("src", [dtypes.int32, dtypes.int64, dtypes.uint64, dtypes.bool], ids=lambda d: d.name)
def test_integers_to_bfloat16(src):
  t = NP[src]
  if src is dtypes.bool: x = np.array([False, True])
  else:
    info, rng = np.iinfo(t), np.random.default_rng(13)
    big = [2 ** 53 - 1, 2 ** 53 - 2 ** 44 - 1, 2 ** 40 + 2 ** 32, 2 ** 40 + 2 ** 32 + 1, 2 ** 31 - 1, 2 ** 24 + 1, 257, 259,
           (1 << 8) + 1 << 20, ((1 << 8) + 1 << 20) + 1]
    big = [v for v in big if v <= info.max]
    x = np.concatenate([np.arange(max(info.min, -70000), 70001), big, [-v for v in big if -v >= info.min], [info.min, info.max],
                        rng.integers(info.min, info.max, 4096, dtype=t, endpoint=True)]).astype(t)
  got = both(x, src, lambda t: t.cast(BF16), f"{src.name} -> bfloat16")
  with np.errstate(all="ignore"): same_bits(got, x.astype(np.float64).astype(BF))
  if src is not dtypes.bool:   # below 2**53 the double is exact: one rounding, what ml_dtypes gives directly
    small = np.abs(x.astype(np.float64)) < 2.0 ** 53
    same_bits(got[small], x[small].astype(BF))


# *** (e) elementwise ops ***

def operands(n=256, seed=14) -> tuple[np.ndarray, np.ndarray]:
  rng = np.random.default_rng(seed)
  a = (rng.standard_normal(n) * 10.0 ** rng.integers(-3, 4, n)).astype(BF)
  b = (rng.standard_normal(n) * 10.0 ** rng.integers(-3, 4, n)).astype(BF)
  special = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 3.3895e38, -3.3895e38, 2.0 ** -133, 1.0, -1.0, 7.0, 2.0 ** -126], np.float32)
  a[:12], b[:12] = special.astype(BF), special[::-1].astype(BF)
  a[12:24], b[12:24] = special.astype(BF), special.astype(BF)
  a[24:], b[24:] = a[24:], np.where(rng.random(n - 24) < 0.1, 0, b[24:]).astype(BF)   # some x / 0
  return a, b


BINARY = {"add": operator.add, "sub": operator.sub, "mul": operator.mul, "div": operator.truediv,
          "max": lambda x, y: x.maximum(y), "floordiv": operator.floordiv, "mod": operator.mod,
          "lt": operator.lt, "ne": operator.ne, "where": lambda x, y: (x < y).where(x, y),
          "mul_add": lambda x, y: x * y + x, "const": lambda x, y: x * 1.1 + 3.3e38}
UNARY = {"neg": operator.neg, "sqrt": lambda x: x.sqrt(), "exp": lambda x: x.exp(), "log": lambda x: x.log(),
         "sin": lambda x: x.sin(), "relu": lambda x: x.relu(), "abs": lambda x: x.abs(), "recip": lambda x: x.reciprocal()}
# exp, log and sin compute in float32 (engine/tensor/elementwise.py), where the CPU's float32 log and sin are within
# an ulp of numpy's but not always its bits (log: about half of the float32 values of bfloat16s). Rounded to
# bfloat16 they are the same bits for every bfloat16 input (test_transcendentals_of_every_bfloat16 checks all of
# them), but for the sign of a NaN: float32's log(-1) is +NaN on the CPU and -NaN in numpy, sin(-NaN) the reverse
# (a float32 matter; the conversion to bfloat16 keeps the sign it is given)
NOT_EXACT = frozenset({"exp", "log", "sin"})


def same_bits_but_nan_sign(got: np.ndarray, ref: np.ndarray, what: str):
  """NaN in the same places (of any sign), every other value the same bits."""
  nan = np.isnan(ref.astype(np.float32))
  np.testing.assert_array_equal(np.isnan(got.astype(np.float32)), nan, err_msg=what)
  same_bits(got[~nan], ref[~nan], what)


def close_bits(got: np.ndarray, ref: np.ndarray, what: str):
  """NaN in the same places; elsewhere at most one bfloat16 ulp apart (neighbouring bit patterns, same sign)."""
  nan = np.isnan(ref.astype(np.float32))
  np.testing.assert_array_equal(np.isnan(got.astype(np.float32)), nan, err_msg=what)
  g, r = bits(got)[~nan].astype(np.int32), bits(ref)[~nan].astype(np.int32)
  assert (np.abs(g - r) <= 1).all() and ((g ^ r) & 0x8000 == 0).all(), what


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_ops_bit_for_bit(name):
  a, b = operands()
  with np.errstate(all="ignore"): both(a, BF16, lambda t: BINARY[name](t, Tensor(b, device=t.device)), name)


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_ops_bit_for_bit(name):
  a, _ = operands()
  fn = UNARY[name]
  if name in NOT_EXACT: same_bits_but_nan_sign(on("CPU", a, BF16, fn), on("NUMPY", a, BF16, fn), name)
  else: both(a, BF16, fn, name)


@pytest.mark.parametrize("name", sorted(NOT_EXACT))
def test_transcendentals_of_every_bfloat16(name):
  same_bits_but_nan_sign(on("CPU", EVERY_BF16, BF16, UNARY[name]), on("NUMPY", EVERY_BF16, BF16, UNARY[name]), name)


def test_every_bfloat16_through_the_arithmetic():
  # every bfloat16 against a few fixed operands: each rounding case of + * / and sqrt that the values can meet
  x = EVERY_BF16
  for c in (1.0, 3.0, -0.3, 2.0 ** -130, 1e38):
    k = np.full(x.shape, c, np.float32).astype(BF)
    for name in ("add", "mul", "div", "max", "floordiv", "mul_add"):
      with np.errstate(all="ignore"): both(x, BF16, lambda t: BINARY[name](t, Tensor(k, device=t.device)), f"{name} {c}")
  for name in ("neg", "sqrt", "recip"): both(x, BF16, UNARY[name], name)


@settings(max_examples=60)
@given(st.lists(st.integers(0, 0xffff), min_size=32, max_size=32), st.lists(st.integers(0, 0xffff), min_size=32, max_size=32),
       st.sampled_from(sorted(BINARY) + sorted(UNARY)))
def test_random_bfloat16_bits_agree_with_numpy(xa, xb, name):
  a, b = np.array(xa, np.uint16).view(BF), np.array(xb, np.uint16).view(BF)
  if name in UNARY:
    fn = UNARY[name]
    if name in NOT_EXACT: same_bits_but_nan_sign(on("CPU", a, BF16, fn), on("NUMPY", a, BF16, fn), name)
    else: both(a, BF16, fn, name)
  else:
    with np.errstate(all="ignore"): both(a, BF16, lambda t: BINARY[name](t, Tensor(b, device=t.device)), name)


# *** (f) reductions and a matmul: accumulated in float32, rounded once ***

def rows(shape, seed) -> np.ndarray:
  return np.random.default_rng(seed).standard_normal(shape).astype(BF)


def near_float32_reference(got: np.ndarray, ref: np.ndarray, scale: np.ndarray, what: str):
  """The CPU adds in its own order (vector lanes, reassociated), numpy pairwise: the float32 sums differ in their
  last bits, so the bfloat16 results are not always the same bits. Each is the float64 result rounded once to
  bfloat16 (2**-9 relative) plus float32 rounding errors far below that; rtol 2**-7 leaves room for both, and the
  atol for sums that cancel (scale: the sum of magnitudes)."""
  np.testing.assert_allclose(got.astype(np.float64), ref, rtol=2 ** -7, atol=2 ** -20 * scale.max(), err_msg=what)


@pytest.mark.parametrize("axis", [None, 0, 1, (0, 2)], ids=str)
def test_sum_mean_max_over_axes(axis):
  x = rows((6, 40, 33), 15)
  x64 = x.astype(np.float64)
  for name, fn, ref, scale in (("sum", lambda t: t.sum(axis), x64.sum(axis), np.abs(x64).sum(axis)),
                               ("mean", lambda t: t.mean(axis), x64.mean(axis), np.abs(x64).mean(axis))):
    got = on("CPU", x, BF16, fn)
    assert got.dtype == BF, name
    near_float32_reference(got, np.asarray(ref), np.asarray(scale), f"{name} {axis}")
    close_bits(got, on("NUMPY", x, BF16, fn), f"{name} {axis} against NUMPY")
  # a max is exact in any order
  both(x, BF16, lambda t: t.max(axis), f"max {axis}")
  same_bits(on("CPU", x, BF16, lambda t: t.max(axis)), np.asarray(x.astype(np.float32).max(axis)).astype(BF))


def test_short_sums_in_order_are_exact():
  # a sum of 7 in one float32 accumulator, in index order, is numpy's order too (its pairwise sum adds fewer than 8
  # terms one by one): the same bits
  x = rows((50, 7), 16)
  got = both(x, BF16, lambda t: t.sum(1), "sum of 7")
  acc = np.zeros(50, np.float32)
  for j in range(7): acc = acc + x[:, j].astype(np.float32)
  same_bits(got, acc.astype(BF))


def test_nan_and_inf_in_reductions():
  x = rows((4, 16), 17)
  x[0, 3], x[1, 5], x[1, 6], x[2, 0] = np.nan, np.inf, -np.inf, np.inf
  got = both(x, BF16, lambda t: t.max(1), "max")
  # as float32 computes it (Tensor.max's NaN handling is the same for every float dtype), rounded (exactly)
  same_bits(got, on("CPU", x.astype(np.float32), dtypes.float32, lambda t: t.max(1)).astype(BF))
  assert np.isinf(got[2]) and got[2] > 0
  s = on("CPU", x, BF16, lambda t: t.sum(1))
  assert np.isnan(s[0]) and np.isnan(s[1]) and s[2] == np.inf and np.isfinite(s[3])


@pytest.mark.parametrize("m, k, n", [(8, 16, 8), (5, 33, 17), (16, 64, 32)])
def test_matmul(m, k, n):
  a, b = rows((m, k), 18), rows((k, n), 19)
  got = (Tensor(a, device="CPU") @ Tensor(b, device="CPU")).numpy()
  assert got.dtype == BF
  # each product is a bfloat16 multiply (rounded to bfloat16), the sum of them a bfloat16 sum (in float32)
  prods = (a.astype(np.float32)[:, :, None] * b.astype(np.float32)[None]).astype(BF).astype(np.float64)
  near_float32_reference(got, prods.sum(1), np.abs(prods).sum(1), f"matmul {m}x{k}x{n}")
  ref = (Tensor(a, device="NUMPY") @ Tensor(b, device="NUMPY")).numpy()
  close_bits(got, ref, "matmul against NUMPY")


def test_softmax_and_a_layer_in_bfloat16():
  x, w = rows((8, 48), 20), rows((48, 24), 21)
  for name, fn in (("softmax", lambda t: t.softmax(-1)),
                   ("layer", lambda t: (t @ Tensor(w, device=t.device)).relu().sum(1))):
    got, ref = on("CPU", x, BF16, fn), on("NUMPY", x, BF16, fn)
    np.testing.assert_allclose(got.astype(np.float64), ref.astype(np.float64), rtol=2 ** -6, atol=2 ** -6, err_msg=name)


# *** (g) under TinyJit ***

def test_realize_under_tinyjit():
  from rulec import TinyJit
  def step(x, y): return ((x * y + 1.5).maximum(x) / 3).realize()
  jf = TinyJit(step)
  for i in range(5):
    a, b = rows((4, 12), 30 + i), rows((4, 12), 40 + i)
    got = jf(Tensor(a, device="CPU"), Tensor(b, device="CPU")).numpy()
    same_bits(got, step(Tensor(a, device="NUMPY"), Tensor(b, device="NUMPY")).numpy(), f"call {i}")


# *** no `bfloat` in the IR, nothing that needs a runtime routine or a CPU feature ***

def bf16_kernels():
  h = Tensor(np.ones(64, BF), device="CPU")
  return (Tensor(np.ones(64), device="CPU").cast(BF16), Tensor(np.ones(64, np.float32), device="CPU").cast(BF16),
          h.cast(dtypes.float32), h.cast(dtypes.float64), h.cast(dtypes.float16), h.cast(dtypes.int64), h * h + h,
          (h / 3).sqrt().exp(), h.sum(), h.max(), h.reshape(8, 8) @ h.reshape(8, 8))


def test_bfloat16_kernels_call_no_runtime_conversion_routines(monkeypatch):
  import re
  import llvmlite.binding as llvm
  from rulec.codegen.llvmir import render
  cpu_device._jit()   # initialises LLVM's native target
  monkeypatch.setenv("RULEC_CPU_TARGET", "baseline")
  cpu, features = cpu_device.target_cpu()
  tm = llvm.Target.from_triple(llvm.get_process_triple()).create_target_machine(cpu=cpu, features=features, opt=3, jit=True)
  for t in bf16_kernels():
    for k in t.schedule():
      text, _ = render(decomposed(k))
      assert not re.search(r"\b(bfloat|half)\b", text), text
      mod = llvm.parse_assembly(text)
      mod.triple, mod.data_layout = llvm.get_process_triple(), str(tm.target_data)
      asm = tm.emit_assembly(mod)
      assert not re.search(r"__\w*(bf|hf)2\b|__gnu_[fh]2[fh]", asm), asm


BASELINE_CHILD = """
import sys
import numpy as np
from tests.helpers import on
from tests.runtime.test_cpu_bfloat16 import baseline_programs
got = {name: on("CPU", x, d, fn).reshape(-1).view(np.uint8) for name, (x, d, fn) in baseline_programs().items()}
np.savez(sys.argv[1], **got)
"""


def baseline_programs() -> dict:
  a, b = operands()
  other = lambda t: Tensor(b, device=t.device)  # noqa: E731
  progs = {f"to_{d.name}": (EVERY_BF16, BF16, (lambda d: lambda t: t.cast(d))(d))
           for d in (dtypes.float32, dtypes.float64, dtypes.float16, dtypes.int32, dtypes.bool)}
  progs |= {f"from_{d.name}": (x, d, lambda t: t.cast(BF16)) for d, x in
            ((dtypes.float32, float32_edges()), (dtypes.float64, np.array([1 + 2 ** -8 + 2 ** -30, 1e300, -0.0, np.nan])),
             (dtypes.int64, np.array([2 ** 53 - 1, -(2 ** 40 + 2 ** 32 + 1), 257], np.int64)))}
  progs |= {name: (a, BF16, lambda t, fn=fn: fn(t, other(t))) for name, fn in BINARY.items()}
  # (the sum without the special values: +-3.39e38 cancelling leaves a sum that depends on the order of the adds)
  progs |= {"sum": (rows((16, 16), 22), BF16, lambda t: t.sum(1)), "max": (a, BF16, lambda t: t.max())}
  return progs


def test_bfloat16_under_the_baseline_target(tmp_path):
  # in a child process compiled for the baseline CPU (no features: no AVX512-BF16, no F16C), so that a call into
  # a routine the JIT lacks fails this test as a crash, not the run
  import subprocess
  import sys
  from tests.helpers import subprocess_env
  out = tmp_path / "got.npz"
  proc = subprocess.run([sys.executable, "-c", BASELINE_CHILD, str(out)], capture_output=True, text=True, timeout=300,
                        env=subprocess_env(RULEC_CPU_TARGET="baseline", RULEC_DEVICE="CPU"))
  assert proc.returncode == 0, f"exit status {proc.returncode} (-11: a segfault)\n{proc.stderr[-4000:]}"
  got = np.load(out)
  for name, (x, d, fn) in baseline_programs().items():
    with np.errstate(all="ignore"): ref = on("NUMPY", x, d, fn)
    g = got[name].view(ref.dtype).reshape(ref.shape)
    if name == "sum": close_bits(g, ref, name)
    else: same_bits(g, ref, name)
