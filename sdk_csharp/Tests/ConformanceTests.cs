// The shared conformance vectors, run against the C# protocol core.
using System;
using System.Collections.Generic;
using System.IO;
using System.Linq;
using System.Text;
using Newtonsoft.Json.Linq;
using NUnit.Framework;
using Tether.Protocol;
using Tether.Sampling;

namespace Tether.Tests
{
    [TestFixture]
    public class ConformanceTests
    {
        static readonly string[] Claimed =
            { "framing.json", "messages.json", "spaces.json", "logp.json", "policy_mapping.json", "session.json", "client_pairing.json" };

        // Vectors of a server's answers: they need a live server, not a client SDK.
        static readonly string[] ServerSession =
            { "connection.json", "counting.json", "exactly_once.json", "map_agents.json", "multi_agent_sessions.json", "set_state.json" };

        // Client-side vectors the C# SDK does not run yet (episode records, groups, value_obs rows).
        static readonly string[] NotYetRun = { "episodes.json", "multi_agent_episodes.json", "groups.json", "value_obs.json" };

        static void Check(string file, Action<JObject, JObject> check)
        {
            int ran;
            List<string> failures = Vectors.Run(file, check, out ran);
            Assert.That(ran, Is.GreaterThan(0), file + " has no cases");
            Assert.That(failures, Is.Empty, string.Join("\n", failures.ToArray()));
        }

        static void Expect(bool condition, string what)
        {
            if (!condition) throw new Exception(what);
        }

        static void ExpectError(string code, Action call)
        {
            try
            {
                call();
            }
            catch (TetherException e)
            {
                Expect(ErrorCodes.ToWire(e.Code) == code, "expected " + code + ", got " + e.Message);
                return;
            }
            throw new Exception("expected " + code + ", no error");
        }

        [Test]
        public void EveryVectorFileIsAccountedFor()
        {
            var seen = new HashSet<string>(Directory.GetFiles(Vectors.Directory, "*.json").Select(Path.GetFileName));
            var listed = new HashSet<string>(Claimed.Concat(ServerSession).Concat(NotYetRun));
            Assert.That(seen, Is.EquivalentTo(listed));
        }

