// ClientBase: the connection side both clients share (see client_base.h).
#include "tether/client_base.h"

#include <random>

#include "rows.h"
#include "tether/session.h"

namespace tether {

ClientBase::ClientBase(ClientOptions options) : options_(std::move(options)) {
  std::uint64_t seed = 0;
  if (options_.seed) {
    seed = *options_.seed;
  } else {
    std::random_device device;
    seed = (static_cast<std::uint64_t>(device()) << 32) ^ device();
  }
  rng_.reseed(seed);
}

Status ClientBase::check_options(const ClientOptions& options) {
  if (!options.backend_factory) {
    return Status(ErrorCode::kInvalidArgument,
                  "ClientOptions.backend_factory is required (e.g. make an OnnxRuntimeBackend)");
  }
  if (options.max_queued_batches < 1) {
    return Status(ErrorCode::kInvalidArgument, "ClientOptions.max_queued_batches must be >= 1");
  }
  return Status::Ok();
}

Status ClientBase::open(bool multi_agent) {
  LinkOptions link;
  const ClientOptions& o = options_;
  link.host = o.host;
  link.port = o.port;
  link.client_name = o.client_name;
  link.auth_token = o.auth_token;
  link.connect_timeout_s = o.connect_timeout_s;
  link.response_timeout_s = o.response_timeout_s;
  link.update_timeout_s = o.update_timeout_s;
  link.reconnect_timeout_s = o.reconnect_timeout_s;
  link.max_queued_steps = o.max_queued_steps;
  link.max_queued_batches = o.max_queued_batches;
  link.max_frame_bytes = o.max_frame_bytes;
  link.backend_factory = o.backend_factory;
  link.multi_agent = multi_agent;
  link.offline_policy = o.offline_policy;
  link_ = std::make_unique<ServerLink>(std::move(link));
  Status started = link_->start();
  if (!started.ok()) return started;
  sync();
  if (!config_) return fatal_.ok() ? Status(ErrorCode::kConnectionFailed, "no connection was made") : fatal_;
  if (!demo_start_failure_.ok()) return demo_start_failure_;
  return Status::Ok();
}

void ClientBase::close() {
  if (link_) link_->close();
  if (demo_) {
    demo_->close();  // (the episodes still running, truncated; a failed write has no one left to hear of it)
    demo_.reset();
  }
}

// [1.6] A logged action needs a server that reads logged_runs (§15): an older
// one would train on the step as a sample of its policy.
Status ClientBase::check_logging_server(const char* call) const {
  if (config_->speaks_1_6) return Status::Ok();
  const auto version = config_->server_info.find("protocol_version");
  const std::string spoken = version != config_->server_info.end() && version->is_string()
                                 ? version->get<std::string>()
                                 : std::string("v1 (no protocol_version)");
  return Status(ErrorCode::kNotReady, std::string(call) + ": the server speaks protocol " + spoken +
                                          ": logged actions need 1.6 or later (an older server would train on "
                                          "them as the policy's own samples)");
}

// -- demonstration files -----------------------------------------------------------------------

void ClientBase::start_demo(const std::map<std::string, DemoModuleSpaces>& modules) {
  if (options_.demo_path.empty() || demo_ || !demo_start_failure_.ok() || connection_ != 1) return;
  Result<std::unique_ptr<DemoWriter>> writer = DemoWriter::create(options_.demo_path, modules);
  if (!writer.ok()) {
    demo_start_failure_ = writer.status();
    return;
  }
  demo_ = std::move(writer).value();
}

bool ClientBase::demo_fits(const std::string& module, const Space& observation_space, const Space& action_space,
                           const std::optional<ActionMask>& mask) const {
  const ModuleSpec* header = demo_ ? demo_->module(module) : nullptr;
  if (header == nullptr) return false;
  const bool same_mask = header->action_mask.has_value() == mask.has_value() &&
                         (!mask || header->action_mask->leaf == mask->leaf);
  return header->observation_space == observation_space && header->action_space == action_space && same_mask;
}

void ClientBase::demo_failed(const Status& status) {
  report(Status(status.code(), "demonstration recording stopped: " + status.message()));
  demo_->close();
  demo_.reset();
}

bool ClientBase::waits_for_weights() const noexcept {
  if (!config_ || !config_->force_on_policy || offline()) return false;
  if (options_.wait_for_weights) return *options_.wait_for_weights;
  return !config_->announces_version;  // a plain RLlink v1 server (RLlib's)
}

// -- events from the I/O thread ----------------------------------------------------------------

void ClientBase::sync() {
  // The events are taken out of event_buffer_ (its capacity reused) and the
  // buffer is empty again before the parameters' callback runs: whatever that
  // callback does (throws, or makes a call that syncs again), no event is
  // applied twice.
  std::vector<LinkEvent> events;
  events.swap(event_buffer_);
  link_->take_events(events);
  bool params_changed = false;
  for (LinkEvent& event : events) {
    switch (event.kind) {
      case LinkEvent::Kind::kError:
        report(std::move(event.status));
        break;
      case LinkEvent::Kind::kFatal:
        take_fatal(event.status);
        break;
      case LinkEvent::Kind::kTrainingDone:
        if (!ended_) {
          ended_ = true;
          end_training();
        }
        break;
      // The rest is each client's own.
      case LinkEvent::Kind::kConnected: {
        // [1.8] Whether this connection reached another server run than the last one (§6.5).
        std::optional<std::string> run = run_id_of(event.config->server_info);
        run_changed_ = from_another_run(run_id_, run);
        run_id_ = std::move(run);
        on_connected(event);
        params_changed |= take_env_params(event);
        break;
      }
      case LinkEvent::Kind::kState:
        on_state(event);
        params_changed |= take_env_params(event);
        break;
      case LinkEvent::Kind::kBatch: on_batch_done(event); break;
      case LinkEvent::Kind::kRecordsBuilt: on_records_built(event); break;
    }
  }
  events.clear();
  if (event_buffer_.empty()) event_buffer_.swap(events);  // (the capacity back for the next sync)
  // [1.7] Once, every event applied, with the set held now (§19.2 "Change callback").
  if (params_changed && env_params_callback_) {
    const std::shared_ptr<const EnvParams> held = env_params_;  // (kept alive whatever the callback does)
    const EnvParamsCallback callback = env_params_callback_;     // (the same, should it replace itself)
    callback(held.get());
  }
}

// -- environment parameters (§19) -------------------------------------------------------------

// [1.7] A parameter set the I/O thread parsed, swapped in here on the engine's
// thread (between two of its calls, as a model is): episodes started from now
// on draw from it. A server that said it has no parameters (a drop): the set
// held is let go, and episodes started from now on have no values. Whether the
// set held changed (sync calls the callback once, after all the events).
bool ClientBase::take_env_params(LinkEvent& event) {
  if (event.env_params) {
    env_params_ = std::move(event.env_params);
    return true;
  }
  if (event.env_params_dropped && env_params_) {
    env_params_.reset();
    return true;
  }
  return false;
}

void ClientBase::on_env_params_changed(EnvParamsCallback callback) {
  env_params_callback_ = std::move(callback);
  if (env_params_callback_ && env_params_) {
    const std::shared_ptr<const EnvParams> held = env_params_;
    const EnvParamsCallback call = env_params_callback_;
    call(held.get());
  }
}

std::shared_ptr<const EpisodeEnvParams> ClientBase::draw_episode_params() {
  if (!env_params_) return nullptr;
  auto drawn = std::make_shared<EpisodeEnvParams>();
  drawn->seq = env_params_->seq;
  drawn->values = draw_env_params(env_params_->values, [this] { return rng_.uniform(); });
  return drawn;
}

Result<EnvValues> ClientBase::episode_params(const std::string& episode_id) const {
  const EpisodeEnv* env = episode_env(episode_id);
  if (env == nullptr) {
    return Status(ErrorCode::kInvalidArgument, "episode_params: no running episode '" + episode_id + "'");
  }
  return env->drawn ? env->drawn->values : EnvValues();
}

Status ClientBase::report_measure(const std::string& episode_id, double value) {
  EpisodeEnv* env = episode_env(episode_id);
  if (env == nullptr) {
    return Status(ErrorCode::kInvalidArgument, "report_measure: no running episode '" + episode_id + "'");
  }
  Status checked = check_measure(value);
  if (!checked.ok()) return checked;
  env->measure = value;
  return Status::Ok();
}

// -- errors ------------------------------------------------------------------------------------

void ClientBase::report(Status status) {
  last_error_ = status;
  errors_.push_back(std::move(status));
  while (errors_.size() > 256) errors_.pop_front();  // an engine that never reads them keeps the newest
}

void ClientBase::take_fatal(const Status& status) {
  if (fatal_.ok()) {
    fatal_ = status;
    last_error_ = fatal_;
  }
}

Status ClientBase::take_error() {
  if (link_ && link_->events_pending()) sync();
  return detail::take_oldest(errors_);
}

// What a call returns instead of doing its work: the fatal status, or else the
// oldest error no call returned yet (each is returned once, as the Python and
// C# SDKs raise it from the next call), or ok.
Status ClientBase::pending_status() { return fatal_.ok() ? detail::take_oldest(errors_) : fatal_; }

Status ClientBase::catch_up() {
  if (link_->events_pending()) sync();
  return pending_status();
}

// -- connections and episodes ------------------------------------------------------------------

void ClientBase::take_connection(const LinkEvent& event) {
  config_ = event.config;
  connection_ = event.connection;
  const nlohmann::json& info = config_->server_info;
  auto version = info.find("protocol_version");
  raw_box_samples_ = server_takes_raw_box_samples(
      version != info.end() && version->is_string() ? version->get<std::string>() : std::string());
}

std::string ClientBase::random_episode_id() { return detail::random_hex_id(rng_); }

ClientBase::Recording ClientBase::new_episode_recording(bool training_enabled) {
  // Holding back (§13.2): one draw per episode (for all its agents), recorded
  // with probability record_share. At 1 no number is drawn, so the client's
  // draws are those of a client without it. Once training is done (§6.6) no
  // episode is recorded (nor held back: nothing is sent), nor by an offline
  // client (§20: there is no server).
  training_enabled = training_enabled && !ended_ && !offline();
  Recording recording;
  recording.recorded = training_enabled;
  const double share = link_->record_share();
  if (training_enabled && share < 1.0) recording.recorded = rng_.uniform() < share;
  recording.held_back = training_enabled && !recording.recorded;
  if (recording.held_back) ++episodes_held_back_;
  return recording;
}

}  // namespace tether
