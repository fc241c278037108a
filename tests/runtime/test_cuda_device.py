"""The CUDA device where there is no GPU: the one-line CUDAUnavailable when the driver library is missing, the
launch arguments and dimensions, and the whole device path (open, allocate, upload, launch, download) against a
stand-in libcuda compiled from tests/runtime/fake_libcuda.c (skipped without a C compiler). The stand-in runs no
kernel: it checks what rulec hands the driver, through the real ctypes calls. Kernels on a GPU:
tests/runtime/test_cuda_on_gpu.py."""
import ctypes
import shutil
import subprocess
from pathlib import Path

import ml_dtypes  # noqa: F401  (registers np.dtype("bfloat16"))
import numpy as np
import pytest

from rulec.engine.ir.dtypes import dtypes
from rulec.engine.tensor import Tensor
from rulec.runtime import cuda_device, cuda_driver, devices
from rulec.runtime.buffer import buffer_of
from rulec.runtime.cuda_driver import CUDAError, CUDAUnavailable, launch_dims, pack_args


def _no_cuda_here() -> bool:
  try: cuda_driver.driver()
  except CUDAUnavailable: return True
  return False


NO_CUDA = pytest.mark.skipif(not _no_cuda_here(), reason="a CUDA driver is present here")


# *** without a driver ***

@NO_CUDA
def test_a_missing_driver_is_one_line_naming_the_library():
  with pytest.raises(CUDAUnavailable) as e: Tensor([1.0], device="CUDA").realize()
  msg = str(e.value)
  assert "\n" not in msg and "libcuda.so.1" in msg and "RULEC_CUDA_LIB" in msg
  assert devices.device_problem(e.value) == msg   # the rulec command prints it as one line


def test_rulec_cuda_lib_names_the_library(monkeypatch):
  monkeypatch.setenv("RULEC_CUDA_LIB", "/nonexistent/libcuda.so")
  monkeypatch.setattr(devices, "_cuda_checked", False)   # (on a GPU machine another test has opened the real driver)
  with pytest.raises(CUDAUnavailable) as e: Tensor([1.0], device="CUDA:1").realize()
  assert "\n" not in str(e.value) and "/nonexistent/libcuda.so" in str(e.value)
  with pytest.raises(CUDAUnavailable): devices.require_device("cuda")


@NO_CUDA
def test_a_kernel_on_cuda_without_a_driver_is_cuda_unavailable(monkeypatch):
  monkeypatch.setenv("RULEC_DEVICE", "CUDA")   # (the default device is not checked when named: its kernels are)
  with pytest.raises(CUDAUnavailable): (Tensor([1.0]) + 1).numpy()


def test_cuda_is_a_known_device_kind():
  assert "CUDA" in devices.DEVICES and devices.parse_device("cuda:2") == ("CUDA", 2)
  assert devices.separate_memory("CUDA", "CUDA:1") and not devices.separate_memory("CUDA", "CPU")


# *** launch arguments ***

def test_launch_dims():
  assert launch_dims(1) == (1, 1)
  assert launch_dims(255) == (1, 255)
  assert launch_dims(256) == (1, 256)
  assert launch_dims(257) == (2, 256)
  assert launch_dims(10**6) == (3907, 256)
  with pytest.raises(ValueError): launch_dims(0)
  with pytest.raises(ValueError): launch_dims(256 * (1 << 31))


def test_pack_args_points_at_each_value():
  ptrs, ints = [0x7F0000001000, 0, 0x7F0000001000], [5, -3, 1 << 40]
  values, params = pack_args(ptrs, ints)
  assert len(params) == 6
  got = [ctypes.c_uint64.from_address(params[i]).value for i in range(6)]
  assert got == [0x7F0000001000, 0, 0x7F0000001000, 5, (1 << 64) - 3, 1 << 40]
  assert ctypes.c_int64.from_address(params[4]).value == -3   # the kernel reads an i64
  # the driver reads each parameter through its pointer: 8 bytes apart, inside `values`
  assert [params[i] - ctypes.addressof(values) for i in range(6)] == [0, 8, 16, 24, 32, 40]
  _, p = pack_args([], [])   # (no parameters at all: still a valid array)
  assert len(p) == 1


# *** against the stand-in driver ***

@pytest.fixture(scope="module")
def fake_lib(tmp_path_factory):
  cc = shutil.which("cc") or shutil.which("gcc")
  if cc is None: pytest.skip("no C compiler for the stand-in libcuda")
  out = tmp_path_factory.mktemp("fakecuda") / "libfakecuda.so"
  src = Path(__file__).with_name("fake_libcuda.c")
  subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(out), str(src)], check=True)
  return str(out)


@pytest.fixture
def fake(fake_lib, monkeypatch):
  """The CUDA device backed by the stand-in: fresh device and program caches, put back afterwards."""
  monkeypatch.setenv("RULEC_CUDA_LIB", fake_lib)
  monkeypatch.setattr(cuda_device, "_devices", {})
  monkeypatch.setattr(cuda_device, "_programs", {})
  monkeypatch.setattr(cuda_device, "_by_ast", {})
  monkeypatch.setattr(devices, "_cuda_checked", False)
  lib = ctypes.CDLL(fake_lib)
  lib.fake_last_launch.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint)]

  def last_launch(nargs):
    args, dims = (ctypes.c_uint64 * 32)(), (ctypes.c_uint * 6)()
    lib.fake_last_launch(args, dims)
    return list(args[:nargs]), tuple(dims)
  return last_launch


