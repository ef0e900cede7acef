// The single-agent client against a scripted server over real sockets.
using System;
using System.Collections.Generic;
using System.Threading;
using System.Linq;
using Newtonsoft.Json.Linq;
using NUnit.Framework;
using Tether.Client;
using Tether.Protocol;

namespace Tether.Tests
{
    [TestFixture]
    public class ClientTests
    {
        static readonly float[] Obs = { 0.1f, -0.2f, 0.3f, 0.0f };

        static TetherClient Connect(ScriptedServer server)
        {
            return TetherClient.Connect(server.Options(7));
        }

        static void Play(TetherClient client, string episode, int steps)
        {
            var action = new double[1];
            for (int i = 0; i < steps; ++i)
            {
                client.GetAction(episode, Obs, action);
                Assert.That(action[0] == 0 || action[0] == 1, Is.True);
                client.LogReturns(episode, 1.0);
            }
        }

        // Plays steps of the episode until one raises a T (returned), or until `seconds` have passed (null).
        static T PlayUntilRaised<T>(TetherClient client, string episode, double seconds) where T : TetherException
        {
            DateTime deadline = DateTime.UtcNow.AddSeconds(seconds);
            var action = new double[1];
            while (DateTime.UtcNow < deadline)
            {
                try
                {
                    client.GetAction(episode, Obs, action);
                    client.LogReturns(episode, 1.0);
                }
                catch (T e)
                {
                    return e;
                }
            }
            return null;
        }

        [Test]
        public void ABatchLostOnEveryConnectionIsGivenUpAfterMaxBatchAttempts()
        {
            // The server closes the connection whenever batch 1 arrives: without a limit the
            // client would resend it forever and nothing after it would ever be delivered.
            using (var server = new ScriptedServer(10) { DropSeq = 1 })
            using (TetherClient client = TetherClient.Connect(new ClientOptions { Port = server.Port, Seed = 7, ReconnectTimeoutSeconds = 10, MaxBatchAttempts = 3, WhenQueueFull = QueueFullPolicy.Wait }))
            {
                string episode = client.StartEpisode();
                TetherException givenUp = PlayUntilRaised<TetherException>(client, episode, 20);
                Assert.That(givenUp, Is.Not.Null, "the lost batch was never given up");
                Assert.That(givenUp.Code, Is.EqualTo(ErrorCode.ConnectionFailed));
                Assert.That(givenUp.Message, Is.StringContaining("given up (MaxBatchAttempts)"));
                Assert.That(server.Received("EPISODES_AND_GET_STATE").Count(b => (long)b["batch_seq"] == 1), Is.EqualTo(3));
                // The client goes on: later batches are delivered on the same server.
                client.EndEpisode(episode, Obs);
                string other = client.StartEpisode();
                Play(client, other, 25);
                client.EndEpisode(other, Obs);
                client.Flush(10);
                var later = server.Received("EPISODES_AND_GET_STATE").Where(b => (long)b["batch_seq"] > 1).ToList();
                Assert.That(later.Count, Is.GreaterThan(0), "nothing was delivered after the lost batch");
                Assert.That(later.SelectMany(b => b["episodes"]).Select(r => (string)r["episode_id"]), Has.Member(other));
            }
        }

        [Test]
        public void BatchesCarryTheSessionConsecutiveSeqsAndValidRecords()
        {
            using (var server = new ScriptedServer(10))
            using (TetherClient client = Connect(server))
            {
                string first = client.StartEpisode();
                Play(client, first, 25);
                string second = client.StartEpisode();  // overlapping episodes
                Play(client, second, 12);
                Play(client, first, 8);
                Assert.That(client.EndEpisode(first, Obs), Is.EqualTo(33.0));
                Assert.That(client.EndEpisode(second, Obs, truncated: true), Is.EqualTo(12.0));
                client.Flush(10);
                var batches = server.Received("EPISODES_AND_GET_STATE");
                Assert.That(batches.Select(b => (long)b["batch_seq"]), Is.EqualTo(Enumerable.Range(1, batches.Count).Select(i => (long)i)));
                Assert.That(batches.All(b => (string)b["client_session"] == client.ClientSession), Is.True);
                int total = 0;
                foreach (JObject b in batches)
                {
                    int steps = server.Validate(b);
                    Assert.That((int)b["env_steps"], Is.EqualTo(steps));
                    total += steps;
                }
                Assert.That(total, Is.EqualTo(45));
                Assert.That(client.EnvStepsSent, Is.EqualTo(45));
                // Each episode's chunks join up: every chunk but the last ends where the next begins.
                var firstChunks = batches.SelectMany(b => b["episodes"]).Where(r => (string)r["episode_id"] == first).ToList();
                Assert.That(firstChunks.Sum(r => ((JArray)r["actions"]).Count), Is.EqualTo(33));
                Assert.That((bool)firstChunks.Last()["is_terminated"], Is.True);
                var secondChunks = batches.SelectMany(b => b["episodes"]).Where(r => (string)r["episode_id"] == second).ToList();
                Assert.That((bool)secondChunks.Last()["is_truncated"], Is.True);
                for (int i = 0; i + 1 < firstChunks.Count; ++i)
                {
                    Assert.That(JToken.DeepEquals(firstChunks[i]["obs"].Last(), firstChunks[i + 1]["obs"].First()), Is.True);
                }
            }
        }

        static JObject RecordOf(JObject batch, string episode)
        {
            return (JObject)batch["episodes"].Single(r => (string)r["episode_id"] == episode);
        }

        static string RunsOf(JObject record)
        {
            JToken runs = record[VersionRuns.Field];
            return runs == null ? null : runs.ToString(Newtonsoft.Json.Formatting.None);
        }

