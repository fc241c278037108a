"""A rules file is untrusted input (issue 19): the hostile corpus of tests/hostile_rules.py, run in subprocesses.

For every file, through `rulec check`, `rulec check --format json` and the loader API (and, for files that load,
graph_rewrite on a few nodes): nothing of the file runs (no marker file, no audited open of the marker or the
secret, no command started), no file is written outside the matcher cache, the secret file's contents never
appear, there is no traceback and no hang, every diagnostic is located, and the JSON output parses.
"""
from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path: sys.path.insert(0, str(REPO))

from rulec.engine.lang import capability  # noqa: E402
from rulec.engine.lang.capability import RuleCapabilityError, rule_attr  # noqa: E402
from tests.hostile_rules import build  # noqa: E402

SHARDS = 2
# files of these categories are all attacks: each must be rejected with at least one error
MUST_REJECT = ("helper", "attribute", "direct")


def _env(tmp: Path) -> dict:
  env = {k: v for k, v in os.environ.items() if not k.startswith("RULEC_")}
  env.update(RULEC_CACHE_DIR=str(tmp / "cache"), RULEC_EXAMPLE_TIMEOUT="0.5", HOME=str(tmp / "home"),
             PYTHONPATH=str(REPO), PYTHONDONTWRITEBYTECODE="1")
  return env


def _tree(root: Path) -> set[str]:
  return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("untrusted")
  (tmp / "home").mkdir()
  (tmp / "work").mkdir()
  marker, secret = tmp / "PWNED", tmp / "secret.txt"
  token = secrets.token_hex(16)
  secret.write_text(token)
  files = build(tmp / "corpus", marker, secret)
  before = _tree(tmp)
  lists, procs = [], []
  for k in range(SHARDS):
    lst = tmp / f"shard{k}.txt"
    lst.write_text("".join(f"{cat}\t{str(p)!r}\n" for i, (p, cat) in enumerate(files) if i % SHARDS == k))
    out = tmp / f"shard{k}.json"
    code = f"from tests.hostile_rules import drive; drive({str(lst)!r}, {str(out)!r}, {str(marker)!r}, {str(secret)!r})"
    procs.append((subprocess.Popen([sys.executable, "-c", code], cwd=tmp / "work", env=_env(tmp), stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, errors="backslashreplace"), out))
    lists += [lst, out]
  results, streams = [], []
  for proc, out in procs:
    try: stdout, stderr = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
      proc.kill()
      stdout, stderr = proc.communicate()
      pytest.fail(f"the corpus driver hung:\n{stderr[-3000:]}")
    streams.append(stdout + stderr)
    assert proc.returncode == 0, stderr[-5000:]
    results += json.loads(out.read_text())
  after = _tree(tmp)
  return {"tmp": tmp, "files": files, "results": results, "streams": streams, "token": token, "marker": marker,
          "new": after - before - {str(p.relative_to(tmp)) for p in lists} - {"shard0.json.tmp", "shard1.json.tmp"}}


def test_the_corpus_is_large_and_covers_every_category(corpus):
  cats = [c for _, c in corpus["files"]]
  assert len(cats) >= 300
  assert {"helper", "attribute", "direct", "injection", "lexical", "nesting", "dos"} <= set(cats)
  assert len(corpus["results"]) == len(corpus["files"])


def test_nothing_runs_and_nothing_fails(corpus):
  bad = [(r["path"], r["problems"]) for r in corpus["results"] if r["problems"]]
  assert not bad, "\n".join(f"{p}: {pr}" for p, pr in bad[:40])
  assert not corpus["marker"].exists()
  for text in corpus["streams"]:
    assert "AUDIT-FLAG" not in text, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    assert corpus["token"] not in text


def test_no_file_is_written_except_the_matcher_cache(corpus):
  # (and the cache's own key, cache/hmac-key, and each matcher's bytecode beside it, .code: engine/diskcache.py)
  written = sorted(p for p in corpus["new"] if not (p in ("cache", "cache/hmac-key") or (
                   p.startswith("cache/") and p.count("/") == 1 and p.endswith((".py", ".code")))))
  assert written == [], written


def test_every_attack_is_rejected(corpus):
  accepted = [r["path"] for r in corpus["results"] if r["category"] in MUST_REJECT and not r["errors"]]
  assert not accepted, accepted


