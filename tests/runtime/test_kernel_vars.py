"""Kernels with variables (DEFINE_VAR) as scalar arguments: compiled once, run for any value of the variable.

Kernels are built by hand (docs/architecture.md, "Kernel level") with DEFINE_VARs inside their index arithmetic and
values, and run on CPU, NUMPY and CL for several values of each variable, against numpy. A program is compiled once
for every value (the compile counters and the pipeline's lowering are counted); a value outside its variable's range
and the wrong number of values are refused; validate refuses malformed DEFINE_VARs; and a variable's name, text
from user code, never reaches the source a renderer prints."""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from rulec.codegen import llvmir, opencl, pipeline
from rulec.engine.ir.dtypes import DType, dtypes
from rulec.engine.ir.kernel import Kernel, arg_problem, validate
from rulec.engine.ir.ops import Ops
from rulec.engine.ir.uop import UOp
from rulec.runtime import cl_device, cpu_device, cpu_workers, devices
from rulec.runtime.buffer import buffer_of, new_buffer, np_dtype

F32 = dtypes.float32
HOSTILE = 'x); system("rm"); //'


def _cl_problem() -> str | None:
  if importlib.util.find_spec("pyopencl") is None:
    return "the CL device needs pyopencl: pip install pyopencl pocl-binary-distribution"
  try: cl_device.get_device()
  except cl_device.CLUnavailable as e: return f"no OpenCL device: {e}"
  return None


CL_PROBLEM = _cl_problem()
CL = pytest.param("CL", marks=pytest.mark.skipif(CL_PROBLEM is not None, reason=str(CL_PROBLEM)))
DEVICES = ["CPU", "NUMPY", CL]


# *** helpers ***

def buf(device: str, data, dtype: DType = F32) -> UOp:
  arr = np.asarray(data)
  b = new_buffer(device, arr.size, dtype)
  buffer_of(b).copyin(arr.astype(np_dtype(dtype)).reshape(-1))
  return b


def param(slot: int, b: UOp) -> UOp: return UOp(Ops.PARAM, b.dtype, (), (slot, b.arg[2]))
def read(b: UOp) -> np.ndarray: return buffer_of(b).host_view().copy()


def kernel(bufs, *stores) -> Kernel:
  k = Kernel(UOp.sink(*stores), tuple(bufs))
  validate(k)
  return k


class Lowerings:
  """Counts the kernels the compile pipeline lowers (validate, decompose, optimize): once per compile."""
  def __init__(self, monkeypatch):
    self.n, real = 0, pipeline.lower
    def counting(*a, **kw):
      self.n += 1
      return real(*a, **kw)
    monkeypatch.setattr(pipeline, "lower", counting)


def compiles(device: str) -> int:
  """Programs the device has made so far (built or loaded from the disk cache)."""
  if device == "CPU": return cpu_device.COUNTERS["compiled"] + cpu_device.COUNTERS["loaded"]
  if device == "CL": return cl_device.COUNTERS["compiled"] + cl_device.COUNTERS["loaded"]
  return 0


@pytest.fixture(autouse=True)
def fresh_cache(cache_dir):
  """A disk cache of each test's own: a kernel an earlier test compiled is compiled here again (and counted)."""
  yield cache_dir


def forget(k: Kernel) -> None:
  """The in-process program caches without k (ASTs are hash-consed: another test may have built the same one)."""
  for table in (cpu_device._by_ast, cl_device._by_ast):
    for key in [key for key in table if key[0] is k.ast]: del table[key]


def run_for_values(monkeypatch, device: str, k: Kernel, values, check, searched: bool = False) -> None:
  """Run k for each of `values` (one var_vals tuple each), check(value) after each; the kernel is lowered and
  compiled once, on its first launch, and never again (with RULEC_SEARCH, `searched`: its candidates too)."""
  forget(k)
  low = Lowerings(monkeypatch)
  before = compiles(device)
  for i, vals in enumerate(values):
    devices.run_kernel(k, device, vals)
    check(vals)
    if i == 0: first = compiles(device)
  assert low.n == (0 if device == "NUMPY" else 1), f"lowered {low.n} times for {len(values)} values"
  assert compiles(device) == first, "compiled again for another value"
  if not searched: assert first - before <= 1


