"""Which one-pass form of a 16M-float sum reaches a GPU's bandwidth: hand-written OpenCL, timed by profiling events
against a float4 copy of the same bytes, beside rulec's own GRID kernel.

Run: python bench/cl_sum_probe.py   (bench/h200.sh sumprobe; one line per form)
A diagnostic for choosing what codegen/opencl.py's GRID reductions should emit, not a benchmark of rulec. Every form
is one launch: each work-group adds its share into one partial, and the last group to finish (an atomic counter)
adds the partials. The forms differ in
  - layout: "chunk" (each work-group reads one contiguous slice, as rulec's GRID kernel does) or "stride" (the whole
    launch walks the array together: on every load, neighbouring work-groups read neighbouring slices);
  - loads in flight: float4 loads per work-item issued before their adds, per loop step (4, 8, 16);
  - work-groups and work-group size.
Each line gives the median kernel time over PROBE_REPS runs and GB/s as bytes read / time, and as a fraction of the
float4 copy's (read + write) GB/s, the reference bench/cl_kernels.py's fractions use.
"""
from __future__ import annotations

import os
import statistics
import sys

import numpy as np
import pyopencl as cl

N = 1 << int(os.environ.get("PROBE_LOG2N", "24"))
REPS = int(os.environ.get("PROBE_REPS", "30"))

# a one-pass sum's tail, after a work-item's float4 `acc`: the group's partial (PARTIAL), then the last group to
# finish adds the partials (FINISH; bench/cl_bandwidth_probe.py's one-pass form ends the same way)
PARTIAL = """
  red[l] = acc.x + acc.y + acc.z + acc.w;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int k = L / 2; k > 0; k >>= 1) { if (l < k) red[l] += red[l + k]; barrier(CLK_LOCAL_MEM_FENCE); }
"""
FINISH = PARTIAL + """  if (l == 0) {
    parts[g] = red[0];
    mem_fence(CLK_GLOBAL_MEM_FENCE);
    last = atomic_inc(counter) == G - 1;
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  if (!last) return;
  mem_fence(CLK_GLOBAL_MEM_FENCE);
  float t = 0.0f;
  for (int j = l; j < G; j += L) t += ((volatile __global float*)parts)[j];
  red[l] = t;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int k = L / 2; k > 0; k >>= 1) { if (l < k) red[l] += red[l + k]; barrier(CLK_LOCAL_MEM_FENCE); }
  if (l == 0) { o[0] = red[0]; *counter = 0; }
}"""


def form(layout: str, u: int, combine: bool = True) -> str:
  """A one-pass sum of n float4 (n a multiple of every step used here): u loads per work-item per step."""
  head = (f"__kernel void sum_{layout}{u}(__global float* o, __global float* parts, volatile __global int* counter, "
          "__global const float4* x, int n) {\n  __local float red[1024];\n  __local int last;\n"
          "  int g = get_group_id(0), l = get_local_id(0), L = get_local_size(0), G = get_num_groups(0);\n"
          "  float4 " + ", ".join(f"a{k} = 0.0f" for k in range(u)) + ";\n")
  if layout == "chunk":   # group g: float4s [g*n/G, (g+1)*n/G), lanes neighbouring
    body = ("  int m = n / G;\n  __global const float4* s = x + (long)g * m;\n"
            f"  for (int i = l; i < m; i += {u} * L) {{\n"
            + "".join(f"    a{k} += s[i + {k} * L];\n" for k in range(u)) + "  }\n")
  else:                   # the launch together: item t reads t, t + T, t + 2T, ... (T = G * L); any G
    body = ("  int T = G * L, me = g * L + l, i = me;\n"
            f"  for (; i + {u - 1} * T < n; i += {u} * T) {{\n"
            + "".join(f"    a{k} += x[i + {k} * T];\n" for k in range(u)) + "  }\n"
            "  for (; i < n; i += T) a0 += x[i];\n")
  fold = "  float4 acc = " + " + ".join(f"a{k}" for k in range(u)) + ";"
  if not combine:   # each group's partial only: what the last group's adding costs
    return head.replace(f"sum_{layout}{u}(", f"part_{layout}{u}(") + body + fold + PARTIAL + "  if (l == 0) parts[g] = red[0];\n}"
  return head + body + fold + FINISH


