// The client's I/O thread: connect, handshake, send batches, heartbeats,
// timeouts, reconnects (see server_link.h and sdk_python/server_link.py).
#include "tether/server_link.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <utility>

#include "tether/distributions.h"
#include "tether/onnx_codec.h"
#include "tether/platform/socket.h"

namespace tether {

namespace {

using Clock = std::chrono::steady_clock;

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

Status server_error_status(const Message& message) {
  Result<ServerError> error = decode_error(message);
  if (!error.ok()) return error.status();
  return error.value().to_status();
}

}  // namespace

ServerLink::ServerLink(LinkOptions options)
    : options_(std::move(options)),
      client_session_(random_hex(32)),
      connection_(options_.max_frame_bytes),
      receive_buffer_(64 * 1024) {}

ServerLink::~ServerLink() { close(); }

std::string ServerLink::address() const { return platform::format_peer(options_.host, options_.port); }

Status ServerLink::start() {
  if (!options_.backend_factory) {
    return Status(ErrorCode::kInvalidArgument, "LinkOptions.backend_factory is required (it runs the models)");
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (thread_.joinable() || closing_) return Status(ErrorCode::kInvalidArgument, "the link was already started");
  }
  thread_ = std::thread([this] { run(); });
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [this] { return connected_once_; });
  return first_status_;
}

void ServerLink::close() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closing_ = true;
    changed_.notify_all();
  }
  transport_.cancel();
  if (thread_.joinable()) thread_.join();
}

// -- engine side -----------------------------------------------------------------------

void ServerLink::drop_episodes(Batch& batch, const std::set<std::string>& gone) {
  auto keep_end = std::remove_if(batch.chunks.begin(), batch.chunks.end(), [&](const EpisodeChunk& chunk) {
    return gone.count(chunk.episode_id.value_or("")) != 0;
  });
  if (keep_end == batch.chunks.end()) return;
  batch.chunks.erase(keep_end, batch.chunks.end());
  std::int64_t steps = 0;
  for (const EpisodeChunk& chunk : batch.chunks) steps += static_cast<std::int64_t>(chunk.steps());
  batch.env_steps = steps;
}

std::set<std::string> ServerLink::submit(std::shared_ptr<Batch> batch) {
  std::set<std::string> gone;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const std::size_t steps = static_cast<std::size_t>(batch->env_steps);
    while (!outbox_.empty() &&
           (outbox_.size() >= options_.max_queued_batches || queued_steps_ + steps > queue_limit_steps_)) {
      std::shared_ptr<Batch> dropped = outbox_.front();
      outbox_.pop_front();
      batches_dropped_.fetch_add(1);
      for (const EpisodeChunk& chunk : dropped->chunks) gone.insert(chunk.episode_id.value_or(""));
      queued_steps_ -= std::min<std::size_t>(queued_steps_, static_cast<std::size_t>(dropped->env_steps));
    }
    if (!gone.empty()) {
      for (auto& waiting : outbox_) drop_episodes(*waiting, gone);
      drop_episodes(*batch, gone);
    }
    if (!refused_episodes_.empty()) drop_episodes(*batch, refused_episodes_);
    outbox_.erase(std::remove_if(outbox_.begin(), outbox_.end(),
                                 [](const std::shared_ptr<Batch>& b) { return b->chunks.empty(); }),
                  outbox_.end());
    queued_steps_ = 0;
    for (const auto& waiting : outbox_) queued_steps_ += static_cast<std::size_t>(waiting->env_steps);
    if (!batch->chunks.empty()) {
      queued_steps_ += static_cast<std::size_t>(batch->env_steps);  // after its dropped episodes left it
      outbox_.push_back(std::move(batch));
    } else {
      batch->done = true;  // nothing left to send (its episodes were dropped or refused): no one waits for it
    }
  }
  transport_.interrupt();
  return gone;
}

bool ServerLink::room_locked(std::size_t steps) const {
  return outbox_.empty() ||
         (outbox_.size() < options_.max_queued_batches && queued_steps_ + steps <= queue_limit_steps_);
}

