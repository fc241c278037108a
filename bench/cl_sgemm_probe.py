"""How fast can NVIDIA's OpenCL run a float32 matmul at all? A hand-written SGEMM (written for this probe, a few
tile shapes and layouts) timed beside the kernel rulec generates and torch's cuBLAS, same process, resident buffers,
device event times, medians. This says whether the 0.9x-torch goal of issue #34 is reachable from OpenCL C, and which
kernel shape gets there, before the code generator is taught it.

Variants (macros of the one kernel below):
  BM x BN   the work-group's output tile; each work-item holds TM x TN accumulators
  BK        the sum's steps staged in local memory per barrier
  SPLIT     1: a work-item's rows (and columns) are TM/4 groups of 4 spaced BM*4/TM apart, so a warp's float4 reads of
            a staged row are consecutive (no bank conflicts); 0: its TM rows are consecutive (what rulec emits now)
  NBUF      2: two local buffers, one barrier per step (the next block is stored while the other is read); 1: two

Run: python bench/cl_sgemm_probe.py [n]   (bench/h200.sh sgemmprobe)
"""
from __future__ import annotations

import os
import re
import statistics
import sys

import numpy as np

SOURCE = r"""
#define WGS ((BM / TM) * (BN / TN))
#define NTX (BN / TN)
#define LDA (BM * BK / 4 / WGS)
#define LDB (BK * BN / 4 / WGS)
#if SPLIT
#define ROW(c) ((c) * (BM * 4 / TM) + ty * 4)
#define COL(d) ((d) * (BN * 4 / TN) + tx * 4)
#else
#define ROW(c) (ty * TM + (c) * 4)
#define COL(d) (tx * TN + (d) * 4)
#endif

__kernel __attribute__((reqd_work_group_size(WGS, 1, 1)))
void sgemm(__global const float* restrict A, __global const float* restrict B, __global float* restrict C,
           const int M, const int N, const int K) {
  __local float As[NBUF][BK][BM + APAD];
  __local float Bs[NBUF][BK][BN];
@TILE_START@
  float4 ra[LDA], rb[LDB];
  #pragma unroll
  for (int i = 0; i < LDA; i++) {
    int e = tid + i * WGS;
    ra[i] = vload4(0, A + (size_t)(e / (BK / 4)) * K + (e % (BK / 4)) * 4);
  }
  #pragma unroll
  for (int i = 0; i < LDB; i++) {
    int e = tid + i * WGS;
    rb[i] = vload4(0, B + (size_t)(e / (BN / 4)) * N + (e % (BN / 4)) * 4);
  }
#define STORE(buf) \
  _Pragma("unroll") for (int i = 0; i < LDA; i++) { \
    int e = tid + i * WGS, r = e / (BK / 4), c = (e % (BK / 4)) * 4; \
    As[buf][c][r] = ra[i].x; As[buf][c + 1][r] = ra[i].y; As[buf][c + 2][r] = ra[i].z; As[buf][c + 3][r] = ra[i].w; } \
  _Pragma("unroll") for (int i = 0; i < LDB; i++) { \
    int e = tid + i * WGS; \
    *(__local float4*)&Bs[buf][e / (BN / 4)][(e % (BN / 4)) * 4] = rb[i]; }
  STORE(0)
  barrier(CLK_LOCAL_MEM_FENCE);
  const int nk = K / BK;
  for (int kt = 0; kt < nk; kt++) {
    const int cur = NBUF == 2 ? (kt & 1) : 0;
    if (kt + 1 < nk) {
      #pragma unroll
      for (int i = 0; i < LDA; i++) {
        int e = tid + i * WGS;
        ra[i] = vload4(0, A + (size_t)(e / (BK / 4)) * K + (kt + 1) * BK + (e % (BK / 4)) * 4);
      }
      #pragma unroll
      for (int i = 0; i < LDB; i++) {
        int e = tid + i * WGS;
        rb[i] = vload4(0, B + (size_t)((kt + 1) * BK + e / (BN / 4)) * N + (e % (BN / 4)) * 4);
      }
    }
    #pragma unroll
    for (int k = 0; k < BK; k++) {
      float a[TM], b[TN];
      #pragma unroll
      for (int c = 0; c < TM / 4; c++) {
        float4 v = *(__local float4*)&As[cur][k][ROW(c)];
        a[4 * c] = v.x; a[4 * c + 1] = v.y; a[4 * c + 2] = v.z; a[4 * c + 3] = v.w;
      }
      #pragma unroll
      for (int d = 0; d < TN / 4; d++) {
        float4 v = *(__local float4*)&Bs[cur][k][COL(d)];
        b[4 * d] = v.x; b[4 * d + 1] = v.y; b[4 * d + 2] = v.z; b[4 * d + 3] = v.w;
      }
      #pragma unroll
      for (int i = 0; i < TM; i++)
        #pragma unroll
        for (int j = 0; j < TN; j++) acc[i][j] = fma(a[i], b[j], acc[i][j]);
    }
    if (kt + 1 < nk) {
#if NBUF == 1
      barrier(CLK_LOCAL_MEM_FENCE);
      STORE(0)
#else
      STORE(cur ^ 1)
#endif
    }
    barrier(CLK_LOCAL_MEM_FENCE);
  }
@TILE_STORE@
}
"""

