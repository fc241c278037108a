"""The CUDA device on a real GPU, against the NUMPY reference device: elementwise ops, broadcasting, reductions, a
matmul, float16 / bfloat16 casts, a jitted loop, reading results back, and moving tensors between CUDA and CPU.
Bit for bit where the result is one correctly rounded operation (+ - * and casts); sums within a float tolerance
(the GPU adds in another order). Skipped where no CUDA device can be opened (tests/runtime/test_cuda_device.py
covers that case)."""
import ml_dtypes  # noqa: F401  (registers np.dtype("bfloat16"))
import numpy as np
import pytest

from rulec.engine.ir.dtypes import dtypes
from rulec.engine.tensor import Tensor
from rulec.runtime import cuda_device
from rulec.runtime.buffer import buffer_of
from tests.tensor_core_programs import TC_PROGRAMS, check

try: DEV = cuda_device.get_device()
except cuda_device.CUDAUnavailable as e: pytest.skip(f"no CUDA device: {e}", allow_module_level=True)

RNG = np.random.default_rng(0)
X = RNG.standard_normal((37, 300)).astype(np.float32)   # (sizes that leave a partial block of 256 threads)
Y = RNG.standard_normal((37, 300)).astype(np.float32)


def both(fn, *arrays, dtype=None):
  """fn on CUDA tensors and on NUMPY tensors of the same data, as numpy arrays (CUDA's, the reference's)."""
  got = fn(*[Tensor(a, dtype=dtype, device="CUDA") for a in arrays]).numpy()
  ref = fn(*[Tensor(a, dtype=dtype, device="NUMPY") for a in arrays]).numpy()
  return got, ref


@pytest.mark.parametrize("op", ["add", "sub", "mul"])
@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float64, dtypes.float16, dtypes.bfloat16, dtypes.int32])
def test_elementwise_is_bit_exact(op, dtype):
  fn = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b}[op]
  a, b = (X * 100, Y * 100) if dtype is dtypes.int32 else (X, Y)
  got, ref = both(fn, a, b, dtype=dtype)
  np.testing.assert_array_equal(got, ref)


def test_broadcast_is_bit_exact():
  got, ref = both(lambda a, b: a * b[0:1, :] + a[:, 0:1], X, Y)
  np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("src, dst", [(dtypes.float32, dtypes.float16), (dtypes.float32, dtypes.bfloat16),
                                      (dtypes.float16, dtypes.float32), (dtypes.bfloat16, dtypes.float32),
                                      (dtypes.float16, dtypes.bfloat16), (dtypes.float32, dtypes.int32),
                                      (dtypes.float64, dtypes.float32), (dtypes.int32, dtypes.float16)])
def test_casts_are_bit_exact(src, dst):
  data = X * 1000 if dst is dtypes.int32 or src is dtypes.int32 else X * 3
  got, ref = both(lambda a: a.cast(dst), data, dtype=src)
  np.testing.assert_array_equal(got, ref)


def test_special_values_survive_a_half_cast():
  v = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 65504.0, 1e6, 6e-8, 1e-10], np.float32)
  for dst in (dtypes.float16, dtypes.bfloat16):
    got, ref = both(lambda a: a.cast(dst), v)
    np.testing.assert_array_equal(got, ref)
    assert np.signbit(got[4])


@pytest.mark.parametrize("axis", [None, 0, 1])
def test_sums_agree_within_a_tolerance(axis):
  got, ref = both(lambda a: a.sum(axis), X)
  np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-4)


def test_max_and_mean():
  got, ref = both(lambda a: a.max(1), X)
  np.testing.assert_array_equal(got, ref)
  got, ref = both(lambda a: a.mean(0), X)
  np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


def test_a_big_sum():
  big = RNG.standard_normal(1 << 22).astype(np.float32)
  got = Tensor(big, device="CUDA").sum().numpy()
  np.testing.assert_allclose(got, big.astype(np.float64).sum(), rtol=1e-4, atol=1e-2)


@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float16, dtypes.bfloat16])
def test_matmul(dtype):
  a = RNG.standard_normal((65, 130)).astype(np.float32)
  b = RNG.standard_normal((130, 33)).astype(np.float32)
  got, ref = both(lambda x, y: (x @ y).cast(dtypes.float32), a, b, dtype=dtype)
  tol = 1e-4 if dtype is dtypes.float32 else 3e-2
  np.testing.assert_allclose(got, ref, rtol=tol, atol=tol * 10)


@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16])
@pytest.mark.parametrize("name", list(TC_PROGRAMS))
def test_tensor_core_matmuls(name, dtype):
  check("CUDA", cuda_device.COUNTERS, name, dtype)


def test_a_big_tensor_core_matmul_against_numpy():
  a, b = RNG.standard_normal((1024, 2048)).astype(np.float32), RNG.standard_normal((2048, 512)).astype(np.float32)
  ta, tb = Tensor(a, device="CUDA").half(), Tensor(b, device="CUDA").half()
  got = (ta @ tb).float().numpy()
  want = ta.float().numpy() @ tb.float().numpy()
  np.testing.assert_allclose(got, want, rtol=2e-2, atol=0.5)


def test_results_read_back_and_stay_on_the_device():
  t = Tensor(X, device="CUDA")
  y = (t * 2).realize()
  buf = buffer_of(y.uop.base)   # (a realized tensor's base is its BUFFER)
  assert not buf.host_valid and buf.mirror is not None and buf.mirror.owner is DEV   # (nothing read back yet)
  z = (y + 1).realize()   # a chain on the device: y is not downloaded for it
  np.testing.assert_array_equal(z.numpy(), X * 2 + 1)
  np.testing.assert_array_equal(y.numpy(), X * 2)


def test_moving_between_cuda_and_cpu():
  a = Tensor(X, device="CPU")
  on_gpu = (a.to("CUDA") * 3).realize()
  assert on_gpu.device == "CUDA"
  back = (on_gpu.to("CPU") + 1).realize()
  assert back.device == "CPU"
  np.testing.assert_array_equal(back.numpy(), X * 3 + 1)
  # a CPU kernel's result read by a CUDA kernel (uploaded from its host copy)
  c = (a * 2).realize()
  np.testing.assert_array_equal((c.to("CUDA") - 1).numpy(), X * 2 - 1)


def test_empty_tensors():
  e = Tensor(np.zeros((0, 4), np.float32), device="CUDA")
  assert (e + 1).numpy().shape == (0, 4)
  assert e.sum().numpy() == 0


def test_a_jitted_loop_of_100_realizes():
  from rulec import TinyJit
  w = Tensor(RNG.standard_normal((64, 64)).astype(np.float32) * 0.1, device="CUDA").realize()

  @TinyJit
  def step(x):
    return ((x @ w).relu() + x).realize()

  x = Tensor(np.ones((4, 64), np.float32), device="CUDA").realize()
  want = np.ones((4, 64), np.float32)
  wn = w.numpy()
  for _ in range(100):
    x = step(x)
    want = np.maximum(want @ wn, 0) + want
  cuda_device.synchronize()
  np.testing.assert_allclose(x.numpy(), want, rtol=1e-3, atol=1e-3)


def test_device_handle_and_counters():
  from rulec.device import Device
  d = Device["CUDA"]
  assert dtypes.float64 in d.renderer.supported_dtypes() and dtypes.bfloat16 in d.renderer.supported_dtypes()
  before = dict(cuda_device.COUNTERS)
  (Tensor(X, device="CUDA") * 5).realize()
  d.synchronize()
  assert cuda_device.COUNTERS["run"] > before["run"]
