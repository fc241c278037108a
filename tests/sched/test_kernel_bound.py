"""Kernels of bounded size (rules/fusion.rules bound_kernels, facts kernel_ops and max_kernel_ops): a program whose
values would fuse into one huge kernel is split at stored values, so that no kernel computes more than the bound
per element. Kernels and their ops are counted, never timed; values are checked against numpy."""
from __future__ import annotations

import numpy as np
import pytest

from rulec.engine.ir.ops import ALU, Ops
from rulec.engine.sched import cache as schedule_cache, fusion
from rulec.engine.tensor import Tensor


def _alu_ops(kernel) -> int:
  return sum(1 for u in kernel.ast.toposort() if u.op in ALU)


def _chain(x: Tensor, n: int) -> Tensor:
  y = x
  for i in range(n): y = y * 0.999 + x if i % 2 else (y + x).maximum(x * 0.5)
  return y


def _want(xs: np.ndarray, n: int) -> np.ndarray:
  y = xs.astype(np.float64)
  for i in range(n): y = y * 0.999 + xs if i % 2 else np.maximum(y + xs, xs * 0.5)
  return y


@pytest.mark.parametrize("bound", [40, 200])
def test_a_long_chain_is_split_into_kernels_under_the_bound(bound, monkeypatch):
  monkeypatch.setattr(fusion, "MAX_KERNEL_OPS", bound)
  schedule_cache.clear()
  xs = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
  y = _chain(Tensor(xs), 300)
  kernels = y.schedule()
  ops = [_alu_ops(k) for k in kernels]
  # 300 steps of 2 or 3 ops: about 750 ops, so at least 750 / bound kernels, each near the bound (the ops a
  # kernel's index arithmetic adds are not the value's: a few per load and store)
  assert len(kernels) >= 750 // bound
  assert max(ops) <= bound + 40, ops
  schedule_cache.clear()
  np.testing.assert_allclose(_chain(Tensor(xs), 300).numpy(), _want(xs, 300), rtol=1e-4, atol=1e-4)


def test_the_default_bound_splits_thousands_of_adds_and_leaves_small_programs_alone():
  schedule_cache.clear()
  x = Tensor(np.ones((4, 4), np.float32))
  y = x
  for _ in range(3000): y = y + x
  kernels = y.schedule()
  assert 2 <= len(kernels) <= 4 and max(_alu_ops(k) for k in kernels) <= fusion.MAX_KERNEL_OPS + 40
  # a softmax, a layernorm and a matmul's epilogue are far below it: one kernel each, as before
  a = Tensor(np.ones((8, 16), np.float32))
  assert len(a.softmax(-1).schedule()) == 1 and len(a.layernorm().schedule()) == 1


def test_the_bound_is_a_rule_a_users_directory_can_change(tmp_path, monkeypatch):
  # a directory whose bound_kernels stores nothing: the chain is one kernel again
  d = tmp_path / "rules"
  d.mkdir()
  (d / "fusion.rules").write_text("ruleset bound_kernels:\n  rule never: x:ALU if x.size < 0 => ctx.store(x)\n")
  monkeypatch.setenv("RULEC_RULES", str(d))
  monkeypatch.setattr(fusion, "MAX_KERNEL_OPS", 40)
  schedule_cache.clear()
  y = _chain(Tensor(np.ones((4, 4), np.float32)), 100)
  assert len(y.schedule()) == 1
