"""codegen/nvptx.py: kernels rendered as PTX for the CUDA device, checked here without a GPU (llvmlite's NVPTX target
compiles on any machine); tests/runtime/test_cuda_on_gpu.py runs them where there is one."""
import re

import ml_dtypes  # noqa: F401  (registers np.dtype("bfloat16"))
import numpy as np
import pytest

from rulec import Tensor, dtypes
from rulec.codegen import nvptx
from rulec.engine.sched.driver import schedule

pytest.importorskip("llvmlite.binding")


def kernels(t: Tensor):
  return schedule([t.uop], "CPU")[0]


def ptx_params(ptx: str) -> int:
  entry = ptx[ptx.index(".entry entry"):]
  return len(re.findall(r"\.param \.u64|\.param \.b64", entry[:entry.index(")")]))


RNG = np.random.default_rng(0)
A = Tensor(RNG.standard_normal((48, 80)).astype(np.float32))
B = Tensor(RNG.standard_normal((80, 32)).astype(np.float32))

PROGRAMS = {
  "elementwise": lambda: (A * 2 + 1).relu(),
  "matmul": lambda: A @ B,
  "softmax": lambda: A.softmax(-1),
  "sum": lambda: A.sum(),
  "exp_log": lambda: A.exp() + A.abs().log(),
  "bfloat16": lambda: A.cast(dtypes.bfloat16) @ B.cast(dtypes.bfloat16),
  "float16": lambda: A.half() * 3,
  "float64": lambda: A.double().sqrt(),
  "int": lambda: (A * 100).cast(dtypes.int32) // 7,
}


@pytest.mark.parametrize("name", list(PROGRAMS))
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_every_kernel_renders_to_ptx(name, arch):
  ks = kernels(PROGRAMS[name]())
  assert ks
  for k in ks:
    p = nvptx.compile_kernel(k, arch)
    assert f".target {arch}" in p.ptx and ".entry entry" in p.ptx and p.name == "entry"
    # one pointer per buffer, one i64 per variable, then the thread count
    assert ptx_params(p.ptx) == p.nbufs + p.nvars + 1 == len(k.bufs) + len(k.vars) + 1
    assert p.threads >= 1
    # the body's memory accesses are global ones (the entry's pointers are addrspace 1 and the body is inlined)
    assert "ld.global" in p.ptx and "st.global" in p.ptx
    assert "call" not in re.sub(r"//.*", "", p.ptx), "the body was not inlined into the entry"


def test_threads_follow_the_largest_store_range():
  (k,) = kernels((A * 2).contiguous())
  assert nvptx.compile_kernel(k).threads == 80
  (k,) = kernels(A.sum())
  assert nvptx.compile_kernel(k).threads == 1


def test_a_variable_is_a_parameter():
  # out[r] = inp[r + start_pos]: a kernel of one variable (a KV cache's position)
  from rulec.engine.ir.kernel import Kernel
  from rulec.engine.ir.ops import Ops
  from rulec.engine.ir.uop import UOp
  from rulec.runtime.buffer import new_buffer
  out, inp = new_buffer("CPU", 64, dtypes.float32), new_buffer("CPU", 80, dtypes.float32)
  p0, p1 = (UOp(Ops.PARAM, b.dtype, (), (i, b.arg[2])) for i, b in enumerate((out, inp)))
  r, v = UOp.range(64, 0), UOp.variable("start_pos", 0, 16)
  k = Kernel(UOp.sink(p0.index(r).store(p1.index(r + v)).end(r)), (out, inp))
  p = nvptx.compile_kernel(k)
  assert k.vars == (v,) and p.nvars == 1 and p.threads == 64 and ptx_params(p.ptx) == 2 + 1 + 1


def test_ops_without_a_gpu_lowering_are_refused_in_one_line():
  (k,) = kernels(A.sin())
  with pytest.raises(NotImplementedError, match="cannot compute SIN") as e:
    nvptx.compile_kernel(k)
  assert "\n" not in str(e.value)
