// Logged steps (protocol 1.6, §10.1, §15): actions the policy did not choose, recorded beside sampled ones
// and marked in logged_runs, by both clients.
using System;
using System.Collections.Generic;
using System.IO;
using System.Linq;
using Newtonsoft.Json.Linq;
using NUnit.Framework;
using Tether.Client;
using Tether.Protocol;

namespace Tether.Tests
{
    [TestFixture]
    public class LoggedStepsTests
    {
        static readonly float[] Obs = { 0.1f, -0.2f, 0.3f, 0.0f };
        static readonly float[] OtherObs = { -0.4f, 0.5f, 0.2f, 0.9f };

        static ScriptedServer SingleServer(string version = "1.6", int perSample = 1000000)
        {
            return new ScriptedServer(perSample) { PongVersion = version };
        }

        static List<JObject> Records(ScriptedServer server, string episode)
        {
            var records = new List<JObject>();
            foreach (JObject batch in server.Received("EPISODES_AND_GET_STATE"))
            {
                server.Validate(batch);
                records.AddRange(batch["episodes"].Cast<JObject>().Where(r => (string)r["episode_id"] == episode));
            }
            return records;
        }

        static string RunsOf(JToken record)
        {
            JToken runs = record[LoggedRuns.Field];
            return runs == null ? null : runs.ToString(Newtonsoft.Json.Formatting.None);
        }

        static TetherException Refused(ErrorCode code, TestDelegate call)
        {
            var refused = Assert.Throws<TetherException>(call);
            Assert.That(refused.Code, Is.EqualTo(code), refused.Message);
            return refused;
        }

        // ---- the vectors: what a client records ----------------------------------------------------

        [Test]
        public void RecordVectors()
        {
            Vectors.Check("logged.json", (file, c) =>
            {
                if ((string)c["kind"] != "record") return;  // ("episode", "agent_entry": ConformanceTests)
                var calls = c["calls"].Select(x => (string)x).ToList();
                var cuts = new HashSet<int>(c["cuts"].Select(x => (int)x));
                var expected = (JArray)c["records_logged_runs"];
                ExpectRuns(SingleAgentRecords(calls, cuts), expected, "TetherClient");
                ExpectRuns(MultiAgentEntries(calls, cuts), expected, "MultiAgentClient");
            });
        }

        static void ExpectRuns(List<JObject> records, JArray expected, string who)
        {
            Vectors.Expect(records.Count == expected.Count, who + ": " + records.Count + " records");
            for (int r = 0; r < records.Count; ++r)
            {
                JToken got = records[r][LoggedRuns.Field];
                bool same = expected[r].Type == JTokenType.Null ? got == null : got != null && JToken.DeepEquals(got, expected[r]);
                Vectors.Expect(same, who + ": record " + r + " has logged_runs " + (got == null ? "(absent)" : got.ToString(Newtonsoft.Json.Formatting.None)));
            }
        }

        // One episode played call by call ("sample": GetAction, "log": LogAction), cut after each step count of
        // `cuts` (the step on the observation given last waits for the next one, as every cut does).
        static List<JObject> SingleAgentRecords(List<string> calls, HashSet<int> cuts)
        {
            using (ScriptedServer server = SingleServer())
            using (TetherClient client = TetherClient.Connect(server.Options(7)))
            {
                var action = new double[1];
                string episode = client.StartEpisode("e");
                for (int t = 0; t < calls.Count; ++t)
                {
                    if (calls[t] == "log") client.LogAction(episode, Obs, new[] { 1.0 });
                    else client.GetAction(episode, Obs, action);
                    if (cuts.Contains(t)) client.Flush(10);
                }
                client.EndEpisode(episode, Obs);
                client.Flush(10);
                return Records(server, episode);
            }
        }

