// Byte-box observations (protocol 1.4, §8.1, §10.9, §12.1): images go to the model as bytes in their
// own shape, and to a 1.4 server as one uint8 tensor per record or agent entry, their bytes in the
// body's binary attachment (§4.3; as JSON integers to an older server); a value that is not an
// integer 0-255 is refused at the call, by name.
using System;
using System.Collections.Generic;
using System.IO;
using System.Linq;
using Newtonsoft.Json.Linq;
using NUnit.Framework;
using Tether.Client;
using Tether.Inference;
using Tether.Protocol;

namespace Tether.Tests
{
    [TestFixture]
    public class ByteObservationTests
    {
        static readonly long[] Shape = { 2, 3, 1 };
        const int Width = 6;

        static string DataDir { get { return Path.Combine(ScriptedServer.Repo, "sdk_csharp/Tests/data"); } }

        // The server's own export for Box([2, 3, 1], uint8) -> Discrete(2), and onnxruntime's outputs for a few images.
        static JObject Reference { get { return JObject.Parse(File.ReadAllText(Path.Combine(DataDir, "policy_bytes_2x3x1.json"))); } }

        static byte[] ByteModel { get { return File.ReadAllBytes(Path.Combine(DataDir, (string)Reference["model"])); } }

        static byte[][] Images(int n, int seed = 0)
        {
            var rng = new Random(seed);
            var images = new byte[n][];
            for (int i = 0; i < n; ++i)
            {
                images[i] = new byte[Width];
                rng.NextBytes(images[i]);
            }
            return images;
        }

        static float[] Floats(byte[] image) { return image.Select(b => (float)b).ToArray(); }

        // A single-agent server whose observation space is the byte box, serving the byte model.
        static ScriptedServer ImageServer(string version, int envStepsPerSample = 5)
        {
            var server = new ScriptedServer(envStepsPerSample) { PongVersion = version };
            server.Config["observation_space"] = Space.ByteBox(Shape).ToJson();
            server.Config["onnx_input_names"] = new JArray("obs");
            server.ModelFile = OnnxCodec.Encode(ByteModel);
            return server;
        }

        // Plays one episode of `seen` (its last image ends it), as bytes or as floats; flushes.
        static void PlaySingle(ScriptedServer server, byte[][] seen, bool asBytes)
        {
            using (TetherClient client = TetherClient.Connect(server.Options(1)))
            {
                Assert.That(client.ObservationSpace.IsBytes, Is.True);
                var action = new double[1];
                string episode = client.StartEpisode();
                for (int t = 0; t + 1 < seen.Length; ++t)
                {
                    if (asBytes) client.GetAction(episode, seen[t], action);
                    else client.GetAction(episode, Floats(seen[t]), action);
                    Assert.That(action[0] == 0 || action[0] == 1, Is.True);
                    client.LogReturns(episode, 1.0);
                }
                if (asBytes) client.EndEpisode(episode, seen[seen.Length - 1]);
                else client.EndEpisode(episode, Floats(seen[seen.Length - 1]));
                client.Flush(10);
            }
        }

        // The observations of `records` (one actor's, in order) as images, the overlap of consecutive
        // chunks dropped; asserts they are uint8 tensors in the attachment, or JSON integers.
        static List<byte[]> ObservationsOf(IEnumerable<KeyValuePair<JToken, byte[]>> records, bool tensors)
        {
            var rows = new List<byte[]>();
            foreach (KeyValuePair<JToken, byte[]> item in records)
            {
                JToken obs = item.Key;
                double[] values;
                int count;
                if (tensors)
                {
                    Assert.That(obs, Is.InstanceOf<JObject>(), "a 1.4 server is sent a tensor");
                    Assert.That(obs["offset"], Is.Not.Null, "the tensor's bytes are in the attachment");
                    Tensor tensor = Tensors.Decode(obs, item.Value);
                    Assert.That(tensor.Dtype, Is.EqualTo("uint8"));
                    Assert.That(tensor.Shape.Skip(1).ToArray(), Is.EqualTo(Shape));
                    values = tensor.ToDoubles();
                    count = (int)tensor.Shape[0];
                }
                else
                {
                    Assert.That(obs, Is.InstanceOf<JArray>(), "an older server is sent JSON numbers");
                    Assert.That(AllIntegers(obs), Is.True, "integers");
                    values = Vectors.Flat(obs);
                    count = ((JArray)obs).Count;
                }
                for (int r = rows.Count == 0 ? 0 : 1; r < count; ++r) rows.Add(values.Skip(r * Width).Take(Width).Select(v => (byte)v).ToArray());
            }
            return rows;
        }

