// Internal helpers for reading nlohmann::json without exceptions: every
// accessor checks the type first (with JSON_NOEXCEPTION a type error aborts).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace tether {
namespace detail {

/// Serialises without ever throwing: invalid UTF-8 in strings is replaced.
inline std::string dump_json(const nlohmann::json& value) {
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

/// True for a JSON integer (signed or unsigned), never for a boolean or float.
inline bool is_integer(const nlohmann::json& value) { return value.is_number_integer(); }

/// The integer value of a JSON integer as int64 (clamped for huge unsigned values).
inline std::int64_t as_int64(const nlohmann::json& value) {
  if (value.is_number_unsigned()) {
    const auto u = value.get<std::uint64_t>();
    return u > static_cast<std::uint64_t>(INT64_MAX) ? INT64_MAX : static_cast<std::int64_t>(u);
  }
  if (value.is_number_integer()) return value.get<std::int64_t>();
  return 0;
}

/// A JSON number as double (0 for anything else).
inline double as_double(const nlohmann::json& value) {
  return value.is_number() ? value.get<double>() : 0.0;
}

/// The member `key` of an object, or nullptr when absent or not an object.
inline const nlohmann::json* member(const nlohmann::json& object, std::string_view key) {
  if (!object.is_object()) return nullptr;
  auto it = object.find(key);
  return it == object.end() ? nullptr : &*it;
}

/// The string member `key`, or nullptr when absent or not a string.
inline const std::string* string_member(const nlohmann::json& object, std::string_view key) {
  const nlohmann::json* value = member(object, key);
  return value != nullptr && value->is_string() ? &value->get_ref<const std::string&>() : nullptr;
}

/// A short description of a received value for an error message.
inline std::string describe(const nlohmann::json& value) {
  std::string text = dump_json(value);
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return text;
}

}  // namespace detail
}  // namespace tether
