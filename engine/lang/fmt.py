"""`rulec fmt`: the one canonical layout of a .rules file.

The formatter works on the lexer's tokens, comments included, and on the parser's own joining of physical
lines into logical ones (RuleLayout), never on text patterns: the formatted file feeds the parser the same
tokens in the same logical lines as the original, so it holds the same rules with the same meaning (a
self-check re-lexes the result and refuses to hand back anything else). A file that does not parse is
refused with its diagnostics.

The layout (docs/editors.md): top-level lines (`use`, `ruleset`, `gradients`) at column 0, rules two spaces
in, examples four; one space around binary operators, `=>`, `if` and keywords, none inside brackets, after
unary operators, around `.`, a binding's `:` or a keyword argument's `=`; one space after a comma; a
continuation line two spaces deeper than its rule (four for `use` and header lines), or inside brackets
aligned one column past the open bracket (two spaces deeper than the bracket's line when the bracket ends
its line); at most one blank line in a row, and one before every rule set with the comments just above it;
comments kept, a full-line comment indented like the line it precedes, a trailing one two spaces after
the code. Line breaks the author made stay; a rule written on one line that is longer than MAX_WIDTH is
broken before `=>`, then before its guard's `if`, then before the guard's `and`/`or`, then after the
commas of the replacement's first bracket that has them.
"""
from __future__ import annotations

import copy
import functools
import itertools

import attrs
from lark import Token
from lark.lexer import BasicLexer, LexerThread

from rulec.engine.lang.diagnostics import Diagnostic
from rulec.engine.lang.parser import RuleLayout, _lark, decode_source, parse_rules

MAX_WIDTH = 120
RULE_INDENT, EXAMPLE_INDENT = 2, 4

_OPEN, _CLOSE = {"LPAR", "LSQB", "LBRACE"}, {"RPAR", "RSQB", "RBRACE"}
# a token after which an operator is binary: what ends an operand
_OPERAND_END = {"NAME", "OPNAME", "NUMBER", "STRING", "CONSTKW", "RPAR", "RSQB", "RBRACE", "DOTDOT"}
_MAYBE_UNARY = {"MINUS", "ADDOP", "TILDE", "STAR", "DSTAR"}


class FormatError(Exception):
  """The file cannot be formatted: it does not parse. `diagnostics` say where (file:line:col)."""
  def __init__(self, diagnostics: list[Diagnostic], source: str):
    self.diagnostics, self.source = diagnostics, source
    super().__init__("\n".join(d.render(source) for d in diagnostics))


@attrs.define
class _Gap:
  """What lies between two significant tokens: comments, blank lines, and how the line broke there."""
  trailing: str | None = None      # a comment on the line of the token before
  items: list = attrs.Factory(list)  # "blank" or (comment text, column), in order, after the first line break
  nl: int = 0                      # newlines the parser saw (_NL)
  backslash: bool = False          # a `\` line join
  phys: int = 0                    # physical line breaks of either kind


@functools.cache
def _full_lexer() -> BasicLexer:
  """The parser's own lexer, keeping what it ignores (spaces, `\\` joins, comments) so nothing is lost."""
  conf = _lark().lexer_conf
  full = copy.copy(conf)
  full.ignore = ()
  return BasicLexer(full)


def _lex(text: str):
  """(significant tokens, gaps, parser stream): gaps[i] precedes token i and gaps[-1] follows the last."""
  ignored = set(_lark().lexer_conf.ignore)
  sig: list[Token] = []
  gaps: list[_Gap] = []
  stream: list[Token] = []
  gap, content = _Gap(), False
  for tok in LexerThread.from_text(_full_lexer(), text).lex(None):
    if tok.type == "COMMENT":
      body = tok.value.rstrip()
      if gap.phys == 0 and sig: gap.trailing = body
      else: gap.items.append((body, tok.column))
      content = True
    elif tok.type == "_NL":
      stream.append(tok)
      for _ in range(tok.value.count("\n")):
        if not content: gap.items.append("blank")
        content = False
        gap.nl += 1; gap.phys += 1
    elif tok.type in ignored:
      if "\n" in tok.value:
        gap.backslash, content = True, False
        gap.phys += 1
    else:
      stream.append(tok)
      gaps.append(gap)
      sig.append(tok)
      gap, content = _Gap(), True
  gaps.append(gap)
  return sig, gaps, stream


def _logical(sig: list[Token], stream: list[Token]) -> tuple[list[str], list[int]]:
  """The token types as the parser sees them (EXAMPLE included) and the index of each logical line's first token."""
  types, starts, k, pending = [t.type for t in sig], [], 0, True
  for tok in RuleLayout().process(iter(stream)):
    if tok.type == "_NL": pending = True; continue
    if pending: starts.append(k); pending = False
    types[k] = tok.type
    k += 1
  return types, starts


