// One tree's common/gemm_tiles.inc (TREE, a path) compiled alone into namespace
// otfuse::gemm_detail::TREE_NS, as the library compiles its own (gemm_tiles_<isa>.cc: one tree per
// translation unit, so the compiler's inlining is the library's), for the one-thread micros that
// compare trees (bench/gemm_ystore_micro.cc). Its own #include "common/..." lines resolve to
// -Ikernels. Build: see bench/gemm_ystore_micro.cc.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#define OTFUSE_ISA_NAMESPACE TREE_NS
#include TREE
