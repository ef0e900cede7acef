// DemoWriter: demonstration files (§18) written line by line as episodes end.
#include "tether/demonstrations.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <iterator>

#include "json_util.h"
#include "tether/logged_action.h"
#include "tether/observation_leaves.h"

namespace tether {

namespace {

std::string in_quotes(const std::string& text) { return "'" + text + "'"; }

std::string system_error_text() {
  const int error = errno;
  return error != 0 ? std::string(std::strerror(error)) : std::string("unknown error");
}

}  // namespace

void DemoWriter::FileCloser::operator()(std::FILE* file) const noexcept {
  if (file != nullptr) std::fclose(file);
}

Result<std::unique_ptr<DemoWriter>> DemoWriter::create(const std::string& path,
                                                       const std::map<std::string, DemoModuleSpaces>& modules) {
  if (modules.empty()) {
    return Status(ErrorCode::kInvalidArgument, "a demonstration file names at least one module's spaces");
  }
  std::unique_ptr<DemoWriter> writer(new DemoWriter());  // (its constructor is for create() only)
  writer->path_ = path;
  nlohmann::json entries = nlohmann::json::object();
  for (const auto& [id, spaces] : modules) {
    // Parsed as a module object of SET_CONFIG (§9.1), so a mask that does not fit is refused here.
    nlohmann::json entry = {{"observation_space", spaces.observation_space}, {"action_space", spaces.action_space}};
    if (spaces.action_mask) entry["action_mask"] = *spaces.action_mask;
    Result<ModuleSpec> spec = ModuleSpec::from_json(id, entry);
    if (!spec.ok()) {
      return Status(ErrorCode::kInvalidField, "demonstration file: " + spec.status().message());
    }
    writer->modules_.emplace(id, std::move(spec).value());
    entries[id] = std::move(entry);
  }
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr) {
    return Status(ErrorCode::kInvalidArgument,
                  "cannot create the demonstration file " + in_quotes(path) + ": " + system_error_text());
  }
  writer->file_.reset(file);
  const nlohmann::json header = {{"format", kDemoFormat}, {"version", kDemoVersion}, {"modules", std::move(entries)}};
  Status written = writer->write_text(detail::dump_json(header) + "\n");
  if (!written.ok()) return written;
  return writer;
}

DemoWriter::~DemoWriter() { close(); }

const ModuleSpec* DemoWriter::module(const std::string& module) const {
  auto it = modules_.find(module);
  return it == modules_.end() ? nullptr : &it->second;
}

Status DemoWriter::step(const std::string& episode_id, const std::string& agent_id, const std::string& module,
                        const float* obs, std::size_t obs_size, const double* action, std::size_t action_size,
                        bool logged) {
  if (closed()) return Status(ErrorCode::kClosed, "demonstration file " + in_quotes(path_) + " is closed");
  auto found = modules_.find(module);
  if (found == modules_.end()) {
    return Status(ErrorCode::kUnknownModule,
                  "module " + in_quotes(module) + " is not one of the demonstration file's header");
  }
  const ModuleSpec& spec = found->second;
  const std::size_t obs_dim = spec.obs_dim();
  if (obs == nullptr || obs_size != obs_dim) {
    return Status(ErrorCode::kInvalidArgument, "demonstration step: observation has " + std::to_string(obs_size) +
                                                   " values, module " + in_quotes(module) + " needs " +
                                                   std::to_string(obs_dim));
  }
  // The reader's checks (§10.6 checks 4-14d), so that no line it would refuse is written.
  Status checked = check_observation_row(spec.observation_space, obs, obs_size, "demonstration step: observation");
  if (checked.ok() && spec.action_mask) checked = spec.action_mask->check_row(obs, "demonstration step: observation");
  if (checked.ok()) {
    checked = check_logged_action(spec.action_space, action, action_size,
                                  spec.action_mask ? &*spec.action_mask : nullptr, obs, "demonstration step: the action");
  }
  if (!checked.ok()) return checked;
  auto it = running_.find(std::pair<std::string_view, std::string_view>(episode_id, agent_id));
  if (it == running_.end()) {
    it = running_.emplace(Key(episode_id, agent_id), Running()).first;
    it->second.module = module;
    it->second.spec = &spec;
    it->second.started = next_start_++;
  } else if (it->second.module != module) {
    return Status(ErrorCode::kInvalidArgument, "demonstration step: " + in_quotes(agent_id) + " of episode " +
                                                   in_quotes(episode_id) + " acts with module " +
                                                   in_quotes(it->second.module) + ", not " + in_quotes(module));
  }
  Running& episode = it->second;
  episode.obs.insert(episode.obs.end(), obs, obs + obs_size);
  episode.actions.insert(episode.actions.end(), action, action + action_size);
  episode.rewards.push_back(0.0);
  episode.logged.push_back(logged ? 1 : 0);
  ++episode.steps;
  return Status::Ok();
}

