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
// steps_refused_stale(), record_share(), heartbeats_sent(), sending(),
// training_done(), training_summary(), batches_unsent_at_end() and
// client_session() may be read from any thread; close() and the destructor
// must not race with the engine calls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tether/distributions.h"
#include "tether/episode.h"
#include "tether/observation_leaves.h"
#include "tether/server_link.h"
#include "tether/spaces.h"
#include "tether/status.h"

namespace tether {

/// What a client does when the send queue behind the batch in flight is full.
enum class QueueFullPolicy {
  kDropOldest,  ///< drop the oldest waiting batches (and the rest of their episodes); never wait
  kWait,        ///< wait for room (backpressure): every step is delivered, at the server's pace
};

/// Everything a TetherClient is configured with.
struct ClientOptions {
  std::string host = "127.0.0.1";          ///< server address
  std::uint16_t port = 5555;               ///< server port
  std::string client_name = "tether-cpp";  ///< shown in the server's logs
  std::optional<std::string> auth_token;   ///< sent in PING when the server requires one
  std::optional<std::uint64_t> seed;       ///< seeds action sampling (none: from std::random_device)
  double connect_timeout_s = 10.0;         ///< limit of one TCP connect attempt
  double response_timeout_s = 60.0;        ///< limit of PONG / SET_CONFIG / SET_STATE answers
  double update_timeout_s = 600.0;         ///< limit of a batch's answer (may wait for a learner update)
  double reconnect_timeout_s = 60.0;       ///< keep retrying a lost server this long, then fail for good
  QueueFullPolicy when_queue_full = QueueFullPolicy::kDropOldest;  ///< see QueueFullPolicy
  /// Against an on-policy server, wait after every batch for the weights that
  /// answer it. None: false, except against a plain RLlink v1 server (no
  /// protocol_version in PONG), where it is true.
  std::optional<bool> wait_for_weights;
  std::size_t max_queued_steps = 0;        ///< steps that may wait behind the batch in flight; 0: from SET_CONFIG
  std::size_t max_queued_batches = 64;     ///< hard cap on waiting batches
  std::size_t max_frame_bytes = kDefaultMaxFrameBytes;  ///< largest frame accepted from the server
  /// Required: makes an empty inference backend for each model received
  /// (e.g. OnnxRuntimeBackend from tether/onnxruntime_backend.h). Called on the I/O thread.
  BackendFactory backend_factory;
};

/// A connected single-agent client. Create with connect(); not copyable.
class TetherClient {
 public:
  /// Connects (retrying until reconnect_timeout_s), handshakes and loads the
  /// first model. Fails with the status that ended the attempt:
  /// CONNECTION_FAILED, AUTH_FAILED, VERSION_MISMATCH, TIMEOUT, INVALID_FIELD
  /// (a SET_CONFIG this client cannot use), INVALID_ARGUMENT (no backend_factory),
  /// TRAINING_DONE (the server's run ended before the handshake did).
  static Result<std::unique_ptr<TetherClient>> connect(ClientOptions options);

  /// Lets only connect() construct a client (std::make_unique needs a public constructor).
  class ConstructionKey {
    friend class TetherClient;
    ConstructionKey() = default;
  };
  /// Use connect(); this constructor does not connect.
  TetherClient(ConstructionKey key, ClientOptions options);
  /// Stops the I/O thread (undelivered experience is dropped: flush() first).
  ~TetherClient();
  TetherClient(const TetherClient&) = delete;
  TetherClient& operator=(const TetherClient&) = delete;

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

  /// Adds `reward` to the episode's last action (rewards accumulate until the
  /// next action; one logged before the first action is dropped).
  /// INVALID_ARGUMENT for an unknown episode or a non-finite reward; never
  /// an error of the server (the next other call returns those).
  Status log_returns(const std::string& episode_id, double reward);

  /// Finishes an episode with its last observation and returns its total
  /// reward. `truncated` marks an end by time limit (bootstrapped); otherwise
  /// it terminated. INVALID_ARGUMENT for an unknown episode or a wrong size;
  /// an error of the server not returned yet (the episode goes on: call again).
  Result<double> end_episode(const std::string& episode_id, const float* obs, std::size_t obs_size,
                             bool truncated = false);
  /// end_episode for a vector.
  Result<double> end_episode(const std::string& episode_id, const std::vector<float>& obs, bool truncated = false);
  /// end_episode for a Dict or Tuple observation space: checked as
  /// get_action's, except the mask (no action follows a final observation:
  /// its mask may allow nothing).
  Result<double> end_episode(const std::string& episode_id, const ObservationLeaves& obs, bool truncated = false);
  /// The action mask of the current connection's SET_CONFIG (§11.6), or null.
  const ActionMask* action_mask() const noexcept { return config_ && config_->action_mask ? &*config_->action_mask : nullptr; }

