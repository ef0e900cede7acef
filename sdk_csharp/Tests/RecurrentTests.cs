// Memory (protocol 1.5, §9.1, §10.1, §12.1, §12.4): the clients carry a model's recurrent state per actor.
using System;
using System.Collections.Generic;
using System.Linq;
using Newtonsoft.Json.Linq;
using NUnit.Framework;
using Tether.Client;
using Tether.Inference;
using Tether.Protocol;

namespace Tether.Tests
{
    [TestFixture]
    public class RecurrentTests
    {
        // ---- the model and its reference run ---------------------------------------------------

        // recurrent.json's small LSTM (obs 2, Discrete(2), state_in_h/state_in_c of 3 units).
        static JObject Carry { get { return (JObject)((JArray)Vectors.Load("recurrent.json")["cases"]).First(c => (string)c["kind"] == "carry"); } }

        static byte[] Lstm { get { return Convert.FromBase64String((string)Carry["model_b64"]); } }

        static RecurrentState Lstm2x3 { get { return RecurrentState.FromJson(Carry["recurrent_state"]); } }

        // The observations an actor sees: step t's (distinct per `salt`).
        static float[] ObsAt(int t, int salt = 0)
        {
            return new[] { (float)Math.Sin(0.7 * t + salt), (float)Math.Cos(0.3 * t - salt) };
        }

        // The LSTM run step by step from zeros, the state fed back: dist inputs and state after each step.
        sealed class Reference
        {
            public readonly List<float[]> Dist = new List<float[]>();
            public readonly List<float[]> After = new List<float[]>();

            // (the runtime itself is checked against the vector first: a reference is no better than it)
            public static Reference Of(IList<float[]> observations, bool checkRuntime = true)
            {
                if (checkRuntime)
                {
                    JObject carry = Carry;
                    var vector = carry["observations"].Take(((JArray)carry["state_after"]).Count).Select(o => o.Select(v => (float)v).ToArray()).ToList();
                    Reference check = Of(vector, false);
                    for (int t = 0; t < vector.Count; ++t) AssertClose(check.After[t], Vectors.Flat(carry["state_after"][t]).Select(v => (float)v).ToArray(), "the vector's state after step " + t);
                }
                var run = new Reference();
                using (var backend = new OnnxRuntimeBackend())
                {
                    BackendLoading.Load(backend, Lstm, null, "onnx::Gemm_0", "action_dist_inputs", Lstm2x3);
                    var state = new float[6];
                    foreach (float[] obs in observations)
                    {
                        var dist = new float[2];
                        backend.Run(obs, 1, 2, dist, 2, state, state);
                        run.Dist.Add(dist);
                        run.After.Add((float[])state.Clone());
                    }
                }
                return run;
            }

            // The state before step t (zeros before the first).
            public float[] Before(int t) { return t == 0 ? new float[6] : After[t - 1]; }
        }

        static void AssertClose(IList<float> got, IList<float> expected, string what, double tolerance = 1e-5)
        {
            Assert.That(got.Count, Is.EqualTo(expected.Count), what + ": size");
            for (int i = 0; i < got.Count; ++i) Assert.That(got[i], Is.EqualTo(expected[i]).Within(tolerance), what + "[" + i + "]");
        }

        static float[] StateIn(JToken record)
        {
            var state = record["state_in"] as JObject;
            Assert.That(state, Is.Not.Null, "the record has a state_in");
            Assert.That(state.Properties().Select(p => p.Name), Is.EquivalentTo(new[] { "state_in_h", "state_in_c" }));
            return state["state_in_h"].Concat(state["state_in_c"]).Select(v => (float)v).ToArray();
        }

        // ---- a server serving the LSTM ----------------------------------------------------------

        // The LSTM's server: a ReconnectingServer of protocol 1.5 that serves the LSTM and answers every batch.
        sealed class MemoryServer : ReconnectingServer
        {
            public MemoryServer()
            {
                StateOf = c => Weights(0, Lstm);
                BatchAnswer = (c, n) => new JObject { { "type", "SET_STATE" }, { "weights_seq_no", 0 } };
                PongVersion = "1.5";
            }
        }

        static JObject Weights(long seq, byte[] model)
        {
            return new JObject { { "type", "SET_STATE" }, { "weights_seq_no", seq }, { "onnx_file", OnnxCodec.Encode(model) } };
        }

        static JObject SingleConfig(int perSample, JToken recurrent = null)
        {
            return new JObject
            {
                { "type", "SET_CONFIG" }, { "env_steps_per_sample", perSample }, { "force_on_policy", true }, { "protocol_version", "1.5" },
                { "heartbeat_interval_s", 0 }, { "observation_space", Space.Box(new long[] { 2 }, -1, 1).ToJson() }, { "action_space", Space.Discrete(2).ToJson() },
                { "onnx_input_names", new JArray("onnx::Gemm_0") }, { "onnx_output_names", new JArray("action_dist_inputs") },
                { "recurrent_state", recurrent ?? Lstm2x3.ToJson() },
            };
        }

        static ClientOptions Options(LoopbackServer server, bool waitForWeights = false)
        {
            return new ClientOptions
            {
                Port = server.Port, Seed = 5, ReconnectTimeoutSeconds = 5, ResponseTimeoutSeconds = 5, UpdateTimeoutSeconds = 5,
                WaitForWeights = waitForWeights, WhenQueueFull = QueueFullPolicy.Wait,
            };
        }


        // ---- conformance --------------------------------------------------------------------------

