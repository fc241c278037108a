"""How fast can NVIDIA's OpenCL (through pyopencl) run a float16 / bfloat16 matmul on the tensor cores?

C = A @ B with A (M x K) and B (K x N) row-major half-precision bits in ushort buffers, float32 accumulation and C
rounded back to the same half type (nearest even). The multiply is Ampere's warp-level `mma.sync.m16n8k16` written as
inline PTX inside OpenCL C (NVIDIA's OpenCL compiler accepts GNU inline asm; see ../shared/research/tensor-cores.md),
fed from a ring of local-memory (.shared) stages filled by 16-byte `cp.async.cg` copies.

One kernel, two ways of reading the mma fragments from local memory:
  simple    32-bit loads of two halves as the fragment layout says (B's two halves come from two k rows: shift + or)
  ldmatrix  `ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16`, four 8x8 matrices per instruction
Both use an XOR swizzle of the 16-byte chunks of every local row (no padding, so 3 stages fit NVIDIA's 48 KB).

Each variant is checked against numpy (float32 matmul of the same half inputs) at --check-size and at the full size
(64 sampled rows there), then timed with OpenCL profiling events beside torch's `A @ B` on CUDA (CUDA events).

Run:   python bench/tc_gemm_cl.py [--size 4096] [--dtypes f16,bf16] [--variants simple,ldmatrix] [--stages 3,2]
                                  [--reps 20] [--check-size 512]
       python bench/tc_gemm_cl.py --list                  the OpenCL platforms and devices
       python bench/tc_gemm_cl.py --dump-source f16,ldmatrix,3   the generated OpenCL C
       python bench/tc_gemm_cl.py --nvcc-check             where a CUDA toolkit is: the PTX assembles for sm_90,
                                                            ptxas's registers and spills (compile check only)
       python bench/tc_gemm_cl.py --emulate --size 256x384x160 --check-size 128
            any OpenCL device (PoCL on a CPU): the PTX pieces are replaced by OpenCL C that does what the PTX manual
            says (warp exchanges through local memory), so the index math, swizzle, ring and epilogue can be checked
            without a GPU. Slow; small sizes only. Not a timing.
With $OUT set, the generated source (.cl) and the PTX the driver produced (.ptx) of each kernel are written there.
"""
from __future__ import annotations

import argparse
import datetime
import os
import re
import statistics
import subprocess
import sys
import time
import traceback

import numpy as np

BM, BN, BK = 128, 128, 32  # work-group tile: 128 rows of C x 128 columns, 32 steps of the sum per stage
WG = 256                   # 8 warps of 32 work-items
CHECK_TOL = 1e-2           # max |ours - ref| / max |ref| above this: WRONG

