"""A residual block's output, relu(bn2(conv2(h)) + shortcut), is stored by its second convolution's kernel
(rules/fusion.rules store_expensive_epilogue; engine/sched/fusion.py's epilogue facts): one kernel per
convolution, as tinygrad schedules ResNet (ResNet18's forward: 28 kernels before, 19 now, tinygrad 19). Values
are checked against the tensor evaluator (RULEC_REALIZE=eval), kernels counted (never timed)."""
from __future__ import annotations

import numpy as np
import pytest

from rulec import Tensor, nn


class Block:
  def __init__(self, cin: int, cout: int, stride: int):
    self.c1, self.b1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(cout)
    self.c2, self.b2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout)
    self.down = [nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout)] if stride != 1 or cin != cout else []
    rng = np.random.default_rng(cin * 7 + cout)
    for bn in (self.b1, self.b2, *self.down[1:]):
      bn.running_mean.assign(Tensor(rng.standard_normal(cout).astype(np.float32) * 0.1)).realize()
      bn.running_var.assign(Tensor(rng.uniform(0.5, 1.5, cout).astype(np.float32))).realize()

  def __call__(self, x: Tensor) -> Tensor:
    h = self.b1(self.c1(x)).relu()
    short = x.sequential(self.down) if self.down else x
    return (self.b2(self.c2(h)) + short).relu()


@pytest.mark.parametrize("blocks", [[(8, 8, 1), (8, 8, 1)], [(8, 8, 1), (8, 16, 2), (16, 16, 1)]])
def test_one_kernel_per_convolution(blocks, monkeypatch):
  Tensor.training = False
  model = [Block(*b) for b in blocks]
  x = Tensor(np.random.default_rng(0).standard_normal((2, 8, 8, 8)).astype(np.float32)).realize()
  for t in nn.state.get_parameters(model): t.realize()
  out = x.sequential(model).mean((2, 3))
  convs = sum(3 if b.down else 2 for b in model)
  # at most one kernel per convolution (the mean joins the last one; a 1x1 shortcut may join its reader)
  assert len(out.schedule()) <= convs
  got = out.numpy()
  monkeypatch.setenv("RULEC_REALIZE", "eval")
  np.testing.assert_allclose(got, x.sequential(model).mean((2, 3)).numpy(), rtol=1e-4, atol=1e-5)


def test_training_still_stores_what_the_backward_reads():
  """A layer's pre-activation that the backward pass reads too is stored itself (lower_value_first), not
  recomputed: the strict check keeps store_expensive_epilogue off it."""
  Tensor.training = True
  block = Block(4, 4, 1)
  x = Tensor(np.random.default_rng(1).standard_normal((2, 4, 6, 6)).astype(np.float32)).realize()
  params = nn.state.get_parameters(block)
  for t in params: t.requires_grad = True; t.realize()
  loss = block(x).square().mean()
  loss.backward()
  grads = [t.grad for t in params if t.grad is not None]
  Tensor.realize(loss, *grads)
  assert all(np.isfinite(g.numpy()).all() for g in grads)
  Tensor.training = False


def test_a_scaled_epilogue_of_a_stored_reduce_is_not_stored_again(monkeypatch):
  """(x @ w).gelu() with its gradients: gelu reads 0.5 * y and 0.044715 * y of the matmul y, which the backward
  reads too. y is stored; its scaled copies are recomputed from it (needed_below sees y through its reshape),
  not stored beside it: 5 kernels, 6 before (tinygrad 0.14: 4)."""
  rng = np.random.default_rng(3)
  xv, wv = rng.standard_normal((8, 16)).astype(np.float32), rng.standard_normal((16, 16)).astype(np.float32)
  def run():
    x, w = Tensor(xv, requires_grad=True), Tensor(wv, requires_grad=True)
    loss = (x @ w).gelu().square().mean()
    return [loss, *loss.gradient(x, w)]
  outs = run()
  assert len(Tensor.schedule(*outs)) <= 5
  got = [t.numpy() for t in outs]
  monkeypatch.setenv("RULEC_REALIZE", "eval")
  for a, b in zip(got, [t.numpy() for t in run()]): np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
