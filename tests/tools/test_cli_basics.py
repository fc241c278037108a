"""What a newcomer meets first (issue 32, items 10 and 13), each through a real subprocess:

* `rulec --version`;
* `rulec check` and `rulec verify` with no path work on rules/ of the current directory when it has one (else the
  installed rules) and say which directory on stderr; JSON stays valid;
* a bad RULEC_DEVICE and a missing pyopencl are one line on stderr and exit status 2 from the CLI, and an exception
  with a one-line message (no chained traceback) from the library; `import rulec` itself never fails on them;
* the progress line (runtime/progress.py) on a terminal, for a realize, `rulec verify` and `rulec trace`; nothing
  when stderr is not a terminal or RULEC_PROGRESS=0.

Subprocess timeouts are hang guards only; nothing here measures time.
"""
from __future__ import annotations

import json
import os
import select
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path: sys.path.insert(0, str(REPO))

from tests.helpers import subprocess_env  # noqa: E402

HANG_GUARD_S = 300
BLOCK_PYOPENCL = "import sys; sys.modules['pyopencl'] = None\n"   # `import pyopencl` raises ImportError from here on


def env(tmp_path: Path, **extra: str) -> dict:
  e = subprocess_env(RULEC_CACHE_DIR=str(tmp_path / "cache"), **extra)
  for k in ("RULEC_DEVICE", "RULEC_RULES", "RULEC_PROGRESS", "RULEC_PROGRESS_AFTER", "RULEC_DEBUG"):
    if k not in extra: e.pop(k, None)
  return e


def rulec(args: list[str], tmp_path: Path, cwd: Path | None = None, **extra: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", "rulec.cli", *args], cwd=cwd or tmp_path, env=env(tmp_path, **extra),
                        capture_output=True, text=True, timeout=HANG_GUARD_S)


def python(code: str, tmp_path: Path, **extra: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env(tmp_path, **extra), capture_output=True,
                        text=True, timeout=HANG_GUARD_S)


# *** rulec --version ***

def test_version_prints_the_package_version(tmp_path):
  from importlib.metadata import PackageNotFoundError, version
  try: want = version("rulec")
  except PackageNotFoundError: want = None
  proc = rulec(["--version"], tmp_path)
  assert proc.returncode == 0 and proc.stderr == ""
  line = proc.stdout.strip()
  assert line.startswith("rulec ") and len(proc.stdout.splitlines()) == 1
  if want is not None: assert line == f"rulec {want}"


# *** which rules `check` and `verify` work on ***

@pytest.fixture
def broken_checkout(tmp_path):
  """A directory with rules/symbolic.rules: the shipped file with a syntax error put into its first rule."""
  work = tmp_path / "work"
  (work / "rules").mkdir(parents=True)
  text = (REPO / "rules" / "symbolic.rules").read_text()
  lines = text.splitlines(keepends=True)
  at = next(i for i, line in enumerate(lines) if "=>" in line and not line.lstrip().startswith("#"))
  lines[at] = lines[at].replace("=>", "=> =>", 1)
  (work / "rules" / "symbolic.rules").write_text("".join(lines))
  return work, at + 1


def test_check_with_no_path_checks_rules_of_the_current_directory(broken_checkout, tmp_path):
  work, line = broken_checkout
  proc = rulec(["check", "--no-examples"], tmp_path, cwd=work)
  assert proc.returncode == 1, proc.stdout + proc.stderr
  assert f"rules/symbolic.rules:{line}:" in proc.stdout and "error R001" in proc.stdout
  # the summary line names the directory checked
  summary = proc.stderr.strip().splitlines()[-1]
  assert summary.startswith(f"rules/ of the current directory ({(work / 'rules').resolve()}): 1 files, ")
  assert summary.endswith("1 errors, 0 warnings") and "Traceback" not in proc.stderr


def test_check_json_with_no_path_stays_json_and_names_the_directory_on_stderr(broken_checkout, tmp_path):
  work, _ = broken_checkout
  proc = rulec(["check", "--no-examples", "--format", "json"], tmp_path, cwd=work)
  assert proc.returncode == 1
  data = json.loads(proc.stdout)
  assert data["files"] == 1 and data["errors"] == 1 and data["diagnostics"][0]["file"] == "rules/symbolic.rules"
  assert proc.stderr.strip() == f"rulec check: rules/ of the current directory ({(work / 'rules').resolve()})"


def test_check_without_a_rules_directory_checks_the_installed_rules(tmp_path):
  from rulec.engine.lang.loader import default_rules_dir
  empty = tmp_path / "empty"
  (empty / "rules").mkdir(parents=True)   # a rules/ with no .rules file in it is not a library
  proc = rulec(["check", "--no-examples"], tmp_path, cwd=empty)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  n = len(list(default_rules_dir().rglob("*.rules")))
  assert proc.stderr.strip().startswith(f"the installed rules ({default_rules_dir()}; the current directory has no rules/): "
                                        f"{n} files, ")


