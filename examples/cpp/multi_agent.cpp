// A small multi-agent game written in C++, trained by `tether serve` through
// the MultiAgentClient: two modules chosen by the server's policy mapping and
// one agent group (examples/configs/cpp_multi_agent.json).
//
//   * scouts ("scout_0", "scout_1" -> module "scout"): each sees a one-hot
//     target among 3 and earns 1 for naming it. scout_1 joins at step 4 and
//     leaves at step 12 of each 16-step episode.
//   * the lifters ("lift_0" + "lift_1", the group "pair" -> module "lifter"):
//     each member sees its own cue (one of 2) and earns 0.5 for choosing its
//     PARTNER's cue, so only the group, which sees both cues, can do well.
//
// A uniformly random policy earns about 16 per episode, a perfect one 40.
//
//   multi_agent --port 5555 --max-steps 6000 --seed 0
//   multi_agent --random --max-steps 3000           # random actions, no server
//
// It stops after --max-steps env steps ("stopped_by": "max_steps"), when the
// server says its run is done (ERROR TRAINING_DONE: "training_done", the
// normal end), or when the server goes away ("server_gone"), and prints one
// JSON line: {"episodes", "mean_return_last_100", ..., "stopped_by"}. An error
// of the server (e.g. a refused batch) is printed and the call that returned
// it made again (surviving.h).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "flags.h"
#include "surviving.h"
#include "tether/distributions.h"
#include "tether/multi_agent_client.h"
#include "tether/onnxruntime_backend.h"

namespace {

constexpr int kEpisodeSteps = 16;
constexpr int kTargets = 3;

/// The game's state and rules; the engine side of the example.
class RelayGame {
 public:
  explicit RelayGame(std::uint64_t seed) : rng_(seed) {}

  void reset() {
    step_ = 0;
    draw();
  }
  int step() const { return step_; }
  bool scout_1_present() const { return step_ >= 4 && step_ < 12; }

  /// Observations of the agents acting now, into `frame`.
  void observe(tether::AgentFrame& frame) const {
    frame.clear();
    scout_obs(frame, "scout_0", target_[0]);
    if (scout_1_present()) scout_obs(frame, "scout_1", target_[1]);
    lift_obs(frame, "lift_0", cue_[0]);
    lift_obs(frame, "lift_1", cue_[1]);
  }
  /// The reward of each agent for its action.
  double scout_reward(int scout, std::int64_t action) const { return action == target_[scout] ? 1.0 : 0.0; }
  double lift_reward(int member, std::int64_t action) const { return action == cue_[1 - member] ? 0.5 : 0.0; }
  /// Advances one env step (new targets and cues).
  void advance() {
    ++step_;
    draw();
  }

 private:
  void draw() {
    for (int& t : target_) t = static_cast<int>(rng_.next_u64() % kTargets);
    for (int& c : cue_) c = static_cast<int>(rng_.next_u64() % 2);
  }
  void scout_obs(tether::AgentFrame& frame, const std::string& id, int target) const {
    float* obs = frame.add_uninitialized(id, kTargets + 1);
    for (int k = 0; k < kTargets; ++k) obs[k] = k == target ? 1.0f : 0.0f;
    obs[kTargets] = static_cast<float>(step_) / kEpisodeSteps;
  }
  void lift_obs(tether::AgentFrame& frame, const std::string& id, int cue) const {
    float* obs = frame.add_uninitialized(id, 2);
    obs[0] = cue == 0 ? 1.0f : 0.0f;
    obs[1] = cue == 1 ? 1.0f : 0.0f;
  }