        [Test]
        public void Framing()
        {
            Check("framing.json", (file, c) =>
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
                        Expect(got.SequenceEqual(before), "step " + step + ": bodies before the error differ");
                        Expect(decoder.Error != null && ErrorCodes.ToWire(decoder.Error.Code) == (string)c["error"],
                               "step " + step + ": expected " + c["error"] + ", got " + (decoder.Error == null ? "none" : decoder.Error.Message));
                        var more = new List<byte[]>();
                        ExpectError((string)c["error"], () => decoder.Feed(Encoding.ASCII.GetBytes("00000002{}"), more));  // stays failed
                        Expect(more.Count == 0, "a failed decoder gave a body");
                    }
                    else
                    {
                        Expect(decoder.Error == null, "step " + step + ": unexpected " + (decoder.Error == null ? "" : decoder.Error.Message));
                        Expect(got.SequenceEqual(c["bodies"].Select(b => (string)b)), "step " + step + ": bodies differ");
                    }
                }
            });
        }

        [Test]
        public void Messages()
        {
            Check("messages.json", (file, c) =>
            {
                byte[] body = Vectors.FromHex((string)c["body_hex"]);
                if (c["error"] != null)
                {
                    ExpectError((string)c["error"], () => Protocol.Messages.Decode(body));
                    return;
                }
                Message m = Protocol.Messages.Decode(body);
                Expect(Protocol.Messages.ToWire(m.Type) == (string)c["type"], "type " + m.Type);
                Expect((string)m.Body["type"] == (string)c["type"], "body type");
            });
        }

        [Test]
        public void Spaces()
        {
            Check("spaces.json", (file, c) =>
            {
                if (c["error"] != null)
                {
                    ExpectError((string)c["error"], () => Space.FromJson(c["space"]));
                    return;
                }
                Space s = Space.FromJson(c["space"]);
                Expect(s.Shape.SequenceEqual(c["shape"].Select(d => (long)d)), "shape");
                Expect(s.DistInputsSize == (int)c["dist_inputs_size"], "dist_inputs_size " + s.DistInputsSize);
                // The canonical JSON a peer writes back parses to the same space.
                JToken again = Protocol.Messages.ParseJson(Encoding.UTF8.GetBytes(s.ToJson().ToString(Newtonsoft.Json.Formatting.None)));
                Expect(JToken.DeepEquals(Space.FromJson(again).ToJson(), s.ToJson()), "round trip");
            });
        }

        [Test]
        public void Logp()
        {
            Check("logp.json", (file, c) =>
            {
                Space s = Space.FromJson(c["space"]);
                double[] inputs = Vectors.Flat(c["dist_inputs"]);
                double[] action = Vectors.Flat(c["action"]);
                double expected = (double)c["logp"];
                double got = Distributions.LogProb(s, inputs, 0, inputs.Length, action, 0, action.Length);
                Expect(Math.Abs(got - expected) <= Math.Max(1e-9, 1e-9 * Math.Abs(expected)), "logp " + got + " != " + expected);
                // float32 dist inputs (a model's output) agree to float precision.
                float[] inputs32 = inputs.Select(x => (float)x).ToArray();
                double got32 = Distributions.LogProb(s, inputs32, 0, inputs32.Length, action, 0, action.Length);
                Expect(Math.Abs(got32 - expected) <= 1e-5, "float32 logp " + got32 + " != " + expected);
                if (c["env_action"] != null)
                {
                    var env = new double[action.Length];
                    Distributions.ToEnvAction(s, action, 0, env, 0, action.Length);
                    double[] expectedEnv = Vectors.Flat(c["env_action"]);
                    for (int i = 0; i < env.Length; ++i)
                    {
                        Expect(Math.Abs(env[i] - expectedEnv[i]) <= 1e-6 * Math.Abs(expectedEnv[i]) + 1e-12, "env_action[" + i + "]");
                    }
                }
            });
        }

        [Test]
        public void Session()
        {
            Check("session.json", (file, c) =>
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
                Expect(got.SequenceEqual(c["responses"].Select(r => (string)r)), "responses " + string.Join(",", got.ToArray()));
            });
        }

        [Test]
        public void ClientPairing()
        {
            Check("client_pairing.json", (file, c) =>
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
                    Expect(error != null && (error.Code == ErrorCode.NotARequest || error.Code == ErrorCode.UnknownType),
                           "expected a violation, got " + (error == null ? "none" : error.Message));
                    Expect(conn.Closed, "a violation closes the connection");
                    return;
                }
                var pairs = new JArray(responses.Select(r => r.Request == null ? JValue.CreateNull() : new JValue(Protocol.Messages.ToWire(r.Request.Value))));
                Expect(JToken.DeepEquals(pairs, c["pairs"]), "pairs " + pairs.ToString(Newtonsoft.Json.Formatting.None));
                // Only a connection-level ERROR (one that closes) may end the connection here.
                Expect(error == null || Protocol.Messages.ClosesConnection(error.Code), "closed by " + (error == null ? "" : error.Message));
            });
        }

        [Test]
        public void PolicyMappingRules()
        {
            Check("policy_mapping.json", (file, c) =>
            {
                if (c["fnv1a32"] != null)
                {
                    Expect(PolicyMapping.Fnv1a32(Vectors.FromHex((string)c["fnv1a32_of_hex"])) == (uint)c["fnv1a32"], "fnv1a32");
                    return;
                }
                PolicyMapping mapping = PolicyMapping.FromJson(file["rules"]);
                if (c["error"] != null)
                {
                    ExpectError((string)c["error"], () => mapping.ModuleFor((string)c["agent_id"], (string)c["episode_id"]));
                    return;
                }
                string module = mapping.ModuleFor((string)c["agent_id"], (string)c["episode_id"]);
                Expect(module == (string)c["module"], "module " + module + " != " + c["module"]);
            });
        }
    }
}
