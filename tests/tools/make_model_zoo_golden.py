"""Writes tests/data/model_zoo_golden.npz: tests/frontend/test_model_zoo.py's cases run on tinygrad 0.14.

    DEV=PYTHON python tests/tools/make_model_zoo_golden.py [case ...]

Needs tinygrad==0.14.0 installed (`pip install '.[bench]'`). DEV=PYTHON (tinygrad's pure-Python device, the
default here) needs no compiler; DEV=CPU needs clang. The cases take their weights and inputs from seeded numpy
generators, so the file holds outputs only, under "<case>/<name>"; naming cases rewrites just those.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

os.environ.setdefault("DEV", "PYTHON")
REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import tinygrad  # noqa: E402
from tinygrad import Context, Tensor, TinyJit, Variable, dtypes, nn  # noqa: E402

from tests.frontend.test_model_zoo import CASES, GOLDEN  # noqa: E402


def main() -> None:
  names = sys.argv[1:] or list(CASES)
  lib = SimpleNamespace(Tensor=Tensor, nn=nn, dtypes=dtypes, TinyJit=TinyJit, Context=Context, Variable=Variable)
  old: dict[str, np.ndarray] = {}
  if GOLDEN.exists():
    with np.load(GOLDEN, allow_pickle=False) as z: old = {k: z[k] for k in z.files if k.split("/")[0] not in names}
  new = dict(old)
  new["_meta/tinygrad"] = np.array(f"tinygrad {getattr(tinygrad, '__version__', '0.14.0')} DEV={os.environ['DEV']}")
  GOLDEN.parent.mkdir(parents=True, exist_ok=True)
  for name in names:
    t0 = time.perf_counter()
    for k, v in CASES[name](lib).items(): new[f"{name}/{k}"] = np.asarray(v)
    np.savez_compressed(GOLDEN, **new)   # (after each case: a slow device loses nothing to a later failure)
    print(f"{name}: {time.perf_counter() - t0:.1f}s", flush=True)
  print(f"wrote {GOLDEN} ({GOLDEN.stat().st_size} bytes, {len(new)} arrays)")


if __name__ == "__main__":
  main()
