// ClientBase: what TetherClient and MultiAgentClient share: the options they
// were made with, the ServerLink (its I/O thread) and the configuration of
// its connection, the errors queued for the engine's calls, and the
// accessors on them. Only the two clients derive from it; connect() makes one.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tether/client_options.h"
#include "tether/demonstrations.h"
#include "tether/distributions.h"
#include "tether/env_params.h"
#include "tether/server_link.h"
#include "tether/status.h"

namespace tether {

/// [1.7] Called on the engine's thread when the parameter set held changed
/// (§19.2), with the set held then: null after the server said it has none.
using EnvParamsCallback = std::function<void(const EnvParams*)>;

/// The connection side of a client (TetherClient, MultiAgentClient): errors,
/// closing and the accessors on the server's configuration and the link.
class ClientBase {
 public:
  /// Not copyable (it owns the connection).
  ClientBase(const ClientBase&) = delete;
  /// Not copyable.
  ClientBase& operator=(const ClientBase&) = delete;

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

  /// Stops the I/O thread and closes the connection (idempotent); later calls
  /// return CLOSED. [1.6] A demonstration file (ClientOptions::demo_path) is
  /// closed too: the episodes still running are written truncated (DemoWriter::close). A name lookup of the server's host in progress cannot be
  /// cancelled (getaddrinfo blocks): close() then waits until it returns.
  void close();

