"""Shared test helpers: compile rules from text without touching the default library; subprocess environments."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from rulec.engine.lang.compiler import generate
from rulec.engine.lang.interp import InterpretedMatcher
from rulec.engine.lang.loader import check_sources
from rulec.engine.tensor import Tensor


class TextMatcher:
  """A compiled matcher for one rule set of a rules text (bypasses the disk cache)."""
  def __init__(self, text: str, ruleset: str, path: str = "t.rules"):
    self.lib = check_sources({path: text})
    assert not self.lib.errors, "\n".join(d.render(text) for d in self.lib.errors)
    self.rules = self.lib.flat_rules(ruleset)
    self.source = generate(self.rules, self.lib.helpers_of, title=ruleset)
    ns: dict = {}
    exec(compile(self.source, f"<{ruleset}>", "exec"), ns)
    self.dispatch = ns["DISPATCH"]
    self.reference = InterpretedMatcher(self.rules, self.lib.helpers_of)

  def rewrite(self, node, ctx=None):
    fn = self.dispatch.get(node.op)
    return None if fn is None else fn(node, ctx)


REPO = Path(__file__).resolve().parent.parent


def subprocess_env(**extra: str) -> dict:
  """os.environ for a child Python that imports this checkout first (keeping any PYTHONPATH already set)."""
  path = os.pathsep.join([str(REPO)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
  return {**os.environ, "PYTHONPATH": path, **extra}


def on(device: str, data, dtype, fn) -> np.ndarray:
  """fn applied to a Tensor of data on device, as numpy."""
  return fn(Tensor(data, dtype=dtype, device=device)).numpy()


def same_as_reference(device: str, data, dtype, fn) -> np.ndarray:
  """fn on device, checked bit for bit against the NUMPY reference device (NaN == NaN, -0.0 == 0.0 here)."""
  got, ref = on(device, data, dtype, fn), on("NUMPY", data, dtype, fn)
  np.testing.assert_array_equal(got, ref)
  return got
