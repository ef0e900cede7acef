// Models with memory (protocol 1.5, §12.1, §12.4) in ONNX Runtime: the
// conformance vectors of kind "carry" (tests/conformance/recurrent.json: a
// small LSTM run step by step from zeros with its state fed back, and the
// state_in of the records an episode is cut into), and how TetherClient and
// MultiAgentClient carry the state: zeros at the start, advanced at every
// step, a continuing chunk's state_in, kept across a hot-swap, reset (with
// the uncut steps dropped) by a reconnect that announces another state, a
// group's state, compute_action's memory per episode id, a model lacking
// an announced state tensor refused, and [1.6] logged steps advancing the
// state as sampled ones do.
#include <gtest/gtest.h>

#ifndef _WIN32

#include <algorithm>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "client_test_helpers.h"
#include "ort_test_helpers.h"
#include "test_data.h"
#include "tether/client.h"
#include "tether/multi_agent_client.h"
#include "tether/onnx_codec.h"
#include "tether/onnxruntime_backend.h"
#include "tether/recurrent_state.h"

namespace {

using fake::Conn;
using fake::FakeServer;
using fake::ServerScript;
using nlohmann::json;
using tether::ErrorCode;
using tether::RecurrentStateSpec;

// The vector of kind "carry": its model, state, episode and expectations.
struct Carry {
  json c;
  std::vector<std::uint8_t> model;
  std::vector<RecurrentStateSpec> state;
  std::size_t state_dim = 0;
  std::vector<std::vector<float>> observations;
};

std::vector<float> flat_floats(const json& value) {
  std::vector<float> out;
  if (value.is_array()) {
    for (const json& v : value) {
      std::vector<float> inner = flat_floats(v);
      out.insert(out.end(), inner.begin(), inner.end());
    }
  } else if (value.is_number()) {
    out.push_back(value.get<float>());
  }
  return out;
}

const Carry& carry() {
  static const Carry loaded = [] {
    Carry out;
    std::ifstream in(std::string(TETHER_CONFORMANCE_DIR) + "/recurrent.json", std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    json file = json::parse(text.str(), nullptr, false);
    if (!file.is_object()) return out;
    for (const json& c : file["cases"]) {
      if (c["kind"] != "carry") continue;
      out.c = c;
      out.model = tether::base64_decode(c["model_b64"].get<std::string>()).value();
      out.state = tether::recurrent_state_from_json(&c["recurrent_state"], "carry").value();
      out.state_dim = tether::recurrent_state_dim(out.state);
      for (const json& obs : c["observations"]) out.observations.push_back(flat_floats(obs));
      break;
    }
    return out;
  }();
  return loaded;
}

json recurrent_state_json(const std::vector<RecurrentStateSpec>& state) {
  json out = json::array();
  for (const RecurrentStateSpec& s : state) out.push_back({{"input", s.input}, {"output", s.output}, {"size", s.size}});
  return out;
}

// The state of a record's state_in, tensor after tensor in `state`'s order.
std::vector<float> state_in_of(const json& record, const std::vector<RecurrentStateSpec>& state) {
  std::vector<float> out;
  for (const RecurrentStateSpec& s : state) {
    std::vector<float> units = flat_floats(record["state_in"][s.input]);
    EXPECT_EQ(units.size(), s.size);
    out.insert(out.end(), units.begin(), units.end());
  }
  return out;
}

void expect_near(const std::vector<float>& got, const std::vector<float>& want, double tolerance, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tolerance) << what << "[" << i << "]";
}

tether::OnnxRuntimeBackend loaded_backend() {
  const Carry& k = carry();
  tether::OnnxRuntimeBackend backend;
  EXPECT_TRUE(backend.load(k.model.data(), k.model.size(), k.c["input"], k.c["output"]).ok());
  EXPECT_TRUE(backend.bind_recurrent_state(k.state).ok());
  return backend;
}

// One step of the bare model: (dist inputs, the state after it).
std::pair<std::vector<float>, std::vector<float>> step(tether::OnnxRuntimeBackend& backend, const std::vector<float>& obs,
                                                       const std::vector<float>& state) {
  std::vector<float> dist(2), after(state.size());
  EXPECT_TRUE(backend.run_recurrent(obs.data(), 1, obs.size(), state.data(), after.data(), state.size(), dist.data(), 2)
                  .ok());
  return {dist, after};
}

// A single-agent server of the carry model: Box[2] observations, Discrete(2).
json single_config(std::int64_t steps_per_sample, const std::vector<RecurrentStateSpec>& state) {
  return {{"type", "SET_CONFIG"},
          {"observation_space", {{"type", "Box"}, {"shape", {2}}, {"low", -1.0}, {"high", 1.0}}},
          {"action_space", {{"type", "Discrete"}, {"n", 2}}},
          {"onnx_input_names", {carry().c["input"]}},
          {"onnx_output_names", {carry().c["output"]}},
          {"recurrent_state", recurrent_state_json(state)},
          {"env_steps_per_sample", steps_per_sample},
          {"force_on_policy", true},
          {"heartbeat_interval_s", 0},
          {"protocol_version", "1.5"}};
}

json state_answer(std::int64_t seq, const std::vector<std::uint8_t>& model) {
  return {{"type", "SET_STATE"}, {"weights_seq_no", seq}, {"onnx_file", fake::onnx_file_of(model)}};
}

// Every batch answered with a new version of the same model (a hot-swap each time).
ServerScript single_script(std::int64_t steps_per_sample, std::vector<std::uint8_t> model = carry().model) {
  ServerScript script;
  script.full_config = single_config(steps_per_sample, carry().state);
  script.on_get_state = [model](Conn& conn, const tether::Message&, int) {
    conn.send(state_answer(0, model));
    return true;
  };
  script.on_batch = [model](Conn& conn, const tether::Message&, int n) {
    conn.send(state_answer(n, model));
    return true;
  };
  return script;
}

std::vector<json> every_sent_record(FakeServer& server) {
  std::vector<json> out;
  for (const json& batch : server.batches()) {
    for (const json& record : batch["episodes"]) out.push_back(record);
  }
  return out;
}

}  // namespace

