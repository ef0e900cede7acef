// Demonstration files (protocol 1.6, §18): the writer, and the clients writing one while they play.
using System;
using System.Collections.Generic;
using System.IO;
using System.Linq;
using System.Text;
using Newtonsoft.Json.Linq;
using NUnit.Framework;
using Tether.Client;
using Tether.Protocol;

namespace Tether.Tests
{
    [TestFixture]
    public class DemonstrationTests
    {
        static readonly Space Box2 = Space.Box(new long[] { 2 }, -1, 1);

        static Dictionary<string, ModuleSpec> Modules(JToken modules)
        {
            var specs = new Dictionary<string, ModuleSpec>();
            foreach (JProperty m in ((JObject)modules).Properties()) specs[m.Name] = ModuleSpec.FromJson(m.Name, m.Value);
            return specs;
        }

        // The file's lines, each ended by a line feed (none blank).
        static List<JObject> Lines(string text)
        {
            Assert.That(text.EndsWith("\n", StringComparison.Ordinal), Is.True, "the last line ends with LF");
            string[] lines = text.Substring(0, text.Length - 1).Split('\n');
            Assert.That(lines.All(l => l.Length > 0 && !l.Contains("\r")), Is.True, "no blank line, no CR");
            return lines.Select(l => (JObject)Messages.ParseJson(Encoding.UTF8.GetBytes(l))).ToList();
        }

        static string ReadShared(string path)
        {
            using (var stream = new FileStream(path, FileMode.Open, FileAccess.Read, FileShare.ReadWrite))
            using (var reader = new StreamReader(stream, Encoding.UTF8))
            {
                return reader.ReadToEnd();
            }
        }

        // The header names these modules' spaces (compared as spaces: a Box's equal bounds may be written once).
        static void ExpectHeader(JObject header, IDictionary<string, ModuleSpec> modules)
        {
            Assert.That((string)header["format"], Is.EqualTo("tether-demonstrations"));
            Assert.That(header["version"].Type, Is.EqualTo(JTokenType.Integer));
            Assert.That((int)header["version"], Is.EqualTo(1));
            var written = (JObject)header["modules"];
            Assert.That(written.Properties().Select(p => p.Name), Is.EquivalentTo(modules.Keys));
            foreach (KeyValuePair<string, ModuleSpec> module in modules)
            {
                ModuleSpec got = ModuleSpec.FromJson(module.Key, written[module.Key]);
                Assert.That(JToken.DeepEquals(got.ObservationSpace.ToJson(), module.Value.ObservationSpace.ToJson()), Is.True, module.Key + ": observation_space");
                Assert.That(JToken.DeepEquals(got.ActionSpace.ToJson(), module.Value.ActionSpace.ToJson()), Is.True, module.Key + ": action_space");
                Assert.That(got.ActionMask == null ? null : got.ActionMask.Leaf, Is.EqualTo(module.Value.ActionMask == null ? null : module.Value.ActionMask.Leaf));
            }
        }

        // Every episode line passes the server's checks of a record in its module's spaces (§18: 1-14d and 20).
        static void ExpectValidLines(List<JObject> lines, IDictionary<string, ModuleSpec> modules)
        {
            foreach (JObject line in lines.Skip(1))
            {
                ModuleSpec spec = modules[(string)line["module"]];
                var message = new JObject { { "episodes", new JArray(line) } };
                EpisodeRecords.ValidateEpisodes(message, spec.ObservationSpace, spec.ActionSpace, false, null, spec.ActionMask);
                Assert.That((bool)line["is_terminated"] || (bool)line["is_truncated"], Is.True, "whole episodes only");
                foreach (string absent in new[] { "action_logp", "action_dist_inputs", "state_in", "weights_seq_no_runs" }) Assert.That(line[absent], Is.Null, absent);
            }
        }

        // ---- the vectors -------------------------------------------------------------------------------

