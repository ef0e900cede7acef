// What the client tests share (beside fake_server.h and fake_backend.h): the
// fake server's usual answers and multi-agent configs, client options,
// connecting, playing steps, reading batches, waiting, and making a call again
// after the error of the server it returned. POSIX only, as the fake server.
#pragma once

#ifndef _WIN32

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "fake_backend.h"
#include "fake_server.h"
#include "tether/client.h"
#include "tether/episode.h"
#include "tether/multi_agent_client.h"
#include "tether/server_link.h"

namespace fake {

// -- the server's answers and configs --------------------------------------------------------

/// A single-agent SET_STATE: weights version `seq`, the fake model preferring action `model`.
inline json state(std::int64_t seq, std::uint8_t model) {
  return {{"type", "SET_STATE"}, {"weights_seq_no", seq}, {"onnx_file", onnx_file(model)}};
}

/// An ERROR refusing a batch (the answer to its EPISODES_AND_GET_STATE).
inline json refusal(const std::string& code, const std::string& message = "no") {
  return {{"type", "ERROR"}, {"code", code}, {"message", message}, {"request", "EPISODES_AND_GET_STATE"}};
}

/// A server script whose answer to GET_STATE is answer(0), and to batch n answer(n).
inline ServerScript answering(std::function<json(int)> answer) {
  ServerScript script;
  script.on_get_state = [answer](Conn& conn, const tether::Message&, int) {
    conn.send(answer(0));
    return true;
  };
  script.on_batch = [answer](Conn& conn, const tether::Message&, int n) {
    conn.send(answer(n));
    return true;
  };
  return script;
}

/// A Discrete(n) space.
inline json discrete(int n) { return {{"type", "Discrete"}, {"n", n}}; }

/// A module of a multi-agent SET_CONFIG: Box(obs_width) observations in [-10, 10], `action_space`.
inline json module_json(int obs_width, json action_space = discrete(2)) {
  return {{"observation_space", {{"type", "Box"}, {"shape", {obs_width}}, {"low", -10.0}, {"high", 10.0}}},
          {"action_space", std::move(action_space)},
          {"onnx_input_names", {"obs"}},
          {"onnx_output_names", {"action_dist_inputs"}},
          {"trainable", true}};
}

/// A multi-agent SET_CONFIG (protocol 1.3, on-policy, no heartbeats) of
/// `modules`, mapped by `policy_mapping` (null: by the server, MAP_AGENTS).
inline json multi_agent_config(std::int64_t steps_per_sample, json modules, json policy_mapping) {
  return {{"type", "SET_CONFIG"},
          {"env_steps_per_sample", steps_per_sample},
          {"force_on_policy", true},
          {"protocol_version", "1.3"},
          {"heartbeat_interval_s", 0},
          {"modules", std::move(modules)},
          {"policy_mapping", std::move(policy_mapping)}};
}

/// Module m (agents a_*, Box(2) -> Discrete(2)) and module pm for the group
/// "pair" (members p_0, p_1: Box(4) -> MultiDiscrete([2, 2])).
inline json pair_config(std::int64_t steps_per_sample) {
  json config = multi_agent_config(
      steps_per_sample,
      {{"m", module_json(2)}, {"pm", module_json(4, {{"type", "MultiDiscrete"}, {"nvec", {2, 2}}})}},
      json::array({{{"pattern", "a_*"}, {"module", "m"}}, {{"agent_id", "pair"}, {"module", "pm"}}}));
  config["groups"] = {{"pair", {{"members", {"p_0", "p_1"}}}}};
  return config;
}

/// pair_config's modules at version `seq`, each the fake model preferring action 1.
inline json pair_state(std::int64_t seq) {
  json models = json::object();
  for (const char* id : {"m", "pm"}) models[id] = {{"weights_seq_no", seq}, {"onnx_file", onnx_file(1)}};
  return {{"type", "SET_STATE"}, {"models", models}};
}

/// The module specs of a multi-agent SET_CONFIG.
inline std::map<std::string, tether::ModuleSpec> module_specs(const json& config) {
  std::map<std::string, tether::ModuleSpec> specs;
  for (auto it = config["modules"].begin(); it != config["modules"].end(); ++it) {
    specs.emplace(it.key(), tether::ModuleSpec::from_json(it.key(), it.value()).value());
  }
  return specs;
}

// -- clients and links ------------------------------------------------------------------------

/// Options for a client of `server`: seed `seed`, 5 s limits, fake::Backend
/// models (that log into `log` when there is one).
inline tether::ClientOptions options_for(const FakeServer& server, std::uint64_t seed = 1,
                                         std::shared_ptr<BackendLog> log = nullptr) {
  tether::ClientOptions options;
  options.port = server.port();
  options.seed = seed;
  options.reconnect_timeout_s = 5.0;
  options.response_timeout_s = 5.0;
  options.update_timeout_s = 5.0;
  options.backend_factory = [log] { return std::make_unique<Backend>(log); };
  return options;
}

/// options_for's, with every batch delivered: the engine waits for room in the send queue.
inline tether::ClientOptions waiting_options_for(const FakeServer& server, std::uint64_t seed = 1) {
  tether::ClientOptions options = options_for(server, seed);
  options.when_queue_full = tether::QueueFullPolicy::kWait;
  return options;
}

/// Options for a ServerLink of `server`: 5 s limits, fake::Backend models.
inline tether::LinkOptions link_options_for(const FakeServer& server) {
  tether::LinkOptions options;
  options.port = server.port();
  options.reconnect_timeout_s = 5.0;
  options.response_timeout_s = 5.0;
  options.update_timeout_s = 5.0;
  options.backend_factory = [] { return std::make_unique<Backend>(); };
  return options;
}

/// A client (TetherClient or MultiAgentClient) connected with `options`;
/// null, and a test failure, when it did not connect.
template <class Client = tether::TetherClient>
std::unique_ptr<Client> connect(const tether::ClientOptions& options) {
  auto connected = Client::connect(options);
  EXPECT_TRUE(connected.ok()) << connected.status().to_string();
  return connected.ok() ? std::move(connected).value() : nullptr;
}

/// A MultiAgentClient connected with `options` (see connect).
inline std::unique_ptr<tether::MultiAgentClient> connect_multi(const tether::ClientOptions& options) {
  return connect<tether::MultiAgentClient>(options);
}

// -- playing ----------------------------------------------------------------------------------

/// The observation act() and end() play (Box(4)).
inline constexpr float kObs[4] = {0.1f, 0.2f, 0.3f, 0.4f};

/// `steps` get_action calls in `episode` with kObs, each followed by
/// log_returns(`reward`) when there is one; each call must succeed.
inline void act(tether::TetherClient& client, const std::string& episode, int steps,
                std::optional<double> reward = std::nullopt) {
  double action[1];
  for (int t = 0; t < steps; ++t) {
    tether::Status status = client.get_action(episode, kObs, 4, action, 1);
    ASSERT_TRUE(status.ok()) << status.to_string();
    if (reward) ASSERT_TRUE(client.log_returns(episode, *reward).ok());
  }
}

/// Ends `episode` with kObs; it must succeed (and return `expected_return` when given).
inline void end(tether::TetherClient& client, const std::string& episode,
                std::optional<double> expected_return = std::nullopt) {
  tether::Result<double> total = client.end_episode(episode, kObs, 4);
  ASSERT_TRUE(total.ok()) << total.status().to_string();
  if (expected_return) EXPECT_EQ(total.value(), *expected_return);
}

/// One step of episode `id` (Box(4) observations, Discrete(2) actions), as a batch.
inline std::shared_ptr<tether::Batch> one_step(const std::string& id) {
  auto batch = std::make_shared<tether::Batch>();
  tether::EpisodeChunk chunk;
  chunk.episode_id = id;
  chunk.obs = {0, 0, 0, 0, 1, 1, 1, 1};
  chunk.actions = {1};
  chunk.rewards = {1};
  chunk.action_logp = {-0.5};
  batch->chunks.push_back(chunk);
  batch->env_steps = 1;
  return batch;
}

/// The record of `episode_id` in a single-agent batch (null if none).
inline json record_of(const json& batch, const std::string& episode_id) {
  for (const json& record : batch["episodes"]) {
    if (record.value("episode_id", std::string()) == episode_id) return record;
  }
  return json();
}

/// Each batch once (a resend after a reconnect carries the same batch_seq and records), in order.
inline std::vector<json> unique_batches(const std::vector<json>& batches) {
  std::set<std::int64_t> seen;
  std::vector<json> out;
  for (const json& batch : batches) {
    if (seen.insert(batch["batch_seq"].get<std::int64_t>()).second) out.push_back(batch);
  }
  return out;
}

// -- waiting and errors -----------------------------------------------------------------------

/// Whether `condition` holds within `seconds` (asked every 10 ms).
inline bool wait_for(const std::function<bool()>& condition, double seconds) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(static_cast<int>(seconds * 1000));
  while (Clock::now() < deadline) {
    if (condition()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return condition();
}

/// The status of a call's result.
inline const tether::Status& status_of(const tether::Status& status) { return status; }
template <class T>
const tether::Status& status_of(const tether::Result<T>& result) {
  return result.status();
}

/// Makes `call` again while it returns an error with `code`: an error of the
/// server, which a client returns once, from the next call, which then did
/// nothing else. Counts those in `returned`; returns the last call's result.
template <class Call>
auto again_after(tether::ErrorCode code, int& returned, Call call) -> decltype(call()) {
  auto result = call();
  for (int tries = 0; status_of(result).code() == code && tries < 1000; ++tries) {
    ++returned;
    result = call();
  }
  return result;
}

}  // namespace fake

#endif  // _WIN32
