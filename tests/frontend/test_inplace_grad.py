"""Gradients through in-place writes (`+=`, `-=`, `*=`, `/=`, `assign`, writes through slices): every gradient
reads each value as it was when it was used, whenever the write is carried out (engine/tensor/inplace.py).

The property test draws short programs of writes into two tensors b and d (whole, through slices, through a
tensor index; values that read the tensor itself or the other one), values realized from them between the writes,
and the loss realized, printed or neither before the gradient is taken and after; each program runs in rulec
(float64) and in numpy doing the same steps eagerly: values against numpy, gradients against central finite
differences of the numpy program. The fixed cases are issue #32's item 7; each
failed before (a lost gradient, a wrong one, or a ValueError)."""
from __future__ import annotations

import gc
import operator

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import rulec
from rulec.engine.ir.dtypes import dtypes
from rulec.engine.tensor import Tensor

F64 = dtypes.float64
N = 4
SLICES = {"all": slice(None), "tail": slice(1, None), "head": slice(0, 2), "even": slice(None, None, 2),
          "mid": slice(1, 3), "index": [3, 0]}   # (the last: a tensor index, advanced setitem)
IOPS = {"+=": operator.iadd, "-=": operator.isub, "*=": operator.imul, "/=": operator.itruediv}
NPOPS = {"+=": operator.add, "-=": operator.sub, "*=": operator.mul, "/=": operator.truediv}


def T(a, **kw) -> Tensor:
  return Tensor(np.asarray(a, np.float64), dtype=F64, **kw)


# *** the programs ***

# operands of a write into one of the two written tensors ("self": that tensor, "other": the other one)
OPERANDS = ("y0", "y1", "y0*y1", "self*y0", "self*y1+y0", "other*y1", "const")
DIVISORS = ("y0", "y1", "y0*y1", "const")   # (away from 0: y is drawn from [0.5, 1.5])


@st.composite
def programs(draw):
  steps = []
  for _ in range(draw(st.integers(1, 5))):
    tgt = draw(st.sampled_from((0, 0, 1)))   # write into b (0) or d (1)
    kind = draw(st.sampled_from(("+=", "-=", "*=", "/=", "assign")))
    region = draw(st.sampled_from(tuple(SLICES)))
    # whole: the tensor's own operator (b += e, b.assign(e)); item: through a subscript (b[s] += e[s], b[s] = e[s],
    # setitem, carried out at once); view: through a view tensor that is dropped (v = b[s]; v += e[s], lazy). (A
    # view of all of b is b's own whole-buffer write, which lazy readers of b other than b itself do not see until
    # it is carried out: engine/tensor/writes.py. The eager numpy program has no such case, so it is not drawn.)
    if region == "all": via = draw(st.sampled_from(("whole", "item")))
    elif region == "index": via = "item"
    else: via = draw(st.sampled_from(("item", "view")))
    operand = draw(st.sampled_from(DIVISORS if kind == "/=" else OPERANDS))
    # then: nothing, realize the tensor, or realize a value read from it now (which keeps the value it has now)
    after = draw(st.sampled_from(("none", "none", "realize", "use")))
    steps.append((tgt, kind, region, via, operand, after, draw(st.integers(0, 1))))
  return {"init": (draw(st.sampled_from(("leaf", "realized", "lazy"))), draw(st.sampled_from(("leaf", "realized", "lazy")))),
          "steps": steps, "mode": draw(st.sampled_from(("gradient", "backward"))),
          "before": draw(st.sampled_from(("none", "realize", "item"))),   # the loss, before the gradient
          "after": draw(st.sampled_from(("none", "item", "b", "d")))}     # before the gradient is read


def _operand(name: str, me, other, y0, y1):
  if name == "const": return 2.0
  return {"y0": lambda: y0, "y1": lambda: y1, "y0*y1": lambda: y0 * y1, "self*y0": lambda: me * y0,
          "self*y1+y0": lambda: me * y1 + y0, "other*y1": lambda: other * y1}[name]()


def _weights():
  rng = np.random.default_rng(5)
  return [rng.uniform(-1, 1, N) for _ in range(4)], rng.uniform(-1, 1, (8, N))


def _start(kind: str, i: int, y0, y1, leaf):
  if kind == "leaf": return leaf(np.full(N, 0.5 + i) + 0.25 * np.arange(N))
  return y0 * 2 + 1 if i == 0 else y1 * 3 - 1


