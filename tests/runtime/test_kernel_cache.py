"""The compiled-kernel cache on disk (engine/diskcache.py): entries that fail any check are misses; a second
process loads what the first compiled and compiles nothing; damaged entries are rebuilt (with right results) and
written again; another CPU target never loads them; RULEC_KERNEL_CACHE=0 turns it all off.

Loading a CPU program twice in one process would put one symbol into the JIT twice, so whatever loads CPU code
from disk runs in child processes; each uses constants of its own, so that no other test shares its kernels."""
import json
import random
import subprocess
import sys

import numpy as np
import pytest

from rulec.engine import diskcache
from tests.helpers import subprocess_env

# a softmax (max, exp-sum, divide) and an elementwise kernel; C makes their IR this test's own
CHILD = """
import json, sys
import numpy as np
from rulec.engine.tensor import Tensor
from rulec.engine import diskcache
from rulec.runtime import cpu_device
c = float(sys.argv[1])
x = np.linspace(-4, 4, 32 * 48, dtype=np.float32).reshape(32, 48)
t = Tensor(x, device="CPU")
got = (t * c).softmax(-1).numpy(), (t * c + 1.5).numpy(), (t * c).max(0).numpy(), (t - c).sum(1).numpy()
e = np.exp(x * np.float32(c) - (x * np.float32(c)).max(-1, keepdims=True))
ok = np.allclose(got[0], e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7) and np.array_equal(got[1], x * np.float32(c) + 1.5)
ok = ok and np.array_equal(got[2], (x * np.float32(c)).max(0)) and np.allclose(got[3], (x - np.float32(c)).sum(1), rtol=1e-5)
print(json.dumps({**cpu_device.COUNTERS, "stats": diskcache.STATS, "ok": bool(ok)}))
"""


def child(cache, c: float, **env) -> dict:
  out = subprocess.run([sys.executable, "-c", CHILD, repr(c)], capture_output=True, text=True, timeout=120,
                       env=subprocess_env(RULEC_CACHE_DIR=str(cache), **env))
  assert out.returncode == 0, out.stderr
  return json.loads(out.stdout.strip().splitlines()[-1])


def entries(cache, device="cpu", suffix=".bin"):
  d = cache / "kernels" / device
  return sorted(d.glob(f"*{suffix}")) if d.is_dir() else []


@pytest.fixture
def fresh(tmp_path, monkeypatch):
  monkeypatch.setenv("RULEC_CACHE_DIR", str(tmp_path))
  monkeypatch.delenv("RULEC_KERNEL_CACHE", raising=False)
  return tmp_path


def test_entries_that_fail_a_check_are_misses(fresh):
  digest, other = diskcache.key("t", "source a"), diskcache.key("t", "source b")
  assert digest != other and diskcache.key("ab", "c") != diskcache.key("a", "bc")
  assert diskcache.load("t", digest) is None
  payload = bytes(range(256)) * 4
  diskcache.store("t", digest, payload)
  path = diskcache.path_of("t", digest)
  assert path.parent == fresh / "kernels" / "t" and diskcache.load("t", digest) == payload
  assert [p.name for p in path.parent.iterdir()] == [path.name]   # the temporary file was renamed into place
  good = path.read_bytes()
  head, _, body = good.partition(b"\n")
  damaged = {"truncated": good[:-1], "header only": head, "empty": b"", "garbage": b"\x7fELF" + payload,
             "flipped byte": good[:-9] + bytes([good[-9] ^ 1]) + good[-8:],
             "another key": head.replace(digest.encode(), other.encode()) + b"\n" + body,
             "longer": good + b"\0"}
  for why, data in damaged.items():
    path.write_bytes(data)
    before = diskcache.STATS["rejected"]
    assert diskcache.load("t", digest) is None, why
    assert diskcache.STATS["rejected"] == before + 1, why
  diskcache.store("t", digest, payload)   # rewritten whole
  assert diskcache.load("t", digest) == payload


def test_off_reads_and_writes_nothing(fresh, monkeypatch):
  digest = diskcache.key("t", "x")
  diskcache.store("t", digest, b"abc")
  monkeypatch.setenv("RULEC_KERNEL_CACHE", "0")
  assert not diskcache.enabled() and diskcache.load("t", digest) is None
  diskcache.store("t", diskcache.key("t", "y"), b"abc")
  assert len(list((fresh / "kernels" / "t").iterdir())) == 1
  # a CPU kernel compiled with the cache off leaves nothing on disk
  from rulec.engine.tensor import Tensor
  from rulec.runtime import cpu_device
  before = cpu_device.COUNTERS["compiled"]
  Tensor(np.ones(7, np.float32), device="CPU").__mul__(random.random() + 3.0).numpy()
  assert cpu_device.COUNTERS["compiled"] == before + 1 and entries(fresh) == []


