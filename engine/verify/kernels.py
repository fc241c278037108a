"""`rulec verify` for kernel rules the generator cannot build graphs for: a rule set listed in PROGRAMS is checked on
the kernels the scheduler makes of small random programs that hold its pattern. Each kernel the rule changes runs
twice on the NUMPY reference device (runtime/numpy_device.py), as scheduled and as rewritten, on the same inputs,
and the stored values must agree to float reassociation (relative 1e-4 of the row's magnitude; NaN where NaN).

rules/online.rules (a sum over a softmax's row with a running max): the programs are `softmax(q @ k.T * s + mask) @ v`
in the forms tinygrad code writes it (scaled_dot_product_attention with and without is_causal, a boolean or float
mask, or the product and softmax spelled out), with shapes from 1 to 9 per axis, scores spread wide enough that
exp underflows, and masks that leave whole rows empty (their value is NaN either way). The NUMPY device evaluates
RUNMAX as the renderers' one pass computes it (each term with the max so far, rescaled as the max grows), so a rule
that put a running max where a term is not proportional to exp2(-a * max) is refuted.
"""
from __future__ import annotations

import math

import numpy as np
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from rulec.engine.ir.kernel import Kernel
from rulec.engine.ir.rewrite import graph_rewrite
from rulec.engine.lang import ast as A
from rulec.engine.lang.runtime import RuleAbort
from rulec.engine.sched import fusion
from rulec.engine.sched.driver import schedule
from rulec.engine.verify.evaluate import compiled_rule
from rulec.runtime import numpy_device
from rulec.runtime.buffer import buffer_of

RTOL = 1e-4


def _attention(draw) -> object:
  """A small attention program on the NUMPY device (a Tensor)."""
  from rulec.engine.tensor import Tensor   # (the front end: verify sits above it)
  b, h = draw(st.integers(1, 2)), draw(st.integers(1, 2))
  t, s, d = draw(st.integers(1, 9)), draw(st.integers(1, 9)), draw(st.integers(1, 5))
  spread = draw(st.sampled_from([0.5, 3.0, 40.0]))
  rng = np.random.default_rng(draw(st.integers(0, 2 ** 16)))
  q = Tensor((rng.standard_normal((b, h, t, d)) * spread).astype(np.float32), device="NUMPY")
  k = Tensor(rng.standard_normal((b, h, s, d)).astype(np.float32), device="NUMPY")
  v = Tensor(rng.standard_normal((b, h, s, d)).astype(np.float32), device="NUMPY")
  form = draw(st.sampled_from(["sdpa", "causal", "bool_mask", "float_mask", "spelled"]))
  if form == "causal" and t != s: form = "sdpa"
  if form == "sdpa": return q.scaled_dot_product_attention(k, v)
  if form == "causal": return q.scaled_dot_product_attention(k, v, is_causal=True)
  keep = rng.random((t, s)) > draw(st.sampled_from([0.0, 0.5, 0.9]))
  if form == "bool_mask": return q.scaled_dot_product_attention(k, v, attn_mask=Tensor(keep, device="NUMPY"))
  if form == "float_mask":
    return q.scaled_dot_product_attention(k, v, attn_mask=Tensor(np.where(keep, 0.0, -np.inf).astype(np.float32), device="NUMPY"))
  scale = draw(st.sampled_from([1.0, 0.125, 2.0]))
  return (q @ k.transpose(-2, -1) * scale).softmax(-1) @ v


# rule set -> a hypothesis draw of a program (a Tensor on the NUMPY device) whose kernels hold its pattern
PROGRAMS = {"online": _attention}


class _One:
  """One rule as a matcher for graph_rewrite."""
  def __init__(self, fn): self.fn = fn
  def rewrite(self, u, ctx):
    try: return self.fn(u, ctx)
    except RuleAbort: return None


def _stored(kernel: Kernel) -> np.ndarray:
  numpy_device.run_kernel(kernel)
  return buffer_of(kernel.bufs[0]).numpy_view().copy()


def _close(want: np.ndarray, got: np.ndarray) -> bool:
  if want.shape != got.shape or not np.array_equal(np.isnan(want), np.isnan(got)): return False
  ok = ~np.isnan(want)
  scale = max(1.0, float(np.abs(want[ok]).max(initial=0.0)))
  return bool(np.all(np.abs(want[ok] - got[ok]) <= RTOL * scale))


def verify_kernel_rule(rule: A.Rule, helpers_of, examples: int, res):
  """res (a RuleResult) filled in for a rule of a set in PROGRAMS: verified on the kernels it changed, or refuted
  with the first kernel whose values differ; None for any other rule."""
  draw_program = PROGRAMS.get(rule.ruleset)
  if draw_program is None: return None
  fn, _ = compiled_rule(rule, helpers_of)
  matcher = _One(fn)
  found: dict = {}
  counts = {"changed": 0}

  @settings(max_examples=examples, derandomize=True, database=None, deadline=None, report_multiple_bugs=False,
            suppress_health_check=list(HealthCheck), phases=(Phase.generate,), print_blob=False)
  @given(st.data())
  def prop(data):
    out = draw_program(data.draw)
    saved = fusion.ONLINE_SOFTMAX_BYTES
    fusion.ONLINE_SOFTMAX_BYTES = -1   # (every softmax the pattern holds is one kernel, whatever its size)
    try: kernels, _ = schedule([out.uop], "NUMPY")
    finally: fusion.ONLINE_SOFTMAX_BYTES = saved
    for k in kernels:
      new = graph_rewrite(k.ast, matcher)
      if new is k.ast:
        numpy_device.run_kernel(k)
        continue
      counts["changed"] += 1
      want = _stored(k)
      got = _stored(Kernel(new, k.bufs))
      if not _close(want, got):
        bad = np.argmax(np.abs(np.nan_to_num(want - got, nan=math.inf)))
        found.update(before=k.render(), after=Kernel(new, k.bufs).render(), why="different values",
                     values=f"element {bad}: before = {want.flat[bad]!r}, after = {got.flat[bad]!r}")
        raise AssertionError("refuted")

  try: prop()
  except AssertionError:
    if not found: raise
    res.status, res.counterexample, res.examples = "refuted", found, counts["changed"]
    return res
  res.examples = counts["changed"]
  if counts["changed"]: res.status = "verified"
  else: res.reason = f"the rule changed no kernel of {examples} programs"
  return res


__all__ = ["PROGRAMS", "verify_kernel_rule"]
