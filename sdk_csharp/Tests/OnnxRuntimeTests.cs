// The ONNX Runtime backend against the real native library and a real model.
using System;
using System.IO;
using Newtonsoft.Json.Linq;
using NUnit.Framework;
using Tether.Inference;
using Tether.Protocol;

namespace Tether.Tests
{
    [TestFixture]
    public class OnnxRuntimeTests
    {
        // The C++ SDK's test model (4 -> 64 -> 64 -> 2) and the outputs Python's onnxruntime gave for it.
        internal static string DataDir { get { return Path.Combine(Path.Combine(Path.GetDirectoryName(Vectors.Directory.TrimEnd('/')), ".."), "sdk_cpp/tests/data"); } }

        internal static JObject Reference { get { return JObject.Parse(File.ReadAllText(Path.Combine(DataDir, "policy_4x64x64x2.json"))); } }

        static byte[] Model { get { return File.ReadAllBytes(Path.Combine(DataDir, (string)Reference["model"])); } }

        [Test]
        public void BatchedRunsGivePythonsOutputs()
        {
            JObject reference = Reference;
            var rows = (JArray)reference["observations"];
            int n = rows.Count;
            var obs = new float[n * 4];
            for (int r = 0; r < n; ++r)
            {
                for (int j = 0; j < 4; ++j) obs[r * 4 + j] = (float)rows[r][j];
            }
            using (var backend = new OnnxRuntimeBackend())
            {
                backend.Load(Model, (string)reference["input_name"], (string)reference["output_name"]);
                Assert.That(backend.ObsDim, Is.EqualTo(4));
                Assert.That(backend.OutDim, Is.EqualTo(2));
                var output = new float[n * 2];
                backend.Run(obs, n, 4, output, 2);
                var single = new float[2];
                for (int r = 0; r < n; ++r)
                {
                    for (int j = 0; j < 2; ++j) Assert.That(output[r * 2 + j], Is.EqualTo((float)reference["outputs"][r][j]).Within(1e-5));
                    // One row alone (another bound batch size) gives the same.
                    var row = new float[4];
                    Array.Copy(obs, r * 4, row, 0, 4);
                    backend.Run(row, 1, 4, single, 2);
                    Assert.That(single[0], Is.EqualTo(output[r * 2]).Within(1e-6));
                }
                for (int batch = 1; batch <= 6; ++batch) backend.Run(obs, Math.Min(batch, n), 4, output, 2);  // more sizes than are kept bound
            }
            Assert.That(OnnxRuntimeBackend.RuntimeVersion, Is.StringMatching(@"^\d+\.\d+"));
        }

        [Test]
        public void RefusalsSayWhatWasWrong()
        {
            using (var backend = new OnnxRuntimeBackend())
            {
                var e = Assert.Throws<TetherException>(() => backend.Run(new float[4], 1, 4, new float[2], 2));
                Assert.That(e.Code, Is.EqualTo(ErrorCode.NotReady));
                e = Assert.Throws<TetherException>(() => backend.Load(new byte[] { 1, 2, 3, 4, 5 }, "x", "y"));
                Assert.That(e.Code, Is.EqualTo(ErrorCode.InferenceFailed));
                Assert.That(e.Message, Is.StringContaining("loading the model"));
                Assert.That(backend.Loaded, Is.False);
                e = Assert.Throws<TetherException>(() => backend.Load(Model, "no_such_input", "action_dist_inputs"));
                Assert.That(e.Message, Is.StringContaining("no input 'no_such_input'").And.StringContaining("onnx::Gemm_0"));
                backend.Load(Model, "onnx::Gemm_0", "action_dist_inputs");
                e = Assert.Throws<TetherException>(() => backend.Run(new float[8], 1, 8, new float[2], 2));
                Assert.That(e.Code, Is.EqualTo(ErrorCode.InvalidArgument));
                Assert.That(e.Message, Is.StringContaining("width 8 does not match the model's 4"));
                e = Assert.Throws<TetherException>(() => backend.Run(new float[4], 2, 4, new float[4], 2));
                Assert.That(e.Message, Is.StringContaining("fewer than 2 rows"));
            }
        }

