"""`rulec fmt` (engine/lang/fmt.py): one canonical layout, idempotent, and meaning-preserving.

Meaning is checked on every file of four corpora (the shipped rules/, the rules blocks of docs/rules.md, the
diagnostics cases of tests/lang/test_diagnostics.py, and the hostile corpus of tests/hostile_rules.py): the parsed
file and its formatted form are the same AST once positions are left out, their checkers report the same
codes, and where they check clean, every rule set compiles to the same matcher source. A file that does
not parse is refused with the parser's own located diagnostic.
"""
from __future__ import annotations

import functools
import io
import itertools
import random
import sys
from pathlib import Path

import attrs
import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path: sys.path.insert(0, str(REPO))

from rulec.engine.lang import ast as A  # noqa: E402
from rulec.engine.lang import fmt as fmt_module  # noqa: E402
from rulec.engine.lang.checker import check_library  # noqa: E402
from rulec.engine.lang.compiler import generate  # noqa: E402
from rulec.engine.lang.fmt import MAX_WIDTH, FormatError, _lex, format_source  # noqa: E402
from rulec.engine.lang.parser import decode_source, parse_rules  # noqa: E402
from rulec.cli import main as rulec  # noqa: E402
from tests import hostile_rules  # noqa: E402
from tests.lang.test_diagnostics import CASES  # noqa: E402
from tests.tools.test_doc_examples import DOC, parse_doc  # noqa: E402


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
  monkeypatch.setenv("RULEC_CACHE_DIR", str(tmp_path / "cache"))
  for k in ("RULEC_STATS", "RULEC_HELPER_PACKAGES", "RULEC_RULES"): monkeypatch.delenv(k, raising=False)
  # parsing is a pure function and most of these tests' time: the formatter and the checks below share one
  # parse of each text
  monkeypatch.setattr(fmt_module, "parse_rules", parse)
  parse.cache_clear()


@functools.cache
def parse(text: str, path: str):
  return parse_rules(text, path)


def shape(root) -> list:
  """The AST as a flat list, positions and the names made from them (an unnamed rule's FILE:LINE) left
  out; iterative, since hostile files nest thousands of levels deep."""
  out, stack = [], [root]
  while stack:
    x = stack.pop()
    if isinstance(x, A.Span): out.append("@")
    elif isinstance(x, A.Rule) and not x.named: stack.append(attrs.evolve(x, name="", named=True, source_line=""))
    elif attrs.has(type(x)):
      out.append(type(x).__name__)
      stack.extend(reversed([getattr(x, f.name) for f in attrs.fields(type(x)) if f.name not in ("source", "source_line")]))
    elif isinstance(x, (tuple, list)): out.append(len(x)); stack.extend(reversed(x))
    else: out.append((type(x).__name__, repr(x)))
  return out


def matchers(text: str, path: str) -> tuple[list[str], dict[str, str]]:
  """The checker's codes and, when it finds no error, each rule set's generated matcher with locations blanked."""
  rf, diags = parse(text, path)
  lib = check_library([rf], diags)
  codes = sorted(d.code for d in lib.diagnostics)
  if lib.errors: return codes, {}
  blank = A.Span(path, 0, 0, 0, 0)
  out = {}
  for name in lib.rulesets:
    rules = [attrs.evolve(r, span=blank, source_line="", name=r.name if r.named else f"<{k}>")
             for k, r in enumerate(lib.flat_rules(name))]
    out[name] = generate(rules, lib.helpers_of, title=name)
  return codes, out


def assert_same_meaning(text: str, path: str, compile_it: bool = True) -> str:
  got = format_source(text, path)
  assert format_source(got, path) == got, f"{path}: formatting is not idempotent"
  before, after = parse(text, path)[0], parse(got, path)[0]
  assert shape(before) == shape(after), f"{path}: the formatted file parses differently"
  if compile_it: assert matchers(text, path) == matchers(got, path), f"{path}: the formatted file compiles differently"
  return got


# *** the corpora ***

SHIPPED = sorted((REPO / "rules").glob("*.rules"))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_rules_keep_their_meaning(path):
  assert_same_meaning(path.read_text(), str(path))


def test_one_layout_whatever_the_spacing():
  """Spaces added between the tokens of a line, trailing spaces and doubled blank lines give the same file."""
  rng = random.Random(16)
  for path in SHIPPED:
    text = path.read_text()
    canon = fmt(text)
    for _ in range(2):
      toks = _lex(canon)[0]
      out, last = [], 0
      for prev, tok in itertools.pairwise(toks):
        if tok.line == prev.end_line:
          out += [canon[last:tok.start_pos], " " * rng.randrange(3)]
          last = tok.start_pos
      messy = ("".join(out) + canon[last:]).replace("\n", "  \n").replace("  \n  \n", "\n\n\n")
      assert messy != canon and fmt(messy) == canon, path.name