        static bool AllIntegers(JToken value)
        {
            var array = value as JArray;
            return array != null ? array.All(AllIntegers) : value.Type == JTokenType.Integer;
        }

        // The single-agent records of every batch (each checked as the server checks it), with their batch's attachment.
        static List<KeyValuePair<JToken, byte[]>> SingleRecords(ScriptedServer server, IEnumerable<JObject> batches)
        {
            Space obs = Space.ByteBox(Shape), act = Space.Discrete(2);
            var records = new List<KeyValuePair<JToken, byte[]>>();
            foreach (JObject batch in batches)
            {
                byte[] attachment = server.AttachmentOf(batch);
                Assert.That(EpisodeRecords.ValidateEpisodes(batch, obs, act, true, attachment), Is.EqualTo((int)batch["env_steps"]));
                foreach (JObject record in batch["episodes"]) records.Add(new KeyValuePair<JToken, byte[]>(record["obs"], attachment));
            }
            return records;
        }

        [TestCase(true)]
        [TestCase(false)]
        public void A14ServerGetsUint8TensorsOfTheImages(bool asBytes)
        {
            byte[][] seen = Images(13);
            using (ScriptedServer server = ImageServer("1.4"))
            {
                PlaySingle(server, seen, asBytes);
                List<JObject> batches = server.Received("EPISODES_AND_GET_STATE");
                Assert.That(batches.Count, Is.GreaterThan(1));
                Assert.That(batches.All(b => server.AttachmentOf(b) != null), Is.True, "each body carries its attachment");
                List<byte[]> rows = ObservationsOf(SingleRecords(server, batches), true);
                Assert.That(rows, Is.EqualTo(seen));
            }
        }

        [TestCase(true)]
        [TestCase(false)]
        public void AnOlderServerGetsJsonIntegers(bool asBytes)
        {
            byte[][] seen = Images(13, 1);
            using (ScriptedServer server = ImageServer("1.3"))
            {
                PlaySingle(server, seen, asBytes);
                List<JObject> batches = server.Received("EPISODES_AND_GET_STATE");
                Assert.That(batches.All(b => server.AttachmentOf(b) == null), Is.True, "no attachment for a 1.3 server");
                Assert.That(ObservationsOf(SingleRecords(server, batches), false), Is.EqualTo(seen));
                // (the PING announced this SDK's version all the same)
                Assert.That((string)server.Received("PING")[0]["protocol_version"], Is.EqualTo(Messages.ProtocolVersion));
            }
        }

        [Test]
        public void ABatchResentToAnOlderServerAfterAReconnectIsWrittenBackAsNumbers()
        {
            byte[][] seen = Images(13, 2);
            using (ScriptedServer server = ImageServer("1.4"))
            {
                server.DropOnceSeq = 1;
                server.PongVersionAfterDrop = "1.3";
                PlaySingle(server, seen, true);
                List<JObject> first = server.Received("EPISODES_AND_GET_STATE").Where(b => (long)b["batch_seq"] == 1).ToList();
                Assert.That(first.Count, Is.EqualTo(2), "sent, lost with its connection, resent");
                List<byte[]> asTensor = ObservationsOf(SingleRecords(server, first.Take(1)), true);
                List<byte[]> asNumbers = ObservationsOf(SingleRecords(server, first.Skip(1)), false);
                Assert.That(asNumbers, Is.EqualTo(asTensor));
                List<JObject> all = server.Received("EPISODES_AND_GET_STATE").Skip(2).ToList();
                var records = SingleRecords(server, first.Skip(1)).Concat(SingleRecords(server, all)).ToList();
                Assert.That(ObservationsOf(records, false), Is.EqualTo(seen));
            }
        }

