// ClientOptions: what a TetherClient or a MultiAgentClient is configured with.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "tether/framing.h"
#include "tether/server_link.h"

namespace tether {

/// What a client does when the send queue behind the batch in flight is full.
enum class QueueFullPolicy {
  kDropOldest,  ///< drop the oldest waiting batches (and the rest of their episodes); never wait
  kWait,        ///< wait for room (backpressure): every step is delivered, at the server's pace
};

/// Everything a TetherClient (or a MultiAgentClient) is configured with.
struct ClientOptions {
  std::string host = "127.0.0.1";          ///< server address; [1.9] of a group of servers, any rank's (§6.7)
  std::uint16_t port = 5555;               ///< server port
  std::string client_name = "tether-cpp";  ///< shown in the server's logs
  std::optional<std::string> auth_token;   ///< sent in PING when the server requires one
  std::optional<std::uint64_t> seed;       ///< seeds action sampling (none: from std::random_device)
  double connect_timeout_s = 10.0;         ///< limit of one TCP connect attempt
  double response_timeout_s = 60.0;        ///< limit of PONG / SET_CONFIG / SET_STATE answers
  double update_timeout_s = 600.0;         ///< limit of a batch's answer (may wait for a learner update)
  double reconnect_timeout_s = 60.0;       ///< keep retrying a lost server this long, then fail for good
  QueueFullPolicy when_queue_full = QueueFullPolicy::kDropOldest;  ///< see QueueFullPolicy
  /// Against an on-policy server, wait after every batch for the weights that
  /// answer it. None: false, except against a plain RLlink v1 server (no
  /// protocol_version in PONG), where it is true.
  std::optional<bool> wait_for_weights;
  std::size_t max_queued_steps = 0;        ///< steps that may wait behind the batch in flight; 0: from SET_CONFIG
  std::size_t max_queued_batches = 64;     ///< hard cap on waiting batches
  std::size_t max_frame_bytes = kDefaultMaxFrameBytes;  ///< largest frame accepted from the server
  /// [1.6] When set, a demonstration file (§18, DemoWriter) the client writes
  /// while it plays: every episode, with its sampled and logged steps, each
  /// agent's (or group's) episode as one line when it ends (running ones
  /// truncated at close()), training or not, recorded or not. Created (or
  /// replaced) at connect(), with the first connection's spaces (connect()
  /// fails with the writer's status when it cannot be created); a module
  /// whose spaces a later connection changes is no longer written. Empty: off.
  std::string demo_path;
  /// [§20] When set, the path of an offline policy file (a server's
  /// offline_policy.json): connect() reaches no server and the client acts
  /// with the file's configuration and models (spaces, mapping rules, groups,
  /// recurrent state, environment parameters), as if a server had sent them.
  /// Nothing is recorded for training or sent; a demonstration file
  /// (demo_path) is still written, which is how an engine records episodes
  /// acted by a trained policy with no server. host, port and the connection
  /// options are unused; a MAP_AGENTS the file's rules cannot spare is
  /// NOT_READY. connect() returns what is wrong with the file (INVALID_JSON,
  /// INVALID_FIELD, INVALID_ARGUMENT when it cannot be read), naming it. Empty: off.
  std::string offline_policy;
  /// Required: makes an empty inference backend for each model received
  /// (e.g. OnnxRuntimeBackend from tether/onnxruntime_backend.h). Called on the I/O thread.
  BackendFactory backend_factory;
};

}  // namespace tether
