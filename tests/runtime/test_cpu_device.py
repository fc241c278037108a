"""The CPU (LLVM) device against the NUMPY reference device and numpy: dtype
edge cases, every cast pair, division by zero, overflow, NaN and inf; float16
conversions bit for bit, also compiled for the baseline target."""
import itertools
import math
import operator
import re

import ml_dtypes  # noqa: F401  (registers np.dtype("bfloat16"))
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rulec.engine.ir.dtypes import dtypes
from rulec.engine.tensor import Tensor
from rulec.runtime import cpu_device
from rulec.codegen.decomp import decomposed
from tests.helpers import on, same_as_reference

DTS = [dtypes.bool, dtypes.uint8, dtypes.int8, dtypes.int32, dtypes.int64, dtypes.float16, dtypes.bfloat16, dtypes.float32,
       dtypes.float64]
NP = {d: np.dtype(d.np_name) for d in DTS}


def both(data, dtype, fn): return same_as_reference("CPU", data, dtype, fn)


def sample(d, n=64, seed=0):
  rng = np.random.default_rng(seed)
  if d.kind == "b": return rng.integers(0, 2, n).astype(bool)
  if d.kind == "f":
    v = rng.standard_normal(n) * 100
    v[:6] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e30 if d is not dtypes.float16 else 6e4]
    return v.astype(NP[d])
  info = np.iinfo(NP[d])
  v = rng.integers(info.min, info.max, n, dtype=NP[d], endpoint=True)
  v[:4] = [info.min, info.max, 0, 1 if d.kind == "i" or d.kind == "u" else 0]
  return v


@pytest.mark.parametrize("src, dst", list(itertools.product(DTS, DTS)), ids=lambda d: d.name)
def test_every_cast_matches_the_reference(src, dst):
  x = sample(src)
  got = both(x, src, lambda t: t.cast(dst))
  # where numpy defines the result (finite, in range), it agrees too
  if src.kind == "f" and dst.kind in "iu":
    info = np.iinfo(NP[dst])
    ok = np.isfinite(x) & (x >= info.min) & (x <= info.max)
    np.testing.assert_array_equal(got[ok], x[ok].astype(NP[dst]))
  elif not (src.kind == "f" and dst.kind == "f" and src.itemsize > dst.itemsize):
    with np.errstate(all="ignore"): np.testing.assert_array_equal(got, x.astype(NP[dst]))


@pytest.mark.parametrize("d", [dtypes.int8, dtypes.uint8, dtypes.int32, dtypes.int64], ids=lambda d: d.name)
def test_integer_arithmetic_wraps_and_divides_like_numpy(d):
  a, b = sample(d, seed=1), sample(d, seed=2)
  with np.errstate(all="ignore"):
    for op in (operator.add, operator.sub, operator.mul):
      got = both(a, d, lambda t: op(t, Tensor(b, dtype=d, device=t.device)))
      np.testing.assert_array_equal(got, op(a, b))
    for op in (operator.floordiv, operator.mod):
      got = both(a, d, lambda t: op(t, Tensor(b, dtype=d, device=t.device)))
      nz = b != 0
      np.testing.assert_array_equal(got[nz], op(a, b)[nz])
      assert (got[~nz] == 0).all()


def test_int_min_divided_by_minus_one_wraps():
  a = np.array([np.iinfo(np.int32).min, 7, -7], np.int32)
  b = np.array([-1, -1, -1], np.int32)
  got = both(a, dtypes.int32, lambda t: t // Tensor(b, device=t.device))
  np.testing.assert_array_equal(got, [np.iinfo(np.int32).min, -7, 7])


@pytest.mark.parametrize("d", [dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64], ids=lambda d: d.name)
def test_nan_and_inf_propagate(d):
  a = sample(d, seed=3)
  b = sample(d, seed=4)
  with np.errstate(all="ignore"):
    for op in (operator.add, operator.mul, operator.truediv):
      ref = op(a, b)
      got = both(a, d, lambda t: op(t, Tensor(b, dtype=d, device=t.device)))
      np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
      fin = np.isfinite(ref)
      np.testing.assert_allclose(got[fin].astype(np.float64), ref[fin].astype(np.float64),
                                 rtol={dtypes.float16: 1e-3, dtypes.bfloat16: 8e-3}.get(d, 1e-6))
    got = both(a, d, lambda t: t.maximum(Tensor(b, dtype=d, device=t.device)))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(np.maximum(a, b)))
    assert np.isnan(both(a, d, lambda t: t.sum()).item()) and np.isnan(both(a, d, lambda t: t.max()).item())


