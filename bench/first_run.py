"""The README's snippet in a new process with empty caches, as a new user first runs it: rulec installed from a wheel
of this checkout (`pip install .`, whose build compiles the shipped rules: engine/lang/shipped.py), rulec run from
the checkout (no shipped matchers: Lark, the checker and the compiler run), and tinygrad 0.14 on its CPU device.

  cold  a new process, every cache empty: RULEC_CACHE_DIR, tinygrad's cache (XDG_CACHE_HOME)
  warm  a new process with the caches the cold one left

Wall time of the whole process (interpreter start, imports, the program), median of --reps. Python's bytecode
caches are on for all three (PYTHONDONTWRITEBYTECODE is unset; pip byte-compiles an installed wheel, the checkout's
and tinygrad's are written by an untimed first run). tinygrad's CPU device compiles with `clang` from PATH.

Run:  python bench/first_run.py [--reps 5]
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SNIPPET = {
  "rulec": "from rulec import Tensor\n"
           "x = Tensor([[1.0, 2.0], [3.0, 4.0]])\n"
           "print(((x @ x.T).relu() + 1).softmax(-1).numpy())\n"
           "print(len(Tensor.schedule(x.softmax(-1))), 'kernels')\n",
  # (tinygrad 0.14 has no Tensor.schedule: its schedule is a LINEAR of kernels)
  "tinygrad": "from tinygrad import Tensor\n"
              "x = Tensor([[1.0, 2.0], [3.0, 4.0]])\n"
              "print(((x @ x.T).relu() + 1).softmax(-1).numpy())\n"
              "print(len(x.softmax(-1).schedule_linear().src), 'kernels')\n",
}


def install_wheel(tmp: Path) -> Path:
  """A venv with a wheel of this checkout installed; its dependencies come from this environment (a .pth line)."""
  subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                  str(tmp / "dist"), str(REPO)], check=True, cwd=tmp)
  venv = tmp / "venv"
  subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
  py = venv / "bin" / "python"
  purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                           check=True, capture_output=True, text=True).stdout.strip()
  Path(purelib, "_outer.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
  subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index",
                  "--ignore-installed", "-q", *map(str, (tmp / "dist").glob("rulec-*.whl"))], check=True)
  return py


def timed(argv: list[str], cwd: Path, env: dict) -> float:
  t = time.perf_counter()
  proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
  took = time.perf_counter() - t
  if proc.returncode != 0 or "kernels" not in proc.stdout: raise RuntimeError(f"{argv}: {proc.stderr[-2000:]}")
  return took


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--reps", type=int, default=5)
  args = ap.parse_args()
  base = {k: v for k, v in os.environ.items()
          if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPATH") and not k.startswith(("RULEC_", "DEV", "CPU"))}
  with tempfile.TemporaryDirectory() as d:
    tmp = Path(d)
    installed = install_wheel(tmp)
    run_dir = tmp / "run"
    run_dir.mkdir()
    for name, text in SNIPPET.items(): (run_dir / f"snippet_{name}.py").write_text(text)
    who = {
      "rulec (wheel)": ([str(installed), "snippet_rulec.py"], run_dir, {}),
      # (from the checkout: its folder first on the path, as `python snippet.py` there would have it)
      "rulec (checkout)": ([sys.executable, str(run_dir / "snippet_rulec.py")], run_dir, {"PYTHONPATH": str(REPO)}),
      "tinygrad 0.14": ([sys.executable, "snippet_tinygrad.py"], run_dir, {"DEV": "CPU"}),
    }
    times: dict[str, dict[str, list[float]]] = {k: {"cold": [], "warm": []} for k in who}
    for argv, cwd, extra in who.values():   # (untimed: Python writes the bytecode of what it imports)
      timed(argv, cwd, {**base, **extra, "RULEC_CACHE_DIR": str(tmp / "x"), "XDG_CACHE_HOME": str(tmp / "x")})
    for rep in range(args.reps):
      for k, (argv, cwd, extra) in who.items():
        cache = tmp / f"cache-{k.split()[0]}-{k.split()[-1].strip('()')}-{rep}"
        env = {**base, **extra, "RULEC_CACHE_DIR": str(cache / "rulec"), "XDG_CACHE_HOME": str(cache)}
        times[k]["cold"].append(timed(argv, cwd, env))
        times[k]["warm"].append(timed(argv, cwd, env))
  print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}; Python {platform.python_version()}")
  print("the README snippet, whole process (s), median of", args.reps)
  tg = {m: statistics.median(times["tinygrad 0.14"][m]) for m in ("cold", "warm")}
  print(f"{'':<18} {'cold':>7} {'warm':>7} {'cold / tinygrad':>16} {'warm / tinygrad':>16}")
  for k, t in times.items():
    c, w = statistics.median(t["cold"]), statistics.median(t["warm"])
    print(f"{k:<18} {c:>7.2f} {w:>7.2f} {c / tg['cold']:>16.2f} {w / tg['warm']:>16.2f}")


if __name__ == "__main__":
  main()
