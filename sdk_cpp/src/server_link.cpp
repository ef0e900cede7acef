// The client's I/O thread: connect, handshake, send batches, heartbeats,
// timeouts, reconnects (see server_link.h and sdk_python/server_link.py).
#include "tether/server_link.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <utility>

#include "json_util.h"
#include "tether/distributions.h"
#include "tether/offline_policy.h"
#include "tether/onnx_codec.h"
#include "tether/platform/socket.h"

namespace tether {

namespace {

using Clock = std::chrono::steady_clock;

// The SDK's name and version, sent in the handshake PING (docs/protocol.md §7.1).
constexpr const char* kSdkName = "tether-cpp/0.1.0";

std::chrono::milliseconds to_ms(double seconds) {
  if (!(seconds > 0)) return std::chrono::milliseconds(0);
  if (seconds > 1e9) seconds = 1e9;
  return std::chrono::milliseconds(static_cast<std::int64_t>(seconds * 1000.0));
}

Transport::Deadline deadline_after(double seconds) { return Clock::now() + to_ms(seconds); }

std::string random_hex(std::size_t chars) {
  std::random_device device;
  std::mt19937_64 generator((static_cast<std::uint64_t>(device()) << 32) ^ device() ^
                            static_cast<std::uint64_t>(Clock::now().time_since_epoch().count()));
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (std::size_t i = 0; i < chars; ++i) out += kHex[generator() & 15u];
  return out;
}

std::string format_s(double seconds) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", seconds);
  return text;
}

// Reads an integer member (not a bool, not a float) of a JSON object.
std::optional<std::int64_t> int_member(const nlohmann::json& object, const char* key) {
  if (!object.is_object()) return std::nullopt;
  auto it = object.find(key);
  if (it == object.end() || !it->is_number_integer()) return std::nullopt;
  return it->get<std::int64_t>();
}

std::optional<double> number_member(const nlohmann::json& object, const char* key) {
  if (!object.is_object()) return std::nullopt;
  auto it = object.find(key);
  if (it == object.end() || !it->is_number()) return std::nullopt;
  return it->get<double>();
}

const std::string* first_string(const nlohmann::json& object, const char* key) {
  if (!object.is_object()) return nullptr;
  auto it = object.find(key);
  if (it == object.end() || !it->is_array() || it->empty() || !(*it)[0].is_string()) return nullptr;
  return (*it)[0].get_ptr<const std::string*>();
}

// The ids of a batch's episodes (single-agent chunks and multi-agent records).
std::vector<std::string> episode_ids_of(const Batch& batch) {
  std::vector<std::string> ids;
  ids.reserve(batch.chunks.size() + batch.records.size() + batch.pending_records.size());
  for (const EpisodeChunk& chunk : batch.chunks) ids.push_back(chunk.episode_id.value_or(""));
  for (const MultiAgentRecord& record : batch.records) ids.push_back(record.episode_id.value_or(""));
  for (const PendingRecord& record : batch.pending_records) ids.push_back(record.episode_id);
  return ids;
}

std::int64_t agent_steps_of(const MultiAgentRecord& record) {
  std::int64_t steps = 0;
  for (const auto& entry : record.agents) steps += static_cast<std::int64_t>(entry.second.chunk.steps());
  return steps;
}

constexpr std::size_t kMaxRefusedEpisodes = 4096;

// The send queue's step limit when SET_CONFIG sets it: generous, and far from
// overflowing the sums it takes part in, whatever numbers the server sends.
constexpr std::int64_t kMaxQueueLimitSteps = std::int64_t{1} << 40;

// Heartbeats no closer than this: a tiny interval (a server's typo) would
// make the I/O thread ping in a tight loop.
constexpr double kMinHeartbeatIntervalS = 0.1;

// a * b for positive a and b, saturated at `cap` (no signed overflow).
std::int64_t saturating_product(std::int64_t a, std::int64_t b, std::int64_t cap) {
  if (a <= 0 || b <= 0) return 0;
  if (a > cap / b) return cap;
  return std::min(a * b, cap);
}

// Whether `steps` more fit under `limit` with `queued` waiting (no unsigned wrap).
bool fits(std::size_t queued, std::size_t steps, std::size_t limit) {
  return steps <= limit && queued <= limit - steps;
}

// Leaves out every record's and agent entry's weights_seq_no_runs (§10.1).
void strip_runs(nlohmann::json& episodes) {
  for (nlohmann::json& record : episodes) {
    if (!record.is_object()) continue;
    record.erase("weights_seq_no_runs");
    auto agents = record.find("agents");
    if (agents == record.end() || !agents->is_object()) continue;
    for (nlohmann::json& entry : *agents) {
      if (entry.is_object()) entry.erase("weights_seq_no_runs");
    }
  }
}

// [1.6] Lets go of every record (a multi-agent record's agent entry) that
// holds logged steps: a server older than 1.6 would ignore "logged_runs" and
// train on them as its policy's samples (§15). Returns the steps let go.
std::int64_t drop_logged(Batch& batch) {
  std::int64_t dropped = 0;
  auto steps_of = [](const nlohmann::json& record) -> std::int64_t {
    const nlohmann::json* actions = detail::member(record, "actions");
    return actions != nullptr && actions->is_array() ? static_cast<std::int64_t>(actions->size()) : 0;
  };
  auto logged = [](const nlohmann::json& record) {
    const nlohmann::json* runs = detail::member(record, "logged_runs");
    return runs != nullptr && runs->is_array() && !runs->empty();
  };
  nlohmann::json kept = nlohmann::json::array();
  for (nlohmann::json& record : batch.episodes) {
    auto agents = record.is_object() ? record.find("agents") : record.end();
    if (record.is_object() && agents != record.end() && agents->is_object()) {
      for (auto entry = agents->begin(); entry != agents->end();) {
        if (!logged(*entry)) {
          ++entry;
          continue;
        }
        const std::int64_t steps = steps_of(*entry);
        batch.agent_steps -= std::min(batch.agent_steps, steps);
        dropped += steps;
        entry = agents->erase(entry);
      }
      kept.push_back(std::move(record));
    } else if (logged(record)) {
      const std::int64_t steps = steps_of(record);
      batch.env_steps -= std::min(batch.env_steps, steps);
      if (batch.agent_steps > 0) batch.agent_steps -= std::min(batch.agent_steps, steps);
      dropped += steps;
    } else {
      kept.push_back(std::move(record));
    }
  }
  batch.episodes = std::move(kept);
  return dropped;
}

// Whether a failed handshake says that trying again (or elsewhere) cannot help.
bool handshake_failure_is_final(const Status& status) noexcept {
  return status.code() == ErrorCode::kAuthFailed || status.code() == ErrorCode::kVersionMismatch ||
         status.code() == ErrorCode::kInvalidField || status.code() == ErrorCode::kInferenceFailed;
}

// "a", "a or b", "a, b or c": the addresses a link tried.
std::string addresses_text(const std::vector<Address>& addresses) {
  std::string text;
  for (std::size_t i = 0; i < addresses.size(); ++i) {
    if (i > 0) text += i + 1 == addresses.size() ? " or " : ", ";
    text += format_address(addresses[i]);
  }
  return text;
}

Status server_error_status(const Message& message) {
  Result<ServerError> error = decode_error(message);
  if (!error.ok()) return error.status();
  return error.value().to_status();
}

// A JSON integer >= 1, or none (a boolean is no number; 2.5 is a float).
std::optional<std::uint64_t> positive_integer(const nlohmann::json& value) {
  if (!value.is_number_integer()) return std::nullopt;
  if (value.is_number_unsigned()) {
    const std::uint64_t steps = value.get<std::uint64_t>();
    return steps > 0 ? std::optional<std::uint64_t>(steps) : std::nullopt;
  }
  const std::int64_t steps = value.get<std::int64_t>();
  return steps > 0 ? std::optional<std::uint64_t>(static_cast<std::uint64_t>(steps)) : std::nullopt;
}

// A SET_STATE setting that stays until a state changes it (§7.6 [1.3]): a
// state without the member `key` sets `absent`; one with a value `valid`
// refuses (returns none for) leaves the last valid one.
template <class T, class Valid>
void read_setting(const nlohmann::json& state, const char* key, T absent, Valid valid, std::atomic<T>& setting) {
  if (!state.is_object()) return;
  auto value = state.find(key);
  if (value == state.end()) {
    setting.store(absent, std::memory_order_relaxed);
    return;
  }
  const std::optional<T> read = valid(*value);
  if (read) setting.store(*read, std::memory_order_relaxed);
}

}  // namespace

