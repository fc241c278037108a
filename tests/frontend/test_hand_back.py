"""Intermediate values a realize stores are handed back to the live graphs that hold them (engine/tensor/base.py
`_hand_back`, engine/sched/driver.py `_kept_values`: tinygrad's becomes map), so no later realize computes them
again. Without it a model that realizes each layer's KV-cache write (LLaMA, GPT-2) computed every layer below the
one written, per layer: kernels grew with the square of the depth (8 layers: 462 kernels a token, now 101).

Counted in kernels run (never seconds); values checked against numpy; the cases that must not share a buffer
(two tensors holding one graph, an assign into one of them), autograd through a handed-back value, and the
schedule cache's hits (which hand back too)."""
from __future__ import annotations

import numpy as np
import pytest

from rulec import Tensor
from rulec.engine.realize import COUNTERS
from rulec.engine.sched import cache as schedule_cache

DIM, CTX = 8, 6


class Layer:
  """A layer shaped like LLaMA's: a norm (a reduce) over the input, a projection, the projection written into
  this layer's cache at `pos` and realized there, then attention over the cache and a residual."""
  def __init__(self, rng):
    self.w = Tensor(rng.standard_normal((DIM, DIM)).astype(np.float32) * 0.3)
    self.cache = Tensor.zeros(CTX, DIM).contiguous().realize()
  def __call__(self, x: Tensor, pos: int) -> Tensor:
    h = x / (x.square().mean(-1, keepdim=True) + 1e-5).sqrt()
    k = h @ self.w
    self.cache[pos:pos + 1].assign(k).realize()
    keys = self.cache[:pos + 1]
    att = (h @ keys.T).softmax(-1) @ keys
    return (x + att).contiguous()


def np_layer(x, w, cache, pos):
  h = x / np.sqrt(np.mean(x * x, -1, keepdims=True) + 1e-5)
  cache[pos] = (h @ w)[0]
  keys = cache[:pos + 1]
  s = h @ keys.T
  s = np.exp(s - s.max(-1, keepdims=True))
  return x + (s / s.sum(-1, keepdims=True)) @ keys


def run(layers: int, steps: int = 3):
  rng = np.random.default_rng(0)
  model = [Layer(rng) for _ in range(layers)]
  ws = [m.w.numpy() for m in model]
  caches = [np.zeros((CTX, DIM), np.float32) for _ in range(layers)]
  xs = rng.standard_normal((steps, 1, DIM)).astype(np.float32)
  kernels = []
  for pos in range(steps):
    before = COUNTERS["run"]
    h = Tensor(xs[pos])
    for m in model: h = m(h, pos)
    out = h.numpy()
    kernels.append(COUNTERS["run"] - before)
    ref = xs[pos]
    for w, c in zip(ws, caches): ref = np_layer(ref, w, c, pos)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)
  for m, c in zip(model, caches): np.testing.assert_allclose(m.cache.numpy(), c, rtol=1e-4, atol=1e-5)
  return kernels


def test_kernels_grow_linearly_with_depth_and_values_match_numpy():
  k1, k2, k4 = (run(n)[-1] for n in (1, 2, 4))
  # each layer costs the same: nothing below it is computed again
  assert k4 - k2 == 2 * (k2 - k1), (k1, k2, k4)
  assert k2 - k1 <= k1 + 2


def test_with_and_without_the_schedule_cache(monkeypatch):
  with_cache = run(3, steps=4)
  monkeypatch.setenv("RULEC_SCHEDULE_CACHE", "0")
  assert run(3, steps=4) == with_cache   # (a hit hands back what the miss did)


def test_two_tensors_holding_one_graph_keep_their_own_buffers():
  base = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3)).realize()
  a = base @ base.T
  b = base @ base.T           # (the same node: graphs are hash-consed)
  assert a.uop is b.uop
  c = a + 1                   # reads it inside
  (a.sum(1, keepdim=True) + a).realize()   # stores it (a reduce read by the kernel below)
  # handed to neither holder (an assign into one must not show in the other), nor to any graph
  assert a.uop.base.op.name != "BUFFER" and c.uop.src[0].base.op.name != "BUFFER"
  a.assign(Tensor.zeros(2, 2)).realize()
  v = np.arange(6, dtype=np.float32).reshape(2, 3)
  np.testing.assert_array_equal(a.numpy(), np.zeros((2, 2)))
  np.testing.assert_array_equal(b.numpy(), v @ v.T)
  np.testing.assert_array_equal(c.numpy(), v @ v.T + 1)


def test_a_handed_back_value_written_later_through_its_one_holder():
  rng = np.random.default_rng(2)
  bv, wv = rng.standard_normal((2, 3)).astype(np.float32), rng.standard_normal((3, 3)).astype(np.float32)
  base, w = Tensor(bv).realize(), Tensor(wv).realize()
  a = base @ w                     # a reduce read by two kernels below: stored
  c = a.sum(1, keepdim=True) + a   # holds a inside
  d = (a.max(1, keepdim=True) - a).realize()
  assert a.uop.base.op.name == "BUFFER" and c.uop.op.name != "BUFFER"   # a was handed back, c is still lazy
  v = bv @ wv
  np.testing.assert_allclose(d.numpy(), v.max(1, keepdims=True) - v, rtol=1e-5)
  a.assign(Tensor.ones(2, 3)).realize()
  # a is realized now, as if realized itself: c reads it as it is when c is realized (tinygrad's order)
  np.testing.assert_array_equal(c.numpy(), np.full((2, 3), 4.0))


def test_gradients_flow_through_a_handed_back_value():
  rng = np.random.default_rng(1)
  xv, wv = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((4, 4)).astype(np.float32)
  def grads(realize_between: bool):
    x, w = Tensor(xv, requires_grad=True), Tensor(wv, requires_grad=True)
    h = (x @ w).tanh()
    y = (h - h.mean(-1, keepdim=True))       # stores h (a reduce and an elementwise op read it)
    if realize_between: y.realize()
    loss = (h * y).sum() + h.square().sum()
    loss.backward()
    return x.grad.numpy(), w.grad.numpy()
  for a, b in zip(grads(True), grads(False)): np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_an_output_buffer_is_not_shared_with_a_held_value():
  base = Tensor(np.ones((4, 4), np.float32)).realize()
  h = base * 3
  out = h.contiguous()
  out.realize()
  out.assign(Tensor.zeros(4, 4)).realize()
  np.testing.assert_array_equal(h.numpy(), np.full((4, 4), 3.0))


@pytest.mark.parametrize("keep", [True, False])
def test_schedule_cache_entries_differ_by_keeping(keep):
  schedule_cache.clear()
  base = Tensor(np.ones((4, 4), np.float32)).realize()
  h = base @ base
  y = (h - h.sum(1, keepdim=True))
  kernels, views, kept = schedule_cache.schedule_keeping([y.uop], "CPU", ["CPU"], keep=keep)
  assert len(views) == 1 and (bool(kept) if keep else kept == [])
  for node, view in kept:
    assert view.base.op.name == "BUFFER" and view.shape == node.shape