def test_doc_rules_blocks_keep_their_meaning():
  blocks = [b for b in parse_doc(DOC.read_text()) if b.lang == "rules"]
  assert len(blocks) > 20
  for b in blocks:
    if parse_rules(b.body, "doc.rules")[0] is None:
      with pytest.raises(FormatError): format_source(b.body, "doc.rules")
    else: assert_same_meaning(b.body, "doc.rules")


def test_diagnostics_cases_keep_their_meaning():
  refused = 0
  for name, src, code, *_ in CASES:
    text, bad = decode_source("t.rules", src)
    if bad is not None or parse_rules(text, "t.rules")[0] is None:
      with pytest.raises(FormatError) as e: format_source(src, "t.rules")
      assert e.value.diagnostics[0].code == code, name
      refused += 1
      continue
    assert_same_meaning(src, "t.rules")
  assert refused >= 3   # the syntax-error cases


def test_hostile_corpus_keeps_its_meaning_or_is_refused(tmp_path):
  files = hostile_rules.build(tmp_path / "corpus", tmp_path / "MARKER", tmp_path / "SECRET")
  formatted = refused = 0
  for path, _ in files:
    # the files over 20 kB repeat one line thousands of times, and cost seconds each: left out
    if path.is_dir() or path.stat().st_size > 20_000: continue
    data = path.read_bytes()
    text, bad = decode_source(str(path), data)
    rf, diags = (None, [bad]) if bad is not None else parse(text, str(path))
    if rf is None:
      with pytest.raises(FormatError) as e: format_source(data, str(path))
      assert [(d.code, d.span) for d in e.value.diagnostics] == [(d.code, d.span) for d in diags if d.is_error]
      refused += 1
      continue
    assert_same_meaning(text, str(path))
    formatted += 1
  assert formatted > 100 and refused > 50


# *** the layout ***

def fmt(text: str) -> str: return format_source(text, "t.rules")


def test_spacing_is_canonical():
  src = ("use  symbolic(fold_constants ,bounds_const)\n"
         "ruleset   s  includes t,u :\n"
         "    rule a :x+0=>x\n"
         "    rule b: c : CONST [ -1 ] * y { ints , bools } if not c.arg<-1 and y . vmin>=0 => y . replace ( src = ( y , ) )\n"
         "    rule c:(ADD|MUL)(x,*rest)=>-(-x) ** -2 if x[1 :] else [u for u in x.src][ :: 2]\n"
         "          example :RANGE ( 3 ) { int32 }+0=>RANGE(3)\n"
         "    rule d: INDEX(x, ..) => {k : v for k, v in x} | { 1, 2 } | f(*a, ** k) | (lambda q : q)(1 .real)\n"
         "ruleset t:\nruleset u:\n")
  assert fmt(src) == (
    "use symbolic (fold_constants, bounds_const)\n"
    "\n"
    "ruleset s includes t, u:\n"
    "  rule a: x + 0 => x\n"
    "  rule b: c:CONST[-1] * y{ints, bools} if not c.arg < -1 and y.vmin >= 0 => y.replace(src=(y,))\n"
    "  rule c: (ADD | MUL)(x, *rest) => -(-x) ** -2 if x[1:] else [u for u in x.src][::2]\n"
    "    example: RANGE(3){int32} + 0 => RANGE(3)\n"
    "  rule d: INDEX(x, ..) => {k: v for k, v in x} | {1, 2} | f(*a, **k) | (lambda q: q)(1 .real)\n"
    "\n"
    "ruleset t:\n"
    "\n"
    "ruleset u:\n")


def test_comments_and_blank_lines():
  src = ("\n\n# head\n\n\n\nruleset s:   \n"
         "# about a\n"
         "      rule a: x + 0 => x    # trailing\n"
         "        # about the example\n"
         "              example: RANGE(3) + 0 => RANGE(3)\n"
         "\n\n\n"
         "   # a note at the end of the set\n"
         "\n"
         "# the next set\n"
         "ruleset t:\n"
         "  rule b: x * 1 => x\n"
         "    # last words\n")
  assert fmt(src) == ("# head\n\nruleset s:\n"
                      "  # about a\n"
                      "  rule a: x + 0 => x  # trailing\n"
                      "    # about the example\n"
                      "    example: RANGE(3) + 0 => RANGE(3)\n"
                      "\n"
                      "  # a note at the end of the set\n"
                      "\n"
                      "# the next set\n"
                      "ruleset t:\n"
                      "  rule b: x * 1 => x\n"
                      "  # last words\n")


