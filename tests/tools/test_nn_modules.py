"""rulec.nn modules: forward values against numpy references, BatchNorm's train/eval behaviour and running
statistics, tinygrad 0.14's initialisation bounds, and clear errors for bad input."""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from numpy.lib.stride_tricks import sliding_window_view

from rulec import Tensor, dtypes, nn

RNG = np.random.default_rng(0)


def randn(*shape): return RNG.standard_normal(shape).astype(np.float32)


def close(got, want, tol=1e-5):
  np.testing.assert_allclose(np.asarray(got, dtype=np.float64), want, rtol=tol, atol=tol)


def set_(t: Tensor, a: np.ndarray) -> None: t.assign(Tensor(a)).realize()


# *** references ***

def conv_ref(x, w, b, stride=1, pad=0, dil=1, groups=1):
  """N-d cross-correlation, symmetric int padding."""
  n = w.ndim - 2
  x = np.pad(x, [(0, 0), (0, 0)] + [(pad, pad)] * n)
  O, Cg = w.shape[:2]
  outs = []
  for g in range(groups):
    xg, wg = x[:, g * Cg:(g + 1) * Cg], w[g * (O // groups):(g + 1) * (O // groups)]
    span = tuple((k - 1) * dil + 1 for k in wg.shape[2:])
    win = sliding_window_view(xg, span, axis=tuple(range(2, 2 + n)))
    win = win[(..., *[slice(None, None, dil)] * n)][(slice(None), slice(None), *[slice(None, None, stride)] * n)]
    letters = "abc"[:n]
    outs.append(np.einsum(f"nc{letters}{letters.upper()},oc{letters.upper()}->no{letters}", win, wg))
  out = np.concatenate(outs, axis=1)
  return out if b is None else out + b.reshape(1, -1, *[1] * n)


def conv_t_ref(x, w, b, stride=1, pad=0, out_pad=0, dil=1):
  """1-D/2-D transposed convolution by its definition: every input element scatters a scaled kernel."""
  n = x.ndim - 2
  N, C, sp = x.shape[0], x.shape[1], x.shape[2:]
  O, ks = w.shape[1], w.shape[2:]
  full = tuple((L - 1) * stride + dil * (k - 1) + 1 + out_pad for L, k in zip(sp, ks))
  out = np.zeros((N, O) + full)
  for idx in np.ndindex(*sp):
    for kdx in np.ndindex(*ks):
      pos = tuple(i * stride + k * dil for i, k in zip(idx, kdx))
      out[(slice(None), slice(None), *pos)] += np.einsum("nc,co->no", x[(slice(None), slice(None), *idx)], w[(slice(None), slice(None), *kdx)])
  out = out[(slice(None), slice(None), *[slice(pad, f - pad) for f in full])]
  return out if b is None else out + b.reshape(1, -1, *[1] * n)


def norm_ref(x, axes, eps):
  m = x.mean(axis=axes, keepdims=True)
  return (x - m) / np.sqrt(((x - m) ** 2).mean(axis=axes, keepdims=True) + eps)


# *** layers ***

def test_linear_forward_and_init():
  lin = nn.Linear(3, 4)
  assert lin.weight.shape == (4, 3) and lin.bias.shape == (4,) and lin.weight.dtype is dtypes.float32
  w, b, x = randn(4, 3), randn(4), randn(2, 5, 3)
  set_(lin.weight, w); set_(lin.bias, b)
  close(lin(Tensor(x)).numpy(), x @ w.T + b)
  assert nn.Linear(3, 4, bias=False).bias is None


def test_init_bounds_match_tinygrad():
  # tinygrad 0.14 (measured): Linear and conv weights/biases uniform in +-1/sqrt(fan_in), fan_in counting every
  # input channel; Embedding glorot_uniform; LSTMCell +-1/sqrt(hidden)
  for t, bound in [(nn.Linear(1000, 400).weight, 1 / math.sqrt(1000)), (nn.Linear(1000, 400).bias, 1 / math.sqrt(1000)),
                   (nn.Conv2d(16, 32, 3, groups=2).weight, 1 / math.sqrt(16 * 9)),
                   (nn.ConvTranspose2d(16, 32, 3, groups=2).weight, 1 / math.sqrt(16 * 9)),
                   (nn.Embedding(100, 50).weight, math.sqrt(6 / 150)),
                   (nn.LSTMCell(8, 64).weight_hh, 1 / 8)]:
    a = t.numpy()
    assert np.abs(a).max() <= bound and np.abs(a).max() > 0.97 * bound
    if a.size > 10000: assert abs(a.std() - bound / math.sqrt(3)) < 0.02 * bound   # uniform, not normal
  assert nn.Conv2d(16, 32, 3, groups=2).weight.shape == (32, 8, 3, 3)
  assert nn.ConvTranspose2d(16, 32, 3, groups=2).weight.shape == (16, 16, 3, 3)
  assert np.all(nn.LSTMCell(2, 3).bias_ih.numpy() == 0)


@settings(max_examples=4)
@given(stride=st.integers(1, 2), pad=st.integers(0, 1), dil=st.integers(1, 2), groups=st.sampled_from([1, 2]))
def test_conv2d_forward(stride, pad, dil, groups):
  conv = nn.Conv2d(4, 6, 3, stride=stride, padding=pad, dilation=dil, groups=groups)
  w, b, x = randn(6, 4 // groups, 3, 3), randn(6), randn(2, 4, 7, 7)
  set_(conv.weight, w); set_(conv.bias, b)
  close(conv(Tensor(x)).numpy(), conv_ref(x, w, b, stride, pad, dil, groups), 1e-4)


def test_conv1d_and_same_padding():
  conv = nn.Conv1d(3, 2, 3, padding=1)
  assert conv.weight.shape == (2, 3, 3)
  w, b, x = randn(2, 3, 3), randn(2), randn(2, 3, 9)
  set_(conv.weight, w); set_(conv.bias, b)
  close(conv(Tensor(x)).numpy(), conv_ref(x, w, b, pad=1), 1e-4)
  same = nn.Conv2d(2, 3, 3, padding="same", dilation=2, bias=False)
  x2 = randn(1, 2, 6, 6)
  out = same(Tensor(x2)).numpy()
  assert out.shape == (1, 3, 6, 6)
  close(out, conv_ref(x2, same.weight.numpy(), None, pad=2, dil=2), 1e-4)
  with pytest.raises(ValueError, match="'same'"): nn.Conv2d(2, 3, 3, padding="valid")
  with pytest.raises(ValueError, match="strided"): nn.Conv2d(2, 3, 3, stride=2, padding="same")
  with pytest.raises(ValueError, match="groups"): nn.Conv2d(3, 4, 3, groups=2)


@pytest.mark.parametrize("stride,pad,out_pad", [(1, 0, 0), (2, 1, 1)])
def test_conv_transpose_forward(stride, pad, out_pad):
  ct = nn.ConvTranspose2d(3, 2, 3, stride=stride, padding=pad, output_padding=out_pad)
  w, b, x = randn(3, 2, 3, 3), randn(2), randn(2, 3, 4, 5)
  set_(ct.weight, w); set_(ct.bias, b)
  close(ct(Tensor(x)).numpy(), conv_t_ref(x, w, b, stride, pad, out_pad), 1e-4)
  ct1 = nn.ConvTranspose1d(3, 2, 3, stride=2)
  x1 = randn(1, 3, 5)
  close(ct1(Tensor(x1)).numpy(), conv_t_ref(x1, ct1.weight.numpy(), ct1.bias.numpy(), 2), 1e-4)


def test_embedding():
  emb = nn.Embedding(10, 3)
  w = randn(10, 3)
  set_(emb.weight, w)
  idx = np.array([[1, 2, 9], [0, 0, 4]])
  close(emb(Tensor(idx)).numpy(), w[idx])
  with pytest.raises(TypeError, match="integer"): emb(Tensor([1.0, 2.0]))


def test_lstm_cell():
  cell = nn.LSTMCell(3, 4)
  wi, wh, bi, bh = randn(16, 3), randn(16, 4), randn(16), randn(16)
  for t, a in [(cell.weight_ih, wi), (cell.weight_hh, wh), (cell.bias_ih, bi), (cell.bias_hh, bh)]: set_(t, a)
  x, h0, c0 = randn(2, 3), randn(2, 4), randn(2, 4)
  def sig(v): return 1 / (1 + np.exp(-v))
  def ref(h, c):
    gi, gf, gg, go = np.split(x @ wi.T + bi + h @ wh.T + bh, 4, axis=1)
    c2 = sig(gf) * c + sig(gi) * np.tanh(gg)
    return sig(go) * np.tanh(c2), c2
  for hc, (hr, cr) in [((Tensor(h0), Tensor(c0)), ref(h0, c0)), (None, ref(np.zeros((2, 4)), np.zeros((2, 4))))]:
    h, c = cell(Tensor(x), hc)
    close(h.numpy(), hr); close(c.numpy(), cr)


def test_dropout_module():
  x = Tensor(np.ones((64, 64), np.float32))
  d = nn.Dropout(0.25)
  close(d(x).numpy(), np.ones((64, 64)))   # eval mode: the identity
  with Tensor.train():
    out = d(x).numpy()
  assert np.all((out == 0) | np.isclose(out, 1 / 0.75)) and 0.18 < (out == 0).mean() < 0.32
  with pytest.raises(ValueError, match="out of range"): nn.Dropout(1.5)


# *** norms ***

def test_batchnorm_train_eval_and_running_stats():
  bn = nn.BatchNorm2d(3, momentum=0.2)
  assert nn.BatchNorm is nn.BatchNorm2d is nn.BatchNorm3d
  w, b = randn(3), randn(3)
  set_(bn.weight, w); set_(bn.bias, b)
  rm, rv = np.zeros(3), np.ones(3)
  with Tensor.train():
    for _ in range(3):
      x = randn(4, 3, 2, 5) * 2 + 1
      out = bn(Tensor(x))
      mean, var = x.mean(axis=(0, 2, 3)), x.var(axis=(0, 2, 3))
      want = (x - mean.reshape(1, 3, 1, 1)) / np.sqrt(var.reshape(1, 3, 1, 1) + 1e-5) * w.reshape(1, 3, 1, 1) + b.reshape(1, 3, 1, 1)
      close(out.numpy(), want, 1e-4)
      Tensor.realize(bn.running_mean, bn.running_var, bn.num_batches_tracked)  # (an optimizer step realizes them)
      n = x.size // 3
      rm, rv = 0.8 * rm + 0.2 * mean, 0.8 * rv + 0.2 * var * n / (n - 1)
      close(bn.running_mean.numpy(), rm, 1e-5); close(bn.running_var.numpy(), rv, 1e-5)
  assert bn.num_batches_tracked.item() == 3 and bn.num_batches_tracked.dtype is dtypes.int64
  x = randn(2, 3, 2, 2)
  want = (x - rm.reshape(1, 3, 1, 1)) / np.sqrt(rv.reshape(1, 3, 1, 1) + 1e-5) * w.reshape(1, 3, 1, 1) + b.reshape(1, 3, 1, 1)
  close(bn(Tensor(x)).numpy(), want, 1e-4)   # eval: the running statistics, which stay as they were
  close(bn.running_mean.numpy(), rm, 1e-5)
  assert bn.running_mean.requires_grad is False and bn.running_var.requires_grad is False


def test_batchnorm_options_and_errors():
  bn = nn.BatchNorm(2, affine=False, track_running_stats=False)
  assert bn.weight is None and not hasattr(bn, "running_mean")
  x = randn(5, 2)
  close(bn(Tensor(x)).numpy(), norm_ref(x, (0,), 1e-5), 1e-4)   # no running stats: batch statistics in eval too
  with pytest.raises(ValueError, match="3 channels"): nn.BatchNorm(3)(Tensor(randn(2, 4, 2)))


def test_layernorm_and_layernorm2d():
  ln = nn.LayerNorm((2, 3), eps=1e-3)
  w, b, x = randn(2, 3), randn(2, 3), randn(4, 2, 3)
  set_(ln.weight, w); set_(ln.bias, b)
  close(ln(Tensor(x)).numpy(), norm_ref(x, (-2, -1), 1e-3) * w + b, 1e-4)
  with pytest.raises(ValueError, match=r"\(2, 3\)"): ln(Tensor(randn(4, 3, 2)))
  assert nn.LayerNorm(3, elementwise_affine=False).weight is None
  ln2 = nn.LayerNorm2d(3)
  x4 = randn(2, 3, 4, 5)
  close(ln2(Tensor(x4)).numpy(), norm_ref(x4, (1,), 1e-5), 1e-4)


def test_group_and_instance_norm():
  gn = nn.GroupNorm(2, 4)
  w, b, x = randn(4), randn(4), randn(3, 4, 5)
  set_(gn.weight, w); set_(gn.bias, b)
  want = norm_ref(x.reshape(3, 2, 10), (2,), 1e-5).reshape(3, 4, 5) * w.reshape(1, 4, 1) + b.reshape(1, 4, 1)
  close(gn(Tensor(x)).numpy(), want, 1e-4)
  with pytest.raises(ValueError, match="num_groups"): nn.GroupNorm(3, 4)
  inn = nn.InstanceNorm(4)
  x4 = randn(2, 4, 3, 3)
  close(inn(Tensor(x4)).numpy(), norm_ref(x4, (2, 3), 1e-5), 1e-4)


def test_rmsnorm():
  rn = nn.RMSNorm(5)
  w, x = randn(5), randn(3, 5)
  set_(rn.weight, w)
  close(rn(Tensor(x)).numpy(), x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * w)
  xh = x.astype(np.float16)
  out = nn.RMSNorm(5, elementwise_affine=False)(Tensor(xh))
  assert out.dtype is dtypes.float16
  close(out.numpy(), xh.astype(np.float32) / np.sqrt((xh.astype(np.float32) ** 2).mean(-1, keepdims=True) + 1e-6), 2e-3)


def test_module_gradients_reach_parameters():
  # a conv -> batchnorm -> linear stack: every parameter gets a gradient of its shape
  conv, bn, lin = nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3), nn.Linear(12, 2)
  with Tensor.train():
    out = lin(bn(conv(Tensor(randn(2, 2, 4, 4)))).relu().reshape(2, -1))
    out.sum().backward()
  for t in (conv.weight, conv.bias, bn.weight, bn.bias, lin.weight, lin.bias):
    assert t.grad is not None and t.grad.shape == t.shape
  # the bias of the linear gets the batch size
  close(lin.bias.grad.numpy(), np.full(2, 2.0))
  assert bn.running_mean.grad is None
