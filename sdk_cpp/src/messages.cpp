// Message types, body decoding, request builders and ERROR decoding.
#include "tether/messages.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <utility>

#include "json_util.h"
#include "tether/framing.h"

namespace tether {
namespace {

constexpr std::array<std::pair<MessageType, std::string_view>, 11> kTypeNames{{
    {MessageType::kPing, "PING"},
    {MessageType::kGetConfig, "GET_CONFIG"},
    {MessageType::kGetState, "GET_STATE"},
    {MessageType::kEpisodes, "EPISODES"},
    {MessageType::kEpisodesAndGetState, "EPISODES_AND_GET_STATE"},
    {MessageType::kMapAgents, "MAP_AGENTS"},
    {MessageType::kPong, "PONG"},
    {MessageType::kSetConfig, "SET_CONFIG"},
    {MessageType::kSetState, "SET_STATE"},
    {MessageType::kAgentModules, "AGENT_MODULES"},
    {MessageType::kError, "ERROR"},
}};

// Sentinels the slow path writes for tokens strict JSON lacks; the parser
// callback turns them back into numbers. A control character starts each, so
// a sender would have to escape it on purpose to collide.
constexpr std::string_view kNanSentinel = "\x01tether:nan";
constexpr std::string_view kPosInfSentinel = "\x01tether:+inf";
constexpr std::string_view kNegInfSentinel = "\x01tether:-inf";

bool starts_with(std::string_view text, std::size_t pos, std::string_view word) {
  return text.substr(pos, word.size()) == word;
}

void append_sentinel(std::string& out, std::string_view sentinel) {
  out += "\"\\u0001";
  out.append(sentinel.substr(1));
  out += '"';
}

// Rewrites NaN / Infinity / -Infinity tokens and numbers beyond a double's
// range (outside strings) into sentinel strings, as Python's json module
// reads them (as non-finite floats) where strict JSON refuses them.
std::string rewrite_non_finite(std::string_view text) {
  std::string out;
  out.reserve(text.size() + 32);
  bool in_string = false;
  for (std::size_t i = 0; i < text.size();) {
    const char c = text[i];
    if (in_string) {
      out += c;
      if (c == '\\' && i + 1 < text.size()) {
        out += text[i + 1];
        i += 2;
        continue;
      }
      if (c == '"') in_string = false;
      ++i;
      continue;
    }
    if (c == '"') {
      in_string = true;
      out += c;
      ++i;
    } else if (starts_with(text, i, "NaN")) {
      append_sentinel(out, kNanSentinel);
      i += 3;
    } else if (starts_with(text, i, "Infinity")) {
      append_sentinel(out, kPosInfSentinel);
      i += 8;
    } else if (starts_with(text, i, "-Infinity")) {
      append_sentinel(out, kNegInfSentinel);
      i += 9;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      std::size_t end = i + 1;
      while (end < text.size() && (std::isdigit(static_cast<unsigned char>(text[end])) || text[end] == '.' ||
                                   text[end] == 'e' || text[end] == 'E' || text[end] == '+' || text[end] == '-')) {
        ++end;
      }
      const std::string token(text.substr(i, end - i));
      errno = 0;
      char* parsed_end = nullptr;
      const double value = std::strtod(token.c_str(), &parsed_end);
      if (errno == ERANGE && std::isinf(value)) {
        append_sentinel(out, value > 0 ? kPosInfSentinel : kNegInfSentinel);
      } else if (errno == ERANGE && parsed_end == token.c_str() + token.size()) {
        out += value < 0 ? "-0.0" : "0.0";  // underflow: Python reads 0.0
      } else {
        out += token;
      }
      i = end;
    } else {
      out += c;
      ++i;
    }
  }
  return out;
}

}  // namespace

std::string_view to_string(MessageType type) noexcept {
  for (const auto& entry : kTypeNames) {
    if (entry.first == type) return entry.second;
  }
  return "UNKNOWN";
}

std::optional<MessageType> message_type_from_string(std::string_view name) noexcept {
  for (const auto& entry : kTypeNames) {
    if (entry.second == name) return entry.first;
  }
  return std::nullopt;
}

bool is_request(MessageType type) noexcept {
  switch (type) {
    case MessageType::kPing:
    case MessageType::kGetConfig:
    case MessageType::kGetState:
    case MessageType::kEpisodes:
    case MessageType::kEpisodesAndGetState:
    case MessageType::kMapAgents:
      return true;
    default:
      return false;
  }
}

std::optional<MessageType> expected_response(MessageType request) noexcept {
  switch (request) {
    case MessageType::kPing:
      return MessageType::kPong;
    case MessageType::kGetConfig:
      return MessageType::kSetConfig;
    case MessageType::kGetState:
    case MessageType::kEpisodesAndGetState:
      return MessageType::kSetState;
    case MessageType::kMapAgents:
      return MessageType::kAgentModules;
    default:
      return std::nullopt;
  }
}

std::size_t first_invalid_utf8(std::string_view text) noexcept {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const std::size_t n = text.size();
  std::size_t i = 0;
  while (i < n) {
    const unsigned char c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    std::size_t len = 0;
    std::uint32_t cp = 0;
    if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return i;
    }
    if (i + len > n) return i;
    for (std::size_t k = 1; k < len; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000)) return i;
    if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += len;
  }
  return std::string_view::npos;
}

