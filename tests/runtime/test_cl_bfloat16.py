"""bfloat16 on the CL device (codegen/opencl.py) against the NUMPY reference device, bit for bit: every bfloat16
bit pattern widened and converted, float32 and float64 rounding edges, integers, elementwise arithmetic, reductions
and the GPU-shaped kernels (work-group reductions, register tiles, STAGE) that PoCL runs when asked.

bfloat16 is stored as its bits and computed in float with integer conversions, so it needs no OpenCL extension.
Skipped when pyopencl or an OpenCL device is missing (`pip install pyopencl pocl-binary-distribution`).
"""
import os
import sys
import tempfile

import ml_dtypes  # noqa: F401  (registers np.dtype("bfloat16"))
import numpy as np
import pytest

if "pyopencl" not in sys.modules:   # PoCL reads its cache directory when the platform starts
  os.environ["POCL_CACHE_DIR"] = tempfile.mkdtemp(prefix="rulec-test-pocl-")

pytest.importorskip("pyopencl", reason="the CL device needs pyopencl: pip install pyopencl pocl-binary-distribution")

from hypothesis import HealthCheck, given, settings   # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from rulec.engine.ir.dtypes import dtypes   # noqa: E402
from rulec.engine.tensor import Tensor   # noqa: E402
from rulec.runtime import cl_device   # noqa: E402
from tests.helpers import on, with_and_without_rule   # noqa: E402

try: DEV = cl_device.get_device()
except cl_device.CLUnavailable as e: pytest.skip(f"no OpenCL device: {e}", allow_module_level=True)

BF16 = np.dtype("bfloat16")
BF = dtypes.bfloat16
FP64 = DEV.target.fp64
_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _bits(a: np.ndarray) -> np.ndarray:
  """An array's elements as unsigned integers of their width (floats bit for bit: NaN payloads and -0.0 count)."""
  a = np.ascontiguousarray(a)
  return a if a.dtype == bool else a.view(_UINT[a.dtype.itemsize])


def _keeps_nan_bits() -> bool:
  """Whether float arithmetic on the device keeps a NaN's sign and payload (x86, so numpy and PoCL, do; NVIDIA GPUs
  return one canonical NaN, 0x7fffffff, from every float op, and OpenCL leaves NaN bits open)."""
  x = np.array([0xff81], np.uint16).view(BF16)   # a negative NaN with a payload
  fn = lambda t: (t + 1).bitcast(dtypes.uint16)   # noqa: E731
  return int(on("CL", x, BF, fn)[0]) == int(on("NUMPY", x, BF, fn)[0])


NAN_BITS_KEPT = _keeps_nan_bits()


def same_bits(data, dtype, fn, nans: str = "exact") -> np.ndarray:
  """fn on the CL device, bit for bit what the NUMPY device computes. nans="canonical": NaNs where the reference has
  them, each the canonical NaN of its width with either sign. IEEE 754 leaves the sign of a NaN an invalid operation
  makes to the implementation: x86's is negative, PoCL's libm (fmod, sin) returns a positive one, numpy's float32 sin
  a NaN of either sign; what matters is that it is NaN and a canonical one (a store of it then keeps its bits)."""
  got, ref = on("CL", data, dtype, fn), on("NUMPY", data, dtype, fn)
  assert got.dtype == ref.dtype and got.shape == ref.shape
  gb, rb = _bits(got), _bits(ref)
  bad = gb != rb
  if not NAN_BITS_KEPT and got.dtype != bool and got.dtype.kind not in "iu":
    # (a device whose float ops make one canonical NaN: a NaN of the reference is any NaN here)
    fdt = {2: BF16 if got.dtype == BF16 else np.float16, 4: np.float32, 8: np.float64}[got.dtype.itemsize]
    nan = np.isnan(np.ascontiguousarray(ref).view(fdt).astype(np.float64))
    assert np.isnan(np.ascontiguousarray(got).view(fdt).astype(np.float64))[nan].all(), (gb[nan], rb[nan])
    bad &= ~nan
  elif nans == "canonical" and got.dtype != bool and got.dtype.kind not in "iu":
    w = got.dtype.itemsize
    sign = _UINT[w](1 << (8 * w - 1))
    inf = {2: 0x7f80 if got.dtype != np.float16 else 0x7c00, 4: 0x7f800000, 8: 0x7ff0000000000000}[w]
    quiet = {2: 0x7fc0 if got.dtype != np.float16 else 0x7e00, 4: 0x7fc00000, 8: 0x7ff8000000000000}[w]
    nan = (rb & ~sign) > inf
    # (a NaN the op passes on, as a where does, keeps its bits; one it makes is canonical)
    ok = (gb & ~sign) > inf
    assert (ok[nan] & ((gb[nan] == rb[nan]) | ((gb[nan] & ~sign) == quiet))).all(), (gb[nan], rb[nan])
    bad &= ~nan
  assert not bad.any(), f"{bad.sum()} of {bad.size} differ: inputs {np.asarray(data)[bad][:6] if np.shape(data) == got.shape else '...'}, " \
                        f"CL {gb[bad][:6]}, NUMPY {rb[bad][:6]}"
  return got


