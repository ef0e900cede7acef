// The connection a client keeps to its server, run by ONE background I/O
// thread (the C++ counterpart of sdk_python/server_link.py).
//
// The engine thread never touches the socket. It hands the link batches
// (submit) and picks up what the I/O thread reports as events (take_events):
// a (re)connection with its SET_CONFIG, new models (loaded off the engine
// thread), answered or refused batches, errors. The I/O thread connects and
// handshakes, sends batches one at a time, sends heartbeats, enforces timeouts
// and reconnects with backoff.
//
// Exactly-once batches (protocol 1.3): every batch carries the link's
// client_session (random hex, kept across reconnects) and a batch_seq (1, 2,
// ... in sending order). A batch whose answer was not received is resent after
// a reconnect with the same session and seq (unless the reconnect reached
// another server run, below); a batch the server refused with
// ERROR is never resent. Off-policy EPISODES have no answer: each is followed
// by GET_STATE, whose SET_STATE acknowledges it. Every SET_STATE's
// record_share (§7.6) is kept for the engine (record_share()), which records
// only that share of its training episodes (§13.2), and so is its
// steps_per_batch (steps_per_batch()), the engine's batch cadence.
//
// End of training (protocol 1.3, §6.6): a server whose run is done writes the
// unsolicited ERROR TRAINING_DONE with the run's summary and closes. The link
// then ends for good, without an error: it never reconnects nor resends; the
// batches queued or in flight are discarded (batches_unsent_at_end()), as is
// any batch submitted later; requests waiting fail with TRAINING_DONE; the
// engine hears of it from a kTrainingDone event, and training_done() and
// training_summary() tell any thread.
//
// Environment parameters (protocol 1.7, §19.2): to a server whose PONG
// announced 1.7 or later every GET_STATE and EPISODES_AND_GET_STATE carries
// env_params_seq, the seq of the last parameter set this connection was sent
// (0 on every new connection); a SET_STATE's env_params is parsed here and
// handed to the engine with its kConnected / kState event (a set that breaks
// §19.1 is ignored and counted: env_params_ignored()). From any other server
// env_params is ignored. An answer to a request that carried env_params_seq 0
// and has no env_params says the server has no parameters: its event tells
// the engine to drop the set it holds (LinkEvent::env_params_dropped).
//
// Server runs (protocol 1.8, §6.5): the link records the run_id each
// connection's PONG named (connection 1, 2, ...). A batch is cut on one
// connection (Batch::connection: its steps' weights versions were learned
// on it); before sending it, or sending it again after a reconnect, the link
// compares that connection's run with the current one's (from_another_run):
// another run's versions name other weights, so such a batch is not sent. It
// is done (other_run), its agent steps are counted (other_run_steps_dropped())
// and the engine hears of it with a kBatch event: not sent, not an error, its
// episodes go on.
//
// Servers in a group (protocol 1.9, §6.7): LinkOptions::host and port are
// the address the application gave. The link remembers the ranks of the
// latest PONG that named any (ranks()). A PONG's redirect is followed at once,
// unless the connection was itself made on a redirect (or it names no other
// address, redirect_of): nothing more is sent on that connection, which is
// closed, and the handshake is made at the named rank, whose PING carries
// "redirected": true; if that rank cannot be reached (or its handshake fails
// on a lost connection or a timeout), the link connects again to the address
// it was redirected from, with "redirected": true, so it is kept there. A
// followed redirect is counted (redirects()); it is no reconnect and no new
// connection for the engine (nothing but PING was sent on the one it left).
// After a connection to address L is lost, attempt k (0, 1, 2, ...) goes to
// reconnect_order(given, ranks, L)[k % n]: the first retries L, the next
// ones go to the other ranks in turn; the deadline (reconnect_timeout_s) and
// the backoff span all attempts. The client_session and batch_seq go on
// unchanged: the batch in flight is resent to whichever rank is reached, as
// after any reconnect. connected_address() says where the link is connected.
//
// Multi-agent (LinkOptions::multi_agent): SET_CONFIG must describe "modules";
// GET_STATE asks in the per-module form ({"weights_seq_nos": {...}}) and each
// module's model is loaded with the BackendFactory on the I/O thread; batches
// carry multi-agent records (§10.7) and per-module claims; request() sends
// MAP_AGENTS for an engine thread that waits for the answer.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "tether/env_params.h"
#include "tether/episode.h"
#include "tether/inference.h"
#include "tether/messages.h"
#include "tether/policy_mapping.h"
#include "tether/session.h"
#include "tether/spaces.h"
#include "tether/status.h"
#include "tether/transport.h"

