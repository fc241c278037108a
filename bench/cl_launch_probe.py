"""Where a CL launch's wall time goes on a fresh output buffer (a diagnostic for bench/cl_kernels.py's wall column).

Run: python bench/cl_launch_probe.py   (on the machine with the OpenCL device; prints one line per case)
Times `run_kernel + synchronize` of relu(a*b+c) on 16M floats, the output buffer prepared in different ways.
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import numpy as np  # noqa: E402

from rulec.engine.sched.driver import schedule  # noqa: E402
from rulec.engine.tensor import Tensor  # noqa: E402
from rulec.runtime import cl_device  # noqa: E402
from rulec.runtime.buffer import buffer_of  # noqa: E402

N = 1 << 24
dev = cl_device.get_device()
cl = dev.cl


def case(name: str, prepare, reps: int = 9):
  times = []
  for _ in range(reps):
    ts = [Tensor(np.ones(N, np.float32), device="CL") for _ in range(3)]
    out = (ts[0] * ts[1] + ts[2]).relu()
    (k,), _ = schedule([out.uop], "CL")
    for b in k.bufs[1:]: cl_device.device_memory(buffer_of(b), dev)
    prepare(buffer_of(k.bufs[0]))
    cl_device.synchronize()
    t0 = time.perf_counter()
    cl_device.run_kernel(k)
    cl_device.synchronize()
    times.append((time.perf_counter() - t0) * 1e3)
    t0 = time.perf_counter()
    cl_device.run_kernel(k)
    cl_device.synchronize()
    times.append(-(time.perf_counter() - t0) * 1e3)
  first = statistics.median([t for t in times if t > 0])
  again = statistics.median([-t for t in times if t < 0])
  print(f"{name:<44} first launch {first:7.3f} ms   again {again:7.3f} ms", flush=True)


def fill(buf):    # what device_memory does for a never-written output
  cl_device.device_memory(buf, dev)


def no_fill(buf):  # a device buffer from the pool, marked valid without writing it
  m = buf.mirror = cl_device.CLMirror(dev, buf.size * 4)
  m.valid = True


def upload(buf):  # host zeros uploaded
  buf.numpy_view()
  cl_device.device_memory(buf, dev)


def kernel_write(buf):  # written by a kernel first (a copy kernel of zeros)
  cl_device.device_memory(buf, dev)
  z = Tensor(np.zeros(N, np.float32), device="CL")
  (k,), _ = schedule([(z + 0).uop], "CL")
  for b in k.bufs[1:]: cl_device.device_memory(buffer_of(b), dev)
  cl.enqueue_copy(dev.queue, buf.mirror.mem, cl_device.device_memory(buffer_of(k.bufs[1]), dev).mem)


for name, prep in [("output zero-filled (enqueue_fill_buffer)", fill), ("output from the pool, not written", no_fill),
                   ("output uploaded from host zeros", upload), ("output written by a device copy", kernel_write)]:
  case(name, prep)
print("pool:", dev.pool.held >> 20, "MiB held")
