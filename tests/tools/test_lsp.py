"""`rulec lsp` (rulec/lsp.py), in a real Language Server Protocol session: pygls' client starts
`python -m rulec.cli lsp` over stdio, opens a rules file, edits it, and checks the published diagnostics
(codes and ranges, a failing example included), hover, definition, completion, document symbols and
formatting replies."""
from __future__ import annotations

import asyncio
import inspect
import sys
from pathlib import Path

from lsprotocol import types as T
from pygls.lsp.client import LanguageClient

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path: sys.path.insert(0, str(REPO))

from rulec.engine.sched import symbolic as symbolic_helpers  # noqa: E402
from tests.helpers import subprocess_env  # noqa: E402

V1 = """use symbolic (fold_constants)

ruleset base:
  rule any_mul: x * _ => x

ruleset s includes base:
  rule fold_alu: a:ALU(each CONST) => fold_constants(a)
    example: 2 + 3 => 5
  rule add_zero: x{ints} + 0 if x.vmin >= 0 => x
    example: RANGE(3) + 0 => RANGE(3)
  rule mul_one: x*1 => x
"""
V2 = V1.replace("if x.vmin >= 0 => x\n", "if x.vmin >= 0 => x + y\n")            # R201: y is not bound
V3 = V1.replace("example: RANGE(3) + 0 => RANGE(3)", "example: RANGE(3) + 0 => RANGE(4)")  # R601
STATS = """rule statistics for s:
   attempts  matches   time ms  rule
         7        3     0.010  add_zero (my.rules:9:3)
         2        0     0.001  mul_one (my.rules:11:3)
  never matched: mul_one (my.rules:11:3)
"""


def at(text: str, line: int, needle: str, offset: int = 0) -> T.Position:
  """The position of `needle` on 0-based `line` (plus offset)."""
  return T.Position(line, text.split("\n")[line].index(needle) + offset)