        [TestCase(0.5f)]
        [TestCase(256f)]
        [TestCase(-1f)]
        public void AValueThatIsNoByteIsRefusedLocally(float bad)
        {
            using (ScriptedServer server = ImageServer("1.4"))
            using (TetherClient client = TetherClient.Connect(server.Options(1)))
            {
                string episode = client.StartEpisode();
                var obs = new float[Width];
                obs[5] = bad;
                var action = new double[1];
                var e = Assert.Throws<TetherException>(() => client.GetAction(episode, obs, action));
                Assert.That(e.Code, Is.EqualTo(ErrorCode.ObsDtypeMismatch));
                Assert.That(e.Message, Is.StringContaining("observation[5]"));
                e = Assert.Throws<TetherException>(() => client.EndEpisode(episode, obs));
                Assert.That(e.Code, Is.EqualTo(ErrorCode.ObsDtypeMismatch));
                // Nothing of the bad one was kept: the episode goes on and is sent whole.
                for (int t = 0; t < 7; ++t)
                {
                    client.GetAction(episode, new byte[Width], action);
                    Assert.That(action[0] == 0 || action[0] == 1, Is.True);
                }
                client.EndEpisode(episode, new float[Width]);
                client.Flush(10);
                List<JObject> batches = server.Received("EPISODES_AND_GET_STATE");
                Assert.That(SingleRecords(server, batches).Count, Is.GreaterThan(0));
                Assert.That(batches.Sum(b => (int)b["env_steps"]), Is.EqualTo(7));
            }
        }

        // ---- multi-agent ----------------------------------------------------------------------------

        // Modules "eyes" (the byte box, its model) for the agents cam_*, and "plain" (Box [4], the float test model) for the others.
        static ScriptedServer CameraServer(string version)
        {
            ScriptedServer server = ScriptedServer.Plain(4);
            server.PongVersion = version;
            var eyes = new JObject { { "observation_space", Space.ByteBox(Shape).ToJson() }, { "action_space", Space.Discrete(2).ToJson() },
                                     { "onnx_input_names", new JArray("obs") }, { "onnx_output_names", new JArray("action_dist_inputs") } };
            var plain = new JObject { { "observation_space", Space.Box(new long[] { 4 }, -10, 10).ToJson() }, { "action_space", Space.Discrete(2).ToJson() },
                                      { "onnx_input_names", new JArray("onnx::Gemm_0") }, { "onnx_output_names", new JArray("action_dist_inputs") } };
            server.Config["modules"] = new JObject { { "eyes", eyes }, { "plain", plain } };
            server.Config["policy_mapping"] = JArray.Parse("[{\"pattern\": \"cam_*\", \"module\": \"eyes\"}, {\"pattern\": \"*\", \"module\": \"plain\"}]");
            server.ModuleFiles = new Dictionary<string, string> { { "eyes", OnnxCodec.Encode(ByteModel) }, { "plain", server.ModelFile } };
            return server;
        }

        [Test]
        public void AMultiAgentModuleOfImagesSendsATensorPerEntryAndAFloatModuleNumbers()
        {
            byte[][] seen = Images(7, 3);
            using (ScriptedServer server = CameraServer("1.4"))
            {
                using (MultiAgentClient client = MultiAgentClient.Connect(server.Options(1)))
                {
                    var frame = new AgentFrame();
                    string episode = client.StartEpisode();
                    for (int t = 0; t + 1 < seen.Length; ++t)
                    {
                        frame.Clear();
                        frame.Add("cam_1", seen[t]);
                        frame.Add("walker", new float[] { 0.5f, -0.25f, 0, 1 });
                        client.GetActions(episode, frame);
                        Assert.That(frame.DiscreteAction(0) == 0 || frame.DiscreteAction(0) == 1, Is.True);
                        client.LogReturns(episode, "cam_1", 1.0);
                        client.LogReturns(episode, "walker", 0.0);
                    }
                    frame.Clear();
                    frame.Add("cam_1", seen[seen.Length - 1]);
                    frame.Add("walker", new float[4]);
                    client.EndEpisode(episode, frame);
                    client.Flush(10);
                }
                var specs = new Dictionary<string, ModuleSpec>();
                foreach (JProperty m in ((JObject)server.Config["modules"]).Properties()) specs[m.Name] = ModuleSpec.FromJson(m.Name, m.Value);
                var cams = new List<KeyValuePair<JToken, byte[]>>();
                int walkers = 0;
                foreach (JObject batch in server.Received("EPISODES_AND_GET_STATE"))
                {
                    byte[] attachment = server.AttachmentOf(batch);
                    var records = (JArray)batch["episodes"];
                    for (int i = 0; i < records.Count; ++i)
                    {
                        EpisodeRecords.ValidateMultiAgentRecord(records[i], i, specs, true, attachment);  // throws what the server would refuse
                        JToken cam = records[i]["agents"]["cam_1"], walker = records[i]["agents"]["walker"];
                        if (cam != null) cams.Add(new KeyValuePair<JToken, byte[]>(cam["obs"], attachment));
                        if (walker == null) continue;
                        Assert.That(walker["obs"], Is.InstanceOf<JArray>(), "a float module's entries stay numbers");
                        ++walkers;
                    }
                }
                Assert.That(cams.Count, Is.GreaterThan(1));
                Assert.That(walkers, Is.GreaterThan(1));
                Assert.That(ObservationsOf(cams, true), Is.EqualTo(seen));
            }
        }

