"""The CPU device's LLVM build workers (runtime/llvm_build.py, cpu_device.prepare): a realize's new kernels are
lowered here and built by worker processes, with the same programs and values as one at a time, and every failure
falls back to building in this process. Counted (objects built by workers, programs compiled), never timed."""
from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest

from rulec import Tensor
from rulec.runtime import cpu_device, llvm_build


@pytest.fixture
def fresh(monkeypatch, tmp_path):
  """An empty disk cache and no program of this process known, so every kernel is compiled again."""
  monkeypatch.setenv("RULEC_CACHE_DIR", str(tmp_path))
  monkeypatch.setattr(cpu_device, "_by_ast", {})
  monkeypatch.setattr(cpu_device, "_by_digest", {})
  return monkeypatch


def _program(seed: float):
  """Several kernels no other test builds (the constant `seed` is in every one of them)."""
  rng = np.random.default_rng(0)
  a, b = rng.standard_normal((24, 40), dtype=np.float32), rng.standard_normal((40, 16), dtype=np.float32)
  x, w = Tensor(a).realize(), Tensor(b).realize()
  h = (x @ w * seed).relu()
  out = [(h - h.mean(1, keepdim=True)).exp().sum(0), (h @ h.T + seed).max(1), (x.sin() * seed).T.contiguous()]
  m = np.maximum(a @ b * seed, 0)
  want = [np.exp(m - m.mean(1, keepdims=True)).sum(0), (m @ m.T + seed).max(1), (np.sin(a) * seed).T]
  return out, want


def _check(out, want):
  out[0].realize(*out[1:])
  got = [t.numpy() for t in out]
  for g, w in zip(got, want): np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


def test_workers_build_a_realizes_new_kernels(fresh):
  fresh.setenv("RULEC_COMPILE_WORKERS", "1")
  built = []
  prepare = cpu_device.prepare
  fresh.setattr(cpu_device, "prepare", lambda ks: built.append(prepare(ks)) or built[-1])
  compiled = cpu_device.COUNTERS["compiled"]
  _check(*_program(1.25))
  assert sum(built) >= 2   # (each new kernel's object came from a worker)
  assert cpu_device.COUNTERS["compiled"] - compiled == sum(built)   # (and none was compiled again when it ran)


def test_the_same_programs_as_one_at_a_time(fresh, tmp_path):
  """prepare renders the programs compile_kernel would, and a worker's object is the bytes this process builds."""
  from rulec.engine import diskcache
  fresh.setenv("RULEC_COMPILE_WORKERS", "1")
  _check(*_program(1.5))
  digests = set(cpu_device._by_digest)
  objects = {d: diskcache.load("cpu", d) for d in digests}
  assert all(objects.values())
  fresh.setattr(cpu_device, "_by_ast", {})
  fresh.setattr(cpu_device, "_by_digest", {})
  fresh.setenv("RULEC_COMPILE_WORKERS", "0")
  fresh.setenv("RULEC_CACHE_DIR", tempfile.mkdtemp(dir=tmp_path))
  _check(*_program(1.5))
  assert set(cpu_device._by_digest) == digests
  assert {d: diskcache.load("cpu", d) for d in digests} == objects


def test_a_failing_worker_leaves_the_build_to_this_process(fresh):
  fresh.setenv("RULEC_COMPILE_WORKERS", "1")

  class Broken:
    def submit(self, text):
      from concurrent.futures import Future
      f = Future()
      f.set_exception(RuntimeError("the LLVM build worker exited"))
      return f
  fresh.setattr(cpu_device, "_builders", Broken())
  compiled = cpu_device.COUNTERS["compiled"]
  assert cpu_device.prepare([]) == 0
  _check(*_program(1.75))
  assert cpu_device.COUNTERS["compiled"] > compiled


def test_builders_report_errors_and_exits():
  cpu, features = cpu_device._jit() and cpu_device._target
  b = llvm_build.Builders(1, cpu, features)
  try:
    ok = b.submit('define void @f() {\n  ret void\n}\n')
    bad = b.submit("this is not LLVM IR")
    seconds, obj = ok.result(timeout=120)
    assert seconds >= 0 and len(obj) > 0
    with pytest.raises(RuntimeError, match="RuntimeError|error|expected"): bad.result(timeout=120)
    b._workers[0]["proc"].kill()
    late = b.submit('define void @g() {\n  ret void\n}\n')
    with pytest.raises(RuntimeError): late.result(timeout=120)
  finally: b.close()


@pytest.mark.skipif(not hasattr(os, "fork") or not os.path.exists("/proc/self/stat"), reason="forks and reads /proc")
def test_a_forked_child_starts_workers_of_its_own(fresh):
  """A child forked after the workers started (a data loader's) must not wait on the parent's pipes."""
  fresh.setenv("RULEC_COMPILE_WORKERS", "1")
  _check(*_program(2.25))
  assert cpu_device._builders
  pid = os.fork()
  if pid == 0:   # (the child: new kernels, built through workers of its own; exit status says how it went)
    try:
      cpu_device._by_ast.clear()
      cpu_device._by_digest.clear()
      os.environ["RULEC_CACHE_DIR"] = tempfile.mkdtemp()
      _check(*_program(2.5))
      worker = cpu_device._builders._workers[0]["proc"].pid
      with open(f"/proc/{worker}/stat") as f: parent = int(f.read().rsplit(")", 1)[1].split()[1])
      os._exit(0 if parent == os.getpid() else 3)   # (its builds went to a worker it started)
    except BaseException:
      os._exit(1)
  _, status = os.waitpid(pid, 0)
  assert os.waitstatus_to_exitcode(status) == 0


def test_a_small_first_realize_builds_here_without_starting_workers(fresh):
  # (starting the workers costs more than building two or three small kernels: the README's snippet)
  fresh.setenv("RULEC_COMPILE_WORKERS", "1")
  fresh.setattr(cpu_device, "_builders", None)
  x = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3) / 7.25).realize()
  built = []
  prepare = cpu_device.prepare
  fresh.setattr(cpu_device, "prepare", lambda ks: built.append(prepare(ks)) or built[-1])
  got = (x @ x.T).relu().softmax(-1).numpy()
  a = x.numpy() @ x.numpy().T
  want = np.exp(a - a.max(1, keepdims=True))
  np.testing.assert_allclose(got, want / want.sum(1, keepdims=True), rtol=1e-5)
  assert built and sum(built) == 0 and cpu_device._builders is None
