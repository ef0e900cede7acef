// The multi-agent client against a scripted multi-agent server over real sockets.
using System;
using System.Collections.Generic;
using System.Linq;
using System.Threading;
using Newtonsoft.Json.Linq;
using NUnit.Framework;
using Tether.Client;
using Tether.Protocol;

namespace Tether.Tests
{
    [TestFixture]
    public class MultiAgentClientTests
    {
        static MultiAgentClient Connect(ScriptedServer server)
        {
            return MultiAgentClient.Connect(server.Options(3));
        }

        [Test]
        public void RulesNamingAModuleSetConfigDoesNotDescribeAreRefusedAtConnect()
        {
            // (as the Python and C++ clients refuse it: at the handshake, not at a later frame; of two unknown
            // modules, the first in sorted order is named, in every SDK)
            using (ScriptedServer server = ScriptedServer.Plain(1000))
            {
                server.Config["policy_mapping"] = JArray.Parse("[{\"pattern\": \"a_*\", \"module\": \"solo\"}, {\"pattern\": \"x_*\", \"choose_from\": [\"solo\", \"zebra\", \"ghost\"]}]");
                var refused = Assert.Catch<TetherException>(() => MultiAgentClient.Connect(server.Options(3)));
                Assert.That(refused.Code, Is.EqualTo(ErrorCode.InvalidField));
                Assert.That(refused.Message, Is.StringContaining("names module 'ghost'"));
            }
        }

        [Test]
        public void OfTwoUnknownModulesTheFirstInCodePointOrderIsNamed()
        {
            // U+FFFD before U+1F600, as Python's sorted and C++'s UTF-8 strings order them (UTF-16 code units
            // would put the surrogate pair 0xD83D 0xDE00 first).
            using (ScriptedServer server = ScriptedServer.Plain(1000))
            {
                server.Config["policy_mapping"] = new JArray(
                    new JObject { { "pattern", "x_*" }, { "module", "\U0001F600" } }, new JObject { { "pattern", "y_*" }, { "module", "\uFFFD" } });
                var refused = Assert.Catch<TetherException>(() => MultiAgentClient.Connect(server.Options(3)));
                Assert.That(refused.Message, Is.StringContaining("names module '\uFFFD'"));
            }
        }

        static float[] Obs(int t, int agent, int size)
        {
            var obs = new float[size];
            for (int j = 0; j < size; ++j) obs[j] = 0.01f * t + 0.1f * agent + j;
            return obs;
        }

        // Fills the frame with the scripted server's agents at step t: a_0, a_1 when `a1`, and the members
        // m_0, m_1 of the group "pair" when `pair`.
        static void FillFrame(AgentFrame frame, int t, bool a1, bool pair)
        {
            frame.Clear();
            frame.Add("a_0", Obs(t, 0, 4));
            if (a1) frame.Add("a_1", Obs(t, 1, 4));
            if (!pair) return;
            frame.Add("m_0", Obs(t, 2, 2));
            frame.Add("m_1", Obs(t, 3, 2));
        }

        // Runs `play` with a client of ScriptedServer.MultiAgent(perSample, rules), an episode it started
        // and a frame to fill.
        static void InEpisode(int perSample, bool rules, Action<ScriptedServer, MultiAgentClient, string, AgentFrame> play, string episodeId = null)
        {
            using (ScriptedServer server = ScriptedServer.MultiAgent(perSample, rules))
            using (MultiAgentClient client = Connect(server))
            {
                play(server, client, client.StartEpisode(episodeId), new AgentFrame());
            }
        }

        static Dictionary<string, ModuleSpec> Specs(ScriptedServer server)
        {
            var specs = new Dictionary<string, ModuleSpec>();
            foreach (JProperty m in ((JObject)server.Config["modules"]).Properties()) specs[m.Name] = ModuleSpec.FromJson(m.Name, m.Value);
            return specs;
        }

        // Every batch's records pass the server's checks; returns the entries of each actor in order, by
        // actor id, or with `byEpisode` by "episode/actor".
        static Dictionary<string, List<JObject>> CheckBatches(ScriptedServer server, out int envSteps, out int agentSteps, bool byEpisode = false)
        {
            var specs = Specs(server);
            var entries = new Dictionary<string, List<JObject>>();
            envSteps = agentSteps = 0;
            foreach (JObject batch in server.Received("EPISODES_AND_GET_STATE"))
            {
                int steps = 0;
                var records = (JArray)batch["episodes"];
                for (int i = 0; i < records.Count; ++i)
                {
                    steps += EpisodeRecords.ValidateMultiAgentRecord(records[i], i, specs, true);
                    foreach (JProperty agent in ((JObject)records[i]["agents"]).Properties())
                    {
                        string key = byEpisode ? (string)records[i]["episode_id"] + "/" + agent.Name : agent.Name;
                        if (!entries.ContainsKey(key)) entries[key] = new List<JObject>();
                        entries[key].Add((JObject)agent.Value);
                    }
                }
                Assert.That((int)batch["agent_steps"], Is.EqualTo(steps));
                Assert.That(batch["weights_seq_nos"], Is.InstanceOf<JObject>());
                envSteps += (int)batch["env_steps"];
                agentSteps += steps;
            }
            // An actor's entries join up: each one's first observation repeats the previous one's last.
            foreach (List<JObject> chunks in entries.Values)
            {
                for (int i = 0; i + 1 < chunks.Count; ++i)
                {
                    Assert.That(JToken.DeepEquals(chunks[i]["obs"].Last(), chunks[i + 1]["obs"].First()), Is.True);
                }
            }
            return entries;
        }

        [Test]
        public void TheEndOfTrainingStopsAMultiAgentClientQuietlyAndItsAgentsActOn()
        {
            InEpisode(8, true, (server, client, episode, frame) =>
            {
                for (int t = 0; t < 40; ++t)
                {
                    if (t == 10)
                    {
                        client.Flush(10);
                        Assert.That(client.TrainingDone, Is.Null);
                        server.Close(server.TrainingDone());
                        DateTime deadline = DateTime.UtcNow.AddSeconds(10);
                        while (client.TrainingDone == null && DateTime.UtcNow < deadline) Thread.Sleep(5);
                    }
                    FillFrame(frame, t, a1: true, pair: false);
                    client.GetActions(episode, frame);
                    Assert.That(frame.DiscreteAction(0), Is.EqualTo(0).Or.EqualTo(1));
                    client.LogReturns(episode, "a_0", 1.0);
                }
                int received = server.ReceivedCount;
                Assert.That(client.TrainingDone, Is.Not.Null);
                Assert.That(client.TrainingDone.Reason, Is.EqualTo("stop_at_return"));
                Assert.That(client.TrainingDone.AgentStepsTrained, Is.EqualTo(120000));
                Assert.That(client.EndEpisode(episode)["a_0"], Is.EqualTo(40.0));
                client.Flush(10);
                Thread.Sleep(300);
                Assert.That(server.Connections, Is.EqualTo(1));
                Assert.That(client.Reconnects, Is.EqualTo(0));
                Assert.That(server.ReceivedCount, Is.EqualTo(received));
                Assert.That(client.AgentStepsSent, Is.EqualTo(18), "each agent's 10th step waited for its next observation");
                Assert.That(client.BatchesUnsentAtEnd, Is.EqualTo(1));
                Assert.That(client.FatalError, Is.Null);
            });
        }

        [Test]
        public void AMapAgentsWaitingWhenTrainingEndsFailsWithTrainingDone()
        {
            InEpisode(8, false, (server, client, episode, frame) =>
            {
                server.DoneOnMapAgents = true;
                frame.Add("a_0", Obs(0, 0, 4));
                var error = Assert.Throws<TetherException>(() => client.GetActions(episode, frame));
                Assert.That(error.Code, Is.EqualTo(ErrorCode.TrainingDone));
                Assert.That(client.TrainingDone, Is.Not.Null);
                Assert.That(client.TrainingDone.Updates, Is.EqualTo(30));
                Assert.That(client.FatalError, Is.Null);
                client.Flush(10);
                Thread.Sleep(300);
                Assert.That(server.Connections, Is.EqualTo(1));
                Assert.That(server.Received("MAP_AGENTS").Count, Is.EqualTo(1));
            });
        }

