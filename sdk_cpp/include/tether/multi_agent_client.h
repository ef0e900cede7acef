// MultiAgentClient: many agents, several modules, one connection (the C++
// counterpart of sdk_python/multi_agent_client.py).
//
//   tether::ClientOptions options;                     // as for TetherClient
//   options.backend_factory = [] { return std::make_unique<tether::OnnxRuntimeBackend>(); };
//   auto client = tether::MultiAgentClient::connect(options).value();
//   std::string episode = client->start_episode().value();
//   tether::AgentFrame frame;                          // reuse it, frame after frame
//   frame.clear();
//   frame.add("red_0", obs0, obs0_size);               // the agents acting now (group members included)
//   frame.add("blue_0", obs1, obs1_size);
//   frame.log_action("blue_0", &taken, 1);             // [1.6] an action the policy did not choose (optional)
//   client->get_action(episode, frame);                // one inference Run per module
//   const double* a0 = frame.action(0);                // frame.action_size(0) numbers
//   client->log_returns(episode, "red_0", 1.0);
//   client->end_agents(episode, leaving_frame);        // agents that leave (final observations)
//   auto returns = client->end_episode(episode);       // per actor (agent or group) returns
//
// Mapping: a new agent (or group) id is mapped to its module when it first
// acts, locally with SET_CONFIG's policy_mapping rules (§9.3), or, when the
// server maps with a function ("policy_mapping": null), with one MAP_AGENTS
// request per frame in which new agents appear: the only network wait of
// get_action besides wait_for_weights, bounded by response_timeout_s (TIMEOUT).
// The answers are kept for the rest of their episode (§7.10; compute_actions
// asks once per episode id and agent too), forgotten when the episode ends or
// the client reconnects; at most kMaxMappedActors are kept (the oldest
// episodes' are forgotten first, and asked for again if needed). A game that
// knows an episode's agents ahead (a turn-based game's seats) maps them all
// with map_agents() after start_episode(): one MAP_AGENTS instead of one per
// seat's first turn.
//
// Groups (§9.6) are hidden from the engine: the engine puts the members in
// the frame; the client concatenates their observations in member order,
// acts once for the group with the group's module, and writes each member its
// equal part of the group's action. A member's reward goes to the group
// (divided by the member count for "mean"). A group leaves as a whole: ending
// any member ends the group (the others end with their latest observation).
//
// Agents join at any frame and act at their own rates: an agent acts when it
// is in the frame. Hierarchical sub-agents are agents too: a new id joins
// when it first acts, retire_agent() ends one. An agent (or group member)
// that left cannot act again in that episode (INVALID_ARGUMENT).
//
// Sending: every steps_per_batch() complete agent steps are cut into
// multi-agent records (§10.7; each agent's latest step is held back until
// its next observation or its end) and handed to the background I/O thread,
// as for TetherClient (the cut hands over the recorded rows as they are; the
// I/O thread builds the records, once the call that cut has acted); a batch
// claims, per module, the oldest weights version its steps used (§7.6), and
// an agent entry whose steps used more than one version carries each step's
// (weights_seq_no_runs, §10.1) when it goes on the connection those versions
// were learned on. New models (per module) are swapped in between two
// get_action calls. Holding back (§13.2): a server may ask the client to
// record only a share of its training episodes (SET_STATE record_share),
// drawn once per episode for all its agents; the others are
// played as usual but never sent (episodes_held_back()), and a batch still
// goes every steps_per_batch() agent steps played, with no records if need be
// (env_steps_per_sample, or fewer when the server asks for smaller, fresher
// batches with SET_STATE steps_per_batch).
//
// Errors: nothing throws. A refusal by the server (an ERROR answering a
// batch, e.g. DATA_REFUSED or ACTION_OUT_OF_SPACE), a timeout or a model that
// fails to load is returned, once, by the next call of start_episode,
// get_action, compute_actions, end_agents, retire_agent, end_episode or flush
// (as the Python and C# SDKs raise it): that call does nothing else, and the
// engine may simply make it again. Several errors come one per call, oldest
// first. log_returns never returns one. flush() returns an error that came
// while it waited; get_action one that came while it cut a batch (nothing of
// the frame is acted or recorded). take_error() returns only errors no call
// returned yet; last_error() keeps the newest. Once the link gave up for good
// every call returns fatal_error().
//
// End of training (protocol 1.3, §6.6): when the server's run is done it says
// so (ERROR TRAINING_DONE with the run's summary) and stops. That is the
// normal end, not an error: training_done() turns true and training_summary()
// holds the summary; fatal_error() stays ok; the client never reconnects; the
// batches not yet answered and the steps not yet sent are discarded
// (batches_unsent_at_end()). Every call goes on: get_action acts with the
// last models, nothing is recorded or sent any more, flush() returns ok at
// once. Actors already mapped keep their module; a server that maps with a
// function cannot map new ones any more: a frame with an actor not mapped
// yet in its episode fails with TRAINING_DONE, as MAP_AGENTS then does.
//
// Thread safety: one engine thread at a time calls start_episode,
// get_action, compute_actions, log_returns, end_agents, retire_agent,
// end_episode, flush, take_error and the accessors (the client is not
// internally locked for them); reconnects(), batches_dropped(),
// steps_refused_stale(), record_share(), heartbeats_sent(), redirects(),
// server_address(), training_done(), training_summary(),
// batches_unsent_at_end() and client_session() may be read from any thread;
// close() and the destructor must not race with the engine calls. An
// AgentFrame belongs to the thread that fills it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tether/client_base.h"
#include "tether/distributions.h"
#include "tether/episode.h"
#include "tether/policy_mapping.h"
#include "tether/server_link.h"
#include "tether/spaces.h"
#include "tether/status.h"

