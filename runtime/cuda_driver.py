"""A small ctypes binding of the CUDA driver API (libcuda.so.1), for the CUDA device (runtime/cuda_device.py).

Only the NVIDIA driver is needed: no CUDA toolkit, no nvcc, no pycuda. PTX text goes to the driver's own JIT
(cuModuleLoadDataEx), which compiles it for the GPU at hand.

The library is opened on first use, not on import: RULEC_CUDA_LIB names a path to use instead of
`libcuda.so.1`. A missing library, a driver that fails to initialise, or a machine without a CUDA device is a
CUDAUnavailable with a one-line message; every other failing call is a CUDAError naming the call and the driver's
own name and description of the result code.

Handles (contexts, modules, functions, events) are kept as ctypes.c_void_p; device addresses as Python ints
(CUdeviceptr is 64 bits wide). Every function's argument types are declared, so that ctypes never truncates a
64-bit handle or address to a C int.
"""
from __future__ import annotations

import ctypes
import os
import threading

__all__ = ["CUDAUnavailable", "CUDAError", "Driver", "driver", "pack_args", "launch_dims", "BLOCK", "MAX_GRID_X"]


class CUDAUnavailable(RuntimeError):
  """libcuda cannot be loaded, the driver does not initialise, or there is no CUDA device. One-line message."""


class CUDAError(RuntimeError):
  """A driver call failed: the message names the call, the CUresult's name and the driver's description."""
  def __init__(self, msg: str, call: str = "", code: int = 0):
    super().__init__(msg)
    self.call, self.code = call, code


# enum values from cuda.h; the driver keeps them stable across versions (they are its ABI)
CUDA_SUCCESS = 0
CUDA_ERROR_NOT_INITIALIZED = 3
CUDA_ERROR_NO_DEVICE = 100
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76
CU_JIT_INFO_LOG_BUFFER = 3
CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES = 4
CU_JIT_ERROR_LOG_BUFFER = 5
CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6
CU_EVENT_DEFAULT = 0
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8

_P, _U, _I, _S = ctypes.c_void_p, ctypes.c_uint, ctypes.c_int, ctypes.c_size_t
_PP, _PI, _U64 = ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int), ctypes.c_uint64
_CSTR = ctypes.POINTER(ctypes.c_char_p)

# name -> argument types. The _v2 names are the ones cuda.h maps the plain names to (64-bit sizes and addresses);
# the plain (non-_ptsz) names use the legacy default stream, which orders every call of the process: a
# synchronous copy therefore waits for the kernels launched before it.
SIGNATURES: dict[str, list] = {
  "cuInit": [_U],
  "cuDriverGetVersion": [_PI],
  "cuDeviceGetCount": [_PI],
  "cuDeviceGet": [_PI, _I],
  "cuDeviceGetName": [ctypes.c_char_p, _I, _I],
  "cuDeviceGetAttribute": [_PI, _I, _I],
  "cuDevicePrimaryCtxRetain": [_PP, _I],
  "cuCtxSetCurrent": [_P],
  "cuCtxSynchronize": [],
  "cuMemAlloc_v2": [ctypes.POINTER(_U64), _S],
  "cuMemFree_v2": [_U64],
  "cuMemcpyHtoD_v2": [_U64, _P, _S],
  "cuMemcpyDtoH_v2": [_P, _U64, _S],
  "cuMemcpyDtoD_v2": [_U64, _U64, _S],
  "cuMemsetD8_v2": [_U64, ctypes.c_ubyte, _S],
  "cuModuleLoadDataEx": [_PP, _P, _U, _PI, _PP],
  "cuModuleUnload": [_P],
  "cuModuleGetFunction": [_PP, _P, ctypes.c_char_p],
  "cuLaunchKernel": [_P, _U, _U, _U, _U, _U, _U, _U, _P, _PP, _PP],
  "cuFuncSetAttribute": [_P, _I, _I],
  "cuEventCreate": [_PP, _U],
  "cuEventRecord": [_P, _P],
  "cuEventSynchronize": [_P],
  "cuEventElapsedTime": [ctypes.POINTER(ctypes.c_float), _P, _P],
  "cuEventDestroy_v2": [_P],
  "cuGetErrorName": [_I, _CSTR],
  "cuGetErrorString": [_I, _CSTR],
}

# threads per block of a launch (nvptx.PTXProgram: each thread handles one index i < n)
BLOCK = 256
MAX_GRID_X = (1 << 31) - 1
JIT_LOG_BYTES = 1 << 16