        [Test]
        public void AMultiAgentFrameWithANonByteValueForAnImageModuleIsRefusedWholeAndNamed()
        {
            using (ScriptedServer server = CameraServer("1.3"))
            using (MultiAgentClient client = MultiAgentClient.Connect(server.Options(1)))
            {
                var frame = new AgentFrame();
                string episode = client.StartEpisode();
                byte[][] images = Images(2, 4);
                for (int t = 0; t < 3; ++t)
                {
                    frame.Clear();
                    frame.Add("cam_1", images[0]);
                    frame.Add("cam_2", images[1]);
                    client.GetActions(episode, frame);
                }
                Assert.That(client.SteadyStateFramesActed, Is.GreaterThan(0), "the frames of one module took the steady-state path");
                float[] floats = Floats(images[1]);
                floats[4] = 12.5f;
                frame.Clear();
                frame.Add("cam_1", images[0]);
                frame.Add("cam_2", floats);
                var e = Assert.Throws<TetherException>(() => client.GetActions(episode, frame));
                Assert.That(e.Code, Is.EqualTo(ErrorCode.ObsDtypeMismatch));
                Assert.That(e.Message, Is.StringContaining("agent 'cam_2': observation[4] is 12.5").And.StringContaining("module 'eyes'"));
                e = Assert.Throws<TetherException>(() => client.EndAgents(episode, frame));
                Assert.That(e.Code, Is.EqualTo(ErrorCode.ObsDtypeMismatch));
                // Floats holding bytes are bytes; a float module's agent may hold anything finite.
                floats[4] = 12;
                frame.Clear();
                frame.Add("cam_1", images[0]);
                frame.Add("cam_2", floats);
                frame.Add("walker", new float[] { -0.5f, 0.25f, 0, 1 });
                client.GetActions(episode, frame);
                client.EndEpisode(episode);
                client.Flush(10);
                var specs = new Dictionary<string, ModuleSpec>();
                foreach (JProperty m in ((JObject)server.Config["modules"]).Properties()) specs[m.Name] = ModuleSpec.FromJson(m.Name, m.Value);
                int agentSteps = 0;
                foreach (JObject batch in server.Received("EPISODES_AND_GET_STATE"))
                {
                    var records = (JArray)batch["episodes"];
                    for (int i = 0; i < records.Count; ++i) agentSteps += EpisodeRecords.ValidateMultiAgentRecord(records[i], i, specs, true);
                }
                Assert.That(agentSteps, Is.EqualTo(9), "four frames of the cameras and one of the walker; nothing of the refused frame");
            }
        }

        // ---- the protocol core ----------------------------------------------------------------------

        static TetherException Refusal(Action call)
        {
            return Assert.Throws<TetherException>(() => call());
        }

        [Test]
        public void AByteBoxIsAUint8BoxWithinZeroTo255()
        {
            Space image = Space.FromJson(JObject.Parse("{\"type\": \"Box\", \"shape\": [2, 3, 1], \"dtype\": \"uint8\", \"low\": 0, \"high\": 255}"));
            Assert.That(image.IsBytes, Is.True);
            Assert.That(image.FlatDim, Is.EqualTo(Width));
            Assert.That(JToken.DeepEquals(image.ToJson(), Space.ByteBox(Shape).ToJson()), Is.True);
            Assert.That(Space.FromJson(image.ToJson()).IsBytes, Is.True);
            Assert.That(Space.Box(Shape, 0, 255).IsBytes, Is.False);
            Assert.That(Space.Discrete(3).IsBytes, Is.False);
            // Its bounds lie within [0, 255]: the default ones (infinite) do not.
            Assert.That(Refusal(() => Space.FromJson(JObject.Parse("{\"type\": \"Box\", \"shape\": [2], \"dtype\": \"uint8\"}"))).Code, Is.EqualTo(ErrorCode.InvalidField));
            Assert.That(Refusal(() => Space.Box(Shape, 0, 256, "uint8")).Code, Is.EqualTo(ErrorCode.InvalidArgument));
            Assert.That(Refusal(() => Space.FromJson(JObject.Parse("{\"type\": \"Box\", \"shape\": [2], \"dtype\": null}"))).Code, Is.EqualTo(ErrorCode.InvalidField));
        }

