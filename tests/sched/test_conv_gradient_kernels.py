"""A convolution's gradients, checked against a numpy reference, and the shape of the input gradient's kernel.

The input gradient reaches its window taps through the repeat trick's quotients and remainders (`(h + 16r + 1) % 17`
under `... < 14`). The symbolic rules make the guards and the load indices affine (where_affine, part by part when a
whole index spans too many points to evaluate at once), end the window sum at the taps the guards keep
(narrow_reduce) and make the nested sums one (merge_reduce): the kernel is then a forward convolution's loop nest."""
from __future__ import annotations

import os

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rulec import Tensor
from rulec.engine.ir.ops import Ops

EXAMPLES = int(os.environ.get("RULEC_CONV_GRAD_EXAMPLES", "12"))


def conv_grads_numpy(x, w, g, stride, padding, dilation):
  """dL/dx and dL/dw of sum(conv2d(x, w) * g), tap by tap."""
  n, c, h, wd = x.shape
  o, _, kh, kw = w.shape
  xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (padding, padding), (padding, padding)))
  oh, ow = g.shape[2:]
  dxp, dw = np.zeros_like(xp), np.zeros(w.shape)
  for i in range(kh):
    for j in range(kw):
      rows = slice(i * dilation, i * dilation + stride * (oh - 1) + 1, stride)
      cols = slice(j * dilation, j * dilation + stride * (ow - 1) + 1, stride)
      dw[:, :, i, j] = np.einsum("nohw,nchw->oc", g, xp[:, :, rows, cols])
      dxp[:, :, rows, cols] += np.einsum("nohw,oc->nchw", g, w[:, :, i, j])
  return dxp[:, :, padding:padding + h, padding:padding + wd], dw


def _grads(x, w, g, stride, padding, dilation):
  tx, tw = Tensor(x, requires_grad=True), Tensor(w, requires_grad=True)
  (tx.conv2d(tw, stride=stride, padding=padding, dilation=dilation) * Tensor(g)).sum().backward()
  return tx, tw


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.integers(1, 2), st.integers(1, 6), st.integers(1, 5), st.integers(5, 16), st.integers(1, 4),
       st.integers(1, 3), st.integers(0, 2), st.integers(1, 2), st.integers(0, 2**32 - 1))
def test_conv_gradients_match_numpy(n, c, o, size, k, stride, padding, dilation, seed):
  if (size + 2 * padding - dilation * (k - 1)) < 1: return   # (no output)
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((n, c, size, size)).astype(np.float32)
  w = rng.standard_normal((o, c, k, k)).astype(np.float32)
  out = (size + 2 * padding - dilation * (k - 1) - 1) // stride + 1
  g = rng.standard_normal((n, o, out, out)).astype(np.float32)
  tx, tw = _grads(x, w, g, stride, padding, dilation)
  dx, dw = conv_grads_numpy(x, w, g, stride, padding, dilation)
  np.testing.assert_allclose(tx.grad.numpy(), dx, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(tw.grad.numpy(), dw, rtol=1e-4, atol=1e-4)


def test_a_large_input_gradient_is_a_forward_convolutions_loop_nest():
  """At 16 channels and 14x14 a whole load-index term spans 50,176 points, past what is evaluated at once: its
  quotients and remainders are made affine one at a time. The kernel reads through affine indices, sums over a
  3x3 window (not the repeat trick's 4x4) in one reduce, and its values match."""
  rng = np.random.default_rng(3)
  x = rng.standard_normal((2, 16, 14, 14)).astype(np.float32)
  w = rng.standard_normal((16, 16, 3, 3)).astype(np.float32)
  g = rng.standard_normal((2, 16, 14, 14)).astype(np.float32)
  tx, tw = _grads(x, w, g, 1, 1, 1)
  (grad_in,) = [k for k in Tensor.schedule(tx.grad)]
  reds = [u for u in grad_in.ast.toposort() if u.op is Ops.REDUCE]
  assert len(reds) == 1 and sorted(r.src[0].arg for r in reds[0].src[1:]) == [3, 3, 16], reds
  loads = [u for u in grad_in.ast.toposort() if u.op is Ops.INDEX and u.src[0].op is Ops.PARAM and u.arg != "store"]
  assert len(loads) == 2
  for u in loads: assert not any(m.op in (Ops.IDIV, Ops.MOD) for m in u.src[1].toposort()), u.src[1]
  guards = [u for u in grad_in.ast.toposort() if u.op is Ops.WHERE]
  for u in guards: assert not any(m.op in (Ops.IDIV, Ops.MOD) for m in u.src[0].toposort()), u.src[0]
  dx, dw = conv_grads_numpy(x, w, g, 1, 1, 1)
  np.testing.assert_allclose(tx.grad.numpy(), dx, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(tw.grad.numpy(), dw, rtol=1e-4, atol=1e-4)


def test_a_guarded_sum_of_sums_is_one_sum_and_stops_at_its_guard():
  # pad(1, 1) guards the outer sum by 1 <= r < 4 over a range of 5: it ends at 4 and takes the inner sum's range
  x = np.arange(12, dtype=np.int32).reshape(3, 4)
  t = Tensor(x).sum(1).pad(((1, 1),)).sum()
  (kernel,) = t.schedule()
  reds = [u for u in kernel.ast.toposort() if u.op is Ops.REDUCE]
  assert len(reds) == 1 and sorted(r.src[0].arg for r in reds[0].src[1:]) == [4, 4], reds
  assert Tensor(x).sum(1).pad(((1, 1),)).sum().item() == x.sum()
  y = np.random.default_rng(0).standard_normal((5, 7)).astype(np.float32)
  m = Tensor(y).max(1).pad(((2, 0),), value=-np.inf).max()
  np.testing.assert_allclose(m.item(), y.max(1).max())
