"""Every example in docs/rules.md, run.

Conventions in docs/rules.md (also described at the top of that file):

* A fenced block whose info string starts with `rules` is a complete .rules
  file. It must check with no diagnostics at all (no errors, no warnings, no
  failing rule examples),
  unless the info string says `expect=R201` (or `expect=R201,R202`): then the
  set of codes reported must be exactly that set. `timeout=0.5` checks it
  with RULEC_EXAMPLE_TIMEOUT=0.5 (a bad example that runs too long).
  `extends=rules/symbolic.rules` means "the block is appended to that file
  of the repository"; the combined text is what is checked and loaded.
* An example is a `rules` block together with every `python` and `console`
  block after it, up to the next `rules` block. Blocks before the first
  `rules` block form examples with no rules file.
* A `python` block is executed with the rules block written to `doc.rules`
  (or, for `extends=`, to the path it names) in a fresh directory that is also
  the current directory, and with these names defined: UOp, Ops, dtypes,
  graph_rewrite, RewriteLoopError, RuleRuntimeError, RuleError, load_library,
  check_sources, InterpretedMatcher, raises (pytest.raises), path (the rules
  file), library (load_library([path]), None for a rules block with errors),
  rewrite(ruleset, node, **kw) (graph_rewrite(node, library.matcher(ruleset),
  **kw)), and x, y (UOp.variable("x", 0, 10), UOp.variable("y", 0, 10)).
  The python blocks of one example share one namespace.
* A `console` block holds commands (`$ ...`, continued by lines starting
  with `> `) and their expected output (stdout and stderr together). The
  commands run with bash in the same directory, with `rulec` and `python` on
  PATH meaning this checkout. `...` in the expected output matches any text.

Each test uses its own RULEC_CACHE_DIR.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path: sys.path.insert(0, str(REPO))

from rulec.engine.ir.dtypes import ALL_DTYPES, DTYPE_CLASSES, dtypes  # noqa: E402
from rulec.engine.lang.diagnostics import CODES, RuleError  # noqa: E402
from rulec.engine.lang.interp import InterpretedMatcher  # noqa: E402
from rulec.engine.lang.loader import check_sources, load_library  # noqa: E402
from rulec.engine.lang.names import BUILTINS  # noqa: E402
from rulec.engine.lang.parser import _PATTERN_OPS  # noqa: E402
from rulec.engine.lang.runtime import RuleRuntimeError  # noqa: E402
from rulec.engine.ir.ops import COMMUTATIVE, GROUPS, Ops  # noqa: E402
from rulec.engine.ir.rewrite import RewriteLoopError, graph_rewrite  # noqa: E402
from rulec.engine.ir.uop import UOp  # noqa: E402
from tests.helpers import subprocess_env  # noqa: E402

DOC = REPO / "docs" / "rules.md"
# a fenced block, possibly indented (inside a list item); the closing fence has the same indentation
FENCE = re.compile(r"^(?P<ind>[ \t]*)```(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=ind)```[ \t]*$", re.M | re.S)


class Block:
  def __init__(self, line: int, info: str, body: str):
    self.line, self.body = line, body
    words = info.split()
    self.lang = words[0] if words else ""
    self.opts = dict(w.split("=", 1) for w in words[1:] if "=" in w)

  @property
  def expect(self) -> set[str]:
    return set(filter(None, self.opts.get("expect", "").split(",")))


class Example:
  def __init__(self, rules: Block | None):
    self.rules = rules
    self.checks: list[Block] = []

  @property
  def id(self) -> str: return f"line{self.rules.line if self.rules else self.checks[0].line}"

  def rules_path(self) -> str: return self.rules.opts.get("extends", "doc.rules") if self.rules else "doc.rules"

  def rules_text(self) -> str:
    """The text of the file the block stands for (for extends=, the repository file plus the block)."""
    if "extends" not in self.rules.opts: return self.rules.body
    base = (REPO / self.rules.opts["extends"]).read_text()
    return base + ("" if base.endswith("\n") else "\n") + self.rules.body


def _dedent(body: str, ind: str) -> str:
  return "".join(l[len(ind):] if l.startswith(ind) else l.lstrip(" \t") for l in body.splitlines(keepends=True))


def parse_doc(text: str) -> list[Block]:
  return [Block(text.count("\n", 0, m.start()) + 1, m["info"].strip(), _dedent(m["body"], m["ind"]))
          for m in FENCE.finditer(text)]


def examples() -> list[Example]:
  out: list[Example] = []
  for b in parse_doc(DOC.read_text()):
    if b.lang == "rules": out.append(Example(b))
    elif b.lang in ("python", "console"):
      if not out: out.append(Example(None))
      out[-1].checks.append(b)
  return out


EXAMPLES = examples()
RULES_EXAMPLES = [e for e in EXAMPLES if e.rules is not None]
RUN_EXAMPLES = [e for e in EXAMPLES if e.checks]


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
  """A fresh cache and working directory for every test; no RULEC_* settings leak in."""
  for k in list(os.environ):
    if k.startswith("RULEC_"): monkeypatch.delenv(k)
  monkeypatch.setenv("RULEC_CACHE_DIR", str(tmp_path / "cache"))
  work = tmp_path / "work"
  work.mkdir()
  monkeypatch.chdir(work)
  return work


# *** the rules blocks check as stated ***

@pytest.mark.parametrize("ex", RULES_EXAMPLES, ids=lambda e: e.id)
def test_rules_block_checks(ex: Example, monkeypatch):
  if "timeout" in ex.rules.opts: monkeypatch.setenv("RULEC_EXAMPLE_TIMEOUT", ex.rules.opts["timeout"])
  if "file_timeout" in ex.rules.opts: monkeypatch.setenv("RULEC_EXAMPLE_FILE_TIMEOUT", ex.rules.opts["file_timeout"])
  lib = check_sources({os.path.basename(ex.rules_path()): ex.rules_text()}, examples=True)
  got = {d.code for d in lib.diagnostics}
  shown = "\n".join(d.render(ex.rules_text()) for d in lib.diagnostics)
  if ex.rules.expect:
    assert ex.rules.expect <= set(CODES), f"unknown code in expect= at docs/rules.md:{ex.rules.line}"
    assert got == ex.rules.expect, f"docs/rules.md:{ex.rules.line}: expected {sorted(ex.rules.expect)}, got:\n{shown}"
  else:
    assert not lib.diagnostics, f"docs/rules.md:{ex.rules.line} should check clean:\n{shown}"


# *** the python and console blocks run as stated ***

def _namespace(ex: Example, work: Path) -> dict:
  path = work / ex.rules_path()
  library = None
  if ex.rules is not None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(ex.rules_text())
    if not check_sources({path.name: ex.rules_text()}).errors: library = load_library([ex.rules_path()])

  def rewrite(ruleset: str, node: UOp, **kw) -> UOp:
    return graph_rewrite(node, library.matcher(ruleset), **kw)

  return {"UOp": UOp, "Ops": Ops, "dtypes": dtypes, "graph_rewrite": graph_rewrite, "RewriteLoopError": RewriteLoopError,
          "RuleRuntimeError": RuleRuntimeError, "RuleError": RuleError, "load_library": load_library,
          "check_sources": check_sources, "InterpretedMatcher": InterpretedMatcher, "raises": pytest.raises,
          "path": Path(ex.rules_path()), "library": library, "rewrite": rewrite,
          "x": UOp.variable("x", 0, 10), "y": UOp.variable("y", 0, 10)}


def _console(block: Block, work: Path):
  """(commands, expected output) pairs of a console block."""
  cmds: list[tuple[str, list[str]]] = []
  for line in block.body.splitlines():
    if line.startswith("$ "): cmds.append((line[2:], []))
    elif line.startswith("> ") and cmds and not cmds[-1][1]: cmds[-1] = (cmds[-1][0] + "\n" + line[2:], [])
    else:
      assert cmds, f"docs/rules.md:{block.line}: output before the first command"
      cmds[-1][1].append(line)
  return [(c, "\n".join(out)) for c, out in cmds]


def _shims(work: Path) -> Path:
  bin_dir = work.parent / "bin"
  bin_dir.mkdir(exist_ok=True)
  for name, cmd in (("rulec", f'"{sys.executable}" -m rulec.cli'), ("python", f'"{sys.executable}"')):
    p = bin_dir / name
    p.write_text(f'#!/bin/sh\nexec {cmd} "$@"\n')
    p.chmod(0o755)
  return bin_dir


def _matches(expected: str, actual: str) -> bool:
  norm = lambda s: "\n".join(l.rstrip() for l in s.strip("\n").splitlines())  # noqa: E731
  pattern = ".*?".join(re.escape(part) for part in norm(expected).split("..."))
  return re.fullmatch(pattern, norm(actual), re.S) is not None


@pytest.mark.parametrize("ex", RUN_EXAMPLES, ids=lambda e: e.id)
def test_example_runs(ex: Example, isolated: Path):
  ns = _namespace(ex, isolated)
  env = subprocess_env(PYTHONUNBUFFERED="1", PATH=f"{_shims(isolated)}{os.pathsep}{os.environ['PATH']}")
  for block in ex.checks:
    if block.lang == "python":
      code = compile(block.body, f"docs/rules.md:{block.line}", "exec")
      exec(code, ns)
      continue
    for cmd, expected in _console(block, isolated):
      proc = subprocess.run(["bash", "-c", cmd], cwd=isolated, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, timeout=120)
      assert _matches(expected, proc.stdout), \
        f"docs/rules.md:{block.line}: `{cmd}` printed:\n{proc.stdout}\nexpected:\n{expected}"


# *** the reference lists in the document match the engine ***

def test_every_diagnostic_code_has_an_example():
  text = DOC.read_text()
  shown = set().union(*(e.rules.expect for e in RULES_EXAMPLES))
  # codes a rules block cannot show (bytes that are not UTF-8, a file over 1 MiB) are shown by console blocks
  shown |= {c for e in RUN_EXAMPLES for b in e.checks if b.lang == "console"
            for c in re.findall(r": (?:error|warning) (R\d{3}):", b.body)}
  assert set(CODES) <= shown, f"codes with no example that triggers them: {sorted(set(CODES) - shown)}"
  for code, meaning in CODES.items():
    assert re.search(rf"^### {code}\b", text, re.M), f"no '### {code}' heading in docs/rules.md"


def test_groups_dtypes_and_builtins_are_listed():
  text = DOC.read_text()
  for name, ops in GROUPS.items():
    row = re.search(rf"^\| `{name}` \|(.*)\|\s*$", text, re.M)
    assert row, f"op group {name} is not in the group table"
    listed = set(re.findall(r"`([A-Z_0-9]+)`", row.group(1)))
    want = {o.name for o in ops} if len(ops) < len(Ops) else set()
    assert listed == want or (name == "All" and not listed), f"group {name}: table lists {sorted(listed)}"
  for name in list(ALL_DTYPES) + list(DTYPE_CLASSES): assert f"`{name}`" in text, f"dtype {name} is not listed"
  for name in BUILTINS: assert f"`{name}`" in text, f"builtin {name} is not listed"


def test_operator_table_matches_the_parser():
  text = DOC.read_text()
  for sym, op in _PATTERN_OPS.items():
    assert re.search(rf"^\| `{re.escape(sym)}` \| `{op}`[ |]", text, re.M), f"operator {sym} -> {op} missing from the table"
  comm = re.search(r"^Commutative ops: (.*)$", text, re.M)
  assert comm and set(re.findall(r"`([A-Z]+)`", comm.group(1))) == {o.name for o in COMMUTATIVE}
