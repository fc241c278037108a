"""Training speed: the digits CNN's jitted train step in rulec, tinygrad 0.14 and torch, same run, as ratios.

The model is examples/train_digits.py's DigitsNet (Conv2d 1->8, Conv2d 8->16, max pool, Linear 256->10), the
optimizer Adam (lr 5e-3), the batch 64 images of 8x8. All three start from the same weights (rulec's
initialisation, copied) and see the same batches; their first-step losses are compared as a check that they do
the same work. rulec and tinygrad run a `TinyJit` step (forward, backward, Adam update); torch runs eager
(its usual training loop). Every step passes fresh input tensors made from host arrays, as a real loop does.

Measured, after WARMUP steps (jit capture, compilation):
- steps/s: STEPS steps timed together, the device synchronised once at the end;
- host overhead per step: the same jitted step on a batch of 1, timed the same way. Its kernels do almost
  no work, so what is left is the time outside kernels: building input tensors, the jit's replay (checking
  inputs, launching each kernel), and the fixed cost of each kernel launch. rulec's engine/realize.py exposes
  no timer around kernel execution, so this is the method for all three (an upper bound on the overhead).
- peak MiB: the most memory the framework's buffers held at once during one step after the warm-up (weights,
  optimizer state and the JIT's buffers included): rulec's runtime/buffer.py counter, tinygrad's
  GlobalCounters.mem_used followed through every allocation, torch's max_memory_allocated() on CUDA ("-" on a
  CPU, where torch counts nothing).
Ratios are rulec's steps/s over the other's (above 1: rulec is faster) and the other's overhead over rulec's.

Run: python bench/train.py [--device CPU|NUMPY|CL] [--steps N]. `--device CL` runs rulec on OpenCL (PoCL on a
machine without a GPU) and torch on CUDA when it is available; tinygrad runs on its `DEV` (default CPU: set
DEV=CUDA for a GPU). Needs scikit-learn and tinygrad==0.14.0 (`pip install '.[bench,examples]'`, and Debian's
clang for tinygrad's CPU device); torch is optional (its column says "not installed").
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("DEV", "CPU")
ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "examples")]

import numpy as np  # noqa: E402

import train_digits as td  # noqa: E402

BATCH, TINY, LR, WARMUP, STEPS = 64, 1, 5e-3, 3, 100


def batches(n: int, batch: int, count: int, seed: int = 1) -> list[np.ndarray]:
  """`count` index arrays shared by every framework."""
  return list(td.batches(n, batch, count, seed))


# *** rulec ***

def rulec_runner(sd: dict[str, np.ndarray], device: str):
  """step(x, y) -> loss for rulec's jitted step, and a sync() that waits for the device."""
  from rulec import Tensor, nn
  model = td.DigitsNet(sd["c1.weight"].shape[0], sd["c2.weight"].shape[0])
  nn.state.load_state_dict(model, {k: Tensor(v) for k, v in sd.items()}, verbose=False)
  step = td.make_train_step(model, nn.optim.Adam(nn.state.get_parameters(model), lr=LR))
  def run(x, y): return step(Tensor(x), Tensor(y))
  def sync():
    if device == "CL":
      from rulec.runtime import cl_device
      cl_device.synchronize()
  from rulec.runtime import buffer as membuf
  def peak_of(fn):   # (the bytes rulec's buffers held at most during fn: runtime/buffer.py's counter)
    membuf.reset_peak()
    fn()
    sync()
    return membuf.memory_peak()
  return run, sync, lambda loss: loss.item(), lambda: len(step.captured.plan), peak_of


# *** tinygrad ***

