"""Host storage of buffers: aligned to a cache line (the CPU kernels' vector loads), and never the caller's array."""
from __future__ import annotations

import ml_dtypes  # noqa: F401  (registers np.dtype("bfloat16"))
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from rulec.engine.ir.dtypes import dtypes
from rulec.engine.tensor import Tensor
from rulec.runtime.buffer import ALIGN, buffer_of, host_array, new_buffer

DTYPES = [dtypes.bool, dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.float16, dtypes.int32, dtypes.float32,
          dtypes.int64, dtypes.float64]


@settings(max_examples=60, deadline=None)
@given(size=st.integers(0, 5000), dt=st.sampled_from(DTYPES), zero=st.booleans())
def test_host_array_is_aligned_and_sized(size, dt, zero):
  npdt = np.dtype(dt.np_name)
  a = host_array(size, npdt, zero=zero)   # (an empty array's address is numpy's to choose: nothing is loaded)
  assert (size == 0 or a.ctypes.data % ALIGN == 0) and a.shape == (size,) and a.dtype == npdt and a.flags.c_contiguous
  if zero: assert not a.any()
  a[:] = 1   # writable, and its own memory
  assert a.sum() == size


@pytest.mark.parametrize("dt", DTYPES)
def test_every_buffer_way_in_is_aligned(dt):
  npdt = np.dtype(dt.np_name)
  lazily = new_buffer("CPU", 37, dt)                       # allocated on first use
  copied = new_buffer("CPU", 37, dt)
  buffer_of(copied).copyin(np.arange(37).astype(npdt))     # numpy's own arrays are 16-byte aligned
  across = new_buffer("CPU", 37, dt)
  buffer_of(across).copy_from(buffer_of(copied))
  for b in (lazily, copied, across): assert buffer_of(b).host_view().ctypes.data % ALIGN == 0
  np.testing.assert_array_equal(buffer_of(across).host_view(), np.arange(37).astype(npdt))


def test_tensor_owns_a_copy_of_the_callers_array():
  for data in (np.ones(1000, np.float32), np.ones((8, 9), np.float64)[:, ::2], np.ones(5, np.int32)):
    t = Tensor(data)
    want = data.copy()
    data[...] = 7   # the caller changes their array after making the tensor
    np.testing.assert_array_equal(t.numpy(), want)
    np.testing.assert_array_equal((t + 1).numpy(), want + 1)


def test_copyin_casts_and_leaves_earlier_views_alone():
  b = new_buffer("CPU", 4, dtypes.float32)
  buffer_of(b).copyin(np.array([1.5, 2.5, -3.0, 4.0], np.float64))
  before = buffer_of(b).host_view()
  buffer_of(b).copyin(np.array([9, 9, 9, 9], np.int64))
  np.testing.assert_array_equal(before, [1.5, 2.5, -3.0, 4.0])
  np.testing.assert_array_equal(buffer_of(b).host_view(), [9, 9, 9, 9])
  assert buffer_of(b).host_view().dtype == np.float32
  with pytest.raises(ValueError, match="copyin of 3 elements into a buffer of 4"):
    buffer_of(b).copyin(np.zeros(3, np.float32))


def test_a_matmul_from_misaligned_arrays():
  # numpy arrays at every 16-byte offset from a cache line: the values must not depend on where they start
  rng = np.random.default_rng(3)
  raw = rng.standard_normal(70 * 33 + 64).astype(np.float32)
  for off in (0, 4, 8, 12):
    a = raw[off:off + 70 * 33].reshape(70, 33)
    b = raw[off + 5:off + 5 + 33 * 29].reshape(33, 29)
    np.testing.assert_allclose((Tensor(a) @ Tensor(b)).numpy(), a @ b, rtol=1e-4, atol=1e-4)