# ----------------------------------------------------------------------------------------------------------------
# OpenCL C. Python fills @MMA_TYPE@ (f16 or bf16) and the #defines at the top (see kernel_source).
#
# Layouts (m16n8k16; lane = local id & 31, g = lane >> 2, t = lane & 3; a register holds two halves, the lower
# column or k index in the low 16 bits):
#   A fragment (16x16, row-major):  a0 = A[g][2t,2t+1]  a1 = A[g+8][2t,2t+1]  a2 = A[g][2t+8,+9]  a3 = A[g+8][2t+8,+9]
#   B fragment (16x8, B[k][n]):     b0 = B[2t,2t+1][g]  b1 = B[2t+8,2t+9][g]
#   C/D (16x8 float32):             c0,c1 = C[g][2t,2t+1]  c2,c3 = C[g+8][2t,2t+1]
#
# Local memory per stage: A tile 128 x 32 halves (64 bytes a row = 4 chunks of 16 bytes) and B tile 32 x 128 halves
# (256 bytes a row = 16 chunks). The chunk c of row r is stored at chunk position c ^ swizzle(r):
#   A: c ^ ((r >> 1) & 3)   rows r and r+2 are 128 bytes apart, i.e. on the same banks; XOR with r>>1 moves each
#                           pair of rows to other chunks, so the 8 rows one 8x8 ldmatrix reads (or the 8 rows g of
#                           a 32-bit fragment load) cover all 32 banks once.
#   B: c ^ (r & 7)          every row starts on bank 0 (256-byte pitch); XOR with the low 3 bits of k spreads 8
#                           consecutive k rows of one chunk over the 8 chunk positions of a 128-byte line.
# A copy writes whole chunks and a read stays inside one chunk (8 halves, 16-byte aligned), so XOR-ing chunk
# numbers is all the swizzle takes.
# ----------------------------------------------------------------------------------------------------------------
KERNEL = r"""
#define BM 128
#define BN 128
#define BK 32
#define A_STAGE (BM * BK)   /* halves in one stage of A */
#define B_STAGE (BK * BN)   /* halves in one stage of B */

#if EMULATE
#define UNROLL
#else
#define UNROLL _Pragma("unroll")
#endif

/* ---- float32 -> half bits, two at a time (round to nearest even) ---- */
#if DTYPE_BF16
inline uint f2bf(float x) { uint u = as_uint(x); return (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16; }
inline void store2(__global ushort* p, float x, float y) { *(__global uint*)p = f2bf(x) | (f2bf(y) << 16); }
#else
inline void store2(__global ushort* p, float x, float y) { vstore_half2_rte((float2)(x, y), 0, (__global half*)p); }
#endif

#if !EMULATE
/* ---- the PTX pieces ----
   A __local pointer's integer value is its .shared address (as rulec's cp.async does), so shared addresses are
   plain 32-bit integers here: byte offsets are added to them and they go to the asm as "r" operands. */
#define SADDR(p) ((uint)(ulong)(p))

/* 16 bytes global -> local without passing through registers; .cg: cached in L2 only */
inline void cp16(uint dst, __global const ushort* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(dst), "l"(src) : "memory");
}
#define CP_COMMIT() asm volatile("cp.async.commit_group;" ::: "memory")
/* wait until at most N of this work-item's committed groups are still in flight (N must be an immediate) */
#define CP_WAIT(N) asm volatile("cp.async.wait_group " #N ";" ::: "memory")
#define CP_WAIT_(N) CP_WAIT(N)

/* four 8x8 b16 matrices; lane l gives the address of row (l & 7) of matrix (l >> 3); register q of lane l gets
   row (l >> 2), halves 2(l & 3), 2(l & 3)+1 of matrix q (with .trans: of the transposed matrix) */
inline uint4 ldsm_x4(uint addr) {
  uint r0, r1, r2, r3;
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr) : "memory");
  return (uint4)(r0, r1, r2, r3);
}
inline uint4 ldsm_x4_trans(uint addr) {
  uint r0, r1, r2, r3;
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr) : "memory");
  return (uint4)(r0, r1, r2, r3);
}

/* D = A (16x16) * B (16x8) + C, float32 accumulators */
inline float4 mma16816(float4 c, uint4 a, uint2 b) {
  float d0 = c.x, d1 = c.y, d2 = c.z, d3 = c.w;
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.@MMA_TYPE@.@MMA_TYPE@.f32 "
               "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
               : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b.x), "r"(b.y));
  return (float4)(d0, d1, d2, d3);
}

#define EMU_SCRATCH
#define CP16(dst, src) cp16(dst, src)
#define LDSM_X4(addr) ldsm_x4(addr)
#define LDSM_X4_T(addr) ldsm_x4_trans(addr)
#define MMA(c, a, b) mma16816(c, a, b)

#else
/* ---- emulation (any OpenCL device): the same operations in OpenCL C, from the PTX manual's definitions.
   A warp's exchange goes through local scratch between work-group barriers; every work-item of the work-group
   reaches the same calls in the same order, so the barriers are legal. Shared "addresses" are byte offsets from
   the start of the ring. */
#define SADDR(p) ((uint)((__local const uchar*)(p) - (__local const uchar*)smem))
#define CP_COMMIT()
#define CP_WAIT_(N)

inline float h2f(uint h) {
#if DTYPE_BF16
  return as_float(h << 16);
#else
  ushort s = (ushort)h; return vload_half(0, (__private const half*)&s);
#endif
}
inline uint half_of(uint r, uint hi) { return hi ? (r >> 16) : (r & 0xFFFFu); }

inline uint4 emu_ldsm(uint addr, int trans, __local uint* s, uint lane, __local const uchar* base) {
  barrier(CLK_LOCAL_MEM_FENCE);
  s[lane] = addr;                       /* lane l: address of row (l & 7) of matrix (l >> 3) */
  barrier(CLK_LOCAL_MEM_FENCE);
  uint g = lane >> 2, t = lane & 3, r[4];
  for (uint q = 0; q < 4; q++) {
    if (!trans) {                       /* row g, halves 2t, 2t+1 */
      r[q] = *(__local const uint*)(base + s[q * 8 + g] + t * 4);
    } else {                            /* transposed: rows 2t, 2t+1 of the stored matrix, column g */
      uint lo = *(__local const ushort*)(base + s[q * 8 + 2 * t] + g * 2);
      uint hi = *(__local const ushort*)(base + s[q * 8 + 2 * t + 1] + g * 2);
      r[q] = lo | (hi << 16);
    }
  }
  return (uint4)(r[0], r[1], r[2], r[3]);
}

/* the inverse of the fragment layout: which lane, register and half hold A[row][k] and B[k][n] */
inline float4 emu_mma(float4 c, uint4 a, uint2 b, __local uint* s, uint lane) {
  barrier(CLK_LOCAL_MEM_FENCE);
  s[32 + lane * 4 + 0] = a.x; s[32 + lane * 4 + 1] = a.y; s[32 + lane * 4 + 2] = a.z; s[32 + lane * 4 + 3] = a.w;
  s[160 + lane * 2 + 0] = b.x; s[160 + lane * 2 + 1] = b.y;
  barrier(CLK_LOCAL_MEM_FENCE);
  uint g = lane >> 2, t = lane & 3;
  float d[4] = {c.x, c.y, c.z, c.w};
  for (uint i = 0; i < 4; i++) {
    uint row = g + (i >> 1) * 8, n = 2 * t + (i & 1);
    float acc = 0.0f;
    for (uint k = 0; k < 16; k++) {
      uint ra = s[32 + ((row & 7) * 4 + ((k & 7) >> 1)) * 4 + (row >> 3) + (k >> 3) * 2];
      uint rb = s[160 + (n * 4 + ((k & 7) >> 1)) * 2 + (k >> 3)];
      acc += h2f(half_of(ra, k & 1)) * h2f(half_of(rb, k & 1));
    }
    d[i] += acc;
  }
  return (float4)(d[0], d[1], d[2], d[3]);
}

#define EMU_SCRATCH __local uint emu_scratch[8 * 224]; __local uint* emu_s = emu_scratch + warp * 224;
#define CP16(dst, src) (*(__local uint4*)((__local uchar*)smem + (dst)) = vload4(0, (__global const uint*)(src)))
#define LDSM_X4(addr) emu_ldsm(addr, 0, emu_s, lane, (__local const uchar*)smem)
#define LDSM_X4_T(addr) emu_ldsm(addr, 1, emu_s, lane, (__local const uchar*)smem)
#define MMA(c, a, b) emu_mma(c, a, b, emu_s, lane)
#endif

__kernel __attribute__((reqd_work_group_size(256, 1, 1)))
void tc_gemm(__global const ushort* restrict A, __global const ushort* restrict B, __global ushort* restrict C,
             const uint M, const uint N, const uint K) {
  /* the ring: STAGES stages of A, then STAGES stages of B; uint4 keeps every 16-byte chunk aligned */
  __local uint4 smem[STAGES * (A_STAGE + B_STAGE) / 8];
  const uint tid = get_local_id(0), lane = tid & 31, warp = tid >> 5;
  const uint wm = warp >> 2, wn = warp & 3;  /* 2 x 4 warps; warp's tile: rows wm*64 .. +63, columns wn*32 .. +31 */
  const uint g = lane >> 2, t = lane & 3;
  EMU_SCRATCH

  /* Which 128x128 tile of C: launched as (N/128) x (M/128) work-groups, but taken GROUP_M row-blocks at a time,
     column by column, so the work-groups running together share a few row panels of A and the columns of B in L2. */
  const uint gn = N / BN, gm = M / BM;
  const uint pid = get_group_id(1) * gn + get_group_id(0);
  const uint per_group = GROUP_M * gn, first_m = pid / per_group * GROUP_M;
  const uint rows = min(gm - first_m, (uint)GROUP_M);
  const uint bm = first_m + pid % per_group % rows, bn = pid % per_group / rows;

  /* Copies: each stage is 512 chunks of A and 512 of B, so every work-item copies two of each. Destinations are byte
     offsets inside a stage (swizzled as described above); sources advance along K by one stage a step. */
  const uint ring = SADDR(smem);
  uint a_dst[2], b_dst[2];
  __global const ushort* a_src[2];
  __global const ushort* b_src[2];
  UNROLL for (uint i = 0; i < 2; i++) {
    uint e = tid + i * 256;
    uint r = e >> 2, c = e & 3;                 /* A: row r of 128, chunk c of 4 */
    a_dst[i] = (r * BK + ((c ^ ((r >> 1) & 3)) << 3)) * 2;
    a_src[i] = A + (size_t)(bm * BM + r) * K + c * 8;
    uint k = e >> 4, d = e & 15;                /* B: row k of 32, chunk d of 16 */
    b_dst[i] = (k * BN + ((d ^ (k & 7)) << 3)) * 2;
    b_src[i] = B + (size_t)k * N + bn * BN + d * 8;
  }
#define A_AT(s) (ring + (s) * (A_STAGE * 2))
#define B_AT(s) (ring + (STAGES * A_STAGE + (s) * B_STAGE) * 2)
#define LOAD_TILE(kt, s) \
  UNROLL for (uint i = 0; i < 2; i++) { \
    CP16(A_AT(s) + a_dst[i], a_src[i] + (size_t)(kt) * BK); \
    CP16(B_AT(s) + b_dst[i], b_src[i] + (size_t)(kt) * BK * N); \
  }

  float4 acc[4][4];
  UNROLL for (uint mi = 0; mi < 4; mi++)
    UNROLL for (uint ni = 0; ni < 4; ni++) acc[mi][ni] = (float4)(0.0f);

  /* The ring. Before the loop, tiles 0 .. STAGES-2 are in flight, one commit group each. At step kt: wait until
     this work-item's group kt has landed (at most STAGES-2 younger groups still in flight), then a barrier: every
     work-item's copies of tile kt are visible, and everybody is done reading the stage read at step kt-1, which is
     the one refilled now with tile kt+STAGES-1. One barrier per step. A group is committed every step even when
     there is nothing left to load, so the counting in wait_group stays the same to the end. */
  const uint KT = K / BK;
  UNROLL for (uint s = 0; s < STAGES - 1; s++) {
    if (s < KT) { LOAD_TILE(s, s) }
    CP_COMMIT();
  }
  uint rd = 0, wr = STAGES - 1;
  for (uint kt = 0; kt < KT; kt++) {
    CP_WAIT_(WAIT_N);
    barrier(CLK_LOCAL_MEM_FENCE);
    if (kt + STAGES - 1 < KT) { LOAD_TILE(kt + STAGES - 1, wr) }
    CP_COMMIT();

    UNROLL for (uint kk = 0; kk < BK / 16; kk++) {   /* two k16 steps per stage */
      uint4 af[4];   /* the warp's 4 row tiles of 16 */
      uint2 bf[4];   /* its 4 column tiles of 8 */
#if VARIANT_LDMATRIX
      /* A, one x4 per 16x16 tile: matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15),
         (rows 8-15, k 8-15) are a0..a3. Lane l points at row (l & 15) of the tile, chunk 2kk + (l >> 4). */
      UNROLL for (uint mi = 0; mi < 4; mi++) {
        uint r = wm * 64 + mi * 16 + (lane & 15), c = kk * 2 + (lane >> 4);
        af[mi] = LDSM_X4(A_AT(rd) + (r * BK + ((c ^ ((r >> 1) & 3)) << 3)) * 2);
      }
      /* B is [k][n] in local memory; an 8x8 matrix of rows k, columns n loaded with .trans gives lane (g, t) the
         halves [k = 2t, 2t+1][n = g]: exactly b0 (k 0-7) or b1 (k 8-15). One x4 covers two column tiles of 8:
         matrices (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15). */
      UNROLL for (uint nj = 0; nj < 2; nj++) {
        uint k = kk * 16 + (lane & 15), c = wn * 4 + nj * 2 + (lane >> 4);
        uint4 v = LDSM_X4_T(B_AT(rd) + (k * BN + ((c ^ (k & 7)) << 3)) * 2);
        bf[2 * nj] = (uint2)(v.x, v.y);
        bf[2 * nj + 1] = (uint2)(v.z, v.w);
      }
#else
      __local const ushort* As = (__local const ushort*)smem + rd * A_STAGE;
      __local const ushort* Bs = (__local const ushort*)smem + STAGES * A_STAGE + rd * B_STAGE;
      /* A: 32-bit loads. Rows g and g+8 of a tile have the same swizzle ((r >> 1) & 3 only sees g), k 2t, 2t+1 sit
         in chunk 2kk (a0, a1) and 2kk+1 (a2, a3) at half 2t. */
      const uint sa = (g >> 1) & 3;
      UNROLL for (uint mi = 0; mi < 4; mi++) {
        uint r = wm * 64 + mi * 16 + g;
        uint c0 = (((kk * 2) ^ sa) << 3) + 2 * t, c1 = (((kk * 2 + 1) ^ sa) << 3) + 2 * t;
        af[mi] = (uint4)(*(__local const uint*)(As + r * BK + c0), *(__local const uint*)(As + (r + 8) * BK + c0),
                         *(__local const uint*)(As + r * BK + c1), *(__local const uint*)(As + (r + 8) * BK + c1));
      }
      /* B: column n = wn*32 + ni*8 + g is half g of chunk wn*4 + ni; b0 packs rows k0, k0+1 (k0 = 16kk + 2t), b1
         rows k0+8, k0+9 (same swizzle as k0, k0+1: only k & 7 counts). */
      const uint k0 = kk * 16 + 2 * t;
      UNROLL for (uint ni = 0; ni < 4; ni++) {
        uint c = wn * 4 + ni;
        uint o0 = k0 * BN + ((c ^ (k0 & 7)) << 3) + g, o1 = (k0 + 1) * BN + ((c ^ ((k0 + 1) & 7)) << 3) + g;
        bf[ni] = (uint2)((uint)Bs[o0] | ((uint)Bs[o1] << 16),
                         (uint)Bs[o0 + 8 * BN] | ((uint)Bs[o1 + 8 * BN] << 16));
      }
#endif
      UNROLL for (uint mi = 0; mi < 4; mi++)
        UNROLL for (uint ni = 0; ni < 4; ni++) acc[mi][ni] = MMA(acc[mi][ni], af[mi], bf[ni]);
    }
    rd = rd + 1 == STAGES ? 0 : rd + 1;
    wr = wr + 1 == STAGES ? 0 : wr + 1;
  }
  CP_WAIT_(0);   /* nothing real is left in flight (the last groups are empty), but leave none behind */

  /* C: lane (g, t) holds rows g and g+8, columns 2t, 2t+1 of each 16x8 tile: one 32-bit store per pair */
  UNROLL for (uint mi = 0; mi < 4; mi++)
    UNROLL for (uint ni = 0; ni < 4; ni++) {
      uint r = bm * BM + wm * 64 + mi * 16 + g, c = bn * BN + wn * 32 + ni * 8 + 2 * t;
      store2(C + (size_t)r * N + c, acc[mi][ni].x, acc[mi][ni].y);
      store2(C + (size_t)(r + 8) * N + c, acc[mi][ni].z, acc[mi][ni].w);
    }
}
"""


