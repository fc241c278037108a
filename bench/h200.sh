#!/usr/bin/env bash
# The CL device on an NVIDIA H200 (the `device` tool's nvidia-h200 machine): set up, then run
#   bench/h200.sh bench     bench/kernels.py --device CL, side by side with torch on CUDA
#   bench/h200.sh tests     the CL device tests and the tensor-program suite on CL
#   bench/h200.sh train     bench/train.py --device CL: the digits CNN's jitted train step against torch on CUDA,
#                           then the autograd, optimizer and JIT tests on CL
#   bench/h200.sh models    bench/models.py --device CL: real blocks and whole steps (matmul, attention, the GPT-2 MLP
#                           and block, a ResNet block, a LLaMA decode step) at full size against torch on CUDA
#   bench/h200.sh multi     several GPUs (the nvidia-h200-x2 kind): the multi-device tests on CL:0 + CL:1, then
#                           bench/multi.py --kind CL on 1 and 2 GPUs beside torch (bench/multi_torch.py, NCCL)
#   bench/h200.sh halfmm    bench/half_matmul.py: float16 / bfloat16 matmuls on the CUDA device's tensor cores beside
#                           torch and tinygrad (tinygrad's source in .whl/pysrc)
#   bench/h200.sh loss      bench/mixed_loss.py --device CL: the GPT-2 block's loss and gradients in bfloat16 and float16
#                           (autocast and whole) against float32, rulec beside torch on CUDA
#   bench/h200.sh cudatests the CUDA device's GPU tests and the tensor-core kernel's tests
#   bench/h200.sh sweep     bench/cl_sweep.py: the GPU optimizer's tile shapes, vector widths and split parts
#   bench/h200.sh probe     bench/cl_bandwidth_probe.py: hand-written elementwise and sum forms against the copy
#   bench/h200.sh sumprobe  bench/cl_sum_probe.py: one-pass sum forms (layout, loads in flight, work sizes) and rulec's
#   bench/h200.sh linprobe  bench/cl_linear_probe.py: x @ W.T for sums of several lengths (odd ones too) beside torch
#   bench/h200.sh stageprobe bench/cl_stage_probe.py: STAGE blocks and work-group sides for odd and prime sizes
#   bench/h200.sh convprobe  bench/cl_conv_grad_probe.py: action lists for a convolution's weight gradient
#   bench/h200.sh convfwd    bench/cl_conv_probe.py: action lists for a convolution (fwd) or its input gradient (dx)
#   bench/h200.sh sgemmprobe bench/cl_sgemm_probe.py: hand-written SGEMM tiles beside rulec's and cuBLAS
#   bench/h200.sh all       bench and tests (default)
#   bench/h200.sh bench --only relu    (anything after the first word goes to bench/kernels.py)
# Logs go to $OUT (or ./h200-out). That machine has numpy, attrs, llvmlite, hypothesis, pytest and torch, but no
# network: pyopencl and the rest travel as cp312 wheels in .whl/ (see docs/architecture.md, "Running on a GPU"):
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d .whl pyopencl pytools siphash24 platformdirs lark ml_dtypes
set -uo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
shift || true
out=${OUT:-h200-out}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 RULEC_CACHE_DIR=/tmp/rulec-cache
# NVIDIA's OpenCL driver is in the driver folder, but no ICD file names it
mkdir -p /etc/OpenCL/vendors && echo /usr/local/nvidia/lib64/libnvidia-opencl.so.1 > /etc/OpenCL/vendors/nvidia.icd
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "from rulec.runtime import cl_device; print(cl_device.get_device(), cl_device.get_device().target)" || exit 1
if [[ $what == bench || $what == all ]]; then
  python3 bench/kernels.py --device CL "$@" 2>&1 | tee "$out/bench.log"
fi
if [[ $what == models ]]; then
  python3 bench/models.py --device CL "$@" 2>&1 | tee "$out/models.log"
fi
if [[ $what == halfmm ]]; then
  export PYTHONPATH=$PYTHONPATH:$PWD/.whl/pysrc   # (tinygrad 0.14's source, for its column)
  python3 bench/half_matmul.py "$@" 2>&1 | tee "$out/halfmm.log"
fi
if [[ $what == loss ]]; then
  python3 bench/mixed_loss.py --device CL "$@" 2>&1 | tee "$out/mixed_loss.log"
