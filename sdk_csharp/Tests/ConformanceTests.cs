// The shared conformance vectors, run against the C# protocol core.
using System;
using System.Collections.Generic;
using System.IO;
using System.Linq;
using System.Text;
using Newtonsoft.Json.Linq;
using NUnit.Framework;
using Tether.Client;
using Tether.Protocol;
using Tether.Sampling;

namespace Tether.Tests
{
    [TestFixture]
    public class ConformanceTests
    {
        static readonly string[] Claimed =
        {
            "framing.json", "messages.json", "spaces.json", "logp.json", "policy_mapping.json", "session.json", "client_pairing.json",
            "episodes.json", "multi_agent_episodes.json", "groups.json", "value_obs.json", "tensors.json",
            "composite.json",  // (CompositeTests)
            "recurrent.json",  // (RecurrentTests: its "module" and "carry" cases; "episode" is a server's)
            "logged.json",  // ("episode" and "agent_entry" here; "record" in LoggedStepsTests)
            "demonstrations.json",  // (DemonstrationTests: its "write" cases; "read" is a server's reader)
            "rewards.json",
            "env_params.json",  // ("set", "draw" and "draw_all" here; "record" is a server's check)
            "run_ids.json",  // (1.8; the client's drops in AnotherRunTests)
            "rank_addresses.json",  // (1.9; the link's redirects and reconnect order in RankGroupTests)
            "offline_policy.json",  // (§20; offline clients in OfflinePolicyTests)
            "agent_modules.json",
            "cuts.json",  // (§13.3: both clients play its calls in CutVectorTests)
        };

        // Vectors of a server's answers: they need a live server, not a client SDK.
        static readonly string[] ServerSession =
            { "connection.json", "counting.json", "exactly_once.json", "map_agents.json", "multi_agent_sessions.json", "set_state.json" };

        [Test]
        public void EveryVectorFileIsAccountedFor()
        {
            var seen = new HashSet<string>(Directory.GetFiles(Vectors.Directory, "*.json").Select(Path.GetFileName));
            var listed = new HashSet<string>(Claimed.Concat(ServerSession));
            Assert.That(seen, Is.EquivalentTo(listed));
        }

        [Test]
        public void Framing()
        {
            Vectors.Check("framing.json", (file, c) =>
            {
                byte[] input = Vectors.FromHex((string)c["input_hex"]);
                foreach (int step in new[] { 1, 7, 1 << 20 })
                {
                    var decoder = c["max_frame_bytes"] != null ? new FrameDecoder((int)c["max_frame_bytes"]) : new FrameDecoder();
                    var bodies = new List<byte[]>();
                    for (int i = 0; i < input.Length; i += step)
                    {
                        try
                        {
                            decoder.Feed(input, i, Math.Min(step, input.Length - i), bodies);
                        }
                        catch (ProtocolException)
                        {
                            break;
                        }
                    }
                    var got = bodies.Select(b => Encoding.UTF8.GetString(b)).ToList();
                    if (c["error"] != null)
                    {
                        var before = c["bodies_before_error"] != null ? c["bodies_before_error"].Select(b => (string)b).ToList() : new List<string>();
                        Vectors.Expect(got.SequenceEqual(before), "step " + step + ": bodies before the error differ");
                        Vectors.Expect(decoder.Error != null && ErrorCodes.ToWire(decoder.Error.Code) == (string)c["error"],
                               "step " + step + ": expected " + c["error"] + ", got " + (decoder.Error == null ? "none" : decoder.Error.Message));
                        var more = new List<byte[]>();
                        Vectors.ExpectError((string)c["error"], () => decoder.Feed(Encoding.ASCII.GetBytes("00000002{}"), more));  // stays failed
                        Vectors.Expect(more.Count == 0, "a failed decoder gave a body");
                    }
                    else
                    {
                        Vectors.Expect(decoder.Error == null, "step " + step + ": unexpected " + (decoder.Error == null ? "" : decoder.Error.Message));
                        Vectors.Expect(got.SequenceEqual(c["bodies"].Select(b => (string)b)), "step " + step + ": bodies differ");
                    }
                }
            });
        }

        [Test]
        public void Messages()
        {
            Vectors.Check("messages.json", (file, c) =>
            {
                byte[] body = Vectors.FromHex((string)c["body_hex"]);
                if (c["error"] != null)
                {
                    Vectors.ExpectError((string)c["error"], () => Protocol.Messages.Decode(body));
                    return;
                }
                Message m = Protocol.Messages.Decode(body);
                Vectors.Expect(Protocol.Messages.ToWire(m.Type) == (string)c["type"], "type " + m.Type);
                Vectors.Expect((string)m.Body["type"] == (string)c["type"], "body type");
                // 1.4 (§4.3): the bytes after the first NUL are the attachment, whatever they are.
                int nul = Array.IndexOf(body, (byte)0);
                Vectors.Expect(nul < 0 ? m.Attachment == null : m.Attachment != null && m.Attachment.SequenceEqual(body.Skip(nul + 1)), "attachment");
            });
        }

