"""A kernel as PTX for NVIDIA GPUs (the CUDA device, runtime/cuda_device.py): the CPU's LLVM IR, run by one GPU
thread per element of a store range, compiled by llvmlite's NVPTX target.

This is the CUDA device's first renderer, chosen for correctness: every kernel the CPU backend renders runs here
unchanged. The optimizer gives it one action, THREAD on the kernel's largest store range; the CPU renderer's
`kernel(p..., v..., start, end)` then computes that range's [start, end) and loops over everything else, and a
`ptx_kernel` entry calls it for [i, i + 1) where i is the GPU thread's global index (LLVM inlines the call). The
entry takes the buffers as global-memory pointers (addrspace 1) and casts them to generic ones, so that LLVM's
address-space inference turns the body's loads and stores into global ones.

No register tiles, work-groups or local memory yet (the tensor cores come next, bench/tc_gemm_cuda.py shows the
kernel), so it is slow on matmuls and reductions over few outputs; it is correct. float32 exp2 and log2 are the
decomposition rules' polynomials (the GPU has no libm); sin and pow, which the CPU takes from libm, raise a
NotImplementedError naming the op, before LLVM sees them (an LLVM that cannot select an op aborts the process).

Why not NVIDIA's OpenCL: the same mma.sync kernel ran 1.5x faster as LLVM IR through this path than as OpenCL C
with inline PTX on an H100 (355 against 227 TFLOP/s, bench/results/h100-tensor-cores-2026-12-06-session28.txt), and
this path reaches sm_90a (wgmma, TMA) and more than OpenCL's 48 KB of shared memory. The CL device takes the same
tensor-core kernel too, as PTX for the triple nvptx64-nvidia-nvcl that NVIDIA's OpenCL builds as a program binary
(compile_for_opencl, with tiles that fit OpenCL's local memory), beside its own kernels for everything else.
"""
from __future__ import annotations

import os
import re

import attrs

from rulec.codegen import gemm_plan, llvmir
from rulec.codegen.decomp import decomposed
from rulec.codegen.online import online
from rulec.codegen.opt import Action, apply
from rulec.engine.ir.kernel import Kernel, validate
from rulec.engine.ir.ops import Ops

# the optional decompositions (rules/decomp.rules) the GPU asks for: float32 exp2 and log2 as polynomials (there is
# no libm to call), and MULACC (the GPU has fma)
OPTIONAL = frozenset({Ops.EXP2, Ops.LOG2, Ops.MULACC})

# LLVM intrinsics NVPTX lowers to instructions; anything else the body calls is refused before compiling
_SUPPORTED = ("llvm.sqrt.", "llvm.fma.", "llvm.fmuladd.", "llvm.fabs.", "llvm.trunc.", "llvm.floor.", "llvm.ceil.",
              "llvm.rint.", "llvm.round.", "llvm.minnum.", "llvm.maxnum.", "llvm.copysign.", "llvm.smax.",
              "llvm.smin.", "llvm.umax.", "llvm.umin.", "llvm.abs.", "llvm.nvvm.")
_OPS_OF = {"llvm.sin": "SIN", "llvm.pow": "POW", "llvm.exp2": "EXP2", "llvm.log2": "LOG2", "llvm.prefetch": "PREFETCH"}


@attrs.frozen
class PTXProgram:
  ptx: str        # PTX text; its kernel entry is `name`
  name: str
  threads: int    # GPU threads to launch; thread i computes element i of the split range (all of it where 1)
  nbufs: int
  nvars: int
  launch: object = None   # a tensor-core matmul's own grid, block and shared memory (nvptx_gemm.Launch), else None


def _thread_range(low: Kernel):
  """The largest store range of the kernel's one store, or None (a kernel of one output, or several stores)."""
  ends = [u for u in low.ast.toposort() if u.op is Ops.END]
  if len(ends) != 1 or len(low.ast.src) != 1: return None
  ranges = [r for r in ends[0].src[1:] if r.op is Ops.RANGE and isinstance(r.src[0].arg, int)]
  return max(ranges, key=lambda r: r.src[0].arg, default=None)


def _target_machine(arch: str, triple: str = "nvptx64-nvidia-cuda"):
  import llvmlite.binding as llvm
  llvm.initialize_all_targets()
  llvm.initialize_all_asmprinters()
  cc = int(re.sub(r"\D", "", arch) or 0)
  ptx = "+ptx80" if cc >= 90 else "+ptx78" if cc >= 89 else "+ptx70"
  return llvm.Target.from_triple(triple).create_target_machine(cpu=arch, features=ptx, opt=3)


def _check_calls(text: str) -> None:
  """NotImplementedError (one line) for a call NVPTX cannot lower without a libm: the op it computes."""
  for name in sorted(set(re.findall(r"declare [^@]*@\"?([\w.]+)", text))):
    if name.startswith(_SUPPORTED): continue
    op = next((v for k, v in _OPS_OF.items() if name.startswith(k)), name)
    raise NotImplementedError(f"the CUDA device cannot compute {op} yet (its LLVM body calls {name}, which has no "
                              f"GPU lowering without libdevice)")


