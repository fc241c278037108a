"""The tensor-core matmul (codegen/gemm_plan.py, codegen/nvptx_gemm.py) without a GPU: which kernels get a plan,
the kernel's IR run by tests/codegen/ptx_gemm_emulator.py (its sums against numpy, every output element exactly
once), the epilogue compiled for this CPU and applied to those sums (the stored tensor against the CPU device's),
and the PTX compiled by llvmlite (and by ptxas where one is installed). tests/runtime/test_cuda_on_gpu.py runs the
same kernels on a GPU."""
import ctypes
import os
import shutil
import subprocess
import sys

import ml_dtypes  # noqa: F401  (registers np.dtype("bfloat16"))
import numpy as np
import pytest

from rulec import Tensor, dtypes
from rulec.codegen import gemm_plan, nvptx, nvptx_gemm
from rulec.codegen.decomp import decomposed
from rulec.engine.sched.driver import schedule
from rulec.runtime.buffer import buffer_of

pytest.importorskip("llvmlite.binding")
sys.path.insert(0, os.path.dirname(__file__))
import ptx_gemm_emulator as emu  # noqa: E402

RNG = np.random.default_rng(7)


def T(*shape, dtype=dtypes.float16):
  return Tensor(RNG.standard_normal(shape).astype(np.float32)).cast(dtype).realize()


def kernel_of(t: Tensor):
  (k,), _ = schedule([t.uop], "CPU")
  return k


def programs(d):
  a, b, w, bias = T(130, 64, dtype=d), T(64, 72, dtype=d), T(72, 64, dtype=d), T(72, dtype=d)
  return {
    "matmul, ragged m": lambda: a @ b,
    "x @ W.T + bias, relu": lambda: (a @ w.T + bias).relu(),
    "A.T @ A, ragged k": lambda: a.T @ a,
    "A.T @ W.T": lambda: a[:128].T @ T(24, 128, dtype=d).T,
    "batched, broadcast gelu": lambda: (T(3, 40, 48, dtype=d) @ T(3, 48, 136, dtype=d)).gelu(),
    "two batch ranges (heads)": lambda: T(2, 3, 17, 32, dtype=d) @ T(2, 3, 32, 24, dtype=d),
    "k shorter than a tile": lambda: T(33, 8, dtype=d) @ T(8, 40, dtype=d),
    "float32 sum of casts": lambda: a.float() @ b.float(),
    "several tiles": lambda: T(260, 96, dtype=d) @ T(96, 264, dtype=d),
    "whole tiles (no edge checks)": lambda: T(256, 64, dtype=d) @ T(64, 128, dtype=d),
    # (batch, time) rows flattened into one m (copied); a sum over (batch, time), as a weight gradient's
    "(batch, time) rows": lambda: T(2, 40, 64, dtype=d) @ T(64, 72, dtype=d),
    "a sum over (batch, time)": lambda: (T(2, 40, 64, 1, dtype=d) * T(2, 40, 1, 24, dtype=d)).sum((0, 1)),
    # gathered factors: computed element by element into shared memory
    "casts fused in (autocast)": lambda: T(70, 48, dtype=dtypes.float32).cast(d) @ T(40, 48, dtype=dtypes.float32).cast(d).T,
    "unaligned strides": lambda: T(65, 130, dtype=d) @ T(130, 33, dtype=d),
    # (x.T and dy cast in: the loads run along the free ranges, which consecutive threads then take)
    "transposed casts (autocast's weight gradient)":
      lambda: T(2, 40, 70, dtype=dtypes.float32).cast(d).reshape(80, 70).T @ T(2, 40, 36, dtype=dtypes.float32).cast(d).reshape(80, 36),
    "an elementwise factor": lambda: (a * 2 + 1) @ b,
    "conv2d, padded": lambda: T(2, 16, 9, 9, dtype=d).conv2d(T(24, 16, 3, 3, dtype=d), padding=1),
    "conv2d, strided": lambda: T(1, 8, 12, 12, dtype=d).conv2d(T(16, 8, 3, 3, dtype=d), stride=2),
  }


COPIED = ["(batch, time) rows", "a sum over (batch, time)", "matmul, ragged m", "x @ W.T + bias, relu", "A.T @ A, ragged k", "A.T @ W.T", "batched, broadcast gelu",
          "two batch ranges (heads)", "k shorter than a tile", "float32 sum of casts", "several tiles", "whole tiles (no edge checks)"]
CASES = [(d, name) for d in (dtypes.float16, dtypes.bfloat16) for name in programs(dtypes.float16)]