def test_a_second_process_compiles_nothing(tmp_path):
  c = 1.0 + random.random()
  first = child(tmp_path, c)
  n = first["compiled"]
  assert first["ok"] and n >= 2 and first["loaded"] == 0
  assert len(entries(tmp_path)) == n and len(entries(tmp_path, suffix=".kernel")) == n   # object code; kernel -> object
  second = child(tmp_path, c)
  # (the worker threads' native loop and trampolines are kept too, under their own kind: hits, not kernels)
  runtime = len(entries(tmp_path, "cpu-runtime"))
  assert second["ok"] and second["compiled"] == 0 and second["loaded"] == n and second["stats"]["hits"] == 2 * n + runtime
  # damage three objects three ways, and a kernel entry: each object is rebuilt (right results) and written again;
  # the kernel entry costs a rendering only, its object still loads
  a, b, d = entries(tmp_path)[:3]
  a.write_bytes(a.read_bytes()[:-100])
  data = bytearray(b.read_bytes())
  data[-50] ^= 0xff
  b.write_bytes(bytes(data))
  head, _, body = d.read_bytes().partition(b"\n")
  d.write_bytes(head.replace(d.stem.encode(), a.stem.encode()) + b"\n" + body)
  kernel_entries = entries(tmp_path, suffix=".kernel")
  names = {json.loads(diskcache.load_path(k))["object"] for k in kernel_entries}
  e = next(k for k in kernel_entries if json.loads(diskcache.load_path(k))["object"] not in {a.stem, b.stem, d.stem})
  e.write_bytes(e.read_bytes()[:-1])
  third = child(tmp_path, c)
  assert third["ok"] and third["compiled"] == 3 and third["loaded"] == n - 3 and third["stats"]["rejected"] == 4
  assert names == {p.stem for p in entries(tmp_path)}
  for p in (a, b, d, e): assert diskcache.load_path(p) is not None
  # another CPU target (no optional instructions) keys its own entries: never the host's code
  base = child(tmp_path, c, RULEC_CPU_TARGET="baseline")
  assert base["ok"] and base["compiled"] == n and base["loaded"] == 0 and len(entries(tmp_path)) == 2 * n


def test_cl_binaries_are_kept_and_checked(fresh, monkeypatch, cl_dev):
  from rulec.engine.tensor import Tensor
  from rulec.runtime import cl_device
  dev = cl_dev
  monkeypatch.setattr(cl_device, "_unsaved", [])   # programs other tests built are not this test's to write
  monkeypatch.setattr(dev, "fetch_s", 1.0)         # a driver slow to hand out binaries (PoCL): fetched later
  c = 2.0 + random.random()
  x = np.arange(37, dtype=np.float32)
  def run(k: float = c) -> np.ndarray: return (Tensor(x, device="CL") * k - 0.5).numpy()
  known = set(cl_device._programs), set(cl_device._by_ast)
  def forget():   # as a new process would start: this test's programs no longer in memory
    for table, keep in zip((cl_device._programs, cl_device._by_ast), known):
      for k in set(table) - keep: del table[k]
  c0 = dict(cl_device.COUNTERS)
  want = x * np.float32(c) - np.float32(0.5)
  assert np.array_equal(run(), want) and cl_device.COUNTERS["compiled"] == c0["compiled"] + 1
  assert entries(fresh, "cl") == []   # not before the first launch
  assert cl_device.save_binaries() == 1
  (entry,) = entries(fresh, "cl")
  forget()
  assert np.array_equal(run(), want) and cl_device.COUNTERS["loaded"] == c0["loaded"] + 1
  assert cl_device.COUNTERS["compiled"] == c0["compiled"] + 1
  entry.write_bytes(entry.read_bytes()[:-1])   # truncated: built from source again, and written again
  forget()
  assert np.array_equal(run(), want) and cl_device.COUNTERS["compiled"] == c0["compiled"] + 2
  assert cl_device.save_binaries() == 1 and diskcache.load_path(entry) is not None
  # a driver quick to hand them out (a GPU's) gets each binary written right after its build
  monkeypatch.setattr(dev, "fetch_s", 0.0)
  run(c + 1)
  assert len(entries(fresh, "cl")) == 2 and cl_device._unsaved == []
