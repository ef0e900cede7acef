// CartPole-v1 as an external Tether client: the environment runs here (the
// physics of gymnasium's CartPole-v1, written in C++), actions come from the
// local ONNX model the server sends, experience goes to the server.
//
//   cartpole --host 127.0.0.1 --port 5555 --max-steps 300000 --seed 0
//   cartpole --random --max-steps 20000          # a uniformly random policy, no server
//
//   cartpole --offline-policy run/offline_policy.json --demo-file play.jsonl --max-steps 20000
//                                                  # a server's offline policy file, no server (§20):
//                                                  # nothing is sent; every episode goes to play.jsonl
//
// Options: --reconnect-timeout S (give up once the server has been gone S
// seconds, default 5), --when-queue-full wait|drop_oldest (default wait: the
// engine waits for room in the send queue instead of dropping batches).
//
// It stops after --max-steps env steps ("stopped_by": "max_steps"), when the
// server says its run is done (ERROR TRAINING_DONE, e.g. a `tether serve
// --stop-at-return 450` that reached its target: "training_done", the normal
// end, with the server's "summary"), when the server goes away for longer
// than --reconnect-timeout ("server_gone"), or at the end of the current
// episode after Ctrl-C (SIGINT, "interrupted"), and prints one JSON line
// (an error of the server, e.g. a refused batch, is printed to stdout and the
// call that returned it made again: surviving.h):
// {"episodes", "mean_return_last_100", "env_steps", "env_steps_sent", "reconnects",
//  "max_act_ms" (the longest get_action call), ..., "stopped_by"[, "summary"]}.
#include <algorithm>
#include <chrono>
#include <csignal>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "cartpole_physics.h"
#include "flags.h"
#include "surviving.h"
#include "tether/client.h"
#include "tether/distributions.h"
#include "tether/messages.h"
#include "tether/onnxruntime_backend.h"

namespace {

using tether_examples::CartPole;

struct Args {
  std::string host = "127.0.0.1";
  std::uint16_t port = 5555;
  long long max_steps = 300000;
  std::uint64_t seed = 0;
  bool random = false;
  double reconnect_timeout_s = 5.0;
  bool drop_oldest = false;
  std::string offline_policy;  // (§20) play with this file and no server
  std::string demo_file;       // (§18) write every episode here
};

bool parse_args(int argc, char** argv, Args& args) {
  std::string when_queue_full = "wait";
  examples::Flags flags("cartpole");
  flags.value("--host", args.host, "H").value("--port", args.port, "P").value("--max-steps", args.max_steps, "N");
  flags.value("--seed", args.seed, "S").toggle("--random", args.random);
  flags.value("--reconnect-timeout", args.reconnect_timeout_s, "S");
  flags.choice("--when-queue-full", when_queue_full, {"wait", "drop_oldest"});
  flags.value("--offline-policy", args.offline_policy, "FILE").value("--demo-file", args.demo_file, "FILE");
  if (!flags.parse(argc, argv)) return false;
  args.drop_oldest = when_queue_full == "drop_oldest";
  return true;
}

struct Tally {
  std::deque<double> last_returns;
  long long episodes = 0;
  long long env_steps = 0;
  void add(double episode_return) {
    ++episodes;
    last_returns.push_back(episode_return);
    if (last_returns.size() > 100) last_returns.pop_front();
  }
  double mean() const {
    if (last_returns.empty()) return 0.0;
    return std::accumulate(last_returns.begin(), last_returns.end(), 0.0) / static_cast<double>(last_returns.size());
  }
};

// Set by SIGINT: finish the current episode, then report.
volatile std::sig_atomic_t interrupted = 0;

extern "C" void on_sigint(int) { interrupted = 1; }

}  // namespace

