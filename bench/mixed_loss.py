"""How far a half-precision GPT-2 block's loss and gradients land from the float32 ones, rulec beside torch.

    python bench/mixed_loss.py [--device CPU|CL] [--size tiny|small|full] [--row "GPT-2 block fwd+bwd"]

Issue #35 asks that the block's loss in bfloat16 be within torch's bfloat16 error of the float32 loss. Two losses
of the block's output are computed on the host in float64, the same way for every side: a language model's head
(cross-entropy of layernorm(out) @ W, a fixed 256-word head, fixed targets), and the loss whose gradient
bench/models.py's fwd+bwd rows take, sum(out * dout) / out.size (it nearly cancels: its absolute error is shown),
with the row's own inputs, weights and dout (models.arrays). Each side runs the row in float32, under autocast (float32 weights, matmuls in the
half dtype) and wholly in the half dtype (bench/models.py --dtype). The error columns are against the float32 run of
the reference (torch on its device with TF32 off; rulec's own float32 run when torch is absent), and the float64 run
shows how far float32 itself is from exact. Speed is bench/models.py's business; this prints errors only.
"""
from __future__ import annotations

import argparse
import math
import os
import platform
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402  (bench/models.py: the rows, their arrays and both sides' forward)

MODES = ["float32", "float64", "autocast bfloat16", "autocast float16", "bfloat16", "float16"]


def set_mode(mode: str) -> None:
  models.DTYPE, models.AUTOCAST = ("float32", mode.split()[1]) if mode.startswith("autocast") else (mode, None)


def head_loss(out: np.ndarray) -> float:
  """A language model's loss over the block's output, on the host in float64 (the same for every side and mode):
  cross-entropy of layernorm(out) @ W against fixed targets, W a fixed 256-word head."""
  rng = np.random.default_rng(35)
  w = rng.standard_normal((out.shape[-1], 256)) / math.sqrt(out.shape[-1])
  h = (out - out.mean(-1, keepdims=True)) / np.sqrt(out.var(-1, keepdims=True) + 1e-5)
  logits = h.reshape(-1, out.shape[-1]) @ w
  target = rng.integers(0, 256, logits.shape[0])
  m = logits.max(-1, keepdims=True)
  logp = logits - m - np.log(np.exp(logits - m).sum(-1, keepdims=True))
  return float(-logp[np.arange(len(target)), target].mean())


def loss_and_grads(outs: list[np.ndarray], dout: np.ndarray) -> tuple[tuple[float, float], list[np.ndarray]]:
  out = outs[0].astype(np.float64)
  return (head_loss(out), float(np.sum(out * dout) / out.size)), [g.astype(np.float64) for g in outs[1:]]


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
  for mode in MODES:
    set_mode(mode)
    if torch is not None and not (mode == "float64" and tdev == "cpu" and size == "full"):
      results["torch", mode] = torch_run(torch, row, s, tdev, dout)
    if mode != "float64":   # (rulec's float64 would be its own CPU loops; torch's is the exact-ish reference)
      results["rulec", mode] = rulec_run(lib, row, s, dout)
  ref_side = "torch" if torch is not None else "rulec"
  (ref_head, ref_dout), ref_grads = results[ref_side, "float32"]
  print(f"# {a.row} {s} on rulec {a.device}"
        + (f", torch {torch.__version__} on {tdev} (TF32 off)" if torch is not None else ", torch absent")
        + f"; {platform.machine()} {platform.node()}; reference: {ref_side} float32")
  print("# head loss: cross-entropy of layernorm(out) @ W (a fixed 256-word head, float64 on the host); "
        "dout loss: sum(out * dout) / out.size (the fwd+bwd rows' loss: small, it cancels)")
  print(f"{'side':6} {'mode':18} {'head loss':>12} {'rel err':>9} {'dout loss':>14} {'abs err':>9} {'grads rel err':>14}")
  for (side, mode), ((head, dl), grads) in results.items():
    print(f"{side:6} {mode:18} {head:12.8f} {abs(head - ref_head) / abs(ref_head):9.2e} {dl:14.6e} "
          f"{abs(dl - ref_dout):9.2e} {grad_err(grads, ref_grads):14.2e}")
  if torch is not None:
    for mode in ("autocast bfloat16", "bfloat16", "autocast float16", "float16"):
      r, t = (abs(results[x, mode][0][0] - ref_head) for x in ("rulec", "torch"))
      print(f"head loss error {mode}: rulec {r:.2e}, torch {t:.2e} (rulec / torch {r / (t or 1e-300):.2f})")


if __name__ == "__main__":
  main()