# *** the cases ***

@pytest.mark.parametrize("device", DEVICES)
def test_shifted_read(monkeypatch, device):
  n, hi = 64, 16
  x = np.arange(n + hi, dtype=np.float32) * 1.5 - 7
  out, inp = buf(device, np.zeros(n)), buf(device, x)
  p0, p1 = param(0, out), param(1, inp)
  r, v = UOp.range(n, 0), UOp.variable("start_pos", 0, hi)
  k = kernel((out, inp), p0.index(r).store(p1.index(r + v)).end(r))
  assert k.vars == (v,)
  def check(vals): np.testing.assert_array_equal(read(out), x[vals[0]:vals[0] + n])
  run_for_values(monkeypatch, device, k, [(0,), (5,), (16,), (1,), (5,)], check)


@pytest.mark.parametrize("device", DEVICES)
def test_shifted_write_leaves_the_rest(monkeypatch, device):
  n, hi = 8, 6
  x = np.arange(1, n + 1, dtype=np.float32) * 10
  size = n + 4 * hi
  out, inp = buf(device, np.full(size, -1.0)), buf(device, x)
  p0, p1 = param(0, out), param(1, inp)
  r, v = UOp.range(n, 0), UOp.variable("slot", 0, hi)
  k = kernel((out, inp), p0.index(r + v * 4).store(p1.index(r)).end(r))
  def check(vals):
    got, at = read(out), vals[0] * 4
    want = np.full(size, -1.0, np.float32)
    want[at:at + n] = x
    np.testing.assert_array_equal(got, want)
    buffer_of(out).copyin(np.full(size, -1.0, np.float32))   # the next value starts from the sentinel again
  run_for_values(monkeypatch, device, k, [(0,), (3,), (6,), (1,)], check)


@pytest.mark.parametrize("device", DEVICES)
def test_2d_kernel_split_across_threads(monkeypatch, device):
  # big enough that the CPU splits its outer range across threads at launch (runtime/cpu_device.py MIN_SPLIT_WORK):
  # the variable's value goes through the workers' trampoline too
  monkeypatch.setenv("RULEC_THREADS", "2")
  rows, cols, hi = 256, 512, 8
  x = np.random.default_rng(0).standard_normal((rows + hi) * cols).astype(np.float32)
  out, inp = buf(device, np.zeros(rows * cols)), buf(device, x)
  p0, p1 = param(0, out), param(1, inp)
  r0, r1, v = UOp.range(rows, 0), UOp.range(cols, 1), UOp.variable("row0", 0, hi)
  k = kernel((out, inp), p0.index(r0 * cols + r1).store(p1.index((r0 + v) * cols + r1) * 2.0).end(r0, r1))
  split = []
  if device == "CPU":
    real = cpu_workers.Workers.run
    def spy(self, fn, calls, nvars=0):
      split.append((len(calls), nvars))
      return real(self, fn, calls, nvars)
    monkeypatch.setattr(cpu_workers.Workers, "run", spy)
    lowered = pipeline.lower(k, "CPU", cpu_device.opt_target(), cpu_device.optional_decompositions())
    assert any(a.op == "THREAD" for a in lowered.actions), lowered.actions
  def check(vals): np.testing.assert_array_equal(read(out), x.reshape(rows + hi, cols)[vals[0]:vals[0] + rows].reshape(-1) * 2)
  run_for_values(monkeypatch, device, k, [(0,), (7,), (8,), (3,)], check)
  if device == "CPU": assert split and all(c == (2, 1) for c in split), split


def _matmul(device, hi=8, m=64, kk=48, n=64):
  """out[m, n] = A[r0 + v, :] @ B: a sum whose loads move with the variable (the optimizer tiles it)."""
  rng = np.random.default_rng(1)
  a = rng.standard_normal(((m + hi), kk)).astype(np.float32)
  b = rng.standard_normal((kk, n)).astype(np.float32)
  out, pa, pb = buf(device, np.zeros(m * n)), buf(device, a), buf(device, b)
  p0, p1, p2 = param(0, out), param(1, pa), param(2, pb)
  r0, r1, r2, v = UOp.range(m, 0), UOp.range(n, 1), UOp.range(kk, 2), UOp.variable("off", 0, hi)
  s = UOp(Ops.REDUCE, F32, (p1.index((r0 + v) * kk + r2) * p2.index(r2 * n + r1), r2), Ops.ADD)
  k = kernel((out, pa, pb), p0.index(r0 * n + r1).store(s).end(r0, r1))
  def check(vals):
    np.testing.assert_allclose(read(out).reshape(m, n), a[vals[0]:vals[0] + m] @ b, rtol=1e-4, atol=1e-4)
  return k, check


