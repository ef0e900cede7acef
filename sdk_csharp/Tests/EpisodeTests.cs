// Records written by the SDK pass the server's checks, and say what is wrong when they cannot be written.
using System;
using System.Collections.Generic;
using System.Linq;
using Newtonsoft.Json.Linq;
using NUnit.Framework;
using Tether.Protocol;

namespace Tether.Tests
{
    [TestFixture]
    public class EpisodeTests
    {
        static bool SameNumbers(JToken a, JToken b)
        {
            if (a.Type == JTokenType.Array || a.Type == JTokenType.Object)
            {
                var ca = a.Children().ToList();
                var cb = b.Children().ToList();
                if (a.Type != b.Type || ca.Count != cb.Count) return false;
                for (int i = 0; i < ca.Count; ++i) if (!SameNumbers(ca[i], cb[i])) return false;
                return true;
            }
            if (a.Type == JTokenType.Property) return ((JProperty)a).Name == ((JProperty)b).Name && SameNumbers(((JProperty)a).Value, ((JProperty)b).Value);
            if ((a.Type == JTokenType.Float || a.Type == JTokenType.Integer) && (b.Type == JTokenType.Float || b.Type == JTokenType.Integer))
            {
                return a.Type == b.Type && (double)a == (double)b;  // an integer stays an integer, a float a float
            }
            return JToken.DeepEquals(a, b);
        }

        [Test]
        public void TheFastWriterWritesWhatEncodeWrites()
        {
            var rng = new Tether.Sampling.Rng(5);
            var cases = new[]
            {
                new { Obs = Space.Box(new long[] { 2, 2 }, -10, 10), Act = Space.MultiDiscrete(new long[] { 2, 3 }) },
                new { Obs = Space.Box(new long[] { 3 }, -1, 1), Act = Space.Box(new long[] { 2 }, -1, 1) },
                new { Obs = Space.Box(new long[] { 1 }, -1e30, 1e30), Act = Space.Discrete(4, 1) },
            };
            var writer = new RecordWriter();
            var module = new ModuleSpec { ModuleId = "m\"x", ValueObsAgents = new List<string> { "a", "b" } };
            foreach (var c in cases)
            {
                int obsDim = c.Obs.FlatDim, actDim = c.Act.FlatDim, k = c.Act.DistInputsSize, steps = 4;
                var chunk = new EpisodeChunk { EpisodeId = "ep-\u00e9\"1", IsTerminated = true };
                for (int t = 0; t <= steps; ++t)
                {
                    for (int j = 0; j < obsDim; ++j) chunk.Obs.Add((float)(rng.Normal() * Math.Pow(10, (int)(rng.Uniform() * 16) - 8)));
                    if (t == steps) break;
                    for (int j = 0; j < actDim; ++j) chunk.Actions.Add(c.Act.Kind == SpaceKind.Box ? rng.Normal() * 3 : (double)(c.Act.Kind == SpaceKind.Discrete ? 1 + t % 4 : t % 2));
                    chunk.Rewards.Add(t == 0 ? 1f : (float)rng.Normal());
                    chunk.ActionLogp.Add(t == 1 ? -2.0 : -rng.Uniform());
                    for (int j = 0; j < k; ++j) chunk.ActionDistInputs.Add((float)rng.Normal());
                }
                chunk.StepVersions.AddRange(new long[] { 3, 3, 4, int.MaxValue });
                writer.Begin();
                writer.SingleAgentRecord(chunk, c.Obs, c.Act);
                JToken fast = JToken.Parse(writer.Finish())[0];
                JToken tree = JToken.Parse(EpisodeRecords.Encode(chunk, c.Obs, c.Act).ToString(Newtonsoft.Json.Formatting.None));
                Assert.That(SameNumbers(new JObject(((JObject)fast).Properties().OrderBy(p => p.Name)), new JObject(((JObject)tree).Properties().OrderBy(p => p.Name))), Is.True,
                            fast.ToString() + "\n" + tree.ToString());
                Assert.That(fast[VersionRuns.Field].ToString(Newtonsoft.Json.Formatting.None), Is.EqualTo("[[3,2],[4,1],[2147483647,1]]"));
                module.ObservationSpace = c.Obs;
                module.ActionSpace = c.Act;
                var valueObs = new List<float>();
                for (int i = 0; i < (steps + 1) * module.ValueObsDim; ++i) valueObs.Add((float)rng.Normal());
                writer.Begin();
                writer.BeginMultiAgentRecord("ep-2", false, true);
                writer.AgentEntry("agent \"0\"", chunk, module, 3, valueObs);
                writer.EndMultiAgentRecord();
                JToken record = JToken.Parse(writer.Finish())[0];
                JToken entry = JToken.Parse(EpisodeRecords.EncodeAgentEntry(chunk, module, 3, valueObs).ToString(Newtonsoft.Json.Formatting.None));
                Assert.That((bool)record["is_truncated"] && !(bool)record["is_terminated"] && (string)record["episode_id"] == "ep-2", Is.True);
                JToken written = record["agents"]["agent \"0\""];
                Assert.That(SameNumbers(new JObject(((JObject)written).Properties().OrderBy(p => p.Name)), new JObject(((JObject)entry).Properties().OrderBy(p => p.Name))), Is.True);
            }
        }