        [Test]
        public void Spaces()
        {
            Vectors.Check("spaces.json", (file, c) =>
            {
                if (c["error"] != null)
                {
                    Vectors.ExpectError((string)c["error"], () => Space.FromJson(c["space"]));
                    return;
                }
                Space s = Space.FromJson(c["space"]);
                Vectors.Expect(s.Shape.SequenceEqual(c["shape"].Select(d => (long)d)), "shape");
                Vectors.Expect(s.DistInputsSize == (int)c["dist_inputs_size"], "dist_inputs_size " + s.DistInputsSize);
                // The canonical JSON a peer writes back parses to the same space.
                JToken again = Protocol.Messages.ParseJson(Encoding.UTF8.GetBytes(s.ToJson().ToString(Newtonsoft.Json.Formatting.None)));
                Vectors.Expect(JToken.DeepEquals(Space.FromJson(again).ToJson(), s.ToJson()), "round trip");
            });
        }

        [Test]
        public void Logp()
        {
            Vectors.Check("logp.json", (file, c) =>
            {
                Space s = Space.FromJson(c["space"]);
                double[] inputs = Vectors.Flat(c["dist_inputs"]);
                double[] action = Vectors.Flat(c["action"]);
                double expected = (double)c["logp"];
                double got = Distributions.LogProb(s, inputs, 0, inputs.Length, action, 0, action.Length);
                Vectors.Expect(Math.Abs(got - expected) <= Math.Max(1e-9, 1e-9 * Math.Abs(expected)), "logp " + got + " != " + expected);
                // float32 dist inputs (a model's output) agree to float precision.
                float[] inputs32 = inputs.Select(x => (float)x).ToArray();
                double got32 = Distributions.LogProb(s, inputs32, 0, inputs32.Length, action, 0, action.Length);
                Vectors.Expect(Math.Abs(got32 - expected) <= 1e-5, "float32 logp " + got32 + " != " + expected);
                if (c["env_action"] != null)
                {
                    var env = new double[action.Length];
                    Distributions.ToEnvAction(s, action, 0, env, 0, action.Length);
                    double[] expectedEnv = Vectors.Flat(c["env_action"]);
                    for (int i = 0; i < env.Length; ++i)
                    {
                        Vectors.Expect(Math.Abs(env[i] - expectedEnv[i]) <= 1e-6 * Math.Abs(expectedEnv[i]) + 1e-12, "env_action[" + i + "]");
                    }
                }
            });
        }

        [Test]
        public void Session()
        {
            Vectors.Check("session.json", (file, c) =>
            {
                JToken token = c["server"]["auth_token"];
                var conn = new ServerConnection(token == null ? null : (string)token);
                var got = new List<string>();
                foreach (JObject request in c["requests"])
                {
                    var bodies = new List<byte[]>();
                    new FrameDecoder().Feed(Protocol.Messages.EncodeFrame(request), bodies);
                    ServerEvent e = conn.HandleBody(bodies[0]);
                    if (!e.Accepted)
                    {
                        got.Add("ERROR:" + ErrorCodes.ToWire(e.Refusal.Code));
                    }
                    else
                    {
                        MessageType? response = Protocol.Messages.ExpectedResponse(e.Type.Value);
                        got.Add(response == null ? "null" : Protocol.Messages.ToWire(response.Value));
                    }
                }
                Vectors.Expect(got.SequenceEqual(c["responses"].Select(r => (string)r)), "responses " + string.Join(",", got.ToArray()));
            });
        }