ServerLink::ServerLink(LinkOptions options)
    : options_(std::move(options)),
      client_session_(random_hex(32)),
      connection_(options_.max_frame_bytes),
      receive_buffer_(64 * 1024),
      given_{options_.host, options_.port},
      connected_(given_) {}

ServerLink::~ServerLink() { close(); }

std::string ServerLink::address() const { return platform::format_peer(options_.host, options_.port); }

std::vector<Address> ServerLink::ranks() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return ranks_;
}

std::string ServerLink::connected_address() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (offline_) return "offline:" + options_.offline_policy;
  return format_address(connected_);
}

Status ServerLink::start() {
  if (!options_.backend_factory) {
    return Status(ErrorCode::kInvalidArgument, "LinkOptions.backend_factory is required (it runs the models)");
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (thread_.joinable() || closing_) return Status(ErrorCode::kInvalidArgument, "the link was already started");
  }
  if (!options_.offline_policy.empty()) return start_offline();
  thread_ = std::thread([this] { run(); });
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [this] { return connected_once_; });
  return first_status_;
}

void ServerLink::close() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closing_ = true;
    if (!fatal_ && (thread_.joinable() || offline_)) {
      // Every later call of the engine hears that the client is closed.
      fatal_ = true;
      fatal_status_ = Status(ErrorCode::kClosed, "client closed");
      LinkEvent event;
      event.kind = LinkEvent::Kind::kFatal;
      event.status = fatal_status_;
      events_.push_back(std::move(event));
      events_pending_.store(true, std::memory_order_release);
    }
    changed_.notify_all();
  }
  transport_.cancel();
  if (thread_.joinable()) thread_.join();
}

// -- engine side -----------------------------------------------------------------------

void ServerLink::drop_episodes(Batch& batch, const std::set<std::string>& gone) {
  auto chunks_end = std::remove_if(batch.chunks.begin(), batch.chunks.end(), [&](const EpisodeChunk& chunk) {
    return gone.count(chunk.episode_id.value_or("")) != 0;
  });
  auto records_end = std::remove_if(batch.records.begin(), batch.records.end(), [&](const MultiAgentRecord& record) {
    return gone.count(record.episode_id.value_or("")) != 0;
  });
  auto pending_end = std::remove_if(batch.pending_records.begin(), batch.pending_records.end(),
                                    [&](const PendingRecord& record) { return gone.count(record.episode_id) != 0; });
  if (chunks_end == batch.chunks.end() && records_end == batch.records.end() &&
      pending_end == batch.pending_records.end()) {
    return;
  }
  batch.chunks.erase(chunks_end, batch.chunks.end());
  batch.records.erase(records_end, batch.records.end());
  batch.pending_records.erase(pending_end, batch.pending_records.end());
  if (batch.records.empty() && batch.pending_records.empty() && batch.agent_steps == 0) {
    std::int64_t steps = 0;
    for (const EpisodeChunk& chunk : batch.chunks) steps += static_cast<std::int64_t>(chunk.steps());
    batch.env_steps = steps;
    return;
  }
  // Multi-agent: agent steps are counted again, env steps scaled with them (as the Python SDK).
  std::int64_t agent_steps = 0;
  for (const EpisodeChunk& chunk : batch.chunks) agent_steps += static_cast<std::int64_t>(chunk.steps());
  for (const MultiAgentRecord& record : batch.records) agent_steps += agent_steps_of(record);
  for (const PendingRecord& record : batch.pending_records) agent_steps += record.agent_steps;
  if (batch.agent_steps > 0) {
    batch.env_steps = static_cast<std::int64_t>(
        std::llround(static_cast<double>(batch.env_steps) * static_cast<double>(agent_steps) /
                     static_cast<double>(batch.agent_steps)));
  }
  batch.agent_steps = agent_steps;
}

void ServerLink::recount_queue_locked() {
  outbox_.erase(std::remove_if(outbox_.begin(), outbox_.end(),
                               [](const std::shared_ptr<Batch>& b) {
                                 return !b->has_data() && !b->even_empty;
                               }),
                outbox_.end());
  queued_steps_ = 0;
  for (const auto& waiting : outbox_) queued_steps_ += waiting->queue_steps();
}

std::set<std::string> ServerLink::submit(std::shared_ptr<Batch> batch,
                                        std::vector<std::shared_ptr<Batch>>* dropped_out, bool wake) {
  std::set<std::string> gone;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (offline_) {  // [§20] nobody to send to (an offline client records nothing to send)
      batch->done = true;
      return gone;
    }
    if (training_done_.load(std::memory_order_relaxed)) {
      // Nobody takes it any more (§6.6): let go, counted; no one waits for it.
      if (batch->has_data()) batches_unsent_at_end_.fetch_add(1);
      batch->done = true;
      return gone;
    }
    const std::size_t steps = batch->queue_steps();
    while (!outbox_.empty() &&
           (outbox_.size() >= options_.max_queued_batches || !fits(queued_steps_, steps, queue_limit_steps_))) {
      std::shared_ptr<Batch> dropped = outbox_.front();
      outbox_.pop_front();
      batches_dropped_.fetch_add(1);
      for (std::string& id : episode_ids_of(*dropped)) gone.insert(std::move(id));
      queued_steps_ -= std::min<std::size_t>(queued_steps_, dropped->queue_steps());
      if (dropped_out != nullptr && dropped->record_source && !dropped->building) {
        dropped_out->push_back(std::move(dropped));  // (its records unbuilt: the client reuses their rows)
      } else if (!dropped->records.empty() && !stopped_ && !closing_) {
        retired_batches_.push_back(std::move(dropped));  // (records the I/O thread built: freed there)
      }
    }
    if (!gone.empty()) {
      for (auto& waiting : outbox_) drop_episodes(*waiting, gone);
      drop_episodes(*batch, gone);
    }
    if (!refused_episodes_.empty()) drop_episodes(*batch, refused_episodes_);
    recount_queue_locked();
    if (batch->has_data() || batch->even_empty) {
      queued_steps_ += batch->queue_steps();  // after its dropped episodes left it
      outbox_.push_back(std::move(batch));
    } else {
      batch->done = true;  // nothing left to send (its episodes were dropped or refused): no one waits for it
    }
  }
  if (wake) transport_.interrupt();
  return gone;
}

void ServerLink::wake() noexcept { transport_.interrupt(); }

bool ServerLink::room_locked(std::size_t steps) const {
  return outbox_.empty() ||
         (outbox_.size() < options_.max_queued_batches && fits(queued_steps_, steps, queue_limit_steps_));
}

bool ServerLink::has_room(std::size_t steps) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return room_locked(steps);
}

std::set<std::string> ServerLink::hand_over(const std::shared_ptr<Batch>& batch, std::size_t steps,
                                            bool wait_for_room, bool wait_for_answer,
                                            std::vector<std::shared_ptr<Batch>>* dropped, bool wake) {
  if (wait_for_room) this->wait_for_room(steps);
  std::set<std::string> gone = submit(batch, dropped, wake || wait_for_answer);
  if (wait_for_answer) {
    const Batch* sent = batch.get();
    wait_until([sent] { return sent->done; });
  }
  return gone;
}

void ServerLink::wait_for_room(std::size_t steps) {
  wait_until([this, steps] { return room_locked(steps); });
}

void ServerLink::wait_for_idle() {
  wait_until([this] { return outbox_.empty() && in_flight_ == nullptr; });
}

bool ServerLink::idle() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return outbox_.empty() && in_flight_ == nullptr;
}

std::size_t ServerLink::events_waiting() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return events_.size();
}

void ServerLink::wait_until(const std::function<bool()>& predicate) {
  // Only the condition asked for (or the link's end) ends the wait: an error
  // event about something else (a refused GET_STATE, a model that failed to
  // load, one the engine has not taken yet) does not.
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    if (fatal_ || stopped_ || closing_ || training_done_.load(std::memory_order_relaxed)) return;
    if (predicate()) return;
    changed_.wait_for(lock, std::chrono::milliseconds(500));
  }
}

void ServerLink::retire(std::shared_ptr<LoadedPolicy> policy) {
  if (!policy) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!stopped_ && !closing_) {
      retired_.push_back(std::move(policy));
      policy = nullptr;
    }
  }
  if (policy) return;  // no I/O thread any more: destroyed here, on leaving
  transport_.interrupt();  // the I/O thread frees it at its next round
}

void ServerLink::free_retired() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (retired_.empty() && retired_batches_.empty()) return;
    retired_.swap(retired_io_);
    retired_batches_.swap(retired_batches_io_);
  }
  retired_io_.clear();  // the old models' runtime sessions are destroyed here, on the I/O thread
  retired_batches_io_.clear();
}

