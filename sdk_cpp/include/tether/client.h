// TetherClient: an engine-side single-agent client in the shape of RLlib's
// ExternalEnv (the C++ counterpart of sdk_python/client.py).
//
//   tether::ClientOptions options;
//   options.port = 5555;
//   options.backend_factory = [] { return std::make_unique<tether::OnnxRuntimeBackend>(); };
//   auto client = tether::TetherClient::connect(options);      // Result<std::unique_ptr<TetherClient>>
//   std::string episode = client.value()->start_episode().value();
//   client.value()->get_action(episode, obs, obs_size, action, action_size);  // local inference
//   client.value()->log_returns(episode, reward);
//   client.value()->log_action(episode, obs, obs_size, taken, action_size);  // [1.6] an action the policy did not choose
//   client.value()->end_episode(episode, final_obs, obs_size, /*truncated=*/false);
//
// get_action never waits for the network: every steps_per_batch() complete
// steps are handed to the client's one background I/O thread (ServerLink),
// which sends them and receives new models; a new model is swapped in between
// two get_action calls, so a record's steps may use several weights versions:
// the batch claims the oldest (§7.6), and such a record names each step's
// (weights_seq_no_runs, §10.1) when it goes on the connection those versions
// were learned on. Holding back (§13.2): a server may ask the client to
// record only a share of its training episodes (SET_STATE record_share); the
// others are played as usual but never sent (episodes_held_back()), and a
// batch still goes every steps_per_batch() steps played, with no records if
// need be (env_steps_per_sample, or fewer when the server asks for smaller,
// fresher batches with SET_STATE steps_per_batch). wait_for_weights makes each batch wait for the
// weights that answer it (strict on-policy); when_queue_full = kWait makes the
// engine wait for room in the send queue instead of dropping the oldest batch.
//
// Errors: nothing throws. A refusal by the server (an ERROR answering a batch,
// e.g. DATA_REFUSED or ACTION_OUT_OF_SPACE), a timeout or a model that fails
// to load is returned, once, by the next call of start_episode, get_action,
// end_episode or flush (as the Python and C# SDKs raise it): that call does
// nothing else (no episode begun, no action computed, nothing recorded), and
// the engine may simply make it again. Several errors come one per call,
// oldest first. log_returns never returns one (a reward is never lost to
// another call's error). flush() returns an error that came while it waited
// (its work is done). get_action also returns one that came while it cut a
// batch (e.g. that batch's own answer, with wait_for_weights): the batch went,
// this step was not acted. An error returned by a call is gone: take_error()
// returns only errors no call returned yet (an engine that never calls again
// may read them there); last_error() keeps the newest either way. When the
// link gives up for good (reconnect_timeout_s passed, AUTH_FAILED,
// VERSION_MISMATCH) every later call returns that status (fatal_error()).
//
// End of training (protocol 1.3, §6.6): when the server's run is done it says
// so (ERROR TRAINING_DONE with the run's summary) and stops. That is the
// normal end, not an error: training_done() turns true and training_summary()
// holds the summary; fatal_error() stays ok and no error is queued; the
// client never reconnects; the batches not yet answered and the steps not yet
// sent are discarded (batches_unsent_at_end()). Every call goes on: get_action
// acts with the last model, nothing is recorded or sent any more, and
// flush() returns ok at once. An engine that wants to stop polls
// training_done() (e.g. at each episode's end).
//
// Thread safety: one engine thread at a time calls start_episode, get_action,
// log_returns, end_episode, flush, take_error and the accessors (the class is
// not internally locked for them); reconnects(), batches_dropped(),
// steps_refused_stale(), record_share(), heartbeats_sent(), redirects(),
// server_address(), sending(), training_done(), training_summary(),
// batches_unsent_at_end() and client_session() may be read from any thread;
// close() and the destructor must not race with the engine calls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tether/client_base.h"
#include "tether/distributions.h"
#include "tether/episode.h"
#include "tether/observation_leaves.h"
#include "tether/server_link.h"
#include "tether/spaces.h"
#include "tether/status.h"

