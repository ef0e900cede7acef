// A multi-agent frame with logged and policy agents, in C++ (protocol 1.6):
// N CartPoles (cartpole_physics.h) played side by side as the agents
// "cart_0" ... "cart_{N-1}" of one episode. The even carts are played by a
// scripted expert whose actions are given to the frame with
// AgentFrame::log_action; in the same get_action call the odd carts act by
// the policy. One module (the server's default, "*") serves them all, so the
// policy learns from its own samples and by cloning the expert's logged steps
// (bc_coef, docs/demonstrations.md). The port of examples/scripted_team_client.py.
//
//   scripted_team --port 5555 --agents 2 --max-steps 15000 --seed 0
//   scripted_team --random --max-steps 20000      # the odd carts at random, no server
//
// Options: --demo-file PATH writes every episode played to a demonstration
// file (ClientOptions::demo_path). Prints one JSON line when it stops:
// {"episodes", "frames", "policy_return_last", "expert_return_mean", ...}.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "cartpole_physics.h"
#include "flags.h"
#include "surviving.h"
#include "tether/multi_agent_client.h"
#include "tether/onnxruntime_backend.h"

namespace {

using tether_examples::CartPole;

/// Push towards where the pole is falling (its angle plus a share of its angular velocity): 500 every time.
int expert(const float* obs) { return obs[2] + 0.5f * obs[3] > 0.0f ? 1 : 0; }

struct Args {
  std::string host = "127.0.0.1";
  std::uint16_t port = 5555;
  int agents = 2;
  long max_steps = 15000;
  std::uint64_t seed = 0;
  bool random = false;
  std::size_t last = 20;
  std::string demo_file;
};

bool parse(int argc, char** argv, Args& args) {
  examples::Flags flags("scripted_team");
  flags.value("--host", args.host, "H").value("--port", args.port, "P").value("--agents", args.agents, "N");
  flags.value("--max-steps", args.max_steps, "N").value("--seed", args.seed, "S").value("--last", args.last, "N");
  flags.value("--demo-file", args.demo_file, "FILE").toggle("--random", args.random);
  if (!flags.parse(argc, argv)) return false;
  if (args.agents >= 2) return true;
  std::fprintf(stderr, "scripted_team: --agents is at least 2\n");
  return false;
}

double mean_last(const std::vector<double>& values, std::size_t last) {
  if (values.empty()) return 0.0;
  const std::size_t n = std::min(last, values.size());
  return std::accumulate(values.end() - static_cast<std::ptrdiff_t>(n), values.end(), 0.0) / static_cast<double>(n);
}

bool is_expert(int cart) { return cart % 2 == 0; }

}  // namespace

int main(int argc, char** argv) {
  Args args;
  if (!parse(argc, argv, args)) return 2;
  std::unique_ptr<tether::MultiAgentClient> owned;
  if (!args.random) {
    tether::ClientOptions options;
    options.host = args.host;
    options.port = args.port;
    options.seed = args.seed;
    options.client_name = "cpp-scripted-team";
    options.when_queue_full = tether::QueueFullPolicy::kWait;
    options.wait_for_weights = true;  // strict on-policy, as the Python example
    options.demo_path = args.demo_file;
    options.backend_factory = [] { return std::make_unique<tether::OnnxRuntimeBackend>(); };
    auto connected = tether::MultiAgentClient::connect(options);
    if (!connected.ok()) {
      std::fprintf(stderr, "connect failed: %s\n", connected.status().to_string().c_str());
      return 1;
    }
    owned = std::move(connected).value();
  }
  tether::MultiAgentClient* client = owned.get();
  tether::Rng random_actions(args.seed + 7);

  std::vector<CartPole> carts;
  std::vector<std::string> names;
  for (int i = 0; i < args.agents; ++i) {
    carts.emplace_back(args.seed * 1000 + static_cast<std::uint64_t>(i));
    names.push_back("cart_" + std::to_string(i));
  }
  std::vector<std::vector<float>> obs(args.agents, std::vector<float>(4));
  std::vector<double> expert_returns, policy_returns;
  tether::AgentFrame frame, leaving;
  long frames = 0;
  int episodes = 0;
  while (frames < args.max_steps) {
    std::string episode = "episode-" + std::to_string(episodes);
    if (client != nullptr) {
      auto started = examples::surviving("scripted_team", *client, [&] { return client->start_episode(); });
      if (!started.ok()) break;
      episode = started.value();
    }
    std::vector<bool> playing(args.agents, true);
    std::vector<double> totals(args.agents, 0.0);
    for (int i = 0; i < args.agents; ++i) carts[i].reset(obs[i].data());
    int left = args.agents;
    while (left > 0 && frames < args.max_steps) {
      frame.clear();
      for (int i = 0; i < args.agents; ++i) {
        if (!playing[i]) continue;
        frame.add(names[i], obs[i].data(), 4);
        if (is_expert(i)) {
          const double action = expert(obs[i].data());
          frame.log_action(names[i], &action, 1);
        }
      }
      if (client != nullptr) {
        const tether::Status acted =
            examples::surviving("scripted_team", *client, [&] { return client->get_action(episode, frame); });
        if (!acted.ok()) {
          std::fprintf(stderr, "get_action: %s\n", acted.to_string().c_str());
          return 1;
        }
      }
      leaving.clear();
      for (std::size_t k = 0; k < frame.size(); ++k) {
        const int i = std::atoi(frame.agent_id(k).c_str() + 5);  // "cart_<i>"
        const int action = client != nullptr ? static_cast<int>(frame.discrete_action(k))
                           : is_expert(i)    ? expert(obs[i].data())
                                             : static_cast<int>(random_actions.next_u64() % 2);
        bool terminated = false, truncated = false;
        const double reward = carts[i].step(action, obs[i].data(), terminated, truncated);
        totals[i] += reward;
        if (client != nullptr) client->log_returns(episode, names[i], reward);
        if (terminated || truncated) {
          playing[i] = false;
          --left;
          leaving.add(names[i], obs[i].data(), 4);
        }
      }
      if (client != nullptr && leaving.size() > 0) {
        examples::surviving("scripted_team", *client, [&] { return client->end_agents(episode, leaving); });
      }
      ++frames;
    }
    if (client != nullptr) {
      frame.clear();
      for (int i = 0; i < args.agents; ++i) {
        if (playing[i]) frame.add(names[i], obs[i].data(), 4);
      }
      examples::surviving("scripted_team", *client,
                          [&] { return client->end_episode(episode, &frame, /*truncated=*/true); });
    }
    for (int i = 0; i < args.agents; ++i) (is_expert(i) ? expert_returns : policy_returns).push_back(totals[i]);
    ++episodes;
  }
  if (client != nullptr) examples::surviving("scripted_team", *client, [&] { return client->flush(); });
  std::printf("{\"episodes\": %d, \"frames\": %ld, \"policy_return_last\": %.3f, \"expert_return_mean\": %.3f, "
              "\"policy\": \"%s\"}\n",
              episodes, frames, mean_last(policy_returns, args.last), mean_last(expert_returns, expert_returns.size()),
              client != nullptr ? "trained" : "random");
  return 0;
}
