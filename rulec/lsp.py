"""`rulec lsp`: a Language Server Protocol server for .rules files, over stdin/stdout (pygls: `pip install
'rulec[lsp]'`; docs/editors.md).

A file is checked together with the other .rules files of its directory, as `rulec check DIR` checks them
(layered over the shipped rules when they use `extends`, as `rulec check --rules DIR`), its examples run,
and the checker's findings are published with their codes and ranges a moment after each edit. Hover,
definition, completion and document symbols read the last check of the file; formatting is `rulec fmt`.
Checks run on one worker thread, so the server keeps answering while examples run.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import os
import re
import sys
from pathlib import Path

import attrs
from lsprotocol import types as T
from pygls import uris
from pygls.lsp.server import LanguageServer

from rulec.engine.ir.dtypes import ALL_DTYPES, DTYPE_CLASSES
from rulec.engine.lang import ast as A
from rulec.engine.lang.checker import CheckedLibrary
from rulec.engine.lang.diagnostics import LINE_BREAK, Diagnostic
from rulec.engine.lang.examples import ExamplesCancelled, cancel_when
from rulec.engine.lang.fmt import FormatError, format_source
from rulec.engine.lang.loader import check_sources, default_rules_dir, read_rule_file, rule_files
from rulec.engine.lang.libraries import LIBRARIES, library_helpers
from rulec.engine.lang.names import BUILTINS
from rulec.engine.ir.ops import COMMUTATIVE, FIXED_ARITY, GROUPS, Ops

DEBOUNCE_S = 0.3
STATS_FILE = "rulec-stats.txt"     # what `RULEC_STATS=1 PROGRAM 2> rulec-stats.txt` leaves (engine/lang/loader.py)
KEYWORDS = ("rule", "ruleset", "gradients", "use", "includes", "extends", "each", "if", "else", "for", "in", "not", "and",
            "or", "is", "None", "True", "False", "example", "unchanged", "ctx")
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_EXTENDS = re.compile(r"^[ \t]*(ruleset|gradients)\b[^\n#]*\bextends\b", re.MULTILINE)
_LOCATION = re.compile(r" at (.+):(\d+):(\d+)$")
_QUOTED = re.compile(r"'([A-Za-z_][A-Za-z0-9_.:]*)'")
_STAT_ROW = re.compile(r"^\s+(\d+)\s+(\d+)\s+[0-9.]+\s+(\S+) \((.*)\)\s*$")


# *** positions: Span columns count code points from 1; LSP counts the negotiated code units from 0 ***

def _units(text: str, encoding: str) -> int:
  if encoding == T.PositionEncodingKind.Utf32: return len(text)
  if encoding == T.PositionEncodingKind.Utf8: return len(text.encode("utf-8", "surrogatepass"))
  return len(text.encode("utf-16-le", "surrogatepass")) // 2


def _lines(text: str) -> list[str]: return LINE_BREAK.split(text)   # \r\n, \r, \n: as the lexer and LSP count lines


def to_position(lines: list[str], line: int, col: int, encoding: str) -> T.Position:
  """An LSP position from a 1-based (line, column in code points)."""
  k = min(max(line, 1), max(len(lines), 1)) - 1
  text = lines[k] if lines else ""
  return T.Position(k, _units(text[:max(col, 1) - 1], encoding))


def to_range(lines: list[str], span: A.Span, encoding: str) -> T.Range:
  start = to_position(lines, span.line, span.col, encoding)
  end = to_position(lines, span.end_line, span.end_col, encoding)
  return T.Range(start, end if (end.line, end.character) >= (start.line, start.character) else start)


def from_position(lines: list[str], pos: T.Position, encoding: str) -> tuple[int, int]:
  """(0-based line, 0-based code point index) of an LSP position."""
  if not lines: return 0, 0
  k = min(max(pos.line, 0), len(lines) - 1)
  text, units, i = lines[k], 0, 0
  while i < len(text) and units < pos.character:
    units += _units(text[i], encoding)
    i += 1
  return k, i


def word_at(line: str, i: int) -> tuple[str, int] | None:
  """The name under (or just before) character i, and where it starts."""
  for m in _WORD.finditer(line):
    if m.start() <= i <= m.end(): return m.group(), m.start()
  return None


def _slice(source: str, span: A.Span) -> str:
  lines = _lines(source)
  if span.line == span.end_line: return lines[span.line - 1][span.col - 1:span.end_col - 1]
  return "\n".join([lines[span.line - 1][span.col - 1:], *lines[span.line:span.end_line - 1],
                    lines[span.end_line - 1][:span.end_col - 1]])


def _pattern_text(source: str, p) -> str:
  """A sub-pattern as written; a bare name's span leaves out its dtype constraint, which is taken up to its `}`."""
  span = p.span
  if isinstance(p, A.PName) and p.dtypes:
    last = p.dtypes[-1][1]
    line = _lines(source)[last.end_line - 1]
    close = line.find("}", last.end_col - 1)
    span = A.Span(span.file, span.line, span.col, last.end_line, close + 2 if close >= 0 else last.end_col)
  return _slice(source, span)


