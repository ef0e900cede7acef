// Tic-tac-toe against a random legal opponent, through a real server
// (tests/cpp/test_cpp_composite.py starts it): the observation is PettingZoo's
// Dict(action_mask: Box[9], observation: Box[3, 3, 2]) (protocol 1.4, §8.6),
// set leaf by leaf with ObservationLeaves; the server's model masks illegal
// moves inside its graph (§11.6). Prints one JSON line: games, steps, moves
// the mask forbade (must be 0), wins, and what the client delivered.
// Usage: tether_tictactoe_masked --port N [--games N] [--seed N]
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>

#include "tether/client.h"
#include "tether/observation_leaves.h"
#include "tether/onnxruntime_backend.h"

namespace {

constexpr int kLines[8][3] = {{0, 1, 2}, {3, 4, 5}, {6, 7, 8}, {0, 3, 6}, {1, 4, 7}, {2, 5, 8}, {0, 4, 8}, {2, 4, 6}};

// cells: 0 empty, 1 the agent's, 2 the opponent's.
bool wins(const int* cells, int who) {
  for (const auto& line : kLines) {
    if (cells[line[0]] == who && cells[line[1]] == who && cells[line[2]] == who) return true;
  }
  return false;
}

// The agent's view: planes (own, opponent's) per cell, and the legal moves.
void observe(const int* cells, float* board, float* mask) {
  for (int i = 0; i < 9; ++i) {
    board[2 * i] = cells[i] == 1 ? 1.0f : 0.0f;
    board[2 * i + 1] = cells[i] == 2 ? 1.0f : 0.0f;
    mask[i] = cells[i] == 0 ? 1.0f : 0.0f;
  }
}

int fail(const tether::Status& status, const char* what) {
  std::fprintf(stderr, "%s: %s\n", what, status.to_string().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  int port = 5555;
  int games = 200;
  unsigned seed = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--port") == 0) port = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--games") == 0) games = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--seed") == 0) seed = static_cast<unsigned>(std::atoi(argv[i + 1]));
  }
  tether::ClientOptions options;
  options.port = static_cast<std::uint16_t>(port);
  options.seed = seed;
  options.client_name = "tictactoe-cpp";
  options.when_queue_full = tether::QueueFullPolicy::kWait;
  options.backend_factory = [] { return std::make_unique<tether::OnnxRuntimeBackend>(); };
  auto connected = tether::TetherClient::connect(options);
  if (!connected.ok()) return fail(connected.status(), "connect");
  tether::TetherClient& client = *connected.value();
  if (client.action_mask() == nullptr) return fail(tether::Status(), "the server names no action mask");

  tether::ObservationLeaves obs(client.observation_space());
  const int board_leaf = obs.index("observation");
  const int mask_leaf = obs.index("action_mask");
  if (board_leaf < 0 || mask_leaf < 0) return fail(tether::Status(), "the space is not tic-tac-toe's");
  float board[18];
  float mask[9];
  std::mt19937 opponent(seed + 1);
  long steps = 0, forbidden = 0, won = 0;
  for (int game = 0; game < games; ++game) {
    tether::Result<std::string> episode = client.start_episode();
    if (!episode.ok()) return fail(episode.status(), "start_episode");
    int cells[9] = {0};
    if (game % 2 == 1) cells[opponent() % 9] = 2;  // the opponent opens every other game
    for (;;) {
      observe(cells, board, mask);
      obs.set(board_leaf, board, 18);
      obs.set(mask_leaf, mask, 9);
      double action = -1;
      tether::Status acted = client.get_action(episode.value(), obs, &action, 1);
      if (!acted.ok()) return fail(acted, "get_action");
      ++steps;
      const int move = static_cast<int>(action);
      if (move < 0 || move > 8 || mask[move] != 1.0f) {
        ++forbidden;  // a move the mask forbade: the game goes on as if it were passed
      } else {
        cells[move] = 1;
      }
      double reward = 0.0;
      bool over = false;
      if (wins(cells, 1)) {
        reward = 1.0;
        over = true;
        ++won;
      } else {
        int empty[9], free_cells = 0;
        for (int i = 0; i < 9; ++i) {
          if (cells[i] == 0) empty[free_cells++] = i;
        }
        if (free_cells == 0) {
          over = true;  // a draw
        } else {
          cells[empty[opponent() % static_cast<unsigned>(free_cells)]] = 2;
          if (wins(cells, 2)) {
            reward = -1.0;
            over = true;
          } else {
            over = free_cells == 1;  // the opponent filled the last cell
          }
        }
      }
      client.log_returns(episode.value(), reward);
      if (over) {
        observe(cells, board, mask);  // (a full board's mask allows nothing: fine for a final observation)
        obs.set(board_leaf, board, 18);
        obs.set(mask_leaf, mask, 9);
        tether::Result<double> ended = client.end_episode(episode.value(), obs);
        if (!ended.ok()) return fail(ended.status(), "end_episode");
        break;
      }
    }
  }
  tether::Status flushed = client.flush();
  if (!flushed.ok()) return fail(flushed, "flush");
  std::printf(
      "{\"games\": %d, \"steps\": %ld, \"forbidden_moves\": %ld, \"wins\": %ld, \"env_steps_sent\": %lld, "
      "\"models_loaded\": %lld, \"pending_errors\": %zu}\n",
      games, steps, forbidden, won, static_cast<long long>(client.env_steps_sent()),
      static_cast<long long>(client.models_loaded()), client.pending_errors());
  std::fflush(stdout);
  client.close();
  return 0;
}
