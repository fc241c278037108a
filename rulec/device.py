"""tinygrad's `Device`: `Device.DEFAULT` (the default device's name), `Device[name]` (a handle with `.device`,
`.renderer.supported_dtypes()` and `synchronize()`), `Device.canonicalize(name)`, `Device.get_available_devices()`.

The devices are rulec's (runtime/devices.py): CPU, NUMPY, CL and CUDA, each with an index (`CL:1`). As in tinygrad 0.14,
Device.DEFAULT is not assigned: `with Context(DEV="CL"):` (rulec.helpers) or RULEC_DEVICE sets it."""
from __future__ import annotations

from typing import Iterator

from rulec.engine.ir.dtypes import DType, dtypes
from rulec.engine.tensor.args import TENSOR_DTYPES, canon_device
from rulec.runtime.devices import DEVICES, default_device, parse_device

__all__ = ["Device", "DeviceHandle", "Renderer"]


class Renderer:
  """What a device's code generator can compute: `supported_dtypes()`."""
  def __init__(self, device: str): self.device = device

  def supported_dtypes(self) -> set[DType]:
    """The dtypes a Tensor on this device computes in: every Tensor dtype (bool, the ints, float16, bfloat16,
    float32, float64), less float64 on an OpenCL device without cl_khr_fp64. CUDA computes in all of them (PTX has
    float64 on every architecture, and float16 / bfloat16 are stored as 16 bits and computed in float32 where the
    GPU lacks the instructions)."""
    out = set(TENSOR_DTYPES.values())
    kind, index = parse_device(self.device)
    if kind == "CL":
      from rulec.runtime import cl_device
      if not cl_device.get_device(index).target.fp64: out.discard(dtypes.float64)
    return out

  def __repr__(self) -> str: return f"<Renderer {self.device}>"


class DeviceHandle:
  """Device[name]: the device `device` (its canonical name), its `renderer`, and `synchronize()`."""
  def __init__(self, device: str):
    self.device = device
    kind, index = parse_device(device)
    if kind == "CL":   # opened now, as tinygrad opens a device on Device[...]: a missing OpenCL fails here, clearly
      from rulec.runtime import cl_device
      try: cl_device.get_device(index)
      except cl_device.CLUnavailable as e: raise RuntimeError(f"Device[{device!r}]: no OpenCL device: {e}") from None
    elif kind == "CUDA":   # opened now too (its primary context); CUDAUnavailable is a RuntimeError, and one line
      from rulec.runtime import cuda_device
      cuda_device.get_device(index)
    self.renderer = Renderer(device)

  def synchronize(self) -> None:
    """Wait for the kernels enqueued so far (CL, CUDA; CPU and NUMPY kernels are done when their call returns)."""
    kind = parse_device(self.device)[0]
    if kind == "CL":
      from rulec.runtime import cl_device
      cl_device.synchronize()
    elif kind == "CUDA":
      from rulec.runtime import cuda_device
      cuda_device.synchronize()

  def __repr__(self) -> str: return f"<Device {self.device}>"


class _Device:
  """The devices, by name: `Device["CPU"]`, `Device.DEFAULT`."""
  def __init__(self) -> None: self._opened: dict[str, DeviceHandle] = {}

  def canonicalize(self, device: str | None) -> str:
    """The one spelling of a device name ('cpu:0' -> 'CPU'); None is the default device."""
    d = canon_device(device)
    if not isinstance(d, str): raise TypeError(f"canonicalize takes one device name, got {device!r}")
    return d

  def __getitem__(self, name: str) -> DeviceHandle:
    d = self.canonicalize(name)
    if d not in self._opened: self._opened[d] = DeviceHandle(d)
    return self._opened[d]

  @property
  def DEFAULT(self) -> str:
    """The default device: RULEC_DEVICE, else CPU."""
    return default_device()

  @DEFAULT.setter
  def DEFAULT(self, v: str) -> None:
    raise AttributeError(f'setting Device.DEFAULT is not supported (nor in tinygrad 0.14): use "with Context(DEV={v!r}):" '
                         f"(from rulec.helpers) or the environment variable RULEC_DEVICE={v}")

  @property
  def default(self) -> DeviceHandle: return self[self.DEFAULT]

  def get_available_devices(self) -> Iterator[str]:
    """The device kinds that open here, in rulec's order (CPU, NUMPY, CL when OpenCL has a device, CUDA when the
    driver shows a device)."""
    for kind in DEVICES:
      try: self[kind]
      except RuntimeError: continue
      yield kind

  def __repr__(self) -> str: return f"<Device DEFAULT={self.DEFAULT}>"


Device = _Device()