namespace tether {

/// A connected single-agent client. Create with connect(); not copyable.
class TetherClient final : public ClientBase {
 public:
  /// Connects (retrying until reconnect_timeout_s), handshakes and loads the
  /// first model. Fails with the status that ended the attempt:
  /// CONNECTION_FAILED, AUTH_FAILED, VERSION_MISMATCH, TIMEOUT, INVALID_FIELD
  /// (a SET_CONFIG this client cannot use), INVALID_ARGUMENT (no backend_factory),
  /// TRAINING_DONE (the server's run ended before the handshake did).
  static Result<std::unique_ptr<TetherClient>> connect(ClientOptions options);

  /// Stops the I/O thread (undelivered experience is dropped: flush() first).
  ~TetherClient();

  /// Begins an episode and returns its id (`episode_id`, or a new random one
  /// when empty). INVALID_ARGUMENT if that episode is already running; an
  /// error of the server not returned yet (then no episode begins).
  /// With `training_enabled` false its steps are never sent. A training
  /// episode is recorded with the probability the server's record_share
  /// gives (a draw of the seeded generator, made only when the share is
  /// below 1); one that is not is held back: played alike, never sent (§13.2).
  Result<std::string> start_episode(const std::string& episode_id = std::string(), bool training_enabled = true);

  /// Records `obs` (obs_size = observation_space().flat_dim() floats) and writes
  /// the action the engine executes to `action` (action_size =
  /// action_space().flat_dim() numbers: a Discrete action as its integer value,
  /// a Box action clipped into the box; the record keeps the raw sample).
  /// Runs the local model; never waits for the network, except to wait for
  /// room (kWait) or weights (wait_for_weights) when a batch was just cut.
  /// INVALID_ARGUMENT for an unknown episode or wrong sizes, NOT_READY without
  /// a model, INFERENCE_FAILED, an error of the server not returned yet (a
  /// refusal of an earlier batch: nothing is acted or recorded; call again),
  /// or the fatal status once the link gave up.
  /// Allocates nothing in steady state: episodes reuse the arrays of ended
  /// ones, so only a call that cuts a batch (every steps_per_batch()
  /// steps) or takes in the I/O thread's news allocates; the inference
  /// backend's own run() may (ONNX Runtime's Run allocates internally).
  Status get_action(const std::string& episode_id, const float* obs, std::size_t obs_size, double* action,
                    std::size_t action_size);
  /// get_action for a Dict or Tuple observation space (protocol 1.4, §8.6):
  /// the leaves the engine set in `obs` (see ObservationLeaves), written into
  /// a flat row the client keeps (no allocation once sized). Besides the
  /// codes above: OBS_LEAF_MISMATCH for a leaf missing or unknown,
  /// OBS_SHAPE_MISMATCH for one of another size, NON_FINITE_VALUE,
  /// OBS_DTYPE_MISMATCH for a byte leaf's value outside the integers 0-255,
  /// and with an action mask (SET_CONFIG action_mask, §11.6)
  /// INVALID_ACTION_MASK for a mask value other than 0 and 1 and
  /// ACTION_MASK_EMPTY for a mask that allows nothing: all refused before
  /// anything is recorded or sampled. (The flat get_action checks a flat row
  /// the same way.) The model masks the logits, so a sampled action is always allowed.
  Status get_action(const std::string& episode_id, const ObservationLeaves& obs, double* action,
                    std::size_t action_size);
  /// get_action for vectors (`action` is resized to action_space().flat_dim()).
  Status get_action(const std::string& episode_id, const std::vector<float>& obs, std::vector<double>& action);
  /// [1.4] get_action for an observation given as bytes, row-major
  /// (obs_size = observation_space().flat_dim() of them): a byte box's
  /// (§8.1), such as a camera image of shape [height, width, channels] as the
  /// engine holds it. A uint8 model input is fed the bytes as they are, with
  /// nothing to check (every byte is an integer 0-255); a server of 1.4 or
  /// later is sent them as a uint8 tensor (§10.9). Any Box space takes them
  /// (as the values 0-255); a Dict or Tuple space refuses them
  /// (INVALID_ARGUMENT: set its leaves with ObservationLeaves). Otherwise as
  /// the float overload, allocating nothing in steady state.
  Status get_action(const std::string& episode_id, const std::uint8_t* obs, std::size_t obs_size, double* action,
                    std::size_t action_size);