        [Test]
        public void WrittenRecordsPassTheServersChecks()
        {
            Space obs = Space.Box(new long[] { 2, 2 }, -10, 10);
            Space act = Space.MultiDiscrete(new long[] { 2, 3 });
            var chunk = new EpisodeChunk { EpisodeId = "ep-1", IsTruncated = true };
            for (int t = 0; t <= 3; ++t)
            {
                chunk.Obs.AddRange(new[] { 0.1f * t, 1f, 2f, 3f });
                if (t == 3) break;
                chunk.Actions.AddRange(new double[] { t % 2, t % 3 });
                chunk.Rewards.Add(0.1f);
                chunk.ActionLogp.Add(-1.5);
                chunk.ActionDistInputs.AddRange(new[] { 0f, 0f, 0f, 0f, 0f });
            }
            JObject record = EpisodeRecords.Encode(chunk, obs, act);
            Assert.That(record["obs"][1].ToString(Newtonsoft.Json.Formatting.None), Is.EqualTo("[[0.1,1.0],[2.0,3.0]]"));  // float32 0.1 written as 0.1
            Assert.That(record["actions"][2].ToString(Newtonsoft.Json.Formatting.None), Is.EqualTo("[0,2]"));                // integers stay integers
            Assert.That((string)record["episode_id"], Is.EqualTo("ep-1"));
            var message = new JObject { { "type", "EPISODES" }, { "episodes", new JArray(record) } };
            byte[] wire = Messages.Encode(message);
            Assert.That(EpisodeRecords.ValidateEpisodes(Messages.Decode(wire).Body, obs, act, true), Is.EqualTo(3));

            var modules = new Dictionary<string, ModuleSpec>
            {
                { "m", ModuleSpec.FromJson("m", new JObject { { "observation_space", obs.ToJson() }, { "action_space", act.ToJson() } }) },
            };
            JObject entry = EpisodeRecords.EncodeFields(chunk, obs, act);
            entry["module"] = "m";
            entry["start_step"] = 4;
            var multi = new JObject { { "episode_id", "ep-2" }, { "agents", new JObject { { "red_0", entry } } } };
            Assert.That(EpisodeRecords.ValidateMultiAgentRecord(multi, 0, modules, true), Is.EqualTo(3));
        }

