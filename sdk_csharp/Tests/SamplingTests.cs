// The generator and the distributions beyond the shared vectors.
using System;
using System.Linq;
using NUnit.Framework;
using Tether.Protocol;
using Tether.Sampling;

namespace Tether.Tests
{
    [TestFixture]
    public class SamplingTests
    {
        [Test]
        public void TheGeneratorGivesTheCppSdksSequence()
        {
            // Printed by the C++ SDK's tether::Rng(42): next_u64 three times, then uniform() and normal().
            var rng = new Rng(42);
            Assert.That(rng.NextU64(), Is.EqualTo(1546998764402558742UL));
            Assert.That(rng.NextU64(), Is.EqualTo(6990951692964543102UL));
            Assert.That(rng.NextU64(), Is.EqualTo(12544586762248559009UL));
            Assert.That(rng.Uniform(), Is.EqualTo(0.92469294532538759).Within(1e-15));
            Assert.That(rng.Normal(), Is.EqualTo(0.38346179126769431).Within(1e-12));
        }

        [Test]
        public void DiscreteDrawsFollowTheSoftmaxAndCarryTheirLogp()
        {
            Space space = Space.Discrete(3, 5);
            float[] logits = { 0f, 1f, 2f };
            const int rows = 1;
            var rng = new Rng(7);
            var counts = new int[3];
            var record = new double[rows];
            var env = new double[rows];
            var logp = new double[rows];
            const int n = 60000;
            for (int i = 0; i < n; ++i)
            {
                Distributions.SampleRows(space, logits, rows, rng, true, record, env, logp);
                int index = (int)record[0] - 5;
                Assert.That(index, Is.InRange(0, 2));
                Assert.That(env[0], Is.EqualTo(record[0]));
                ++counts[index];
                double expected = Distributions.LogProb(space, logits, 0, 3, record, 0, 1);
                Assert.That(logp[0], Is.EqualTo(expected).Within(1e-12));
            }
            double total = Math.Exp(0) + Math.Exp(1) + Math.Exp(2);
            for (int k = 0; k < 3; ++k) Assert.That(counts[k] / (double)n, Is.EqualTo(Math.Exp(k) / total).Within(0.01));
        }

        [Test]
        public void BoxRecordsTheRawSampleAndTheEngineGetsItClipped()
        {
            Space space = Space.Box(new long[] { 2 }, -1.0, 1.0);
            float[] inputs = { 0.9f, -0.9f, 0f, 0f };  // std 1: often outside the box
            var rng = new Rng(3);
            var record = new double[2];
            var env = new double[2];
            var logp = new double[1];
            bool sawOutside = false;
            for (int i = 0; i < 1000; ++i)
            {
                Distributions.SampleRows(space, inputs, 1, rng, true, record, env, logp);
                Assert.That(logp[0], Is.EqualTo(Distributions.LogProb(space, inputs, 0, 4, record, 0, 2)).Within(1e-9));
                for (int j = 0; j < 2; ++j)
                {
                    Assert.That((double)(float)record[j], Is.EqualTo(record[j]));  // float32 values
                    Assert.That(env[j], Is.InRange(-1.0, 1.0));
                    sawOutside = sawOutside || Math.Abs(record[j]) > 1.0;
                }
                Distributions.SampleRows(space, inputs, 1, rng, false, record, env, logp);  // a 1.2 server
                Assert.That(record, Is.EqualTo(env));
                Assert.That(logp[0], Is.EqualTo(Distributions.LogProb(space, inputs, 0, 4, record, 0, 2)).Within(1e-9));
            }
            Assert.That(sawOutside, Is.True);
            var mode = new double[2];
            Distributions.Deterministic(space, inputs, 0, mode, 0);
            Assert.That(mode[0], Is.EqualTo(0.9).Within(1e-6));
        }

        [Test]
        public void RowsAreDrawnInOrderFromOneSequence()
        {
            Space space = Space.MultiDiscrete(new long[] { 2, 5 });
            var fill = new Rng(11);
            float[] dist = Enumerable.Range(0, 9 * 7).Select(_ => (float)fill.Normal()).ToArray();
            var all = new double[9 * 2];
            var allEnv = new double[9 * 2];
            var allLogp = new double[9];
            Distributions.SampleRows(space, dist, 9, new Rng(5), true, all, allEnv, allLogp);
            var one = new Rng(5);
            var record = new double[2];
            var env = new double[2];
            var logp = new double[1];
            for (int r = 0; r < 9; ++r)
            {
                var row = new float[7];
                Array.Copy(dist, r * 7, row, 0, 7);
                Distributions.SampleRows(space, row, 1, one, true, record, env, logp);
                Assert.That(all[2 * r], Is.EqualTo(record[0]));
                Assert.That(all[2 * r + 1], Is.EqualTo(record[1]));
                Assert.That(allLogp[r], Is.EqualTo(logp[0]));
            }
        }

