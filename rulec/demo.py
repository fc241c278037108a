"""`rulec demo`: a small but real workload, end to end.

An MLP forward, a conv block and an attention block on random data are built
with Tensor, scheduled by the rules in rules/, run on a device, and checked
against the same computation in numpy. A second table shows the rule engine
alone: random index expressions simplified by rules/symbolic.rules and
checked by evaluation. Last, a short training run: an MLP on scikit-learn's digits, jitted, its loss
going down and its test accuracy (skipped when scikit-learn is not installed).
"""
from __future__ import annotations

import math
import random
import time

import numpy as np


def _workloads(rng: np.random.Generator):
  from rulec.engine.tensor import Tensor

  def mk(*shape, scale=1.0):
    a = (rng.standard_normal(shape) * scale).astype(np.float32)
    return Tensor(a), a

  def mlp():
    (x, xn), (w1, w1n), (b1, b1n), (w2, w2n), (b2, b2n) = mk(64, 784), mk(784, 256, scale=0.05), mk(256), \
      mk(256, 10, scale=0.05), mk(10)
    return (x @ w1 + b1).relu() @ w2 + b2, np.maximum(xn @ w1n + b1n, 0) @ w2n + b2n

  def conv():
    (x, xn), (w, wn), (b, bn) = mk(8, 3, 32, 32), mk(16, 3, 3, 3, scale=0.2), mk(16)
    out = x.conv2d(w, b, padding=1).relu().max_pool2d(2)
    xp = np.pad(xn, ((0, 0), (0, 0), (1, 1), (1, 1)))
    win = np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(2, 3))          # N C H W kh kw
    y = np.maximum(np.einsum("nchwij,ocij->nohw", win, wn) + bn[None, :, None, None], 0)
    return out, y.reshape(8, 16, 16, 2, 16, 2).max(axis=(3, 5))

  def attention():
    seq, dim, heads = 128, 256, 4
    hd = dim // heads
    (x, xn), *ws = mk(seq, dim), *(mk(dim, dim, scale=dim ** -0.5) for _ in range(4))
    (wq, wqn), (wk, wkn), (wv, wvn), (wo, won) = ws
    def heads_of(t): return t.reshape(seq, heads, hd).permute(1, 0, 2)
    q, k, v = heads_of(x @ wq), heads_of(x @ wk), heads_of(x @ wv)
    att = (q @ k.permute(0, 2, 1) * (1 / math.sqrt(hd))).softmax(-1)
    out = (x + (att @ v).permute(1, 0, 2).reshape(seq, dim) @ wo).layernorm()
    def nheads(t): return t.reshape(seq, heads, hd).transpose(1, 0, 2)
    qn, kn, vn = nheads(xn @ wqn), nheads(xn @ wkn), nheads(xn @ wvn)
    s = qn @ kn.transpose(0, 2, 1) / math.sqrt(hd)
    e = np.exp(s - s.max(-1, keepdims=True))
    y = xn + ((e / e.sum(-1, keepdims=True)) @ vn).transpose(1, 0, 2).reshape(seq, dim) @ won
    want = (y - y.mean(-1, keepdims=True)) / np.sqrt(y.var(-1, keepdims=True) + 1e-5)
    return out, want

  return {"MLP 64x784-256-10": mlp, "conv3x3+relu+maxpool 8x3x32x32": conv, "attention 128x256, 4 heads": attention}


def run_demo(args) -> int:
  import os

  from rulec.runtime.devices import DEVICES
  if args.device is not None:
    if args.device.upper() not in DEVICES:
      print(f"rulec demo: unknown device {args.device!r}; known devices: {', '.join(DEVICES)}")
      return 2
    os.environ["RULEC_DEVICE"] = args.device.upper()
  from rulec.engine.sched.driver import schedule
  from rulec.runtime.devices import default_device, run_kernel

  device = default_device()
  print(f"rulec demo on device {device}: programs scheduled by rules/, run, and checked against numpy")
  print(f"  {'workload':<32} {'kernels':>7} {'schedule ms':>12} {'compile ms':>11} {'run ms':>8} {'max error':>10}")
  failed = False
  for seed, (name, _) in enumerate(_workloads(np.random.default_rng(0)).items()):
    # twice: the first run compiles each kernel, the second (fresh inputs) finds them compiled
    times = []
    for attempt in range(2):
      out, want = _workloads(np.random.default_rng(seed * 10 + attempt))[name]()
      t0 = time.perf_counter()
      kernels, views = schedule([out.uop], device)
      t1 = time.perf_counter()
      for k in kernels: run_kernel(k, k.bufs[0].arg[1])
      t2 = time.perf_counter()
      times.append((t1 - t0, t2 - t1))
    from rulec.engine.realize import host_value
    got = host_value(views[0])
    err = float(np.abs(got - want).max())
    ok = err <= 1e-3 * max(1.0, float(np.abs(want).max()))
    failed |= not ok
    (s1, r1), (s2, r2) = times
    print(f"  {name:<32} {len(kernels):>7} {s2 * 1e3:>12.1f} {max(0.0, r1 - r2) * 1e3:>11.1f} {r2 * 1e3:>8.1f} "
          f"{err:>10.2e}{'' if ok else '  WRONG'}")
  failed |= _symbolic_demo(args.count)
  failed |= _training_demo()
  return 1 if failed else 0


