"""The house runs one way: every import of the library and bench/ goes down the layers, and none makes a cycle.

The layers, bottom to top (docs/architecture.md draws them): the IR, the rule language, codegen, runtime, the
scheduler, realize, the Tensor front end, the JIT and verify, and the tools (the CLI, `nn`, the front door).
Imports are read from the source, module level and inside functions alike: a local import that dodges a cycle
is still an edge here. A module may import its own layer or any layer below it.
"""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# folder of the checkout -> the package it installs as (pyproject.toml's package-dir)
FOLDERS = {"rulec": "rulec", "engine": "rulec.engine", "codegen": "rulec.codegen", "runtime": "rulec.runtime",
           "bench": "bench"}
# module-name prefix -> layer, bottom (0) to top; the longest matching prefix decides
LAYERS = {
  "rulec.engine.ir": 0, "rulec.engine.diskcache": 0,
  "rulec.engine.lang": 1,
  "rulec.codegen": 2,
  "rulec.runtime": 3,
  "rulec.engine.sched": 4, "rulec.engine.trace": 4,
  "rulec.engine.realize": 5, "rulec.engine.tensor_eval": 5, "rulec.engine.memory_plan": 5,
  "rulec.engine.autograd": 6, "rulec.engine.tensor": 6,
  "rulec.engine.jit": 7, "rulec.engine.verify": 7,
  "rulec": 8, "rulec.engine": 8,
  "bench": 9,
}
LAYER_NAMES = ["ir", "lang", "codegen", "runtime", "sched", "realize", "frontend", "jit/verify", "tools", "bench"]


def modules() -> dict[str, Path]:
  out = {}
  for folder, package in FOLDERS.items():
    for f in sorted((ROOT / folder).rglob("*.py")):
      parts = list(f.relative_to(ROOT / folder).with_suffix("").parts)
      if parts[-1] == "__init__": parts = parts[:-1]
      out[".".join([package, *parts])] = f
  return out


def import_graph(mods: dict[str, Path]) -> dict[str, set[str]]:
  """module -> the project modules it imports (a `from package import name` counts the submodule `name` when
  there is one, else the package)."""
  def known(name: str) -> str | None:
    while name and name not in mods: name = name.rpartition(".")[0]
    return name or None
  graph: dict[str, set[str]] = defaultdict(set)
  for m, path in mods.items():
    package = m if path.name == "__init__.py" else m.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If) and _is_type_checking(block.test)
                   for stmt in block.body for n in ast.walk(stmt)}
    for node in ast.walk(tree):
      if id(node) in typing_only: continue   # `if TYPE_CHECKING:` imports never run
      if isinstance(node, ast.Import): names = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
          up = package.split(".")[:len(package.split(".")) - node.level + 1]
          base = ".".join(up + ([base] if base else []))
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
      else: continue
      for n in names:
        # a bench script imports its neighbours by their own names (bench/ is its sys.path[0])
        if m.startswith("bench.") and not n.startswith(("rulec", "bench")) and known("bench." + n): n = "bench." + n
        if (k := known(n)) is not None and k != m: graph[m].add(k)
  return graph


def _is_type_checking(test: ast.expr) -> bool:
  return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
    (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def layer(m: str) -> int:
  best = max((p for p in LAYERS if m == p or m.startswith(p + ".")), key=len)
  return LAYERS[best]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """The strongly connected components of more than one module (Tarjan, iterative)."""
  index: dict[str, int] = {}
  low: dict[str, int] = {}
  stack, on, out = [], set(), []
  for root in sorted(graph):
    if root in index: continue
    work = [(root, iter(sorted(graph[root])))]
    index[root] = low[root] = len(index)
    stack.append(root); on.add(root)
    while work:
      v, it = work[-1]
      for w in it:
        if w not in index:
          index[w] = low[w] = len(index)
          stack.append(w); on.add(w)
          work.append((w, iter(sorted(graph.get(w, ())))))
          break
        if w in on: low[v] = min(low[v], index[w])
      else:
        work.pop()
        if work: low[work[-1][0]] = min(low[work[-1][0]], low[v])
        if low[v] == index[v]:
          comp = []
          while True:
            w = stack.pop(); on.discard(w); comp.append(w)
            if w == v: break
          if len(comp) > 1: out.append(sorted(comp))
  return out


def test_every_module_has_a_layer():
  assert all(layer(m) is not None for m in modules())


def test_no_import_cycles():
  found = cycles(import_graph(modules()))
  assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_imports_run_down_the_layers():
  graph = import_graph(modules())
  up = sorted(f"{a} ({LAYER_NAMES[layer(a)]}) imports {b} ({LAYER_NAMES[layer(b)]})"
              for a, bs in graph.items() for b in bs if layer(b) > layer(a))
  assert not up, "imports from a lower layer to a higher one:\n" + "\n".join(up)


def test_the_checker_sees_a_cycle_and_an_upward_import():
  """The two checks above fail on what they are meant to catch (a graph made up here, not the project's)."""
  graph = {"rulec.engine.ir.a": {"rulec.engine.ir.b"}, "rulec.engine.ir.b": {"rulec.engine.ir.a"},
           "rulec.codegen.x": {"rulec.engine.sched.y"}, "rulec.engine.sched.y": set()}
  assert cycles(graph) == [["rulec.engine.ir.a", "rulec.engine.ir.b"]]
  assert layer("rulec.engine.sched.y") > layer("rulec.codegen.x")


def test_rules_files_name_helper_libraries_not_module_paths():
  """Every `use` line of the shipped rules names a helper library (engine/lang/libraries.py): moving a Python
  file never touches a rules file."""
  from rulec.engine.lang.libraries import LIBRARIES
  from rulec.engine.lang.loader import default_rules_dir, load_library
  used = {use.module for f in load_library().checked.files for use in f.uses}
  assert used and used <= set(LIBRARIES), sorted(used - set(LIBRARIES))
  assert default_rules_dir() == ROOT / "rules"
  # and a rules file that names a module path into rulec is refused, with the library to name instead
  from rulec.engine.lang.loader import check_sources
  lib = check_sources({"t.rules": "use rulec.engine.sched.symbolic (fold_constants)\nruleset s:\n  rule r: x + 0 => x\n"})
  (d,) = lib.errors
  assert d.code == "R301" and "use symbolic" in d.message