        [Test]
        public void RecurrentStateVectors()
        {
            Vectors.Check("recurrent.json", (file, c) =>
            {
                string kind = (string)c["kind"];
                if (kind == "module")
                {
                    if (c["error"] != null)
                    {
                        Vectors.ExpectError((string)c["error"], () => ModuleSpec.FromJson("m", c["module"]));
                        return;
                    }
                    RecurrentState state = ModuleSpec.FromJson("m", c["module"]).RecurrentState;
                    var expected = (JArray)c["recurrent_state"];
                    Vectors.Expect(expected.Count == 0 ? state == null : state != null && JToken.DeepEquals(state.ToJson(), expected), "recurrent_state " +
                                   (state == null ? "none" : state.ToJson().ToString(Newtonsoft.Json.Formatting.None)));
                    return;
                }
                if (kind != "carry") return;  // ("episode": a server's checks)
                CheckCarry(c);
            });
        }

        // The model run step by step from zeros with its state fed back gives each step's dist inputs and
        // state; the client's records, cut after cut_after steps, carry the states their first steps started from.
        static void CheckCarry(JObject c)
        {
            double tolerance = (double)c["tolerance"];
            RecurrentState state = RecurrentState.FromJson(c["recurrent_state"]);
            byte[] model = Convert.FromBase64String((string)c["model_b64"]);
            float[][] observations = c["observations"].Select(o => o.Select(v => (float)v).ToArray()).ToArray();
            var dists = (JArray)c["dist_inputs"];
            var after = (JArray)c["state_after"];
            int k = Space.ActionFromJson(c["action_space"]).DistInputsSize;
            using (var backend = new OnnxRuntimeBackend())
            {
                BackendLoading.Load(backend, model, null, (string)c["input"], (string)c["output"], state);
                var carried = new float[state.Width];
                var dist = new float[k];
                for (int t = 0; t < dists.Count; ++t)
                {
                    backend.Run(observations[t], 1, observations[t].Length, dist, k, carried, carried);
                    double[] expectedDist = Vectors.Flat(dists[t]), expectedState = Vectors.Flat(after[t]);
                    for (int j = 0; j < k; ++j) Vectors.Expect(Math.Abs(dist[j] - expectedDist[j]) <= tolerance, "step " + t + ": dist[" + j + "] " + dist[j]);
                    for (int j = 0; j < state.Width; ++j) Vectors.Expect(Math.Abs(carried[j] - expectedState[j]) <= tolerance, "step " + t + ": state[" + j + "] " + carried[j]);
                }
            }
            // The client's records: steps 0..cut_after-1, then the rest (the final observation closes it).
            int cut = (int)c["cut_after"];
            var server = new MemoryServer { StateOf = n => Weights(0, model) };
            server.ConfigOf = n =>
            {
                JObject config = SingleConfig(1000000, state.ToJson());
                config["observation_space"] = Space.Box(new long[] { observations[0].Length }, -1, 1).ToJson();
                config["action_space"] = c["action_space"];
                config["onnx_input_names"] = new JArray(c["input"]);
                config["onnx_output_names"] = new JArray(c["output"]);
                return config;
            };
            using (server)
            using (TetherClient client = TetherClient.Connect(Options(server)))
            {
                var action = new double[1];
                string episode = client.StartEpisode("carry");
                for (int t = 0; t < dists.Count; ++t)
                {
                    client.GetAction(episode, observations[t], action);
                    if (t == cut) client.Flush(10);  // (cuts the steps before t: the one on observation t waits for the next)
                }
                client.EndEpisode(episode, observations[dists.Count]);
                client.Flush(10);
                List<JObject> records = server.Records();
                var expected = (JArray)c["records_state_in"];
                Vectors.Expect(records.Count == expected.Count, records.Count + " records");
                for (int r = 0; r < records.Count; ++r)
                {
                    var got = records[r]["state_in"] as JObject;
                    Vectors.Expect(got != null && got.Count == state.Tensors.Count, "record " + r + ": state_in " + got);
                    foreach (JProperty tensor in ((JObject)expected[r]).Properties())
                    {
                        double[] want = Vectors.Flat(tensor.Value), have = Vectors.Flat(got[tensor.Name]);
                        Vectors.Expect(have.Length == want.Length, "record " + r + ": " + tensor.Name + " size");
                        for (int j = 0; j < want.Length; ++j) Vectors.Expect(Math.Abs(have[j] - want[j]) <= tolerance, "record " + r + ": " + tensor.Name + "[" + j + "] " + have[j]);
                    }
                }
                Vectors.Expect(((JArray)records[0]["actions"]).Count == cut, "the first record holds cut_after steps");
            }
        }

        // ---- the single-agent client --------------------------------------------------------------

        [Test]
        public void TheStateStartsAtZerosAndAdvancesEveryStepAndEachRecordCarriesItsStart()
        {
            // Batches of 3 steps: every record (the first's start at zeros, each continuing one's the state
            // the previous chunk ended with) carries as state_in the state its first observation was fed with,
            // and its dist inputs are the model's with the state fed back.
            const int steps = 17;
            var observations = Enumerable.Range(0, steps + 1).Select(t => ObsAt(t)).ToList();
            Reference reference = Reference.Of(observations);
            var server = new MemoryServer { ConfigOf = n => SingleConfig(3) };
            using (server)
            using (TetherClient client = TetherClient.Connect(Options(server)))
            {
                Assert.That(RecurrentState.Same(client.RecurrentState, Lstm2x3), Is.True);
                var action = new double[1];
                string episode = client.StartEpisode("e");
                AssertClose(client.StateOf(episode), new float[6], "before the first step");
                for (int t = 0; t < steps; ++t)
                {
                    client.GetAction(episode, observations[t], action);
                    AssertClose(client.StateOf(episode), reference.After[t], "after step " + t);
                }
                client.EndEpisode(episode, observations[steps]);
                Assert.That(client.StateOf(episode), Is.Null, "dropped when the episode ends");
                client.Flush(10);
                List<JObject> records = server.Records();
                Assert.That(records.Count, Is.GreaterThan(3));
                int start = 0;
                foreach (JObject record in records)
                {
                    AssertClose(StateIn(record), reference.Before(start), "state_in of the record from step " + start);
                    var dists = (JArray)record["action_dist_inputs"];
                    for (int i = 0; i < dists.Count; ++i) AssertClose(dists[i].Select(v => (float)v).ToArray(), reference.Dist[start + i], "dist of step " + (start + i));
                    start += dists.Count;
                }
                Assert.That(start, Is.EqualTo(steps));
                // A new episode starts from zeros again.
                string next = client.StartEpisode("f");
                client.GetAction(next, observations[0], action);
                AssertClose(client.StateOf(next), reference.After[0], "a new episode's first step");
            }
        }

