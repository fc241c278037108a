"""The scheduler holds Python's cyclic garbage collector off while it runs (engine/sched/driver.py collector_held):
no collection happens inside a schedule, the collector's state comes back after (on if it was on, off if it was
off, also after a schedule that raised), and a schedule leaves no cyclic garbage behind for it to find."""
from __future__ import annotations

import gc

import numpy as np
import pytest

from rulec.engine.sched import cache as schedule_cache
from rulec.engine.sched import driver
from rulec.engine.tensor import Tensor


def _program():
  x, w = Tensor(np.ones((8, 16), np.float32)), Tensor(np.ones((16, 16), np.float32))
  y = x
  for _ in range(30): y = (y @ w).relu() * 0.01 + y.mean(axis=1, keepdim=True)
  return y.sum()


@pytest.fixture
def collections():
  seen = []
  def count(phase, info):
    if phase == "start": seen.append(info["generation"])
  gc.callbacks.append(count)
  yield seen
  gc.callbacks.remove(count)


def test_no_collection_runs_inside_a_schedule_and_the_collector_is_back_on(collections):
  assert gc.isenabled()
  out = _program()
  schedule_cache.clear()
  held = []
  real = driver._schedule_keeping
  def spy(*a, **k):   # (inside: the collector is off, and allocating a lot starts no collection)
    held.append(gc.isenabled())
    junk = [[i] for i in range(50_000)]
    held.append(len(collections))
    del junk
    return real(*a, **k)
  driver._schedule_keeping = spy
  try:
    before = len(collections)
    kernels = Tensor.schedule(out)
  finally: driver._schedule_keeping = real
  assert kernels and held == [False, before]
  assert gc.isenabled()


def test_a_collector_turned_off_by_the_user_stays_off():
  gc.disable()
  try:
    schedule_cache.clear()
    Tensor.schedule(_program())
    assert not gc.isenabled()
  finally: gc.enable()


def test_the_collector_comes_back_after_a_schedule_that_raised():
  real = driver._schedule_keeping
  def fail(*a, **k): raise RuntimeError("a rule failed")
  driver._schedule_keeping = fail
  try:
    schedule_cache.clear()
    with pytest.raises(RuntimeError): Tensor.schedule(_program())
  finally: driver._schedule_keeping = real
  assert gc.isenabled() and driver._PAUSED[0] == 0


def test_a_schedule_leaves_no_cyclic_garbage():
  gc.collect()
  out = _program()
  schedule_cache.clear()
  Tensor.schedule(out)
  assert gc.collect() == 0