def every_bf16() -> np.ndarray:
  return np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(BF16)


def random_bf16(n: int, seed: int, scale: float = 100.0) -> np.ndarray:
  """Normal values of several magnitudes and the special ones: NaNs (with payloads), infinities, zeros, subnormals."""
  rng = np.random.default_rng(seed)
  v = (rng.standard_normal(n) * scale * np.exp2(rng.integers(-20, 20, n))).astype(np.float32).astype(BF16)
  special = np.array([0x7fc0, 0xff81, 0x7f80, 0xff80, 0x0000, 0x8000, 0x0001, 0x807f, 0x7f7f, 0x3f80, 0xbf80, 0x4000],
                     np.uint16).view(BF16)
  v[:len(special)] = special
  return v


# *** conversions ***

@pytest.mark.parametrize("dst", [dtypes.float32, dtypes.float64, dtypes.float16, dtypes.int32, dtypes.bool, dtypes.int8,
                                 dtypes.uint64, dtypes.int16, dtypes.uint16], ids=lambda d: d.name)
def test_every_bfloat16_converts_as_the_reference(dst):
  if dst is dtypes.float64 and not FP64: pytest.skip("no cl_khr_fp64")
  # (NaN payloads and signalling NaNs included: widening keeps them, float64 quiets them, float16 gets 0x7e00)
  same_bits(every_bf16(), BF, lambda t: t.cast(dst))


def test_every_bfloat16_bit_pattern_survives_copies_and_bitcasts():
  x = every_bf16()
  for fn in (lambda t: t.bitcast(dtypes.uint16), lambda t: t.flip(0).contiguous(), lambda t: t.bitcast(dtypes.int16),
             lambda t: t.bitcast(dtypes.float16).bitcast(BF), lambda t: t.reshape(256, 256).permute(1, 0).contiguous(),
             lambda t: (t > 0).where(t, t.flip(0))):
    same_bits(x, BF, fn)
  got = on("CL", x, BF, lambda t: t.flip(0).contiguous())
  np.testing.assert_array_equal(_bits(got), _bits(x)[::-1])   # a copy keeps every bit, NaN payloads too
  u = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
  same_bits(u, dtypes.uint16, lambda t: t.bitcast(BF).cast(dtypes.float32))


def test_every_float16_converts_to_bfloat16_as_the_reference():
  h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
  same_bits(h, dtypes.float16, lambda t: t.cast(BF))


