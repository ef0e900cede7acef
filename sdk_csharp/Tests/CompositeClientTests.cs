// The single-agent client on a Dict observation with an action mask (protocol 1.4): leaves in,
// one model input per leaf, masked sampling, per-leaf records on the wire.
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
    public class CompositeClientTests
    {
        // The server's own export for Dict(action_mask [3], board [2, 2], cam uint8 [2, 1]) -> Discrete(3),
        // masked by "action_mask", and onnxruntime's logits for a few flat rows.
        static JObject Reference
        {
            get { return JObject.Parse(File.ReadAllText(Path.Combine(ScriptedServer.Repo, "sdk_cpp/tests/data/policy_dict_mask.json"))); }
        }

        static Space ObservationSpace { get { return Space.FromJson(Reference["observation_space"]); } }

        static ScriptedServer DictServer(string version, int envStepsPerSample = 4)
        {
            JObject reference = Reference;
            var server = new ScriptedServer(envStepsPerSample) { PongVersion = version };
            server.Config["observation_space"] = reference["observation_space"];
            server.Config["action_space"] = Space.Discrete(3).ToJson();
            server.Config["action_mask"] = "action_mask";
            server.Config["onnx_input_names"] = reference["inputs"];
            server.ModelFile = OnnxCodec.Encode(File.ReadAllBytes(Path.Combine(ScriptedServer.Repo, "sdk_cpp/tests/data", (string)reference["model"])));
            return server;
        }

        static TetherClient Connect(ScriptedServer server)
        {
            return TetherClient.Connect(server.Options(3));
        }

        static float[][] Rows { get { return Reference["rows"].Select(r => r.Select(x => (float)x).ToArray()).ToArray(); } }

        // Sets a flat row's leaves (action_mask 0..3, board 3..7, cam 7..9) as an engine would, the camera as bytes.
        static void Fill(ObservationLeaves leaves, float[] row)
        {
            leaves.Set("action_mask", row.Take(3).ToArray());
            leaves.Set("board", row.Skip(3).Take(4).ToArray());
            leaves.Set("cam", row.Skip(7).Select(v => (byte)v).ToArray());
        }

        [TestCase("1.4")]
        [TestCase("1.3")]
        public void LeavesGoToTheModelByNameAndToTheServerPerLeaf(string version)
        {
            using (ScriptedServer server = DictServer(version))
            using (TetherClient client = Connect(server))
            {
                Assert.That(client.ActionMask.Leaf, Is.EqualTo("action_mask"));
                var leaves = new ObservationLeaves(client.ObservationSpace);
                var action = new double[1];
                float[][] rows = Rows;
                string episode = client.StartEpisode();
                for (int t = 0; t < rows.Length; ++t)
                {
                    Fill(leaves, rows[t]);
                    client.GetAction(episode, leaves, action);
                    Assert.That(rows[t][(int)action[0]], Is.EqualTo(1f), "a masked action was drawn at step " + t);
                    client.LogReturns(episode, 1);
                }
                Fill(leaves, new float[] { 0, 0, 0, 1, 1, 1, 1, 9, 9 });  // a final mask may allow nothing
                client.EndEpisode(episode, leaves);
                client.Flush(10);
                JObject message = server.Received("EPISODES").Concat(server.Received("EPISODES_AND_GET_STATE")).Last();
                JObject record = (JObject)message["episodes"][0];
                var obs = (JObject)record["obs"];
                Assert.That(obs.Properties().Select(p => p.Name), Is.EqualTo(new[] { "action_mask", "board", "cam" }));
                if (version == "1.4")
                {
                    Assert.That((string)obs["cam"]["dtype"], Is.EqualTo("uint8"));
                    Assert.That(obs["cam"]["shape"].Select(d => (int)d), Is.EqualTo(new[] { 5, 2, 1 }));
                    Assert.That((string)obs["board"]["dtype"], Is.EqualTo("float32"));
                }
                else
                {
                    Assert.That(obs["cam"].Type, Is.EqualTo(JTokenType.Array));
                    Assert.That((int)obs["cam"][0][1][0], Is.EqualTo(200));
                }
                // What was sent passes the server's checks, masks included (§10.6 4c, 14b-14d) ...
                ActionMask mask = ModuleSpec.ReadActionMask(new JValue("action_mask"), ObservationSpace, Space.Discrete(3));
                Assert.That(EpisodeRecords.ValidateEpisodes(message, ObservationSpace, Space.Discrete(3), true, server.AttachmentOf(message), mask), Is.EqualTo(4));
                // ... and the model was fed leaf by leaf: its logits are onnxruntime's.
                JArray expected = (JArray)Reference["expected"];
                for (int t = 0; t < rows.Length; ++t)
                {
                    for (int j = 0; j < 3; ++j)
                    {
                        Assert.That((double)record["action_dist_inputs"][t][j], Is.EqualTo((double)expected[t][j]).Within(1e-4 + 1e-6 * Math.Abs((double)expected[t][j])));
                    }
                }
            }
        }

        [Test]
        public void WhatCannotBeActedOnIsRefusedBeforeAnythingIsRecorded()
        {
            using (ScriptedServer server = DictServer("1.4", 1000))
            using (TetherClient client = Connect(server))
            {
                var leaves = new ObservationLeaves(client.ObservationSpace);
                var action = new double[1];
                string episode = client.StartEpisode();
                leaves.Set("board", new float[4]);
                Assert.That(Assert.Throws<TetherException>(() => client.GetAction(episode, leaves, action)).Code, Is.EqualTo(ErrorCode.ObsLeafMismatch));
                leaves.Set("cam", new byte[] { 1, 2 });
                leaves.Set("action_mask", new float[] { 0, 0, 0 });
                Assert.That(Assert.Throws<TetherException>(() => client.GetAction(episode, leaves, action)).Code, Is.EqualTo(ErrorCode.ActionMaskEmpty));
                leaves.Set("action_mask", new float[] { 0, 2, 1 });
                Assert.That(Assert.Throws<TetherException>(() => client.GetAction(episode, leaves, action)).Code, Is.EqualTo(ErrorCode.InvalidActionMask));
                leaves.Set("action_mask", new float[] { 0, 1, 1 });
                leaves.Set("cam", new float[] { 1, 256 });
                Assert.That(Assert.Throws<TetherException>(() => client.GetAction(episode, leaves, action)).Code, Is.EqualTo(ErrorCode.ObsDtypeMismatch));
                leaves.Set("board", new[] { 0f, float.NaN, 0f, 0f });
                Assert.That(Assert.Throws<TetherException>(() => client.GetAction(episode, leaves, action)).Code, Is.EqualTo(ErrorCode.NonFiniteValue));
                // A flat row is checked alike.
                Assert.That(Assert.Throws<TetherException>(() => client.GetAction(episode, new float[] { 0, 0, 0, 1, 1, 1, 1, 9, 9 }, action)).Code,
                            Is.EqualTo(ErrorCode.ActionMaskEmpty));
                Assert.That(Assert.Throws<TetherException>(() => client.GetAction(episode, new byte[9], action)).Code, Is.EqualTo(ErrorCode.InvalidArgument));
                client.GetAction(episode, new float[] { 0, 0, 1, 1, 1, 1, 1, 9, 9 }, action);
                Assert.That(action[0], Is.EqualTo(2));
                // Only that step was recorded: the episode sends one step.
                client.EndEpisode(episode, new float[] { 0, 0, 0, 1, 1, 1, 1, 9, 9 });
                client.Flush(10);
                Assert.That(client.EnvStepsSent, Is.EqualTo(1));
            }
        }

        [Test]
        public void GetActionWithLeavesAllocatesNothingInSteadyState()
        {
            using (ScriptedServer server = DictServer("1.4", 200))
            using (TetherClient client = Connect(server))
            {
                var leaves = new ObservationLeaves(client.ObservationSpace);
                int mask = leaves.Index("action_mask"), board = leaves.Index("board"), cam = leaves.Index("cam");
                float[] maskValues = { 1, 0, 1 }, boardValues = { 0.5f, 0, 1, 0 };
                byte[] camValues = { 7, 200 };
                var action = new double[1];
                long bytes = 0;
                int calls = 0;
                for (int e = 0; e < 60; ++e)
                {
                    bool measure = e >= 10;
                    string episode = client.StartEpisode();
                    for (int t = 0; t < 100; ++t)
                    {
                        long before = GC.GetAllocatedBytesForCurrentThread();
                        leaves.Set(mask, maskValues);
                        leaves.Set(board, boardValues);
                        leaves.Set(cam, camValues);
                        client.GetAction(episode, leaves, action);
                        client.LogReturns(episode, 1.0);
                        long allocated = GC.GetAllocatedBytesForCurrentThread() - before;
                        Assert.That(action[0], Is.Not.EqualTo(1));
                        if (!measure) continue;
                        ++calls;
                        bytes += allocated;
                    }
                    client.EndEpisode(episode, leaves);
                    DateTime deadline = DateTime.UtcNow.AddSeconds(5);
                    while (client.Sending && DateTime.UtcNow < deadline) System.Threading.Thread.Sleep(1);
                }
                Console.WriteLine("[ allocations ] " + calls + " GetAction(ObservationLeaves) calls allocated " + bytes + " bytes; " + client.EnvStepsSent + " steps sent");
                Assert.That(client.EnvStepsSent, Is.GreaterThan(4000));
                Assert.That(bytes, Is.EqualTo(0));
            }
        }

        // ---- multi-agent: a masked Dict module per agent ------------------------------------------

        // Modules "masked" (the Dict above, masked by "action_mask") for the agents m_*, and "solo"
        // (Box [4], Discrete(2)) for a_*.
        static ScriptedServer MaskedModuleServer(int envStepsPerSample)
        {
            JObject reference = Reference;
            ScriptedServer server = ScriptedServer.Plain(envStepsPerSample);
            server.PongVersion = "1.4";
            var masked = new JObject { { "observation_space", reference["observation_space"] }, { "action_space", Space.Discrete(3).ToJson() },
                                       { "action_mask", "action_mask" }, { "onnx_input_names", reference["inputs"] },
                                       { "onnx_output_names", new JArray("action_dist_inputs") } };
            ((JObject)server.Config["modules"]).Add("masked", masked);
            server.Config["policy_mapping"] = JArray.Parse("[{\"pattern\": \"m_*\", \"module\": \"masked\"}, {\"pattern\": \"a_*\", \"module\": \"solo\"}]");
            server.ModuleFiles = new Dictionary<string, string>
            {
                { "masked", OnnxCodec.Encode(File.ReadAllBytes(Path.Combine(ScriptedServer.Repo, "sdk_cpp/tests/data", (string)reference["model"]))) },
                { "solo", server.ModelFile }, { "lifter", server.GroupModelFile },
            };
            return server;
        }

        static int AgentStepsReceived(ScriptedServer server)
        {
            var specs = new Dictionary<string, ModuleSpec>();
            foreach (JProperty m in ((JObject)server.Config["modules"]).Properties()) specs[m.Name] = ModuleSpec.FromJson(m.Name, m.Value);
            int agentSteps = 0;
            foreach (JObject batch in server.Received("EPISODES").Concat(server.Received("EPISODES_AND_GET_STATE")))
            {
                byte[] attachment = server.AttachmentOf(batch);
                var records = (JArray)batch["episodes"];
                // (what the server would refuse throws, masks and actions under them included)
                for (int i = 0; i < records.Count; ++i) agentSteps += EpisodeRecords.ValidateMultiAgentRecord(records[i], i, specs, true, attachment);
            }
            return agentSteps;
        }

        [TestCase(ErrorCode.InvalidActionMask)]
        [TestCase(ErrorCode.ActionMaskEmpty)]
        [TestCase(ErrorCode.ObsDtypeMismatch)]
        public void AMultiAgentMaskOrByteLeafThatCannotBeActedOnIsRefusedAtTheCallWithNothingRecorded(ErrorCode code)
        {
            float[] bad = { 1, 0, 1, 0.5f, 0, 1, 0, 7, 200 };
            if (code == ErrorCode.InvalidActionMask) bad[1] = 0.5f;
            if (code == ErrorCode.ActionMaskEmpty) bad[0] = bad[2] = 0;
            if (code == ErrorCode.ObsDtypeMismatch) bad[8] = 256;
            using (ScriptedServer server = MaskedModuleServer(1000))
            using (MultiAgentClient client = MultiAgentClient.Connect(server.Options(5)))
            {
                Assert.That(client.Modules["masked"].ActionMask.Leaf, Is.EqualTo("action_mask"));
                var frame = new AgentFrame();
                string episode = client.StartEpisode();
                float[] good = { 0, 1, 1, 0.5f, 0, 1, 0, 7, 200 };
                frame.Add("m_1", good);
                frame.Add("a_1", new float[] { 0.5f, -0.25f, 0, 1 });
                client.GetActions(episode, frame);
                Assert.That(frame.DiscreteAction(0), Is.Not.EqualTo(0), "a masked action was drawn");
                client.LogReturns(episode, "m_1", 1.0);
                client.LogReturns(episode, "a_1", 1.0);
                frame.Clear();
                frame.Add("a_1", new float[] { 0.5f, -0.25f, 0, 1 });  // (an agent of another module, in the frame first)
                frame.Add("m_1", bad);
                var e = Assert.Throws<TetherException>(() => client.GetActions(episode, frame));
                Assert.That(e.Code, Is.EqualTo(code));
                Assert.That(e.Message, Is.StringContaining("agent 'm_1'"));
                // The agent keeps its place: the next frame acts, and its final mask may allow nothing.
                frame.Clear();
                frame.Add("m_1", good);
                frame.Add("a_1", new float[] { 0.5f, -0.25f, 0, 1 });
                client.GetActions(episode, frame);
                client.LogReturns(episode, "m_1", 1.0);
                client.LogReturns(episode, "a_1", 1.0);
                frame.Clear();
                frame.Add("m_1", new float[] { 0, 0, 0, 1, 1, 1, 1, 9, 9 });
                frame.Add("a_1", new float[4]);
                client.EndEpisode(episode, frame);
                client.Flush(10);
                Assert.That(AgentStepsReceived(server), Is.EqualTo(4), "two frames of two agents; nothing of the refused frame");
            }
        }

        [Test]
        public void AMultiAgentFrameActsOnlyWhereTheMaskAllowsAndChecksEveryFrameWithoutAllocating()
        {
            using (ScriptedServer server = MaskedModuleServer(200))
            using (MultiAgentClient client = MultiAgentClient.Connect(server.Options(9)))
            {
                string[] ids = { "m_0", "m_1", "m_2", "a_0" };
                float[][] observations =
                {
                    new float[] { 0, 0, 1, 0.5f, 0, 1, 0, 7, 200 },   // only action 2
                    new float[] { 1, 0, 0, 0, 1, 1, 0, 31, 4 },       // only action 0
                    new float[] { 1, 1, 0, 1, 1, 1, 1, 0, 255 },      // 0 or 1
                    new float[] { 0.5f, -0.25f, 0, 1 },
                };
                FrameAllocations run = FrameAllocations.Measure(client, ids, observations, 30, 8, frame =>
                {
                    Assert.That(frame.DiscreteAction(0), Is.EqualTo(2));
                    Assert.That(frame.DiscreteAction(1), Is.EqualTo(0));
                    Assert.That(frame.DiscreteAction(2), Is.Not.EqualTo(2));
                });
                Console.WriteLine("[ allocations ] " + run.Bytes + " bytes over " + run.Frames + " masked multi-agent frames while " + run.Sent + " agent steps were sent");
                Assert.That(run.Sent, Is.GreaterThan(run.Frames * ids.Length / 2));
                Assert.That(run.Bytes, Is.EqualTo(0));
                client.Flush(10);
                Assert.That(AgentStepsReceived(server), Is.EqualTo(30 * 25 * ids.Length));
            }
        }
    }
}
