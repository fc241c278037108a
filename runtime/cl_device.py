"""The CL device: kernels as OpenCL C (codegen/opencl.py), run through pyopencl.

`pip install pyopencl pocl-binary-distribution` (the project's `opencl` extra)
gives a CPU OpenCL device (PoCL) on any machine. "CL" is the first device of
the first platform that has one, found at first use; RULEC_CL_DEVICE=n picks
the n-th device counted across platforms instead.

A kernel is decomposed (rules/decomp.rules; on a CPU device with fp64 the
optional float32 exp2 / log2 rules too: CLDevice.optional), rendered as OpenCL C, built once
per process per distinct source text (a program cache), and launched as a 1-D
NDRange of one work-item per element its store writes (see codegen/opencl.py),
with the local size taken from the device's and the kernel's work-group limits.
A kernel's variables (DEFINE_VAR) are `long` arguments after its buffers, set
at each launch from `var_vals` (np.int64): the source names them by position,
so one program serves every value (and every name).

float16 is stored as its bits and computed in float (codegen/opencl.py,
"Floats"); with RULEC_CL_HALF=1 it is OpenCL's `half`, computed natively, on a
device with cl_khr_fp16 (Target.half). Opt-in until it has run on NVIDIA's
compiler: it was checked on PoCL through an emulation, never on a GPU.

On an NVIDIA GPU of sm_80 or later, a float16 / bfloat16 matmul (a kernel with a
codegen/gemm_plan.py plan and no variables) is the CUDA device's tensor-core
kernel instead, as PTX that NVIDIA's OpenCL builds as a program binary
(TensorCoreProgram, codegen/nvptx.compile_for_opencl); RULEC_CL_TC=0 turns that
off. COUNTERS["tensor_cores"] counts those programs.

Programs built from source have their binaries written to the disk cache
(engine/diskcache.py), keyed by the source, the device, platform and
driver, the build options and pyopencl's version; a later process creates the
program from that binary instead of compiling it. A driver that is slow to hand
out binaries (PoCL) has them fetched when the process exits, for at most
RULEC_CL_SAVE_S seconds (default 10; save_binaries() writes all at once). (PoCL keeps its
own builds under POCL_CACHE_DIR too, which makes a warm build from source
cheaper, not free.) COUNTERS["compiled"] counts programs built from source,
COUNTERS["loaded"] those made from a cached binary.

Buffers: a kernel's buffers live on the device (runtime/buffer.py's Mirror):
the first kernel that names a buffer uploads its host contents, a kernel's
outputs stay on the device, and the host copy is refreshed only when the host
reads it (Tensor.numpy(), a CPU kernel). Kernels are enqueued without waiting
on an in-order queue; a host read waits for them. `TIMES` accumulates build
(from source), load (from a binary) and upload/download time; `synchronize()`
waits for every queued kernel.
"""
from __future__ import annotations

import atexit
import math
import os
import sys
import threading
import time
import types
import warnings
import weakref

import attrs
import numpy as np

from rulec.engine.ir.ops import Ops
from rulec.engine import diskcache
from rulec.runtime.buffer import Buffer, Mirror, buffer_of, np_dtype
from rulec.codegen import pipeline
from rulec.codegen.opencl import Target
from rulec.codegen.opt.search import repetitions
from rulec.engine.ir.kernel import Kernel

DEVICE = "CL"
COUNTERS = {"compiled": 0, "loaded": 0, "run": 0, "uploads": 0, "downloads": 0, "tensor_cores": 0}
TIMES = {"build_s": 0.0, "load_s": 0.0, "upload_s": 0.0, "download_s": 0.0}

EVENTS: list = []   # with RULEC_CL_PROFILE=1: every launch's event (the caller clears it)

_lock = threading.RLock()
_device: "CLDevice | None" = None
_devices: dict[int, "CLDevice"] = {}   # "CL:n" -> its device (n = 0 is _device)
_programs: dict[tuple[int, str], "Program"] = {}


class CLUnavailable(RuntimeError):
  """pyopencl is missing, or no OpenCL device can be found."""


class CLBuildError(RuntimeError):
  """The OpenCL compiler rejected a kernel; the message holds the source and the build log."""


def _cl():
  try:
    import pyopencl as cl
  except ImportError as e:
    raise CLUnavailable(f"the CL device needs pyopencl ({e}); install it with "
                        "`pip install pyopencl pocl-binary-distribution` (the `opencl` extra; PoCL is a CPU OpenCL device)") from None
  return cl


