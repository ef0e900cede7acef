// Protocol 1.7 environment parameters (docs/protocol.md §19) in both clients, against a scripted server:
// env_params_seq in every state request to a 1.7 server, sets swapped in between calls, episodes' values
// drawn from them and carried by every record, the measure on the last one.
using System;
using System.Collections.Generic;
using System.Linq;
using System.Threading;
using Newtonsoft.Json.Linq;
using NUnit.Framework;
using Tether.Client;
using Tether.Protocol;

namespace Tether.Tests
{
    [TestFixture]
    public class EnvParamsTests
    {
        static readonly float[] Obs = { 0.1f, -0.2f, 0.3f, 0.0f };

        const string Samplers = "{\"seq\": 3, \"lesson\": 1, \"values\": {\"speed\": 2, \"gravity\": {\"sampler\": \"uniform\", \"low\": 9, \"high\": 11}, " +
                                "\"gap\": {\"sampler\": \"ranges\", \"ranges\": [[1, 2], [4, 5]]}, \"wind\": {\"sampler\": \"gaussian\", \"mean\": 0, \"std\": 1}}}";

        static void Play(TetherClient client, string episode, int steps)
        {
            var action = new double[1];
            for (int i = 0; i < steps; ++i)
            {
                client.GetAction(episode, Obs, action);
                client.LogReturns(episode, 1.0);
            }
        }

        static void WaitUntilAnswered(ClientBase client)
        {
            DateTime deadline = DateTime.UtcNow.AddSeconds(10);
            while (client.Sending && DateTime.UtcNow < deadline) Thread.Sleep(2);
            Assert.That(client.Sending, Is.False, "the server answered every batch");
        }

        // Whether `values` are values the Samplers set can give.
        static void AssertDrawnFromSamplers(IReadOnlyDictionary<string, double> values)
        {
            Assert.That(values.Keys.OrderBy(k => k, StringComparer.Ordinal), Is.EqualTo(new[] { "gap", "gravity", "speed", "wind" }));
            Assert.That(values["speed"], Is.EqualTo(2.0));
            Assert.That(values["gravity"], Is.InRange(9.0, 11.0));
            double gap = values["gap"];
            Assert.That((gap >= 1 && gap <= 2) || (gap >= 4 && gap <= 5), Is.True, "gap " + gap);
            Assert.That(double.IsNaN(values["wind"]) || double.IsInfinity(values["wind"]), Is.False);
        }

        static IEnumerable<JObject> RecordsOf(ScriptedServer server, string episodeId)
        {
            return RecordsOf(server, "EPISODES_AND_GET_STATE", episodeId);
        }

        static IEnumerable<JObject> RecordsOf(ScriptedServer server, string type, string episodeId)
        {
            foreach (JObject batch in server.Received(type))
            {
                foreach (JObject record in (JArray)batch["episodes"])
                {
                    if ((string)record["episode_id"] == episodeId) yield return record;
                }
            }
        }

        [TestCase("1.7")]
        [TestCase("1.6")]
        public void StateRequestsCarryEnvParamsSeqOnlyToA17Server(string version)
        {
            using (var server = new ScriptedServer(4) { PongVersion = version, EnvParams = Samplers })
            using (TetherClient client = TetherClient.Connect(server.Options(7)))
            {
                string episode = client.StartEpisode();
                Play(client, episode, 9);
                client.EndEpisode(episode, Obs);
                client.Flush(10);
                JObject first = server.Received("GET_STATE")[0];
                List<JObject> batches = server.Received("EPISODES_AND_GET_STATE");
                Assert.That(batches.Count, Is.GreaterThanOrEqualTo(2));
                if (version == "1.7")
                {
                    Assert.That(first["env_params_seq"].Type, Is.EqualTo(JTokenType.Integer));
                    Assert.That((long)first["env_params_seq"], Is.EqualTo(0));
                    // The handshake's answer brought set 3: every later request names it.
                    foreach (JObject batch in batches) Assert.That((long)batch["env_params_seq"], Is.EqualTo(3));
                    Assert.That(client.EnvParams.Seq, Is.EqualTo(3));
                    Assert.That(client.EnvParams.Lesson, Is.EqualTo(1));
                }
                else
                {
                    Assert.That(first["env_params_seq"], Is.Null);
                    foreach (JObject batch in batches) Assert.That(batch["env_params_seq"], Is.Null);
                    Assert.That(client.EnvParams, Is.Null, "a request without env_params_seq is never sent a set");
                    Assert.That(RecordsOf(server, episode).All(r => r["env_params"] == null), Is.True);
                }
            }
        }

