"""codegen/opt/transform.py merged_reduce_ranges (every device, before the optimizer chooses): a reduction's
adjacent ranges that every load reads as one (outer * n + inner) become one range, which the GPU's staged matmul tile
and the CPU's KBLOCK take; ranges read otherwise (a convolution's padding guard, strides that do not agree) stay
apart. Values are numpy's either way."""
from __future__ import annotations

import numpy as np
import pytest

from rulec.codegen.opt.transform import merged_reduce_ranges
from rulec.engine.ir.ops import Ops
from rulec.engine.sched.driver import schedule
from rulec.engine.tensor import Tensor


def _reduce_ranges(kernel) -> list[int]:
  return [len(u.src) - 1 for u in kernel.ast.toposort() if u.op is Ops.REDUCE]


def test_a_weight_gradient_over_batch_and_sequence_is_one_sum():
  x, w, dy = Tensor.empty(4, 16, 8, device="CPU"), Tensor.empty(8, 12, requires_grad=True, device="CPU"), Tensor.empty(4, 16, 12, device="CPU")
  (g,) = (x @ w).gradient(w, gradient=dy)
  (k,), _ = schedule([g.uop], "CPU")
  assert _reduce_ranges(k) == [2]
  m = merged_reduce_ranges(k)
  assert _reduce_ranges(m) == [1]
  assert next(u for u in m.ast.toposort() if u.op is Ops.REDUCE).src[1].src[0].arg == 64


def test_ranges_a_guard_reads_stay_apart():
  x, w = Tensor.empty(2, 3, 8, 8, device="CPU"), Tensor.empty(4, 3, 3, 3, device="CPU")
  (k,), _ = schedule([x.conv2d(w, padding=1).uop], "CPU")
  m = merged_reduce_ranges(k)
  assert _reduce_ranges(m) == _reduce_ranges(k)   # the taps are read under the padding's WHERE


def test_strided_reads_merge_when_the_strides_agree_and_not_otherwise():
  x = Tensor.empty(6, 10, device="CPU")
  (k,), _ = schedule([x[:, ::2].sum().uop], "CPU")   # r0 * 10 + r1 * 2: one range of 30 by 2
  assert _reduce_ranges(merged_reduce_ranges(k)) == [1]
  (k,), _ = schedule([x[:, :4].sum().uop], "CPU")    # r0 * 10 + r1 (r1 < 4): not one stride
  assert _reduce_ranges(merged_reduce_ranges(k)) == [2]


@pytest.mark.parametrize("device", ["CPU", "CL"])
def test_values(device, request):
  if device == "CL": request.getfixturevalue("cl_dev")   # (skipped where there is no CL device)
  rng = np.random.default_rng(0)
  xn, dyn = rng.standard_normal((3, 20, 7)).astype(np.float32), rng.standard_normal((3, 20, 5)).astype(np.float32)
  x, dy = Tensor(xn, device=device), Tensor(dyn, device=device)
  got = (x.transpose(-1, -2) @ dy).sum(0).numpy()
  np.testing.assert_allclose(got, np.einsum("bti,bto->io", xn, dyn), rtol=1e-4, atol=1e-4)
  xs = rng.standard_normal((6, 10)).astype(np.float32)
  np.testing.assert_allclose(Tensor(xs, device=device)[:, ::2].sum().numpy(), xs[:, ::2].sum(), rtol=1e-5)
  np.testing.assert_allclose(Tensor(xs, device=device)[:, :4].sum().numpy(), xs[:, :4].sum(), rtol=1e-5)
  w = Tensor(rng.standard_normal((7, 5)).astype(np.float32), device=device, requires_grad=True)
  (x @ w).sum().backward()
  np.testing.assert_allclose(w.grad.numpy(), np.broadcast_to(xn.sum((0, 1))[:, None], (7, 5)), rtol=1e-4, atol=1e-4)