@pytest.mark.parametrize("device", DEVICES)
def test_tiled_sum_with_a_variable_offset(monkeypatch, device):
  k, check = _matmul(device)
  if device == "CPU":
    acts = pipeline.lower(k, "CPU", cpu_device.opt_target(), cpu_device.optional_decompositions()).actions
    assert [a.op for a in acts].count("UPCAST") == 2, acts   # a register tile: the loads' strides are known
  run_for_values(monkeypatch, device, k, [(0,), (3,), (8,)], check)


@pytest.mark.skipif(CL_PROBLEM is not None, reason=str(CL_PROBLEM))
def test_gpu_tiles_and_staged_blocks_with_a_variable(monkeypatch):
  # the CL device shaped as a GPU's: register tiles in work-groups, blocks of the sum staged in local memory
  import attrs

  dev = cl_device.get_device()
  monkeypatch.setattr(dev, "target", attrs.evolve(dev.target, tile=256, group=0))
  k, check = _matmul("CL")
  acts = pipeline.lower(k, "CL", dev.target, dev.optional).actions
  assert {"UPCAST", "LOCAL", "STAGE"} <= {a.op for a in acts}, acts
  run_for_values(monkeypatch, "CL", k, [(0,), (5,), (8,)], check)
  forget(k)   # (built for the GPU-shaped target)


@pytest.mark.parametrize("device", ["CPU", CL])
def test_search_times_candidates_at_the_launch_values(monkeypatch, device):
  # RULEC_SEARCH: candidates are compiled and timed with the variable set to the first launch's value
  monkeypatch.setenv("RULEC_SEARCH", "1")
  module = cpu_device if device == "CPU" else cl_device
  timed, real = [], module._time_candidate
  def spy(*a):
    timed.append(a[-1])
    return real(*a)
  monkeypatch.setattr(module, "_time_candidate", spy)
  n, hi = 4096, 100
  x = np.random.default_rng(3).standard_normal(n + hi).astype(np.float32)
  out, inp = buf(device, np.zeros(n)), buf(device, x)
  p0, p1 = param(0, out), param(1, inp)
  r, v = UOp.range(n, 0), UOp.variable("at", 0, hi)
  k = kernel((out, inp), p0.index(r).store(p1.index(r + v) + 1.0).end(r))
  def check(vals): np.testing.assert_array_equal(read(out), x[vals[0]:vals[0] + n] + 1)
  run_for_values(monkeypatch, device, k, [(37,), (0,), (100,)], check, searched=True)
  assert timed and all(t == (37,) for t in timed), timed