def test_line_breaks_the_author_made_are_kept_and_reindented():
  src = ("use symbolic (fold_constants,\n"
         "        bounds_const)\n"
         "ruleset s:\n"
         " rule a: x // c:CONST\n"
         "           if c.arg > 0  # positive\n"
         "   # the bound\n"
         "             and x.vmax < c.arg\n"
         "   => x.const_like(0)\n"
         " rule b: WHERE(c:CONST, a,\n"
         "b) => a if c.arg else b\n"
         " rule c: x{ints} % 1 \\\n"
         "=> x.const_like(0)\n"
         " rule d: x + 0 => f(\n"
         "       x,\n"
         "         x,\n"
         "   )\n"
         " rule e: \\\n"
         "   x * 1 => x\n")
  assert fmt(src) == ("use symbolic (fold_constants,\n"
                      "              bounds_const)\n"
                      "\n"
                      "ruleset s:\n"
                      "  rule a: x // c:CONST\n"
                      "    if c.arg > 0  # positive\n"
                      "    # the bound\n"
                      "    and x.vmax < c.arg\n"
                      "    => x.const_like(0)\n"
                      "  rule b: WHERE(c:CONST, a,\n"
                      "                b) => a if c.arg else b\n"
                      "  rule c: x{ints} % 1 \\\n"
                      "    => x.const_like(0)\n"
                      "  rule d: x + 0 => f(\n"
                      "    x,\n"
                      "    x,\n"
                      "  )\n"
                      "  rule e: \\\n"
                      "    x * 1 => x\n")


def test_long_rules_are_broken():
  guard = " and ".join(f"x.vmax < {i}" for i in range(14))
  src = f"ruleset s:\n  rule a: x + y => x\n  rule b: x // c:CONST if {guard} => x.const_like(0)\n"
  got = fmt(src)
  lines = got.splitlines()
  assert lines[2] == "  rule b: x // c:CONST" and lines[3].startswith("    if x.vmax < 0 and ") and lines[-1] == "    => x.const_like(0)"
  assert all(len(ln) <= MAX_WIDTH for ln in lines) and all(ln.startswith("    and ") for ln in lines[4:-1])
  items = ", ".join(f"g * y.lt(x).where(g.const_like({i}.0), 0.0)" for i in range(4))
  got = fmt(f"gradients d(g):\n  rule m: MAX(x, y) => ({items})\n")
  assert got.splitlines()[1] == "  rule m: MAX(x, y)" and got.splitlines()[2].startswith("    => (g * y.lt(x)")
  assert all(ln.startswith(" " * 8 + "g * y") for ln in got.splitlines()[3:]) and len(got.splitlines()) > 3
  assert format_source(got, "t.rules") == got
  # a line that fits, and one whose comment alone makes it long, stay as they are
  short = "ruleset s:\n  rule a: x + 0 => x  # " + "c" * 200 + "\n"
  assert fmt(short) == short


def test_not_parsing_is_an_error_with_its_location():
  with pytest.raises(FormatError) as e: fmt("ruleset s:\n  rule r: x + 0 x\n")
  d = e.value.diagnostics[0]
  assert (d.code, d.span.line, d.span.col) == ("R001", 2, 17)
  assert str(e.value).startswith("t.rules:2:17: error R001:")
  with pytest.raises(FormatError): format_source(b"ruleset s:\n  rule r: x + 0 => x \xff\n", "t.rules")


# *** the command ***

def test_cli_check_write_and_errors(tmp_path, capsys, monkeypatch):
  good, bad, broken = tmp_path / "good.rules", tmp_path / "bad.rules", tmp_path / "broken.rules"
  good.write_text("ruleset s:\n  rule a: x + 0 => x\n")
  bad.write_text("ruleset s:\n    rule a:x+0=>x\n")
  broken.write_text("ruleset s:\n  rule a: x + 0 =>\n")
  assert rulec(["fmt", "--check", str(good)]) == 0
  assert rulec(["fmt", "--check", str(tmp_path)]) == 1
  out = capsys.readouterr()
  assert f"would reformat {bad}" in out.out and f"{broken}:2:" in out.err and "error R001" in out.err
  assert bad.read_text() == "ruleset s:\n    rule a:x+0=>x\n"    # --check writes nothing
  assert rulec(["fmt", "--diff", str(bad)]) == 1 and "+  rule a: x + 0 => x" in capsys.readouterr().out
  assert rulec(["fmt", str(good), str(bad)]) == 0
  assert bad.read_text() == "ruleset s:\n  rule a: x + 0 => x\n" and "reformatted" in capsys.readouterr().err
  assert rulec(["fmt", str(broken)]) == 1 and broken.read_text() == "ruleset s:\n  rule a: x + 0 =>\n"
  assert rulec(["fmt", str(tmp_path / "missing.rules")]) == 2
  # the formatter's own check of its result, failing: an internal error, and the file is left as it was
  bad.write_text("ruleset s:\n    rule a:x+0=>x\n")
  capsys.readouterr()
  monkeypatch.setattr(fmt_module, "layout_signature", lambda text: [])
  assert rulec(["fmt", str(bad)]) == 1 and "internal error" in capsys.readouterr().err
  assert bad.read_text() == "ruleset s:\n    rule a:x+0=>x\n"


def test_cli_stdin_to_stdout(monkeypatch, capsys):
  monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"ruleset s:\n rule a:x+0=>x\n")))
  assert rulec(["fmt", "-"]) == 0 and capsys.readouterr().out == "ruleset s:\n  rule a: x + 0 => x\n"
  monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"ruleset s:\n rule a: x + 0 =>\n")))
  assert rulec(["fmt", "-"]) == 1 and "<stdin>:2:" in capsys.readouterr().err
