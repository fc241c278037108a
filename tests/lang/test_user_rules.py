"""A user's rules directory (RULEC_RULES=DIR, `--rules DIR`) layered over the shipped rules.

* in-process: a set in the directory replaces the shipped one of its name (and sets that include it see the
  replacement); `ruleset NAME extends NAME:` appends rules to a shipped set (also a gradients set); the
  scheduler picks the layer up and the kernel count changes; errors are located in the user's file; an
  unknown `extends` target is R507; the matcher cache keys on the layered content; the CLI's --rules;
* from an installed (non-editable) wheel in a fresh venv: RULEC_RULES changes a program's kernel count; and the
  rule authors' tools work from it (`rulec fmt --check`, `rulec check --format sarif`, `pygmentize -l rulec`
  through the entry point, and `rulec lsp` answering an LSP initialize).
"""
from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path: sys.path.insert(0, str(REPO))

from rulec.engine.sched import cache as schedule_cache  # noqa: E402
from rulec.engine.lang.diagnostics import RuleError  # noqa: E402
from rulec.engine.lang.loader import check_paths, load_library  # noqa: E402
from rulec.engine.tensor import Tensor  # noqa: E402
from rulec.cli import main as rulec  # noqa: E402
from tests.helpers import build_wheel, copy_sources  # noqa: E402

# EXP2 of an ADD reads a contiguous copy of the ADD: one more kernel for exp2(a * b + 1)
EXTEND = """\
ruleset earliest extends earliest:
  rule exp2_split: x:EXP2(a:ADD) => x.replace(src=(a.contiguous(),))
"""

PROGRAM = """\
import numpy as np
import rulec
from rulec.engine.lang.loader import default_rules_dir
from rulec.engine.tensor import Tensor
a, b = Tensor(np.ones((4, 4), np.float32)), Tensor(np.ones((4, 4), np.float32))
out = (a * b + 1).exp2()
n = len(Tensor.schedule(out))
print(n, float(out.numpy()[0, 0]), rulec.__file__, default_rules_dir())
"""


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
  for k in list(os.environ):
    if k.startswith("RULEC_"): monkeypatch.delenv(k)
  monkeypatch.setenv("RULEC_CACHE_DIR", str(tmp_path / "cache"))


def user_dir(tmp_path: Path, **files: str) -> Path:
  d = tmp_path / "mine"
  d.mkdir(exist_ok=True)
  for name, text in files.items(): (d / f"{name}.rules").write_text(textwrap.dedent(text))
  return d


def program_kernels() -> int:
  a, b = Tensor(np.ones((4, 4), np.float32)), Tensor(np.ones((4, 4), np.float32))
  return len(Tensor.schedule((a * b + 1).exp2()))


def names(lib, ruleset: str) -> list[str]: return [r.name for r in lib.matcher(ruleset).rules]


# *** in-process ***

def test_extends_appends_to_the_shipped_set_and_the_scheduler_sees_it(tmp_path, monkeypatch):
  d = user_dir(tmp_path, extra=EXTEND)
  shipped = names(load_library(), "earliest")
  lib = load_library(user=[d])
  assert names(lib, "earliest") == shipped + ["exp2_split"]
  assert lib.user_ruleset_names() == ["earliest"]
  assert program_kernels() == 1
  monkeypatch.setenv("RULEC_RULES", str(d))
  assert names(load_library(), "earliest")[-1] == "exp2_split"
  schedule_cache.clear()   # its key does not include the rules: a process that changes RULEC_RULES clears it
  assert program_kernels() == 2
  monkeypatch.delenv("RULEC_RULES")
  schedule_cache.clear()
  assert program_kernels() == 1


def test_a_set_of_the_same_name_replaces_the_shipped_one(tmp_path):
  # a copied and edited set may reuse the shipped rule names; `earliest` (which includes it) sees the new set
  d = user_dir(tmp_path, mop="""\
    ruleset mop_cleanup:
      rule reshape_noop: x:RESHAPE(a) if a._shape == x.arg => a
  """)
  lib = load_library(user=[d])
  assert names(lib, "mop_cleanup") == ["reshape_noop"]
  assert names(lib, "earliest")[0] == "reshape_noop" and "reshape_reshape" not in names(lib, "earliest")
  assert "reshape_reshape" in names(load_library(), "earliest")
  assert lib.checked.ruleset_file["mop_cleanup"] == str(d / "mop.rules")


def test_extends_with_a_new_name_leaves_the_base_alone(tmp_path):
  d = user_dir(tmp_path, more="""\
    ruleset my_symbolic extends symbolic:
      rule max_absorb: MAX(x, m:MAX(x, _)) => m
  """)
  lib = load_library(user=[d])
  assert names(lib, "my_symbolic") == names(lib, "symbolic") + ["max_absorb"]
  assert names(lib, "symbolic") == names(load_library(), "symbolic")


