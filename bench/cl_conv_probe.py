"""Action lists for the ResNet block's 3x3 convolutions on the CL device (N64 C64 56x56, padding 1, bench/models.py):
the forward convolution (`fwd`), the input gradient (`dx`, the convolution of the output's gradient by the flipped
weights) or the weight gradient (`dw`), its costliest reduction (the most work) timed on the device (profiling events, resident buffers, median of RULEC_SEARCH
launches) with the cost model's actions and with the lists given or listed below; each list's result is checked
against the cost model's. The weight gradient has its own probe, bench/cl_conv_grad_probe.py.

Run: python bench/cl_conv_probe.py fwd|dx|dw [batch] [action list ...]   (bench/h200.sh convfwd ...)
Axes of the direct fwd and dx kernels: 0 image, 1 output channel, 2 row, 3 column; sums 4 and 5 (the taps) and 6
(channels in). With RULEC_WINOGRAD=1 the costliest kernel is Winograd's batched matmul (engine/tensor/winograd.py).
"""
from __future__ import annotations

import math
import os
import sys

import numpy as np

from rulec.codegen.decomp import decomposed
from rulec.codegen.opt import format_actions, kernel_key, parse_actions
from rulec.codegen.opt.choose import cl_actions
from rulec.codegen.opt.transform import apply
from rulec.engine.tensor import Tensor
from rulec.runtime import cl_device

BASE = "UPCAST(1,8) UPCAST(3,8) LOCAL(3,7) LOCAL(1,8)"   # (the cost model's tile without STAGE, session 24)
LISTS = [
  f"{BASE} STAGE(6,32)",
  f"{BASE} LOCAL(2,2)",
  f"{BASE} LOCAL(2,4)",
  "UPCAST(1,8) UPCAST(3,4) LOCAL(3,14) LOCAL(1,8)",
  "UPCAST(1,8) UPCAST(3,4) LOCAL(3,14) LOCAL(1,8) LOCAL(2,2)",
  "UPCAST(1,4) UPCAST(3,8) LOCAL(3,7) LOCAL(1,16)",
  "UPCAST(1,8) UPCAST(2,2) UPCAST(3,4) LOCAL(3,14) LOCAL(1,8)",
  "UPCAST(1,8) UPCAST(2,2) UPCAST(3,8) LOCAL(3,7) LOCAL(1,8)",
  "UPCAST(1,16) UPCAST(3,4) LOCAL(3,14) LOCAL(1,4)",
]


def program(which: str, x: Tensor, w: Tensor, g: Tensor) -> Tensor:
  if which == "fwd": return x.conv2d(w, padding=1)
  (grad,) = x.conv2d(w, padding=1).gradient(x if which == "dx" else w, gradient=g)
  return grad


def work(kernel) -> int:
  """A kernel's loop trips: the product of its ranges' sizes."""
  return math.prod(r.src[0].arg for r in kernel.ast.ranges)


def main():
  which = sys.argv[1] if len(sys.argv) > 1 else "fwd"
  n = int(sys.argv[2]) if len(sys.argv) > 2 else 64
  lists = sys.argv[3:] or LISTS
  dev = cl_device.get_device()
  print(f"device: {dev.dev.name}; conv 3x3 {which}, N{n} C64 56x56; RULEC_CL_GUARD={os.environ.get('RULEC_CL_GUARD', '')}")
  rng = np.random.default_rng(0)
  x = Tensor(rng.standard_normal((n, 64, 56, 56)).astype(np.float32), device="CL", requires_grad=which == "dw")
  w = Tensor(rng.standard_normal((64, 64, 3, 3)).astype(np.float32) * 0.1, device="CL", requires_grad=which == "dw")
  g = Tensor(rng.standard_normal((n, 64, 56, 56)).astype(np.float32), device="CL")
  kernels = program(which, x, w, g).schedule()
  big = max(kernels, key=work)
  low = decomposed(big, dev.optional)
  key = kernel_key(low)
  os.environ.setdefault("RULEC_SEARCH", "5")   # (the timer's repetitions)
  want = program(which, x, w, g).numpy()
  flops = 2 * n * 64 * 56 * 56 * 64 * 9
  print(f"kernels: {[str(k) for k in kernels]}; key {key}")
  base = cl_actions(low, dev.target)
  rows = [("cost model: " + format_actions(base), base)] + [(text, parse_actions(text)) for text in [BASE] + lists]
  time_lists(big, low, key, rows, lambda: program(which, x, w, g).numpy(), want, flops)


def time_lists(kernel, low, key: str, rows, run, want, flops: float | None = None) -> None:
  """Each (name, actions) of rows timed on the device as `kernel`'s form (`low` with the actions applied), then
  forced through RULEC_OPT for `key` while run() computes the program again, its max difference from `want` printed
  (a list that does not apply, or that the device cannot build, is reported as refused). Shared with
  bench/cl_conv_grad_probe.py."""
  dev = cl_device.get_device()
  for name, acts in rows:
    try:
      t = cl_device._time_candidate(kernel, apply(low, tuple(acts), "CL"), dev.target, dev)
    except Exception as e:   # a list that does not apply, or that the device cannot build
      print(f"  {name:75s} refused: {type(e).__name__}: {str(e)[:80]}")
      continue
    os.environ["RULEC_OPT"] = f"{key}={format_actions(acts)}"
    cl_device._by_ast.clear()
    try: err = float(np.abs(run() - want).max())
    finally: os.environ.pop("RULEC_OPT")
    rate = f" {flops / t * 1e-12:6.1f} TFLOP/s" if flops else ""
    print(f"  {name:75s} {t * 1e3:8.3f} ms{rate}  max diff {err:.1e}")
    sys.stdout.flush()

if __name__ == "__main__":
  main()
