"""The CUDA device: kernels rendered as LLVM IR, compiled to PTX (codegen/nvptx.py, llvmlite's NVPTX target) and
run through the CUDA driver API (runtime/cuda_driver.py: ctypes on libcuda.so.1; no CUDA toolkit).

"CUDA" is CUDA device 0, "CUDA:n" device n (the driver's numbering, which CUDA_VISIBLE_DEVICES shapes). Each
device works in its primary context, on the legacy default stream: everything the process does on a device runs
in the order it was asked for, so a synchronous copy back to the host waits for the kernels before it, and no
other waiting is needed for correctness. `synchronize()` waits for every kernel launched so far.

A kernel is rendered once per distinct AST (and buffer aliasing) for the device's architecture (sm_XY, from its
compute capability), and its PTX is loaded as a module once per device and PTX text (a program cache: two ASTs
that render alike share one module). It runs as a 1-D grid of blocks of cuda_driver.BLOCK threads over
PTXProgram.threads indices; its parameters are one device address per buffer, one i64 per variable, then n.

Buffers (runtime/buffer.py's Mirror): a kernel's buffers are given device memory when a kernel first names them; a
buffer nobody has written is zero-filled there (cuMemsetD8) rather than uploaded, others are uploaded from their
host copy when the device copy is missing or stale. A kernel's outputs stay on the device, marked as the only
current copy; the host copy is refreshed when the host reads it. A zero-size buffer gets no memory (its address
is 0, which a kernel over no elements never uses).

COUNTERS: "compiled" (kernels rendered to PTX), "tensor_cores" (those of them that run on the tensor cores:
codegen/nvptx_gemm.py), "loaded" (modules the driver JIT-compiled), "run", "uploads",
"downloads"; TIMES accumulates render, module load and copy seconds. RULEC_CUDA_PROFILE=1 records a pair of events
around each launch in EVENTS (see `event_times`).
"""
from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
import weakref

from rulec.engine.ir.kernel import Kernel
from rulec.runtime.buffer import Buffer, Mirror, buffer_of, np_dtype
from rulec.runtime.cuda_driver import (CUDAError, CUDAUnavailable, Driver, driver, launch_dims, pack_args)

DEVICE = "CUDA"
COUNTERS = {"compiled": 0, "tensor_cores": 0, "loaded": 0, "run": 0, "uploads": 0, "downloads": 0}
TIMES = {"render_s": 0.0, "load_s": 0.0, "upload_s": 0.0, "download_s": 0.0}
EVENTS: list = []   # with RULEC_CUDA_PROFILE=1: (device, start event, end event) per launch (the caller clears it)

_lock = threading.RLock()
_devices: dict[int, "CUDADevice"] = {}
_current = threading.local()   # .ctx: the context this thread last made current (cuCtxSetCurrent is per thread)


class CUDADevice:
  """One CUDA device: its primary context, architecture and name."""
  def __init__(self, index: int):
    self.drv: Driver = driver()
    count = self.drv.device_count()
    if not 0 <= index < count:
      raise CUDAUnavailable(f"CUDA:{index} names CUDA device {index}, but the driver shows {count} "
                            f"(0 to {count - 1}; CUDA_VISIBLE_DEVICES chooses which)")
    self.index = index
    self.handle = self.drv.device(index)
    self.name = self.drv.device_name(self.handle)
    self.cc = self.drv.compute_capability(self.handle)
    self.arch = f"sm_{self.cc[0]}{self.cc[1]}"
    self.ctx = self.drv.primary_context(self.handle)
    self.activate()
    self.profile = os.environ.get("RULEC_CUDA_PROFILE", "") not in ("", "0")

  def activate(self) -> None:
    """Make this device's context the calling thread's current one (every driver call works on the current
    context; a thread starts with none, and another device may have been current)."""
    if getattr(_current, "ctx", None) is not self.ctx:
      self.drv.set_current(self.ctx)
      _current.ctx = self.ctx

  def __repr__(self): return f"<CUDADevice {self.index}: {self.name} ({self.arch})>"


def get_device(n: int = 0) -> CUDADevice:
  """The device "CUDA:n" names, opened the first time (CUDAUnavailable where there is none)."""
  dev = _devices.get(n)
  if dev is not None: return dev
  with _lock:
    if n not in _devices: _devices[n] = CUDADevice(n)
    return _devices[n]


def check_available() -> None:
  """CUDAUnavailable (one line) unless the driver library loads, initialises and shows a device. Opens no context."""
  driver()


def available() -> bool:
  """Whether a CUDA device can be opened here."""
  try: get_device()
  except CUDAUnavailable: return False
  return True


