// Protocol 1.9: servers in a group (§6.7). A rank's PONG names every rank's address (ranks) and may ask a
// client to move to another rank (redirect): the client sends nothing more there, connects to the rank named
// saying it was redirected, and comes back when that rank cannot be reached; a redirect on a connection made on
// a redirect is not followed. When its rank goes away, the client reconnects to the ranks it learned, the lost
// one first, and resends its unanswered batch there with the same client_session and batch_seq. The scenarios
// of the Python SDK's group tests, over real sockets; the pure rules run in ConformanceTests
// (rank_addresses.json) and below.
using System;
using System.Collections.Generic;
using System.Linq;
using System.Net;
using System.Net.Sockets;
using System.Threading;
using Newtonsoft.Json.Linq;
using NUnit.Framework;
using Tether.Client;
using Tether.Protocol;

namespace Tether.Tests
{
    [TestFixture]
    public class RankGroupTests
    {
        // A rank: a 1.9 server batching every 10 steps.
        static ScriptedServer Rank()
        {
            return new ScriptedServer(10) { PongVersion = "1.9", Seq = 2 };
        }

        static string AddressOf(ScriptedServer server) { return "127.0.0.1:" + server.Port; }

        static JObject Group(params string[] ranks) { return new JObject { { "ranks", new JArray(ranks) } }; }

        static JObject Redirecting(string to, params string[] ranks)
        {
            JObject fields = Group(ranks);
            fields["redirect"] = to;
            return fields;
        }

        static ClientOptions Options(ScriptedServer server)
        {
            return new ClientOptions
            {
                Port = server.Port, Seed = 9, ReconnectTimeoutSeconds = 5, ConnectTimeoutSeconds = 2, ResponseTimeoutSeconds = 5,
                UpdateTimeoutSeconds = 5, WaitForWeights = false, WhenQueueFull = QueueFullPolicy.Wait, BackendFactory = () => new ConstantBackend(),
            };
        }

        // A loopback port nobody listens on (taken and given back).
        static int DeadPort()
        {
            var listener = new TcpListener(IPAddress.Loopback, 0);
            listener.Start();
            int port = ((IPEndPoint)listener.LocalEndpoint).Port;
            listener.Stop();
            return port;
        }

        static float[] Obs(float value) { return new[] { value, value, value, value }; }

        // One episode of `steps` steps, sent and answered.
        static void Play(TetherClient client, int steps)
        {
            var action = new double[1];
            string a = client.StartEpisode("e");
            for (int t = 0; t < steps; ++t)
            {
                client.GetAction(a, Obs(t), action);
                client.LogReturns(a, 1.0);
            }
            client.EndEpisode(a, Obs(-1));
            client.Flush(10);
            Assert.That(client.FatalError, Is.Null);
        }

        static bool Redirected(JObject ping)
        {
            JToken value = ping["redirected"];
            return value != null && value.Type == JTokenType.Boolean && (bool)value;
        }

        [Test]
        public void ARedirectIsFollowedBeforeAnythingButPingIsSent()
        {
            using (ScriptedServer a = Rank())
            using (ScriptedServer b = Rank())
            {
                a.PongFields = Redirecting(AddressOf(b), AddressOf(a), AddressOf(b));
                b.PongFields = Group(AddressOf(a), AddressOf(b));
                using (TetherClient client = TetherClient.Connect(Options(a)))
                {
                    Assert.That(client.ConnectedAddress, Is.EqualTo(AddressOf(b)));
                    Assert.That(client.Redirects, Is.EqualTo(1));
                    Assert.That(client.link.Redirects, Is.EqualTo(1));
                    Play(client, 25);
                    Assert.That(client.Reconnects, Is.EqualTo(0), "a redirect is no reconnect");
                    Assert.That(client.link.Connections, Is.EqualTo(1), "nor a connection of the client's");
                    Assert.That(a.Connections, Is.EqualTo(1));
                    Assert.That(a.ReceivedCount, Is.EqualTo(1), "A received nothing after PING");
                    Assert.That(Redirected(a.Received("PING")[0]), Is.False);
                    Assert.That(a.Received("PING")[0]["redirected"], Is.Null, "a PING not made on a redirect says nothing");
                    List<JObject> pings = b.Received("PING");
                    Assert.That(pings.Count, Is.EqualTo(1));
                    Assert.That(pings[0]["redirected"].Type, Is.EqualTo(JTokenType.Boolean));
                    Assert.That(Redirected(pings[0]), Is.True, "B's PING says the client was redirected");
                    Assert.That(b.Received("GET_CONFIG").Count, Is.EqualTo(1));
                    List<JObject> batches = b.Received("EPISODES_AND_GET_STATE");
                    Assert.That(batches.Sum(m => (int)m["env_steps"]), Is.EqualTo(25));
                    Assert.That(batches.Select(m => (string)m["client_session"]), Is.All.EqualTo(client.ClientSession));
                }
            }
        }

