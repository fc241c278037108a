"""The GPU optimizer's tunables swept on the CL device, each setting beside torch in the same run.

Run:  python bench/cl_sweep.py [--quick]     (bench/h200.sh sweep runs it on an H200)

For matmul 1024^3 and the conv2d workload: register tile (rows x columns per work-item) and work-group shape
(codegen/opt/choose.py GPU_TILES, GPU_LOCAL) and the block the reduction is staged in local memory in (GPU_STAGE,
STAGE; 0: none; for the convolution too, which the cost model does not stage until this has measured it). For relu(a*b+c) 16M: vector width (VECTOR) and the largest work-group the
runtime picks (cl_device.AUTO_LOCAL_MAX). For sum, softmax and layernorm: the largest group reduction. Device-side kernel times (profiling
events) of launches on resident buffers, rulec's and torch's (bench/cl_kernels.py), medians; every result is
checked against numpy as in bench/cl_kernels.py.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys

import cl_kernels as ck
from workloads import WORKLOADS, Inputs, print_table

from rulec.codegen.opt import choose
from rulec.runtime import cl_device


def run(w, reps=7):
  cl_device._by_ast.clear()
  failures: list[str] = []
  inp = Inputs(w, 0)
  ck.time_rulec(w, inp, failures, reps)
  return w.results["resident"], failures   # (on resident buffers, as bench/cl_kernels.py's bandwidth fractions)


def torch_ms(w, reps=7):
  if ck.TORCH is None: return float("nan")
  ck.time_torch(w, Inputs(w, 0), [], reps)
  return w.results["torch_resident"]


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--quick", action="store_true")
  ap.add_argument("--scale", type=int, default=1)
  ap.add_argument("--only", default="", help="run only the sections whose workload name contains this (matmul, conv2d, relu, ...)")
  args = ap.parse_args()
  if ck.TORCH is not None: ck.TORCH.backends.cuda.matmul.allow_tf32 = ck.TORCH.backends.cudnn.allow_tf32 = False
  for line in ck.machine_info(): print(line)
  dev = cl_device.get_device()
  byname = {w.name.split(" /")[0]: ck.scaled(w, args.scale) for w in WORKLOADS}
  rows = []
  tiles = [(4, 4), (8, 4), (4, 8), (8, 8), (2, 4)] if not args.quick else [(4, 4), (8, 8)]
  locals_ = [(16, 16), (8, 16), (16, 8), (8, 8), (4, 32)] if not args.quick else [(8, 16), (4, 32)]
  default = choose.GPU_TILES, choose.GPU_LOCAL, choose.GPU_STAGE, choose.GPU_STAGE_SEVERAL
  choose.GPU_STAGE_SEVERAL = True   # (a convolution's blocks too: the sweep is where they get measured)
  want = lambda name: args.only in name
  for name in filter(want, ("matmul 1024^3", "linear 1024^3 x @ W.T", "conv2d 32x32x56x56 k3 ->64")):
    w = byname[name]
    t = torch_ms(w)
    # (a convolution's block holds its window taps too: smaller blocks; the cost model halves one that does not fit)
    stages = (0, 4, 8, 16) if name.startswith("conv") else (0, 8, 16, 32)
    for stage in (stages if not args.quick else stages[:1] + stages[2:3]):
      for tile in tiles:
        for loc in locals_:
          choose.GPU_TILES, choose.GPU_LOCAL, choose.GPU_STAGE = (tile,), loc, stage
          ms, fails = run(dataclasses.replace(w, results={}))
          rows.append([name, f"tile {tile[0]}x{tile[1]} local {loc[0]}x{loc[1]} stage {stage}", f"{ms:.3f}", f"{t:.3f}",
                       f"{t / ms:.2f}", "FAIL" if fails else "ok"])
          print("  ", rows[-1]); sys.stdout.flush()
  choose.GPU_TILES, choose.GPU_LOCAL, choose.GPU_STAGE, choose.GPU_STAGE_SEVERAL = default
  import attrs
  base = dev.target
  w = byname["relu(a*b+c) 16M"]
  t = torch_ms(w, 20) if want(w.name) else 0.0
  for v in ((4, 8) if want(w.name) else ()):
    for lm in (128, 256, 512, 1024):
      dev.target = attrs.evolve(base, vector=v)
      cl_device.AUTO_LOCAL_MAX = lm
      ms, fails = run(dataclasses.replace(w, results={}), 20)
      rows.append([w.name, f"VECTOR({v}) work-groups <= {lm}", f"{ms:.3f}", f"{t:.3f}", f"{t / ms:.2f}", "FAIL" if fails else "ok"])
      print("  ", rows[-1]); sys.stdout.flush()
  cl_device.AUTO_LOCAL_MAX = 1024
  dev.target = base
  for name in filter(want, ("sum 16M", "softmax 4096x1024", "layernorm 4096x1024")):
    w = byname[name]
    t = torch_ms(w, 20)
    for g in (128, 256, 512, 1024):
      dev.target = attrs.evolve(base, group=min(g, dev.max_work_group))
      ms, fails = run(dataclasses.replace(w, results={}), 20)
      rows.append([w.name, f"group reductions <= {g}", f"{ms:.3f}", f"{t:.3f}", f"{t / ms:.2f}", "FAIL" if fails else "ok"])
      print("  ", rows[-1]); sys.stdout.flush()
  dev.target = base
  print()
  print_table(["workload", "setting", "rulec kernel ms", "torch kernel ms", "vs torch", "check"], rows)


if __name__ == "__main__":
  main()