namespace tether {

/// Makes an empty inference backend for each model received (called on the I/O thread).
using BackendFactory = std::function<std::unique_ptr<InferenceBackend>()>;

/// What the link needs to know to connect.
struct LinkOptions {
  /// Server address (name, IPv4 or IPv6, without brackets); [1.9] of a group
  /// of servers, any rank's (or an address in front of them, §6.7).
  std::string host = "127.0.0.1";
  std::uint16_t port = 5555;               ///< server port
  std::string client_name = "tether-cpp";  ///< sent in PING, shown in the server's logs
  std::optional<std::string> auth_token;   ///< sent in PING when the server requires one
  double connect_timeout_s = 10.0;         ///< limit of one TCP connect attempt
  double response_timeout_s = 60.0;        ///< limit of a PONG / SET_CONFIG / SET_STATE for GET_STATE
  double update_timeout_s = 600.0;         ///< limit of an EPISODES_AND_GET_STATE answer (may wait for training)
  double reconnect_timeout_s = 60.0;       ///< keep retrying a lost connection this long, then fail for good
  std::size_t max_queued_steps = 0;        ///< steps waiting behind the batch in flight; 0: from SET_CONFIG
  std::size_t max_queued_batches = 64;     ///< hard cap on waiting batches
  std::size_t max_frame_bytes = kDefaultMaxFrameBytes;  ///< largest frame accepted from the server
  BackendFactory backend_factory;          ///< required: makes the backend that runs each model
  bool multi_agent = false;                ///< per-module config, models and records (MultiAgentClient)
  /// Times one batch is sent on connections that are lost before its answer
  /// arrives; then it is given up (its kBatch event carries CONNECTION_FAILED).
  int max_batch_attempts = 5;
  std::size_t max_queued_events = 1024;    ///< events kept for an engine that does not read them (errors go first)
  /// [§20] When set, the path of an offline policy file: start() takes its
  /// PONG, SET_CONFIG and SET_STATE and connects nowhere (see ClientOptions::offline_policy).
  std::string offline_policy;
};

/// What a connection's handshake learned (PONG + SET_CONFIG), immutable once posted.
struct LinkConfig {
  nlohmann::json server_info;                 ///< the PONG
  nlohmann::json server_config;               ///< the SET_CONFIG
  Space observation_space;                    ///< "observation_space"
  Space action_space;                         ///< "action_space"
  std::optional<ActionMask> action_mask;      ///< [1.4] "action_mask": the leaf masking the actions (§11.6)
  /// [1.5] "recurrent_state": the default module's state tensors (§7.4, §9.1); empty: no memory.
  std::vector<RecurrentStateSpec> recurrent_state;
  std::string input_name = "obs";             ///< onnx_input_names[0]
  std::string output_name = "action_dist_inputs";  ///< onnx_output_names[0]
  std::int64_t env_steps_per_sample = 500;    ///< steps per batch
  bool force_on_policy = true;                ///< batches go as EPISODES_AND_GET_STATE
  double heartbeat_interval_s = 0.0;          ///< 0: the server asks for no heartbeats
  bool speaks_1_3 = false;                    ///< PONG announced protocol 1.3 or later
  bool speaks_1_4 = false;                    ///< PONG announced 1.4 or later: records may carry tensors (§10.9)
  bool speaks_1_6 = false;                    ///< PONG announced 1.6 or later: records may carry logged_runs (§15)
  bool speaks_1_7 = false;                    ///< PONG announced 1.7 or later: state requests carry env_params_seq (§19.2)
  bool announces_version = false;             ///< PONG carried a protocol_version (not RLlib's plain v1)
  std::size_t queue_limit_steps = 1000;       ///< steps allowed to wait behind the batch in flight
  // Multi-agent (LinkOptions::multi_agent):
  std::map<std::string, ModuleSpec> modules;  ///< SET_CONFIG "modules"
  std::optional<PolicyMapping> mapping;       ///< the rules; none: the server maps (MAP_AGENTS)
  std::map<std::string, GroupSpec> groups;    ///< SET_CONFIG "groups"
};

/// A loaded model, ready to run on the engine thread (the backend is not thread-safe:
/// only the engine thread runs it once it has been handed over).
struct LoadedPolicy {
  std::unique_ptr<InferenceBackend> backend;  ///< the runtime holding the model
  std::size_t obs_dim = 0;                    ///< observation width the model takes
  std::size_t out_dim = 0;                    ///< action_dist_inputs width it produces
  /// [1.5] Floats of one actor's recurrent state the model takes and returns
  /// (tensors x size; 0: no memory, the backend's run() serves it).
  std::size_t state_dim = 0;
};

struct Batch;

/// A multi-agent record handed over unbuilt (see RecordSource): its episode and agent steps.
struct PendingRecord {
  std::string episode_id;        ///< the record's episode
  std::int64_t agent_steps = 0;  ///< the agent steps it holds
};

/// Multi-agent records a client hands over unbuilt: at a cut the engine
/// thread only moves the rows it recorded into the batch, and the I/O
/// thread builds the records from them, while the batch waits in the queue
/// or when it is first encoded. The link never touches it once it has built
/// them and handed it back (a kRecordsBuilt event), or once the batch is done
/// (answered, refused or given up): its client may then reuse it.
class RecordSource {
 public:
  virtual ~RecordSource() = default;
  /// Appends to batch.records the records of batch.pending_records (those
  /// left of the ones handed over, in order: the others were dropped), and
  /// sets batch.runs_connection when an agent entry has weights_seq_no_runs.
  /// Called once, on the I/O thread (`batch` may be a scratch one holding a
  /// copy of the pending records).
  virtual void build(Batch& batch) = 0;
};

/// Experience cut on the engine thread; the engine never touches the chunks
/// or records again. Once the batch is answered (or given up) the I/O thread
/// frees them and `episodes` (the engine only reads `episode_ids`).
struct Batch {
  std::vector<EpisodeChunk> chunks;           ///< single-agent chunks, one per episode (episode_id set)
  std::vector<MultiAgentRecord> records;      ///< multi-agent records (episode_id set)
  /// Multi-agent records still to be built by record_source on the I/O
  /// thread, one per episode, in order (`records` stays empty until then).
  std::vector<PendingRecord> pending_records;
  std::shared_ptr<RecordSource> record_source;  ///< builds pending_records (none: nothing pending)
  bool building = false;                        ///< (under the link's lock) its records are being built
  std::int64_t env_steps = 0;                 ///< env steps (= agent steps, single-agent)
  std::int64_t agent_steps = 0;               ///< agent steps; single-agent: 0 means env_steps
  bool multi_agent = false;                   ///< multi-agent records: agent_steps counts, even when 0
  std::optional<std::int64_t> weights_seq_no; ///< the claim: oldest version its steps used
  std::optional<std::map<std::string, std::int64_t>> weights_seq_nos;  ///< per-module claims
  /// runs_connection of a batch without runs.
  static constexpr std::int64_t kNoRuns = std::numeric_limits<std::int64_t>::max();
  /// The connection on which the versions that its chunks' (or agent
  /// entries') weights_seq_no_runs name were learned (a chunk gets runs only
  /// when all its steps' versions come from one connection, the client's
  /// current one when cut); kNoRuns when none has runs. Sent on any other
  /// connection (a reconnect happened in between, to the same server or a
  /// restarted one) or to a server that announced no protocol_version, the
  /// batch goes without runs: its steps have the claim (§10.1).
  std::int64_t runs_connection = kNoRuns;
  /// The connection (1, 2, ...) the engine had when it cut the batch: its
  /// steps' weights versions were learned on it (0: not known, then never
  /// dropped as another run's). [1.8] A batch to be sent (or sent again) on a
  /// connection that reached another server run than this one is dropped
  /// instead (other_run, §6.5).
  std::int64_t connection = 0;
  /// Sent even when it holds no records (its steps were played in held-back
  /// episodes, §13.2): "episodes": [], since its answer brings the current
  /// weights and record_share.
  bool even_empty = false;
  // Written by the I/O thread (read by the engine once `done`):
  std::int64_t seq = 0;                       ///< batch_seq, given at the first send
  int attempts = 0;                           ///< connections it was sent on
  bool done = false;                          ///< answered (or refused, or given up, or dropped as another run's)
  /// [1.8] Not sent: its steps were acted with another server run's weights
  /// (§6.5). Done without an error; its agent steps are counted in
  /// ServerLink::other_run_steps_dropped(), not as sent.
  bool other_run = false;
  Status error;                               ///< the refusal, when refused
  std::vector<std::string> episode_ids;       ///< its episodes' ids (kept when the data is freed)
  nlohmann::json episodes;                    ///< the encoded records (kept for a resend)
  std::string attachment;                     ///< [1.4] the bytes of their tensors (§10.9), sent after a NUL (§4.3)
  bool binary = false;                        ///< encoded for a 1.4 server (tensors where they may stand)

