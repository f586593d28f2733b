// A kernel timeline of any CUDA program, graphs included, without Nsight
// Systems (not installed on the GPU machine): a CUDA injection library that
// turns on CUPTI's concurrent-kernel activity records and writes one CSV line
// per kernel when the program exits:
//   start_ns,end_ns,graph_id,correlation_id,name
// Kernels replayed from one graph launch share its correlation id, so
// tools/step_timeline.py can cut a decode step out of the trace and put each
// kernel's time as it ran in the step beside the gap before it.
// Run: KERNEL_TIMELINE_CSV=out.csv CUDA_INJECTION64_PATH=build/libkernel_timeline.so PROGRAM ARGS
#include <cupti.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace {

constexpr size_t kBufferBytes = 32u << 20;

std::FILE* g_out = nullptr;
std::mutex g_mutex;

void report(const char* what, CUptiResult r) {
  const char* text = nullptr;
  cuptiGetResultString(r, &text);
  std::fprintf(stderr, "kernel_timeline: %s failed: %s\n", what, text ? text : "unknown CUPTI error");
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  std::lock_guard<std::mutex> lock(g_mutex);
  CUpti_Activity* record = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && record->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
    if (g_out)
      std::fprintf(g_out, "%llu,%llu,%u,%u,\"%s\"\n", static_cast<unsigned long long>(k->start),
                   static_cast<unsigned long long>(k->end), k->graphId, k->correlationId, k->name);
  }
  size_t dropped = 0;
  if (cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped) == CUPTI_SUCCESS && dropped > 0)
    std::fprintf(stderr, "kernel_timeline: %zu records dropped\n", dropped);
  std::free(buffer);
}

// Records still in CUPTI's buffers when a context goes away would be lost.
void CUPTIAPI on_resource(void*, CUpti_CallbackDomain, CUpti_CallbackId id, const void*) {
  if (id == CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING) cuptiActivityFlushAll(0);
}

void flush_at_exit() {
  cuptiActivityFlushAll(1);
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_out) std::fclose(g_out);
  g_out = nullptr;
}

}  // namespace

// Called by the CUDA driver when CUDA_INJECTION64_PATH names this library.
extern "C" int InitializeInjection() {
  const char* path = std::getenv("KERNEL_TIMELINE_CSV");
  g_out = std::fopen(path ? path : "kernel_timeline.csv", "w");
  if (!g_out) {
    std::fprintf(stderr, "kernel_timeline: cannot write %s\n", path ? path : "kernel_timeline.csv");
    return 0;
  }
  std::fprintf(g_out, "start_ns,end_ns,graph_id,correlation_id,name\n");
  CUptiResult r = cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
  if (r != CUPTI_SUCCESS) return report("cuptiActivityRegisterCallbacks", r), 0;
  r = cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  if (r != CUPTI_SUCCESS) return report("cuptiActivityEnable", r), 0;
  CUpti_SubscriberHandle subscriber;
  r = cuptiSubscribe(&subscriber, reinterpret_cast<CUpti_CallbackFunc>(on_resource), nullptr);
  if (r != CUPTI_SUCCESS) return report("cuptiSubscribe", r), 0;
  r = cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_RESOURCE, CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING);
  if (r != CUPTI_SUCCESS) return report("cuptiEnableCallback", r), 0;
  std::atexit(flush_at_exit);
  return 1;
}
