// One TCP connection to the server: framed messages out, paired responses in, with deadlines.
using System;
using System.Collections.Generic;
using System.Net;
using System.Net.Sockets;
using System.Threading;
using Newtonsoft.Json.Linq;
using Tether.Protocol;

namespace Tether.Client
{
    /// <summary>The connection broke (or never came up); what is outstanding goes again on a new one.</summary>
    internal sealed class ConnectionLostException : TetherException
    {
        public ConnectionLostException(string message, ErrorCode code = ErrorCode.ConnectionFailed, JObject closingError = null) : base(code, message)
        {
            ClosingError = closingError;
        }

        /// <summary>The connection-level ERROR the server sent before closing (TRAINING_DONE's "summary" is in it), or null.</summary>
        public JObject ClosingError { get; private set; }
    }

    /// <summary>
    /// A blocking socket used by the I/O thread, with <see cref="ClientConnection"/>
    /// pairing its responses. <see cref="Close"/> may come from another thread (a
    /// client being disposed): the I/O thread's next call then fails as a lost connection.
    /// </summary>
    internal sealed class TcpTransport : IDisposable
    {
        readonly ClientOptions options;
        readonly ClientConnection connection;
        readonly byte[] readBuffer = new byte[1 << 16];
        readonly List<Response> pending = new List<Response>();
        // What ended the connection behind responses that arrived before it (a SET_STATE
        // followed by a connection-level ERROR in one read): raised once those are taken.
        ConnectionLostException lostAfterPending;
        Socket socket;
        // The socket of a connect in progress: Dispose() from another thread ends the attempt
        // at once, instead of after ConnectTimeoutSeconds.
        Socket connecting;
        volatile bool disposed;

        public TcpTransport(ClientOptions options)
        {
            this.options = options;
            connection = new ClientConnection(options.MaxFrameBytes);
            Target = new RankAddress(options.Host, options.Port);
        }

        public bool Connected { get { return socket != null; } }

        /// <summary>
        /// The address <see cref="Connect"/> connects to (I/O thread): the options' at first; (1.9, §6.7) a rank of
        /// the server's group when the link follows a redirect or reconnects to another rank.
        /// </summary>
        public RankAddress Target
        {
            get { return target; }
            set
            {
                target = value;
                address = RankAddresses.Format(value);
            }
        }

        RankAddress target;
        volatile string address;

        /// <summary>"host:port" of <see cref="Target"/> (an IPv6 host in brackets), as errors name it.</summary>
        public string Address { get { return address; } }

        public void Connect()
        {
            Close();
            if (disposed) throw Abandoned();
            connection.Reset();
            pending.Clear();
            lostAfterPending = null;
            string host = target.Host;
            IPAddress[] addresses;
            try
            {
                addresses = Dns.GetHostAddresses(host);
            }
            catch (SocketException e)
            {
                throw new ConnectionLostException("cannot resolve " + host + ": " + e.Message);
            }
            if (addresses.Length == 0) throw new ConnectionLostException("cannot resolve " + host + ": it names no address");
            // An IPv4 address first; else the first one (an IPv6 host, "[fd00::5]:9100" in a group's ranks, §6.7).
            IPAddress chosen = Array.Find(addresses, a => a.AddressFamily == AddressFamily.InterNetwork) ?? addresses[0];
            var s = new Socket(chosen.AddressFamily, SocketType.Stream, ProtocolType.Tcp);
            Interlocked.Exchange(ref connecting, s);  // (a full fence: Dispose sees it, or it sees Dispose's flag)
            try
            {
                if (disposed) throw Abandoned();  // closed while the name was being resolved
                IAsyncResult attempt = s.BeginConnect(chosen, target.Port, null, null);
                if (!attempt.AsyncWaitHandle.WaitOne(TimeSpan.FromSeconds(options.ConnectTimeoutSeconds)))
                {
                    throw new ConnectionLostException("connecting to " + Address + " took longer than " + options.ConnectTimeoutSeconds + " s (ConnectTimeoutSeconds)", ErrorCode.Timeout);
                }
                if (disposed) throw Abandoned();
                s.EndConnect(attempt);
                s.NoDelay = true;
                s.SetSocketOption(SocketOptionLevel.Socket, SocketOptionName.KeepAlive, true);
                socket = s;
                if (disposed)  // (disposed between the check and the assignment: nothing stays open)
                {
                    Close();
                    throw Abandoned();
                }
            }
            catch (SocketException e)
            {
                s.Close();
                if (disposed) throw Abandoned();
                throw new ConnectionLostException("cannot connect to " + Address + ": " + e.Message);
            }
            catch (ObjectDisposedException)
            {
                s.Close();
                if (disposed) throw Abandoned();
                throw new ConnectionLostException("connecting to " + Address + " failed: its socket was closed");
            }
            catch
            {
                s.Close();
                throw;
            }
            finally
            {
                Interlocked.CompareExchange(ref connecting, null, s);
            }
        }

