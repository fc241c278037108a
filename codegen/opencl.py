"""A kernel as OpenCL C source.

The kernel's decompositions (rules/decomp.rules) have run first, so floor
division and modulo arrive as the truncating CDIV / CMOD, guarded (with
shifts) against the operands C leaves undefined, and loads that may leave
their buffer are already clamped. Every op gets the meaning
engine/ir/alu.py gives it (and the NUMPY reference device computes), as
codegen/llvmir.py does: integers wrap (signed arithmetic is done in unsigned C
types, where C defines the wrap; `index` arithmetic, which cannot overflow,
stays signed so the compiler sees affine addresses), float to int casts map
non-finite values to 0 and wrap modulo 2**64,
MAX is `b > a ? b : a` (a NaN second operand loses), bools live as uchar in
memory. Where codegen/llvmir.py departs from engine/ir/alu.py this file follows
engine/ir/alu.py: TRUNC and float // never give -0.0 (x // 0 is floor(x / 0), as
numpy gives it), and an unsigned integer power with an
exponent whose top bit is set still multiplies.

Shape of the kernel: the optimizer (codegen/opt) has split and marked the
ranges; this file follows the marks. A store's `loop` ranges are flattened into
a 1-D NDRange (one work-item per element stored, the innermost range fastest,
so neighbouring work-items touch neighbouring memory; each range index is
recovered with a constant / and %), and a bound check drops the work-items past
the end. Each work-item runs every REDUCE of its element as a loop over a
contiguous chunk (what CPU OpenCL devices run well). `local` ranges are the
work-items of one work-group, and `upcast` ranges a work-item's lanes, each
with its own accumulator in the shared reduce loops (`fma` for sums of
products): a register tile in a work-group. Reduce ranges marked `group:n`
make the kernel one work-group of n per output: the group's work-items stride
through the reduction together and combine their partial results as a tree in
local memory (_group_reduce). A `vector:n` range moves n neighbouring elements
per work-item as one aligned vector load / store (a buffer is a whole device
allocation), each element still computed by the scalar code (_render_vector). Index arithmetic is `int` when every index value's
bounds fit in 32 bits, else `long`. A float REDUCE outside lanes whose
innermost range has at least 2 * LANES elements keeps LANES accumulators over
interleaved elements and combines them as a tree at the end: independent
chains, since the compiler may not reassociate floats itself; like the CPU
device's `reassoc`, this changes sums and products by rounding only. A kernel
with several stores, or a store without ranges, runs as one work-item (unless
it is a group reduction).

Variables (DEFINE_VAR, `Kernel.vars`): one `long` argument each after the
buffers (`var0`, `var1`, ... by position: a variable's name comes from user
code and is never printed), converted to the variable's type where it is read
(`int` for an index variable when index arithmetic is narrow: its bounds, which
the launch checks, fit). One program serves every value.

Floats: `#pragma OPENCL FP_CONTRACT OFF` (no a*b+c fusion, as LLVM without
`contract`); no fast-math options. The 2-byte floats (float16, bfloat16:
`DType.is_half`) are stored as their bits (`ushort`) and computed in `float`,
rounded back after every op by helper functions keyed by the dtype (_HALF):
float16 with the core `vstore_half_rte` / `vload_half` pair (NaNs by hand,
keeping their payload), bfloat16 with integer code (its bits are a float's top
16: widening is a shift; rounding adds 0x7fff plus the lowest kept bit, and a
NaN becomes ml_dtypes' canonical one, sign kept). Either is the same bits as
per-op arithmetic in the 2-byte type (float has more than 2*11+2 bits, so the
double rounding is innocuous), and neither needs an extension. On a device
with cl_khr_fp16 and RULEC_CL_HALF=1 (`Target.half`) float16 is native instead:
`half*` buffers and `half` values under `#pragma OPENCL EXTENSION cl_khr_fp16`,
with + - * (MULACC as a multiply and an add), negation, comparisons, max,
where, trunc, fmod and floor in `half` (IEEE: the same bits as the float path);
division, reciprocal and sqrt computed in float and rounded once with
`convert_half_rte` (OpenCL does not ask half ones to be correctly rounded;
float's, rounded once, are, where the device divides float correctly), the
transcendentals as below; casts to half round to nearest even and casts from
it are exact, a NaN made by hand with numpy's bits either way (_half_alu,
`rulec_f2hn` / `rulec_hfn`). bfloat16 keeps the float path (no bfloat16 ALU is assumed).
A bfloat16 value held in a float is always exactly a bfloat16 (its
low 16 bits zero), so a store keeps the top 16 bits as they are (a NaN's
payload too, as numpy's copy does); the ops that do not round (negation, max,
trunc, fmod, floor division's floor) still pass through the rounding for
bfloat16, which only makes a NaN canonical, as the NUMPY device's `half_alu`
does. Half sums and products
accumulate in float and round once, as numpy's and the CPU device's do (native
halves too: a float accumulator, float partial results in local memory;
STAGE's blocks of halves are floats in local memory either way).
float32 and the halves' exp2 / log2 / sin / pow are computed in double and
rounded once when the device has cl_khr_fp64 (PoCL's float versions are not
correctly rounded; libm's, which the CPU device calls, nearly always are); a
double reaches bfloat16 with one rounding (to float rounding to odd, then to
nearest even), as ml_dtypes rounds. float64 needs cl_khr_fp64.
"""
from __future__ import annotations

import math

import attrs
import numpy as np

from rulec.engine.ir.alu import wrap
from rulec.codegen.opt.transform import (VECTOR_DTYPES, VECTOR_WIDTHS, contiguous_offset, free_ranges, group_vector, range_kind,
                                   block_dims, guarded_product, renamed_reduce, stage_split, staged_dims, staged_loads)
from rulec.codegen.scoped import ScopedEmitter
from rulec.engine.ir.dtypes import DType, dtypes, np_dtype_named
from rulec.engine.ir.ops import Ops
from rulec.engine.ir.alu import identity_element
from rulec.engine.ir.facts import multiple_of, offset_of, range_steps, terms_of
from rulec.engine.ir.rewrite import substitute
from rulec.engine.ir.uop import UOp
from rulec.engine.ir.kernel import Kernel

KERNEL_NAME = "rulec_kernel"
LANES = 8   # accumulators per float reduce


@attrs.frozen
class Target:
  """What the device can compile and how to shape kernels for it.

  fp64: cl_khr_fp64. half: cl_khr_fp16 (float16 as `half`). group: the most
  work-items of one work-group that may cooperate on a reduction through local
  memory (0: never; CPU devices, where a work-item reducing a contiguous chunk
  is faster)."""
  fp64: bool = True
  group: int = 0
  vector: int = 0  # elements per work-item (vload / vstore) in contiguous 4-byte elementwise kernels; 0: off
  tile: int = 0    # the most work-items of a work-group around register tiles (matmul, convolution); 0: no tiles
  units: int = 1   # compute units (how many work-items fill the device)
  grid: int = 0    # work-groups sharing one reduction of a single value in one launch (GRID); 0: never
  async_copy: int = 0   # STAGE's blocks in flight at once (a ring of local buffers, copies issued ahead); 0: one
  ptx: bool = False     # inline PTX: the ring's 16-byte copies are Ampere's cp.async (else plain float4 copies)
  async_rows: bool = False   # ... and a load contiguous along the block (a matmul's A) kept in rows of the block, so
                             # that it copies in chunks too (its lanes read it an element at a time)
  row_vectors: bool = False  # ... and those rows read as a float4 per four steps (_row_read; off: no gain on the H100)
  fixed_group: bool = False  # kernels with work-groups declare their size (reqd_work_group_size), so the compiler knows
                             # how many registers a work-item may take
  half: bool = False   # cl_khr_fp16: float16 is OpenCL's `half` in buffers and registers, computed natively (_half_alu)


GROUP_ACCS = 4                 # accumulators per work-item in a long group reduction (loads in flight)
# ... in a one-pass reduction over many work-groups (GRID): the H200's 16M-float sum in 512 groups took 0.0237 ms
# with 8, 0.0253 with 4 (bench/results/h200-cl-2026-12-03-session9-sumprobe2.txt)
GRID_ACCS = 8
STAGE_MAX_REGS = 16            # STAGE prefetches a block into registers when each work-item copies at most this many
# ... and with Target.async_copy, its blocks in a ring of that many local buffers, at most this many bytes in all (NVIDIA:
# 48 KiB of static local memory per work-group), fewer buffers where they do not fit. Hand-written 4096^3 SGEMMs on
# the H100 (bench/results/h100-2026-12-06-session24.txt): register-staged copies at most 30 TFLOP/s, the same tiles
# with cp.async copies 3 blocks deep 44.4 (cuBLAS 50.0). rulec's own, bench/models.py: 4.13 ms with one buffer, 3.83
# with a ring of 3 copying B, 3.26 with A in rows copied too (async_rows; a ring of 2: 3.32); torch 2.71
ASYNC_LOCAL_BYTES = 48 << 10
ROW_CACHE_MAX = 32             # SPREAD: a row's loads are kept in registers when each work-item has at most this many


@attrs.frozen
class Rendered:
  source: str
  name: str
  global_size: int          # work-items to launch (the kernel checks the bound itself)
  flat_ranges: tuple        # the RANGEs folded into the NDRange, outermost first
  local_size: int = 0       # a group-reduction kernel's work-group size (0: the runtime picks one)
  # device buffers the kernel takes after its own (bytes each), made once per program and zeroed then: a one-pass
  # reduction's (GRID) partial results and its counter, which the last work-group sets back to 0
  scratch: tuple[int, ...] = ()


_INTS = {1: "char", 2: "short", 4: "int", 8: "long"}


def ctype(d: DType, target: Target | None = None) -> str:
  """The C type a value of d is computed in."""
  if d.kind == "b": return "bool"
  if d.kind in "ix": return _INTS[d.itemsize]
  if d.kind == "u": return "u" + _INTS[d.itemsize]
  if _native_half(d, target): return "half"   # native (cl_khr_fp16)
  if d.is_half or d is dtypes.float32: return "float"   # a half: float, rounded back after every op
  if d is dtypes.float64:
    if target is not None and not target.fp64:
      raise NotImplementedError("the OpenCL device has no cl_khr_fp64: float64 kernels cannot run on it")
    return "double"
  raise NotImplementedError(f"the OpenCL backend does not support {d}")


def _native_half(d: DType, target: Target | None) -> bool:
  """d is computed as OpenCL's `half`: float16 on a cl_khr_fp16 target (Target.half; bfloat16 never: no OpenCL
  bfloat16 ALU is assumed)."""
  return d is dtypes.float16 and target is not None and target.half


def memtype(d: DType, target: Target | None = None) -> str:
  """The C type of d's elements in a buffer."""
  if d.kind == "b": return "uchar"
  if _native_half(d, target): return "half"
  if d.is_half: return "ushort"   # its bits: see _HALF
  return ctype(d, target)


def _wide(d: DType) -> str:
  """The unsigned type integer arithmetic on d wraps in (at least 32 bits: C promotes narrower ones to int)."""
  return "ulong" if d.itemsize == 8 else "uint"


