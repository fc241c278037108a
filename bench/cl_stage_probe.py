"""STAGE block choices for sums no power of two divides, on the CL device: a divisor's blocks against ragged blocks
of 16 (the steps after the last whole block a reduction of their own), and the work-group's column side for prime
sizes (a divisor, 11 for 1009's 253 column tiles, against a ragged 16). Device-side kernel times on resident buffers
(bench/cl_kernels.py's harness), medians, beside torch.

Run: python bench/cl_stage_probe.py [scale]   (bench/h200.sh stageprobe)
"""
from __future__ import annotations

import sys

import cl_kernels as ck
from workloads import Inputs, Workload, print_table

from rulec.codegen.opt import kernel_key
from rulec.engine.tensor import Tensor
from rulec.runtime import cl_device
from rulec.codegen.decomp import decomposed

# (m, k, n, x @ W.T?, [action lists]); axes: 0 rows, 1 columns, 2 the sum
CASES = [
  (1024, 1023, 1024, True, ["UPCAST(0,8) UPCAST(1,4) LOCAL(1,16) LOCAL(0,8) STAGE(2,11)",
                            "UPCAST(0,8) UPCAST(1,4) LOCAL(1,16) LOCAL(0,8) STAGE(2,16)",
                            "UPCAST(0,8) UPCAST(1,4) LOCAL(1,16) LOCAL(0,8) STAGE(2,31)"]),
  (1024, 1000, 1024, True, ["UPCAST(0,8) UPCAST(1,4) LOCAL(1,16) LOCAL(0,8) STAGE(2,8)",
                            "UPCAST(0,8) UPCAST(1,4) LOCAL(1,16) LOCAL(0,8) STAGE(2,16)"]),
  (1000, 1000, 1000, False, ["UPCAST(0,8) UPCAST(1,4) LOCAL(1,10) LOCAL(0,5) STAGE(2,8)",
                             "UPCAST(0,8) UPCAST(1,4) LOCAL(1,16) LOCAL(0,8) STAGE(2,8)",
                             "UPCAST(0,8) UPCAST(1,4) LOCAL(1,16) LOCAL(0,8) STAGE(2,16)"]),
  (1000, 781, 500, True, ["UPCAST(0,4) UPCAST(1,4) LOCAL(1,16) LOCAL(0,8) STAGE(2,16)",
                          "UPCAST(0,4) UPCAST(1,4) LOCAL(1,16) LOCAL(0,5) STAGE(2,11)",
                          "UPCAST(0,4) UPCAST(1,4) LOCAL(1,16) LOCAL(0,5) STAGE(2,16)"]),
  (1009, 1009, 1009, False, ["UPCAST(0,8) UPCAST(1,4) LOCAL(1,11) LOCAL(0,8) STAGE(2,16)",
                             "UPCAST(0,8) UPCAST(1,4) LOCAL(1,16) LOCAL(0,8) STAGE(2,16)",
                             "UPCAST(0,4) UPCAST(1,4) LOCAL(1,16) LOCAL(0,8) STAGE(2,16)"]),
  (2048, 4099, 512, True, ["UPCAST(0,8) UPCAST(1,4) LOCAL(1,16) LOCAL(0,8) STAGE(2,16)",
                           "UPCAST(0,4) UPCAST(1,4) LOCAL(1,16) LOCAL(0,8) STAGE(2,16)"]),
]


def main():
  scale = int(sys.argv[1]) if len(sys.argv) > 1 else 1
  if ck.TORCH is not None: ck.TORCH.backends.cuda.matmul.allow_tf32 = False
  for line in ck.machine_info(): print(line)
  dev = cl_device.get_device()
  rows = []
  for m, k, n, transposed, lists in CASES:
    m, n = max(16, m // scale), max(16, n // scale)
    fn = (lambda a, b: a @ b.T) if transposed else (lambda a, b: a @ b)
    w = Workload(f"{'x @ W.T' if transposed else 'a @ b'} {m}x{k}x{n}", [(m, k), (n, k) if transposed else (k, n)],
                 fn, fn, fn, torch=fn, flops=2 * m * k * n, rtol=1e-3, atol=1e-3)
    inp = Inputs(w, 0)
    b = Tensor(inp.sets[0][1], device="CL")
    (kern,) = fn(Tensor(inp.sets[0][0], device="CL"), b).schedule()
    key = kernel_key(decomposed(kern, dev.optional))
    t = float("nan")
    if ck.TORCH is not None:
      ck.time_torch(w, inp, [], 7)
      t = w.results["torch_resident"]
    for acts in lists:
      import os
      os.environ["RULEC_OPT"] = f"{key}={acts}"
      cl_device._by_ast.clear()
      failures: list[str] = []
      try: ck.time_rulec(w, inp, failures, 7)
      except Exception as e:   # an action list that does not apply at this scale
        rows.append([w.name, acts, f"refused: {str(e)[:60]}", "", "", ""])
        continue
      r = w.results["resident"]
      rows.append([w.name, acts, f"{r:.3f}", f"{t:.3f}", f"{t / r:.2f}", "FAIL" if failures else "ok"])
      print("  ", rows[-1]); sys.stdout.flush()
    os.environ.pop("RULEC_OPT", None)
  print()
  print_table(["workload", "actions", "rulec kernel ms (resident)", "torch ms (resident)", "vs torch", "check"], rows)


if __name__ == "__main__":
  main()
