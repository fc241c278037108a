"""`rulec demo`: the rule engine at work on real index arithmetic.

Random index expressions of the kind movement ops produce are simplified by
rules/symbolic.rules; every result is checked against the original at sampled
points of its ranges, and a table of what happened is printed.
"""
from __future__ import annotations

import random
import time


def run_demo(args) -> int:
  from engine.index_expr import build, evaluate, leaf_values, leaves_of, random_recipe
  from engine.lang.loader import load_library
  from engine.rewrite import graph_rewrite
  from engine.uop import UOp

  t0 = time.perf_counter()
  lib = load_library()
  m = lib.matcher("symbolic")
  t_load = time.perf_counter() - t0
  rng = random.Random(0)
  exprs = [build(random_recipe(rng)) for _ in range(args.count)]
  sink = UOp.sink(*exprs)
  nodes_in = len(sink.toposort())
  t0 = time.perf_counter()
  out = graph_rewrite(sink, m)
  t_rw = time.perf_counter() - t0
  nodes_out = len(out.toposort())
  bad, checked = 0, 0
  for before, after in zip(exprs, out.src):
    leaves = leaves_of(before)
    for _ in range(4):
      env = {leaf: rng.choice(leaf_values(leaf)) for leaf in leaves}
      checked += 1
      if evaluate(before, env) != evaluate(after, env): bad += 1
  rows = [("rule files loaded + compiled", f"{t_load * 1e3:.1f} ms"),
          ("expressions", f"{len(exprs)}"),
          ("distinct nodes before -> after", f"{nodes_in} -> {nodes_out}"),
          ("graph_rewrite time", f"{t_rw * 1e3:.1f} ms ({nodes_in / t_rw / 1e3:.0f}k nodes/s)"),
          ("checked against evaluation", f"{checked} points, {bad} mismatches")]
  w = max(len(k) for k, _ in rows)
  print("rulec demo: symbolic simplification of index expressions (rules/symbolic.rules)")
  for k, v in rows: print(f"  {k:<{w}}  {v}")
  for before, after in list(zip(exprs, out.src))[:5]: print(f"  {before}\n    => {after}")
  return 1 if bad else 0
