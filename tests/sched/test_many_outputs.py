"""Many outputs realized in one call (issue #33): `Tensor.realize(*get_state_dict(model).values())`, which tinygrad's
model files and examples run after building a model, and an optimizer's first step (its zero-filled state for
every parameter). Each fresh constant output is a copy whose stage stands for two originals; the schedule took the
readers of the sink back to an original by trying every combination, 2**n for n outputs (30 BatchNorm buffers:
minutes and gigabytes, 36: past 20 GB). Now the candidates come from the users of the first source's choices."""
from __future__ import annotations

import numpy as np

from rulec import Context, Tensor, dtypes, nn


def test_sixty_constant_fills_in_one_realize():
  ts = [Tensor.zeros(8) if i % 3 else Tensor.ones(8) for i in range(60)]
  Tensor.realize(*ts)
  for i, t in enumerate(ts): np.testing.assert_array_equal(t.numpy(), np.full(8, 0.0 if i % 3 else 1.0, np.float32))


def test_a_models_state_dict_in_one_realize():
  layers = [nn.BatchNorm2d(4) for _ in range(10)] + [nn.Conv2d(2, 2, 3) for _ in range(4)]
  state = nn.state.get_state_dict(layers)
  assert len(state) == 58
  Tensor.realize(*state.values())
  np.testing.assert_array_equal(state["0.running_var"].numpy(), np.ones(4, np.float32))
  np.testing.assert_array_equal(state["9.running_mean"].numpy(), np.zeros(4, np.float32))
  assert state["3.num_batches_tracked"].dtype == dtypes.int64 and state["3.num_batches_tracked"].item() == 0


def test_adam_first_step_over_many_parameters():
  ws = [Tensor.ones(3).contiguous().realize() for _ in range(40)]
  opt = nn.optim.Adam(ws, lr=0.1)
  with Context(TRAINING=1):
    opt.zero_grad()
    sum(((w * (i + 1)).sum() for i, w in enumerate(ws)), Tensor(0.0)).backward()
    opt.step()
  for w in ws: np.testing.assert_allclose(w.numpy(), np.full(3, 0.9, np.float32), rtol=1e-5)   # Adam's first step is lr
