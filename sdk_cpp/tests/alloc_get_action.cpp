// Nothing allocates per frame: counts the engine thread's heap allocations
// during TetherClient::get_action (and MultiAgentClient::get_action for a
// frame of many agents) in steady state, with the real ONNX Runtime
// backend and model, against the in-process fake server. Only the calls that
// hand a batch to the I/O thread (every env_steps_per_sample steps) or take in
// its answer may allocate. Global operator new/delete are replaced in this
// program only (so it is its own test binary).
#include <gtest/gtest.h>

#ifndef _WIN32

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "client_test_helpers.h"
#include "ort_test_helpers.h"
#include "test_data.h"
#include "tether/onnx_codec.h"
#include "tether/onnxruntime_backend.h"
#include "tether/recurrent_state.h"

namespace {

// Allocations made by this thread while counting is on.
thread_local bool counting = false;
thread_local long allocations = 0;

void* allocate(std::size_t size) {
  if (counting) ++allocations;
  void* p = std::malloc(size == 0 ? 1 : size);
  if (p == nullptr) std::abort();  // this test program has no use for bad_alloc
  return p;
}

void* allocate_aligned(std::size_t size, std::size_t alignment) {
  if (counting) ++allocations;
  void* p = nullptr;
  if (posix_memalign(&p, alignment < sizeof(void*) ? sizeof(void*) : alignment, size == 0 ? 1 : size) != 0) {
    std::abort();
  }
  return p;
}

}  // namespace

