"""Helper libraries: what the `use` line of a rules file names.

A helper library is a module of plain functions the project marked `@rule_helper` (engine/lang/capability.py);
a rules file may call those and nothing else of it. The shipped rules name the project's libraries by a short
name, `use symbolic (fold_constants)`, never by a Python module path, so moving a Python file never touches a
rules file. A rules file and the library that serves it share a name (rules/symbolic.rules and `symbolic`).

A user's own helpers come from the packages RULEC_HELPER_PACKAGES lists (comma-separated top-level names), and
are named by module path: `use mypkg.helpers (f)`, functions marked with `rulec.rule_helper`.

The table names modules of the layers above the rule language (the scheduler's, codegen's, autograd's): the
language imports a library by name when a rules file that uses it loads, as a plugin system does, so this is the
one place a lower layer names a higher one, as data (tests/tools/test_layers.py reads imports, not this table).
"""
from __future__ import annotations

import importlib
import inspect
import os
from typing import Any, Callable

from rulec.engine.lang.capability import is_rule_helper

# library name -> the module that serves it (its rules file, where there is one, has the same name)
LIBRARIES: dict[str, str] = {
  "early": "rulec.engine.sched.early",            # rules/early.rules
  "bufferize": "rulec.engine.sched.bufferize",    # rules/bufferize.rules
  "rangeify": "rulec.engine.sched.rangeify",      # rules/rangeify.rules
  "symbolic": "rulec.engine.sched.symbolic",      # rules/symbolic.rules
  "multi": "rulec.engine.sched.multi",            # rules/multi.rules
  "decomp": "rulec.codegen.decomp",               # rules/decomp.rules
  "online": "rulec.codegen.online",               # rules/online.rules
  "gradient": "rulec.engine.autograd.gradient",   # rules/gradient.rules
}


def helper_packages() -> tuple[str, ...]:
  """The top-level packages a user's helper modules may come from (RULEC_HELPER_PACKAGES)."""
  return tuple(p.strip() for p in os.environ.get("RULEC_HELPER_PACKAGES", "").split(",") if p.strip())


def _refusal(name: str) -> str:
  known = ", ".join(sorted(LIBRARIES))
  if (lib := next((k for k, m in LIBRARIES.items() if m == name), None)) is not None:
    return f"'{name}' is a module path; rules name rulec's helpers by library: use {lib} (...)"
  extra = helper_packages()
  where = f", or a module of the packages RULEC_HELPER_PACKAGES lists ({', '.join(extra)})" if extra else \
    " (a module of your own package, once RULEC_HELPER_PACKAGES names it)"
  return f"'{name}' is not a helper library: rulec's are {known}{where}"


def resolve_library(name: str) -> tuple[Any | None, str | None]:
  """The module a `use` line names, if it may be used; returns (module, None) or (None, why not)."""
  module = LIBRARIES.get(name)
  if module is None:
    top = name.split(".")[0]
    if top == "rulec" or top not in helper_packages(): return None, _refusal(name)   # rulec's own: by library
    if any(part.startswith("_") for part in name.split(".")):
      return None, f"'{name}' is a private module; helpers come from public modules"
    module = name
  try:
    return importlib.import_module(module), None
  except (Exception, SystemExit) as e:   # a module that fails (or exits) on import is a diagnostic, not a crash
    return None, f"cannot import helper module '{name}': {type(e).__name__}: {e}"


def resolve_helper(mod: Any, name: str) -> tuple[Callable | None, str | None]:
  """The function `mod.name` if the project marked it with @rule_helper; else (None, why)."""
  if name.startswith("_"): return None, f"'{name}' is private; helpers are public functions marked @rule_helper"
  fn = getattr(mod, name, None)
  if fn is None: return None, f"module '{mod.__name__}' has no helper '{name}'"
  if not inspect.isfunction(fn): return None, f"'{mod.__name__}.{name}' is not a plain function"
  if not is_rule_helper(mod.__name__, name, fn):
    return None, f"'{mod.__name__}.{name}' is not a rule helper (only functions marked @rule_helper can be used)"
  return fn, None


def library_helpers(name: str) -> dict[str, Callable]:
  """The helpers of the library `name` (imported if it may be): for editors' completion."""
  mod, _ = resolve_library(name)
  if mod is None: return {}
  return {n: fn for n, fn in vars(mod).items() if inspect.isfunction(fn) and is_rule_helper(mod.__name__, n, fn)}


__all__ = ["LIBRARIES", "helper_packages", "resolve_library", "resolve_helper", "library_helpers"]
