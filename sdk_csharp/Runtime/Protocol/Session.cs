// Connection state without I/O (docs/protocol.md §5-§6): which request a
// response answers on the client side, the server run a PONG names (1.8), the
// addresses of servers in a group and the reconnect order among them (1.9), and
// the server's handshake rules.
using System;
using System.Collections.Generic;
using Newtonsoft.Json.Linq;

namespace Tether.Protocol
{
    /// <summary>A response and the request it answers (null: an ERROR that answers none).</summary>
    public sealed class Response
    {
        /// <summary>The request answered, or null for an ERROR that answers no outstanding request.</summary>
        public MessageType? Request { get; internal set; }

        /// <summary>The response itself.</summary>
        public Message Message { get; internal set; }
    }

    /// <summary>
    /// A client's side of one connection: frames what it sends, and pairs each
    /// received message with the oldest request awaiting an answer (§5.3). A
    /// protocol violation by the server (an unsolicited or mismatched message)
    /// closes it; so does a connection-level ERROR (§6.6). Sans-I/O: the caller
    /// moves the bytes.
    /// </summary>
    public sealed class ClientConnection
    {
        readonly int maxFrameBytes;
        FrameDecoder decoder;
        readonly Queue<MessageType> awaiting = new Queue<MessageType>();
        readonly List<byte[]> bodies = new List<byte[]>();

        /// <summary>A connection refusing frames over <paramref name="maxFrameBytes"/>.</summary>
        public ClientConnection(int maxFrameBytes = Framing.DefaultMaxFrameBytes)
        {
            this.maxFrameBytes = maxFrameBytes;
            decoder = new FrameDecoder(maxFrameBytes);
        }

        /// <summary>Why the connection closed, or null while it is usable.</summary>
        public TetherException Error { get; private set; }

        /// <summary>
        /// The body of the connection-level ERROR that closed the connection (§6.6: TRAINING_DONE's
        /// carries the run's "summary"), or null while it is usable or when something else closed it.
        /// </summary>
        public JObject ClosingError { get; private set; }

        /// <summary>Whether the connection is closed (see <see cref="Error"/>).</summary>
        public bool Closed { get { return Error != null; } }

        /// <summary>Requests still waiting for their answer, oldest first.</summary>
        public int Outstanding { get { return awaiting.Count; } }

        /// <summary>
        /// The frame to send for a request. Throws INVALID_ARGUMENT for a body
        /// that is not a request, CLOSED once the connection is closed.
        /// </summary>
        public byte[] Send(JObject message)
        {
            if (Closed) throw new TetherException(ErrorCode.Closed, "the connection is closed: " + Error.Message);
            JToken type = message["type"];
            MessageType? kind = type != null && type.Type == JTokenType.String ? Messages.FromWire((string)type) : null;
            if (kind == null) throw new TetherException(ErrorCode.InvalidArgument, "unknown message type " + (type == null ? "None" : type.ToString()));
            if (!Messages.IsRequest(kind.Value)) throw new TetherException(ErrorCode.InvalidArgument, "a client cannot send " + Messages.ToWire(kind.Value));
            byte[] frame = Messages.EncodeFrame(message);
            if (Messages.ExpectedResponse(kind.Value) != null) awaiting.Enqueue(kind.Value);
            return frame;
        }

        /// <summary>
        /// Records a request the caller framed itself (the I/O thread writes records straight
        /// to bytes): its answer is paired as <see cref="Send"/>'s would be. Throws as Send does.
        /// </summary>
        internal void Sent(MessageType kind)
        {
            if (Closed) throw new TetherException(ErrorCode.Closed, "the connection is closed: " + Error.Message);
            if (!Messages.IsRequest(kind)) throw new TetherException(ErrorCode.InvalidArgument, "a client cannot send " + Messages.ToWire(kind));
            if (Messages.ExpectedResponse(kind) != null) awaiting.Enqueue(kind);
        }

