// TetherClient with the ONNX Runtime backend and a real policy model
// (tests/data/policy_4x64x64x2.onnx) served by the fake server: the recorded
// logp is the model's, models are swapped while the engine acts, a model that
// fails to load is reported and the previous one stays. (Its latency is
// measured by sdk_cpp/bench/act_latency.cpp, its allocations by
// alloc_get_action.cpp.)
#include <gtest/gtest.h>

#ifndef _WIN32

#include <cmath>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "client_test_helpers.h"
#include "ort_test_helpers.h"
#include "test_data.h"
#include "tether/client.h"
#include "tether/distributions.h"
#include "tether/onnxruntime_backend.h"

namespace {

using fake::FakeServer;
using fake::ServerScript;
using nlohmann::json;

using test_data::read_bytes;

struct RealModel {
  std::vector<std::uint8_t> bytes;
  std::string input_name;
  std::string output_name;
};

RealModel real_model() {
  RealModel model;
  model.bytes = read_bytes(test_data::kDir + "policy_4x64x64x2.onnx");
  std::ifstream in(test_data::kDir + "policy_4x64x64x2.json");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  json record = json::parse(text, nullptr, false);
  if (record.is_object() && record.contains("input_name") && record["input_name"].is_string() &&
      record.contains("output_name") && record["output_name"].is_string()) {
    model.input_name = record["input_name"].get<std::string>();
    model.output_name = record["output_name"].get<std::string>();
  }
  return model;
}

ServerScript script_for(const RealModel& model, bool broken_second_model = false) {
  ServerScript script;
  script.steps_per_sample = 16;
  script.config_overrides = {{"onnx_input_names", {model.input_name}}, {"onnx_output_names", {model.output_name}}};
  std::vector<std::uint8_t> bytes = model.bytes;
  script.model_file = [bytes, broken_second_model](std::uint8_t n) {
    if (broken_second_model && n == 1) return fake::onnx_file_of({'n', 'o', 't', 'o', 'n', 'n', 'x'});
    return fake::onnx_file_of(bytes);
  };
  return script;
}

// Plays `steps` steps of 20-step episodes; every call must succeed, but for one
// that returns a model that failed to load (INFERENCE_FAILED: the client returns
// it once, from the next call, which then did nothing else; it is made again),
// counted in `failed_loads`.
void play(tether::TetherClient& client, int steps, int& failed_loads) {
  float obs[4] = {0.1f, -0.2f, 0.05f, 0.3f};
  double action[1];
  int done = 0;
  auto again = [&](auto call) { return fake::again_after(tether::ErrorCode::kInferenceFailed, failed_loads, call); };
  while (done < steps) {
    tether::Result<std::string> started = again([&] { return client.start_episode(); });
    ASSERT_TRUE(started.ok()) << started.status().to_string();
    const std::string episode = started.value();
    for (int t = 0; t < 20 && done < steps; ++t, ++done) {
      tether::Status acted = again([&] { return client.get_action(episode, obs, 4, action, 1); });
      ASSERT_TRUE(acted.ok()) << acted.to_string();
      ASSERT_TRUE(action[0] == 0.0 || action[0] == 1.0);
      obs[0] = std::sin(static_cast<float>(done));
      obs[1] = static_cast<float>(action[0]) - 0.5f;
      client.log_returns(episode, 1.0);
    }
    ASSERT_TRUE(again([&] { return client.end_episode(episode, obs, 4, done % 40 == 0); }).ok());
  }
}

}  // namespace

TEST(OrtClient, RecordsTheServedModelsLogpWhileModelsSwap) {
  RealModel model = real_model();
  ASSERT_FALSE(model.bytes.empty());
  FakeServer server(script_for(model));
  auto connected = tether::TetherClient::connect(fake::ort_options_for(server, 3));
  ASSERT_TRUE(connected.ok()) << connected.status().to_string();
  tether::TetherClient& client = *connected.value();
  int failed_loads = 0;
  ASSERT_NO_FATAL_FAILURE(play(client, 400, failed_loads));
  ASSERT_TRUE(client.flush().ok());
  EXPECT_EQ(failed_loads, 0);
  EXPECT_TRUE(client.take_error().ok());
  EXPECT_GT(client.models_loaded(), 5);  // every answer is a new version
  EXPECT_EQ(client.env_steps_sent(), 400);

  tether::OnnxRuntimeBackend reference;
  ASSERT_TRUE(reference.load(model.bytes.data(), model.bytes.size(), model.input_name, model.output_name).ok());
  const tether::Space action_space = tether::Space::discrete(2).value();
  std::size_t checked = 0;
  for (const json& batch : server.batches()) {
    for (const json& record : batch["episodes"]) {
      const json& obs = record["obs"];
      for (std::size_t t = 0; t < record["actions"].size(); ++t) {
        float row[4];
        for (int i = 0; i < 4; ++i) row[i] = obs[t][i].get<float>();
        float dist[2];
        ASSERT_TRUE(reference.run(row, 1, 4, dist, 2).ok());
        EXPECT_NEAR(record["action_dist_inputs"][t][0].get<double>(), dist[0], 1e-5);
        double action = record["actions"][t].get<double>();
        double logp = tether::log_prob(action_space, dist, 2, &action, 1).value();
        EXPECT_NEAR(record["action_logp"][t].get<double>(), logp, 1e-6);
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 400u);
}

TEST(OrtClient, AModelThatFailsToLoadIsReportedAndTheOldOneStays) {
  RealModel model = real_model();
  FakeServer server(script_for(model, /*broken_second_model=*/true));
  auto connected = tether::TetherClient::connect(fake::ort_options_for(server, 3));
  ASSERT_TRUE(connected.ok()) << connected.status().to_string();
  tether::TetherClient& client = *connected.value();
  // Each failed load comes back, once, from the next call (which does nothing else).
  int failed_loads = 0;
  ASSERT_NO_FATAL_FAILURE(play(client, 200, failed_loads));
  ASSERT_TRUE(fake::again_after(tether::ErrorCode::kInferenceFailed, failed_loads, [&] { return client.flush(); }).ok());
  EXPECT_GT(failed_loads, 0);
  EXPECT_TRUE(client.take_error().ok());
  EXPECT_EQ(client.env_steps_sent(), 200);
}

#endif  // _WIN32
