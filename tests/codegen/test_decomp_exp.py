"""The CPU's exp2 / log2 decomposition (rules/decomp.rules exp2_* / log2_*, codegen/decomp.py) against
numpy. Finite results are within their ulp budget of the exact value: exp2 computes in float32 (so that it runs
sixteen lanes to an instruction) and stays within EXP2_ULPS, below numpy's own float32 exp2 (up to 2.84 ulp off
over a sweep of every binade, measured by test_exp2_budget_is_below_numpys); log2 computes in float64 and is within
0.5 ulp plus a hair (the correctly rounded float, over every float32 input). Where the result is inf, NaN or exactly
0 it is numpy's, sign included. float16 (through float32, as numpy computes it) is numpy's float16 answer bit for
bit. Also: the rules apply where a device asks (the CPU; the CL device on a CPU: tests/runtime/test_cl_device.py checks
its results), leave float64 to libm, and leave no call in the machine code, the baseline target's included; and the row
max softmax takes first (a float max reduction, run in interleaved lanes) is the NUMPY reference device's."""
import re

import ml_dtypes  # noqa: F401  (registers np.dtype("bfloat16"))
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rulec.engine.ir.dtypes import dtypes
from rulec.engine.ir.ops import Ops
from rulec.engine.tensor import Tensor
from rulec.runtime import cpu_device
from rulec.codegen.decomp import decomposed

ULP_BUDGET = {"exp2": 1.25, "log2": 0.5 + 2.0 ** -20}
N = 1 << 16   # every run has this many elements, so that all share one compiled kernel per function


def cpu(fn: str, x: np.ndarray) -> np.ndarray:
  pad = np.zeros(-len(x) % N, x.dtype)
  return getattr(Tensor(np.concatenate([x, pad]), device="CPU"), fn)().numpy()[:len(x)]


def ulps(got: np.ndarray, exact: np.ndarray) -> np.ndarray:
  """|got - exact| in units of float32's last place at exact (subnormal spacing below 2**-126; an infinite result of
  a finite exact value counts as 2**128, the next power of two past the largest float)."""
  g = got.astype(np.float64)
  g = np.where(np.isinf(g) & np.isfinite(exact), np.copysign(2.0 ** 128, g), g)
  e = np.floor(np.log2(np.maximum(np.abs(exact), 2.0 ** -126)))
  return np.abs(g - exact) / 2.0 ** (np.minimum(e, 127) - 23)


def check(fn: str, x: np.ndarray) -> float:
  """Compare the CPU with numpy on float32 x; the largest error in ulps."""
  x = x.astype(np.float32)
  got = cpu(fn, x)
  with np.errstate(all="ignore"):
    want = getattr(np, fn)(x)                        # numpy's float32 answer
    exact = getattr(np, fn)(x.astype(np.float64))    # the true value, to 53 bits
    rounded = exact.astype(np.float32)
  # NaN, infinite and exactly zero results are numpy's, sign included. (Subnormal results are measured in ulps like
  # any other: numpy's own float32 exp2 is an ulp off there, 0 for 2**-149.5 where the nearest float is 2**-149.)
  special = np.isnan(rounded) | np.isinf(rounded) | (exact == 0)
  same = (got == want) & (np.signbit(got) == np.signbit(want)) | np.isnan(got) & np.isnan(want)
  bad = special & ~same
  assert not bad.any(), f"{fn} of {x[bad][:8]}: got {got[bad][:8]}, numpy {want[bad][:8]}"
  err = ulps(got[~special], exact[~special])
  assert not err.size or err.max() <= ULP_BUDGET[fn], f"{fn}({x[~special][err.argmax()]!r}): {err.max():.3f} ulp"
  return float(err.max()) if err.size else 0.0


def bits(n: int, seed: int) -> np.ndarray:
  return np.random.default_rng(seed).integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)


EDGES = [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1.0, -1.0, 0.5, 2.0, 1e-45, -1e-45, 1.1754942e-38, 1.1754944e-38,
         3.4028235e38, -3.4028235e38, 1e-30, 1e30, -1e30, 12582912.0, -12582912.0, 4194304.5]