        [Test]
        public void ClientPairing()
        {
            Vectors.Check("client_pairing.json", (file, c) =>
            {
                var conn = new ClientConnection();
                foreach (JToken kind in c["sent"]) conn.Send(new JObject { { "type", kind } });
                var data = new List<byte>();
                foreach (JObject body in c["received"]) data.AddRange(Protocol.Messages.EncodeFrame(body));
                var responses = new List<Response>();
                TetherException error = null;
                try
                {
                    conn.ReceiveData(data.ToArray(), 0, data.Count, responses);
                }
                catch (TetherException e)
                {
                    error = e;
                }
                if (c["violation"] != null && (bool)c["violation"])
                {
                    Vectors.Expect(error != null && (error.Code == ErrorCode.NotARequest || error.Code == ErrorCode.UnknownType),
                           "expected a violation, got " + (error == null ? "none" : error.Message));
                    Vectors.Expect(conn.Closed, "a violation closes the connection");
                    return;
                }
                var pairs = new JArray(responses.Select(r => r.Request == null ? JValue.CreateNull() : new JValue(Protocol.Messages.ToWire(r.Request.Value))));
                Vectors.Expect(JToken.DeepEquals(pairs, c["pairs"]), "pairs " + pairs.ToString(Newtonsoft.Json.Formatting.None));
                // Only a connection-level ERROR (one that closes) may end the connection here.
                Vectors.Expect(error == null || Protocol.Messages.ClosesConnection(error.Code), "closed by " + (error == null ? "" : error.Message));
            });
        }

        static float[] FlatFloat(JToken value) { return Vectors.Flat(value).Select(x => (float)x).ToArray(); }

        [Test]
        public void Episodes()
        {
            Vectors.Check("episodes.json", (file, c) =>
            {
                Vectors.CheckEpisodesCase(c, Space.FromJson(c["observation_space"]), Space.FromJson(c["action_space"]));
            });
        }

        [Test]
        public void LoggedSteps()
        {
            Vectors.Check("logged.json", (file, c) =>
            {
                string kind = (string)c["kind"];
                if (kind == "episode")
                {
                    Vectors.CheckEpisodesCase(c, Space.FromJson(c["observation_space"]), Space.FromJson(c["action_space"]));
                    if (c["error"] != null) return;
                    JToken record = Protocol.Messages.Decode(Encoding.UTF8.GetBytes((string)c["body"])).Body["episodes"][0];
                    ExpectLoggedSteps(record, c["logged_steps"], "the record");
                    return;
                }
                if (kind != "agent_entry") return;  // ("record": what a client records, LoggedStepsTests)
                var modules = new Dictionary<string, ModuleSpec>();
                foreach (JProperty item in ((JObject)c["modules"]).Properties()) modules[item.Name] = ModuleSpec.FromJson(item.Name, item.Value);
                if (c["error"] != null)
                {
                    Vectors.ExpectError((string)c["error"], () => EpisodeRecords.ValidateMultiAgentRecord(c["record"], 0, modules, (bool)c["require_logp"]));
                    return;
                }
                int steps = EpisodeRecords.ValidateMultiAgentRecord(c["record"], 0, modules, (bool)c["require_logp"]);
                Vectors.Expect(steps == (int)c["agent_steps"], "agent steps " + steps);
                foreach (JProperty agent in ((JObject)c["logged_steps"]).Properties())
                {
                    ExpectLoggedSteps(c["record"]["agents"][agent.Name], agent.Value, "agent '" + agent.Name + "'");
                }
            });
        }

        // The logged step indices a record's (or entry's) logged_runs names are the expected ones.
        static void ExpectLoggedSteps(JToken record, JToken expected, string what)
        {
            List<int> got = LoggedRuns.Steps(record[LoggedRuns.Field]);
            Vectors.Expect(got.SequenceEqual(expected.Select(t => (int)t)), what + ": logged steps [" + string.Join(", ", got.Select(t => t.ToString()).ToArray()) + "]");
        }

        [Test]
        public void TensorObjects()
        {
            Vectors.Check("tensors.json", (file, c) =>
            {
                byte[] attachment = c["attachment_hex"] != null ? Vectors.FromHex((string)c["attachment_hex"]) : null;
                if (c["error"] != null)
                {
                    Vectors.ExpectError((string)c["error"], () => Tensors.Decode(c["tensor"], attachment));
                    return;
                }
                Tensor tensor = Tensors.Decode(c["tensor"], attachment);
                Vectors.Expect(tensor.Dtype == (string)c["dtype"], "dtype " + tensor.Dtype);
                Vectors.Expect(tensor.Shape.SequenceEqual(c["shape"].Select(d => (long)d)), "shape " + Tensors.ShapeText(tensor.Shape));
                double[] values = tensor.ToDoubles();
                double[] expected = c["values"].Select(v => (double)v).ToArray();
                Vectors.Expect(values.SequenceEqual(expected), "values " + string.Join(", ", values.Select(v => v.ToString("R")).ToArray()));
                // What the codec writes reads back the same, byte for byte: inline, the very object; at an offset, its members.
                if (c["tensor"]["b64"] != null)
                {
                    Vectors.Expect(JToken.DeepEquals(Tensors.Encode(tensor), c["tensor"]), "encoded again " + Tensors.Encode(tensor).ToString(Newtonsoft.Json.Formatting.None));
                    JObject typed = tensor.Dtype == Tensors.Uint8 ? Tensors.Encode(tensor.ToBytes(), tensor.Shape)
                                                                  : Tensors.Encode(values.Select(v => (float)v).ToArray(), tensor.Shape);
                    Vectors.Expect(JToken.DeepEquals(typed, c["tensor"]), "encoded from values " + typed.ToString(Newtonsoft.Json.Formatting.None));
                }
                else
                {
                    JObject at = Tensors.EncodeAt(tensor.Dtype, tensor.Shape, (long)c["tensor"]["offset"]);
                    Vectors.Expect(JToken.DeepEquals(at, c["tensor"]), "encoded at its offset " + at.ToString(Newtonsoft.Json.Formatting.None));
                }
            });
        }

