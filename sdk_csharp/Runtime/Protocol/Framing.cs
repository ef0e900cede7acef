// RLlink framing (docs/protocol.md §3): an 8-digit ASCII length, then the body.
using System;
using System.Collections.Generic;
using System.Text;

namespace Tether.Protocol
{
    /// <summary>Writing frames: the body's length as 8 ASCII digits, then the body.</summary>
    public static class Framing
    {
        /// <summary>Bytes of the length header.</summary>
        public const int HeaderSize = 8;

        /// <summary>The largest body an 8-digit header can announce.</summary>
        public const int MaxEncodableBody = 99999999;

        /// <summary>The default limit on a received body (64 MiB).</summary>
        public const int DefaultMaxFrameBytes = 64 * 1024 * 1024;

        /// <summary>A frame of <paramref name="body"/>; FRAME_TOO_LARGE when it does not fit the header.</summary>
        public static byte[] Encode(byte[] body)
        {
            if (body == null) throw new ArgumentNullException("body");
            if (body.Length > MaxEncodableBody)
            {
                throw new ProtocolException(ErrorCode.FrameTooLarge,
                    "a body of " + body.Length + " bytes does not fit an 8-digit header");
            }
            var frame = new byte[HeaderSize + body.Length];
            int length = body.Length;
            for (int i = HeaderSize - 1; i >= 0; --i)
            {
                frame[i] = (byte)('0' + length % 10);
                length /= 10;
            }
            Buffer.BlockCopy(body, 0, frame, HeaderSize, body.Length);
            return frame;
        }
    }

    /// <summary>
    /// Splits a byte stream into frame bodies, whatever pieces it arrives in
    /// (Sans-I/O: it never reads a socket). After an error it stays failed: the
    /// stream cannot be resynchronised, the connection has to go.
    /// </summary>
    public sealed class FrameDecoder
    {
        readonly int maxFrameBytes;
        byte[] buffer = new byte[4096];
        int start;  // first unread byte
        int end;    // one past the last byte received
        ProtocolException error;

        /// <summary>A decoder refusing bodies over <paramref name="maxFrameBytes"/> (FRAME_TOO_LARGE).</summary>
        public FrameDecoder(int maxFrameBytes = Framing.DefaultMaxFrameBytes)
        {
            if (maxFrameBytes < 0) throw new ArgumentOutOfRangeException("maxFrameBytes");
            this.maxFrameBytes = maxFrameBytes;
        }

        /// <summary>The error that stopped the decoder, or null.</summary>
        public ProtocolException Error { get { return error; } }

        /// <summary>
        /// Adds received bytes and appends every body they complete to
        /// <paramref name="bodies"/>. Throws the <see cref="ProtocolException"/>
        /// (BAD_HEADER, FRAME_TOO_LARGE) that stopped the decoder; bodies
        /// completed before the bad frame are appended first.
        /// </summary>
        public void Feed(byte[] data, int offset, int count, List<byte[]> bodies)
        {
            if (error != null) throw error;
            Append(data, offset, count);
            byte[] body;
            while ((body = NextBody()) != null) bodies.Add(body);
        }

        /// <summary><see cref="Feed(byte[], int, int, List{byte[]})"/> for a whole array.</summary>
        public void Feed(byte[] data, List<byte[]> bodies) { Feed(data, 0, data.Length, bodies); }

        void Append(byte[] data, int offset, int count)
        {
            if (end + count > buffer.Length)
            {
                int unread = end - start;
                if (unread + count <= buffer.Length && start > 0)
                {
                    Buffer.BlockCopy(buffer, start, buffer, 0, unread);  // compact in place
                }
                else
                {
                    int size = buffer.Length;
                    while (size < unread + count) size = size <= int.MaxValue / 2 ? size * 2 : int.MaxValue;
                    var grown = new byte[size];
                    Buffer.BlockCopy(buffer, start, grown, 0, unread);
                    buffer = grown;
                }
                start = 0;
                end = unread;
            }
            Buffer.BlockCopy(data, offset, buffer, end, count);
            end += count;
        }

        byte[] NextBody()
        {
            if (end - start < Framing.HeaderSize) return null;
            long length = 0;
            for (int i = 0; i < Framing.HeaderSize; ++i)
            {
                byte c = buffer[start + i];
                if (c < '0' || c > '9') Fail(ErrorCode.BadHeader, "frame header must be 8 ASCII digits, got '" + Shown(start) + "'");
                length = length * 10 + (c - '0');
            }
            if (length > maxFrameBytes)
            {
                Fail(ErrorCode.FrameTooLarge, "frame body of " + length + " bytes exceeds the limit of " + maxFrameBytes + " bytes");
            }
            if (end - start - Framing.HeaderSize < length) return null;
            var body = new byte[length];
            Buffer.BlockCopy(buffer, start + Framing.HeaderSize, body, 0, (int)length);
            start += Framing.HeaderSize + (int)length;
            if (start == end) start = end = 0;
            return body;
        }

        string Shown(int at)
        {
            var shown = new StringBuilder();
            for (int i = 0; i < Framing.HeaderSize; ++i)
            {
                byte b = buffer[at + i];
                if (b >= 0x20 && b < 0x7f) shown.Append((char)b);
                else shown.Append("\\x").Append(b.ToString("x2"));
            }
            return shown.ToString();
        }

        void Fail(ErrorCode code, string message)
        {
            error = new ProtocolException(code, message);
            buffer = new byte[0];
            start = end = 0;
            throw error;
        }
    }
}
