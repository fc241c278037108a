"""TinyJit (engine/jit.py): tinygrad 0.14's capture-and-replay, checked against eager runs bit for bit and
against numpy references. Runs on the default device (RULEC_DEVICE)."""
from __future__ import annotations

import numpy as np
import pytest

from rulec.engine import realize as R
from rulec.engine.sched import cache as sc
from rulec.engine.tensor import Tensor
from rulec import JitError, TinyJit, jit


def arr(*shape, seed=0, dtype=np.float32):
  return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def f(x, y):
  return ((x @ y).relu() + x.sum(1, keepdim=True)) * 0.5


def f_ref(x, y):
  return (np.maximum(x @ y, 0) + x.sum(1, keepdims=True)) * np.float32(0.5)


def test_equals_eager_for_new_inputs_bit_for_bit():
  calls = []
  def g(x, y):
    calls.append(1)
    return f(x, y)
  jf = TinyJit(g)
  for i in range(6):
    a, b = arr(3, 4, seed=i), arr(4, 5, seed=100 + i)
    got = jf(Tensor(a), Tensor(b)).numpy()
    np.testing.assert_array_equal(got, f(Tensor(a), Tensor(b)).numpy())
    np.testing.assert_allclose(got, f_ref(a, b), rtol=1e-5, atol=1e-6)
  assert len(calls) == 2   # call 1 runs, call 2 captures, the rest replay


def test_replay_builds_and_schedules_nothing():
  jf = TinyJit(f)
  for i in range(2): jf(Tensor(arr(3, 4, seed=i)), Tensor(arr(4, 5, seed=i)))
  x, y = Tensor(arr(3, 4, seed=9)), Tensor(arr(4, 5, seed=9))
  scheduled, stats, ran = R.COUNTERS["scheduled"], dict(sc.STATS), R.COUNTERS["run"]
  out = jf(x, y)
  assert R.COUNTERS["scheduled"] == scheduled and sc.STATS == stats and R.COUNTERS["run"] > ran
  np.testing.assert_allclose(out.numpy(), f_ref(arr(3, 4, seed=9), arr(4, 5, seed=9)), rtol=1e-5, atol=1e-6)


def test_outputs_are_the_same_tensors_overwritten_by_the_next_call():
  jf = TinyJit(lambda x: x * 2 + 1)
  outs = [jf(Tensor(arr(4, seed=i))) for i in range(3)]
  kept = outs[2].numpy()
  again = jf(Tensor(arr(4, seed=7)))
  assert again is outs[2] and outs[1] is outs[2]   # tinygrad returns the captured Tensors every call
  np.testing.assert_array_equal(outs[2].numpy(), arr(4, seed=7) * 2 + 1)   # ... holding the newest values
  np.testing.assert_array_equal(kept, arr(4, seed=2) * 2 + 1)
  assert outs[0] is not outs[2]   # (call 1 ran eagerly: its output is its own)
  np.testing.assert_array_equal(outs[0].numpy(), arr(4, seed=0) * 2 + 1)


def test_several_outputs_kwargs_and_container_inputs():
  @TinyJit
  def g(xs, scale=None):
    a, b = xs
    return {"sum": (a + b) * scale, "max": a.maximum(b).max()}
  for i in range(5):
    a, b, s = arr(2, 3, seed=i), arr(2, 3, seed=i + 50), arr(2, 3, seed=i + 99)
    out = g([Tensor(a), Tensor(b)], scale=Tensor(s))
    np.testing.assert_array_equal(out["sum"].numpy(), (a + b) * s)
    np.testing.assert_array_equal(out["max"].numpy(), np.maximum(a, b).max())


def test_lazy_inputs_are_realized_first():
  jf = TinyJit(lambda x: x.exp2().sum())
  for i in range(4):
    a = arr(5, seed=i)
    np.testing.assert_allclose(jf(Tensor(a) + 1).numpy(), np.exp2(a + 1).sum(), rtol=1e-5)


