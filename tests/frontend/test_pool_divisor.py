"""avg_pool2d divides by the window's size when every window counts all its cells (no ceil_mode cells; padding
counts, or there is none): one kernel, the mean an epilogue of the sum (EfficientNet's squeeze-excite pool was a
kernel for the sum and one for a sum of ones). Other cases keep the counted divisor. Values against numpy."""
from __future__ import annotations

import numpy as np
import pytest

from rulec import Tensor
from rulec.engine.ir.ops import Ops


def np_avg_pool(x, k, s, pad, include_pad):
  n, c, h, w = x.shape
  xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
  ones = np.pad(np.ones((h, w)), pad, constant_values=1.0 if include_pad else 0.0)
  oh, ow = (h + 2 * pad - k) // s + 1, (w + 2 * pad - k) // s + 1
  out = np.zeros((n, c, oh, ow))
  for i in range(oh):
    for j in range(ow):
      win = xp[:, :, i * s:i * s + k, j * s:j * s + k]
      out[:, :, i, j] = win.sum((2, 3)) / ones[i * s:i * s + k, j * s:j * s + k].sum()
  return out


@pytest.mark.parametrize("k,s,pad,include_pad", [(2, 2, 0, True), (3, 1, 1, True), (3, 2, 1, False), (8, 8, 0, False)])
def test_avg_pool_values_and_kernels(k, s, pad, include_pad):
  x = np.random.default_rng(k * 10 + s).standard_normal((2, 3, 8, 8)).astype(np.float32)
  t = Tensor(x).avg_pool2d(k, s, padding=pad, count_include_pad=include_pad)
  np.testing.assert_allclose(t.numpy(), np_avg_pool(x, k, s, pad, include_pad), rtol=1e-5, atol=1e-6)
  ks = Tensor(x).avg_pool2d(k, s, padding=pad, count_include_pad=include_pad).schedule()
  # (the counted divisor is a sum over the window of a value that reads no buffer: ones, or ones where cells count)
  counted = any(u.op is Ops.REDUCE and not any(v.op is Ops.INDEX for v in u.src[0].toposort()) for kk in ks
                for u in kk.ast.toposort())
  assert len(ks) == 1 and counted == (not include_pad and pad > 0)   # (a sum of ones only where cells differ)
