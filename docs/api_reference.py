"""Writes docs/api.md, the Tensor API reference, from the methods' docstrings.

    python docs/api_reference.py          # rewrite docs/api.md
    python docs/api_reference.py --check  # exit 1 if docs/api.md is stale or a public method has no docstring

One section per family module of engine/tensor/ (the order of the mixins in the Tensor class), one line per
public name: its signature and the first line of its docstring. tests/frontend/test_api_reference.py runs --check."""
from __future__ import annotations

import inspect
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from rulec.engine.tensor import Tensor  # noqa: E402

OUT = REPO / "docs" / "api.md"
TITLES = {"TensorBase": "Core: construction, realizing, data, assign", "CreationMixin": "Creation and initialisers",
          "ElementwiseMixin": "Elementwise operators, comparisons, casts, unary math", "MathMixin": "More math",
          "ReduceMixin": "Reductions", "ScansMixin": "Cumulative scans", "MovementMixin": "Movement and basic indexing",
          "ShapeMixin": "Shape functions", "IndexingMixin": "Gather, scatter and advanced indexing",
          "SortingMixin": "Sorting", "NNMixin": "Linear algebra and neural-network functions", "LinalgMixin": "Matrix decompositions",
          "ActivationsMixin": "Activations", "LossesMixin": "Losses", "AutogradMixin": "Autograd",
          "MultiMixin": "Several devices"}


# attributes held in slots (no docstring of their own) and operators, described here
ATTRIBUTES = {"uop": "the tensor-level UOp graph of the value", "device": "the device the value lives on (a tuple of devices for a sharded tensor)",
              "grad": "the accumulated gradient (a Tensor, or None); see backward()",
              "requires_grad": "None (any float tensor gets a gradient), True, or False (excluded from autograd)"}
OPERATORS = {"__add__": "x + y", "__sub__": "x - y", "__mul__": "x * y", "__truediv__": "x / y (true division)",
             "__floordiv__": "x // y (floor division)", "__mod__": "x % y (floor modulo)", "__pow__": "x ** y",
             "__and__": "x & y (bitwise and, logical for bool)", "__or__": "x | y", "__xor__": "x ^ y",
             "__lshift__": "x << y", "__rshift__": "x >> y", "__invert__": "~x (bitwise not)", "__pos__": "+x (itself)",
             "__neg__": "-x", "__matmul__": "x @ y (matmul)", "__lt__": "x < y", "__le__": "x <= y", "__gt__": "x > y",
             "__ge__": "x >= y", "__eq__": "x == y (elementwise)", "__ne__": "x != y (elementwise)", "__abs__": "abs(x)",
             "__repr__": "repr(x): shape, dtype and device (does not realize)"}


# tinygrad 0.14 Tensor names rulec does not have, and why (tests/frontend/test_api_reference.py checks this list
# against a snapshot of tinygrad's names: every name is either here or on rulec's Tensor)
LEFT_OUT = {
  "bfloat16": "no rulec backend computes bfloat16 (the dtype exists for bitcasts and the dtype table only)",
  "threefry": "rulec draws random numbers on the host (numpy's generator); no THREEFRY kernel is rendered",
  "random_bits": "tinygrad's counter-based bits are built on threefry (above)",
  "const": "a tinygrad internal (a constant UOp for a value); rulec's is the module-level rulec.engine.tensor.uops.const",
  "hash": "tinygrad's own tensor hash (a keccak tree), not a tensor operation; left for later",
  "keccak": "SHA-3 over the last axis: needs 64-bit rotations rulec's backends do not render yet; left for later",
  "invalids": "tinygrad's Invalid value (an index-validity marker) has no counterpart in rulec's IR",
  "custom_kernel": "kernels written in tinygrad's UOps: rulec's kernels come from its rules, not user UOp code",
  "call": "tinygrad's function-call UOps (graph functions); rulec has no call boundary in its IR",
  "callify": "as call",
  "as_param": "a parameter slot of tinygrad's function calls (as call)",
  "is_param": "as as_param",
  "is_param_": "as as_param",
  "linear_with_vars": "tinygrad's LINEAR schedule UOp with symbolic variables; rulec's schedule is Tensor.schedule()",
  "schedule_linear": "as linear_with_vars",
  "from_blob": "wraps a raw memory pointer: unsafe, and rulec owns its buffers; copy from numpy instead",
  "from_url": "downloads a file: rulec reads nothing from the network",
  "decode_hevc_frame": "HEVC video decoding on tinygrad's hardware decoders: out of scope",
  "image_conv2d": "tinygrad's image (texture) dtype path for Qualcomm GPUs: image dtypes are out of scope",
  "image_dot": "as image_conv2d",
}