namespace tether {

/// The agents acting at one moment of one episode: their ids and flat
/// observations in, their actions out (in the same order). Reuse one frame:
/// clear() keeps every buffer's capacity, so steady-state frames allocate
/// nothing (ids up to the string's small-buffer size, ~15 chars, never do),
/// and a frame that names the same agents in the same order as the one
/// before it is known to get_action without comparing their ids.
class AgentFrame {
 public:
  /// An empty frame.
  AgentFrame() = default;

  /// Forgets the agents (keeps the capacity).
  void clear() noexcept;
  /// Preallocates room for `agents` agents with `obs_values` observation numbers in all.
  void reserve(std::size_t agents, std::size_t obs_values);

  /// Adds an agent (or a group member) with its flat observation (copied);
  /// returns its index. For end_agents, `truncated` marks an end by time limit.
  std::size_t add(const std::string& agent_id, const float* obs, std::size_t obs_size, bool truncated = false);
  /// [1.4] add() for an observation given as bytes (a byte box's, §8.1:
  /// a camera image as the engine holds it), kept as their values 0-255.
  std::size_t add(const std::string& agent_id, const std::uint8_t* obs, std::size_t obs_size, bool truncated = false);
  /// add() with no observation values (zeros; as add(id, (const float*)nullptr, ...)).
  std::size_t add(const std::string& agent_id, std::nullptr_t, std::size_t obs_size, bool truncated = false) {
    return add(agent_id, static_cast<const float*>(nullptr), obs_size, truncated);
  }
  /// Adds an agent and returns where to write its `obs_size` observation
  /// values (valid until the next add or clear).
  float* add_uninitialized(const std::string& agent_id, std::size_t obs_size, bool truncated = false);

  /// Number of agents in the frame.
  std::size_t size() const noexcept { return count_; }
  /// Whether the frame holds no agent.
  bool empty() const noexcept { return count_ == 0; }
  /// Agent `i`'s id.
  const std::string& agent_id(std::size_t i) const noexcept { return ids_[i]; }
  /// Agent `i`'s observation (obs_size(i) floats).
  const float* obs(std::size_t i) const noexcept { return obs_.data() + obs_offsets_[i]; }
  /// Agent `i`'s observation size.
  std::size_t obs_size(std::size_t i) const noexcept { return obs_offsets_[i + 1] - obs_offsets_[i]; }
  /// Whether agent `i` was added as truncated (end_agents).
  bool truncated(std::size_t i) const noexcept { return truncated_[i] != 0; }

