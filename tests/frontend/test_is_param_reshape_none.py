"""Two tinygrad 0.14 conventions model files lean on (issue #33):

- `Tensor.is_param` / `is_param_()`: every tensor starts with is_param True; an optimizer updates the tensors that
  have it and only realizes the others (its buffers); gradients do not depend on it; clone/to/shard keep it.
- `reshape(None, ...)`: None keeps the size of the axis at its position (GPT-2's `reshape(None, None, 3, h, d)`),
  with tinygrad's errors (a None past the last axis is an IndexError; -1 twice a RuntimeError; a size mismatch a
  ValueError)."""
import numpy as np
import pytest

from rulec import Tensor, nn
from rulec.nn.optim import SGD, Adam, AdamW
from rulec.nn.state import get_parameters


def test_is_param_defaults_and_flag():
  t = Tensor([1.0, 2.0])
  assert t.is_param is True
  assert (t + 1).is_param is True and Tensor.zeros(3).is_param is True
  assert t.is_param_(False) is t and t.is_param is False
  assert t.is_param_() is t and t.is_param is True
  t.is_param_(False)
  assert t.clone().is_param is False and t.to("NUMPY").is_param is False   # carried over, as in tinygrad
  assert t.shard(("CPU", "CPU:1")).is_param is False and t.shard(("CPU", "CPU:1"), axis=0).is_param is False
  assert (t * 2).is_param is True   # a new value starts as a parameter


def test_is_param_does_not_change_gradients():
  w = Tensor([1.0, -2.0, 3.0]).is_param_(False)
  (w * w).sum().backward()
  np.testing.assert_allclose(w.grad.numpy(), [2.0, -4.0, 6.0])


def test_optimizer_trains_params_and_realizes_buffers():
  w, frozen = Tensor([1.0, 2.0]), Tensor([5.0, 6.0]).is_param_(False)
  opt = SGD([w, frozen], lr=0.5)
  assert opt.params == [w] and opt.buffers == [frozen]
  with Tensor.train():
    ((w * frozen).sum()).backward()
    assert frozen.grad is not None   # (it has a gradient, as in tinygrad; the optimizer leaves it alone)
    frozen.assign(frozen + 1)        # a pending write the step carries out
    opt.step()
  np.testing.assert_allclose(w.numpy(), [1.0 - 0.5 * 5.0, 2.0 - 0.5 * 6.0])
  np.testing.assert_allclose(frozen.numpy(), [6.0, 7.0])
  with pytest.raises(ValueError, match="at least one param"): Adam([Tensor([1.0]).is_param_(False)])


def test_model_with_a_non_param_table_trains_like_tinygrad():
  """A transformer-style model whose rotary/embedding table is is_param_(False): get_parameters lists it, AdamW
  leaves it as it was, the weights move."""
  class Model:
    def __init__(self):
      self.lin = nn.Linear(4, 4)
      self.table = Tensor.arange(4, dtype="float32").reshape(1, 4).is_param_(False)
    def __call__(self, x): return self.lin(x) * self.table
  Tensor.manual_seed(0)
  m = Model()
  table0, w0 = m.table.numpy().copy(), m.lin.weight.numpy().copy()
  params = get_parameters(m)
  assert any(p is m.table for p in params)
  opt = AdamW(params, lr=0.1)
  assert all(p is not m.table for p in opt.params) and any(b is m.table for b in opt.buffers)
  with Tensor.train():
    opt.zero_grad()
    m(Tensor.ones(2, 4)).sum().backward()
    opt.step()
  np.testing.assert_array_equal(m.table.numpy(), table0)
  assert not np.allclose(m.lin.weight.numpy(), w0)


def test_batchnorm_statistics_are_not_params():
  bn = nn.BatchNorm(3)
  assert bn.weight.is_param and bn.bias.is_param
  assert not bn.running_mean.is_param and not bn.running_var.is_param and not bn.num_batches_tracked.is_param


def test_reshape_none_keeps_axes():
  x = np.arange(2 * 5 * 12, dtype=np.float32).reshape(2, 5, 12)
  t = Tensor(x)
  np.testing.assert_array_equal(t.reshape(None, None, 3, 2, 2).numpy(), x.reshape(2, 5, 3, 2, 2))
  assert t.reshape(None, None, 3, -1).shape == (2, 5, 3, 4)
  assert t.reshape((None, -1)).shape == (2, 60) and t.reshape([None, 60]).shape == (2, 60)
  assert t.reshape(None, None, None).shape == (2, 5, 12) and t.view(None, -1).shape == (2, 60)
  assert t.reshape(1, None, 24).shape == (1, 5, 24)   # None takes the size of the axis at its own position
  assert Tensor.arange(6).reshape(None).shape == (6,)


def test_reshape_none_errors_as_tinygrad():
  t = Tensor.arange(24).reshape(2, 3, 4)
  with pytest.raises(IndexError, match="None at position 3"): t.reshape(None, None, None, None)
  with pytest.raises(IndexError): Tensor(3.0).reshape(None)
  with pytest.raises(RuntimeError, match="only one dimension"): t.reshape(None, -1, -1)
  with pytest.raises(ValueError, match="cannot reshape"): t.reshape(None, 5, -1)
  with pytest.raises(ValueError, match="cannot reshape"): t.reshape(3, None, -1)
  with pytest.raises(ValueError, match="negative"): t.reshape(None, -2, -6)
