"""The fusion facts (engine/sched/fusion.py FusionFacts) kept between decisions: a store or a hoist forgets only the
facts it changes, and everything asked afterwards is what a count from scratch gives. Checked on real programs'
graphs (the graph the scheduler hands the fusion rules), with the questions asked between decisions drawn by
hypothesis, so that the facts kept are in every state of knowing; and the work a long program's fusion costs is
counted (facts worked out), never timed."""
from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from rulec.engine.ir.ops import Ops
from rulec.engine.sched import cache as schedule_cache, driver, fusion
from rulec.engine.tensor import Tensor

EXAMPLES = int(os.environ.get("RULEC_FUSION_FACT_EXAMPLES", "12"))


def _r(rng, *shape):
  return Tensor(rng.standard_normal(shape).astype(np.float32))


def _chain(n: int):
  rng = np.random.default_rng(0)
  x = _r(rng, 16, 16)
  y = x
  for i in range(n):
    y = (y * 1.0001 + 0.5).sin()
    if i % 3 == 0: y = y.maximum(x)
    if i % 5 == 0: y = y - y.mean()
  return [y]


def _attention_block():
  rng = np.random.default_rng(1)
  x, w, wo = _r(rng, 2, 8, 16), _r(rng, 16, 48), _r(rng, 16, 16)
  h = x.layernorm()
  q, k, v = (h @ w).chunk(3, dim=-1)
  att = (q @ k.transpose(-1, -2) / 4).softmax(-1) @ v
  out = x + (att @ wo).gelu()
  return [out, h.mean()]


def _backward():
  rng = np.random.default_rng(2)
  x, w = _r(rng, 4, 3, 8, 8), Tensor(np.random.default_rng(3).standard_normal((5, 3, 3, 3)).astype(np.float32), requires_grad=True)
  y = x.conv2d(w, padding=1).relu()
  loss = (y - y.mean(axis=(0, 2, 3), keepdim=True)).square().mean()
  return [loss, *loss.gradient(w)]


PROGRAMS = {"chain": lambda: _chain(30), "attention block": _attention_block, "conv backward": _backward}


def _fusion_input(make):
  """(the sink the fusion pass is given, its arguments) for the program's outputs, scheduled on the CPU."""
  seen = []
  real = driver.choose_stages
  def spy(sink, sets, *args, upward_sets=()):
    seen.append((sink, sets, (*args, upward_sets)))
    return real(sink, sets, *args, upward_sets=upward_sets)
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(driver, "choose_stages", spy)
    schedule_cache.clear()
    outs = make()
    Tensor.schedule(*outs)
  assert seen, "the program reached no fusion pass"
  return max(seen, key=lambda s: len(s[0].toposort()))


def _answers(facts: fusion.FusionFacts, nodes) -> dict:
  out = {}
  for u in nodes:
    out[u] = (facts.uses(u), facts.contexts(u), facts.repeats(u), facts.reads(u), facts.reduces_inside(u),
              facts.cost(u), facts.transcendentals(u), facts.epilogue_cost(u) if u.op is Ops.REDUCE_AXIS else None,
              facts.kernel_ops(u), facts._region(u)[2])
  return out


class _Asking:
  """A fusion rule set that asks the facts of some nodes before each rule set's own decision (drawn by the test)."""
  def __init__(self, inner, ask):
    self.inner, self.ask = inner, ask

  def rewrite(self, u, facts):
    self.ask(facts)
    return self.inner.rewrite(u, facts)


@pytest.mark.parametrize("name", list(PROGRAMS))
@settings(max_examples=EXAMPLES, deadline=None)
@given(data=st.data())
def test_facts_kept_between_decisions_are_those_counted_afresh(name, data):
  sink, sets, args = _fusion_input(PROGRAMS[name])
  order = sink.toposort()
  decisions = []
  def ask(facts):
    # a few nodes, drawn: facts are worked out for them (and for what they depend on) and kept
    k = data.draw(st.integers(0, 3))
    _answers(facts, [order[data.draw(st.integers(0, len(order) - 1))] for _ in range(k)])
  *args, upward = args
  facts = fusion.FusionFacts(sink, *args)
  real_store, real_hoist = facts.store, facts.hoist
  facts.store = lambda x: (decisions.append(("store", x)), real_store(x))[1]
  facts.hoist = lambda x: (decisions.append(("hoist", x)), real_hoist(x))[1]
  for m in [_Asking(m, ask) for m in sets]:
    for u in reversed(facts.order): m.rewrite(u, facts)
  for m in [_Asking(m, ask) for m in upward]:
    for u in facts.order: m.rewrite(u, facts)
  assert decisions, "no decision to keep facts across"
  # afresh: the same decisions on a new set of facts that knows nothing yet
  fresh = fusion.FusionFacts(sink, *args)
  for what, x in decisions: getattr(fresh, what)(x)
  assert fresh.staged == facts.staged and fresh.hoisted == facts.hoisted
  assert _answers(facts, order) == _answers(fresh, order)


def test_a_long_program_works_out_each_count_a_bounded_number_of_times(monkeypatch):
  # the use counts of a chain of 600 ops: every decision forgets only the counts below it that were asked, so the
  # counts worked out grow with the program, not with the program times its decisions
  counted = []
  real = fusion._UseCounts._pull
  for n in (150, 600):
    sink, sets, args = _fusion_input(lambda: _chain(n))
    monkeypatch.setattr(fusion._UseCounts, "_pull", lambda self, s: (counted.append(s), real(self, s))[1])
    counted.clear()
    *args, upward = args
    staged = fusion.choose_stages(sink, sets, *args, upward_sets=upward)
    nodes = len(sink.toposort())
    assert len(staged) > n // 10
    assert len(counted) <= 3 * nodes, (n, len(counted), nodes)


def test_a_long_chain_of_maximums_of_itself_schedules():
  # y.maximum(f(y)) is a WHERE over y twice: 300 of them nested once reached the symbolic rules' guarded rebuild
  # under 2**depth guard tuples (where_affine timed out); there is no // or % to fit here, so nothing is walked
  x = Tensor(np.random.default_rng(4).standard_normal((8, 8)).astype(np.float32))
  y, want = x, x.numpy().astype(np.float64)
  for i in range(300):
    y = (y * 1.0001 + 0.5).sin()
    y = y.maximum(y * 0.5)
    want = np.sin(want * 1.0001 + 0.5)
    want = np.maximum(want, want * 0.5)
  np.testing.assert_allclose(y.numpy(), want, rtol=1e-4, atol=1e-4)