def test_a_previous_output_as_input():
  jf = TinyJit(lambda x: x.flip(0) * 3 - 1)
  x = Tensor(arr(4))
  want = arr(4)
  for _ in range(5):
    x = jf(x)   # from call 3 on the input is the buffer the replay writes (flipped: not in place): it is copied first
    want = want[::-1] * 3 - 1
    np.testing.assert_array_equal(x.numpy(), want)


def test_closure_state_is_updated_in_place():
  acc = Tensor(np.zeros(3, np.float32)).contiguous().realize()
  @TinyJit
  def add(x):
    acc.assign(acc + x).realize()
    return acc * 1
  total = np.zeros(3, np.float32)
  for i in range(5):
    a = arr(3, seed=i)
    total = total + a
    np.testing.assert_array_equal(add(Tensor(a)).numpy(), total)
  np.testing.assert_array_equal(acc.numpy(), total)


def test_assign_into_an_input_and_return_it():
  @TinyJit
  def bump(x):
    x.assign(x + 1).realize()
    return x
  for i in range(4):
    a = arr(3, seed=i)
    t = Tensor(a)
    out = bump(t)
    np.testing.assert_array_equal(t.numpy(), a + 1)
    np.testing.assert_array_equal(out.numpy(), a + 1)


def test_method():
  class Model:
    def __init__(self): self.w = Tensor(arr(4, 2, seed=3))
    @TinyJit
    def __call__(self, x): return (x @ self.w).relu()
  m = Model()
  for i in range(4):
    a = arr(3, 4, seed=i)
    np.testing.assert_allclose(m(Tensor(a)).numpy(), np.maximum(a @ arr(4, 2, seed=3), 0), rtol=1e-5, atol=1e-6)


def test_reset_runs_the_function_again():
  calls = []
  def g(x):
    calls.append(1)
    return x + 1
  jf = TinyJit(g)
  for i in range(3): jf(Tensor(arr(2, seed=i)))
  assert len(calls) == 2
  jf.reset()
  for i in range(3): np.testing.assert_array_equal(jf(Tensor(arr(2, seed=i))).numpy(), arr(2, seed=i) + 1)
  assert len(calls) == 4


def test_jit_decorator_form():
  @jit
  def g(x): return x * x
  @jit()
  def h(x): return x - 1
  for i in range(3):
    a = arr(3, seed=i)
    np.testing.assert_array_equal(g(Tensor(a)).numpy(), a * a)
    np.testing.assert_array_equal(h(Tensor(a)).numpy(), a - 1)


# *** errors ***

def captured(fn):
  jf = TinyJit(fn)
  for i in range(2): jf(Tensor(arr(3, 4, seed=i)), 2)
  return jf


@pytest.mark.parametrize("x, what", [
  (Tensor(arr(4, 4)), "shape (4, 4)"),
  (Tensor(arr(3, 4, dtype=np.float64)), "float64"),
  (Tensor(arr(6, 4))[::2], "a view: "),
  (Tensor(arr(3, 4), device="NUMPY" if R.DEFAULT_DEVICE != "NUMPY" else "CPU"), "on "),
])
def test_input_mismatch_raises(x, what):
  jf = captured(lambda x, k: x * k)
  with pytest.raises(JitError, match="args mismatch in JIT: argument 0 has") as e: jf(x, 2)
  assert what in str(e.value) and "captured with shape (3, 4)" in str(e.value)
  np.testing.assert_array_equal(jf(Tensor(arr(3, 4, seed=5)), 2).numpy(), arr(3, 4, seed=5) * 2)   # still usable


def test_argument_names_and_non_tensor_values_must_match():
  jf = captured(lambda x, k: x * k)
  with pytest.raises(JitError, match=r"Tensor arguments at \['x'\], captured at \[0\]"): jf(x=Tensor(arr(3, 4)), k=2)
  with pytest.raises(JitError, match="non-Tensor argument 1 is 3, captured with 2"): jf(Tensor(arr(3, 4)), 3)


