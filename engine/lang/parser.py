"""Lark parser for .rules files: source text -> RuleFile AST (rulec.engine.lang.ast).

Syntax errors come back as Diagnostics (R001/R002/R404/R405) with the
location of the offending token, never as a Lark traceback.
"""
from __future__ import annotations

import ast as pyast
import functools
import os
import re
import warnings

import attrs
from lark import Lark, Token, Transformer, Tree, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken, VisitError

from rulec.engine.lang import ast as A
from rulec.engine.lang.diagnostics import Diagnostic
from rulec.engine.lang.limits import (MAX_BRACKETS, MAX_FILE_BYTES, MAX_NUMBER_CHARS, MAX_PARSE_DEPTH, MAX_STRING_CHARS,
                                MAX_TOKENS)

GRAMMAR_PATH = os.path.join(os.path.dirname(__file__), "rules.lark")


class RuleLayout:
  """Post-lexer that turns physical lines into logical ones.

  A newline is dropped (the line continues) inside brackets, or when the next
  line is indented deeper than the line that started the current logical line.
  A line ending in ':' (a ruleset header) always ends, so its rules may be indented.
  A line that starts with `example:` (outside brackets) always starts a logical
  line, whatever its indentation: its first token becomes EXAMPLE.
  """
  always_accept = ("_NL",)
  OPEN, CLOSE = {"LPAR", "LSQB", "LBRACE"}, {"RPAR", "RSQB", "RBRACE"}

  def process(self, stream):
    depth, base, pending, prev, count = 0, None, None, None, 0
    for tok, nxt in _with_next(stream):
      count += 1
      if count > MAX_TOKENS:
        raise _LimitError("R705", tok, f"the file has more than {MAX_TOKENS} tokens; split it into several files")
      if tok.type == "_NL":
        pending = tok
        continue
      if base is None: base = tok.column - 1
      if pending is not None:
        indent = len(pending.value.rsplit("\n", 1)[-1])
        if depth == 0 and tok.type == "NAME" and tok.value == "example" and nxt is not None and nxt.type == "COLON":
          tok = Token.new_borrow_pos("EXAMPLE", tok.value, tok)
          if prev is not None: yield pending
          base = indent
        elif depth > 0: pass
        elif prev is not None and prev.type == "COLON":
          yield pending; base = indent
        elif indent > base: pass
        else:
          if prev is not None: yield pending
          base = indent
        pending = None
      if tok.type in self.OPEN:
        depth += 1
        if depth > MAX_BRACKETS:
          raise _LimitError("R703", tok, f"more than {MAX_BRACKETS} brackets are open here",
                            note="split the rule, or move the computation into a helper")
      elif tok.type in self.CLOSE: depth = max(0, depth - 1)
      prev = tok
      yield tok
    if prev is not None:
      yield Token("_NL", "\n", line=prev.end_line, column=prev.end_column, end_line=prev.end_line, end_column=prev.end_column)


def _with_next(stream):
  """(token, the token after it or None); lexer errors surface one token early, with their own position."""
  prev = None
  for tok in stream:
    if prev is not None: yield prev, tok
    prev = tok
  if prev is not None: yield prev, None


@functools.cache
def _lark() -> Lark:
  with open(GRAMMAR_PATH) as f: grammar = f.read()
  return Lark(grammar, parser="lalr", lexer="basic", postlex=RuleLayout(), propagate_positions=True, maybe_placeholders=True)


_FRIENDLY = {"NAME": "a name", "OPNAME": "an op name", "NUMBER": "a number", "STRING": "a string", "_NL": "end of line",
             "CONSTKW": "None/True/False", "$END": "end of file", "CMPOP": "a comparison", "MULOP": "'//', '/', '%', '@'",
             "SHIFTOP": "'<<', '>>'"}

_PATTERN_OPS = {"+": "ADD", "-": "SUB", "*": "MUL", "//": "IDIV", "%": "MOD", "/": "FDIV", "<": "CMPLT", "!=": "CMPNE",
                "==": "CMPEQ", "&": "AND", "^": "XOR", "<<": "SHL", ">>": "SHR"}