bool ServerLink::has_room(std::size_t steps) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return room_locked(steps);
}

void ServerLink::wait_for_room(std::size_t steps) {
  wait_until([this, steps] { return room_locked(steps); }, false);
}

void ServerLink::wait_for_idle() {
  wait_until([this] { return outbox_.empty() && in_flight_ == nullptr; }, false);
}

bool ServerLink::idle() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return outbox_.empty() && in_flight_ == nullptr;
}

void ServerLink::wait_until(const std::function<bool()>& predicate, bool until_error) {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    if (fatal_ || stopped_ || closing_) return;
    if (predicate()) return;
    if (until_error) {
      for (const LinkEvent& event : events_) {
        if (event.kind == LinkEvent::Kind::kError || event.kind == LinkEvent::Kind::kFatal) return;
        if (event.kind == LinkEvent::Kind::kBatch && !event.batch->error.ok()) return;
      }
    }
    changed_.wait_for(lock, std::chrono::milliseconds(500));
  }
}

void ServerLink::take_events(std::deque<LinkEvent>& out) {
  std::lock_guard<std::mutex> lock(mutex_);
  while (!events_.empty()) {
    if (events_.front().kind == LinkEvent::Kind::kFatal) {
      out.push_back(events_.front());  // a fatal event stays: every later call sees it
      break;
    }
    out.push_back(std::move(events_.front()));
    events_.pop_front();
  }
  events_pending_.store(fatal_ || !events_.empty(), std::memory_order_release);
}

void ServerLink::post(LinkEvent event) {
  std::lock_guard<std::mutex> lock(mutex_);
  events_.push_back(std::move(event));
  events_pending_.store(true, std::memory_order_release);
  changed_.notify_all();
}

void ServerLink::post_error(Status status) {
  LinkEvent event;
  event.kind = LinkEvent::Kind::kError;
  event.status = std::move(status);
  post(std::move(event));
}

void ServerLink::forget_refused(const Batch& batch) {
  for (const EpisodeChunk& chunk : batch.chunks) refused_episodes_.insert(chunk.episode_id.value_or(""));
  for (auto& waiting : outbox_) drop_episodes(*waiting, refused_episodes_);
  outbox_.erase(std::remove_if(outbox_.begin(), outbox_.end(),
                               [](const std::shared_ptr<Batch>& b) { return b->chunks.empty(); }),
                outbox_.end());
  queued_steps_ = 0;
  for (const auto& waiting : outbox_) queued_steps_ += static_cast<std::size_t>(waiting->env_steps);
}

// -- I/O thread ------------------------------------------------------------------------

void ServerLink::run() {
  Clock::time_point down_since = Clock::now();
  bool first = true;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (closing_) break;
    }
    if (!transport_.is_open()) {
      Status status = connect_with_retry(down_since, first);
      if (!status.ok()) {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!closing_) {
          fatal_ = true;
          if (first) first_status_ = status;
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
    if (!status.ok()) {
      transport_.close();
      reconnects_.fetch_add(1);
      down_since = Clock::now();
    }
  }
  transport_.close();
  std::lock_guard<std::mutex> lock(mutex_);
  stopped_ = true;
  connected_once_ = true;
  if (first_status_.ok() && !fatal_ && closing_ && !config_) first_status_ = Status(ErrorCode::kClosed, "client closed");
  changed_.notify_all();
}