        [Test]
        public void WriteVectors()
        {
            Vectors.Check("demonstrations.json", (file, c) =>
            {
                if ((string)c["kind"] != "write") return;  // ("read": the server's reader)
                Dictionary<string, ModuleSpec> modules = Modules(c["modules"]);
                var text = new StringWriter();
                using (var writer = new DemoWriter(text, modules))
                {
                    foreach (JObject episode in c["episodes"])
                    {
                        string id = (string)episode["episode_id"], agent = (string)episode["agent_id"] ?? DemoWriter.DefaultAgent;
                        foreach (JArray step in episode["steps"])
                        {
                            writer.Step(id, agent, DemoWriter.DefaultModule, Vectors.Flat(step[0]).Select(v => (float)v).ToArray(), Vectors.Flat(step[1]), (bool)step[3]);
                            writer.AddReward(id, agent, (double)step[2]);
                        }
                        if (episode["final_obs"].Type == JTokenType.Null) continue;  // (still running when the writer closes)
                        Vectors.Expect(writer.End(id, agent, Vectors.Flat(episode["final_obs"]).Select(v => (float)v).ToArray(), (bool)episode["terminated"]), "episode " + id + " written");
                    }
                }
                string written = text.ToString();
                Vectors.Expect(written.EndsWith("\n", StringComparison.Ordinal) && !written.Contains("\n\n") && !written.Contains("\r"), "JSON Lines ended by LF");
                string[] lines = written.Substring(0, written.Length - 1).Split('\n');
                var expected = (JArray)c["lines"];
                Vectors.Expect(lines.Length == expected.Count, lines.Length + " lines");
                var header = (JObject)Messages.ParseJson(Encoding.UTF8.GetBytes(lines[0]));
                Vectors.Expect((string)header["format"] == (string)expected[0]["format"] && JToken.DeepEquals(header["version"], expected[0]["version"]), "header " + lines[0]);
                Dictionary<string, ModuleSpec> named = Modules(header["modules"]), wanted = Modules(expected[0]["modules"]);
                Vectors.Expect(named.Count == wanted.Count, "header modules");
                foreach (KeyValuePair<string, ModuleSpec> module in wanted)
                {
                    // (spaces compared as spaces: the canonical form writes a Box's equal bounds once)
                    ModuleSpec got;
                    Vectors.Expect(named.TryGetValue(module.Key, out got) && JToken.DeepEquals(got.ObservationSpace.ToJson(), module.Value.ObservationSpace.ToJson()) &&
                                   JToken.DeepEquals(got.ActionSpace.ToJson(), module.Value.ActionSpace.ToJson()), "header module " + module.Key);
                }
                for (int i = 1; i < lines.Length; ++i)
                {
                    JToken line = Messages.ParseJson(Encoding.UTF8.GetBytes(lines[i]));
                    Vectors.Expect(JToken.DeepEquals(line, expected[i]), "line " + (i + 1) + ": " + lines[i]);
                    Vectors.Expect(((JObject)expected[i]).Properties().All(p => p.Value.Type == line[p.Name].Type), "line " + (i + 1) + ": the JSON types (integers, floats)");
                }
            });
        }

        // ---- the writer ----------------------------------------------------------------------------------