        [Test]
        public void EpisodesNotRecordedAdvanceTheirStateToo()
        {
            var observations = Enumerable.Range(0, 6).Select(t => ObsAt(t, 3)).ToList();
            Reference reference = Reference.Of(observations);
            var server = new MemoryServer { ConfigOf = n => SingleConfig(2) };
            using (server)
            using (TetherClient client = TetherClient.Connect(Options(server)))
            {
                var action = new double[1];
                string played = client.StartEpisode("played", trainingEnabled: false);
                string other = client.StartEpisode("other");
                for (int t = 0; t < observations.Count; ++t)
                {
                    client.GetAction(played, observations[t], action);
                    client.GetAction(other, ObsAt(t, 9), action);  // (episodes overlap: each has its own state)
                }
                AssertClose(client.StateOf(played), reference.After[observations.Count - 1], "an unrecorded episode's state");
                AssertClose(client.StateOf(other), Reference.Of(Enumerable.Range(0, 6).Select(t => ObsAt(t, 9)).ToList()).After[5], "the other's");
            }
        }

        [Test]
        public void AHotSwappedModelKeepsTheStates()
        {
            // Every batch's answer brings a new version (the same weights): the episode goes on with its memory.
            const int steps = 12;
            var observations = Enumerable.Range(0, steps + 1).Select(t => ObsAt(t, 1)).ToList();
            Reference reference = Reference.Of(observations);
            var server = new MemoryServer { ConfigOf = n => SingleConfig(4), BatchAnswer = (c, n) => Weights(n, Lstm) };
            using (server)
            using (TetherClient client = TetherClient.Connect(Options(server, waitForWeights: true)))
            {
                var action = new double[1];
                string episode = client.StartEpisode();
                for (int t = 0; t < steps; ++t)
                {
                    client.GetAction(episode, observations[t], action);
                    AssertClose(client.StateOf(episode), reference.After[t], "after step " + t);
                }
                Assert.That(client.WeightsSeqNo, Is.GreaterThanOrEqualTo(2), "models were swapped");
                client.EndEpisode(episode, observations[steps]);
                client.Flush(10);
                int start = 0;
                foreach (JObject record in server.Records())
                {
                    AssertClose(StateIn(record), reference.Before(start), "state_in from step " + start);
                    start += ((JArray)record["actions"]).Count;
                }
                Assert.That(start, Is.EqualTo(steps));
            }
        }

        [TestCase(false)]
        [TestCase(true)]
        public void AReconnectKeepsTheStatesUnlessTheRecurrentStateChanged(bool changed)
        {
            // The first connection is lost with its first batch (steps 0-9, cut at step 10). The second one
            // announces the same recurrent state (the states and steps 10-11 are kept) or another one (the
            // tensors in the other order: the states start again from zeros and steps 10-11 are let go).
            var observations = Enumerable.Range(0, 31).Select(t => ObsAt(t, 2)).ToList();
            Reference reference = Reference.Of(observations);
            JArray reversed = new JArray(Lstm2x3.ToJson().Reverse());
            var server = new MemoryServer { ConfigOf = c => c == 0 || !changed ? SingleConfig(10) : SingleConfig(10, reversed), BatchAnswer = (c, n) => c == 0 ? null : new JObject { { "type", "SET_STATE" }, { "weights_seq_no", 0 } } };
            using (server)
            using (TetherClient client = TetherClient.Connect(Options(server)))
            {
                server.Release.Reset();
                var action = new double[1];
                string episode = client.StartEpisode("e");
                for (int t = 0; t < 12; ++t) client.GetAction(episode, observations[t], action);
                server.Release.Set();
                LinkWaits.UntilConnected(client);
                client.Flush(10);  // (takes the new connection first)
                AssertClose(client.StateOf(episode), changed ? new float[6] : reference.After[11], "the state after the reconnect");
                var afterwards = new List<float[]>();
                for (int t = 12; t < 30; ++t)
                {
                    client.GetAction(episode, observations[t], action);
                    afterwards.Add(observations[t]);
                }
                client.EndEpisode(episode, observations[30]);
                client.Flush(10);
                List<JObject> records = server.Records();
                Assert.That(((JArray)records[0]["actions"]).Count, Is.EqualTo(10));
                AssertClose(StateIn(records[0]), new float[6], "the first record");
                float[] second = StateIn(records[1]);
                float firstObs = (float)records[1]["obs"][0][0];
                if (changed)
                {
                    Assert.That(firstObs, Is.EqualTo(observations[12][0]), "steps 10 and 11 were let go");
                    Assert.That(second, Is.EqualTo(new float[6]), "from zeros");
                    int total = records.Skip(1).Sum(r => ((JArray)r["actions"]).Count);
                    Assert.That(total, Is.EqualTo(18));
                    // (the tensors in the new order: state_in_c's values are the model's c)
                    Reference fresh = Reference.Of(afterwards);
                    AssertClose(records[1]["action_dist_inputs"][1].Select(v => (float)v).ToArray(), fresh.Dist[1], "the second step after the reconnect");
                }
                else
                {
                    Assert.That(firstObs, Is.EqualTo(observations[10][0]), "steps 10 and 11 were kept");
                    AssertClose(second, reference.After[9], "the continuing record");
                }
            }
        }

