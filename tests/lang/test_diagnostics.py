"""Diagnostics of the rule language.

* every code in `CODES` is triggered by a small rules source, and the
  diagnostic's code, severity and exact span are asserted (the span is also
  checked against the text it should underline);
* a handful of full `Diagnostic.render` outputs;
* rules files that try to reach Python are rejected with a located error, by
  the checker and by the loader (RuleError), and nothing in them runs;
* R001 messages say what was expected;
* the `rulec check` CLI: exit codes, JSON output, and the shipped rules/.

Columns are 1-based and `end_col` is exclusive, as in `rulec.engine.lang.ast.Span`.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path: sys.path.insert(0, str(REPO))

from rulec.engine.lang.diagnostics import CODES, EXAMPLE_CODES, Diagnostic, RuleError  # noqa: E402
from rulec.engine.lang.loader import RuleLibrary, check_sources, load_library  # noqa: E402
from rulec.engine.ir.uop import UOp  # noqa: E402
from rulec.cli import main as rulec  # noqa: E402
from tests.helpers import subprocess_env

H = "symbolic"    # a real helper library: fold_constants(alu), bounds_const(x)
C = len(f"use {H} (") + 1   # the column of the first name a `use {H} (` line declares


@pytest.fixture(autouse=True)
def isolated_env(tmp_path_factory, monkeypatch):
  """Keep the matcher cache out of the user's ~/.cache and make the environment deterministic."""
  cache = tmp_path_factory.mktemp("rulec-cache")
  monkeypatch.setenv("RULEC_CACHE_DIR", str(cache))
  monkeypatch.delenv("RULEC_STATS", raising=False)
  monkeypatch.delenv("RULEC_HELPER_PACKAGES", raising=False)
  return cache


def diags(src: str, path: str = "t.rules") -> list[Diagnostic]:
  return check_sources({path: src}).diagnostics


def loc(d: Diagnostic) -> tuple:
  return (d.code, d.severity, d.span.line, d.span.col, d.span.end_line, d.span.end_col)


def show(ds) -> str:
  return "\n".join(f"  {loc(d)} {d.message}" for d in ds) or "  (none)"


def only(src: str, code: str, path: str = "t.rules") -> Diagnostic:
  found = [d for d in diags(src, path) if d.code == code]
  assert len(found) == 1, f"expected one {code}, got:\n{show(diags(src, path))}"
  return found[0]


def underlined(src: str | bytes, line: int, col: int, end_col: int) -> str:
  if isinstance(src, bytes): src = src.decode("utf-8", errors="replace")
  return src.split("\n")[line - 1][col - 1:end_col - 1]


# *** every code, exactly located ***
# (id, source, code, severity, line, col, end_line, end_col, the text the span covers)
# Each source produces exactly this one diagnostic and nothing else.