  /// Steps per batch (SET_CONFIG env_steps_per_sample, §7.4): a
  /// TetherClient's env steps, a MultiAgentClient's agent steps.
  std::int64_t env_steps_per_sample() const noexcept { return config_->env_steps_per_sample; }
  /// Whether the server trains on-policy (batches as EPISODES_AND_GET_STATE).
  bool force_on_policy() const noexcept { return config_->force_on_policy; }
  /// Whether a batch makes the engine wait for the weights answering it.
  bool waits_for_weights() const noexcept;
  /// Env steps delivered to the server (answered batches; a
  /// MultiAgentClient's are its get_action calls of training episodes).
  std::int64_t env_steps_sent() const noexcept { return env_steps_sent_; }
  /// Models swapped in so far, all modules' (the first ones included).
  std::int64_t models_loaded() const noexcept { return models_loaded_; }
  /// Connections re-established after a loss (any thread).
  std::int64_t reconnects() const noexcept { return link_->reconnects(); }
  /// Batches dropped unsent because the queue was full (any thread).
  std::int64_t batches_dropped() const noexcept { return link_->batches_dropped(); }
  /// Agent steps the server refused as too stale to be trained (protocol
  /// 1.3: the sum of its SET_STATE answers' steps_refused_stale, §7.6,
  /// §13.2); such steps were delivered but will never be trained on (any thread).
  std::uint64_t steps_refused_stale() const noexcept { return link_->steps_refused_stale(); }
  /// [1.6] Steps let go unsent for holding logged steps (log_action, a
  /// frame's logged actions): a batch that goes, after a reconnect, to a
  /// server older than 1.6 leaves out each record (agent entry) with a
  /// logged step, all of its steps counted here, as such a server would
  /// train on them as its policy's samples (§15; any thread).
  std::uint64_t logged_steps_dropped() const noexcept { return link_->logged_steps_dropped(); }
  /// [1.8] Agent steps let go unsent because they were acted with the
  /// weights of another server run (§6.5): after a reconnect whose PONG names
  /// another run_id than the connection's before (the server restarted
  /// without resuming, so its weights versions name other weights), the
  /// steps recorded and not cut yet when the engine took in the new
  /// connection (every module's; dropped by the engine thread, which starts
  /// recurrent states from zeros again), and those of batches cut before it
  /// and not answered, which the I/O thread does not send, nor send again
  /// (ServerLink::other_run_steps_dropped()). Not errors: the episodes go on,
  /// each agent's next chunk starting from its next observation, and the
  /// models stay until the new connection's replace them. 0 against servers
  /// that name no run (a server resumed from its checkpoint keeps its
  /// run_id: nothing is dropped then). Any thread.
  std::uint64_t other_run_steps_dropped() const noexcept {
    return other_run_unsent_dropped_.load(std::memory_order_relaxed) + link_->other_run_steps_dropped();
  }
  /// Training episodes played without being recorded, as the server's
  /// record_share asked (protocol 1.3, §13.2): none of their steps was sent.
  std::uint64_t episodes_held_back() const noexcept { return episodes_held_back_; }
  /// The share of new training episodes recorded now: the server's last
  /// valid record_share, 1 when its last SET_STATE had none (§7.6; any thread).
  double record_share() const noexcept { return link_->record_share(); }
  /// Steps played in training episodes per batch (a MultiAgentClient's
  /// agent steps): env_steps_per_sample, or fewer while the server holds
  /// clients back and asks for smaller, fresher batches (protocol 1.3,
  /// SET_STATE steps_per_batch, §7.6, §13.2): its last valid value, at most
  /// env_steps_per_sample; env_steps_per_sample when its last SET_STATE had none.
  std::int64_t steps_per_batch() const noexcept {
    const std::int64_t per_sample = config_->env_steps_per_sample;
    const std::int64_t asked = link_->steps_per_batch();
    return asked > 0 && asked < per_sample ? asked : per_sample;
  }
  /// Heartbeat PINGs sent (any thread).
  std::int64_t heartbeats_sent() const noexcept { return link_->heartbeats_sent(); }
  /// [1.9] Redirects to another rank of a server group this client followed
  /// (§6.7): a group spreads its clients over its ranks by asking some, in
  /// their PONG, to move. Not reconnects: nothing but PING was sent on the
  /// connection left (any thread).
  std::int64_t redirects() const noexcept { return link_->redirects(); }
  /// [1.9] The address of the server (of a group: the rank, §6.7) this
  /// client is connected to, or was last, as "host:port" (an IPv6 host in
  /// brackets). Any thread.
  std::string server_address() const { return link_->connected_address(); }
  /// [§20] Whether the client acts from an offline policy file
  /// (ClientOptions::offline_policy): no server, nothing recorded or sent.
  bool offline() const noexcept { return !options_.offline_policy.empty(); }
  /// This client's session id (protocol 1.3), kept across reconnects (any thread).
  const std::string& client_session() const noexcept { return link_->client_session(); }
  /// [1.6] The demonstration file being written (ClientOptions::demo_path),
  /// or null when recording is off, was closed, or stopped on a failed write.
  const DemoWriter* demo_writer() const noexcept { return demo_.get(); }
  /// Whether the server said its run is done (ERROR TRAINING_DONE, protocol
  /// 1.3, §6.6 "End of training"): the normal end of training, not an error.
  /// From then on the client never reconnects and records and sends nothing;
  /// its calls go on, acting with the last models (any thread).
  bool training_done() const noexcept { return link_->training_done(); }
  /// The run's summary the server sent with TRAINING_DONE (reason, env_steps,
  /// agent_steps (multi-agent), agent_steps_trained, updates, episodes,
  /// weights_seq_no, return_mean...); none while training goes on (any
  /// thread; a copy, taken under the link's lock).
  std::optional<TrainingSummary> training_summary() const { return link_->training_summary(); }
  /// Batches discarded because training was done before they were sent or
  /// answered (§6.6): queued or in flight then, cut afterwards, and the steps
  /// recorded but not cut yet then (as one). 0 while training goes on (any thread).
  std::int64_t batches_unsent_at_end() const noexcept { return link_->batches_unsent_at_end(); }

  // -- [1.7] environment parameters (§19) ---------------------------------------------------