class Program:
  """A PTX module loaded on one device and its kernel entry."""
  def __init__(self, dev: CUDADevice, ptx):
    self.ptx, self.name = ptx.ptx, ptx.name
    t0 = time.perf_counter()
    dev.activate()
    try: self.module = dev.drv.load_module(ptx.ptx)
    except CUDAError as e:
      raise CUDAError(f"{dev!r} could not load the PTX of kernel {ptx.name!r}: {e}\n--- PTX ---\n{_numbered(ptx.ptx)}",
                      e.call, e.code) from None
    self.function = dev.drv.function(self.module, ptx.name)
    COUNTERS["loaded"] += 1
    TIMES["load_s"] += time.perf_counter() - t0


def _numbered(src: str) -> str:
  return "\n".join(f"{i + 1:4d}  {line}" for i, line in enumerate(src.splitlines()))


class Compiled:
  """A kernel ready to launch on one device: its PTXProgram (threads, parameter counts) and loaded Program; grid and
  block as (x, y, z), and the bytes of dynamic shared memory (a tensor-core matmul's, nvptx_gemm.Launch)."""
  __slots__ = ("ptx", "program", "grid", "block", "shared")

  def __init__(self, ptx, program: Program, dev: CUDADevice | None = None):
    self.ptx, self.program = ptx, program
    launch = getattr(ptx, "launch", None)
    if launch is not None:
      self.grid, self.block, self.shared = tuple(launch.grid), (launch.block, 1, 1), launch.smem
      if self.shared > 48 * 1024 and dev is not None:   # (more than the default 48 KB must be asked for per function)
        dev.drv.set_max_dynamic_shared(program.function, self.shared)
    else:
      blocks, per = launch_dims(ptx.threads) if ptx.threads > 0 else (0, 0)
      self.grid, self.block, self.shared = (blocks, 1, 1), (per, 1, 1), 0


_programs: dict[tuple[int, str], Program] = {}   # (device index, PTX text) -> loaded module
_by_ast: dict[tuple, Compiled] = {}             # (AST, buffer aliasing, device index) -> the kernel ready to launch


def compile_kernel(kernel: Kernel, dev: CUDADevice | None = None) -> Compiled:
  """The kernel rendered to PTX for dev's architecture and loaded there, once per AST (ASTs are hash-consed: equal
  kernels share one entry) and buffer aliasing; the module itself once per PTX text."""
  dev = dev if dev is not None else get_device()
  ids = [id(b) for b in kernel.bufs]
  # (a kernel naming one buffer twice is keyed apart, in case the renderer assumes distinct buffers do not overlap)
  key = (kernel.ast, tuple(ids.index(i) for i in ids) if len(set(ids)) < len(ids) else None, dev.index)
  hit = _by_ast.get(key)
  if hit is not None: return hit
  from rulec.codegen import nvptx   # (imported when first needed: llvmlite's NVPTX target is set up there)
  t0 = time.perf_counter()
  ptx = nvptx.compile_kernel(kernel, dev.arch)
  TIMES["render_s"] += time.perf_counter() - t0
  COUNTERS["compiled"] += 1
  if ptx.launch is not None: COUNTERS["tensor_cores"] += 1
  # the launch packs exactly these many arguments: a disagreement would have the kernel read garbage addresses
  if ptx.nbufs != len(kernel.bufs) or ptx.nvars != len(kernel.vars):
    raise RuntimeError(f"nvptx rendered kernel {ptx.name!r} with {ptx.nbufs} buffers and {ptx.nvars} variables; the "
                       f"kernel has {len(kernel.bufs)} and {len(kernel.vars)}")
  with _lock:
    prog = _programs.get((dev.index, ptx.ptx))
    if prog is None: prog = _programs[(dev.index, ptx.ptx)] = Program(dev, ptx)
    out = _by_ast[key] = Compiled(ptx, prog, dev)
  return out


# *** buffers ***

def _free(dev: CUDADevice, ptr: int) -> None:
  # (a finalizer: it must not raise, and may run in any thread)
  try:
    with _lock:
      prev = getattr(_current, "ctx", None)
      dev.activate()
      dev.drv.free(ptr)
      # (garbage collection may run this between another device's activate() and its next call: put that back)
      if prev is not None and prev is not dev.ctx:
        dev.drv.set_current(prev)
        _current.ctx = prev
  except Exception: pass


