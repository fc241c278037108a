/* A stand-in for libcuda.so.1 with the functions runtime/cuda_driver.py binds, for tests/runtime/test_cuda_device.py
   on machines without a GPU: memory is host memory (malloc), a launch runs nothing but records its grid, block and
   argument values (fake_last_launch), and PTX text containing "BROKEN" fails to load with a JIT error log. It checks
   the ctypes side of the binding (argument types, 64-bit addresses, the kernelParams array), not the GPU. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
static uint64_t last[32]; static int last_n;
static unsigned last_dims[6];
static void *current_ctx;

CUresult cuInit(unsigned flags) { return flags == 0 ? 0 : 1; }
CUresult cuDriverGetVersion(int *v) { *v = 13000; return 0; }
CUresult cuDeviceGetCount(int *n) { const char *e = getenv("FAKE_CUDA_DEVICES"); *n = e ? atoi(e) : 1; return 0; }
CUresult cuDeviceGet(int *d, int ordinal) { *d = ordinal; return 0; }
CUresult cuDeviceGetName(char *name, int len, int dev) { strncpy(name, "Fake GPU", len); return 0; }
CUresult cuDeviceGetAttribute(int *v, int attr, int dev) {
  if (attr == 75) *v = 9; else if (attr == 76) *v = 0; else return 1;
  return 0;
}
CUresult cuDevicePrimaryCtxRetain(void **ctx, int dev) { *ctx = (void *)(uintptr_t)(0x1000 + dev); return 0; }
CUresult cuCtxSetCurrent(void *ctx) { current_ctx = ctx; return 0; }
CUresult cuCtxSynchronize(void) { return current_ctx ? 0 : 201; }
CUresult cuMemAlloc_v2(uint64_t *p, size_t n) { if (!n) return 1; *p = (uint64_t)(uintptr_t)malloc(n); return 0; }
CUresult cuMemFree_v2(uint64_t p) { free((void *)(uintptr_t)p); return 0; }
CUresult cuMemcpyHtoD_v2(uint64_t dst, const void *src, size_t n) { memcpy((void *)(uintptr_t)dst, src, n); return 0; }
CUresult cuMemcpyDtoH_v2(void *dst, uint64_t src, size_t n) { memcpy(dst, (void *)(uintptr_t)src, n); return 0; }
CUresult cuMemcpyDtoD_v2(uint64_t dst, uint64_t src, size_t n) { memcpy((void *)(uintptr_t)dst, (void *)(uintptr_t)src, n); return 0; }
CUresult cuMemsetD8_v2(uint64_t dst, unsigned char v, size_t n) { memset((void *)(uintptr_t)dst, v, n); return 0; }
CUresult cuModuleLoadDataEx(void **mod, const void *image, unsigned nopt, int *opts, void **vals) {
  if (!strstr((const char *)image, "BROKEN")) { *mod = (void *)0x5678; return 0; }
  for (unsigned i = 0; i < nopt; i++)
    if (opts[i] == 5) strcpy((char *)vals[i], "ptxas fatal   : line 3: BROKEN is no instruction");
  return 218;   /* CUDA_ERROR_INVALID_PTX */
}
CUresult cuModuleUnload(void *mod) { return 0; }
CUresult cuModuleGetFunction(void **fn, void *mod, const char *name) { *fn = (void *)0x9abc; return strcmp(name, "entry") ? 500 : 0; }
CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shared, void *stream, void **params, void **extra) {
  const char *e = getenv("FAKE_CUDA_NARGS"); int n = e ? atoi(e) : 0;
  last_dims[0] = gx; last_dims[1] = gy; last_dims[2] = gz; last_dims[3] = bx; last_dims[4] = by; last_dims[5] = bz;
  last_n = n;
  for (int i = 0; i < n && i < 32; i++) last[i] = *(uint64_t *)params[i];
  return f == (void *)0x9abc ? 0 : 400;
}
int fake_last_launch(uint64_t *args, unsigned *dims) { memcpy(args, last, sizeof last); memcpy(dims, last_dims, sizeof last_dims); return last_n; }
CUresult cuFuncSetAttribute(void *f, int attr, int value) { return f == (void *)0x9abc ? 0 : 400; }
CUresult cuEventCreate(void **e, unsigned flags) { *e = malloc(1); return 0; }
CUresult cuEventRecord(void *e, void *s) { return 0; }
CUresult cuEventSynchronize(void *e) { return 0; }
CUresult cuEventElapsedTime(float *ms, void *a, void *b) { *ms = 1.5f; return 0; }
CUresult cuEventDestroy_v2(void *e) { free(e); return 0; }
CUresult cuGetErrorName(CUresult r, const char **s) {
  *s = r == 218 ? "CUDA_ERROR_INVALID_PTX" : r == 400 ? "CUDA_ERROR_INVALID_HANDLE" : "CUDA_ERROR_UNKNOWN"; return 0;
}
CUresult cuGetErrorString(CUresult r, const char **s) { *s = r == 218 ? "a PTX JIT compilation failed" : "unknown error"; return 0; }
