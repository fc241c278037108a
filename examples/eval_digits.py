"""Load a DigitsNet saved by examples/train_digits.py and print its accuracy on the held-out digits.

  python examples/eval_digits.py [PATH] [--device CPU|NUMPY|CL]

The test split is the one train_digits.py held out (same seed), so the accuracy is the one it printed.
"""
from __future__ import annotations

import argparse
import sys
import time

import train_digits as td


def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("path", nargs="?", default=td.DEFAULT_OUT, help=f"a .safetensors file (default {td.DEFAULT_OUT})")
  ap.add_argument("--device", default=None, help="CPU (default), NUMPY or CL")
  args = ap.parse_args(argv)
  device = td.use_device(args.device)
  _, _, xte, yte = td.load_data()
  model = td.load(args.path)
  t0 = time.perf_counter()
  acc = td.accuracy(model, xte, yte)
  print(f"device {device}: {args.path}: test accuracy {acc * 100:.2f}% on {len(xte)} digits "
        f"({time.perf_counter() - t0:.2f} s)")
  return 0


if __name__ == "__main__":
  sys.exit(main())
