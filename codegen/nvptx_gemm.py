"""A matmul kernel on NVIDIA tensor cores (sm_80 and later), as LLVM IR for llvmlite's NVPTX target.

codegen/gemm_plan.py says which kernels are a matmul and where their operands lie; this file writes the kernel
for a GemmPlan. The CUDA device's renderer (codegen/nvptx.py) takes this path for every kernel with a plan.

The kernel, per block of 256 threads (8 warps, 2 x 4), computes a BM x BN tile of one batch's output:
  * k advances BK at a time; each k-tile of A (BM x BK) and B (BK x BN) travels from global to shared memory as
    16-byte cp.async copies (8 elements) into a ring of `stages` slots, so that the copies of tile t + stages - 1
    fly while tile t is multiplied. An operand's tile is laid out as rows along its strided axis and 16-byte chunks
    along its contiguous one; a chunk's index is XOR-ed with bits of its row (SmemTile), so that the 8 rows one
    ldmatrix reads fall in different banks. A copy past the matrix's edge (a ragged M, N or K) copies 0 bytes and
    fills the chunk with zeros (cp.async's src-size operand), so the sum is unchanged by it. A gathered factor
    (gemm_plan.Gather) is computed instead, an element per thread at a time, by its loader (the factor's
    expression rendered by the CPU renderer as a function of the ranges, inlined) and stored to the slot; outside
    the matrix it is 0. It is laid out as [free][k] rows.
  * fragments leave shared memory by ldmatrix.x4, transposed or not by the operand's layout, and each warp runs
    mma.sync.m16n8k16 (float32 accumulation) over its 64 x 32 part of the tile: 4 x 4 tiles, 64 accumulators a thread.
  * the epilogue is the kernel's own store, rendered by the CPU renderer (codegen/llvmir.py) as a function of the
    output ranges and the sum: the cast to float16, a bias, an activation, whatever the scheduler fused after the
    sum. The kernel calls it per pair of neighbouring accumulators (rulec_tc_epilogue2) with flags that say whether
    each element is inside the output, and LLVM inlines it; a pair of neighbouring, aligned elements is one store.
    Batch ranges are blockIdx.z, split by their sizes.

The tile loop (copies, ldmatrix, mma) is written as LLVM IR text with inline PTX, through IRText: a few lines per
instruction, integer arithmetic folded where it is known when the kernel is written. bench/tc_gemm_cuda.py times
the same kernel on its own; tests/codegen/ptx_gemm_emulator.py runs it on the CPU, one numpy lane per thread.
"""
from __future__ import annotations

import attrs
from llvmlite import ir

from rulec.codegen import llvmir
from rulec.codegen.gemm_plan import CHUNK, Gather, GemmPlan, Operand
from rulec.engine.ir.dtypes import dtypes
from rulec.engine.ir.kernel import Kernel
from rulec.engine.ir.ops import Ops
from rulec.engine.ir.uop import UOp

EPILOGUE, EPILOGUE2, LOAD_A, LOAD_B = "rulec_tc_epilogue", "rulec_tc_epilogue2", "rulec_tc_load_a", "rulec_tc_load_b"
_I64 = ir.IntType(64)
MMA_TYPE = {"float16": "f16", "bfloat16": "bf16"}


@attrs.frozen
class Config:
  BM: int = 128     # block tile
  BN: int = 128
  BK: int = 32
  WM: int = 2       # warps along m and n
  WN: int = 4
  stages: int = 3   # cp.async ring slots
  raster: int = 1   # block rows per band of the launch order (see render_gemm); 1: row after row

  @property
  def threads(self) -> int: return 32 * self.WM * self.WN

  @property
  def smem(self) -> int: return self.stages * (self.BM * self.BK + self.BK * self.BN) * 2


@attrs.frozen
class Launch:
  grid: tuple[int, int, int]
  block: int
  smem: int          # bytes of dynamic shared memory


# *** LLVM IR text ***

