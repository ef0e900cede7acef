// ClientOptions::offline_policy (docs/protocol.md §20): a TetherClient made
// from an offline policy file acts with the file's model and no server (its
// greedy actions are the real model's, tests/data/policy_4x64x64x2.*), writes
// its episodes to a demonstration file and sends nothing; a file that cannot
// be used fails connect() naming the file and the fault.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "fake_server.h"
#include "test_data.h"
#include "tether/client.h"
#include "tether/multi_agent_client.h"
#include "tether/onnxruntime_backend.h"

namespace {

using nlohmann::json;

// A file in the temporary directory, removed when the test ends.
class TempPath {
 public:
  explicit TempPath(const std::string& name)
      : path_((std::filesystem::temp_directory_path() / ("tether_offline_" + name)).string()) {
    std::remove(path_.c_str());
  }
  ~TempPath() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }
  void write(const std::string& text) const { std::ofstream(path_, std::ios::binary) << text; }

 private:
  std::string path_;
};

json model_record() {
  std::ifstream in(test_data::kDir + "policy_4x64x64x2.json");
  return json::parse(std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()));
}

// What a server writes (§20) for one module serving the test model as v5.
json offline_file(const json& record) {
  const std::string onnx = fake::onnx_file_of(test_data::read_bytes(test_data::kDir + "policy_4x64x64x2.onnx"));
  const json obs_space = {{"type", "Box"}, {"shape", {4}}, {"low", -5.0}, {"high", 5.0}};
  const json action_space = {{"type", "Discrete"}, {"n", 2}};
  return {{"format", "tether-offline-policy"},
          {"version", 1},
          {"pong", {{"type", "PONG"}, {"protocol_version", tether::kProtocolVersion}, {"run_id", "r1"}}},
          {"config",
           {{"type", "SET_CONFIG"},
            {"env_steps_per_sample", 50},
            {"force_on_policy", true},
            {"protocol_version", tether::kProtocolVersion},
            {"observation_space", obs_space},
            {"action_space", action_space},
            {"onnx_input_names", {record["input_name"]}},
            {"onnx_output_names", {record["output_name"]}},
            {"modules",
             {{"default_policy",
               {{"observation_space", obs_space},
                {"action_space", action_space},
                {"onnx_input_names", {record["input_name"]}},
                {"onnx_output_names", {record["output_name"]}}}}}},
            {"policy_mapping", {{{"pattern", "*"}, {"module", "default_policy"}}}},
            {"groups", json::object()}}},
          {"state",
           {{"type", "SET_STATE"},
            {"weights_seq_no", 5},
            {"onnx_file", onnx},
            {"record_share", 0.5},  // (a connected client would hold half its episodes back)
            {"env_params", {{"seq", 1}, {"lesson", 0}, {"values", {{"speed", 2.0}}}}},
            {"models", {{"default_policy", {{"weights_seq_no", 5}, {"onnx_file", onnx}}}}}}}};
}

tether::ClientOptions offline_options(const std::string& path) {
  tether::ClientOptions options;
  options.port = 1;  // (never reached)
  options.offline_policy = path;
  options.seed = 3;
  options.backend_factory = [] { return std::make_unique<tether::OnnxRuntimeBackend>(); };
  return options;
}

}  // namespace

TEST(OrtOfflinePolicy, ActsWithTheFilesModelRecordsDemonstrationsAndSendsNothing) {
  const json record = model_record();
  TempPath policy("policy.json"), demos("demos.jsonl");
  policy.write(offline_file(record).dump());
  tether::ClientOptions options = offline_options(policy.path());
  options.demo_path = demos.path();
  auto connected = tether::TetherClient::connect(options);
  ASSERT_TRUE(connected.ok()) << connected.status().to_string();
  tether::TetherClient& client = *connected.value();
  EXPECT_TRUE(client.offline());
  EXPECT_EQ(client.server_address(), "offline:" + policy.path());
  EXPECT_EQ(client.weights_seq_no(), std::optional<std::int64_t>(5));
  ASSERT_NE(client.env_params(), nullptr);  // the file's parameter set (§19), as from a server
  EXPECT_EQ(client.env_params()->seq, 1);
  // The greedy action of each recorded observation is the real model's argmax.
  const json& observations = record["observations"];
  for (std::size_t i = 0; i < observations.size(); ++i) {
    std::vector<float> obs = observations[i].get<std::vector<float>>();
    std::vector<double> action;
    ASSERT_TRUE(client.compute_action(obs, action).ok());
    const std::vector<double> logits = record["outputs"][i].get<std::vector<double>>();
    EXPECT_EQ(action[0], logits[1] > logits[0] ? 1.0 : 0.0) << "observation " << i;
  }
  const float obs[4] = {0.1f, -0.2f, 0.05f, 0.3f};
  double action = -1;
  for (int e = 0; e < 3; ++e) {
    const std::string episode = client.start_episode().value();
    for (int t = 0; t < 60; ++t) {  // (beyond env_steps_per_sample: no batch is cut or sent)
      ASSERT_TRUE(client.get_action(episode, obs, 4, &action, 1).ok());
      ASSERT_TRUE(client.log_returns(episode, 1.0).ok());
    }
    ASSERT_TRUE(client.end_episode(episode, obs, 4).ok());
  }
  ASSERT_TRUE(client.flush().ok());
  EXPECT_EQ(client.env_steps_sent(), 0);
  EXPECT_EQ(client.episodes_held_back(), 0u);  // (none recorded, none held back, whatever record_share says)
  client.close();
  EXPECT_EQ(client.start_episode().status().code(), tether::ErrorCode::kClosed);
  std::ifstream in(demos.path());
  int lines = 0;
  for (std::string line; std::getline(in, line);) ++lines;
  EXPECT_EQ(lines, 4);  // the header and the three episodes
}

