"""Hand-written numpy forward and backward passes for tests/frontend/test_autograd.py: a 2-layer MLP and a small CNN,
both ending in softmax cross entropy (mean over the batch). Everything is computed in the dtype of the inputs.

Conventions follow tinygrad: relu's gradient is 0 for negative inputs (inputs here never hit 0 exactly), and a
max-pool window whose maximum is tied sends the gradient to the tied elements in equal parts."""
from __future__ import annotations

import numpy as np


def log_softmax(z: np.ndarray) -> np.ndarray:
  s = z - z.max(axis=1, keepdims=True)
  return s - np.log(np.exp(s).sum(axis=1, keepdims=True))


def cross_entropy_backward(logits: np.ndarray, onehot: np.ndarray) -> tuple[float, np.ndarray]:
  """mean over the batch of -sum(onehot * log_softmax(logits)), and its gradient w.r.t. the logits."""
  n = logits.shape[0]
  lp = log_softmax(logits)
  loss = -(lp * onehot).sum() / n
  return loss, (np.exp(lp) - onehot) / n


def mlp_forward_backward(x, w1, b1, w2, b2, onehot) -> tuple[float, dict[str, np.ndarray]]:
  """h = relu(x @ w1 + b1); logits = h @ w2 + b2; loss = cross entropy. Returns the loss and its gradients."""
  pre = x @ w1 + b1
  h = np.maximum(pre, 0)
  logits = h @ w2 + b2
  loss, dlogits = cross_entropy_backward(logits, onehot)
  dw2 = h.T @ dlogits
  db2 = dlogits.sum(0)
  dh = dlogits @ w2.T
  dpre = dh * (pre > 0)
  return loss, {"x": dpre @ w1.T, "w1": x.T @ dpre, "b1": dpre.sum(0), "w2": dw2, "b2": db2}


def _windows(xp: np.ndarray, kh: int, kw: int, stride: int) -> np.ndarray:
  """(N, C, OH, OW, kh, kw) windows of an (N, C, H, W) array."""
  n, c, h, w = xp.shape
  oh, ow = (h - kh) // stride + 1, (w - kw) // stride + 1
  out = np.empty((n, c, oh, ow, kh, kw), xp.dtype)
  for i in range(kh):
    for j in range(kw):
      out[..., i, j] = xp[:, :, i:i + stride * oh:stride, j:j + stride * ow:stride]
  return out


def conv2d_forward(x, w, b, pad: int):
  """Cross-correlation, stride 1, zero padding `pad` on every side; x (N, C, H, W), w (F, C, kh, kw), b (F,)."""
  xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
  win = _windows(xp, w.shape[2], w.shape[3], 1)       # N C OH OW kh kw
  return np.einsum("ncyxij,fcij->nfyx", win, w) + b[None, :, None, None], win


def conv2d_backward(dout, x, w, win, pad: int):
  """Gradients of conv2d_forward w.r.t. x, w and b given dout (N, F, OH, OW)."""
  dw = np.einsum("nfyx,ncyxij->fcij", dout, win)
  db = dout.sum((0, 2, 3))
  kh, kw = w.shape[2:]
  n, c, h, wd = x.shape
  dxp = np.zeros((n, c, h + 2 * pad, wd + 2 * pad), x.dtype)
  oh, ow = dout.shape[2:]
  contrib = np.einsum("nfyx,fcij->ncyxij", dout, w)
  for i in range(kh):
    for j in range(kw):
      dxp[:, :, i:i + oh, j:j + ow] += contrib[..., i, j]
  return dxp[:, :, pad:pad + h, pad:pad + wd], dw, db


def maxpool2_forward(a):
  """2x2 max pool, stride 2 (H and W even)."""
  n, c, h, w = a.shape
  r = a.reshape(n, c, h // 2, 2, w // 2, 2)
  return r.max(axis=(3, 5))


def maxpool2_backward(dout, a):
  """Ties in a window share the gradient equally (tinygrad's convention)."""
  n, c, h, w = a.shape
  r = a.reshape(n, c, h // 2, 2, w // 2, 2)
  m = r.max(axis=(3, 5), keepdims=True)
  mask = (r == m).astype(a.dtype)
  mask /= mask.sum(axis=(3, 5), keepdims=True)
  return (mask * dout[:, :, :, None, :, None]).reshape(a.shape)


def cnn_forward_backward(x, wc, bc, wl, bl, onehot, pad: int = 1) -> tuple[float, dict[str, np.ndarray]]:
  """conv2d(x, wc, bc, padding=pad) -> relu -> max_pool2d(2) -> flatten -> @ wl + bl -> cross entropy."""
  conv, win = conv2d_forward(x, wc, bc, pad)
  act = np.maximum(conv, 0)
  pooled = maxpool2_forward(act)
  flat = pooled.reshape(pooled.shape[0], -1)
  logits = flat @ wl + bl
  loss, dlogits = cross_entropy_backward(logits, onehot)
  dwl, dbl = flat.T @ dlogits, dlogits.sum(0)
  dpooled = (dlogits @ wl.T).reshape(pooled.shape)
  dact = maxpool2_backward(dpooled, act)
  dconv = dact * (conv > 0)
  dx, dwc, dbc = conv2d_backward(dconv, x, wc, win, pad)
  return loss, {"x": dx, "wc": dwc, "bc": dbc, "wl": dwl, "bl": dbl}