        [Test]
        public void GroupsModulesAndCriticRowsMakeRecordsTheServerAccepts()
        {
            InEpisode(20, true, (server, client, episode, frame) =>
            {
                for (int t = 0; t < 30; ++t)
                {
                    FillFrame(frame, t, a1: t >= 5 && t < 20, pair: true);
                    client.GetActions(episode, frame);
                    for (int i = 0; i < frame.Count; ++i)
                    {
                        Assert.That(frame.ActionSize(i), Is.EqualTo(1), frame.AgentId(i));  // a member gets its part of [2, 2]
                        Assert.That(frame.DiscreteAction(i), Is.EqualTo(0).Or.EqualTo(1));
                        client.LogReturns(episode, frame.AgentId(i), 1.0);
                    }
                    if (t == 19)
                    {
                        var leaving = new AgentFrame();
                        leaving.Add("a_1", Obs(20, 1, 4));
                        client.EndAgents(episode, leaving);
                    }
                }
                Assert.That(client.ModuleOf(episode, "pair"), Is.EqualTo("lifter"));
                Assert.That(client.ModuleOf(episode, "a_0"), Is.EqualTo("solo"));
                Assert.That(client.InferenceRuns, Is.EqualTo(60));  // one per module per frame
                Dictionary<string, double> returns = client.EndEpisode(episode, null, truncated: true);
                Assert.That(returns["a_0"], Is.EqualTo(30));
                Assert.That(returns["a_1"], Is.EqualTo(15));
                Assert.That(returns["pair"], Is.EqualTo(30));  // "mean": each member's 1.0 counts half
                client.Flush(10);
                int envSteps, agentSteps;
                Dictionary<string, List<JObject>> entries = CheckBatches(server, out envSteps, out agentSteps);
                Assert.That(envSteps, Is.EqualTo(30));
                Assert.That(agentSteps, Is.EqualTo(30 + 15 + 30));
                Assert.That(client.AgentStepsSent, Is.EqualTo(75));
                Assert.That(entries.Keys, Is.EquivalentTo(new[] { "a_0", "a_1", "pair" }));
                // The group acts on its members' observations joined in member order.
                var first = (JArray)entries["pair"][0]["obs"][0];
                Assert.That(first.Select(v => (float)v), Is.EqualTo(Obs(0, 2, 2).Concat(Obs(0, 3, 2))));
                // a_1 joined at env step 5 and left terminated; the others ended truncated.
                Assert.That((long)entries["a_1"][0]["start_step"], Is.EqualTo(5));
                Assert.That((bool)entries["a_1"].Last()["is_terminated"], Is.True);
                Assert.That((bool)entries["a_0"].Last()["is_truncated"], Is.True);
                Assert.That((bool)entries["pair"].Last()["is_truncated"], Is.True);
                // The centralized critic's rows: a_0's and a_1's latest observations (zeros before a_1 came).
                var critic = (JArray)entries["a_0"][0]["value_obs"][0];
                Assert.That(critic.Count, Is.EqualTo(8));
                Assert.That(critic.Skip(4).Select(v => (float)v), Is.EqualTo(new float[4]));
            });
        }

        [Test]
        public void AGroupMemberEndingEndsTheGroupAndTheEpisodeCanEndWithEveryoneInTheFrame()
        {
            // What the Unity manager does when a member of a group ends: the group leaves whole
            // (terminated), then the scene's episode ends with every agent in the frame (the group's
            // members included, already gone: they are skipped), the others truncated.
            InEpisode(1000, true, (server, client, episode, frame) =>
            {
                for (int t = 0; t < 6; ++t)
                {
                    FillFrame(frame, t, a1: false, pair: true);
                    client.GetActions(episode, frame);
                }
                var leaving = new AgentFrame();
                leaving.Add("m_1", Obs(6, 3, 2));
                client.EndAgents(episode, leaving);
                FillFrame(frame, 6, a1: false, pair: true);
                client.EndEpisode(episode, frame, truncated: true);
                // The next episode has the group whole again.
                string next = client.StartEpisode();
                FillFrame(frame, 0, a1: false, pair: true);
                client.GetActions(next, frame);
                client.EndEpisode(next, frame, truncated: true);
                client.Flush(10);
                // Every record passes the server's checks; the last entries by (episode, actor).
                int envSteps, agentSteps;
                Dictionary<string, List<JObject>> entries = CheckBatches(server, out envSteps, out agentSteps, byEpisode: true);
                Assert.That(agentSteps, Is.EqualTo(6 + 6 + 1 + 1));
                Assert.That((bool)entries[episode + "/pair"].Last()["is_terminated"], Is.True, "the group left terminated when its member ended");
                Assert.That((bool)entries[episode + "/a_0"].Last()["is_truncated"], Is.True);
                Assert.That((bool)entries[episode + "/a_0"].Last()["is_terminated"], Is.False);
                Assert.That(((JArray)entries[next + "/pair"].Last()["actions"]).Count, Is.EqualTo(1), "the group acts whole in the next episode");
            });
        }

        [Test]
        public void AServerThatMapsWithAFunctionIsAskedOncePerFrameWithNewAgents()
        {
            InEpisode(1000, false, (server, client, episode, frame) =>
            {
                Assert.That(client.HasMappingRules, Is.False);
                for (int t = 0; t < 6; ++t)
                {
                    FillFrame(frame, t, a1: t >= 3, pair: false);
                    client.GetActions(episode, frame);
                }
                Assert.That(client.MapRequests, Is.EqualTo(2));
                var asked = server.Received("MAP_AGENTS");
                Assert.That(asked.Select(m => string.Join(",", m["agent_ids"].Select(a => (string)a))), Is.EqualTo(new[] { "a_0", "a_1" }));
                Assert.That(asked.All(m => (string)m["episode_id"] == "ep-1"), Is.True);
                Assert.That(client.ModuleOf(episode, "a_1"), Is.EqualTo("solo"));
                // An agent the server cannot map: its error, and nothing of that frame recorded.
                frame.Clear();
                frame.Add("a_0", Obs(6, 0, 4));
                frame.Add("x_9", Obs(6, 9, 4));
                var e = Assert.Throws<ServerErrorException>(() => client.GetActions(episode, frame));
                Assert.That(e.ServerCode, Is.EqualTo("UNMAPPED_AGENT"));
                Assert.That(e.Message, Is.StringContaining("x_9"));
                frame.Clear();
                frame.Add("a_0", Obs(6, 0, 4));
                client.GetActions(episode, frame);
                client.EndEpisode(episode);
                client.Flush(10);
                int envSteps, agentSteps;
                CheckBatches(server, out envSteps, out agentSteps);
                Assert.That(envSteps, Is.EqualTo(7));
                Assert.That(agentSteps, Is.EqualTo(7 + 3));
            }, episodeId: "ep-1");
        }