        static List<JObject> MultiAgentEntries(List<string> calls, HashSet<int> cuts)
        {
            ScriptedServer server = ScriptedServer.Plain(1000000);
            server.PongVersion = "1.6";
            using (server)
            using (MultiAgentClient client = MultiAgentClient.Connect(server.Options(7)))
            {
                var frame = new AgentFrame();
                string episode = client.StartEpisode("e");
                for (int t = 0; t < calls.Count; ++t)
                {
                    frame.Clear();
                    frame.Add("a_0", Obs);
                    if (calls[t] == "log") frame.LogAction("a_0", new[] { 1.0 });
                    client.GetActions(episode, frame);
                    if (cuts.Contains(t)) client.Flush(10);
                }
                client.EndEpisode(episode);
                client.Flush(10);
                var specs = new Dictionary<string, ModuleSpec>();
                foreach (JProperty m in ((JObject)server.Config["modules"]).Properties()) specs[m.Name] = ModuleSpec.FromJson(m.Name, m.Value);
                var entries = new List<JObject>();
                foreach (JObject batch in server.Received("EPISODES_AND_GET_STATE"))
                {
                    var records = (JArray)batch["episodes"];
                    for (int i = 0; i < records.Count; ++i)
                    {
                        EpisodeRecords.ValidateMultiAgentRecord(records[i], i, specs, true);
                        var entry = records[i]["agents"]["a_0"] as JObject;
                        if (entry != null) entries.Add(entry);
                    }
                }
                return entries;
            }
        }

        // ---- the single-agent client -----------------------------------------------------------------

        [Test]
        public void LogActionRecordsTheGivenActionWithTheModelsDistInputsAndALogpOfZero()
        {
            using (ScriptedServer server = SingleServer())
            using (TetherClient client = TetherClient.Connect(server.Options(7)))
            {
                var action = new double[1];
                string episode = client.StartEpisode("e");
                client.GetAction(episode, Obs, action);
                client.LogReturns(episode, 1.0);
                var given = new[] { 1.0 };
                client.LogAction(episode, Obs, given);
                client.LogReturns(episode, 2.0);  // (rewards after a logged step add to it)
                client.LogReturns(episode, 0.5);
                client.LogAction(episode, OtherObs, new[] { 0.0 });
                client.GetAction(episode, Obs, action);
                Assert.That(given, Is.EqualTo(new[] { 1.0 }), "the given action is left as it was");
                Assert.That(client.EndEpisode(episode, Obs), Is.EqualTo(3.5));
                client.Flush(10);
                JObject record = Records(server, episode).Single();
                Assert.That(RunsOf(record), Is.EqualTo("[[1,2]]"));
                Assert.That(record["actions"].Skip(1).Take(2).Select(a => (int)a), Is.EqualTo(new[] { 1, 0 }));
                Assert.That(record["rewards"].Select(r => (double)r), Is.EqualTo(new[] { 1.0, 2.5, 0.0, 0.0 }));
                var logp = record["action_logp"].Select(v => (double)v).ToArray();
                Assert.That(logp[1], Is.EqualTo(0.0));
                Assert.That(logp[2], Is.EqualTo(0.0));
                Assert.That(logp[0], Is.LessThan(0.0), "a sampled step's log-probability");
                // The model was evaluated on the logged steps' observations: the same observation, the same dist inputs.
                var dists = (JArray)record["action_dist_inputs"];
                Assert.That(JToken.DeepEquals(dists[1], dists[0]) && JToken.DeepEquals(dists[3], dists[0]), Is.True);
                Assert.That(JToken.DeepEquals(dists[2], dists[0]), Is.False, "another observation's dist inputs");
            }
        }

