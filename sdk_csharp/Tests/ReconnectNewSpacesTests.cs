// A reconnect whose SET_CONFIG describes a module with other spaces (or other
// value_obs_agents), or no longer describes it (§6.5): the module's steps
// recorded under the old config and not cut yet are dropped (they would cost
// their whole batch at the server), its model is let go when its spaces
// changed or it is gone (NOT_READY until a new one), the other modules keep
// their models and steps, and the episodes go on: an agent's next chunk starts
// from its next observation, with the same start_step. The single-agent client
// does the same for its spaces. The scenarios of the C++ SDK's
// sdk_cpp/tests/test_multi_agent_reconnect.cpp and of the Python SDK's
// tests/sdk/test_reconnect_new_spaces.py.
using System;
using System.Collections.Generic;
using System.Linq;
using Newtonsoft.Json.Linq;
using NUnit.Framework;
using Tether.Client;
using Tether.Protocol;

namespace Tether.Tests
{
    [TestFixture]
    public class ReconnectNewSpacesTests
    {
        static readonly string AnyModel = OnnxCodec.Encode(new byte[] { 1, 2, 3, 4 });

        static JObject ModuleJson(int width, JObject action = null)
        {
            return new JObject
            {
                { "observation_space", Space.Box(new long[] { width }, -10, 10).ToJson() }, { "action_space", action ?? Space.Discrete(2).ToJson() },
                { "onnx_input_names", new JArray("obs") }, { "onnx_output_names", new JArray("action_dist_inputs") }, { "trainable", true },
            };
        }

        // Modules m (agents a_*, 2 values) and n (agents b_*, nWidth values).
        static JObject Config(int nWidth)
        {
            return new JObject
            {
                { "type", "SET_CONFIG" }, { "env_steps_per_sample", 10 }, { "force_on_policy", true }, { "protocol_version", "1.3" },
                { "heartbeat_interval_s", 0 }, { "modules", new JObject { { "m", ModuleJson(2) }, { "n", ModuleJson(nWidth) } } },
                { "policy_mapping", JArray.Parse("[{\"pattern\": \"a_*\", \"module\": \"m\"}, {\"pattern\": \"b_*\", \"module\": \"n\"}]") },
            };
        }

        static JObject Models(IEnumerable<string> ids)
        {
            var models = new JObject();
            foreach (string id in ids) models[id] = new JObject { { "weights_seq_no", 0 }, { "onnx_file", AnyModel } };
            return new JObject { { "type", "SET_STATE" }, { "models", models } };
        }

        static JObject NoModel() { return Models(new string[0]); }

        // The first connection (`first`, every model) loses the first batch with it, unanswered; the
        // next ones (`second`) send no model, in their handshake or their answers unless `later`
        // (the answer to their n-th batch) says otherwise.
        static ReconnectingServer Reconnecting(JObject first, JObject second, Func<int, JObject> later = null)
        {
            var ids = ((JObject)first["modules"]).Properties().Select(p => p.Name).ToList();
            return new ReconnectingServer
            {
                ConfigOf = c => c == 0 ? first : second,
                StateOf = c => c == 0 ? Models(ids) : NoModel(),
                BatchAnswer = (c, n) => c == 0 ? null : (later != null ? later(n) : NoModel()),
            };
        }

        static MultiAgentClient Connect(ReconnectingServer server, bool waitForWeights = true)
        {
            return MultiAgentClient.Connect(new ClientOptions
            {
                Port = server.Port, Seed = 5, ReconnectTimeoutSeconds = 5, ResponseTimeoutSeconds = 5, UpdateTimeoutSeconds = 5,
                WaitForWeights = waitForWeights, WhenQueueFull = QueueFullPolicy.Wait, BackendFactory = () => new ConstantBackend(),
            });
        }

        // a_* observe (t, 0), b_* (t, 1, 0...) of `width` values.
        static void Fill(AgentFrame frame, int t, int width, params string[] agents)
        {
            frame.Clear();
            foreach (string agent in agents)
            {
                var obs = new float[agent.StartsWith("b_", StringComparison.Ordinal) ? width : 2];
                obs[0] = t;
                obs[1] = agent.StartsWith("a_", StringComparison.Ordinal) ? 0f : 1f;
                frame.Add(agent, obs);
            }
        }