def main() -> None:
  devs = [d for p in cl.get_platforms() for d in p.get_devices()]
  dev = devs[0]
  ctx = cl.Context([dev])
  q = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
  units = dev.max_compute_units
  print(f"device: {dev.name} ({units} compute units); N = {N}")
  mf = cl.mem_flags
  host = np.random.default_rng(0).standard_normal(N, dtype=np.float32)
  x = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=host)
  big = cl.Buffer(ctx, mf.READ_WRITE, 4 * N)
  out = cl.Buffer(ctx, mf.READ_WRITE, 4)
  parts = cl.Buffer(ctx, mf.READ_WRITE, 4 * 65536)
  counter = cl.Buffer(ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=np.zeros(1, np.int32))
  want = float(host.astype(np.float64).sum())

  def timed(kernel, glob, loc, *args) -> float:
    times = []
    for _ in range(REPS + 3):
      ev = kernel(q, (glob,), (loc,), *args)
      ev.wait()
      times.append((ev.profile.end - ev.profile.start) * 1e-6)
    return statistics.median(times[3:])

  src = ["__kernel void copy4(__global float4* o, __global const float4* x) { int i = get_global_id(0); o[i] = x[i]; }"]
  src += [form(layout, u) for layout in ("chunk", "stride") for u in (2, 4, 8, 16)]
  src += [form("stride", 4, combine=False), "__kernel void empty(__global float* o) { }"]
  prg = cl.Program(ctx, "\n".join(src)).build()
  ms = timed(prg.copy4, N // 4, 256, big, x)
  copy_bw = 2 * 4 * N / ms / 1e6
  print(f"float4 copy: {ms:.4f} ms, {copy_bw:.0f} GB/s (read + write)")
  print(f"empty kernel, 512 groups x 256: {timed(prg.empty, 512 * 256, 256, out):.4f} ms (the floor of any launch)")
  rows = []
  for layout in ("chunk", "stride"):
    for u in ((4, 8, 16) if layout == "chunk" else (2, 4, 8, 16)):
      k = getattr(prg, f"sum_{layout}{u}")
      k.set_scalar_arg_dtypes([None, None, None, None, np.int32])
      wg_max = k.get_work_group_info(cl.kernel_work_group_info.WORK_GROUP_SIZE, dev)
      for L in (256, 512, 1024):
        if L > wg_max: continue
        groups = (256, 512, 1024, 2048) if layout == "chunk" else (2 * units, 3 * units, 4 * units, 6 * units, 8 * units, 256, 512, 1024)
        for G in groups:
          n4 = N // 4
          if layout == "chunk" and (n4 % G or (n4 // G) % (L * u)): continue
          t = timed(k, G * L, L, out, parts, counter, x, np.int32(n4))
          got = np.empty(1, np.float32)
          cl.enqueue_copy(q, got, out)
          ok = abs(float(got[0]) - want) <= 1e-5 * float(np.abs(host).sum())
          rows.append((t, f"{layout:6s} {u:2d} float4/step  {G:5d} groups x {L:4d}"))
          print(f"{rows[-1][1]}   {t:.4f} ms  {4 * N / t / 1e6:6.0f} GB/s  {4 * N / t / 1e6 / copy_bw:.2f} of copy"
                f"  {'ok' if ok else 'WRONG'}  (kernel allows {wg_max})")
          sys.stdout.flush()
  k = prg.part_stride4
  k.set_scalar_arg_dtypes([None, None, None, None, np.int32])
  for G in (4 * units, 512):
    t = timed(k, G * 256, 256, out, parts, counter, x, np.int32(N // 4))
    print(f"stride 4 float4/step {G:5d} groups x  256, partials only (no last-group add)   {t:.4f} ms  "
          f"{4 * N / t / 1e6 / copy_bw:.2f} of copy")
  rows.sort()
  print("fastest five:", "; ".join(f"{n} {t:.4f} ms ({4 * N / t / 1e6 / copy_bw:.2f})" for t, n in rows[:5]))
  rulec_kernel(copy_bw)


def rulec_kernel(copy_bw: float) -> None:
  """rulec's GRID sum through its CL device: the actions, the work-group size its kernel allows, the time."""
  from rulec.engine.tensor import Tensor
  from rulec.runtime import cl_device
  os.environ.setdefault("RULEC_CL_PROFILE", "1")
  host = np.random.default_rng(1).standard_normal(N, dtype=np.float32)
  t = Tensor(host, device="CL").realize()
  t.sum().realize()
  dev = cl_device.get_device()
  for (_, source), prog in list(cl_device._programs.items()):
    info = lambda what: prog.kernel.get_work_group_info(getattr(cl.kernel_work_group_info, what), dev.dev)
    print(f"rulec kernel: local {prog.local} global {prog.global_}; the kernel allows {info('WORK_GROUP_SIZE')}, "
          f"private {info('PRIVATE_MEM_SIZE')} B, local {info('LOCAL_MEM_SIZE')} B")
  import attrs
  from rulec.codegen import opencl
  base, accs = dev.target, opencl.GROUP_ACCS
  want = float(host.astype(np.float64).sum())
  for grid in sorted({base.grid, 256, 512, 1024}):
    for acc in (4, 8):
      dev.target, opencl.GROUP_ACCS = attrs.evolve(base, grid=grid), acc
      cl_device._by_ast.clear()
      got = t.sum().item()
      times = []
      for _ in range(REPS):
        cl_device.EVENTS.clear()
        t.sum().realize()
        dev.queue.finish()
        times.append(sum((e.profile.end - e.profile.start) for e in cl_device.EVENTS) * 1e-6)
      ms = statistics.median(times)
      ok = abs(got - want) <= 1e-5 * float(np.abs(host).sum())
      print(f"rulec sum 16M through the device, GRID up to {grid}, {acc} accumulators: {ms:.4f} ms  "
            f"{4 * N / ms / 1e6:.0f} GB/s  {4 * N / ms / 1e6 / copy_bw:.2f} of copy  {'ok' if ok else 'WRONG'}")
  dev.target, opencl.GROUP_ACCS = base, accs


if __name__ == "__main__":
  main()
