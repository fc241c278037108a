"""The disk cache (engine/diskcache.py) runs only what rulec itself wrote there (issue 32, item 2), played as an
attacker would: a planted matcher that would create a marker file, a planted kernel with a recomputed checksum,
a cache directory others can write or another user owns, an empty or relative XDG_CACHE_HOME that would put
the cache in the working directory, a FIFO and a link to /dev/zero where entries belong. Each time: nothing
planted runs, the values are right, and a refused directory is said once on stderr and left untouched.

What loads CPU code from disk runs in child processes (tests/runtime/test_kernel_cache.py says why)."""
from __future__ import annotations

import hashlib
import json
import os
import random
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from rulec.engine import diskcache
from rulec.engine.ir.uop import UOp
from rulec.engine.lang.loader import RuleLibrary
from tests.helpers import subprocess_env
from tests.runtime.test_kernel_cache import CHILD, entries

RULES = "ruleset s:\n  rule add_zero: x + 0 => x\n  rule mul_one: x * 1 => x\n"


def _evil_matcher(marker: Path) -> str:
  """A matcher body that works (it rewrites nothing) and, when executed, creates `marker`."""
  return f"open({str(marker)!r}, 'w').close()\nDISPATCH = {{}}\nRULES = ()\nSTATS = []\n"


def _old_style(key: str, body: str) -> str:
  """An entry in the format the cache used to trust: its key and a checksum anyone can recompute."""
  return f"# rulec-cache key={key} body={hashlib.sha256(body.encode()).hexdigest()}\n{body}"


def _rules(tmp: Path) -> Path:
  p = tmp / "a.rules"
  p.write_text(RULES)
  return p


def _matcher_key(rules: Path, tmp: Path, monkeypatch) -> str:
  """The name of the matcher entry for set `s` of `rules` (entry names do not depend on the cache's place)."""
  scratch = tmp / "scratch-cache"
  monkeypatch.setenv("RULEC_CACHE_DIR", str(scratch))
  RuleLibrary([rules]).matcher("s")
  (entry,) = scratch.glob("*.py")
  return entry.stem


def _works(rules: Path) -> None:
  m = RuleLibrary([rules]).matcher("s")
  a = UOp.variable("a", 0, 3)
  assert m.rewrite(a + 0) is a and m.rewrite(a * 1) is a


@pytest.fixture
def cache(tmp_path, monkeypatch):
  d = tmp_path / "cache"
  monkeypatch.setenv("RULEC_CACHE_DIR", str(d))
  monkeypatch.delenv("RULEC_KERNEL_CACHE", raising=False)
  return d


# *** planted entries ***

@pytest.mark.parametrize("how", ["old checksum", "forged tag", "before the first run"])
def test_a_planted_matcher_never_runs(tmp_path, cache, monkeypatch, how):
  rules, marker = _rules(tmp_path), tmp_path / "PWNED"
  key = _matcher_key(rules, tmp_path, monkeypatch)
  monkeypatch.setenv("RULEC_CACHE_DIR", str(cache))
  if how != "before the first run": _works(rules)   # rulec's own entry (and key) first
  cache.mkdir(mode=0o700, exist_ok=True)
  body = _evil_matcher(marker)
  text = _old_style(key, body) if how != "forged tag" else f"# rulec-cache key={key} hmac={'ab' * 32}\n{body}"
  (cache / f"{key}.py").write_text(text)
  _works(rules)
  assert not marker.exists(), "a planted matcher ran"
  entry = (cache / f"{key}.py").read_text()
  assert "DISPATCH" in entry and "PWNED" not in entry and diskcache.load_text(key) is not None   # rebuilt, and sound