def _in(span: A.Span, line: int, col: int) -> bool:
  """Whether the 1-based (line, col) lies in the span, its end included (a cursor just after a name is on it)."""
  return (span.line, span.col) <= (line, col) <= (span.end_line, span.end_col)


# *** one check of a document, and what it knows ***

@attrs.define
class Analysis:
  uri: str
  key: str                      # the document's path as the checker names it
  text: str
  version: int | None
  lib: CheckedLibrary
  sources: dict[str, str]       # every file of the check's library, as checked
  rf: A.RuleFile | None         # the document, parsed (None when it does not parse)

  @property
  def diagnostics(self) -> list[Diagnostic]: return [d for d in self.lib.diagnostics if d.span.file == self.key]

  def all_rules(self):
    for f in self.lib.files:
      for rs in f.rulesets:
        for r in rs.rules: yield f, rs, r

  def rulesets_named(self, name: str) -> list[tuple[A.RuleFile, A.RuleSet]]:
    return [(f, rs) for f in self.lib.files for rs in f.rulesets if rs.name == name]

  def helpers(self) -> dict[str, object]: return self.lib.helpers.get(self.key, {})

  def rule_at(self, line: int, col: int) -> A.Rule | None:
    if self.rf is None: return None
    for rs in self.rf.rulesets:
      for r in rs.rules:
        if _in(r.span, line, col) or any(_in(ex.span, line, col) for ex in r.examples): return r
    return None


def library_sources(key: str, path: Path | None, open_docs: dict[str, str]) -> tuple[dict[str, str | bytes | OSError], dict[str, int]]:
  """The files checked with a document: its directory's .rules files (open documents as edited), over the
  shipped rules when one of them uses `extends` and the directory is not the shipped one."""
  if path is None: return {key: open_docs[key]}, {}
  own = {str(p): p for p in sorted(path.parent.glob("*.rules")) if p.is_file()}
  own.setdefault(key, path)
  sources: dict[str, str | bytes | OSError] = {k: open_docs[k] if k in open_docs else read_rule_file(p) for k, p in own.items()}
  texts = [s if isinstance(s, str) else s.decode("utf-8", "replace") for s in sources.values() if not isinstance(s, OSError)]
  try: shipped = default_rules_dir().resolve()
  except FileNotFoundError: return sources, {}
  if path.parent.resolve() == shipped or not any(_EXTENDS.search(t) for t in texts): return sources, {}
  base = {str(f): read_rule_file(f) for f in rule_files([shipped])}
  return {**base, **sources}, {k: 1 for k in own}


