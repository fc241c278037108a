"""The CPU device's worker threads (runtime/cpu_workers.py): launches split across threads give the values one
thread gives, whatever the number of threads or buffers, after any pause, and in a forked child."""
from __future__ import annotations

import ctypes
import multiprocessing
import time

import numpy as np
import pytest

from rulec.engine.tensor import Tensor
from rulec.runtime import cpu_device, cpu_workers
from rulec.runtime.buffer import host_array


def _native():
  return cpu_workers.workers(cpu_device._native_helpers).native


def test_wait_and_publish():
  native = _native()
  cell = host_array(8, np.dtype(np.int64), zero=True)
  p = cell.ctypes.data
  # the budget is a count of the clock's ticks, capped at SPIN_MAX_S of them (counted, not timed: a busy machine
  # stretches the wall time, not the budget)
  budget = native.budget(0.001)
  assert 0 < budget <= cpu_workers.SPIN_MAX_S * native.per_second
  t0 = time.monotonic()
  assert native.wait(p, 0, budget) == 0                            # nothing changes: returns after its budget
  assert time.monotonic() - t0 < 60                                 # (a hang guard only)
  native.publish(p, 41)
  assert cell[0] == 41 and native.wait(p, 0, 10 ** 12) == 41      # changed: returns at once, with the value
  assert native.per_second > 0


@pytest.mark.parametrize("nthreads", [2, 3, 4, 7])
def test_split_launch_matches_numpy(monkeypatch, nthreads):
  monkeypatch.setenv("RULEC_THREADS", str(nthreads))
  rng = np.random.default_rng(nthreads)
  a = rng.standard_normal((300, 257)).astype(np.float32)
  b = rng.standard_normal((257, 129)).astype(np.float32)
  for _ in range(3):
    np.testing.assert_allclose((Tensor(a) @ Tensor(b)).numpy(), a @ b, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal((Tensor(a) * 2 + 1).numpy(), a * 2 + 1)


@pytest.mark.parametrize("nbufs", [1, 2, 9, 23, 40])
def test_kernels_of_many_buffers(monkeypatch, nbufs):
  # each count of buffers has its own trampoline: the workers' half of the rows must see every input
  monkeypatch.setenv("RULEC_THREADS", "2")
  rng = np.random.default_rng(nbufs)
  arrays = [rng.standard_normal((256, 300)).astype(np.float32) for _ in range(nbufs)]
  total = Tensor(arrays[0])
  for k, x in enumerate(arrays[1:]): total = total + Tensor(x) * (k + 2)
  want = arrays[0].astype(np.float64) + sum(x.astype(np.float64) * (k + 2) for k, x in enumerate(arrays[1:]))
  np.testing.assert_allclose(total.numpy(), want, rtol=1e-4, atol=1e-3)


def test_launches_after_pauses_around_the_polling_limits(monkeypatch):
  # a worker polls at least SPIN_MIN_S and at most SPIN_MAX_S before it sleeps: a launch just before, at or
  # after either must still be seen (no lost wake-up), with the right values
  monkeypatch.setenv("RULEC_THREADS", "2")
  a = np.arange(512 * 512, dtype=np.float32).reshape(512, 512)
  for pause in (0, 0.0003, 0.0005, 0.0007, 0.002, 0.019, 0.021, 0.05):
    time.sleep(pause)
    np.testing.assert_array_equal((Tensor(a) - 3).numpy(), a - 3)


def _child(q):
  a = np.arange(512 * 512, dtype=np.float32).reshape(512, 512)
  q.put(float(np.abs((Tensor(a) * 3).numpy() - a * 3).max()))


def test_forked_child_makes_its_own_workers(monkeypatch):
  monkeypatch.setenv("RULEC_THREADS", "2")
  a = np.ones((512, 512), np.float32)
  (Tensor(a) + 1).numpy()   # this process's workers exist before the fork
  ctx = multiprocessing.get_context("fork")
  q = ctx.Queue()
  p = ctx.Process(target=_child, args=(q,))
  p.start()
  got = q.get(timeout=60)
  p.join(timeout=60)
  assert p.exitcode == 0 and got == 0.0


def test_more_workers_replace_fewer(monkeypatch):
  w = cpu_workers.workers(cpu_device._native_helpers)
  a = np.arange(600 * 300, dtype=np.float32).reshape(600, 300)
  for n in (2, 5, 3, 6):
    monkeypatch.setenv("RULEC_THREADS", str(n))
    np.testing.assert_array_equal((Tensor(a) * 0.5).numpy(), a * 0.5)
  assert len(w.threads) >= 5 and all(t.is_alive() for t in w.threads)


def test_a_failing_call_on_the_caller_still_waits_for_the_workers(monkeypatch):
  # the caller's own call raising (ctypes refusing its arguments) must not return while workers write
  w = cpu_workers.workers(cpu_device._native_helpers)
  out = host_array(4096, np.dtype(np.float32), zero=True)
  calls = []
  proto = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)

  @proto
  def never(*_): calls.append(1)   # (a Python callback: only the worker's native loop calls it, through ctypes)

  with pytest.raises(ctypes.ArgumentError):
    w.run(never, [(object(), 0, 1), (out.ctypes.data, 1, 2)])
  assert calls == [1]


def test_many_launches_with_random_pauses_and_thread_counts(monkeypatch):
  # the claim (a sleeping worker's call made by the caller instead), the sleep and the wake-up race each other at
  # every pause length; every launch must still give the one-thread values
  rng = np.random.default_rng(11)
  a = rng.standard_normal((300, 300)).astype(np.float32)
  b = rng.standard_normal((300, 64)).astype(np.float32)
  for i in range(60):
    monkeypatch.setenv("RULEC_THREADS", str(int(rng.integers(2, 5))))
    time.sleep(float(rng.choice([0, 0, 1e-5, 2e-4, 6e-4, 3e-3])))
    if i % 2: np.testing.assert_allclose((Tensor(a) @ Tensor(b)).numpy(), a @ b, rtol=1e-4, atol=1e-4)
    else: np.testing.assert_array_equal((Tensor(a) * (i + 1)).numpy(), a * (i + 1))


def test_launches_from_several_python_threads_at_once(monkeypatch):
  # the slots belong to one launch at a time: a second thread's launch runs on its own thread meanwhile
  import threading
  monkeypatch.setenv("RULEC_THREADS", "2")
  rng = np.random.default_rng(4)
  mats = [rng.standard_normal((256, 256)).astype(np.float32) for _ in range(4)]
  errors = []
  def worker(j):
    try:
      for i in range(15):
        a, b = mats[j], mats[(j + i) % 4]
        np.testing.assert_allclose((Tensor(a) @ Tensor(b)).numpy(), a @ b, rtol=1e-4, atol=1e-4)
        np.testing.assert_array_equal((Tensor(a) * (i + j)).numpy(), a * (i + j))
    except BaseException as e: errors.append(e)
  threads = [threading.Thread(target=worker, args=(j,)) for j in range(4)]
  for t in threads: t.start()
  for t in threads: t.join(timeout=120)
  assert not any(t.is_alive() for t in threads), "a launch hung (two threads' calls in one slot)"
  assert not errors, errors[0]