// §16 kind "carry": the bare backend fed its state back, step by step from zeros.
TEST(OrtRecurrent, ConformanceCarryStepByStep) {
  const Carry& k = carry();
  ASSERT_FALSE(k.model.empty());
  tether::OnnxRuntimeBackend backend = loaded_backend();
  const double tolerance = k.c["tolerance"].get<double>();
  std::vector<float> state(k.state_dim, 0.0f);
  const std::size_t steps = k.c["dist_inputs"].size();
  ASSERT_EQ(steps, k.observations.size() - 1);
  for (std::size_t t = 0; t < steps; ++t) {
    auto [dist, after] = step(backend, k.observations[t], state);
    expect_near(dist, flat_floats(k.c["dist_inputs"][t]), tolerance, "dist_inputs");
    expect_near(after, flat_floats(k.c["state_after"][t]), tolerance, "state_after");
    state = after;
  }
}

// §16 kind "carry", records: the episode played by a TetherClient (its batch
// every cut_after steps) is cut into records whose state_in are the vector's,
// written by the SDK's own encoder; the dist inputs recorded are the vector's,
// across the hot-swap each batch's answer brings (the state is kept, §12.4).
TEST(OrtRecurrent, ConformanceCarryRecordsAndHotSwapKeepsTheState) {
  const Carry& k = carry();
  const std::int64_t cut_after = k.c["cut_after"].get<std::int64_t>();
  FakeServer server(single_script(cut_after));
  tether::ClientOptions options = fake::ort_options_for(server, 5);
  options.wait_for_weights = true;  // (each cut swaps the model in before the next step)
  auto connected = tether::TetherClient::connect(options);
  ASSERT_TRUE(connected.ok()) << connected.status().to_string();
  tether::TetherClient& client = *connected.value();
  const std::string episode = client.start_episode().value();
  EXPECT_TRUE(client.episode_state(episode).value().empty());  // (zeros: not made before the first step)
  std::vector<double> action;
  const std::size_t steps = k.c["dist_inputs"].size();
  for (std::size_t t = 0; t < steps; ++t) {
    ASSERT_TRUE(client.get_action(episode, k.observations[t], action).ok());
    expect_near(client.episode_state(episode).value(), flat_floats(k.c["state_after"][t]), 1e-5, "state");
  }
  ASSERT_TRUE(client.end_episode(episode, k.observations[steps]).ok());
  ASSERT_TRUE(client.flush().ok());
  EXPECT_GE(client.models_loaded(), 2);
  // Cut every cut_after steps: the vector's two records, then the rest of the
  // second (whose state_in is the state after the step before it).
  const std::vector<json> records = every_sent_record(server);
  ASSERT_EQ(records.size(), 3u);
  std::size_t t = 0;
  for (std::size_t r = 0; r < records.size(); ++r) {
    EXPECT_EQ(records[r]["actions"].size(), r < 2 ? static_cast<std::size_t>(cut_after) : steps - 2 * cut_after);
    const json& want = r < 2 ? k.c["records_state_in"][r] : k.c["state_after"][2 * cut_after - 1];
    expect_near(state_in_of(records[r], k.state), r < 2 ? state_in_of(json{{"state_in", want}}, k.state) : flat_floats(want),
                k.c["tolerance"], "state_in");
    for (const json& dist : records[r]["action_dist_inputs"]) {
      expect_near(flat_floats(dist), flat_floats(k.c["dist_inputs"][t++]), 1e-5, "recorded dist inputs");
    }
  }
  EXPECT_EQ(t, steps);
}