CASES = [
  # syntax
  ("R001-missing-arrow", "ruleset s:\n  rule r: x + 0 x\n", "R001", "error", 2, 17, 2, 18, "x"),
  ("R001-missing-arrow-multichar", "ruleset s:\n  rule r: x + 0 foo\n", "R001", "error", 2, 17, 2, 20, "foo"),
  ("R001-missing-colon", "ruleset s\n  rule r: x + 0 => x\n", "R001", "error", 2, 3, 2, 7, "rule"),
  ("R002", "ruleset s:\n  rule r: x + 0 => x $ 1\n", "R002", "error", 2, 22, 2, 23, "$"),
  # ops, dtypes, arity
  ("R101-pattern", "ruleset s:\n  rule r: ADDD(x, y) => x + y\n", "R101", "error", 2, 11, 2, 15, "ADDD"),
  ("R101-alternation", "ruleset s:\n  rule r: (ADD|MULL)(x, y) => x + y\n", "R101", "error", 2, 16, 2, 20, "MULL"),
  ("R101-expression", "ruleset s:\n  rule r: x + 0 if x.op is ADDD => x\n", "R101", "error", 2, 28, 2, 32, "ADDD"),
  ("R102-name", "ruleset s:\n  rule r: x{intz} + 0 => x\n", "R102", "error", 2, 13, 2, 17, "intz"),
  ("R102-literal", "ruleset s:\n  rule r: x + 0{flaot} => x\n", "R102", "error", 2, 17, 2, 22, "flaot"),
  ("R103-binary", "ruleset s:\n  rule r: ADD(x) => x\n", "R103", "error", 2, 11, 2, 14, "ADD"),
  ("R103-ternary", "ruleset s:\n  rule r: WHERE(_, x) => x\n", "R103", "error", 2, 11, 2, 16, "WHERE"),
  ("R104-gt", "ruleset s:\n  rule r: x > y => x + y\n", "R104", "error", 2, 13, 2, 14, ">"),
  ("R104-matmul", "ruleset s:\n  rule r: x @ y => x + y\n", "R104", "error", 2, 13, 2, 14, "@"),
  # names
  ("R201", "ruleset s:\n  rule r: x + 0 => x + y\n", "R201", "error", 2, 24, 2, 25, "y"),
  ("R201-continuation-line", "ruleset s:\n  rule r: x + 0\n    => x + y\n", "R201", "error", 3, 12, 3, 13, "y"),
  ("R202", "ruleset s:\n  rule r: x + y => x\n", "R202", "warning", 2, 15, 2, 16, "y"),
  ("R203-twice", "ruleset s:\n  rule r: ADD(x:CONST, x:CONST) => x\n", "R203", "error", 2, 24, 2, 25, "x"),
  ("R203-each", "ruleset s:\n  rule r: ADD(each x) => 1\n", "R203", "error", 2, 20, 2, 21, "x"),
  ("R203-two-names", "ruleset s:\n  rule r: a:(b:CONST) + 0 => b\n", "R203", "error", 2, 11, 2, 12, "a"),
  ("R204-ctx", "ruleset s:\n  rule r: ctx + 0 => ctx\n", "R204", "error", 2, 11, 2, 14, "ctx"),
  ("R204-builtin", "ruleset s:\n  rule r: len + 0 => len\n", "R204", "error", 2, 11, 2, 14, "len"),
  ("R204-helper", f"use {H} (fold_constants)\nruleset s:\n  rule r: fold_constants + 0 => fold_constants(fold_constants)\n",
   "R204", "error", 3, 11, 3, 25, "fold_constants"),
  ("R204-use-builtin", f"use {H} (len)\nruleset s:\n  rule r: x + 0 => x\n", "R204", "error", 1, C, 1, C + 3, "len"),
  ("R204-comprehension", "ruleset s:\n  rule r: x + 0 => [x for x in x.src][0]\n", "R204", "error", 2, 27, 2, 28, "x"),
  # helpers
  ("R301-not-allowed", "use os (system)\nruleset s:\n  rule r: x + 0 => x\n", "R301", "error", 1, 5, 1, 7, "os"),
  ("R301-unimportable", "use engine.nonexistent (f)\nruleset s:\n  rule r: x + 0 => x\n",
   "R301", "error", 1, 5, 1, 23, "engine.nonexistent"),
  ("R302-missing", f"use {H} (nope)\nruleset s:\n  rule r: x + 0 => x\n", "R302", "error", 1, C, 1, C + 4, "nope"),
  ("R302-not-a-function", f"use {H} (annotations)\nruleset s:\n  rule r: x + 0 => x\n",
   "R302", "error", 1, C, 1, C + 11, "annotations"),
  ("R302-module-is-not-a-helper", f"use {H} (math)\nruleset s:\n  rule r: x + 0 => x\n",
   "R302", "error", 1, C, 1, C + 4, "math"),
  ("R301-module-path", "use rulec.engine.sched.symbolic (fold_constants)\nruleset s:\n  rule r: x + 0 => x\n",
   "R301", "error", 1, 5, 1, 32, "rulec.engine.sched.symbolic"),
  ("R303-too-many", f"use {H} (fold_constants)\nruleset s:\n  rule r: x + 0 => fold_constants(x, x)\n",
   "R303", "error", 3, 20, 3, 40, "fold_constants(x, x)"),
  ("R303-bad-keyword", f"use {H} (fold_constants)\nruleset s:\n  rule r: x + 0 => fold_constants(y=x)\n",
   "R303", "error", 3, 20, 3, 39, "fold_constants(y=x)"),
  ("R303-in-guard", f"use {H} (bounds_const)\nruleset s:\n  rule r: x + 0 if bounds_const() => x\n",
   "R303", "error", 3, 20, 3, 34, "bounds_const()"),
  ("R304-same-line", f"use {H} (fold_constants, fold_constants)\nruleset s:\n  rule r: x + 0 => x\n",
   "R304", "error", 1, C + 16, 1, C + 30, "fold_constants"),
  ("R304-two-lines", f"use {H} (fold_constants)\nuse {H} (fold_constants)\nruleset s:\n  rule r: x + 0 => x\n",
   "R304", "error", 2, C, 2, C + 14, "fold_constants"),
  # reaching Python
  ("R401-dunder", "ruleset s:\n  rule r: x + 0 => x.__class__\n", "R401", "error", 2, 22, 2, 31, "__class__"),
  ("R401-format", "ruleset s:\n  rule r: x + 0 => x.src.format\n", "R401", "error", 2, 26, 2, 32, "format"),
  ("R401-in-guard", "ruleset s:\n  rule r: x + 0 if x.mro => x\n", "R401", "error", 2, 22, 2, 25, "mro"),
  ("R402", "ruleset s:\n  rule r: x + 0 => sorted(x.src, key=lambda s: s.arg)\n",
   "R402", "error", 2, 38, 2, 53, "lambda s: s.arg"),
  ("R403-import", "ruleset s:\n  rule r: x + 0 => __import__(x.arg)\n", "R403", "error", 2, 20, 2, 30, "__import__"),
  ("R403-eval", "ruleset s:\n  rule r: x + 0 => eval(x.arg)\n", "R403", "error", 2, 20, 2, 24, "eval"),
  ("R403-dunder-name", "ruleset s:\n  rule r: x + 0 => __builtins__[x.arg]\n", "R403", "error", 2, 20, 2, 32, "__builtins__"),
  ("R404", "ruleset s:\n  rule r: x + 0 if (y := 1) => x\n", "R404", "error", 2, 20, 2, 28, "(y := 1)"),
  ("R405-import", "import os\nruleset s:\n  rule r: x + 0 => x\n", "R405", "error", 1, 1, 1, 7, "import"),
  ("R405-from", "from os import system\n", "R405", "error", 1, 1, 1, 5, "from"),
  ("R405-def", "def f(): pass\n", "R405", "error", 1, 1, 1, 4, "def"),
  ("R405-assign-in-ruleset", "ruleset s:\n  rule r: x + 0 => x\n  x = 1\n", "R405", "error", 3, 5, 3, 6, "="),
  ("R405-semicolon", "ruleset s:\n  rule r: x + 0 => x; 1\n", "R405", "error", 2, 21, 2, 22, ";"),
  # structure
  ("R501", "ruleset s:\n  rule r: x + 0 => x\n  rule r: x * 1 => x\n", "R501", "error", 3, 3, 3, 21,
   "rule r: x * 1 => x"),
  ("R502", "ruleset s:\n  rule r: x + 0 => x\nruleset s:\n  rule q: x * 1 => x\n", "R502", "error", 3, 9, 3, 10, "s"),
  ("R503", "ruleset s includes nope:\n  rule r: x + 0 => x\n", "R503", "error", 1, 20, 1, 24, "nope"),
  ("R504-pair", "ruleset a includes b:\n  rule r: x + 0 => x\nruleset b includes a:\n  rule q: x * 1 => x\n",
   "R504", "error", 3, 20, 3, 21, "a"),
  ("R504-self", "ruleset a includes a:\n  rule r: x + 0 => x\n", "R504", "error", 1, 20, 1, 21, "a"),
  ("R504-three", "ruleset a includes b:\n  rule r: x + 0 => x\nruleset b includes c:\n  rule q: x * 1 => x\n"
   "ruleset c includes a:\n  rule p: x - 0 => x\n", "R504", "error", 5, 20, 5, 21, "a"),
  ("R505", "ruleset s:\n  rule r: x + _ => x\n  rule q: x + 0 => x\n", "R505", "warning", 3, 3, 3, 21,
   "rule q: x + 0 => x"),
  ("R505-via-includes", "ruleset a:\n  rule r: x + _ => x\nruleset b includes a:\n  rule q: x + 0 => x\n",
   "R505", "warning", 4, 3, 4, 21, "rule q: x + 0 => x"),
  # reading and lexing
  ("R003-not-utf8", b"ruleset s:\n  rule r: x + 0 => x \xff\n", "R003", "error", 2, 22, 2, 23, "\ufffd"),
  ("R003-truncated-utf8", b"ruleset s:\n  rule r: x + 0 => 'a\xc3'\n", "R003", "error", 2, 22, 2, 23, "\ufffd"),
  ("R004-leading-zero", "ruleset s:\n  rule r: x + 0 => x + 01\n", "R004", "error", 2, 24, 2, 26, "01"),
  ("R004-underscores", "ruleset s:\n  rule r: x + 1__0 => x\n", "R004", "error", 2, 15, 2, 19, "1__0"),
  ("R004-hex", "ruleset s:\n  rule r: x + 0 => x + 0x_\n", "R004", "error", 2, 24, 2, 27, "0x_"),
  ("R004-escape", 'ruleset s:\n  rule r: x + 0 if x.arg == "\\x1" => x\n', "R004", "error", 2, 29, 2, 34, '"\\x1"'),
  ("R004-named-escape", 'ruleset s:\n  rule r: x + 0 if x.arg == "\\N{NOPE}" => x\n', "R004", "error", 2, 29, 2, 39,
   '"\\N{NOPE}"'),
  ("R004-nul", 'ruleset s:\n  rule r: x + 0 if x.arg == "a\0" => x\n', "R004", "error", 2, 29, 2, 33, '"a\0"'),
  ("R005-attribute", "ruleset s:\n  rule r: x + 0 => x.class\n", "R005", "error", 2, 22, 2, 27, "class"),
  ("R005-keyword-argument", "ruleset s:\n  rule r: x + 0 => x.replace(from=None)\n", "R005", "error", 2, 30, 2, 34, "from"),
  # the capability boundary
  ("R406-node", "ruleset s:\n  rule r: x + 0 => x.system\n", "R406", "error", 2, 22, 2, 28, "system"),
  ("R406-comprehension", "ruleset s:\n  rule r: x + 0 => [s.system for s in x.src][0]\n", "R406", "error", 2, 23, 2, 29,
   "system"),
  ("R406-source", "ruleset s:\n  rule r: x + 0 => x.src[0].system\n", "R406", "error", 2, 29, 2, 35, "system"),
  ("R406-tuple", "ruleset s:\n  rule r: SINK(*rest) => rest.op\n", "R406", "error", 2, 31, 2, 33, "op"),
  ("R406-dtype", "ruleset s:\n  rule r: x + 0 => x if x.dtype.fields else None\n", "R406", "error", 2, 33, 2, 39, "fields"),
  ("R406-builtin", "ruleset s:\n  rule r: x + 0 => x if str.join else None\n", "R406", "error", 2, 29, 2, 33, "join"),
  ("R406-helper", f"use {H} (bounds_const)\nruleset s:\n  rule r: _ + 0 => bounds_const.x\n",
   "R406", "error", 3, 33, 3, 34, "x"),
  ("R406-ctx-private", "ruleset s:\n  rule r: _ + 0 => ctx._cache\n", "R406", "error", 2, 24, 2, 30, "_cache"),
  ("R406-class", "ruleset s:\n  rule r: x + 0 => UOp.replace(x)\n", "R406", "error", 2, 24, 2, 31, "replace"),
  # gradient sets (rules/gradient.rules)
  ("R105-not-a-tuple", "gradients d(g):\n  rule r: ADD(_, _) => g\n", "R105", "error", 2, 24, 2, 25, "g"),
  ("R105-arity", "gradients d(g):\n  rule r: ADD(_, _) => (g,)\n", "R105", "error", 2, 24, 2, 28, "(g,)"),
  ("R106", "gradients d(g):\n  rule r: NEG(_) => (-g,)\n    example: NEG(a:BUFFER) => a\n", "R106", "error",
   3, 5, 3, 32, "example: NEG(a:BUFFER) => a"),
  ("R506", "ruleset a:\ngradients d(g) includes a:\n", "R506", "error", 2, 25, 2, 26, "a"),
  ("R507", "ruleset s extends nope:\n  rule r: x + 0 => x\n", "R507", "error", 1, 19, 1, 23, "nope"),
  ("R204-gradient", "gradients d(g):\n  rule r: NEG(g) => (-g,)\n", "R204", "error", 2, 15, 2, 16, "g"),
  # limits (engine/lang/limits.py)
  ("R701", "ruleset s:\n  rule r: " + " + ".join(["_"] * 10) + " => None\n", "R701", "error", 2, 11, 2, 48,
   " + ".join(["_"] * 10)),
  ("R702", "".join(f"ruleset a{i} includes a{i + 1}:\n" for i in range(33)) + "ruleset a33:\n",
   "R702", "error", 1, 9, 1, 11, "a0"),
  ("R703-expression", "ruleset s:\n  rule r: x + 0 => " + "[" * 70 + "x" + "]" * 70 + "\n", "R703", "error",
   2, 84, 2, 97, "[" * 6 + "x" + "]" * 6),
  ("R704-number", "ruleset s:\n  rule r: x + " + "1" * 101 + " => x\n", "R704", "error", 2, 15, 2, 116, "1" * 101),
  ("R704-string", "ruleset s:\n  rule r: x + 0 if x.arg == '" + "a" * 10001 + "' => x\n", "R704", "error",
   2, 29, 2, 10032, "'" + "a" * 10001 + "'"),
  ("R705", "ruleset s:\n" + "#" * (1 << 20) + "\n", "R705", "error", 1, 1, 1, 1, ""),
]


