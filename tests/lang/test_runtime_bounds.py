"""Work a rules file can cause is bounded at run time too (#32 item 4): guards and replacements of a RULEC_RULES
layer inside a user's program, a file's examples in total, examples of a check nobody waits for any more, and the
example process of a killed `rulec check`."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rulec.engine.lang.bounded import RuleBudgetError, rule_lshift, rule_mod, rule_mul, rule_pow, rule_range
from rulec.engine.lang.examples import ExamplesCancelled, cancel_when
from rulec.engine.lang.loader import check_sources

REPO = Path(__file__).resolve().parents[2]
SLOW = "sum(1 for i in range(10 ** 6) for j in range(10 ** 6))"   # 10^12 steps of Python: hours


def test_checked_operators():
  assert rule_pow(3, 40) == 3 ** 40 and rule_pow(2.0, 0.5) == 2.0 ** 0.5 and rule_pow(-1, 10 ** 30) == 1
  assert rule_lshift(1, 62) == 1 << 62 and rule_mul(7, 6) == 42 and rule_mul([1], 3) == [1, 1, 1]
  assert rule_mod(7, 3) == 1 and list(rule_range(2, 10, 3)) == [2, 5, 8]
  for bad in (lambda: rule_pow(9, 9 ** 9), lambda: rule_lshift(1, 10 ** 6), lambda: rule_mul(1 << 40000, 1 << 40000),
              lambda: rule_mul("ab", 10 ** 10), lambda: rule_mul(10 ** 7, [0]), lambda: rule_mod("%0999999999d", 1),
              lambda: rule_range(10 ** 12), lambda: rule_range(-10 ** 30, 10 ** 30)):
    with pytest.raises(RuleBudgetError): bad()


LAYER = f"""\
ruleset earliest extends earliest:
  rule slow: x:EXP2(a) if {SLOW} < 0 => a
  rule bigpow: x:LOG2(a) if 9 ** 9 ** 9 > 0 => a
  rule bigrep: x:SIN(a) if len(UOp.sink(*([a] * 30000000)).src) > 0 => a
  rule bigrange: x:SQRT(a) if sum(range(10 ** 12)) < 0 => a
  rule fmt: x:RECIPROCAL(a) if len("%0999999999d" % 1) > 0 => a
