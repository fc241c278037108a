"""The workloads bench/kernels.py times, shared by its CPU and CL runs: inputs, numpy references, checks.

Each workload has the same program written for rulec, numpy, tinygrad and torch
(torch's is used on GPU machines). Inputs are float32 standard normals; two sets
are pre-generated and alternate, so a framework that kept stale inputs fails the
check. Every result is compared with numpy's (np.allclose, float32 tolerances;
reductions may reassociate, so sums get a tolerance relative to sum(|x|)).
"""
from __future__ import annotations

import math
import dataclasses
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

M1, M16 = 1 << 20, 1 << 24


def np_softmax(x):
  e = np.exp(x - x.max(axis=-1, keepdims=True))
  return e / e.sum(axis=-1, keepdims=True)


def np_log_softmax(x):
  d = x - x.max(axis=-1, keepdims=True)
  return d - np.log(np.exp(d).sum(axis=-1, keepdims=True))


def np_layernorm(x, eps=1e-5):
  d = x - x.mean(axis=-1, keepdims=True)
  return d / np.sqrt((d * d).mean(axis=-1, keepdims=True) + eps)


def np_conv2d(x, w):
  xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
  win = sliding_window_view(xp, w.shape[2:], axis=(2, 3))              # (N, C, H, W, kh, kw), a view
  return np.ascontiguousarray(np.tensordot(win, w, axes=([1, 4, 5], [1, 2, 3])).transpose(0, 3, 1, 2))


def tg_layernorm(x, eps=1e-5):
  d = x - x.mean(axis=-1, keepdim=True)
  return d * (d.square().mean(axis=-1, keepdim=True) + eps).rsqrt()


def torch_layernorm(x, eps=1e-5):
  import torch.nn.functional as F
  return F.layer_norm(x, x.shape[-1:], eps=eps)


def torch_conv2d(x, w):
  import torch.nn.functional as F
  return F.conv2d(x, w, padding=1)


@dataclass
class Workload:
  name: str
  shapes: list[tuple[int, ...]]
  rulec: Callable          # Tensors -> Tensor (rulec)
  numpy: Callable          # arrays -> array
  tinygrad: Callable       # Tensors -> Tensor (tinygrad)
  torch: Callable | None = None   # tensors -> tensor (torch), for GPU runs
  nbytes: int = 0          # memory-bound: bytes read + written
  flops: int = 0           # compute-bound: 2*M*N*K
  reps: tuple[int, int, int] = (7, 7, 7)   # rulec, numpy, tinygrad
  rtol: float = 1e-5
  atol: float = 1e-6
  sum_tol: float = 0.0     # reductions: |out - ref| <= sum_tol * sum(|x|)
  slow: bool = False       # rulec warm-up only compiles (one run is very long)
  results: dict = field(default_factory=dict)


def ew(a, b, c): return (a * b + c).relu()


CONV = dict(N=32, C=32, O=64, H=56, W=56, k=3)
_cf = 2 * CONV["N"] * CONV["O"] * CONV["H"] * CONV["W"] * CONV["C"] * CONV["k"] ** 2