def test_float32_rounds_to_nearest_even_at_every_edge():
  # around every finite bfloat16 (as a float32: its bits << 16): the value, the midpoints to both neighbours (ties go
  # to even), a float32 ulp either side of them
  b = every_bf16().astype(np.float32)
  base = b[np.isfinite(b)].view(np.uint32).astype(np.int64)
  cand = np.concatenate([base + dx for dx in (-0x8001, -0x8000, -0x7fff, -1, 0, 1, 0x7fff, 0x8000, 0x8001)])
  edges = [0x7f7fffff, 0xff7fffff, 0x7f7f0000, 0x7f7f7fff, 0x7f7f8000, 0x7f7e8000, 0x7f800000, 0xff800000,   # max finite
           0x00000001, 0x00007fff, 0x00008000, 0x00008001, 0x00018000, 0x0000ffff, 0x807fffff, 0x00800000,    # subnormals
           0x7f800001, 0xffa00000, 0x7fc00001, 0x7fffffff, 0xff800001, 0x7f80ffff, 0x7fbfffff,               # NaN payloads
           0x80000000, 0x00000000]
  x = np.concatenate([cand & 0xffffffff, np.array(edges, np.int64)]).astype(np.uint32).view(np.float32)
  got = same_bits(x, dtypes.float32, lambda t: t.cast(BF))
  with np.errstate(invalid="ignore"): want = x.astype(BF16)   # (ml_dtypes itself: NaNs become 0x7fc0 with their sign)
  np.testing.assert_array_equal(_bits(got), _bits(want))
  assert _bits(got)[-2:].tolist() == [0x8000, 0x0000] and _bits(got)[len(cand) + 4] == 0x7f80   # -0.0; a tie to inf


@pytest.mark.skipif(not FP64, reason="no cl_khr_fp64")
def test_float64_rounds_once():
  # 1 + 2**-8 + 2**-30: through float32 to nearest it would tie and go to even (0x3f80); rounded once it is 0x3f81
  x = np.array([1 + 2.0 ** -8 + 2.0 ** -30, 1 + 2.0 ** -8, 1 + 2.0 ** -8 - 2.0 ** -40, -(1 + 3 * 2.0 ** -8 + 2.0 ** -52),
                3.4e38, 3.3961e38, 3.3961e38 * (1 + 2.0 ** -40), 1e300, -1e300, 1e-300, -1e-300, 5e-324, -0.0, 0.0,
                np.inf, -np.inf, np.nan, 9.2e-41, 1.1754943508222875e-38 * (1 - 2.0 ** -30)])
  got = same_bits(x, dtypes.float64, lambda t: t.cast(BF))
  assert _bits(got)[:2].tolist() == [0x3f81, 0x3f80]
  assert _bits(got)[7:11].tolist() == [0x7f80, 0xff80, 0x0000, 0x8000]
  # NaN payloads (every one becomes the canonical NaN with its sign) and random doubles of every magnitude
  nans = np.array([0x7ff0000000000001, 0xfff8000000000001, 0x7ff8000000000000, 0xffffffffffffffff], np.uint64).view(np.float64)
  same_bits(nans, dtypes.float64, lambda t: t.cast(BF))
  rng = np.random.default_rng(1)
  r = rng.integers(0, 1 << 64, 1 << 16, dtype=np.uint64, endpoint=False).view(np.float64)
  same_bits(r, dtypes.float64, lambda t: t.cast(BF))
  # doubles within 2**-30 of a bfloat16 midpoint, either side, and on it
  pos = every_bf16()[:0x7f80].astype(np.float64)   # (the positive finite ones and inf)
  mid = (pos[:-1] + pos[1:]) / 2   # (exact in float64; the last: halfway from the largest finite to 2**128)
  d = np.concatenate([mid, mid * (1 + 2.0 ** -30), mid * (1 - 2.0 ** -30), -mid * (1 + 2.0 ** -45)])
  same_bits(d, dtypes.float64, lambda t: t.cast(BF))


@pytest.mark.parametrize("src", [dtypes.int32, dtypes.int64, dtypes.uint64, dtypes.int8, dtypes.uint8, dtypes.bool],
                         ids=lambda d: d.name)
