// tests/conformance/cuts.json (§13.3, where a batch is cut) against both clients:
// each case's engine calls played by a TetherClient (kind "single") or a
// MultiAgentClient (kind "multi", agents a_* of module m) of the fake server,
// then a flush; the batches the server received, read back as the vectors
// write them (each observation by its value, records and entries by id), are
// the case's. A case with "reconnect": the first connection closes at batch 1,
// and later ones describe other bounds ("bounds_changed") or the same config.
// POSIX only, as the fake server.
#ifndef _WIN32

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "client_test_helpers.h"

namespace {

using namespace fake;  // (the fake server, its answers and the helpers of client_test_helpers.h)

json cut_vectors() {
  std::ifstream in(std::string(TETHER_CONFORMANCE_DIR) + "/cuts.json", std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return json::parse(text.str(), nullptr, false);
}

// The observation of a case's value v (every element v) for a module of `width`.
std::vector<float> cut_obs(const json& v, std::size_t width) { return std::vector<float>(width, v.get<float>()); }

// A frame of the agents of `values` (agent id -> v), observations `width` wide, each truncated if `truncated`.
tether::AgentFrame cut_frame(const json& values, std::size_t width, bool truncated = false) {
  tether::AgentFrame frame;
  for (const auto& item : values.items()) {
    frame.add(item.key(), cut_obs(item.value(), width).data(), width, truncated);
  }
  return frame;
}

// The value of each observation row; a row whose elements differ is not the case's (a failure).
json cut_markers(const json& rows, std::size_t width) {
  json out = json::array();
  for (const json& row : rows) {
    EXPECT_EQ(row.size(), width) << row.dump();
    for (const json& x : row) EXPECT_EQ(x, row[0]) << row.dump();
    out.push_back(row[0]);
  }
  return out;
}

json cut_steps(const json& entry, std::size_t width) {
  EXPECT_EQ(entry["actions"].size(), entry["rewards"].size());
  EXPECT_EQ(entry["obs"].size(), entry["rewards"].size() + 1);
  EXPECT_GE(entry["rewards"].size(), 1u) << "a chunk without steps";
  return {{"obs", cut_markers(entry["obs"], width)}, {"rewards", entry["rewards"]}};
}

// A record's or an entry's end flag `name`: a boolean (`optional`: false when left out).
json cut_flag(const json& part, const char* name, bool optional = false) {
  if (optional && !part.contains(name)) return false;
  EXPECT_TRUE(part.contains(name) && part[name].is_boolean()) << name << " of " << part.dump();
  return part.value(name, json());
}

// A batch as the vectors write it: episode id -> record (a single-agent record's flags are required, a
// multi-agent record's default to false; an entry's start_step is an integer). Numbers compare as numbers
// (nlohmann's == takes 0 and 0.0 as equal); flags, being booleans, as booleans.
json cut_batch(const std::string& kind, const json& batch, std::size_t width) {
  json out = json::object();
  for (const json& record : batch["episodes"]) {
    const std::string id = record["episode_id"].get<std::string>();
    EXPECT_FALSE(out.contains(id)) << "two records of " << id << " in one batch";
    const bool multi = kind == "multi";
    json mine = multi ? json::object() : cut_steps(record, width);
    mine["is_terminated"] = cut_flag(record, "is_terminated", multi);
    mine["is_truncated"] = cut_flag(record, "is_truncated", multi);
    if (multi) {
      mine["agents"] = json::object();
      for (const auto& item : record["agents"].items()) {
        json entry = cut_steps(item.value(), width);
        EXPECT_TRUE(item.value()["start_step"].is_number_integer()) << item.value().dump();
        entry["start_step"] = item.value()["start_step"];
        entry["is_terminated"] = cut_flag(item.value(), "is_terminated");
        entry["is_truncated"] = cut_flag(item.value(), "is_truncated");
        mine["agents"][item.key()] = entry;
      }
    }
    out[id] = mine;
  }
  return out;
}

void play_single(tether::TetherClient& client, const json& calls) {
  constexpr std::size_t kWidth = 4;  // (the fake server's Box(4))
  std::set<std::string> started;
  for (const json& call : calls) {
    const std::string what = call[0].get<std::string>(), episode = call[1].get<std::string>();
    if (started.insert(episode).second) ASSERT_TRUE(client.start_episode(episode, what != "start" || call[2]).ok());
    if (what == "start") continue;
    if (what == "act") {
      std::vector<double> action;
      ASSERT_TRUE(client.get_action(episode, cut_obs(call[2], kWidth), action).ok()) << call.dump();
    } else if (what == "reward") {
      ASSERT_TRUE(client.log_returns(episode, call[2].get<double>()).ok());
    } else {
      ASSERT_TRUE(client.end_episode(episode, cut_obs(call[2], kWidth), what == "truncate").ok()) << call.dump();
    }
  }
}

void play_multi(tether::MultiAgentClient& client, const json& calls) {
  constexpr std::size_t kWidth = 2;  // (pair_config's module m)
  std::set<std::string> started;
  for (const json& call : calls) {
    const std::string what = call[0].get<std::string>(), episode = call[1].get<std::string>();
    if (started.insert(episode).second) ASSERT_TRUE(client.start_episode(episode, what != "start" || call[2]).ok());
    if (what == "start") continue;
    if (what == "frame") {
      tether::AgentFrame frame = cut_frame(call[2], kWidth);
      ASSERT_TRUE(client.get_action(episode, frame).ok()) << call.dump();
    } else if (what == "reward") {
      ASSERT_TRUE(client.log_returns(episode, call[2].get<std::string>(), call[3].get<double>()).ok());
    } else if (what == "end_agents" || what == "truncate_agents") {
      ASSERT_TRUE(client.end_agents(episode, cut_frame(call[2], kWidth, what == "truncate_agents")).ok()) << call.dump();
    } else {
      const tether::AgentFrame final_observations = cut_frame(call[2], kWidth);
      ASSERT_TRUE(client.end_episode(episode, &final_observations, what == "truncate").ok()) << call.dump();
    }
  }
}

// The SET_CONFIG of connection `connection` (1-based) for a case: the fake server's single-agent config
// (Box(4)) or pair_config, observations in [-9, 9] from the second connection on with "bounds_changed".
json cut_config(const json& c, int connection) {
  const std::int64_t steps = c["steps_per_batch"].get<std::int64_t>();
  const double bound = connection > 1 && c.value("reconnect", "") == "bounds_changed" ? 9.0 : 10.0;
  const json box = {{"type", "Box"}, {"shape", {c["kind"] == "single" ? 4 : 2}}, {"low", -bound}, {"high", bound}};
  if (c["kind"] == "multi") {
    json config = pair_config(steps);
    config["modules"]["m"]["observation_space"] = box;
    return config;
  }
  return {{"type", "SET_CONFIG"},       {"observation_space", box},   {"action_space", discrete(2)},
          {"onnx_input_names", {"obs"}}, {"onnx_output_names", {"action_dist_inputs"}},
          {"env_steps_per_sample", steps}, {"force_on_policy", true},   {"heartbeat_interval_s", 0},
          {"protocol_version", "1.3"}};
}

TEST(CutVectors, BatchesAreCutWhereTheVectorsSay) {
  const json file = cut_vectors();
  ASSERT_TRUE(file.is_object());
  std::size_t cases = 0;
  for (const json& c : file["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    ++cases;
    const std::string kind = c["kind"].get<std::string>();
    const bool reconnect = c.contains("reconnect");
    // Every handshake sends the model; a batch is answered with the weights the client has. SET_STATE n
    // (0: the handshake's, n: the answer to batch n) carries the case's record_shares[n], the last repeated.
    auto answer = [c, kind](int n) {
      json out = kind == "single" ? json{{"type", "SET_STATE"}, {"weights_seq_no", 0}} : pair_state(0);
      if (kind == "single" && n == 0) out = state(0, 1);
      if (kind == "multi" && n > 0) out["models"] = json::object();
      if (c.contains("record_shares")) {
        const json& shares = c["record_shares"];
        out["record_share"] = shares[std::min<std::size_t>(static_cast<std::size_t>(n), shares.size() - 1)];
      }
      return out;
    };
    ServerScript script = answering([answer](int) { return answer(0); });
    script.config_of_connection = [c](int connection) { return cut_config(c, connection); };
    script.on_batch = [answer, reconnect](Conn& conn, const tether::Message&, int n) {
      if (reconnect && n == 1) return false;  // (closes the connection, batch 1 unanswered)
      conn.send(answer(n));
      return true;
    };
    FakeServer server(script);
    // (every batch delivered: the engine waits for room in the send queue; with "wait_for_weights", the
    // call that cut a batch waits for its answer)
    tether::ClientOptions options = waiting_options_for(server);
    options.wait_for_weights = c["wait_for_weights"].get<bool>();
    if (kind == "single") {
      auto client = connect(options);
      ASSERT_NE(client, nullptr);
      ASSERT_NO_FATAL_FAILURE(play_single(*client, c["calls"]));
      ASSERT_TRUE(client->flush().ok());
    } else {
      ASSERT_EQ(kind, "multi");
      auto client = connect_multi(options);
      ASSERT_NE(client, nullptr);
      ASSERT_NO_FATAL_FAILURE(play_multi(*client, c["calls"]));
      ASSERT_TRUE(client->flush().ok());
    }
    const std::vector<json> received = server.batches();
    std::vector<json> batches;
    for (const json& batch : received) {
      if (!batches.empty() && batch["batch_seq"] == batches.back()["batch_seq"]) {
        EXPECT_EQ(batch, batches.back()) << "a batch not sent again unchanged";
        continue;
      }
      batches.push_back(batch);
    }
    EXPECT_EQ(received.size() - batches.size(), reconnect ? 1u : 0u) << "batches sent again";
    json got = json::array();
    for (std::size_t i = 0; i < batches.size(); ++i) {
      EXPECT_EQ(batches[i]["batch_seq"], i + 1) << "a batch skipped";
      got.push_back(cut_batch(kind, batches[i], kind == "single" ? 4 : 2));
    }
    EXPECT_EQ(got, c["batches"]) << "sent: " << got.dump() << "\nthe vectors': " << c["batches"].dump();
  }
  EXPECT_GT(cases, 0u);
}

}  // namespace

#endif  // _WIN32