def test_a_gradients_set_is_extended_by_a_gradients_set(tmp_path):
  d = user_dir(tmp_path, grad="""\
    gradients gradient(d) extends gradient:
      rule grad_my_marker: FUSE(_) => (d,)
  """)
  lib = load_library(user=[d])
  lib.require_clean()
  rules = lib.matcher("gradient").rules
  assert rules[-1].name == "grad_my_marker" and rules[-1].grad == "d" and rules[0].grad == "g"
  bad = user_dir(tmp_path, grad="""\
    ruleset gradient extends gradient:
      rule r: x + 0 => x
  """)
  lib, _ = check_paths(None, user=[bad])
  assert {d.code for d in lib.errors} == {"R506"}


def test_errors_are_located_in_the_users_file(tmp_path):
  d = user_dir(tmp_path, extra="""\
    ruleset earliest extends earliest:
      rule broken: x + 0 => x + zz
  """)
  with pytest.raises(RuleError) as e:
    load_library(user=[d]).matcher("earliest")
  text = str(e.value)
  assert f"{d / 'extra.rules'}:2:29: error R201: unbound name 'zz'" in text
  assert "  rule broken: x + 0 => x + zz" in text and "|" + " " * 29 + "^^" in text
  (d / "extra.rules").write_text("ruleset earliest extends earliest:\n  rule r: x + => x\n")
  with pytest.raises(RuleError, match=rf"{(d / 'extra.rules')}:2:15: error R001"):
    load_library(user=[d]).matcher("earliest")


def test_unknown_extends_target_is_R507(tmp_path, capsys):
  d = user_dir(tmp_path, extra="ruleset earliest extends earlist:\n  rule r: x + 0 => x\n")
  lib, sources = check_paths(None, user=[d])
  (err,) = lib.errors
  assert (err.code, err.span.file, err.span.line, err.span.col, err.span.end_col) == ("R507", str(d / "extra.rules"), 1, 26, 33)
  assert rulec(["check", "--no-examples", "--rules", str(d)]) == 1
  out = capsys.readouterr().out
  assert "extra.rules:1:26: error R507: ruleset 'earliest' extends 'earlist'" in out and "^^^^^^^" in out
  # extends looks beneath the file's layer only: checked alone, nothing is beneath it
  ok = user_dir(tmp_path, extra=EXTEND)
  lib, _ = check_paths([ok])
  assert [x.code for x in lib.errors] == ["R507"]


def test_cache_keys_on_the_layered_content(tmp_path):
  d = user_dir(tmp_path, extra=EXTEND)
  plain, layered = load_library(), load_library(user=[d])
  assert plain.digest != layered.digest
  (d / "extra.rules").write_text(EXTEND.replace("exp2_split", "exp2_split2"))
  again = load_library(user=[d])
  assert again.digest not in (plain.digest, layered.digest)
  assert names(again, "earliest")[-1] == "exp2_split2"


def test_cli_rules_option(tmp_path, capsys, monkeypatch):
  d = user_dir(tmp_path, extra=EXTEND)
  n = len(load_library().rules_of(("earliest",)))
  assert rulec(["compile", "earliest", "--rules", str(d)]) == 0
  assert f"compiled earliest: {n + 1} rules" in capsys.readouterr().out
  monkeypatch.setenv("RULEC_RULES", str(d))
  assert rulec(["compile", "earliest"]) == 0
  assert f"compiled earliest: {n + 1} rules" in capsys.readouterr().out
  assert rulec(["check", "--no-examples"]) == 0
  assert "0 errors, 0 warnings" in capsys.readouterr().err
  monkeypatch.delenv("RULEC_RULES")
  assert rulec(["compile", "earliest", "--rules", str(tmp_path / "missing")]) == 2
  for cmd in (["demo"], ["trace", "p.py"], ["verify"], ["explain", "r", "p.py"]):
    assert rulec([*cmd, "--rules", str(tmp_path / "missing")]) == 2, cmd
  assert "no such file or directory" in capsys.readouterr().err


# *** from an installed wheel ***

@pytest.fixture(scope="module")
def installed(tmp_path_factory):
  """A fresh venv with a (non-editable) wheel of this checkout installed; numpy etc. come from the running
  environment's site-packages through a .pth line (which does not run that environment's editable finder)."""
  tmp = tmp_path_factory.mktemp("wheel")
  src = tmp / "src"
  src.mkdir()
  copy_sources(src)
  wheel = build_wheel(src, tmp / "dist")
  venv = tmp / "venv"
  subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
  py = venv / "bin" / "python"
  purelib = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                check=True, capture_output=True, text=True).stdout.strip())
  (purelib / "_outer.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
  # --ignore-installed: the outer environment may have rulec installed itself (CI does), which the .pth line
  # makes visible; pip must still put this wheel into the venv, whose site-packages come first
  subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index",
                  "--ignore-installed", "-q", str(wheel)], check=True, capture_output=True, timeout=120)
  return venv


