"""A 3x3, stride-1 convolution as Winograd's F(2x2, 3x3): 2.25x fewer multiplies, in lazy tensor ops.

Each 2x2 block of outputs comes from a 4x4 block of input (overlapping its neighbours by two) and the 3x3 filter:

    Y = A^T [ (G g G^T) (.) (B^T d B) ] A

with the constant matrices below (Lavin and Gray, "Fast Algorithms for Convolutional Neural Networks", 2015). The
elementwise product, summed over input channels, is a batched matmul, one per position (a, b) of the 4x4 block:

    M[ab] (O x P) = U[ab] (O x C) @ V[ab] (C x P),  P = N x (output rows / 2) x (output columns / 2)

so the convolution becomes four kernels: the filter transform U (small), the input transform V, the matmul (the
device's tiled GEMM: 9 multiply-adds per output and channel pair of a direct convolution become 16 / 4), and the
output transform. The transforms only add, subtract and halve, so in exact arithmetic the result is the direct sum
(float64 agrees to 1e-15); in float32 a convolution and its gradients agree with the direct ones to about 1e-6.
It is off by default: docs/architecture.md, "Winograd convolutions", says what it measured.

Gradients need nothing of their own: every step is a movement, an elementwise combination or a matmul, so the
backward pass is the transposed transforms around the two matmuls of the product's gradient. Which convolutions
take this path: `fits` (the shape) when `runtime/devices.py` `winograd_convs` says so (RULEC_WINOGRAD=1, tinygrad's
WINO=1; off by default, which says why)."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING: from rulec.engine.tensor.tensor import Tensor

# the input transform B^T, the filter transform G and the output transform A^T of F(2, 3), row by row
BT = ((1, 0, -1, 0), (0, 1, 1, 0), (0, -1, 1, 0), (0, 1, 0, -1))
G = ((1, 0, 0), (0.5, 0.5, 0.5), (0.5, -0.5, 0.5), (0, 0, 1))
AT = ((1, 1, 1, 0), (0, 1, -1, -1))

# below these sizes the direct convolution's one kernel costs less than four (and the transforms' memory traffic)
MIN_CHANNELS = 16
MIN_OUTPUT = 8


def fits(ks: tuple, stride: tuple, dilation: tuple, groups: int, channels: int, outputs: int, out_hw: tuple,
         is_float32: bool) -> bool:
  """Whether a convolution of this shape can and should take F(2x2, 3x3): a 2-D 3x3 filter, stride and dilation 1,
  one group, float32 (half precision would lose more to the transforms' rounding), at least MIN_CHANNELS channels
  in and out (the matmul's inner and outer sizes) and outputs of at least MIN_OUTPUT x MIN_OUTPUT."""
  return (tuple(ks) == (3, 3) and tuple(stride) == (1, 1) and tuple(dilation) == (1, 1) and groups == 1
          and is_float32 and channels >= MIN_CHANNELS and outputs >= MIN_CHANNELS and min(out_hw) >= MIN_OUTPUT)


def _apply(mat: tuple, parts: list) -> list:
  """Each row of `mat` applied to `parts` (tensors of one shape): sum_j mat[i][j] * parts[j], with the zeros left
  out and +-1 as an add or a subtract (the transforms are mostly those)."""
  rows = []
  for row in mat:
    acc = None
    for c, p in zip(row, parts):
      if c == 0: continue
      term = p if c in (1, -1) else p * c
      if acc is None: acc = -term if c == -1 else term
      else: acc = acc - term if c == -1 else acc + term
    rows.append(acc)
  return rows


def _taps(x: Tensor, axis: int, count: int, tiles: int) -> list:
  """The `count` views of x's `axis` that a tile t reads at 2t + i (i < count): x[..., i : i + 2 * tiles : 2, ...]."""
  sl = [slice(None)] * x.ndim
  out = []
  for i in range(count):
    sl[axis] = slice(i, i + 2 * tiles, 2)
    out.append(x[tuple(sl)])
  return out


def conv3x3(x: Tensor, w: Tensor, pads: list) -> Tensor:
  """x (N, C, H, W) correlated with w (O, C, 3, 3), padded by pads ((top, bottom), (left, right)): (N, O, Ho, Wo)."""
  N, C, H, W = x.shape
  O = w.shape[0]
  (pt, pb), (pl, pr) = pads
  Ho, Wo = H + pt + pb - 2, W + pl + pr - 2
  th, tw = -(-Ho // 2), -(-Wo // 2)
  # the input padded so that every tile's 4 x 4 block exists (an odd output size reads one more row of zeros)
  xp = x.pad(((0, 0), (0, 0), (pt, 2 * th + 2 - H - pt), (pl, 2 * tw + 2 - W - pl)))
  rows = _apply(BT, _taps(xp, 2, 4, th))                                   # 4 x (N, C, th, W')
  v = [vb for r in rows for vb in _apply(BT, _taps(r, 3, 4, tw))]           # 16 x (N, C, th, tw), a major
  V = v[0].stack(*v[1:]).permute(0, 2, 1, 3, 4).reshape(16, C, N * th * tw).contiguous()
  g = _apply(G, [w[:, :, k] for k in range(3)])                            # 4 x (O, C, 3)
  u = [ub for r in g for ub in _apply(G, [r[:, :, k] for k in range(3)])]   # 16 x (O, C)
  U = u[0].stack(*u[1:]).contiguous()                                       # (16, O, C)
  M = (U @ V).reshape(4, 4, O, N, th, tw)
  yr = _apply(AT, [M[a] for a in range(4)])                                 # 2 x (4, O, N, th, tw)
  y = [_apply(AT, [r[b] for b in range(4)]) for r in yr]                   # 2 x 2 x (O, N, th, tw)
  Y = y[0][0].stack(y[0][1], dim=-1).stack(y[1][0].stack(y[1][1], dim=-1), dim=3)   # (O, N, th, 2, tw, 2)
  Y = Y.reshape(O, N, 2 * th, 2 * tw).permute(1, 0, 2, 3)
  return Y if (2 * th, 2 * tw) == (Ho, Wo) else Y[:, :, :Ho, :Wo]
