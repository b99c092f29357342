// OtfuseIsaReport: which compiled kernel variant each family takes in this process, and the
// measurement behind it, as one JSON object (read by `otfuse info` and the benches through
// ctypes). It never throws: a bad knob (OTFUSE_*_ISA) is reported as {"error": "..."}.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>

#include "common/cpu_features.h"
#include "common/gemm.h"
#include "cpu/activation_kernel.h"
#include "cpu/attention_isa.h"

namespace {

std::string Report() {
  using namespace otfuse;
  const CpuIsa rows = SelectCpuIsa();
  char ratio[32];
  std::snprintf(ratio, sizeof ratio, "%.2f", Fma512Over256());
  std::string json = "{";
  json += "\"avx512\": " + std::string(CpuHasAvx512() ? "true" : "false");
  json += ", \"fma512_over_256\": " + std::string(ratio);
  json += ", \"fma_batches\": " + std::to_string(MeasuredFma512Over256().batches);
  json += ", \"avx512_full_rate\": " + std::string(Avx512AtFullRate() ? "true" : "false");
  json += ", \"attention\": \"" + std::string(rows == CpuIsa::kBaseline ? "baseline"
                                               : cpu::AttentionUsesAvx512() ? "avx512" : "avx2") + "\"";
  json += ", \"gemm\": \"" + std::string(GemmIsaName(SelectGemmIsa())) + "\"";
  json += ", \"activation\": \"" + std::string(cpu::ActivationIsaName(cpu::SelectActivationIsa())) + "\"";
  json += ", \"norm\": \"" + std::string(CpuIsaName(rows)) + "\"";
  json += ", \"rotary\": \"" + std::string(CpuIsaName(rows)) + "\"";
  return json + "}";
}

std::string Escaped(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += (static_cast<unsigned char>(c) < 0x20) ? ' ' : c;
  }
  return out;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) const char* OtfuseIsaReport() {
  static thread_local std::string text;  // valid until this thread's next call
  try {
    text = Report();
  } catch (const std::exception& e) {
    text = "{\"error\": \"" + Escaped(e.what()) + "\"}";
  } catch (...) {
    text = "{\"error\": \"unknown\"}";
  }
  return text.c_str();
}

// Tests only (tests/kernels/test_isa_dispatch.py): the measurement's decision rule
// (PoolFmaBatches) over given batches, t256[i] and t512[i] the best rounds of batch i (n of them;
// a rule asking for more gets the last again). Returns the ratio; *batches = batches taken.
extern "C" __attribute__((visibility("default"))) double OtfusePoolFmaBatches(const double* t256, const double* t512,
                                                                              int n, int* batches) {
  struct Feed {
    const double* t256;
    const double* t512;
    int n;
    int next;
  } feed{t256, t512, n, 0};
  const auto next = [](void* context) {
    auto* f = static_cast<Feed*>(context);
    const int i = std::min(f->next++, f->n - 1);
    return otfuse::FmaBatch{f->t256[i], f->t512[i]};
  };
  const otfuse::FmaVerdict verdict = otfuse::PoolFmaBatches(next, &feed, nullptr);
  *batches = verdict.batches;
  return verdict.ratio;
}
