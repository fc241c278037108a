"""Native float16 on OpenCL devices with cl_khr_fp16 (codegen/opencl.py, Target.half; issue #35).

Two parts. The source checks render kernels with the flag forced on through the
renderer's API (no device needed): float16 buffers are `half*`, its + - * and
comparisons are `half` arithmetic under `#pragma OPENCL EXTENSION cl_khr_fp16`,
with no per-op rounding helpers, sums and products accumulate in float and round
once, bfloat16 and float32 kernels render as before. Where the CL device has
the extension the sources are built too; where a clang with OpenCL C is on PATH
they are syntax-checked with cl_khr_fp16 on (PoCL, the CPU device CI runs,
lacks it and refuses `half` variables).

The value tests run only on a CL device with cl_khr_fp16 (a GPU:
`RULEC_DEVICE=CL python -m pytest -q tests/codegen/test_opencl_native_half.py`),
and are skipped, saying why, elsewhere: + - * max where and negation bit for bit
as numpy's float16 (which computes in float32 and rounds: the correctly rounded
half); division and sqrt within 1 ulp; exp, log and sin within 1 ulp of numpy's
float32 result rounded to float16; a float16 sum and matmul within the error
bound of float accumulation; float32 <-> float16 casts bit for bit as astype
(overflow, subnormals, NaNs).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess

import attrs
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rulec.codegen import opencl, pipeline
from rulec.codegen.opencl import Target
from rulec.engine.ir.dtypes import dtypes
from rulec.engine.tensor import Tensor

# RULEC_TENSOR_EXAMPLES scales the examples (tests/frontend/test_tensor.py's convention)
_SCALE = float(os.environ.get("RULEC_TENSOR_EXAMPLES", "1") or 1)


def examples(n: int) -> int: return max(1, int(n * _SCALE))


SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# a CPU OpenCL device, and a GPU's shape of kernels (group reductions, one-pass reductions over many work-groups,
# register tiles in work-groups, declared work-group sizes), both with cl_khr_fp16 and cl_khr_fp64
CPU = Target(fp64=True, half=True)
GPU = Target(fp64=True, half=True, group=256, vector=4, tile=256, units=132, grid=512, async_copy=3, async_rows=True,
             fixed_group=True)
PRAGMA = "#pragma OPENCL EXTENSION cl_khr_fp16 : enable"


def sources(t: Tensor, target: Target) -> list[str]:
  """The OpenCL C of each of t's kernels, optimized and rendered for `target` (codegen's pipeline, no device)."""
  out = []
  for k in t.schedule():
    low = pipeline.lower(k, "CL", target)
    out.append(pipeline.render(low.kernel, "CL", target, vars=k.vars).source)
  return out


def rendered(t: Tensor, target: Target) -> list:
  return [pipeline.render(pipeline.lower(k, "CL", target).kernel, "CL", target, vars=k.vars) for k in t.schedule()]


def h(*shape) -> Tensor: return Tensor.empty(*shape, dtype=dtypes.float16)


def acc_types(src: str) -> set[str]:
  """The C types reduce accumulators are declared with (acc<n>, and the local arrays of group reductions)."""
  return set(re.findall(r"\b(\w+) acc\d+ =", src)) | set(re.findall(r"__local (\w+) part\d+\[", src))


# *** the source ***

ELEMENTWISE = {
  "add_mul": lambda a, b: a + b * a - b,
  "neg_max": lambda a, b: (-a).maximum(b),
  "where": lambda a, b: (a < b).where(a, b),
  "compare": lambda a, b: (a == b) | (a != b),
  "mulacc_const": lambda a, b: a * 3 + 0.1,
}


@pytest.mark.parametrize("target", [CPU, GPU], ids=["cpu", "gpu"])
@pytest.mark.parametrize("name", sorted(ELEMENTWISE))
def test_elementwise_float16_is_half_arithmetic(name, target):
  (src,) = sources(ELEMENTWISE[name](h(64, 33), h(64, 33)), target)
  assert src.count(PRAGMA) == 1 and "#pragma OPENCL FP_CONTRACT OFF" in src
  assert "__global const half* restrict p1" in src and ("__global half* restrict p0" in src or name == "compare")
  # no float16 held as bits in a float: no ushort buffers, no rounding helpers, no float at all
  assert "ushort" not in src and not re.search(r"rulec_(?!kernel\b)", src) and "float" not in src.replace("FP_CONTRACT", ""), src
  assert re.search(r"(half|bool) v\d+ = v\d+ [-+*<>=!]=? ", src), src


def test_division_and_sqrt_round_once_from_float_and_constants_are_half():
  (src,) = sources(h(64) / h(64), CPU)
  assert re.search(r"half v\d+ = convert_half_rte\(\(float\)v\d+ / \(float\)v\d+\);", src), src
  (src,) = sources(h(64) * 0.1 + 65504, CPU)
  # constants: the float16 value as an exact float literal, cast to half (0.1 rounds to 0x1.998p-4 in float16)
  assert "((half)(0x1.9980000000000p-4f))" in src and "((half)(0x1.ffc0000000000p+15f))" in src, src
  (src,) = sources(h(64) // h(64), CPU)
  assert "floor(convert_half_rte(" in src, src   # the quotient rounded to half, then floored


# (GRID: a GPU with one-pass reductions over work-groups of 64, as tests/runtime/test_cl_device.py's grid_reductions)
GRID = attrs.evolve(GPU, group=64, grid=8)


@pytest.mark.parametrize("target", [CPU, GPU, GRID], ids=["cpu", "gpu", "grid"])
@pytest.mark.parametrize("shape, axis", [((16, 40), 1), ((40, 16), 0), ((4, 4096), 1), ((16384,), None), ((1 << 20,), None)])
def test_float16_sums_accumulate_in_float_and_round_once(shape, axis, target):
  t = h(*shape).sum(axis) if axis is not None else h(*shape).sum()
  srcs = sources(t, target)
  reducing = [s for s in srcs if "acc" in s]
  assert reducing, srcs
  for src in reducing:
    assert acc_types(src) == {"float"}, src
    assert "convert_half_rte(" in src and "rulec_rh" not in src
  if target is not CPU and (axis == 1 and shape[1] >= 32 or axis is None):   # work-group reductions: float partials
    assert any("__local float part" in s for s in reducing), reducing
  if target is GRID and shape == (16384,):   # one pass over several work-groups: float partials in the scratch buffer
    assert any("(__global float*)grid_part" in s for s in srcs), srcs


@pytest.mark.parametrize("target", [CPU, GPU], ids=["cpu", "gpu"])
def test_a_float16_max_stays_half(target):
  (src,) = sources(h(16, 64).max(1), target)
  assert "half" in acc_types(src) and "float" not in acc_types(src), src   # (a bool accumulator says whether a NaN came)


@pytest.mark.parametrize("target", [CPU, GPU], ids=["cpu", "gpu"])
def test_a_float16_matmul_multiplies_in_half_and_sums_in_float(target):
  (src,) = sources(h(64, 96) @ h(96, 32), target)
  assert acc_types(src) == {"float"}, src
  assert re.search(r"acc\d+ = acc\d+ \+ v\d+;", src), src   # (the half product widens to the float sum)
  assert "fma(" not in src   # (a float32 sum of products fuses; a half product is rounded before it is added)
  assert PRAGMA in src and "ushort" not in src


def test_staged_blocks_of_halves_are_floats_read_back_exactly():
  # a GPU's register-tiled matmul stages blocks in local memory: halves as floats (the layout and the local-memory
  # budget count 4-byte elements), each read converted back to half (exact) for the half product
  (src,) = sources(h(1024, 1024) @ h(1024, 1024), GPU)
  assert src.count("__local float tile") == 2 and "__local half" not in src, src
  assert re.search(r"half v\d+ = \(\(half\)tile\d+\[[^]]+\]\) \* \(\(half\)tile\d+\[", src), src
  assert acc_types(src) == {"float"}


def test_casts_round_to_nearest_even_with_numpy_nans():
  (src,) = sources(Tensor.empty(64).cast(dtypes.float16), CPU)
  assert "rulec_f2hn(" in src and "convert_half_rte(x)" in src
  (src,) = sources(h(64).cast(dtypes.float32), CPU)
  assert "rulec_hfn(" in src and "rulec_h2f" not in src
  (src,) = sources(Tensor.empty(64, dtype=dtypes.float64).cast(dtypes.float16), CPU)
  assert "rulec_d2hn(" in src
  (src,) = sources(Tensor.empty(64, dtype=dtypes.bfloat16).cast(dtypes.float16), CPU)
  assert "rulec_bhn(" in src
  (src,) = sources(h(64).bitcast(dtypes.int16), CPU)
  assert "as_short(v" in src
  (src,) = sources(Tensor.empty(64, dtype=dtypes.uint16).bitcast(dtypes.float16), CPU)
  assert "as_half(v" in src


def test_transcendentals_round_once_from_double_or_float():
  (src,) = sources(h(64) ** h(64), CPU)
  assert "rulec_d2hn(pow((double)v" in src and PRAGMA in src
  (src,) = sources(h(64) ** h(64), attrs.evolve(CPU, fp64=False))
  assert "convert_half_rte(pow((float)v" in src and "double" not in src


def test_bfloat16_and_other_kernels_render_as_without_the_flag():
  b = Tensor.empty(64, dtype=dtypes.bfloat16)
  f = Tensor.empty(64, 64)
  for t in (b * b + 1, b.sum(), (b ** b).exp2(), f @ f, f.sum(1), f.cast(dtypes.bfloat16), Tensor.empty(64, dtype=dtypes.int32) * 3):
    for target in (CPU, GPU):
      assert sources(t, target) == sources(t, attrs.evolve(target, half=False))
      assert all(PRAGMA not in s for s in sources(t, target))


def test_without_the_flag_float16_is_still_its_bits():
  (src,) = sources(h(64) + h(64), attrs.evolve(CPU, half=False))
  assert PRAGMA not in src and "ushort" in src and "rulec_rh(" in src and "rulec_h2f(" in src
  assert opencl.ctype(dtypes.float16) == "float" and opencl.ctype(dtypes.float16, CPU) == "half"
  assert opencl.memtype(dtypes.float16, attrs.evolve(CPU, half=False)) == "ushort" and opencl.memtype(dtypes.float16, CPU) == "half"
  assert opencl.ctype(dtypes.bfloat16, CPU) == "float" and opencl.memtype(dtypes.bfloat16, CPU) == "ushort"


COMPILED = [lambda: ELEMENTWISE["add_mul"](h(64, 33), h(64, 33)), lambda: ELEMENTWISE["where"](h(64), h(64)),
            lambda: h(64) / h(64) + h(64) // h(64), lambda: h(16, 4096).sum(1), lambda: h(1 << 16).sum(), lambda: h(16384).sum(),
            lambda: h(16, 64).max(1),
            lambda: h(64, 96) @ h(96, 32), lambda: h(256, 512) @ h(512, 256),
            lambda: Tensor.empty(64).cast(dtypes.float16).cast(dtypes.float64),
            lambda: h(64).exp() + h(64).sin(), lambda: h(64) ** h(64), lambda: h(64).cast(dtypes.bfloat16).cast(dtypes.float16),
            lambda: h(64).cast(dtypes.int64) + h(64).bitcast(dtypes.int16).cast(dtypes.int64)]


def _clang() -> list[str] | None:
  """A clang that compiles OpenCL C (syntax only, SPIR target, cl_khr_fp16 and cl_khr_fp64 on), or None."""
  for name in ("clang", "clang-14", "clang-15", "clang-16", "clang-17", "clang-18", "clang-19"):
    exe = shutil.which(name)
    if exe is None: continue
    cmd = [exe, "-x", "cl", "-cl-std=CL1.2", "-Xclang", "-finclude-default-header", "-target", "spir64",
           "-Xclang", "-cl-ext=+cl_khr_fp16,+cl_khr_fp64", "-fsyntax-only", "-"]
    probe = subprocess.run(cmd, input=PRAGMA + "\n__kernel void k(__global half* p) { half x = p[0]; p[0] = x * x; }",
                           capture_output=True, text=True)
    if probe.returncode == 0: return cmd
  return None


@pytest.mark.parametrize("i", range(len(COMPILED)))
@pytest.mark.parametrize("target", [CPU, GPU, GRID], ids=["cpu", "gpu", "grid"])
def test_sources_compile_under_clang_with_cl_khr_fp16(i, target):
  cmd = _clang()
  if cmd is None: pytest.skip("no clang with OpenCL C on PATH (e.g. Debian's clang-14) to syntax-check the half sources")
  for src in sources(COMPILED[i](), target):
    r = subprocess.run(cmd, input=src, capture_output=True, text=True)
    assert r.returncode == 0, f"{r.stderr}\n{src}"


# *** on a device with cl_khr_fp16 ***

def _cl():
  """The CL device (skipping where there is none)."""
  pytest.importorskip("pyopencl", reason="the CL device needs pyopencl: pip install pyopencl pocl-binary-distribution")
  from rulec.runtime import cl_device
  try: return cl_device.get_device()
  except cl_device.CLUnavailable as e: pytest.skip(f"no OpenCL device: {e}")


def _has_fp16(dev) -> bool: return "cl_khr_fp16" in dev.dev.extensions.split()


def _no_fp16_reason(dev) -> str:
  return (f"{dev!r} has no cl_khr_fp16 (PoCL's CPU device has none, and refuses `half` variables): native half code "
          "cannot run here; run these tests on a GPU (RULEC_DEVICE=CL)")


@pytest.fixture(scope="module")
def native():
  """The CL device where it computes float16 natively, else a skip saying why."""
  dev = _cl()
  if not _has_fp16(dev): pytest.skip(_no_fp16_reason(dev))
  if not dev.target.half: pytest.skip(f"native float16 is opt-in: run with RULEC_CL_HALF=1 on {dev!r}")
  return dev


def test_the_device_says_whether_it_has_cl_khr_fp16_and_the_switch_turns_it_off(monkeypatch):
  dev = _cl()
  from rulec.runtime import cl_device
  monkeypatch.delenv("RULEC_CL_HALF", raising=False)
  assert cl_device.CLDevice(dev.index).target.half is False   # (opt-in: runtime/cl_device.py says why)
  monkeypatch.setenv("RULEC_CL_HALF", "1")
  assert cl_device.CLDevice(dev.index).target.half == ("cl_khr_fp16" in dev.dev.extensions.split())
  monkeypatch.setenv("RULEC_CL_HALF", "0")
  assert cl_device.CLDevice(dev.index).target.half is False


@pytest.mark.parametrize("i", range(len(COMPILED)))
def test_sources_build_on_the_device(i):
  dev = _cl()
  if not _has_fp16(dev): pytest.skip(_no_fp16_reason(dev))
  from rulec.runtime import cl_device
  for r in rendered(COMPILED[i](), attrs.evolve(dev.target, half=True)): cl_device.Program(dev, r)


def half_bits(x: np.ndarray) -> np.ndarray: return np.ascontiguousarray(x, np.float16).view(np.uint16)


def ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """How many float16 values apart a and b are (+0 and -0 the same; infinity one past the largest finite)."""
  def ordered(x):
    i = half_bits(x).astype(np.int64)
    return np.where(i & 0x8000, -(i & 0x7fff), i)
  return np.abs(ordered(a) - ordered(b))


def assert_same_halves(got: np.ndarray, want: np.ndarray):
  """Bit for bit, a NaN for each NaN (the device's NaN bits are its own)."""
  assert got.dtype == np.float16 and got.shape == want.shape
  nan = np.isnan(want)
  np.testing.assert_array_equal(np.isnan(got), nan)
  np.testing.assert_array_equal(half_bits(got)[~nan], half_bits(want)[~nan])


def assert_within_ulps(got: np.ndarray, want: np.ndarray, n: int = 1):
  nan = np.isnan(want)
  np.testing.assert_array_equal(np.isnan(got), nan)
  d = ulps(got[~nan], want[~nan])
  assert d.max(initial=0) <= n, (got[~nan][d > n][:8], want[~nan][d > n][:8])


def float16s(seed: int, n: int, scale: int) -> np.ndarray:
  """n float16 values: half any bit pattern (subnormals, infinities, NaNs), half normal values around 2**scale (so
  that sums and differences of similar magnitudes, which cancel, come up), a few exact specials."""
  rng = np.random.default_rng(seed)
  x = rng.integers(0, 1 << 16, n, dtype=np.uint64).astype(np.uint16).view(np.float16)
  normal = rng.random(n) < 0.5
  with np.errstate(over="ignore"):
    x[normal] = (rng.standard_normal(n) * 2.0 ** scale).astype(np.float16)[normal]
  specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 65504, -65504, 6e-8, 1.0, 2.0 ** -14], np.float16)
  k = min(n, len(specials))
  x[rng.permutation(n)[:k]] = specials[:k]
  return x