def test_every_code_has_a_case():
  # the example codes (R6xx) are reported only when examples run: tests/lang/test_rule_examples.py locates each;
  # R006 (a path that is not a regular file) has no text: tests/lang/test_untrusted_rules.py plays each kind
  assert {c[2] for c in CASES} == set(CODES) - EXAMPLE_CODES - {"R006"}


@pytest.mark.parametrize("name,src,code,severity,line,col,end_line,end_col,text", CASES, ids=[c[0] for c in CASES])
def test_code_is_reported_at_its_location(name, src, code, severity, line, col, end_line, end_col, text):
  assert underlined(src, line, col, end_col) == text, "the test case itself is inconsistent"
  got = diags(src)
  assert [loc(d) for d in got] == [(code, severity, line, col, end_line, end_col)], show(got)
  d = got[0]
  assert d.span.file == "t.rules"
  assert d.message and d.code in CODES
  assert d.is_error == (severity == "error")


ERROR_CASES = [c for c in CASES if c[3] == "error"]


@pytest.mark.parametrize("name,src,code,severity,line,col,end_line,end_col,text", ERROR_CASES,
                         ids=[c[0] for c in ERROR_CASES])
def test_loader_raises_the_same_diagnostic(tmp_path, name, src, code, severity, line, col, end_line, end_col, text):
  path = tmp_path / f"{name}.rules"
  path.write_bytes(src) if isinstance(src, bytes) else path.write_text(src)
  with pytest.raises(RuleError) as ei:
    RuleLibrary([path]).matcher("s")
  got = [(d.span.file, *loc(d)) for d in ei.value.diagnostics]
  assert (str(path), code, severity, line, col, end_line, end_col) in got, got
  assert f"{path}:{line}:{col}: error {code}:" in str(ei.value)


