"""Which actions a kernel gets on each device: a small cost model over the kernel's structure and the device's limits.

The analyses are shared: `tile_ranges` finds the two store ranges a register tile spans (rows x columns that
share the reduce loop's loads), on the CPU and on GPUs alike. What differs is sizes: the CPU's tile is as wide as
its vector registers allow and its reduction runs in cache-sized blocks; a GPU's tile is small per work-item,
with a work-group of work-items around it so that neighbouring work-items read neighbouring memory.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from rulec.codegen.opt.actions import Action, OptError
from rulec.codegen.opt.transform import (apply, contiguous_offset, free_ranges, guarded_product, reads_what_it_writes,
                                         stored_sum, tiles)
from rulec.codegen.opt.transform import size as range_size
from rulec.engine.ir.dtypes import dtypes
from rulec.engine.ir.index_expr import evaluate
from rulec.engine.ir.ops import Ops
from rulec.engine.ir.uop import UOp
from rulec.engine.ir.kernel import Kernel

# *** CPU ***
# A register tile is two vector registers wide and UPCAST_ROWS rows: 16 registers of accumulators, which leaves
# the other half of the register file for the broadcast rows and loaded columns. With 8-lane registers (AVX2) that
# is 8 x 16, measured best of 4/8/16 rows x 16/32/64 columns (1024^3 matmul); with 16-lane ones (AVX-512) 8 x 32:
# 6.9 ms against 8.5 for 8 x 16 and 9.0 for 16 x 16 in one run here (numpy 6.2-6.5 ms)
CPU_LANES = 8               # float32 lanes of a vector register, where no CPUTarget says (AVX2)
UPCAST_ROWS = 8
TILE_REGISTERS = 16         # accumulators, in registers: narrower columns get more rows, up to MAX_ROWS
MAX_ROWS = 16
# x @ W.T on the CPU (dot_tile): 4 rows of A by 4 rows of W, each output's sum in vector lanes along the reduction.
# Kernel times here (16-lane registers, 2 threads, medians of 5-7), each with its BLOCK: 1024^3 8.4 ms (8x2: 8.5-8.9),
# 512x3072x768 11.2 (13.5), 512x768x3072 9.3 (9.9), 100x1000x1000 1.09 (1.16), GPT-2's MLP backward x @ W.T with
# gelu's derivative after it 13.5-14.3 (18.9). (Before the blocks and the aligned buffers, 8x2 had measured best.)
# Without the tile (one output per loop, the k loop vectorised) 62-67 ms at 1024^3
DOT_TILE = (4, 4)
MATVEC_ROWS = 4             # ... and a matrix-vector product's rows of the matrix side by side (matvec_tile)
UNSHARED_ROWS = 2           # ... or the rows of one-range sums that share no load
# ... with its columns in blocks whose rows of W fill about this much (BLOCK): W stays in L2 while every row tile
# passes over it, where one output row tile at a time streamed all of W from L3 (1024^3: 12.1-14.5 -> 11.2-11.4 ms
# with 1 MiB, min of 21; 512 KiB 11.2-13.5, 2 MiB 11.7-13.4)
DOT_BLOCK_BYTES = 1 << 20
# ... and a sum longer than DOT_K_BLOCK_OVER in blocks (KBLOCK) of at most DOT_K_BLOCK steps, the vector lanes along the
# block: a 4 x 4 tile's 8 rows of 3072 (96 KiB) overflow L1 and every step read them from L2. Interleaved rounds here
# (2 threads, best of 24): 512 x 3072 x 768 (GPT-2's MLP backward dh @ W1.T) 12.1-12.6 -> 11.2 ms, 512 x 2304 x 768
# 8.7 -> 8.0; a sum of 1024 gained nothing (9.6 -> 9.9) and one of 768 with gelu's derivative after it lost (13.8 -> 16.7)
DOT_K_BLOCK_OVER = 1536
DOT_K_BLOCK = 768
# ... but at most this many lanes where the reduce runs over several ranges (a convolution's channels x kernel
# window): every lane is code of its own, and a 256-lane 3x3 convolution tile doubled rulec demo's compile time of
# its conv block (262 -> 433 ms) for no speed the demo could see
BODY_TILE_LANES = 128
# ... and in a kernel of little work (outputs x reduce length below this): 256 lanes of code cost more to compile
# than they can save in running
SMALL_TILE_WORK = 1 << 25
# ... while a convolution of this much work or more takes the full tile over its several reduce ranges (8x64x56x56
# 3x3, 924M: 32 output x by 8 channels, 7.5 ms against 8.2 for 16 x 16 on 16-lane registers; the 128-lane cap)
BIG_BODY_WORK = 1 << 28
# A range no tile width divides, and no divisor from half the width does either (a prime, 1009; 2 x 509): a tile of
# the full width anyway, the last one overlapping the one before (a ragged UPCAST, transform.py); and columns the
# widest width does not divide take it ragged wherever that computes little more (RAGGED_EARLY_WASTE): 1000^3 with
# 32 x 14 tiles 7.7-8.1 ms against 12.7-13.0 with the 8 x 10 that divide, 1024 x 1024 x 1001 8.3-8.5 against 18.8
# (32 x 8 ragged without KBLOCK), numpy 6.7-7.0
RAGGED_TILES = True
# ... and where the widest width that divides is under half the widest, the widest ragged one computing at most this
# much more: 64 x 784 x 100 (an MLP layer) in 0.16-0.17 ms with 16 columns ragged against 0.22-0.25 with the 4 that
# divide (32 ragged, 28% more: 0.16-0.18)
RAGGED_NARROW_WASTE = 1 / 8
# ... and with 32 vector registers (AVX-512), a big single-range sum (matmul) takes 14 rows of two registers: 28 of
# accumulators, two for the columns' loads and one broadcast. 1024^3 here, 2 threads, fresh inputs for every run as
# bench/kernels.py has them, medians of 21 in 3 processes each: 14 x 32 with blocks of 64 8.9-9.1 ms, of 128 9.3-9.6,
# 8 x 32 with blocks of 64 9.7-9.8 (numpy 7.1-7.6); 16 rows would spill. (The same buffers again and again, blocks of
# 128 ran faster: 7.9-8.7 against 8.7-9.1.)
# Twice the lanes of code: the kernel compiles in 0.54 s against 0.26 (once; then the disk cache has it)
TALL_TILE_ROWS = 14
WIDE_ROW_REGISTERS = 24   # accumulators of a whole-row tile (4 registers by 6 rows; 7 rows, 28 registers, spill)
K_BLOCK_BYTES = 512 << 10   # the block of the second matrix one block of the reduction reads: fits in L2 ...
# ... with 16-lane tiles, twice that (half a core's 2 MiB L2) but blocks of at most 64: RULEC_SEARCH chose 64-long
# blocks over 128 for the 1024^3 matmul in both of two runs here (9.6 against 10.0 ms, 7.9 against 8.8), the block
# loop then re-reading C twice as often; and a wide second matrix wants 64 too, not the 16 a 256 KiB budget gave it:
# 512 x 768 x 3072 (the GPT-2 MLP's first matmul) 11.4 ms in blocks of 16, 10.0 in 64, 11.2 in 128, 11.6 unblocked
# (medians of 7, interleaved); with its gelu epilogue 12.9 -> 11.6
WIDE_K_BLOCK_BYTES = 1 << 20
WIDE_K_BLOCK_MAX = 64
# ... and with 16-lane tiles the loads that step a line or more along the sum (B's rows) prefetched this many steps
# ahead (PREFETCH): the 1024^3 matmul, bench/kernels.py, 3 runs each alternating: 7.45-7.70 ms against 7.74-8.23
# without (numpy 6.7-7.2); 4, 6, 12 and 16 steps ahead within the noise of 8, which a C kernel of the same loops
# measured best (7.72 -> 7.51 ms; 4: 7.53, 16: 7.60)
PREFETCH_AHEAD = 8
# ... and where the output (C) is bigger than a core's L2, the columns run in blocks (BLOCK, outermost) of at most
# COL_BLOCK_BYTES of output, the reduction in longer blocks within them (COL_BLOCK_K_BYTES of B's block, at most
# COL_BLOCK_K_MAX steps): every KBLOCK pass re-read and re-stored all of C from L3 before; now one block's C stays in L2
# across its passes. Interleaved rounds here (2 threads, best of 24 runs each): 512 x 768 x 3072 10.2 -> 9.5 ms, 1024^3
# 8.15 -> 7.73-7.86, 768 x 512 x 3072 9.85 -> 9.18; 512 x 3072 x 768 (C 1.5 MiB) is not blocked (9.0 -> 9.6 when it was)
COL_BLOCK_OVER = 2 << 20
COL_BLOCK_BYTES = 1 << 20
COL_BLOCK_K_BYTES = 512 << 10
COL_BLOCK_K_MAX = 256

def _online_tile(k: Kernel, end: UOp) -> list[Action]:
  """A kernel that sums with a running max (attention as one kernel, rules/online.rules): the innermost store range
  (attention's head dimension) whole in lanes up to ONLINE_COLUMNS, so that each row's scores and exponentials are
  computed once per step for all of it, by ONLINE_ROWS rows of the range before it (rows of queries); the scores'
  dot product (a sum of products over one range inside the running sum, contiguous along it) in vector lanes
  (SIMD); then the threads. Nothing splits the running sum's own range (transform.RANGE_ACTIONS). At B2 H12 T256
  D64 on a 2-core Xeon, one thread: 64 x 4 with SIMD runs in 14 ms, 64 x 8 with SIMD in 17, 64 x 8 without in 31,
  64 x 4 without in 50, 16 x 8 without in 112."""
  rs = list(end.src[1:])
  out: list[Action] = []
  _, row = _online_ranges(end)
  if (cols := _online_columns(k, end, "CPU")) is not None: out.append(cols)
  if row is not None and (n := row.src[0].arg) > 1 and (rows := divisor_at_most(n, ONLINE_ROWS)) > 1:
    out.append(Action("UPCAST", row.arg[0], rows))
  running = {u.src[1] for u in end.toposort() if u.op is Ops.RUNMAX}
  dots = [u.src[1] for u in end.toposort() if u.op is Ops.REDUCE and u.arg is Ops.ADD and len(u.src) == 2
          and u.src[0].op is Ops.MUL and u.src[1] not in running and u.src[1].src[0].arg >= ONLINE_SIMD_MIN]
  simd = [Action("SIMD", r.arg[0]) for r in dict.fromkeys(dots)][:1]
  if simd and _applies(k, "CPU", *out, *simd): out += simd
  out.append(Action("THREAD", rs[0].arg[0]))
  return out if _applies(k, "CPU", *out) else [Action("THREAD", rs[0].arg[0])]


ONLINE_COLUMNS, ONLINE_ROWS, ONLINE_SIMD_MIN = 64, 4, 16


def _online_ranges(end: UOp) -> tuple[UOp | None, UOp | None]:
  """(columns, rows) of a kernel that sums with a running max, among its store ranges: the innermost one the scores
  do not depend on (attention's head dimension, v's columns), and the innermost one they depend on that no load
  along the running range does (the query rows: k and v are read along it, q is not). In attention stored as
  (B, T, H, D), as a GPT-2 block merges its heads, these are D and T, not the last two."""
  run = next((u for u in end.toposort() if u.op is Ops.RUNMAX), None)
  if run is None: return None, None
  rs, scores, r = list(end.src[1:]), set(run.src[0].toposort()), run.src[1]
  along = set().union(*(set(u.src[1].toposort()) for u in end.toposort() if u.op is Ops.INDEX and len(u.src) == 2 and r in u.src[1].toposort()))
  cols = [x for x in rs if x not in scores]
  rows = [x for x in rs if x in scores and x not in along]
  return (cols[-1] if cols else None), (rows[-1] if rows else None)


def _online_columns(k: Kernel, end: UOp, device: str) -> Action | None:
  """UPCAST of the columns of a kernel that sums with a running max (_online_ranges), whole up to ONLINE_COLUMNS;
  where none is free of the scores (heads and head dimension merged into one range, as attention's output
  (B, T, H * D) is stored), the innermost store range split by the largest width under which the scores are the same
  in every lane (64: h = c // 64 is the outer part)."""
  col, _ = _online_ranges(end)
  if col is not None:
    return Action("UPCAST", col.arg[0], divisor_at_most(col.src[0].arg, ONLINE_COLUMNS)) if col.src[0].arg > 1 else None
  x, size = end.src[-1], end.src[-1].src[0].arg
  run = next(u for u in end.toposort() if u.op is Ops.RUNMAX)
  reads = [u.src[1] for u in run.src[0].toposort() if u.op is Ops.INDEX and len(u.src) == 2 and x in u.src[1].toposort()]
  others = {y: y.src[0].arg // 2 for y in k.ranges if y is not x and isinstance(y.src[0].arg, int)}
  for n in range(min(ONLINE_COLUMNS, size), 1, -1):
    if size % n or not _same_in_blocks(reads, x, n, size, others): continue
    if _applies(k, device, act := Action("UPCAST", x.arg[0], n)): return act
  return None


def _same_in_blocks(idxs: list[UOp], x: UOp, n: int, size: int, env: dict) -> bool:
  """Every index in idxs is the same for the n values of x in each block [b * n, b * n + n) (probed in the first,
  a middle and the last block, the other ranges at their middles)."""
  for base in sorted({0, (size // n // 2) * n, size - n}):
    for idx in idxs:
      try: vals = {evaluate(idx, {**env, x: base + i}) for i in range(n)}
      except Exception: return False   # an op the probe cannot evaluate: no claim
      if len(vals) != 1: return False
  return True


# *** OpenCL ***
GROUP_MIN_REDUCE = 32          # a group reduction needs at least this many elements per output ...
GROUP_MAX_OUTPUTS = 1 << 16    # ... and at most this many outputs (beyond, one work-item per output fills the device)
# ... unless each output sums a row of its own at least this long, read along the row (no load shared by outputs,
# which a register tile would share instead): one work-item per row reads rows 4 KiB apart across a warp. H100, a
# GPT-2 block's backward (B8 T1024 H12), the attention gradient's row sums (98,304 rows of 1,024, two sums): 1.21 ms
# so, against 0.21 ms for half as many rows in groups (bench/results/h100-2026-12-06-session25.txt)
GROUP_ROW_MIN = 256
GRID_MIN_PER_GROUP = 64        # a one-pass reduction over several work-groups (GRID): at least this many elements per
                               # work-item of two groups, else one group does it all
SPREAD_MIN_PER_ITEM = 16       # a row per work-group (SPREAD): on the H200, RULEC_SEARCH chose 64 work-items for
                               # 1024-long softmax and layernorm rows over the 128 of 8 per item (resident: 0.028
                               # against 0.035 ms, 0.015 against 0.022; torch 0.022 and 0.044)
VECTOR_MIN_ELEMENTS = 1024     # elements per vector lane below which vector loads do not pay
GPU_TILES = ((8, 8), (8, 4), (4, 4), (2, 4))   # a work-item's register tile on a GPU (rows x columns), largest first ...
GPU_ITEMS_PER_UNIT = 192       # ... the first that leaves at least this many work-items per compute unit
# ... and the largest, whose 168 registers a work-item fit 3 work-groups of 128 on a compute unit, this many (2.5
# groups a unit; fewer leave units a group short): H100, the GPT-2 MLP's weight gradients (768 x 3072 over 4096 steps,
# 288 groups of 8 x 8 tiles for 132 units, 2.2 a unit) 0.58 ms -> 0.51 as 576 groups of 8 x 4
# (bench/results/gpu-2026-12-06-session26.txt). Attention's P @ V and the MLP's second matmul (2.9 a unit) were not
# measured with 8 x 4 and keep 8 x 8
GPU_BIG_TILE_ITEMS_PER_UNIT = 320
GPU_LOCAL = (8, 16)            # work-items of one group along rows and columns (at most)
GPU_STAGE = 16                 # a tile's reduction in blocks of this many, staged in local memory (STAGE); 0: never
# ... and a sum over several ranges with a long innermost one (16 or more) in blocks of GPU_STAGE_ROW of it, the others
# loops around them: the ResNet block's 3x3 weight gradient (N64 C64 56x56, 32 parts of the batch) on the H100
# 2.62 ms -> 1.04 in blocks of 8 (4: 1.16, 7: 1.63, 14: 1.31, 28: 1.49; bench/cl_conv_grad_probe.py)
GPU_STAGE_ROW = 8
# (Not chosen: a tile's 8 columns as two groups of 4 half the work-group's columns apart, where STAGE runs in a ring,
# so that a warp's vector reads of B fall on consecutive banks. On the H100 the 4096^3 matmul went 3.38 -> 3.23 ms
# with it but the GPT-2 MLP's forward and backward 3.81 -> 4.01, one run each; bench/results/
# h100-2026-12-06-session24.txt. RULEC_OPT can ask for it: UPCAST(c,4) LOCAL(c,n) UPCAST(c,2))
GPU_RAGGED = True              # ranges no tile divides (primes) take ragged tiles, work-groups and STAGE blocks
RAGGED_EARLY_WASTE = 1 / 16    # ... a ragged tile before a smaller one that divides, where it computes at most this
                               # much more than the outputs (its overlap)
GPU_STAGE_SEVERAL = False      # ... also a reduction over several ranges (a convolution): slower on the H200 (0.300 ms
# staged at best, 0.211 unstaged: bench/results/h200-cl-2026-12-03-session9-sweep-conv-linear.txt) and on the H100 with
# the taps as loops around blocks of input channels (1.12-1.65 ms against 0.834: bench/results/
# h100-2026-12-06-session25.txt; its copies, shifted by a tap and guarded, are no cp.async chunks), so RULEC_SEARCH only
# (H200, bench/results/h200-cl-2026-12-03-session8-stage.txt, resident: matmul 1024^3 with STAGE(k,16) and 8x16
# work-groups ran 8x4 tiles in 0.079 ms, 4x4 in 0.097, 8x8 in 0.097, torch 0.084; without STAGE 0.19-0.26)


@dataclass(frozen=True)
class CPUTarget:
  """What the CPU's cost model needs of the machine: float32 lanes of a vector register (runtime/cpu_device.py)."""
  lanes: int = CPU_LANES


def column_lanes(lanes: int = CPU_LANES) -> tuple[int, ...]:
  """A CPU tile's column counts, widest first (two registers, one, half of one ... down to 4)."""
  return tuple(n for n in (lanes * 2, lanes, lanes // 2, lanes // 4) if n >= 4)


def _stride(idx: UOp, r: UOp, ranges: list[UOp]) -> int | None:
  """How far idx moves when r steps by one, probed around the middle of every range (None: not evenly). A variable
  (DEFINE_VAR) has no one value: the probe runs with each at its lower bound, its middle and its upper bound, and
  claims a stride only where all of them agree (`r * n` moves by n, whatever n is, in none of them the same)."""
  env = {x: x.src[0].arg // 2 for x in ranges}
  variables = [x for x in idx.toposort() if x.op is Ops.DEFINE_VAR]
  settings = [{v: pick(v.arg[1], v.arg[2]) for v in variables}
              for pick in ((lambda lo, hi: lo), (lambda lo, hi: (lo + hi) // 2), (lambda lo, hi: hi))] if variables else [{}]
  strides = set()
  for at in settings:
    try:
      vals = [evaluate(idx, {**env, **at, r: env[r] + k}) for k in range(3)]
    except Exception: return None   # an op the probe cannot evaluate: no claim
    if vals[2] - vals[1] != vals[1] - vals[0]: return None
    strides.add(vals[1] - vals[0])
  return strides.pop() if len(strides) == 1 else None


def _sole_end(k: Kernel) -> UOp | None:
  return k.ast.src[0] if len(k.ast.src) == 1 and k.ast.src[0].op is Ops.END else None


# An elementwise kernel whose value picks one of several pieces by a small store range (a stack or a cat:
# where(r < 1, a, 0) + where(1 <= r < 2, b, 0) + ..., or by r % 2 where two are interleaved) computes every piece and
# selects, unless that range is in lanes: then each lane's selects are constants and only its own piece is left,
# the pieces sharing their loads. The Winograd transforms (engine/tensor/winograd.py) are such kernels: on this CPU
# the input transform of 8 x 64 x 56 x 56 took 58 ms as a loop, 13 ms with its 16 pieces in lanes.
SELECT_LANES = 16   # at most this many lanes in all


def _range_plus_const(x: UOp, ranges) -> UOp | None:
  """The range of `x` when x is a range r or r + c (a constant): the forms a stack's selects take, shifted."""
  if x in ranges: return x
  if x.op is Ops.ADD and x.src[1].op is Ops.CONST and x.src[0] in ranges: return x.src[0]
  return None


def select_lanes(end: UOp) -> list[Action]:
  """UPCAST of the store ranges (or of their r % m parts) that the value's selects compare with constants, when
  the kernel has no reduce and they take at most SELECT_LANES lanes; else nothing."""
  nodes = end.src[0].toposort()
  if any(u.op is Ops.REDUCE for u in nodes): return []
  store_ranges = {r: i for i, r in enumerate(end.src[1:])}
  # what the selects' conditions compute, in one walk (not a walk per select: a stack of 16 pieces has dozens)
  conditions, stack = set(), [u.src[0] for u in nodes if u.op is Ops.WHERE]
  while stack:
    if (c := stack.pop()) in conditions: continue
    conditions.add(c)
    stack.extend(c.src)
  amounts: dict[UOp, int] = {}
  for c in nodes:
    if c in conditions and c.op is Ops.CMPLT and c.src[1].op is Ops.CONST:
      x = c.src[0]
      if x in store_ranges:
        if range_size(x) <= SELECT_LANES: amounts[x] = range_size(x)   # (a longer one's compare is a bounds guard)
      elif (x.op in (Ops.MOD, Ops.CMOD) and (r := _range_plus_const(x.src[0], store_ranges)) is not None
            and x.src[1].op is Ops.CONST and isinstance(m := x.src[1].arg, int) and m > 1 and range_size(r) % m == 0):
        amounts[r] = min(math.lcm(amounts.get(r, 1), m), range_size(r))
  # the smallest first, while they fit (a padding guard compares a long range too: that one stays a loop)
  chosen, lanes = [], 1
  for r, n in sorted(amounts.items(), key=lambda rn: (rn[1], store_ranges[rn[0]])):
    if n > 1 and lanes * n <= SELECT_LANES: chosen, lanes = chosen + [r], lanes * n
  return [Action("UPCAST", r.arg[0], amounts[r]) for r in sorted(chosen, key=store_ranges.get)]


def divisor_at_most(n: int, most: int, least: int = 1) -> int:
  """The largest divisor of n in [least, most], or 0."""
  return next((d for d in range(min(most, n), least - 1, -1) if n % d == 0), 0)


def tile_ranges(end: UOp, rows_lanes: int, col_lanes: tuple[int, ...] = column_lanes(),
                any_stride: bool = False, cpu: bool = False, ragged: bool = False,
                lanes: int = CPU_LANES) -> tuple[UOp | None, int, UOp | None, int]:
  """(row range, row lanes, column range, column lanes) of a register tile, (None, 0, None, 0) parts where none.

  Pays where a reduction's inner loop reads memory that neighbouring outputs share or that lies side by side
  for them: matmul (rows of A by columns of B) and convolutions (output channels by output x). Columns: the
  store's innermost range, when every load that depends on it reads neighbouring elements for neighbouring lanes
  (the first of `col_lanes` that divides it). Rows: the innermost other store range that those loads do not
  depend on and another load does (its size a multiple of rows_lanes, and larger). No REDUCE may be nested in
  another. `any_stride`: columns whatever their loads' steps (they are read from local memory: STAGE).

  `cpu`, what the CPU renderer also takes (the GPU's tiles keep to the above):
  - a size none of those divides takes its largest divisor up to the widest instead (columns: from 4, 1001 -> 13,
    10 -> 10; rows: from half of rows_lanes, 1001 -> 7), since no tile at all is 10-40 times slower;
  - a row range exactly rows_lanes long, where it is not the outermost store range (that one keeps a loop for the
    threads);
  - reduces nested in others (a max pool's backward: the window's max inside the sum). The digits CNN's conv2
    input gradient is such a kernel: 1.9 -> 0.97 ms with an 8 x 8 tile, the whole train step 6.5 -> 4.7 ms, its
    losses bit for bit the same.

  `ragged`: tiles that do not divide their range may be chosen (the last one overlapping the one before; not for a
  kernel that reads what it writes). On the CPU, the widest columns where that computes little more, and the full
  width where no divisor from half of it divides; on a GPU, a size none of those divides takes them anyway."""
  none = (None, 0, None, 0)
  if len(end.src) < 2: return none
  reduces = [x for x in end.src[0].toposort() if x.op is Ops.REDUCE]
  if not reduces or (not cpu and any(y.op is Ops.REDUCE for x in reduces for y in x.src[0].toposort())): return none
  loads = [x.src[1] for u in reduces for x in u.src[0].toposort() if x.op is Ops.INDEX]
  ranges = [x for x in end.toposort() if x.op is Ops.RANGE]
  col, cols = end.src[-1], 0
  strides = [_stride(i, col, ranges) for i in loads if col in i.toposort()]
  if strides and (any_stride or all(st == 1 for st in strides)):
    n = col.src[0].arg
    cols = col_lanes[0] if n % col_lanes[0] == 0 or (cpu and ragged and _small_overlap(n, col_lanes[0])) else 0
    cols = cols or next((w for w in col_lanes if n % w == 0), 0)
    if cpu and ragged and cols and cols < col_lanes[0] // 2:   # (100 columns: 16 ragged rather than the 4 that divide)
      cols = next((w for w in col_lanes if w > cols and _small_overlap(n, w, RAGGED_NARROW_WASTE)), cols)
    if cpu and ragged and cols and cols < lanes:
      # still part of a register: the widths that fill the fewest register lanes in all, the wider on a tie (56 output
      # x of a convolution: 8 that divide fill 7 half registers, 112 lanes; 32 ragged fill 64 and read each broadcast
      # weight for 4 times the lanes: 11.7 -> 7.5 ms for a 3x3 conv 8x64x56x56 on 16-lane registers)
      cols = min((w for w in col_lanes if w == cols or n > w), key=lambda w: (_register_lanes(n, w, lanes), -w))
    if not cols and cpu: cols = _odd_lanes(n, col_lanes[0], 4, ragged)
    # a range shorter than any width, a convolution's 3 taps (its weight gradient's innermost store range): all of
    # it, beside rows of output channels. 8x64x56x56 3x3's weight gradient: 408 ms without a tile, 94 ms as 8 x 3
    if not cols and cpu and 1 < n < 4: cols = n
    if not cols and ragged and not cpu and n > col_lanes[0]: cols = col_lanes[0]
  if not cols: return none
  row, rows = _tile_row(end, rows_lanes, [i for i in loads if col in i.toposort()], loads, divisor=cpu, exact=cpu,
                        ragged=ragged)
  return row, rows, col, cols


def _register_lanes(n: int, width: int, lanes: int) -> int:
  """Register lanes that tiles of `width` columns over n fill in all (a tile narrower than a register fills one)."""
  return tiles(n, width) * -(-width // lanes) * lanes


def _small_overlap(n: int, lanes: int, waste: float | None = None) -> bool:
  """Whether ragged tiles of `lanes` over n compute at most `waste` (RAGGED_EARLY_WASTE) more than n (1000 in 32s:
  1024)."""
  return n > lanes and tiles(n, lanes) * lanes <= n * (1 + (RAGGED_EARLY_WASTE if waste is None else waste))


def _odd_lanes(n: int, widest: int, least: int, ragged: bool) -> int:
  """Lanes for a CPU tile along a range of n that no tile width divides: its largest divisor from half of `widest`,
  else (`ragged`) `widest` lanes that do not divide it (a ragged UPCAST, its last tile overlapping the one before)
  where n is longer, else its largest divisor from `least`."""
  d = divisor_at_most(n, widest, max(least, widest // 2))
  if d or not ragged: return d or divisor_at_most(n, widest, least)
  return widest if n > widest else divisor_at_most(n, widest, least)


def _tile_row(end: UOp, rows_lanes: int, col_loads: list[UOp], loads: list[UOp], divisor: bool,
              exact: bool, ragged: bool = False) -> tuple[UOp | None, int]:
  """(row range, row lanes) of a tile, or (None, 0): the innermost store range before the columns that the columns'
  loads do not depend on and another load does, longer than rows_lanes (`exact`: as long, where it is not the
  outermost store range), which rows_lanes divides (`divisor`: else as _odd_lanes picks, from 2)."""
  for row in reversed(end.src[1:-1]):
    n = row.src[0].arg
    if n < rows_lanes or n == rows_lanes and not (exact and row is not end.src[1]): continue
    rows = rows_lanes if n % rows_lanes == 0 else (_odd_lanes(n, rows_lanes, 2, ragged) if divisor else
                                                   rows_lanes if ragged and n > rows_lanes else 0)
    if not rows: continue
    if any(row in i.toposort() for i in col_loads) or not any(row in i.toposort() for i in loads): continue
    return row, rows
  return None, 0


def dot_tile(k: Kernel, end: UOp, lanes: int, tile: tuple[int, int] | None = None,
             block_bytes: int | None = None, ragged: bool = False) -> list[Action]:
  """[UPCAST, UPCAST, SIMD, THREAD] for a tile whose loads run along the reduction rather than along the tile (x @ W.T,
  nn.Linear: rows of A by rows of W), where tile_ranges finds no columns: tile[0] rows (a store range one load
  reads and another does not) by tile[1] columns (the innermost store range), each output's float sum over its
  one range in vector lanes (SIMD), every load stepping by one element along it, the columns in blocks whose reads
  of the column-indexed input fill about block_bytes (BLOCK; 0: none); [] where that is not the kernel."""
  red = _sum_along_loads(end)
  if red is None or len(red.src) != 2 or len(end.src) < 3: return []
  kr, (rows, cols) = red.src[1], tile or DOT_TILE
  block_bytes = DOT_BLOCK_BYTES if block_bytes is None else block_bytes
  if kr.src[0].arg < 4 * lanes: return []
  loads = [x.src[1] for x in red.src[0].toposort() if x.op is Ops.INDEX]
  col = end.src[-1]
  col_loads = [i for i in loads if col in i.toposort()]
  if not col_loads: return []
  if col.src[0].arg % cols and not (ragged and col.src[0].arg > cols): cols = 1   # (W's rows one at a time)
  row, r = _tile_row(end, rows, col_loads, loads, divisor=True, exact=False, ragged=ragged)
  if row is None: return []
  acts = [Action("UPCAST", col.arg[0], cols)] if cols > 1 else []
  acts.append(Action("UPCAST", row.arg[0], r))
  acts.append(_dot_k_block(k, acts, kr, lanes) or Action("SIMD", kr.arg[0]))
  if acts[-1].op == "KBLOCK": acts.append(Action("SIMD", _reduce_axis(k, acts)))
  # column tiles per block, where all of them read more than block_bytes: the largest count within it dividing them
  count, per_tile = tiles(col.src[0].arg, cols), cols * kr.src[0].arg * red.dtype.itemsize
  b = divisor_at_most(count, block_bytes // per_tile, 2) if 0 < block_bytes < count * per_tile else 0
  if b >= 2 and cols > 1: acts.append(Action("BLOCK", col.arg[0], b))
  acts.append(Action("THREAD", end.src[1].arg[0]))
  return acts if _applies(k, "CPU", *acts) else []


def _dot_k_block(k: Kernel, tile: list[Action], kr: UOp, lanes: int) -> Action | None:
  """KBLOCK for a dot tile's sum over kr where it is longer than DOT_K_BLOCK_OVER: the largest block of whole vectors
  up to DOT_K_BLOCK that divides it; None where it is short, none divides, or the kernel does not take it."""
  n = kr.src[0].arg
  if n <= DOT_K_BLOCK_OVER: return None
  b = next((d for d in range(DOT_K_BLOCK, 4 * lanes - 1, -lanes) if n % d == 0), 0)
  act = Action("KBLOCK", kr.arg[0], b)
  return act if b and _applies(k, "CPU", *tile, act) else None


def _reduce_axis(k: Kernel, actions: list[Action]) -> int:
  """The axis of the innermost range of k's one sum once `actions` apply (KBLOCK renames the part within a block)."""
  red = next(u for u in apply(k, tuple(actions), "CPU").ast.toposort() if u.op is Ops.REDUCE)
  return red.src[-1].arg[0]


def matvec_tile(k: Kernel, end: UOp, lanes: int, rows: int = MATVEC_ROWS) -> list[Action]:
  """[UPCAST, SIMD.., THREAD] for a matrix-vector product (a decode step's projections, SwiGLU's gate and up in one
  kernel, LLaMA's 32000 x 768 logits): one store range, every sum a float sum over one range whose loads step by one
  along it or do not move with it. `rows` rows of the matrix side by side, each sum in vector lanes, so the vector's
  loads (and what is computed from them, an RMSNorm's scale) serve every row of the tile and several streams of the
  matrix are in flight. 2 threads here, medians of 7-9: the logits 5.0 ms one row at a time (the k loop vectorised),
  3.5 in tiles of 2 to 8; the gate-and-up kernel (2048 x 768, two sums) 0.58 -> 0.48. A sum over several ranges
  runs its innermost in lanes. Where every load moves with the rows (nothing shared: a batchnorm's per-channel sums
  over N x H*W, reading three activations) UNSHARED_ROWS side by side: ResNet's 64 channels over 8 x 3136, 1.5-1.8
  -> 0.65-0.9 ms, one channel at a time against two. [] where that is not the kernel."""
  if len(end.src) != 2: return []
  col = end.src[1]
  reduces = [x for x in end.src[0].toposort() if x.op is Ops.REDUCE]
  if not reduces: return []
  ranges = [x for x in end.toposort() if x.op is Ops.RANGE]
  for red in reduces:
    if (_steps_along(red, ranges) is None or red.src[-1].src[0].arg < 4 * lanes
        or any(x.op is Ops.REDUCE for x in red.src[0].toposort())): return []
  loads = [x.src[1] for x in end.src[0].toposort() if x.op is Ops.INDEX]
  if all(col in i.toposort() for i in loads): rows = UNSHARED_ROWS
  if col.src[0].arg < 2 * rows: return []
  acts = [Action("UPCAST", col.arg[0], rows), *(Action("SIMD", r.src[-1].arg[0]) for r in reduces),
          Action("THREAD", col.arg[0])]
  return acts if _applies(k, "CPU", *acts) else []


def _applies(k: Kernel, device: str, *actions: Action) -> bool:
  """Whether transform.py accepts the actions on k: the structural conditions live there, once."""
  try: apply(k, actions, device)
  except OptError: return False
  return True


def _k_block(k: Kernel, end: UOp, cols: int, nbytes: int = K_BLOCK_BYTES, most: int | None = None) -> int:
  """The block size a register-tiled kernel's reduction runs in (KBLOCK), or 0: the largest power of two whose
  slice of the column-indexed input (block x columns) fits in nbytes, where KBLOCK applies (a float sum over one
  range stored straight into a buffer the sum does not read). A range no power of two from 16 up divides (1001) takes
  its largest divisor from 16 to twice that budget instead (1024 x 1001 x 1024 here: 26 ms unblocked, 8.5-9.9 in
  blocks of 77-143); one with no divisor from 16 (a prime) the power of two, the last block shorter (1009^3: 16.7 ms
  unblocked, 8.2-8.9 in blocks of 64, 7.9-8.5 with PREFETCH; numpy 6.6-7.3). `most` caps a power-of-two block (a divisor block is bounded by the budget alone: 130 runs in
  blocks of 65)."""
  red = stored_sum(end.src[0].src[1])
  if red is None or len(red.src) != 2: return 0
  n = red.src[1].src[0].arg
  most = n if most is None else most
  block = 1
  while block * 2 <= min(n, most) and (block * 2) * cols * red.dtype.itemsize <= nbytes and n % (block * 2) == 0:
    block *= 2
  if block < 16:
    block = divisor_at_most(n, min(n - 1, 2 * nbytes // (cols * red.dtype.itemsize)), 16)
  if block < 16 and n * cols * red.dtype.itemsize > nbytes:
    # no divisor (a prime, 1009) and more than the budget: blocks of the power of two that fits, the last shorter
    block = 16
    while block * 2 < min(n, most + 1) and (block * 2) * cols * red.dtype.itemsize <= nbytes: block *= 2
  return block if 16 <= block < n and _applies(k, "CPU", Action("KBLOCK", red.src[1].arg[0], block)) else 0


def _column_blocks(k: Kernel, end: UOp, tile: list[Action], col: UOp, cols: int) -> Action | None:
  """BLOCK over the column tiles of a register-tiled sum over one range whose output is over COL_BLOCK_OVER bytes: the
  most tiles (a divisor of their count, at least 4) whose columns of every output row fit in COL_BLOCK_BYTES; None
  where the output is small, no such count divides, or the kernel does not take it."""
  red = stored_sum(end.src[0].src[1])
  if red is None or len(red.src) != 2: return None
  outputs = math.prod(r.src[0].arg for r in end.src[1:])
  if outputs * red.dtype.itemsize <= COL_BLOCK_OVER: return None
  rows = outputs // col.src[0].arg
  b = divisor_at_most(tiles(col.src[0].arg, cols), COL_BLOCK_BYTES // (rows * cols * red.dtype.itemsize), 4)
  if not b: return None
  act = Action("BLOCK", col.arg[0], b)
  return act if _applies(k, "CPU", *tile, act) else None


def _sum_along_loads(end: UOp) -> UOp | None:
  """The kernel's one REDUCE when it is a float sum whose every load steps by one element along its innermost range
  or does not move with it (its vector lanes can run along that range: SIMD), else None."""
  reduces = [x for x in end.src[0].toposort() if x.op is Ops.REDUCE]
  if len(reduces) != 1: return None
  return _steps_along(reduces[0], [x for x in end.toposort() if x.op is Ops.RANGE])


def _steps_along(red: UOp, ranges: list[UOp]) -> UOp | None:
  """red when it is a float sum whose every load steps by one element along its innermost range or does not move with
  it (one value for every lane: an RMSNorm's scale), and some load does step; else None."""
  if red.arg is not Ops.ADD or red.dtype not in (dtypes.float32, dtypes.float64): return None
  loads = [x.src[1] for x in red.src[0].toposort() if x.op is Ops.INDEX]
  along = [i for i in loads if red.src[-1] in i.toposort()]
  if not along or any(_stride(i, red.src[-1], ranges) != 1 for i in along): return None
  return red


def _taps_along_rows(k: Kernel, end: UOp, col: UOp, row: UOp, lanes: int) -> list[Action]:
  """A convolution's weight gradient whose sum runs innermost along its images' rows, every load stepping by one
  element there (its input stored padded, store_padded_input): the column taps and UPCAST_ROWS output channels in
  lanes, the sum along the row in vector lanes (SIMD). 8x64x56x56 3x3 here (16-lane registers): 15.8-16.3 ms against
  23.7 for the 3 x 3 taps by 16 channels, whose loads the lanes did not share; [] where that is not the kernel."""
  red = _sum_along_loads(end)
  if red is None or len(red.src) < 3: return []
  inner = red.src[-1]
  if inner.src[0].arg < 2 * lanes: return []
  rows = divisor_at_most(row.src[0].arg, UPCAST_ROWS, 2)
  if not rows: return []
  acts = [Action("UPCAST", col.arg[0], col.src[0].arg), Action("UPCAST", row.arg[0], rows), Action("SIMD", inner.arg[0]),
          Action("THREAD", end.src[1].arg[0])]
  return acts if _applies(k, "CPU", *acts) else []


def _reduce_ranges(end: UOp) -> int:
  return max((len(u.src) - 1 for u in end.src[0].toposort() if u.op is Ops.REDUCE), default=0)


def cpu_actions(k: Kernel, target: CPUTarget | None = None) -> list[Action]:
  """Register tiles (UPCAST rows and columns), a blocked reduction (KBLOCK) and the thread split (THREAD)."""
  lanes = (target or CPUTarget()).lanes
  end = _sole_end(k)
  if end is None: return []
  if any(u.op is Ops.RUNMAX for u in end.toposort()): return _online_tile(k, end)
  if (sel := select_lanes(end)) and _applies(k, "CPU", *sel):
    by_axis = {r.arg[0]: r for r in end.src[1:]}
    whole = {a.axis for a in sel if a.amount == range_size(by_axis[a.axis])}
    outer = next((r.arg[0] for r in end.src[1:] if r.arg[0] not in whole), None)
    return sel + ([Action("THREAD", outer)] if outer is not None and _applies(k, "CPU", *sel, Action("THREAD", outer)) else [])
  if mv := matvec_tile(k, end, lanes): return mv
  # about TILE_REGISTERS registers of accumulators: 8 rows x 2 registers for matmul; 16 output channels x 8 output x
  # for the conv2d workload (56 wide: 8 columns divide it), which runs in 99 ms that way against 218 ms with 8 x 8
  # (RULEC_SEARCH, 8-lane registers)
  accumulators = TILE_REGISTERS * lanes
  work = math.prod(r.src[0].arg for r in end.src[1:]) * max(
    (math.prod(x.src[0].arg for x in u.src[1:]) for u in end.src[0].toposort() if u.op is Ops.REDUCE), default=1)
  if (_reduce_ranges(end) > 1 and work < BIG_BODY_WORK) or work < SMALL_TILE_WORK:
    accumulators = min(accumulators, BODY_TILE_LANES)
  widths = tuple(c for c in column_lanes(lanes) if c * UPCAST_ROWS <= accumulators) or column_lanes(lanes)[-1:]
  ragged = RAGGED_TILES and not reads_what_it_writes(k)
  row, rows, col, cols = tile_ranges(end, UPCAST_ROWS, widths, cpu=True, ragged=ragged, lanes=lanes)
  if col is None:
    dot = dot_tile(k, end, lanes, ragged=ragged)
    if dot: return dot
  if col is not None and cols * UPCAST_ROWS < accumulators:
    wider = tile_ranges(end, min(MAX_ROWS, accumulators // cols), widths, cpu=True, ragged=ragged, lanes=lanes)
    if wider[0] is not None: row, rows, col, cols = wider
  # a big sum over one range with two-register columns on a machine of 32 vector registers: TALL_TILE_ROWS rows, ragged
  # where they do not divide (1024: 74 tiles, the last overlapping the one before)
  if (row is not None and lanes >= 16 and cols == 2 * lanes and _reduce_ranges(end) == 1 and work >= SMALL_TILE_WORK
      and row.src[0].arg > TALL_TILE_ROWS and _applies(k, "CPU", Action("UPCAST", col.arg[0], cols), Action("UPCAST", row.arg[0], TALL_TILE_ROWS))):
    rows = TALL_TILE_ROWS
  # a row a little wider than two registers that tiles of two would cover raggedly (a convolution's 56 output x: 3.5
  # registers): all of it in lanes, in rows of WIDE_ROW_REGISTERS registers of accumulators (ragged where they do not
  # divide). 8x64x56x56 3x3 on 16-lane registers, medians of 3: forward 7.7 -> 6.8 ms, input gradient 8.6 -> 7.8,
  # with the batchnorm backward's epilogue 12.6 -> 9.2 (the ragged 32-wide tiles' masks split the SLP vectoriser's
  # lanes 8 + 16 + 8 there, 1.5 times the fmas)
  if (row is not None and col is not None and lanes >= 16 and 2 * lanes < col.src[0].arg <= 4 * lanes
      and col.src[0].arg % cols):
    n = col.src[0].arg
    want = WIDE_ROW_REGISTERS // -(-n // lanes)
    want = want if ragged and row.src[0].arg > want else divisor_at_most(row.src[0].arg, want, 2)
    if want and _applies(k, "CPU", Action("UPCAST", col.arg[0], n), Action("UPCAST", row.arg[0], want)):
      cols, rows = n, want
  # a convolution's weight gradient over long rows: its sum along them in vector lanes
  if col is not None and row is not None and cols == col.src[0].arg < 4 and (simd := _taps_along_rows(k, end, col, row, lanes)):
    return simd
  out = []
  if col is not None:
    out.append(Action("UPCAST", col.arg[0], cols))
    # a convolution's weight gradient: its other taps range (3 x 3 in all) in lanes too, every tap reading the same
    # loads of the rows' input: 8x64x56x56's 3x3 weight gradient 52 -> 40 ms (the gradient's realize, this machine)
    taps = end.src[-2] if len(end.src) > 3 else None
    if cols == col.src[0].arg < 4 and taps is not None and taps is not row and 1 < taps.src[0].arg < 4 and \
       _applies(k, "CPU", *out, Action("UPCAST", taps.arg[0], taps.src[0].arg)):
      out.append(Action("UPCAST", taps.arg[0], taps.src[0].arg))
  if row is not None:
    out.append(Action("UPCAST", row.arg[0], rows))
    blocked = _column_blocks(k, end, out, col, cols) if lanes >= 16 else None
    if blocked:
      out.append(blocked)
      kb = _k_block(k, end, blocked.amount * cols, COL_BLOCK_K_BYTES, COL_BLOCK_K_MAX)
    else:
      kb = (_k_block(k, end, col.src[0].arg, WIDE_K_BLOCK_BYTES, WIDE_K_BLOCK_MAX) if lanes >= 16
            else _k_block(k, end, col.src[0].arg, K_BLOCK_BYTES))
    if kb:
      k_axis = stored_sum(end.src[0].src[1]).src[1].arg[0]
      out.append(Action("KBLOCK", k_axis, kb))
      if lanes >= 16 and PREFETCH_AHEAD: out.append(Action("PREFETCH", k_axis, PREFETCH_AHEAD))
  out.append(Action("THREAD", end.src[1].arg[0]))   # the outermost store range (its outer part if upcast)
  return out


# *** OpenCL ***

def _group_size(k: Kernel, target) -> int:
  """Work-items per output when the kernel's reductions should be shared by a work-group (few outputs of long
  reductions, where GROUP applies), else 0."""
  top = k.ast.src[0]
  outputs = math.prod(r.src[0].arg for r in (top.src[1:] if top.op is Ops.END else ()))
  reduces = [u for u in top.toposort() if u.op is Ops.REDUCE]
  if not target.group or not reduces: return 0
  size = max(math.prod(r.src[0].arg for r in u.src[1:]) for u in reduces)
  if size < GROUP_MIN_REDUCE: return 0
  if outputs > GROUP_MAX_OUTPUTS and not (size >= GROUP_ROW_MIN and _own_rows(top, reduces)): return 0
  g = 32
  while g * 2 <= target.group and g * 2 * 4 <= size: g *= 2   # at least 4 elements per work-item
  return g if _applies(k, "CL", Action("GROUP", None, g)) else 0


def _own_rows(end: UOp, reduces: list[UOp]) -> bool:
  """Every load of the reductions depends on every store range (no output shares what it reads) and reads
  neighbouring elements along its reduction's innermost range: each output sums a row of its own."""
  if end.op is not Ops.END: return False
  stores = frozenset(end.src[1:])
  for u in reduces:
    for x in u.src[0].toposort():
      if x.op is not Ops.INDEX: continue
      if not stores <= free_ranges(x) or contiguous_offset(x, u.src[-1]) is None: return False
  return True


def _spread(k: Kernel, target) -> list[Action]:
  """[SPREAD(a,n)] for a kernel whose reductions do not depend on one of its store ranges (a row's max and sum
  fused into the softmax that reads them): the innermost such range spread across a work-group of n work-items
  (SPREAD_MIN_PER_ITEM elements each, up to the device's group size), the reductions computed once per group; [] if
  none."""
  end = _sole_end(k)
  if end is None or not target.group: return []
  reduces = [u for u in end.src[0].toposort() if u.op is Ops.REDUCE]
  if not reduces: return []
  used = frozenset().union(*(free_ranges(u) for u in reduces))
  r = next((x for x in reversed(end.src[1:]) if x not in used and x.src[0].arg >= 2), None)
  if r is None: return []
  # at least SPREAD_MIN_PER_ITEM elements per work-item, but a warp's 32 where the row has them
  n = 2
  while n * 2 <= target.group and n * 2 * SPREAD_MIN_PER_ITEM <= r.src[0].arg: n *= 2
  while n * 2 <= min(32, target.group, r.src[0].arg): n *= 2
  act = Action("SPREAD", r.arg[0], n)
  return [act] if _applies(k, "CL", act) else []


def _grid(k: Kernel, acts: list[Action], g: int, target) -> list[Action]:
  """[GRID(n)] for a kernel that stores one value of long reductions, on a device with one-pass reductions:
  the most work-groups (up to target.grid, each with GRID_MIN_PER_GROUP elements per work-item) that divide a
  reduce range, where one group would do it all; [] if none."""
  top = k.ast.src[0]
  reduces = [u for u in top.toposort() if u.op is Ops.REDUCE]
  if not getattr(target, "grid", 0) or top.op is not Ops.STORE or not reduces: return []
  total = max(math.prod(r.src[0].arg for r in u.src[1:]) for u in reduces)
  if total < GRID_MIN_PER_GROUP * g * 2: return []
  for n in range(min(target.grid, total // (GRID_MIN_PER_GROUP * g)), 1, -1):
    if _applies(k, "CL", *acts, Action("GRID", None, n)): return [Action("GRID", None, n)]
  return []


def _vector_width(k: Kernel, end: UOp, target) -> int:
  """The target's vector width for an elementwise kernel over one range long enough to pay, where VECTOR applies."""
  n = target.vector
  if not n or len(end.src) != 2 or end.src[1].src[0].arg < n * VECTOR_MIN_ELEMENTS: return 0
  return n if _applies(k, "CL", Action("VECTOR", None, n)) else 0


def _group_side(count: int, most: int, ragged: bool) -> int:
  """Work-items along one side of a work-group over `count` tiles: the largest divisor up to `most`; with `ragged`,
  `most` itself wherever the groups then cover at most RAGGED_EARLY_WASTE more (the last group overlapping the one
  before). H200, resident (bench/results/h200-cl-2026-12-03-session10-stageprobe.txt): 1009^3
  with groups of 16 x 8 work-items 0.084 ms against 0.193 with 11 x 8 (253 column tiles = 11 x 23), torch 0.102."""
  d = divisor_at_most(count, most)
  return most if ragged and d < most and _small_overlap(count, most) else d


def gpu_tile(k: Kernel, tile: tuple[int, int], local: tuple[int, int], target, stage: int = 0,
             several: bool = False, ragged: bool = False, max_waste: float | None = None,
             ragged_groups: bool = False) -> list[Action] | None:
  """A register tile of tile (rows, columns) per work-item in work-groups of at most local (rows, columns) and
  target.tile work-items, its reduction staged in local memory in blocks of `stage` where STAGE applies (a sum
  over one range, matmul; with `several`, also a sum over several ranges, a convolution: not measured on a GPU
  yet, so only RULEC_SEARCH tries it); None where the kernel has no such tile."""
  end = _sole_end(k)
  if end is None: return None
  row, rows, col, cols = tile_ranges(end, tile[0], (tile[1],), ragged=ragged)
  # columns whose loads do not read neighbouring elements (a matmul by a transposed weight, x @ W.T) still make a
  # tile when its blocks are staged: the lanes read them from local memory
  staged_only = stage and (row is None or col is None)
  if staged_only: row, rows, col, cols = tile_ranges(end, tile[0], (tile[1],), any_stride=True, ragged=ragged)
  if row is None or col is None: return None
  # (work-groups ragged wherever they may be, even over tiles that divide: 1018 rows in tiles of 2 leave 509, which
  # nothing from 4 to 8 divides)
  lc = _group_side(tiles(col.src[0].arg, cols), local[1], ragged_groups)
  lr = _group_side(tiles(row.src[0].arg, rows), min(local[0], target.tile // max(lc, 1)), ragged_groups)
  if max_waste is not None:   # what the work-groups cover beyond the outputs, along each side
    for r, lanes, items in ((row, rows, max(lr, 1)), (col, cols, max(lc, 1))):
      if tiles(tiles(r.src[0].arg, lanes), items) * items * lanes > r.src[0].arg * (1 + max_waste): return None
  out = [Action("UPCAST", row.arg[0], rows), Action("UPCAST", col.arg[0], cols)]
  if lc > 1: out.append(Action("LOCAL", col.arg[0], lc))
  if lr > 1: out.append(Action("LOCAL", row.arg[0], lr))
  reduces = [x for x in end.src[0].toposort() if x.op is Ops.REDUCE]
  if stage and len(reduces) == 1 and (several or len(reduces[0].src) == 2):   # (an epilogue after the sum is fine)
    # blocks of `stage` along the sum's outermost range, or smaller ones where those need more local memory than
    # there is (a convolution's block holds its window taps too)
    halves = [stage >> i for i in range(stage.bit_length()) if stage >> i >= 2]
    # a sum no power of two from 4 divides (1023, 781): its largest divisor up to `stage`, before blocks of 2 or 3
    # k-steps between barriers (x @ W.T unstaged reads W's rows across the lanes: 4.48 ms against 0.084 staged for
    # 1024^3 on the H200)
    total = reduces[0].src[1].src[0].arg
    odd = divisor_at_most(total, stage, 2)
    # ... but with GPU_RAGGED, blocks of `stage` that do not divide the sum come before any smaller ones (the steps
    # after the last whole block then a sum of their own): 1024 x 1023 x 1024 in 0.088 ms against 0.209 in blocks of
    # 11, 1000 x 781 x 500 0.125 against 0.139, 2048 x 4099 x 512 0.33 against 6.0 unstaged (H200, resident)
    blocks = [stage] if total % stage == 0 or (GPU_RAGGED and total > stage) else []
    blocks += [b for b in halves if b >= 4 and total % b == 0] + ([odd] if odd else [])
    blocks += [b for b in halves if b < 4 and total % b == 0]
    for n in dict.fromkeys(blocks):
      act = Action("STAGE", reduces[0].src[1].arg[0], n)
      if _applies(k, "CL", *out, act): return out + [act]
  return None if staged_only else out


def cl_actions(k: Kernel, target) -> list[Action]:
  """Work-group reductions (GROUP) for few outputs with long reductions, vector loads for contiguous
  elementwise kernels (VECTOR), and on GPUs (target.tile) register tiles inside 2-D work-groups for
  matmul-shaped kernels (UPCAST rows and columns, LOCAL over what is left of each)."""
  if len(k.ast.src) != 1: return []
  if any(u.op is Ops.RUNMAX for u in k.ast.toposort()): return _cl_online(k, target)
  if (spread := _spread(k, target)): return spread
  g = _group_size(k, target)
  if g:
    # with vector loads where the reduction reads contiguous elements (the device's vector width): more bytes in
    # flight per load instruction
    group, vector = Action("GROUP", None, g), Action("VECTOR", None, target.vector)
    acts = [group, vector] if target.vector and _applies(k, "CL", group, vector) else [group]
    # one value of a long reduction: several work-groups in one launch (with vector loads if a split allows them)
    return next((a + grid for a in (acts, [group]) if (grid := _grid(k, a, g, target))), acts)
  end = _sole_end(k)
  if end is None: return []
  if (sel := select_lanes(end)) and _applies(k, "CL", *sel): return sel
  v = _vector_width(k, end, target)
  if v: return [Action("VECTOR", None, v)]
  if getattr(target, "tile", 0):
    # H200, 1024^3 matmul: 8x8 tiles leave 16K work-items for 132 compute units and run at half the speed of 4x4;
    # the conv2d workload (6.4M outputs) runs fastest with 8x8 (bench/cl_sweep.py)
    outputs = math.prod(r.src[0].arg for r in end.src[1:])
    per_unit = [GPU_BIG_TILE_ITEMS_PER_UNIT] + [GPU_ITEMS_PER_UNIT] * (len(GPU_TILES) - 1)   # (the largest tile first)
    first = next((i for i, ((tr, tc), n) in enumerate(zip(GPU_TILES, per_unit)) if outputs // (tr * tc) >= n * max(1, target.units)),
                 len(GPU_TILES) - 1)
    # the largest tile that fills the device, else smaller ones that apply; a tile that divides the ranges, else the
    # same one ragged before a smaller one (1018 x 1024 x 1024: 2 x 4 tiles that divide took 0.142 ms on the H200,
    # where 8 x 4 ragged ones run about as 1009^3's, 0.084)
    # ... where its overlap is small (RAGGED_EARLY_WASTE: not a 28-wide convolution's 32 columns), else after all
    # the tiles that divide
    # (none of it for a kernel that reads what it writes: an optimizer's update of a weight by its gradient)
    may = GPU_RAGGED and not reads_what_it_writes(k)
    tries = [(tile, ragged, RAGGED_EARLY_WASTE) for tile in GPU_TILES[first:]
             for ragged in ((False, True) if may else (False,))]
    tries += [(tile, True, None) for tile in GPU_TILES[first:]] if may else []
    for tile, ragged, waste in tries:
      acts = gpu_tile(k, tile, GPU_LOCAL, target, GPU_STAGE, GPU_STAGE_SEVERAL, ragged=ragged, max_waste=waste,
                      ragged_groups=may)
      if acts is not None: return _spatial_tile(k, end, acts, target) or acts
    if (acts := _long_sum_tile(k, end)): return acts
  return []


# a convolution's tile of output channels by image columns (output x) as GPU_SPATIAL_TILE rows by columns of the output
# image: each input row a window reads then serves two output rows. H100, the ResNet block's 3x3 convolution (N64 C64
# 56x56): 8 columns 0.834 ms, 2 x 4 0.710 (bench/results/h100-2026-12-06-session25.txt), 2 x 4 in groups of 14 x 8 x 2
# (below) 0.664, 2 x 2 in groups of 28 x 8 0.635 (bench/results/gpu-2026-12-06-session26.txt). Its input gradient,
# whose padding guards each product (where(c, a * b, 0): a select per lane), runs best as GPU_GUARDED_COLUMNS of one
# row: 1.413 ms as 8 columns, 1.337 as 2 x 4, 1.236 as 4; and with GPU_GUARDED_CHANNELS (output channels a work-item,
# and work-items of a group along them) 1.055 where 8 and 8 took 1.107, where the kernel has no epilogue to read
GPU_SPATIAL_TILE = (2, 2)
GPU_GUARDED_COLUMNS = 4
GPU_GUARDED_CHANNELS = (16, 4)
# ... and the work-groups take this many image rows (row pairs) too where the group then holds at most target.tile
# work-items: the forward as 2 x 4 on the H200 0.712 -> 0.665 ms, the input gradient on an H100 1.234 -> 1.105
GPU_SPATIAL_GROUP_ROWS = 2


def _spatial_tile(k: Kernel, end: UOp, acts: list[Action], target) -> list[Action] | None:
  """acts (UPCAST rows, UPCAST columns, LOCAL columns, LOCAL rows: a register tile of channels by image columns)
  with the columns split over the store range outside them, where the kernel sums over several ranges (a
  convolution: channels and taps) and the loads that read the columns read that range too (an image's rows):
  GPU_SPATIAL_TILE image rows by columns a work-item (a guarded sum, GPU_GUARDED_COLUMNS of one row and
  GPU_GUARDED_CHANNELS), work-groups as wide along the columns as target.tile allows, and GPU_SPATIAL_GROUP_ROWS of
  the image's row parts in each where they divide and fit; None where that does not apply."""
  if not GPU_SPATIAL_TILE or len(acts) != 4 or [a.op for a in acts] != ["UPCAST", "UPCAST", "LOCAL", "LOCAL"]: return None
  reduces = [x for x in end.src[0].toposort() if x.op is Ops.REDUCE]
  if len(reduces) != 1 or len(reduces[0].src) < 3: return None
  up_r, up_c, loc_c, loc_r = acts
  if loc_c.axis != up_c.axis or loc_r.axis != up_r.axis: return None
  guarded = guarded_product(reduces[0].src[0])
  h, w = (1, GPU_GUARDED_COLUMNS) if guarded else GPU_SPATIAL_TILE
  if up_c.amount < h * w: return None
  store = list(end.src[1:])
  at = next((i for i, r in enumerate(store) if r.arg[0] == up_c.axis), None)
  if not at or store[at - 1].arg[0] == up_r.axis or store[at - 1].src[0].arg % h: return None
  outer, col = store[at - 1], store[at]
  loads = [x.src[1] for x in reduces[0].src[0].toposort() if x.op is Ops.INDEX]
  if not any(col in i.toposort() and outer in i.toposort() for i in loads): return None
  rows = next(r for r in store if r.arg[0] == up_r.axis)
  lanes, items = up_r.amount, loc_r.amount
  # (only where the kernel reads its two operands alone: with the batchnorm backward before it as its epilogue (7
  # more buffers) the 16 channels took 1.614 ms where 8 took 1.22, H100)
  if guarded and len(k.bufs) == 3 and rows.src[0].arg % GPU_GUARDED_CHANNELS[0] == 0:
    lanes, most = GPU_GUARDED_CHANNELS
    items = divisor_at_most(rows.src[0].arg // lanes, most)
  lc = divisor_at_most(tiles(col.src[0].arg, w), max(1, target.tile // items))
  split = [Action("UPCAST", outer.arg[0], h)] if h > 1 else []
  out = [Action("UPCAST", up_r.axis, lanes), *split, Action("UPCAST", col.arg[0], w), Action("LOCAL", col.arg[0], lc)]
  out += [Action("LOCAL", up_r.axis, items)] if items > 1 else []
  g = GPU_SPATIAL_GROUP_ROWS
  if g > 1 and outer.src[0].arg // h % g == 0 and lc * items * g <= target.tile and \
     _applies(k, "CL", *out, Action("LOCAL", outer.arg[0], g)):
    out.append(Action("LOCAL", outer.arg[0], g))
  return out if lc > 1 and _applies(k, "CL", *out) else None


# a long sum with no column tile (its innermost store range too short: a convolution's weight gradient, whose taps are
# innermost): LONG_SUM_TILE lanes of a store range one load reads by those of another that a second load reads,
# unstaged, in work-groups of LONG_SUM_GROUP. H200, the ResNet block's 3x3 weight gradient (N64 C64 56x56, 8 partial
# sums of 25088 steps each): 5.23 ms against 7.43 untiled; 4 x 4, 8 x 4, 8 x 8 and tiles over the taps 6.6-62 ms
# (bench/results/h200-conv-weight-grad-probe-2026-12-05-session20.txt). Staged (GPU_STAGE_ROW) and in 32 parts, on an
# H100: 8 output by 4 input channels a work-item in groups of 8 x 16, 0.779 ms against 1.048 for 4 x 8 in 8 x 8, 0.973
# in 8 x 16, 1.025 for 8 x 8 (bench/results/gpu-2026-12-06-session26.txt)
LONG_SUM_TILE = (8, 4)
LONG_SUM_GROUP = (8, 16)
LONG_SUM_MIN = 4096    # steps of the sum, at least


def _long_sum_tile(k: Kernel, end: UOp) -> list[Action]:
  reduces = [x for x in end.src[0].toposort() if x.op is Ops.REDUCE]
  if len(reduces) != 1 or reduces[0].arg is not Ops.ADD or not reduces[0].dtype.is_float: return []
  if math.prod(r.src[0].arg for r in reduces[0].src[1:]) < LONG_SUM_MIN: return []
  loads = [x.src[1] for x in reduces[0].src[0].toposort() if x.op is Ops.INDEX]
  (rows, cols), (lr, lc) = LONG_SUM_TILE, LONG_SUM_GROUP
  reads = {r: [i for i in loads if r in i.toposort()] for r in end.src[1:]}
  for col in reversed(end.src[1:]):
    if col.src[0].arg % cols or not reads[col] or len(reads[col]) == len(loads): continue
    for row in reversed(end.src[1:]):
      if row is col or row.src[0].arg % rows or not reads[row] or any(i in reads[col] for i in reads[row]): continue
      # work-groups of up to LONG_SUM_GROUP items, as many as divide what the tiles leave
      c, r = divisor_at_most(col.src[0].arg // cols, lc), divisor_at_most(row.src[0].arg // rows, lr)
      acts = [Action("UPCAST", row.arg[0], rows), Action("UPCAST", col.arg[0], cols)] + \
             ([Action("LOCAL", col.arg[0], c)] if c > 1 else []) + ([Action("LOCAL", row.arg[0], r)] if r > 1 else [])
      if not _applies(k, "CL", *acts): return []
      # a sum over several ranges whose innermost is a long row (a weight gradient over images x rows x columns):
      # that row in blocks staged in local memory, the outer sums loops around them
      inner = reduces[0].src[-1]
      if GPU_STAGE_ROW and len(reduces[0].src) > 2 and inner.src[0].arg >= 2 * GPU_STAGE_ROW and \
         _applies(k, "CL", *acts, stage := Action("STAGE", inner.arg[0], GPU_STAGE_ROW)):
        acts.append(stage)
      return acts
  return []


def _cl_online(k: Kernel, target) -> list[Action]:
  """A kernel that sums with a running max (attention as one kernel) on CL: each work-item a row of the output, its
  innermost store range (the head dimension) in lanes up to ONLINE_COLUMNS, so that it computes the row's scores and
  exponentials once per step; on a GPU, work-groups of up to ONLINE_GPU_GROUP rows. Nothing shares or splits the
  running sum (transform.WORKGROUP_ACTIONS, RANGE_ACTIONS). On the H200, B4 H12 S1024 D64: 2.2 ms with 64
  columns by groups of 64 rows, and within 4% of that with 32 or 128 rows, 2 or 4 rows per work-item, or 32 columns
  (bench/results/h200-online-attention-tiles-2026-12-05-session19.txt): not the tile; what would be is staging k and
  v in local memory, which a running sum does not take yet."""
  end = _sole_end(k)
  if end is None: return []
  _, row = _online_ranges(end)
  out: list[Action] = [cols] if (cols := _online_columns(k, end, "CL")) is not None else []
  if getattr(target, "tile", 0) and row is not None and (n := row.src[0].arg) > 1:
    local = out + [Action("LOCAL", row.arg[0], divisor_at_most(n, ONLINE_GPU_GROUP))]
    if _applies(k, "CL", *local): return local
  return out if out and _applies(k, "CL", *out) else []


ONLINE_GPU_GROUP = 64


__all__ = ["CPUTarget", "cl_actions", "column_lanes", "cpu_actions", "gpu_tile", "tile_ranges"]