        [Test]
        public void AReconnectToAnotherServerRunStartsTheStateFromZeros()
        {
            // (1.8, §6.5) The same recurrent state, but the second connection reaches another server run: batch 1
            // (steps 0-9) is not sent again, steps 10-11 are let go, and the state starts again from zeros.
            var observations = Enumerable.Range(0, 31).Select(t => ObsAt(t, 2)).ToList();
            var server = new MemoryServer
            {
                ConfigOf = c => SingleConfig(10), PongVersion = "1.8", RunIdOf = c => c == 0 ? "run-a" : "run-b",
                BatchAnswer = (c, n) => c == 0 ? null : new JObject { { "type", "SET_STATE" }, { "weights_seq_no", 0 } },
            };
            using (server)
            using (TetherClient client = TetherClient.Connect(Options(server)))
            {
                server.Release.Reset();
                var action = new double[1];
                string episode = client.StartEpisode("e");
                for (int t = 0; t < 12; ++t) client.GetAction(episode, observations[t], action);
                Assert.That(client.StateOf(episode).Any(v => v != 0), Is.True);
                server.Release.Set();
                LinkWaits.UntilConnected(client);
                client.Flush(10);  // (takes the new connection first)
                AssertClose(client.StateOf(episode), new float[6], "the state after the reconnect to another run");
                for (int t = 12; t < 30; ++t) client.GetAction(episode, observations[t], action);
                client.EndEpisode(episode, observations[30]);
                client.Flush(10);
                Assert.That(client.OtherRunStepsDropped, Is.EqualTo(12));
                List<JObject> records = server.Records();
                Assert.That(((JArray)records[0]["actions"]).Count, Is.EqualTo(10), "batch 1, sent to run-a only");
                Assert.That((float)records[1]["obs"][0][0], Is.EqualTo(observations[12][0]), "steps 10 and 11 were let go");
                AssertClose(StateIn(records[1]), new float[6], "from zeros");
                Assert.That(records.Skip(1).Sum(r => ((JArray)r["actions"]).Count), Is.EqualTo(18));
            }
        }

        [Test]
        public void ComputeActionRemembersPerEpisodeId()
        {
            var observations = Enumerable.Range(0, 4).Select(t => ObsAt(t, 4)).ToList();
            Reference reference = Reference.Of(observations);
            var server = new MemoryServer { ConfigOf = n => SingleConfig(100) };
            using (server)
            using (TetherClient client = TetherClient.Connect(Options(server)))
            {
                var action = new double[1];
                for (int t = 0; t < 3; ++t) client.ComputeAction("eval-1", observations[t], action);
                AssertClose(client.StateOf("eval-1"), reference.After[2], "eval-1 after 3 calls");
                client.ComputeAction("eval-2", observations[0], action);  // another evaluation episode: from zeros
                AssertClose(client.StateOf("eval-2"), reference.After[0], "eval-2");
                Assert.That(client.StateOf("eval-1"), Is.Null, "one evaluation episode at a time");
                client.ComputeAction(observations[0], action);  // (the old call: the evaluation episode "")
                AssertClose(client.StateOf(""), reference.After[0], "\"\"");
                // A running episode not recorded (training disabled): its state is advanced by its greedy calls too.
                string running = client.StartEpisode("run", trainingEnabled: false);
                client.GetAction(running, observations[0], action);
                client.ComputeAction(running, observations[1], action);
                AssertClose(client.StateOf(running), reference.After[1], "the running episode");
                Assert.That(action[0], Is.EqualTo(reference.Dist[1][1] > reference.Dist[1][0] ? 1 : 0), "the greedy action");
                // A running episode that is recorded is refused: its state stays as GetAction left it.
                string recorded = client.StartEpisode("rec");
                client.GetAction(recorded, observations[0], action);
                var refused = Assert.Throws<TetherException>(() => client.ComputeAction(recorded, observations[1], action));
                Assert.That(refused.Code, Is.EqualTo(ErrorCode.InvalidArgument));
                StringAssert.Contains("'rec'", refused.Message);
                StringAssert.Contains("GetAction", refused.Message);
                AssertClose(client.StateOf(recorded), reference.After[0], "the recorded episode's state, unchanged");
            }
        }

