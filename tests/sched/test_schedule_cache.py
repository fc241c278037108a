"""The schedule cache (engine/sched/cache.py): a graph of a shape seen before is not scheduled again.

Values are checked against numpy and against the same program with the cache off, bit for bit; hits and misses
are counted; two calls never share an output buffer. Runs on the default device (RULEC_DEVICE)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from rulec.engine import realize as R
from rulec.engine.sched import cache as sc
from rulec.engine.tensor import Tensor
from tests import fuzz_programs as fp


@pytest.fixture(autouse=True)
def fresh_cache(monkeypatch):
  monkeypatch.delenv("RULEC_SCHEDULE_CACHE", raising=False)
  sc.clear()
  yield
  sc.clear()


def arr(*shape, seed=0, dtype=np.float32):
  return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def stats():
  return dict(sc.STATS)


def test_hit_and_miss_are_counted():
  a, b = arr(3, 4, seed=1), arr(3, 4, seed=2)
  out = (Tensor(a) * Tensor(b) + 1).sum(1).numpy()
  assert stats() == {"hits": 0, "misses": 1}
  np.testing.assert_allclose(out, (a * b + 1).sum(1), rtol=1e-5)
  c, d = arr(3, 4, seed=3), arr(3, 4, seed=4)
  out2 = (Tensor(c) * Tensor(d) + 1).sum(1).numpy()   # new buffers, same shape of graph
  assert stats() == {"hits": 1, "misses": 1}
  np.testing.assert_allclose(out2, (c * d + 1).sum(1), rtol=1e-5)


@pytest.mark.parametrize("other", [
  lambda a, b: (a * b + 2).sum(1),              # another constant
  lambda a, b: (a * a + 1).sum(1),              # one buffer twice: another slot pattern
  lambda a, b: (a * b + 1).sum(0),              # another axis
  lambda a, b: (a.cast("float64") * b + 1).sum(1),   # another dtype
  lambda a, b: (a * b + 1).max(1),              # another op
])
def test_other_graph_shapes_miss(other):
  a, b = Tensor(arr(3, 4, seed=1)), Tensor(arr(3, 4, seed=2))
  (a * b + 1).sum(1).realize()
  other(a, b).realize()
  assert stats() == {"hits": 0, "misses": 2}


def test_negative_zero_and_nan_constants_are_keys_of_their_own():
  a = arr(4)
  got = [(Tensor(a) * c).numpy() for c in (0.0, -0.0, float("nan"), float("nan"))]
  assert stats() == {"hits": 1, "misses": 3}   # the second NaN is the first one's shape
  for g, c in zip(got, (0.0, -0.0, float("nan"), float("nan"))): np.testing.assert_array_equal(g, a * np.float32(c))
  assert np.signbit(got[1][a > 0]).all() and not np.signbit(got[0][a > 0]).any()


def test_outputs_of_two_calls_never_share_a_buffer():
  a, b = arr(5, seed=1), arr(5, seed=2)
  t1 = (Tensor(a) + 1).realize()
  t2 = (Tensor(b) + 1).realize()
  assert sc.STATS["hits"] == 1
  assert t1.uop.base is not t2.uop.base
  t2.assign(t2 * 10).realize()   # writing one leaves the other alone
  np.testing.assert_array_equal(t1.numpy(), a + 1)
  np.testing.assert_array_equal(t2.numpy(), (b + 1) * 10)


def test_intermediate_buffers_are_fresh_per_call():
  # a softmax keeps intermediates (the max, the sum): a hit allocates them anew
  a, b = arr(4, 6, seed=1), arr(4, 6, seed=2)
  s1 = Tensor(a).softmax(1)
  s2 = Tensor(b).softmax(1)
  k1 = s1.schedule()
  k2 = s2.schedule()
  assert sc.STATS["hits"] == 1 and len(k1) == len(k2)
  bufs1 = {b for k in k1 for b in k.bufs}
  assert not bufs1 & {b for k in k2 for b in k.bufs}
  for t, x in ((s1, a), (s2, b)):
    e = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(t.numpy(), e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-7)


def test_assign_target_is_a_parameter():
  for seed in range(3):
    a, x = arr(2, 3, seed=seed), arr(2, 3, seed=seed + 10)
    p = Tensor(a)
    p.assign(p * 2 + Tensor(x)).realize()
    np.testing.assert_array_equal(p.numpy(), a * 2 + x)
  assert stats() == {"hits": 2, "misses": 1}


def test_assign_through_a_view_and_several_outputs():
  for seed in range(3):
    a = arr(4, 5, seed=seed)
    p = Tensor(a)
    q = p[1:3]
    old = (p + 0).sum(0)
    q.assign(q * 3)
    outs = [old, p.T.contiguous(), (p * 2)[::2]]
    outs[0].realize(*outs[1:], q)
    want = a.copy()
    want[1:3] *= 3
    # (a write through a view is made before the values realized with it that read its buffer: tinygrad's values
    # for this program; engine/tensor/writes.py)
    np.testing.assert_allclose(outs[0].numpy(), want.sum(0), rtol=1e-5)
    np.testing.assert_array_equal(outs[1].numpy(), want.T)
    np.testing.assert_array_equal(outs[2].numpy(), (want * 2)[::2])
    np.testing.assert_array_equal(p.numpy(), want)
  assert sc.STATS["hits"] >= 2


def test_views_of_inputs_are_rebound():
  # a target that is a view of an input buffer schedules nothing but is still re-bound to this call's buffer
  for seed in range(2):
    a = arr(3, 4, seed=seed)
    x = Tensor(a)
    y, z = (x + 1), x.T
    y.realize(z)
    np.testing.assert_array_equal(z.numpy(), a.T)
    np.testing.assert_array_equal(y.numpy(), a + 1)


def test_views_left_as_graphs_are_rebound_too():
  # several outputs realized together, one of them read again through .contiguous(): realize schedules in rounds,
  # and a round's view of an output still to compute is a graph over buffers. A hit (here from Tensor.schedule
  # just before) must hand back that graph over this call's buffers, not the cache's stand-ins (it read the int
  # input in place of exp2's output: every `!=` came out False; fuzz seed 9921, program 3910)
  for schedule_first in (True, False, True):
    v1 = Tensor(np.array([[1, 4, 3]], dtype="int32"))
    v2 = v1.exp2()
    v6 = v1 != v2.contiguous().stack(v2, axis=-3)
    if schedule_first: Tensor.schedule(v6, v2)
    v6.realize(v2)
    np.testing.assert_array_equal(v6.numpy(), np.ones((2, 1, 3), bool))
    np.testing.assert_array_equal(v2.numpy(), [[2.0, 16.0, 8.0]])
  assert sc.STATS["hits"] >= 2


def test_constant_only_graphs():
  outs = [Tensor.full((3, 4), 2.5).contiguous().realize() for _ in range(3)]
  assert sc.STATS["hits"] == 2
  assert len({o.uop.base for o in outs}) == 3
  for o in outs: np.testing.assert_array_equal(o.numpy(), np.full((3, 4), 2.5, np.float32))


def test_switched_off(monkeypatch):
  monkeypatch.setenv("RULEC_SCHEDULE_CACHE", "0")
  for seed in range(2): (Tensor(arr(3, seed=seed)) + 1).realize()
  assert stats() == {"hits": 0, "misses": 0}


def test_size_is_bounded(monkeypatch):
  monkeypatch.setattr(sc, "MAX_ENTRIES", 3)
  x = Tensor(arr(4))
  for c in range(6): (x + c).realize()
  assert len(sc._entries) == 3
  (x + 5).realize()   # the most recent ones are kept
  assert sc.STATS["hits"] == 1
  (x + 0).realize()   # the oldest went
  assert sc.STATS["misses"] == 7


# *** random programs: the cache's results equal the scheduler's, bit for bit ***

def _program(kind: str, shape: tuple[int, int], seed: int):
  """(function of two tensors -> tensors to realize, numpy reference of the same)."""
  if kind == "elementwise":
    return (lambda a, b: [(a * b - a).relu() + 0.5],
            lambda a, b: [np.maximum(a * b - a, 0) + np.float32(0.5)])
  if kind == "reduce":
    return (lambda a, b: [(a + b).sum(1), a.max(0)], lambda a, b: [(a + b).sum(1), a.max(0)])
  if kind == "matmul":
    return lambda a, b: [a @ b.T], lambda a, b: [a @ b.T]
  if kind == "views":
    return (lambda a, b: [a.T, (a[:, ::2] + b[:, ::2]).flip(0), a.reshape(-1)[1:]],
            lambda a, b: [a.T, (a[:, ::2] + b[:, ::2])[::-1], a.reshape(-1)[1:]])
  if kind == "assign":
    def f(a, b):
      old = a * 1
      a.assign(a + b)
      return [old + a, a]
    return f, lambda a, b: [a + (a + b), a + b]
  raise AssertionError(kind)


def _run(kind, shape, seed):
  a, b = arr(*shape, seed=seed), arr(*shape, seed=seed + 1)
  fn, _ = _program(kind, shape, seed)
  outs = fn(Tensor(a), Tensor(b))
  outs[0].realize(*outs[1:])
  return [o.numpy() for o in outs]


@settings(max_examples=25)
@given(kind=st.sampled_from(["elementwise", "reduce", "matmul", "views", "assign"]),
       shape=st.sampled_from([(2, 3), (4, 4), (3, 8)]), seed=st.integers(0, 1000))
def test_random_programs_same_with_and_without_cache(kind, shape, seed):
  import os
  os.environ["RULEC_SCHEDULE_CACHE"] = "0"
  try: off = _run(kind, shape, seed)
  finally: del os.environ["RULEC_SCHEDULE_CACHE"]
  first = _run(kind, shape, seed + 7)   # fills the cache (or hits it from an earlier example)
  hits = sc.STATS["hits"]
  on = _run(kind, shape, seed)
  assert sc.STATS["hits"] > hits
  for x, y in zip(on, off): np.testing.assert_array_equal(x, y)
  a, b = arr(*shape, seed=seed), arr(*shape, seed=seed + 1)
  for x, w in zip(on, _program(kind, shape, seed)[1](a, b)): np.testing.assert_allclose(x, w, rtol=1e-5, atol=1e-6)
  assert len(first) == len(on)


@pytest.mark.parametrize("start", [0, 30, 60])
def test_fuzz_programs_run_right_from_the_cache(start):
  # each generated program runs twice: the second run's graphs come from the cache and are checked against
  # the program's numpy expectations like the first
  device = R.DEFAULT_DEVICE
  for i in range(start, start + 30):
    p = fp.generate(1, i, device, small=True)
    assert fp.run_program(p) is None, f"program {i} (cold cache)"
    assert fp.run_program(p) is None, f"program {i} (from the cache)"
  assert sc.STATS["hits"] > 0


def test_a_hit_runs_no_scheduling_work(monkeypatch):
  # counted, not timed: a miss runs the scheduler's rule passes (graph_rewrite calls, the fusion pass); a hit
  # runs none of them and gives the same kernels over this call's buffers
  from rulec.engine.sched import driver
  work = {"schedule": 0, "graph_rewrite": 0, "fusion": 0, "rewrites": 0}
  def counted(name, fn):
    def wrapper(*a, **kw):
      work[name] += 1
      return fn(*a, **kw)
    return wrapper
  monkeypatch.setattr(sc._scheduler, "schedule_keeping", counted("schedule", sc._scheduler.schedule_keeping))
  monkeypatch.setattr(driver, "choose_stages", counted("fusion", driver.choose_stages))
  orig_rewrite = driver.graph_rewrite
  def graph_rewrite(sink, matcher, *a, **kw):
    work["graph_rewrite"] += 1
    class Counting:   # every node the pass asks its matcher about
      def rewrite(self, u, ctx=None):
        work["rewrites"] += 1
        return matcher.rewrite(u, ctx)
      def __getattr__(self, name): return getattr(matcher, name) if name != "dispatch" else None
    return orig_rewrite(sink, Counting(), *a, **kw)
  monkeypatch.setattr(driver, "graph_rewrite", graph_rewrite)
  rng = np.random.default_rng(0)
  ws = [rng.standard_normal(s).astype(np.float32) for s in [(16, 32), (32,), (32, 8), (8,)]]
  def step():
    w1, b1, w2, b2 = (Tensor(w) for w in ws)
    x = Tensor(rng.standard_normal((4, 16)).astype(np.float32))
    loss = ((x @ w1 + b1).relu() @ w2 + b2).square().mean()
    loss.backward()
    return [loss, w1.grad, b1.grad, w2.grad, b2.grad]
  per_call, kernels = [], []
  for _ in range(3):
    outs = step()
    uops, devs = [t.uop for t in outs], [t.device for t in outs]
    before = dict(work)
    ks, _ = sc.schedule(uops, R.DEFAULT_DEVICE, devs)
    per_call.append({k: work[k] - before[k] for k in work})
    kernels.append([k.ast for k in ks])
  assert sc.STATS == {"hits": 2, "misses": 1}
  first, *hits = per_call
  assert first["schedule"] == 1 and first["fusion"] == 1 and first["graph_rewrite"] >= 8 and first["rewrites"] > 100, first
  assert hits == [{"schedule": 0, "graph_rewrite": 0, "fusion": 0, "rewrites": 0}] * 2, hits
  assert kernels[1] == kernels[0] and kernels[2] == kernels[0]


def test_rulec_debug_says_a_hit_in_one_line(tmp_path):
  # RULEC_DEBUG=2 used to bypass the cache and print every pass of every realize; a hit is one line now
  import re
  import subprocess
  import sys
  from tests.helpers import subprocess_env
  code = ("import numpy as np\nfrom rulec import Tensor\n"
          "for i in range(3): print('result', (Tensor(np.full((4, 4), i, np.float32)).softmax(-1) + 1).numpy().sum())\n")
  env = subprocess_env(RULEC_DEBUG="2", RULEC_CACHE_DIR=str(tmp_path / "cache"))
  env.pop("RULEC_SCHEDULE_CACHE", None)
  out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300, check=True).stdout
  lines = out.splitlines()
  assert [line for line in lines if line.startswith("result")] == ["result 20.0"] * 3
  assert sum(line.startswith("[schedule] earliest") for line in lines) == 1   # the passes ran once, on the miss
  hits = [line for line in lines if line.startswith("[schedule] cache hit")]
  counts = [line for line in lines if re.fullmatch(r"\[schedule\] \d+ kernels", line)]   # the driver's last line
  assert len(counts) == 1 and len(hits) == 2
  assert hits[0].startswith("[schedule] cache hit: ") and "no pass run (RULEC_SCHEDULE_CACHE=0 runs them)" in hits[0]
  # with the cache off every realize prints its passes, as before
  env["RULEC_SCHEDULE_CACHE"] = "0"
  out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300, check=True).stdout
  assert sum(line.startswith("[schedule] earliest") for line in out.splitlines()) == 3 and "cache hit" not in out