  /// Agent `i`'s action after get_action/compute_actions (action_size(i)
  /// numbers: a discrete action as its integer value, a Box action clipped
  /// into its box; a group member's equal part of the group's action).
  /// nullptr while the frame holds no computed action for agent `i` (before
  /// a successful call, after add/clear, or `i` out of range).
  const double* action(std::size_t i) const noexcept {
    return action_offsets_.size() > i + 1 ? actions_.data() + action_offsets_[i] : nullptr;
  }
  /// Agent `i`'s action size (0 before an action was computed).
  std::size_t action_size(std::size_t i) const noexcept {
    return action_offsets_.size() > i + 1 ? action_offsets_[i + 1] - action_offsets_[i] : 0;
  }
  /// Agent `i`'s first action number as an integer (a Discrete action, or a member's one-element part).
  std::int64_t discrete_action(std::size_t i) const noexcept;

  /// [1.6] Logs the action actor `actor_id` took without the policy in this
  /// frame (a human player, a scripted bot, another controller: RLlib's
  /// log_action): `actor_id` is an agent of the frame, or a group's id (its
  /// members in the frame) with the group's joint action in its module's
  /// action space (a member is never logged alone); `action_size` numbers (a
  /// Discrete action as its integer value; a Box action as executed, recorded
  /// as given). MultiAgentClient::get_action then records that actor's step
  /// as logged (§10.1) and gives it this action back (a group's members
  /// their parts), while the other agents act by the policy. Copied; kept
  /// until clear() (add() keeps it). Checked by get_action.
  void log_action(const std::string& actor_id, const double* action, std::size_t action_size);
  /// [1.6] Actors given a logged action in this frame.
  std::size_t logged_count() const noexcept { return logged_count_; }
  /// [1.6] The `k`-th logged actor's id.
  const std::string& logged_actor(std::size_t k) const noexcept { return logged_ids_[k]; }
  /// [1.6] The `k`-th logged action (logged_action_size(k) numbers).
  const double* logged_action(std::size_t k) const noexcept { return logged_values_.data() + logged_offsets_[k]; }
  /// [1.6] The `k`-th logged action's size.
  std::size_t logged_action_size(std::size_t k) const noexcept { return logged_offsets_[k + 1] - logged_offsets_[k]; }

 private:
  friend class MultiAgentClient;
  std::vector<std::string> ids_;            // ids_[0..count_) are live; the rest keep their capacity
  std::vector<float> obs_;                  // every observation, flat
  std::vector<std::size_t> obs_offsets_ = std::vector<std::size_t>(1, 0);  // count_ + 1 entries
  std::vector<unsigned char> truncated_;
  std::vector<double> actions_;             // every action, flat
  std::vector<std::size_t> action_offsets_;  // count_ + 1 entries once actions are written
  std::size_t count_ = 0;
  // [1.6] Logged actions: actor ids (logged_ids_[0..logged_count_) live, the
  // rest keep their capacity) and their values, flat.
  std::vector<std::string> logged_ids_;
  std::vector<double> logged_values_;
  std::vector<std::size_t> logged_offsets_ = std::vector<std::size_t>(1, 0);
  std::size_t logged_count_ = 0;
  // Each fill (the agents added since a clear()) has a serial unique in the
  // process (0: never cleared). same_ids_: the ids so far are the previous
  // fill's first ones, in order (then each add left its string untouched).
  std::uint64_t fill_ = 0;
  std::uint64_t last_fill_ = 0;
  std::size_t last_count_ = 0;
  bool same_ids_ = false;

  // Whether the frame names the `n` agents fill `fill` named, in the same order.
  bool same_ids_as(std::uint64_t fill, std::size_t n) const noexcept {
    return fill != 0 && count_ == n && (fill_ == fill || (same_ids_ && last_fill_ == fill));
  }
};

/// A connected multi-agent client (modules, policy mapping, groups). Create
/// with connect(); not copyable.
class MultiAgentClient final : public ClientBase {
 public:
  /// Connects (retrying until reconnect_timeout_s), handshakes and loads every
  /// module's model. Fails with CONNECTION_FAILED, AUTH_FAILED,
  /// VERSION_MISMATCH, TIMEOUT, INVALID_FIELD (a SET_CONFIG without modules, or
  /// with rules or groups this client cannot parse), INVALID_ARGUMENT (no backend_factory),
  /// TRAINING_DONE (the server's run ended before the handshake did).
  static Result<std::unique_ptr<MultiAgentClient>> connect(ClientOptions options);