def _loss(ts, uses, weigh):
  (w1, w2, w3, w4), wu = _weights()
  b, d = ts
  loss = (b * weigh(w1)).sum() + 0.1 * (b * b * weigh(w2)).sum() + (d * weigh(w3)).sum() + 0.1 * (b * d * weigh(w4)).sum()
  for i, c in enumerate(uses): loss = loss + (c * weigh(wu[i])).sum()
  return loss


def run_numpy(prog, y0: np.ndarray, y1: np.ndarray):
  """The program done eagerly in float64: (loss, b and d at the end, the values read from them along the way)."""
  ts = [_start(k, i, y0, y1, np.asarray) for i, k in enumerate(prog["init"])]
  uses = []
  for tgt, kind, region, _, operand, after, k in prog["steps"]:
    s = SLICES[region]
    e = _operand(operand, ts[tgt], ts[1 - tgt], y0, y1)
    e = e if np.isscalar(e) else e[s]
    new = ts[tgt].copy()
    new[s] = e if kind == "assign" else NPOPS[kind](new[s], e)
    ts[tgt] = new
    if after == "use": uses.append(ts[tgt] * (y0, y1)[k])
  return _loss(ts, uses, lambda w: w), ts, uses


def run_rulec(prog, a0: np.ndarray, a1: np.ndarray):
  """The program in rulec, in the order it says: (loss value, d loss / d y0 and y1, b and d, the values read)."""
  y0, y1 = T(a0, requires_grad=True), T(a1, requires_grad=True)
  ts = [_start(k, i, y0, y1, T) for i, k in enumerate(prog["init"])]
  if prog["init"][0] == "realized": ts[0].realize()
  if prog["init"][1] == "realized": ts[1].realize()
  uses = []
  for tgt, kind, region, via, operand, after, k in prog["steps"]:
    s = Tensor(SLICES[region]) if region == "index" else SLICES[region]
    b = ts[tgt]
    e = _operand(operand, b, ts[1 - tgt], y0, y1)
    # (a write carried out later reads the other tensor as it is then, as in tinygrad; the eager program reads it
    # now, so the value is realized now unless the write is made at once)
    if operand == "other*y1" and via != "item": e = e.realize()
    es = e if isinstance(e, float) else e[s]
    if via == "whole":
      if kind == "assign": b.assign(e)
      else: ts[tgt] = IOPS[kind](b, e)
    elif via == "item":
      if kind == "assign": b[s] = es
      else:   # what Python runs for `b[s] += es`
        t = b[s]
        t = IOPS[kind](t, es)
        b[s] = t
    else:
      if b.uop.base.op.name not in ("BUFFER", "ASSIGN"): b.realize()   # (a view of a lazy value has no storage)
      v = b[s]
      if kind == "assign": v.assign(es)
      else: IOPS[kind](v, es)
      del v
    if after == "realize": ts[tgt].realize()
    elif after == "use": uses.append((ts[tgt] * (y0, y1)[k]).realize())
  loss = _loss(ts, uses, T)
  if prog["before"] == "realize": loss.realize()
  elif prog["before"] == "item": loss.item()
  if prog["mode"] == "gradient": g0, g1 = loss.gradient(y0, y1)
  else:
    loss.backward()
    g0, g1 = y0.grad, y1.grad
  if prog["after"] == "item": loss.item()
  elif prog["after"] in ("b", "d"): ts["bd".index(prog["after"])].realize()
  grads = [np.zeros(N) if g is None else g.numpy() for g in (g0, g1)]
  return loss.item(), grads, [t.numpy() for t in ts], [c.numpy() for c in uses]


def finite_differences(prog, a0, a1, eps=1e-6):
  out = []
  for i in range(2):
    fd = np.zeros(N)
    for j in range(N):
      p, m = [a0.copy(), a1.copy()], [a0.copy(), a1.copy()]
      p[i][j] += eps; m[i][j] -= eps
      fd[j] = (run_numpy(prog, *p)[0] - run_numpy(prog, *m)[0]) / (2 * eps)
    out.append(fd)
  return out


