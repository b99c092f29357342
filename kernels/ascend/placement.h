// Where an Ascend (CANN) kernel class is registered. Kept apart from the CANN declarations so the
// registration list (op_registry.h) can name it without seeing any of them.
#pragma once

namespace otfuse::ascend {

enum class Placement {
  kCannEp,         // CANNExecutionProvider: device memory, the EP's aclrtStream
  kCpuTestDouble,  // TEST ONLY (session config otfuse.ascend_ep.fake_mode=1): CPU EP, CPU
                   // memory, and otfuse's CPU test double of the CANN runtime (tests/fake_cann)
};

}  // namespace otfuse::ascend
