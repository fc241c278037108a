"""Kernel run time: rulec on its CPU device against numpy and tinygrad 0.14 (CPU), same workloads, same run.

Run:  python bench/kernels.py [--device CPU] [--only NAME ...]
      python bench/kernels.py --device CL [--dtype float16|bfloat16]   (an OpenCL device against torch on CUDA,
                                               in float32 or a 2-byte float on both sides: bench/cl_kernels.py;
                                                bench/h200.sh runs it, and the CL test suite, on an H200)
The workloads, their numpy references and the result checks are in bench/workloads.py.
Needs `pip install '.[bench]'` (tinygrad==0.14.0) and Debian's `clang` (tinygrad's
CPU device compiles its kernels with it). The whole run takes about a minute on
a 2-core machine. rulec's conv2d (and numpy's) is slow enough to get a
compile-only warm-up and a single timed repetition (the `reps` column says so).

What is timed (all times are medians over the repetitions, in milliseconds):

- rulec: the program is built from Tensors made from numpy arrays and run once
  (warm-up: compiles every kernel and fills the program cache; for workloads
  marked slow the warm-up only compiles, `cpu_device.compile_kernel`). Each
  timed repetition makes fresh inputs (new numpy arrays -> new Tensors), builds
  the program again, gets its kernels with `rulec.engine.sched.driver.schedule(...,
  "CPU")` outside the timer, allocates and touches every buffer the kernels use
  (so page faults of fresh output buffers are not counted), then times
  `for k in kernels: cpu_device.run_kernel(k)`. That includes run_kernel's own
  Python work per kernel (validate, decomposition rules, IR rendering, program
  cache lookup, thread dispatch) but no compilation: the script checks that
  `cpu_device.COUNTERS` count no program built or loaded while timing. A second,
  small table gives rulec's time when the fresh output buffers are allocated
  and first touched inside the timer (what a plain `realize()` pays).
- numpy: the natural expression (np.maximum(a*b+c, 0), a.sum(), softmax and log_softmax with
  max subtraction, layernorm, a @ b (OpenBLAS, multi-threaded), conv2d as
  np.pad + sliding_window_view + tensordot to a contiguous NCHW array), on
  fresh input arrays; its own allocations are included.
- tinygrad: DEV=CPU (its threaded CPU device), the program wrapped in TinyJit;
  two warm-up calls (compile, then JIT capture); each timed call gets fresh
  realized input Tensors (made from new numpy arrays; TinyJit swaps them in as
  the JIT's inputs, the output buffer is the JIT's own, reused), and is timed
  up to `Device["CPU"].synchronize()`.

Fresh inputs are copies of one of two pre-generated input sets, alternating, so
a framework that kept using stale inputs would fail the check. Every result is
compared with numpy's (np.allclose, float32 tolerances; reductions may
reassociate, so sums get a tolerance relative to sum(|x|)).

Columns of the table:
  rulec ms / numpy ms / tinygrad ms   median run time
  rulec GB/s or GFLOP/s   memory-bound workloads: (bytes of inputs read + bytes
                          of outputs written) / rulec time; matmul and conv2d:
                          2*M*N*K flops / rulec time
  frac copy BW            that GB/s over the machine's copy bandwidth: np.copyto
                          of a 256 MiB float32 array split across one thread per
                          core, counted as STREAM does (bytes read + written),
                          measured at the start and at the end of the run; the
                          higher of the two is used (the machine may be shared)
  vs numpy, vs tinygrad   numpy time / rulec time and tinygrad time / rulec time
                          (> 1: rulec is faster)
  reps                    timed repetitions for rulec / numpy / tinygrad
Compile time (bench/compile_times.py, its docstring says what is timed): each
workload's kernels compiled by rulec and by tinygrad in new processes, cold
(empty caches: RULEC_CACHE_DIR, tinygrad's CACHEDB, POCL_CACHE_DIR) and warm
(a second process with the caches the first left), as milliseconds and as
tinygrad / rulec ratios; `--device CL` compares with tinygrad's CL device.
`--skip-compile` leaves that table out.

The last line is
  elementwise_bw_fraction=<frac copy BW of relu(a*b+c) at 16M>
  matmul_vs_numpy=<rulec GFLOP/s / numpy GFLOP/s for the 1024^3 matmul>
  geomean_vs_tinygrad=<geometric mean over all workloads of tinygrad time / rulec time>
  compile_cold_vs_tinygrad=<tinygrad's total cold compile time / rulec's>
  compile_warm_ms=<rulec's total warm compile time>
"""
from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path

