"""The devices rulec can run kernels on, and which one is the default.

`RULEC_DEVICE` picks the default (CPU unless set); tests use it to run the
same suite on every device.

A device name is a kind with an optional index: `CPU`, `CPU:1`, `CL:0`, `NUMPY:3`. Each index is a device of
its own, with its own buffers; `X:0` is `X`. CPU and NUMPY devices of any index keep their buffers in host
memory; `CL:n` is the n-th OpenCL device after the one `CL` names (runtime/cl_device.py), `CUDA:n` CUDA device n
(runtime/cuda_device.py; a CUDA or CL buffer keeps a device copy beside its host one). A kernel runs on the
device of the buffer it writes. A kernel that only copies a whole buffer from one device to another is a
transfer (`copy_buffers`): the data moves through host memory, and a CL buffer stays on its own device.

A device that cannot be used is a DeviceError with a one-line message (an unknown name, from RULEC_DEVICE or a
`device=` argument); the CL device's own CLUnavailable (pyopencl missing, no OpenCL device) and the CUDA device's
CUDAUnavailable (no libcuda.so.1, no CUDA device) are one line too.
`device_problem(e)` tells both apart from other errors, so the `rulec` command prints them as one line.
"""
from __future__ import annotations

import os
import sys
from typing import Callable


class DeviceError(ValueError):
  """A device name that names no device (RULEC_DEVICE, a `device=` argument). The message is one line."""


def _cpu_run(kernel, index: int, var_vals: tuple[int, ...] = ()) -> None:
  from rulec.runtime import cpu_device
  cpu_device.run_kernel(kernel, var_vals)


def _cl_run(kernel, index: int, var_vals: tuple[int, ...] = ()) -> None:
  from rulec.runtime import cl_device
  cl_device.run_kernel(kernel, index, var_vals)


def _cuda_run(kernel, index: int, var_vals: tuple[int, ...] = ()) -> None:
  from rulec.runtime import cuda_device
  cuda_device.run_kernel(kernel, index, var_vals)


def _numpy_run(kernel, index: int, var_vals: tuple[int, ...] = ()) -> None:
  from rulec.runtime import numpy_device
  numpy_device.run_kernel(kernel, var_vals)


# every device here keeps its buffers in host memory (CL and CUDA a device copy besides, runtime/buffer.py), so a
# kernel may read buffers of any of them
RUNNERS: dict[str, Callable] = {"CPU": _cpu_run, "NUMPY": _numpy_run, "CL": _cl_run, "CUDA": _cuda_run}
DEVICES: tuple[str, ...] = tuple(RUNNERS)
# copies between devices carried out as transfers (copy_buffers): how many, and how many bytes they moved
COPIES = {"copies": 0, "bytes": 0}


_PARSED: dict[str, tuple[str, int]] = {}   # (asked on every kernel launch)


def parse_device(name: str) -> tuple[str, int]:
  """(kind, index) of a device name: 'CPU' -> ('CPU', 0), 'cl:2' -> ('CL', 2); ValueError for anything else."""
  hit = _PARSED.get(name)
  if hit is not None: return hit
  kind, sep, idx = name.upper().partition(":")
  if kind not in RUNNERS or (sep and not (idx.isdigit() and idx.isascii())):
    raise DeviceError(f"unknown device {name!r}; known devices: {', '.join(DEVICES)}, each also with an index (CPU:1)")
  out = _PARSED[name] = (kind, int(idx) if sep else 0)
  return out


def canonical_device(name: str) -> str:
  """The one spelling of a device: upper case, `X:0` as `X`. A CUDA device is named only where CUDA can run
  (the driver library loads and shows a device; CUDAUnavailable otherwise): a tensor placed there fails where it is
  made, not at its first kernel, which may come much later (a tensor of data runs none until it is computed on)."""
  out = _spelling(name)
  if out[:4] == "CUDA" and not _cuda_checked: _check_cuda()
  return out


def _spelling(name: str) -> str:
  kind, index = parse_device(name)
  return f"{kind}:{index}" if index else kind


_cuda_checked = False   # the CUDA driver loaded and showed a device (asked once; a failure is asked again)


def _check_cuda() -> None:
  global _cuda_checked
  from rulec.runtime import cuda_device
  cuda_device.check_available()
  _cuda_checked = True


def device_kind(name) -> str:
  """'CPU:1' -> 'CPU' (a name without an index is its own kind)."""
  return name.partition(":")[0] if isinstance(name, str) else name


