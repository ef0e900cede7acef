// The link's limits against whatever numbers a server sends: the send
// queue's step limit, (max_staleness + 1) * train_batch_size or
// 2 * env_steps_per_sample, saturates instead of overflowing (a wrapped limit
// of 0 would drop every waiting batch), and a tiny heartbeat_interval_s is
// clamped to 100 ms instead of pinging in a tight loop.
#include <gtest/gtest.h>

#ifndef _WIN32

#include <chrono>
#include <cstdint>
#include <limits>
#include <thread>

#include "client_test_helpers.h"

namespace {

using namespace fake;  // (the fake server and the helpers of client_test_helpers.h)

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
