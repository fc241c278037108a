"""float16 and bfloat16 matmuls on the CUDA device's tensor cores (codegen/nvptx_gemm.py) beside torch (cuBLAS) and
tinygrad 0.14 on the same GPU, in one run.

Run (on a machine with an NVIDIA GPU of sm_80 or later; bench/h200.sh halfmm does the set-up):
  python bench/half_matmul.py [--reps 20] [--tiles "128,128,32,3,2,4 128,256,32,3,2,4"]
Rows: the 4096^3 matmul (the issue's yardstick), x @ W.T at GPT-2's MLP sizes, a batched attention product, a
3x3 convolution (ResNet's 64-channel stage: its window gathered into the tile, codegen/gemm_plan.py).
Times are medians of `reps` calls, inputs resident on the GPU:
  rulec: device-side time of the kernel (CUDA events around each launch, RULEC_CUDA_PROFILE=1), the program
         realized once before (compiled, uploaded); its result checked against numpy (float32 of the same inputs).
  torch: CUDA events around `a @ b` (cuBLAS, float32 accumulation).
  tinygrad: wall time of a TinyJit'ed matmul to Device.synchronize(); "n/a" where its CUDA device does not open.
--tiles times each tile shape (RULEC_CUDA_TC_TILE) for the rulec column; the first is the table's.
"""
import argparse
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

SHAPES = [  # name, batch, M, N, K, b transposed (x @ W.T), or "conv" (then M N K are N*H*W, O, C*9 of a 3x3 conv)
  ("matmul 4096^3", (), 4096, 4096, 4096, False),
  ("x @ W.T 8192x3072x768", (), 8192, 3072, 768, True),
  ("x @ W.T 8192x768x3072", (), 8192, 768, 3072, True),
  ("batched 48x1024x1024x64", (48,), 1024, 1024, 64, False),
  ("conv2d 32x64x56x56 k3 ->64", (), 32 * 56 * 56, 64, 64 * 9, "conv"),
]
CONV = dict(N=32, C=64, H=56, W=56, O=64)


def flops(batch, M, N, K): return 2 * M * N * K * int(np.prod(batch or (1,)))


def inputs(batch, M, N, K, bt, seed=0):
  rng = np.random.default_rng(seed)
  if bt == "conv":
    c = CONV
    return (rng.standard_normal((c["N"], c["C"], c["H"], c["W"]), dtype=np.float32),
            rng.standard_normal((c["O"], c["C"], 3, 3), dtype=np.float32))
  a = rng.standard_normal((*batch, M, K), dtype=np.float32)
  b = rng.standard_normal((*batch, N, K) if bt else (*batch, K, N), dtype=np.float32)
  return a, b


def program(bt, a, b, np_mode=False):
  """The row's product of a and b (Tensors of rulec or torch)."""
  if bt == "conv":
    return a.conv2d(b, padding=1) if not np_mode else __import__("torch").nn.functional.conv2d(a, b, padding=1)
  return a @ (b.transpose(-1, -2) if bt else b)


def rulec_time(dtype_name, shape, reps, tile):
  from rulec import Tensor, dtypes
  from rulec.runtime import cuda_device
  os.environ["RULEC_CUDA_PROFILE"] = "1"
  if tile: os.environ["RULEC_CUDA_TC_TILE"] = tile
  else: os.environ.pop("RULEC_CUDA_TC_TILE", None)
  cuda_device._by_ast.clear()   # (a new tile shape: render again)
  _, batch, M, N, K, bt = shape
  a, b = inputs(batch, M, N, K, bt)
  d = getattr(dtypes, dtype_name)
  ta, tb = Tensor(a, device="CUDA").cast(d).realize(), Tensor(b, device="CUDA").cast(d).realize()
  prog = lambda: program(bt, ta, tb).realize()
  tc_before = cuda_device.COUNTERS["tensor_cores"]
  out = prog()
  used_tc = cuda_device.COUNTERS["tensor_cores"] > tc_before
  cuda_device.event_times()
  for _ in range(reps): prog()
  ms = float(np.median(cuda_device.event_times()))
  # check (a corner of) the result against float32 on the rounded inputs
  ra, rb = ta.float().numpy(), tb.float().numpy()
  got = out.float().numpy()
  if bt == "conv":
    from rulec import Tensor as RT
    want = RT(ra[:1], device="CPU").conv2d(RT(rb, device="CPU"), padding=1).numpy()
    got = got[:1]
  else:
    rb = np.swapaxes(rb, -1, -2) if bt else rb
    got = got[..., :64, :64]
    want = np.matmul(ra[..., :64, :], rb[..., :, :64])
  err = float(np.max(np.abs(got - want)) / (np.max(np.abs(want)) + 1e-6))
  return ms, used_tc, err