        [Test]
        public void AModelLackingAnAnnouncedStateTensorIsRefused()
        {
            using (var backend = new OnnxRuntimeBackend())
            {
                // The feed-forward test model has no state_in_h.
                var e = Assert.Throws<TetherException>(() => BackendLoading.Load(backend, ScriptedServer.TestModel, null, "onnx::Gemm_0", "action_dist_inputs", Lstm2x3));
                Assert.That(e.Code, Is.EqualTo(ErrorCode.InvalidField));
                Assert.That(e.Message, Is.StringContaining("state_in_h"));
                // ... nor is one lacking an output.
                var outputs = RecurrentState.FromJson(JArray.Parse("[{\"input\": \"state_in_h\", \"output\": \"hidden_out\", \"size\": 3}, {\"input\": \"state_in_c\", \"output\": \"state_out_c\", \"size\": 3}]"));
                e = Assert.Throws<TetherException>(() => BackendLoading.Load(backend, Lstm, null, "onnx::Gemm_0", "action_dist_inputs", outputs));
                Assert.That(e.Code, Is.EqualTo(ErrorCode.InvalidField));
                Assert.That(e.Message, Is.StringContaining("hidden_out"));
            }
            // A client refuses such a model when a batch's answer brings it, and acts on with the one it has.
            var server = new MemoryServer
            {
                ConfigOf = n => SingleConfig(2),
                BatchAnswer = (c, n) => n == 1 ? Weights(1, ScriptedServer.TestModel) : new JObject { { "type", "SET_STATE" }, { "weights_seq_no", 0 } },
            };
            using (server)
            using (TetherClient client = TetherClient.Connect(Options(server, waitForWeights: true)))
            {
                var action = new double[1];
                string episode = client.StartEpisode();
                TetherException refused = null;
                for (int t = 0; t < 6 && refused == null; ++t)
                {
                    try
                    {
                        client.GetAction(episode, ObsAt(t), action);
                    }
                    catch (TetherException e)
                    {
                        refused = e;
                    }
                }
                Assert.That(refused, Is.Not.Null);
                Assert.That(refused.Code, Is.EqualTo(ErrorCode.InvalidField));
                Assert.That(client.WeightsSeqNo, Is.EqualTo(0));
                client.GetAction(episode, ObsAt(7), action);
            }
        }

        [Test]
        public void GetActionWithMemoryAllocatesNothingInSteadyState()
        {
            const int perSample = 100;
            var server = new MemoryServer { ConfigOf = n => SingleConfig(perSample) };
            using (server)
            using (TetherClient client = TetherClient.Connect(Options(server)))
            {
                var action = new double[1];
                float[][] observations = Enumerable.Range(0, 7).Select(t => ObsAt(t)).ToArray();
                GetActionAllocations run = GetActionAllocations.Measure(client, 60, 10, (episode, e, t) => client.GetAction(episode, observations[(e + t) % 7], action),
                                                                        (episode, e) => client.EndEpisode(episode, observations[e % 7]));
                Console.WriteLine("[ allocations ] " + run.Allocating + " of " + run.Calls + " GetAction calls with memory allocated (" + run.Bytes + " bytes) while " + run.Sent + " steps were sent");
                Assert.That(run.Sent, Is.GreaterThanOrEqualTo(run.Calls - perSample));
                Assert.That(run.Bytes, Is.EqualTo(0));
                Assert.That(server.Records().Last()["state_in"], Is.Not.Null);
            }
        }

        [Test]
        public void LogActionAdvancesTheStateAsGetActionDoes()
        {
            // Protocol 1.6 (§12.4): a logged step is an evaluation too. Every third step is logged: the states,
            // the records' state_in and dist inputs follow the reference all the same; a refused logged action
            // leaves the state as it was.
            const int steps = 13;
            var observations = Enumerable.Range(0, steps + 1).Select(t => ObsAt(t, 7)).ToList();
            Reference reference = Reference.Of(observations);
            var server = new MemoryServer { ConfigOf = n => SingleConfig(4), PongVersion = "1.6" };
            using (server)
            using (TetherClient client = TetherClient.Connect(Options(server)))
            {
                var action = new double[1];
                string episode = client.StartEpisode("e");
                for (int t = 0; t < steps; ++t)
                {
                    if (t % 3 == 1)
                    {
                        Assert.Throws<TetherException>(() => client.LogAction(episode, observations[t], new[] { 2.0 }));
                        AssertClose(client.StateOf(episode), reference.Before(t), "a refused logged action at step " + t);
                        client.LogAction(episode, observations[t], new[] { (double)(t % 2) });
                    }
                    else
                    {
                        client.GetAction(episode, observations[t], action);
                    }
                    AssertClose(client.StateOf(episode), reference.After[t], "after step " + t);
                }
                client.EndEpisode(episode, observations[steps]);
                client.Flush(10);
                int start = 0;
                foreach (JObject record in server.Records())
                {
                    AssertClose(StateIn(record), reference.Before(start), "state_in of the record from step " + start);
                    var dists = (JArray)record["action_dist_inputs"];
                    var expectedLogged = new List<int>();
                    for (int i = 0; i < dists.Count; ++i)
                    {
                        AssertClose(dists[i].Select(v => (float)v).ToArray(), reference.Dist[start + i], "dist of step " + (start + i));
                        if ((start + i) % 3 == 1) expectedLogged.Add(i);
                    }
                    Assert.That(LoggedRuns.Steps(record[LoggedRuns.Field]), Is.EqualTo(expectedLogged), "the logged steps of the record from step " + start);
                    foreach (int i in expectedLogged) Assert.That((double)record["action_logp"][i], Is.EqualTo(0.0));
                    start += dists.Count;
                }
                Assert.That(start, Is.EqualTo(steps));
            }
        }

        // ---- the multi-agent client ---------------------------------------------------------------

