// Demonstration files (protocol 1.6, §18): DemoWriter's lines, its refusals
// and close(); and the files TetherClient and MultiAgentClient write while
// they play (ClientOptions::demo_path), read back and checked as the
// server's reader checks them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tether/demonstrations.h"
#include "tether/episode.h"
#include "tether/messages.h"

#ifndef _WIN32
#include "client_test_helpers.h"
#endif

namespace {

using nlohmann::json;
using tether::DemoModuleSpaces;
using tether::DemoWriter;
using tether::ErrorCode;

// A path in the temporary directory, removed when the test ends.
class TempFile {
 public:
  explicit TempFile(const std::string& name)
      : path_((std::filesystem::temp_directory_path() / ("tether_" + name + ".jsonl")).string()) {
    std::remove(path_.c_str());
  }
  ~TempFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The file's lines, each parsed (a line that is no JSON fails the test).
std::vector<json> lines_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<json> out;
  for (std::string line; std::getline(in, line);) {
    tether::Result<json> parsed = tether::parse_json(line);
    EXPECT_TRUE(parsed.ok()) << line;
    out.push_back(parsed.ok() ? parsed.value() : json());
  }
  return out;
}

// Checks each episode line as the server's reader does (§18: §10.6 checks
// 1-14d and 20 against its module's header spaces, one flag true).
void expect_readable(const std::vector<json>& lines) {
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines[0]["format"], tether::kDemoFormat);
  EXPECT_EQ(lines[0]["version"], tether::kDemoVersion);
  for (std::size_t i = 1; i < lines.size(); ++i) {
    const json& line = lines[i];
    tether::Result<tether::ModuleSpec> spec =
        tether::ModuleSpec::from_json(line["module"], lines[0]["modules"][line["module"].get<std::string>()]);
    ASSERT_TRUE(spec.ok()) << spec.status().to_string();
    const tether::ModuleSpec& module = spec.value();
    tether::Result<std::size_t> steps =
        tether::validate_episode(line, i, module.observation_space, module.action_space, false, std::nullopt,
                                 module.action_mask ? &*module.action_mask : nullptr);
    EXPECT_TRUE(steps.ok()) << steps.status().to_string();
    EXPECT_TRUE(line["is_terminated"].get<bool>() || line["is_truncated"].get<bool>());
    EXPECT_TRUE(line["agent_id"].is_string());
    EXPECT_TRUE(line["episode_id"].is_string());
    EXPECT_FALSE(line.contains("action_logp") || line.contains("action_dist_inputs") || line.contains("state_in"));
  }
}

std::map<std::string, DemoModuleSpaces> box_discrete(int n = 3) {
  std::map<std::string, DemoModuleSpaces> modules;
  modules["m"] = {{{"type", "Box"}, {"shape", {2}}, {"low", -1.0}, {"high", 1.0}}, {{"type", "Discrete"}, {"n", n}},
                  std::nullopt};
  return modules;
}

const float kObs[2] = {0.25f, -0.5f};

