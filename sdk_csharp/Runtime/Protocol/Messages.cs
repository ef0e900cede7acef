// Message types, body decoding (docs/protocol.md §4-§5) and encoding.
using System;
using System.Collections.Generic;
using System.IO;
using System.Text;
using Newtonsoft.Json;
using Newtonsoft.Json.Linq;

namespace Tether.Protocol
{
    /// <summary>The message types of RLlink and Tether's extensions.</summary>
    public enum MessageType
    {
        /// <summary>Handshake and heartbeat request.</summary>
        Ping,
        /// <summary>Asks for the configuration.</summary>
        GetConfig,
        /// <summary>Asks for the current model(s).</summary>
        GetState,
        /// <summary>Experience, unanswered (off-policy).</summary>
        Episodes,
        /// <summary>Experience, answered with the models (on-policy).</summary>
        EpisodesAndGetState,
        /// <summary>Asks the server to map new agents to modules.</summary>
        MapAgents,
        /// <summary>Answer to PING.</summary>
        Pong,
        /// <summary>The configuration.</summary>
        SetConfig,
        /// <summary>The model(s) and their versions.</summary>
        SetState,
        /// <summary>Answer to MAP_AGENTS.</summary>
        AgentModules,
        /// <summary>A refusal, with a code and a message.</summary>
        Error,
    }

    /// <summary>A decoded message: its type, its whole JSON body and its binary attachment (§4.3), if any.</summary>
    public sealed class Message
    {
        /// <summary>The body's "type".</summary>
        public MessageType Type { get; private set; }

        /// <summary>The body as JSON (unknown fields kept).</summary>
        public JObject Body { get; private set; }

        /// <summary>
        /// The bytes after the NUL byte that ended the body's JSON text (protocol 1.4, §4.3): what the
        /// tensor objects of an EPISODES message refer to by offset (§10.9). Null when the body had no
        /// NUL byte; empty when nothing followed it.
        /// </summary>
        public byte[] Attachment { get; private set; }

        /// <summary>A message of <paramref name="type"/> with <paramref name="body"/> (and the body's <paramref name="attachment"/>).</summary>
        public Message(MessageType type, JObject body, byte[] attachment = null)
        {
            Type = type;
            Body = body;
            Attachment = attachment;
        }
    }

    /// <summary>Decoding and encoding message bodies.</summary>
    public static class Messages
    {
        /// <summary>Deepest nesting of arrays and objects a body may have (checked before parsing).</summary>
        public const int MaxJsonDepth = 64;

        /// <summary>The protocol version this SDK speaks (sent in PING).</summary>
        public const string ProtocolVersion = "1.9";

        static readonly string[] TypeNames =
        {
            "PING", "GET_CONFIG", "GET_STATE", "EPISODES", "EPISODES_AND_GET_STATE", "MAP_AGENTS",
            "PONG", "SET_CONFIG", "SET_STATE", "AGENT_MODULES", "ERROR",
        };

        static readonly UTF8Encoding Utf8 = new UTF8Encoding(false, true);

        /// <summary>The type's name on the wire ("EPISODES_AND_GET_STATE").</summary>
        public static string ToWire(MessageType type) { return TypeNames[(int)type]; }

        /// <summary>The type named <paramref name="name"/> (exact case), or null.</summary>
        public static MessageType? FromWire(string name)
        {
            for (int i = 0; i < TypeNames.Length; ++i)
            {
                if (TypeNames[i] == name) return (MessageType)i;
            }
            return null;
        }

        /// <summary>Whether a client sends this type (a request).</summary>
        public static bool IsRequest(MessageType type) { return type <= MessageType.MapAgents; }

        /// <summary>The answer a request gets when it is accepted; null for EPISODES (no answer) and non-requests.</summary>
        public static MessageType? ExpectedResponse(MessageType request)
        {
            switch (request)
            {
                case MessageType.Ping: return MessageType.Pong;
                case MessageType.GetConfig: return MessageType.SetConfig;
                case MessageType.GetState:
                case MessageType.EpisodesAndGetState: return MessageType.SetState;
                case MessageType.MapAgents: return MessageType.AgentModules;
                default: return null;
            }
        }

