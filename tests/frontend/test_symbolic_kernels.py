"""Symbolic shapes (#33): a bound Variable as a slice offset or size is a kernel argument, not a constant.

`cache[:, p:p+1]`, `w.shrink(((tok, tok+1), None))` and `x[:, p]` with p a bound Variable keep p in the graph as
an offset; `cache[:, 0:p+1]` keeps it as a size (the axis has its largest size, UOp.sizes the real one, and
reductions skip the rest). The scheduler takes the value out (engine/sched/variables.py), so one schedule and one
compiled kernel serve every value, and TinyJit replays one capture for every value (docs/api.md, "Symbolic
shapes")."""
from __future__ import annotations

import numpy as np
import pytest

from hypothesis import given, settings, strategies as st

from rulec import Tensor, TinyJit, Variable
from rulec.engine import realize as R
from rulec.engine.ir.ops import Ops
from rulec.engine.sched import cache as schedule_cache
from rulec.runtime import cpu_device


def rng(seed: int = 0) -> np.random.Generator: return np.random.default_rng(seed)


def compiled() -> int:
  return cpu_device.COUNTERS["compiled"] + cpu_device.COUNTERS["loaded"] + len(cpu_device._by_ast)


DEVICES = ["CPU", "NUMPY"]


@pytest.mark.parametrize("device", DEVICES)
def test_reads_at_bound_offsets_match_numpy(device):
  a = rng(1).standard_normal((9, 5)).astype(np.float32)
  x = Tensor(a, device=device).realize()
  p = Variable("p", 0, 6)
  for n in [0, 3, 6, 2]:
    b = p.bind(n)
    np.testing.assert_allclose((x[b:b + 3] * 2).sum(1).numpy(), (a[n:n + 3] * 2).sum(1), rtol=1e-6)
    np.testing.assert_array_equal(x[b].numpy(), a[n])
    np.testing.assert_array_equal(x.shrink(((b, b + 2), (1, 4))).numpy(), a[n:n + 2, 1:4])
    np.testing.assert_array_equal(x[:, 1:3][b + 1:b + 3].numpy(), a[:, 1:3][n + 1:n + 3])
    assert x[b:b + 3].shape == (3, 5) and x[b].shape == (5,)
    # the graph holds the expression (a movement arg), not the value
    assert any(isinstance(e, type(b)) for pair in x[b:b + 3].uop.arg for e in pair)


@pytest.mark.parametrize("device", DEVICES)
def test_writes_at_bound_offsets_match_numpy(device):
  c = Tensor.zeros(3, 10, device=device).contiguous().realize()
  ref = np.zeros((3, 10), np.float32)
  p = Variable("pos", 0, 8)
  for n, v in [(0, 1.0), (4, 2.0), (8, 3.0), (4, 5.0)]:
    c[:, p.bind(n):p.bind(n) + 2].assign(Tensor.full((3, 2), v, device=device)).realize()
    ref[:, n:n + 2] = v
    c[:, p.bind(n)] = Tensor([v + 10, v + 20, v + 30], device=device)
    ref[:, n] = [v + 10, v + 20, v + 30]
  np.testing.assert_array_equal(c.numpy(), ref)


@pytest.mark.parametrize("device", DEVICES)
def test_pads_by_bound_amounts_match_numpy(device):
  """x.pad(((p, 5 - p), None)): the amounts move with p, the shape does not (kept symbolic, one kernel)."""
  a = rng(13).standard_normal((3, 4)).astype(np.float32)
  p = Variable("p", 0, 5)
  counts = []
  for n in [0, 2, 5, 3]:
    counts.append(compiled())
    b = p.bind(n)
    y = Tensor(a, device=device).pad(((b, 5 - b), None))
    assert y.shape == (8, 4) and isinstance(y.uop.arg[0][0], type(b))
    np.testing.assert_array_equal(y.numpy(), np.pad(a, ((n, 5 - n), (0, 0))))
    np.testing.assert_array_equal(Tensor(a, device=device).pad(((b, 5 - b), None), value=-2.0).numpy(),
                                  np.pad(a, ((n, 5 - n), (0, 0)), constant_values=-2.0))
    w = Tensor(a, device=device, requires_grad=True)
    (w.pad(((b, 5 - b), None)) * Tensor(np.arange(32, dtype=np.float32).reshape(8, 4), device=device)).sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), np.arange(32, dtype=np.float32).reshape(8, 4)[n:n + 3])
  if device == "CPU": assert counts[1] == counts[2] == counts[3] == compiled()   # (later values compile nothing)
  # amounts whose sum moves are a size: specialised (the value is read)
  assert Tensor(a).pad(((p.bind(2), 0), None)).shape == (5, 4)