def _int_arg(u: UOp) -> int:
  """A RANGE's axis or a PARAM's slot, which the renderer prints into names: only an int is printed (validate
  refuses anything else before a kernel gets here; this keeps a renderer called on its own as strict)."""
  a = u.arg[0] if isinstance(u.arg, tuple) and u.arg else None
  if type(a) is not int: raise ValueError(f"{u.op} has arg {u.arg!r}: its first field must be an int to be printed")
  return a


def _rname(r: UOp) -> str: return f"r{_int_arg(r)}"


def _flit(v: float, d: DType) -> str:
  """A float constant, exact: hex literals of the value rounded to d."""
  c = "double" if d is dtypes.float64 else "float"
  if d is dtypes.bfloat16:   # (ml_dtypes rounds a float64 once, as the device's conversion does)
    with np.errstate(over="ignore", invalid="ignore"): v = float(np.array(v, np.float64).astype(np_dtype_named("bfloat16")))
  else:
    with np.errstate(over="ignore"): v = float({dtypes.float16: np.float16, dtypes.float32: np.float32}.get(d, np.float64)(v))
  if math.isnan(v):   # (bfloat16: its canonical NaN by its bits; OpenCL's NAN may have other payload bits)
    return f"as_float({0xffc00000 if math.copysign(1, v) < 0 else 0x7fc00000:#x}u)" if d is dtypes.bfloat16 else f"(({c})NAN)"
  if math.isinf(v): return f"(({c})INFINITY)" if v > 0 else f"(-({c})INFINITY)"
  return f"({v.hex()}{'' if c == 'double' else 'f'})"


def _ilit(v: int, d: DType) -> str:
  v = wrap(v, d)
  if d.kind == "b": return "((bool)1)" if v else "((bool)0)"
  t = ctype(d)
  if d.itemsize == 8 and d.kind != "u" and v == -(1 << 63): return "((long)(-0x7fffffffffffffffL - 1))"
  return f"(({t}){v}{'UL' if d.kind == 'u' else 'L'})"


# STAGE's 16-byte copies into local memory: Ampere's cp.async (the local pointer's integer value is its .shared
# address), or a plain float4 copy where there is no inline PTX
_CP16_PTX = """inline void rulec_cp16(__local float* dst, __global const float* src) {
  asm volatile("{ .reg .u32 a; cvt.u32.u64 a, %0; cp.async.cg.shared.global [a], [%1], 16; }" :: "l"((ulong)dst), "l"(src) : "memory");
}"""
_CP16_PLAIN = """inline void rulec_cp16(__local float* dst, __global const float* src) { vstore4(vload4(0, src), 0, dst); }"""

# helper functions, emitted once per kernel that uses them (after the helpers they call).
# float16 lives in memory as its bits (ushort). vload_half / vstore_half_rte (core OpenCL, no cl_khr_fp16) convert
# and round to nearest even; NaNs are converted by hand, keeping sign and the top payload bits as numpy does (PoCL's
# vstore_half turns every NaN into 0x7fff), so a half NaN loaded and stored again keeps its bits.
_HELPERS = {
  "h2f": "float rulec_h2f(ushort h) {\n"
         "  if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) return as_float(((uint)(h & 0x8000) << 16) | 0x7f800000u | ((uint)(h & 0x3ff) << 13));\n"
         "  return vload_half(0, (__private const half*)&h);\n}",
  "f2h": "ushort rulec_f2h(float x) {\n"
         "  uint b = as_uint(x);\n"
         "  if (isnan(x)) return (ushort)(((b >> 16) & 0x8000) | 0x7c00 | (((b >> 13) & 0x3ff) ? (b >> 13) & 0x3ff : 1));\n"
         "  ushort h; vstore_half_rte(x, 0, (__private half*)&h); return h;\n}",
  "d2h": "ushort rulec_d2h(double x) {\n"
         "  ulong b = as_ulong(x);\n"
         "  if (isnan(x)) return (ushort)(((b >> 48) & 0x8000) | 0x7c00 | (((b >> 42) & 0x3ff) ? (b >> 42) & 0x3ff : 1));\n"
         "  ushort h; vstore_half_rte(x, 0, (__private half*)&h); return h;\n}",
  # a float rounded to the nearest half, back as a float (a NaN stays as it is: only its top payload bits reach memory)
  "rh": "float rulec_rh(float x) { ushort h; vstore_half_rte(x, 0, (__private half*)&h); "
        "return isnan(x) ? x : vload_half(0, (__private const half*)&h); }",
  "rhd": "float rulec_rhd(double x) { return rulec_h2f(rulec_d2h(x)); }",
  # a float16 value (held in a float) to double, a NaN keeping its payload and signalling bit (a C cast would quiet it)
  "h2d": "double rulec_h2d(float x) {\n"
         "  uint b = as_uint(x);\n"
         "  if (isnan(x)) return as_double(((ulong)(b & 0x80000000u) << 32) | 0x7ff0000000000000UL | ((ulong)(b & 0x7fffff) << 29));\n"
         "  return (double)x;\n}",
  # bfloat16 lives in memory as its bits (ushort) too: a float's top 16 bits, so widening is a shift (exact, a NaN
  # keeping its payload as ml_dtypes' widening does). Rounding is integer code, on any device: to nearest even by
  # adding 0x7fff plus the lowest kept bit (a carry into the exponent gives the next binade or inf, and subnormals
  # round the same way, bfloat16 having float's exponent range); a NaN becomes ml_dtypes' canonical 0x7fc0, sign kept
  "b2f": "float rulec_b2f(ushort h) { return as_float((uint)h << 16); }",
  "f2b": "ushort rulec_f2b(float x) {\n"
         "  uint u = as_uint(x);\n"
         "  if (isnan(x)) return (ushort)(((u >> 16) & 0x8000) | 0x7fc0);\n"
         "  return (ushort)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);\n}",
  # a bfloat16 value (held in a float, exactly: every op rounds) into memory: its top bits as they are, so that a NaN
  # loaded and stored again keeps its payload, as numpy's copies do (rulec_f2b would make it canonical)
  "bbits": "ushort rulec_bbits(float x) { return (ushort)(as_uint(x) >> 16); }",
  "rb": "float rulec_rb(float x) { return rulec_b2f(rulec_f2b(x)); }",
  # a double to bfloat16 with one rounding, as ml_dtypes does (1 + 2**-8 + 2**-30 is 0x3f81): to float rounding to
  # odd (truncate, then set the lowest bit where anything was cut off), which keeps the sticky information that
  # rounding to nearest twice would lose; float has 16 more bits than bfloat16, so the second rounding is then exact
  "d2b": "ushort rulec_d2b(double x) {\n"
         "  if (isnan(x)) return (ushort)(((as_ulong(x) >> 48) & 0x8000) | 0x7fc0);\n"
         "  float f = convert_float_rtz(x);\n"
         "  if ((double)f != x) f = as_float(as_uint(f) | 1u);\n"
         "  return rulec_f2b(f);\n}",
  "rbd": "float rulec_rbd(double x) { return rulec_b2f(rulec_d2b(x)); }",
  # a bfloat16 value to float16 (held in a float): ml_dtypes rounds through float to nearest even, and makes every NaN
  # the canonical half NaN 0x7e00 with its sign (rulec_rh would keep a payload for rulec_f2h to store)
  "bh": "float rulec_bh(float x) { return isnan(x) ? as_float((as_uint(x) & 0x80000000u) | 0x7fc00000u) : rulec_rh(x); }",
  # native float16 (Target.half): casts to `half` round to nearest even; a NaN is made by hand with the bits numpy's
  # astype gives (sign, top payload bits; a device's own conversion may return its one canonical NaN instead)
  "f2hn": "half rulec_f2hn(float x) {\n"
          "  uint b = as_uint(x);\n"
          "  if (isnan(x)) return as_half((ushort)(((b >> 16) & 0x8000) | 0x7c00 | (((b >> 13) & 0x3ff) ? (b >> 13) & 0x3ff : 1)));\n"
          "  return convert_half_rte(x);\n}",
  # ... and a half widened to float, exactly, a NaN by hand too (its signalling bit kept, as numpy's astype keeps it;
  # a conversion instruction may quiet it)
  "hfn": "float rulec_hfn(half x) {\n"
         "  ushort h = as_ushort(x);\n"
         "  if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) return as_float(((uint)(h & 0x8000) << 16) | 0x7f800000u | ((uint)(h & 0x3ff) << 13));\n"
         "  return (float)x;\n}",
  # (a double in one rounding, through rulec_d2h: core vstore_half_rte, no conversion from double asked of the extension)
  "d2hn": "half rulec_d2hn(double x) { return as_half(rulec_d2h(x)); }",
  "bhn": "half rulec_bhn(float x) { return isnan(x) ? as_half((ushort)(((as_uint(x) >> 16) & 0x8000) | 0x7e00)) : convert_half_rte(x); }",
}
_HELPER_DEPS = {"rhd": ("h2f", "d2h"), "rb": ("b2f", "f2b"), "d2b": ("f2b",), "rbd": ("b2f", "d2b"), "bh": ("rh",),
                "d2hn": ("d2h",)}

# each 2-byte float's helpers (_HELPERS keys): its bits to float, a value (exact) to its bits, a float rounded to it
# (back as a float), a double rounded to it once (as a float)
_HALF = {dtypes.float16: dict(load="h2f", store="f2h", round="rh", double="rhd"),
         dtypes.bfloat16: dict(load="b2f", store="bbits", round="rb", double="rbd")}
# ops whose float results are exact (or, IDIV's floor, already rounded; its 0 // 0 is OpenCL's NAN, which PoCL makes
# 0x7fffffff): for bfloat16 they still pass through rounding, which changes nothing but a NaN (made canonical, so that
# a store keeps it): the NUMPY device rounds every result of half_alu so
_EXACT_OPS = frozenset({Ops.NEG, Ops.MAX, Ops.TRUNC, Ops.CMOD, Ops.IDIV})


def _f2i_helper(c: str) -> str:
  # engine/ir/alu.py: non-finite -> 0; else truncate toward zero, wrapping modulo 2**64 into [-2**63, 2**63) (exact)
  s = "" if c == "double" else "f"
  return (f"long rulec_f2i_{c}({c} v) {{\n"
          f"  {c} a = fabs(v);\n"
          f"  if (!(a < 0x1p63{s})) {{\n"
          f"    {c} w = fmod(v, 0x1p64{s});\n"
          f"    v = w >= 0x1p63{s} ? w - 0x1p64{s} : (w < -0x1p63{s} ? w + 0x1p64{s} : w);\n"
          f"  }}\n"
          f"  return (long)(a < INFINITY ? v : 0);\n}}")


