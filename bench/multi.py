"""Several devices: a sharded matmul and a data-parallel MLP training step on 1, 2 and 4 CPU devices.

Programs (each on `CPU`, `CPU:0..1` and `CPU:0..3`, or `--kind NUMPY`):
- matmul rows: x (M, K) split by rows, w (K, N) replicated; every device multiplies its rows, no copy.
- matmul K: x split by columns and w by rows; each device's product is partial, and the sum over K is an
  allreduce (naive for two devices, naive or ring for four: tinygrad's choice by size, RULEC_RING).
- MLP step: a 784-256-10 MLP, batch split across the devices, weights replicated, SGD with momentum: forward,
  backward (the weight gradients are reduces over the split batch: allreduces) and update in one realize.

- allreduce: an (n, M*M/n) float32 value split by rows, summed over the split axis onto every device: the
  allreduce alone; its bus bandwidth is 2(n-1)/n * (M*M/n * 4 bytes) / time, as NCCL's tests report it.

Columns, per run of the program after warm-up (the schedule cache then skips scheduling, as in a training loop):
kernels run, of which copies (device-to-device transfers), MB copied, and the median wall time of REPEATS runs.
The CPU devices here share one machine's cores (each kernel already uses all of them, RULEC_THREADS), so the
times show what splitting costs, not a speedup: the point is that every device does 1/n of the work, and what
the copies add. On GPUs (`--kind CL`, each OpenCL device a GPU) the same table is the multi-GPU figure:
bench/h200.sh multi runs it on one and two H200s beside torch (bench/multi_torch.py: NCCL allreduce, a
row-split matmul, a DDP step). Run: python bench/multi.py [--kind CPU|NUMPY|CL] [--devices 1,2,4] [--size M]
[--repeats N]
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from rulec.engine.realize import COUNTERS  # noqa: E402
from rulec import Tensor, nn  # noqa: E402
from rulec.nn import optim  # noqa: E402
from rulec.nn.state import get_parameters  # noqa: E402
from rulec.runtime import devices as rt  # noqa: E402

M, K, N = 1024, 1024, 1024
BATCH = 256


def device_sets(kind: str, counts: list[int]) -> list[tuple[str, ...] | None]:
  return [None if n == 1 else tuple(f"{kind}:{i}" for i in range(n)) for n in counts]


def sync() -> None:
  """Wait for queued kernels (CL enqueues without waiting; CPU and NUMPY are done when realize returns)."""
  if KIND == "CL":
    from rulec.runtime import cl_device
    cl_device.synchronize()


KIND = "CPU"


def put(x: np.ndarray, devices, axis):
  t = Tensor(x)
  return (t if devices is None else t.shard(devices, axis=axis)).realize()


def matmul(devices, split: str):
  r = np.random.default_rng(0)
  x, w = r.standard_normal((M, K)).astype(np.float32), r.standard_normal((K, N)).astype(np.float32)
  xt, wt = (put(x, devices, 0), put(w, devices, None)) if split == "rows" else (put(x, devices, 1), put(w, devices, 0))
  want = x @ w
  def run():
    out = (xt @ wt).realize()
    sync()
    return out
  def check(out): np.testing.assert_allclose(out.numpy(), want, rtol=2e-3, atol=2e-2)
  return run, check


class MLP:
  def __init__(self): self.l1, self.l2 = nn.Linear(784, 256), nn.Linear(256, 10)
  def __call__(self, x): return self.l2(self.l1(x).relu())


def mlp_step(devices, _split=None):
  Tensor._rng = np.random.default_rng(0)
  model = MLP()
  if devices:
    for p in get_parameters(model): p.shard_(devices)
  opt = optim.SGD(get_parameters(model), lr=0.01, momentum=0.9)
  r = np.random.default_rng(1)
  X, Y = r.standard_normal((BATCH, 784)).astype(np.float32), r.integers(0, 10, BATCH).astype(np.int32)
  def run():
    x, y = Tensor(X), Tensor(Y)
    if devices: x, y = x.shard(devices, axis=0), y.shard(devices, axis=0)
    with Tensor.train():
      opt.zero_grad()
      loss = model(x).sparse_categorical_crossentropy(y)
      loss.backward()
      opt.step()
    loss.realize()
    sync()
    return loss
  return run, lambda loss: float(loss.item())


def allreduce(devices, _split=None):
  n = 1 if devices is None else len(devices)
  x = np.random.default_rng(2).standard_normal((n, M * N // n)).astype(np.float32)
  xt = put(x, devices, 0)
  def run():
    out = xt.sum(0).realize()
    sync()
    return out
  def check(out): np.testing.assert_allclose(out.numpy(), x.sum(0), rtol=1e-4, atol=1e-4)
  return run, check


def measure(make, devices, split, repeats: int):
  run, check = make(devices, split)
  for _ in range(2): out = run()   # warm-up: scheduling, compiling
  check(out)
  c0, k0 = COUNTERS["run"], dict(rt.COPIES)
  run()
  kernels, copies = COUNTERS["run"] - c0, rt.COPIES["copies"] - k0["copies"]
  mb = (rt.COPIES["bytes"] - k0["bytes"]) / 2 ** 20
  times = []
  for _ in range(repeats):   # (CPU and NUMPY kernels are done when realize returns)
    t0 = time.perf_counter()
    run()
    times.append(time.perf_counter() - t0)
  return kernels, copies, mb, statistics.median(times) * 1e3


def main() -> None:
  global KIND, M, K, N
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--kind", default="CPU", choices=["CPU", "NUMPY", "CL"])
  ap.add_argument("--devices", default="1,2,4", help="device counts, comma-separated (default 1,2,4)")
  ap.add_argument("--size", type=int, default=M, help=f"matmul side and allreduce rows x columns (default {M})")
  ap.add_argument("--repeats", type=int, default=5)
  args = ap.parse_args()
  KIND, M = args.kind, args.size
  K = N = M
  if KIND == "CL" and rt.device_kind(rt.default_device()) != "CL":
    raise SystemExit("bench/multi.py --kind CL: run it with RULEC_DEVICE=CL (the one-device column runs there)")
  print(f"machine: {platform.machine()} ({platform.system()} {platform.release()}), {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}; RULEC_THREADS={os.environ.get('RULEC_THREADS', os.cpu_count())}")
  print(f"matmul {M}x{K} @ {K}x{N}; MLP 784-256-10, batch {BATCH}, SGD momentum; median of {args.repeats} after warm-up")
  programs = [("matmul rows", matmul, "rows"), ("matmul K (allreduce)", matmul, "k"), ("MLP step", mlp_step, None),
              ("allreduce", allreduce, None)]
  sets = device_sets(args.kind, [int(c) for c in args.devices.split(",")])
  names = [("1 device" if d is None else f"{len(d)} devices") for d in sets]
  head = f"{'program':<22}" + "".join(f"{n:>34}" for n in names)
  print(head)
  print(f"{'':<22}" + "".join(f"{'kernels copies    MB      ms':>34}" for _ in names))
  print("-" * len(head))
  for title, make, split in programs:
    cells = []
    for d in sets:
      k, c, mb, ms = measure(make, d, split, args.repeats)
      cells.append(f"{k:>13} {c:>6} {mb:>5.1f} {ms:>7.1f}")
    print(f"{title:<22}" + "".join(f"{c:>34}" for c in cells))
    if make is allreduce:
      for d, c in zip(sets, cells):
        n, ms = (1 if d is None else len(d)), float(c.split()[-1])
        bus = 2 * (n - 1) / n * (M * N // n) * 4 / (ms * 1e-3) / 1e9 if n > 1 else 0.0   # bytes per device
        print(f"  allreduce bus bandwidth on {n} device(s): {bus:.1f} GB/s")


if __name__ == "__main__":
  main()