def test_bool_ops():
  a, b = sample(dtypes.bool, seed=5), sample(dtypes.bool, seed=6)
  for op in (operator.and_, operator.or_, operator.xor):
    np.testing.assert_array_equal(both(a, dtypes.bool, lambda t: op(t, Tensor(b, device=t.device))), op(a, b))
  np.testing.assert_array_equal(both(a, dtypes.bool, lambda t: t + Tensor(b, device=t.device)), a + b)
  np.testing.assert_array_equal(both(a, dtypes.bool, lambda t: (t.reshape(8, 8) @ Tensor(b, device=t.device).reshape(8, 8))),
                                a.reshape(8, 8) @ b.reshape(8, 8))


def test_shifts_and_integer_powers():
  a = np.array([1, -3, 7, 1 << 20, -1, 2], np.int32)
  n = np.array([0, 1, 31, 40, -2, 3], np.int32)
  both(a, dtypes.int32, lambda t: t << Tensor(n, device=t.device))
  both(a, dtypes.int32, lambda t: t >> Tensor(n, device=t.device))
  got = both(a, dtypes.int32, lambda t: t ** Tensor(np.array([0, 3, 2, 2, -3, 10], np.int32), device=t.device))
  assert got.tolist()[:2] == [1, -27] and got[4] == -1 and got[5] == 1024


@settings(max_examples=60)
@given(st.integers(1, 70), st.integers(1, 70), st.sampled_from([1, 2]))
def test_reductions_and_threads_agree_with_numpy(rows, cols, nthreads):
  x = np.random.default_rng(rows * 100 + cols).standard_normal((rows, cols)).astype(np.float32)
  import os
  old = os.environ.get("RULEC_THREADS")
  os.environ["RULEC_THREADS"] = str(nthreads)
  try:
    for fn, ref in ((lambda t: t.sum(1), x.sum(1)), (lambda t: t.max(0), x.max(0)),
                    (lambda t: t.softmax(-1), np.exp(x - x.max(-1, keepdims=True)) / np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True))):
      np.testing.assert_allclose(on("CPU", x, dtypes.float32, fn), ref, rtol=2e-5, atol=1e-5)
  finally:
    if old is None: os.environ.pop("RULEC_THREADS")
    else: os.environ["RULEC_THREADS"] = old


def test_a_kernel_is_compiled_once():
  x = np.ones((3, 5), np.float32)
  Tensor(x, device="CPU").exp().sum(0).numpy()
  before = cpu_device.COUNTERS["compiled"]
  Tensor(x * 2, device="CPU").exp().sum(0).numpy()
  assert cpu_device.COUNTERS["compiled"] == before


def test_big_kernels_split_across_threads_and_agree(monkeypatch):
  monkeypatch.setattr(cpu_device, "MIN_SPLIT_WORK", 1)
  monkeypatch.setenv("RULEC_THREADS", "2")
  x = np.random.default_rng(7).standard_normal((257, 33)).astype(np.float32)
  got = on("CPU", x, dtypes.float32, lambda t: (t * 2 + 1).relu().sum(1))
  np.testing.assert_allclose(got, np.maximum(x * 2 + 1, 0).sum(1), rtol=1e-5, atol=1e-5)


# *** upcast: a store range unrolled into lanes that share one reduce loop (codegen/opt, codegen/llvmir.py) ***

def _upcasts(k) -> dict:
  """{range size: lanes} of the UPCAST actions the CPU's optimizer chooses for a kernel."""
  from rulec.codegen.opt.choose import cpu_actions
  low = decomposed(k)
  sizes = {r.arg[0]: r.src[0].arg for r in low.ranges}
  return {sizes[a.axis]: a.amount for a in cpu_actions(low) if a.op == "UPCAST"}


def _kblock(k) -> int:
  from rulec.codegen.opt.choose import cpu_actions
  return next((a.amount for a in cpu_actions(decomposed(k)) if a.op == "KBLOCK"), 0)


def test_matmul_kernels_are_upcast():
  from rulec.codegen.llvmir import render
  from rulec.codegen.opt import optimize
  from rulec.codegen.opt.choose import UPCAST_ROWS
  (k,) = (Tensor(np.ones((16, 32), np.float32)) @ Tensor(np.ones((32, 48), np.float32))).schedule()
  opt, actions = optimize(decomposed(k), "CPU")
  text, split = render(opt)
  assert "llvm.loop.vectorize.enable" in text and "distinct" in text   # the shared reduce loop is marked
  assert _upcasts(k) == {16: UPCAST_ROWS, 48: 16}                      # a tile of rows x 16 columns
  assert [a.op for a in actions] == ["UPCAST", "UPCAST", "THREAD"]
  assert split.src[0].arg == 16 // UPCAST_ROWS                         # threads split the blocks of rows
  (e,) = (Tensor(np.ones((4, 48), np.float32)) + 1).schedule()          # no reduce: nothing to share
  assert _upcasts(e) == {}
  # row sums: not lanes across rows (they would read 16 rows apart), but two rows side by side, each summed in
  # vector lanes along it (choose.matvec_tile, UNSHARED_ROWS; 4096 x 4096 here: 7.0 -> 1.6 ms)
  from rulec.codegen.opt.choose import UNSHARED_ROWS
  s = Tensor(np.ones((64, 4096), np.float32)).sum(1)
  assert _upcasts(s.schedule()[0]) == {64: UNSHARED_ROWS}
  np.testing.assert_array_equal(s.numpy(), np.full(64, 4096, np.float32))


