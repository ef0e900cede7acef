// MAP_AGENTS answers are kept for the rest of their episode (§7.10):
// compute_actions asks once per (episode id, agent), not on every call. The
// answers are bounded: an episode's go when it ends, all of them on a
// reconnect (the new server may map differently), and the oldest episodes'
// beyond MultiAgentClient::kMaxMappedActors. map_agents() asks ahead for an
// episode's agents, in one request.
#include <gtest/gtest.h>

#ifndef _WIN32

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "client_test_helpers.h"

namespace {

using namespace fake;  // (the fake server, its answers and the helpers of client_test_helpers.h)

// One module "m" that the server maps every agent to with its own function.
ServerScript mapping_server() {
  ServerScript script;
  script.full_config = multi_agent_config(100, {{"m", module_json(2)}}, json());
  script.on_get_state = [](Conn& conn, const tether::Message&, int) {
    conn.send({{"type", "SET_STATE"},
               {"models", {{"m", {{"weights_seq_no", 0}, {"onnx_file", fake::onnx_file(1)}}}}}});
    return true;
  };
  script.map_agent = [](const std::string&) { return std::string("m"); };
  return script;
}

std::unique_ptr<tether::MultiAgentClient> connect_to(const FakeServer& server) {
  return connect_multi(options_for(server, 3));
}

void fill(tether::AgentFrame& frame, const std::string& prefix, int agents) {
  frame.clear();
  const float obs[2] = {0.25f, -0.25f};
  for (int i = 0; i < agents; ++i) frame.add(prefix + std::to_string(i), obs, 2);
}

// Answers MAP_AGENTS with `module` for every agent; the first connection goes away after its answer.
std::function<bool(Conn&, const tether::Message&)> every_agent_to(const std::string& module) {
  auto answered = std::make_shared<std::atomic<int>>(0);
  return [answered, module](Conn& conn, const tether::Message& message) {
    json modules = json::object();
    for (const json& id : message.body["agent_ids"]) modules[id.get<std::string>()] = module;
    conn.send({{"type", "AGENT_MODULES"}, {"modules", modules}});
    return answered->fetch_add(1) > 0;
  };
}

// Whether the client took a new connection in (and so forgot its answers) within 10 s.
bool took_a_new_connection(tether::MultiAgentClient& client) {
  return wait_for([&] {
    (void)client.take_error();  // (reads the link's events: the new connection)
    return client.reconnects() >= 1 && client.mapped_actors() == 0;
  }, 10.0);
}

}  // namespace

TEST(MapAgentsCache, ComputeActionsAsksOncePerEpisodeAndAgent) {
  FakeServer server(mapping_server());
  auto client = connect_to(server);
  ASSERT_TRUE(client);
  tether::AgentFrame frame;
  fill(frame, "a", 2);
  for (int call = 0; call < 5; ++call) {
    ASSERT_TRUE(client->compute_actions(frame).ok()) << client->last_error().to_string();
    EXPECT_EQ(frame.discrete_action(1), 1);
  }
  EXPECT_EQ(client->map_requests(), 1);
  fill(frame, "a", 3);  // a2 is new: only it is asked about
  ASSERT_TRUE(client->compute_actions(frame).ok());
  EXPECT_EQ(client->map_requests(), 2);
  ASSERT_TRUE(client->compute_actions(frame, "other").ok());  // another episode: asked again
  EXPECT_EQ(client->map_requests(), 3);
  std::vector<json> requests;
  for (const json& message : server.messages()) {
    if (message["type"] == "MAP_AGENTS") requests.push_back(message);
  }
  ASSERT_EQ(requests.size(), 3u);
  EXPECT_EQ(requests[1]["agent_ids"], json({"a2"}));
  EXPECT_EQ(requests[2]["episode_id"], "other");
  EXPECT_EQ(client->mapped_actors(), 6u);
}

TEST(MapAgentsCache, AnEpisodesAnswersGoWhenItEnds) {
  FakeServer server(mapping_server());
  auto client = connect_to(server);
  ASSERT_TRUE(client);
  std::string episode = client->start_episode("e").value();
  tether::AgentFrame frame;
  fill(frame, "a", 2);
  ASSERT_TRUE(client->get_action(episode, frame).ok());
  ASSERT_TRUE(client->compute_actions(frame, episode).ok());  // the episode's answers serve it
  EXPECT_EQ(client->map_requests(), 1);
  EXPECT_EQ(client->mapped_actors(), 2u);
  ASSERT_TRUE(client->end_episode(episode).ok());
  EXPECT_EQ(client->mapped_actors(), 0u);
}