TEST(DemoWriter, WritesTheHeaderThenALinePerEpisodeAsItEnds) {
  TempFile file("demo_lines");
  auto created = DemoWriter::create(file.path(), box_discrete());
  ASSERT_TRUE(created.ok()) << created.status().to_string();
  DemoWriter& writer = *created.value();
  EXPECT_EQ(lines_of(file.path()).size(), 1u);  // the header, written (and flushed) at once
  const double two = 2, one = 1;
  ASSERT_TRUE(writer.add_reward("e", "a", 5.0).ok());  // before any step: no step to go to
  ASSERT_TRUE(writer.step("e", "a", "m", kObs, 2, &two, 1, false).ok());
  ASSERT_TRUE(writer.add_reward("e", "a", 0.5).ok());
  ASSERT_TRUE(writer.add_reward("e", "a", 0.25).ok());
  ASSERT_TRUE(writer.step("e", "b", "m", kObs, 2, &one, 1, true).ok());  // another agent of the episode
  ASSERT_TRUE(writer.step("e", "a", "m", kObs, 2, &one, 1, true).ok());
  ASSERT_TRUE(writer.step("e", "a", "m", kObs, 2, &one, 1, true).ok());
  EXPECT_EQ(writer.running(), 2u);
  const float final_obs[2] = {1.0f, 0.1f};
  ASSERT_TRUE(writer.end("e", "a", final_obs, 2, /*terminated=*/false).ok());
  std::vector<json> lines = lines_of(file.path());  // the line is flushed as it is written
  ASSERT_EQ(lines.size(), 2u);
  const json& line = lines[1];
  EXPECT_EQ(line["module"], "m");
  EXPECT_EQ(line["agent_id"], "a");
  EXPECT_EQ(line["episode_id"], "e");
  EXPECT_EQ(line["obs"], json({{0.25, -0.5}, {0.25, -0.5}, {0.25, -0.5}, {1.0, 0.1}}));  // float32 as written
  EXPECT_EQ(static_cast<float>(line["obs"][3][1].get<double>()), 0.1f);  // reads back as the same float32
  EXPECT_EQ(line["actions"], json({2, 1, 1}));
  EXPECT_TRUE(line["actions"][0].is_number_integer());
  EXPECT_EQ(line["rewards"], json({0.75, 0.0, 0.0}));
  EXPECT_EQ(line["logged_runs"], json({{1, 2}}));
  EXPECT_FALSE(line["is_terminated"].get<bool>());
  EXPECT_TRUE(line["is_truncated"].get<bool>());
  ASSERT_TRUE(writer.end("e", "nobody", final_obs, 2, true).ok());  // took no step: nothing to write
  ASSERT_TRUE(writer.close().ok());  // b's one step has no next observation: nothing to write
  lines = lines_of(file.path());
  EXPECT_EQ(lines.size(), 2u);
  expect_readable(lines);
  EXPECT_EQ(writer.episodes_written(), 1u);
  EXPECT_TRUE(writer.closed());
  EXPECT_EQ(writer.step("e", "a", "m", kObs, 2, &one, 1).code(), ErrorCode::kClosed);
  EXPECT_TRUE(writer.close().ok());  // (idempotent)
}

TEST(DemoWriter, CloseWritesTheRunningEpisodesTruncatedInTheOrderTheyStarted) {
  TempFile file("demo_close");
  {
    auto created = DemoWriter::create(file.path(), box_discrete());
    ASSERT_TRUE(created.ok()) << created.status().to_string();
    DemoWriter& writer = *created.value();
    const float obs[3][2] = {{0.0f, 0.0f}, {0.5f, 0.5f}, {1.0f, 1.0f}};
    for (const char* episode : {"z-first", "a-second"}) {
      for (int t = 0; t < 3; ++t) {
        const double action = t;
        ASSERT_TRUE(writer.step(episode, "a", "m", obs[t], 2, &action, 1, t == 2).ok());
        ASSERT_TRUE(writer.add_reward(episode, "a", 1.0).ok());
      }
    }
  }  // (the destructor closes)
  const std::vector<json> lines = lines_of(file.path());
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[1]["episode_id"], "z-first");
  EXPECT_EQ(lines[2]["episode_id"], "a-second");
  for (std::size_t i = 1; i < 3; ++i) {
    // The last step's next observation never came: its observation ends the episode.
    EXPECT_EQ(lines[i]["actions"], json({0, 1}));
    EXPECT_EQ(lines[i]["obs"], json({{0.0, 0.0}, {0.5, 0.5}, {1.0, 1.0}}));
    EXPECT_TRUE(lines[i]["is_truncated"].get<bool>());
    EXPECT_FALSE(lines[i].contains("logged_runs"));  // (only the step left out was logged)
  }
  expect_readable(lines);
}

