"""Diagnostics: a stable code, a location, a message; rendered as
`file:line:col: error R201: ...` with the source line and a caret, or as JSON."""
from __future__ import annotations

import json
import re

import attrs

from rulec.engine.lang.ast import Span

# Every code rulec can report; docs/rules.md lists the same table (a test keeps them in step).
CODES: dict[str, str] = {
  "R001": "syntax error",
  "R002": "unexpected character",
  "R003": "file cannot be read or is not UTF-8 text",
  "R004": "invalid literal (number or string)",
  "R005": "Python keyword used as a name",
  "R006": "not a regular file (a symbolic link, FIFO or device): not read",
  "R101": "unknown op or op group",
  "R102": "unknown dtype or dtype class",
  "R103": "wrong number of sources for an op",
  "R104": "operator with no ALU op in patterns",
  "R105": "a gradient rule's replacement is not a tuple with one entry per source",
  "R106": "gradient rules take no examples (rulec verify checks them against finite differences)",
  "R201": "name is not bound by the pattern, declared by `use`, or a builtin",
  "R202": "binding is never used",
  "R203": "name is bound to two different sub-patterns",
  "R204": "binding shadows a reserved name (ctx, a helper, a builtin)",
  "R301": "helper module cannot be imported or is not allowed",
  "R302": "helper does not exist in its module",
  "R303": "helper called with arguments its signature does not accept",
  "R304": "helper declared twice",
  "R401": "dunder or format attribute access",
  "R402": "lambda is not allowed",
  "R403": "forbidden builtin name",
  "R404": "assignment expression (:=) is not allowed",
  "R405": "statements and imports are not allowed",
  "R406": "attribute is not available to rules for the value's type",
  "R501": "duplicate rule name",
  "R502": "duplicate ruleset name",
  "R503": "unknown ruleset in includes",
  "R504": "includes form a cycle",
  "R505": "rule is shadowed by an earlier rule that always matches first",
  "R506": "a gradients set and a ruleset include each other",
  "R507": "`extends` names a rule set that no layer beneath defines",
  "R601": "example gives a different graph than expected",
  "R602": "rule does not fire on its example",
  "R603": "rule fires on an example marked `unchanged`",
  "R604": "example graph cannot be built",
  "R605": "rewriting an example raised an error",
  "R701": "pattern expands to too many source orders (commutative ops)",
  "R702": "includes nested too deeply",
  "R703": "nesting too deep (brackets, operators, patterns)",
  "R704": "literal too long",
  "R705": "file too large",
  "R706": "example ran past its time limit",
  "R707": "example ran past its memory limit",
  "R708": "a file's examples ran past their total time limit",
}

# What ends a line, for every location rulec reports: \r\n, a lone \r and \n, as editors and the LSP count them
# (the parser reads a lone \r as \n: parser.normalize_line_breaks).
LINE_BREAK = re.compile(r"\r\n?|\n")

# Reported only when examples are run (`rulec check`, check_sources(..., examples=True)), never when loading.
EXAMPLE_CODES = frozenset({"R601", "R602", "R603", "R604", "R605", "R706", "R707", "R708"})


def _unsafe(c: str) -> bool:
  """Characters never echoed raw to a terminal: controls (C0, DEL, C1), bidi overrides, surrogates, non-characters."""
  o = ord(c)
  return (o < 0x20 or 0x7f <= o < 0xa0 or 0x202a <= o <= 0x202e or 0x2066 <= o <= 0x2069 or 0xd800 <= o < 0xe000
          or o in (0x200e, 0x200f, 0x061c, 0xfeff) or not c.isprintable() and c != " ")


def escape_text(text: str) -> str:
  """A message or file name with unsafe characters written as escapes (\\x1b, \\u202e)."""
  return "".join(repr(c)[1:-1] if c != "\\" and _unsafe(c) else c for c in text)


def visible_line(text: str) -> str:
  """A source line for display: each unsafe character becomes one visible character, so carets stay aligned."""
  return "".join((chr(0x2400 + ord(c)) if ord(c) < 0x20 else "\u2421" if ord(c) == 0x7f else "\ufffd") if _unsafe(c) else c
                 for c in text)


@attrs.frozen
class Diagnostic:
  code: str
  severity: str          # "error" | "warning"
  span: Span
  message: str
  note: str | None = None

  @property
  def is_error(self) -> bool: return self.severity == "error"

  def render(self, source: str | None) -> str:
    head = escape_text(f"{self.span}: {self.severity} {self.code}: {self.message}")
    # \r\n, \r and \n, as the lexer counts lines (str.splitlines also breaks on \f, \x1c, \u2028, ...)
    lines = LINE_BREAK.split(source) if source is not None else []
    out = [head]
    if 1 <= self.span.line <= len(lines):
      text = visible_line(lines[self.span.line - 1].expandtabs(1))
      width = max(1, (self.span.end_col - self.span.col) if self.span.end_line == self.span.line else 1)
      out.append(f"  {self.span.line:>4} | {text}")
      out.append(f"       | {' ' * (self.span.col - 1)}{'^' * width}")
    if self.note: out.append(f"       = {escape_text(self.note)}")
    return "\n".join(out)

  def to_json(self) -> dict:
    return {"code": self.code, "severity": self.severity, "file": self.span.file, "line": self.span.line,
            "col": self.span.col, "end_line": self.span.end_line, "end_col": self.span.end_col,
            "message": self.message, "note": self.note}


class RuleError(Exception):
  """Raised when a rules file cannot be loaded; str() is the rendered diagnostics."""
  def __init__(self, diagnostics: list[Diagnostic], sources: dict[str, str]):
    self.diagnostics = diagnostics
    self.sources = sources
    super().__init__("\n".join(d.render(sources.get(d.span.file)) for d in diagnostics))


def render_all(diags: list[Diagnostic], sources: dict[str, str], fmt: str = "human") -> str:
  if fmt == "json": return json.dumps([d.to_json() for d in diags], indent=2)
  return "\n".join(d.render(sources.get(d.span.file)) for d in diags)