def test_integers_convert_as_the_reference(src):
  # the NUMPY device goes through float64 (one rounding for ints below 2**53); a device without cl_khr_fp64 goes
  # through float32, two roundings, which differ from it for some ints past 2**24
  t = np.dtype(src.np_name)
  rng = np.random.default_rng(2)
  if src is dtypes.bool: x = rng.integers(0, 2, 64).astype(bool)
  else:
    info = np.iinfo(t)
    x = rng.integers(info.min, info.max, 4096, dtype=t, endpoint=True)
    edge = [info.min, info.max, 0, 1, 127, 255, 257, 259, 383, 385]   # 257: a tie to 256; 259: to 260; 383: to 384
    if t.itemsize >= 4: edge += [(1 << 24) + 1, (1 << 24) + 3, (1 << 31) - 1, 0x01018000, 0x01018001, 0x0101_7fff]
    if t.itemsize == 8: edge += [(1 << 53) + 1, (1 << 62) + (1 << 54) + 1, 0x0101_8000_0000_0001]
    if t.kind == "i": edge += [-1, -257, -(1 << 24) - 1, info.min + 1]
    edge = [e for e in edge if info.min <= e <= info.max]
    x[:len(edge)] = edge
  if not FP64 and src.itemsize >= 4: x = x[(x < (1 << 24)) & (x > -(1 << 24))]
  same_bits(x, src, lambda v: v.cast(BF))


def test_constants_round_to_bfloat16():
  # folded and unfolded constants: the bits ml_dtypes rounds a float64 to
  x = random_bf16(64, seed=3)
  for c in (1 + 2.0 ** -8 + 2.0 ** -30, 1 / 3, 3.4e38, 1e-39, -1e-45):
    same_bits(x, BF, lambda t: t + c)
    same_bits(x, BF, lambda t: t * c)
    same_bits(x, BF, lambda t: t.maximum(c))


# *** arithmetic ***

_BINARY = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b, "div": lambda a, b: a / b,
           "max": lambda a, b: a.maximum(b), "min": lambda a, b: a.minimum(b), "floordiv": lambda a, b: a // b,
           "mod": lambda a, b: a % b, "where": lambda a, b: (a < b).where(a, b), "lt": lambda a, b: a < b,
           "eq": lambda a, b: a == b, "ne": lambda a, b: a != b, "mulacc": lambda a, b: a * b + a}
_UNARY = {"neg": lambda t: -t, "abs": lambda t: t.abs(), "sqrt": lambda t: t.sqrt(), "recip": lambda t: t.reciprocal(),
          "floor": lambda t: t.floor(), "ceil": lambda t: t.ceil(), "trunc": lambda t: t.trunc(), "relu": lambda t: t.relu(),
          "square": lambda t: t * t, "exp": lambda t: t.exp(), "log": lambda t: t.log(), "sin": lambda t: t.sin(),
          "exp2": lambda t: t.exp2(), "log2": lambda t: t.log2(), "sigmoid": lambda t: t.sigmoid()}


# unary ops whose invalid cases make their NaN in software (sin, exp, log through float32 on each device): a NaN of
# either sign (same_bits). Other unary ops' NaNs are the hardware's, the same on both devices, bit for bit. Binary ops
# are all compared so: of two NaN operands IEEE 754 does not say which one an add passes on (x86 passes the first, and
# the OpenCL compiler may swap an add's operands), and libm's fmod makes its own NaN
_NANS = {n: "canonical" for n in ("exp", "log", "sin", "exp2", "log2", "sigmoid")}


def _pair(a: np.ndarray, b: np.ndarray) -> np.ndarray: return np.stack([a, b])


@pytest.mark.parametrize("name", sorted(_BINARY))
def test_binary_ops_match_the_reference_bit_for_bit(name):
  a, b = random_bf16(2048, seed=4), random_bf16(2048, seed=5)
  b[20:30] = np.array([0, 0, 0, 0x8000, 0x7f80, 0xff80, 0, 0x3f80, 0xbf80, 0x7fc0], np.uint16).view(BF16)
  a[20:30] = np.array([0x7fc0, 0x3f80, 0, 0x3f80, 0x7f80, 0x4000, 0xff80, 0x7f7f, 0x7f7f, 0x3f80], np.uint16).view(BF16)
  f = _BINARY[name]
  same_bits(_pair(a, b), BF, lambda s: f(s[0], s[1]), "canonical")