def test_nothing_to_capture():
  jf = TinyJit(lambda x: x)
  for _ in range(3):
    try: jf(Tensor(arr(3)))
    except JitError as e: assert str(e) == "didn't JIT anything!"
  assert jf.cnt == 1   # call 1 ran; every capture attempt failed


def test_inputs_must_be_buffers_and_distinct():
  jf = TinyJit(lambda x, y: x + y)
  with pytest.raises(JitError, match="JIT inputs must be real buffers"): jf(Tensor.ones(3), Tensor(arr(3)))
  x = Tensor(arr(3))
  with pytest.raises(JitError, match="duplicate inputs to JIT"): jf(x, x)


def test_non_tensor_return_and_host_reads_while_capturing():
  jf = TinyJit(lambda x: ((x + 1).realize(), 3))
  jf(Tensor(arr(2)))
  with pytest.raises(JitError, match="non-Tensor value of type int"): jf(Tensor(arr(2)))
  jg = TinyJit(lambda x: (x + 1).numpy())
  jg(Tensor(arr(2)))
  with pytest.raises(JitError, match="cannot access tensor data during JIT capture"): jg(Tensor(arr(2)))


def test_not_a_function():
  with pytest.raises(TypeError, match="TinyJit needs a function"): TinyJit(3)


# *** a training loop ***

SIZES = [(8, 16), (16,), (16, 4), (4,)]


def init_params():
  rng = np.random.default_rng(0)
  return [(rng.standard_normal(s) * 0.3).astype(np.float32) for s in SIZES]


def batches(n):
  rng = np.random.default_rng(1)
  return [(rng.standard_normal((6, 8)).astype(np.float32), rng.standard_normal((6, 4)).astype(np.float32),
           rng.integers(0, 4, 6).astype(np.int32)) for _ in range(n)]


def make_step(params, loss_kind):
  def step(x, y, labels):
    w1, b1, w2, b2 = params
    for p in params: p.grad = None
    out = (x @ w1 + b1).relu() @ w2 + b2
    loss = (out - y).square().mean() if loss_kind == "mse" else out.sparse_categorical_crossentropy(labels)
    loss.backward()
    for p in params: p.assign(p - 0.1 * p.grad)
    loss.realize(*params)
    return loss
  return step


def train(jitted, loss_kind, n=7):
  params = [Tensor(p) for p in init_params()]
  step = make_step(params, loss_kind)
  if jitted: step = TinyJit(step)
  losses = [step(Tensor(x), Tensor(y), Tensor(lab)).numpy() for x, y, lab in batches(n)]
  return losses, [p.numpy() for p in params]


def train_ref(n=7):
  """The MSE loop in numpy: forward, hand-derived backward, SGD."""
  w1, b1, w2, b2 = init_params()
  losses = []
  for x, y, _ in batches(n):
    pre = x @ w1 + b1
    h = np.maximum(pre, 0)
    out = h @ w2 + b2
    losses.append(np.square(out - y).mean())
    d_out = 2 * (out - y) / out.size
    d_h = d_out @ w2.T * (pre > 0)
    grads = [x.T @ d_h, d_h.sum(0), h.T @ d_out, d_out.sum(0)]
    w1, b1, w2, b2 = (p - np.float32(0.1) * g for p, g in zip((w1, b1, w2, b2), grads))
  return losses, [w1, b1, w2, b2]


@pytest.mark.parametrize("loss_kind", ["mse", "cross_entropy"])
def test_training_loop_equals_eager_bit_for_bit(loss_kind):
  eager, jitted = train(False, loss_kind), train(True, loss_kind)
  for a, b in zip(eager[0], jitted[0]): np.testing.assert_array_equal(a, b)
  for a, b in zip(eager[1], jitted[1]): np.testing.assert_array_equal(a, b)
  assert len(set(float(x) for x in jitted[0])) > 3   # the loss moved: the replays trained
  if loss_kind == "mse":
    ref = train_ref()
    np.testing.assert_allclose(np.array(jitted[0]), np.array(ref[0]), rtol=1e-4)
    for a, b in zip(jitted[1], ref[1]): np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
