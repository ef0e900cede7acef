// Dict and Tuple spaces and action masks (protocol 1.4, §8.6, §11.6): the shared vectors
// (composite.json, logp.json's masked_* cases) and the pieces they do not reach.
using System;
using System.Collections.Generic;
using System.Linq;
using Newtonsoft.Json.Linq;
using NUnit.Framework;
using Tether.Client;
using Tether.Protocol;
using Tether.Sampling;

namespace Tether.Tests
{
    [TestFixture]
    public class CompositeTests
    {
        static void CheckKind(string kind, Action<JObject> check)
        {
            int ran = 0;
            Vectors.Check("composite.json", (file, c) =>
            {
                if ((string)c["kind"] != kind) return;
                ++ran;
                check(c);
            });
            Assert.That(ran, Is.GreaterThan(0), "composite.json has no " + kind + " cases");
        }

        [Test]
        public void EveryCaseKindIsKnown()
        {
            var kinds = ((JArray)Vectors.Load("composite.json")["cases"]).Select(c => (string)c["kind"]).Distinct();
            Assert.That(kinds, Is.EquivalentTo(new[] { "space", "observation", "episode", "mask" }));
        }

        [Test]
        public void SpaceCases()
        {
            CheckKind("space", c =>
            {
                if (c["error"] != null)
                {
                    Vectors.ExpectError((string)c["error"], () => Space.FromJson(c["space"]));
                    return;
                }
                Space s = Space.FromJson(c["space"]);
                Vectors.Expect(s.IsComposite, "not composite");
                Vectors.Expect(s.FlatDim == (int)c["flat_dim"], "flat_dim " + s.FlatDim);
                var leaves = (JArray)c["leaves"];
                Vectors.Expect(s.Leaves.Count == leaves.Count, "leaf count " + s.Leaves.Count);
                for (int i = 0; i < leaves.Count; ++i)
                {
                    SpaceLeaf leaf = s.Leaves[i];
                    Vectors.Expect(leaf.Path == (string)leaves[i]["path"] && leaf.Offset == (int)leaves[i]["offset"] && leaf.Size == (int)leaves[i]["size"] &&
                           (leaf.IsBytes ? "uint8" : "float32") == (string)leaves[i]["dtype"], "leaf " + i + " is " + leaf.Path + "@" + leaf.Offset);
                    Vectors.Expect(s.LeafIndex(leaf.Path) == i, "LeafIndex " + leaf.Path);
                    // The model's input of the leaf (§12.1): bytes in the leaf's shape, floats [size].
                    JToken input = c["inputs"][i];
                    long[] dims = leaf.IsBytes ? leaf.Space.Shape : new long[] { leaf.Size };
                    Vectors.Expect((string)input["name"] == leaf.Path && dims.SequenceEqual(input["dims"].Select(d => (long)d)), "input " + i);
                }
                // The canonical form re-parses to the same space.
                Vectors.Expect(MultiAgentClient.SameSpace(Space.FromJson(s.ToJson()), s), "round trip");
            });
        }

        // One observation as the vectors give it (a Dict's leaves by key, a Tuple's by position), set leaf by leaf.
        static void SetLeaves(ObservationLeaves into, JToken value, Space space, string prefix)
        {
            if (!space.IsComposite)
            {
                into.Set(prefix, Vectors.Flat(value).Select(x => (float)x).ToArray());
                return;
            }
            var members = space.Kind == SpaceKind.Dict ? ((JObject)value).Properties().Select(p => new KeyValuePair<string, JToken>(p.Name, p.Value))
                                                       : ((JArray)value).Select((v, i) => new KeyValuePair<string, JToken>(i.ToString(), v));
            foreach (KeyValuePair<string, JToken> member in members)
            {
                string path = prefix.Length == 0 ? member.Key : prefix + "." + member.Key;
                Space child = space.Children.Where(ch => ch.Key == member.Key).Select(ch => ch.Value).FirstOrDefault();
                if (child == null) into.Set(path, Vectors.Flat(member.Value).Select(x => (float)x).ToArray());  // no such leaf: refused
                else SetLeaves(into, member.Value, child, path);
            }
        }