        [Test]
        public void EpisodesStillRunningAtCloseAreWrittenTruncatedAtTheirLastCompleteStep()
        {
            var modules = new Dictionary<string, ModuleSpec> { { "m", new ModuleSpec { ModuleId = "m", ObservationSpace = Box2, ActionSpace = Space.Discrete(3, 1) } } };
            var text = new StringWriter();
            var writer = new DemoWriter(text, modules);
            writer.Step("e1", "a", "m", new[] { 0.5f, 0f }, new[] { 1.0 }, true);
            writer.AddReward("e1", "a", 0.25);
            writer.Step("e1", "a", "m", new[] { 0.25f, 0.125f }, new[] { 3.0 });
            writer.AddReward("e1", "a", 1);
            writer.Step("e1", "a", "m", new[] { -1f, 1f }, new[] { 2.0 }, true);  // (no observation follows it: left out)
            writer.Step("e1", "b", "m", new[] { 0f, 0f }, new[] { 2.0 });  // (a single step: nothing to write)
            writer.Step("e2", "a", "m", new[] { 0.75f, 0f }, new[] { 2.0 });
            Assert.That(writer.End("e2", "a", new[] { 0f, 0.5f }, terminated: true), Is.True);
            Assert.That(writer.End("e2", "never", new[] { 0f, 0.5f }, terminated: true), Is.False, "an agent without steps is not written");
            Assert.That(writer.EpisodesRunning, Is.EqualTo(2));
            writer.Dispose();
            writer.Dispose();  // (once)
            Assert.That(writer.EpisodesWritten, Is.EqualTo(2));
            List<JObject> lines = Lines(text.ToString());
            ExpectHeader(lines[0], modules);
            ExpectValidLines(lines, modules);
            Assert.That(lines.Count, Is.EqualTo(3));
            Assert.That(lines[1].ToString(Newtonsoft.Json.Formatting.None), Is.EqualTo(
                "{\"module\":\"m\",\"agent_id\":\"a\",\"episode_id\":\"e2\",\"obs\":[[0.75,0.0],[0.0,0.5]],\"actions\":[2],\"rewards\":[0.0],\"is_terminated\":true,\"is_truncated\":false}"));
            Assert.That(lines[2].ToString(Newtonsoft.Json.Formatting.None), Is.EqualTo(
                "{\"module\":\"m\",\"agent_id\":\"a\",\"episode_id\":\"e1\",\"obs\":[[0.5,0.0],[0.25,0.125],[-1.0,1.0]],\"actions\":[1,3],\"rewards\":[0.25,1.0]," +
                "\"logged_runs\":[[0,1]],\"is_terminated\":false,\"is_truncated\":true}"));
            Assert.That(Assert.Throws<TetherException>(() => writer.Step("e3", "a", "m", new[] { 0f, 0f }, new[] { 1.0 })).Code, Is.EqualTo(ErrorCode.Closed));
        }

        [Test]
        public void TheWriterRefusesWhatAReaderWouldRefuse()
        {
            var modules = new Dictionary<string, ModuleSpec> { { "m", new ModuleSpec { ModuleId = "m", ObservationSpace = Box2, ActionSpace = Space.Discrete(2) } } };
            var text = new StringWriter();
            using (var writer = new DemoWriter(text, modules))
            {
                Func<TestDelegate, ErrorCode> code = call => Assert.Throws<TetherException>(call).Code;
                Assert.That(code(() => writer.Step("e", "a", "other", new[] { 0f, 0f }, new[] { 1.0 })), Is.EqualTo(ErrorCode.InvalidArgument));
                Assert.That(code(() => writer.Step("e", "a", "m", new[] { 0f }, new[] { 1.0 })), Is.EqualTo(ErrorCode.InvalidArgument));
                Assert.That(code(() => writer.Step("e", "a", "m", new[] { float.NaN, 0f }, new[] { 1.0 })), Is.EqualTo(ErrorCode.NonFiniteValue));
                Assert.That(code(() => writer.Step("e", "a", "m", new[] { 0f, 0f }, new[] { 2.0 })), Is.EqualTo(ErrorCode.ActionOutOfSpace));
                Assert.That(code(() => writer.Step("e", "a", "m", new[] { 0f, 0f }, new[] { 1.0, 0.0 })), Is.EqualTo(ErrorCode.ActionOutOfSpace));
                Assert.That(code(() => writer.AddReward("e", "a", double.NaN)), Is.EqualTo(ErrorCode.NonFiniteValue));
                writer.AddReward("e", "a", 5);  // (before its first step: nothing to add to, as in a record)
                writer.Step("e", "a", "m", new[] { 0f, 0f }, new[] { 1.0 });
                Assert.That(code(() => writer.End("e", "a", new[] { 0f, float.PositiveInfinity }, true)), Is.EqualTo(ErrorCode.NonFiniteValue));
                writer.End("e", "a", new[] { 0f, 1f }, true);
                Assert.That(code(() => new DemoWriter(new StringWriter(), new Dictionary<string, ModuleSpec>())), Is.EqualTo(ErrorCode.InvalidArgument));
            }
            List<JObject> lines = Lines(text.ToString());
            Assert.That(lines.Count, Is.EqualTo(2), "the header and the one episode");
            Assert.That(lines[1]["rewards"].Select(r => (double)r), Is.EqualTo(new[] { 0.0 }));
        }

