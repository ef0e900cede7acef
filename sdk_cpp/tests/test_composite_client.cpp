// A client of a Dict observation space with an action mask (protocol 1.4,
// §8.6, §11.6) against the fake server: the engine sets each leaf from its
// own arrays (ObservationLeaves); bad leaves and masks are refused locally,
// before anything is recorded or sampled; records go as objects of leaves,
// each a tensor in the body's attachment, that a server accepts.
#ifndef _WIN32

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "client_test_helpers.h"
#include "multi_agent_test_peer.h"
#include "tether/action_mask.h"
#include "tether/client.h"
#include "tether/episode.h"
#include "tether/multi_agent_client.h"
#include "tether/observation_leaves.h"
#include "tether/tensors.h"

namespace {

using fake::json;

// Dict(action_mask: Box[3] int8, board: Box[2, 2], cam: uint8 Box[2, 1]) acting in Discrete(3).
json masked_dict_space() {
  return {{"type", "Dict"},
          {"spaces",
           {{"board", {{"type", "Box"}, {"shape", {2, 2}}, {"low", 0}, {"high", 1}}},
            {"cam", {{"type", "Box"}, {"shape", {2, 1}}, {"dtype", "uint8"}, {"low", 0}, {"high", 255}}},
            {"action_mask", {{"type", "Box"}, {"shape", {3}}, {"dtype", "int8"}, {"low", 0}, {"high", 1}}}}}};
}

fake::ServerScript masked_script() {
  // Every model the fake server sends prefers even actions (the fake backend does not mask).
  fake::ServerScript script = fake::answering([](int n) { return fake::state(n, 0); });
  script.steps_per_sample = 6;
  script.config_overrides = {{"observation_space", masked_dict_space()},
                             {"action_space", fake::discrete(3)},
                             {"action_mask", "action_mask"},
                             {"onnx_input_names", {"action_mask", "board", "cam"}}};
  return script;
}

// A multi-agent module of masked_dict_space() acting in Discrete(3), masked by its action_mask leaf.
json masked_module() {
  return {{"observation_space", masked_dict_space()},
          {"action_space", fake::discrete(3)},
          {"action_mask", "action_mask"},
          {"onnx_input_names", {"action_mask", "board", "cam"}},
          {"onnx_output_names", {"action_dist_inputs"}},
          {"trainable", true}};
}

// A 1.4 server of multi-agent `config` whose every answer holds the fake model of each of its modules.
fake::ServerScript serving(json config) {
  config["protocol_version"] = "1.4";
  json models = json::object();
  for (auto it = config["modules"].begin(); it != config["modules"].end(); ++it) {
    models[it.key()] = {{"weights_seq_no", 0}, {"onnx_file", fake::onnx_file(0)}};
  }
  fake::ServerScript script = fake::answering([models](int) { return json{{"type", "SET_STATE"}, {"models", models}}; });
  script.full_config = std::move(config);
  return script;
}

// The agent steps of every multi-agent record the server received.
std::size_t agent_steps_received(fake::FakeServer& server) {
  std::size_t steps = 0;
  for (const json& batch : server.batches()) {
    for (const json& record : batch["episodes"]) {
      for (auto agent = record["agents"].begin(); agent != record["agents"].end(); ++agent) {
        steps += (*agent)["actions"].size();
      }
    }
  }
  return steps;
}

// One frame's arrays, as an engine holds them.
struct Frame {
  float board[4] = {0, 1, 1, 0};
  std::uint8_t cam[2] = {7, 200};
  float mask[3] = {1, 0, 1};  // the fake model prefers actions 0 and 2 (even logits)
};

TEST(CompositeClient, LeavesAreSetByPathAndRecordedAsTensorsOfLeaves) {
  fake::FakeServer server(masked_script());
  auto client = fake::connect(fake::waiting_options_for(server));
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->observation_space().is_composite());
  ASSERT_NE(client->action_mask(), nullptr);
  EXPECT_EQ(client->action_mask()->leaf, "action_mask");
  EXPECT_EQ(client->action_mask()->offset, 0u);  // leaf order: action_mask, board, cam