def test_the_device_opens_with_its_architecture(fake):
  dev = cuda_device.get_device()
  assert dev.name == "Fake GPU" and dev.cc == (9, 0) and dev.arch == "sm_90"
  assert cuda_device.get_device(0) is dev
  with pytest.raises(CUDAUnavailable, match="CUDA:3 names CUDA device 3, but the driver shows 1"): cuda_device.get_device(3)
  cuda_device.synchronize()
  from rulec.device import Device
  Device["CUDA"].synchronize()
  assert Device["CUDA"].renderer.supported_dtypes() >= {dtypes.float64, dtypes.bfloat16, dtypes.float16}


def test_a_kernel_launch_passes_buffers_variables_and_n(fake, monkeypatch):
  a = Tensor(np.arange(1000, dtype=np.float32), device="CUDA")
  out = (a * 2).contiguous()
  from rulec.engine.sched.driver import schedule
  (k,) = schedule([out.uop], "CUDA")[0]
  monkeypatch.setenv("FAKE_CUDA_NARGS", str(len(k.bufs) + len(k.vars) + 1))
  before = dict(cuda_device.COUNTERS)
  cuda_device.run_kernel(k)
  comp = cuda_device.compile_kernel(k)
  args, dims = fake(len(k.bufs) + 1)
  mirrors = [buffer_of(b).mirror for b in k.bufs]
  assert args[:len(k.bufs)] == [m.ptr for m in mirrors] and all(args[:len(k.bufs)])
  assert args[-1] == comp.ptx.threads and dims == (*comp.grid, *comp.block)
  assert comp.grid[1:] == comp.block[1:] == (1, 1) and comp.grid[0] * comp.block[0] >= comp.ptx.threads
  # the input went up once; the output is device-valid and host-stale; the fake ran nothing, so it reads back the
  # bytes of fresh memory, while the input reads back what was uploaded (a real download through cuMemcpyDtoH)
  assert cuda_device.COUNTERS["uploads"] == before["uploads"] + 1
  dst, src = buffer_of(k.bufs[0]), buffer_of(k.bufs[1])
  assert not dst.host_valid and dst.mirror.valid
  src.host_valid = False   # (pretend a kernel wrote it: the host copy is then read back from the device)
  np.testing.assert_array_equal(src.host_view(), np.arange(1000, dtype=np.float32))
  # the same AST again: no new render, no new module
  compiled, loaded = cuda_device.COUNTERS["compiled"], cuda_device.COUNTERS["loaded"]
  cuda_device.run_kernel(k)
  assert (cuda_device.COUNTERS["compiled"], cuda_device.COUNTERS["loaded"]) == (compiled, loaded)


def test_untouched_buffers_are_zero_filled_and_empty_ones_get_no_memory(fake):
  from rulec.runtime.buffer import Buffer
  dev = cuda_device.get_device()
  b = Buffer("CUDA", 64, dtypes.int32)
  m = cuda_device.device_memory(b, dev)
  assert m.ptr and m.valid
  b.host_valid = False   # (read the device copy back)
  np.testing.assert_array_equal(b.host_view(), np.zeros(64, np.int32))
  e = Buffer("CUDA", 0, dtypes.float32)
  me = cuda_device.device_memory(e, dev)
  assert me.ptr == 0 and me.valid
  e.host_valid = False
  assert e.host_view().size == 0


def test_aliased_buffers_pass_one_address(fake, monkeypatch):
  from rulec.engine.ir.kernel import Kernel
  from rulec.engine.ir.ops import Ops
  from rulec.engine.ir.uop import UOp
  from rulec.runtime.buffer import new_buffer
  buf = new_buffer("CUDA", 64, dtypes.float32)
  buffer_of(buf).copyin(np.arange(64, dtype=np.float32))
  p0, p1 = (UOp(Ops.PARAM, dtypes.float32, (), (i, 64)) for i in range(2))
  r = UOp.range(64, 0)
  k = Kernel(UOp.sink(p0.index(r).store(p1.index(r) * 2).end(r)), (buf, buf))   # x = x * 2, in place
  monkeypatch.setenv("FAKE_CUDA_NARGS", "3")
  cuda_device.run_kernel(k)
  args, _ = fake(3)
  assert args[0] == args[1] == buffer_of(buf).mirror.ptr != 0


def test_a_ptx_the_driver_rejects_carries_the_jit_log(fake):
  dev = cuda_device.get_device()
  with pytest.raises(CUDAError) as e: dev.drv.load_module("// BROKEN\n.version 8.0\n")
  assert "cuModuleLoadDataEx failed: CUDA_ERROR_INVALID_PTX (a PTX JIT compilation failed)" in str(e.value)
  assert "line 3: BROKEN is no instruction" in str(e.value) and e.value.code == 218


def test_profiled_launches_give_event_times(fake, monkeypatch):
  monkeypatch.setenv("RULEC_CUDA_PROFILE", "1")
  monkeypatch.setenv("FAKE_CUDA_NARGS", "0")
  (Tensor(np.ones(8, np.float32), device="CUDA") + 1).realize()
  assert cuda_device.EVENTS and cuda_device.event_times() == [1.5] and not cuda_device.EVENTS


def test_the_driver_library_must_have_the_functions(tmp_path, monkeypatch):
  # a library that loads but is no CUDA driver: one line saying which function it lacks
  cc = shutil.which("cc") or shutil.which("gcc")
  if cc is None: pytest.skip("no C compiler")
  (tmp_path / "x.c").write_text("int cuInit(unsigned f) { return 0; }\n")
  subprocess.run([cc, "-shared", "-fPIC", "-o", str(tmp_path / "libx.so"), str(tmp_path / "x.c")], check=True)
  monkeypatch.setenv("RULEC_CUDA_LIB", str(tmp_path / "libx.so"))
  with pytest.raises(CUDAUnavailable, match="has no cuDriverGetVersion") as e: cuda_driver.driver()
  assert "\n" not in str(e.value)