@pytest.mark.parametrize("src", [c[1] for c in CASES if c[3] == "warning"], ids=[c[0] for c in CASES if c[3] == "warning"])
def test_warnings_do_not_stop_loading(tmp_path, src):
  path = tmp_path / "w.rules"
  path.write_text(src)
  lib = RuleLibrary([path])
  assert lib.checked.diagnostics and not lib.checked.errors
  lib.matcher(lib.ruleset_names()[-1])


def test_notes_point_at_the_first_definition():
  d = only("ruleset s:\n  rule r: x + 0 => x\n  rule r: x * 1 => x\n", "R501")
  assert d.note == "first used at t.rules:2:3"
  d = only("ruleset s:\n  rule r: x + 0 => x\nruleset s:\n  rule q: x * 1 => x\n", "R502")
  assert d.note == "first defined at t.rules:1:9"
  d = only("ruleset s:\n  rule r: x + _ => x\n  rule q: x + 0 => x\n", "R505")
  assert d.note == "earlier rule at t.rules:2:3"
  assert "'q'" in d.message and "'r'" in d.message
  d = only("ruleset a includes b:\n  rule r: x + 0 => x\nruleset b includes c:\n  rule q: x * 1 => x\n"
           "ruleset c includes a:\n  rule p: x - 0 => x\n", "R504")
  assert d.message.endswith("a -> b -> c -> a")


