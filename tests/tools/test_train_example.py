"""examples/train_digits.py: the model against a numpy forward, the jitted training step against numpy losses,
a short training run on a subset (loss goes down, accuracy far above chance), and the safetensors round trip.

The full run (400 steps, >= 97% test accuracy) is the example's own job, not a test: python examples/train_digits.py
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

pytest.importorskip("sklearn")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

import train_digits as td  # noqa: E402
from rulec import Tensor, nn  # noqa: E402


@pytest.fixture(scope="module")
def data():
  return td.load_data()


def _np_conv3x3(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
  """A 3x3 convolution with padding 1: (N, C, H, W), (O, C, 3, 3) -> (N, O, H, W)."""
  win = np.lib.stride_tricks.sliding_window_view(np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1))), (3, 3), axis=(2, 3))
  return np.einsum("nchwij,ocij->nohw", win, w) + b[None, :, None, None]


def np_logits(sd: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
  """DigitsNet's forward in numpy, from its state dict."""
  h = np.maximum(_np_conv3x3(x, sd["c1.weight"], sd["c1.bias"]), 0)
  h = np.maximum(_np_conv3x3(h, sd["c2.weight"], sd["c2.bias"]), 0)
  n, c = h.shape[:2]
  h = h.reshape(n, c, 4, 2, 4, 2).max(axis=(3, 5)).reshape(n, -1)
  return h @ sd["l1.weight"].T + sd["l1.bias"]


def np_cross_entropy(logits: np.ndarray, y: np.ndarray) -> float:
  z = logits - logits.max(1, keepdims=True)
  return float(-(z[np.arange(len(y)), y] - np.log(np.exp(z).sum(1))).mean())


def weights(model) -> dict[str, np.ndarray]:
  return {k: v.numpy().astype(np.float64) for k, v in nn.state.get_state_dict(model).items()}


def test_data_split(data):
  xtr, ytr, xte, yte = data
  assert xtr.shape == (1437, 1, 8, 8) and xte.shape == (360, 1, 8, 8) and xtr.dtype == np.float32
  assert 0 <= xtr.min() and xtr.max() <= 1 and set(np.unique(yte)) == set(range(10))
  again = td.load_data()
  assert all(np.array_equal(a, b) for a, b in zip(data, again))   # the split is fixed


def test_forward_matches_numpy(data):
  Tensor.manual_seed(1)
  model = td.DigitsNet()
  x = data[0][:16]
  got = model(Tensor(x)).numpy()
  np.testing.assert_allclose(got, np_logits(weights(model), x.astype(np.float64)), rtol=1e-4, atol=1e-5)


def test_jitted_steps_give_numpy_losses(data):
  """Each call's loss is the numpy cross-entropy of the weights before that step on that call's batch: also on
  the replays (call 3 on), which run captured kernels on new inputs."""
  xtr, ytr, _, _ = data
  Tensor.manual_seed(2)
  model = td.DigitsNet(4, 8)
  step = td.make_train_step(model, nn.optim.Adam(nn.state.get_parameters(model), lr=1e-2))
  rng = np.random.default_rng(0)
  for _ in range(4):
    idx = rng.choice(len(xtr), 16, replace=False)
    want = np_cross_entropy(np_logits(weights(model), xtr[idx].astype(np.float64)), ytr[idx])
    assert step(Tensor(xtr[idx]), Tensor(ytr[idx])).item() == pytest.approx(want, rel=1e-4)
  assert step.captured is not None   # the last calls were replays


def test_short_training_learns(data, tmp_path):
  xtr, ytr, xte, yte = data
  Tensor.manual_seed(0)
  model = td.DigitsNet(4, 8)   # (half the example's channels: the NUMPY reference device runs this too)
  losses = td.train(model, xtr[:640], ytr[:640], steps=60, batch=32, lr=1e-2)
  assert len(losses) == 60 and np.isfinite(losses).all()
  assert np.mean(losses[-10:]) < 0.5 * np.mean(losses[:5])
  acc = td.accuracy(model, xte, yte)
  assert acc > 0.7, acc   # chance is 0.1
  # the saved model predicts exactly what the trained one does
  path = tmp_path / "digits.safetensors"
  td.save(model, path)
  loaded = td.load(path)
  assert np.array_equal(td.predict(loaded, xte), td.predict(model, xte))
  np.testing.assert_array_equal(loaded(Tensor(xte[:8])).numpy(), model(Tensor(xte[:8])).numpy())
  assert td.accuracy(loaded, xte, yte) == acc


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 40), batch=st.integers(1, 12), steps=st.integers(0, 30))
def test_batches_cover_epochs(n, batch, steps):
  if batch > n:
    with pytest.raises(ValueError, match="larger than"): list(td.batches(n, batch, steps))
    return
  got = list(td.batches(n, batch, steps))
  assert len(got) == steps and all(len(b) == batch for b in got)
  per_epoch = n // batch
  for e in range(0, steps, per_epoch):   # within one epoch no sample repeats
    epoch = np.concatenate(got[e:e + per_epoch])
    assert len(np.unique(epoch)) == len(epoch) and epoch.min() >= 0 and epoch.max() < n


def test_bad_inputs(tmp_path):
  model = td.DigitsNet(2, 2)
  with pytest.raises(ValueError, match=r"\(N, 1, 8, 8\).*\(3, 8, 8\)"): model(Tensor.zeros(3, 8, 8))
  with pytest.raises(SystemExit, match="no model file"): td.load(tmp_path / "missing.safetensors")
  nn.state.safe_save({"w": Tensor.zeros(2)}, tmp_path / "other.safetensors")
  with pytest.raises(SystemExit, match="does not hold a DigitsNet"): td.load(tmp_path / "other.safetensors")
  with pytest.raises(ValueError, match="10 images but 9 labels"):
    td.train(model, np.zeros((10, 1, 8, 8), np.float32), np.zeros(9, np.int32), steps=1, batch=2)
