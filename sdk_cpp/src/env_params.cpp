// [1.7] Environment parameters (§19): parsing a set, drawing an episode's
// values, a record's "env_params" (see env_params.h).
#include "tether/env_params.h"

#include <cmath>

#include "json_util.h"

namespace tether {
namespace {

constexpr double kEnvParamsPi = 3.14159265358979323846;  // (math.pi's double)

Status env_params_invalid(const std::string& message) { return Status(ErrorCode::kInvalidField, message); }

// A JSON number (not a boolean) of magnitude at most 1e300, into `out`.
Status env_param_number(const nlohmann::json& value, const std::string& what, double& out) {
  if (!value.is_number()) {
    return env_params_invalid(what + " must be a number, got " + detail::describe(value));
  }
  const double number = value.get<double>();
  if (!std::isfinite(number) || std::fabs(number) > kMaxEnvParamMagnitude) {
    return env_params_invalid(what + " must be a finite number of magnitude at most 1e300");
  }
  out = number;
  return Status::Ok();
}

// Unicode code points of UTF-8 text (the bytes that do not continue a character).
std::size_t env_param_code_points(const std::string& text) {
  std::size_t n = 0;
  for (const char c : text) n += (static_cast<unsigned char>(c) & 0xC0u) != 0x80u ? 1 : 0;
  return n;
}

// Whether `text` is well-formed UTF-8 (no lone surrogate, no overlong form).
bool env_param_is_text(const std::string& text) {
  std::size_t i = 0;
  const std::size_t n = text.size();
  while (i < n) {
    const auto c = static_cast<unsigned char>(text[i]);
    std::size_t extra = 0;
    std::uint32_t point = 0;
    if (c < 0x80u) {
      ++i;
      continue;
    } else if ((c & 0xE0u) == 0xC0u) {
      extra = 1;
      point = c & 0x1Fu;
    } else if ((c & 0xF0u) == 0xE0u) {
      extra = 2;
      point = c & 0x0Fu;
    } else if ((c & 0xF8u) == 0xF0u) {
      extra = 3;
      point = c & 0x07u;
    } else {
      return false;
    }
    if (i + extra >= n) return false;  // (a character cut short)
    for (std::size_t k = 1; k <= extra; ++k) {
      const auto next = static_cast<unsigned char>(text[i + k]);
      if ((next & 0xC0u) != 0x80u) return false;
      point = (point << 6) | (next & 0x3Fu);
    }
    static const std::uint32_t kLeast[4] = {0, 0x80u, 0x800u, 0x10000u};
    if (point < kLeast[extra] || point > 0x10FFFFu || (point >= 0xD800u && point <= 0xDFFFu)) return false;
    i += extra + 1;
  }
  return true;
}

}  // namespace

EnvParamValue EnvParamValue::fixed(double number) {
  EnvParamValue out;
  out.kind = Kind::kFixed;
  out.value = number;
  return out;
}

bool EnvParamValue::allows(double x) const noexcept {
  switch (kind) {
    case Kind::kFixed: return x == value;
    case Kind::kUniform: return low <= x && x <= high;
    case Kind::kGaussian: return std::isfinite(x);
    case Kind::kRanges:
      for (const auto& [lo, hi] : ranges) {
        if (lo <= x && x <= hi) return true;
      }
      return false;
  }
  return false;
}

nlohmann::json EnvParamValue::to_json() const {
  switch (kind) {
    case Kind::kFixed: return value;
    case Kind::kUniform: return {{"sampler", "uniform"}, {"low", low}, {"high", high}};
    case Kind::kGaussian: return {{"sampler", "gaussian"}, {"mean", mean}, {"std", stddev}};
    case Kind::kRanges: {
      nlohmann::json pairs = nlohmann::json::array();
      for (const auto& [lo, hi] : ranges) pairs.push_back(nlohmann::json::array({lo, hi}));
      return {{"sampler", "ranges"}, {"ranges", std::move(pairs)}};
    }
  }
  return nullptr;
}

Result<EnvParamValue> parse_env_param_value(const nlohmann::json& value, const std::string& what) {
  EnvParamValue out;
  if (!value.is_object()) {
    double number = 0.0;
    Status read = env_param_number(value, what, number);
    if (!read.ok()) return read;
    return EnvParamValue::fixed(number);
  }
  const std::string* kind = detail::string_member(value, "sampler");
  if (kind == nullptr || (*kind != "uniform" && *kind != "gaussian" && *kind != "ranges")) {
    const nlohmann::json* given = detail::member(value, "sampler");
    return env_params_invalid(what + ": \"sampler\" must be one of uniform, gaussian, ranges, got " +
                              (given != nullptr ? detail::describe(*given) : std::string("none")));
  }
  const char* first = *kind == "uniform" ? "low" : *kind == "gaussian" ? "mean" : "ranges";
  const char* second = *kind == "uniform" ? "high" : *kind == "gaussian" ? "std" : nullptr;
  const std::size_t members = second != nullptr ? 3 : 2;
  if (value.size() != members || !value.contains(first) || (second != nullptr && !value.contains(second))) {
    // (Python names the members sorted: "high, low", "mean, std", "ranges".)
    const std::string names = *kind == "uniform" ? "high, low" : *kind == "gaussian" ? "mean, std" : "ranges";
    return env_params_invalid(what + ": a " + *kind + " sampler has exactly the members sampler, " + names);
  }
  if (*kind == "uniform") {
    out.kind = EnvParamValue::Kind::kUniform;
    Status read = env_param_number(value["low"], what + ".low", out.low);
    if (read.ok()) read = env_param_number(value["high"], what + ".high", out.high);
    if (!read.ok()) return read;
    if (out.low > out.high) return env_params_invalid(what + ": low is above high");
    return out;
  }
  if (*kind == "gaussian") {
    out.kind = EnvParamValue::Kind::kGaussian;
    Status read = env_param_number(value["mean"], what + ".mean", out.mean);
    if (read.ok()) read = env_param_number(value["std"], what + ".std", out.stddev);
    if (!read.ok()) return read;
    if (out.stddev < 0.0) return env_params_invalid(what + ": std is negative");
    return out;
  }
  out.kind = EnvParamValue::Kind::kRanges;
  const nlohmann::json& ranges = value["ranges"];
  if (!ranges.is_array() || ranges.empty() || ranges.size() > kMaxEnvParamRanges) {
    return env_params_invalid(what + ": ranges must be a list of 1 to 16 [low, high] pairs");
  }
  out.ranges.reserve(ranges.size());
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    const nlohmann::json& pair = ranges[i];
    const std::string at = what + ".ranges[" + std::to_string(i) + "]";
    if (!pair.is_array() || pair.size() != 2) return env_params_invalid(at + " must be a [low, high] pair");
    double lo = 0.0, hi = 0.0;
    Status read = env_param_number(pair[0], at + "[0]", lo);
    if (read.ok()) read = env_param_number(pair[1], at + "[1]", hi);
    if (!read.ok()) return read;
    if (lo > hi) return env_params_invalid(at + ": low is above high");
    out.ranges.emplace_back(lo, hi);
  }
  return out;
}

