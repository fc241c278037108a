"""Scheduling: kernels and scheduling time, rulec against tinygrad 0.14, same programs, same run.

Each program is built fresh for every repetition in both front ends (inputs
are buffers: rulec tensors made from numpy arrays, tinygrad `Tensor.empty`), then scheduled without running: rulec `Tensor.schedule`,
tinygrad `linear_with_vars` with its schedule cache cleared, so both do the
real work every time. Medians of REPEATS runs after a warm-up.

Needs `pip install '.[bench]'` (tinygrad==0.14.0) and Debian's `clang`
(tinygrad's CPU device looks for it when it starts). Run: python bench/schedule.py
"""
from __future__ import annotations

import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("DEV", "CPU")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import tinygrad  # noqa: E402
import tinygrad.schedule as tg_schedule  # noqa: E402
from tinygrad import Tensor as TT  # noqa: E402

from engine.tensor import Tensor as RT  # noqa: E402

REPEATS = 7


def mlp(T, make):
  x, w1, b1, w2, b2 = make(64, 784), make(784, 256), make(256), make(256, 10), make(10)
  return ((x @ w1 + b1).relu() @ w2 + b2,)


def conv_block(T, make):
  x, w, b = make(8, 3, 32, 32), make(16, 3, 3, 3), make(16)
  return (x.conv2d(w, b, padding=1).relu().max_pool2d(2),)


def attention(T, make):
  seq, dim, heads = 128, 256, 4
  hd = dim // heads
  x, wq, wk, wv, wo = make(seq, dim), make(dim, dim), make(dim, dim), make(dim, dim), make(dim, dim)
  q = (x @ wq).reshape(seq, heads, hd).permute(1, 0, 2)
  k = (x @ wk).reshape(seq, heads, hd).permute(1, 0, 2)
  v = (x @ wv).reshape(seq, heads, hd).permute(1, 0, 2)
  att = (q @ k.permute(0, 2, 1) * (1 / math.sqrt(hd))).softmax(-1)
  y = (att @ v).permute(1, 0, 2).reshape(seq, dim) @ wo
  return ((x + y).layernorm(),)


def softmax(T, make): return (make(1024, 1024).softmax(-1),)
def layernorm(T, make): return (make(1024, 1024).layernorm(),)


PROGRAMS = {"MLP 64x784-256-10": mlp, "conv block 8x3x32x32": conv_block, "attention 128x256x4": attention,
            "softmax 1024x1024": softmax, "layernorm 1024x1024": layernorm}


def rulec_run(prog):
  # inputs are real buffers (Tensor.zeros would be a constant the scheduler folds away)
  outs = prog(RT, lambda *s: RT(np.zeros(s, dtype=np.float32)))
  t0 = time.perf_counter()
  kernels = RT.schedule(*outs)
  return time.perf_counter() - t0, len(kernels)


def tinygrad_run(prog):
  outs = prog(TT, lambda *s: TT.empty(*s))
  tg_schedule.schedule_cache.clear()
  t0 = time.perf_counter()
  linear, _ = TT.linear_with_vars(*outs)
  dt = time.perf_counter() - t0
  return dt, sum(1 for call in linear.src if call.src[0].op.name == "SINK")


def machine() -> str:
  return (f"machine: {platform.processor() or platform.machine()} ({platform.system()} {platform.release()}), "
          f"{os.cpu_count()} CPUs, Python {platform.python_version()}, tinygrad {tinygrad.__version__ if hasattr(tinygrad, '__version__') else '0.14'}")


def main():
  rows = []
  for name, prog in PROGRAMS.items():
    rulec_run(prog), tinygrad_run(prog)   # warm-up: matcher compilation, imports
    r = [rulec_run(prog) for _ in range(REPEATS)]
    t = [tinygrad_run(prog) for _ in range(REPEATS)]
    rows.append((name, statistics.median(x[0] for x in r), r[0][1], statistics.median(x[0] for x in t), t[0][1]))
  print(machine())
  print(f"scheduling only (no compile, no run), median of {REPEATS} fresh graphs; tinygrad schedule cache cleared each time")
  head = f"{'program':<24} {'rulec ms':>9} {'tinygrad ms':>12} {'speedup':>8} {'rulec kernels':>14} {'tinygrad kernels':>17}"
  print(head)
  print("-" * len(head))
  for name, rt, rk, tt, tk in rows:
    print(f"{name:<24} {rt * 1e3:>9.2f} {tt * 1e3:>12.2f} {tt / rt:>8.2f} {rk:>14} {tk:>17}")
  speed = math.exp(statistics.fmean(math.log(tt / rt) for _, rt, _, tt, _ in rows))
  kern = math.exp(statistics.fmean(math.log(rk / tk) for _, _, rk, _, tk in rows))
  print(f"schedule_speedup_vs_tinygrad={speed:.2f} kernels_vs_tinygrad={kern:.2f}")


if __name__ == "__main__":
  main()
