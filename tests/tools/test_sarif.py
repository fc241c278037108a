"""SARIF 2.1.0 from `rulec check --format sarif` and `rulec verify --format sarif` (engine/lang/sarif.py), validated
against the official SARIF 2.1.0 JSON schema (tests/data/sarif-schema-2.1.0.json, OASIS errata 01), which
is what GitHub code scanning accepts."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from urllib.parse import unquote, urlparse

import jsonschema
import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path: sys.path.insert(0, str(REPO))

from rulec.engine.lang.ast import Span  # noqa: E402
from rulec.engine.lang.diagnostics import CODES, Diagnostic  # noqa: E402
from rulec.engine.lang.sarif import FULL, VERIFY_CODES, sarif_log  # noqa: E402
from rulec.cli import main as rulec  # noqa: E402

SCHEMA = json.loads((REPO / "tests" / "data" / "sarif-schema-2.1.0.json").read_text())
VALIDATOR = jsonschema.Draft4Validator(SCHEMA, format_checker=jsonschema.Draft4Validator.FORMAT_CHECKER)

FINDINGS = """ruleset s:
  rule unbound: x + 0 => x + y
  rule unused: x * 1 => UOp.const(dtypes.index, 1)
"""
EXAMPLE = """ruleset t:
  rule add_zero: x + 0 => x
    example: RANGE(3) + 0 => RANGE(4)