        static EpisodeChunk ImageChunk(byte[][] images)
        {
            var chunk = new EpisodeChunk { EpisodeId = "e", IsTerminated = true };
            for (int t = 0; t < images.Length; ++t)
            {
                chunk.Obs.AddRange(Floats(images[t]));
                if (t + 1 == images.Length) break;
                chunk.Actions.Add(t % 2);
                chunk.Rewards.Add(1);
                chunk.ActionLogp.Add(-0.69);
            }
            return chunk;
        }

        // The message a writer frames for `chunk`, decoded as a server decodes it.
        static Message Written(EpisodeChunk chunk, bool tensors)
        {
            var writer = new RecordWriter();
            writer.BeginMessage("EPISODES", tensors);
            writer.SingleAgentRecord(chunk, Space.ByteBox(Shape), Space.Discrete(2));
            writer.EndEpisodes();
            writer.Field("env_steps", chunk.Steps);
            byte[] frame = null;
            int length = writer.EndMessage(ref frame);
            var bodies = new List<byte[]>();
            new FrameDecoder().Feed(frame, 0, length, bodies);
            Assert.That(bodies.Count, Is.EqualTo(1));
            return Messages.Decode(bodies[0]);
        }

        [Test]
        public void ARecordOfAByteBoxGoesAsATensorInTheAttachmentOrAsIntegers()
        {
            byte[][] images = Images(3, 6);
            EpisodeChunk chunk = ImageChunk(images);
            Space obs = Space.ByteBox(Shape), act = Space.Discrete(2);
            Message tensor = Written(chunk, true);
            Assert.That(tensor.Attachment, Is.EqualTo(images.SelectMany(i => i).ToArray()));
            JToken written = tensor.Body["episodes"][0]["obs"];
            Assert.That(JToken.DeepEquals(written, JObject.Parse("{\"dtype\": \"uint8\", \"shape\": [3, 2, 3, 1], \"offset\": 0}")), Is.True, written.ToString());
            Assert.That(EpisodeRecords.ValidateEpisodes(tensor.Body, obs, act, true, tensor.Attachment), Is.EqualTo(2));
            Assert.That(Refusal(() => EpisodeRecords.ValidateEpisodes(tensor.Body, obs, act, true)).Code, Is.EqualTo(ErrorCode.InvalidTensor));
            Assert.That(Refusal(() => EpisodeRecords.ValidateEpisodes(tensor.Body, Space.Box(new long[] { Width }, 0, 255), act, true, tensor.Attachment)).Code,
                        Is.EqualTo(ErrorCode.ObsDtypeMismatch));

            Message numbers = Written(chunk, false);
            Assert.That(numbers.Attachment, Is.Null);
            Assert.That(AllIntegers(numbers.Body["episodes"][0]["obs"]), Is.True);
            Assert.That(EpisodeRecords.ValidateEpisodes(numbers.Body, obs, act, true), Is.EqualTo(2));
            JToken encoded = EpisodeRecords.Encode(chunk, obs, act)["obs"];
            Assert.That(JToken.DeepEquals(encoded, numbers.Body["episodes"][0]["obs"]), Is.True, "the JToken writer agrees: " + encoded.ToString(Newtonsoft.Json.Formatting.None));

            chunk.Obs[4] = 0.5f;
            Assert.That(Refusal(() => EpisodeRecords.Encode(chunk, obs, act)).Code, Is.EqualTo(ErrorCode.ObsDtypeMismatch));
            Assert.That(Refusal(() => Written(chunk, true)).Code, Is.EqualTo(ErrorCode.ObsDtypeMismatch));
        }

