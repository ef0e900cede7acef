// MultiAgentClient against the fake server (fake_server.h) with a
// multi-module SET_CONFIG: records as §10.7 says (checked with
// validate_multi_agent_record), one inference run per module per frame
// (counted through the backends), groups (observations joined, actions split,
// rewards combined, leaving as a whole), agents that join, leave and retire,
// MAP_AGENTS and its timeout, per-module model swaps and claims, refusals,
// reconnects; and the real ONNX model through ONNX Runtime.
#include <gtest/gtest.h>

#ifndef _WIN32

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#if defined(__GLIBC__)
#include <malloc.h>  // mallinfo2: the heap in use
#endif
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "multi_agent_test_peer.h"
#include "client_test_helpers.h"
#include "test_data.h"
#include "tether/distributions.h"
#include "tether/episode.h"
#include "tether/multi_agent_client.h"
#include "tether/onnxruntime_backend.h"

namespace {

using fake::Clock;
using fake::Conn;
using fake::FakeServer;
using fake::ServerScript;
using fake::module_specs;
using nlohmann::json;

// -- backends that log every run ------------------------------------------------------

struct RunLog {
  std::mutex mutex;
  struct Run {
    std::string model;            // the module tag of the model (fake) or "onnx"
    std::size_t batch = 0;
    std::vector<float> obs;       // the whole batch
  };
  std::vector<Run> runs;
  std::vector<Run> take() {
    std::lock_guard<std::mutex> lock(mutex);
    std::vector<Run> out;
    out.swap(runs);
    return out;
  }
};

// A fake model: byte 0 is the preferred value of every categorical, the rest names the module.
std::vector<std::uint8_t> fake_model(std::uint8_t preferred, const std::string& module) {
  std::vector<std::uint8_t> bytes = {preferred};
  for (char c : module) bytes.push_back(static_cast<std::uint8_t>(c));
  return bytes;
}

class LoggingFakeBackend final : public tether::InferenceBackend {
 public:
  explicit LoggingFakeBackend(std::shared_ptr<RunLog> log) : log_(std::move(log)) {}
  tether::Status load(const std::uint8_t* model, std::size_t size, const std::string&, const std::string&) override {
    if (size < 2) return tether::Status(tether::ErrorCode::kInferenceFailed, "bad fake model");
    preferred_ = model[0];
    tag_.assign(reinterpret_cast<const char*>(model + 1), size - 1);
    return tether::Status::Ok();
  }
  tether::Status run(const float* obs, std::size_t batch, std::size_t obs_dim, float* out,
                     std::size_t out_dim) override {
    for (std::size_t b = 0; b < batch; ++b) {
      for (std::size_t k = 0; k < out_dim; ++k) {
        if (tag_.rfind("box", 0) == 0) {
          // A Box model: means +5, -5, +5, ... (outside [-1, 1]) and a small std.
          out[b * out_dim + k] = k < out_dim / 2 ? (k % 2 == 0 ? 5.0f : -5.0f) : -3.0f;
        } else {
          out[b * out_dim + k] = k % 2 == preferred_ ? 30.0f : 0.0f;
        }
      }
    }
    std::lock_guard<std::mutex> lock(log_->mutex);
    log_->runs.push_back({tag_, batch, std::vector<float>(obs, obs + batch * obs_dim)});
    return tether::Status::Ok();
  }
  bool loaded() const noexcept override { return !tag_.empty(); }
  std::size_t obs_dim() const noexcept override { return 0; }
  std::size_t out_dim() const noexcept override { return 0; }

 private:
  std::shared_ptr<RunLog> log_;
  std::size_t preferred_ = 0;
  std::string tag_;
};

// Wraps a real backend and logs its runs.
class LoggingBackend final : public tether::InferenceBackend {
 public:
  LoggingBackend(std::unique_ptr<tether::InferenceBackend> inner, std::shared_ptr<RunLog> log)
      : inner_(std::move(inner)), log_(std::move(log)) {}
  tether::Status load(const std::uint8_t* model, std::size_t size, const std::string& in,
                      const std::string& out) override {
    return inner_->load(model, size, in, out);
  }
  tether::Status run(const float* obs, std::size_t batch, std::size_t obs_dim, float* out,
                     std::size_t out_dim) override {
    {
      std::lock_guard<std::mutex> lock(log_->mutex);
      log_->runs.push_back({"onnx", batch, std::vector<float>(obs, obs + batch * obs_dim)});
    }
    return inner_->run(obs, batch, obs_dim, out, out_dim);
  }
  bool loaded() const noexcept override { return inner_->loaded(); }
  std::size_t obs_dim() const noexcept override { return inner_->obs_dim(); }
  std::size_t out_dim() const noexcept override { return inner_->out_dim(); }

 private:
  std::unique_ptr<tether::InferenceBackend> inner_;
  std::shared_ptr<RunLog> log_;
};

// -- the server's multi-agent layout ----------------------------------------------------

json box(int n, double low = -10, double high = 10) {
  return {{"type", "Box"}, {"shape", {n}}, {"dtype", "float32"}, {"low", low}, {"high", high}};
}

json module_json(json obs, json action, json value_obs_agents = json()) {
  json m = {{"observation_space", std::move(obs)},
            {"action_space", std::move(action)},
            {"onnx_input_names", {"obs"}},
            {"onnx_output_names", {"action_dist_inputs"}},
            {"trainable", true}};
  if (!value_obs_agents.is_null()) m["value_obs_agents"] = std::move(value_obs_agents);
  return m;
}

// chaser (adversary_*, a centralized critic over both adversaries), runner
// (good_0 and sub_*), pairmod (the groups pair = m_0 + m_1, mean, and duo = d_0 + d_1, sum).
json multi_config(std::int64_t steps_per_sample = 20, bool rules = true) {
  json modules = {
      {"chaser", module_json(box(3), {{"type", "Discrete"}, {"n", 2}}, json::array({"adversary_0", "adversary_1"}))},
      {"runner", module_json(box(2), {{"type", "Discrete"}, {"n", 2}})},
      {"pairmod", module_json(box(4), {{"type", "MultiDiscrete"}, {"nvec", {2, 2}}})},
  };
  json mapping = json::array({{{"pattern", "adversary_*"}, {"module", "chaser"}},
                              {{"agent_id", "good_0"}, {"module", "runner"}},
                              {{"pattern", "sub_*"}, {"module", "runner"}},
                              {{"agent_id", "pair"}, {"module", "pairmod"}},
                              {{"agent_id", "duo"}, {"module", "pairmod"}}});
  return {{"type", "SET_CONFIG"},
          {"env_steps_per_sample", steps_per_sample},
          {"force_on_policy", true},
          {"protocol_version", "1.3"},
          {"train_batch_size", 200},
          {"max_staleness", 1},
          {"heartbeat_interval_s", 0},
          {"modules", modules},
          {"policy_mapping", rules ? mapping : json()},
          {"groups",
           {{"pair", {{"members", {"m_0", "m_1"}}, {"reward", "mean"}}},
            {"duo", {{"members", {"d_0", "d_1"}}, {"reward", "sum"}}}}},
          {"policies_to_train", {"chaser", "runner", "pairmod"}}};
}

// Per module: (seq, preferred action). The server answers GET_STATE with the
// modules whose version differs from the request's weights_seq_nos.
struct Models {
  std::mutex mutex;
  std::map<std::string, std::pair<std::int64_t, std::uint8_t>> current = {
      {"chaser", {0, 1}}, {"runner", {0, 0}}, {"pairmod", {0, 1}}};
  json state_for(const json& request) {
    std::lock_guard<std::mutex> lock(mutex);
    json held = request.contains("weights_seq_nos") ? request["weights_seq_nos"] : json::object();
    json models = json::object();
    for (const auto& [id, version] : current) {
      if (held.contains(id) && held[id] == version.first) continue;
      models[id] = {{"weights_seq_no", version.first}, {"onnx_file", fake::onnx_file_of(fake_model(version.second, id))}};
    }
    return {{"type", "SET_STATE"}, {"models", models}};
  }
};

ServerScript multi_script(std::shared_ptr<Models> models, json config = multi_config()) {
  ServerScript script;
  script.full_config = std::move(config);
  script.on_get_state = [models](Conn& conn, const tether::Message& message, int) {
    conn.send(models->state_for(message.body));
    return true;
  };
  script.on_batch = [models](Conn& conn, const tether::Message& message, int) {
    if (message.type == tether::MessageType::kEpisodesAndGetState) conn.send(models->state_for(message.body));
    return true;  // (EPISODES has no answer)
  };
  return script;
}

tether::ClientOptions options_for(const FakeServer& server, std::shared_ptr<RunLog> log) {
  tether::ClientOptions options = fake::options_for(server, 7);
  options.when_queue_full = tether::QueueFullPolicy::kWait;
  options.backend_factory = [log] { return std::make_unique<LoggingFakeBackend>(log); };
  return options;
}

void add(tether::AgentFrame& frame, const std::string& id, std::vector<float> obs, bool truncated = false) {
  frame.add(id, obs.data(), obs.size(), truncated);
}

std::size_t index_of(const tether::AgentFrame& frame, const std::string& id) {
  for (std::size_t i = 0; i < frame.size(); ++i) {
    if (frame.agent_id(i) == id) return i;
  }
  return frame.size();
}

// Every record of every batch, validated as the server does (pass 1 of §10.8).
std::vector<json> valid_records(const std::vector<json>& batches, const json& config) {
  std::vector<json> records;
  const auto specs = module_specs(config);
  for (const json& batch : batches) {
    std::size_t agent_steps = 0;
    for (std::size_t i = 0; i < batch["episodes"].size(); ++i) {
      tether::Result<std::size_t> steps = tether::validate_multi_agent_record(batch["episodes"][i], i, specs, true);
      EXPECT_TRUE(steps.ok()) << steps.status().to_string() << "\n" << batch["episodes"][i].dump();
      if (steps.ok()) agent_steps += steps.value();
      records.push_back(batch["episodes"][i]);
    }
    EXPECT_EQ(batch["agent_steps"], agent_steps);
  }
  return records;
}

// The entries of one agent, in sending order.
std::vector<json> entries_of(const std::vector<json>& records, const std::string& episode, const std::string& agent) {
  std::vector<json> out;
  for (const json& record : records) {
    if (record["episode_id"] == episode && record["agents"].contains(agent)) out.push_back(record["agents"][agent]);
  }
  return out;
}

std::size_t steps_of(const std::vector<json>& entries) {
  std::size_t n = 0;
  for (const json& e : entries) n += e["actions"].size();
  return n;
}

// A multi-agent client (options_for's options, changed by `adjust` when given)
// connected to a fake server running multi_script(config), or `script`.
struct Connected {
  using Adjust = std::function<void(tether::ClientOptions&, const std::shared_ptr<RunLog>&)>;
  explicit Connected(json server_config) : config(std::move(server_config)), server(multi_script(models, config)) {
    connect(nullptr);
  }
  explicit Connected(ServerScript script, const Adjust& adjust = nullptr) : server(std::move(script)) {
    connect(adjust);
  }
  void connect(const Adjust& adjust) {
    tether::ClientOptions options = options_for(server, log);
    if (adjust) adjust(options, log);
    auto connected = tether::MultiAgentClient::connect(options);
    status = connected.status();
    if (connected.ok()) client = std::move(connected).value();
  }
  std::shared_ptr<Models> models = std::make_shared<Models>();  // (multi_script's)
  json config;
  FakeServer server;
  std::shared_ptr<RunLog> log = std::make_shared<RunLog>();
  tether::Status status;
  std::unique_ptr<tether::MultiAgentClient> client;
};

}  // namespace

TEST(AgentFrame, ReusesItsBuffersAndLaysOutObservations) {
  tether::AgentFrame frame;
  frame.reserve(4, 16);
  add(frame, "a", {1, 2, 3});
  add(frame, "b", {4, 5});
  ASSERT_EQ(frame.size(), 2u);
  EXPECT_EQ(frame.obs_size(0), 3u);
  EXPECT_EQ(frame.obs(1)[1], 5.0f);
  EXPECT_EQ(frame.action_size(0), 0u);
  frame.clear();
  EXPECT_TRUE(frame.empty());
  float* obs = frame.add_uninitialized("c", 2, true);
  obs[0] = 7;
  obs[1] = 8;
  EXPECT_EQ(frame.agent_id(0), "c");
  EXPECT_TRUE(frame.truncated(0));
  EXPECT_EQ(frame.obs(0)[1], 8.0f);
  // [1.4] An image given as bytes keeps its values 0-255.
  const std::uint8_t image[3] = {0, 17, 255};
  EXPECT_EQ(frame.add("cam", image, 3), 1u);
  EXPECT_EQ(frame.obs_size(1), 3u);
  EXPECT_EQ(std::vector<float>(frame.obs(1), frame.obs(1) + 3), (std::vector<float>{0.0f, 17.0f, 255.0f}));
  EXPECT_FALSE(frame.truncated(1));
}