        [Test]
        public void AgentsMappedAheadAreAskedOnceAndActWithoutAsking()
        {
            InEpisode(1000, false, (server, client, episode, frame) =>
            {
                // One request for the agents not mapped yet, each once; a group member stands for its group.
                Assert.That(client.MapAgents(episode, new[] { "a_0", "a_1", "m_0", "a_0" }), Is.EqualTo(new[] { "solo", "solo", "lifter", "solo" }));
                Assert.That(client.MapRequests, Is.EqualTo(1));
                Assert.That(server.Received("MAP_AGENTS").Single()["agent_ids"].Select(a => (string)a), Is.EqualTo(new[] { "a_0", "a_1", "pair" }));
                for (int t = 0; t < 4; ++t)  // (the agents join in turn: none of their first frames asks)
                {
                    FillFrame(frame, t, a1: t >= 2, pair: t >= 1);
                    client.GetActions(episode, frame);
                }
                Assert.That(client.MapRequests, Is.EqualTo(1));
                // Only what the episode does not know yet is asked: an agent that acted, a new one.
                Assert.That(client.MapAgents(episode, new[] { "a_1", "a_5" }), Is.EqualTo(new[] { "solo", "solo" }));
                Assert.That(server.Received("MAP_AGENTS").Last()["agent_ids"].Select(a => (string)a), Is.EqualTo(new[] { "a_5" }));
                frame.Clear();
                frame.Add("a_5", Obs(4, 5, 4));
                client.GetActions(episode, frame);
                Assert.That(client.MapRequests, Is.EqualTo(2));
                var unknown = Assert.Throws<TetherException>(() => client.MapAgents("no-such-episode", new[] { "a_0" }));
                Assert.That(unknown.Code, Is.EqualTo(ErrorCode.InvalidArgument));
                // An answer that leaves an agent out, or names a module SET_CONFIG did not describe: refused, nothing kept.
                var leftOut = Assert.Throws<ProtocolException>(() => client.MapAgents(episode, new[] { "a_7", "left_out_1" }));
                Assert.That(leftOut.Code, Is.EqualTo(ErrorCode.InvalidField));
                Assert.That(leftOut.Message, Is.StringContaining("names no module for 'left_out_1'"));
                var ghost = Assert.Throws<ProtocolException>(() => client.MapAgents(episode, new[] { "a_7", "ghost_1" }));
                Assert.That(ghost.Code, Is.EqualTo(ErrorCode.UnknownModule));
                Assert.That(client.MapAgents(episode, new[] { "a_7" }), Is.EqualTo(new[] { "solo" }));
                Assert.That(server.Received("MAP_AGENTS").Last()["agent_ids"].Select(a => (string)a), Is.EqualTo(new[] { "a_7" }), "a_7 was not kept from a refused answer");
                client.EndEpisode(episode);
                client.Flush(10);
                int envSteps, agentSteps;
                CheckBatches(server, out envSteps, out agentSteps);
                Assert.That(envSteps, Is.EqualTo(5));
                Assert.That(agentSteps, Is.EqualTo(4 + 2 + 3 + 1));
            }, episodeId: "ep-1");
        }

        [Test]
        public void AnswersMappedAheadAreAskedAgainOnANewConnection()
        {
            InEpisode(1000, false, (server, client, episode, frame) =>
            {
                Assert.That(client.MapAgents(episode, new[] { "a_0", "a_1" }), Is.EqualTo(new[] { "solo", "solo" }));
                server.AgentsModule = "lifter";  // (the new connection's server maps otherwise)
                server.Close(new JObject { { "type", "ERROR" }, { "code", "CLIENT_TIMEOUT" }, { "message", "no message for 30 s" } });
                // Until the client took the new connection's SET_CONFIG in, the episode's answers stand.
                string[] modules = null;
                for (DateTime deadline = DateTime.UtcNow.AddSeconds(10); DateTime.UtcNow < deadline; System.Threading.Thread.Sleep(20))
                {
                    try { modules = client.MapAgents(episode, new[] { "a_0", "a_1" }); }
                    catch (ServerErrorException e) { Assert.That(e.Code, Is.EqualTo(ErrorCode.ClientTimeout)); }
                    if (modules != null && modules[0] == "lifter") break;
                }
                Assert.That(modules, Is.EqualTo(new[] { "lifter", "lifter" }));
                Assert.That(client.MapRequests, Is.EqualTo(2));
            });
        }

        [Test]
        public void AnAnswerNamingAModuleTheNewConnectionDroppedIsRefused()
        {
            // The client keeps a module an earlier connection described (Gone: its steps and states were
            // let go), but must not map anyone to it once the new SET_CONFIG no longer describes it.
            InEpisode(1000, false, (server, client, episode, frame) =>
            {
                Assert.That(client.MapAgents(episode, new[] { "a_0" }), Is.EqualTo(new[] { "solo" }));
                ((JObject)server.Config["modules"]).Remove("lifter");  // the next connection's SET_CONFIG
                server.ModuleFiles = new Dictionary<string, string> { { "solo", server.ModelFile } };
                server.AgentsModule = "lifter";  // ...and its answers, all the same
                server.Close(new JObject { { "type", "ERROR" }, { "code", "CLIENT_TIMEOUT" }, { "message", "no message for 30 s" } });
                ProtocolException refused = null;
                int next = 10;
                for (DateTime deadline = DateTime.UtcNow.AddSeconds(10); refused == null && DateTime.UtcNow < deadline; Thread.Sleep(20))
                {
                    // (a new agent each time: until the new SET_CONFIG is in, "lifter" is described and kept)
                    try { Assert.That(client.MapAgents(episode, new[] { "a_" + next++ }), Is.EqualTo(new[] { "lifter" })); }
                    catch (ProtocolException e) { refused = e; }
                    catch (ServerErrorException e) { Assert.That(e.Code, Is.EqualTo(ErrorCode.ClientTimeout)); }
                }
                Assert.That(refused, Is.Not.Null, "an answer naming the module the new connection dropped was taken");
                Assert.That(refused.Code, Is.EqualTo(ErrorCode.UnknownModule));
                Assert.That(refused.Message, Is.StringContaining("module 'lifter', which SET_CONFIG does not describe"));
            });
        }

        [Test]
        public void AMapAgentsLostWithItsConnectionIsSentAgainOnTheNext()
        {
            // §6.5: a request whose connection ends before its answer is sent again, unchanged, on the next
            // connection, as in the Python and C++ SDKs: the game's call gets the answer, not CONNECTION_FAILED.
            using (ScriptedServer server = ScriptedServer.MultiAgent(1000, rules: false))
            using (MultiAgentClient client = Connect(server))
            {
                server.DropMapAgents = 2;
                int connections = server.Connections;
                string episode = client.StartEpisode("e");
                Assert.That(client.MapAgents(episode, new[] { "a_0", "a_1" }), Is.EqualTo(new[] { "solo", "solo" }));
                List<JObject> asked = server.Received("MAP_AGENTS");
                Assert.That(asked.Count, Is.EqualTo(3), "asked on three connections");
                Assert.That(asked.All(m => JToken.DeepEquals(m, asked[0])), "unchanged: " + string.Join(" ", asked));
                Assert.That(server.Connections, Is.EqualTo(connections + 2), "a connection per lost MAP_AGENTS");
            }
        }

        [TestCase("BAD_HEADER", ErrorCode.BadHeader)]
        [TestCase("FRAME_TOO_LARGE", ErrorCode.FrameTooLarge)]
        public void AMapAgentsWhoseBytesTheServerRefusedFailsAndIsNotSentAgain(string code, ErrorCode expected)
        {
            // The server refused the request's bytes (a connection-level ERROR, §6.6): sent again they would be refused
            // again, so the call fails with that code at once, as in the Python and C++ SDKs.
            using (ScriptedServer server = ScriptedServer.MultiAgent(1000, rules: false))
            using (MultiAgentClient client = Connect(server))
            {
                server.MapAgentsClosingError = new JObject { { "type", "ERROR" }, { "code", code }, { "message", "refused for the test" } };
                string episode = client.StartEpisode("e");
                DateTime started = DateTime.UtcNow;
                var error = Assert.Catch<TetherException>(() => client.MapAgents(episode, new[] { "a_0" }));
                Assert.That(error.Code, Is.EqualTo(expected), error.Message);
                Assert.That(server.Received("MAP_AGENTS").Count, Is.EqualTo(1));
                Assert.That((DateTime.UtcNow - started).TotalSeconds, Is.LessThan(10), "not after the response timeout");
            }
        }