        [Test]
        public void LogActionRefusesWhatTheServerWouldRefuseAndRecordsNothingThen()
        {
            using (ScriptedServer server = SingleServer())
            using (TetherClient client = TetherClient.Connect(server.Options(7)))
            {
                var action = new double[1];
                string episode = client.StartEpisode("e");
                client.GetAction(episode, Obs, action);
                // Discrete(2): 0 or 1.
                StringAssert.Contains("outside the action space", Refused(ErrorCode.ActionOutOfSpace, () => client.LogAction(episode, Obs, new[] { 2.0 })).Message);
                Refused(ErrorCode.ActionOutOfSpace, () => client.LogAction(episode, Obs, new[] { -1.0 }));
                Refused(ErrorCode.ActionOutOfSpace, () => client.LogAction(episode, Obs, new[] { 0.5 }));
                Refused(ErrorCode.ActionOutOfSpace, () => client.LogAction(episode, Obs, new[] { 1.0, 0.0 }));
                Refused(ErrorCode.ActionOutOfSpace, () => client.LogAction(episode, Obs, null));
                Refused(ErrorCode.NonFiniteValue, () => client.LogAction(episode, Obs, new[] { double.NaN }));
                Refused(ErrorCode.NonFiniteValue, () => client.LogAction(episode, new[] { float.NaN, 0, 0, 0 }, new[] { 1.0 }));  // (the observation, as GetAction)
                Refused(ErrorCode.InvalidArgument, () => client.LogAction("nope", Obs, new[] { 1.0 }));
                client.LogAction(episode, Obs, new[] { 1.0 });
                client.EndEpisode(episode, Obs);
                client.Flush(10);
                JObject record = Records(server, episode).Single();
                Assert.That(((JArray)record["actions"]).Count, Is.EqualTo(2), "only the steps taken");
                Assert.That(RunsOf(record), Is.EqualTo("[[1,1]]"));
            }
        }

        [Test]
        public void ABoxActionIsRecordedAsGivenAndAMaskedOneIsRefused()
        {
            // Box(2) actions (the 4-output model: 2 means, 2 log standard deviations): any finite value is
            // recorded as given, outside the box too (§11.4).
            using (ScriptedServer server = SingleServer())
            {
                server.Config["action_space"] = Space.Box(new long[] { 2 }, -1, 1).ToJson();
                server.ModelFile = OnnxCodec.Encode(ScriptedServer.GroupModel);
                using (TetherClient client = TetherClient.Connect(server.Options(7)))
                {
                    string episode = client.StartEpisode("e");
                    client.LogAction(episode, Obs, new[] { 5.0, -0.25 });
                    Refused(ErrorCode.NonFiniteValue, () => client.LogAction(episode, Obs, new[] { 0.0, double.PositiveInfinity }));
                    // (finite as a double, an infinity as the float32 the server reads a Box action as)
                    Refused(ErrorCode.NonFiniteValue, () => client.LogAction(episode, Obs, new[] { 1e39, 0.0 }));
                    Refused(ErrorCode.ActionOutOfSpace, () => client.LogAction(episode, Obs, new[] { 0.0 }));
                    client.EndEpisode(episode, Obs);
                    client.Flush(10);
                    JObject record = Records(server, episode).Single();
                    Assert.That(record["actions"][0].Select(v => (double)v), Is.EqualTo(new[] { 5.0, -0.25 }));
                    Assert.That(RunsOf(record), Is.EqualTo("[[0,1]]"));
                }
            }
            // A Dict observation with an action mask (protocol 1.4): the logged action must be allowed by it.
            JObject reference = JObject.Parse(File.ReadAllText(Path.Combine(ScriptedServer.Repo, "sdk_cpp/tests/data/policy_dict_mask.json")));
            using (ScriptedServer server = SingleServer())
            {
                server.Config["observation_space"] = reference["observation_space"];
                server.Config["action_space"] = Space.Discrete(3).ToJson();
                server.Config["action_mask"] = "action_mask";
                server.Config["onnx_input_names"] = reference["inputs"];
                server.ModelFile = OnnxCodec.Encode(File.ReadAllBytes(Path.Combine(ScriptedServer.Repo, "sdk_cpp/tests/data", (string)reference["model"])));
                using (TetherClient client = TetherClient.Connect(server.Options(7)))
                {
                    var leaves = new ObservationLeaves(client.ObservationSpace);
                    leaves.Set("action_mask", new float[] { 1, 0, 1 });
                    leaves.Set("board", new float[] { 0.5f, 0, 1, 0 });
                    leaves.Set("cam", new byte[] { 3, 200 });
                    string episode = client.StartEpisode("e");
                    StringAssert.Contains("'action_mask'", Refused(ErrorCode.ActionMasked, () => client.LogAction(episode, leaves, new[] { 1.0 })).Message);
                    client.LogAction(episode, leaves, new[] { 2.0 });
                    client.EndEpisode(episode, leaves);
                    client.Flush(10);
                    JObject message = server.Received("EPISODES_AND_GET_STATE").Last();
                    EpisodeRecords.ValidateEpisodes(message, client.ObservationSpace, client.ActionSpace, true, server.AttachmentOf(message), client.ActionMask);
                    Assert.That(RunsOf(message["episodes"][0]), Is.EqualTo("[[0,1]]"));
                }
            }
        }