DEVICES = ("CPU", "CL")


def parse_args(argv=None):
  p = argparse.ArgumentParser(description="rulec kernel run time against its peers (see the module docstring)")
  p.add_argument("--device", default="CPU", help="rulec device to benchmark: CPU (against numpy and tinygrad) or CL "
                 "(an OpenCL device, against torch on CUDA where there is one: bench/cl_kernels.py)")
  p.add_argument("--only", nargs="*", default=None, metavar="NAME",
                 help="run only workloads whose name contains one of these strings (the summary line then covers those)")
  p.add_argument("--scale", type=int, default=1, help="CL only: divide every workload's size by this (a quick check on PoCL)")
  p.add_argument("--skip-compile", action="store_true", help="leave out the cold / warm compile-time table")
  p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"],
                 help="CL only: the inputs' and outputs' dtype on both sides (rulec and torch); the reference is float32 "
                      "numpy on the inputs rounded to it")
  args = p.parse_args(argv)
  args.device = args.device.upper()
  if args.dtype != "float32" and args.device != "CL": p.error("--dtype float16/bfloat16 is for --device CL")
  if args.device not in DEVICES: p.error(f"--device {args.device}: rulec can be benchmarked on {', '.join(DEVICES)}")
  return args


ARGS = parse_args()
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
if ARGS.device == "CL":
  import cl_kernels
  cl_kernels.main(ARGS)
  sys.exit(0)
os.environ["DEV"] = "CPU"   # tinygrad's device: always its CPU device, whatever the environment says

import numpy as np  # noqa: E402
from tinygrad import Device as TGDevice, Tensor as TT, TinyJit  # noqa: E402
import compile_times  # noqa: E402
from workloads import WORKLOADS, Inputs, Workload, check, fmt, print_table  # noqa: E402

from rulec.engine.sched.driver import schedule as rulec_schedule  # noqa: E402
from rulec.engine.tensor import Tensor as RT  # noqa: E402
from rulec.runtime import cpu_device  # noqa: E402
from rulec.runtime.buffer import buffer_of  # noqa: E402

RULEC_DEVICE = ARGS.device


# *** rulec ***

def programs_made() -> int:
  """Programs built or loaded from the disk cache so far: neither may happen while timing."""
  return cpu_device.COUNTERS["compiled"] + cpu_device.COUNTERS["loaded"]


def touch_buffers(kernels) -> None:
  """Allocate every buffer the kernels use and write it once, so fresh outputs do not page-fault in the timer."""
  for k in kernels:
    for b in k.bufs:
      buf = buffer_of(b)
      if not buf.allocated: buf.numpy_view().fill(0)


def rulec_output(out: RT, views) -> np.ndarray:
  out.uop = views[0]      # the realized view, as Tensor.realize would set it
  return out.numpy()


def time_rulec(w: Workload, inp: Inputs, failures: list[str], prefault: bool = True) -> list[float]:
  # warm-up: compile (and, unless slow, run once, checked)
  ts = [RT(a, device=RULEC_DEVICE) for a in inp.fresh(1)]
  out = w.rulec(*ts)
  kernels, views = rulec_schedule([out.uop], RULEC_DEVICE)
  if w.slow:
    for k in kernels: cpu_device.compile_kernel(k)
  else:
    for k in kernels: cpu_device.run_kernel(k)
    check(w, inp, 1, rulec_output(out, views), "rulec (warm-up)", failures)
  times = []
  for i in range(w.reps[0]):
    ts = [RT(a, device=RULEC_DEVICE) for a in inp.fresh(i)]
    out = w.rulec(*ts)
    kernels, views = rulec_schedule([out.uop], RULEC_DEVICE)
    if prefault: touch_buffers(kernels)
    compiled = programs_made()
    t0 = time.perf_counter()
    for k in kernels: cpu_device.run_kernel(k)
    times.append(time.perf_counter() - t0)
    if programs_made() != compiled:
      failures.append(f"{w.name}: rulec compiled or loaded {programs_made() - compiled} kernel(s) while timing")
    check(w, inp, i, rulec_output(out, views), "rulec", failures)
  w.results["rulec kernels"] = len(kernels)
  return times


