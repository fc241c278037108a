"""Where a jitted GPT-2 decode step's time goes on CL: host time per launch against device time per kernel.

    python bench/cl_decode_probe.py [--layers 12] [--context 128] [--tokens 24] [--device CL]

A diagnostic for bench/generate.py's GPT-2 row (not a benchmark with peers). Three runs of examples/gpt2.py's step
(random weights, greedy) after its capture:
  wall     the median seconds of one step (the host waits for the token, so this is what a user sees);
  host     the seconds spent inside rulec's kernel launches of one step (enqueue only: nothing waits);
  device   with RULEC_CL_PROFILE=1 in a child process: each kernel's device time from its OpenCL event,
           summed per step, and the kernels that take most of it.
If wall is close to host, the step is launch-bound (fewer kernels or cheaper launches help); if close to
device, the kernels themselves are slow.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))


def side(args) -> dict:
  import textgen
  dev = textgen.use_device(args.device)
  import gpt2 as G
  from rulec.engine import realize as R
  m = G.GPT2(args.layers, 12, 768, max_context=args.context)
  G.load(m, G.random_weights(m, 0))
  m.generate([1, 2, 3], 4)   # run, capture, replay
  launches: list[float] = []
  orig = R._run
  def timed(*a):
    t0 = time.perf_counter()
    orig(*a)
    launches.append(time.perf_counter() - t0)
  R._run = timed
  _, times = m.generate([5], args.tokens)
  R._run = orig
  steps = len(times)
  out = {"device": dev, "wall_ms": sorted(times)[steps // 2] * 1e3, "kernels": len(launches) / steps,
         "host_ms": sum(launches) / steps * 1e3, "host_us_launch": sum(launches) / len(launches) * 1e6}
  if os.environ.get("RULEC_CL_PROFILE"):
    from rulec.runtime import cl_device
    cl_device.synchronize()
    cl_device.EVENTS.clear()
    _, times = m.generate([7], args.tokens)
    cl_device.synchronize()
    per = [(ev.profile.end - ev.profile.start) * 1e-9 for ev in cl_device.EVENTS]
    out["device_ms"] = sum(per) / len(times) * 1e3
    k = int(round(len(per) / len(times)))
    by_pos = [sum(per[i::k]) / len(times) * 1e6 for i in range(k)] if k else []
    out["slowest_us"] = sorted(((round(t, 1), i) for i, t in enumerate(by_pos)), reverse=True)[:12]
  return out


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--layers", type=int, default=12)
  ap.add_argument("--context", type=int, default=128)
  ap.add_argument("--tokens", type=int, default=24)
  ap.add_argument("--device", default="CL")
  ap.add_argument("--side", action="store_true", help=argparse.SUPPRESS)
  args = ap.parse_args()
  if args.side:
    print(json.dumps(side(args)))
    return
  rows = []
  for profile in ("", "1"):
    env = dict(os.environ, RULEC_CL_PROFILE=profile)
    cmd = [sys.executable, __file__, "--side", "--layers", str(args.layers), "--context", str(args.context),
           "--tokens", str(args.tokens), "--device", args.device]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if res.returncode: raise SystemExit(res.stderr[-3000:])
    rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
  plain, prof = rows
  print(f"GPT-2 decode, {args.layers} layers, context {args.context}, device {plain['device']}")
  print(f"  wall {plain['wall_ms']:.2f} ms/token; {plain['kernels']:.0f} launches; host {plain['host_ms']:.2f} ms "
        f"({plain['host_us_launch']:.1f} us per launch)")
  print(f"  device (profiled run) {prof.get('device_ms', float('nan')):.2f} ms/token; "
        f"profiled wall {prof['wall_ms']:.2f} ms")
  print(f"  slowest kernels (us per step, position in the step): {prof.get('slowest_us')}")


if __name__ == "__main__":
  main()