        [Test]
        public void ARecordWhoseStepsStraddleAModelSwapCarriesTheVersionOfEachStep()
        {
            foreach (string pong in new[] { "1.3", null })
            {
                using (var server = new ScriptedServer(1000) { PongVersion = pong })
                using (TetherClient client = Connect(server))
                {
                    string a = client.StartEpisode();
                    Play(client, a, 3);
                    server.Seq = 1;
                    client.Flush(10);  // steps 0-1 of a (its last waits for the observation closing it), answered with version 1
                    Assert.That(client.WeightsSeqNo, Is.EqualTo(1));
                    string b = client.StartEpisode();
                    Play(client, a, 4);
                    Play(client, b, 2);
                    client.EndEpisode(a, Obs);
                    client.EndEpisode(b, Obs);
                    client.Flush(10);
                    var batches = server.Received("EPISODES_AND_GET_STATE");
                    Assert.That(batches.Count, Is.EqualTo(2));
                    foreach (JObject batch in batches) server.Validate(batch);
                    Assert.That(RunsOf(RecordOf(batches[0], a)), Is.Null, "one version: the record is as before");
                    // Step 2 acted with version 0, steps 3-6 with version 1; the claim is still the oldest.
                    Assert.That(RunsOf(RecordOf(batches[1], a)), Is.EqualTo(pong == null ? null : "[[0,1],[1,4]]"), "server " + (pong ?? "v1"));
                    Assert.That(RunsOf(RecordOf(batches[1], b)), Is.Null);
                    Assert.That((long)batches[1]["weights_seq_no"], Is.EqualTo(0));
                }
            }
        }

        [Test]
        public void VersionsBeyondWhatARunMayNameLeaveTheRecordToTheClaim()
        {
            using (var server = new ScriptedServer(1000) { Seq = int.MaxValue })
            using (TetherClient client = Connect(server))
            {
                string a = client.StartEpisode();
                Play(client, a, 3);
                server.Seq = int.MaxValue + 1L;
                client.Flush(10);
                Play(client, a, 2);
                client.EndEpisode(a, Obs);
                client.Flush(10);  // (a batch refused while being written would raise here)
                var batches = server.Received("EPISODES_AND_GET_STATE");
                Assert.That(batches.Count, Is.EqualTo(2));
                Assert.That(RunsOf(RecordOf(batches[1], a)), Is.Null);
                Assert.That((long)batches[1]["weights_seq_no"], Is.EqualTo(int.MaxValue));
                Assert.That(client.EnvStepsSent, Is.EqualTo(5));
            }
        }

        [Test]
        public void StepVersionsGoOnlyOnTheConnectionTheyWereLearnedOn()
        {
            // The server never restarts here: versions only go up, yet a reconnect is enough (§10.1).
            using (var server = new ScriptedServer(1000))
            using (TetherClient client = Connect(server))
            {
                // Steps of versions 0 and 1 wait in an episode while the connection is lost.
                string a = client.StartEpisode();
                Play(client, a, 2);
                server.Seq = 1;
                client.Flush(10);
                Play(client, a, 2);
                server.Seq = 2;
                server.DropConnections();
                // The game hears of the new connection (a call that records nothing) before it cuts those steps.
                DateTime deadline = DateTime.UtcNow.AddSeconds(10);
                while (client.WeightsSeqNo != 2 && DateTime.UtcNow < deadline)
                {
                    client.ComputeAction(Obs, new double[1]);
                    Thread.Sleep(5);
                }
                Assert.That(client.WeightsSeqNo, Is.EqualTo(2));
                Assert.That(client.Reconnects, Is.EqualTo(1));
                Play(client, a, 1);  // one step learned on the new connection: the record's steps span two
                client.EndEpisode(a, Obs);
                client.Flush(10);
                // A batch written with step versions is lost, and goes again on a new connection to the same server.
                string b = client.StartEpisode();
                Play(client, b, 2);
                server.Seq = 3;
                client.Flush(10);
                Play(client, b, 2);
                server.DropOnceSeq = 4;
                client.EndEpisode(b, Obs);
                client.Flush(10);
                var batches = server.Received("EPISODES_AND_GET_STATE");
                Assert.That(batches.Select(m => (long)m["batch_seq"]), Is.EqualTo(new long[] { 1, 2, 3, 4, 4 }));
                Assert.That(RunsOf(RecordOf(batches[1], a)), Is.Null, "versions learned on an earlier connection were sent");
                Assert.That(RunsOf(RecordOf(batches[3], b)), Is.EqualTo("[[2,1],[3,2]]"), "sent on the connection its versions were learned on");
                Assert.That(RunsOf(RecordOf(batches[4], b)), Is.Null, "the resend on a new connection kept the step versions");
                // The claim is resent unchanged.
                Assert.That((long)batches[1]["weights_seq_no"], Is.EqualTo(0));
                Assert.That((long)batches[3]["weights_seq_no"], Is.EqualTo(2));
                Assert.That((long)batches[4]["weights_seq_no"], Is.EqualTo(2));
                Assert.That(client.Reconnects, Is.EqualTo(2));
                Assert.That(client.EnvStepsSent, Is.EqualTo(9));
            }
        }

        [Test]
        public void AResentBatchKeepsItsClaimWhenTheServerRestartedWithoutResuming()
        {
            // §6.5: a batch lost unanswered goes again unchanged, its claim included, even to a server
            // whose versions went back (restarted without resuming; the server judges the claim).
            using (var server = new ScriptedServer(1000))
            {
                server.Seq = 5;
                using (TetherClient client = Connect(server))
                {
                    string a = client.StartEpisode();
                    Play(client, a, 3);
                    Assert.That(client.WeightsSeqNo, Is.EqualTo(5));
                    server.Seq = 1;  // the server the resend reaches
                    server.DropOnceSeq = 1;
                    client.EndEpisode(a, Obs);
                    client.Flush(10);
                    Assert.That(client.Reconnects, Is.EqualTo(1));
                    var batches = server.Received("EPISODES_AND_GET_STATE");
                    Assert.That(batches.Select(m => (long)m["batch_seq"]), Is.EqualTo(new long[] { 1, 1 }));
                    Assert.That(batches.Select(m => (long)m["weights_seq_no"]), Is.EqualTo(new long[] { 5, 5 }));
                    Assert.That(batches[1].ToString(Newtonsoft.Json.Formatting.None), Is.EqualTo(batches[0].ToString(Newtonsoft.Json.Formatting.None)));
                    Assert.That(client.WeightsSeqNo, Is.EqualTo(1));
                }
            }
        }

        [Test]
        public void StepsTheServerRefusedAsStaleAreCountedAndOtherValuesIgnored()
        {
            using (var server = new ScriptedServer(1000))
            using (TetherClient client = Connect(server))
            {
                var answers = new JToken[] { 7, "3", true, 2.5, 5, 0, -4, JValue.CreateNull(), JToken.Parse("100000000000000000000000") };
                var expected = new long[] { 7, 7, 7, 7, 12, 12, 12, 12, long.MaxValue };
                foreach (JToken answer in answers) server.RefusedStale.Enqueue(answer);
                Assert.That(client.StepsRefusedStale, Is.EqualTo(0));
                string episode = client.StartEpisode();
                for (int i = 0; i < answers.Length; ++i)
                {
                    Play(client, episode, 2);
                    client.Flush(10);  // one batch, one answer
                    Assert.That(client.StepsRefusedStale, Is.EqualTo(expected[i]), "after an answer with " + answers[i].ToString(Newtonsoft.Json.Formatting.None));
                }
                Assert.That(server.Received("EPISODES_AND_GET_STATE").Count, Is.EqualTo(answers.Length));
            }
        }