TEST(MultiAgentClient, RecordsFollowTheSpecWithOneRunPerModulePerFrame) {
  const json config = multi_config();
  Connected c(config);
  ASSERT_TRUE(c.client) << c.status.to_string();
  tether::MultiAgentClient& client = *c.client;
  EXPECT_EQ(client.modules().size(), 3u);
  EXPECT_EQ(client.groups().size(), 2u);
  EXPECT_TRUE(client.has_mapping_rules());
  EXPECT_EQ(client.models_loaded(), 3);
  c.log->take();
  std::string episode = client.start_episode("ep-1").value();
  tether::AgentFrame frame;
  const int kFrames = 30;
  for (int t = 0; t < kFrames; ++t) {
    const float x = static_cast<float>(t);
    frame.clear();
    add(frame, "adversary_0", {x, 0, 0});
    add(frame, "m_1", {x, 11});  // members in any order: the group joins them in member order
    add(frame, "adversary_1", {x, 1, 1});
    add(frame, "good_0", {x, 2});
    add(frame, "m_0", {x, 10});
    const std::int64_t runs_before = client.inference_runs();
    ASSERT_TRUE(client.get_action(episode, frame).ok()) << client.last_error().to_string();
    EXPECT_EQ(client.inference_runs() - runs_before, 3);  // chaser, runner, pairmod
    for (std::size_t i = 0; i < frame.size(); ++i) EXPECT_EQ(frame.action_size(i), 1u) << frame.agent_id(i);
    EXPECT_EQ(frame.discrete_action(index_of(frame, "adversary_0")), 1);
    EXPECT_EQ(frame.discrete_action(index_of(frame, "good_0")), 0);
    EXPECT_EQ(frame.discrete_action(index_of(frame, "m_0")), 1);
    EXPECT_EQ(frame.discrete_action(index_of(frame, "m_1")), 1);
    for (const char* agent : {"adversary_0", "adversary_1", "good_0"}) {
      ASSERT_TRUE(client.log_returns(episode, agent, 1.0).ok());
    }
    ASSERT_TRUE(client.log_returns(episode, "m_0", 1.0).ok());
    ASSERT_TRUE(client.log_returns(episode, "m_1", 3.0).ok());  // mean: the group gets 2 per step
  }
  // One run per module per frame, with every actor of the module in it.
  std::map<std::string, int> runs;
  for (const RunLog::Run& run : c.log->take()) {
    ++runs[run.model];
    if (run.model == "chaser") EXPECT_EQ(run.batch, 2u);
    if (run.model != "chaser") EXPECT_EQ(run.batch, 1u);
    if (run.model == "pairmod") {
      ASSERT_EQ(run.obs.size(), 4u);
      EXPECT_EQ(run.obs[1], 10.0f);  // m_0 first, then m_1
      EXPECT_EQ(run.obs[3], 11.0f);
    }
  }
  EXPECT_EQ(runs["chaser"], kFrames);
  EXPECT_EQ(runs["runner"], kFrames);
  EXPECT_EQ(runs["pairmod"], kFrames);
  auto returns = client.end_episode(episode);
  ASSERT_TRUE(returns.ok()) << returns.status().to_string();
  EXPECT_DOUBLE_EQ(returns.value()["adversary_0"], kFrames);
  EXPECT_DOUBLE_EQ(returns.value()["pair"], 2.0 * kFrames);
  EXPECT_EQ(returns.value().count("m_0"), 0u);
  ASSERT_TRUE(client.flush().ok());
  EXPECT_TRUE(client.take_error().ok());

  std::vector<json> batches = c.server.batches();
  ASSERT_GE(batches.size(), 4u);
  std::int64_t env_steps = 0;
  for (std::size_t i = 0; i < batches.size(); ++i) {
    EXPECT_EQ(batches[i]["batch_seq"], static_cast<std::int64_t>(i + 1));
    EXPECT_EQ(batches[i]["client_session"], client.client_session());
    EXPECT_EQ(batches[i]["weights_seq_nos"], json({{"chaser", 0}, {"runner", 0}, {"pairmod", 0}}));
    EXPECT_FALSE(batches[i].contains("weights_seq_no"));
    env_steps += batches[i]["env_steps"].get<std::int64_t>();
  }
  EXPECT_EQ(env_steps, kFrames);
  std::vector<json> records = valid_records(batches, config);
  EXPECT_TRUE(records.back()["is_terminated"].get<bool>());
  for (const json& record : records) {
    EXPECT_FALSE(record["agents"].contains("m_0"));
    EXPECT_FALSE(record["agents"].contains("m_1"));
  }
  for (const char* agent : {"adversary_0", "adversary_1", "good_0", "pair"}) {
    std::vector<json> entries = entries_of(records, "ep-1", agent);
    ASSERT_FALSE(entries.empty()) << agent;
    EXPECT_EQ(steps_of(entries), static_cast<std::size_t>(kFrames)) << agent;
    for (std::size_t k = 0; k < entries.size(); ++k) {
      EXPECT_EQ(entries[k]["start_step"], 0);
      EXPECT_EQ(entries[k]["is_terminated"].get<bool>(), k + 1 == entries.size()) << agent;
      if (k > 0) EXPECT_EQ(entries[k]["obs"][0], entries[k - 1]["obs"].back()) << agent;  // continuation
    }
  }
  std::vector<json> pair = entries_of(records, "ep-1", "pair");
  EXPECT_EQ(pair[0]["module"], "pairmod");
  EXPECT_EQ(pair[0]["obs"][0], json({0.0, 10.0, 0.0, 11.0}));
  EXPECT_EQ(pair[0]["actions"][0], json({1, 1}));
  EXPECT_EQ(pair[0]["rewards"][0], 2.0);
  // The centralized critic's rows: both adversaries' observations of the same frame.
  std::vector<json> adversary = entries_of(records, "ep-1", "adversary_0");
  EXPECT_EQ(adversary[0]["value_obs"][3], json({3.0, 0.0, 0.0, 3.0, 1.0, 1.0}));
  EXPECT_EQ(adversary[0]["value_obs"].size(), adversary[0]["obs"].size());
  EXPECT_FALSE(entries_of(records, "ep-1", "good_0")[0].contains("value_obs"));
  EXPECT_EQ(client.agent_steps_sent(), 4 * kFrames);
  EXPECT_EQ(client.env_steps_sent(), kFrames);
}

TEST(MultiAgentClient, GroupsActAsOneAndLeaveAsAWhole) {
  const json config = multi_config();
  Connected c(config);
  ASSERT_TRUE(c.client) << c.status.to_string();
  tether::MultiAgentClient& client = *c.client;
  std::string episode = client.start_episode("g").value();
  tether::AgentFrame frame;
  add(frame, "m_0", {0, 1});
  EXPECT_EQ(client.get_action(episode, frame).code(), tether::ErrorCode::kInvalidArgument);  // m_1 missing
  for (int t = 0; t < 3; ++t) {
    frame.clear();
    add(frame, "m_0", {static_cast<float>(t), 1});
    add(frame, "m_1", {static_cast<float>(t), 2});
    add(frame, "d_0", {static_cast<float>(t), 3});
    add(frame, "d_1", {static_cast<float>(t), 4});
    ASSERT_TRUE(client.get_action(episode, frame).ok());
    ASSERT_TRUE(client.log_returns(episode, "d_0", 1.0).ok());
    ASSERT_TRUE(client.log_returns(episode, "d_1", 2.0).ok());  // sum: 3 per step
  }
  EXPECT_EQ(client.module_of(episode, "pair").value(), "pairmod");
  // Greedy actions split the same way, and record nothing.
  const std::int64_t runs = client.inference_runs();
  ASSERT_TRUE(client.compute_actions(frame).ok());
  EXPECT_EQ(client.inference_runs() - runs, 1);  // both groups: one pairmod run
  for (std::size_t i = 0; i < frame.size(); ++i) EXPECT_EQ(frame.discrete_action(i), 1) << frame.agent_id(i);
  // m_1 leaves: the group leaves, m_0 with its latest observation.
  tether::AgentFrame leaving;
  add(leaving, "m_1", {9, 9}, /*truncated=*/true);
  ASSERT_TRUE(client.end_agents(episode, leaving).ok());
  frame.clear();
  add(frame, "m_0", {5, 1});
  add(frame, "m_1", {5, 2});
  EXPECT_EQ(client.get_action(episode, frame).code(), tether::ErrorCode::kInvalidArgument);
  frame.clear();
  add(frame, "d_0", {5, 3});
  add(frame, "d_1", {5, 4});
  ASSERT_TRUE(client.get_action(episode, frame).ok());
  auto returns = client.end_episode(episode);
  ASSERT_TRUE(returns.ok());
  EXPECT_DOUBLE_EQ(returns.value()["duo"], 9.0);
  ASSERT_TRUE(client.flush().ok());
  std::vector<json> records = valid_records(c.server.batches(), config);
  std::vector<json> pair = entries_of(records, "g", "pair");
  ASSERT_EQ(steps_of(pair), 3u);
  EXPECT_TRUE(pair.back()["is_truncated"].get<bool>());
  EXPECT_FALSE(pair.back()["is_terminated"].get<bool>());
  EXPECT_EQ(pair.back()["obs"].back(), json({2.0, 1.0, 9.0, 9.0}));  // m_0's latest, m_1's final
  std::vector<json> duo = entries_of(records, "g", "duo");
  ASSERT_EQ(steps_of(duo), 4u);
  EXPECT_EQ(duo[0]["rewards"][0], 3.0);
  EXPECT_TRUE(duo.back()["is_terminated"].get<bool>());
}

TEST(MultiAgentClient, AgentsJoinLeaveAndRetireAtTheirOwnRates) {
  const json config = multi_config(10);
  Connected c(config);
  ASSERT_TRUE(c.client) << c.status.to_string();
  tether::MultiAgentClient& client = *c.client;
  std::string episode = client.start_episode("h").value();
  tether::AgentFrame frame;
  int sub_steps = 0;
  for (int t = 0; t < 20; ++t) {
    const float x = static_cast<float>(t);
    frame.clear();
    add(frame, "adversary_0", {x, 0, 0});
    if (t < 8) add(frame, "adversary_1", {x, 1, 1});
    if (t >= 5) add(frame, "good_0", {x, 2});          // joins at step 5
    if (t >= 6 && t < 16 && t % 3 == 0) {               // a sub-agent acting every third step
      add(frame, "sub_1", {x, 3});
      ++sub_steps;
    }
    ASSERT_TRUE(client.get_action(episode, frame).ok()) << t;
    if (t == 7) {
      tether::AgentFrame leaving;
      add(leaving, "adversary_1", {x, 1, 1}, /*truncated=*/true);
      ASSERT_TRUE(client.end_agents(episode, leaving).ok());
    }
    if (t == 15) {
      const float final_obs[2] = {x, 3};
      ASSERT_TRUE(client.retire_agent(episode, "sub_1", final_obs, 2).ok());
    }
  }
  frame.clear();
  add(frame, "sub_1", {0, 3});
  EXPECT_EQ(client.get_action(episode, frame).code(), tether::ErrorCode::kInvalidArgument);  // retired
  frame.clear();
  add(frame, "adversary_1", {0, 3, 3});
  EXPECT_EQ(client.get_action(episode, frame).code(), tether::ErrorCode::kInvalidArgument);  // left
  ASSERT_TRUE(client.end_episode(episode, nullptr, /*truncated=*/true).ok());
  ASSERT_TRUE(client.flush().ok());
  std::vector<json> records = valid_records(c.server.batches(), config);
  std::vector<json> good = entries_of(records, "h", "good_0");
  ASSERT_FALSE(good.empty());
  for (const json& e : good) EXPECT_EQ(e["start_step"], 5);
  EXPECT_EQ(steps_of(good), 15u);
  EXPECT_TRUE(good.back()["is_truncated"].get<bool>());  // the episode was truncated
  std::vector<json> sub = entries_of(records, "h", "sub_1");
  EXPECT_EQ(steps_of(sub), static_cast<std::size_t>(sub_steps));
  EXPECT_EQ(sub[0]["start_step"], 6);
  EXPECT_EQ(sub[0]["module"], "runner");
  EXPECT_TRUE(sub.back()["is_terminated"].get<bool>());
  EXPECT_EQ(sub.back()["obs"].back(), json({15.0, 3.0}));
  std::vector<json> left = entries_of(records, "h", "adversary_1");
  EXPECT_EQ(steps_of(left), 8u);
  EXPECT_TRUE(left.back()["is_truncated"].get<bool>());
  // The critic row keeps the final observation of the agent that left.
  std::vector<json> adversary = entries_of(records, "h", "adversary_0");
  EXPECT_EQ(adversary.back()["value_obs"].back(), json({19.0, 0.0, 0.0, 7.0, 1.0, 1.0}));
  EXPECT_TRUE(records.back()["is_truncated"].get<bool>());
}

