"""torch's side of bench/multi.py on GPUs: the same programs with NCCL, one process per GPU.

Run with torchrun: `torchrun --nproc_per_node N bench/multi_torch.py [--size M] [--repeats R]` (N = 1, 2, ...).
Programs, each timed as the median of R runs after warm-up, CUDA synchronised, on every rank:
- matmul rows: x (M, M) split by rows across ranks, w replicated: each rank multiplies its rows (no traffic);
- MLP step: the 784-256-10 MLP, batch 256 split across ranks, DistributedDataParallel, SGD momentum;
- allreduce: dist.all_reduce of M*M/N float32 per rank, summed onto every rank, with its bus bandwidth
  2(N-1)/N * bytes / time (as NCCL's tests report it).
Rank 0 prints one line per program; bench/h200.sh multi runs it for N = 1 and 2 beside bench/multi.py --kind CL.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist


def timed(fn, repeats: int) -> float:
  for _ in range(2): fn()
  torch.cuda.synchronize()
  times = []
  for _ in range(repeats):
    dist.barrier()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    times.append(time.perf_counter() - t0)
  return statistics.median(times) * 1e3


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--size", type=int, default=1024)
  ap.add_argument("--repeats", type=int, default=5)
  args = ap.parse_args()
  local = int(os.environ.get("LOCAL_RANK", 0))
  torch.cuda.set_device(local)
  dev = torch.device("cuda", local)
  dist.init_process_group("nccl", device_id=dev)   # (naming the device: NCCL need not guess it from the rank)
  rank, n = dist.get_rank(), dist.get_world_size()
  m = args.size
  g = torch.Generator(device=dev).manual_seed(0)
  x = torch.randn(m // n, m, device=dev, generator=g)
  w = torch.randn(m, m, device=dev, generator=g)
  rows = timed(lambda: x @ w, args.repeats)
  model = torch.nn.parallel.DistributedDataParallel(
    torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)).to(dev))
  opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
  xb, yb = torch.randn(256 // n, 784, device=dev, generator=g), torch.randint(0, 10, (256 // n,), device=dev, generator=g)
  def step():
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(xb), yb).backward()
    opt.step()
  mlp = timed(step, args.repeats)
  buf = torch.randn(m * m // n, device=dev, generator=g)
  red = timed(lambda: dist.all_reduce(buf), args.repeats)
  bus = 2 * (n - 1) / n * buf.numel() * 4 / (red * 1e-3) / 1e9 if n > 1 else 0.0
  if rank == 0:
    print(f"torch {torch.__version__} on {n} GPU(s), {torch.cuda.get_device_name()}; size {m}, median of {args.repeats}")
    print(f"  matmul rows          {rows:8.2f} ms")
    print(f"  MLP step (DDP)       {mlp:8.2f} ms")
    print(f"  allreduce (NCCL)     {red:8.2f} ms  bus bandwidth {bus:.1f} GB/s")
  dist.destroy_process_group()


if __name__ == "__main__":
  main()