  /// Sends whatever experience is complete now and waits until the server has
  /// every batch. Returns the fatal status; an error of the server not
  /// returned yet (one from before the call: nothing is sent; or one that
  /// came while it waited), once; or ok. Once training is done
  /// (training_done()) it returns ok at once: nothing is sent any more.
  Status flush();

  /// The oldest error not returned yet, by a call or by take_error() (a
  /// refusal, timeout, bad model), or ok if none; removes it. An error a call
  /// returned is not returned here again.
  Status take_error();
  /// The most recent error reported (ok if none ever was); not cleared when
  /// a call or take_error() returns it.
  const Status& last_error() const noexcept { return last_error_; }
  /// Errors not returned yet (by a call or by take_error()).
  std::size_t pending_errors() const noexcept { return errors_.size(); }
  /// The status that ended the link for good (ok while it lives).
  const Status& fatal_error() const noexcept { return fatal_; }

  /// Stops the I/O thread and closes the connection (idempotent). A name
  /// lookup of the server's host in progress cannot be cancelled (getaddrinfo
  /// blocks): close() then waits until it returns.
  void close();

  /// The observation space from SET_CONFIG.
  const Space& observation_space() const noexcept { return config_->observation_space; }
  /// The action space from SET_CONFIG.
  const Space& action_space() const noexcept { return config_->action_space; }
  /// Steps per batch (SET_CONFIG env_steps_per_sample).
  std::int64_t env_steps_per_sample() const noexcept { return config_->env_steps_per_sample; }
  /// Whether the server trains on-policy (batches as EPISODES_AND_GET_STATE).
  bool force_on_policy() const noexcept { return config_->force_on_policy; }
  /// Whether a batch makes the engine wait for the weights answering it.
  bool waits_for_weights() const noexcept;
  /// The weights version of the model in use (none if the server sent none).
  std::optional<std::int64_t> weights_seq_no() const noexcept { return weights_seq_no_; }
  /// Env steps delivered to the server (answered batches).
  std::int64_t env_steps_sent() const noexcept { return env_steps_sent_; }
  /// Models swapped in so far (the first one included).
  std::int64_t models_loaded() const noexcept { return models_loaded_; }
  /// Connections re-established after a loss (any thread).
  std::int64_t reconnects() const noexcept { return link_->reconnects(); }
  /// Batches dropped unsent because the queue was full (any thread).
  std::int64_t batches_dropped() const noexcept { return link_->batches_dropped(); }
  /// Agent steps the server refused as too stale to be trained (protocol
  /// 1.3: the sum of its SET_STATE answers' steps_refused_stale, §7.6,
  /// §13.2); such steps were delivered but will never be trained on (any thread).
  std::uint64_t steps_refused_stale() const noexcept { return link_->steps_refused_stale(); }
  /// Training episodes played without being recorded, as the server's
  /// record_share asked (protocol 1.3, §13.2): their steps were never sent.
  std::uint64_t episodes_held_back() const noexcept { return episodes_held_back_; }
  /// The share of new training episodes recorded now: the server's last
  /// valid record_share, 1 when its last SET_STATE had none (§7.6; any thread).
  double record_share() const noexcept { return link_->record_share(); }
  /// Training steps played per batch: env_steps_per_sample, or fewer while the
  /// server holds clients back and asks for smaller, fresher batches (protocol
  /// 1.3, SET_STATE steps_per_batch, §7.6, §13.2): its last valid value, at most
  /// env_steps_per_sample; env_steps_per_sample when its last SET_STATE had none.
  std::int64_t steps_per_batch() const noexcept {
    const std::int64_t per_sample = config_->env_steps_per_sample;
    const std::int64_t asked = link_->steps_per_batch();
    return asked > 0 && asked < per_sample ? asked : per_sample;
  }
  /// Whether a batch is queued or in flight on the I/O thread (any thread; takes the link's lock).
  bool sending() const { return !link_->idle(); }
  /// Heartbeat PINGs sent (any thread).
  std::int64_t heartbeats_sent() const noexcept { return link_->heartbeats_sent(); }
  /// This client's session id (protocol 1.3), kept across reconnects (any thread).
  const std::string& client_session() const noexcept { return link_->client_session(); }
  /// Whether the server said its run is done (ERROR TRAINING_DONE, protocol
  /// 1.3, §6.6 "End of training"): the normal end of training, not an error.
  /// From then on the client never reconnects and records and sends nothing;
  /// its calls go on, acting with the last model (any thread).
  bool training_done() const noexcept { return link_->training_done(); }
  /// The run's summary the server sent with TRAINING_DONE (reason, env_steps,
  /// agent_steps_trained, updates, episodes, weights_seq_no, return_mean...);
  /// none while training goes on (any thread; a copy, taken under the link's lock).
  std::optional<TrainingSummary> training_summary() const { return link_->training_summary(); }
  /// Batches discarded because training was done before they were sent or
  /// answered (§6.6): queued or in flight then, cut afterwards, and the steps
  /// recorded but not cut yet then (as one). 0 while training goes on (any thread).
  std::int64_t batches_unsent_at_end() const noexcept { return link_->batches_unsent_at_end(); }