def _describe(names) -> str:
  lark = _lark()
  out = set()
  for n in names:
    if n in _FRIENDLY: out.add(_FRIENDLY[n]); continue
    try:
      pat = lark.get_terminal(n).pattern
      out.add(repr(pat.value) if pat.type == "str" else n)
    except KeyError: out.add(n)
  return ", ".join(sorted(out))


class _LimitError(Exception):
  """A limit passed while lexing (R703, R705): raised through Lark by the post-lexer."""
  def __init__(self, code: str, tok: Token, message: str, note: str | None = None):
    super().__init__(message)
    self.code, self.tok, self.message, self.note = code, tok, message, note


class _LiteralError(Exception):
  def __init__(self, code: str, span: A.Span, message: str):
    super().__init__(message)
    self.code, self.span, self.message = code, span, message


_LONE_CR = re.compile(r"\r(?!\n)")


def normalize_line_breaks(text: str) -> str:
  """`text` with each lone CR (one not followed by LF) made an LF, so that \r\n, \r and \n each end one line, as in
  editors and the LSP: the lexer counts lines by LF. Lengths and columns stay as they were (one character for one)."""
  return _LONE_CR.sub("\n", text) if "\r" in text else text


def decode_source(path: str, data: bytes | str) -> tuple[str, Diagnostic | None]:
  """The text of a rules file (its lone CRs read as line breaks), and an R003 (located at the first bad byte) or
  R705 when it cannot be parsed."""
  if isinstance(data, str):
    text, bad = normalize_line_breaks(data), None
  else:
    try: text, bad = normalize_line_breaks(data.decode("utf-8")), None
    except UnicodeDecodeError as e:
      text, bad = normalize_line_breaks(data.decode("utf-8", errors="replace")), e
  size = len(data) if isinstance(data, bytes) else len(data.encode("utf-8", errors="replace"))
  if size > MAX_FILE_BYTES:
    return text, Diagnostic("R705", "error", A.Span(path, 1, 1, 1, 1),
                            f"the file has {size} bytes; rules files are limited to {MAX_FILE_BYTES} bytes")
  if bad is not None:
    head = normalize_line_breaks(data[:bad.start].decode("utf-8", errors="replace"))
    line = head.count("\n") + 1
    col = len(head) - (head.rfind("\n") + 1) + 1
    return text, Diagnostic("R003", "error", A.Span(path, line, col, line, col + 1),
                            f"the file is not UTF-8 text: byte 0x{data[bad.start]:02x} at offset {bad.start} ({bad.reason})")
  return text, None


def _tree_too_deep(tree, path: str) -> Diagnostic | None:
  """R703 when the parse tree nests deeper than MAX_PARSE_DEPTH (measured without recursion)."""
  stack = [(tree, 1)]
  while stack:
    t, d = stack.pop()
    if not isinstance(t, Tree): continue
    if d > MAX_PARSE_DEPTH:
      m = t.meta
      line, col = getattr(m, "line", 1), getattr(m, "column", 1)
      return Diagnostic("R703", "error", A.Span(path, line, col, line, col + 1),
                        f"expressions nest more than {MAX_PARSE_DEPTH} levels deep here",
                        note="split the rule, or move the computation into a helper")
    stack.extend((c, d + 1) for c in t.children)
  return None


def parse_rules(source: str, path: str) -> tuple[A.RuleFile | None, list[Diagnostic]]:
  """Parse one file. Returns (ast, diagnostics); ast is None when there is a syntax error."""
  source = normalize_line_breaks(source)
  try:
    tree = _lark().parse(source)
  except UnexpectedInput as e:
    return None, [_syntax_diagnostic(e, source, path)]
  except _LimitError as e:
    t = e.tok
    return None, [Diagnostic(e.code, "error", A.Span(path, t.line, t.column, t.line, t.column + max(1, len(t.value))),
                             e.message, note=e.note)]
  except (RecursionError, MemoryError):
    return None, [Diagnostic("R703", "error", A.Span(path, 1, 1, 1, 1), "the file nests too deeply to parse")]
  if (deep := _tree_too_deep(tree, path)) is not None: return None, [deep]
  builder = _Builder(path, source)
  try:
    rf = builder.transform(tree)
  except VisitError as e:
    if isinstance(e.orig_exc, _LiteralError):
      return None, [Diagnostic(e.orig_exc.code, "error", e.orig_exc.span, e.orig_exc.message)]
    raise e.orig_exc from None
  return rf, builder.diags