def on_cl(fn, *arrays):
  return fn(*(Tensor(a, device="CL") for a in arrays)).numpy()


def on_numpy(fn, *arrays):
  return fn(*(Tensor(a, device="NUMPY") for a in arrays)).numpy()


draw = dict(seed=st.integers(0, 2 ** 32 - 1), n=st.integers(1, 3000), scale=st.integers(-20, 16))


@settings(max_examples=examples(40), **SETTINGS)
@given(op=st.sampled_from(["+", "-", "*", "max", "where", "neg", "mulacc"]), **draw)
def test_elementwise_is_numpys_float16_bit_for_bit(native, op, seed, n, scale):
  a, b = float16s(seed, n, scale), float16s(seed + 1, n, scale)
  with np.errstate(all="ignore"):
    fns = {"+": (lambda x, y: x + y, lambda x, y: x + y), "-": (lambda x, y: x - y, lambda x, y: x - y),
           "*": (lambda x, y: x * y, lambda x, y: x * y),
           # (Tensor.maximum's NaNs are tinygrad's: the NUMPY reference device says what they are)
           "max": (lambda x, y: x.maximum(y), lambda x, y: on_numpy(lambda p, q: p.maximum(q), x, y)),
           "where": (lambda x, y: (x < y).where(x, -y), lambda x, y: np.where(x < y, x, -y)),
           "neg": (lambda x, y: -x, lambda x, y: -x),
           "mulacc": (lambda x, y: x * y + x, lambda x, y: x * y + x)}
    fn, ref = fns[op]
    assert_same_halves(on_cl(fn, a, b), ref(a, b))