def _host_parts(text: str, nbufs: int, nranges: int, nks: int):
  """The paired epilogue and loader functions compiled for this CPU (the same IR the GPU kernel inlines), as ctypes
  functions: (paired epilogue, {loader name: function of the i64 arguments}, the engine that holds them)."""
  import llvmlite.binding as llvm
  llvm.initialize_native_target()
  llvm.initialize_native_asmprinter()
  mod = llvm.parse_assembly(text.replace("define internal", "define"))
  tm = llvm.Target.from_default_triple().create_target_machine()
  engine = llvm.create_mcjit_compiler(mod, tm)
  engine.finalize_object()
  fty = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * nbufs + [ctypes.c_int64] * (2 * nranges)
                                  + [ctypes.c_float, ctypes.c_float, ctypes.c_bool, ctypes.c_bool]))
  epi = fty(engine.get_function_address(nvptx_gemm.EPILOGUE2))
  lty = ctypes.CFUNCTYPE(ctypes.c_uint16, *([ctypes.c_void_p] * nbufs + [ctypes.c_int64] * (nranges + nks)))
  loaders = {name: lty(engine.get_function_address(name)) for name in (nvptx_gemm.LOAD_A, nvptx_gemm.LOAD_B)
             if name in text}
  return epi, loaders, engine


def run_emulated(t: Tensor, cfg: nvptx_gemm.Config = nvptx_gemm.Config(), opencl: bool = False):
  """(the stored tensor as the emulated kernel and the epilogue compute it, the plan, the sums it computed)."""
  k = kernel_of(t)
  p = gemm_plan.plan(k)
  parts = nvptx_gemm.parts_ir(decomposed(k, nvptx.OPTIONAL), p, gpu=False)
  text, launch = nvptx_gemm.render_gemm(p, len(k.bufs), parts, cfg, opencl=opencl)
  bufs = [np.array(buffer_of(x).host_view()) for x in k.bufs]
  bufs[0][...] = 0
  epi, loaders, engine = _host_parts(parts, len(k.bufs), len(p.ranges), len(p.ks))
  ptrs = [b.ctypes.data for b in bufs]
  pairs = []
  calls = emu.run(text, launch, bufs, loaders={n: (lambda ints, f=f: f(*ptrs, *ints)) for n, f in loaders.items()},
                  pairs=pairs)
  for v0, v1, acc0, acc1, ok0, ok1 in pairs: epi(*ptrs, *v0, *v1, acc0, acc1, ok0, ok1)
  return bufs[0], p, calls, bufs


@pytest.mark.parametrize("d,name", CASES, ids=[f"{d.name}-{n}" for d, n in CASES])
def test_emulated_kernel_matches_numpy(d, name):
  t = programs(d)[name]()
  out, p, calls, bufs = run_emulated(t)
  # every output element's sum exactly once, each the float32 dot product of its row of A and column of B
  sizes = [r.src[0].arg for r in p.ranges]
  assert len(calls) == int(np.prod(sizes)) and len({v for v, _ in calls}) == len(calls)
  copied = isinstance(p.a, gemm_plan.Operand) and isinstance(p.b, gemm_plan.Operand)
  assert copied == (name in COPIED), (p.a, p.b)
  if copied:
    A, B = (bufs[o.slot].astype(np.float32).ravel() for o in (p.a, p.b))
    ks = np.arange(p.K)

    def flat(env, rs):   # (several free ranges flatten into one index, the last fastest)
      i = 0
      for r in rs: i = i * r.src[0].arg + env[r]
      return i
    for vals, acc in calls[::7]:
      env = dict(zip(p.ranges, vals))
      ia = p.a.base + flat(env, p.ms) * p.a.stride_free + ks * p.a.stride_k + sum(env[r] * s for r, s in zip(p.batch, p.a.stride_batch))
      ib = p.b.base + flat(env, p.ns) * p.b.stride_free + ks * p.b.stride_k + sum(env[r] * s for r, s in zip(p.batch, p.b.stride_batch))
      want = float(np.dot(A[ia].astype(np.float64), B[ib]))
      assert abs(acc - want) <= 1e-4 * (1 + np.abs(A[ia] * B[ib]).sum())
  # the stored tensor, epilogue applied, against the CPU device's (which rounds each product to the 2-byte type)
  want = t.numpy().astype(np.float32)
  got = out.astype(np.float32).reshape(want.shape)
  np.testing.assert_allclose(got, want, rtol=2e-2, atol=3e-2 * np.sqrt(p.K))


