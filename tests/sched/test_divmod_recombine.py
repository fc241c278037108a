"""(x // c) * (k * c) + (x % c) * k is k * x wherever the two stand in a sum (symbolic.rules divmod_recombine_sum):
a value stored (B, T, H, D) and read as (B, T, H * D) is then read through one range's steps."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rulec import Tensor
from rulec.engine.ir.ops import Ops
from rulec.engine.ir.rewrite import graph_rewrite
from rulec.engine.ir.uop import UOp
from rulec.engine.lang.loader import load_library


def _value(u: UOp, env: dict) -> int:
  if u.op is Ops.DEFINE_VAR: return env[u]
  if u.op is Ops.CONST: return u.arg
  a = [_value(s, env) for s in u.src]
  return {Ops.ADD: lambda: a[0] + a[1], Ops.MUL: lambda: a[0] * a[1], Ops.IDIV: lambda: a[0] // a[1],
          Ops.MOD: lambda: a[0] % a[1]}[u.op]()


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([2, 4, 8, 64]), st.integers(1, 3), st.integers(0, 5), st.permutations(range(4)),
       st.integers(0, 2**16))
def test_a_sum_with_a_quotient_and_its_remainder_loses_both(c, k, off, order, seed):
  x, y = UOp.variable("x", 0, 1000), UOp.variable("y", 0, 50)
  terms = [(x // c) * (k * c), (x % c) * k, y * 768, UOp.const(x.dtype, off)]
  s = terms[order[0]]
  for i in order[1:]: s = s + terms[i]
  out = graph_rewrite(s, load_library().matcher("symbolic"))
  assert not any(n.op in (Ops.IDIV, Ops.MOD) for n in out.toposort()), out
  rng = np.random.default_rng(seed)
  for _ in range(20):
    env = {x: int(rng.integers(0, 1001)), y: int(rng.integers(0, 51))}
    assert _value(out, env) == _value(s, env)


def test_an_attention_output_read_as_rows_merges_its_weight_gradients_sum():
  rng = np.random.default_rng(4)
  B, H, T, D = 2, 3, 8, 4
  q, k, v = (rng.standard_normal((B, H, T, D)).astype(np.float32) for _ in range(3))
  w = rng.standard_normal((H * D, H * D)).astype(np.float32)
  g = rng.standard_normal((B, T, H * D)).astype(np.float32)
  tw = Tensor(w, requires_grad=True)
  a = (Tensor(q) @ Tensor(k).transpose(2, 3)).softmax(-1) @ Tensor(v)   # (B, H, T, D), a reduce read twice below
  y = a.transpose(1, 2).reshape(B, T, H * D) @ tw
  (y * Tensor(g)).sum().backward()
  wk = [kk for kk in tw.grad.schedule() if sorted(r.src[0].arg for r in kk.ast.ranges)[:2] == [B, T]]
  loads = [u.src[1] for kk in wk for u in kk.ast.toposort() if u.op is Ops.INDEX and u.arg != "store"]
  assert loads and not any(m.op in (Ops.IDIV, Ops.MOD) for i in loads for m in i.toposort()), loads
  e = np.exp(q @ k.transpose(0, 1, 3, 2) - (q @ k.transpose(0, 1, 3, 2)).max(-1, keepdims=True))
  an = (e / e.sum(-1, keepdims=True)) @ v
  rows = an.transpose(0, 2, 1, 3).reshape(B * T, H * D)
  np.testing.assert_allclose(tw.grad.numpy(), rows.T @ g.reshape(B * T, H * D), rtol=1e-4, atol=1e-4)
