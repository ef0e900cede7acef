// Demonstration files (docs/protocol.md §18, protocol 1.6): whole recorded
// episodes as JSON Lines, which a server trains from later (behavioural
// cloning, §13.7) without the game running.
//
//   std::map<std::string, tether::DemoModuleSpaces> modules;
//   modules["default_policy"] = {observation_space_json, action_space_json, std::nullopt};
//   auto writer = tether::DemoWriter::create("play.jsonl", modules);   // writes the header line
//   writer.value()->step("ep-1", "default_agent", "default_policy", obs, 4, &action, 1, /*logged=*/true);
//   writer.value()->add_reward("ep-1", "default_agent", 1.0);
//   writer.value()->end("ep-1", "default_agent", final_obs, 4, /*terminated=*/true);   // one line, flushed
//   writer.value()->close();                  // episodes still running: written truncated
//
// The first line names every module's spaces; each later line is one
// agent's (or group's) whole episode in the form of a single-agent record
// (§10.1) plus "module", "agent_id" and "episode_id", with "logged_runs"
// when some of its actions were logged. A line is appended and flushed as
// its episode ends, so a crash loses only the episodes still running. Every
// step is checked as a server's reader checks the file (§10.6 checks 1-14d),
// so the writer never writes a line the reader would refuse.
//
// TetherClient and MultiAgentClient write one while they play when
// ClientOptions::demo_path is set. Not thread-safe: one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tether/episode.h"
#include "tether/status.h"

namespace tether {

/// The header's "format" (§18).
inline constexpr const char* kDemoFormat = "tether-demonstrations";
/// The header's "version" (§18).
inline constexpr int kDemoVersion = 1;

/// One module's spaces as a demonstration file's header names them (§18).
struct DemoModuleSpaces {
  nlohmann::json observation_space;       ///< its observation space's JSON form (§8), written as given
  nlohmann::json action_space;            ///< its action space's JSON form, written as given
  std::optional<std::string> action_mask; ///< the leaf path masking its actions (§9.1, §11.6), if any
};

/// Writes a demonstration file (§18): the header when created, then one line
/// per agent episode as it ends. Create with create(); not copyable.
class DemoWriter {
 public:
  /// Creates (or replaces) the file at `path` and writes the header naming
  /// `modules` (at least one). INVALID_FIELD for a module whose spaces or
  /// action mask cannot be used (the message names it), INVALID_ARGUMENT
  /// for no module, or a file that cannot be created or written.
  static Result<std::unique_ptr<DemoWriter>> create(const std::string& path,
                                                    const std::map<std::string, DemoModuleSpaces>& modules);

  /// Closes (see close()).
  ~DemoWriter();
  DemoWriter(const DemoWriter&) = delete;
  DemoWriter& operator=(const DemoWriter&) = delete;

  /// One step of agent `agent_id` (a group's id for a group) in episode
  /// `episode_id`, of module `module`: the flat observation it acted on
  /// (`obs_size` = the observation space's flat_dim(); a Dict or Tuple as its
  /// flat row, §8.6) and the flat action taken (a Discrete action as its
  /// integer; a Box action as recorded, §10.1); `logged`: the policy did not
  /// choose it (§10.1). The agent's first step starts its episode; the
  /// steps are kept until end(). Refused, with nothing kept: UNKNOWN_MODULE,
  /// INVALID_ARGUMENT for wrong sizes or another module than the episode's
  /// first step named, NON_FINITE_VALUE, OBS_DTYPE_MISMATCH (a byte box's
  /// value that is not an integer 0-255), INVALID_ACTION_MASK /
  /// ACTION_MASK_EMPTY for a mask that cannot be acted on, ACTION_OUT_OF_SPACE,
  /// ACTION_MASKED, CLOSED after close().
  Status step(const std::string& episode_id, const std::string& agent_id, const std::string& module,
              const float* obs, std::size_t obs_size, const double* action, std::size_t action_size,
              bool logged = false);

  /// Adds `reward` to the agent's last step (rewards accumulate until its
  /// next step); one before its first step has no step to go to and is
  /// dropped. NON_FINITE_VALUE for a NaN or an infinity, or a reward that
  /// takes the step's sum beyond float32 (§10.5; nothing added), CLOSED after close().
  Status add_reward(const std::string& episode_id, const std::string& agent_id, double reward);

  /// Ends the agent's episode with its final observation: writes its line
  /// (`terminated`, else truncated) and flushes it. An agent that took no
  /// step has nothing to write: ok, nothing written. INVALID_ARGUMENT for a
  /// wrong size, NON_FINITE_VALUE or OBS_DTYPE_MISMATCH for a final
  /// observation no reader takes (the episode stays running: end it again);
  /// INTERNAL when the line could not be written (the file is then closed),
  /// CLOSED after close().
  Status end(const std::string& episode_id, const std::string& agent_id, const float* final_obs,
             std::size_t obs_size, bool terminated);

  /// Forgets the agent's running episode without writing it (e.g. its steps
  /// no longer fit the spaces its module now has); nothing if none runs.
  void discard(const std::string& episode_id, const std::string& agent_id);
  /// Forgets every running episode of `module` without writing it.
  void discard_module(const std::string& module);

  /// Writes the episodes still running, in the order they started, each
  /// truncated (§18): its last step, whose next observation never came, is
  /// left out and its observation ends the episode (an episode of one step
  /// has nothing to write). Then closes the file. Idempotent; INTERNAL when
  /// a line could not be written or the file not closed cleanly.
  Status close();

  /// The file's path.
  const std::string& path() const noexcept { return path_; }
  /// The header's spaces of `module` (parsed), or null when the header does not name it.
  const ModuleSpec* module(const std::string& module) const;
  /// Episode lines written so far.
  std::size_t episodes_written() const noexcept { return written_; }
  /// Agent episodes with steps kept, not ended yet.
  std::size_t running() const noexcept { return running_.size(); }
  /// Whether close() was called (or a write failed).
  bool closed() const noexcept { return file_ == nullptr; }

 private:
  // One agent's running episode.
  struct Running {
    std::string module;
    const ModuleSpec* spec = nullptr;
    std::uint64_t started = 0;  // orders close()'s lines
    std::vector<float> obs;     // one flat row per step
    std::vector<double> actions;
    std::vector<double> rewards;
    std::vector<unsigned char> logged;
    std::size_t steps = 0;
  };
  // (episode id, agent id), looked up without copying the caller's strings.
  using Key = std::pair<std::string, std::string>;
  struct KeyLess {
    using is_transparent = void;
    template <class A, class B>
    bool operator()(const A& a, const B& b) const noexcept {
      const int first = std::string_view(a.first).compare(std::string_view(b.first));
      return first < 0 || (first == 0 && std::string_view(a.second) < std::string_view(b.second));
    }
  };
  struct FileCloser {
    void operator()(std::FILE* file) const noexcept;
  };

  DemoWriter() = default;
  Status write_line(const std::string& episode_id, const std::string& agent_id, const Running& episode,
                    std::size_t steps, const float* final_obs, bool terminated);
  Status write_text(const std::string& text);

  std::string path_;
  std::unique_ptr<std::FILE, FileCloser> file_;
  std::map<std::string, ModuleSpec> modules_;
  std::map<Key, Running, KeyLess> running_;
  std::uint64_t next_start_ = 0;
  std::size_t written_ = 0;
};

}  // namespace tether
