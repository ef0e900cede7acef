// A loopback server whose answers depend on the connection: the reconnect scenarios of
// ReconnectNewSpacesTests and RecurrentTests.
using System;
using System.Collections.Generic;
using System.Linq;
using System.Net.Sockets;
using System.Threading;
using Newtonsoft.Json.Linq;
using Tether.Protocol;

namespace Tether.Tests
{
    /// <summary>
    /// Answers by connection (0, 1, ...): its PONG (<see cref="PongVersion"/>, <see cref="RunIdOf"/>),
    /// its SET_CONFIG, its handshake's SET_STATE, and the answer to its n-th batch (null: the
    /// connection is lost with the batch unanswered, once <see cref="Release"/> is set). Keeps every
    /// batch received.
    /// </summary>
    internal class ReconnectingServer : LoopbackServer
    {
        readonly List<JObject> batches = new List<JObject>();
        readonly Dictionary<int, int> answered = new Dictionary<int, int>();  // batches answered, by connection
        public Func<int, JObject> ConfigOf;
        public Func<int, JObject> StateOf;
        public Func<int, int, JObject> BatchAnswer;
        public readonly ManualResetEventSlim Release = new ManualResetEventSlim(true);
        public string PongVersion = "1.3";
        public Func<int, string> RunIdOf;  // (1.8) the run_id of connection n's PONG; null: none

        /// <summary>Each batch once (a resend after the reconnect has the same batch_seq and records).</summary>
        public List<JObject> Batches()
        {
            var seen = new HashSet<long>();
            lock (batches) return batches.Where(b => seen.Add((long)b["batch_seq"])).ToList();
        }

        /// <summary>Every batch received, in order (a resend as often as it came).</summary>
        public List<JObject> Received()
        {
            lock (batches) return new List<JObject>(batches);
        }

        /// <summary>The records of <see cref="Batches"/>, in order.</summary>
        public List<JObject> Records() { return Batches().SelectMany(b => ((JArray)b["episodes"]).Cast<JObject>()).ToList(); }

        protected override bool Answer(Socket socket, int connection, Message decoded)
        {
            JObject message = decoded.Body;
            switch ((string)message["type"])
            {
                case "PING":
                    var pong = new JObject { { "type", "PONG" }, { "protocol_version", PongVersion } };
                    string runId = RunIdOf == null ? null : RunIdOf(connection);
                    if (runId != null) pong["run_id"] = runId;
                    Send(socket, pong);
                    break;
                case "GET_CONFIG": Send(socket, ConfigOf(connection)); break;
                case "GET_STATE": Send(socket, StateOf(connection)); break;
                case "EPISODES_AND_GET_STATE":
                    int n;
                    lock (batches)
                    {
                        batches.Add(message);
                        answered.TryGetValue(connection, out n);
                        answered[connection] = ++n;
                    }
                    JObject answer = BatchAnswer(connection, n);
                    if (answer == null)
                    {
                        Release.Wait(10000);
                        return false;  // (the batch is lost with the connection)
                    }
                    Send(socket, answer);
                    break;
            }
            return true;
        }

        public override void Dispose()
        {
            Release.Set();
            base.Dispose();
        }
    }
}