        [Test]
        public void EvaluationKeepsTheServersMappingForItsEpisodeId()
        {
            using (ScriptedServer server = ScriptedServer.MultiAgent(1000, rules: false))
            using (MultiAgentClient client = Connect(server))
            {
                var frame = new AgentFrame();
                for (int t = 0; t < 5; ++t)
                {
                    FillFrame(frame, t, a1: true, pair: false);
                    client.ComputeActions(frame);
                }
                Assert.That(client.MapRequests, Is.EqualTo(1));
                frame.Clear();
                frame.Add("a_0", Obs(5, 0, 4));
                frame.Add("a_2", Obs(5, 2, 4));
                client.ComputeActions(frame);
                Assert.That(client.MapRequests, Is.EqualTo(2));
                Assert.That(server.Received("MAP_AGENTS").Last()["agent_ids"].Select(a => (string)a), Is.EqualTo(new[] { "a_2" }));
                client.ComputeActions(frame, "eval-2");  // another evaluation episode: asked again
                Assert.That(client.MapRequests, Is.EqualTo(3));
                Assert.That((string)server.Received("MAP_AGENTS").Last()["episode_id"], Is.EqualTo("eval-2"));
            }
        }

        [Test]
        public void ModelsSwapMidRunAndALostConnectionLosesNoBatch()
        {
            InEpisode(10, true, (server, client, episode, frame) =>
            {
                Assert.That(client.ModelsLoaded, Is.EqualTo(2));
                for (int t = 0; t < 400; ++t)
                {
                    if (t == 100) server.ModuleSeq = 1;        // new models for both modules
                    if (t == 200) server.DropConnections();    // the connection is lost mid-run
                    if (t == 300) server.DropConnections();
                    FillFrame(frame, t, a1: true, pair: false);
                    client.GetActions(episode, frame);
                    client.LogReturns(episode, "a_0", 1.0);
                    Thread.Sleep(1);
                }
                client.EndEpisode(episode);
                client.Flush(10);
                Assert.That(client.Reconnects, Is.GreaterThanOrEqualTo(1));
                Assert.That(server.Received("PING").Count, Is.GreaterThanOrEqualTo(2));
                // Version 1 of both modules, and again after each reconnect (a new connection gets every model).
                Assert.That(client.ModelsLoaded, Is.GreaterThanOrEqualTo(2 + 2 * (1 + client.Reconnects)));
                // Exactly once: every batch arrived (a batch lost with the connection was sent again), none skipped.
                var batches = server.Received("EPISODES_AND_GET_STATE");
                var seqs = batches.Select(b => (long)b["batch_seq"]).Distinct().OrderBy(q => q).ToList();
                Assert.That(seqs, Is.EqualTo(Enumerable.Range(1, seqs.Count).Select(q => (long)q).ToList()));
                Assert.That(seqs.Count, Is.GreaterThanOrEqualTo(40));
                var firstOfEach = batches.GroupBy(b => (long)b["batch_seq"]).Select(g => g.First()).ToList();
                long steps = firstOfEach.Sum(b => (long)b["env_steps"]);
                Assert.That(steps, Is.EqualTo(400));  // every env step, once
                Assert.That((long)firstOfEach.Last()["weights_seq_nos"]["solo"], Is.EqualTo(1));
            }, episodeId: "ep-1");
        }

        static string RunsOf(JObject entry)
        {
            JToken runs = entry[VersionRuns.Field];
            return runs == null ? null : runs.ToString(Newtonsoft.Json.Formatting.None);
        }

        // Plays an episode of 7 frames of a_0 and "pair" (and a_1 from step 3 on, `withA1`) across new
        // models for both modules: step 3 acts with version 1, after a flush of the steps before.
        static void PlayAcrossAModelSwap(ScriptedServer server, MultiAgentClient client, string episode, AgentFrame frame, bool withA1)
        {
            for (int t = 0; t < 7; ++t)
            {
                if (t == 3)
                {
                    server.ModuleSeq = 1;
                    client.Flush(10);  // steps 0-1 of each actor (the last waits to be closed), answered with version 1
                    Assert.That(client.WeightsSeqNo("solo"), Is.EqualTo(1));
                    Assert.That(client.WeightsSeqNo("lifter"), Is.EqualTo(1));
                }
                FillFrame(frame, t, a1: withA1 && t >= 3, pair: true);
                client.GetActions(episode, frame);
            }
            client.EndEpisode(episode);
        }

        [Test]
        public void EntriesWhoseStepsStraddleAModelSwapCarryTheVersionOfEachStep()
        {
            InEpisode(1000, true, (server, client, episode, frame) =>
            {
                PlayAcrossAModelSwap(server, client, episode, frame, withA1: true);  // a_1 joins after the swap: one version
                client.Flush(10);
                int envSteps, agentSteps;
                Dictionary<string, List<JObject>> entries = CheckBatches(server, out envSteps, out agentSteps);
                Assert.That(server.Received("EPISODES_AND_GET_STATE").Count, Is.EqualTo(2));
                Assert.That(RunsOf(entries["a_0"][0]), Is.Null, "one version: the entry is as before");
                Assert.That(RunsOf(entries["pair"][0]), Is.Null);
                // Step 2 acted with version 0, steps 3-6 with version 1: a group's entry as an agent's.
                Assert.That(RunsOf(entries["a_0"][1]), Is.EqualTo("[[0,1],[1,4]]"));
                Assert.That(RunsOf(entries["pair"][1]), Is.EqualTo("[[0,1],[1,4]]"));
                Assert.That(RunsOf(entries["a_1"][0]), Is.Null);
                // The claims are still the oldest versions.
                JToken claims = server.Received("EPISODES_AND_GET_STATE")[1]["weights_seq_nos"];
                Assert.That((long)claims["solo"], Is.EqualTo(0));
                Assert.That((long)claims["lifter"], Is.EqualTo(0));
            });
        }

        [Test]
        public void EntriesResentOnANewConnectionCarryNoVersionsPerStep()
        {
            InEpisode(1000, true, (server, client, episode, frame) =>
            {
                PlayAcrossAModelSwap(server, client, episode, frame, withA1: false);
                server.DropOnceSeq = 2;  // batch 2 is lost with its connection: it goes again on the next one
                client.Flush(10);
                var batches = server.Received("EPISODES_AND_GET_STATE");
                Assert.That(batches.Select(b => (long)b["batch_seq"]), Is.EqualTo(new long[] { 1, 2, 2 }));
                Assert.That(client.Reconnects, Is.EqualTo(1));
                Func<JObject, string, string> runs = (batch, actor) => RunsOf((JObject)batch["episodes"][0]["agents"][actor]);
                // Sent on the connection the versions were learned on: each step's version.
                Assert.That(runs(batches[1], "a_0"), Is.EqualTo("[[0,1],[1,4]]"));
                Assert.That(runs(batches[1], "pair"), Is.EqualTo("[[0,1],[1,4]]"));
                // Resent on a new connection (the same server, not restarted): the claims only, unchanged.
                Assert.That(runs(batches[2], "a_0"), Is.Null);
                Assert.That(runs(batches[2], "pair"), Is.Null);
                Assert.That(JToken.DeepEquals(batches[1]["weights_seq_nos"], batches[2]["weights_seq_nos"]), Is.True);
                Assert.That((long)batches[2]["weights_seq_nos"]["solo"], Is.EqualTo(0));
                Assert.That(client.AgentStepsSent, Is.EqualTo(14));
            });
        }

        static void PlayFrames(MultiAgentClient client, string episode, AgentFrame frame, int from, int frames)
        {
            for (int t = from; t < from + frames; ++t)
            {
                FillFrame(frame, t, a1: false, pair: true);
                client.GetActions(episode, frame);  // two actors: a_0 and the group "pair"
                for (int i = 0; i < frame.Count; ++i) client.LogReturns(episode, frame.AgentId(i), 1.0);
            }
        }