void* operator new(std::size_t size) { return allocate(size); }
void* operator new[](std::size_t size) { return allocate(size); }
void* operator new(std::size_t size, const std::nothrow_t&) noexcept { return allocate(size); }
void* operator new[](std::size_t size, const std::nothrow_t&) noexcept { return allocate(size); }
void* operator new(std::size_t size, std::align_val_t a) { return allocate_aligned(size, static_cast<std::size_t>(a)); }
void* operator new[](std::size_t size, std::align_val_t a) {
  return allocate_aligned(size, static_cast<std::size_t>(a));
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

namespace {

using nlohmann::json;

fake::ServerScript real_model_script(std::int64_t steps_per_sample) {
  const std::string& dir = test_data::kDir;
  std::vector<std::uint8_t> bytes = test_data::read_bytes(dir + "policy_4x64x64x2.onnx");
  std::ifstream in(dir + "policy_4x64x64x2.json");
  json names = json::parse(std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()),
                           nullptr, false);
  fake::ServerScript script;
  script.steps_per_sample = steps_per_sample;
  script.config_overrides = {{"onnx_input_names", {names["input_name"]}},
                             {"onnx_output_names", {names["output_name"]}}};
  script.model_file = [bytes](std::uint8_t) { return fake::onnx_file_of(bytes); };
  return script;
}

// ONNX Runtime's Run allocates inside the library (~25 times per run here): the
// SDK cannot change that, so the count pauses while the model runs and the
// runtime's own allocations are counted apart.
thread_local long backend_allocations = 0;

class PausingBackend final : public tether::InferenceBackend {
 public:
  tether::Status load(const std::uint8_t* model, std::size_t size, const std::string& input_name,
                      const std::string& output_name) override {
    return inner_.load(model, size, input_name, output_name);
  }
  tether::Status run(const float* obs, std::size_t batch, std::size_t obs_dim, float* out,
                     std::size_t out_dim) override {
    return counted_apart([&] { return inner_.run(obs, batch, obs_dim, out, out_dim); });
  }
  tether::Status bind_recurrent_state(const std::vector<tether::RecurrentStateSpec>& state) override {
    return inner_.bind_recurrent_state(state);
  }
  tether::Status run_recurrent(const float* obs, std::size_t batch, std::size_t obs_dim, const float* state_in,
                               float* state_out, std::size_t state_dim, float* out, std::size_t out_dim) override {
    return counted_apart(
        [&] { return inner_.run_recurrent(obs, batch, obs_dim, state_in, state_out, state_dim, out, out_dim); });
  }
  tether::Status run_bytes(const std::uint8_t* obs, std::size_t batch, std::size_t obs_dim, float* out,
                           std::size_t out_dim) override {
    return counted_apart([&] { return inner_.run_bytes(obs, batch, obs_dim, out, out_dim); });
  }
  tether::Status run_bytes_recurrent(const std::uint8_t* obs, std::size_t batch, std::size_t obs_dim,
                                     const float* state_in, float* state_out, std::size_t state_dim, float* out,
                                     std::size_t out_dim) override {
    return counted_apart([&] {
      return inner_.run_bytes_recurrent(obs, batch, obs_dim, state_in, state_out, state_dim, out, out_dim);
    });
  }
  bool loaded() const noexcept override { return inner_.loaded(); }
  std::size_t obs_dim() const noexcept override { return inner_.obs_dim(); }
  std::size_t out_dim() const noexcept override { return inner_.out_dim(); }

 private:
  // Runs `run`, its allocations counted into backend_allocations, not the caller's.
  template <class Run>
  static tether::Status counted_apart(Run run) {
    const bool was_counting = counting;
    const long before = allocations;
    counting = true;
    tether::Status status = run();
    if (was_counting) backend_allocations += allocations - before;
    allocations = before;
    counting = was_counting;
    return status;
  }

  tether::OnnxRuntimeBackend inner_;
};

// Options for a client of `server`: every step delivered, its runs paused in the count.
tether::ClientOptions counted_options(const fake::FakeServer& server) {
  tether::ClientOptions options;
  options.port = server.port();
  options.seed = 5;
  options.reconnect_timeout_s = 5.0;
  options.when_queue_full = tether::QueueFullPolicy::kWait;  // every step delivered
  options.backend_factory = [] { return std::make_unique<PausingBackend>(); };
  return options;
}

std::unique_ptr<tether::TetherClient> connect(const fake::FakeServer& server) {
  return fake::connect(counted_options(server));
}

struct Counts {
  long calls = 0;
  long calls_that_allocated = 0;
  long allocations = 0;
  long largest = 0;  // the most allocations in one call
};

// Makes `call` (one get_action, which must succeed), this thread's allocations
// in it counted into `counts` when `count`.
template <class Call>
void count_call(Counts& counts, bool count, Call call) {
  allocations = 0;
  counting = count;
  tether::Status status = call();
  counting = false;
  EXPECT_TRUE(status.ok()) << status.to_string();
  ++counts.calls;
  counts.allocations += allocations;
  if (allocations > 0) ++counts.calls_that_allocated;
  counts.largest = std::max(counts.largest, allocations);
}

// Plays episodes of `length` steps; counts allocations inside get_action only
// (start_episode / end_episode happen once per episode, not per frame). With
// `log_every_other`, every other step is logged (log_action) instead.
Counts play(tether::TetherClient& client, int episodes, int length, bool count, bool log_every_other = false) {
  Counts counts;
  float obs[4] = {0.1f, -0.2f, 0.05f, 0.3f};
  double action[1];
  for (int e = 0; e < episodes; ++e) {
    std::string episode = client.start_episode().value();
    for (int t = 0; t < length; ++t) {
      obs[0] = static_cast<float>(t % 7) * 0.1f;
      if (log_every_other && t % 2 == 1) {
        const double taken = static_cast<double>(t % 4 == 1);
        count_call(counts, count, [&] { return client.log_action(episode, obs, 4, &taken, 1); });
      } else {
        count_call(counts, count, [&] { return client.get_action(episode, obs, 4, action, 1); });
      }
      client.log_returns(episode, 1.0);
    }
    EXPECT_TRUE(client.end_episode(episode, obs, 4, false).ok());
  }
  return counts;
}

}  // namespace