# both kernels' work-group position and accumulators, and their stores of C
_TILE_START = ('''  const int tid = get_local_id(0);
  const int nbx = N / BN;
#if SW
  // SW rows of blocks at a time, column by column: the work-groups in flight share SW blocks of A and their B (L2)
  const int g = get_group_id(0), per = SW * nbx, first = g / per * SW, rows = min(M / BM - first, SW);
  const int bx = g % per / rows, by = first + g % per % rows;
#else
  const int bx = get_group_id(0) % nbx, by = get_group_id(0) / nbx;
#endif
  const int tx = tid % NTX, ty = tid / NTX;
  A += (size_t)by * BM * K;
  B += bx * BN;
  C += (size_t)by * BM * N + bx * BN;
  float acc[TM][TN];
  #pragma unroll
  for (int i = 0; i < TM; i++)
    #pragma unroll
    for (int j = 0; j < TN; j++) acc[i][j] = 0.0f;
''').rstrip("\n")
_TILE_STORE = ('''  #pragma unroll
  for (int c = 0; c < TM / 4; c++)
    #pragma unroll
    for (int i = 0; i < 4; i++)
      #pragma unroll
      for (int d = 0; d < TN / 4; d++)
        vstore4((float4)(acc[4 * c + i][4 * d], acc[4 * c + i][4 * d + 1], acc[4 * c + i][4 * d + 2],
                         acc[4 * c + i][4 * d + 3]), 0, C + (size_t)(ROW(c) + i) * N + COL(d));
''').rstrip("\n")
SOURCE = SOURCE.replace("@TILE_START@", _TILE_START).replace("@TILE_STORE@", _TILE_STORE)

