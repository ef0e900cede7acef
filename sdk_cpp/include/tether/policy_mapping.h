// Declarative policy mapping (docs/protocol.md §9.3): which module an agent
// id maps to, evaluated identically by every SDK and the server.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "tether/status.h"

namespace tether {

/// 32-bit FNV-1a of the bytes (the mapping's language-neutral "random" choice).
std::uint32_t fnv1a32(std::string_view bytes) noexcept;

/// Whether `text` matches the glob `pattern` as Python's fnmatch.fnmatchcase
/// does: `*`, `?`, `[seq]`, `[!seq]`, ranges, compared by code point.
bool glob_match(std::string_view pattern, std::string_view text);

/// One rule: an exact `agent_id` or a glob `pattern`, and a `module` or a
/// `choose_from` list.
struct MappingRule {
  std::optional<std::string> agent_id;  ///< exact id, or
  std::optional<std::string> pattern;   ///< glob
  std::optional<std::string> module;    ///< the module, or
  std::vector<std::string> choose_from; ///< one of these, by fnv1a32(episode_id NUL agent_id) % n

  /// Whether the rule applies to `agent_id`.
  bool matches(std::string_view agent) const;
  /// The module this rule gives `agent` in episode `episode_id`.
  const std::string& module_for(std::string_view agent, std::string_view episode_id) const;
  /// The JSON form.
  nlohmann::json to_json() const;
};

/// An ordered rule list; the first rule that matches wins.
class PolicyMapping {
 public:
  /// No rules (every agent unmapped).
  PolicyMapping() = default;
  /// Parses the JSON list form; INVALID_FIELD when malformed.
  static Result<PolicyMapping> from_json(const nlohmann::json& data);
  /// The JSON list form.
  nlohmann::json to_json() const;
  /// The module for an agent that first appears in episode `episode_id`
  /// ("" for records without one); UNMAPPED_AGENT when no rule matches.
  Result<std::string> module_for(std::string_view agent_id, std::string_view episode_id = "") const;
  /// Every module a rule can produce.
  std::set<std::string> modules() const;
  /// The rules, in order.
  const std::vector<MappingRule>& rules() const noexcept { return rules_; }

 private:
  std::vector<MappingRule> rules_;
};

/// The module of each id in `asked`, in that order, from the server's answer
/// to MAP_AGENTS (docs/protocol.md §7.10, §7.11; vectors agent_modules.json):
/// `answer` is the message object, `is_described` says whether SET_CONFIG
/// described a module. kInvalidField for another message than AGENT_MODULES
/// {"modules": {...}}; then, id by id in the order asked, the first whose entry
/// is missing or not a string (kInvalidField) or names a module not described
/// (kUnknownModule). Ids not asked about are ignored. `modules` is cleared
/// first and holds the answer only when it was read whole.
Status read_agent_modules(const nlohmann::json& answer, const std::vector<std::string>& asked,
                          const std::function<bool(const std::string&)>& is_described,
                          std::vector<std::string>& modules);

}  // namespace tether