  /// [1.6] Records a logged step (§10.1): `obs` (as get_action's) and the
  /// action the engine took without the policy (a human player, a scripted
  /// bot, another controller: RLlib's log_action), `action_size` =
  /// action_space().flat_dim() numbers (a Discrete action as its integer
  /// value; a Box action as the engine executed it, recorded as given, never
  /// clipped). It mixes freely with get_action in one episode and is played
  /// as get_action plays a step: the same observation checks and batch
  /// cadence, and the reward log_returns adds next goes to it. The model is
  /// evaluated on `obs` (a model with memory advances the episode's state,
  /// §12.4) and its dist inputs are recorded, with 0 as the step's
  /// action_logp (the server uses neither at a logged step, §13.7); the
  /// record lists the step in its logged_runs. Allocates no more than
  /// get_action. Refused, with nothing recorded or advanced: get_action's
  /// codes (INVALID_ARGUMENT, NON_FINITE_VALUE and the row checks, NOT_READY
  /// without a model, INFERENCE_FAILED, an error of the server not returned
  /// yet, the fatal status); ACTION_OUT_OF_SPACE for another size than
  /// action_space().flat_dim() or a Discrete / MultiDiscrete value outside
  /// the space, NON_FINITE_VALUE for a NaN or infinite action value,
  /// ACTION_MASKED for an action the observation's mask forbids (§11.6);
  /// and NOT_READY against a server whose PONG announced a protocol older
  /// than 1.6, which would train on the step as a sample of its policy (§15).
  Status log_action(const std::string& episode_id, const float* obs, std::size_t obs_size, const double* action,
                    std::size_t action_size);
  /// log_action for a Dict or Tuple observation space (§8.6), the leaves set
  /// as for get_action (with its codes for the leaves).
  Status log_action(const std::string& episode_id, const ObservationLeaves& obs, const double* action,
                    std::size_t action_size);
  /// log_action for vectors.
  Status log_action(const std::string& episode_id, const std::vector<float>& obs, const std::vector<double>& action);
  /// [1.4] log_action for an observation given as bytes (as get_action's byte overload).
  Status log_action(const std::string& episode_id, const std::uint8_t* obs, std::size_t obs_size, const double* action,
                    std::size_t action_size);

  /// Adds `reward` to the episode's last action, sampled or logged (rewards
  /// accumulate until the next action; one logged before the first action is dropped).
  /// INVALID_ARGUMENT for an unknown episode; NON_FINITE_VALUE for a NaN or
  /// infinite reward, or [1.6] one that would take its recorded step's reward
  /// (the rewards logged for it, summed) to float32's overflow or beyond,
  /// |sum| >= kFloat32Overflow (§10.5): then nothing is added (not to the
  /// step, the episode's return or a demonstration file). Never an error of
  /// the server (the next other call returns those).
  Status log_returns(const std::string& episode_id, double reward);