        [Test]
        public void TwoCategoriesDrawAsTheGeneralCategoricalBitForBit()
        {
            // Discrete(2) takes its own path; MultiDiscrete([2]) the general one, draw for draw.
            var fill = new Rng(13);
            const int rows = 4000;
            var dist = new float[rows * 2];
            for (int i = 0; i < dist.Length; ++i) dist[i] = (float)(fill.Normal() * (i % 7 == 0 ? 30 : 2));
            for (int r = 0; r < rows; r += 9) dist[2 * r + 1] = dist[2 * r];  // (ties)
            dist[2] = 0f;
            dist[3] = -0f;
            dist[4] = -0f;
            dist[5] = 0f;
            dist[6] = 0f;
            dist[7] = 800f;  // (exp underflows to 0: the lower one is never drawn)
            dist[8] = -800f;
            dist[9] = 0f;
            dist[10] = float.MaxValue;
            dist[11] = -float.MaxValue;
            var two = new double[rows];
            var twoEnv = new double[rows];
            var twoLogp = new double[rows];
            var general = new double[rows];
            var generalEnv = new double[rows];
            var generalLogp = new double[rows];
            Distributions.SampleRows(Space.Discrete(2), dist, rows, new Rng(17), true, two, twoEnv, twoLogp);
            Distributions.SampleRows(Space.MultiDiscrete(new long[] { 2 }), dist, rows, new Rng(17), true, general, generalEnv, generalLogp);
            int seconds = 0;
            for (int r = 0; r < rows; ++r)
            {
                Assert.That(two[r], Is.EqualTo(general[r]), "row " + r);
                Assert.That(twoEnv[r], Is.EqualTo(two[r]));
                Assert.That(BitConverter.DoubleToInt64Bits(twoLogp[r]), Is.EqualTo(BitConverter.DoubleToInt64Bits(generalLogp[r])), "row " + r);
                seconds += (int)two[r];
            }
            Assert.That(seconds, Is.InRange(rows / 4, 3 * rows / 4));
            var shifted = new double[rows];
            Distributions.SampleRows(Space.Discrete(2, 3), dist, rows, new Rng(17), true, shifted, twoEnv, twoLogp);
            for (int r = 0; r < rows; ++r) Assert.That(shifted[r], Is.EqualTo(two[r] + 3));
        }

        [TestCase(2, 0)]
        [TestCase(2, 3)]
        [TestCase(5, 0)]
        [TestCase(5, -2)]
        [TestCase(100, 7)]
        public void ALogpLeftForLaterIsTheDrawsBitForBit(int n, int start)
        {
            // The steady-state frames draw without the log and take it as the rows are written: the same
            // draws, and later the same logp, bit for bit (ties, signed zeros, an exp that underflows).
            var fill = new Rng(29);
            const int rows = 4000;
            var dist = new float[rows * n];
            for (int i = 0; i < dist.Length; ++i) dist[i] = (float)(fill.Normal() * (i % 7 == 0 ? 30 : 2));
            for (int r = 0; r < rows; r += 9) dist[n * r + 1] = dist[n * r];
            dist[n] = 0f;
            dist[n + 1] = -0f;
            dist[2 * n] = 800f;
            dist[2 * n + 1] = -800f;
            dist[3 * n] = float.MaxValue;
            dist[3 * n + 1] = -float.MaxValue;
            if (n > 64)
            {
                // (more categories than the draw keeps exps for, some masked)
                for (int r = 4; r < rows; ++r) for (int j = r % 5; j < n; j += 3) dist[r * n + j] = ActionMask.MaskedLogit;
            }
            Space space = Space.Discrete(n, start);
            var now = new double[rows];
            var nowLogp = new double[rows];
            var later = new double[rows];
            var laterLogp = new double[rows];
            var env = new double[rows];
            Distributions.SampleRows(space, dist, rows, new Rng(31), true, now, 0, env, 0, nowLogp, 0);
            Distributions.SampleRows(space, dist, rows, new Rng(31), true, later, 0, env, 0, laterLogp, 0, true);
            var drawn = new int[n];
            for (int r = 0; r < rows; ++r)
            {
                Assert.That(later[r], Is.EqualTo(now[r]), "row " + r);
                Assert.That(env[r], Is.EqualTo(later[r]));
                Assert.That(double.IsNaN(laterLogp[r]), Is.True, "row " + r + " is left for later");
                double taken = Distributions.DrawnCategoricalLogp(dist, r * n, n, (int)(later[r] - start));
                Assert.That(BitConverter.DoubleToInt64Bits(taken), Is.EqualTo(BitConverter.DoubleToInt64Bits(nowLogp[r])), "row " + r);
                Assert.That(nowLogp[r], Is.LessThanOrEqualTo(0).And.GreaterThan(double.NegativeInfinity));
                ++drawn[(int)(now[r] - start)];
            }
            if (n <= 5) Assert.That(drawn.Min(), Is.GreaterThan(rows / (4 * n)), "every category is drawn");
            else Assert.That(drawn.Count(c => c > 0), Is.GreaterThan(n * 9 / 10), "nearly every category is drawn");
            Assert.Throws<TetherException>(() => Distributions.DrawnCategoricalLogp(dist, 0, n, n));
            Assert.Throws<TetherException>(() => Distributions.DrawnCategoricalLogp(dist, 0, n, -1));
        }

        [Test]
        public void WrongSizesAreInvalidArguments()
        {
            Space space = Space.Discrete(2);
            var e = Assert.Throws<TetherException>(() => Distributions.LogProb(space, new double[3], 0, 3, new double[1], 0, 1));
            Assert.That(e.Code, Is.EqualTo(ErrorCode.InvalidArgument));
            Assert.That(e.Message, Is.StringContaining("needs 2"));
            e = Assert.Throws<TetherException>(() => Distributions.SampleRows(space, new float[2], 2, new Rng(1), true, new double[2], new double[2], new double[2]));
            Assert.That(e.Code, Is.EqualTo(ErrorCode.InvalidArgument));
            e = Assert.Throws<TetherException>(() => Distributions.LogProb(space, new double[2], 0, 2, new[] { 2.0 }, 0, 1));
            Assert.That(e.Message, Is.StringContaining("outside"));
        }
    }
}