def test_verify_with_no_path_verifies_rules_of_the_current_directory(tmp_path):
  work = tmp_path / "work"
  (work / "rules").mkdir(parents=True)
  (work / "rules" / "mine.rules").write_text("ruleset mine:\n  rule add_zero: x + 0 => x\n  rule wrong: x * 1 => x + 1\n")
  proc = rulec(["verify", "--examples", "5"], tmp_path, cwd=work)
  assert proc.returncode == 1, proc.stdout + proc.stderr   # `wrong` is refuted: these rules were verified
  assert "ruleset mine (rules/mine.rules)" in proc.stdout and "REFUTED        wrong (rules/mine.rules:3:3)" in proc.stdout
  assert proc.stdout.strip().splitlines()[-1] == "total: 1 verified, 1 refuted, 0 not checkable"
  assert proc.stderr.strip() == f"rulec verify: rules/ of the current directory ({(work / 'rules').resolve()})"
  # JSON output stays JSON
  proc = rulec(["verify", "--examples", "5", "--format", "json"], tmp_path, cwd=work)
  assert proc.returncode == 1 and json.loads(proc.stdout)["refuted"] == 1


def test_verify_of_a_broken_rules_directory_reports_the_error_located(broken_checkout, tmp_path):
  work, line = broken_checkout
  proc = rulec(["verify", "--examples", "2"], tmp_path, cwd=work)
  assert proc.returncode == 1
  assert f"rules/symbolic.rules:{line}:" in proc.stderr and "Traceback" not in proc.stderr


# *** devices that cannot be used ***

BAD_DEVICE_LINE = "RULEC_DEVICE='nope' is not a device; known devices: CPU, NUMPY, CL, CUDA, each also with an index (CPU:1)"


@pytest.mark.parametrize("cmd", [["demo", "--count", "3"], ["trace", "prog.py"], ["explain", "add_zero", "prog.py"]])
def test_a_bad_rulec_device_is_one_line_from_the_cli(tmp_path, cmd):
  (tmp_path / "prog.py").write_text("print('ran')\n")
  proc = rulec(cmd, tmp_path, RULEC_DEVICE="nope")
  assert proc.returncode == 2
  assert proc.stderr == f"rulec {cmd[0]}: {BAD_DEVICE_LINE}\n" and "ran" not in proc.stdout
  assert not (tmp_path / "trace.html").exists()


def test_a_bad_device_argument_is_one_line_from_the_cli(tmp_path):
  proc = rulec(["demo", "--device", "XPU", "--count", "3"], tmp_path)
  assert proc.returncode == 2
  assert proc.stderr == ("rulec demo: unknown device 'XPU'; known devices: CPU, NUMPY, CL, CUDA, each also with an index "
                         "(CPU:1)\n")


def test_a_bad_rulec_device_does_not_stop_commands_that_need_no_device(tmp_path):
  proc = rulec(["check", "--no-examples"], tmp_path, RULEC_DEVICE="nope")
  assert proc.returncode == 0 and "0 errors, 0 warnings" in proc.stderr


def test_missing_pyopencl_is_one_line_from_the_cli(tmp_path):
  code = BLOCK_PYOPENCL + "from rulec.cli import main\nsys.exit(main(['demo', '--count', '3']))\n"
  proc = python(code, tmp_path, RULEC_DEVICE="CL")
  assert proc.returncode == 2
  lines = proc.stderr.splitlines()
  assert len(lines) == 1 and lines[0].startswith("rulec demo: the CL device needs pyopencl (") and "pip install" in lines[0]


def test_a_bad_rulec_device_is_a_clean_exception_from_the_library(tmp_path):
  code = ("import rulec\nfrom rulec import Tensor\nfrom rulec.runtime.devices import DeviceError\n"
          "try: Tensor([1.0, 2.0]).numpy()\n"
          "except DeviceError as e: print(repr(str(e)), isinstance(e, ValueError), e.__cause__, e.__suppress_context__)\n")
  proc = python(code, tmp_path, RULEC_DEVICE="nope")
  assert proc.returncode == 0, proc.stderr   # importing rulec did not fail
  assert proc.stdout.strip() == f"{BAD_DEVICE_LINE!r} True None True"


def test_missing_pyopencl_is_a_clean_exception_from_the_library(tmp_path):
  code = BLOCK_PYOPENCL + ("from rulec import Tensor\nfrom rulec.runtime.cl_device import CLUnavailable\n"
                           "try: (Tensor([1.0, 2.0], device='CL') + 1).numpy()\n"
                           "except CLUnavailable as e: print(len(str(e).splitlines()), e.__cause__, e.__suppress_context__)\n")
  proc = python(code, tmp_path)
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.strip() == "1 None True"   # one line, and no chained ImportError traceback under it
  # uncaught, the traceback ends in that one line and shows no second exception
  proc = python(BLOCK_PYOPENCL + "from rulec import Tensor\n(Tensor([1.0, 2.0], device='CL') + 1).numpy()\n", tmp_path)
  assert proc.returncode == 1
  assert "The above exception was the direct cause" not in proc.stderr
  assert proc.stderr.strip().splitlines()[-1].startswith("rulec.runtime.cl_device.CLUnavailable: the CL device needs pyopencl")