        /// <summary>
        /// Takes received bytes; appends the responses they complete. Throws the
        /// error that closed the connection (responses before it are appended first).
        /// </summary>
        public void ReceiveData(byte[] data, int offset, int count, List<Response> responses)
        {
            if (Closed) throw Error;
            bodies.Clear();
            TetherException framing = null;
            try
            {
                decoder.Feed(data, offset, count, bodies);
            }
            catch (ProtocolException e)
            {
                framing = e;
            }
            foreach (byte[] body in bodies)
            {
                try
                {
                    Handle(body, responses);
                }
                catch (TetherException e)
                {
                    Error = e;
                    throw;
                }
            }
            if (framing != null)
            {
                Error = framing;
                throw framing;
            }
        }

        void Handle(byte[] body, List<Response> responses)
        {
            Message message = Messages.Decode(body);
            if (message.Type == MessageType.Error)
            {
                JToken request = message.Body["request"];
                JToken code = message.Body["code"];
                bool connectionLevel = request == null && code != null && code.Type == JTokenType.String &&
                                       Messages.ClosesConnection(ErrorCodes.FromWire((string)code));
                var response = new Response { Message = message };
                bool answersEpisodes = request != null && request.Type == JTokenType.String && (string)request == "EPISODES";
                if (!answersEpisodes && awaiting.Count > 0 && !connectionLevel) response.Request = awaiting.Dequeue();
                responses.Add(response);
                if (connectionLevel)
                {
                    // The server closes after this; every outstanding request stays unanswered (§6.5).
                    ClosingError = message.Body;
                    throw new TetherException(ErrorCodes.FromWire((string)code), "the server closed the connection: " + (string)code);
                }
                return;
            }
            if (awaiting.Count == 0) throw new ProtocolException(ErrorCode.NotARequest, "unsolicited " + Messages.ToWire(message.Type) + " from server");
            MessageType pending = awaiting.Peek();
            MessageType? expected = Messages.ExpectedResponse(pending);
            if (expected == null || expected.Value != message.Type)
            {
                throw new ProtocolException(ErrorCode.UnknownType, "expected " + (expected == null ? "nothing" : Messages.ToWire(expected.Value)) +
                                            " for " + Messages.ToWire(pending) + ", got " + Messages.ToWire(message.Type));
            }
            awaiting.Dequeue();
            responses.Add(new Response { Request = pending, Message = message });
        }

        /// <summary>Forgets everything for a new connection.</summary>
        public void Reset()
        {
            decoder = new FrameDecoder(maxFrameBytes);
            awaiting.Clear();
            Error = null;
            ClosingError = null;
        }
    }

    /// <summary>
    /// Protocol 1.8 (§6.5, §7.2): the server run a connection reached, as its PONG's <c>run_id</c> names it,
    /// and whether steps acted with weights learned under one run may be sent to another. A server restarted
    /// without resuming counts weights versions from 0 again: the versions of steps acted with the old run's
    /// weights name other weights there, and no model of the new run explains their action_logp. The
    /// conformance vector <c>run_ids.json</c> pins the comparison.
    /// </summary>
    public static class ServerRuns
    {
        /// <summary>
        /// The server run <paramref name="pong"/> names (its <c>run_id</c>), or null when it names none: an
        /// older server, or a value that is not a non-empty string (treated as absent, §7.2).
        /// </summary>
        public static string RunIdOf(JObject pong)
        {
            JToken runId = pong == null ? null : pong["run_id"];
            return runId != null && runId.Type == JTokenType.String && ((string)runId).Length > 0 ? (string)runId : null;
        }

        /// <summary>
        /// Whether steps whose weights versions were learned on a connection to run <paramref name="actedIn"/>
        /// were acted with another run's weights than those of run <paramref name="connectedTo"/> (§6.5): only
        /// when both are known (not null) and differ, compared exactly (ordinal). Such steps are dropped, not
        /// sent; when either run is unknown the client cannot tell and sends them.
        /// </summary>
        public static bool FromAnotherRun(string actedIn, string connectedTo)
        {
            return actedIn != null && connectedTo != null && !string.Equals(actedIn, connectedTo, StringComparison.Ordinal);
        }
    }

