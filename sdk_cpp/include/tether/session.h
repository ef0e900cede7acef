// Sans-I/O RLlink connections (docs/protocol.md §5, §6): bytes in, messages
// out. ClientConnection is what a client holds: it encodes requests, keeps
// the FIFO of requests awaiting a response and pairs each response with its
// request (§5.3). ServerConnection is the server's per-connection handshake
// state (§6.2, §6.3), small enough for a test double of a server. run_id_of
// and from_another_run are the [1.8] rule by which a client tells whether a
// reconnect reached another server run (§6.5, §7.2). Address, parse_address,
// format_address, rank_addresses, redirect_of and reconnect_order are the
// [1.9] rules of servers in a group (§6.7): a rank's address, what a client
// takes from a PONG (its ranks and redirect) and where its reconnects go.
#pragma once

#include <cstddef>
#include <cstdint>
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

/// [1.9] A rank's client address (§6.7): its host (an IPv6 address without
/// the brackets it is written in) and port. Two addresses are the same when
/// their hosts are equal strings (byte for byte) and their ports equal.
struct Address {
  std::string host;        ///< a name, an IPv4 address or an IPv6 address (no brackets)
  std::uint16_t port = 0;  ///< 1 to 65535

  /// Same host (byte for byte) and port.
  friend bool operator==(const Address& a, const Address& b) noexcept {
    return a.port == b.port && a.host == b.host;
  }
  /// Another host or port.
  friend bool operator!=(const Address& a, const Address& b) noexcept { return !(a == b); }
};

/// [1.9] `value` read as §6.7 writes a rank's address, "host:port"; none when
/// it is not one (a client then ignores it). The port, after the last ':', is
/// 1 to 65535 in at most 5 ASCII decimal digits (no sign); an IPv6 host is in
/// brackets ("[fd00::5]:9100"), which are taken off; any other host is not
/// empty and holds no ':', '[' or ']'; no host holds whitespace (Unicode's,
/// as Python's str.isspace). A value that is not a string, or is longer than
/// 300 code points, is none.
std::optional<Address> parse_address(const nlohmann::json& value);

/// [1.9] `address` as §6.7 writes it: "host:port", an IPv6 host (one that
/// holds ':') in brackets ("[fd00::5]:9100").
std::string format_address(const Address& address);

/// [1.9] The ranks a PONG names (§7.2 "ranks"), in order, each once: entries
/// that are not addresses (parse_address) are left out, a repeated one
/// counts once, and a "ranks" that is absent or not an array names none. At
/// most the first 1024 entries are read.
std::vector<Address> rank_addresses(const nlohmann::json& pong);

/// [1.9] The rank a PONG asks the client to move to (§7.2 "redirect"), or
/// none to stay: none when the connection, to `current`, was itself made on a
/// redirect (`redirected`), when the value is not an address, or when it
/// names `current`.
std::optional<Address> redirect_of(const nlohmann::json& pong, const Address& current, bool redirected);

/// [1.9] Where a client's attempts go once its connection to `lost` ended, or
/// its attempts begin (§6.7): the candidates are `given` (the address the
/// application gave), then the `ranks` the last PONG that named any named,
/// those that differ from it, each once; `lost` heads them when it is not one
/// of them. Returned counted from `lost`, wrapping around: attempt k goes to
/// element k % size() (the first retries `lost`). Never empty.
std::vector<Address> reconnect_order(const Address& given, const std::vector<Address>& ranks, const Address& lost);

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