@settings(max_examples=40)
@given(st.sampled_from([1, 3, 8, 9, 16, 24, 32]), st.integers(1, 40), st.integers(1, 70),
       st.sampled_from(["mm", "mm_bias_relu", "mm_t", "rowdot"]))
def test_upcast_reductions_agree_with_numpy(m, k, n, kind):
  # n covers multiples of 16, 8 and 4 (upcast with that many lanes) and others (no upcast), m multiples of the 8 rows
  # of a tile and others; values that depend on an upcast range outside the reduce (the bias) must not leak
  # between lanes
  rng = np.random.default_rng(m * 10000 + k * 100 + n)
  a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
  bias = rng.standard_normal(n).astype(np.float32)
  f = {"mm": lambda x, y, z: x @ y, "mm_bias_relu": lambda x, y, z: (x @ y + z).relu(),
       "mm_t": lambda x, y, z: (y.T @ x.T), "rowdot": lambda x, y, z: (x.reshape(m, k, 1) * y.reshape(1, k, n)).sum(1) * z}[kind]
  got = f(Tensor(a), Tensor(b), Tensor(bias)).numpy()
  ref = f(Tensor(a, device="NUMPY"), Tensor(b, device="NUMPY"), Tensor(bias, device="NUMPY")).numpy()
  np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * k)


@pytest.mark.parametrize("d", [dtypes.int32, dtypes.int8, dtypes.float16, dtypes.bfloat16, dtypes.float64], ids=lambda d: d.name)
def test_upcast_keeps_dtype_semantics(d):
  a, b = sample(d, 3 * 20, seed=31).reshape(3, 20), sample(d, 20 * 32, seed=32).reshape(20, 32)
  if d.kind == "f": a, b = np.nan_to_num(a, posinf=1, neginf=-1) / 50, np.nan_to_num(b, posinf=1, neginf=-1) / 50
  got = (Tensor(a, dtype=d) @ Tensor(b, dtype=d)).numpy()
  ref = (Tensor(a, dtype=d, device="NUMPY") @ Tensor(b, dtype=d, device="NUMPY")).numpy()
  if d.kind == "f": np.testing.assert_allclose(got.astype(np.float64), ref.astype(np.float64), rtol=1e-2, atol=1e-2)
  else: np.testing.assert_array_equal(got, ref)   # integer matmul wraps exactly


def test_upcast_conv_agrees_with_numpy():
  rng = np.random.default_rng(33)
  x, w = rng.standard_normal((2, 3, 10, 16)).astype(np.float32), rng.standard_normal((5, 3, 3, 3)).astype(np.float32)
  got = Tensor(x).conv2d(Tensor(w), padding=1).numpy()
  ref = Tensor(x, device="NUMPY").conv2d(Tensor(w, device="NUMPY"), padding=1).numpy()
  np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_long_reductions_of_register_tiles_run_in_blocks():
  # KBLOCK (codegen/opt): a tiled float sum stored into its own buffer runs its reduction in blocks, each adding
  # into what the last one stored, the last applying its epilogue (a bias, a relu; a transcendental too, which the
  # renderer computes in the last block alone: it branches on the block); an output read inside is not blocked
  rng = np.random.default_rng(34)
  a, b = rng.standard_normal((16, 1024)).astype(np.float32), rng.standard_normal((1024, 256)).astype(np.float32)
  bias = rng.standard_normal(256).astype(np.float32)
  def blocked(t):
    (k,) = t.schedule()
    return _kblock(k)
  mm = Tensor(a) @ Tensor(b)
  assert blocked(mm) == 512
  np.testing.assert_allclose(mm.numpy(), a @ b, rtol=1e-4, atol=1e-3)
  np.testing.assert_allclose(mm.numpy(), a @ b, rtol=1e-4, atol=1e-3)   # run again on the same buffer: starts afresh
  ep = (Tensor(a) @ Tensor(b) + Tensor(bias)).relu()
  assert blocked(ep) == 512
  np.testing.assert_allclose(ep.numpy(), np.maximum(a @ b + bias, 0), rtol=1e-4, atol=1e-3)
  np.testing.assert_allclose(ep.numpy(), np.maximum(a @ b + bias, 0), rtol=1e-4, atol=1e-3)   # again: afresh
  ex = (Tensor(a) @ Tensor(b) * 0.01).exp()
  assert blocked(ex) == 512
  np.testing.assert_allclose(ex.numpy(), np.exp((a @ b) * 0.01), rtol=1e-4, atol=1e-3)
  np.testing.assert_allclose(ex.numpy(), np.exp((a @ b) * 0.01), rtol=1e-4, atol=1e-3)   # again: afresh
  x, w = rng.standard_normal((512, 512)).astype(np.float32), rng.standard_normal((512, 512)).astype(np.float32)
  t = Tensor(x)
  t.assign(t @ Tensor(w)).realize()                                    # the output is also an input
  np.testing.assert_allclose(t.numpy(), x @ w, rtol=1e-4, atol=1e-3)
  np.testing.assert_allclose((Tensor(x, dtype=dtypes.float64) @ Tensor(w, dtype=dtypes.float64)).numpy(),
                             x.astype(np.float64) @ w.astype(np.float64), rtol=1e-10, atol=1e-9)


