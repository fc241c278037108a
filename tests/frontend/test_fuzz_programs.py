"""Differential fuzzing of whole Tensor programs (tests/fuzz_programs.py) on every device.

Derandomized: the programs are the same on every run (RULEC_FUZZ_SEED, default 0, picks another set), and
there are 2,000 on NUMPY, 1,000 on CPU and 200 on CL (smaller ones there: each new CL kernel costs a PoCL
compile); RULEC_FUZZ_SCALE multiplies these counts (RULEC_FUZZ_SCALE=10 RULEC_FUZZ_SEED=7 for a wider run).

Each device's batch runs in child processes (a segfault or a hang is recorded as a crash of that program and
the batch goes on after it), and the batches of the selected devices run at the same time (the whole file
takes about 75 s of wall time on an idle 2-core machine, ~150 s of CPU). A failure prints one reproducer per
failure class as a standalone snippet, and the command that shrinks it.
"""
from __future__ import annotations

import concurrent.futures
import importlib.util
import os
import sys
import threading

import pytest

from tests import fuzz_programs as fp

SEED = int(os.environ.get("RULEC_FUZZ_SEED", "0"))
SCALE = float(os.environ.get("RULEC_FUZZ_SCALE", "1"))
COUNTS = {"NUMPY": 2000, "CPU": 1000, "CL": 200}   # (NUMPY was 3,000: CI time, session 30)


def count(device: str) -> int: return max(1, int(COUNTS[device] * SCALE))


def cl_missing() -> str | None:
  """Why the CL device cannot run here (None when it can)."""
  if importlib.util.find_spec("pyopencl") is None: return "the CL device needs pyopencl: pip install pyopencl pocl-binary-distribution"
  from rulec.runtime import cl_device
  try: cl_device.get_device()
  except cl_device.CLUnavailable as e: return f"no OpenCL device: {e}"
  return None


@pytest.fixture(scope="module")
def batches(request):
  """The batch of every selected device, all started at once (they overlap on a machine's cores)."""
  me = sys.modules[__name__]
  wanted = [it.callspec.params["device"] for it in request.session.items
            if getattr(it, "module", None) is me and hasattr(it, "callspec")]
  stop = threading.Event()
  pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(wanted)), thread_name_prefix="fuzz")
  runs = {d: pool.submit(fp.run_isolated, SEED, count(d), d, small=(d == "CL"), stop=stop)
          for d in dict.fromkeys(wanted) if not (d == "CL" and cl_missing())}
  yield runs
  stop.set()   # (after -x or ^C: the children still running are killed)
  pool.shutdown(wait=True, cancel_futures=True)


@pytest.mark.parametrize("device", list(COUNTS))
def test_random_programs_match_numpy(device, batches):
  if device == "CL" and (why := cl_missing()): pytest.skip(why)
  res = batches[device].result()
  report = fp.summarize(res, show=3, device=device, small=(device == "CL"))
  print(report)   # the throughput, also when it passes (pytest -s)
  if res["failures"]:
    first = res["failures"][0]
    how = (f"python tests/fuzz_programs.py --device {device} --seed {SEED} --start {first['index']} --n 1 --shrink"
           + (" --small" if device == "CL" else ""))
    pytest.fail(f"{report}\n\nshrink a failing program with: {how}", pytrace=False)
