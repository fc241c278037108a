"""How far a half-precision GPT-2 block's loss and gradients land from the float32 ones, rulec beside torch.

    python bench/mixed_loss.py [--device CPU|CL] [--size tiny|small|full] [--row "GPT-2 block fwd+bwd"]

Issue #35 asks that the block's loss in bfloat16 be within torch's bfloat16 error of the float32 loss. The loss is
the one whose gradient bench/models.py's fwd+bwd rows take: L = sum(out * dout) / out.size, with the row's own inputs,
weights and dout (models.arrays). Each side runs the row in float32, under autocast (float32 weights, matmuls in the
half dtype) and wholly in the half dtype (bench/models.py --dtype). The error columns are against the float32 run of
the reference (torch on its device with TF32 off; rulec's own float32 run when torch is absent), and the float64 run
shows how far float32 itself is from exact. Speed is bench/models.py's business; this prints errors only.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402  (bench/models.py: the rows, their arrays and both sides' forward)

MODES = [("float32", None), ("float64", None), ("autocast bfloat16", "bfloat16"), ("autocast float16", "float16"),
         ("bfloat16", None), ("float16", None)]


def set_mode(mode: str) -> None:
  models.DTYPE, models.AUTOCAST = ("float32", mode.split()[1]) if mode.startswith("autocast") else (mode, None)


def loss_and_grads(outs: list[np.ndarray], dout: np.ndarray) -> tuple[float, list[np.ndarray]]:
  out = outs[0].astype(np.float64)
  return float(np.sum(out * dout) / out.size), [g.astype(np.float64) for g in outs[1:]]


def rulec_run(lib, row, s, dout) -> tuple[float, list[np.ndarray]]:
  call, _ = models.lib_call(lib, row, s)
  return loss_and_grads([t.float().numpy() for t in call()], dout)


def torch_run(torch, row, s, dev, dout) -> tuple[float, list[np.ndarray]]:
  return loss_and_grads([t.detach().double().cpu().numpy() for t in models.torch_call(torch, row, s, dev)()], dout)


def grad_err(got: list[np.ndarray], want: list[np.ndarray]) -> float:
  """The largest of the gradients' relative errors, each in the 2-norm (max abs errors say little about a step)."""
  return max(float(np.linalg.norm(g - w) / (np.linalg.norm(w) or 1.0)) for g, w in zip(got, want))


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--device", default="CPU")
  ap.add_argument("--size", choices=["tiny", "small", "full"])
  ap.add_argument("--row", default="GPT-2 block fwd+bwd", help="a fwd+bwd row of bench/models.py")
  ap.add_argument("--no-torch", action="store_true")
  a = ap.parse_args()
  a.device = a.device.upper()
  size = a.size or ("small" if a.device.startswith("CPU") else "full")
  row = next(r for r in models.ROWS if r.name == a.row)
  if not row.backward: sys.exit(f"{a.row!r} has no backward: pick a fwd+bwd row")
  s = models.SHAPES[row.kind][size]
  import textgen
  textgen.use_device(a.device)
  lib = models.rulec_lib(a.device)
  torch = tdev = None
  if not a.no_torch:
    try:
      import torch
      tdev = "cuda" if not a.device.startswith("CPU") and torch.cuda.is_available() else "cpu"
      torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    except ImportError: torch = None
  dout = models.arrays(row, s)[0]["dout"].astype(np.float64)
  results: dict[tuple[str, str], tuple[float, list[np.ndarray]]] = {}
  for mode, _ in MODES:
    set_mode(mode)
    if torch is not None and not (mode == "float64" and tdev == "cpu" and size == "full"):
      results["torch", mode] = torch_run(torch, row, s, tdev, dout)
    if mode != "float64":   # (rulec's float64 would be its own CPU loops; torch's is the exact-ish reference)
      results["rulec", mode] = rulec_run(lib, row, s, dout)
  ref_side = "torch" if torch is not None else "rulec"
  ref_loss, ref_grads = results[ref_side, "float32"]
  print(f"# {a.row} {s} on rulec {a.device}"
        + (f", torch {torch.__version__} on {tdev} (TF32 off)" if torch is not None else ", torch absent")
        + f"; {platform.machine()} {platform.node()}; reference: {ref_side} float32")
  print(f"{'side':6} {'mode':18} {'loss':>14} {'|L - L32| / |L32|':>18} {'grads rel err':>14}")
  for (side, mode), (loss, grads) in results.items():
    rel = abs(loss - ref_loss) / (abs(ref_loss) or 1.0)
    print(f"{side:6} {mode:18} {loss:14.8g} {rel:18.2e} {grad_err(grads, ref_grads):14.2e}")
  if torch is not None:
    for mode in ("autocast bfloat16", "bfloat16", "autocast float16", "float16"):
      r, t = (abs(results[x, mode][0] - ref_loss) for x in ("rulec", "torch"))
      print(f"loss error {mode}: rulec {r:.2e}, torch {t:.2e} (rulec / torch {r / (t or 1e-300):.2f})")


if __name__ == "__main__":
  main()
