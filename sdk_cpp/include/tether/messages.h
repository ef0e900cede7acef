// RLlink message types, the decoding of a frame body into a message
// (docs/protocol.md §4.2), the requests a client sends (§7) and ERROR (§7.9).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "tether/status.h"

namespace tether {

/// The protocol version this implementation speaks.
inline constexpr std::string_view kProtocolVersion = "1.9";

/// Every message type of RLlink v1 plus Tether's extensions.
enum class MessageType {
  // Requests: client -> server.
  kPing,
  kGetConfig,
  kGetState,
  kEpisodes,
  kEpisodesAndGetState,
  kMapAgents,
  // Responses: server -> client.
  kPong,
  kSetConfig,
  kSetState,
  kAgentModules,
  kError,
};

/// The wire spelling ("EPISODES_AND_GET_STATE").
std::string_view to_string(MessageType type) noexcept;
/// The type with this exact (case-sensitive) spelling, if any.
std::optional<MessageType> message_type_from_string(std::string_view name) noexcept;
/// Whether a client may send this type.
bool is_request(MessageType type) noexcept;
/// The response a request expects; std::nullopt for EPISODES (and for responses).
std::optional<MessageType> expected_response(MessageType request) noexcept;

/// A decoded message: its type and the whole JSON object (type included).
struct Message {
  MessageType type = MessageType::kPing;  ///< the "type" field
  nlohmann::json body;                    ///< the message object as received
  /// [1.4] The body's binary attachment (§4.3): the bytes after its first NUL,
  /// possibly none; std::nullopt when the body has no NUL. A view into the
  /// body given to decode_message, valid only as long as that body is. Tensor
  /// objects of EPISODES(_AND_GET_STATE) refer to it (validate_episodes);
  /// every other request ignores it.
  std::optional<std::string_view> attachment;
};

/// [1.4] A body split at its first NUL byte (§4.3): the JSON text, and the
/// attachment after the NUL (std::nullopt when there is no NUL). Both are
/// views into the body.
struct BodyParts {
  std::string_view json;                       ///< the JSON text (the whole body without a NUL)
  std::optional<std::string_view> attachment;  ///< the bytes after the NUL, possibly empty
};

/// Splits a body at its first NUL byte: JSON text never holds a raw NUL
/// (RFC 8259 escapes control characters), so the first one ends it (§4.3).
BodyParts split_body(std::string_view body) noexcept;

/// Parses a frame body into a message. The checks of §4.2 apply to the JSON
/// text before the first NUL byte only; the bytes after it are the
/// attachment (§4.3), never checked as UTF-8 or JSON. Codes: INVALID_UTF8,
/// INVALID_JSON (NaN/Infinity tokens and numbers too large for a double are
/// accepted and read as non-finite numbers, so a validator reports
/// NON_FINITE_VALUE, as the Python core does), NOT_AN_OBJECT, MISSING_TYPE,
/// UNKNOWN_TYPE. The message's attachment is a view into `body`.
Result<Message> decode_message(std::string_view body);

/// Parses JSON text the way decode_message does (UTF-8 check, non-finite
/// tokens); any JSON value, not only an object.
Result<nlohmann::json> parse_json(std::string_view text);

/// Whether `text` is well-formed UTF-8 (no overlongs, surrogates or values above U+10FFFF).
bool is_valid_utf8(std::string_view text) noexcept;

/// The offset of the first byte that makes `text` invalid UTF-8, or
/// std::string_view::npos when it is valid.
std::size_t first_invalid_utf8(std::string_view text) noexcept;

/// The deepest nesting of arrays and objects parse_json accepts. A body
/// nested deeper is refused (INVALID_JSON) before it is parsed: nested values
/// are walked recursively when they are described or dumped.
inline constexpr std::size_t kMaxJsonDepth = 64;

/// Serialises a message body (never throws; invalid UTF-8 is replaced).
std::string encode_message(const nlohmann::json& message);

/// Serialises a message and frames it, appending to `out`.
Status append_message_frame(const nlohmann::json& message, std::string& out);

/// [1.4] A request body with a binary attachment (§4.3): the message's JSON,
/// a NUL byte, then `attachment` (which may be empty). Send it only to a
/// server whose PONG announced 1.4 or later.
std::string encode_message_with_attachment(const nlohmann::json& message, std::string_view attachment);

/// A "MAJOR.MINOR" protocol version.
struct ProtocolVersion {
  int major = 0;  ///< must match the peer's
  int minor = 0;  ///< features, §7.12
};

/// Splits "MAJOR.MINOR" (or "MAJOR", "MAJOR.MINOR.PATCH") into numbers;
/// INVALID_ARGUMENT when malformed.
Result<ProtocolVersion> parse_version(std::string_view text);

/// Fields of a client's PING (§7.1); empty ones are left out.
struct PingOptions {
  std::string protocol_version = std::string(kProtocolVersion);  ///< "" to omit (a plain v1 PING)
  std::string client_name;                                        ///< free text for the server's logs
  std::optional<std::string> auth_token;                          ///< the shared secret
};

/// PING (§7.1).
nlohmann::json make_ping(const PingOptions& options = PingOptions());
/// GET_CONFIG (§7.3).
nlohmann::json make_get_config();
/// GET_STATE (§7.5), with the version the client holds if any.
nlohmann::json make_get_state(std::optional<std::int64_t> weights_seq_no = std::nullopt);
/// GET_STATE in the per-module form (§7.5): the version of each module held.
nlohmann::json make_get_state(const std::map<std::string, std::int64_t>& weights_seq_nos);

/// The optional batch fields of EPISODES(_AND_GET_STATE) (§7.7).
struct BatchInfo {
  std::optional<std::string> client_session;                      ///< 1-128 chars, with batch_seq
  std::optional<std::int64_t> batch_seq;                          ///< >= 1, with client_session
  std::optional<std::int64_t> env_steps;                          ///< env steps accounted for
  std::optional<std::int64_t> agent_steps;                        ///< agent steps in the records
  std::optional<std::int64_t> weights_seq_no;                     ///< default module's version
  std::optional<std::map<std::string, std::int64_t>> weights_seq_nos;  ///< per-module versions
};

/// EPISODES, or EPISODES_AND_GET_STATE when `get_state`; `episodes` must be
/// a JSON array of records; INVALID_ARGUMENT for bad batch fields.
Result<nlohmann::json> make_episodes(nlohmann::json episodes, const BatchInfo& batch, bool get_state);

/// MAP_AGENTS (§7.10).
nlohmann::json make_map_agents(const std::string& episode_id, const std::vector<std::string>& agent_ids);

/// A received ERROR (§7.9).
struct ServerError {
  ErrorCode code = ErrorCode::kUnknownServerCode;  ///< kUnknownServerCode for a code this SDK does not know
  std::string code_name;                           ///< the code as sent
  std::string message;                             ///< the server's explanation
  std::optional<std::string> request;              ///< the refused request's type, when named
  /// Whether the server closes the connection after this ERROR (§14 "Closes").
  bool closes_connection() const noexcept;
  /// A Status carrying the code and "REQUEST refused: CODE: message".
  Status to_status() const;
};

/// Reads an ERROR message's fields (missing ones default as the Python core:
/// code INTERNAL, message ""); INVALID_ARGUMENT if `message` is not an ERROR.
Result<ServerError> decode_error(const Message& message);

/// Whether an ERROR code closes the connection (BAD_HEADER, FRAME_TOO_LARGE,
/// TOO_MANY_CONNECTIONS, HANDSHAKE_TIMEOUT, CLIENT_TIMEOUT, SERVER_OVERLOADED,
/// AUTH_THROTTLED, TRAINING_DONE).
bool closes_connection(ErrorCode code) noexcept;

/// The run's totals that come with the unsolicited ERROR TRAINING_DONE
/// (protocol 1.3, §6.6 "End of training"): the server's run is done and it
/// stopped. A member the server left out, or sent as another kind of value,
/// reads as "" (reason), 0 (the integers; a negative one too, one above
/// INT64_MAX as INT64_MAX) or none (return_mean); `json` holds the summary as
/// sent, members this SDK does not name included.
struct TrainingSummary {
  std::string reason;                   ///< "stop_at_return", "max_env_steps", or another a server documents
  std::int64_t env_steps = 0;           ///< env steps the server counted over the run
  std::int64_t agent_steps = 0;         ///< agent steps it counted
  std::int64_t agent_steps_trained = 0; ///< agent steps the learner trained on
  std::int64_t updates = 0;             ///< learner updates made
  std::int64_t episodes = 0;            ///< episodes that finished
  std::int64_t weights_seq_no = 0;      ///< the last weights version published
  std::optional<double> return_mean;    ///< the windowed mean episode return; none when no episode finished
  nlohmann::json json = nlohmann::json::object();  ///< the summary object as sent ({} when the ERROR had none)

  /// Reads an ERROR TRAINING_DONE's "summary" (anything but an object reads as {}); never fails.
  static TrainingSummary from_json(const nlohmann::json& summary);
};

/// Whether `message` is the unsolicited, connection-level ERROR TRAINING_DONE
/// (code "TRAINING_DONE" and no "request", §5.3, §6.6).
bool is_training_done(const Message& message) noexcept;

}  // namespace tether