        [Test]
        public void ObservationCases()
        {
            CheckKind("observation", c =>
            {
                Space s = Space.FromJson(c["space"]);
                var leaves = new ObservationLeaves(s);
                var row = new float[s.FlatDim];
                if (c["error"] != null)
                {
                    Vectors.ExpectError((string)c["error"], () =>
                    {
                        SetLeaves(leaves, c["observation"], s, "");
                        leaves.CopyRow(row, 0);
                    });
                    return;
                }
                SetLeaves(leaves, c["observation"], s, "");
                leaves.CopyRow(row, 0);
                Vectors.Expect(row.Select(x => (double)x).SequenceEqual(Vectors.Flat(c["flat_row"]).Select(x => (double)(float)x)), "flat row " + string.Join(",", row));
            });
        }

        [Test]
        public void EpisodeCases()
        {
            CheckKind("episode", c =>
            {
                Space obs = Space.FromJson(c["observation_space"]);
                Space act = Space.ActionFromJson(c["action_space"]);
                Vectors.CheckEpisodesCase(c, obs, act, ModuleSpec.ReadActionMask(c["action_mask"], obs, act));
                if (c["flat_rows"] != null) ExpectLeavesOfFlatRows(c, obs, act);
            });
        }

        // The case's "flat_rows" (§8.6: each observation's leaves in leaf order) recorded as the client
        // records them and written as it sends them (RecordWriter, JSON numbers and 1.4 tensors in the
        // attachment): each leaf holds the values the case's body gives that leaf.
        static void ExpectLeavesOfFlatRows(JObject c, Space obs, Space act)
        {
            Message body = Messages.Decode(System.Text.Encoding.UTF8.GetBytes((string)c["body"]));
            var record = (JObject)body.Body["episodes"][0];
            var chunk = new EpisodeChunk();
            chunk.Obs.AddRange(Vectors.Flat(c["flat_rows"]).Select(v => (float)v));
            chunk.Actions.AddRange(Vectors.Flat(record["actions"]));
            chunk.Rewards.AddRange(Vectors.Flat(record["rewards"]));
            chunk.ActionLogp.AddRange(Vectors.Flat(record["action_logp"]));
            chunk.IsTerminated = (bool)record["is_terminated"];
            foreach (bool tensors in new[] { false, true })
            {
                var writer = new RecordWriter();
                writer.BeginMessage("EPISODES_AND_GET_STATE", tensors);
                writer.SingleAgentRecord(chunk, obs, act);
                writer.EndEpisodes();
                byte[] frame = null;
                int length = writer.EndMessage(ref frame);
                Message sent = Messages.Decode(frame.Skip(Framing.HeaderSize).Take(length - Framing.HeaderSize).ToArray());
                foreach (SpaceLeaf leaf in obs.Leaves)
                {
                    double[] ours = LeafValues(sent.Body["episodes"][0]["obs"][leaf.Path], sent.Attachment);
                    double[] theirs = LeafValues(record["obs"][leaf.Path], body.Attachment);
                    Assert.That(ours, Is.EqualTo(theirs), c["name"] + " leaf " + leaf.Path + (tensors ? " (tensors)" : " (JSON)"));
                }
            }
        }

        // A leaf's values in a record: a tensor object (§10.9, in the attachment or inline) or JSON numbers.
        static double[] LeafValues(JToken leaf, byte[] attachment)
        {
            if (!Tensors.IsTensor(leaf)) return Vectors.Flat(leaf);
            Tensor tensor = Tensors.Decode(leaf, attachment);
            return Enumerable.Range(0, tensor.Count).Select(i => tensor[i]).ToArray();
        }