def _gpu_shaped_cases(device):
  """(kernel, check, the CL actions expected on a GPU-shaped target) for kernels whose loads move with a variable:
  an elementwise kernel scaled by it (VECTOR), one sum of a long shifted slice (GROUP, vector loads, GRID), and a
  row's max subtracted from the row (SPREAD: the row per work-group)."""
  rng = np.random.default_rng(4)
  n = 8192
  x = rng.standard_normal(n).astype(np.float32)
  out, inp = buf(device, np.zeros(n)), buf(device, x)
  p0, p1, r, v = param(0, out), param(1, inp), UOp.range(n, 0), UOp.variable("s", -5, 5)
  k = kernel((out, inp), p0.index(r).store(p1.index(r) * v.cast(F32)).end(r))
  yield k, (lambda vals: np.testing.assert_array_equal(read(out), x * np.float32(vals[0]))), {"VECTOR"}, [(-5,), (2,)]
  m = 1 << 16
  y = rng.standard_normal(m + 100).astype(np.float32)
  o1, inp2 = buf(device, np.zeros(1)), buf(device, y)
  q0, q1, rr, w = param(0, o1), param(1, inp2), UOp.range(m, 0), UOp.variable("w", 0, 100)
  k = kernel((o1, inp2), q0.index(UOp.const(dtypes.index, 0)).store(UOp(Ops.REDUCE, F32, (q1.index(rr + w), rr), Ops.ADD)))
  def check_sum(vals):
    np.testing.assert_allclose(read(o1)[0], y[vals[0]:vals[0] + m].astype(np.float64).sum(), rtol=1e-4, atol=1e-2)
  yield k, check_sum, {"GROUP", "VECTOR", "GRID"}, [(0,), (37,), (100,)]
  rows, cols = 32, 256
  z = rng.standard_normal((rows + 4) * cols).astype(np.float32)
  o3, inp3 = buf(device, np.zeros(rows * cols)), buf(device, z)
  a0, a1, u = param(0, o3), param(1, inp3), UOp.variable("u", 0, 4)
  r0, r1, r2 = UOp.range(rows, 0), UOp.range(cols, 1), UOp.range(cols, 2)
  mx = UOp(Ops.REDUCE, F32, (a1.index((r0 + u) * cols + r2), r2), Ops.MAX)
  k = kernel((o3, inp3), a0.index(r0 * cols + r1).store(a1.index((r0 + u) * cols + r1) - mx).end(r0, r1))
  def check_rows(vals):
    zz = z.reshape(rows + 4, cols)[vals[0]:vals[0] + rows]
    np.testing.assert_array_equal(read(o3).reshape(rows, cols), zz - zz.max(1, keepdims=True))
  yield k, check_rows, {"SPREAD"}, [(0,), (3,), (4,)]


@pytest.mark.parametrize("device", DEVICES)
def test_gpu_shaped_actions_with_a_variable(monkeypatch, device):
  # on CL, the device shaped as a GPU's: vector loads and stores, work-group reductions (one value in several
  # work-groups), a row per work-group
  if device == "CL":
    import attrs
    dev = cl_device.get_device()
    monkeypatch.setattr(dev, "target", attrs.evolve(dev.target, vector=4, group=64, grid=8))
  for k, check, acts, values in _gpu_shaped_cases(device):
    if device == "CL":
      got = {a.op for a in pipeline.lower(k, "CL", dev.target, dev.optional).actions}
      assert acts <= got, (acts, got)
    run_for_values(monkeypatch, device, k, values, check)
    forget(k)


@pytest.mark.parametrize("device", DEVICES)
def test_guarded_read(monkeypatch, device):
  # WHERE((r0 + v) < n, in[r0 + v], 0): past the end the read is out of bounds and discarded
  n, hi = 16, 20
  x = np.arange(1, n + 1, dtype=np.float32)
  out, inp = buf(device, np.full(n, -1.0)), buf(device, x)
  p0, p1 = param(0, out), param(1, inp)
  r, v = UOp.range(n, 0), UOp.variable("shift", 0, hi)
  k = kernel((out, inp), p0.index(r).store(((r + v) < n).where(p1.index(r + v), 0.0)).end(r))
  def check(vals):
    want = np.zeros(n, np.float32)
    s = vals[0]
    if s < n: want[:n - s] = x[s:]
    np.testing.assert_array_equal(read(out), want)
  run_for_values(monkeypatch, device, k, [(0,), (4,), (15,), (16,), (20,), (2,)], check)


@pytest.mark.parametrize("device", DEVICES)
def test_two_variables_in_name_order(monkeypatch, device):
  # created zeta first, but launched in name order: alpha, zeta
  n = 32
  x = np.arange(128, dtype=np.float32)   # (r * alpha reaches 31 * 4)
  out, inp = buf(device, np.zeros(n)), buf(device, x)
  p0, p1 = param(0, out), param(1, inp)
  r = UOp.range(n, 0)
  zeta, alpha = UOp.variable("zeta", 0, 10), UOp.variable("alpha", 1, 4)
  k = kernel((out, inp), p0.index(r).store(p1.index(r + zeta) + p1.index(r * alpha)).end(r))
  assert k.vars == (alpha, zeta)
  assert "vars 'alpha'[1..4] 'zeta'[0..10]" in repr(k) and "DEFINE_VAR" in k.render()
  def check(vals):
    a, z = vals
    np.testing.assert_array_equal(read(out), x[np.arange(n) + z] + x[np.arange(n) * a])
  run_for_values(monkeypatch, device, k, [(1, 0), (4, 10), (2, 7), (3, 3)], check)