  /// Finishes an episode with its last observation and returns its total
  /// reward. `truncated` marks an end by time limit (bootstrapped); otherwise
  /// it terminated. INVALID_ARGUMENT for an unknown episode or a wrong size;
  /// an error of the server not returned yet (the episode goes on: call again).
  Result<double> end_episode(const std::string& episode_id, const float* obs, std::size_t obs_size,
                             bool truncated = false);
  /// end_episode for a vector.
  Result<double> end_episode(const std::string& episode_id, const std::vector<float>& obs, bool truncated = false);
  /// [1.4] end_episode for a final observation given as bytes (as
  /// get_action's byte overload; a Dict or Tuple space refuses them).
  Result<double> end_episode(const std::string& episode_id, const std::uint8_t* obs, std::size_t obs_size,
                             bool truncated = false);
  /// end_episode for a Dict or Tuple observation space: checked as
  /// get_action's, except the mask (no action follows a final observation:
  /// its mask may allow nothing).
  Result<double> end_episode(const std::string& episode_id, const ObservationLeaves& obs, bool truncated = false);
  /// The deterministic (greedy) action for `obs`, written to `action` (as
  /// get_action's: the engine's action); records nothing and never sends.
  /// [1.5] A model with memory remembers per episode (§12.4): `episode_id`
  /// names a running episode that is not recorded (started with
  /// training_enabled false, or held back by record_share), whose state this
  /// call feeds and advances as get_action does, or else an evaluation
  /// episode of the caller's, whose state starts from zeros at its first
  /// call and is advanced by every call with that id. A running episode that
  /// is recorded is refused (INVALID_ARGUMENT, nothing changes): its next
  /// record's state_in must follow from its recorded observations, so play
  /// it with get_action, or give the greedy play another episode id. One
  /// evaluation episode is remembered at a time: a call with another id
  /// (that names no running episode) starts that one from zeros, so give
  /// each evaluation episode its own id. Without memory the id is not used.
  /// Codes as get_action's (INVALID_ARGUMENT for wrong sizes or a recorded
  /// episode, NON_FINITE_VALUE, the row checks, NOT_READY without a model,
  /// INFERENCE_FAILED, an error of the server not returned yet, the fatal
  /// status); on an error no state advances.
  Status compute_action(const float* obs, std::size_t obs_size, double* action, std::size_t action_size,
                        const std::string& episode_id = std::string());
  /// [1.4] compute_action for an observation given as bytes (as
  /// get_action's byte overload; a Dict or Tuple space refuses them).
  Status compute_action(const std::uint8_t* obs, std::size_t obs_size, double* action, std::size_t action_size,
                        const std::string& episode_id = std::string());
  /// compute_action for vectors (`action` is resized to action_space().flat_dim()).
  Status compute_action(const std::vector<float>& obs, std::vector<double>& action,
                        const std::string& episode_id = std::string());
  /// [1.5] The state a running episode carries now, tensor after tensor
  /// (recurrent_state() order; §12.4): empty before its first step (zeros
  /// then); INVALID_ARGUMENT for an unknown episode or a model without memory.
  Result<std::vector<float>> episode_state(const std::string& episode_id) const;
  /// [1.5] The default module's recurrent state (SET_CONFIG recurrent_state,
  /// §7.4); empty when its model has no memory.
  const std::vector<RecurrentStateSpec>& recurrent_state() const noexcept { return config_->recurrent_state; }

  /// The action mask of the current connection's SET_CONFIG (§11.6), or null.
  const ActionMask* action_mask() const noexcept { return config_ && config_->action_mask ? &*config_->action_mask : nullptr; }

  /// Sends whatever experience is complete now and waits until the server has
  /// every batch. Returns the fatal status; an error of the server not
  /// returned yet (one from before the call: nothing is sent; or one that
  /// came while it waited), once; or ok. Once training is done
  /// (training_done()) it returns ok at once: nothing is sent any more.
  Status flush();

  /// The observation space from SET_CONFIG.
  const Space& observation_space() const noexcept { return config_->observation_space; }
  /// The action space from SET_CONFIG.
  const Space& action_space() const noexcept { return config_->action_space; }
  /// The weights version of the model in use (none if the server sent none).
  std::optional<std::int64_t> weights_seq_no() const noexcept { return weights_seq_no_; }
  /// Whether a batch is queued or in flight on the I/O thread (any thread; takes the link's lock).
  bool sending() const { return !link_->idle(); }

 private:
  friend class ClientBase;  // (connect_as makes the client)
  explicit TetherClient(ClientOptions options);
  struct Episode {
    std::string id;
    bool training = true;           // its steps are recorded (and sent)
    bool held_back = false;         // a training episode not recorded (record_share): played, counted, not sent
    EpisodeChunk steps;             // obs rows: one per recorded step, plus the final one
    std::vector<Stamp> versions;    // per action; (-1, -1) when unknown
    // [1.5] A model with memory (§12.4): the state its next step starts from
    // (empty: zeros, not made yet), and per recorded step the state it was
    // fed with (state_dim floats a row): a cut's state_in is its first row.
    std::vector<float> state;
    std::vector<float> states;
    std::vector<unsigned char> logged;  // [1.6] per recorded action: chosen outside the policy (log_action)
    bool terminated = false;
    bool truncated = false;
    double total_return = 0.0;
    double step_reward = 0.0;  // [1.6] the last recorded step's rewards, summed as doubles (§10.5)
    std::size_t obs_rows = 0;
    std::size_t action_rows = 0;
    EpisodeEnv env;  // [1.7] its drawn environment parameters and measure (§19): every record carries them