def test_an_entry_copied_under_another_name_is_refused(cache):
  # rulec's own entry, tag and all, moved to another key's name: the tag covers the name too
  a, b = diskcache.key("t", "a"), diskcache.key("t", "b")
  diskcache.store("t", a, b"payload of a")
  diskcache.path_of("t", b).write_bytes(diskcache.path_of("t", a).read_bytes())
  assert diskcache.load("t", b) is None and not diskcache.path_of("t", b).exists()
  diskcache.store_text("0" * 32, "X = 1\n")
  (cache / f"{'1' * 32}.py").write_bytes((cache / f"{'0' * 32}.py").read_bytes())
  assert diskcache.load_text("1" * 32) is None and diskcache.load_text("0" * 32) == "X = 1\n"


def _child(cache: Path, c: float, timeout: float = 120, **env) -> tuple[dict, str]:
  out = subprocess.run([sys.executable, "-c", CHILD, repr(c)], capture_output=True, text=True, timeout=timeout,
                       env=subprocess_env(RULEC_CACHE_DIR=str(cache), **env))
  assert out.returncode == 0, out.stderr[-3000:]
  return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def test_planted_kernels_with_recomputed_checksums_are_rebuilt(tmp_path):
  # each object entry gets another kernel's object code (which would run the wrong kernel, or crash), under a
  # header whose checksum is recomputed: in the format the cache used to trust, and in today's with a sha256
  # where the tag belongs; each is rejected and compiled again, with right values
  c = 1.0 + random.random()
  first, _ = _child(tmp_path, c)
  objs = entries(tmp_path)
  n = len(objs)
  assert first["ok"] and n >= 2
  payloads = [p.read_bytes().partition(b"\n")[2] for p in objs]
  for k, p in enumerate(objs):
    other = payloads[(k + 1) % n]
    sha = hashlib.sha256(other).hexdigest()
    version = 1 if k % 2 == 0 else diskcache.FORMAT
    p.write_bytes(f"rulec-kernel {version} {p.stem} {sha} {len(other)}\n".encode() + other)
  second, _ = _child(tmp_path, c)
  assert second["ok"] and second["compiled"] == n and second["loaded"] == 0 and second["stats"]["rejected"] == n
  assert all(diskcache.load_path(p) not in (None, payloads[(k + 1) % n]) for k, p in enumerate(objs))   # rulec's own again


# *** the directory: ownership, mode, the key file ***

@pytest.mark.parametrize("mode", [0o777, 0o770, 0o703, 0o1777])
def test_a_directory_others_can_write_is_not_used(tmp_path, mode):
  d = tmp_path / "shared"
  d.mkdir()
  d.chmod(mode)
  c = 2.0 + random.random()
  got, err = _child(d, c)
  assert got["ok"] and got["compiled"] >= 2 and got["stats"]["writes"] == 0 and got["stats"]["hits"] == 0
  warnings = [line for line in err.splitlines() if "not using the cache directory" in line]
  assert len(warnings) == 1 and str(d) in warnings[0] and "writable by" in warnings[0], err[-2000:]
  assert list(d.iterdir()) == []                          # nothing read, nothing written: no key, no entry
  got, err = _child(d, c)
  assert got["ok"] and got["compiled"] >= 2 and got["stats"]["hits"] == 0


def test_a_directory_of_another_user_is_not_used(tmp_path, cache, monkeypatch, capsys):
  rules, marker = _rules(tmp_path), tmp_path / "PWNED"
  key = _matcher_key(rules, tmp_path, monkeypatch)
  monkeypatch.setenv("RULEC_CACHE_DIR", str(cache))
  _works(rules)
  capsys.readouterr()
  # the same directory, seen by a process of another uid (root too: no uid is exempt)
  monkeypatch.setattr(os, "getuid", lambda: os.stat(cache).st_uid + 1)
  (cache / f"{key}.py").write_text(_old_style(key, _evil_matcher(marker)))
  before = sorted(p.name for p in cache.rglob("*"))
  _works(rules)
  digest = diskcache.key("t", "x")
  diskcache.store("t", digest, b"abc")
  assert diskcache.load("t", digest) is None
  assert not marker.exists() and sorted(p.name for p in cache.rglob("*")) == before
  err = capsys.readouterr().err
  assert err.count("not using the cache directory") == 1 and "owned by uid" in err, err


