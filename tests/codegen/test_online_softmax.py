"""Attention as one kernel (rules/fusion.rules online_softmax, rules/online.rules, codegen/online.py): where the fusion
rules keep a softmax whose probabilities only a matmul reads in that matmul's kernel, the kernel rules sum its row
with a running max, the score matrix is never stored, and the values are numpy's (float reassociation aside) on the
CPU, on CL (PoCL here) and on the NUMPY reference device, masks that empty whole rows included."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rulec.codegen import pipeline
from rulec.codegen.opt import Action, OptError, apply
from rulec.engine import realize as R
from rulec.engine.ir.kernel import Kernel, validate
from rulec.engine.ir.ops import Ops
from rulec.engine.ir.uop import UOp
from rulec.engine.ir.dtypes import dtypes
from rulec.engine.sched import fusion
from rulec.engine.sched.driver import schedule
from rulec.engine.tensor import Tensor
from tests.helpers import available_devices


DEVICES = available_devices(("CPU", "NUMPY"))


@pytest.fixture
def online(monkeypatch):
  """Every softmax the pattern holds is one kernel, whatever the size of its scores."""
  monkeypatch.setattr(fusion, "ONLINE_SOFTMAX_BYTES", -1)


def _reference(q, k, v, scale, keep=None, bias=None):
  s = q.astype(np.float64) @ np.swapaxes(k, -1, -2).astype(np.float64) * scale
  if bias is not None: s = s + bias
  if keep is not None: s = np.where(keep, s, -np.inf)
  with np.errstate(invalid="ignore"):
    p = np.exp(s - s.max(-1, keepdims=True))
    p = p / p.sum(-1, keepdims=True)
  return p @ v.astype(np.float64)


def _attention(form, q, k, v, keep, device):
  T = lambda a: Tensor(a, device=device)  # noqa: E731
  tq, tk, tv = T(q), T(k), T(v)
  if form == "sdpa": return tq.scaled_dot_product_attention(tk, tv)
  if form == "causal": return tq.scaled_dot_product_attention(tk, tv, is_causal=True)
  if form == "bool_mask": return tq.scaled_dot_product_attention(tk, tv, attn_mask=T(keep))
  if form == "float_mask": return tq.scaled_dot_product_attention(tk, tv, attn_mask=T(np.where(keep, 0.0, -np.inf).astype(np.float32)))
  return (tq @ tk.transpose(-2, -1) * 0.5).softmax(-1) @ tv


def _check(form, b, h, t, s, d, spread, seed, device, drop=0.5):
  rng = np.random.default_rng(seed)
  q = (rng.standard_normal((b, h, t, d)) * spread).astype(np.float32)
  k, v = (rng.standard_normal((b, h, s, d)).astype(np.float32) for _ in range(2))
  keep = rng.random((t, s)) >= drop
  if form == "causal": keep = np.tril(np.ones((t, s), bool))
  scale = 0.5 if form == "spelled" else 1 / np.sqrt(d)
  want = _reference(q, k, v, scale, None if form in ("sdpa", "spelled") else keep)
  before = R.COUNTERS["scheduled"]
  got = _attention(form, q, k, v, keep, device).numpy()
  assert R.COUNTERS["scheduled"] - before == 1   # one kernel: the scores, max and sum are stored nowhere
  assert np.array_equal(np.isnan(got), np.isnan(want))   # a row with every score masked is NaN, as numpy's
  ok = ~np.isnan(want)
  np.testing.assert_allclose(got[ok], want[ok], rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("form", ["sdpa", "causal", "bool_mask", "float_mask", "spelled"])
def test_attention_is_one_kernel(online, device, form):
  _check(form, 2, 3, 17, 17, 8, 3.0, 0, device)


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(form=st.sampled_from(["sdpa", "causal", "bool_mask", "float_mask", "spelled"]), b=st.integers(1, 2),
       h=st.integers(1, 3), t=st.integers(2, 12), s=st.integers(2, 12), d=st.integers(1, 9),
       spread=st.sampled_from([0.1, 2.0, 60.0]), seed=st.integers(0, 1000), drop=st.sampled_from([0.0, 0.5, 0.95]))
def test_attention_shapes_and_masks(online, device, form, b, h, t, s, d, spread, seed, drop):
  if form == "causal": s = t
  _check(form, b, h, t, s, d, spread, seed, device, drop)


@pytest.mark.parametrize("device", [d for d in DEVICES if d != "NUMPY"])
def test_nan_and_inf_scores(online, device):
  rng = np.random.default_rng(3)
  q, k, v = (rng.standard_normal((1, 2, 6, 4)).astype(np.float32) for _ in range(3))
  q[0, 0, 1, 0] = np.nan   # row 1 of head 0: NaN, as in numpy
  q[0, 1, 2, :] = np.inf   # row 2 of head 1: +inf and -inf scores: NaN
  want = _reference(q, k, v, 0.5)
  got = _attention("spelled", q, k, v, None, device).numpy()
  assert np.array_equal(np.isnan(got), np.isnan(want)) and np.isnan(got).any()
  ok = ~np.isnan(want)
  np.testing.assert_allclose(got[ok], want[ok], rtol=2e-4, atol=2e-5)


def test_small_attention_keeps_its_scores_by_default():
  """Below ctx.online_bytes the scores are stored (faster on this CPU): the kernels of before, not one."""
  rng = np.random.default_rng(0)
  q, k, v = (Tensor(rng.standard_normal((1, 2, 16, 8)).astype(np.float32), device="CPU") for _ in range(3))
  kernels, _ = schedule([q.scaled_dot_product_attention(k, v).uop], "CPU")
  assert len(kernels) > 1


def test_backward_is_not_fused(online):
  """The probabilities are read by the gradient too: not only a matmul's, so not fused; the gradient is numpy's."""
  rng = np.random.default_rng(1)
  qn, kn, vn = (rng.standard_normal((1, 1, 5, 3)).astype(np.float32) for _ in range(3))
  q, k, v = (Tensor(x, requires_grad=True) for x in (qn, kn, vn))
  q.scaled_dot_product_attention(k, v).sum().backward()
  s = qn @ np.swapaxes(kn, -1, -2) / np.sqrt(3)
  p = np.exp(s - s.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
  np.testing.assert_allclose(v.grad.numpy(), np.swapaxes(p, -1, -2) @ np.ones_like(vn), rtol=1e-5)


def _online_kernel():
  rng = np.random.default_rng(0)
  q, k, v = (Tensor(rng.standard_normal((1, 2, 16, 8)).astype(np.float32), device="CPU") for _ in range(3))
  kernels, _ = schedule([q.scaled_dot_product_attention(k, v).uop], "CPU")
  (kernel,) = kernels
  from rulec.codegen.online import online as online_pass
  return kernel, online_pass(kernel)


def test_the_rule_leaves_two_sums_over_one_range_and_no_max(online):
  kernel, low = _online_kernel()
  nodes = low.ast.toposort()
  assert not any(u.op is Ops.REDUCE and u.arg is Ops.MAX for u in nodes)
  runs = [u for u in nodes if u.op is Ops.RUNMAX]
  assert len(runs) == 1 and runs[0].arg == pytest.approx(1.4426950408889634)
  sums = [u for u in nodes if u.op is Ops.REDUCE and u.src[1] is runs[0].src[1]]
  assert len(sums) == 2   # the row's sum beside the products with v: one loop, two accumulators
  assert any(u.op is Ops.REDUCE and u.arg is Ops.MAX for u in kernel.ast.toposort())


def test_the_optimizer_does_not_split_the_running_sum(online):
  kernel, low = _online_kernel()
  r = next(u for u in low.ast.toposort() if u.op is Ops.RUNMAX).src[1]
  for act in (Action("KBLOCK", r.arg[0], 4), Action("SIMD", r.arg[0]), Action("GROUP", None, 32)):
    with pytest.raises(OptError, match="running max"): apply(low, (act,), "CL" if act.op == "GROUP" else "CPU")
  assert pipeline.lower(kernel, "CPU", None).kernel is not None


def test_a_running_max_outside_its_sum_is_invalid():
  r = UOp.range(4, 0, "loop")
  p = UOp(Ops.PARAM, dtypes.float32, (), (0, 4))
  t = p.index(r)
  run = UOp(Ops.RUNMAX, dtypes.float32, (t, r), 1.0)
  end = p.index(r, arg="store").store(run).end(r)
  with pytest.raises(ValueError, match="RUNMAX"):
    validate(Kernel(UOp.sink(end), (UOp(Ops.BUFFER, dtypes.float32, (), (0, "CPU", 4)),)))
  bad = UOp(Ops.RUNMAX, dtypes.float32, (t, r), -1.0)
  s = UOp(Ops.REDUCE, dtypes.float32, (bad.exp2() if hasattr(bad, "exp2") else bad, r), Ops.ADD)
  end = p.index(UOp.const(dtypes.index, 0), arg="store").store(s)
  with pytest.raises(ValueError, match="RUNMAX has arg"):
    validate(Kernel(UOp.sink(end), (UOp(Ops.BUFFER, dtypes.float32, (), (0, "CPU", 4)),)))


def test_rulec_verify_checks_the_rule():
  from rulec.engine.lang.loader import load_library
  from rulec.engine.verify import verify_library
  (res,) = verify_library(load_library(), ["online"], examples=12)
  (rule,) = res.rules
  assert rule.status == "verified" and rule.examples > 0


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_a_softmax_that_reads_its_max_per_element_keeps_its_sum(op):
  """A softmax's max is read per element (exp(x - max) / sum) as well as in its sum: computed anyway, so the sum is
  not made a running one (a branchy one-pass loop, slower than the vectorised sum after the max)."""
  from rulec.codegen.online import online as online_pass
  x = Tensor(np.random.default_rng(0).standard_normal((8, 40)).astype(np.float32), device="CPU")
  (kernel,), _ = schedule([getattr(x, op)(-1).uop], "CPU")
  assert any(u.op is Ops.REDUCE and u.arg is Ops.MAX for u in kernel.ast.toposort())
  assert online_pass(kernel) is kernel


@pytest.mark.parametrize("device", [d for d in DEVICES if d != "NUMPY"])
def test_heads_merged_in_the_output(online, device):
  """A GPT-2 block's attention: q, k, v sliced from one qkv, the output stored as (B, T, H * D). Its store range
  merges heads and head dimension; the optimizer splits it by D into lanes (h = c // D then is the outer part, the
  same in every lane), so each row's scores are computed once per step, not once per column; numpy's values."""
  B, T, H, D = 2, 9, 3, 8
  C = H * D
  rng = np.random.default_rng(5)
  xn = rng.standard_normal((B, T, 3 * C)).astype(np.float32)
  qkv = Tensor(xn, device=device)
  q, k, v = (qkv[:, :, i * C:(i + 1) * C].reshape(B, T, H, D).transpose(1, 2) for i in range(3))
  out = q.scaled_dot_product_attention(k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
  (kernel,), _ = schedule([out.uop], device)
  low = pipeline.lower(kernel, device, None if device == "CPU" else __import__("rulec.runtime.cl_device", fromlist=["x"]).get_device().target)
  assert Action("UPCAST", kernel.ast.src[0].src[-1].arg[0], D) in low.actions
  run = next(u for u in low.kernel.ast.toposort() if u.op is Ops.RUNMAX)
  from rulec.codegen.opt import range_kind
  # (the column lanes, D of them; on the CPU the query rows are lanes too, and the scores do depend on those)
  assert not any(u.op is Ops.RANGE and range_kind(u)[0] == "upcast" and u.src[0].arg == D for u in run.src[0].toposort())
  qn, kn, vn = (xn[:, :, i * C:(i + 1) * C].reshape(B, T, H, D).transpose(0, 2, 1, 3) for i in range(3))
  want = _reference(qn, kn, vn, 1 / np.sqrt(D), np.tril(np.ones((T, T), bool))).transpose(0, 2, 1, 3).reshape(B, T, C)
  np.testing.assert_allclose(out.numpy(), want, rtol=2e-4, atol=2e-5)


def test_a_strangers_online_rule_that_builds_a_bad_kernel_is_named(online, tmp_path, monkeypatch):
  """A rules directory may extend the online set; what it builds is validated, and a node no kernel may hold is
  blamed on the rule (file, line, column), not on the decompositions after it."""
  from rulec.engine.ir.rewrite import RuleRuntimeError
  kernel, _ = _online_kernel()
  (tmp_path / "mine.rules").write_text("ruleset online:\n"
                                       "  rule bad_run: r:REDUCE if r.arg is ADD => UOp(RUNMAX, r.dtype, (r.src[0], r.src[1]), \"x\")\n")
  monkeypatch.setenv("RULEC_RULES", str(tmp_path))
  from rulec.codegen.online import online as online_pass
  with pytest.raises(RuleRuntimeError, match=r"bad_run.*mine.rules:2:3.*RUNMAX has arg"): online_pass(kernel)