Result<EnvParams> EnvParams::from_json(const nlohmann::json& body) {
  if (!body.is_object()) return env_params_invalid("env_params must be an object");
  const nlohmann::json* seq = detail::member(body, "seq");
  const nlohmann::json* lesson = detail::member(body, "lesson");
  const nlohmann::json* values = detail::member(body, "values");
  if (seq == nullptr || !detail::is_integer(*seq) || detail::as_int64(*seq) < 1) {
    return env_params_invalid("env_params.seq must be an integer >= 1");
  }
  if (lesson == nullptr || !detail::is_integer(*lesson) || detail::as_int64(*lesson) < 0) {
    return env_params_invalid("env_params.lesson must be an integer >= 0");
  }
  if (values == nullptr || !values->is_object() || values->size() > kMaxEnvParams) {
    return env_params_invalid("env_params.values must be an object of at most 64 parameters");
  }
  EnvParams out;
  out.seq = detail::as_int64(*seq);
  out.lesson = detail::as_int64(*lesson);
  for (auto it = values->begin(); it != values->end(); ++it) {
    const std::string& name = it.key();
    const std::size_t chars = env_param_code_points(name);
    if (chars < 1 || chars > kMaxEnvParamNameChars || !env_param_is_text(name)) {
      return env_params_invalid("env_params: a parameter name must be text of 1 to 64 characters, got " +
                                detail::describe(nlohmann::json(name)));
    }
    Result<EnvParamValue> value = parse_env_param_value(it.value(), "env_params.values['" + name + "']");
    if (!value.ok()) return value.status();
    out.values.emplace(name, std::move(value).value());
  }
  return out;
}