def kernel_source(dtype: str, variant: str, stages: int, emulate: bool, group_m: int = 8) -> str:
  assert dtype in ("f16", "bf16") and variant in ("simple", "ldmatrix") and stages in (2, 3, 4)
  head = (f"/* tc_gemm: dtype {dtype}, variant {variant}, {stages} stages{', EMULATED' if emulate else ''} */\n"
          f"#define DTYPE_BF16 {int(dtype == 'bf16')}\n#define VARIANT_LDMATRIX {int(variant == 'ldmatrix')}\n"
          f"#define STAGES {stages}\n#define WAIT_N {stages - 2}\n#define GROUP_M {group_m}\n"
          f"#define EMULATE {int(emulate)}\n")
  return head + KERNEL.replace("@MMA_TYPE@", dtype)


# ----------------------------------------------------------------------------------------------------------------
# host side: half bits, the reference, the checks
# ----------------------------------------------------------------------------------------------------------------
def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
  """round float32 to the nearest bfloat16 (ties to even); NaN not handled"""
  u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
  return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_bits_to_f32(b: np.ndarray) -> np.ndarray:
  return (b.astype(np.uint32) << 16).view(np.float32)


def to_bits(x: np.ndarray, dtype: str) -> np.ndarray:
  if dtype == "f16": return x.astype(np.float16).view(np.uint16)
  try:
    import ml_dtypes
    return x.astype(ml_dtypes.bfloat16).view(np.uint16)
  except ImportError:
    return f32_to_bf16_bits(x)


