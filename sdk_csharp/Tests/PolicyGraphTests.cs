// The managed backend (PolicyGraph read from ONNX bytes, run in C#) against
// ONNX Runtime on the same models, and against broken models.
using System;
using System.IO;
using NUnit.Framework;
using Tether.Client;
using Tether.Inference;
using Tether.Protocol;

namespace Tether.Tests
{
    [TestFixture]
    public class PolicyGraphTests
    {
        static byte[] Data(string name) { return File.ReadAllBytes(Path.Combine(ScriptedServer.Repo, "sdk_csharp/Tests/data", name)); }

        static void Parity(byte[] model, string input, string output, int obsDim, int outDim)
        {
            var rng = new Random(42);
            using (var reference = new OnnxRuntimeBackend())
            using (var managed = new ManagedPolicyBackend())
            {
                reference.Load(model, input, output);
                managed.Load(model, input, output);
                Assert.That(managed.ObsDim, Is.EqualTo(obsDim));
                Assert.That(managed.OutDim, Is.EqualTo(outDim));
                foreach (int batch in new[] { 1, 37, 3, 256 })
                {
                    var obs = new float[batch * obsDim];
                    for (int i = 0; i < obs.Length; ++i) obs[i] = (float)(rng.NextDouble() * 6 - 3);
                    var expected = new float[batch * outDim];
                    var actual = new float[batch * outDim];
                    reference.Run(obs, batch, obsDim, expected, outDim);
                    managed.Run(obs, batch, obsDim, actual, outDim);
                    for (int i = 0; i < expected.Length; ++i)
                    {
                        Assert.That(actual[i], Is.EqualTo(expected[i]).Within(2e-5 + 1e-5 * Math.Abs(expected[i])), "batch " + batch + ", output " + i);
                    }
                }
            }
        }

        [Test]
        public void TheServersDiscretePolicyGivesOnnxRuntimesOutputs()
        {
            Parity(ScriptedServer.TestModel, "onnx::Gemm_0", "action_dist_inputs", 4, 2);
            Parity(ScriptedServer.GroupModel, "onnx::Gemm_0", "action_dist_inputs", 4, 4);
        }

        [Test]
        public void TheServersBoxPolicyWithItsLogStdGivesOnnxRuntimesOutputs()
        {
            Parity(Data("policy_box_3x8x2.onnx"), "onnx::Gemm_0", "action_dist_inputs", 3, 4);
            using (var managed = new ManagedPolicyBackend())
            {
                managed.Load(Data("policy_box_3x8x2.onnx"), "onnx::Gemm_0", "action_dist_inputs");
                var output = new float[2 * 4];
                managed.Run(new float[6], 2, 3, output, 4);
                Assert.That(output[2], Is.EqualTo(-0.3f).Within(1e-6));  // log_std, the same on every row
                Assert.That(output[7], Is.EqualTo(0.2f).Within(1e-6));
            }
        }

        [Test]
        public void ItsTanhStaysWithinAMillionthOfMathTanhAndKeepsNaN()
        {
            double worst = 0;
            for (double x = -30; x <= 30; x += 0.00037)
            {
                float y = ManagedPolicyBackend.Tanh((float)x);
                Assert.That(Math.Abs(y), Is.LessThanOrEqualTo(1f), "at " + x);
                worst = Math.Max(worst, Math.Abs(y - Math.Tanh((float)x)));
            }
            Assert.That(worst, Is.LessThan(1e-6));
            Assert.That(ManagedPolicyBackend.Tanh(float.PositiveInfinity), Is.EqualTo(1f).Within(1e-6));
            Assert.That(ManagedPolicyBackend.Tanh(float.NegativeInfinity), Is.EqualTo(-1f).Within(1e-6));
            Assert.That(float.IsNaN(ManagedPolicyBackend.Tanh(float.NaN)), Is.True);
        }

        [Test]
        public void AnMlpAsTorchExportsOneGivesOnnxRuntimesOutputs()
        {
            Parity(Data("policy_matmul_relu.onnx"), "obs", "out", 5, 3);  // MatMul+Add, Relu, Sigmoid, Gemm alpha/beta
        }