        // Module "mem" (the LSTM) for a_*, and the group "pair" of the one member m_0 (2 values) with module
        // "gmem" (the LSTM too, its recurrent state `gmemState` when given). Without `group`, no groups: frames
        // of a_* agents take the steady-state path.
        static JObject MultiConfig(int perSample, JToken gmemState = null, bool group = true)
        {
            Func<JToken, JObject> module = state => new JObject
            {
                { "observation_space", Space.Box(new long[] { 2 }, -1, 1).ToJson() }, { "action_space", Space.Discrete(2).ToJson() },
                { "onnx_input_names", new JArray("onnx::Gemm_0") }, { "onnx_output_names", new JArray("action_dist_inputs") }, { "recurrent_state", state },
            };
            return new JObject
            {
                { "type", "SET_CONFIG" }, { "env_steps_per_sample", perSample }, { "force_on_policy", true }, { "protocol_version", "1.5" },
                { "heartbeat_interval_s", 0 },
                { "modules", new JObject { { "mem", module(Lstm2x3.ToJson()) }, { "gmem", module(gmemState ?? Lstm2x3.ToJson()) } } },
                { "groups", group ? JObject.Parse("{\"pair\": {\"members\": [\"m_0\"]}}") : new JObject() },
                { "policy_mapping", JArray.Parse("[{\"pattern\": \"a_*\", \"module\": \"mem\"}, {\"agent_id\": \"pair\", \"module\": \"gmem\"}]") },
            };
        }

        static JObject MultiWeights(long seq)
        {
            var models = new JObject();
            foreach (string id in new[] { "mem", "gmem" }) models[id] = new JObject { { "weights_seq_no", seq }, { "onnx_file", OnnxCodec.Encode(Lstm) } };
            return new JObject { { "type", "SET_STATE" }, { "models", models } };
        }

        static MemoryServer MultiServer(int perSample, Func<int, JObject> config = null)
        {
            return new MemoryServer
            {
                ConfigOf = config ?? (c => MultiConfig(perSample)), StateOf = c => MultiWeights(0),
                BatchAnswer = (c, n) => new JObject { { "type", "SET_STATE" }, { "models", new JObject() } },
            };
        }

        static IEnumerable<JObject> Entries(MemoryServer server, string actor)
        {
            return server.Records().Select(r => r["agents"][actor] as JObject).Where(e => e != null);
        }

        [Test]
        public void EachAgentAndGroupCarriesItsOwnStateInOneBatchedRun()
        {
            // a_0 and a_1 (one module: one run, their states stacked) and the group pair (its member m_0)
            // each follow their own reference; every entry carries the state its first observation was fed with.
            const int frames = 14;
            var salts = new Dictionary<string, int> { { "a_0", 0 }, { "a_1", 5 }, { "pair", 11 } };
            var references = salts.ToDictionary(s => s.Key, s => Reference.Of(Enumerable.Range(0, frames + 1).Select(t => ObsAt(t, s.Value)).ToList()));
            using (MemoryServer server = MultiServer(10))
            using (MultiAgentClient client = MultiAgentClient.Connect(Options(server)))
            {
                string episode = client.StartEpisode("e");
                var frame = new AgentFrame();
                for (int t = 0; t < frames; ++t)
                {
                    frame.Clear();
                    frame.Add("a_0", ObsAt(t, 0));
                    frame.Add("m_0", ObsAt(t, 11));
                    frame.Add("a_1", ObsAt(t, 5));
                    long runs = client.InferenceRuns;
                    client.GetActions(episode, frame);
                    Assert.That(client.InferenceRuns - runs, Is.EqualTo(2), "one run per module");
                    foreach (string actor in salts.Keys) AssertClose(client.StateOf(episode, actor), references[actor].After[t], actor + " after frame " + t);
                }
                var final = new AgentFrame();
                final.Add("a_0", ObsAt(frames, 0));
                final.Add("m_0", ObsAt(frames, 11));
                final.Add("a_1", ObsAt(frames, 5));
                client.EndAgents(episode, final);
                Assert.That(client.StateOf(episode, "a_0"), Is.Null, "dropped when the agent leaves");
                client.EndEpisode(episode);
                client.Flush(10);
                foreach (string actor in salts.Keys)
                {
                    int start = 0;
                    foreach (JObject entry in Entries(server, actor))
                    {
                        AssertClose(StateIn(entry), references[actor].Before(start), actor + ": state_in from step " + start);
                        var dists = (JArray)entry["action_dist_inputs"];
                        for (int i = 0; i < dists.Count; ++i) AssertClose(dists[i].Select(v => (float)v).ToArray(), references[actor].Dist[start + i], actor + ": dist of step " + (start + i));
                        start += dists.Count;
                    }
                    Assert.That(start, Is.EqualTo(frames), actor + "'s steps");
                }
            }
        }

        [Test]
        public void LoggedActorsOfAModuleWithMemoryAdvanceTheirStatesInTheFramesRun()
        {
            // Protocol 1.6: a_0 is logged every other frame, the group pair every third, a_1 never; each
            // follows its own reference, and the entries mark the logged steps.
            const int frames = 9;
            var salts = new Dictionary<string, int> { { "a_0", 0 }, { "a_1", 5 }, { "pair", 11 } };
            var references = salts.ToDictionary(s => s.Key, s => Reference.Of(Enumerable.Range(0, frames + 1).Select(t => ObsAt(t, s.Value)).ToList()));
            MemoryServer server = MultiServer(100);
            server.PongVersion = "1.6";
            using (server)
            using (MultiAgentClient client = MultiAgentClient.Connect(Options(server)))
            {
                string episode = client.StartEpisode("e");
                var frame = new AgentFrame();
                for (int t = 0; t < frames; ++t)
                {
                    frame.Clear();
                    frame.Add("a_0", ObsAt(t, 0));
                    frame.Add("m_0", ObsAt(t, 11));
                    frame.Add("a_1", ObsAt(t, 5));
                    if (t % 2 == 0) frame.LogAction("a_0", new[] { 1.0 });
                    if (t % 3 == 0) frame.LogAction("pair", new[] { 0.0 });
                    long runs = client.InferenceRuns;
                    client.GetActions(episode, frame);
                    Assert.That(client.InferenceRuns - runs, Is.EqualTo(2), "one run per module, logged actors included");
                    foreach (string actor in salts.Keys) AssertClose(client.StateOf(episode, actor), references[actor].After[t], actor + " after frame " + t);
                }
                client.EndEpisode(episode);
                client.Flush(10);
                var loggedEvery = new Dictionary<string, int> { { "a_0", 2 }, { "a_1", 0 }, { "pair", 3 } };
                foreach (string actor in salts.Keys)
                {
                    JObject entry = Entries(server, actor).Single();
                    AssertClose(StateIn(entry), new float[6], actor + ": state_in");
                    var dists = (JArray)entry["action_dist_inputs"];
                    for (int i = 0; i < frames; ++i) AssertClose(dists[i].Select(v => (float)v).ToArray(), references[actor].Dist[i], actor + ": dist of step " + i);
                    int every = loggedEvery[actor];
                    var expected = Enumerable.Range(0, frames).Where(t => every > 0 && t % every == 0).ToList();
                    Assert.That(LoggedRuns.Steps(entry[LoggedRuns.Field]), Is.EqualTo(expected), actor + "'s logged steps");
                }
            }
        }

