// [1.9] Servers in a group (§6.7): a rank's PONG names every rank's address
// (ranks) and may ask the client to move to another rank (redirect). The
// client follows a redirect at once (its PING there says "redirected"), comes
// back when the rank named cannot be reached, ignores a redirect on a
// connection made on one, and after losing its rank tries the others it
// learned of, resending the batch in flight with its client_session and
// batch_seq. Fake ranks on loopback ports; the pure rules themselves are
// pinned by rank_addresses.json (test_conformance.cpp) and, at their edges, here.
#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tether/session.h"

namespace {

using nlohmann::json;
using tether::Address;

// -- the rules at their edges (as the Python SDK's protocol/connection.py reads them) ---------

TEST(RankGroup, AddressesReadAsThePythonSdkReadsThem) {
  using tether::parse_address;
  EXPECT_EQ(parse_address("h:00080"), (Address{"h", 80}));  // 5 digits, leading zeros
  EXPECT_FALSE(parse_address("h:000080"));        // 6
  EXPECT_FALSE(parse_address("h:"));
  EXPECT_EQ(parse_address("[::1]:1"), (Address{"::1", 1}));
  EXPECT_FALSE(parse_address("[a]:1"));          // brackets hold an IPv6 address
  EXPECT_FALSE(parse_address("[fd00::5]]:1"));
  EXPECT_FALSE(parse_address("[[::1]:1"));
  EXPECT_FALSE(parse_address("h:1:2"));
  EXPECT_FALSE(parse_address(json::array({"h", 1})));
  // Unicode's whitespace (str.isspace) is none in a host; a zero-width space is no whitespace.
  for (const char* spaced :
       {"a\t:1", "a\x1c:1", "a\xc2\x85:1", "a\xc2\xa0:1", "a\xe3\x80\x80" "b:1", "a\xe2\x80\xa8:1"}) {
    EXPECT_FALSE(parse_address(spaced)) << spaced;
  }
  EXPECT_EQ(parse_address("a\xe2\x80\x8b" "b:1"), (Address{"a\xe2\x80\x8b" "b", 1}));
  // At most 300 code points (not bytes).
  EXPECT_EQ(parse_address(std::string(296, 'x') + ":123"), (Address{std::string(296, 'x'), 123}));
  EXPECT_FALSE(parse_address(std::string(297, 'x') + ":123"));
  std::string accented;
  for (int i = 0; i < 200; ++i) accented += "\xc3\xa9";  // 200 code points in 400 bytes
  EXPECT_EQ(parse_address(accented + ":1"), (Address{accented, 1}));
}

TEST(RankGroup, AddressesAreWrittenWithIpv6InBrackets) {
  EXPECT_EQ(tether::format_address(Address{"fd00::5", 9100}), "[fd00::5]:9100");
  EXPECT_EQ(tether::format_address(Address{"trainer-0", 1}), "trainer-0:1");
  EXPECT_EQ(tether::parse_address(tether::format_address(Address{"::1", 65535})), (Address{"::1", 65535}));
}

TEST(RankGroup, APongIsReadForItsFirst1024Ranks) {
  json ranks = json::array();
  for (int port = 1; port < 2000; ++port) ranks.push_back("h:" + std::to_string(port));
  const std::vector<Address> read = tether::rank_addresses(json{{"type", "PONG"}, {"ranks", ranks}});
  ASSERT_EQ(read.size(), 1024u);
  EXPECT_EQ(read.back(), (Address{"h", 1024}));
  EXPECT_TRUE(tether::rank_addresses(json::array()).empty());  // (not an object: names none)
  EXPECT_FALSE(tether::redirect_of(json{{"redirect", nullptr}}, Address{"h", 1}, false));
}

}  // namespace

#ifndef _WIN32

#include <atomic>
#include <memory>

#include "client_test_helpers.h"

namespace {

using namespace fake;  // (the fake server, its answers and the helpers of client_test_helpers.h)

// The ports of the fake ranks, known once they listen (their scripts are made before).
struct GroupPorts {
  std::atomic<std::uint16_t> a{0};
  std::atomic<std::uint16_t> b{0};
  std::atomic<std::uint16_t> elsewhere{0};  // an extra rank's (none: 0)