def torch_time(dtype_name, shape, reps):
  try: import torch
  except ImportError: return None
  if not torch.cuda.is_available(): return None
  _, batch, M, N, K, bt = shape
  a, b = inputs(batch, M, N, K, bt)
  d = getattr(torch, dtype_name)
  ta, tb = torch.from_numpy(a).cuda().to(d), torch.from_numpy(b).cuda().to(d)
  torch.backends.cudnn.benchmark = True
  f = lambda: program(bt, ta, tb, np_mode=True)
  for _ in range(3): f()
  times = []
  for _ in range(reps):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record(); f(); e.record(); e.synchronize()
    times.append(s.elapsed_time(e))
  return float(np.median(times))


TINYGRAD = r'''
import os, sys, time, numpy as np
from tinygrad import Tensor, TinyJit, Device, dtypes
batch, M, N, K, bt, dt, reps = eval(sys.argv[1])
d = getattr(dtypes, dt)
rng = np.random.default_rng(0)
if bt == "conv":
  a = Tensor(rng.standard_normal((32, 64, 56, 56), dtype=np.float32)).cast(d).realize()
  b = Tensor(rng.standard_normal((64, 64, 3, 3), dtype=np.float32)).cast(d).realize()
else:
  a = Tensor(rng.standard_normal((*batch, M, K), dtype=np.float32)).cast(d).realize()
  b = Tensor(rng.standard_normal((*batch, N, K) if bt else (*batch, K, N), dtype=np.float32)).cast(d).realize()
f = TinyJit(lambda x, y: (x.conv2d(y, padding=1) if bt == "conv" else x @ (y.transpose(-1, -2) if bt else y)).realize())
for _ in range(3): f(a, b)
Device[Device.DEFAULT].synchronize()
ts = []
for _ in range(reps):
  t = time.perf_counter(); f(a, b); Device[Device.DEFAULT].synchronize(); ts.append(time.perf_counter() - t)
print("MS", np.median(ts) * 1e3)
'''


def tinygrad_time(dtype_name, shape, reps):
  _, batch, M, N, K, bt = shape
  r = None
  for env in ({"DEV": "CUDA"}, {"DEV": "CUDA:PTX"}):   # (the first falls back to PTX where nvrtc is missing)
    try:
      r = subprocess.run([sys.executable, "-c", TINYGRAD, repr((batch, M, N, K, bt, dtype_name, reps))],
                         capture_output=True, text=True, timeout=90, env={**os.environ, **env})
    except subprocess.TimeoutExpired: continue
    for line in r.stdout.splitlines():
      if line.startswith("MS "): return float(line.split()[1]), " ".join(f"{k}={v}" for k, v in env.items())
  return None, ((r.stderr.strip().splitlines() or ["?"])[-1][:100] if r is not None else "timed out")


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--reps", type=int, default=20)
  p.add_argument("--tiles", default="", help="space-separated RULEC_CUDA_TC_TILE values to compare (default: the built-in)")
  p.add_argument("--dtypes", default="float16,bfloat16")
  p.add_argument("--only", default="", help="comma-separated prefixes of row names")
  p.add_argument("--no-tinygrad", action="store_true")
  args = p.parse_args()
  os.environ["RULEC_CUDA_PROFILE"] = "1"   # (read when the device opens: events around every launch)
  from rulec.runtime import cuda_device
  dev = cuda_device.get_device()
  print(f"device: {dev.name} ({dev.arch}); {time.strftime('%Y-%m-%d %H:%M:%S')}")
  tiles = args.tiles.split() or [""]
  rows = [s for s in SHAPES if not args.only or any(s[0].startswith(o) for o in args.only.split(","))]
  print(f"{'workload':28s} {'dtype':9s} {'tile':20s} {'rulec ms':>9s} {'TFLOP/s':>8s} {'tc':>3s} {'relerr':>8s} "
        f"{'torch ms':>9s} {'torch/rulec':>11s} {'tinygrad ms':>11s} {'tinygrad/rulec':>14s}")
  for shape in rows:
    for dt in args.dtypes.split(","):
      try: tt = torch_time(dt, shape, args.reps)
      except Exception as e:
        print(f"  (torch failed: {type(e).__name__}: {str(e)[:120]})")
        tt = None
      tg, how = (None, "skipped") if args.no_tinygrad else tinygrad_time(dt, shape, max(5, args.reps // 2))
      for tile in tiles:
        try: ms, tc, err = rulec_time(dt, shape, args.reps, tile)
        except Exception as e:
          print(f"{shape[0]:28s} {dt:9s} {tile or 'default':20s} failed: {type(e).__name__}: {str(e)[:200]}")
          continue
        tf = flops(*shape[1:5]) / ms / 1e9
        print(f"{shape[0]:28s} {dt:9s} {tile or 'default':20s} {ms:9.3f} {tf:8.1f} {'yes' if tc else 'no':>3s} {err:8.1e} "
              f"{tt if tt is not None else float('nan'):9.3f} {(tt / ms) if tt else float('nan'):11.2f} "
              f"{tg if tg is not None else float('nan'):11.3f} {(tg / ms) if tg else float('nan'):14.2f}")
      if tg is None and not args.no_tinygrad: print(f"  (tinygrad: {how})")
      elif tg is not None: print(f"  (tinygrad ran with {how})")


if __name__ == "__main__":
  main()
