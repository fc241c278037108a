"""x @ W.T (nn.Linear's product) and a @ b on the CL device for sums of several lengths and prime sizes, beside
torch: the lengths no power of two divides take STAGE blocks of a divisor (codegen/opt/choose.py gpu_tile), those
with no divisor from 4 (4099) ragged blocks of 16, and prime rows and columns (1009) ragged tiles and work-groups. Device-side kernel times on resident buffers (bench/cl_kernels.py's harness), medians.

Run: python bench/cl_linear_probe.py [scale]   (bench/h200.sh linprobe)
"""
from __future__ import annotations

import sys

import cl_kernels as ck
from workloads import Inputs, Workload, print_table

from rulec.codegen.opt import choose, format_actions
from rulec.runtime import cl_device
from rulec.codegen.decomp import decomposed


def main():
  scale = int(sys.argv[1]) if len(sys.argv) > 1 else 1   # (rows of x and of W divided by this: a quick check on PoCL)
  if ck.TORCH is not None: ck.TORCH.backends.cuda.matmul.allow_tf32 = False
  for line in ck.machine_info(): print(line)
  dev = cl_device.get_device()
  rows = []
  shapes = [(1024, 1024, 1024, True), (1024, 1023, 1024, True), (1024, 1000, 1024, True), (1000, 781, 500, True),
            (2048, 4099, 512, True), (1009, 1009, 1009, True), (1009, 1009, 1009, False), (1024, 1024, 1024, False),
            (1018, 1024, 1024, False), (512, 4099, 512, False)]
  for m, k, n, transposed in shapes:
    m, n = max(8, m // scale), max(8, n // scale)
    if transposed:
      w = Workload(f"x @ W.T {m}x{k} @ ({n}x{k}).T", [(m, k), (n, k)], lambda a, b: a @ b.T, lambda a, b: a @ b.T,
                   lambda a, b: a @ b.T, torch=lambda a, b: a @ b.T, flops=2 * m * k * n, rtol=1e-3, atol=1e-3)
    else:
      w = Workload(f"a @ b {m}x{k} @ {k}x{n}", [(m, k), (k, n)], lambda a, b: a @ b, lambda a, b: a @ b,
                   lambda a, b: a @ b, torch=lambda a, b: a @ b, flops=2 * m * k * n, rtol=1e-3, atol=1e-3)
    failures: list[str] = []
    inp = Inputs(w, 0)
    ck.time_rulec(w, inp, failures, 7)
    t = float("nan")
    if ck.TORCH is not None:
      ck.time_torch(w, inp, [], 7)
      t = w.results["torch_resident"]
    from rulec.engine.tensor import Tensor
    b = Tensor(inp.sets[0][1], device="CL")
    (kern,) = (Tensor(inp.sets[0][0], device="CL") @ (b.T if transposed else b)).schedule()
    low = decomposed(kern, dev.optional)
    acts = format_actions(choose.cl_actions(low, dev.target))
    r = w.results["resident"]
    # the same without ragged tiles, work-groups and STAGE blocks (choose.GPU_RAGGED), where that chooses otherwise
    choose.GPU_RAGGED = False
    before, old_acts = "", format_actions(choose.cl_actions(low, dev.target))
    if old_acts != acts:
      cl_device._by_ast.clear()
      ck.time_rulec(w, inp, failures, 3)
      before = f"{w.results['resident']:.3f} ({old_acts})"
    choose.GPU_RAGGED = True
    rows.append([w.name, acts, f"{r:.3f}", f"{t:.3f}", f"{t / r:.2f}", before, "FAIL" if failures else "ok"])
    print("  ", rows[-1]); sys.stdout.flush()
    cl_device._by_ast.clear()
  print()
  print_table(["workload", "actions", "rulec kernel ms (resident)", "torch ms (resident)", "vs torch",
               "without ragged: ms (actions)", "check"], rows)


if __name__ == "__main__":
  main()