def render(kernel: Kernel, vars=None) -> tuple[str, int]:
  """(LLVM IR text for NVPTX with a `ptx_kernel` entry named `entry`, the number of threads to launch)."""
  validate(kernel)
  low = decomposed(online(kernel), OPTIONAL)
  rng = _thread_range(low)
  opt = apply(low, [Action("THREAD", rng.arg[0])] if rng is not None else [], "CPU")
  validate(opt)
  vars = tuple(kernel.vars if vars is None else vars)
  body, split = llvmir.render(opt, "kernel", vars)
  body = re.sub(r"^target (triple|datalayout).*$", "", body, flags=re.M)
  _check_calls(body)
  nb, nv = len(kernel.bufs), len(vars)
  params = [f"ptr addrspace(1) %g{i}" for i in range(nb)] + [f"i64 %v{i}" for i in range(nv)] + ["i64 %n"]
  casts = "".join(f"  %p{i} = addrspacecast ptr addrspace(1) %g{i} to ptr\n" for i in range(nb))
  args = ", ".join([f"ptr %p{i}" for i in range(nb)] + [f"i64 %v{i}" for i in range(nv)])
  entry = (f"\ndeclare i32 @llvm.nvvm.read.ptx.sreg.tid.x()\ndeclare i32 @llvm.nvvm.read.ptx.sreg.ctaid.x()\n"
           f"declare i32 @llvm.nvvm.read.ptx.sreg.ntid.x()\n"
           f"define ptx_kernel void @entry({', '.join(params)}) {{\n{casts}"
           "  %t = call i32 @llvm.nvvm.read.ptx.sreg.tid.x()\n  %b = call i32 @llvm.nvvm.read.ptx.sreg.ctaid.x()\n"
           "  %d = call i32 @llvm.nvvm.read.ptx.sreg.ntid.x()\n  %bd = mul i32 %b, %d\n  %i32 = add i32 %bd, %t\n"
           "  %i = zext i32 %i32 to i64\n  %ok = icmp slt i64 %i, %n\n  br i1 %ok, label %run, label %done\n"
           f"run:\n  %j = add i64 %i, 1\n  call void @kernel({args}{', ' if args else ''}i64 %i, i64 %j)\n"
           "  br label %done\ndone:\n  ret void\n}\n")
  threads = split.src[0].arg if split is not None else 1
  return 'target triple = "nvptx64-nvidia-cuda"\n' + body + entry, threads


def tensor_core_plan(kernel: Kernel, arch: str):
  """The kernel's GemmPlan where the tensor cores run it on `arch` (sm_80 and later), else None. RULEC_CUDA_TC=0
  turns the tensor cores off (to compare with the ordinary renderer)."""
  if os.environ.get("RULEC_CUDA_TC", "1").strip() == "0": return None
  if int(re.sub(r"\D", "", arch) or 0) < 80: return None
  try: return gemm_plan.plan(kernel)
  except gemm_plan.NoPlan: return None


def render_tensor_cores(kernel: Kernel, plan) -> tuple[str, object]:
  """(LLVM IR text, launch) of a kernel with a tensor-core plan: its epilogue from the decomposed kernel."""
  from rulec.codegen import nvptx_gemm
  parts = nvptx_gemm.parts_ir(decomposed(kernel, OPTIONAL), plan)
  _check_calls(parts)
  return nvptx_gemm.render_gemm(plan, len(kernel.bufs), parts, tile_config())


def tile_config():
  """The tensor-core kernel's tiles on the GPU (the fastest measured), or RULEC_CUDA_TC_TILE="BM,BN,BK,stages,WM,WN"
  with an optional seventh number, the launch order's band of block rows (Config.raster), for
  bench/half_matmul.py's comparison of shapes."""
  from rulec.codegen import nvptx_gemm
  # (measured on an H100, 4096^3 float16 and bfloat16, bench/half_matmul.py --tiles: 128x128 blocks of 2x2 warps, a
  # k step of 64 in 3 stages, bands of 8 block rows: 0.366 ms, 376 TFLOP/s, against 0.394 ms for Config()'s shape)
  return _tile_from_env("RULEC_CUDA_TC_TILE") or nvptx_gemm.Config(BM=128, BN=128, BK=64, WM=2, WN=2, stages=3, raster=8)


def _tile_from_env(name: str):
  """The nvptx_gemm.Config an environment variable spells as "BM,BN,BK,stages,WM,WN[,raster]", or None if unset."""
  from rulec.codegen import nvptx_gemm
  spec = os.environ.get(name, "").strip()
  if not spec: return None
  try:
    nums = [int(v) for v in spec.split(",")]
    if len(nums) not in (6, 7): raise ValueError
  except ValueError:
    raise ValueError(f"{name}={spec!r}: expected six or seven integers BM,BN,BK,stages,WM,WN[,raster]") from None
  bm, bn, bk, st, wm, wn = nums[:6]
  return nvptx_gemm.Config(bm, bn, bk, wm, wn, st, *nums[6:])