        static Dictionary<string, ModuleSpec> Specs(JObject config)
        {
            var specs = new Dictionary<string, ModuleSpec>();
            foreach (JProperty m in ((JObject)config["modules"]).Properties()) specs[m.Name] = ModuleSpec.FromJson(m.Name, m.Value);
            return specs;
        }

        // Every record cut after the reconnect (batch 1 was cut before it) fits the second config.
        static void CheckFits(List<JObject> batches, JObject config)
        {
            var specs = Specs(config);
            int checkedRecords = 0;
            foreach (JObject batch in batches)
            {
                if ((long)batch["batch_seq"] == 1) continue;
                var records = (JArray)batch["episodes"];
                for (int i = 0; i < records.Count; ++i)
                {
                    EpisodeRecords.ValidateMultiAgentRecord(records[i], i, specs, true);  // throws what the server would refuse
                    ++checkedRecords;
                }
            }
            Assert.That(checkedRecords, Is.GreaterThan(0));
        }

        static IEnumerable<JObject> Entries(IEnumerable<JObject> batches, string agent)
        {
            foreach (JObject batch in batches)
            {
                foreach (JObject record in (JArray)batch["episodes"])
                {
                    var entry = record["agents"][agent] as JObject;
                    if (entry != null) yield return entry;
                }
            }
        }

        static int StepsOf(IEnumerable<JObject> batches, string agent)
        {
            return Entries(batches, agent).Sum(e => ((JArray)e["actions"]).Count);
        }


        [Test]
        public void ModulesKeepTheirModelsUntilTheNewConnectionSendsOthers()
        {
            using (ReconnectingServer server = Reconnecting(Config(2), Config(2)))
            using (MultiAgentClient client = Connect(server))
            {
                string episode = client.StartEpisode();
                var frame = new AgentFrame();
                for (int t = 0; t < 25; ++t)
                {
                    Fill(frame, t, 2, "a_0");
                    client.GetActions(episode, frame);
                    Assert.That(frame.DiscreteAction(0), Is.EqualTo(1));
                }
                Assert.That(client.Reconnects, Is.GreaterThanOrEqualTo(1));
                Assert.That(client.ModelsLoaded, Is.EqualTo(2), "the first connection's only");
                Assert.That(client.WeightsSeqNo("m"), Is.EqualTo(0));
                Fill(frame, 25, 2, "b_0");
                client.GetActions(episode, frame);  // n too
            }
        }

        [Test]
        public void AModuleWhoseSpacesChangedWaitsForANewModel()
        {
            using (ReconnectingServer server = Reconnecting(Config(2), Config(3)))  // n now observes 3 values
            using (MultiAgentClient client = Connect(server))
            {
                string episode = client.StartEpisode();
                var frame = new AgentFrame();
                for (int t = 0; t < 25; ++t)
                {
                    Fill(frame, t, 2, "a_0");
                    client.GetActions(episode, frame);  // m is unchanged: it acts on
                }
                Assert.That(client.Reconnects, Is.GreaterThanOrEqualTo(1));
                Assert.That(client.WeightsSeqNo("m"), Is.EqualTo(0));
                Assert.That(client.WeightsSeqNo("n"), Is.Null);
                Fill(frame, 25, 3, "b_0");
                var error = Assert.Throws<TetherException>(() => client.GetActions(episode, frame));
                Assert.That(error.Code, Is.EqualTo(ErrorCode.NotReady));
            }
        }