class CUDAMirror(Mirror):
  """A buffer's copy in one CUDA device's memory (`ptr`, 0 for a zero-size buffer), freed when the mirror dies."""
  def __init__(self, dev: CUDADevice, nbytes: int):
    self.owner, self.nbytes, self.ptr = dev, nbytes, 0
    if nbytes:
      dev.activate()
      self.ptr = dev.drv.alloc(nbytes)
      # (cuMemFree waits for the kernels using the memory; at interpreter exit the process's teardown frees it)
      weakref.finalize(self, _free, dev, self.ptr).atexit = False

  def read_into(self, host) -> None:
    if not self.nbytes: return
    t0 = time.perf_counter()
    with _lock:
      self.owner.activate()
      self.owner.drv.dtoh(host.ctypes.data, self.ptr, self.nbytes)   # (waits for the kernels before it)
    COUNTERS["downloads"] += 1
    TIMES["download_s"] += time.perf_counter() - t0


def device_memory(buf: Buffer, dev: CUDADevice) -> CUDAMirror:
  """`buf`'s copy on `dev`: made if missing, zero-filled if nobody wrote the buffer, else uploaded when stale."""
  m = buf.mirror
  if m is None or m.owner is not dev:
    if m is not None and not buf.host_valid: buf.host_view()   # another device holds the data: bring it home first
    m = buf.mirror = CUDAMirror(dev, buf.size * np_dtype(buf.dtype).itemsize)
  if not m.valid:
    if m.nbytes:
      dev.activate()
      if buf.untouched: dev.drv.memset8(m.ptr, 0, m.nbytes)
      else:
        host = buf.host_view()
        t0 = time.perf_counter()
        dev.drv.htod(m.ptr, host.ctypes.data, m.nbytes)
        COUNTERS["uploads"] += 1
        TIMES["upload_s"] += time.perf_counter() - t0
    m.valid = True
  return m


# *** running ***

def _debug_level() -> int:
  try: return int(os.environ.get("RULEC_DEBUG", "0") or 0)
  except ValueError: return 0


def run_kernel(kernel: Kernel, n: int = 0, var_vals: tuple[int, ...] = ()) -> None:
  """Run the kernel on device CUDA:n, its variables (Kernel.vars, in that order) set to var_vals."""
  var_vals = kernel.check_var_vals(var_vals)
  dev = get_device(n)
  comp = compile_kernel(kernel, dev)
  if _debug_level() >= 3:
    print(f"CUDA {kernel!r} threads={comp.ptx.threads} grid={comp.grid} block={comp.block} shared={comp.shared}"
          f"{' (tensor cores)' if comp.ptx.launch is not None else ''}\n{comp.ptx.ptx}", file=sys.stderr)
  _launch(dev, comp, [buffer_of(b) for b in kernel.bufs], var_vals, kernel.outputs)


def _launch(dev: CUDADevice, comp: Compiled, bufs: list[Buffer], var_vals: tuple[int, ...], outputs: tuple[int, ...]) -> None:
  COUNTERS["run"] += 1
  threads = comp.ptx.threads
  if threads <= 0: return   # nothing to compute (nvptx promises at least one thread; kept for safety)
  with _lock:
    dev.activate()
    # (a buffer named twice is one mirror, so both parameters get the same address)
    mems = [device_memory(b, dev) for b in bufs]
    values, params = pack_args([m.ptr for m in mems], (*var_vals, threads))
    if dev.profile:
      start, end = dev.drv.event(), dev.drv.event()
      dev.drv.record(start)
    dev.drv.launch(comp.program.function, comp.grid, comp.block, params, comp.shared)
    if dev.profile:
      dev.drv.record(end)
      EVENTS.append((dev, start, end))
    del values   # (kept alive until here: the driver read the argument values during the launch call)
    for slot in outputs: bufs[slot].device_wrote(mems[slot])


def event_times(events=None) -> list[float]:
  """Milliseconds of each profiled launch (EVENTS by default), waiting for them; the events are destroyed, and
  the list emptied."""
  events = EVENTS if events is None else events
  out = []
  with _lock:
    for dev, start, end in events:
      dev.activate()
      out.append(dev.drv.elapsed_ms(start, end))
      dev.drv.destroy_event(start)
      dev.drv.destroy_event(end)
    events.clear()
  return out


def synchronize() -> None:
  """Wait until every kernel launched so far on every opened CUDA device has finished."""
  with _lock:
    for dev in list(_devices.values()):
      dev.activate()
      dev.drv.synchronize()


__all__ = ["DEVICE", "COUNTERS", "TIMES", "EVENTS", "CUDADevice", "CUDAUnavailable", "CUDAError", "CUDAMirror", "Program",
           "Compiled", "get_device", "available", "check_available", "compile_kernel", "run_kernel", "device_memory",
           "synchronize", "event_times"]
