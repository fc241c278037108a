"""Tensor-core GEMM probe: LLVM IR text -> PTX (llvmlite NVPTX, sm_90a) -> CUDA driver API (libcuda via ctypes).

Question answered: how fast can a kernel that we write ourselves as LLVM IR run a float16 / bfloat16 matmul
(C = A @ B, all row-major, float32 accumulation, C stored in the input's half type) on an H100/H200's tensor
cores, with no CUDA toolkit, no nvcc and no pycuda at run time?

Kernel (the same shape as the sibling OpenCL probe, so the two paths compare fairly):
  * 256 threads = 8 warps per block, block tile 128 (M) x 128 (N) x 32 (K), grid (N/128, M/128);
  * warps arranged 2 (M) x 4 (N); each warp owns 64 x 32 of C = 4 x 4 tiles of mma.sync.m16n8k16;
  * A and B tiles travel global -> shared with 16-byte cp.async.cg copies into a ring of `stages` buffers,
    so loads for tile k+stages-1 are in flight while tile k is being multiplied;
  * variant `simple`:   fragments read from shared memory with ordinary 32-bit (A) / 16-bit (B) loads;
    variant `ldmatrix`: fragments read with ldmatrix.x4 (A) and ldmatrix.x4.trans (B), on a layout whose
    16-byte chunks are XOR-swizzled so the 8 row addresses of each 8x8 matrix fall in different banks.
    `simple_swz` and `ldmatrix_noswz` flip the swizzle for comparison.

Usage:
  python bench/tc_gemm_cuda.py [--size 4096] [--dtypes f16,bf16] [--variants simple,ldmatrix] [--reps 20]
                               [--check-size 512] [--stages 3] [--ptx-only DIR]
--ptx-only DIR only generates the PTX (no GPU needed) into DIR and, when a `ptxas` binary happens to be on PATH,
assembles it for sm_90a to report registers/spills. --emulate runs the generated IR on the CPU (a small interpreter
below, default 256x256x160) against numpy. With $OUT set, a GPU run also writes each variant's PTX there.
"""
import argparse, ctypes, datetime, os, shutil, subprocess, sys, time, traceback
import numpy as np

# LLVM IR as text: the package's writer (codegen/nvptx_gemm.py, which grew from this probe), plus the `or` the
# probe's packed stores use.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from rulec.codegen.nvptx_gemm import IRText as _IRText, log2i  # noqa: E402


class IRText(_IRText):
  def or_(self, a, b, ty="i32"): return self._bin("or", a, b, ty, lambda x, y: x | y, 0)


