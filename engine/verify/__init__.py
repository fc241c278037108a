"""`rulec verify`: property-based soundness of every rule (see docs/verify.md).

Needs hypothesis (`pip install hypothesis`); importing this package without it
raises ImportError.
"""
from __future__ import annotations

import attrs

from rulec.engine.lang.loader import RuleLibrary
from rulec.engine.verify.core import RuleResult, _location, verify_rule

__all__ = ["RuleResult", "RulesetResult", "verify_rule", "verify_library", "format_human", "format_json",
           "counterexample_lines"]


@attrs.define
class RulesetResult:
  name: str
  file: str
  rules: list[RuleResult]

  def count(self, status: str) -> int: return sum(r.status == status for r in self.rules)

  def summary(self) -> str:
    return (f"{self.name}: {self.count('verified')} verified, {self.count('refuted')} refuted, "
            f"{self.count('not checkable')} not checkable")


def expand_rulesets(lib: RuleLibrary, names: list[str]) -> list[str]:
  """The named rule sets and, before each, the sets it includes (each once); all of them when names is empty."""
  sets = lib.checked.rulesets
  if not names: return list(sets)
  out: list[str] = []
  def walk(n: str):
    if n in out: return
    for inc, _ in sets[n].includes: walk(inc)
    out.append(n)
  for n in names: walk(n)
  return out


def verify_library(lib: RuleLibrary, names: list[str] | None = None, examples: int = 100, progress=None) -> list[RulesetResult]:
  """Verify every rule of the named rule sets (each rule reported under the set that defines it)."""
  lib.require_clean()
  ck = lib.checked
  out = []
  for n in expand_rulesets(lib, list(names or ())):
    rs = ck.rulesets[n]
    results = []
    for rule in rs.rules:
      results.append(verify_rule(rule, ck.helpers_of, examples))
      if progress is not None: progress(results[-1])
    out.append(RulesetResult(n, _location(rs.span).rsplit(":", 2)[0], results))
  return out


def counterexample_lines(c: dict) -> list[str]:
  """The indented lines under a REFUTED rule (`rulec verify` and `rulec prove`): the graphs before and after, the
  leaves, where the values differ, the names' values (prove), the two values and a note."""
  lines = [f"      {key + ':':8} {c[key]}" for key in ("before", "after") if key in c]
  if c.get("where"): lines.append(f"      where:   {'; '.join(c['where'])}")
  if "at" in c: lines.append(f"      at:      {c['at']}")
  if c.get("names"): lines.append(f"      so:      {', '.join(f'{k} = {v}' for k, v in c['names'].items())}")
  lines += [f"      {key + ':':8} {c[key]}" for key in ("values", "note") if key in c]
  return lines


def refuted_lines(name: str, location: str, c: dict | None) -> list[str]:
  """A REFUTED rule's lines (`rulec verify` and `rulec prove`): why, then its counterexample."""
  c = c or {}
  return [f"  REFUTED        {name} ({location}): {c.get('why', '')}"] + counterexample_lines(c)


def format_rule(r: RuleResult) -> list[str]:
  if r.status == "verified": return [f"  verified       {r.name} ({r.location}): {r.examples} examples"]
  if r.status == "not checkable": return [f"  not checkable  {r.name} ({r.location}): {r.reason}"]
  return refuted_lines(r.name, r.location, r.counterexample)


def format_human(results: list[RulesetResult]) -> str:
  lines: list[str] = []
  for rs in results:
    lines.append(f"ruleset {rs.name} ({rs.file})")
    for r in rs.rules: lines += format_rule(r)
  lines.append("")
  lines += [rs.summary() for rs in results]
  tot = [r for rs in results for r in rs.rules]
  lines.append(f"total: {sum(r.status == 'verified' for r in tot)} verified, {sum(r.status == 'refuted' for r in tot)} refuted, "
               f"{sum(r.status == 'not checkable' for r in tot)} not checkable")
  return "\n".join(lines)


def format_json(results: list[RulesetResult]) -> dict:
  tot = [r for rs in results for r in rs.rules]
  return {"rulesets": [{"name": rs.name, "file": rs.file, "verified": rs.count("verified"), "refuted": rs.count("refuted"),
                        "not_checkable": rs.count("not checkable"), "rules": [r.to_json() for r in rs.rules]}
                       for rs in results],
          "verified": sum(r.status == "verified" for r in tot), "refuted": sum(r.status == "refuted" for r in tot),
          "not_checkable": sum(r.status == "not checkable" for r in tot)}