        [Test]
        public void MultiAgentEpisodes()
        {
            Vectors.Check("multi_agent_episodes.json", (file, c) =>
            {
                var modules = new Dictionary<string, ModuleSpec>();
                foreach (JProperty item in ((JObject)c["modules"]).Properties()) modules[item.Name] = ModuleSpec.FromJson(item.Name, item.Value);
                JToken record = c["record_json"] != null ? Protocol.Messages.ParseJson(Encoding.UTF8.GetBytes((string)c["record_json"])) : c["record"];
                if (c["error"] != null)
                {
                    Vectors.ExpectError((string)c["error"], () => EpisodeRecords.ValidateMultiAgentRecord(record, 0, modules, (bool)c["require_logp"]));
                    return;
                }
                int steps = EpisodeRecords.ValidateMultiAgentRecord(record, 0, modules, (bool)c["require_logp"]);
                Vectors.Expect(steps == (int)c["agent_steps"], "agent steps " + steps);
            });
        }

        [Test]
        public void Groups()
        {
            Vectors.Check("groups.json", (file, c) =>
            {
                if (c["member_action_spaces"] != null)
                {
                    var obs = c["member_observation_spaces"].Select(Space.FromJson).ToList();
                    var act = c["member_action_spaces"].Select(Space.FromJson).ToList();
                    if (c["error"] != null)
                    {
                        Vectors.Expect(Throws(() => GroupSpec.Spaces(obs, act)), "expected the spaces to be refused");
                        return;
                    }
                    Space[] spaces = GroupSpec.Spaces(obs, act);
                    Vectors.Expect(JToken.DeepEquals(spaces[0].ToJson(), Space.FromJson(c["group_observation_space"]).ToJson()), "observation space");
                    Vectors.Expect(JToken.DeepEquals(spaces[1].ToJson(), Space.FromJson(c["group_action_space"]).ToJson()), "action space");
                    return;
                }
                GroupSpec group = GroupSpec.FromJson("g", c["group"]);
                if (c["member_observations"] != null)
                {
                    var memberObs = ((JObject)c["member_observations"]).Properties().ToDictionary(p => p.Name, p => FlatFloat(p.Value));
                    if (c["error"] != null)
                    {
                        Vectors.Expect(Throws(() => group.JoinObservations(memberObs)), "expected missing members to be refused");
                        return;
                    }
                    Vectors.Expect(group.JoinObservations(memberObs).SequenceEqual(FlatFloat(c["group_observation"])), "joined observation");
                }
                else if (c["group_action"] != null)
                {
                    Space s = Space.FromJson(c["group_action_space"]);
                    double[][] parts = group.SplitAction(Vectors.Flat(c["group_action"]));
                    var got = new JObject();
                    for (int i = 0; i < parts.Length; ++i)
                    {
                        bool discrete = s.Kind != SpaceKind.Box;
                        got[group.Members[i]] = discrete && parts[i].Length == 1
                            ? (JToken)new JValue((long)Math.Round(parts[i][0]))
                            : new JArray(parts[i].Select(v => discrete ? new JValue((long)Math.Round(v)) : new JValue(v)));
                    }
                    Vectors.Expect(JToken.DeepEquals(got, c["member_actions"]), "member actions " + got.ToString(Newtonsoft.Json.Formatting.None));
                }
                else
                {
                    var received = new List<double>();
                    foreach (JObject step in c["member_rewards"]) received.AddRange(step.Properties().Select(p => (double)p.Value));
                    Vectors.Expect(Math.Abs(group.CombineRewards(received) - (double)c["group_reward"]) < 1e-9, "group reward");
                }
            });
        }

