// Catch seen only through a camera, as an external Tether client: the game of
// multiagent/envs/pixel_catch.py written in C++. A ball falls from a random
// column of the top row, one row per step; the paddle moves along the bottom
// row (0 left, 1 stay, 2 right). When the ball reaches the bottom the episode
// ends with +1 if the paddle is under it, -1 if not. The observation is an
// 8x8x1 uint8 image (ball 255, paddle 128, the rest 0), HWC as an engine's
// render target holds it: the server's observation space is that byte box
// (protocol 1.4) and its network a CNN, e.g.
//
//   tether serve --observation-space '{"type": "Box", "shape": [8, 8, 1], "dtype": "uint8", "low": 0, "high": 255}'
//       --action-space '{"type": "Discrete", "n": 3}' --hidden-sizes 64
//       --model '{"encoder": "cnn", "image_shape": [8, 8, 1], "conv": [[16, 3, 1], [32, 3, 1]], "dense": 128}'
//   pixel_catch --port 5555 --seed 3
//   pixel_catch --random --max-steps 20000     # a uniformly random policy, no server
//
// It plays until the server says its run is done (ERROR TRAINING_DONE) or
// --max-steps env steps, then prints one JSON line:
// {"episodes", "catch_rate" (all episodes), "catch_rate_last_100", "env_steps", "models_loaded", "random", "stopped_by"}.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <memory>
#include <numeric>
#include <string>

#include "flags.h"
#include "surviving.h"
#include "tether/client.h"
#include "tether/distributions.h"
#include "tether/onnxruntime_backend.h"

namespace {

constexpr int kSize = 8;
constexpr std::uint8_t kBall = 255;
constexpr std::uint8_t kPaddle = 128;

/// The catch game; its camera image is the engine's own uint8 buffer.
class PixelCatch {
 public:
  explicit PixelCatch(std::uint64_t seed) : rng_(seed) {}

  void reset() {
    ball_row_ = 0;
    ball_column_ = static_cast<int>(rng_.next_u64() % kSize);
    paddle_ = static_cast<int>(rng_.next_u64() % kSize);
    render();
  }
  /// Moves the paddle (0 left, 1 stay, 2 right) and the ball; returns the reward.
  double step(int action, bool& done) {
    paddle_ = std::min(kSize - 1, std::max(0, paddle_ + action - 1));
    ++ball_row_;
    done = ball_row_ == kSize - 1;
    render();
    return done ? (paddle_ == ball_column_ ? 1.0 : -1.0) : 0.0;
  }
  const std::array<std::uint8_t, kSize * kSize>& image() const noexcept { return image_; }

 private:
  void render() {
    image_.fill(0);
    image_[(kSize - 1) * kSize + paddle_] = kPaddle;
    image_[ball_row_ * kSize + ball_column_] = kBall;
  }
  std::array<std::uint8_t, kSize * kSize> image_{};  // HWC with one channel
  int ball_row_ = 0, ball_column_ = 0, paddle_ = 0;
  tether::Rng rng_;
};

struct Args {
  std::string host = "127.0.0.1";
  std::uint16_t port = 5555;
  long long max_steps = 1000000;
  std::uint64_t seed = 0;
  bool random = false;
};

bool parse_args(int argc, char** argv, Args& args) {
  examples::Flags flags("pixel_catch");
  flags.value("--host", args.host, "H").value("--port", args.port, "P").value("--max-steps", args.max_steps, "N");
  flags.value("--seed", args.seed, "S").toggle("--random", args.random);
  return flags.parse(argc, argv);
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  if (!parse_args(argc, argv, args)) return 2;
  PixelCatch game(args.seed * 7919u + 1u);
  std::deque<double> last_catches;  // 1 per caught ball of the last 100 episodes
  long long episodes = 0, env_steps = 0, caught = 0;
  std::string stopped_by = "max_steps";
  std::unique_ptr<tether::TetherClient> client;
  tether::Rng random_actions(args.seed);
  if (!args.random) {
    tether::ClientOptions options;
    options.host = args.host;
    options.port = args.port;
    options.client_name = "pixel-catch-cpp-" + std::to_string(args.seed);
    options.seed = args.seed;
    // This game steps in microseconds, far faster than the learner trains: after each batch it waits
    // for the weights that answer it, so every step is acted by the current policy (none is refused
    // as stale) and learning is paced by the server.
    options.wait_for_weights = true;
    options.when_queue_full = tether::QueueFullPolicy::kWait;
    options.backend_factory = [] { return std::make_unique<tether::OnnxRuntimeBackend>(); };
    auto connected = tether::TetherClient::connect(options);
    if (!connected.ok()) {
      std::fprintf(stderr, "pixel_catch: %s\n", connected.status().to_string().c_str());
      return 1;
    }
    client = std::move(connected.value());
  }
  // The image as the model's row: its bytes as floats (the SDK checks they are 0-255 and sends them
  // as bytes; the model takes them as uint8 and scales them inside its graph).
  float row[kSize * kSize];
  double action[1] = {1};
  while (env_steps < args.max_steps) {
    if (client && client->training_done()) {
      stopped_by = "training_done";
      break;
    }
    std::string episode;
    if (client) {
      auto started = examples::surviving("pixel_catch", *client, [&] { return client->start_episode(); });
      if (!started.ok()) {
        stopped_by = "server_gone";
        break;
      }
      episode = started.value();
    }
    game.reset();
    bool done = false;
    double reward = 0;
    while (!done) {
      if (client) {
        std::copy(game.image().begin(), game.image().end(), row);
        const tether::Status acted = examples::surviving(
            "pixel_catch", *client, [&] { return client->get_action(episode, row, kSize * kSize, action, 1); });
        if (!acted.ok()) {
          std::fprintf(stderr, "pixel_catch: %s\n", acted.to_string().c_str());
          stopped_by = "error";
          break;
        }
      } else {
        action[0] = static_cast<double>(random_actions.next_u64() % 3);
      }
      reward = game.step(static_cast<int>(action[0]), done);
      if (client) client->log_returns(episode, reward);
      ++env_steps;
    }
    if (stopped_by != "max_steps") break;
    if (client) {
      std::copy(game.image().begin(), game.image().end(), row);
      examples::surviving("pixel_catch", *client, [&] { return client->end_episode(episode, row, kSize * kSize); });
    }
    ++episodes;
    caught += reward > 0 ? 1 : 0;
    last_catches.push_back(reward > 0 ? 1.0 : 0.0);
    if (last_catches.size() > 100) last_catches.pop_front();
  }
  const double rate = last_catches.empty() ? 0.0
                                           : std::accumulate(last_catches.begin(), last_catches.end(), 0.0) /
                                                 static_cast<double>(last_catches.size());
  std::printf("{\"episodes\": %lld, \"catch_rate\": %.3f, \"catch_rate_last_100\": %.3f, \"env_steps\": %lld, \"models_loaded\": %lld, "
              "\"random\": %s, \"stopped_by\": \"%s\"}\n",
              episodes, episodes > 0 ? static_cast<double>(caught) / static_cast<double>(episodes) : 0.0, rate,
              env_steps, client ? static_cast<long long>(client->models_loaded()) : 0LL,
              args.random ? "true" : "false", stopped_by.c_str());
  std::fflush(stdout);
  if (client) client->close();
  return stopped_by == "error" ? 1 : 0;
}
