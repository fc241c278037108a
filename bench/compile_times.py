"""Compile time of each workload, cold and warm, rulec next to tinygrad (bench/kernels.py prints the table).

  cold  a new process with empty caches: rulec's RULEC_CACHE_DIR (its rule matchers and compiled kernels),
        tinygrad's CACHEDB, and PoCL's POCL_CACHE_DIR for an OpenCL device
  warm  a second new process with the caches the first one left

What is timed, in each process, per workload (milliseconds of wall time):
  rulec     `compile_kernel` on each of the workload's kernels (from `rulec.engine.sched.driver.schedule`, outside the
            timer): validation, the decomposition rules, rendering, and LLVM (CPU) or the OpenCL compiler, or
            their loading from the disk cache; the device counters tell built from loaded
  tinygrad  `tinygrad.engine.realize.lower_and_compile` during the workload's first realize (inputs realized
            before): its lowering, code generation and compiler (clang, OpenCL), or its disk cache
Each process first runs a small program of its own, so that process start-up (LLVM, the OpenCL platform, the rule
matchers, tinygrad's devices) is not counted as any workload's compile time.

Run on its own:  python bench/compile_times.py [--device CPU|CL] [--only NAME ...] [--scale N]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def _workloads(device: str, only, scale: int):
  sys.path.insert(0, str(HERE))
  from workloads import WORKLOADS
  ws = [w for w in WORKLOADS if not only or any(s.lower() in w.name.lower() for s in only)]
  if device == "CL" and scale != 1:
    from workloads import scaled
    ws = [scaled(w, scale) for w in ws]
  return ws


def _opencl_loader() -> str | None:
  """The OpenCL loader pyopencl loaded (its wheel bundles one): tinygrad's CL device is pointed at the same."""
  try:
    with open("/proc/self/maps") as f: paths = [line.split()[-1] for line in f if "libOpenCL" in line and "/" in line]
  except OSError: return None
  return paths[0] if paths else None


def child_rulec(device: str, only, scale: int) -> dict:
  import numpy as np
  sys.path.insert(0, str(REPO))
  from rulec.engine.sched.driver import schedule
  from rulec.engine.tensor import Tensor
  dev = __import__("rulec.runtime.cpu_device" if device == "CPU" else "rulec.runtime.cl_device", fromlist=["x"])
  (Tensor(np.ones(5, np.float32), device=device) * 2 + 1).sum().numpy()   # start-up, not timed
  out = {}
  for w in _workloads(device, only, scale):
    ts = [Tensor(np.zeros(s, np.float32), device=device) for s in w.shapes]
    kernels, _ = schedule([w.rulec(*ts).uop], device)
    c0 = dict(dev.COUNTERS)
    t0 = time.perf_counter()
    for k in kernels: dev.compile_kernel(k)
    out[w.name] = {"ms": (time.perf_counter() - t0) * 1e3, "kernels": len(kernels),
                   "built": dev.COUNTERS["compiled"] - c0["compiled"], "loaded": dev.COUNTERS["loaded"] - c0["loaded"]}
  if device == "CL":   # all of them, not only what fits in the exit budget (timed apart: rulec does it at exit)
    t0 = time.perf_counter()
    dev.save_binaries()
    out["_save_binaries_ms"] = (time.perf_counter() - t0) * 1e3
  return out


def child_tinygrad(device: str, only, scale: int) -> dict:
  import numpy as np
  if device == "CL":
    import pyopencl  # noqa: F401  (sets up the platform the loader below finds)
    loader = _opencl_loader()
    if loader: os.environ.setdefault("OPENCL_PATH", loader)
  os.environ["DEV"] = device
  from tinygrad import Tensor
  from tinygrad.engine import realize
  spent = [0.0]
  inner = realize.lower_and_compile
  def timed(linear):
    t0 = time.perf_counter()
    try: return inner(linear)
    finally: spent[0] += time.perf_counter() - t0
  realize.lower_and_compile = timed
  (Tensor(np.ones(5, np.float32)) * 2 + 1).sum().realize()   # start-up, not timed
  out = {}
  for w in _workloads(device, only, scale):
    ts = [Tensor(np.zeros(s, np.float32)).realize() for s in w.shapes]
    spent[0] = 0.0
    w.tinygrad(*ts).realize()
    out[w.name] = {"ms": spent[0] * 1e3}
  return out


def _run_child(which: str, device: str, only, scale: int, env: dict) -> dict | str:
  cmd = [sys.executable, str(Path(__file__).resolve()), "--child", which, "--device", device, "--scale", str(scale)]
  if only: cmd += ["--only", *only]
  p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env}, timeout=1800)
  if p.returncode != 0: return f"failed ({(p.stderr.strip().splitlines() or ['?'])[-1][:120]})"
  return json.loads(p.stdout.strip().splitlines()[-1])


