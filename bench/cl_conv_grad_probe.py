"""Action lists for a convolution's weight gradient on the CL device: the ResNet block's 3x3 conv (N64 C64 56x56,
bench/models.py) scheduled as rulec schedules it (a split of the batch into partial sums, then a small sum), its
first kernel timed on the device (profiling events, resident buffers, median) with the cost model's actions and
with register tiles over output channels, input channels and taps. Each forced list's result is checked against
the default's.

Run: python bench/cl_conv_grad_probe.py [batch] [action list ...]   (bench/h200.sh convprobe; the batch is split in
parts (32 of 64 on a GPU, 8 on a CPU): the axes below)
"""
from __future__ import annotations

import os
import sys

import numpy as np

from rulec.codegen.opt import format_actions, kernel_key, parse_actions
from rulec.codegen.opt.choose import cl_actions
from rulec.codegen.opt.transform import apply
from rulec.codegen.decomp import decomposed
from rulec.engine.tensor import Tensor
from rulec.runtime import cl_device

from cl_conv_probe import time_lists

# axes of the first kernel: 0 the batch's part, 1 output channel, 2 input channel, 3 and 4 the taps; sums 5 (batch
# within a part), 6 and 7 (rows, columns)
LISTS = [
  "UPCAST(1,4) UPCAST(2,4) LOCAL(2,16) LOCAL(1,8)",
  "UPCAST(1,4) UPCAST(2,4) LOCAL(2,16) LOCAL(1,4)",
  "UPCAST(1,8) UPCAST(2,4) LOCAL(2,16) LOCAL(1,4)",
  "UPCAST(1,4) UPCAST(2,8) LOCAL(2,8) LOCAL(1,8)",
  "UPCAST(1,8) UPCAST(2,8) LOCAL(2,8) LOCAL(1,8)",
  "UPCAST(1,4) UPCAST(4,3) LOCAL(2,32) LOCAL(1,4)",
  "UPCAST(1,4) UPCAST(2,2) UPCAST(4,3) LOCAL(2,32) LOCAL(1,4)",
  "UPCAST(1,4) UPCAST(2,4) UPCAST(4,3) LOCAL(2,16) LOCAL(1,4)",
  "UPCAST(1,2) UPCAST(2,2) UPCAST(3,3) UPCAST(4,3) LOCAL(2,32) LOCAL(1,8)",
  "UPCAST(4,3) UPCAST(3,3) LOCAL(2,64)",
  "UPCAST(1,4) LOCAL(2,64)",
]


def main():
  n = int(sys.argv[1]) if len(sys.argv) > 1 else 64
  lists = sys.argv[2:] or LISTS
  dev = cl_device.get_device()
  print(f"device: {dev.dev.name}; conv 3x3 weight gradient, N{n} C64 56x56")
  rng = np.random.default_rng(0)
  x = Tensor(rng.standard_normal((n, 64, 56, 56)).astype(np.float32), device="CL", requires_grad=True)
  w = Tensor(rng.standard_normal((64, 64, 3, 3)).astype(np.float32) * 0.1, device="CL", requires_grad=True)
  g = Tensor(rng.standard_normal((n, 64, 56, 56)).astype(np.float32), device="CL")
  (x.conv2d(w, padding=1) * g).sum().backward()
  kernels = w.grad.schedule()
  first = max(kernels, key=lambda k: np.prod([r.src[0].arg for r in k.ast.ranges]))   # (the partial sums)
  low = decomposed(first, dev.optional)
  key = kernel_key(low)
  os.environ.setdefault("RULEC_SEARCH", "5")   # (the timer's repetitions)
  want = w.grad.numpy()
  print(f"kernels: {[str(k) for k in kernels]}; first kernel key {key}")
  rows = [("cost model: " + format_actions(cl_actions(low, dev.target)), cl_actions(low, dev.target))]
  rows += [(text, parse_actions(text)) for text in lists]
  # the cost model's tile with a row's columns staged in blocks (STAGE on the innermost sum; images and rows stay loops
  # around the blocks)
  base = format_actions(cl_actions(low, dev.target))
  if not sys.argv[2:] and base:
    rows += [(f"{base} STAGE(7,{b})", parse_actions(f"{base} STAGE(7,{b})")) for b in (4, 7, 8, 14, 28)]
    rows += [(f"UPCAST(1,4) UPCAST(2,8) LOCAL(2,8) LOCAL(1,8) STAGE(7,{b})",
              parse_actions(f"UPCAST(1,4) UPCAST(2,8) LOCAL(2,8) LOCAL(1,8) STAGE(7,{b})")) for b in (8, 14)]
  def run():
    x.grad = w.grad = None
    (x.conv2d(w, padding=1) * g).sum().backward()
    return w.grad.numpy()
  time_lists(first, low, key, rows, run, want)

if __name__ == "__main__":
  main()
