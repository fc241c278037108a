"""Matmuls the tensor cores run (codegen/gemm_plan.py), shared by the GPU tests of the devices that run them
(tests/runtime/test_cuda_on_gpu.py, and test_cl_device.py on NVIDIA's OpenCL): each against the NUMPY reference
device, and the device's counter of tensor-core kernels must move."""
import numpy as np

from rulec.engine.ir.dtypes import dtypes
from rulec.engine.tensor import Tensor

TC_PROGRAMS = {   # matmuls the tensor cores run (codegen/gemm_plan.py): layouts, ragged edges, batches, epilogues,
  # and factors gathered element by element (casts fused in, unaligned strides, convolution windows); (shapes, fn, k)
  "ragged m, n, k": ((131, 64), (64, 72), lambda a, b, d: a.cast(d) @ b.cast(d), 64),
  "x @ W.T + bias, relu": ((130, 64), (72, 64), lambda a, w, d: (a.cast(d) @ w.cast(d).T + w[:, 0].cast(d)).relu(), 64),
  "A.T @ A": ((130, 64), (8, 8), lambda a, _, d: a.cast(d).realize().T @ a.cast(d).realize(), 130),
  "batched, gelu": ((3, 40, 48), (3, 48, 136), lambda a, b, d: (a.cast(d) @ b.cast(d)).gelu(), 48),
  "heads": ((2, 3, 17, 32), (2, 3, 32, 24), lambda a, b, d: a.cast(d) @ b.cast(d), 32),
  "several tiles": ((300, 256), (256, 264), lambda a, b, d: a.cast(d) @ b.cast(d), 256),
  "autocast (casts fused in)": ((70, 48), (40, 48), lambda a, w, d: a.cast(d) @ w.cast(d).T, 48),
  "(batch, time) rows": ((2, 40, 64), (64, 72), lambda x, w, d: x.cast(d) @ w.cast(d), 64),
  "a sum over (batch, time)": ((2, 40, 64), (2, 40, 24), lambda x, dy, d: (x.cast(d)[..., None] * dy.cast(d)[..., None, :]).sum((0, 1)), 80),
  "autocast weight gradient (x.T @ dy)": ((80, 70), (80, 36), lambda x, dy, d: x.cast(d).T @ dy.cast(d), 80),
  "unaligned strides": ((65, 130), (130, 33), lambda a, b, d: a.cast(d) @ b.cast(d), 130),
  "conv2d, padded": ((2, 16, 9, 9), (24, 16, 3, 3), lambda x, w, d: x.cast(d).conv2d(w.cast(d), padding=1), 144),
  "conv2d, strided": ((1, 8, 12, 12), (16, 8, 3, 3), lambda x, w, d: x.cast(d).conv2d(w.cast(d), stride=2), 72),
}


def check(device: str, counters: dict, name: str, dtype, seed: int = 0) -> None:
  """TC_PROGRAMS[name] in `dtype` on `device` against NUMPY; `counters["tensor_cores"]` must grow."""
  rng = np.random.default_rng(seed)
  sa, sb, fn, k = TC_PROGRAMS[name]
  a, b = rng.standard_normal(sa).astype(np.float32), rng.standard_normal(sb).astype(np.float32)
  # inputs realized in the 2-byte type first, except where the cast is meant to fuse into the matmul
  if "autocast" not in name: a, b = (Tensor(v).cast(dtype).numpy().astype(np.float32) for v in (a, b))
  before = counters["tensor_cores"]
  got = fn(Tensor(a, device=device), Tensor(b, device=device), dtype).cast(dtypes.float32).numpy()
  ref = fn(Tensor(a, device="NUMPY"), Tensor(b, device="NUMPY"), dtype).cast(dtypes.float32).numpy()
  assert counters["tensor_cores"] >= before + 1   # (the matmul ran on the tensor cores)
  # the reference rounds each product to the 2-byte type; the tensor cores do not: a few of its roundings apart
  tol = (8e-3 if dtype is dtypes.float16 else 6e-2) * np.sqrt(k)
  np.testing.assert_allclose(got, ref, rtol=5e-2, atol=tol)