        [Test]
        public void ADictObservationGoesLeafByLeafAndABytesLeafAsIntegers()
        {
            // Dict(cam: uint8 Box [2], mask: Box [3]) -> Discrete(3) masked by "mask"; and a module of a byte box.
            Space dict = Space.Dict(new[]
            {
                new KeyValuePair<string, Space>("mask", Space.Box(new long[] { 3 }, 0, 1)),
                new KeyValuePair<string, Space>("cam", Space.ByteBox(new long[] { 2 })),
            });
            Space discrete = Space.Discrete(3);
            var modules = new Dictionary<string, ModuleSpec>
            {
                { "dict", new ModuleSpec { ModuleId = "dict", ObservationSpace = dict, ActionSpace = discrete, ActionMask = ActionMask.Resolve(dict, discrete, "mask") } },
                { "image", new ModuleSpec { ModuleId = "image", ObservationSpace = Space.ByteBox(new long[] { 1, 2 }), ActionSpace = Space.MultiDiscrete(new long[] { 2, 3 }) } },
            };
            var text = new StringWriter();
            using (var writer = new DemoWriter(text, modules))
            {
                // The flat row: the leaves in leaf order (cam, then mask).
                Assert.That(Assert.Throws<TetherException>(() => writer.Step("e", "d", "dict", new[] { 7f, 255f, 1f, 0f, 0f }, new[] { 2.0 })).Code, Is.EqualTo(ErrorCode.ActionMasked));
                Assert.That(Assert.Throws<TetherException>(() => writer.Step("e", "d", "dict", new[] { 7.5f, 255f, 1f, 0f, 0f }, new[] { 0.0 })).Code, Is.EqualTo(ErrorCode.ObsDtypeMismatch));
                writer.Step("e", "d", "dict", new[] { 7f, 255f, 1f, 0f, 0f }, new[] { 0.0 }, true);
                writer.End("e", "d", new[] { 0f, 1f, 0f, 0f, 0f }, false);  // (a final mask is not checked)
                writer.Step("e", "i", "image", new[] { 3f, 4f }, new[] { 1.0, 2.0 });
                writer.End("e", "i", new[] { 5f, 6f }, true);
            }
            List<JObject> lines = Lines(text.ToString());
            ExpectHeader(lines[0], modules);
            Assert.That((string)lines[0]["modules"]["dict"]["action_mask"], Is.EqualTo("mask"));
            ExpectValidLines(lines, modules);
            Assert.That(lines[1]["obs"].ToString(Newtonsoft.Json.Formatting.None), Is.EqualTo("{\"cam\":[[7,255],[0,1]],\"mask\":[[1.0,0.0,0.0],[0.0,0.0,0.0]]}"));
            Assert.That(lines[1]["logged_runs"].ToString(Newtonsoft.Json.Formatting.None), Is.EqualTo("[[0,1]]"));
            Assert.That(lines[2]["obs"].ToString(Newtonsoft.Json.Formatting.None), Is.EqualTo("[[[3,4]],[[5,6]]]"));
            Assert.That(lines[2]["actions"].ToString(Newtonsoft.Json.Formatting.None), Is.EqualTo("[[1,2]]"));
        }

