// Error codes: the server's ERROR codes (docs/protocol.md §7.9) and the SDK's own.
using System.Collections.Generic;
using System.Text;

namespace Tether.Protocol
{
    /// <summary>
    /// What went wrong. The protocol codes are the ones a server sends in ERROR
    /// (or the ones this SDK gives a frame or message it refused); the SDK codes
    /// name failures on this side of the wire.
    /// </summary>
    public enum ErrorCode
    {
        // Protocol codes.
        /// <summary>A frame header that is not 8 ASCII digits.</summary>
        BadHeader,
        /// <summary>A frame body over the receiver's limit.</summary>
        FrameTooLarge,
        /// <summary>A body that is not valid UTF-8.</summary>
        InvalidUtf8,
        /// <summary>A body that is not valid JSON (or nests too deep).</summary>
        InvalidJson,
        /// <summary>A body that is JSON but not an object.</summary>
        NotAnObject,
        /// <summary>A body without "type".</summary>
        MissingType,
        /// <summary>A "type" that names no message.</summary>
        UnknownType,
        /// <summary>A server-to-client type sent to the server.</summary>
        NotARequest,
        /// <summary>A field of the wrong kind or value.</summary>
        InvalidField,
        /// <summary>Episode arrays of lengths that do not fit together.</summary>
        EpisodeLengthMismatch,
        /// <summary>An observation of the wrong size.</summary>
        ObsShapeMismatch,
        /// <summary>A NaN or infinite number where a finite one is needed.</summary>
        NonFiniteValue,
        /// <summary>An action outside its space.</summary>
        ActionOutOfSpace,
        /// <summary>A record without the action log-probabilities the server needs.</summary>
        MissingActionLogp,
        /// <summary>A missing or wrong auth token.</summary>
        AuthFailed,
        /// <summary>A protocol major version the peer does not speak.</summary>
        VersionMismatch,
        /// <summary>A module id the server does not have.</summary>
        UnknownModule,
        /// <summary>An agent id no policy-mapping rule matches.</summary>
        UnmappedAgent,
        /// <summary>An agent reported with another module than its mapping gives.</summary>
        ModuleMismatch,
        /// <summary>Steps of an agent that already finished its episode.</summary>
        AgentAlreadyDone,
        /// <summary>A group member reported on its own.</summary>
        GroupMemberOutsideGroup,
        /// <summary>Log-probabilities that do not match the claimed model.</summary>
        ActionLogpMismatch,
        /// <summary>The client's data kept making learner updates non-finite; its episodes are refused.</summary>
        DataRefused,
        /// <summary>
        /// A tensor object (protocol 1.4, §10.9) that cannot be read: a missing, unknown or mistyped
        /// member, another dtype, both or neither of offset and b64, an offset past the attachment's
        /// end, or b64 that is not padded standard base64 of exactly prod(shape) x size(dtype) bytes.
        /// </summary>
        InvalidTensor,
        /// <summary>
        /// Observations of another element type than their space's (protocol 1.4): a tensor of another
        /// dtype, or in a uint8 Box (a byte box, §8.1) a value that is not an integer from 0 to 255.
        /// Also raised locally by a client given such an observation for a byte box.
        /// </summary>
        ObsDtypeMismatch,
        /// <summary>
        /// A Dict or Tuple observation (protocol 1.4, §8.6) that lacks one of its leaves or has one that
        /// is no leaf of the space. Also raised locally by a client given such an observation.
        /// </summary>
        ObsLeafMismatch,
        /// <summary>An action mask (protocol 1.4, §11.6) holding a value other than 0 and 1. Also raised locally before sampling.</summary>
        InvalidActionMask,
        /// <summary>
        /// An action mask that allows no action (for MultiDiscrete: none for some entry) on an observation
        /// acted on (protocol 1.4, §11.6). Also raised locally before sampling.
        /// </summary>
        ActionMaskEmpty,
        /// <summary>An action its observation's mask forbids (protocol 1.4, §10.6 check 14d).</summary>
        ActionMasked,
        /// <summary>A record of a module with memory without its state_in (protocol 1.5, §10.6 check 19b).</summary>
        MissingState,
        /// <summary>A state_in of other names, size or values than the module's recurrent state, or one for a module without memory (protocol 1.5, checks 19a, 19d, 19e).</summary>
        InvalidState,
        /// <summary>A record of a module with memory of more than 10,000 steps (protocol 1.5, check 19c).</summary>
        SequenceTooLong,
        /// <summary>The server is at its connection limit.</summary>
        TooManyConnections,
        /// <summary>The handshake took longer than the server allows.</summary>
        HandshakeTimeout,
        /// <summary>The connection was silent longer than the server allows.</summary>
        ClientTimeout,
        /// <summary>The server holds too many unfinished frames.</summary>
        ServerOverloaded,
        /// <summary>Too many wrong auth tokens came from this address: its connections are refused for a while.</summary>
        AuthThrottled,
        /// <summary>
        /// The server's run is done (protocol 1.3, §6.6 "End of training"): sent unsolicited, with the
        /// run's summary, before the server closes the connection. Not a failure: the client does not
        /// reconnect and reports it as the end of training (TetherClient.TrainingDone); a request
        /// that was waiting fails with it.
        /// </summary>
        TrainingDone,
        /// <summary>The server failed on its side.</summary>
        Internal,
        /// <summary>An ERROR code this SDK does not know (a newer server).</summary>
        UnknownServerCode,
        // SDK codes.
        /// <summary>The caller passed something the call cannot take.</summary>
        InvalidArgument,
        /// <summary>Connecting failed, or the connection broke.</summary>
        ConnectionFailed,
        /// <summary>A wait ran past its limit.</summary>
        Timeout,
        /// <summary>The inference backend refused the model or the run.</summary>
        InferenceFailed,
        /// <summary>No configuration or model yet.</summary>
        NotReady,
        /// <summary>The client was closed.</summary>
        Closed,
    }

    /// <summary>The wire names of <see cref="ErrorCode"/> ("OBS_SHAPE_MISMATCH" for ObsShapeMismatch).</summary>
    public static class ErrorCodes
    {
        static readonly Dictionary<ErrorCode, string> Names = new Dictionary<ErrorCode, string>();
        static readonly Dictionary<string, ErrorCode> Codes = new Dictionary<string, ErrorCode>();

        static ErrorCodes()
        {
            foreach (ErrorCode code in System.Enum.GetValues(typeof(ErrorCode)))
            {
                string name = WireName(code.ToString());
                Names[code] = name;
                Codes[name] = code;
            }
        }

        // "ObsShapeMismatch" -> "OBS_SHAPE_MISMATCH", "InvalidUtf8" -> "INVALID_UTF8".
        static string WireName(string pascal)
        {
            var name = new StringBuilder();
            for (int i = 0; i < pascal.Length; ++i)
            {
                char c = pascal[i];
                if (i > 0 && char.IsUpper(c)) name.Append('_');
                name.Append(char.ToUpperInvariant(c));
            }
            return name.ToString();
        }

        /// <summary>The code's name on the wire.</summary>
        public static string ToWire(ErrorCode code) { return Names[code]; }

        /// <summary>The code a server sent; <see cref="ErrorCode.UnknownServerCode"/> for one this SDK does not know.</summary>
        public static ErrorCode FromWire(string name)
        {
            ErrorCode code;
            return name != null && Codes.TryGetValue(name, out code) ? code : ErrorCode.UnknownServerCode;
        }
    }
}
