// Client response pairing and the server's handshake state.
#include "tether/session.h"

#include <algorithm>
#include <utility>

#include "json_util.h"

namespace tether {

std::optional<std::string> run_id_of(const nlohmann::json& pong) {
  const std::string* run_id = detail::string_member(pong, "run_id");
  if (run_id == nullptr || run_id->empty()) return std::nullopt;
  return *run_id;
}

bool from_another_run(const std::optional<std::string>& acted_in,
                      const std::optional<std::string>& connected_to) noexcept {
  return acted_in.has_value() && connected_to.has_value() && *acted_in != *connected_to;
}

// -- [1.9] servers in a group (§6.7) ------------------------------------------------------

namespace {

// The longest text read as an address, in code points (as the Python SDK's).
constexpr std::size_t kMaxAddressCodePoints = 300;
// The most "ranks" entries a PONG is read for.
constexpr std::size_t kMaxRankEntries = 1024;

// The code point of UTF-8 text at `at`, advancing `at` past it; a byte that
// does not start a well-formed sequence is one U+FFFD (text a JSON parser
// read is well-formed).
std::uint32_t address_code_point(std::string_view text, std::size_t& at) noexcept {
  const auto c = static_cast<unsigned char>(text[at]);
  std::size_t length =
      c < 0x80u ? 1 : (c & 0xE0u) == 0xC0u ? 2 : (c & 0xF0u) == 0xE0u ? 3 : (c & 0xF8u) == 0xF0u ? 4 : 1;
  if (at + length > text.size()) length = 1;
  for (std::size_t k = 1; k < length; ++k) {
    if ((static_cast<unsigned char>(text[at + k]) & 0xC0u) != 0x80u) length = 1;
  }
  if (length == 1) {
    ++at;
    return c < 0x80u ? c : 0xFFFDu;
  }
  std::uint32_t point = length == 2 ? (c & 0x1Fu) : length == 3 ? (c & 0x0Fu) : (c & 0x07u);
  for (std::size_t k = 1; k < length; ++k) point = (point << 6) | (static_cast<unsigned char>(text[at + k]) & 0x3Fu);
  at += length;
  return point;
}

// Whether code point `c` is whitespace as Python's str.isspace says (§6.7's "whitespace").
bool address_space(std::uint32_t c) noexcept {
  return (c >= 0x09u && c <= 0x0Du) || (c >= 0x1Cu && c <= 0x20u) || c == 0x85u || c == 0xA0u || c == 0x1680u ||
         (c >= 0x2000u && c <= 0x200Au) || c == 0x2028u || c == 0x2029u || c == 0x202Fu || c == 0x205Fu ||
         c == 0x3000u;
}

// Whether `host` holds whitespace.
bool address_has_space(std::string_view host) noexcept {
  for (std::size_t at = 0; at < host.size();) {
    if (address_space(address_code_point(host, at))) return true;
  }
  return false;
}

// The code points of `text`.
std::size_t address_code_points(std::string_view text) noexcept {
  std::size_t count = 0;
  for (std::size_t at = 0; at < text.size(); ++count) address_code_point(text, at);
  return count;
}

}  // namespace

std::optional<Address> parse_address(const nlohmann::json& value) {
  if (!value.is_string()) return std::nullopt;
  const std::string_view text = value.get_ref<const std::string&>();
  if (text.size() > kMaxAddressCodePoints && address_code_points(text) > kMaxAddressCodePoints) return std::nullopt;
  const std::size_t colon = text.rfind(':');
  if (colon == std::string_view::npos) return std::nullopt;
  const std::string_view digits = text.substr(colon + 1);
  if (digits.empty() || digits.size() > 5) return std::nullopt;
  std::uint32_t port = 0;
  for (const char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;  // (ASCII digits only: no sign, no other script's digits)
    port = port * 10 + static_cast<std::uint32_t>(c - '0');
  }
  if (port < 1 || port > 65535) return std::nullopt;
  std::string_view host = text.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);  // an IPv6 address: the brackets are not part of it
    if (host.empty() || host.find_first_of("[]") != std::string_view::npos ||
        host.find(':') == std::string_view::npos) {
      return std::nullopt;
    }
  } else if (host.empty() || host.find_first_of(":[]") != std::string_view::npos) {
    return std::nullopt;
  }
  if (address_has_space(host)) return std::nullopt;
  return Address{std::string(host), static_cast<std::uint16_t>(port)};
}