  /// The steps the send queue counts: agent steps (single-agent: env steps if none given).
  std::size_t queue_steps() const noexcept {
    return static_cast<std::size_t>(multi_agent || agent_steps > 0 ? agent_steps : env_steps);
  }
  /// Whether it holds chunks or records (built or pending).
  bool has_data() const noexcept { return !chunks.empty() || !records.empty() || !pending_records.empty(); }
};

/// What the I/O thread reports to the engine thread, in order.
struct LinkEvent {
  /// Which event.
  enum class Kind {
    kConnected,  ///< a (new) connection: config, and the state of its GET_STATE
    kState,      ///< a SET_STATE (policy may be null: no new model)
    kBatch,      ///< a batch was answered or refused (batch->error), or [1.8] dropped as another run's (batch->other_run)
    kError,      ///< an error the engine should hear of (refusal, timeout, bad model)
    kFatal,      ///< the link gave up for good (status); stays
    kTrainingDone,  ///< the server's run is done (ERROR TRAINING_DONE, §6.6; summary): the link has ended, normally
    kRecordsBuilt,  ///< a queued batch's records were built: its record_source goes back to its client
  };
  Kind kind = Kind::kError;                      ///< which event
  std::shared_ptr<const LinkConfig> config;      ///< kConnected
  std::shared_ptr<LoadedPolicy> policy;          ///< kConnected / kState: a new model, or null
  std::optional<std::int64_t> weights_seq_no;    ///< kConnected / kState: the version announced
  /// kConnected / kState (multi-agent): the new model of each module that has one.
  std::map<std::string, std::shared_ptr<LoadedPolicy>> module_policies;
  /// kConnected / kState (multi-agent): the version announced for each module listed.
  std::map<std::string, std::int64_t> module_seqs;
  std::int64_t connection = 0;                   ///< kConnected / kState: the connection number (1, 2, ...)
  std::shared_ptr<Batch> batch;                  ///< kBatch
  Status status;                                 ///< kError / kFatal
  std::shared_ptr<const TrainingSummary> summary;  ///< kTrainingDone
  std::shared_ptr<RecordSource> record_source;     ///< kRecordsBuilt
  /// kConnected / kState [1.7]: the parameter set the SET_STATE brought
  /// (§19.2), parsed on the I/O thread; null when it brought none or one
  /// that breaks §19.1 (ignored: the client keeps the set it holds), and
  /// always from a server whose PONG announced a protocol older than 1.7.
  std::shared_ptr<const EnvParams> env_params;
  /// kConnected / kState [1.7]: the SET_STATE answered a request whose
  /// env_params_seq was 0 (a 1.7+ server's) and has no env_params: the server
  /// has no parameters, so the client drops the set it holds (§19.2).
  bool env_params_dropped = false;
};

/// One client's server connection and the thread that owns it.
///
/// Thread safety: start() and close() from the owning thread; submit(),
/// has_room(), wait_until(), retire(), take_events() and the counters from any thread
/// (they lock); the Transport and ClientConnection belong to the I/O thread.
class ServerLink {
 public:
  /// A link that is not started yet.
  explicit ServerLink(LinkOptions options);
  /// Closes (stops and joins the I/O thread).
  ~ServerLink();
  ServerLink(const ServerLink&) = delete;
  ServerLink& operator=(const ServerLink&) = delete;