# *** the progress line ***

def on_a_terminal(argv: list[str], cwd: Path, environ: dict) -> tuple[int, str, str]:
  """Run with stderr on a pseudo-terminal: (exit status, stdout, what the terminal received)."""
  pty = pytest.importorskip("pty")
  master, slave = pty.openpty()
  fcntl, termios = pytest.importorskip("fcntl"), pytest.importorskip("termios")
  fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))   # 200 columns: no line is cut
  with open(cwd / "stdout.txt", "wb") as out:
    proc = subprocess.Popen(argv, cwd=cwd, env=environ, stdout=out, stderr=slave, stdin=subprocess.DEVNULL)
  os.close(slave)
  got = bytearray()
  try:
    while True:
      ready, _, _ = select.select([master], [], [], HANG_GUARD_S)
      if not ready: proc.kill(); pytest.fail("hang guard: no output and no exit")
      try: chunk = os.read(master, 65536)
      except OSError: break   # EIO: the child closed the terminal
      if not chunk: break
      got += chunk
  finally:
    os.close(master)
  rc = proc.wait(timeout=HANG_GUARD_S)
  return rc, (cwd / "stdout.txt").read_text(), got.decode("utf-8", "replace")


REALIZE = "import numpy as np\nfrom rulec import Tensor\nprint((Tensor(np.ones(8, np.float32)) + 1).numpy().sum())\n"


def test_a_realize_shows_a_progress_line_on_a_terminal(tmp_path):
  # RULEC_PROGRESS_AFTER=0: the line appears at once (by default after a second of work)
  rc, out, tty = on_a_terminal([sys.executable, "-c", REALIZE], tmp_path, env(tmp_path, RULEC_PROGRESS_AFTER="0"))
  assert rc == 0 and out == "16.0\n"
  assert "\rrulec realize: scheduling (0 s)" in tty   # (later redraws, "compiling and running kernels 0/1", are timed)
  assert tty.endswith("\r"), repr(tty[-80:])   # the line is erased when the work ends


def test_no_progress_line_with_rulec_progress_0_or_off_a_terminal(tmp_path):
  rc, out, tty = on_a_terminal([sys.executable, "-c", REALIZE], tmp_path,
                               env(tmp_path, RULEC_PROGRESS_AFTER="0", RULEC_PROGRESS="0"))
  assert rc == 0 and out == "16.0\n" and tty == ""
  proc = python(REALIZE, tmp_path, RULEC_PROGRESS_AFTER="0")   # stderr is a pipe
  assert proc.returncode == 0 and proc.stdout == "16.0\n" and proc.stderr == ""


def test_verify_shows_its_rule_set_on_a_terminal(tmp_path):
  work = tmp_path / "work"
  (work / "rules").mkdir(parents=True)
  (work / "rules" / "mine.rules").write_text("ruleset first:\n  rule a: x + 0 => x\nruleset second:\n  rule b: x * 1 => x\n")
  rc, out, tty = on_a_terminal([sys.executable, "-m", "rulec.cli", "verify", "--examples", "3"], work,
                               env(tmp_path, RULEC_PROGRESS_AFTER="0"))
  assert rc == 0 and out.strip().splitlines()[-1] == "total: 2 verified, 0 refuted, 0 not checkable"
  assert "rulec verify: ruleset first (1/2), 0/2 rules" in tty and "rulec verify: ruleset second (2/2), 1/2 rules" in tty


def test_trace_shows_what_it_recorded_on_a_terminal(tmp_path):
  (tmp_path / "prog.py").write_text(REALIZE)
  rc, out, tty = on_a_terminal([sys.executable, "-m", "rulec.cli", "trace", "prog.py", "-o", "t.html"], tmp_path,
                               env(tmp_path, RULEC_PROGRESS_AFTER="0"))
  assert rc == 0 and out.startswith("16.0\n") and (tmp_path / "t.html").is_file()
  assert "rulec trace: " in tty and " passes, " in tty and " rewrites" in tty


def test_progress_lines_in_a_forked_child_do_not_hang(tmp_path):
  # the CPU device forks workers: a child starts with no line and a lock of its own
  code = ("import os, sys\nfrom rulec.runtime import progress\nprogress.enabled = lambda stream=None: True\n"
          "with progress.job('parent', 'working') as j:\n"
          "  pid = os.fork()\n"
          "  if pid == 0:\n"
          "    with progress.job('child', 'working'): pass\n"
          "    os._exit(0)\n"
          "  _, status = os.waitpid(pid, 0)\n"
          "print(status)\n")
  proc = python(code, tmp_path, RULEC_PROGRESS_AFTER="0")
  assert proc.returncode == 0 and proc.stdout.strip() == "0"


def test_the_rulec_console_script_reports_the_version_too(tmp_path):
  exe = shutil.which("rulec")
  if exe is None: pytest.skip("no rulec console script on PATH")
  proc = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=HANG_GUARD_S, env=env(tmp_path))
  assert proc.returncode == 0 and proc.stdout.startswith("rulec ")
