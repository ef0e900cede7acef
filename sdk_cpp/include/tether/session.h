// Sans-I/O RLlink connections (docs/protocol.md §5, §6): bytes in, messages
// out. ClientConnection is what a client holds: it encodes requests, keeps
// the FIFO of requests awaiting a response and pairs each response with its
// request (§5.3). ServerConnection is the server's per-connection handshake
// state (§6.2, §6.3), small enough for a test double of a server. run_id_of
// and from_another_run are the [1.8] rule by which a client tells whether a
// reconnect reached another server run (§6.5, §7.2).
#pragma once

#include <cstddef>
#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "tether/framing.h"
#include "tether/messages.h"
#include "tether/status.h"

namespace tether {

/// [1.8] The server run a PONG names (§7.2): its "run_id" when that is a
/// non-empty string; none otherwise (an older server that names no run, or a
/// value that is not a non-empty string, which counts as absent).
std::optional<std::string> run_id_of(const nlohmann::json& pong);

/// [1.8] Whether steps acted with weights whose versions were learned on a
/// connection to run `acted_in` were acted with another run's weights than
/// those of run `connected_to` (§6.5): only when both runs are named and
/// differ (compared exactly, byte for byte). Such steps' weights versions name
/// other weights in the run now connected to (a new run counts from 0 again,
/// §13.1): they are dropped, not sent. When either run is unnamed the client
/// cannot tell, and sends them (the rules of 1.7).
bool from_another_run(const std::optional<std::string>& acted_in,
                      const std::optional<std::string>& connected_to) noexcept;

/// A received message and the request it answers.
struct Response {
  /// The request this answers; std::nullopt for an ERROR that answers none
  /// (one for EPISODES, one when nothing is outstanding, or a
  /// connection-level ERROR after which the server closes).
  std::optional<MessageType> request;
  Message message;  ///< the response itself
};

/// The client's side of one connection.
///
/// A server protocol violation (§5.4: a framing error, a body that is not a
/// message, an unsolicited response or one of the wrong type) and a
/// connection-level ERROR (§5.3) close the connection: closed() is true,
/// error() says why, and the caller stops using the connection (reconnect
/// and call reset()). The ERROR itself is still delivered as a Response.
class ClientConnection {
 public:
  /// A connection refusing frames over `max_frame_bytes`.
  explicit ClientConnection(std::size_t max_frame_bytes = kDefaultMaxFrameBytes) : decoder_(max_frame_bytes) {}

  /// Encodes a request and appends its frame to `out`, remembering the
  /// response it expects. INVALID_ARGUMENT for a non-request (nothing
  /// appended); CLOSED after the connection closed.
  Status send(const nlohmann::json& message, std::string& out);
  /// send() of a request body with a binary attachment (protocol 1.4, §4.3):
  /// the JSON, a NUL byte, then `attachment`. Only to a server of 1.4 or later.
  Status send(const nlohmann::json& message, std::string_view attachment, std::string& out);

  /// Feeds received bytes; appends each complete response, paired with its
  /// request, to `responses`. Returns the violation or closing error (the
  /// responses before it are still appended); sticky afterwards.
  Status receive_data(std::string_view data, std::vector<Response>& responses);

  /// Whether a response is still awaited.
  bool awaiting_response() const noexcept { return !awaiting_.empty(); }
  /// The requests awaiting a response, oldest first.
  const std::deque<MessageType>& outstanding() const noexcept { return awaiting_; }
  /// Whether the connection must no longer be used.
  bool closed() const noexcept { return !error_.ok(); }
  /// Why it closed (ok while open).
  const Status& error() const noexcept { return error_; }
  /// Forgets partial bytes, pending requests and the error (after a reconnect).
  void reset();

 private:
  Status send_body(const nlohmann::json& message, const std::string_view* attachment, std::string& out);
  Status handle_body(const std::string& body, std::vector<Response>& responses);

  FrameDecoder decoder_;
  std::deque<MessageType> awaiting_;
  Status error_;
};

/// What a server does with one received body.
struct ServerEvent {
  std::optional<MessageType> type;  ///< the message's type, when it could be read
  Message message;                  ///< the request (when accepted); its attachment views the body handled
  Status refusal;                   ///< ok for an accepted request; else the ERROR code and text
  bool closes_connection = false;   ///< the server closes after sending the refusal (a wrong token)
  /// Whether the request was accepted.
  bool accepted() const noexcept { return refusal.ok(); }
  /// The ERROR message for a refusal ("request" names the type when known).
  nlohmann::json error_message() const;
};

/// A server's handshake state for one connection (§6.2): without a token it
/// starts READY; with one it refuses everything but a PING with the right
/// token (AUTH_FAILED), and a wrong token closes the connection.
class ServerConnection {
 public:
  /// A connection for a server with `auth_token` (none: no authentication).
  explicit ServerConnection(std::optional<std::string> auth_token = std::nullopt)
      : auth_token_(std::move(auth_token)), ready_(!auth_token_.has_value()) {}

  /// Classifies one frame body: a request to serve, or a refusal (§6.3).
  /// The event's message.attachment is a view into `body` (§4.3).
  ServerEvent handle_body(std::string_view body);
  /// Whether the client has authenticated (or no token is needed).
  bool ready() const noexcept { return ready_; }
  /// The PONG this server sends; [1.8] naming the server run `run_id` (§7.2)
  /// when it is not empty.
  static nlohmann::json pong(std::string_view server_name = "tether", std::string_view run_id = {});

 private:
  std::optional<std::string> auth_token_;
  bool ready_;
};

}  // namespace tether