TEST(Allocations, OnlyTheCallsThatHandOverABatchAllocate) {
  fake::FakeServer server(real_model_script(500));
  auto client = connect(server);
  ASSERT_NE(client, nullptr);
  play(*client, 10, 200, false);  // warm-up: ONNX Runtime's first runs, episode arrays grown
  const std::int64_t sent_before = client->env_steps_sent();
  Counts counts = play(*client, 50, 200, true);  // 10,000 steps: 20 batches of 500
  ASSERT_TRUE(client->flush().ok());
  const long batches = static_cast<long>((client->env_steps_sent() - sent_before) / 500);
  std::printf("get_action: %ld calls, %ld allocated (%ld allocations, at most %ld in one call); %ld batches; "
              "ONNX Runtime's Run itself allocated %ld times\n", counts.calls, counts.calls_that_allocated,
              counts.allocations, counts.largest, batches, backend_allocations);
  EXPECT_EQ(client->env_steps_sent(), 60 * 200);  // every step delivered
  EXPECT_GE(batches, 19);
  // A call allocates only when it cuts a batch, or takes in the answer to one.
  EXPECT_LE(counts.calls_that_allocated, 2 * batches + 2);
}

// [1.6] log_action allocates no more than get_action: steps logged and sampled
// alternately allocate only in the calls that cut a batch.
TEST(Allocations, LoggedStepsAllocateOnlyWhenTheyCut) {
  fake::FakeServer server(real_model_script(500));
  auto client = connect(server);
  ASSERT_NE(client, nullptr);
  play(*client, 10, 200, false, true);
  const std::int64_t sent_before = client->env_steps_sent();
  Counts counts = play(*client, 50, 200, true, true);
  ASSERT_TRUE(client->flush().ok());
  const long batches = static_cast<long>((client->env_steps_sent() - sent_before) / 500);
  std::printf("get_action and log_action: %ld calls, %ld allocated; %ld batches\n", counts.calls,
              counts.calls_that_allocated, batches);
  EXPECT_EQ(client->env_steps_sent(), 60 * 200);
  EXPECT_GE(batches, 19);
  EXPECT_LE(counts.calls_that_allocated, 2 * batches + 2);
}

// [1.5] A model with memory (the LSTM of tests/conformance/recurrent.json, kind
// "carry"): the state is fed and kept per episode without allocating either.
TEST(Allocations, AModelWithMemoryAllocatesOnlyWhenItCuts) {
  std::ifstream in(std::string(TETHER_CONFORMANCE_DIR) + "/recurrent.json", std::ios::binary);
  json file = json::parse(std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()),
                          nullptr, false);
  json carry;
  for (const json& c : file["cases"]) {
    if (c["kind"] == "carry") carry = c;
  }
  ASSERT_TRUE(carry.is_object());
  std::vector<std::uint8_t> bytes = tether::base64_decode(carry["model_b64"].get<std::string>()).value();
  fake::ServerScript script;
  script.steps_per_sample = 500;
  script.config_overrides = {{"observation_space", {{"type", "Box"}, {"shape", {2}}, {"low", -1.0}, {"high", 1.0}}},
                             {"onnx_input_names", {carry["input"]}},
                             {"onnx_output_names", {carry["output"]}},
                             {"recurrent_state", carry["recurrent_state"]}};
  script.model_file = [bytes](std::uint8_t) { return fake::onnx_file_of(bytes); };
  fake::FakeServer server(script);
  auto client = connect(server);
  ASSERT_NE(client, nullptr);
  auto play_lstm = [&](int episodes, int length, bool count) {
    Counts counts;
    float obs[2] = {0.1f, -0.2f};
    double action[1];
    for (int e = 0; e < episodes; ++e) {
      std::string episode = client->start_episode().value();
      for (int t = 0; t < length; ++t) {
        obs[0] = static_cast<float>(t % 7) * 0.1f;
        count_call(counts, count, [&] { return client->get_action(episode, obs, 2, action, 1); });
        client->log_returns(episode, 1.0);
      }
      EXPECT_TRUE(client->end_episode(episode, obs, 2, false).ok());
    }
    return counts;
  };
  play_lstm(10, 200, false);
  const std::int64_t sent_before = client->env_steps_sent();
  Counts counts = play_lstm(50, 200, true);
  ASSERT_TRUE(client->flush().ok());
  const long batches = static_cast<long>((client->env_steps_sent() - sent_before) / 500);
  std::printf("get_action with memory: %ld calls, %ld allocated; %ld batches\n", counts.calls,
              counts.calls_that_allocated, batches);
  EXPECT_GE(batches, 19);
  EXPECT_LE(counts.calls_that_allocated, 2 * batches + 2);
}