@pytest.mark.parametrize("dtype", [dtypes.index, dtypes.int32, dtypes.int8], ids=lambda d: d.name)
@pytest.mark.parametrize("device", DEVICES)
def test_variable_as_a_float_value(monkeypatch, device, dtype):
  n = 24
  x = np.random.default_rng(2).standard_normal(n).astype(np.float32)
  out, inp = buf(device, np.zeros(n)), buf(device, x)
  p0, p1 = param(0, out), param(1, inp)
  r, v = UOp.range(n, 0), UOp.variable("scale", -100, 100, dtype)
  k = kernel((out, inp), p0.index(r).store(p1.index(r) * v.cast(F32)).end(r))
  def check(vals): np.testing.assert_array_equal(read(out), x * np.float32(vals[0]))
  run_for_values(monkeypatch, device, k, [(-100,), (0,), (3,), (100,), (-7,)], check)


@pytest.mark.parametrize("device", DEVICES)
def test_a_hostile_name_is_never_printed(monkeypatch, device):
  n = 16
  x = np.arange(n + 4, dtype=np.float32)
  out, inp = buf(device, np.zeros(n)), buf(device, x)
  p0, p1 = param(0, out), param(1, inp)
  r, v = UOp.range(n, 0), UOp.variable(HOSTILE, 0, 4)
  k = kernel((out, inp), p0.index(r).store(p1.index(r + v) + v.cast(F32)).end(r))
  def check(vals): np.testing.assert_array_equal(read(out), x[vals[0]:vals[0] + n] + vals[0])
  run_for_values(monkeypatch, device, k, [(0,), (4,), (2,)], check)
  if device == "CPU":
    lowered = pipeline.lower(k, "CPU", cpu_device.opt_target(), cpu_device.optional_decompositions())
    text, _ = llvmir.render(lowered.kernel, "kernel", k.vars)
  elif device == "CL": text = cl_device.render(k).source
  else: return
  assert HOSTILE not in text and "system" not in text and '"rm"' not in text, text


def test_renderers_name_variables_by_position():
  out = new_buffer("CPU", 8, F32)
  p0, r = param(0, out), UOp.range(8, 0)
  a, b = UOp.variable("b_second", 0, 3), UOp.variable("a_first", 0, 3)
  k = kernel((out,), p0.index(r).store((r + a * 2 + b).cast(F32)).end(r))
  ir_text, _ = llvmir.render(k)
  assert 'i64 %"v0", i64 %"v1", i64 %".' in ir_text and 'mul i64 %"v1", 2' in ir_text, ir_text
  src = opencl.render(k).source
  assert "long var0, long var1)" in src and "first" not in src and "second" not in src, src


# *** errors ***

@pytest.mark.parametrize("device", DEVICES)
def test_launch_refuses_values_out_of_range_or_miscounted(device):
  out, inp = buf(device, np.zeros(4)), buf(device, np.arange(10))
  p0, p1 = param(0, out), param(1, inp)
  r, v = UOp.range(4, 0), UOp.variable("start_pos", 1, 6)
  k = kernel((out, inp), p0.index(r).store(p1.index(r + v)).end(r))
  for bad in ((0,), (7,), (-1,)):
    with pytest.raises(ValueError, match=r"variable 'start_pos' is -?\d+, outside its range \[1, 6\]"):
      devices.run_kernel(k, device, bad)
  for bad in ((), (1, 2)):
    with pytest.raises(ValueError, match="takes 1 variable value .'start_pos'., got"):
      devices.run_kernel(k, device, bad)
  with pytest.raises(TypeError, match="must be an int"): devices.run_kernel(k, device, (2.0,))
  # a kernel without variables takes none
  plain = kernel((out, inp), p0.index(r).store(p1.index(r)).end(r))
  with pytest.raises(ValueError, match="takes 0 variable values"): devices.run_kernel(plain, device, (1,))
  devices.run_kernel(plain, device)
  np.testing.assert_array_equal(read(out), [0, 1, 2, 3])
  devices.run_kernel(k, device, (np.int64(6),))   # a numpy integer is an int
  np.testing.assert_array_equal(read(out), [6, 7, 8, 9])
  # a kernel that carries its values (Kernel.vals, as the scheduler makes them) runs with them when none are given
  devices.run_kernel(k.with_vals({v: 2}), device)
  np.testing.assert_array_equal(read(out), [2, 3, 4, 5])
  devices.run_kernel(k.with_vals({v: 2}), device, (3,))
  np.testing.assert_array_equal(read(out), [3, 4, 5, 6])
  with pytest.raises(ValueError, match="outside its range"): devices.run_kernel(k.with_vals({v: 9}), device)