  std::vector<std::uint16_t> all() const {
    std::vector<std::uint16_t> ports = {a.load(), b.load()};
    if (elsewhere.load() != 0) ports.push_back(elsewhere.load());
    return ports;
  }
};

// Whether a PING says its connection was made on a redirect.
bool says_redirected(const json& ping) {
  const auto it = ping.find("redirected");
  return it != ping.end() && *it == true;
}

// A fake rank: its PONG (1.9) names the group's ranks, and asks to move to
// the port `redirect` gives for the PING (0: stays).
ServerScript rank_script(std::shared_ptr<GroupPorts> ports, std::function<std::uint16_t(const json& ping)> redirect) {
  ServerScript script;
  script.on_ping = [ports, redirect](Conn& conn, const tether::Message& ping) {
    json pong = {{"type", "PONG"}, {"protocol_version", "1.9"}, {"server", "fake"}, {"run_id", "the-group's-run"}};
    pong["ranks"] = json::array();
    for (std::uint16_t port : ports->all()) pong["ranks"].push_back(loopback_address(port));
    const std::uint16_t to = redirect ? redirect(ping.body) : 0;
    if (to != 0) pong["redirect"] = loopback_address(to);
    conn.send(pong);
    return true;
  };
  return script;
}

// The types of the messages a fake rank received, in order.
std::vector<std::string> types_received(FakeServer& server) {
  std::vector<std::string> types;
  for (const json& message : server.messages()) types.push_back(message.value("type", std::string()));
  return types;
}

// A client plays one episode of 25 steps (a batch of 20 and the rest) and flushes.
void play_an_episode(tether::TetherClient& client) {
  ASSERT_TRUE(client.start_episode("e").ok());
  ASSERT_NO_FATAL_FAILURE(act(client, "e", 25, 1.0));
  ASSERT_NO_FATAL_FAILURE(end(client, "e", 25.0));
  const tether::Status flushed = client.flush();
  ASSERT_TRUE(flushed.ok()) << flushed.to_string();
}

// (a) A's PONG names ranks [A, B] and redirects to B: the client moves to B
// before anything else, says so in its PING there, and is served by B. A
// received the PING alone.
TEST(RankGroup, ARedirectIsFollowed) {
  auto ports = std::make_shared<GroupPorts>();
  FakeServer a(rank_script(ports, [ports](const json&) { return ports->b.load(); }));
  FakeServer b(rank_script(ports, nullptr));
  ports->a = a.port();
  ports->b = b.port();
  auto client = connect(options_for(a));
  ASSERT_TRUE(client);
  EXPECT_EQ(client->redirects(), 1);
  EXPECT_EQ(client->reconnects(), 0);  // a redirect is no reconnect
  EXPECT_EQ(client->server_address(), loopback_address(b.port()));
  ASSERT_NO_FATAL_FAILURE(play_an_episode(*client));
  EXPECT_EQ(client->redirects(), 1);
  EXPECT_EQ(client->env_steps_sent(), 25);
  client->close();

  const std::vector<json> on_a = a.messages();
  ASSERT_EQ(on_a.size(), 1u) << "A received more than the PING";
  EXPECT_EQ(on_a[0]["type"], "PING");
  EXPECT_FALSE(on_a[0].contains("redirected"));
  EXPECT_EQ(on_a[0]["protocol_version"], "1.9");
  EXPECT_EQ(a.connections(), 1);
  const std::vector<json> on_b = b.messages();
  ASSERT_GE(on_b.size(), 3u);
  EXPECT_EQ(on_b[0]["type"], "PING");
  EXPECT_EQ(on_b[0]["redirected"], true);
  EXPECT_EQ(types_received(b)[1], "GET_CONFIG");
  EXPECT_EQ(types_received(b)[2], "GET_STATE");
  EXPECT_EQ(b.connections(), 1);
  EXPECT_FALSE(b.batches().empty());
}

// (b) The rank A redirects to cannot be reached (nobody listens there): the
// client comes back to A, saying it was redirected (so A keeps it), and A serves it.
TEST(RankGroup, AnUnreachableRedirectLeadsBackToTheRankItCameFrom) {
  auto ports = std::make_shared<GroupPorts>();
  RefusingPort nowhere;
  ports->elsewhere = nowhere.port();
  FakeServer a(rank_script(ports, [ports](const json& ping) -> std::uint16_t {
    return says_redirected(ping) ? 0 : ports->elsewhere.load();  // (as a group's rank: none to a redirected PING)
  }));
  FakeServer b(rank_script(ports, nullptr));
  ports->a = a.port();
  ports->b = b.port();
  auto client = connect(options_for(a));
  ASSERT_TRUE(client);
  EXPECT_EQ(client->redirects(), 0);  // not followed: it led nowhere
  EXPECT_EQ(client->reconnects(), 0);
  EXPECT_EQ(client->server_address(), loopback_address(a.port()));
  ASSERT_NO_FATAL_FAILURE(play_an_episode(*client));
  const std::int64_t client_steps_sent = client->env_steps_sent();
  client->close();

  const std::vector<json> on_a = a.messages();
  ASSERT_GE(on_a.size(), 4u);
  EXPECT_EQ(on_a[0]["type"], "PING");
  EXPECT_FALSE(on_a[0].contains("redirected"));
  EXPECT_EQ(on_a[1]["type"], "PING");
  EXPECT_EQ(on_a[1]["redirected"], true);
  EXPECT_EQ(on_a[2]["type"], "GET_CONFIG");
  EXPECT_EQ(a.connections(), 2);
  EXPECT_FALSE(a.batches().empty());
  EXPECT_EQ(client_steps_sent, 25);
  EXPECT_TRUE(b.messages().empty());
}

// (c) A connection made on a redirect is not redirected again: B's PONG
// asks the client back to A, and the client stays on B.
TEST(RankGroup, ARedirectOnAConnectionMadeOnARedirectIsIgnored) {
  auto ports = std::make_shared<GroupPorts>();
  FakeServer a(rank_script(ports, [ports](const json&) { return ports->b.load(); }));
  FakeServer b(rank_script(ports, [ports](const json&) { return ports->a.load(); }));  // (even when redirected)
  ports->a = a.port();
  ports->b = b.port();
  tether::ServerLink link(link_options_for(a));
  const tether::Status started = link.start();
  ASSERT_TRUE(started.ok()) << started.to_string();
  EXPECT_EQ(link.redirects(), 1);
  EXPECT_EQ(link.connected_address(), loopback_address(b.port()));
  EXPECT_EQ(link.address(), loopback_address(a.port()));  // (the address given)
  EXPECT_EQ(link.ranks(), (std::vector<Address>{{"127.0.0.1", a.port()}, {"127.0.0.1", b.port()}}));
  std::shared_ptr<tether::Batch> batch = one_step("on-b");
  link.submit(batch);
  link.wait_for_idle();
  EXPECT_TRUE(batch->done);
  EXPECT_TRUE(batch->error.ok()) << batch->error.to_string();
  EXPECT_EQ(link.redirects(), 1);
  EXPECT_EQ(link.reconnects(), 0);
  link.close();
  EXPECT_EQ(a.connections(), 1);
  EXPECT_EQ(a.messages().size(), 1u);
  EXPECT_EQ(b.connections(), 1);
  ASSERT_EQ(b.batches().size(), 1u);
  EXPECT_EQ(b.batches()[0]["episodes"][0]["episode_id"], "on-b");
}

// (d) A goes away (closes its connection and stops listening) while a batch
// is unanswered: the client's first attempt retries A, the next goes to B,
// which it knows of from A's ranks alone, and the batch goes again there
// with the same client_session and batch_seq.
TEST(RankGroup, ALostRankIsLeftForAnotherWithTheBatchInFlight) {
  auto ports = std::make_shared<GroupPorts>();
  ServerScript script_a = rank_script(ports, nullptr);
  script_a.on_batch = [](Conn& conn, const tether::Message&, int n) {
    if (n == 1) conn.send(state(1, 1));  // batch 2 stays unanswered
    return true;
  };
  FakeServer a(std::move(script_a));
  FakeServer b(rank_script(ports, nullptr));
  ports->a = a.port();
  ports->b = b.port();
  tether::ServerLink link(link_options_for(a));
  const tether::Status started = link.start();
  ASSERT_TRUE(started.ok()) << started.to_string();
  EXPECT_EQ(link.connected_address(), loopback_address(a.port()));
  std::shared_ptr<tether::Batch> first = one_step("first");
  link.submit(first);
  link.wait_for_idle();
  ASSERT_TRUE(first->done);
  std::shared_ptr<tether::Batch> in_flight = one_step("in-flight");
  link.submit(in_flight);
  ASSERT_TRUE(wait_for([&] { return a.batches().size() == 2; }, 5.0));
  a.stop();  // A goes away, its batch unanswered
  ASSERT_TRUE(wait_for([&] { return link.idle(); }, 5.0));  // (idle() locks: in_flight->done is read after)
  EXPECT_TRUE(in_flight->done);
  EXPECT_TRUE(in_flight->error.ok()) << in_flight->error.to_string();
  EXPECT_EQ(link.reconnects(), 1);
  EXPECT_EQ(link.redirects(), 0);
  EXPECT_EQ(link.connected_address(), loopback_address(b.port()));
  std::vector<tether::LinkEvent> events;
  link.take_events(events);
  link.close();
  for (const tether::LinkEvent& event : events) {
    EXPECT_NE(event.kind, tether::LinkEvent::Kind::kFatal) << event.status.to_string();
  }

  const std::vector<json> sent_to_a = a.batches();
  ASSERT_EQ(sent_to_a.size(), 2u);
  const std::vector<json> sent_to_b = b.batches();
  ASSERT_EQ(sent_to_b.size(), 1u);
  EXPECT_EQ(sent_to_b[0]["episodes"][0]["episode_id"], "in-flight");
  EXPECT_EQ(sent_to_b[0]["batch_seq"], sent_to_a[1]["batch_seq"]);
  EXPECT_EQ(sent_to_b[0]["batch_seq"], 2);
  EXPECT_EQ(sent_to_b[0]["client_session"], sent_to_a[1]["client_session"]);
  EXPECT_EQ(sent_to_b[0]["client_session"], link.client_session());
  const std::vector<json> on_b = b.messages();
  ASSERT_FALSE(on_b.empty());
  EXPECT_EQ(on_b[0]["type"], "PING");
  EXPECT_FALSE(on_b[0].contains("redirected"));  // a reconnect, not a redirect
  EXPECT_EQ(b.connections(), 1);
}

}  // namespace

#endif  // _WIN32