TEST(MapAgentsCache, AReconnectForgetsTheAnswers) {
  ServerScript script = mapping_server();
  script.on_map_agents = every_agent_to("m");
  FakeServer server(script);
  auto client = connect_to(server);
  ASSERT_TRUE(client);
  tether::AgentFrame frame;
  fill(frame, "a", 2);
  ASSERT_TRUE(client->compute_actions(frame).ok());
  EXPECT_EQ(client->mapped_actors(), 2u);
  ASSERT_TRUE(took_a_new_connection(*client));
  ASSERT_TRUE(client->compute_actions(frame).ok());
  EXPECT_EQ(client->map_requests(), 2);
}

TEST(MapAgentsCache, TheOldestEpisodesGoBeyondTheCap) {
  FakeServer server(mapping_server());
  auto client = connect_to(server);
  ASSERT_TRUE(client);
  constexpr int kAgents = 30000;  // three episodes of these pass kMaxMappedActors (65536)
  static_assert(3 * kAgents > static_cast<int>(tether::MultiAgentClient::kMaxMappedActors), "");
  tether::AgentFrame frame;
  fill(frame, "a", kAgents);
  for (const char* episode : {"e1", "e2", "e3"}) ASSERT_TRUE(client->compute_actions(frame, episode).ok());
  EXPECT_EQ(client->map_requests(), 3);
  EXPECT_EQ(client->mapped_actors(), 2u * kAgents);  // e1's answers went
  ASSERT_TRUE(client->compute_actions(frame, "e3").ok());
  EXPECT_EQ(client->map_requests(), 3);
  ASSERT_TRUE(client->compute_actions(frame, "e1").ok());
  EXPECT_EQ(client->map_requests(), 4);
  EXPECT_LE(client->mapped_actors(), tether::MultiAgentClient::kMaxMappedActors);
}

TEST(MapAgentsCache, AgentsMappedAheadAreAskedOnceAndActWithoutAsking) {
  FakeServer server(mapping_server());
  auto client = connect_to(server);
  ASSERT_TRUE(client);
  std::string episode = client->start_episode("e").value();
  auto modules = client->map_agents(episode, {"a0", "a1", "a0"});
  ASSERT_TRUE(modules.ok()) << modules.status().to_string();
  EXPECT_EQ(modules.value(), std::vector<std::string>({"m", "m", "m"}));
  EXPECT_EQ(client->map_requests(), 1);
  tether::AgentFrame frame;
  const float obs[2] = {0.25f, -0.25f};
  for (const char* seat : {"a0", "a1", "a0"}) {  // (in turn, as a turn-based game's seats)
    frame.clear();
    frame.add(seat, obs, 2);
    ASSERT_TRUE(client->get_action(episode, frame).ok()) << client->last_error().to_string();
  }
  EXPECT_EQ(client->map_requests(), 1);
  // Only what the episode does not know yet is asked: an agent that acted, one mapped ahead, a new one.
  ASSERT_TRUE(client->map_agents(episode, {"a1", "a5"}).ok());
  EXPECT_EQ(client->map_requests(), 2);
  std::vector<json> requests;
  for (const json& message : server.messages()) {
    if (message["type"] == "MAP_AGENTS") requests.push_back(message);
  }
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_EQ(requests[0]["agent_ids"], json({"a0", "a1"}));
  EXPECT_EQ(requests[1]["agent_ids"], json({"a5"}));
  EXPECT_EQ(requests[1]["episode_id"], "e");
  EXPECT_EQ(client->map_agents("no-such-episode", {"a0"}).status().code(), tether::ErrorCode::kInvalidArgument);
  ASSERT_TRUE(client->end_episode(episode).ok());
  EXPECT_EQ(client->mapped_actors(), 0u);
}

TEST(MapAgentsCache, AnAnswerThatMapsNotEveryAgentIsRefusedAndNothingKept) {
  ServerScript script = mapping_server();
  script.on_map_agents = [](Conn& conn, const tether::Message& message) {
    json modules = json::object();
    for (const json& id : message.body["agent_ids"]) {
      if (id != "b1") modules[id.get<std::string>()] = id == "b2" ? "ghost" : "m";
    }
    conn.send({{"type", "AGENT_MODULES"}, {"modules", modules}});
    return true;
  };
  FakeServer server(script);
  auto client = connect_to(server);
  ASSERT_TRUE(client);
  std::string episode = client->start_episode("e").value();
  auto left_out = client->map_agents(episode, {"b0", "b1"});
  EXPECT_EQ(left_out.status().code(), tether::ErrorCode::kInvalidField);
  EXPECT_NE(left_out.status().message().find("names no module for 'b1'"), std::string::npos);
  auto unknown = client->map_agents(episode, {"b0", "b2"});
  EXPECT_EQ(unknown.status().code(), tether::ErrorCode::kUnknownModule);
  EXPECT_EQ(client->mapped_actors(), 0u);  // (b0's answer was not kept either)
  auto fine = client->map_agents(episode, {"b0"});
  ASSERT_TRUE(fine.ok());
  EXPECT_EQ(client->mapped_actors(), 1u);
}