        [Test]
        public void MaskCases()
        {
            CheckKind("mask", c =>
            {
                Space act = Space.ActionFromJson(c["action_space"]);
                float[] mask = Vectors.Flat(c["mask"]).Select(x => (float)x).ToArray();
                Action check = () => ActionMask.OfActionSpace(act).CheckRow(mask, 0, "mask");
                if (c["error"] != null && c["error"].Type != JTokenType.Null) Vectors.ExpectError((string)c["error"], check);
                else check();
            });
        }

        [Test]
        public void MaskedLogpCases()
        {
            // logp.json's masked_* cases: masked logits (-1e9) give the log-probability under the masked softmax.
            JObject data = Vectors.Load("logp.json");
            var masked = ((JArray)data["cases"]).Where(c => ((string)c["name"]).StartsWith("masked_", StringComparison.Ordinal)).ToList();
            Assert.That(masked.Count, Is.GreaterThan(0));
            foreach (JToken c in masked)
            {
                Space s = Space.FromJson(c["space"]);
                double[] inputs = Vectors.Flat(c["dist_inputs"]);
                double[] action = Vectors.Flat(c["action"]);
                double got = Distributions.LogProb(s, inputs, 0, inputs.Length, action, 0, action.Length);
                Assert.That(got, Is.EqualTo((double)c["logp"]).Within(1e-9), (string)c["name"]);
                float[] inputs32 = inputs.Select(x => (float)x).ToArray();
                Assert.That(Distributions.LogProb(s, inputs32, 0, inputs32.Length, action, 0, action.Length), Is.EqualTo((double)c["logp"]).Within(1e-5),
                            (string)c["name"] + " (float32)");
            }
        }

        [Test]
        public void CompositeActionSpacesAreRefused()
        {
            var dict = JObject.Parse("{\"type\": \"Dict\", \"spaces\": {\"a\": {\"type\": \"Discrete\", \"n\": 2}}}");
            Assert.That(Space.FromJson(dict).IsComposite, Is.True);
            var e = Assert.Throws<TetherException>(() => Space.ActionFromJson(dict));
            Assert.That(e.Code, Is.EqualTo(ErrorCode.InvalidField));
            var module = new JObject { { "observation_space", Space.Box(new long[] { 2 }, 0, 1).ToJson() }, { "action_space", dict } };
            Assert.That(Assert.Throws<TetherException>(() => ModuleSpec.FromJson("m", module)).Code, Is.EqualTo(ErrorCode.InvalidField));
        }

        [Test]
        public void ValueObsAgentsAreAnArrayOfAgentIds()
        {
            // (§9.1) an array of strings, or absent or null; a string is not split into one-letter ids
            Func<string, ModuleSpec> module = agents =>
            {
                var json = new JObject { { "observation_space", Space.Box(new long[] { 2 }, 0, 1).ToJson() }, { "action_space", Space.Discrete(2).ToJson() } };
                if (agents != null) json["value_obs_agents"] = JToken.Parse(agents);
                return ModuleSpec.FromJson("m", json);
            };
            Assert.That(module("[\"a_0\", \"a_1\"]").ValueObsAgents, Is.EqualTo(new[] { "a_0", "a_1" }));
            Assert.That(module(null).ValueObsAgents, Is.Empty);
            Assert.That(module("null").ValueObsAgents, Is.Empty);
            foreach (string bad in new[] { "\"a_0\"", "{\"a_0\": 1}", "3", "[\"a_0\", 1]", "[null]" })
            {
                var e = Assert.Throws<TetherException>(() => module(bad), bad);
                Assert.That(e.Code, Is.EqualTo(ErrorCode.InvalidField), bad);
                Assert.That(e.Message, Is.StringContaining("value_obs_agents"), bad);
            }
        }