@pytest.mark.parametrize("stride, padding, dilation", [(1, 1, 1), (2, 1, 1), (1, 2, 2), (1, 0, 1)])
def test_conv_tiles_output_channels_by_output_x(stride, padding, dilation):
  # rows of the tile: the output channels (the input row the columns read is shared by all of them)
  rng = np.random.default_rng(35)
  width = 32 - 2 * padding + 2 * dilation if stride == 1 else 32   # stride 1: 32 output columns (a multiple of 16)
  x, w = rng.standard_normal((2, 3, 12, width)).astype(np.float32), rng.standard_normal((16, 3, 3, 3)).astype(np.float32)
  t = Tensor(x).conv2d(Tensor(w), stride=stride, padding=padding, dilation=dilation)
  if stride == 1:
    (k,) = t.schedule()
    assert _upcasts(k) == {16: 8, 32: 16}   # output channels, output x
  ref = Tensor(x, device="NUMPY").conv2d(Tensor(w, device="NUMPY"), stride=stride, padding=padding, dilation=dilation)
  np.testing.assert_allclose(t.numpy(), ref.numpy(), rtol=1e-4, atol=1e-4)


def test_conv_weight_gradient_tiles_output_channels_by_taps():
  # a convolution's weight gradient stores (cout, cin, kh, kw) summed over (n, oh, ow): its innermost store range is
  # the 3 taps, narrower than any tile width; the tile takes all 3 x 3 taps beside rows of output channels (the image
  # rows the taps read are shared by all of them), 4x faster than no tile at 8x64x56x56 with the column taps alone,
  # 52 -> 40 ms more with both (codegen/opt/choose.py)
  rng = np.random.default_rng(36)
  x = rng.standard_normal((2, 8, 10, 12)).astype(np.float32)
  w = Tensor(rng.standard_normal((16, 8, 3, 3)).astype(np.float32), requires_grad=True)
  g = rng.standard_normal((2, 16, 10, 12)).astype(np.float32)
  Tensor(x).conv2d(w, padding=1).backward(Tensor(g))
  (k,) = [k for k in w.grad.schedule() if "ranges (16, 8, 3, 3" in repr(k)]
  ups = _upcasts(k)
  assert ups.get(3) == 3 and ups.get(16, 0) >= 8, ups   # the taps, by 8 or 16 output channels
  from rulec.codegen.opt.choose import cpu_actions
  low = decomposed(k)
  taps = {r.arg[0] for r in low.ranges if r.src[0].arg == 3}
  assert {a.axis for a in cpu_actions(low) if a.op == "UPCAST" and a.amount == 3} == taps   # both of them
  xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
  want = np.einsum("nchwij,nohw->ocij", np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(2, 3)), g)
  np.testing.assert_allclose(w.grad.numpy(), want, rtol=1e-4, atol=1e-4)


# *** float16: integer conversion code of our own, the same on every CPU (codegen/llvmir.py) ***

def _bits(a: np.ndarray) -> np.ndarray: return np.ascontiguousarray(a).view(f"u{a.dtype.itemsize}")


def same_bits(got: np.ndarray, want: np.ndarray, what: str = ""):
  """Bit for bit; a NaN only has to be a NaN of the same sign (hardware conversions may quiet a signalling one)."""
  assert got.dtype == want.dtype and got.shape == want.shape, what
  if want.dtype.kind != "f" and want.dtype != NP[dtypes.bfloat16]:   # (ml_dtypes' bfloat16 is of numpy kind "V")
    return np.testing.assert_array_equal(got, want, err_msg=what)
  nan = np.isnan(want)
  np.testing.assert_array_equal(np.isnan(got), nan, err_msg=what)
  bad = np.flatnonzero((_bits(got) != _bits(want)) & ~nan)
  assert bad.size == 0, f"{what}: {bad.size} differ, first at {bad[:5]}: got {got[bad[:5]]}, want {want[bad[:5]]}"
  np.testing.assert_array_equal(np.signbit(got[nan]), np.signbit(want[nan]), err_msg=what)


EVERY_HALF = np.arange(1 << 16, dtype=np.uint16).view(np.float16)