@pytest.mark.parametrize("name", sorted(_UNARY))
def test_unary_ops_match_the_reference_bit_for_bit(name):
  x = random_bf16(4096, seed=6, scale=4.0)
  if name in ("log", "log2"):
    with np.errstate(invalid="ignore"): x = np.abs(x.astype(np.float32)).astype(BF16)
  # (exp, log, sin compute in float32 on both devices and round to bfloat16: each device's float32 function may
  # differ from numpy's by an ulp, which changes the rounded bfloat16 only where a float32 result falls within an
  # ulp of a bfloat16 midpoint, about one value in 2**15: none of these)
  same_bits(x, BF, _UNARY[name], _NANS.get(name, "exact"))


def test_every_bfloat16_through_the_elementwise_ops():
  x = every_bf16()
  for name in ("neg", "sqrt", "recip", "floor", "trunc", "square"):
    same_bits(x, BF, _UNARY[name])
  same_bits(x, BF, lambda t: t + 1)
  same_bits(x, BF, lambda t: t * 3)
  same_bits(x, BF, lambda t: t.flip(0) / t, "canonical")
  same_bits(x, BF, lambda t: t.flip(0) // t, "canonical")
  same_bits(x, BF, lambda t: t.flip(0) % t, "canonical")
  same_bits(x, BF, lambda t: t.flip(0).maximum(t), "canonical")


_bf16_bits = st.integers(0, 0xffff)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(_bf16_bits, _bf16_bits), min_size=1, max_size=40), st.sampled_from(sorted(_BINARY)))
def test_any_bfloat16_operands_match_the_reference(pairs, name):
  ab = np.array(pairs, np.uint16).T.copy().view(BF16)
  f = _BINARY[name]
  same_bits(ab, BF, lambda s: f(s[0], s[1]), "canonical")


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(width=32, allow_nan=True, allow_infinity=True, allow_subnormal=True), min_size=1, max_size=40),
       st.sampled_from(["add", "mul", "div", "floordiv", "mod", "max", "where"]))
def test_any_float_values_rounded_to_bfloat16_match_the_reference(values, name):
  x = np.array(values, np.float32)
  f = _BINARY[name]
  same_bits(x, dtypes.float32, lambda t: f(t.cast(BF), t.flip(0).cast(BF)).cast(dtypes.float32), "canonical")


# *** reductions ***

def test_reductions_match_the_reference():
  # A sum accumulates in float and rounds once. NUMPY's float32 np.add.reduce along a row is numpy's pairwise sum: 8
  # interleaved partial sums combined as ((0+1)+(2+3))+((4+5)+(6+7)) for rows of up to 128, a sequential sum for rows
  # under 8. The CL kernel's order is the same for rows under 16 (sequential) and rows of 16 to 128 that 8 divides
  # (its 8 interleaved accumulators and their tree): bit for bit there. Elsewhere (a remainder past the multiple of 8,
  # numpy's halving above 128, the columns of a sum over axis 0) only the order of float32 additions differs: within
  # bfloat16's rounding of the float32 sum, rtol 2**-7
  rng = np.random.default_rng(7)
  for n in (1, 7, 12, 16, 24, 128):
    x = (rng.standard_normal((6, n)) * 10).astype(BF16)
    same_bits(x, BF, lambda t: t.sum(1))
    same_bits(x, BF, lambda t: t.max(1))
    same_bits(x, BF, lambda t: t.min(1))
  for shape in ((6, 17), (3, 1000), (300, 5)):
    x = (rng.standard_normal(shape) * 10).astype(BF16)
    for axis in (0, 1):
      same_bits(x, BF, lambda t: t.max(axis))
      for fn in (lambda t: t.sum(axis), lambda t: t.mean(axis)):
        got, ref = on("CL", x, BF, fn), on("NUMPY", x, BF, fn)
        want = fn(Tensor(x.astype(np.float32), device="NUMPY")).numpy()
        np.testing.assert_allclose(got.astype(np.float32), want, rtol=2.0 ** -7, atol=1e-2)
        np.testing.assert_allclose(got.astype(np.float32), ref.astype(np.float32), rtol=2.0 ** -7, atol=1e-2)
  # NaN and inf in a sum, a max that skips NaN (as the reference's), an empty row
  x = (rng.standard_normal((3, 40))).astype(BF16)
  x[0, 3], x[1, 7], x[2, 1] = np.nan, np.inf, -np.inf
  for fn in (lambda t: t.sum(1), lambda t: t.max(1), lambda t: t.prod(1)):
    got, ref = on("CL", x, BF, fn), on("NUMPY", x, BF, fn)
    np.testing.assert_array_equal(np.isnan(got.astype(np.float32)), np.isnan(ref.astype(np.float32)))
  same_bits(np.zeros((3, 0), BF16), BF, lambda t: t.sum(1))