    /// <summary>
    /// Protocol 1.9 (§6.7): a rank's client address, a host and a port, as <see cref="RankAddresses.Parse"/> reads
    /// <c>"host:port"</c> (an IPv6 host without its brackets). Two addresses are the same when their hosts are
    /// equal strings (ordinal) and their ports equal numbers.
    /// </summary>
    public struct RankAddress : IEquatable<RankAddress>
    {
        readonly string host;
        readonly int port;

        /// <summary>The address <paramref name="host"/>:<paramref name="port"/> (an IPv6 host without brackets).</summary>
        public RankAddress(string host, int port)
        {
            this.host = host ?? "";
            this.port = port;
        }

        /// <summary>The host: a name, an IPv4 address, or an IPv6 address without its brackets.</summary>
        public string Host { get { return host ?? ""; } }

        /// <summary>The port, 1 to 65535 for an address read by <see cref="RankAddresses.Parse"/>.</summary>
        public int Port { get { return port; } }

        /// <summary>Whether <paramref name="other"/> has the same host (ordinal) and port.</summary>
        public bool Equals(RankAddress other)
        {
            return port == other.port && string.Equals(Host, other.Host, StringComparison.Ordinal);
        }

        /// <summary>Whether <paramref name="obj"/> is a <see cref="RankAddress"/> equal to this one.</summary>
        public override bool Equals(object obj)
        {
            return obj is RankAddress && Equals((RankAddress)obj);
        }

        /// <summary>A hash of the host and port.</summary>
        public override int GetHashCode()
        {
            return StringComparer.Ordinal.GetHashCode(Host) * 31 + port;
        }

        /// <summary>Whether <paramref name="a"/> and <paramref name="b"/> are the same address.</summary>
        public static bool operator ==(RankAddress a, RankAddress b) { return a.Equals(b); }

        /// <summary>Whether <paramref name="a"/> and <paramref name="b"/> are different addresses.</summary>
        public static bool operator !=(RankAddress a, RankAddress b) { return !a.Equals(b); }

        /// <summary>The address as §6.7 writes it (<see cref="RankAddresses.Format"/>): <c>"host:port"</c>, an IPv6 host in brackets.</summary>
        public override string ToString() { return RankAddresses.Format(this); }
    }

    /// <summary>
    /// Protocol 1.9 (§6.7): servers in a group. Each rank of a group names every rank's client address in its
    /// PONG (<c>ranks</c>, §7.2) and may ask a client to move to another rank (<c>redirect</c>); a client remembers
    /// the ranks, follows a redirect at most once per connection attempt, and after losing a connection tries the
    /// lost address first and then the other ranks in order. These are the pure rules; the conformance vector
    /// <c>rank_addresses.json</c> pins them.
    /// </summary>
    public static class RankAddresses
    {
        /// <summary>The most entries of a PONG's <c>ranks</c> that are read (the rest are ignored).</summary>
        public const int MaxRanksRead = 1024;

        // The longest text read as an address, in characters (code points); longer is not one.
        const int MaxAddressChars = 300;

        /// <summary>
        /// <paramref name="value"/> read as <c>"host:port"</c> (§6.7), or null when it is not an address: not a
        /// string; the port (after the last <c>:</c>) not 1 to 65535 in at most 5 ASCII decimal digits (no sign);
        /// an IPv6 host not in brackets, or brackets holding no <c>:</c> (the brackets are taken off); any other
        /// host empty or holding <c>:</c>, <c>[</c> or <c>]</c>; a host holding whitespace; more than 300 characters.
        /// </summary>
        public static RankAddress? Parse(JToken value)
        {
            if (value == null || value.Type != JTokenType.String) return null;
            string text = (string)value;
            if (CodePoints(text) > MaxAddressChars) return null;
            int colon = text.LastIndexOf(':');
            if (colon < 0) return null;
            string host = text.Substring(0, colon);
            int digits = text.Length - colon - 1;
            if (digits < 1 || digits > 5) return null;
            int port = 0;
            for (int i = colon + 1; i < text.Length; ++i)
            {
                char c = text[i];
                if (c < '0' || c > '9') return null;
                port = port * 10 + (c - '0');
            }
            if (port < 1 || port > 65535) return null;
            if (host.Length >= 2 && host[0] == '[' && host[host.Length - 1] == ']')
            {
                host = host.Substring(1, host.Length - 2);
                if (host.Length == 0 || host.IndexOf('[') >= 0 || host.IndexOf(']') >= 0 || host.IndexOf(':') < 0) return null;
            }
            else if (host.Length == 0 || host.IndexOfAny(HostBreakers) >= 0)
            {
                return null;
            }
            foreach (char c in host)
            {
                if (IsSpace(c)) return null;
            }
            return new RankAddress(host, port);
        }