Result<Message> ServerLink::request(nlohmann::json message, double timeout_s) {
  auto request = std::make_shared<PendingRequest>();
  auto type = message.find("type");
  request->type = type != message.end() && type->is_string() ? type->get<std::string>() : std::string("request");
  request->message = std::move(message);
  const Clock::time_point deadline = Clock::now() + to_ms(timeout_s);
  std::unique_lock<std::mutex> lock(mutex_);
  if (fatal_) return fatal_status_;
  if (offline_) {
    // [§20] MAP_AGENTS (the one request a client makes) has nobody to answer it.
    return Status(ErrorCode::kNotReady, request->type + ": an offline client has no server to ask (offline policy '" +
                                            options_.offline_policy +
                                            "', whose SET_CONFIG names no policy_mapping rules for this)");
  }
  if (training_done_.load(std::memory_order_relaxed)) {
    return Status(ErrorCode::kTrainingDone, request->type + " cannot be answered: " + training_done_status_.message());
  }
  if (closing_ || stopped_) return Status(ErrorCode::kClosed, "client closed");
  requests_.push_back(request);
  lock.unlock();
  transport_.interrupt();  // wakes an idle I/O thread
  lock.lock();
  const bool ended = changed_.wait_until(lock, deadline, [&] { return request->done || fatal_ || stopped_ || closing_; });
  if (request->done) {
    if (!request->status.ok()) return request->status;
    return std::move(request->answer);
  }
  request->abandoned = true;  // an answer still on its way is ignored
  auto it = std::find(requests_.begin(), requests_.end(), request);
  if (it != requests_.begin() && it != requests_.end()) requests_.erase(it);  // not sent yet
  if (ended && fatal_) return fatal_status_;
  if (ended && training_done_.load(std::memory_order_relaxed)) {
    return Status(ErrorCode::kTrainingDone, request->type + " cannot be answered: " + training_done_status_.message());
  }
  if (ended) return Status(ErrorCode::kClosed, "client closed");
  return Status(ErrorCode::kTimeout, "no answer to " + request->type + " from " + format_address(connected_) +
                                         " within " + format_s(timeout_s) + " s (response_timeout_s)");
}

template <class Events>
void ServerLink::take_events_into(Events& out) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::size_t taken = 0;
  for (; taken < events_.size(); ++taken) {
    LinkEvent& event = events_[taken];
    if (event.kind == LinkEvent::Kind::kFatal) {
      out.push_back(event);  // a fatal event stays: every later call sees it
      break;
    }
    if (event.kind == LinkEvent::Kind::kBatch && !event.batch->error.ok()) {
      // The engine now hears of the refusal and stops recording those episodes:
      // an id it reuses later is a new episode, sent again.
      for (const std::string& id : event.batch->episode_ids) refused_episodes_.erase(id);
    }
    out.push_back(std::move(event));
  }
  // (A vector, not a deque: the engine's thread frees no node the I/O thread
  // allocated, which could make it consolidate the I/O thread's heap.)
  events_.erase(events_.begin(), events_.begin() + static_cast<std::ptrdiff_t>(taken));
  events_pending_.store(fatal_ || !events_.empty(), std::memory_order_release);
}

void ServerLink::take_events(std::vector<LinkEvent>& out) { take_events_into(out); }

void ServerLink::take_events(std::deque<LinkEvent>& out) { take_events_into(out); }

void ServerLink::post_locked(LinkEvent event) {
  if (events_.size() >= options_.max_queued_events) {
    // An engine that does not read its events: the oldest error goes first
    // (connections, models and batches are bounded by what the engine does).
    auto oldest_error = std::find_if(events_.begin(), events_.end(),
                                     [](const LinkEvent& e) { return e.kind == LinkEvent::Kind::kError; });
    if (oldest_error != events_.end()) {
      events_.erase(oldest_error);
    } else if (event.kind == LinkEvent::Kind::kError) {
      return;
    }
  }
  events_.push_back(std::move(event));
  events_pending_.store(true, std::memory_order_release);
  changed_.notify_all();
}

void ServerLink::post(LinkEvent event) {
  std::lock_guard<std::mutex> lock(mutex_);
  post_locked(std::move(event));
}

void ServerLink::post_error(Status status) {
  LinkEvent event;
  event.kind = LinkEvent::Kind::kError;
  event.status = std::move(status);
  post(std::move(event));
}

void ServerLink::forget_refused_locked(const Batch& batch) {
  for (const std::string& id : batch.episode_ids) {
    if (refused_episodes_.insert(id).second) refused_order_.push_back(id);
  }
  while (refused_order_.size() > kMaxRefusedEpisodes) {
    refused_episodes_.erase(refused_order_.front());
    refused_order_.pop_front();
  }
  // (ids the engine already took out of the set stay in the order list until they age out)
  while (!refused_order_.empty() && refused_episodes_.count(refused_order_.front()) == 0) refused_order_.pop_front();
  for (auto& waiting : outbox_) drop_episodes(*waiting, refused_episodes_);
  recount_queue_locked();
}

std::optional<TrainingSummary> ServerLink::training_summary() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!training_summary_) return std::nullopt;
  return *training_summary_;
}

// -- I/O thread ------------------------------------------------------------------------

bool ServerLink::note_training_done(const Message& message) {
  if (!is_training_done(message)) return false;
  io_training_done_ = true;
  auto summary = message.body.find("summary");
  io_summary_ = summary != message.body.end() ? *summary : nlohmann::json();
  return true;
}

void ServerLink::end_training(bool first) {
  // The server's run is done (ERROR TRAINING_DONE, §6.6): no reconnect, no
  // resend. What is queued or in flight is discarded (and counted), the
  // requests waiting fail, and the engine hears of it (not as an error).
  transport_.close();
  auto summary = std::make_shared<const TrainingSummary>(TrainingSummary::from_json(io_summary_));
  std::string text = "the server at " + (transport_.peer().empty() ? address() : transport_.peer()) +
                     " ended its run (training is done";
  if (!summary->reason.empty()) text += ": " + summary->reason;
  text += ") and answers nothing more";
  std::vector<std::shared_ptr<Batch>> discarded;  // freed here, on the I/O thread, after the lock
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (in_flight_) discarded.push_back(std::move(in_flight_));
    in_flight_.reset();
    for (auto& waiting : outbox_) discarded.push_back(std::move(waiting));
    outbox_.clear();
    queued_steps_ = 0;
    for (const auto& batch : discarded) batch->done = true;  // (an engine waiting for one stops waiting)
    batches_unsent_at_end_.fetch_add(static_cast<std::int64_t>(discarded.size()));
    training_done_status_ = Status(ErrorCode::kTrainingDone, text);
    training_summary_ = summary;
    training_done_.store(true, std::memory_order_release);
    for (auto& request : requests_) {
      request->status = Status(ErrorCode::kTrainingDone, request->type + " cannot be answered: " + text);
      request->done = true;
    }
    requests_.clear();
    if (first) first_status_ = training_done_status_;  // (no configuration: connect() fails with it)
    LinkEvent event;
    event.kind = LinkEvent::Kind::kTrainingDone;
    event.summary = summary;
    post_locked(std::move(event));
  }
}

void ServerLink::run() {
  Clock::time_point down_since = Clock::now();
  bool first = true;
  for (;;) {
    free_retired();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (closing_) break;
    }
    if (!transport_.is_open()) {
      Status status = connect_with_retry(down_since, first);
      if (!status.ok() && io_training_done_) {
        end_training(first);  // (the run ended while this client shook hands)
        break;
      }
      if (!status.ok()) {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!closing_) {
          fatal_ = true;
          fatal_status_ = status;
          if (first) first_status_ = status;
          for (auto& request : requests_) {
            request->status = status;
            request->done = true;
          }
          requests_.clear();
          LinkEvent event;
          event.kind = LinkEvent::Kind::kFatal;
          event.status = status;
          events_.push_back(std::move(event));
          events_pending_.store(true, std::memory_order_release);
        }
        break;
      }
      if (first) {
        std::lock_guard<std::mutex> lock(mutex_);
        connected_once_ = true;
        changed_.notify_all();
      }
      first = false;
    }
    Status status = serve();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (closing_) break;
    }
    if (io_training_done_) {
      end_training(false);  // the link ends here: training is over
      break;
    }
    if (!status.ok()) {
      transport_.close();
      reconnects_.fetch_add(1);
      // A connection that was lost before anything was answered on it keeps
      // the backoff growing (a server that takes the connection and drops it
      // at once is not hammered); an answer resets it.
      backoff_s_ = progress_ ? 0.0 : std::min(backoff_s_ > 0 ? backoff_s_ * 2 : 0.05, 1.0);
      if (backoff_s_ > 0) {
        std::unique_lock<std::mutex> lock(mutex_);
        changed_.wait_for(lock, to_ms(backoff_s_), [this] { return closing_; });
      }
      down_since = Clock::now();
    }
  }
  transport_.close();
  free_retired();
  std::lock_guard<std::mutex> lock(mutex_);
  stopped_ = true;
  connected_once_ = true;
  for (auto& request : requests_) {
    request->status = fatal_ ? fatal_status_ : Status(ErrorCode::kClosed, "client closed");
    request->done = true;
  }
  requests_.clear();
  if (first_status_.ok() && closing_ && !config_) first_status_ = Status(ErrorCode::kClosed, "client closed");
  changed_.notify_all();
}