def launch_dims(threads: int, block: int = BLOCK) -> tuple[int, int]:
  """(blocks, threads per block) for `threads` threads in one dimension: blocks of `block` (fewer threads for a
  small launch), as many as cover them. The kernel checks i < n itself for the last block's spare threads."""
  if threads < 1: raise ValueError(f"a launch needs at least one thread, got {threads}")
  per = min(block, threads)
  blocks = -(-threads // per)
  if blocks > MAX_GRID_X: raise ValueError(f"{threads} threads need {blocks} blocks of {per}; CUDA allows {MAX_GRID_X} in x")
  return blocks, per


def pack_args(ptrs, ints) -> tuple[ctypes.Array, ctypes.Array]:
  """The kernelParams of cuLaunchKernel: (values, params). `values` holds each argument's 8 bytes (a device
  address as u64, an integer as i64: both 8 bytes, in the entry's parameter order), `params` a pointer to each of
  them, which is what the driver reads. Both must stay alive until the launch call returns (the driver copies
  the values then)."""
  n = len(ptrs) + len(ints)
  values = (ctypes.c_uint64 * max(1, n))()
  for i, p in enumerate(ptrs): values[i] = p
  for i, x in enumerate(ints, len(ptrs)): values[i] = x & 0xFFFFFFFFFFFFFFFF   # an i64's two's complement bits
  base = ctypes.addressof(values)
  params = (ctypes.c_void_p * max(1, n))(*[base + 8 * i for i in range(n)])
  return values, params


def _one_line(s: str) -> str: return " ".join(str(s).split())


class Driver:
  """libcuda's functions with their CUresults checked. `lib` is the loaded library (ctypes.CDLL) or any object
  with the same functions (tests use a stand-in)."""
  def __init__(self, lib, path: str = "libcuda.so.1"):
    self.lib, self.path = lib, path
    if isinstance(lib, ctypes.CDLL):
      for name, args in SIGNATURES.items():
        try: f = getattr(lib, name)
        except AttributeError:
          raise CUDAUnavailable(f"{path} has no {name}: it is not a CUDA driver library, or one too old") from None
        f.argtypes, f.restype = args, ctypes.c_int

  # *** results ***

  def error_text(self, code: int) -> str:
    """'CUDA_ERROR_X (description)' for a CUresult, from the driver (just the number where it cannot say)."""
    name, desc = ctypes.c_char_p(), ctypes.c_char_p()
    try:
      self.lib.cuGetErrorName(code, ctypes.byref(name))
      self.lib.cuGetErrorString(code, ctypes.byref(desc))
    except Exception: pass   # (a stand-in or broken library: the number still says what failed)
    n = name.value.decode(errors="replace") if name.value else f"CUresult {code}"
    return f"{n} ({desc.value.decode(errors='replace')})" if desc.value else n

  def check(self, call: str, *args) -> None:
    """Call `call` with args; a CUDAError naming it when the result is not CUDA_SUCCESS."""
    r = getattr(self.lib, call)(*args)
    if r != CUDA_SUCCESS: raise CUDAError(f"{call} failed: {self.error_text(r)}", call, r)

  # *** devices and contexts ***

  def init(self) -> None:
    """cuInit; a driver that does not start (no device, no kernel module, a version mismatch) is CUDAUnavailable."""
    try: self.check("cuInit", 0)
    except CUDAError as e: raise CUDAUnavailable(f"the CUDA driver ({self.path}) did not initialise: {_one_line(e)}") from None

  def version(self) -> int:
    v = ctypes.c_int()
    self.check("cuDriverGetVersion", ctypes.byref(v))
    return v.value

  def device_count(self) -> int:
    n = ctypes.c_int()
    self.check("cuDeviceGetCount", ctypes.byref(n))
    return n.value

  def device(self, ordinal: int) -> int:
    d = ctypes.c_int()
    self.check("cuDeviceGet", ctypes.byref(d), ordinal)
    return d.value

  def device_name(self, dev: int) -> str:
    buf = ctypes.create_string_buffer(256)
    self.check("cuDeviceGetName", buf, 256, dev)
    return buf.value.decode(errors="replace")

  def attribute(self, attr: int, dev: int) -> int:
    v = ctypes.c_int()
    self.check("cuDeviceGetAttribute", ctypes.byref(v), attr, dev)
    return v.value

  def compute_capability(self, dev: int) -> tuple[int, int]:
    return (self.attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev),
            self.attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev))

  def primary_context(self, dev: int) -> ctypes.c_void_p:
    """The device's primary context, retained (the one the CUDA runtime, and so torch, uses too: both share it)."""
    ctx = ctypes.c_void_p()
    self.check("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
    return ctx

  def set_current(self, ctx: ctypes.c_void_p) -> None: self.check("cuCtxSetCurrent", ctx)
  def synchronize(self) -> None: self.check("cuCtxSynchronize")

  # *** memory (device addresses are ints) ***

  def alloc(self, nbytes: int) -> int:
    p = ctypes.c_uint64()
    self.check("cuMemAlloc_v2", ctypes.byref(p), nbytes)
    return p.value

  def free(self, ptr: int) -> None: self.check("cuMemFree_v2", ptr)
  def htod(self, dst: int, src_host: int, nbytes: int) -> None: self.check("cuMemcpyHtoD_v2", dst, src_host, nbytes)
  def dtoh(self, dst_host: int, src: int, nbytes: int) -> None: self.check("cuMemcpyDtoH_v2", dst_host, src, nbytes)
  def dtod(self, dst: int, src: int, nbytes: int) -> None: self.check("cuMemcpyDtoD_v2", dst, src, nbytes)
  def memset8(self, dst: int, value: int, nbytes: int) -> None: self.check("cuMemsetD8_v2", dst, value, nbytes)

  # *** modules and launches ***

  def load_module(self, ptx: str) -> ctypes.c_void_p:
    """A module JIT-compiled from PTX text. On failure the CUDAError carries the JIT's error log (the ptxas
    message that says which line and why) in its message and in `.log`."""
    err, info = ctypes.create_string_buffer(JIT_LOG_BYTES), ctypes.create_string_buffer(JIT_LOG_BYTES)
    opts = (ctypes.c_int * 4)(CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
                              CU_JIT_INFO_LOG_BUFFER, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES)
    # an option's value is a void*: a buffer's address, or a size passed as the pointer's value itself
    vals = (ctypes.c_void_p * 4)(ctypes.addressof(err), JIT_LOG_BYTES, ctypes.addressof(info), JIT_LOG_BYTES)
    image = ctypes.create_string_buffer(ptx.encode())   # (NUL-terminated: the driver finds the end of PTX text so)
    mod = ctypes.c_void_p()
    try: self.check("cuModuleLoadDataEx", ctypes.byref(mod), ctypes.addressof(image), 4, opts, vals)
    except CUDAError as e:
      log = err.value.decode(errors="replace").strip()
      out = CUDAError(f"{e}\n--- JIT error log ---\n{log or '(empty)'}", e.call, e.code)
      out.log = log
      raise out from None
    return mod

  def unload_module(self, mod: ctypes.c_void_p) -> None: self.check("cuModuleUnload", mod)

  def function(self, mod: ctypes.c_void_p, name: str) -> ctypes.c_void_p:
    fn = ctypes.c_void_p()
    self.check("cuModuleGetFunction", ctypes.byref(fn), mod, name.encode())
    return fn

  def set_max_dynamic_shared(self, fn: ctypes.c_void_p, nbytes: int) -> None:
    """Let `fn` launch with up to nbytes of dynamic shared memory (over 48 KB must be asked for)."""
    self.check("cuFuncSetAttribute", fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, nbytes)

  def launch(self, fn: ctypes.c_void_p, grid: tuple[int, int, int], block: tuple[int, int, int], params,
             shared: int = 0, stream=None) -> None:
    """cuLaunchKernel with `params` (pack_args's second array: a pointer to each argument's value)."""
    self.check("cuLaunchKernel", fn, *grid, *block, shared, stream, params, None)

  # *** events (device-side times) ***

  def event(self) -> ctypes.c_void_p:
    e = ctypes.c_void_p()
    self.check("cuEventCreate", ctypes.byref(e), CU_EVENT_DEFAULT)
    return e

  def record(self, ev: ctypes.c_void_p, stream=None) -> None: self.check("cuEventRecord", ev, stream)
  def event_synchronize(self, ev: ctypes.c_void_p) -> None: self.check("cuEventSynchronize", ev)
  def destroy_event(self, ev: ctypes.c_void_p) -> None: self.check("cuEventDestroy_v2", ev)

  def elapsed_ms(self, start: ctypes.c_void_p, end: ctypes.c_void_p) -> float:
    """Milliseconds between two recorded events (waits for `end` first)."""
    self.event_synchronize(end)
    ms = ctypes.c_float()
    self.check("cuEventElapsedTime", ctypes.byref(ms), start, end)
    return ms.value


_lock = threading.Lock()
_driver: dict[str, Driver] = {}   # library path -> the initialised driver


def library_path() -> str:
  return os.environ.get("RULEC_CUDA_LIB", "").strip() or "libcuda.so.1"


def driver() -> Driver:
  """The driver of the library RULEC_CUDA_LIB names (else libcuda.so.1), loaded and initialised once, with at least
  one device; CUDAUnavailable (one line) otherwise. A failure is not remembered: the next call tries again."""
  path = library_path()
  hit = _driver.get(path)
  if hit is not None: return hit
  with _lock:
    if path in _driver: return _driver[path]
    try: lib = ctypes.CDLL(path)
    except OSError as e:
      raise CUDAUnavailable(f"the CUDA device needs the NVIDIA driver's library {path}, which did not load "
                            f"({_one_line(e)}); set RULEC_CUDA_LIB to its path") from None
    drv = Driver(lib, path)
    drv.init()
    try: n = drv.device_count()
    except CUDAError as e: raise CUDAUnavailable(f"the CUDA driver cannot count devices: {_one_line(e)}") from None
    if n < 1: raise CUDAUnavailable(f"the CUDA driver ({path}) found no CUDA device")
    _driver[path] = drv
    return drv