  /// Stops the I/O thread (undelivered experience is dropped: flush() first).
  ~MultiAgentClient();

  /// Begins an episode and returns its id (`episode_id`, or a new random one
  /// when empty); INVALID_ARGUMENT if it is already running. With
  /// `training_enabled` false its steps are never sent. A training episode
  /// is recorded with the probability the server's record_share gives (one
  /// draw of the seeded generator for all its agents, made only when the
  /// share is below 1); one that is not is held back: played alike, never
  /// sent (§13.2).
  Result<std::string> start_episode(const std::string& episode_id = std::string(), bool training_enabled = true);

  /// Actions for the agents in `frame` (group members included), written
  /// back into the frame in the same order. Maps new agents (rules, or one
  /// MAP_AGENTS), records each actor's observation (and value_obs row),
  /// runs ONE inference per module for all its actors in the frame, samples
  /// (raw Box sample recorded, clipped action to the engine). Never waits for
  /// the network except for MAP_AGENTS, room (kWait) or weights
  /// (wait_for_weights). An error of the server not returned yet (nothing of
  /// the frame is acted or recorded: call again), INVALID_ARGUMENT (unknown
  /// episode, an agent twice, an agent that left, a group with members
  /// missing, wrong observation size), NON_FINITE_VALUE, UNMAPPED_AGENT / UNKNOWN_MODULE, TIMEOUT (MAP_AGENTS),
  /// TRAINING_DONE (MAP_AGENTS once training is done), NOT_READY (a module
  /// without a model), INFERENCE_FAILED, or the fatal status.
  /// On an error nothing of the frame is recorded.
  /// [1.6] Actors given a logged action (AgentFrame::log_action) are logged
  /// steps (§10.1; Python's get_action(..., logged_actions) and log_action):
  /// their module's model is still evaluated on their observation (its dist
  /// inputs recorded; a model with memory advances their state, §12.4), the
  /// given action is recorded with 0 as its action_logp and written back as
  /// their action, and their agent entries list the step in logged_runs.
  /// Refused, with nothing of the frame recorded: INVALID_ARGUMENT for a
  /// logged actor that does not act in the frame, a member of a group (log
  /// the group's joint action under the group's id) or one logged twice;
  /// ACTION_OUT_OF_SPACE, NON_FINITE_VALUE or ACTION_MASKED for an action its
  /// module's space or mask refuses (as TetherClient::log_action); NOT_READY
  /// against a server whose PONG announced a protocol older than 1.6 (§15).
  Status get_action(const std::string& episode_id, AgentFrame& frame);

  /// Greedy actions (the distributions' modes) for evaluation, written into
  /// `frame`; records nothing. Maps with the rules (or MAP_AGENTS with
  /// `episode_id`, "eval" when empty, asked once per episode id and agent).
  /// [1.5] A module with memory remembers per episode (§12.4): an actor
  /// (agent or group) of the running episode `episode_id`, when that episode
  /// is not recorded (started with training_enabled false, or held back by
  /// record_share), is fed its state, which the call advances as get_action
  /// does; any other actor acts in the evaluation episode `episode_id`, its
  /// state starting from zeros at its first call. A running episode that is
  /// recorded is refused when the frame has an actor of a module with memory
  /// (INVALID_ARGUMENT, nothing changes): its next record's state_in must
  /// follow from its recorded observations, so play it with get_action, or
  /// give the greedy play another episode id. One evaluation episode is
  /// remembered at a time: another id starts afresh, so give each
  /// evaluation episode its own id. On an error no state advances. [1.6] A
  /// frame with logged actions is refused (INVALID_ARGUMENT): nothing is
  /// recorded here, play it with get_action.
  Status compute_actions(AgentFrame& frame, const std::string& episode_id = std::string());
  /// [1.5] The state an actor (agent or group id) of a running episode
  /// carries now, tensor after tensor (recurrent_state order; §12.4), or
  /// INVALID_ARGUMENT for an actor not in it or a module without memory.
  /// Empty before its first step (its state is then zeros).
  Result<std::vector<float>> actor_state(const std::string& episode_id, const std::string& actor_id) const;