// The client skips the id lookup for an agent in the same place as in the
// last frame: frames in a changing order, an agent leaving and a new one
// taking its place, and a duplicate must still give each agent its own rows.
TEST(MultiAgentClient, FramesInAnyOrderRecordEachAgentsOwnRows) {
  Connected c(multi_config(1000));
  ASSERT_TRUE(c.client) << c.status.to_string();
  tether::MultiAgentClient& client = *c.client;
  std::string episode = client.start_episode("order").value();
  std::map<std::string, std::vector<json>> expected;  // per agent, its observation rows in time order
  tether::AgentFrame frame;
  std::vector<std::string> ids = {"sub_0", "sub_1", "sub_2", "sub_3"};
  for (int t = 0; t < 12; ++t) {
    if (t == 6) {  // sub_1 retires; sub_9 takes its place in the order
      const float final_obs[2] = {1.0f, static_cast<float>(t)};
      ASSERT_TRUE(client.retire_agent(episode, "sub_1", final_obs, 2).ok());
      expected["sub_1"].push_back({1.0, static_cast<double>(t)});
      ids[1] = "sub_9";
    }
    std::vector<std::string> order = ids;
    if (t % 3 == 1) std::rotate(order.begin(), order.begin() + 1, order.end());
    if (t % 3 == 2) std::reverse(order.begin(), order.end());
    frame.clear();
    for (const std::string& id : order) {
      const float number = static_cast<float>(std::stoi(id.substr(4)));
      add(frame, id, {number, static_cast<float>(t)});
      expected[id].push_back({number, static_cast<double>(t)});
    }
    ASSERT_TRUE(client.get_action(episode, frame).ok()) << t;
    if (t == 8) {  // the same agent twice is refused, whichever place it is in
      tether::AgentFrame twice;
      add(twice, order[0], {0, 0});
      add(twice, order[0], {0, 0});
      EXPECT_EQ(client.get_action(episode, twice).code(), tether::ErrorCode::kInvalidArgument);
      twice.clear();
      add(twice, order[1], {0, 0});
      add(twice, order[1], {0, 0});
      EXPECT_EQ(client.get_action(episode, twice).code(), tether::ErrorCode::kInvalidArgument);
    }
  }
  frame.clear();
  for (const std::string& id : ids) {
    const float number = static_cast<float>(std::stoi(id.substr(4)));
    add(frame, id, {number, 12.0f});
    expected[id].push_back({number, 12.0});
  }
  ASSERT_TRUE(client.end_episode(episode, &frame, /*truncated=*/true).ok());
  ASSERT_TRUE(client.flush().ok());
  std::vector<json> records = valid_records(c.server.batches(), c.config);
  for (const auto& [id, rows] : expected) {
    std::vector<json> obs;
    for (const json& entry : entries_of(records, "order", id)) {
      for (const json& row : entry["obs"]) obs.push_back(row);
    }
    EXPECT_EQ(json(obs), json(rows)) << id;
  }
}

// Steps are recorded frame by frame for all agents at once and cut per agent:
// with cuts every few steps, agents acting at their own rates, one retiring
// and one joining, each agent's records must still hold exactly its own
// observations, rewards and critic rows, in order, each chunk continuing the
// last. Without groups, a frame with the last frame's agents in the same
// order takes the actors it found then (as many frames here do).
namespace {

void check_cuts_take_each_agents_own_steps(bool groups) {
  json config = multi_config(7);
  if (!groups) config.erase("groups");
  Connected c(config);
  ASSERT_TRUE(c.client) << c.status.to_string();
  tether::MultiAgentClient& client = *c.client;
  std::string episode = client.start_episode("shared").value();
  std::map<std::string, std::vector<json>> obs;      // per agent, its observation rows in time order
  std::map<std::string, std::vector<double>> rewards;  // per agent, per step
  std::map<std::string, std::vector<json>> critic;   // adversary_0's value_obs rows
  tether::AgentFrame frame;
  const int kFrames = 40;
  for (int t = 0; t < kFrames; ++t) {
    const float x = static_cast<float>(t);
    frame.clear();
    std::vector<std::string> acting = {"adversary_0", "adversary_1", "good_0"};
    if ((t / 4) % 2 == 0) acting.push_back("sub_0");
    if (t < 20 && t % 3 == 0) acting.push_back("sub_1");
    if (t >= 21) acting.push_back("sub_2");
    if (t % 5 == 4) std::reverse(acting.begin(), acting.end());
    for (const std::string& id : acting) {
      const float tag = static_cast<float>(id.back() - '0') + (id[0] == 'g' ? 10.0f : id[0] == 's' ? 20.0f : 0.0f);
      if (id[0] == 'a') {
        add(frame, id, {x, tag, -x});
        obs[id].push_back({x, tag, -x});
      } else {
        add(frame, id, {x, tag});
        obs[id].push_back({x, tag});
      }
    }
    critic["adversary_0"].push_back({x, 0.0, -x, x, 1.0, -x});
    ASSERT_TRUE(client.get_action(episode, frame).ok()) << t << ": " << client.last_error().to_string();
    for (const std::string& id : acting) {
      const double reward = static_cast<double>(t) + 0.25 * static_cast<double>(id.size() + id.back());
      ASSERT_TRUE(client.log_returns(episode, id, reward).ok());
      rewards[id].push_back(reward);
    }
    if (t == 20) {
      const float final_obs[2] = {99.0f, 21.0f};
      ASSERT_TRUE(client.retire_agent(episode, "sub_1", final_obs, 2).ok());
      obs["sub_1"].push_back({99.0, 21.0});
    }
  }
  frame.clear();
  for (const char* id : {"adversary_0", "adversary_1"}) {
    add(frame, id, {-1, -1, -1});
    obs[id].push_back({-1.0, -1.0, -1.0});
  }
  critic["adversary_0"].push_back({-1.0, -1.0, -1.0, -1.0, -1.0, -1.0});
  ASSERT_TRUE(client.end_episode(episode, &frame).ok());
  // Agents not in the final frame end with their latest observation.
  for (const char* id : {"good_0", "sub_0", "sub_2"}) obs[id].push_back(obs[id].back());
  ASSERT_TRUE(client.flush().ok());
  ASSERT_TRUE(client.take_error().ok());

  std::vector<json> records = valid_records(c.server.batches(), c.config);
  for (const auto& [id, expected_obs] : obs) {
    std::vector<json> entries = entries_of(records, "shared", id);
    ASSERT_FALSE(entries.empty()) << id;
    EXPECT_GT(entries.size(), id == "sub_1" ? 1u : 2u) << id << ": cut in several chunks";
    std::vector<json> got_obs;
    std::vector<double> got_rewards;
    std::vector<json> got_critic;
    for (std::size_t k = 0; k < entries.size(); ++k) {
      const json& e = entries[k];
      ASSERT_EQ(e["obs"].size(), e["actions"].size() + 1) << id;
      if (k > 0) EXPECT_EQ(e["obs"][0], got_obs.back()) << id << ": chunk " << k << " continues the last";
      for (std::size_t i = k > 0 ? 1 : 0; i < e["obs"].size(); ++i) got_obs.push_back(e["obs"][i]);
      for (const json& r : e["rewards"]) got_rewards.push_back(r.get<double>());
      if (id == "adversary_0") {
        ASSERT_EQ(e["value_obs"].size(), e["obs"].size());
        for (std::size_t i = k > 0 ? 1 : 0; i < e["value_obs"].size(); ++i) got_critic.push_back(e["value_obs"][i]);
      }
      EXPECT_EQ(e["start_step"], id == "sub_2" ? 21 : 0) << id;
    }
    EXPECT_EQ(json(got_obs), json(expected_obs)) << id;
    ASSERT_EQ(got_rewards.size(), rewards[id].size()) << id;
    for (std::size_t i = 0; i < got_rewards.size(); ++i) {
      EXPECT_EQ(got_rewards[i], static_cast<double>(static_cast<float>(rewards[id][i]))) << id << " step " << i;
    }
    if (id == "adversary_0") EXPECT_EQ(json(got_critic), json(critic["adversary_0"]));
    EXPECT_TRUE(entries.back()["is_terminated"].get<bool>()) << id;
  }
}

}  // namespace

TEST(MultiAgentClient, CutsTakeEachAgentsOwnStepsOutOfSharedFrames) {
  {
    SCOPED_TRACE("with groups");
    check_cuts_take_each_agents_own_steps(/*groups=*/true);
  }
  SCOPED_TRACE("without groups");
  check_cuts_take_each_agents_own_steps(/*groups=*/false);
}

// A frame with the same agents in the same order as the last one skips the
// id lookups, not the checks: a non-finite or wrong-sized observation, or an
// agent that left, is still refused, and refused frames record nothing.
TEST(MultiAgentClient, TheLastFramesAgentsAreStillChecked) {
  json config = multi_config(1000);
  config.erase("groups");  // (with groups every frame is looked up)
  Connected c(config);
  ASSERT_TRUE(c.client) << c.status.to_string();
  tether::MultiAgentClient& client = *c.client;
  std::string episode = client.start_episode("same").value();
  tether::AgentFrame frame;
  auto play = [&](float x, float sub_last, std::size_t sub_size) {
    frame.clear();
    add(frame, "good_0", {x, 0});
    std::vector<float> sub = {x, sub_last, 1};
    sub.resize(sub_size);
    add(frame, "sub_0", sub);
    return client.get_action(episode, frame);
  };
  for (int t = 0; t < 3; ++t) ASSERT_TRUE(play(static_cast<float>(t), 1, 2).ok());
  EXPECT_EQ(play(3, std::numeric_limits<float>::quiet_NaN(), 2).code(), tether::ErrorCode::kNonFiniteValue);
  EXPECT_EQ(play(3, std::numeric_limits<float>::infinity(), 2).code(), tether::ErrorCode::kNonFiniteValue);
  tether::Status wrong_size = play(3, 1, 3);
  EXPECT_EQ(wrong_size.code(), tether::ErrorCode::kInvalidArgument);
  EXPECT_NE(wrong_size.message().find("'sub_0': observation has 3 values, module 'runner' needs 2"), std::string::npos)
      << wrong_size.message();
  ASSERT_TRUE(play(3, 1, 2).ok());
  const float final_obs[2] = {4, 1};
  ASSERT_TRUE(client.retire_agent(episode, "sub_0", final_obs, 2).ok());
  EXPECT_EQ(play(4, 1, 2).code(), tether::ErrorCode::kInvalidArgument);  // sub_0 left
  frame.clear();
  add(frame, "good_0", {4, 0});
  ASSERT_TRUE(client.get_action(episode, frame).ok());
  ASSERT_TRUE(client.end_episode(episode).ok());
  ASSERT_TRUE(client.flush().ok());
  std::vector<json> records = valid_records(c.server.batches(), c.config);
  std::vector<json> sub = entries_of(records, "same", "sub_0");
  ASSERT_EQ(sub.size(), 1u);
  EXPECT_EQ(sub[0]["obs"], json({{0.0, 1.0}, {1.0, 1.0}, {2.0, 1.0}, {3.0, 1.0}, {4.0, 1.0}}));
  std::vector<json> good = entries_of(records, "same", "good_0");
  EXPECT_EQ(steps_of(good), 5u);
}

// end_episode's returns: per actor, every reward logged in the episode,
// before it first acted, while it acted and after it left; a group's members'
// rewards added up (sum) or averaged (mean) into the group's.
TEST(MultiAgentClient, ReturnsAddUpEveryRewardPerActor) {
  Connected c(multi_config(1000));
  ASSERT_TRUE(c.client) << c.status.to_string();
  tether::MultiAgentClient& client = *c.client;
  std::string episode = client.start_episode("returns").value();
  ASSERT_TRUE(client.log_returns(episode, "adversary_0", 0.5).ok());  // before it acts
  tether::AgentFrame frame;
  add(frame, "adversary_0", {0, 0, 0});
  add(frame, "m_0", {0, 0});
  add(frame, "m_1", {0, 0});
  add(frame, "d_0", {0, 0});
  add(frame, "d_1", {0, 0});
  add(frame, "good_0", {0, 0});
  ASSERT_TRUE(client.get_action(episode, frame).ok());
  ASSERT_TRUE(client.log_returns(episode, "adversary_0", 1.0).ok());
  ASSERT_TRUE(client.log_returns(episode, "m_0", 2.0).ok());  // pair: mean
  ASSERT_TRUE(client.log_returns(episode, "m_1", 4.0).ok());
  ASSERT_TRUE(client.log_returns(episode, "d_0", 2.0).ok());  // duo: sum
  ASSERT_TRUE(client.log_returns(episode, "d_1", 4.0).ok());
  ASSERT_TRUE(client.log_returns(episode, "good_0", 1.5).ok());
  tether::AgentFrame leaving;
  add(leaving, "good_0", {1, 1});
  ASSERT_TRUE(client.end_agents(episode, leaving).ok());
  ASSERT_TRUE(client.log_returns(episode, "good_0", 0.25).ok());  // after it left
  frame.clear();
  add(frame, "adversary_0", {1, 1, 1});
  add(frame, "m_0", {1, 1});
  add(frame, "m_1", {1, 1});
  ASSERT_TRUE(client.get_action(episode, frame).ok());
  ASSERT_TRUE(client.log_returns(episode, "adversary_0", 1.0).ok());
  ASSERT_TRUE(client.log_returns(episode, "m_1", 1.0).ok());
  tether::Result<std::map<std::string, double>> returns = client.end_episode(episode, nullptr, true);
  ASSERT_TRUE(returns.ok()) << returns.status().to_string();
  const std::map<std::string, double> expected = {
      {"adversary_0", 2.5}, {"pair", 3.5}, {"duo", 6.0}, {"good_0", 1.75}};
  EXPECT_EQ(returns.value(), expected);
  ASSERT_TRUE(client.flush().ok());
  // The steps carry what was logged after each action.
  std::vector<json> records = valid_records(c.server.batches(), c.config);
  json rewards = json::array();
  for (const json& entry : entries_of(records, "returns", "pair")) {
    for (const json& r : entry["rewards"]) rewards.push_back(r);
  }
  EXPECT_EQ(rewards, json({3.0, 0.5}));
  // Ended without final observations: each agent's latest one closes its record.
  std::vector<json> adversary = entries_of(records, "returns", "adversary_0");
  ASSERT_FALSE(adversary.empty());
  EXPECT_EQ(adversary.back()["obs"], json({{0.0, 0.0, 0.0}, {1.0, 1.0, 1.0}, {1.0, 1.0, 1.0}}));
}