def test_diagnostics_are_sorted_by_location():
  src = "ruleset s:\n  rule q: ADDD(x) => x\n  rule r: x + y => x + z\n"
  got = diags(src)
  assert [(d.code, d.span.line, d.span.col) for d in got] == [("R101", 2, 11), ("R202", 3, 15), ("R201", 3, 24)]


# *** rendering ***

def test_render_error_with_note():
  src = "ruleset s:\n  rule r: x + 0 => x + y\n"
  d = only(src, "R201")
  assert d.render(src) == (
    "t.rules:2:24: error R201: unbound name 'y'\n"
    "     2 |   rule r: x + 0 => x + y\n"
    "       |                        ^\n"
    "       = names must be bound by the pattern, be 'ctx', a helper from a 'use' line, or a builtin")


def test_render_multi_character_span():
  src = "ruleset s:\n  rule r: x + 0 => __import__(x.arg)\n"
  d = only(src, "R403")
  assert d.render(src) == (
    "t.rules:2:20: error R403: '__import__' is not available in rules (rules cannot reach the Python interpreter)\n"
    "     2 |   rule r: x + 0 => __import__(x.arg)\n"
    "       |                    ^^^^^^^^^^")


def test_render_warning():
  src = "ruleset s:\n  rule r: x + y => x\n"
  d = only(src, "R202")
  assert d.render(src) == (
    "t.rules:2:15: warning R202: binding 'y' is never used\n"
    "     2 |   rule r: x + y => x\n"
    "       |               ^\n"
    "       = use '_' or drop the name if it is not needed")


def test_render_syntax_error():
  src = "ruleset s:\n  rule r: x + 0 => x $ 1\n"
  d = only(src, "R002")
  assert d.render(src) == (
    "t.rules:2:22: error R002: unexpected character '$'\n"
    "     2 |   rule r: x + 0 => x $ 1\n"
    "       |                      ^")


