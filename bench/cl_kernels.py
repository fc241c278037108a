"""Kernel run time on an OpenCL device: rulec's CL device against torch on CUDA, same workloads, same run.

Run:  python bench/kernels.py --device CL [--only NAME ...] [--scale N]
(bench/h200.sh sets up an H200 machine and runs this there.) Without a CUDA GPU
torch's columns are empty; `--scale 64` shrinks every workload for a quick check
on PoCL.

What is timed (medians over the repetitions, milliseconds):

- rulec: fresh input Tensors on "CL" each repetition; the kernels come from
  `rulec.engine.sched.driver.schedule` outside the timer, and every buffer they use is
  made resident on the device outside the timer (inputs uploaded, outputs
  allocated), as tinygrad's and torch's inputs already live on the GPU. Then
    wall   = `for k in kernels: cl_device.run_kernel(k)` + `synchronize()`:
             Python launch work included (program-cache lookups, argument setting)
    wall, same bufs = the same kernels launched again at once on the same buffers
    kernel = the sum of the launches' OpenCL profiling-event times (device time)
    kernel, resident = the same for that second launch. The first launch reads inputs the host has just
             written, whose dirty cache lines the GPU writes back while the kernel runs (an H200 ran the
             relu(a*b+c) kernel in 0.083 ms so, 0.067 ms again on the same buffers: bench/cl_bandwidth_probe.py);
             the copy bandwidth below is measured on resident buffers, so the bandwidth fractions use this
             time. torch's op is timed twice the same way.
  No compilation happens while timing (checked).
- torch: CUDA tensors made from the same inputs before the timer, TF32 off (plain
  float32, as rulec computes). wall = the op up to `torch.cuda.synchronize()`;
  kernel = CUDA events recorded around the op (its kernels and the gaps between them).

Bandwidth: the device's copy bandwidth is measured in the same run with an
OpenCL float4 copy kernel over 256 MiB (profiling events; bytes read + written),
and torch's `copy_` of 256 MiB (CUDA events). Memory-bound workloads report
(bytes read + written) / rulec's resident kernel time and its fraction of the
OpenCL copy bandwidth; matmul and conv2d report GFLOP/s. A second fraction sets
the time against a float4 copy that moves the workload's own bytes (launch
included, as in rulec's time): a 64 MB sum pays about a quarter of its time in
the launch on an H200 (an empty kernel: 5.4 us), which the 256 MiB copy hides.

Compile time, cold and warm, against tinygrad's CL device: as for the CPU
(bench/kernels.py, bench/compile_times.py), at the same --scale.

The last line is
  cl_elementwise_bw_fraction=<relu(a*b+c) 16M>  cl_reduction_bw_fraction=<sum 16M>  (resident kernel times;
  then the same from the first launch's)
  softmax_vs_torch=<torch kernel / rulec kernel>  layernorm_vs_torch=<...>  matmul_vs_torch=<...>
  compile_cold_vs_tinygrad=<tinygrad's total cold compile time / rulec's>  compile_warm_ms=<rulec's warm total>
"""
from __future__ import annotations

import dataclasses
import os
import platform
import statistics
import sys
import time
from importlib import metadata

os.environ.setdefault("RULEC_CL_PROFILE", "1")   # device-side kernel times, before the CL device opens

import numpy as np  # noqa: E402

from rulec.engine.sched.driver import schedule as rulec_schedule  # noqa: E402
from rulec.engine.tensor import Tensor as RT  # noqa: E402
from rulec.runtime import cl_device  # noqa: E402
from rulec.runtime.buffer import buffer_of  # noqa: E402
import compile_times  # noqa: E402
from workloads import WORKLOADS, Inputs, Workload, check, fmt, print_table, scaled  # noqa: E402

try:
  import torch
  TORCH = torch if torch.cuda.is_available() else None
except ImportError:
  TORCH = None


# *** rulec ***