  /// Starts the I/O thread and waits for the first connection (retrying until
  /// reconnect_timeout_s). Returns what ended the first attempt: AUTH_FAILED,
  /// VERSION_MISMATCH, CONNECTION_FAILED, TIMEOUT, TRAINING_DONE (the
  /// server's run ended during the handshake)...
  Status start();

  /// Stops the I/O thread and closes the connection; undelivered batches are
  /// dropped. A name lookup in progress (getaddrinfo) cannot be cancelled:
  /// close() waits for it to return (at most the system resolver's timeout).
  void close();

  /// Queues a batch (never blocks). When the waiting batches would exceed the
  /// queue's bound, the oldest are dropped together with the rest of their
  /// episodes; returns the ids of the episodes dropped, and the batches
  /// dropped in `dropped` when given (never sent: their client may reuse
  /// what they hold). Once training is done the batch is discarded instead
  /// (done, counted in batches_unsent_at_end() if it holds records). With
  /// `wake` false an idle I/O thread is not woken: the caller calls wake()
  /// soon (e.g. once its frame is done, so that the batch's encoding does not
  /// compete with it).
  std::set<std::string> submit(std::shared_ptr<Batch> batch,
                               std::vector<std::shared_ptr<Batch>>* dropped = nullptr, bool wake = true);