def test_a_small_matmul_matches_the_reference():
  # each product rounds to bfloat16 (a bfloat16 MUL), the sum of products accumulates in float and rounds once: bit
  # for bit where the order of the float additions is the same (K under 16: one sequential sum on both devices),
  # else within bfloat16's rounding of the float32 result (the reference sums the columns of a product array in
  # its own order)
  rng = np.random.default_rng(8)
  for m, k, n in ((5, 7, 3), (8, 12, 9), (17, 33, 9), (32, 64, 48)):
    a, b = rng.standard_normal((m, k)).astype(BF16), rng.standard_normal((k, n)).astype(BF16)
    f = lambda t: t @ Tensor(b, dtype=BF, device=t.device)   # noqa: E731
    if k < 16: same_bits(a, BF, f)
    got, ref = on("CL", a, BF, f), on("NUMPY", a, BF, f)
    np.testing.assert_allclose(got.astype(np.float32), ref.astype(np.float32), rtol=2.0 ** -7, atol=2.0 ** -6 * k ** 0.5)
    exact = (a.astype(np.float32) @ b.astype(np.float32))
    np.testing.assert_allclose(got.astype(np.float32), exact, rtol=2.0 ** -6, atol=2.0 ** -5 * k ** 0.5)


# *** the GPU-shaped kernels, run on PoCL ***

@pytest.fixture
def gpu_like(monkeypatch):
  """The CL device's target as the environment that emulates a GPU's kernels on PoCL sets it: work-group reductions
  of 512, register tiles in work-groups of 256, STAGE's ring of 3 blocks with A in rows, declared work-group sizes,
  vector loads of 4 (read by a fresh CLDevice, as at startup)."""
  for k, v in dict(RULEC_CL_GROUP="512", RULEC_CL_TILE="256", RULEC_CL_ASYNC="3", RULEC_CL_ASYNC_ROWS="1",
                   RULEC_CL_FIXED_GROUP="1", RULEC_CL_VECTOR="4").items():
    monkeypatch.setenv(k, v)
  target = cl_device.CLDevice(DEV.index).target
  assert target.tile and target.group and target.async_copy == 3 and target.async_rows and target.fixed_group
  monkeypatch.setattr(DEV, "target", target)
  cl_device._by_ast.clear()
  yield target
  cl_device._by_ast.clear()


def _sources(t) -> str: return "\n".join(cl_device.render(k).source for k in t.schedule())


@pytest.mark.parametrize("m, k, n", [(64, 64, 64), (128, 96, 64), (96, 48, 80)])
@pytest.mark.parametrize("shape", ["group", "tiles"])
def test_a_bfloat16_matmul_on_gpu_kernels(gpu_like, monkeypatch, shape, m, k, n):
  # "group": what the optimizer picks on PoCL with these settings (a work-group per output, a tree in local memory);
  # "tiles": with group reductions off, as tests/codegen/test_opt.py's cl_tiles has it, register tiles in work-groups
  # with STAGE's blocks in local memory (bfloat16's 2-byte loads copied element by element, not as 16-byte chunks)
  import attrs
  if shape == "tiles":
    monkeypatch.setattr(DEV, "target", attrs.evolve(gpu_like, group=0))
    cl_device._by_ast.clear()
  rng = np.random.default_rng(m + k + n)
  a, b = rng.standard_normal((m, k)).astype(BF16), rng.standard_normal((k, n)).astype(BF16)
  f = lambda t: t @ Tensor(b, dtype=BF, device=t.device)   # noqa: E731
  src = _sources(f(Tensor(a, dtype=BF, device="CL")))
  assert "get_local_id" in src and "reqd_work_group_size" in src and "rulec_b2f" in src, src
  if shape == "tiles": assert "__local float tile" in src and "ushort4" not in src, src
  else: assert "__local float part" in src, src
  assert "rulec_cp16" not in src   # (the ring copies 4-byte elements in chunks: none here)
  got, ref = on("CL", a, BF, f), on("NUMPY", a, BF, f)
  # (the tile's accumulators or the group's tree sum in another order than the reference: within bfloat16's rounding)
  np.testing.assert_allclose(got.astype(np.float32), ref.astype(np.float32), rtol=2.0 ** -7, atol=2.0 ** -6 * k ** 0.5)
  # a bfloat16 epilogue and a float32 result of bfloat16 operands
  g = lambda t: (t @ Tensor(b, dtype=BF, device=t.device) + 1).relu().cast(dtypes.float32)   # noqa: E731
  np.testing.assert_allclose(on("CL", a, BF, g), on("NUMPY", a, BF, g), rtol=2.0 ** -7, atol=2.0 ** -6 * k ** 0.5)