  /// Adds `reward` to the agent's last action, sampled or logged (a group member's to its
  /// group's, divided by the member count for "mean"). Rewards accumulate
  /// until the agent acts again; one before its first action only counts in
  /// the returns. INVALID_ARGUMENT (unknown episode); NON_FINITE_VALUE for a
  /// NaN or infinite reward, or [1.6] one that would take its actor's recorded
  /// step's reward (the rewards logged for it, a group's members' shares
  /// combined, summed as doubles) to |sum| >= kFloat32Overflow (§10.5): then
  /// nothing is added, to this or any actor (not to a step, the returns or a
  /// demonstration file), and the message names the agent (and its group)
  /// and the sum. Never an error of the server (the next other call returns those).
  Status log_returns(const std::string& episode_id, const std::string& agent_id, double reward);

  /// Agents that leave the episode, with their final observations (each
  /// agent's frame entry; `AgentFrame::add(..., truncated)` marks an end by
  /// time limit, otherwise it terminated). A group leaves as a whole: its
  /// members not in the frame end with their latest observation. An agent
  /// that leaves without having acted leaves nothing to train on.
  Status end_agents(const std::string& episode_id, const AgentFrame& final_observations);

  /// Ends one (sub-)agent: end_agents for one agent. Spawning needs no call:
  /// a new id in get_action joins the episode.
  Status retire_agent(const std::string& episode_id, const std::string& agent_id, const float* final_obs,
                      std::size_t obs_size, bool truncated = false);

  /// Ends the episode: every agent still in it leaves with its observation in
  /// `final_observations` (may be null) or else its latest one, truncated if
  /// `truncated`. Returns each actor's (agent's or group's) total reward.
  Result<std::map<std::string, double>> end_episode(const std::string& episode_id,
                                                    const AgentFrame* final_observations = nullptr,
                                                    bool truncated = false);

  /// Sends whatever experience is complete now and waits until the server has
  /// every batch. Returns the fatal status (CLOSED after close()); an error
  /// of the server not returned yet (one from before the call: nothing is
  /// sent; or one that came while it waited), once; or ok. Once training is
  /// done (training_done()) it returns ok at once: nothing is sent any more.
  Status flush();

  /// The modules of SET_CONFIG, by id.
  const std::map<std::string, ModuleSpec>& modules() const noexcept { return config_->modules; }
  /// The groups of SET_CONFIG, by group id.
  const std::map<std::string, GroupSpec>& groups() const noexcept { return config_->groups; }
  /// Whether the server maps with rules (false: with a function, via MAP_AGENTS).
  bool has_mapping_rules() const noexcept { return config_->mapping.has_value(); }
  /// The module each of `agent_ids` plays in the running episode `episode_id`, in the same order.
  /// With SET_CONFIG's rules this is local; with the server's function ("policy_mapping": null)
  /// the agents not mapped yet in this episode are asked about in one MAP_AGENTS, whose answers
  /// the episode keeps: their first frames then ask nothing. A group member stands for its group.
  /// INVALID_ARGUMENT (an episode not running), UNMAPPED_AGENT / UNKNOWN_MODULE, TIMEOUT,
  /// TRAINING_DONE, NOT_READY (offline), INVALID_FIELD (an answer that maps not every agent), as
  /// a frame's mapping returns them; nothing is kept of a request that failed.
  Result<std::vector<std::string>> map_agents(const std::string& episode_id, const std::vector<std::string>& agent_ids);
  /// The module an actor (agent or group id) acts with in a running episode; INVALID_ARGUMENT if it has not acted.
  Result<std::string> module_of(const std::string& episode_id, const std::string& actor_id) const;
  /// The weights version of a module's model in use (none if unknown).
  std::optional<std::int64_t> weights_seq_no(const std::string& module_id) const;
  /// Agent steps delivered to the server.
  std::int64_t agent_steps_sent() const noexcept { return agent_steps_sent_; }
  /// Inference runs so far (one per module per frame).
  std::int64_t inference_runs() const noexcept { return inference_runs_; }
  /// MAP_AGENTS requests sent so far.
  std::int64_t map_requests() const noexcept { return map_requests_; }
  /// MAP_AGENTS answers kept now (agents and groups, all episodes).
  std::size_t mapped_actors() const noexcept { return mapped_count_; }
  /// The most MAP_AGENTS answers kept at once.
  static constexpr std::size_t kMaxMappedActors = 65536;

