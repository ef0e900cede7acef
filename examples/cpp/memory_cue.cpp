// Remember the cue, as an external Tether client: the game of
// multiagent/envs/memory_cue.py written in C++, which only a policy with
// memory (protocol 1.5, a recurrent model) can win. At the first step the
// observation shows one of --cues cues (one-hot); at every later step the cue
// part is zeros. The observation's last value is the time left,
// (length - 1 - t) / (length - 1). Only the last of --length steps counts:
// +1 if its action names the cue, -1 otherwise; the episode then terminates.
// A policy of the current observation alone cannot beat chance (a mean return
// of 2 / cues - 1: 0 for two cues); one that remembers wins every episode.
//
//   tether serve --observation-space '{"type": "Box", "shape": [3], "low": 0, "high": 1}'
//       --action-space '{"type": "Discrete", "n": 2}' --hidden-sizes 32
//       --model '{"recurrent": {"type": "gru", "size": 32, "seq_len": 8, "burn_in": 2}}' --max-env-steps 12000
//   memory_cue --port 5555 --seed 0
//   memory_cue --random                     # a uniformly random policy, no server
//
// The SDK carries the model's state for every episode (§12.4): this code
// never sees it. It trains until the server says its run is done (ERROR
// TRAINING_DONE) or --max-steps env steps, then plays --greedy-episodes
// greedy episodes with compute_action(observation, episode id), each episode
// its own id (its memory starts from zeros), and prints one JSON line:
// {"episodes", "mean_return_last_100", "greedy_return", "greedy_episodes",
//  "env_steps", "models_loaded", "random", "stopped_by"}.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "flags.h"
#include "surviving.h"
#include "tether/client.h"
#include "tether/distributions.h"
#include "tether/onnxruntime_backend.h"

namespace {

/// The memory cue game (one agent).
class MemoryCue {
 public:
  MemoryCue(int cues, int length, std::uint64_t seed) : cues_(cues), length_(length), rng_(seed) {}

  void reset() {
    cue_ = static_cast<int>(rng_.next_u64() % static_cast<std::uint64_t>(cues_));
    t_ = 0;
  }
  /// The observation now: the cue's one-hot at the first step only, then the time left.
  void observe(std::vector<float>& obs) const {
    obs.assign(static_cast<std::size_t>(cues_) + 1, 0.0f);
    if (t_ == 0) obs[static_cast<std::size_t>(cue_)] = 1.0f;
    obs.back() = static_cast<float>(length_ - 1 - t_) / static_cast<float>(length_ - 1);
  }
  /// Acts; returns the reward (only the last step's counts) and whether the episode terminated.
  double step(int action, bool& done) {
    done = t_ == length_ - 1;
    const double reward = done ? (action == cue_ ? 1.0 : -1.0) : 0.0;
    if (!done) ++t_;
    return reward;
  }
  int cues() const noexcept { return cues_; }