async def session(tmp: Path) -> dict:
  folder = tmp / "mine"
  folder.mkdir()
  path = folder / "my.rules"
  path.write_text(V1)
  (tmp / "stats.txt").write_text(STATS)
  uri = path.resolve().as_uri()
  client = LanguageClient("rulec-test", "1")
  published: list[T.PublishDiagnosticsParams] = []
  arrived = asyncio.Event()

  @client.feature(T.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
  def _diagnostics(params: T.PublishDiagnosticsParams):
    published.append(params)
    arrived.set()

  async def diagnostics_of(version: int) -> list[T.Diagnostic]:
    while True:
      found = [p for p in published if p.uri == uri and p.version == version]
      if found: return found[-1].diagnostics
      arrived.clear()
      await asyncio.wait_for(arrived.wait(), 60)

  out: dict = {}
  await client.start_io(sys.executable, "-m", "rulec.cli", "lsp", cwd=str(tmp),
                        env=subprocess_env(RULEC_CACHE_DIR=str(tmp / "cache")))
  try:
    init = await client.initialize_async(T.InitializeParams(
      capabilities=T.ClientCapabilities(), root_uri=tmp.as_uri(), initialization_options={"statsFile": str(tmp / "stats.txt")}))
    out["capabilities"] = init.capabilities
    client.initialized(T.InitializedParams())
    client.text_document_did_open(T.DidOpenTextDocumentParams(T.TextDocumentItem(uri, "rulec", 1, V1)))
    out["v1"] = await diagnostics_of(1)
    doc = T.TextDocumentIdentifier(uri)

    async def ask(method, pos: T.Position):
      return await method(method_params[method](doc, pos))
    method_params = {client.text_document_hover_async: T.HoverParams, client.text_document_definition_async: T.DefinitionParams,
                     client.text_document_completion_async: T.CompletionParams}
    hover, definition, complete = (client.text_document_hover_async, client.text_document_definition_async,
                                   client.text_document_completion_async)
    out["hover_rule"] = await ask(hover, at(V1, 8, "add_zero"))
    out["hover_helper"] = await ask(hover, at(V1, 6, "fold_constants(", 3))
    out["hover_group"] = await ask(hover, at(V1, 6, "ALU", 1))
    out["hover_binding"] = await ask(hover, at(V1, 8, "x.vmin"))
    out["def_include"] = await ask(definition, at(V1, 5, "base", 2))
    out["def_helper"] = await ask(definition, at(V1, 6, "fold_constants("))
    out["def_binding"] = await ask(definition, at(V1, 8, "=> x", 3))
    out["def_shadowed"] = await ask(definition, at(V1, 10, "mul_one", 2))
    out["complete_replacement"] = await ask(complete, at(V1, 8, "=> x", 3))
    out["symbols"] = await client.text_document_document_symbol_async(T.DocumentSymbolParams(doc))
    out["format"] = await client.text_document_formatting_async(
      T.DocumentFormattingParams(doc, T.FormattingOptions(tab_size=2, insert_spaces=True)))

    def change(version: int, text: str):
      client.text_document_did_change(T.DidChangeTextDocumentParams(
        T.VersionedTextDocumentIdentifier(version, uri), [T.TextDocumentContentChangeWholeDocument(text)]))
    change(2, V2)
    out["v2"] = await diagnostics_of(2)
    change(3, V3)
    out["v3"] = await diagnostics_of(3)
    # while typing: the text does not parse, completion still knows the ops, dtypes, helpers and the names bound so far
    typing = V1 + "  rule new: c:CONST * y{"
    change(4, typing)
    end = len(typing.split("\n")) - 1
    out["v4"] = await diagnostics_of(4)
    out["complete_dtype"] = await ask(complete, T.Position(end, len(typing.split("\n")[-1])))
    typing = V1 + "  rule new: c:CONST * y => "
    change(5, typing)
    out["complete_typing"] = await ask(complete, T.Position(end, len(typing.split("\n")[-1])))
    typing = V1.replace("(fold_constants)", "(fold_constants, )")
    change(6, typing)
    out["complete_use"] = await ask(complete, at(typing, 0, ", )", 2))
    await client.shutdown_async(None)
    client.exit(None)
  finally:
    await client.stop()
  return out


def test_lsp_session(tmp_path):
  out = asyncio.run(asyncio.wait_for(session(tmp_path), 120))
  caps = out["capabilities"]
  assert caps.hover_provider and caps.definition_provider and caps.completion_provider
  assert caps.document_symbol_provider and caps.document_formatting_provider

  # diagnostics: the clean file has only the shadowing warning; the edits bring an unbound name, then a failing example
  (w,) = out["v1"]
  assert (w.code, w.severity, w.source) == ("R505", T.DiagnosticSeverity.Warning, "rulec")
  assert (w.range.start.line, w.range.start.character) == (10, 2)
  assert w.related_information and w.related_information[0].location.range.start.line == 3
  err = [d for d in out["v2"] if d.code == "R201"]
  assert len(err) == 1 and err[0].severity == T.DiagnosticSeverity.Error
  y = V2.split("\n")[8].index("+ y") + 2
  assert (err[0].range.start.line, err[0].range.start.character, err[0].range.end.line, err[0].range.end.character) == (8, y, 8, y + 1)
  (ex,) = [d for d in out["v3"] if d.code != "R505"]
  assert ex.code == "R601" and "add_zero" in ex.message
  col = V3.split("\n")[9].index("RANGE(4)")
  assert (ex.range.start.line, ex.range.start.character, ex.range.end.character) == (9, col, col + len("RANGE(4)"))
  assert [d.code for d in out["v4"]] == ["R001"]

  # hover
  rule = out["hover_rule"].contents.value
  assert "add_zero" in rule and "ruleset `s`" in rule and "my.rules:9:3" in rule
  assert "x.vmin >= 0" in rule and "RANGE(3) + 0 => RANGE(3)" in rule and "fired** 3 times in 7 attempts" in rule
  helper = out["hover_helper"].contents.value
  assert "def fold_constants(" in helper and inspect.getdoc(symbolic_helpers.fold_constants).split("\n")[0] in helper
  assert "op group" in out["hover_group"].contents.value and "`ADD`" in out["hover_group"].contents.value
  assert "binding" in out["hover_binding"].contents.value and "x{ints}" in out["hover_binding"].contents.value

  # definition
  (inc,) = out["def_include"]
  assert inc.uri.endswith("/mine/my.rules") and inc.range.start.line == 2
  (hp,) = out["def_helper"]
  assert hp.uri.endswith("engine/sched/symbolic.py")
  assert hp.range.start.line + 1 == inspect.getsourcelines(symbolic_helpers.fold_constants)[1]
  (bd,) = out["def_binding"]
  assert (bd.range.start.line, bd.range.start.character) == (8, V1.split("\n")[8].index("x{ints}"))
  (sh,) = out["def_shadowed"]   # the rule behind the R505 warning: the earlier rule that shadows mul_one
  assert (sh.range.start.line, sh.range.start.character) == (3, 2)

  # completion
  labels = lambda r: {i.label: i for i in (r.items if hasattr(r, "items") else r)}  # noqa: E731
  repl = labels(out["complete_replacement"])
  assert {"x", "fold_constants", "CONST", "ALU", "int32", "ints", "len"} <= set(repl)
  assert repl["x"].kind == T.CompletionItemKind.Variable and repl["fold_constants"].kind == T.CompletionItemKind.Function
  dtype = labels(out["complete_dtype"])
  assert {"int32", "float32", "ints", "floats"} <= set(dtype) and "CONST" not in dtype
  typed = labels(out["complete_typing"])
  assert {"c", "y", "CONST", "fold_constants"} <= set(typed)
  assert {"bounds_const", "divmod_parts"} <= set(labels(out["complete_use"]))

  # document symbols and formatting
  sets = {s.name: s for s in out["symbols"] if s.kind == T.SymbolKind.Namespace}
  assert set(sets) == {"base", "s"} and [c.name for c in sets["s"].children] == ["fold_alu", "add_zero", "mul_one"]
  (edit,) = out["format"]
  assert "  rule mul_one: x * 1 => x\n" in edit.new_text and edit.range.start == T.Position(0, 0)


def test_use_completes_the_helper_libraries():
  """After `use`, the names a rules file may use: rulec's helper libraries (engine/lang/libraries.py)."""
  from rulec.engine.lang.libraries import LIBRARIES
  from rulec.lsp import completions
  for line in ("use ", "use sym", "  use  dec"):
    assert {c.label for c in completions(None, False, [line], 0, len(line))} == set(LIBRARIES)
  # inside the parentheses: the library's helpers, not the libraries
  assert "fold_constants" in {c.label for c in completions(None, False, ["use symbolic (f"], 0, 16)}
