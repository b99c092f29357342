// Which normalisation a norm-family or norm + linear kernel computes. Its own header, with no
// other include, because the per-ISA row kernels (cpu/norm_rows.inc) use it too.
#pragma once

namespace otfuse {

enum class NormKind { kRms, kLayer };

}  // namespace otfuse