        [Test]
        public void WithoutAModelLogActionIsRefusedAsGetActionIs()
        {
            using (ScriptedServer server = SingleServer())
            {
                server.ModelFile = null;  // (SET_STATE without a model)
                using (TetherClient client = TetherClient.Connect(server.Options(7)))
                {
                    string episode = client.StartEpisode("e");
                    Refused(ErrorCode.NotReady, () => client.GetAction(episode, Obs, new double[1]));
                    Refused(ErrorCode.NotReady, () => client.LogAction(episode, Obs, new[] { 1.0 }));
                }
            }
        }

        [TestCase("1.5")]
        [TestCase(null)]
        public void AServerOlderThan16RefusesLogActionAndGetsNoLoggedRuns(string version)
        {
            using (ScriptedServer server = SingleServer(version))
            using (TetherClient client = TetherClient.Connect(server.Options(7)))
            {
                var action = new double[1];
                string episode = client.StartEpisode("e");
                client.GetAction(episode, Obs, action);
                TetherException refused = Refused(ErrorCode.NotReady, () => client.LogAction(episode, Obs, new[] { 1.0 }));
                StringAssert.Contains("1.6", refused.Message);
                client.GetAction(episode, Obs, action);
                client.EndEpisode(episode, Obs);
                client.Flush(10);
                JObject record = Records(server, episode).Single();
                Assert.That(((JArray)record["actions"]).Count, Is.EqualTo(2));
                Assert.That(RunsOf(record), Is.Null);
            }
        }

        [Test]
        public void ARecordWithLoggedStepsResentToAnOlderServerIsLetGo()
        {
            // Batch 1 is lost with its connection; the next connection's server speaks 1.5: the record holding
            // logged steps is not sent to it (it would train on them as samples), the other one is.
            using (ScriptedServer server = SingleServer())
            using (TetherClient client = TetherClient.Connect(server.Options(7)))
            {
                server.DropOnceSeq = 1;
                server.PongVersionAfterDrop = "1.5";
                var action = new double[1];
                string a = client.StartEpisode("a");
                client.GetAction(a, Obs, action);
                client.LogAction(a, Obs, new[] { 1.0 });
                client.LogAction(a, Obs, new[] { 0.0 });
                client.GetAction(a, Obs, action);
                client.EndEpisode(a, Obs);
                string b = client.StartEpisode("b");
                client.GetAction(b, Obs, action);
                client.GetAction(b, Obs, action);
                client.EndEpisode(b, Obs);
                client.Flush(20);
                List<JObject> sent = server.Received("EPISODES_AND_GET_STATE");
                Assert.That(sent.Count, Is.EqualTo(2), "batch 1, then its resend");
                Assert.That(sent[0]["episodes"].Select(r => (string)r["episode_id"]), Is.EqualTo(new[] { "a", "b" }));
                Assert.That(RunsOf(sent[0]["episodes"][0]), Is.EqualTo("[[1,2]]"));
                Assert.That((long)sent[1]["batch_seq"], Is.EqualTo(1));
                Assert.That(sent[1]["episodes"].Select(r => (string)r["episode_id"]), Is.EqualTo(new[] { "b" }));
                Assert.That((int)sent[1]["env_steps"], Is.EqualTo(2));
                server.Validate(sent[1]);
                Assert.That(client.LoggedStepsDropped, Is.EqualTo(4));
                Assert.That(client.Reconnects, Is.EqualTo(1));
                string c = client.StartEpisode("c");
                Refused(ErrorCode.NotReady, () => client.LogAction(c, Obs, new[] { 1.0 }));
            }
        }

