// Protocol 1.8: a reconnect that reaches another server run (PONG run_id, §6.5, §7.2). A server
// restarted without resuming counts weights versions from 0 again, so steps acted with the old run's
// weights claim versions that name other weights there, and their action_logp no model of the new run
// explains. Every SDK therefore drops them: the batch cut before the reconnect and not answered is not
// sent again, the steps not cut yet go at the reconnect, both are counted (OtherRunStepsDropped), and
// the episodes go on. The same run (a resumed server), or a server that names no run, keeps the rules
// of §6.5: the batch is sent again, nothing is dropped. The scenarios of the Python SDK's
// tests/sdk/test_another_run.py and the C++ SDK's sdk_cpp/tests/test_another_run.cpp.
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
    public class AnotherRunTests
    {
        // The first connection reaches run "run-a" and loses batch 1 with it, unanswered, once the test opens
        // DropGate; the next ones name `secondRun` (JSON text; null: their PONG has no run_id). The test lowers the server's
        // weights version to 0 before it opens the gate (as the Python scenario does for every second run).
        static ScriptedServer Restarting(ScriptedServer server, string secondRun)
        {
            server.PongVersion = "1.8";
            server.DropOnceSeq = 1;
            server.DropGate.Reset();
            server.RunIdOf = c => c == 0 ? "\"run-a\"" : secondRun;
            return server;
        }

        static ClientOptions Options(ScriptedServer server)
        {
            return new ClientOptions
            {
                Port = server.Port, Seed = 5, ReconnectTimeoutSeconds = 5, ResponseTimeoutSeconds = 5, UpdateTimeoutSeconds = 5,
                WaitForWeights = false, WhenQueueFull = QueueFullPolicy.Wait, BackendFactory = () => new ConstantBackend(),
            };
        }


        // Each batch once (a resend after the reconnect has the same batch_seq and records), in order.
        static List<JObject> UniqueBatches(ScriptedServer server)
        {
            var seen = new HashSet<long>();
            return server.Received("EPISODES_AND_GET_STATE").Where(b => seen.Add((long)b["batch_seq"])).ToList();
        }

        static float[] Obs(float value) { return new[] { value, value, value, value }; }

        // Batch 1 (steps 0-9) is lost with run-a's connection; steps 10 and 11 are recorded, not cut. Reaching
        // run-b, neither is sent (12 steps counted) and the episode's next chunk starts at step 12, claiming
        // run-b's version; reaching run-a again (resumed), or a server that names no run (no run_id, or one that
        // is not a non-empty string: absent, §7.2), batch 1 goes again and steps 10 and 11 are kept.
        [TestCase("\"run-b\"")]
        [TestCase("\"run-a\"")]
        [TestCase(null)]
        [TestCase("\"\"")]
        [TestCase("7")]
        public void SingleAgentStepsOfAnotherRunAreDroppedAndTheEpisodeGoesOn(string secondRun)
        {
            using (ScriptedServer server = Restarting(new ScriptedServer(10) { Seq = 3 }, secondRun))
            using (TetherClient client = TetherClient.Connect(Options(server)))
            {
                Assert.That(client.WeightsSeqNo, Is.EqualTo(3));
                var action = new double[1];
                string a = client.StartEpisode("a");
                for (int t = 0; t < 12; ++t)  // the 11th cuts batch 1 (steps 0-9), lost with the connection
                {
                    client.GetAction(a, Obs(t), action);
                    client.LogReturns(a, 1.0);
                }
                server.Seq = 0;  // the next connection's server counts from 0 again
                server.DropGate.Set();
                LinkWaits.UntilConnected(client);
                for (int t = 12; t < 30; ++t)
                {
                    client.GetAction(a, Obs(t), action);
                    client.LogReturns(a, 1.0);
                }
                Assert.That(client.EndEpisode(a, Obs(-1)), Is.EqualTo(30.0));
                client.Flush(10);  // no error: nothing was refused
                Assert.That(client.FatalError, Is.Null);
                Assert.That(server.Connections, Is.EqualTo(2));
                List<JObject> received = server.Received("EPISODES_AND_GET_STATE");
                List<JObject> batches = UniqueBatches(server);
                foreach (JObject batch in batches) server.Validate(batch);  // (throws what the server would refuse)
                Assert.That((long)received[0]["batch_seq"], Is.EqualTo(1), "batch 1 went to run-a");
                Assert.That((long)received[0]["weights_seq_no"], Is.EqualTo(3));
                if (secondRun == "\"run-b\"")
                {
                    Assert.That(client.OtherRunStepsDropped, Is.EqualTo(12));
                    Assert.That(client.link.OtherRunStepsDropped, Is.EqualTo(10), "batch 1's steps, dropped by the link");
                    Assert.That(received.Count(b => (long)b["batch_seq"] == 1), Is.EqualTo(1), "batch 1 was not sent to run-b");
                    var later = batches.Skip(1).SelectMany(b => (JArray)b["episodes"]).ToList();
                    Assert.That((float)later[0]["obs"][0][0], Is.EqualTo(12f), "steps 10 and 11 were dropped");
                    Assert.That(later.Sum(r => ((JArray)r["actions"]).Count), Is.EqualTo(18));
                    Assert.That(batches.Skip(1).Select(b => (long)b["weights_seq_no"]), Is.All.EqualTo(0), "run-b's version is claimed");
                    Assert.That((bool)later.Last()["is_terminated"], Is.True);
                    Assert.That(client.EnvStepsSent, Is.EqualTo(18), "the dropped batch is not counted as sent");
                }
                else
                {
                    Assert.That(client.OtherRunStepsDropped, Is.EqualTo(0));
                    Assert.That(client.link.OtherRunStepsDropped, Is.EqualTo(0));
                    Assert.That((long)received[1]["batch_seq"], Is.EqualTo(1), "batch 1 goes again to the same run");
                    Assert.That(batches.SelectMany(b => (JArray)b["episodes"]).Sum(r => ((JArray)r["actions"]).Count), Is.EqualTo(30));
                    Assert.That((float)batches[1]["episodes"][0]["obs"][0][0], Is.EqualTo(10f));
                    Assert.That(client.EnvStepsSent, Is.EqualTo(30));
                }
            }
        }

        // The batch cut at step 10 waits for its answer (WaitForWeights): its connection goes unanswered and the
        // link reaches run-b within that same call, so the game's thread takes in run-b's connection (dropping the
        // steps not cut yet) while the step that cut the batch is still being acted. The step's observation, lent
        // to the cut, went with the dropped steps: the step is acted once, and every step from 10 on reaches run-b
        // in order (the C++ SDK once took the observation back a second time and ended the game).
        [Test]
        public void ADropWhileTheCuttingStepWaitsLeavesThatStepWhole()
        {
            using (ScriptedServer server = Restarting(new ScriptedServer(10) { Seq = 3 }, "\"run-b\""))
            {
                ClientOptions options = Options(server);
                options.WaitForWeights = true;
                using (TetherClient client = TetherClient.Connect(options))
                {
                    server.Seq = 0;  // the next connection's server counts from 0 again
                    server.DropGate.Set();  // batch 1's connection goes at once
                    var action = new double[1];
                    string a = client.StartEpisode("a");
                    for (int t = 0; t < 30; ++t)  // the 11th cuts batch 1 and waits through the reconnect to run-b
                    {
                        client.GetAction(a, Obs(t), action);
                        client.LogReturns(a, 1.0);
                    }
                    Assert.That(client.EndEpisode(a, Obs(-1)), Is.EqualTo(30.0));
                    client.Flush(10);
                    Assert.That(client.FatalError, Is.Null);
                    Assert.That(client.OtherRunStepsDropped, Is.EqualTo(10), "batch 1 (the link's); nothing recorded was not cut then");
                    List<JObject> received = server.Received("EPISODES_AND_GET_STATE");
                    var firsts = received.Skip(1).SelectMany(b => (JArray)b["episodes"])
                        .SelectMany(r => Enumerable.Range(0, ((JArray)r["actions"]).Count).Select(i => (float)r["obs"][i][0])).ToList();
                    Assert.That(firsts, Is.EqualTo(Enumerable.Range(10, 20).Select(t => (float)t).ToList()));
                }
            }
        }

        // a_0 observes (t, 0, 0, 0), b_0 (t, 1, 0, 0).
        static void Fill(AgentFrame frame, int t, params string[] agents)
        {
            frame.Clear();
            foreach (string agent in agents) frame.Add(agent, new[] { (float)t, agent.StartsWith("a_", StringComparison.Ordinal) ? 0f : 1f, 0f, 0f });
        }

        static void Play(MultiAgentClient client, string episode, AgentFrame frame, int t)
        {
            Fill(frame, t, "a_0", "b_0");
            client.GetActions(episode, frame);
            client.LogReturns(episode, "a_0", 1.0);
            client.LogReturns(episode, "b_0", 1.0);
        }

        // Both modules' steps not cut yet go at the reconnect to run-b (a_0's and b_0's), and the batch lost with
        // run-a's connection is not sent; the episode goes on, each agent from its next frame.
        [Test]
        public void MultiAgentStepsOfAnotherRunAreDroppedInEveryModule()
        {
            ScriptedServer plain = ScriptedServer.Plain(10);
            plain.ModuleSeq = 4;
            using (ScriptedServer server = Restarting(plain, "\"run-b\""))
            using (MultiAgentClient client = MultiAgentClient.Connect(Options(server)))
            {
                Assert.That(client.WeightsSeqNo("solo"), Is.EqualTo(4));
                string episode = client.StartEpisode("e");
                var frame = new AgentFrame();
                for (int t = 0; t < 7; ++t) Play(client, episode, frame, t);  // 5 steps of each agent sendable at the 6th frame: batch 1, lost
                server.ModuleSeq = 0;  // the next connection's server counts from 0 again
                server.DropGate.Set();
                LinkWaits.UntilConnected(client);
                for (int t = 7; t < 30; ++t) Play(client, episode, frame, t);
                client.EndEpisode(episode);
                client.Flush(10);
                Assert.That(client.FatalError, Is.Null);
                Assert.That(server.Connections, Is.EqualTo(2));
                List<JObject> received = server.Received("EPISODES_AND_GET_STATE");
                List<JObject> batches = UniqueBatches(server);
                Assert.That(received.Count(b => (long)b["batch_seq"] == 1), Is.EqualTo(1), "batch 1 was not sent to run-b");
                Func<IEnumerable<JObject>, int> steps = list => list.SelectMany(b => (JArray)b["episodes"])
                                                                    .SelectMany(r => ((JObject)r["agents"]).Properties())
                                                                    .Sum(entry => ((JArray)entry.Value["actions"]).Count);
                int sentFirst = steps(batches.Take(1));
                Assert.That(sentFirst, Is.EqualTo(10));
                Assert.That(client.link.OtherRunStepsDropped, Is.EqualTo(sentFirst));
                Assert.That(client.OtherRunStepsDropped, Is.EqualTo(2 * 7), "batch 1's, and every step after it recorded before the reconnect");
                foreach (JObject record in batches.Skip(1).SelectMany(b => (JArray)b["episodes"]))
                {
                    foreach (JProperty agent in ((JObject)record["agents"]).Properties())
                    {
                        // (start_step still counts from the agent's first action, §10.7: the same in every chunk)
                        Assert.That((long)agent.Value["start_step"], Is.EqualTo(0), agent.Name);
                        foreach (JArray row in (JArray)agent.Value["obs"])
                        {
                            Assert.That((float)row[0], Is.GreaterThanOrEqualTo(7f), agent.Name + ": steps acted with run-a's models went");
                        }
                    }
                }
                foreach (JObject batch in batches.Skip(1))
                {
                    Assert.That(JToken.DeepEquals(batch["weights_seq_nos"], JObject.Parse("{\"solo\": 0, \"lifter\": 0}")), Is.True,
                                batch["weights_seq_nos"].ToString(Newtonsoft.Json.Formatting.None));
                }
                Assert.That(steps(batches.Skip(1)), Is.EqualTo(2 * 23));
                Assert.That(client.AgentStepsSent, Is.EqualTo(2 * 23), "the dropped batch is not counted as sent");
            }
        }

        // The pure comparison (the conformance vector run_ids.json runs its cases in ConformanceTests).
        [Test]
        public void RunsAreComparedOnlyWhenBothAreNamed()
        {
            Assert.That(ServerRuns.RunIdOf(JObject.Parse("{\"type\": \"PONG\", \"run_id\": \"abc\"}")), Is.EqualTo("abc"));
            Assert.That(ServerRuns.RunIdOf(JObject.Parse("{\"type\": \"PONG\"}")), Is.Null);
            Assert.That(ServerRuns.RunIdOf(JObject.Parse("{\"type\": \"PONG\", \"run_id\": \"\"}")), Is.Null);
            Assert.That(ServerRuns.RunIdOf(JObject.Parse("{\"type\": \"PONG\", \"run_id\": 7}")), Is.Null);
            Assert.That(ServerRuns.RunIdOf(JObject.Parse("{\"type\": \"PONG\", \"run_id\": null}")), Is.Null);
            Assert.That(ServerRuns.RunIdOf(null), Is.Null);
            Assert.That(ServerRuns.FromAnotherRun("a", "b"), Is.True);
            Assert.That(ServerRuns.FromAnotherRun("a", "a"), Is.False);
            Assert.That(ServerRuns.FromAnotherRun("run-A", "run-a"), Is.True);
            Assert.That(ServerRuns.FromAnotherRun(null, "b"), Is.False);
            Assert.That(ServerRuns.FromAnotherRun("a", null), Is.False);
            Assert.That(ServerRuns.FromAnotherRun(null, null), Is.False);
        }
    }
}