# The files of the `dos` category whose work has no bound of its own (nested includes, commutative expansions, huge
# files, examples that would run for hours or loop) and the limit that must stop each: its diagnostic code. The
# rest of the category (many rules, many sets, a wide fan-out of includes) is large but finite, and must be accepted.
# Counted, not timed: each file is stopped by the limit meant for it, whatever the machine's load; the per-file
# alarm in check_one (tests/hostile_rules.py, 60 s) is only a hang guard, reported as a problem above.
DOS_LIMITS = {"dos-commutative": {"R701"}, "dos-include-diamond-40": {"R702"}, "dos-include-diamond-200": {"R702"},
              "dos-include-chain": {"R702"}, "dos-include-cycle-long": {"R504", "R702"}, "dos-huge": {"R705"},
              "dos-example": {"R706", "R707", "R605"}, "dos-rewrite-loop": {"R605", "R706"},
              "dos-growing-graph": {"R605", "R706", "R707"}}   # (the step limit, or on a loaded machine the time limit first)
DOS_ACCEPTED = ("dos-include-diamond-10", "dos-include-fanout", "dos-many-rules", "dos-many-rulesets", "dos-many-shadowed")


def test_every_unbounded_file_is_stopped_by_its_limit(corpus):
  dos = [r for r in corpus["results"] if r["category"] == "dos"]
  assert len(dos) >= 30
  hung = [r["path"] for r in corpus["results"] if any(p.startswith("hang") for p in r["problems"])]
  assert not hung, hung
  for r in dos:
    name = Path(r["path"]).stem
    if name.startswith(DOS_ACCEPTED):
      # (dos-many-shadowed: 1500 copies of one rule, each shadowed by the first: R505 warnings, no error)
      assert r["errors"] == 0 and set(r["codes"]) <= {"R505"}, (name, r["codes"])
      continue
    want = next(codes for prefix, codes in DOS_LIMITS.items() if name.startswith(prefix))
    assert r["errors"] >= 1 and set(r["codes"]) & want, (name, r["codes"], sorted(want))


def test_the_cli_on_the_whole_corpus(corpus):
  # the real command, once over every file together (one library): JSON parses, every diagnostic is located
  tmp = corpus["tmp"]
  proc = subprocess.run([sys.executable, "-m", "rulec.cli", "check", "--format", "json", str(tmp / "corpus")], cwd=tmp / "work",
                        env=_env(tmp), capture_output=True, text=True, errors="backslashreplace", timeout=120)
  assert proc.returncode == 1, proc.stderr[-3000:]
  assert "Traceback" not in proc.stderr
  data = json.loads(proc.stdout)
  assert data["errors"] > 300
  names = {str(p) for p, _ in corpus["files"]}
  assert all(d["file"] in names and d["line"] >= 1 and d["col"] >= 1 for d in data["diagnostics"])
  assert not corpus["marker"].exists()


# *** the boundary itself ***

def test_the_documented_helpers_are_the_marked_ones():
  """docs/rules.md's table lists every helper library (engine/lang/libraries.py), its module and its marked helpers."""
  from rulec.engine.lang.libraries import LIBRARIES, library_helpers
  doc = (REPO / "docs" / "rules.md").read_text()
  listed = {}
  for line in doc.splitlines():
    cells = [c.strip() for c in line.split("|")]
    if len(cells) == 5 and cells[1].startswith("`") and cells[2].startswith("`rulec."):
      listed[cells[1].strip("`")] = (cells[2].strip("`"), set(cells[3].replace("`", " ").split()))
  assert listed == {lib: (mod, set(library_helpers(lib))) for lib, mod in LIBRARIES.items()}
  assert {h for _, names in listed.values() for h in names} and all(library_helpers(lib) for lib in LIBRARIES)


def test_the_documented_attributes_are_the_allowlist():
  doc = (REPO / "docs" / "rules.md").read_text()
  section = doc[doc.index("### What rules can reach"):doc.index("### Forbidden")]
  for attrs in (capability.UOP_ATTRS, capability.UOP_CLASS_ATTRS, capability.DTYPE_ATTRS, capability._STR,
                capability._LIST, capability._DICT, capability._SET, capability._NUMBER):
    for a in attrs: assert f"`{a}`" in section, a


