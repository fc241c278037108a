"""Files rulec writes, and where it says a line is (issue 32, item 5).

Output paths: `rulec trace -o PATH`, RULEC_TRACE=1's RULEC_TRACE_OUT and `rulec fmt` write a new file in the
same directory and rename it over the path (engine/diskcache.py's write_replacing), so a symbolic link planted at
an output path is replaced by the output and the file it points to is never written; `rulec fmt` does not even
read a link (R006). Line breaks: \\r\\n, a lone \\r and \\n each end a line, in diagnostics as in editors and in
the language server's positions."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from rulec.engine.lang.loader import check_sources
from tests.helpers import subprocess_env

PROGRAM = "from rulec import Tensor\n(Tensor([1.0, 2.0, 3.0]) + 1).relu().sum().realize()\n"
VICTIM = "precious: not to be overwritten\n"


def _run(args: list[str], cwd: Path, **env) -> subprocess.CompletedProcess:
  return subprocess.run(args, cwd=cwd, env=subprocess_env(RULEC_CACHE_DIR=str(cwd / "cache"), **env), capture_output=True,
                        text=True, timeout=300)


def _trap(tmp: Path, name: str) -> tuple[Path, Path]:
  victim = tmp / "victim.txt"
  victim.write_text(VICTIM)
  link = tmp / name
  link.symlink_to(victim)
  return link, victim


def _is_page(path: Path) -> bool:
  st = os.lstat(path)
  return stat.S_ISREG(st.st_mode) and path.read_text().lstrip().lower().startswith("<!doctype html>")


def test_write_replacing_replaces_a_link_and_never_writes_its_target(tmp_path):
  from rulec.engine.diskcache import write_replacing
  link, victim = _trap(tmp_path, "out.txt")
  write_replacing(link, b"new\n")
  assert victim.read_text() == VICTIM and not link.is_symlink() and link.read_text() == "new\n"
  umask = os.umask(0)
  os.umask(umask)
  assert stat.S_IMODE(link.stat().st_mode) == 0o666 & ~umask      # as open() makes a new file
  write_replacing(link, b"kept mode\n", mode=0o640)
  assert stat.S_IMODE(link.stat().st_mode) == 0o640
  assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt", "victim.txt"]   # no temporary file left
  with pytest.raises(OSError): write_replacing(tmp_path / "no-such-dir" / "x", b"")


def test_rulec_trace_output_replaces_a_link(tmp_path):
  (tmp_path / "prog.py").write_text(PROGRAM)
  link, victim = _trap(tmp_path, "trace.html")
  proc = _run([sys.executable, "-m", "rulec.cli", "trace", "prog.py", "-o", "trace.html"], tmp_path)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert victim.read_text() == VICTIM and _is_page(link)


def test_RULEC_TRACE_output_replaces_a_link(tmp_path):
  (tmp_path / "prog.py").write_text(PROGRAM)
  link, victim = _trap(tmp_path, "t.html")
  proc = _run([sys.executable, "prog.py"], tmp_path, RULEC_TRACE="1", RULEC_TRACE_OUT=str(link))
  assert proc.returncode == 0 and "rulec trace:" in proc.stderr, proc.stderr[-2000:]
  assert victim.read_text() == VICTIM and _is_page(link)


def test_the_engine_only_json_trace_replaces_a_link(tmp_path):
  from rulec.engine import trace
  link, victim = _trap(tmp_path, "t.json")
  assert trace._write_json(trace.Trace("t"), tmp_path / "t.html") == link
  assert victim.read_text() == VICTIM and not link.is_symlink() and link.read_text().startswith("{")


UNFORMATTED = "ruleset s:\n  rule a: x+0 => x\n"
FORMATTED = "ruleset s:\n  rule a: x + 0 => x\n"


def test_rulec_fmt_never_writes_through_a_link(tmp_path):
  d = tmp_path / "rules"
  d.mkdir()
  outside = tmp_path / "outside.rules"
  outside.write_text(UNFORMATTED)
  (d / "link.rules").symlink_to(outside)
  (d / "own.rules").write_text(UNFORMATTED)
  (d / "own.rules").chmod(0o640)
  proc = _run([sys.executable, "-m", "rulec.cli", "fmt", str(d)], tmp_path)
  assert proc.returncode == 1 and "Traceback" not in proc.stderr
  assert f"{d / 'link.rules'}:1:1: error R006: not a regular file (a symbolic link)" in proc.stderr, proc.stderr
  assert outside.read_text() == UNFORMATTED and (d / "link.rules").is_symlink()
  assert (d / "own.rules").read_text() == FORMATTED and stat.S_IMODE((d / "own.rules").stat().st_mode) == 0o640
  proc = _run([sys.executable, "-m", "rulec.cli", "fmt", str(d / "link.rules")], tmp_path)
  assert proc.returncode == 1 and "R006" in proc.stderr and outside.read_text() == UNFORMATTED


def test_rulec_fmt_rewrites_lone_cr_line_breaks(tmp_path):
  f = tmp_path / "cr.rules"
  f.write_bytes(FORMATTED.replace("\n", "\r").encode())
  assert _run([sys.executable, "-m", "rulec.cli", "fmt", "--check", str(f)], tmp_path).returncode == 1
  assert _run([sys.executable, "-m", "rulec.cli", "fmt", str(f)], tmp_path).returncode == 0
  assert f.read_bytes() == FORMATTED.encode()


# *** a lone CR ends a line, as in editors ***

CR_RULES = "ruleset s:\r  rule a: x + 0 => x\r  rule b: x * => x\r"   # the error is on line 3, at `=>`


@pytest.mark.parametrize("newline", ["\r", "\r\n", "\n", "mixed"])
def test_a_lone_cr_is_a_line_break_in_diagnostics(newline):
  text = CR_RULES.replace("\r", newline) if newline != "mixed" else "ruleset s:\r\n  rule a: x + 0 => x\r  rule b: x * => x\n"
  for src in (text, text.encode()):
    [d] = check_sources({"cr.rules": src}).errors
    assert (d.code, d.span.line, d.span.col) == ("R001", 3, 15)
    rendered = d.render(text).splitlines()
    assert rendered[0].startswith("cr.rules:3:15: error R001") and rendered[1] == "     3 |   rule b: x * => x"
  [bad] = check_sources({"b.rules": b"ruleset s:\r  rule a: x + 0 => x\r  rule b: x => '\xff'\r"}).errors
  assert (bad.code, bad.span.line, bad.span.col) == ("R003", 3, 17)


def test_a_lone_cr_is_a_line_break_for_rulec_check(tmp_path):
  (tmp_path / "cr.rules").write_bytes(CR_RULES.encode())
  proc = _run([sys.executable, "-m", "rulec.cli", "check", "--no-examples", "cr.rules"], tmp_path)
  assert proc.returncode == 1 and proc.stdout.startswith("cr.rules:3:15: error R001"), proc.stdout


def test_a_lone_cr_is_a_line_break_for_the_language_server():
  pytest.importorskip("pygls")
  from rulec import lsp
  a = lsp.analyse("file:///cr.rules", "cr.rules", None, CR_RULES, 1, {})
  [d] = a.lib.errors
  rng = lsp.to_range(lsp._lines(CR_RULES), d.span, "utf-16")
  assert (rng.start.line, rng.start.character, rng.end.line, rng.end.character) == (2, 14, 2, 16)
