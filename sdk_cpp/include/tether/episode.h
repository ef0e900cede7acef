// Episode records (docs/protocol.md §10): building the records a client
// sends (single-agent chunks §10.1, multi-agent records §10.7, groups §9.6,
// centralized-critic rows §9.7), and the server's validation rules (§10.6,
// §10.8), so an SDK can check what it builds with the codes a server sends.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tether/action_mask.h"
#include "tether/env_params.h"
#include "tether/recurrent_state.h"
#include "tether/spaces.h"
#include "tether/status.h"

namespace tether {

/// The agent id a single-agent (v1) record stands for.
inline constexpr const char* kDefaultAgentId = "default_agent";

/// One chunk of one agent's steps, as flat row-major arrays.
struct EpisodeChunk {
  std::vector<float> obs;                  ///< (T+1) rows of the observation space's flat_dim()
  /// [1.4] A byte box's (T+1) rows as bytes (§8.1), in place of `obs`, which
  /// is then empty: how the client keeps an image (a quarter of the floats'
  /// memory). The encoder takes either; its records are the same.
  std::vector<std::uint8_t> obs_bytes;
  std::vector<double> actions;             ///< T rows of the action space's flat_dim() (Box: raw samples)
  std::vector<float> rewards;              ///< T rewards
  std::vector<double> action_logp;         ///< T log-probabilities, or empty to leave them out
  std::vector<float> action_dist_inputs;   ///< T rows of dist_inputs_size(), or empty to leave them out
  bool is_terminated = false;              ///< ended in a terminal state after the last action
  bool is_truncated = false;               ///< cut off after the last action
  std::optional<std::string> episode_id;   ///< the episode's id (single-agent records)
  /// The weights version of every step (protocol 1.3, §10.1): runs of
  /// (version, steps) in step order, covering all T steps; empty to leave
  /// "weights_seq_no_runs" out (every step then has the message's claim).
  std::vector<std::pair<std::int64_t, std::int64_t>> weights_seq_no_runs;
  /// [1.5] The recurrent state the model was fed with the chunk's first
  /// observation (§10.1 "state_in"), tensor after tensor
  /// (recurrent_state_dim() floats); empty for a model without memory.
  std::vector<float> state_in;
  /// [1.6] The logged steps (§10.1 "logged_runs"): runs of (first step,
  /// steps) whose actions the policy did not choose, in step order and apart
  /// (add_logged_step builds them); empty to leave "logged_runs" out (every
  /// step was sampled).
  std::vector<std::pair<std::int64_t, std::int64_t>> logged_runs;
  /// [1.7] The episode's environment parameters (§19.3): the record's
  /// "env_params" (seq, values, and the measure on the record that ends the
  /// episode); empty to leave it out (an episode without values). A
  /// single-agent record's only: an agent entry's is never written.
  RecordEnvParams env_params;