  tether::ObservationLeaves obs(client->observation_space());
  const int board = obs.index("board");
  const int cam = obs.index("cam");
  const int mask = obs.index("action_mask");
  ASSERT_GE(board, 0);
  ASSERT_GE(cam, 0);
  ASSERT_GE(mask, 0);
  Frame frame;
  double action = -1;
  int acted = 0;
  for (int e = 0; e < 3; ++e) {
    const std::string episode = client->start_episode().value();
    for (int t = 0; t < 4; ++t, ++acted) {
      frame.board[0] = static_cast<float>(t);
      frame.cam[0] = static_cast<std::uint8_t>(10 * t + e);
      ASSERT_TRUE(obs.set(board, frame.board, 4).ok());
      ASSERT_TRUE(obs.set(cam, frame.cam, 2).ok());
      ASSERT_TRUE(obs.set(mask, frame.mask, 3).ok());
      tether::Status status = client->get_action(episode, obs, &action, 1);
      ASSERT_TRUE(status.ok()) << status.to_string();
      EXPECT_TRUE(action == 0 || action == 2) << action;
      client->log_returns(episode, 1.0);
    }
    const float none[3] = {0, 0, 0};  // the final observation's mask may allow nothing: no action follows it
    ASSERT_TRUE(obs.set("action_mask", none, 3).ok());
    tether::Result<double> ended = client->end_episode(episode, obs);
    ASSERT_TRUE(ended.ok()) << ended.status().to_string();
  }
  ASSERT_TRUE(client->flush().ok());
  EXPECT_EQ(client->env_steps_sent(), acted);
  EXPECT_EQ(server.messages().front()["protocol_version"], "1.9");

  const tether::Space space = client->observation_space();
  const std::vector<json> batches = server.batches();
  const std::vector<std::string> attachments = server.attachments();
  ASSERT_EQ(batches.size(), attachments.size());
  std::size_t steps = 0;
  for (std::size_t b = 0; b < batches.size(); ++b) {
    const std::optional<std::string_view> attachment = std::string_view(attachments[b]);
    tether::Result<std::size_t> valid = tether::validate_episodes(batches[b], space, client->action_space(), true,
                                                                  attachment, client->action_mask());
    ASSERT_TRUE(valid.ok()) << valid.status().to_string();
    steps += valid.value();
    for (const json& record : batches[b]["episodes"]) {
      ASSERT_TRUE(record["obs"].is_object()) << record["obs"];
      ASSERT_EQ(record["obs"].size(), 3u);
      const std::size_t rows = record["actions"].size() + 1;
      tether::Result<tether::Tensor> cam_rows = tether::decode_tensor(record["obs"]["cam"], attachment);
      ASSERT_TRUE(cam_rows.ok()) << cam_rows.status().to_string();
      EXPECT_EQ(cam_rows.value().dtype(), tether::TensorDtype::kUint8);
      EXPECT_EQ(cam_rows.value().shape(), (std::vector<std::int64_t>{static_cast<std::int64_t>(rows), 2, 1}));
      EXPECT_EQ(cam_rows.value().value(1), 200.0);
      tether::Result<tether::Tensor> board_rows = tether::decode_tensor(record["obs"]["board"], attachment);
      ASSERT_TRUE(board_rows.ok()) << board_rows.status().to_string();
      EXPECT_EQ(board_rows.value().dtype(), tether::TensorDtype::kFloat32);
      EXPECT_EQ(board_rows.value().shape(), (std::vector<std::int64_t>{static_cast<std::int64_t>(rows), 2, 2}));
      EXPECT_EQ(board_rows.value().value(1), 1.0);
    }
  }
  EXPECT_EQ(steps, static_cast<std::size_t>(acted));
}

