// AgentFrame::action(i) before any action was computed: an engine that reads
// a frame's actions after a failed (or no) get_action must get nullptr, not a
// read past the frame's offsets.
#include <gtest/gtest.h>

#include "tether/multi_agent_client.h"

TEST(AgentFrameActions, NoActionYetIsNullNotAnOutOfBoundsRead) {
  tether::AgentFrame frame;
  EXPECT_EQ(frame.action(0), nullptr);  // an empty frame
  const float obs[2] = {1.0f, 2.0f};
  frame.add("a", obs, 2);
  frame.add("b", obs, 2);
  // No get_action yet: no offsets are laid out for the actions.
  EXPECT_EQ(frame.action(0), nullptr);
  EXPECT_EQ(frame.action(1), nullptr);
  EXPECT_EQ(frame.action(7), nullptr);  // out of range
  EXPECT_EQ(frame.action_size(1), 0u);
  EXPECT_EQ(frame.discrete_action(1), 0);
  frame.clear();
  EXPECT_EQ(frame.action(0), nullptr);
}