def test_exp2_edges():
  x = np.array(EDGES + [128.0, 127.99999, 127.5, 127.0, 126.5, 129.0, 150.0, -126.0, -126.5, -127.0, -140.3, -149.0,
                        -149.5, -149.99, -150.0, -150.0001, -151.0, -152.0, -1000.0, 0.49999997, -0.5, 0.5, 1e-7, -1e-7]
               + list(np.arange(-152, 131, dtype=np.float64)) + list(np.arange(-152, 131) + 0.5), np.float32)
  check("exp2", x)
  got = cpu("exp2", np.arange(-149, 128, dtype=np.float32))
  assert np.array_equal(got, np.exp2(np.arange(-149, 128, dtype=np.float64)).astype(np.float32))   # 2**n exactly


def test_log2_edges():
  powers = [2.0 ** k for k in range(-149, 128)]
  x = np.array(EDGES + powers + [p * 1.5 for p in powers[1:]] + [np.nextafter(np.float32(1), 2), np.nextafter(np.float32(1), 0),
               0.70710677, 0.7071068, 1.4142135, 1.4142137, -np.float32(2.0 ** -149)], np.float32)
  check("log2", x)
  assert np.array_equal(cpu("log2", np.array(powers, np.float32)), np.arange(-149, 128, dtype=np.float32))


def test_exp2_budget_is_below_numpys():
  # a dense sweep of every binade exp2 can return a finite nonzero float for: the decomposition's worst error is
  # inside the budget, and numpy's own float32 exp2 is worse on the same inputs
  x = np.concatenate([np.linspace(lo, lo + 1, 1 << 12, dtype=np.float64) for lo in range(-150, 128)]).astype(np.float32)
  ours = check("exp2", x)
  with np.errstate(all="ignore"):
    exact = np.exp2(x.astype(np.float64))
    finite = np.isfinite(exact.astype(np.float32)) & (exact.astype(np.float32) != 0)
    theirs = ulps(np.exp2(x)[finite], exact[finite]).max()
  assert ours <= ULP_BUDGET["exp2"] < theirs, (ours, theirs)


@pytest.mark.parametrize("fn", ["exp2", "log2"])
def test_random_bits_and_ranges(fn):
  rng = np.random.default_rng(7)
  dense = rng.uniform(-152, 130, N) if fn == "exp2" else np.exp2(rng.uniform(-149, 128, N))
  near = rng.uniform(-1, 1, N) if fn == "exp2" else rng.uniform(0.69, 1.43, N)
  with np.errstate(all="ignore"): tiny = bits(N, 4) * np.float32(2.0 ** -100)
  for x in (bits(N, 3), dense, near, tiny):
    check(fn, x)


@settings(max_examples=60)
@given(st.lists(st.floats(width=32), min_size=1, max_size=64), st.sampled_from(["exp2", "log2"]))
def test_hypothesis_floats(xs, fn):
  check(fn, np.array(xs, np.float32))


@pytest.mark.parametrize("fn", ["exp2", "log2"])
def test_float16_every_value(fn):
  x = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
  got = cpu(fn, x)
  with np.errstate(all="ignore"): want = getattr(np, fn)(x)
  assert got.dtype == np.float16 and np.array_equal(np.isnan(got), np.isnan(want))
  ok = np.isnan(want) | (got.view(np.uint16) == want.view(np.uint16))   # NaN payloads aside, bit for bit
  assert ok.all(), f"{fn} of {x[~ok][:8]}: got {got[~ok][:8]}, numpy {want[~ok][:8]}"


def _kernel(t: Tensor):
  (k,) = t.schedule()
  return k