  /// Wakes the I/O thread (it then takes what was submitted without waking it). Any thread.
  void wake() noexcept;

  /// Whether a batch of `steps` would be queued without dropping one.
  bool has_room(std::size_t steps) const;

  /// How a client hands over a batch it has cut: with `wait_for_room`, first
  /// waits until its `steps` fit (backpressure; the steps are cut already, so
  /// they are queued whatever happens meanwhile); then submit(); with
  /// `wait_for_answer`, waits until the batch is answered, refused or given
  /// up (strict on-policy; errors about other things do not end the wait).
  /// Returns the episodes submit() dropped (and the batches, in `dropped`).
  /// `wake` as for submit() (the I/O thread is always woken to answer a wait).
  std::set<std::string> hand_over(const std::shared_ptr<Batch>& batch, std::size_t steps, bool wait_for_room,
                                  bool wait_for_answer, std::vector<std::shared_ptr<Batch>>* dropped = nullptr,
                                  bool wake = true);

  /// Blocks until `predicate()` holds, or the link fails for good, ends
  /// (training done) or is closed. The predicate runs under the link's lock:
  /// it must not call the link.
  void wait_until(const std::function<bool()>& predicate);

  /// Hands a model the engine no longer uses to the I/O thread, which
  /// destroys it: freeing a runtime session takes tens of microseconds, not
  /// to be spent on a frame. Any thread; null is ignored. Once the link is
  /// closing or its I/O thread has stopped, the model is destroyed here.
  void retire(std::shared_ptr<LoadedPolicy> policy);

  /// Blocks until a batch of `steps` would be queued without dropping one (or the link ends).
  void wait_for_room(std::size_t steps);
  /// Blocks until no batch is queued or in flight (or the link ends).
  void wait_for_idle();

  /// Whether events are waiting (a cheap check, no lock).
  bool events_pending() const noexcept { return events_pending_.load(std::memory_order_acquire); }
  /// Moves the waiting events to `out` (a fatal event is left in place too, so it repeats).
  void take_events(std::vector<LinkEvent>& out);
  /// take_events() into a deque.
  void take_events(std::deque<LinkEvent>& out);