def from_bits(b: np.ndarray, dtype: str) -> np.ndarray:
  return b.view(np.float16).astype(np.float32) if dtype == "f16" else bf16_bits_to_f32(b)


def make_inputs(M: int, N: int, K: int, dtype: str, seed: int):
  rng = np.random.default_rng(seed)
  a = to_bits((rng.standard_normal((M, K), np.float32) * 0.5), dtype)
  b = to_bits((rng.standard_normal((K, N), np.float32) * 0.5), dtype)
  return a, b


def sample_rows(M: int, n: int, seed: int = 1) -> np.ndarray:
  if M <= n: return np.arange(M)
  rng = np.random.default_rng(seed)
  fixed = np.unique([0, 8, 15, BM - 1, M - 1])   # a fragment's g and g+8 rows, a tile's last row, the last row
  rest = np.setdiff1d(np.arange(M), fixed)
  return np.sort(np.concatenate([fixed, rng.choice(rest, n - len(fixed), replace=False)]))


def rel_error(out_bits: np.ndarray, a_bits: np.ndarray, b_bits: np.ndarray, dtype: str, rows=None) -> float:
  """max |out - ref| / max |ref| over the given rows of C (all if None); ref = float32 matmul of the half inputs"""
  a = from_bits(a_bits if rows is None else a_bits[rows], dtype)
  ref = a @ from_bits(b_bits, dtype)
  out = from_bits(out_bits if rows is None else out_bits[rows], dtype)
  if not np.all(np.isfinite(out)): return float("inf")
  return float(np.max(np.abs(out - ref)) / max(float(np.max(np.abs(ref))), 1e-30))