def _emit_ptx(text: str, arch: str, triple: str = "nvptx64-nvidia-cuda") -> str:
  """PTX of LLVM IR text for `arch`, through LLVM's O3 pipeline for the GPU: the body inlined into the entry, so that
  address-space inference sees where the pointers come from and makes the loads and stores global ones."""
  import llvmlite.binding as llvm
  tm = _target_machine(arch, triple)
  mod = llvm.parse_assembly(text)
  mod.triple, mod.data_layout = triple, str(tm.target_data)
  mod.verify()
  pb = llvm.create_pass_builder(tm, llvm.create_pipeline_tuning_options(3))
  pb.getModulePassManager().run(mod, pb)
  return tm.emit_assembly(mod)


def compile_kernel(kernel: Kernel, arch: str = "sm_80", vars=None) -> PTXProgram:
  """The kernel as a PTX program for the GPU architecture `arch` ("sm_90"); NotImplementedError for an op the
  GPU cannot compute yet. A matmul of 2-byte floats (codegen/gemm_plan.py) runs on the tensor cores."""
  plan = tensor_core_plan(kernel, arch) if not vars else None
  # (more row blocks than a grid's y holds: the ordinary renderer)
  if plan is not None and -(-plan.M // tile_config().BM) > 65535: plan = None
  launch = None
  if plan is not None: (text, launch), threads = render_tensor_cores(kernel, plan), 1
  if launch is None: text, threads = render(kernel, vars)
  return PTXProgram(_emit_ptx(text, arch), "entry", max(1, threads), len(kernel.bufs),
                    len(kernel.vars if vars is None else vars), launch)


# local memory NVIDIA's OpenCL keeps for itself: on an H100 (49152 bytes of CL_DEVICE_LOCAL_MEM_SIZE) a launch asking
# for all 48 KB failed with OUT_OF_RESOURCES, 32 KB ran
OPENCL_LOCAL_RESERVE = 1024


# a product whose n is at most this wide (attention's p @ v and its gradients: n is the head's 64) takes a tile half
# as wide: a 128-wide one would multiply columns of zeros for half its work
NARROW_N = 64


def opencl_tile_config(local_bytes: int, n: int | None = None):
  """The tensor-core kernel's tiles under OpenCL, whose work-groups get at most `local_bytes` of local memory (48 KB
  on NVIDIA, less OPENCL_LOCAL_RESERVE): 128x128 blocks of 2x2 warps, a k step of 32, as many ring stages as fit
  (2 in 48 KB), or None where not even 2 fit; for a product at most NARROW_N wide (n), 128x64 blocks of 2x2 warps
  in up to 3 stages. RULEC_CL_TC_TILE (RULEC_CUDA_TC_TILE's form) forces a shape, RULEC_CL_TC_NARROW_TILE the
  narrow one. (Measured on an H100, 4096^3 bfloat16: 0.66 ms in 2 stages of 128x128, 0.75 in 3 stages of 96x128,
  0.76 in 5 stages of 128x128x16, 0.89-0.91 in 3 stages of 128x64 or 64x128; CUDA's 3 stages of 128x128, 48 KB:
  0.37.)"""
  from rulec.codegen import nvptx_gemm
  narrow = n is not None and n <= NARROW_N
  forced = _tile_from_env("RULEC_CL_TC_NARROW_TILE" if narrow else "RULEC_CL_TC_TILE")
  if forced is not None: return forced if forced.smem <= local_bytes - OPENCL_LOCAL_RESERVE else None
  cfg = nvptx_gemm.Config(BM=128, BN=64 if narrow else 128, BK=32, WM=2, WN=2, stages=2)
  stages = min(3, (local_bytes - OPENCL_LOCAL_RESERVE) // (cfg.smem // cfg.stages))
  return attrs.evolve(cfg, stages=stages) if stages >= 2 else None


def compile_for_opencl(kernel: Kernel, arch: str, local_bytes: int) -> PTXProgram | None:
  """A matmul of 2-byte floats as a tensor-core kernel in PTX for NVIDIA's OpenCL (which builds PTX given as a
  program binary), or None where the kernel has no plan (or variables, or too many row blocks, or too little local
  memory): the CL device then renders it as OpenCL C. The entry is `entry(global buffers..., long n, __local lds)`:
  the launch's `smem` bytes of local memory are its last argument. RULEC_CL_TC=0 turns this off."""
  from rulec.codegen import nvptx_gemm
  if os.environ.get("RULEC_CL_TC", "1").strip() == "0" or kernel.vars: return None
  plan = tensor_core_plan(kernel, arch)
  cfg = opencl_tile_config(local_bytes, plan.N) if plan is not None else None
  if cfg is None or -(-plan.M // cfg.BM) > 65535: return None
  parts = nvptx_gemm.parts_ir(decomposed(kernel, OPTIONAL), plan)
  _check_calls(parts)
  text, launch = nvptx_gemm.render_gemm(plan, len(kernel.bufs), parts, cfg, opencl=True)
  return PTXProgram(_emit_ptx(text, arch, "nvptx64-nvidia-nvcl"), "entry", 1, len(kernel.bufs), 0, launch)
