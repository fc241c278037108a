"""The wheel installs one package, `rulec`, carrying every subpackage and the rules/ files (`pip install .`)."""
import tomllib
import zipfile
from pathlib import Path

from tests.helpers import build_wheel, copy_sources, package_dir

ROOT = Path(__file__).resolve().parents[2]
MAPPED = {"engine": "rulec.engine", "codegen": "rulec.codegen", "runtime": "rulec.runtime", "rulec": "rulec"}


def _setuptools() -> dict:
  return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_package_is_listed_in_pyproject():
  cfg = _setuptools()
  listed = set(cfg["packages"])
  found = {".".join([MAPPED[top], *p.parent.relative_to(ROOT / top).parts]) for top in MAPPED
           for p in (ROOT / top).rglob("__init__.py")}
  assert found <= listed, f"add to [tool.setuptools] packages in pyproject.toml: {sorted(found - listed)}"
  assert all((ROOT / package_dir(p, cfg["package-dir"])).is_dir() for p in listed), "a listed package has no folder"
  assert cfg["package-dir"]["rulec.rules"] == "rules"
  assert "*.rules" in cfg["package-data"]["rulec.rules"] and "*.lark" in cfg["package-data"]["rulec.engine.lang"]


def test_the_wheel_installs_rulec_and_nothing_else(tmp_path):
  src = tmp_path / "src"
  src.mkdir()
  copy_sources(src)
  wheel = build_wheel(src, tmp_path / "dist")
  names = zipfile.ZipFile(wheel).namelist()
  top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
  assert top == {"rulec"}, f"the wheel installs other top-level names: {sorted(top - {'rulec'})}"
  # the layers and the rules are inside it, where the package expects them
  for path in ("rulec/engine/ir/uop.py", "rulec/engine/lang/rules.lark", "rulec/codegen/pipeline.py",
               "rulec/runtime/devices.py", "rulec/rules/symbolic.rules", "rulec/cli.py"):
    assert path in names, path
  # setuptools' own record of it, where the wheel has one (the fallback builder in tests/helpers.py writes none)
  for info in (n for n in names if n.endswith(".dist-info/top_level.txt")):
    assert zipfile.ZipFile(wheel).read(info).decode().split() == ["rulec"]
  # and setup.py's build step ran (or the fallback builder's copy of it): every rule set compiled into a module
  built = {n.rsplit("/", 1)[1] for n in names if n.startswith("rulec/engine/lang/shipped_matchers/")}
  assert {"__init__.py", "symbolic.py", "earliest.py", "split_kernels.py"} <= built, sorted(built)