def _var_kernel(var: UOp) -> Kernel:
  out = UOp(Ops.BUFFER, F32, (), (10**9, "CPU", 8))
  p0, r = param(0, out), UOp.range(8, 0)
  if var.dtype.is_int and var.dtype is not dtypes.index: var = var.cast(dtypes.index)
  return Kernel(UOp.sink(p0.index(r).store((r + var).cast(F32)).end(r)), (out,))


@pytest.mark.parametrize("arg, what", [
  ((5, 0, 3), "name"),
  ((b"n", 0, 3), "name"),
  (("n", 5, 2), "lo > hi"),
  # (names of their own: an arg equal to a sound one, ("n", 0.0, 3) == ("n", 0, 3), would be hash-consed into one
  # node with it, whichever was made first)
  (("float_bound", 0.0, 3), "bounds are ints"),
  (("bool_bound", 0, True), "bounds are ints"),
  (("n", 0, 1 << 63), "beyond int64"),
  (("n", -(1 << 63) - 1, 0), "beyond int64"),
  (("n", 0), "(name, lo, hi)"),
  ("n", "(name, lo, hi)"),
])
def test_validate_refuses_a_bad_define_var(arg, what):
  var = UOp(Ops.DEFINE_VAR, dtypes.index, (), arg)
  assert arg_problem(var) is not None and what in arg_problem(var)
  with pytest.raises(ValueError, match="invalid kernel") as e: validate(_var_kernel(var))
  assert what in str(e.value)


def test_validate_refuses_bad_define_var_nodes():
  ok = UOp.variable("n", 0, 3)
  validate(_var_kernel(ok))
  assert arg_problem(ok) is None and arg_problem(UOp.variable(HOSTILE, -5, 5)) is None
  # a float variable, one with sources, one beyond its dtype
  for var, what in ((UOp(Ops.DEFINE_VAR, F32, (), ("n", 0, 3)), "not an integer"),
                    (UOp(Ops.DEFINE_VAR, dtypes.index, (UOp.const(dtypes.index, 1),), ("n", 0, 3)), "sources"),
                    (UOp.variable("n", 0, 300, dtypes.int8), "beyond its dtype int8")):
    with pytest.raises(ValueError, match="invalid kernel") as e: validate(_var_kernel(var))
    assert what in str(e.value), str(e.value)
  # two variables of one name with different bounds, or dtypes
  for other in (UOp.variable("n", 0, 4), UOp.variable("n", 0, 3, dtypes.int32).cast(dtypes.index)):
    with pytest.raises(ValueError, match="two different DEFINE_VARs named 'n'"): validate(_var_kernel(ok + other))


def test_copy_kernels_have_no_variables():
  a, b = new_buffer("CPU", 4, F32), new_buffer("NUMPY", 4, F32)
  p0, p1, r = param(0, a), param(1, b), UOp.range(4, 0)
  assert devices.copy_buffers(Kernel(UOp.sink(p0.index(r).store(p1.index(r)).end(r)), (a, b))) == (a, b)
  v = UOp.variable("n", 0, 0)
  assert devices.copy_buffers(Kernel(UOp.sink(p0.index(r + v).store(p1.index(r + v)).end(r)), (a, b))) is None