        /// <summary>
        /// The body as a <see cref="Message"/>. Throws <see cref="ProtocolException"/>:
        /// INVALID_UTF8, INVALID_JSON, NOT_AN_OBJECT, MISSING_TYPE or UNKNOWN_TYPE (§4.2, in that order).
        /// A NUL byte ends the JSON text (protocol 1.4, §4.3): the checks apply to the text before it,
        /// and the bytes after it are the message's <see cref="Message.Attachment"/>, never checked.
        /// </summary>
        public static Message Decode(byte[] body)
        {
            int end = Array.IndexOf(body, (byte)0);
            byte[] attachment = null;
            if (end >= 0)
            {
                attachment = new byte[body.Length - end - 1];
                Buffer.BlockCopy(body, end + 1, attachment, 0, attachment.Length);
            }
            JToken value = ParseJson(body, end >= 0 ? end : body.Length);
            var obj = value as JObject;
            if (obj == null) throw new ProtocolException(ErrorCode.NotAnObject, "body must be a JSON object, got " + Describe(value));
            JToken type;
            if (!obj.TryGetValue("type", out type)) throw new ProtocolException(ErrorCode.MissingType, "body has no \"type\"");
            MessageType? known = type.Type == JTokenType.String ? FromWire((string)type) : null;
            if (known == null) throw new ProtocolException(ErrorCode.UnknownType, "unknown message type " + type.ToString(Formatting.None));
            return new Message(known.Value, obj, attachment);
        }

        /// <summary>
        /// Parses UTF-8 JSON as Python's json module reads it (NaN and Infinity
        /// allowed, strings never turned into dates). Throws INVALID_UTF8 or INVALID_JSON.
        /// </summary>
        public static JToken ParseJson(byte[] body) { return ParseJson(body, body.Length); }

        // The JSON text of the first `length` bytes of `body`.
        static JToken ParseJson(byte[] body, int length)
        {
            int invalid = FirstInvalidUtf8(body, length);
            if (invalid >= 0) throw new ProtocolException(ErrorCode.InvalidUtf8, "body is not valid UTF-8 (at byte " + invalid + ")");
            int depth = NestingDepth(body, length);
            if (depth > MaxJsonDepth)
            {
                throw new ProtocolException(ErrorCode.InvalidJson,
                    "body nests arrays and objects " + depth + " deep; at most " + MaxJsonDepth + " levels are accepted");
            }
            try
            {
                using (var reader = new JsonTextReader(new StringReader(Utf8.GetString(body, 0, length))))
                {
                    reader.DateParseHandling = DateParseHandling.None;
                    reader.FloatParseHandling = FloatParseHandling.Double;
                    reader.MaxDepth = MaxJsonDepth + 1;
                    if (!reader.Read()) throw new ProtocolException(ErrorCode.InvalidJson, "body is not valid JSON: it is empty");
                    JToken value = JToken.ReadFrom(reader);
                    while (reader.Read())
                    {
                        if (reader.TokenType != JsonToken.Comment)
                        {
                            throw new ProtocolException(ErrorCode.InvalidJson, "body is not valid JSON: more after the value");
                        }
                    }
                    return value;
                }
            }
            catch (JsonException e)
            {
                throw new ProtocolException(ErrorCode.InvalidJson, "body is not valid JSON: " + e.Message);
            }
        }

        /// <summary>Whether an ERROR with this code ends the connection (§6.6): the server closes after sending it.</summary>
        public static bool ClosesConnection(ErrorCode code)
        {
            switch (code)
            {
                case ErrorCode.BadHeader:
                case ErrorCode.FrameTooLarge:
                case ErrorCode.TooManyConnections:
                case ErrorCode.HandshakeTimeout:
                case ErrorCode.ClientTimeout:
                case ErrorCode.ServerOverloaded:
                case ErrorCode.AuthThrottled:
                case ErrorCode.TrainingDone:
                    return true;
                default:
                    return false;
            }
        }