        [Test]
        public void OffPolicyTheGetStateBehindEachBatchCarriesIt()
        {
            using (var server = new ScriptedServer(4, forceOnPolicy: false) { PongVersion = "1.7", EnvParams = Samplers })
            using (TetherClient client = TetherClient.Connect(server.Options(7)))
            {
                string episode = client.StartEpisode();
                Play(client, episode, 9);
                client.Flush(10);
                List<JObject> getStates = server.Received("GET_STATE");
                Assert.That(getStates.Count, Is.GreaterThanOrEqualTo(3), "the handshake's and one behind each EPISODES");
                Assert.That((long)getStates[0]["env_params_seq"], Is.EqualTo(0));
                foreach (JObject getState in getStates.Skip(1)) Assert.That((long)getState["env_params_seq"], Is.EqualTo(3));
                Assert.That(server.Received("EPISODES").All(b => b["env_params_seq"] == null), Is.True, "only state requests carry it");
                Assert.That(RecordsOf(server, "EPISODES", episode).All(r => (long)r["env_params"]["seq"] == 3), Is.True);
            }
        }

        [Test]
        public void TheMultiAgentClientAsksWithEnvParamsSeqToo()
        {
            using (ScriptedServer server = ScriptedServer.Plain(1000000))
            {
                server.PongVersion = "1.7";
                using (MultiAgentClient client = MultiAgentClient.Connect(server.Options(3)))
                {
                    Assert.That((long)server.Received("GET_STATE")[0]["env_params_seq"], Is.EqualTo(0));
                    Assert.That(client.EnvParams, Is.Null);
                }
            }
            using (ScriptedServer server = ScriptedServer.Plain(1000000))
            {
                server.PongVersion = "1.6";
                using (MultiAgentClient.Connect(server.Options(3)))
                {
                    Assert.That(server.Received("GET_STATE")[0]["env_params_seq"], Is.Null);
                }
            }
        }

        [Test]
        public void ANewSetIsSwappedInAtTheNextCallAndLaterEpisodesDrawFromIt()
        {
            using (var server = new ScriptedServer(4) { PongVersion = "1.7" })
            using (TetherClient client = TetherClient.Connect(server.Options(7)))
            {
                var seen = new List<EnvParams>();
                int engineThread = Thread.CurrentThread.ManagedThreadId, raisedOn = -1;
                client.EnvParamsChanged += set =>
                {
                    seen.Add(set);
                    raisedOn = Thread.CurrentThread.ManagedThreadId;
                };
                Assert.That(client.EnvParams, Is.Null);
                string before = client.StartEpisode();
                Assert.That(client.EpisodeParams(before), Is.Empty, "an episode started without a set has no values");
                server.EnvParams = Samplers;
                Play(client, before, 5);  // the 4th step's observation cuts batch 1
                WaitUntilAnswered(client);
                // The answer is in, but not taken: the set is swapped in by the next call, not on the I/O thread.
                Assert.That(seen, Is.Empty);
                Assert.That(client.EnvParams, Is.Null);
                string after = client.StartEpisode();
                Assert.That(seen.Count, Is.EqualTo(1));
                Assert.That(raisedOn, Is.EqualTo(engineThread));
                Assert.That(seen[0].Seq, Is.EqualTo(3));
                Assert.That(client.EnvParams, Is.SameAs(seen[0]));
                Assert.That(client.EnvParams.Values["gravity"].Kind, Is.EqualTo(EnvParamKind.Uniform));
                Assert.That(client.EpisodeParams(before), Is.Empty, "an episode keeps what it started with");
                AssertDrawnFromSamplers(client.EpisodeParams(after));
                var gravities = new HashSet<double>();
                for (int i = 0; i < 20; ++i)
                {
                    string episode = client.StartEpisode();
                    AssertDrawnFromSamplers(client.EpisodeParams(episode));
                    gravities.Add(client.EpisodeParams(episode)["gravity"]);
                    client.EndEpisode(episode, Obs);
                }
                Assert.That(gravities.Count, Is.GreaterThan(1), "each episode draws anew");
                Play(client, after, 8);
                client.Flush(10);
                Assert.That(seen.Count, Is.EqualTo(1), "the server sends a set once per connection");
                Assert.That((long)server.Received("EPISODES_AND_GET_STATE").Last()["env_params_seq"], Is.EqualTo(3));
                Assert.Throws<TetherException>(() => client.EpisodeParams("nobody"));
            }
        }

