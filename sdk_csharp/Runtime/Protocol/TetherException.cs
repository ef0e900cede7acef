// Errors as types: every failure the SDK reports is a TetherException carrying an ErrorCode.
using System;

namespace Tether.Protocol
{
    /// <summary>A failure the SDK reports, with the <see cref="ErrorCode"/> that names it.</summary>
    public class TetherException : Exception
    {
        /// <summary>What went wrong.</summary>
        public ErrorCode Code { get; private set; }

        /// <summary>The message without the code in front of it.</summary>
        public string Detail { get; private set; }

        /// <summary>An error with its code and a message that says what happened.</summary>
        public TetherException(ErrorCode code, string message) : base(ErrorCodes.ToWire(code) + ": " + message)
        {
            Code = code;
            Detail = message;
        }

        /// <summary>An error caused by another exception.</summary>
        public TetherException(ErrorCode code, string message, Exception inner)
            : base(ErrorCodes.ToWire(code) + ": " + message, inner)
        {
            Code = code;
            Detail = message;
        }
    }

    /// <summary>A frame or message this SDK refused (bad header, invalid JSON, unknown type...).</summary>
    public class ProtocolException : TetherException
    {
        /// <summary>A refused frame or message.</summary>
        public ProtocolException(ErrorCode code, string message) : base(code, message) { }
    }

    /// <summary>The server answered with ERROR: its code, message and the request it refused.</summary>
    public class ServerErrorException : TetherException
    {
        /// <summary>The code as the server wrote it (also for one this SDK does not know).</summary>
        public string ServerCode { get; private set; }

        /// <summary>The request type the server refused, when it said.</summary>
        public string Request { get; private set; }

        /// <summary>A refusal from the server.</summary>
        public ServerErrorException(string serverCode, string message, string request)
            : base(ErrorCodes.FromWire(serverCode), "server refused " + (request ?? "a request") + " with " + serverCode + ": " + message)
        {
            ServerCode = serverCode;
            Request = request;
        }
    }
}
