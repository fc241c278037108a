"""Highlighting: the Pygments lexer (rulec/pygments_lexer.py, found through the `pygments.lexers` entry point)
and the TextMate grammar of the VS Code extension (editors/vscode/)."""
from __future__ import annotations

import json
import re
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pygments.lexers
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.token import Comment, Error, Keyword, Name, Number, Operator, String

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path: sys.path.insert(0, str(REPO))

from rulec.pygments_lexer import RulecLexer  # noqa: E402
from tests.tools.test_doc_examples import DOC, parse_doc  # noqa: E402

VSCODE = REPO / "editors" / "vscode"
SAMPLE = """# a comment
use symbolic (fold_constants)

ruleset s includes base, more:
  rule fold: a:ALU(each CONST) => fold_constants(a)   # trailing
    example: 2 * 3{int32} => 6{int32}
  rule pick: WHERE(c:CONST, x{ints}, y) if c.arg is not None and len(x.src) > 0x1f => x if c.arg else y
  rule third: x + 0 => x.replace(arg="a'b", src=(x,)) if 1.5e3 and ctx.flag else unchanged
"""


def kinds(text: str) -> dict[str, object]:
  return {v: t for t, v in RulecLexer(stripnl=False).get_tokens(text) if v.strip()}


def test_registered_through_the_entry_point():
  (ep,) = [e for e in entry_points(group="pygments.lexers") if e.name == "rulec"]
  assert ep.value == "rulec.pygments_lexer:RulecLexer"
  assert type(pygments.lexers.get_lexer_by_name("rulec")).__name__ == "RulecLexer"
  assert type(pygments.lexers.get_lexer_by_name("rules")).__name__ == "RulecLexer"   # ```rules blocks
  assert pygments.lexers.find_lexer_class_for_filename("x.rules").__name__ == "RulecLexer"


def test_tokens():
  k = kinds(SAMPLE)
  assert k["# a comment"] in Comment and k["# trailing"] in Comment
  assert k["use"] in Keyword and k["symbolic"] in Name.Namespace
  assert k["ruleset"] in Keyword and k["s"] in Name.Class and k["base"] in Name.Class and k["more"] in Name.Class
  assert k["fold"] in Name.Function and k["pick"] in Name.Function
  assert k["ALU"] in Name.Constant and k["WHERE"] in Name.Constant and k["each"] in Keyword
  assert k["int32"] in Keyword.Type and k["ints"] in Keyword.Type
  assert k["example"] in Keyword and k["unchanged"] in Keyword and k["None"] in Keyword.Constant
  assert k["=>"] in Operator and k["and"] in Operator.Word and k["not"] in Operator.Word
  assert k["0x1f"] in Number and k["1.5e3"] in Number and k['"a\'b"'] in String
  assert k["len"] in Name.Builtin and k["ctx"] in Name.Builtin
  assert ("c", Name.Variable) in [(v, t) for t, v in RulecLexer().get_tokens(SAMPLE)]   # the binding c:CONST


def test_every_shipped_file_and_doc_block_lexes_without_errors():
  texts = [p.read_text() for p in sorted((REPO / "rules").glob("*.rules"))]
  # (the R002 examples show characters that start no token: an error token is right there)
  texts += [b.body for b in parse_doc(DOC.read_text()) if b.lang == "rules" and "R002" not in b.expect]
  assert len(texts) > 30
  for text in texts:
    toks = list(RulecLexer(stripnl=False, ensurenl=False).get_tokens(text))
    assert "".join(v for _, v in toks) == text
    assert not [v for t, v in toks if t in Error], text
  assert '<span class="k' in highlight(SAMPLE, RulecLexer(), HtmlFormatter())


# *** the VS Code extension ***

def test_vscode_extension_is_wired_up():
  pkg = json.loads((VSCODE / "package.json").read_text())
  (lang,) = pkg["contributes"]["languages"]
  (grammar,) = pkg["contributes"]["grammars"]
  assert lang["id"] == grammar["language"] == "rulec" and ".rules" in lang["extensions"]
  assert (VSCODE / lang["configuration"]).is_file() and (VSCODE / pkg["main"]).is_file()
  tm = json.loads((VSCODE / grammar["path"]).read_text())
  assert tm["scopeName"] == grammar["scopeName"] == "source.rulec"
  assert pkg["contributes"]["configuration"]["properties"]["rulec.server.command"]["default"] == ["rulec", "lsp"]
  ext = (VSCODE / pkg["main"]).read_text()
  assert "vscode-languageclient" in ext and "vscode-languageclient" in pkg["dependencies"] and '"lsp"' in ext
  assert json.loads((VSCODE / lang["configuration"]).read_text())["comments"]["lineComment"] == "#"


def _patterns(node):
  if isinstance(node, dict):
    for key in ("match", "begin", "end"):
      if key in node: yield node.get("name", key), node[key]
    for v in node.values(): yield from _patterns(v)
  elif isinstance(node, list):
    for v in node: yield from _patterns(v)


def test_textmate_grammar_scopes():
  tm = json.loads((VSCODE / "syntaxes" / "rulec.tmLanguage.json").read_text())
  for _, rx in _patterns(tm): re.compile(rx)   # the grammar keeps to what Python's re and Oniguruma share
  repo = tm["repository"]
  includes = {p["include"][1:] for p in tm["patterns"]}
  assert includes <= set(repo)
  m = re.search(repo["rule-name"]["match"], "  rule add_zero: x + 0 => x")
  assert m and m[2] == "add_zero"
  m = re.search(repo["header"]["begin"], "ruleset symbolic includes symbolic_fold:")
  assert m and m[2] == "symbolic"
  assert re.search(repo["dtypes"]["begin"], "x{ints}").start() == 1 and not re.search(repo["dtypes"]["begin"], "f({1, 2})")
  assert re.fullmatch(repo["comment"]["match"], "# why") and re.search(repo["example"]["match"], "    example: 1 => 1")
  ops = {p["name"]: p["match"] for p in repo["operators"]["patterns"]}
  assert re.fullmatch(ops["keyword.operator.rewrite.rulec"], "=>")
  binding = re.search(repo["binding"]["match"], "c:CONST")
  assert binding and binding[1] == "c"