TEST(MultiAgentClient, MapsWithMapAgentsOncePerFrameOfNewAgents) {
  auto models = std::make_shared<Models>();
  const json config = multi_config(20, /*rules=*/false);
  ServerScript script = multi_script(models, config);
  script.map_agent = [](const std::string& id) {
    if (id.rfind("adversary_", 0) == 0) return std::string("chaser");
    if (id == "pair") return std::string("pairmod");
    return std::string("runner");
  };
  Connected c(script);
  ASSERT_TRUE(c.client) << c.status.to_string();
  tether::MultiAgentClient& client = *c.client;
  EXPECT_FALSE(client.has_mapping_rules());
  std::string episode = client.start_episode("ep-m").value();
  tether::AgentFrame frame;
  for (int t = 0; t < 25; ++t) {
    frame.clear();
    add(frame, "adversary_0", {1, 0, 0});
    add(frame, "m_0", {0, 1});
    add(frame, "m_1", {0, 2});
    if (t >= 10) add(frame, "good_0", {1, 2});
    ASSERT_TRUE(client.get_action(episode, frame).ok()) << client.last_error().to_string();
  }
  EXPECT_EQ(client.map_requests(), 2);
  std::vector<json> requests;
  for (const json& message : c.server.messages()) {
    if (message["type"] == "MAP_AGENTS") requests.push_back(message);
  }
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_EQ(requests[0]["episode_id"], "ep-m");
  EXPECT_EQ(requests[0]["agent_ids"], json({"adversary_0", "pair"}));  // the group id, never its members
  EXPECT_EQ(requests[1]["agent_ids"], json({"good_0"}));
  EXPECT_EQ(client.module_of(episode, "good_0").value(), "runner");
  ASSERT_TRUE(client.end_episode(episode).ok());
  ASSERT_TRUE(client.flush().ok());
  std::vector<json> records = valid_records(c.server.batches(), config);
  EXPECT_EQ(entries_of(records, "ep-m", "pair")[0]["module"], "pairmod");
}

TEST(MultiAgentClient, MapAgentsWithoutAnswerTimesOutClearly) {
  auto models = std::make_shared<Models>();
  ServerScript script = multi_script(models, multi_config(20, /*rules=*/false));
  script.on_map_agents = [](Conn&, const tether::Message&) { return true; };  // never answers
  Connected c(script, [](tether::ClientOptions& options, const std::shared_ptr<RunLog>&) {
    options.response_timeout_s = 0.5;
  });
  ASSERT_TRUE(c.client) << c.status.to_string();
  tether::MultiAgentClient& client = *c.client;
  std::string episode = client.start_episode().value();
  tether::AgentFrame frame;
  add(frame, "adversary_0", {1, 0, 0});
  const auto start = Clock::now();
  tether::Status status = client.get_action(episode, frame);
  const double waited = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_EQ(status.code(), tether::ErrorCode::kTimeout) << status.to_string();
  EXPECT_NE(status.message().find("MAP_AGENTS"), std::string::npos) << status.to_string();
  EXPECT_NE(status.message().find("response_timeout_s"), std::string::npos) << status.to_string();
  EXPECT_GE(waited, 0.45);
  EXPECT_LT(waited, 3.0);
  EXPECT_EQ(frame.action_size(0), 0u);
  EXPECT_FALSE(client.module_of(episode, "adversary_0").ok());  // nothing recorded
}

TEST(MultiAgentClient, ModelsSwapPerModuleBetweenFramesAndBatchesClaimPerModule) {
  auto models = std::make_shared<Models>();
  const json config = multi_config(12);
  ServerScript script = multi_script(models, config);
  script.on_batch = [models](Conn& conn, const tether::Message& message, int n) {
    {
      std::lock_guard<std::mutex> lock(models->mutex);
      models->current["chaser"] = {n, static_cast<std::uint8_t>(n % 2)};  // only chaser trains
    }
    conn.send(models->state_for(message.body));
    return true;
  };
  Connected c(script, [](tether::ClientOptions& options, const std::shared_ptr<RunLog>&) {
    options.wait_for_weights = true;  // each batch's answer is in use before the next frame
  });
  ASSERT_TRUE(c.client) << c.status.to_string();
  tether::MultiAgentClient& client = *c.client;
  std::string episode = client.start_episode("swap").value();
  tether::AgentFrame frame;
  std::vector<int> chaser_actions;
  std::vector<std::int64_t> chaser_versions;
  for (int t = 0; t < 60; ++t) {
    const float x = static_cast<float>(t);
    frame.clear();
    add(frame, "adversary_0", {x, 0, 0});
    add(frame, "good_0", {x, 2});
    if (t % 7 == 0) add(frame, "adversary_1", {x, 1, 1});  // its last step is often held back across a swap
    ASSERT_TRUE(client.get_action(episode, frame).ok());
    const std::int64_t a0 = frame.discrete_action(0);
    EXPECT_EQ(frame.discrete_action(1), 0);  // runner never changes
    if (frame.size() == 3) EXPECT_EQ(a0, frame.discrete_action(2)) << "a model changed within frame " << t;
    chaser_actions.push_back(static_cast<int>(a0));
    chaser_versions.push_back(client.weights_seq_no("chaser").value());
  }
  ASSERT_TRUE(client.flush().ok());
  EXPECT_EQ(client.weights_seq_no("runner"), 0);
  EXPECT_GE(client.weights_seq_no("chaser").value(), 4);
  // The action follows the version in use: model n prefers n % 2 (version 0 prefers 1).
  for (std::size_t t = 0; t < chaser_actions.size(); ++t) {
    const int expected = chaser_versions[t] == 0 ? 1 : static_cast<int>(chaser_versions[t] % 2);
    EXPECT_EQ(chaser_actions[t], expected) << t;
  }
  std::vector<json> batches = c.server.batches();
  ASSERT_GE(batches.size(), 5u);
  valid_records(batches, config);
  int older_claims = 0;
  for (std::size_t i = 0; i < batches.size(); ++i) {
    // Per module, the oldest version its steps in the batch acted with (obs[t][0] is the frame).
    std::int64_t oldest = -1;
    for (const json& record : batches[i]["episodes"]) {
      for (const char* agent : {"adversary_0", "adversary_1"}) {
        if (!record["agents"].contains(agent)) continue;
        const json& entry = record["agents"][agent];
        for (std::size_t k = 0; k < entry["actions"].size(); ++k) {
          const std::int64_t v = chaser_versions[static_cast<std::size_t>(entry["obs"][k][0].get<double>())];
          if (oldest < 0 || v < oldest) oldest = v;
        }
      }
    }
    ASSERT_GE(oldest, 0);
    EXPECT_EQ(batches[i]["weights_seq_nos"]["chaser"], oldest) << i;
    older_claims += oldest < static_cast<std::int64_t>(i);  // a held-back step of an older version
    EXPECT_EQ(batches[i]["weights_seq_nos"]["runner"], 0);
    EXPECT_EQ(batches[i]["weights_seq_nos"]["pairmod"], 0);
  }
  EXPECT_GT(older_claims, 0);
  EXPECT_EQ(client.models_loaded(), 3 + static_cast<std::int64_t>(batches.size()));
}

TEST(MultiAgentClient, RefusedBatchIsAnErrorAndItsEpisodeIsNotSentAgain) {
  auto models = std::make_shared<Models>();
  const json config = multi_config(10);
  ServerScript script = multi_script(models, config);
  script.on_batch = [models](Conn& conn, const tether::Message& message, int n) {
    if (n == 1) {
      conn.send(fake::refusal("MODULE_MISMATCH", "episodes[0].agents['adversary_0']: no"));
    } else {
      conn.send(models->state_for(message.body));
    }
    return true;
  };
  Connected c(script);
  ASSERT_TRUE(c.client) << c.status.to_string();
  tether::MultiAgentClient& client = *c.client;
  tether::AgentFrame frame;
  // The refusal comes back, once, from the call after it arrived (which does nothing else).
  int refused = 0;
  auto ok = [&](auto call) { return fake::again_after(tether::ErrorCode::kModuleMismatch, refused, call).ok(); };
  for (const char* id : {"first", "second"}) {
    tether::Result<std::string> started =
        fake::again_after(tether::ErrorCode::kModuleMismatch, refused, [&] { return client.start_episode(id); });
    ASSERT_TRUE(started.ok()) << started.status().to_string();
    const std::string episode = started.value();
    for (int t = 0; t < 15; ++t) {
      frame.clear();
      add(frame, "adversary_0", {static_cast<float>(t), 0, 0});
      ASSERT_TRUE(ok([&] { return client.get_action(episode, frame); }));
    }
    ASSERT_TRUE(ok([&] { return client.end_episode(episode); }));
    ASSERT_TRUE(ok([&] { return client.flush(); }));
  }
  EXPECT_EQ(refused, 1);
  EXPECT_EQ(client.last_error().code(), tether::ErrorCode::kModuleMismatch) << client.last_error().to_string();
  EXPECT_TRUE(client.take_error().ok());
  std::vector<json> batches = c.server.batches();
  ASSERT_GE(batches.size(), 2u);
  for (std::size_t i = 1; i < batches.size(); ++i) {
    for (const json& record : batches[i]["episodes"]) EXPECT_EQ(record["episode_id"], "second");
  }
  EXPECT_EQ(steps_of(entries_of(valid_records(batches, config), "second", "adversary_0")), 15u);
}

TEST(MultiAgentClient, LostConnectionResendsTheBatchWithTheSameSeq) {
  auto models = std::make_shared<Models>();
  const json config = multi_config(10);
  ServerScript script = multi_script(models, config);
  script.on_batch = [models](Conn& conn, const tether::Message& message, int n) {
    if (n == 1) return false;  // gone before answering
    conn.send(models->state_for(message.body));
    return true;
  };
  Connected c(script, [](tether::ClientOptions& options, const std::shared_ptr<RunLog>&) {
    options.wait_for_weights = true;  // the new connection's config arrives while get_action waits in its cut
  });
  ASSERT_TRUE(c.client) << c.status.to_string();
  tether::MultiAgentClient& client = *c.client;
  std::string episode = client.start_episode("r").value();
  tether::AgentFrame frame;
  for (int t = 0; t < 25; ++t) {
    frame.clear();
    add(frame, "adversary_0", {static_cast<float>(t), 0, 0});
    add(frame, "m_1", {static_cast<float>(t), 1});
    add(frame, "good_0", {static_cast<float>(t), 0});
    add(frame, "m_0", {static_cast<float>(t), 0});
    ASSERT_TRUE(client.get_action(episode, frame).ok());
    EXPECT_EQ(frame.action_size(1), 1u);
    EXPECT_EQ(frame.discrete_action(1), 1);  // a member's part of the group's action
  }
  ASSERT_TRUE(client.end_episode(episode).ok());
  ASSERT_TRUE(client.flush().ok());
  std::vector<json> batches = c.server.batches();
  ASSERT_GE(batches.size(), 3u);
  EXPECT_EQ(batches[1]["batch_seq"], 1);
  EXPECT_EQ(batches[1]["episodes"], batches[0]["episodes"]);
  EXPECT_GE(client.reconnects(), 1);
  std::vector<json> delivered(batches.begin() + 1, batches.end());
  std::vector<json> records = valid_records(delivered, config);
  EXPECT_EQ(steps_of(entries_of(records, "r", "adversary_0")), 25u);
  EXPECT_EQ(steps_of(entries_of(records, "r", "pair")), 25u);
}

