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


def test_a_loop_with_a_weight_that_requires_grad_differentiates_through_the_whole_chain():
  # histories that lead a gradient to a tensor that requires one are kept whole (backpropagation through time)
  w = Tensor([0.5, 2.0], requires_grad=True)
  x = Tensor([1.0, 3.0]).realize()
  for _ in range(40): x = (x * w).realize()
  g, = x.sum().gradient(w)
  np.testing.assert_allclose(g.numpy(), 40 * np.array([0.5, 2.0]) ** 39 * [1.0, 3.0], rtol=1e-5)


def test_a_loop_with_an_untrained_weight_keeps_a_constant_number_of_buffers():
  # the weight is left at requires_grad None (a model run for inference): each step's history is followed only
  # while a live tensor holds its value, so the chain through w does not keep every step's buffers (it did: 108
  # buffers grew to 1,503 over 300 steps of this loop). Several outputs per realize, and a value handed back.
  rng = np.random.default_rng(0)
  w = Tensor(rng.standard_normal((16, 16)).astype(np.float32) / 4)
  x = Tensor(rng.standard_normal((16, 16)).astype(np.float32)).realize()
  xn, wn = x.numpy(), w.numpy()
  counts = []
  for i in range(120):
    y = (x @ w).relu()
    a, b = y.sum(0), y.max(1)
    Tensor.realize(a, b)
    x = (y + a * 0.01).realize()
    yn = np.maximum(xn @ wn, 0)
    xn = yn + yn.sum(0) * 0.01
    xn /= np.abs(xn).max(); x = (x / x.abs().max()).realize()
    if i in (20, 119): counts.append(live_buffers())
  np.testing.assert_allclose(x.numpy(), xn, rtol=1e-3, atol=1e-4)
  assert counts[1] <= counts[0] + 20, counts


def test_a_realized_value_a_live_tensor_holds_still_passes_gradients_to_untrained_tensors():
  # the shallow histories: a read loss and a realized value still lead gradients to requires_grad None tensors,
  # one realize deep, as long as a live tensor holds them (tinygrad's realize would cut both)
  x = Tensor([1.0, -2.0, 0.5])
  loss = (x * x).sum()
  assert loss.item() == pytest.approx(5.25)
  loss.backward()
  np.testing.assert_allclose(x.grad.numpy(), [2.0, -4.0, 1.0], rtol=1e-6)
  v = Tensor([0.5, 1.5])
  z = v.exp().realize()
  (z * v).sum().backward()
  np.testing.assert_allclose(v.grad.numpy(), np.exp([0.5, 1.5]) * (1 + np.array([0.5, 1.5])), rtol=1e-5)
  # a chain of realized values through a weight nobody trains: the values before the last one are dropped, so
  # the gradient is the last step's (requires_grad=True keeps the chain: the test above)
  w = Tensor([0.5, 2.0])
  h = Tensor([1.0, 3.0]).realize()
  for _ in range(40): h = (h * w).realize()
  g, = h.sum().gradient(w)
  np.testing.assert_allclose(g.numpy(), np.array([0.5, 2.0]) ** 39 * [1.0, 3.0], rtol=1e-5)


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


def _decode_like_loop(w: Tensor, steps: int) -> Tensor:
  """A KV-cache-like loop: each step writes one row of a realized cache from weights and from what the cache held,
  and realizes the write (as tinygrad's model files do)."""
  cache = Tensor.zeros(16, 8).contiguous().realize()
  x = Tensor.ones(1, 8)
  for i in range(steps):
    row = (x @ w + cache[(i - 1) % 16:(i - 1) % 16 + 1] * 0.5).tanh()
    cache[i % 16:i % 16 + 1].assign(row).realize()
    x = cache[i % 16:i % 16 + 1] * 1.0
  return cache


def test_a_write_loop_from_untrained_weights_keeps_no_history():
  # requires_grad None (tinygrad's default): a realized write is a constant for autograd, as tinygrad's realize cuts
  # the graph; before, the cache's history took in every step's graph (quadratic time, every buffer kept)
  w = Tensor(np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32) * 0.3)
  cache = _decode_like_loop(w, 5)
  base = live_buffers()
  cache = _decode_like_loop(w, 200)
  assert history.history(cache.uop) is None
  assert live_buffers() <= base + 20
  # the values are those of the same loop in numpy
  c, x, wn = np.zeros((16, 8), np.float32), np.ones((1, 8), np.float32), w.numpy()
  for i in range(200):
    c[i % 16] = np.tanh(x @ wn + c[(i - 1) % 16] * 0.5)
    x = c[i % 16:i % 16 + 1]
  np.testing.assert_allclose(cache.numpy(), c, rtol=1e-4, atol=1e-5)


def test_a_write_loop_from_trained_weights_keeps_its_gradient():
  # with requires_grad=True the writes keep their history: the gradient through three writes equals numpy's chain
  rng = np.random.default_rng(1)
  wn = rng.standard_normal((8, 8)).astype(np.float64) * 0.3
  w = Tensor(wn, requires_grad=True)
  cache = Tensor.zeros(16, 8, dtype=w.dtype).contiguous().realize()
  for i in range(3): cache[i:i + 1].assign((cache[max(i - 1, 0):max(i - 1, 0) + 1] + 1.0) @ w).realize()
  g, = cache.sum().gradient(w)
  def loss(wm):
    c = np.zeros((16, 8))
    for i in range(3): c[i] = (c[max(i - 1, 0)] + 1.0) @ wm
    return c.sum()
  eps, fd = 1e-6, np.zeros_like(wn)
  for j in range(8):
    for k in range(8):
      d = np.zeros_like(wn); d[j, k] = eps
      fd[j, k] = (loss(wn + d) - loss(wn - d)) / (2 * eps)
  np.testing.assert_allclose(g.numpy(), fd, rtol=1e-5, atol=1e-7)
