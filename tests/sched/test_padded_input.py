"""A convolution's padded input is stored padded when checking the padding on every read costs more than a kernel
that writes it once (rules/fusion.rules `store_padded_input`, fact `ctx.guards`), and the CPU's register tile for
its 56-wide rows fills whole registers (codegen/opt/choose.py `tile_ranges`). Counted in kernels and checked
against numpy, never timed."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from rulec import Tensor
from rulec.codegen.decomp import decomposed
from rulec.codegen.opt.choose import CPUTarget, cpu_actions
from rulec.engine.ir.ops import Ops
from rulec.engine.sched import cache as schedule_cache


def np_conv(a, w, pad):
  p = np.pad(a, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
  kh, kw = w.shape[2:]
  win = np.lib.stride_tricks.sliding_window_view(p, (kh, kw), axis=(2, 3))
  return np.einsum("nchwij,ocij->nohw", win.astype(np.float64), w.astype(np.float64))


def guarded(k) -> bool:
  return any(u.op is Ops.WHERE for u in k.ast.toposort())


@pytest.mark.parametrize("device", ["CPU", "NUMPY"])
def test_a_big_convolution_reads_its_input_padded_with_no_guard(device):
  schedule_cache.clear()
  rng = np.random.default_rng(0)
  a = rng.standard_normal((4, 64, 16, 16)).astype(np.float32)
  w = (rng.standard_normal((32, 64, 3, 3)) * 0.1).astype(np.float32)
  y = Tensor(a, device=device).conv2d(Tensor(w, device=device), padding=1)
  ks = y.schedule()
  assert len(ks) == 2, ks
  pad, conv = ks
  assert "ranges (4, 64, 18, 18)" in repr(pad) and guarded(pad)
  assert not guarded(conv), conv.ast   # every read of the stored padded input is in bounds
  np.testing.assert_allclose(y.numpy(), np_conv(a, w, 1), rtol=1e-4, atol=1e-4)


def test_on_the_cl_device_the_big_convolution_keeps_its_guards(cl_dev, monkeypatch):
  # a GPU's work-item predicates its guard: the stored padded copy cost more than the guards on an H100 (the ResNet
  # block 1.97 -> 2.30 ms), so ctx.lane_guards is false on CL and the same convolution stays one guarded kernel
  # (the direct convolution, whatever RULEC_WINOGRAD the run has: engine/tensor/winograd.py)
  monkeypatch.setenv("RULEC_WINOGRAD", "0")
  schedule_cache.clear()
  rng = np.random.default_rng(0)
  a = rng.standard_normal((4, 64, 16, 16)).astype(np.float32)
  w = (rng.standard_normal((32, 64, 3, 3)) * 0.1).astype(np.float32)
  y = Tensor(a, device="CL").conv2d(Tensor(w, device="CL"), padding=1)
  (k,) = y.schedule()
  assert guarded(k)
  np.testing.assert_allclose(y.numpy(), np_conv(a, w, 1), rtol=1e-4, atol=1e-4)


def test_a_small_convolution_keeps_its_guards():
  # 8 x 3 x 32 x 32 (bench/schedule.py's conv block): the checks cost less than a kernel's launch
  schedule_cache.clear()
  x, w = Tensor.empty(8, 3, 32, 32), Tensor.empty(16, 3, 3, 3)
  (k,) = x.conv2d(w, padding=1).schedule()
  assert guarded(k)


def test_a_pad_read_once_is_not_stored():
  schedule_cache.clear()
  a = np.arange(4 * 64 * 16 * 16, dtype=np.float32).reshape(4, 64, 16, 16) % 7
  y = Tensor(a).pad(((0, 0), (0, 0), (1, 1), (1, 1))).sum(axis=(2, 3))
  assert len(y.schedule()) == 1
  np.testing.assert_array_equal(y.numpy(), a.sum(axis=(2, 3)))


@settings(max_examples=12, deadline=None)
@given(n=st.integers(1, 3), c=st.sampled_from([16, 48]), hw=st.integers(9, 20), o=st.sampled_from([8, 24]),
       k=st.sampled_from([1, 3, 5]), pad=st.integers(0, 2))
def test_convolutions_with_and_without_a_stored_padded_input_match_numpy(n, c, hw, o, k, pad):
  rng = np.random.default_rng(n * 1000 + c * 10 + hw)
  a = rng.standard_normal((n, c, hw, hw)).astype(np.float32)
  w = (rng.standard_normal((o, c, k, k)) * 0.2).astype(np.float32)
  got = Tensor(a).conv2d(Tensor(w), padding=pad).numpy()
  np.testing.assert_allclose(got, np_conv(a, w, pad), rtol=1e-4, atol=1e-4)


def test_the_cpu_tile_of_56_output_columns_fills_whole_registers():
  # 8 that divide 56 fill half of a 16-lane register each (112 lanes in all); 32, ragged, fill 64 but overlap; the
  # whole row fills 64 without overlap, in 6 rows of output channels (24 registers of accumulators)
  schedule_cache.clear()
  x, w = Tensor.empty(8, 64, 56, 56), Tensor.empty(64, 64, 3, 3)
  conv = x.conv2d(w, padding=1).schedule()[-1]
  acts = cpu_actions(decomposed(conv, ()), CPUTarget(lanes=16))
  ups = [(a.axis, a.amount) for a in acts if a.op == "UPCAST"]
  col = max(r.arg[0] for r in conv.ranges if r.arg[1] == "loop")   # the store's innermost range: output x
  assert (col, 56) in ups and len(ups) == 2 and ups[1][1] == 24 // 4, acts
  # on 8-lane registers, 8 columns are a whole register: the divisor stays
  acts8 = cpu_actions(decomposed(conv, ()), CPUTarget(lanes=8))
  assert (col, 8) in [(a.axis, a.amount) for a in acts8 if a.op == "UPCAST"], acts8


def test_a_slices_gradient_padded_to_several_times_its_size_is_not_stored():
  # q, k, v cut from one qkv (GPT-2): each gradient is padded to qkv's width, read by the weight gradient's matmul
  # on every trip. Stored, the pad's kernel computed attention's gradient (a reduce) untiled, two thirds of it zeros:
  # GPT-2's block backward 141 -> 690 ms on a 2-core CPU. Such a pad is mostly padding, and is left fused.
  schedule_cache.clear()
  rng = np.random.default_rng(1)
  T, C = 192, 256
  x = Tensor(rng.standard_normal((T, C)).astype(np.float32))
  w = Tensor((rng.standard_normal((C, 3 * C)) * 0.1).astype(np.float32), requires_grad=True)
  qkv = x @ w
  q, k, v = qkv[:, :C], qkv[:, C:2 * C], qkv[:, 2 * C:]
  out = (q @ k.T).softmax(-1) @ v
  out.sum().backward()
  kernels = w.grad.schedule()
  assert not any(f"ranges ({T}, {3 * C}, {T})" in repr(kk) for kk in kernels), kernels
  # the weight gradient against numpy (float64), through the three slices' gradients
  xn, wn = x.numpy().astype(np.float64), w.numpy().astype(np.float64)
  qn, kn, vn = xn @ wn[:, :C], xn @ wn[:, C:2 * C], xn @ wn[:, 2 * C:]
  s = qn @ kn.T
  p = np.exp(s - s.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
  dp = np.ones((T, C)) @ vn.T
  ds = p * (dp - (dp * p).sum(-1, keepdims=True))
  dq, dk, dv = ds @ kn, ds.T @ qn, p.T @ np.ones((T, C))
  want = xn.T @ np.concatenate([dq, dk, dv], axis=1)
  np.testing.assert_allclose(w.grad.numpy(), want, rtol=1e-3, atol=1e-4 * np.abs(want).max())


def test_a_weight_gradient_over_long_rows_sums_along_them_in_vector_lanes():
  # its input stored padded, every load of the weight gradient steps by one along the image's row: the column taps
  # by 8 output channels in lanes, the row's sum in vector lanes (SIMD); values against numpy
  schedule_cache.clear()
  rng = np.random.default_rng(2)
  x = rng.standard_normal((2, 16, 40, 40)).astype(np.float32)
  w = Tensor((rng.standard_normal((32, 16, 3, 3)) * 0.1).astype(np.float32), requires_grad=True)
  g = rng.standard_normal((2, 32, 40, 40)).astype(np.float32)
  Tensor(x).conv2d(w, padding=1).backward(Tensor(g))
  (k,) = [k for k in w.grad.schedule() if "ranges (32, 16, 3, 3" in repr(k)]
  low = decomposed(k, ())
  acts = cpu_actions(low, CPUTarget(lanes=16))
  inner = max(r.arg[0] for r in low.ranges if r.arg[1] == "reduce" and r.src[0].arg == 40)
  assert [a.op for a in acts] == ["UPCAST", "UPCAST", "SIMD", "THREAD"] and acts[2].axis == inner, acts
  assert acts[0].amount == 3 and acts[1].amount == 8, acts
  xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1))).astype(np.float64)
  want = np.einsum("nchwij,nohw->ocij", np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(2, 3)), g)
  np.testing.assert_allclose(w.grad.numpy(), want, rtol=1e-4, atol=1e-3)


@settings(max_examples=8, deadline=None)
@given(hw=st.sampled_from([5, 17, 40, 56]), c=st.sampled_from([3, 8]), poison=st.sampled_from([np.inf, -np.inf, np.nan]))
def test_a_convolutions_input_gradient_keeps_values_beyond_the_border_out_of_its_sums(hw, c, poison):
  # the input gradient sums where(inside, dy * w, 0) over the taps: the CPU adds dy * w where inside holds and keeps
  # the sum where not (a masked fma), so an inf or nan one column beyond the border (read, not added) changes
  # nothing, and where it is inside it propagates as numpy's does
  rng = np.random.default_rng(hw * 10 + c)
  a = rng.standard_normal((2, c, hw, hw)).astype(np.float32)
  w = (rng.standard_normal((c, c, 3, 3)) * 0.2).astype(np.float32)
  dy = rng.standard_normal((2, c, hw, hw)).astype(np.float32)
  dy[0, 0, hw // 2, 0] = poison   # read beyond the row's end by the taps of the row before
  def grad(device):
    x = Tensor(a, device=device, requires_grad=True)
    out = x.conv2d(Tensor(w, device=device), padding=1)
    (out * Tensor(dy, device=device)).sum().backward()
    return x.grad.numpy()
  np.testing.assert_allclose(grad("CPU"), grad("NUMPY"), rtol=1e-4, atol=1e-4)