TEST(MultiAgentClient, BadCallsAreStatuses) {
  auto models = std::make_shared<Models>();
  Connected c(multi_script(models));
  ASSERT_TRUE(c.client) << c.status.to_string();
  tether::MultiAgentClient& client = *c.client;
  tether::AgentFrame frame;
  add(frame, "adversary_0", {1, 0, 0});
  EXPECT_EQ(client.get_action("nope", frame).code(), tether::ErrorCode::kInvalidArgument);
  std::string episode = client.start_episode("e").value();
  EXPECT_EQ(client.start_episode("e").status().code(), tether::ErrorCode::kInvalidArgument);
  frame.clear();
  add(frame, "adversary_0", {1, 0});
  EXPECT_EQ(client.get_action(episode, frame).code(), tether::ErrorCode::kInvalidArgument);  // wrong size
  frame.clear();
  add(frame, "zzz", {1, 0});
  EXPECT_EQ(client.get_action(episode, frame).code(), tether::ErrorCode::kUnmappedAgent);
  frame.clear();
  add(frame, "adversary_0", {1, std::nanf(""), 0});
  EXPECT_EQ(client.get_action(episode, frame).code(), tether::ErrorCode::kNonFiniteValue);
  frame.clear();
  add(frame, "adversary_0", {1, 0, 0});
  add(frame, "adversary_0", {1, 0, 0});
  EXPECT_EQ(client.get_action(episode, frame).code(), tether::ErrorCode::kInvalidArgument);  // twice
  EXPECT_EQ(client.log_returns(episode, "adversary_0", std::nan("")).code(), tether::ErrorCode::kNonFiniteValue);
  frame.clear();
  add(frame, "adversary_0", {1, 0, 0});
  ASSERT_TRUE(client.get_action(episode, frame).ok());
  ASSERT_TRUE(client.end_episode(episode).ok());
  EXPECT_EQ(client.end_episode(episode).status().code(), tether::ErrorCode::kInvalidArgument);
  client.close();
  EXPECT_EQ(client.flush().code(), tether::ErrorCode::kClosed);
  EXPECT_EQ(client.start_episode().status().code(), tether::ErrorCode::kClosed);
}

TEST(MultiAgentClient, BoxActionsRecordTheRawSampleAndGiveTheEngineTheClippedOne) {
  json config = multi_config(8);
  json box_action = {{"type", "Box"}, {"shape", {2}}, {"dtype", "float32"}, {"low", -1.0}, {"high", 1.0}};
  config["modules"] = {{"box_arm", module_json(box(3), box_action)}, {"box_hands", module_json(box(4), box_action)}};
  config["policy_mapping"] = json::array({{{"pattern", "arm_*"}, {"module", "box_arm"}},
                                          {{"agent_id", "hands"}, {"module", "box_hands"}}});
  config["groups"] = {{"hands", {{"members", {"h_0", "h_1"}}}}};
  ServerScript script;
  script.full_config = config;
  script.on_get_state = [](Conn& conn, const tether::Message&, int) {
    conn.send({{"type", "SET_STATE"},
               {"models", {{"box_arm", {{"weights_seq_no", 0}, {"onnx_file", fake::onnx_file_of(fake_model(0, "box_arm"))}}},
                           {"box_hands", {{"weights_seq_no", 0}, {"onnx_file", fake::onnx_file_of(fake_model(0, "box_hands"))}}}}}});
    return true;
  };
  script.on_batch = [](Conn& conn, const tether::Message&, int) {
    conn.send({{"type", "SET_STATE"}, {"models", json::object()}});
    return true;
  };
  Connected c(script);
  ASSERT_TRUE(c.client) << c.status.to_string();
  tether::MultiAgentClient& client = *c.client;
  std::string episode = client.start_episode("box").value();
  tether::AgentFrame frame;
  for (int t = 0; t < 12; ++t) {
    frame.clear();
    add(frame, "arm_0", {0, 0, static_cast<float>(t)});
    add(frame, "h_0", {0, 1});
    add(frame, "h_1", {0, 2});
    ASSERT_TRUE(client.get_action(episode, frame).ok()) << client.last_error().to_string();
    ASSERT_EQ(frame.action_size(0), 2u);
    EXPECT_EQ(frame.action(0)[0], 1.0);   // clipped into the box
    EXPECT_EQ(frame.action(0)[1], -1.0);
    ASSERT_EQ(frame.action_size(1), 1u);  // each member: its half of the group's clipped action
    EXPECT_EQ(frame.action(1)[0], 1.0);
    EXPECT_EQ(frame.action(2)[0], -1.0);
  }
  ASSERT_TRUE(client.compute_actions(frame).ok());
  EXPECT_EQ(frame.action(0)[0], 1.0);  // the clipped mean
  ASSERT_TRUE(client.end_episode(episode).ok());
  ASSERT_TRUE(client.flush().ok());
  std::vector<json> records = valid_records(c.server.batches(), config);
  const tether::Space space = tether::Space::from_json(box_action).value();
  for (const char* actor : {"arm_0", "hands"}) {
    std::vector<json> entries = entries_of(records, "box", actor);
    ASSERT_EQ(steps_of(entries), 12u) << actor;
    for (const json& entry : entries) {
      for (std::size_t k = 0; k < entry["actions"].size(); ++k) {
        const std::vector<double> action = entry["actions"][k].get<std::vector<double>>();
        EXPECT_NEAR(action[0], 5.0, 0.3) << actor;  // the raw sample
        EXPECT_NEAR(action[1], -5.0, 0.3) << actor;
        const std::vector<float> dist = entry["action_dist_inputs"][k].get<std::vector<float>>();
        tether::Result<double> logp = tether::log_prob(space, dist.data(), dist.size(), action.data(), 2);
        ASSERT_TRUE(logp.ok());
        EXPECT_NEAR(entry["action_logp"][k].get<double>(), logp.value(), 1e-3);
      }
    }
  }
}

TEST(MultiAgentClient, SingleAgentServerIsRefusedClearly) {
  FakeServer server(ServerScript{});  // no "modules"
  auto log = std::make_shared<RunLog>();
  auto connected = tether::MultiAgentClient::connect(options_for(server, log));
  EXPECT_EQ(connected.status().code(), tether::ErrorCode::kInvalidField) << connected.status().to_string();
  EXPECT_NE(connected.status().message().find("modules"), std::string::npos) << connected.status().to_string();
}

// Two unknown modules: the first in sorted order is named (in every SDK), not the first in rule order.
TEST(MultiAgentClient, RulesNamingAnUnknownModuleAreRefusedAtConnect) {
  json config = multi_config();
  config["policy_mapping"].push_back({{"pattern", "y_*"}, {"module", "zebra"}});
  config["policy_mapping"].push_back({{"pattern", "x_*"}, {"module", "ghost"}});
  auto models = std::make_shared<Models>();
  FakeServer server(multi_script(models, config));
  auto log = std::make_shared<RunLog>();
  auto connected = tether::MultiAgentClient::connect(options_for(server, log));
  EXPECT_EQ(connected.status().code(), tether::ErrorCode::kInvalidField) << connected.status().to_string();
  EXPECT_NE(connected.status().message().find("'ghost'"), std::string::npos) << connected.status().to_string();
}

TEST(MultiAgentClient, OffPolicyBatchesAreAcknowledgedByPerModuleGetState) {
  auto models = std::make_shared<Models>();
  json config = multi_config(10);
  config["force_on_policy"] = false;
  ServerScript script = multi_script(models, config);
  script.on_get_state = [models](Conn& conn, const tether::Message& message, int) {
    if (message.body["weights_seq_nos"].size() > 0) {
      std::lock_guard<std::mutex> lock(models->mutex);
      models->current["runner"] = {1, 1};  // the first acknowledgement brings runner 1
    }
    conn.send(models->state_for(message.body));
    return true;
  };
  Connected c(script);
  ASSERT_TRUE(c.client) << c.status.to_string();
  tether::MultiAgentClient& client = *c.client;
  EXPECT_FALSE(client.force_on_policy());
  std::string episode = client.start_episode("off").value();
  tether::AgentFrame frame;
  for (int t = 0; t < 30; ++t) {
    frame.clear();
    add(frame, "good_0", {static_cast<float>(t), 0});
    ASSERT_TRUE(client.get_action(episode, frame).ok());
  }
  ASSERT_TRUE(client.end_episode(episode).ok());
  ASSERT_TRUE(client.flush().ok());
  EXPECT_EQ(client.weights_seq_no("runner"), 1);
  std::vector<json> messages = c.server.messages();
  int episodes = 0;
  for (std::size_t i = 0; i < messages.size(); ++i) {
    if (messages[i]["type"] != "EPISODES") continue;
    ++episodes;
    ASSERT_LT(i + 1, messages.size());
    EXPECT_EQ(messages[i + 1]["type"], "GET_STATE");  // right behind: its answer acknowledges the batch
    EXPECT_TRUE(messages[i + 1]["weights_seq_nos"].is_object());
  }
  EXPECT_GE(episodes, 2);
  EXPECT_EQ(steps_of(entries_of(valid_records(c.server.batches(), config), "off", "good_0")), 30u);
  EXPECT_EQ(client.agent_steps_sent(), 30);
  EXPECT_TRUE(client.take_error().ok());
}

namespace {

// A multi-agent server whose batches are never answered: one batch stays in flight.
ServerScript unanswering_multi_script() {
  ServerScript script = multi_script(std::make_shared<Models>());
  script.on_batch = [](Conn&, const tether::Message&, int) { return true; };
  return script;
}

// A multi-agent link of `server` with room for 5 steps behind the batch in flight.
tether::LinkOptions five_step_link_options(const FakeServer& server) {
  auto log = std::make_shared<RunLog>();
  tether::LinkOptions options;
  options.port = server.port();
  options.multi_agent = true;
  options.max_queued_steps = 5;
  options.backend_factory = [log] { return std::make_unique<LoggingFakeBackend>(log); };
  return options;
}

// The record of episode `id`: module "runner"'s agent good_0 acting `steps`
// times (observation (t, 0) at step t when `numbered`, else (0, 0)).
tether::MultiAgentRecord runner_record(const std::string& id, int steps, bool numbered) {
  tether::MultiAgentRecord record;
  record.episode_id = id;
  tether::AgentEntry entry;
  entry.module = "runner";
  for (int t = 0; t < steps; ++t) {
    entry.chunk.obs.insert(entry.chunk.obs.end(), {numbered ? static_cast<float>(t) : 0.0f, 0.0f});
    entry.chunk.actions.push_back(0);
    entry.chunk.rewards.push_back(0);
    entry.chunk.action_logp.push_back(-0.7);
  }
  entry.chunk.obs.insert(entry.chunk.obs.end(), {0.0f, 0.0f});
  record.agents.emplace_back("good_0", std::move(entry));
  return record;
}

// Whether the server received a batch within 5 s.
bool batch_arrives(FakeServer& server) {
  return fake::wait_for([&] { return !server.batches().empty(); }, 5.0);
}

}  // namespace

TEST(MultiAgentLink, AFullQueueDropsWholeEpisodesOfMultiAgentBatches) {
  FakeServer server(unanswering_multi_script());
  tether::ServerLink link(five_step_link_options(server));
  ASSERT_TRUE(link.start().ok());
  auto batch_of = [](std::vector<std::pair<std::string, int>> episodes) {
    auto batch = std::make_shared<tether::Batch>();
    for (const auto& [id, steps] : episodes) {
      batch->records.push_back(runner_record(id, steps, /*numbered=*/false));
      batch->agent_steps += steps;
    }
    batch->env_steps = batch->agent_steps * 2;
    return batch;
  };
  EXPECT_TRUE(link.submit(batch_of({{"a", 2}})).empty());
  ASSERT_TRUE(batch_arrives(server));  // "a" is in flight
  EXPECT_TRUE(link.submit(batch_of({{"b", 3}})).empty());
  auto third = batch_of({{"b", 1}, {"c", 2}});
  std::set<std::string> gone = link.submit(third);  // 3 + 3 > 5: the batch with "b" is dropped, and "b" with it
  EXPECT_EQ(gone, std::set<std::string>{"b"});
  EXPECT_EQ(link.batches_dropped(), 1);
  ASSERT_EQ(third->records.size(), 1u);
  EXPECT_EQ(third->records[0].episode_id, "c");
  EXPECT_EQ(third->agent_steps, 2);
  EXPECT_EQ(third->env_steps, 4);  // scaled with the agent steps
}

namespace {
// Records handed over unbuilt: each episode's are one agent's `steps` steps, built on the I/O thread.
class StepsSource final : public tether::RecordSource {
 public:
  explicit StepsSource(std::map<std::string, int> steps) : steps_(std::move(steps)) {}
  void build(tether::Batch& batch) override {
    built_on.store(std::this_thread::get_id());
    for (const tether::PendingRecord& pending : batch.pending_records) {
      batch.records.push_back(runner_record(pending.episode_id, steps_.at(pending.episode_id), /*numbered=*/true));
    }
  }
  std::atomic<std::thread::id> built_on{};

 private:
  std::map<std::string, int> steps_;
};
}  // namespace

