"""How memory-bound kernels reach a GPU's bandwidth: hand-written OpenCL forms of the two workloads the CL renderer
falls short on (relu(a*b+c) and a sum over 16M floats), timed by profiling events against a float4 copy and torch.

Run: python bench/cl_bandwidth_probe.py   (bench/h200.sh probe; prints one line per form)
A diagnostic for choosing what codegen/opencl.py should emit, not a benchmark of rulec: every form here is written
by hand. Elementwise forms: float4 vectors per work-item, one or several, the several either side by side or a
grid apart (neighbouring work-items then read neighbouring vectors on every load). Sum forms: two passes (partial
sums per work-group, then one group adds them) with scalar or float4 loads and several group counts, and a single
pass where the last work-group to finish adds the partials (an atomic counter). Each line gives the median kernel
time over 30 runs and GB/s as (bytes read + written) / time.

Then rulec's own kernels for the same two programs, two ways: (1) rulec's generated source built in this probe's
context and launched with rulec's work sizes on this probe's buffers, beside edited copies of it (int indices, no
bound check, no FP_CONTRACT pragma, other work-group sizes) to find which difference costs; (2) through rulec's CL
device as bench/cl_kernels.py runs them (fresh input tensors each repetition, profiling events), and again on the
same buffers, to tell a cost of the source from a cost of the harness.
"""
from __future__ import annotations

import statistics
import sys

import numpy as np
import pyopencl as cl

from cl_sum_probe import FINISH   # (the one-pass sum's tail: each group's partial, the last group adds them)

N = 1 << int(__import__("os").environ.get("PROBE_LOG2N", "24"))
REPS = int(__import__("os").environ.get("PROBE_REPS", "30"))