@pytest.mark.parametrize("damage", ["group-readable", "link", "short", "fifo"])
def test_a_key_file_that_is_not_the_users_own_refuses_the_cache(cache, damage, capsys, tmp_path):
  digest = diskcache.key("t", "x")
  diskcache.store("t", digest, b"abc")
  key_file = cache / diskcache.KEY_FILE
  assert stat.S_IMODE(key_file.stat().st_mode) == 0o600 and key_file.stat().st_size == diskcache.KEY_BYTES
  assert stat.S_IMODE(cache.stat().st_mode) == 0o700
  diskcache._keys.clear()   # as a new process would: the key is read again
  if damage == "group-readable": key_file.chmod(0o640)
  elif damage == "link":
    (tmp_path / "known").write_bytes(b"k" * diskcache.KEY_BYTES)
    key_file.unlink()
    key_file.symlink_to(tmp_path / "known")
  elif damage == "short": key_file.write_bytes(b"k")
  else:
    key_file.unlink()
    os.mkfifo(key_file, 0o600)
  capsys.readouterr()
  assert diskcache.load("t", digest) is None
  err = capsys.readouterr().err
  assert err.count("not using the cache directory") == 1 and "key file" in err, err
  assert (cache / "kernels" / "t" / f"{digest}.bin").exists()   # refused, not cleared


# *** where the cache is ***

@pytest.mark.parametrize("xdg", ["", "relative/path"])
def test_an_empty_or_relative_XDG_CACHE_HOME_is_ignored(tmp_path, monkeypatch, xdg):
  rules, marker = _rules(tmp_path), tmp_path / "PWNED"
  key = _matcher_key(rules, tmp_path, monkeypatch)
  work, home = tmp_path / "work", tmp_path / "home"
  work.mkdir()
  home.mkdir(mode=0o700)
  # a repository that ships the entry where a relative cache root would put it
  for planted in (work / "rulec", work / xdg / "rulec"):
    planted.mkdir(parents=True, exist_ok=True, mode=0o700)
    (planted / f"{key}.py").write_text(_old_style(key, _evil_matcher(marker)))
  monkeypatch.chdir(work)
  monkeypatch.delenv("RULEC_CACHE_DIR")
  monkeypatch.setenv("XDG_CACHE_HOME", xdg)
  monkeypatch.setenv("HOME", str(home))
  assert diskcache.cache_dir() == home / ".cache" / "rulec"
  _works(rules)
  assert not marker.exists()
  assert (home / ".cache" / "rulec" / f"{key}.py").exists()


def test_a_relative_RULEC_CACHE_DIR_is_made_absolute_and_still_checked(tmp_path, monkeypatch, capsys):
  monkeypatch.chdir(tmp_path)
  monkeypatch.setenv("RULEC_CACHE_DIR", "mine")
  assert diskcache.cache_dir() == tmp_path / "mine"
  digest = diskcache.key("t", "x")
  diskcache.store("t", digest, b"abc")
  assert diskcache.load("t", digest) == b"abc" and stat.S_IMODE((tmp_path / "mine").stat().st_mode) == 0o700
  (tmp_path / "open").mkdir()
  (tmp_path / "open").chmod(0o777)
  monkeypatch.setenv("RULEC_CACHE_DIR", "open")
  capsys.readouterr()
  diskcache.store("t", digest, b"abc")
  assert diskcache.load("t", digest) is None and list((tmp_path / "open").iterdir()) == []
  assert "not using the cache directory" in capsys.readouterr().err


# *** entries that are not regular files ***