int main(int argc, char** argv) {
  Args args;
  if (!parse_args(argc, argv, args)) return 2;
  std::signal(SIGINT, on_sigint);
  const auto started = std::chrono::steady_clock::now();
  CartPole env(args.seed * 7919u + 1u);
  Tally tally;
  float obs[4];
  std::string stopped_by = "max_steps";
  std::unique_ptr<tether::TetherClient> client;
  int status = 0;
  double max_act_s = 0.0;  // the longest get_action: what one frame waited at worst

  if (args.random) {
    tether::Rng rng(args.seed);
    while (tally.env_steps < args.max_steps) {
      env.reset(obs);
      double total = 0.0;
      bool terminated = false, truncated = false;
      while (!terminated && !truncated) {
        total += env.step(static_cast<int>(rng.next_u64() & 1u), obs, terminated, truncated);
        ++tally.env_steps;
      }
      tally.add(total);
    }
  } else {
    tether::ClientOptions options;
    options.host = args.host;
    options.port = args.port;
    options.client_name = "cartpole-cpp-" + std::to_string(args.seed);
    options.seed = args.seed;
    options.reconnect_timeout_s = args.reconnect_timeout_s;
    // This C++ CartPole steps in microseconds, far faster than a learner trains:
    // with kWait the engine waits for room in the send queue, so every step is
    // delivered and learning is paced by the server (kDropOldest would play on
    // and drop most batches unsent).
    options.when_queue_full = args.drop_oldest ? tether::QueueFullPolicy::kDropOldest : tether::QueueFullPolicy::kWait;
    options.backend_factory = [] { return std::make_unique<tether::OnnxRuntimeBackend>(); };
    options.offline_policy = args.offline_policy;
    options.demo_path = args.demo_file;
    tether::Result<std::unique_ptr<tether::TetherClient>> connected = tether::TetherClient::connect(options);
    if (!connected.ok()) {
      std::fprintf(stderr, "cartpole: %s\n", connected.status().to_string().c_str());
      return 1;
    }
    client = std::move(connected.value());
    double action[1];
    while (tally.env_steps < args.max_steps && stopped_by == "max_steps") {
      if (interrupted) {
        stopped_by = "interrupted";
        break;
      }
      if (client->training_done()) {
        stopped_by = "training_done";  // the server reached its target (or step budget) and said so
        break;
      }
      tether::Result<std::string> episode =
          examples::surviving("cartpole", *client, [&] { return client->start_episode(); });
      if (!episode.ok()) {
        stopped_by = "server_gone";
        break;
      }
      env.reset(obs);
      double total = 0.0;
      bool terminated = false, truncated = false;
      while (!terminated && !truncated) {
        const auto act_started = std::chrono::steady_clock::now();
        tether::Status acted = examples::surviving(
            "cartpole", *client, [&] { return client->get_action(episode.value(), obs, 4, action, 1); });
        max_act_s = std::max(max_act_s,
                             std::chrono::duration<double>(std::chrono::steady_clock::now() - act_started).count());
        if (!acted.ok()) {
          stopped_by = acted.code() == tether::ErrorCode::kConnectionFailed ? "server_gone" : "error";
          if (stopped_by == "error") {
            std::fprintf(stderr, "cartpole: %s\n", acted.to_string().c_str());
            status = 1;
          }
          break;
        }
        double reward = env.step(static_cast<int>(action[0]), obs, terminated, truncated);
        client->log_returns(episode.value(), reward);
        total += reward;
        ++tally.env_steps;
      }
      if (stopped_by != "max_steps") break;
      examples::surviving("cartpole", *client, [&] { return client->end_episode(episode.value(), obs, 4, truncated); });
      tally.add(total);
    }
  }
  const double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  // The run's summary the server sent with TRAINING_DONE (JSON text), when it did.
  std::optional<tether::TrainingSummary> summary;
  if (client) summary = client->training_summary();
  const std::string summary_field = summary ? ", \"summary\": " + tether::encode_message(summary->json) : std::string();
  std::printf(
      "{\"episodes\": %lld, \"mean_return_last_100\": %.2f, \"env_steps\": %lld, \"env_steps_sent\": %lld, "
      "\"reconnects\": %lld, \"models_loaded\": %lld, \"batches_dropped\": %lld, \"batches_unsent_at_end\": %lld, "
      "\"max_act_ms\": %.3f, \"wall_s\": %.2f, \"random\": %s, \"offline\": %s, \"stopped_by\": \"%s\"%s}\n",
      tally.episodes, tally.mean(), tally.env_steps,
      client ? static_cast<long long>(client->env_steps_sent()) : 0LL,
      client ? static_cast<long long>(client->reconnects()) : 0LL,
      client ? static_cast<long long>(client->models_loaded()) : 0LL,
      client ? static_cast<long long>(client->batches_dropped()) : 0LL,
      client ? static_cast<long long>(client->batches_unsent_at_end()) : 0LL, max_act_s * 1e3, wall_s,
      args.random ? "true" : "false", client && client->offline() ? "true" : "false", stopped_by.c_str(),
      summary_field.c_str());
  std::fflush(stdout);
  if (client) client->close();
  return status;
}
