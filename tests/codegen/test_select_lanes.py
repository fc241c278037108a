"""Stacks, cats and interleavings of computed pieces along small axes: the optimizer puts the picking range in lanes
(codegen/opt/choose.py select_lanes) so each lane computes only its own piece. Values against numpy on the CPU and
the CL device, for random pieces, axes and sizes, and the lanes the kernels get."""
from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rulec import Tensor
from rulec.codegen.decomp import decomposed
from rulec.codegen.opt.choose import SELECT_LANES, select_lanes
from rulec.runtime import cpu_device

EXAMPLES = max(2, int(16 * float(os.environ.get("RULEC_TENSOR_EXAMPLES", "1"))))

# (tensor op, numpy op) pairs a piece is made of
PIECES = [(lambda t: t * 2, lambda a: a * 2), (lambda t: t + 1, lambda a: a + 1), (lambda t: -t, lambda a: -a),
          (lambda t: t * t - 3, lambda a: a * a - 3), (lambda t: t.exp(), np.exp), (lambda t: t / 4, lambda a: a / 4),
          (lambda t: t.maximum(0), lambda a: np.maximum(a, 0)), (lambda t: t.flip(-1), lambda a: a[..., ::-1])]


def _devices():
  out = ["CPU"]
  try:
    from rulec.runtime import cl_device
    cl_device.get_device()
    out.append("CL")
  except Exception: pass
  return out


def _lanes(t: Tensor) -> list:
  (k,) = t.schedule()
  return select_lanes(decomposed(k, cpu_device.optional_decompositions()).ast.src[0])


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(_devices()), st.lists(st.integers(0, len(PIECES) - 1), min_size=2, max_size=8),
       st.sampled_from(["stack", "cat", "interleave"]), st.integers(0, 2), st.integers(0, 2**16))
def test_pieces_picked_by_a_small_axis_agree_with_numpy(device, picks, how, axis, seed):
  rng = np.random.default_rng(seed)
  a = rng.standard_normal((3, 5, 8)).astype(np.float32)
  t = Tensor(a, device=device)
  tp = [PIECES[i][0](t) for i in picks]
  npp = [PIECES[i][1](a) for i in picks]
  if how == "stack":
    got, want = tp[0].stack(*tp[1:], dim=axis), np.stack(npp, axis)
  elif how == "cat":   # pieces of 1 or 2 along the axis
    cut = [p[(slice(None),) * axis + (slice(0, 1 + i % 2),)] for i, p in enumerate(tp)]
    ncut = [p[(slice(None),) * axis + (slice(0, 1 + i % 2),)] for i, p in enumerate(npp)]
    got, want = cut[0].cat(*cut[1:], dim=axis), np.concatenate(ncut, axis)
  else:   # the pieces side by side in the last axis, element by element
    got = tp[0].stack(*tp[1:], dim=-1).reshape(3, 5, 8 * len(tp))
    want = np.stack(npp, -1).reshape(3, 5, 8 * len(npp))
  np.testing.assert_allclose(got.numpy(), want, rtol=2e-6, atol=1e-6)


def test_the_lanes_each_form_takes():
  t = Tensor(np.random.default_rng(0).standard_normal((6, 40)).astype(np.float32))
  assert [(x.op, x.amount) for x in _lanes((t * 2).stack(t + 1, t.exp(), -t))] == [("UPCAST", 4)]
  assert [(x.op, x.amount) for x in _lanes((t * 2).stack(t - 1, dim=-1).reshape(6, 80))] == [("UPCAST", 2)]
  # more pieces than SELECT_LANES: a loop as before
  many = [t + i for i in range(SELECT_LANES + 1)]
  assert _lanes(many[0].stack(*many[1:])) == []
  # a plain elementwise kernel, and one whose only compare is a bounds guard of a long range, get none
  assert _lanes(t * 2 + 1) == [] and _lanes(t.pad(((0, 0), (1, 1))) * 3) == []


@pytest.mark.parametrize("device", _devices())
def test_a_cat_along_a_long_axis_stays_a_loop_and_agrees(device):
  a = np.arange(2 * 300, dtype=np.float32).reshape(2, 300)
  t = Tensor(a, device=device)
  c = (t * 2).cat(t + 1, dim=1)
  assert _lanes(c) == []
  np.testing.assert_allclose(c.numpy(), np.concatenate([a * 2, a + 1], 1))
