"""The CL (OpenCL) device against the NUMPY reference device and numpy: every
cast pair, integer wrap and division edge cases, NaN and inf, bools, shifts
and powers, reductions, and small programs (softmax, layernorm, matmul, conv).

Skipped when pyopencl or an OpenCL device is missing
(`pip install pyopencl pocl-binary-distribution` gives a CPU device).
PoCL's kernel cache goes to a private temporary directory.
"""
import itertools
import operator
import os
import sys
import tempfile

import re

import ml_dtypes  # noqa: F401  (registers np.dtype("bfloat16"))
import numpy as np
import pytest

if "pyopencl" not in sys.modules:   # PoCL reads its cache directory when the platform starts
  os.environ["POCL_CACHE_DIR"] = tempfile.mkdtemp(prefix="rulec-test-pocl-")

pytest.importorskip("pyopencl", reason="the CL device needs pyopencl: pip install pyopencl pocl-binary-distribution")

from hypothesis import HealthCheck, given, settings   # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from rulec.codegen import opencl   # noqa: E402
from rulec.engine.ir.dtypes import dtypes   # noqa: E402
from rulec.engine.ir.ops import Ops   # noqa: E402
from rulec.engine.tensor import Tensor   # noqa: E402
from rulec.runtime import cl_device   # noqa: E402
from rulec.codegen.decomp import decomposed   # noqa: E402
from tests.helpers import on, same_as_reference   # noqa: E402

try: DEV = cl_device.get_device()
except cl_device.CLUnavailable as e: pytest.skip(f"no OpenCL device: {e}", allow_module_level=True)

DTS = [dtypes.bool, dtypes.uint8, dtypes.int8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32, dtypes.int64,
       dtypes.uint64, dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64]
if not DEV.target.fp64: DTS.remove(dtypes.float64)
NP = {d: np.dtype(d.np_name) for d in DTS}


def both(data, dtype, fn): return same_as_reference("CL", data, dtype, fn)


def sample(d, n=64, seed=0):
  rng = np.random.default_rng(seed)
  if d.kind == "b": return rng.integers(0, 2, n).astype(bool)
  if d.kind == "f":
    v = rng.standard_normal(n) * 100
    v[:10] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e30 if d is not dtypes.float16 else 6e4, -2.5, 2.5, 0.5, -1e-7]
    if d is dtypes.float64: v[10:12] = [3e19, -1.8446744073709552e19 - 4096.0]   # past int64: casts wrap modulo 2**64
    return v.astype(NP[d])
  info = np.iinfo(NP[d])
  v = rng.integers(info.min, info.max, n, dtype=NP[d], endpoint=True)
  v[:4] = [info.min, info.max, 0, 1]
  if d.kind == "i": v[4:6] = [-1, info.min + 1]
  return v


# *** casts ***

@pytest.mark.parametrize("src, dst", list(itertools.product(DTS, DTS)), ids=lambda d: d.name)
def test_every_cast_matches_the_reference(src, dst):
  x = sample(src)
  got = both(x, src, lambda t: t.cast(dst))
  if src.kind == "f" and dst.kind in "iu":   # where numpy defines the result (finite, in range), it agrees too
    info = np.iinfo(NP[dst])
    with np.errstate(all="ignore"): ok = np.isfinite(x) & (x >= info.min) & (x <= info.max)
    np.testing.assert_array_equal(got[ok], x[ok].astype(NP[dst]))
  elif not (src.kind == "f" and dst.kind == "f" and src.itemsize > dst.itemsize):
    with np.errstate(all="ignore"): np.testing.assert_array_equal(got, x.astype(NP[dst]))


def test_float_to_half_rounds_to_nearest_even_everywhere():
  # every finite half, and the floats around each midpoint between neighbouring halves (ties go to even)
  h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
  bits = h[np.isfinite(h)].view(np.uint32).astype(np.int64)
  cand = np.concatenate([bits + dx for dx in (-0x1001, -0x1000, -0xfff, -1, 0, 1, 0xfff, 0x1000, 0x1001)])
  x = cand.astype(np.uint32).view(np.float32)
  with np.errstate(all="ignore"): want = x.astype(np.float16)
  got = on("CL", x, dtypes.float32, lambda t: t.cast(dtypes.float16))
  np.testing.assert_array_equal(got.view(np.uint16)[~np.isnan(want)], want.view(np.uint16)[~np.isnan(want)])
  if DEV.target.fp64:
    got = on("CL", x.astype(np.float64) * (1 + 2.0 ** -30), dtypes.float64, lambda t: t.cast(dtypes.float16))
    with np.errstate(all="ignore"): want = (x.astype(np.float64) * (1 + 2.0 ** -30)).astype(np.float16)
    np.testing.assert_array_equal(got.view(np.uint16)[~np.isnan(want)], want.view(np.uint16)[~np.isnan(want)])


def test_constants_round_to_their_dtype():
  # constants past a dtype's range become inf; tiny ones round to subnormals or zero, as the reference rounds them
  for d, big, tiny in ((dtypes.float16, 7e4, 6e-8), (dtypes.bfloat16, 4e38, 5e-41), (dtypes.float32, 1e39, 1.4e-45),
                       (dtypes.float64, 1e308, 5e-324)):
    if d not in DTS: continue
    x = np.array([1, -2, 0.5, 3], NP[d])
    for fn in (lambda t: t * big, lambda t: t + big, lambda t: t * tiny, lambda t: t - 1e-300, lambda t: t.maximum(-big * 10)):
      both(x, d, fn)


def _keeps_nan_payloads() -> bool:
  """Whether float arithmetic on the device keeps a NaN's sign and payload (as x86 does, so numpy and PoCL do).
  NVIDIA GPUs return their one canonical NaN (0x7fffffff) from every float operation; OpenCL leaves NaN bits open."""
  x = np.array([0xfd55], np.uint16).view(np.float16)
  fn = lambda t: (t + 1).bitcast(dtypes.uint16)   # noqa: E731
  return int(on("CL", x, dtypes.float16, fn)[0]) == int(on("NUMPY", x, dtypes.float16, fn)[0])


def _same_bits_or_canonical_nan(got: np.ndarray, ref: np.ndarray):
  """Non-NaNs bit for bit; a NaN of the reference is a NaN here too, with its bits or the canonical NaN's."""
  fdt = {2: np.float16, 4: np.float32, 8: np.float64}[ref.itemsize]
  canonical = {2: 0x7fff, 4: 0x7fffffff, 8: 0x7fffffffffffffff}[ref.itemsize]
  nan = np.isnan(ref.view(fdt))
  np.testing.assert_array_equal(got[~nan], ref[~nan])
  assert np.isnan(got[nan].view(fdt)).all() and ((got[nan] == ref[nan]) | (got[nan] == canonical)).all(), (got, ref)