@pytest.mark.parametrize("shape", [(6, 300), (4, 512), (3, 64), (2, 4096)])
def test_bfloat16_softmax_and_reductions_on_gpu_kernels(gpu_like, shape):
  x = (np.random.default_rng(shape[1]).standard_normal(shape) * 3).astype(BF16)
  t = Tensor(x, dtype=BF, device="CL").softmax(-1)
  src = _sources(t)
  # (one kernel, a row per work-group: SPREAD, the row's loads in registers where they fit)
  assert len(t.schedule()) == 1 and "barrier(CLK_LOCAL_MEM_FENCE)" in src and "__local float" in src, src
  got = t.numpy()
  ref = on("NUMPY", x, BF, lambda v: v.softmax(-1))
  # (the row's sums combine as a tree in local memory, another order than the reference's)
  np.testing.assert_allclose(got.astype(np.float32), ref.astype(np.float32), rtol=2.0 ** -7, atol=1e-4)
  same_bits(x, BF, lambda v: v.max(1))   # a max is exact in any order
  same_bits(x, BF, lambda v: v.argmax(1))
  for fn in (lambda v: v.sum(1), lambda v: v.sum(), lambda v: (v * v).mean(1)):
    got, ref = on("CL", x, BF, fn), on("NUMPY", x, BF, fn)
    np.testing.assert_allclose(got.astype(np.float32), ref.astype(np.float32), rtol=2.0 ** -7, atol=2.0 ** -5 * shape[1] ** 0.5)


def test_vector_kernels_leave_bfloat16_scalar(gpu_like):
  # VECTOR moves 4-byte elements only: a bfloat16 elementwise kernel keeps its ushort loads and stores
  x = random_bf16(8192, seed=9)
  t = Tensor(x, dtype=BF, device="CL") * 2 + 1
  src = _sources(t)
  assert "ushort4" not in src and "float4" not in src
  same_bits(x, BF, lambda v: v * 2 + 1)