# The same tiles with the global -> local copies as Ampere's cp.async (inline PTX: no registers on the way, no
# transpose), ST blocks in flight: A stays [m][k] in local memory (rows padded by APAD floats) and each work-item reads
# four steps of a row as one float4; B is [k][n] as above. The local pointer's integer value is its .shared address.
ASYNC_SOURCE = r"""
#define WGS ((BM / TM) * (BN / TN))
#define NTX (BN / TN)
#define CA (BM * BK / 4 / WGS)
#define CB (BK * BN / 4 / WGS)
#define ROW(c) ((c) * (BM * 4 / TM) + ty * 4)
#define COL(d) ((d) * (BN * 4 / TN) + tx * 4)

inline void cp16(__local float* dst, __global const float* src) {
  asm volatile("{ .reg .u32 s; cvt.u32.u64 s, %0; cp.async.cg.shared.global [s], [%1], 16; }"
               :: "l"((ulong)dst), "l"(src) : "memory");
}

__kernel __attribute__((reqd_work_group_size(WGS, 1, 1)))
void sgemm(__global const float* restrict A, __global const float* restrict B, __global float* restrict C,
           const int M, const int N, const int K) {
  __local float As[ST][BM][BK + APAD] __attribute__((aligned(16)));
  __local float Bs[ST][BK][BN] __attribute__((aligned(16)));
@TILE_START@
  const int nk = K / BK;
#define ISSUE(st, t) { \
    _Pragma("unroll") for (int i = 0; i < CA; i++) { \
      int e = tid + i * WGS, r = e / (BK / 4), c = (e % (BK / 4)) * 4; \
      cp16(&As[st][r][c], A + (size_t)r * K + (t) * BK + c); } \
    _Pragma("unroll") for (int i = 0; i < CB; i++) { \
      int e = tid + i * WGS, r = e / (BN / 4), c = (e % (BN / 4)) * 4; \
      cp16(&Bs[st][r][c], B + (size_t)((t) * BK + r) * N + c); } }
  #pragma unroll
  for (int s = 0; s < ST - 1; s++) {
    if (s < nk) ISSUE(s, s)
    asm volatile("cp.async.commit_group;" ::: "memory");
  }
  for (int kt = 0; kt < nk; kt++) {
    asm volatile("cp.async.wait_group %0;" :: "n"(ST - 2) : "memory");
    barrier(CLK_LOCAL_MEM_FENCE);
    if (kt + ST - 1 < nk) ISSUE((kt + ST - 1) % ST, kt + ST - 1)
    asm volatile("cp.async.commit_group;" ::: "memory");
    const int cur = kt % ST;
    #pragma unroll
    for (int k4 = 0; k4 < BK / 4; k4++) {
      float4 a[TM];
      #pragma unroll
      for (int c = 0; c < TM / 4; c++)
        #pragma unroll
        for (int i = 0; i < 4; i++) a[4 * c + i] = *(__local float4*)&As[cur][ROW(c) + i][k4 * 4];
      #pragma unroll
      for (int kk = 0; kk < 4; kk++) {
        float b[TN];
        #pragma unroll
        for (int d = 0; d < TN / 4; d++) {
          float4 v = *(__local float4*)&Bs[cur][k4 * 4 + kk][COL(d)];
          b[4 * d] = v.x; b[4 * d + 1] = v.y; b[4 * d + 2] = v.z; b[4 * d + 3] = v.w;
        }
        #pragma unroll
        for (int i = 0; i < TM; i++) {
          float av = kk == 0 ? a[i].x : kk == 1 ? a[i].y : kk == 2 ? a[i].z : a[i].w;
          #pragma unroll
          for (int j = 0; j < TN; j++) acc[i][j] = fma(av, b[j], acc[i][j]);
        }
      }
    }
  }
@TILE_STORE@
}
"""

ASYNC_SOURCE = ASYNC_SOURCE.replace("@TILE_START@", _TILE_START).replace("@TILE_STORE@", _TILE_STORE)

# (BM, BN, BK, TM, TN, ST, APAD): cp.async variants (local memory: ST * (BM * (BK + APAD) + BK * BN) floats, at most 48 KiB)
ASYNC_VARIANTS = [
  (128, 128, 8, 8, 8, 3, 4),
  (128, 128, 8, 8, 8, 4, 4),
  (128, 128, 16, 8, 8, 2, 4),
  (128, 64, 16, 8, 8, 3, 4),
  (128, 128, 8, 8, 16, 4, 4),
  (64, 128, 16, 8, 8, 3, 4),
]
# ... the best of those again with the work-groups ordered SW rows of blocks at a time, and with the registers capped
# so that four work-groups fit on a compute unit (3 did at 168 registers: 2048 groups of the 4096^3 product then run
# in 5.2 waves, the last one a sixth full); (BM, BN, BK, TM, TN, ST, APAD, SW, extra build options)
ASYNC_MORE = [
  (64, 128, 16, 8, 8, 3, 4, 8, ()),
  (64, 128, 16, 8, 8, 3, 4, 16, ()),
  (64, 128, 16, 8, 8, 3, 4, 0, ("-cl-nv-maxrregcount=128",)),
  (64, 128, 16, 8, 8, 3, 4, 8, ("-cl-nv-maxrregcount=128",)),
  (128, 64, 16, 8, 8, 3, 4, 0, ("-cl-nv-maxrregcount=128",)),
  (64, 128, 16, 8, 8, 2, 4, 0, ("-cl-nv-maxrregcount=128",)),
]