def test_render_caret_under_tab_indented_text():
  src = "ruleset s:\n\trule r: x + 0 => x + y\n"
  d = only(src, "R201")
  assert (d.span.line, d.span.col) == (2, 23)
  _, text, caret = d.render(src).split("\n")[:3]
  assert caret.index("^") - caret.index("|") == text.index("y", text.index("=>")) - text.index("|")


def test_render_without_source_is_just_the_head():
  d = only("ruleset s:\n  rule r: x + 0 => x + y\n", "R201")
  assert d.render(None).split("\n")[0] == "t.rules:2:24: error R201: unbound name 'y'"


@pytest.mark.parametrize("extra_line", ["\x0c", "# a comment with a line separator \u2028 in it"],
                         ids=["form-feed-line", "u2028-in-comment"])
def test_render_shows_the_diagnosed_line_whatever_else_the_file_contains(extra_line):
  # Lark counts lines by '\n' only; the source line shown must be that same line.
  src = f"ruleset s:\n{extra_line}\n  rule r: x + 0 => x + y\n"
  d = only(src, "R201")
  assert (d.span.line, d.span.col, d.span.end_col) == (3, 24, 25)
  assert d.render(src).split("\n")[1] == "     3 |   rule r: x + 0 => x + y"


def test_json_form_of_a_diagnostic():
  d = only("ruleset s:\n  rule r: x + 0 => x + y\n", "R201")
  assert d.to_json() == {"code": "R201", "severity": "error", "file": "t.rules", "line": 2, "col": 24, "end_line": 2,
                         "end_col": 25, "message": "unbound name 'y'", "note": d.note}


# *** R001 says what was expected ***

@pytest.mark.parametrize("src,line,col,wanted", [
  ("ruleset s:\n  rule r: x + 0 x\n", 2, 17, "'=>'"),
  ("ruleset s:\n  rule r: x + 0 if x.arg > 1 x\n", 2, 30, "'=>'"),
  ("ruleset s:\n  x + 0 x.const_like(0)\n", 2, 9, "'=>'"),
  ("ruleset s\n  rule r: x + 0 => x\n", 2, 3, "':'"),
  ("ruleset :\n  rule r: x + 0 => x\n", 1, 9, "a name"),
  ("ruleset s:\n  rule r: x + 0 =>\n", 2, 19, "a name"),
], ids=["missing-arrow", "missing-arrow-after-guard", "missing-arrow-unnamed-rule", "missing-colon", "missing-ruleset-name",
        "missing-replacement"])
def test_syntax_error_says_what_was_expected(src, line, col, wanted):
  d = only(src, "R001")
  assert (d.severity, d.span.line, d.span.col) == ("error", line, col)
  assert "expected" in d.message and wanted in d.message, d.message


def test_missing_arrow_message():
  d = only("ruleset s:\n  rule r: x + 0 x\n", "R001")
  assert d.message.startswith("unexpected 'x'; expected ")


@pytest.mark.parametrize("src,unexpected,must_not_list,exact", [
  # after `x + 0` at the top level of a rule, no closing bracket can follow
  ("ruleset s:\n  rule r: x + 0 x\n", "'x'", ("')'", "']'"), None),
  # inside `use m (a` only ',' or ')' can follow
  (f"use {H} (fold_constants\nruleset s:\n  rule r: x + 0 => x\n", "'ruleset'", ("':'", "'}'"),
   "unexpected 'ruleset'; expected ')', ','"),
], ids=["missing-arrow", "unclosed-use"])
def test_syntax_error_lists_only_acceptable_tokens(src, unexpected, must_not_list, exact):
  d = only(src, "R001")
  assert d.message.startswith(f"unexpected {unexpected}; expected ")
  for tok in must_not_list: assert tok not in d.message, d.message
  if exact is not None: assert d.message == exact


# *** rules files cannot reach Python ***

MARKER = "RULEC_PWNED_MARKER"


