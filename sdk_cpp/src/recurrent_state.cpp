// Parsing a module's "recurrent_state" (protocol 1.5, §9.1): the refusal
// rules every SDK applies locally (INVALID_FIELD), as the conformance
// vectors (tests/conformance/recurrent.json, kind "module") give them.
#include "tether/recurrent_state.h"

#include <set>

#include "json_util.h"

namespace tether {

Result<std::vector<RecurrentStateSpec>> recurrent_state_from_json(const nlohmann::json* value,
                                                                  const std::string& where) {
  std::vector<RecurrentStateSpec> out;
  if (value == nullptr || value->is_null()) return out;
  const std::string prefix = where + ": recurrent_state ";
  if (!value->is_array() || value->empty()) {
    return Status(ErrorCode::kInvalidField, prefix + "must be a non-empty array of state objects");
  }
  std::set<std::string> names;
  for (const nlohmann::json& item : *value) {
    const std::string* input = item.is_object() ? detail::string_member(item, "input") : nullptr;
    const std::string* output = item.is_object() ? detail::string_member(item, "output") : nullptr;
    if (input == nullptr || output == nullptr || input->empty() || output->empty()) {
      return Status(ErrorCode::kInvalidField, prefix + "entries need non-empty string \"input\" and \"output\" names");
    }
    const nlohmann::json* size = detail::member(item, "size");
    // (a boolean is no integer; nor is 3.5 or 3.0)
    if (size == nullptr || !detail::is_integer(*size) || detail::as_int64(*size) < 1 ||
        detail::as_int64(*size) > static_cast<std::int64_t>(kMaxRecurrentStateSize)) {
      return Status(ErrorCode::kInvalidField, prefix + "sizes must be integers from 1 to " +
                                                  std::to_string(kMaxRecurrentStateSize));
    }
    for (const std::string* name : {input, output}) {
      if (!names.insert(*name).second) {
        return Status(ErrorCode::kInvalidField, prefix + "uses the name '" + *name + "' twice");
      }
    }
    out.push_back({*input, *output, static_cast<std::size_t>(detail::as_int64(*size))});
    if (out.back().size != out.front().size) {
      return Status(ErrorCode::kInvalidField, prefix + "entries must all have one size");
    }
  }
  return out;
}

}  // namespace tether