 private:
  int cues_, length_;
  int cue_ = 0, t_ = 0;
  tether::Rng rng_;
};

struct Args {
  std::string host = "127.0.0.1";
  std::uint16_t port = 5555;
  long long max_steps = 1000000;
  std::uint64_t seed = 0;
  int cues = 2;
  int length = 6;
  int greedy_episodes = 200;
  double reconnect_timeout_s = 60.0;
  bool random = false;
};

bool parse_args(int argc, char** argv, Args& args) {
  examples::Flags flags("memory_cue");
  flags.value("--host", args.host, "H").value("--port", args.port, "P").value("--max-steps", args.max_steps, "N");
  flags.value("--seed", args.seed, "S").value("--cues", args.cues, "C").value("--length", args.length, "L");
  flags.value("--greedy-episodes", args.greedy_episodes, "N").value("--reconnect-timeout", args.reconnect_timeout_s, "S");
  flags.toggle("--random", args.random);
  if (!flags.parse(argc, argv)) return false;
  if (args.cues >= 2 && args.length >= 2) return true;
  std::fprintf(stderr, "memory_cue: --cues and --length are at least 2\n");
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  if (!parse_args(argc, argv, args)) return 2;
  MemoryCue game(args.cues, args.length, args.seed * 7919u + 1u);
  tether::Rng random_actions(args.seed);
  std::unique_ptr<tether::TetherClient> client;
  if (!args.random) {
    tether::ClientOptions options;
    options.host = args.host;
    options.port = args.port;
    options.client_name = "memory-cue-cpp-" + std::to_string(args.seed);
    options.seed = args.seed;
    options.reconnect_timeout_s = args.reconnect_timeout_s;
    // A game of microseconds per step: each batch waits for the weights that answer it (learning is
    // paced by the server; no step is refused as stale).
    options.wait_for_weights = true;
    options.when_queue_full = tether::QueueFullPolicy::kWait;
    options.backend_factory = [] { return std::make_unique<tether::OnnxRuntimeBackend>(); };
    auto connected = tether::TetherClient::connect(options);
    if (!connected.ok()) {
      std::fprintf(stderr, "memory_cue: %s\n", connected.status().to_string().c_str());
      return 1;
    }
    client = std::move(connected.value());
    if (client->recurrent_state().empty()) {
      std::fprintf(stderr, "memory_cue: the server's model has no memory: it cannot beat chance here\n");
    }
  }
  std::vector<float> obs;
  std::vector<double> action(1, 0.0);
  std::deque<double> last_returns;
  long long episodes = 0, env_steps = 0;
  std::string stopped_by = "max_steps";
  // Training: sampled actions, recorded and sent; the SDK feeds each episode's state.
  while (env_steps < args.max_steps) {
    if (client && client->training_done()) {
      stopped_by = "training_done";
      break;
    }
    std::string episode;
    if (client) {
      auto started = examples::surviving("memory_cue", *client, [&] { return client->start_episode(); });
      if (!started.ok()) {
        stopped_by = "server_gone";
        break;
      }
      episode = started.value();
    }
    game.reset();
    bool done = false;
    double total = 0.0;
    while (!done) {
      game.observe(obs);
      if (client) {
        const tether::Status acted =
            examples::surviving("memory_cue", *client, [&] { return client->get_action(episode, obs, action); });
        if (!acted.ok()) {
          std::fprintf(stderr, "memory_cue: %s\n", acted.to_string().c_str());
          stopped_by = "error";
          break;
        }
      } else {
        action[0] = static_cast<double>(random_actions.next_u64() % static_cast<std::uint64_t>(args.cues));
      }
      const double reward = game.step(static_cast<int>(action[0]), done);
      if (client) client->log_returns(episode, reward);
      total += reward;
      ++env_steps;
    }
    if (stopped_by != "max_steps") break;
    if (client) {
      game.observe(obs);
      examples::surviving("memory_cue", *client, [&] { return client->end_episode(episode, obs); });
    }
    ++episodes;
    last_returns.push_back(total);
    if (last_returns.size() > 100) last_returns.pop_front();
  }
  // Greedy play, nothing recorded: each episode an evaluation episode of its own id, whose memory
  // starts from zeros at its first step (compute_action, §12.4).
  double greedy_total = 0.0;
  int greedy_played = 0;
  if (stopped_by != "error" && stopped_by != "server_gone") {
    for (int e = 0; e < args.greedy_episodes; ++e) {
      const std::string id = "greedy-" + std::to_string(e);
      game.reset();
      bool done = false;
      double total = 0.0;
      while (!done) {
        game.observe(obs);
        if (client) {
          const tether::Status acted = client->compute_action(obs, action, id);
          if (!acted.ok()) {
            std::fprintf(stderr, "memory_cue: %s\n", acted.to_string().c_str());
            stopped_by = "error";
            break;
          }
        } else {
          action[0] = static_cast<double>(random_actions.next_u64() % static_cast<std::uint64_t>(args.cues));
        }
        total += game.step(static_cast<int>(action[0]), done);
      }
      if (stopped_by == "error") break;
      greedy_total += total;
      ++greedy_played;
    }
  }
  const double last_100 = last_returns.empty() ? 0.0
                                               : std::accumulate(last_returns.begin(), last_returns.end(), 0.0) /
                                                     static_cast<double>(last_returns.size());
  std::printf("{\"episodes\": %lld, \"mean_return_last_100\": %.3f, \"greedy_return\": %.3f, \"greedy_episodes\": %d, "
              "\"env_steps\": %lld, \"models_loaded\": %lld, \"random\": %s, \"stopped_by\": \"%s\"}\n",
              episodes, last_100, greedy_played > 0 ? greedy_total / greedy_played : 0.0, greedy_played, env_steps,
              client ? static_cast<long long>(client->models_loaded()) : 0LL, args.random ? "true" : "false",
              stopped_by.c_str());
  std::fflush(stdout);
  if (client) client->close();
  return stopped_by == "error" ? 1 : 0;
}