def tinygrad_runner(sd: dict[str, np.ndarray]):
  from tinygrad import Context, Device, Tensor as TT, TinyJit, nn as tnn

  class Net:
    def __init__(self):
      self.c1 = tnn.Conv2d(1, sd["c1.weight"].shape[0], 3, padding=1)
      self.c2 = tnn.Conv2d(*sd["c2.weight"].shape[1::-1], 3, padding=1)
      self.l1 = tnn.Linear(*sd["l1.weight"].shape[::-1])
    def __call__(self, x): return self.l1(self.c2(self.c1(x).relu()).relu().max_pool2d(2).flatten(1))

  model = Net()
  tnn.state.load_state_dict(model, {k: TT(v) for k, v in sd.items()}, verbose=False)
  opt = tnn.optim.Adam(tnn.state.get_parameters(model), lr=LR)

  @TinyJit
  def step(x, y):
    with Context(TRAINING=1):   # tinygrad 0.14's training switch (rulec: Tensor.train())
      opt.zero_grad()
      loss = model(x).sparse_categorical_crossentropy(y).backward()
      return loss.realize(*opt.schedule_step())
  def run(x, y): return step(TT(x), TT(y))
  def kernels(): return sum(1 for c in step.captured.linear.src if c.src and c.src[0].op.name == "PROGRAM")
  from tinygrad.helpers import GlobalCounters
  import tinygrad.device as tdev
  most = [0]
  if not hasattr(tdev.Buffer.allocate, "counted"):   # its peak: mem_used followed through every allocation
    allocate = tdev.Buffer.allocate
    def counted(self, *args, **kw):
      out = allocate(self, *args, **kw)
      counted.most = max(counted.most, GlobalCounters.mem_used)
      return out
    counted.counted, counted.most = True, 0
    tdev.Buffer.allocate = counted
  def peak_of(fn):
    tdev.Buffer.allocate.most = GlobalCounters.mem_used
    fn()
    Device[Device.DEFAULT].synchronize()
    return tdev.Buffer.allocate.most
  return run, lambda: Device[Device.DEFAULT].synchronize(), lambda loss: loss.item(), kernels, peak_of


# *** torch ***

def torch_runner(sd: dict[str, np.ndarray], want_cuda: bool):
  import torch
  import torch.nn.functional as F
  dev = "cuda" if want_cuda and torch.cuda.is_available() else "cpu"

  class Net(torch.nn.Module):
    def __init__(self):
      super().__init__()
      self.c1 = torch.nn.Conv2d(1, sd["c1.weight"].shape[0], 3, padding=1)
      self.c2 = torch.nn.Conv2d(*sd["c2.weight"].shape[1::-1], 3, padding=1)
      self.l1 = torch.nn.Linear(*sd["l1.weight"].shape[::-1])
    def forward(self, x): return self.l1(F.max_pool2d(F.relu(self.c2(F.relu(self.c1(x)))), 2).flatten(1))

  model = Net().to(dev)
  model.load_state_dict({k: torch.tensor(v) for k, v in sd.items()})
  opt = torch.optim.Adam(model.parameters(), lr=LR)
  def run(x, y):
    opt.zero_grad()
    loss = F.cross_entropy(model(torch.from_numpy(x).to(dev)), torch.from_numpy(y).long().to(dev))
    loss.backward()
    opt.step()
    return loss
  def sync():
    if dev == "cuda": torch.cuda.synchronize()
  def peak_of(fn):   # (on a CPU torch counts no allocations: no figure)
    if dev != "cuda": return None
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated()
  return run, sync, lambda loss: loss.item(), lambda: None, peak_of, dev


# *** timing ***

def timed(run, sync, item, kernels, peak_of, xtr, ytr, batch: int, steps: int) -> tuple[float, float, int | None, int | None]:
  """(first loss, seconds per step, kernels per replayed step, peak bytes of one step after the warm-up) over
  `steps` steps after WARMUP, synchronised once at the end."""
  idx = batches(len(xtr), batch, WARMUP + steps)
  first = item(run(xtr[idx[0]], ytr[idx[0]]))
  for i in idx[1:WARMUP]: run(xtr[i], ytr[i])
  sync()
  peak = peak_of(lambda: run(xtr[idx[1]], ytr[idx[1]]))
  data = [(xtr[i], ytr[i]) for i in idx[WARMUP:]]
  t0 = time.perf_counter()
  for x, y in data: loss = run(x, y)
  item(loss)
  sync()
  return first, (time.perf_counter() - t0) / steps, kernels(), peak


def measure(make, xtr, ytr, steps: int) -> dict:
  """steps/s at BATCH and host overhead (a TINY-batch step), each with a runner of its own (a jit per shape)."""
  t_make = time.perf_counter()
  first, per_step, kernels, peak = timed(*make()[:5], xtr, ytr, BATCH, steps)
  _, tiny, _, _ = timed(*make()[:5], xtr, ytr, TINY, steps)
  return {"loss0": first, "step": per_step, "host": tiny, "kernels": kernels, "peak": peak,
          "total": time.perf_counter() - t_make}