        [Test]
        public void RunningAllocatesNothingOnceABatchSizeWasSeen()
        {
            using (var managed = new ManagedPolicyBackend())
            {
                managed.Load(ScriptedServer.TestModel, "onnx::Gemm_0", "action_dist_inputs");
                var obs = new float[256 * 4];
                var output = new float[256 * 2];
                managed.Run(obs, 256, 4, output, 2);
                long before = GC.GetAllocatedBytesForCurrentThread();
                for (int i = 0; i < 1000; ++i) managed.Run(obs, i % 2 == 0 ? 256 : 1, 4, output, 2);
                Assert.That(GC.GetAllocatedBytesForCurrentThread() - before, Is.EqualTo(0));
            }
        }

        [Test]
        public void AnUnsupportedOperatorOrWrongNamesAreRefusedNamingThem()
        {
            using (var managed = new ManagedPolicyBackend())
            {
                var e = Assert.Throws<TetherException>(() => managed.Load(Data("policy_softmax.onnx"), "obs", "out"));
                Assert.That(e.Code, Is.EqualTo(ErrorCode.InferenceFailed));
                Assert.That(e.Message, Is.StringContaining("Softmax"));
                e = Assert.Throws<TetherException>(() => managed.Load(ScriptedServer.TestModel, "obs", "action_dist_inputs"));
                Assert.That(e.Message, Is.StringContaining("no input 'obs'"));
                e = Assert.Throws<TetherException>(() => managed.Load(ScriptedServer.TestModel, "onnx::Gemm_0", "logits"));
                Assert.That(e.Message, Is.StringContaining("no output 'logits'"));
                Assert.That(managed.Loaded, Is.False);
                managed.Load(ScriptedServer.TestModel, "onnx::Gemm_0", "action_dist_inputs");
                e = Assert.Throws<TetherException>(() => managed.Run(new float[5], 1, 5, new float[2], 2));
                Assert.That(e.Message, Is.StringContaining("takes 4 observation values"));
            }
        }

        [Test]
        public void BrokenModelsAreInferenceFailuresNeverAnotherException()
        {
            byte[] good = ScriptedServer.TestModel;
            var rng = new Random(7);
            int refused = 0;
            for (int trial = 0; trial < 3000; ++trial)
            {
                byte[] bad;
                if (trial % 3 == 0)
                {
                    bad = new byte[rng.Next(0, good.Length)];  // truncated
                    Array.Copy(good, bad, bad.Length);
                }
                else
                {
                    bad = (byte[])good.Clone();
                    for (int k = rng.Next(1, 8); k > 0; --k) bad[rng.Next(bad.Length)] = (byte)rng.Next(256);
                }
                using (var managed = new ManagedPolicyBackend())
                {
                    try
                    {
                        managed.Load(bad, "onnx::Gemm_0", "action_dist_inputs");
                        var output = new float[managed.OutDim];
                        managed.Run(new float[managed.ObsDim], 1, managed.ObsDim, output, managed.OutDim);
                    }
                    catch (TetherException e)
                    {
                        Assert.That(e.Code, Is.EqualTo(ErrorCode.InferenceFailed).Or.EqualTo(ErrorCode.InvalidArgument), e.Message);
                        ++refused;
                    }
                }
            }
            Assert.That(refused, Is.GreaterThan(1000));  // truncations at least
        }

        [Test]
        public void TheClientTrainsWithTheManagedBackend()
        {
            using (var server = new ScriptedServer(10))
            using (TetherClient client = TetherClient.Connect(new Tether.Client.ClientOptions
            {
                Port = server.Port, Seed = 3, ReconnectTimeoutSeconds = 5, BackendFactory = () => new ManagedPolicyBackend(),
            }))
            {
                string episode = client.StartEpisode();
                var obs = new float[] { 0.1f, 0.2f, -0.1f, 0.0f };
                var action = new double[1];
                for (int i = 0; i < 30; ++i)
                {
                    client.GetAction(episode, obs, action);
                    client.LogReturns(episode, 1.0);
                }
                client.EndEpisode(episode, obs);
                client.Flush(10);
                Assert.That(client.EnvStepsSent, Is.EqualTo(30));
            }
        }
    }
}