        [Test]
        public void AQuarterOfTheEpisodesAreRecordedWhenTheServerAsksForAQuarter()
        {
            const int perSample = 50, length = 5, training = 400;
            using (var server = new ScriptedServer(perSample) { RecordShare = "0.25" })
            using (TetherClient client = Connect(server))
            {
                Assert.That(client.RecordShare, Is.EqualTo(0.25));  // from the handshake's SET_STATE
                for (int e = 0; e < training + 20; ++e)
                {
                    // Every 21st episode does not train: it is neither drawn nor held back.
                    string episode = client.StartEpisode(null, trainingEnabled: e % 21 != 20);
                    Play(client, episode, length);
                    Assert.That(client.EndEpisode(episode, Obs), Is.EqualTo(length), "a held-back episode's returns count alike");
                }
                client.Flush(10);
                var batches = server.Received("EPISODES_AND_GET_STATE");
                int recorded = batches.SelectMany(b => b["episodes"]).Select(r => (string)r["episode_id"]).Distinct().Count();
                int recordedSteps = batches.Sum(b => (int)b["env_steps"]);
                Console.WriteLine("[ record_share ] " + recorded + " of " + training + " episodes recorded, " + client.EpisodesHeldBack + " held back, " + batches.Count + " batches");
                Assert.That(recorded, Is.InRange(60, 140));
                Assert.That(recorded + client.EpisodesHeldBack, Is.EqualTo(training));
                Assert.That(recordedSteps, Is.EqualTo(recorded * length));
                Assert.That(recordedSteps + client.EpisodesHeldBack * length, Is.EqualTo(training * length), "recorded + held-back steps = steps played");
                Assert.That(client.EnvStepsSent, Is.EqualTo(recordedSteps));
                // A batch every perSample steps played in training episodes (recorded or held back), not recorded.
                Assert.That(batches.Count, Is.InRange(training * length / perSample - 1, training * length / perSample + 1));
                Assert.That(batches.Select(b => (long)b["batch_seq"]), Is.EqualTo(Enumerable.Range(1, batches.Count).Select(i => (long)i)));
                foreach (JObject b in batches) Assert.That(server.Validate(b), Is.EqualTo((int)b["env_steps"]));
            }
        }

        [Test]
        public void RecordSharesThatAreNotNumbersInZeroToOneAreIgnoredAndAnAbsentOneMeansOne()
        {
            using (var server = new ScriptedServer(1000))
            using (TetherClient client = Connect(server))
            {
                Assert.That(client.RecordShare, Is.EqualTo(1.0));
                string episode = client.StartEpisode();  // recorded: every batch below goes, one answer each
                var answers = new[] { "0.5", "\"0.25\"", "true", "0", "1.5", "-0.5", "null", "0.75", "1", "0.125", null };
                var expected = new[] { 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.75, 1.0, 0.125, 1.0 };
                for (int i = 0; i < answers.Length; ++i)
                {
                    server.RecordShare = answers[i];
                    Play(client, episode, 2);
                    client.Flush(10);
                    Assert.That(client.RecordShare, Is.EqualTo(expected[i]), "after an answer with " + (answers[i] ?? "no record_share"));
                }
                Assert.That(server.Received("EPISODES_AND_GET_STATE").Count, Is.EqualTo(answers.Length));
                Assert.That(client.EpisodesHeldBack, Is.EqualTo(0));
            }
        }

        [Test]
        public void WithEveryEpisodeHeldBackEmptyBatchesStillGoEveryEnvStepsPerSampleStepsPlayed()
        {
            foreach (bool onPolicy in new[] { true, false })
            {
                using (var server = new ScriptedServer(10, onPolicy) { RecordShare = "1e-9" })
                using (TetherClient client = Connect(server))
                {
                    string type = onPolicy ? "EPISODES_AND_GET_STATE" : "EPISODES";
                    string a = client.StartEpisode();
                    Play(client, a, 35);  // batches cut at calls 11, 21 and 31
                    client.Flush(10);     // (nothing recorded: nothing more to send; a cut all the same)
                    var batches = server.Received(type);
                    Assert.That(batches.Count, Is.EqualTo(3), type);
                    Assert.That(client.EpisodesHeldBack, Is.EqualTo(1));
                    for (int i = 0; i < batches.Count; ++i)
                    {
                        JObject b = batches[i];
                        Assert.That(((JArray)b["episodes"]).Count, Is.EqualTo(0));
                        Assert.That((long)b["batch_seq"], Is.EqualTo(i + 1));
                        Assert.That((string)b["client_session"], Is.EqualTo(client.ClientSession));
                        Assert.That((long)b["weights_seq_no"], Is.EqualTo(0));
                        Assert.That((int)b["agent_steps"], Is.EqualTo(0));
                        Assert.That((int)b["env_steps"], Is.EqualTo(0));
                    }
                    if (!onPolicy) Assert.That(server.Received("GET_STATE").Count, Is.EqualTo(1 + 3), "each EPISODES is followed by a GET_STATE");
                    // An answer without record_share: every new episode is recorded again; the running one stays held back.
                    // The flush was a cut: the held-back steps count from it (calls 36 to 45), as at every cut.
                    server.RecordShare = null;
                    Play(client, a, 11);  // batch 4, cut at call 46
                    client.Flush(10);
                    Assert.That(client.RecordShare, Is.EqualTo(1.0));
                    Assert.That(client.EndEpisode(a, Obs), Is.EqualTo(46));
                    string b2 = client.StartEpisode();
                    Play(client, b2, 5);
                    client.EndEpisode(b2, Obs);
                    client.Flush(10);
                    batches = server.Received(type);
                    Assert.That(batches.Count, Is.EqualTo(5));
                    Assert.That(((JArray)batches[3]["episodes"]).Count, Is.EqualTo(0));
                    Assert.That(batches[4]["episodes"].Select(r => (string)r["episode_id"]), Is.EqualTo(new[] { b2 }));
                    Assert.That((int)batches[4]["env_steps"], Is.EqualTo(5));
                    Assert.That(client.EpisodesHeldBack, Is.EqualTo(1));
                    Assert.That(client.EnvStepsSent, Is.EqualTo(5));
                }
            }
        }