std::string format_address(const Address& address) {
  const std::string port = std::to_string(address.port);
  if (address.host.find(':') != std::string::npos) return "[" + address.host + "]:" + port;
  return address.host + ":" + port;
}

std::vector<Address> rank_addresses(const nlohmann::json& pong) {
  std::vector<Address> found;
  const nlohmann::json* ranks = detail::member(pong, "ranks");
  if (ranks == nullptr || !ranks->is_array()) return found;
  const std::size_t read = std::min(ranks->size(), kMaxRankEntries);
  for (std::size_t i = 0; i < read; ++i) {
    std::optional<Address> address = parse_address((*ranks)[i]);
    if (address && std::find(found.begin(), found.end(), *address) == found.end()) found.push_back(std::move(*address));
  }
  return found;
}

std::optional<Address> redirect_of(const nlohmann::json& pong, const Address& current, bool redirected) {
  if (redirected) return std::nullopt;  // a client moves at most once per attempt
  const nlohmann::json* redirect = detail::member(pong, "redirect");
  if (redirect == nullptr) return std::nullopt;
  std::optional<Address> target = parse_address(*redirect);
  if (!target || *target == current) return std::nullopt;
  return target;
}

std::vector<Address> reconnect_order(const Address& given, const std::vector<Address>& ranks, const Address& lost) {
  std::vector<Address> candidates;
  candidates.reserve(ranks.size() + 2);
  candidates.push_back(given);
  for (const Address& rank : ranks) {
    if (std::find(candidates.begin(), candidates.end(), rank) == candidates.end()) candidates.push_back(rank);
  }
  auto start = std::find(candidates.begin(), candidates.end(), lost);
  if (start == candidates.end()) {
    candidates.insert(candidates.begin(), lost);
    return candidates;
  }
  std::rotate(candidates.begin(), start, candidates.end());
  return candidates;
}

// -- the client's connection -----------------------------------------------------------------

Status ClientConnection::send(const nlohmann::json& message, std::string& out) {
  return send_body(message, nullptr, out);
}

Status ClientConnection::send(const nlohmann::json& message, std::string_view attachment, std::string& out) {
  return send_body(message, &attachment, out);
}

Status ClientConnection::send_body(const nlohmann::json& message, const std::string_view* attachment,
                                   std::string& out) {
  if (closed()) return Status(ErrorCode::kClosed, "the connection is closed: " + error_.to_string());
  const std::string* type = detail::string_member(message, "type");
  std::optional<MessageType> kind = type ? message_type_from_string(*type) : std::nullopt;
  if (!kind) {
    const nlohmann::json* raw = detail::member(message, "type");
    return Status(ErrorCode::kInvalidArgument,
                  "unknown message type " + (raw ? detail::describe(*raw) : std::string("None")));
  }
  if (!is_request(*kind)) {
    return Status(ErrorCode::kInvalidArgument, "a client cannot send " + std::string(to_string(*kind)));
  }
  Status status = attachment != nullptr ? append_frame(encode_message_with_attachment(message, *attachment), out)
                                        : append_message_frame(message, out);
  if (!status.ok()) return status;
  if (expected_response(*kind)) awaiting_.push_back(*kind);
  return Status::Ok();
}

Status ClientConnection::receive_data(std::string_view data, std::vector<Response>& responses) {
  if (closed()) return error_;
  std::vector<std::string> bodies;
  Status framing = decoder_.feed(data, bodies);
  for (const std::string& body : bodies) {
    Status status = handle_body(body, responses);
    if (!status.ok()) {
      error_ = status;
      return error_;
    }
  }
  if (!framing.ok()) error_ = framing;
  return error_;
}