bool is_valid_utf8(std::string_view text) noexcept { return first_invalid_utf8(text) == std::string_view::npos; }

namespace {

// The deepest nesting of [ and { outside strings (one pass, no parse).
std::size_t nesting_depth(std::string_view text) noexcept {
  std::size_t depth = 0;
  std::size_t deepest = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character cannot end the string
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

}  // namespace

Result<nlohmann::json> parse_json(std::string_view text) {
  const std::size_t invalid_at = first_invalid_utf8(text);
  if (invalid_at != std::string_view::npos) {
    return Result<nlohmann::json>(ErrorCode::kInvalidUtf8,
                                  "body is not valid UTF-8 (at byte " + std::to_string(invalid_at) + ")");
  }
  const std::size_t depth = nesting_depth(text);
  if (depth > kMaxJsonDepth) {
    return Result<nlohmann::json>(ErrorCode::kInvalidJson, "body nests arrays and objects " + std::to_string(depth) +
                                                               " deep; at most " + std::to_string(kMaxJsonDepth) +
                                                               " levels are accepted");
  }
  nlohmann::json value = nlohmann::json::parse(text, nullptr, false);
  if (!value.is_discarded()) return value;
  const std::string rewritten = rewrite_non_finite(text);
  auto restore = [](int /*depth*/, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    if (event == nlohmann::json::parse_event_t::value && parsed.is_string()) {
      const std::string& s = parsed.get_ref<const std::string&>();
      if (s == kNanSentinel) {
        parsed = std::numeric_limits<double>::quiet_NaN();
      } else if (s == kPosInfSentinel) {
        parsed = std::numeric_limits<double>::infinity();
      } else if (s == kNegInfSentinel) {
        parsed = -std::numeric_limits<double>::infinity();
      }
    }
    return true;
  };
  value = nlohmann::json::parse(rewritten, restore, false);
  if (value.is_discarded()) {
    return Result<nlohmann::json>(ErrorCode::kInvalidJson, "body is not valid JSON");
  }
  return value;
}

BodyParts split_body(std::string_view body) noexcept {
  BodyParts parts;
  const std::size_t nul = body.find('\0');
  if (nul == std::string_view::npos) {
    parts.json = body;
  } else {
    parts.json = body.substr(0, nul);
    parts.attachment = body.substr(nul + 1);
  }
  return parts;
}

Result<Message> decode_message(std::string_view body) {
  const BodyParts parts = split_body(body);
  Result<nlohmann::json> parsed = parse_json(parts.json);
  if (!parsed.ok()) return parsed.status();
  nlohmann::json& value = parsed.value();
  if (!value.is_object()) {
    return Result<Message>(ErrorCode::kNotAnObject,
                           std::string("body must be a JSON object, got ") + value.type_name());
  }
  const nlohmann::json* type = detail::member(value, "type");
  if (type == nullptr) return Result<Message>(ErrorCode::kMissingType, "message has no \"type\" field");
  std::optional<MessageType> kind;
  if (type->is_string()) kind = message_type_from_string(type->get_ref<const std::string&>());
  if (!kind) {
    return Result<Message>(ErrorCode::kUnknownType, "unknown message type " + detail::describe(*type));
  }
  Message message;
  message.type = *kind;
  message.body = std::move(value);
  message.attachment = parts.attachment;
  return message;
}

std::string encode_message(const nlohmann::json& message) { return detail::dump_json(message); }

std::string encode_message_with_attachment(const nlohmann::json& message, std::string_view attachment) {
  std::string body = detail::dump_json(message);
  body.reserve(body.size() + 1 + attachment.size());
  body += '\0';
  body.append(attachment.data(), attachment.size());
  return body;
}

Status append_message_frame(const nlohmann::json& message, std::string& out) {
  return append_frame(encode_message(message), out);
}

Result<ProtocolVersion> parse_version(std::string_view text) {
  int parts[3] = {0, 0, 0};
  int count = 0;
  std::size_t start = 0;
  while (true) {
    const std::size_t dot = text.find('.', start);
    const std::string_view part = text.substr(start, dot == std::string_view::npos ? text.npos : dot - start);
    if (count == 3 || part.empty() || part.size() > 9) {
      return Result<ProtocolVersion>(ErrorCode::kInvalidArgument, "not a version: '" + std::string(text) + "'");
    }
    int value = 0;
    for (char c : part) {
      if (c < '0' || c > '9') {
        return Result<ProtocolVersion>(ErrorCode::kInvalidArgument, "not a version: '" + std::string(text) + "'");
      }
      value = value * 10 + (c - '0');
    }
    parts[count++] = value;
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  return ProtocolVersion{parts[0], parts[1]};
}

nlohmann::json make_ping(const PingOptions& options) {
  nlohmann::json message = {{"type", "PING"}};
  if (!options.protocol_version.empty()) message["protocol_version"] = options.protocol_version;
  if (!options.client_name.empty()) message["client_name"] = options.client_name;
  if (options.auth_token) message["auth_token"] = *options.auth_token;
  return message;
}

nlohmann::json make_get_config() { return {{"type", "GET_CONFIG"}}; }

nlohmann::json make_get_state(std::optional<std::int64_t> weights_seq_no) {
  nlohmann::json message = {{"type", "GET_STATE"}};
  if (weights_seq_no) message["weights_seq_no"] = *weights_seq_no;
  return message;
}

nlohmann::json make_get_state(const std::map<std::string, std::int64_t>& weights_seq_nos) {
  nlohmann::json seqs = nlohmann::json::object();
  for (const auto& [module, seq] : weights_seq_nos) seqs[module] = seq;
  return {{"type", "GET_STATE"}, {"weights_seq_nos", std::move(seqs)}};
}

Result<nlohmann::json> make_episodes(nlohmann::json episodes, const BatchInfo& batch, bool get_state) {
  if (!episodes.is_array()) {
    return Result<nlohmann::json>(ErrorCode::kInvalidArgument, "\"episodes\" must be a JSON array of records");
  }
  if (batch.client_session.has_value() != batch.batch_seq.has_value()) {
    return Result<nlohmann::json>(ErrorCode::kInvalidArgument,
                                  "client_session and batch_seq go together: give both or neither");
  }
  if (batch.client_session && (batch.client_session->empty() || batch.client_session->size() > 128)) {
    return Result<nlohmann::json>(ErrorCode::kInvalidArgument, "client_session must have 1 to 128 characters");
  }
  if (batch.batch_seq && *batch.batch_seq < 1) {
    return Result<nlohmann::json>(ErrorCode::kInvalidArgument, "batch_seq must be >= 1");
  }
  nlohmann::json message = {{"type", get_state ? "EPISODES_AND_GET_STATE" : "EPISODES"},
                            {"episodes", std::move(episodes)}};
  if (batch.env_steps) message["env_steps"] = *batch.env_steps;
  if (batch.agent_steps) message["agent_steps"] = *batch.agent_steps;
  if (batch.weights_seq_no) message["weights_seq_no"] = *batch.weights_seq_no;
  if (batch.weights_seq_nos) {
    nlohmann::json seqs = nlohmann::json::object();
    for (const auto& [module, seq] : *batch.weights_seq_nos) seqs[module] = seq;
    message["weights_seq_nos"] = std::move(seqs);
  }
  if (batch.client_session) {
    message["client_session"] = *batch.client_session;
    message["batch_seq"] = *batch.batch_seq;
  }
  return message;
}

nlohmann::json make_map_agents(const std::string& episode_id, const std::vector<std::string>& agent_ids) {
  nlohmann::json ids = nlohmann::json::array();
  for (const auto& id : agent_ids) ids.push_back(id);
  return {{"type", "MAP_AGENTS"}, {"episode_id", episode_id}, {"agent_ids", std::move(ids)}};
}

bool closes_connection(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::kBadHeader:
    case ErrorCode::kFrameTooLarge:
    case ErrorCode::kTooManyConnections:
    case ErrorCode::kHandshakeTimeout:
    case ErrorCode::kClientTimeout:
    case ErrorCode::kServerOverloaded:
    case ErrorCode::kAuthThrottled:
    case ErrorCode::kTrainingDone:
      return true;
    default:
      return false;
  }
}

namespace {

// A summary's integer member (§6.6: integers >= 0): 0 when absent, not an
// integer or negative; one above INT64_MAX reads as INT64_MAX.
std::int64_t summary_count(const nlohmann::json& summary, const char* key) {
  auto it = summary.find(key);
  if (it == summary.end() || !it->is_number_integer()) return 0;
  if (it->is_number_unsigned()) {
    const std::uint64_t value = it->get<std::uint64_t>();
    const auto most = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
    return static_cast<std::int64_t>(value > most ? most : value);
  }
  const std::int64_t value = it->get<std::int64_t>();
  return value < 0 ? 0 : value;
}

}  // namespace

TrainingSummary TrainingSummary::from_json(const nlohmann::json& summary) {
  TrainingSummary out;
  if (!summary.is_object()) return out;
  out.json = summary;
  if (const std::string* reason = detail::string_member(summary, "reason")) out.reason = *reason;
  out.env_steps = summary_count(summary, "env_steps");
  out.agent_steps = summary_count(summary, "agent_steps");
  out.agent_steps_trained = summary_count(summary, "agent_steps_trained");
  out.updates = summary_count(summary, "updates");
  out.episodes = summary_count(summary, "episodes");
  out.weights_seq_no = summary_count(summary, "weights_seq_no");
  auto mean = summary.find("return_mean");
  if (mean != summary.end() && mean->is_number()) {
    const double value = mean->get<double>();
    if (std::isfinite(value)) out.return_mean = value;
  }
  return out;
}

bool is_training_done(const Message& message) noexcept {
  if (message.type != MessageType::kError || !message.body.is_object()) return false;
  if (message.body.contains("request")) return false;
  const std::string* code = detail::string_member(message.body, "code");
  return code != nullptr && *code == "TRAINING_DONE";
}

bool ServerError::closes_connection() const noexcept { return tether::closes_connection(code); }

Status ServerError::to_status() const {
  std::string text = "server refused ";
  text += request ? *request : std::string("request");
  text += ": " + code_name + ": " + message;
  return Status(code, std::move(text));
}

Result<ServerError> decode_error(const Message& message) {
  if (message.type != MessageType::kError) {
    return Result<ServerError>(ErrorCode::kInvalidArgument,
                               std::string("not an ERROR message: ") + std::string(to_string(message.type)));
  }
  ServerError error;
  const nlohmann::json* code = detail::member(message.body, "code");
  if (code == nullptr) {
    error.code_name = "INTERNAL";
  } else if (code->is_string()) {
    error.code_name = code->get_ref<const std::string&>();
  } else {
    error.code_name = detail::dump_json(*code);
  }
  error.code = error_code_from_string(error.code_name);
  const nlohmann::json* text = detail::member(message.body, "message");
  if (text != nullptr) error.message = text->is_string() ? text->get_ref<const std::string&>() : detail::dump_json(*text);
  if (const std::string* request = detail::string_member(message.body, "request")) error.request = *request;
  return error;
}

}  // namespace tether