        static readonly char[] HostBreakers = { ':', '[', ']' };

        // Whitespace as Python's str.isspace reads it: char.IsWhiteSpace, and the separators U+001C to U+001F.
        static bool IsSpace(char c)
        {
            return char.IsWhiteSpace(c) || (c >= '\u001c' && c <= '\u001f');
        }

        static int CodePoints(string text)
        {
            int count = text.Length;
            for (int i = 1; i < text.Length; ++i)
            {
                if (char.IsLowSurrogate(text[i]) && char.IsHighSurrogate(text[i - 1])) --count;
            }
            return count;
        }

        /// <summary><paramref name="address"/> as §6.7 writes it: <c>"host:port"</c>, an IPv6 host (one holding <c>:</c>) in brackets.</summary>
        public static string Format(RankAddress address)
        {
            string host = address.Host;
            return host.IndexOf(':') >= 0 ? "[" + host + "]:" + address.Port : host + ":" + address.Port;
        }

        /// <summary>
        /// The ranks <paramref name="pong"/> names (its <c>ranks</c>, §7.2), in order, each once: entries that are
        /// not addresses are left out, at most the first <see cref="MaxRanksRead"/> entries are read, and a
        /// <c>ranks</c> that is not an array (or a PONG without one, or null) names none (an empty list).
        /// </summary>
        public static List<RankAddress> FromPong(JObject pong)
        {
            var found = new List<RankAddress>();
            var ranks = (pong == null ? null : pong["ranks"]) as JArray;
            if (ranks == null) return found;
            int read = Math.Min(ranks.Count, MaxRanksRead);
            for (int i = 0; i < read; ++i)
            {
                RankAddress? address = Parse(ranks[i]);
                if (address.HasValue && !found.Contains(address.Value)) found.Add(address.Value);
            }
            return found;
        }

        /// <summary>
        /// The rank <paramref name="pong"/> asks the client to move to (its <c>redirect</c>, §7.2), or null to stay:
        /// when the connection was itself made on a redirect (<paramref name="redirected"/>: a client moves at most
        /// once per attempt), when the value is not an address, or when it names <paramref name="current"/>, the
        /// address the client is connected to.
        /// </summary>
        public static RankAddress? RedirectOf(JObject pong, RankAddress current, bool redirected)
        {
            if (redirected || pong == null) return null;
            RankAddress? target = Parse(pong["redirect"]);
            return target.HasValue && target.Value != current ? target : null;
        }

        /// <summary>
        /// Where a client's connection attempts go after its connection to <paramref name="lost"/> ended (§6.7):
        /// the candidates are <paramref name="given"/> (the address the application gave), then the remembered
        /// <paramref name="ranks"/> that differ from it, each once; the list starts at <paramref name="lost"/> and
        /// wraps around, so attempt k goes to item k modulo its length (the first retries <paramref name="lost"/>).
        /// <paramref name="lost"/> heads the list when it is not a candidate. Never empty.
        /// </summary>
        public static List<RankAddress> ReconnectOrder(RankAddress given, IList<RankAddress> ranks, RankAddress lost)
        {
            var candidates = new List<RankAddress> { given };
            if (ranks != null)
            {
                foreach (RankAddress rank in ranks)
                {
                    if (!candidates.Contains(rank)) candidates.Add(rank);
                }
            }
            int start = candidates.IndexOf(lost);
            if (start < 0)
            {
                candidates.Insert(0, lost);
                start = 0;
            }
            var order = new List<RankAddress>(candidates.Count);
            for (int i = 0; i < candidates.Count; ++i) order.Add(candidates[(start + i) % candidates.Count]);
            return order;
        }
    }

