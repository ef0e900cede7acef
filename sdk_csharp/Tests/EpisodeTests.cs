// Records written by the SDK pass the server's checks, and say what is wrong when they cannot be written.
using System.Collections.Generic;
using Newtonsoft.Json.Linq;
using NUnit.Framework;
using Tether.Protocol;

namespace Tether.Tests
{
    [TestFixture]
    public class EpisodeTests
    {
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
