// Declarative policy mapping (docs/protocol.md §9.3): rules, fnmatch-style globs, FNV-1a.
using System;
using System.Collections.Generic;
using System.Text;
using Newtonsoft.Json.Linq;

namespace Tether.Protocol
{
    /// <summary>One rule: an exact agent id or a glob pattern, and a module or a list to choose from by hash.</summary>
    public sealed class MappingRule
    {
        /// <summary>The exact agent id this rule matches, or null.</summary>
        public string AgentId { get; internal set; }
        /// <summary>The fnmatch pattern this rule matches (* ? [set] [!set]), or null.</summary>
        public string Pattern { get; internal set; }
        /// <summary>The module of every matching agent, or null.</summary>
        public string Module { get; internal set; }
        /// <summary>Modules one of which is chosen by FNV-1a of (episode id, NUL, agent id), or empty.</summary>
        public IList<string> ChooseFrom { get; internal set; }

        internal MappingRule() { ChooseFrom = new List<string>(); }

        /// <summary>Whether the rule applies to <paramref name="agentId"/>.</summary>
        public bool Matches(string agentId)
        {
            if (AgentId != null) return agentId == AgentId;
            return Pattern != null && Glob.Match(Pattern, agentId);
        }

        /// <summary>The module for a matching agent in an episode.</summary>
        public string ModuleFor(string agentId, string episodeId)
        {
            if (Module != null) return Module;
            byte[] key = Encoding.UTF8.GetBytes(episodeId + "\0" + agentId);
            return ChooseFrom[(int)(PolicyMapping.Fnv1a32(key) % (uint)ChooseFrom.Count)];
        }
    }

    /// <summary>The server's policy_mapping: the first matching rule gives an agent's module.</summary>
    public sealed class PolicyMapping
    {
        readonly List<MappingRule> rules = new List<MappingRule>();

        /// <summary>The rules, in order.</summary>
        public IList<MappingRule> Rules { get { return rules.AsReadOnly(); } }

        /// <summary>32-bit FNV-1a of the bytes.</summary>
        public static uint Fnv1a32(byte[] bytes)
        {
            uint h = 0x811C9DC5u;
            foreach (byte b in bytes)
            {
                h ^= b;
                h = unchecked(h * 0x01000193u);
            }
            return h;
        }

        /// <summary>The mapping a SET_CONFIG's policy_mapping gives. Throws INVALID_FIELD naming the bad rule.</summary>
        public static PolicyMapping FromJson(JToken data)
        {
            var array = data as JArray;
            if (array == null) throw new TetherException(ErrorCode.InvalidField, "policy_mapping must be a list of rules");
            var mapping = new PolicyMapping();
            for (int i = 0; i < array.Count; ++i)
            {
                string where = "policy_mapping[" + i + "]";
                var item = array[i] as JObject;
                if (item == null) throw new TetherException(ErrorCode.InvalidField, where + " is not an object");
                foreach (JProperty property in item.Properties())
                {
                    if (property.Name != "agent_id" && property.Name != "pattern" && property.Name != "module" && property.Name != "choose_from")
                    {
                        throw new TetherException(ErrorCode.InvalidField, where + " has unknown key '" + property.Name + "'");
                    }
                }
                var rule = new MappingRule
                {
                    AgentId = OptionalString(item, "agent_id", where),
                    Pattern = OptionalString(item, "pattern", where),
                    Module = OptionalString(item, "module", where),
                };
                JToken choose = item["choose_from"];
                if (choose != null && choose.Type != JTokenType.Null)
                {
                    var modules = choose as JArray;
                    if (modules == null) throw new TetherException(ErrorCode.InvalidField, where + ": 'choose_from' must be a list of module names");
                    foreach (JToken m in modules)
                    {
                        if (m.Type != JTokenType.String) throw new TetherException(ErrorCode.InvalidField, where + ": 'choose_from' must be a list of module names");
                        rule.ChooseFrom.Add((string)m);
                    }
                }
                if ((rule.AgentId != null) == (rule.Pattern != null))
                {
                    throw new TetherException(ErrorCode.InvalidField, where + ": a mapping rule needs exactly one of 'agent_id' and 'pattern'");
                }
                if ((rule.Module != null) == (rule.ChooseFrom.Count > 0))
                {
                    throw new TetherException(ErrorCode.InvalidField, where + ": a mapping rule needs exactly one of 'module' and 'choose_from'");
                }
                mapping.rules.Add(rule);
            }
            return mapping;
        }

        /// <summary>Every module name a rule can produce, in code point order (as C++'s <c>modules()</c> and
        /// Python's <c>sorted(mapping.modules())</c>: the first a SET_CONFIG does not describe is the one named).</summary>
        public SortedSet<string> Modules()
        {
            var named = new SortedSet<string>(Comparer<string>.Create(EnvParams.CompareNames));
            foreach (MappingRule rule in rules)
            {
                if (rule.Module != null) named.Add(rule.Module);
                else named.UnionWith(rule.ChooseFrom);
            }
            return named;
        }

        /// <summary>The module of <paramref name="agentId"/> in an episode. Throws UNMAPPED_AGENT when no rule matches.</summary>
        public string ModuleFor(string agentId, string episodeId)
        {
            foreach (MappingRule rule in rules)
            {
                if (rule.Matches(agentId)) return rule.ModuleFor(agentId, episodeId);
            }
            throw new TetherException(ErrorCode.UnmappedAgent, "no policy-mapping rule matches agent id '" + agentId + "'");
        }