def analyse(uri: str, key: str, path: Path | None, text: str, version: int | None, open_docs: dict[str, str],
            cancelled=None) -> Analysis:
  """Check a document with its library, examples included; `cancelled()` true stops the examples early
  (ExamplesCancelled: the document changed, a newer check is on its way)."""
  sources, layers = library_sources(key, path, {**open_docs, key: text})
  with cancel_when(cancelled or (lambda: False)):
    lib = check_sources(sources, examples=True, layers=layers)
  shown = {k: (v if isinstance(v, str) else v.decode("utf-8", "replace") if isinstance(v, bytes) else "") for k, v in sources.items()}
  rf = next((f for f in lib.files if f.path == key), None)
  return Analysis(uri, key, text, version, lib, shown, rf)


# *** what hover and completion say about a name ***

def _md_code(text: str, lang: str = "") -> str: return f"```{lang}\n{text}\n```"


def helper_doc(name: str, fn) -> str:
  try: sig = str(inspect.signature(fn))
  except (TypeError, ValueError): sig = "(...)"
  doc = inspect.getdoc(fn) or ""
  return "\n\n".join(x for x in (f"**helper** `{fn.__module__}.{name}`", _md_code(f"def {name}{sig}", "python"), doc) if x)


def op_doc(name: str) -> str | None:
  if name in GROUPS:
    return f"**op group** `{name}`: " + " ".join(f"`{o.name}`" for o in sorted(GROUPS[name]))
  if name in Ops.__members__:
    op = Ops[name]
    facts = [f"{FIXED_ARITY[op]} sources" if op in FIXED_ARITY else "any number of sources"]
    if op in COMMUTATIVE: facts.append("commutative: patterns match both source orders")
    groups = sorted(g for g, members in GROUPS.items() if op in members)
    if groups: facts.append("in the groups " + ", ".join(f"`{g}`" for g in groups))
    return f"**op** `{name}`: " + "; ".join(facts)
  return None


def dtype_doc(name: str) -> str | None:
  if name in DTYPE_CLASSES: return f"**dtype class** `{name}`: " + " ".join(f"`{d.name}`" for d in sorted(DTYPE_CLASSES[name], key=lambda d: d.name))
  if name in ALL_DTYPES:
    classes = sorted(c for c, members in DTYPE_CLASSES.items() if ALL_DTYPES[name] in members)
    return f"**dtype** `{name}`" + (f", in {', '.join(f'`{c}`' for c in classes)}" if classes else "")
  return None


def read_stats(path: Path) -> dict[str, tuple[int, int]]:
  """rule name -> (attempts, matches), summed over the matchers of a RULEC_STATS table."""
  out: dict[str, tuple[int, int]] = {}
  try: text = path.read_text(errors="replace")
  except OSError: return out
  for line in text.splitlines():
    if (m := _STAT_ROW.match(line)) is not None:
      att, hit = out.get(m[3], (0, 0))
      out[m[3]] = (att + int(m[1]), hit + int(m[2]))
  return out


def rule_doc(f: A.RuleFile, r: A.Rule, stats: dict[str, tuple[int, int]] | None, stats_name: str) -> str:
  src = f.source
  parts = [f"**rule** `{r.name}` in {'gradients' if r.grad else 'ruleset'} `{r.ruleset}` at `{r.span}`",
           _md_code(_slice(src, r.span), "rules")]
  if r.guard is not None: parts.append(f"**guard** `{_slice(src, r.guard.span)}`")
  if r.examples: parts.append("**examples**\n" + "\n".join(f"- `{_slice(src, ex.span)}`" for ex in r.examples))
  if stats is not None:
    att, hit = stats.get(r.name, (0, 0))
    parts.append(f"**fired** {hit} times in {att} attempts ({stats_name})")
  return "\n\n".join(parts)


