"""Winograd's F(2x2, 3x3) convolution (engine/tensor/winograd.py): the values and both gradients against the direct
convolution and a float64 numpy reference, which convolutions take it, its kernels, and the small-range lanes
(codegen/opt/choose.py select_lanes) that keep its transforms from computing all 16 pieces of every element."""
from __future__ import annotations

import os
from contextlib import contextmanager

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rulec import Tensor
from rulec.codegen.decomp import decomposed
from rulec.codegen.opt.choose import cpu_actions, select_lanes
from rulec.engine.ir.ops import Ops
from rulec.engine.tensor import winograd
from rulec.runtime import cpu_device
from rulec.runtime.devices import default_device, winograd_convs

EXAMPLES = max(1, int(8 * float(os.environ.get("RULEC_TENSOR_EXAMPLES", "1"))))


@contextmanager
def winograd_set(flag: str):
  old = os.environ.get("RULEC_WINOGRAD")
  os.environ["RULEC_WINOGRAD"] = flag
  try: yield
  finally:
    if old is None: os.environ.pop("RULEC_WINOGRAD")
    else: os.environ["RULEC_WINOGRAD"] = old


def np_conv(x, w, pads):
  """The cross-correlation in float64, tap by tap; pads ((top, bottom), (left, right))."""
  (pt, pb), (pl, pr) = pads
  xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
  ho, wo = xp.shape[2] - 2, xp.shape[3] - 2
  out = np.zeros((x.shape[0], w.shape[0], ho, wo))
  for i in range(3):
    for j in range(3):
      out += np.einsum("nchw,oc->nohw", xp[:, :, i:i + ho, j:j + wo], w[:, :, i, j].astype(np.float64))
  return out


def _run(x, w, b, g, padding, flag):
  with winograd_set(flag):
    tx, tw = Tensor(x, requires_grad=True), Tensor(w, requires_grad=True)
    tb = None if b is None else Tensor(b, requires_grad=True)
    y = tx.conv2d(tw, tb, padding=padding)
    (y * Tensor(g)).sum().backward()
    return y.numpy(), tx.grad.numpy(), tw.grad.numpy(), None if b is None else tb.grad.numpy()


@settings(max_examples=EXAMPLES)
@given(st.integers(1, 2), st.sampled_from([16, 19]), st.sampled_from([16, 21]), st.integers(8, 13), st.integers(8, 12),
       st.sampled_from([0, 1, 2, (1, 0, 2, 1), (0, 2, 1, 0)]), st.booleans(), st.integers(0, 2**16))
def test_winograd_agrees_with_the_direct_convolution_and_its_gradients(n, c, o, h, wd, padding, bias, seed):
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((n, c, h, wd)).astype(np.float32)
  w = rng.standard_normal((o, c, 3, 3)).astype(np.float32)
  b = rng.standard_normal(o).astype(np.float32) if bias else None
  pads = [(padding, padding)] * 2 if isinstance(padding, int) else [(padding[2], padding[3]), (padding[0], padding[1])]
  ho, wo = h + sum(pads[0]) - 2, wd + sum(pads[1]) - 2
  g = rng.standard_normal((n, o, ho, wo)).astype(np.float32)
  direct, wino = _run(x, w, b, g, padding, "0"), _run(x, w, b, g, padding, "1")
  want = np_conv(x, w, pads) + (0 if b is None else b.reshape(1, -1, 1, 1))
  scale = np.abs(want).max()
  np.testing.assert_allclose(wino[0], want, atol=2e-6 * scale * c, rtol=0)
  for got, ref in zip(wino, direct):
    if ref is None: continue
    np.testing.assert_allclose(got, ref, atol=2e-6 * np.abs(ref).max() * c, rtol=0)


def test_which_convolutions_take_it():
  ok = dict(ks=(3, 3), stride=(1, 1), dilation=(1, 1), groups=1, channels=16, outputs=16, out_hw=(8, 8), is_float32=True)
  assert winograd.fits(**ok)
  for change in [dict(ks=(5, 5)), dict(ks=(3, 3, 3)), dict(stride=(2, 2)), dict(dilation=(2, 1)), dict(groups=2),
                 dict(channels=8), dict(outputs=4), dict(out_hw=(7, 30)), dict(is_float32=False)]:
    assert not winograd.fits(**{**ok, **change}), change