        [Test]
        public void AQuarterOfTheEpisodesAreRecordedWithAllTheirAgents()
        {
            const int perSample = 40, frames = 3, training = 400;
            using (ScriptedServer server = ScriptedServer.MultiAgent(perSample, rules: true))
            {
                server.RecordShare = "0.25";
                using (MultiAgentClient client = Connect(server))
                {
                    var frame = new AgentFrame();
                    for (int e = 0; e < training; ++e)
                    {
                        string episode = client.StartEpisode();
                        PlayFrames(client, episode, frame, 0, frames);
                        Dictionary<string, double> returns = client.EndEpisode(episode);
                        Assert.That(returns["a_0"], Is.EqualTo(frames), "a held-back episode's returns count alike");
                        Assert.That(returns["pair"], Is.EqualTo(frames));
                    }
                    client.Flush(10);
                    var batches = server.Received("EPISODES_AND_GET_STATE");
                    int envSteps, agentSteps;
                    CheckBatches(server, out envSteps, out agentSteps, byEpisode: true);
                    var records = batches.SelectMany(b => b["episodes"]).ToList();
                    var recorded = records.GroupBy(r => (string)r["episode_id"]).ToList();
                    Console.WriteLine("[ record_share ] " + recorded.Count + " of " + training + " multi-agent episodes recorded, " + client.EpisodesHeldBack + " held back, " + batches.Count + " batches");
                    Assert.That(recorded.Count, Is.InRange(60, 140));
                    Assert.That(recorded.Count + client.EpisodesHeldBack, Is.EqualTo(training));
                    // One draw per episode: a recorded episode has every actor's every step.
                    foreach (var episode in recorded)
                    {
                        foreach (string actor in new[] { "a_0", "pair" })
                        {
                            Assert.That(episode.Sum(r => r["agents"][actor] == null ? 0 : ((JArray)r["agents"][actor]["actions"]).Count), Is.EqualTo(frames));
                        }
                    }
                    Assert.That(agentSteps, Is.EqualTo(recorded.Count * frames * 2));
                    Assert.That(agentSteps + client.EpisodesHeldBack * frames * 2, Is.EqualTo(training * frames * 2), "recorded + held-back agent steps = agent steps played");
                    Assert.That(envSteps, Is.EqualTo(recorded.Count * frames));
                    // A batch every perSample agent steps played in training episodes, recorded or held back.
                    int played = training * frames * 2;
                    Assert.That(batches.Count, Is.InRange(played / perSample - 1, played / perSample + 1));
                }
            }
        }

        [Test]
        public void AtRecordShareOneNoRandomNumberIsDrawnForAnEpisode()
        {
            // As for the single-agent client: at share 1 a training episode acts as one that does not train.
            Func<string, bool, string> actions = (share, train) =>
            {
                using (ScriptedServer server = ScriptedServer.MultiAgent(1000, rules: true))
                {
                    server.RecordShare = share;
                    using (MultiAgentClient client = Connect(server))
                    {
                        string episode = client.StartEpisode(null, train);
                        var frame = new AgentFrame();
                        var taken = new List<long>();
                        for (int t = 0; t < 32; ++t)
                        {
                            frame.Clear();
                            frame.Add("a_0", new[] { (float)Math.Sin(t), (float)Math.Cos(0.7 * t), 0.3f * (t % 5), -0.1f });
                            frame.Add("m_0", new[] { (float)Math.Cos(t), 0.2f });
                            frame.Add("m_1", new[] { 0.1f * (t % 3), (float)Math.Sin(1.3 * t) });
                            client.GetActions(episode, frame);
                            for (int i = 0; i < frame.Count; ++i) taken.Add(frame.DiscreteAction(i));
                        }
                        return string.Join(",", taken.Select(a => a.ToString()).ToArray());
                    }
                }
            };
            string reference = actions(null, false);
            Assert.That(actions(null, true), Is.EqualTo(reference));
            Assert.That(actions("1", true), Is.EqualTo(reference));
            Assert.That(actions("0.9999999", true), Is.Not.EqualTo(reference), "(a share below 1 draws one number: this test can tell)");
        }

        [Test]
        public void WithEveryEpisodeHeldBackEmptyMultiAgentBatchesStillGo()
        {
            using (ScriptedServer server = ScriptedServer.MultiAgent(10, rules: true))
            {
                server.RecordShare = "1e-9";
                using (MultiAgentClient client = Connect(server))
                {
                    var frame = new AgentFrame();
                    string first = client.StartEpisode();
                    PlayFrames(client, first, frame, 0, 12);  // 2 agent steps a frame: batches cut at frames 6 and 11
                    client.Flush(10);  // (a cut, if of nothing: the held-back steps count from it)
                    var batches = server.Received("EPISODES_AND_GET_STATE");
                    Assert.That(batches.Count, Is.EqualTo(2));
                    Assert.That(client.EpisodesHeldBack, Is.EqualTo(1));
                    foreach (JObject b in batches)
                    {
                        Assert.That(((JArray)b["episodes"]).Count, Is.EqualTo(0));
                        Assert.That((int)b["agent_steps"], Is.EqualTo(0));
                        Assert.That((string)b["client_session"], Is.EqualTo(client.ClientSession));
                        Assert.That((long)b["weights_seq_nos"]["solo"], Is.EqualTo(0));
                        Assert.That((long)b["weights_seq_nos"]["lifter"], Is.EqualTo(0));
                    }
                    // An answer without record_share: new episodes are recorded again.
                    server.RecordShare = null;
                    PlayFrames(client, first, frame, 12, 6);  // batch 3, cut at frame 18 (10 agent steps after the flush)
                    client.Flush(10);
                    Assert.That(client.RecordShare, Is.EqualTo(1.0));
                    client.EndEpisode(first);
                    string second = client.StartEpisode();
                    PlayFrames(client, second, frame, 0, 2);
                    client.EndEpisode(second);
                    client.Flush(10);
                    batches = server.Received("EPISODES_AND_GET_STATE");
                    Assert.That(batches.Count, Is.EqualTo(4));
                    Assert.That(((JArray)batches[2]["episodes"]).Count, Is.EqualTo(0));
                    Assert.That(batches[3]["episodes"].Select(r => (string)r["episode_id"]), Is.EqualTo(new[] { second }));
                    Assert.That(client.EpisodesHeldBack, Is.EqualTo(1));
                    Assert.That(client.AgentStepsSent, Is.EqualTo(4));
                    Assert.That(client.EnvStepsSent, Is.EqualTo(2));
                }
            }
        }

        [Test]
        public void MultiAgentBatchesFollowStepsPerBatchInAgentStepsPlayed()
        {
            // Two actors (a_0 and the group "pair"), everything held back, strict on-policy: steps_per_batch
            // 4 until the third answer, then an invalid value (kept), then none (env_steps_per_sample, 10):
            // a batch every 2 frames, then every 5.
            using (ScriptedServer server = ScriptedServer.MultiAgent(10, rules: true))
            {
                server.RecordShare = "1e-9";
                foreach (string every in new[] { "4", "4", "4", "false" }) server.StepsPerBatch.Enqueue(every);
                using (MultiAgentClient client = MultiAgentClient.Connect(new ClientOptions { Port = server.Port, Seed = 6, WaitForWeights = true }))
                {
                    Assert.That(client.StepsPerBatch, Is.EqualTo(4), "from the handshake's SET_STATE");
                    Assert.That(client.EnvStepsPerSample, Is.EqualTo(10));
                    var frame = new AgentFrame();
                    string episode = client.StartEpisode();
                    var sendsAt = new List<int>();
                    var after = new List<int>();
                    for (int t = 0; t < 30; ++t)
                    {
                        int before = server.Received("EPISODES_AND_GET_STATE").Count;
                        PlayFrames(client, episode, frame, t, 1);
                        if (server.Received("EPISODES_AND_GET_STATE").Count > before)
                        {
                            sendsAt.Add(t);
                            after.Add(client.StepsPerBatch);
                        }
                    }
                    var gaps = sendsAt.Select((at, i) => at - (i == 0 ? 0 : sendsAt[i - 1])).ToList();
                    Assert.That(gaps, Is.EqualTo(new[] { 2, 2, 2, 2, 5, 5, 5, 5 }), string.Join(", ", gaps));
                    Assert.That(after, Is.EqualTo(new[] { 4, 4, 4, 10, 10, 10, 10, 10 }));
                    Assert.That(client.StepsPerBatch, Is.EqualTo(10));
                    Assert.That(client.EpisodesHeldBack, Is.EqualTo(1));
                    foreach (JObject b in server.Received("EPISODES_AND_GET_STATE")) Assert.That(((JArray)b["episodes"]).Count, Is.EqualTo(0));
                }
            }
        }

