// ClientOptions.OfflinePolicy (docs/protocol.md §20): a client made from an offline policy file acts with the
// file's model and no server (its greedy actions are the real model's, under the real ONNX Runtime), writes its
// episodes to a demonstration file and sends nothing; a file that cannot be used fails to open, naming it.
using System;
using System.IO;
using System.Linq;
using Newtonsoft.Json.Linq;
using NUnit.Framework;
using Tether.Client;
using Tether.Protocol;

namespace Tether.Tests
{
    [TestFixture]
    public class OfflinePolicyTests
    {
        // The C++ SDK's test model (4 -> 64 -> 64 -> 2) and the outputs Python's onnxruntime gave for it.
        static string DataDir { get { return OnnxRuntimeTests.DataDir; } }

        static JObject Reference { get { return OnnxRuntimeTests.Reference; } }

        // What a server writes (§20) for one module serving the test model as v5.
        static JObject OfflineFile()
        {
            JObject reference = Reference;
            string onnx = OnnxCodec.Encode(File.ReadAllBytes(Path.Combine(DataDir, (string)reference["model"])));
            var obsSpace = new JObject { { "type", "Box" }, { "shape", new JArray(4) }, { "low", -5.0 }, { "high", 5.0 } };
            var actionSpace = new JObject { { "type", "Discrete" }, { "n", 2 } };
            var names = new JObject { { "onnx_input_names", new JArray(reference["input_name"]) }, { "onnx_output_names", new JArray(reference["output_name"]) } };
            var module = new JObject { { "observation_space", obsSpace }, { "action_space", actionSpace } };
            module.Merge(names);
            var config = new JObject
            {
                { "type", "SET_CONFIG" }, { "env_steps_per_sample", 50 }, { "force_on_policy", true },
                { "protocol_version", Messages.ProtocolVersion }, { "observation_space", obsSpace }, { "action_space", actionSpace },
                { "modules", new JObject { { "default_policy", module } } },
                { "policy_mapping", new JArray(new JObject { { "pattern", "*" }, { "module", "default_policy" } }) },
                { "groups", new JObject() },
            };
            config.Merge(names);
            return new JObject
            {
                { "format", "tether-offline-policy" }, { "version", 1 },
                { "pong", new JObject { { "type", "PONG" }, { "protocol_version", Messages.ProtocolVersion }, { "run_id", "r1" } } },
                { "config", config },
                { "state", new JObject { { "type", "SET_STATE" }, { "weights_seq_no", 5 }, { "onnx_file", onnx },
                                         { "record_share", 0.5 },  // (a connected client would hold half its episodes back)
                                         { "env_params", new JObject { { "seq", 1 }, { "lesson", 0 }, { "values", new JObject { { "speed", 2.0 } } } } },
                                         { "models", new JObject { { "default_policy", new JObject { { "weights_seq_no", 5 }, { "onnx_file", onnx } } } } } } },
            };
        }

        static string Written(string name, string text)
        {
            string path = Path.Combine(Path.GetTempPath(), "tether_offline_" + name);
            File.WriteAllText(path, text);
            return path;
        }

        static ClientOptions Options(string path)
        {
            return new ClientOptions { Port = 1, OfflinePolicy = path, Seed = 3 };  // (port 1: never reached)
        }

        [Test]
        public void ActsWithTheFilesModelRecordsDemonstrationsAndSendsNothing()
        {
            string path = Written("policy.json", OfflineFile().ToString());
            string demos = Path.Combine(Path.GetTempPath(), "tether_offline_demos.jsonl");
            ClientOptions options = Options(path);
            options.DemoPath = demos;
            using (TetherClient client = TetherClient.Connect(options))
            {
                Assert.IsTrue(client.Offline);
                Assert.AreEqual("offline:" + path, client.ConnectedAddress);
                Assert.AreEqual(5, client.WeightsSeqNo);
                Assert.IsNotNull(client.EnvParams, "the file's parameter set (§19), as from a server");
                Assert.AreEqual(1, client.EnvParams.Seq);
                // The greedy action of each recorded observation is the real model's argmax.
                JObject reference = Reference;
                var action = new double[1];
                for (int i = 0; i < ((JArray)reference["observations"]).Count; ++i)
                {
                    float[] obs = reference["observations"][i].Select(v => (float)v).ToArray();
                    client.ComputeAction(obs, action);
                    double[] logits = reference["outputs"][i].Select(v => (double)v).ToArray();
                    Assert.AreEqual(logits[1] > logits[0] ? 1.0 : 0.0, action[0], "observation " + i);
                }
                var o = new float[] { 0.1f, -0.2f, 0.05f, 0.3f };
                for (int e = 0; e < 3; ++e)
                {
                    string episode = client.StartEpisode();
                    for (int t = 0; t < 60; ++t)  // (beyond env_steps_per_sample: no batch is cut or sent)
                    {
                        client.GetAction(episode, o, action);
                        client.LogReturns(episode, 1.0);
                    }
                    client.EndEpisode(episode, o);
                }
                client.Flush();
                Assert.AreEqual(0, client.EnvStepsSent);
                Assert.AreEqual(0, client.EpisodesHeldBack, "none recorded, none held back, whatever record_share says");
            }
            string[] lines = File.ReadAllLines(demos);
            Assert.AreEqual(4, lines.Length, "the header and the three episodes");
            Assert.AreEqual(60, ((JArray)JObject.Parse(lines[1])["actions"]).Count);
        }