 private:
  friend class ClientBase;  // (connect_as makes the client)
  explicit MultiAgentClient(ClientOptions options);
  struct Module;
  struct Actor;
  struct Episode;
  struct Slot;  // one actor acting in the frame being computed
  struct StepBlock;  // one module's recorded rows of one frame
  struct CutEntry;   // one actor's steps in a cut
  struct CutRecord;  // one episode's steps in a cut
  class CutSteps;    // a batch's steps, handed to the I/O thread unbuilt

  void on_connected(LinkEvent& event) override;
  void on_state(LinkEvent& event) override;
  void on_batch_done(LinkEvent& event) override;
  void on_records_built(LinkEvent& event) override;
  EpisodeEnv* episode_env(const std::string& episode_id) override;
  const EpisodeEnv* episode_env(const std::string& episode_id) const override;
  void apply_models(LinkEvent& event);
  void forget_episodes(const std::set<std::string>& ids);
  void end_training() override;
  void recount_pending();
  std::size_t sendable_steps() const;
  void send_batch(bool even_empty = false);
  void wake_link();
  void reclaim(std::shared_ptr<RecordSource> source);
  void recycle(std::shared_ptr<CutSteps> steps);
  Status map_actors(const std::string& episode_id);
  Result<Module*> module_by_rules(const std::string& actor_id, const std::string& episode_id);
  Status ask_mapping(const std::string& episode_id, const std::vector<std::string>& actor_ids);
  Module* described_module(const std::string& module_id) const;
  const std::string& actor_of(const std::string& agent_id) const;
  void remember_mapping(const std::string& episode_id, const std::string& actor_id, Module* module);
  void forget_mapping(const std::string& episode_id);
  Status gather(Episode* episode, const AgentFrame& frame, const std::string& mapping_episode_id, bool ending);
  bool same_agents_as_last_frame(const Episode& episode, const AgentFrame& frame) const;
  void remember_slots(Episode& episode, const AgentFrame& frame);
  Status obs_size_error(const Slot& slot, std::size_t obs_size) const;
  Status check_finite(const AgentFrame& frame) const;
  Status check_rows(const AgentFrame& frame, bool acting);
  Status check_module_row(const Module& module, const AgentFrame& frame, std::size_t i, bool acting) const;
  const float* group_row(const AgentFrame& frame, const Slot& slot);
  bool steady_frame(const Episode& episode, const AgentFrame& frame) const;
  Status act_steady(Episode& episode, AgentFrame& frame);
  Module* one_module_frame() const;
  void fill_batches(const AgentFrame& frame, Module* one_module);
  void take_frame(const AgentFrame& frame, Module& module);
  Status sample_modules();
  Status run_modules();
  void point_row_states(bool evaluation, const std::string& episode_id);
  void commit_states();
  std::vector<float>& evaluation_state(const std::string& episode_id, const std::string& actor_id);
  void reset_states_of(const Module& module);
  void lay_out_actions(AgentFrame& frame, const Module* one_module) const;
  void write_action(const Slot& slot, const double* env_action, AgentFrame& frame) const;
  std::int64_t cut(Episode& episode, CutRecord& record, CutSteps& steps);
  void note_oldest(const StepBlock& block);
  std::unique_ptr<StepBlock> copy_block(const StepBlock& from);
  void record_frame(Episode& episode);
  void open_blocks(Episode& episode);
  void note_row(Actor& actor, StepBlock& block, std::size_t row);
  void note_latest_row(Actor& actor, StepBlock& block, std::size_t row);
  void close_blocks(Episode& episode, bool steady);
  void release_blocks(Episode& episode);
  std::unique_ptr<StepBlock> take_spare_block(const Module* module = nullptr, std::size_t rows = 0);
  template <class Pick>
  void release_blocks_if(Episode& episode, Pick gone);
  void compact_blocks(Episode& episode);
  StepBlock& carry_block(Episode& episode, const StepBlock& like);
  void drop_rows_of(const Module& module);
  void write_value_obs(const Episode& episode, const Module& module, std::vector<float>& out) const;
  void append_actor_obs(const AgentFrame& frame, const Slot& slot, std::vector<float>& out) const;
  void note_latest(Episode& episode, const Slot& slot, const AgentFrame& frame);
  Status end_actors(Episode& episode, const AgentFrame& final_observations, bool all_truncated);
  static void fold_return(Episode& episode, Actor& actor);
  Status check_call(const std::string& episode_id, const char* call, Episode*& episode);
  Status match_logged(const AgentFrame& frame);
  void mark_logged_rows(const AgentFrame& frame);
  void record_demo_frame(const Episode& episode);
  void start_module_demos();

