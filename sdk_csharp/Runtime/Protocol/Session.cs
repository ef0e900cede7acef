// Connection state without I/O (docs/protocol.md §5-§6): which request a
// response answers on the client side, the server run a PONG names (1.8), and the
// server's handshake rules.
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