        [Test]
        public void LogActionAllocatesNothingInSteadyState()
        {
            const int perSample = 500;
            using (ScriptedServer server = SingleServer("1.6", perSample))
            using (TetherClient client = TetherClient.Connect(server.Options(7)))
            {
                var action = new double[1];
                var logged = new[] { 1.0 };
                GetActionAllocations run = GetActionAllocations.Measure(client, 120, 20, (episode, e, t) =>
                {
                    if (t % 3 == 1) client.LogAction(episode, Obs, logged);
                    else client.GetAction(episode, Obs, action);
                }, (episode, e) => client.EndEpisode(episode, Obs));
                Console.WriteLine("[ allocations ] " + run.Allocating + " of " + run.Calls + " GetAction/LogAction calls allocated (" + run.Bytes + " bytes) while " +
                                  run.Sent + " steps were sent");
                Assert.That(run.Sent, Is.GreaterThanOrEqualTo(run.Calls - perSample));
                Assert.That(run.Bytes, Is.EqualTo(0));
                JObject last = server.Received("EPISODES_AND_GET_STATE").Last();
                Assert.That(last["episodes"].Any(r => r[LoggedRuns.Field] != null), Is.True);
            }
        }

        // ---- the multi-agent client ------------------------------------------------------------------

        static float[] AgentObs(int t, int agent, int size)
        {
            var obs = new float[size];
            for (int j = 0; j < size; ++j) obs[j] = 0.01f * t + 0.1f * agent + 0.2f * j;
            return obs;
        }

        // a_0, a_1 (module "solo") and the group "pair" of m_0 and m_1 (module "lifter", MultiDiscrete([2, 2])).
        static void Fill(AgentFrame frame, int t)
        {
            frame.Clear();
            frame.Add("a_0", AgentObs(t, 0, 4));
            frame.Add("a_1", AgentObs(t, 1, 4));
            frame.Add("m_0", AgentObs(t, 2, 2));
            frame.Add("m_1", AgentObs(t, 3, 2));
        }

        static Dictionary<string, List<JObject>> Entries(ScriptedServer server)
        {
            var specs = new Dictionary<string, ModuleSpec>();
            foreach (JProperty m in ((JObject)server.Config["modules"]).Properties()) specs[m.Name] = ModuleSpec.FromJson(m.Name, m.Value);
            var entries = new Dictionary<string, List<JObject>>();
            foreach (JObject batch in server.Received("EPISODES_AND_GET_STATE"))
            {
                var records = (JArray)batch["episodes"];
                int steps = 0;
                for (int i = 0; i < records.Count; ++i)
                {
                    steps += EpisodeRecords.ValidateMultiAgentRecord(records[i], i, specs, true);
                    foreach (JProperty agent in ((JObject)records[i]["agents"]).Properties())
                    {
                        if (!entries.ContainsKey(agent.Name)) entries[agent.Name] = new List<JObject>();
                        entries[agent.Name].Add((JObject)agent.Value);
                    }
                }
                Assert.That((int)batch["agent_steps"], Is.EqualTo(steps));
            }
            return entries;
        }

        static ScriptedServer MultiServer(string version = "1.6")
        {
            ScriptedServer server = ScriptedServer.MultiAgent(1000000, rules: true);
            server.PongVersion = version;
            return server;
        }