TEST(CompositeClient, BadLeavesAndMasksAreRefusedLocallyAndNothingIsRecorded) {
  fake::FakeServer server(masked_script());
  auto client = fake::connect(fake::waiting_options_for(server));
  ASSERT_NE(client, nullptr);
  const std::string episode = client->start_episode().value();
  Frame frame;
  double action = -1;
  const auto code_of = [&](const tether::ObservationLeaves& obs) {
    return client->get_action(episode, obs, &action, 1).code();
  };
  const auto full = [&] {
    tether::ObservationLeaves obs(client->observation_space());
    EXPECT_TRUE(obs.set("board", frame.board, 4).ok());
    EXPECT_TRUE(obs.set("cam", frame.cam, 2).ok());
    EXPECT_TRUE(obs.set("action_mask", frame.mask, 3).ok());
    return obs;
  };
  {
    tether::ObservationLeaves obs(client->observation_space());
    ASSERT_TRUE(obs.set("board", frame.board, 4).ok());
    ASSERT_TRUE(obs.set("action_mask", frame.mask, 3).ok());
    EXPECT_EQ(code_of(obs), tether::ErrorCode::kObsLeafMismatch);  // cam never set
  }
  {
    tether::ObservationLeaves obs = full();
    EXPECT_EQ(obs.set("lidar", frame.board, 1).code(), tether::ErrorCode::kObsLeafMismatch);
    EXPECT_EQ(code_of(obs), tether::ErrorCode::kObsLeafMismatch);
    obs.clear();  // the next frame starts afresh
    obs = full();
    EXPECT_TRUE(client->get_action(episode, obs, &action, 1).ok());
  }
  {
    tether::ObservationLeaves obs = full();
    EXPECT_EQ(obs.set("board", frame.board, 3).code(), tether::ErrorCode::kObsShapeMismatch);
    EXPECT_EQ(code_of(obs), tether::ErrorCode::kObsShapeMismatch);
  }
  {
    tether::ObservationLeaves obs = full();
    float board[4] = {0, std::numeric_limits<float>::quiet_NaN(), 0, 0};
    ASSERT_TRUE(obs.set("board", board, 4).ok());
    EXPECT_EQ(code_of(obs), tether::ErrorCode::kNonFiniteValue);
  }
  {
    tether::ObservationLeaves obs = full();
    const float cam[2] = {256, 1};  // a byte leaf set from floats takes integers 0-255 only
    ASSERT_TRUE(obs.set("cam", cam, 2).ok());
    EXPECT_EQ(code_of(obs), tether::ErrorCode::kObsDtypeMismatch);
  }
  {
    tether::ObservationLeaves obs = full();
    const float mask[3] = {1, 2, 0};
    ASSERT_TRUE(obs.set("action_mask", mask, 3).ok());
    EXPECT_EQ(code_of(obs), tether::ErrorCode::kInvalidActionMask);
    const float empty[3] = {0, 0, 0};
    ASSERT_TRUE(obs.set("action_mask", empty, 3).ok());
    EXPECT_EQ(code_of(obs), tether::ErrorCode::kActionMaskEmpty);
    // The flat row is checked alike.
    std::vector<float> row(client->observation_space().flat_dim());
    ASSERT_TRUE(obs.write_row(row.data(), row.size()).ok());
    EXPECT_EQ(client->get_action(episode, row.data(), row.size(), &action, 1).code(),
              tether::ErrorCode::kActionMaskEmpty);
    // ... but not a final observation's mask.
    EXPECT_TRUE(client->end_episode(episode, obs).ok());
  }
  ASSERT_TRUE(client->flush().ok());
  // One step acted (the good frame): its record holds 1 action, the refused frames none.
  std::size_t steps = 0;
  for (const json& batch : server.batches()) {
    for (const json& record : batch["episodes"]) steps += record["actions"].size();
  }
  EXPECT_EQ(steps, 1u);
}