Status ServerLink::connect_with_retry(Clock::time_point down_since, bool first) {
  const Clock::time_point deadline = down_since + to_ms(options_.reconnect_timeout_s);
  double delay = 0.05;
  Status last;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (closing_) return Status(ErrorCode::kClosed, "client closed");
    }
    Status status = transport_.connect(options_.host, options_.port, to_ms(options_.connect_timeout_s));
    if (status.ok()) {
      connection_.reset();
      status = handshake();
      if (status.ok()) return status;
      if (status.code() == ErrorCode::kAuthFailed || status.code() == ErrorCode::kVersionMismatch ||
          status.code() == ErrorCode::kInvalidField || status.code() == ErrorCode::kInferenceFailed) {
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
      if (Clock::now() < deadline) continue;  // interrupt() (a batch was queued) cut the connect short: again
    }
    transport_.close();
    last = status;
    // A server at its connection limit asks for at least 1 s between attempts (§6.6).
    double pause = status.code() == ErrorCode::kTooManyConnections ? std::max(delay, 1.0) : delay;
    const Clock::time_point now = Clock::now();
    if (now >= deadline) {
      return Status(ErrorCode::kConnectionFailed, "could not reach a Tether server at " + address() + " within " +
                                                      format_s(options_.reconnect_timeout_s) +
                                                      " s (reconnect_timeout_s): " + last.to_string());
    }
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait_until(lock, std::min(deadline, now + to_ms(pause)), [this] { return closing_; });
    delay = std::min(delay * 2, 1.0);
  }
}

Status ServerLink::handshake() {
  PingOptions ping;
  ping.client_name = options_.client_name;
  ping.auth_token = options_.auth_token;
  Exchange pong = exchange(make_ping(ping), options_.response_timeout_s, "response_timeout_s", nullptr);
  if (pong.outcome != Outcome::kAnswer) return pong.status;
  auto config = std::make_shared<LinkConfig>();
  config->server_info = pong.answer.body;
  auto version = config->server_info.find("protocol_version");
  if (version != config->server_info.end()) {
    config->announces_version = true;
    std::string text = version->is_string() ? version->get<std::string>() : std::string("?");
    Result<ProtocolVersion> parsed = parse_version(text);
    if (!parsed.ok() || parsed.value().major != 1) {
      return Status(ErrorCode::kVersionMismatch, "server speaks RLlink " + text + ", this client " +
                                                     std::string(kProtocolVersion));
    }
    config->speaks_1_3 = parsed.value().minor >= 3;
  }
  Exchange set_config = exchange(make_get_config(), options_.response_timeout_s, "response_timeout_s", nullptr);
  if (set_config.outcome != Outcome::kAnswer) return set_config.status;
  const nlohmann::json& body = set_config.answer.body;
  config->server_config = body;
  if (!body.contains("observation_space") || !body.contains("action_space")) {
    return Status(ErrorCode::kInvalidField, "SET_CONFIG describes no observation_space/action_space "
                                            "(a multi-agent server needs the multi-agent client)");
  }
  Result<Space> obs_space = Space::from_json(body["observation_space"]);
  if (!obs_space.ok()) return obs_space.status();
  Result<Space> action_space = Space::from_json(body["action_space"]);
  if (!action_space.ok()) return action_space.status();
  config->observation_space = obs_space.value();
  config->action_space = action_space.value();
  if (const std::string* name = first_string(body, "onnx_input_names")) config->input_name = *name;
  if (const std::string* name = first_string(body, "onnx_output_names")) config->output_name = *name;
  if (auto sps = int_member(body, "env_steps_per_sample"); sps && *sps > 0) config->env_steps_per_sample = *sps;
  auto force = body.find("force_on_policy");
  config->force_on_policy = force == body.end() || !force->is_boolean() || force->get<bool>();
  if (auto hb = number_member(body, "heartbeat_interval_s"); hb && *hb > 0 && std::isfinite(*hb)) {
    config->heartbeat_interval_s = *hb;
  }
  if (options_.max_queued_steps > 0) {
    config->queue_limit_steps = options_.max_queued_steps;
  } else {
    auto batch = int_member(body, "train_batch_size");
    auto staleness = int_member(body, "max_staleness");
    if (batch && staleness && *batch > 0 && *staleness >= 0) {
      config->queue_limit_steps = static_cast<std::size_t>((*staleness + 1) * *batch);
    } else {
      config->queue_limit_steps = static_cast<std::size_t>(2 * config->env_steps_per_sample);
    }
  }
  config_ = config;
  Exchange state = exchange(state_request(true), options_.response_timeout_s, "response_timeout_s", nullptr);
  if (state.outcome != Outcome::kAnswer) return state.status;
  LinkEvent event;
  event.kind = LinkEvent::Kind::kConnected;
  event.config = config;
  event.policy = prepare_state(state.answer.body, true, event.weights_seq_no);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_limit_steps_ = config->queue_limit_steps;
  }
  post(std::move(event));
  return Status::Ok();
}