 private:
  // (connection number, weights_seq_no): comparable stamps of the weights a
  // step used, with the connection the version was learned on.
  using Stamp = std::pair<std::int64_t, std::int64_t>;
  struct Episode {
    std::string id;
    bool training = true;           // its steps are recorded (and sent)
    bool held_back = false;         // a training episode not recorded (record_share): played, counted, not sent
    EpisodeChunk steps;             // obs rows: one per recorded step, plus the final one
    std::vector<Stamp> versions;    // per action; (-1, -1) when unknown
    bool terminated = false;
    bool truncated = false;
    double total_return = 0.0;
    std::size_t obs_rows = 0;
    std::size_t action_rows = 0;
  };

  void sync();
  Status pending_status();
  void apply_policy(std::shared_ptr<LoadedPolicy> policy, std::optional<std::int64_t> seq, std::int64_t connection);
  void report(Status status);
  void forget_episodes(const std::set<std::string>& ids);
  void drop_for_new_spaces();
  std::size_t sendable_steps(const Episode& current) const;
  void send_batch(bool even_empty = false);
  bool cut(Episode& episode, std::vector<EpisodeChunk>& chunks, std::optional<Stamp>& oldest,
           std::int64_t& runs_connection);
  void recount_pending();
  void recycle(Episode&& episode);
  void end_training();

  ClientOptions options_;
  std::unique_ptr<ServerLink> link_;
  std::shared_ptr<const LinkConfig> config_;
  std::shared_ptr<LoadedPolicy> policy_;
  std::optional<std::int64_t> weights_seq_no_;
  std::int64_t weights_connection_ = 0;  // the connection weights_seq_no_ was learned on
  std::int64_t connection_ = 0;
  Rng rng_;
  bool raw_box_samples_ = true;
  std::unordered_map<std::string, Episode> episodes_;
  std::vector<Episode> finished_;
  // Ended episodes whose arrays (with their capacity) the next episodes reuse,
  // so steady-state get_action calls never grow a buffer.
  std::vector<Episode> spare_;
  std::size_t pending_steps_ = 0;
  std::size_t held_steps_ = 0;  // steps played in held-back episodes since the last cut (the cadence)
  std::uint64_t episodes_held_back_ = 0;
  std::int64_t env_steps_sent_ = 0;
  std::int64_t models_loaded_ = 0;
  std::uint64_t space_changes_ = 0;  // reconnects whose spaces differed (their steps were dropped)
  bool ended_ = false;  // this thread took the end of training (§6.6): nothing is recorded any more
  std::vector<LinkEvent> event_buffer_;
  std::deque<Status> errors_;
  Status last_error_;
  Status fatal_;
  // Preallocated per-step buffers (sized at connect / on a config change).
  std::vector<float> dist_buffer_;
  std::vector<double> record_action_buffer_;
  std::vector<double> env_action_buffer_;
  std::vector<float> leaf_row_;  // the flat row of an ObservationLeaves observation
};

}  // namespace tether