_STATEMENT_WORDS = ("import", "from", "def", "class", "del", "global", "nonlocal", "return", "yield", "raise", "try",
                    "while", "with", "assert", "pass", "exec")
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|'(?:[^'\\\n]|\\.)*'|\"(?:[^\"\\\n]|\\.)*\"|#.*")
_ASSIGN = re.compile(r"(?<![=<>!:])=(?![=>])")


def _statement_in_line(line: str) -> tuple[int, str] | None:
  """(column, what) of a statement keyword or a plain `=` in a line, skipping strings and comments."""
  masked = list(line)
  for m in _WORD.finditer(line):
    t = m.group()
    if t[0] in "'\"#":
      masked[m.start():m.end()] = " " * (m.end() - m.start())
    elif t in _STATEMENT_WORDS: return m.start() + 1, t
  # a keyword argument `f(a=1)` is fine: only an `=` outside brackets is an assignment
  text, depth = "".join(masked), 0
  for i, ch in enumerate(text):
    if ch in "([{": depth += 1
    elif ch in ")]}": depth = max(0, depth - 1)
    elif ch == "=" and depth == 0 and _ASSIGN.match(text, i) and (i == 0 or text[i - 1] not in "=<>!:"): return i + 1, "="
  return None


def _syntax_diagnostic(e: UnexpectedInput, source: str, path: str) -> Diagnostic:
  lines = source.split("\n")
  line, col = getattr(e, "line", 1) or 1, getattr(e, "column", 1) or 1
  if isinstance(e, UnexpectedToken) and e.token.type == "$END": line = len(lines)
  if 1 <= line <= len(lines) and (found := _statement_in_line(lines[line - 1])) is not None:
    c, what = found
    span = A.Span(path, line, c, line, c + len(what))
    if what == "=": return Diagnostic("R405", "error", span, "assignment is a statement; statements are not allowed in rules")
    return Diagnostic("R405", "error", span, f"'{what}' starts a statement; statements and imports are not allowed in rules")
  if isinstance(e, UnexpectedCharacters):
    ch = source[e.pos_in_stream] if e.pos_in_stream < len(source) else "?"
    span = A.Span(path, line, col, line, col + 1)
    if ch == ";": return Diagnostic("R405", "error", span, "';' separates statements; statements are not allowed in rules")
    return Diagnostic("R002", "error", span, f"unexpected character {ch!r}")
  expected = getattr(e, "accepts", None) or e.expected
  if isinstance(e, UnexpectedEOF):
    span = A.Span(path, line, col, line, col)
    return Diagnostic("R001", "error", span, f"unexpected end of file; expected {_describe(expected)}")
  assert isinstance(e, UnexpectedToken)
  tok = e.token
  if tok.type == "$END":
    span = A.Span(path, len(lines), len(lines[-1]) + 1, len(lines), len(lines[-1]) + 1)
    return Diagnostic("R001", "error", span, f"unexpected end of file; expected {_describe(expected)}")
  if tok.type == "_NL":
    span = A.Span(path, tok.line, tok.column, tok.line, tok.column + 1)
    return Diagnostic("R001", "error", span, f"unexpected end of line; expected {_describe(expected)}")
  end_col = tok.end_column if tok.end_line == tok.line and tok.end_column else col + 1
  span = A.Span(path, tok.line, tok.column, tok.line, end_col)
  return Diagnostic("R001", "error", span, f"unexpected {tok.value!r}; expected {_describe(expected)}")


def _lit(tok: Token, path: str = "?"):
  """The value of a literal token, validated as Python would (R004) and bounded in size (R704)."""
  if tok.type == "CONSTKW": return {"None": None, "True": True, "False": False}[tok.value]
  span = A.Span(path, tok.line, tok.column, tok.end_line or tok.line, tok.end_column or tok.column + len(tok.value))
  what = "number" if tok.type == "NUMBER" else "string"
  limit = MAX_NUMBER_CHARS if tok.type == "NUMBER" else MAX_STRING_CHARS
  if len(tok.value) > limit:
    raise _LiteralError("R704", span, f"{what} literal of {len(tok.value)} characters; the limit is {limit}")
  try:
    with warnings.catch_warnings():
      warnings.simplefilter("error")          # an invalid escape such as "\d" is an error, not a warning
      value = pyast.literal_eval(tok.value)
  except (SyntaxError, ValueError, SyntaxWarning, DeprecationWarning, MemoryError, OverflowError) as e:
    msg = getattr(e, "msg", None) or str(e) or type(e).__name__
    raise _LiteralError("R004", span, f"invalid {what} literal: {_printable(msg)}") from None
  if tok.type == "NUMBER" and not isinstance(value, (int, float)) or tok.type == "STRING" and not isinstance(value, str):
    raise _LiteralError("R004", span, f"invalid {what} literal")
  return value