nlohmann::json ServerLink::state_request(bool initial) const {
  if (initial || !io_seq_) return make_get_state();
  return make_get_state(io_seq_);
}

std::shared_ptr<LoadedPolicy> ServerLink::prepare_state(const nlohmann::json& state, bool initial,
                                                        std::optional<std::int64_t>& seq) {
  seq = int_member(state, "weights_seq_no");
  auto onnx = state.find("onnx_file");
  if (onnx == state.end()) {
    if (seq) io_seq_ = seq;
    return nullptr;
  }
  if (!initial && seq && io_seq_ && *seq == *io_seq_) {
    return nullptr;  // the weights in use already (a model is decoded and loaded once per version)
  }
  if (!onnx->is_string()) {
    post_error(Status(ErrorCode::kInvalidField, "SET_STATE onnx_file is not a string"));
    seq.reset();
    return nullptr;
  }
  Result<std::vector<std::uint8_t>> model = decode_onnx_file(onnx->get_ref<const std::string&>());
  if (!model.ok()) {
    post_error(model.status());
    seq.reset();
    return nullptr;
  }
  auto policy = std::make_shared<LoadedPolicy>();
  policy->backend = options_.backend_factory();
  if (!policy->backend) {
    post_error(Status(ErrorCode::kInferenceFailed, "backend_factory returned no backend"));
    seq.reset();
    return nullptr;
  }
  Status loaded = policy->backend->load(model.value().data(), model.value().size(), config_->input_name,
                                        config_->output_name);
  if (!loaded.ok()) {
    post_error(loaded);
    seq.reset();
    return nullptr;
  }
  policy->obs_dim = config_->observation_space.flat_dim();
  policy->out_dim = config_->action_space.dist_inputs_size();
  if ((policy->backend->out_dim() != 0 && policy->backend->out_dim() != policy->out_dim) ||
      (policy->backend->obs_dim() != 0 && policy->backend->obs_dim() != policy->obs_dim)) {
    post_error(Status(ErrorCode::kInferenceFailed,
                      "model takes " + std::to_string(policy->backend->obs_dim()) + " observation values and outputs " +
                          std::to_string(policy->backend->out_dim()) + " action_dist_inputs; the spaces need " +
                          std::to_string(policy->obs_dim) + " and " + std::to_string(policy->out_dim)));
    seq.reset();
    return nullptr;
  }
  if (seq) io_seq_ = seq;
  return policy;
}

Status ServerLink::serve() {
  for (;;) {
    if (connection_.closed()) return connection_.error();
    std::shared_ptr<Batch> batch;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (closing_) return Status(ErrorCode::kClosed, "client closed");
      batch = in_flight_;  // a batch sent before a reconnect goes again first
      if (!batch && !outbox_.empty()) {
        batch = in_flight_ = outbox_.front();
        outbox_.pop_front();
        queued_steps_ -= std::min<std::size_t>(queued_steps_, static_cast<std::size_t>(batch->env_steps));
        changed_.notify_all();  // room in the queue
      }
    }
    Status status = batch ? send_batch(batch) : idle_wait();
    if (!status.ok()) return status;
  }
}

void ServerLink::handle_lost(const Exchange& result) {
  if (result.outcome == Outcome::kTimeout) post_error(result.status);
  if (result.server_framing_error) {
    // The server refused the bytes just sent (e.g. a batch over its frame limit):
    // sending it again would fail again, so the batch in flight is refused.
    std::lock_guard<std::mutex> lock(mutex_);
    std::shared_ptr<Batch> batch = std::move(in_flight_);
    in_flight_.reset();
    if (batch) {
      batch->error = result.status;
      batch->done = true;
      forget_refused(*batch);
      LinkEvent event;
      event.kind = LinkEvent::Kind::kBatch;
      event.batch = batch;
      events_.push_back(std::move(event));
      events_pending_.store(true, std::memory_order_release);
      changed_.notify_all();
    }
  }
}