        [Test]
        public void RecordsCarryTheValuesAndTheMeasureOnlyOnTheLastRecord()
        {
            using (var server = new ScriptedServer(3) { PongVersion = "1.7", EnvParams = Samplers })
            using (TetherClient client = TetherClient.Connect(server.Options(7)))
            {
                Assert.That(client.EnvParams.Seq, Is.EqualTo(3), "a set sent in the handshake is held once Connect returns");
                string measured = client.StartEpisode(), plain = client.StartEpisode();
                IReadOnlyDictionary<string, double> values = client.EpisodeParams(measured);
                AssertDrawnFromSamplers(values);
                Play(client, measured, 7);
                Play(client, plain, 2);
                client.ReportMeasure(measured, 0.5);
                client.ReportMeasure(measured, 0.75);  // (a later report replaces an earlier one)
                client.EndEpisode(measured, Obs);
                client.EndEpisode(plain, Obs, truncated: true);
                var refused = Assert.Throws<TetherException>(() => client.ReportMeasure(measured, 1.0));
                Assert.That(refused.Code, Is.EqualTo(ErrorCode.InvalidArgument), "an ended episode is not known any more");
                client.Flush(10);
                foreach (JObject batch in server.Received("EPISODES_AND_GET_STATE")) server.Validate(batch);
                List<JObject> records = RecordsOf(server, measured).ToList();
                Assert.That(records.Count, Is.GreaterThanOrEqualTo(2));
                for (int i = 0; i < records.Count; ++i)
                {
                    var member = (JObject)records[i]["env_params"];
                    Assert.That((long)member["seq"], Is.EqualTo(3));
                    var written = (JObject)member["values"];
                    Assert.That(written.Count, Is.EqualTo(values.Count));
                    foreach (KeyValuePair<string, double> value in values) Assert.That((double)written[value.Key], Is.EqualTo(value.Value), "round-trip precision");
                    bool last = i == records.Count - 1;
                    Assert.That((bool)records[i]["is_terminated"], Is.EqualTo(last));
                    if (last) Assert.That((double)member["measure"], Is.EqualTo(0.75));
                    else Assert.That(member["measure"], Is.Null);
                    Assert.That(member.Properties().Select(p => p.Name), Is.SubsetOf(new[] { "seq", "values", "measure" }));
                }
                List<JObject> plainRecords = RecordsOf(server, plain).ToList();
                Assert.That(plainRecords, Is.Not.Empty);
                Assert.That(plainRecords.All(r => r["env_params"] != null && r["env_params"]["measure"] == null), Is.True, "no measure reported: none sent");
            }
        }

        [Test]
        public void AMeasureThatIsNotFiniteOrBeyond1e300IsRefused()
        {
            using (var server = new ScriptedServer(1000000) { PongVersion = "1.7", EnvParams = Samplers })
            using (TetherClient client = TetherClient.Connect(server.Options(7)))
            {
                string episode = client.StartEpisode();
                foreach (double bad in new[] { double.NaN, double.PositiveInfinity, double.NegativeInfinity, 1e301, -2e300 })
                {
                    var e = Assert.Throws<TetherException>(() => client.ReportMeasure(episode, bad));
                    Assert.That(e.Code, Is.EqualTo(ErrorCode.NonFiniteValue), bad.ToString());
                }
                client.ReportMeasure(episode, -1e300);
                var unknown = Assert.Throws<TetherException>(() => client.ReportMeasure("nobody", 1.0));
                Assert.That(unknown.Code, Is.EqualTo(ErrorCode.InvalidArgument));
                StringAssert.Contains("nobody", unknown.Message);
            }
        }

