"""x @ W.T (nn.Linear's product) on the CL device for sums of several lengths, beside torch: the lengths no power of
two divides take STAGE blocks of a divisor (codegen/opt/choose.py gpu_tile); before, they got no tile and read W's
rows across the lanes. Device-side kernel times on resident buffers (bench/cl_kernels.py's harness), medians.

Run: python bench/cl_linear_probe.py [scale]   (bench/h200.sh linprobe)
"""
from __future__ import annotations

import sys

import cl_kernels as ck
from workloads import Inputs, Workload, print_table

from codegen.opt import choose, format_actions
from runtime import cl_device
from runtime.kernel import decomposed


def main():
  scale = int(sys.argv[1]) if len(sys.argv) > 1 else 1   # (rows of x and of W divided by this: a quick check on PoCL)
  if ck.TORCH is not None: ck.TORCH.backends.cuda.matmul.allow_tf32 = False
  for line in ck.machine_info(): print(line)
  dev = cl_device.get_device()
  rows = []
  for m, k, n in ((1024, 1024, 1024), (1024, 1023, 1024), (1024, 1000, 1024), (1000, 781, 500), (2048, 4099, 512)):
    m, n = max(8, m // scale), max(8, n // scale)
    w = Workload(f"x @ W.T {m}x{k} @ ({n}x{k}).T", [(m, k), (n, k)], lambda a, b: a @ b.T, lambda a, b: a @ b.T,
                 lambda a, b: a @ b.T, torch=lambda a, b: a @ b.T, flops=2 * m * k * n, rtol=1e-3, atol=1e-3)
    failures: list[str] = []
    inp = Inputs(w, 0)
    ck.time_rulec(w, inp, failures, 7)
    t = float("nan")
    if ck.TORCH is not None:
      ck.time_torch(w, inp, [], 7)
      t = w.results["torch_resident"]
    from engine.tensor import Tensor
    (kern,) = (Tensor(inp.sets[0][0], device="CL") @ Tensor(inp.sets[0][1], device="CL").T).schedule()
    acts = format_actions(choose.cl_actions(decomposed(kern, dev.optional), dev.target))
    r = w.results["resident"]
    rows.append([w.name, acts, f"{r:.3f}", f"{t:.3f}", f"{t / r:.2f}", "FAIL" if failures else "ok"])
    print("  ", rows[-1]); sys.stdout.flush()
    cl_device._by_ast.clear()
  print()
  print_table(["workload", "actions", "rulec kernel ms (resident)", "torch ms (resident)", "vs torch", "check"], rows)


if __name__ == "__main__":
  main()
