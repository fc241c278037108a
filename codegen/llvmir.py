"""A kernel as LLVM IR (llvmlite.ir).

The kernel's decompositions (rules/decomp.rules) have run first, so every op
here maps to a few LLVM instructions. Loops come from the store's END ranges
and each REDUCE's ranges; a REDUCE keeps its accumulator in an alloca that
LLVM's mem2reg turns into a register. Values are emitted where first needed,
inside the innermost open loop; LLVM's loop-invariant code motion hoists what
does not depend on it.

The function is `void kernel(ptr p0, ..., ptr pN, i64 v0, ..., i64 vM, i64 start, i64 end)`: one i64 per
variable of the kernel (DEFINE_VAR, in `Kernel.vars` order, named by position: a variable's name is never
printed), then the store range the optimizer marked `thread` runs over [start, end), so the
runtime can split it across threads.

The optimizer (codegen/opt) has already split and marked the ranges; this file
follows the marks. An `upcast` store range is lanes, not a loop: each lane's
value is emitted side by side in the loop body, with a scope of its own (a
value that depends on the ranges differs per lane), and every REDUCE computes
all lanes' results in one loop nest (a register tile: 8 rows x 16 columns of
accumulators for matmul); a sum of products fuses into fma (`contract`). That
loop carries `llvm.loop.vectorize.enable false`, so LLVM's SLP vectoriser packs
the lanes into vector loads and arithmetic instead of the loop vectoriser
gathering along the reduction. The `thread` range runs over [start, end); a
`serial` range is an ordinary loop (KBLOCK puts it outside the others).

float16 never reaches LLVM as `half`: a float16 value is its 16 bits (i16),
arithmetic runs in float and rounds each result back, as numpy's float16 ufuncs
do, and the conversions are integer code of our own (`_define_to_half`,
`_define_from_half`), the same on every CPU. LLVM would lower `half` operations
on CPUs without native conversions (no F16C; double -> half on any x86 without
AVX512-FP16) into calls to compiler-rt routines (`__truncdfhf2`,
`__extendhfsf2`, ...) that the JIT cannot resolve: calls to address 0.

bfloat16 is held and computed the same way (its bits in an i16, `DType.is_half`),
with conversions of its own (`_define_from_bfloat16`, `_define_to_bfloat16`):
not LLVM's `bfloat`, whose conversions would again be runtime routines or
instructions (AVX512-BF16) that only some CPUs have. Every 2-byte float goes
through the same code paths below; only the conversions differ by dtype.
"""
from __future__ import annotations

import math
import re
import struct

import numpy as np
from llvmlite import ir

from rulec.codegen.opt.transform import else_zero, prefetch_ahead, range_kind, renamed_reduce
from rulec.codegen.scoped import ScopedEmitter
from rulec.engine.ir.dtypes import DType, dtypes, np_dtype_named
from rulec.engine.ir.ops import MAY_FUSE, TRANSCENDENTAL, Ops
from rulec.engine.ir.rewrite import substitute
from rulec.engine.ir.alu import identity_element
from rulec.engine.ir.uop import UOp
from rulec.engine.ir.kernel import Kernel

_I1, _I8, _I16, _I32, _I64 = ir.IntType(1), ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
_F32, _F64 = ir.FloatType(), ir.DoubleType()
_LIBM = {Ops.EXP2: "llvm.exp2", Ops.LOG2: "llvm.log2", Ops.SIN: "llvm.sin", Ops.POW: "llvm.pow"}   # calls into libm


def lltype(d: DType) -> ir.Type:
  if d.kind == "b": return _I1
  if d.kind in "iux": return ir.IntType(d.bits)
  if d.is_half: return _I16   # float16 and bfloat16: their bits (see the module docstring)
  if d is dtypes.float32: return _F32
  if d is dtypes.float64: return _F64
  raise NotImplementedError(f"the CPU backend does not support {d}")


def memtype(d: DType) -> ir.Type:
  return _I8 if d.kind == "b" else lltype(d)


# *** float16 conversions in integer arithmetic (see the module docstring) ***

def _bits_of(x: float, nbits: int) -> int:
  return struct.unpack("<I" if nbits == 32 else "<Q", struct.pack("<f" if nbits == 32 else "<d", x))[0]


def _define_to_half(module: ir.Module, name: str, fty: ir.Type) -> ir.Function:
  """`i16 name(float or double)`: the argument rounded once to float16 (to nearest, ties to even) with integer
  ops only; subnormal results, overflow to inf, NaN and signed zero come out bit for bit as numpy's do."""
  nbits, mbits, bias = (32, 23, 127) if fty == _F32 else (64, 52, 1023)
  it = ir.IntType(nbits)
  fn = ir.Function(module, ir.FunctionType(_I16, [fty]), name=name)
  fn.linkage = "internal"
  fn.attributes.add("alwaysinline")
  b = ir.IRBuilder(fn.append_basic_block())
  c = lambda v: ir.Constant(it, v)
  x = b.bitcast(fn.args[0], it)
  sign = b.and_(b.lshr(x, c(nbits - 16)), c(0x8000))
  a = b.and_(x, c((1 << (nbits - 1)) - 1))
  drop = mbits - 10   # mantissa bits float16 lacks

  def rne_shift(v, n):   # v >> n, rounding to nearest with ties to even
    return b.lshr(b.add(b.add(v, b.sub(b.shl(c(1), b.sub(n, c(1))), c(1))), b.and_(b.lshr(v, n), c(1))), n)

  # normal results: rebias the exponent; a mantissa that rounds up carries into it (up to 0x7bff here)
  normal = rne_shift(b.sub(a, c((bias - 15) << mbits)), c(drop))
  # subnormal results: the value in units of 2**-24, rounded; the shift is capped where everything rounds to 0
  mant = b.or_(b.and_(a, c((1 << mbits) - 1)), c(1 << mbits))
  shift = b.sub(c(bias + mbits - 24), b.lshr(a, c(mbits)))
  cap = c(mbits + 2)
  shift = b.select(b.icmp_unsigned("<", shift, cap), shift, cap)   # unsigned: a negative shift is capped too
  sub = rne_shift(mant, shift)
  # NaN keeps the top of its payload, as numpy's conversion does, and stays a NaN when that part is all zero
  payload = b.and_(b.lshr(a, c(drop)), c(0x3ff))
  nan = b.or_(c(0x7c00), b.select(b.icmp_unsigned("==", payload, c(0)), c(1), payload))
  inf = c(((1 << (nbits - 1 - mbits)) - 1) << mbits)   # the all-ones exponent
  h = b.select(b.icmp_unsigned("<", a, c(_bits_of(2.0 ** -14, nbits))), sub, normal)
  h = b.select(b.icmp_unsigned(">=", a, c(_bits_of(65520.0, nbits))), c(0x7c00), h)   # 65520 ties to inf (even)
  h = b.select(b.icmp_unsigned(">", a, inf), nan, h)
  b.ret(b.trunc(b.or_(h, sign), _I16))
  return fn


def _define_from_half(module: ir.Module, name: str, fty: ir.Type) -> ir.Function:
  """`float or double name(i16)`: the value a float16's bits stand for (exact; a NaN's payload is kept, a
  signalling NaN stays one, as numpy's conversions do, where a hardware float -> double would quiet it)."""
  nbits, mbits, bias = (32, 23, 127) if fty == _F32 else (64, 52, 1023)
  it = ir.IntType(nbits)
  fn = ir.Function(module, ir.FunctionType(fty, [_I16]), name=name)
  fn.linkage = "internal"
  fn.attributes.add("alwaysinline")
  b = ir.IRBuilder(fn.append_basic_block())
  c = lambda v: ir.Constant(it, v)
  x = b.zext(fn.args[0], it)
  e, m = b.and_(b.lshr(x, c(10)), c(0x1f)), b.and_(x, c(0x3ff))
  normal = b.add(b.shl(b.and_(x, c(0x7fff)), c(mbits - 10)), c((bias - 15) << mbits))
  special = b.or_(b.shl(m, c(mbits - 10)), c(((1 << (nbits - 1 - mbits)) - 1) << mbits))   # inf and NaN
  # zero and subnormals: m * 2**-24 is exact, and takes no subnormal operand
  small = b.bitcast(b.fmul(b.uitofp(m, fty), ir.Constant(fty, 2.0 ** -24)), it)
  r = b.select(b.icmp_unsigned("==", e, c(0)), small, b.select(b.icmp_unsigned("==", e, c(0x1f)), special, normal))
  b.ret(b.bitcast(b.or_(r, b.shl(b.and_(x, c(0x8000)), c(nbits - 16))), fty))
  return fn


# *** bfloat16 conversions in integer arithmetic: ml_dtypes' results (what the NUMPY device computes), bit for bit ***