        [Test]
        public void ARankThatCannotBeReachedSendsTheClientBackSayingItWasRedirected()
        {
            string dead = "127.0.0.1:" + DeadPort();
            using (ScriptedServer a = Rank())
            {
                a.PongFields = Redirecting(dead, AddressOf(a), dead);
                using (TetherClient client = TetherClient.Connect(Options(a)))
                {
                    Assert.That(client.ConnectedAddress, Is.EqualTo(AddressOf(a)));
                    Assert.That(client.Redirects, Is.EqualTo(0), "the redirect was not followed through");
                    Play(client, 15);
                    Assert.That(client.Reconnects, Is.EqualTo(0));
                    Assert.That(client.link.Connections, Is.EqualTo(1));
                    List<JObject> pings = a.Received("PING");
                    Assert.That(pings.Count, Is.EqualTo(2));
                    Assert.That(Redirected(pings[0]), Is.False);
                    Assert.That(Redirected(pings[1]), Is.True, "back on A, the PING says the client was redirected (so A keeps it)");
                    Assert.That(a.Connections, Is.EqualTo(2));
                    Assert.That(a.Received("GET_CONFIG").Count, Is.EqualTo(1), "nothing but PING went on the first connection");
                    Assert.That(a.Received("EPISODES_AND_GET_STATE").Sum(m => (int)m["env_steps"]), Is.EqualTo(15), "A served the client");
                }
            }
        }

        [Test]
        public void ARedirectOnAConnectionMadeOnARedirectIsNotFollowed()
        {
            using (ScriptedServer a = Rank())
            using (ScriptedServer b = Rank())
            {
                a.PongFields = Redirecting(AddressOf(b), AddressOf(a), AddressOf(b));
                b.PongFields = Redirecting(AddressOf(a), AddressOf(a), AddressOf(b));  // (a server that breaks §6.7's rule)
                using (TetherClient client = TetherClient.Connect(Options(a)))
                {
                    Assert.That(client.ConnectedAddress, Is.EqualTo(AddressOf(b)));
                    Play(client, 12);
                    Assert.That(client.Redirects, Is.EqualTo(1));
                    Assert.That(a.Connections, Is.EqualTo(1), "the client did not go back to A");
                    Assert.That(a.ReceivedCount, Is.EqualTo(1));
                    Assert.That(b.Connections, Is.EqualTo(1));
                    Assert.That(Redirected(b.Received("PING")[0]), Is.True);
                    Assert.That(b.Received("EPISODES_AND_GET_STATE").Sum(m => (int)m["env_steps"]), Is.EqualTo(12), "B served the client");
                }
            }
        }