        static JObject Body(string obs, string rewards = "[1.0]")
        {
            return JObject.Parse("{\"type\": \"EPISODES\", \"episodes\": [{\"obs\": " + obs + ", \"actions\": [0], \"rewards\": " + rewards +
                                 ", \"action_logp\": [-0.69], \"is_terminated\": true, \"is_truncated\": false}]}");
        }

        [Test]
        public void ValidationFollowsTheOrderOfChecks4And11b()
        {
            Space obs = Space.ByteBox(new long[] { 2 }), act = Space.Discrete(2);
            Assert.That(EpisodeRecords.ValidateEpisodes(Body("[[0, 255], [7.0, 8]]"), obs, act, true), Is.EqualTo(1));
            Assert.That(Refusal(() => EpisodeRecords.ValidateEpisodes(Body("[[0, 0.5], [7, 8]]"), obs, act, true)).Code, Is.EqualTo(ErrorCode.ObsDtypeMismatch));
            // 11b comes after the rewards' finiteness (11), 11 after the shapes (10), the tensor's own checks first (4).
            Assert.That(Refusal(() => EpisodeRecords.ValidateEpisodes(Body("[[0, 0.5], [7, 8]]", "[null]"), obs, act, true)).Code, Is.EqualTo(ErrorCode.NonFiniteValue));
            Assert.That(Refusal(() => EpisodeRecords.ValidateEpisodes(Body("[[0, 0.5, 1], [7, 8, 9]]", "[null]"), obs, act, true)).Code, Is.EqualTo(ErrorCode.ObsShapeMismatch));
            Assert.That(Refusal(() => EpisodeRecords.ValidateEpisodes(Body("{\"dtype\": \"uint8\", \"shape\": [2, 2], \"offset\": 0}", "[null]"), obs, act, true, new byte[3])).Code,
                        Is.EqualTo(ErrorCode.InvalidTensor));
            Assert.That(Refusal(() => EpisodeRecords.ValidateEpisodes(Body("{\"dtype\": \"float32\", \"shape\": [2, 2], \"offset\": 0}", "[null]"), obs, act, true, new byte[16])).Code,
                        Is.EqualTo(ErrorCode.ObsDtypeMismatch));
            Assert.That(Refusal(() => EpisodeRecords.ValidateEpisodes(Body("{\"dtype\": \"uint8\", \"shape\": [2, 2], \"offset\": 1}", "[null]"), obs, act, true, new byte[5])).Code,
                        Is.EqualTo(ErrorCode.NonFiniteValue));
            Assert.That(EpisodeRecords.ValidateEpisodes(Body("{\"dtype\": \"uint8\", \"shape\": [2, 2], \"offset\": 1}"), obs, act, true, new byte[] { 9, 0, 255, 7, 8 }), Is.EqualTo(1));
        }

        [Test]
        public void AnAgentEntrysObsMayBeATensorOfItsModulesElementType()
        {
            var modules = new Dictionary<string, ModuleSpec>
            {
                { "eyes", new ModuleSpec { ModuleId = "eyes", ObservationSpace = Space.ByteBox(new long[] { 2 }), ActionSpace = Space.Discrete(2) } },
                { "plain", new ModuleSpec { ModuleId = "plain", ObservationSpace = Space.Box(new long[] { 1 }, -1, 1), ActionSpace = Space.Discrete(2) } },
            };
            Func<string, string, JObject> record = (cam, walker) => JObject.Parse(
                "{\"episode_id\": \"e\", \"agents\": {" +
                "\"cam\": {\"module\": \"eyes\", \"obs\": " + cam + ", \"actions\": [1], \"rewards\": [0.5], \"action_logp\": [-0.69], \"is_terminated\": false, \"is_truncated\": false}, " +
                "\"walker\": {\"module\": \"plain\", \"obs\": " + walker + ", \"actions\": [0], \"rewards\": [0.0], \"action_logp\": [-0.69], \"is_terminated\": false, \"is_truncated\": false}}}");
            byte[] attachment = new byte[] { 1, 2, 3, 4 }.Concat(new byte[8]).ToArray();  // 4 bytes, then two float32 zeros
            string camTensor = "{\"dtype\": \"uint8\", \"shape\": [2, 2], \"offset\": 0}";
            Assert.That(EpisodeRecords.ValidateMultiAgentRecord(record(camTensor, "[[0.5], [0.25]]"), 0, modules, true, attachment), Is.EqualTo(2));
            Assert.That(EpisodeRecords.ValidateMultiAgentRecord(record(camTensor, "{\"dtype\": \"float32\", \"shape\": [2, 1], \"offset\": 4}"), 0, modules, true, attachment),
                        Is.EqualTo(2));
            Assert.That(EpisodeRecords.ValidateMultiAgentRecord(record(camTensor, Tensors.Encode(new float[] { 0.5f, -1 }, new long[] { 2, 1 }).ToString()), 0, modules, true, attachment),
                        Is.EqualTo(2));
            TetherException e = Refusal(() => EpisodeRecords.ValidateMultiAgentRecord(record(camTensor, "{\"dtype\": \"uint8\", \"shape\": [2, 1], \"offset\": 0}"), 0, modules, true, attachment));
            Assert.That(e.Code, Is.EqualTo(ErrorCode.ObsDtypeMismatch));
            Assert.That(e.Message, Is.StringContaining("episodes[0].agents['walker']"));
            e = Refusal(() => EpisodeRecords.ValidateMultiAgentRecord(record("[[1, 2], [3, 256]]", "[[0.5], [0.25]]"), 0, modules, true));
            Assert.That(e.Code, Is.EqualTo(ErrorCode.ObsDtypeMismatch));
            Assert.That(e.Message, Is.StringContaining("episodes[0].agents['cam']: \"obs\"[1]"));
        }