class SmemTile:
  """Layout of one row-major tile in shared memory: `rows` rows of `row_bytes`, stored as 16-byte chunks whose
  chunk index is XOR-ed with a function of the row (when swizzled).

  Why this swizzle: ldmatrix (and a warp's fragment loads) read 8 rows at the same logical chunk. Shared memory has
  32 banks of 4 bytes = one 128-byte line; with 64-byte rows (A: 32 halves) rows r and r+2 land on the same banks,
  with 256-byte rows (B: 128 halves) all 8 rows do. XOR-ing the chunk index with bits of the row that change within
  a group of 8 rows puts those 8 chunks in 8 different 16-byte bank groups, i.e. one conflict-free wavefront."""

  def __init__(self, rows, row_bytes, swizzle):
    self.rows, self.row_bytes, self.swizzle = rows, row_bytes, swizzle
    self.cpr = row_bytes // 16                       # 16-byte chunks per row
    assert row_bytes % 16 == 0 and self.cpr & (self.cpr - 1) == 0
    rows_per_line = max(1, 128 // row_bytes)         # rows sharing one 128-byte bank line
    self.sh = log2i(rows_per_line)                   # the row bits above these select the XOR pattern
    self.mask = min(self.cpr, 8) - 1                 # at most 8 distinct chunk positions per line
    self.period = (self.mask + 1) << self.sh         # adding a multiple of this to the row keeps its XOR pattern

  def xor_of_row(self, ir, row):
    if not self.swizzle: return 0
    return ir.and_(ir.lshr(row, self.sh), self.mask)

  def invariant_step(self, rows):
    """True when adding `rows` to any row leaves its swizzle pattern unchanged, so the step can be a constant
    address offset (an immediate in the asm) instead of a fresh XOR."""
    return (not self.swizzle) or rows % self.period == 0

  def offset(self, ir, row, chunk, xor_row=None):
    """Byte offset of (row, logical 16-byte chunk) in this tile; xor_row lets the caller give the row whose
    pattern to use (same as row unless row differs from it by an invariant step)."""
    x = self.xor_of_row(ir, row if xor_row is None else xor_row)
    return ir.add(ir.mul(row, self.row_bytes), ir.mul(ir.xor(chunk, x), 16))


# ----------------------------------------------------------------------------------------------------------------
# The GEMM kernel generator
# ----------------------------------------------------------------------------------------------------------------

DTYPES = {"f16": "f16", "bf16": "bf16"}              # name -> PTX type in the mma instruction
VARIANTS = {                                          # name -> (fragment load method, swizzled smem layout)
  "simple": ("simple", False),
  "simple_swz": ("simple", True),
  "ldmatrix": ("ldmatrix", True),
  "ldmatrix_noswz": ("ldmatrix", False),
}


def gen_gemm_ir(dtype, variant, BM=128, BN=128, BK=32, WM=2, WN=4, stages=3, kernel="gemm"):
  """LLVM IR text for C[M,N] = A[M,K] @ B[K,N], all row-major 16-bit, float32 accumulation.
  Kernel args: (A, B, C: ptr addrspace(1), M, N, K: i32). Launch: grid (N/BN, M/BM), block 32*WM*WN."""
  frag, swizzle = VARIANTS[variant]
  mma_ty = DTYPES[dtype]
  threads = 32 * WM * WN
  WTM, WTN = BM // WM, BN // WN                      # warp tile
  MT, NT = WTM // 16, WTN // 8                       # mma tiles per warp
  KS = BK // 16                                      # mma k-steps per block k-tile
  assert WTM % 16 == 0 and WTN % 16 == 0 and BK % 16 == 0, "warp tile must hold whole 16x16 ldmatrix blocks"
  assert stages >= 2
  At = SmemTile(BM, BK * 2, swizzle)                 # A tile: BM rows (m) of BK halves
  Bt = SmemTile(BK, BN * 2, swizzle)                 # B tile: BK rows (k) of BN halves
  A_BYTES, B_BYTES = BM * BK * 2, BK * BN * 2
  STAGE = A_BYTES + B_BYTES
  SMEM = STAGE * stages
  assert SMEM <= 48 * 1024, f"static shared memory {SMEM} B > 48 KB: use fewer stages or smaller tiles"
  # cp.async work split: each thread copies whole 16-byte chunks; consecutive threads walk along a row
  assert (BM * At.cpr) % threads == 0 and (BK * Bt.cpr) % threads == 0 and threads % At.cpr == 0 \
    and threads % Bt.cpr == 0
  A_CP, B_CP = BM * At.cpr // threads, BK * Bt.cpr // threads   # chunks per thread
  A_RSTEP, B_RSTEP = threads // At.cpr, threads // Bt.cpr       # row distance between a thread's chunks
  # The constant address steps below must not change the XOR pattern (true for every shape these asserts allow).
  assert At.invariant_step(A_RSTEP) and Bt.invariant_step(B_RSTEP)
  assert At.invariant_step(16) and At.invariant_step(8) and Bt.invariant_step(16) and Bt.invariant_step(8)

  ir = IRText()
  L = ir.lines
  # ---- thread coordinates -----------------------------------------------------------------------------------
  tid = ir.v("call i32 @llvm.nvvm.read.ptx.sreg.tid.x()", "tid")
  bx = ir.v("call i32 @llvm.nvvm.read.ptx.sreg.ctaid.x()", "bx")   # block column (N)
  by = ir.v("call i32 @llvm.nvvm.read.ptx.sreg.ctaid.y()", "by")   # block row (M)
  lane = ir.and_(tid, 31)
  warp = ir.lshr(tid, 5)
  wm = ir.lshr(warp, log2i(WN))                      # warp row in the 2 x 4 warp grid
  wn = ir.and_(warp, WN - 1)                         # warp column
  g = ir.lshr(lane, 2)                               # "group" = row of the fragment (0..7)
  t = ir.and_(lane, 3)                               # "thread in group" = column pair (0..3)
  ktiles = ir.lshr("%K", log2i(BK))
  sbase = ir.v("ptrtoint ptr addrspace(3) @smem to i32", "sb")      # shared-window address for the asm

  # ---- per-thread cp.async sources and destinations (fixed for the whole kernel) ------------------------------
  # A: chunk q = tid + i*threads -> row q / cpr, chunk q % cpr; global byte offset ((bm*BM+row)*K + chunk*8)*2.
  a_row = ir.lshr(tid, log2i(At.cpr)); a_chk = ir.and_(tid, At.cpr - 1)
  a_dst = At.offset(ir, a_row, a_chk)
  a_grow = ir.add(ir.mul(by, BM), a_row)
  a_src = []
  for i in range(A_CP):
    e = ir.add(ir.mul(ir.zext64(ir.add(a_grow, i * A_RSTEP)), ir.zext64("%K"), "i64"),
               ir.zext64(ir.mul(a_chk, 8)), "i64")
    a_src.append(ir.gep("%A", ir.mul(e, 2, "i64"), 1))
  # B: chunk q -> k row q / cpr, chunk q % cpr; global byte offset (krow*N + bn*BN + chunk*8)*2.
  b_row = ir.lshr(tid, log2i(Bt.cpr)); b_chk = ir.and_(tid, Bt.cpr - 1)
  b_dst = ir.add(Bt.offset(ir, b_row, b_chk), A_BYTES)
  b_src = []
  for i in range(B_CP):
    e = ir.add(ir.mul(ir.zext64(ir.add(b_row, i * B_RSTEP)), ir.zext64("%N"), "i64"),
               ir.zext64(ir.add(ir.mul(bx, BN), ir.mul(b_chk, 8))), "i64")
    b_src.append(ir.gep("%B", ir.mul(e, 2, "i64"), 1))
  b_ktile_bytes = ir.mul(ir.zext64("%N"), BK * 2, "i64")             # B pointer step per k-tile

  def issue_tile_copy(kt, stage_off):
    """cp.async the A and B k-tile number `kt` into the ring slot at byte offset `stage_off`."""
    kt64 = ir.zext64(kt)
    a_step = ir.mul(kt64, BK * 2, "i64")
    b_step = ir.mul(kt64, b_ktile_bytes, "i64")
    ad = ir.add(ir.add(sbase, stage_off), a_dst)
    bd = ir.add(ir.add(sbase, stage_off), b_dst)
    for i in range(A_CP):
      src = ir.gep(a_src[i], a_step, 1)
      ir.do(f'call void asm sideeffect "cp.async.cg.shared.global [$0+{i * A_RSTEP * At.row_bytes}], [$1], 16;", '
            f'"r,l,~{{memory}}"(i32 {ad}, ptr addrspace(1) {src})')
    for i in range(B_CP):
      src = ir.gep(b_src[i], b_step, 1)
      ir.do(f'call void asm sideeffect "cp.async.cg.shared.global [$0+{i * B_RSTEP * Bt.row_bytes}], [$1], 16;", '
            f'"r,l,~{{memory}}"(i32 {bd}, ptr addrspace(1) {src})')

  def commit():
    ir.do('call void asm sideeffect "cp.async.commit_group;", "~{memory}"()')

  def guarded(cond, label, body):
    """if (cond) body();  -- as two basic blocks."""
    ir.do(f"br i1 {cond}, label %{label}, label %{label}_end")
    ir.label(label); body(); ir.do(f"br label %{label}_end")
    ir.label(f"{label}_end")

  # ---- per-thread fragment read offsets inside one ring slot (lane constants, computed once) ------------------
  wrow = ir.mul(wm, WTM)                              # first A row of this warp inside the block tile
  wchk = ir.mul(wn, WTN // 8)                         # first B 16-byte chunk (8 columns) of this warp
  if frag == "ldmatrix":
    # ldmatrix.x4: lanes 0-7 / 8-15 / 16-23 / 24-31 give the 8 row addresses of matrices 0 / 1 / 2 / 3, and
    # register i of every lane receives matrix i's fragment. Lane l therefore points at row (l & 15) and chunk
    # (l >> 4) of a 16x16 block: for A that yields a0..a3 (rows 0-7/8-15 x k 0-7/8-15) in mma order; for B
    # (k rows, n columns, loaded transposed) it yields b0, b1 of n-tile 2p and b0, b1 of n-tile 2p+1.
    l15 = ir.and_(lane, 15); lhi = ir.lshr(lane, 4)
    a_row_l = ir.add(wrow, l15)
    a_ld = [At.offset(ir, a_row_l, ir.add(lhi, 2 * ks)) for ks in range(KS)]             # + mi*16 rows (imm)
    b_ld = [ir.add(Bt.offset(ir, l15, ir.add(ir.add(wchk, 2 * p), lhi)), A_BYTES)      # + ks*16 rows (imm)
            for p in range(NT // 2)]
  else:
    # Plain loads following the documented m16n8k16 fragment layout (g = lane>>2, t = lane&3):
    #   a0 = A[g][2t,2t+1]  a1 = A[g+8][..]  a2 = A[g][2t+8,2t+9]  a3 = A[g+8][2t+8,..]   (one 32-bit load each)
    #   b0 = B[2t][g] | B[2t+1][g] << 16   b1 = same with k + 8                        (two 16-bit loads each)
    a_row_l = ir.add(wrow, g)
    a_pat = a_row_l                                                  # rows +8, +16*mi share this XOR pattern
    a_ld = [[ir.add(At.offset(ir, a_row_l, 2 * ks + hk, a_pat), ir.mul(t, 4)) for hk in range(2)]
            for ks in range(KS)]
    krow = [ir.add(ir.mul(t, 2), j) for j in range(2)]               # k rows 2t, 2t+1 (+8, +16*ks: invariant)
    b_ld = [[ir.add(ir.add(Bt.offset(ir, krow[j], ir.add(wchk, ni)), ir.mul(g, 2)), A_BYTES) for j in range(2)]
            for ni in range(NT)]

  # ---- prologue: start copies for the first stages-1 k-tiles ---------------------------------------------------
  for s in range(stages - 1):
    c = ir.v(f"icmp ult i32 {s}, {ktiles}", "c")
    guarded(c, f"pro{s}", lambda s=s: issue_tile_copy(s, s * STAGE))
    commit()                                          # always commit, so group counting stays uniform
  pre_block = ir.block
  ir.do("br label %loop")

  # ---- main loop over k-tiles ----------------------------------------------------------------------------------
  ir.label("loop")
  NACC = MT * NT * 4
  phi_at = len(L)
  L.extend([None] * (2 + NACC))                       # phi nodes, filled in once the loop body names exist
  kt, rs = "%kt", "%rs"                               # k-tile index; byte offset of the ring slot it lives in
  acc = [f"%accphi{i}" for i in range(NACC)]
  # Wait until this thread's copies of tile kt are done (at most stages-2 younger groups may still fly), then a
  # barrier makes every thread's copies visible AND guarantees all warps finished tile kt-1, whose slot is reused
  # below for tile kt+stages-1.
  ir.do(f'call void asm sideeffect "cp.async.wait_group {stages - 2};", "~{{memory}}"()')
  ir.do("call void @llvm.nvvm.barrier0()")
  nxt = ir.add(kt, stages - 1)
  is0 = ir.v(f"icmp eq i32 {rs}, 0", "c")
  ws = ir.v(f"select i1 {is0}, i32 {(stages - 1) * STAGE}, i32 {ir.add(rs, -STAGE)}", "ws")   # slot of tile kt-1
  c = ir.v(f"icmp ult i32 {nxt}, {ktiles}", "c")
  guarded(c, "refill", lambda: issue_tile_copy(nxt, ws))
  commit()

  slot = ir.add(sbase, rs)
  new = list(acc)
  for ks in range(KS):
    # -- fragments of this k-step --
    afr, bfr = [], [[None, None] for _ in range(NT)]
    if frag == "ldmatrix":
      aaddr = ir.add(slot, a_ld[ks])
      for mi in range(MT):
        r = ir.v(f'call {{i32, i32, i32, i32}} asm sideeffect "ldmatrix.sync.aligned.m8n8.x4.shared.b16 '
                 f'{{$0,$1,$2,$3}}, [$4+{mi * 16 * At.row_bytes}];", "=r,=r,=r,=r,r,~{{memory}}"(i32 {aaddr})', "la")
        afr.append([ir.v(f"extractvalue {{i32, i32, i32, i32}} {r}, {j}", "a") for j in range(4)])
      for p in range(NT // 2):
        baddr = ir.add(slot, b_ld[p])
        r = ir.v(f'call {{i32, i32, i32, i32}} asm sideeffect "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 '
                 f'{{$0,$1,$2,$3}}, [$4+{ks * 16 * Bt.row_bytes}];", "=r,=r,=r,=r,r,~{{memory}}"(i32 {baddr})', "lb")
        v = [ir.v(f"extractvalue {{i32, i32, i32, i32}} {r}, {j}", "b") for j in range(4)]
        bfr[2 * p], bfr[2 * p + 1] = [v[0], v[1]], [v[2], v[3]]
    else:
      sp = ir.v(f"getelementptr i8, ptr addrspace(3) @smem, i32 {rs}", "sp")
      for mi in range(MT):
        regs = []
        for hk in range(2):                          # k half: a0/a1 (k 0-7) then a2/a3 (k 8-15)
          for h8 in range(2):                        # row half: g or g+8
            p = ir.gep(ir.gep(sp, a_ld[ks][hk], 3), (mi * 16 + 8 * h8) * At.row_bytes, 3)
            regs.append((hk, h8, ir.v(f"load i32, ptr addrspace(3) {p}, align 4", "a")))
        # order a0 = (k lo, row lo), a1 = (k lo, row hi), a2 = (k hi, row lo), a3 = (k hi, row hi)
        afr.append([r for _, _, r in sorted(regs)])
      for ni in range(NT):
        for hb in range(2):                          # b0: k 2t,2t+1   b1: k 2t+8, 2t+9
          halves = []
          for j in range(2):
            p = ir.gep(ir.gep(sp, b_ld[ni][j], 3), (ks * 16 + 8 * hb) * Bt.row_bytes, 3)
            halves.append(ir.v(f"zext i16 {ir.v(f'load i16, ptr addrspace(3) {p}, align 2', 'h')} to i32", "hz"))
          bfr[ni][hb] = ir.or_(halves[0], ir.shl(halves[1], 16))
    # -- the 4 x 4 mma tiles of this warp --
    for mi in range(MT):
      for ni in range(NT):
        base = (mi * NT + ni) * 4
        a, b, cc = afr[mi], bfr[ni], new[base:base + 4]
        r = ir.v(f'call {{float, float, float, float}} asm "mma.sync.aligned.m16n8k16.row.col.f32.{mma_ty}.{mma_ty}'
                 f'.f32 {{$0,$1,$2,$3}}, {{$4,$5,$6,$7}}, {{$8,$9}}, {{$10,$11,$12,$13}};", '
                 f'"=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f"(i32 {a[0]}, i32 {a[1]}, i32 {a[2]}, i32 {a[3]}, '
                 f'i32 {b[0]}, i32 {b[1]}, float {cc[0]}, float {cc[1]}, float {cc[2]}, float {cc[3]})', "mma")
        for j in range(4):
          new[base + j] = ir.v(f"extractvalue {{float, float, float, float}} {r}, {j}", "acc")
  kt_next = ir.add(kt, 1)
  rs_next0 = ir.add(rs, STAGE)
  wrap = ir.v(f"icmp eq i32 {rs_next0}, {stages * STAGE}", "c")
  rs_next = ir.v(f"select i1 {wrap}, i32 0, i32 {rs_next0}", "rs")
  more = ir.v(f"icmp ult i32 {kt_next}, {ktiles}", "c")
  body_block = ir.block
  ir.do(f"br i1 {more}, label %loop, label %epilogue")
  L[phi_at] = f"  {kt} = phi i32 [ 0, %{pre_block} ], [ {kt_next}, %{body_block} ]"
  L[phi_at + 1] = f"  {rs} = phi i32 [ 0, %{pre_block} ], [ {rs_next}, %{body_block} ]"
  for i in range(NACC):
    L[phi_at + 2 + i] = f"  {acc[i]} = phi float [ 0.0, %{pre_block} ], [ {new[i]}, %{body_block} ]"

  # ---- epilogue: round the float32 accumulators to the half type and store two halves per 32-bit store ------------
  ir.label("epilogue")
  ir.do('call void asm sideeffect "cp.async.wait_group 0;", "~{memory}"()')   # nothing may stay in flight at exit

  def to_half_bits(x):
    if dtype == "f16":
      h = ir.v(f"fptrunc float {x} to half", "h")
      return ir.v(f"zext i16 {ir.v(f'bitcast half {h} to i16', 'h')} to i32", "h")
    # bfloat16, round to nearest even on the bit pattern: add 0x7FFF plus the lowest kept bit, drop 16 bits.
    u = ir.v(f"bitcast float {x} to i32", "u")
    return ir.lshr(ir.add(ir.add(u, 0x7FFF), ir.and_(ir.lshr(u, 16), 1)), 16)

  crow = ir.add(ir.add(ir.mul(by, BM), wrow), g)                    # row of c0/c1 in tile (mi=0)
  ccol = ir.add(ir.add(ir.mul(bx, BN), ir.mul(wn, WTN)), ir.mul(t, 2))
  cbase = ir.gep("%C", ir.mul(ir.add(ir.mul(ir.zext64(crow), ir.zext64("%N"), "i64"), ir.zext64(ccol), "i64"), 2,
                              "i64"), 1)
  row_bytes = ir.mul(ir.zext64("%N"), 2, "i64")
  for mi in range(MT):
    for h8 in range(2):                               # c0,c1 at row g; c2,c3 at row g+8
      rp = ir.gep(cbase, ir.mul(row_bytes, mi * 16 + 8 * h8, "i64"), 1)
      for ni in range(NT):
        base = (mi * NT + ni) * 4 + 2 * h8
        lo, hi = to_half_bits(new[base]), to_half_bits(new[base + 1])
        packed = ir.or_(ir.and_(lo, 0xFFFF), ir.shl(hi, 16))
        p = ir.gep(rp, ni * 16, 1)
        ir.do(f"store i32 {packed}, ptr addrspace(1) {p}, align 4")
  ir.do("ret void")

  head = [
    'target triple = "nvptx64-nvidia-cuda"',
    f"@smem = internal addrspace(3) global [{SMEM} x i8] undef, align 16",
    "declare i32 @llvm.nvvm.read.ptx.sreg.tid.x()",
    "declare i32 @llvm.nvvm.read.ptx.sreg.ctaid.x()",
    "declare i32 @llvm.nvvm.read.ptx.sreg.ctaid.y()",
    "declare void @llvm.nvvm.barrier0()",
    f"define ptx_kernel void @{kernel}(ptr addrspace(1) noalias %A, ptr addrspace(1) noalias %B, "
    f"ptr addrspace(1) noalias %C, i32 %M, i32 %N, i32 %K) #0 {{",
    "entry:",
  ]
  tail = ["}", f'attributes #0 = {{ "nvvm.maxntid"="{threads}" }}', ""]
  meta = dict(threads=threads, BM=BM, BN=BN, BK=BK, smem=SMEM, stages=stages)
  return "\n".join(head + L + tail), meta


_TM = None


def ir_to_ptx(ir_text):
  """LLVM IR text -> PTX for sm_90a (the `a` keeps Hopper-only instructions such as wgmma legal)."""
  global _TM
  import llvmlite.binding as llvm
  if _TM is None:
    try: llvm.initialize_all_targets(); llvm.initialize_all_asmprinters()
    except Exception: pass  # older llvmlite initialises in initialize(); newer ones need only these two calls
    _TM = llvm.Target.from_triple("nvptx64-nvidia-cuda").create_target_machine(cpu="sm_90a", features="+ptx80",
                                                                               opt=3)
  mod = llvm.parse_assembly(ir_text)
  mod.data_layout = str(_TM.target_data)
  mod.verify()
  return _TM.emit_assembly(mod)


# ----------------------------------------------------------------------------------------------------------------
# CUDA driver API through ctypes
# ----------------------------------------------------------------------------------------------------------------

class CudaError(RuntimeError):
  pass


class Driver:
  # enum values from cuda.h (stable across driver versions)
  CU_JIT_INFO_LOG_BUFFER, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES = 3, 4
  CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 5, 6
  CU_JIT_LOG_VERBOSE = 12
  CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, CU_FUNC_ATTRIBUTE_NUM_REGS = 1, 3, 4

  def __init__(self, device=0):
    self.lib = ctypes.CDLL("libcuda.so.1")
    P, U, I, S = ctypes.c_void_p, ctypes.c_uint, ctypes.c_int, ctypes.c_size_t
    PP = ctypes.POINTER(ctypes.c_void_p)
    sig = {  # argtypes keep ctypes from truncating 64-bit handles/pointers to int
      "cuInit": [U], "cuDriverGetVersion": [ctypes.POINTER(I)], "cuDeviceGet": [ctypes.POINTER(I), I],
      "cuDeviceGetName": [ctypes.c_char_p, I, I], "cuDevicePrimaryCtxRetain": [PP, I], "cuCtxSetCurrent": [P],
      "cuCtxSynchronize": [],
      "cuModuleLoadDataEx": [PP, P, U, ctypes.POINTER(I), PP], "cuModuleGetFunction": [PP, P, ctypes.c_char_p],
      "cuModuleUnload": [P], "cuFuncGetAttribute": [ctypes.POINTER(I), I, P],
      "cuMemAlloc_v2": [ctypes.POINTER(ctypes.c_uint64), S], "cuMemFree_v2": [ctypes.c_uint64],
      "cuMemcpyHtoD_v2": [ctypes.c_uint64, P, S], "cuMemcpyDtoH_v2": [P, ctypes.c_uint64, S],
      "cuMemsetD8_v2": [ctypes.c_uint64, ctypes.c_ubyte, S],
      "cuLaunchKernel": [P, U, U, U, U, U, U, U, P, PP, PP],
      "cuEventCreate": [PP, U], "cuEventRecord": [P, P], "cuEventSynchronize": [P],
      "cuEventElapsedTime": [ctypes.POINTER(ctypes.c_float), P, P], "cuEventDestroy_v2": [P],
      "cuGetErrorName": [I, ctypes.POINTER(ctypes.c_char_p)], "cuGetErrorString": [I, ctypes.POINTER(ctypes.c_char_p)],
    }
    for name, args in sig.items():
      f = getattr(self.lib, name); f.argtypes = args; f.restype = I
    self.ck("cuInit", 0)
    v = ctypes.c_int(); self.ck("cuDriverGetVersion", ctypes.byref(v)); self.version = v.value
    d = ctypes.c_int(); self.ck("cuDeviceGet", ctypes.byref(d), device); self.dev = d
    name = ctypes.create_string_buffer(256); self.ck("cuDeviceGetName", name, 256, d); self.name = name.value.decode()
    # The primary context is the one the CUDA runtime (and so torch) uses too: both share one context per device.
    self.ctx = ctypes.c_void_p(); self.ck("cuDevicePrimaryCtxRetain", ctypes.byref(self.ctx), d)
    self.ck("cuCtxSetCurrent", self.ctx)

  def ck(self, name, *args):
    r = getattr(self.lib, name)(*args)
    if r != 0:
      n, s = ctypes.c_char_p(), ctypes.c_char_p()
      try:
        self.lib.cuGetErrorName(r, ctypes.byref(n)); self.lib.cuGetErrorString(r, ctypes.byref(s))
      except Exception: pass
      raise CudaError(f"{name} failed: {r} {(n.value or b'?').decode()} ({(s.value or b'').decode()})")

  def load(self, ptx, fname):
    """JIT the PTX; returns (module, function, info_log). The error log goes into the exception on failure."""
    n = 1 << 16
    info, err = ctypes.create_string_buffer(n), ctypes.create_string_buffer(n)
    opts = (ctypes.c_int * 5)(self.CU_JIT_INFO_LOG_BUFFER, self.CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
                              self.CU_JIT_ERROR_LOG_BUFFER, self.CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
                              self.CU_JIT_LOG_VERBOSE)
    # option values are void*; sizes and flags are passed as the pointer value itself
    vals = (ctypes.c_void_p * 5)(ctypes.cast(info, ctypes.c_void_p), ctypes.c_void_p(n),
                                 ctypes.cast(err, ctypes.c_void_p), ctypes.c_void_p(n), ctypes.c_void_p(1))
    mod = ctypes.c_void_p()
    image = ctypes.create_string_buffer(ptx.encode() + b"\0")
    try:
      self.ck("cuModuleLoadDataEx", ctypes.byref(mod), ctypes.cast(image, ctypes.c_void_p), 5, opts, vals)
    except CudaError as e:
      raise CudaError(f"{e}\n--- JIT error log ---\n{err.value.decode(errors='replace')}"
                      f"\n--- JIT info log ---\n{info.value.decode(errors='replace')}") from None
    fn = ctypes.c_void_p(); self.ck("cuModuleGetFunction", ctypes.byref(fn), mod, fname.encode())
    return mod, fn, info.value.decode(errors="replace")

  def attr(self, fn, a):
    v = ctypes.c_int(); self.ck("cuFuncGetAttribute", ctypes.byref(v), a, fn); return v.value

  def alloc(self, nbytes):
    p = ctypes.c_uint64(); self.ck("cuMemAlloc_v2", ctypes.byref(p), nbytes); return p

  def htod(self, dst, arr):
    arr = np.ascontiguousarray(arr); self.ck("cuMemcpyHtoD_v2", dst, arr.ctypes.data_as(ctypes.c_void_p), arr.nbytes)

  def dtoh(self, arr, src):
    self.ck("cuMemcpyDtoH_v2", arr.ctypes.data_as(ctypes.c_void_p), src, arr.nbytes); return arr

  def launch(self, fn, grid, block, args):
    """args: ctypes values; the kernel params array holds a pointer to each value."""
    params = (ctypes.c_void_p * len(args))(*[ctypes.addressof(a) for a in args])
    self.ck("cuLaunchKernel", fn, *grid, *block, 0, None, params, None)

  def event(self):
    e = ctypes.c_void_p(); self.ck("cuEventCreate", ctypes.byref(e), 0); return e


# ----------------------------------------------------------------------------------------------------------------
# Host data: 16-bit bit patterns in uint16 arrays, for both dtypes
# ----------------------------------------------------------------------------------------------------------------

def f32_to_bf16_bits(x):
  """Round float32 to bfloat16 (nearest even) on the bit pattern, as the kernel does."""
  u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
  return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def to_bits(x, dtype):
  if dtype == "f16": return x.astype(np.float16).view(np.uint16)
  try:
    import ml_dtypes
    return x.astype(ml_dtypes.bfloat16).view(np.uint16)
  except ImportError:
    return f32_to_bf16_bits(x)


def from_bits(bits, dtype):
  if dtype == "f16": return bits.view(np.float16).astype(np.float32)
  return (bits.astype(np.uint32) << 16).view(np.float32)


def make_inputs(M, N, K, dtype, seed):
  rng = np.random.default_rng(seed)
  a = to_bits((rng.standard_normal((M, K), dtype=np.float32) * 0.5), dtype)
  b = to_bits((rng.standard_normal((K, N), dtype=np.float32) * 0.5), dtype)
  return a, b


def rel_err(out_bits, a_bits, b_bits, dtype, rows):
  """max |C - ref| / max |ref| over the given rows, ref = float32 matmul of the same half inputs."""
  ref = from_bits(a_bits[rows], dtype) @ from_bits(b_bits, dtype)
  got = from_bits(out_bits[rows], dtype)
  if not np.all(np.isfinite(got)): return float("inf")
  return float(np.max(np.abs(got - ref)) / max(np.max(np.abs(ref)), 1e-30))


def check_rows(M, full_limit=1024, sample=64, seed=1):
  if M <= full_limit: return np.arange(M)
  return np.sort(np.random.default_rng(seed).choice(M, sample, replace=False))


# ----------------------------------------------------------------------------------------------------------------
# CPU emulator of the generated IR (--emulate): checks the kernel's index math, swizzles, fragment layouts and the
# cp.async ring without a GPU. It interprets exactly the instruction subset gen_gemm_ir emits, all threads of a block
# in lockstep (every branch in this kernel is block-uniform; the emulator asserts so). cp.async copies are held back
# until a wait_group retires their group, so reading a ring slot before its copies were waited for, or refilling a
# slot too early, shows up as wrong results. It cannot catch a missing barrier (lockstep hides those).
# ldmatrix / mma follow the PTX ISA's fragment layouts (mma's was checked on hardware by tensor_core_probe.py).
# ----------------------------------------------------------------------------------------------------------------

def _bits_to_f32(bits, dtype):
  bits = np.asarray(bits, np.uint16)
  return bits.view(np.float16).astype(np.float32) if dtype == "f16" else (bits.astype(np.uint32) << 16).view(np.float32)


def emulate(ir_text, meta, dtype, M, N, K, a_bits, b_bits, early_copies=False):
  """early_copies=False lands each cp.async when its group is waited for (catches reads before the wait);
  True lands it at issue (catches a refill that overwrites a ring slot still being read)."""
  import re
  T, W = meta["threads"], meta["threads"] // 32
  body = ir_text.split("\nentry:\n", 1)[1].rsplit("\n}", 1)[0]
  blocks, cur = {"entry": []}, "entry"
  for line in body.splitlines():
    s = line.strip()
    if s.endswith(":") and not s.startswith("%"): cur = s[:-1]; blocks[cur] = []
    elif s: blocks[cur].append(s)
  # global memory as one array of 16-bit words: A, then B, then C (base addresses are byte addresses, nonzero)
  GA = 4096; GB = GA + a_bits.nbytes; GC = GB + b_bits.nbytes
  gmem = np.full((GC + M * N * 2) // 2, 0xFFFF, np.uint16)
  gmem[GA // 2:GB // 2] = a_bits.ravel(); gmem[GB // 2:GC // 2] = b_bits.ravel()
  SHB = 1 << 20                                        # where the emulated shared window starts
  lane = np.arange(T) % 32
  g, t = lane.reshape(W, 32) // 4, lane.reshape(W, 32) % 4
  M32 = 0xFFFFFFFF

  def split_args(s):
    return [a.strip().rsplit(" ", 1) for a in s.split(",") if a.strip()] if s.strip() else []

  for by in range(M // meta["BM"]):
    for bx in range(N // meta["BN"]):
      smem = np.full(meta["smem"] // 2, 0xFFFF, np.uint16)   # NaN bits: reading never-written smem shows up
      groups, open_group = [], []
      env = {"%A": np.full(T, GA, np.int64), "%B": np.full(T, GB, np.int64), "%C": np.full(T, GC, np.int64),
             "%M": np.full(T, M, np.int64), "%N": np.full(T, N, np.int64), "%K": np.full(T, K, np.int64)}

      def val(tok):
        tok = tok.strip()
        if tok.startswith("%"): return env[tok]
        if tok == "@smem": return np.full(T, SHB, np.int64)
        return np.full(T, float(tok), np.float32) if "." in tok else np.full(T, int(tok), np.int64)

      def sh_words(addr, n):                           # word indices of n consecutive 16-bit values at addr
        off = np.asarray(addr, np.int64) - SHB
        assert np.all(off >= 0) and np.all(off % 2 == 0) and np.all(off + 2 * n <= smem.size * 2), "smem out of range"
        return off[..., None] // 2 + np.arange(n)

      def gl_words(addr, n):
        assert np.all(addr >= GA) and np.all(addr % 2 == 0) and np.all(addr + 2 * n <= gmem.size * 2), "global OOB"
        return np.asarray(addr, np.int64)[..., None] // 2 + np.arange(n)

      def retire(keep):
        while len(groups) > keep:
          for dst, src in groups.pop(0): smem[sh_words(dst, 8)] = gmem[gl_words(src, 8)]

      def asm(text, args):
        # operands are read as the asm text names them: $i is output i, or input i - (number of outputs)
        nout = 4 if text.startswith(("ldmatrix", "mma")) else 0
        ref = lambda tok: args[int(tok.strip()[1:]) - nout]
        addrs = [ref(r) + int(i or 0) for r, i in re.findall(r"\[(\$\d+)(?:\+(-?\d+))?\]", text)]
        if text.startswith("cp.async.cg"):
          if early_copies: smem[sh_words(addrs[0], 8)] = gmem[gl_words(addrs[1], 8)]
          else: open_group.append((addrs[0], addrs[1]))
          return None
        if text.startswith("cp.async.commit_group"): groups.append(list(open_group)); open_group.clear(); return None
        if text.startswith("cp.async.wait_group"): retire(int(text.split()[1].rstrip(";"))); return None
        if text.startswith("ldmatrix"):
          rows = smem[sh_words(addrs[0], 8)].reshape(W, 4, 8, 8)     # warp, matrix, row (lane 8i+r), column
          w = np.arange(W)[:, None]
          regs = []
          for i in range(4):
            mat = rows[:, i]
            if ".trans" in text: lo, hi = mat[w, 2 * t, g], mat[w, 2 * t + 1, g]
            else: lo, hi = mat[w, g, 2 * t], mat[w, g, 2 * t + 1]
            regs.append((lo.astype(np.int64) | (hi.astype(np.int64) << 16)).ravel())
          return regs
        if text.startswith("mma.sync"):
          ty = "bf16" if ".bf16" in text else "f16"
          dg, ag, bg, cg = [grp.split(",") for grp in re.findall(r"\{([^}]*)\}", text)]
          assert [x.strip() for x in dg] == ["$0", "$1", "$2", "$3"]
          a, b, c = ([ref(x).reshape(W, 32) for x in grp] for grp in (ag, bg, cg))
          lo = lambda r: _bits_to_f32((r & 0xFFFF).astype(np.uint16), ty)
          hi = lambda r: _bits_to_f32((r >> 16).astype(np.uint16), ty)
          Am, Bm, Cm = np.zeros((W, 16, 16), np.float32), np.zeros((W, 16, 8), np.float32), np.zeros((W, 16, 8), np.float32)
          w = np.arange(W)[:, None]
          for reg, r0, k0 in ((a[0], 0, 0), (a[1], 8, 0), (a[2], 0, 8), (a[3], 8, 8)):
            Am[w, g + r0, 2 * t + k0], Am[w, g + r0, 2 * t + k0 + 1] = lo(reg), hi(reg)
          for reg, k0 in ((b[0], 0), (b[1], 8)):
            Bm[w, 2 * t + k0, g], Bm[w, 2 * t + k0 + 1, g] = lo(reg), hi(reg)
          Cm[w, g, 2 * t], Cm[w, g, 2 * t + 1], Cm[w, g + 8, 2 * t], Cm[w, g + 8, 2 * t + 1] = c
          D = np.matmul(Am, Bm) + Cm
          return [D[w, g, 2 * t].ravel(), D[w, g, 2 * t + 1].ravel(), D[w, g + 8, 2 * t].ravel(),
                  D[w, g + 8, 2 * t + 1].ravel()]
        raise NotImplementedError(text)

      def uniform(c):
        assert np.all(c == c[0]), "divergent branch"
        return bool(c[0])

      prev, cur = None, "entry"
      while True:
        insts = blocks[cur]
        phis = [s for s in insts if " = phi " in s]
        new = {}
        for s in phis:
          name, rest = s.split(" = phi ")
          for v_, lbl in re.findall(r"\[ ([^,]+), %([\w.]+) \]", rest):
            if lbl == prev: new[name] = val(v_)
        env.update(new)
        nxt = None
        for s in insts[len(phis):]:
          if s.startswith("br "):
            m = re.match(r"br i1 (\S+), label %(\S+), label %(\S+)", s)
            nxt = (m.group(2) if uniform(val(m.group(1))) else m.group(3)) if m else s.split("%")[-1]
            break
          if s == "ret void": nxt = "ret"; break
          if s.startswith("store "):
            m = re.match(r"store i32 (\S+), ptr addrspace\(1\) (\S+), align", s)
            v_, p = val(m.group(1)) & M32, val(m.group(2))
            wi = gl_words(p, 2); gmem[wi[:, 0]] = v_ & 0xFFFF; gmem[wi[:, 1]] = v_ >> 16
            continue
          if s.startswith("call void @llvm.nvvm.barrier0"): continue
          name, expr = s.split(" = ", 1) if " = " in s.split('"')[0] else (None, s)
          op = expr.split()[0]
          if op in ("add", "mul", "xor", "or", "and", "shl", "lshr"):
            ty, a, b = re.match(r"\w+ (i32|i64) ([^,]+), (.+)", expr).groups()
            a, b = val(a), val(b)
            r = {"add": a + b, "mul": a * b, "xor": a ^ b, "or": a | b, "and": a & b, "shl": a << b,
                 "lshr": a >> b}[op]
            r = r & M32 if ty == "i32" else r
          elif op == "call":
            if "@llvm.nvvm.read.ptx.sreg" in expr:
              r = {"tid.x": np.arange(T), "ctaid.x": np.full(T, bx), "ctaid.y": np.full(T, by)}[
                expr.split("sreg.")[1].split("(")[0]].astype(np.int64)
            else:
              m = re.search(r'asm (?:sideeffect )?"([^"]*)", "[^"]*"\((.*)\)$', expr)
              r = asm(m.group(1), [val(a[1]) for a in split_args(m.group(2))])
          elif op == "getelementptr":
            base, off = re.match(r"getelementptr i8, ptr addrspace\(\d\) (\S+), i\d+ (\S+)", expr).groups()
            r = val(base) + val(off)
          elif op == "ptrtoint": r = val(expr.split()[3])
          elif op == "zext":
            r = val(expr.split()[2]); r = r.view(np.uint16).astype(np.int64) if r.dtype == np.float16 else r
          elif op == "icmp":
            cc, a, b = re.match(r"icmp (\w+) i32 ([^,]+), (.+)", expr).groups()
            r = (val(a) < val(b)) if cc == "ult" else (val(a) == val(b))
          elif op == "select":
            c, a, b = re.match(r"select i1 (\S+), i32 ([^,]+), i32 (.+)", expr).groups()
            r = np.where(val(c), val(a), val(b)) & M32
          elif op == "extractvalue": r = val(expr.split("} ")[1].split(",")[0])[int(expr.split(",")[-1])]
          elif op == "load":
            ty, p = re.match(r"load (i32|i16), ptr addrspace\(3\) (\S+), align", expr).groups()
            wi = sh_words(val(p), 2 if ty == "i32" else 1)
            r = smem[wi[:, 0]].astype(np.int64) | ((smem[wi[:, 1]].astype(np.int64) << 16) if ty == "i32" else 0)
          elif op == "fptrunc": r = val(expr.split()[2]).astype(np.float16)
          elif op == "bitcast":
            x = val(expr.split()[2])
            r = x.view(np.uint16).astype(np.int64) if x.dtype == np.float16 else x.astype(np.float32).view(np.uint32).astype(np.int64)
          else:
            raise NotImplementedError(s)
          if name: env[name] = r
        if nxt == "ret": break
        prev, cur = cur, nxt
  return gmem[GC // 2:].reshape(M, N).copy()


def emulate_all(args):
  M, N, K = args.emu_size
  bad = 0
  for dtype in args.dtypes:
    a, b = make_inputs(M, N, K, dtype, 0)
    for variant in args.variants:
      t0 = time.time()
      try:
        ir_text, meta = gen_gemm_ir(dtype, variant, stages=args.stages)
        err = max(rel_err(emulate(ir_text, meta, dtype, M, N, K, a, b, early), a, b, dtype, np.arange(M))
                  for early in (False, True))
        ok = err <= 1e-2
      except Exception as e:
        err, ok = f"{type(e).__name__}: {e}", False
        traceback.print_exc(limit=4)
      bad += not ok
      print(f"emulate {dtype:4} {variant:15} {M}x{N}x{K} stages {args.stages}: err {err} "
            f"{'ok' if ok else 'WRONG'} ({time.time() - t0:.1f}s)", flush=True)
  return 1 if bad else 0


# ----------------------------------------------------------------------------------------------------------------
# Runs
# ----------------------------------------------------------------------------------------------------------------

def build(dtype, variant, stages):
  ir_text, meta = gen_gemm_ir(dtype, variant, stages=stages)
  return ir_to_ptx(ir_text), meta


def ptx_stats(ptx):
  return {k: ptx.count(k) for k in ("mma.sync", "ldmatrix", "cp.async.cg", "ld.shared", "bar.sync")}


def run_ptxas(path):
  """Optional local check: assemble with a ptxas binary if one is around (none is needed at run time)."""
  exe = shutil.which("ptxas")
  if exe is None: return "ptxas not on PATH (skipped)"
  r = subprocess.run([exe, "-arch=sm_90a", "-v", "-o", os.devnull, path], capture_output=True, text=True)
  lines = [l.strip() for l in (r.stdout + r.stderr).splitlines() if l.strip()]
  keep = [l for l in lines if "Used" in l or "spill" in l or "error" in l.lower() or "warning" in l.lower()]
  return ("OK: " if r.returncode == 0 else f"FAILED rc={r.returncode}: ") + " | ".join(keep or lines[-3:])


def ptx_only(args):
  os.makedirs(args.ptx_only, exist_ok=True)
  bad = 0
  for dtype in args.dtypes:
    for variant in args.variants:
      name = f"tc_gemm_cuda_{dtype}_{variant}"
      try:
        t0 = time.time()
        ptx, meta = build(dtype, variant, args.stages)
        path = os.path.join(args.ptx_only, name + ".ptx")
        with open(path, "w") as f: f.write(ptx)
        with open(os.path.join(args.ptx_only, name + ".ll"), "w") as f:
          f.write(gen_gemm_ir(dtype, variant, stages=args.stages)[0])
        print(f"{name}: {len(ptx)} chars PTX in {time.time() - t0:.2f}s, smem {meta['smem']} B, {ptx_stats(ptx)}")
        print(f"    {run_ptxas(path)}")
      except Exception as e:
        bad += 1
        print(f"{name}: FAILED {type(e).__name__}: {e}")
  return 1 if bad else 0


def median_ms(drv, fn_launch, reps, warmup=3):
  e0, e1 = drv.event(), drv.event()
  for _ in range(warmup): fn_launch()
  drv.ck("cuCtxSynchronize")
  times = []
  for _ in range(reps):
    drv.ck("cuEventRecord", e0, None); fn_launch(); drv.ck("cuEventRecord", e1, None)
    drv.ck("cuEventSynchronize", e1)
    ms = ctypes.c_float(); drv.ck("cuEventElapsedTime", ctypes.byref(ms), e0, e1); times.append(ms.value)
  drv.ck("cuEventDestroy_v2", e0); drv.ck("cuEventDestroy_v2", e1)
  return float(np.median(times))


def run_gemm(drv, fn, meta, a_bits, b_bits, M, N, K, reps=None):
  """Upload, launch once (checked), optionally time; returns (C bits, ms or None)."""
  dA, dB, dC = drv.alloc(a_bits.nbytes), drv.alloc(b_bits.nbytes), drv.alloc(M * N * 2)
  try:
    drv.htod(dA, a_bits); drv.htod(dB, b_bits)
    drv.ck("cuMemsetD8_v2", dC, 0xFF, M * N * 2)      # NaN pattern: a tile the kernel never writes shows up
    args = [dA, dB, dC, ctypes.c_int(M), ctypes.c_int(N), ctypes.c_int(K)]
    grid, block = (N // meta["BN"], M // meta["BM"], 1), (meta["threads"], 1, 1)
    go = lambda: drv.launch(fn, grid, block, args)
    go(); drv.ck("cuCtxSynchronize")
    out = drv.dtoh(np.empty((M, N), np.uint16), dC)
    ms = median_ms(drv, go, reps) if reps else None
    return out, ms
  finally:
    for p in (dA, dB, dC): drv.lib.cuMemFree_v2(p)   # best effort: a failure here must not hide the real error


def torch_time(a_bits, b_bits, dtype, reps, rows):
  import torch
  tdt = torch.float16 if dtype == "f16" else torch.bfloat16
  A = torch.from_numpy(a_bits.view(np.int16)).cuda().view(tdt)
  B = torch.from_numpy(b_bits.view(np.int16)).cuda().view(tdt)
  for _ in range(3): C = A @ B
  torch.cuda.synchronize()
  times = []
  for _ in range(reps):
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record(); C = A @ B; e1.record(); e1.synchronize(); times.append(e0.elapsed_time(e1))
  out = C.view(torch.int16).cpu().numpy().view(np.uint16)
  return float(np.median(times)), rel_err(out, a_bits, b_bits, dtype, rows)


def gpu_run(args):
  drv = Driver()
  print(f"device: {drv.name}   driver API version: {drv.version}   date: {datetime.datetime.now().isoformat()}")
  S, CS = args.size, args.check_size
  for n in (S, CS):
    assert n % 128 == 0 and n % 32 == 0, f"size {n}: M, N must be multiples of 128 and K of 32"
  flop = 2.0 * S * S * S
  out_dir = os.environ.get("OUT")
  rows = []   # one dict per dtype x variant, printed as the table at the end
  inputs = {}
  for dtype in args.dtypes:
    inputs[dtype] = (make_inputs(CS, CS, CS, dtype, 0), make_inputs(S, S, S, dtype, 1))
    for variant in args.variants:
      name = f"tc_gemm_cuda_{dtype}_{variant}"
      r = dict(dtype=dtype, variant=variant, ms=None, err_check=None, err_full=None, status="ok")
      rows.append(r)
      try:
        ptx, meta = build(dtype, variant, args.stages)
        if out_dir:
          os.makedirs(out_dir, exist_ok=True)
          with open(os.path.join(out_dir, name + ".ptx"), "w") as f: f.write(ptx)
        mod, fn, info = drv.load(ptx, "gemm")
        regs, local, shared = (drv.attr(fn, a) for a in (Driver.CU_FUNC_ATTRIBUTE_NUM_REGS,
                                                         Driver.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES,
                                                         Driver.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES))
        print(f"[{name}] registers {regs}, local (spill) bytes {local}, static shared {shared} B")
        for line in info.strip().splitlines(): print(f"    jit: {line}")
        (ca, cb), (fa, fb) = inputs[dtype]
        out, _ = run_gemm(drv, fn, meta, ca, cb, CS, CS, CS)
        r["err_check"] = rel_err(out, ca, cb, dtype, check_rows(CS))
        out, ms = run_gemm(drv, fn, meta, fa, fb, S, S, S, reps=args.reps)
        r["err_full"] = rel_err(out, fa, fb, dtype, check_rows(S))
        r["ms"] = ms
        if not (r["err_check"] <= 1e-2 and r["err_full"] <= 1e-2): r["status"] = "WRONG"
        drv.ck("cuModuleUnload", mod)
        print(f"[{name}] {ms:.3f} ms, {flop / ms / 1e9:.1f} TFLOP/s, err {r['err_check']:.2e} (check) "
              f"{r['err_full']:.2e} (full) {r['status']}", flush=True)
      except Exception as e:
        r["status"] = f"FAILED: {type(e).__name__}"
        print(f"[{name}] FAILED: {e}", flush=True)
        traceback.print_exc(limit=3)
        if isinstance(e, CudaError) and "ILLEGAL" in str(e):
          print("    (a sticky launch error poisons the context; later variants in this process will fail too)")

  # torch last, in the same (primary) context, so its allocator/cuBLAS set-up cannot disturb our timings
  torch_ms = {}
  try:
    import torch
    assert torch.cuda.is_available(), "torch.cuda not available"
    for dtype in args.dtypes:
      torch_ms[dtype] = torch_time(*inputs[dtype][1], dtype, args.reps, check_rows(S))
  except Exception as e:
    print(f"torch timing skipped: {type(e).__name__}: {e}")
  drv.ck("cuCtxSetCurrent", drv.ctx)

  print()
  print(f"C = A @ B, {S}x{S}x{S}, fp32 accumulation; median of {args.reps} after 3 warm-up; device {drv.name}; "
        f"driver {drv.version}; stages {args.stages}; {datetime.datetime.now():%Y-%m-%d %H:%M}")
  hdr = f"{'dtype':5} {'variant':15} {'ms':>8} {'TFLOP/s':>8} {'torch/ours':>10} {'err@' + str(CS):>10} " \
        f"{'err@' + str(S):>10}  status"
  print(hdr); print("-" * len(hdr))
  fmt = lambda x, f: "-" if x is None else format(x, f)
  for r in rows:
    tm = torch_ms.get(r["dtype"], (None,))[0]
    ratio = tm / r["ms"] if (tm and r["ms"]) else None
    tf = flop / r["ms"] / 1e9 if r["ms"] else None
    print(f"{r['dtype']:5} {r['variant']:15} {fmt(r['ms'], '8.3f')} {fmt(tf, '8.1f')} {fmt(ratio, '10.3f')} "
          f"{fmt(r['err_check'], '10.2e')} {fmt(r['err_full'], '10.2e')}  {r['status']}")
  for dtype, (tm, terr) in torch_ms.items():
    print(f"{dtype:5} {'torch':15} {tm:8.3f} {flop / tm / 1e9:8.1f} {1.0:10.3f} {'-':>10} {terr:10.2e}  "
          f"{'ok' if terr <= 1e-2 else 'WRONG'}")
  return 0 if all(r["status"] == "ok" for r in rows) else 1


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--size", type=int, default=4096)
  ap.add_argument("--dtypes", default="f16,bf16")
  ap.add_argument("--variants", default="simple,ldmatrix", help=f"comma list of {','.join(VARIANTS)}")
  ap.add_argument("--reps", type=int, default=20)
  ap.add_argument("--check-size", type=int, default=512)
  ap.add_argument("--stages", type=int, default=3, help="cp.async ring depth (3 stages = 48 KB static smem)")
  ap.add_argument("--ptx-only", metavar="DIR", help="only write PTX (and .ll) for every dtype/variant into DIR")
  ap.add_argument("--emulate", action="store_true", help="run the generated IR in the CPU emulator (no GPU)")
  ap.add_argument("--emu-size", default="256,256,160", help="M,N,K for --emulate (K=160: the ring wraps)")
  args = ap.parse_args()
  args.dtypes = [d for d in args.dtypes.split(",") if d]
  args.variants = [v for v in args.variants.split(",") if v]
  for d in args.dtypes: assert d in DTYPES, f"unknown dtype {d}"
  for v in args.variants: assert v in VARIANTS, f"unknown variant {v}"
  args.emu_size = [int(x) for x in args.emu_size.split(",")]
  if args.emulate: return emulate_all(args)
  return ptx_only(args) if args.ptx_only else gpu_run(args)


if __name__ == "__main__":
  sys.exit(main())