        [Test]
        public void ValueObs()
        {
            Vectors.Check("value_obs.json", (file, c) =>
            {
                var agents = c["value_obs_agents"].Select(a => (string)a).ToList();
                int obsDim = (int)c["obs_dim"];
                var latest = new Dictionary<string, float[]>();
                foreach (JObject step in c["steps"])
                {
                    foreach (string key in new[] { "observe", "leave" })
                    {
                        if (step[key] == null) continue;
                        foreach (JProperty item in ((JObject)step[key]).Properties()) latest[item.Name] = FlatFloat(item.Value);
                    }
                    var row = new float[agents.Count * obsDim];
                    EpisodeRecords.ValueObsRow(agents, latest, obsDim, row, 0);
                    Vectors.Expect(row.SequenceEqual(FlatFloat(step["row"])), "row");
                }
            });
        }

        // ---- rewards.json (1.6, §10.5): a step's reward never goes out beyond float32 -------------------

        [Test]
        public void StepRewards()
        {
            Vectors.Check("rewards.json", (file, c) =>
            {
                Vectors.Expect((string)c["kind"] == "single", "unknown kind " + c["kind"]);
                var calls = (JArray)c["calls"];
                var want = c["step_rewards"].Select(v => (double)v).ToList();
                var refused = c["refused"].Select(v => (int)v).ToList();
                // The return: every reward not refused, in order (before the first action too).
                double wantReturn = 0;
                for (int i = 0; i < calls.Count; ++i)
                {
                    if (calls[i].Type != JTokenType.String && !refused.Contains(i)) wantReturn += (double)calls[i];
                }
                var gotRefused = new List<int>();
                double gotReturn;
                ExpectStepRewards("TetherClient", SingleAgentStepRewards(calls, gotRefused, out gotReturn), want, gotRefused, refused);
                Vectors.Expect(Math.Abs(gotReturn - wantReturn) <= 1e-9 * Math.Max(1, Math.Abs(wantReturn)), "TetherClient: the return " + gotReturn + ", not " + wantReturn);
                gotRefused.Clear();
                ExpectStepRewards("MultiAgentClient", MultiAgentStepRewards(calls, gotRefused), want, gotRefused, refused);
                gotRefused.Clear();
                ExpectStepRewards("DemoWriter", DemoStepRewards(calls, gotRefused), want, gotRefused, refused);
            });
        }

        static void ExpectStepRewards(string who, List<double> got, List<double> want, List<int> gotRefused, List<int> refused)
        {
            Vectors.Expect(gotRefused.SequenceEqual(refused), who + ": refused calls [" + string.Join(", ", gotRefused) + "]");
            Vectors.Expect(got.Count == want.Count, who + ": " + got.Count + " step rewards");
            for (int i = 0; i < got.Count; ++i)
            {
                // (within 1e-9 relative: sums kept in double, as the vectors' are)
                Vectors.Expect(Math.Abs(got[i] - want[i]) <= 1e-9 * Math.Abs(want[i]), who + ": step " + i + "'s reward " + got[i].ToString("R") + ", not " + want[i].ToString("R"));
            }
        }

        // Logs a reward; a refusal (NON_FINITE_VALUE, naming float32) is noted as call `index`.
        static void LogReward(Action log, int index, List<int> refused)
        {
            try
            {
                log();
            }
            catch (TetherException e)
            {
                Vectors.Expect(e.Code == ErrorCode.NonFiniteValue && e.Message.Contains("float32"), "call " + index + ": " + e.Message);
                refused.Add(index);
            }
        }

        static readonly float[] RewardObs = { 0.1f, -0.2f, 0.3f, 0.0f };

        // The case's calls played by a TetherClient ("act": GetAction, a number: LogReturns); the rewards of its records.
        static List<double> SingleAgentStepRewards(JArray calls, List<int> refused, out double total)
        {
            using (var server = new ScriptedServer(1000000))
            using (TetherClient client = TetherClient.Connect(server.Options(5)))
            {
                var action = new double[1];
                string episode = client.StartEpisode("e");
                for (int i = 0; i < calls.Count; ++i)
                {
                    if (calls[i].Type == JTokenType.String) client.GetAction(episode, RewardObs, action);
                    else LogReward(() => client.LogReturns(episode, (double)calls[i]), i, refused);
                }
                total = client.EndEpisode(episode, RewardObs);
                client.Flush(10);
                var rewards = new List<double>();
                foreach (JObject batch in server.Received("EPISODES_AND_GET_STATE"))
                {
                    server.Validate(batch);
                    foreach (JObject record in batch["episodes"]) rewards.AddRange(record["rewards"].Select(r => (double)r));
                }
                return rewards;
            }
        }