def test_one_schedule_and_one_compile_serve_every_value():
  w = Tensor(rng(2).standard_normal((40, 24)).astype(np.float32)).realize()
  cache = Tensor.zeros(40, 24).contiguous().realize()
  p = Variable("p", 0, 38)
  def step(n):
    b = p.bind(n)
    cache[b:b + 2].assign(w[b:b + 2] * 3 + 1).realize()
    return (w[b + 1] * 2).numpy()
  step(0)
  k0, c0, h0 = R.COUNTERS["scheduled"], compiled(), schedule_cache.STATS["hits"]
  for n in range(1, 11):
    np.testing.assert_allclose(step(n), w.numpy()[n + 1] * 2, rtol=1e-6)
  # ten new values: every schedule from the cache, nothing compiled
  assert schedule_cache.STATS["hits"] - h0 == 20
  assert compiled() == c0
  assert R.COUNTERS["scheduled"] - k0 == 20
  ref = np.zeros((40, 24), np.float32)
  for n in range(11): ref[n:n + 2] = w.numpy()[n:n + 2] * 3 + 1
  np.testing.assert_allclose(cache.numpy(), ref, rtol=1e-6)


def test_kernels_take_the_variable_as_an_argument():
  x = Tensor(rng(3).standard_normal((16, 4)).astype(np.float32)).realize()
  p = Variable("start_pos", 0, 12)
  ks = R.schedule([(x[p.bind(5):p.bind(5) + 4] + 1).uop])
  assert len(ks) == 1 and [v.arg for v in ks[0].vars] == [("start_pos", 0, 12)] and ks[0].vals == (5,)
  ks2 = R.schedule([(x[p.bind(9):p.bind(9) + 4] + 1).uop])
  assert ks2[0].ast is ks[0].ast and ks2[0].vals == (9,)
  assert not any(u.op is Ops.BIND for u in ks[0].ast.toposort())


def test_two_variables_in_one_kernel():
  a = rng(4).standard_normal((8, 8)).astype(np.float32)
  x = Tensor(a).realize()
  i, j = Variable("i", 0, 6), Variable("j", 0, 5)
  for n, m in [(0, 0), (6, 5), (2, 3)]:
    got = x[i.bind(n):i.bind(n) + 2, j.bind(m):j.bind(m) + 3].contiguous().numpy()
    np.testing.assert_array_equal(got, a[n:n + 2, m:m + 3])


def test_one_variable_bound_to_two_values_in_one_realize_is_an_error():
  x = Tensor(np.arange(10, dtype=np.float32)).realize()
  p = Variable("p", 0, 8)
  with pytest.raises(ValueError, match="bound to both"):
    (x[p.bind(1):p.bind(1) + 1] + x[p.bind(2):p.bind(2) + 1]).realize()


def test_gradient_through_a_bound_offset():
  a = rng(5).standard_normal((7, 3)).astype(np.float32)
  p = Variable("p", 0, 5)
  for n in [0, 2, 5]:
    w = Tensor(a, requires_grad=True)
    (w[p.bind(n):p.bind(n) + 2] * Tensor([[1.0, 2.0, 3.0]])).sum().backward()
    want = np.zeros_like(a)
    want[n:n + 2] = [1.0, 2.0, 3.0]
    np.testing.assert_array_equal(w.grad.numpy(), want)


# *** sizes that are a Variable's ***