        [Test]
        public void StepsOfAModuleWhoseSpacesChangedAreDroppedAndItsAgentsGoOnWithTheNewModel()
        {
            // b_0's held-back step (recorded with 2 values) is dropped at the reconnect; a_0 loses
            // nothing; once n's new model comes, b_0 acts on 3 values in the same episode, start_step 0.
            JObject second = Config(3);
            using (ReconnectingServer server = Reconnecting(Config(2), second, n => n >= 3 ? Models(new[] { "n" }) : NoModel()))
            using (MultiAgentClient client = Connect(server))
            {
                string episode = client.StartEpisode("changed");
                var frame = new AgentFrame();
                int aSteps = 0, bSteps = 0, refusedAt = -1;
                for (int t = 0; t < 60; ++t)
                {
                    bool withB = refusedAt < 0 || client.WeightsSeqNo("n").HasValue;
                    if (withB) Fill(frame, t, refusedAt < 0 ? 2 : 3, "a_0", "b_0");
                    else Fill(frame, t, 3, "a_0");
                    try
                    {
                        client.GetActions(episode, frame);
                    }
                    catch (TetherException e)
                    {
                        // b_0's observation no longer fits module n (nothing of the frame is recorded).
                        Assert.That(refusedAt, Is.EqualTo(-1), e.Message);
                        Assert.That(e.Code, Is.EqualTo(ErrorCode.InvalidArgument), e.Message);
                        Assert.That(client.Reconnects, Is.GreaterThanOrEqualTo(1));
                        refusedAt = t;
                        continue;
                    }
                    ++aSteps;
                    if (withB) ++bSteps;
                    client.LogReturns(episode, "a_0", 1.0);
                }
                Assert.That(refusedAt, Is.EqualTo(6), "the frame that cut batch 1 met the new connection's config");
                Assert.That(client.WeightsSeqNo("n"), Is.EqualTo(0), "the new model of n came");
                Assert.That(client.Modules["n"].ObsDim, Is.EqualTo(3));
                client.EndEpisode(episode);
                client.Flush(10);
                Assert.That(server.Connections, Is.EqualTo(2));
                List<JObject> batches = server.Batches();
                CheckFits(batches, second);
                Assert.That(StepsOf(batches, "a_0"), Is.EqualTo(aSteps));
                // b_0 recorded 6 steps before the reconnect: 5 went with batch 1, the held-back one was dropped.
                Assert.That(StepsOf(batches.Take(1), "b_0"), Is.EqualTo(5));
                Assert.That(StepsOf(batches.Skip(1), "b_0"), Is.EqualTo(bSteps - 6));
                Assert.That(bSteps - 6, Is.GreaterThan(0));
                foreach (JObject batch in batches)
                {
                    foreach (JObject record in (JArray)batch["episodes"])
                    {
                        Assert.That((string)record["episode_id"], Is.EqualTo("changed"));
                        foreach (JProperty agent in ((JObject)record["agents"]).Properties())
                        {
                            Assert.That((long)agent.Value["start_step"], Is.EqualTo(0), agent.Name);
                        }
                    }
                }
                foreach (JObject entry in Entries(batches.Skip(1), "b_0"))
                {
                    foreach (JArray row in (JArray)entry["obs"])
                    {
                        Assert.That(row.Count, Is.EqualTo(3));
                        Assert.That((float)row[0], Is.GreaterThanOrEqualTo(7f), "b_0 starts again after the drop");
                    }
                }
            }
        }

        [Test]
        public void AFinishedAgentOfAModuleWhoseSpacesChangedIsDropped()
        {
            // b_0 leaves just after a cut; the reconnect that changes n's spaces comes while its
            // steps wait for the next cut (finished, not cut).
            JObject second = Config(3);
            using (ReconnectingServer server = Reconnecting(Config(2), second))
            using (MultiAgentClient client = Connect(server, waitForWeights: false))
            {
                server.Release.Reset();  // the first connection is lost once b_0 has left
                string episode = client.StartEpisode("fin");
                var frame = new AgentFrame();
                for (int t = 0; t < 7; ++t)
                {
                    Fill(frame, t, 2, "a_0", "b_0");
                    client.GetActions(episode, frame);
                }
                client.RetireAgent(episode, "b_0", new[] { 7f, 1f });  // 2 steps not cut
                server.Release.Set();
                LinkWaits.UntilConnected(client);
                for (int t = 7; t < 30; ++t)
                {
                    Fill(frame, t, 2, "a_0");
                    client.GetActions(episode, frame);
                }
                client.EndEpisode(episode);
                client.Flush(10);
                List<JObject> batches = server.Batches();
                CheckFits(batches, second);
                Assert.That(StepsOf(batches, "a_0"), Is.EqualTo(30));
                Assert.That(Entries(batches.Skip(1), "b_0"), Is.Empty);
            }
        }

