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
        // ---- drawing order (§19.1: names by their UTF-8 bytes) ----------------------------------

        static int Utf8Compare(string a, string b)
        {
            byte[] x = System.Text.Encoding.UTF8.GetBytes(a), y = System.Text.Encoding.UTF8.GetBytes(b);
            for (int i = 0; i < Math.Min(x.Length, y.Length); ++i)
            {
                if (x[i] != y[i]) return x[i] - y[i];
            }
            return x.Length - y.Length;
        }

        [Test]
        public void NamesAreDrawnInUtf8ByteOrderNotUtf16Order()
        {
            const string emoji = "\U0001F600", fullwidthA = "\uFF21";
            Assert.That(string.CompareOrdinal(emoji, fullwidthA), Is.LessThan(0), "UTF-16 code units sort the surrogate pair first");
            Assert.That(EnvParams.CompareNames(emoji, fullwidthA), Is.GreaterThan(0), "U+1F600 comes after U+FF21");
            Assert.That(EnvParams.CompareNames(fullwidthA, emoji), Is.LessThan(0));
            Assert.That(EnvParams.CompareNames(emoji, emoji), Is.EqualTo(0));
            Assert.That(EnvParams.CompareNames("a", "ab"), Is.LessThan(0));
            Assert.That(EnvParams.CompareNames("\uD7FF", "\uE000"), Is.LessThan(0));
            Assert.That(EnvParams.CompareNames("\U00010000", "\U0010FFFF"), Is.LessThan(0));
            // Against the bytes themselves, over names mixing every range the orders disagree on.
            var random = new Random(7);
            string[] pieces = { "a", "Z", "\u00E9", "\u4E2D", "\uD7FF", "\uE000", "\uFF21", "\uFFFF", "\U00010000", "\U0001F600", "\U0010FFFF" };
            for (int trial = 0; trial < 2000; ++trial)
            {
                string a = "", b = "";
                for (int i = random.Next(1, 4); i > 0; --i) a += pieces[random.Next(pieces.Length)];
                for (int i = random.Next(1, 4); i > 0; --i) b += pieces[random.Next(pieces.Length)];
                Assert.That(Math.Sign(EnvParams.CompareNames(a, b)), Is.EqualTo(Math.Sign(Utf8Compare(a, b))), Newtonsoft.Json.JsonConvert.ToString(a) + " vs " + Newtonsoft.Json.JsonConvert.ToString(b));
            }
            // A set's names are sorted once, when it is read, and its draws taken in that order.
            var uniform = JObject.Parse("{\"sampler\": \"uniform\", \"low\": 0, \"high\": 10}");
            var values = new JObject { { emoji, uniform.DeepClone() }, { fullwidthA, uniform.DeepClone() }, { "a", uniform.DeepClone() }, { "Z", uniform.DeepClone() } };
            EnvParams set = EnvParams.Parse(new JObject { { "seq", 1 }, { "lesson", 0 }, { "values", values } });
            Assert.That(set.Names, Is.EqualTo(new[] { "Z", "a", fullwidthA, emoji }));
            var draws = new Queue<double>(new[] { 0.1, 0.2, 0.3, 0.4 });
            EpisodeEnvParams drawn = set.Draw(() => draws.Dequeue());
            Assert.That(drawn.Values["Z"], Is.EqualTo(1.0).Within(1e-12));
            Assert.That(drawn.Values["a"], Is.EqualTo(2.0).Within(1e-12));
            Assert.That(drawn.Values[fullwidthA], Is.EqualTo(3.0).Within(1e-12));
            Assert.That(drawn.Values[emoji], Is.EqualTo(4.0).Within(1e-12));
        }

        // ---- a ranges sampler whose every pair is a point (§19.1) --------------------------------

        [TestCase(0.0, 1.0)]
        [TestCase(0.3, 1.0)]
        [TestCase(0.34, 3.0)]
        [TestCase(0.6, 3.0)]
        [TestCase(0.67, 7.0)]
        [TestCase(0.999, 7.0)]
        [TestCase(1.0, 7.0)]  // (beyond [0, 1): the index is clamped to the last pair)
        public void ARangesSamplerOfPointsGivesThePointAtFloorUTimesN(double u, double expect)
        {
            EnvParamValue points = EnvParamValue.Parse(JObject.Parse("{\"sampler\": \"ranges\", \"ranges\": [[1, 1], [3, 3], [7, 7]]}"));
            int taken = 0;
            Assert.That(points.Draw(() => { ++taken; return u; }), Is.EqualTo(expect));
            Assert.That(taken, Is.EqualTo(1));
            EnvParamValue single = EnvParamValue.Parse(JObject.Parse("{\"sampler\": \"ranges\", \"ranges\": [[-2.5, -2.5]]}"));
            Assert.That(single.Draw(() => u), Is.EqualTo(-2.5));
        }

        [Test]
        public void EachPointOfARangesSamplerOfPointsComesEquallyOften()
        {
            EnvParamValue points = EnvParamValue.Parse(JObject.Parse("{\"sampler\": \"ranges\", \"ranges\": [[1, 1], [3, 3], [7, 7], [9, 9]]}"));
            var counts = new Dictionary<double, int>();
            for (int i = 0; i < 400; ++i)
            {
                double u = (i + 0.5) / 400;
                double x = points.Draw(() => u);
                int n;
                counts.TryGetValue(x, out n);
                counts[x] = n + 1;
            }
            Assert.That(counts.Keys.OrderBy(x => x), Is.EqualTo(new[] { 1.0, 3.0, 7.0, 9.0 }));
            Assert.That(counts.Values.All(n => n == 100), Is.True, string.Join(", ", counts.Select(c => c.Key + ": " + c.Value)));
        }

        // ---- env_params only from a 1.7 server (§19.2) -------------------------------------------

        [Test]
        public void EnvParamsFromAServerOlderThan17AreIgnored()
        {
            using (var server = new ScriptedServer(4) { PongVersion = "1.6", EnvParams = Samplers, EnvParamsToEveryRequest = true })
            using (TetherClient client = TetherClient.Connect(server.Options(7)))
            {
                int changes = 0;
                client.EnvParamsChanged += set => ++changes;
                Assert.That(client.EnvParams, Is.Null, "the handshake's answer carried a set: ignored");
                string episode = client.StartEpisode();
                Assert.That(client.EpisodeParams(episode), Is.Empty);
                Play(client, episode, 9);
                client.EndEpisode(episode, Obs);
                client.Flush(10);
                Assert.That(server.Received("EPISODES_AND_GET_STATE").Count, Is.GreaterThanOrEqualTo(2));
                Assert.That(client.EnvParams, Is.Null, "every answer carried a set: ignored");
                Assert.That(changes, Is.EqualTo(0));
                Assert.That(client.EnvParamsIgnored, Is.EqualTo(0), "not counted as a set that breaks the rules: not read at all");
                Assert.That(RecordsOf(server, episode).All(r => r["env_params"] == null), Is.True);
            }
        }

        [Test]
        public void TheMultiAgentClientIgnoresEnvParamsFromAServerOlderThan17Too()
        {
            using (ScriptedServer server = ScriptedServer.Plain(1000000))
            {
                server.PongVersion = "1.6";
                server.EnvParams = Samplers;
                server.EnvParamsToEveryRequest = true;
                using (MultiAgentClient client = MultiAgentClient.Connect(server.Options(3)))
                {
                    Assert.That(client.EnvParams, Is.Null);
                    Assert.That(client.EpisodeParams(client.StartEpisode()), Is.Empty);
                }
            }
        }

        [Test]
        public void AfterAReconnectToAnOlderServerTheHeldSetIsNeitherReplacedNorDropped()
        {
            using (var server = new ScriptedServer(4) { PongVersion = "1.7", EnvParams = Samplers, DropOnceSeq = 1, PongVersionAfterDrop = "1.6", EnvParamsToEveryRequest = true })
            using (TetherClient client = TetherClient.Connect(server.Options(7)))
            {
                int changes = 0;
                client.EnvParamsChanged += set => ++changes;
                Assert.That(client.EnvParams.Seq, Is.EqualTo(3));
                server.EnvParams = "{\"seq\": 9, \"lesson\": 2, \"values\": {\"speed\": 7}}";
                string episode = client.StartEpisode();
                Play(client, episode, 9);
                client.Flush(10);
                Assert.That(client.Reconnects, Is.EqualTo(1));
                List<JObject> handshakes = server.Received("GET_STATE");
                Assert.That(handshakes.Count, Is.EqualTo(2));
                Assert.That(handshakes[1]["env_params_seq"], Is.Null, "the 1.6 server is not asked");
                Assert.That(client.EnvParams.Seq, Is.EqualTo(3), "set 9 of the 1.6 server ignored; its answers without a set drop nothing");
                Assert.That(changes, Is.EqualTo(1), "only the held set, given to the handler when it was added");
                AssertDrawnFromSamplers(client.EpisodeParams(client.StartEpisode()));
            }
        }

        // ---- the drop rule (§19.2) ------------------------------------------------------------

        [Test]
        public void AServerWithoutParametersAfterAReconnectMakesTheClientDropItsSet()
        {
            using (var server = new ScriptedServer(4) { PongVersion = "1.7", EnvParams = Samplers, DropOnceSeq = 1 })
            using (TetherClient client = TetherClient.Connect(server.Options(7)))
            {
                var seen = new List<EnvParams>();
                int engineThread = Thread.CurrentThread.ManagedThreadId, raisedOn = -1;
                client.EnvParamsChanged += set =>
                {
                    seen.Add(set);
                    raisedOn = Thread.CurrentThread.ManagedThreadId;
                };
                Assert.That(seen.Count, Is.EqualTo(1));
                Assert.That(seen[0].Seq, Is.EqualTo(3));
                string before = client.StartEpisode();
                IReadOnlyDictionary<string, double> values = client.EpisodeParams(before);
                AssertDrawnFromSamplers(values);
                server.EnvParams = null;  // (the server the client reconnects to has no parameters)
                Play(client, before, 9);
                client.Flush(10);
                Assert.That(client.Reconnects, Is.EqualTo(1));
                List<JObject> handshakes = server.Received("GET_STATE");
                Assert.That(handshakes.Count, Is.EqualTo(2));
                Assert.That((long)handshakes[1]["env_params_seq"], Is.EqualTo(0));
                Assert.That(client.EnvParams, Is.Null, "asked with 0 and sent no set: the server has none");
                Assert.That(seen.Count, Is.EqualTo(2), "raised once for the drop");
                Assert.That(seen[1], Is.Null);
                Assert.That(raisedOn, Is.EqualTo(engineThread));
                Assert.That(client.EpisodeParams(before), Is.EqualTo(values), "an episode keeps what it started with");
                string after = client.StartEpisode();
                Assert.That(client.EpisodeParams(after), Is.Empty, "an episode started after the drop has no values");
                Play(client, after, 6);
                client.EndEpisode(before, Obs);
                client.EndEpisode(after, Obs);
                client.Flush(10);
                Assert.That(seen.Count, Is.EqualTo(2), "the drop is said once");
                Assert.That(server.Received("EPISODES_AND_GET_STATE").Where(b => (long)b["batch_seq"] > 1).All(b => (long)b["env_params_seq"] == 0), Is.True);
                List<JObject> records = RecordsOf(server, before).ToList();
                Assert.That(records, Is.Not.Empty);
                Assert.That(records.All(r => (long)r["env_params"]["seq"] == 3), Is.True, "every record of the earlier episode says its values");
                Assert.That(RecordsOf(server, after).All(r => r["env_params"] == null), Is.True);
                // A handler added while no set is held is not called.
                int late = 0;
                client.EnvParamsChanged += set => ++late;
                Assert.That(late, Is.EqualTo(0));
            }
        }

        [Test]
        public void AServerWithoutParametersRaisesNothingWhenNoSetIsHeld()
        {
            using (var server = new ScriptedServer(4) { PongVersion = "1.7" })
            using (TetherClient client = TetherClient.Connect(server.Options(7)))
            {
                int changes = 0;
                client.EnvParamsChanged += set => ++changes;
                string episode = client.StartEpisode();
                Play(client, episode, 9);
                client.Flush(10);
                Assert.That(client.EnvParams, Is.Null);
                Assert.That(changes, Is.EqualTo(0), "nothing held: a drop changes nothing");
            }
        }

        [Test]
        public void AnyAnswerToEnvParamsSeqZeroWithoutASetDropsTheHeldOne()
        {
            // A reconnect whose handshake brings a set that breaks the rules keeps the held set (and asks with 0
            // on); a later answer to a request asking with 0 that carries no set drops it.
            using (var server = new ScriptedServer(4) { PongVersion = "1.7", EnvParams = Samplers, DropOnceSeq = 1 })
            using (TetherClient client = TetherClient.Connect(server.Options(7)))
            {
                var seen = new List<EnvParams>();
                client.EnvParamsChanged += seen.Add;
                server.EnvParams = "{\"seq\": 5, \"lesson\": 0, \"values\": {\"speed\": {\"sampler\": \"uniform\", \"low\": 2, \"high\": 1}}}";
                string episode = client.StartEpisode();
                Play(client, episode, 9);
                client.Flush(10);
                Assert.That(client.Reconnects, Is.EqualTo(1));
                Assert.That(client.EnvParamsIgnored, Is.GreaterThanOrEqualTo(1));
                Assert.That(client.EnvParams.Seq, Is.EqualTo(3), "the held set is kept");
                Assert.That(seen.Count, Is.EqualTo(1));
                Assert.That((long)server.Received("EPISODES_AND_GET_STATE").Last()["env_params_seq"], Is.EqualTo(0));
                server.EnvParams = null;
                Play(client, episode, 8);
                client.Flush(10);
                Assert.That(client.EnvParams, Is.Null);
                Assert.That(seen.Count, Is.EqualTo(2));
                Assert.That(seen[1], Is.Null);
            }
        }

        // ---- the change callback (§19.2) ---------------------------------------------------------

        [Test]
        public void AHandlerThatThrowsLeavesTheChangeAppliedAndRaisedOnce()
        {
            using (var server = new ScriptedServer(4) { PongVersion = "1.7" })
            using (TetherClient client = TetherClient.Connect(server.Options(7)))
            {
                int calls = 0;
                client.EnvParamsChanged += set =>
                {
                    ++calls;
                    throw new InvalidOperationException("the game's handler failed");
                };
                Assert.That(calls, Is.EqualTo(0), "no set held: not called at once");
                string episode = client.StartEpisode();
                server.EnvParams = Samplers;
                Play(client, episode, 5);
                WaitUntilAnswered(client);
                Assert.That(calls, Is.EqualTo(0));
                var thrown = Assert.Throws<InvalidOperationException>(() => client.StartEpisode("next"));
                Assert.That(thrown.Message, Is.EqualTo("the game's handler failed"), "out of the call that took the change");
                Assert.That(calls, Is.EqualTo(1));
                Assert.That(client.EnvParams.Seq, Is.EqualTo(3), "applied all the same");
                string next = client.StartEpisode("next");
                Assert.That(calls, Is.EqualTo(1), "not raised again");
                AssertDrawnFromSamplers(client.EpisodeParams(next));
                Play(client, next, 8);
                client.Flush(10);
                Assert.That(calls, Is.EqualTo(1));
            }
        }
    }
}