  /// The parameter set the client holds now (the server's last valid
  /// SET_STATE "env_params", §19.2), or null: before any came, from a server
  /// older than 1.7 (its env_params are ignored), and after a server said it
  /// has none (its answer to the state request after a (re)connect, asked
  /// with env_params_seq 0, carried no set: the set held is dropped, and
  /// episodes started from then on have no values). Swapped in on the
  /// engine's thread between two calls, never within one, as a model is; the
  /// pointer stays valid until the next call that takes in news.
  const EnvParams* env_params() const noexcept { return env_params_.get(); }
  /// Sets the one callback called when the set held changes (§19.2 "Change
  /// callback"): on the engine's thread, once per taking-in of news that
  /// swapped in one or more sets or dropped the set held (in the client call
  /// that takes it in: start_episode, get_action, end_episode, flush, ...),
  /// after all of that news (models, sets, batches) is applied and before the
  /// call does its own work, with the set held then (`env_params()`; null
  /// after a drop). Two sets that came between two calls make one call, with
  /// the newer. An exception it throws comes out of that client call; what
  /// was taken in stays applied and is never applied (nor called for) again.
  /// If the client holds a set already, `callback` is called with it at once
  /// (here, on the calling thread). One callback: a new one replaces the one
  /// set before; an empty function removes it. A set that breaks §19.1 is
  /// ignored (no call: the client keeps its set; env_params_ignored()).
  void on_env_params_changed(EnvParamsCallback callback);
  /// Parameter sets the server sent that broke §19.1's rules and were ignored
  /// (the client kept the set it held): one per SET_STATE that carried such a
  /// set (any thread).
  std::uint64_t env_params_ignored() const noexcept { return link_->env_params_ignored(); }
  /// The values a running episode plays with (§19.1): each parameter's
  /// number, or what its sampler gave when the episode started; empty when
  /// the client held no set then. INVALID_ARGUMENT for an unknown episode.
  Result<EnvValues> episode_params(const std::string& episode_id) const;
  /// Reports a running episode's measure (§19.3: a score a curriculum may
  /// advance on), sent with the record that ends the episode; a later report
  /// replaces an earlier one. NON_FINITE_VALUE for a NaN or infinite value or
  /// one of magnitude above 1e300, INVALID_ARGUMENT for an unknown episode
  /// (nothing changes then). An episode without values (the client held no
  /// set when it started) sends none.
  Status report_measure(const std::string& episode_id, double value);

 protected:
  // (connection number, weights_seq_no): comparable stamps of the weights a
  // step used, with the connection the version was learned on.
  using Stamp = std::pair<std::int64_t, std::int64_t>;

  /// Seeds the sampling (ClientOptions::seed, or std::random_device); connects nothing.
  explicit ClientBase(ClientOptions options);
  // (Each client closes the link in its own destructor, before its members go.)
  virtual ~ClientBase() = default;

  /// What connect() does for either client: checks the options, makes the
  /// client (a friend of ClientBase), starts its link and takes the first
  /// connection's configuration.
  template <class Client>
  static Result<std::unique_ptr<Client>> connect_as(ClientOptions options, bool multi_agent) {
    Status valid = check_options(options);
    if (!valid.ok()) return valid;
    std::unique_ptr<Client> client(new Client(std::move(options)));  // (its constructor is for connect() only)
    Status opened = static_cast<ClientBase&>(*client).open(multi_agent);
    if (!opened.ok()) return opened;
    return client;
  }

  /// Takes in the I/O thread's news: errors and the end of the link here,
  /// the rest by the client's hooks below.
  void sync();
  /// A (new) connection (kConnected): its configuration (take_connection),
  /// and the state its handshake brought. run_changed_ says whether it
  /// reached another server run than the connection before ([1.8], §6.5).
  virtual void on_connected(LinkEvent& event) = 0;
  /// A SET_STATE (kState): new models, or versions.
  virtual void on_state(LinkEvent& event) = 0;
  /// A batch answered or refused (kBatch).
  virtual void on_batch_done(LinkEvent& event) = 0;
  /// A queued batch's records were built (kRecordsBuilt; multi-agent batches only).
  virtual void on_records_built(LinkEvent& /*event*/) {}
  /// The server's run is done (kTrainingDone, §6.6; once, ended_ is set):
  /// what was recorded and not sent is let go.
  virtual void end_training() = 0;
  /// What a call returns instead of doing its work (after taking in any news):
  /// the fatal status, or else the oldest error no call returned yet, or ok.
  Status catch_up();
  /// What catch_up returns, without taking in news first.
  Status pending_status();
  /// Queues an error for the engine's next call.
  void report(Status status);
  /// Takes the status that ended the link for good (the first one).
  void take_fatal(const Status& status);
  /// Takes a new connection's configuration.
  void take_connection(const LinkEvent& event);
  /// What start_episode does first: takes in news (returning the status a
  /// call returns instead of its work, if any), then names the episode
  /// (`episode_id`, or a new random id); INVALID_ARGUMENT when `running(id)`
  /// says an episode of that id is running already.
  template <class Running>
  Result<std::string> new_episode_id(const std::string& episode_id, Running running) {
    Status pending = catch_up();
    if (!pending.ok()) return pending;
    std::string id = episode_id.empty() ? random_episode_id() : episode_id;
    if (running(id)) return Status(ErrorCode::kInvalidArgument, "episode '" + id + "' is already running");
    return id;
  }
  /// How a new episode is played: recorded (its steps are sent), or held
  /// back (a training episode played alike, never sent, §13.2), or neither.
  struct Recording {
    bool recorded = false;
    bool held_back = false;
  };
  /// How a new episode with `training_enabled` is played: drawn as the
  /// server's record_share asks (held-back ones are counted).
  Recording new_episode_recording(bool training_enabled);