        [Test]
        public void StepsOfAModuleTheServerNoLongerDescribesAreNotSent()
        {
            JObject second = Config(2);
            ((JObject)second["modules"]).Remove("n");
            second["policy_mapping"] = JArray.Parse("[{\"pattern\": \"a_*\", \"module\": \"m\"}]");
            using (ReconnectingServer server = Reconnecting(Config(2), second))
            using (MultiAgentClient client = Connect(server))
            {
                string episode = client.StartEpisode("gone");
                var frame = new AgentFrame();
                bool refused = false;
                int aSteps = 0;
                for (int t = 0; t < 30; ++t)
                {
                    if (refused) Fill(frame, t, 2, "a_0");
                    else Fill(frame, t, 2, "a_0", "b_0");
                    try
                    {
                        client.GetActions(episode, frame);
                    }
                    catch (TetherException e)
                    {
                        // Module n has no model any more (nothing of the frame is recorded).
                        Assert.That(refused, Is.False);
                        Assert.That(e.Code, Is.EqualTo(ErrorCode.NotReady), e.Message);
                        refused = true;
                        continue;
                    }
                    ++aSteps;
                }
                Assert.That(refused, Is.True);
                Assert.That(client.Modules.ContainsKey("n"), Is.False);
                Assert.That(client.WeightsSeqNo("n"), Is.Null);
                var final = new AgentFrame();
                final.Add("a_0", new[] { -1f, 0f });
                client.EndEpisode(episode, final);  // b_0 ends with its latest observation
                client.Flush(10);
                List<JObject> batches = server.Batches();
                CheckFits(batches, second);
                Assert.That(StepsOf(batches, "a_0"), Is.EqualTo(aSteps));
                Assert.That(Entries(batches.Skip(1), "b_0"), Is.Empty);
                // A new agent mapped to the module that is gone is refused.
                string next = client.StartEpisode();
                Fill(frame, 0, 2, "b_1");
                var unmapped = Assert.Throws<TetherException>(() => client.GetActions(next, frame));
                Assert.That(unmapped.Code, Is.EqualTo(ErrorCode.UnmappedAgent));
            }
        }

        // Plays 30 frames of `agents` (observations of 2 values) through the reconnect; once a frame is
        // refused (the module of the b_* changed), a_0 acts alone, and is not refused. Returns whether
        // a frame was.
        static bool PlayUntilRefused(MultiAgentClient client, string episode, params string[] agents)
        {
            var frame = new AgentFrame();
            bool refused = false;
            for (int t = 0; t < 30; ++t)
            {
                if (refused) Fill(frame, t, 2, "a_0");
                else Fill(frame, t, 2, agents);
                try
                {
                    client.GetActions(episode, frame);
                }
                catch (TetherException)
                {
                    Assert.That(refused, Is.False);
                    refused = true;
                }
            }
            return refused;
        }

        [Test]
        public void AnEpisodeEndsAfterAModulesSpacesChanged()
        {
            // b_0 stopped acting with only an observation of the old size: EndEpisode without final
            // observations still ends the episode (b_0 has nothing left to send).
            using (ReconnectingServer server = Reconnecting(Config(2), Config(3)))
            using (MultiAgentClient client = Connect(server))
            {
                string episode = client.StartEpisode("ends");
                Assert.That(PlayUntilRefused(client, episode, "a_0", "b_0"), Is.True);
                Assert.DoesNotThrow(() => client.EndEpisode(episode));
                client.Flush(10);
                CheckFits(server.Batches(), Config(3));
            }
        }

        [Test]
        public void AnEpisodeWithAGroupEndsAfterItsModulesSpacesChanged()
        {
            Func<int, JObject> groupConfig = memberWidth =>
            {
                JObject c = Config(2);
                c["modules"]["n"] = ModuleJson(2 * memberWidth, JObject.Parse("{\"type\": \"MultiDiscrete\", \"nvec\": [2, 2]}"));
                c["groups"] = JObject.Parse("{\"g\": {\"members\": [\"b_0\", \"b_1\"], \"reward\": \"sum\"}}");
                c["policy_mapping"] = JArray.Parse("[{\"pattern\": \"a_*\", \"module\": \"m\"}, {\"agent_id\": \"g\", \"module\": \"n\"}]");
                return c;
            };
            using (ReconnectingServer server = Reconnecting(groupConfig(2), groupConfig(3)))
            using (MultiAgentClient client = Connect(server))
            {
                string episode = client.StartEpisode("ends");
                Assert.That(PlayUntilRefused(client, episode, "a_0", "b_0", "b_1"), Is.True);
                client.EndEpisode(episode);
                client.Flush(10);
                List<JObject> batches = server.Batches();
                CheckFits(batches, groupConfig(3));
                Assert.That(Entries(batches.Skip(1), "g"), Is.Empty);
            }
        }