    /// <summary>What a server makes of one received body: the accepted request, or the refusal to send.</summary>
    public sealed class ServerEvent
    {
        /// <summary>The message's type, when it could be read.</summary>
        public MessageType? Type { get; internal set; }
        /// <summary>The request, when accepted.</summary>
        public Message Message { get; internal set; }
        /// <summary>Null for an accepted request; else the ERROR's code and text.</summary>
        public TetherException Refusal { get; internal set; }
        /// <summary>Whether the server closes the connection after the refusal (a wrong token).</summary>
        public bool ClosesConnection { get; internal set; }
        /// <summary>Whether the request was accepted.</summary>
        public bool Accepted { get { return Refusal == null; } }
    }

    /// <summary>
    /// A server's side of the handshake (§6.2): version check, the auth token
    /// before anything else, requests only. Used by tests and by anyone writing
    /// a server in C#.
    /// </summary>
    public sealed class ServerConnection
    {
        readonly string authToken;

        /// <summary>A connection that requires <paramref name="authToken"/> (null: none).</summary>
        public ServerConnection(string authToken = null)
        {
            this.authToken = authToken;
            Ready = authToken == null;
        }

        /// <summary>Whether the client has authenticated (or no token is required).</summary>
        public bool Ready { get; private set; }

        /// <summary>The server's judgement of one body.</summary>
        public ServerEvent HandleBody(byte[] body)
        {
            var result = new ServerEvent();
            Message message;
            try
            {
                message = Messages.Decode(body);
            }
            catch (TetherException e)
            {
                result.Refusal = e;
                return result;
            }
            result.Type = message.Type;
            if (!Messages.IsRequest(message.Type))
            {
                result.Refusal = new TetherException(ErrorCode.NotARequest, Messages.ToWire(message.Type) + " is a response; a client may only send requests");
                return result;
            }
            if (message.Type == MessageType.Ping)
            {
                JToken version = message.Body["protocol_version"];
                if (version != null && version.Type != JTokenType.Null)
                {
                    string text = version.Type == JTokenType.String ? (string)version : version.ToString(Newtonsoft.Json.Formatting.None);
                    int[] parsed = Messages.ParseVersion(text);
                    if (parsed == null)
                    {
                        result.Refusal = new TetherException(ErrorCode.VersionMismatch, "unreadable protocol_version " + text);
                        return result;
                    }
                    if (parsed[0] != Messages.ParseVersion(Messages.ProtocolVersion)[0])
                    {
                        result.Refusal = new TetherException(ErrorCode.VersionMismatch, "client speaks RLlink " + text + ", this server speaks " +
                                                             Messages.ProtocolVersion + " (major versions must match)");
                        return result;
                    }
                }
                if (!Ready)
                {
                    JToken token = message.Body["auth_token"];
                    if (token == null)
                    {
                        result.Refusal = new TetherException(ErrorCode.AuthFailed, "missing auth_token");
                        return result;
                    }
                    if (token.Type != JTokenType.String || !SameToken((string)token, authToken))
                    {
                        result.Refusal = new TetherException(ErrorCode.AuthFailed, "wrong auth_token");
                        result.ClosesConnection = true;
                        return result;
                    }
                    Ready = true;
                }
            }
            else if (!Ready)
            {
                result.Refusal = new TetherException(ErrorCode.AuthFailed, Messages.ToWire(message.Type) + " before authentication: send PING with auth_token first");
                return result;
            }
            result.Message = message;
            return result;
        }

        // Constant-time comparison (no early exit on the first difference).
        static bool SameToken(string a, string b)
        {
            int diff = a.Length == b.Length ? 0 : 1;
            int n = Math.Min(a.Length, b.Length);
            for (int i = 0; i < n; ++i) diff |= a[i] ^ b[i];
            return diff == 0;
        }
    }
}