Status ServerLink::connect_with_retry(Clock::time_point down_since, bool first) {
  const Clock::time_point deadline = down_since + to_ms(options_.reconnect_timeout_s);
  // [1.9] Attempt k goes to the k-th address of the reconnect order counted
  // from the one last connected to (§6.7): the first retries it, the next ones
  // go to the other ranks of its group in turn. (Before the first connection:
  // the address given, alone.)
  const std::vector<Address> order = reconnect_order(given_, ranks_, connected_);
  std::size_t attempt = 0;
  double delay = 0.05;
  Status last;
  for (;;) {
    free_retired();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (closing_) return Status(ErrorCode::kClosed, "client closed");
    }
    bool reached = false;
    Status status = connect_to(order[attempt % order.size()], deadline, reached);
    if (status.ok()) return status;
    if (reached) {  // a handshake failed
      if (io_training_done_) {
        transport_.close();
        return status;  // the run is over: never connected to again (§6.6)
      }
      if (handshake_failure_is_final(status)) {
        transport_.close();
        return status;  // retrying cannot help
      }
      if (status.code() == ErrorCode::kTimeout) {
        transport_.close();
        if (first) return status;
        post_error(status);
      }
    }
    if (status.code() == ErrorCode::kClosed) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (closing_) return status;
    }
    transport_.close();
    last = status;
    // A server at its connection limit, or refusing this address for a while, asks for at least
    // 1 s between attempts (§6.6).
    const bool wait_longer =
        status.code() == ErrorCode::kTooManyConnections || status.code() == ErrorCode::kAuthThrottled;
    double pause = wait_longer ? std::max(delay, 1.0) : delay;
    const Clock::time_point now = Clock::now();
    if (now >= deadline) {
      return Status(ErrorCode::kConnectionFailed, "could not reach a Tether server at " + addresses_text(order) +
                                                      " within " + format_s(options_.reconnect_timeout_s) +
                                                      " s (reconnect_timeout_s): " + last.to_string());
    }
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait_until(lock, std::min(deadline, now + to_ms(pause)), [this] { return closing_; });
    delay = std::min(delay * 2, 1.0);
    ++attempt;
  }
}

// Connects to `address`. A connect that interrupt() cut short (a batch was
// queued meanwhile) is made again, until `deadline`.
Status ServerLink::open(const Address& address, Clock::time_point deadline) {
  for (;;) {
    Status status = transport_.connect(address.host, address.port, to_ms(options_.connect_timeout_s));
    if (status.ok()) {
      connection_.reset();
      return status;
    }
    if (status.code() != ErrorCode::kClosed || Clock::now() >= deadline) return status;
    std::lock_guard<std::mutex> lock(mutex_);
    if (closing_) return status;
  }
}

// One attempt: connects to `address` and shakes hands there. [1.9] A PONG's
// redirect (§6.7) is followed: the connection, on which nothing but PING was
// sent, is closed and the handshake is made at the rank it names, saying
// "redirected"; when that fails on a lost connection or a timeout, the link
// connects again to `address`, saying "redirected" too, so that it is kept
// there. `reached` tells whether the failure returned, if any, was a
// handshake's (a TCP connection was made), not a connect's.
Status ServerLink::connect_to(const Address& address, Clock::time_point deadline, bool& reached) {
  reached = false;
  Status status = open(address, deadline);
  if (!status.ok()) return status;
  reached = true;
  std::optional<Address> target;
  status = handshake(address, false, target);
  if (!status.ok() || !target) return status;
  transport_.close();  // nothing but PING was sent on it
  std::optional<Address> ignored;  // (a redirect is not followed twice)
  Status moved = open(*target, deadline);
  if (moved.ok()) {
    moved = handshake(*target, true, ignored);
    if (moved.ok()) {
      redirects_.fetch_add(1);
      return moved;
    }
  }
  transport_.close();
  bool closing = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closing = closing_;
  }
  if (closing || io_training_done_ || handshake_failure_is_final(moved)) return moved;  // (as a handshake's)
  // The rank named could not be reached: back to `address`, which keeps the client.
  reached = false;
  status = open(address, deadline);
  if (!status.ok()) return status;
  reached = true;
  return handshake(address, true, ignored);
}

Status ServerLink::read_config(const nlohmann::json& body, LinkConfig& config) const {
  const bool has_spaces = body.contains("observation_space") && body.contains("action_space");
  if (has_spaces) {
    Result<Space> obs_space = Space::from_json(body["observation_space"]);
    if (!obs_space.ok()) return obs_space.status();
    Result<Space> action_space = Space::from_json(body["action_space"]);
    if (!action_space.ok()) return action_space.status();
    if (action_space.value().is_composite()) {
      return Status(ErrorCode::kInvalidField, "SET_CONFIG action_space is a Dict or Tuple: an action space never is (§8.6)");
    }
    config.observation_space = obs_space.value();
    config.action_space = action_space.value();
    const nlohmann::json* mask = detail::member(body, "action_mask");
    if (mask != nullptr && !mask->is_null()) {
      if (!mask->is_string()) return Status(ErrorCode::kInvalidField, "SET_CONFIG action_mask must be a leaf path");
      Result<ActionMask> resolved =
          ActionMask::resolve(config.observation_space, config.action_space, mask->get_ref<const std::string&>());
      if (!resolved.ok()) return Status(ErrorCode::kInvalidField, "SET_CONFIG " + resolved.status().message());
      config.action_mask = std::move(resolved).value();
    }
  } else if (!options_.multi_agent) {
    return Status(ErrorCode::kInvalidField, "SET_CONFIG describes no observation_space/action_space "
                                            "(a multi-agent server needs the multi-agent client)");
  }
  // [1.5] The default module's memory (§7.4): refused as a module's would be (§9.1).
  Result<std::vector<RecurrentStateSpec>> state =
      recurrent_state_from_json(detail::member(body, "recurrent_state"), "SET_CONFIG");
  if (!state.ok()) return state.status();
  config.recurrent_state = std::move(state).value();
  if (const std::string* name = first_string(body, "onnx_input_names")) config.input_name = *name;
  if (const std::string* name = first_string(body, "onnx_output_names")) config.output_name = *name;
  if (auto sps = int_member(body, "env_steps_per_sample"); sps && *sps > 0) config.env_steps_per_sample = *sps;
  auto force = body.find("force_on_policy");
  config.force_on_policy = force == body.end() || !force->is_boolean() || force->get<bool>();
  if (auto hb = number_member(body, "heartbeat_interval_s"); hb && *hb > 0 && std::isfinite(*hb)) {
    config.heartbeat_interval_s = std::max(*hb, kMinHeartbeatIntervalS);
  }
  if (options_.max_queued_steps > 0) {
    config.queue_limit_steps = options_.max_queued_steps;
  } else {
    // (max_staleness + 1) * train_batch_size, or 2 * env_steps_per_sample:
    // the server's numbers may be anything, so saturated, never overflowing.
    auto batch = int_member(body, "train_batch_size");
    auto staleness = int_member(body, "max_staleness");
    std::int64_t limit = 0;
    if (batch && staleness && *batch > 0 && *staleness >= 0) {
      const std::int64_t rounds = std::min(*staleness, kMaxQueueLimitSteps - 1) + 1;
      limit = saturating_product(rounds, *batch, kMaxQueueLimitSteps);
    } else {
      limit = saturating_product(2, config.env_steps_per_sample, kMaxQueueLimitSteps);
    }
    config.queue_limit_steps = static_cast<std::size_t>(std::max<std::int64_t>(limit, 1));
  }
  if (!options_.multi_agent) return Status::Ok();
  auto modules = body.find("modules");
  if (modules == body.end() || !modules->is_object() || modules->empty()) {
    return Status(ErrorCode::kInvalidField, "SET_CONFIG describes no \"modules\" (the server speaks RLlink < 1.2: "
                                            "use TetherClient)");
  }
  for (auto it = modules->begin(); it != modules->end(); ++it) {
    Result<ModuleSpec> spec = ModuleSpec::from_json(it.key(), it.value());
    if (!spec.ok()) return Status(ErrorCode::kInvalidField, "SET_CONFIG modules: " + spec.status().message());
    config.modules.emplace(it.key(), std::move(spec.value()));
  }
  auto rules = body.find("policy_mapping");
  if (rules != body.end() && !rules->is_null()) {
    Result<PolicyMapping> mapping = PolicyMapping::from_json(*rules);
    if (!mapping.ok()) return Status(ErrorCode::kInvalidField, "SET_CONFIG policy_mapping: " + mapping.status().message());
    for (const std::string& module : mapping.value().modules()) {
      if (config.modules.count(module) == 0) {
        return Status(ErrorCode::kInvalidField, "SET_CONFIG policy_mapping names module '" + module +
                                                    "', which is not in \"modules\"");
      }
    }
    config.mapping = std::move(mapping.value());
  }
  auto groups = body.find("groups");
  if (groups != body.end() && !groups->is_null()) {
    if (!groups->is_object()) return Status(ErrorCode::kInvalidField, "SET_CONFIG groups is not an object");
    std::set<std::string> members;
    for (auto it = groups->begin(); it != groups->end(); ++it) {
      Result<GroupSpec> group = GroupSpec::from_json(it.key(), it.value());
      if (!group.ok()) return Status(ErrorCode::kInvalidField, "SET_CONFIG groups: " + group.status().message());
      for (const std::string& member : group.value().members) {
        if (!members.insert(member).second || groups->contains(member)) {
          return Status(ErrorCode::kInvalidField, "SET_CONFIG groups: agent '" + member +
                                                      "' is in two groups, or is a group itself");
        }
      }
      config.groups.emplace(it.key(), std::move(group.value()));
    }
  }
  return Status::Ok();
}