def parse_size(s: str):
  p = [int(v) for v in re.split(r"[x,]", s)]
  if len(p) == 1: p = p * 3
  if len(p) != 3: raise argparse.ArgumentTypeError(f"size {s!r}: give N or MxNxK")
  M, N, K = p
  if M % BM or N % BN or K % BK or min(p) <= 0:
    raise argparse.ArgumentTypeError(f"size {s!r}: M and N must be multiples of {BM}, K of {BK}")
  return M, N, K


def parse_args(argv=None):
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--size", type=parse_size, default=(4096, 4096, 4096), help="N or MxNxK (default 4096)")
  ap.add_argument("--check-size", type=parse_size, default=(512, 512, 512), help="full check size (default 512)")
  ap.add_argument("--dtypes", default="f16,bf16")
  ap.add_argument("--variants", default="simple,ldmatrix")
  ap.add_argument("--stages", default="3,2", help="ring depths to try (3 = 48 KB of local memory, 2 = 32 KB)")
  ap.add_argument("--group-m", type=int, default=8, help="row blocks of C taken together (1: plain raster order)")
  ap.add_argument("--reps", type=int, default=20)
  ap.add_argument("--sample-rows", type=int, default=64, help="rows of C checked at the full size")
  ap.add_argument("--device", default="NVIDIA", help="platform/device/vendor substring to pick (default NVIDIA)")
  ap.add_argument("--emulate", action="store_true", help="replace the PTX by OpenCL C; any device (slow, small sizes)")
  ap.add_argument("--no-torch", action="store_true")
  ap.add_argument("--build-options", default="", help="extra OpenCL build options")
  ap.add_argument("--hang-timeout", type=float, default=120.0, help="seconds before a kernel is declared hung")
  ap.add_argument("--list", action="store_true", help="list the OpenCL platforms and devices, then exit")
  ap.add_argument("--nvcc-check", action="store_true", help="compile-check the kernels with a local CUDA toolkit")
  ap.add_argument("--dump-source", metavar="DTYPE,VARIANT,STAGES", help="print the generated OpenCL C, then exit")
  args = ap.parse_args(argv)
  args.dtypes = [d for d in args.dtypes.split(",") if d]
  args.variants = [v for v in args.variants.split(",") if v]
  args.stages = [int(s) for s in args.stages.split(",") if s]
  for d in args.dtypes:
    if d not in ("f16", "bf16"): ap.error(f"dtype {d!r}: f16 or bf16")
  for v in args.variants:
    if v not in ("simple", "ldmatrix"): ap.error(f"variant {v!r}: simple or ldmatrix")
  for s in args.stages:
    if s not in (2, 3): ap.error(f"stages {s}: 2 or 3 (4 would need 64 KB of local memory)")
  if args.group_m < 1: ap.error("--group-m must be >= 1")
  return args


# ----------------------------------------------------------------------------------------------------------------
# OpenCL
# ----------------------------------------------------------------------------------------------------------------
def list_devices(cl) -> None:
  try: plats = cl.get_platforms()
  except Exception as e:
    print(f"no OpenCL platforms ({e!r})"); return
  if not plats: print("no OpenCL platforms")
  for i, p in enumerate(plats):
    print(f"platform {i}: {p.name} | {p.vendor} | {p.version}")
    try: devs = p.get_devices()
    except Exception as e: print(f"  (get_devices failed: {e!r})"); continue
    for j, d in enumerate(devs):
      print(f"  device {j}: {d.name} | vendor {d.vendor} | driver {d.driver_version} | {d.version} | "
            f"local mem {d.local_mem_size} B | max work-group {d.max_work_group_size}")


def pick_device(cl, want: str, emulate: bool):
  try: plats = cl.get_platforms()
  except Exception: plats = []
  found = []
  for p in plats:
    try: devs = p.get_devices()
    except Exception: continue
    for d in devs:
      if want.lower() in f"{p.name} {p.vendor} {d.name} {d.vendor}".lower() or emulate:
        found.append(d)
  if found and emulate:  # prefer the named kind of device, else the first there is
    named = [d for d in found if want.lower() in f"{d.platform.name} {d.name} {d.vendor}".lower()]
    return (named or found)[0]
  return found[0] if found else None


def is_nvidia(dev) -> bool:
  return "nvidia" in f"{dev.platform.name} {dev.vendor}".lower()