def _f32_to_bfloat16_bits(b: ir.IRBuilder, u):
  """i16 bfloat16 bits of the float32 whose bits are the i32 u: to nearest, ties to even, on the bits (a carry out of
  the mantissa moves the exponent up, and past the largest finite value to inf; subnormals round the same way). A NaN
  becomes ml_dtypes' quiet NaN with the sign kept and the payload dropped: numpy's float16 conversion keeps the
  payload's top bits, ml_dtypes does not."""
  c = lambda v: ir.Constant(_I32, v)
  sign = b.and_(b.lshr(u, c(16)), c(0x8000))
  rounded = b.lshr(b.add(b.add(u, c(0x7fff)), b.and_(b.lshr(u, c(16)), c(1))), c(16))
  nan = b.icmp_unsigned(">", b.and_(u, c(0x7fffffff)), c(0x7f800000))
  return b.trunc(b.select(nan, b.or_(sign, c(0x7fc0)), rounded), _I16)


def _define_to_bfloat16(module: ir.Module, name: str, fty: ir.Type) -> ir.Function:
  """`i16 name(float or double)`: the argument rounded once to bfloat16. A double is first rounded to float32 *to
  odd* (truncated, with the lowest bit set where anything was dropped): float32 keeps 16 more bits than bfloat16, so
  the second rounding, to nearest even, gives what rounding the double directly would (1 + 2**-8 + 2**-30 is 0x3f81,
  where rounding to nearest float32 first would land on the tie and give 0x3f80)."""
  fn = ir.Function(module, ir.FunctionType(_I16, [fty]), name=name)
  fn.linkage = "internal"
  fn.attributes.add("alwaysinline")
  b = ir.IRBuilder(fn.append_basic_block())
  x = fn.args[0]
  if fty == _F32:
    b.ret(_f32_to_bfloat16_bits(b, b.bitcast(x, _I32)))
    return fn
  c = lambda v: ir.Constant(_I32, v)
  f = b.fptrunc(x, _F32)
  back = b.fpext(f, _F64)
  u = b.bitcast(f, _I32)
  # float32's rounding went away from zero (past the largest finite: to inf): one step back toward zero on the
  # magnitude bits, which the sign does not touch (toward zero never crosses it: |d| > 0 there)
  fabs = lambda v: b.call(module.declare_intrinsic("llvm.fabs", [_F64]), [v])
  u = b.select(b.fcmp_ordered(">", fabs(back), fabs(x)), b.sub(u, c(1)), u)
  u = b.select(b.fcmp_ordered("!=", back, x), b.or_(u, c(1)), u)   # inexact: the sticky bit
  # a NaN double: its sign on the quiet NaN (the float32 from fptrunc is a NaN too; its sign is the double's)
  nan = b.fcmp_unordered("!=", x, x)
  sign = b.trunc(b.lshr(b.bitcast(x, _I64), ir.Constant(_I64, 48)), _I16)
  sign = b.and_(sign, ir.Constant(_I16, 0x8000))
  b.ret(b.select(nan, b.or_(sign, ir.Constant(_I16, 0x7fc0)), _f32_to_bfloat16_bits(b, u)))
  return fn


def _define_from_bfloat16(module: ir.Module, name: str, fty: ir.Type) -> ir.Function:
  """`float or double name(i16)`: the value of a bfloat16's bits, exact (the top half of a float32; a NaN keeps its
  payload in float32, as ml_dtypes' conversion does; to double through that float, as ml_dtypes converts too)."""
  fn = ir.Function(module, ir.FunctionType(fty, [_I16]), name=name)
  fn.linkage = "internal"
  fn.attributes.add("alwaysinline")
  b = ir.IRBuilder(fn.append_basic_block())
  f = b.bitcast(b.shl(b.zext(fn.args[0], _I32), ir.Constant(_I32, 16)), _F32)
  b.ret(f if fty == _F32 else b.fpext(f, _F64))
  return fn


# conversion function names by half dtype: (bits -> float, bits -> double, float -> bits, double -> bits)
_HALF_FNS = {"float16": ("rulec.h2f", "rulec.h2d", "rulec.f2h", "rulec.d2h"),
             "bfloat16": ("rulec.b2f", "rulec.b2d", "rulec.f2b", "rulec.d2b")}
_HALF_DEFS = {"rulec.h2f": (_define_from_half, _F32), "rulec.h2d": (_define_from_half, _F64),
              "rulec.f2h": (_define_to_half, _F32), "rulec.d2h": (_define_to_half, _F64),
              "rulec.b2f": (_define_from_bfloat16, _F32), "rulec.b2d": (_define_from_bfloat16, _F64),
              "rulec.f2b": (_define_to_bfloat16, _F32), "rulec.d2b": (_define_to_bfloat16, _F64)}
_ONE_BITS = {"float16": 0x3c00, "bfloat16": 0x3f80}


def _half_bits(v: float, d: DType = dtypes.float16) -> int:
  """The bits of v rounded once to the 2-byte float d (bfloat16: ml_dtypes', engine/ir/dtypes.py np_dtype_named)."""
  with np.errstate(over="ignore", invalid="ignore"):
    return int(np.array(v, np.float64).astype(np_dtype_named(d.np_name)).view(np.uint16))


class _Loop:
  def __init__(self, r: UOp, var, header, body, exit_):
    self.r, self.var, self.header, self.body, self.exit = r, var, header, body, exit_