Status ServerLink::send_batch(const std::shared_ptr<Batch>& batch) {
  const LinkConfig& config = *config_;
  if (batch->seq == 0) {
    batch->seq = next_seq_++;
    batch->episodes = nlohmann::json::array();
    for (const EpisodeChunk& chunk : batch->chunks) {
      Result<nlohmann::json> record = encode_episode(chunk, config.observation_space, config.action_space);
      if (!record.ok()) {
        batch->error = record.status();
        break;
      }
      batch->episodes.push_back(std::move(record.value()));
    }
  }
  std::optional<Message> answer;
  if (batch->error.ok()) {
    BatchInfo info;
    info.env_steps = batch->env_steps;
    info.weights_seq_no = batch->weights_seq_no;
    if (config.speaks_1_3) {
      info.agent_steps = batch->env_steps;
      info.client_session = client_session_;
      info.batch_seq = batch->seq;
    }
    Result<nlohmann::json> message = make_episodes(batch->episodes, info, config.force_on_policy);
    if (!message.ok()) {
      batch->error = message.status();
    } else if (config.force_on_policy) {
      Exchange result = exchange(message.value(), options_.update_timeout_s, "update_timeout_s", batch.get());
      if (result.outcome == Outcome::kAnswer) {
        answer = std::move(result.answer);
      } else if (result.outcome == Outcome::kRefused) {
        batch->error = result.status;
      } else {
        handle_lost(result);
        return result.status;  // the batch stays in flight: resent after the reconnect
      }
    } else {
      Status sent = send_raw(message.value());
      if (!sent.ok()) return sent;
      // GET_STATE right behind: its answer acknowledges the EPISODES (and brings new weights).
      Exchange result = exchange(state_request(false), options_.update_timeout_s, "update_timeout_s", batch.get());
      if (result.outcome == Outcome::kAnswer) {
        answer = std::move(result.answer);
      } else if (result.outcome == Outcome::kRefused) {
        post_error(result.status);  // refuses the GET_STATE, not the EPISODES
      } else {
        handle_lost(result);
        return result.status;
      }
    }
  }
  LinkEvent state_event;
  bool has_state = false;
  if (answer) {
    state_event.kind = LinkEvent::Kind::kState;
    state_event.policy = prepare_state(answer->body, false, state_event.weights_seq_no);
    has_state = true;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  in_flight_.reset();
  batch->done = true;
  if (!batch->error.ok()) forget_refused(*batch);
  if (has_state) events_.push_back(std::move(state_event));
  LinkEvent event;
  event.kind = LinkEvent::Kind::kBatch;
  event.batch = batch;
  events_.push_back(std::move(event));
  events_pending_.store(true, std::memory_order_release);
  changed_.notify_all();
  return Status::Ok();
}

Status ServerLink::idle_wait() {
  const double interval = config_ ? config_->heartbeat_interval_s : 0.0;
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
      handle_lost(pong);
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
    if (response.message.type == MessageType::kError) post_error(server_error_status(response.message));
  }
  return status;
}

Status ServerLink::send_raw(const nlohmann::json& message) {
  send_buffer_.clear();
  Status status = connection_.send(message, send_buffer_);
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
                                          Batch* batch) {
  Exchange result;
  Status sent = send_raw(message);
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
        result.status = Status(ErrorCode::kTimeout, "no answer to " + std::string(request) + " from " + address() +
                                                        " within " + format_s(timeout_s) + " s (" + setting + ")");
        transport_.close();
      } else {
        result.status = received.status();
      }
      return result;
    }
    if (received.value().interrupted) continue;
    responses_.clear();
    Status status = connection_.receive_data(
        std::string_view(receive_buffer_.data(), received.value().bytes), responses_);
    for (Response& response : responses_) {
      if (!response.request) {
        // An ERROR for an EPISODES (no response of its own), or a connection-level one.
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