// A new episode starts from zeros; an unrecorded one advances its state too.
TEST(OrtRecurrent, EveryEpisodeStartsFromZerosAndAdvancesRecordedOrNot) {
  const Carry& k = carry();
  FakeServer server(single_script(100));
  auto connected = tether::TetherClient::connect(fake::ort_options_for(server, 5));
  ASSERT_TRUE(connected.ok()) << connected.status().to_string();
  tether::TetherClient& client = *connected.value();
  std::vector<double> action;
  for (bool training : {true, false, true}) {
    const std::string episode = client.start_episode("", training).value();
    for (std::size_t t = 0; t < 3; ++t) {
      ASSERT_TRUE(client.get_action(episode, k.observations[t], action).ok());
      expect_near(client.episode_state(episode).value(), flat_floats(k.c["state_after"][t]), 1e-5, "state");
    }
    ASSERT_TRUE(client.end_episode(episode, k.observations[3]).ok());
  }
  ASSERT_TRUE(client.flush().ok());
  const std::vector<json> records = every_sent_record(server);
  ASSERT_EQ(records.size(), 2u);
  for (const json& record : records) {
    expect_near(state_in_of(record, k.state), std::vector<float>(k.state_dim, 0.0f), 0.0, "state_in");
    expect_near(flat_floats(record["action_dist_inputs"][0]), flat_floats(k.c["dist_inputs"][0]), 1e-5, "first dist");
  }
}

// A cut that holds back the episode's last step (flush between two steps): the
// next chunk starts at that step, with the state that step was fed (§10.1).
TEST(OrtRecurrent, AContinuingChunkCarriesTheStateOfItsFirstStep) {
  const Carry& k = carry();
  FakeServer server(single_script(100));
  auto connected = tether::TetherClient::connect(fake::ort_options_for(server, 5));
  ASSERT_TRUE(connected.ok()) << connected.status().to_string();
  tether::TetherClient& client = *connected.value();
  std::vector<double> action;
  const std::string episode = client.start_episode().value();
  for (std::size_t t = 0; t < 3; ++t) ASSERT_TRUE(client.get_action(episode, k.observations[t], action).ok());
  ASSERT_TRUE(client.flush().ok());  // steps 0-1 go; step 2 waits for its next observation
  for (std::size_t t = 3; t < 5; ++t) ASSERT_TRUE(client.get_action(episode, k.observations[t], action).ok());
  ASSERT_TRUE(client.end_episode(episode, k.observations[5]).ok());
  ASSERT_TRUE(client.flush().ok());
  const std::vector<json> records = every_sent_record(server);
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[0]["actions"].size(), 2u);
  EXPECT_EQ(records[1]["actions"].size(), 3u);
  expect_near(state_in_of(records[0], k.state), std::vector<float>(k.state_dim, 0.0f), 0.0, "first state_in");
  expect_near(state_in_of(records[1], k.state), flat_floats(k.c["state_after"][1]), 1e-6, "continuing state_in");
}

// [1.6] A logged step is an evaluation too (§12.4): the vector's episode
// with every other step logged carries the vector's states, records its
// dist inputs (0 as a logged step's logp), and a chunk that starts at a
// logged step carries the state that step was fed.
TEST(OrtRecurrent, LogActionAdvancesTheStateAsGetActionDoes) {
  const Carry& k = carry();
  FakeServer server(single_script(100));
  auto connected = tether::TetherClient::connect(fake::ort_options_for(server, 5));
  ASSERT_TRUE(connected.ok()) << connected.status().to_string();
  tether::TetherClient& client = *connected.value();
  const std::string episode = client.start_episode().value();
  const std::size_t steps = k.c["dist_inputs"].size();
  std::vector<double> action;
  for (std::size_t t = 0; t < steps; ++t) {
    const tether::Status status = t % 2 == 1 ? client.log_action(episode, k.observations[t], std::vector<double>{1})
                                             : client.get_action(episode, k.observations[t], action);
    ASSERT_TRUE(status.ok()) << status.to_string();
    expect_near(client.episode_state(episode).value(), flat_floats(k.c["state_after"][t]), 1e-5, "state");
    if (t == 2) ASSERT_TRUE(client.flush().ok());  // steps 0-1 go; the next chunk starts at step 2
  }
  ASSERT_TRUE(client.end_episode(episode, k.observations[steps]).ok());
  ASSERT_TRUE(client.flush().ok());
  const std::vector<json> records = every_sent_record(server);
  ASSERT_EQ(records.size(), 2u);
  expect_near(state_in_of(records[1], k.state), flat_floats(k.c["state_after"][1]), 1e-6, "continuing state_in");
  std::size_t t = 0;
  for (const json& record : records) {
    for (std::size_t i = 0; i < record["actions"].size(); ++i, ++t) {
      expect_near(flat_floats(record["action_dist_inputs"][i]), flat_floats(k.c["dist_inputs"][t]), 1e-5, "dist");
      if (t % 2 == 1) {
        EXPECT_EQ(record["actions"][i], 1);
        EXPECT_EQ(record["action_logp"][i], 0.0);
      }
    }
  }
  EXPECT_EQ(t, steps);
  EXPECT_EQ(records[0]["logged_runs"], json({{1, 1}}));
  EXPECT_EQ(records[1]["logged_runs"][0], json({1, 1}));  // step 3, the second of this chunk
}

