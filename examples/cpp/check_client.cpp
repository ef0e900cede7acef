// The client program `tether check-client` runs against (docs/check-client.md),
// written with the C++ SDK.
//
// It plays the checker's "echo env" through a TetherClient: the spaces, ONNX
// names and model come from the server, the env executes exactly the action
// the SDK returns, and every server refusal the SDK reports is printed and
// survived: a call that returns one did nothing else, and is made again
// (surviving.h). After --steps env steps it stays idle for --idle-s seconds
// (the SDK keeps the connection alive with heartbeats), then closes.
//
//   tether check-client --port 5556 &
//   check_client --port 5556 [--host H] [--steps 300] [--idle-s 3] [--auth-token T] [--seed S]
//
// Exit status: 0 when it played every step, or stopped early because the
// server said its run is done (ERROR TRAINING_DONE: the normal end of
// training, not a failure); 1 when the SDK gave up (a failed connection is
// not something this program may paper over).
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "flags.h"
#include "surviving.h"
#include "tether/client.h"
#include "tether/onnxruntime_backend.h"

namespace {

constexpr int kEpisodeLength = 10;

/// obs = [t / 10, the action the env executed last, 1]; reward = that action; 10 steps.
struct EchoEnv {
  int t = 0;
  void reset(float* obs) {
    t = 0;
    obs[0] = 0.0f;
    obs[1] = 0.0f;
    obs[2] = 1.0f;
  }
  double step(double action, float* obs, bool& done) {
    const double executed = action;  // as given: the SDK already clipped it
    ++t;
    obs[0] = static_cast<float>(t) / kEpisodeLength;
    obs[1] = static_cast<float>(executed);
    obs[2] = 1.0f;
    done = t == kEpisodeLength;
    return executed;
  }
};

// Errors of the server no call returned (they came while no call was made).
void report_refusals(tether::TetherClient& client) {
  for (tether::Status error = client.take_error(); !error.ok(); error = client.take_error()) {
    std::printf("check_client: server reported %s\n", error.to_string().c_str());
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  tether::ClientOptions options;
  options.port = 5556;
  options.client_name = "check-client-cpp";
  options.reconnect_timeout_s = 30.0;
  // The checker answers slowly on purpose and must see every batch: wait for room
  // in the send queue instead of dropping the oldest batches.
  options.when_queue_full = tether::QueueFullPolicy::kWait;
  options.backend_factory = [] { return std::make_unique<tether::OnnxRuntimeBackend>(); };
  long long steps_wanted = 300;
  double idle_s = 3.0;
  std::uint64_t seed = 0;
  examples::Flags flags("check_client");
  flags.value("--host", options.host, "H").value("--port", options.port, "P").value("--steps", steps_wanted, "N");
  flags.value("--idle-s", idle_s, "S").value("--auth-token", options.auth_token, "T").value("--seed", seed, "S");
  if (!flags.parse(argc, argv)) return 2;
  options.seed = seed;

  tether::Result<std::unique_ptr<tether::TetherClient>> connected = tether::TetherClient::connect(options);
  if (!connected.ok()) {
    std::fprintf(stderr, "check_client: %s\n", connected.status().to_string().c_str());
    return 1;
  }
  tether::TetherClient& client = *connected.value();
  EchoEnv env;
  float obs[3];
  double action[1];
  long long steps = 0;
  while (steps < steps_wanted && !client.training_done()) {
    env.reset(obs);
    tether::Result<std::string> episode =
        examples::surviving("check_client", client, [&] { return client.start_episode(); });
    if (!episode.ok()) {
      std::fprintf(stderr, "check_client: %s\n", episode.status().to_string().c_str());
      return 1;
    }
    bool done = false;
    while (!done) {
      tether::Status acted = examples::surviving(
          "check_client", client, [&] { return client.get_action(episode.value(), obs, 3, action, 1); });
      if (!acted.ok()) {
        std::fprintf(stderr, "check_client: %s\n", acted.to_string().c_str());
        return 1;
      }
      const double reward = env.step(action[0], obs, done);
      client.log_returns(episode.value(), reward);
      ++steps;
    }
    tether::Result<double> ended = examples::surviving(
        "check_client", client, [&] { return client.end_episode(episode.value(), obs, 3, false); });
    if (!ended.ok()) {
      std::fprintf(stderr, "check_client: %s\n", ended.status().to_string().c_str());
      return 1;
    }
  }
  if (!client.training_done()) std::this_thread::sleep_for(std::chrono::duration<double>(idle_s));
  report_refusals(client);
  client.close();
  std::printf("played %lld steps (reconnects %lld, heartbeats %lld, stopped_by %s)\n", steps,
              static_cast<long long>(client.reconnects()), static_cast<long long>(client.heartbeats_sent()),
              client.training_done() ? "training_done" : "steps");
  return 0;
}