def near_halves() -> np.ndarray:
  """float64 values where rounding to float16 can go wrong: every finite float16, every tie between neighbours,
  the doubles next to each tie, and values 2**-40 (relative) off each tie (rounding through float32 first would
  land on the tie), the overflow threshold 65520, zeros, the smallest doubles, inf and NaN."""
  fin = np.unique(EVERY_HALF[np.isfinite(EVERY_HALF)].astype(np.float64))
  ties = (fin[:-1] + fin[1:]) / 2
  edges = [65520.0, np.nextafter(65520.0, 0), np.nextafter(65520.0, np.inf), 1e300, 5e-324, 2.0 ** -1074 * 3, 2.0 ** -25,
           2.0 ** -25 + 2.0 ** -60, 0.0, -0.0, np.inf, np.nan, np.copysign(np.nan, -1)]
  edges += [-e for e in edges[:8]]
  return np.concatenate([fin, ties, np.nextafter(ties, np.inf), np.nextafter(ties, -np.inf),
                         ties * (1 + 2.0 ** -40), ties * (1 - 2.0 ** -40), edges])


def into_half_inputs(d) -> np.ndarray:
  if d is dtypes.float64: return near_halves()
  if d is dtypes.float32:
    with np.errstate(over="ignore"): ties = near_halves().astype(np.float32)
    rand = np.random.default_rng(8).integers(0, 1 << 32, 1 << 16, dtype=np.uint32).view(np.float32)
    return np.concatenate([ties, np.nextafter(ties, np.float32(np.inf)), np.nextafter(ties, np.float32(-np.inf)), rand])
  if d is dtypes.bool: return np.array([False, True])
  if d is dtypes.bfloat16: return np.arange(1 << 16, dtype=np.uint16).view(NP[d])   # every bfloat16 there is
  info = np.iinfo(NP[d])
  return np.concatenate([np.arange(max(info.min, -70000), min(info.max, 70000) + 1), [info.min, info.max]]).astype(NP[d])


OTHERS = [d for d in DTS if d is not dtypes.float16]


@pytest.mark.parametrize("src", OTHERS, ids=lambda d: d.name)
def test_casts_into_float16_match_numpy_bit_for_bit(src):
  x = into_half_inputs(src)
  with np.errstate(all="ignore"):
    same_bits(same_as_reference("CPU", x, src, lambda t: t.cast(dtypes.float16)), x.astype(np.float16))


@pytest.mark.parametrize("dst", OTHERS, ids=lambda d: d.name)
def test_casts_out_of_float16_match_numpy_bit_for_bit(dst):
  got = same_as_reference("CPU", EVERY_HALF, dtypes.float16, lambda t: t.cast(dst))   # every float16 there is
  if dst.kind in "iu":   # where numpy defines the result: the rest wraps as engine/ir/alu.py says (the reference)
    info, x = np.iinfo(NP[dst]), EVERY_HALF.astype(np.float64)
    ok = np.isfinite(x) & (x >= info.min) & (x <= info.max)
    np.testing.assert_array_equal(got[ok], EVERY_HALF[ok].astype(NP[dst]))
  else: same_bits(got, EVERY_HALF.astype(NP[dst]))


def test_float64_to_float16_rounds_once():
  want = {1 + 2 ** -11: 0x3c00,                # a tie: to even
          1 + 2 ** -11 + 2 ** -40: 0x3c01,     # just above it (through float32 it would be the tie, and round down)
          1 + 3 * 2 ** -11: 0x3c02, 65504: 0x7bff, 65519.99: 0x7bff, 65520: 0x7c00, -65520: 0xfc00, 1e300: 0x7c00,
          2 ** -14: 0x0400, 2 ** -14 - 2 ** -25: 0x0400, 2 ** -24: 0x0001, 2 ** -25: 0x0000, 2 ** -25 + 2 ** -60: 0x0001,
          3 * 2 ** -25: 0x0002, -3 * 2 ** -25: 0x8002, 5e-324: 0x0000, -5e-324: 0x8000, -0.0: 0x8000,
          math.inf: 0x7c00, -math.inf: 0xfc00, math.nan: 0x7e00, -math.nan: 0xfe00}
  x = np.array(list(want), np.float64)
  x[-1] = np.copysign(np.nan, -1)
  got = _bits(same_as_reference("CPU", x, dtypes.float64, lambda t: t.cast(dtypes.float16)))
  assert [hex(v) for v in got] == [hex(v) for v in want.values()]
  with np.errstate(all="ignore"): np.testing.assert_array_equal(got, _bits(x.astype(np.float16)))


def test_half_of_a_float64_sum_of_int_and_float():
  a, f = np.arange(-50, 50, dtype=np.int32), np.linspace(-3, 3, 100, dtype=np.float32)
  # int32 + float32 is float32 (tinygrad's promotion): the float64 sum is asked for
  t = Tensor(a, device="CPU").cast(dtypes.float64) + Tensor(f, device="CPU")
  assert t.dtype is dtypes.float64
  same_bits(t.half().numpy(), (a + f).astype(np.float16))


