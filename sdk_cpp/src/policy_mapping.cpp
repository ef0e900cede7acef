// Policy-mapping rules, fnmatch-style globs and FNV-1a.
#include "tether/policy_mapping.h"

#include <cstddef>

#include "json_util.h"

namespace tether {
namespace {

// Code points of a UTF-8 string (bytes that are not valid UTF-8 pass as themselves).
std::vector<std::uint32_t> code_points(std::string_view text) {
  std::vector<std::uint32_t> out;
  out.reserve(text.size());
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  for (std::size_t i = 0; i < text.size();) {
    const unsigned char c = s[i];
    std::size_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
    if (i + len > text.size()) len = 1;
    std::uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
    for (std::size_t k = 1; k < len; ++k) cp = (cp << 6) | (s[i + k] & 0x3F);
    out.push_back(cp);
    i += len;
  }
  return out;
}

struct GlobToken {
  enum Kind { kLiteral, kAny, kStar, kSet } kind = kLiteral;
  std::uint32_t literal = 0;
  bool negate = false;
  std::vector<std::pair<std::uint32_t, std::uint32_t>> ranges;  // inclusive

  bool accepts(std::uint32_t c) const {
    switch (kind) {
      case kLiteral:
        return c == literal;
      case kAny:
        return true;
      case kSet: {
        bool in = false;
        for (const auto& r : ranges) in = in || (r.first <= c && c <= r.second);
        return in != negate;
      }
      case kStar:
        return false;
    }
    return false;
  }
};

// Tokens as fnmatch.translate reads a pattern.
std::vector<GlobToken> tokenize(const std::vector<std::uint32_t>& pat) {
  std::vector<GlobToken> tokens;
  const std::size_t n = pat.size();
  std::size_t i = 0;
  while (i < n) {
    const std::uint32_t c = pat[i++];
    GlobToken token;
    if (c == '*') {
      if (!tokens.empty() && tokens.back().kind == GlobToken::kStar) continue;
      token.kind = GlobToken::kStar;
    } else if (c == '?') {
      token.kind = GlobToken::kAny;
    } else if (c == '[') {
      std::size_t j = i;
      if (j < n && pat[j] == '!') ++j;
      if (j < n && pat[j] == ']') ++j;
      while (j < n && pat[j] != ']') ++j;
      if (j >= n) {
        token.literal = '[';  // no closing bracket: a literal '['
      } else {
        std::vector<std::uint32_t> stuff(pat.begin() + static_cast<std::ptrdiff_t>(i),
                                         pat.begin() + static_cast<std::ptrdiff_t>(j));
        i = j + 1;
        token.kind = GlobToken::kSet;
        std::size_t k = 0;
        if (!stuff.empty() && stuff[0] == '!') {
          token.negate = true;
          k = 1;
        }
        // "[!]" matches any character; "[]" (impossible here) nothing.
        while (k < stuff.size()) {
          if (k + 2 < stuff.size() && stuff[k + 1] == '-') {
            token.ranges.emplace_back(stuff[k], stuff[k + 2]);
            k += 3;
          } else {
            token.ranges.emplace_back(stuff[k], stuff[k]);
            ++k;
          }
        }
      }
    } else {
      token.literal = c;
    }
    tokens.push_back(std::move(token));
  }
  return tokens;
}

}  // namespace

std::uint32_t fnv1a32(std::string_view bytes) noexcept {
  std::uint32_t h = 0x811C9DC5u;
  for (unsigned char b : bytes) {
    h ^= b;
    h *= 0x01000193u;
  }
  return h;
}

bool glob_match(std::string_view pattern, std::string_view text) {
  const std::vector<GlobToken> tokens = tokenize(code_points(pattern));
  const std::vector<std::uint32_t> s = code_points(text);
  std::size_t t = 0, p = 0;
  std::size_t star_token = SIZE_MAX, star_text = 0;
  while (t < s.size()) {
    if (p < tokens.size() && tokens[p].kind == GlobToken::kStar) {
      star_token = p++;
      star_text = t;
    } else if (p < tokens.size() && tokens[p].accepts(s[t])) {
      ++p;
      ++t;
    } else if (star_token != SIZE_MAX) {
      p = star_token + 1;
      t = ++star_text;
    } else {
      return false;
    }
  }
  while (p < tokens.size() && tokens[p].kind == GlobToken::kStar) ++p;
  return p == tokens.size();
}

bool MappingRule::matches(std::string_view agent) const {
  if (agent_id) return agent == *agent_id;
  return pattern && glob_match(*pattern, agent);
}

const std::string& MappingRule::module_for(std::string_view agent, std::string_view episode_id) const {
  if (module) return *module;
  std::string key(episode_id);
  key += '\0';
  key.append(agent.data(), agent.size());
  return choose_from[fnv1a32(key) % choose_from.size()];
}

nlohmann::json MappingRule::to_json() const {
  nlohmann::json out = nlohmann::json::object();
  if (agent_id) {
    out["agent_id"] = *agent_id;
  } else if (pattern) {
    out["pattern"] = *pattern;
  }
  if (module) {
    out["module"] = *module;
  } else {
    out["choose_from"] = choose_from;
  }
  return out;
}

Result<PolicyMapping> PolicyMapping::from_json(const nlohmann::json& data) {
  if (!data.is_array()) return Result<PolicyMapping>(ErrorCode::kInvalidField, "policy_mapping must be a list of rules");
  PolicyMapping mapping;
  for (std::size_t i = 0; i < data.size(); ++i) {
    const nlohmann::json& item = data[i];
    const std::string where = "policy_mapping[" + std::to_string(i) + "]";
    if (!item.is_object()) return Result<PolicyMapping>(ErrorCode::kInvalidField, where + " is not an object");
    for (const auto& entry : item.items()) {
      const std::string& key = entry.key();
      if (key != "agent_id" && key != "pattern" && key != "module" && key != "choose_from") {
        return Result<PolicyMapping>(ErrorCode::kInvalidField, where + " has unknown key '" + key + "'");
      }
    }
    MappingRule rule;
    for (const char* key : {"agent_id", "pattern", "module"}) {
      const nlohmann::json* value = detail::member(item, key);
      if (value == nullptr || value->is_null()) continue;
      if (!value->is_string()) {
        return Result<PolicyMapping>(ErrorCode::kInvalidField, where + ": '" + key + "' must be a string");
      }
      std::optional<std::string>& slot =
          key[0] == 'a' ? rule.agent_id : key[0] == 'p' ? rule.pattern : rule.module;
      slot = value->get_ref<const std::string&>();
    }
    if (const nlohmann::json* choose = detail::member(item, "choose_from")) {
      if (!choose->is_null()) {
        if (!choose->is_array()) {
          return Result<PolicyMapping>(ErrorCode::kInvalidField, where + ": 'choose_from' must be a list of module names");
        }
        for (const auto& m : *choose) {
          if (!m.is_string()) {
            return Result<PolicyMapping>(ErrorCode::kInvalidField,
                                         where + ": 'choose_from' must be a list of module names");
          }
          rule.choose_from.push_back(m.get_ref<const std::string&>());
        }
      }
    }
    if (rule.agent_id.has_value() == rule.pattern.has_value()) {
      return Result<PolicyMapping>(ErrorCode::kInvalidField,
                                   where + ": a mapping rule needs exactly one of 'agent_id' and 'pattern'");
    }
    if (rule.module.has_value() == !rule.choose_from.empty()) {
      return Result<PolicyMapping>(ErrorCode::kInvalidField,
                                   where + ": a mapping rule needs exactly one of 'module' and 'choose_from'");
    }
    mapping.rules_.push_back(std::move(rule));
  }
  return mapping;
}

nlohmann::json PolicyMapping::to_json() const {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& rule : rules_) out.push_back(rule.to_json());
  return out;
}

