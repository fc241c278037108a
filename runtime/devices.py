"""The devices rulec can run kernels on, and which one is the default.

`RULEC_DEVICE` picks the default (CPU unless set); tests use it to run the
same suite on every device.
"""
from __future__ import annotations

import os
from typing import Callable


def _cpu_run(kernel) -> None:
  from runtime import cpu_device
  cpu_device.run_kernel(kernel)


def _cl_run(kernel) -> None:
  from runtime import cl_device
  cl_device.run_kernel(kernel)


def _numpy_run(kernel) -> None:
  from runtime import numpy_device
  numpy_device.run_kernel(kernel)


# every device here keeps its buffers in host memory, so a kernel may read buffers of any of them
RUNNERS: dict[str, Callable] = {"CPU": _cpu_run, "NUMPY": _numpy_run, "CL": _cl_run}
DEVICES: tuple[str, ...] = tuple(RUNNERS)


def split_parts(device) -> int:
  """The most partial results a big reduction is split into on `device` (engine/sched/tensor_helpers.py
  split_reduceop): 256 fills a CPU's cores; a GPU wants thousands of work-groups (asks the CL device, opening it)."""
  if device == "CL":
    from runtime import cl_device
    try: return cl_device.get_device().split_parts
    except cl_device.CLUnavailable: return 256   # the error surfaces when a kernel runs, with its own message
  return 256


def default_device() -> str:
  d = os.environ.get("RULEC_DEVICE", "CPU").upper()
  if d not in RUNNERS: raise ValueError(f"RULEC_DEVICE={d!r} is not a device; known devices: {', '.join(DEVICES)}")
  return d


def run_kernel(kernel, device: str) -> None:
  try: runner = RUNNERS[device]
  except KeyError: raise ValueError(f"no runtime for device {device!r}; known devices: {', '.join(DEVICES)}") from None
  runner(kernel)