// Forwards everything but run_bytes(_recurrent) to ONNX Runtime: InferenceBackend's defaults run.
class DefaultBytesBackend final : public tether::InferenceBackend {
 public:
  tether::Status load(const std::uint8_t* model, std::size_t size, const std::string& input,
                      const std::string& output) override {
    return inner_.load(model, size, input, output);
  }
  tether::Status bind_recurrent_state(const std::vector<RecurrentStateSpec>& state) override {
    return inner_.bind_recurrent_state(state);
  }
  tether::Status run(const float* obs, std::size_t batch, std::size_t obs_dim, float* out,
                     std::size_t out_dim) override {
    return inner_.run(obs, batch, obs_dim, out, out_dim);
  }
  tether::Status run_recurrent(const float* obs, std::size_t batch, std::size_t obs_dim, const float* state_in,
                               float* state_out, std::size_t state_dim, float* out, std::size_t out_dim) override {
    return inner_.run_recurrent(obs, batch, obs_dim, state_in, state_out, state_dim, out, out_dim);
  }
  bool loaded() const noexcept override { return inner_.loaded(); }
  std::size_t obs_dim() const noexcept override { return inner_.obs_dim(); }
  std::size_t out_dim() const noexcept override { return inner_.out_dim(); }

 private:
  tether::OnnxRuntimeBackend inner_;
};