        // a_0 and a_1 (module m) act through a reconnect whose SET_CONFIG changes m's critic agents
        // from `first` to ["a_1"]: every critic row sent after it must be a_1's observation of that
        // frame, (t, 1): rows recorded for the old list are dropped, and an agent that becomes a
        // critic's agent is seen by it.
        [TestCase("a_0,a_1")]
        [TestCase("a_0")]
        public void CriticRowsAfterAReconnectThatChangesTheCriticsAgents(string firstCritic)
        {
            string[] first = firstCritic.Split(',');
            Func<string[], JObject> criticConfig = critic =>
            {
                JObject c = Config(2);
                c["modules"]["m"]["value_obs_agents"] = new JArray(critic);
                return c;
            };
            JObject second = criticConfig(new[] { "a_1" });
            using (ReconnectingServer server = Reconnecting(criticConfig(first), second))
            using (MultiAgentClient client = Connect(server))
            {
                string episode = client.StartEpisode("critic");
                var frame = new AgentFrame();
                for (int t = 0; t < 30; ++t)
                {
                    frame.Clear();
                    frame.Add("a_0", new[] { (float)t, 0f });
                    frame.Add("a_1", new[] { (float)t, 1f });
                    client.GetActions(episode, frame);
                }
                Assert.That(client.Reconnects, Is.GreaterThanOrEqualTo(1));
                Assert.That(client.WeightsSeqNo("m"), Is.EqualTo(0), "m's spaces did not change: it keeps its model");
                client.EndEpisode(episode);
                client.Flush(10);
                List<JObject> batches = server.Batches();
                CheckFits(batches, second);
                int checkedRows = 0;
                foreach (string agent in new[] { "a_0", "a_1" })
                {
                    foreach (JObject entry in Entries(batches.Skip(1), agent))
                    {
                        var obs = (JArray)entry["obs"];
                        var valueObs = (JArray)entry["value_obs"];
                        Assert.That(valueObs.Count, Is.EqualTo(obs.Count));
                        for (int k = 0; k < obs.Count; ++k)
                        {
                            Assert.That(JToken.DeepEquals(valueObs[k], new JArray(obs[k][0], 1.0)), Is.True,
                                        agent + " row " + k + ": " + valueObs[k].ToString(Newtonsoft.Json.Formatting.None));
                            ++checkedRows;
                        }
                    }
                }
                Assert.That(checkedRows, Is.GreaterThan(0));
            }
        }

        // ---- the single-agent client ----------------------------------------------------------

        static JObject SingleConfig(int width)
        {
            return new JObject
            {
                { "type", "SET_CONFIG" }, { "env_steps_per_sample", 10 }, { "force_on_policy", true }, { "protocol_version", "1.3" },
                { "heartbeat_interval_s", 0 }, { "observation_space", Space.Box(new long[] { width }, -10, 10).ToJson() },
                { "action_space", Space.Discrete(2).ToJson() }, { "onnx_input_names", new JArray("obs") },
                { "onnx_output_names", new JArray("action_dist_inputs") },
            };
        }

        static float[] Full(int width, float value)
        {
            var obs = new float[width];
            for (int j = 0; j < width; ++j) obs[j] = value;
            return obs;
        }

