"""The wheel's build step: setuptools' own, then the shipped rules compiled into matcher modules
(engine/lang/shipped.py), so a fresh install's first run does not compile them. Everything else about the
package is in pyproject.toml."""
import sys
import types
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class build_py_with_matchers(build_py):
  def run(self):
    super().run()
    out = Path(self.build_lib) / "rulec" / "engine" / "lang" / "shipped_matchers"
    # rulec's own modules from this source tree, without running rulec/__init__.py (it imports the whole
    # front end); the rule compiler needs lark, attrs and numpy, which pyproject.toml's build-system lists
    saved = {k: sys.modules.pop(k) for k in [m for m in sys.modules if m == "rulec" or m.startswith("rulec.")]}
    pkg = types.ModuleType("rulec")
    pkg.__path__ = [str(ROOT / "rulec"), str(ROOT)]
    sys.modules["rulec"] = pkg
    try:
      from rulec.engine.lang import loader, shipped
      names = shipped.build(out, loader.RuleLibrary(loader.rule_files()), loader.default_rules_dir())
      print(f"rulec: compiled {len(names)} rule sets into {out}")
    except Exception as e:   # the package works without them: its first run compiles the rules instead
      print(f"rulec: warning: the shipped rules were not compiled ({type(e).__name__}: {e}); the first run will "
            "compile them", file=sys.stderr)
    finally:
      for k in [m for m in sys.modules if m == "rulec" or m.startswith("rulec.")]: del sys.modules[k]
      sys.modules.update(saved)


setup(cmdclass={"build_py": build_py_with_matchers})
