"""Mixed-precision training: float32 master weights, the forward and backward in bfloat16 (or float16 with a loss
scale), the update in float32. The gradient of a cast is the cast back, so the master weights get float32
gradients; the training curve follows float32's within the half type's rounding."""
import ml_dtypes  # noqa: F401  (registers np.dtype("bfloat16"))
import numpy as np
import pytest

from rulec import Tensor, TinyJit, dtypes
from rulec.nn.optim import SGD

STEPS = 25


def make_data(seed=0):
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((64, 16)).astype(np.float32)
  w_true = rng.standard_normal((16, 1)).astype(np.float32)
  y = np.tanh(x @ w_true) + 0.05 * rng.standard_normal((64, 1)).astype(np.float32)
  w1 = (rng.standard_normal((16, 32)) * 0.3).astype(np.float32)
  w2 = (rng.standard_normal((32, 1)) * 0.3).astype(np.float32)
  return x, y, w1, w2


def train(compute, device, scale=1.0, jit=False):
  """Losses (float32 numbers) of STEPS steps of SGD on a 2-layer MLP whose master weights are float32 and whose
  forward and backward run in `compute`; the loss is multiplied by `scale` before backward and the gradients
  divided by it after (static loss scaling)."""
  x_np, y_np, w1_np, w2_np = make_data()
  x, y = Tensor(x_np, device=device), Tensor(y_np, device=device)
  w1 = Tensor(w1_np, device=device, requires_grad=True)
  w2 = Tensor(w2_np, device=device, requires_grad=True)
  opt = SGD([w1, w2], lr=0.1)

  def step():
    with Tensor.train():
      opt.zero_grad()
      h = (x.cast(compute) @ w1.cast(compute)).gelu()
      pred = (h @ w2.cast(compute)).float()
      loss = ((pred - y) ** 2).mean()
      (loss * scale).backward()
      assert w1.grad.dtype is dtypes.float32 and w2.grad.dtype is dtypes.float32
      if scale != 1.0:
        for w in (w1, w2): w.grad = w.grad / scale
      opt.step()
      return loss.realize()
  run = TinyJit(step) if jit else step
  return [float(run().item()) for _ in range(STEPS)], w1


@pytest.mark.parametrize("device", ["NUMPY", "CPU"])
def test_bfloat16_training_follows_float32(device):
  ref, w_ref = train(dtypes.float32, device)
  got, w = train(dtypes.bfloat16, device)
  assert w.dtype is dtypes.float32
  assert got[-1] < 0.5 * got[0], "the bfloat16 run does not learn"
  # each step's loss within a few bfloat16 roundings of the float32 run's (2**-8 relative each)
  np.testing.assert_allclose(got, ref, rtol=0.05, atol=5e-3)
  np.testing.assert_allclose(w.numpy(), w_ref.numpy(), rtol=0.05, atol=0.02)


def test_float16_with_a_loss_scale_under_the_jit():
  ref, _ = train(dtypes.float32, "CPU")
  got, w = train(dtypes.float16, "CPU", scale=1024.0, jit=True)
  assert all(np.isfinite(got))
  np.testing.assert_allclose(got, ref, rtol=0.02, atol=2e-3)


def test_float16_gradients_underflow_without_a_scale():
  # the gradient reaching w.half() is 1e-5 * 1e-3 = 1e-8, zero in float16 (its smallest subnormal is 6e-8): the
  # reason for a loss scale; scaled by 1024 it is 1e-5 there, and divided back in float32 it is right
  w = Tensor(np.ones((4,), np.float32), requires_grad=True, device="CPU")
  ((w.half() * 1e-3).float().sum() * 1e-5).backward()
  assert w.grad.numpy().tolist() == [0.0] * 4
  w.grad = None
  ((w.half() * 1e-3).float().sum() * 1e-5 * 1024).backward()
  np.testing.assert_allclose(w.grad.numpy() / 1024, 1e-8, rtol=2e-3)