def _printable(text: str) -> str:
  return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


@v_args(meta=True)
class _Builder(Transformer):
  def __init__(self, path: str, source: str):
    super().__init__()
    self.path, self.lines = path, [ln.rstrip("\r") for ln in source.split("\n")]  # lines as the lexer counts them
    self.source = source
    self.diags: list[Diagnostic] = []
    self.base = os.path.basename(path)

  def sp(self, m) -> A.Span: return A.Span(self.path, m.line, m.column, m.end_line, m.end_column)
  def tsp(self, t: Token) -> A.Span: return A.Span(self.path, t.line, t.column, t.end_line, t.end_column)

  # *** structure ***
  def start(self, m, ch):
    return A.RuleFile(self.path, self.source, tuple(c for c in ch if isinstance(c, A.UseLine)),
                      tuple(c for c in ch if isinstance(c, A.RuleSet)))
  def use_line(self, m, ch):
    dotted, names = ch[0], tuple(ch[1:])
    return A.UseLine(self.sp(m), dotted[0], dotted[1], names)
  def dotted(self, m, ch): return (".".join(t.value for t in ch), self.sp(m))
  def name_ref(self, m, ch): return (ch[0].value, self.tsp(ch[0]))
  def includes(self, m, ch): return ("includes", tuple(ch))
  def extends(self, m, ch): return ("extends", ch[0])

  def gradients(self, m, ch):
    rs = self.ruleset(m, [ch[0]] + list(ch[2:]))
    grad = (ch[1].value, self.tsp(ch[1]))
    return attrs.evolve(rs, grad=grad, rules=tuple(attrs.evolve(r, grad=grad[0]) for r in rs.rules))

  def ruleset(self, m, ch):
    name = ch[0].value
    includes, extends, rules = (), None, []
    for c in ch[1:]:
      if isinstance(c, tuple) and c and c[0] == "includes": includes = c[1]
      elif isinstance(c, tuple) and c and c[0] == "extends": extends = c[1]
      elif isinstance(c, A.Example):
        if rules: rules[-1] = attrs.evolve(rules[-1], examples=rules[-1].examples + (c,))
        else: self.diags.append(Diagnostic("R001", "error", A.Span(self.path, c.span.line, c.span.col, c.span.line,
                                                                   c.span.col + len("example")),
                                           "an example must follow the rule it shows"))
      elif c is not None: rules.append(c)
    rules = tuple(attrs.evolve(r, ruleset=name) for r in rules)
    return A.RuleSet(self.tsp(ch[0]), name, includes, rules, extends=extends)

  def rule_name(self, m, ch): return ("rule_name", ch[0].value, self.tsp(ch[0]))
  def guard(self, m, ch): return ("guard", ch[0])
  def rule(self, m, ch):
    name, named, guard = None, False, None
    if isinstance(ch[0], tuple) and ch[0][0] == "rule_name":
      name, named = ch[0][1], True
      ch = ch[1:]
    pattern, rest = ch[0], ch[1:]
    if rest and isinstance(rest[0], tuple) and rest[0][0] == "guard": guard, rest = rest[0][1], rest[1:]
    span = self.sp(m)
    if name is None: name = f"{self.base}:{span.line}"
    return A.Rule(span, name, named, pattern, guard, rest[0], "", self.lines[span.line - 1].strip())

  def example(self, m, ch):
    tok, given, expected = ch
    span = A.Span(self.path, tok.line, tok.column, expected.span.end_line, expected.span.end_col)
    unchanged = isinstance(expected, A.PName) and expected.name == "unchanged" and expected.dtypes is None
    return A.Example(span, given, None if unchanged else expected, expected.span)

  # *** patterns ***
  def p_binop(self, m, ch):
    left, op, right = ch
    opname = _PATTERN_OPS.get(op.value, op.value)
    return A.PNode(self.sp(m), ((opname, self.tsp(op)),), (left, right))
  def p_neg(self, m, ch):
    x = ch[1]
    if isinstance(x, A.PConst) and x.name is None and isinstance(x.value, (int, float)) and not isinstance(x.value, bool):
      return attrs.evolve(x, value=-x.value, span=self.sp(m))
    return A.PNode(self.sp(m), (("NEG", self.tsp(ch[0])),), (x,))
  def p_bind(self, m, ch):
    tok, prim = ch
    if isinstance(prim, A.PName):
      self.diags.append(Diagnostic("R203", "error", self.tsp(tok), f"'{tok.value}' binds a bare name; write the pattern after ':'"))
      return prim
    if prim.name is not None:
      self.diags.append(Diagnostic("R203", "error", self.tsp(tok),
                                   f"'{tok.value}' is a second name for the pattern already named '{prim.name}'"))
      return prim
    return attrs.evolve(prim, name=tok.value, name_span=self.tsp(tok))
  def p_name(self, m, ch):
    return A.PName(self.tsp(ch[0]), ch[0].value, ch[1][1] if len(ch) > 1 and ch[1] is not None else None)
  def p_literal(self, m, ch):
    return A.PConst(self.sp(m), ch[0], ch[1][1] if len(ch) > 1 and ch[1] is not None else None)
  def lit(self, m, ch): return _lit(ch[0], self.path)
  def neg_lit(self, m, ch): return -_lit(ch[1], self.path)
  def tuple_lit(self, m, ch): return tuple(ch)
  def arg_c(self, m, ch): return ("arg", ch[0])
  def dtype_c(self, m, ch): return ("dtypes", tuple(ch))
  def op_head(self, m, ch): return ("ops", tuple((t.value, self.tsp(t)) for t in ch if t.type == "OPNAME"))
  def tail_any(self, m, ch): return ("tail", "any", self.tsp(ch[0]))
  def tail_bind(self, m, ch): return ("tail", ch[1].value, self.tsp(ch[1]))
  def p_each(self, m, ch): return ("each", ch[0])
  def p_srcs(self, m, ch):
    pats = tuple(c for c in ch if not (isinstance(c, tuple) and c[0] == "tail"))
    tail = next((c for c in ch if isinstance(c, tuple) and c[0] == "tail"), None)
    return ("srcs", pats, tail)
  def p_args(self, m, ch): return ch[0] if ch and ch[0] is not None else ("srcs", (), None)
  def p_node(self, m, ch):
    kw: dict = {"ops": ch[0][1]}
    for c in ch[1:]:
      if c is None: continue
      if c[0] == "srcs":
        kw["srcs"] = c[1]
        if c[2] is not None: kw["tail"], kw["tail_span"] = c[2][1], c[2][2]
      elif c[0] == "each": kw["srcs"], kw["each"] = (), c[1]
      elif c[0] == "arg": kw["has_arg"], kw["arg"] = True, c[1]
      elif c[0] == "dtypes": kw["dtypes"] = c[1]
    return A.PNode(self.sp(m), **kw)

  # *** expressions ***
  def e_name(self, m, ch): return A.EName(self.tsp(ch[0]), ch[0].value)
  def e_num(self, m, ch): return A.EConst(self.tsp(ch[0]), _lit(ch[0], self.path))
  def e_str(self, m, ch):
    value = "".join(_lit(t, self.path) for t in ch)
    if len(value) > MAX_STRING_CHARS:
      raise _LiteralError("R704", self.sp(m), f"string of {len(value)} characters; the limit is {MAX_STRING_CHARS}")
    return A.EConst(self.sp(m), value)
  def e_kw(self, m, ch): return A.EConst(self.tsp(ch[0]), _lit(ch[0], self.path))
  def e_tuple(self, m, ch): return A.ESeq(self.sp(m), "tuple", tuple(c for c in ch if c is not None))
  def e_list(self, m, ch): return A.ESeq(self.sp(m), "list", tuple(c for c in ch if c is not None))
  def e_set(self, m, ch): return A.ESeq(self.sp(m), "set", tuple(ch))
  def e_dict(self, m, ch): return A.EDict(self.sp(m), tuple(k for k, _ in ch), tuple(v for _, v in ch))
  def kv(self, m, ch): return (ch[0], ch[1])
  def e_lambda(self, m, ch): return A.ELambda(self.sp(m))
  def e_walrus(self, m, ch): return A.EWalrus(self.sp(m))
  def e_cond(self, m, ch): return A.ECond(self.sp(m), ch[1], ch[0], ch[2])
  def e_or(self, m, ch): return A.EBool(self.sp(m), "or", tuple(ch))
  def e_and(self, m, ch): return A.EBool(self.sp(m), "and", tuple(ch))
  def e_notop(self, m, ch): return A.EUnary(self.sp(m), "not", ch[0])
  def e_unary(self, m, ch): return A.EUnary(self.sp(m), ch[0].value, ch[1])
  def e_power(self, m, ch): return A.EBin(self.sp(m), "**", ch[0], ch[2])

  def _chain(self, m, ch):
    out = ch[0]
    for i in range(1, len(ch), 2):
      right = ch[i + 1]
      out = A.EBin(A.Span(self.path, out.span.line, out.span.col, right.span.end_line, right.span.end_col),
                   ch[i].value, out, right)
    return out
  e_bor = e_bxor = e_band = e_shift = e_sum = e_term = _chain

  def comp_op(self, m, ch): return ch[0].value
  def op_in(self, m, ch): return "in"
  def op_notin(self, m, ch): return "not in"
  def op_is(self, m, ch): return "is"
  def op_isnot(self, m, ch): return "is not"
  def e_cmp(self, m, ch): return A.ECompare(self.sp(m), ch[0], tuple(ch[1::2]), tuple(ch[2::2]))

  def attr_name(self, m, ch): return ch[0]
  def e_attr(self, m, ch): return A.EAttr(self.sp(m), ch[0], ch[1].value, self.tsp(ch[1]))
  def e_args(self, m, ch): return tuple(ch)
  def e_call(self, m, ch): return A.ECall(self.sp(m), ch[0], ch[1] if len(ch) > 1 and ch[1] is not None else ())
  def e_call_gen(self, m, ch):
    gen = A.EComp(A.Span(self.path, ch[1].span.line, ch[1].span.col, m.end_line, m.end_column), "gen", ch[1], ch[2])
    return A.ECall(self.sp(m), ch[0], (gen,))
  def kwarg(self, m, ch): return A.EKeyword(self.sp(m), ch[0].value, ch[1])
  def starred(self, m, ch): return A.EStarred(self.sp(m), ch[1])
  def dstarred(self, m, ch): return A.EStarred(self.sp(m), ch[1], double=True)
  def e_sub(self, m, ch): return A.ESub(self.sp(m), ch[0], ch[1])
  def subscript(self, m, ch):
    return ch[0] if len(ch) == 1 else A.ESeq(self.sp(m), "tuple", tuple(ch))
  def e_slice(self, m, ch):
    ch = list(ch) + [None] * (3 - len(ch))
    return A.ESlice(self.sp(m), ch[0], ch[1], ch[2])

  def targets(self, m, ch): return tuple((t.value, self.tsp(t)) for t in ch)
  def comp_for(self, m, ch): return A.CompFor(self.sp(m), ch[0], ch[1], ())
  def comp_if(self, m, ch): return ("if", ch[0])
  def comprehension(self, m, ch):
    gens: list[A.CompFor] = []
    for c in ch:
      if isinstance(c, A.CompFor): gens.append(c)
      else: gens[-1] = attrs.evolve(gens[-1], ifs=gens[-1].ifs + (c[1],))
    return tuple(gens)
  def e_genexp(self, m, ch): return A.EComp(self.sp(m), "gen", ch[0], ch[1])
  def e_listcomp(self, m, ch): return A.EComp(self.sp(m), "list", ch[0], ch[1])
  def e_setcomp(self, m, ch): return A.EComp(self.sp(m), "set", ch[0], ch[1])
  def e_dictcomp(self, m, ch): return A.EComp(self.sp(m), "dict", ch[0], ch[1])
