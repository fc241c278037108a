"""docs/fusion.md, run: the fusion decisions are rules (rules/fusion.rules), and a user's directory changes them.

Each ```rules dir=NAME``` block of the page is written to NAME/fusion.rules, each ```python file=F``` block
to F, and each ```console``` block's commands run in that directory (`$ ` lines; the expected output follows,
`...` matching any text). The page's copy of the shipped sets must be the shipped file's rules."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path: sys.path.insert(0, str(REPO))

from rulec.engine.sched import cache as schedule_cache  # noqa: E402
from rulec.engine.tensor import Tensor  # noqa: E402
from tests.helpers import subprocess_env  # noqa: E402

DOC = REPO / "docs" / "fusion.md"
FENCE = re.compile(r"^```(?P<info>[^\n`]*)\n(?P<body>.*?)^```[ \t]*$", re.M | re.S)


def blocks() -> list[tuple[str, str]]:
  return [(m["info"].strip(), m["body"]) for m in FENCE.finditer(DOC.read_text())]


def _matches(want: str, got: str) -> bool:
  pattern = ".*".join(re.escape(part) for part in want.strip().split("..."))
  return re.fullmatch(pattern, got.strip(), re.S) is not None


def _code(text: str) -> str:
  """The rules text without comments, whitespace collapsed."""
  return " ".join(re.sub(r"#.*", "", text).split())


def test_the_page_shows_the_shipped_rules():
  page = next(body for info, body in blocks() if info == "rules")
  assert _code(page) == _code((REPO / "rules" / "fusion.rules").read_text())


def _write(tmp: Path, name: str, text: str) -> Path:
  (tmp / name).mkdir(exist_ok=True)
  (tmp / name / "fusion.rules").write_text(text)
  return tmp / name / "fusion.rules"


def test_every_console_example_of_the_page(tmp_path):
  ran = 0
  env = subprocess_env(PYTHONPATH=str(REPO))
  for info, body in blocks():
    words = dict(w.split("=", 1) for w in info.split()[1:] if "=" in w)
    if info.startswith("rules") and "dir" in words: _write(tmp_path, words["dir"], body)
    elif info.startswith("python") and "file" in words: (tmp_path / words["file"]).write_text(body)
    elif info.startswith("console"):
      for cmd, want in re.findall(r"^\$ (.*)\n((?:(?!\$ ).*\n?)*)", body, re.M):
        out = subprocess.run(["bash", "-c", cmd], cwd=tmp_path, env=env, capture_output=True, text=True)
        got = out.stdout + out.stderr
        assert out.returncode == 0 and _matches(want, got), f"{cmd}\n--- expected ---\n{want}\n--- got ---\n{got}"
        ran += 1
  assert ran >= 4


def test_the_demo_kernel_counts_follow_a_users_directory(tmp_path, monkeypatch):
  from rulec.demo import _workloads
  rules = next(body for info, body in blocks() if info == "rules dir=matmul_apart")
  _write(tmp_path, "matmul_apart", rules)
  def counts() -> list[int]:
    schedule_cache.clear()
    return [len(Tensor.schedule(f()[0])) for f in _workloads(np.random.default_rng(0)).values()]
  shipped = counts()
  monkeypatch.setenv("RULEC_RULES", str(tmp_path / "matmul_apart"))
  assert counts() == [4, 3, 14] and shipped == [2, 2, 11]   # the numbers docs/fusion.md states
  monkeypatch.delenv("RULEC_RULES")
  assert counts() == shipped