        /// <summary>
        /// The module of each id in <paramref name="asked"/>, in that order, into <paramref name="modules"/>
        /// (cleared first; filled only when the answer is read whole), from the server's answer to
        /// MAP_AGENTS (docs/protocol.md §7.10, §7.11; vectors agent_modules.json).
        /// <paramref name="isDescribed"/> says whether SET_CONFIG described a module. Throws a
        /// <see cref="ProtocolException"/>: INVALID_FIELD for another message than
        /// AGENT_MODULES {"modules": {...}}; then, id by id in the order asked, the first whose entry is
        /// missing or not a string (INVALID_FIELD) or names a module not described (UNKNOWN_MODULE).
        /// Ids not asked about are ignored.
        /// </summary>
        public static void ReadAgentModules(JToken answer, IList<string> asked, Func<string, bool> isDescribed, List<string> modules)
        {
            modules.Clear();
            JObject message = answer as JObject;
            JToken type = message == null ? null : message["type"];
            JObject assigned = message == null ? null : message["modules"] as JObject;
            if (type == null || type.Type != JTokenType.String || (string)type != "AGENT_MODULES" || assigned == null)
            {
                throw new ProtocolException(ErrorCode.InvalidField, "MAP_AGENTS was not answered with AGENT_MODULES {\"modules\": {...}}");
            }
            foreach (string agentId in asked)
            {
                JToken module = assigned[agentId];
                if (module == null || module.Type != JTokenType.String)
                {
                    modules.Clear();
                    throw new ProtocolException(ErrorCode.InvalidField, "AGENT_MODULES names no module for '" + agentId + "'");
                }
                string moduleId = (string)module;
                if (!isDescribed(moduleId))
                {
                    modules.Clear();
                    throw new ProtocolException(ErrorCode.UnknownModule, "AGENT_MODULES maps '" + agentId + "' to module '" + moduleId + "', which SET_CONFIG does not describe");
                }
                modules.Add(moduleId);
            }
        }

        static string OptionalString(JObject item, string key, string where)
        {
            JToken value = item[key];
            if (value == null || value.Type == JTokenType.Null) return null;
            if (value.Type != JTokenType.String) throw new TetherException(ErrorCode.InvalidField, where + ": '" + key + "' must be a string");
            return (string)value;
        }
    }

    /// <summary>fnmatch-style globs over code points, as Python's fnmatch.fnmatchcase reads them.</summary>
    internal static class Glob
    {
        enum Kind { Literal, Any, Star, Set }

        struct Token
        {
            public Kind Kind;
            public int Literal;
            public bool Negate;
            public List<int[]> Ranges;  // inclusive [from, to]

            public bool Accepts(int c)
            {
                switch (Kind)
                {
                    case Kind.Literal: return c == Literal;
                    case Kind.Any: return true;
                    case Kind.Set:
                        bool inside = false;
                        foreach (int[] r in Ranges) inside = inside || (r[0] <= c && c <= r[1]);
                        return inside != Negate;
                    default: return false;
                }
            }
        }

        static List<int> CodePoints(string text)
        {
            var points = new List<int>(text.Length);
            for (int i = 0; i < text.Length; ++i)
            {
                if (char.IsHighSurrogate(text[i]) && i + 1 < text.Length && char.IsLowSurrogate(text[i + 1]))
                {
                    points.Add(char.ConvertToUtf32(text[i], text[i + 1]));
                    ++i;
                }
                else
                {
                    points.Add(text[i]);
                }
            }
            return points;
        }

        static List<Token> Tokenize(List<int> pat)
        {
            var tokens = new List<Token>();
            int n = pat.Count, i = 0;
            while (i < n)
            {
                int c = pat[i++];
                var token = new Token { Kind = Kind.Literal, Literal = c };
                if (c == '*')
                {
                    if (tokens.Count > 0 && tokens[tokens.Count - 1].Kind == Kind.Star) continue;
                    token.Kind = Kind.Star;
                }
                else if (c == '?')
                {
                    token.Kind = Kind.Any;
                }
                else if (c == '[')
                {
                    int j = i;
                    if (j < n && pat[j] == '!') ++j;
                    if (j < n && pat[j] == ']') ++j;
                    while (j < n && pat[j] != ']') ++j;
                    if (j < n)  // (no closing bracket: a literal '[')
                    {
                        List<int> stuff = pat.GetRange(i, j - i);
                        i = j + 1;
                        token.Kind = Kind.Set;
                        token.Ranges = new List<int[]>();
                        int k = 0;
                        if (stuff.Count > 0 && stuff[0] == '!')
                        {
                            token.Negate = true;
                            k = 1;
                        }
                        while (k < stuff.Count)
                        {
                            if (k + 2 < stuff.Count && stuff[k + 1] == '-')
                            {
                                token.Ranges.Add(new[] { stuff[k], stuff[k + 2] });
                                k += 3;
                            }
                            else
                            {
                                token.Ranges.Add(new[] { stuff[k], stuff[k] });
                                ++k;
                            }
                        }
                    }
                }
                tokens.Add(token);
            }
            return tokens;
        }

        /// <summary>Whether <paramref name="text"/> matches <paramref name="pattern"/> (case-sensitive, whole string).</summary>
        public static bool Match(string pattern, string text)
        {
            List<Token> tokens = Tokenize(CodePoints(pattern));
            List<int> s = CodePoints(text);
            int t = 0, p = 0, starToken = -1, starText = 0;
            while (t < s.Count)
            {
                if (p < tokens.Count && tokens[p].Kind == Kind.Star)
                {
                    starToken = p++;
                    starText = t;
                }
                else if (p < tokens.Count && tokens[p].Accepts(s[t]))
                {
                    ++p;
                    ++t;
                }
                else if (starToken >= 0)
                {
                    p = starToken + 1;
                    t = ++starText;
                }
                else
                {
                    return false;
                }
            }
            while (p < tokens.Count && tokens[p].Kind == Kind.Star) ++p;
            return p == tokens.Count;
        }
    }
}