// The PONG's protocol_version (server_info): what the server speaks, or
// VERSION_MISMATCH for another major version.
Status ServerLink::read_pong_version(LinkConfig& config) {
  auto version = config.server_info.find("protocol_version");
  if (version == config.server_info.end()) return Status::Ok();  // a plain RLlink v1 server
  config.announces_version = true;
  std::string text = version->is_string() ? version->get<std::string>() : std::string("?");
  Result<ProtocolVersion> parsed = parse_version(text);
  if (!parsed.ok() || parsed.value().major != 1) {
    return Status(ErrorCode::kVersionMismatch, "server speaks RLlink " + text + ", this client " +
                                                   std::string(kProtocolVersion));
  }
  config.speaks_1_3 = parsed.value().minor >= 3;
  config.speaks_1_4 = parsed.value().minor >= 4;
  config.speaks_1_6 = parsed.value().minor >= 6;
  config.speaks_1_7 = parsed.value().minor >= 7;
  return Status::Ok();
}

// [§20] No server: the offline policy file's PONG, SET_CONFIG and SET_STATE
// are taken as a first connection's handshake would take them, and no I/O
// thread starts. The link is stopped_ from here on (nothing waits, a retired
// model is freed at once); submit lets batches go and request refuses MAP_AGENTS.
Status ServerLink::start_offline() {
  Result<OfflinePolicy> file = read_offline_policy(options_.offline_policy);
  if (!file.ok()) return file.status();
  auto config = std::make_shared<LinkConfig>();
  config->server_info = std::move(file.value().pong);
  Status version = read_pong_version(*config);
  if (!version.ok()) return Status(version.code(), "offline policy '" + options_.offline_policy + "': " + version.message());
  const std::string named = "offline policy '" + options_.offline_policy + "': ";
  if (!options_.multi_agent && !file.value().state.contains("onnx_file")) {
    return Status(ErrorCode::kInvalidField,
                  named + "its server has no default module (it has several, or maps agents itself): a single-agent "
                          "client has no model in it; use a multi-agent client");
  }
  config->server_config = std::move(file.value().config);
  Status read = read_config(config->server_config, *config);
  if (!read.ok()) return Status(read.code(), named + read.message());
  config_ = config;
  connection_number_ = 1;
  LinkEvent event;
  event.kind = LinkEvent::Kind::kConnected;
  event.config = config;
  event.connection = connection_number_;
  prepare_state(file.value().state, true, event);
  std::lock_guard<std::mutex> lock(mutex_);
  // A model or state the client could not take (posted as errors, as from a server) fails the
  // start instead: nothing else will ever bring another (§20).
  for (const LinkEvent& posted : events_) {
    if (posted.kind == LinkEvent::Kind::kError) {
      Status failed(posted.status.code(), named + posted.status.message());
      events_.clear();
      events_pending_.store(false, std::memory_order_release);
      return failed;
    }
  }
  offline_ = true;
  stopped_ = true;
  connected_once_ = true;
  queue_limit_steps_ = config->queue_limit_steps;
  post_locked(std::move(event));
  return Status::Ok();
}

Status ServerLink::handshake(const Address& here, bool redirected, std::optional<Address>& redirect) {
  progress_ = false;
  redirect.reset();
  PingOptions ping;
  ping.client_name = options_.client_name;
  ping.auth_token = options_.auth_token;
  nlohmann::json ping_message = make_ping(ping);
  ping_message["sdk"] = kSdkName;  // shown in the server's console (§7.1)
  if (redirected) ping_message["redirected"] = true;  // [1.9] (§7.1): it is not redirected again
  Exchange pong = exchange(ping_message, options_.response_timeout_s, "response_timeout_s", nullptr);
  if (pong.outcome != Outcome::kAnswer) return pong.status;
  auto config = std::make_shared<LinkConfig>();
  config->server_info = pong.answer.body;
  Status version = read_pong_version(*config);
  if (!version.ok()) return version;
  // [1.9] A group's ranks, and a redirect to follow before anything else (§6.7).
  std::vector<Address> named = rank_addresses(config->server_info);
  if (!named.empty()) {
    std::lock_guard<std::mutex> lock(mutex_);
    ranks_ = std::move(named);
  }
  redirect = redirect_of(config->server_info, here, redirected);
  if (redirect) return Status::Ok();
  Exchange set_config = exchange(make_get_config(), options_.response_timeout_s, "response_timeout_s", nullptr);
  if (set_config.outcome != Outcome::kAnswer) return set_config.status;
  config->server_config = set_config.answer.body;
  Status read = read_config(config->server_config, *config);
  if (!read.ok()) return read;
  config_ = config;
  io_seqs_.clear();  // a new connection sends every model again
  io_env_params_seq_ = 0;  // [1.7] this connection was sent no parameter set yet (§19.2)
  Exchange state = exchange(state_request(true), options_.response_timeout_s, "response_timeout_s", nullptr);
  if (state.outcome != Outcome::kAnswer) return state.status;
  ++connection_number_;
  io_run_ids_.push_back(run_id_of(config->server_info));  // [1.8] the run it reached, if its PONG named one
  LinkEvent event;
  event.kind = LinkEvent::Kind::kConnected;
  event.config = config;
  event.connection = connection_number_;
  prepare_state(state.answer.body, true, event);
  std::lock_guard<std::mutex> lock(mutex_);
  queue_limit_steps_ = config->queue_limit_steps;
  connected_ = here;
  post_locked(std::move(event));
  return Status::Ok();
}

nlohmann::json ServerLink::state_request(bool initial) const {
  nlohmann::json request;
  if (options_.multi_agent) {
    request = make_get_state(initial ? std::map<std::string, std::int64_t>() : io_seqs_);
  } else {
    request = initial || !io_seq_ ? make_get_state() : make_get_state(io_seq_);
  }
  add_env_params_seq(request);
  return request;
}

// [1.7] Every GET_STATE and EPISODES_AND_GET_STATE to a server whose PONG
// announced 1.7 or later says which parameter set this connection holds (§19.2).
void ServerLink::add_env_params_seq(nlohmann::json& request) const {
  if (config_ && config_->speaks_1_7) request["env_params_seq"] = io_env_params_seq_;
}

