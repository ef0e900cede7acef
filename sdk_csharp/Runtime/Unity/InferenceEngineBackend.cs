// The inference seam on Unity's Inference Engine (com.unity.ai.inference): a
// project needs no native plugin. Compiled only when that package is installed
// (TETHER_INFERENCE_ENGINE, set by Tether.Unity.asmdef's versionDefines).
#if UNITY_5_3_OR_NEWER && TETHER_INFERENCE_ENGINE
using System;
using System.Collections.Concurrent;
using Tether.Inference;
using Tether.Protocol;
using Unity.InferenceEngine;

namespace Tether.Unity
{
    /// <summary>
    /// Runs a module's policy with Unity's Inference Engine on the CPU. Unity
    /// imports ONNX files only in the Editor, so the model the server streams is
    /// read by <see cref="PolicyGraph"/> (the same reader the managed backend
    /// runs, tested outside Unity) and rebuilt with the functional API. The SDK
    /// loads models on its I/O thread, but Inference Engine objects belong to the
    /// main thread: <see cref="Load"/> only reads the graph, the first
    /// <see cref="Run"/> after a swap compiles it (a one-time cost on that
    /// frame), and a backend disposed on another thread is released by the next
    /// Run of any backend on the main thread.
    /// </summary>
    public sealed class InferenceEngineBackend : IInferenceBackend
    {
        static readonly ConcurrentQueue<IDisposable> releaseOnMainThread = new ConcurrentQueue<IDisposable>();
        static int mainThread = -1;

        PolicyGraph graph;
        Worker worker;
        Tensor<float> input;
        int inputRows = -1;

        /// <summary>Call once from the main thread (TetherManager does): later Runs must come from it.</summary>
        public static void BindMainThread() { mainThread = Environment.CurrentManagedThreadId; }

        /// <inheritdoc />
        public bool Loaded { get { return graph != null; } }

        /// <inheritdoc />
        public int ObsDim { get { return graph == null ? 0 : graph.InputWidth; } }

        /// <inheritdoc />
        public int OutDim { get { return graph == null ? 0 : graph.OutputWidth; } }

        /// <inheritdoc />
        public void Load(byte[] onnx, string inputName, string outputName)
        {
            graph = PolicyGraph.Read(onnx, inputName, outputName);
        }

        // Values of the graph as functional tensors; the Concat of a constant row uses
        // ones(batch, 1) x row, so the batch stays dynamic.
        Model Build()
        {
            var functional = new FunctionalGraph();
            var values = new FunctionalTensor[graph.Widths.Count];
            values[0] = functional.AddInput<float>(new DynamicTensorShape(-1, graph.InputWidth), "obs");
            FunctionalTensor ones = null;
            foreach (PolicyStep step in graph.Steps)
            {
                int width = graph.Widths[step.Output];
                switch (step.Kind)
                {
                    case PolicyStepKind.Dense:
                    {
                        int inWidth = graph.Widths[step.Input];
                        var transposed = new float[inWidth * width];  // in x out, as MatMul takes it
                        for (int o = 0; o < width; ++o)
                        {
                            for (int i = 0; i < inWidth; ++i) transposed[i * width + o] = step.Weights[o * inWidth + i];
                        }
                        values[step.Output] = Functional.MatMul(values[step.Input], Functional.Constant(new TensorShape(inWidth, width), transposed))
                                              + Functional.Constant(new TensorShape(width), step.Bias);
                        break;
                    }
                    case PolicyStepKind.AddBias:
                        values[step.Output] = values[step.Input] + Functional.Constant(new TensorShape(width), step.Bias);
                        break;
                    case PolicyStepKind.Tanh:
                        values[step.Output] = Functional.Tanh(values[step.Input]);
                        break;
                    case PolicyStepKind.Relu:
                        values[step.Output] = Functional.Relu(values[step.Input]);
                        break;
                    case PolicyStepKind.Sigmoid:
                        values[step.Output] = Functional.Sigmoid(values[step.Input]);
                        break;
                    case PolicyStepKind.Concat:
                    {
                        var parts = new FunctionalTensor[step.Parts.Length];
                        for (int k = 0; k < parts.Length; ++k)
                        {
                            ConcatPart part = step.Parts[k];
                            if (part.Value >= 0)
                            {
                                parts[k] = values[part.Value];
                                continue;
                            }
                            if (ones == null)
                            {
                                ones = Functional.MatMul(values[0], Functional.Constant(new TensorShape(graph.InputWidth, 1), new float[graph.InputWidth]))
                                       + Functional.Constant(new TensorShape(1), new[] { 1f });
                            }
                            parts[k] = Functional.MatMul(ones, Functional.Constant(new TensorShape(1, part.Width), part.Constant));
                        }
                        values[step.Output] = Functional.Concat(parts, 1);
                        break;
                    }
                }
            }
            functional.AddOutput(values[graph.OutputValue], "dist_inputs");
            return functional.Compile();
        }

        /// <inheritdoc />
        public void Run(float[] obs, int batch, int obsDim, float[] output, int outDim)
        {
            IDisposable stale;
            while (releaseOnMainThread.TryDequeue(out stale)) stale.Dispose();
            if (graph == null) throw new TetherException(ErrorCode.NotReady, "no model is loaded");
            if (obsDim != graph.InputWidth || outDim != graph.OutputWidth)
            {
                throw new TetherException(ErrorCode.InferenceFailed, "the model maps " + graph.InputWidth + " observation values to " + graph.OutputWidth + " outputs, not " + obsDim + " to " + outDim);
            }
            if (worker == null)
            {
                try
                {
                    worker = new Worker(Build(), BackendType.CPU);
                }
                catch (Exception e)
                {
                    throw new TetherException(ErrorCode.InferenceFailed, "Inference Engine could not build the model: " + e.Message, e);
                }
            }
            if (input == null || inputRows != batch)
            {
                if (input != null) input.Dispose();
                input = new Tensor<float>(new TensorShape(batch, obsDim));
                inputRows = batch;
            }
            input.Upload(obs, batch * obsDim);
            worker.Schedule(input);
            var result = worker.PeekOutput() as Tensor<float>;
            if (result == null) throw new TetherException(ErrorCode.InferenceFailed, "the model gave no float output");
            result.CompleteAllPendingOperations();  // the CPU jobs
            var values = result.AsReadOnlyNativeArray();
            if (values.Length < batch * outDim) throw new TetherException(ErrorCode.InferenceFailed, "the model gave " + values.Length + " outputs, expected " + batch * outDim);
            for (int i = 0, n = batch * outDim; i < n; ++i) output[i] = values[i];
        }

        /// <summary>Releases the worker and its tensors (on the main thread: from another one, at the next Run).</summary>
        public void Dispose()
        {
            IDisposable w = worker, t = input;
            worker = null;
            input = null;
            graph = null;
            bool onMain = mainThread < 0 || Environment.CurrentManagedThreadId == mainThread;
            foreach (IDisposable d in new[] { t, w })
            {
                if (d == null) continue;
                if (onMain) d.Dispose();
                else releaseOnMainThread.Enqueue(d);
            }
        }
    }
}
#endif