  tether::Rng rng_;
  int step_ = 0;
  int target_[2] = {0, 0};
  int cue_[2] = {0, 0};
};

struct Args {
  std::string host = "127.0.0.1";
  std::uint16_t port = 5555;
  long max_steps = 6000;
  std::uint64_t seed = 0;
  bool random = false;
  double reconnect_timeout_s = 5.0;
};

bool parse(int argc, char** argv, Args& args) {
  examples::Flags flags("multi_agent");
  flags.value("--host", args.host, "H").value("--port", args.port, "P").value("--max-steps", args.max_steps, "N");
  flags.value("--seed", args.seed, "S").value("--reconnect-timeout", args.reconnect_timeout_s, "S");
  flags.toggle("--random", args.random);
  return flags.parse(argc, argv);
}

double mean(const std::deque<double>& values, std::size_t last) {
  if (values.empty()) return 0.0;
  const std::size_t n = std::min(last, values.size());
  return std::accumulate(values.end() - static_cast<std::ptrdiff_t>(n), values.end(), 0.0) / static_cast<double>(n);
}

/// Plays one env step's rewards for the actions in `frame`; returns their sum.
double reward_frame(const RelayGame& game, const tether::AgentFrame& frame, tether::MultiAgentClient* client,
                    const std::string& episode) {
  double total = 0.0;
  for (std::size_t i = 0; i < frame.size(); ++i) {
    const std::string& id = frame.agent_id(i);
    const std::int64_t action = frame.discrete_action(i);
    double reward = 0.0;
    if (id == "scout_0" || id == "scout_1") reward = game.scout_reward(id == "scout_0" ? 0 : 1, action);
    if (id == "lift_0" || id == "lift_1") reward = game.lift_reward(id == "lift_0" ? 0 : 1, action);
    total += reward;
    if (client != nullptr) client->log_returns(episode, id, reward);
  }
  return total;
}

int run_random(const Args& args) {
  RelayGame game(args.seed);
  tether::Rng rng(args.seed + 1);
  tether::AgentFrame frame;
  std::deque<double> returns;
  long steps = 0;
  while (steps < args.max_steps) {
    game.reset();
    double total = 0.0;
    while (game.step() < kEpisodeSteps) {
      game.observe(frame);
      for (std::size_t i = 0; i < frame.size(); ++i) {
        const bool scout = frame.agent_id(i).rfind("scout_", 0) == 0;
        const std::int64_t action = static_cast<std::int64_t>(rng.next_u64() % (scout ? kTargets : 2));
        total += scout ? game.scout_reward(frame.agent_id(i) == "scout_0" ? 0 : 1, action)
                       : game.lift_reward(frame.agent_id(i) == "lift_0" ? 0 : 1, action);
      }
      game.advance();
      ++steps;
    }
    returns.push_back(total);
  }
  std::printf("{\"episodes\": %zu, \"mean_return_last_100\": %.3f, \"env_steps\": %ld, \"policy\": \"random\"}\n",
              returns.size(), mean(returns, 100), steps);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  if (!parse(argc, argv, args)) return 2;
  if (args.random) return run_random(args);

  tether::ClientOptions options;
  options.host = args.host;
  options.port = args.port;
  options.seed = args.seed;
  options.reconnect_timeout_s = args.reconnect_timeout_s;
  options.when_queue_full = tether::QueueFullPolicy::kWait;
  options.client_name = "cpp-multi-agent-example";
  // Strict on-policy: each batch waits for the weights that answer it (no data goes stale).
  options.wait_for_weights = true;
  options.backend_factory = [] { return std::make_unique<tether::OnnxRuntimeBackend>(); };
  auto connected = tether::MultiAgentClient::connect(options);
  if (!connected.ok()) {
    std::fprintf(stderr, "connect failed: %s\n", connected.status().to_string().c_str());
    return 1;
  }
  tether::MultiAgentClient& client = *connected.value();

  RelayGame game(args.seed);
  tether::AgentFrame frame;
  tether::AgentFrame leaving;
  std::deque<double> returns;
  long steps = 0;
  std::string stopped_by = "max_steps";
  while (steps < args.max_steps && stopped_by == "max_steps") {
    if (client.training_done()) {
      stopped_by = "training_done";  // the server's run is done and it said so (the normal end)
      break;
    }
    tether::Result<std::string> started =
        examples::surviving("multi_agent", client, [&] { return client.start_episode(); });
    if (!started.ok()) {
      stopped_by = "server_gone";
      break;
    }
    const std::string& episode = started.value();
    game.reset();
    double total = 0.0;
    while (game.step() < kEpisodeSteps) {
      game.observe(frame);
      tether::Status status =
          examples::surviving("multi_agent", client, [&] { return client.get_action(episode, frame); });
      if (!status.ok()) {
        if (client.training_done()) {  // (a MAP_AGENTS question the finished run no longer answers)
          stopped_by = "training_done";
          break;
        }
        if (!client.fatal_error().ok()) {
          stopped_by = "server_gone";
          break;
        }
        std::fprintf(stderr, "get_action: %s\n", status.to_string().c_str());
        return 1;
      }
      total += reward_frame(game, frame, &client, episode);
      game.advance();
      ++steps;
      if (game.step() == 12) {  // scout_1 leaves the episode (its final observation)
        leaving.clear();
        const float final_obs[kTargets + 1] = {0, 0, 0, 1};
        leaving.add("scout_1", final_obs, kTargets + 1);
        examples::surviving("multi_agent", client, [&] { return client.end_agents(episode, leaving); });
      }
    }
    if (stopped_by != "max_steps") break;
    game.observe(frame);  // the last observations
    tether::Result<std::map<std::string, double>> ended = examples::surviving(
        "multi_agent", client, [&] { return client.end_episode(episode, &frame, /*truncated=*/true); });
    if (!ended.ok() && !client.fatal_error().ok()) stopped_by = "server_gone";
    returns.push_back(total);
  }
  if (stopped_by == "max_steps") examples::surviving("multi_agent", client, [&] { return client.flush(); });
  std::printf("{\"episodes\": %zu, \"mean_return_last_100\": %.3f, \"mean_return_first_100\": %.3f, "
              "\"env_steps\": %ld, \"env_steps_sent\": %lld, \"agent_steps_sent\": %lld, \"models_loaded\": %lld, "
              "\"inference_runs\": %lld, \"stopped_by\": \"%s\"}\n",
              returns.size(), mean(returns, 100),
              returns.empty() ? 0.0 : std::accumulate(returns.begin(), returns.begin() + std::min<std::ptrdiff_t>(100, returns.size()), 0.0) /
                                         static_cast<double>(std::min<std::size_t>(100, returns.size())),
              steps, static_cast<long long>(client.env_steps_sent()), static_cast<long long>(client.agent_steps_sent()),
              static_cast<long long>(client.models_loaded()), static_cast<long long>(client.inference_runs()),
              stopped_by.c_str());
  return 0;
}