TEST(MultiAgentLink, PendingRecordsAreBuiltOffTheEngineThreadAndDropAsWholeEpisodes) {
  FakeServer server(unanswering_multi_script());
  tether::ServerLink link(five_step_link_options(server));
  ASSERT_TRUE(link.start().ok());
  std::vector<StepsSource*> sources;
  auto batch_of = [&](std::map<std::string, int> episodes) {
    auto batch = std::make_shared<tether::Batch>();
    batch->multi_agent = true;
    for (const auto& [id, steps] : episodes) {
      batch->pending_records.push_back(tether::PendingRecord{id, steps});
      batch->agent_steps += steps;
    }
    auto source = std::make_shared<StepsSource>(std::move(episodes));
    sources.push_back(source.get());
    batch->record_source = std::move(source);
    batch->env_steps = batch->agent_steps * 2;
    return batch;
  };
  // Waits for the kRecordsBuilt event handing back `source`.
  std::vector<tether::LinkEvent> events;
  auto handed_back = [&](const tether::RecordSource* source) {
    for (int i = 0; i < 500; ++i) {
      link.take_events(events);
      for (const tether::LinkEvent& event : events) {
        if (event.kind == tether::LinkEvent::Kind::kRecordsBuilt && event.record_source.get() == source) return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  };
  std::vector<std::shared_ptr<tether::Batch>> dropped;
  EXPECT_TRUE(link.submit(batch_of({{"a", 2}}), &dropped).empty());
  ASSERT_TRUE(handed_back(sources[0]));  // built when sent, on the I/O thread, and handed back at once
  ASSERT_TRUE(batch_arrives(server));
  const json sent = server.batches()[0];  // "a" is in flight
  ASSERT_EQ(sent["episodes"].size(), 1u);
  EXPECT_EQ(sent["episodes"][0]["episode_id"], "a");
  EXPECT_EQ(sent["episodes"][0]["agents"]["good_0"]["actions"].size(), 2u);
  EXPECT_EQ(sent["agent_steps"], 2);
  EXPECT_NE(sources[0]->built_on.load(), std::this_thread::get_id());
  // Queued without waking the I/O thread (it waits for the answer to "a"): not built yet.
  auto second = batch_of({{"b", 3}});
  EXPECT_TRUE(link.submit(second, &dropped, /*wake=*/false).empty());
  auto third = batch_of({{"b", 1}, {"c", 2}});
  std::set<std::string> gone = link.submit(third, &dropped, /*wake=*/false);  // 3 + 3 > 5: "b" goes
  EXPECT_EQ(gone, std::set<std::string>{"b"});
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_EQ(dropped[0], second);  // (never sent, its records unbuilt: its client reuses what it holds)
  EXPECT_TRUE(dropped[0]->record_source != nullptr);
  ASSERT_EQ(third->pending_records.size(), 1u);
  EXPECT_EQ(third->pending_records[0].episode_id, "c");
  EXPECT_EQ(third->agent_steps, 2);
  EXPECT_EQ(third->env_steps, 4);  // scaled with the agent steps
  // Woken, the I/O thread builds the queued batch's records while it waits, and hands its rows back.
  link.wake();
  ASSERT_TRUE(handed_back(sources[2]));
  EXPECT_TRUE(third->pending_records.empty());
  ASSERT_EQ(third->records.size(), 1u);
  EXPECT_EQ(third->records[0].episode_id, "c");
  EXPECT_EQ(third->records[0].agents[0].second.chunk.steps(), 2u);
  EXPECT_EQ(server.batches().size(), 1u);  // (still queued: "a" is not answered)
}

// -- against a reference model ----------------------------------------------------------
// (In the normal and ASan builds: what these check happens on the engine's
// thread alone, and under TSan they would only add to the suite's time.)
#if !defined(__SANITIZE_THREAD__)
namespace {

struct RefActor {
  std::vector<std::vector<double>> obs;      // per successful step
  std::vector<std::vector<double>> vobs;     // critic rows per step (chaser actors)
  std::vector<double> rewards;               // float-accumulated per step
  std::vector<double> final_obs;
  std::vector<double> final_vobs;
  bool ended = false;
  bool truncated = false;
};

struct RefEpisode {
  std::string id;
  bool training = true;
  std::map<std::string, RefActor> actors;             // actor id (agent or "pair")
  std::set<std::string> ended;                        // agent ids (members included)
  std::map<std::string, std::vector<double>> latest;  // agent -> latest obs (critic agents, members)
  std::map<std::string, double> returns;
  std::vector<std::string> last_frame;                // agents of the last successful frame
};

std::vector<double> critic_row(const RefEpisode& e) {
  std::vector<double> row;
  for (const char* a : {"adversary_0", "adversary_1"}) {
    auto it = e.latest.find(a);
    if (it == e.latest.end()) {
      row.insert(row.end(), 3, 0.0);
    } else {
      row.insert(row.end(), it->second.begin(), it->second.end());
    }
  }
  return row;
}

std::size_t obs_dim_of(const std::string& agent) { return agent[0] == 'a' ? 3 : 2; }
bool is_member(const std::string& a) { return a == "m_0" || a == "m_1"; }

void run_fuzz(unsigned seed, bool groups, std::int64_t per_sample, bool idle = false) {
  SCOPED_TRACE("seed " + std::to_string(seed) + (groups ? " groups" : " no groups") + (idle ? " idle" : ""));
  json config = multi_config(per_sample);
  if (!groups) config.erase("groups");
  config["modules"]["ghost"] = module_json(box(2), {{"type", "Discrete"}, {"n", 2}});  // never gets a model
  config["policy_mapping"].push_back({{"pattern", "zz_*"}, {"module", "ghost"}});
  Connected c(config);
  ASSERT_TRUE(c.client) << c.status.to_string();
  tether::MultiAgentClient& client = *c.client;
  std::mt19937 rng(seed);
  auto chance = [&](double p) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; };
  std::vector<std::string> pool = {"adversary_0", "adversary_1", "adversary_2", "good_0", "sub_0", "sub_1", "sub_2", "sub_3"};
  if (idle) {
    for (int k = 4; k < 16; ++k) pool.push_back("sub_" + std::to_string(k));
    for (int k = 3; k < 6; ++k) pool.push_back("adversary_" + std::to_string(k));
  }
  if (groups) { pool.push_back("m_0"); pool.push_back("m_1"); }
  std::vector<RefEpisode> done;
  std::vector<RefEpisode> live(3);
  int counter = 0;
  float value = 0;
  auto start = [&](RefEpisode& e) {
    e = RefEpisode();
    e.id = "ep" + std::to_string(counter++);
    e.training = !chance(0.2);
    ASSERT_TRUE(client.start_episode(e.id, e.training).ok());
  };
  for (auto& e : live) start(e);
  auto actor_of = [](const std::string& a) { return is_member(a) ? std::string("pair") : a; };
  auto obs_for = [&](const std::string& a) {
    std::vector<float> o(obs_dim_of(a));
    for (auto& x : o) x = (value += 0.5f);
    return o;
  };
  auto end_agents = [&](RefEpisode& e, std::vector<std::string> leaving, bool episode_end, bool all_trunc) {
    // finals: given ones, group partners with latest, the rest (episode end) with latest
    std::map<std::string, std::vector<double>> finals;
    std::map<std::string, bool> trunc;
    tether::AgentFrame f;
    for (const auto& a : leaving) {
      std::vector<float> o = obs_for(a);
      bool t = chance(0.5);
      add(f, a, o, t);
      finals[a] = std::vector<double>(o.begin(), o.end());
      trunc[a] = t || all_trunc;
    }
    if (episode_end) {
      tether::Result<std::map<std::string, double>> r = client.end_episode(e.id, &f, all_trunc);
      ASSERT_TRUE(r.ok()) << r.status().to_string();
      for (const auto& [id, ret] : e.returns) {
        EXPECT_NEAR(r.value()[id], ret, 1e-6) << e.id << " " << id;
      }
    } else {
      tether::Status st = client.end_agents(e.id, f);
      ASSERT_TRUE(st.ok()) << st.to_string();
    }
    // partners / everyone else
    std::vector<std::string> ending = leaving;
    for (const auto& a : leaving) {
      if (is_member(a)) {
        std::string other = a == "m_0" ? "m_1" : "m_0";
        if (!finals.count(other) && e.latest.count(other)) { finals[other] = e.latest[other]; trunc[other] = all_trunc; ending.push_back(other); }
      }
    }
    if (episode_end) {
      for (auto& [id, actor] : e.actors) {
        if (actor.ended) continue;
        std::vector<std::string> members = id == "pair" ? std::vector<std::string>{"m_0", "m_1"} : std::vector<std::string>{id};
        for (const auto& m : members) {
          if (finals.count(m)) continue;
          finals[m] = id == "pair" ? e.latest[m] : actor.obs.back();
          trunc[m] = all_trunc;
          ending.push_back(m);
        }
      }
    }
    for (const auto& [a, o] : finals) {
      if (a[0] == 'a' || is_member(a)) e.latest[a] = o;  // critic agents (any agent never acted too) and members
    }
    for (const auto& a : ending) {
      e.ended.insert(a);
      std::string id = actor_of(a);
      auto it = e.actors.find(id);
      if (it == e.actors.end() || it->second.ended) continue;
      RefActor& actor = it->second;
      actor.ended = true;
      if (id == "pair") {
        actor.final_obs = finals["m_0"];
        actor.final_obs.insert(actor.final_obs.end(), finals["m_1"].begin(), finals["m_1"].end());
        actor.truncated = trunc["m_0"] || trunc["m_1"];
      } else {
        actor.final_obs = finals[a];
        actor.truncated = trunc[a];
      }
    }
    for (auto& [id, actor] : e.actors) {
      if (actor.ended && actor.final_vobs.empty() && id[0] == 'a') actor.final_vobs = critic_row(e);
    }
  };
  for (int op = 0; op < (idle ? 1500 : 400); ++op) {
    RefEpisode& e = live[std::uniform_int_distribution<int>(0, 2)(rng)];
    double roll = std::uniform_real_distribution<double>(0, 1)(rng);
    if (idle) {  // (idle: longer episodes, fewer leaves, mapped onto the same branches)
      roll = roll < 0.90 ? 0.0 : roll < 0.915 ? 0.8 : roll < 0.92 ? 0.9 : roll;
    }
    if (roll < 0.75) {
      // a frame
      std::vector<std::string> agents;
      bool reuse = !e.last_frame.empty() && chance(idle ? 0.3 : 0.6);
      if (idle && chance(0.03)) {  // a new model version: later rows get other stamps
        std::lock_guard<std::mutex> lock(c.models->mutex);
        const char* m = chance(0.5) ? "chaser" : "runner";
        c.models->current[m].first += 1;
      }
      if (reuse) {
        for (const auto& a : e.last_frame) if (e.ended.count(a)) reuse = false;
      }
      if (reuse) {
        agents = e.last_frame;
      } else {
        for (const auto& a : pool) {
          if (e.ended.count(a) || a == "m_1") continue;
          double p = 0.6;
          if (idle) {
            // each agent idles (without leaving) in one phase of four (40 ops each) and acts in the others
            int h = 0;
            for (char ch : a) h += ch;
            p = ((op / 40 + h) % 4 == 0) ? 0.01 : 0.9;
          }
          if (chance(p)) { agents.push_back(a); if (a == "m_0") agents.push_back("m_1"); }
        }
        std::shuffle(agents.begin(), agents.end(), rng);
      }
      tether::AgentFrame frame;
      std::vector<std::vector<float>> obs;
      for (const auto& a : agents) { obs.push_back(obs_for(a)); add(frame, a, obs.back()); }
      if (chance(0.05)) {
        tether::AgentFrame eval;
        for (const auto& a : agents) add(eval, a, obs_for(a));
        EXPECT_TRUE(client.compute_actions(eval, e.id).ok());
      }
      if (chance(0.06)) {
        // NOT_READY after the frame was gathered (new actors made, latest observations noted)
        tether::AgentFrame bad;
        for (std::size_t i = 0; i < agents.size(); ++i) add(bad, agents[i], obs[i]);
        add(bad, "zz_0", {1, 1});
        EXPECT_EQ(client.get_action(e.id, bad).code(), tether::ErrorCode::kNotReady);
        for (std::size_t i = 0; i < agents.size(); ++i) {
          if (agents[i][0] == 'a' || is_member(agents[i])) e.latest[agents[i]] = std::vector<double>(obs[i].begin(), obs[i].end());
        }
        continue;
      }
      int failure = chance(0.15) ? std::uniform_int_distribution<int>(0, 3)(rng) : -1;
      if (failure >= 0 && !agents.empty()) {
        tether::AgentFrame bad;
        const std::size_t victim = std::uniform_int_distribution<std::size_t>(0, agents.size() - 1)(rng);
        for (std::size_t i = 0; i < agents.size(); ++i) {
          std::vector<float> o = obs[i];
          if (i == victim && failure == 0) o[0] = std::numeric_limits<float>::quiet_NaN();
          if (i == victim && failure == 1) o.push_back(1.0f);
          add(bad, agents[i], o);
          if (i == victim && failure == 2 && !is_member(agents[i])) add(bad, agents[i], o);
        }
        bool expect_fail = failure != 2 || !is_member(agents[victim]);
        if (failure == 3) {
          if (e.ended.empty()) { expect_fail = false; } else { add(bad, *e.ended.begin(), obs_for(*e.ended.begin())); }
          if (e.ended.count("m_0") || e.ended.count("m_1")) { /* a member alone also fails */ }
        }
        if (expect_fail) {
          EXPECT_FALSE(client.get_action(e.id, bad).ok()) << "failure " << failure;
          continue;
        }
      }
      tether::Status st = client.get_action(e.id, frame);
      ASSERT_TRUE(st.ok()) << st.to_string();
      e.last_frame = agents;
      // latest first (critic agents, members), then rows
      for (std::size_t i = 0; i < agents.size(); ++i) {
        if (agents[i][0] == 'a' || is_member(agents[i])) e.latest[agents[i]] = std::vector<double>(obs[i].begin(), obs[i].end());
      }
      std::set<std::string> acted;
      for (std::size_t i = 0; i < agents.size(); ++i) {
        const std::string id = actor_of(agents[i]);
        if (!acted.insert(id).second) continue;
        RefActor& actor = e.actors[id];
        if (id == "pair") {
          std::vector<double> o = e.latest["m_0"];
          o.insert(o.end(), e.latest["m_1"].begin(), e.latest["m_1"].end());
          actor.obs.push_back(o);
        } else {
          actor.obs.push_back(std::vector<double>(obs[i].begin(), obs[i].end()));
        }
        if (id[0] == 'a') actor.vobs.push_back(critic_row(e));
        actor.rewards.push_back(0.0);
      }
      // rewards
      for (const auto& a : pool) {
        if (!chance(0.4)) continue;
        double r = 0.25 * std::uniform_int_distribution<int>(-4, 8)(rng);
        ASSERT_TRUE(client.log_returns(e.id, a, r).ok());
        std::string id = actor_of(a);
        if (id == "pair") r /= 2;
        e.returns[id] += r;
        auto it = e.actors.find(id);
        if (it != e.actors.end() && !it->second.ended && !it->second.rewards.empty()) {
          double& last = it->second.rewards.back();
          last = static_cast<float>(static_cast<float>(last) + r);
        }
      }
    } else if (roll < 0.85) {
      std::vector<std::string> leaving;
      for (const auto& a : pool) {
        if (a == "m_1") continue;
        if (!e.ended.count(a) && chance(0.15)) { leaving.push_back(a); if (a == "m_0") leaving.push_back("m_1"); }
      }
      if (leaving.empty()) continue;
      end_agents(e, leaving, false, false);
      e.last_frame.clear();
    } else if (roll < 0.92) {
      std::vector<std::string> leaving;
      for (const auto& a : pool) {
        if (a == "m_1") continue;
        if (!e.ended.count(a) && e.actors.count(actor_of(a)) && chance(0.3)) { leaving.push_back(a); if (a == "m_0") leaving.push_back("m_1"); }
      }
      end_agents(e, leaving, true, chance(0.5));
      done.push_back(e);
      start(e);
    } else if (roll < 0.95) {
      ASSERT_TRUE(client.flush().ok());
    }
  }
  for (auto& e : live) {
    end_agents(e, {}, true, false);
    done.push_back(e);
  }
  ASSERT_TRUE(client.flush().ok());
  EXPECT_TRUE(client.take_error().ok()) << client.last_error().to_string();
  std::vector<json> records = valid_records(c.server.batches(), c.config);  // (agent_steps checked too)
  // Each agent's entries, in sending order (entries_of's, read in one pass: thousands of records).
  std::map<std::pair<std::string, std::string>, std::vector<json>> entries_by_agent;
  for (json& record : records) {
    const std::string episode = record["episode_id"].get<std::string>();
    for (auto& [agent, entry] : record["agents"].items()) entries_by_agent[{episode, agent}].push_back(std::move(entry));
  }
  std::size_t total = 0;
  for (const RefEpisode& e : done) {
    for (const auto& [id, actor] : e.actors) {
      const std::vector<json>& entries = entries_by_agent[{e.id, id}];
      if (!e.training) { EXPECT_TRUE(entries.empty()) << e.id << " " << id; continue; }
      if (actor.obs.empty()) { EXPECT_TRUE(entries.empty()); continue; }
      ASSERT_FALSE(entries.empty()) << e.id << " " << id;
      json got_obs = json::array(), got_vobs = json::array(), got_rewards = json::array();
      for (std::size_t k = 0; k < entries.size(); ++k) {
        const json& en = entries[k];
        if (k > 0) EXPECT_EQ(en["obs"][0], got_obs.back()) << e.id << " " << id << " continuation";
        for (std::size_t i = k > 0 ? 1 : 0; i < en["obs"].size(); ++i) got_obs.push_back(en["obs"][i]);
        if (id[0] == 'a') for (std::size_t i = k > 0 ? 1 : 0; i < en["value_obs"].size(); ++i) got_vobs.push_back(en["value_obs"][i]);
        for (const json& r : en["rewards"]) got_rewards.push_back(r);
        EXPECT_EQ(en["is_terminated"].get<bool>(), k + 1 == entries.size() && !actor.truncated) << e.id << " " << id;
        EXPECT_EQ(en["is_truncated"].get<bool>(), k + 1 == entries.size() && actor.truncated) << e.id << " " << id;
      }
      json want_obs = json(actor.obs);
      want_obs.push_back(actor.final_obs);
      EXPECT_EQ(got_obs, want_obs) << e.id << " " << id;
      EXPECT_EQ(got_rewards, json(actor.rewards)) << e.id << " " << id;
      if (id[0] == 'a') {
        json want_vobs = json(actor.vobs);
        want_vobs.push_back(actor.final_vobs);
        EXPECT_EQ(got_vobs, want_vobs) << e.id << " " << id;
      }
      total += actor.obs.size();
    }
  }
  EXPECT_EQ(client.agent_steps_sent(), static_cast<std::int64_t>(total));
  std::printf("seed %u groups %d: %zu steps, %zu batches, %zu episodes\n", seed, groups, total, c.server.batches().size(), done.size());
}

}  // namespace

// Random frames (order, membership, joins, groups, critics, refused frames,
// rewards, agents leaving, several episodes, some not training) against a
// plain model of what each agent's records must hold. One test per seed:
// ctest runs them side by side (the sanitizer builds run them for minutes).
class RandomFrames : public ::testing::TestWithParam<unsigned> {};

TEST_P(RandomFrames, MatchAReferenceModel) {
  const unsigned seed = GetParam();
  for (bool groups : {false, true}) {
    run_fuzz(seed, groups, seed % 3 == 0 ? 1 : (seed % 3 == 1 ? 5 : 23));
    if (::testing::Test::HasFatalFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(MultiAgentClient, RandomFrames, ::testing::Range(1u, 9u));

// The same with agents that idle (without leaving) for long stretches, so
// that cuts move their held-back steps together, then act again; models
// change version, so a module's steps carry several stamps.
class RandomFramesWithLongIdles : public ::testing::TestWithParam<std::tuple<unsigned, bool>> {};

TEST_P(RandomFramesWithLongIdles, MatchAReferenceModel) {
  const auto [seed, groups] = GetParam();
  run_fuzz(seed, groups, seed % 3 == 0 ? 1 : (seed % 3 == 1 ? 5 : 23), true);
}

INSTANTIATE_TEST_SUITE_P(MultiAgentClient, RandomFramesWithLongIdles,
                         ::testing::Combine(::testing::Range(1u, 4u), ::testing::Bool()));
#endif  // !__SANITIZE_THREAD__

// (The heap is glibc's to measure: not under a sanitizer's allocator.)
#if defined(__GLIBC__) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
namespace {
// Frames measured: enough that the heap's noise between two runs (up to ~1 MB on a loaded machine:
// arenas, buffers reused or not) is small per newcomer.
constexpr int kMeasuredFrames = 4000;

// Heap growth over kMeasuredFrames frames of 64 agents plus one newcomer per frame that
// acts once; `retire`: it retires right after (else it idles, never retired).
std::pair<double, double> idle_newcomers(bool retire) {
  json config = multi_config(64 * 8);
  config.erase("groups");
  config["modules"] = {{"runner", module_json(box(32), {{"type", "Discrete"}, {"n", 2}})}};
  config["policy_mapping"] = json::array({{{"pattern", "*"}, {"module", "runner"}}});
  config["policies_to_train"] = {"runner"};
  auto models = std::make_shared<Models>();
  models->current = {{"runner", {0, 0}}};  // (a model of a module not in SET_CONFIG is an error, §7.6)
  ServerScript script = multi_script(models, config);
  script.keep_messages = false;
  Connected c(script);
  EXPECT_TRUE(c.client) << c.status.to_string();
  tether::MultiAgentClient& client = *c.client;
  std::string episode = client.start_episode("idle").value();
  tether::AgentFrame frame;
  std::vector<float> obs(32, 0.5f);
  auto play = [&](int from, int to) {
    for (int t = from; t < to; ++t) {
      frame.clear();
      for (int a = 0; a < 64; ++a) add(frame, "a_" + std::to_string(a), obs);
      const std::string newcomer = "s_" + std::to_string(t);
      add(frame, newcomer, obs);
      const tether::Status acted = client.get_action(episode, frame);
      EXPECT_TRUE(acted.ok()) << acted.to_string();
      if (retire) EXPECT_TRUE(client.retire_agent(episode, newcomer, obs.data(), obs.size()).ok());
      c.log->take();  // (the test's own log of model runs is not the client's heap)
    }
  };
  play(0, 200);
  EXPECT_TRUE(client.flush().ok());
  c.server.wait_until_idle();  // (the fake server shares this heap)
  const std::size_t heap_before = mallinfo2().uordblks;
  const auto start = std::chrono::steady_clock::now();
  play(200, 200 + kMeasuredFrames);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // Measured once every batch has gone: what batches are in flight at that
  // moment is timing, not what the agents hold.
  EXPECT_TRUE(client.flush().ok());
  c.server.wait_until_idle();
  const double grown = static_cast<double>(mallinfo2().uordblks) - static_cast<double>(heap_before);
  EXPECT_TRUE(client.end_episode(episode).ok());
  EXPECT_TRUE(client.flush().ok());
  return {grown, seconds};
}
}  // namespace

TEST(MultiAgentClient, IdleAgentsHoldOnlyTheirOwnRows) {
  // A fixed mmap threshold: glibc's adapts as large blocks are freed, moving ORT's and the batches'
  // buffers in or out of the counted heap between the two measures.
  mallopt(M_MMAP_THRESHOLD, 128 * 1024);
  auto [retired_heap, retired_s] = idle_newcomers(true);
  auto [idle_heap, idle_s] = idle_newcomers(false);
  const double per_idle = (idle_heap - retired_heap) / kMeasuredFrames;
  std::printf("%d frames of 64 agents + a newcomer each: retired %.1f MB %.2f s; idling %.1f MB %.2f s: %.0f bytes per idle agent\n", kMeasuredFrames,
              retired_heap / 1e6, retired_s, idle_heap / 1e6, idle_s, per_idle);
  // An idle agent holds one step back: 32 floats of obs and a few numbers,
  // plus its Actor and its entries in the episode's maps: 1.8-2.0 KB measured
  // on a quiet machine, up to 3 KB on one with every core busy (buffers kept
  // at the size they grew to). One that held its frame's rows (65 agents x 128
  // bytes of obs) would be over 8 KB.
  EXPECT_LT(per_idle, 6000.0);
}
#endif  // glibc's heap

namespace {
// Plays `frames` frames of the same agents in `episode` (fast path), with
// rewards, one agent leaving half-way; every call must succeed, but for a call
// that returns the server's refusal MODULE_MISMATCH (once, doing nothing else:
// it is made again), counted in `refused`.
void play_same_agents(tether::MultiAgentClient& client, const std::string& episode, int frames, int from,
                      int& refused) {
  const tether::ErrorCode code = tether::ErrorCode::kModuleMismatch;
  tether::AgentFrame frame;
  for (int t = from; t < from + frames; ++t) {
    frame.clear();
    const float x = static_cast<float>(t);
    add(frame, "adversary_0", {x, 0, 0});
    add(frame, "adversary_1", {x, 1, 1});
    add(frame, "good_0", {x, 2});
    const std::string sub = "sub_" + std::to_string(from);
    if (t < from + frames / 2) add(frame, sub, {x, 3});
    tether::Status st = fake::again_after(code, refused, [&] { return client.get_action(episode, frame); });
    ASSERT_TRUE(st.ok()) << t << ": " << st.to_string();
    for (const std::string& a : {std::string("adversary_0"), std::string("adversary_1"), std::string("good_0"), sub}) ASSERT_TRUE(client.log_returns(episode, a, 1.0).ok());
    if (t == from + frames / 2) {
      const float final_obs[2] = {x, 3};
      ASSERT_TRUE(fake::again_after(code, refused, [&] { return client.retire_agent(episode, sub, final_obs, 2); }).ok());
    }
  }
}
}  // namespace

TEST(MultiAgentClient, DroppedBatchesForgetRunningEpisodesThatGoOnActing) {
  auto models = std::make_shared<Models>();
  json config = multi_config(10);
  config.erase("groups");
  ServerScript script = multi_script(models, config);
  std::atomic<int> answered{0};
  script.on_batch = [models, &answered](Conn& conn, const tether::Message& message, int n) {
    if (n == 1) {
      conn.send(fake::refusal("MODULE_MISMATCH"));
      return true;
    }
    if (n == 2) std::this_thread::sleep_for(std::chrono::milliseconds(300));  // queue fills: later batches dropped
    conn.send(models->state_for(message.body));
    ++answered;
    return true;
  };
  Connected c(script, [](tether::ClientOptions& options, const std::shared_ptr<RunLog>&) {
    options.when_queue_full = tether::QueueFullPolicy::kDropOldest;
    options.max_queued_batches = 1;
  });
  ASSERT_TRUE(c.client) << c.status.to_string();
  tether::MultiAgentClient& client = *c.client;
  std::vector<std::string> episodes;
  for (int e = 0; e < 4; ++e) episodes.push_back(client.start_episode("e" + std::to_string(e)).value());
  int refused = 0;  // calls that returned the refusal of batch 1
  const tether::ErrorCode code = tether::ErrorCode::kModuleMismatch;
  for (int round = 0; round < 6; ++round) {
    for (const std::string& episode : episodes) play_same_agents(client, episode, 8, round * 8, refused);
    if (::testing::Test::HasFatalFailure()) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(60));
  }
  for (const std::string& episode : episodes) {
    tether::AgentFrame frame;
    add(frame, "good_0", {-1, -1});
    ASSERT_TRUE(fake::again_after(code, refused, [&] { return client.end_episode(episode, &frame); }).ok());
  }
  ASSERT_TRUE(fake::again_after(code, refused, [&] { return client.flush(); }).ok());
  EXPECT_EQ(refused, c.server.batches().empty() ? 0 : 1);  // (the first batch delivered is refused)
  EXPECT_TRUE(client.take_error().ok());
  std::printf("dropped %lld batches, %zu delivered\n", static_cast<long long>(client.batches_dropped()), c.server.batches().size());
  EXPECT_GE(client.batches_dropped(), 1);
  // Whatever was delivered is valid and each agent's steps delivered for an episode are a consecutive run.
  std::vector<json> records = valid_records(c.server.batches(), config);
  (void)records;
}

// An env step in which no agent acts: the batch says it holds no agent step.
TEST(MultiAgentClient, ABatchWithoutAgentStepsSaysSo) {
  Connected c(multi_config(1000));
  ASSERT_TRUE(c.client) << c.status.to_string();
  tether::MultiAgentClient& client = *c.client;
  std::string episode = client.start_episode("empty").value();
  tether::AgentFrame frame;  // an env step in which no agent acts
  ASSERT_TRUE(client.get_action(episode, frame).ok());
  ASSERT_TRUE(client.end_episode(episode).ok());
  ASSERT_TRUE(client.flush().ok());
  std::vector<json> batches = c.server.batches();
  ASSERT_EQ(batches.size(), 1u);
  EXPECT_EQ(batches[0]["agent_steps"], 0) << batches[0].dump();  // §10.7: Σ len(actions)
  EXPECT_EQ(client.agent_steps_sent(), 0);
}

// -- the real model through ONNX Runtime ------------------------------------------------

TEST(MultiAgentClientOnnx, BatchedRunsGiveTheModelsLogpAndGreedyActions) {
  const std::vector<std::uint8_t> bytes = test_data::read_bytes(test_data::kDir + "policy_4x64x64x2.onnx");
  ASSERT_FALSE(bytes.empty());
  auto spec = [](bool trainable) {
    json m = module_json(box(4, -10, 10), {{"type", "Discrete"}, {"n", 2}});
    m["onnx_input_names"] = {"onnx::Gemm_0"};
    m["trainable"] = trainable;
    return m;
  };
  json config = multi_config(16);
  config["modules"] = {{"red", spec(true)}, {"blue", spec(false)}};
  config["policy_mapping"] = json::array({{{"pattern", "red_*"}, {"module", "red"}},
                                          {{"pattern", "blue_*"}, {"module", "blue"}}});
  config["groups"] = json::object();
  ServerScript script;
  script.full_config = config;
  const std::string file = fake::onnx_file_of(bytes);
  script.on_get_state = [file](Conn& conn, const tether::Message&, int) {
    conn.send({{"type", "SET_STATE"},
               {"models", {{"red", {{"weights_seq_no", 0}, {"onnx_file", file}}},
                           {"blue", {{"weights_seq_no", 0}, {"onnx_file", file}}}}}});
    return true;
  };
  script.on_batch = [](Conn& conn, const tether::Message&, int) {
    conn.send({{"type", "SET_STATE"}, {"models", json::object()}});
    return true;
  };
  Connected c(script, [](tether::ClientOptions& options, const std::shared_ptr<RunLog>& log) {
    options.backend_factory = [log] {
      return std::make_unique<LoggingBackend>(std::make_unique<tether::OnnxRuntimeBackend>(), log);
    };
  });
  ASSERT_TRUE(c.client) << c.status.to_string();
  tether::MultiAgentClient& client = *c.client;
  tether::OnnxRuntimeBackend reference;
  ASSERT_TRUE(reference.load(bytes.data(), bytes.size(), "onnx::Gemm_0", "action_dist_inputs").ok());
  std::string episode = client.start_episode("onnx").value();
  tether::AgentFrame frame;
  const int kAgents = 6;
  for (int t = 0; t < 20; ++t) {
    frame.clear();
    for (int a = 0; a < kAgents; ++a) {
      const float x = 0.1f * static_cast<float>(t) - 0.3f * static_cast<float>(a);
      add(frame, (a % 2 == 0 ? "red_" : "blue_") + std::to_string(a), {x, -x, 0.5f * x, 1.0f});
    }
    c.log->take();
    ASSERT_TRUE(client.get_action(episode, frame).ok()) << client.last_error().to_string();
    std::vector<RunLog::Run> runs = c.log->take();
    ASSERT_EQ(runs.size(), 2u);  // red and blue, three agents each
    EXPECT_EQ(runs[0].batch, 3u);
    EXPECT_EQ(runs[1].batch, 3u);
  }
  // compute_actions: the distribution's mode, nothing recorded.
  const std::int64_t runs_before = client.inference_runs();
  ASSERT_TRUE(client.compute_actions(frame).ok());
  EXPECT_EQ(client.inference_runs() - runs_before, 2);
  for (std::size_t i = 0; i < frame.size(); ++i) {
    float dist[2];
    ASSERT_TRUE(reference.run(frame.obs(i), 1, 4, dist, 2).ok());
    EXPECT_EQ(frame.discrete_action(i), dist[1] > dist[0] ? 1 : 0);
  }
  ASSERT_TRUE(client.end_episode(episode).ok());
  ASSERT_TRUE(client.flush().ok());
  std::vector<json> records = valid_records(c.server.batches(), config);
  const tether::Space action_space = tether::Space::discrete(2).value();
  std::size_t checked = 0;
  for (const json& record : records) {
    for (auto it = record["agents"].begin(); it != record["agents"].end(); ++it) {
      const json& entry = it.value();
      EXPECT_EQ(entry["module"], it.key().rfind("red_", 0) == 0 ? "red" : "blue");
      for (std::size_t t = 0; t < entry["actions"].size(); ++t) {
        std::vector<float> obs = entry["obs"][t].get<std::vector<float>>();
        float dist[2];
        ASSERT_TRUE(reference.run(obs.data(), 1, 4, dist, 2).ok());
        const double action = entry["actions"][t].get<double>();
        tether::Result<double> logp = tether::log_prob(action_space, dist, 2, &action, 1);
        ASSERT_TRUE(logp.ok());
        EXPECT_NEAR(entry["action_logp"][t].get<double>(), logp.value(), 1e-4);
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, static_cast<std::size_t>(20 * kAgents));
}

namespace {

struct SteadyRun {
  std::vector<std::vector<double>> actions;  // per successful frame, every agent's
  std::vector<json> batches;                 // what the server received (without the session id)
  std::int64_t steady_frames = 0;
};

// Frames of the real model's agents, mostly the same ones in the same order
// (the steady-state path), between frames that change them: an agent joins
// and leaves, the order changes, another AgentFrame names the same agents, a
// second module acts, frames fail (non-finite, wrong size) and are made again.
SteadyRun play_steady_or_not(bool steady) {
  SteadyRun run;
  const std::vector<std::uint8_t> bytes = test_data::read_bytes(test_data::kDir + "policy_4x64x64x2.onnx");
  EXPECT_FALSE(bytes.empty());
  json spec = module_json(box(4, -10, 10), {{"type", "Discrete"}, {"n", 2}});
  spec["onnx_input_names"] = {"onnx::Gemm_0"};
  json config = multi_config(37);  // (cuts fall inside the stretches below)
  config["modules"] = {{"red", spec}, {"blue", spec}};
  config["policy_mapping"] = json::array({{{"pattern", "red_*"}, {"module", "red"}},
                                          {{"pattern", "blue_*"}, {"module", "blue"}}});
  config.erase("groups");
  ServerScript script;
  script.full_config = config;
  const std::string file = fake::onnx_file_of(bytes);
  auto state = [file](Conn& conn) {
    conn.send({{"type", "SET_STATE"},
               {"models", {{"red", {{"weights_seq_no", 3}, {"onnx_file", file}}},
                           {"blue", {{"weights_seq_no", 3}, {"onnx_file", file}}}}}});
  };
  script.on_get_state = [state](Conn& conn, const tether::Message&, int) {
    state(conn);
    return true;
  };
  script.on_batch = [state](Conn& conn, const tether::Message&, int) {
    state(conn);
    return true;
  };
  Connected c(script, [](tether::ClientOptions& options, const std::shared_ptr<RunLog>&) {
    options.backend_factory = [] { return std::make_unique<tether::OnnxRuntimeBackend>(); };
  });
  EXPECT_TRUE(c.client) << c.status.to_string();
  if (!c.client) return run;
  tether::MultiAgentClient& client = *c.client;
  tether::MultiAgentClientTestPeer::use_steady_path(client, steady);
  const std::string episode = client.start_episode("steady").value();
  tether::AgentFrame frame, other;
  for (int t = 0; t < 120; ++t) {
    std::vector<std::string> agents;
    for (int a = 0; a < 8; ++a) agents.push_back("red_" + std::to_string(a));
    if (t >= 20 && t < 25) agents.push_back("red_8");  // joins, then leaves (below)
    if (t >= 40 && t < 44) std::reverse(agents.begin(), agents.end());
    if (t >= 80 && t < 84) agents.insert(agents.begin() + 3, "blue_0");
    tether::AgentFrame& f = t >= 60 && t < 64 ? other : frame;
    auto fill = [&](float nudge, std::size_t extra) {
      f.clear();
      for (std::size_t i = 0; i < agents.size(); ++i) {
        const float x = 0.05f * static_cast<float>(t) - 0.2f * static_cast<float>(i);
        std::vector<float> obs = {x, -x, 0.5f * x + nudge, 1.0f};
        obs.resize(obs.size() + (i == 2 ? extra : 0), 0.0f);
        add(f, agents[i], obs);
      }
    };
    if (t == 90) {
      fill(std::numeric_limits<float>::quiet_NaN(), 0);
      EXPECT_EQ(client.get_action(episode, f).code(), tether::ErrorCode::kNonFiniteValue);
    }
    if (t == 95) {
      fill(0.0f, 1);
      EXPECT_EQ(client.get_action(episode, f).code(), tether::ErrorCode::kInvalidArgument);
    }
    fill(0.0f, 0);
    const tether::Status acted = client.get_action(episode, f);
    EXPECT_TRUE(acted.ok()) << t << ": " << acted.to_string();
    if (!acted.ok()) return run;
    std::vector<double> actions;
    for (std::size_t i = 0; i < f.size(); ++i) actions.push_back(f.action(i)[0]);
    run.actions.push_back(actions);
    for (std::size_t i = 0; i < agents.size(); i += 3) {
      EXPECT_TRUE(client.log_returns(episode, agents[i], 0.25 * static_cast<double>(i + 1)).ok());
    }
    if (t == 24) {
      const float last[4] = {1, 2, 3, 4};
      EXPECT_TRUE(client.retire_agent(episode, "red_8", last, 4).ok());
    }
  }
  EXPECT_TRUE(client.end_episode(episode).ok());
  EXPECT_TRUE(client.flush().ok());
  run.steady_frames = tether::MultiAgentClientTestPeer::steady_frames(client);
  for (json batch : c.server.batches()) {
    batch.erase("client_session");
    run.batches.push_back(batch);
  }
  valid_records(c.server.batches(), config);
  return run;
}

}  // namespace

// The steady-state path acts and records exactly as the general path does:
// the same actions, and the same batches on the wire, as agents change
// between the steady stretches.
TEST(MultiAgentClientOnnx, SteadyStateFramesRecordWhatTheGeneralPathRecords) {
  const SteadyRun fast = play_steady_or_not(true);
  const SteadyRun general = play_steady_or_not(false);
  if (::testing::Test::HasFailure()) return;
  EXPECT_EQ(general.steady_frames, 0);
  EXPECT_GE(fast.steady_frames, 80);  // (every frame but the changing ones and the one after each)
  EXPECT_EQ(fast.actions, general.actions);
  ASSERT_EQ(fast.batches.size(), general.batches.size());
  EXPECT_GE(fast.batches.size(), 20u);
  for (std::size_t i = 0; i < fast.batches.size(); ++i) EXPECT_EQ(fast.batches[i], general.batches[i]) << "batch " << i;
  std::set<int> seen;
  for (const std::vector<double>& frame : fast.actions) {
    for (double a : frame) seen.insert(static_cast<int>(a));
  }
  EXPECT_EQ(seen.size(), 2u);  // (the model's draws go both ways: rows and draws line up)
}

#endif  // _WIN32