        // The case's calls played by a MultiAgentClient for agent a_0; the rewards of its entries.
        static List<double> MultiAgentStepRewards(JArray calls, List<int> refused)
        {
            using (ScriptedServer server = ScriptedServer.Plain(1000000))
            using (MultiAgentClient client = MultiAgentClient.Connect(server.Options(5)))
            {
                var frame = new AgentFrame();
                string episode = client.StartEpisode("e");
                for (int i = 0; i < calls.Count; ++i)
                {
                    if (calls[i].Type == JTokenType.String)
                    {
                        frame.Clear();
                        frame.Add("a_0", RewardObs);
                        client.GetActions(episode, frame);
                    }
                    else
                    {
                        LogReward(() => client.LogReturns(episode, "a_0", (double)calls[i]), i, refused);
                    }
                }
                client.EndEpisode(episode);
                client.Flush(10);
                var specs = new Dictionary<string, ModuleSpec>();
                foreach (JProperty m in ((JObject)server.Config["modules"]).Properties()) specs[m.Name] = ModuleSpec.FromJson(m.Name, m.Value);
                var rewards = new List<double>();
                foreach (JObject batch in server.Received("EPISODES_AND_GET_STATE"))
                {
                    var records = (JArray)batch["episodes"];
                    for (int r = 0; r < records.Count; ++r)
                    {
                        EpisodeRecords.ValidateMultiAgentRecord(records[r], r, specs, true);
                        JToken entry = records[r]["agents"]["a_0"];
                        if (entry != null) rewards.AddRange(entry["rewards"].Select(v => (double)v));
                    }
                }
                return rewards;
            }
        }

        // The case's calls given to a DemoWriter ("act": Step, a number: AddReward); the rewards of its line.
        static List<double> DemoStepRewards(JArray calls, List<int> refused)
        {
            var text = new StringWriter();
            var module = new ModuleSpec { ModuleId = DemoWriter.DefaultModule, ObservationSpace = Space.Box(new long[] { 4 }, -10, 10), ActionSpace = Space.Discrete(2) };
            using (var writer = new DemoWriter(text, new Dictionary<string, ModuleSpec> { { DemoWriter.DefaultModule, module } }))
            {
                for (int i = 0; i < calls.Count; ++i)
                {
                    if (calls[i].Type == JTokenType.String) writer.Step("e", DemoWriter.DefaultAgent, DemoWriter.DefaultModule, RewardObs, new[] { 1.0 });
                    else LogReward(() => writer.AddReward("e", DemoWriter.DefaultAgent, (double)calls[i]), i, refused);
                }
                writer.End("e", DemoWriter.DefaultAgent, RewardObs, true);
            }
            string[] lines = text.ToString().Split(new[] { '\n' }, StringSplitOptions.RemoveEmptyEntries);
            Vectors.Expect(lines.Length == 2, "DemoWriter: " + lines.Length + " lines");
            return JObject.Parse(lines[1])["rewards"].Select(v => (double)v).ToList();
        }

        static bool Throws(Action call)
        {
            try
            {
                call();
                return false;
            }
            catch (TetherException)
            {
                return true;
            }
        }

        // Draws in [0, 1) from a case's list, in order; a draw past its end fails the case.
        static Func<double> Uniforms(JToken list, out Func<int> count)
        {
            double[] values = list.Select(u => (double)u).ToArray();
            int next = 0;
            count = () => next;
            return () =>
            {
                Vectors.Expect(next < values.Length, "more than the case's " + values.Length + " uniform draws");
                return values[next++];
            };
        }

        // Names by their UTF-8 bytes (§19.1's drawing order), compared as bytes: independent of EnvParams.CompareNames.
        sealed class Utf8Order : IComparer<string>
        {
            public static readonly Utf8Order Instance = new Utf8Order();

            public int Compare(string a, string b)
            {
                byte[] x = Encoding.UTF8.GetBytes(a), y = Encoding.UTF8.GetBytes(b);
                for (int i = 0; i < Math.Min(x.Length, y.Length); ++i)
                {
                    if (x[i] != y[i]) return x[i] - y[i];
                }
                return x.Length - y.Length;
            }
        }

        static bool Close(double got, double expected)
        {
            return Math.Abs(got - expected) <= 1e-12 * Math.Abs(expected) || got == expected;
        }

