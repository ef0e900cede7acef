// TetherClient: episodes, local inference and sampling on the engine thread;
// everything on the network goes through the ServerLink's I/O thread.
#include "tether/client.h"

#include <algorithm>
#include <cmath>

#include "rows.h"
#include "tether/logged_action.h"
#include "tether/observation_leaves.h"
#include "tether/policy_mapping.h"

namespace tether {
namespace {

// A byte box (§8.1), or a composite space's byte leaf (§8.6), takes integers
// 0-255 only: anything else is refused here, by index, before it is recorded,
// as the server would refuse the whole batch for it (OBS_DTYPE_MISMATCH,
// §10.6 checks 11b, 4c); and [1.4] an action mask that is not 0/1 or allows
// nothing (§11.6) is refused before sampling, so no forbidden action is drawn.
// `bytes_checked`: the row is a byte box's and first_non_byte passed it whole.
// [1.4] A row given as `bytes` needs no check (every byte is an integer
// 0-255, and a mask needs a Dict or Tuple space), but only a Box takes bytes:
// a Dict or Tuple space's leaves go by ObservationLeaves (§8.6).
Status check_row(const LinkConfig& config, const float* obs, const std::uint8_t* bytes, std::size_t size,
                 const char* what, bool mask, bool bytes_checked = false) {
  const Space& space = config.observation_space;
  if (bytes != nullptr) {
    if (!space.is_composite()) return Status::Ok();
    return Status(ErrorCode::kInvalidArgument,
                  std::string(what) + " given as bytes, but the observation space is a Dict or Tuple: give an "
                                      "ObservationLeaves (byte leaves by set(leaf, bytes, count)) or its flat row "
                                      "of floats");
  }
  if (!bytes_checked && (space.is_bytes() || space.is_composite())) {
    Status values = check_observation_row(space, obs, size, what);
    if (!values.ok()) return values;
  }
  if (mask && config.action_mask) return config.action_mask->check_row(obs, what);
  return Status::Ok();
}

// Appends one observation row, given as floats or (a byte box's, §8.1) as
// bytes, to `rows`: as bytes (obs_bytes) for a byte box, whose model and
// records take them so (floats given for one are integers 0-255, checked),
// else as floats (obs).
void append_observation_row(EpisodeChunk& rows, const float* obs, const std::uint8_t* bytes, std::size_t n,
                            bool as_bytes) {
  if (as_bytes) {
    std::vector<std::uint8_t>& to = rows.obs_bytes;
    if (bytes != nullptr) {
      to.insert(to.end(), bytes, bytes + n);
    } else {
      const std::size_t at = to.size();
      to.resize(at + n);
      for (std::size_t i = 0; i < n; ++i) to[at + i] = static_cast<std::uint8_t>(obs[i]);
    }
  } else if (bytes != nullptr) {
    rows.obs.insert(rows.obs.end(), bytes, bytes + n);
  } else {
    rows.obs.insert(rows.obs.end(), obs, obs + n);
  }
}

// [1.6] The default module's id, which a demonstration file's lines name
// (§18): the module the rules map "default_agent" to, else "default_policy"
// (a server without multi-agent configuration, §7.4).
std::string default_module_id(const nlohmann::json& server_config) {
  const auto rules = server_config.find("policy_mapping");
  const auto modules = server_config.find("modules");
  if (rules != server_config.end() && rules->is_array() && modules != server_config.end() && modules->is_object()) {
    Result<PolicyMapping> mapping = PolicyMapping::from_json(*rules);
    if (mapping.ok()) {
      Result<std::string> module = mapping.value().module_for(kDefaultAgentId);
      if (module.ok() && modules->contains(module.value())) return module.value();
    }
  }
  return "default_policy";
}

}  // namespace

TetherClient::TetherClient(ClientOptions options) : ClientBase(std::move(options)) {}

Result<std::unique_ptr<TetherClient>> TetherClient::connect(ClientOptions options) {
  return connect_as<TetherClient>(std::move(options), /*multi_agent=*/false);
}

TetherClient::~TetherClient() { close(); }

// -- events from the I/O thread ------------------------------------------------------------

void TetherClient::apply_policy(std::shared_ptr<LoadedPolicy> policy, std::optional<std::int64_t> seq,
                                std::int64_t connection) {
  if (policy) {
    std::shared_ptr<LoadedPolicy> old = std::move(policy_);
    policy_ = std::move(policy);  // the swap: the next get_action uses the new model
    link_->retire(std::move(old));  // destroyed on the I/O thread, not in this frame
    ++models_loaded_;
  }
  if (seq) {
    weights_seq_no_ = seq;
    weights_connection_ = connection;  // (a version kept across a reconnect stays stamped with its own)
  }
}

void TetherClient::on_connected(LinkEvent& event) {
  // A new connection's server may describe other spaces (§6.5; dtype aside).
  const bool spaces_changed =
      config_ && (!(config_->observation_space == event.config->observation_space) ||
                  !(config_->action_space == event.config->action_space));
  // [1.5] ... or another recurrent state (§12.4): the states kept belong to
  // another model: every one starts again from zeros, and the steps not cut
  // yet go, as when the spaces change.
  const bool state_changed = config_ && config_->recurrent_state != event.config->recurrent_state;
  take_connection(event);
  if (!options_.demo_path.empty()) {
    // [1.6] The file's header names the first connection's spaces (§18): a
    // later connection's other spaces end the recording of their module.
    if (connection_ == 1) {
      demo_module_ = default_module_id(config_->server_config);
      DemoModuleSpaces spaces;
      spaces.observation_space = config_->server_config.value("observation_space", nlohmann::json());
      spaces.action_space = config_->server_config.value("action_space", nlohmann::json());
      if (config_->action_mask) spaces.action_mask = config_->action_mask->leaf;
      start_demo({{demo_module_, spaces}});
    }
    // (Once off, off for good: spaces that come back would resume an episode's line mid-way.)
    demo_on_ = (connection_ == 1 || demo_on_) &&
               demo_fits(demo_module_, config_->observation_space, config_->action_space, config_->action_mask);
    if (demo_ && !demo_on_) demo_->discard_module(demo_module_);
  }
  dist_buffer_.resize(config_->action_space.dist_inputs_size());
  record_action_buffer_.resize(config_->action_space.flat_dim());
  env_action_buffer_.resize(config_->action_space.flat_dim());
  leaf_row_.resize(config_->observation_space.flat_dim());
  if (spaces_changed || state_changed) {
    const std::size_t dropped = drop_for_new_spaces();
    // [1.8] Another run as well: its steps count as another run's, whichever rule dropped them (§6.5).
    if (run_changed_) other_run_unsent_dropped_.fetch_add(dropped, std::memory_order_relaxed);
  } else if (run_changed_) {
    // [1.8] Another server run (§6.5): the steps not cut yet were acted with
    // weights whose versions name other weights in this run. They are
    // dropped and counted, as for other spaces; the model stays until this
    // connection's replaces it (it comes with the connection, just below).
    other_run_unsent_dropped_.fetch_add(drop_unsent_steps(), std::memory_order_relaxed);
  }
  apply_policy(std::move(event.policy), event.weights_seq_no, event.connection);
}

void TetherClient::on_state(LinkEvent& event) {
  apply_policy(std::move(event.policy), event.weights_seq_no, event.connection);
}

void TetherClient::on_batch_done(LinkEvent& event) {
  if (event.batch->other_run) return;  // [1.8] acted with another run's weights: not sent, counted by the link (§6.5)
  if (!event.batch->error.ok()) {
    report(event.batch->error);
    // The rest of a refused batch's episodes is not sent either: the server
    // must not take a fragment for a whole episode.
    std::set<std::string> ids(event.batch->episode_ids.begin(), event.batch->episode_ids.end());
    finished_.erase(std::remove_if(finished_.begin(), finished_.end(),
                                   [&](const Episode& e) { return ids.count(e.id) != 0; }),
                    finished_.end());
    forget_episodes(ids);
  } else {
    env_steps_sent_ += event.batch->env_steps;
  }
}

void TetherClient::end_training() {
  // The server's run is done (§6.6): the steps recorded and not cut yet are
  // let go (counted as one batch), and every episode plays on unrecorded.
  const bool unsent = pending_steps_ > 0 || !finished_.empty();
  for (Episode& episode : finished_) recycle(std::move(episode));
  finished_.clear();
  for (auto& entry : episodes_) {
    Episode& episode = entry.second;
    episode.training = false;
    episode.held_back = false;
    episode.drop_uncut_steps();
  }
  pending_steps_ = 0;
  held_steps_ = 0;
  if (unsent) link_->count_unsent_at_end();
}

std::size_t TetherClient::drop_for_new_spaces() {
  // The model cannot serve the new spaces (NOT_READY until this connection's
  // arrives, usually in the same handshake), and the steps not cut yet do not
  // fit them: they are dropped, as every SDK does.
  link_->retire(std::move(policy_));  // destroyed on the I/O thread
  policy_ = nullptr;
  weights_seq_no_.reset();
  return drop_unsent_steps();
}

std::size_t TetherClient::drop_unsent_steps() {
  // Every training episode's steps not cut yet go: the open episodes go on,
  // each one's next chunk starting from its next observation; the ended ones
  // not cut yet send nothing. [1.5] Every recurrent state (the evaluation
  // episode's too) starts again from zeros: it is another model's.
  std::size_t dropped = 0;
  for (const Episode& episode : finished_) {
    if (episode.training) dropped += episode.action_rows;
  }
  for (const auto& entry : episodes_) {
    if (entry.second.training) dropped += entry.second.action_rows;
  }
  for (Episode& episode : finished_) recycle(std::move(episode));
  finished_.clear();
  for (auto& entry : episodes_) {
    Episode& episode = entry.second;
    if (!episode.training) continue;
    episode.drop_uncut_steps();
  }
  for (auto& entry : episodes_) entry.second.state.clear();
  evaluating_ = false;
  pending_steps_ = 0;
  return dropped;
}

void TetherClient::forget_episodes(const std::set<std::string>& ids) {
  for (const std::string& id : ids) {
    auto it = episodes_.find(id);
    if (it == episodes_.end()) continue;
    Episode& episode = it->second;
    episode.training = false;
    episode.drop_uncut_steps();
  }
  recount_pending();
}

void TetherClient::Episode::drop_uncut_steps() noexcept {
  std::optional<std::string> name = std::move(steps.episode_id);  // (set once, by start_episode: kept)
  steps.clear();
  steps.episode_id = std::move(name);
  versions.clear();
  states.clear();
  logged.clear();
  obs_rows = action_rows = 0;
}

void TetherClient::recycle(Episode&& episode) {
  constexpr std::size_t kMaxSpare = 64;  // more than the episodes an engine runs at once
  if (spare_.size() >= kMaxSpare) return;
  episode.drop_uncut_steps();
  episode.held_back = false;
  episode.state.clear();  // (an actor's state is dropped when its episode ends, §12.4)
  episode.terminated = episode.truncated = false;
  episode.total_return = 0.0;
  episode.step_reward = 0.0;
  episode.env = EpisodeEnv();
  spare_.push_back(std::move(episode));
}

void TetherClient::recount_pending() {
  pending_steps_ = 0;
  for (const auto& entry : episodes_) {
    if (entry.second.training) pending_steps_ += entry.second.action_rows;
  }
  for (const Episode& episode : finished_) {  // ended, their last steps not cut yet
    if (episode.training) pending_steps_ += episode.action_rows;
  }
}

// -- the episode API -------------------------------------------------------------------------

Result<std::string> TetherClient::start_episode(const std::string& episode_id, bool training_enabled) {
  Result<std::string> named =
      new_episode_id(episode_id, [this](const std::string& id) { return episodes_.count(id) != 0; });
  if (!named.ok()) return named;
  std::string id = std::move(named).value();
  Episode& episode = episodes_[id];
  if (!spare_.empty()) {
    episode = std::move(spare_.back());  // cleared arrays that keep their capacity
    spare_.pop_back();
  }
  const Recording recording = new_episode_recording(training_enabled);
  episode.id = id;
  episode.training = recording.recorded;
  episode.held_back = recording.held_back;
  episode.steps.episode_id = id;
  // [1.7] Its values, drawn now from the set held (§19.1), for all its records.
  episode.env.drawn = draw_episode_params();
  episode.env.measure.reset();
  return id;
}

TetherClient::EpisodeEnv* TetherClient::episode_env(const std::string& episode_id) {
  auto it = episodes_.find(episode_id);
  return it == episodes_.end() ? nullptr : &it->second.env;
}

const TetherClient::EpisodeEnv* TetherClient::episode_env(const std::string& episode_id) const {
  auto it = episodes_.find(episode_id);
  return it == episodes_.end() ? nullptr : &it->second.env;
}

std::size_t TetherClient::sendable_steps(const Episode& current) const {
  // Every other open episode holds back its last action until its next
  // observation. RLlib's server waits for a full env_steps_per_sample batch,
  // so sending fewer would stall it.
  std::size_t held = 0;
  for (const auto& entry : episodes_) {
    const Episode& e = entry.second;
    if (&e != &current && e.training && e.action_rows > 0 && e.obs_rows == e.action_rows) ++held;
  }
  return pending_steps_ >= held ? pending_steps_ - held : 0;
}

Status TetherClient::get_action(const std::string& episode_id, const float* obs, std::size_t obs_size,
                                double* action, std::size_t action_size) {
  return act("get_action", episode_id, obs, nullptr, obs_size, action, false, nullptr, action_size);
}

Status TetherClient::get_action(const std::string& episode_id, const std::uint8_t* obs, std::size_t obs_size,
                                double* action, std::size_t action_size) {
  return act("get_action", episode_id, nullptr, obs, obs_size, action, false, nullptr, action_size);
}

Status TetherClient::log_action(const std::string& episode_id, const float* obs, std::size_t obs_size,
                                const double* action, std::size_t action_size) {
  return act("log_action", episode_id, obs, nullptr, obs_size, nullptr, true, action, action_size);
}

Status TetherClient::log_action(const std::string& episode_id, const std::uint8_t* obs, std::size_t obs_size,
                                const double* action, std::size_t action_size) {
  return act("log_action", episode_id, nullptr, obs, obs_size, nullptr, true, action, action_size);
}

// get_action's step (`action_out`: where the engine's action goes), or when
// `logging` log_action's (`logged`: the action the engine took). The
// observation is `obs` (floats) or `obs_bytes` (a Box's values as bytes:
// every one an integer 0-255, so only a composite space refuses them).
Status TetherClient::act(const char* call, const std::string& episode_id, const float* obs,
                         const std::uint8_t* obs_bytes, std::size_t obs_size, double* action_out, bool logging,
                         const double* logged, std::size_t action_size) {
  Status pending = catch_up();
  if (!pending.ok()) return pending;
  if (logging) {
    Status server = check_logging_server(call);
    if (!server.ok()) return server;
  }
  auto it = episodes_.find(episode_id);
  if (it == episodes_.end()) {
    return Status(ErrorCode::kInvalidArgument, std::string(call) + ": no running episode '" + episode_id + "'");
  }
  Episode& episode = it->second;
  const std::size_t obs_dim = config_->observation_space.flat_dim();
  const std::size_t act_dim = config_->action_space.flat_dim();
  if ((obs == nullptr && obs_bytes == nullptr) || obs_size != obs_dim) {
    return Status(ErrorCode::kInvalidArgument, std::string(call) + ": observation has " + std::to_string(obs_size) +
                                                   " values, the observation space needs " + std::to_string(obs_dim));
  }
  if (!logging && (action_out == nullptr || action_size != act_dim)) {
    return Status(ErrorCode::kInvalidArgument, std::string(call) + ": action buffer has " +
                                                   std::to_string(action_size) + " values, the action space needs " +
                                                   std::to_string(act_dim));
  }
  // A byte box's values that are all bytes are all finite: one pass over an
  // image checks both; only a row that fails it is walked again to name the error.
  const bool all_bytes = obs_bytes != nullptr || (config_->observation_space.is_bytes() &&
                                                  first_non_byte(obs, obs_size) == obs_size);
  for (std::size_t i = 0; i < obs_size && !all_bytes; ++i) {
    if (!std::isfinite(obs[i])) {
      return Status(ErrorCode::kNonFiniteValue,
                    std::string(call) + ": observation[" + std::to_string(i) + "] is not finite");
    }
  }
  const LinkConfig* checked = config_.get();
  const char* what = logging ? "log_action: observation" : "get_action: observation";
  Status bytes = check_row(*config_, obs, obs_bytes, obs_size, what, /*mask=*/true, all_bytes);
  if (!bytes.ok()) return bytes;
  const char* logged_what = "log_action: the action";
  if (logging) {
    // (Bytes come with no mask to check against: a mask needs a Dict or Tuple space, refused above.)
    Status action_ok = check_logged_action(config_->action_space, logged, action_size,
                                           config_->action_mask ? &*config_->action_mask : nullptr, obs, logged_what);
    if (!action_ok.ok()) return action_ok;
  }
  // A batch every steps_per_batch() steps played (§13.2): complete recorded
  // steps and steps of held-back episodes. A held-back episode makes it due
  // only once held-back steps were played since the last cut; with none, every
  // steps_per_batch() complete steps recorded (env_steps_per_sample unless the
  // server asks for fewer), as always. The sendable count walks the open
  // episodes: asked for only when the cheap tests pass.
  const std::size_t every = static_cast<std::size_t>(steps_per_batch());
  if ((episode.training || (episode.held_back && held_steps_ > 0)) && pending_steps_ + held_steps_ >= every &&
      sendable_steps(episode) + held_steps_ >= every) {
    // This observation completes the episode's last step: the cut takes it
    // as that step's next observation, nothing of the episode changed for it
    // (it is recorded below as its next step's, as always).
    const NextObservation next{&episode, obs, obs_bytes};
    send_batch(/*even_empty=*/true, &next);
    // An error that came in while the batch went (with wait_for_weights, maybe
    // its own answer) is this call's, as in the Python and C# SDKs: the step
    // is not acted, and the engine may call again.
    pending = pending_status();
    if (!pending.ok()) return pending;
  }
  // (send_batch may have applied a new connection's config: read it only now.)
  const Space& action_space = config_->action_space;
  if (action_space.flat_dim() != act_dim || config_->observation_space.flat_dim() != obs_dim) {
    return Status(ErrorCode::kInvalidArgument,
                  std::string(call) + ": the server changed its spaces on reconnecting");
  }
  if (config_.get() != checked) {  // (a new connection's space may be a byte box, or mask, where the old one was not)
    bytes = check_row(*config_, obs, obs_bytes, obs_size, what, /*mask=*/true);
    if (!bytes.ok()) return bytes;
    if (logging) {  // (... or its server older than 1.6)
      Status action_ok = check_logging_server(call);
      if (action_ok.ok()) {
        action_ok = check_logged_action(config_->action_space, logged, action_size,
                                        config_->action_mask ? &*config_->action_mask : nullptr, obs, logged_what);
      }
      if (!action_ok.ok()) return action_ok;
    }
  }
  if (!policy_) {
    return Status(ErrorCode::kNotReady, std::string(call) + ": no model yet (the server sent none)");
  }
  const std::size_t out_dim = dist_buffer_.size();
  const std::size_t state_dim = policy_->state_dim;
  if (state_dim > 0 && episode.state.size() != state_dim) {
    // Zeros before the episode's first step (§12.4). (A state of another
    // size belongs to another model: its steps not cut yet go too.)
    if (!episode.state.empty() && episode.training && episode.action_rows > 0) {
      episode.drop_uncut_steps();
      recount_pending();
    }
    episode.state.assign(state_dim, 0.0f);
  }
  // A logged step evaluates the model too (§12.4): a model with memory
  // advances its state whoever chose the action, and its dist inputs are recorded.
  Status ran = run_policy(episode.state, obs, obs_bytes, obs_size);
  if (!ran.ok()) return ran;
  double logp = 0.0;  // (a logged step's: the server never uses it as a behaviour logp, §13.7)
  if (!logging) {
    Status sampled = sample_for_record(action_space, dist_buffer_.data(), out_dim, rng_, raw_box_samples_,
                                       record_action_buffer_.data(), action_out, act_dim, &logp);
    if (!sampled.ok()) return sampled;
  } else {
    // Recorded as given: a Box action as the engine executed it, never clipped.
    std::copy(logged, logged + act_dim, record_action_buffer_.begin());
  }
  if (state_dim > 0) {
    // The state before this step goes with it (a chunk's state_in is its
    // first step's); the state after it is the episode's from now on, recorded or not.
    if (episode.training) episode.states.insert(episode.states.end(), episode.state.begin(), episode.state.end());
    episode.state.swap(state_out_);
  }
  if (episode.training) {
    EpisodeChunk& steps = episode.steps;
    append_observation_row(steps, obs, obs_bytes, obs_size, config_->observation_space.is_bytes());
    steps.actions.insert(steps.actions.end(), record_action_buffer_.begin(), record_action_buffer_.end());
    steps.rewards.push_back(0.0f);
    episode.step_reward = 0.0;
    steps.action_logp.push_back(logp);
    steps.action_dist_inputs.insert(steps.action_dist_inputs.end(), dist_buffer_.begin(), dist_buffer_.end());
    episode.versions.push_back(weights_seq_no_ ? Stamp(weights_connection_, *weights_seq_no_) : Stamp(-1, -1));
    episode.logged.push_back(logging ? 1 : 0);
    ++episode.obs_rows;
    ++episode.action_rows;
    ++pending_steps_;
  } else if (episode.held_back) {
    ++held_steps_;
  }
  if (demo_on_) record_demo_step(episode_id, demo_row(obs, obs_bytes, obs_size), obs_size, logging);
  return Status::Ok();
}

Status TetherClient::get_action(const std::string& episode_id, const std::vector<float>& obs,
                                std::vector<double>& action) {
  if (config_) action.resize(config_->action_space.flat_dim());
  return get_action(episode_id, obs.data(), obs.size(), action.data(), action.size());
}

Status TetherClient::log_action(const std::string& episode_id, const std::vector<float>& obs,
                                const std::vector<double>& action) {
  return log_action(episode_id, obs.data(), obs.size(), action.data(), action.size());
}

// Runs the model on one observation: with memory, fed `state` (kept as it is:
// the state after the step lands in state_out_, for the caller to swap in).
Status TetherClient::run_policy(std::vector<float>& state, const float* obs, const std::uint8_t* obs_bytes,
                                std::size_t obs_size) {
  const std::size_t out_dim = dist_buffer_.size();
  const std::size_t state_dim = policy_->state_dim;
  InferenceBackend& backend = *policy_->backend;
  if (state_dim == 0) {
    return obs_bytes != nullptr ? backend.run_bytes(obs_bytes, 1, obs_size, dist_buffer_.data(), out_dim)
                                : backend.run(obs, 1, obs_size, dist_buffer_.data(), out_dim);
  }
  state_out_.resize(state_dim);  // (sized once: no allocation after the first step)
  if (obs_bytes != nullptr) {
    return backend.run_bytes_recurrent(obs_bytes, 1, obs_size, state.data(), state_out_.data(), state_dim,
                                       dist_buffer_.data(), out_dim);
  }
  return backend.run_recurrent(obs, 1, obs_size, state.data(), state_out_.data(), state_dim, dist_buffer_.data(),
                               out_dim);
}

// compute_action's state for `episode_id`: a running episode's that is not
// recorded (compute_action refuses a recorded one), else the evaluation episode's (started from zeros when the id is new).
std::vector<float>& TetherClient::evaluation_state(const std::string& episode_id) {
  const std::size_t state_dim = policy_->state_dim;
  auto running = episodes_.find(episode_id);
  std::vector<float>& state = running != episodes_.end() ? running->second.state : evaluation_state_;
  if (running == episodes_.end() && (!evaluating_ || evaluation_id_ != episode_id)) {
    evaluating_ = true;
    evaluation_id_ = episode_id;
    state.clear();
  }
  if (state.size() != state_dim) state.assign(state_dim, 0.0f);
  return state;
}

Status TetherClient::compute_action(const float* obs, std::size_t obs_size, double* action, std::size_t action_size,
                                    const std::string& episode_id) {
  return greedy_action(obs, nullptr, obs_size, action, action_size, episode_id);
}

Status TetherClient::compute_action(const std::uint8_t* obs, std::size_t obs_size, double* action,
                                    std::size_t action_size, const std::string& episode_id) {
  return greedy_action(nullptr, obs, obs_size, action, action_size, episode_id);
}

// compute_action's body: the observation is `obs` (floats) or `obs_bytes` (as act's).
Status TetherClient::greedy_action(const float* obs, const std::uint8_t* obs_bytes, std::size_t obs_size,
                                   double* action, std::size_t action_size, const std::string& episode_id) {
  Status pending = catch_up();
  if (!pending.ok()) return pending;
  const std::size_t obs_dim = config_->observation_space.flat_dim();
  const std::size_t act_dim = config_->action_space.flat_dim();
  if ((obs == nullptr && obs_bytes == nullptr) || obs_size != obs_dim) {
    return Status(ErrorCode::kInvalidArgument, "compute_action: observation has " + std::to_string(obs_size) +
                                                   " values, the observation space needs " + std::to_string(obs_dim));
  }
  if (action == nullptr || action_size != act_dim) {
    return Status(ErrorCode::kInvalidArgument, "compute_action: action buffer has " + std::to_string(action_size) +
                                                   " values, the action space needs " + std::to_string(act_dim));
  }
  for (std::size_t i = 0; obs != nullptr && i < obs_size; ++i) {
    if (!std::isfinite(obs[i])) {
      return Status(ErrorCode::kNonFiniteValue, "compute_action: observation[" + std::to_string(i) + "] is not finite");
    }
  }
  Status row = check_row(*config_, obs, obs_bytes, obs_size, "compute_action: observation", /*mask=*/true);
  if (!row.ok()) return row;
  if (!policy_) return Status(ErrorCode::kNotReady, "compute_action: no model yet (the server sent none)");
  if (policy_->state_dim > 0) {
    // [1.5] A recorded episode's state must follow from its recorded
    // observations (§12.4): a greedy step it would not record is refused.
    auto running = episodes_.find(episode_id);
    if (running != episodes_.end() && running->second.training) {
      return Status(ErrorCode::kInvalidArgument,
                    "compute_action: episode '" + episode_id +
                        "' is running and recorded; its state cannot advance on a step that is not recorded: "
                        "use get_action, or another episode id for evaluation");
    }
  }
  std::vector<float>* state = policy_->state_dim > 0 ? &evaluation_state(episode_id) : nullptr;
  Status ran = run_policy(state != nullptr ? *state : state_out_, obs, obs_bytes, obs_size);
  if (!ran.ok()) return ran;
  Status greedy = deterministic(config_->action_space, dist_buffer_.data(), dist_buffer_.size(), action, act_dim);
  if (!greedy.ok()) return greedy;
  if (state != nullptr) state->swap(state_out_);
  return Status::Ok();
}

Status TetherClient::compute_action(const std::vector<float>& obs, std::vector<double>& action,
                                    const std::string& episode_id) {
  if (config_) action.resize(config_->action_space.flat_dim());
  return compute_action(obs.data(), obs.size(), action.data(), action.size(), episode_id);
}


Result<std::vector<float>> TetherClient::episode_state(const std::string& episode_id) const {
  auto it = episodes_.find(episode_id);
  if (it == episodes_.end()) {
    return Status(ErrorCode::kInvalidArgument, "episode_state: no running episode '" + episode_id + "'");
  }
  if (config_->recurrent_state.empty()) return Status(ErrorCode::kInvalidArgument, "episode_state: the model has no memory");
  return it->second.state;
}

// [1.6] An observation as the demonstration file's rows take it (floats): a
// byte one widened into a row kept for it (sized once).
const float* TetherClient::demo_row(const float* obs, const std::uint8_t* obs_bytes, std::size_t obs_size) {
  if (obs_bytes == nullptr) return obs;
  byte_row_.assign(obs_bytes, obs_bytes + obs_size);
  return byte_row_.data();
}

// [1.6] The step just played, into the demonstration file (§18): the action as the record carries it.
void TetherClient::record_demo_step(const std::string& episode_id, const float* obs, std::size_t obs_size,
                                    bool logged) {
  if (!demo_ || !demo_on_) return;
  Status written = demo_->step(episode_id, kDefaultAgentId, demo_module_, obs, obs_size,
                               record_action_buffer_.data(), record_action_buffer_.size(), logged);
  if (!written.ok()) {
    demo_on_ = false;
    demo_failed(written);
  }
}

Status TetherClient::log_returns(const std::string& episode_id, double reward) {
  auto it = episodes_.find(episode_id);
  if (it == episodes_.end()) {
    return Status(ErrorCode::kInvalidArgument, "log_returns: no running episode '" + episode_id + "'");
  }
  if (!std::isfinite(reward)) return Status(ErrorCode::kNonFiniteValue, "log_returns: reward is not finite");
  Episode& episode = it->second;
  // [1.6] A step's reward never goes beyond float32 (§10.5): a reward that
  // would take it there is refused, and nothing of it is added anywhere.
  const bool to_step = episode.training && !episode.steps.rewards.empty();
  if (to_step) {
    Status checked = check_step_reward(episode.step_reward, reward, kDefaultAgentId);
    if (!checked.ok()) return Status(checked.code(), "log_returns: " + checked.message());
  }
  episode.total_return += reward;
  // (The writer refuses only a sum beyond float32, §18, which a step the
  // episode records was refused above; one it does not record is left out of the file.)
  if (demo_on_ && demo_) demo_->add_reward(episode_id, kDefaultAgentId, reward);
  if (to_step) {
    episode.step_reward += reward;
    episode.steps.rewards.back() = step_reward_float32(episode.step_reward);
  }
  return Status::Ok();
}

Result<double> TetherClient::end_episode(const std::string& episode_id, const float* obs, std::size_t obs_size,
                                         bool truncated) {
  return finish_episode(episode_id, obs, nullptr, obs_size, truncated);
}

Result<double> TetherClient::end_episode(const std::string& episode_id, const std::uint8_t* obs, std::size_t obs_size,
                                         bool truncated) {
  return finish_episode(episode_id, nullptr, obs, obs_size, truncated);
}

// end_episode's body: the final observation is `obs` (floats) or `obs_bytes` (as act's).
Result<double> TetherClient::finish_episode(const std::string& episode_id, const float* obs,
                                            const std::uint8_t* obs_bytes, std::size_t obs_size, bool truncated) {
  if (link_->events_pending()) sync();
  // (With the link gone for good the episode still ends; the fatal status is returned below.)
  if (fatal_.ok() && !errors_.empty()) return pending_status();
  auto it = episodes_.find(episode_id);
  if (it == episodes_.end()) {
    return Status(ErrorCode::kInvalidArgument, "end_episode: no running episode '" + episode_id + "'");
  }
  const std::size_t obs_dim = config_->observation_space.flat_dim();
  if ((obs == nullptr && obs_bytes == nullptr) || obs_size != obs_dim) {
    return Status(ErrorCode::kInvalidArgument, "end_episode: observation has " + std::to_string(obs_size) +
                                                   " values, the observation space needs " + std::to_string(obs_dim));
  }
  bool finite = true;
  for (std::size_t i = 0; obs != nullptr && i < obs_size; ++i) finite = finite && std::isfinite(obs[i]);
  if (finite) {
    // Refused before the episode ends, as a wrong size is: the engine may end it again with its image.
    // (no action follows the final observation: its mask may allow nothing, §11.6)
    Status bytes = check_row(*config_, obs, obs_bytes, obs_size, "end_episode: final observation", /*mask=*/false);
    if (!bytes.ok()) return bytes;
  }
  Episode episode = std::move(it->second);
  episodes_.erase(it);
  const double total = episode.total_return;
  if (demo_on_ && demo_) {
    if (finite) {
      Status written = demo_->end(episode_id, kDefaultAgentId, demo_row(obs, obs_bytes, obs_size), obs_size,
                                  !truncated);
      if (!written.ok()) {
        demo_on_ = false;
        demo_failed(written);
      }
    } else {
      demo_->discard(episode_id, kDefaultAgentId);  // (no reader takes a non-finite observation)
    }
  }
  if (!finite) {
    // A record with a non-finite observation would be refused whole: drop the episode's steps.
    recycle(std::move(episode));
    recount_pending();
    return Status(ErrorCode::kNonFiniteValue, "end_episode: final observation is not finite (episode not sent)");
  }
  if (episode.training && episode.action_rows > 0) {
    append_observation_row(episode.steps, obs, obs_bytes, obs_size, config_->observation_space.is_bytes());
    ++episode.obs_rows;
    episode.truncated = truncated;
    episode.terminated = !truncated;
    finished_.push_back(std::move(episode));
    recount_pending();
  } else {
    recycle(std::move(episode));
    recount_pending();
  }
  if (!fatal_.ok()) return fatal_;
  return total;
}

Result<double> TetherClient::end_episode(const std::string& episode_id, const std::vector<float>& obs,
                                         bool truncated) {
  return end_episode(episode_id, obs.data(), obs.size(), truncated);
}


// A Dict or Tuple observation as the space's flat row, in leaf_row_ (sized on the first
// frame: no allocation after it); `what` names the call in a refusal.
Status TetherClient::write_leaf_row(const ObservationLeaves& obs, const char* call, const char* what) {
  if (link_->events_pending()) sync();
  if (!config_->observation_space.is_composite()) {
    return Status(ErrorCode::kInvalidArgument, std::string(call) + ": the observation space is not a Dict or Tuple");
  }
  leaf_row_.resize(config_->observation_space.flat_dim());
  Status row = obs.write_row(leaf_row_.data(), leaf_row_.size());
  if (!row.ok()) return Status(row.code(), std::string(call) + ": " + what + row.message());
  return Status::Ok();
}

Status TetherClient::get_action(const std::string& episode_id, const ObservationLeaves& obs, double* action,
                                std::size_t action_size) {
  Status row = write_leaf_row(obs, "get_action", "");
  if (!row.ok()) return row;
  return get_action(episode_id, leaf_row_.data(), leaf_row_.size(), action, action_size);
}

Status TetherClient::log_action(const std::string& episode_id, const ObservationLeaves& obs, const double* action,
                                std::size_t action_size) {
  Status row = write_leaf_row(obs, "log_action", "");
  if (!row.ok()) return row;
  return log_action(episode_id, leaf_row_.data(), leaf_row_.size(), action, action_size);
}

Result<double> TetherClient::end_episode(const std::string& episode_id, const ObservationLeaves& obs,
                                         bool truncated) {
  Status row = write_leaf_row(obs, "end_episode", "final observation: ");
  if (!row.ok()) return row;
  return end_episode(episode_id, leaf_row_.data(), leaf_row_.size(), truncated);
}

// -- cutting and sending ---------------------------------------------------------------------

bool TetherClient::cut(Episode& episode, std::vector<EpisodeChunk>& chunks, std::optional<Stamp>& oldest,
                       std::int64_t& runs_connection, const NextObservation* next) {
  // A step is complete once the observation after it is known; an action still
  // waiting for its next observation stays for the next chunk, as does the
  // observation the next chunk starts from. `next`: the observation the
  // engine just gave after the episode's last action, which completes it.
  const std::size_t actions = episode.action_rows;
  const bool completed = next != nullptr && actions > 0 && episode.obs_rows == actions;
  const std::size_t k =
      episode.obs_rows == actions + 1 || completed ? actions : (actions == 0 ? 0 : actions - 1);
  if (k == 0) return false;
  const std::size_t obs_dim = config_->observation_space.flat_dim();
  const std::size_t act_dim = config_->action_space.flat_dim();
  const std::size_t dist_dim = config_->action_space.dist_inputs_size();
  const bool done = (episode.terminated || episode.truncated) && k == actions;
  EpisodeChunk chunk;
  chunk.episode_id = episode.id;
  // (one allocation, whichever way its last row comes)
  if (config_->observation_space.is_bytes()) {
    chunk.obs_bytes.reserve((k + 1) * obs_dim);
    detail::copy_rows(episode.steps.obs_bytes, completed ? k : k + 1, obs_dim, chunk.obs_bytes);
  } else {
    chunk.obs.reserve((k + 1) * obs_dim);
    detail::copy_rows(episode.steps.obs, completed ? k : k + 1, obs_dim, chunk.obs);
  }
  if (completed) {
    append_observation_row(chunk, next->obs, next->obs_bytes, obs_dim, config_->observation_space.is_bytes());
  }
  detail::copy_rows(episode.steps.actions, k, act_dim, chunk.actions);
  detail::copy_rows(episode.steps.rewards, k, 1, chunk.rewards);
  detail::copy_rows(episode.steps.action_logp, k, 1, chunk.action_logp);
  detail::copy_rows(episode.steps.action_dist_inputs, k, dist_dim, chunk.action_dist_inputs);
  chunk.is_terminated = done && episode.terminated;
  chunk.is_truncated = done && episode.truncated;
  // [1.7] Every record of an episode with values carries them; the one that
  // ends it, the measure reported (§19.3).
  chunk.env_params.drawn = episode.env.drawn;
  if (done && episode.env.drawn) chunk.env_params.measure = episode.env.measure;
  // [1.5] The state fed with the chunk's first observation (§10.1): the
  // episode's first step's (zeros), or the one carried across the last cut.
  const std::size_t state_dim = recurrent_state_dim(config_->recurrent_state);
  if (state_dim > 0 && episode.states.size() >= k * state_dim) {
    chunk.state_in.assign(episode.states.begin(), episode.states.begin() + static_cast<std::ptrdiff_t>(state_dim));
    detail::erase_rows(episode.states, k, state_dim);
  }
  bool runs = config_->announces_version;  // (a plain v1 server is never sent runs)
  for (std::size_t i = 0; i < k; ++i) {
    const Stamp& stamp = episode.versions[i];
    if (stamp.first >= 0 && (!oldest || stamp < *oldest)) oldest = stamp;
    runs = runs && stamp.first == connection_ && stamp.second >= 0 && stamp.second <= kMaxRunVersion;
  }
  // The version of every step, when they used more than one (§10.1); not
  // when one is unknown or was learned on an earlier connection (whose
  // server may be another run). The link leaves them out too if the batch
  // goes on a later connection than this one.
  if (runs && std::any_of(episode.versions.begin() + 1, episode.versions.begin() + static_cast<std::ptrdiff_t>(k),
                          [&](const Stamp& stamp) { return stamp.second != episode.versions[0].second; })) {
    for (std::size_t i = 0; i < k; ++i) {
      const Stamp& stamp = episode.versions[i];
      std::vector<std::pair<std::int64_t, std::int64_t>>& out = chunk.weights_seq_no_runs;
      if (out.empty() || out.back().first != stamp.second) {
        out.emplace_back(stamp.second, 1);
      } else {
        ++out.back().second;
      }
    }
    runs_connection = connection_;
  }
  detail::erase_rows(episode.steps.obs, k, obs_dim);
  detail::erase_rows(episode.steps.obs_bytes, k, obs_dim);
  detail::erase_rows(episode.steps.actions, k, act_dim);
  detail::erase_rows(episode.steps.rewards, k, 1);
  detail::erase_rows(episode.steps.action_logp, k, 1);
  detail::erase_rows(episode.steps.action_dist_inputs, k, dist_dim);
  // [1.6] The chunk's logged steps, by its own step indices (§10.1): a run
  // cut in two goes half into each chunk.
  for (std::size_t i = 0; i < k && i < episode.logged.size(); ++i) {
    if (episode.logged[i] != 0) add_logged_step(chunk.logged_runs, static_cast<std::int64_t>(i));
  }
  detail::erase_rows(episode.versions, k, 1);
  detail::erase_rows(episode.logged, k, 1);
  episode.obs_rows -= k;
  episode.action_rows -= k;
  chunks.push_back(std::move(chunk));
  return true;
}

void TetherClient::send_batch(bool even_empty, const NextObservation* next) {
  if (ended_) return;  // training is done: nothing is recorded, nobody takes a batch
  auto batch = std::make_shared<Batch>();
  std::optional<Stamp> oldest;
  for (Episode& episode : finished_) {
    cut(episode, batch->chunks, oldest, batch->runs_connection);
    recycle(std::move(episode));
  }
  finished_.clear();
  for (auto& entry : episodes_) {
    if (entry.second.training) {
      cut(entry.second, batch->chunks, oldest, batch->runs_connection,
          next != nullptr && &entry.second == next->episode ? next : nullptr);
    }
  }
  recount_pending();
  // Held-back steps were played: the batch goes even without records, as its
  // answer brings the weights and record_share (§13.2).
  batch->even_empty = even_empty && held_steps_ > 0;
  held_steps_ = 0;
  if (batch->chunks.empty() && !batch->even_empty) return;
  for (const EpisodeChunk& chunk : batch->chunks) batch->env_steps += static_cast<std::int64_t>(chunk.steps());
  batch->connection = connection_;  // [1.8] its steps' versions were learned on it (§6.5)
  // The claim: the oldest version of the steps cut (§7.6); steps of unknown
  // version claim none; a batch without steps, the version held.
  if (!oldest && batch->chunks.empty() && weights_seq_no_) oldest = Stamp(weights_connection_, *weights_seq_no_);
  if (oldest) batch->weights_seq_no = oldest->second;
  const bool strict = waits_for_weights();
  std::set<std::string> gone = link_->hand_over(batch, static_cast<std::size_t>(batch->env_steps),
                                                options_.when_queue_full == QueueFullPolicy::kWait, strict);
  if (!gone.empty()) forget_episodes(gone);
  if (strict || link_->events_pending()) sync();
}

Status TetherClient::flush() {
  Status pending = catch_up();
  if (!pending.ok()) return pending;
  if (ended_) return Status::Ok();  // training is done: nothing to send, nobody to wait for
  send_batch();
  link_->wait_for_idle();
  sync();
  return pending_status();  // (a refusal that came while it waited, once)
}

}  // namespace tether