  /// T, the number of steps (rewards).
  std::size_t steps() const noexcept { return rewards.size(); }
  /// Empties the arrays, keeping their capacity.
  void clear() noexcept;
};

/// The largest weights version a "weights_seq_no_runs" run may name (§10.1, 2^31 - 1).
inline constexpr std::int64_t kMaxRunVersion = 2147483647;

/// [1.6] The magnitude from which a double is not finite as float32 (§10.5):
/// 2^128 - 2^103 (about 3.4028235677973366e38), whose float32 rounding is
/// infinite. A step's reward (the rewards logged for it, summed) stays below it.
inline constexpr double kFloat32Overflow = 0x1.ffffffp+127;

/// [1.6] The check a client makes before it adds `reward` to a recorded
/// step's reward `step_sum` (the rewards logged for it so far, summed as
/// doubles, §10.5): NON_FINITE_VALUE, naming the agent (and its `group`, when
/// the step is a group's) and the sum, when |step_sum + reward| would reach
/// kFloat32Overflow (the server would refuse the whole batch that carried
/// it), else ok (allocating nothing). It changes nothing: the caller adds the
/// reward (to the step, the return, ...) only when it is ok. A reward logged
/// before an actor's first action goes to no step and is not checked.
Status check_step_reward(double step_sum, double reward, std::string_view agent_id,
                         std::string_view group_id = std::string_view());

/// [1.6] A step's reward `sum` (|sum| < kFloat32Overflow) as the float32 a
/// record carries, rounded to nearest: a magnitude between float32's largest
/// and kFloat32Overflow gives float32's largest (never a conversion of an
/// out-of-range double, which C++ leaves undefined).
float step_reward_float32(double sum) noexcept;

/// [1.6] Marks step `step` logged in `runs` (§10.1 "logged_runs"), steps
/// added in increasing order: it extends the last run when it follows it
/// (adjacent logged steps are one run), else starts a new one.
void add_logged_step(std::vector<std::pair<std::int64_t, std::int64_t>>& runs, std::int64_t step);

/// [1.6] The logged steps of a record or agent entry of `steps` steps: its
/// "logged_runs" (§10.1) as step indices in order, empty when it is absent,
/// null or []. INVALID_FIELD when it is not [start, n] pairs of JSON integers
/// with start >= 0, n >= 1, each run starting at or after the end of the one
/// before (§10.6 check 20a); EPISODE_LENGTH_MISMATCH when a run reaches past
/// the chunk (check 20b). The validators below make the same check.
Result<std::vector<std::size_t>> read_logged_steps(const nlohmann::json& record, std::size_t steps);

/// The JSON record of a single-agent chunk (§10.1): observations and Box
/// actions nested by the spaces' shapes, discrete actions and a byte box's
/// observations (protocol 1.4, §8.1) as integers. [1.4] A Dict or Tuple
/// space's observations (flat rows, §8.6) as an object of leaf path -> the
/// leaf's T+1 observations. With `attachment` (for a server of 1.4 or later)
/// a byte box's observations, and each leaf of a composite space's, go as
/// tensor objects (§10.9) whose bytes are appended to it (uint8 for a byte
/// box, float32 otherwise); other observations stay JSON numbers.
/// INVALID_ARGUMENT when array sizes do not fit the spaces, or when
/// weights_seq_no_runs is not runs of versions 0..kMaxRunVersion covering the
/// steps; OBS_DTYPE_MISMATCH when a byte box's observation value is not an
/// integer from 0 to 255.
/// [1.5] With `recurrent_state` (the model's state tensors, §9.1) the record
/// carries "state_in" (§10.1) from chunk.state_in, which must then hold
/// recurrent_state_dim() values (INVALID_ARGUMENT otherwise); without it a
/// chunk's state_in must be empty. [1.6] A chunk with logged_runs carries
/// them (INVALID_ARGUMENT for runs out of order, empty, or past its steps);
/// send them only to a server whose PONG announced 1.6 or later (§15).
Result<nlohmann::json> encode_episode(const EpisodeChunk& chunk, const Space& observation_space,
                                      const Space& action_space, std::string* attachment = nullptr,
                                      const std::vector<RecurrentStateSpec>& recurrent_state = {});

/// What a client knows of one module (SET_CONFIG "modules", §9.1).
struct ModuleSpec {
  std::string module_id;                            ///< the key in "modules"
  Space observation_space;                          ///< the policy's input space
  Space action_space;                               ///< the policy's action space
  std::string onnx_input_name = "obs";              ///< model input name
  std::string onnx_output_name = "action_dist_inputs";  ///< model output name
  bool trainable = true;                            ///< whether the server trains it
  std::vector<std::string> value_obs_agents;        ///< centralized critic's agents (§9.7), or empty
  std::optional<ActionMask> action_mask;            ///< [1.4] the leaf masking its actions (§9.1, §11.6), or none
  /// [1.5] The state tensors of its model (§9.1 "recurrent_state"); empty: no memory.
  std::vector<RecurrentStateSpec> recurrent_state;

  /// Parses a module object; INVALID_FIELD when malformed, for a Dict or
  /// Tuple action space, an action_mask that does not fit the spaces, or
  /// [1.5] a recurrent_state refused by recurrent_state_from_json.
  static Result<ModuleSpec> from_json(const std::string& module_id, const nlohmann::json& data);
  /// Flattened size of one observation.
  std::size_t obs_dim() const noexcept { return observation_space.flat_dim(); }
  /// Width V of a value_obs row; 0 when the module has no centralized critic.
  std::size_t value_obs_dim() const noexcept { return obs_dim() * value_obs_agents.size(); }
  /// [1.5] Floats of one actor's recurrent state (0 without memory).
  std::size_t state_dim() const noexcept { return recurrent_state_dim(recurrent_state); }
};

/// One agent's (or group's) entry of a multi-agent record.
struct AgentEntry {
  std::string module;             ///< the module it maps to in this episode
  std::int64_t start_step = 0;    ///< the episode step at which it first acted
  EpisodeChunk chunk;             ///< its steps (chunk.episode_id is not written)
  std::vector<float> value_obs;   ///< (T+1) rows of V numbers for a centralized critic, else empty
};

/// A multi-agent record (§10.7).
struct MultiAgentRecord {
  std::optional<std::string> episode_id;                   ///< the episode (SHOULD be sent)
  bool is_terminated = false;                              ///< the episode ended in a terminal state
  bool is_truncated = false;                               ///< the episode was cut off
  std::vector<std::pair<std::string, AgentEntry>> agents;  ///< agent (or group) id -> entry
  /// [1.7] The episode's environment parameters (§19.3), at the record's top
  /// level; empty to leave "env_params" out.
  RecordEnvParams env_params;
};

/// The JSON of a multi-agent record; each entry is encoded with its
/// module's spaces ([1.5] and its "state_in" from the chunk's state_in for a
/// module with recurrent_state). UNKNOWN_MODULE for a module not in `modules`,
/// INVALID_ARGUMENT for arrays that do not fit, OBS_DTYPE_MISMATCH as
/// encode_episode (tensors appended to `attachment` when given).
Result<nlohmann::json> encode_multi_agent_record(const MultiAgentRecord& record,
                                                 const std::map<std::string, ModuleSpec>& modules,
                                                 std::string* attachment = nullptr);

/// How a group combines its members' rewards (§9.6).
enum class GroupReward { kSum, kMean };

/// Agents that act as one (§9.6).
struct GroupSpec {
  std::string group_id;              ///< the id the protocol sees
  std::vector<std::string> members;  ///< distinct member ids, in order
  GroupReward reward = GroupReward::kSum;  ///< how rewards combine