        [Test]
        public void EnvParamsVectors()
        {
            Vectors.Check("env_params.json", (file, c) =>
            {
                Vectors.Expect((string)file["version"] == Protocol.Messages.ProtocolVersion, "version");
                string kind = (string)c["kind"];
                if (kind == "set")
                {
                    EnvParams set;
                    string error;
                    bool valid = EnvParams.TryParse(c["env_params"], out set, out error);
                    Vectors.Expect(valid == (bool)c["valid"], valid ? "accepted a set that breaks the rules" : "refused a valid set: " + error);
                    if (!valid)
                    {
                        Vectors.ExpectError("INVALID_FIELD", () => EnvParams.Parse(c["env_params"]));
                        return;
                    }
                    var body = (JObject)c["env_params"];
                    Vectors.Expect(set.Seq == (long)body["seq"] && set.Lesson == (long)body["lesson"], "seq, lesson");
                    var values = (JObject)body["values"];
                    Vectors.Expect(set.Values.Count == values.Count, "values");
                    Vectors.Expect(set.Names.SequenceEqual(values.Properties().Select(p => p.Name).OrderBy(n => n, Utf8Order.Instance)), "names in drawing order");
                    // (the set reads back as itself)
                    Vectors.Expect(JToken.DeepEquals(EnvParams.Parse(set.ToJson()).ToJson(), set.ToJson()), "round trip");
                    foreach (JProperty value in values.Properties())
                    {
                        EnvParamValue parsed = set.Values[value.Name];
                        Vectors.Expect(value.Value is JObject ? (string)value.Value["sampler"] == parsed.Kind.ToString().ToLowerInvariant() : parsed.Kind == EnvParamKind.Fixed,
                                       "kind of " + value.Name);
                    }
                    return;
                }
                if (kind == "draw")
                {
                    Func<int> used;
                    Func<double> uniform = Uniforms(c["uniforms"], out used);
                    double got = EnvParamValue.Parse(c["value"]).Draw(uniform);
                    Vectors.Expect(used() == ((JArray)c["uniforms"]).Count, "took " + used() + " draws");
                    Vectors.Expect(Close(got, (double)c["expect"]), "drew " + got.ToString("R") + ", expected " + c["expect"]);
                    return;
                }
                if (kind == "draw_all")
                {
                    Func<int> used;
                    Func<double> uniform = Uniforms(c["uniforms"], out used);
                    EnvParams set = EnvParams.Parse(new JObject { { "seq", 1 }, { "lesson", 0 }, { "values", c["values"] } });
                    EpisodeEnvParams drawn = set.Draw(uniform);
                    Vectors.Expect(used() == ((JArray)c["uniforms"]).Count, "took " + used() + " draws");
                    var expect = (JObject)c["expect"];
                    Vectors.Expect(drawn.Values.Count == expect.Count, "values");
                    foreach (JProperty value in expect.Properties())
                    {
                        double got = drawn.Values[value.Name];
                        Vectors.Expect(Close(got, (double)value.Value), value.Name + ": drew " + got.ToString("R") + ", expected " + value.Value);
                    }
                    // (the record member says them, with the set's seq)
                    JObject member = drawn.ToRecordJson();
                    Vectors.Expect((long)member["seq"] == 1 && ((JObject)member["values"]).Count == expect.Count && member["measure"] == null, "record member");
                    return;
                }
                Vectors.Expect(kind == "record", "unknown kind " + kind);  // (a server's check of a record, §19.3)
            });
        }

        // (1.8, §6.5) Steps acted under one run are sent on a connection to another only when either names none.
        [Test]
        public void RunIds()
        {
            Vectors.Check("run_ids.json", (file, c) =>
            {
                Vectors.Expect((string)file["version"] == Protocol.Messages.ProtocolVersion, "version");
                string actedIn = ServerRuns.RunIdOf(new JObject { { "run_id", c["acted_in"] } });
                string connectedTo = ServerRuns.RunIdOf(new JObject { { "run_id", c["connected_to"] } });
                bool send = !ServerRuns.FromAnotherRun(actedIn, connectedTo);
                Vectors.Expect(send == (bool)c["send"], send ? "sent steps of another run" : "dropped steps the client cannot tell are another run's");
            });
        }

        // (§20) An offline policy file's text gives its three messages, or an error naming what is wrong.
        [Test]
        public void OfflinePolicyVectors()
        {
            Vectors.Check("offline_policy.json", (file, c) =>
            {
                if (c["messages"] != null)
                {
                    OfflinePolicy parsed = OfflinePolicy.Parse((string)c["text"]);
                    Vectors.Expect(JToken.DeepEquals(parsed.Pong, c["messages"][0]), "pong");
                    Vectors.Expect(JToken.DeepEquals(parsed.Config, c["messages"][1]), "config");
                    Vectors.Expect(JToken.DeepEquals(parsed.State, c["messages"][2]), "state");
                    return;
                }
                try
                {
                    OfflinePolicy.Parse((string)c["text"]);
                    Vectors.Expect(false, "accepted");
                }
                catch (ProtocolException e)
                {
                    Vectors.Expect(ErrorCodes.ToWire(e.Code) == (string)c["code"], "code " + e.Code);
                    Vectors.Expect(e.Message.Contains((string)c["names"]), "message " + e.Message);
                }
            });
        }