// [1.7] A SET_STATE's "env_params" (§19.2): parsed here, handed to the engine
// with the state's event (applied between two of its calls, as a model is).
// Taken only from a server whose PONG announced 1.7 or later (the one asked
// with env_params_seq): from any other server it is ignored. A set that breaks
// §19.1 is ignored (and counted): the client keeps the set it holds, and this
// connection's env_params_seq stays. An answer without env_params to a request
// that carried env_params_seq 0 (io_env_params_seq_ is what the request carried:
// only an answer changes it) says the server has no parameters: the engine
// drops the set it holds.
void ServerLink::read_env_params(const nlohmann::json& state, LinkEvent& event) {
  if (!config_ || !config_->speaks_1_7 || !state.is_object()) return;
  auto found = state.find("env_params");
  if (found == state.end()) {
    event.env_params_dropped = io_env_params_seq_ == 0;
    return;
  }
  Result<EnvParams> params = EnvParams::from_json(*found);
  if (!params.ok()) {
    env_params_ignored_.fetch_add(1);  // (once per answer: it is sent again with every answer)
    return;
  }
  io_env_params_seq_ = params.value().seq;
  event.env_params = std::make_shared<const EnvParams>(std::move(params).value());
}

std::shared_ptr<LoadedPolicy> ServerLink::load_policy(const nlohmann::json& onnx, const std::string& input_name,
                                                      const std::string& output_name, const Space& observation_space,
                                                      const Space& action_space,
                                                      const std::vector<RecurrentStateSpec>& recurrent_state,
                                                      const std::string& what) {
  if (!onnx.is_string()) {
    post_error(Status(ErrorCode::kInvalidField, "SET_STATE " + what + "onnx_file is not a string"));
    return nullptr;
  }
  Result<std::vector<std::uint8_t>> model = decode_onnx_file(onnx.get_ref<const std::string&>());
  if (!model.ok()) {
    post_error(Status(model.status().code(), what + model.status().message()));
    return nullptr;
  }
  auto policy = std::make_shared<LoadedPolicy>();
  policy->backend = options_.backend_factory();
  if (!policy->backend) {
    post_error(Status(ErrorCode::kInferenceFailed, "backend_factory returned no backend"));
    return nullptr;
  }
  Status loaded;
  if (observation_space.is_composite()) {
    // One input per leaf, named by its path (§12.1), fed its part of each flat row.
    std::vector<ModelLeafInput> inputs;
    inputs.reserve(observation_space.leaves().size());
    for (const SpaceLeaf& leaf : observation_space.leaves()) inputs.push_back({leaf.path, leaf.offset, leaf.size});
    loaded = policy->backend->load_leaves(model.value().data(), model.value().size(), inputs, output_name);
  } else {
    loaded = policy->backend->load(model.value().data(), model.value().size(), input_name, output_name);
  }
  if (loaded.ok() && !recurrent_state.empty()) {
    // [1.5] The state tensors are bound once, here (§12.1): a model lacking one is refused (INVALID_FIELD).
    loaded = policy->backend->bind_recurrent_state(recurrent_state);
  }
  if (!loaded.ok()) {
    post_error(Status(loaded.code(), what + loaded.message()));
    return nullptr;
  }
  policy->state_dim = recurrent_state_dim(recurrent_state);
  policy->obs_dim = observation_space.flat_dim();
  policy->out_dim = action_space.dist_inputs_size();
  if ((policy->backend->out_dim() != 0 && policy->backend->out_dim() != policy->out_dim) ||
      (policy->backend->obs_dim() != 0 && policy->backend->obs_dim() != policy->obs_dim)) {
    post_error(Status(ErrorCode::kInferenceFailed,
                      what + "model takes " + std::to_string(policy->backend->obs_dim()) +
                          " observation values and outputs " + std::to_string(policy->backend->out_dim()) +
                          " action_dist_inputs; the spaces need " + std::to_string(policy->obs_dim) + " and " +
                          std::to_string(policy->out_dim)));
    return nullptr;
  }
  return policy;
}

void ServerLink::count_refused_stale(const nlohmann::json& state) {
  // §7.6 [1.3]: a value that is not a JSON integer >= 1 is ignored, never an error.
  auto refused = state.is_object() ? state.find("steps_refused_stale") : state.end();
  if (refused == state.end()) return;
  const std::optional<std::uint64_t> steps = positive_integer(*refused);
  if (!steps) return;
  // Only this thread writes it; saturated, whatever numbers the server sends.
  const std::uint64_t total = steps_refused_stale_.load();
  const std::uint64_t most = std::numeric_limits<std::uint64_t>::max();
  steps_refused_stale_.store(*steps > most - total ? most : total + *steps);
}

void ServerLink::read_record_share(const nlohmann::json& state) {
  // §7.6 [1.3]: absent means 1 (record every episode); a value that is not a
  // JSON number (a boolean is none) with 0 < value <= 1 is ignored: the last valid one stays.
  auto valid = [](const nlohmann::json& share) -> std::optional<double> {
    if (!share.is_number()) return std::nullopt;
    const double value = share.get<double>();
    if (value > 0.0 && value <= 1.0) return value;  // (NaN fails both)
    return std::nullopt;
  };
  read_setting(state, "record_share", 1.0, valid, record_share_);
}

void ServerLink::read_steps_per_batch(const nlohmann::json& state) {
  // §7.6 [1.3]: absent means env_steps_per_sample (0 here); a value that is
  // not a JSON integer >= 1 (a boolean, a string, 0, 2.5, -1) is ignored: the
  // last valid one stays. (A value above env_steps_per_sample is kept as
  // sent: the clients count it as env_steps_per_sample.)
  auto valid = [](const nlohmann::json& every) -> std::optional<std::int64_t> {
    const std::optional<std::uint64_t> value = positive_integer(every);
    if (!value) return std::nullopt;
    const auto most = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
    return static_cast<std::int64_t>(*value > most ? most : *value);
  };
  read_setting(state, "steps_per_batch", std::int64_t{0}, valid, steps_per_batch_);
}

void ServerLink::prepare_state(const nlohmann::json& state, bool initial, LinkEvent& event) {
  event.connection = connection_number_;
  count_refused_stale(state);
  read_record_share(state);
  read_steps_per_batch(state);
  read_env_params(state, event);
  if (options_.multi_agent) {
    auto models = state.find("models");
    if (models == state.end() || !models->is_object()) {
      post_error(Status(ErrorCode::kInvalidField, "SET_STATE has no \"models\" object (per-module form)"));
      return;
    }
    for (auto it = models->begin(); it != models->end(); ++it) {
      const std::string& module_id = it.key();
      auto spec = config_->modules.find(module_id);
      if (spec == config_->modules.end()) {
        post_error(Status(ErrorCode::kUnknownModule, "SET_STATE models: module '" + module_id +
                                                         "' is not in SET_CONFIG's modules"));
        continue;
      }
      std::optional<std::int64_t> seq = int_member(it.value(), "weights_seq_no");
      auto onnx = it.value().is_object() ? it.value().find("onnx_file") : it.value().end();
      if (!seq || !it.value().is_object() || onnx == it.value().end()) {
        post_error(Status(ErrorCode::kInvalidField, "SET_STATE models['" + module_id +
                                                        "'] needs an integer weights_seq_no and an onnx_file"));
        continue;
      }
      auto held = io_seqs_.find(module_id);
      if (!initial && held != io_seqs_.end() && held->second == *seq) {
        event.module_seqs[module_id] = *seq;  // the weights in use already
        continue;
      }
      const ModuleSpec& m = spec->second;
      std::shared_ptr<LoadedPolicy> policy = load_policy(*onnx, m.onnx_input_name, m.onnx_output_name,
                                                         m.observation_space, m.action_space, m.recurrent_state,
                                                         "module '" + module_id + "': ");
      if (!policy) continue;  // not held: asked for again with the next GET_STATE
      io_seqs_[module_id] = *seq;
      event.module_seqs[module_id] = *seq;
      event.module_policies[module_id] = std::move(policy);
    }
    return;
  }
  std::optional<std::int64_t> seq = int_member(state, "weights_seq_no");
  auto onnx = state.find("onnx_file");
  if (onnx == state.end()) {
    if (seq) io_seq_ = seq;
    event.weights_seq_no = seq;
    return;
  }
  if (!initial && seq && io_seq_ && *seq == *io_seq_) {
    event.weights_seq_no = seq;
    return;  // the weights in use already (a model is decoded and loaded once per version)
  }
  event.policy = load_policy(*onnx, config_->input_name, config_->output_name, config_->observation_space,
                             config_->action_space, config_->recurrent_state, "");
  if (!event.policy) return;
  if (seq) io_seq_ = seq;
  event.weights_seq_no = seq;
}