// [1.4] A model with memory given its observations as bytes: the backend
// (ONNX Runtime's, and the default run_bytes_recurrent of a backend that only has
// run_recurrent) computes what it does on their floats, and the client
// advances an episode's state, records and greedy actions alike.
TEST(OrtRecurrent, ObservationsGivenAsBytesAdvanceTheStateAsTheirFloatsDo) {
  const Carry& k = carry();
  const std::vector<std::vector<std::uint8_t>> rows = {{0, 1}, {2, 0}, {1, 1}, {0, 0}, {3, 1}};
  tether::OnnxRuntimeBackend ort = loaded_backend();
  DefaultBytesBackend fallback;
  ASSERT_TRUE(fallback.load(k.model.data(), k.model.size(), k.c["input"], k.c["output"]).ok());
  ASSERT_TRUE(fallback.bind_recurrent_state(k.state).ok());
  std::vector<float> state(k.state_dim, 0.0f);
  for (const std::vector<std::uint8_t>& row : rows) {
    const std::vector<float> floats(row.begin(), row.end());
    const auto [dist, after] = step(ort, floats, state);
    for (tether::InferenceBackend* backend : {static_cast<tether::InferenceBackend*>(&ort),
                                              static_cast<tether::InferenceBackend*>(&fallback)}) {
      std::vector<float> got_dist(2), got_after(state.size());
      ASSERT_TRUE(backend
                      ->run_bytes_recurrent(row.data(), 1, 2, state.data(), got_after.data(), state.size(),
                                            got_dist.data(), 2)
                      .ok());
      EXPECT_EQ(got_dist, dist);
      EXPECT_EQ(got_after, after);
    }
    state = after;
  }
  std::vector<float> dist(2);
  EXPECT_EQ(ort.run_bytes(rows[0].data(), 1, 2, dist.data(), 2).code(), ErrorCode::kInvalidArgument);  // (no state)
  std::vector<float> short_state(state.size() - 1);
  EXPECT_EQ(ort.run_bytes_recurrent(rows[0].data(), 1, 2, short_state.data(), short_state.data(), short_state.size(),
                                    dist.data(), 2)
                .code(),
            ErrorCode::kInvalidArgument);

  FakeServer server(single_script(100));
  auto connected = tether::TetherClient::connect(fake::ort_options_for(server, 5));
  ASSERT_TRUE(connected.ok()) << connected.status().to_string();
  tether::TetherClient& client = *connected.value();
  const std::string as_bytes = client.start_episode("bytes").value();
  const std::string as_floats = client.start_episode("floats").value();
  double action[1];
  for (const std::vector<std::uint8_t>& row : rows) {
    const std::vector<float> floats(row.begin(), row.end());
    ASSERT_TRUE(client.get_action(as_bytes, row.data(), 2, action, 1).ok());
    ASSERT_TRUE(client.get_action(as_floats, floats.data(), 2, action, 1).ok());
    EXPECT_EQ(client.episode_state(as_bytes).value(), client.episode_state(as_floats).value());
  }
  // compute_action on bytes: a recorded episode is refused (its state stays), an evaluation episode advances.
  const std::vector<float> before = client.episode_state(as_bytes).value();
  EXPECT_EQ(client.compute_action(rows[1].data(), 2, action, 1, as_bytes).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(client.episode_state(as_bytes).value(), before);
  // (one evaluation episode at a time: all of one, then all of the other)
  std::vector<double> greedy[2];
  for (int floats_too = 0; floats_too < 2; ++floats_too) {
    for (const std::vector<std::uint8_t>& row : rows) {
      const std::vector<float> floats(row.begin(), row.end());
      ASSERT_TRUE((floats_too ? client.compute_action(floats.data(), 2, action, 1, "eval-floats")
                              : client.compute_action(row.data(), 2, action, 1, "eval"))
                      .ok());
      greedy[floats_too].push_back(action[0]);
    }
  }
  EXPECT_EQ(greedy[0], greedy[1]);
}

// compute_action remembers per episode id: a running episode's state (one not
// recorded; a recorded one is refused), or an evaluation episode of its own
// from zeros (one at a time).
TEST(OrtRecurrent, ComputeActionRemembersPerEpisodeId) {
  const Carry& k = carry();
  tether::OnnxRuntimeBackend backend = loaded_backend();
  // An observation whose greedy action from zeros differs from the one after a prefix of the episode.
  const std::vector<float> zeros(k.state_dim, 0.0f);
  std::vector<float> probe;
  std::size_t prefix = 0;
  auto greedy = [](const std::vector<float>& dist) { return dist[1] > dist[0] ? 1.0 : 0.0; };
  // (observations are not checked against the box's bounds: the search may go beyond them)
  for (float a = -4.0f; a <= 4.0f && probe.empty(); a += 0.5f) {
    for (float b = -4.0f; b <= 4.0f && probe.empty(); b += 0.5f) {
      std::vector<float> state = zeros;
      for (std::size_t p = 0; p < 4 && probe.empty(); ++p) {
        state = step(backend, k.observations[p], state).second;
        if (greedy(step(backend, {a, b}, state).first) != greedy(step(backend, {a, b}, zeros).first)) {
          probe = {a, b};
          prefix = p + 1;
        }
      }
    }
  }
  ASSERT_FALSE(probe.empty()) << "no observation whose greedy action depends on the state";
  std::vector<float> state = zeros;
  for (std::size_t p = 0; p < prefix; ++p) state = step(backend, k.observations[p], state).second;
  const double with_memory = greedy(step(backend, probe, state).first);
  const double from_zeros = greedy(step(backend, probe, zeros).first);

  FakeServer server(single_script(100));
  auto connected = tether::TetherClient::connect(fake::ort_options_for(server, 5));
  ASSERT_TRUE(connected.ok()) << connected.status().to_string();
  tether::TetherClient& client = *connected.value();
  std::vector<double> action;
  for (std::size_t p = 0; p < prefix; ++p) ASSERT_TRUE(client.compute_action(k.observations[p], action, "e1").ok());
  ASSERT_TRUE(client.compute_action(probe, action, "e1").ok());
  EXPECT_EQ(action[0], with_memory);
  ASSERT_TRUE(client.compute_action(probe, action, "e2").ok());  // a new evaluation episode: zeros
  EXPECT_EQ(action[0], from_zeros);
  ASSERT_TRUE(client.compute_action(probe, action, "e1").ok());  // e1 was forgotten: zeros again
  EXPECT_EQ(action[0], from_zeros);
  // A running episode not recorded (training disabled): its state advanced by
  // compute_action as by get_action.
  const std::string episode = client.start_episode("", /*training_enabled=*/false).value();
  for (std::size_t p = 0; p < prefix; ++p) ASSERT_TRUE(client.compute_action(k.observations[p], action, episode).ok());
  expect_near(client.episode_state(episode).value(), state, 1e-5, "running episode's state");
  ASSERT_TRUE(client.compute_action(probe, action, episode).ok());
  EXPECT_EQ(action[0], with_memory);
  // The old signature: an evaluation episode "" of its own.
  ASSERT_TRUE(client.compute_action(probe, action).ok());
  EXPECT_EQ(action[0], from_zeros);
  // A running episode that is recorded is refused: its state stays as get_action left it.
  const std::string recorded = client.start_episode().value();
  ASSERT_TRUE(client.get_action(recorded, k.observations[0], action).ok());
  const std::vector<float> before = client.episode_state(recorded).value();
  const tether::Status refused = client.compute_action(probe, action, recorded);
  EXPECT_EQ(refused.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(refused.message().find(recorded), std::string::npos) << refused.message();
  EXPECT_NE(refused.message().find("get_action"), std::string::npos) << refused.message();
  expect_near(client.episode_state(recorded).value(), before, 0.0, "recorded episode's state");
}

// A reconnect whose SET_CONFIG announces another recurrent state: every state
// starts again from zeros, the steps not cut yet go (§12.4, §6.5).
TEST(OrtRecurrent, ReconnectWithAnotherStateResetsAndDropsUncutSteps) {
  const Carry& k = carry();
  std::vector<RecurrentStateSpec> reordered(k.state.rbegin(), k.state.rend());  // (c before h: another state)
  ServerScript script;
  script.config_of_connection = [reordered](int connection) {
    return single_config(3, connection == 1 ? carry().state : reordered);
  };
  script.on_get_state = [](Conn& conn, const tether::Message&, int) {
    conn.send(state_answer(0, carry().model));
    return true;
  };
  script.on_batch = [](Conn& conn, const tether::Message&, int n) {
    if (n == 1) return false;  // the first connection is lost with the first batch
    conn.send(state_answer(n, carry().model));
    return true;
  };
  FakeServer server(script);
  auto connected = tether::TetherClient::connect(fake::ort_options_for(server, 5));
  ASSERT_TRUE(connected.ok()) << connected.status().to_string();
  tether::TetherClient& client = *connected.value();
  std::vector<double> action;
  const std::string episode = client.start_episode().value();
  for (std::size_t t = 0; t < 4; ++t) ASSERT_TRUE(client.get_action(episode, k.observations[t], action).ok());
  // (the 4th step cut steps 0-2 and recorded step 3; the server is lost, the client reconnects)
  ASSERT_TRUE(fake::wait_for([&] {
    int states = 0;
    for (const json& m : server.messages()) states += m["type"] == "GET_STATE" ? 1 : 0;
    return states >= 2;
  }, 10.0));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ASSERT_TRUE(client.get_action(episode, k.observations[4], action).ok());
  EXPECT_EQ(client.recurrent_state(), reordered);
  // The state started again from zeros (in the new order, c then h: the same zeros).
  tether::OnnxRuntimeBackend reference;
  ASSERT_TRUE(reference.load(k.model.data(), k.model.size(), k.c["input"], k.c["output"]).ok());
  ASSERT_TRUE(reference.bind_recurrent_state(reordered).ok());
  std::vector<float> dist(2), after(k.state_dim);
  const std::vector<float> zeros(k.state_dim, 0.0f);
  ASSERT_TRUE(reference.run_recurrent(k.observations[4].data(), 1, 2, zeros.data(), after.data(), k.state_dim,
                                      dist.data(), 2).ok());
  expect_near(client.episode_state(episode).value(), after, 1e-5, "state after the reset");
  ASSERT_TRUE(client.end_episode(episode, k.observations[5]).ok());
  ASSERT_TRUE(client.flush().ok());
  std::vector<json> records;
  std::set<std::int64_t> seen;
  for (const json& batch : server.batches()) {
    if (!seen.insert(batch["batch_seq"].get<std::int64_t>()).second) continue;  // (the resend)
    for (const json& record : batch["episodes"]) records.push_back(record);
  }
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[0]["actions"].size(), 3u);
  // Step 3 (recorded before the client took the new connection) was dropped: the record starts at step 4.
  EXPECT_EQ(records[1]["actions"].size(), 1u);
  expect_near(flat_floats(records[1]["obs"][0]), k.observations[4], 0.0, "first observation");
  expect_near(state_in_of(records[1], reordered), zeros, 0.0, "state_in");
  expect_near(flat_floats(records[1]["action_dist_inputs"][0]), dist, 1e-5, "dist inputs from zeros");
}

// A model lacking an announced state input (or output) is refused: INVALID_FIELD (§12.1).
TEST(OrtRecurrent, AModelLackingAStateTensorIsRefused) {
  const Carry& k = carry();
  tether::OnnxRuntimeBackend backend;
  ASSERT_TRUE(backend.load(k.model.data(), k.model.size(), k.c["input"], k.c["output"]).ok());
  std::vector<RecurrentStateSpec> missing_input = k.state;
  missing_input[1].input = "state_in_x";
  EXPECT_EQ(backend.bind_recurrent_state(missing_input).code(), ErrorCode::kInvalidField);
  std::vector<RecurrentStateSpec> missing_output = k.state;
  missing_output[0].output = "state_out_x";
  EXPECT_EQ(backend.bind_recurrent_state(missing_output).code(), ErrorCode::kInvalidField);
  std::vector<RecurrentStateSpec> other_size = {{"state_in_h", "state_out_h", 4}, {"state_in_c", "state_out_c", 4}};
  EXPECT_EQ(backend.bind_recurrent_state(other_size).code(), ErrorCode::kInvalidField);

  // A client whose server announces a state its model lacks: the model is refused, nothing acts.
  ServerScript script = single_script(100);
  script.full_config = single_config(100, missing_input);
  FakeServer server(script);
  auto connected = tether::TetherClient::connect(fake::ort_options_for(server, 5));
  ASSERT_TRUE(connected.ok()) << connected.status().to_string();
  tether::TetherClient& client = *connected.value();
  tether::Result<std::string> started = client.start_episode();
  EXPECT_EQ(started.status().code(), ErrorCode::kInvalidField) << started.status().to_string();
  const std::string episode = client.start_episode().value();
  std::vector<double> action;
  EXPECT_EQ(client.get_action(episode, k.observations[0], action).code(), ErrorCode::kNotReady);
}

namespace {

// A multi-agent server: module "solo" (the carry model) for agents, module
// "team" (the same model) for the group "pair" of one member "m".
json memory_multi_config() {
  json box = {{"type", "Box"}, {"shape", {2}}, {"low", -1.0}, {"high", 1.0}};
  json module = {{"observation_space", box},
                 {"action_space", {{"type", "Discrete"}, {"n", 2}}},
                 {"onnx_input_names", {carry().c["input"]}},
                 {"onnx_output_names", {carry().c["output"]}},
                 {"trainable", true},
                 {"recurrent_state", recurrent_state_json(carry().state)}};
  json team = module;
  team["action_space"] = {{"type", "MultiDiscrete"}, {"nvec", {2}}};
  return {{"type", "SET_CONFIG"},
          {"env_steps_per_sample", 1000},
          {"force_on_policy", true},
          {"heartbeat_interval_s", 0},
          {"protocol_version", "1.5"},
          {"modules", {{"solo", module}, {"team", team}}},
          {"policy_mapping", {{{"pattern", "m"}, {"module", "team"}}, {{"pattern", "*"}, {"module", "solo"}}}},
          {"groups", {{"pair", {{"members", {"m"}}, {"reward", "sum"}}}}}};
}

ServerScript memory_multi_script() {
  ServerScript script;
  script.full_config = memory_multi_config();
  auto answer = [](Conn& conn, const json& request) {
    json held = request.contains("weights_seq_nos") ? request["weights_seq_nos"] : json::object();
    json models = json::object();
    for (const char* id : {"solo", "team"}) {
      if (!held.contains(id)) models[id] = {{"weights_seq_no", 0}, {"onnx_file", fake::onnx_file_of(carry().model)}};
    }
    conn.send({{"type", "SET_STATE"}, {"models", models}});
  };
  script.on_get_state = [answer](Conn& conn, const tether::Message& message, int) {
    answer(conn, message.body);
    return true;
  };
  script.on_batch = [answer](Conn& conn, const tether::Message& message, int) {
    if (message.type == tether::MessageType::kEpisodesAndGetState) answer(conn, message.body);
    return true;
  };
  return script;
}

}  // namespace

// Agents of one module evaluated in one batch, states stacked row by row; a
// group has one state; each starts from zeros; entries carry state_in.
TEST(OrtRecurrent, MultiAgentStatesPerAgentAndPerGroup) {
  const Carry& k = carry();
  FakeServer server(memory_multi_script());
  auto connected = tether::MultiAgentClient::connect(fake::ort_options_for(server, 5));
  ASSERT_TRUE(connected.ok()) << connected.status().to_string();
  tether::MultiAgentClient& client = *connected.value();
  tether::OnnxRuntimeBackend reference = loaded_backend();
  const std::string episode = client.start_episode().value();
  std::map<std::string, std::vector<float>> expected;  // per actor: the state after its last step
  std::map<std::string, std::vector<float>> first_dist;
  tether::AgentFrame frame;
  const std::size_t steps = k.c["dist_inputs"].size();
  std::map<std::string, std::vector<std::vector<float>>> before_steps;  // per actor: the state before each step
  for (std::size_t t = 0; t < steps; ++t) {
    if (t == 3) ASSERT_TRUE(client.flush().ok());  // (a cut mid-episode: each actor holds back its latest step)
    frame.clear();
    // a: the vector's episode; b: it backwards (another state in the same batch); m (group "pair") joins at step 1.
    const std::vector<float>& a = k.observations[t];
    const std::vector<float>& b = k.observations[steps - t];
    frame.add("a", a.data(), 2);
    frame.add("b", b.data(), 2);
    if (t >= 1) frame.add("m", b.data(), 2);
    ASSERT_TRUE(client.get_action(episode, frame).ok());
    for (const auto& [actor, obs] : std::vector<std::pair<std::string, std::vector<float>>>{{"a", a}, {"b", b}, {"pair", b}}) {
      if (actor == "pair" && t == 0) continue;
      auto it = expected.find(actor);
      const std::vector<float> before = it == expected.end() ? std::vector<float>(k.state_dim, 0.0f) : it->second;
      auto [dist, after] = step(reference, obs, before);
      if (it == expected.end()) first_dist[actor] = dist;
      before_steps[actor].push_back(before);
      expected[actor] = after;
      expect_near(client.actor_state(episode, actor).value(), after, 1e-5, actor.c_str());
    }
  }
  expect_near(expected["a"], flat_floats(k.c["state_after"][steps - 1]), 1e-5, "a's state: the vector's");
  EXPECT_EQ(client.actor_state(episode, "m").status().code(), ErrorCode::kInvalidArgument);  // (the group acts)
  // compute_actions on the running recorded episode is refused: no state advances.
  frame.clear();
  frame.add("a", k.observations[0].data(), 2);
  EXPECT_EQ(client.compute_actions(frame, episode).code(), ErrorCode::kInvalidArgument);
  expect_near(client.actor_state(episode, "a").value(), expected["a"], 0.0, "a's state after a refused compute_actions");
  frame.clear();
  ASSERT_TRUE(client.end_episode(episode).ok());
  ASSERT_TRUE(client.flush().ok());
  // Each entry's state_in is the state its first step was fed: zeros first, then the held-back step's.
  std::size_t entries = 0;
  std::map<std::string, std::size_t> steps_seen;
  for (const json& batch : server.batches()) {
    for (const json& record : batch["episodes"]) {
      for (const auto& [actor, entry] : record["agents"].items()) {
        ++entries;
        const std::size_t first = steps_seen[actor];
        ASSERT_LT(first, before_steps[actor].size());
        expect_near(state_in_of(entry, k.state), before_steps[actor][first], 1e-6, actor.c_str());
        if (first == 0) expect_near(flat_floats(entry["action_dist_inputs"][0]), first_dist[actor], 1e-5, actor.c_str());
        steps_seen[actor] += entry["actions"].size();
      }
    }
  }
  EXPECT_EQ(entries, 6u);  // (a, b and the pair: twice each)
  for (const auto& [actor, count] : steps_seen) EXPECT_EQ(count, before_steps[actor].size()) << actor;
  // compute_actions: an actor of the running episode... (ended) -> an evaluation episode from zeros.
  frame.clear();
  frame.add("a", k.observations[0].data(), 2);
  ASSERT_TRUE(client.compute_actions(frame, "eval-1").ok());
}

// [1.6] A logged agent's state advances in its module's batch, as a sampled one's (§12.4).
TEST(OrtRecurrent, ALoggedAgentsStateAdvancesInTheFramesBatch) {
  const Carry& k = carry();
  FakeServer server(memory_multi_script());
  auto connected = tether::MultiAgentClient::connect(fake::ort_options_for(server, 5));
  ASSERT_TRUE(connected.ok()) << connected.status().to_string();
  tether::MultiAgentClient& client = *connected.value();
  const std::string episode = client.start_episode().value();
  tether::AgentFrame frame;
  const double one = 1;
  const std::size_t steps = k.c["dist_inputs"].size();
  for (std::size_t t = 0; t < steps; ++t) {
    frame.clear();
    frame.add("a", k.observations[t].data(), 2);
    frame.add("b", k.observations[t].data(), 2);
    frame.log_action("a", &one, 1);
    ASSERT_TRUE(client.get_action(episode, frame).ok());
    EXPECT_EQ(frame.discrete_action(0), 1);
    expect_near(client.actor_state(episode, "a").value(), flat_floats(k.c["state_after"][t]), 1e-5, "logged a");
    expect_near(client.actor_state(episode, "b").value(), flat_floats(k.c["state_after"][t]), 1e-5, "sampled b");
  }
  ASSERT_TRUE(client.end_episode(episode).ok());
  ASSERT_TRUE(client.flush().ok());
  const std::vector<json> records = every_sent_record(server);
  ASSERT_EQ(records.size(), 1u);
  const json& a = records[0]["agents"]["a"];
  EXPECT_EQ(a["logged_runs"], json({{0, static_cast<int>(steps)}}));
  for (std::size_t t = 0; t < steps; ++t) {
    expect_near(flat_floats(a["action_dist_inputs"][t]), flat_floats(k.c["dist_inputs"][t]), 1e-5, "a's dist");
  }
  EXPECT_FALSE(records[0]["agents"]["b"].contains("logged_runs"));
}

#endif  // _WIN32