def test_rule_attr_is_an_allowlist():
  from rulec.engine.ir.dtypes import dtypes
  from rulec.engine.ir.ops import Ops
  from rulec.engine.ir.uop import UOp
  x = UOp.variable("x", 0, 4)
  assert rule_attr(x, "vmax") == 4 and rule_attr(dtypes.int8, "max")() == 127 and rule_attr(Ops, "ADD") is Ops.ADD
  assert rule_attr("ab", "upper")() == "AB" and rule_attr(UOp, "const") is UOp.const
  for obj, name in [(x, "_memo"), (x, "__class__"), ("a", "format"), ("a", "encode"), (len, "__self__"), (os, "system"),
                    (Path("."), "write_text"), (rule_attr, "__globals__"), (UOp, "replace"), (dtypes, "__dict__"),
                    (type("S", (str,), {})("a"), "upper")]:
    with pytest.raises(RuleCapabilityError): rule_attr(obj, name)


def test_unmarked_and_private_functions_are_not_helpers():
  from rulec.engine.lang.capability import rule_helper
  with pytest.raises(ValueError): rule_helper(lambda: 0)
  def _private(): pass
  with pytest.raises(ValueError): rule_helper(_private)
  with pytest.raises(TypeError): rule_helper(len)


def test_the_harness_detects_execution(tmp_path):
  # the control: a marked helper of a user package that writes the marker and reads the secret is caught
  pkg = tmp_path / "evil_helpers.py"
  marker, secret = tmp_path / "PWNED", tmp_path / "secret.txt"
  secret.write_text("tok-control")
  pkg.write_text("from rulec import rule_helper\n"
                 "@rule_helper\n"
                 f"def touch(x):\n  open({str(marker)!r}, 'w').close()\n  return x.const_like(open({str(secret)!r}).read())\n")
  rules = tmp_path / "c.rules"
  rules.write_text("use evil_helpers (touch)\nruleset s:\n  rule r: x + 0 => touch(x)\n    example: RANGE(3) + 0 => RANGE(3)\n")
  lst, out = tmp_path / "list.txt", tmp_path / "out.json"
  lst.write_text(f"helper\t{str(rules)!r}\n")
  env = _env(tmp_path)
  env.update(RULEC_HELPER_PACKAGES="evil_helpers", PYTHONPATH=f"{REPO}{os.pathsep}{tmp_path}")
  code = f"from tests.hostile_rules import drive; drive({str(lst)!r}, {str(out)!r}, {str(marker)!r}, {str(secret)!r})"
  proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
  [res] = json.loads(out.read_text())
  assert any("EXECUTED" in p for p in res["problems"]), res
  assert "AUDIT-FLAG open" in proc.stderr


@pytest.mark.parametrize("bottom_up", [False, True])
def test_a_graph_with_non_node_sources_is_a_rule_error(tmp_path, bottom_up):
  from rulec.engine.lang.loader import RuleLibrary
  from rulec.engine.lang.runtime import RuleRuntimeError
  from rulec.engine.ir.rewrite import graph_rewrite
  from rulec.engine.ir.uop import UOp
  path = tmp_path / "n.rules"
  path.write_text("ruleset s:\n  rule shallow: x + 0 => x.replace(src=(1, 2))\n"
                  "  rule deep: x * 1 => UOp.sink(x.replace(src=(None,)))\n")
  m = RuleLibrary([path]).matcher("s")
  x = UOp.variable("x", 0, 10)
  for node, name in ((x + 0, "shallow"), (x * 1, "deep")):
    with pytest.raises(RuleRuntimeError) as e: graph_rewrite(node, m, bottom_up=bottom_up)
    assert e.value.rule_name == name and e.value.location == f"{path}:{2 if name == 'shallow' else 3}:3"


# *** rules directories hold only regular files (issue 32, item 3): a FIFO, links, a sparse giant ***

PROGRAM = "from rulec import Tensor\nprint((Tensor([1.0, 2.0]) + 0).numpy().tolist())\n"


def _run(args: list[str], tmp: Path, timeout: float = 120, limit_as: int | None = None, **env) -> subprocess.CompletedProcess:
  """A command under a hang guard (and, with `limit_as`, an address-space limit: a whole-file read fails)."""
  def pre():
    import resource
    resource.setrlimit(resource.RLIMIT_AS, (limit_as, limit_as))
  return subprocess.run(args, cwd=tmp, env={**_env(tmp), **env}, capture_output=True, text=True, errors="backslashreplace",
                        timeout=timeout, preexec_fn=pre if limit_as else None)


def _rules_dir(tmp: Path) -> Path:
  d = tmp / "myrules"
  d.mkdir()
  (d / "good.rules").write_text("ruleset mine:\n  rule a: x + 0 => x\n")
  (tmp / "home").mkdir(exist_ok=True)
  return d