class IRText:
  """LLVM IR text, written a line at a time: fresh SSA names, and integer arithmetic that folds Python ints, so the
  kernel mixes constants (tile sizes, unrolled indices) and run-time values (thread ids) freely."""
  def __init__(self):
    self.lines: list[str | None] = []
    self.n, self.block = 0, "entry"

  def v(self, expr: str, hint: str = "v") -> str:
    self.n += 1
    name = f"%{hint}{self.n}"
    self.lines.append(f"  {name} = {expr}")
    return name

  def do(self, stmt: str) -> None: self.lines.append(f"  {stmt}")

  def label(self, name: str) -> None:
    self.lines.append(f"{name}:")
    self.block = name

  def _bin(self, op, a, b, ty, fold, ident=None, zero=None):
    if isinstance(a, int) and isinstance(b, int): return fold(a, b)
    if ident is not None and isinstance(b, int) and b == ident: return a
    if ident is not None and op in ("add", "mul", "or", "xor") and isinstance(a, int) and a == ident: return b
    if zero is not None and ((isinstance(a, int) and a == zero) or (isinstance(b, int) and b == zero)): return 0
    return self.v(f"{op} {ty} {a}, {b}", op[0])

  def add(self, a, b, ty="i32"): return self._bin("add", a, b, ty, lambda x, y: x + y, 0)
  def mul(self, a, b, ty="i32"): return self._bin("mul", a, b, ty, lambda x, y: x * y, 1, 0)
  def xor(self, a, b, ty="i32"): return self._bin("xor", a, b, ty, lambda x, y: x ^ y, 0)
  def and_(self, a, b, ty="i32"): return self._bin("and", a, b, ty, lambda x, y: x & y, None, 0)
  def shl(self, a, b, ty="i32"): return self._bin("shl", a, b, ty, lambda x, y: x << y, 0)
  def lshr(self, a, b, ty="i32"): return self._bin("lshr", a, b, ty, lambda x, y: x >> y, 0)
  def udiv(self, a, b, ty="i32"): return self._bin("udiv", a, b, ty, lambda x, y: x // y, 1)
  def urem(self, a, b, ty="i32"): return self._bin("urem", a, b, ty, lambda x, y: x % y)

  def zext64(self, a): return a if isinstance(a, int) else self.v(f"zext i32 {a} to i64", "z")

  def lt(self, a, b, ty="i32"):
    """a < b (unsigned) as an i1 name or a Python bool."""
    if isinstance(a, int) and isinstance(b, int): return a < b
    return self.v(f"icmp ult {ty} {a}, {b}", "c")

  def and1(self, a, b):
    if isinstance(a, bool): return b if a else False
    if isinstance(b, bool): return a if b else False
    return self.v(f"and i1 {a}, {b}", "c")

  def i1(self, c) -> str: return ("true" if c else "false") if isinstance(c, bool) else c

  def gep(self, base, byte_off, space: int):
    """Byte-offset pointer arithmetic on `ptr addrspace(space)`; offsets are i64 for global, i32 for shared."""
    if isinstance(byte_off, int) and byte_off == 0: return base
    ity = "i32" if space == 3 else "i64"
    return self.v(f"getelementptr i8, ptr addrspace({space}) {base}, {ity} {byte_off}", "p")


def log2i(x: int) -> int:
  if x <= 0 or x & (x - 1): raise ValueError(f"{x} is not a power of two")
  return x.bit_length() - 1


class SmemTile:
  """One operand's tile in shared memory: `rows` rows of `row_bytes`, as 16-byte chunks whose index is XOR-ed with
  bits of the row. ldmatrix reads 8 rows at the same chunk; with 64-byte rows rows r and r + 2 share banks, with
  256-byte rows all 8 do. The XOR puts those 8 chunks in 8 different 16-byte bank groups."""
  def __init__(self, rows: int, row_bytes: int):
    self.rows, self.row_bytes = rows, row_bytes
    self.cpr = row_bytes // 16
    if row_bytes % 16 or self.cpr & (self.cpr - 1): raise ValueError(f"a tile row of {row_bytes} bytes")
    self.sh = log2i(max(1, 128 // row_bytes))   # rows sharing one 128-byte bank line share a pattern
    self.mask = min(self.cpr, 8) - 1

  def offset(self, ir_: IRText, row, chunk):
    """Byte offset of (row, logical 16-byte chunk)."""
    x = ir_.and_(ir_.lshr(row, self.sh), self.mask)
    return ir_.add(ir_.mul(row, self.row_bytes), ir_.mul(ir_.xor(chunk, x), 16))


# *** the epilogue and the gathered factors: parts of the kernel, rendered by the CPU renderer ***

# the GPU's own conversions between float and the 2-byte floats (one cvt instruction each, round to nearest even),
# in place of the CPU renderer's integer code (about 30 instructions, which made the epilogue of a 128 x 128 tile
# as long as the k loop); a NaN becomes the canonical one, where the integer code keeps its top payload bits
_GPU_CVT = {"rulec.f2h": ("cvt.rn.f16.f32 $0, $1;", "=h,f", ir.IntType(16), ir.FloatType()),
            "rulec.h2f": ("cvt.f32.f16 $0, $1;", "=f,h", ir.FloatType(), ir.IntType(16)),
            "rulec.f2b": ("cvt.rn.bf16.f32 $0, $1;", "=h,f", ir.IntType(16), ir.FloatType())}


class _Part(llvmir.LLVMRenderer):
  """A function of the kernel's ranges rendered from its own nodes: `ranges` become i64 parameters after the
  buffers' pointers; `extra` more parameter types follow them. gpu: the 2-byte float conversions as PTX cvt
  instructions (else the CPU renderer's, so that the parts also compile for the CPU, as the tests run them)."""
  gpu = False

  def _half_fn(self, name: str) -> ir.Function:
    if not self.gpu or name not in _GPU_CVT or name in self._half_fns: return super()._half_fn(name)
    asm, constraint, ret, arg = _GPU_CVT[name]
    fn = self._half_fns[name] = ir.Function(self.module, ir.FunctionType(ret, [arg]), name=name)
    fn.linkage = "internal"
    fn.attributes.add("alwaysinline")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    b.ret(b.asm(ir.FunctionType(ret, [arg]), asm, constraint, [fn.args[0]], False))
    return fn

  def __init__(self, kernel: Kernel, module: ir.Module, helpers: dict, name: str, ranges: tuple[UOp, ...],
               ret: ir.Type, extra: list):
    super().__init__(kernel, "unused")
    # (one module for every part: the 2-byte float conversions they call are defined once)
    self.module, self._half_fns = module, helpers
    nb, nv = self.nbufs, len(self.vars)
    fty = ir.FunctionType(ret, [ir.PointerType()] * nb + [_I64] * nv + [_I64] * len(ranges) + extra)
    self.fn = ir.Function(self.module, fty, name=name)
    self.fn.attributes.add("alwaysinline")
    self.fn.linkage = "internal"
    args = self.fn.args
    self.ptrs = {p: args[p.arg[0]] for p in self.ptrs}
    self.var_args = {v: args[nb + i] for i, v in enumerate(self.vars)}
    self.entry = self.fn.append_basic_block("entry")
    self.b = ir.IRBuilder(self.entry)
    self.ranges = dict(zip(ranges, args[nb + nv:nb + nv + len(ranges)]))
    self.extra = args[nb + nv + len(ranges):]


def _sum_scope(r: _Part, red: UOp, acc) -> None:
  """Render what follows with the sum `red` given as the float accumulator acc (cast to the sum's dtype)."""
  r.scopes = [{red: acc if red.dtype is dtypes.float32 else r.cast(acc, dtypes.float32, red.dtype)}]


def _epilogue(kernel: Kernel, module, helpers, red: UOp, ranges: tuple[UOp, ...], gpu: bool) -> None:
  """void rulec_tc_epilogue(ptr p..., i64 r... (the store's ranges, in the END's order), float acc, i1 ok): the
  kernel's store of one element whose sum is acc, when ok."""
  r = _Part(kernel, module, helpers, EPILOGUE, ranges, ir.VoidType(), [ir.FloatType(), ir.IntType(1)])
  r.gpu = gpu
  acc, ok = r.extra
  body, done = r.fn.append_basic_block("store"), r.fn.append_basic_block("done")
  r.b.cbranch(ok, body, done)
  r.b.position_at_end(body)
  _sum_scope(r, red, acc)
  store = kernel.ast.src[0].src[0]
  (p, idx), value = store.src[0].src, store.src[1]
  r._store(p, r.value(idx), r.value(value), value.dtype)
  r.b.branch(done)
  r.b.position_at_end(done)
  r.b.ret_void()


def _paired_epilogue(kernel: Kernel, module, helpers, red: UOp, ranges: tuple[UOp, ...], gpu: bool) -> None:
  """void rulec_tc_epilogue2(ptr p..., i64 r... (element 0's ranges), i64 r... (element 1's), float acc0, float acc1,
  i1 ok0, i1 ok1): the stores of two accumulators a thread holds side by side (c0, c1: one row, columns 2t and
  2t + 1). Where both are inside the output and land in neighbouring elements whose pair is aligned, the two values
  leave as one store of twice the width (st.global.v2.f32, or a 32-bit word of two 2-byte floats): the warp's
  stores then fill whole 32-byte sectors, where one element at a time fills each half of a sector by a separate
  instruction. Anywhere else (an edge of the output, a store that is not along the columns, an odd offset) each
  element is stored on its own by rulec_tc_epilogue. The checks are made when the kernel runs: a few integer
  instructions, where proving them from the index expression would take the symbolic engine into codegen."""
  n = len(ranges)
  r = _Part(kernel, module, helpers, EPILOGUE2, ranges, ir.VoidType(),
            [_I64] * n + [ir.FloatType(), ir.FloatType(), ir.IntType(1), ir.IntType(1)])
  r.gpu = gpu
  second, (acc0, acc1, ok0, ok1) = list(r.extra[:n]), r.extra[n:]
  first = [r.ranges[u] for u in ranges]
  store = kernel.ast.src[0].src[0]
  (p, idx), value = store.src[0].src, store.src[1]
  b, head = r.b, list(r.fn.args[:r.nbufs + len(r.vars)])

  def apart() -> None:   # (each element by rulec_tc_epilogue, under its own flag)
    single = module.globals[EPILOGUE]
    b.call(single, head + first + [acc0, ok0])
    b.call(single, head + second + [acc1, ok1])
    b.ret_void()

  if value.dtype.kind == "b": return apart()   # (a bool is a byte in memory: pairs of them are not worth a path)
  pair, edge = r.fn.append_basic_block("pair"), r.fn.append_basic_block("apart")
  b.cbranch(b.and_(ok0, ok1), pair, edge)
  b.position_at_end(edge)
  apart()
  b.position_at_end(pair)
  got = []
  for rvals, acc in ((first, acc0), (second, acc1)):   # (each element's value in a scope of its own)
    r.ranges = dict(zip(ranges, rvals))
    _sum_scope(r, red, acc)
    got.append((r.value(idx), r.value(value)))
  (i0, v0), (i1, v1) = got
  et, width = llvmir.memtype(value.dtype), value.dtype.itemsize * 2
  p0 = b.gep(r.ptrs[p], [i0], inbounds=True, source_etype=et)
  next_ = b.icmp_signed("==", i1, b.add(i0, ir.Constant(i0.type, 1)))
  aligned = b.icmp_unsigned("==", b.and_(b.ptrtoint(p0, _I64), ir.Constant(_I64, width - 1)), ir.Constant(_I64, 0))
  wide, two = r.fn.append_basic_block("wide"), r.fn.append_basic_block("two")
  b.cbranch(b.and_(next_, aligned), wide, two)
  b.position_at_end(wide)
  i32 = ir.IntType(32)
  pv = b.insert_element(b.insert_element(ir.Constant(ir.VectorType(et, 2), ir.Undefined), v0, ir.Constant(i32, 0)),
                        v1, ir.Constant(i32, 1))
  b.store(pv, p0).align = width
  b.ret_void()
  b.position_at_end(two)
  b.store(v0, p0)
  b.store(v1, b.gep(r.ptrs[p], [i1], inbounds=True, source_etype=et))
  b.ret_void()


def _loader(kernel: Kernel, module, helpers, expr: UOp, name: str, ranges: tuple[UOp, ...], gpu: bool) -> None:
  """i16 name(ptr p..., i64 r... (the store's ranges, then the sum's)): the bits of factor `expr` there."""
  r = _Part(kernel, module, helpers, name, ranges, ir.IntType(16), [])
  r.gpu = gpu
  r.scopes = [{}]
  r.b.ret(r.value(expr))


def parts_ir(kernel: Kernel, plan: GemmPlan, gpu: bool = True) -> str:
  """The functions the tensor-core kernel calls, from `kernel` (the planned kernel after its decompositions,
  whose nodes replace the plan's by position): the epilogue, and a loader per gathered factor. gpu=False: with the
  CPU's conversions, for running them on the CPU (the tests)."""
  end = kernel.ast.src[0]
  reds = [u for u in end.src[0].src[1].toposort() if u.op is Ops.REDUCE]
  if len(reds) != 1 or len(end.src) != len(plan.ranges) + 1 or len(reds[0].src) != len(plan.ks) + 1:
    raise ValueError("the decompositions changed the kernel's sum or ranges")
  red, ranges = reds[0], tuple(end.src[1:])
  module, helpers = ir.Module(name="rulec_tc"), {}
  _epilogue(kernel, module, helpers, red, ranges, gpu)
  _paired_epilogue(kernel, module, helpers, red, ranges, gpu)
  body = red.src[0]
  if body.op is Ops.CAST and body.src[0].op is Ops.MUL: body = body.src[0]
  for opnd, name in ((plan.a, LOAD_A), (plan.b, LOAD_B)):
    if isinstance(opnd, Gather):
      expr = body.src[opnd.position]
      if expr.op is Ops.CAST and expr.dtype is dtypes.float32: expr = expr.src[0]
      _loader(kernel, module, helpers, expr, name, ranges + tuple(red.src[1:]), gpu)
  return "\n".join(line for line in str(module).splitlines() if not line.startswith(("target ", "; ModuleID")))


# *** the tile loop ***

def _operand_tile(op, free_tile: int, BK: int) -> SmemTile:
  # rows along the strided axis, chunks along the contiguous one
  return SmemTile(free_tile, BK * 2) if op.k_contiguous else SmemTile(BK, free_tile * 2)


def _rastered(x: IRText, bx, by, gx: int, gy: int, band: int):
  """(column, row) of the output tile this block computes, where blocks run in bands of `band` rows: the blocks
  the GPU runs at once (it starts them in order of blockIdx.y, then x) go down a band's rows before moving to the
  next column, so that they share the columns of B as well as the rows of A in L2. A last band of fewer rows
  takes what is left."""
  if band <= 1 or gy <= band: return bx, by
  pid = x.add(x.mul(by, gx), bx)
  per = band * gx
  first = x.mul(x.udiv(pid, per), band)
  within = x.urem(pid, per)
  rows = band
  if gy % band:
    rest = x.add(gy, x.mul(first, -1))   # (gy - first: the band's rows when fewer than `band` are left)
    short = x.lt(rest, band)
    rows = x.v(f"select i1 {short}, i32 {rest}, i32 {band}", "rows")
  return x.udiv(within, rows), x.add(first, x.urem(within, rows))


def render_gemm(plan: GemmPlan, nbufs: int, parts: str, cfg: Config = Config(), opencl: bool = False) -> tuple[str, Launch]:
  """(LLVM IR text of the kernel `entry(ptr addrspace(1) g..., i64 n)`, its launch) for a plan; `parts` is
  parts_ir's text (the epilogue and loaders the kernel calls). opencl: for NVIDIA's OpenCL, which builds PTX given
  as a program binary (the CL device, runtime/cl_device.py): the triple nvptx64-nvidia-nvcl, whose PTX says which
  parameters are global buffers, and the shared memory is a last parameter `ptr addrspace(3) %lds`, a `__local`
  argument of Launch.smem bytes (OpenCL sizes dynamic shared memory only through such arguments)."""
  BM, BN, BK, WM, WN, S, T = cfg.BM, cfg.BN, cfg.BK, cfg.WM, cfg.WN, cfg.stages, cfg.threads
  WTM, WTN = BM // WM, BN // WN
  MT, NT, KS = WTM // 16, WTN // 8, BK // 16
  if WTM % 16 or WTN % 16 or BK % 16 or S < 2: raise ValueError(f"a tile configuration the kernel cannot take: {cfg}")
  mma_ty = MMA_TYPE[plan.dtype.name]
  At, Bt = _operand_tile(plan.a, BM, BK), _operand_tile(plan.b, BN, BK)
  A_BYTES, STAGE = BM * BK * 2, (BM * BK + BK * BN) * 2
  M, N, K = plan.M, plan.N, plan.K
  ktiles = -(-K // BK)
  if cfg.raster < 1: raise ValueError(f"a tile configuration the kernel cannot take: {cfg}")

  x = IRText()
  tid = x.v("call i32 @llvm.nvvm.read.ptx.sreg.tid.x()", "tid")
  bx = x.v("call i32 @llvm.nvvm.read.ptx.sreg.ctaid.x()", "bx")   # block column (n)
  by = x.v("call i32 @llvm.nvvm.read.ptx.sreg.ctaid.y()", "by")   # block row (m)
  bx, by = _rastered(x, bx, by, -(-N // BN), -(-M // BM), cfg.raster)
  bz = x.v("call i32 @llvm.nvvm.read.ptx.sreg.ctaid.z()", "bz") if plan.batch else 0
  lane, warp = x.and_(tid, 31), x.lshr(tid, 5)
  wm, wn = x.lshr(warp, log2i(WN)), x.and_(warp, WN - 1)
  g, t = x.lshr(lane, 2), x.and_(lane, 3)
  smem = "%lds" if opencl else "@smem"   # the shared memory's base pointer
  sbase = x.v(f"ptrtoint ptr addrspace(3) {smem} to i32", "sb")
  m0, n0 = x.mul(by, BM), x.mul(bx, BN)
  # the batch ranges' values: blockIdx.z split by their sizes, the last range fastest
  bvals, rest = [], bz
  for size in reversed(plan.batch_sizes):
    bvals.append(x.urem(rest, size))
    rest = x.udiv(rest, size)
  bvals = bvals[::-1]

  def split(flat, rs) -> list:
    """The values of ranges rs (the last fastest) at flat index `flat` of their product."""
    if len(rs) == 1: return [flat]
    out = []
    for r in reversed(rs):
      out.append(x.urem(flat, r.src[0].arg))
      flat = x.udiv(flat, r.src[0].arg)
    return out[::-1]

  gp = [x.v(f"addrspacecast ptr addrspace(1) %g{i} to ptr", "gp") for i in range(nbufs)]
  ptr_args = [f"ptr {p}" for p in gp]

  def batch_offset(op: Operand):
    off = op.base
    for v, s in zip(bvals, op.stride_batch): off = x.add(off, x.mul(x.zext64(v), s, "i64"), "i64")
    return off

  # *** each thread's cp.async chunks: fixed destinations, sources that step along k ***
  def copies(op: Operand, tile: SmemTile, f0, FSIZE: int, slot_off: int, ftile: int):
    """Per chunk of this thread: (shared offset, global element offset at k-tile 0 as i64, element step per
    k-tile, the free index's bound check, the k index at k-tile 0)."""
    out = []
    per = tile.rows * tile.cpr // T
    if per * T != tile.rows * tile.cpr or T % tile.cpr: raise ValueError(f"{tile.rows}x{tile.cpr} chunks for {T} threads")
    row0, chunk = x.lshr(tid, log2i(tile.cpr)), x.and_(tid, tile.cpr - 1)
    boff = batch_offset(op)
    for i in range(per):
      row = x.add(row0, i * (T // tile.cpr))
      dst = x.add(tile.offset(x, row, chunk), slot_off)
      if op.k_contiguous:   # row: the free index; chunk: k in steps of 8
        free, kidx = x.add(f0, row), x.mul(chunk, CHUNK)
        elem = x.add(x.mul(x.zext64(free), op.stride_free, "i64"), x.zext64(kidx), "i64")
      else:                 # row: k; chunk: the free index in steps of 8
        free, kidx = x.add(f0, x.mul(chunk, CHUNK)), row
        elem = x.add(x.mul(x.zext64(kidx), op.stride_k, "i64"), x.zext64(free), "i64")
      # (a free size that whole tiles cover needs no check: f0 + row < f0 + tile <= FSIZE)
      out.append((dst, x.add(elem, boff, "i64"), BK * op.stride_k, True if FSIZE % ftile == 0 else x.lt(free, FSIZE), kidx))
    return out

  def gathers(g: Gather, tile: SmemTile, f0, FSIZE: int, slot_off: int, ftile: int):
    """Per element of the tile this thread computes: (shared offset, free index, its bound check, k in the tile).
    Consecutive threads take consecutive k (a row-major factor's addresses), or consecutive free indices where the
    factor's loads are contiguous that way (Gather.free_fastest)."""
    per = tile.rows * BK // T
    if per * T != tile.rows * BK: raise ValueError(f"a {tile.rows} x {BK} tile for {T} threads")
    out = []
    for i in range(per):
      e = x.add(tid, i * T)
      f, kk = (x.urem(e, tile.rows), x.udiv(e, tile.rows)) if g.free_fastest else (x.udiv(e, BK), x.urem(e, BK))
      dst = x.add(x.add(tile.offset(x, f, x.lshr(kk, 3)), x.mul(x.and_(kk, 7), 2)), slot_off)
      free = x.add(f0, f)
      out.append((dst, free, True if FSIZE % ftile == 0 else x.lt(free, FSIZE), kk))
    return out

  def gather(opnd, elems, kt, slot, fn, free_rs):
    """Compute k-tile `kt` of a gathered factor into the ring slot at `slot`: each element through its loader, 0
    outside the matrix (where the loader is called at index 0 instead, which every factor may read)."""
    for dst, free, free_ok, kk in elems:
      k = x.add(kk, x.mul(kt, BK))
      ok = x.and1(free_ok, True if k_whole else x.lt(k, K))
      if not isinstance(ok, bool):
        free = x.v(f"select i1 {ok}, i32 {free}, i32 0", "s")
        k = x.v(f"select i1 {ok}, i32 {k}, i32 0", "s")
      vals = dict(zip(plan.batch, bvals))
      vals.update(zip(free_rs, split(free, free_rs)))
      vals.update(zip(plan.ks, split(k, plan.ks)))
      args = ptr_args + [f"i64 {x.zext64(vals.get(r, 0))}" for r in (*plan.ranges, *plan.ks)]
      v = x.v(f"call i16 @{fn}({', '.join(args)})", "ld")
      if not isinstance(ok, bool): v = x.v(f"select i1 {ok}, i16 {v}, i16 0", "s")
      elif not ok: v = 0
      p = x.v(f"getelementptr i8, ptr addrspace(3) {smem}, i32 {x.add(slot, dst)}", "sp")
      x.do(f"store i16 {v}, ptr addrspace(3) {p}, align 2")

  a_cp = copies(plan.a, At, m0, M, 0, BM) if isinstance(plan.a, Operand) else gathers(plan.a, At, m0, M, 0, BM)
  b_cp = copies(plan.b, Bt, n0, N, A_BYTES, BN) if isinstance(plan.b, Operand) else gathers(plan.b, Bt, n0, N, A_BYTES, BN)
  k_whole = K % BK == 0   # (every k-tile is whole: no k check)

  def issue(kt, slot):
    """k-tile `kt` of A and B into the ring slot at byte offset `slot`: cp.async copies, or gathered."""
    for cps, opnd, fn, rs in ((a_cp, plan.a, LOAD_A, plan.ms), (b_cp, plan.b, LOAD_B, plan.ns)):
      if isinstance(opnd, Gather):
        gather(opnd, cps, kt, slot, fn, rs)
        continue
      base = f"%g{opnd.slot}"
      for dst, elem, step, free_ok, kidx in cps:
        k = x.add(kidx, x.mul(kt, BK))
        ok = x.and1(free_ok, True if k_whole else x.lt(k, K))
        e = x.add(elem, x.mul(x.zext64(kt), step, "i64"), "i64")
        src = x.gep(base, x.mul(e, 2, "i64"), 1)
        if not isinstance(ok, bool):
          src = x.v(f"select i1 {ok}, ptr addrspace(1) {src}, ptr addrspace(1) {base}", "s")
          n = x.v(f"select i1 {ok}, i32 16, i32 0", "n")
        else: n = 16 if ok else 0
        d = x.add(x.add(sbase, slot), dst)
        x.do(f'call void asm sideeffect "cp.async.cg.shared.global [$0], [$1], 16, $2;", "r,l,r,~{{memory}}"'
             f"(i32 {d}, ptr addrspace(1) {src}, i32 {n})")

  def commit(): x.do('call void asm sideeffect "cp.async.commit_group;", "~{memory}"()')

  # *** each lane's ldmatrix addresses inside a ring slot (see the module doc of the layouts) ***
  # "row16" lanes: lane l reads row (l & 15) of a 16-row block at chunk (l >> 4); "row8" lanes: row
  # (l & 7) + 8 * (l >> 4) at chunk (l >> 3) & 1. Each gives the x4 matrices in the order the mma wants.
  l15, lhi = x.and_(lane, 15), x.lshr(lane, 4)
  r8, c8 = x.add(x.and_(lane, 7), x.shl(lhi, 3)), x.and_(x.lshr(lane, 3), 1)
  wrow, wcol = x.mul(wm, WTM), x.mul(wn, WTN)
  a_ld, b_ld = {}, {}
  for ks in range(KS):
    for mi in range(MT):   # A fragment (16 m x 16 k): non-transposed from [m][k] rows, transposed from [k][m]
      if plan.a.k_contiguous: a_ld[mi, ks] = At.offset(x, x.add(x.add(wrow, mi * 16), l15), x.add(lhi, 2 * ks))
      else: a_ld[mi, ks] = At.offset(x, x.add(r8, ks * 16), x.add(x.lshr(x.add(wrow, mi * 16), 3), c8))
    for p in range(NT // 2):   # two B fragments (16 k x 8 n each): transposed from [k][n] rows, not from [n][k]
      if plan.b.k_contiguous: b_ld[p, ks] = x.add(Bt.offset(x, x.add(x.add(wcol, 16 * p), r8), x.add(c8, 2 * ks)), A_BYTES)
      else: b_ld[p, ks] = x.add(Bt.offset(x, x.add(l15, ks * 16), x.add(x.lshr(x.add(wcol, 16 * p), 3), lhi)), A_BYTES)
  a_trans = "" if plan.a.k_contiguous else ".trans"
  b_trans = ".trans" if not plan.b.k_contiguous else ""

  # *** prologue: the first stages - 1 k-tiles ***
  for s in range(S - 1):
    if s < ktiles: issue(s, s * STAGE)
    commit()   # (always: the group count stays uniform)
  pre_block = x.block
  x.do("br label %loop" if ktiles else "br label %epilogue")

  # *** the loop over k-tiles ***
  NACC = MT * NT * 4
  acc0 = [f"%acc_in{i}" for i in range(NACC)]
  if ktiles:
    x.label("loop")
    phi_at = len(x.lines)
    x.lines.extend([None] * (2 + NACC))
    kt, rs = "%kt", "%rs"
    # tile kt has landed (at most stages - 2 younger groups in flight); the barrier also says every warp is done
    # with tile kt - 1, whose slot the refill below overwrites
    x.do(f'call void asm sideeffect "cp.async.wait_group {S - 2};", "~{{memory}}"()')
    x.do("call void @llvm.nvvm.barrier0()")
    nxt = x.add(kt, S - 1)
    is0 = x.v(f"icmp eq i32 {rs}, 0", "c")
    ws = x.v(f"select i1 {is0}, i32 {(S - 1) * STAGE}, i32 {x.add(rs, -STAGE)}", "ws")
    more_tiles = x.lt(nxt, ktiles)
    x.do(f"br i1 {more_tiles}, label %refill, label %refill_end")
    x.label("refill")
    issue(nxt, ws)
    x.do("br label %refill_end")
    x.label("refill_end")
    commit()
    slot = x.add(sbase, rs)
    new = list(acc0)
    for ks in range(KS):
      afr, bfr = [], [None] * NT
      for mi in range(MT):
        r = x.v(f'call {{i32, i32, i32, i32}} asm sideeffect "ldmatrix.sync.aligned.m8n8.x4{a_trans}.shared.b16 '
                f'{{$0,$1,$2,$3}}, [$4];", "=r,=r,=r,=r,r,~{{memory}}"(i32 {x.add(slot, a_ld[mi, ks])})', "la")
        afr.append([x.v(f"extractvalue {{i32, i32, i32, i32}} {r}, {j}", "a") for j in range(4)])
      for p in range(NT // 2):
        r = x.v(f'call {{i32, i32, i32, i32}} asm sideeffect "ldmatrix.sync.aligned.m8n8.x4{b_trans}.shared.b16 '
                f'{{$0,$1,$2,$3}}, [$4];", "=r,=r,=r,=r,r,~{{memory}}"(i32 {x.add(slot, b_ld[p, ks])})', "lb")
        v = [x.v(f"extractvalue {{i32, i32, i32, i32}} {r}, {j}", "b") for j in range(4)]
        bfr[2 * p], bfr[2 * p + 1] = v[0:2], v[2:4]
      for mi in range(MT):
        for ni in range(NT):
          base = (mi * NT + ni) * 4
          a, b, c = afr[mi], bfr[ni], new[base:base + 4]
          r = x.v(f'call {{float, float, float, float}} asm "mma.sync.aligned.m16n8k16.row.col.f32.{mma_ty}.{mma_ty}'
                  f'.f32 {{$0,$1,$2,$3}}, {{$4,$5,$6,$7}}, {{$8,$9}}, {{$10,$11,$12,$13}};", '
                  f'"=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f"(i32 {a[0]}, i32 {a[1]}, i32 {a[2]}, i32 {a[3]}, '
                  f'i32 {b[0]}, i32 {b[1]}, float {c[0]}, float {c[1]}, float {c[2]}, float {c[3]})', "mma")
          for j in range(4): new[base + j] = x.v(f"extractvalue {{float, float, float, float}} {r}, {j}", "acc")
    kt_next = x.add(kt, 1)
    rs_next0 = x.add(rs, STAGE)
    wrap = x.v(f"icmp eq i32 {rs_next0}, {S * STAGE}", "c")
    rs_next = x.v(f"select i1 {wrap}, i32 0, i32 {rs_next0}", "rs")
    more = x.lt(kt_next, ktiles)
    body_block = x.block
    x.do(f"br i1 {more}, label %loop, label %epilogue")
    x.lines[phi_at] = f"  {kt} = phi i32 [ 0, %{pre_block} ], [ {kt_next}, %{body_block} ]"
    x.lines[phi_at + 1] = f"  {rs} = phi i32 [ 0, %{pre_block} ], [ {rs_next}, %{body_block} ]"
    for i in range(NACC):
      x.lines[phi_at + 2 + i] = f"  {acc0[i]} = phi float [ 0.0, %{pre_block} ], [ {new[i]}, %{body_block} ]"
    last = new
  x.label("epilogue")
  final = last if ktiles else ["0.0"] * NACC   # (the loop's last block is the epilogue's only predecessor)
  x.do('call void asm sideeffect "cp.async.wait_group 0;", "~{memory}"()')   # nothing may fly at exit

  # *** the epilogue: the kernel's store per accumulator (c0, c1 at row g, columns 2t, 2t+1; c2, c3 at row g + 8) ***
  rvals = dict(zip(plan.batch, bvals))
  crow, ccol = x.add(x.add(m0, wrow), g), x.add(x.add(n0, wcol), x.mul(t, 2))
  for mi in range(MT):
    for h8 in range(2):
      m = x.add(crow, mi * 16 + 8 * h8)
      m_ok = True if M % BM == 0 else x.lt(m, M)
      for ni in range(NT):
        rs, accs, oks = [], [], []
        for j in range(2):   # (c0 and c1, or c2 and c3: neighbouring columns, stored as a pair where they can be)
          n = x.add(ccol, ni * 8 + j)
          oks.append(x.i1(x.and1(m_ok, True if N % BN == 0 else x.lt(n, N))))
          rvals.update(zip(plan.ms, split(m, plan.ms)))
          rvals.update(zip(plan.ns, split(n, plan.ns)))
          rs += [f"i64 {x.zext64(rvals[r])}" for r in plan.ranges]
          accs.append(f"float {final[(mi * NT + ni) * 4 + 2 * h8 + j]}")
        x.do(f"call void @{EPILOGUE2}({', '.join(ptr_args + rs + accs)}, i1 {oks[0]}, i1 {oks[1]})")
  x.do("ret void")

  params = ", ".join([f"ptr addrspace(1) noalias %g{i}" for i in range(nbufs)] + ["i64 %n"]
                     + (["ptr addrspace(3) align 16 %lds"] if opencl else []))
  head = [f'target triple = "nvptx64-nvidia-{"nvcl" if opencl else "cuda"}"',
          "" if opencl else "@smem = external addrspace(3) global [0 x i8], align 16",
          "declare i32 @llvm.nvvm.read.ptx.sreg.tid.x()", "declare i32 @llvm.nvvm.read.ptx.sreg.ctaid.x()",
          "declare i32 @llvm.nvvm.read.ptx.sreg.ctaid.y()", "declare i32 @llvm.nvvm.read.ptx.sreg.ctaid.z()",
          "declare void @llvm.nvvm.barrier0()",
          f"define ptx_kernel void @entry({params}) #0 {{", "entry:"]
  tail = ["}", f'attributes #0 = {{ "nvvm.maxntid"="{T}" }}', parts, ""]
  nb = 1
  for s in plan.batch_sizes: nb *= s
  launch = Launch((-(-N // BN), -(-M // BM), nb), T, cfg.smem)
  return "\n".join(head + [line for line in x.lines if line is not None] + tail), launch