        [Test]
        public void AFileGetsEachLineAsItsEpisodeEnds()
        {
            string path = Path.Combine(Path.GetTempPath(), "tether-demo-" + Guid.NewGuid().ToString("N") + ".jsonl");
            try
            {
                using (var writer = new DemoWriter(path, Box2, Space.Discrete(2)))
                {
                    Assert.That(Lines(ReadShared(path)).Count, Is.EqualTo(1), "the header, at once");
                    writer.Step("e", DemoWriter.DefaultAgent, DemoWriter.DefaultModule, new[] { 0.5f, 0.5f }, new[] { 1.0 });
                    writer.End("e", DemoWriter.DefaultAgent, new[] { 0f, 0f }, true);
                    List<JObject> lines = Lines(ReadShared(path));
                    Assert.That(lines.Count, Is.EqualTo(2), "flushed as it ended");
                    Assert.That(lines[0]["modules"].Select(m => ((JProperty)m).Name), Is.EqualTo(new[] { "default_policy" }));
                }
                byte[] bytes = File.ReadAllBytes(path);
                Assert.That(bytes.Take(3), Is.Not.EqualTo(new byte[] { 0xEF, 0xBB, 0xBF }), "UTF-8 without a byte order mark");
            }
            finally
            {
                File.Delete(path);
            }
        }

        // ---- the clients ---------------------------------------------------------------------------------

        static readonly float[] Obs = { 0.1f, -0.2f, 0.3f, 0.0f };

        [Test]
        public void TheSingleAgentClientWritesEveryEpisodeItPlays()
        {
            string path = Path.Combine(Path.GetTempPath(), "tether-demo-" + Guid.NewGuid().ToString("N") + ".jsonl");
            try
            {
                using (var server = new ScriptedServer(1000000) { PongVersion = "1.6" })
                {
                    ClientOptions options = server.Options(7);
                    options.DemoPath = path;
                    using (TetherClient client = TetherClient.Connect(options))
                    {
                        Assert.That(client.RecordsDemonstrations, Is.True);
                        var action = new double[1];
                        var played = new List<double>();
                        string trained = client.StartEpisode("trained");
                        client.GetAction(trained, Obs, action);
                        played.Add(action[0]);
                        client.LogReturns(trained, 1.0);
                        client.LogAction(trained, Obs, new[] { 1.0 });
                        client.LogReturns(trained, 0.5);
                        client.GetAction(trained, Obs, action);
                        played.Add(action[0]);
                        client.EndEpisode(trained, Obs);
                        string played2 = client.StartEpisode("played", trainingEnabled: false);
                        for (int t = 0; t < 3; ++t) client.GetAction(played2, Obs, action);
                        client.EndEpisode(played2, Obs, truncated: true);
                        string running = client.StartEpisode("running");
                        for (int t = 0; t < 3; ++t) client.GetAction(running, Obs, action);
                        Assert.That(client.DemonstrationsWritten, Is.EqualTo(2));
                        Assert.That(Lines(ReadShared(path)).Count, Is.EqualTo(3), "each line as its episode ended");
                        client.Flush(10);
                        JObject record = (JObject)server.Received("EPISODES_AND_GET_STATE").SelectMany(b => b["episodes"]).First(r => (string)r["episode_id"] == "trained");
                        List<JObject> lines = Lines(ReadShared(path));
                        JObject line = lines[1];
                        Assert.That((string)line["episode_id"], Is.EqualTo("trained"));
                        Assert.That((string)line["agent_id"], Is.EqualTo("default_agent"));
                        Assert.That((string)line["module"], Is.EqualTo("default_policy"));
                        foreach (string field in new[] { "obs", "actions", "rewards", "logged_runs", "is_terminated", "is_truncated" })
                        {
                            Assert.That(JToken.DeepEquals(line[field], record[field]), Is.True, field + ": the same steps as the record sent");
                        }
                        Assert.That(line["actions"].Select(a => (double)a), Is.EqualTo(new[] { played[0], 1.0, played[1] }));
                    }
                }
                List<JObject> all = Lines(File.ReadAllText(path));
                var modules = new Dictionary<string, ModuleSpec>
                {
                    { "default_policy", new ModuleSpec { ModuleId = "default_policy", ObservationSpace = Space.Box(new long[] { 4 }, -10, 10), ActionSpace = Space.Discrete(2) } },
                };
                ExpectHeader(all[0], modules);
                ExpectValidLines(all, modules);
                Assert.That(all.Skip(1).Select(l => (string)l["episode_id"]), Is.EqualTo(new[] { "trained", "played", "running" }));
                Assert.That((bool)all[2]["is_truncated"], Is.True, "ended as truncated");
                Assert.That(((JArray)all[2]["actions"]).Count, Is.EqualTo(3), "an episode not trained on is written too");
                Assert.That((bool)all[3]["is_truncated"], Is.True, "still running when the client was disposed");
                Assert.That(((JArray)all[3]["actions"]).Count, Is.EqualTo(2), "... up to its last complete step");
            }
            finally
            {
                File.Delete(path);
            }
        }