        [Test]
        public void MultiAgentRecordsCarryEnvParamsAtTheirTopLevel()
        {
            using (ScriptedServer server = ScriptedServer.Plain(4))
            {
                server.PongVersion = "1.7";
                server.EnvParams = Samplers;
                using (MultiAgentClient client = MultiAgentClient.Connect(server.Options(3)))
                {
                    string episode = client.StartEpisode();
                    IReadOnlyDictionary<string, double> values = client.EpisodeParams(episode);
                    AssertDrawnFromSamplers(values);
                    var frame = new AgentFrame();
                    for (int t = 0; t < 6; ++t)
                    {
                        frame.Clear();
                        frame.Add("a_0", new[] { 0.01f * t, 0.1f, 0.2f, 0.3f });
                        client.GetActions(episode, frame);
                        client.LogReturns(episode, "a_0", 1.0);
                    }
                    client.ReportMeasure(episode, 2.5);
                    client.EndEpisode(episode);
                    var ended = Assert.Throws<TetherException>(() => client.ReportMeasure(episode, 3.0));
                    Assert.That(ended.Code, Is.EqualTo(ErrorCode.InvalidArgument));
                    StringAssert.Contains("has ended", ended.Message);
                    client.Flush(10);
                    List<JObject> records = RecordsOf(server, episode).ToList();
                    Assert.That(records.Count, Is.GreaterThanOrEqualTo(2));
                    for (int i = 0; i < records.Count; ++i)
                    {
                        var member = (JObject)records[i]["env_params"];
                        Assert.That((long)member["seq"], Is.EqualTo(3));
                        foreach (KeyValuePair<string, double> value in values) Assert.That((double)member["values"][value.Key], Is.EqualTo(value.Value));
                        bool last = i == records.Count - 1;
                        Assert.That((bool)records[i]["is_terminated"], Is.EqualTo(last));
                        if (last) Assert.That((double)member["measure"], Is.EqualTo(2.5));
                        else Assert.That(member["measure"], Is.Null);
                        Assert.That(records[i]["agents"]["a_0"]["env_params"], Is.Null, "at the record's top level only");
                    }
                }
            }
        }

        [Test]
        public void ASetThatBreaksTheRulesIsIgnoredAndTheHeldOneKept()
        {
            using (var server = new ScriptedServer(4) { PongVersion = "1.7", EnvParams = "{\"seq\": 1, \"lesson\": 0, \"values\": {\"speed\": 1.5}}" })
            using (TetherClient client = TetherClient.Connect(server.Options(7)))
            {
                int changes = 0;
                client.EnvParamsChanged += set => ++changes;
                Assert.That(client.EnvParams.Seq, Is.EqualTo(1));
                server.EnvParams = "{\"seq\": 2, \"lesson\": 0, \"values\": {\"speed\": {\"sampler\": \"uniform\", \"low\": 2, \"high\": 1}}}";
                string episode = client.StartEpisode();
                Play(client, episode, 9);
                client.Flush(10);
                Assert.That(client.EnvParamsIgnored, Is.GreaterThanOrEqualTo(2));
                Assert.That(changes, Is.EqualTo(1), "only the held set, given to the handler when it was added");
                Assert.That(client.EnvParams.Seq, Is.EqualTo(1));
                foreach (JObject batch in server.Received("EPISODES_AND_GET_STATE")) Assert.That((long)batch["env_params_seq"], Is.EqualTo(1));
                Assert.That(client.EpisodeParams(episode)["speed"], Is.EqualTo(1.5));
            }
        }

        [Test]
        public void ANewConnectionAsksFromZeroAgain()
        {
            using (var server = new ScriptedServer(4) { PongVersion = "1.7", EnvParams = Samplers, DropOnceSeq = 1 })
            using (TetherClient client = TetherClient.Connect(server.Options(7)))
            {
                int changes = 0;
                client.EnvParamsChanged += set => ++changes;
                Assert.That(changes, Is.EqualTo(1), "the handshake's set, given to the handler when it is added");
                string episode = client.StartEpisode();
                Play(client, episode, 9);
                client.Flush(10);
                Assert.That(client.Reconnects, Is.EqualTo(1));
                List<JObject> handshakes = server.Received("GET_STATE");
                Assert.That(handshakes.Count, Is.EqualTo(2));
                foreach (JObject getState in handshakes) Assert.That((long)getState["env_params_seq"], Is.EqualTo(0));
                Assert.That(changes, Is.EqualTo(2), "and the set the new connection brought");
                Assert.That(client.EnvParams.Seq, Is.EqualTo(3));
            }
        }
    }
}
