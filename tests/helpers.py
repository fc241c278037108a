"""Shared test helpers: compile rules from text without touching the default library; subprocess environments."""
from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from pathlib import Path


import numpy as np

from rulec.engine.lang.compiler import generate
from rulec.engine.lang.interp import InterpretedMatcher
from rulec.engine.lang.loader import check_sources
from rulec.engine.tensor import Tensor


class TextMatcher:
  """A compiled matcher for one rule set of a rules text (bypasses the disk cache)."""
  def __init__(self, text: str, ruleset: str, path: str = "t.rules"):
    self.lib = check_sources({path: text})
    assert not self.lib.errors, "\n".join(d.render(text) for d in self.lib.errors)
    self.rules = self.lib.flat_rules(ruleset)
    self.source = generate(self.rules, self.lib.helpers_of, title=ruleset)
    ns: dict = {}
    exec(compile(self.source, f"<{ruleset}>", "exec"), ns)
    self.dispatch = ns["DISPATCH"]
    self.reference = InterpretedMatcher(self.rules, self.lib.helpers_of)

  def rewrite(self, node, ctx=None):
    fn = self.dispatch.get(node.op)
    return None if fn is None else fn(node, ctx)


REPO = Path(__file__).resolve().parent.parent


def subprocess_env(**extra: str) -> dict:
  """os.environ for a child Python that imports this checkout first (keeping any PYTHONPATH already set)."""
  path = os.pathsep.join([str(REPO)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
  return {**os.environ, "PYTHONPATH": path, **extra}


def on(device: str, data, dtype, fn) -> np.ndarray:
  """fn applied to a Tensor of data on device, as numpy."""
  return fn(Tensor(data, dtype=dtype, device=device)).numpy()


def available_devices(first=("CPU", "NUMPY")) -> list[str]:
  """The devices `first` and CL where OpenCL has a device here (PoCL in CI)."""
  out = list(first)
  try:
    import pyopencl  # noqa: F401
    from rulec.runtime import cl_device
    cl_device.get_device()
    out.append("CL")
  except Exception: pass
  return out


def same_as_reference(device: str, data, dtype, fn) -> np.ndarray:
  """fn on device, checked bit for bit against the NUMPY reference device (NaN == NaN, -0.0 == 0.0 here)."""
  got, ref = on(device, data, dtype, fn), on("NUMPY", data, dtype, fn)
  np.testing.assert_array_equal(got, ref)
  return got


# *** the wheel ***

WHEEL_SOURCES = ("engine", "codegen", "runtime", "rulec", "rules", "pyproject.toml", "setup.py", "README.md")


def copy_sources(dst: Path) -> None:
  """What a wheel is built from (the folders pyproject.toml maps, its own files), copied from this checkout."""
  repo = Path(__file__).resolve().parent.parent
  for name in WHEEL_SOURCES:
    if (repo / name).is_dir(): shutil.copytree(repo / name, dst / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    else: shutil.copy(repo / name, dst / name)


def build_wheel(src: Path, dist: Path) -> Path:
  """A wheel of the checkout: `pip wheel` where setuptools can build one (setuptools >= 70.1 or the `wheel`
  package); else assembled from pyproject.toml's [tool.setuptools] packages, package-dir and package-data,
  as setuptools lays them out (pip then installs it as it would any wheel)."""
  import importlib.util   # (only the wheel tests need setuptools: not every test that imports this module)
  import setuptools
  if importlib.util.find_spec("wheel") is not None or tuple(map(int, setuptools.__version__.split(".")[:2])) >= (70, 1):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
                    "-w", str(dist), str(src)], check=True, capture_output=True, timeout=120)
    return next(dist.glob("rulec-*.whl"))
  cfg = tomllib.loads((src / "pyproject.toml").read_text())
  proj, st = cfg["project"], cfg["tool"]["setuptools"]
  name, version = proj["name"], proj["version"]
  files: dict[str, bytes] = {}
  for pkg in st["packages"]:
    d = src / package_dir(pkg, st.get("package-dir", {}))
    globs = ["*.py", *st.get("package-data", {}).get(pkg, [])]
    for g in globs:
      for f in d.glob(g): files[f"{pkg.replace('.', '/')}/{f.name}"] = f.read_bytes()
  # (and setup.py's build step: the shipped rules compiled into matcher modules, engine/lang/shipped.py)
  from rulec.engine.lang import loader, shipped
  with tempfile.TemporaryDirectory() as d:
    out, rules = Path(d) / "shipped_matchers", src / "rules"
    shipped.build(out, loader.RuleLibrary(loader.rule_files([rules])), rules)
    for f in sorted(out.glob("*.py")): files[f"rulec/engine/lang/shipped_matchers/{f.name}"] = f.read_bytes()
  di = f"{name}-{version}.dist-info"
  files[f"{di}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()
  files[f"{di}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: tests/lang/test_user_rules.py\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
  groups = {"console_scripts": proj["scripts"], **proj.get("entry-points", {})}
  files[f"{di}/entry_points.txt"] = "".join(f"[{g}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) + "\n"
                                            for g, eps in groups.items()).encode()
  record = "".join(f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(b).digest()).rstrip(b'=').decode()},{len(b)}\n"
                   for p, b in files.items()) + f"{di}/RECORD,,\n"
  files[f"{di}/RECORD"] = record.encode()
  dist.mkdir(parents=True, exist_ok=True)
  whl = dist / f"{name}-{version}-py3-none-any.whl"
  with zipfile.ZipFile(whl, "w", zipfile.ZIP_DEFLATED) as z:
    for p, b in files.items(): z.writestr(p, b)
  return whl


def package_dir(pkg: str, package_dir: dict[str, str]) -> str:
  """Where setuptools finds `pkg`: its nearest mapped parent's folder, then the rest of its name as folders."""
  parts = pkg.split(".")
  for n in range(len(parts), 0, -1):
    if ".".join(parts[:n]) in package_dir: return "/".join([package_dir[".".join(parts[:n])], *parts[n:]])
  return "/".join(parts)


def shipped_rules_without(tmp: Path, rule: str, ruleset: str) -> str:
  """A rules directory under tmp whose `ruleset` is rules/fusion.rules' shipped set less `rule` (a set a user's
  directory defines replaces the shipped set of that name), for RULEC_RULES: a test of what one rule changes."""
  text = (Path(__file__).resolve().parents[1] / "rules" / "fusion.rules").read_text()
  start = text.index(f"ruleset {ruleset}:")
  end = text.find("\nruleset ", start + 1)
  lines, out, skip = text[start:end if end >= 0 else None].splitlines(), [], False
  for line in lines:
    if line.startswith("  rule "): skip = line.startswith(f"  rule {rule}:")
    elif not line.startswith("    "): skip = False
    if not skip: out.append(line)
  assert len(out) < len(lines), f"no rule {rule} in {ruleset}"
  (tmp / "without").mkdir(exist_ok=True)
  (tmp / "without" / "fusion.rules").write_text("\n".join(out) + "\n")
  return str(tmp / "without")


def with_and_without_rule(monkeypatch, tmp: Path, rule: str, ruleset: str, measure):
  """(measure() with the shipped rules, measure() with `rule` taken out of `ruleset`), each on a cleared schedule
  cache; the shipped rules are in force again afterwards."""
  from rulec.engine.sched import cache as schedule_cache
  schedule_cache.clear()
  shipped = measure()
  monkeypatch.setenv("RULEC_RULES", shipped_rules_without(tmp, rule, ruleset))
  schedule_cache.clear()
  without = measure()
  monkeypatch.delenv("RULEC_RULES")
  schedule_cache.clear()
  return shipped, without