"""


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
  monkeypatch.setenv("RULEC_CACHE_DIR", str(tmp_path / "cache"))
  for k in ("RULEC_STATS", "RULEC_HELPER_PACKAGES", "RULEC_RULES"): monkeypatch.delenv(k, raising=False)
  monkeypatch.chdir(tmp_path)


def valid(log: dict) -> dict:
  errors = sorted(VALIDATOR.iter_errors(log), key=lambda e: list(e.path))
  assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors[:5])
  return log


def run(capsys, *argv) -> tuple[int, dict]:
  code = rulec(list(argv))
  return code, valid(json.loads(capsys.readouterr().out))


def test_the_schema_rejects_what_code_scanning_would():
  log = sarif_log([Diagnostic("R201", "error", Span("x.rules", 2, 3, 2, 4), "unbound")])
  bad = json.loads(json.dumps(log))
  bad["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["region"]["startLine"] = 0
  assert list(VALIDATOR.iter_errors(bad))
  del bad["runs"][0]["tool"]["driver"]
  assert list(VALIDATOR.iter_errors(bad))
  valid(log)


def test_every_code_has_a_rule_entry():
  assert set(FULL) == set(CODES) | set(VERIFY_CODES)
  log = valid(sarif_log([], verify=True))
  rules = log["runs"][0]["tool"]["driver"]["rules"]
  assert [r["id"] for r in rules] == list(CODES) + list(VERIFY_CODES)
  for r in rules:
    assert r["shortDescription"]["text"] == {**CODES, **VERIFY_CODES}[r["id"]]
    assert r["fullDescription"]["text"] == FULL[r["id"]] and r["id"] in r["help"]["markdown"] and r["help"]["text"]
  levels = {r["id"]: r["defaultConfiguration"]["level"] for r in rules}
  assert levels["R202"] == levels["R505"] == "warning" and levels["R201"] == levels["V001"] == "error"


def test_check_reports_errors_warnings_and_examples(tmp_path, capsys):
  d = tmp_path / "mine"
  d.mkdir()
  (d / "findings.rules").write_text(FINDINGS)
  code, log = run(capsys, "check", "--format", "sarif", "mine/findings.rules")
  assert code == 1 and log["version"] == "2.1.0"
  (run_,) = log["runs"]
  assert run_["tool"]["driver"]["name"] == "rulec" and run_["columnKind"] == "unicodeCodePoints"
  rules = [r["id"] for r in run_["tool"]["driver"]["rules"]]
  got = {r["ruleId"]: r for r in run_["results"]}
  assert set(got) == {"R201", "R202"}
  for r in run_["results"]: assert rules[r["ruleIndex"]] == r["ruleId"]
  unbound = got["R201"]
  assert unbound["level"] == "error" and "'y'" in unbound["message"]["text"]
  (loc,) = unbound["locations"]
  art = loc["physicalLocation"]["artifactLocation"]
  assert (art["uri"], art["uriBaseId"]) == ("mine/findings.rules", "%SRCROOT%")
  col = FINDINGS.split("\n")[1].index("+ y") + 3
  assert loc["physicalLocation"]["region"] == {"startLine": 2, "startColumn": col, "endLine": 2, "endColumn": col + 1}
  assert got["R202"]["level"] == "warning"
  root = urlparse(run_["originalUriBaseIds"]["%SRCROOT%"]["uri"])
  assert root.scheme == "file" and Path(unquote(root.path)) == tmp_path.resolve()

  # a failing example is a result too, and a clean file gives none (exit 0)
  (d / "findings.rules").write_text(EXAMPLE)
  code, log = run(capsys, "check", "--format", "sarif", str(d))
  (res,) = log["runs"][0]["results"]
  assert code == 1 and res["ruleId"] == "R601" and "expected RANGE(4)" in res["message"]["text"]
  region = res["locations"][0]["physicalLocation"]["region"]
  assert (region["startLine"], region["startColumn"]) == (3, EXAMPLE.split("\n")[2].index("RANGE(4)") + 1)
  (d / "findings.rules").write_text(EXAMPLE.replace("RANGE(4)", "RANGE(3)"))
  code, log = run(capsys, "check", "--format", "sarif", str(d))
  assert code == 0 and log["runs"][0]["results"] == []


def test_uris_outside_the_directory_and_odd_names(tmp_path, capsys, monkeypatch):
  odd = tmp_path / "a dir" / "ümlaut #1.rules"
  odd.parent.mkdir()
  odd.write_text(FINDINGS)
  work = tmp_path / "elsewhere"
  work.mkdir()
  monkeypatch.chdir(work)
  code, log = run(capsys, "check", "--format", "sarif", "--no-examples", str(odd))
  assert code == 1
  art = log["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"]
  assert "uriBaseId" not in art and art["uri"].startswith("file:///") and " " not in art["uri"] and "#" not in art["uri"]
  assert Path(unquote(urlparse(art["uri"]).path)) == odd.resolve()
  # a zero-width span (the end of the file) and a span with no source still make valid regions
  empty = Diagnostic("R001", "error", Span("x.rules", 3, 5, 3, 5), "unexpected end of file", note="a note")
  valid(sarif_log([empty, Diagnostic("R003", "error", Span("gone.rules", 0, 0, 0, 0), "cannot read")]))


BAD_RULE = """ruleset wrong:
  rule double_it: x + 0 => x * 2
"""


def test_verify_reports_a_refuted_rule_at_the_rule(tmp_path, capsys):
  d = tmp_path / "mine"
  d.mkdir()
  (d / "wrong.rules").write_text(BAD_RULE)
  code, log = run(capsys, "verify", "--format", "sarif", "--examples", "10", "--rules", "mine")
  assert code == 1
  (res,) = log["runs"][0]["results"]
  assert res["ruleId"] == "V001" and res["level"] == "error" and "double_it" in res["message"]["text"]
  loc = res["locations"][0]["physicalLocation"]
  assert loc["artifactLocation"]["uri"] == "mine/wrong.rules"
  assert (loc["region"]["startLine"], loc["region"]["startColumn"]) == (2, 3)
  assert "V001" in [r["id"] for r in log["runs"][0]["tool"]["driver"]["rules"]]
  # a library that does not load: its diagnostics, in the same form
  (d / "wrong.rules").write_text(FINDINGS)
  code, log = run(capsys, "verify", "--format", "sarif", "--rules", "mine")
  assert code == 1 and {r["ruleId"] for r in log["runs"][0]["results"]} == {"R201"}