        // ---- the model ------------------------------------------------------------------------------

        [Test]
        public void OnnxRuntimeFeedsAByteModelBytesInTheImagesShape()
        {
            JObject reference = Reference;
            var rows = (JArray)reference["observations"];
            int n = rows.Count;
            var bytes = new byte[n * Width];
            for (int r = 0; r < n; ++r)
            {
                for (int j = 0; j < Width; ++j) bytes[r * Width + j] = (byte)(int)rows[r][j];
            }
            float[] floats = Floats(bytes);
            using (var backend = new OnnxRuntimeBackend())
            {
                backend.Load(ByteModel, (string)reference["input_name"], (string)reference["output_name"]);
                Assert.That(backend.InputIsBytes, Is.True);
                Assert.That(backend.InputDims, Is.EqualTo(Shape));
                Assert.That(backend.ObsDim, Is.EqualTo(Width));
                Assert.That(backend.OutDim, Is.EqualTo(2));
                var fromBytes = new float[n * 2];
                var fromFloats = new float[n * 2];
                backend.Run(bytes, n, Width, fromBytes, 2);
                backend.Run(floats, n, Width, fromFloats, 2);
                var one = new float[2];
                for (int r = 0; r < n; ++r)
                {
                    for (int j = 0; j < 2; ++j)
                    {
                        float expected = (float)reference["outputs"][r][j];
                        Assert.That(fromBytes[r * 2 + j], Is.EqualTo(expected).Within(1e-5));
                        Assert.That(fromFloats[r * 2 + j], Is.EqualTo(fromBytes[r * 2 + j]));
                    }
                    backend.Run(bytes.Skip(r * Width).Take(Width).ToArray(), 1, Width, one, 2);  // (another bound batch size)
                    Assert.That(one[1], Is.EqualTo(fromBytes[r * 2 + 1]).Within(1e-6));
                }
                floats[3] = 0.5f;
                var e = Assert.Throws<TetherException>(() => backend.Run(floats, n, Width, fromFloats, 2));
                Assert.That(e.Code, Is.EqualTo(ErrorCode.ObsDtypeMismatch));
            }
            // The managed backend runs the same model on the bytes' values (Flatten and Cast read as no-ops).
            var managed = new ManagedPolicyBackend();
            managed.Load(ByteModel, (string)reference["input_name"], (string)reference["output_name"]);
            Assert.That(managed.ObsDim, Is.EqualTo(Width));
            var output = new float[n * 2];
            managed.Run(Floats(bytes), n, Width, output, 2);
            for (int r = 0; r < n; ++r)
            {
                for (int j = 0; j < 2; ++j) Assert.That(output[r * 2 + j], Is.EqualTo((float)reference["outputs"][r][j]).Within(1e-4));
            }
        }