WORKLOADS = [
  Workload("relu(a*b+c) 1M", [(M1,)] * 3, ew, lambda a, b, c: np.maximum(a * b + c, 0), ew, torch=ew, nbytes=16 * M1, reps=(15, 15, 15)),
  Workload("relu(a*b+c) 16M", [(M16,)] * 3, ew, lambda a, b, c: np.maximum(a * b + c, 0), ew, torch=ew, nbytes=16 * M16, reps=(7, 7, 7)),
  Workload("sum 1M", [(M1,)], lambda a: a.sum(), lambda a: a.sum(), lambda a: a.sum(), torch=lambda a: a.sum(), nbytes=4 * M1 + 4,
           reps=(15, 15, 15), sum_tol=1e-6),
  Workload("sum 16M", [(M16,)], lambda a: a.sum(), lambda a: a.sum(), lambda a: a.sum(), torch=lambda a: a.sum(), nbytes=4 * M16 + 4,
           reps=(7, 7, 7), sum_tol=1e-6),
  Workload("softmax 4096x1024", [(4096, 1024)], lambda x: x.softmax(-1), np_softmax, lambda x: x.softmax(-1),
           torch=lambda x: x.softmax(-1), nbytes=2 * 4 * 4096 * 1024, rtol=1e-4, atol=1e-7),
  Workload("log_softmax 4096x1024", [(4096, 1024)], lambda x: x.log_softmax(-1), np_log_softmax, lambda x: x.log_softmax(-1),
           torch=lambda x: x.log_softmax(-1), nbytes=2 * 4 * 4096 * 1024, rtol=1e-4, atol=1e-5),
  Workload("layernorm 4096x1024", [(4096, 1024)], lambda x: x.layernorm(), np_layernorm, tg_layernorm,
           torch=torch_layernorm, nbytes=2 * 4 * 4096 * 1024, rtol=1e-3, atol=1e-4),
  Workload("matmul 1024^3", [(1024, 1024)] * 2, lambda a, b: a @ b, lambda a, b: a @ b, lambda a, b: a @ b,
           torch=lambda a, b: a @ b, flops=2 * 1024 ** 3, reps=(7, 7, 5), rtol=1e-3, atol=1e-3),
  # nn.Linear's product: the weight's rows are read across (a transposed view), so its column loads do not neighbour
  Workload("linear 1024^3 x @ W.T", [(1024, 1024)] * 2, lambda a, w: a @ w.T, lambda a, w: a @ w.T, lambda a, w: a @ w.T,
           torch=lambda a, w: a @ w.T, flops=2 * 1024 ** 3, reps=(7, 7, 5), rtol=1e-3, atol=1e-3),
  Workload("conv2d 32x32x56x56 k3 ->64", [(CONV["N"], CONV["C"], CONV["H"], CONV["W"]), (CONV["O"], CONV["C"], 3, 3)],
           lambda x, w: x.conv2d(w, padding=1), np_conv2d, lambda x, w: x.conv2d(w, padding=1),
           torch=torch_conv2d, flops=_cf, reps=(1, 3, 3), rtol=1e-3, atol=1e-3, slow=True),
]


# *** helpers ***

class Inputs:
  """Two pre-generated input sets; fresh(i) gives new arrays holding set i % 2, and numpy's result on it."""
  def __init__(self, w: Workload, seed: int):
    self.w = w
    rng = np.random.default_rng(seed)
    self.sets = [[rng.standard_normal(s, dtype=np.float32) for s in w.shapes] for _ in range(2)]
    self.refs = [w.numpy(*s) for s in self.sets]
    self.abs_sums = [sum(float(np.abs(a).sum(dtype=np.float64)) for a in s) for s in self.sets]

  def fresh(self, i: int) -> list[np.ndarray]: return [a.copy() for a in self.sets[i % 2]]


def check(w: Workload, inp: Inputs, i: int, got: np.ndarray, who: str, failures: list[str]):
  ref = inp.refs[i % 2]
  got = np.asarray(got).reshape(np.shape(ref))
  if w.sum_tol:
    err, tol = float(np.max(np.abs(got.astype(np.float64) - ref))), w.sum_tol * inp.abs_sums[i % 2]
    ok = err <= tol
    detail = f"|err| {err:.3g} > {tol:.3g}"
  else:
    ok = bool(np.allclose(got, ref, rtol=w.rtol, atol=w.atol))
    detail = f"max |err| {float(np.max(np.abs(got - ref))):.3g} (rtol {w.rtol}, atol {w.atol})"
  if not ok:
    failures.append(f"{w.name}: {who} differs from numpy: {detail}")
  return ok


def fmt(x: float | None, nd: int = 2) -> str:
  if x is None or (isinstance(x, float) and math.isnan(x)): return "-"
  if x >= 100: return f"{x:.0f}"
  if x >= 10: return f"{x:.1f}"
  if x < 0.1: return f"{x:.2g}"
  return f"{x:.{nd}f}"


def print_table(head: list[str], body: list[list[str]]) -> None:
  """Left-aligned first and last columns, the rest right-aligned."""
  widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
  for row in [head] + body:
    print("  ".join(c.ljust(wd) if i in (0, len(row) - 1) else c.rjust(wd) for i, (c, wd) in enumerate(zip(row, widths))).rstrip())


def scaled(w: Workload, k: int) -> Workload:
  """w with every dimension's size divided by about k**(1/rank) (at least 1), for quick runs."""
  if k == 1: return w
  shapes = [tuple(max(1, int(d / k ** (1 / len(s)))) for d in s) for s in w.shapes]
  if w.name.startswith("conv2d"): shapes = [(2, 8, 14, 14), (16, 8, 3, 3)]
  if w.name.startswith("matmul"): shapes = [(shapes[0][0], shapes[0][1]), (shapes[0][1], shapes[0][0])]
  f = shapes[0][0] / w.shapes[0][0]
  return dataclasses.replace(w, name=w.name + f" /{k}", shapes=shapes, nbytes=int(w.nbytes * f * (1 if len(w.shapes[0]) == 1 else f)),
                             flops=int(w.flops / k), results={})