def test_fifos_and_links_to_dev_zero_as_entries_neither_hang_nor_read(tmp_path):
  c = 3.0 + random.random()
  first = tmp_path / "first"
  got, _ = _child(first, c)
  assert got["ok"]
  names = sorted(str(p.relative_to(first)) for p in first.rglob("*")
                 if p.is_file() and p.name != diskcache.KEY_FILE)
  assert any(n.endswith(".py") for n in names) and any(n.endswith(".bin") for n in names)
  trap = tmp_path / "trap"
  trap.mkdir(mode=0o700)
  for k, name in enumerate(names):
    p = trap / name
    p.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if k % 2: os.mkfifo(p, 0o600)
    else: p.symlink_to("/dev/zero")
  # the hang guard: a FIFO opened for reading waits for a writer forever; /dev/zero never ends
  got, _ = _child(trap, c, timeout=180)
  assert got["ok"] and got["loaded"] == 0 and got["stats"]["hits"] == 0
  for name in names:   # each replaced by rulec's own entry (a link replaced, its target untouched)
    st = os.lstat(trap / name)
    assert stat.S_ISREG(st.st_mode), name
  assert (trap / "kernels").is_dir() and Path("/dev/zero").is_char_device()


def test_reads_stop_at_the_cap(tmp_path, monkeypatch):
  monkeypatch.setattr(diskcache, "MAX_BYTES", {**diskcache.MAX_BYTES, ".bin": 1000})
  monkeypatch.setenv("RULEC_CACHE_DIR", str(tmp_path / "c"))
  digest = diskcache.key("t", "big")
  diskcache.store("t", digest, b"x" * 2000)                 # over the cap: not written
  assert diskcache.path_of("t", digest).exists() is False
  with pytest.raises(diskcache.Refused) as e: diskcache.read_regular("/proc/self/environ", 10)   # fstat says 0
  assert e.value.what == "too large"
  big = tmp_path / "sparse"
  with open(big, "wb") as f: f.truncate(1 << 33)
  with pytest.raises(diskcache.Refused) as e: diskcache.read_regular(big, 1 << 20)
  assert e.value.size == 1 << 33


# *** matcher code entries (the marshalled bytecode kept beside a matcher's text) ***

def _evil_code(marker: Path):
  return compile(_evil_matcher(marker), "<rulec s>", "exec")


@pytest.mark.parametrize("how", ["forged tag", "another entry's code", "garbage with a sound tag"])
def test_a_planted_code_entry_never_runs(tmp_path, cache, monkeypatch, how):
  import marshal
  rules, marker = _rules(tmp_path), tmp_path / "PWNED"
  key = _matcher_key(rules, tmp_path, monkeypatch)
  monkeypatch.setenv("RULEC_CACHE_DIR", str(cache))
  _works(rules)   # rulec's own text and code entries (and key) first
  (code_path,) = cache.glob("*.code")
  if how == "forged tag":
    body = marshal.dumps(_evil_code(marker))
    code_path.write_bytes(f"# rulec-cache code={code_path.stem} hmac={'ab' * 32}\n".encode() + body)
  elif how == "another entry's code":
    # rulec's own code entry for another name, tag and all, moved over this one: the tag covers the name
    other = "0" * 32
    diskcache.store_code(other, _evil_code(marker))
    code_path.write_bytes(next(p for p in cache.glob("*.code") if p != code_path).read_bytes())
  else:
    # a sound tag over bytes that are no code object (as if rulec had written them): refused, never exec'd
    got = diskcache._root()
    body = marshal.dumps({"not": "code"})
    code_path.write_bytes(diskcache._code_head(got[1], code_path.stem, body) + b"\n" + body)
  _works(rules)
  assert not marker.exists(), "a planted code entry ran"
  assert diskcache.load_code(key) is not None   # rebuilt, and sound


def test_a_matcher_loaded_twice_compiles_its_source_once(tmp_path, cache, monkeypatch):
  """The second process (a new library) takes the kept bytecode: Python's compile is not called again."""
  from rulec.engine.lang import loader
  rules = _rules(tmp_path)
  _works(rules)
  assert len(list(cache.glob("*.code"))) == 1
  def refuse(*a, **k): raise AssertionError("compiled the matcher's source again")
  monkeypatch.setattr(loader, "compile", refuse, raising=False)
  _works(rules)