// [1.4] Images given as bytes (a byte box, the model's input uint8): fed and
// recorded without allocating, as floats are.
TEST(Allocations, ImagesGivenAsBytesAllocateOnlyWhenTheyCut) {
  const test_data::PolicyRecord m = test_data::read_policy_record("policy_bytes_2x3x1.json");
  ASSERT_FALSE(m.model.empty());
  fake::ServerScript script;
  script.steps_per_sample = 500;
  script.config_overrides = {
      {"observation_space",
       {{"type", "Box"}, {"shape", m.record["input_shape"]}, {"dtype", "uint8"}, {"low", 0}, {"high", 255}}},
      {"onnx_input_names", {m.input_name}},
      {"onnx_output_names", {m.output_name}}};
  const std::vector<std::uint8_t> model = m.model;
  script.model_file = [model](std::uint8_t) { return fake::onnx_file_of(model); };
  fake::FakeServer server(script);
  auto client = connect(server);
  ASSERT_NE(client, nullptr);
  const std::vector<std::uint8_t> images(m.obs.begin(), m.obs.end());
  double action[1];
  auto play_bytes = [&](int episodes, bool count) {
    Counts counts;
    for (int e = 0; e < episodes; ++e) {
      std::string episode = client->start_episode().value();
      for (int t = 0; t < 200; ++t) {
        const std::uint8_t* image = &images[(static_cast<std::size_t>(t) % m.rows) * m.obs_dim];
        if (t % 4 == 3) {
          const double taken = 1.0;
          count_call(counts, count, [&] { return client->log_action(episode, image, m.obs_dim, &taken, 1); });
        } else {
          count_call(counts, count, [&] { return client->get_action(episode, image, m.obs_dim, action, 1); });
        }
        client->log_returns(episode, 1.0);
      }
      EXPECT_TRUE(client->end_episode(episode, images.data(), m.obs_dim, false).ok());
    }
    return counts;
  };
  play_bytes(10, false);
  const std::int64_t sent_before = client->env_steps_sent();
  Counts counts = play_bytes(50, true);
  ASSERT_TRUE(client->flush().ok());
  const long batches = static_cast<long>((client->env_steps_sent() - sent_before) / 500);
  std::printf("images as bytes: %ld calls, %ld allocated; %ld batches\n", counts.calls, counts.calls_that_allocated,
              batches);
  EXPECT_EQ(client->env_steps_sent(), 60 * 200);
  EXPECT_GE(batches, 19);
  EXPECT_LE(counts.calls_that_allocated, 2 * batches + 2);
}

TEST(Allocations, OntoAnEpisodeThatOutlivesBatchesNothingGrows) {
  fake::FakeServer server(real_model_script(500));
  auto client = connect(server);
  ASSERT_NE(client, nullptr);
  play(*client, 1, 3000, false);
  Counts counts = play(*client, 1, 10000, true);  // one long episode, cut every 500 steps
  ASSERT_TRUE(client->flush().ok());
  std::printf("long episode: %ld calls, %ld allocated\n", counts.calls, counts.calls_that_allocated);
  EXPECT_LE(counts.calls_that_allocated, 2 * (10000 / 500) + 2);
}