        [Test]
        public void AFloatModelRunsOnBytesToo()
        {
            using (var backend = new OnnxRuntimeBackend())
            {
                backend.Load(ScriptedServer.TestModel, "onnx::Gemm_0", "action_dist_inputs");
                Assert.That(backend.InputIsBytes, Is.False);
                Assert.That(backend.InputDims, Is.EqualTo(new long[] { 4 }));
                var a = new float[2];
                var b = new float[2];
                backend.Run(new byte[] { 1, 0, 2, 3 }, 1, 4, a, 2);
                backend.Run(new float[] { 1, 0, 2, 3 }, 1, 4, b, 2);
                Assert.That(a, Is.EqualTo(b));
            }
        }

        // ---- allocations ----------------------------------------------------------------------------

        [Test]
        public void GetActionOnBytesAllocatesNothingInSteadyState()
        {
            // As GetActionAllocatesNothingInSteadyState for vectors: batches are cut, written as tensors
            // into their attachment and delivered meanwhile; the game's thread allocates nothing.
            const int perSample = 500;
            byte[][] images = Images(16, 5);
            using (ScriptedServer server = ImageServer("1.4", perSample))
            using (TetherClient client = TetherClient.Connect(server.Options(1)))
            {
                var action = new double[1];
                GetActionAllocations run = GetActionAllocations.Measure(client, 140, 20, (episode, e, t) => client.GetAction(episode, images[(e + t) % images.Length], action),
                                                                        (episode, e) => client.EndEpisode(episode, images[e % images.Length]));
                Console.WriteLine("[ allocations ] " + run.Allocating + " of " + run.Calls + " GetAction(byte[]) calls allocated (" + run.Bytes + " bytes) while " + run.Sent + " steps were sent");
                Assert.That(run.Sent, Is.GreaterThanOrEqualTo(run.Calls - perSample));
                Assert.That(run.Bytes, Is.EqualTo(0));
                JObject last = server.Received("EPISODES_AND_GET_STATE").Last();
                Assert.That(last["episodes"][0]["obs"]["offset"], Is.Not.Null, "sent as tensors");
            }
        }

        [Test]
        public void GetActionOnRealSizeImagesAllocatesNothingInSteadyState()
        {
            // The same on 84x84x4 camera images (28,224 bytes a step) through a one-convolution model
            // (data/make_image_policy_model.py): batches of 250 images (7 MB) cut, written and sent
            // during the measured calls.
            const int perSample = 250, size = 84 * 84 * 4;
            var rng = new Random(3);
            var images = new byte[8][];
            for (int i = 0; i < images.Length; ++i)
            {
                images[i] = new byte[size];
                rng.NextBytes(images[i]);
            }
            var server = new ScriptedServer(perSample) { PongVersion = "1.4" };
            using (server)
            {
                server.Config["observation_space"] = Space.ByteBox(new long[] { 84, 84, 4 }).ToJson();
                server.Config["action_space"] = Space.Discrete(6).ToJson();
                server.Config["onnx_input_names"] = new JArray("obs");
                server.ModelFile = OnnxCodec.Encode(File.ReadAllBytes(Path.Combine(DataDir, "policy_image_84x84x4.onnx")));
                using (TetherClient client = TetherClient.Connect(server.Options(1)))
                {
                    Assert.That(client.ObservationSpace.FlatDim, Is.EqualTo(size));
                    var action = new double[1];
                    GetActionAllocations run = GetActionAllocations.Measure(client, 14, 4, (episode, e, t) => client.GetAction(episode, images[(e + t) % images.Length], action),
                                                                            (episode, e) => client.EndEpisode(episode, images[e % images.Length]));
                    Console.WriteLine("[ allocations ] " + run.Allocating + " of " + run.Calls + " GetAction(byte[84x84x4]) calls allocated (" + run.Bytes + " bytes) while " +
                                      run.Sent + " steps were sent");
                    Assert.That(action[0], Is.InRange(0, 5));
                    Assert.That(run.Sent, Is.GreaterThanOrEqualTo(run.Calls - perSample));
                    Assert.That(run.Bytes, Is.EqualTo(0));
                }
                JObject last = server.Received("EPISODES_AND_GET_STATE").Last();
                Assert.That(last["episodes"][0]["obs"]["offset"], Is.Not.Null, "sent as tensors");
                Assert.That(server.AttachmentOf(last).Length, Is.GreaterThanOrEqualTo(size), "the images travel in the attachment");
            }
        }
    }
}