def binding_of(r: A.Rule, name: str):
  """The sub-pattern a name is bound to in a rule's pattern, or None."""
  stack = [r.pattern]
  while stack:
    p = stack.pop()
    if isinstance(p, A.PName) and p.name == name: return p, p.span
    if isinstance(p, (A.PNode, A.PConst)) and p.name == name: return p, p.name_span
    if isinstance(p, A.PNode) and p.tail == name: return p, p.tail_span
    stack.extend(A.pattern_children(p))
  return None


def bound_names(r: A.Rule) -> list[str]:
  out, stack = [], [r.pattern]
  while stack:
    p = stack.pop()
    name = getattr(p, "name", None)
    if name and name != "_" and name not in out: out.append(name)
    if isinstance(p, A.PNode) and p.tail not in (None, "any") and p.tail not in out: out.append(p.tail)
    stack.extend(A.pattern_children(p))
  return out + ([r.grad] if r.grad else [])


def _typed_bound_names(lines: list[str], k: int, i: int) -> list[str]:
  """The names a rule being typed binds (its text may not parse): those in its pattern part, up to the cursor."""
  start = k
  while start > 0 and not lines[start].lstrip().startswith("rule ") and lines[start - 1].strip() \
      and not lines[start - 1].lstrip().startswith(("ruleset", "gradients", "use", "example", "#")):
    start -= 1
  text = "\n".join(lines[start:k] + [lines[k][:i]])
  text = re.sub(r"^\s*rule\s+\w+\s*:", "", text)
  pattern = re.sub(r"\{[^}]*\}", "", re.split(r"=>|\bif\b", text)[0])
  names = [m.group() for m in re.finditer(r"\b[a-z_][A-Za-z0-9_]*\b", pattern)]
  return [n for j, n in enumerate(names) if n not in KEYWORDS and n != "_" and n not in names[:j]]


def use_module(lines: list[str], k: int, i: int) -> str | None:
  """The module of the `use` line whose open parenthesis the cursor is in (it may span lines)."""
  for j in range(k, max(-1, k - 20), -1):
    text = "\n".join(lines[j:k] + [lines[k][:i]])
    if (m := re.match(r"[ \t]*use\s+([\w.]+)\s*\([^)]*\Z", text)) is not None: return m[1]
    if ")" in text: return None
  return None


# *** the server ***