"""


@pytest.mark.parametrize("op,rule,line,why", [("exp2", "slow", 2, "RuleTimeout"), ("log2", "bigpow", 3, "RuleBudgetError"),
                                              ("sin", "bigrep", 4, "RuleBudgetError"), ("sqrt", "bigrange", 5, "RuleBudgetError"),
                                              ("reciprocal", "fmt", 6, "RuleBudgetError")])
def test_a_layer_cannot_hang_a_program(tmp_path, op, rule, line, why):
  d = tmp_path / "mine"; d.mkdir()
  (d / "mine.rules").write_text(LAYER)
  env = {k: v for k, v in os.environ.items() if not k.startswith("RULEC_")}
  env.update(RULEC_RULES=str(d), RULEC_RULE_TIMEOUT="1", RULEC_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(REPO))
  prog = f"from rulec import Tensor\ntry: print(Tensor([1.0, 2.0]).{op}().tolist())\nexcept Exception as e: print(type(e).__name__, e)"
  out = subprocess.run([sys.executable, "-c", prog], env=env, capture_output=True, text=True, timeout=300)  # hang guard
  assert f"RuleRuntimeError rule '{rule}' at {d / 'mine.rules'}:{line}:3 failed: {why}" in out.stdout, out.stdout + out.stderr


def _slow_file(name: str, n: int) -> str:
  body = "".join(f"    example: RANGE({k + 2}) + 0 => RANGE({k + 2})\n" for k in range(n))
  return f"ruleset {name}:\n  rule a: x + 0 => x if {SLOW} else None\n" + body


def test_a_files_examples_share_one_time_budget(monkeypatch):
  monkeypatch.setenv("RULEC_EXAMPLE_TIMEOUT", "100")
  monkeypatch.setenv("RULEC_EXAMPLE_FILE_TIMEOUT", "0.5")
  fast = "ruleset t:\n  rule b: x * 1 => x\n    example: RANGE(4) * 1 => RANGE(5)\n"
  lib = check_sources({"slow.rules": _slow_file("s", 50), "fast.rules": fast}, examples=True)
  got = sorted((d.code, d.span.file, d.span.line) for d in lib.diagnostics)
  # one R708 for the slow file (at its first example; the 49 after it are not run), and the other file still checked
  assert got == [("R601", "fast.rules", 3), ("R708", "slow.rules", 3)], got
  r708 = next(d for d in lib.diagnostics if d.code == "R708")
  assert "49 after it were not run" in r708.message


def _children(pid: int) -> list[int]:
  """The live child processes of pid, less the CPU device's LLVM build workers (runtime/llvm_build.py), which a
  process keeps for its life once a realize has started them (an earlier test in this worker may have)."""
  out = []
  for p in os.listdir("/proc"):
    if not p.isdigit(): continue
    try:
      with open(f"/proc/{p}/stat") as f: fields = f.read().rsplit(")", 1)[1].split()
      with open(f"/proc/{p}/cmdline", "rb") as f: cmd = f.read()
    except OSError: continue
    if int(fields[1]) == pid and fields[0] != "Z" and b"llvm_build.py" not in cmd: out.append(int(p))
  return out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_cancelled_examples_stop_and_leave_no_process(monkeypatch):
  monkeypatch.setenv("RULEC_EXAMPLE_TIMEOUT", "100")
  flag = threading.Event()
  threading.Timer(0.5, flag.set).start()
  with pytest.raises(ExamplesCancelled), cancel_when(flag.is_set):
    check_sources({"slow.rules": _slow_file("s", 3)}, examples=True)
  assert _children(os.getpid()) == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_killing_rulec_check_kills_its_example_process(tmp_path):
  (tmp_path / "slow.rules").write_text(_slow_file("s", 1))
  env = {k: v for k, v in os.environ.items() if not k.startswith("RULEC_")}
  env.update(RULEC_EXAMPLE_TIMEOUT="1000", RULEC_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(REPO))
  p = subprocess.Popen([sys.executable, "-m", "rulec.cli", "check", str(tmp_path / "slow.rules")], env=env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  try:
    for _ in range(600):                       # wait (up to a minute: a hang guard) for the example's process
      kids = _children(p.pid)
      if kids: break
      time.sleep(0.1)
    assert kids, "rulec check never forked its example process"
  finally:
    p.send_signal(signal.SIGKILL); p.wait()
  for _ in range(300):                         # it goes with its parent (hang guard: 30 s)
    if not any(os.path.exists(f"/proc/{k}") and _children_state(k) != "Z" for k in kids): break
    time.sleep(0.1)
  alive = [k for k in kids if os.path.exists(f"/proc/{k}") and _children_state(k) != "Z"]
  for k in alive: os.kill(k, signal.SIGKILL)
  assert not alive, "the example process outlived rulec check"


def _children_state(pid: int) -> str:
  try:
    with open(f"/proc/{pid}/stat") as f: return f.read().rsplit(")", 1)[1].split()[0]
  except OSError: return "Z"


def test_the_language_server_stops_a_stale_check(tmp_path, monkeypatch):
  pytest.importorskip("pygls")
  from rulec.lsp import analyse
  monkeypatch.setenv("RULEC_EXAMPLE_TIMEOUT", "100")
  f = tmp_path / "slow.rules"
  f.write_text(_slow_file("s", 2))
  with pytest.raises(ExamplesCancelled):
    analyse(f.as_uri(), str(f), f, f.read_text(), 1, {}, cancelled=lambda: True)
  assert _children(os.getpid()) == []
