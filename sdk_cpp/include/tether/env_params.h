// [1.7] Environment parameters (docs/protocol.md §19): the values a server
// asks the engines to play with, each a number or a sampler an engine draws
// from once per episode, and what a record says an episode was played with.
// The C++ counterpart of protocol/env_params.py: pure (no I/O); the uniform
// draws come from the caller's generator.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tether/status.h"

namespace tether {

/// At most this many parameters in one set (§19.1).
inline constexpr std::size_t kMaxEnvParams = 64;
/// At most this many characters (Unicode code points) in a parameter's name.
inline constexpr std::size_t kMaxEnvParamNameChars = 64;
/// At most this many [low, high] pairs in a "ranges" sampler.
inline constexpr std::size_t kMaxEnvParamRanges = 16;
/// The largest magnitude of a parameter's value, a sampler's number or a measure.
inline constexpr double kMaxEnvParamMagnitude = 1e300;

/// One parameter's value in a set (§19.1): a fixed number, or a sampler.
struct EnvParamValue {
  /// What the value is.
  enum class Kind {
    kFixed,     ///< a number: `value`
    kUniform,   ///< "uniform": `low` + u * (`high` - `low`)
    kGaussian,  ///< "gaussian": `mean` + `stddev` * Box-Muller(u1, u2)
    kRanges,    ///< "ranges": a uniform point of the union of `ranges` (all points: each as often)
  };
  Kind kind = Kind::kFixed;  ///< which of the members below hold it
  double value = 0.0;        ///< kFixed
  double low = 0.0;          ///< kUniform
  double high = 0.0;         ///< kUniform
  double mean = 0.0;         ///< kGaussian
  double stddev = 0.0;       ///< kGaussian: its "std" (>= 0)
  std::vector<std::pair<double, double>> ranges;  ///< kRanges: 1 to 16 [low, high] pairs, low <= high

  /// A fixed number.
  static EnvParamValue fixed(double number);
  /// Whether it is a sampler (a value drawn per episode), not a fixed number.
  bool is_sampler() const noexcept { return kind != Kind::kFixed; }
  /// Whether `x` is a value this parameter can give (§19.3): the number
  /// itself, a point of a uniform's or a range's closed interval, any finite
  /// number for a gaussian.
  bool allows(double x) const noexcept;
  /// Its JSON: a number, or the sampler object.
  nlohmann::json to_json() const;
};

/// A parameter's name -> its value, in the order of names sorted by their
/// UTF-8 bytes (std::string's order): the order values are drawn in (§19.1).
using EnvParamValues = std::map<std::string, EnvParamValue>;
/// A parameter's name -> the number an episode plays with (drawn values).
using EnvValues = std::map<std::string, double>;

/// One parameter set, as SET_STATE's "env_params" carries it (§19.1, §19.2).
struct EnvParams {
  std::int64_t seq = 0;     ///< the set's number (>= 1)
  std::int64_t lesson = 0;  ///< the curriculum's lesson (0: no lessons)
  EnvParamValues values;    ///< at most 64 parameters

  /// The set `body` describes. INVALID_FIELD, naming what, when it breaks
  /// §19.1: not an object, seq not an integer >= 1, lesson not an integer
  /// >= 0, values not an object of at most 64 parameters, a name not 1 to 64
  /// characters, a value neither a number (not a boolean) of magnitude at
  /// most 1e300 nor a sampler of exactly its kind's members with low <= high
  /// (std >= 0, 1 to 16 ranges). A client ignores such a set (§19.2).
  static Result<EnvParams> from_json(const nlohmann::json& body);
  /// Its JSON ({"seq", "lesson", "values"}).
  nlohmann::json to_json() const;
};

/// A parameter's value from its JSON (§19.1): a number or a sampler object;
/// INVALID_FIELD naming `what` otherwise.
Result<EnvParamValue> parse_env_param_value(const nlohmann::json& value, const std::string& what = "value");

/// A source of uniform draws in [0, 1) (the client's generator, or a vector's list).
using UniformSource = std::function<double()>;

/// An episode's value of one parameter (§19.1): a number is itself; a
/// sampler takes one draw of `uniform` (two for a gaussian: u1, for the
/// radius, first; then u2, for the angle), computed in double precision as
/// the spec writes it. A "ranges" sampler whose pairs are all points (total
/// width 0) gives the low of the pair at index floor(u * n) (at most n - 1).
double draw_env_param(const EnvParamValue& value, const UniformSource& uniform);

/// An episode's values of a whole set, drawn in the order of the names
/// sorted by their UTF-8 bytes (§19.1).
EnvValues draw_env_params(const EnvParamValues& values, const UniformSource& uniform);

/// A record's "env_params" member (§19.3): {"seq", "values", and "measure"
/// when given}; the values and the measure written as doubles.
nlohmann::json record_env_params(std::int64_t seq, const EnvValues& values,
                                 std::optional<double> measure = std::nullopt);

/// What an episode that started while the client held a set plays with: the
/// set's seq and the values drawn for it (§19.1). Shared, immutable, by the
/// episode and the records cut from it.
struct EpisodeEnvParams {
  std::int64_t seq = 0;  ///< the seq of the set the values were drawn from
  EnvValues values;      ///< every parameter of that set, its value for the episode
};

/// The "env_params" a record of an episode carries (§19.3): the episode's
/// seq and values, and the measure on the record that ends it (when one was
/// reported). Null `drawn`: the record has no "env_params".
struct RecordEnvParams {
  std::shared_ptr<const EpisodeEnvParams> drawn;  ///< the episode's values, or null
  std::optional<double> measure;                  ///< only on the record that ends the episode

  /// Whether the record carries "env_params".
  explicit operator bool() const noexcept { return drawn != nullptr; }
  /// The member's JSON (record_env_params); call only when it carries one.
  nlohmann::json to_json() const;
};

/// The check report_measure makes (§19.3): NON_FINITE_VALUE for a NaN or
/// infinite value, or one of magnitude above 1e300; ok otherwise.
Status check_measure(double value);

}  // namespace tether