TEST(DemoWriter, RefusesWhatNoReaderTakes) {
  TempFile file("demo_refusals");
  auto created = DemoWriter::create(file.path(), box_discrete());
  ASSERT_TRUE(created.ok());
  DemoWriter& writer = *created.value();
  const double one = 1, three = 3, half = 0.5;
  const float nan_obs[2] = {0.0f, std::nanf("")};
  EXPECT_EQ(writer.step("e", "a", "other", kObs, 2, &one, 1).code(), ErrorCode::kUnknownModule);
  EXPECT_EQ(writer.step("e", "a", "m", kObs, 3, &one, 1).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(writer.step("e", "a", "m", nan_obs, 2, &one, 1).code(), ErrorCode::kNonFiniteValue);
  EXPECT_EQ(writer.step("e", "a", "m", kObs, 2, &three, 1).code(), ErrorCode::kActionOutOfSpace);
  EXPECT_EQ(writer.step("e", "a", "m", kObs, 2, &half, 1).code(), ErrorCode::kActionOutOfSpace);
  EXPECT_EQ(writer.running(), 0u);
  ASSERT_TRUE(writer.step("e", "a", "m", kObs, 2, &one, 1).ok());
  EXPECT_EQ(writer.add_reward("e", "a", std::nan("")).code(), ErrorCode::kNonFiniteValue);
  EXPECT_EQ(writer.end("e", "a", nan_obs, 2, true).code(), ErrorCode::kNonFiniteValue);
  EXPECT_EQ(writer.end("e", "a", kObs, 1, true).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(writer.running(), 1u);  // (still running: end it again)
  writer.discard("e", "a");
  EXPECT_EQ(writer.running(), 0u);
  ASSERT_TRUE(writer.close().ok());
  EXPECT_EQ(lines_of(file.path()).size(), 1u);

  EXPECT_EQ(DemoWriter::create(file.path(), {}).status().code(), ErrorCode::kInvalidArgument);
  std::map<std::string, DemoModuleSpaces> bad = box_discrete();
  bad["m"].observation_space = {{"type", "Box"}};  // no shape
  EXPECT_EQ(DemoWriter::create(file.path(), bad).status().code(), ErrorCode::kInvalidField);
  std::map<std::string, DemoModuleSpaces> unmaskable = box_discrete();
  unmaskable["m"].action_mask = "mask";  // a Box observation has no leaf
  EXPECT_EQ(DemoWriter::create(file.path(), unmaskable).status().code(), ErrorCode::kInvalidField);
  const tether::Status no_folder =
      DemoWriter::create((std::filesystem::temp_directory_path() / "no-such-folder" / "x.jsonl").string(),
                         box_discrete())
          .status();
  EXPECT_EQ(no_folder.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(no_folder.message().find("no-such-folder"), std::string::npos) << no_folder.message();
}

// A step's reward is written as float32 (§10.5): a sum beyond it would be
// written as null, a line the reader refuses; it is refused, the sum kept.
// -0.0 and float32's extremes round-trip; a Discrete action is an integer.
TEST(DemoWriter, RewardsAndObservationsStayNumbersTheReaderTakes) {
  TempFile file("demo_numbers");
  std::map<std::string, DemoModuleSpaces> modules = box_discrete();
  modules["m"].observation_space = {{"type", "Box"}, {"shape", {2}}, {"low", -4e38}, {"high", 4e38}};
  auto created = DemoWriter::create(file.path(), modules);
  ASSERT_TRUE(created.ok());
  DemoWriter& writer = *created.value();
  const float extremes[2] = {-0.0f, 3.4028235e38f};
  const float tiny[2] = {1e-45f, -1.17549435e-38f};
  const double two = 2;
  ASSERT_TRUE(writer.step("e", "a", "m", extremes, 2, &two, 1).ok());
  ASSERT_TRUE(writer.add_reward("e", "a", 3e38).ok());
  EXPECT_EQ(writer.add_reward("e", "a", 1e38).code(), ErrorCode::kNonFiniteValue);  // 4e38: beyond float32
  EXPECT_EQ(writer.add_reward("e", "a", 1e300).code(), ErrorCode::kNonFiniteValue);
  ASSERT_TRUE(writer.add_reward("e", "a", -1e38).ok());
  ASSERT_TRUE(writer.end("e", "a", tiny, 2, true).ok());
  ASSERT_TRUE(writer.close().ok());
  const std::vector<json> lines = lines_of(file.path());
  ASSERT_EQ(lines.size(), 2u);
  expect_readable(lines);
  const json& line = lines[1];
  ASSERT_TRUE(line["rewards"][0].is_number_float()) << line.dump();
  EXPECT_FLOAT_EQ(line["rewards"][0].get<float>(), 2e38f);
  EXPECT_TRUE(line["actions"][0].is_number_integer()) << line.dump();
  EXPECT_EQ(line["actions"][0], 2);
  const float zero = line["obs"][0][0].get<float>();
  EXPECT_TRUE(zero == 0.0f && std::signbit(zero)) << line.dump();
  EXPECT_EQ(line["obs"][0][1].get<float>(), 3.4028235e38f);
  EXPECT_EQ(line["obs"][1][0].get<float>(), 1e-45f);
  EXPECT_EQ(line["obs"][1][1].get<float>(), -1.17549435e-38f);
}

#ifdef __linux__
// A file that cannot be written (a full disk): create() says so, naming the file.
TEST(DemoWriter, AFullDiskFailsClearly) {
  auto created = DemoWriter::create("/dev/full", box_discrete());
  ASSERT_FALSE(created.ok());
  EXPECT_EQ(created.status().code(), ErrorCode::kInternal);
  EXPECT_NE(created.status().message().find("/dev/full"), std::string::npos) << created.status().message();
}
#endif

// A Dict observation is written as one member per leaf (§10.1), its mask checked against the actions.
TEST(DemoWriter, ACompositeObservationIsWrittenByLeafAndItsMaskIsChecked) {
  TempFile file("demo_composite");
  std::map<std::string, DemoModuleSpaces> modules;
  modules["m"] = {{{"type", "Dict"},
                   {"spaces",
                    {{"cam", {{"type", "Box"}, {"shape", {2}}, {"dtype", "uint8"}, {"low", 0}, {"high", 255}}},
                     {"mask", {{"type", "Box"}, {"shape", {3}}, {"low", 0}, {"high", 1}}}}}},
                  {{"type", "Discrete"}, {"n", 3}},
                  std::string("mask")};
  auto created = DemoWriter::create(file.path(), modules);
  ASSERT_TRUE(created.ok()) << created.status().to_string();
  DemoWriter& writer = *created.value();
  const float row[5] = {7, 200, 1, 0, 1};  // leaf order: cam, mask
  const double forbidden = 1, allowed = 2;
  EXPECT_EQ(writer.step("e", "a", "m", row, 5, &forbidden, 1).code(), ErrorCode::kActionMasked);
  const float not_a_byte[5] = {7.5f, 200, 1, 0, 1};
  EXPECT_EQ(writer.step("e", "a", "m", not_a_byte, 5, &allowed, 1).code(), ErrorCode::kObsDtypeMismatch);
  ASSERT_TRUE(writer.step("e", "a", "m", row, 5, &allowed, 1).ok());
  const float final_row[5] = {8, 201, 0, 0, 0};  // (a final observation's mask may allow nothing)
  ASSERT_TRUE(writer.end("e", "a", final_row, 5, true).ok());
  ASSERT_TRUE(writer.close().ok());
  const std::vector<json> lines = lines_of(file.path());
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0]["modules"]["m"]["action_mask"], "mask");
  EXPECT_EQ(lines[1]["obs"]["cam"], json({{7, 200}, {8, 201}}));
  EXPECT_TRUE(lines[1]["obs"]["cam"][0][0].is_number_integer());
  EXPECT_EQ(lines[1]["obs"]["mask"], json({{1, 0, 1}, {0, 0, 0}}));
  expect_readable(lines);
}

#ifndef _WIN32

// TetherClient with demo_path: sampled and logged steps, every episode
// (recorded or not), the running one written truncated at close().
TEST(DemoRecording, TetherClientWritesEveryEpisodeItPlays) {
  TempFile file("demo_client");
  fake::ServerScript script;
  script.steps_per_sample = 100;
  fake::FakeServer server(script);
  tether::ClientOptions options = fake::waiting_options_for(server);
  options.demo_path = file.path();
  auto client = fake::connect(options);
  ASSERT_NE(client, nullptr);
  ASSERT_NE(client->demo_writer(), nullptr);
  const float obs[4] = {0.1f, 0.2f, 0.3f, 0.4f};
  double action = -1;
  const double one = 1;
  const std::string first = client->start_episode("first").value();
  ASSERT_TRUE(client->get_action(first, obs, 4, &action, 1).ok());
  ASSERT_TRUE(client->log_returns(first, 1.5).ok());
  ASSERT_TRUE(client->log_action(first, obs, 4, &one, 1).ok());
  ASSERT_TRUE(client->log_returns(first, -1.0).ok());
  ASSERT_TRUE(client->end_episode(first, obs, 4).ok());
  const std::string unrecorded = client->start_episode("unrecorded", /*training_enabled=*/false).value();
  ASSERT_TRUE(client->log_action(unrecorded, obs, 4, &one, 1).ok());
  ASSERT_TRUE(client->end_episode(unrecorded, obs, 4, /*truncated=*/true).ok());
  const std::string running = client->start_episode("running").value();
  for (int t = 0; t < 3; ++t) ASSERT_TRUE(client->get_action(running, obs, 4, &action, 1).ok());
  EXPECT_EQ(lines_of(file.path()).size(), 3u);  // (the ended episodes' lines are on disk already)
  client->close();
  EXPECT_EQ(client->demo_writer(), nullptr);
  const std::vector<json> lines = lines_of(file.path());
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0]["modules"]["default_policy"]["observation_space"], server.config()["observation_space"]);
  EXPECT_EQ(lines[0]["modules"]["default_policy"]["action_space"], server.config()["action_space"]);
  EXPECT_EQ(lines[1]["episode_id"], "first");
  EXPECT_EQ(lines[1]["agent_id"], tether::kDefaultAgentId);
  EXPECT_EQ(lines[1]["module"], "default_policy");
  EXPECT_EQ(lines[1]["actions"], json({0, 1}));  // (the fake model prefers 0)
  EXPECT_EQ(lines[1]["rewards"], json({1.5, -1.0}));
  EXPECT_EQ(lines[1]["logged_runs"], json({{1, 1}}));
  EXPECT_TRUE(lines[1]["is_terminated"].get<bool>());
  EXPECT_EQ(lines[2]["episode_id"], "unrecorded");
  EXPECT_TRUE(lines[2]["is_truncated"].get<bool>());
  EXPECT_EQ(lines[3]["episode_id"], "running");
  EXPECT_EQ(lines[3]["actions"].size(), 2u);
  EXPECT_TRUE(lines[3]["is_truncated"].get<bool>());
  expect_readable(lines);
}