def show_build_error(src: str, log: str, what: str) -> None:
  print(f"  BUILD FAILED ({what}). Build log:")
  for line in (log or "(empty)").rstrip().splitlines(): print("    | " + line)
  lines = src.splitlines()
  shown = set()
  # NVIDIA writes "<kernel>:LINE:COL: error: ...", PoCL "error: FILE.cl:LINE:COL: ..."; take the first LINE:COL
  # of every line that says error
  for logline in (log or "").splitlines():
    m = re.search(r":(\d+):\d+\b", logline)
    if not m or "error" not in logline.lower(): continue
    n = int(m.group(1))
    if n in shown or not 1 <= n <= len(lines): continue
    if len(shown) == 3:   # later errors are mostly consequences of the first
      print("  (more errors: see the log above)"); break
    shown.add(n)
    print(f"  source lines {max(1, n - 4)}-{min(len(lines), n + 4)} (error at {n}):")
    for k in range(max(1, n - 4), min(len(lines), n + 4) + 1):
      print(f"    {'>' if k == n else ' '}{k:4d}  {lines[k - 1]}")
  if "ptxas" in (log or "") and not shown:
    print("  (a ptxas error: its line numbers are PTX lines; the generated source is in $OUT or --dump-source)")


def build(cl, ctx, dev, src: str, what: str, extra: str):
  opts = extra.split()
  if is_nvidia(dev): opts = ["-cl-nv-verbose"] + opts   # the log then has ptxas's register / spill report
  prg = cl.Program(ctx, src)
  try:
    prg.build(options=opts)
  except Exception as e:
    log = ""
    try: log = prg.get_build_info(dev, cl.program_build_info.LOG)
    except Exception: log = str(e)
    if "-cl-nv-verbose" in opts and "option" in (log + str(e)).lower():   # the option itself refused: once without
      prg = cl.Program(ctx, src)
      try: prg.build(options=[o for o in opts if o != "-cl-nv-verbose"])
      except Exception as e2:
        try: log = prg.get_build_info(dev, cl.program_build_info.LOG)
        except Exception: log = str(e2)
        show_build_error(src, log, what); return None, log
    else:
      show_build_error(src, log, what); return None, log
  try: log = prg.get_build_info(dev, cl.program_build_info.LOG) or ""
  except Exception: log = ""
  return prg, log


def wait_event(cl, evt, timeout: float, what: str) -> None:
  """wait, but give up loudly on a hung kernel (a wait that never returns would hide every later result)"""
  t0 = time.time()
  while evt.command_execution_status != cl.command_execution_status.COMPLETE:
    if evt.command_execution_status < 0:
      raise RuntimeError(f"{what}: command failed with status {evt.command_execution_status}")
    if time.time() - t0 > timeout:
      print(f"\n!! {what}: kernel still running after {timeout:.0f} s; giving up (hang?). Exiting.", flush=True)
      os._exit(3)
    time.sleep(0.001)
  evt.wait()


def kernel_info(cl, knl, dev) -> str:
  out = []
  for name in ("LOCAL_MEM_SIZE", "PRIVATE_MEM_SIZE", "WORK_GROUP_SIZE", "PREFERRED_WORK_GROUP_SIZE_MULTIPLE"):
    try: out.append(f"{name.lower()}={knl.get_work_group_info(getattr(cl.kernel_work_group_info, name), dev)}")
    except Exception: pass
  return " ".join(out)


def save_out(name: str, data) -> None:
  out = os.environ.get("OUT")
  if not out: return
  try:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, name), "wb" if isinstance(data, bytes) else "w") as f: f.write(data)
  except Exception as e:
    print(f"  (could not write $OUT/{name}: {e!r})")