# (BM, BN, BK, TM, TN, SPLIT, NBUF, APAD)
VARIANTS = [
  (64, 128, 16, 8, 8, 0, 1, 0),     # rulec's shape today, hand-written
  (64, 128, 16, 8, 8, 1, 1, 0),
  (64, 128, 16, 8, 8, 1, 2, 0),
  (128, 128, 8, 8, 8, 0, 2, 0),
  (128, 128, 8, 8, 8, 1, 1, 0),
  (128, 128, 8, 8, 8, 1, 2, 0),
  (128, 128, 16, 8, 8, 1, 2, 0),
  (128, 128, 16, 8, 8, 1, 1, 0),
  (128, 64, 16, 8, 8, 1, 2, 0),
  (128, 128, 8, 8, 8, 1, 2, 4),
  (128, 256, 8, 8, 16, 1, 2, 0),
  (256, 128, 8, 16, 8, 1, 2, 0),
  (128, 128, 16, 8, 16, 1, 2, 0),   # 128 work-items of 128 accumulators each (more independent fma per shared read)
  (128, 128, 16, 16, 8, 1, 2, 0),
  (128, 128, 8, 8, 16, 1, 2, 0),
  (128, 64, 16, 8, 8, 1, 2, 4),
]


# RULEC_PROBE_VERBOSE=1: NVIDIA's build log (registers and spills per kernel, -cl-nv-verbose) for each variant, and
# each variant's PTX under $OUT (or /tmp) to read the inner loop; RULEC_PROBE_OPTS: more build options for every variant
# (-cl-nv-maxrregcount=N)
VERBOSE = os.environ.get("RULEC_PROBE_VERBOSE") == "1"
EXTRA_OPTS = os.environ.get("RULEC_PROBE_OPTS", "").split()


def report_build(prg, device, name: str) -> None:
  import pyopencl as cl
  log = prg.get_build_info(device, cl.program_build_info.LOG)
  for line in log.splitlines():
    if "registers" in line or "spill" in line or "stack" in line: print(f"    {line.strip()}")
  ptx = prg.get_info(cl.program_info.BINARIES)[0]
  out = os.environ.get("OUT", "/tmp")
  with open(os.path.join(out, "sgemm-" + re.sub(r"[^A-Za-z0-9]+", "_", name) + ".ptx"), "wb") as f: f.write(ptx)


def prog_options(dev) -> list[str]:
  return list(dev.options)


def median_ms(events) -> float:
  return statistics.median((e.profile.end - e.profile.start) * 1e-6 for e in events)


