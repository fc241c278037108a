import os
import tempfile

# the tests name numpy's bfloat16 (np.dtype("bfloat16")): ml_dtypes registers it. rulec itself imports ml_dtypes only
# when a bfloat16 is first needed (engine/ir/dtypes.py np_dtype_named), so a test must not rely on rulec having done so
import ml_dtypes  # noqa: F401
import pytest
from hypothesis import settings

# CI runs the full example budgets, derandomized so a landing never depends on luck; a developer
# explores new examples with HYPOTHESIS_PROFILE=explore, or runs fewer with HYPOTHESIS_PROFILE=dev
settings.register_profile("ci", deadline=None, print_blob=True, derandomize=True)
settings.register_profile("explore", deadline=None, print_blob=True)
settings.register_profile("dev", deadline=None, max_examples=50)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# keep generated-matcher caches out of the user's home during tests
os.environ.setdefault("RULEC_CACHE_DIR", tempfile.mkdtemp(prefix="rulec-test-cache-"))
# and PoCL's kernel cache (the CL device on CPU machines) out of the shared ~/.cache/pocl
os.environ.setdefault("POCL_CACHE_DIR", tempfile.mkdtemp(prefix="rulec-test-pocl-"))
# two PoCL CPU devices, CL:0 and CL:1, for tests/sched/test_multi.py ("CL" is the first: the other tests see no change)
os.environ.setdefault("POCL_DEVICES", "pthread pthread")
# CL program binaries go to the disk cache right after each build on a GPU, at exit elsewhere (PoCL hands them
# out slowly); a test process leaves them out (tests/runtime/test_kernel_cache.py saves its own)
os.environ.setdefault("RULEC_CL_SAVE_S", "0")


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
  d = tmp_path / "cache"
  monkeypatch.setenv("RULEC_CACHE_DIR", str(d))
  return d


@pytest.fixture
def cl_dev():
  """The CL device (the test is skipped, saying why, where there is none: no pyopencl, or no OpenCL device)."""
  pytest.importorskip("pyopencl", reason="the CL device needs pyopencl: pip install pyopencl pocl-binary-distribution")
  from rulec.runtime import cl_device
  try: return cl_device.get_device()
  except cl_device.CLUnavailable as e: pytest.skip(f"no OpenCL device: {e}")