def programs_made() -> int:
  """Programs built or loaded from the disk cache so far: neither may happen while timing."""
  return cl_device.COUNTERS["compiled"] + cl_device.COUNTERS["loaded"]


def resident(kernels) -> None:
  """Every buffer the kernels use on the device (inputs uploaded, outputs allocated), then wait."""
  dev = cl_device.get_device()
  for k in kernels:
    for b in k.bufs: cl_device.device_memory(buffer_of(b), dev)
  cl_device.synchronize()


def event_ms(events) -> float:
  return sum(e.profile.end - e.profile.start for e in events) / 1e6


DTYPE = "float32"   # --dtype: the inputs' and results' dtype on both sides (float16 / bfloat16: half rows)


def half_workload(w: Workload, dtype: str) -> Workload:
  """w with 2-byte float inputs: half the bytes moved, tolerances of the 2-byte type's rounding (every op rounds
  its result; sums accumulate in float32 on both sides)."""
  if dtype == "float32": return w
  eps = 2.0 ** -8 if dtype == "bfloat16" else 2.0 ** -11
  return dataclasses.replace(w, name=f"{w.name} {dtype}", nbytes=w.nbytes // 2, rtol=8 * eps, atol=8 * eps,
                             sum_tol=max(w.sum_tol, 4 * eps), results={})


def _half_inputs(inp: Inputs, dtype: str) -> None:
  """Round the input sets to dtype (as float32 arrays), and recompute the reference on them."""
  if dtype == "float32": return
  np_d = np.dtype(dtype)
  inp.sets = [[a.astype(np_d).astype(np.float32) for a in s] for s in inp.sets]
  inp.refs = [inp.w.numpy(*s) for s in inp.sets]


def _as_dtype(a: np.ndarray) -> np.ndarray: return a if DTYPE == "float32" else a.astype(np.dtype(DTYPE))


def time_rulec(w: Workload, inp: Inputs, failures: list[str], reps: int) -> tuple[list[float], list[float]]:
  walls, kerns, again, again_kernel = [], [], [], []
  for i in range(-1, reps):   # one warm-up: compiles every kernel
    ts = [RT(_as_dtype(a), device="CL") for a in inp.fresh(i)]
    out = w.rulec(*ts)
    kernels, views = rulec_schedule([out.uop], "CL")
    resident(kernels)
    compiled = programs_made()
    cl_device.EVENTS.clear()
    t0 = time.perf_counter()
    for k in kernels: cl_device.run_kernel(k)
    cl_device.synchronize()
    dt = time.perf_counter() - t0
    if i >= 0:
      walls.append(dt * 1e3)
      kerns.append(event_ms(cl_device.EVENTS))
      cl_device.EVENTS.clear()
      t0 = time.perf_counter()   # the same kernels again on the same buffers: launch cost without fresh memory
      for k in kernels: cl_device.run_kernel(k)
      cl_device.synchronize()
      again.append((time.perf_counter() - t0) * 1e3)
      again_kernel.append(event_ms(cl_device.EVENTS))
      if programs_made() != compiled:
        failures.append(f"{w.name}: rulec compiled or loaded {programs_made() - compiled} kernel(s) while timing")
    out.uop = views[0]
    check(w, inp, i, out.numpy().astype(np.float32), "rulec" if i >= 0 else "rulec (warm-up)", failures)
  w.results["kernels"] = len(kernels)
  w.results["again"] = statistics.median(again)
  w.results["resident"] = statistics.median(again_kernel)
  return walls, kerns


# *** torch ***

def time_torch(w: Workload, inp: Inputs, failures: list[str], reps: int) -> tuple[list[float], list[float]]:
  torch = TORCH
  walls, kerns, resident = [], [], []
  for i in range(-2, reps):
    ts = [torch.from_numpy(a).cuda().to(getattr(torch, DTYPE)) for a in inp.fresh(i)]
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    start.record()
    out = w.torch(*ts)
    end.record()
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    start2, end2 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start2.record()   # again on the same inputs (as rulec's resident time)
    w.torch(*ts)
    end2.record()
    torch.cuda.synchronize()
    if i >= 0:
      walls.append(dt * 1e3)
      kerns.append(start.elapsed_time(end))
      resident.append(start2.elapsed_time(end2))
    check(w, inp, i, out.float().cpu().numpy(), "torch" if i >= 0 else "torch (warm-up)", failures)
  w.results["torch_resident"] = statistics.median(resident)
  return walls, kerns