        static Space Board()
        {
            return Space.Dict(new Dictionary<string, Space>
            {
                { "board", Space.Box(new long[] { 2, 2 }, 0, 1) }, { "action_mask", Space.Box(new long[] { 3 }, 0, 1, "int8") },
            });
        }

        [TestCase("\"action_mask\"", null)]
        [TestCase("null", null)]
        [TestCase("3", "INVALID_FIELD")]                  // not a string
        [TestCase("\"nothing\"", "INVALID_FIELD")]        // no such leaf
        [TestCase("\"board\"", "INVALID_FIELD")]          // not K values
        public void ModuleActionMaskIsResolvedOrRefused(string mask, string error)
        {
            var module = new JObject
            {
                { "observation_space", Board().ToJson() }, { "action_space", Space.Discrete(3).ToJson() }, { "action_mask", JToken.Parse(mask) },
            };
            if (error != null)
            {
                Vectors.ExpectError(error, () => ModuleSpec.FromJson("m", module));
                return;
            }
            ModuleSpec spec = ModuleSpec.FromJson("m", module);
            if (mask == "null")
            {
                Assert.That(spec.ActionMask, Is.Null);
                return;
            }
            Assert.That(spec.ActionMask.Leaf, Is.EqualTo("action_mask"));
            Assert.That(spec.ActionMask.Offset, Is.EqualTo(0));
            Assert.That(spec.ActionMask.Size, Is.EqualTo(3));
        }

        [Test]
        public void AMaskNeedsADiscreteActionSpaceAndACompositeObservation()
        {
            Assert.That(Assert.Throws<TetherException>(() => ActionMask.Resolve(Board(), Space.Box(new long[] { 3 }, -1, 1), "action_mask")).Code,
                        Is.EqualTo(ErrorCode.InvalidField));
            Assert.That(Assert.Throws<TetherException>(() => ActionMask.Resolve(Space.Box(new long[] { 3 }, 0, 1), Space.Discrete(3), "action_mask")).Code,
                        Is.EqualTo(ErrorCode.InvalidField));
        }

        [Test]
        public void AMaskAllowsOnlyItsOnes()
        {
            ActionMask discrete = ActionMask.OfActionSpace(Space.Discrete(3, 5));
            var mask = new List<double> { 0, 1, 0 };
            Assert.That(discrete.Allows(mask, 0, new List<double> { 6 }, 0), Is.True);
            Assert.That(discrete.Allows(mask, 0, new List<double> { 5 }, 0), Is.False);
            ActionMask multi = ActionMask.OfActionSpace(Space.MultiDiscrete(new long[] { 2, 3 }));
            var both = new List<double> { 0, 1, 1, 0, 1 };
            Assert.That(multi.Allows(both, 0, new List<double> { 1, 2 }, 0), Is.True);
            Assert.That(multi.Allows(both, 0, new List<double> { 1, 1 }, 0), Is.False);
            Assert.That(multi.Allows(both, 0, new List<double> { 0, 2 }, 0), Is.False);
        }

        [Test]
        public void SpacesKeepTheirLimits()
        {
            Space leaf = Space.Box(new long[] { 1 }, 0, 1);
            Space nested = leaf;
            for (int i = 0; i < Space.MaxNesting; ++i) nested = Space.Tuple(nested);
            Assert.That(nested.Leaves[0].Path, Is.EqualTo("0.0.0.0.0.0.0.0"));
            Assert.That(Assert.Throws<TetherException>(() => Space.Tuple(nested)).Code, Is.EqualTo(ErrorCode.InvalidArgument));
            Assert.That(Space.Tuple(Enumerable.Repeat(leaf, Space.MaxLeaves).ToArray()).Leaves.Count, Is.EqualTo(64));
            Assert.That(Assert.Throws<TetherException>(() => Space.Tuple(Enumerable.Repeat(leaf, Space.MaxLeaves + 1).ToArray())).Code,
                        Is.EqualTo(ErrorCode.InvalidArgument));
            Assert.That(Assert.Throws<TetherException>(() => Space.Dict(new Dictionary<string, Space> { { "a b", leaf } })).Code,
                        Is.EqualTo(ErrorCode.InvalidArgument));
            // Ordinal order: upper case before lower case, as code points sort.
            Space keys = Space.Dict(new Dictionary<string, Space> { { "b", leaf }, { "a", leaf }, { "B", leaf }, { "_", leaf } });
            Assert.That(keys.Leaves.Select(l => l.Path), Is.EqualTo(new[] { "B", "_", "a", "b" }));
        }