def test_a_guarded_float16_sum_converts_its_terms():
  # sum(where(c, inner sum, 0)) branches around the inner loop (a padded pool's |x| summed); in float16 the guarded
  # path added the 16 bits of each term to the float accumulator: LLVM refused it (found by tests/fuzz_programs.py,
  # seed 1601, program 1916)
  x = np.array([[[-1.5, -3.25, 1.75, -2.75], [2.75, 2.75, 3.25, -1.25]]], np.float16)
  got = Tensor(x, device="CPU").avg_pool2d((1, 2), stride=(1, 2), padding=(0, 1)).abs().sum(axis=(0, 1)).numpy()
  p = np.pad(x, ((0, 0), (0, 0), (1, 1))).astype(np.float32)
  pooled = ((p[..., 0::2] + p[..., 1::2]) / 2).astype(np.float16)
  np.testing.assert_array_equal(got, np.abs(pooled).astype(np.float32).sum((0, 1)).astype(np.float16))


def test_float16_kernels_call_no_runtime_conversion_routines(monkeypatch):
  # LLVM turns `half` operations into calls to compiler-rt's __truncdfhf2, __extendhfsf2, ... on CPUs without
  # native conversions, which the JIT cannot resolve (a call to address 0): the IR must never contain a `half`
  import re
  import llvmlite.binding as llvm
  from rulec.codegen.llvmir import render
  cpu_device._jit()   # initialises LLVM's native target
  monkeypatch.setenv("RULEC_CPU_TARGET", "baseline")
  cpu, features = cpu_device.target_cpu()
  tm = llvm.Target.from_triple(llvm.get_process_triple()).create_target_machine(cpu=cpu, features=features, opt=3, jit=True)
  h = Tensor(np.ones(64, np.float16), device="CPU")
  for t in (Tensor(np.ones(64), device="CPU").cast(dtypes.float16), h.cast(dtypes.float32), h.cast(dtypes.float64),
            h * h + h, (h / 3).sqrt().exp(), h.sum(), h.max(), h.reshape(8, 8) @ h.reshape(8, 8), h.cast(dtypes.int32)):
    for k in t.schedule():
      text, _ = render(decomposed(k))
      assert not re.search(r"\bhalf\b", text), text
      mod = llvm.parse_assembly(text)
      mod.triple, mod.data_layout = llvm.get_process_triple(), str(tm.target_data)
      asm = tm.emit_assembly(mod)
      assert not re.search(r"__\w*hf2\b|__gnu_[fh]2[fh]", asm), asm