        [Test]
        public void StepsPerBatchSetsTheCadenceUntilAnAnswerWithoutIt()
        {
            // Everything held back, strict on-policy (each answer applies before the next cut): the
            // handshake asks for 4 steps per batch; the next five answers carry invalid values (kept
            // at 4), the sixth one above env_steps_per_sample (counts as 10), later ones none (10).
            using (var server = new ScriptedServer(10) { RecordShare = "1e-9" })
            {
                foreach (string every in new[] { "4", "true", "0", "2.5", "\"3\"", "-1", "50" }) server.StepsPerBatch.Enqueue(every);
                using (TetherClient client = TetherClient.Connect(new ClientOptions { Port = server.Port, Seed = 5, WaitForWeights = true }))
                {
                    Assert.That(client.StepsPerBatch, Is.EqualTo(4), "from the handshake's SET_STATE");
                    string episode = client.StartEpisode();
                    var sendsAt = new List<int>();
                    var after = new List<int>();  // StepsPerBatch once each batch was answered
                    var action = new double[1];
                    for (int t = 0; t < 100; ++t)
                    {
                        // Then an answer asks for 3, and the next one has no member: back to 10.
                        if (t == 80) server.StepsPerBatch.Enqueue("3");
                        int before = server.Received("EPISODES_AND_GET_STATE").Count;
                        client.GetAction(episode, Obs, action);
                        if (server.Received("EPISODES_AND_GET_STATE").Count > before)
                        {
                            sendsAt.Add(t);  // t steps played: the cut comes before the call's step is acted
                            after.Add(client.StepsPerBatch);
                        }
                    }
                    var gaps = sendsAt.Select((at, i) => at - (i == 0 ? 0 : sendsAt[i - 1])).ToList();
                    Assert.That(gaps, Is.EqualTo(new[] { 4, 4, 4, 4, 4, 4, 10, 10, 10, 10, 10, 10, 3, 10 }), string.Join(", ", gaps));
                    Assert.That(after, Is.EqualTo(new[] { 4, 4, 4, 4, 4, 10, 10, 10, 10, 10, 10, 3, 10, 10 }));
                    Assert.That(client.StepsPerBatch, Is.EqualTo(10));
                    Assert.That(client.EpisodesHeldBack, Is.EqualTo(1));
                    foreach (JObject b in server.Received("EPISODES_AND_GET_STATE")) Assert.That(((JArray)b["episodes"]).Count, Is.EqualTo(0));
                }
            }
        }

        [Test]
        public void WithRecordedAndHeldBackEpisodesMixedABatchIsDueOnlyWhenTheRecordedStepsItCountsAreSendable()
        {
            // As the Python SDK (§13.2): held-back steps plus recorded steps waiting, and plus those
            // sendable, must reach env_steps_per_sample. A recorded episode's last step waits for its next
            // observation: at the held-back episode's turn it is not sendable, so the batch waits for the
            // recorded episode's turn and carries that step too.
            using (var server = new ScriptedServer(10) { RecordShare = "1e-9" })
            using (TetherClient client = TetherClient.Connect(new ClientOptions { Port = server.Port, Seed = 5, WaitForWeights = true }))
            {
                string held = client.StartEpisode();
                server.RecordShare = null;  // the answer to the first batch: the next episodes are recorded
                Play(client, held, 11);     // batch 1 (empty), cut at call 11; one held-back step since
                Assert.That(client.RecordShare, Is.EqualTo(1.0));
                string recorded = client.StartEpisode();
                Assert.That(client.EpisodesHeldBack, Is.EqualTo(1));
                for (int i = 0; i < 5; ++i)
                {
                    Play(client, recorded, 1);
                    Play(client, held, 1);
                }
                // 5 recorded steps waiting (the last one not sendable at the held-back episode's turn) and 6 held back.
                var batches = server.Received("EPISODES_AND_GET_STATE");
                Assert.That(batches.Count, Is.EqualTo(1), "not due at the held-back episode's 5th turn: 4 sendable + 5 held < 10");
                Play(client, recorded, 1);
                batches = server.Received("EPISODES_AND_GET_STATE");
                Assert.That(batches.Count, Is.EqualTo(2));
                Assert.That((int)batches[1]["env_steps"], Is.EqualTo(5));
                Assert.That(batches[1]["episodes"].Select(r => (string)r["episode_id"]), Is.EqualTo(new[] { recorded }));
            }
        }

        [Test]
        public void AtRecordShareOneNoRandomNumberIsDrawnForAnEpisode()
        {
            // The actions of a training episode at share 1 are those of an episode that does not
            // train (which draws nothing): a client told "1" acts as one never told a share.
            Func<string, bool, int[]> actions = (share, train) =>
            {
                using (var server = new ScriptedServer(1000) { RecordShare = share })
                using (TetherClient client = Connect(server))
                {
                    string episode = client.StartEpisode(null, train);
                    var action = new double[1];
                    var taken = new int[64];
                    for (int t = 0; t < taken.Length; ++t)
                    {
                        client.GetAction(episode, new[] { (float)Math.Sin(t), (float)Math.Cos(0.7 * t), 0.3f * (t % 5), -0.1f }, action);
                        taken[t] = (int)action[0];
                    }
                    return taken;
                }
            };
            int[] reference = actions(null, false);
            Assert.That(actions(null, true), Is.EqualTo(reference));
            Assert.That(actions("1", true), Is.EqualTo(reference));
            Assert.That(actions("1.0", true), Is.EqualTo(reference));
            // (a share below 1 draws one number: the sequence is shifted, so this test can tell)
            Assert.That(actions("0.9999999", true), Is.Not.EqualTo(reference));
        }