class RulesServer(LanguageServer):
  def __init__(self):
    from rulec.engine.lang.sarif import tool_version
    super().__init__("rulec", tool_version() or "0", text_document_sync_kind=T.TextDocumentSyncKind.Full)
    self.analyses: dict[str, Analysis] = {}
    self.parsed: dict[str, Analysis] = {}    # the last check in which the document parsed: names while typing
    self.timers: dict[str, asyncio.TimerHandle] = {}
    self.edits: dict[str, int] = {}          # uri -> edits seen: a check started before the last one is stale
    self.worker = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="rulec-check")
    self.stats_path: Path | None = None

  @property
  def encoding(self) -> str: return self.workspace.position_encoding or T.PositionEncodingKind.Utf16

  def doc_key(self, uri: str) -> tuple[str, Path | None]:
    fs = uris.to_fs_path(uri) if uri.startswith("file:") else None
    return (fs, Path(fs)) if fs else (uri, None)

  def open_texts(self) -> dict[str, str]:
    return {self.doc_key(u)[0]: d.source for u, d in self.workspace.text_documents.items()}

  def schedule(self, uri: str, delay: float):
    self.edits[uri] = self.edits.get(uri, 0) + 1     # (the check in flight, if any, is stale: its examples stop)
    if (old := self.timers.pop(uri, None)) is not None: old.cancel()
    loop = asyncio.get_running_loop()
    self.timers[uri] = loop.call_later(delay, lambda: asyncio.ensure_future(self.check(uri)))

  async def check(self, uri: str):
    self.timers.pop(uri, None)
    if uri not in self.workspace.text_documents: return
    doc = self.workspace.get_text_document(uri)
    key, path = self.doc_key(uri)
    text, version = doc.source, doc.version
    loop = asyncio.get_running_loop()
    mine = self.edits.get(uri, 0)
    stale = lambda: self.edits.get(uri, 0) != mine  # noqa: E731 (read from the worker thread: an int compare)
    try: result = await loop.run_in_executor(self.worker, analyse, uri, key, path, text, version, self.open_texts(), stale)
    except ExamplesCancelled: return                   # a newer check is on its way
    except Exception as e:  # noqa: BLE001 - a bug of rulec's own must not take the editor's server down
      self.window_log_message(T.LogMessageParams(T.MessageType.Error, f"rulec: checking {key} failed: {type(e).__name__}: {e}"))
      return
    current = self.workspace.text_documents.get(uri)
    if current is None or current.source != text: return   # edited meanwhile: a newer check is on its way
    self.analyses[uri] = result
    if result.rf is not None: self.parsed[uri] = result
    self.publish(result)
    # other open files of the same library may have changed findings (a duplicate name, an include)
    for other, odoc in list(self.workspace.text_documents.items()):
      okey = self.doc_key(other)[0]
      if other != uri and okey in result.sources and other in self.analyses and odoc.source == result.sources[okey]:
        self.analyses[other] = attrs.evolve(result, uri=other, key=okey, text=odoc.source, version=odoc.version,
                                            rf=next((f for f in result.lib.files if f.path == okey), None))
        self.publish(self.analyses[other])

  def publish(self, a: Analysis):
    lines = _lines(a.text)
    out = []
    for d in a.diagnostics:
      related = []
      if d.note and (m := _LOCATION.search(d.note)) is not None and m[1] in a.sources:
        span = A.Span(m[1], int(m[2]), int(m[3]), int(m[2]), int(m[3]))
        related.append(T.DiagnosticRelatedInformation(
          T.Location(self.uri_of(m[1]), to_range(_lines(a.sources[m[1]]), span, self.encoding)), d.note))
      message = d.message + (f"\n{d.note}" if d.note else "")
      out.append(T.Diagnostic(to_range(lines, d.span, self.encoding), message, code=d.code, source="rulec",
                              severity=T.DiagnosticSeverity.Error if d.is_error else T.DiagnosticSeverity.Warning,
                              related_information=related or None))
    self.text_document_publish_diagnostics(T.PublishDiagnosticsParams(a.uri, out, a.version))

  def uri_of(self, key: str) -> str:
    for u in self.workspace.text_documents:
      if self.doc_key(u)[0] == key: return u
    return Path(key).resolve().as_uri() if os.path.isabs(key) or os.path.exists(key) else key

  def location(self, a: Analysis, span: A.Span) -> T.Location:
    return T.Location(self.uri_of(span.file), to_range(_lines(a.sources.get(span.file, "")), span, self.encoding))

  def stats(self) -> tuple[dict[str, tuple[int, int]] | None, str]:
    path = self.stats_path
    if path is None:
      env = os.environ.get("RULEC_STATS_FILE")
      root = self.workspace.root_path
      path = Path(env) if env else Path(root) / STATS_FILE if root else None
    if path is None or not path.is_file(): return None, ""
    return read_stats(path), path.name

  def lookup(self, uri: str, pos: T.Position):
    """(analysis, lines, 0-based line, char index, the word there and where it starts) for a request."""
    a = self.analyses.get(uri)
    if a is not None and a.rf is None: a = self.parsed.get(uri, a)
    doc = self.workspace.get_text_document(uri)
    lines = _lines(doc.source)
    k, i = from_position(lines, pos, self.encoding)
    w = word_at(lines[k], i) if lines else None
    fresh = a is not None and a.text == doc.source
    return a, fresh, lines, k, i, w


server = RulesServer()