TEST(CompositeClient, ADictActionSpaceOrAMaskThatDoesNotFitIsRefusedAtConnect) {
  for (const json& overrides :
       {json{{"action_space", masked_dict_space()}, {"action_mask", nullptr}},
        json{{"action_mask", "board"}},     // 4 values, 3 logits
        json{{"action_mask", "missing"}}}) {
    fake::ServerScript script = masked_script();
    for (auto it = overrides.begin(); it != overrides.end(); ++it) script.config_overrides[it.key()] = *it;
    fake::FakeServer server(script);
    tether::ClientOptions options = fake::options_for(server);
    options.reconnect_timeout_s = 0.5;
    auto connected = tether::TetherClient::connect(options);
    ASSERT_FALSE(connected.ok()) << overrides;
    EXPECT_EQ(connected.status().code(), tether::ErrorCode::kInvalidField) << connected.status().to_string();
  }
}

// [1.4] Bytes are a Box's values: a Dict or Tuple space's observation goes
// by its leaves (or its flat row of floats), so the byte overloads refuse it
// by name, before anything is recorded, as the C# SDK does.
TEST(CompositeClient, TheByteOverloadsRefuseACompositeSpace) {
  fake::FakeServer server(masked_script());
  auto client = fake::connect(fake::waiting_options_for(server));
  ASSERT_NE(client, nullptr);
  const std::string episode = client->start_episode().value();
  const std::vector<std::uint8_t> row(client->observation_space().flat_dim(), 1);
  double action = -1;
  const double taken = 0;
  tether::Status refused = client->get_action(episode, row.data(), row.size(), &action, 1);
  EXPECT_EQ(refused.code(), tether::ErrorCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("ObservationLeaves"), std::string::npos) << refused.message();
  EXPECT_EQ(client->log_action(episode, row.data(), row.size(), &taken, 1).code(), tether::ErrorCode::kInvalidArgument);
  EXPECT_EQ(client->compute_action(row.data(), row.size(), &action, 1).code(), tether::ErrorCode::kInvalidArgument);
  EXPECT_EQ(client->end_episode(episode, row.data(), row.size()).status().code(), tether::ErrorCode::kInvalidArgument);
  EXPECT_EQ(action, -1);
  ASSERT_TRUE(client->flush().ok());
  EXPECT_EQ(client->env_steps_sent(), 0);  // nothing recorded, and the episode still runs
  EXPECT_TRUE(client->log_returns(episode, 1.0).ok());
}

TEST(CompositeClient, ObservationLeavesNeedsACompositeSpace) {
  tether::ObservationLeaves obs(tether::Space::box({2}, 0.0, 1.0).value());
  const float values[2] = {0, 1};
  EXPECT_EQ(obs.set(0, values, 2).code(), tether::ErrorCode::kObsLeafMismatch);
  float row[2];
  EXPECT_FALSE(obs.write_row(row, 2).ok());
}

