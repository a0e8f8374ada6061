// Shared-memory launch probe: which (static, dynamic) shared-memory sizes a one-block kernel launch
// accepts, with and without raising cudaFuncAttributeMaxDynamicSharedMemorySize first.
//
// It measures the mechanism behind SGL003 (SGLang's schedule precompute): a kernel with a few
// static shared bytes whose dynamic size is checked against 48 KiB alone. Without the opt-in the
// launch limit is static + dynamic <= sharedMemPerBlock (48 KiB); with the opt-in set to N the
// dynamic part may reach N as long as static + N <= sharedMemPerBlockOptin.
//
// Output: one JSON object per line on stdout (a "device" line, one "kernel" line per probe kernel,
// one "attribute" line per cudaFuncSetAttribute call, one "launch" line per launch). Usage:
//   probe_smem_launch [P ...]     # P: num_sm_parts values for the precompute-size launches
// bench/probe_smem_launch.py compiles it, runs it and writes the record.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

constexpr int kThreads = 256;
constexpr int kDefaultLimit = 48 * 1024;   // the 48 KiB a block gets without an opt-in

// STATIC_WORDS ints of static shared memory; every thread touches both arrays so neither is
// optimised away, and thread 0 writes a checksum so the run can be checked.
template <int STATIC_WORDS>
__global__ void __launch_bounds__(kThreads) probe_kernel(int dyn_words, int* out) {
  extern __shared__ int dyn[];
  __shared__ int fixed[STATIC_WORDS];
  for (int i = threadIdx.x; i < STATIC_WORDS; i += blockDim.x) fixed[i] = i;
  for (int i = threadIdx.x; i < dyn_words; i += blockDim.x) dyn[i] = 2 * i;
  __syncthreads();
  if (threadIdx.x == 0) {
    long long sum = 0;
    for (int i = 0; i < STATIC_WORDS; ++i) sum += fixed[i];
    if (dyn_words > 0) sum += dyn[dyn_words - 1];
    out[0] = static_cast<int>(sum);
  }
}

struct Probe {
  const char* name;
  const void* fn;
  void (*launch)(int dyn_bytes, int* out);
  int static_words;
};

template <int W>
void launch_it(int dyn_bytes, int* out) {
  probe_kernel<W><<<1, kThreads, dyn_bytes>>>(dyn_bytes / 4, out);
}

const char* err_name(cudaError_t e) { return cudaGetErrorName(e); }

std::string esc(const char* s) {
  std::string o;
  for (const char* p = s; *p; ++p) {
    if (*p == '"' || *p == '\\') o += '\\';
    if (static_cast<unsigned char>(*p) >= 0x20) o += *p;
  }
  return o;
}

