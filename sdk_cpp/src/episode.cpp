// Episode records: building them, and validating them as a server does.
#include "tether/episode.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <set>

#include "json_util.h"
#include "tether/distributions.h"
#include "tether/tensors.h"

namespace tether {
namespace {

// ---- building --------------------------------------------------------------

// The shortest decimal that reads back as the same float32, as a JSON number,
// so a float32 value is written as "0.1" rather than "0.10000000149011612".
// (std::to_chars finds it in one pass; the printf loop, kept for standard
// libraries without floating-point to_chars, took most of the I/O thread's
// time encoding a batch.)
nlohmann::json float_json(float value) {
  if (!std::isfinite(value)) return static_cast<double>(value);  // dumped as null; validators refuse it
  char text[32];
#if defined(__cpp_lib_to_chars) && __cpp_lib_to_chars >= 201611L
  const std::to_chars_result written = std::to_chars(text, text + sizeof text, value);
  double shortest = 0.0;
  std::from_chars(text, written.ptr, shortest);  // (locale-independent, as to_chars is)
  return shortest;
#else
  for (int precision = 6; precision <= 9; ++precision) {
    std::snprintf(text, sizeof text, "%.*g", precision, static_cast<double>(value));
    if (std::strtof(text, nullptr) == value) break;
  }
  return std::strtod(text, nullptr);
#endif
}

nlohmann::json number_json(double value, bool integer) {
  if (integer) return static_cast<std::int64_t>(std::llround(value));
  return float_json(static_cast<float>(value));
}

// One value of `shape` from flat data, nested row-major; a scalar for shape [].
template <class T>
nlohmann::json nest(const T* data, const std::vector<std::int64_t>& shape, std::size_t dim, bool integer) {
  if (dim == shape.size()) return number_json(static_cast<double>(*data), integer);
  std::size_t stride = 1;
  for (std::size_t d = dim + 1; d < shape.size(); ++d) stride *= static_cast<std::size_t>(shape[d]);
  nlohmann::json out = nlohmann::json::array();
  for (std::int64_t i = 0; i < shape[dim]; ++i) {
    out.push_back(nest(data + static_cast<std::size_t>(i) * stride, shape, dim + 1, integer));
  }
  return out;
}

template <class T>
nlohmann::json rows_json(const std::vector<T>& flat, std::size_t rows, const std::vector<std::int64_t>& shape,
                         bool integer) {
  std::size_t width = 1;
  for (std::int64_t d : shape) width *= static_cast<std::size_t>(d);
  nlohmann::json out = nlohmann::json::array();
  for (std::size_t r = 0; r < rows; ++r) out.push_back(nest(flat.data() + r * width, shape, 0, integer));
  return out;
}

Status size_error(const char* field, std::size_t got, std::size_t expected) {
  return Status(ErrorCode::kInvalidArgument, std::string("\"") + field + "\" has " + std::to_string(got) +
                                                 " numbers, expected " + std::to_string(expected));
}

// ---- validation --------------------------------------------------------------

// A JSON value read into a float array: its shape, and its elements flattened
// (null as NaN, refused later as non-finite; booleans and strings are no numbers, §10.5).
struct NdArray {
  std::vector<std::size_t> shape;
  std::vector<double> data;
};

enum class ArrayError { kNone, kRagged, kNotNumber };

constexpr std::size_t kMaxDims = 32;

bool shape_of(const nlohmann::json& value, std::size_t depth, std::vector<std::size_t>& shape) {
  shape.clear();
  if (!value.is_array()) return true;
  if (depth >= kMaxDims) return false;
  shape.push_back(value.size());
  if (value.empty()) return true;
  std::vector<std::size_t> first, other;
  if (!shape_of(value[0], depth + 1, first)) return false;
  for (std::size_t i = 1; i < value.size(); ++i) {
    if (!shape_of(value[i], depth + 1, other) || other != first) return false;
  }
  shape.insert(shape.end(), first.begin(), first.end());
  return true;
}

bool flatten(const nlohmann::json& value, std::vector<double>& out) {
  if (value.is_array()) {
    for (const auto& item : value) {
      if (!flatten(item, out)) return false;
    }
    return true;
  }
  if (value.is_number()) {
    out.push_back(value.get<double>());
  } else if (value.is_null()) {
    out.push_back(std::nan(""));
  } else {
    return false;
  }
  return true;
}

ArrayError to_array(const nlohmann::json& value, bool as_float32, NdArray& out) {
  if (!shape_of(value, 0, out.shape)) return ArrayError::kRagged;
  out.data.clear();
  if (!flatten(value, out.data)) return ArrayError::kNotNumber;
  if (as_float32) {
    for (double& v : out.data) v = static_cast<double>(static_cast<float>(v));
  }
  return ArrayError::kNone;
}

std::string where_of(std::size_t index) { return "episodes[" + std::to_string(index) + "]"; }

Status fail(ErrorCode code, const std::string& where, const std::string& text) {
  return Status(code, where + ": " + text);
}

Status numeric(const nlohmann::json& value, bool as_float32, const std::string& where, const char* key,
               NdArray& out) {
  if (!value.is_array()) {
    return fail(ErrorCode::kInvalidField, where, std::string("\"") + key + "\" must be a list, got " + value.type_name());
  }
  switch (to_array(value, as_float32, out)) {
    case ArrayError::kRagged:
      return fail(std::string(key) == "obs" ? ErrorCode::kObsShapeMismatch : ErrorCode::kInvalidField, where,
                  std::string("\"") + key + "\" items do not all have the same shape");
    case ArrayError::kNotNumber:
      return fail(ErrorCode::kInvalidField, where, std::string("\"") + key + "\" must hold only numbers");
    case ArrayError::kNone:
      break;
  }
  return Status::Ok();
}

Status check_finite(const NdArray& array, const std::string& where, const char* key) {
  const std::size_t rows = array.shape.empty() ? 1 : array.shape[0];
  const std::size_t width = rows == 0 ? 1 : array.data.size() / rows;
  for (std::size_t i = 0; i < array.data.size(); ++i) {
    if (!std::isfinite(array.data[i])) {
      return fail(ErrorCode::kNonFiniteValue, where,
                  std::string("\"") + key + "\"[" + std::to_string(width ? i / width : 0) + "] is NaN or infinite");
    }
  }
  return Status::Ok();
}

std::string shape_text(const std::vector<std::size_t>& shape, std::size_t from) {
  std::string out = "[";
  for (std::size_t i = from; i < shape.size(); ++i) out += (i > from ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

bool tail_matches(const std::vector<std::size_t>& shape, const std::vector<std::int64_t>& space_shape) {
  if (shape.size() != space_shape.size() + 1) return false;
  for (std::size_t i = 0; i < space_shape.size(); ++i) {
    if (shape[i + 1] != static_cast<std::size_t>(space_shape[i])) return false;
  }
  return true;
}

// §10.6 check 18 [1.3]: "weights_seq_no_runs", if present and not null, is
// [version, steps] pairs of JSON integers (18a: every pair is checked before
// the sum, as the Python core does) whose steps sum to the chunk's T (18b).
Status check_runs(const nlohmann::json& record, std::size_t steps, const std::string& where) {
  const nlohmann::json* runs = detail::member(record, "weights_seq_no_runs");
  if (runs == nullptr || runs->is_null()) return Status::Ok();
  if (!runs->is_array()) {
    return fail(ErrorCode::kInvalidField, where, "\"weights_seq_no_runs\" must be a list of [version, steps] pairs");
  }
  for (const nlohmann::json& run : *runs) {
    if (!run.is_array() || run.size() != 2 || !detail::is_integer(run[0]) || !detail::is_integer(run[1])) {
      return fail(ErrorCode::kInvalidField, where,
                  "\"weights_seq_no_runs\" must be a list of [version, steps] integer pairs, got " + detail::describe(run));
    }
    // (as_int64 clamps a huge unsigned value to INT64_MAX: still out of range, still too many steps)
    const std::int64_t version = detail::as_int64(run[0]);
    if (version < 0 || version > kMaxRunVersion || detail::as_int64(run[1]) < 1) {
      return fail(ErrorCode::kInvalidField, where,
                  "\"weights_seq_no_runs\" has " + detail::describe(run) + ": a version is 0.." +
                      std::to_string(kMaxRunVersion) + ", a run has at least 1 step");
    }
  }
  // The counts may be huge: summed only while they fit under T (no overflow).
  std::uint64_t covered = 0;
  bool too_many = false;
  for (const nlohmann::json& run : *runs) {
    const auto count = static_cast<std::uint64_t>(detail::as_int64(run[1]));
    if (count > static_cast<std::uint64_t>(steps) - covered) {
      too_many = true;
      break;
    }
    covered += count;
  }
  if (too_many || covered != steps) {
    return fail(ErrorCode::kEpisodeLengthMismatch, where,
                "\"weights_seq_no_runs\" covers " + (too_many ? std::string("more") : std::to_string(covered)) +
                    " steps, the chunk has " + std::to_string(steps));
  }
  return Status::Ok();
}

// §10.6 check 20 [1.6]: "logged_runs", if present and not null, is
// [start, n] pairs of JSON integers, start >= 0, n >= 1, each run at or after
// the end of the one before (20a: every pair is checked first, as the Python
// core does), the last ending within the chunk's T steps (20b). The logged
// step indices go to `logged` when given.
Status check_logged_runs(const nlohmann::json& record, std::size_t steps, const std::string& where,
                         std::vector<std::size_t>* logged) {
  const nlohmann::json* runs = detail::member(record, "logged_runs");
  if (runs == nullptr || runs->is_null()) return Status::Ok();
  const char* kForm = "\"logged_runs\" must be a list of [start, steps] integer pairs";
  if (!runs->is_array()) return fail(ErrorCode::kInvalidField, where, kForm);
  for (const nlohmann::json& run : *runs) {
    if (!run.is_array() || run.size() != 2 || !detail::is_integer(run[0]) || !detail::is_integer(run[1])) {
      return fail(ErrorCode::kInvalidField, where, std::string(kForm) + ", got " + detail::describe(run));
    }
  }
  // (as_int64 clamps a huge unsigned value to INT64_MAX; an end is summed saturating: still past any chunk)
  std::int64_t end = 0;
  for (const nlohmann::json& run : *runs) {
    const std::int64_t start = detail::as_int64(run[0]);
    const std::int64_t count = detail::as_int64(run[1]);
    if (start < end || count < 1) {
      return fail(ErrorCode::kInvalidField, where,
                  "\"logged_runs\" has " + detail::describe(run) +
                      ": runs are in step order, apart, and have at least 1 step");
    }
    end = count > INT64_MAX - start ? INT64_MAX : start + count;
  }
  if (static_cast<std::uint64_t>(end) > steps) {
    return fail(ErrorCode::kEpisodeLengthMismatch, where,
                "\"logged_runs\" reaches step " + (end == INT64_MAX ? std::string("far") : std::to_string(end - 1)) +
                    ", the chunk has " + std::to_string(steps) + " steps");
  }
  if (logged != nullptr) {
    logged->clear();
    for (const nlohmann::json& run : *runs) {
      const auto start = static_cast<std::size_t>(detail::as_int64(run[0]));
      const auto count = static_cast<std::size_t>(detail::as_int64(run[1]));
      for (std::size_t t = start; t < start + count; ++t) logged->push_back(t);
    }
  }
  return Status::Ok();
}

Status flag(const nlohmann::json& record, const char* key, const std::string& where) {
  const nlohmann::json* value = detail::member(record, key);
  if (value == nullptr || !value->is_boolean()) {
    return fail(ErrorCode::kInvalidField, where,
                std::string("\"") + key + "\" must be true or false, got " +
                    (value ? detail::describe(*value) : std::string("None")));
  }
  return Status::Ok();
}

// §10.6 check 4: "obs" as nested lists of numbers (every version) or, [1.4],
// as one tensor object (§10.9) of the space's element type: uint8 for a byte
// box, float32 for every other space. `from_json` says which it was (check
// 11b applies to JSON numbers only). A uint8 tensor's values are not copied:
// no later check needs them.
Status read_observations(const nlohmann::json& value, const Space& space, std::optional<std::string_view> attachment,
                         const std::string& where, NdArray& out, bool* from_json) {
  *from_json = !value.is_object();
  if (*from_json) return numeric(value, true, where, "obs", out);
  Result<Tensor> tensor = decode_tensor(value, attachment);
  if (!tensor.ok()) return fail(ErrorCode::kInvalidTensor, where, "\"obs\": " + tensor.status().message());
  const TensorDtype wanted = space.is_bytes() ? TensorDtype::kUint8 : TensorDtype::kFloat32;
  if (tensor.value().dtype() != wanted) {
    return fail(ErrorCode::kObsDtypeMismatch, where,
                "\"obs\" is a " + std::string(to_string(tensor.value().dtype())) +
                    " tensor; the observation space takes " + std::string(to_string(wanted)));
  }
  out.shape.assign(tensor.value().shape().begin(), tensor.value().shape().end());
  out.data.clear();
  if (wanted == TensorDtype::kFloat32) tensor.value().values(out.data);
  return Status::Ok();
}

// §10.6 check 11b [1.4]: a byte box's observations written as JSON numbers
// (already read as float32) are integers from 0 to 255.
Status check_obs_bytes(const NdArray& obs, const std::string& where) {
  const std::size_t rows = obs.shape.empty() ? 1 : obs.shape[0];
  const std::size_t width = rows == 0 ? 1 : obs.data.size() / rows;
  for (std::size_t i = 0; i < obs.data.size(); ++i) {
    const double v = obs.data[i];
    if (!(v >= 0.0 && v <= 255.0) || v != std::floor(v)) {
      return fail(ErrorCode::kObsDtypeMismatch, where,
                  "\"obs\"[" + std::to_string(width ? i / width : 0) +
                      "] holds a value that is not an integer in [0, 255] (the space is a uint8 Box)");
    }
  }
  return Status::Ok();
}

// §10.6 check 4c [1.4]: a Dict or Tuple space's "obs" is an object of its
// leaves; checks 4, 10, 11 and 11b run leaf by leaf, in leaf order, and the
// leaves join into flat rows (§8.6) for the checks after.
Status read_composite(const nlohmann::json& value, const Space& space, std::optional<std::string_view> attachment,
                      const std::string& where, NdArray& out) {
  const std::vector<SpaceLeaf>& leaves = space.leaves();
  if (!value.is_object()) {
    return fail(ErrorCode::kInvalidField, where, "\"obs\" of a Dict or Tuple space must be an object with one member per leaf");
  }
  for (const SpaceLeaf& leaf : leaves) {
    if (!value.contains(leaf.path)) {
      return fail(ErrorCode::kObsLeafMismatch, where, "\"obs\" does not hold the space's leaves: missing " + leaf.path);
    }
  }
  for (auto it = value.begin(); it != value.end(); ++it) {
    if (space.leaf_index(it.key()) < 0) {
      return fail(ErrorCode::kObsLeafMismatch, where, "\"obs\" does not hold the space's leaves: unknown '" + it.key() + "'");
    }
  }
  const std::size_t width = space.flat_dim();
  std::size_t rows = 0;
  NdArray part;
  std::vector<double> values;
  for (std::size_t l = 0; l < leaves.size(); ++l) {
    const SpaceLeaf& leaf = leaves[l];
    const std::string key = "obs." + leaf.path;
    const nlohmann::json& member = value[leaf.path];
    bool from_json = !member.is_object();
    if (from_json) {
      Status status = numeric(member, true, where, "obs", part);
      if (!status.ok()) return Status(status.code(), status.message() + " (\"" + key + "\")");
      values.swap(part.data);
    } else {
      Result<Tensor> tensor = decode_tensor(member, attachment);
      if (!tensor.ok()) return fail(ErrorCode::kInvalidTensor, where, "\"" + key + "\": " + tensor.status().message());
      const TensorDtype wanted = leaf.is_bytes() ? TensorDtype::kUint8 : TensorDtype::kFloat32;
      if (tensor.value().dtype() != wanted) {
        return fail(ErrorCode::kObsDtypeMismatch, where,
                    "\"" + key + "\" is a " + std::string(to_string(tensor.value().dtype())) +
                        " tensor; the leaf takes " + std::string(to_string(wanted)));
      }
      part.shape.assign(tensor.value().shape().begin(), tensor.value().shape().end());
      tensor.value().values(values);
    }
    const std::size_t leaf_rows = part.shape.empty() ? 0 : part.shape[0];
    if (l == 0) rows = leaf_rows;
    if (part.shape.empty() || leaf_rows != rows) {
      return fail(ErrorCode::kEpisodeLengthMismatch, where,
                  "\"" + key + "\" has " + std::to_string(leaf_rows) + " observations, \"obs." + leaves[0].path +
                      "\" " + std::to_string(rows));
    }
    bool shape_ok = part.shape.size() == leaf.space.shape().size() + 1;
    for (std::size_t d = 0; shape_ok && d < leaf.space.shape().size(); ++d) {
      shape_ok = part.shape[d + 1] == static_cast<std::size_t>(leaf.space.shape()[d]);
    }
    if (!shape_ok) {
      return fail(ErrorCode::kObsShapeMismatch, where,
                  "\"" + key + "\": observation shape " + shape_text(part.shape, 1) + " does not match the leaf's space");
    }
    for (std::size_t i = 0; i < values.size(); ++i) {
      if (!std::isfinite(values[i])) {
        return fail(ErrorCode::kNonFiniteValue, where,
                    "\"" + key + "\"[" + std::to_string(i / (leaf.size ? leaf.size : 1)) + "] is NaN or infinite");
      }
      if (leaf.is_bytes() && from_json && (!(values[i] >= 0.0 && values[i] <= 255.0) || values[i] != std::floor(values[i]))) {
        return fail(ErrorCode::kObsDtypeMismatch, where,
                    "\"" + key + "\"[" + std::to_string(i / (leaf.size ? leaf.size : 1)) +
                        "] holds a value that is not an integer in [0, 255] (the leaf is a uint8 Box)");
      }
    }
    if (l == 0) out.data.assign(rows * width, 0.0);
    for (std::size_t r = 0; r < rows; ++r) {
      for (std::size_t j = 0; j < leaf.size; ++j) out.data[r * width + leaf.offset + j] = values[r * leaf.size + j];
    }
  }
  out.shape = {rows, width};
  return Status::Ok();
}

// §10.6 checks 14b-14d [1.4]: every mask value is 0 or 1; each mask on which
// an action was taken allows one (per entry); every action is allowed.
Status check_masks(const NdArray& obs, const NdArray& actions, std::size_t steps, std::size_t act_dim,
                   const ActionMask& mask, const std::string& where) {
  const std::size_t width = obs.shape.size() == 2 ? obs.shape[1] : 0;
  const std::string key = "\"obs." + mask.leaf + "\"";
  for (std::size_t t = 0; t <= steps; ++t) {
    const double* m = obs.data.data() + t * width + mask.offset;
    for (std::size_t i = 0; i < mask.size; ++i) {
      if (m[i] != 0.0 && m[i] != 1.0) {
        return fail(ErrorCode::kInvalidActionMask, where,
                    key + "[" + std::to_string(t) + "] holds a value other than 0 and 1 (an action mask)");
      }
    }
  }
  for (std::size_t entry = 0; entry < mask.segments.size(); ++entry) {
    for (std::size_t t = 0; t < steps; ++t) {
      const double* m = obs.data.data() + t * width + mask.offset + mask.segments[entry].first;
      bool any = false;
      for (std::size_t i = 0; i < mask.segments[entry].second; ++i) any = any || m[i] != 0.0;
      if (!any) {
        return fail(ErrorCode::kActionMaskEmpty, where,
                    key + "[" + std::to_string(t) + "] allows no action" +
                        (mask.segments.size() > 1 ? " for entry " + std::to_string(entry) : std::string()) +
                        ", but the step took one");
      }
    }
  }
  for (std::size_t t = 0; t < steps; ++t) {
    if (!mask.allows(obs.data.data() + t * width + mask.offset, actions.data.data() + t * act_dim)) {
      return fail(ErrorCode::kActionMasked, where,
                  "actions[" + std::to_string(t) + "] is forbidden by its mask " + key + "[" + std::to_string(t) + "]");
    }
  }
  return Status::Ok();
}

// decode_episode of the Python core, with `where` naming the record (or agent entry).
Result<std::size_t> validate_chunk(const nlohmann::json& record, const std::string& where,
                                   const Space& observation_space, const Space& action_space, bool require_logp,
                                   std::optional<std::string_view> attachment, std::size_t* obs_rows,
                                   const ActionMask* mask) {
  if (!record.is_object()) return fail(ErrorCode::kInvalidField, where, "an episode must be a JSON object");
  for (const char* key : {"obs", "actions", "rewards"}) {
    if (!record.contains(key)) return fail(ErrorCode::kInvalidField, where, std::string("missing \"") + key + "\"");
  }
  for (const char* key : {"is_terminated", "is_truncated"}) {
    Status status = flag(record, key, where);
    if (!status.ok()) return status;
  }
  NdArray obs, actions, rewards;
  const bool box_actions = action_space.kind() == SpaceKind::kBox;
  bool obs_from_json = true;
  Status status = observation_space.is_composite()
                      ? read_composite(record["obs"], observation_space, attachment, where, obs)
                      : read_observations(record["obs"], observation_space, attachment, where, obs, &obs_from_json);
  if (!status.ok()) return status;
  status = numeric(record["actions"], box_actions, where, "actions", actions);
  if (!status.ok()) return status;
  status = numeric(record["rewards"], true, where, "rewards", rewards);
  if (!status.ok()) return status;
  const std::size_t steps = rewards.shape[0];
  if (steps < 1) return fail(ErrorCode::kEpisodeLengthMismatch, where, "an episode chunk needs at least one step");
  if (obs.shape[0] != steps + 1 || actions.shape[0] != steps) {
    return fail(ErrorCode::kEpisodeLengthMismatch, where,
                "needs len(obs) == len(actions) + 1 == len(rewards) + 1, got obs=" + std::to_string(obs.shape[0]) +
                    ", actions=" + std::to_string(actions.shape[0]) + ", rewards=" + std::to_string(steps));
  }
  if (rewards.shape.size() != 1) return fail(ErrorCode::kInvalidField, where, "\"rewards\" must be a flat list of numbers");
  if (!tail_matches(obs.shape, observation_space.shape())) {
    return fail(ErrorCode::kObsShapeMismatch, where,
                "observation shape " + shape_text(obs.shape, 1) + " does not match the space's " +
                    detail::dump_json(observation_space.to_json()["type"] == "Box"
                                          ? observation_space.to_json()["shape"]
                                          : nlohmann::json::array()));
  }
  if (!(status = check_finite(obs, where, "obs")).ok()) return status;
  if (!(status = check_finite(rewards, where, "rewards")).ok()) return status;
  if (observation_space.is_bytes() && obs_from_json && !(status = check_obs_bytes(obs, where)).ok()) return status;
  if (!tail_matches(actions.shape, action_space.shape())) {
    return fail(ErrorCode::kActionOutOfSpace, where,
                "action shape " + shape_text(actions.shape, 1) + " does not match the action space");
  }
  if (!(status = check_finite(actions, where, "actions")).ok()) return status;
  // A Box action is the raw Gaussian sample (1.3, §11.4): any finite value is
  // valid, the engine executed it clipped. Discrete values must be in the space.
  if (!box_actions) {
    const std::size_t width = action_space.flat_dim();
    for (std::size_t t = 0; t < steps; ++t) {
      if (!action_space.contains(actions.data.data() + t * width, width)) {
        return fail(ErrorCode::kActionOutOfSpace, where,
                    "actions[" + std::to_string(t) + "] is outside the action space " +
                        detail::dump_json(action_space.to_json()));
      }
    }
  }
  if (mask != nullptr && observation_space.is_composite()) {
    if (!(status = check_masks(obs, actions, steps, action_space.flat_dim(), *mask, where)).ok()) return status;
  }
  if (record.contains("action_logp")) {
    NdArray logp;
    if (!(status = numeric(record["action_logp"], true, where, "action_logp", logp)).ok()) return status;
    if (logp.shape.size() != 1 || logp.shape[0] != steps) {
      return fail(ErrorCode::kEpisodeLengthMismatch, where,
                  "action_logp has " + std::to_string(logp.shape[0]) + " items, expected " + std::to_string(steps));
    }
    if (!(status = check_finite(logp, where, "action_logp")).ok()) return status;
  } else if (require_logp) {
    return fail(ErrorCode::kMissingActionLogp, where, "on-policy training needs \"action_logp\" for every step");
  }
  if (record.contains("action_dist_inputs")) {
    NdArray inputs;
    if (!(status = numeric(record["action_dist_inputs"], true, where, "action_dist_inputs", inputs)).ok()) {
      return status;
    }
    if (inputs.shape.size() != 2 || inputs.shape[0] != steps || inputs.shape[1] != action_space.dist_inputs_size()) {
      return fail(ErrorCode::kEpisodeLengthMismatch, where,
                  "action_dist_inputs has shape " + shape_text(inputs.shape, 0) + ", expected [" +
                      std::to_string(steps) + ", " + std::to_string(action_space.dist_inputs_size()) + "]");
    }
    if (!(status = check_finite(inputs, where, "action_dist_inputs")).ok()) return status;
  }
  const nlohmann::json* episode_id = detail::member(record, "episode_id");
  if (episode_id != nullptr && !episode_id->is_null() && !episode_id->is_string() &&
      !episode_id->is_number_integer()) {
    return fail(ErrorCode::kInvalidField, where, "\"episode_id\" must be a string");
  }
  if (!(status = check_runs(record, steps, where)).ok()) return status;
  if (!(status = check_logged_runs(record, steps, where, nullptr)).ok()) return status;
  if (obs_rows != nullptr) *obs_rows = obs.shape[0];
  return steps;
}

}  // namespace

void EpisodeChunk::clear() noexcept {
  obs.clear();
  obs_bytes.clear();
  actions.clear();
  rewards.clear();
  action_logp.clear();
  action_dist_inputs.clear();
  is_terminated = false;
  is_truncated = false;
  episode_id.reset();
  weights_seq_no_runs.clear();
  state_in.clear();
  logged_runs.clear();
  env_params = RecordEnvParams();
}

void add_logged_step(std::vector<std::pair<std::int64_t, std::int64_t>>& runs, std::int64_t step) {
  if (!runs.empty() && runs.back().first + runs.back().second == step) {
    ++runs.back().second;
  } else {
    runs.emplace_back(step, 1);
  }
}

Result<std::vector<std::size_t>> read_logged_steps(const nlohmann::json& record, std::size_t steps) {
  std::vector<std::size_t> logged;
  Status status = check_logged_runs(record, steps, "record", &logged);
  if (!status.ok()) return status;
  return logged;
}

namespace {

// One leaf's (or space's) values of every row as a tensor in the attachment:
// uint8 for a byte box, float32 otherwise, shaped [rows, *shape].
template <class T>
Result<nlohmann::json> tensor_at(const T* values, std::size_t count, std::size_t rows, const Space& space,
                                 std::string& attachment) {
  std::vector<std::int64_t> shape{static_cast<std::int64_t>(rows)};
  shape.insert(shape.end(), space.shape().begin(), space.shape().end());
  return encode_tensor_at(values, count, shape, attachment);
}

Result<nlohmann::json> tensor_of(const std::vector<float>& values, std::size_t rows, const Space& space,
                                 std::string& attachment) {
  if (!space.is_bytes()) return tensor_at(values.data(), values.size(), rows, space, attachment);
  std::vector<std::uint8_t> bytes(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) bytes[i] = static_cast<std::uint8_t>(values[i]);  // (checked 0-255)
  return tensor_at(bytes.data(), bytes.size(), rows, space, attachment);
}

// A record's "obs" (§10.1): nested JSON numbers (a byte box's and discrete
// leaves' as integers: 7, not 7.0), or with an attachment (a 1.4 server,
// §10.9) a byte box's as one uint8 tensor; [1.4] a Dict or Tuple's as an
// object of its leaves (§8.6), each the leaf's rows, a tensor in the attachment if given.
Result<nlohmann::json> observations_json(const std::vector<float>& flat, std::size_t rows, const Space& space,
                                         std::string* attachment) {
  if (!space.is_composite()) {
    if (attachment != nullptr && space.is_bytes()) return tensor_of(flat, rows, space, *attachment);
    return rows_json(flat, rows, space.shape(), space.is_bytes());
  }
  const std::size_t width = space.flat_dim();
  nlohmann::json out = nlohmann::json::object();
  std::vector<float> part;
  for (const SpaceLeaf& leaf : space.leaves()) {
    part.resize(rows * leaf.size);
    for (std::size_t r = 0; r < rows; ++r) {
      for (std::size_t j = 0; j < leaf.size; ++j) part[r * leaf.size + j] = flat[r * width + leaf.offset + j];
    }
    if (leaf.is_bytes()) {
      const std::size_t bad = first_non_byte(part.data(), part.size());
      if (bad != part.size()) {
        return Status(ErrorCode::kObsDtypeMismatch, "\"obs." + leaf.path + "\"[" +
                                                        std::to_string(bad / (leaf.size ? leaf.size : 1)) +
                                                        "] holds a value that is not an integer in [0, 255] "
                                                        "(the leaf is a uint8 Box)");
      }
    }
    if (attachment != nullptr) {
      Result<nlohmann::json> tensor = tensor_of(part, rows, leaf.space, *attachment);
      if (!tensor.ok()) return tensor;
      out[leaf.path] = std::move(tensor).value();
    } else {
      out[leaf.path] = rows_json(part, rows, leaf.space.shape(),
                                 leaf.is_bytes() || leaf.space.kind() != SpaceKind::kBox);
    }
  }
  return out;
}

Result<nlohmann::json> encode_chunk_fields(const EpisodeChunk& chunk, const Space& observation_space,
                                           const Space& action_space, std::string* attachment,
                                           const std::vector<RecurrentStateSpec>& recurrent_state) {
  const std::size_t steps = chunk.steps();
  // [1.5] state_in iff the model has memory (§10.6 check 19), of its size.
  if (chunk.state_in.size() != recurrent_state_dim(recurrent_state)) {
    return size_error("state_in", chunk.state_in.size(), recurrent_state_dim(recurrent_state));
  }
  const std::size_t obs_dim = observation_space.flat_dim();
  const std::size_t act_dim = action_space.flat_dim();
  if (!chunk.obs_bytes.empty() && !chunk.obs.empty()) {
    return Status(ErrorCode::kInvalidArgument, "a chunk holds its observations in obs or in obs_bytes, not in both");
  }
  // Rows kept as bytes go as a byte box's; for any other space (a batch cut
  // under a byte box that a reconnect takes to a float one of the same size)
  // as the floats 0-255 they are.
  std::vector<float> widened;
  if (!chunk.obs_bytes.empty() && !observation_space.is_bytes()) {
    widened.assign(chunk.obs_bytes.begin(), chunk.obs_bytes.end());
  }
  const bool byte_rows = !chunk.obs_bytes.empty() && widened.empty();
  const std::vector<float>& float_rows = widened.empty() ? chunk.obs : widened;
  const std::size_t obs_given = byte_rows ? chunk.obs_bytes.size() : float_rows.size();
  if (obs_given != (steps + 1) * obs_dim) return size_error(byte_rows ? "obs_bytes" : "obs", obs_given, (steps + 1) * obs_dim);
  if (chunk.actions.size() != steps * act_dim) return size_error("actions", chunk.actions.size(), steps * act_dim);
  if (observation_space.is_bytes() && !byte_rows) {
    const std::size_t bad = first_non_byte(float_rows.data(), float_rows.size());
    if (bad != float_rows.size()) {
      return Status(ErrorCode::kObsDtypeMismatch, "\"obs\"[" + std::to_string(bad / (obs_dim ? obs_dim : 1)) +
                                                      "] holds a value that is not an integer in [0, 255] "
                                                      "(the space is a uint8 Box)");
    }
  }
  if (!chunk.action_logp.empty() && chunk.action_logp.size() != steps) {
    return size_error("action_logp", chunk.action_logp.size(), steps);
  }
  const std::size_t k = action_space.dist_inputs_size();
  if (!chunk.action_dist_inputs.empty() && chunk.action_dist_inputs.size() != steps * k) {
    return size_error("action_dist_inputs", chunk.action_dist_inputs.size(), steps * k);
  }
  std::size_t covered = 0;
  for (const auto& [version, count] : chunk.weights_seq_no_runs) {
    // (a record the server would refuse whole, §10.6 check 18)
    if (version < 0 || version > kMaxRunVersion || count < 1 || static_cast<std::uint64_t>(count) > steps - covered) {
      return Status(ErrorCode::kInvalidArgument, "weights_seq_no_runs must be runs of versions 0.." +
                                                     std::to_string(kMaxRunVersion) + " covering the " +
                                                     std::to_string(steps) + " steps");
    }
    covered += static_cast<std::size_t>(count);
  }
  if (!chunk.weights_seq_no_runs.empty() && covered != steps) {
    return Status(ErrorCode::kInvalidArgument, "weights_seq_no_runs covers " + std::to_string(covered) +
                                                   " steps, the chunk has " + std::to_string(steps));
  }
  std::int64_t logged_end = 0;
  for (const auto& [start, count] : chunk.logged_runs) {
    // (a record the server would refuse whole, §10.6 check 20)
    if (start < logged_end || count < 1 || static_cast<std::uint64_t>(count) > steps ||
        static_cast<std::uint64_t>(start) > steps - static_cast<std::size_t>(count)) {
      return Status(ErrorCode::kInvalidArgument, "logged_runs must be runs of steps in order, apart, within the " +
                                                     std::to_string(steps) + " steps");
    }
    logged_end = start + count;
  }
  const bool discrete = action_space.kind() != SpaceKind::kBox;
  nlohmann::json record = nlohmann::json::object();
  if (byte_rows) {
    if (attachment != nullptr) {
      Result<nlohmann::json> tensor =
          tensor_at(chunk.obs_bytes.data(), chunk.obs_bytes.size(), steps + 1, observation_space, *attachment);
      if (!tensor.ok()) return tensor;
      record["obs"] = std::move(tensor).value();
    } else {
      record["obs"] = rows_json(chunk.obs_bytes, steps + 1, observation_space.shape(), true);
    }
  } else {
    Result<nlohmann::json> obs = observations_json(float_rows, steps + 1, observation_space, attachment);
    if (!obs.ok()) return obs;
    record["obs"] = std::move(obs).value();
  }
  record["actions"] = rows_json(chunk.actions, steps, action_space.shape(), discrete);
  nlohmann::json rewards = nlohmann::json::array();
  for (float r : chunk.rewards) rewards.push_back(float_json(r));
  record["rewards"] = std::move(rewards);
  if (!chunk.action_logp.empty()) {
    nlohmann::json logp = nlohmann::json::array();
    for (double v : chunk.action_logp) logp.push_back(v);
    record["action_logp"] = std::move(logp);
  }
  if (!chunk.action_dist_inputs.empty()) {
    record["action_dist_inputs"] = rows_json(chunk.action_dist_inputs, steps, {static_cast<std::int64_t>(k)}, false);
  }
  if (!chunk.weights_seq_no_runs.empty()) {
    nlohmann::json runs = nlohmann::json::array();
    for (const auto& [version, count] : chunk.weights_seq_no_runs) runs.push_back({version, count});
    record["weights_seq_no_runs"] = std::move(runs);
  }
  if (!recurrent_state.empty()) record["state_in"] = state_in_json(recurrent_state, chunk.state_in.data());
  if (!chunk.logged_runs.empty()) {
    nlohmann::json runs = nlohmann::json::array();
    for (const auto& [start, count] : chunk.logged_runs) runs.push_back({start, count});
    record["logged_runs"] = std::move(runs);
  }
  record["is_terminated"] = chunk.is_terminated;
  record["is_truncated"] = chunk.is_truncated;
  return record;
}

}  // namespace

nlohmann::json state_in_json(const std::vector<RecurrentStateSpec>& state, const float* values) {
  nlohmann::json out = nlohmann::json::object();
  for (const RecurrentStateSpec& tensor : state) {
    nlohmann::json units = nlohmann::json::array();
    for (std::size_t u = 0; u < tensor.size; ++u) units.push_back(float_json(values[u]));
    values += tensor.size;
    out[tensor.input] = std::move(units);
  }
  return out;
}

Result<nlohmann::json> encode_episode(const EpisodeChunk& chunk, const Space& observation_space,
                                      const Space& action_space, std::string* attachment,
                                      const std::vector<RecurrentStateSpec>& recurrent_state) {
  Result<nlohmann::json> record =
      encode_chunk_fields(chunk, observation_space, action_space, attachment, recurrent_state);
  if (!record.ok()) return record;
  if (chunk.episode_id) record.value()["episode_id"] = *chunk.episode_id;
  if (chunk.env_params) record.value()["env_params"] = chunk.env_params.to_json();
  return record;
}

Result<ModuleSpec> ModuleSpec::from_json(const std::string& module_id, const nlohmann::json& data) {
  if (!data.is_object()) {
    return Result<ModuleSpec>(ErrorCode::kInvalidField, "module '" + module_id + "' must be a JSON object");
  }
  ModuleSpec spec;
  spec.module_id = module_id;
  const nlohmann::json* obs = detail::member(data, "observation_space");
  const nlohmann::json* act = detail::member(data, "action_space");
  Result<Space> obs_space = Space::from_json(obs ? *obs : nlohmann::json());
  if (!obs_space.ok()) return Status(obs_space.status().code(), "module '" + module_id + "': " + obs_space.status().message());
  Result<Space> act_space = Space::from_json(act ? *act : nlohmann::json());
  if (!act_space.ok()) return Status(act_space.status().code(), "module '" + module_id + "': " + act_space.status().message());
  if (act_space.value().is_composite()) {
    return Result<ModuleSpec>(ErrorCode::kInvalidField, "module '" + module_id +
                                                            "': an action space is never a Dict or Tuple (§8.6)");
  }
  spec.observation_space = std::move(obs_space).value();
  spec.action_space = std::move(act_space).value();
  if (const nlohmann::json* mask = detail::member(data, "action_mask"); mask != nullptr && !mask->is_null()) {
    if (!mask->is_string()) {
      return Result<ModuleSpec>(ErrorCode::kInvalidField, "module '" + module_id + "': action_mask must be a leaf path");
    }
    Result<ActionMask> resolved =
        ActionMask::resolve(spec.observation_space, spec.action_space, mask->get_ref<const std::string&>());
    if (!resolved.ok()) {
      return Result<ModuleSpec>(ErrorCode::kInvalidField, "module '" + module_id + "': " + resolved.status().message());
    }
    spec.action_mask = std::move(resolved).value();
  }
  for (auto [key, slot] : {std::pair<const char*, std::string*>{"onnx_input_names", &spec.onnx_input_name},
                           std::pair<const char*, std::string*>{"onnx_output_names", &spec.onnx_output_name}}) {
    const nlohmann::json* names = detail::member(data, key);
    if (names != nullptr && names->is_array() && !names->empty()) {
      const nlohmann::json& first = (*names)[0];
      *slot = first.is_string() ? first.get_ref<const std::string&>() : detail::dump_json(first);
    }
  }
  Result<std::vector<RecurrentStateSpec>> state =
      recurrent_state_from_json(detail::member(data, "recurrent_state"), "module '" + module_id + "'");
  if (!state.ok()) return state.status();
  spec.recurrent_state = std::move(state).value();
  if (const nlohmann::json* trainable = detail::member(data, "trainable")) {
    if (trainable->is_boolean()) spec.trainable = trainable->get<bool>();
  }
  // value_obs_agents (§9.1): an array of agent ids, or absent or null (none); anything else refused.
  if (const nlohmann::json* agents = detail::member(data, "value_obs_agents")) {
    if (!agents->is_null()) {
      const bool ids = agents->is_array() &&
                       std::all_of(agents->begin(), agents->end(), [](const nlohmann::json& a) { return a.is_string(); });
      if (!ids) {
        return Result<ModuleSpec>(ErrorCode::kInvalidField,
                                  "module '" + module_id + "': value_obs_agents must be an array of agent ids (strings)");
      }
      for (const auto& a : *agents) spec.value_obs_agents.push_back(a.get_ref<const std::string&>());
    }
  }
  return spec;
}

Result<nlohmann::json> encode_multi_agent_record(const MultiAgentRecord& record,
                                                 const std::map<std::string, ModuleSpec>& modules,
                                                 std::string* attachment) {
  nlohmann::json out = nlohmann::json::object();
  if (record.episode_id) out["episode_id"] = *record.episode_id;
  out["is_terminated"] = record.is_terminated;
  out["is_truncated"] = record.is_truncated;
  if (record.env_params) out["env_params"] = record.env_params.to_json();
  nlohmann::json agents = nlohmann::json::object();
  for (const auto& [agent_id, entry] : record.agents) {
    auto it = modules.find(entry.module);
    if (it == modules.end()) {
      return Result<nlohmann::json>(ErrorCode::kUnknownModule,
                                    "agent '" + agent_id + "': module '" + entry.module + "' does not exist");
    }
    const ModuleSpec& spec = it->second;
    Result<nlohmann::json> fields =
        encode_chunk_fields(entry.chunk, spec.observation_space, spec.action_space, attachment, spec.recurrent_state);
    if (!fields.ok()) {
      return Status(fields.status().code(), "agent '" + agent_id + "': " + fields.status().message());
    }
    nlohmann::json& e = fields.value();
    e["module"] = entry.module;
    e["start_step"] = entry.start_step;
    const std::size_t v = spec.value_obs_dim();
    if (v > 0) {
      const std::size_t rows = entry.chunk.steps() + 1;
      if (entry.value_obs.size() != rows * v) {
        Status status = size_error("value_obs", entry.value_obs.size(), rows * v);
        return Status(status.code(), "agent '" + agent_id + "': " + status.message());
      }
      e["value_obs"] = rows_json(entry.value_obs, rows, {static_cast<std::int64_t>(v)}, false);
    }
    agents[agent_id] = std::move(e);
  }
  out["agents"] = std::move(agents);
  return out;
}

Result<GroupSpec> GroupSpec::from_json(const std::string& group_id, const nlohmann::json& data) {
  const std::string where = "group '" + group_id + "': ";
  const nlohmann::json* members = detail::member(data, "members");
  if (members == nullptr || !members->is_array()) {
    return Result<GroupSpec>(ErrorCode::kInvalidField, where + "\"members\" must be a list of agent ids");
  }
  GroupSpec group;
  group.group_id = group_id;
  std::set<std::string> seen;
  for (const auto& m : *members) {
    std::string id = m.is_string() ? m.get_ref<const std::string&>() : detail::dump_json(m);
    if (!seen.insert(id).second) break;
    group.members.push_back(std::move(id));
  }
  if (group.members.empty() || group.members.size() != members->size()) {
    return Result<GroupSpec>(ErrorCode::kInvalidField, where + "needs distinct members");
  }
  if (const nlohmann::json* reward = detail::member(data, "reward")) {
    if (*reward == "sum") {
      group.reward = GroupReward::kSum;
    } else if (*reward == "mean") {
      group.reward = GroupReward::kMean;
    } else {
      return Result<GroupSpec>(ErrorCode::kInvalidField, where + "reward must be 'sum' or 'mean'");
    }
  }
  return group;
}

Status check_step_reward(double step_sum, double reward, std::string_view agent_id, std::string_view group_id) {
  const double sum = step_sum + reward;
  if (std::fabs(sum) < kFloat32Overflow) return Status::Ok();  // (a NaN sum is refused too)
  // (each number as the shortest %g text that reads back as the same double)
  auto shortest = [](double value) {
    char text[40];
    for (int precision = 15; precision <= 17; ++precision) {
      std::snprintf(text, sizeof text, "%.*g", precision, value);
      if (std::strtod(text, nullptr) == value) break;
    }
    return std::string(text);
  };
  std::string who = "'" + std::string(agent_id) + "'";
  if (!group_id.empty()) who += " (group '" + std::string(group_id) + "')";
  return Status(ErrorCode::kNonFiniteValue, "reward " + shortest(reward) + " of " + who +
                                                " would make its step's reward " + shortest(sum) +
                                                ", beyond float32 (§10.5); nothing was added");
}

float step_reward_float32(double sum) noexcept {
  constexpr double kLargest = static_cast<double>(std::numeric_limits<float>::max());
  if (sum >= kLargest) return std::numeric_limits<float>::max();
  if (sum <= -kLargest) return -std::numeric_limits<float>::max();
  return static_cast<float>(sum);
}

double GroupSpec::combine_rewards(const std::vector<double>& rewards) const noexcept {
  double total = 0.0;
  for (double r : rewards) total += r;
  return reward == GroupReward::kMean ? total / static_cast<double>(members.size()) : total;
}

Status GroupSpec::join_observations(const std::map<std::string, std::vector<float>>& member_obs,
                                    std::vector<float>& out) const {
  std::string missing;
  for (const auto& m : members) {
    if (member_obs.find(m) == member_obs.end()) missing += (missing.empty() ? "'" : ", '") + m + "'";
  }
  if (!missing.empty()) {
    return Status(ErrorCode::kInvalidArgument,
                  "group '" + group_id + "' acts as one agent: observations of " + missing + " are missing");
  }
  out.clear();
  for (const auto& m : members) {
    const std::vector<float>& obs = member_obs.find(m)->second;
    out.insert(out.end(), obs.begin(), obs.end());
  }
  return Status::Ok();
}

Status GroupSpec::split_action(const std::vector<double>& action, std::vector<std::vector<double>>& parts) const {
  if (members.empty() || action.size() % members.size() != 0) {
    return Status(ErrorCode::kInvalidArgument, "group '" + group_id + "': an action of " +
                                                   std::to_string(action.size()) + " elements does not split into " +
                                                   std::to_string(members.size()) + " equal parts");
  }
  const std::size_t share = action.size() / members.size();
  parts.assign(members.size(), {});
  for (std::size_t i = 0; i < members.size(); ++i) {
    parts[i].assign(action.begin() + static_cast<std::ptrdiff_t>(i * share),
                    action.begin() + static_cast<std::ptrdiff_t>((i + 1) * share));
  }
  return Status::Ok();
}

nlohmann::json member_action_to_json(const std::vector<double>& part, bool discrete) {
  if (discrete && part.size() == 1) return static_cast<std::int64_t>(std::llround(part[0]));
  nlohmann::json out = nlohmann::json::array();
  for (double v : part) {
    if (discrete) {
      out.push_back(static_cast<std::int64_t>(std::llround(v)));
    } else {
      out.push_back(v);
    }
  }
  return out;
}

Result<std::pair<Space, Space>> group_spaces(const std::vector<Space>& member_obs,
                                             const std::vector<Space>& member_actions) {
  using Out = Result<std::pair<Space, Space>>;
  std::vector<double> low, high;
  for (const Space& s : member_obs) {
    if (s.kind() != SpaceKind::kBox) return Out(ErrorCode::kInvalidArgument, "group members need Box observation spaces");
    low.insert(low.end(), s.low().begin(), s.low().end());
    high.insert(high.end(), s.high().begin(), s.high().end());
  }
  const std::int64_t obs_size = static_cast<std::int64_t>(low.size());
  Result<Space> obs = Space::box({obs_size}, std::move(low), std::move(high));
  if (!obs.ok()) return obs.status();
  bool all_discrete = true, all_box = true;
  for (const Space& a : member_actions) {
    all_discrete = all_discrete && a.kind() != SpaceKind::kBox;
    all_box = all_box && a.kind() == SpaceKind::kBox;
  }
  if (all_discrete) {
    std::vector<std::int64_t> nvec;
    for (const Space& a : member_actions) {
      if (a.kind() == SpaceKind::kDiscrete) {
        if (a.start() != 0) return Out(ErrorCode::kInvalidArgument, "grouped Discrete actions must start at 0");
        nvec.push_back(a.n());
      } else {
        nvec.insert(nvec.end(), a.nvec().begin(), a.nvec().end());
      }
    }
    Result<Space> act = Space::multi_discrete(std::move(nvec));
    if (!act.ok()) return act.status();
    return std::make_pair(std::move(obs).value(), std::move(act).value());
  }
  if (all_box) {
    std::vector<double> alow, ahigh;
    for (const Space& a : member_actions) {
      alow.insert(alow.end(), a.low().begin(), a.low().end());
      ahigh.insert(ahigh.end(), a.high().begin(), a.high().end());
    }
    const std::int64_t act_size = static_cast<std::int64_t>(alow.size());
    Result<Space> act = Space::box({act_size}, std::move(alow), std::move(ahigh));
    if (!act.ok()) return act.status();
    return std::make_pair(std::move(obs).value(), std::move(act).value());
  }
  return Out(ErrorCode::kInvalidArgument, "group members' action spaces must be all discrete or all Box");
}

Status value_obs_row(const std::vector<std::string>& agents,
                     const std::map<std::string, std::vector<float>>& latest_obs, std::size_t obs_dim, float* out) {
  for (std::size_t i = 0; i < agents.size(); ++i) {
    float* slot = out + i * obs_dim;
    auto it = latest_obs.find(agents[i]);
    if (it == latest_obs.end()) {
      for (std::size_t j = 0; j < obs_dim; ++j) slot[j] = 0.0f;
      continue;
    }
    if (it->second.size() != obs_dim) {
      return Status(ErrorCode::kInvalidArgument, "agent '" + agents[i] + "' has an observation of " +
                                                     std::to_string(it->second.size()) + " numbers, expected " +
                                                     std::to_string(obs_dim));
    }
    for (std::size_t j = 0; j < obs_dim; ++j) slot[j] = it->second[j];
  }
  return Status::Ok();
}

Result<std::size_t> validate_episode(const nlohmann::json& record, std::size_t index, const Space& observation_space,
                                     const Space& action_space, bool require_logp,
                                     std::optional<std::string_view> attachment, const ActionMask* mask) {
  return validate_chunk(record, where_of(index), observation_space, action_space, require_logp, attachment, nullptr,
                        mask);
}

Result<std::size_t> validate_episodes(const nlohmann::json& message, const Space& observation_space,
                                      const Space& action_space, bool require_logp,
                                      std::optional<std::string_view> attachment, const ActionMask* mask) {
  const nlohmann::json* records = detail::member(message, "episodes");
  if (records == nullptr || !records->is_array()) {
    return Result<std::size_t>(ErrorCode::kInvalidField, "\"episodes\" must be a list of episode records");
  }
  std::size_t total = 0;
  for (std::size_t i = 0; i < records->size(); ++i) {
    Result<std::size_t> steps =
        validate_episode((*records)[i], i, observation_space, action_space, require_logp, attachment, mask);
    if (!steps.ok()) return steps;
    total += steps.value();
  }
  return total;
}

Result<std::size_t> validate_multi_agent_record(const nlohmann::json& record, std::size_t index,
                                                const std::map<std::string, ModuleSpec>& modules,
                                                bool require_logp, std::optional<std::string_view> attachment) {
  const std::string where = where_of(index);
  const nlohmann::json* agents = detail::member(record, "agents");
  if (agents == nullptr || !agents->is_object()) {
    return fail(ErrorCode::kInvalidField, where, "\"agents\" must be an object keyed by agent id");
  }
  for (const char* key : {"is_terminated", "is_truncated"}) {
    const nlohmann::json* value = detail::member(record, key);
    if (value != nullptr && !value->is_boolean()) {
      return fail(ErrorCode::kInvalidField, where, std::string("\"") + key + "\" must be true or false");
    }
  }
  std::size_t agent_steps = 0;
  for (const auto& item : agents->items()) {
    const std::string agent_where = where + ".agents['" + item.key() + "']";
    const nlohmann::json& entry = item.value();
    if (!entry.is_object()) return fail(ErrorCode::kInvalidField, agent_where, "must be an object");
    const std::string* module_id = detail::string_member(entry, "module");
    auto it = module_id ? modules.find(*module_id) : modules.end();
    if (it == modules.end()) {
      const nlohmann::json* module = detail::member(entry, "module");
      return fail(ErrorCode::kUnknownModule, agent_where,
                  "module " + (module ? detail::describe(*module) : std::string("None")) + " does not exist");
    }
    const ModuleSpec& spec = it->second;
    std::size_t obs_rows = 0;
    Result<std::size_t> steps =
        validate_chunk(entry, agent_where, spec.observation_space, spec.action_space, require_logp, attachment, &obs_rows,
                       spec.action_mask ? &*spec.action_mask : nullptr);
    if (!steps.ok()) return steps;
    const std::size_t v = spec.value_obs_dim();
    if (v > 0) {
      const nlohmann::json* value_obs = detail::member(entry, "value_obs");
      NdArray rows;
      const bool rectangular = value_obs != nullptr && value_obs->is_array() &&
                               to_array(*value_obs, true, rows) == ArrayError::kNone;
      if (!rectangular || rows.shape.size() != 2 || rows.shape[0] != obs_rows || rows.shape[1] != v) {
        return fail(ErrorCode::kObsShapeMismatch, agent_where,
                    "module '" + spec.module_id + "' has a centralized critic: \"value_obs\" must be " +
                        std::to_string(obs_rows) + " rows of " + std::to_string(v) + " numbers");
      }
      for (double x : rows.data) {
        if (!std::isfinite(x)) return fail(ErrorCode::kNonFiniteValue, agent_where, "value_obs is not finite");
      }
    }
    const nlohmann::json* start = detail::member(entry, "start_step");
    if (start != nullptr && (!start->is_number_integer() || detail::as_int64(*start) < 0)) {
      return fail(ErrorCode::kInvalidField, agent_where, "start_step must be an integer >= 0");
    }
    agent_steps += steps.value();
  }
  return agent_steps;
}

}  // namespace tether