Result<std::string> PolicyMapping::module_for(std::string_view agent_id, std::string_view episode_id) const {
  for (const auto& rule : rules_) {
    if (rule.matches(agent_id)) return rule.module_for(agent_id, episode_id);
  }
  return Result<std::string>(ErrorCode::kUnmappedAgent,
                             "no policy-mapping rule matches agent id '" + std::string(agent_id) + "'");
}

std::set<std::string> PolicyMapping::modules() const {
  std::set<std::string> out;
  for (const auto& rule : rules_) {
    if (rule.module) {
      out.insert(*rule.module);
    } else {
      out.insert(rule.choose_from.begin(), rule.choose_from.end());
    }
  }
  return out;
}

Status read_agent_modules(const nlohmann::json& answer, const std::vector<std::string>& asked,
                          const std::function<bool(const std::string&)>& is_described,
                          std::vector<std::string>& modules) {
  modules.clear();
  const auto type = answer.is_object() ? answer.find("type") : answer.end();
  const auto assigned = answer.is_object() ? answer.find("modules") : answer.end();
  if (type == answer.end() || *type != "AGENT_MODULES" || assigned == answer.end() || !assigned->is_object()) {
    return Status(ErrorCode::kInvalidField, "MAP_AGENTS was not answered with AGENT_MODULES {\"modules\": {...}}");
  }
  for (const std::string& agent_id : asked) {
    const auto entry = assigned->find(agent_id);
    if (entry == assigned->end() || !entry->is_string()) {
      modules.clear();
      return Status(ErrorCode::kInvalidField, "AGENT_MODULES names no module for '" + agent_id + "'");
    }
    const std::string& module_id = entry->get_ref<const std::string&>();
    if (!is_described(module_id)) {
      modules.clear();
      return Status(ErrorCode::kUnknownModule, "AGENT_MODULES maps '" + agent_id + "' to module '" + module_id +
                                                   "', which SET_CONFIG does not describe");
    }
    modules.push_back(module_id);
  }
  return Status::Ok();
}

}  // namespace tether
