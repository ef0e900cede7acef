// A server on a loopback port for the clients' tests: real sockets, real frames.
using System;
using System.Collections.Generic;
using System.Net;
using System.Net.Sockets;
using System.Threading;
using Newtonsoft.Json.Linq;
using Tether.Protocol;

namespace Tether.Tests
{
    /// <summary>
    /// Accepts connections on a loopback port, serves each on its own thread and hands every
    /// message received to <see cref="Answer"/>; closes them all when disposed.
    /// </summary>
    internal abstract class LoopbackServer : IDisposable
    {
        readonly TcpListener listener;
        readonly List<Socket> sockets = new List<Socket>();
        volatile bool closing;
        int connections;

        protected LoopbackServer()
        {
            listener = new TcpListener(IPAddress.Loopback, 0);
            listener.Start();
            new Thread(Accept) { IsBackground = true }.Start();
        }

        public int Port { get { return ((IPEndPoint)listener.LocalEndpoint).Port; } }

        /// <summary>Connections accepted so far.</summary>
        public int Connections { get { return Volatile.Read(ref connections); } }

        /// <summary>
        /// Answers <paramref name="message"/>, received on the connection <paramref name="connection"/>
        /// (counted from 0); false closes that connection.
        /// </summary>
        protected abstract bool Answer(Socket socket, int connection, Message message);

        protected static void Send(Socket socket, JObject message) { socket.Send(Messages.EncodeFrame(message)); }

        void Accept()
        {
            while (!closing)
            {
                Socket socket;
                try
                {
                    socket = listener.AcceptSocket();
                }
                catch (Exception)
                {
                    return;
                }
                int index = Interlocked.Increment(ref connections) - 1;
                lock (sockets) sockets.Add(socket);
                new Thread(() => Serve(socket, index)) { IsBackground = true }.Start();
            }
        }

        void Serve(Socket socket, int connection)
        {
            var decoder = new FrameDecoder();
            var bodies = new List<byte[]>();
            var buffer = new byte[1 << 16];
            try
            {
                while (!closing)
                {
                    int read = socket.Receive(buffer);
                    if (read == 0) return;
                    bodies.Clear();
                    decoder.Feed(buffer, 0, read, bodies);
                    foreach (byte[] body in bodies)
                    {
                        if (!Answer(socket, connection, Messages.Decode(body))) return;
                    }
                }
            }
            catch (Exception)
            {
            }
            finally
            {
                socket.Close();
            }
        }

        /// <summary>
        /// Sends <paramref name="error"/> (a connection-level ERROR: no "request") on every connection
        /// open now and closes them, as a server does after TRAINING_DONE or CLIENT_TIMEOUT (§6.6).
        /// </summary>
        public void Close(JObject error)
        {
            byte[] frame = Messages.EncodeFrame(error);
            lock (sockets)
            {
                foreach (Socket s in sockets)
                {
                    try
                    {
                        s.Send(frame);
                        s.Shutdown(SocketShutdown.Both);
                    }
                    catch (Exception)
                    {
                    }
                    s.Close();
                }
                sockets.Clear();
            }
        }

        /// <summary>Closes every connection open now (the server stays up): the clients reconnect.</summary>
        public void DropConnections()
        {
            lock (sockets)
            {
                foreach (Socket s in sockets) s.Close();
                sockets.Clear();
            }
        }

        /// <summary>Stops accepting connections (the port is then refused); the open ones stay.</summary>
        public void StopListening()
        {
            listener.Stop();
        }

        public virtual void Dispose()
        {
            closing = true;
            listener.Stop();
            lock (sockets)
            {
                foreach (Socket s in sockets) s.Close();
            }
        }
    }
}