TEST(DemoRecording, AFileThatCannotBeCreatedFailsConnect) {
  fake::FakeServer server(fake::ServerScript{});
  tether::ClientOptions options = fake::options_for(server);
  options.demo_path = (std::filesystem::temp_directory_path() / "no-such-folder" / "x.jsonl").string();
  auto connected = tether::TetherClient::connect(options);
  EXPECT_EQ(connected.status().code(), ErrorCode::kInvalidArgument) << connected.status().to_string();
}

// MultiAgentClient with demo_path: one line per agent (and group) episode,
// each in its module's spaces, the group's joint observation and action.
TEST(DemoRecording, MultiAgentClientWritesALinePerActor) {
  TempFile file("demo_multi");
  fake::ServerScript script = fake::answering([](int n) { return fake::pair_state(n); });
  script.full_config = fake::pair_config(1000);
  fake::FakeServer server(script);
  tether::ClientOptions options = fake::waiting_options_for(server);
  options.demo_path = file.path();
  auto client = fake::connect_multi(options);
  ASSERT_NE(client, nullptr);
  const std::string episode = client->start_episode("ep").value();
  const float a_obs[2] = {0.5f, -0.5f}, p0[2] = {1.0f, 2.0f}, p1[2] = {3.0f, 4.0f};
  tether::AgentFrame frame;
  const double joint[2] = {0, 0};
  for (int t = 0; t < 3; ++t) {
    frame.clear();
    frame.add("a_0", a_obs, 2);
    frame.add("p_0", p0, 2);
    frame.add("p_1", p1, 2);
    if (t == 1) frame.log_action("pair", joint, 2);
    ASSERT_TRUE(client->get_action(episode, frame).ok());
    ASSERT_TRUE(client->log_returns(episode, "p_0", 1.0).ok());  // (the group's reward)
  }
  frame.clear();
  frame.add("a_0", a_obs, 2);
  ASSERT_TRUE(client->end_agents(episode, frame).ok());
  EXPECT_EQ(lines_of(file.path()).size(), 2u);  // a_0 left: its line is written
  ASSERT_TRUE(client->end_episode(episode).ok());
  client->close();
  const std::vector<json> lines = lines_of(file.path());
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0]["modules"].size(), 2u);
  EXPECT_EQ(lines[1]["agent_id"], "a_0");
  EXPECT_EQ(lines[1]["module"], "m");
  EXPECT_EQ(lines[1]["actions"], json({1, 1, 1}));
  EXPECT_FALSE(lines[1].contains("logged_runs"));
  EXPECT_EQ(lines[2]["agent_id"], "pair");
  EXPECT_EQ(lines[2]["module"], "pm");
  EXPECT_EQ(lines[2]["obs"][0], json({1.0, 2.0, 3.0, 4.0}));
  EXPECT_EQ(lines[2]["actions"], json({{1, 1}, {0, 0}, {1, 1}}));
  EXPECT_EQ(lines[2]["rewards"], json({1.0, 1.0, 1.0}));
  EXPECT_EQ(lines[2]["logged_runs"], json({{1, 1}}));
  expect_readable(lines);
}

#endif  // _WIN32

}  // namespace