        [Test]
        public void StepVersionsAreWrittenAsRunsAndCheckedAsTheServerDoes()
        {
            Space obs = Space.Box(new long[] { 1 }, -1, 1);
            Space act = Space.Discrete(2);
            var chunk = new EpisodeChunk();
            for (int t = 0; t <= 3; ++t)
            {
                chunk.Obs.Add(0.5f);
                if (t == 3) break;
                chunk.Actions.Add(1);
                chunk.Rewards.Add(1);
            }
            JObject plain = EpisodeRecords.Encode(chunk, obs, act);
            Assert.That(plain[VersionRuns.Field], Is.Null, "no step versions: no field");
            chunk.StepVersions.AddRange(new long[] { 7, 7, 8 });
            JObject record = EpisodeRecords.Encode(chunk, obs, act);
            Assert.That(record[VersionRuns.Field].ToString(Newtonsoft.Json.Formatting.None), Is.EqualTo("[[7,2],[8,1]]"));
            Func<string, int> validate = runs =>
            {
                record[VersionRuns.Field] = JToken.Parse(runs);
                var message = new JObject { { "type", "EPISODES" }, { "episodes", new JArray(record) } };
                return EpisodeRecords.ValidateEpisodes(Messages.Decode(Messages.Encode(message)).Body, obs, act, false);
            };
            Assert.That(validate("[[7,2],[8,1]]"), Is.EqualTo(3));
            Assert.That(validate("null"), Is.EqualTo(3));
            // Integers beyond a long, and counts whose sum would wrap around to T, are refused, never overflowed.
            string max = long.MaxValue.ToString(System.Globalization.CultureInfo.InvariantCulture);
            foreach (string runs in new[] { "[[1," + max + "],[1," + max + "],[1,5]]", "[[1,1],[2,100000000000000000000000]]", "[[1,4]]" })
            {
                var e = Assert.Throws<TetherException>(() => validate(runs), runs);
                Assert.That(e.Code, Is.EqualTo(ErrorCode.EpisodeLengthMismatch), runs);
                Assert.That(e.Message, Is.StringContaining("episodes[0]: \"weights_seq_no_runs\" covers"));
            }
            // Every pair is checked (18a) before the sum (18b).
            foreach (string runs in new[] { "[[100000000000000000000000,3]]", "[[-100000000000000000000000,3]]", "[[1,5],[2,0]]", "[[1,3.0]]", "[[false,3]]", "[[1,2,0]]" })
            {
                var e = Assert.Throws<TetherException>(() => validate(runs), runs);
                Assert.That(e.Code, Is.EqualTo(ErrorCode.InvalidField), runs);
            }
            // A writer refuses versions that do not fit the chunk rather than send them.
            chunk.StepVersions.RemoveAt(2);
            var refused = Assert.Throws<TetherException>(() => EpisodeRecords.Encode(chunk, obs, act));
            Assert.That(refused.Code, Is.EqualTo(ErrorCode.InvalidArgument));
            Assert.That(refused.Message, Is.StringContaining("\"step_versions\" has 2 numbers, expected 3"));
            chunk.StepVersions.Add(-1);
            refused = Assert.Throws<TetherException>(() => new RecordWriter().SingleAgentRecord(chunk, obs, act));
            Assert.That(refused.Code, Is.EqualTo(ErrorCode.InvalidArgument));
        }

        [Test]
        public void ChunksThatDoNotFitTheSpacesAreRefusedNamingTheField()
        {
            var chunk = new EpisodeChunk();
            chunk.Obs.AddRange(new[] { 0f, 0f, 0f });  // 3 observation numbers for 1 step of a 2-wide space
            chunk.Actions.Add(1);
            chunk.Rewards.Add(1);
            var e = Assert.Throws<TetherException>(() => EpisodeRecords.Encode(chunk, Space.Box(new long[] { 2 }, -1, 1), Space.Discrete(2)));
            Assert.That(e.Code, Is.EqualTo(ErrorCode.InvalidArgument));
            Assert.That(e.Message, Is.StringContaining("\"obs\" has 3 numbers, expected 4"));
        }
    }
}