        /// <summary>
        /// A JSON integer's value clamped into [<paramref name="min"/>, <paramref name="max"/>]
        /// (an integer too large for a long counts as the nearest bound); <paramref name="fallback"/>
        /// when the token is absent or not an integer.
        /// </summary>
        public static long IntegerOr(JToken token, long fallback, long min = long.MinValue, long max = long.MaxValue)
        {
            if (token == null || token.Type != JTokenType.Integer) return fallback;
            long value;
            object raw = ((JValue)token).Value;
            if (raw is System.Numerics.BigInteger) value = ((System.Numerics.BigInteger)raw).Sign < 0 ? long.MinValue : long.MaxValue;
            else value = Convert.ToInt64(raw, System.Globalization.CultureInfo.InvariantCulture);
            return Math.Max(min, Math.Min(max, value));
        }

        /// <summary>(major, minor) of a version string "1.3" or "1.3.0"; null when it is not one.</summary>
        public static int[] ParseVersion(string text)
        {
            if (text == null) return null;
            string[] parts = text.Split('.');
            if (parts.Length < 1 || parts.Length > 3) return null;
            var numbers = new int[2];
            for (int i = 0; i < parts.Length; ++i)
            {
                string part = parts[i];
                if (part.Length == 0 || part.Length > 9) return null;
                int value = 0;
                foreach (char c in part)
                {
                    if (c < '0' || c > '9') return null;
                    value = value * 10 + (c - '0');
                }
                if (i < 2) numbers[i] = value;
            }
            return numbers;
        }

        /// <summary>A message body as compact UTF-8 JSON.</summary>
        public static byte[] Encode(JObject body)
        {
            return Utf8.GetBytes(body.ToString(Formatting.None));
        }

        /// <summary>A framed message, ready to send.</summary>
        public static byte[] EncodeFrame(JObject body) { return Framing.Encode(Encode(body)); }

        /// <summary>The offset of the first byte that is not valid UTF-8 (overlong forms and surrogates included), or -1.</summary>
        public static int FirstInvalidUtf8(byte[] s) { return FirstInvalidUtf8(s, s.Length); }

        static int FirstInvalidUtf8(byte[] s, int n)
        {
            int i = 0;
            while (i < n)
            {
                int c = s[i];
                if (c < 0x80)
                {
                    ++i;
                    continue;
                }
                int len;
                int cp;
                if ((c & 0xE0) == 0xC0) { len = 2; cp = c & 0x1F; }
                else if ((c & 0xF0) == 0xE0) { len = 3; cp = c & 0x0F; }
                else if ((c & 0xF8) == 0xF0) { len = 4; cp = c & 0x07; }
                else return i;
                if (i + len > n) return i;
                for (int k = 1; k < len; ++k)
                {
                    if ((s[i + k] & 0xC0) != 0x80) return i;
                    cp = (cp << 6) | (s[i + k] & 0x3F);
                }
                if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000)) return i;
                if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
                i += len;
            }
            return -1;
        }

        // The deepest nesting of [ and { outside strings (one pass, no parse).
        static int NestingDepth(byte[] text, int length)
        {
            int depth = 0, deepest = 0;
            bool inString = false;
            for (int i = 0; i < length; ++i)
            {
                byte c = text[i];
                if (inString)
                {
                    if (c == '\\') ++i;
                    else if (c == '"') inString = false;
                }
                else if (c == '"') inString = true;
                else if (c == '[' || c == '{') deepest = Math.Max(deepest, ++depth);
                else if ((c == ']' || c == '}') && depth > 0) --depth;
            }
            return deepest;
        }

        internal static string Describe(JToken value)
        {
            switch (value.Type)
            {
                case JTokenType.Array: return "a list";
                case JTokenType.String: return "a string";
                case JTokenType.Integer:
                case JTokenType.Float: return "a number";
                case JTokenType.Boolean: return "a boolean";
                case JTokenType.Null: return "null";
                default: return value.Type.ToString();
            }
        }
    }
}
