"""The wheel must carry every package and the rules/ files (`pip install .` must work)."""
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_package_is_listed_in_pyproject():
  cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
  listed = set(cfg["packages"])
  found = {".".join(p.parent.relative_to(ROOT).parts) for top in ("engine", "codegen", "runtime", "rulec")
           for p in (ROOT / top).rglob("__init__.py")}
  assert found <= listed, f"add to [tool.setuptools] packages in pyproject.toml: {sorted(found - listed)}"
  assert cfg["package-dir"]["rulec._rules"] == "rules"
  assert "*.rules" in cfg["package-data"]["rulec._rules"] and "*.lark" in cfg["package-data"]["rulec.engine.lang"]