@server.feature(T.INITIALIZE)
def _initialize(ls: RulesServer, params: T.InitializeParams):
  opts = params.initialization_options if isinstance(params.initialization_options, dict) else {}
  if opts.get("statsFile"): ls.stats_path = Path(opts["statsFile"])


@server.feature(T.TEXT_DOCUMENT_DID_OPEN)
async def _did_open(ls: RulesServer, params: T.DidOpenTextDocumentParams):
  await ls.check(params.text_document.uri)


@server.feature(T.TEXT_DOCUMENT_DID_CHANGE)
def _did_change(ls: RulesServer, params: T.DidChangeTextDocumentParams):
  ls.schedule(params.text_document.uri, DEBOUNCE_S)


@server.feature(T.TEXT_DOCUMENT_DID_SAVE)
def _did_save(ls: RulesServer, params: T.DidSaveTextDocumentParams):
  ls.schedule(params.text_document.uri, 0)


@server.feature(T.TEXT_DOCUMENT_DID_CLOSE)
def _did_close(ls: RulesServer, params: T.DidCloseTextDocumentParams):
  uri = params.text_document.uri
  ls.edits[uri] = ls.edits.get(uri, 0) + 1
  if (t := ls.timers.pop(uri, None)) is not None: t.cancel()
  ls.analyses.pop(uri, None)
  ls.parsed.pop(uri, None)
  ls.text_document_publish_diagnostics(T.PublishDiagnosticsParams(uri, []))


@server.feature(T.TEXT_DOCUMENT_HOVER)
def _hover(ls: RulesServer, params: T.HoverParams) -> T.Hover | None:
  a, fresh, lines, k, _, w = ls.lookup(params.text_document.uri, params.position)
  if w is None: return None
  word, start = w
  text = hover_text(ls, a, fresh, lines, k, start, word)
  if text is None: return None
  rng = T.Range(to_position(lines, k + 1, start + 1, ls.encoding), to_position(lines, k + 1, start + 1 + len(word), ls.encoding))
  return T.Hover(T.MarkupContent(T.MarkupKind.Markdown, text), rng)


def hover_text(ls: RulesServer, a: Analysis | None, fresh: bool, lines: list[str], k: int, start: int, word: str) -> str | None:
  module = use_module(lines, k, start)
  if module is not None and (fn := library_helpers(module).get(word)) is not None: return helper_doc(word, fn)
  if a is not None:
    rule = a.rule_at(k + 1, start + 1) if fresh else None
    if rule is not None and not _names_rule(lines[k], start, word):
      if word == rule.grad: return f"**gradient** `{word}`: the gradient flowing into the node rule `{rule.name}` matches"
      if (found := binding_of(rule, word)) is not None:
        return f"**binding** `{word}` in rule `{rule.name}`:\n\n" + _md_code(_pattern_text(a.rf.source, found[0]), "rules")
    rules = [(f, r) for f, _, r in a.all_rules() if r.name == word]
    if rules:
      stats, stats_name = ls.stats()
      return "\n\n---\n\n".join(rule_doc(f, r, stats, stats_name) for f, r in rules)
    if (sets := a.rulesets_named(word)):
      docs = []
      for _, rs in sets:
        head = f"**{'gradients' if rs.grad else 'ruleset'}** `{rs.name}` at `{rs.span}`: {len(rs.rules)} rules"
        if rs.includes: head += "; includes " + ", ".join(f"`{n}`" for n, _ in rs.includes)
        if rs.extends: head += f"; extends `{rs.extends[0]}`"
        docs.append(head + ("\n\n" + " ".join(f"`{r.name}`" for r in rs.rules) if rs.rules else ""))
      return "\n\n---\n\n".join(docs)
    if word in (helpers := a.helpers()): return helper_doc(word, helpers[word])
  if (doc := op_doc(word)) is not None: return doc
  if (doc := dtype_doc(word)) is not None: return doc
  if word in BUILTINS: return f"**builtin** `{word}`"
  if word == "ctx": return "**ctx**: the context object the caller passes to graph_rewrite"
  return None