        [Test]
        public void AgentStepsTheServerRefusedAsStaleAreCountedAndOtherValuesIgnored()
        {
            InEpisode(1000, true, (server, client, episode, frame) =>
            {
                var answers = new JToken[] { 7, "3", true, 2.5, 5, 0 };
                var expected = new long[] { 7, 7, 7, 7, 12, 12 };
                foreach (JToken answer in answers) server.RefusedStale.Enqueue(answer);
                for (int i = 0; i < answers.Length; ++i)
                {
                    for (int t = 2 * i; t < 2 * i + 2; ++t)
                    {
                        FillFrame(frame, t, a1: false, pair: false);
                        client.GetActions(episode, frame);
                    }
                    client.Flush(10);  // one batch, one answer
                    Assert.That(client.StepsRefusedStale, Is.EqualTo(expected[i]), "after an answer with " + answers[i].ToString(Newtonsoft.Json.Formatting.None));
                }
                Assert.That(server.Received("EPISODES_AND_GET_STATE").Count, Is.EqualTo(answers.Length));
            });
        }

        [Test]
        public void BadFramesAreClearErrorsAndRecordNothing()
        {
            InEpisode(1000, true, (server, client, episode, frame) =>
            {
                Action<int> good = t =>
                {
                    FillFrame(frame, t, a1: false, pair: true);
                    client.GetActions(episode, frame);
                };
                good(0);
                frame.Clear();
                frame.Add("a_0", Obs(1, 0, 4));
                frame.Add("m_0", Obs(1, 2, 2));
                var e = Assert.Throws<TetherException>(() => client.GetActions(episode, frame));
                Assert.That(e.Code, Is.EqualTo(ErrorCode.InvalidArgument));
                Assert.That(e.Message, Is.StringContaining("group 'pair'").And.StringContaining("'m_1'"));
                frame.Clear();
                frame.Add("a_0", new[] { 0f, float.NaN, 0f, 0f });
                e = Assert.Throws<TetherException>(() => client.GetActions(episode, frame));
                Assert.That(e.Code, Is.EqualTo(ErrorCode.NonFiniteValue));
                Assert.That(e.Message, Is.StringContaining("'a_0'").And.StringContaining("observation[1]"));
                frame.Clear();
                frame.Add("a_0", new float[3]);
                e = Assert.Throws<TetherException>(() => client.GetActions(episode, frame));
                Assert.That(e.Message, Is.StringContaining("3 values, module 'solo' needs 4"));
                frame.Clear();
                frame.Add("a_0", Obs(1, 0, 4));
                frame.Add("a_0", Obs(1, 0, 4));
                e = Assert.Throws<TetherException>(() => client.GetActions(episode, frame));
                Assert.That(e.Message, Is.StringContaining("twice"));
                frame.Clear();
                frame.Add("zz", Obs(1, 0, 4));
                e = Assert.Throws<TetherException>(() => client.GetActions(episode, frame));
                Assert.That(e.Code, Is.EqualTo(ErrorCode.UnmappedAgent));
                good(1);
                client.RetireAgent(episode, "a_0", Obs(2, 0, 4));
                frame.Clear();
                frame.Add("a_0", Obs(2, 0, 4));
                e = Assert.Throws<TetherException>(() => client.GetActions(episode, frame));
                Assert.That(e.Message, Is.StringContaining("already left"));
                e = Assert.Throws<TetherException>(() => client.GetActions("nope", frame));
                Assert.That(e.Message, Is.StringContaining("no running episode 'nope'"));
                client.EndEpisode(episode);
                client.Flush(10);
                int envSteps, agentSteps;
                CheckBatches(server, out envSteps, out agentSteps);
                Assert.That(envSteps, Is.EqualTo(2));  // only the two good frames
                Assert.That(agentSteps, Is.EqualTo(4));
            });
        }

        // A backend that fails its n-th run (counted from 1), as a runtime error would: INFERENCE_FAILED.
        sealed class FailingBackend : Tether.Inference.IInferenceBackend
        {
            readonly Tether.Inference.OnnxRuntimeBackend inner = new Tether.Inference.OnnxRuntimeBackend();
            readonly int failAt;
            int runs;
            public FailingBackend(int failAt) { this.failAt = failAt; }
            public void Load(byte[] model, string inputName, string outputName) { inner.Load(model, inputName, outputName); }
            public bool Loaded { get { return inner.Loaded; } }
            public int ObsDim { get { return inner.ObsDim; } }
            public int OutDim { get { return inner.OutDim; } }
            public void Run(float[] obs, int batch, int obsDim, float[] output, int outDim)
            {
                if (++runs == failAt) throw new TetherException(ErrorCode.InferenceFailed, "the test's runtime failed");
                inner.Run(obs, batch, obsDim, output, outDim);
            }
            public void Dispose() { inner.Dispose(); }
        }

        // Plays the same game on a client: agents joining, leaving, reordered, a second module, bad
        // frames, a failed inference, a model swap, rewards, an evaluation and a held-out episode.
        // Returns what the game saw (actions, errors, returns), one line per event.
        static List<string> PlayScript(ScriptedServer server, bool steadyStateFrames, out long steadyFrames)
        {
            var seen = new List<string>();
            using (MultiAgentClient client = MultiAgentClient.Connect(new ClientOptions
            {
                Port = server.Port, Seed = 9, ReconnectTimeoutSeconds = 5, WhenQueueFull = QueueFullPolicy.Wait, WaitForWeights = true,
                BackendFactory = () => new FailingBackend(37),  // (each module's first model fails its 37th run)
            }))
            {
                client.SteadyStateFrames = steadyStateFrames;
                var frame = new AgentFrame();
                var agents = new List<string> { "a_0", "a_1", "a_2", "a_3", "a_4", "a_5" };
                foreach (string episode in new[] { "e1", "e2", "e3" })
                {
                    client.StartEpisode(episode, trainingEnabled: episode != "e2");
                    for (int t = 0; t < 60; ++t)
                    {
                        if (episode == "e1" && t == 10) agents.Add("a_6");                  // joins
                        if (episode == "e1" && t == 20)                                      // leaves
                        {
                            client.RetireAgent(episode, "a_2", Obs(t, 2, 4), truncated: t % 2 == 0);
                            agents.Remove("a_2");
                        }
                        if (episode == "e1" && t == 25) agents.Reverse();                    // reordered
                        if (episode == "e1" && t == 30) server.ModuleSeq = 1;                // new models with the next batch
                        if (episode == "e3" && t == 5) agents.Add("b_0");                    // a second module
                        if (episode == "e3" && t == 40) agents.Remove("b_0");                // (ends with the episode)
                        frame.Clear();
                        for (int i = 0; i < agents.Count; ++i) frame.Add(agents[i], Obs(t, int.Parse(agents[i].Substring(2)), 4));
                        if (t == 15) frame.Add(agents[1], Obs(t, 1, 4));                     // twice
                        if (t == 16) frame.Add("a_9", new float[3]);                         // a wrong size
                        if (t == 17)                                                          // not finite
                        {
                            frame.Clear();
                            for (int i = 0; i < agents.Count; ++i) frame.Add(agents[i], i == 3 ? new[] { 0f, float.PositiveInfinity, 0f, 0f } : Obs(t, i, 4));
                        }
                        if (t == 45) frame.Clear();                                          // nobody acts
                        try
                        {
                            client.GetActions(episode, frame);
                            var line = new System.Text.StringBuilder(episode + " " + t + ":");
                            for (int i = 0; i < frame.Count; ++i)
                            {
                                line.Append(' ').Append(frame.AgentId(i)).Append('=');
                                for (int j = 0; j < frame.ActionSize(i); ++j) line.Append(frame.Action(i, j).ToString("R")).Append(j + 1 < frame.ActionSize(i) ? "," : "");
                            }
                            seen.Add(line.ToString());
                        }
                        catch (TetherException e)
                        {
                            seen.Add(episode + " " + t + ": " + e.Code + " " + e.Message);
                        }
                        for (int i = 0; i < agents.Count; ++i)
                        {
                            if ((t + i) % 3 != 0) client.LogReturns(episode, agents[i], 0.5 * i - t % 2);
                        }
                    }
                    var returns = client.EndEpisode(episode, null, truncated: episode == "e3");
                    seen.Add(episode + " returns: " + string.Join(" ", returns.OrderBy(r => r.Key).Select(r => r.Key + "=" + r.Value.ToString("R"))));
                }
                frame.Clear();
                client.ComputeActions(frame);
                seen.Add("eval of nobody: " + frame.Count);                frame.Clear();
                frame.Add("a_0", Obs(0, 0, 4));
                frame.Add("b_1", Obs(0, 1, 4));
                client.ComputeActions(frame);
                seen.Add("eval: " + frame.Action(0) + " " + frame.Action(1, 0) + "," + frame.Action(1, 1));
                client.Flush(10);
                seen.Add("sent: " + client.AgentStepsSent + " " + client.EnvStepsSent + " runs " + client.InferenceRuns + " models " + client.ModelsLoaded);
                steadyFrames = client.SteadyStateFramesActed;
            }
            foreach (JObject batch in server.Received("EPISODES_AND_GET_STATE"))
            {
                seen.Add("batch " + batch["env_steps"] + " " + batch["agent_steps"] + " " + batch["weights_seq_nos"].ToString(Newtonsoft.Json.Formatting.None) + " " +
                         batch["episodes"].ToString(Newtonsoft.Json.Formatting.None));
            }
            return seen;
        }