// Held-back episodes (record_share 0.5, §13.2) act as recorded ones do: only
// the calls that cut a batch (every 500 steps played, held back or not) allocate.
TEST(Allocations, HeldBackEpisodesAllocateOnlyWhenTheyCut) {
  fake::ServerScript script = real_model_script(500);
  const std::string model = script.model_file(0);
  auto answer = [model](fake::Conn& conn) {  // version 0 again: nothing to load
    conn.send({{"type", "SET_STATE"}, {"weights_seq_no", 0}, {"onnx_file", model}, {"record_share", 0.5}});
  };
  script.on_get_state = [answer](fake::Conn& conn, const tether::Message&, int) {
    answer(conn);
    return true;
  };
  script.on_batch = [answer](fake::Conn& conn, const tether::Message&, int) {
    answer(conn);
    return true;
  };
  fake::FakeServer server(script);
  auto client = connect(server);
  ASSERT_NE(client, nullptr);
  play(*client, 10, 200, false);
  ASSERT_TRUE(client->flush().ok());  // (the warm-up's batches all arrived: none is counted below)
  const std::size_t batches_before = server.batches().size();
  Counts counts = play(*client, 50, 200, true);  // 10,000 steps played: 20 batches
  ASSERT_TRUE(client->flush().ok());
  const long batches = static_cast<long>(server.batches().size() - batches_before);
  std::printf("held back: %ld calls, %ld allocated; %ld batches; %llu of 60 episodes held back\n", counts.calls,
              counts.calls_that_allocated, batches, static_cast<unsigned long long>(client->episodes_held_back()));
  EXPECT_GE(client->episodes_held_back(), 15u);
  EXPECT_LE(client->episodes_held_back(), 45u);
  EXPECT_GE(batches, 19);
  EXPECT_LE(batches, 21);
  EXPECT_LE(counts.calls_that_allocated, 2 * batches + 2);
}

namespace {

// Makes the server answer GET_STATE, and every batch that asks for the state, with `state`.
void answer_state(fake::ServerScript& script, const json& state) {
  script.on_get_state = [state](fake::Conn& conn, const tether::Message&, int) {
    conn.send(state);
    return true;
  };
  script.on_batch = [state](fake::Conn& conn, const tether::Message& message, int) {
    if (message.type == tether::MessageType::kEpisodesAndGetState) conn.send(state);
    return true;
  };
}

// A multi-agent server: one module that every agent maps to, the real model.
fake::ServerScript multi_agent_script(std::int64_t steps_per_sample) {
  fake::ServerScript script = real_model_script(steps_per_sample);
  const json names = script.config_overrides;
  const std::string model = script.model_file(0);
  script.config_overrides = json::object();
  json module = fake::module_json(4);
  module["onnx_input_names"] = names["onnx_input_names"];
  module["onnx_output_names"] = names["onnx_output_names"];
  json config = fake::multi_agent_config(steps_per_sample, {{"m", module}},
                                         json::array({{{"pattern", "*"}, {"module", "m"}}}));
  config["force_on_policy"] = false;
  script.full_config = config;
  answer_state(script, {{"type", "SET_STATE"}, {"models", {{"m", {{"weights_seq_no", 0}, {"onnx_file", model}}}}}});
  return script;
}

// The ids agent_0 .. agent_{n-1}.
std::vector<std::string> agent_ids(int n) {
  std::vector<std::string> ids;
  for (int a = 0; a < n; ++a) ids.push_back("agent_" + std::to_string(a));
  return ids;
}

// Fills `frame` with frame `t` of every agent in `ids`, starting from ids[first]
// (and wrapping round): agent a's observation is ((t + a + k) % 7) / 10 for k < 4.
void fill_frame(tether::AgentFrame& frame, const std::vector<std::string>& ids, int t, std::size_t first = 0) {
  frame.clear();
  for (std::size_t k = 0; k < ids.size(); ++k) {
    const std::size_t a = (k + first) % ids.size();
    float* obs = frame.add_uninitialized(ids[a], 4);
    for (int j = 0; j < 4; ++j) obs[j] = static_cast<float>((t + static_cast<int>(a) + j) % 7) * 0.1f;
  }
}

// A multi-agent client of `server` (every step delivered), its runs paused in the count.
std::unique_ptr<tether::MultiAgentClient> connect_multi_agent(const fake::FakeServer& server) {
  return fake::connect_multi(counted_options(server));
}

// `agents` agents acting together, frame after frame, through a multi-agent
// client of a multi_agent_script server (a batch every `steps_per_sample` agent steps).
struct MultiAgentRun {
  MultiAgentRun(int agents, std::int64_t steps_per_sample)
      : server(multi_agent_script(steps_per_sample)), client(connect_multi_agent(server)), ids(agent_ids(agents)) {}