def _symbolic_demo(count: int) -> bool:
  from rulec.engine.ir.index_expr import build, evaluate, leaf_values, leaves_of, random_recipe
  from rulec.engine.lang.loader import load_library
  from rulec.engine.ir.rewrite import graph_rewrite
  from rulec.engine.ir.uop import UOp

  m = load_library().matcher("symbolic")
  rng = random.Random(0)
  exprs = [build(random_recipe(rng)) for _ in range(count)]
  sink = UOp.sink(*exprs)
  nodes_in = len(sink.toposort())
  t0 = time.perf_counter()
  out = graph_rewrite(sink, m)
  t_rw = time.perf_counter() - t0
  bad = checked = 0
  for before, after in zip(exprs, out.src):
    leaves = leaves_of(before)
    for _ in range(4):
      env = {leaf: rng.choice(leaf_values(leaf)) for leaf in leaves}
      checked += 1
      bad += evaluate(before, env) != evaluate(after, env)
  print(f"rule engine: {len(exprs)} index expressions simplified by rules/symbolic.rules")
  print(f"  nodes {nodes_in} -> {len(out.toposort())} in {t_rw * 1e3:.1f} ms ({nodes_in / t_rw / 1e3:.0f}k nodes/s); "
        f"checked at {checked} points: {bad} mismatches")
  return bad > 0


def _training_demo(steps: int = 300, batch: int = 64) -> bool:
  """Train a 64-128-10 MLP on the digits with Adam in a TinyJit step; True when it failed to learn."""
  try:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
  except ImportError:
    print("training: skipped, it needs scikit-learn (pip install 'rulec[examples]')")
    return False
  from rulec import Tensor, TinyJit, nn
  d = load_digits()
  xtr, xte, ytr, yte = train_test_split((d.data / 16).astype(np.float32), d.target.astype(np.int32), test_size=0.2,
                                        random_state=0, stratify=d.target)
  Tensor.manual_seed(0)
  l1, l2 = nn.Linear(64, 128), nn.Linear(128, 10)
  def model(x): return l2(l1(x).relu())
  opt = nn.optim.Adam(nn.state.get_parameters([l1, l2]), lr=3e-3)

  @TinyJit
  def step(x, y):
    with Tensor.train():
      opt.zero_grad()
      loss = model(x).sparse_categorical_crossentropy(y).backward()
      return loss.realize(*opt.schedule_step())   # the loss before the update, in the same realize

  print(f"training: MLP 64-128-10 on {len(xtr)} digits (scikit-learn), Adam, batch {batch}, jitted step")
  rng, losses, shown = np.random.default_rng(0), [], []
  t0 = time.perf_counter()
  for i in range(steps):
    idx = rng.choice(len(xtr), batch, replace=False)
    losses.append(step(Tensor(xtr[idx]), Tensor(ytr[idx])).item())
    if i == 0 or (i + 1) % (steps // 5) == 0: shown.append(f"{i + 1}: {np.mean(losses[-20:]):.3f}")
  dt = time.perf_counter() - t0
  acc = float((model(Tensor(xte)).argmax(1).numpy() == yte).mean())
  print(f"  train loss (mean of the last 20 steps) at step {', '.join(shown)}")
  ok = acc > 0.9 and np.mean(losses[-20:]) < 0.5 * np.mean(losses[:20])
  print(f"  {steps} steps in {dt:.1f} s ({steps / dt:.0f} steps/s); test accuracy {acc * 100:.1f}% on {len(xte)} digits"
        f"{'' if ok else '  DID NOT LEARN'}")
  return not ok
