// Offline policy files (docs/protocol.md §20): the PONG, SET_CONFIG and SET_STATE a server would give a
// client, written as one JSON object beside its final policies (offline_policy.json). A client made with
// ClientOptions.OfflinePolicy reads one instead of connecting.
using System;
using System.IO;
using System.Text;
using Newtonsoft.Json;
using Newtonsoft.Json.Linq;

namespace Tether.Protocol
{
    /// <summary>
    /// The three messages of an offline policy file (§20), read with the checks every SDK makes
    /// (tests/conformance/offline_policy.json). The messages are then taken as from a server: a bad space
    /// or model is refused there, as from a server.
    /// </summary>
    public sealed class OfflinePolicy
    {
        /// <summary>The file's "format".</summary>
        public const string Format = "tether-offline-policy";
        /// <summary>The file's "version" this reader takes.</summary>
        public const int Version = 1;

        /// <summary>The PONG (protocol_version, run_id).</summary>
        public JObject Pong { get; private set; }
        /// <summary>The SET_CONFIG.</summary>
        public JObject Config { get; private set; }
        /// <summary>The SET_STATE, with every module's model.</summary>
        public JObject State { get; private set; }

        /// <summary>
        /// The messages of an offline policy file's text. Throws <see cref="ProtocolException"/>: INVALID_JSON for
        /// text that is not JSON, INVALID_FIELD naming what else is wrong (not an object, another format or
        /// version, a member missing or of another message type).
        /// </summary>
        public static OfflinePolicy Parse(string text) { return Parse(Encoding.UTF8.GetBytes(text)); }

        /// <summary>The same, of the file's bytes (UTF-8; invalid UTF-8 is INVALID_JSON, as in every SDK).</summary>
        public static OfflinePolicy Parse(byte[] text)
        {
            JToken value;
            try
            {
                value = Messages.ParseJson(text);
            }
            catch (ProtocolException e)
            {
                throw new ProtocolException(ErrorCode.InvalidJson, "not JSON: " + e.Detail);
            }
            var body = value as JObject;
            if (body == null) throw Invalid("not a JSON object");
            JToken format = body["format"];
            if (format == null || format.Type != JTokenType.String || (string)format != Format)
            {
                throw Invalid("format is " + Describe(format) + ", not \"" + Format + "\": not an offline policy file");
            }
            JToken version = body["version"];
            if (version == null || version.Type != JTokenType.Integer || (long)version != Version)
            {
                throw Invalid("version " + Describe(version) + " is not supported (this reader takes " + Version + ")");
            }
            return new OfflinePolicy
            {
                Pong = Member(body, "pong", "PONG"),
                Config = Member(body, "config", "SET_CONFIG"),
                State = Member(body, "state", "SET_STATE"),
            };
        }

        /// <summary>
        /// <see cref="Parse"/> of the file at <paramref name="path"/>; INVALID_ARGUMENT when it cannot be read.
        /// Every message names the path.
        /// </summary>
        public static OfflinePolicy Read(string path)
        {
            byte[] text;
            try
            {
                text = File.ReadAllBytes(path);
            }
            catch (Exception e) when (e is IOException || e is UnauthorizedAccessException || e is ArgumentException ||
                                      e is NotSupportedException)
            {
                throw new TetherException(ErrorCode.InvalidArgument, "offline policy '" + path + "': cannot be read: " + e.Message);
            }
            try
            {
                return Parse(text);
            }
            catch (ProtocolException e)
            {
                throw new ProtocolException(e.Code, "offline policy '" + path + "': " + e.Detail);
            }
        }

        static JObject Member(JObject body, string name, string type)
        {
            var message = body[name] as JObject;
            if (message == null) throw Invalid(name + " is missing or not a JSON object");
            JToken kind = message["type"];
            if (kind == null || kind.Type != JTokenType.String || (string)kind != type)
            {
                throw Invalid(name + " is not a " + type + " message (type " + Describe(kind) + ")");
            }
            return message;
        }

        static string Describe(JToken token) { return token == null ? "missing" : token.ToString(Formatting.None); }

        static ProtocolException Invalid(string what) { return new ProtocolException(ErrorCode.InvalidField, what); }
    }
}
