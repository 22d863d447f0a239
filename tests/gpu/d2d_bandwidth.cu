// GPU check: device-to-device copy bandwidth of GPU 0 (cudaMemcpy of a 2 GiB buffer, best of 10).
// Prints one JSON line: copy (read + written bytes / s, the STREAM convention) and read_equiv
// (copy / 2: bytes read per second while copying, comparable with the data-sheet figure the
// roofline uses). Build: nvcc -O2 -o d2d_bandwidth d2d_bandwidth.cu
#include <cstdio>
#include <cuda_runtime.h>

int main() {
  const size_t n = 2ull << 30;
  void *a, *b;
  if (cudaMalloc(&a, n) != cudaSuccess || cudaMalloc(&b, n) != cudaSuccess) {
    fprintf(stderr, "cudaMalloc failed\n");
    return 1;
  }
  cudaMemset(a, 1, n);
  cudaMemset(b, 0, n);
  cudaEvent_t t0, t1;
  cudaEventCreate(&t0);
  cudaEventCreate(&t1);
  float best = 1e30f;
  for (int i = 0; i < 10; i++) {
    cudaEventRecord(t0);
    cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice);
    cudaEventRecord(t1);
    cudaEventSynchronize(t1);
    float ms;
    cudaEventElapsedTime(&ms, t0, t1);
    if (ms < best) best = ms;
  }
  cudaDeviceProp p;
  cudaGetDeviceProperties(&p, 0);
  double copy = 2.0 * n / (best / 1e3);
  printf("{\"gpu\": \"%s\", \"buffer_bytes\": %zu, \"best_ms\": %.3f, \"copy_bytes_per_s\": %.0f, \"read_equiv_bytes_per_s\": %.0f}\n",
         p.name, n, best, copy, copy / 2);
  return 0;
}