    // Lets go of the steps recorded and not cut yet; the episode's next chunk starts from its next observation.
    void drop_uncut_steps() noexcept;
  };

  void on_connected(LinkEvent& event) override;
  void on_state(LinkEvent& event) override;
  void on_batch_done(LinkEvent& event) override;
  EpisodeEnv* episode_env(const std::string& episode_id) override;
  const EpisodeEnv* episode_env(const std::string& episode_id) const override;
  void apply_policy(std::shared_ptr<LoadedPolicy> policy, std::optional<std::int64_t> seq, std::int64_t connection);
  void forget_episodes(const std::set<std::string>& ids);
  std::size_t drop_for_new_spaces();  // returns the steps dropped
  std::size_t drop_unsent_steps();
  std::size_t sendable_steps(const Episode& current) const;
  // The observation an act() call was given, after `episode`'s last action
  // (floats or bytes): a batch cut in that call takes it as the step's next.
  struct NextObservation {
    const Episode* episode = nullptr;
    const float* obs = nullptr;
    const std::uint8_t* obs_bytes = nullptr;
  };
  void send_batch(bool even_empty = false, const NextObservation* next = nullptr);
  bool cut(Episode& episode, std::vector<EpisodeChunk>& chunks, std::optional<Stamp>& oldest,
           std::int64_t& runs_connection, const NextObservation* next = nullptr);
  void recount_pending();
  void recycle(Episode&& episode);
  Status act(const char* call, const std::string& episode_id, const float* obs, const std::uint8_t* obs_bytes,
             std::size_t obs_size, double* action_out, bool logging, const double* logged, std::size_t action_size);
  Status greedy_action(const float* obs, const std::uint8_t* obs_bytes, std::size_t obs_size, double* action,
                       std::size_t action_size, const std::string& episode_id);
  Result<double> finish_episode(const std::string& episode_id, const float* obs, const std::uint8_t* obs_bytes,
                                std::size_t obs_size, bool truncated);
  void record_demo_step(const std::string& episode_id, const float* obs, std::size_t obs_size, bool logged);
  const float* demo_row(const float* obs, const std::uint8_t* obs_bytes, std::size_t obs_size);
  Status run_policy(std::vector<float>& state, const float* obs, const std::uint8_t* obs_bytes, std::size_t obs_size);
  Status write_leaf_row(const ObservationLeaves& obs, const char* call, const char* what);
  std::vector<float>& evaluation_state(const std::string& episode_id);
  void end_training() override;

  std::shared_ptr<LoadedPolicy> policy_;
  std::optional<std::int64_t> weights_seq_no_;
  std::int64_t weights_connection_ = 0;  // the connection weights_seq_no_ was learned on
  std::unordered_map<std::string, Episode> episodes_;
  std::vector<Episode> finished_;
  // Ended episodes whose arrays (with their capacity) the next episodes reuse,
  // so steady-state get_action calls never grow a buffer.
  std::vector<Episode> spare_;
  std::size_t pending_steps_ = 0;
  std::size_t held_steps_ = 0;  // steps played in held-back episodes since the last cut (the cadence)
  // Preallocated per-step buffers (sized at connect / on a config change).
  std::vector<float> dist_buffer_;
  std::vector<double> record_action_buffer_;
  std::vector<double> env_action_buffer_;
  std::vector<float> leaf_row_;  // the flat row of an ObservationLeaves observation
  std::vector<float> byte_row_;  // a byte observation widened for the demonstration file
  // [1.5] The state a run returns (swapped with the actor's: no copy, no allocation).
  std::vector<float> state_out_;
  // compute_action's evaluation episode (one at a time) and its state.
  std::string evaluation_id_;
  bool evaluating_ = false;
  std::vector<float> evaluation_state_;
  // [1.6] Demonstration recording (ClientOptions::demo_path): the default
  // module's id in the file, and whether its header fits this connection's spaces.
  std::string demo_module_;
  bool demo_on_ = false;
};

}  // namespace tether