def main() -> None:
  plat = [d for p in cl.get_platforms() for d in p.get_devices()]
  dev = plat[0]
  ctx = cl.Context([dev])
  q = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
  units = dev.max_compute_units
  print(f"device: {dev.name} ({units} compute units); N = {N}")
  mf = cl.mem_flags
  rng = np.random.default_rng(0)
  host = [rng.standard_normal(N, dtype=np.float32) for _ in range(3)]
  a, b, c = (cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=h) for h in host)
  out = cl.Buffer(ctx, mf.READ_WRITE, 4 * N)
  big = cl.Buffer(ctx, mf.READ_WRITE, 4 * N)
  parts = cl.Buffer(ctx, mf.READ_WRITE, 4 * 65536)
  total = cl.Buffer(ctx, mf.READ_WRITE, 4)
  counter = cl.Buffer(ctx, mf.READ_WRITE, 4)
  want_ew = np.maximum(host[0] * host[1] + host[2], 0)
  want_sum = float(host[0].astype(np.float64).sum())

  def timed(launches) -> float:
    """Median milliseconds of the launches (a list of (kernel, global, local, args)), events summed per run."""
    times = []
    for _ in range(REPS + 3):
      evs = [k(q, (g,), (l,) if l else None, *args) for k, g, l, args in launches]
      q.finish()
      times.append(sum((e.profile.end - e.profile.start) for e in evs) * 1e-6)
    return statistics.median(times[3:])

  src = []
  src.append("__kernel void copy4(__global float4* o, __global const float4* x) { int i = get_global_id(0); o[i] = x[i]; }")
  for m in (1, 2, 4, 8):
    body_grid = "".join(f"{{ int j = i + {k} * W; float4 v = a[j] * b[j] + c[j]; o[j] = fmax(v, (float4)(0.0f)); }}" for k in range(m))
    src.append(f"__kernel void ew_grid{m}(__global float4* o, __global const float4* a, __global const float4* b, "
               f"__global const float4* c) {{ int i = get_global_id(0); int W = get_global_size(0); {body_grid} }}")
    body_side = "".join(f"{{ int j = i * {m} + {k}; float4 v = a[j] * b[j] + c[j]; o[j] = fmax(v, (float4)(0.0f)); }}" for k in range(m))
    src.append(f"__kernel void ew_side{m}(__global float4* o, __global const float4* a, __global const float4* b, "
               f"__global const float4* c) {{ int i = get_global_id(0); {body_side} }}")
  # two-pass sum: group g reduces a contiguous slice of n elements; vec: float4 loads
  for vec in (1, 4):
    t = "float4" if vec == 4 else "float"
    fold = "acc.x + acc.y + acc.z + acc.w" if vec == 4 else "acc"
    src.append(f"""
__kernel void sum_part{vec}(__global float* parts, __global const {t}* x, int n) {{
  __local float red[1024];
  int g = get_group_id(0), l = get_local_id(0), L = get_local_size(0);
  __global const {t}* s = x + (long)g * n;
  {t} acc = 0.0f, acc2 = 0.0f, acc3 = 0.0f, acc4 = 0.0f;
  int i = l;
  for (; i + 3 * L < n; i += 4 * L) {{ acc += s[i]; acc2 += s[i + L]; acc3 += s[i + 2 * L]; acc4 += s[i + 3 * L]; }}
  for (; i < n; i += L) acc += s[i];
  acc = acc + acc2 + acc3 + acc4;
  red[l] = {fold};
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int k = L / 2; k > 0; k >>= 1) {{ if (l < k) red[l] += red[l + k]; barrier(CLK_LOCAL_MEM_FENCE); }}
  if (l == 0) parts[g] = red[0];
}}""")
  src.append("""
__kernel void sum_final(__global float* o, __global const float* parts, int n) {
  __local float red[1024];
  int l = get_local_id(0), L = get_local_size(0);
  float acc = 0.0f;
  for (int i = l; i < n; i += L) acc += parts[i];
  red[l] = acc;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int k = L / 2; k > 0; k >>= 1) { if (l < k) red[l] += red[l + k]; barrier(CLK_LOCAL_MEM_FENCE); }
  if (l == 0) o[0] = red[0];
}
__kernel void sum_onepass(__global float* o, __global float* parts, volatile __global int* counter,
                          __global const float4* x, int n) {
  __local float red[1024];
  __local int last;
  int g = get_group_id(0), l = get_local_id(0), L = get_local_size(0), G = get_num_groups(0);
  __global const float4* s = x + (long)g * n;
  float4 acc = 0.0f, acc2 = 0.0f, acc3 = 0.0f, acc4 = 0.0f;
  int i = l;
  for (; i + 3 * L < n; i += 4 * L) { acc += s[i]; acc2 += s[i + L]; acc3 += s[i + 2 * L]; acc4 += s[i + 3 * L]; }
  for (; i < n; i += L) acc += s[i];
  acc = acc + acc2 + acc3 + acc4;""" + FINISH)
  program = cl.Program(ctx, "\n".join(src)).build()
  prg = type("Kernels", (), {k.function_name: k for k in program.all_kernels()})
  zero = np.zeros(1, np.int32)
  cl.enqueue_copy(q, counter, zero)

  ms = timed([(prg.copy4, N // 4, 0, (big, a))])
  copy_bw = 2 * 4 * N / ms / 1e6
  print(f"float4 copy: {ms:.4f} ms, {copy_bw:.0f} GB/s")

  def report(name: str, ms: float, nbytes: int, ok: bool) -> None:
    bw = nbytes / ms / 1e6
    print(f"{name:38s} {ms:8.4f} ms  {bw:6.0f} GB/s  {bw / copy_bw:5.2f} of copy  {'ok' if ok else 'WRONG'}")
    sys.stdout.flush()

  res = np.empty(N, np.float32)
  if __import__("os").environ.get("PROBE_ONLY") == "rulec":   # rulec's kernels alone (a quick look on PoCL)
    return rulec_forms(ctx, q, timed, report, host, (a, b, c), out, want_ew, want_sum)
  for m in (1, 2, 4, 8):
    for kind in ("grid", "side"):
      k = getattr(prg, f"ew_{kind}{m}")
      for local in (0, 256):
        cl.enqueue_fill_buffer(q, out, np.float32(-1), 0, 4 * N)
        ms = timed([(k, N // 4 // m, local, (out, a, b, c))])
        cl.enqueue_copy(q, res, out)
        report(f"relu(a*b+c) {kind} {m} float4/item wg {local or 'auto'}", ms, 16 * N,
               np.allclose(res, want_ew, rtol=1e-5, atol=1e-5))
  one = np.empty(1, np.float32)
  for vec in (1, 4):
    for groups in (256, 264, 528, 1056, 2048, 4096):
      n = N // vec // groups
      if n * groups * vec != N: continue
      for local in (256, 512, 1024):
        ms = timed([(getattr(prg, f"sum_part{vec}"), groups * local, local, (parts, a, np.int32(n))),
                    (prg.sum_final, 256, 256, (total, parts, np.int32(groups)))])
        cl.enqueue_copy(q, one, total)
        report(f"sum two-pass {'float4' if vec == 4 else 'scalar'} {groups}x{local}", ms, 4 * N,
               abs(one[0] - want_sum) <= 1e-3 * np.abs(host[0]).sum())
  for groups in (256, 528, 1024, 2048):
    n = N // 4 // groups
    if n * groups * 4 != N: continue
    for local in (256, 512, 1024):
      ms = timed([(prg.sum_onepass, groups * local, local, (total, parts, counter, a, np.int32(n)))])
      cl.enqueue_copy(q, one, total)
      report(f"sum one-pass float4 {groups}x{local}", ms, 4 * N, abs(one[0] - want_sum) <= 1e-3 * np.abs(host[0]).sum())
  rulec_forms(ctx, q, timed, report, host, (a, b, c), out, want_ew, want_sum)
  try:
    import torch
  except ImportError:
    return
  if not torch.cuda.is_available(): return
  ta, tb, tc = (torch.from_numpy(h).cuda() for h in host)
  for name, fn, nbytes in (("torch addcmul (3 reads, 1 write)", lambda: torch.addcmul(tc, ta, tb), 16 * N),
                           ("torch sum", lambda: ta.sum(), 4 * N), ("torch copy_", lambda: ta.clone(), 8 * N)):
    times = []
    for _ in range(REPS + 3):
      s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
      s.record(); fn(); e.record(); torch.cuda.synchronize()
      times.append(s.elapsed_time(e))
    ms = statistics.median(times[3:])
    print(f"{name:38s} {ms:8.4f} ms  {nbytes / ms / 1e6:6.0f} GB/s  {nbytes / ms / 1e6 / copy_bw:5.2f} of copy")


def rulec_forms(ctx, q, timed, report, host, inputs, out, want_ew, want_sum) -> None:
  import os
  import re
  sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
  os.environ.setdefault("RULEC_CL_PROFILE", "1")
  from rulec.engine.sched.driver import schedule
  from rulec.engine.tensor import Tensor
  from rulec.runtime import cl_device
  from rulec.runtime.buffer import buffer_of
  dev = cl_device.get_device()
  programs = {"relu(a*b+c)": lambda x, y, z: (x * y + z).relu(), "sum": lambda x, y, z: x.sum()}
  for name, fn in programs.items():
    ts = [Tensor(h, device="CL") for h in host]
    kernels, _ = schedule([fn(*ts).uop], "CL")
    nbytes = 16 * N if name.startswith("relu") else 4 * N
    # (1) the generated source in this harness (one kernel programs only: the elementwise one)
    if len(kernels) == 1:
      k = kernels[0]
      prog = cl_device.compile_kernel(k, dev)
      param_of = {id(buffer_of(bb)): i for i, bb in enumerate(k.bufs)}
      args = [None] * len(k.bufs)
      for t, mem in zip(ts, inputs):
        if id(buffer_of(t.uop.base)) in param_of: args[param_of[id(buffer_of(t.uop.base))]] = mem
      args = [out if m is None else m for m in args]
      for n in prog.rendered.scratch:   # a one-pass reduction's partials and counter (zeroed, as the CL device does)
        args.append(cl.Buffer(ctx, cl.mem_flags.READ_WRITE, n))
        cl.enqueue_fill_buffer(q, args[-1], np.uint8(0), 0, n)
      variants = {"as generated": prog.source,
                  "int indices": re.sub(r"\blong\b", "int", prog.source).replace("L)", ")").replace("L;", ";"),
                  "no bound check": re.sub(r"\n *if \(wid >= \d+L?\) return;", "", prog.source),
                  "no FP_CONTRACT OFF": prog.source.replace("#pragma OPENCL FP_CONTRACT OFF", "")}
      res = np.empty(N, np.float32)
      for vname, src in variants.items():
        kern = cl.Kernel(cl.Program(ctx, src).build(options=dev.options), prog.rendered.name)
        for local in sorted({prog.local, 256, 0}):
          cl.enqueue_fill_buffer(q, out, np.float32(-1), 0, 4 * N)
          if prog.rendered.local_size: local = prog.local
          ms = timed([(kern, prog.global_ if local else prog.rendered.global_size, local, tuple(args))])
          cl.enqueue_copy(q, res, out)
          ok = np.allclose(res, want_ew, rtol=1e-5, atol=1e-5) if name.startswith("relu") else \
            abs(res[0] - want_sum) <= 1e-3 * np.abs(host[0]).sum()
          report(f"rulec {name} {vname} wg {local or 'auto'}", ms, nbytes, ok)
          if prog.rendered.local_size: break   # (a group reduction's work-group size is part of its source)
    # (2) through rulec's device: fresh inputs each time (as bench/cl_kernels.py), then the same buffers again
    fresh, same = [], []
    for i in range(REPS + 3):
      ts = [Tensor(h.copy(), device="CL") for h in host]
      kernels, _ = schedule([fn(*ts).uop], "CL")
      for kk in kernels:
        for bb in kk.bufs: cl_device.device_memory(buffer_of(bb), dev)
      cl_device.synchronize()
      for times in (fresh, same):
        cl_device.EVENTS.clear()
        for kk in kernels: cl_device.run_kernel(kk)
        cl_device.synchronize()
        times.append(sum(e.profile.end - e.profile.start for e in cl_device.EVENTS) * 1e-6)
    report(f"rulec {name} device, fresh inputs ({len(kernels)} kernels)", statistics.median(fresh[3:]), nbytes, True)
    report(f"rulec {name} device, same buffers again", statistics.median(same[3:]), nbytes, True)


if __name__ == "__main__":
  main()