# *** bandwidth ***

def cl_copy_bandwidth(nbytes: int = 256 << 20, reps: int = 10, width: int = 4) -> float:
  """GB/s of a float`width` copy kernel on the CL device (read + write), by profiling events."""
  dev = cl_device.get_device()
  cl = dev.cl
  t = "float" if width == 1 else f"float{width}"
  prg = cl.Program(dev.ctx, f"__kernel void copy4(__global const {t}* a, __global {t}* b) "
                            "{ size_t i = get_global_id(0); b[i] = a[i]; }").build()
  src = cl.Buffer(dev.ctx, cl.mem_flags.READ_WRITE, nbytes)
  dst = cl.Buffer(dev.ctx, cl.mem_flags.READ_WRITE, nbytes)
  cl.enqueue_fill_buffer(dev.queue, src, np.float32(1.5), 0, nbytes)
  knl = cl.Kernel(prg, "copy4")
  knl.set_args(src, dst)
  n = nbytes // (4 * width)
  local = min(256, dev.max_work_group)
  times = []
  for i in range(reps + 1):
    ev = cl.enqueue_nd_range_kernel(dev.queue, knl, (n,), (local,) if n % local == 0 else None)
    ev.wait()
    if i: times.append((ev.profile.end - ev.profile.start) / 1e9)
  return 2 * nbytes / statistics.median(times) / 1e9