@pytest.mark.parametrize("device", DEVICES)
def test_reductions_over_a_variable_size_match_numpy(device):
  a = rng(10).standard_normal((3, 12, 5)).astype(np.float32)
  a[:, 7:] = np.inf   # (past the bound size for most values below: never part of a result)
  x = Tensor(a, device=device).realize()
  p = Variable("p", 0, 11)
  for n in [0, 3, 6]:
    y = x[:, 0:p.bind(n) + 1]
    v = a[:, :n + 1].astype(np.float64)
    assert y.shape == (3, 12, 5) and y.numpy().shape == (3, n + 1, 5)   # (largest size; the value has n+1)
    np.testing.assert_array_equal(y.numpy(), a[:, :n + 1])
    np.testing.assert_allclose(y.sum(1).numpy(), v.sum(1), rtol=1e-5)
    np.testing.assert_allclose(y.max(1).numpy(), v.max(1), rtol=1e-6)
    np.testing.assert_allclose(y.min(axis=1).numpy(), v.min(1), rtol=1e-6)
    np.testing.assert_allclose(y.mean(1).numpy(), v.mean(1), rtol=1e-5)
    np.testing.assert_allclose(y.mean().numpy(), v.mean(), rtol=1e-5)
    if n: np.testing.assert_allclose(y.var(1).numpy(), v.var(1, ddof=1), rtol=1e-4, atol=1e-6)
    e = np.exp(v - v.max(1, keepdims=True))
    np.testing.assert_allclose(y.softmax(1).numpy(), e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(y.argmax(1).numpy(), v.argmax(1))
    # a sum over the other axes keeps the size
    np.testing.assert_allclose(y.sum(2).numpy(), v.sum(2), rtol=1e-5)


def test_more_ops_over_a_variable_size_match_numpy():
  """Ops built from others (scans, logsumexp, layernorm over the other axis, a stored copy) keep the size."""
  a = rng(14).standard_normal((10, 6)).astype(np.float32)
  p = Variable("p", 0, 8)
  for n in [0, 4, 8]:
    x, v = Tensor(a)[0:p.bind(n) + 1], a[:n + 1].astype(np.float64)
    np.testing.assert_allclose(x.cumsum(0).numpy(), np.cumsum(v, 0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(x.cumprod(0).numpy(), np.cumprod(v, 0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(x.cummax(0)[0].numpy(), np.maximum.accumulate(v, 0), rtol=1e-6)
    assert x.cummax(0)[1].numpy().shape == (n + 1, 6)
    np.testing.assert_allclose(x.logcumsumexp(0).numpy(), np.logaddexp.accumulate(v, 0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(x.cumsum(1).numpy(), np.cumsum(v, 1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(x.logsumexp(0).numpy(), np.log(np.exp(v).sum(0)), rtol=1e-5)
    t = x.transpose()
    want = (v.T - v.T.mean(-1, keepdims=True)) / np.sqrt(v.T.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(t.layernorm(-1).numpy(), want, rtol=1e-4, atol=1e-4)
    k = x.contiguous().realize()
    np.testing.assert_array_equal(k.numpy(), a[:n + 1])
    np.testing.assert_allclose(k.sum(0).numpy(), v.sum(0), rtol=1e-5)
    np.testing.assert_allclose(Tensor.stack(x, x * 2).sum(1).numpy(), np.stack([v, v * 2]).sum(1), rtol=1e-5)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 15), st.sampled_from(["sum", "max", "mean", "softmax", "matmul"]), st.integers(0, 2**31))
def test_variable_size_reductions_property(n, op, seed):
  r = rng(seed)
  a = r.standard_normal((4, 16)).astype(np.float32)
  w = r.standard_normal((16, 3)).astype(np.float32)
  b = Variable("n", 0, 15).bind(n)
  y, v = Tensor(a)[:, 0:b + 1], a[:, :n + 1].astype(np.float64)
  if op == "matmul": got, want = (y @ Tensor(w)[0:b + 1]).numpy(), v @ w[:n + 1]
  elif op == "softmax":
    e = np.exp(v - v.max(-1, keepdims=True))
    got, want = y.softmax(-1).numpy(), e / e.sum(-1, keepdims=True)
  else: got, want = getattr(y, op)(-1).numpy(), getattr(v, op)(-1)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_attention_over_a_variable_size_compiles_once():
  """q @ k[:p+1].T, softmax, @ v[:p+1] for p = 0..9: one set of kernels (scheduled from the cache, compiled once)."""
  r = rng(11)
  q, k, v = (r.standard_normal(s).astype(np.float32) for s in ((2, 1, 8), (2, 16, 8), (2, 16, 8)))
  tq, tk, tv = (Tensor(t).realize() for t in (q, k, v))
  p = Variable("p", 0, 15)
  def att(n):
    b = p.bind(n)
    return ((tq @ tk[:, 0:b + 1].transpose(1, 2) / np.sqrt(8)).softmax(-1) @ tv[:, 0:b + 1]).numpy()
  att(0)
  c0 = compiled()
  for n in range(1, 10):
    s = q @ k[:, :n + 1].transpose(0, 2, 1) / np.sqrt(8)
    e = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose(att(n), (e / e.sum(-1, keepdims=True)) @ v[:, :n + 1], rtol=1e-5, atol=1e-6)
  assert compiled() == c0


def test_cpu_loop_over_a_variable_size_stops_at_the_bound_size():
  """The reduce of a Variable's size is guarded by r < p + 1 (rules/symbolic.rules lt_add_invariant moves the
  Variable's term right); the CPU renderer bounds the loop by it instead of running to the largest size."""
  import re
  from rulec.codegen import pipeline
  x = Tensor(rng(15).standard_normal((64, 16)).astype(np.float32)).realize()
  p = Variable("p", 0, 63)
  k = R.schedule([x[0:p.bind(5) + 1].sum(0).uop])[0]
  guards = [u for u in k.ast.toposort() if u.op is Ops.CMPLT and u.src[0].op is Ops.RANGE]
  assert len(guards) == 1 and any(n.op is Ops.DEFINE_VAR for n in guards[0].src[1].toposort())
  low = pipeline.lower(k, "CPU", cpu_device.opt_target(), cpu_device.optional_decompositions())
  text, _ = pipeline.render(low.kernel, "CPU", vars=k.vars)
  reduce_axis = next(u.arg[0] for u in low.kernel.ast.toposort() if u.op is Ops.RANGE and u.src[0].arg == 64)
  head = text[text.index(f"r{reduce_axis}_head:"):]
  assert not re.match(r'r\d+_head:\n\s+%"?[\w.]+"? = load i64, i64\* %"i\d+"\n\s+%"?[\w.]+"? = icmp slt i64 %"?[\w.]+"?, 64\n', head), head[:200]
  for n in [0, 5, 63]:
    np.testing.assert_allclose(x[0:p.bind(n) + 1].sum(0).numpy(), x.numpy()[:n + 1].sum(0), rtol=1e-5, atol=1e-6)


def test_cl_loop_over_a_variable_size_stops_at_the_bound_size():
  """The same on the CL device (PoCL here): the plain reduce loop ends at clamp(p + 1, 0, 64)."""
  from rulec.runtime import cl_device
  try: dev = cl_device.get_device()
  except Exception as e: pytest.skip(f"no OpenCL device: {e}")
  from rulec.codegen import pipeline
  a = rng(17).standard_normal((64, 16)).astype(np.float32)
  x = Tensor(a, device="CL").realize()
  p = Variable("p", 0, 63)
  k = R.schedule([x[0:p.bind(5) + 1].sum(0).uop])[0]
  low = pipeline.lower(k, "CL", dev.target)
  rendered = pipeline.render(low.kernel, "CL", dev.target, vars=k.vars)
  src = rendered.source
  for n in [0, 5, 63]:
    np.testing.assert_allclose(x[0:p.bind(n) + 1].sum(0).numpy(), a[:n + 1].sum(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(x[0:p.bind(n) + 1].max(0).numpy(), a[:n + 1].max(0), rtol=1e-6)
  if rendered.local_size: pytest.skip("this target reduces in work-groups (no plain loop to bound: docs/api.md)")
  loops = [line for line in src.splitlines() if "for (" in line]
  assert "clamp(" in src and loops and not any("< 64;" in line for line in loops), src


def test_gradients_through_variable_offsets_and_sizes_match_int_slices():
  a = rng(12).standard_normal((9, 4)).astype(np.float32)
  p = Variable("p", 0, 7)
  for n in [0, 4, 7]:
    grads = []
    for s, e in [(n, n + 2), (0, n + 1)]:   # an offset, then a size
      pair = []
      for sym in (True, False):
        w = Tensor(a, requires_grad=True)
        lo, hi = (p.bind(n) if s else 0, p.bind(n) + (e - n)) if sym else (s, e)
        (w[lo:hi].softmax(0) * Tensor(np.arange(4, dtype=np.float32))).sum().backward()
        pair.append(w.grad.numpy())
      np.testing.assert_allclose(pair[0], pair[1], rtol=1e-6, atol=1e-7)
      grads.append(pair[0])
    assert np.all(grads[1][n + 1:] == 0)


def test_what_a_variable_size_does_not_allow_is_an_error():
  x = Tensor(np.arange(40, dtype=np.float32).reshape(10, 4)).realize()
  y = x[0:Variable("p", 0, 9).bind(4) + 1]
  with pytest.raises(ValueError, match="Variable"): y.pad(((1, 0), (0, 0))).numpy()
  with pytest.raises(ValueError, match="Variable"): y.flip(0).numpy()
  with pytest.raises(ValueError, match="Variable"): y[1:3].numpy()
  with pytest.raises(ValueError, match="Variable"): y.reshape(5, 2, 4).numpy()
  with pytest.raises(ValueError, match="size is a Variable"): y.assign(Tensor.zeros(10, 4)).realize()
  # what it allows: permute, expand of other axes, a reshape that keeps the axis or leads a merge
  np.testing.assert_array_equal(y.T.sum(1).numpy(), x.numpy()[:5].sum(0))
  np.testing.assert_array_equal(y.reshape(40).sum().numpy(), x.numpy()[:5].sum())
  np.testing.assert_array_equal(y.reshape(1, 10, 4).expand(3, 10, 4).sum((0, 1)).numpy(), 3 * x.numpy()[:5].sum(0))


def test_several_devices_specialise():
  a = np.arange(32, dtype=np.float32).reshape(8, 4)
  p = Variable("p", 0, 6)
  x = Tensor(a).shard(("CPU:0", "CPU:1"), axis=0).realize()
  np.testing.assert_array_equal(x[p.bind(2):p.bind(2) + 2].numpy(), a[2:4])
  np.testing.assert_array_equal(x[0:p.bind(2) + 1].sum(0).numpy(), a[:3].sum(0))


def test_ranges_that_do_not_guarantee_the_bounds_are_specialised():
  """p in [0, 9] on an axis of 8 read as [p, p+2): some values would read past the end, so the value is checked
  and built in (as before), and a bad value is an error, not a read out of bounds."""
  x = Tensor(np.arange(8, dtype=np.float32))
  p = Variable("p", 0, 9)
  assert x[p.bind(3):p.bind(3) + 2].tolist() == [3.0, 4.0]
  assert all(not isinstance(e, type(p)) for pair in x[p.bind(3):p.bind(3) + 2].uop.arg for e in pair)
  with pytest.raises(Exception):
    x.shrink(((p.bind(8), p.bind(8) + 2),))


def test_specialised_when_symbolic_is_off(monkeypatch):
  monkeypatch.setenv("RULEC_SYMBOLIC", "0")
  x = Tensor(np.arange(8, dtype=np.float32))
  p = Variable("p", 0, 6)
  y = x[p.bind(2):p.bind(2) + 2]
  assert y.uop.arg == ((2, 4),) and y.tolist() == [2.0, 3.0]


# *** TinyJit: one capture for every value ***

class Decoder:
  """A decode step that only moves offsets: the token's embedding row, the position's row, a cache write at the
  position, and a read of the cache that does not depend on the position's value (the whole cache, masked)."""

  def __init__(self, vocab: int, ctx: int, dim: int, seed: int = 0):
    r = rng(seed)
    self.wte = Tensor(r.standard_normal((vocab, dim)).astype(np.float32)).realize()
    self.wpe = Tensor(r.standard_normal((ctx, dim)).astype(np.float32)).realize()
    self.w = Tensor((r.standard_normal((dim, dim)) / np.sqrt(dim)).astype(np.float32)).realize()
    self.cache = Tensor.zeros(ctx, dim).contiguous().realize()
    self.ref = np.zeros((ctx, dim), np.float64)

  def __call__(self, tok, pos) -> Tensor:
    h = self.wte.shrink(((tok, tok + 1), None)) + self.wpe[pos:pos + 1]
    self.cache[pos:pos + 1].assign(h @ self.w).realize()
    return (self.cache.sum(0, keepdim=True) + h).realize()

  def reference(self, tok: int, pos: int) -> np.ndarray:
    h = self.wte.numpy()[tok:tok + 1].astype(np.float64) + self.wpe.numpy()[pos:pos + 1]
    self.ref[pos:pos + 1] = h @ self.w.numpy()
    return self.ref.sum(0, keepdims=True) + h


def test_jit_replays_one_capture_for_every_value_without_scheduling_or_compiling():
  dec = Decoder(vocab=13, ctx=24, dim=8, seed=6)
  step = TinyJit(dec.__call__)
  tv, pv = Variable("tok", 0, 12), Variable("pos", 0, 23)
  toks = rng(7).integers(0, 13, 20)
  counts = []
  for pos in range(20):
    s0, c0 = R.COUNTERS["scheduled"], compiled()
    got = step(tv.bind(int(toks[pos])), pv.bind(pos)).numpy()
    counts.append((R.COUNTERS["scheduled"] - s0, compiled() - c0))
    np.testing.assert_allclose(got, dec.reference(int(toks[pos]), pos), rtol=1e-4, atol=1e-5)
  # call 1 runs the function, call 2 captures it, calls 3..20 replay it with the new values
  assert step.captured is not None and step.general[(pv, tv)] is step.captured   # (Variables in name order)
  assert all(s > 0 for s, _ in counts[:2]) and counts[2:] == [(0, 0)] * 18, counts
  np.testing.assert_allclose(dec.cache.numpy(), dec.ref, rtol=1e-4, atol=1e-5)


def test_bound_values_as_scalars_are_kernel_arguments():
  """x * p, Tensor.arange(n) <= p, p + 1 - x: the value is a kernel argument (a weak int, as a Python int would
  be), so a jitted function of them replays one capture for every value."""
  a = rng(16).standard_normal(12).astype(np.float32)
  x = Tensor(a).realize()
  p = Variable("p", 0, 11)
  @TinyJit
  def f(b):
    masked = (Tensor.arange(12) <= b).where(x, 0.0)
    return (masked * b + (b + 1 - x)).realize()
  counts = []
  for n in [0, 5, 11, 3, 7, 2]:
    s0, c0 = R.COUNTERS["scheduled"], compiled()
    got = f(p.bind(n)).numpy()
    counts.append((R.COUNTERS["scheduled"] - s0, compiled() - c0))
    want = np.where(np.arange(12) <= n, a, 0) * n + (n + 1 - a)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
  assert counts[2:] == [(0, 0)] * 4 and f.general[(p,)] is f.captured
  assert (Tensor([1, 2]) + p.bind(3)).dtype.name == "int32" and (Tensor([1.0]) * p.bind(3)).dtype.name == "float32"
  ks = R.schedule([(x * p.bind(4)).uop])
  assert [v.arg[0] for v in ks[0].vars] == ["p"] and ks[0].vals == (4,)


def test_jit_with_a_value_read_as_a_number_falls_back_to_one_capture_per_value():
  """A bound value used where rulec needs its int (`Tensor.arange(p + 1)`) specialises it: the capture serves its
  own value only, and each other value counts its own calls."""
  a = rng(8).standard_normal(12).astype(np.float32)
  x = Tensor(a).realize()
  f = TinyJit(lambda p: (x[:3] * Tensor.arange(p + 1).sum()).realize())
  v = Variable("p", 0, 10)
  for n in [1, 2, 3, 1, 2, 3, 1, 2, 3, 4]:
    np.testing.assert_allclose(f(v.bind(n)).numpy(), a[:3] * (n * (n + 1) // 2), rtol=1e-5)
  assert (v,) not in f.general or not hasattr(f.general[(v,)], "plan")


def test_jit_never_replays_a_value_bound_outside_its_arguments():
  """A Variable bound in the closure is not among the arguments: a replay could not know its value, so the
  function runs every call."""
  a = rng(9).standard_normal((6, 4)).astype(np.float32)
  w = Tensor(a).realize()
  box = {}
  g = TinyJit(lambda x: (x * w[box["p"]]).realize())
  v = Variable("p", 0, 5)
  x = Tensor(np.ones(4, np.float32))
  for n in [0, 1, 2, 3, 4, 5]:
    box["p"] = v.bind(n)
    np.testing.assert_allclose(g(x).numpy(), a[n], rtol=1e-6)
  assert g.captured is None