// The multi-agent client checks each agent's row against its module as the
// single-agent client does (and as the Python and C# SDKs do): a byte leaf or
// a group's byte box takes integers 0-255 only, an acting agent's mask holds
// only 0 and 1 and allows an action, but a final observation's mask may allow
// nothing. A refused frame records nothing and acts for no agent.
TEST(CompositeClient, MultiAgentFramesAreCheckedPerAgentBeforeAnythingIsRecorded) {
  json bytes = fake::module_json(4, {{"type", "MultiDiscrete"}, {"nvec", {2, 2}}});
  bytes["observation_space"] = {{"type", "Box"}, {"shape", {4}}, {"dtype", "uint8"}, {"low", 0}, {"high", 255}};
  json config = fake::multi_agent_config(
      1000, {{"d", masked_module()}, {"px", bytes}},
      json::array({{{"pattern", "a_*"}, {"module", "d"}}, {{"agent_id", "pair"}, {"module", "px"}}}));
  config["groups"] = {{"pair", {{"members", {"p_0", "p_1"}}}}};
  fake::FakeServer server(serving(config));
  auto client = fake::connect_multi(fake::waiting_options_for(server));
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->start_episode("e").ok());

  // Each a_* row in leaf order: action_mask (3), board (4), cam (2).
  const auto row = [](std::vector<float> mask, float cam0) {
    std::vector<float> values = std::move(mask);
    values.insert(values.end(), {0, 1, 1, 0, cam0, 9});
    return values;
  };
  const std::vector<float> good = row({1, 0, 1}, 7);
  const float pair_obs[2] = {3, 4};
  tether::AgentFrame frame;
  const auto play = [&](const std::vector<float>& a_1, const float* p_1) {
    frame.clear();
    frame.add("a_0", good.data(), good.size());
    frame.add("a_1", a_1.data(), a_1.size());
    frame.add("p_0", pair_obs, 2);
    frame.add("p_1", p_1, 2);
    return client->get_action("e", frame);
  };
  // (This config has a group: every frame takes the general path; the steady-frame path is the next test's.)
  ASSERT_TRUE(play(good, pair_obs).ok());
  ASSERT_TRUE(play(good, pair_obs).ok());
  EXPECT_NE(frame.action(1)[0], 1.0);  // the mask forbids action 1 (the fake model prefers even ones anyway)

  const float bad_member[2] = {3, 4.5f};
  tether::Status status = play(good, bad_member);
  EXPECT_EQ(status.code(), tether::ErrorCode::kObsDtypeMismatch) << status.to_string();
  EXPECT_NE(status.message().find("'p_1'"), std::string::npos) << status.to_string();
  EXPECT_EQ(frame.action_size(0), 0u);  // nothing acted

  status = play(row({1, 0, 1}, 300), pair_obs);
  EXPECT_EQ(status.code(), tether::ErrorCode::kObsDtypeMismatch) << status.to_string();
  EXPECT_NE(status.message().find("agent 'a_1'"), std::string::npos) << status.to_string();
  EXPECT_NE(status.message().find("cam"), std::string::npos) << status.to_string();

  status = play(row({1, 2, 0}, 7), pair_obs);
  EXPECT_EQ(status.code(), tether::ErrorCode::kInvalidActionMask) << status.to_string();
  EXPECT_NE(status.message().find("agent 'a_1'"), std::string::npos) << status.to_string();
  status = play(row({0, 0, 0}, 7), pair_obs);
  EXPECT_EQ(status.code(), tether::ErrorCode::kActionMaskEmpty) << status.to_string();

  // A frame of a single module's agents only.
  ASSERT_TRUE(client->start_episode("s").ok());
  for (int t = 0; t < 3; ++t) {
    frame.clear();
    frame.add("a_0", good.data(), good.size());
    frame.add("a_1", good.data(), good.size());
    ASSERT_TRUE(client->get_action("s", frame).ok());
  }
  frame.clear();
  const std::vector<float> empty = row({0, 0, 0}, 7);
  frame.add("a_0", good.data(), good.size());
  frame.add("a_1", empty.data(), empty.size());
  status = client->get_action("s", frame);
  EXPECT_EQ(status.code(), tether::ErrorCode::kActionMaskEmpty) << status.to_string();

  // A final observation's mask may allow nothing; its bytes are still checked.
  frame.clear();
  frame.add("a_0", good.data(), good.size());
  const std::vector<float> bad_cam = row({1, 0, 1}, -1);
  frame.add("a_1", bad_cam.data(), bad_cam.size());
  EXPECT_EQ(client->end_episode("s", &frame).status().code(), tether::ErrorCode::kObsDtypeMismatch);
  frame.clear();
  frame.add("a_0", good.data(), good.size());
  frame.add("a_1", empty.data(), empty.size());
  EXPECT_TRUE(client->end_episode("s", &frame).ok());
  ASSERT_TRUE(client->end_episode("e").ok());
  ASSERT_TRUE(client->flush().ok());
  // Acted: 2 frames of episode e (a_0, a_1, pair) and 3 of s (a_0, a_1); the refused ones none.
  EXPECT_EQ(agent_steps_received(server), 2u * 3u + 3u * 2u);
}

