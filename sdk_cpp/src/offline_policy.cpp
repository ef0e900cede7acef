// Offline policy files (§20): see tether/offline_policy.h.
#include "tether/offline_policy.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>

#include "tether/messages.h"

namespace tether {

namespace {

Status invalid_file(const std::string& what) { return Status(ErrorCode::kInvalidField, what); }

// The member `name` as a `type` message, or the error naming it.
Status take_message(const nlohmann::json& body, const char* name, const char* type, nlohmann::json& out) {
  auto found = body.find(name);
  if (found == body.end() || !found->is_object()) {
    return invalid_file(std::string(name) + " is missing or not a JSON object");
  }
  auto kind = found->find("type");
  if (kind == found->end() || !kind->is_string() || kind->get_ref<const std::string&>() != type) {
    return invalid_file(std::string(name) + " is not a " + type + " message (type " +
                   (kind == found->end() ? std::string("missing") : kind->dump()) + ")");
  }
  out = *found;
  return Status::Ok();
}

}  // namespace

Result<OfflinePolicy> parse_offline_policy(std::string_view text) {
  Result<nlohmann::json> parsed = parse_json(text);
  if (!parsed.ok()) return Status(ErrorCode::kInvalidJson, "not JSON: " + parsed.status().message());
  const nlohmann::json& body = parsed.value();
  if (!body.is_object()) return invalid_file("not a JSON object");
  auto format = body.find("format");
  if (format == body.end() || !format->is_string() || format->get_ref<const std::string&>() != kOfflinePolicyFormat) {
    return invalid_file("format is " + (format == body.end() ? std::string("missing") : format->dump()) + ", not \"" +
                   kOfflinePolicyFormat + "\": not an offline policy file");
  }
  auto version = body.find("version");
  if (version == body.end() || !version->is_number_integer() || version->get<long long>() != kOfflinePolicyVersion) {
    return invalid_file("version " + (version == body.end() ? std::string("missing") : version->dump()) +
                   " is not supported (this reader takes " + std::to_string(kOfflinePolicyVersion) + ")");
  }
  OfflinePolicy policy;
  Status taken = take_message(body, "pong", "PONG", policy.pong);
  if (taken.ok()) taken = take_message(body, "config", "SET_CONFIG", policy.config);
  if (taken.ok()) taken = take_message(body, "state", "SET_STATE", policy.state);
  if (!taken.ok()) return taken;
  return policy;
}

Result<OfflinePolicy> read_offline_policy(const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) {
    return Status(ErrorCode::kInvalidArgument,
                  "offline policy '" + path + "': cannot be read: " + std::strerror(errno));
  }
  std::string text;
  char buffer[65536];
  std::size_t got = 0;
  while ((got = std::fread(buffer, 1, sizeof buffer, file)) > 0) text.append(buffer, got);
  const bool failed = std::ferror(file) != 0;
  std::fclose(file);
  if (failed) return Status(ErrorCode::kInvalidArgument, "offline policy '" + path + "': cannot be read");
  Result<OfflinePolicy> policy = parse_offline_policy(text);
  if (!policy.ok()) return Status(policy.status().code(), "offline policy '" + path + "': " + policy.status().message());
  return policy;
}

}  // namespace tether
