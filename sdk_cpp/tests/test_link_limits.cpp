// The link's limits against whatever numbers a server sends: the send
// queue's step limit, (max_staleness + 1) * train_batch_size or
// 2 * env_steps_per_sample, saturates instead of overflowing (a wrapped limit
// of 0 would drop every waiting batch), and a tiny heartbeat_interval_s is
// clamped to 100 ms instead of pinging in a tight loop.
#include <gtest/gtest.h>

#ifndef _WIN32

#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <thread>

#include "fake_backend.h"
#include "fake_server.h"
#include "tether/server_link.h"

namespace {

using fake::Conn;
using fake::FakeServer;
using fake::ServerScript;

tether::LinkOptions link_options_for(const FakeServer& server) {
  tether::LinkOptions options;
  options.port = server.port();
  options.reconnect_timeout_s = 5.0;
  options.response_timeout_s = 5.0;
  options.update_timeout_s = 5.0;
  options.backend_factory = [] { return std::make_unique<fake::Backend>(); };
  return options;
}

// One step of episode `id` (Box(4) observations, Discrete(2) actions).
std::shared_ptr<tether::Batch> one_step(const std::string& id) {
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

bool wait_for(const std::function<bool()>& condition, double seconds) {
  const auto deadline = fake::Clock::now() + std::chrono::milliseconds(static_cast<int>(seconds * 1000));
  while (fake::Clock::now() < deadline) {
    if (condition()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return condition();
}

}  // namespace

TEST(LinkLimits, HugeQueueNumbersFromTheServerSaturate) {
  ServerScript script;
  // (3 + 1) * 2^62 wraps to 0 in 64 bits.
  script.config_overrides = {{"train_batch_size", std::int64_t{1} << 62}, {"max_staleness", 3}};
  script.on_batch = [](Conn&, const tether::Message&, int) { return true; };  // batch 1 stays in flight
  FakeServer server(script);
  tether::ServerLink link(link_options_for(server));
  ASSERT_TRUE(link.start().ok());
  link.submit(one_step("a"));
  ASSERT_TRUE(wait_for([&] { return server.batches().size() == 1; }, 5.0));
  link.submit(one_step("b"));  // waits behind the batch in flight
  EXPECT_TRUE(link.has_room(1));
  link.submit(one_step("c"));
  EXPECT_EQ(link.batches_dropped(), 0);
}

TEST(LinkLimits, HugeStepsPerSampleSaturates) {
  ServerScript script;
  script.steps_per_sample = std::numeric_limits<std::int64_t>::max();  // 2 * it overflows
  FakeServer server(script);
  tether::ServerLink link(link_options_for(server));
  ASSERT_TRUE(link.start().ok());
  EXPECT_TRUE(link.has_room(1000));
}

TEST(LinkLimits, TinyHeartbeatIntervalIsClampedTo100Ms) {
  ServerScript script;
  script.heartbeat_interval_s = 1e-6;
  FakeServer server(script);
  tether::ServerLink link(link_options_for(server));
  ASSERT_TRUE(link.start().ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  // 500 ms at one PING per 100 ms (plus the handshake's); unclamped it is thousands.
  EXPECT_LE(server.pings(), 8);
  EXPECT_LE(link.heartbeats_sent(), 7);
}

#endif  // _WIN32
