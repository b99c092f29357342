// The GEMM tasks for the build's baseline ISA (SSE2 on x86-64, NEON on aarch64).
#define OTFUSE_ISA_NAMESPACE baseline
#include "common/gemm_tiles.inc"