Status ServerLink::serve() {
  for (;;) {
    free_retired();
    if (connection_.closed()) return connection_.error();
    std::shared_ptr<Batch> batch;
    std::shared_ptr<PendingRequest> request;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (closing_) return Status(ErrorCode::kClosed, "client closed");
      batch = in_flight_;  // a batch sent before a reconnect goes again first
      while (!batch && !requests_.empty() && requests_.front()->abandoned) requests_.pop_front();
      if (!batch && !requests_.empty()) {
        request = requests_.front();  // an engine waits for it: before the queued batches
      } else if (!batch && !outbox_.empty()) {
        batch = in_flight_ = outbox_.front();
        outbox_.pop_front();
        queued_steps_ -= std::min<std::size_t>(queued_steps_, batch->queue_steps());
        changed_.notify_all();  // room in the queue
      }
    }
    Status status = batch ? send_batch(batch) : request ? send_request(request) : idle_wait();
    if (!status.ok()) return status;
  }
}

Status ServerLink::send_request(const std::shared_ptr<PendingRequest>& request) {
  Exchange result = exchange(request->message, options_.response_timeout_s, "response_timeout_s", nullptr);
  const bool lost = result.outcome == Outcome::kLost && !result.server_framing_error;
  if (!lost) {
    // Answered, refused, or timed out (the waiter hears of it; the connection is dropped below).
    if (result.outcome == Outcome::kAnswer) progress_ = true;
    std::lock_guard<std::mutex> lock(mutex_);
    if (!requests_.empty() && requests_.front() == request) requests_.pop_front();
    request->status = result.outcome == Outcome::kAnswer ? Status::Ok() : result.status;
    if (result.outcome == Outcome::kAnswer) request->answer = std::move(result.answer);
    request->done = true;
    changed_.notify_all();
  }
  if (result.outcome == Outcome::kAnswer || result.outcome == Outcome::kRefused) return Status::Ok();
  return result.status;  // lost: sent again after the reconnect
}

Status ServerLink::batch_lost(const std::shared_ptr<Batch>& batch, const Exchange& result) {
  if (io_training_done_) return result.status;  // discarded as training ends (end_training), never resent
  if (result.outcome == Outcome::kTimeout) post_error(result.status);
  if (result.server_framing_error) {
    // The server refused the bytes just sent (e.g. a batch over its frame limit):
    // sending it again would fail again, so the batch is refused.
    finish_batch(batch, result.status, nullptr);
  } else if (batch->attempts >= options_.max_batch_attempts) {
    finish_batch(batch, Status(ErrorCode::kConnectionFailed,
                               "batch " + std::to_string(batch->seq) + " was sent on " +
                                   std::to_string(batch->attempts) + " connections, each lost before its answer (" +
                                   result.status.to_string() + "); given up (max_batch_attempts)"),
                 nullptr);
  }
  return result.status;  // otherwise the batch stays in flight: resent after the reconnect
}

void ServerLink::finish_batch(const std::shared_ptr<Batch>& batch, Status error, LinkEvent* state_event) {
  // The heavy parts are freed here, on the I/O thread: the engine never pays for them.
  std::vector<std::string> ids = episode_ids_of(*batch);
  std::vector<EpisodeChunk> chunks;
  std::vector<MultiAgentRecord> records;
  nlohmann::json episodes;
  chunks.swap(batch->chunks);
  records.swap(batch->records);
  episodes.swap(batch->episodes);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (in_flight_ == batch) in_flight_.reset();
    batch->episode_ids = std::move(ids);
    if (batch->error.ok()) batch->error = std::move(error);
    batch->done = true;
    if (!batch->error.ok()) forget_refused_locked(*batch);
    if (state_event != nullptr) post_locked(std::move(*state_event));
    LinkEvent event;
    event.kind = LinkEvent::Kind::kBatch;
    event.batch = batch;
    post_locked(std::move(event));
  }
}

// Builds the records of the batches waiting behind the one in flight, whose
// answer is awaited: their client gets its rows back (kRecordsBuilt) as soon
// as they are taken out, not once the server has taken the batches before.
void ServerLink::build_queued() {
  for (;;) {
    std::shared_ptr<Batch> batch;
    Batch scratch;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (closing_) return;
      for (const auto& waiting : outbox_) {
        if (waiting->record_source && !waiting->pending_records.empty() && !waiting->building) {
          batch = waiting;
          break;
        }
      }
      if (!batch) return;
      batch->building = true;
      scratch.pending_records = batch->pending_records;
    }
    batch->record_source->build(scratch);
    std::lock_guard<std::mutex> lock(mutex_);
    batch->building = false;
    if (std::find(outbox_.begin(), outbox_.end(), batch) != outbox_.end()) {
      // Episodes dropped meanwhile left pending_records: their records go too.
      std::set<std::string> pending;
      for (const PendingRecord& record : batch->pending_records) pending.insert(record.episode_id);
      for (MultiAgentRecord& record : scratch.records) {
        if (pending.count(record.episode_id.value_or("")) != 0) batch->records.push_back(std::move(record));
      }
      batch->pending_records.clear();
      if (scratch.runs_connection != Batch::kNoRuns) batch->runs_connection = scratch.runs_connection;
    }
    LinkEvent back;
    back.kind = LinkEvent::Kind::kRecordsBuilt;
    back.record_source = std::move(batch->record_source);
    post_locked(std::move(back));
  }
}

void ServerLink::encode_records(Batch& batch, const LinkConfig& config) {
  // To a 1.4 server a byte box's and a composite space's observations go as
  // tensors in the body's attachment (§10.9, §4.3); to an older one as JSON numbers.
  batch.binary = config.speaks_1_4;
  batch.attachment.clear();
  std::string* attachment = batch.binary ? &batch.attachment : nullptr;
  batch.episodes = nlohmann::json::array();
  for (const EpisodeChunk& chunk : batch.chunks) {
    Result<nlohmann::json> record =
        encode_episode(chunk, config.observation_space, config.action_space, attachment, config.recurrent_state);
    if (!record.ok()) {
      batch.error = record.status();
      break;
    }
    batch.episodes.push_back(std::move(record.value()));
  }
  for (const MultiAgentRecord& multi : batch.records) {
    if (!batch.error.ok()) break;
    Result<nlohmann::json> record = encode_multi_agent_record(multi, config.modules, attachment);
    if (!record.ok()) {
      batch.error = record.status();
      break;
    }
    batch.episodes.push_back(std::move(record.value()));
  }
}

// [1.8] The run that connection `connection` (1, 2, ...) reached, when its PONG named one.
const std::optional<std::string>& ServerLink::run_of(std::int64_t connection) const noexcept {
  static const std::optional<std::string> kNoRun;
  if (connection < 1 || connection > static_cast<std::int64_t>(io_run_ids_.size())) return kNoRun;
  return io_run_ids_[static_cast<std::size_t>(connection - 1)];
}

// [1.8] `batch` was cut under another server run than this connection's
// (§6.5): its versions name other weights here, and no model of this run
// explains its action_logp. It is let go unsent (not counted as sent, no
// error), its agent steps counted, and the engine hears of it with a kBatch
// event (batch->other_run); its episodes go on. Its data is freed here, on
// the I/O thread; an unbuilt multi-agent batch's rows go back to the client
// with the event (record_source), as those of any batch done.
void ServerLink::drop_other_run(const std::shared_ptr<Batch>& batch) {
  batch->other_run = true;
  other_run_steps_dropped_.fetch_add(static_cast<std::uint64_t>(batch->queue_steps()));
  finish_batch(batch, Status::Ok(), nullptr);
}

