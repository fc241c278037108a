"""Host buffers carry zeroed slack around their elements (runtime/buffer.py host_array), and on the CPU a guarded
load that may fall a little outside its buffer reads there (rules/decomp.rules slack_load) instead of being clamped
to element 0 lane by lane, which turned a register tile's neighbouring loads into a gather (a convolution's input
gradient: 23.7 -> 12.9 ms at 8x64x56x56 on a 2-core CPU). Checked against numpy; the IR's marks counted."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from rulec import Tensor
from rulec.codegen.decomp import LOAD_SLACK_BYTES, decomposed, load_slack
from rulec.engine.ir.ops import Ops
from rulec.runtime import cpu_device
from rulec.runtime.buffer import ALIGN, host_array


@settings(max_examples=40, deadline=None)
@given(size=st.integers(0, 5000), dtype=st.sampled_from(["float32", "float64", "int8", "float16", "bool", "int64"]),
       zero=st.booleans())
def test_host_arrays_are_aligned_with_zeroed_slack_on_both_sides(size, dtype, zero):
  dt = np.dtype(dtype)
  a = host_array(size, dt, zero=zero)
  assert a.size == size and a.dtype == dt
  if size == 0: return   # (no element to load, nor any slack)
  assert a.ctypes.data % ALIGN == 0
  slack = load_slack(size, dt.itemsize)
  assert slack == min(size, LOAD_SLACK_BYTES // dt.itemsize)
  base = a
  while base.base is not None: base = base.base   # the raw bytes the elements are a view of
  start = a.ctypes.data - base.ctypes.data
  assert start >= slack * dt.itemsize and base.size - start - size * dt.itemsize >= slack * dt.itemsize
  assert not base[:start].any() and not base[start + size * dt.itemsize:].any()


def _loads(x: Tensor, optional):
  k = x.schedule()[-1]
  return [u.arg for u in decomposed(k, optional).ast.toposort() if u.op is Ops.INDEX and u.arg != "store"]


def test_a_convolutions_guarded_loads_read_the_slack_on_the_cpu_only():
  rng = np.random.default_rng(0)
  x = Tensor(rng.standard_normal((2, 8, 12, 12)).astype(np.float32), requires_grad=True)
  w = Tensor(rng.standard_normal((8, 8, 3, 3)).astype(np.float32), requires_grad=True)
  g = Tensor(rng.standard_normal((2, 8, 12, 12)).astype(np.float32))
  (x.conv2d(w, padding=1) * g).sum().backward()
  cpu = _loads(x.grad, cpu_device.optional_decompositions())
  assert "slack" in cpu and "clamped" not in cpu
  other = _loads(x.grad, frozenset())   # (CL, NUMPY: no slack asked for)
  assert "clamped" in other and "slack" not in other
  # the input gradient: a full convolution of g with the flipped weights
  gp = np.pad(g.numpy().astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
  win = np.lib.stride_tricks.sliding_window_view(gp, (3, 3), axis=(2, 3))
  want = np.einsum("nohwij,ocij->nchw", win, w.numpy()[:, :, ::-1, ::-1].astype(np.float64))
  np.testing.assert_allclose(x.grad.numpy(), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("pad", [3, 2000])
def test_a_load_past_the_slack_is_still_clamped(pad):
  # a 1-D float32 buffer of 1000 has 1000 elements of slack: a pad of 2000 reads past it, one of 3 does not
  a = np.arange(1000, dtype=np.float32)
  y = Tensor(a).pad(((pad, pad),)) * 2 + 1
  loads = _loads(y, cpu_device.optional_decompositions())
  assert ("clamped" in loads) == (pad > 1000) and ("slack" in loads) == (pad <= 1000)
  np.testing.assert_array_equal(y.numpy(), np.pad(a, pad) * 2 + 1)