        [Test]
        public void ARefusedBatchIsRaisedOnceAndItsEpisodeIsNotSentAgain()
        {
            using (var server = new ScriptedServer(10) { RefuseSeq = 1 })
            using (TetherClient client = Connect(server))
            {
                string episode = client.StartEpisode();
                ServerErrorException refusal = PlayUntilRaised<ServerErrorException>(client, episode, 10);
                Assert.That(refusal, Is.Not.Null);
                Assert.That(refusal.Code, Is.EqualTo(ErrorCode.InvalidField));
                Assert.That(refusal.Message, Is.StringContaining("refused for the test"));
                Play(client, episode, 30);  // raised once: the client goes on
                client.EndEpisode(episode, Obs);
                string other = client.StartEpisode();
                Play(client, other, 12);
                client.EndEpisode(other, Obs);
                client.Flush(10);
                var batches = server.Received("EPISODES_AND_GET_STATE");
                Assert.That(batches.Count(b => (long)b["batch_seq"] == 1), Is.EqualTo(1));
                Assert.That(batches.All(b => ((JArray)b["episodes"]).Count > 0), Is.True, "a batch emptied by the refusal was sent");
                // Each batch counts the steps it holds (a refused episode's steps taken out of it are not counted).
                foreach (JObject b in batches) Assert.That((int)b["env_steps"], Is.EqualTo(server.Validate(b)));
                var later = batches.Where(b => (long)b["batch_seq"] > 1).SelectMany(b => b["episodes"]).Select(r => (string)r["episode_id"]).ToList();
                Assert.That(later, Has.No.Member(episode));
                Assert.That(later, Has.Member(other));
            }
        }

        [Test]
        public void AModelThatCannotBeLoadedAtConnectIsAnInferenceFailureNotRetried()
        {
            using (var server = new ScriptedServer(10) { ModelFile = OnnxCodec.Encode(new byte[] { 1, 2, 3, 4, 5 }) })
            {
                var error = Assert.Throws<TetherException>(() => Connect(server));
                Assert.That(error.Code, Is.EqualTo(ErrorCode.InferenceFailed));
                Assert.That(server.Received("PING").Count, Is.EqualTo(1), "a model that cannot load was fetched again and again");
            }
        }

        [Test]
        public void AServerOfAnotherMajorVersionIsRefusedAtOnceNamingBoth()
        {
            using (var server = new ScriptedServer(10) { PongVersion = "2.0" })
            {
                var error = Assert.Throws<TetherException>(() => Connect(server));
                Assert.That(error.Code, Is.EqualTo(ErrorCode.VersionMismatch));
                Assert.That(error.Message, Is.StringContaining("2.0").And.StringContaining(Messages.ProtocolVersion));
                Assert.That(server.Received("PING").Count, Is.EqualTo(1), "another major version was retried");
                Assert.That(server.Received("GET_CONFIG").Count, Is.EqualTo(0));
            }
        }

        [Test]
        public void APlainV1ServerWithoutSpacesTakesThemFromTheOptions()
        {
            using (var server = new ScriptedServer(10) { PongVersion = null })
            {
                server.Config.Remove("observation_space");
                server.Config.Remove("action_space");
                server.Config.Remove("protocol_version");
                var error = Assert.Throws<TetherException>(() => Connect(server));
                Assert.That(error.Code, Is.EqualTo(ErrorCode.InvalidArgument));
                Assert.That(error.Message, Is.StringContaining("observation_space").And.StringContaining("ClientOptions.ObservationSpace"));
                Assert.That(server.Received("PING").Count, Is.EqualTo(1), "a configuration the options must complete was retried");
                using (TetherClient client = TetherClient.Connect(new ClientOptions
                {
                    Port = server.Port, Seed = 7, ReconnectTimeoutSeconds = 5,
                    ObservationSpace = Space.Box(new long[] { 4 }, -10, 10), ActionSpace = Space.Discrete(2),
                }))
                {
                    Assert.That(client.ObservationSpace.FlatDim, Is.EqualTo(4));
                    string episode = client.StartEpisode();
                    var action = new double[1];
                    for (int t = 0; t < 12; ++t)
                    {
                        client.GetAction(episode, Obs, action);
                        Assert.That(action[0], Is.EqualTo(0).Or.EqualTo(1));
                        client.LogReturns(episode, 1.0);
                    }
                    client.EndEpisode(episode, Obs);
                    client.Flush(10);
                    Assert.That(server.Received("EPISODES_AND_GET_STATE").Count, Is.GreaterThanOrEqualTo(1));
                }
            }
        }

        [Test]
        public void ANewModelThatCannotBeLoadedIsReportedOnceAndTheCurrentOneActsOn()
        {
            using (var server = new ScriptedServer(10) { BadModelFromSeq = 2 })
            using (TetherClient client = Connect(server))
            {
                string episode = client.StartEpisode();
                var action = new double[1];
                TetherException reported = PlayUntilRaised<TetherException>(client, episode, 10);
                Assert.That(reported, Is.Not.Null);
                Assert.That(reported.Code, Is.EqualTo(ErrorCode.InferenceFailed));
                Assert.That(reported.Message, Is.StringContaining("acting on with the current one"));
                Assert.That(client.FatalError, Is.Null);
                Assert.That(client.WeightsSeqNo, Is.EqualTo(0));
                // Raised, not fatal: the game plays on with version 0 and its batches keep going.
                for (int i = 0; i < 60; ++i)
                {
                    try
                    {
                        client.GetAction(episode, Obs, action);
                        client.LogReturns(episode, 1.0);
                    }
                    catch (TetherException e)
                    {
                        Assert.That(e.Code, Is.EqualTo(ErrorCode.InferenceFailed));  // each new batch's answer again
                    }
                }
                client.EndEpisode(episode, Obs);
                // (the last batches may still be on their way: wait for them, bounded)
                DateTime arrived = DateTime.UtcNow.AddSeconds(10);
                while (server.Received("EPISODES_AND_GET_STATE").Count < 4 && DateTime.UtcNow < arrived) Thread.Sleep(10);
                Assert.That(server.Received("EPISODES_AND_GET_STATE").Count, Is.GreaterThanOrEqualTo(4));
                Assert.That(client.FatalError, Is.Null);
            }
        }

        // A real model whose outputs turn NaN after `healthyRuns` runs (as a diverged policy's would).
        sealed class DivergingBackend : Tether.Inference.IInferenceBackend
        {
            readonly Tether.Inference.OnnxRuntimeBackend inner = new Tether.Inference.OnnxRuntimeBackend();
            public int HealthyRuns = int.MaxValue;
            int runs;
            public void Load(byte[] model, string inputName, string outputName) { inner.Load(model, inputName, outputName); }
            public bool Loaded { get { return inner.Loaded; } }
            public int ObsDim { get { return inner.ObsDim; } }
            public int OutDim { get { return inner.OutDim; } }
            public void Run(float[] obs, int batch, int obsDim, float[] output, int outDim)
            {
                inner.Run(obs, batch, obsDim, output, outDim);
                if (++runs > HealthyRuns) output[outDim - 1] = float.NaN;
            }
            public void Dispose() { inner.Dispose(); }
        }