        [Test]
        public void AHandleIsReleasedAfterTheOnesThatDependOnIt()
        {
            // Finalizers of a backend nobody disposed run in any order: an environment released
            // before its session (or a session before its binding) would be a use after free.
            var released = new System.Collections.Generic.List<string>();
            var env = new OrtHandle((IntPtr)1, p => released.Add("env"));
            var session = new OrtHandle((IntPtr)2, p => released.Add("session"), env);
            var binding = new OrtHandle((IntPtr)3, p => released.Add("binding"), session);
            env.Dispose();
            session.Dispose();
            Assert.That(released, Is.Empty);  // both still needed by the binding
            binding.Dispose();
            Assert.That(released, Is.EqualTo(new[] { "binding", "session", "env" }));
            // A dependency released already: refused, and the new handle's pointer released at once.
            released.Clear();
            var gone = new OrtHandle((IntPtr)4, p => released.Add("gone"));
            gone.Dispose();
            Assert.Throws<TetherException>(() => new OrtHandle((IntPtr)5, p => released.Add("orphan"), gone));
            Assert.That(released, Is.EqualTo(new[] { "gone", "orphan" }));
            // And the backend wires them so: its session on its environment, each binding on the session.
            using (var backend = new OnnxRuntimeBackend())
            {
                backend.Load(Model, "onnx::Gemm_0", "action_dist_inputs");
                backend.Run(new float[4], 1, 4, new float[2], 2);
                var flags = System.Reflection.BindingFlags.NonPublic | System.Reflection.BindingFlags.Instance;
                var realEnv = (OrtHandle)typeof(OnnxRuntimeBackend).GetField("env", flags).GetValue(backend);
                var realSession = (OrtHandle)typeof(OnnxRuntimeBackend).GetField("session", flags).GetValue(backend);
                Assert.That(realSession.DependsOn, Is.SameAs(realEnv));
                var bindings = (System.Collections.IEnumerable)typeof(OnnxRuntimeBackend).GetField("bindings", flags).GetValue(backend);
                int count = 0;
                foreach (object bound in bindings)
                {
                    var io = (OrtHandle)bound.GetType().GetField("Io").GetValue(bound);
                    Assert.That(io.DependsOn, Is.SameAs(realSession));
                    ++count;
                }
                Assert.That(count, Is.EqualTo(1));
            }
        }

        [Test]
        public void RunsAllocateNothingAndSwapsLeakNothing()
        {
            byte[] model = Model;
            var obs = new float[256 * 4];
            var output = new float[256 * 2];
            using (var backend = new OnnxRuntimeBackend())
            {
                backend.Load(model, "onnx::Gemm_0", "action_dist_inputs");
                backend.Run(obs, 1, 4, output, 2);
                backend.Run(obs, 256, 4, output, 2);
                int collections = GC.CollectionCount(0);
                long allocated = GC.GetAllocatedBytesForCurrentThread();
                for (int i = 0; i < 100000; ++i) backend.Run(obs, 1 + (i & 1) * 255, 4, output, 2);
                allocated = GC.GetAllocatedBytesForCurrentThread() - allocated;
                Assert.That(allocated, Is.EqualTo(0), "100,000 runs allocated " + allocated + " bytes");
                Assert.That(GC.CollectionCount(0), Is.EqualTo(collections), "100,000 runs caused a gen-0 collection");
            }
            // Hot-swapping models again and again: native memory stays flat. The first loads grow
            // the process (ONNX Runtime's and the allocator's own structures, ~30 MB here), so
            // they come first; a model left undisposed costs ~290 KB, 58 MB over the 200 measured.
            long before = 0;
            for (int i = 0; i < 300; ++i)
            {
                if (i == 100) before = ResidentBytes();
                using (var backend = new OnnxRuntimeBackend())
                {
                    backend.Load(model, "onnx::Gemm_0", "action_dist_inputs");
                    backend.Run(obs, 256, 4, output, 2);
                }
            }
            long grown = ResidentBytes() - before;
            Assert.That(grown, Is.LessThan(8L * 1024 * 1024), "200 loads after 100 grew the process by " + grown + " bytes");
        }

        static long ResidentBytes()
        {
            GC.Collect();
            GC.WaitForPendingFinalizers();
            foreach (string line in File.ReadAllLines("/proc/self/status"))
            {
                if (line.StartsWith("VmRSS:")) return long.Parse(line.Split(new[] { ' ', '\t' }, StringSplitOptions.RemoveEmptyEntries)[1]) * 1024;
            }
            return 0;
        }
    }
}