def time_numpy(w: Workload, inp: Inputs, failures: list[str]) -> list[float]:
  w.numpy(*inp.fresh(1))
  times = []
  for i in range(w.reps[1]):
    arrs = inp.fresh(i)
    t0 = time.perf_counter()
    r = w.numpy(*arrs)
    times.append(time.perf_counter() - t0)
    check(w, inp, i, r, "numpy", failures)
  return times


def time_tinygrad(w: Workload, inp: Inputs, failures: list[str]) -> list[float]:
  dev = TGDevice[TGDevice.DEFAULT]
  jit = TinyJit(lambda *xs: w.tinygrad(*xs).realize())
  times = []
  for i in range(-2, w.reps[2]):    # two warm-up calls: compile, then JIT capture
    ts = [TT(a).realize() for a in inp.fresh(i)]
    dev.synchronize()
    t0 = time.perf_counter()
    out = jit(*ts)
    dev.synchronize()
    dt = time.perf_counter() - t0
    if i >= 0: times.append(dt)
    check(w, inp, i, out.numpy(), "tinygrad" if i >= 0 else "tinygrad (warm-up)", failures)
  return times


def copy_bandwidth(nbytes: int = 256 << 20, reps: int = 7) -> float:
  """GB/s of np.copyto split across one thread per core, STREAM counting (read + write)."""
  n = nbytes // 4
  src = np.full(n, 1.5, dtype=np.float32)
  dst = np.empty_like(src)
  nt = os.cpu_count() or 1
  bounds = [(n * i // nt, n * (i + 1) // nt) for i in range(nt)]
  def part(lo_hi):
    lo, hi = lo_hi
    np.copyto(dst[lo:hi], src[lo:hi])
  times = []
  with ThreadPoolExecutor(max_workers=nt) as pool:
    for i in range(reps + 1):        # the first copy faults dst's pages in
      t0 = time.perf_counter()
      list(pool.map(part, bounds))
      if i: times.append(time.perf_counter() - t0)
  assert dst[-1] == 1.5 and dst[0] == 1.5
  return 2 * nbytes / statistics.median(times) / 1e9


def machine_info() -> list[str]:
  model = "unknown"
  try:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
      if line.startswith("model name"):
        model = line.split(":", 1)[1].strip()
        break
  except OSError: pass
  try: clang = subprocess.run(["clang", "--version"], capture_output=True, text=True).stdout.splitlines()[0]
  except (OSError, IndexError): clang = "not found"
  try: blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
  except Exception: blas = {}
  def ver(p):
    try: return metadata.version(p)
    except metadata.PackageNotFoundError: return "not installed"
  import llvmlite.binding as llvm
  return [
    f"machine: {model}, {os.cpu_count()} cores ({platform.machine()}, {platform.system()} {platform.release()})",
    f"python {platform.python_version()}; numpy {np.__version__} (BLAS: {blas.get('name', '?')} {blas.get('version', '')}); "
    f"llvmlite {ver('llvmlite')} (LLVM {'.'.join(map(str, llvm.llvm_version_info))}); tinygrad {ver('tinygrad')} "
    f"(device {TGDevice.DEFAULT}); rulec {ver('rulec')}; {clang}",
    f"rulec device {RULEC_DEVICE}, {cpu_device.threads()} threads (RULEC_THREADS)",
  ]


def main():
  t_start = time.perf_counter()
  for line in machine_info(): print(line)
  if TGDevice.DEFAULT != "CPU": sys.exit(f"tinygrad picked device {TGDevice.DEFAULT}, not CPU")
  bw_start = copy_bandwidth()
  print(f"copy bandwidth at start: {bw_start:.1f} GB/s (np.copyto, 256 MiB float32, {os.cpu_count()} threads, read + write)")
  sys.stdout.flush()

  workloads = [w for w in WORKLOADS if not ARGS.only or any(s.lower() in w.name.lower() for s in ARGS.only)]
  failures: list[str] = []
  rows = []
  for seed, w in enumerate(workloads):
    t0 = time.perf_counter()
    inp = Inputs(w, seed)
    r = statistics.median(time_rulec(w, inp, failures))
    n = statistics.median(time_numpy(w, inp, failures))
    t = statistics.median(time_tinygrad(w, inp, failures))
    alloc = statistics.median(time_rulec(w, inp, failures, prefault=False)) if w.nbytes else None
    rows.append((w, r, n, t, alloc))
    print(f"  done {w.name}: rulec {r * 1e3:.2f} ms ({w.results['rulec kernels']} kernels), numpy {n * 1e3:.2f} ms, "
          f"tinygrad {t * 1e3:.2f} ms  [{time.perf_counter() - t0:.0f} s]")
    sys.stdout.flush()
    del inp

  bw_end = copy_bandwidth()
  bw = max(bw_start, bw_end)   # the machine's best: a noisy neighbour during one measurement must not flatter rulec
  print(f"copy bandwidth at end: {bw_end:.1f} GB/s; fractions below use {bw:.1f} GB/s (the higher)")
  rows = [(w, r, n, t, (w.nbytes or w.flops) / r / 1e9, (w.nbytes / r / 1e9 / bw) if w.nbytes else None, alloc)
          for w, r, n, t, alloc in rows]
  head = ["workload", "rulec ms", "numpy ms", "tinygrad ms", "rulec GB/s|GFLOP/s", "frac copy BW", "vs numpy",
          "vs tinygrad", "reps r/np/tg"]
  body = []
  for w, r, n, t, rate, frac, _ in rows:
    unit = "GB/s" if w.nbytes else "GFLOP/s"
    reps = "/".join(map(str, w.reps)) + (" (slow: 1 rep, compile-only warm-up)" if w.slow else "")
    body.append([w.name, fmt(r * 1e3), fmt(n * 1e3), fmt(t * 1e3), f"{fmt(rate, 1)} {unit}", fmt(frac),
                 fmt(n / r), fmt(t / r), reps])
  print()
  print_table(head, body)
  print()
  print("rulec with fresh output buffers allocated and first touched inside the timer (what realize() pays):")
  for w, r, n, t, rate, frac, alloc in rows:
    if alloc is not None:
      print(f"  {w.name:<22} {alloc * 1e3:8.2f} ms  ({w.nbytes / alloc / 1e9:.1f} GB/s, {w.nbytes / alloc / 1e9 / bw:.2f} of copy BW; "
            f"kernel-only {r * 1e3:.2f} ms)")
  print(f"total bench time {time.perf_counter() - t_start:.0f} s")
  if failures:
    print("RESULT CHECK FAILURES:")
    for f in failures: print("  " + f)

  compile_line = compile_times.summary(ARGS)
  by = {w.name: (r, n, t, frac) for w, r, n, t, rate, frac, _ in rows}
  ew16 = by.get("relu(a*b+c) 16M")
  mm = by.get("matmul 1024^3")
  geo = math.exp(statistics.fmean(math.log(t / r) for _, r, _, t, *_ in rows)) if rows else float("nan")
  print(f"elementwise_bw_fraction={ew16[3]:.3f}" if ew16 else "elementwise_bw_fraction=nan",
        f"matmul_vs_numpy={mm[1] / mm[0]:.4f}" if mm else "matmul_vs_numpy=nan",
        f"geomean_vs_tinygrad={geo:.3f}", compile_line)
  sys.stdout.flush()
  if failures: sys.exit(1)


if __name__ == "__main__":
  main()