  /// Sends `message` (e.g. MAP_AGENTS) through the I/O thread and waits at
  /// most `timeout_s` for its answer (the engine's only network wait besides
  /// waiting for weights). Resent after a reconnect. Returns the answer, the
  /// server's ERROR as its status, TIMEOUT naming the request, CLOSED,
  /// TRAINING_DONE (the server's run is done: nothing answers any more), or
  /// the fatal status.
  Result<Message> request(nlohmann::json message, double timeout_s);

  /// Events waiting for take_events().
  std::size_t events_waiting() const;

  /// Whether no batch is queued or in flight.
  bool idle() const;
  /// This link's client_session (32 hex characters).
  const std::string& client_session() const noexcept { return client_session_; }
  /// Connections re-established after a loss.
  std::int64_t reconnects() const noexcept { return reconnects_.load(); }
  /// Batches dropped because the queue was full.
  std::int64_t batches_dropped() const noexcept { return batches_dropped_.load(); }
  /// PINGs sent as heartbeats.
  std::int64_t heartbeats_sent() const noexcept { return heartbeats_sent_.load(); }
  /// Agent steps the server refused as too stale to be trained, summed over
  /// its SET_STATE answers' steps_refused_stale (protocol 1.3, §7.6, §13.2).
  std::uint64_t steps_refused_stale() const noexcept { return steps_refused_stale_.load(); }
  /// [1.7] Parameter sets the server sent that broke §19.1's rules and were
  /// ignored (the client kept the set it held): one per SET_STATE carrying
  /// such a set (any thread).
  std::uint64_t env_params_ignored() const noexcept { return env_params_ignored_.load(); }
  /// [1.6] Steps let go unsent because their record (a multi-agent record's
  /// agent entry) held logged steps and was to go to a server older than 1.6
  /// (a batch cut for a 1.6 server and sent again after a reconnect to an
  /// older one): such a server would train on them as its policy's samples
  /// (§15). Every step of such a record counts, sampled ones included. Any thread.
  std::uint64_t logged_steps_dropped() const noexcept { return logged_steps_dropped_.load(); }
  /// [1.8] Agent steps of batches let go unsent because they were acted with
  /// the weights of another server run (§6.5): a batch cut on a connection
  /// whose PONG named one run_id, to be sent (or sent again after a
  /// reconnect) on a connection whose PONG names another (the server
  /// restarted without resuming). Any thread.
  std::uint64_t other_run_steps_dropped() const noexcept { return other_run_steps_dropped_.load(); }
  /// The share of new training episodes the server asks this client to
  /// record (protocol 1.3, SET_STATE record_share, §7.6, §13.2): the last
  /// valid value received, 1 when the last SET_STATE had none (any thread).
  double record_share() const noexcept { return record_share_.load(std::memory_order_relaxed); }
  /// The steps per batch the server asks this client to play (protocol 1.3,
  /// SET_STATE steps_per_batch, §7.6, §13.2): the last valid value received,
  /// 0 when the last SET_STATE had none (then env_steps_per_sample applies;
  /// the clients also count a value above it as env_steps_per_sample; any thread).
  std::int64_t steps_per_batch() const noexcept { return steps_per_batch_.load(std::memory_order_relaxed); }
  /// Whether the server said its run is done (ERROR TRAINING_DONE, protocol
  /// 1.3, §6.6): the link has ended for good, normally (any thread).
  bool training_done() const noexcept { return training_done_.load(std::memory_order_acquire); }
  /// The summary that came with TRAINING_DONE; none while training goes on (any thread; takes the lock).
  std::optional<TrainingSummary> training_summary() const;
  /// Batches discarded because training was done before they were sent or
  /// answered (§6.6): those queued or in flight then, those submitted later,
  /// and what the engine counted with count_unsent_at_end() (any thread).
  std::int64_t batches_unsent_at_end() const noexcept { return batches_unsent_at_end_.load(); }
  /// Counts `batches` more discarded at the end of training (the engine's
  /// steps recorded but not cut yet when it heard of it; any thread).
  void count_unsent_at_end(std::int64_t batches = 1) noexcept { batches_unsent_at_end_.fetch_add(batches); }
  /// [1.9] Redirects to another rank of a server group followed (§6.7):
  /// the handshakes completed at the rank a PONG named in "redirect" (any thread).
  std::int64_t redirects() const noexcept { return redirects_.load(); }
  /// [1.9] The ranks of a server group the latest PONG that named any named
  /// (§6.7: addresses only, each once, in rank order); empty while no PONG
  /// named any (a single server). Any thread; a copy, taken under the lock.
  std::vector<Address> ranks() const;
  /// [1.9] The address of the server (of a group: the rank) the link is
  /// connected to, or was last, as "host:port" (an IPv6 host in brackets);
  /// the address given (address()) before the first connection. Any thread.
  std::string connected_address() const;
  /// The address the application gave (LinkOptions::host and port), "host:port".
  std::string address() const;

