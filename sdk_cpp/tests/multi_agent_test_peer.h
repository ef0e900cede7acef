// The tests' view into MultiAgentClient's steady-state path (its friend).
#pragma once

#include <cstdint>

#include "tether/multi_agent_client.h"

namespace tether {
// The client's steady-state path, switched off to compare it with the general one.
struct MultiAgentClientTestPeer {
  static void use_steady_path(MultiAgentClient& client, bool on) { client.steady_path_ = on; }
  static std::int64_t steady_frames(const MultiAgentClient& client) { return client.steady_frames_; }
};
}  // namespace tether
