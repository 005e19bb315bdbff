#pragma once
// The device probe of the CUDA test programs: whether to run, skip (exit code 77) or fail.
//
// Skipped (77) only when the machine has no CUDA device: no CUDA driver installed at all
// (cudaDriverGetVersion reports 0, which the runtime then reports as cudaErrorInsufficientDriver),
// cudaErrorNoDevice, or zero devices. Any other CUDA error (a driver older than the runtime, a
// broken installation, a device that fails to initialise) is a failure (exit code 1), so a broken
// GPU machine is never reported as "skipped".

#include <cuda_runtime.h>

#include <cstdio>

namespace depthkv_test {

/// 0: a device is present, run; 77: no CUDA device, skip; 1: a CUDA error, fail. Prints why.
inline int cuda_device_probe(const char* program) {
  int driver = 0;
  const cudaError_t ed = cudaDriverGetVersion(&driver);
  if (ed == cudaSuccess && driver == 0) {
    std::printf("SKIP: %s: no CUDA driver installed (no CUDA device)\n", program);
    return 77;
  }
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e == cudaErrorNoDevice || (e == cudaSuccess && count == 0)) {
    std::printf("SKIP: %s: no CUDA device (%s)\n", program, e == cudaSuccess ? "0 devices" : cudaGetErrorName(e));
    return 77;
  }
  if (e != cudaSuccess || ed != cudaSuccess) {
    const cudaError_t bad = e != cudaSuccess ? e : ed;
    std::printf("FAIL: %s: CUDA error %s (%s), driver version %d: not a missing device, so not skipped\n", program,
                cudaGetErrorName(bad), cudaGetErrorString(bad), driver);
    return 1;
  }
  return 0;
}

}  // namespace depthkv_test