        // A goes away (closes its connection and stops listening) while batch 1 is unanswered: the first attempt
        // retries A (refused), the next goes to B, which the client knows only from A's ranks, and batch 1 goes
        // there with the same client_session and batch_seq.
        [Test]
        public void WhenItsRankGoesAwayTheClientReconnectsToAnotherAndResendsItsBatch()
        {
            using (ScriptedServer a = Rank())
            using (ScriptedServer b = Rank())
            {
                a.PongFields = Group(AddressOf(a), AddressOf(b));
                b.PongFields = Group(AddressOf(a), AddressOf(b));
                a.DropOnceSeq = 1;
                a.DropGate.Reset();
                using (TetherClient client = TetherClient.Connect(Options(a)))
                {
                    Assert.That(client.ConnectedAddress, Is.EqualTo(AddressOf(a)));
                    var action = new double[1];
                    string e = client.StartEpisode("e");
                    for (int t = 0; t < 12; ++t)  // the 11th cuts batch 1 (steps 0-9)
                    {
                        client.GetAction(e, Obs(t), action);
                        client.LogReturns(e, 1.0);
                    }
                    DateTime deadline = DateTime.UtcNow.AddSeconds(5);
                    while (a.Received("EPISODES_AND_GET_STATE").Count == 0 && DateTime.UtcNow < deadline) Thread.Sleep(5);
                    JObject sent = a.Received("EPISODES_AND_GET_STATE").Single();
                    Assert.That((long)sent["batch_seq"], Is.EqualTo(1));
                    a.StopListening();
                    a.Dispose();  // (closes the connection, batch 1 unanswered)
                    for (int t = 12; t < 30; ++t)
                    {
                        client.GetAction(e, Obs(t), action);
                        client.LogReturns(e, 1.0);
                    }
                    client.EndEpisode(e, Obs(-1));
                    client.Flush(10);
                    Assert.That(client.FatalError, Is.Null);
                    Assert.That(client.ConnectedAddress, Is.EqualTo(AddressOf(b)));
                    Assert.That(client.Reconnects, Is.EqualTo(1));
                    Assert.That(client.Redirects, Is.EqualTo(0));
                    Assert.That(client.link.Connections, Is.EqualTo(2));
                    Assert.That(Redirected(b.Received("PING")[0]), Is.False, "a reconnect is no redirect");
                    List<JObject> batches = b.Received("EPISODES_AND_GET_STATE");
                    Assert.That((long)batches[0]["batch_seq"], Is.EqualTo(1), "batch 1 went again, to B");
                    Assert.That((string)batches[0]["client_session"], Is.EqualTo((string)sent["client_session"]));
                    Assert.That((string)batches[0]["client_session"], Is.EqualTo(client.ClientSession));
                    Assert.That(JToken.DeepEquals(batches[0]["episodes"], sent["episodes"]), Is.True, "the same records");
                    Assert.That(batches.Select(m => (long)m["batch_seq"]), Is.Ordered);
                    Assert.That(batches.Sum(m => (int)m["env_steps"]), Is.EqualTo(30), "every step reached B once");
                    foreach (JObject batch in batches) b.Validate(batch);
                }
            }
        }

        // The pure rules beyond the vector's cases.
        [Test]
        public void AddressesReadAndWriteBack()
        {
            Assert.That(RankAddresses.Parse("10.0.0.5:9100"), Is.EqualTo(new RankAddress("10.0.0.5", 9100)));
            Assert.That(RankAddresses.Parse("[::1]:1").Value.Host, Is.EqualTo("::1"));
            Assert.That(RankAddresses.Parse("h:09100"), Is.EqualTo(new RankAddress("h", 9100)));
            Assert.That(RankAddresses.Parse("h:100000"), Is.Null);
            Assert.That(RankAddresses.Parse("h:"), Is.Null);
            Assert.That(RankAddresses.Parse("h\u001f:1"), Is.Null, "Python's isspace() also names U+001C..U+001F");
            Assert.That(RankAddresses.Parse("[a]:1"), Is.Null, "brackets hold an IPv6 address");
            Assert.That(RankAddresses.Parse("[a:b]x:1"), Is.Null);
            Assert.That(RankAddresses.Parse(new string('h', 294) + ":9100"), Is.Not.Null);
            Assert.That(RankAddresses.Parse(new string('h', 296) + ":9100"), Is.Null, "over 300 characters");
            Assert.That(RankAddresses.Parse(JToken.Parse("[\"h:1\"]")), Is.Null);
            Assert.That(RankAddresses.Format(new RankAddress("fd00::5", 9100)), Is.EqualTo("[fd00::5]:9100"));
            Assert.That(new RankAddress("h", 1).ToString(), Is.EqualTo("h:1"));
            Assert.That(new RankAddress("h", 1) == new RankAddress("h", 1), Is.True);
            Assert.That(new RankAddress("H", 1) != new RankAddress("h", 1), Is.True);
            Assert.That(RankAddresses.FromPong(null), Is.Empty);
            Assert.That(RankAddresses.RedirectOf(null, new RankAddress("h", 1), false), Is.Null);
            var many = new JArray();
            for (int i = 1; i <= 1100; ++i) many.Add("h:" + i);
            Assert.That(RankAddresses.FromPong(new JObject { { "ranks", many } }).Count, Is.EqualTo(RankAddresses.MaxRanksRead));
            List<RankAddress> order = RankAddresses.ReconnectOrder(new RankAddress("g", 1), new List<RankAddress>(), new RankAddress("g", 1));
            Assert.That(order, Is.EqualTo(new[] { new RankAddress("g", 1) }));
        }
    }
}