        [Test]
        public void AnAgentJoiningLaterStartsFromZerosAndComputeActionsRemembersPerEpisode()
        {
            var reference = Reference.Of(Enumerable.Range(0, 5).Select(t => ObsAt(t, 6)).ToList());
            using (MemoryServer server = MultiServer(100))
            using (MultiAgentClient client = MultiAgentClient.Connect(Options(server)))
            {
                string episode = client.StartEpisode("e");
                var frame = new AgentFrame();
                for (int t = 0; t < 3; ++t)
                {
                    frame.Clear();
                    frame.Add("a_0", ObsAt(t, 3));
                    if (t == 2) frame.Add("a_9", ObsAt(0, 6));  // joins at frame 2
                    client.GetActions(episode, frame);
                }
                AssertClose(client.StateOf(episode, "a_9"), reference.After[0], "a_9 joined from zeros");
                // Greedy calls: an evaluation episode of its own, from zeros, one at a time.
                for (int t = 0; t < 3; ++t)
                {
                    frame.Clear();
                    frame.Add("a_0", ObsAt(t, 6));
                    client.ComputeActions(frame, "eval-1");
                }
                AssertClose(client.StateOf("eval-1", "a_0"), reference.After[2], "eval-1's a_0");
                frame.Clear();
                frame.Add("a_0", ObsAt(0, 6));
                client.ComputeActions(frame, "eval-2");
                AssertClose(client.StateOf("eval-2", "a_0"), reference.After[0], "eval-2 starts from zeros");
                Assert.That(client.StateOf("eval-1", "a_0"), Is.Null, "one evaluation episode at a time");
                // A running episode that is recorded is refused: no state advances.
                frame.Clear();
                frame.Add("a_9", ObsAt(1, 6));
                var refused = Assert.Throws<TetherException>(() => client.ComputeActions(frame, episode));
                Assert.That(refused.Code, Is.EqualTo(ErrorCode.InvalidArgument));
                AssertClose(client.StateOf(episode, "a_9"), reference.After[0], "the recorded episode's a_9, unchanged");
                // ... a running episode not recorded (training disabled): its states, advanced.
                string played = client.StartEpisode("played", trainingEnabled: false);
                frame.Clear();
                frame.Add("a_9", ObsAt(0, 6));
                client.GetActions(played, frame);
                frame.Clear();
                frame.Add("a_9", ObsAt(1, 6));
                client.ComputeActions(frame, played);
                AssertClose(client.StateOf(played, "a_9"), reference.After[1], "the running episode's a_9");
            }
        }

        [Test]
        public void AReconnectThatChangesAModulesRecurrentStateResetsOnlyItsActors()
        {
            // gmem's state tensors come in the other order on the second connection: the group's state starts
            // again from zeros and its steps not cut yet are let go; mem's agents keep theirs.
            JArray reversed = new JArray(Lstm2x3.ToJson().Reverse());
            var server = MultiServer(10, c => MultiConfig(10, c == 0 ? null : reversed));
            server.BatchAnswer = (c, n) => c == 0 ? null : new JObject { { "type", "SET_STATE" }, { "models", new JObject() } };
            var mem = Reference.Of(Enumerable.Range(0, 30).Select(t => ObsAt(t, 0)).ToList());
            using (server)
            using (MultiAgentClient client = MultiAgentClient.Connect(Options(server)))
            {
                server.Release.Reset();
                string episode = client.StartEpisode("e");
                var frame = new AgentFrame();
                Action<int> act = t =>
                {
                    frame.Clear();
                    frame.Add("a_0", ObsAt(t, 0));
                    frame.Add("m_0", ObsAt(t, 11));
                    client.GetActions(episode, frame);
                };
                for (int t = 0; t < 7; ++t) act(t);  // (frame 6 cuts batch 1, steps 0-4 of each, lost with the connection)
                server.Release.Set();
                LinkWaits.UntilConnected(client);
                client.Flush(10);
                AssertClose(client.StateOf(episode, "a_0"), mem.After[6], "mem's state is kept");
                AssertClose(client.StateOf(episode, "pair"), new float[6], "gmem's starts again");
                for (int t = 7; t < 20; ++t) act(t);
                client.EndEpisode(episode);
                client.Flush(10);
                List<JObject> pair = Entries(server, "pair").ToList();
                Assert.That(pair.Count, Is.GreaterThan(1));
                Assert.That((float)pair[1]["obs"][0][0], Is.EqualTo(ObsAt(7, 11)[0]), "the group's steps not cut were let go");
                AssertClose(StateIn(pair[1]), new float[6], "from zeros");
                List<JObject> a0 = Entries(server, "a_0").ToList();
                int start = ((JArray)a0[0]["actions"]).Count;
                AssertClose(StateIn(a0[1]), mem.Before(start), "a_0's continuing entry");
            }
        }