def public_names(cls: type) -> list[str]:
  """Names a user calls: public attributes, and the operators (dunders other than object's plumbing)."""
  own = vars(cls)
  keep = []
  for name, v in own.items():
    if name.startswith("__") and name.endswith("__"):
      if name in ("__init__", "__slots__", "__module__", "__qualname__", "__doc__", "__hash__", "__weakref__",
                  "__firstlineno__", "__static_attributes__", "__dict__", "__annotations__"): continue
      if not callable(v): continue
    elif name.startswith("_"): continue
    if isinstance(v, (int, float, bool, str)) or v is None: continue
    keep.append(name)
  return keep


def describe(cls: type, name: str) -> tuple[str, str | None]:
  v = vars(cls)[name]
  fn = v.fget if isinstance(v, property) else v.__func__ if isinstance(v, (staticmethod, classmethod)) else v
  try: sig = str(inspect.signature(fn))
  except (TypeError, ValueError): sig = "(...)"
  if isinstance(v, property): sig = ""
  kind = "property" if isinstance(v, property) else "classmethod" if isinstance(v, classmethod) else \
    "staticmethod" if isinstance(v, staticmethod) else ""
  if type(v).__name__ == "member_descriptor": return (f"`{name}` (attribute)", ATTRIBUTES.get(name))
  doc = inspect.getdoc(fn) if fn.__doc__ is not None else None
  first = _first_sentence(doc) if doc else OPERATORS.get(name)
  if first is None and name.startswith("__") and name.startswith("__r") and hasattr(cls, "__" + name[3:]):
    first = f"the reflected form of `{'__' + name[3:]}`"
  return (f"`{name}{sig}`" + (f" ({kind})" if kind else ""), first)


def _first_sentence(doc: str) -> str:
  """The docstring's first paragraph on one line, cut after its first sentence when that is long."""
  para = " ".join(doc.strip().split("\n\n")[0].split())
  if len(para) > 160 and ". " in para: para = para[:para.index(". ") + 1]
  return para


def render() -> tuple[str, list[str]]:
  lines = ["# The Tensor API", "",
           "Generated from the docstrings by `python docs/api_reference.py` (CI checks it is current). The API is",
           "tinygrad 0.14's (names, signatures, defaults); rulec's older numpy-style keywords (`axis=`, `ddof=`) are",
           "accepted as aliases. One line per name: its signature and the first sentence of its docstring.",
           ""]
  missing = []
  for cls in Tensor.__mro__[1:-1]:
    names = public_names(cls)
    if not names: continue
    lines += [f"## {TITLES.get(cls.__name__, cls.__name__)}", "", f"`{cls.__module__}`", ""]
    for name in names:
      head, first = describe(cls, name)
      if first is None: missing.append(f"{cls.__module__}.{cls.__name__}.{name}")
      lines.append(f"- {head}: {first or '(undocumented)'}")
    lines.append("")
  lines += ["## tinygrad names left out", "",
            "Every public name of tinygrad 0.14's Tensor is above except these:", ""]
  lines += [f"- `{name}`: {why}" for name, why in LEFT_OUT.items()]
  lines.append("")
  return "\n".join(lines), missing


def main() -> int:
  text, missing = render()
  if "--check" in sys.argv[1:]:
    ok = True
    if missing:
      print("public Tensor names without a docstring:\n  " + "\n  ".join(missing)); ok = False
    if not OUT.exists() or OUT.read_text() != text:
      print(f"{OUT} is not current: run python docs/api_reference.py"); ok = False
    return 0 if ok else 1
  OUT.write_text(text)
  print(f"wrote {OUT} ({text.count(chr(10) + '- ')} names)" + (f"; {len(missing)} without a docstring" if missing else ""))
  return 0


if __name__ == "__main__":
  sys.exit(main())