def _names_rule(line: str, start: int, word: str) -> bool:
  """Whether the word at `start` is the NAME of `rule NAME:`."""
  return re.match(rf"\s*rule\s+{re.escape(word)}\s*:", line) is not None and line.index(word, line.index("rule") + 4) == start


@server.feature(T.TEXT_DOCUMENT_DEFINITION)
def _definition(ls: RulesServer, params: T.DefinitionParams) -> list[T.Location] | None:
  a, fresh, lines, k, i, w = ls.lookup(params.text_document.uri, params.position)
  if a is None: return None
  rule = a.rule_at(k + 1, i + 1) if fresh else None
  if w is not None:
    word, start = w
    # a rule set named in a header (after includes or extends)
    sets = a.rulesets_named(word)
    header = next((lines[j] for j in range(k, max(-1, k - 10), -1) if re.match(r"\s*(ruleset|gradients)\b", lines[j])), None)
    if sets and header is not None and rule is None:
      # `extends BASE` means the set of a layer beneath: the one in another file
      if re.search(rf"\bextends\s+{re.escape(word)}\b", header): sets = [s for s in sets if s[0].path != a.key] or sets
      return [ls.location(a, rs.span) for _, rs in sets]
    # a helper: its Python source
    module = use_module(lines, k, start)
    fn = library_helpers(module).get(word) if module else a.helpers().get(word)
    if fn is not None:
      try:
        file, (_, first) = inspect.getsourcefile(fn), inspect.getsourcelines(fn)
        if file: return [T.Location(Path(file).resolve().as_uri(), T.Range(T.Position(first - 1, 0), T.Position(first - 1, 0)))]
      except (OSError, TypeError): pass
    # a bound name: where the pattern binds it
    if rule is not None and not _names_rule(lines[k], start, word) and (found := binding_of(rule, word)) is not None:
      return [ls.location(a, found[1])]
  # the rule behind a diagnostic at the cursor: the location its note gives, else the rule its message names
  for d in a.diagnostics if fresh else ():
    if not _in(d.span, k + 1, i + 1): continue
    if d.note and (m := _LOCATION.search(d.note)) is not None and m[1] in a.sources:
      return [ls.location(a, A.Span(m[1], int(m[2]), int(m[3]), int(m[2]), int(m[3])))]
    for name in _QUOTED.findall(d.message):
      if (named := [r for _, _, r in a.all_rules() if r.name == name]): return [ls.location(a, named[0].span)]
  if w is not None and (named := [r for _, _, r in a.all_rules() if r.name == w[0]]):
    return [ls.location(a, r.span) for r in named]
  return None


@server.feature(T.TEXT_DOCUMENT_COMPLETION, T.CompletionOptions(trigger_characters=["{", ",", "(", " "]))
def _completion(ls: RulesServer, params: T.CompletionParams) -> T.CompletionList:
  a, fresh, lines, k, i, _ = ls.lookup(params.text_document.uri, params.position)
  return T.CompletionList(False, completions(a, fresh, lines, k, i))


