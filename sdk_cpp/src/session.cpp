// Client response pairing and the server's handshake state.
#include "tether/session.h"

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
