// A model swapped out is destroyed on the I/O thread, never on the engine's:
// freeing a runtime session takes tens of microseconds that no frame should
// pay. The fake backend records which thread destroys it.
#include <gtest/gtest.h>

#ifndef _WIN32

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "client_test_helpers.h"

namespace {

using namespace fake;  // (the fake server, its answers and the helpers of client_test_helpers.h)

json module_state(std::int64_t seq) {
  return {{"type", "SET_STATE"},
          {"models", {{"m", {{"weights_seq_no", seq}, {"onnx_file", fake::onnx_file(static_cast<std::uint8_t>(seq % 2))}}}}}};
}

}  // namespace

TEST(ModelRetirement, SingleAgentSwapFreesTheOldModelOffTheEngineThread) {
  FakeServer server(ServerScript{});  // every batch is answered with a new model
  auto log = std::make_shared<fake::BackendLog>();
  auto connected = tether::TetherClient::connect(options_for(server, 1, log));
  ASSERT_TRUE(connected.ok()) << connected.status().to_string();
  tether::TetherClient& client = *connected.value();
  std::string episode = client.start_episode().value();
  for (int round = 0; round < 2; ++round) {
    ASSERT_NO_FATAL_FAILURE(act(client, episode, 21));
    ASSERT_TRUE(client.flush().ok());  // applies the answer's model: a swap
  }
  EXPECT_GE(client.models_loaded(), 3);
  ASSERT_TRUE(wait_for([&] { return log->destroyers().size() >= 2; }, 5.0));
  for (std::thread::id id : log->destroyers()) EXPECT_NE(id, std::this_thread::get_id());
}

TEST(ModelRetirement, MultiAgentSwapFreesTheOldModelOffTheEngineThread) {
  ServerScript script = answering([](int n) { return module_state(n); });  // a new model for every batch
  script.full_config =
      multi_agent_config(10, {{"m", module_json(2)}}, json::array({{{"pattern", "*"}, {"module", "m"}}}));
  FakeServer server(script);
  auto log = std::make_shared<fake::BackendLog>();
  auto connected = tether::MultiAgentClient::connect(options_for(server, 1, log));
  ASSERT_TRUE(connected.ok()) << connected.status().to_string();
  tether::MultiAgentClient& client = *connected.value();
  std::string episode = client.start_episode().value();
  tether::AgentFrame frame;
  const float obs[2] = {0.5f, -0.5f};
  for (int round = 0; round < 2; ++round) {
    for (int t = 0; t < 12; ++t) {
      frame.clear();
      frame.add("a", obs, 2);
      ASSERT_TRUE(client.get_action(episode, frame).ok()) << client.last_error().to_string();
    }
    ASSERT_TRUE(client.flush().ok());
  }
  EXPECT_GE(client.models_loaded(), 3);
  ASSERT_TRUE(wait_for([&] { return log->destroyers().size() >= 2; }, 5.0));
  for (std::thread::id id : log->destroyers()) EXPECT_NE(id, std::this_thread::get_id());
}

#endif  // _WIN32