def _check(d: Path, tmp: Path, *more: str, **kw) -> subprocess.CompletedProcess:
  return _run([sys.executable, "-m", "rulec.cli", "check", "--no-examples", *more, str(d)], tmp, **kw)


def test_a_fifo_in_a_rules_directory_is_refused_without_waiting(tmp_path):
  d = _rules_dir(tmp_path)
  os.mkfifo(d / "x.rules")
  proc = _check(d, tmp_path, timeout=60)   # the hang guard: opening a FIFO for reading waits for a writer
  assert proc.returncode == 1 and "Traceback" not in proc.stderr
  assert f"{d / 'x.rules'}:1:1: error R006: not a regular file (a FIFO)" in proc.stdout, proc.stdout
  data = json.loads(_check(d, tmp_path, "--format", "json", timeout=60).stdout)
  assert [(x["code"], x["file"], x["line"], x["col"]) for x in data["diagnostics"]] == [("R006", str(d / "x.rules"), 1, 1)]
  prog = _run([sys.executable, "-c", PROGRAM], tmp_path, timeout=120, RULEC_RULES=str(d))
  assert prog.returncode != 0 and "R006" in prog.stderr and "x.rules" in prog.stderr


@pytest.mark.parametrize("target", ["secret", "/dev/zero", "/proc/self/environ"])
def test_a_link_in_a_rules_directory_is_never_read(tmp_path, target):
  d = _rules_dir(tmp_path)
  token = secrets.token_hex(16)
  secret = tmp_path / "secret.txt"
  # a rules file whose error is on the secret's line: read through the link, its line would be printed
  secret.write_text(f"ruleset s:\n  rule a: x + 0 => {token} $\n")
  (d / "x.rules").symlink_to(secret if target == "secret" else target)
  env = {"LEAKED_TOKEN": token}   # /proc/self/environ of the reader holds it
  for fmt in ("human", "json"):
    proc = _check(d, tmp_path, "--format", fmt, timeout=60, limit_as=1 << 30, **env)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and "MemoryError" not in proc.stdout + proc.stderr
    assert token not in proc.stdout + proc.stderr
    assert "R006" in proc.stdout and "a symbolic link" in proc.stdout
  prog = _run([sys.executable, "-c", PROGRAM], tmp_path, timeout=120, RULEC_RULES=str(d), **env)
  assert token not in prog.stdout + prog.stderr and "R006" in prog.stderr
  # named on the command line, the link is refused too (docs/security.md)
  proc = _check(d / "x.rules", tmp_path, timeout=60, **env)
  assert proc.returncode == 1 and token not in proc.stdout + proc.stderr and "R006" in proc.stdout
  assert secret.read_text().startswith("ruleset")


def test_a_sparse_giant_is_refused_before_it_is_read(tmp_path):
  d = _rules_dir(tmp_path)
  with open(d / "big.rules", "wb") as f: f.truncate(2 << 30)   # 2 GiB, no blocks on disk
  # under a 1 GiB address-space limit: a whole-file read would end in MemoryError
  proc = _check(d, tmp_path, "--format", "json", timeout=120, limit_as=1 << 30)
  assert proc.returncode == 1 and "MemoryError" not in proc.stdout + proc.stderr, proc.stderr[-2000:]
  data = json.loads(proc.stdout)
  [diag] = data["diagnostics"]
  assert (diag["code"], diag["file"], diag["line"], diag["col"]) == ("R705", str(d / "big.rules"), 1, 1)
  assert diag["message"] == f"the file has {2 << 30} bytes; rules files are limited to 1048576 bytes"
  from rulec.engine.lang.loader import read_rule_file
  from rulec.engine.diskcache import Refused
  assert isinstance(read_rule_file(d / "big.rules"), Refused)

def test_a_file_longer_than_its_size_is_read_only_to_the_limit(monkeypatch):
  # a /proc file's size says 0: the read stops one byte past the limit, and R705 says so
  from rulec.engine.diskcache import Refused
  from rulec.engine.lang import loader
  monkeypatch.setattr(loader, "MAX_FILE_BYTES", 8)
  err = loader.read_rule_file(Path("/proc/self/environ"))
  assert isinstance(err, Refused) and err.size is None
  d = loader.unread_diagnostic("/proc/self/environ", err)
  assert (d.code, d.span.line, d.span.col, d.message) == ("R705", 1, 1, "the file has more than 8 bytes; rules files are limited to 8 bytes")