 private:
  enum class Outcome { kAnswer, kRefused, kLost, kTimeout };
  struct Exchange {
    Outcome outcome = Outcome::kLost;
    Message answer;
    Status status;
    bool server_framing_error = false;  // the server sent ERROR BAD_HEADER/FRAME_TOO_LARGE
  };
  struct PendingRequest {
    nlohmann::json message;
    std::string type;
    bool done = false;       // answered, refused or failed (under mutex_)
    bool abandoned = false;  // its waiter gave up (under mutex_)
    Status status;
    Message answer;
  };

  void run();
  Status connect_with_retry(std::chrono::steady_clock::time_point down_since, bool first);
  Status open(const Address& address, std::chrono::steady_clock::time_point deadline);
  Status connect_to(const Address& address, std::chrono::steady_clock::time_point deadline, bool& reached);
  Status handshake(const Address& here, bool redirected, std::optional<Address>& redirect);
  static Status read_pong_version(LinkConfig& config);
  Status start_offline();
  Status read_config(const nlohmann::json& body, LinkConfig& config) const;
  Status serve();
  Status send_batch(const std::shared_ptr<Batch>& batch);
  Status send_request(const std::shared_ptr<PendingRequest>& request);
  Status idle_wait();
  Status send_raw(const nlohmann::json& message, const std::string* attachment = nullptr);
  Exchange exchange(const nlohmann::json& message, double timeout_s, const char* setting, Batch* batch,
                    const std::string* attachment = nullptr);
  void encode_records(Batch& batch, const LinkConfig& config);
  Exchange read_answer(const char* request, double timeout_s, const char* setting, Batch* batch);
  Status batch_lost(const std::shared_ptr<Batch>& batch, const Exchange& result);
  void finish_batch(const std::shared_ptr<Batch>& batch, Status error, LinkEvent* state_event);
  const std::optional<std::string>& run_of(std::int64_t connection) const noexcept;
  void drop_other_run(const std::shared_ptr<Batch>& batch);
  bool room_locked(std::size_t steps) const;
  void prepare_state(const nlohmann::json& state, bool initial, LinkEvent& event);
  void count_refused_stale(const nlohmann::json& state);
  void read_record_share(const nlohmann::json& state);
  void read_steps_per_batch(const nlohmann::json& state);
  std::shared_ptr<LoadedPolicy> load_policy(const nlohmann::json& onnx, const std::string& input_name,
                                            const std::string& output_name, const Space& observation_space,
                                            const Space& action_space,
                                            const std::vector<RecurrentStateSpec>& recurrent_state,
                                            const std::string& what);
  template <class Events>
  void take_events_into(Events& out);
  void build_queued();
  void post(LinkEvent event);
  void post_locked(LinkEvent event);
  void post_error(Status status);
  void forget_refused_locked(const Batch& batch);
  void drop_episodes(Batch& batch, const std::set<std::string>& gone);
  void recount_queue_locked();
  void free_retired();
  nlohmann::json state_request(bool initial) const;
  void add_env_params_seq(nlohmann::json& request) const;
  void read_env_params(const nlohmann::json& state, LinkEvent& event);
  bool note_training_done(const Message& message);
  void end_training(bool first);

