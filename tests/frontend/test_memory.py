"""A loop that realizes over and over runs in constant memory (#32 item 6).

Each realized value keeps the graph it was computed from for autograd (engine/tensor/history.py), and that graph
holds the value before it: without pruning, `x = (x * 0.5 + 1).realize()` a hundred times kept a hundred buffers.
Counted two ways: the BUFFER nodes alive after a gc (exact), and the process's resident memory (4 MiB a step)."""
from __future__ import annotations

import gc
import os

import numpy as np
import pytest

import rulec
from rulec import Tensor
from rulec.engine.ir.ops import Ops
from rulec.engine.ir.uop import UOp
from rulec.engine.tensor import history

N = 1024


def live_buffers() -> int:
  gc.collect()
  return sum(1 for o in gc.get_objects() if type(o) is UOp and o.op is Ops.BUFFER)


def rss_mib() -> float:
  with open("/proc/self/statm") as f: return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def plain(x): return (x * 0.5 + 1.0).realize()
def detached(x): return (x * 0.5 + 1.0).detach().realize()
def through_numpy(x): return Tensor((x * 0.5 + 1.0).numpy())


@pytest.mark.parametrize("step", [plain, detached, through_numpy])
@pytest.mark.parametrize("mode", ["grad", "no_grad", "no_schedule_cache"])
def test_a_realize_loop_keeps_a_constant_number_of_buffers(step, mode, monkeypatch):
  if mode == "no_schedule_cache": monkeypatch.setenv("RULEC_SCHEDULE_CACHE", "0")
  ctx = rulec.no_grad() if mode == "no_grad" else _nothing()
  with ctx:
    x = Tensor(np.zeros((N, N), np.float32)).realize()
    for _ in range(5): x = step(x)
    base_bufs, base_rss = live_buffers(), rss_mib()
    for _ in range(100): x = step(x)
    bufs, rss = live_buffers(), rss_mib()
  assert bufs <= base_bufs + 20, (base_bufs, bufs)
  assert rss - base_rss < 100, f"resident memory grew {rss - base_rss:.0f} MiB over 100 steps of 4 MiB"
  np.testing.assert_allclose(x.numpy()[0, :3], [2.0, 2.0, 2.0], rtol=1e-6)


def test_a_loop_with_a_live_weight_still_differentiates_through_what_it_realized():
  # histories that reach a live tensor are kept, so the gradient through a realized chain is the whole chain's
  w = Tensor([0.5, 2.0])
  x = Tensor([1.0, 3.0]).realize()
  for _ in range(40): x = (x * w).realize()
  g, = x.sum().gradient(w)
  np.testing.assert_allclose(g.numpy(), 40 * np.array([0.5, 2.0]) ** 39 * [1.0, 3.0], rtol=1e-5)


def test_pruning_drops_only_histories_that_reach_no_live_tensor():
  a = Tensor([1.0, 2.0])
  b = (a * 3).realize()          # reaches a (live)
  c = Tensor([4.0, 5.0])
  d = (c * 2).realize()          # reaches c
  del c
  history.prune(history.live_values())
  assert history.history(b.uop) is not None and history.history(d.uop) is None
  np.testing.assert_allclose((b * b).sum().gradient(a)[0].numpy(), [18.0, 36.0])


class _nothing:
  def __enter__(self): return self
  def __exit__(self, *a): return False