TEST(OrtOfflinePolicy, AMultiAgentClientMapsByTheFilesRulesOffline) {
  const json record = model_record();
  TempPath policy("multi.json");
  policy.write(offline_file(record).dump());
  auto connected = tether::MultiAgentClient::connect(offline_options(policy.path()));
  ASSERT_TRUE(connected.ok()) << connected.status().to_string();
  tether::MultiAgentClient& client = *connected.value();
  EXPECT_TRUE(client.offline());
  const std::string episode = client.start_episode().value();
  const float a[4] = {0.1f, 0.2f, 0.3f, 0.4f}, b[4] = {-0.1f, 0.0f, 0.3f, 0.2f};
  tether::AgentFrame frame;
  for (int t = 0; t < 10; ++t) {
    frame.clear();
    frame.add("a", a, 4);
    frame.add("b", b, 4);
    ASSERT_TRUE(client.get_action(episode, frame).ok());
    ASSERT_NE(frame.action(0), nullptr);
    ASSERT_NE(frame.action(1), nullptr);
    EXPECT_TRUE(*frame.action(1) == 0.0 || *frame.action(1) == 1.0);
  }
  ASSERT_TRUE(client.end_episode(episode).ok());
  ASSERT_TRUE(client.flush().ok());
  EXPECT_EQ(client.env_steps_sent(), 0);
  client.close();
}

TEST(OrtOfflinePolicy, AgentsOnlyAServerCouldMapAreNotReady) {
  json file = offline_file(model_record());
  file["config"].erase("policy_mapping");  // (a server that maps with a function names no rules)
  TempPath policy("unmapped.json");
  policy.write(file.dump());
  auto connected = tether::MultiAgentClient::connect(offline_options(policy.path()));
  ASSERT_TRUE(connected.ok()) << connected.status().to_string();
  tether::MultiAgentClient& client = *connected.value();
  const std::string episode = client.start_episode().value();
  const float a[4] = {0.1f, 0.2f, 0.3f, 0.4f};
  tether::AgentFrame frame;
  frame.add("a", a, 4);
  const tether::Status refused = client.get_action(episode, frame);
  EXPECT_EQ(refused.code(), tether::ErrorCode::kNotReady) << refused.to_string();
  EXPECT_NE(refused.message().find("MAP_AGENTS"), std::string::npos) << refused.to_string();
  EXPECT_NE(refused.message().find(policy.path()), std::string::npos) << refused.to_string();
}

TEST(OrtOfflinePolicy, AFileThatCannotBeUsedFailsConnectNamingItAndTheFault) {
  TempPath missing("missing.json"), broken("broken.json"), newer("newer.json"), other("other.json");
  broken.write("{\"format\": ");
  json newer_file = offline_file(model_record());
  newer_file["version"] = 2;
  newer.write(newer_file.dump());
  json other_file = offline_file(model_record());
  other_file["pong"]["protocol_version"] = "2.0";
  other.write(other_file.dump());
  TempPath corrupt("corrupt.json"), several("several.json");
  json corrupt_file = offline_file(model_record());
  corrupt_file["state"]["onnx_file"] = "bm90IGEgbW9kZWw=";  // base64 of "not a model"
  corrupt.write(corrupt_file.dump());
  json several_file = offline_file(model_record());
  several_file["state"].erase("onnx_file");  // (a server with several modules has no default one)
  several.write(several_file.dump());
  const struct {
    const TempPath& path;
    tether::ErrorCode code;
    const char* names;
  } cases[] = {{missing, tether::ErrorCode::kInvalidArgument, "cannot be read"},
               {broken, tether::ErrorCode::kInvalidJson, "not JSON"},
               {newer, tether::ErrorCode::kInvalidField, "version"},
               {other, tether::ErrorCode::kVersionMismatch, "2.0"},
               {corrupt, tether::ErrorCode::kInvalidField, "onnx_file"},
               {several, tether::ErrorCode::kInvalidField, "no default module"}};
  for (const auto& c : cases) {
    auto connected = tether::TetherClient::connect(offline_options(c.path.path()));
    ASSERT_FALSE(connected.ok()) << c.path.path();
    EXPECT_EQ(connected.status().code(), c.code) << connected.status().to_string();
    EXPECT_NE(connected.status().message().find(c.names), std::string::npos) << connected.status().to_string();
    EXPECT_NE(connected.status().message().find(c.path.path()), std::string::npos) << connected.status().to_string();
  }
}