def test_cpu_only_and_float64_left_to_libm():
  from rulec.codegen.llvmir import render
  for d in (dtypes.float32, dtypes.float16):
    t = Tensor(np.ones(16, d.np_name), device="CPU")
    k = _kernel(t.exp2() + t.log2())
    ops = {u.op for u in decomposed(k, cpu_device.optional_decompositions()).ast.toposort()}
    assert not ops & {Ops.EXP2, Ops.LOG2}
    assert not re.search(r"llvm\.(exp2|log2)", render(decomposed(k, cpu_device.optional_decompositions()))[0])
    assert {Ops.EXP2, Ops.LOG2} <= {u.op for u in decomposed(k).ast.toposort()}   # not unless asked for
  t = Tensor(np.ones(16), device="CPU")
  text, _ = render(decomposed(_kernel(t.exp2() + t.log2()), cpu_device.VECTOR_MATH))
  assert "llvm.exp2.f64" in text and "llvm.log2.f64" in text


def test_libm_switch(monkeypatch):
  monkeypatch.setenv("RULEC_CPU_LIBM", "1")
  assert cpu_device.optional_decompositions() == frozenset({Ops.INDEX})   # (loads into the buffers' slack stay)
  monkeypatch.setenv("RULEC_CPU_LIBM", "0")
  # and MULACC where the JIT's target has FMA: exp2's polynomial steps are fmas there
  cpu_device._jit()
  fma = "+fma" in cpu_device._target[1].split(",")
  assert cpu_device.optional_decompositions() == {Ops.EXP2, Ops.LOG2, Ops.INDEX} | ({Ops.MULACC} if fma else set())


def test_no_calls_on_the_baseline_target(monkeypatch):
  # vector code from instructions every x86-64 (or the architecture's baseline) has: no call to libm or compiler-rt
  import llvmlite.binding as llvm
  from rulec.codegen.llvmir import render
  cpu_device._jit()
  monkeypatch.setenv("RULEC_CPU_TARGET", "baseline")
  name, features = cpu_device.target_cpu()
  tm = llvm.Target.from_triple(llvm.get_process_triple()).create_target_machine(cpu=name, features=features, opt=3, jit=True)
  def asm(k, optional: frozenset) -> str:
    mod = llvm.parse_assembly(render(decomposed(k, optional))[0])
    mod.triple, mod.data_layout = llvm.get_process_triple(), str(tm.target_data)
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pto.loop_vectorization = pto.slp_vectorization = True
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)
    return tm.emit_assembly(mod)
  t = Tensor(np.ones(1024, np.float32), device="CPU")
  assert re.search(r"\bcall", asm(_kernel(t.exp2()), frozenset()))   # what libm's exp2 looks like
  for out in (t.exp2(), t.log2(), t.softmax(-1), t.half().exp2()):
    for k in out.schedule():
      code = asm(k, cpu_device.VECTOR_MATH)
      assert not re.search(r"\bcall", code), code


@pytest.mark.parametrize("n", [32, 33, 47, 1024])
def test_max_rows_in_lanes(n):
  # softmax's row max runs in interleaved lanes (codegen/llvmir.py _max_in_lanes): the same values as the NUMPY
  # reference device, NaN, inf and rows of nothing but NaN or -inf included, remainders past the last full block too
  from tests.helpers import same_as_reference
  rng = np.random.default_rng(n)
  x = rng.standard_normal((9, n)).astype(np.float32)
  x[1, rng.integers(0, n, 5)] = np.nan
  x[2, -1] = np.inf
  x[3] = np.nan
  x[4] = -np.inf
  x[5, ::3] = np.nan
  x[5, -2] = 40.0
  x[6] = -np.abs(x[6])
  x[6, [0, n - 1]] = [0.0, -0.0]
  for dt in (dtypes.float32, dtypes.float64):
    same_as_reference("CPU", x, dt, lambda t: t.max(-1))
    same_as_reference("CPU", x, dt, lambda t: t.softmax(-1).max(0))


def test_cl_asks_on_a_cpu_device(cl_dev):
  from rulec.runtime import cl_device
  dev = cl_dev
  on_cpu = bool(dev.dev.type & dev.cl.device_type.CPU) and dev.target.fp64
  assert dev.optional == (cpu_device.VECTOR_MATH if on_cpu else frozenset())
  source = cl_device.render(_kernel(Tensor(np.ones(16, np.float32), device="CL").exp2()), dev=dev).source
  assert ("exp2(" in source) != on_cpu