def machine() -> str:
  return (f"machine: {platform.processor() or platform.machine()} ({platform.system()} {platform.release()}), "
          f"{os.cpu_count()} CPUs, Python {platform.python_version()}")


def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--device", default=None, help="rulec's device: CPU (default), NUMPY or CL (torch then uses CUDA)")
  ap.add_argument("--steps", type=int, default=STEPS, help=f"timed steps per measurement (default {STEPS})")
  args = ap.parse_args(argv)
  device = td.use_device(args.device)
  from rulec import Tensor, nn
  try: xtr, ytr, _, _ = td.load_data()
  except SystemExit:   # no scikit-learn (the GPU machine): same shapes, random values; the speed is the same
    rng = np.random.default_rng(0)
    xtr, ytr = rng.random((1437, 1, 8, 8), dtype=np.float32), rng.integers(0, 10, 1437).astype(np.int32)
    print("scikit-learn not installed: random 8x8 images stand in for the digits (speed only)")
  Tensor.manual_seed(0)
  sd = {k: v.numpy() for k, v in nn.state.get_state_dict(td.DigitsNet()).items()}
  rows = {f"rulec ({device})": measure(lambda: rulec_runner(sd, device), xtr, ytr, args.steps)}
  tg_version = "not installed"
  try:
    import tinygrad
    from tinygrad import Device
    tg_version = getattr(tinygrad, "__version__", "0.14")
    rows[f"tinygrad 0.14 ({Device.DEFAULT})"] = measure(lambda: tinygrad_runner(sd), xtr, ytr, args.steps)
  except ImportError: rows["tinygrad 0.14"] = None
  try:
    import torch
    dev = torch_runner(sd, device == "CL")[-1]
    def make(): return torch_runner(sd, device == "CL")
    rows[f"torch {torch.__version__} ({dev}, eager)"] = measure(make, xtr, ytr, args.steps)
    torch_note = f"torch threads {torch.get_num_threads()}"
  except ImportError:
    rows["torch"] = None
    torch_note = "torch not installed"
  _report(rows, device, args.steps, torch_note, tg_version)
  return 0


def _report(rows: dict, device: str, steps: int, torch_note: str, tg_version: str) -> None:
  from rulec.runtime.cpu_device import threads
  print(machine())
  print(f"DigitsNet train step (forward, backward, Adam), batch {BATCH}; host overhead = a batch-{TINY} step; "
        f"{steps} timed steps after {WARMUP} warm-up; rulec threads {threads() if device == 'CPU' else '-'}, "
        f"tinygrad {tg_version}, {torch_note}")
  head = (f"{'framework':<30} {'steps/s':>8} {'ms/step':>8} {'host ms/step':>13} {'rulec speedup':>14} "
          f"{'overhead vs rulec':>18} {'kernels':>8} {'peak MiB':>9} {'first loss':>11} {'wall s':>7}")
  print(head)
  print("-" * len(head))
  ref = next(iter(rows.values()))
  for name, r in rows.items():
    if r is None:
      print(f"{name:<30} {'not installed':>8}")
      continue
    kernels = "-" if r["kernels"] is None else r["kernels"]
    peak = "-" if r["peak"] is None else f"{r['peak'] / 2**20:.2f}"
    print(f"{name:<30} {1 / r['step']:>8.1f} {r['step'] * 1e3:>8.2f} {r['host'] * 1e3:>13.3f} "
          f"{r['step'] / ref['step']:>14.2f} {r['host'] / ref['host']:>18.2f} {kernels:>8} {peak:>9} {r['loss0']:>11.5f} "
          f"{r['total']:>7.1f}")
  losses = [r["loss0"] for r in rows.values() if r is not None]
  agree = max(losses) - min(losses) <= 1e-4 * max(1.0, abs(losses[0]))
  print(f"first-step losses {'agree' if agree else 'DIFFER'} (same weights, same batch): "
        f"{', '.join(f'{x:.6f}' for x in losses)}")


if __name__ == "__main__":
  sys.exit(main())