// One launch: its configuration error (returned at launch), then its execution error.
void run_launch(const Probe& pr, const char* mode, int opt_in, int dyn_bytes, const char* why, int parts, int rows,
                int* d_out) {
  cudaGetLastError();                       // clear any earlier configuration error
  pr.launch(dyn_bytes, d_out);
  cudaError_t at_launch = cudaGetLastError();
  cudaError_t at_sync = cudaSuccess;
  int value = -1;
  if (at_launch == cudaSuccess) {
    at_sync = cudaDeviceSynchronize();
    if (at_sync == cudaSuccess) cudaMemcpy(&value, d_out, sizeof(int), cudaMemcpyDeviceToHost);
  }
  long long expect = 0;
  for (int i = 0; i < pr.static_words; ++i) expect += i;
  if (dyn_bytes / 4 > 0) expect += 2LL * (dyn_bytes / 4 - 1);
  const cudaError_t e = at_launch != cudaSuccess ? at_launch : at_sync;
  std::printf(
      "{\"type\": \"launch\", \"kernel\": \"%s\", \"mode\": \"%s\", \"opt_in_bytes\": %d, \"dynamic_bytes\": %d, "
      "\"why\": \"%s\", \"num_sm_parts\": %d, \"rows\": %d, \"ok\": %s, \"error\": %s%s%s, \"error_string\": \"%s\", "
      "\"failed_at\": %s, \"checksum_ok\": %s}\n",
      pr.name, mode, opt_in, dyn_bytes, why, parts, rows, e == cudaSuccess ? "true" : "false",
      e == cudaSuccess ? "" : "\"", e == cudaSuccess ? "null" : err_name(e), e == cudaSuccess ? "" : "\"",
      e == cudaSuccess ? "" : esc(cudaGetErrorString(e)).c_str(),
      e == cudaSuccess ? "null" : (at_launch != cudaSuccess ? "\"launch\"" : "\"execution\""),
      (e == cudaSuccess && static_cast<long long>(value) == static_cast<int>(expect)) ? "true" : "false");
  std::fflush(stdout);
  if (at_sync != cudaSuccess) std::exit(3);   // the context is gone: stop here
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> parts_list;
  for (int i = 1; i < argc; ++i) parts_list.push_back(std::atoi(argv[i]));

  int dev = 0;
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
    std::printf("{\"type\": \"error\", \"message\": \"no CUDA device\"}\n");
    return 2;
  }
  int reserved = 0, runtime = 0, driver = 0;
  cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, dev);
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);
  std::printf(
      "{\"type\": \"device\", \"name\": \"%s\", \"cc\": [%d, %d], \"num_sms\": %d, \"shared_mem_per_block\": %zu, "
      "\"shared_mem_per_block_optin\": %zu, \"reserved_shared_mem_per_block\": %d, \"shared_mem_per_sm\": %zu, "
      "\"cuda_runtime\": %d, \"cuda_driver\": %d}\n",
      esc(prop.name).c_str(), prop.major, prop.minor, prop.multiProcessorCount, prop.sharedMemPerBlock,
      prop.sharedMemPerBlockOptin, reserved, prop.sharedMemPerMultiprocessor, runtime, driver);

  int* d_out = nullptr;
  cudaMalloc(&d_out, sizeof(int));

  // 12 ints (48 B: what the precompute kernel's three ints and int[8] take once aligned) and 16
  // ints (64 B).
  const Probe probes[] = {
      {"static48", reinterpret_cast<const void*>(&probe_kernel<12>), &launch_it<12>, 12},
      {"static64", reinterpret_cast<const void*>(&probe_kernel<16>), &launch_it<16>, 16},
  };
  const int optin = static_cast<int>(prop.sharedMemPerBlockOptin);

  for (const Probe& pr : probes) {
    cudaFuncAttributes attr{};
    cudaFuncGetAttributes(&attr, pr.fn);
    const int st = static_cast<int>(attr.sharedSizeBytes);
    std::printf(
        "{\"type\": \"kernel\", \"kernel\": \"%s\", \"declared_static_bytes\": %d, \"static_bytes\": %d, "
        "\"max_dynamic_bytes_default\": %d}\n",
        pr.name, pr.static_words * 4, st, attr.maxDynamicSharedSizeBytes);

    // the sizes around each edge: 48 KiB - static (no opt-in), 48 KiB itself (the guard's value and
    // the opt-in), the opt-in maximum - static, and the same edges for a 64-byte static part
    struct Size { int bytes; const char* why; };
    std::vector<Size> sizes;
    for (int d : {-8, -4, 0, 4, 8}) sizes.push_back({kDefaultLimit - st + d, "48KiB-static"});
    for (int d : {-4, 0, 4}) sizes.push_back({kDefaultLimit + d, "48KiB"});
    for (int d : {-4, 0, 4}) sizes.push_back({kDefaultLimit - 64 + d, "48KiB-64"});
    for (int d : {-4, 0, 4}) sizes.push_back({optin - st + d, "optin-static"});
    for (int d : {-4, 0, 4}) sizes.push_back({optin - 64 + d, "optin-64"});

    // the precompute's own sizes, 4*(5b+1+8P), for b around where they cross 48 KiB - static
    auto precompute_sizes = [&](const char* mode, int opt_in) {
      for (int parts : parts_list) {
        const int base = 4 * (1 + 8 * parts);
        const int first_over_default = (kDefaultLimit - st - base) / 20 + 1;   // 20 bytes per row
        for (int b = first_over_default - 3; b <= first_over_default + 4; ++b)
          run_launch(pr, mode, opt_in, base + 20 * b, "precompute", parts, b, d_out);
      }
    };

    // (a) no attribute set
    for (const Size& s : sizes) run_launch(pr, "default", 0, s.bytes, s.why, 0, 0, d_out);
    precompute_sizes("default", 0);

    // (b) opt-in to 48 KiB (SGLang 0.5.23's value), (c) opt-in to the largest the block allows, and
    // (d) one word past it (the attribute call itself is refused)
    const int modes[] = {kDefaultLimit, optin - st, optin - st + 4};
    const char* names[] = {"opt_in_48KiB", "opt_in_max", "opt_in_over_max"};
    for (int m = 0; m < 3; ++m) {
      cudaGetLastError();
      cudaError_t set = cudaFuncSetAttribute(pr.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, modes[m]);
      cudaFuncAttributes after{};
      cudaFuncGetAttributes(&after, pr.fn);
      std::printf(
          "{\"type\": \"attribute\", \"kernel\": \"%s\", \"mode\": \"%s\", \"requested_bytes\": %d, \"ok\": %s, "
          "\"error\": %s%s%s, \"max_dynamic_bytes_after\": %d}\n",
          pr.name, names[m], modes[m], set == cudaSuccess ? "true" : "false", set == cudaSuccess ? "" : "\"",
          set == cudaSuccess ? "null" : err_name(set), set == cudaSuccess ? "" : "\"", after.maxDynamicSharedSizeBytes);
      cudaGetLastError();
      if (set != cudaSuccess) continue;
      for (const Size& s : sizes) run_launch(pr, names[m], modes[m], s.bytes, s.why, 0, 0, d_out);
      precompute_sizes(names[m], modes[m]);
    }
  }
  cudaFree(d_out);
  return 0;
}