def _run(venv: Path, cwd: Path, *argv: str, **env: str) -> str:
  clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("RULEC_")}
  proc = subprocess.run(list(argv), cwd=cwd, env={**clean, "RULEC_CACHE_DIR": str(cwd / "cache"), **env},
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr
  return proc.stdout


def test_installed_wheel_picks_up_RULEC_RULES(installed, tmp_path):
  d = user_dir(tmp_path, extra=EXTEND)
  prog = tmp_path / "prog.py"
  prog.write_text(PROGRAM)
  py = str(installed / "bin" / "python")
  n, value, module, rules_dir = _run(installed, tmp_path, py, str(prog)).split()
  assert (n, value) == ("1", "4.0")
  assert module.startswith(str(installed)) and rules_dir.startswith(str(installed)) and rules_dir.endswith("rulec/rules")
  n2, value2, *_ = _run(installed, tmp_path, py, str(prog), RULEC_RULES=str(d)).split()
  assert (n2, value2) == ("2", "4.0")
  rulec_bin = str(installed / "bin" / "rulec")
  assert "0 errors" in subprocess.run([rulec_bin, "check", "--no-examples", "--rules", str(d)], cwd=tmp_path,
                                      capture_output=True, text=True, timeout=120).stderr
  out = _run(installed, tmp_path, rulec_bin, "compile", "earliest", "--rules", str(d))
  out0 = _run(installed, tmp_path, rulec_bin, "compile", "earliest")
  assert int(out.split()[2]) == int(out0.split()[2]) + 1


def test_installed_wheel_has_the_rule_authors_tools(installed, tmp_path):
  import json
  bin_ = installed / "bin"
  env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("RULEC_")},
         "RULEC_CACHE_DIR": str(tmp_path / "cache")}
  def run(*argv, **kw): return subprocess.run(list(argv), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False, **kw)
  (tmp_path / "ok.rules").write_text("ruleset s:\n  rule a: x + 0 => x\n")
  (tmp_path / "messy.rules").write_text("ruleset t:\n   rule b:x*1=>x+y\n")
  fmt = run(str(bin_ / "rulec"), "fmt", "--check", "ok.rules", "messy.rules")
  assert fmt.returncode == 1 and fmt.stdout == "would reformat messy.rules\n", fmt.stderr
  sarif = run(str(bin_ / "rulec"), "check", "--format", "sarif", "--no-examples", "messy.rules")
  log = json.loads(sarif.stdout)
  assert sarif.returncode == 1 and log["version"] == "2.1.0"
  assert [(r["ruleId"], r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]) for r in log["runs"][0]["results"]] == \
    [("R201", "messy.rules")]
  py = str(bin_ / "python")
  # what `pygmentize -l rulec` does: the lexer found by its alias, through the wheel's entry point
  lexer = run(py, "-c", "import sys, pygments, pygments.lexers as L, pygments.formatters as F; lx = L.get_lexer_by_name('rulec'); "
                        "print(sys.modules[type(lx).__module__].__file__, pygments.highlight(open('ok.rules').read(), lx, F.HtmlFormatter()))")
  assert lexer.stdout.startswith(str(installed)) and '<span class="k' in lexer.stdout, lexer.stderr
  # an LSP initialize and shutdown over stdio, framed by hand
  msgs = [{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"processId": None, "rootUri": None, "capabilities": {}}},
          {"jsonrpc": "2.0", "method": "initialized", "params": {}}, {"jsonrpc": "2.0", "id": 2, "method": "shutdown"},
          {"jsonrpc": "2.0", "method": "exit"}]
  framed = "".join(f"Content-Length: {len(json.dumps(m).encode())}\r\n\r\n{json.dumps(m)}" for m in msgs)
  lsp = run(str(bin_ / "rulec"), "lsp", input=framed)
  reply = json.JSONDecoder().raw_decode(lsp.stdout[lsp.stdout.find("{"):])[0]
  assert reply["id"] == 1 and reply["result"]["capabilities"]["hoverProvider"], lsp.stderr


def test_installed_wheel_runs_its_first_program_without_compiling_the_shipped_rules(installed, tmp_path):
  # the wheel's build compiled every rule set (setup.py, engine/lang/shipped.py): with an empty cache, a fresh
  # install's first program loads them all from the package, compiles none; a user's rules directory is compiled
  prog = tmp_path / "first.py"
  prog.write_text(PROGRAM.replace("print(n,", "from rulec.engine.lang import loader\nprint(loader.COMPILED['shipped'], "
                                  "loader.COMPILED['compiled'], loader.COMPILED['cached'], n,"))
  py = str(installed / "bin" / "python")
  shipped, compiled, cached, n, value, *_ = _run(installed, tmp_path, py, str(prog)).split()
  assert int(shipped) >= 10 and (compiled, cached) == ("0", "0") and (n, value) == ("1", "4.0")
  d = user_dir(tmp_path, extra=EXTEND)
  shipped, compiled, cached, n, value, *_ = _run(installed, tmp_path, py, str(prog), RULEC_RULES=str(d)).split()
  assert shipped == "0" and int(compiled) >= 10 and (n, value) == ("2", "4.0")