def _signature(sig: list[Token], types: list[str], starts: list[int]) -> list[tuple[tuple[str, str], ...]]:
  bounds = starts + [len(sig)]
  return [tuple((types[i], sig[i].value) for i in range(a, b)) for a, b in itertools.pairwise(bounds)]


def layout_signature(text: str) -> list[tuple[tuple[str, str], ...]]:
  """What the parser is given, positions aside: each logical line's (type, value) tokens. Two texts with the
  same signature parse to the same tree."""
  sig, _, stream = _lex(text)
  return _signature(sig, *_logical(sig, stream))


class _Line:
  """One logical line: its tokens' spacing, bracket structure and the places it may be broken."""

  def __init__(self, types: list[str], values: list[str], kind: str):
    self.types, self.values, self.kind = types, values, kind
    n = len(types)
    self.space = [""] * n
    self.depth = [0] * n             # brackets open before the token
    self.match: dict[int, int] = {}  # open bracket -> its close
    zone = "pattern"
    stack: list[int] = []
    lambdas: list[int] = []
    tight_after = False
    for i, (t, v) in enumerate(zip(types, values, strict=True)):
      prev = types[i - 1] if i else None
      self.depth[i] = len(stack)
      if i == 0 or tight_after or t in _CLOSE or t in ("COMMA", "COLON"): sp = ""
      elif t == "DOT": sp = " " if prev == "NUMBER" else ""   # `1 .real`: `1.real` would lex as `1.` `real`
      elif t in _OPEN: sp = " " if kind == "use" and t == "LPAR" or prev not in _OPERAND_END else ""
      elif t == "EQUAL": sp = ""
      else: sp = " "
      self.space[i] = sp
      if t in _OPEN: tight_after = True; stack.append(i)
      elif t in _CLOSE:
        if stack: self.match[stack.pop()] = i
        tight_after = False
      elif t in ("DOT", "EQUAL"): tight_after = True
      elif t in _MAYBE_UNARY: tight_after = t == "TILDE" or prev not in _OPERAND_END
      elif t == "COLON": tight_after = self._colon(i, zone, stack, lambdas) in ("bind", "slice")
      else: tight_after = False
      if t == "LAMBDA": lambdas.append(len(stack))
      if kind == "rule" and zone == "pattern" and not stack and (t == "IF" or v == "=>"): zone = "expr"

  def _colon(self, i, zone, stack, lambdas) -> str:
    if self.kind == "example": return "label" if i == 1 else "bind"
    if self.kind != "rule": return "label"
    if i == 2 and self.types[0] == "RULE": return "label"
    if zone == "pattern": return "bind"
    if lambdas and lambdas[-1] == len(stack): lambdas.pop(); return "lambda"
    if stack and self.types[stack[-1]] == "LSQB": return "slice"
    return "dict"

  def candidates(self) -> list[list[int]]:
    """Where an over-long one-line form may break, in the order they are tried: indices of the token that
    starts the new line. Never after a `:` outside brackets (such a line always ends) nor before `example`."""
    t, v, d, n = self.types, self.values, self.depth, len(self.types)
    def after_commas(lo: int, hi: int, level: int) -> list[int]:
      return [i + 1 for i in range(lo, hi) if t[i] == "COMMA" and d[i] == level and i + 1 < n and t[i + 1] not in _CLOSE]
    if self.kind == "use":
      open_ = next((i for i in range(n) if t[i] == "LPAR"), None)
      return [after_commas(open_, self.match.get(open_, n), 1)] if open_ is not None else []
    if self.kind == "header": return [after_commas(0, n, 0)]
    if self.kind != "rule": return []
    arrow = next((i for i in range(n) if v[i] == "=>" and d[i] == 0), None)
    if arrow is None: return []
    guard = next((i for i in range(arrow) if t[i] == "IF" and d[i] == 0), None)
    out = [[arrow]]
    if guard is not None:
      out.append([guard])
      out.append([i for i in range(guard + 1, arrow) if t[i] in ("AND", "OR") and d[i] == 0])
    first = next((i for i in range(arrow + 1, n) if t[i] in _OPEN and after_commas(i, self.match.get(i, n), d[i] + 1)), None)
    if first is not None: out.append(after_commas(first, self.match.get(first, n), d[first] + 1))
    return out

  def render(self, base: int, cont: int, breaks: dict[int, str], gaps: list[_Gap] | None) -> tuple[list[str], list[tuple[int, int]]]:
    """The physical lines for these breaks (index -> "nl" or "bs"), and each token's (line, end column).
    gaps[i] (when given) holds the comments between token i - 1 and token i."""
    t, v = self.types, self.values
    lines: list[str] = []
    cur, line_indent = " " * base, base
    stack: list[tuple[int, int, bool]] = []   # (column of the bracket, indent of its line, ends its line)
    ends: list[tuple[int, int]] = []
    for i in range(len(t)):
      if i and i in breaks:
        gap = gaps[i] if gaps is not None else None
        tail = " \\" if breaks[i] == "bs" else ""
        lines.append(cur + tail + (f"  {gap.trailing}" if gap is not None and gap.trailing else ""))
        if stack:
          col, ind, hanging = stack[-1]
          indent = (ind if t[i] in _CLOSE else ind + 2) if hanging else col + 1
        else: indent = base + cont
        if gap is not None: lines += [" " * indent + c[0] for c in gap.items if c != "blank"]
        cur, line_indent = " " * indent, indent
      else: cur += self.space[i]
      if t[i] in _OPEN: stack.append((len(cur), line_indent, i + 1 in breaks))
      elif t[i] in _CLOSE and stack: stack.pop()
      cur += v[i]
      ends.append((len(lines), len(cur)))
    lines.append(cur)
    return lines, ends


