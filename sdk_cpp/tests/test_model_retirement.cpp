// A model swapped out is destroyed on the I/O thread, never on the engine's:
// freeing a runtime session takes tens of microseconds that no frame should
// pay. The fake backend records which thread destroys it.
#include <gtest/gtest.h>

#ifndef _WIN32

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "fake_backend.h"
#include "fake_server.h"
#include "tether/client.h"
#include "tether/multi_agent_client.h"

namespace {

using fake::Conn;
using fake::FakeServer;
using fake::ServerScript;
using nlohmann::json;

bool wait_for(const std::function<bool()>& condition, double seconds) {
  const auto deadline = fake::Clock::now() + std::chrono::milliseconds(static_cast<int>(seconds * 1000));
  while (fake::Clock::now() < deadline) {
    if (condition()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return condition();
}

tether::ClientOptions options_for(const FakeServer& server, std::shared_ptr<fake::BackendLog> log) {
  tether::ClientOptions options;
  options.port = server.port();
  options.seed = 1;
  options.reconnect_timeout_s = 5.0;
  options.response_timeout_s = 5.0;
  options.update_timeout_s = 5.0;
  options.backend_factory = [log] { return std::make_unique<fake::Backend>(log); };
  return options;
}

json module_json() {
  return {{"observation_space", {{"type", "Box"}, {"shape", {2}}, {"low", -10.0}, {"high", 10.0}}},
          {"action_space", {{"type", "Discrete"}, {"n", 2}}},
          {"onnx_input_names", {"obs"}},
          {"onnx_output_names", {"action_dist_inputs"}},
          {"trainable", true}};
}

json module_state(std::int64_t seq) {
  return {{"type", "SET_STATE"},
          {"models", {{"m", {{"weights_seq_no", seq}, {"onnx_file", fake::onnx_file(static_cast<std::uint8_t>(seq % 2))}}}}}};
}

}  // namespace

TEST(ModelRetirement, SingleAgentSwapFreesTheOldModelOffTheEngineThread) {
  FakeServer server(ServerScript{});  // every batch is answered with a new model
  auto log = std::make_shared<fake::BackendLog>();
  auto connected = tether::TetherClient::connect(options_for(server, log));
  ASSERT_TRUE(connected.ok()) << connected.status().to_string();
  tether::TetherClient& client = *connected.value();
  std::string episode = client.start_episode().value();
  float obs[4] = {0.1f, 0.2f, 0.3f, 0.4f};
  double action[1];
  for (int round = 0; round < 2; ++round) {
    for (int t = 0; t < 21; ++t) ASSERT_TRUE(client.get_action(episode, obs, 4, action, 1).ok());
    ASSERT_TRUE(client.flush().ok());  // applies the answer's model: a swap
  }
  EXPECT_GE(client.models_loaded(), 3);
  ASSERT_TRUE(wait_for([&] { return log->destroyers().size() >= 2; }, 5.0));
  for (std::thread::id id : log->destroyers()) EXPECT_NE(id, std::this_thread::get_id());
}

TEST(ModelRetirement, MultiAgentSwapFreesTheOldModelOffTheEngineThread) {
  ServerScript script;
  script.full_config = {{"type", "SET_CONFIG"},
                        {"env_steps_per_sample", 10},
                        {"force_on_policy", true},
                        {"protocol_version", "1.3"},
                        {"heartbeat_interval_s", 0},
                        {"modules", {{"m", module_json()}}},
                        {"policy_mapping", json::array({{{"pattern", "*"}, {"module", "m"}}})}};
  script.on_get_state = [](Conn& conn, const tether::Message&, int) {
    conn.send(module_state(0));
    return true;
  };
  script.on_batch = [](Conn& conn, const tether::Message&, int n) {
    conn.send(module_state(n));
    return true;
  };
  FakeServer server(script);
  auto log = std::make_shared<fake::BackendLog>();
  auto connected = tether::MultiAgentClient::connect(options_for(server, log));
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