def _pow_helper(d: DType) -> str:
  # square and multiply, wrapping; a negative exponent gives 1/a**|e| truncated (engine/ir/alu.py)
  t, u = ctype(d), _wide(d)
  lines = [f"{t} rulec_pow_{t}({t} a, {t} e) {{",
           f"  {u} r = 1, b = ({u})a; {t} x = e;",
           f"  while (x > 0) {{ if (x & 1) r = r * b; b = b * b; x = ({t})(({u})x >> 1); }}"]
  if d.kind == "u": lines.append(f"  return ({t})r;")
  else: lines.append(f"  return e < 0 ? (a == 1 ? ({t})1 : (a == -1 ? ((e & 1) ? ({t})-1 : ({t})1) : ({t})0)) : ({t})r;")
  return "\n".join(lines + ["}"])


class CLRenderer(ScopedEmitter):
  def __init__(self, kernel: Kernel, target: Target = Target(), name: str = KERNEL_NAME, vars=None):
    self.k, self.target, self.name = kernel, target, name
    # the variables, by position: argument var<i> (a variable's name is never printed)
    self.vars = tuple(kernel.vars if vars is None else vars)
    self.var_names = {v: f"var{i}" for i, v in enumerate(self.vars)}
    self.lines: list[str] = []
    self.depth = 1
    self.helpers: dict[str, str] = {}
    self.scopes: list[dict[UOp, str]] = [{}]
    self.ranges: dict[UOp, str] = {}
    self.ptrs: dict[UOp, str] = {}
    self.count = 0
    self.uses_fp64 = False
    self.uses_half = False   # native float16 (Target.half) appears: the source enables cl_khr_fp16
    self.group = 0   # work-items per output in a group-reduction kernel (0: one work-item per output)
    self.grid, self.grid_slots = 0, 0   # GRID: work-groups sharing the reductions, and how many reductions
    self.vec_loads: dict[UOp, str] | None = None   # a vector kernel's vector loads, by buffer (None: not one)
    self.vec_lane = 0
    self.vec_n = 0
    # a vector group step's loads (VECTOR after GROUP), by INDEX node: None outside one
    self.group_loads: dict[UOp, str] | None = None
    self.group_lane, self.group_vec_n, self.group_inner = 0, 1, None
    # a register tile's loop body: its lanes' vector loads, by (INDEX node, the other lanes' values); None outside one
    self.lane_vecs: dict | None = None
    self.local_decls: list[str] = []   # local-memory arrays, declared at the top of the kernel (STAGE's blocks)
    self.store_ranges: tuple = ()
    self.items = 1                     # work-items of one work-group (LOCAL)
    self.fixed = 0                     # the work-group size the kernel declares (Target.fixed_group), 0: none
    # SPREAD's row in registers: (canonical load, j) -> the register holding element lane + j * group of the row
    self.row_regs: dict | None = None
    self.row_canon: UOp | None = None
    self.set_lanes({})   # (render finds the upcast ranges)
    # index arithmetic in int rather than long when every index value provably fits: GPUs emulate 64-bit integer
    # multiplies and adds with several 32-bit instructions, and a tile's addresses are many of them
    self.narrow = all(-(1 << 31) < u.vmin and u.vmax < (1 << 31) for u in kernel.ast.toposort() if u.dtype is dtypes.index)

  # *** text ***
  def line(self, s: str): self.lines.append("  " * self.depth + s)

  def tmp(self, prefix: str = "v") -> str:
    self.count += 1
    return f"{prefix}{self.count}"

  def let(self, d: DType, expr: str) -> str:
    name = self.tmp()
    self.line(f"{self.ct(d)} {name} = {expr};")
    return name

  def ct(self, d: DType) -> str:
    if d is dtypes.float64: self.uses_fp64 = True
    if d is dtypes.index and self.narrow: return "int"
    if self.native(d): self.uses_half = True
    return ctype(d, self.target)

  def native(self, d: DType) -> bool:
    """Whether d is computed as OpenCL's `half` on this renderer's target (_native_half)."""
    return _native_half(d, self.target)

  def float_acc(self, op: Ops, d: DType) -> bool:
    """Whether a reduce's accumulator is a float where its values are native halves: sums and products accumulate in
    float and round once, as they do when halves are computed in float (and as numpy's and the CPU device's do)."""
    return self.native(d) and op in (Ops.ADD, Ops.MUL)

  def acc_type(self, op: Ops, d: DType) -> str:
    """The C type of a reduce's accumulator (float_acc)."""
    return "float" if self.float_acc(op, d) else self.ct(d)

  def acc_ident(self, op: Ops, d: DType) -> str:
    """The accumulator's start: op's identity, a float constant for a float accumulator."""
    return self.const(identity_element(op, d), dtypes.float32 if self.float_acc(op, d) else d)

  def helper(self, key: str, text: str | None = None) -> str:
    if key not in self.helpers:
      for dep in _HELPER_DEPS.get(key, ()): self.helper(dep)
      self.helpers[key] = text if text is not None else _HELPERS[key]
    return f"rulec_{key}"

  def half(self, d: DType, what: str) -> str:
    """The name of 2-byte float d's helper `what` (_HALF: load, store, round, double), emitted once."""
    return self.helper(_HALF[d][what])

  def rh(self, expr: str, d: DType) -> str:
    """expr (a float) rounded to d: to float16 or bfloat16 precision for those held in floats, unchanged otherwise
    (a native half's ops round themselves)."""
    return f"{self.half(d, 'round')}({expr})" if d.is_half and not self.native(d) else expr

  def helper_half(self, key: str) -> str:
    """A native-half helper (_HELPERS' f2hn, hfn, d2hn, bhn): its `half` needs cl_khr_fp16 enabled."""
    self.uses_half = True
    return self.helper(key)

  # *** loops ***
  def open_loop(self, r: UOp, start: str = "0", step: int = 1, end: str | None = None):
    v = _rname(r)
    end = str(r.src[0].arg) if end is None else end
    self.line(f"for ({self.ct(r.dtype)} {v} = {start}; {v} < {end}; {v}{'++' if step == 1 else f' += {step}'}) {{")
    self.depth += 1
    self.ranges[r] = v
    self.scopes.append({})

  def close_loop(self, r: UOp):
    self.depth -= 1
    self.line("}")
    self.scopes.pop()
    del self.ranges[r]

  # *** the kernel ***
  def render(self) -> Rendered:
    k = self.k
    for p in k.params: self.ptrs[p] = f"p{_int_arg(p)}"
    stores = list(k.ast.src)
    ends: tuple[UOp, ...] = ()
    if len(stores) == 1 and stores[0].op is Ops.END: ends = tuple(stores[0].src[1:])
    # the optimizer's marks (codegen/opt): store ranges are the NDRange (loop), work-items of a group (local),
    # lanes (upcast) or a vector kernel's one range; reduce ranges of a group reduction are group:n
    kinds = {r: range_kind(r) for r in ends}
    for r, (kind, n) in kinds.items():
      if kind == "vector": return self._render_vector(stores[0], r, n)
      if kind not in ("loop", "local", "upcast", "spread"): raise ValueError(f"the CL renderer cannot follow a {r.arg[1]} range (r{r.arg[0]})")
    all_kinds = [range_kind(u) for u in k.ast.toposort() if u.op is Ops.RANGE]
    groups = {n for kind, n in all_kinds if kind == "group"}
    if len(groups) > 1: raise ValueError(f"group reductions of several sizes in one kernel: {sorted(groups)}")
    self.group = groups.pop() if groups else 0
    self.grid = next((n for kind, n in all_kinds if kind == "grid"), 0)
    flat = tuple(r for r in ends if kinds[r][0] == "loop")
    local = tuple(r for r in ends if kinds[r][0] == "local")
    self.set_lanes({r: r.src[0].arg for r in ends if kinds[r][0] == "upcast"})
    total = math.prod(r.src[0].arg for r in flat)
    items = self.items = math.prod(r.src[0].arg for r in local)
    self.store_ranges = ends
    self.fixed = (self.group or items) if (self.group or local) and self.target.fixed_group else 0
    if self.group:   # (the launch size is in the source: the program cache is keyed by the source text)
      self.line(f"// {self.grid} work-groups of {self.group} share the reduction" if self.grid else
                f"// {total} work-groups of {self.group}")
      self.line("long gid = get_group_id(0);")
      self.line("int lane = get_local_id(0);")
    elif local:   # the split ranges divide evenly: every work-group is whole
      self.line(f"// {total} work-groups of {items}")
      self.line("long gid = get_group_id(0);")
      self.line("long lid = get_local_id(0);")
    elif flat:
      self.line("long gid = get_global_id(0);")
      self.line(f"if (gid >= {total}L) return;")
    self._unflatten(flat, "gid")
    self._unflatten(local, "lid")
    spread = next((r for r in ends if kinds[r][0] == "spread"), None)
    if spread is not None: self._row_cache(spread)
    if self.grid: self._grid_reduces()
    elif self.group: self._group_reduces()
    for st in stores:
      loops = []
      if st.op is Ops.END:
        for r in st.src[1:]:
          if r not in kinds:
            self.open_loop(r)
            loops.append(r)
        st = st.src[0]
      target, value = st.src
      p, idx = target.src
      # each work-item stores its share of the spread range: lane, lane + G, ... (unrolled over the row's registers)
      if spread is not None and self.row_regs is not None:
        loads = self._row_loads(spread, (value, idx))
        for j in range(spread.src[0].arg // self.group):
          self._enter_row_element(spread, j, loads)
          self._store(p, self.value(idx), self.value(value), value.dtype)
          self._leave_row_element(spread)
        continue
      if spread is not None: self.open_loop(spread, "lane", self.group)
      for _ in self.each_lane():
        v = self.value(value)
        i = self.value(idx)
        guard = self.group and spread is None   # every lane computed the value (the reductions need them all); one stores it
        if guard:
          self.line("if (lane == 0) {")
          self.depth += 1
        self._store(p, i, v, value.dtype)
        if guard:
          self.depth -= 1
          self.line("}")
      if spread is not None: self.close_loop(spread)
      for r in reversed(loops): self.close_loop(r)
    if self.grid:
      # (8 bytes a partial result: the widest type a reduction has; then the counter)
      return Rendered(self._assemble(), self.name, self.grid * self.group, flat, self.group,
                      (8 * self.grid * self.grid_slots, 4))
    if self.group: return Rendered(self._assemble(), self.name, total * self.group, flat, self.group)
    if local: return Rendered(self._assemble(), self.name, total * items, flat + local, items)
    return Rendered(self._assemble(), self.name, total if flat else 1, flat)

  def _unflatten(self, rs: tuple, flat: str):
    """Each of rs (outermost first) recovered from one flat id, the last range fastest."""
    stride = math.prod(r.src[0].arg for r in rs)
    for i, r in enumerate(rs):
      n = r.src[0].arg
      stride //= n
      e = flat if stride == 1 else f"({flat} / {stride}L)"
      if i > 0: e = f"({e} % {n}L)"
      v = _rname(r)
      self.line(f"{self.ct(r.dtype)} {v} = ({self.ct(r.dtype)}){e};")
      self.ranges[r] = v

  def lane_value(self, i: int) -> str: return str(i) if self.narrow else f"{i}L"

  def _render_vector(self, end: UOp, r: UOp, n: int) -> Rendered:
    """n lanes per work-item (VECTOR): each lane's value is computed as usual (scalar, same semantics) from the
    components of vector loads, and the lanes are stored with one vector store."""
    total = r.src[0].arg
    self.vec_loads, self.vec_n = {}, n
    self.line("long wid = get_global_id(0);")
    self.line(f"if (wid >= {total // n}L) return;")
    st = end.src[0]
    (p, _), value = st.src[0].src, st.src[1]
    vals = []
    for lane in range(n):
      self.vec_lane = lane
      self.scopes.append({})
      self.ranges[r] = f"(wid * {n}L + {lane})"
      vals.append(self.value(value))
      self.scopes.pop()
    mt = memtype(value.dtype, self.target)
    self.line(f"{self._aligned(p, mt, n)}[wid] = ({mt}{n})({', '.join(vals)});")
    return Rendered(self._assemble(), self.name, total // n, (r,))

  def _assemble(self) -> str:
    outs = set(self.k.outputs)
    distinct = len({id(b) for b in self.k.bufs}) == len(self.k.bufs)
    args = []
    for i, b in enumerate(self.k.bufs):
      if b.dtype is dtypes.float64: self.uses_fp64 = True
      if self.native(b.dtype): self.uses_half = True
      args.append(f"__global {'' if i in outs else 'const '}{memtype(b.dtype, self.target)}* {'restrict ' if distinct else ''}p{i}")
    head = ["// generated by rulec (codegen/opencl.py)", "#pragma OPENCL FP_CONTRACT OFF"]
    if self.uses_fp64 or any("double" in h for h in self.helpers.values()):
      head.append("#pragma OPENCL EXTENSION cl_khr_fp64 : enable")
    if self.uses_half: head.append("#pragma OPENCL EXTENSION cl_khr_fp16 : enable")
    body = list(self.helpers.values())
    args += [f"long {self.var_names[v]}" for v in self.vars]
    if self.grid: args += ["__global ulong* grid_part", "volatile __global int* restrict grid_count"]
    fixed = f"__attribute__((reqd_work_group_size({self.fixed}, 1, 1))) " if self.fixed else ""
    sig = f"__kernel {fixed}void {self.name}({', '.join(args) if args else 'void'}) {{"
    return "\n".join(head + body + [sig] + [f"  {d}" for d in self.local_decls] + self.lines + ["}", ""])

  def _store(self, p: UOp, idx: str, v: str, d: DType):
    ptr = self.ptrs[p]
    if d.kind == "b": self.line(f"{ptr}[{idx}] = (uchar){v};")
    elif d.is_half and not self.native(d): self.line(f"{ptr}[{idx}] = {self.half(d, 'store')}({v});")
    else: self.line(f"{ptr}[{idx}] = {v};")

  # *** one node ***
  def emit(self, u: UOp) -> str:
    op, d = u.op, u.dtype
    if op is Ops.CONST: return self.const(u.arg, d)
    if op is Ops.RANGE:
      if u not in self.ranges: raise ValueError(f"range r{u.arg[0]} used outside its loop")
      return self.ranges[u]
    if op is Ops.DEFINE_VAR:   # the long argument in the variable's type (its value fits: the launch checks its range)
      name = self.var_names.get(u)
      if name is None: raise ValueError("a DEFINE_VAR the program takes no argument for")
      t = self.ct(d)
      return name if t == "long" else f"(({t}){name})"
    if op is Ops.INDEX and self.vec_loads is not None:   # a vector kernel's load: one lane of it
      p = u.src[0]
      if p not in self.vec_loads:
        self.vec_loads[p] = self.tmp("vl")
        t = memtype(d, self.target)
        self.line(f"{t}{self.vec_n} {self.vec_loads[p]} = {self._aligned(p, t, self.vec_n)}[wid];")
      return self.let(d, f"{self.vec_loads[p]}.s{self.vec_lane:x}")
    if op is Ops.INDEX and (vl := self._group_vector_load(u)) is not None: return vl
    if op is Ops.INDEX and (vl := self._lane_vector_load(u)) is not None: return vl
    if op is Ops.INDEX:
      p, idx = u.src
      i = self.value(idx)
      if d.kind == "b": return self.let(d, f"(bool)({self.ptrs[p]}[{i}] & 1)")
      if d.is_half and not self.native(d): return self.let(d, f"{self.half(d, 'load')}({self.ptrs[p]}[{i}])")
      return self.let(d, f"{self.ptrs[p]}[{i}]")
    if op is Ops.REDUCE: return self.reduce(u)
    s = [self.lookup(x) for x in u.src]
    if op is Ops.CAST: return self.let(d, self.cast(s[0], u.src[0].dtype, d))
    if op is Ops.BITCAST: return self.let(d, self.bitcast(s[0], u.src[0].dtype, d))
    if op is Ops.WHERE: return self.let(d, f"{s[0]} ? {s[1]} : {s[2]}")
    e = self.alu(op, u.src[0].dtype, d, s)
    return self.let(d, self.rh(e, d) if d is dtypes.bfloat16 and op in _EXACT_OPS else e)

  def const(self, v, d: DType) -> str:
    if d is dtypes.index and self.narrow: return str(int(v))
    if d.kind == "f":
      if d is dtypes.float64: self.ct(d)
      # (a native half: the float literal of the value rounded to float16, exact as a half)
      if self.native(d): return f"(({self.ct(d)}){_flit(float(v), d)})"
      return _flit(float(v), d)
    return _ilit(v, d)

  def alu(self, op: Ops, sd: DType, d: DType, s: list[str]) -> str:
    if sd.kind == "b": return self._bool_alu(op, s)
    if op is Ops.CMPLT: return f"{s[0]} < {s[1]}"
    if op is Ops.CMPNE: return f"{s[0]} != {s[1]}"    # C's != is true for NaN, == and < are false (as LLVM's une / oeq / olt)
    if op is Ops.CMPEQ: return f"{s[0]} == {s[1]}"
    if op is Ops.MAX: return f"{s[1]} > {s[0]} ? {s[1]} : {s[0]}"   # the first operand survives a NaN second
    if sd.kind == "f": return self._float_alu(op, sd, s)
    return self._int_alu(op, sd, s)

  def _bool_alu(self, op: Ops, s: list[str]) -> str:
    # bools saturate: + and max are or, * is and; - is arithmetic mod 2 (xor), as LLVM's i1
    if op in (Ops.ADD, Ops.MAX, Ops.OR): return f"{s[0]} | {s[1]}"
    if op in (Ops.MUL, Ops.AND): return f"{s[0]} & {s[1]}"
    if op in (Ops.XOR, Ops.SUB, Ops.CMPNE): return f"{s[0]} != {s[1]}"
    if op is Ops.CMPEQ: return f"{s[0]} == {s[1]}"
    if op is Ops.CMPLT: return f"!{s[0]} & {s[1]}"
    if op is Ops.NEG: return s[0]
    raise NotImplementedError(f"the OpenCL backend cannot render {op} on bool")

  def _float_alu(self, op: Ops, sd: DType, s: list[str]) -> str:
    if self.native(sd): return self._half_alu(op, s)
    c, rh = self.ct(sd), (lambda e: self.rh(e, sd))
    if op is Ops.ADD: return rh(f"{s[0]} + {s[1]}")
    if op is Ops.SUB: return rh(f"{s[0]} - {s[1]}")
    if op is Ops.MUL: return rh(f"{s[0]} * {s[1]}")
    if op is Ops.FDIV: return rh(f"{s[0]} / {s[1]}")
    if op is Ops.NEG: return f"-{s[0]}"
    if op is Ops.RECIPROCAL: return rh(f"({c})1 / {s[0]}")
    if op is Ops.SQRT: return rh(f"sqrt({s[0]})")
    if op is Ops.TRUNC: return f"trunc({s[0]}) + ({c})0"   # + 0: engine/ir/alu.py's trunc never gives -0.0
    if op is Ops.CMOD: return f"fmod({s[0]}, {s[1]})"       # exact; NaN for a zero divisor
    if op is Ops.MULACC: return rh(f"{rh(f'{s[0]} * {s[1]}')} + {s[2]}")
    if op is Ops.IDIV:
      # floor(a / b) (+ 0: never -0.0); a non-finite quotient passes through (x // 0 is x / 0, as numpy gives it)
      return f"floor({rh(f'{s[0]} / {s[1]}')}) + ({c})0"
    fns = {Ops.EXP2: "exp2", Ops.LOG2: "log2", Ops.SIN: "sin", Ops.POW: "pow"}
    if op in fns:
      call = f"{fns[op]}({', '.join(s)})"
      if sd is dtypes.float64: return call
      if self.target.fp64:   # in double, rounded once: as good as libm's float functions
        self.uses_fp64 = True
        dcall = f"{fns[op]}({', '.join(f'(double){x}' for x in s)})"
        return f"{self.half(sd, 'double')}({dcall})" if sd.is_half else f"(float){dcall}"
      return rh(call)
    raise NotImplementedError(f"the OpenCL backend cannot render {op} on {sd} (no decomposition rule for it)")

  def _half_alu(self, op: Ops, s: list[str]) -> str:
    """A float16 op in native `half` (Target.half). + - * (and MULACC's two steps, FP_CONTRACT OFF) are correctly
    rounded in half by IEEE 754; negation, comparisons, max, where, trunc, fmod and floor are exact. Division,
    reciprocal and sqrt are computed in float and rounded once (convert_half_rte): OpenCL does not ask half ones to
    be correctly rounded (and NVIDIA has no half divide), while a correctly rounded float answer rounded to half is
    the correctly rounded half (24 bits > 2 * 11 + 2: the double rounding is innocuous; -cl-fp32-correctly-rounded-
    divide-sqrt where the device offers it); the transcendentals in double (or float), rounded once, as for halves
    held in floats."""
    h = "half"
    f = lambda x: f"(float){x}"   # noqa: E731  (exact)
    if op is Ops.ADD: return f"{s[0]} + {s[1]}"
    if op is Ops.SUB: return f"{s[0]} - {s[1]}"
    if op is Ops.MUL: return f"{s[0]} * {s[1]}"
    if op is Ops.MULACC: return f"{s[0]} * {s[1]} + {s[2]}"   # (two roundings: no contraction)
    if op is Ops.NEG: return f"-{s[0]}"
    if op is Ops.FDIV: return f"convert_half_rte({f(s[0])} / {f(s[1])})"
    if op is Ops.RECIPROCAL: return f"convert_half_rte(1.0f / {f(s[0])})"
    if op is Ops.SQRT: return f"convert_half_rte(sqrt({f(s[0])}))"
    if op is Ops.TRUNC: return f"trunc({s[0]}) + ({h})0"   # + 0: engine/ir/alu.py's trunc never gives -0.0
    if op is Ops.CMOD: return f"fmod({s[0]}, {s[1]})"
    if op is Ops.IDIV:   # (as _float_alu: the quotient rounded to half, then its floor)
      return f"floor(convert_half_rte({f(s[0])} / {f(s[1])})) + ({h})0"
    fns = {Ops.EXP2: "exp2", Ops.LOG2: "log2", Ops.SIN: "sin", Ops.POW: "pow"}
    if op in fns:
      if self.target.fp64:
        self.uses_fp64 = True
        return f"{self.helper_half('d2hn')}({fns[op]}({', '.join(f'(double){x}' for x in s)}))"
      return f"convert_half_rte({fns[op]}({', '.join(map(f, s))}))"
    raise NotImplementedError(f"the OpenCL backend cannot render {op} on float16 (no decomposition rule for it)")

  def _int_alu(self, op: Ops, sd: DType, s: list[str]) -> str:
    t, u = self.ct(sd), _wide(sd)
    if sd is dtypes.index and op in (Ops.ADD, Ops.SUB, Ops.MUL):   # index arithmetic never overflows: plain C, so the
      return f"{s[0]} {'+' if op is Ops.ADD else '-' if op is Ops.SUB else '*'} {s[1]}"   # compiler sees affine addresses
    if op in (Ops.ADD, Ops.SUB, Ops.MUL):   # in unsigned arithmetic: wraps, as numpy (signed overflow is UB in C)
      return f"({t})(({u}){s[0]} {'+' if op is Ops.ADD else '-' if op is Ops.SUB else '*'} ({u}){s[1]})"
    if op is Ops.NEG: return f"({t})(({u})0 - ({u}){s[0]})"
    if op is Ops.MULACC: return f"({t})(({u}){s[0]} * ({u}){s[1]} + ({u}){s[2]})"
    if op is Ops.AND: return f"({t})({s[0]} & {s[1]})"
    if op is Ops.OR: return f"({t})({s[0]} | {s[1]})"
    if op is Ops.XOR: return f"({t})({s[0]} ^ {s[1]})"
    if op is Ops.TRUNC: return s[0]
    # division, remainder and shifts arrive guarded (rules/decomp.rules): their operands are ones C defines; a
    # left shift is made in unsigned arithmetic (a negative value shifted left is undefined in C)
    if op is Ops.CDIV: return f"({t})({s[0]} / {s[1]})"
    if op is Ops.CMOD: return f"({t})({s[0]} % {s[1]})"
    if op is Ops.SHL: return f"({t})(({u}){s[0]} << {s[1]})"
    if op is Ops.SHR: return f"({t})({s[0]} >> {s[1]})"
    if op is Ops.POW: return f"{self.helper(f'pow_{t}', _pow_helper(sd))}({s[0]}, {s[1]})"
    raise NotImplementedError(f"the OpenCL backend cannot render {op} on {sd} (no decomposition rule for it)")

  def cast(self, v: str, sd: DType, d: DType) -> str:
    if sd is d: return v
    c = self.ct(d)
    if d.kind == "b": return f"{v} != 0"   # NaN is true (!= is unordered)
    if sd.kind == "b": return f"({c}){v}"
    if sd.kind == "f" and d.kind == "f":
      if self.native(d):   # to half: rounded once (a NaN keeps numpy's bits)
        if sd is dtypes.float64: return f"{self.helper_half('d2hn')}({v})"
        return f"{self.helper_half('bhn' if sd is dtypes.bfloat16 else 'f2hn')}({v})"
      if self.native(sd):   # from half: exact, a NaN's bits as numpy's
        w = f"{self.helper_half('hfn')}({v})"
        return self.rh(w, d) if d is dtypes.bfloat16 else f"{self.helper('h2d')}({w})" if d is dtypes.float64 else w
      if d.is_half:
        if sd is dtypes.float64: return f"{self.half(d, 'double')}({v})"
        if sd is dtypes.bfloat16 and d is dtypes.float16: return f"{self.helper('bh')}({v})"
        return self.rh(v, d)   # from float32 or the other half, which the float holds exactly
      if sd is dtypes.float16 and d is dtypes.float64: return f"{self.helper('h2d')}({v})"
      return f"({c}){v}"   # (bfloat16 to double through its float, exact: a NaN is quieted as ml_dtypes' cast does)
    if d.kind == "f":   # from an integer; for float16 via float, exact below 2**24 (and inf above 65519 either way)
      if self.native(d): return f"convert_half_rte((float){v})"
      if d is dtypes.bfloat16 and self.target.fp64:
        # through double, as the NUMPY device converts (one rounding below 2**53), then rounded once. A device
        # without cl_khr_fp64 goes through float below: two roundings, which can differ past 2**24
        self.uses_fp64 = True
        return f"{self.half(d, 'double')}((double){v})"
      return self.rh(f"(float){v}", d) if d.is_half else f"({c}){v}"
    if sd.kind == "f":
      src = "double" if sd is dtypes.float64 else "float"
      return f"({c}){self.helper(f'f2i_{src}', _f2i_helper(src))}({f'(float){v}' if self.native(sd) else v})"
    return f"({c}){v}"   # int -> int: C converts by value: truncate, or sign/zero-extend by the source's signedness

  def bitcast(self, v: str, sd: DType, d: DType) -> str:
    if sd.itemsize != d.itemsize or "b" in (sd.kind, d.kind):
      raise NotImplementedError(f"the OpenCL backend cannot bitcast {sd} to {d}")
    if sd.is_half and not self.native(sd): v = self.half(sd, "store") + f"({v})"
    if d.is_half and not self.native(d): return f"{self.half(d, 'load')}(as_ushort({v}))"
    return f"as_{self.ct(d)}({v})"

  def _combine(self, op: Ops, d: DType, acc: str, v: str) -> str:
    # (half sums and products accumulate in float, unrounded, as numpy's and the CPU device's do: a native half value
    # widens to the float accumulator, exactly)
    if d.kind == "f" and op is Ops.ADD: return f"{acc} + {v}"
    if d.kind == "f" and op is Ops.MUL: return f"{acc} * {v}"
    return self.alu(op, d, d, [acc, v])

  def _reduced(self, op: Ops, d: DType, acc: str) -> str:
    """The accumulator's final value: half sums and products round to the half's precision once, here."""
    if self.float_acc(op, d): return self.let(d, f"convert_half_rte({acc})")
    return self.let(d, self.rh(acc, d)) if d.is_half and op in (Ops.ADD, Ops.MUL) else acc

  def _acc_result(self, op: Ops, d: DType, expr: str) -> str:
    """A reduction's result read from local memory (`expr`), into a variable of the accumulator's type, then _reduced."""
    name = self.tmp()
    self.line(f"{self.acc_type(op, d)} {name} = {expr};")
    return self._reduced(op, d, name)

  def reduce(self, u: UOp) -> str:
    op, d = u.arg, u.dtype
    value, rngs = u.src[0], u.src[1:]
    ident = self.acc_ident(op, d)
    if (run := self.running_of(u)) is not None:
      if self.group: raise ValueError("a running max (rules/online.rules) in a work-group reduction")
      if self.ups: return self.lane_reduce(u, lambda x, lanes: self._running_sum(x, lanes, run))
      return self._running_sum(u, [()], run)[0]
    if self.group: return self._group_reduce(u, ident)
    if self.ups: return self.lane_reduce(u, self._reduce_lanes)
    # a reduce inside this one that does not depend on its ranges (a row's max inside the sum of a logsumexp, fused
    # where work-groups share rows) is computed once, before the loops, not at every step
    for x in value.toposort():
      if x.op is Ops.REDUCE and not free_ranges(x) & set(rngs): self.value(x)
    inner = rngs[-1] if rngs else None
    if (e := self.guard_end(u, ("loop", "reduce"))) is not None:
      # a reduce over a Variable's size: the loop ends at min(max(e, 0), size), every step inside the guard
      acc, end = self.tmp("acc"), self.tmp("end")
      self.line(f"{self.acc_type(op, d)} {acc} = {ident};")
      self.line(f"{self.ct(inner.dtype)} {end} = clamp(({self.ct(inner.dtype)})({self.value(e)}), "
                f"({self.ct(inner.dtype)})0, ({self.ct(inner.dtype)}){inner.src[0].arg});")
      self.open_loop(inner, end=end)
      self.line(f"{acc} = {self._combine(op, d, acc, self.value(value.src[1]))};")
      self.close_loop(inner)
      return self._reduced(op, d, acc)
    if d.kind != "f" or inner is None or inner.src[0].arg < 2 * LANES or any(x.op is Ops.REDUCE for x in value.toposort()):
      acc = self.tmp("acc")
      self.line(f"{self.acc_type(op, d)} {acc} = {ident};")
      for r in rngs: self.open_loop(r)
      self.line(f"{acc} = {self._combine(op, d, acc, self.value(value))};")
      for r in reversed(rngs): self.close_loop(r)
      return self._reduced(op, d, acc)
    # a float reduce: LANES accumulators over interleaved elements of the innermost range, summed as a tree at the end.
    # Independent chains instead of one (the compiler may not reassociate floats): the order changes, as the CPU
    # device's `reassoc` lets LLVM change it; a MAX gives the same value in any order.
    accs = [self.tmp("acc") for _ in range(LANES)]
    self.line(f"{self.acc_type(op, d)} {', '.join(f'{a} = {ident}' for a in accs)};")
    for r in rngs[:-1]: self.open_loop(r)
    n, k, rt = inner.src[0].arg, _rname(inner), self.ct(inner.dtype)
    main = n - n % LANES
    self.line(f"for ({rt} {k} = 0; {k} < {main}; {k} += {LANES}) {{")
    self.depth += 1
    for j, a in enumerate(accs):
      self.ranges[inner] = k if j == 0 else f"({k} + {j})"
      self.scopes.append({})
      self.line(f"{a} = {self._combine(op, d, a, self.value(value))};")
      self.scopes.pop()
    self.depth -= 1
    self.line("}")
    if main < n:
      self.ranges[inner] = k
      self.line(f"for ({rt} {k} = {main}; {k} < {n}; {k}++) {{")
      self.depth += 1
      self.scopes.append({})
      self.line(f"{accs[0]} = {self._combine(op, d, accs[0], self.value(value))};")
      self.scopes.pop()
      self.depth -= 1
      self.line("}")
    del self.ranges[inner]
    for r in reversed(rngs[:-1]): self.close_loop(r)
    step = 1
    while step < LANES:
      for i in range(0, LANES, 2 * step): self.line(f"{accs[i]} = {self._combine(op, d, accs[i], accs[i + step])};")
      step *= 2
    return self._reduced(op, d, accs[0])


  def _running_sum(self, u: UOp, asked: list, run: UOp) -> list[str]:
    """A float sum over a softmax's row with a running max (RUNMAX `run`, rules/online.rules) in one loop, with
    every other such sum over the same range and max (the row's sum beside the products with v;
    ScopedEmitter.running_plan): the form and its edge cases are codegen/llvmir.py's _running_sum. Returns u's
    `asked` lanes."""
    d, ct = u.dtype, self.ct(u.dtype)
    plan = self.running_plan(u, run)
    keys = plan.keys
    zero, ninf = self.const(0.0, d), f"(({ct})(-INFINITY))"
    accs = {sm: {k: self.tmp("acc") for k in plan.groups(sm)} for sm in plan.sums}
    maxes = {k: self.tmp("runmax") for k in plan.groups(run)}
    self.line(f"{ct} {', '.join(f'{x} = {zero}' for per in accs.values() for x in per.values())};")
    self.line(f"{ct} {', '.join(f'{m} = {ninf}' for m in maxes.values())};")
    self.open_loop(u.src[1])
    safe = {}
    for k, t in self.running_scores(plan):
      m, corr = maxes[k], self.tmp("corr")
      self.line(f"if ({t} > {m}) {{ {ct} {corr} = exp2(({m} - {t}) * {self.const(run.arg, d)}); "
                + " ".join(f"{accs[sm][sk]} *= {corr};" for sm, sk in plan.rescaled(k)) + f" {m} = {t}; }}")
      safe[k] = self.let(d, f"({m} == {ninf} ? {zero} : {m})")
    for sm, sk, v in self.running_terms(plan, safe): self.line(f"{accs[sm][sk]} += {v};")
    self.close_loop(u.src[1])
    nan = f"(({ct})NAN)"
    done = {sm: {sk: self.let(d, f"({maxes[keys[run](lane)]} == {ninf} ? {nan} : {accs[sm][sk]})")
                 for sk, lane in plan.groups(sm).items()} for sm in plan.sums}
    return self.running_results(plan, asked, done)

  def _reduce_lanes(self, u: UOp, lanes: list) -> list[str]:
    """Every lane's result of u in one loop nest: an accumulator per lane, each lane's value emitted side by
    side in the body (loads that do not depend on the lane are the same expression in every lane)."""
    op, d = u.arg, u.dtype
    value, rngs = u.src[0], u.src[1:]
    ident = self.acc_ident(op, d)
    accs = [self.tmp("acc") for _ in lanes]
    self.line(f"{self.acc_type(op, d)} {', '.join(f'{a} = {ident}' for a in accs)};")
    split = stage_split(u)
    staged, outside = split is not None, split[0] if split is not None else ()
    for r in outside: self.open_loop(r)
    if staged:
      stage, plans = split[1], self._stage_plan(u)
      ring = self._ring_size(plans, stage)
      for p in plans:
        self.local_decls.append(f"__local {self._shared_type(p['x'].dtype)} {p['name']}[{p['size'] * max(ring, 1)}] "
                                "__attribute__((aligned(64)));")
      if ring: self._stage_ring(plans, stage, ring)
      else:   # (block 0 fetched before the block loop, block b + 1 while block b is computed)
        self._stage_fetch(plans, stage, "0")
        self.open_loop(stage)
        self._stage_store(plans, stage)
        self._stage_fetch(plans, stage, f"(({self.ranges[stage]} + 1) % {stage.src[0].arg})")
      tiles = {p["x"]: (p["name"] if not ring else f"({p['name']} + {p['buf']})", p["layout"], p["vec"]) for p in plans}
      rngs = split[2]
    for r in rngs:
      # (a block's steps in one piece: neighbouring reads of a row may merge, and the four steps of a row's float4
      # (_row_read) pick constant components)
      if staged and (ring or self.target.row_vectors): self.line("#pragma unroll")
      self.open_loop(r)
    # a float sum of products fuses each product into the sum, as the CPU device's `contract` does (the lanes are a
    # matmul's or convolution's register tile: fma doubles what a GPU computes per cycle)
    fused_sum = op is Ops.ADD and d in (dtypes.float32, dtypes.float64)
    fuse = fused_sum and value.op is Ops.MUL
    # ... and a guarded product, where(c, a * b, 0) (a padded convolution's input gradient: the padding guards the
    # product, not a load), as fma(c ? a : 0, c ? b : 0, acc): the same value (0 * 0 where c fails, where the guard on
    # one operand would make 0 * inf a NaN that torch does not give), one fma and two selects the compiler shares
    # across lanes, for a multiply, a select and an add. H100, the ResNet block's input gradient: 1.50 -> 1.41 ms;
    # c ? fma(a, b, acc) : acc ran it in 5.0 (bench/results/h100-2026-12-06-session25.txt)
    guarded = fused_sum and guarded_product(value)
    self.lane_vecs = {}
    for lane, acc in zip(lanes, accs):
      self.enter_lane(lane)
      if staged:   # this lane's element of each staged block, by the same layout the copy wrote
        for x, (name, strides, vec) in tiles.items(): self.scopes[-1][x] = self._staged_read(x, name, strides, vec)
      if fuse: self.line(f"{acc} = fma({self.value(value.src[0])}, {self.value(value.src[1])}, {acc});")
      elif guarded:
        c, zero = self.value(value.src[0]), self.const(0.0, d)
        a, b = (self.value(x) for x in value.src[1].src)
        self.line(f"{acc} = fma({c} ? {a} : {zero}, {c} ? {b} : {zero}, {acc});")
      else: self.line(f"{acc} = {self._combine(op, d, acc, self.value(value))};")
      self.scopes.pop()
    self.lane_vecs = None
    for r in reversed(rngs): self.close_loop(r)
    if staged: self.close_loop(split[1])
    # (a ring's last blocks are still being read when the next pass around the outer loops issues its first ones)
    if staged and ring and outside: self.line("barrier(CLK_LOCAL_MEM_FENCE);")
    for r in reversed(outside): self.close_loop(r)
    return [self._reduced(op, d, acc) for acc in accs]

  def _stage_plan(self, u: UOp) -> list[dict]:
    """STAGE: for each staged load of u, its local array and how the work-group fills it. The copy's work-items
    take elements lid, lid + items, ... in the order of the load's steps, the smallest fastest (neighbouring
    work-items read neighbouring memory). The array's layout is for the reads: the block's range outermost, then
    the work-group's ranges, a tile's lanes innermost (side by side: one vector read for all of them); a step
    that is a multiple of the 32 banks is padded by a vector (the work-items of a warp would read one bank).
    `per`: elements each work-item copies when they divide evenly and are at most STAGE_MAX_REGS (then prefetched
    into registers), else 0."""
    plans = []
    for x in staged_loads(u, self.store_ranges):
      block = block_dims(x, u)
      dims = staged_dims(x, self.store_ranges) + block
      coef = range_steps(x.src[1])
      copy = sorted(dims, key=lambda r: -abs(coef.get(r, 1 << 62)))   # outermost first: the largest step
      lanes = [r for r in dims if r in self.ups]
      layout = block + [r for r in dims if r not in lanes and r not in block] + lanes
      vec = lanes[-1] if lanes and lanes[-1].src[0].arg in VECTOR_WIDTHS and x.dtype in VECTOR_DTYPES else None
      n = vec.src[0].arg if vec is not None else 1
      if self.target.async_copy and copy and coef.get(copy[-1]) == 1 and x.dtype.itemsize == 4 and \
         (copy[-1] not in block or self.target.async_rows):
        # (laid out as in memory, padded by a chunk: the ring copies it 16 bytes at a time. A matmul's B keeps its
        # lanes innermost, read as one vector; with async_rows A's block is rows of the sum's steps, read an element
        # at a time. Where a tile's columns are split (UPCAST 4, LOCAL, UPCAST 2: each work-item's two groups of 4
        # columns half a block apart), a warp's vector reads of B fall on consecutive banks)
        layout = copy
        vec = copy[-1] if copy[-1] in lanes and copy[-1].src[0].arg in VECTOR_WIDTHS and x.dtype in VECTOR_DTYPES else None
        n = max(4, vec.src[0].arg if vec is not None else 1)   # (a padded step keeps both the chunks and the vector aligned)
      strides, st = {}, 1
      for r in reversed(layout):
        strides[r] = st
        st *= r.src[0].arg
        if st % 32 == 0: st += n
      total = math.prod(r.src[0].arg for r in dims)
      per = total // self.items if total % self.items == 0 else 0
      plans.append(dict(x=x, name=self.tmp("tile"), layout=[(r, strides[r]) for r in layout], copy=copy, vec=vec,
                        total=total, size=-(-st // max(4, n)) * max(4, n), per=per if per <= STAGE_MAX_REGS else 0,
                        regs=[]))   # (a ring's next buffer starts aligned for the chunks and the vector reads)
    return plans

  def _stage_element(self, p: dict, e: str, stage: UOp, block: str, index: bool = False) -> tuple[str, str]:
    """(the value of element e of p's block `block` (with `index`: its index in the load's buffer), its place in the
    array). Emitted with nothing reused from outside: values there were computed with this work-item's own range
    values."""
    scopes, ranges = self.scopes, dict(self.ranges)
    self.scopes = [{}]
    self.ranges[stage] = block
    flat = 1
    for r in reversed(p["copy"]):
      self.ranges[r] = f"(({self.ct(r.dtype)})(({e} / {flat}) % {r.src[0].arg}))"
      flat *= r.src[0].arg
    at = " + ".join(f"{self.ranges[r]} * {st}" for r, st in p["layout"])
    v = self.value(p["x"].src[1] if index else p["x"])
    self.scopes, self.ranges = scopes, ranges
    return v, at

  # *** STAGE in a ring of blocks (Target.async_copy) ***
  def _chunked(self, p: dict) -> bool:
    """Whether staged load p's block copies as 16-byte chunks: 4-byte elements, a plain index whose fastest copy
    range steps by one element in memory and in the local array (a multiple of 4 long), every other step and the
    offset multiples of 4 (aligned chunks), every other step of the array too. A matmul's B: its rows of columns."""
    x, copy = p["x"], p["copy"]
    if x.dtype.itemsize != 4 or x.arg == "clamped" or not copy: return False
    c, layout = copy[-1], dict(p["layout"])
    if c.src[0].arg % 4 or layout.get(c) != 1 or any(st % 4 for r, st in p["layout"] if r is not c): return False
    terms, const = terms_of(x.src[1])
    return const % 4 == 0 and sum(t is c for _, t in terms) == 1 and all(k == 1 if t is c else k % 4 == 0 for k, t in terms)

  def _ring_size(self, plans: list[dict], stage: UOp) -> int:
    """Buffers in STAGE's ring: the target's async_copy, fewer where they do not fit ASYNC_LOCAL_BYTES or there are
    fewer blocks; 0 (one buffer, copies between two barriers) where fewer than 2 or no load copies in chunks."""
    n = min(self.target.async_copy, stage.src[0].arg)
    per = sum(p["size"] * max(4, p["x"].dtype.itemsize) for p in plans)
    while n >= 2 and n * per > ASYNC_LOCAL_BYTES: n -= 1
    chunks = [self._chunked(p) for p in plans]
    if n < 2 or not any(chunks): return 0
    for p, c in zip(plans, chunks): p["chunks"] = c
    return n

  def _copy_sync(self, what: str, n: int = 0) -> None:
    """cp.async's commit (a group of this work-item's copies) and wait (until at most n groups are in flight);
    nothing where the copies are plain (they are done when issued)."""
    if not self.target.ptx: return
    self.line('asm volatile("cp.async.commit_group;" ::: "memory");' if what == "commit" else
              f'asm volatile("cp.async.wait_group {n};" ::: "memory");')

  def _stage_issue(self, plans: list[dict], stage: UOp, block: str, slot: str | None, regs: bool) -> None:
    """Block `block` of every staged load into ring buffer `slot` (None: the one buffer there is): chunked loads as
    16-byte copies (cp.async with inline PTX); the others from the registers they were fetched into where `regs`,
    else loaded and stored now."""
    for p in plans:
      buf = "" if slot is None else f"({slot}) * {p['size']} + "
      if p.get("chunks"):
        ptr, n = self.ptrs[p["x"].src[0]], p["total"] // 4
        cp = self.helper("cp16", _CP16_PTX if self.target.ptx else _CP16_PLAIN)
        def one(e: str) -> None:
          idx, at = self._stage_element(p, f"({e} * 4)", stage, block, index=True)
          self.line(f"{cp}({p['name']} + {buf}{at}, {ptr} + {idx});")
        if n % self.items == 0 and n // self.items <= STAGE_MAX_REGS:
          for j in range(n // self.items): one(f"((int)lid + {j * self.items})")
          continue
        e = self.tmp("c")
        self.line(f"for (int {e} = (int)lid; {e} < {n}; {e} += {self.items}) {{")
        self.depth += 1
        one(e)
        self.depth -= 1
        self.line("}")
      elif regs and p["per"]:
        for j, reg in enumerate(p["regs"]):
          _, at = self._stage_element(p, f"((int)lid + {j * self.items})", stage, block)
          self.line(f"{p['name']}[{buf}{at}] = {reg};")
      else:
        e = self.tmp("e")
        self.line(f"for (int {e} = (int)lid; {e} < {p['total']}; {e} += {self.items}) {{")
        self.depth += 1
        v, at = self._stage_element(p, e, stage, block)
        self.line(f"{p['name']}[{buf}{at}] = {v};")
        self.depth -= 1
        self.line("}")

  def _stage_ring(self, plans: list[dict], stage: UOp, ring: int) -> None:
    """STAGE with `ring` local buffers per load: blocks 0 .. ring - 2 issued before the block loop; at block b, once
    its copies have landed (wait, then one barrier, which also says every work-item is done with block b - 1), block
    b + ring - 1 is issued into the buffer block b - 1 used, then block b is computed. Loads that do not copy in
    chunks go through registers fetched a block ahead, as without the ring. Sets each plan's `buf`, the offset of
    block b's buffer, for the reads."""
    nb, regs = stage.src[0].arg, [p for p in plans if not p["chunks"] and p["per"]]
    for b in range(ring - 1):
      self._stage_issue(plans, stage, str(b), str(b), regs=False)
      self._copy_sync("commit")
    self._stage_fetch(regs, stage, str(ring - 1))
    self.open_loop(stage)
    b = self.ranges[stage]
    slot = self.tmp("slot")
    self.line(f"int {slot} = {b} % {ring};")
    self._copy_sync("wait", ring - 2)
    self.line("barrier(CLK_LOCAL_MEM_FENCE);")
    self.line(f"if ({b} + {ring - 1} < {nb}) {{")
    self.depth += 1
    self._stage_issue(plans, stage, f"({b} + {ring - 1})", f"({b} + {ring - 1}) % {ring}", regs=True)
    if regs:
      self.line(f"if ({b} + {ring} < {nb}) {{")
      self.depth += 1
      self._stage_fetch(regs, stage, f"({b} + {ring})")
      self.depth -= 1
      self.line("}")
    self.depth -= 1
    self.line("}")
    self._copy_sync("commit")
    for p in plans: p["buf"] = f"{slot} * {p['size']}"

  def _stage_fetch(self, plans: list[dict], stage: UOp, block: str) -> None:
    """Each work-item's elements of block `block` of the evenly divided staged loads into its registers (the
    first call declares them): issued before the current block is computed, so the loads are in flight then."""
    for p in plans:
      for j in range(p["per"]):
        v, _ = self._stage_element(p, f"((int)lid + {j * self.items})", stage, block)
        if len(p["regs"]) <= j:
          p["regs"].append(self.tmp("pf"))
          self.line(f"{self._shared_type(p['x'].dtype)} {p['regs'][j]} = {v};")
        else: self.line(f"{p['regs'][j]} = {v};")

  def _stage_store(self, plans: list[dict], stage: UOp) -> None:
    """The current block into the local arrays, between barriers (the previous block's reads are done; this
    block's writes are seen): from the registers, or where the elements do not divide evenly, loaded now."""
    self.line("barrier(CLK_LOCAL_MEM_FENCE);")
    self._stage_issue(plans, stage, self.ranges[stage], None, regs=True)
    self.line("barrier(CLK_LOCAL_MEM_FENCE);")

  def _staged_read(self, x: UOp, name: str, strides: list, vec: UOp | None) -> str:
    """This lane's element of staged load x: with a vector range, one aligned vector read of the array made by the
    first of its lanes to ask (the others lanes' coordinates the same), each lane taking its component."""
    if vec is None and (rows := self._row_read(x, name, strides)) is not None: return rows
    if vec is None:
      read = f"{name}[{' + '.join(f'{self.ranges[r]} * {st}' for r, st in strides)}]"
      return f"(({self.ct(x.dtype)}){read})" if self.native(x.dtype) else read   # (a half staged as float: exact)
    mine = {r for r, _ in strides}
    n, t = vec.src[0].arg, self._shared_type(x.dtype)
    base = lambda: " + ".join(f"{self.ranges[r]} * {st}" for r, st in strides if r is not vec)
    return self._lane_component((x, tuple(i for r, i in zip(self.ups, self.lane) if r in mine and r is not vec)), vec,
                                "tv", lambda: f"{t}{n}", lambda: f"((__local {t}{n}*){name})[({base()}) / {n}]")

  def _row_read(self, x: UOp, name: str, strides: list) -> str | None:
    """A float block kept in rows of a sum's steps (async_rows: a matmul's A): this lane's element out of the aligned
    float4 of four neighbouring steps, read once per row (the lanes of one row share it) and picked by the step's low
    bits, which the block's unrolled loop makes constants: one 16-byte read per four steps where there were four.
    None where the block is not such rows."""
    if not (self.target.async_rows and self.target.row_vectors) or x.dtype is not dtypes.float32 or not strides: return None
    step, one = strides[-1]
    if one != 1 or step.src[0].arg % 4 or any(st % 4 for _, st in strides[:-1]): return None
    k = self.ranges[step]
    base = " + ".join(f"{self.ranges[r]} * {st}" for r, st in strides[:-1]) or "0"
    key = (x, "rows", base)
    v = self.lane_vecs.get(key)
    if v is None:
      v = self.lane_vecs[key] = self.tmp("tr")
      self.line(f"float4 {v} = *(__local float4*)({name} + {base} + ({k} & ~3));")
    return f"(({k} & 3) == 0 ? {v}.x : ({k} & 3) == 1 ? {v}.y : ({k} & 3) == 2 ? {v}.z : {v}.w)"

  def _lane_component(self, key, vec: UOp, prefix: str, vtype, load) -> str:
    """This lane's component of a vector shared by the lanes of upcast range `vec` (the other lanes' coordinates
    in `key`): loaded (`vtype()` and `load()`, as C) by the first of them to ask, into a variable the rest read."""
    name = self.lane_vecs.get(key)
    if name is None:
      name = self.lane_vecs[key] = self.tmp(prefix)
      self.line(f"{vtype()} {name} = {load()};")
    return f"{name}.s{self.lane[list(self.ups).index(vec)]:x}"

  def _group_reduce(self, u: UOp, ident: str) -> str:
    """The work-group reduces together (_group_partial); every work-item gets the result."""
    return self._acc_result(u.arg, u.dtype, f"{self._group_partial(u, ident)}[0]")

  def _group_reduces(self):
    """GROUP, SPREAD: every reduction of the kernel, before the store, sources first, by the whole work-group
    (each work-item reaches every barrier, in the same order): a reduce inside another, which depends on the
    store's ranges only (transform.py checks), is then a value the outer one's steps read. Two reduces that differ
    only in the names of their own ranges are one value (a fused softmax's row max, read twice)."""
    same: dict[UOp, UOp] = {}
    for u in self.k.ast.toposort():
      if u.op is not Ops.REDUCE: continue
      first = same.setdefault(renamed_reduce(u), u)
      self.scopes[0][u] = self.scopes[0][first] if first is not u else self._group_reduce(u, self.acc_ident(u.arg, u.dtype))

  def _group_partial(self, u: UOp, ident: str) -> str:
    """Work-item `lane` takes elements lane, lane + G, lane + 2G, ... of the flattened reduce ranges (neighbouring
    work-items read neighbouring memory when the innermost range is contiguous), into GROUP_ACCS (under GRID:
    GRID_ACCS) accumulators in turn so that many loads are in flight at once; then the G partial results are
    combined as a tree in local memory. The name of that local array (the result in [0]). Under GRID the reduce's
    first range is the work-group's number: the group's share of the reduction."""
    op, d, G = u.arg, u.dtype, self.group
    value, rngs = u.src[0], u.src[1:]
    c = self.acc_type(op, d)
    if self.row_regs is not None: return self._row_partial(u, ident)
    most = GROUP_ACCS
    if rngs and range_kind(rngs[0])[0] == "grid":
      self.ranges[rngs[0]] = "gid"
      rngs, most = rngs[1:], GRID_ACCS
    size = math.prod(r.src[0].arg for r in rngs)
    vec = group_vector(rngs[-1]) if rngs else 1   # elements per step (VECTOR after GROUP), vector loads where contiguous
    steps = size // vec
    n_acc = most if steps >= 2 * most * G else 1
    accs, i, part = [self.tmp("acc") for _ in range(n_acc)], self.tmp("i"), self.tmp("part")
    self.line(f"{c} {', '.join(f'{a} = {ident}' for a in accs)};")
    self.line(f"long {i} = lane;")
    if n_acc > 1:
      self.line(f"for (; {i} + {(n_acc - 1) * G} < {steps}L; {i} += {n_acc * G}) {{")
      self.depth += 1
      for j, a in enumerate(accs): self._group_step(op, d, a, value, rngs, i if j == 0 else f"({i} + {j * G})", size, vec)
      self.depth -= 1
      self.line("}")
    self.line(f"for (; {i} < {steps}L; {i} += {G}) {{")
    self.depth += 1
    self._group_step(op, d, accs[0], value, rngs, i, size, vec)
    self.depth -= 1
    self.line("}")
    for a in accs[1:]: self.line(f"{accs[0]} = {self._combine(op, d, accs[0], a)};")
    self.line(f"__local {self._shared_type(d, op)} {part}[{G}];")
    self._group_tree(op, d, part, accs[0])
    return part

  # *** SPREAD: the row in registers ***
  def _row_cache(self, spread: UOp) -> None:
    """SPREAD with each work-item taking at most ROW_CACHE_MAX elements of a row, and every reduction over one
    range of the row's length: each load of the row (a load that depends on one of those ranges and otherwise on
    the store's ranges only) is read once into registers, element lane + j * G in register j, before the
    reductions; the reductions' steps and the stores, unrolled, read the registers (a softmax reads its row from
    memory once, not three times)."""
    S, G = spread.src[0].arg, self.group
    reduces = [u for u in self.k.ast.toposort() if u.op is Ops.REDUCE]
    if S % G or S // G > ROW_CACHE_MAX or any(len(u.src) != 2 or u.src[1].src[0].arg != S for u in reduces): return
    rows = frozenset({spread} | {u.src[1] for u in reduces})
    fixed = frozenset(self.store_ranges) - {spread}
    canon = UOp.range(S, -1000, "loop")
    keys = []
    for x in self.k.ast.toposort():
      if x.op is not Ops.INDEX or x.arg == "store" or x.dtype is dtypes.void: continue
      f = free_ranges(x)
      if len(f & rows) == 1 and f <= rows | fixed:
        key = substitute(x, {next(iter(f & rows)): canon})
        if key not in keys: keys.append(key)
    if not keys: return
    self.row_regs, self.row_canon = {}, canon
    for j in range(S // G):
      self.scopes.append({})
      self.ranges[canon] = f"(lane + {j * G})"
      for key in keys: self.row_regs[(key, j)] = self.value(key)
      del self.ranges[canon]
      self.scopes.pop()

  def _row_loads(self, r: UOp, roots) -> dict[UOp, UOp]:
    """The loads under `roots` that the row's registers hold for row range r: {load: its canonical form}."""
    out = {}
    for root in roots:
      for x in root.toposort():
        if x.op is Ops.INDEX and x not in out and (key := substitute(x, {r: self.row_canon})) is not x and (key, 0) in self.row_regs:
          out[x] = key
    return out

  def _enter_row_element(self, r: UOp, j: int, loads: dict[UOp, UOp]) -> None:
    """A scope for element lane + j * G of row range r, its loads (_row_loads) taken from the row's registers."""
    self.scopes.append({})
    self.ranges[r] = f"(lane + {j * self.group})"
    for x, key in loads.items(): self.scopes[-1][x] = self.row_regs[(key, j)]

  def _leave_row_element(self, r: UOp) -> None:
    del self.ranges[r]
    self.scopes.pop()

  def _row_partial(self, u: UOp, ident: str) -> str:
    """_group_partial over the row's registers: each work-item's elements in turn, unrolled, into GROUP_ACCS
    accumulators; then the tree in local memory."""
    op, d, r = u.arg, u.dtype, u.src[1]
    per = r.src[0].arg // self.group
    n_acc = min(GROUP_ACCS, per)
    accs, part = [self.tmp("acc") for _ in range(n_acc)], self.tmp("part")
    self.line(f"{self.acc_type(op, d)} {', '.join(f'{a} = {ident}' for a in accs)};")
    loads = self._row_loads(r, (u.src[0],))
    for j in range(per):
      self._enter_row_element(r, j, loads)
      a = accs[j % n_acc]
      self.line(f"{a} = {self._combine(op, d, a, self.value(u.src[0]))};")
      self._leave_row_element(r)
    for a in accs[1:]: self.line(f"{accs[0]} = {self._combine(op, d, accs[0], a)};")
    self.line(f"__local {self._shared_type(d, op)} {part}[{self.group}];")
    self._group_tree(op, d, part, accs[0])
    return part

  def _shared_type(self, d: DType, op: Ops | None = None) -> str:
    """The type of d's values in local memory and in GRID's partial results: a bool as a uchar (OpenCL keeps bool
    out of memory); a half as a float (STAGE's blocks: the layout and the local-memory budget count 4-byte
    elements; a native half is read back with an exact conversion, _staged_read). `op`: a reduction's partial
    results, in its accumulator's type (acc_type: float for half sums, half for a native half max)."""
    if d.kind == "b": return "uchar"
    if op is not None: return self.acc_type(op, d)
    return "float" if d.is_half else self.ct(d)

  def _group_tree(self, op: Ops, d: DType, part: str, mine: str):
    """Each work-item's value combined as a tree in local memory: the result in part[0]."""
    self.line(f"{part}[lane] = {mine};")
    self.line("barrier(CLK_LOCAL_MEM_FENCE);")
    self.line(f"for (int s = {self.group // 2}; s > 0; s >>= 1) {{")
    self.line(f"  if (lane < s) {part}[lane] = {self._combine(op, d, f'{part}[lane]', f'{part}[lane + s]')};")
    self.line("  barrier(CLK_LOCAL_MEM_FENCE);")
    self.line("}")

  def _grid_reduces(self):
    """GRID: every reduction of the kernel, before anything reads them. Each work-group stores its partial results
    (reduction j's at j * grid + its number), then counts itself done; the last group to count (the counter reached
    grid - 1) combines each reduction's partials in index order, so the value does not depend on which group that
    is, and sets the counter back to 0 for the next launch. The other groups return: only the last goes on to what
    the kernel computes from the reductions, and stores it. The partials are read volatile (past caches that are not
    coherent across compute units), after the writers' fences."""
    n, G = self.grid, self.group
    reduces = [u for u in self.k.ast.toposort() if u.op is Ops.REDUCE]
    parts = []
    for u in reduces:
      ident = self.acc_ident(u.arg, u.dtype)
      parts.append((u, ident, self._group_partial(u, ident)))
    self.line("__local int grid_last;")
    self.line("if (lane == 0) {")
    for j, (u, _, part) in enumerate(parts):
      self.line(f"  ((__global {self._shared_type(u.dtype, u.arg)}*)grid_part)[{j * n} + gid] = {part}[0];")
    self.line("  mem_fence(CLK_GLOBAL_MEM_FENCE);")
    self.line(f"  grid_last = atomic_inc(grid_count) == {n - 1};")
    self.line("}")
    self.line("barrier(CLK_LOCAL_MEM_FENCE);")
    self.line("if (!grid_last) return;")
    self.line("mem_fence(CLK_GLOBAL_MEM_FENCE);")
    for j, (u, ident, part) in enumerate(parts):
      op, d, t = u.arg, u.dtype, self._shared_type(u.dtype, u.arg)
      acc = self.tmp("acc")
      self.line(f"{self.acc_type(op, d)} {acc} = {ident};")
      self.line(f"for (int j = lane; j < {n}; j += {G}) "
                f"{acc} = {self._combine(op, d, acc, f'((volatile __global {t}*)grid_part)[{j * n} + j]')};")
      self.line("barrier(CLK_LOCAL_MEM_FENCE);")   # (every work-item has read the part array's last result)
      self._group_tree(op, d, part, acc)
      self.scopes[0][u] = self._acc_result(op, d, f"{part}[0]")
    self.line("if (lane == 0) *grid_count = 0;")
    self.grid_slots = len(parts)

  def _group_step(self, op: Ops, d: DType, acc: str, value: UOp, rngs, step: str, size: int, vec: int = 1):
    """acc combined with the reduce's values at flat indices step * vec + 0 .. vec - 1 of its ranges (in a scope of
    its own). With vec > 1 the innermost range's size is a multiple of vec, so the vec elements share every outer
    range, and a load contiguous in the innermost range is one vector load whose components the elements take."""
    self.line("{")
    self.depth += 1
    self.scopes.append({})
    self.group_loads, self.group_vec_n, self.group_inner = ({} if vec > 1 else None), vec, rngs[-1]
    for lane in range(vec):
      flat = step if vec == 1 else f"({step} * {vec}L + {lane})"
      self.group_lane = lane
      self.scopes.append({})
      stride = size
      for r in rngs:
        n = r.src[0].arg
        stride //= n
        e = flat if stride == 1 else f"({flat} / {stride}L)"
        if stride * n != size: e = f"({e} % {n}L)"
        v = self.tmp("r")
        self.line(f"{self.ct(r.dtype)} {v} = ({self.ct(r.dtype)}){e};")
        self.ranges[r] = v
      self.line(f"{acc} = {self._combine(op, d, acc, self.value(value))};")
      for r in rngs: del self.ranges[r]
      self.scopes.pop()
    self.group_loads = None
    self.scopes.pop()
    self.depth -= 1
    self.line("}")

  def _aligned(self, p: UOp, t: str, n: int) -> str:
    """The buffer as n-vectors: element i of it is elements n*i .. n*i + n - 1. A buffer's memory is a whole
    device allocation (CL_DEVICE_MEM_BASE_ADDR_ALIGN, at least 128 bytes on every device seen), so the vector
    loads and stores are aligned: on an H200 vloadN, which may assume only element alignment, ran the elementwise
    workload at 0.74 of a float4 copy where typed vector loads ran at 1.1 (bench/cl_bandwidth_probe.py)."""
    const = "" if p.arg[0] in self.k.outputs else "const "
    return f"((__global {const}{t}{n}*){self.ptrs[p]})"

  def _lane_vector_load(self, u: UOp) -> str | None:
    """In a register tile's loop body: when u's index is (terms without r, all multiples of n) + r for an upcast
    range r of n lanes (B's row in a matmul: n neighbouring columns), the n lanes' loads are one aligned n-vector
    load, made by the first lane to ask, each lane taking its component: one load instruction where there were n
    (a GPU's tile kernel issues fewer loads per FMA)."""
    if self.lane_vecs is None or u.arg is not None or u.dtype not in VECTOR_DTYPES: return None
    for pos, (r, n) in enumerate(self.ups.items()):
      if n not in VECTOR_WIDTHS or (start := offset_of(u.src[1], r)) is None or not multiple_of(start, n): continue
      t = memtype(u.dtype, self.target)   # (the start: the index at r = 0, the same for all of r's lanes)
      return self.let(u.dtype, self._lane_component((u, self.lane[:pos] + self.lane[pos + 1:]), r, "lv", lambda: f"{t}{n}",
                                                    lambda: f"{self._aligned(u.src[0], t, n)}[({self.value(start)}) / {n}]"))
    return None

  def _group_vector_load(self, u: UOp) -> str | None:
    """In a vector group step: element `group_lane` of the vector load u starts at lane 0 (None: u is no such load)."""
    if self.group_loads is None or (offset := contiguous_offset(u, self.group_inner)) is None: return None
    name = self.group_loads.get(u)
    if name is None:   # (lane 0 comes first: its index is the vector's first element)
      p, idx = u.src
      name = self.group_loads[u] = self.tmp("gl")
      t, n = memtype(u.dtype, self.target), self.group_vec_n
      start = self.value(idx)
      if multiple_of(offset, n):   # (and lane 0's innermost index is one): the vector's first element is aligned
        self.line(f"{t}{n} {name} = {self._aligned(p, t, n)}[({start}) / {n}];")
      else: self.line(f"{t}{n} {name} = vload{n}(0, {self.ptrs[p]} + {start});")
    return self.let(u.dtype, f"{name}.s{self.group_lane:x}")


def render(kernel: Kernel, target: Target = Target(), name: str = KERNEL_NAME, vars=None) -> Rendered:
  """The kernel (decomposed) as OpenCL C, with the number of work-items to launch. vars: the variables the kernel
  takes as `long` arguments after its buffers, in launch order (the kernel's own `vars` when None)."""
  return CLRenderer(kernel, target, name, vars).render()


__all__ = ["Target", "Rendered", "CLRenderer", "render", "ctype", "memtype", "KERNEL_NAME"]
