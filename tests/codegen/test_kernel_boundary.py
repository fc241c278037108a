"""What reaches a renderer is a kernel the IR allows (#32 item 1): a rules directory layered over decomp cannot
print its own source into a kernel. Kernels are validated after the last rewrite that can touch them (the decomp
rules, then the optimizer), node args must have the types the IR gives them, and the renderers print only ints
for range and parameter names."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rulec.codegen import opencl
from rulec.engine.ir.dtypes import dtypes
from rulec.engine.ir.kernel import Kernel, arg_problem, validate
from rulec.engine.ir.ops import Ops
from rulec.engine.ir.uop import UOp

REPO = Path(__file__).resolve().parents[2]

# the attack from the issue: a RANGE whose axis is C source that redefines the output pointer's name
INJECT = '''\
ruleset decomp extends decomp:
  rule inject: r:RANGE(_) => r.replace(arg=("0\\n#define p0 p0[0] = 1337.0f; p0\\n",) + r.arg[1:])
'''
# a CONST whose value is text (the float literal printer would parse "1e3"; the kernel must never see a str)
TEXT_CONST = '''\
ruleset decomp extends decomp:
  rule text: c:CONST{floats} if c.arg == 2.0 => c.replace(arg="2.0")
'''
PROGRAM = '''\
import numpy as np
from rulec import Tensor
x = Tensor(np.arange(8, dtype=np.float32))
try:
  print("VALUES", (x * 2).tolist())
except Exception as e:
  print("REFUSED", type(e).__name__, str(e).splitlines()[0])
'''


def devices():
  out = ["CPU"]
  try:
    import pyopencl  # noqa: F401
    out.append("CL")
  except ImportError: pass
  return out


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("rules,name", [(INJECT, "inject"), (TEXT_CONST, "text")])
def test_a_layer_cannot_write_into_kernel_source(tmp_path, device, rules, name):
  d = tmp_path / "mine"; d.mkdir()
  (d / "mine.rules").write_text(rules)
  env = {k: v for k, v in os.environ.items() if not k.startswith("RULEC_")}
  env.update(RULEC_RULES=str(d), RULEC_DEVICE=device, RULEC_CACHE_DIR=str(tmp_path / "cache"),
             PYTHONPATH=str(REPO))
  out = subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  assert "VALUES" not in out.stdout, out.stdout   # nothing ran: no values, tampered or not
  # the refusal names the rule and where it is
  assert f"REFUSED RuleRuntimeError rule '{name}' at {d / 'mine.rules'}:2:3" in out.stdout, out.stdout


def _kernel(range_arg=(0, "loop"), const_arg=2.0, marker=None) -> Kernel:
  buf = UOp(Ops.BUFFER, dtypes.float32, (), (1, "CPU", 4))
  p = UOp(Ops.PARAM, dtypes.float32, (), (0, 4))
  r = UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, 4),), range_arg)
  v = UOp(Ops.MUL, dtypes.float32, (UOp(Ops.CAST, dtypes.float32, (r,)), UOp(Ops.CONST, dtypes.float32, (), const_arg)),
          marker)
  st = UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, dtypes.float32, (p, r)), v))
  return Kernel(UOp(Ops.SINK, dtypes.void, (UOp(Ops.END, dtypes.void, (st, r)),)), (buf,))


def test_validate_accepts_a_plain_kernel():
  validate(_kernel())
  validate(_kernel(range_arg=(3, "group:4:2"), const_arg=np.float32(2), marker="guarded"))


@pytest.mark.parametrize("kw,what", [
  (dict(range_arg=("0\n#define x", "loop")), "axis"),
  (dict(range_arg=(1.5, "loop")), "axis"),   # (not True: hash-consing can hand back an equal (1, "loop") node)
  (dict(range_arg=(-1, "loop")), "axis"),
  (dict(range_arg=(0, "loop; evil()")), "kind"),
  (dict(range_arg=(0, 7)), "kind"),
  (dict(const_arg="2.0"), "CONST"),
  (dict(const_arg=(2.0,)), "CONST"),
  (dict(marker="anything else"), "carry values"),
  (dict(marker=("tuple", 1)), "carry values"),
])
def test_validate_refuses_args_the_ir_does_not_allow(kw, what):
  with pytest.raises(ValueError, match="invalid kernel") as e: validate(_kernel(**kw))
  assert what in str(e.value)
  assert arg_problem(next(u for u in _kernel(**kw).ast.toposort() if arg_problem(u))) is not None


def test_the_cl_renderer_prints_only_int_names():
  r = UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, 4),), ("0; evil", "loop"))
  with pytest.raises(ValueError, match="must be an int"): opencl._rname(r)
  assert opencl._rname(r.replace(arg=(5, "loop"))) == "r5"
