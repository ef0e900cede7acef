// Float32Text writes the shortest decimal that reads back as the same float32, and the record
// writer falls back to the runtime's exact formatting where it cannot decide.
using System;
using System.Globalization;
using Newtonsoft.Json.Linq;
using NUnit.Framework;
using Tether.Protocol;

namespace Tether.Tests
{
    [TestFixture]
    public class Float32TextTests
    {
        static float FromBits(int bits)
        {
            return BitConverter.ToSingle(BitConverter.GetBytes(bits), 0);
        }

        static int BitsOf(float value)
        {
            return BitConverter.ToInt32(BitConverter.GetBytes(value), 0);
        }

        static string Text(float value)
        {
            var into = new char[64];
            int n = Float32Text.Write(value, into);
            return n == 0 ? null : new string(into, 0, n);
        }

        // Significant digits of a decimal's text.
        static int Digits(string text)
        {
            int e = text.IndexOfAny(new[] { 'e', 'E' });
            if (e >= 0) text = text.Substring(0, e);
            return text.Replace("-", "").Replace(".", "").TrimStart('0').TrimEnd('0').Length;
        }

        [Test]
        public void KnownValuesAreWrittenShortestAsJsonFloats()
        {
            var cases = new[]
            {
                Tuple.Create(0.1f, "0.1"), Tuple.Create(1f, "1.0"), Tuple.Create(0f, "0.0"), Tuple.Create(-0f, "-0.0"),
                Tuple.Create(100f, "100.0"), Tuple.Create(-2.5f, "-2.5"), Tuple.Create(0.0001f, "0.0001"), Tuple.Create(1e-5f, "1e-5"),
                Tuple.Create(1e15f, "1000000000000000.0"), Tuple.Create(1e16f, "1e16"), Tuple.Create(123456.7f, "123456.7"),
                Tuple.Create(float.MaxValue, "3.4028235e38"), Tuple.Create(float.Epsilon, "1e-45"), Tuple.Create(-1.17549435e-38f, "-1.1754944e-38"),
                Tuple.Create(16777216f, "16777216.0"), Tuple.Create(3.14159265f, "3.1415927"), Tuple.Create(0.3f, "0.3"),
                Tuple.Create(2f / 3f, "0.6666667"), Tuple.Create(-0.00012345f, "-0.00012345"), Tuple.Create(1.5e-7f, "1.5e-7"),
            };
            foreach (var c in cases) Assert.That(Text(c.Item1), Is.EqualTo(c.Item2), c.Item2);
            Assert.That(Float32Text.Write(float.NaN, new char[64]), Is.EqualTo(0));
            Assert.That(Float32Text.Write(float.NegativeInfinity, new char[64]), Is.EqualTo(0));
        }

        [Test]
        public void EveryValueReadsBackExactlyAndIsNoLongerThanTheRuntimes()
        {
            var rng = new Random(3);
            int decided = 0, undecided = 0;
            for (int i = 0; i < 300000; ++i)
            {
                float value = FromBits(rng.Next() ^ (rng.Next(2) << 31));
                if (float.IsNaN(value) || float.IsInfinity(value)) continue;
                string text = Text(value);
                if (text == null)
                {
                    ++undecided;
                    continue;
                }
                ++decided;
                float back = float.Parse(text, NumberStyles.Float, CultureInfo.InvariantCulture);
                if (BitsOf(back) != BitsOf(value) || (float)double.Parse(text, NumberStyles.Float, CultureInfo.InvariantCulture) != value)
                {
                    Assert.Fail(value.ToString("R", CultureInfo.InvariantCulture) + " was written " + text);
                }
                string runtime = value.ToString("R", CultureInfo.InvariantCulture);
                if (Digits(text) > Digits(runtime)) Assert.Fail(text + " is longer than " + runtime);
                if (text.IndexOf('.') < 0 && text.IndexOf('e') < 0) Assert.Fail(text + " reads as an integer");
            }
            // (values whose rounding boundary is itself a short decimal, nearly all whole numbers from 2^24
            // to 2^31: about one in 230 of all bit patterns)
            Assert.That(undecided, Is.LessThan(decided / 100));
        }

        [Test]
        public void ObservationsOfAGameAreAllDecided()
        {
            var rng = new Tether.Sampling.Rng(11);
            for (int i = 0; i < 100000; ++i)
            {
                double g = rng.Normal();
                float value = i % 3 == 0 ? (float)g : i % 3 == 1 ? (float)(g * 1000) : (float)Math.Round(g * 100) / 100f;
                string text = Text(value);
                Assert.That(text, Is.Not.Null, value.ToString("R", CultureInfo.InvariantCulture));
                Assert.That(float.Parse(text, NumberStyles.Float, CultureInfo.InvariantCulture), Is.EqualTo(value));
            }
        }

        [Test]
        public void AValueItCannotDecideIsWrittenExactlyInARecord()
        {
            var rng = new Random(5);
            float value;
            do value = FromBits(rng.Next()); while (float.IsNaN(value) || float.IsInfinity(value) || Text(value) != null);
            var obsSpace = Space.Box(new long[] { 1 }, float.MinValue, float.MaxValue);
            var chunk = new EpisodeChunk { EpisodeId = "e" };
            chunk.Obs.Add(value);
            chunk.Obs.Add(0.5f);
            chunk.Actions.Add(1);
            chunk.Rewards.Add(value);
            chunk.ActionLogp.Add(-0.5);
            chunk.ActionDistInputs.Add(0.25f);
            chunk.ActionDistInputs.Add(value);
            var writer = new RecordWriter();
            writer.Begin();
            writer.SingleAgentRecord(chunk, obsSpace, Space.Discrete(2));
            JToken record = JToken.Parse(writer.Finish())[0];
            Assert.That((float)(double)record["obs"][0][0], Is.EqualTo(value));
            Assert.That((float)(double)record["rewards"][0], Is.EqualTo(value));
            Assert.That((float)(double)record["action_dist_inputs"][0][1], Is.EqualTo(value));
            Assert.That((double)record["obs"][1][0], Is.EqualTo(0.5));
        }
    }
}