def _security_cases():
  m = repr(MARKER)        # relative path: the tests chdir into a tmp dir
  return [
    # id, source, code, line, the text the span covers on that line
    ("__import__", f"ruleset s:\n  rule r: x + 0 => __import__('os').system('touch ' + {m})\n", "R403", 2, "__import__"),
    ("__class__", "ruleset s:\n  rule r: x + 0 => x.__class__.__base__.__subclasses__()\n", "R401", 2, "__class__"),
    ("open", f"ruleset s:\n  rule r: x + 0 => open({m}, 'w')\n", "R403", 2, "open"),
    ("lambda", f"ruleset s:\n  rule r: x + 0 => (lambda: open({m}, 'w'))()\n", "R402", 2, f"lambda: open({m}, 'w')"),
    ("eval", f"ruleset s:\n  rule r: x + 0 => eval({('open(' + m + ', chr(119))')!r})\n", "R403", 2, "eval"),
    ("format", "ruleset s:\n  rule r: x + 0 => x.src.format\n", "R401", 2, "format"),
    ("format-string", "ruleset s:\n  rule r: x + 0 => '{0.__init__.__globals__}'.format(x)\n", "R401", 2, "format"),
    ("walrus", "ruleset s:\n  rule r: x + 0 if (y := 1) => x\n", "R404", 2, "(y := 1)"),
    ("import-line", "import os\nruleset s:\n  rule r: x + 0 => x\n", "R405", 1, "import"),
    ("import-line-in-ruleset", "ruleset s:\n  rule r: x + 0 => x\n  import os\n", "R405", 3, "import"),
    ("import-line-after-ruleset", "ruleset s:\n  rule r: x + 0 => x\nimport os\n", "R405", 3, "import"),
    ("assignment", "x = 1\nruleset s:\n  rule r: x + 0 => x\n", "R405", 1, "="),
    ("assignment-in-ruleset", "ruleset s:\n  rule r: x + 0 => x\n  x = 1\n", "R405", 3, "="),
    ("use-os", f"use os (system)\nruleset s:\n  rule r: x + 0 => system('touch ' + {m})\n", "R301", 1, "os"),
    ("helper-module-attribute", f"use early (os)\nruleset s:\n  rule r: x + 0 => os.system('touch ' + {m})\n",
     "R302", 1, "os"),
  ]


SECURITY = _security_cases()


def _expected_span(src: str, line: int, text: str) -> tuple[int, int]:
  col = src.split("\n")[line - 1].index(text) + 1
  return col, col + len(text)


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  return tmp_path


@pytest.mark.parametrize("name,src,code,line,text", SECURITY, ids=[c[0] for c in SECURITY])
def test_reaching_python_is_rejected_by_the_checker(in_tmp, name, src, code, line, text):
  col, end_col = _expected_span(src, line, text)
  got = diags(src)
  assert (code, "error", line, col, line, end_col) in [loc(d) for d in got], show(got)
  assert not (in_tmp / MARKER).exists()


@pytest.mark.parametrize("name,src,code,line,text", SECURITY, ids=[c[0] for c in SECURITY])
def test_reaching_python_is_rejected_by_the_loader(in_tmp, name, src, code, line, text):
  col, end_col = _expected_span(src, line, text)
  path = in_tmp / f"{name}.rules"
  path.write_text(src)
  for load in (lambda: RuleLibrary([path]), lambda: load_library([path])):
    with pytest.raises(RuleError) as ei:
      load().matcher("s")
    got = [(d.span.file, *loc(d)) for d in ei.value.diagnostics]
    assert (str(path), code, "error", line, col, line, end_col) in got, got
  assert not (in_tmp / MARKER).exists()


def test_a_clean_file_loads_and_rewrites(in_tmp):
  # the control for the tests above: the same shape without the payload loads and runs
  path = in_tmp / "ok.rules"
  path.write_text("ruleset s:\n  rule r: x + 0 => x\n")
  m = load_library([path]).matcher("s")
  v = UOp.variable("a", 0, 10)
  assert m.rewrite(v + 0) is v


def test_matchers_are_cached_in_RULEC_CACHE_DIR(in_tmp, isolated_env):
  path = in_tmp / "ok.rules"
  path.write_text("ruleset s:\n  rule r: x * 1 => x\n")
  RuleLibrary([path]).matcher("s")
  assert list(isolated_env.glob("*.py")), "the matcher cache did not go to RULEC_CACHE_DIR"


def test_file_name_cannot_inject_code_into_the_generated_matcher(in_tmp):
  # File names end up in the generated matcher (rule names and locations); a name
  # with a newline must not turn into code.
  path = in_tmp / f"x\n        open({MARKER!r}, 'w')#.rules"
  path.write_text("ruleset s:\n  x + 0 => x\n")
  try:
    m = RuleLibrary([path]).matcher("s")
  except RuleError:
    m = None      # refusing such a file name is fine too
  if m is not None:
    v = UOp.variable("a", 0, 10)
    assert m.rewrite(v + 0) is v
  assert not (in_tmp / MARKER).exists(), "a file name became code in the generated matcher"


# *** the CLI ***

CLEAN = "ruleset s:\n  rule r: x + 0 => x\n"
BROKEN = "ruleset s:\n  rule r: x + 0 => x + y\n"
WARNS = "ruleset s:\n  rule r: x + y => x\n"