@settings(max_examples=60)
@given(programs(), st.integers(0, 2**31 - 1))
def test_programs_of_inplace_writes_match_numpy_and_finite_differences(prog, seed):
  rng = np.random.default_rng(seed)
  a0, a1 = rng.uniform(0.5, 1.5, N), rng.uniform(0.5, 1.5, N)
  loss, grads, ts, uses = run_rulec(prog, a0, a1)
  want_loss, want_ts, want_uses = run_numpy(prog, a0, a1)
  for got, want in zip(ts, want_ts): np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)
  for got, want in zip(uses, want_uses): np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)
  assert loss == pytest.approx(want_loss, rel=1e-10, abs=1e-10)
  for i, (got, fd) in enumerate(zip(grads, finite_differences(prog, a0, a1))):
    # (the differences lose digits in proportion to the largest values of the program)
    scale = max(1.0, float(np.abs(fd).max()), abs(want_loss))
    np.testing.assert_allclose(got, fd, rtol=1e-5, atol=1e-6 * scale, err_msg=f"d loss / d y{i}")


# *** issue #32, item 7 ***

def test_two_adds_into_a_leaf_keep_both_gradients():
  y, z = Tensor([1., 2., 3.], requires_grad=True), Tensor([4., 5., 6.], requires_grad=True)
  b = Tensor([.5, .5, .5])
  b += y
  b += z   # (carries the first write out)
  gy, gz = (b * Tensor([1., 10., 100.])).sum().gradient(y, z)
  np.testing.assert_allclose(gy.numpy(), [1., 10., 100.])
  np.testing.assert_allclose(gz.numpy(), [1., 10., 100.])


def _mul_into_leaf():
  y, w = Tensor([1., 2., 3.], requires_grad=True), Tensor([1., 10., 100.])
  b = Tensor([.5, .5, .5])
  b *= y
  return y, (b * b * w).sum(), 2 * 0.25 * np.array([1., 2., 3.]) * [1., 10., 100.]


def test_gradient_after_the_loss_was_printed():
  y, loss, want = _mul_into_leaf()
  assert loss.item() == pytest.approx(0.25 * (1 + 40 + 900))
  g, = loss.gradient(y)
  np.testing.assert_allclose(g.numpy(), want)


def test_gradient_taken_before_the_loss_is_printed():
  # the gradient reads b's value before the write, which printing the loss then carries out
  y, loss, want = _mul_into_leaf()
  g, = loss.gradient(y)
  assert loss.item() == pytest.approx(0.25 * (1 + 40 + 900))
  np.testing.assert_allclose(g.numpy(), want)
  y, loss, want = _mul_into_leaf()
  loss.backward()
  loss.item()
  np.testing.assert_allclose(y.grad.numpy(), want)


def test_write_into_a_realized_value_then_backward():
  a, c = np.array([1., 2., 3.]), np.array([4., 5., 6.])
  x, z = Tensor(a, requires_grad=True), Tensor(c, requires_grad=True)
  b = (x * 2).realize()
  b *= z
  (b * b).sum().backward()   # was: ValueError: assign target must be a view of a buffer, not of MUL
  np.testing.assert_allclose(x.grad.numpy(), 8 * a * c * c)
  np.testing.assert_allclose(z.grad.numpy(), 8 * a * a * c)


@pytest.mark.parametrize("op", ["+=", "-=", "*=", "/=", "assign"])
@pytest.mark.parametrize("when", ["lazy", "realized", "item"])
def test_each_operator_through_a_slice(op, when):
  a, w = np.array([1., 2., 3.]), np.array([1., 10., 100.])
  y = T(a, requires_grad=True)
  b = T([.5, .75, 1.25])
  if op == "assign": b[1:] = b[1:] * y[1:]
  else:
    v = b[1:]
    IOPS[op](v, y[1:])
  loss = (b * b * T(w)).sum()
  if when == "realized": loss.realize()
  elif when == "item": loss.item()
  g, = loss.gradient(y)
  old = np.array([.5, .75, 1.25])
  new = old.copy()
  new[1:] = old[1:] * a[1:] if op == "assign" else NPOPS[op](old[1:], a[1:])
  d = {"+=": np.ones(3), "-=": -np.ones(3), "*=": old, "/=": -old / a ** 2, "assign": old}[op]
  np.testing.assert_allclose(b.numpy(), new)
  np.testing.assert_allclose(g.numpy(), np.r_[0.0, (2 * new * w * d)[1:]])


def test_a_value_realized_before_the_write_keeps_the_old_contents():
  # c was computed from b before the write: its gradient still flows through what b held then
  a, c0 = np.array([1., 2.]), np.array([3., -1.])
  x, w, y = T(a, requires_grad=True), T(c0, requires_grad=True), T([.5, 4.], requires_grad=True)
  b = (x * 2).realize()
  c = (b * w).realize()
  b += y
  loss = (c * b).sum()
  gx, gw, gy = loss.gradient(x, w, y)
  np.testing.assert_allclose(c.numpy(), 2 * a * c0)
  np.testing.assert_allclose(gx.numpy(), 2 * c0 * (2 * a + [.5, 4.]) + 2 * a * c0 * 2)
  np.testing.assert_allclose(gw.numpy(), 2 * a * (2 * a + [.5, 4.]))
  np.testing.assert_allclose(gy.numpy(), 2 * a * c0)