@settings(max_examples=examples(20), **SETTINGS)
@given(**draw)
def test_comparisons_are_numpys(native, seed, n, scale):
  a, b = float16s(seed, n, scale), float16s(seed + 1, n, scale)
  b[: n // 2] = a[: n // 2]   # (equal values too)
  np.testing.assert_array_equal(on_cl(lambda x, y: x < y, a, b), a < b)
  np.testing.assert_array_equal(on_cl(lambda x, y: x == y, a, b), a == b)
  np.testing.assert_array_equal(on_cl(lambda x, y: x != y, a, b), a != b)


@settings(max_examples=examples(30), **SETTINGS)
@given(op=st.sampled_from(["/", "sqrt"]), **draw)
def test_division_and_sqrt_are_within_one_ulp(native, op, seed, n, scale):
  a, b = float16s(seed, n, scale), float16s(seed + 1, n, scale)
  with np.errstate(all="ignore"):
    if op == "/": assert_within_ulps(on_cl(lambda x, y: x / y, a, b), a / b)
    else: assert_within_ulps(on_cl(lambda x: x.sqrt(), a), np.sqrt(a))


@settings(max_examples=examples(30), **SETTINGS)
@given(op=st.sampled_from(["exp", "log", "sin"]), seed=st.integers(0, 2 ** 32 - 1), n=st.integers(1, 3000),
       scale=st.integers(-12, 4))
def test_transcendentals_are_within_one_ulp_of_numpys_float32_rounded(native, op, seed, n, scale):
  a = float16s(seed, n, scale)
  with np.errstate(all="ignore"):
    want = getattr(np, op)(a.astype(np.float32)).astype(np.float16)
    assert_within_ulps(on_cl(lambda x: getattr(x, op)(), a), want)


def _float_sum_bound(terms: np.ndarray, axis) -> np.ndarray:
  """|error| of a float32 sum of exact terms rounded once to float16: an ulp of the result, plus n * 2**-24 * sum |t|."""
  exact = terms.astype(np.float64).sum(axis)
  n = terms.shape[axis] if axis is not None else terms.size
  with np.errstate(over="ignore"):
    ulp = np.spacing(np.abs(exact).astype(np.float16)).astype(np.float64)
  return exact, ulp + n * 2.0 ** -24 * np.abs(terms.astype(np.float64)).sum(axis)


@settings(max_examples=examples(20), **SETTINGS)
@given(seed=st.integers(0, 2 ** 32 - 1), rows=st.integers(1, 40), cols=st.integers(1, 5000), axis=st.sampled_from([0, 1, None]),
       scale=st.integers(-10, 2))
def test_a_float16_sum_is_a_float_sum_rounded_once(native, seed, rows, cols, axis, scale):
  rng = np.random.default_rng(seed)
  x = (rng.standard_normal((rows, cols)) * 2.0 ** scale).astype(np.float16)
  got = on_cl(lambda t: t.sum(axis), x)
  assert got.dtype == np.float16
  exact, bound = _float_sum_bound(x, axis)
  assert (np.abs(got.astype(np.float64) - exact) <= bound).all(), (got, exact, bound)


@settings(max_examples=examples(15), **SETTINGS)
@given(seed=st.integers(0, 2 ** 32 - 1), m=st.integers(1, 70), k=st.integers(1, 600), n=st.integers(1, 70),
       scale=st.integers(-6, 1))
def test_a_float16_matmul_is_within_float16_rounding(native, seed, m, k, n, scale):
  from rulec.runtime import cl_device
  rng = np.random.default_rng(seed)
  a = (rng.standard_normal((m, k)) * 2.0 ** scale).astype(np.float16)
  b = (rng.standard_normal((k, n)) * 2.0 ** scale).astype(np.float16)
  with pytest.MonkeyPatch.context() as mp:
    mp.setenv("RULEC_CL_TC", "0")   # (OpenCL C, not the tensor-core kernel an NVIDIA GPU would take)
    cl_device._by_ast.clear()
    got = on_cl(lambda x, y: x @ y, a, b).astype(np.float64)
  cl_device._by_ast.clear()
  a64, b64 = a.astype(np.float64), b.astype(np.float64)
  exact = a64 @ b64
  # each product rounded to float16 (or exact), summed in float, rounded once
  with np.errstate(over="ignore"):
    ulp = np.spacing(np.abs(exact).astype(np.float16)).astype(np.float64)
  bound = ulp + (2.0 ** -11 + k * 2.0 ** -24) * (np.abs(a64) @ np.abs(b64))
  assert (np.abs(got - exact) <= bound).all(), np.abs(got - exact).max()


def float32s(seed: int, n: int) -> np.ndarray:
  """float32 values that reach every kind of float16: any bit pattern, values across float16's range and past it
  (overflow to inf, subnormals, underflow to 0), exact ties between neighbouring halves, quiet NaNs with payloads."""
  rng = np.random.default_rng(seed)
  x = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)
  pick = rng.integers(0, 3, n)
  wide = (2.0 ** rng.uniform(-27, 17, n) * rng.choice([-1, 1], n)).astype(np.float32)
  h = rng.integers(0, 0x7c00, n, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
  ties = (h.view(np.uint32) + np.uint32(0x1000)).view(np.float32)   # (halfway to the next half up, for normal halves)
  x = np.where(pick == 0, x, np.where(pick == 1, wide, ties)).astype(np.float32)
  specials = np.array([65504, 65519.996, 65520, -65520, 2.0 ** -24, 2.0 ** -25, 2.0 ** -25 * 1.0001, 3 * 2.0 ** -26,
                       -0.0, np.inf, -np.inf], np.float32)
  nans = np.array([0x7fc00000, 0xffc00000, 0x7fc12345, 0xffe00001, 0x7fffffff], np.uint32).view(np.float32)
  extra = np.concatenate([specials, nans])
  x[rng.permutation(n)[:min(n, len(extra))]] = extra[:min(n, len(extra))]
  return x


@settings(max_examples=examples(30), **SETTINGS)
@given(seed=st.integers(0, 2 ** 32 - 1), n=st.integers(1, 5000))
def test_float32_to_float16_is_numpys_astype_bit_for_bit(native, seed, n):
  x = float32s(seed, n)
  with np.errstate(all="ignore"): want = x.astype(np.float16)
  got = on_cl(lambda t: t.cast(dtypes.float16), x)
  nan = np.isnan(x)
  np.testing.assert_array_equal(half_bits(got)[~nan], half_bits(want)[~nan])
  # NaNs: quiet ones keep their sign and top payload bits as numpy's do (the renderer makes them by hand; a signalling
  # NaN, which a conversion instruction would quiet, is only asked to stay a NaN of its sign)
  quiet = nan & ((x.view(np.uint32) & 0x400000) != 0)
  np.testing.assert_array_equal(half_bits(got)[quiet], half_bits(want)[quiet])
  assert np.isnan(got[nan]).all() and (np.signbit(got[nan]) == np.signbit(x[nan])).all()


@settings(max_examples=examples(15), **SETTINGS)
@given(seed=st.integers(0, 2 ** 32 - 1), n=st.integers(1, 5000))
def test_float16_to_float32_is_exact(native, seed, n):
  a = np.random.default_rng(seed).integers(0, 1 << 16, n, dtype=np.uint64).astype(np.uint16).view(np.float16)
  got, want = on_cl(lambda t: t.cast(dtypes.float32), a), a.astype(np.float32)
  # (NaNs: quiet ones bit for bit; a signalling one, which a conversion instruction would quiet, stays a NaN of its sign)
  quiet = ~np.isnan(a) | ((half_bits(a) & 0x200) != 0)
  np.testing.assert_array_equal(got.view(np.uint32)[quiet], want.view(np.uint32)[quiet])
  assert np.isnan(got[~quiet]).all() and (np.signbit(got[~quiet]) == np.signbit(want[~quiet])).all()
