// The activation element loops for the build's baseline ISA (SSE2 on x86-64, NEON on aarch64): 4 lanes.
#define OTFUSE_ISA_NAMESPACE baseline
#include "cpu/activation_rows.inc"