@pytest.fixture
def rules_file(tmp_path):
  def make(text: str, name: str = "t.rules") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p
  return make


def test_cli_clean_file_exits_0(rules_file, capsys):
  p = rules_file(CLEAN)
  assert rulec(["check", str(p)]) == 0
  out, err = capsys.readouterr()
  assert out == ""
  assert "1 files, 1 rulesets, 1 rules: 0 errors, 0 warnings" in err


def test_cli_error_exits_1_and_prints_location(rules_file, capsys):
  p = rules_file(BROKEN)
  assert rulec(["check", str(p)]) == 1
  out, err = capsys.readouterr()
  assert f"{p}:2:24: error R201: unbound name 'y'" in out
  assert "1 errors, 0 warnings" in err


def test_cli_warning_only_exits_1(rules_file, capsys):
  p = rules_file(WARNS)
  assert rulec(["check", str(p)]) == 1
  out, err = capsys.readouterr()
  assert f"{p}:2:15: warning R202:" in out
  assert "0 errors, 1 warnings" in err


def test_cli_json(rules_file, capsys):
  p = rules_file(BROKEN)
  assert rulec(["check", str(p), "--format", "json"]) == 1
  report = json.loads(capsys.readouterr().out)
  assert report["errors"] == 1 and report["warnings"] == 0 and report["files"] == 1
  [d] = report["diagnostics"]
  assert {k: d[k] for k in ("file", "line", "col", "end_line", "end_col", "code", "severity")} == \
    {"file": str(p), "line": 2, "col": 24, "end_line": 2, "end_col": 25, "code": "R201", "severity": "error"}
  assert d["message"] == "unbound name 'y'"


def test_cli_json_syntax_error(rules_file, capsys):
  p = rules_file("ruleset s:\n  rule r: x + 0 x\n")
  assert rulec(["check", "--format", "json", str(p)]) == 1
  [d] = json.loads(capsys.readouterr().out)["diagnostics"]
  assert (d["file"], d["line"], d["col"], d["code"]) == (str(p), 2, 17, "R001")


def test_cli_json_clean(rules_file, capsys):
  p = rules_file(CLEAN)
  assert rulec(["check", str(p), "--format", "json"]) == 0
  report = json.loads(capsys.readouterr().out)
  assert report["diagnostics"] == [] and report["errors"] == 0 and report["rules"] == 1


def test_cli_directory_of_files(tmp_path, capsys):
  (tmp_path / "a.rules").write_text(CLEAN)
  (tmp_path / "sub").mkdir()
  (tmp_path / "sub" / "b.rules").write_text(BROKEN.replace("ruleset s", "ruleset t").replace("rule r", "rule q"))
  assert rulec(["check", str(tmp_path), "--format", "json"]) == 1
  report = json.loads(capsys.readouterr().out)
  assert report["files"] == 2
  assert [(d["file"], d["line"], d["col"], d["code"]) for d in report["diagnostics"]] == \
    [(str(tmp_path / "sub" / "b.rules"), 2, 24, "R201")]


@pytest.mark.parametrize("argv", [
  ["check", "no/such/file.rules"],
  ["check", "rules", "no/such/file.rules"],
  ["check", "--format", "xml", "rules"],
  ["check", "--bogus"],
  [],
  ["frobnicate"],
], ids=["missing-path", "one-path-missing", "bad-format", "unknown-option", "no-command", "unknown-command"])
def test_cli_usage_errors_exit_2(argv, capsys, monkeypatch):
  monkeypatch.chdir(REPO)
  assert rulec(argv) == 2
  assert capsys.readouterr().err


def test_cli_missing_path_is_named(capsys):
  assert rulec(["check", "no/such/file.rules"]) == 2
  assert "no/such/file.rules" in capsys.readouterr().err


# *** the shipped rules/ are clean ***

def test_shipped_rules_check_clean(capsys):
  assert rulec(["check", str(REPO / "rules"), "--format", "json"]) == 0
  report = json.loads(capsys.readouterr().out)
  assert report["diagnostics"] == [] and report["files"] >= 1 and report["rules"] > 0


def test_shipped_rules_are_the_default(capsys):
  assert rulec(["check"]) == 0


def test_rulec_check_command_line_on_shipped_rules(isolated_env):
  env = subprocess_env(RULEC_CACHE_DIR=str(isolated_env))
  r = subprocess.run([sys.executable, "-m", "rulec.cli", "check", "rules"], cwd=REPO, env=env, capture_output=True,
                     text=True, timeout=120)
  assert r.returncode == 0, r.stdout + r.stderr
  assert "0 errors, 0 warnings" in r.stderr