def test_the_written_tensor_used_before_and_after_the_write_in_one_loss():
  # c reads b lazily; the loss realizes c and the write together, so c reads the old contents
  a, e = np.array([1., 2.]), np.array([3., 5.])
  y, z = T(a, requires_grad=True), T(e, requires_grad=True)
  b = T([.5, .5])
  b += y
  b.realize()
  c = b * 2
  b *= z
  loss = (c * b).sum()
  g, gz = loss.gradient(y, z)
  old = .5 + a
  assert loss.item() == pytest.approx(float((2 * old * old * e).sum()))
  np.testing.assert_allclose(g.numpy(), 4 * old * e)
  np.testing.assert_allclose(gz.numpy(), 2 * old * old)


def test_a_pending_write_after_the_loss_read_the_buffer():
  # c read b before b.assign(z); the gradient, read after the write is carried out, still sees the old b
  y, z = T([1., 2.], requires_grad=True), T([7., 9.])
  b = T([3., 4.])
  c = b * y
  b.assign(z)
  g, = c.sum().gradient(y)
  b.realize()
  np.testing.assert_allclose(b.numpy(), [7., 9.])
  np.testing.assert_allclose(g.numpy(), [3., 4.])


def test_a_two_dimensional_transposed_view():
  a = np.arange(1., 7.).reshape(2, 3)
  y = T(a, requires_grad=True)
  b = T(np.full((2, 3), 2.0))
  v = b.T[1:]          # (2, 2): columns 1 and 2 of b, transposed
  v *= y.T[1:]
  g, = (b * b).sum().gradient(y)
  want = np.zeros((2, 3))
  want[:, 1:] = 2 * (2 * a[:, 1:]) * 2
  np.testing.assert_allclose(g.numpy(), want)


def test_no_history_under_no_grad_or_for_an_optimizer_step():
  y = T([1., 2.], requires_grad=True)
  b = T([3., 4.])
  with rulec.no_grad():
    b += y
  b.realize()
  assert b._forward is None
  # a training loop: the parameters stay leaves, nothing of an earlier step is kept
  rng = np.random.default_rng(0)
  w = Tensor(rng.standard_normal((3, 2)).astype(np.float32))
  opt = rulec.nn.optim.SGD([w], lr=0.1, momentum=0.9)
  with Tensor.train():
    for _ in range(3):
      loss = (Tensor(rng.standard_normal((4, 3)).astype(np.float32)) @ w).square().mean()
      opt.zero_grad()
      loss.backward()
      opt.step()
      gc.collect()
      assert w._forward is None and all(t._forward is None for t in opt.b)
  # the same by hand: a tensor with a .grad is a parameter, its update keeps no history (nor does state read from it)
  m = Tensor.zeros(3, 2).contiguous().realize()
  for _ in range(3):
    loss = (Tensor(rng.standard_normal((4, 3)).astype(np.float32)) @ w).square().mean()
    w.grad = None
    loss.backward()
    m.assign(m * 0.9 + w.grad)
    w -= 0.1 * m
    Tensor.realize(loss, w, m)
    gc.collect()
    assert w._forward is None and m._forward is None


def test_advanced_setitem_whose_value_reads_the_tensor():
  # the value reads b where the write lands: it must read b's old contents (this was wrong before, for `=` too)
  a = np.array([0.7, 1.3])
  for op in ("=", "+="):
    y = T(a, requires_grad=True)
    b = T([.5, .25, 2.0])
    if op == "=": b[Tensor([0, 1])] = b[1:3] * y
    else: b[Tensor([0, 2])] += b[:2] * y
    g, = (b * b).sum().gradient(y)
    old = np.array([.5, .25, 2.0])
    new = old.copy()
    if op == "=":
      new[[0, 1]] = old[1:3] * a
      want = 2 * new[:2] * old[1:3]
    else:
      new[[0, 2]] = old[[0, 2]] + old[:2] * a
      want = 2 * new[[0, 2]] * old[:2]
    np.testing.assert_allclose(b.numpy(), new)
    np.testing.assert_allclose(g.numpy(), want)
