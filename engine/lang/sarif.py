"""SARIF 2.1.0 logs of rulec's findings: `rulec check --format sarif` and `rulec verify --format sarif`.

One run per log; its tool driver lists a rule for every diagnostic code (CODES, and the codes of `rulec
verify`), so a result's ruleId always resolves. Locations are 1-based lines and columns counted in code
points, end column exclusive, as in rulec.engine.lang.ast.Span; file URIs are relative to the directory the
command ran in (uriBaseId %SRCROOT%, GitHub code scanning's checkout root) when the file lies under it.
docs/editors.md has the CI recipe.
"""
from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import quote

from rulec.engine.lang.diagnostics import CODES, Diagnostic

SCHEMA_URI = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
SRCROOT = "%SRCROOT%"
WARNING_CODES = frozenset({"R202", "R505"})

# The findings of `rulec verify` (docs/verify.md), which has no diagnostic codes of its own.
VERIFY_CODES: dict[str, str] = {"V001": "rule refuted: the rewrite changes the value of a graph it matches"}

# What each code means, longer than CODES' one line: SARIF viewers show it beside a result.
FULL: dict[str, str] = {
  "R001": "The file does not follow the grammar of the rule language; the message names what the parser expected "
          "at that point.",
  "R002": "A character that starts no token of the rule language, such as '$', '?' or a backtick.",
  "R003": "The file could not be read (a directory named *.rules, no permission) or is not UTF-8 text; located at "
          "the first byte that does not decode.",
  "R004": "A number or string literal that Python itself rejects: leading zeros, misplaced underscores, bad escapes, "
          "a NUL character.",
  "R005": "A Python keyword written where a name must stand, as an attribute (x.class) or a keyword argument.",
  "R006": "A *.rules path that is a symbolic link, a FIFO, a device or a socket: rules files are read only from "
          "regular files, so nothing of it is read or shown.",
  "R101": "An upper-case name in a pattern or an expression that is neither an op nor an op group.",
  "R102": "A name in a dtype constraint {...} that is neither a dtype nor a dtype class.",
  "R103": "A pattern gives an op more or fewer sources than that op always has.",
  "R104": "An operator that stands for no ALU op in patterns ('>', '>=', '<=', '@'); swap the operands instead.",
  "R105": "The replacement of a gradient rule must be a tuple with one gradient (or None) per source of the node.",
  "R106": "Gradient rules have no example lines; rulec verify checks them against finite differences instead.",
  "R201": "A guard or replacement uses a name that the pattern does not bind, no use line declares, and no builtin has.",
  "R202": "A pattern binds a name that the guard and the replacement never use; write _ for a node the rule does not need.",
  "R203": "One name stands for two different sub-patterns, a name is bound inside `each`, or a pattern gets a second name.",
  "R204": "A binding, helper or comprehension variable takes a reserved name: ctx, a helper, a builtin, or a pattern binding.",
  "R301": "A use line names a module outside the allowed packages (engine, codegen, runtime, rulec, RULEC_HELPER_PACKAGES), "
          "a private module, or one that does not import.",
  "R302": "A use line names something that is not a function its module defines and marks with @rule_helper.",
  "R303": "A helper is called with arguments that its Python signature does not accept.",
  "R304": "A file declares the same helper in more than one use line.",
  "R401": "Rules may not read dunder attributes or the format machinery of strings.",
  "R402": "Rules may not define functions with lambda.",
  "R403": "A builtin that rules may not call or name (eval, open, getattr, ...).",
  "R404": "Assignment expressions (:=) are not part of the rule language.",
  "R405": "Statements, imports and ';' are not part of the rule language: guards and replacements are expressions.",
  "R406": "The attribute is not one that rules may read on the value's type (see 'What rules can reach' in docs/rules.md).",
  "R501": "Two rules of one layer of the library have the same name; rule names are unique across its files.",
  "R502": "Two rule sets of one layer of the library have the same name.",
  "R503": "An includes list names a rule set that no file of the library defines.",
  "R504": "Rule sets include each other in a cycle.",
  "R505": "An earlier rule always matches first (no guard, always rewrites, matches everything this one does), so this "
          "rule can never fire.",
  "R506": "A gradients set and a rule set include one another; each kind may only include its own kind.",
  "R507": "`extends` names a rule set that no layer beneath the file defines (a file checked on its own has none).",
  "R601": "Rewriting the example's input with its rule set gives another graph than the example expects.",
  "R602": "The rule does not fire on its own example (also when other rules of the set produce the right result).",
  "R603": "The rule fires on an example that says its input stays unchanged.",
  "R604": "The example's input or expected graph cannot be built (an unbound name, a wrong arity, a bad argument).",
  "R605": "Rewriting the example's input raised an error (a helper failed, or the rewrite loops).",
  "R701": "Commutative ops in the pattern expand to more than 256 source orders.",
  "R702": "Rule sets include rule sets more than 32 levels deep.",
  "R703": "Brackets, operators or patterns nest deeper than the rule language's limits.",
  "R704": "A number literal longer than 100 characters or a string longer than 10,000.",
  "R705": "A file of more than 1 MiB or more than 50,000 tokens.",
  "R706": "An example ran past its time limit (5 s, RULEC_EXAMPLE_TIMEOUT).",
  "R707": "An example ran past its memory limit (1 GiB over the checker's own).",
  "R708": "The examples of one file ran past their total time limit (60 s, RULEC_EXAMPLE_FILE_TIMEOUT).",
  "V001": "rulec verify found a graph that matches the rule on which the rewrite changes the value: the rule is "
          "unsound. The message gives the shrunk counterexample.",
}