        [Test]
        public void ANonFiniteModelOutputOrRewardIsRefusedAndNothingNonFiniteIsSent()
        {
            using (var server = new ScriptedServer(5))
            using (TetherClient client = TetherClient.Connect(new ClientOptions
            {
                Port = server.Port, Seed = 7, ReconnectTimeoutSeconds = 5, WhenQueueFull = QueueFullPolicy.Wait,
                BackendFactory = () => new DivergingBackend { HealthyRuns = 12 },
            }))
            {
                string episode = client.StartEpisode();
                Play(client, episode, 12);
                var action = new double[1];
                var error = Assert.Throws<TetherException>(() => client.GetAction(episode, Obs, action));
                Assert.That(error.Code, Is.EqualTo(ErrorCode.InferenceFailed));
                Assert.That(error.Message, Is.StringContaining("not finite"));
                var overflow = Assert.Throws<TetherException>(() => client.LogReturns(episode, 1e39));
                Assert.That(overflow.Code, Is.EqualTo(ErrorCode.NonFiniteValue));
                client.EndEpisode(episode, Obs);
                client.Flush(10);
                var batches = server.Received("EPISODES_AND_GET_STATE");
                Assert.That(batches.Sum(b => (int)b["env_steps"]), Is.EqualTo(12), "the failed call recorded a step");
                foreach (JObject b in batches)
                {
                    string text = b.ToString(Newtonsoft.Json.Formatting.None);
                    Assert.That(text.Contains("NaN") || text.Contains("Infinity"), Is.False, text);
                }
            }
        }

        [Test]
        public void AGetActionThatRaisedWhileCuttingRecordedNothingAndCanBeMadeAgain()
        {
            // Strict on-policy: the call that cuts batch 1 waits for its answer, which comes late
            // (the I/O thread then times out too, reconnects and resends it: answered at once).
            using (var server = new ScriptedServer(10) { SlowSeq = 1, SlowMilliseconds = 1500 })
            using (TetherClient client = TetherClient.Connect(new ClientOptions { Port = server.Port, Seed = 7, WaitForWeights = true, UpdateTimeoutSeconds = 0.3 }))
            {
                string episode = client.StartEpisode();
                Play(client, episode, 10);
                var action = new double[1];
                var e = Assert.Throws<TetherException>(() => client.GetAction(episode, Obs, action));
                Assert.That(e.Code, Is.EqualTo(ErrorCode.Timeout));
                Assert.That(e.Message, Is.StringContaining("UpdateTimeoutSeconds"));
                // Each raised call did nothing: make it again until it goes through.
                int raised = 0;
                for (int step = 0; step < 25; ++step)
                {
                    while (true)
                    {
                        try
                        {
                            client.GetAction(episode, Obs, action);
                            break;
                        }
                        catch (TetherException again)
                        {
                            Assert.That(again.Code, Is.EqualTo(ErrorCode.Timeout));
                            Assert.That(++raised, Is.LessThan(4));
                        }
                    }
                    client.LogReturns(episode, 1.0);
                }
                client.EndEpisode(episode, Obs);
                try
                {
                    client.Flush(10);
                }
                catch (TetherException late)
                {
                    Assert.That(late.Code, Is.EqualTo(ErrorCode.Timeout));
                    client.Flush(10);
                }
                var batches = server.Received("EPISODES_AND_GET_STATE");
                // Batch 1 arrived twice (the resend); every step once in the batches the server kept.
                var kept = batches.GroupBy(b => (long)b["batch_seq"]).Select(g => g.First()).ToList();
                Assert.That(kept.Sum(b => server.Validate(b)), Is.EqualTo(35));
                var chunks = kept.SelectMany(b => b["episodes"]).ToList();
                for (int i = 0; i + 1 < chunks.Count; ++i)
                {
                    Assert.That(JToken.DeepEquals(chunks[i]["obs"].Last(), chunks[i + 1]["obs"].First()), Is.True);
                }
            }
        }

        [Test]
        public void AServerThatNeverWantsABatchIsServed()
        {
            // env_steps_per_sample beyond an int (a server that only collects when told): no overflow, no batch.
            using (var server = new ScriptedServer(10))
            {
                server.Config["env_steps_per_sample"] = JToken.Parse("1000000000000000");
                server.Config["train_batch_size"] = JToken.Parse("100000000000000000000");
                using (TetherClient client = Connect(server))
                {
                    string episode = client.StartEpisode();
                    Play(client, episode, 50);
                    Assert.That(client.Sending, Is.False);
                    Assert.That(server.Received("EPISODES_AND_GET_STATE"), Is.Empty);
                }
            }
        }

        [Test]
        public void ANonFiniteObservationOrAnUnknownEpisodeIsAClearError()
        {
            using (var server = new ScriptedServer(10))
            using (TetherClient client = Connect(server))
            {
                string episode = client.StartEpisode();
                var e = Assert.Throws<TetherException>(() => client.GetAction(episode, new[] { 0f, float.NaN, 0f, 0f }, new double[1]));
                Assert.That(e.Code, Is.EqualTo(ErrorCode.NonFiniteValue));
                Assert.That(e.Message, Is.StringContaining("observation[1]"));
                e = Assert.Throws<TetherException>(() => client.GetAction("nope", Obs, new double[1]));
                Assert.That(e.Code, Is.EqualTo(ErrorCode.InvalidArgument));
                Assert.That(e.Message, Is.StringContaining("'nope'"));
                e = Assert.Throws<TetherException>(() => client.GetAction(episode, new float[3], new double[1]));
                Assert.That(e.Message, Is.StringContaining("3 values, the space needs 4"));
            }
        }

        // A listener that accepts and then does what `serve` says with each connection.
        static System.Net.Sockets.TcpListener Hostile(Action<System.Net.Sockets.Socket> serve)
        {
            var listener = new System.Net.Sockets.TcpListener(System.Net.IPAddress.Loopback, 0);
            listener.Start();
            new System.Threading.Thread(() =>
            {
                try
                {
                    while (true)
                    {
                        System.Net.Sockets.Socket socket = listener.AcceptSocket();
                        new System.Threading.Thread(() => { try { serve(socket); } catch (Exception) { } }) { IsBackground = true }.Start();
                    }
                }
                catch (Exception)
                {
                }
            }) { IsBackground = true }.Start();
            return listener;
        }