        [Test]
        public void AFrameActsForItsPolicyAgentsAndRecordsItsLoggedOnes()
        {
            using (ScriptedServer server = MultiServer())
            using (MultiAgentClient client = MultiAgentClient.Connect(server.Options(3)))
            {
                string episode = client.StartEpisode("e");
                var frame = new AgentFrame();
                for (int t = 0; t < 6; ++t)
                {
                    Fill(frame, t);
                    if (t % 2 == 1)
                    {
                        frame.LogAction("a_1", new[] { 1.0 });
                        frame.LogAction("pair", new[] { 1.0, 0.0 });  // (the group's joint action: m_0's part, then m_1's)
                    }
                    client.GetActions(episode, frame);
                    if (t % 2 == 1)
                    {
                        Assert.That(frame.Action(1), Is.EqualTo(1.0), "a_1 gets its own action back");
                        Assert.That(frame.Action(2), Is.EqualTo(1.0), "m_0 its part of the group's");
                        Assert.That(frame.Action(3), Is.EqualTo(0.0), "m_1 its part");
                    }
                    for (int i = 0; i < 4; ++i) client.LogReturns(episode, frame.AgentId(i), 1.0);
                }
                client.EndEpisode(episode);
                client.Flush(10);
                Dictionary<string, List<JObject>> entries = Entries(server);
                JObject a0 = entries["a_0"].Single(), a1 = entries["a_1"].Single(), pair = entries["pair"].Single();
                Assert.That(RunsOf(a0), Is.Null, "a policy agent's entry has no logged_runs");
                Assert.That(RunsOf(a1), Is.EqualTo("[[1,1],[3,1],[5,1]]"));
                Assert.That(RunsOf(pair), Is.EqualTo("[[1,1],[3,1],[5,1]]"));
                Assert.That(a1["actions"].Where((a, t) => t % 2 == 1).Select(a => (int)a), Is.EqualTo(new[] { 1, 1, 1 }));
                Assert.That(pair["actions"].Where((a, t) => t % 2 == 1).Select(a => a.ToString(Newtonsoft.Json.Formatting.None)), Is.EqualTo(new[] { "[1,0]", "[1,0]", "[1,0]" }));
                foreach (JObject entry in new[] { a1, pair })
                {
                    var logp = entry["action_logp"].Select(v => (double)v).ToArray();
                    for (int t = 1; t < 6; t += 2) Assert.That(logp[t], Is.EqualTo(0.0));
                    Assert.That(((JArray)entry["action_dist_inputs"]).Count, Is.EqualTo(6));
                }
                Assert.That(a1["rewards"].Select(r => (double)r), Is.EqualTo(Enumerable.Repeat(1.0, 6)));
                Assert.That(pair["rewards"].Select(r => (double)r), Is.EqualTo(Enumerable.Repeat(1.0, 6)), "(a mean group's: each member's 1 halved)");
            }
        }

        [Test]
        public void AFrameWithAWrongLoggedActionIsRefusedWholeAndRecordsNothing()
        {
            using (ScriptedServer server = MultiServer())
            using (MultiAgentClient client = MultiAgentClient.Connect(server.Options(3)))
            {
                string episode = client.StartEpisode("e");
                var frame = new AgentFrame();
                Fill(frame, 0);
                client.GetActions(episode, frame);
                var cases = new List<KeyValuePair<ErrorCode, Action<AgentFrame>>>
                {
                    new KeyValuePair<ErrorCode, Action<AgentFrame>>(ErrorCode.InvalidArgument, f => f.LogAction("m_0", new[] { 1.0 })),  // a member
                    new KeyValuePair<ErrorCode, Action<AgentFrame>>(ErrorCode.InvalidArgument, f => f.LogAction("a_7", new[] { 1.0 })),  // not in the frame
                    new KeyValuePair<ErrorCode, Action<AgentFrame>>(ErrorCode.ActionOutOfSpace, f => f.LogAction("a_1", new[] { 2.0 })),
                    new KeyValuePair<ErrorCode, Action<AgentFrame>>(ErrorCode.ActionOutOfSpace, f => f.LogAction("pair", new[] { 1.0 })),  // not the joint action's size
                    new KeyValuePair<ErrorCode, Action<AgentFrame>>(ErrorCode.NonFiniteValue, f => f.LogAction("pair", new[] { 1.0, double.NaN })),
                };
                foreach (KeyValuePair<ErrorCode, Action<AgentFrame>> item in cases)
                {
                    Fill(frame, 1);
                    frame.LogAction("a_0", new[] { 0.0 });  // (a right one beside: the frame is refused whole)
                    item.Value(frame);
                    TetherException refused = Refused(item.Key, () => client.GetActions(episode, frame));
                    if (refused.Message.Contains("'m_0'")) StringAssert.Contains("member of group 'pair'", refused.Message);
                }
                Fill(frame, 1);
                frame.LogAction("a_0", new[] { 0.0 });
                Refused(ErrorCode.InvalidArgument, () => frame.LogAction("a_0", new[] { 1.0 }));  // (one action per actor)
                Refused(ErrorCode.InvalidArgument, () => client.ComputeActions(frame));  // (records nothing: no logged actions there)
                client.GetActions(episode, frame);
                client.EndEpisode(episode);
                client.Flush(10);
                Dictionary<string, List<JObject>> entries = Entries(server);
                foreach (string actor in new[] { "a_0", "a_1", "pair" }) Assert.That(((JArray)entries[actor].Single()["actions"]).Count, Is.EqualTo(2), actor);
                Assert.That(RunsOf(entries["a_0"].Single()), Is.EqualTo("[[1,1]]"));
            }
        }