def _autobreak(line: _Line, base: int, cont: int, width: int) -> dict[int, str]:
  """Breaks for a one-line form longer than `width`: each group of candidates in turn, each break placed
  as late as still fits (or, where nothing fits, as early as it can be)."""
  breaks: dict[int, str] = {}
  for group in line.candidates():
    while True:
      lines, ends = line.render(base, cont, breaks, None)
      added = False
      for ln, text in enumerate(lines):
        if len(text) <= width: continue
        here = [c for c in group if c not in breaks and ends[c][0] == ln and ends[c - 1][0] == ln]
        if not here: continue
        fits = [c for c in here if ends[c - 1][1] <= width]
        breaks[max(fits) if fits else min(here)] = "nl"
        added = True
        break
      if not added: break
  return breaks


def _kind(first_type: str) -> str:
  if first_type == "USE": return "use"
  if first_type in ("RULESET", "GRADIENTS"): return "header"
  if first_type == "EXAMPLE": return "example"
  return "rule"


def format_source(source: str, path: str = "<source>", width: int = MAX_WIDTH) -> str:
  """The canonical form of a rules file's text. Raises FormatError (with located diagnostics) when it does not parse."""
  text, bad = decode_source(path, source)
  if bad is not None: raise FormatError([bad], text)
  rf, diags = parse_rules(text, path)
  if rf is None: raise FormatError([d for d in diags if d.is_error], text)
  sig, gaps, stream = _lex(text)
  types, starts = _logical(sig, stream)
  values = [t.value for t in sig]
  out: list[str] = []
  in_ruleset = False

  def between(items: list, indent: int | None, header: bool):
    """Blank lines and full-line comments before a logical line (indent None: at the end of the file)."""
    items = [x for k, x in enumerate(items) if x != "blank" or k == 0 or items[k - 1] != "blank"]
    if not out: items = items[next((k for k, x in enumerate(items) if x != "blank"), len(items)):]
    if indent is None:
      while items and items[-1] == "blank": items.pop()
    last_blank = max((k for k, x in enumerate(items) if x == "blank"), default=-1)
    if header and out and last_blank == -1: items, last_blank = ["blank"] + items, 0
    def fallback(col: int) -> int: return RULE_INDENT if in_ruleset and col > 1 else 0
    for k, x in enumerate(items):
      if x == "blank": out.append("")
      else: out.append(" " * (indent if k > last_blank and indent is not None else fallback(x[1])) + x[0])

  bounds = starts + [len(sig)]
  for a, b in itertools.pairwise(bounds):
    kind = _kind(types[a])
    base = {"use": 0, "header": 0, "rule": RULE_INDENT, "example": EXAMPLE_INDENT}[kind]
    cont = 4 if kind in ("use", "header") else 2
    if gaps[a].trailing and out: out[-1] += f"  {gaps[a].trailing}"
    between(gaps[a].items, base, kind == "header")
    line = _Line(types[a:b], values[a:b], kind)
    inner = gaps[a:b]
    breaks = {i - a: ("nl" if gaps[i].nl else "bs") for i in range(a + 1, b) if gaps[i].phys}
    if not breaks:
      lines, _ = line.render(base, cont, {}, None)
      if len(lines[0]) > width: breaks = _autobreak(line, base, cont, width)
    out += line.render(base, cont, breaks, inner)[0]
    if kind == "header": in_ruleset = True
    elif kind == "use": in_ruleset = False
  if gaps[-1].trailing and out: out[-1] += f"  {gaps[-1].trailing}"
  between(gaps[-1].items, None, False)
  result = "".join(ln.rstrip() + "\n" for ln in out)
  if layout_signature(result) != _signature(sig, types, starts):
    raise RuntimeError(f"rulec fmt: internal error: the formatted {path} would not mean the same; left unchanged")
  return result

