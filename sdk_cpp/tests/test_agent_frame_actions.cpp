// AgentFrame::action(i) before any action was computed: an engine that reads
// a frame's actions after a failed (or no) get_action must get nullptr, not a
// read past the frame's offsets. [1.6] Its logged actions, kept until clear().
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

// [1.6] A frame's logged actions: kept in order with their values, until clear().
TEST(AgentFrameActions, LoggedActionsAreKeptUntilClear) {
  tether::AgentFrame frame;
  const float obs[2] = {1.0f, 2.0f};
  frame.add("a", obs, 2);
  const double one = 1, joint[2] = {0, 1};
  frame.log_action("a", &one, 1);
  frame.log_action("pair", joint, 2);
  frame.add("b", obs, 2);  // (adding an agent keeps them)
  ASSERT_EQ(frame.logged_count(), 2u);
  EXPECT_EQ(frame.logged_actor(0), "a");
  EXPECT_EQ(frame.logged_action_size(0), 1u);
  EXPECT_EQ(frame.logged_action(0)[0], 1.0);
  EXPECT_EQ(frame.logged_actor(1), "pair");
  ASSERT_EQ(frame.logged_action_size(1), 2u);
  EXPECT_EQ(frame.logged_action(1)[1], 1.0);
  frame.clear();
  EXPECT_EQ(frame.logged_count(), 0u);
  frame.log_action("c", nullptr, 0);  // (get_action refuses an action of no values)
  EXPECT_EQ(frame.logged_count(), 1u);
  EXPECT_EQ(frame.logged_action_size(0), 0u);
}