        [Test]
        public void AnOlderServerRefusesAFrameWithLoggedActions()
        {
            using (ScriptedServer server = MultiServer("1.5"))
            using (MultiAgentClient client = MultiAgentClient.Connect(server.Options(3)))
            {
                string episode = client.StartEpisode("e");
                var frame = new AgentFrame();
                Fill(frame, 0);
                frame.LogAction("a_1", new[] { 1.0 });
                StringAssert.Contains("1.6", Refused(ErrorCode.NotReady, () => client.GetActions(episode, frame)).Message);
                Fill(frame, 0);
                client.GetActions(episode, frame);
                client.EndEpisode(episode);
                client.Flush(10);
                Dictionary<string, List<JObject>> entries = Entries(server);
                Assert.That(((JArray)entries["a_1"].Single()["actions"]).Count, Is.EqualTo(1));
                Assert.That(entries.Values.SelectMany(e => e).All(e => e[LoggedRuns.Field] == null), Is.True);
            }
        }

        [Test]
        public void AnEntryWithLoggedStepsResentToAnOlderServerIsLetGo()
        {
            using (ScriptedServer server = MultiServer())
            using (MultiAgentClient client = MultiAgentClient.Connect(server.Options(3)))
            {
                server.DropOnceSeq = 1;
                server.PongVersionAfterDrop = "1.5";
                string episode = client.StartEpisode("e");
                var frame = new AgentFrame();
                for (int t = 0; t < 3; ++t)
                {
                    Fill(frame, t);
                    if (t == 1) frame.LogAction("a_1", new[] { 0.0 });
                    client.GetActions(episode, frame);
                }
                client.EndEpisode(episode);
                client.Flush(20);
                List<JObject> sent = server.Received("EPISODES_AND_GET_STATE");
                Assert.That(sent.Count, Is.EqualTo(2), "batch 1, then its resend");
                Assert.That(((JObject)sent[0]["episodes"][0]["agents"]).Properties().Select(p => p.Name), Is.EquivalentTo(new[] { "a_0", "a_1", "pair" }));
                Assert.That(((JObject)sent[1]["episodes"][0]["agents"]).Properties().Select(p => p.Name), Is.EquivalentTo(new[] { "a_0", "pair" }));
                Assert.That((int)sent[1]["agent_steps"], Is.EqualTo(6));
                Assert.That(client.LoggedStepsDropped, Is.EqualTo(3));
            }
        }

        [Test]
        public void FramesWithALoggedAgentAllocateNothingInSteadyState()
        {
            ScriptedServer server = ScriptedServer.Plain(40);
            server.PongVersion = "1.6";
            using (server)
            using (MultiAgentClient client = MultiAgentClient.Connect(server.Options(3)))
            {
                string[] ids = Enumerable.Range(0, 8).Select(i => "a_" + i).ToArray();
                float[][] observations = ids.Select((id, i) => AgentObs(0, i, 4)).ToArray();
                var logged = new[] { 1.0 };
                FrameAllocations run = FrameAllocations.Measure(client, ids, observations, 30, 10, fill: frame => frame.LogAction("a_3", logged));
                Console.WriteLine("[ allocations ] " + run.Bytes + " bytes over " + run.Frames + " frames with a logged agent while " + run.Sent + " agent steps were sent");
                Assert.That(client.SteadyStateFramesActed, Is.EqualTo(0), "(frames with logged actions take the general path)");
                Assert.That(run.Sent, Is.GreaterThan(run.Frames * ids.Length / 2));
                Assert.That(run.Bytes, Is.EqualTo(0));
            }
        }
    }
}