@pytest.mark.parametrize("d", [dtypes.float32, dtypes.bfloat16])
def test_a_pair_of_neighbouring_accumulators_is_one_store_where_it_can_be(d):
  # the paired epilogue compiled for this CPU, on a 6 x 10 output (row stride 10, so every row starts aligned):
  # neighbouring and aligned (one wide store), at an odd column (misaligned: two stores), down a column (not
  # neighbours: two stores), a second element outside the output (its flag off: only the first is stored)
  a, b = T(6, 16), T(16, 10)
  k = kernel_of((a @ b).cast(d))
  p = gemm_plan.plan(k)
  parts = nvptx_gemm.parts_ir(decomposed(k, nvptx.OPTIONAL), p, gpu=False)
  epi, _, engine = _host_parts(parts, len(k.bufs), len(p.ranges), len(p.ks))
  out = np.zeros((6, 10), np.dtype(d.name))
  ptrs = [out.ctypes.data] + [0] * (len(k.bufs) - 1)
  cases = [((2, 4), (2, 5), True), ((3, 1), (3, 2), True), ((0, 7), (1, 7), True), ((5, 8), (5, 9), False)]
  want = np.zeros((6, 10), np.float32)
  for i, (e0, e1, ok1) in enumerate(cases):
    epi(*ptrs, *e0, *e1, 1.5 + i, -2.5 - i, True, ok1)
    want[e0] = 1.5 + i
    if ok1: want[e1] = -2.5 - i
  np.testing.assert_array_equal(out.astype(np.float32), want)
  # on the GPU the aligned pair leaves as one store of two elements, a pair per two accumulators of each tile
  ptx = nvptx.compile_kernel(kernel_of((T(256, 64, dtype=dtypes.bfloat16) @ T(64, 256, dtype=dtypes.bfloat16)).cast(d)),
                             "sm_90").ptx
  cfg = nvptx.tile_config()
  pairs = (cfg.BM // cfg.WM // 16) * 2 * (cfg.BN // cfg.WN // 8)
  assert ptx.count(f"st.global.v2.b{d.itemsize * 8}") == pairs, ptx.count("st.global")


@pytest.mark.parametrize("band", [2, 3])
def test_blocks_in_bands_still_cover_every_output_once(band):
  # 5 block rows in bands of 2 (the last band one row) or 3 (the last two): each tile computed by exactly one block
  a, b = T(5 * 128 - 7, 40), T(40, 2 * 128 + 3)
  want = a.numpy().astype(np.float32) @ b.numpy().astype(np.float32)
  out, p, calls, _ = run_emulated(a @ b, nvptx_gemm.Config(raster=band))
  assert len(calls) == want.size and len({v for v, _ in calls}) == want.size
  np.testing.assert_allclose(out.astype(np.float32).reshape(want.shape), want, rtol=2e-2, atol=0.2)


def test_the_gpu_tiles_cover_a_ragged_product_once(monkeypatch):
  # nvptx.tile_config()'s shape (the GPU's: 2x2 warps, a k step of 64, bands of 8 block rows) on ragged sizes and a
  # k that is no multiple of 64 (bench/half_matmul.py timed it at 4096^3 only)
  monkeypatch.delenv("RULEC_CUDA_TC_TILE", raising=False)
  a, b = T(3 * 128 - 5, 100), T(100, 128 + 9)
  want = a.numpy().astype(np.float32) @ b.numpy().astype(np.float32)
  out, p, calls, _ = run_emulated(a @ b, nvptx.tile_config())
  assert len(calls) == want.size and len({v for v, _ in calls}) == want.size
  np.testing.assert_allclose(out.astype(np.float32).reshape(want.shape), want, rtol=2e-2, atol=0.2)


@pytest.mark.parametrize("d", [dtypes.float16, dtypes.bfloat16])
def test_the_opencl_kernel_takes_its_shared_memory_as_an_argument(d):
  # the CL device's variant (runtime/cl_device.TensorCoreProgram): tiles that fit OpenCL's 48 KB of local memory,
  # shared memory addressed from the kernel's last (__local) argument; emulated on a ragged batched product
  cfg = nvptx.opencl_tile_config(48 * 1024)
  assert cfg.smem <= 48 * 1024 - nvptx.OPENCL_LOCAL_RESERVE and cfg.stages == 2
  a, b = T(2, 3 * 64 - 5, 72, dtype=d), T(2, 128 + 9, 72, dtype=dtypes.float32)   # (b: a cast gathered in)
  want = a.numpy().astype(np.float32) @ b.cast(d).numpy().astype(np.float32).transpose(0, 2, 1)
  out, p, calls, _ = run_emulated(a @ b.cast(d).transpose(1, 2), cfg, opencl=True)
  assert len(calls) == want.size and len({v for v, _ in calls}) == want.size
  np.testing.assert_allclose(out.astype(np.float32).reshape(want.shape), want, rtol=2e-2, atol=0.2)


@pytest.mark.parametrize("n", [64, 40])
def test_a_narrow_product_takes_a_narrow_opencl_tile(n, monkeypatch):
  # attention's p @ v and its gradients are 64 wide: under OpenCL they take 128 x 64 blocks (a 128-wide tile would
  # multiply zeros for half its work), emulated on a batched product, whole and ragged in n
  monkeypatch.delenv("RULEC_CL_TC_NARROW_TILE", raising=False)
  cfg = nvptx.opencl_tile_config(48 * 1024, n)
  assert (cfg.BM, cfg.BN, cfg.stages) == (128, 64, 3) and cfg.smem <= 48 * 1024 - nvptx.OPENCL_LOCAL_RESERVE
  assert nvptx.opencl_tile_config(48 * 1024, nvptx.NARROW_N + 1).BN == 128
  a, b = T(3, 2 * 128 - 9, 96, dtype=dtypes.bfloat16), T(3, 96, n, dtype=dtypes.bfloat16)
  want = a.numpy().astype(np.float32) @ b.numpy().astype(np.float32)
  out, p, calls, _ = run_emulated(a @ b, cfg, opencl=True)
  assert p.N == n and len(calls) == want.size and len({v for v, _ in calls}) == want.size
  np.testing.assert_allclose(out.astype(np.float32).reshape(want.shape), want, rtol=2e-2, atol=0.2)
  monkeypatch.setenv("RULEC_CL_TC_NARROW_TILE", "64,64,32,2,2,2")
  assert nvptx.opencl_tile_config(48 * 1024, n) == nvptx_gemm.Config(64, 64, 32, 2, 2, 2)


def test_a_tensor_core_kernel_compiles_to_ptx_for_opencl(monkeypatch):
  k = kernel_of((T(130, 64, dtype=dtypes.bfloat16) @ T(72, 64, dtype=dtypes.bfloat16).T).relu())
  prog = nvptx.compile_for_opencl(k, "sm_90", 48 * 1024)
  assert prog.launch.grid == (1, 2, 1) and prog.launch.block == 128 and prog.launch.smem == 32 * 1024
  # NVIDIA's OpenCL learns its arguments' kinds from the PTX: three global buffers, the long, the __local bytes
  head = prog.ptx[prog.ptx.index(".entry entry("):prog.ptx.index(")")]
  assert head.count(".ptr .global") == 3 and head.count(".ptr .shared") == 1 and ".extern .shared" not in prog.ptx
  assert "texmode_independent" in prog.ptx and "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in prog.ptx
  # no plan under 16 KB of local memory (not even two stages), for a float32 matmul, or with RULEC_CL_TC=0
  assert nvptx.compile_for_opencl(k, "sm_90", 16 * 1024 - 1) is None
  # every program of the emulated set compiles for OpenCL too (gathered factors store to the __local argument)
  for d in (dtypes.float16, dtypes.bfloat16):
    for name, make in programs(d).items():
      assert ".ptr .shared" in nvptx.compile_for_opencl(kernel_of(make()), "sm_90", 48 * 1024).ptx, name
  assert nvptx.compile_for_opencl(kernel_of(T(16, 64, dtype=dtypes.float32) @ T(64, 16, dtype=dtypes.float32)), "sm_90", 48 * 1024) is None
  monkeypatch.setenv("RULEC_CL_TC", "0")
  assert nvptx.compile_for_opencl(k, "sm_90", 48 * 1024) is None


def test_a_gathered_factor_knows_which_way_its_loads_are_contiguous():
  grad = gemm_plan.plan(kernel_of(programs(dtypes.bfloat16)["transposed casts (autocast's weight gradient)"]()))
  fwd = gemm_plan.plan(kernel_of(programs(dtypes.bfloat16)["casts fused in (autocast)"]()))
  assert isinstance(grad.a, gemm_plan.Gather) and isinstance(grad.b, gemm_plan.Gather)
  assert grad.a.free_fastest and grad.b.free_fastest and not fwd.a.free_fastest and not fwd.b.free_fastest


def test_tile_config_reads_the_environment(monkeypatch):
  monkeypatch.setenv("RULEC_CUDA_TC_TILE", "128,64,32,4,2,2,8")
  assert nvptx.tile_config() == nvptx_gemm.Config(128, 64, 32, 2, 2, 4, 8)
  monkeypatch.setenv("RULEC_CUDA_TC_TILE", "128,64")
  with pytest.raises(ValueError, match="six or seven integers"): nvptx.tile_config()


def test_a_refill_never_overwrites_a_slot_being_read():
  # copies land when issued (not when waited for): a refill of a slot still in use would change the sums
  a, b = T(64, 256), T(256, 64)
  k = kernel_of(a @ b)
  p = gemm_plan.plan(k)
  text, launch = nvptx_gemm.render_gemm(p, len(k.bufs), nvptx_gemm.parts_ir(decomposed(k, nvptx.OPTIONAL), p, gpu=False))
  bufs = [np.array(buffer_of(x).host_view()) for x in k.bufs]
  late, early = emu.run(text, launch, bufs), emu.run(text, launch, bufs, early=True)
  assert late == early and len(late) == 64 * 64


@pytest.mark.parametrize("make,why", [
  (lambda: T(16, 64, dtype=dtypes.float32) @ T(64, 16, dtype=dtypes.float32), "float32"),
  (lambda: T(16, 64) @ T(64, 16, dtype=dtypes.bfloat16), "float16 and bfloat16"),
  (lambda: (T(16, 64) @ T(64, 16)).sum(), "ranges"),
  (lambda: T(16, 64).sum(1), "product"),
  (lambda: T(16, 64).max(1), "not"),
])
def test_kernels_without_a_plan_say_why(make, why):
  reason = gemm_plan.why_not(kernel_of(make()))
  assert reason is not None and why in reason, reason


def test_a_tensor_core_kernel_compiles_to_ptx(monkeypatch):
  k = kernel_of((T(130, 64, dtype=dtypes.bfloat16) @ T(72, 64, dtype=dtypes.bfloat16).T).relu())
  prog = nvptx.compile_kernel(k, "sm_90")
  # (the GPU's tiles, nvptx.tile_config: 128x128 blocks of 2x2 warps, a k step of 64 in 3 stages of shared memory)
  assert prog.launch is not None and prog.launch.grid == (1, 2, 1) and prog.launch.block == 128
  assert prog.launch.smem == 3 * (128 * 64 + 64 * 128) * 2
  assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in prog.ptx and "ldmatrix" in prog.ptx
  assert "cp.async.cg.shared.global" in prog.ptx and ".extern .shared" in prog.ptx
  # RULEC_CUDA_TC=0 and an architecture before sm_80 take the ordinary renderer
  assert nvptx.compile_kernel(k, "sm_75").launch is None
  monkeypatch.setenv("RULEC_CUDA_TC", "0")
  assert nvptx.compile_kernel(k, "sm_90").launch is None
  if shutil.which("ptxas"):   # (a CUDA toolkit is no dependency; where one is installed, its assembler checks the PTX)
    path = os.path.join(os.environ["RULEC_CACHE_DIR"], "tc.ptx")
    with open(path, "w") as f: f.write(prog.ptx)
    res = subprocess.run(["ptxas", "-arch=sm_90", "-v", path, "-o", os.devnull], capture_output=True, text=True)
    assert res.returncode == 0 and "spill stores" in res.stderr and " 0 bytes spill stores" in res.stderr, res.stderr


from hypothesis import given, settings, strategies as st  # noqa: E402


@settings(max_examples=int(os.environ.get("RULEC_TC_EXAMPLES", "12")))
@given(m=st.integers(1, 140), n=st.integers(1, 140), k=st.integers(1, 100), ta=st.booleans(), tb=st.booleans(),
       batch=st.sampled_from([(), (2,), (2, 1)]), bf16=st.booleans(), bias=st.booleans())
def test_random_matmuls_against_numpy(m, n, k, ta, tb, batch, bf16, bias):
  """Any shape and layout (copied or gathered factors, ragged everywhere), emulated, against the CPU device."""
  d = dtypes.bfloat16 if bf16 else dtypes.float16
  a = T(*batch, k, m, dtype=d).transpose(-1, -2) if ta else T(*batch, m, k, dtype=d)
  b = T(*batch, n, k, dtype=d).transpose(-1, -2) if tb else T(*batch, k, n, dtype=d)
  t = a @ b
  if bias: t = t + T(n, dtype=d)
  k_ = kernel_of(t)
  if gemm_plan.why_not(k_) is not None:   # (a product over ranges of size 1 may fold into no sum at all)
    assert m == 1 or n == 1 or k == 1, gemm_plan.why_not(k_)
    return
  out, p, calls, _ = run_emulated(t)
  assert len(calls) == int(np.prod([*batch, m, n]))
  want = t.numpy().astype(np.float32)
  np.testing.assert_allclose(out.astype(np.float32).reshape(want.shape), want, rtol=2e-2,
                             atol=(3e-2 if bf16 else 4e-3) * np.sqrt(k) * 4)