        ConnectionLostException Abandoned()
        {
            return new ConnectionLostException("connecting to " + Address + " was abandoned: the client is closing", ErrorCode.Closed);
        }

        Socket Open()
        {
            Socket s = socket;
            if (s == null) throw new ConnectionLostException("not connected to " + Address);
            return s;
        }

        public void Send(JObject message)
        {
            if (lostAfterPending != null) throw lostAfterPending;
            Socket s = Open();
            byte[] frame;
            try
            {
                frame = connection.Send(message);
            }
            catch (TetherException e) when (connection.Closed)
            {
                throw new ConnectionLostException("server " + Address + ": " + e.Message, e.Code);
            }
            Write(s, frame, frame.Length);
        }

        /// <summary>Sends a request of <paramref name="kind"/> the caller framed: the first <paramref name="length"/> bytes of <paramref name="frame"/>.</summary>
        public void Send(MessageType kind, byte[] frame, int length)
        {
            if (lostAfterPending != null) throw lostAfterPending;
            Socket s = Open();
            try
            {
                connection.Sent(kind);
            }
            catch (TetherException e) when (connection.Closed)
            {
                throw new ConnectionLostException("server " + Address + ": " + e.Message, e.Code);
            }
            Write(s, frame, length);
        }

        void Write(Socket s, byte[] frame, int length)
        {
            try
            {
                int sent = 0;
                while (sent < length) sent += s.Send(frame, sent, length - sent, SocketFlags.None);
            }
            catch (SocketException e)
            {
                throw new ConnectionLostException("sending to " + Address + " failed: " + e.Message);
            }
            catch (ObjectDisposedException)
            {
                throw new ConnectionLostException("the connection to " + Address + " was closed");
            }
        }

        /// <summary>The next response, waiting at most until <paramref name="deadline"/>; TIMEOUT names the wait and its setting.</summary>
        public Response Receive(DateTime deadline, string waitingFor, string setting, double seconds)
        {
            while (pending.Count == 0)
            {
                if (lostAfterPending != null) throw lostAfterPending;
                TimeSpan left = deadline - DateTime.UtcNow;
                if (left <= TimeSpan.Zero)
                {
                    throw new TetherException(ErrorCode.Timeout, "server " + Address + " did not answer " + waitingFor + " within " + seconds + " s (" + setting + ")");
                }
                if (!Readable((int)Math.Min(left.TotalMilliseconds * 1000, 200000))) continue;
                ReadAvailable();
            }
            Response first = pending[0];
            pending.RemoveAt(0);
            return first;
        }

        /// <summary>Whether bytes (or the end of the stream) are waiting, within <paramref name="microseconds"/>.</summary>
        public bool Readable(int microseconds)
        {
            if (lostAfterPending != null) return true;  // ReadAvailable raises it
            Socket s = Open();
            try
            {
                return s.Poll(Math.Max(0, microseconds), SelectMode.SelectRead);
            }
            catch (SocketException e)
            {
                throw new ConnectionLostException("the connection to " + Address + " failed: " + e.Message);
            }
            catch (ObjectDisposedException)
            {
                throw new ConnectionLostException("the connection to " + Address + " was closed");
            }
        }

        /// <summary>Reads what arrived (the socket is readable); responses queue for <see cref="Receive"/>.</summary>
        public void ReadAvailable()
        {
            if (lostAfterPending != null) throw lostAfterPending;
            Socket s = Open();
            int read;
            try
            {
                read = s.Receive(readBuffer);
            }
            catch (SocketException e)
            {
                throw new ConnectionLostException("receiving from " + Address + " failed: " + e.Message);
            }
            catch (ObjectDisposedException)
            {
                throw new ConnectionLostException("the connection to " + Address + " was closed");
            }
            if (read == 0) throw new ConnectionLostException("server " + Address + " closed the connection");
            try
            {
                connection.ReceiveData(readBuffer, 0, read, pending);
            }
            catch (TetherException e)
            {
                // A framing error, a protocol violation or a connection-level ERROR: this connection is
                // over, but the responses that came before it are answers and are taken first (an
                // answered batch must not be sent again).
                var lost = new ConnectionLostException("server " + Address + ": " + e.Message, e.Code, connection.ClosingError);
                if (pending.Count == 0) throw lost;
                lostAfterPending = lost;
            }
        }

        /// <summary>Responses already read (an unsolicited ERROR, for instance).</summary>
        public List<Response> Pending { get { return pending; } }

        public void Close()
        {
            Socket s = Interlocked.Exchange(ref socket, null);
            if (s == null) return;
            try
            {
                s.Shutdown(SocketShutdown.Both);
            }
            catch (SocketException)
            {
            }
            catch (ObjectDisposedException)
            {
            }
            s.Close();
        }

        /// <summary>Closes for good, from any thread: a connect in progress is abandoned at once
        /// (its wait ends as its socket closes) and no later one starts.</summary>
        public void Dispose()
        {
            disposed = true;
            Socket attempt = Interlocked.Exchange(ref connecting, null);
            if (attempt != null) attempt.Close();
            Close();
        }
    }
}
