// Offline policy files (docs/protocol.md §20): the PONG, SET_CONFIG and
// SET_STATE a server would give a client, written as one JSON object beside
// its final policies (offline_policy.json). A client made with
// ClientOptions::offline_policy reads one instead of connecting: it acts with
// the file's configuration and models, records nothing for training and sends
// nothing (a demonstration file, ClientOptions::demo_path, is still written).
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "tether/status.h"

namespace tether {

/// The three messages of an offline policy file.
struct OfflinePolicy {
  nlohmann::json pong;    ///< the PONG (protocol_version, run_id)
  nlohmann::json config;  ///< the SET_CONFIG
  nlohmann::json state;   ///< the SET_STATE, with every module's model
};

/// The file's "format" and "version" (§20).
inline constexpr const char* kOfflinePolicyFormat = "tether-offline-policy";
inline constexpr int kOfflinePolicyVersion = 1;

/// The three messages of an offline policy file's text, checked as §20 says
/// (tests/conformance/offline_policy.json): INVALID_JSON for text that is not
/// JSON, INVALID_FIELD naming what else is wrong (not an object, another
/// format or version, a member missing or of another message type). The
/// messages are then taken as from a server (a bad space or model is refused
/// there, as from a server).
Result<OfflinePolicy> parse_offline_policy(std::string_view text);

/// parse_offline_policy of the file at `path`; INVALID_ARGUMENT when it cannot
/// be read. Every message names the path.
Result<OfflinePolicy> read_offline_policy(const std::string& path);

}  // namespace tether