def completions(a: Analysis | None, fresh: bool, lines: list[str], k: int, i: int) -> list[T.CompletionItem]:
  K = T.CompletionItemKind
  before = lines[k][:i] if lines else ""
  item = lambda label, kind, detail=None: T.CompletionItem(label, kind=kind, detail=detail)  # noqa: E731
  if re.match(r"[ \t]*use\s+[\w.]*\Z", before):   # the library a `use` line names
    return [item(name, K.Module, f"helper library ({module})") for name, module in sorted(LIBRARIES.items())]
  if (module := use_module(lines, k, i)) is not None:
    return [item(name, K.Function, "rule helper") for name in library_helpers(module)]
  if before.count("{") > before.count("}"):
    return [item(n, K.Constant, "dtype") for n in ALL_DTYPES] + [item(n, K.Class, "dtype class") for n in DTYPE_CLASSES]
  if re.search(r"\b(includes|extends)\b[\w\s,]*$", before):
    names = {rs.name for f in a.lib.files for rs in f.rulesets} if a is not None else set()
    return [item(n, K.Module, "rule set") for n in sorted(names)]
  out = [item(o, K.EnumMember, "op") for o in Ops.__members__]
  out += [item(g, K.Class, "op group: " + " ".join(sorted(o.name for o in GROUPS[g]))) for g in GROUPS]
  out += [item(n, K.Constant, "dtype") for n in ALL_DTYPES] + [item(n, K.Class, "dtype class") for n in DTYPE_CLASSES]
  if a is not None:
    for name, fn in a.helpers().items():
      try: sig = f"{name}{inspect.signature(fn)}"
      except (TypeError, ValueError): sig = name
      out.append(item(name, K.Function, f"helper {sig}"))
  rule = a.rule_at(k + 1, i + 1) if a is not None and fresh else None
  bound = bound_names(rule) if rule is not None else _typed_bound_names(lines, k, i)
  out += [item(n, K.Variable, "bound by the pattern") for n in bound]
  out += [item(n, K.Function, "builtin") for n in BUILTINS] + [item(n, K.Keyword) for n in KEYWORDS]
  return out


@server.feature(T.TEXT_DOCUMENT_DOCUMENT_SYMBOL)
def _symbols(ls: RulesServer, params: T.DocumentSymbolParams) -> list[T.DocumentSymbol]:
  a = ls.analyses.get(params.text_document.uri)
  if a is None or a.rf is None: return []
  lines, enc = _lines(a.rf.source), ls.encoding
  out = []
  for u in a.rf.uses:
    r = to_range(lines, u.span, enc)
    out.append(T.DocumentSymbol(f"use {u.module}", T.SymbolKind.Module, r, to_range(lines, u.module_span, enc),
                                detail=", ".join(n for n, _ in u.names)))
  for rs in a.rf.rulesets:
    children = []
    for r in rs.rules:
      end = r.examples[-1].span if r.examples else r.span
      full = A.Span(r.span.file, r.span.line, r.span.col, end.end_line, end.end_col)
      children.append(T.DocumentSymbol(r.name, T.SymbolKind.Function, to_range(lines, full, enc), to_range(lines, r.span, enc),
                                       detail=r.source_line))
    last = children[-1].range.end if children else to_range(lines, rs.span, enc).end
    head = to_position(lines, rs.span.line, 1, enc)
    out.append(T.DocumentSymbol(rs.name, T.SymbolKind.Namespace, T.Range(head, last), to_range(lines, rs.span, enc),
                                detail="gradients" if rs.grad else "ruleset", children=children))
  return out


@server.feature(T.TEXT_DOCUMENT_FORMATTING)
def _formatting(ls: RulesServer, params: T.DocumentFormattingParams) -> list[T.TextEdit] | None:
  doc = ls.workspace.get_text_document(params.text_document.uri)
  try: out = format_source(doc.source, ls.doc_key(doc.uri)[0])
  except (FormatError, RuntimeError) as e:
    ls.window_show_message(T.ShowMessageParams(T.MessageType.Warning, f"rulec fmt: {e}".split("\n")[0]))
    return None
  if out == doc.source: return []
  lines = _lines(doc.source)
  end = T.Position(len(lines) - 1, _units(lines[-1], ls.encoding))
  return [T.TextEdit(T.Range(T.Position(0, 0), end), out)]


def serve() -> int:
  # stdout carries the protocol: anything printed while checking (a helper module, say) goes to stderr instead
  out = sys.stdout.buffer
  sys.stdout = sys.stderr
  server.start_io(sys.stdin.buffer, out)
  return 0


__all__ = ["Analysis", "RulesServer", "serve", "server"]