  LinkOptions options_;
  std::string client_session_;
  Transport transport_;
  ClientConnection connection_;
  std::string send_buffer_;
  std::vector<char> receive_buffer_;
  std::vector<Response> responses_;
  std::shared_ptr<const LinkConfig> config_;  // the current connection's (I/O thread)
  std::optional<std::int64_t> io_seq_;        // the newest weights_seq_no seen (I/O thread)
  std::map<std::string, std::int64_t> io_seqs_;  // per module (I/O thread, multi-agent)
  std::int64_t connection_number_ = 0;        // connections handshaken so far (I/O thread)
  // [1.8] The run_id each connection's PONG named (none: it named none),
  // connection 1 first (I/O thread).
  std::vector<std::optional<std::string>> io_run_ids_;
  bool progress_ = false;                     // an answer arrived on this connection (I/O thread)
  double backoff_s_ = 0.0;                    // pause before reconnecting after a fruitless connection
  std::int64_t next_seq_ = 1;
  std::chrono::steady_clock::time_point last_send_;
  bool io_training_done_ = false;             // an ERROR TRAINING_DONE arrived (I/O thread)
  nlohmann::json io_summary_;                 // its "summary" (I/O thread)
  // [1.7] The seq of the last parameter set this connection was sent (§19.2;
  // 0 on every new connection: a restarted server reuses seqs). I/O thread.
  std::int64_t io_env_params_seq_ = 0;
  // [1.9] The address the application gave, the ranks the latest PONG that
  // named any named, and the address of the connection now (or last) (§6.7).
  // I/O thread; ranks_ and connected_ are also read under mutex_, so the I/O
  // thread writes them under it.
  Address given_;
  std::vector<Address> ranks_;
  Address connected_;

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<LinkEvent> events_;
  std::atomic<bool> events_pending_{false};
  std::deque<std::shared_ptr<Batch>> outbox_;
  std::shared_ptr<Batch> in_flight_;
  std::deque<std::shared_ptr<PendingRequest>> requests_;
  std::size_t queued_steps_ = 0;
  std::size_t queue_limit_steps_ = 1000;
  // Models the engine retired (under mutex_), and the I/O thread's list it
  // swaps them into and destroys: the two vectors trade capacities, so
  // retiring allocates nothing once both have grown.
  std::vector<std::shared_ptr<LoadedPolicy>> retired_;
  std::vector<std::shared_ptr<LoadedPolicy>> retired_io_;
  // Dropped batches whose records the I/O thread built, freed there too (and its list).
  std::vector<std::shared_ptr<Batch>> retired_batches_;
  std::vector<std::shared_ptr<Batch>> retired_batches_io_;
  std::set<std::string> refused_episodes_;     // until the engine has taken the refusal
  std::deque<std::string> refused_order_;      // oldest first (bounds the set)
  bool fatal_ = false;
  Status fatal_status_;
  bool stopped_ = false;
  bool offline_ = false;  // [§20] started from an offline policy file: no I/O thread, nothing sent
  std::shared_ptr<const TrainingSummary> training_summary_;  // set once training is done (under mutex_)
  Status training_done_status_;               // what requests get once training is done (under mutex_)
  bool connected_once_ = false;
  bool closing_ = false;
  Status first_status_;
  std::atomic<std::int64_t> reconnects_{0};
  std::atomic<std::int64_t> redirects_{0};  // [1.9] written by the I/O thread only
  std::atomic<std::int64_t> batches_dropped_{0};
  std::atomic<std::int64_t> heartbeats_sent_{0};
  std::atomic<std::uint64_t> steps_refused_stale_{0};  // written by the I/O thread only
  std::atomic<std::uint64_t> env_params_ignored_{0};   // [1.7] written by the I/O thread only
  std::atomic<std::uint64_t> logged_steps_dropped_{0};  // written by the I/O thread only
  std::atomic<std::uint64_t> other_run_steps_dropped_{0};  // [1.8] written by the I/O thread only
  std::atomic<double> record_share_{1.0};              // written by the I/O thread only
  std::atomic<std::int64_t> steps_per_batch_{0};       // 0: none asked (I/O thread writes)
  std::atomic<bool> training_done_{false};             // written under mutex_ by the I/O thread
  std::atomic<std::int64_t> batches_unsent_at_end_{0};
  std::thread thread_;
};

}  // namespace tether