        [Test]
        public void TheMultiAgentClientWritesEachActorsEpisode()
        {
            string path = Path.Combine(Path.GetTempPath(), "tether-demo-" + Guid.NewGuid().ToString("N") + ".jsonl");
            try
            {
                ScriptedServer server = ScriptedServer.MultiAgent(1000000, rules: true);
                server.PongVersion = "1.6";
                using (server)
                {
                    ClientOptions options = server.Options(3);
                    options.DemoPath = path;
                    using (MultiAgentClient client = MultiAgentClient.Connect(options))
                    {
                        string episode = client.StartEpisode("e");
                        var frame = new AgentFrame();
                        for (int t = 0; t < 4; ++t)
                        {
                            frame.Clear();
                            frame.Add("a_0", new[] { 0.1f * t, 0, 0, 0 });
                            frame.Add("a_1", new[] { 0, 0.1f * t, 0, 0 });
                            frame.Add("m_0", new[] { 1f, t });
                            frame.Add("m_1", new[] { 2f, t });
                            if (t == 1) frame.LogAction("a_1", new[] { 1.0 });
                            client.GetActions(episode, frame);
                            client.LogReturns(episode, "a_0", 1.0);
                            client.LogReturns(episode, "m_1", 1.0);  // (to the group, halved: its reward is the mean)
                        }
                        client.RetireAgent(episode, "a_0", new[] { 9f, 9f, 9f, 9f });
                        client.EndEpisode(episode, null, truncated: true);
                    }
                }
                List<JObject> lines = Lines(File.ReadAllText(path));
                var modules = new Dictionary<string, ModuleSpec>();
                foreach (JProperty m in ((JObject)server.Config["modules"]).Properties()) modules[m.Name] = ModuleSpec.FromJson(m.Name, m.Value);
                ExpectHeader(lines[0], modules);
                ExpectValidLines(lines, modules);
                Dictionary<string, JObject> byActor = lines.Skip(1).ToDictionary(l => (string)l["agent_id"]);
                Assert.That(lines.Skip(1).First()["agent_id"].ToString(), Is.EqualTo("a_0"), "the first to end");
                Assert.That(byActor.Keys, Is.EquivalentTo(new[] { "a_0", "a_1", "pair" }));
                Assert.That((string)byActor["pair"]["module"], Is.EqualTo("lifter"));
                Assert.That(byActor["pair"]["obs"][3].ToString(Newtonsoft.Json.Formatting.None), Is.EqualTo("[1.0,3.0,2.0,3.0]"), "the members' observations joined");
                Assert.That(byActor["pair"]["rewards"].Select(r => (double)r), Is.EqualTo(Enumerable.Repeat(0.5, 4)));
                Assert.That(byActor["a_0"]["obs"][4].ToString(Newtonsoft.Json.Formatting.None), Is.EqualTo("[9.0,9.0,9.0,9.0]"));
                Assert.That((bool)byActor["a_0"]["is_terminated"], Is.True);
                Assert.That((bool)byActor["a_1"]["is_truncated"], Is.True);
                Assert.That(byActor["a_1"]["logged_runs"].ToString(Newtonsoft.Json.Formatting.None), Is.EqualTo("[[1,1]]"));
                Assert.That((int)byActor["a_1"]["actions"][1], Is.EqualTo(1));
                Assert.That(byActor["a_0"]["logged_runs"], Is.Null);
            }
            finally
            {
                File.Delete(path);
            }
        }
    }
}