def measure(device: str = "CPU", only=None, scale: int = 1) -> dict:
  """{framework: {"cold": per-workload results, "warm": ...}} (or an error string in place of a framework's)."""
  res: dict = {}
  with tempfile.TemporaryDirectory(prefix="rulec-bench-compile-") as d:
    for which in ("rulec", "tinygrad"):
      env = {"RULEC_CACHE_DIR": f"{d}/{which}-rulec", "CACHEDB": f"{d}/{which}-tinygrad.db", "POCL_CACHE_DIR": f"{d}/{which}-pocl",
             "PYTHONPATH": os.pathsep.join([str(REPO)] + [p for p in [os.environ.get("PYTHONPATH")] if p])}
      env.pop("RULEC_KERNEL_CACHE", None)
      res[which] = {phase: _run_child(which, device, only, scale, env) for phase in ("cold", "warm")}
  return res


def table(res: dict) -> tuple[list[str], list[list[str]], dict]:
  """The table bench/kernels.py prints, and the totals for its summary line."""
  from workloads import fmt
  r, t = res["rulec"], res["tinygrad"]
  names = [n for n in r["cold"] if not n.startswith("_")] if isinstance(r["cold"], dict) else []
  def ms(side, phase, name):
    v = side[phase]
    return v[name]["ms"] if isinstance(v, dict) and name in v else None
  head = ["workload", "rulec cold ms", "rulec warm ms", "warm: built/loaded", "tinygrad cold ms", "tinygrad warm ms",
          "cold vs tinygrad", "warm vs tinygrad"]
  body, tot = [], {"rc": 0.0, "rw": 0.0, "tc": 0.0, "tw": 0.0, "built": 0}
  for n in names + ["total"]:
    if n == "total":
      vals = [tot["rc"], tot["rw"], tot["tc"] or None, tot["tw"] or None]
      bl = f"{tot['built']} built"
    else:
      vals = [ms(r, "cold", n), ms(r, "warm", n), ms(t, "cold", n), ms(t, "warm", n)]
      warm = r["warm"].get(n, {}) if isinstance(r["warm"], dict) else {}
      bl = f"{warm.get('built', '?')}/{warm.get('loaded', '?')}"
      for key, v in zip(("rc", "rw", "tc", "tw"), vals): tot[key] += v or 0.0
      tot["built"] += warm.get("built", 0)
    rc, rw, tc, tw = vals
    ratio = lambda a, b: fmt(a / b) if a is not None and b else "-"
    body.append([n, fmt(rc), fmt(rw, 3), bl, fmt(tc), fmt(tw), ratio(tc, rc), ratio(tw, rw)])
  notes = [f"{which} {phase}: {v}" for which, side in res.items() for phase, v in side.items() if not isinstance(v, dict)]
  save = r["cold"].get("_save_binaries_ms") if isinstance(r["cold"], dict) else None
  if save is not None:   # tinygrad's CL compile includes fetching the binary it caches; rulec's fetch waits for exit
    notes.append(f"rulec cold on CL: {fmt(save)} ms more, at exit, fetching and writing the binaries (not in the columns)")
  tot["notes"] = notes
  return head, body, tot


def summary(args) -> str:
  """Print the cold / warm compile-time table (bench/kernels.py and cl_kernels.py); their summary line's part."""
  from workloads import print_table
  if getattr(args, "skip_compile", False): return "compile_cold_vs_tinygrad=nan compile_warm_ms=nan"
  print()
  print(f"compile time, ms (new processes; cold: empty caches, warm: the caches the cold one left; device {args.device}):")
  t0 = time.perf_counter()
  head, body, tot = table(measure(args.device, args.only, args.scale))
  print_table(head, body)
  for note in tot["notes"]: print(f"  ({note})")
  print(f"  [{time.perf_counter() - t0:.0f} s]")
  sys.stdout.flush()
  ratio = tot["tc"] / tot["rc"] if tot["rc"] and tot["tc"] else float("nan")
  return f"compile_cold_vs_tinygrad={ratio:.3f} compile_warm_ms={tot['rw']:.2f}"


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--device", default="CPU", type=str.upper, choices=["CPU", "CL"])
  p.add_argument("--only", nargs="*", default=None)
  p.add_argument("--scale", type=int, default=1)
  p.add_argument("--child", choices=["rulec", "tinygrad"], help=argparse.SUPPRESS)
  p.set_defaults(skip_compile=False)
  a = p.parse_args(argv)
  if a.child:
    out = (child_rulec if a.child == "rulec" else child_tinygrad)(a.device, a.only, a.scale)
    print(json.dumps(out))
    return
  sys.path.insert(0, str(HERE))
  summary(a)


if __name__ == "__main__":
  main()