        [Test]
        public void SingleAgentStepsRecordedWithOtherSpacesAreDroppedAndTheEpisodeGoesOn()
        {
            // The second connection's server observes 4 values, not 3: the steps not cut yet (an open
            // episode's, and all of an episode that ended meanwhile) are dropped, the old model is let
            // go (its handshake brings the new one), an observation of the old size is refused
            // recording nothing, and the open episode's next chunk holds 4-value rows.
            JObject second = SingleConfig(4);
            var server = new ReconnectingServer
            {
                ConfigOf = c => c == 0 ? SingleConfig(3) : second,
                StateOf = c => new JObject { { "type", "SET_STATE" }, { "weights_seq_no", 0 }, { "onnx_file", AnyModel } },
                BatchAnswer = (c, n) => c == 0 ? null : new JObject { { "type", "SET_STATE" }, { "weights_seq_no", 0 } },
            };
            using (server)
            using (TetherClient client = TetherClient.Connect(new ClientOptions
            {
                Port = server.Port, Seed = 5, ReconnectTimeoutSeconds = 5, ResponseTimeoutSeconds = 5, UpdateTimeoutSeconds = 5,
                WaitForWeights = false, BackendFactory = () => new ConstantBackend(),
            }))
            {
                server.Release.Reset();  // the first connection is lost once b has ended
                var action = new double[1];
                string a = client.StartEpisode("a");
                for (int t = 0; t < 12; ++t)  // the 11th cuts batch 1 (steps 0-9), lost with the connection
                {
                    client.GetAction(a, Full(3, t), action);
                    client.LogReturns(a, 1.0);
                }
                string b = client.StartEpisode("b");
                for (int t = 0; t < 3; ++t) client.GetAction(b, Full(3, t), action);
                client.EndEpisode(b, Full(3, 0));  // ended, its 3 steps not cut
                server.Release.Set();
                LinkWaits.UntilConnected(client);
                var error = Assert.Throws<TetherException>(() => client.GetAction(a, Full(3, 12), action));
                Assert.That(error.Code, Is.EqualTo(ErrorCode.InvalidArgument));
                Assert.That(client.ObservationSpace.FlatDim, Is.EqualTo(4));
                Assert.That(client.WeightsSeqNo, Is.EqualTo(0));
                for (int t = 12; t < 30; ++t)
                {
                    client.GetAction(a, Full(4, t), action);
                    Assert.That(action[0], Is.EqualTo(1));
                    client.LogReturns(a, 1.0);
                }
                Assert.That(client.EndEpisode(a, Full(4, -1)), Is.EqualTo(30.0));
                client.Flush(10);
                List<JObject> batches = server.Batches();
                var firstRecords = (JArray)batches[0]["episodes"];
                Assert.That(firstRecords.Count, Is.EqualTo(1));
                Assert.That((string)firstRecords[0]["episode_id"], Is.EqualTo("a"));
                Assert.That(((JArray)firstRecords[0]["actions"]).Count, Is.EqualTo(10));
                Space obsSpace = Space.FromJson(second["observation_space"]), actSpace = Space.FromJson(second["action_space"]);
                int later = 0;
                float firstObs = -1;
                bool terminated = false;
                foreach (JObject batch in batches.Skip(1))
                {
                    EpisodeRecords.ValidateEpisodes(batch, obsSpace, actSpace, true);  // throws what the server would refuse
                    foreach (JObject record in (JArray)batch["episodes"])
                    {
                        Assert.That((string)record["episode_id"], Is.EqualTo("a"), "b's steps were dropped");
                        if (later == 0) firstObs = (float)record["obs"][0][0];
                        later += ((JArray)record["actions"]).Count;
                        terminated = (bool)record["is_terminated"];
                    }
                }
                Assert.That(later, Is.EqualTo(18), "steps 12-29; 10 and 11 (3 values) were dropped");
                Assert.That(firstObs, Is.EqualTo(12f));
                Assert.That(terminated, Is.True);
            }
        }

        [Test]
        public void SpacesAreTheSameWhenKindShapeAndBoundsAre()
        {
            Assert.That(MultiAgentClient.SameSpace(Space.Box(new long[] { 3 }, -1, 1), Space.Box(new long[] { 3 }, -1, 1)), Is.True);
            Assert.That(MultiAgentClient.SameSpace(Space.Box(new long[] { 3 }, -1, 1), Space.Box(new long[] { 4 }, -1, 1)), Is.False);
            Assert.That(MultiAgentClient.SameSpace(Space.Box(new long[] { 3 }, -1, 1), Space.Box(new long[] { 3 }, -2, 1)), Is.False);
            Assert.That(MultiAgentClient.SameSpace(Space.Discrete(2), Space.Discrete(2)), Is.True);
            Assert.That(MultiAgentClient.SameSpace(Space.Discrete(2), Space.Discrete(3)), Is.False);
            Assert.That(MultiAgentClient.SameSpace(Space.Discrete(2), Space.Box(new long[] { 1 }, 0, 1)), Is.False);
            // A byte box (§8.1) is another space than a float box of the same bounds: rows kept as floats
            // could not be sent as its bytes.
            Space bytes = Space.FromJson(JObject.Parse("{\"type\": \"Box\", \"shape\": [3], \"dtype\": \"uint8\", \"low\": 0, \"high\": 255}"));
            Assert.That(MultiAgentClient.SameSpace(Space.Box(new long[] { 3 }, 0, 255), bytes), Is.False);
            Assert.That(MultiAgentClient.SameSpace(bytes, bytes), Is.True);
        }
    }
}