def test_half_nans_keep_their_bits():
  # float16 is held in float registers; loads, stores, casts and bitcasts keep a NaN's sign and payload as numpy does
  # (on devices whose compiler keeps NaN bits at all; elsewhere every NaN must come out as that device's one NaN)
  x = np.array([0x7c01, 0xfd55, 0x7e00, 0x7fff, 0xfe00, 0x3c00, 0x8001, 0x0001, 0x7c00, 0xfc00], np.uint16).view(np.float16)
  u16, u32, u64 = dtypes.uint16, dtypes.uint32, dtypes.uint64
  exact = _keeps_nan_payloads()
  def check(data, dtype, fn):
    if exact: return both(data, dtype, fn)
    _same_bits_or_canonical_nan(on("CL", data, dtype, fn), on("NUMPY", data, dtype, fn))
  for fn in (lambda t: t.bitcast(u16), lambda t: t.flip(0).contiguous().bitcast(u16), lambda t: (t + 1).bitcast(u16),
             lambda t: t.cast(dtypes.float32).bitcast(u32), lambda t: t.cast(dtypes.float32).cast(dtypes.float16).bitcast(u16),
             lambda t: t.bitcast(dtypes.int16).bitcast(dtypes.float16).bitcast(u16)):
    check(x, dtypes.float16, fn)
  if DEV.target.fp64:
    check(x, dtypes.float16, lambda t: t.cast(dtypes.float64).bitcast(u64))
    check(x, dtypes.float16, lambda t: t.cast(dtypes.float64).cast(dtypes.float16).bitcast(u16))
  f = np.array([0x7f800001, 0xffa00000, 0x7fc00001, 0x7fffffff, 0x7f802001], np.uint32).view(np.float32)
  check(f, dtypes.float32, lambda t: t.cast(dtypes.float16).bitcast(u16))


# *** integers ***

@pytest.mark.parametrize("d", [dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.int32, dtypes.uint32, dtypes.int64, dtypes.uint64],
                         ids=lambda d: d.name)
def test_integer_arithmetic_wraps_and_divides_like_numpy(d):
  a, b = sample(d, seed=1), sample(d, seed=2)
  b[6:10] = [0, 1, 0, 7]
  if d.kind == "i": b[10:12] = [-1, -1]
  with np.errstate(all="ignore"):
    for op in (operator.add, operator.sub, operator.mul):
      got = both(a, d, lambda t: op(t, Tensor(b, dtype=d, device=t.device)))
      np.testing.assert_array_equal(got, op(a, b))
    for op in (operator.floordiv, operator.mod):
      got = both(a, d, lambda t: op(t, Tensor(b, dtype=d, device=t.device)))
      nz = b != 0
      np.testing.assert_array_equal(got[nz], op(a, b)[nz])
      assert (got[~nz] == 0).all()
    both(a, d, lambda t: -t)
    both(a, d, lambda t: t.maximum(Tensor(b, dtype=d, device=t.device)))