def _cl(device):
  """The CL device `device` names ("CL", "CL:1": each has its own limits), opened, else None; None too when there
  is none to open (the error surfaces when a kernel runs, with its own message)."""
  try: kind, index = parse_device(device) if isinstance(device, str) else (None, 0)
  except ValueError: return None
  if kind != "CL": return None
  from rulec.runtime import cl_device
  try: return cl_device.get_device(index)
  except cl_device.CLUnavailable: return None


def split_parts(device) -> int:
  """The most partial results a big reduction is split into on `device` (engine/sched/early.py
  split_reduceop): 256 fills a CPU's cores; a GPU wants thousands of work-groups (asks the CL device, opening it)."""
  return dev.split_parts if (dev := _cl(device)) is not None else 256


def one_pass_groups(device) -> int:
  """Work-groups that reduce one value together in a single launch on `device` (the CL device's GRID, on GPUs);
  0 where a big reduction of one value is better split into two kernels (engine/sched/early.py)."""
  return dev.target.grid if (dev := _cl(device)) is not None and dev.target.group else 0


def rows_shared(device) -> bool:
  """Whether `device` computes a row's value (a softmax's max and sum) once per row inside the kernel that reads
  it: the CL device where work-groups share reductions (GPUs; codegen/opt's SPREAD puts a row in a work-group).
  Elsewhere on CL every work-item would compute its row's value again."""
  return (dev := _cl(device)) is not None and dev.target.group > 0


def tiles_sums(device) -> bool:
  """Whether `device` runs a contraction (a matmul) in register tiles of work-groups whose work-items hold many
  registers (the CL device on a GPU, codegen/opt gpu_tile: 168 registers a work-item, 3 work-groups of 128 a compute
  unit), so that what the kernel computes after the sum runs on few threads: a costly epilogue is faster as an
  elementwise kernel of its own (rules/fusion.rules store_sum_before_costly_epilogue)."""
  return (dev := _cl(device)) is not None and dev.target.tile > 0


def tensor_cores(device) -> bool:
  """Whether `device` runs a sum of float16 or bfloat16 products on tensor cores (codegen/gemm_plan.py): the CL
  device on NVIDIA's OpenCL and the CUDA device, on GPUs of sm_80 or later. Their kernel copies a stored 2-byte
  operand into shared memory 16 bytes at a time, but computes a fused one (a cast, a layernorm's output) an element
  at a time (rules/fusion.rules store_half_factor)."""
  if (dev := _cl(device)) is not None:
    from rulec.runtime import cl_device
    return (dev.nv_arch is not None and dev.index not in cl_device._tc_refused
            and os.environ.get("RULEC_CL_TC", "1").strip() != "0")
  try: kind, index = parse_device(device) if isinstance(device, str) else (None, 0)
  except ValueError: return False
  if kind != "CUDA": return False
  from rulec.runtime import cuda_device
  try: cc = cuda_device.get_device(index).cc
  except cuda_device.CUDAUnavailable: return False
  return cc[0] >= 8 and os.environ.get("RULEC_CUDA_TC", "1").strip() != "0"


def winograd_convs(device) -> bool:
  """Whether a 3x3, stride-1 float32 convolution on `device` is computed as Winograd's F(2x2, 3x3)
  (engine/tensor/winograd.py: four kernels, the costly one a batched matmul): only when RULEC_WINOGRAD=1 (tinygrad's
  WINO=1), on any device. Off by default everywhere: on the H100 the ResNet block (N64 C64 56x56) was not
  meaningfully faster, one run each (forward 1.56 -> 1.64 ms, with its backward 6.09 -> 5.87: the batched matmul
  over 64 channels runs at 18 TFLOP/s),
  and on this CPU it is 3x slower than the direct convolution (docs/architecture.md, "Winograd convolutions").
  `device` is for a future per-device choice."""
  return os.environ.get("RULEC_WINOGRAD", "").strip() == "1"


def default_device() -> str:
  """The default device: RULEC_DEVICE (CPU when unset or empty); DeviceError when it names no device."""
  raw = os.environ.get("RULEC_DEVICE", "").strip() or "CPU"
  # (not checked for CUDA here: importing rulec must not fail on RULEC_DEVICE=CUDA; its kernels say what is missing)
  try: return _spelling(raw)
  except ValueError:
    raise DeviceError(f"RULEC_DEVICE={raw!r} is not a device; known devices: {', '.join(DEVICES)}, "
                      "each also with an index (CPU:1)") from None