  std::map<std::string, std::unique_ptr<Module>> modules_;
  // member id -> (group index in group_list_, position among its members)
  std::unordered_map<std::string, std::pair<std::size_t, std::size_t>> group_of_;
  std::vector<const GroupSpec*> group_list_;
  std::vector<std::size_t> group_member_offset_;  // per group, its first entry in member_index_
  std::set<std::string> critic_agents_;           // agents some module's value_obs_agents lists
  std::unordered_map<std::string, std::unique_ptr<Episode>> episodes_;
  std::size_t pending_steps_ = 0;
  std::size_t latest_held_ = 0;  // training actors whose latest step is held back (counted with pending_steps_)
  std::size_t held_steps_ = 0;  // agent steps played in held-back episodes since the last cut (the cadence)
  std::int64_t env_steps_since_cut_ = 0;
  std::int64_t agent_steps_sent_ = 0;
  std::int64_t inference_runs_ = 0;
  std::int64_t map_requests_ = 0;
  std::uint64_t frame_counter_ = 0;
  bool link_to_wake_ = false;  // a batch was handed over without waking the I/O thread
  bool steady_path_ = true;    // steady-state frames take act_steady (tests compare it with the general path)
  std::int64_t steady_frames_ = 0;  // frames that took it
  friend struct MultiAgentClientTestPeer;  // (defined by the tests only)
  // Per-frame scratch, reused (no allocation in steady state).
  std::vector<Slot> slots_;
  bool same_agents_ = false;  // gather found the last frame's agents in the same order
  std::vector<Module*> frame_modules_;
  std::vector<std::size_t> member_index_;  // per group member: its index in the frame (or none)
  std::vector<std::size_t> group_slot_;    // per group: its slot in the frame (or none)
  std::vector<std::size_t> new_slots_;     // slots of actors acting for the first time
  std::vector<std::string> new_actor_ids_;
  std::vector<std::string> unmapped_ids_;   // new actors MAP_AGENTS is asked about
  std::vector<std::size_t> unmapped_slots_;  // their slots
  std::vector<Module*> asked_modules_;       // the modules MAP_AGENTS answered, per id asked
  std::vector<std::string> asked_module_ids_;  // read_agent_modules' answer, before asked_modules_
  std::vector<std::size_t> logged_order_;    // [1.6] the frame's logged actions, sorted by actor id
  std::vector<unsigned char> logged_matched_;  // [1.6] per logged action: a slot took it
  std::vector<float> demo_obs_;              // [1.6] an actor's final observation for the demonstration file
  std::vector<float> group_row_;             // a group's joined observation, checked as its module's row
  std::vector<std::unique_ptr<StepBlock>> spare_blocks_;  // blocks to reuse (at most as many as were ever in use)
  std::vector<std::shared_ptr<CutSteps>> spare_cuts_;     // cuts' steps back from the I/O thread, to reuse
  std::vector<std::shared_ptr<Batch>> dropped_batches_;   // batches the link dropped unsent (their steps come back)
  std::vector<std::pair<const Module*, Stamp>> oldest_;   // a cut's oldest (connection, version) per module
  // MAP_AGENTS answers (episode id -> actor id -> module), and the episode
  // ids in the order they were first mapped (the cap forgets the oldest).
  std::unordered_map<std::string, std::unordered_map<std::string, Module*>> mapped_;
  std::deque<std::string> mapped_order_;
  std::size_t mapped_count_ = 0;
  std::vector<double> env_action_;  // compute_actions: one actor's greedy action
  // [1.5] compute_actions' evaluation episode (one at a time): its actors' states.
  std::string evaluation_id_;
  bool evaluating_ = false;
  std::unordered_map<std::string, std::vector<float>> evaluation_states_;
  AgentFrame end_frame_;
};

}  // namespace tether