def main():
  import pyopencl as cl
  n = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
  reps = 10
  from rulec.runtime import cl_device
  dev = cl_device.get_device()
  ctx = dev.ctx
  queue = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
  nvidia = "NVIDIA" in dev.dev.platform.name
  if VERBOSE and nvidia: EXTRA_OPTS.append("-cl-nv-verbose")
  print(f"device: {dev.dev.name}; sgemm {n}^3 float32; medians of {reps} event times")
  rng = np.random.default_rng(0)
  a = rng.standard_normal((n, n)).astype(np.float32)
  b = rng.standard_normal((n, n)).astype(np.float32)
  check = 128
  want = a[:check].astype(np.float64) @ b.astype(np.float64)
  mf = cl.mem_flags
  da = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=a)
  db = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=b)
  dc = cl.Buffer(ctx, mf.READ_WRITE, size=a.nbytes)
  flops = 2.0 * n ** 3
  rows = []
  jobs = [(f"{bm}x{bn} BK{bk} {tm}x{tn} {'split' if split else 'contig'} NBUF{nbuf}" + (f" pad{apad}" if apad else ""),
           SOURCE, dict(BM=bm, BN=bn, BK=bk, TM=tm, TN=tn, SPLIT=split, NBUF=nbuf, APAD=apad))
          for bm, bn, bk, tm, tn, split, nbuf, apad in VARIANTS]
  jobs += [(f"{bm}x{bn} BK{bk} {tm}x{tn} cp.async ST{st} pad{apad}", ASYNC_SOURCE,
            dict(BM=bm, BN=bn, BK=bk, TM=tm, TN=tn, ST=st, APAD=apad)) for bm, bn, bk, tm, tn, st, apad in ASYNC_VARIANTS]
  jobs += [(f"{bm}x{bn} BK{bk} {tm}x{tn} cp.async ST{st} SW{sw}" + "".join(" " + o.split("=")[-1] + "reg" for o in opts),
            ASYNC_SOURCE, dict(BM=bm, BN=bn, BK=bk, TM=tm, TN=tn, ST=st, APAD=apad, SW=sw), opts)
           for bm, bn, bk, tm, tn, st, apad, sw, opts in ASYNC_MORE if nvidia]
  if os.environ.get("RULEC_PROBE_ONLY"): jobs = [j for j in jobs if os.environ["RULEC_PROBE_ONLY"] in j[0]]
  for name, source, macros, *more in jobs:
    bm, bn, tm, tn = macros["BM"], macros["BN"], macros["TM"], macros["TN"]
    opts = [f"-D{k}={v}" for k, v in {"SW": 0, **macros}.items()] + ["-cl-mad-enable"] + EXTRA_OPTS + [o for m in more for o in m]
    try:
      prg = cl.Program(ctx, source).build(options=opts)
      if VERBOSE: report_build(prg, dev.dev, name)
    except Exception as e:
      print(f"  {name:44s} build failed: {str(e)[:600]}")
      continue
    wgs = (bm // tm) * (bn // tn)
    knl = prg.sgemm
    args = (da, db, dc, np.int32(n), np.int32(n), np.int32(n))
    glob = ((n // bm) * (n // bn) * wgs,)
    knl(queue, glob, (wgs,), *args).wait()
    out = np.empty_like(a)
    cl.enqueue_copy(queue, out, dc).wait()
    err = float(np.abs(out[:check] - want).max())
    evs = [knl(queue, glob, (wgs,), *args) for _ in range(reps)]
    queue.finish()
    ms = median_ms(evs)
    rows.append((name, ms))
    print(f"  {name:44s} {ms:7.3f} ms  {flops / ms * 1e-9:6.1f} TFLOP/s  max err {err:.1e}")
    sys.stdout.flush()
  # rulec's own kernel for the same matmul, as the cost model tiles it
  from rulec.engine.tensor import Tensor
  ta, tb = Tensor(a, device="CL"), Tensor(b, device="CL")
  ta.realize(), tb.realize()
  c = (ta @ tb)
  c.realize()
  dev.queue.finish()
  import time
  t = []
  for _ in range(reps):
    t0 = time.perf_counter(); (ta @ tb).realize(); dev.queue.finish(); t.append((time.perf_counter() - t0) * 1e3)
  if VERBOSE:   # rulec's kernel source, built again with the same options to read its registers and PTX
    for (_, source), prog in list(cl_device._programs.items())[-1:]:
      report_build(cl.Program(ctx, source).build(options=prog_options(dev) + EXTRA_OPTS), dev.dev, "rulec")
      with open(os.path.join(os.environ.get("OUT", "/tmp"), "sgemm-rulec.cl"), "w") as f: f.write(source)
  print(f"  {'rulec (Tensor @, wall, cost model tiles)':44s} {statistics.median(t):7.3f} ms  "
        f"{flops / statistics.median(t) * 1e-9:6.1f} TFLOP/s  max err {float(np.abs(c.numpy()[:check] - want).max()):.1e}")
  try:
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    xa, xb = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
    torch.mm(xa, xb); torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
      s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
      s.record(); torch.mm(xa, xb); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e))
    tms = statistics.median(ts)
    print(f"  {'torch.mm (cuBLAS, TF32 off)':44s} {tms:7.3f} ms  {flops / tms * 1e-9:6.1f} TFLOP/s")
    for name, ms in sorted(rows, key=lambda r: r[1])[:4]:
      print(f"    torch/{name}: {tms / ms:.2f}")
  except Exception as e:   # no torch or no CUDA on this machine
    print(f"  torch: {type(e).__name__}: {e}")


if __name__ == "__main__":
  main()