def half_programs() -> dict:
  """name -> (data, dtype, program, exact): float16 casts and arithmetic; exact: bit for bit (correctly rounded
  operations), else within float16's rounding (transcendentals, sums in another order)."""
  rng = np.random.default_rng(9)
  a, b = (rng.standard_normal(64) * 8).astype(np.float16), (rng.standard_normal(64) * 8).astype(np.float16)
  b[:4] = [0, -0.0, np.inf, 2 ** -24]
  other = lambda t: Tensor(b, device=t.device)
  progs = {f"{d.name}_to_half": (sample(d), d, lambda t: t.cast(dtypes.float16), True) for d in OTHERS}
  progs |= {f"half_to_{d.name}": (EVERY_HALF, dtypes.float16, (lambda d: lambda t: t.cast(d))(d), True) for d in OTHERS}
  progs["near_halves_to_half"] = (near_halves(), dtypes.float64, lambda t: t.cast(dtypes.float16), True)
  progs["int_plus_float_to_half"] = (np.arange(-32, 32, dtype=np.int32), dtypes.int32,
                                     lambda t: (t + Tensor(np.linspace(-2, 2, 64, dtype=np.float32), device=t.device)).half(), True)
  for name, fn, exact in [("add", lambda t: t + other(t), True), ("mul_add", lambda t: t * other(t) + t, True),
                          ("div", lambda t: t / other(t), True), ("floordiv", lambda t: t // other(t), True),
                          ("neg_max", lambda t: (-t).maximum(other(t)), True), ("relu", lambda t: t.relu(), True),
                          ("sqrt", lambda t: t.abs().sqrt(), True), ("exp", lambda t: (t / 4).exp(), False),
                          ("sum", lambda t: t.sum(), False), ("max", lambda t: t.max(), True),
                          ("matmul", lambda t: t.reshape(8, 8) @ other(t).reshape(8, 8), False),
                          ("softmax", lambda t: t.reshape(8, 8).softmax(-1), False)]:
    progs[name] = (a, dtypes.float16, fn, exact)
  return progs


BASELINE_CHILD = """
import sys
import numpy as np
from rulec.runtime import cpu_device
from tests.helpers import on
from tests.runtime.test_cpu_device import half_programs
got = {name: on("CPU", x, d, fn) for name, (x, d, fn, _) in half_programs().items()}
np.savez(sys.argv[1], **got)
print(*cpu_device.target_cpu())
"""


def test_float16_under_the_baseline_target(tmp_path):
  # in a child process, so that a crash (a call into a routine the JIT lacks) fails this test, not the run
  import subprocess
  import sys
  from tests.helpers import subprocess_env
  out = tmp_path / "got.npz"
  proc = subprocess.run([sys.executable, "-c", BASELINE_CHILD, str(out)], capture_output=True, text=True, timeout=300,
                        env=subprocess_env(RULEC_CPU_TARGET="baseline", RULEC_DEVICE="CPU"))
  assert proc.returncode == 0, f"exit status {proc.returncode} (-11: a segfault)\n{proc.stderr[-4000:]}"
  assert proc.stdout.split() in (["x86-64"], ["generic"])   # no features
  got = np.load(out)
  for name, (x, d, fn, exact) in half_programs().items():
    ref = on("NUMPY", x, d, fn)
    g = got[name].view(ref.dtype) if got[name].dtype.kind == "V" else got[name]   # (a .npz keeps bfloat16 as bare V2)
    if exact: same_bits(g, ref, name)
    else: np.testing.assert_allclose(g.astype(np.float64), ref.astype(np.float64), rtol=2e-3, atol=2e-3, err_msg=name)


@pytest.mark.parametrize("n", [8, 32])
def test_signed_to_unsigned_to_float_in_vector_code(n):
  # LLVM 22's SLP vectoriser narrows `uitofp (sext i16 x to i64)` to `uitofp (sext i16 x to i32)`, wrong for negative
  # x (found by tests/fuzz_programs.py: Tensor.stack of an int16 and its uint64 cast): the renderer writes unsigned
  # conversions with signed ones (codegen/llvmir.py _unsigned_to_float). Every pair of a signed source, an unsigned
  # middle and a float, in the stacked form that vectorises, is numpy's value exactly
  rng = np.random.default_rng(n)
  for sdt in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint32):
    info = np.iinfo(sdt)
    edge = [info.min, info.max, -1 if info.min < 0 else 0, 0, 1]
    x = np.resize(np.concatenate([edge, rng.integers(info.min, info.max, n, endpoint=True, dtype=np.int64)]), n).astype(sdt)
    for udt in ("uint8", "uint16", "uint32", "uint64"):
      for fdt in ("float32", "float64"):
        t = Tensor(x, device="CPU")
        got = Tensor.stack(t.cast(fdt), t.cast(udt).cast(fdt)).numpy()[1]
        np.testing.assert_array_equal(got, x.astype(udt).astype(fdt), err_msg=f"{np.dtype(sdt).name} -> {udt} -> {fdt}")
  big = np.array([2**63 - 1, 2**63, 2**63 + 1, 2**64 - 1, 2**64 - 1025, 2**53 + 1, 2**31, 2**32 - 1], np.uint64)
  for fdt in ("float32", "float64"):   # rounding of the large half: the sticky low bit
    np.testing.assert_array_equal(Tensor(big, device="CPU").cast(fdt).numpy(), big.astype(fdt))
    u32 = big.astype(np.uint32)
    np.testing.assert_array_equal(Tensor(u32, device="CPU").cast(fdt).numpy(), u32.astype(fdt))


def test_a_row_value_hoisted_into_a_kernel_with_lanes():
  # (found by tests/fuzz_programs.py, seed 8001 program 394) a padded average pool's window count is a row value
  # computed once per row inside the kernel (rules/fusion.rules hoist_row_reduce) whose columns are upcast lanes: it
  # is computed outside the lanes, one value for all of them
  x = np.random.default_rng(0).standard_normal((24, 16)).astype(np.float32)
  p = np.pad(x, ((1, 1), (0, 0)))
  got = Tensor(x, device="CPU").avg_pool2d((3, 1), stride=(1, 1), padding=(1, 0)).numpy()
  np.testing.assert_allclose(got, (p[:-2] + p[1:-1] + p[2:]) / 3, rtol=1e-6, atol=1e-6)