// A group of a masked module (§11.6): its mask is read from the group's joined
// observation (its members' in member order) exactly as an agent's is from
// its row, and checked before sampling and against a logged joint action;
// a final observation's mask may allow nothing. Nothing of a refused frame is recorded.
TEST(CompositeClient, AGroupFollowsItsModulesMask) {
  // Module "pm": Dict(action_mask: Box[4], board: Box[2]) acting in MultiDiscrete([2, 2]); the
  // pair's members observe 3 values each, joined in leaf order: action_mask (4), then board (2).
  json pm = {{"observation_space",
              {{"type", "Dict"},
               {"spaces",
                {{"board", {{"type", "Box"}, {"shape", {2}}, {"low", 0}, {"high", 1}}},
                 {"action_mask", {{"type", "Box"}, {"shape", {4}}, {"low", 0}, {"high", 1}}}}}}},
             {"action_space", {{"type", "MultiDiscrete"}, {"nvec", {2, 2}}}},
             {"action_mask", "action_mask"},
             {"onnx_input_names", {"action_mask", "board"}},
             {"onnx_output_names", {"action_dist_inputs"}},
             {"trainable", true}};
  json config = fake::multi_agent_config(1000, {{"pm", pm}}, json::array({{{"agent_id", "pair"}, {"module", "pm"}}}));
  config["groups"] = {{"pair", {{"members", {"p_0", "p_1"}}}}};
  fake::FakeServer server(serving(config));
  auto client = fake::connect_multi(fake::waiting_options_for(server));
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->start_episode("e").ok());
  tether::AgentFrame frame;
  const auto fill = [&](const std::vector<float>& mask) {
    const float p_0[3] = {mask[0], mask[1], mask[2]}, p_1[3] = {mask[3], 0, 1};  // (the mask spans both members)
    frame.clear();
    frame.add("p_0", p_0, 3);
    frame.add("p_1", p_1, 3);
  };
  const auto play = [&](const std::vector<float>& mask, const double* logged = nullptr) {
    fill(mask);
    if (logged != nullptr) frame.log_action("pair", logged, 2);
    return client->get_action("e", frame);
  };
  ASSERT_TRUE(play({1, 0, 1, 0}).ok());  // (the fake model prefers (0, 0))
  EXPECT_EQ(frame.action(0)[0], 0.0);
  EXPECT_EQ(frame.action(1)[0], 0.0);

  tether::Status status = play({1, 2, 1, 0});
  EXPECT_EQ(status.code(), tether::ErrorCode::kInvalidActionMask) << status.to_string();
  EXPECT_NE(status.message().find("group 'pair'"), std::string::npos) << status.to_string();
  EXPECT_EQ(frame.action_size(0), 0u);  // nothing acted
  status = play({0, 0, 1, 1});  // the first entry allows nothing
  EXPECT_EQ(status.code(), tether::ErrorCode::kActionMaskEmpty) << status.to_string();
  EXPECT_NE(status.message().find("group 'pair'"), std::string::npos) << status.to_string();
  EXPECT_EQ(client->compute_actions(frame, "eval").code(), tether::ErrorCode::kActionMaskEmpty);

  const double forbidden[2] = {1, 0}, allowed[2] = {0, 1};
  status = play({1, 0, 1, 1}, forbidden);
  EXPECT_EQ(status.code(), tether::ErrorCode::kActionMasked) << status.to_string();
  EXPECT_NE(status.message().find("'pair'"), std::string::npos) << status.to_string();
  status = play({1, 0, 1, 1}, allowed);
  ASSERT_TRUE(status.ok()) << status.to_string();
  EXPECT_EQ(frame.action(0)[0], 0.0);  // each member its part of the logged joint action
  EXPECT_EQ(frame.action(1)[0], 1.0);

  fill({0, 0, 0, 0});  // a final observation: no action follows it
  ASSERT_TRUE(client->end_episode("e", &frame).ok());
  ASSERT_TRUE(client->flush().ok());
  const std::vector<json> batches = server.batches();
  const std::vector<std::string> attachments = server.attachments();
  ASSERT_EQ(batches.size(), attachments.size());
  std::size_t records = 0;
  for (std::size_t b = 0; b < batches.size(); ++b) {
    for (const json& record : batches[b]["episodes"]) {
      ++records;
      EXPECT_EQ(record["agents"]["pair"]["actions"], json({{0, 0}, {0, 1}}));  // the refused frames: nothing
      // (as a server checks it: the masks 0/1, each allowing something, the actions allowed, §10.6 14b-14d)
      tether::Result<std::size_t> steps = tether::validate_multi_agent_record(
          record, 0, fake::module_specs(config), true, std::string_view(attachments[b]));
      EXPECT_TRUE(steps.ok()) << steps.status().to_string();
    }
  }
  EXPECT_EQ(records, 1u);
}

