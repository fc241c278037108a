"""What one replayed kernel launch costs on the host, layer by layer (a diagnostic for the JIT's replay path).

    python bench/cl_launch_cost.py [--layers 2] [--device CL]

Records the kernels of one jitted GPT-2 decode step (examples/gpt2.py, random weights), then launches the same
kernels again and again through each layer of the launch path, waiting for the device only between repeats:
  realize._run            everything a replay does per kernel (hooks, the device switch, the CL runtime);
  cl_device.run_kernel    the CL runtime alone (value checks, program lookup, device buffers, args, enqueue);
  set_args + enqueue      pyopencl alone, with the device buffers looked up beforehand;
  set_args                pyopencl's argument setting alone;
  enqueue                 pyopencl's enqueue alone, the arguments already set (the floor).
Prints microseconds per launch (median of the repeats).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--layers", type=int, default=2)
  ap.add_argument("--device", default="CL")
  ap.add_argument("--repeats", type=int, default=20)
  args = ap.parse_args()
  import textgen
  textgen.use_device(args.device)
  import gpt2 as G
  import numpy as np
  from rulec.engine import realize as R
  from rulec.runtime import cl_device
  from rulec.runtime.buffer import buffer_of
  m = G.GPT2(args.layers, 12, 768, max_context=128)
  G.load(m, G.random_weights(m, 0))
  m.generate([1, 2, 3], 4)
  seen = []
  R.RUN_HOOKS.append(lambda k, dt: seen.append(k))
  m.generate([5], 1)
  R.RUN_HOOKS.pop()
  kernels = [k for k in seen if k.bufs and k.bufs[0].arg[1].startswith("CL")]
  dev = cl_device.get_device()
  progs = [cl_device.compile_kernel(k, dev) for k in kernels]
  mems = [[cl_device.device_memory(buffer_of(b), dev).mem for b in k.bufs] for k in kernels]
  def case(fn) -> float:
    per = []
    for _ in range(args.repeats):
      cl_device.synchronize()
      t0 = time.perf_counter()
      fn()
      per.append((time.perf_counter() - t0) / len(kernels))
    cl_device.synchronize()
    return statistics.median(per) * 1e6
  def via_realize():
    for k in kernels: R._run(k)
  def via_runtime():
    for k in kernels: cl_device.run_kernel(k)
  def via_pyopencl():
    for k, p, ms in zip(kernels, progs, mems):
      p.kernel.set_args(*ms, *k.vals, *p.scratch)
      dev.cl.enqueue_nd_range_kernel(dev.queue, p.kernel, (p.global_,), (p.local,))
  def set_args_only():
    for k, p, ms in zip(kernels, progs, mems): p.kernel.set_args(*ms, *k.vals, *p.scratch)
  def enqueue_only():
    for p in progs: dev.cl.enqueue_nd_range_kernel(dev.queue, p.kernel, (p.global_,), (p.local,))
  print(f"{len(kernels)} kernels per step, {dev!r}")
  for name, fn in (("realize._run", via_realize), ("cl_device.run_kernel", via_runtime),
                   ("set_args + enqueue", via_pyopencl), ("set_args", set_args_only), ("enqueue", enqueue_only)):
    print(f"  {name:24} {case(fn):7.1f} us per launch")


if __name__ == "__main__":
  main()