        [Test]
        public void RankAddressVectors()
        {
            Vectors.Check("rank_addresses.json", (file, c) =>
            {
                Vectors.Expect((string)file["version"] == Protocol.Messages.ProtocolVersion, "version");
                string kind = (string)c["kind"];
                if (kind == "parse")
                {
                    RankAddress? address = RankAddresses.Parse(c["value"]);
                    Vectors.Expect(SameAddress(address, c["address"]), "read as " + (address.HasValue ? address.Value.Host + " " + address.Value.Port : "null"));
                }
                else if (kind == "pong")
                {
                    List<RankAddress> ranks = RankAddresses.FromPong((JObject)c["pong"]);
                    var expected = (JArray)c["ranks"];
                    Vectors.Expect(ranks.Count == expected.Count, ranks.Count + " ranks");
                    for (int i = 0; i < ranks.Count; ++i) Vectors.Expect(SameAddress(ranks[i], expected[i]), "rank " + i + " " + ranks[i]);
                    RankAddress? follow = RankAddresses.RedirectOf((JObject)c["pong"], Read(c["current"]), (bool)c["redirected"]);
                    Vectors.Expect(SameAddress(follow, c["follow"]), "follows " + (follow.HasValue ? follow.Value.ToString() : "nothing"));
                }
                else if (kind == "reconnect")
                {
                    List<RankAddress> order = RankAddresses.ReconnectOrder(Read(c["given"]), ((JArray)c["ranks"]).Select(Read).ToList(), Read(c["lost"]));
                    var attempts = (JArray)c["attempts"];
                    for (int k = 0; k < attempts.Count; ++k)
                    {
                        RankAddress to = order[k % order.Count];
                        Vectors.Expect(to == Read(attempts[k]), "attempt " + k + " goes to " + to);
                    }
                }
                else
                {
                    throw new Exception("unknown kind " + kind);
                }
            });
        }

        static RankAddress Read(JToken text)
        {
            RankAddress? address = RankAddresses.Parse(text);
            Vectors.Expect(address.HasValue, "not an address: " + text);
            // (written back as it was read)
            Vectors.Expect(RankAddresses.Format(address.Value) == (string)text, "formatted as " + RankAddresses.Format(address.Value));
            return address.Value;
        }

        // `address` is the vector's [host, port], or both are null.
        static bool SameAddress(RankAddress? address, JToken expected)
        {
            if (expected == null || expected.Type == JTokenType.Null) return !address.HasValue;
            return address.HasValue && address.Value.Host == (string)expected[0] && address.Value.Port == (int)expected[1];
        }

        [Test]
        public void AgentModulesAnswers()
        {
            Vectors.Check("agent_modules.json", (file, c) =>
            {
                var described = new HashSet<string>(c["described"].Select(m => (string)m));
                var asked = c["asked"].Select(a => (string)a).ToList();
                var modules = new List<string> { "left from before" };
                Action read = () => PolicyMapping.ReadAgentModules(c["answer"], asked, described.Contains, modules);
                if (c["error"] != null)
                {
                    Vectors.ExpectError((string)c["error"], () =>
                    {
                        try { read(); }
                        catch (TetherException e) { Vectors.Expect(e is ProtocolException, "not a ProtocolException: " + e.GetType().Name); throw; }
                    });
                    Vectors.Expect(modules.Count == 0, "a refused answer gave modules");
                    return;
                }
                read();
                Vectors.Expect(modules.Count == asked.Count, "modules " + modules.Count);
                for (int k = 0; k < asked.Count; ++k) Vectors.Expect(modules[k] == (string)c["modules"][asked[k]], asked[k] + " -> " + modules[k]);
            });
        }

        [Test]
        public void PolicyMappingRules()
        {
            Vectors.Check("policy_mapping.json", (file, c) =>
            {
                if (c["fnv1a32"] != null)
                {
                    Vectors.Expect(PolicyMapping.Fnv1a32(Vectors.FromHex((string)c["fnv1a32_of_hex"])) == (uint)c["fnv1a32"], "fnv1a32");
                    return;
                }
                PolicyMapping mapping = PolicyMapping.FromJson(file["rules"]);
                if (c["error"] != null)
                {
                    Vectors.ExpectError((string)c["error"], () => mapping.ModuleFor((string)c["agent_id"], (string)c["episode_id"]));
                    return;
                }
                string module = mapping.ModuleFor((string)c["agent_id"], (string)c["episode_id"]);
                Vectors.Expect(module == (string)c["module"], "module " + module + " != " + c["module"]);
            });
        }
    }
}