def all_devices() -> list:
  """Every OpenCL device, platform by platform (what RULEC_CL_DEVICE indexes)."""
  cl = _cl()
  try: platforms = cl.get_platforms()
  except cl.Error as e:   # the ICD loader found no platform: clGetPlatformIDs fails with PLATFORM_NOT_FOUND_KHR
    raise CLUnavailable(f"no OpenCL platform found ({e}); `pip install pocl-binary-distribution` gives a CPU device") from e
  devs = []
  for p in platforms:
    try: devs.extend(p.get_devices())
    except cl.Error: continue   # a platform without devices
  if not devs:
    raise CLUnavailable("OpenCL platforms found, but no device: "
                        f"{', '.join(p.name for p in platforms)}; `pip install pocl-binary-distribution` gives a CPU device")
  return devs


def _nv_major(dev) -> int:
  """An NVIDIA device's compute capability major version (cl_nv_device_attribute_query), 0 where it does not say."""
  try: return int(dev.compute_capability_major_nv)
  except Exception: return 0   # (pyopencl raises its own errors for a missing extension; any of them means "unknown")


def _nv_minor(dev) -> int:
  try: return int(dev.compute_capability_minor_nv)
  except Exception: return 0


class CLDevice:
  """One OpenCL device with its context, in-order queue and compile target."""
  def __init__(self, index: int = 0):
    cl = self.cl = _cl()
    devs = all_devices()
    if not 0 <= index < len(devs):
      raise CLUnavailable(f"RULEC_CL_DEVICE={index}, but there are {len(devs)} OpenCL devices: "
                          + "; ".join(f"{i}: {d.name} ({d.platform.name})" for i, d in enumerate(devs)))
    self.index, self.dev = index, devs[index]
    self.ctx = cl.Context([self.dev])
    # RULEC_CL_PROFILE=1: each launch's event is kept in EVENTS, for device-side kernel times (bench/)
    self.profile = os.environ.get("RULEC_CL_PROFILE", "") not in ("", "0")
    props = cl.command_queue_properties.PROFILING_ENABLE if self.profile else 0
    self.queue = cl.CommandQueue(self.ctx, properties=props)
    ext = self.dev.extensions.split()
    # big reductions split into more parts on a GPU than on a CPU (engine/sched/early.py split_reduceop)
    self.split_parts = int(os.environ.get("RULEC_CL_SPLIT_PARTS", 0) or 0) or (4096 if self.dev.type & cl.device_type.GPU else 256)
    # vector loads and stores in contiguous elementwise kernels: on GPUs (RULEC_CL_VECTOR=0 turns them off)
    vector = int(os.environ.get("RULEC_CL_VECTOR", "") or (4 if self.dev.type & cl.device_type.GPU else 0))
    # register tiles in work-groups for matmul-shaped kernels (codegen/opt): on GPUs, as many work-items per group
    # as RULEC_CL_TILE allows (0 turns them off; tests turn them on for PoCL)
    is_gpu = bool(self.dev.type & cl.device_type.GPU)
    tile = int(os.environ.get("RULEC_CL_TILE", "") or (256 if is_gpu else 0))
    # one-pass reductions of a single value (GRID) over about four work-groups per compute unit, on GPUs: an H200's
    # 16M-float sum ran at 0.79-0.84 of a float4 copy in 256-1024 groups of 256-512 where two launches reached 0.72
    # (bench/cl_bandwidth_probe.py); rulec's own kernel took 0.0265 ms in 256 groups, 0.0237 in 512 (with
    # GRID_ACCS accumulators; bench/cl_sum_probe.py). RULEC_CL_GRID=n overrides (0 turns them off; tests turn them
    # on for PoCL)
    units = max(1, self.dev.max_compute_units)
    grid = int(os.environ.get("RULEC_CL_GRID", "") or (1 << round(math.log2(4 * units)) if is_gpu else 0))
    # STAGE's blocks in a ring of 3 local buffers, copied with cp.async (inline PTX), a matmul's A kept in rows too,
    # on NVIDIA GPUs of compute capability 8 or more (codegen/opencl.ASYNC_LOCAL_BYTES says what it measured);
    # RULEC_CL_ASYNC=n overrides the ring (0 turns it off; tests turn it on for PoCL, whose copies are then plain
    # float4 ones) and RULEC_CL_ASYNC_ROWS=0/1 the rows; RULEC_CL_ROW_VECTORS=1 reads those rows a float4 per four
    # steps (codegen/opencl._row_read: NVIDIA's compiler left them as scalar loads, 128 per 16 steps of the 4096^3
    # matmul; off: on the H100 it changed neither that matmul nor x @ W.T, bench/results/h100-2026-12-06-session25.txt)
    ptx = is_gpu and "NVIDIA" in self.dev.platform.name and _nv_major(self.dev) >= 8
    # the architecture NVIDIA's OpenCL builds PTX for (its tensor-core matmuls, TensorCoreProgram), else None
    self.nv_arch = f"sm_{_nv_major(self.dev)}{_nv_minor(self.dev)}" if ptx else None
    ring = int(os.environ.get("RULEC_CL_ASYNC", "") or (3 if ptx else 0))
    rows = os.environ.get("RULEC_CL_ASYNC_ROWS", "")
    # kernels with work-groups declare their size (reqd_work_group_size) on GPUs, so that NVIDIA's compiler knows the
    # registers a work-item may take: H200, bench/models.py, one run each, matmul 4096^3 3.38 -> 3.25 ms, the GPT-2
    # MLP 1.18 -> 1.11, its fwd+bwd 3.93 -> 3.81 (bench/results/gpu-2026-12-06-session26.txt); RULEC_CL_FIXED_GROUP=0/1
    # overrides
    fixed = os.environ.get("RULEC_CL_FIXED_GROUP", "")
    # float16 as OpenCL's `half`, computed natively (codegen/opencl.py _half_alu), with RULEC_CL_HALF=1 where the
    # device has cl_khr_fp16; otherwise stored as its bits and computed in float. Opt-in until tests/codegen/
    # test_opencl_native_half.py has run on a device that has the extension (its values were checked on PoCL through
    # an emulation only): NVIDIA's OpenCL lists no cl_khr_fp16 (H100, driver 580.159.04: the tests skipped there), so
    # on NVIDIA GPUs float16 stays in float and only the tensor-core matmuls compute in half.
    # The two render different sources, which key the program and binary caches (and repr(target) RULEC_SEARCH's)
    half = "cl_khr_fp16" in ext and os.environ.get("RULEC_CL_HALF", "").strip() == "1"
    self.target = Target(fp64="cl_khr_fp64" in ext, half=half, group=group_size(self.dev), vector=vector if vector in (2, 4, 8, 16) else 0,
                         tile=min(tile, self.dev.max_work_group_size) if tile > 0 else 0, units=units,
                         grid=grid if grid >= 2 else 0, async_copy=ring if ring >= 2 else 0, ptx=ptx,
                         async_rows=rows == "1" if rows else ptx,
                         row_vectors=os.environ.get("RULEC_CL_ROW_VECTORS", "") == "1",
                         fixed_group=fixed == "1" if fixed else is_gpu)
    self.max_work_group = self.dev.max_work_group_size
    self.max_item0 = self.dev.max_work_item_sizes[0]
    self.units = units
    is_cpu = bool(self.dev.type & cl.device_type.CPU)
    # the optional decompositions of rules/decomp.rules asked for: float32 exp2 / log2 as float64 polynomials, on a
    # CPU device (PoCL: softmax 4096x1024 68 -> 22 ms, its exp2 and log2 do not vectorise as well) with fp64;
    # RULEC_CL_VECTOR_MATH=1 asks on any device with fp64, 0 on none. Either way they are correctly rounded.
    want = os.environ.get("RULEC_CL_VECTOR_MATH", "")
    vector_math = self.target.fp64 and (want not in ("", "0") or (want == "" and is_cpu))
    self.optional = frozenset({Ops.EXP2, Ops.LOG2}) if vector_math else frozenset()
    self.pool = MemoryPool(self, int(os.environ.get("RULEC_CL_POOL_MB", 0) or 0) << 20 or
                           min(self.dev.global_mem_size // 4, (1 << 30) if is_cpu else (8 << 30)))
    self.search_queue = None   # RULEC_SEARCH's timing queue (profiling on), made when first needed
    self.fetch_s: float | None = None   # how long the driver took to hand out a program's binary (see _store_binary)
    self.options: list[str] = ["-w"]   # no warnings: a generated kernel's are noise (PoCL prints them to stderr)
    # IEEE division and sqrt in float32 (OpenCL otherwise allows 2.5 / 3 ulp), where the device offers it
    if self.dev.single_fp_config & cl.device_fp_config.CORRECTLY_ROUNDED_DIVIDE_SQRT:
      self.options.append("-cl-fp32-correctly-rounded-divide-sqrt")
    # more build options for every program, for measurements (-cl-nv-maxrregcount=N); part of the cache key below
    self.options += os.environ.get("RULEC_CL_OPTIONS", "").split()

  def cache_key(self, source: str) -> str:
    """The disk cache key of a program built from `source` for this device (engine/diskcache.py)."""
    d, p = self.dev, self.dev.platform
    return diskcache.key("cl", source, d.name, d.vendor, d.version, d.driver_version, p.name, p.vendor, p.version,
                            " ".join(self.options), ".".join(map(str, self.cl.VERSION)))

  def __repr__(self): return f"<CLDevice {self.index}: {self.dev.name.strip()} ({self.dev.platform.name}) {self.dev.version}>"


def group_size(dev) -> int:
  """Work-items that may share one reduction (codegen/opencl.py's group reductions): on GPUs up to 512 (and the
  device's work-group limit); 0 on CPU devices, where one work-item per output reducing a contiguous chunk is
  faster. RULEC_CL_GROUP=n overrides (0 turns them off; tests use it to run group reductions on PoCL)."""
  env = os.environ.get("RULEC_CL_GROUP", "")
  if env:
    try: want = int(env)
    except ValueError: raise CLUnavailable(f"RULEC_CL_GROUP={env!r} is not a number") from None
  else: want = 512 if dev.type & _cl().device_type.GPU else 0
  return min(want, dev.max_work_group_size, dev.max_work_item_sizes[0])


def get_device(n: int = 0) -> CLDevice:
  """The device "CL:n" names: the n-th after RULEC_CL_DEVICE's (n = 0: "CL" itself). Each has its own context,
  queue and buffers (PoCL shows several CPU devices with POCL_DEVICES="pthread pthread")."""
  global _device
  with _lock:
    if n in _devices: return _devices[n]
    try: index = int(os.environ.get("RULEC_CL_DEVICE", "0") or 0)
    except ValueError: raise CLUnavailable(f"RULEC_CL_DEVICE={os.environ['RULEC_CL_DEVICE']!r} is not a device number") from None
    try: dev = CLDevice(index + n)
    except CLUnavailable as e:
      if not n: raise
      raise CLUnavailable(f"CL:{n} is OpenCL device {index + n}, and there is none: {e} (PoCL on a CPU shows more "
                          'devices with POCL_DEVICES="pthread pthread")') from None
    # PoCL compiles a kernel lazily on its own worker thread when the kernel first runs; a process that exits
    # with kernels still queued tears LLVM down under that thread, which segfaults (one exit in five with a
    # cold POCL_CACHE_DIR). Waiting for the queue at exit, before the C library's destructors run, avoids it.
    # The binaries of the programs built are written to the disk cache then too (see _store_binary).
    if not _devices: atexit.register(_at_exit)
    _devices[n] = dev
    if n == 0: _device = dev
    return dev


def available() -> bool:
  """Whether a CL device can be opened (pyopencl installed, some OpenCL device present)."""
  try: get_device()
  except CLUnavailable: return False
  return True


def _numbered(src: str) -> str:
  return "\n".join(f"{i + 1:4d}  {line}" for i, line in enumerate(src.splitlines()))


# the largest work-group the runtime picks for a kernel that leaves the choice to it (RULEC_CL_LOCAL_MAX)
AUTO_LOCAL_MAX = int(os.environ.get("RULEC_CL_LOCAL_MAX", "") or 1024)


class _GroupTooLarge(Exception):
  """A group-reduction kernel was built, but the device runs it only in smaller work-groups (registers, barriers)."""
  def __init__(self, limit: int): self.limit = limit


class Program:
  """A built kernel and the work sizes it is launched with."""
  def __init__(self, dev: CLDevice, rendered):
    cl = dev.cl
    self.rendered, self.source = rendered, rendered.source
    t0 = time.perf_counter()
    digest = dev.cache_key(self.source)
    prg = self._from_binary(dev, digest)
    self.loaded = prg is not None
    if prg is None:
      prg = cl.Program(dev.ctx, self.source)
      try:
        with warnings.catch_warnings():
          warnings.simplefilter("ignore", cl.CompilerWarning)   # a non-empty build log (warnings) is not an error
          prg.build(options=dev.options)
      except cl.Error as e:
        try: log = prg.get_build_info(dev.dev, cl.program_build_info.LOG)
        except cl.Error: log = ""
        raise CLBuildError(f"OpenCL could not build a kernel for {dev!r}: {str(e).splitlines()[0] if str(e) else type(e).__name__}\n"
                           f"--- source ---\n{_numbered(self.source)}\n--- build log ---\n{log.strip() or str(e)}") from None
      self.kernel = cl.Kernel(prg, rendered.name)
      if diskcache.enabled(): _store_binary(dev, prg, digest)
    self.program = prg
    self.typed = False   # the scalar arguments' types given to pyopencl (at the first launch, which knows them)
    self.scratch = [cl.Buffer(dev.ctx, cl.mem_flags.READ_WRITE, n) for n in rendered.scratch]
    for buf, n in zip(self.scratch, rendered.scratch): cl.enqueue_fill_buffer(dev.queue, buf, np.uint8(0), 0, n)
    self.build_s = time.perf_counter() - t0
    # work sizes: enough work-groups for every compute unit, each as large as the device and the kernel allow
    n = rendered.global_size
    limit = min(dev.max_work_group, dev.max_item0,
                self.kernel.get_work_group_info(cl.kernel_work_group_info.WORK_GROUP_SIZE, dev.dev))
    if rendered.local_size:   # a group reduction: the work-group size is part of the kernel
      if rendered.local_size > limit: raise _GroupTooLarge(limit)
      self.local, self.global_ = rendered.local_size, n
    else:
      local = 1   # the largest power of two that still leaves a work-group for every compute unit
      limit = min(limit, AUTO_LOCAL_MAX)
      while local * 2 <= limit and -(-n // (local * 2)) >= dev.units: local *= 2
      self.local = local
      self.global_ = -(-n // local) * local
    self.global_dims, self.local_dims = (self.global_,), (self.local,)
    COUNTERS["loaded" if self.loaded else "compiled"] += 1
    TIMES["load_s" if self.loaded else "build_s"] += self.build_s

  def _from_binary(self, dev: CLDevice, digest: str):
    """The program made from a cached binary (its kernel in self.kernel), or None: no entry, or one the driver
    refuses (that one is rebuilt from source and written again)."""
    binary = diskcache.load("cl", digest)
    if binary is None: return None
    cl = dev.cl
    try:
      with warnings.catch_warnings():
        warnings.simplefilter("ignore", cl.CompilerWarning)
        prg = cl.Program(dev.ctx, [dev.dev], [binary]).build(options=dev.options)
      self.kernel = cl.Kernel(prg, self.rendered.name)
      return prg
    except (cl.Error, RuntimeError, ValueError):
      diskcache.reject("cl", digest)
      return None


class TensorCoreProgram:
  """A float16 / bfloat16 matmul on NVIDIA's tensor cores: codegen/nvptx.compile_for_opencl's PTX (the CUDA
  device's kernel, codegen/nvptx_gemm.py, its tiles sized for OpenCL's local memory), which NVIDIA's OpenCL builds
  as a program binary. Launched like a Program: its blocks are work-groups of a 3-D NDRange, and its shared memory
  is a __local argument after the buffers and the kernel's unused `long n`."""
  def __init__(self, dev: CLDevice, ptx):
    cl = dev.cl
    t0 = time.perf_counter()
    self.source = ptx.ptx
    try:
      with warnings.catch_warnings():
        warnings.simplefilter("ignore", cl.CompilerWarning)
        self.program = cl.Program(dev.ctx, [dev.dev], [ptx.ptx.encode()]).build()
      self.kernel = cl.Kernel(self.program, ptx.name)
    except (cl.Error, RuntimeError, ValueError) as e:
      raise CLBuildError(f"NVIDIA's OpenCL could not build a tensor-core kernel's PTX for {dev!r}: {e}\n"
                         f"--- PTX ---\n{_numbered(ptx.ptx)}") from None
    L = ptx.launch
    self.local_dims, self.global_dims = (L.block, 1, 1), (L.grid[0] * L.block, L.grid[1], L.grid[2])
    self.local, self.global_ = L.block, self.global_dims[0]
    self.rendered = types.SimpleNamespace(name=ptx.name, source=ptx.ptx, global_size=math.prod(self.global_dims))
    self.scratch = [np.int64(0), cl.LocalMemory(L.smem)]
    self.typed, self.loaded = False, False
    self.build_s = time.perf_counter() - t0
    COUNTERS["compiled"] += 1
    COUNTERS["tensor_cores"] += 1
    TIMES["build_s"] += self.build_s


_tc_refused: set = set()   # devices whose driver refused a tensor-core kernel (warned once; OpenCL C from then on)


def _tensor_core_program(kernel: Kernel, dev: CLDevice):
  """The kernel's TensorCoreProgram where it is a matmul the tensor cores run on this device, else None. A driver
  that refuses the PTX (another GPU, another driver) costs one warning, and the device's matmuls are OpenCL C from
  then on (correct, slower)."""
  if dev.nv_arch is None or dev.index in _tc_refused: return None
  from rulec.codegen import nvptx
  ptx = nvptx.compile_for_opencl(kernel, dev.nv_arch, dev.dev.local_mem_size)
  if ptx is None: return None
  try: return TensorCoreProgram(dev, ptx)
  except CLBuildError as e:
    _tc_refused.add(dev.index)
    warnings.warn(f"{str(e).splitlines()[0]}; CL:{dev.index} renders its float16/bfloat16 matmuls as OpenCL C instead "
                  f"(RULEC_CL_TC=0 says so without trying)", RuntimeWarning, stacklevel=2)
    return None


_unsaved: list = []   # (device, program, key) built from source whose binaries are not on disk yet
CHEAP_FETCH_S = 0.02  # a device that hands out a binary faster than this gets each one written right after its build


def _exit_budget() -> float:
  """Seconds spent at exit fetching and writing binaries (RULEC_CL_SAVE_S, default 10)."""
  try: return float(os.environ.get("RULEC_CL_SAVE_S", "") or 10.0)
  except ValueError: return 10.0


def _store_binary(dev: CLDevice, prg, digest: str) -> None:
  # Asking a driver for a binary can cost as much as the build did: PoCL compiles a generic work-group function for
  # it (50-100 ms a kernel, under the lock its kernel compiler holds, so another thread does not help). A GPU driver
  # has it at hand. So the first binary is fetched at once and timed: where that was cheap, every later one is
  # too; elsewhere they are fetched when the process is done (for at most RULEC_CL_SAVE_S seconds), or on
  # save_binaries(), not on the way to a first launch.
  with _lock:
    if dev.fetch_s is None:
      t0 = time.perf_counter()
      _write_binary(dev, prg, digest)
      dev.fetch_s = time.perf_counter() - t0
    elif dev.fetch_s < CHEAP_FETCH_S: _write_binary(dev, prg, digest)
    else: _unsaved.append((dev, prg, digest))


def _write_binary(dev: CLDevice, prg, digest: str) -> bool:
  try: (binary,) = prg.get_info(dev.cl.program_info.BINARIES)
  except (dev.cl.Error, ValueError): return False   # a driver that gives no binary: nothing to keep
  if not binary: return False
  diskcache.store("cl", digest, bytes(binary))
  return True


def save_binaries(budget_s: float | None = None) -> int:
  """Write the binaries of programs built and not yet written to the disk cache, oldest first, stopping once
  `budget_s` seconds are spent (None: all of them); the number written."""
  t0, n = time.perf_counter(), 0
  while _unsaved and (budget_s is None or time.perf_counter() - t0 < budget_s):
    with _lock:
      if not _unsaved: break
      n += _write_binary(*_unsaved.pop(0))
  return n


def _at_exit() -> None:
  synchronize()
  if diskcache.enabled(): save_binaries(_exit_budget())
  _unsaved.clear()


def render(kernel: Kernel, target=None, dev: "CLDevice | None" = None, var_vals: tuple[int, ...] | None = None):
  """The kernel as the OpenCL device runs it (a rulec.codegen.opencl.Rendered): validated, decomposed, optimized
  (codegen/opt) and rendered by codegen's pipeline. var_vals: the variables' values RULEC_SEARCH times candidates
  with (their lower bounds when None)."""
  dev = dev if dev is not None else get_device()
  target = target if target is not None else dev.target
  lowered = pipeline.lower(kernel, "CL", target, dev.optional,
                           timer=lambda k: _time_candidate(kernel, k, target, dev, var_vals))
  return pipeline.render(lowered.kernel, "CL", target, vars=kernel.vars)


def _var_args(kernel: Kernel, var_vals) -> list:
  """The variables' kernel arguments: np.int64 each (their lower bounds when var_vals is None)."""
  vals = var_vals if var_vals is not None else [v.arg[1] for v in kernel.vars]
  return [np.int64(v) for v in vals]


def _time_candidate(kernel: Kernel, opt: Kernel, target, dev: CLDevice, var_vals: tuple[int, ...] | None = None) -> float:
  """Seconds (median of RULEC_SEARCH launches, each waited for) of an optimized form of `kernel`, writing scratch
  device buffers in place of its outputs (the kernel runs for real afterwards)."""
  prog = Program(dev, pipeline.render(opt, "CL", target, vars=kernel.vars))
  if prog.rendered.global_size == 0: return 0.0
  outs, scratch, mems = kernel.outputs, {}, []
  for i, b in enumerate(kernel.bufs):
    buf = buffer_of(b)
    if i in outs:
      if id(buf) not in scratch: scratch[id(buf)] = dev.cl.Buffer(dev.ctx, dev.cl.mem_flags.READ_WRITE, max(1, buf.nbytes))
      mems.append(scratch[id(buf)])
    else: mems.append(device_memory(buf, dev).mem)
  prog.kernel.set_args(*mems, *_var_args(kernel, var_vals), *prog.scratch)
  # device time from profiling events, on a queue of its own: a wall clock around a launch and a wait adds tens of
  # microseconds, more than a GPU's memory-bound kernels take (it once ranked a slower one-pass sum first)
  if dev.search_queue is None:
    dev.search_queue = dev.cl.CommandQueue(dev.ctx, properties=dev.cl.command_queue_properties.PROFILING_ENABLE)
  dev.queue.finish()   # (the inputs and the scratch buffers are written on the device's own queue)
  times = []
  for _ in range(max(1, repetitions())):
    ev = dev.cl.enqueue_nd_range_kernel(dev.search_queue, prog.kernel, (prog.global_,), (prog.local,))
    ev.wait()
    times.append((ev.profile.end - ev.profile.start) * 1e-9)
  return sorted(times)[len(times) // 2]


_by_ast: dict[tuple, Program] = {}   # (AST, buffer aliasing) -> program: ASTs are hash-consed, equal kernels share one entry


def compile_kernel(kernel: Kernel, dev: CLDevice | None = None, var_vals: tuple[int, ...] | None = None) -> Program:
  """The built program for a kernel (validated and rendered the first time its AST is seen), cached by its source text.
  Its variables are arguments: one program for every value (var_vals: what RULEC_SEARCH times candidates with)."""
  dev = dev if dev is not None else get_device()
  ids = [id(b) for b in kernel.bufs]
  key = (kernel.ast, tuple(ids.index(i) for i in ids) if len(set(ids)) < len(ids) else None, dev.index)
  hit = _by_ast.get(key)
  if hit is not None: return hit
  if dev.nv_arch is not None:
    prog = _tensor_core_program(kernel, dev)
    if prog is not None:
      with _lock: _by_ast[key] = prog
      return prog
  target = dev.target
  tried: set[str] = set()
  limit = 0   # the work-group size the device last allowed (set when a build was too large)
  while True:
    rendered = render(kernel, target, dev, var_vals)
    if rendered.source in tried:   # the actions are forced (RULEC_OPT), so a smaller target changes nothing
      raise CLBuildError(f"{dev!r} runs this kernel in work-groups of at most {limit} work-items; its actions "
                         f"(RULEC_OPT) ask for {rendered.local_size}")
    tried.add(rendered.source)
    try:
      with _lock:
        prog = _programs.get((dev.index, rendered.source))
        if prog is None: prog = _programs[(dev.index, rendered.source)] = Program(dev, rendered)
        _by_ast[key] = prog
      return prog
    except _GroupTooLarge as e:   # render it again for the work-group size the device allows this kernel
      limit = e.limit
      smaller = 1 << (e.limit.bit_length() - 1)
      target = attrs.evolve(target, group=0 if e.limit < 32 else smaller, tile=0 if e.limit < 16 else smaller)


def _debug_level() -> int:
  try: return int(os.environ.get("RULEC_DEBUG", "0") or 0)
  except ValueError: return 0


class MemoryPool:
  """Device allocations of dead buffers, kept for the next buffer of the same size.

  A fresh allocation is expensive on the first kernel that touches it (NVIDIA's
  driver maps its pages then: about 2 ms for 256 MiB on an H200, 20 times the
  kernel), so a program that runs again with new tensors reuses the memory of
  the last run's, as torch's caching allocator does. Reuse is safe without
  waiting: the queue is in order, so a kernel still reading the old buffer
  finishes before any command on the new one. Memory beyond `limit` bytes is
  released."""
  def __init__(self, dev: "CLDevice", limit: int):
    self.dev, self.limit, self.held = dev, limit, 0
    self.free: dict[int, list] = {}

  def take(self, nbytes: int):
    size = max(1, nbytes)
    free = self.free.get(size)
    if free:
      self.held -= size
      return free.pop()
    cl = self.dev.cl
    try: return cl.Buffer(self.dev.ctx, cl.mem_flags.READ_WRITE, size)
    except cl.MemoryError:
      self.release()
      return cl.Buffer(self.dev.ctx, cl.mem_flags.READ_WRITE, size)

  def give(self, nbytes: int, mem) -> None:
    size = max(1, nbytes)
    if self.held + size > self.limit: return   # dropped: pyopencl releases it
    self.free.setdefault(size, []).append(mem)
    self.held += size

  def release(self) -> None:
    self.free.clear()
    self.held = 0


class CLMirror(Mirror):
  """A buffer's copy in one CL device's memory (from the device's pool; back to it when the buffer dies)."""
  def __init__(self, dev: CLDevice, nbytes: int):
    self.owner, self.nbytes = dev, nbytes
    self.mem = dev.pool.take(nbytes)
    weakref.finalize(self, dev.pool.give, nbytes, self.mem)

  def read_into(self, host) -> None:
    if not self.nbytes: return
    t0 = time.perf_counter()
    with _lock: self.owner.cl.enqueue_copy(self.owner.queue, host, self.mem, is_blocking=True)
    COUNTERS["downloads"] += 1
    TIMES["download_s"] += time.perf_counter() - t0


def device_memory(buf: Buffer, dev: CLDevice) -> CLMirror:
  """`buf`'s copy on `dev`, uploaded from the host if the device's copy is missing or stale."""
  m = buf.mirror
  if m is None or m.owner is not dev:
    nbytes = buf.size * np_dtype(buf.dtype).itemsize
    if m is not None and not buf.host_valid: buf.host_view()   # another device holds the data: bring it home first
    m = buf.mirror = CLMirror(dev, nbytes)
  if not m.valid and buf.untouched:
    if m.nbytes: dev.cl.enqueue_fill_buffer(dev.queue, m.mem, np.zeros(1, np.uint8), 0, m.nbytes)   # never written: zeros
    m.valid = True
  if not m.valid:
    host = buf.host_view()
    if host.nbytes:
      t0 = time.perf_counter()
      dev.cl.enqueue_copy(dev.queue, m.mem, host, is_blocking=True)
      COUNTERS["uploads"] += 1
      TIMES["upload_s"] += time.perf_counter() - t0
    m.valid = True
  return m


def synchronize() -> None:
  """Wait until every kernel enqueued so far has finished."""
  with _lock:
    for dev in list(_devices.values()): dev.queue.finish()


def run_kernel(kernel: Kernel, n: int = 0, var_vals: tuple[int, ...] = ()) -> None:
  """Run the kernel on device CL:n, its variables (Kernel.vars, in that order) set to var_vals."""
  var_vals = kernel.check_var_vals(var_vals)
  dev = get_device(n)
  prog = compile_kernel(kernel, dev, var_vals)   # validates the kernel the first time its AST is seen
  if _debug_level() >= 3: print(f"CL {kernel!r} local={prog.local} global={prog.global_}\n{prog.source}", file=sys.stderr)
  _launch(dev, prog, [buffer_of(b) for b in kernel.bufs], var_vals, kernel.outputs)


def _launch(dev: CLDevice, prog: Program, bufs: list[Buffer], var_vals: tuple[int, ...], outputs: tuple[int, ...]) -> None:
  COUNTERS["run"] += 1
  if prog.rendered.global_size == 0: return   # an empty range: nothing is stored
  with _lock:
    mems = []
    for buf in bufs:   # (device_memory, with its common case first: a launch is a few microseconds of host time)
      m = buf.mirror
      mems.append(m if m is not None and m.owner is dev and m.valid else device_memory(buf, dev))
    if not prog.typed:
      # Told which arguments are scalars (the variables' int64s), pyopencl packs Python ints itself: setting a numpy
      # scalar argument untyped costs about 7 us on every launch, which is most of a jitted decode step's host time
      prog.kernel.set_scalar_arg_dtypes([None] * len(mems) + [np.int64] * len(var_vals) + [None] * len(prog.scratch))
      prog.typed = True
    if mems or var_vals or prog.scratch: prog.kernel.set_args(*[m.mem for m in mems], *var_vals, *prog.scratch)
    ev = dev.cl.enqueue_nd_range_kernel(dev.queue, prog.kernel, prog.global_dims, prog.local_dims)
    if dev.profile: EVENTS.append(ev)
    for slot in outputs: bufs[slot].device_wrote(mems[slot])   # (a buffer named twice is one device buffer)


class Launcher:
  """One kernel's launches on CL:n with what stays the same between them looked up once: the program, the slots it
  writes, its variables' ranges. TinyJit's replays run their kernels through these (runtime/devices.py
  `launcher`): the same checks and effects as run_kernel, at a fraction of its host time per launch."""
  __slots__ = ("dev", "prog", "outputs", "bounds")

  def __init__(self, kernel: Kernel, n: int = 0):
    self.dev = get_device(n)
    self.prog = compile_kernel(kernel, self.dev, kernel.check_var_vals() if kernel.vals else None)
    self.outputs = kernel.outputs
    self.bounds = tuple((v.arg[0], v.arg[1], v.arg[2]) for v in kernel.vars)

  def __call__(self, bufs: list[Buffer], var_vals: tuple[int, ...]) -> None:
    """Launch on `bufs` (the Buffers, in the kernel's slot order) with these values of its variables (ints)."""
    if len(var_vals) != len(self.bounds): raise ValueError(f"the kernel takes {len(self.bounds)} variable values, got {len(var_vals)}")
    for (name, lo, hi), x in zip(self.bounds, var_vals):
      if not lo <= x <= hi: raise ValueError(f"variable {name!r} is {x}, outside its range [{lo}, {hi}]")
    _launch(self.dev, self.prog, bufs, var_vals, self.outputs)


__all__ = ["DEVICE", "COUNTERS", "TIMES", "CLDevice", "CLUnavailable", "CLBuildError", "Program", "get_device", "available",
           "all_devices", "render", "compile_kernel", "run_kernel", "Launcher", "synchronize", "save_binaries", "device_memory", "CLMirror"]
