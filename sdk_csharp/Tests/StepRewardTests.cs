// A step's reward never goes out beyond float32 (protocol 1.6, §10.5): the call that would take it there
// is refused (NON_FINITE_VALUE) and adds nothing, in both clients and the demonstration writer.
// (rewards.json, the shared vectors, runs in ConformanceTests.)
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
    public class StepRewardTests
    {
        static readonly float[] Obs = { 0.1f, -0.2f, 0.3f, 0.0f };

        static TetherException Refused(TestDelegate call, params string[] naming)
        {
            var refused = Assert.Throws<TetherException>(call);
            Assert.That(refused.Code, Is.EqualTo(ErrorCode.NonFiniteValue), refused.Message);
            Assert.That(refused.Message, Is.StringContaining("beyond float32"));
            foreach (string name in naming) Assert.That(refused.Message, Is.StringContaining(name));
            return refused;
        }

        static string TempPath()
        {
            return Path.Combine(Path.GetTempPath(), "tether-rewards-" + Guid.NewGuid().ToString("N") + ".jsonl");
        }

        // The episode lines of a demonstration file, by "episode/agent".
        static Dictionary<string, JObject> DemoLines(string path)
        {
            return File.ReadAllLines(path).Skip(1).Select(JObject.Parse).ToDictionary(l => (string)l["episode_id"] + "/" + (string)l["agent_id"]);
        }

        static double[] Rewards(JToken entry)
        {
            return entry["rewards"].Select(r => (double)r).ToArray();
        }

        [Test]
        public void TheThresholdIsTheSmallestDoubleWhoseFloat32IsInfinite()
        {
            Assert.That(EpisodeRecords.Float32Overflow, Is.EqualTo(Math.Pow(2, 128) - Math.Pow(2, 103)));
            Assert.That(float.IsInfinity((float)EpisodeRecords.Float32Overflow), Is.True);
            double below = BitConverter.Int64BitsToDouble(BitConverter.DoubleToInt64Bits(EpisodeRecords.Float32Overflow) - 1);
            Assert.That((float)below, Is.EqualTo(float.MaxValue));
            Assert.That(EpisodeRecords.StepRewardFits(below) && EpisodeRecords.StepRewardFits(-below), Is.True);
            Assert.That(EpisodeRecords.StepRewardFits(EpisodeRecords.Float32Overflow) || EpisodeRecords.StepRewardFits(-EpisodeRecords.Float32Overflow), Is.False);
            Assert.That(EpisodeRecords.StepRewardFits(double.NaN), Is.False);
        }

        [Test]
        public void TheSingleAgentClientRefusesARewardBeyondFloat32AndItsStepReturnAndFileStayAsTheyWere()
        {
            string path = TempPath();
            try
            {
                double total, unrecordedTotal;
                using (var server = new ScriptedServer(1000000) { PongVersion = "1.6" })
                {
                    ClientOptions options = server.Options(7);
                    options.DemoPath = path;
                    using (TetherClient client = TetherClient.Connect(options))
                    {
                        var action = new double[1];
                        string episode = client.StartEpisode("e");
                        client.LogReturns(episode, 3e38);  // before the first action: to no step, not limited
                        client.LogReturns(episode, 3e38);
                        client.GetAction(episode, Obs, action);
                        client.LogReturns(episode, 3e38);
                        Refused(() => client.LogReturns(episode, 1e38), "'default_agent'", "episode 'e'", "1E+38");
                        Refused(() => client.LogReturns(episode, 3.5e38));  // (a reward beyond float32 on its own too)
                        client.LogReturns(episode, -1e38);  // the step takes more after a refusal
                        client.GetAction(episode, Obs, action);
                        client.LogReturns(episode, -3.4e38);
                        Refused(() => client.LogReturns(episode, -1e37), "'default_agent'");
                        total = client.EndEpisode(episode, Obs);
                        // An episode not recorded sends no step: its rewards are not limited (its file's step
                        // still is: the writer refuses the reward, which the client leaves out of the file).
                        string unrecorded = client.StartEpisode("unrecorded", trainingEnabled: false);
                        client.GetAction(unrecorded, Obs, action);
                        client.LogReturns(unrecorded, 3e38);
                        client.LogReturns(unrecorded, 1e38);
                        unrecordedTotal = client.EndEpisode(unrecorded, Obs);
                        client.Flush(10);
                    }
                    Assert.That(total, Is.EqualTo(3e38 + 3e38 + 3e38 + -1e38 + -3.4e38), "the refused rewards left the return as it was");
                    Assert.That(unrecordedTotal, Is.EqualTo(4e38));
                    var records = server.Received("EPISODES_AND_GET_STATE").Select(b =>
                    {
                        server.Validate(b);
                        return b;
                    }).SelectMany(b => b["episodes"]).ToList();
                    Assert.That(records.Count, Is.EqualTo(1));
                    Assert.That(Rewards(records[0]), Is.EqualTo(new[] { 3e38 + -1e38, -3.4e38 }));
                }
                Dictionary<string, JObject> lines = DemoLines(path);
                Assert.That(Rewards(lines["e/default_agent"]), Is.EqualTo(new[] { 3e38 + -1e38, -3.4e38 }), "the file's steps: as the record's");
                Assert.That(Rewards(lines["unrecorded/default_agent"]), Is.EqualTo(new[] { 3e38 }), "the reward its writer refused is left out of the file");
            }
            finally
            {
                File.Delete(path);
            }
        }

        [Test]
        public void TheMultiAgentClientChecksEachActorsCombinedStepRewardAndARefusedCallAddsNothingToAnyAgent()
        {
            string path = TempPath();
            try
            {
                ScriptedServer server = ScriptedServer.MultiAgent(1000000, rules: true);  // the group "pair" of m_0 and m_1, reward "mean"
                server.PongVersion = "1.6";
                Dictionary<string, double> returns;
                using (server)
                {
                    ClientOptions options = server.Options(3);
                    options.DemoPath = path;
                    using (MultiAgentClient client = MultiAgentClient.Connect(options))
                    {
                        string episode = client.StartEpisode("e");
                        var frame = new AgentFrame();
                        client.LogReturns(episode, "a_0", 3e38);  // before its first action: to no step, not limited
                        for (int t = 0; t < 3; ++t)
                        {
                            frame.Clear();
                            frame.Add("a_0", new[] { 0.1f * t, 0, 0, 0 });
                            frame.Add("m_0", new[] { 1f, t });
                            frame.Add("m_1", new[] { 2f, t });
                            client.GetActions(episode, frame);
                            if (t == 0)
                            {
                                client.LogReturns(episode, "a_0", 3e38);
                                client.LogReturns(episode, "m_0", 3e38);  // the group's step: 1.5e38 (the mean's share)
                                client.LogReturns(episode, "m_1", 3e38);  // ... 3e38
                                // The group's combined step would be 4e38: refused, naming the member and its group.
                                Refused(() => client.LogReturns(episode, "m_0", 2e38), "'m_0'", "'pair'", "episode 'e'");
                                // a_0's step would be 4e38: refused; nothing changes, for a_0 or any other agent.
                                Refused(() => client.LogReturns(episode, "a_0", 1e38), "'a_0'");
                                client.LogReturns(episode, "m_1", -2e38);  // the group's step takes more after a refusal: 2e38
                            }
                            else if (t == 1)
                            {
                                // A member's reward beyond float32 on its own, whose share is not: the combined sum counts.
                                client.LogReturns(episode, "m_0", 5e38);  // 2.5e38
                                Refused(() => client.LogReturns(episode, "m_1", 2e38), "'m_1'", "'pair'");  // 3.5e38
                                client.LogReturns(episode, "m_1", 1e37);  // 2.55e38
                                Refused(() => client.LogReturns(episode, "a_0", -3.5e38), "'a_0'");
                                client.LogReturns(episode, "a_0", -3.4e38);
                            }
                            else
                            {
                                client.LogReturns(episode, "a_0", 1.0);
                            }
                        }
                        returns = client.EndEpisode(episode, null, truncated: true);
                        client.Flush(10);
                    }
                }
                // The returns hold every reward not refused, none of the refused ones.
                Assert.That(returns["a_0"], Is.EqualTo(3e38 + 3e38 + -3.4e38 + 1.0).Within(1e-9 * 3e38));
                Assert.That(returns["pair"], Is.EqualTo(1.5e38 + 1.5e38 - 1e38 + 2.5e38 + 5e36).Within(1e-9 * 3e38));
                var specs = new Dictionary<string, ModuleSpec>();
                foreach (JProperty m in ((JObject)server.Config["modules"]).Properties()) specs[m.Name] = ModuleSpec.FromJson(m.Name, m.Value);
                var entries = new Dictionary<string, List<double>>();
                foreach (JObject batch in server.Received("EPISODES_AND_GET_STATE"))
                {
                    var records = (JArray)batch["episodes"];
                    for (int i = 0; i < records.Count; ++i)
                    {
                        EpisodeRecords.ValidateMultiAgentRecord(records[i], i, specs, true);  // (as the server checks them: rewards finite as float32)
                        foreach (JProperty agent in ((JObject)records[i]["agents"]).Properties())
                        {
                            if (!entries.ContainsKey(agent.Name)) entries[agent.Name] = new List<double>();
                            entries[agent.Name].AddRange(Rewards(agent.Value));
                        }
                    }
                }
                Assert.That(entries["a_0"], Is.EqualTo(new[] { 3e38, -3.4e38, 1.0 }));
                Assert.That(entries["pair"], Is.EqualTo(new[] { 1.5e38 + 1.5e38 + -1e38, 2.5e38 + 5e36, 0.0 }));
                Dictionary<string, JObject> lines = DemoLines(path);
                Assert.That(Rewards(lines["e/a_0"]), Is.EqualTo(entries["a_0"]), "the file's steps: as the records'");
                Assert.That(Rewards(lines["e/pair"]), Is.EqualTo(entries["pair"]));
            }
            finally
            {
                File.Delete(path);
            }
        }

        [Test]
        public void TheDemoWriterRefusesARewardThatWouldTakeItsStepBeyondFloat32AndAddsNothing()
        {
            var modules = new Dictionary<string, ModuleSpec>
            {
                { "m", new ModuleSpec { ModuleId = "m", ObservationSpace = Space.Box(new long[] { 2 }, -1, 1), ActionSpace = Space.Discrete(2) } },
            };
            var text = new StringWriter();
            using (var writer = new DemoWriter(text, modules))
            {
                writer.AddReward("e", "a", 5e38);  // (before its first step: nothing to add to, not limited)
                writer.Step("e", "a", "m", new[] { 0f, 0f }, new[] { 1.0 });
                writer.AddReward("e", "a", 2e38);
                Refused(() => writer.AddReward("e", "a", 2e38), "'a'", "episode 'e'", "2E+38");
                writer.AddReward("e", "a", -1e38);
                writer.AddReward("e", "a", 2.4e38);  // 3.4e38: within float32
                writer.Step("e", "a", "m", new[] { 0.5f, 0f }, new[] { 0.0 });
                Refused(() => writer.AddReward("e", "a", -3.5e38));
                writer.AddReward("e", "a", -3.4e38);
                writer.End("e", "a", new[] { 0f, 1f }, true);
            }
            string[] lines = text.ToString().TrimEnd('\n').Split('\n');
            Assert.That(lines.Length, Is.EqualTo(2));
            var line = JObject.Parse(lines[1]);
            Assert.That(Rewards(line), Is.EqualTo(new[] { 2e38 + -1e38 + 2.4e38, -3.4e38 }));
            // The reader takes the line (its rewards finite as float32, §18).
            ModuleSpec spec = modules["m"];
            EpisodeRecords.ValidateEpisodes(new JObject { { "episodes", new JArray(line) } }, spec.ObservationSpace, spec.ActionSpace, false, null, spec.ActionMask);
        }
    }
}