        [Test]
        public void DisposingWhileAConnectHangsEndsTheAttemptAtOnce()
        {
            // A listener whose accept queue is full drops new connection requests: a connect
            // to it hangs, as to a server whose machine is off. Dispose (a Unity object
            // destroyed while its client reconnects) must not wait for ConnectTimeoutSeconds.
            var listener = new System.Net.Sockets.TcpListener(System.Net.IPAddress.Loopback, 0);
            listener.Start(0);
            var fillers = new System.Collections.Generic.List<System.Net.Sockets.Socket>();
            var transports = new System.Collections.Generic.List<TcpTransport>();
            try
            {
                int port = ((System.Net.IPEndPoint)listener.LocalEndpoint).Port;
                for (int i = 0; i < 8; ++i)
                {
                    var filler = new System.Net.Sockets.Socket(System.Net.Sockets.AddressFamily.InterNetwork, System.Net.Sockets.SocketType.Stream, System.Net.Sockets.ProtocolType.Tcp);
                    fillers.Add(filler);
                    if (!filler.BeginConnect(System.Net.IPAddress.Loopback, port, null, null).AsyncWaitHandle.WaitOne(200)) break;  // the queue is full
                }
                var transport = new TcpTransport(new ClientOptions { Port = port, ConnectTimeoutSeconds = 30 });
                transports.Add(transport);
                Exception ended = null;
                var connecting = new Thread(() =>
                {
                    try { transport.Connect(); }
                    catch (Exception e) { ended = e; }
                }) { IsBackground = true };  // (a failing run must not hold the test runner for 30 s)
                connecting.Start();
                Assert.That(connecting.Join(500), Is.False, "the connect should hang (the listener's queue is full)");
                DateTime disposed = DateTime.UtcNow;
                transport.Dispose();
                Assert.That(connecting.Join(2000), Is.True, "Dispose left the connect waiting");
                Assert.That((DateTime.UtcNow - disposed).TotalSeconds, Is.LessThan(2));
                Assert.That(ended, Is.InstanceOf<ConnectionLostException>());
                Assert.That(ended.Message, Is.StringContaining("abandoned"));
                Assert.That(((ConnectionLostException)ended).Code, Is.EqualTo(ErrorCode.Closed));
                Assert.Throws<ConnectionLostException>(() => transport.Connect());  // and none starts after
            }
            finally
            {
                foreach (var transport in transports) transport.Dispose();
                foreach (var filler in fillers) filler.Close();
                listener.Stop();
            }
        }

        [Test]
        public void AServerThatNeverAnswersIsATimeoutNamingTheWaitNotAHang()
        {
            System.Net.Sockets.TcpListener listener = Hostile(socket => System.Threading.Thread.Sleep(10000));
            try
            {
                int port = ((System.Net.IPEndPoint)listener.LocalEndpoint).Port;
                DateTime started = DateTime.UtcNow;
                var e = Assert.Throws<TetherException>(() => TetherClient.Connect(new ClientOptions { Port = port, ResponseTimeoutSeconds = 0.3, ReconnectTimeoutSeconds = 1 }));
                Assert.That((DateTime.UtcNow - started).TotalSeconds, Is.LessThan(5));
                Assert.That(e.Code, Is.EqualTo(ErrorCode.ConnectionFailed));
                Assert.That(e.Message, Is.StringContaining("did not answer PING").And.StringContaining("ResponseTimeoutSeconds"));
            }
            finally
            {
                listener.Stop();
            }
        }

        [Test]
        public void GarbageOrAnOversizedFrameFromTheServerIsAClearErrorNotACrash()
        {
            foreach (string reply in new[] { "garbage!not a header", "99999999{" })
            {
                System.Net.Sockets.TcpListener listener = Hostile(socket =>
                {
                    socket.Receive(new byte[4096]);
                    socket.Send(System.Text.Encoding.ASCII.GetBytes(reply));
                    System.Threading.Thread.Sleep(2000);
                });
                try
                {
                    int port = ((System.Net.IPEndPoint)listener.LocalEndpoint).Port;
                    var e = Assert.Throws<TetherException>(() => TetherClient.Connect(new ClientOptions { Port = port, ResponseTimeoutSeconds = 1, ReconnectTimeoutSeconds = 0.5, MaxFrameBytes = 1 << 20 }));
                    Assert.That(e.Code, Is.EqualTo(ErrorCode.ConnectionFailed));
                    Assert.That(e.Message, Is.StringContaining(reply.StartsWith("9") ? "FRAME_TOO_LARGE" : "BAD_HEADER"));
                }
                finally
                {
                    listener.Stop();
                }
            }
        }

        [Test]
        public void NoServerIsAConnectionFailureNamingTheAddressAndTheWait()
        {
            var e = Assert.Throws<TetherException>(() => TetherClient.Connect(new ClientOptions { Port = 1, ReconnectTimeoutSeconds = 0.3 }));
            Assert.That(e.Code, Is.EqualTo(ErrorCode.ConnectionFailed));
            Assert.That(e.Message, Is.StringContaining("127.0.0.1:1").And.StringContaining("ReconnectTimeoutSeconds"));
        }

        static void WaitUntil(Func<bool> done, double seconds = 10)
        {
            DateTime deadline = DateTime.UtcNow.AddSeconds(seconds);
            while (!done() && DateTime.UtcNow < deadline) Thread.Sleep(5);
        }