class Runner:
  """one variant in its own context, so a kernel that faults (a sticky error on NVIDIA) leaves the next ones alone"""

  def __init__(self, cl, dev, args, dtype: str, variant: str, stages: int):
    self.cl, self.dev, self.args = cl, dev, args
    self.dtype, self.variant, self.stages = dtype, variant, stages
    self.label = variant if stages == 3 else f"{variant}_s{stages}"
    self.what = f"{dtype} {variant} {stages} stages"
    self.src = kernel_source(dtype, variant, stages, args.emulate, args.group_m)
    save_out(f"tc_gemm_cl_{dtype}_{self.label}.cl", self.src)
    self.ctx = cl.Context([dev])
    self.q = cl.CommandQueue(self.ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
    self.prg, self.log = build(cl, self.ctx, dev, self.src, self.what, args.build_options)
    self.knl = None
    if self.prg is None: return
    self.knl = self.prg.tc_gemm
    print(f"  built {self.what}: {kernel_info(cl, self.knl, dev)}")
    for line in self.log.splitlines():
      if re.search(r"ptxas|registers|spill|smem|stack", line, re.I): print("    " + line.strip())
    try:
      bins = self.prg.get_info(cl.program_info.BINARIES)
      if bins and bins[0] and is_nvidia(dev):   # NVIDIA's "binary" is the PTX text
        b = bytes(bins[0])
        save_out(f"tc_gemm_cl_{dtype}_{self.label}.ptx", b)
        txt = b.decode("latin-1")
        if ".target" in txt:
          tgt = re.search(r"^\s*\.target\s+(\S+)", txt, re.M)
          print(f"    PTX: .target {tgt.group(1) if tgt else '?'}, mma.sync x{txt.count('mma.sync')}, "
                f"ldmatrix x{txt.count('ldmatrix')}, cp.async x{txt.count('cp.async.cg')}, "
                f"local spills (ld/st.local) x{txt.count('ld.local') + txt.count('st.local')}")
    except Exception as e:
      print(f"    (no program binary: {e!r})")

  def run(self, a_bits, b_bits, M, N, K, reps=0):
    """C bits, and the per-launch device times in ms (empty when reps == 0)"""
    cl, mf = self.cl, self.cl.mem_flags
    a = cl.Buffer(self.ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=np.ascontiguousarray(a_bits))
    b = cl.Buffer(self.ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=np.ascontiguousarray(b_bits))
    c = cl.Buffer(self.ctx, mf.READ_WRITE, M * N * 2)
    cl.enqueue_fill_buffer(self.q, c, np.array([0x7E00 if self.dtype == "f16" else 0x7FC0], np.uint16), 0, M * N * 2)  # NaNs
    self.knl.set_args(a, b, c, np.uint32(M), np.uint32(N), np.uint32(K))
    gsize, lsize = ((N // BN) * WG, M // BM), (WG, 1)
    limit = self.args.hang_timeout
    evt = cl.enqueue_nd_range_kernel(self.q, self.knl, gsize, lsize)
    wait_event(cl, evt, limit, self.what)
    out = np.empty((M, N), np.uint16)
    cl.enqueue_copy(self.q, out, c)
    self.q.finish()
    times = []
    if reps:
      for _ in range(3): evt = cl.enqueue_nd_range_kernel(self.q, self.knl, gsize, lsize)
      wait_event(cl, evt, limit, self.what)
      evts = [cl.enqueue_nd_range_kernel(self.q, self.knl, gsize, lsize) for _ in range(reps)]
      wait_event(cl, evts[-1], limit * reps, self.what)
      self.q.finish()
      times = [(e.profile.end - e.profile.start) * 1e-6 for e in evts]
    a.release(); b.release(); c.release()
    return out, times

  def close(self):
    try: self.q.finish()
    except Exception: pass
    self.knl = self.prg = None
    self.q = self.ctx = None


# ----------------------------------------------------------------------------------------------------------------
# torch
# ----------------------------------------------------------------------------------------------------------------
def torch_time(a_bits, b_bits, dtype: str, reps: int):
  """(median ms of torch's a @ b on CUDA, C bits) or (None, reason)"""
  try:
    import torch
  except Exception as e:
    return None, f"no torch ({e.__class__.__name__})"
  if not torch.cuda.is_available(): return None, "torch has no CUDA device"
  tdt = torch.float16 if dtype == "f16" else torch.bfloat16
  a = torch.from_numpy(a_bits.view(np.int16)).cuda().view(tdt)
  b = torch.from_numpy(b_bits.view(np.int16)).cuda().view(tdt)
  for _ in range(3): c = a @ b
  torch.cuda.synchronize()
  times = []
  for _ in range(reps):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record(); c = a @ b; e.record()
    times.append((s, e))
  torch.cuda.synchronize()
  ms = statistics.median(s.elapsed_time(e) for s, e in times)
  out = c.view(torch.int16).cpu().numpy().view(np.uint16)
  name = torch.cuda.get_device_name()
  del a, b, c
  return ms, (out, name)


# ----------------------------------------------------------------------------------------------------------------
# --nvcc-check: where a CUDA toolkit exists (not on the GPU machine), turn the PTX-mode OpenCL C into CUDA C++ by
# text replacement and let nvcc + ptxas compile it for sm_90: the inline PTX assembles, and ptxas says how many
# registers and spills the kernel takes. A compile check only: NVIDIA's OpenCL compiler is another front end.
# ----------------------------------------------------------------------------------------------------------------
_CUDA_SHIM = r"""#include <cuda_fp16.h>
typedef unsigned int uint; typedef unsigned short ushort; typedef unsigned long ulong; typedef unsigned char uchar;
typedef __half half;
#define restrict __restrict__
#define get_local_id(d) threadIdx.x
#define get_group_id(d) ((d) == 0 ? blockIdx.x : blockIdx.y)
#define barrier(x) __syncthreads()
#define as_uint __float_as_uint
__device__ inline void vstore_half2_rte(float2 v, int, half* p) { *(__half2*)p = __floats2half2_rn(v.x, v.y); }
"""


def as_cuda(src: str) -> str:
  s = src.replace("#define SADDR(p) ((uint)(ulong)(p))", "#define SADDR(p) ((uint)__cvta_generic_to_shared(p))")
  s = s.replace("__kernel __attribute__((reqd_work_group_size(256, 1, 1)))", 'extern "C" __global__ __launch_bounds__(256)')
  s = s.replace("__local uint4 smem", "__shared__ uint4 smem").replace("(float4)(0.0f)", "make_float4(0.f, 0.f, 0.f, 0.f)")
  s = re.sub(r"\((uint4|uint2|float4|float2)\)\(", r"make_\1(", s)
  return _CUDA_SHIM + s.replace("__local", "").replace("__global ", "").replace("inline ", "__device__ inline ")


def nvcc_check(args) -> int:
  import shutil
  import tempfile
  nvcc = shutil.which("nvcc")
  if not nvcc: print("nvcc not found"); return 2
  bad = 0
  with tempfile.TemporaryDirectory() as tmp:
    for d in args.dtypes:
      for v in args.variants:
        for st in args.stages:
          cu = os.path.join(tmp, f"k_{d}_{v}_{st}.cu")
          with open(cu, "w") as f: f.write(as_cuda(kernel_source(d, v, st, False, args.group_m)))
          p = subprocess.run([nvcc, "-arch=sm_90", "-cubin", "-O3", "-Xptxas", "-v", "-o", cu[:-3] + ".cubin", cu],
                             capture_output=True, text=True)
          info = [l.strip() for l in (p.stdout + p.stderr).splitlines() if re.search(r"registers|spill", l)]
          print(f"{d:4} {v:8} {st} stages: {'ok' if p.returncode == 0 else 'FAILED'}  " + " | ".join(info))
          if p.returncode:
            bad += 1; print(p.stdout + p.stderr)
  return 1 if bad else 0


# ----------------------------------------------------------------------------------------------------------------
def main(argv=None) -> int:
  args = parse_args(argv)
  if args.dump_source:
    d, v, s = (args.dump_source.split(",") + ["3"])[:3]
    print(kernel_source(d, v, int(s), args.emulate, args.group_m)); return 0
  if args.nvcc_check: return nvcc_check(args)
  try:
    import pyopencl as cl
  except ImportError as e:
    print(f"pyopencl is not importable ({e}); install it (bench/h200.sh shows how from .whl/)"); return 2
  if args.list:
    list_devices(cl); return 0
  dev = pick_device(cl, args.device, args.emulate)
  if dev is None:
    print(f"No OpenCL device matching {args.device!r}. This benchmark needs NVIDIA's OpenCL (inline PTX); "
          f"the platforms here are:")
    list_devices(cl)
    print("(--emulate runs an emulation of the PTX pieces on any OpenCL device, to check the index math.)")
    return 2
  if not args.emulate and not is_nvidia(dev):
    print(f"warning: {dev.name} is not NVIDIA's; inline PTX will most likely not build (--emulate for a CPU check)")

  try: date = subprocess.run(["date"], capture_output=True, text=True, timeout=5).stdout.strip()
  except Exception: date = datetime.datetime.now().astimezone().isoformat()
  print(f"date:    {date}")
  print(f"device:  {dev.name} ({dev.vendor}); platform {dev.platform.name} {dev.platform.version}")
  print(f"driver:  {dev.driver_version}; {dev.version}; local mem {dev.local_mem_size} B; "
        f"{dev.max_compute_units} compute units")
  try: print(f"compute capability: {dev.compute_capability_major_nv}.{dev.compute_capability_minor_nv}")
  except Exception: pass
  (M, N, K), (m, n, k) = args.size, args.check_size
  print(f"sizes:   full {M}x{N}x{K}, check {m}x{n}x{k}; reps {args.reps} (median, after 3 warm-up); "
        f"group_m {args.group_m}{'; EMULATED (times mean nothing)' if args.emulate else ''}", flush=True)

  rows_out = []   # (dtype, variant, ms, tflops, ratio, err_check, err_full, status)
  flops = 2.0 * M * N * K
  for dtype in args.dtypes:
    print(f"\n== {dtype}: making inputs", flush=True)
    a_big, b_big = make_inputs(M, N, K, dtype, seed=1)
    a_small, b_small = make_inputs(m, n, k, dtype, seed=2)
    sample = sample_rows(M, args.sample_rows)
    torch_ms = None
    if not args.no_torch:   # before any of our kernels could upset the GPU
      try:
        torch_ms, info = torch_time(a_big, b_big, dtype, args.reps)
        if torch_ms is None:
          print(f"  torch: skipped ({info})")
        else:
          err = rel_error(info[0], a_big, b_big, dtype, sample)
          print(f"  torch ({info[1]}): {torch_ms:.4f} ms, err {err:.2e}")
          rows_out.append((dtype, "torch", torch_ms, flops / torch_ms * 1e-9, 1.0, None, err,
                           "ok" if err <= CHECK_TOL else "WRONG"))
      except Exception as e:
        print(f"  torch failed: {e!r}")
    for variant in args.variants:
      for stages in args.stages:
        r = None
        label = variant if stages == 3 else f"{variant}_s{stages}"
        print(f"\n-- {dtype} {variant}, {stages} stages", flush=True)
        err_c = err_f = ms = None
        status = "ok"
        try:
          r = Runner(cl, dev, args, dtype, variant, stages)
          if r.knl is None:
            status = "FAILED: build"
          else:
            out, _ = r.run(a_small, b_small, m, n, k)
            err_c = rel_error(out, a_small, b_small, dtype)
            print(f"  check {m}x{n}x{k}: err {err_c:.2e}", flush=True)
            out, times = r.run(a_big, b_big, M, N, K, reps=args.reps)
            err_f = rel_error(out, a_big, b_big, dtype, sample)
            ms = statistics.median(times)
            print(f"  full {M}x{N}x{K}: err {err_f:.2e} ({len(sample)} rows); {ms:.4f} ms median "
                  f"(min {min(times):.4f}, max {max(times):.4f}), {flops / ms * 1e-9:.1f} TFLOP/s", flush=True)
            if max(err_c, err_f) > CHECK_TOL: status = "WRONG"
        except Exception as e:
          status = f"FAILED: {e.__class__.__name__}"
          print(f"  {dtype} {variant} {stages} stages FAILED: {e!r}")
          traceback.print_exc(limit=3)
        finally:
          if r is not None: r.close()
        rows_out.append((dtype, label, ms, flops / ms * 1e-9 if ms else None,
                         torch_ms / ms if (ms and torch_ms) else None, err_c, err_f, status))

  def f(v, fmt): return format(v, fmt) if v is not None else "-".rjust(int(re.match(r"\d+", fmt).group()))
  print(f"\n{M}x{N}x{K} on {dev.name} (driver {dev.driver_version}), {date}")
  print(f"{'dtype':5} {'variant':13} {'ms':>9} {'TFLOP/s':>8} {'torch/ours':>10} {'err check':>9} {'err full':>9}  status")
  for d, v, ms, tf, ratio, ec, ef, st in rows_out:
    print(f"{d:5} {v:13} {f(ms, '9.4f')} {f(tf, '8.1f')} {f(ratio, '10.3f')} {f(ec, '9.2e')} {f(ef, '9.2e')}  {st}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