nlohmann::json EnvParams::to_json() const {
  nlohmann::json out_values = nlohmann::json::object();
  for (const auto& [name, value] : values) out_values[name] = value.to_json();
  return {{"seq", seq}, {"lesson", lesson}, {"values", std::move(out_values)}};
}

double draw_env_param(const EnvParamValue& value, const UniformSource& uniform) {
  switch (value.kind) {
    case EnvParamValue::Kind::kFixed: return value.value;
    case EnvParamValue::Kind::kUniform: {
      const double u = uniform();
      return value.low + u * (value.high - value.low);
    }
    case EnvParamValue::Kind::kGaussian: {
      const double u1 = uniform();  // (the radius's draw first, then the angle's)
      const double u2 = uniform();
      return value.mean + value.stddev * std::sqrt(-2.0 * std::log(1.0 - u1)) * std::cos(2.0 * kEnvParamsPi * u2);
    }
    case EnvParamValue::Kind::kRanges: {
      if (value.ranges.empty()) return 0.0;  // (a parsed sampler has 1 to 16 pairs)
      const double u = uniform();
      double width = 0.0;
      for (const auto& [lo, hi] : value.ranges) width += hi - lo;
      if (width == 0.0) {
        // Every pair a point: the pair at index floor(u * n) gives its low, each as often.
        const std::size_t n = value.ranges.size();
        const auto index = static_cast<std::size_t>(u * static_cast<double>(n));
        return value.ranges[index < n ? index : n - 1].first;
      }
      double x = u * width;
      for (const auto& [lo, hi] : value.ranges) {
        if (x < hi - lo) return lo + x;
        x -= hi - lo;
      }
      return value.ranges.back().second;  // (x reached the total width: rounding)
    }
  }
  return 0.0;
}

EnvValues draw_env_params(const EnvParamValues& values, const UniformSource& uniform) {
  EnvValues out;
  for (const auto& [name, value] : values) out.emplace_hint(out.end(), name, draw_env_param(value, uniform));
  return out;
}

nlohmann::json record_env_params(std::int64_t seq, const EnvValues& values, std::optional<double> measure) {
  nlohmann::json drawn = nlohmann::json::object();
  for (const auto& [name, x] : values) drawn[name] = static_cast<double>(x);
  nlohmann::json out = {{"seq", seq}, {"values", std::move(drawn)}};
  if (measure) out["measure"] = static_cast<double>(*measure);
  return out;
}

nlohmann::json RecordEnvParams::to_json() const {
  if (!drawn) return nullptr;
  return record_env_params(drawn->seq, drawn->values, measure);
}

Status check_measure(double value) {
  if (!std::isfinite(value)) return Status(ErrorCode::kNonFiniteValue, "report_measure: the measure is not finite");
  if (std::fabs(value) > kMaxEnvParamMagnitude) {
    return Status(ErrorCode::kNonFiniteValue, "report_measure: the measure's magnitude is beyond 1e300");
  }
  return Status::Ok();
}

}  // namespace tether