Status ServerLink::send_batch(const std::shared_ptr<Batch>& batch) {
  // [1.8] Steps acted with another server run's weights are never sent, not
  // even again after a reconnect (§6.5); checked on every attempt.
  if (from_another_run(run_of(batch->connection), run_of(connection_number_))) {
    drop_other_run(batch);
    return Status::Ok();
  }
  const LinkConfig& config = *config_;
  if (batch->seq == 0) {
    batch->seq = next_seq_++;
    if (batch->record_source && !batch->pending_records.empty()) {
      // The records the engine handed over unbuilt: built here, off its
      // thread, which gets its rows back at once.
      batch->record_source->build(*batch);
      LinkEvent back;
      back.kind = LinkEvent::Kind::kRecordsBuilt;
      back.record_source = std::move(batch->record_source);
      post(std::move(back));
    }
    batch->pending_records.clear();
    encode_records(*batch, config);
  } else if (batch->binary && !config.speaks_1_4) {
    // A resend to a server older than 1.4 (another run after a reconnect): written again without tensors.
    encode_records(*batch, config);
    if (batch->runs_connection == Batch::kNoRuns) strip_runs(batch->episodes);
  }
  if (!batch->error.ok()) {
    finish_batch(batch, Status::Ok(), nullptr);
    return Status::Ok();
  }
  // [1.6] To an older server (a first connection's, or another run's after a
  // reconnect) records with logged steps are let go, never sent without
  // their logged_runs (§15); checked on every attempt.
  if (!config.speaks_1_6) logged_steps_dropped_.fetch_add(static_cast<std::uint64_t>(drop_logged(*batch)));
  ++batch->attempts;
  BatchInfo info;
  const std::int64_t agent_steps = static_cast<std::int64_t>(batch->queue_steps());
  info.env_steps = config.speaks_1_3 ? batch->env_steps : agent_steps;
  // The claims go unchanged on every attempt (§6.5), whichever server run answers.
  info.weights_seq_no = batch->weights_seq_no;
  info.weights_seq_nos = batch->weights_seq_nos;
  // Runs go only on the connection their versions were learned on (§10.1):
  // a resend after a reconnect may reach another server run, whatever its
  // versions say; and never to a plain v1 server (no protocol_version).
  // Checked on every attempt.
  if (batch->runs_connection != Batch::kNoRuns &&
      (!config.announces_version || batch->runs_connection != connection_number_)) {
    strip_runs(batch->episodes);
    batch->runs_connection = Batch::kNoRuns;
  }
  if (config.speaks_1_3) {
    info.agent_steps = agent_steps;
    info.client_session = client_session_;
    info.batch_seq = batch->seq;
  }
  Result<nlohmann::json> message = make_episodes(batch->episodes, info, config.force_on_policy);
  if (!message.ok()) {
    finish_batch(batch, message.status(), nullptr);
    return Status::Ok();
  }
  std::optional<Message> answer;
  if (config.force_on_policy) {
    add_env_params_seq(message.value());  // (the seq held now, on every attempt)
    Exchange result = exchange(message.value(), options_.update_timeout_s, "update_timeout_s", batch.get(),
                               batch->attachment.empty() ? nullptr : &batch->attachment);
    if (result.outcome == Outcome::kAnswer) {
      answer = std::move(result.answer);
    } else if (result.outcome != Outcome::kRefused) {
      return batch_lost(batch, result);
    } else if (batch->error.ok()) {
      batch->error = result.status;
    }
  } else {
    Status sent = send_raw(message.value(), batch->attachment.empty() ? nullptr : &batch->attachment);
    if (!sent.ok()) {
      Exchange lost;
      lost.outcome = sent.code() == ErrorCode::kTimeout ? Outcome::kTimeout : Outcome::kLost;
      lost.status = sent;
      return batch_lost(batch, lost);
    }
    // GET_STATE right behind: its answer acknowledges the EPISODES (and brings new weights).
    Exchange result = exchange(state_request(false), options_.update_timeout_s, "update_timeout_s", batch.get());
    if (result.outcome == Outcome::kAnswer) {
      answer = std::move(result.answer);
    } else if (result.outcome == Outcome::kRefused) {
      post_error(result.status);  // refuses the GET_STATE, not the EPISODES
    } else {
      return batch_lost(batch, result);
    }
  }
  progress_ = true;
  if (answer) {
    LinkEvent state_event;
    state_event.kind = LinkEvent::Kind::kState;
    prepare_state(answer->body, false, state_event);
    finish_batch(batch, Status::Ok(), &state_event);
  } else {
    finish_batch(batch, Status::Ok(), nullptr);
  }
  return Status::Ok();
}

Status ServerLink::idle_wait() {
  // (read_config clamps it already; a config made elsewhere is clamped here too)
  const double interval = config_ && config_->heartbeat_interval_s > 0
                              ? std::max(config_->heartbeat_interval_s, kMinHeartbeatIntervalS)
                              : 0.0;
  Transport::Deadline deadline =
      interval > 0 ? last_send_ + to_ms(interval) : Transport::kNoDeadline;
  if (interval > 0 && Clock::now() >= deadline) {
    heartbeats_sent_.fetch_add(1);
    Exchange pong = exchange(make_ping(PingOptions{"", "", std::nullopt}), options_.response_timeout_s,
                             "response_timeout_s", nullptr);
    if (pong.outcome == Outcome::kRefused) {
      post_error(pong.status);
      return Status::Ok();
    }
    if (pong.outcome != Outcome::kAnswer) {
      if (pong.outcome == Outcome::kTimeout) post_error(pong.status);
      return pong.status;
    }
    return Status::Ok();
  }
  Result<Received> received = transport_.receive(receive_buffer_.data(), receive_buffer_.size(), deadline);
  if (!received.ok()) {
    if (received.status().code() == ErrorCode::kTimeout) return Status::Ok();  // time for a heartbeat
    return received.status();
  }
  if (received.value().interrupted) return Status::Ok();
  responses_.clear();
  Status status = connection_.receive_data(
      std::string_view(receive_buffer_.data(), received.value().bytes), responses_);
  for (const Response& response : responses_) {
    if (response.message.type != MessageType::kError || note_training_done(response.message)) continue;
    post_error(server_error_status(response.message));
  }
  return status;
}

Status ServerLink::send_raw(const nlohmann::json& message, const std::string* attachment) {
  send_buffer_.clear();
  Status status = attachment != nullptr ? connection_.send(message, *attachment, send_buffer_)
                                        : connection_.send(message, send_buffer_);
  if (!status.ok()) return status;
  status = transport_.send_all(send_buffer_.data(), send_buffer_.size(), deadline_after(options_.response_timeout_s));
  if (!status.ok()) {
    transport_.close();
    return status;
  }
  last_send_ = Clock::now();
  return Status::Ok();
}

ServerLink::Exchange ServerLink::exchange(const nlohmann::json& message, double timeout_s, const char* setting,
                                          Batch* batch, const std::string* attachment) {
  Exchange result;
  Status sent = send_raw(message, attachment);
  if (!sent.ok()) {
    result.outcome = sent.code() == ErrorCode::kTimeout ? Outcome::kTimeout : Outcome::kLost;
    result.status = sent;
    return result;
  }
  auto type = message.find("type");
  const bool named = type != message.end() && type->is_string();
  return read_answer(named ? type->get_ref<const std::string&>().c_str() : "request", timeout_s, setting, batch);
}

ServerLink::Exchange ServerLink::read_answer(const char* request, double timeout_s, const char* setting,
                                             Batch* batch) {
  Exchange result;
  const Transport::Deadline deadline = deadline_after(timeout_s);
  bool answered = false;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (closing_) {
        result.status = Status(ErrorCode::kClosed, "client closed");
        return result;
      }
    }
    Result<Received> received = transport_.receive(receive_buffer_.data(), receive_buffer_.size(), deadline);
    if (!received.ok()) {
      if (received.status().code() == ErrorCode::kTimeout) {
        result.outcome = Outcome::kTimeout;
        result.status = Status(ErrorCode::kTimeout, "no answer to " + std::string(request) + " from " +
                                                        transport_.peer() + " within " + format_s(timeout_s) + " s (" +
                                                        setting + ")");
        transport_.close();
      } else {
        result.status = received.status();
      }
      return result;
    }
    if (received.value().interrupted) {
      free_retired();  // (a long wait for an answer does not keep retired models alive)
      build_queued();
      continue;
    }
    responses_.clear();
    Status status = connection_.receive_data(
        std::string_view(receive_buffer_.data(), received.value().bytes), responses_);
    for (Response& response : responses_) {
      if (!response.request) {
        // An ERROR for an EPISODES (no response of its own), or a connection-level one:
        // TRAINING_DONE is no error (the lost connection after it ends the link, §6.6).
        if (note_training_done(response.message)) continue;
        Status error = server_error_status(response.message);
        const nlohmann::json& body = response.message.body;
        const bool connection_level = !body.contains("request") && closes_connection(error.code());
        if (connection_level) {
          if (error.code() == ErrorCode::kBadHeader || error.code() == ErrorCode::kFrameTooLarge) {
            result.server_framing_error = true;
          }
          post_error(error);
        } else if (batch != nullptr && batch->error.ok()) {
          batch->error = error;
        } else {
          post_error(error);
        }
        continue;
      }
      if (answered) continue;
      answered = true;
      if (response.message.type == MessageType::kError) {
        result.outcome = Outcome::kRefused;
        result.status = server_error_status(response.message);
        if (result.status.code() == ErrorCode::kAuthFailed) result.outcome = Outcome::kLost;  // the server closes
      } else {
        result.outcome = Outcome::kAnswer;
        result.answer = std::move(response.message);
      }
    }
    if (answered) return result;  // a closed connection is noticed by the next serve() round
    if (!status.ok()) {
      result.outcome = Outcome::kLost;
      result.status = status;
      return result;
    }
  }
}

}  // namespace tether