def _descriptor(code: str, short: str) -> dict:
  full = FULL[code]
  where = "docs/verify.md" if code.startswith("V") else f"docs/rules.md, section '{code}' under 'Diagnostics'"
  return {"id": code, "name": "".join(w.capitalize() for w in code_words(short)),
          "shortDescription": {"text": short}, "fullDescription": {"text": full},
          "help": {"text": f"{full} See {where}.", "markdown": f"**{code}**: {full}\n\nSee {where}."},
          "defaultConfiguration": {"level": "warning" if code in WARNING_CODES else "error"},
          "properties": {"tags": ["rulec", "verify" if code.startswith("V") else "check"]}}


def code_words(text: str) -> list[str]:
  return [w for w in "".join(c if c.isalnum() else " " for c in text).split() if w]


def artifact_uri(file: str, root: str | None = None) -> tuple[str, str | None]:
  """(uri, uriBaseId): relative to `root` (default: the current directory) when the file lies below it, else absolute."""
  root_path = Path(root or os.getcwd()).resolve()
  try: path = Path(file).resolve()
  except (OSError, ValueError): return quote(file), None
  try: return quote(path.relative_to(root_path).as_posix()), SRCROOT
  except ValueError: return path.as_uri() if path.is_absolute() else quote(file), None


def _region(line: int, col: int, end_line: int, end_col: int) -> dict:
  line, col = max(1, line), max(1, col)
  end_line, end_col = max(line, end_line), max(1, end_col)
  if end_line == line and end_col < col: end_col = col
  return {"startLine": line, "startColumn": col, "endLine": end_line, "endColumn": end_col}


def _result(code: str, level: str, message: str, file: str, region: dict, index: int, root: str | None) -> dict:
  uri, base = artifact_uri(file, root)
  loc = {"uri": uri, **({"uriBaseId": base} if base else {})}
  return {"ruleId": code, "ruleIndex": index, "level": level, "message": {"text": message},
          "locations": [{"physicalLocation": {"artifactLocation": loc, "region": region}}]}


def span_result(code: str, index: int, message: str, span, level: str = "error", root: str | None = None) -> dict:
  """A SARIF result at a source span (file, line, col, end_line, end_col)."""
  return _result(code, level, message, span.file, _region(span.line, span.col, span.end_line, span.end_col), index, root)


def refutation_message(name: str, c: dict) -> str:
  """The message of a refuted rule (`rulec verify` V001, `rulec prove` P001) from its counterexample."""
  parts = [f"rule '{name}' is refuted: {c.get('why', 'the rewrite changes a value')}"]
  parts += [f"{k}: {c[k]}" for k in ("before", "after", "at", "values", "note") if c.get(k)]
  if c.get("where"): parts.append(f"where: {'; '.join(c['where'])}")
  return "\n".join(parts)


def sarif_log(diags: list[Diagnostic], verify_results: list[tuple[str, str, object]] = (), *, verify: bool = False,
              root: str | None = None, tool_version: str | None = None) -> dict:
  """A SARIF log of checker diagnostics and, from `rulec verify`, refuted rules: (code, message, span) triples."""
  codes = dict(CODES, **VERIFY_CODES) if verify else dict(CODES)
  order = list(codes)
  results = []
  for d in diags:
    s = d.span
    text = d.message + (f"\n{d.note}" if d.note else "")
    results.append(_result(d.code, "error" if d.is_error else "warning", text, s.file,
                           _region(s.line, s.col, s.end_line, s.end_col), order.index(d.code), root))
  for code, message, s in verify_results: results.append(span_result(code, order.index(code), message, s, root=root))
  root_uri = Path(root or os.getcwd()).resolve().as_uri().rstrip("/") + "/"
  driver = {"name": "rulec", "rules": [_descriptor(c, codes[c]) for c in order]}
  if tool_version: driver["version"] = driver["semanticVersion"] = tool_version
  return {"$schema": SCHEMA_URI, "version": "2.1.0",
          "runs": [{"tool": {"driver": driver}, "originalUriBaseIds": {SRCROOT: {"uri": root_uri}},
                    "columnKind": "unicodeCodePoints", "results": results,
                    "invocations": [{"executionSuccessful": True}]}]}


def verify_findings(lib, results) -> list[tuple[str, str, object]]:
  """(code, message, span) for each refuted rule of `rulec verify`'s results, located at the rule."""
  out = []
  for rs in results:
    spans = {r.name: r.span for r in lib.checked.rulesets[rs.name].rules}
    for r in rs.rules:
      if r.status != "refuted": continue
      out.append(("V001", refutation_message(r.name, r.counterexample or {}), spans[r.name]))
  return out


def tool_version() -> str | None:
  try:
    from importlib.metadata import version
    return version("rulec")
  except Exception:  # noqa: BLE001 - a checkout that is not installed has no version to tell
    return None