class LLVMRenderer(ScopedEmitter):
  def __init__(self, kernel: Kernel, name: str = "kernel", vars=None):
    self.k = kernel
    self.module = ir.Module(name="rulec")
    params = sorted({u for u in kernel.ast.toposort() if u.op is Ops.PARAM}, key=lambda p: p.arg[0])
    self.nbufs = len(kernel.bufs)
    self.vars = tuple(kernel.vars if vars is None else vars)
    nvars = len(self.vars)
    ftype = ir.FunctionType(ir.VoidType(), [ir.PointerType()] * self.nbufs + [_I64] * nvars + [_I64, _I64])
    self.fn = ir.Function(self.module, ftype, name=name)
    for i, a in enumerate(self.fn.args[:self.nbufs]):
      a.name = f"p{i}"
      a.add_attribute("noalias")
    # a variable's value, by position (its name is text from user code, never printed)
    self.var_args = {v: self.fn.args[self.nbufs + i] for i, v in enumerate(self.vars)}
    for i, v in enumerate(self.vars): self.var_args[v].name = f"v{i}"
    self.start, self.end = self.fn.args[self.nbufs + nvars], self.fn.args[self.nbufs + nvars + 1]
    self.entry = self.fn.append_basic_block("entry")
    self.b = ir.IRBuilder(self.entry)
    self.ptrs = {p: self.fn.args[p.arg[0]] for p in params}
    self.scopes: list[dict[UOp, ir.Value]] = [{}]
    self.ranges: dict[UOp, ir.Value] = {}
    self.split_range: UOp | None = None
    self.set_lanes({})   # the upcast ranges are found in render (rulec.codegen.scoped: lanes)
    self._novec_md = None
    self._half_fns: dict[str, ir.Function] = {}

  # *** loops ***
  def open_loop(self, r: UOp, lo=None, hi=None) -> _Loop:
    if hi is None and range_kind(r)[0] == "partial":   # KBLOCK's steps in a block: the last block is shorter
      _, total, block_axis, *_ = r.arg[1].split(":")
      block = next(v for u, v in self.ranges.items() if u.arg[0] == int(block_axis))
      left = self.b.sub(ir.Constant(_I64, int(total)), self.b.mul(block, ir.Constant(_I64, r.src[0].arg)))
      hi = self.b.select(self.b.icmp_signed("<", left, ir.Constant(_I64, r.src[0].arg)), left, ir.Constant(_I64, r.src[0].arg))
    var = self._alloca(_I64, f"i{r.arg[0]}")
    self.b.store(lo if lo is not None else ir.Constant(_I64, 0), var)
    header = self.fn.append_basic_block(f"r{r.arg[0]}_head")
    body = self.fn.append_basic_block(f"r{r.arg[0]}_body")
    exit_ = self.fn.append_basic_block(f"r{r.arg[0]}_exit")
    self.b.branch(header)
    self.b.position_at_end(header)
    i = self.b.load(var)
    bound = hi if hi is not None else ir.Constant(_I64, r.src[0].arg)
    self.b.cbranch(self.b.icmp_signed("<", i, bound), body, exit_)
    self.b.position_at_end(body)
    self.ranges[r] = self.b.load(var, name=f"r{r.arg[0]}")
    self.scopes.append({})
    return _Loop(r, var, header, body, exit_)

  def close_loop(self, lp: _Loop, no_vectorize: bool = False):
    i = self.b.load(lp.var)
    self.b.store(self.b.add(i, ir.Constant(_I64, 1)), lp.var)
    br = self.b.branch(lp.header)
    if no_vectorize: br.set_metadata(_NOVEC_TAG, self._novec())
    self.b.position_at_end(lp.exit)
    self.scopes.pop()
    del self.ranges[lp.r]

  def _novec(self):
    if self._novec_md is None:
      self._novec_md = self.module.add_metadata([ir.MetaDataString(self.module, "llvm.loop.vectorize.enable"), _I1(0)])
    return self._novec_md

  # *** float16 and bfloat16: bits in an i16, computed in float ***
  def _half_fn(self, name: str) -> ir.Function:
    fn = self._half_fns.get(name)
    if fn is None:
      define, fty = _HALF_DEFS[name]
      fn = self._half_fns[name] = define(self.module, name, fty)
    return fn

  def _h2f(self, v, hd: DType, fty=None):
    """The bits of the 2-byte float hd as a float (or as a double: fty)."""
    return self.b.call(self._half_fn(_HALF_FNS[hd.name][1 if fty == _F64 else 0]), [v])

  def _to_half(self, v, hd: DType):
    """A float or double rounded to the bits of the 2-byte float hd."""
    return self.b.call(self._half_fn(_HALF_FNS[hd.name][2 if v.type == _F32 else 3]), [v])

  def _round_half(self, v, hd: DType):
    """A float rounded to hd's precision, still a float: an intermediate result numpy rounds."""
    return self._h2f(self._to_half(v, hd), hd)

  def _half_alu(self, op: Ops, sd: DType, d: DType, s: list):
    """An op on operands of the 2-byte float sd as numpy (and alu.half_alu) computes it: in float, each result
    rounded once to sd (d is sd, or bool for a comparison)."""
    # float16's negation is its sign bit alone (numpy's float16 keeps a NaN's payload); bfloat16's goes through
    # float like the rest, since ml_dtypes rounds a NaN result to its one quiet NaN
    if op is Ops.NEG and sd is dtypes.float16: return self.b.xor(s[0], ir.Constant(_I16, 0x8000))
    x = [self._h2f(v, sd) for v in s]
    f32, rnd = dtypes.float32, lambda v: self._round_half(v, sd)
    if op is Ops.MULACC: r = self.b.fadd(rnd(self.b.fmul(x[0], x[1])), x[2])
    elif op is Ops.IDIV: r = self._floor_div(x[0], x[1], rnd)
    else: r = self.alu(op, f32, f32 if d.is_half else d, x)
    return self._to_half(r, d) if d.is_half else r

  def _alloca(self, ty, name):
    with self.b.goto_block(self.entry):
      self.b.position_at_start(self.entry)
      return self.b.alloca(ty, name=name)

  # *** the kernel ***
  def render(self) -> str:
    stores = [s for s in self.k.ast.src]
    # the optimizer's marks (codegen/opt): upcast ranges are lanes, a thread range runs over [start, end)
    ups: dict[UOp, int] = {}
    for st in stores:
      for r in (st.src[1:] if st.op is Ops.END else ()):
        kind = range_kind(r)[0]
        if kind == "upcast": ups[r] = r.src[0].arg
        elif kind == "thread": self.split_range = r
        elif kind not in ("loop", "serial"): raise ValueError(f"the CPU renderer cannot follow a {r.arg[1]} range (r{r.arg[0]})")
    if ups and len(stores) != 1: raise ValueError("upcast lanes need a kernel with one store")
    self.set_lanes(ups)
    self._simd = any(u.op is Ops.RANGE and range_kind(u)[0] == "simd" for u in self.k.ast.toposort())
    # a reduce that depends on no loop around it (a whole-tensor max under the loop that compares with it) is
    # computed once, before any loop, instead of once per iteration of loops it does not depend on
    levels = _reduce_levels(self.k.ast)
    self._same_reduce: dict = {}
    for r in levels.get(None, ()): self._hoisted(r)
    for st in stores:
      loops = []
      if st.op is Ops.END:
        for r in st.src[1:]:
          if r in self.ups: continue
          loops.append(self.open_loop(r, self.start, self.end) if r is self.split_range else self.open_loop(r))
          # a reduce that depends on this loop and on none opened later (a softmax row's max and sum, hoisted into
          # the kernel that reads them per element: rules/fusion.rules hoist_row_reduce) once per iteration of it
          for red in levels.get(r, ()): self._hoisted(red)
        st = st.src[0]
      target, value = st.src
      p, idx = target.src
      if self._uniform_select(value):
        self._branched_store(p, idx, value)
      elif (vec := self._lanes_as_vector(value)) is not None:
        for i, _ in enumerate(self.each_lane()):
          self._store(p, self.value(idx), self.b.extract_element(vec, _I32(i)), value.dtype)
      else:
        for _ in self.each_lane():
          v = self.value(value)
          self._store(p, self.value(idx), v, value.dtype)
      for lp in reversed(loops): self.close_loop(lp)
    self.b.ret_void()
    return _with_loop_metadata(str(self.module))

  def lane_value(self, i: int): return ir.Constant(_I64, i)

  def _uniform_select(self, value: UOp) -> bool:
    """value is WHERE(c, a, b) whose c is the same for every lane (it reads no upcast range, no buffer and no
    reduce: KBLOCK's `not the last block`) and a side of which computes a transcendental (gelu's exp after a blocked
    matmul): worth a branch around all lanes' stores, so only the side taken is computed."""
    if value.op is not Ops.WHERE: return False
    cond = value.src[0].toposort()
    if any(u.op in (Ops.INDEX, Ops.REDUCE) or u in self.ups for u in cond): return False
    return any(u.op in TRANSCENDENTAL for side in value.src[1:] for u in side.toposort())

  def _branched_store(self, p: UOp, idx: UOp, value: UOp) -> None:
    """Every lane's store of WHERE(c, a, b) as a branch on c: each side stores all lanes (so the SLP vectoriser
    still packs them), the reduces the sides share computed once before it."""
    for red in dict.fromkeys(u for u in value.toposort() if u.op is Ops.REDUCE): self.every_lanes_reduce(red)
    cond = self.value(value.src[0])
    taken, other = self.fn.append_basic_block("uniform_taken"), self.fn.append_basic_block("uniform_other")
    join = self.fn.append_basic_block("uniform_join")
    self.b.cbranch(cond, taken, other)
    for block, side in ((taken, value.src[1]), (other, value.src[2])):
      self.b.position_at_end(block)
      self.scopes.append({})   # (what one side computes is not visible on the other, nor after the join)
      for _ in self.each_lane(): self._store(p, self.value(idx), self.value(side), value.dtype)
      self.scopes.pop()
      self.b.branch(join)
    self.b.position_at_end(join)

  def _lanes_as_vector(self, value: UOp):
    """The stored value of every lane as one vector (lane i in element i), where a SIMD sum's tile (x @ W.T's 4 x 4
    dot tile) has a long elementwise epilogue: the lanes' sums and loads are gathered into vectors and the epilogue
    runs on them, where the SLP vectoriser packed only the lanes whose loads and stores neighbour each other (4 of
    the tile's 16: GPT-2's MLP backward, x @ W.T with gelu's derivative after it, 20 -> 12 ms on 16-lane registers).
    None where that is not the kernel, or the epilogue holds an op outside VECTOR_EPILOGUE_OPS or a half type."""
    n = len(self.lanes)
    if not self.ups or not 2 <= n <= VECTOR_EPILOGUE_MAX_LANES or not self._simd: return None
    leaves, inner, uniform = _epilogue_parts(value, set(self.ups))
    if len(inner) < VECTOR_EPILOGUE_MIN_OPS: return None
    if any((u.op not in VECTOR_EPILOGUE_OPS and not (u.op is Ops.CAST and _vector_cast(u.src[0].dtype, u.dtype)))
           or (u.op in (Ops.NEG, Ops.MULACC) and u.dtype.kind != "f") for u in inner): return None
    if any(u.dtype.is_half for u in leaves + inner + uniform): return None
    b, got = self.b, {}
    def vty(d: DType): return ir.VectorType(lltype(d), n)
    self.enter_lane(self.lanes[0])   # (a uniform value may hold a sum, which is computed from inside a lane)
    for u in uniform: got[u] = self._splat(self.value(u), n)
    self.scopes.pop()
    for u in leaves:   # (a REDUCE or a load: each lane's own scalar, gathered)
      v = ir.Constant(vty(u.dtype), None)
      for i, _ in enumerate(self.each_lane()): v = b.insert_element(v, self.value(u), _I32(i))
      got[u] = v
    for u in inner:   # (in toposort order: every source is in got)
      d, srcs = u.dtype, [got[x] for x in u.src]
      if u.op is Ops.WHERE: got[u] = b.select(*srcs)
      elif u.op is Ops.BITCAST: got[u] = b.bitcast(srcs[0], vty(d))
      elif u.op is Ops.RECIPROCAL: got[u] = b.fdiv(ir.Constant(vty(d), [1.0] * n), srcs[0])
      elif u.op is Ops.MULACC and u.arg == MAY_FUSE: got[u] = self._intrinsic("llvm.fma", srcs)
      elif u.op is Ops.CAST: got[u] = getattr(b, _vector_cast(u.src[0].dtype, d))(srcs[0], vty(d))
      else: got[u] = self.alu(u.op, u.src[0].dtype, d, srcs)
    return got[value]

  def _splat(self, x, width: int):
    """A vector of `width` copies of the scalar x."""
    one = ir.VectorType(x.type, 1)
    return self.b.shuffle_vector(self.b.insert_element(ir.Constant(one, None), x, _I32(0)), ir.Constant(one, None),
                                 ir.Constant(ir.VectorType(_I32, width), [0] * width))

  def _hoisted(self, red: UOp) -> None:
    """A hoisted reduce's value in the current scope: an earlier one that differs only in the names of its own
    ranges (a fused softmax reads its row max in the sum and in the quotient, each with ranges of its own) is the
    same value, computed once."""
    same = self._same_reduce.setdefault(renamed_reduce(red), red)
    got = self.lookup(same) if same is not red else None
    if got is None:   # (it depends on no upcast range: one value for every lane, computed outside them)
      ups, self.ups = self.ups, {}
      got = self.value(red)
      self.ups = ups
    self.scopes[-1][red] = got

  def _store(self, p: UOp, idx, v, d: DType):
    ptr = self.b.gep(self.ptrs[p], [idx], inbounds=True, source_etype=memtype(d))
    if d.kind == "b": v = self.b.zext(v, _I8)
    self.b.store(v, ptr)

  # *** one node ***
  def emit(self, u: UOp):
    op, d, b = u.op, u.dtype, self.b
    if op is Ops.CONST: return self.const(u.arg, d)
    if op is Ops.RANGE:
      if u not in self.ranges: raise ValueError(f"range r{u.arg[0]} used outside its loop")
      return self.ranges[u]
    if op is Ops.DEFINE_VAR:   # the i64 argument, narrowed to the variable's type (its value fits: checked at launch)
      a = self.var_args.get(u)
      if a is None: raise ValueError("a DEFINE_VAR the program takes no argument for")
      to = lltype(d)
      return a if to.width == 64 else b.trunc(a, to)
    if op is Ops.INDEX:
      p, idx = u.src
      ptr = b.gep(self.ptrs[p], [self.value(idx)], inbounds=True, source_etype=memtype(d))
      v = b.load(ptr, typ=memtype(d))
      return b.trunc(v, _I1) if d.kind == "b" else v
    if op is Ops.REDUCE: return self.reduce(u)
    srcs = [self.lookup(s) for s in u.src]
    if op is Ops.CAST: return self.cast(srcs[0], u.src[0].dtype, d)
    if op is Ops.BITCAST: return srcs[0] if srcs[0].type == lltype(d) else b.bitcast(srcs[0], lltype(d))
    if op is Ops.WHERE: return b.select(srcs[0], srcs[1], srcs[2])
    sd = u.src[0].dtype
    if op is Ops.MULACC and u.arg == MAY_FUSE and sd.kind == "f" and not sd.is_half:
      # one rounding, always (rules/decomp.rules keeps the mark only for a target with FMA): LLVM folds llvm.fma of
      # constants fused too, where `contract` would fold unfused what the CPU then runs fused
      return self._intrinsic("llvm.fma", srcs)
    return self.alu(op, sd, d, srcs)

  def const(self, v, d: DType):
    if d.is_half: return ir.Constant(_I16, _half_bits(float(v), d))
    if d.kind == "f":
      if math.isnan(v) or math.isinf(v): return ir.Constant(lltype(d), v)
      return ir.Constant(lltype(d), float(v))
    return ir.Constant(lltype(d), int(v))

  def alu(self, op: Ops, sd: DType, d: DType, s: list):
    if sd.is_half: return self._half_alu(op, sd, d, s)
    b, fl, uns = self.b, sd.kind == "f", sd.kind in "ub"
    if sd.kind == "b" and op in (Ops.ADD, Ops.MAX): return b.or_(*s)    # bools saturate: + is or, * is and
    if sd.kind == "b" and op is Ops.MUL: return b.and_(*s)
    if op is Ops.ADD: return b.fadd(*s) if fl else b.add(*s)
    if op is Ops.SUB: return b.fsub(*s) if fl else b.sub(*s)
    if op is Ops.MUL: return b.fmul(*s) if fl else b.mul(*s)
    if op is Ops.FDIV: return b.fdiv(*s)
    if op is Ops.NEG: return b.fneg(s[0]) if fl else b.sub(ir.Constant(s[0].type, 0), s[0])
    if op is Ops.MAX:  # b if b > a else a: the first operand survives a NaN second, as in engine/ir/alu.py
      gt = b.fcmp_ordered(">", s[1], s[0]) if fl else (b.icmp_unsigned if uns else b.icmp_signed)(">", s[1], s[0])
      return b.select(gt, s[1], s[0])
    if op is Ops.CMPLT:
      return b.fcmp_ordered("<", *s) if fl else (b.icmp_unsigned if uns else b.icmp_signed)("<", *s)
    if op is Ops.CMPNE: return b.fcmp_unordered("!=", *s) if fl else b.icmp_unsigned("!=", *s)
    if op is Ops.CMPEQ: return b.fcmp_ordered("==", *s) if fl else b.icmp_unsigned("==", *s)
    if op is Ops.AND: return b.and_(*s)
    if op is Ops.OR: return b.or_(*s)
    if op is Ops.XOR: return b.xor(*s)
    # integer division and shifts arrive guarded (rules/decomp.rules): their operands are ones LLVM defines
    if op is Ops.CDIV: return (b.udiv if uns else b.sdiv)(*s)
    if op is Ops.CMOD: return b.frem(*s) if fl else (b.urem if uns else b.srem)(*s)
    if op is Ops.IDIV and fl: return self._floor_div(s[0], s[1])
    if op is Ops.SHL: return b.shl(*s)
    if op is Ops.SHR: return (b.lshr if uns else b.ashr)(*s)
    if op is Ops.SQRT: return self._intrinsic("llvm.sqrt", s)
    if op in _LIBM and s[0].type == _F32:
      # float32 through libm's float64 function, rounded once: LLVM folds a call on constants with the host's
      # float64 function and rounds that, so the CPU must run the same, or a constant would differ from the same
      # value in a buffer (sinf and powf are not always the float64 result rounded)
      return b.fptrunc(self._intrinsic(_LIBM[op], [b.fpext(v, _F64) for v in s]), _F32)
    if op is Ops.EXP2: return self._intrinsic("llvm.exp2", s)
    if op is Ops.LOG2: return self._intrinsic("llvm.log2", s)
    if op is Ops.SIN: return self._intrinsic("llvm.sin", s)
    if op is Ops.TRUNC:   # + 0.0: never -0.0, as engine/ir/alu.py (and the NUMPY and CL devices) give it
      return b.fadd(self._intrinsic("llvm.trunc", s), ir.Constant(s[0].type, 0.0))
    if op is Ops.RECIPROCAL: return b.fdiv(ir.Constant(s[0].type, 1.0), s[0])
    if op is Ops.POW: return self._intrinsic("llvm.pow", s) if fl else self._int_pow(s[0], s[1], uns)
    if op is Ops.MULACC: return b.fadd(b.fmul(s[0], s[1]), s[2]) if fl else b.add(b.mul(s[0], s[1]), s[2])
    raise NotImplementedError(f"the CPU backend cannot render {op} on {sd} (no decomposition rule for it)")

  def _floor_div(self, x, y, round_quotient=lambda q: q):
    """floor(x / y) of floats; a non-finite quotient passes through (x // 0 is x / 0, as numpy gives it); never
    -0.0 (engine/ir/alu.py floors to an int). round_quotient: a 2-byte float rounds the quotient before the floor, as
    numpy does."""
    b, ty = self.b, x.type
    return b.fadd(self._intrinsic("llvm.floor", [round_quotient(b.fdiv(x, y))]), ir.Constant(ty, 0.0))   # -0.0 + 0.0 is 0.0

  def _intrinsic(self, name: str, args: list):
    ty = args[0].type
    fnty = ir.FunctionType(ty, [ty] * len(args))
    if isinstance(ty, ir.VectorType):   # (llvmlite names only scalar overloads: llvm.fma.v16f32 by hand)
      full = f"{name}.v{ty.count}{ty.element.intrinsic_name}"
      fn = self.module.globals.get(full) or ir.Function(self.module, fnty, full)
    else: fn = self.module.declare_intrinsic(name, [ty], fnty)
    return self.b.call(fn, args)

  def _int_pow(self, a, e, unsigned: bool):
    # square and multiply (wrapping, as numpy); a negative exponent gives 1/a**|e| truncated, as engine/ir/alu.py
    b, ty = self.b, a.type
    res, base, exp = self._alloca(ty, "pow_res"), self._alloca(ty, "pow_base"), self._alloca(ty, "pow_exp")
    b.store(ir.Constant(ty, 1), res)
    b.store(a, base)
    b.store(e, exp)
    head, body, done = (self.fn.append_basic_block(n) for n in ("pow_head", "pow_body", "pow_done"))
    b.branch(head)
    b.position_at_end(head)
    cur = b.load(exp)
    # != 0 with a logical shift: ends within the width for any bit pattern (unsigned top bit, negative)
    b.cbranch(b.icmp_unsigned("!=", cur, ir.Constant(ty, 0)), body, done)
    b.position_at_end(body)
    cur, bv, rv = b.load(exp), b.load(base), b.load(res)
    odd = b.icmp_unsigned("!=", b.and_(cur, ir.Constant(ty, 1)), ir.Constant(ty, 0))
    b.store(b.select(odd, b.mul(rv, bv), rv), res)
    b.store(b.mul(bv, bv), base)
    b.store(b.lshr(cur, ir.Constant(ty, 1)), exp)
    b.branch(head)
    b.position_at_end(done)
    out = b.load(res)
    if unsigned: return out
    neg = b.icmp_signed("<", e, ir.Constant(ty, 0))
    one, m1 = ir.Constant(ty, 1), ir.Constant(ty, -1)
    odd_e = b.icmp_unsigned("!=", b.and_(e, one), ir.Constant(ty, 0))
    neg_val = b.select(b.icmp_unsigned("==", a, one), one,
                       b.select(b.icmp_unsigned("==", a, m1), b.select(odd_e, m1, one), ir.Constant(ty, 0)))
    return b.select(neg, neg_val, out)

  def cast(self, v, sd: DType, d: DType):
    b, to = self.b, lltype(d)
    if sd is d: return v
    if sd.is_half:
      if d.kind == "b": return b.icmp_unsigned("!=", b.and_(v, ir.Constant(_I16, 0x7fff)), ir.Constant(_I16, 0))
      if d is dtypes.float16:   # from bfloat16: exact to float, rounded once; a NaN is float16's quiet NaN
        h = self._to_half(self._h2f(v, sd), d)   # (as ml_dtypes converts: numpy's float -> float16 keeps payloads)
        nan = b.icmp_unsigned(">", b.and_(v, ir.Constant(_I16, 0x7fff)), ir.Constant(_I16, 0x7f80))
        return b.select(nan, b.or_(b.and_(v, ir.Constant(_I16, 0x8000)), ir.Constant(_I16, 0x7e00)), h)
      if d.is_half: return self._to_half(self._h2f(v, sd), d)   # from float16: exact to float, rounded once
      if d.kind == "f": return self._h2f(v, sd, to)
      # float16's |x| <= 65504 has nothing to wrap; bfloat16 reaches 3.4e38, and wraps as float32 does
      return self._float_to_int(self._h2f(v, sd), to, wraps=sd is not dtypes.float16)
    if d.is_half:
      if sd.kind == "b": return b.select(v, ir.Constant(_I16, _ONE_BITS[d.name]), ir.Constant(_I16, 0))
      if sd.kind == "f": return self._to_half(v, d)
      # float16: an integer reaches float exactly below 2**24, and anything larger overflows float16 however it
      # rounds. bfloat16: through double (one rounding below 2**53, as the NUMPY device converts), then rounded once
      return self._to_half(self.cast(v, sd, dtypes.float32 if d is dtypes.float16 else dtypes.float64), d)
    if d.kind == "b":
      if sd.kind == "f": return b.fcmp_unordered("!=", v, ir.Constant(v.type, 0.0))
      return b.icmp_unsigned("!=", v, ir.Constant(v.type, 0))
    if sd.kind == "b": return b.uitofp(v, to) if d.kind == "f" else b.zext(v, to)
    if sd.kind == "f" and d.kind == "f": return b.fpext(v, to) if _fbits(d) > _fbits(sd) else b.fptrunc(v, to)
    if d.kind == "f": return self._unsigned_to_float(v, to) if sd.kind == "u" else b.sitofp(v, to)
    if sd.kind == "f": return self._float_to_int(v, to, wraps=True)
    # int -> int
    if to.width < v.type.width: return b.trunc(v, to)
    if to.width > v.type.width: return b.zext(v, to) if sd.kind == "u" else b.sext(v, to)
    return v

  def _unsigned_to_float(self, v, to):
    """uitofp, written as signed conversions for 32- and 64-bit sources: LLVM 22's SLP vectoriser narrows
    `uitofp (sext i16 x to i64)` to `uitofp (sext i16 x to i32)` (wrong for negative x: 2**32 - 3 instead of
    2**64 - 3; int16 -> uint64 -> float32 in Tensor.stack, found by tests/fuzz_programs.py). A source narrower than
    the float's mantissa widens and converts exactly; otherwise a value below 2**(w-1) converts as a signed one, and
    above, its half (the low bit kept as a sticky bit, so that it rounds the same) converts and doubles."""
    b, w = self.b, v.type.width
    if w < (24 if to == ir.FloatType() else 53):   # every value fits the float's mantissa: widen, convert exactly
      return b.sitofp(b.zext(v, ir.IntType(2 * w)), to)
    small = b.sitofp(v, to)
    half = b.or_(b.lshr(v, ir.Constant(v.type, 1)), b.and_(v, ir.Constant(v.type, 1)))
    big = b.fmul(b.sitofp(half, to), ir.Constant(to, 2.0))
    return b.select(b.icmp_signed("<", v, ir.Constant(v.type, 0)), big, small)

  def _float_to_int(self, v, to: ir.IntType, wraps: bool):
    # engine/ir/alu.py: non-finite -> 0, else truncate toward zero and wrap to the width
    b, ty = self.b, v.type
    finite = b.fcmp_ordered("<", self._intrinsic("llvm.fabs", [v]), ir.Constant(ty, math.inf))
    if wraps:
      # an integer-valued float past int64 wraps: reduce it modulo 2**64 (exact) into [-2**63, 2**63)
      w = b.frem(v, ir.Constant(ty, 2.0 ** 64))
      w = b.select(b.fcmp_ordered(">=", w, ir.Constant(ty, 2.0 ** 63)), b.fsub(w, ir.Constant(ty, 2.0 ** 64)),
                   b.select(b.fcmp_ordered("<", w, ir.Constant(ty, -2.0 ** 63)), b.fadd(w, ir.Constant(ty, 2.0 ** 64)), w))
      v = b.select(b.fcmp_ordered("<", self._intrinsic("llvm.fabs", [v]), ir.Constant(ty, 2.0 ** 63)), v, w)
    wide = b.fptosi(b.select(finite, v, ir.Constant(ty, 0.0)), _I64)
    return b.trunc(wide, to) if to.width < 64 else wide

  def reduce(self, u: UOp):
    if self.ups: return self.lane_reduce(u, self._reduce_lanes)   # one loop nest computes every lane's result
    return self._reduce_lanes(u, [()])[0]

  def _reduce_lanes(self, u: UOp, lanes: list[tuple[int, ...]]) -> list:
    """The REDUCE for `lanes` values of the upcast range (lane l: its base + l) in one loop nest: each lane's
    value is emitted side by side in the body, so LLVM's SLP vectoriser turns the lanes into vector operations
    and loads that do not depend on the lane are shared."""
    op, d = u.arg, u.dtype
    value, rngs = u.src[0], u.src[1:]
    bound = self._guard_bound(u)
    if bound is not None: value = value.src[1]   # (every step of the shortened loop passes the guard)
    if bound is None and lanes == [()] and op is Ops.MAX and d in (dtypes.float32, dtypes.float64) and len(rngs) == 1 \
       and rngs[0].src[0].arg >= 2 * MAX_LANES:
      return [self._max_in_lanes(value, rngs[0], d)]
    run = self.running_of(u)
    if run is not None: return self._running_sum(u, lanes, run)
    if (bound is None and op is Ops.ADD and d in (dtypes.float32, dtypes.float64) and (len(rngs) > 1 or len(lanes) > 1)
        and range_kind(rngs[-1])[0] == "simd" and rngs[-1].src[0].arg >= SIMD_SUM_LANES and not _guarded_reduce(value)):
      got = self._sum_in_simd_lanes(value, rngs, lanes, d)
      if got is not None: return got
    # a 2-byte float accumulates in float: sums and products as numpy's do, rounded once at the end (max is exact
    # either way)
    wide = d.is_half
    ad = dtypes.float32 if wide else d
    accs = [self._alloca(lltype(ad), "acc") for _ in lanes]
    many = len(lanes) > 1
    for acc in accs: self.b.store(self.const(identity_element(op, d), ad), acc)
    loops = [self.open_loop(r, hi=bound) for r in rngs]
    if rngs and (ahead := prefetch_ahead(rngs[-1])): self._prefetch(value, rngs[-1], ahead)
    guarded = not many and ad.kind == "f" and op is Ops.ADD and _guarded_reduce(value)
    # a float sum of where(c, x, 0) (a convolution's taps that fall outside the image) adds x where c holds and
    # keeps the sum where not: select(c, acc + x, acc), which AVX-512 runs as one masked fma where x is a product,
    # instead of a masked multiply and an add (the input gradient of 8x64x56x56 3x3: 12.4 -> 8.9 ms)
    mask = else_zero(value) if not guarded and ad.kind == "f" and op is Ops.ADD and not wide else None
    if mask is not None: value = value.src[1]
    # a float sum of products may fuse each product into the sum (fma): `contract` on both, as numpy's BLAS does
    fuse = ad.kind == "f" and op is Ops.ADD and not wide and value.op is Ops.MUL
    if guarded:
      # sum(where(c, inner reduce, 0)): branch around the inner loops where c is false instead of computing
      # them and selecting 0 (a convolution's gradient: the window taps that fall outside)
      taken, join = self.fn.append_basic_block("guard_taken"), self.fn.append_basic_block("guard_join")
      self.b.cbranch(self.value(value.src[0]), taken, join)
      self.b.position_at_end(taken)
      self.scopes.append({})   # (what the taken branch computes is not visible after the join)
      v = self.value(value.src[1])
      if wide: v = self._h2f(v, d)   # (a 2-byte float value is its 16 bits; the sum is in float)
      self.b.store(self.b.fadd(self.b.load(accs[0]), v, flags=("reassoc", "contract")), accs[0])
      self.scopes.pop()
      self.b.branch(join)
      self.b.position_at_end(join)
    for lane, acc in zip(() if guarded else lanes, accs):
      if many: self.enter_lane(lane)
      if fuse: v = self.b.fmul(self.value(value.src[0]), self.value(value.src[1]), flags=("contract",))
      else: v = self.value(value)
      if wide: v = self._h2f(v, d)
      cur = self.b.load(acc)
      if mask is not None: new = self.b.select(self.value(mask), self.b.fadd(cur, v, flags=("reassoc", "contract")), cur)
      elif ad.kind == "f" and op is Ops.ADD: new = self.b.fadd(cur, v, flags=("reassoc", "contract"))
      elif ad.kind == "f" and op is Ops.MUL: new = self.b.fmul(cur, v, flags=("reassoc",))
      # MAX stays a compare-and-select: llvm.maxnum would vectorise, but LLVM 22's loop vectoriser (as
      # built in llvmlite 0.50, assertions on) aborts the process on some maxnum reductions
      else: new = self.alu(op, ad, ad, [cur, v])
      self.b.store(new, acc)
      if many: self.scopes.pop()
    # the lanes are the vector: keep the loop vectoriser from vectorising the reduce loop itself (it would
    # gather along the reduction) so that the SLP vectoriser packs the lanes; unless the optimizer made the reduce
    # loop the vector (SIMD: the lanes' loads run along it, not along the lanes)
    along = any(range_kind(r)[0] == "simd" for r in rngs)
    for lp in reversed(loops): self.close_loop(lp, no_vectorize=many and not along)
    outs = [self.b.load(acc) for acc in accs]
    return [self._to_half(o, d) for o in outs] if wide else outs

  def _running_sum(self, u: UOp, asked: list[tuple[int, ...]], run: UOp) -> list:
    """A float sum over a softmax's row with a running max (RUNMAX `run`, rules/online.rules) in one loop, together
    with every other such sum over the same range and max (the row's sum of exponentials beside the sum of their
    products with v: one loop computes both, a multi-accumulator reduction; ScopedEmitter.running_plan). Per step:
    the scores t; where t exceeds the max m so far, every partial sum that shares m is multiplied by
    exp2(a * (m - t)) and m becomes t (a branch: after a row's first steps its max seldom grows); then the
    exponential, computed with m (0 while m is -inf: those terms are exp2(-inf) = 0, and what was summed is
    multiplied by exp2(-inf) = 0 when m first grows), once per group of lanes with the same scores; then each
    sum's terms. A row whose max stays -inf sums NaN, as the two-pass form does. Returns u's `asked` lanes."""
    b, ty = self.b, lltype(u.dtype)
    plan = self.running_plan(u, run)
    keys, many = plan.keys, plan.many
    ninf, zero = ir.Constant(ty, -math.inf), ir.Constant(ty, 0.0)
    accs = {s: {k: self._alloca(ty, "acc") for k in plan.groups(s)} for s in plan.sums}
    maxes = {k: self._alloca(ty, "runmax") for k in plan.groups(run)}
    for per in accs.values():
      for acc in per.values(): b.store(zero, acc)
    for m in maxes.values(): b.store(ninf, m)
    loop = self.open_loop(u.src[1])
    safe = {}
    for k, t in self.running_scores(plan):
      old = b.load(maxes[k])
      rescale, join = self.fn.append_basic_block("runmax_grow"), self.fn.append_basic_block("runmax_join")
      b.cbranch(b.fcmp_ordered(">", t, old), rescale, join)
      b.position_at_end(rescale)
      corr = self._intrinsic("llvm.exp2", [b.fmul(b.fsub(old, t), ir.Constant(ty, run.arg))])
      for s, sk in plan.rescaled(k): b.store(b.fmul(b.load(accs[s][sk]), corr), accs[s][sk])
      b.store(t, maxes[k])
      b.branch(join)
      b.position_at_end(join)
      now = b.load(maxes[k])
      safe[k] = b.select(b.fcmp_ordered("==", now, ninf), zero, now)
    for s, sk, v in self.running_terms(plan, safe):
      b.store(b.fadd(b.load(accs[s][sk]), v, flags=("reassoc", "contract")), accs[s][sk])
    self.close_loop(loop, no_vectorize=many)
    nan = ir.Constant(ty, math.nan)
    done = {s: {sk: b.select(b.fcmp_ordered("==", b.load(maxes[keys[run](lane)]), ninf), nan, b.load(accs[s][sk]))
                for sk, lane in plan.groups(s).items()} for s in plan.sums}
    return self.running_results(plan, asked, done)

  def _sum_in_simd_lanes(self, value: UOp, rngs: tuple, lanes: list, d: DType) -> list | None:
    """A float sum whose innermost range, r, runs in vector lanes (SIMD), over several ranges or for several upcast
    lanes (a convolution's weight gradient, its sum along image rows; x @ W.T's dot tile), as explicit vectors: per
    upcast lane a vector of SIMD_SUM_LANES partial sums (element i of r into partial i % SIMD_SUM_LANES; what is
    left past the last whole vector, a narrower vector, into the first partials), kept across every range of the
    sum and added together once at the end (_add_partials). LLVM's loop vectoriser, given the innermost loop alone,
    added its lanes into one scalar after every row (a horizontal sum per row and lane: 8x64x56x56's 3x3 weight
    gradient spent about as long there as in its fmas; SLP over scalar partials spilled).
    Only for a term built of loads that step by one element along r, values that do not depend on r, + - * and
    negation, under at most a where(c, term, 0) whose c does not depend on r; None otherwise (the caller then lets
    the loop vectoriser have the innermost loop). Sums reassociate, as any vectorised sum does."""
    b, r, w = self.b, rngs[-1], SIMD_SUM_LANES
    n, many = r.src[0].arg, len(lanes) > 1
    mask = else_zero(value)
    term = value.src[1] if mask is not None else value
    if mask is not None and r in mask.toposort(): return None
    rest = n % w
    if rest & (rest - 1) or not _vector_term(term, r, d): return None   # (a tail of 8, 4, 2 or 1 lanes, or none)
    ty = lltype(d)
    def vec_of(width: int):
      def emit(u: UOp):
        if r not in u.toposort(): return self._splat(self.value(u), width)
        if u.op is Ops.INDEX:
          ptr = b.gep(self.ptrs[u.src[0]], [self.value(u.src[1])], inbounds=True, source_etype=memtype(d))
          return b.load(ptr, typ=ir.VectorType(ty, width), align=d.itemsize)
        srcs = [emit(x) for x in u.src]
        if u.op is Ops.NEG: return b.fneg(srcs[0])
        return {Ops.ADD: b.fadd, Ops.SUB: b.fsub, Ops.MUL: b.fmul}[u.op](*srcs, flags=("contract",))
      return emit
    def add(lane, acc, index, width: int) -> None:
      if many: self.enter_lane(lane)
      else: self.scopes.append({})
      self.ranges[r] = index   # (the vector's first element; every value that depends on r is this step's own)
      cur, v = b.load(acc), vec_of(width)(term)
      if width < w:   # the tail, into the first partials (zeros above it): no accumulators of its own to keep live
        zeros = ir.Constant(ir.VectorType(ty, width), [0.0] * width)
        v = b.shuffle_vector(v, zeros, ir.Constant(ir.VectorType(_I32, w), list(range(width)) + [width] * (w - width)))
      new = b.fadd(cur, v, flags=("reassoc", "contract"))
      if mask is not None: new = b.select(self.value(mask), new, cur)
      b.store(new, acc)
      self.scopes.pop()
      del self.ranges[r]
    accs = [self._alloca(ir.VectorType(ty, w), "vacc") for _ in lanes]
    for acc in accs: b.store(ir.Constant(ir.VectorType(ty, w), [0.0] * w), acc)
    loops = [self.open_loop(x) for x in rngs[:-1]]
    if n >= w:
      blocks = UOp(Ops.RANGE, r.dtype, (UOp.const(dtypes.index, n // w),), (r.arg[0], "simdlanes"))
      lp = self.open_loop(blocks)
      base = b.mul(self.ranges[blocks], ir.Constant(_I64, w))
      for lane, acc in zip(lanes, accs): add(lane, acc, base, w)
      self.close_loop(lp, no_vectorize=True)
    if rest:
      for lane, acc in zip(lanes, accs): add(lane, acc, ir.Constant(_I64, n - rest), rest)
    for lp in reversed(loops): self.close_loop(lp, no_vectorize=True)
    return self._add_partials([b.load(acc) for acc in accs], w)

  def _add_partials(self, vecs: list, w: int) -> list:
    """Each vector's w partial sums added together, for all the vectors at once where there are a power of two of
    them: pairs of vectors are halved into one (a's lower halves beside b's, plus the upper halves), so each level
    is two shuffles and one add per pair, and the last vectors hold one sum per lane (16 lanes of 16 partials: 15
    pairs, 45 instructions, against 16 separate halvings of 4 levels, 192). A 4 x 4 dot tile over a sum of 64 (an
    attention's q @ k.T) spent about as long adding its partials one vector at a time as in its fmas."""
    b = self.b
    def pick(x, y, idx):
      return b.shuffle_vector(x, y, ir.Constant(ir.VectorType(_I32, len(idx)), idx))
    n = len(vecs)
    if n & (n - 1): groups = [[v] for v in vecs]   # (each on its own below)
    else: groups = [vecs]
    outs = []
    for part in groups:
      # each entry: (vector, the lanes its groups of partials belong to, in order); a vector of width w holds
      # len(lanes) groups of w // len(lanes) partials each
      level = [(v, [i]) for i, v in enumerate(part)]
      g = w
      while len(level) > 1 and g > 1:
        half, nxt = g // 2, []
        for (x, lx), (y, ly) in zip(level[0::2], level[1::2]):
          k = len(lx)   # groups per vector (the same in x and y)
          lo = [q * g + j for q in range(k) for j in range(half)] + [w + q * g + j for q in range(k) for j in range(half)]
          hi = [q * g + half + j for q in range(k) for j in range(half)] + [w + q * g + half + j for q in range(k) for j in range(half)]
          nxt.append((b.fadd(pick(x, y, lo), pick(x, y, hi), flags=("reassoc", "contract")), lx + ly))
        level, g = nxt, half
      done = {}
      for v, lanes in level:   # (one vector left with groups of g > 1, or several with groups of 1)
        while g > 1:   # what is left within the vector: every group halved onto itself
          half = g // 2
          lo = [q * g + j for q in range(len(lanes)) for j in range(half)]
          hi = [q * g + half + j for q in range(len(lanes)) for j in range(half)]
          v, g = b.fadd(pick(v, v, lo), pick(v, v, hi), flags=("reassoc", "contract")), half
        for q, lane in enumerate(lanes): done[lane] = b.extract_element(v, _I32(q))
      outs += [done[i] for i in range(len(part))]
    return outs

  def _guard_bound(self, red: UOp):
    """The loop end of a reduce over a Variable's size (ScopedEmitter.guard_end): min(max(e, 0), size), so the
    loop stops where the guard would start to fail instead of running to the largest size; None otherwise."""
    e = self.guard_end(red, ("loop", "reduce"))
    if e is None: return None
    v = self.value(e)
    if v.type != _I64: v = self.b.sext(v, _I64)
    b, n = self.b, ir.Constant(_I64, red.src[1].src[0].arg)
    v = b.select(b.icmp_signed("<", v, ir.Constant(_I64, 0)), ir.Constant(_I64, 0), v)
    return b.select(b.icmp_signed("<", v, n), v, n)

  def _prefetch(self, value: UOp, r: UOp, ahead: int) -> None:
    """Prefetch, `ahead` steps of loop r early, each cache line that the loads of `value` read with a stride of a
    line or more along r (what the hardware prefetchers do not follow: B's rows, a page apart in a matmul): one
    prefetch per line of the lanes' loads, lanes that share a line sharing it."""
    for load in dict.fromkeys(x for x in value.toposort() if x.op is Ops.INDEX and x.src[0] in self.ptrs):
      for idx in prefetch_indices(load, r, ahead, self.ups):
        ptr = self.b.gep(self.ptrs[load.src[0]], [self.value(idx)], inbounds=False, source_etype=memtype(load.dtype))
        self.b.call(self._prefetch_fn(), [ptr, _I32(0), _I32(3), _I32(1)])

  def _prefetch_fn(self) -> ir.Function:
    fn = self.module.globals.get("llvm.prefetch.p0")
    return fn if fn is not None else ir.Function(self.module, ir.FunctionType(ir.VoidType(), [ir.PointerType(), _I32, _I32, _I32]),
                                                name="llvm.prefetch.p0")

  def _max_in_lanes(self, value: UOp, r: UOp, d: DType):
    """A float MAX over one range in MAX_LANES interleaved accumulators (element i into i % MAX_LANES), combined in
    order at the end. LLVM's loop vectoriser takes a compare-and-select reduction only if it may assume no NaN
    (llvm.maxnum would do, but LLVM 22 as built in llvmlite 0.50 aborts on some maxnum reductions); the lanes are
    independent, so the SLP vectoriser packs them into vector compares and selects that keep engine/ir/alu.py's MAX
    exactly. Each lane sees its elements in order, so the result is the same value; only a tie of 0.0 and -0.0 may
    keep the other zero (as a reassociated sum may round differently)."""
    b, n, w = self.b, r.src[0].arg, MAX_LANES
    accs = [self._alloca(lltype(d), "macc") for _ in range(w)]
    for acc in accs: b.store(self.const(identity_element(Ops.MAX, d), d), acc)
    def update(acc, index):
      self.scopes.append({})   # the value depends on r, which differs per lane
      self.ranges[r] = index
      self.b.store(self.alu(Ops.MAX, d, d, [self.b.load(acc), self.value(value)]), acc)
      self.scopes.pop()
      del self.ranges[r]
    blocks = UOp(Ops.RANGE, r.dtype, (UOp.const(dtypes.index, n // w),), (r.arg[0], "maxlanes"))
    lp = self.open_loop(blocks)
    base = self.b.mul(self.ranges[blocks], ir.Constant(_I64, w))
    for j, acc in enumerate(accs): update(acc, self.b.add(base, ir.Constant(_I64, j)) if j else base)
    self.close_loop(lp, no_vectorize=True)
    if n % w:
      rest = UOp(Ops.RANGE, r.dtype, (UOp.const(dtypes.index, n % w),), (r.arg[0], "maxrest"))
      lp = self.open_loop(rest)
      update(accs[0], self.b.add(self.ranges[rest], ir.Constant(_I64, n - n % w)))
      self.close_loop(lp)
    out = self.b.load(accs[0])
    for acc in accs[1:]: out = self.alu(Ops.MAX, d, d, [out, self.b.load(acc)])
    return out


# a SIMD tile's stored value computed as one vector of its lanes (_lanes_as_vector): for at most this many lanes, an
# epilogue of at least this many ops (a bias add is left to the SLP vectoriser), of these ops
VECTOR_EPILOGUE_MAX_LANES = 64
VECTOR_EPILOGUE_MIN_OPS = 16
VECTOR_EPILOGUE_OPS = frozenset({Ops.ADD, Ops.SUB, Ops.MUL, Ops.FDIV, Ops.NEG, Ops.MAX, Ops.CMPLT, Ops.CMPNE,
                                 Ops.CMPEQ, Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR, Ops.WHERE, Ops.BITCAST,
                                 Ops.MULACC, Ops.SQRT, Ops.RECIPROCAL})


def _vector_cast(sd: DType, d: DType) -> str | None:
  """The builder method of a cast the vector epilogue renders as one instruction, as LLVMRenderer.cast does (a bool to
  a float, float widths, signed integers to floats, integer widths); None for the rest (they keep the scalar path)."""
  if sd.is_half or d.is_half or sd is d or d.kind == "b": return None
  if sd.kind == "b": return "uitofp" if d.kind == "f" else "zext"
  if sd.kind == "f" and d.kind == "f": return "fpext" if _fbits(d) > _fbits(sd) else "fptrunc"
  if d.kind == "f": return "sitofp" if sd.kind == "i" else None
  if sd.kind == "f": return None
  if d.itemsize < sd.itemsize: return "trunc"
  if d.itemsize > sd.itemsize: return "zext" if sd.kind == "u" else "sext"
  return None


def _epilogue_parts(value: UOp, ups: set) -> tuple[list[UOp], list[UOp], list[UOp]]:
  """value's nodes above its sums, split: the leaves that differ between lanes (REDUCEs, loads, upcast ranges:
  gathered lane by lane), the ops that depend on them (in toposort order), and the values they read that do not
  depend on the lanes at all (constants too: one scalar each, splatted)."""
  order: list[UOp] = []
  stack, seen = [(value, False)], set()
  while stack:   # post-order, not descending into sums or loads
    x, ready = stack.pop()
    if x in seen: continue
    if ready or x.op in (Ops.REDUCE, Ops.INDEX) or not x.src:
      seen.add(x); order.append(x); continue
    stack.append((x, True))
    stack.extend((s, False) for s in x.src if s not in seen)
  leaf = lambda x: x.op in (Ops.REDUCE, Ops.INDEX) or not x.src  # noqa: E731
  dep: dict[UOp, bool] = {}
  for x in order: dep[x] = any(r in ups for r in x.toposort()) if leaf(x) else any(dep[s] for s in x.src)
  inner = [x for x in order if dep[x] and not leaf(x)]
  used = {s for x in inner for s in x.src}
  return [x for x in order if dep[x] and leaf(x)], inner, [x for x in order if not dep[x] and x in used]


MAX_LANES = 16  # a float max reduction's interleaved accumulators (see _max_in_lanes)
SIMD_SUM_LANES = 16  # partial sums per lane of a SIMD sum kept as explicit vectors (see _sum_in_simd_lanes)
LINE_BYTES = 64                 # a cache line
MAX_PREFETCH_PER_LOAD = 8       # lines of one load prefetched per step, at most (more: none of them)


def prefetch_indices(load: UOp, r: UOp, ahead: int, lanes: dict) -> list[UOp]:
  """The index expressions to prefetch for `load` in loop r, `ahead` steps early: none if its index moves by less
  than a line per step of r (or does not depend on r); else one per line its upcast lanes read at a step, each
  lane's index with the lanes fixed to the values of the first lane on that line and r moved ahead."""
  from rulec.engine.ir.index_expr import evaluate
  idx = load.src[1]
  free = [x for x in idx.toposort() if x.op is Ops.RANGE]
  if r not in free or any(x.op is Ops.DEFINE_VAR for x in idx.toposort()): return []
  mine = [x for x in free if x in lanes]
  size = load.dtype.itemsize
  base = {x: 0 for x in free}
  try:
    stride = abs(evaluate(idx, {**base, r: 1}) - evaluate(idx, base)) * size
    combos = [{}]
    for x in mine: combos = [{**c, x: v} for c in combos for v in range(lanes[x])]
    if len(combos) > 512: return []
    offsets = sorted((evaluate(idx, {**base, **c}) * size, i) for i, c in enumerate(combos))
  except (ArithmeticError, KeyError, TypeError, ValueError): return []
  if stride < LINE_BYTES: return []
  picked, last = [], None
  for off, i in offsets:
    if last is None or off >= last + LINE_BYTES: picked, last = picked + [combos[i]], off
  if len(picked) > MAX_PREFETCH_PER_LOAD: return []
  moved = UOp(Ops.ADD, dtypes.index, (r, UOp.const(dtypes.index, ahead)))
  return [substitute(idx, {r: moved, **{x: UOp.const(dtypes.index, v) for x, v in c.items()}}) for c in picked]


def _vector_term(u: UOp, r: UOp, d: DType) -> bool:
  """Whether _sum_in_simd_lanes can emit u as a vector of d along r: loads of d whose index steps by one element
  along r, values free of r, and + - * and negation of those."""
  if r not in u.toposort(): return True
  if u.dtype is not d: return False
  if u.op is Ops.INDEX: return r not in u.src[0].toposort() and _step_along(u.src[1], r) == 1
  return u.op in (Ops.ADD, Ops.SUB, Ops.MUL, Ops.NEG) and all(_vector_term(x, r, d) for x in u.src)


def _step_along(idx: UOp, r: UOp) -> int | None:
  """How far the index moves when r steps by one, where idx is r plus or times constants (and terms free of r);
  None where r is under any other op (a modulo, a division, a guard: no one step)."""
  if idx is r: return 1
  if r not in idx.toposort(): return 0
  if idx.op is Ops.ADD:
    a, c = _step_along(idx.src[0], r), _step_along(idx.src[1], r)
    return None if a is None or c is None else a + c
  if idx.op is Ops.MUL:
    for x, y in (idx.src, idx.src[::-1]):
      if y.op is Ops.CONST and (a := _step_along(x, r)) is not None: return a * y.arg
  return None


def _guarded_reduce(value: UOp) -> bool:
  """value is where(c, t, 0) with a reduce inside t: worth a branch rather than a select."""
  return else_zero(value) is not None and any(n.op is Ops.REDUCE for n in value.src[1].toposort())


def _reduce_levels(ast: UOp) -> dict:
  """Where reduces nested under a store's loops are computed: {None: those that depend on no range but their own
  (and those of reduces inside them: a whole-tensor max under the loop that compares with it), computed before any
  loop; r: those whose innermost free range in the store's loop order is r, computed right after r's loop opens},
  sources first. Only for a kernel with one store, and never a reduce over upcast lanes (its lanes differ) or one
  straight under the store (it is computed where it is stored) or one free in the innermost loop (no gain)."""
  stores = list(ast.src)
  order = stores[0].src[1:] if len(stores) == 1 and stores[0].op is Ops.END else ()
  pos = {r: i for i, r in enumerate(order)}
  direct = {(st.src[0] if st.op is Ops.END else st).src[1] for st in stores}
  free: dict[UOp, frozenset] = {}
  out: dict = {}
  for u in ast.toposort():
    if u.op is Ops.RANGE: free[u] = frozenset((u,))
    else:
      f = frozenset().union(*(free[s] for s in u.src)) if u.src else frozenset()
      free[u] = f - frozenset(u.src[1:]) if u.op is Ops.REDUCE else f
      if u.op is not Ops.REDUCE: continue
      if not free[u]: out.setdefault(None, []).append(u)
      elif u not in direct and all(r in pos and range_kind(r)[0] in ("loop", "thread", "serial", "simd") for r in free[u]):
        inner = max(free[u], key=pos.__getitem__)
        if pos[inner] < len(order) - 1: out.setdefault(inner, []).append(u)
  return out


def _fbits(d: DType) -> int: return d.itemsize * 8


_NOVEC_TAG = "rulec.novec"


def _with_loop_metadata(text: str) -> str:
  """Loop metadata needs a distinct node that names itself, which llvmlite.ir cannot build: branches tagged
  `!rulec.novec !N` become `!llvm.loop !L` with `!L = distinct !{!L, !N}` (one L per loop)."""
  out, extra, next_id = [], [], 1 + max([int(m) for m in re.findall(r"^!(\d+) =", text, re.M)] or [-1])
  for line in text.splitlines():
    m = re.search(r"!" + re.escape(_NOVEC_TAG) + r" (!\d+)", line)
    if m:
      line = line.replace(m.group(0), f"!llvm.loop !{next_id}")
      extra.append(f"!{next_id} = distinct !{{!{next_id}, {m.group(1)}}}")
      next_id += 1
    out.append(line)
  return "\n".join(out + extra) + "\n"


def render(kernel: Kernel, name: str = "kernel", vars=None) -> tuple[str, UOp | None]:
  """(LLVM IR text, the range split across threads or None) of an optimized kernel (codegen/opt). vars: the
  variables the function takes, in launch order (the kernel's own `vars` when None)."""
  r = LLVMRenderer(kernel, name, vars)
  return r.render(), r.split_range