        [Test]
        public void SteadyStateFramesActAndRecordAsEveryOtherFrame()
        {
            // The same game through the steady-state path and through the general one only: the same
            // actions, errors, returns and records, byte for byte.
            List<string> fast, general;
            long steady, none;
            using (ScriptedServer server = ScriptedServer.Plain(50)) fast = PlayScript(server, true, out steady);
            using (ScriptedServer server = ScriptedServer.Plain(50)) general = PlayScript(server, false, out none);
            Assert.That(steady, Is.GreaterThan(100));
            Assert.That(none, Is.EqualTo(0));
            Assert.That(fast.Count, Is.EqualTo(general.Count));
            for (int i = 0; i < fast.Count; ++i) Assert.That(fast[i], Is.EqualTo(general[i]), "line " + i);
            // ...and what it played is what was meant: errors where the frames were bad, batches the server takes.
            Assert.That(fast.Any(l => l.StartsWith("e1 15: InvalidArgument") && l.Contains("twice")), Is.True);
            Assert.That(fast.Any(l => l.StartsWith("e1 16: InvalidArgument")), Is.True);
            Assert.That(fast.Any(l => l.StartsWith("e1 17: NonFiniteValue")), Is.True);
            Assert.That(fast.Count(l => l.Contains("InferenceFailed")), Is.GreaterThanOrEqualTo(1));
            Assert.That(fast.Any(l => l.StartsWith("batch") && l.Contains(VersionRuns.Field)), Is.True, "steps straddling the model swap carry their versions");
            using (ScriptedServer server = ScriptedServer.Plain(50))
            {
                PlayScript(server, true, out steady);
                // (the entries of each actor of each episode join up)
                int envSteps, agentSteps;
                Dictionary<string, List<JObject>> chunks = CheckBatches(server, out envSteps, out agentSteps, byEpisode: true);
                Assert.That(agentSteps, Is.GreaterThan(500));
                Assert.That(chunks.Keys.Any(k => k.StartsWith("e2/")), Is.False, "a held-out episode sends nothing");
            }
        }

        // Episodes of the agents a_0..a_4 (module "solo", Discrete(2) from -3), then of b_0..b_4 ("lifter",
        // Discrete(4) from 1): the actions the game saw and the batches the server got, one line each.
        static List<string> PlayShiftedDiscretes(bool steadyStateFrames, out long steadyFrames)
        {
            var seen = new List<string>();
            using (ScriptedServer server = ScriptedServer.Plain(40))
            {
                server.Config["modules"]["solo"]["action_space"] = Space.Discrete(2, -3).ToJson();
                server.Config["modules"]["lifter"]["action_space"] = Space.Discrete(4, 1).ToJson();
                using (MultiAgentClient client = MultiAgentClient.Connect(server.Options(11)))
                {
                    client.SteadyStateFrames = steadyStateFrames;
                    var frame = new AgentFrame();
                    foreach (string prefix in new[] { "a_", "b_" })
                    {
                        string episode = client.StartEpisode(prefix + "episode");
                        for (int t = 0; t < 50; ++t)
                        {
                            frame.Clear();
                            for (int i = 0; i < 5; ++i) frame.Add(prefix + i, Obs(t, 3 * i, 4));
                            client.GetActions(episode, frame);
                            var line = new System.Text.StringBuilder(prefix + t + ":");
                            for (int i = 0; i < frame.Count; ++i) line.Append(' ').Append(frame.Action(i).ToString("R"));
                            seen.Add(line.ToString());
                            for (int i = 0; i < 5; ++i) client.LogReturns(episode, prefix + i, 0.25 * i);
                        }
                        client.EndEpisode(episode, null);
                    }
                    client.Flush(10);
                    steadyFrames = client.SteadyStateFramesActed;
                }
                foreach (JObject batch in server.Received("EPISODES_AND_GET_STATE"))
                {
                    seen.Add("batch " + batch["episodes"].ToString(Newtonsoft.Json.Formatting.None));
                }
            }
            return seen;
        }

        [Test]
        public void SteadyStateFramesOfShiftedAndWiderDiscretesRecordAsEveryOtherFrame()
        {
            // A steady-state frame leaves a Discrete draw's logp for the sending thread, which takes it from
            // the recorded action less the space's start, over n categories: the same records, byte for byte.
            long steady, none;
            List<string> fast = PlayShiftedDiscretes(true, out steady);
            List<string> general = PlayShiftedDiscretes(false, out none);
            Assert.That(steady, Is.GreaterThan(80));
            Assert.That(none, Is.EqualTo(0));
            Assert.That(fast.Count(l => l.StartsWith("batch")), Is.GreaterThanOrEqualTo(4));
            Assert.That(fast.Count, Is.EqualTo(general.Count));
            for (int i = 0; i < fast.Count; ++i) Assert.That(fast[i], Is.EqualTo(general[i]), "line " + i);
            // (the draws cover the spaces, from their starts)
            var actions = fast.Where(l => !l.StartsWith("batch")).SelectMany(l => l.Split(' ').Skip(1)).Select(double.Parse).ToList();
            Assert.That(actions.Distinct().OrderBy(a => a), Is.EqualTo(new double[] { -3, -2, 1, 2, 3, 4 }));
            Assert.That(fast.Any(l => l.StartsWith("batch") && l.Contains("NaN")), Is.False);
        }