        [Test]
        public void ObservationLeavesRefuseWhatIsNotALeafOfTheirSize()
        {
            var leaves = new ObservationLeaves(Board());
            int board = leaves.Index("board");
            Assert.That(board, Is.EqualTo(1));
            Assert.That(Assert.Throws<TetherException>(() => leaves.Set("nope", new float[1])).Code, Is.EqualTo(ErrorCode.ObsLeafMismatch));
            Assert.That(Assert.Throws<TetherException>(() => leaves.Set(7, new float[1])).Code, Is.EqualTo(ErrorCode.ObsLeafMismatch));
            Assert.That(Assert.Throws<TetherException>(() => leaves.Set(board, new float[3])).Code, Is.EqualTo(ErrorCode.ObsShapeMismatch));
            leaves.Set(board, new byte[] { 1, 0, 1, 1 });
            Assert.That(leaves.Complete, Is.False);
            Assert.That(Assert.Throws<TetherException>(() => leaves.CopyRow(new float[7], 0)).Code, Is.EqualTo(ErrorCode.ObsLeafMismatch));
            leaves.Set("action_mask", new float[] { 1, 1, 0 });
            var row = new float[7];
            leaves.CopyRow(row, 0);
            Assert.That(row, Is.EqualTo(new float[] { 1, 1, 0, 1, 0, 1, 1 }));
            Assert.That(Assert.Throws<TetherException>(() => new ObservationLeaves(Space.Discrete(2))).Code, Is.EqualTo(ErrorCode.InvalidArgument));
        }

        [Test]
        public void RowChecksNameTheLeafAndTheMask()
        {
            Space s = Space.Dict(new Dictionary<string, Space>
            {
                { "cam", Space.ByteBox(new long[] { 2 }) }, { "m", Space.Box(new long[] { 2 }, 0, 1) },
            });
            ActionMask mask = ActionMask.Resolve(s, Space.Discrete(2), "m");
            ObservationRows.Check(s, mask, new float[] { 0, 255, 0, 1 }, 0, "obs", true);
            var e = Assert.Throws<TetherException>(() => ObservationRows.Check(s, mask, new float[] { 0, 256, 0, 1 }, 0, "obs", true));
            Assert.That(e.Code, Is.EqualTo(ErrorCode.ObsDtypeMismatch));
            StringAssert.Contains("'cam'", e.Message);
            Assert.That(Assert.Throws<TetherException>(() => ObservationRows.Check(s, mask, new float[] { 0, 1, float.NaN, 1 }, 0, "obs", true)).Code,
                        Is.EqualTo(ErrorCode.NonFiniteValue));
            Assert.That(Assert.Throws<TetherException>(() => ObservationRows.Check(s, mask, new float[] { 0, 1, 0, 0.5f }, 0, "obs", true)).Code,
                        Is.EqualTo(ErrorCode.InvalidActionMask));
            Assert.That(Assert.Throws<TetherException>(() => ObservationRows.Check(s, mask, new float[] { 0, 1, 0, 0 }, 0, "obs", true)).Code,
                        Is.EqualTo(ErrorCode.ActionMaskEmpty));
            ObservationRows.Check(s, mask, new float[] { 0, 1, 0, 0 }, 0, "final", false);  // a final observation's mask is not checked
        }
    }
}