fi
if [[ $what == cudatests ]]; then
  python3 -m pytest -q -x tests/runtime/test_cuda_on_gpu.py tests/codegen/test_tensor_core_gemm.py "$@" 2>&1 | tee "$out/cudatests.log"
fi
if [[ $what == sweep ]]; then
  python3 bench/cl_sweep.py "$@" 2>&1 | tee "$out/sweep.log"
fi
if [[ $what == linprobe ]]; then
  python3 bench/cl_linear_probe.py "$@" 2>&1 | tee "$out/linprobe.log"
fi
if [[ $what == convprobe ]]; then
  python3 bench/cl_conv_grad_probe.py "$@" 2>&1 | tee "$out/convprobe.log"
fi
if [[ $what == convfwd ]]; then
  python3 bench/cl_conv_probe.py "$@" 2>&1 | tee -a "$out/convfwd.log"
fi
if [[ $what == sgemmprobe ]]; then
  python3 bench/cl_sgemm_probe.py "$@" 2>&1 | tee "$out/sgemmprobe.log"
fi
if [[ $what == stageprobe ]]; then
  python3 bench/cl_stage_probe.py "$@" 2>&1 | tee "$out/stageprobe.log"
fi
if [[ $what == sumprobe ]]; then
  python3 bench/cl_sum_probe.py "$@" 2>&1 | tee "$out/sumprobe.log"
fi
if [[ $what == probe ]]; then
  python3 bench/cl_bandwidth_probe.py "$@" 2>&1 | tee "$out/probe.log"
fi
if [[ $what == train ]]; then
  python3 bench/train.py --device CL 2>&1 | tee "$out/train.log"
  RULEC_DEVICE=CL timeout "${TEST_TIMEOUT:-300}" python3 -m pytest -q -p no:cacheprovider tests/frontend/test_autograd.py \
    tests/tools/test_nn_optim.py tests/frontend/test_jit.py 2>&1 | tail -5 | tee "$out/tests_training_on_cl.log"
fi
if [[ $what == tests || $what == all ]]; then
  timeout "${TEST_TIMEOUT:-420}" python3 -m pytest -q -p no:cacheprovider tests/runtime/test_cl_device.py tests/codegen/test_opt.py 2>&1 | tee "$out/tests_cl_device.log"
  RULEC_DEVICE=CL timeout "${TEST_TIMEOUT:-420}" python3 -m pytest -q -p no:cacheprovider tests/frontend/test_tensor.py tests/sched/test_schedule.py \
    2>&1 | tee "$out/tests_tensor_on_cl.log"
  # native float16 (opt-in, RULEC_CL_HALF=1): its own tests, then the tensor suites' float16 cases on it
  RULEC_CL_HALF=1 RULEC_DEVICE=CL timeout "${TEST_TIMEOUT:-420}" python3 -m pytest -q -rs -p no:cacheprovider \
    tests/codegen/test_opencl_native_half.py 2>&1 | tee "$out/tests_native_half.log"
  RULEC_CL_HALF=1 RULEC_DEVICE=CL timeout "${TEST_TIMEOUT:-420}" python3 -m pytest -q -p no:cacheprovider tests/frontend/test_tensor.py \
    tests/frontend/test_mixed_precision.py -k "float16 or half" 2>&1 | tee "$out/tests_native_half_tensor.log"
fi
if [[ $what == multi ]]; then
  gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
  counts=1; for ((i = 2; i <= gpus; i *= 2)); do counts+=",$i"; done
  RULEC_DEVICE=CL timeout "${TEST_TIMEOUT:-300}" python3 -m pytest -q -p no:cacheprovider tests/sched/test_multi.py 2>&1 | tail -5 |
    tee "$out/tests_multi_on_cl.log"
  RULEC_DEVICE=CL python3 bench/multi.py --kind CL --devices "$counts" --size "${MULTI_SIZE:-8192}" 2>&1 | tee "$out/multi.log"
  for n in ${counts//,/ }; do
    python3 -m torch.distributed.run --standalone --nproc_per_node "$n" bench/multi_torch.py --size "${MULTI_SIZE:-8192}" \
      2>&1 | grep -v "^W\|^\*" | tee -a "$out/multi.log"
  done
fi