        [Test]
        public void TheEndOfTrainingIsReportedWithItsSummaryNotAsAnErrorAndNothingIsReconnectedOrSentAfterIt()
        {
            using (var server = new ScriptedServer(10))
            using (TetherClient client = Connect(server))
            {
                string episode = client.StartEpisode();
                Play(client, episode, 25);
                client.Flush(10);
                Assert.That(client.TrainingDone, Is.Null, "training goes on");
                Assert.That(server.Received("EPISODES_AND_GET_STATE").Count, Is.EqualTo(3));
                long sent = client.EnvStepsSent;
                Assert.That(sent, Is.EqualTo(24));  // (the 25th step waits for the observation that closes it)
                server.Close(server.TrainingDone());
                WaitUntil(() => client.TrainingDone != null);
                TrainingSummary done = client.TrainingDone;
                Assert.That(done, Is.Not.Null, "the end of training was not reported");
                Assert.That(done.Reason, Is.EqualTo("stop_at_return"));
                Assert.That(done.Updates, Is.EqualTo(30));
                Assert.That(done.EnvSteps, Is.EqualTo(123456));
                Assert.That(done.AgentSteps, Is.EqualTo(123456));
                Assert.That(done.AgentStepsTrained, Is.EqualTo(120000));
                Assert.That(done.Episodes, Is.EqualTo(987));
                Assert.That(done.WeightsSeqNo, Is.EqualTo(30));
                Assert.That(done.ReturnMean, Is.EqualTo(487.25));
                Assert.That((double)done.Json["elapsed_s"], Is.EqualTo(61.5), "a member this SDK does not name is kept");
                int received = server.ReceivedCount;
                // The game's calls go on: actions from the last model, no error, nothing recorded or sent.
                Play(client, episode, 40);  // (four batches' worth)
                Assert.That(client.EndEpisode(episode, Obs), Is.EqualTo(65.0));
                string next = client.StartEpisode();
                Play(client, next, 30);
                client.ComputeAction(Obs, new double[1]);
                client.EndEpisode(next, Obs);
                var watch = System.Diagnostics.Stopwatch.StartNew();
                client.Flush(10);
                Assert.That(watch.Elapsed.TotalSeconds, Is.LessThan(1.0), "Flush waited");
                Assert.That(client.Sending, Is.False);
                Assert.That(client.FatalError, Is.Null);
                Assert.That(client.WeightsSeqNo, Is.EqualTo(0), "the last model acts on");
                Thread.Sleep(400);  // (a reconnect would come within 50 ms)
                Assert.That(server.Connections, Is.EqualTo(1), "the client reconnected to a server whose run is done");
                Assert.That(client.Reconnects, Is.EqualTo(0));
                Assert.That(server.ReceivedCount, Is.EqualTo(received), "the client sent something after TRAINING_DONE");
                Assert.That(client.EnvStepsSent, Is.EqualTo(sent));
                // The step recorded but not cut when training ended was let go, counted as one batch.
                Assert.That(client.BatchesUnsentAtEnd, Is.EqualTo(1));
                Assert.That(client.TrainingDone, Is.SameAs(done));
            }
        }

        [Test]
        public void ABatchInFlightWhenTrainingEndsIsDiscardedAndAStrictWaitForItsAnswerReturns()
        {
            // The server answers batch 2 with TRAINING_DONE and closes: the game, waiting for that
            // batch's weights (strict on-policy), gets its action from the model it has.
            using (var server = new ScriptedServer(10) { DoneOnSeq = 2 })
            using (TetherClient client = TetherClient.Connect(new ClientOptions { Port = server.Port, Seed = 7, ReconnectTimeoutSeconds = 5, WaitForWeights = true }))
            {
                string episode = client.StartEpisode();
                var watch = System.Diagnostics.Stopwatch.StartNew();
                Play(client, episode, 40);
                Assert.That(watch.Elapsed.TotalSeconds, Is.LessThan(5.0));
                Assert.That(client.TrainingDone, Is.Not.Null);
                Assert.That(client.TrainingDone.Reason, Is.EqualTo("stop_at_return"));
                Assert.That(client.BatchesUnsentAtEnd, Is.EqualTo(1), "batch 2, in flight");
                client.EndEpisode(episode, Obs);
                client.Flush(10);
                Thread.Sleep(300);
                // Batch 2 is not resent: there is no new connection to resend it on.
                Assert.That(server.Received("EPISODES_AND_GET_STATE").Select(b => (long)b["batch_seq"]), Is.EqualTo(new long[] { 1, 2 }));
                Assert.That(server.Connections, Is.EqualTo(1));
                Assert.That(client.Reconnects, Is.EqualTo(0));
                Assert.That(client.EnvStepsSent, Is.EqualTo(10));
                Assert.That(client.FatalError, Is.Null);
            }
        }

        [Test]
        public void AClientTimeoutFromTheServerIsReportedOnceAndTheClientReconnects()
        {
            // CLIENT_TIMEOUT, unlike TRAINING_DONE, is a lost connection (§6.6): reported, then reconnected.
            using (var server = new ScriptedServer(10))
            using (TetherClient client = Connect(server))
            {
                string episode = client.StartEpisode();
                Play(client, episode, 5);
                server.Close(new JObject { { "type", "ERROR" }, { "code", "CLIENT_TIMEOUT" }, { "message", "no message for 30 s" } });
                WaitUntil(() => server.Connections >= 2);
                Assert.That(server.Connections, Is.EqualTo(2), "the client did not reconnect");
                var error = Assert.Throws<ServerErrorException>(() => client.GetAction(episode, Obs, new double[1]));
                Assert.That(error.Code, Is.EqualTo(ErrorCode.ClientTimeout));
                Play(client, episode, 20);
                client.EndEpisode(episode, Obs);
                client.Flush(10);
                Assert.That(client.Reconnects, Is.EqualTo(1));
                Assert.That(client.TrainingDone, Is.Null);
                Assert.That(client.BatchesUnsentAtEnd, Is.EqualTo(0));
                Assert.That(client.FatalError, Is.Null);
                Assert.That(client.EnvStepsSent, Is.EqualTo(25));
            }
        }

        [TestCase(null)]
        [TestCase("0.5")]
        public void GetActionAllocatesNothingInSteadyState(string share)
        {
            // A game the server keeps up with (GetActionAllocations). With a record_share, half the
            // episodes are held back (and some batches empty).
            const int perSample = 500;
            using (var server = new ScriptedServer(perSample) { RecordShare = share })
            using (TetherClient client = Connect(server))
            {
                var action = new double[1];
                // Warm-up: the episodes' arrays and the reused batches and chunks get their size (with held-back
                // episodes the batches' makeup varies, and each reused chunk meets its largest size later).
                // 100,000 calls (80,000 with a share) after warm-up.
                int warmUp = share == null ? 20 : 100;
                GetActionAllocations run = GetActionAllocations.Measure(client, 420, warmUp, (episode, e, t) => client.GetAction(episode, Obs, action),
                                                                        (episode, e) => client.EndEpisode(episode, Obs));
                Console.WriteLine("[ allocations ] " + run.Allocating + " of " + run.Calls + " GetAction calls allocated (" + run.Bytes + " bytes) while " + run.Sent + " steps were sent");
                // Batches were cut and delivered meanwhile.
                Assert.That(run.Sent, Is.GreaterThanOrEqualTo(share == null ? run.Calls - perSample : run.Calls / 4));
                Assert.That(client.EpisodesHeldBack, share == null ? (NUnit.Framework.Constraints.IResolveConstraint)Is.EqualTo(0) : Is.GreaterThan(100));
                Assert.That(run.Bytes, Is.EqualTo(0));
            }
        }
    }
}