def torch_copy_bandwidth(nbytes: int = 256 << 20, reps: int = 10) -> float:
  torch = TORCH
  a = torch.full((nbytes // 4,), 1.5, device="cuda")
  b = torch.empty_like(a)
  times = []
  for i in range(reps + 1):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    b.copy_(a)
    e.record()
    torch.cuda.synchronize()
    if i: times.append(s.elapsed_time(e) / 1e3)
  return 2 * nbytes / statistics.median(times) / 1e9


def machine_info() -> list[str]:
  dev = cl_device.get_device()
  def ver(p):
    try: return metadata.version(p)
    except metadata.PackageNotFoundError: return "not installed"
  gpu = TORCH.cuda.get_device_name(0) if TORCH is not None else "no CUDA device (torch columns empty)"
  return [f"machine: {platform.machine()}, {os.cpu_count()} cores; OpenCL device: {dev!r}, {dev.units} compute units, "
          f"group reductions up to {dev.target.group} work-items",
          f"python {platform.python_version()}; numpy {np.__version__}; pyopencl {ver('pyopencl')}; rulec {ver('rulec')}; "
          f"torch {ver('torch')} on {gpu}"]


def main(args) -> None:
  global DTYPE
  DTYPE = getattr(args, "dtype", "float32")
  t_start = time.perf_counter()
  if TORCH is not None:
    TORCH.backends.cuda.matmul.allow_tf32 = False
    TORCH.backends.cudnn.allow_tf32 = False
  for line in machine_info(): print(line)
  size = 256 << 20 if args.scale == 1 else 16 << 20
  bw, bw1 = cl_copy_bandwidth(size), cl_copy_bandwidth(size, width=1)
  tbw = torch_copy_bandwidth() if TORCH is not None else None
  print(f"copy bandwidth: OpenCL float4 copy {bw:.0f} GB/s (scalar float copy {bw1:.0f}); torch copy_ {fmt(tbw, 0)} GB/s "
        f"({size >> 20} MiB, read + write)")
  sys.stdout.flush()
  workloads = [half_workload(scaled(w, args.scale), DTYPE) for w in WORKLOADS
               if not args.only or any(s.lower() in w.name.lower() for s in args.only)]
  failures: list[str] = []
  rows = []
  for seed, w in enumerate(workloads):
    t0 = time.perf_counter()
    inp = Inputs(w, seed)
    _half_inputs(inp, DTYPE)
    reps = 20 if not w.flops else 7
    rw, rk = time_rulec(w, inp, failures, reps)
    tw, tk = time_torch(w, inp, failures, reps) if TORCH is not None else ([float("nan")], [float("nan")])
    r = (statistics.median(rw), statistics.median(rk), statistics.median(tw), statistics.median(tk))
    rows.append((w, *r))
    print(f"  done {w.name}: rulec {r[1]:.3f} ms kernel / {r[0]:.3f} ms wall ({w.results['kernels']} kernels), "
          f"torch {r[3]:.3f} / {r[2]:.3f} ms  [{time.perf_counter() - t0:.0f} s]")
    sys.stdout.flush()
  head = ["workload", "rulec kernel ms", "kernel, resident", "rulec wall ms", "wall, same bufs", "torch kernel ms",
          "torch resident", "torch wall ms", "rulec GB/s|GFLOP/s (resident)", "frac CL copy BW (resident)",
          "frac copy of same bytes", "vs torch (kernel)", "vs torch (resident)", "vs torch (wall)", "kernels"]
  body = []
  same = {w.name: cl_copy_bandwidth(w.nbytes // 2 // 64 * 64, reps=30) for w, *_ in rows if w.nbytes >= 1 << 20}
  for w, rwall, rk, twall, tk in rows:
    rr, tr = w.results["resident"], w.results.get("torch_resident", float("nan"))
    rate = (w.nbytes or w.flops) / (rr / 1e3) / 1e9
    body.append([w.name, fmt(rk, 3), fmt(rr, 3), fmt(rwall, 3), fmt(w.results["again"], 3), fmt(tk, 3), fmt(tr, 3), fmt(twall, 3),
                 f"{fmt(rate, 1)} {'GB/s' if w.nbytes else 'GFLOP/s'}", fmt(rate / bw) if w.nbytes else "-",
                 fmt(rate / same[w.name]) if w.name in same else "-",
                 fmt(tk / rk), fmt(tr / rr), fmt(twall / rwall), str(w.results["kernels"])])
  print()
  print_table(head, body)
  print()
  print(f"total bench time {time.perf_counter() - t_start:.0f} s")
  if failures:
    print("RESULT CHECK FAILURES:")
    for f in failures: print("  " + f)
  compile_line = compile_times.summary(args)
  by = {w.name.split(" /")[0].removesuffix(f" {DTYPE}"): (w, rk, tk) for w, _, rk, _, tk in rows}
  def frac(name, fresh=False, same_bytes=False):
    if name not in by or same_bytes and by[name][0].name not in same: return "nan"
    w, rk, _ = by[name]
    return f"{w.nbytes / ((rk if fresh else w.results['resident']) / 1e3) / 1e9 / (same[w.name] if same_bytes else bw):.3f}"
  def vs(name):
    return f"{by[name][2] / by[name][1]:.3f}" if name in by else "nan"
  print(f"cl_elementwise_bw_fraction={frac('relu(a*b+c) 16M')} cl_reduction_bw_fraction={frac('sum 16M')} "
        f"(against a copy of the same bytes: {frac('relu(a*b+c) 16M', same_bytes=True)} / {frac('sum 16M', same_bytes=True)}) "
        f"(resident; with inputs just uploaded: {frac('relu(a*b+c) 16M', True)} / {frac('sum 16M', True)}) "
        f"softmax_vs_torch={vs('softmax 4096x1024')} layernorm_vs_torch={vs('layernorm 4096x1024')} "
        f"matmul_vs_torch={vs('matmul 1024^3')} {compile_line}")
  sys.stdout.flush()
  if failures: sys.exit(1)