  // Frame `t` of every agent (fill_frame's), its get_action counted into
  // `counts` when `count`; then each agent is rewarded 1. With `logged`, every
  // fourth agent's action is logged (AgentFrame::log_action).
  void act(const std::string& episode, int t, Counts& counts, bool count, bool logged = false) {
    fill_frame(frame, ids, t);
    for (std::size_t a = 0; logged && a < ids.size(); a += 4) {
      const double taken = static_cast<double>((t + static_cast<int>(a)) % 2);
      frame.log_action(ids[a], &taken, 1);
    }
    count_call(counts, count, [&] { return client->get_action(episode, frame); });
    for (const std::string& id : ids) client->log_returns(episode, id, 1.0);
  }

  fake::FakeServer server;
  std::unique_ptr<tether::MultiAgentClient> client;  // null when it did not connect
  std::vector<std::string> ids;
  tether::AgentFrame frame;
};

}  // namespace

TEST(Allocations, AMultiAgentFrameAllocatesOnlyWhenItCuts) {
  constexpr int kAgents = 64;
  constexpr int kStepsPerSample = 32 * kAgents;  // a cut every 32 frames
  MultiAgentRun run(kAgents, kStepsPerSample);
  ASSERT_NE(run.client, nullptr);
  tether::MultiAgentClient& client = *run.client;
  auto play = [&](int frames, bool count) {
    Counts counts;
    std::string episode = client.start_episode().value();
    for (int t = 0; t < frames; ++t) run.act(episode, t, counts, count);
    EXPECT_TRUE(client.end_episode(episode).ok());
    return counts;
  };
  play(200, false);  // warm-up: ONNX Runtime's first runs, arrays and spare blocks grown
  ASSERT_TRUE(client.flush().ok());
  const std::int64_t sent_before = client.agent_steps_sent();
  Counts counts = play(640, true);
  ASSERT_TRUE(client.flush().ok());
  const long batches = static_cast<long>((client.agent_steps_sent() - sent_before) / kStepsPerSample);
  std::printf("multi-agent get_action (%d agents): %ld calls, %ld allocated (%ld allocations, at most %ld in one "
              "call); %ld batches\n", kAgents, counts.calls, counts.calls_that_allocated, counts.allocations,
              counts.largest, batches);
  EXPECT_EQ(client.agent_steps_sent() - sent_before, 640 * kAgents);  // every step delivered
  EXPECT_GE(batches, 19);
  EXPECT_LE(counts.calls_that_allocated, 2 * batches + 2);
}

// [1.6] Frames in which some agents' actions are logged allocate only when they cut too.
TEST(Allocations, AMultiAgentFrameWithLoggedActionsAllocatesOnlyWhenItCuts) {
  constexpr int kAgents = 64;
  constexpr int kStepsPerSample = 32 * kAgents;
  MultiAgentRun run(kAgents, kStepsPerSample);
  ASSERT_NE(run.client, nullptr);
  tether::MultiAgentClient& client = *run.client;
  auto play = [&](int frames, bool count) {
    Counts counts;
    std::string episode = client.start_episode().value();
    for (int t = 0; t < frames; ++t) run.act(episode, t, counts, count, /*logged=*/true);
    EXPECT_TRUE(client.end_episode(episode).ok());
    return counts;
  };
  play(200, false);
  ASSERT_TRUE(client.flush().ok());
  const std::int64_t sent_before = client.agent_steps_sent();
  Counts counts = play(640, true);
  ASSERT_TRUE(client.flush().ok());
  const long batches = static_cast<long>((client.agent_steps_sent() - sent_before) / kStepsPerSample);
  std::printf("multi-agent frames with logged actions: %ld calls, %ld allocated (%ld allocations); %ld batches\n",
              counts.calls, counts.calls_that_allocated, counts.allocations, batches);
  EXPECT_EQ(client.agent_steps_sent() - sent_before, 640 * kAgents);
  EXPECT_GE(batches, 19);
  EXPECT_LE(counts.calls_that_allocated, 2 * batches + 2);
}