Status DemoWriter::add_reward(const std::string& episode_id, const std::string& agent_id, double reward) {
  if (closed()) return Status(ErrorCode::kClosed, "demonstration file " + in_quotes(path_) + " is closed");
  if (!std::isfinite(reward)) return Status(ErrorCode::kNonFiniteValue, "demonstration reward is not finite");
  auto it = running_.find(std::pair<std::string_view, std::string_view>(episode_id, agent_id));
  if (it == running_.end() || it->second.rewards.empty()) return Status::Ok();
  // The line carries the step's reward as float32 (§10.5): a sum beyond it
  // would be written as null, and the reader would refuse the file at that line.
  const double sum = it->second.rewards.back() + reward;
  if (!(std::fabs(sum) < kFloat32Overflow)) {
    return Status(ErrorCode::kNonFiniteValue, "demonstration reward: the step's rewards sum to " +
                                                  std::to_string(sum) + ", beyond float32 (not added)");
  }
  it->second.rewards.back() = sum;
  return Status::Ok();
}

Status DemoWriter::end(const std::string& episode_id, const std::string& agent_id, const float* final_obs,
                       std::size_t obs_size, bool terminated) {
  if (closed()) return Status(ErrorCode::kClosed, "demonstration file " + in_quotes(path_) + " is closed");
  auto it = running_.find(std::pair<std::string_view, std::string_view>(episode_id, agent_id));
  if (it == running_.end()) return Status::Ok();  // (no step: nothing to write, §18)
  const ModuleSpec& spec = *it->second.spec;
  if (final_obs == nullptr || obs_size != spec.obs_dim()) {
    return Status(ErrorCode::kInvalidArgument, "demonstration end: final observation has " +
                                                   std::to_string(obs_size) + " values, module " +
                                                   in_quotes(it->second.module) + " needs " +
                                                   std::to_string(spec.obs_dim()));
  }
  // (no action follows a final observation: its mask is not checked)
  Status checked =
      check_observation_row(spec.observation_space, final_obs, obs_size, "demonstration end: final observation");
  if (!checked.ok()) return checked;
  Running episode = std::move(it->second);
  running_.erase(it);
  return write_line(episode_id, agent_id, episode, episode.steps, final_obs, terminated);
}

void DemoWriter::discard(const std::string& episode_id, const std::string& agent_id) {
  auto it = running_.find(std::pair<std::string_view, std::string_view>(episode_id, agent_id));
  if (it != running_.end()) running_.erase(it);
}

void DemoWriter::discard_module(const std::string& module) {
  for (auto it = running_.begin(); it != running_.end();) {
    it = it->second.module == module ? running_.erase(it) : std::next(it);
  }
}

Status DemoWriter::close() {
  if (closed()) return Status::Ok();
  std::vector<std::pair<const Key*, const Running*>> order;
  for (const auto& [key, episode] : running_) order.emplace_back(&key, &episode);
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) { return a.second->started < b.second->started; });
  Status status;
  for (const auto& [key, episode] : order) {
    if (!status.ok()) break;  // (a failed write forgot the running episodes)
    // The last step's next observation never came: its observation ends the episode, cut off.
    if (episode->steps < 2) continue;
    const std::size_t steps = episode->steps - 1;
    status = write_line(key->first, key->second, *episode, steps, episode->obs.data() + steps * episode->spec->obs_dim(),
                        /*terminated=*/false);
  }
  running_.clear();
  if (file_ != nullptr && std::fclose(file_.release()) != 0 && status.ok()) {
    status = Status(ErrorCode::kInternal, "demonstration file " + in_quotes(path_) + " was not closed cleanly: " +
                                              system_error_text());
  }
  return status;
}

Status DemoWriter::write_line(const std::string& episode_id, const std::string& agent_id, const Running& episode,
                              std::size_t steps, const float* final_obs, bool terminated) {
  const ModuleSpec& spec = *episode.spec;
  const std::size_t obs_dim = spec.obs_dim();
  const std::size_t act_dim = spec.action_space.flat_dim();
  EpisodeChunk chunk;
  chunk.obs.assign(episode.obs.begin(), episode.obs.begin() + static_cast<std::ptrdiff_t>(steps * obs_dim));
  chunk.obs.insert(chunk.obs.end(), final_obs, final_obs + obs_dim);
  chunk.actions.assign(episode.actions.begin(), episode.actions.begin() + static_cast<std::ptrdiff_t>(steps * act_dim));
  for (std::size_t t = 0; t < steps; ++t) {
    chunk.rewards.push_back(step_reward_float32(episode.rewards[t]));
    if (episode.logged[t] != 0) add_logged_step(chunk.logged_runs, static_cast<std::int64_t>(t));
  }
  chunk.is_terminated = terminated;
  chunk.is_truncated = !terminated;
  // The record form (§10.1) in JSON numbers: no logp, dist inputs or state_in (§18).
  Result<nlohmann::json> line = encode_episode(chunk, spec.observation_space, spec.action_space);
  if (!line.ok()) return line.status();
  line.value()["module"] = episode.module;
  line.value()["agent_id"] = agent_id;
  line.value()["episode_id"] = episode_id;
  Status written = write_text(detail::dump_json(line.value()) + "\n");
  if (written.ok()) ++written_;
  return written;
}

Status DemoWriter::write_text(const std::string& text) {
  if (std::fwrite(text.data(), 1, text.size(), file_.get()) != text.size() || std::fflush(file_.get()) != 0) {
    Status failed(ErrorCode::kInternal,
                  "cannot write the demonstration file " + in_quotes(path_) + ": " + system_error_text());
    file_.reset();  // (a file with a torn line is not written to again)
    running_.clear();
    return failed;
  }
  return Status::Ok();
}

}  // namespace tether