@pytest.mark.parametrize("d", [dtypes.int8, dtypes.int32, dtypes.int64], ids=lambda d: d.name)
def test_int_min_divided_by_minus_one_wraps(d):
  lo = np.iinfo(NP[d]).min
  a = np.array([lo, 7, -7, lo, 0], NP[d])
  b = np.array([-1, -1, -1, 1, -1], NP[d])
  got = both(a, d, lambda t: t // Tensor(b, device=t.device))
  np.testing.assert_array_equal(got, [lo, -7, 7, lo, 0])
  got = both(a, d, lambda t: t % Tensor(b, device=t.device))
  np.testing.assert_array_equal(got, [0, 0, 0, 0, 0])
  for k in (-1, 0, 1, 3, -7, 64):   # constant divisors
    both(a, d, lambda t: t // k)
    both(a, d, lambda t: t % k)
  u = sample(dtypes.uint8, 16, seed=8)
  for k in (0, 1, 3, 255):
    both(u, dtypes.uint8, lambda t: t // k)
    both(u, dtypes.uint8, lambda t: t % k)


def test_shifts_and_integer_powers():
  a = np.array([1, -3, 7, 1 << 20, -1, 2], np.int32)
  n = np.array([0, 1, 31, 40, -2, 3], np.int32)
  both(a, dtypes.int32, lambda t: t << Tensor(n, device=t.device))
  both(a, dtypes.int32, lambda t: t >> Tensor(n, device=t.device))
  got = both(a, dtypes.int32, lambda t: t ** Tensor(np.array([0, 3, 2, 2, -3, 10], np.int32), device=t.device))
  assert got.tolist()[:2] == [1, -27] and got[4] == -1 and got[5] == 1024
  # narrow and unsigned types: shifts by the width and past it, negative amounts
  for d in (dtypes.int8, dtypes.uint8, dtypes.int64, dtypes.uint64):
    x = sample(d, 16, seed=9)
    k = np.array([0, 1, 3, d.bits - 1, d.bits, d.bits + 1, 2, 5] * 2, NP[d])
    if d.kind == "i": k[-3:] = [-1, -5, np.iinfo(NP[d]).min]
    both(x, d, lambda t: t << Tensor(k, device=t.device))
    both(x, d, lambda t: t >> Tensor(k, device=t.device))


@pytest.mark.parametrize("d", [dtypes.int8, dtypes.uint8, dtypes.int64, dtypes.uint64], ids=lambda d: d.name)
def test_integer_powers_wrap_like_numpy(d):
  a = sample(d, 32, seed=11)
  e = np.random.default_rng(12).integers(0, min(1000, int(np.iinfo(NP[d]).max) + 1), 32).astype(NP[d])
  e[:3] = [0, 1, (129 if d.kind == "u" else 127) if d.bits == 8 else 1 << 40]   # an unsigned exponent >= 128 is positive
  got = both(a, d, lambda t: t ** Tensor(e, device=t.device))
  np.testing.assert_array_equal(got, np.power(a, e))
  if d.kind == "i":   # negative exponents: 1/a**|e| truncated
    got = both(np.array([1, -1, -1, 2, 0, -2], NP[d]), d, lambda t: t ** Tensor(np.array([-3, -3, -4, -1, -2, -2], NP[d]), device=t.device))
    np.testing.assert_array_equal(got, [1, -1, 1, 0, 0, 0])


# *** floats ***

@pytest.mark.parametrize("d", [dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64], ids=lambda d: d.name)
def test_nan_and_inf_propagate(d):
  if d not in DTS: pytest.skip("no cl_khr_fp64")
  a = sample(d, seed=3)
  b = sample(d, seed=4)
  b[20:24] = [0.0, -0.0, 0.0, np.inf]
  a[20:24] = [np.nan, 1.0, -0.0, np.nan]
  with np.errstate(all="ignore"):
    for op in (operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv, operator.mod):
      # float // is floor(a / b) of the rounded quotient (engine/ir/alu.py, tinygrad), where numpy's float16 // may be
      # one less; a zero divisor gives the quotient's infinity or NaN either way
      ref = np.floor(np.true_divide(a, b)) if op is operator.floordiv else op(a, b)
      got = both(a, d, lambda t: op(t, Tensor(b, dtype=d, device=t.device)))
      np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
      fin = np.isfinite(ref)
      np.testing.assert_allclose(got[fin], ref[fin], rtol={dtypes.float16: 1e-3, dtypes.bfloat16: 1e-2}.get(d, 1e-6))
    got = both(a, d, lambda t: t.maximum(Tensor(b, dtype=d, device=t.device)))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(np.maximum(a, b)))
    assert np.isnan(both(a, d, lambda t: t.sum()).item()) and np.isnan(both(a, d, lambda t: t.max()).item())
    for fn in (lambda t: t.trunc(), lambda t: t.floor(), lambda t: t.ceil(), lambda t: -t, lambda t: t.abs(), lambda t: t.relu(),
               lambda t: t.sqrt(), lambda t: t.reciprocal(), lambda t: t.where(t, Tensor(b, dtype=d, device=t.device))):
      both(a, d, fn)
    both(a, d, lambda t: t < Tensor(b, dtype=d, device=t.device))
    both(a, d, lambda t: t == Tensor(b, dtype=d, device=t.device))
    both(a, d, lambda t: t != Tensor(b, dtype=d, device=t.device))


@pytest.mark.parametrize("d", [dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64], ids=lambda d: d.name)
@pytest.mark.parametrize("fn", ["exp2", "log2", "sin", "pow"])
def test_transcendentals_are_close_to_correctly_rounded(d, fn):
  if d not in DTS: pytest.skip("no cl_khr_fp64")
  rng = np.random.default_rng(13)
  x = (rng.standard_normal(4096) * (8 if fn != "log2" else 1e3)).astype(NP[d])
  y = (rng.standard_normal(4096) * 3).astype(NP[d])
  if fn == "log2": x = np.abs(x)
  x[:6] = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0]
  tensor_fn = {"exp2": lambda t: t.exp2(), "log2": lambda t: t.log2(), "sin": lambda t: t.sin(),
               "pow": lambda t: t ** Tensor(y, dtype=d, device=t.device)}[fn]
  np_fn = {"exp2": np.exp2, "log2": np.log2, "sin": np.sin, "pow": lambda v: np.power(v, y.astype(np.float64))}[fn]
  got = on("CL", x, d, tensor_fn)
  with np.errstate(all="ignore"): exact = np_fn(x.astype(np.float64)).astype(NP[d])   # (to float64's accuracy)
  same = (got == exact) | (np.isnan(got) & np.isnan(exact))
  if d is dtypes.float64:   # the device's libm: within a few ulp
    np.testing.assert_allclose(got[~same], exact[~same], rtol=1e-14)
  elif fn == "exp2" and d is dtypes.float32 and Ops.EXP2 in cl_device.get_device().optional:
    # a CPU device's exp2 is the float32 decomposition (rules/decomp.rules): within its ulp budget, specials exact
    from tests.codegen.test_decomp_exp import ULP_BUDGET, ulps
    finite = np.isfinite(exact) & (exact != 0)
    assert same[~finite].all(), f"x={x[~finite & ~same][:4]}: {got[~finite & ~same][:4]} vs {exact[~finite & ~same][:4]}"
    with np.errstate(all="ignore"): err = ulps(got[finite], np.exp2(x[finite].astype(np.float64)))
    assert err.max() <= ULP_BUDGET["exp2"], f"exp2({x[finite][err.argmax()]!r}): {err.max():.3f} ulp"
  else:   # float32 and float16: computed in double, rounded once
    assert same.all(), f"{(~same).sum()} of {same.size} differ, e.g. x={x[~same][:4]}: {got[~same][:4]} vs {exact[~same][:4]}"


# *** bools ***

def test_bool_ops():
  a, b = sample(dtypes.bool, seed=5), sample(dtypes.bool, seed=6)
  for op in (operator.and_, operator.or_, operator.xor, operator.eq, operator.ne, operator.lt):
    np.testing.assert_array_equal(both(a, dtypes.bool, lambda t: op(t, Tensor(b, device=t.device))), op(a, b))
  np.testing.assert_array_equal(both(a, dtypes.bool, lambda t: t + Tensor(b, device=t.device)), a + b)
  np.testing.assert_array_equal(both(a, dtypes.bool, lambda t: t * Tensor(b, device=t.device)), a * b)
  np.testing.assert_array_equal(both(a, dtypes.bool, lambda t: t.maximum(Tensor(b, device=t.device))), np.maximum(a, b))
  np.testing.assert_array_equal(both(a, dtypes.bool, lambda t: ~t), ~a)
  np.testing.assert_array_equal(both(a, dtypes.bool, lambda t: (t.reshape(8, 8) @ Tensor(b, device=t.device).reshape(8, 8))),
                                a.reshape(8, 8) @ b.reshape(8, 8))
  assert both(a, dtypes.bool, lambda t: t.any()).item() and not both(a, dtypes.bool, lambda t: t.all()).item()


# *** reductions and programs ***

def _input_grad(device: str, x: np.ndarray, w: np.ndarray, g: np.ndarray) -> np.ndarray:
  tx = Tensor(x, device=device, requires_grad=True)
  (tx.conv2d(Tensor(w, device=device), padding=1) * Tensor(g, device=device)).sum().backward()
  return tx.grad.numpy()


@pytest.mark.parametrize("tile", [None, "UPCAST(1,4) UPCAST(3,4) LOCAL(3,2) LOCAL(1,2)"])
def test_a_padded_convolutions_input_gradient_skips_the_padding_exactly(tile, monkeypatch):
  """The input gradient sums where(inside, g * w, 0) (the padding guards the product; in a register tile one fma of
  two guarded operands per lane): exact, so inf weights whose taps fall in the padding for the last image row add
  nothing there (torch gives finite values too), as on the NUMPY device, where the guard on one operand would give
  0 * inf = NaN; finite values agree with NUMPY to rounding, with or without the tile."""
  rng = np.random.default_rng(5)
  x, w = rng.standard_normal((2, 8, 6, 8)).astype(np.float32), rng.standard_normal((8, 8, 3, 3)).astype(np.float32)
  g = rng.standard_normal((2, 8, 6, 8)).astype(np.float32)
  w_inf, g_last = w.copy(), np.zeros_like(g)
  w_inf[:, :, 0, :] = np.inf     # (the taps that read the row below: padding for the last row)
  g_last[:, :, 5, :] = 1.0       # (only the last row has a gradient: its taps kh = 0 fall in the padding)
  if tile:
    tx = Tensor.empty(2, 8, 6, 8, device="CL", requires_grad=True)
    (tx.conv2d(Tensor.empty(8, 8, 3, 3, device="CL"), padding=1) * Tensor.empty(2, 8, 6, 8, device="CL")).sum().backward()
    from rulec.codegen.opt import kernel_key
    big = max(tx.grad.schedule(), key=lambda k: len(k.ast.ranges))
    monkeypatch.setenv("RULEC_OPT", f"{kernel_key(decomposed(big, cl_device.get_device().optional))}={tile}")
    cl_device._by_ast.clear()
    src = cl_device.render(big).source
    assert re.search(r"fma\(v\d+ \? v\d+ : [^,]+, v\d+ \? v\d+ : ", src), "the tile's guarded products"
  got, ref = _input_grad("CL", x, w, g), _input_grad("NUMPY", x, w, g)
  np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
  got, ref = _input_grad("CL", x, w_inf, g_last), _input_grad("NUMPY", x, w_inf, g_last)
  assert np.isfinite(got[:, :, 5]).all() and not np.isfinite(got[:, :, 4]).any()
  np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


@settings(max_examples=25)
@given(st.integers(1, 70), st.integers(1, 70))
def test_reductions_agree_with_numpy(rows, cols):
  x = np.random.default_rng(rows * 100 + cols).standard_normal((rows, cols)).astype(np.float32)
  e = np.exp(x - x.max(-1, keepdims=True))
  for fn, ref in ((lambda t: t.sum(1), x.sum(1)), (lambda t: t.max(0), x.max(0)), (lambda t: t.softmax(-1), e / e.sum(-1, keepdims=True))):
    np.testing.assert_allclose(on("CL", x, dtypes.float32, fn), ref, rtol=2e-5, atol=1e-5)


@pytest.mark.parametrize("n", [15, 16, 17, 64, 71])
def test_float_reductions_in_lanes_keep_nan_inf_and_max_exact(n):
  # float reduces of 16+ elements run as 8 interleaved accumulators (codegen/opencl.py): every element counts once
  rng = np.random.default_rng(n)
  x = rng.standard_normal((3, n)).astype(np.float32)
  x[1, n - 1] = np.inf
  x[2, n // 2] = np.nan
  for fn in (lambda t: t.sum(1), lambda t: t.prod(1), lambda t: t.mean(1)):
    got, ref = on("CL", x, dtypes.float32, fn), on("NUMPY", x, dtypes.float32, fn)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
  for fn in (lambda t: t.max(1), lambda t: t.min(1), lambda t: (t * 0 + 1).sum(1), lambda t: t.argmax(1)):
    both(x, dtypes.float32, fn)
  h = (rng.standard_normal((2, n)) * 4).astype(np.float16)
  np.testing.assert_allclose(on("CL", h, dtypes.float16, lambda t: t.sum(1)).astype(np.float32),
                             h.astype(np.float32).sum(1), rtol=1e-2, atol=2e-2)
  both(h, dtypes.float16, lambda t: t.max(1))


@pytest.mark.parametrize("d", [dtypes.int8, dtypes.uint8, dtypes.int32, dtypes.int64, dtypes.bool], ids=lambda d: d.name)
def test_integer_reductions_are_exact(d):
  x = sample(d, 60, seed=14).reshape(6, 10)
  for fn in (lambda t: t.sum(1), lambda t: t.max(0), lambda t: t.min(1), lambda t: t.prod(0), lambda t: t.sum()):
    both(x, d, fn)


def test_small_programs_agree_with_numpy():
  rng = np.random.default_rng(15)
  x = rng.standard_normal((4, 6, 8)).astype(np.float32)
  got = on("CL", x, dtypes.float32, lambda t: t.layernorm(-1))   # float sums: by rounding, not bit for bit
  mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
  np.testing.assert_allclose(got, (x - mu) / np.sqrt(var + 1e-5), rtol=1e-4, atol=1e-5)
  a, b = rng.standard_normal((17, 33)).astype(np.float32), rng.standard_normal((33, 9)).astype(np.float32)
  got = on("CL", a, dtypes.float32, lambda t: t @ Tensor(b, device="CL"))
  np.testing.assert_allclose(got, a @ b, rtol=1e-4, atol=1e-4)
  ai, bi = rng.integers(-50, 50, (7, 5)).astype(np.int32), rng.integers(-50, 50, (5, 3)).astype(np.int32)
  np.testing.assert_array_equal(both(ai, dtypes.int32, lambda t: t @ Tensor(bi, device=t.device)), ai @ bi)
  img, w = rng.standard_normal((2, 3, 9, 9)).astype(np.float32), rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
  got = on("CL", img, dtypes.float32, lambda t: t.conv2d(Tensor(w, device="CL"), padding=1, stride=2).relu())
  ref = on("NUMPY", img, dtypes.float32, lambda t: t.conv2d(Tensor(w, device="NUMPY"), padding=1, stride=2).relu())
  np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
  got = on("CL", img, dtypes.float32, lambda t: t.max_pool2d(2))
  np.testing.assert_array_equal(got, on("NUMPY", img, dtypes.float32, lambda t: t.max_pool2d(2)))
  h = rng.standard_normal((5, 40)).astype(np.float16)
  got = on("CL", h, dtypes.float16, lambda t: t.softmax(-1))
  np.testing.assert_allclose(got.astype(np.float32), on("NUMPY", h, dtypes.float16, lambda t: t.softmax(-1)).astype(np.float32),
                             rtol=1e-2, atol=1e-3)


def test_padding_reads_outside_the_buffer_safely():
  x = np.arange(1, 13, dtype=np.int32).reshape(3, 4)
  got = both(x, dtypes.int32, lambda t: t.pad(((2, 3), (1, 5))).sum(0)[3:7] + t.flip(1).pad(((0, 0), (4, 0)))[:, 2:6].sum(0))
  np.testing.assert_array_equal(got, np.pad(x, ((2, 3), (1, 5))).sum(0)[3:7] + np.pad(x[:, ::-1], ((0, 0), (4, 0)))[:, 2:6].sum(0))
  both(x, dtypes.int32, lambda t: t.pad(((1, 1), (1, 1)), value=-7).max_pool2d(2))


def test_empty_tensors_and_partial_assigns():
  e = np.zeros((0, 3), np.float32)
  assert on("CL", e, dtypes.float32, lambda t: (t + 1).sum(0)).tolist() == [0.0, 0.0, 0.0]
  assert on("CL", e, dtypes.float32, lambda t: t * 2).shape == (0, 3)
  t = Tensor(np.arange(10, dtype=np.int64), device="CL")
  t[2:5] = Tensor(np.array([-1, -2, -3], np.int64), device="CL")   # a store into part of a buffer keeps the rest
  assert t.numpy().tolist() == [0, 1, -1, -2, -3, 5, 6, 7, 8, 9]
  t.assign(t * 3 + 1).realize()
  assert t.numpy().tolist() == [1, 4, -2, -5, -8, 16, 19, 22, 25, 28]


def test_a_big_kernel_spans_many_work_groups():
  x = np.random.default_rng(16).standard_normal((300, 1001)).astype(np.float32)
  got = on("CL", x, dtypes.float32, lambda t: (t * 2 + 1).relu())
  np.testing.assert_array_equal(got, np.maximum(x * 2 + 1, 0))
  np.testing.assert_allclose(on("CL", x, dtypes.float32, lambda t: t.sum(1)), x.sum(1), rtol=1e-4, atol=1e-4)


# *** the device ***

def test_a_kernel_is_compiled_once():
  x = np.ones((3, 5), np.float32)
  Tensor(x, device="CL").exp().sum(0).numpy()
  before = cl_device.COUNTERS["compiled"]
  Tensor(x * 2, device="CL").exp().sum(0).numpy()
  assert cl_device.COUNTERS["compiled"] == before


def test_work_sizes_come_from_the_device_limits():
  for shape in [(1,), (3, 7), (1000, 3), (4099,)]:
    t = Tensor(np.ones(shape, np.float32), device="CL") + 1
    (k,) = t.schedule()
    prog = cl_device.compile_kernel(k)
    n = prog.rendered.global_size
    assert n == int(np.prod(shape)) and prog.global_ >= n and prog.global_ % prog.local == 0
    assert prog.local <= min(DEV.max_work_group, DEV.max_item0) and prog.global_ - n < prog.local
    assert -(-n // prog.local) >= min(DEV.units, n)    # every compute unit gets a work-group when there is work for it


def test_a_build_failure_shows_the_source_and_the_log():
  bad = opencl.Rendered("__kernel void rulec_kernel(__global float* p0) { p0[0] = undefined_name; }\n", "rulec_kernel", 1, ())
  with pytest.raises(cl_device.CLBuildError) as e:
    cl_device.Program(DEV, bad)
  msg = str(e.value)
  assert "--- source ---" in msg and "undefined_name" in msg and "--- build log ---" in msg


def test_unsupported_dtypes_raise_clearly():
  with pytest.raises(NotImplementedError, match="void"): opencl.ctype(dtypes.void)
  (k,) = (Tensor(np.ones(3), dtype=dtypes.float64, device="CL") + 1).schedule()
  with pytest.raises(NotImplementedError, match="cl_khr_fp64"):
    opencl.render(decomposed(k), opencl.Target(fp64=False))
  # float16 needs no cl_khr_fp16: it is stored as half and computed in float
  assert "half" in cl_device.render((Tensor(np.ones(3), dtype=dtypes.float16, device="CL") + 1).schedule()[0]).source
  # bfloat16 needs no extension either: stored as its bits, computed in float, converted with integer code
  src = cl_device.render((Tensor(np.ones(3), dtype=dtypes.bfloat16, device="CL") + 1).schedule()[0]).source
  assert "ushort" in src and "half" not in src and "cl_khr" not in src


def test_a_missing_device_says_how_to_get_one(monkeypatch):
  import pyopencl as cl
  with pytest.raises(cl_device.CLUnavailable, match="RULEC_CL_DEVICE=999"): cl_device.CLDevice(999)

  def no_platform(): raise cl.LogicError("clGetPlatformIDs failed: PLATFORM_NOT_FOUND_KHR")
  monkeypatch.setattr(cl, "get_platforms", no_platform)
  with pytest.raises(cl_device.CLUnavailable, match="no OpenCL platform found.*pip install pocl-binary-distribution"):
    cl_device.all_devices()


def test_a_device_without_fp64_gets_float_code():
  # float32 transcendentals fall back to the float builtins; nothing mentions double
  x = Tensor(np.ones((4, 4)), dtype=dtypes.float32, device="CL")
  h = Tensor(np.ones((4, 4)), dtype=dtypes.float16, device="CL")
  b = Tensor(np.ones((4, 4)), dtype=dtypes.bfloat16, device="CL")
  for t in (x.exp2().sin().log2() ** x, (h.exp2() ** h).sum(1), x.cast(dtypes.int64) // 3, (b.exp2() ** b).sum(1),
            x.cast(dtypes.int64).cast(dtypes.bfloat16) + b):
    for k in t.schedule():
      r = opencl.render(decomposed(k), opencl.Target(fp64=False))
      assert "double" not in r.source and "fp64" not in r.source
      cl_device.Program(DEV, r)   # builds


# *** kernels built by hand: shapes the scheduler does not make today ***

def _hand_kernels(device):
  from rulec.engine.ir.ops import Ops
  from rulec.engine.ir.uop import UOp
  from rulec.runtime.buffer import buffer_of, new_buffer
  from rulec.engine.ir.kernel import Kernel

  def buf(arr, dt):
    b = new_buffer(device, arr.size, dt)
    buffer_of(b).copyin(arr)
    return b
  x = np.arange(-12, 36, dtype=np.float32) / 4
  ins, mid, out, scal = buf(x, dtypes.float32), buf(np.zeros(6, np.float32), dtypes.float32), \
    buf(np.zeros(6, np.float32), dtypes.float32), buf(np.zeros(1, np.int32), dtypes.int32)
  bufs = (mid, out, ins, scal)
  pm, po, pi, ps = (UOp(Ops.PARAM, b.dtype, (), (i, b.arg[2])) for i, b in enumerate(bufs))
  r0, r1, r2, r3, r4 = (UOp.range(n, i) for i, n in enumerate((6, 8, 6, 2, 4)))
  red = lambda v, op, *rs: UOp(Ops.REDUCE, v.dtype, (v, *rs), op)
  # store 1: mid[i] = sum_j x[i*8+j]; store 2 (reads store 1's output): out[i] = max over (a, b) of mid[i] * x[a*4+b]
  # minus the sum over j of a nested reduce; store 3, no ranges: scal[0] = 42
  s1 = pm.index(r0).store(red(pi.index(r0 * 8 + r1), Ops.ADD, r1)).end(r0)
  inner = red(pi.index(r3 * 4 + r4), Ops.ADD, r4)
  s2 = po.index(r2).store(red(pm.index(r2) * pi.index(r3 * 4 + r4), Ops.MAX, r3, r4) - red(inner, Ops.ADD, r3)).end(r2)
  s3 = ps.index(UOp.const(dtypes.index, 0)).store(UOp.const(dtypes.int32, 42))
  return Kernel(UOp.sink(s1, s2, s3), bufs), bufs


def test_a_kernel_with_several_stores_runs_them_in_order():
  from rulec.runtime.buffer import buffer_of
  from rulec.runtime.devices import run_kernel
  got = {}
  for device in ("CL", "NUMPY"):
    k, bufs = _hand_kernels(device)
    run_kernel(k, device)
    got[device] = [buffer_of(b).numpy_view().copy() for b in bufs]
  for a, b in zip(got["CL"], got["NUMPY"]): np.testing.assert_allclose(a, b, rtol=1e-6)
  assert got["CL"][3].tolist() == [42]
  prog = cl_device.compile_kernel(_hand_kernels("CL")[0])
  assert prog.rendered.global_size == 1 and prog.global_ == 1   # several stores: one work-item runs them in order


def _storage(t: Tensor):
  from rulec.runtime.buffer import buffer_of
  u = t.uop
  return buffer_of(u if u.op.name == "BUFFER" else u.src[0])


def test_buffers_stay_on_the_device_and_move_only_when_another_side_reads():
  x = np.arange(12, dtype=np.float32).reshape(3, 4)
  c0 = dict(cl_device.COUNTERS)
  a = Tensor(x, device="CL")
  b = (a * 2).realize()
  assert cl_device.COUNTERS["uploads"] - c0["uploads"] == 1          # a went up once
  assert not _storage(b).host_valid and _storage(b).mirror.valid     # b lives on the device only
  c = (b + 1).realize()
  assert cl_device.COUNTERS["uploads"] - c0["uploads"] == 1 and cl_device.COUNTERS["downloads"] == c0["downloads"]
  np.testing.assert_array_equal(c.numpy(), x * 2 + 1)
  assert cl_device.COUNTERS["downloads"] - c0["downloads"] == 1
  np.testing.assert_array_equal(c.numpy(), x * 2 + 1)                # the host copy is current now: no second download
  assert cl_device.COUNTERS["downloads"] - c0["downloads"] == 1
  # CL -> CPU -> CL: the CPU kernel reads b's data from the device, the CL kernel sees the CPU's result
  d = (b.to("CPU") * 3).realize()
  e = (d.to("CL") - 1).realize()
  np.testing.assert_array_equal(e.numpy(), x * 6 - 1)
  # a host write makes the device copy stale: the next CL kernel sees the new contents
  _storage(a).numpy_view()[:] = 5
  np.testing.assert_array_equal((a + 1).numpy(), np.full((3, 4), 6, np.float32))
  # an assign on the device writes the device copy; the host sees it on the next read
  a.assign(a * 10).realize()
  np.testing.assert_array_equal(a.numpy(), np.full((3, 4), 50, np.float32))


# *** group reductions (what GPUs run; forced on here) ***

@pytest.fixture
def group_reductions():
  """Kernels rendered with work-group reductions of up to 64 work-items, as on a GPU (PoCL runs them too)."""
  import attrs
  old = DEV.target
  DEV.target = attrs.evolve(old, group=64)
  cl_device._by_ast.clear()
  yield
  DEV.target = old
  cl_device._by_ast.clear()


def test_group_reductions_are_used_and_agree_with_numpy(group_reductions):
  x = np.random.default_rng(21).standard_normal((5, 300)).astype(np.float32)
  src = cl_device.render(Tensor.schedule(Tensor(x, device="CL").sum(1))[0]).source
  assert "barrier(CLK_LOCAL_MEM_FENCE)" in src and "__local float" in src
  np.testing.assert_allclose(on("CL", x, dtypes.float32, lambda t: t.sum(1)), x.sum(1), rtol=1e-5, atol=1e-5)


@settings(max_examples=30, suppress_health_check=[HealthCheck.function_scoped_fixture])   # the fixture holds for all
@given(st.integers(1, 9), st.integers(1, 600), st.sampled_from(["sum1", "max1", "sum0", "softmax", "layernorm", "sum", "argmax"]))
def test_group_reductions_agree_with_numpy_for_any_shape(group_reductions, rows, cols, fn):
  # shapes below, at and above the thresholds (32 elements, 4 per work-item), sizes not multiples of the group
  x = np.random.default_rng(rows * 1000 + cols).standard_normal((rows, cols)).astype(np.float32)
  x[0, cols // 2] = 7.5   # a unique maximum for argmax
  f = {"sum1": lambda t: t.sum(1), "max1": lambda t: t.max(1), "sum0": lambda t: t.sum(0), "softmax": lambda t: t.softmax(-1),
       "layernorm": lambda t: t.layernorm(-1), "sum": lambda t: t.sum(), "argmax": lambda t: t.argmax(1)}[fn]
  got, ref = on("CL", x, dtypes.float32, f), on("NUMPY", x, dtypes.float32, f)
  if fn in ("max1", "argmax"): np.testing.assert_array_equal(got, ref)
  else: np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * max(1, cols) ** 0.5)


@pytest.mark.parametrize("d", [dtypes.int8, dtypes.int32, dtypes.uint64, dtypes.float16, dtypes.bfloat16, dtypes.bool],
                         ids=lambda d: d.name)
def test_group_reductions_keep_exact_integer_and_half_semantics(group_reductions, d):
  x = sample(d, 3 * 200, seed=22).reshape(3, 200)
  for fn in (lambda t: t.sum(1), lambda t: t.max(1), lambda t: t.min(1)):
    if d.is_half:
      np.testing.assert_allclose(on("CL", x, d, fn).astype(np.float32), on("NUMPY", x, d, fn).astype(np.float32),
                                 rtol=1e-2, atol=0.5)
    else: both(x, d, fn)


def test_vector_loads_and_stores_in_contiguous_elementwise_kernels(monkeypatch):
  # Target.vector (GPUs; forced here): aligned float4 loads and stores where every access indexes the kernel's one range
  import attrs
  monkeypatch.setattr(DEV, "target", attrs.evolve(DEV.target, vector=4))
  cl_device._by_ast.clear()
  try:
    rng = np.random.default_rng(23)
    a, b = rng.standard_normal(8192).astype(np.float32), rng.standard_normal(8192).astype(np.float32)
    a[:4] = [np.nan, np.inf, -0.0, 3]
    for f in (lambda x, y: (x * y + 1).relu(), lambda x, y: x.maximum(y) / (y + 2), lambda x, y: (x < y).where(x, -y),
              lambda x, y: x.sqrt() - y):
      t = f(Tensor(a, device="CL"), Tensor(b, device="CL"))
      assert "float4*)p1)[wid]" in cl_device.render(t.schedule()[0]).source
      both(np.stack([a, b]), dtypes.float32, lambda s: f(s[0], s[1]))
    i = rng.integers(-1000, 1000, 4096 * 3).astype(np.int32)
    both(i, dtypes.int32, lambda t: t * 3 // 7 + (t % 5))   # int32: vectors of int, the same wrap and floor semantics
    # not vectorised: a broadcast load, a bool store, a size that is not a multiple of 4
    for t, ref in ((Tensor(a, device="CL").reshape(64, 128) + Tensor(b[:128], device="CL"), a.reshape(64, 128) + b[:128]),
                   (Tensor(a, device="CL") < 0, a < 0), (Tensor(a[:8191], device="CL") + 1, a[:8191] + np.float32(1))):
      assert "4*)" not in cl_device.render(t.schedule()[0]).source
      np.testing.assert_array_equal(t.numpy(), ref)
  finally:
    cl_device._by_ast.clear()


def test_big_reductions_split_into_the_devices_number_of_parts(monkeypatch):
  import attrs
  monkeypatch.setattr(DEV, "target", attrs.evolve(DEV.target, grid=0))   # (a GPU reduces one value in one launch)
  monkeypatch.setattr(DEV, "split_parts", 4096)   # what a GPU asks for; at most sqrt(size) parts
  x = np.random.default_rng(24).standard_normal(1 << 22).astype(np.float32)
  t = Tensor(x, device="CL").sum()
  assert [k.bufs[0].arg[2] for k in t.schedule()] == [2048, 1]
  np.testing.assert_allclose(t.numpy(), x.sum(dtype=np.float64), rtol=1e-5, atol=1e-3)
  monkeypatch.setattr(DEV, "split_parts", 256)    # a CPU device
  assert [k.bufs[0].arg[2] for k in Tensor(x, device="CL").sum().schedule()] == [256, 1]


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_a_column_sum_on_a_gpu_splits_into_parts_a_product_does_not(monkeypatch, dtype):
  # a bias's gradient: 8192 rows into 48 columns. On a GPU (split_parts in the thousands) a sum over leading axes that
  # keeps the last one is split from early.GPU_COLUMN_SPLIT steps an output (each column's work-group read it a row
  # apart); a matmul's weight gradient, a sum of products over the same rows, is not; nor either on a CPU's count
  from rulec.engine.sched import cache as schedule_cache
  from rulec.engine.sched import early
  monkeypatch.setattr(DEV, "split_parts", 4096)
  x = np.random.default_rng(36).standard_normal((8, 1024, 48)).astype(dtype)
  a = np.random.default_rng(37).standard_normal((8192, 24)).astype(dtype)
  def kernels(t): return [k.bufs[0].arg[2] for k in t.schedule()]
  schedule_cache.clear()
  t = Tensor(x, device="CL").float().sum((0, 1))
  assert len(kernels(t)) == 2
  np.testing.assert_allclose(t.numpy(), x.astype(np.float64).sum((0, 1)), rtol=1e-4, atol=1e-3)
  w = Tensor(a, device="CL").T @ Tensor(x.reshape(8192, 48), device="CL")
  assert len(kernels(w)) == 1
  np.testing.assert_allclose(w.numpy().astype(np.float64), a.astype(np.float64).T @ x.reshape(8192, 48).astype(np.float64),
                             rtol=2e-2 if dtype is np.float16 else 1e-4, atol=0.5 if dtype is np.float16 else 1e-2)
  monkeypatch.setattr(early, "GPU_COLUMN_SPLIT", 0)
  schedule_cache.clear()
  assert len(kernels(Tensor(x, device="CL").float().sum((0, 1)))) == 1
  monkeypatch.setattr(early, "GPU_COLUMN_SPLIT", 4096)
  monkeypatch.setattr(DEV, "split_parts", 256)
  schedule_cache.clear()
  assert len(kernels(Tensor(x, device="CL").float().sum((0, 1)))) == 1


# *** one-pass reductions of one value (GRID: what GPUs run; forced on here) ***

@pytest.fixture
def grid_reductions():
  """Work-group reductions of up to 64 work-items, and a reduction to one value shared by up to 8 work-groups in
  one launch (the last to finish combines the partial results), as on a GPU."""
  import attrs
  old = DEV.target
  DEV.target = attrs.evolve(old, group=64, grid=8)
  cl_device._by_ast.clear()
  yield
  DEV.target = old
  cl_device._by_ast.clear()


def _one_kernel_with_grid(t) -> str:
  (k,) = t.schedule()
  src = cl_device.render(k).source
  assert "atomic_inc(grid_count)" in src
  return src


def test_a_big_reduction_to_one_value_is_one_kernel_shared_by_several_work_groups(grid_reductions):
  x = np.random.default_rng(40).standard_normal(1 << 16).astype(np.float32)
  t = Tensor(x, device="CL").sum()
  src = _one_kernel_with_grid(t)
  assert "8 work-groups of 64 share the reduction" in src
  np.testing.assert_allclose(t.numpy(), x.sum(dtype=np.float64), rtol=1e-5, atol=1e-3)
  # the counter is set back for the next launch: the same program again, on other data, is right every time
  for seed in range(3):
    y = np.random.default_rng(seed).standard_normal(1 << 16).astype(np.float32)
    np.testing.assert_allclose(Tensor(y, device="CL").sum().numpy(), y.sum(dtype=np.float64), rtol=1e-5, atol=1e-3)


_GRID_PROGRAMS = {
  "sum": lambda t: t.sum(), "mean": lambda t: (t * 2 - 1).mean(), "max": lambda t: t.max(), "min": lambda t: t.min(),
  "sum_sq": lambda t: (t * t).sum().sqrt(), "var": lambda t: t.var(), "strided": lambda t: t[::2].sum(),
  "rows_cols": lambda t: t.reshape(-1, 8).permute(1, 0).sum(), "argmax": lambda t: t.argmax(),
}


@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(st.sampled_from([8 * 1024, 12 * 1024, 40 * 1024, 7 * 8 * 1024, 1 << 17]), st.sampled_from(sorted(_GRID_PROGRAMS)))
def test_one_pass_reductions_agree_with_numpy_for_any_size(grid_reductions, n, name):
  x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
  x[n // 3] = 9.5   # a unique maximum for argmax
  f = _GRID_PROGRAMS[name]
  got, ref = on("CL", x, dtypes.float32, f), on("NUMPY", x, dtypes.float32, f)
  if name in ("max", "min", "argmax"): np.testing.assert_array_equal(got, ref)
  else: np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("d", [dtypes.int8, dtypes.int32, dtypes.uint32, dtypes.int64, dtypes.float16, dtypes.bfloat16,
                               dtypes.float64], ids=lambda d: d.name)
def test_one_pass_reductions_keep_exact_integer_and_half_semantics(grid_reductions, d):
  x = sample(d, 1 << 15, seed=41)
  if d.kind in "iu": x = x % 100 if d.kind == "u" else x % 50 - 25   # (sums that fit)
  for fn in (lambda t: t.sum(), lambda t: t.max(), lambda t: t.min()):
    _one_kernel_with_grid(fn(Tensor(x, device="CL")))
    if d.is_half:
      np.testing.assert_allclose(on("CL", x, d, fn).astype(np.float32), on("NUMPY", x, d, fn).astype(np.float32),
                                 rtol=1e-2, atol=0.5)
    elif d.kind == "f":
      np.testing.assert_allclose(on("CL", x, d, fn), on("NUMPY", x, d, fn), rtol=1e-6, equal_nan=True)
    else: both(x, d, fn)


def test_grid_takes_any_divisor_and_a_prime_size_stays_one_group(grid_reductions):
  # 7 * 4099 (prime): no part size from 8 up divides it, so the scheduler cannot split it; GRID takes 7 groups
  x = np.random.default_rng(42).standard_normal(7 * 4099).astype(np.float32)
  t = Tensor(x, device="CL").sum()
  assert "7 work-groups of 64 share the reduction" in _one_kernel_with_grid(t)
  np.testing.assert_allclose(t.numpy(), x.sum(dtype=np.float64), rtol=1e-5, atol=1e-3)
  p = np.random.default_rng(44).standard_normal(28657).astype(np.float32)   # a prime: one work-group does it all
  t = Tensor(p, device="CL").sum()
  assert all("atomic_inc" not in cl_device.render(k).source for k in t.schedule())
  np.testing.assert_allclose(t.numpy(), p.sum(dtype=np.float64), rtol=1e-5, atol=1e-3)


def test_grid_is_an_action_a_user_can_force_and_it_is_refused_where_it_cannot_apply(grid_reductions, monkeypatch):
  from rulec.codegen.opt import OptError, kernel_key
  x = np.random.default_rng(43).standard_normal((6, 4096)).astype(np.float32)
  (k,) = Tensor(x, device="CL").sum().schedule()
  monkeypatch.setenv("RULEC_OPT", f"{kernel_key(k)}=GROUP(32) GRID(3)")
  cl_device._by_ast.clear()
  assert "3 work-groups of 32 share the reduction" in cl_device.render(k).source
  np.testing.assert_allclose(Tensor(x, device="CL").sum().numpy(), x.sum(dtype=np.float64), rtol=1e-5, atol=1e-3)
  for bad, why in (("GRID(4)", "comes after GROUP"), ("GROUP(32) GRID(5)", "no reduce range has a size that 5 divides")):
    monkeypatch.setenv("RULEC_OPT", f"{kernel_key(k)}={bad}")
    cl_device._by_ast.clear()
    with pytest.raises(OptError, match=why): cl_device.render(k)
  (rows,) = Tensor(x, device="CL").sum(1).schedule()
  monkeypatch.setenv("RULEC_OPT", f"{kernel_key(rows)}=GROUP(32) GRID(2)")
  with pytest.raises(OptError, match="stores one value"): cl_device.render(rows)


# *** a row per work-group (SPREAD: what GPUs run; forced on here) ***

def test_softmax_and_layernorm_are_one_kernel_a_row_per_work_group(group_reductions):
  x = np.random.default_rng(50).standard_normal((6, 300)).astype(np.float32)
  for name, f in (("softmax", lambda t: t.softmax(-1)), ("log_softmax", lambda t: t.log_softmax(-1)),
                  ("layernorm", lambda t: t.layernorm(-1))):
    t = f(Tensor(x, device="CL"))
    (k,) = t.schedule()
    src = cl_device.render(k).source
    # the row's reductions once per work-group (a softmax's max, read twice, is one value), then each work-item
    # stores its share of the row
    assert "for (int r1 = lane; r1 < 300; r1 += 32)" in src and src.count("__local") == 2, name
    np.testing.assert_allclose(t.numpy(), f(Tensor(x, device="NUMPY")).numpy(), rtol=1e-5, atol=1e-6)


def test_without_shared_reductions_a_softmax_stays_three_kernels():
  import attrs
  old = DEV.target
  DEV.target = attrs.evolve(old, group=0)   # (PoCL's own setting: a CPU device)
  try:
    x = np.random.default_rng(51).standard_normal((6, 300)).astype(np.float32)
    t = Tensor(x, device="CL").softmax(-1)
    assert len(t.schedule()) == 3
    np.testing.assert_allclose(t.numpy(), Tensor(x, device="NUMPY").softmax(-1).numpy(), rtol=1e-5, atol=1e-6)
  finally: DEV.target = old


@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(st.sampled_from([(1,), (3,), (2, 5)]), st.sampled_from([1, 2, 7, 64, 65, 513]),
       st.sampled_from(["softmax", "log_softmax", "layernorm", "center", "logsumexp", "softmax0"]))
def test_rows_per_work_group_agree_with_numpy_for_any_shape(group_reductions, lead, cols, fn):
  x = np.random.default_rng(cols * 7 + len(lead)).standard_normal(lead + (cols,)).astype(np.float32)
  f = {"softmax": lambda t: t.softmax(-1), "log_softmax": lambda t: t.log_softmax(-1), "layernorm": lambda t: t.layernorm(-1),
       "center": lambda t: (t - t.mean(-1, keepdim=True)) * t.max(-1, keepdim=True),
       "logsumexp": lambda t: t.logsumexp(-1), "softmax0": lambda t: t.softmax(0)}[fn]
  got, ref = on("CL", x, dtypes.float32, f), on("NUMPY", x, dtypes.float32, f)
  np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)


def test_spread_is_an_action_a_user_can_force_and_it_is_refused_where_it_cannot_apply(group_reductions, monkeypatch):
  from rulec.codegen.opt import OptError, kernel_key
  x = np.random.default_rng(52).standard_normal((4, 96)).astype(np.float32)
  from rulec.codegen.decomp import decomposed
  (k,) = Tensor(x, device="CL").softmax(-1).schedule()
  axes = [r.arg[0] for r in k.ast.src[0].src[1:]]
  key = kernel_key(decomposed(k, DEV.optional))   # (the key of the kernel the optimizer sees)
  monkeypatch.setenv("RULEC_OPT", f"{key}=SPREAD({axes[1]},8)")
  cl_device._by_ast.clear()
  assert "(lane + 88)" in cl_device.render(k).source   # (96 / 8 elements each: the row in registers, unrolled)
  np.testing.assert_allclose(Tensor(x, device="CL").softmax(-1).numpy(), Tensor(x, device="NUMPY").softmax(-1).numpy(),
                             rtol=1e-5, atol=1e-6)
  for bad, why in ((f"SPREAD({axes[0]},16)", f"a reduction depends on r{axes[0]}, which is not fixed"),
                   (f"SPREAD({axes[1]},12)", "power of two")):
    monkeypatch.setenv("RULEC_OPT", f"{key}={bad}")
    cl_device._by_ast.clear()
    with pytest.raises(OptError, match=why): cl_device.render(k)


@pytest.mark.parametrize("name", ["softmax", "log_softmax", "layernorm", "scaled"])
def test_a_short_rows_loads_are_read_once_into_registers(group_reductions, monkeypatch, name):
  # SPREAD with at most ROW_CACHE_MAX elements per work-item: each load of the row is read from memory once, into
  # registers, which the max, the sum and the stores all read (x, and the scale row for "scaled")
  from rulec.codegen.opt import kernel_key
  from rulec.codegen.decomp import decomposed
  x = np.random.default_rng(54).standard_normal((5, 256)).astype(np.float32)
  w = np.random.default_rng(55).standard_normal((256,)).astype(np.float32)
  f = {"softmax": lambda t, s: t.softmax(-1), "log_softmax": lambda t, s: t.log_softmax(-1),
       "layernorm": lambda t, s: t.layernorm(-1), "scaled": lambda t, s: (t * s).softmax(-1) * s}[name]
  (k,) = f(Tensor(x, device="CL"), Tensor(w, device="CL")).schedule()
  axes = [r.arg[0] for r in k.ast.src[0].src[1:]]
  monkeypatch.setenv("RULEC_OPT", f"{kernel_key(decomposed(k, DEV.optional))}=SPREAD({axes[1]},32)")
  cl_device._by_ast.clear()
  src = cl_device.render(k).source
  loads = len(re.findall(r"= p[12]\[", src))
  assert loads == (16 if name == "scaled" else 8), (loads, src)   # 256 / 32 elements of each row load
  got = f(Tensor(x, device="CL"), Tensor(w, device="CL")).numpy()
  np.testing.assert_allclose(got, f(Tensor(x, device="NUMPY"), Tensor(w, device="NUMPY")).numpy(), rtol=1e-5, atol=1e-6)


def test_a_row_value_inside_a_reduce_is_computed_once_per_output(group_reductions):
  # more outputs than a group reduction takes: one work-item per row, which computes the row's max (inside the sum
  # of exponentials) once, before the sum's loop, not at every step of it
  x = np.random.default_rng(53).standard_normal((70000, 8)).astype(np.float32)
  f = lambda t: (t - t.max(-1, keepdim=True)).exp().sum(-1)   # noqa: E731
  (k,) = f(Tensor(x, device="CL")).schedule()
  src = cl_device.render(k).source
  loops = [line.strip() for line in src.splitlines() if line.strip().startswith("for (")]
  assert len(loops) == 3 and all(line.startswith("for (int r") for line in loops)   # three loops side by side, none nested
  assert src.count("  for (") == src.count("\n  for (")
  np.testing.assert_allclose(f(Tensor(x, device="CL")).numpy(), f(Tensor(x, device="NUMPY")).numpy(), rtol=1e-5)


# *** tensor cores through NVIDIA's OpenCL (TensorCoreProgram: the CUDA device's PTX, built as a program binary) ***

from tests.tensor_core_programs import TC_PROGRAMS, check   # noqa: E402

needs_nv = pytest.mark.skipif(DEV.nv_arch is None, reason="tensor cores need NVIDIA's OpenCL on a GPU of sm_80 or later "
                              "(bench/h200.sh tests runs these; PoCL builds no PTX)")


@needs_nv
@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16])
@pytest.mark.parametrize("name", list(TC_PROGRAMS))
def test_half_matmuls_run_on_the_tensor_cores(name, dtype):
  check("CL", cl_device.COUNTERS, name, dtype)


@needs_nv
def test_a_big_tensor_core_matmul_in_a_jitted_loop():
  from rulec import TinyJit
  rng = np.random.default_rng(3)
  a, b = rng.standard_normal((1000, 2048)).astype(np.float32), rng.standard_normal((2048, 520)).astype(np.float32)
  ta, tb = Tensor(a, device="CL").cast(dtypes.bfloat16).realize(), Tensor(b, device="CL").cast(dtypes.bfloat16).realize()
  want = ta.float().numpy() @ tb.float().numpy()
  step = TinyJit(lambda x, y: (x @ y).float().realize())
  before = cl_device.COUNTERS["tensor_cores"]
  for _ in range(20): got = step(ta, tb).numpy()
  assert cl_device.COUNTERS["tensor_cores"] == before + 1   # built once, replayed
  np.testing.assert_allclose(got, want, rtol=2e-2, atol=1.0)


def test_a_driver_that_refuses_the_tensor_core_ptx_costs_one_warning(monkeypatch):
  # told it is an sm_90 GPU, PoCL is handed the tensor-core kernel's PTX as a program binary and refuses it: one
  # warning, then OpenCL C for this and every later half matmul, with the same values as the NUMPY device
  import warnings
  if DEV.nv_arch is not None:   # (NVIDIA's OpenCL builds the PTX: H100, session 35)
    pytest.skip("this device's driver accepts the tensor-core PTX; the test needs one that refuses it (PoCL posing as sm_90)")
  monkeypatch.setattr(DEV, "nv_arch", "sm_90")
  monkeypatch.setattr(cl_device, "_tc_refused", set())
  rng = np.random.default_rng(21)
  a, b = rng.standard_normal((40, 24)).astype(np.float32), rng.standard_normal((24, 56)).astype(np.float32)
  before = cl_device.COUNTERS["tensor_cores"]
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for n in (56, 48):   # (two kernels: the second is not tried)
      got = (Tensor(a, device="CL").cast(dtypes.bfloat16) @ Tensor(b[:, :n], device="CL").cast(dtypes.bfloat16)).float().numpy()
      want = (Tensor(a, device="NUMPY").cast(dtypes.bfloat16) @ Tensor(b[:, :n], device="NUMPY").cast(dtypes.bfloat16)).float().numpy()
      np.testing.assert_array_equal(got, want)
  said = [w for w in caught if "tensor-core kernel" in str(w.message)]
  assert len(said) == 1 and "OpenCL C instead" in str(said[0].message), [str(w.message) for w in caught]
  assert cl_device.COUNTERS["tensor_cores"] == before and DEV.index in cl_device._tc_refused