        [Test]
        public void AMultiAgentClientMapsByTheFilesRulesOffline()
        {
            string path = Written("multi.json", OfflineFile().ToString());
            using (MultiAgentClient client = MultiAgentClient.Connect(Options(path)))
            {
                Assert.IsTrue(client.Offline);
                string episode = client.StartEpisode();
                var frame = new AgentFrame();
                for (int t = 0; t < 10; ++t)
                {
                    frame.Clear();
                    frame.Add("a", new float[] { 0.1f, 0.2f, 0.3f, 0.4f });
                    frame.Add("b", new float[] { -0.1f, 0f, 0.3f, 0.2f });
                    client.GetActions(episode, frame);
                    Assert.IsTrue(frame.Action(1) == 0.0 || frame.Action(1) == 1.0);
                }
                client.EndEpisode(episode);
                client.Flush();
                Assert.AreEqual(0, client.EnvStepsSent);
            }
        }

        [Test]
        public void AgentsOnlyAServerCouldMapAreNotReady()
        {
            JObject file = OfflineFile();
            ((JObject)file["config"]).Remove("policy_mapping");  // (a server that maps with a function names no rules)
            string path = Written("unmapped.json", file.ToString());
            using (MultiAgentClient client = MultiAgentClient.Connect(Options(path)))
            {
                string episode = client.StartEpisode();
                var frame = new AgentFrame();
                frame.Add("a", new float[] { 0.1f, 0.2f, 0.3f, 0.4f });
                var e = Assert.Throws(Is.InstanceOf<TetherException>(), () => client.GetActions(episode, frame)) as TetherException;
                Assert.AreEqual(ErrorCode.NotReady, e.Code, e.Message);
                StringAssert.Contains("MAP_AGENTS", e.Message);
                StringAssert.Contains(path, e.Message);
            }
        }

        [Test]
        public void AFileThatCannotBeUsedFailsToOpenNamingItAndTheFault()
        {
            JObject newer = OfflineFile();
            newer["version"] = 2;
            JObject other = OfflineFile();
            other["pong"]["protocol_version"] = "2.0";
            JObject corrupt = OfflineFile();
            corrupt["state"]["onnx_file"] = "bm90IGEgbW9kZWw=";  // base64 of "not a model"
            JObject several = OfflineFile();
            ((JObject)several["state"]).Remove("onnx_file");  // (a server with several modules has no default one)
            string missing = Path.Combine(Path.GetTempPath(), "tether_offline_missing.json");
            File.Delete(missing);
            var cases = new[]
            {
                Tuple.Create(missing, ErrorCode.InvalidArgument, "cannot be read"),
                Tuple.Create(Written("broken.json", "{\"format\": "), ErrorCode.InvalidJson, "not JSON"),
                Tuple.Create(Written("newer.json", newer.ToString()), ErrorCode.InvalidField, "version"),
                Tuple.Create(Written("other.json", other.ToString()), ErrorCode.VersionMismatch, "2.0"),
                Tuple.Create(Written("corrupt.json", corrupt.ToString()), ErrorCode.InvalidField, "onnx_file"),
                Tuple.Create(Written("several.json", several.ToString()), ErrorCode.InvalidField, "no default module"),
            };
            foreach (Tuple<string, ErrorCode, string> c in cases)
            {
                var e = Assert.Throws(Is.InstanceOf<TetherException>(), () => TetherClient.Connect(Options(c.Item1)).Dispose()) as TetherException;
                Assert.AreEqual(c.Item2, e.Code, e.Message);
                StringAssert.Contains(c.Item3, e.Message);
                StringAssert.Contains(c.Item1, e.Message);
            }
        }
    }
}