  /// [1.7] What an episode plays with (§19): its drawn values (null: none)
  /// and the measure reported for it. Each client's episodes hold one.
  struct EpisodeEnv {
    std::shared_ptr<const EpisodeEnvParams> drawn;  ///< seq and values, or null
    std::optional<double> measure;                  ///< report_measure's last value
  };
  /// [1.7] A new episode's values (§19.1), drawn from the set held now with
  /// the client's generator (in name order), or null when no set is held.
  std::shared_ptr<const EpisodeEnvParams> draw_episode_params();
  /// [1.7] The EpisodeEnv of the running episode `episode_id`, or null.
  virtual EpisodeEnv* episode_env(const std::string& episode_id) = 0;
  /// [1.7] The same, read only.
  virtual const EpisodeEnv* episode_env(const std::string& episode_id) const = 0;

  /// [1.6] NOT_READY, naming `call`, when the server's PONG announced a
  /// protocol older than 1.6: it would train on logged steps as its policy's
  /// samples (§15); ok otherwise.
  Status check_logging_server(const char* call) const;
  /// [1.6] Makes demo_ (ClientOptions::demo_path), once, with the first
  /// connection's modules; a failure is what connect() returns.
  void start_demo(const std::map<std::string, DemoModuleSpaces>& modules);
  /// [1.6] Whether the demonstration file's header names `module` with these spaces.
  bool demo_fits(const std::string& module, const Space& observation_space, const Space& action_space,
                 const std::optional<ActionMask>& mask) const;
  /// [1.6] A demonstration write that failed: reported once (a later call
  /// returns it), and recording stops.
  void demo_failed(const Status& status);

  ClientOptions options_;
  std::unique_ptr<ServerLink> link_;
  std::unique_ptr<DemoWriter> demo_;
  std::shared_ptr<const LinkConfig> config_;
  std::int64_t connection_ = 0;
  Rng rng_;
  bool raw_box_samples_ = true;
  std::uint64_t episodes_held_back_ = 0;
  std::int64_t env_steps_sent_ = 0;
  std::int64_t models_loaded_ = 0;
  bool ended_ = false;  // this thread took the end of training (§6.6): nothing is recorded any more
  // [1.8] The server run of the connection taken in last (its PONG's run_id;
  // none: it named none), and whether that connection reached another run
  // than the one before it (both named, different: §6.5).
  std::optional<std::string> run_id_;
  bool run_changed_ = false;
  // [1.8] Recorded steps not cut yet that were let go at a reconnect to
  // another server run (written by the engine thread, read by any).
  std::atomic<std::uint64_t> other_run_unsent_dropped_{0};
  std::shared_ptr<const EnvParams> env_params_;  // [1.7] the set held (engine thread), or null
  EnvParamsCallback env_params_callback_;        // [1.7] on_env_params_changed's
  std::vector<LinkEvent> event_buffer_;  // sync's (empty between syncs: only its capacity is kept)
  std::deque<Status> errors_;
  Status last_error_;
  Status fatal_;

 private:
  static Status check_options(const ClientOptions& options);
  Status demo_start_failure_;  // why demo_ could not be made (connect() returns it)
  std::string random_episode_id();
  bool take_env_params(LinkEvent& event);
  Status open(bool multi_agent);
};

}  // namespace tether