def _block_under_autocast(device: str, backward: bool):
  """A GPT-2 block as bench/models.py runs it under autocast: float32 weights, every matmul on operands cast to
  bfloat16, one qkv projection split into heads, causal scores widened to float32, the softmax and the layernorms in
  float32; its output, and with backward its gradients."""
  rng = np.random.default_rng(35)
  def t(*s): return Tensor((rng.standard_normal(s) * 0.5).astype(np.float32), device=device, requires_grad=True)
  B, T, C, H = 2, 64, 64, 4
  ws = [t(*s) for s in ((C,), (C,), (C, 3 * C), (3 * C,), (C, C), (C,), (C,), (C, 4 * C), (4 * C,), (4 * C, C))]
  g1, b1, wqkv, bqkv, wo, g2, b2, w1, c1, w2 = ws
  x0 = t(B, T, C)
  def mm(a, w): return a.cast(BF) @ w.cast(BF)
  qkv = mm(x0.layernorm() * g1 + b1, wqkv) + bqkv
  q, k, v = (qkv[:, :, i * C:(i + 1) * C].reshape(B, T, H, C // H).transpose(1, 2) for i in range(3))
  s = mm(q, k.transpose(-1, -2)).float() * 0.25
  s = Tensor.ones(T, T, dtype="bool", device=device).tril().where(s, float("-inf"))
  x = x0 + mm(mm(s.softmax(-1), v).transpose(1, 2).reshape(B, T, C), wo)
  out = x + mm((mm(x.layernorm() * g2 + b2, w1) + c1).gelu(), w2)
  if not backward: return [out]
  loss = out.float().square().mean()
  return [loss, *loss.gradient(x0, *ws)]


def _block_matches_numpy(backward: bool) -> None:
  """The autocast block's output (and gradients) on CL against the NUMPY device's."""
  import warnings
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")   # (PoCL refusing the tensor-core PTX, once)
    got = [t.numpy() for t in _block_under_autocast("CL", backward)]
  for a, w in zip(got, _block_under_autocast("NUMPY", backward)):
    # (bfloat16 products summed in another order: a rounding flips here and there, one bfloat16 step of the values
    # it feeds, up to 2**-7 of the largest; the output's sums of those then differ by a few such steps)
    w = w.numpy()
    np.testing.assert_allclose(a, w, rtol=2e-2, atol=2.0 ** -5 * float(np.abs(w).max()))


@pytest.mark.parametrize("backward", [False, True])
def test_a_row_value_read_only_in_its_rows_kernel_is_recomputed(gpu_like, monkeypatch, tmp_path, backward):
  # rules/fusion.rules keep_row_value_in_its_kernel: a value over a hoisted row value (a softmax's exp(s - max), a
  # layernorm's x - mean), read only by its row's own kernel, stays fused there instead of store_expensive storing it
  # (a hoisted value counts every buffer below it as its reads): a block's forward has fewer kernels, and so does a
  # training step (its layernorms' backward rows, hoisted by hoist_row_epilogue, read such values in two contexts).
  # Scheduled as for an NVIDIA GPU with tensor cores (whose rules store the matmuls' bfloat16 operands); PoCL then refuses the
  # tensor-core PTX once and runs OpenCL C, whose values must match the NUMPY device's
  monkeypatch.setattr(DEV, "nv_arch", "sm_90")
  monkeypatch.setattr(cl_device, "_tc_refused", set())
  shipped, without = with_and_without_rule(monkeypatch, tmp_path, "keep_row_value_in_its_kernel", "fuse_values",
                                           lambda: len(Tensor.schedule(*_block_under_autocast("CL", backward))))
  assert shipped < without, (shipped, without)
  _block_matches_numpy(backward)


@pytest.mark.parametrize("backward", [False, True])
def test_a_widened_half_sum_read_twice_is_stored_in_half(gpu_like, monkeypatch, tmp_path, backward):
  # rules/fusion.rules store_half_before_widening: autocast's scores (q @ k.T).float(), read by the softmax's max,
  # sum and quotient (and the backward), are stored as the matmul's bfloat16 result and widened by each reader:
  # half the bytes of the block's largest intermediate, the same kernels, and (the widening being exact) values
  # that match the NUMPY device's
  monkeypatch.setattr(DEV, "nv_arch", "sm_90")
  monkeypatch.setattr(cl_device, "_tc_refused", set())
  B, T, H = 2, 64, 4
  def stored_scores():
    ks = Tensor.schedule(*_block_under_autocast("CL", backward))
    sizes = {}
    for k in ks:
      out = k.bufs[0]
      if out.size == B * H * T * T: sizes[out.dtype.name] = sizes.get(out.dtype.name, 0) + 1
    return len(ks), sizes
  (n, shipped), (n_without, without) = with_and_without_rule(monkeypatch, tmp_path, "store_half_before_widening",
                                                             "fuse_reduces", stored_scores)
  assert n == n_without, (n, n_without)
  # (forward: the scores; a training step also the probabilities' gradient, dout @ v.T widened for the softmax's)
  gained = 2 if backward else 1
  assert shipped.get("bfloat16", 0) == without.get("bfloat16", 0) + gained, (shipped, without)
  assert shipped.get("float32", 0) == without.get("float32", 0) - gained, (shipped, without)
  _block_matches_numpy(backward)