        [TestCase(null, false)]
        [TestCase("0.5", false)]
        [TestCase(null, true)]
        [TestCase("0.5", true)]
        public void AFrameOf256AgentsAllocatesNothingInSteadyState(string share, bool plain)
        {
            // (plain: without groups or critics, the frames take the steady-state path)
            const int agents = 256;
            using (ScriptedServer server = plain ? ScriptedServer.Plain(10 * agents) : ScriptedServer.MultiAgent(10 * agents, rules: true))
            using (MultiAgentClient client = Connect(server))
            {
                // (with a record_share the handshake's SET_STATE has gone: the first episode is drawn
                // at share 1, the later ones at 0.5, some held back and some batches empty)
                server.RecordShare = share;
                var ids = Enumerable.Range(0, agents).Select(i => "a_" + i).ToArray();
                var observations = Enumerable.Range(0, agents).Select(i => Obs(0, i, 4)).ToArray();
                // After 6 episodes' warm-up: arrays, reused batches and actors have their size.
                FrameAllocations run = FrameAllocations.Measure(client, ids, observations, 14, 6);
                Console.WriteLine("[ allocations ] " + run.Bytes + " bytes over " + run.Frames + " frames of " + agents + " agents while " + run.Sent + " agent steps were sent");
                Assert.That(run.Sent, Is.GreaterThan(share == null ? run.Frames * agents / 2 : 0));
                Assert.That(client.EpisodesHeldBack, share == null ? (NUnit.Framework.Constraints.IResolveConstraint)Is.EqualTo(0) : Is.GreaterThan(0));
                Assert.That(run.Bytes, Is.EqualTo(0));
            }
        }

        // ---- a group of a masked module (§9.6, §11.6) ---------------------------------------------

        // The model of module "pm" below, without a runtime: per row (action_mask 0..3, board 4..5) the
        // logits of MultiDiscrete([2, 2]) prefer each entry's first choice (0, 0), and the mask is applied
        // inside the "graph" as an exported model does (a forbidden logit is -1e9).
        sealed class PreferFirstMaskedBackend : Tether.Inference.ILeafInferenceBackend
        {
            public void Load(byte[] model, string inputName, string outputName) { Loaded = true; }
            public void Load(byte[] model, Space observationSpace, string outputName) { Loaded = true; }
            public bool Loaded { get; private set; }
            public int ObsDim { get { return 0; } }
            public int OutDim { get { return 0; } }
            public void Run(float[] obs, int batch, int obsDim, float[] output, int outDim)
            {
                for (int r = 0; r < batch; ++r)
                {
                    for (int j = 0; j < outDim; ++j) output[r * outDim + j] = obs[r * obsDim + j] == 1 ? (j % 2 == 0 ? 5f : 0f) : ActionMask.MaskedLogit;
                }
            }
            public void Dispose() { }
        }

        // A group of a masked module: its mask is read from the group's joined observation (its members'
        // in member order, as the module's batch gets it) exactly as an agent's is from its row, and checked
        // before sampling and against a logged joint action; a final observation's mask may allow nothing.
        // Nothing of a refused frame is recorded (as the C++ CompositeClient.AGroupFollowsItsModulesMask).
        [Test]
        public void AGroupFollowsItsModulesMask()
        {
            // Module "pm": Dict(action_mask: Box[4], board: Box[2]) acting in MultiDiscrete([2, 2]); the pair's
            // members observe 3 values each, joined in leaf order: action_mask (4), then board (2).
            var server = new ScriptedServer(1000) { PongVersion = "1.6" };
            JObject config = server.Config;
            config.Remove("observation_space");
            config.Remove("action_space");
            config["modules"] = new JObject
            {
                { "pm", JObject.Parse(@"{""observation_space"": {""type"": ""Dict"", ""spaces"": {
                                            ""board"": {""type"": ""Box"", ""shape"": [2], ""low"": 0, ""high"": 1},
                                            ""action_mask"": {""type"": ""Box"", ""shape"": [4], ""low"": 0, ""high"": 1}}},
                                         ""action_space"": {""type"": ""MultiDiscrete"", ""nvec"": [2, 2]},
                                         ""action_mask"": ""action_mask"", ""onnx_input_names"": [""action_mask"", ""board""],
                                         ""onnx_output_names"": [""action_dist_inputs""], ""trainable"": true}") },
            };
            config["groups"] = JObject.Parse("{\"pair\": {\"members\": [\"p_0\", \"p_1\"]}}");
            config["policy_mapping"] = JArray.Parse("[{\"agent_id\": \"pair\", \"module\": \"pm\"}]");
            server.ModuleFiles = new Dictionary<string, string> { { "pm", server.ModelFile } };  // (any bytes: the backend has no runtime)
            using (server)
            using (MultiAgentClient client = MultiAgentClient.Connect(new ClientOptions
            {
                Port = server.Port, Seed = 3, ReconnectTimeoutSeconds = 5, WhenQueueFull = QueueFullPolicy.Wait, WaitForWeights = true,
                BackendFactory = () => new PreferFirstMaskedBackend(),
            }))
            {
                Assert.That(client.Modules["pm"].ActionMask.Leaf, Is.EqualTo("action_mask"));
                string episode = client.StartEpisode("e");
                var frame = new AgentFrame();
                Action<float[]> fill = mask =>
                {
                    frame.Clear();
                    frame.Add("p_0", new[] { mask[0], mask[1], mask[2] });  // (the mask spans both members)
                    frame.Add("p_1", new[] { mask[3], 0f, 1f });
                };
                Func<float[], double[], TetherException> play = (mask, logged) =>
                {
                    fill(mask);
                    if (logged != null) frame.LogAction("pair", logged);
                    try
                    {
                        client.GetActions(episode, frame);
                        return null;
                    }
                    catch (TetherException e)
                    {
                        return e;
                    }
                };
                Assert.That(play(new float[] { 1, 0, 1, 0 }, null), Is.Null);  // (the model prefers (0, 0))
                Assert.That(frame.Action(0), Is.EqualTo(0));
                Assert.That(frame.Action(1), Is.EqualTo(0));

                TetherException refused = play(new float[] { 1, 2, 1, 0 }, null);
                Assert.That(refused, Is.Not.Null);
                Assert.That(refused.Code, Is.EqualTo(ErrorCode.InvalidActionMask), refused.Message);
                Assert.That(refused.Message, Is.StringContaining("group 'pair'"));
                Assert.That(frame.ActionSize(0), Is.EqualTo(0), "nothing acted");
                refused = play(new float[] { 0, 0, 1, 1 }, null);  // the first entry allows nothing
                Assert.That(refused, Is.Not.Null);
                Assert.That(refused.Code, Is.EqualTo(ErrorCode.ActionMaskEmpty), refused.Message);
                Assert.That(refused.Message, Is.StringContaining("group 'pair'"));
                Assert.That(Assert.Throws<TetherException>(() => client.ComputeActions(frame, "eval")).Code, Is.EqualTo(ErrorCode.ActionMaskEmpty));

                refused = play(new float[] { 1, 0, 1, 1 }, new double[] { 1, 0 });  // forbidden: entry 0 allows only 0
                Assert.That(refused, Is.Not.Null);
                Assert.That(refused.Code, Is.EqualTo(ErrorCode.ActionMasked), refused.Message);
                Assert.That(refused.Message, Is.StringContaining("'pair'"));
                refused = play(new float[] { 1, 0, 1, 1 }, new double[] { 0, 1 });
                Assert.That(refused, Is.Null, refused == null ? "" : refused.Message);
                Assert.That(frame.Action(0), Is.EqualTo(0), "each member its part of the logged joint action");
                Assert.That(frame.Action(1), Is.EqualTo(1));

                fill(new float[] { 0, 0, 0, 0 });  // a final observation: no action follows it
                client.EndEpisode(episode, frame);
                client.Flush(10);
                var specs = Specs(server);
                int records = 0;
                foreach (JObject batch in server.Received("EPISODES").Concat(server.Received("EPISODES_AND_GET_STATE")))
                {
                    byte[] attachment = server.AttachmentOf(batch);
                    foreach (JToken record in (JArray)batch["episodes"])
                    {
                        ++records;
                        Assert.That(JToken.DeepEquals(record["agents"]["pair"]["actions"], JArray.Parse("[[0, 0], [0, 1]]")), Is.True,
                                    "the refused frames: nothing; got " + record["agents"]["pair"]["actions"]);
                        // (as a server checks it: the masks 0/1, each allowing something, the actions allowed, §10.6 14b-14d)
                        Assert.That(EpisodeRecords.ValidateMultiAgentRecord(record, 0, specs, true, attachment), Is.EqualTo(2));
                    }
                }
                Assert.That(records, Is.EqualTo(1));
            }
        }
    }
}