def test_host_target_leaves_out_the_features_llvm_22_miscompiles():
  # see cpu_device._MISCOMPILED_FEATURES: LLVM 22.1 folds vpmov*2m + kmov into a vmovmsk that erases a mask register
  # still in use; without AVX512BW and DQ there is no vpmov*2m (and the features implying them are off too)
  import llvmlite.binding as llvm
  tm, _ = cpu_device._jit()
  mod = llvm.parse_assembly("""define void @f(ptr %p) {
    %a = load <4 x i64>, ptr %p
    %m = icmp slt <4 x i64> %a, zeroinitializer
    %b = load <16 x i8>, ptr %p
    %n = icmp slt <16 x i8> %b, zeroinitializer
    %s = select <4 x i1> %m, <4 x i64> %a, <4 x i64> zeroinitializer
    store <4 x i64> %s, ptr %p
    %t = select <16 x i1> %n, <16 x i8> %b, <16 x i8> zeroinitializer
    store <16 x i8> %t, ptr %p
    %mi = bitcast <4 x i1> %m to i4
    store i4 %mi, ptr %p
    %ni = bitcast <16 x i1> %n to i16
    store i16 %ni, ptr %p
    ret void
  }""")
  mod.triple, mod.data_layout = llvm.get_process_triple(), str(tm.target_data)
  assert not re.search(r"vpmov[bwdq]2m", tm.emit_assembly(mod))


def small_cnn_gradients():
  """The gradients of a small CNN's loss (a padded convolution, ReLU, max pool, linear layer, cross entropy) on the
  CPU in float32, and their values from the numpy reference (tests/autograd_reference.py)."""
  from tests import autograd_reference as ref
  rng = np.random.default_rng(21)
  labels = rng.integers(0, 3, 2)
  onehot = np.eye(3)[labels]
  data = {"x": rng.standard_normal((2, 2, 4, 4)), "wc": rng.standard_normal((3, 2, 3, 3)) * 0.5,
          "bc": rng.standard_normal(3) * 0.1, "wl": rng.standard_normal((12, 3)) * 0.5, "bl": rng.standard_normal(3) * 0.1}
  ts = {k: Tensor(v.astype(np.float32), device="CPU") for k, v in data.items()}
  act = ts["x"].conv2d(ts["wc"], ts["bc"], padding=1).relu().max_pool2d(2)
  logits = act.reshape(2, -1) @ ts["wl"] + ts["bl"]
  loss = -(logits.log_softmax(axis=1) * Tensor(onehot.astype(np.float32), device="CPU")).sum(axis=1).mean()
  _, want = ref.cnn_forward_backward(**data, onehot=onehot)
  return dict(zip(ts, loss.gradient(*ts.values()))), want


def _dirty_mask_launcher():
  """A function launching a compiled kernel like cpu_device._launch (one call), with every AVX-512 mask register
  k1-k7 set to all ones first: what a kernel finds there is whatever ran before it, and a correct one never reads it."""
  import ctypes
  import llvmlite.binding as llvm
  llvm.initialize_native_asmparser()   # for the inline assembly
  tm, ee = cpu_device._jit()
  made = {}
  def launch(prog, split, ptrs, work):
    n = len(ptrs)
    if n not in made:
      args = ", ".join(f"ptr %a{i}" for i in range(n))
      ir = (f"define void @dirty_masks_{n}(ptr %f, {args}, i64 %lo, i64 %hi) {{\n"
            '  call void asm sideeffect "' + "; ".join(f"kxnorw %k{i}, %k{i}, %k{i}" for i in range(1, 8)) + '", "~{k1},~{k2},~{k3},~{k4},~{k5},~{k6},~{k7}"()\n'
            f"  call void %f({args}, i64 %lo, i64 %hi)\n  ret void\n}}\n")
      mod = llvm.parse_assembly(ir)
      mod.triple, mod.data_layout = llvm.get_process_triple(), str(tm.target_data)
      ee.add_module(mod)
      ee.finalize_object()
      made[n] = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * (n + 1)), ctypes.c_int64, ctypes.c_int64)(
        ee.get_function_address(f"dirty_masks_{n}"))
    made[n](ctypes.cast(prog.fn, ctypes.c_void_p).value, *ptrs, 0, split if split is not None else 1)
  return launch


@pytest.mark.skipif("+avx512f" not in cpu_device.target_cpu()[1], reason="mask registers are AVX-512's")
def test_kernels_never_read_mask_registers_they_did_not_write(monkeypatch):
  # LLVM 22.1 with AVX512VL made the CNN's last-layer weight gradient, with these actions, read index lanes from a
  # mask register it never set (cpu_device._MISCOMPILED_FEATURES); every kernel here runs with those registers dirty
  from rulec.codegen.opt import kernel_key
  grads, want = small_cnn_gradients()
  kernel, = [k for k in grads["wl"].schedule() if tuple(r.src[0].arg for r in k.ranges) == (12, 3, 2)]
  monkeypatch.setenv("RULEC_OPT", kernel_key(decomposed(kernel)) + "=UPCAST(1,3) UPCAST(0,6) THREAD(0)")
  monkeypatch.setenv("RULEC_KERNEL_CACHE", "0")
  monkeypatch.setattr(cpu_device, "_by_ast", {})
  monkeypatch.setattr(cpu_device, "_launch", _dirty_mask_launcher())
  for name, g in grads.items():
    np.testing.assert_allclose(g.numpy(), want[name], rtol=1e-4, atol=1e-4 * np.abs(want[name]).max(), err_msg=name)