def test_cache_keys_name_the_variable_not_its_value():
  # the kernel's structure (what the disk caches key on) holds the name and range, never a value; the program's text
  # names variables by position, so kernels that differ only in a variable's name share one program
  from rulec.engine.ir.kernel import structure
  a, b, c = (_var_kernel(UOp.variable(n, 0, hi)) for n, hi in (("n", 3), ("m", 3), ("n", 4)))
  assert len({structure(k.ast) for k in (a, b, c)}) == 3 and "'n', 0, 3" in structure(a.ast)
  assert len({cpu_device._kernel_key(k, None) for k in (a, b, c)}) == 3
  out = new_buffer("CPU", 8, F32)
  before = cpu_device.COUNTERS["compiled"]
  for name, val in (("first_name", 2), ("second_name", 5)):
    k = _var_kernel(UOp.variable(name, 0, 7, dtypes.int32))
    k = Kernel(k.ast, (out,))
    forget(k)
    devices.run_kernel(k, "CPU", (val,))
    np.testing.assert_array_equal(read(out), np.arange(8) + val)
  assert cpu_device.COUNTERS["compiled"] - before <= 1


# *** prepared launches (TinyJit's replays on CL) ***

@pytest.mark.skipif(CL_PROBLEM is not None, reason=str(CL_PROBLEM))
def test_a_prepared_launch_runs_and_checks_like_run_kernel():
  out, inp = buf("CL", np.zeros(4)), buf("CL", np.arange(10))
  p0, p1 = param(0, out), param(1, inp)
  r, v = UOp.range(4, 0), UOp.variable("start_pos", 1, 6)
  k = kernel((out, inp), p0.index(r).store(p1.index(r + v)).end(r))
  launch = devices.launcher(k, "CL")
  assert launch is not None and devices.launcher(k, "CPU") is None and devices.launcher(k, "NUMPY") is None
  bufs = [buffer_of(b) for b in k.bufs]
  for value in (1, 6, 3):
    launch(bufs, (value,))
    np.testing.assert_array_equal(read(out), np.arange(value, value + 4))
  for bad in ((0,), (7,)):
    with pytest.raises(ValueError, match=r"variable 'start_pos' is -?\d+, outside its range \[1, 6\]"): launch(bufs, bad)
  with pytest.raises(ValueError, match="takes 1 variable values, got 2"): launch(bufs, (1, 2))
  # other Buffers of the same sizes: one written from the host since (uploaded first), the output read back after
  other_out, other_in = buf("CL", np.zeros(4)), buf("CL", np.zeros(10))
  buffer_of(other_in).copyin(np.arange(100, 110, dtype=np.float32))
  launch([buffer_of(other_out), buffer_of(other_in)], (2,))
  np.testing.assert_array_equal(read(other_out), [102, 103, 104, 105])
  np.testing.assert_array_equal(read(out), [3, 4, 5, 6])   # (the first output is left as it was)


@pytest.mark.skipif(CL_PROBLEM is not None, reason=str(CL_PROBLEM))
def test_jit_replays_on_cl_through_prepared_launches(monkeypatch):
  from rulec import Tensor, TinyJit, Variable
  from rulec.engine import realize
  table = Tensor(np.arange(64, dtype=np.float32).reshape(16, 4), device="CL").realize()
  @TinyJit
  def step(x, pos):
    row = table[pos:pos + 1]                     # an offset that is a kernel argument
    return ((x * 2 + row).relu() @ table.T).realize()
  pos = Variable("pos", 0, 15)
  xs = [np.random.default_rng(i).standard_normal((1, 4)).astype(np.float32) for i in range(8)]
  want = lambda x, p: np.maximum(x * 2 + np.arange(64, dtype=np.float32).reshape(16, 4)[p], 0) @ \
    np.arange(64, dtype=np.float32).reshape(16, 4).T
  for i in range(3): step(Tensor(xs[i], device="CL"), pos.bind(i)).numpy()   # run, capture, replay
  calls = []
  real = cl_device.run_kernel
  monkeypatch.setattr(cl_device, "run_kernel", lambda *a, **kw: (calls.append(a), real(*a, **kw))[1])
  before = realize.COUNTERS["run"]
  for i in range(3, 8):
    np.testing.assert_allclose(step(Tensor(xs[i], device="CL"), pos.bind(i * 2 - 1)).numpy(), want(xs[i], i * 2 - 1),
                               rtol=1e-5, atol=1e-4)
  assert calls == [], "a replay went through run_kernel, not its prepared launches"
  assert realize.COUNTERS["run"] - before >= 5   # (every replayed kernel is still counted)
