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


def _kernel_shapes(kernels) -> list:
  """Each kernel's graph with its ranges renumbered in order (two schedules number them apart): equal graphs are
  the same node."""
  from rulec.engine.ir.rewrite import substitute
  from rulec.engine.sched.symbolic import _numbered
  out = []
  for k in kernels:
    rs = sorted({u for u in k.ast.toposort() if u.op is Ops.RANGE}, key=lambda r: r.arg[0])
    out.append(substitute(k.ast, {r: _numbered(r, i) for i, r in enumerate(rs)}))
  return out


def test_a_repeated_convolution_reuses_its_fitted_indices(monkeypatch):
  """Two same-shape convolutions of different inputs (a ResNet's repeated blocks) ask the symbolic rules the same
  index and guard questions over ranges numbered apart: the second is answered from the first's fitting
  (symbolic._Fitter.shaped, keyed by the question with its ranges renumbered). Counted as fitting work done, and the
  kernels and values are those of a schedule that fits every question afresh."""
  from rulec.engine.sched import symbolic
  from rulec.engine.sched import cache as schedule_cache
  rng = np.random.default_rng(5)
  xs = [rng.standard_normal((2, 4, 10, 10)).astype(np.float32) for _ in range(2)]
  w = rng.standard_normal((6, 4, 3, 3)).astype(np.float32)
  g = rng.standard_normal((2, 6, 5, 5)).astype(np.float32)
  work = {"n": 0}
  for name in ("simplified", "_guard"):
    real = getattr(symbolic._Fitter, name)
    def counted(self, *a, _real=real, **k):
      work["n"] += 1
      return _real(self, *a, **k)
    monkeypatch.setattr(symbolic._Fitter, name, counted)
  def run(shaped: bool):
    symbolic.forget_shapes()
    schedule_cache.clear()
    work["n"] = 0
    tx = [Tensor(x, requires_grad=True) for x in xs]
    tw = Tensor(w, requires_grad=True)
    loss = sum(((t.conv2d(tw, stride=2, padding=1) * Tensor(g)).sum() for t in tx), Tensor(0.0))
    grads = loss.gradient(*tx, tw)
    kernels = Tensor.schedule(*grads)
    return work["n"], _kernel_shapes(kernels), [t.numpy() for t in grads]
  with_memo = run(True)
  monkeypatch.setattr(symbolic._Fitter, "shaped", lambda self, kind, x, guards, work: work())
  without = run(False)
  assert 0 < with_memo[0] < without[0], (with_memo[0], without[0])
  assert len(with_memo[1]) == len(without[1]) and all(a is b for a, b in zip(with_memo[1], without[1]))
  for a, b in zip(with_memo[2], without[2]): np.testing.assert_array_equal(a, b)
  for x, got in zip(xs, with_memo[2][:2]):
    dx, _ = conv_grads_numpy(x, w, g, 2, 1, 1)
    np.testing.assert_allclose(got, dx, rtol=1e-4, atol=1e-4)
  _, dw0 = conv_grads_numpy(xs[0], w, g, 2, 1, 1)
  _, dw1 = conv_grads_numpy(xs[1], w, g, 2, 1, 1)
  np.testing.assert_allclose(with_memo[2][2], dw0 + dw1, rtol=1e-4, atol=1e-4)


def test_fitted_answers_are_reused_only_under_the_same_rules(monkeypatch, tmp_path):
  """The shape-keyed answers outlive a schedule (a second graph of the same program fits nothing again), but not a
  change of rules: a user's rules directory (RULEC_RULES) may change what the symbolic rules make of an index, so
  under another library every question is fitted afresh."""
  from rulec.engine.sched import symbolic
  from rulec.engine.sched import cache as schedule_cache
  rng = np.random.default_rng(9)
  x = rng.standard_normal((1, 3, 9, 9)).astype(np.float32)
  w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
  work = {"n": 0}
  real = symbolic._Fitter.simplified
  def counted(self, *a, **k):
    work["n"] += 1
    return real(self, *a, **k)
  monkeypatch.setattr(symbolic._Fitter, "simplified", counted)
  def fits():
    schedule_cache.clear()
    work["n"] = 0
    tx = Tensor(x, requires_grad=True)
    (dx,) = tx.conv2d(Tensor(w), stride=2, padding=1).square().sum().gradient(tx)
    Tensor.schedule(dx)
    return work["n"], dx
  symbolic.forget_shapes()
  cold, _ = fits()
  warm, _ = fits()
  mine = tmp_path / "mine"
  mine.mkdir()
  (mine / "extra.rules").write_text("ruleset symbolic extends symbolic:\n  rule keep_exp2: x:EXP2 => None\n")
  monkeypatch.setenv("RULEC_RULES", str(mine))
  other, dx = fits()
  assert cold > 0 and warm == 0 and other == cold, (cold, warm, other)
  want, _ = conv_grads_numpy(x, w, 2 * np.asarray(Tensor(x).conv2d(Tensor(w), stride=2, padding=1).numpy()), 2, 1, 1)
  np.testing.assert_allclose(dx.numpy(), want, rtol=1e-4, atol=1e-4)