  /// Parses a group object; INVALID_FIELD when malformed.
  static Result<GroupSpec> from_json(const std::string& group_id, const nlohmann::json& data);
  /// The group's reward for the members' rewards received between two group actions.
  double combine_rewards(const std::vector<double>& rewards) const noexcept;
  /// The group's observation: each member's flat observation, in member
  /// order; INVALID_ARGUMENT naming the members whose observation is missing.
  Status join_observations(const std::map<std::string, std::vector<float>>& member_obs,
                           std::vector<float>& out) const;
  /// Splits a flat group action into equal consecutive member parts, in
  /// member order; INVALID_ARGUMENT if it does not split evenly.
  Status split_action(const std::vector<double>& action, std::vector<std::vector<double>>& parts) const;
};

/// A member's action part as JSON: a bare integer for a one-element part
/// of a discrete action, otherwise an array.
nlohmann::json member_action_to_json(const std::vector<double>& part, bool discrete);

/// The group's spaces from its members' (§9.6): Box observations
/// concatenated; Discrete (start 0) / MultiDiscrete actions as one
/// MultiDiscrete, Box actions as one Box. INVALID_ARGUMENT for mixtures,
/// non-Box observations or a Discrete start other than 0.
Result<std::pair<Space, Space>> group_spaces(const std::vector<Space>& member_obs,
                                             const std::vector<Space>& member_actions);

/// A centralized critic's row (§9.7): each listed agent's latest observation
/// (flat, obs_dim numbers), in list order, zeros for one not observed yet.
/// Writes agents.size() * obs_dim floats to `out`; INVALID_ARGUMENT if an
/// observation has the wrong size.
Status value_obs_row(const std::vector<std::string>& agents,
                     const std::map<std::string, std::vector<float>>& latest_obs, std::size_t obs_dim,
                     float* out);

/// Validates one single-agent record as a server does (§10.6, checks 1-18
/// and [1.6] 20) and returns its steps. Codes as the conformance vectors: INVALID_FIELD,
/// EPISODE_LENGTH_MISMATCH, OBS_SHAPE_MISMATCH, NON_FINITE_VALUE,
/// ACTION_OUT_OF_SPACE, MISSING_ACTION_LOGP, and (protocol 1.4) INVALID_TENSOR
/// and OBS_DTYPE_MISMATCH: "obs" may be a tensor object (§10.9) read from
/// `attachment`, the body's attachment (Message::attachment), or inline; a
/// byte box's observations written as JSON numbers must be integers 0-255
/// (check 11b). [1.4] A Dict or Tuple space's "obs" is an object of its
/// leaves (check 4c: INVALID_FIELD, OBS_LEAF_MISMATCH, EPISODE_LENGTH_MISMATCH
/// and the leaf checks), and with `mask` (the module's action mask) checks
/// 14b-14d: INVALID_ACTION_MASK, ACTION_MASK_EMPTY, ACTION_MASKED. [1.6]
/// "logged_runs" is checked as read_logged_steps reads it (check 20:
/// INVALID_FIELD, EPISODE_LENGTH_MISMATCH). `index` names the record in messages.
Result<std::size_t> validate_episode(const nlohmann::json& record, std::size_t index, const Space& observation_space,
                                     const Space& action_space, bool require_logp,
                                     std::optional<std::string_view> attachment = std::nullopt,
                                     const ActionMask* mask = nullptr);

/// Validates every record of an EPISODES(_AND_GET_STATE) message (all or
/// nothing) and returns the total steps. `attachment` is the body's
/// attachment (Message::attachment), which tensor objects refer to.
Result<std::size_t> validate_episodes(const nlohmann::json& message, const Space& observation_space,
                                      const Space& action_space, bool require_logp,
                                      std::optional<std::string_view> attachment = std::nullopt,
                                      const ActionMask* mask = nullptr);

/// Validates the per-agent arrays of one multi-agent record against each
/// agent's module (§10.8; the mapping, group and per-episode checks need the
/// server's state) and returns its agent steps. Adds UNKNOWN_MODULE and the
/// value_obs checks (OBS_SHAPE_MISMATCH, NON_FINITE_VALUE). An entry's "obs"
/// is checked as a single-agent record's (validate_episode), tensors read
/// from `attachment` and its module's action mask included, and so are its
/// [1.6] "logged_runs", by the entry's own step indices.
Result<std::size_t> validate_multi_agent_record(const nlohmann::json& record, std::size_t index,
                                                const std::map<std::string, ModuleSpec>& modules,
                                                bool require_logp,
                                                std::optional<std::string_view> attachment = std::nullopt);

}  // namespace tether