def require_device(name: str) -> str:
  """`name` in its one spelling, once it is known that kernels can run there: DeviceError for an unknown name;
  for a CL device, the CL device's CLUnavailable when pyopencl cannot be imported (no device is opened); for a CUDA
  device, CUDAUnavailable when the driver library does not load or shows no device (no context is made)."""
  canon = canonical_device(name)
  if device_kind(canon) == "CL":
    from rulec.runtime import cl_device
    cl_device._cl()
  return canon


def device_problem(e: BaseException) -> str | None:
  """The one-line message of an error that says a device cannot be used (DeviceError, the CL device's
  CLUnavailable, the CUDA device's CUDAUnavailable); None for any other error."""
  if isinstance(e, DeviceError): return str(e)
  cl = sys.modules.get("rulec.runtime.cl_device")
  if cl is not None and isinstance(e, cl.CLUnavailable): return str(e)
  cuda = sys.modules.get("rulec.runtime.cuda_driver")
  if cuda is not None and isinstance(e, cuda.CUDAUnavailable): return str(e)
  return None


def copy_buffers(kernel):
  """(destination, source) BUFFERs when `kernel` copies one whole buffer into another of another device, element
  for element, and nothing else; None otherwise (a kernel with variables is never a copy)."""
  from rulec.engine.ir.ops import Ops
  if len(kernel.bufs) != 2 or len(kernel.ast.src) != 1 or kernel.vars: return None
  dst, src = kernel.bufs
  if dst.arg[1] == src.arg[1] or dst.arg[2] != src.arg[2] or dst.dtype is not src.dtype: return None
  st = kernel.ast.src[0]
  st = st.src[0] if st.op is Ops.END else st
  if st.op is not Ops.STORE: return None
  target, value = st.src
  if target.op is not Ops.INDEX or value.op is not Ops.INDEX or target.src[1:] != value.src[1:]: return None
  if target.src[0].op is not Ops.PARAM or value.src[0].op is not Ops.PARAM or value.src[0].arg[0] != 1: return None
  return dst, src


def separate_memory(a: str, b: str) -> bool:
  """Whether two devices keep their buffers apart: two devices of one kind, or any device with an index. Their
  copies are real (transfers), and no kernel of one reads the other's buffers. The plain kinds (CPU, NUMPY, CL, CUDA)
  read each other's buffers, as before indexed devices: a CPU -> CL copy is a kernel on CL reading host memory."""
  return a != b and (device_kind(a) == device_kind(b) or ":" in a or ":" in b)


def launcher(kernel, device: str):
  """A prepared launch of `kernel` on `device` for running it many times (TinyJit's replays), or None where the
  device has none or the kernel is a transfer between devices (run_kernel then). Called as launch(buffers,
  var_vals): the Buffers of the kernel's slots (the same sizes and dtypes) and its variables' values."""
  kind, index = parse_device(device)
  if kind != "CL": return None
  pair = copy_buffers(kernel)
  if pair is not None and separate_memory(pair[0].arg[1], pair[1].arg[1]): return None
  from rulec.runtime import cl_device
  return cl_device.Launcher(kernel, index)


def prepare(kernels) -> None:
  """Compile ahead the kernels a realize is about to run, where a device can do that faster than one by one: the CPU
  builds their objects in worker processes while it lowers the next (runtime/cpu_device.py prepare). The others
  compile each kernel when it first runs."""
  cpu = [k for k in kernels if k.bufs and parse_device(k.bufs[0].arg[1])[0] == "CPU" and copy_buffers(k) is None]
  if len(cpu) > 1:
    from rulec.runtime import cpu_device
    cpu_device.prepare(cpu)


def run_kernel(kernel, device: str, var_vals: tuple[int, ...] = ()) -> None:
  """Run `kernel` on `device`. var_vals: the values of the kernel's variables (DEFINE_VAR), one int each, in
  `kernel.vars` order (none given: the kernel's own `vals`, which the scheduler fills in; empty for a kernel without
  variables); a ValueError naming the variable for a value outside its range, or for the wrong number of values.
  The kernel is compiled once for every value."""
  try: kind, index = parse_device(device)
  except ValueError: raise DeviceError(f"no runtime for device {device!r}; known devices: {', '.join(DEVICES)}") from None
  # (the values are checked once, by the device's own run_kernel: this is on every launch)
  pair = copy_buffers(kernel)
  if pair is not None and separate_memory(pair[0].arg[1], pair[1].arg[1]):
    from rulec.runtime.buffer import buffer_of
    dst, src = buffer_of(pair[0]), buffer_of(pair[1])
    dst.copy_from(src)
    COPIES["copies"] += 1
    COPIES["bytes"] += src.nbytes
    return
  RUNNERS[kind](kernel, index, var_vals)