        [Test]
        public void AReconnectToAnotherServerRunResetsEveryActorsState()
        {
            // (1.8, §6.5) The same config, another server run: mem's agent and gmem's group both start again from
            // zeros, and neither's steps not cut yet are sent.
            var server = MultiServer(10);
            server.PongVersion = "1.8";
            server.RunIdOf = c => c == 0 ? "run-a" : "run-b";
            server.BatchAnswer = (c, n) => c == 0 ? null : new JObject { { "type", "SET_STATE" }, { "models", new JObject() } };
            using (server)
            using (MultiAgentClient client = MultiAgentClient.Connect(Options(server)))
            {
                server.Release.Reset();
                string episode = client.StartEpisode("e");
                var frame = new AgentFrame();
                Action<int> act = t =>
                {
                    frame.Clear();
                    frame.Add("a_0", ObsAt(t, 0));
                    frame.Add("m_0", ObsAt(t, 11));
                    client.GetActions(episode, frame);
                };
                for (int t = 0; t < 7; ++t) act(t);  // (frame 6 cuts batch 1, steps 0-4 of each, lost with the connection)
                server.Release.Set();
                LinkWaits.UntilConnected(client);
                client.Flush(10);
                AssertClose(client.StateOf(episode, "a_0"), new float[6], "mem's state starts again");
                AssertClose(client.StateOf(episode, "pair"), new float[6], "gmem's starts again");
                for (int t = 7; t < 20; ++t) act(t);
                client.EndEpisode(episode);
                client.Flush(10);
                Assert.That(client.OtherRunStepsDropped, Is.EqualTo(14), "batch 1's 10 steps and 2 of each actor not cut");
                foreach (string actor in new[] { "a_0", "pair" })
                {
                    List<JObject> entries = Entries(server, actor).ToList();
                    Assert.That(entries.Count, Is.GreaterThan(1), actor);
                    Assert.That((float)entries[1]["obs"][0][0], Is.EqualTo(actor == "a_0" ? ObsAt(7, 0)[0] : ObsAt(7, 11)[0]), actor + ": the steps not cut were let go");
                    AssertClose(StateIn(entries[1]), new float[6], actor + ": from zeros");
                }
            }
        }

        [TestCase(false)]
        [TestCase(true)]
        public void FramesWithMemoryAllocateNothingInSteadyState(bool group)
        {
            // Without groups the frames of one module's agents take the steady-state path; with a group, the general one.
            using (MemoryServer server = MultiServer(40, c => MultiConfig(40, null, group)))
            using (MultiAgentClient client = MultiAgentClient.Connect(Options(server)))
            {
                string[] ids = group ? new[] { "a_0", "m_0", "a_1" } : new[] { "a_0", "a_1", "a_2" };
                float[][] observations = ids.Select((id, i) => ObsAt(i, i)).ToArray();
                FrameAllocations run = FrameAllocations.Measure(client, ids, observations, 30, 12);
                Console.WriteLine("[ allocations ] " + run.Bytes + " bytes over " + run.Frames + " frames with memory (" + string.Join(", ", ids) + ") while " +
                                  run.Sent + " agent steps were sent");
                Assert.That(client.SteadyStateFramesActed, group ? (NUnit.Framework.Constraints.IResolveConstraint)Is.EqualTo(0) : Is.GreaterThan(run.Frames / 2));
                Assert.That(run.Sent, Is.GreaterThan(run.Frames * ids.Length / 2));
                Assert.That(run.Bytes, Is.EqualTo(0));
            }
        }

        [Test]
        public void SteadyStateFramesCarryTheStatesToo()
        {
            // The same agents frame after frame (no groups): the frames skip the general path, and still
            // feed and advance each agent's state, recording the state each entry starts from.
            const int frames = 16;
            var references = new[] { 0, 5 }.Select(salt => Reference.Of(Enumerable.Range(0, frames + 1).Select(t => ObsAt(t, salt)).ToList())).ToArray();
            using (MemoryServer server = MultiServer(6, c => MultiConfig(6, null, false)))
            using (MultiAgentClient client = MultiAgentClient.Connect(Options(server)))
            {
                string episode = client.StartEpisode("e");
                var frame = new AgentFrame();
                for (int t = 0; t < frames; ++t)
                {
                    frame.Clear();
                    frame.Add("a_0", ObsAt(t, 0));
                    frame.Add("a_1", ObsAt(t, 5));
                    client.GetActions(episode, frame);
                    AssertClose(client.StateOf(episode, "a_0"), references[0].After[t], "a_0 after frame " + t);
                    AssertClose(client.StateOf(episode, "a_1"), references[1].After[t], "a_1 after frame " + t);
                }
                Assert.That(client.SteadyStateFramesActed, Is.GreaterThan(frames / 2));
                frame.Clear();
                frame.Add("a_0", ObsAt(frames, 0));
                frame.Add("a_1", ObsAt(frames, 5));
                client.EndEpisode(episode, frame);
                client.Flush(10);
                for (int a = 0; a < 2; ++a)
                {
                    int start = 0;
                    foreach (JObject entry in Entries(server, "a_" + a))
                    {
                        AssertClose(StateIn(entry), references[a].Before(start), "a_" + a + ": state_in from step " + start);
                        start += ((JArray)entry["actions"]).Count;
                    }
                    Assert.That(start, Is.EqualTo(frames));
                }
            }
        }
    }
}