TEST(MapAgentsCache, AnAnswerNamingAModuleTheNewConnectionDroppedIsRefused) {
  // Modules "m" and "n" on the first connection, "m" alone on the next: the client keeps "n" (its
  // actors' steps and states were let go) but must not map anyone to it, whatever the server answers.
  ServerScript script = mapping_server();
  script.full_config = multi_agent_config(100, {{"m", module_json(2)}, {"n", module_json(2)}}, json());
  script.config_of_connection = [](int connection) {
    return multi_agent_config(100, connection == 1 ? json{{"m", module_json(2)}, {"n", module_json(2)}}
                                                   : json{{"m", module_json(2)}}, json());
  };
  script.on_map_agents = every_agent_to("n");
  FakeServer server(script);
  auto client = connect_to(server);
  ASSERT_TRUE(client);
  std::string episode = client->start_episode("e").value();
  auto first = client->map_agents(episode, {"b0"});
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  EXPECT_EQ(first.value(), std::vector<std::string>{"n"});
  ASSERT_TRUE(took_a_new_connection(*client));
  auto gone = client->map_agents(episode, {"b1"});
  EXPECT_EQ(gone.status().code(), tether::ErrorCode::kUnknownModule) << gone.status().to_string();
  EXPECT_NE(gone.status().message().find("'n', which SET_CONFIG does not describe"), std::string::npos);
  EXPECT_EQ(client->mapped_actors(), 0u);
}

TEST(MapAgentsCache, AMapAgentsLostWithItsConnectionIsSentAgainOnTheNext) {
  // §6.5: a request whose connection ends before its answer is sent again, unchanged, on the next
  // connection (as the Python and C# SDKs do): the caller gets the answer, not a connection error.
  ServerScript script = mapping_server();
  auto asked = std::make_shared<std::atomic<int>>(0);
  script.on_map_agents = [asked](Conn& conn, const tether::Message& message) {
    if (asked->fetch_add(1) < 2) return false;  // closed unanswered: lost with the connection
    json modules = json::object();
    for (const json& id : message.body["agent_ids"]) modules[id.get<std::string>()] = "m";
    conn.send({{"type", "AGENT_MODULES"}, {"modules", modules}});
    return true;
  };
  FakeServer server(script);
  auto client = connect_to(server);
  ASSERT_TRUE(client);
  const int connections = server.connections();
  std::string episode = client->start_episode("e").value();
  auto modules = client->map_agents(episode, {"a0", "a1"});
  ASSERT_TRUE(modules.ok()) << modules.status().to_string();
  EXPECT_EQ(modules.value(), std::vector<std::string>({"m", "m"}));
  std::vector<json> requests;
  for (const json& message : server.messages()) {
    if (message["type"] == "MAP_AGENTS") requests.push_back(message);
  }
  ASSERT_EQ(requests.size(), 3u);
  EXPECT_EQ(requests[1], requests[0]);
  EXPECT_EQ(requests[2], requests[0]);
  EXPECT_EQ(server.connections(), connections + 2);
}

TEST(MapAgentsCache, AMapAgentsWhoseBytesTheServerRefusedFailsAndIsNotSentAgain) {
  // The server refused the request's bytes (a connection-level ERROR, §6.6): sent again they would be
  // refused again, so the call fails with that code at once, as in the Python and C# SDKs.
  for (const auto& [code, expected] : {std::pair<const char*, tether::ErrorCode>{"BAD_HEADER", tether::ErrorCode::kBadHeader},
                                       {"FRAME_TOO_LARGE", tether::ErrorCode::kFrameTooLarge}}) {
    ServerScript script = mapping_server();
    script.on_map_agents = [code = std::string(code)](Conn& conn, const tether::Message&) {
      conn.send({{"type", "ERROR"}, {"code", code}, {"message", "refused for the test"}});
      return false;
    };
    FakeServer server(script);
    auto client = connect_to(server);
    ASSERT_TRUE(client);
    std::string episode = client->start_episode("e").value();
    auto modules = client->map_agents(episode, {"a0"});
    EXPECT_EQ(modules.status().code(), expected) << modules.status().to_string();
    int asked = 0;
    for (const json& message : server.messages()) asked += message["type"] == "MAP_AGENTS";
    EXPECT_EQ(asked, 1) << code;
  }
}

#endif  // _WIN32