// A cut hands the recorded rows to the I/O thread without building a record
// per agent: the calls that cut allocate a few times, however many agents act
// (at most a few more per frame cut while earlier batches still hold theirs).
TEST(Allocations, AMultiAgentCutAllocatesAFewTimesWhateverTheAgents) {
  constexpr int kAgents = 256;
  constexpr int kStepsPerSample = 4 * kAgents;  // a cut every 4 frames
  MultiAgentRun run(kAgents, kStepsPerSample);
  ASSERT_NE(run.client, nullptr);
  const std::string episode = run.client->start_episode().value();
  Counts counts;
  for (int t = 0; t < 520; ++t) run.act(episode, t, counts, t >= 200);  // (200 frames of warm-up)
  ASSERT_TRUE(run.client->flush().ok());
  std::printf("a cut of %d agents: %ld of %ld calls allocated, at most %ld allocations in one\n", kAgents,
              counts.calls_that_allocated, counts.calls - 200, counts.largest);
  EXPECT_LE(counts.calls_that_allocated, 2 * (320 / 4) + 2);
  EXPECT_LE(counts.largest, 64);  // (a record built here took several per agent)
}

TEST(Allocations, TwoModulesOfDifferentSizesAllocateOnlyWhenTheyCut) {
  constexpr int kAgents = 64;
  constexpr int kStepsPerSample = 32 * (kAgents + 1);
  fake::ServerScript script = multi_agent_script(kStepsPerSample);
  json config = *script.full_config;
  config["modules"]["n"] = config["modules"]["m"];
  config["policy_mapping"] = json::array({{{"pattern", "solo"}, {"module", "n"}}, {{"pattern", "*"}, {"module", "m"}}});
  script.full_config = config;
  const std::string model = script.model_file(0);
  answer_state(script, {{"type", "SET_STATE"}, {"models", {{"m", {{"weights_seq_no", 0}, {"onnx_file", model}}}, {"n", {{"weights_seq_no", 0}, {"onnx_file", model}}}}}});
  fake::FakeServer server(script);
  auto connected = connect_multi_agent(server);
  ASSERT_NE(connected, nullptr);
  tether::MultiAgentClient& client = *connected;
  std::vector<std::string> ids = agent_ids(kAgents);
  ids.push_back("solo");
  tether::AgentFrame frame;
  auto play = [&](int frames, bool count) {
    Counts counts;
    std::string episode = client.start_episode().value();
    for (int t = 0; t < frames; ++t) {
      fill_frame(frame, ids, t, t % 2 == 1 ? ids.size() - 1 : 0);  // solo first on odd frames: the modules' order changes
      count_call(counts, count, [&] { return client.get_action(episode, frame); });
    }
    EXPECT_TRUE(client.end_episode(episode).ok());
    return counts;
  };
  play(200, false);
  ASSERT_TRUE(client.flush().ok());
  Counts counts = play(640, true);
  ASSERT_TRUE(client.flush().ok());
  std::printf("two modules: %ld calls, %ld allocated (%ld allocations)\n", counts.calls, counts.calls_that_allocated, counts.allocations);
  EXPECT_LE(counts.calls_that_allocated, 2 * (640 / 32) + 2);
}

#endif  // _WIN32