def test_it_is_off_unless_asked_for(monkeypatch):
  monkeypatch.delenv("RULEC_WINOGRAD", raising=False)
  # (no faster on the H100 and slower on the CPU: runtime/devices.py)
  assert not any(winograd_convs(d) for d in ("CPU", "NUMPY", "CL"))
  monkeypatch.setenv("RULEC_WINOGRAD", "1")
  assert winograd_convs("CPU")
  monkeypatch.setenv("RULEC_WINOGRAD", "0")
  assert not winograd_convs("CPU")


def _kernels(flag, dtype=np.float32, **kw):
  with winograd_set(flag):
    x, w = Tensor.empty(2, 16, 12, 12, dtype=dtype), Tensor.empty(16, 16, 3, 3, dtype=dtype)
    return x.conv2d(w, padding=1, **kw).relu().schedule()


@pytest.mark.skipif(default_device() != "CPU", reason="kernel shapes and CPU actions of the CPU device")
def test_its_kernels_are_the_transforms_around_one_batched_matmul():
  assert len(_kernels("0")) == 1
  ks = _kernels("1")
  assert len(ks) == 4
  sums = [k for k in ks if any(u.op is Ops.REDUCE for u in k.ast.toposort())]
  # the one reduction: 16 matmuls of (O x C) @ (C x P), P = 2 images x 6 x 6 tiles
  assert len(sums) == 1 and tuple(r.src[0].arg for r in sums[0].ast.ranges) == (16, 16, 72, 16)
  # the transforms pick one of 16 (or 4) pieces per element by a small range: that range is in lanes
  lanes = [cpu_actions(decomposed(k, cpu_device.optional_decompositions())) for k in ks if k not in sums]
  assert all(any(a.op == "UPCAST" for a in acts) for acts in lanes), lanes
  # a stride-2 convolution, float16 or a 5x5 filter stays direct (one kernel)
  assert len(_kernels("1", stride=2)) == 1 and len(_kernels("1", dtype=np.float16)) == 1


def test_a_stack_of_pieces_takes_its_small_range_in_lanes_and_agrees_with_numpy():
  rng = np.random.default_rng(1)
  a = rng.standard_normal((6, 40)).astype(np.float32)
  t = Tensor(a)
  pieces = [t * 2, t + 1, (t * t) - 3, t.exp(), -t, t / 4]
  s = pieces[0].stack(*pieces[1:])
  (k,) = s.schedule()
  acts = select_lanes(decomposed(k, cpu_device.optional_decompositions()).ast.src[0])
  assert [(x.op, x.amount) for x in acts] == [("UPCAST", 6)]
  want = np.stack([a * 2, a + 1, a * a - 3, np.exp(a), -a, a / 4])
  np.testing.assert_allclose(s.numpy(), want, rtol=2e-6, atol=1e-6)
  # interleaved (r % 2 picks the piece): two lanes
  inter = (t * 2).stack(t - 1, dim=-1).reshape(6, 80)
  (k,) = inter.schedule()
  acts = select_lanes(decomposed(k, cpu_device.optional_decompositions()).ast.src[0])
  assert [(x.op, x.amount) for x in acts] == [("UPCAST", 2)]
  np.testing.assert_allclose(inter.numpy(), np.stack([a * 2, a - 1], -1).reshape(6, 80), rtol=1e-6)


@pytest.mark.skipif(default_device() != "CPU", reason="kernel counts of the CPU device")
def test_tinygrads_wino_flag_turns_it_on_for_its_block(monkeypatch):
  from rulec.helpers import Context
  monkeypatch.delenv("RULEC_WINOGRAD", raising=False)
  x, w = Tensor.empty(2, 16, 12, 12), Tensor.empty(16, 16, 3, 3)
  with Context(WINO=1):
    assert len(x.conv2d(w, padding=1).schedule()) == 4
  assert "RULEC_WINOGRAD" not in os.environ and len(x.conv2d(w, padding=1).schedule()) == 1