// Without groups or critics, a frame of the same agents as the last takes the same-agents path, and
// once recorded the steady-frame path (MultiAgentClient::act_steady): both check each row as the
// general path does, and a refused frame records nothing.
TEST(CompositeClient, TheSteadyFramePathChecksEachAgentsRowToo) {
  fake::FakeServer server(serving(fake::multi_agent_config(
      1000, {{"d", masked_module()}}, json::array({{{"pattern", "a_*"}, {"module", "d"}}}))));
  auto client = fake::connect_multi(fake::waiting_options_for(server));
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->start_episode("s").ok());
  const std::vector<float> good = {1, 0, 1, 0, 1, 1, 0, 7, 9};  // mask, board, cam
  tether::AgentFrame frame;
  const auto play = [&](const std::vector<float>& a_1) {
    frame.clear();
    frame.add("a_0", good.data(), good.size());
    frame.add("a_1", a_1.data(), a_1.size());
    return client->get_action("s", frame);
  };
  for (int t = 0; t < 4; ++t) ASSERT_TRUE(play(good).ok());
  const std::int64_t steady = tether::MultiAgentClientTestPeer::steady_frames(*client);
  EXPECT_GE(steady, 2) << "the repeated frames took the steady-frame path";
  std::vector<float> bad = good;
  bad[1] = 2;  // a mask value that is not 0 or 1
  tether::Status status = play(bad);
  EXPECT_EQ(status.code(), tether::ErrorCode::kInvalidActionMask) << status.to_string();
  EXPECT_NE(status.message().find("agent 'a_1'"), std::string::npos) << status.to_string();
  bad = good;
  bad[0] = bad[2] = 0;  // allows nothing
  EXPECT_EQ(play(bad).code(), tether::ErrorCode::kActionMaskEmpty);
  bad = good;
  bad[8] = 300;  // not a byte
  EXPECT_EQ(play(bad).code(), tether::ErrorCode::kObsDtypeMismatch);
  EXPECT_EQ(frame.action_size(0), 0u);
  ASSERT_TRUE(play(good).ok());
  EXPECT_GT(tether::MultiAgentClientTestPeer::steady_frames(*client), steady) << "checked on the steady path";
  // The same refusals when the steady path is off (the same-agents branch of the general path).
  tether::MultiAgentClientTestPeer::use_steady_path(*client, false);
  ASSERT_TRUE(play(good).ok());
  bad = good;
  bad[1] = 2;
  EXPECT_EQ(play(bad).code(), tether::ErrorCode::kInvalidActionMask);
  ASSERT_TRUE(client->end_episode("s").ok());
  ASSERT_TRUE(client->flush().ok());
  EXPECT_EQ(agent_steps_received(server), 6u * 2u);  // six good frames of two agents; the refused ones nothing
}

}  // namespace

#endif  // _WIN32