Status ClientConnection::handle_body(const std::string& body, std::vector<Response>& responses) {
  Result<Message> decoded = decode_message(body);
  if (!decoded.ok()) return decoded.status();
  Message& message = decoded.value();
  // A server sends no attachment (§4.3): bytes after a NUL are ignored, and no
  // view of `body` outlives it in a Response.
  message.attachment.reset();
  if (message.type == MessageType::kError) {
    const std::string* request = detail::string_member(message.body, "request");
    const std::string* code = detail::string_member(message.body, "code");
    const bool connection_level =
        !message.body.contains("request") && code != nullptr && closes_connection(error_code_from_string(*code));
    Response response;
    if (!(request != nullptr && *request == "EPISODES") && !awaiting_.empty() && !connection_level) {
      response.request = awaiting_.front();
      awaiting_.pop_front();
    }
    response.message = std::move(message);
    responses.push_back(std::move(response));
    if (connection_level) {
      // The server closes after this; every outstanding request stays unanswered (§6.5).
      return Status(error_code_from_string(*code), "the server closed the connection: " + *code);
    }
    return Status::Ok();
  }
  if (awaiting_.empty()) {
    return Status(ErrorCode::kNotARequest,
                  "unsolicited " + std::string(to_string(message.type)) + " from server");
  }
  const MessageType request = awaiting_.front();
  const std::optional<MessageType> expected = expected_response(request);
  if (!expected || *expected != message.type) {
    return Status(ErrorCode::kUnknownType, "expected " +
                                               std::string(expected ? to_string(*expected) : "nothing") + " for " +
                                               std::string(to_string(request)) + ", got " +
                                               std::string(to_string(message.type)));
  }
  awaiting_.pop_front();
  responses.push_back(Response{request, std::move(message)});
  return Status::Ok();
}

void ClientConnection::reset() {
  decoder_ = FrameDecoder(decoder_.max_frame_bytes());
  awaiting_.clear();
  error_ = Status::Ok();
}

nlohmann::json ServerEvent::error_message() const {
  nlohmann::json out = {{"type", "ERROR"}, {"code", std::string(to_string(refusal.code()))},
                        {"message", refusal.message()}};
  if (type) out["request"] = std::string(to_string(*type));
  return out;
}

nlohmann::json ServerConnection::pong(std::string_view server_name, std::string_view run_id) {
  nlohmann::json out = {
      {"type", "PONG"}, {"protocol_version", std::string(kProtocolVersion)}, {"server", std::string(server_name)}};
  if (!run_id.empty()) out["run_id"] = std::string(run_id);
  return out;
}

namespace {

// Constant-time comparison of a token (no early exit on the first difference).
bool same_token(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const std::size_t n = a.size() < b.size() ? a.size() : b.size();
  for (std::size_t i = 0; i < n; ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

ServerEvent ServerConnection::handle_body(std::string_view body) {
  ServerEvent event;
  Result<Message> decoded = decode_message(body);
  if (!decoded.ok()) {
    event.refusal = decoded.status();
    return event;
  }
  event.type = decoded.value().type;
  const Message& message = decoded.value();
  if (!is_request(message.type)) {
    event.refusal = Status(ErrorCode::kNotARequest,
                           std::string(to_string(message.type)) + " is a response; a client may only send requests");
    return event;
  }
  if (message.type == MessageType::kPing) {
    if (const nlohmann::json* version = detail::member(message.body, "protocol_version")) {
      if (!version->is_null()) {
        const std::string text = version->is_string() ? version->get_ref<const std::string&>() : detail::dump_json(*version);
        Result<ProtocolVersion> parsed = parse_version(text);
        const int ours = parse_version(kProtocolVersion).value().major;
        if (!parsed.ok()) {
          event.refusal = Status(ErrorCode::kVersionMismatch, "unreadable protocol_version " + detail::describe(*version));
          return event;
        }
        if (parsed.value().major != ours) {
          event.refusal = Status(ErrorCode::kVersionMismatch, "client speaks RLlink " + text + ", this server speaks " +
                                                                  std::string(kProtocolVersion) +
                                                                  " (major versions must match)");
          return event;
        }
      }
    }
    if (!ready_) {
      const nlohmann::json* token = detail::member(message.body, "auth_token");
      if (token == nullptr) {
        event.refusal = Status(ErrorCode::kAuthFailed, "missing auth_token");
        return event;
      }
      if (!token->is_string() || !same_token(token->get_ref<const std::string&>(), *auth_token_)) {
        event.refusal = Status(ErrorCode::kAuthFailed, "wrong auth_token");
        event.closes_connection = true;
        return event;
      }
      ready_ = true;
    }
  } else if (!ready_) {
    event.refusal = Status(ErrorCode::kAuthFailed, std::string(to_string(message.type)) +
                                                       " before authentication: send PING with auth_token first");
    return event;
  }
  event.message = std::move(decoded).value();
  return event;
}

}  // namespace tether
