"""Symbolic shapes (#33): tinygrad's `Variable(name, min, max).bind(value)` as a shape, offset and scalar.

A bound offset whose size does not depend on the value (`cache[:, p:p+1]`) stays symbolic: one schedule and one
kernel for every value (tests/frontend/test_symbolic_kernels.py). Every other use of a bound value (a size such
as `cache[:, 0:p+1]`, a scalar) is specialised: it is its int, so the graph, its schedule and its kernels are
built for that value (docs/api.md, "Symbolic shapes"). A TinyJit capture that specialised a bound value among its
arguments is kept per set of values, so it never replays kernels built for another value."""
from __future__ import annotations

import gc

import numpy as np
import pytest

import rulec
from rulec import GlobalCounters, Tensor, TinyJit, Variable
from rulec.engine.ir.ops import Ops
from rulec.engine.ir.uop import UOp
from rulec.runtime import cpu_device


def rng(seed: int = 0) -> np.random.Generator: return np.random.default_rng(seed)


# *** Variable itself ***

def test_variable_bind_unbind_and_printing():
  v = Variable("start_pos", 1, 10)
  assert v is UOp.variable("start_pos", 1, 10) and rulec.helpers.Variable is UOp.variable   # tinygrad's spelling
  assert (v.expr, v.vmin, v.vmax) == ("start_pos", 1, 10)
  b = v.bind(3)
  assert b is v.bind(3) and b.unbind() == (v, 3) and b.val == 3 and b.expr == "start_pos"
  assert (b.vmin, b.vmax) == (1, 10)   # (a bound Variable keeps its range, as tinygrad's)
  assert [x.render() for x in (v, b, b + 1, 1 + b, b - 1, b * 2, 2 * b, b // 2, b % 3, v < 3, v >= 3)] == \
    ["start_pos", "start_pos", "(start_pos+1)", "(start_pos+1)", "(start_pos+-1)", "(start_pos*2)", "(start_pos*2)",
     "(start_pos//2)", "(start_pos%3)", "(start_pos<3)", "((start_pos<3)!=True)"]
  assert (b == 3) is False and (b != 3) is True   # (== and != are identity on UOps, unlike tinygrad's !=: docs/api.md)
  e, var_vals = (b * 2 + 1).unbind_all()
  assert e.render() == "((start_pos*2)+1)" and var_vals == {v: 3} and (b * 2 + 1).variables() == [v]


def test_bound_expressions_are_their_values():
  v, w = Variable("i", 0, 100), Variable("j", 0, 100)
  i, j = v.bind(7), w.bind(5)
  assert [int(x) for x in (i, i + 1, i - 10, i * j, i // 2, i % 4, (i + j) * 2 - 1)] == [7, 8, -3, 35, 3, 3, 23]
  assert list(range(10))[i:i + 2] == [7, 8] and slice(j, i).indices(20) == (5, 7, 1)
  assert [bool(x) for x in (i < 8, i > 8, i <= 7, i >= 8, j < i)] == [True, False, True, False, True]
  assert bool(v > -1) and not bool(v < 0)   # (an unbound Variable's range decides these, as in tinygrad)


def test_variable_errors_use_tinygrads_exception_classes():
  v = Variable("start_pos", 1, 10)
  with pytest.raises(AssertionError, match=r"bind 11 not in range \[1, 10\]"): v.bind(11)
  with pytest.raises(AssertionError, match=r"bind 0 not in range \[1, 10\]"): v.bind(0)
  with pytest.raises(TypeError, match="bind takes an int"): v.bind(2.5)
  with pytest.raises(AssertionError, match="can't unbind"): v.unbind()
  with pytest.raises(AssertionError, match="val is only for CONST"): (v + 1).val
  with pytest.raises(ValueError, match="eval failed to be a single number, range is 1 to 10 in start_pos"): int(v)
  with pytest.raises(ValueError, match="range is False to True"): bool(v < 5)
  x = Tensor.ones(2, 16)
  # an unbound Variable as a shape: rulec's shapes take bound values only (tinygrad's would stay symbolic)
  with pytest.raises(ValueError, match="Variable start_pos is not bound"): x[:, v:v + 1]
  with pytest.raises(ValueError, match="not bound"): Tensor.ones(v, 2)
  with pytest.raises(ValueError, match="not bound"): x.shrink((None, (0, v)))


# *** every shape and offset entry point ***

def test_shapes_slices_and_scalars_take_bound_expressions():
  b = Variable("sp", 0, 10).bind(3)
  a = rng().standard_normal((2, 16, 4)).astype(np.float32)
  x = Tensor(a)
  np.testing.assert_array_equal(x[:, b:b + 1].numpy(), a[:, 3:4])
  np.testing.assert_array_equal(x[:, 0:b + 1].numpy(), a[:, 0:4])
  np.testing.assert_array_equal(x[:, b].numpy(), a[:, 3])
  np.testing.assert_array_equal(x[:, b:b * 4:b - 1].numpy(), a[:, 3:12:2])
  np.testing.assert_array_equal(x.shrink((None, (b, b + 1), None)).numpy(), a[:, 3:4])
  np.testing.assert_array_equal(x[:, 0:b + 1].reshape(2, b + 1, 2, 2).numpy(), a[:, 0:4].reshape(2, 4, 2, 2))
  np.testing.assert_array_equal(x.pad(((0, 0), (b, 0), (0, 0))).numpy(), np.pad(a, ((0, 0), (3, 0), (0, 0))))
  np.testing.assert_array_equal(x.pad((0, 0, 0, b)).numpy(), np.pad(a, ((0, 0), (0, 3), (0, 0))))
  np.testing.assert_array_equal(Tensor(a[:, :1]).expand(2, b, 4).numpy(), np.broadcast_to(a[:, :1], (2, 3, 4)))
  assert Tensor.arange(b + 1).tolist() == [0, 1, 2, 3] and Tensor.arange(b, b + 3).tolist() == [3, 4, 5]
  assert Tensor.ones(b, 2).shape == (3, 2) and Tensor.zeros((1, b)).shape == (1, 3) and Tensor.empty(b).shape == (3,)
  assert Tensor.full((1, b + 1), 2.0).tolist() == [[2.0] * 4] and Tensor.full((2,), b).tolist() == [3, 3]
  mask = Tensor.full((1, 1, 2, b + 2), float("-inf")).triu(b + 1).numpy()   # (tinygrad's LLaMA prompt mask)
  np.testing.assert_array_equal(mask, np.triu(np.full((1, 1, 2, 5), -np.inf, np.float32), 4))
  # as a scalar: a weak int, on either side (tinygrad: Tensor([1, 2]) + b is int32)
  assert (Tensor([1, 2]) + b).tolist() == [4, 5] and (b + Tensor([1, 2])).dtype == rulec.dtypes.int32
  assert (Tensor([1.0, 2.0]) * b).tolist() == [3.0, 6.0] and (b * Tensor([1.0, 2.0])).tolist() == [3.0, 6.0]
  assert (Tensor.arange(5) < b).tolist() == [True, True, True, False, False]
  assert Tensor(b).tolist() == 3 and Tensor(b).shape == ()


def test_writes_through_bound_offsets():
  b = Variable("sp", 0, 10).bind(3)
  c = Tensor.zeros(2, 8).contiguous().realize()
  ref = np.zeros((2, 8), np.float32)
  c[:, b] = Tensor([1.0, 2.0]); ref[:, 3] = [1.0, 2.0]
  c[:, b + 1:b + 3] = 5.0; ref[:, 4:6] = 5.0
  c[:, b + 3:b + 4].assign(Tensor([[7.0], [8.0]])).realize(); ref[:, 6:7] = [[7.0], [8.0]]
  c.shrink((None, (b - 3, b - 2))).assign(Tensor([[9.0], [9.0]])).realize(); ref[:, 0:1] = 9.0
  np.testing.assert_array_equal(c.numpy(), ref)


# *** a KV-cache decode loop, as tinygrad's LLaMA and GPT-2 attention decode ***

class Attention:
  """One attention layer with a KV cache: the cache is made and realized once, each step writes its position
  (`cache[:, :, start_pos:start_pos+1].assign(...)`) and attends over positions 0..start_pos."""

  def __init__(self, dim: int, n_heads: int, max_context: int, seed: int = 0):
    r = rng(seed)
    self.wq, self.wk, self.wv, self.wo = (Tensor(r.standard_normal((dim, dim)).astype(np.float32) / np.sqrt(dim))
                                          for _ in range(4))
    self.n_heads, self.head_dim, self.max_context = n_heads, dim // n_heads, max_context

  def __call__(self, x: Tensor, start_pos) -> Tensor:
    bsz, seqlen, dim = x.shape
    xq, xk, xv = (t.reshape(bsz, seqlen, self.n_heads, self.head_dim) for t in (x @ self.wq, x @ self.wk, x @ self.wv))
    if not hasattr(self, "cache"):
      self.cache = Tensor.zeros(2, bsz, self.max_context, self.n_heads, self.head_dim).contiguous().realize()
    self.cache[:, :, start_pos:start_pos + seqlen].assign(Tensor.stack(xk, xv)).realize()
    keys, values = self.cache[0, :, 0:start_pos + seqlen], self.cache[1, :, 0:start_pos + seqlen]
    xq, keys, values = xq.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2)
    att = (xq @ keys.transpose(2, 3) / np.sqrt(self.head_dim)).softmax(-1)
    return (att @ values).transpose(1, 2).reshape(bsz, seqlen, dim) @ self.wo


class Reference:
  """The same layer in numpy."""

  def __init__(self, layer: Attention):
    self.w = [t.numpy().astype(np.float64) for t in (layer.wq, layer.wk, layer.wv, layer.wo)]
    self.h, self.hd = layer.n_heads, layer.head_dim
    self.cache = np.zeros((2, 1, layer.max_context, self.h, self.hd))

  def __call__(self, x: np.ndarray, sp: int) -> np.ndarray:
    b, s, d = x.shape
    q, k, v = ((x @ w).reshape(b, s, self.h, self.hd) for w in self.w[:3])
    self.cache[0, :, sp:sp + s], self.cache[1, :, sp:sp + s] = k, v
    q, keys, vals = q.transpose(0, 2, 1, 3), self.cache[0, :, :sp + s].transpose(0, 2, 1, 3), self.cache[1, :, :sp + s].transpose(0, 2, 1, 3)
    att = q @ keys.transpose(0, 1, 3, 2) / np.sqrt(self.hd)
    att = np.exp(att - att.max(-1, keepdims=True))
    att /= att.sum(-1, keepdims=True)
    return (att @ vals).transpose(0, 2, 1, 3).reshape(b, s, d) @ self.w[3]


@pytest.mark.parametrize("mode", ["int", "variable", "jit"])
def test_kv_cache_decode_loop_matches_numpy(mode):
  dim, heads, ctx = 16, 2, 12
  layer = Attention(dim, heads, ctx, seed=1)
  ref = Reference(layer)
  step = TinyJit(layer.__call__) if mode == "jit" else layer.__call__
  var = Variable("start_pos", 0, ctx - 1)
  xs = rng(2).standard_normal((8, 1, 1, dim)).astype(np.float32)
  for sp in range(8):
    got = step(Tensor(xs[sp]), sp if mode == "int" else var.bind(sp)).numpy()
    np.testing.assert_allclose(got, ref(xs[sp].astype(np.float64), sp), rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(layer.cache.numpy(), ref.cache, rtol=1e-4, atol=1e-5)


def test_jit_replays_one_capture_for_every_start_pos():
  """start_pos = 1, 2, 3, 1, 1, 2, 3, 1: the same values as eager every call. The cache write (an offset) and
  the attention over 0..start_pos (a size) both keep start_pos symbolic, so call 2's capture serves every value:
  calls 3..8 replay it with their own start_pos, and compile nothing."""
  dim, heads, ctx = 12, 3, 10   # (sizes no other test uses, so the compile counts are this test's own)
  eager, jitted = Attention(dim, heads, ctx, seed=3), Attention(dim, heads, ctx, seed=3)
  jstep = TinyJit(jitted.__call__)
  var = Variable("start_pos", 0, ctx - 1)
  xs = rng(4).standard_normal((8, 1, 1, dim)).astype(np.float32)
  compiled, scheduled = [], []
  for i, sp in enumerate([1, 2, 3, 1, 1, 2, 3, 1]):
    want = eager(Tensor(xs[i]), sp).numpy()
    before, s0 = cpu_device.COUNTERS["compiled"] + cpu_device.COUNTERS["loaded"], rulec.engine.realize.COUNTERS["scheduled"]
    got = jstep(Tensor(xs[i]), var.bind(sp)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    compiled.append(cpu_device.COUNTERS["compiled"] + cpu_device.COUNTERS["loaded"] - before)
    scheduled.append(rulec.engine.realize.COUNTERS["scheduled"] - s0)
  np.testing.assert_allclose(jitted.cache.numpy(), eager.cache.numpy(), rtol=1e-5, atol=1e-6)
  assert jstep.general[(var,)] is jstep.captured and not jstep.runs
  # (eager, with an int start_pos, builds other kernels: what the jitted calls compile is their own, once)
  assert compiled[2:] == [0] * 6
  assert scheduled[2:] == [0] * 6   # (the replays schedule nothing)


def test_kernels_compiled_once_for_every_position():
  """A decode step runs 7 kernels; its first two calls build them (the second captures), and no later position
  compiles or schedules anything: each replays the capture with its own start_pos (tinygrad's symbolic JIT)."""
  dim, heads, ctx = 20, 4, 9
  layer = Attention(dim, heads, ctx, seed=5)
  jstep = TinyJit(layer.__call__)
  var = Variable("start_pos", 0, ctx - 1)
  x = Tensor(rng(6).standard_normal((1, 1, dim)).astype(np.float32)).realize()
  ref = Reference(layer)
  jstep(x, var.bind(0)); ref(x.numpy().astype(np.float64), 0)
  new = []
  for sp in [1, 2, 3, 4, 5, 6, 7, 8]:
    c0, k0 = cpu_device.COUNTERS["compiled"] + cpu_device.COUNTERS["loaded"], GlobalCounters.kernel_count
    s0 = rulec.engine.realize.COUNTERS["scheduled"]
    out = jstep(x, var.bind(sp)).numpy()
    np.testing.assert_allclose(out, ref(x.numpy().astype(np.float64), sp), rtol=1e-4, atol=1e-5)
    new.append((cpu_device.COUNTERS["compiled"] + cpu_device.COUNTERS["loaded"] - c0, GlobalCounters.kernel_count - k0,
                rulec.engine.realize.COUNTERS["scheduled"] - s0))
  assert [c for c, _, _ in new] == [0] * 8, new
  assert [s for _, _, s in new[1:]] == [0] * 7, new
  assert len({k for _, k, _ in new}) == 1, new


def test_bound_values_inside_containers_and_read_from_the_closure():
  w = Tensor(rng(7).standard_normal((6, 4)).astype(np.float32))
  # a bound Variable inside a tuple argument keys the capture like a plain one
  f = TinyJit(lambda x, se: (x * w[se[0]:se[1]].sum(0)).realize())
  v = Variable("s", 0, 5)
  a = rng(8).standard_normal(4).astype(np.float32)
  for s in [0, 1, 0, 1, 0, 1, 2]:
    np.testing.assert_allclose(f(Tensor(a), (v.bind(s), v.bind(s) + 1)).numpy(), a * w.numpy()[s], rtol=1e-6)
  # a function that reads a bound value from outside its arguments: a capture cannot tell the value changed,
  # so it is never replayed, and every call runs the function
  box = {"pos": v.bind(0)}
  g = TinyJit(lambda x: (x * w[box["pos"]]).realize())
  for s in [0, 1, 2, 3, 4]:
    box["pos"] = v.bind(s)
    np.testing.assert_allclose(g(Tensor(a)).numpy(), a * w.numpy()[s], rtol=1e-6)
  assert g.captured is None


def test_gpt2_style_token_embedding_by_shrink():
  """GPT-2's decode step embeds its token with `wte.weight.shrink(((tokens, tokens+1), None))`, the token id a
  bound Variable, and its position with `allpos.shrink((None, (start_pos, start_pos+1)))`."""
  vocab, ctx, dim = 11, 8, 6
  wte, wpe = (rng(9).standard_normal((n, dim)).astype(np.float32) for n in (vocab, ctx))
  twte, twpe, allpos = Tensor(wte), Tensor(wpe), Tensor.arange(0, ctx).reshape(1, -1).realize()
  @TinyJit
  def embed(tokens, start_pos):
    pos = allpos.shrink((None, (start_pos, start_pos + 1)))
    return (twte.shrink(((tokens, tokens + 1), None)) + (pos.one_hot(ctx).float() @ twpe)).realize()
  tv, pv = Variable("tokens", 0, vocab - 1), Variable("start_pos", 0, ctx - 1)
  for tok, sp in [(3, 0), (5, 1), (3, 0), (3, 0), (10, 7), (3, 0)]:
    np.testing.assert_allclose(embed(tv.bind(tok), pv.bind(sp)).numpy(), (wte[tok] + wpe[sp])[None, None], rtol=1e-6)


# *** memory: a long jitted decode loop ***

def _live_buffers() -> int:
  """Live BUFFER nodes that name storage (the schedule cache's slot stand-ins hold none)."""
  gc.collect()
  return sum(1 for o in gc.get_objects() if type(o) is UOp and o.op is Ops.BUFFER and isinstance(o.arg[0], int))


def test_memory_stays_flat_over_a_200_step_jitted_decode_loop(monkeypatch):
  """Under no_grad, as tinygrad's LLM examples decode (`Tensor.no_grad = True`). On the NUMPY device: what is
  kept alive is the front end's and the JIT's business, and NUMPY compiles nothing, so 200 positions take
  seconds."""
  monkeypatch.setenv("RULEC_DEVICE", "NUMPY")
  monkeypatch.setattr(Tensor, "no_grad", True)
  layer = Attention(8, 2, 256, seed=10)
  step = TinyJit(layer.__call__)
  var = Variable("start_pos", 0, 255)
  x = Tensor(rng(11).standard_normal((1, 1, 8)).astype(np.float32)).realize()
  counts = {}
  for sp in range(200):
    x = step(x, var.bind(sp)).realize()
    if sp in (20, 199): counts[sp] = (_live_buffers(), GlobalCounters.mem_used)
  assert counts[199][0] <= counts[20][0] + 4, counts
  assert counts[199][1] <= counts[20][1] + 4096, counts
  assert len(step.runs) <= TinyJit.max_keys and np.isfinite(x.numpy()).all()
