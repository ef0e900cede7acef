// The inference seam on Unity's Inference Engine (com.unity.ai.inference): a
// project needs no native plugin. Compiled only when that package is installed
// (TETHER_INFERENCE_ENGINE, set by Tether.Unity.asmdef's versionDefines).
#if UNITY_5_3_OR_NEWER && TETHER_INFERENCE_ENGINE
using System;
using System.IO;
using Tether.Inference;
using Tether.Protocol;
using Unity.InferenceEngine;

namespace Tether.Unity
{
    /// <summary>
    /// Runs a module's policy with Unity's Inference Engine on the CPU. The SDK
    /// loads models on its I/O thread, but Inference Engine objects belong to
    /// the main thread: <see cref="Load"/> only keeps the ONNX bytes, and the
    /// first <see cref="Run"/> after a swap converts the model and makes the
    /// worker (a one-time cost on the frame that first uses a new model).
    /// </summary>
    public sealed class InferenceEngineBackend : IInferenceBackend
    {
        readonly string cacheDirectory;
        byte[] pending;
        string inputName;
        string outputName;
        Model model;
        Worker worker;
        Tensor<float> input;
        int inputRows = -1;
        int inputWidth = -1;

        /// <summary>A backend that writes models it converts under <paramref name="cacheDirectory"/> (Application.temporaryCachePath).</summary>
        public InferenceEngineBackend(string cacheDirectory)
        {
            this.cacheDirectory = cacheDirectory;
        }

        /// <inheritdoc />
        public bool Loaded { get { return pending != null || worker != null; } }

        /// <inheritdoc />
        public int ObsDim { get { return 0; } }

        /// <inheritdoc />
        public int OutDim { get { return 0; } }

        /// <inheritdoc />
        public void Load(byte[] onnx, string inputName, string outputName)
        {
            if (onnx == null || onnx.Length == 0) throw new TetherException(ErrorCode.InferenceFailed, "the model is empty");
            pending = onnx;
            this.inputName = inputName;
            this.outputName = outputName;
        }

        void Build()
        {
            // The ONNX importer reads a file: the model goes through the cache directory.
            string path = Path.Combine(cacheDirectory, "tether-" + Guid.NewGuid().ToString("N") + ".onnx");
            try
            {
                File.WriteAllBytes(path, pending);
                model = new ONNXModelConverter(path).Convert();
            }
            catch (Exception e)
            {
                throw new TetherException(ErrorCode.InferenceFailed, "Inference Engine could not import the model: " + e.Message, e);
            }
            finally
            {
                if (File.Exists(path)) File.Delete(path);
            }
            pending = null;
            worker = new Worker(model, BackendType.CPU);
        }

        /// <inheritdoc />
        public void Run(float[] obs, int batch, int obsDim, float[] output, int outDim)
        {
            if (pending != null) Build();
            if (worker == null) throw new TetherException(ErrorCode.NotReady, "no model is loaded");
            if (input == null || inputRows != batch || inputWidth != obsDim)
            {
                if (input != null) input.Dispose();
                input = new Tensor<float>(new TensorShape(batch, obsDim));
                inputRows = batch;
                inputWidth = obsDim;
            }
            input.Upload(obs, batch * obsDim);
            worker.SetInput(inputName, input);
            worker.Schedule();
            var result = worker.PeekOutput(outputName) as Tensor<float>;
            if (result == null) throw new TetherException(ErrorCode.InferenceFailed, "the model has no float output '" + outputName + "'");
            float[] values = result.DownloadToArray();  // waits for the CPU jobs
            if (values.Length < batch * outDim) throw new TetherException(ErrorCode.InferenceFailed, "the model gave " + values.Length + " outputs, expected " + batch * outDim);
            Array.Copy(values, output, batch * outDim);
        }

        /// <summary>Releases the worker and its tensors.</summary>
        public void Dispose()
        {
            if (input != null) input.Dispose();
            if (worker != null) worker.Dispose();
            input = null;
            worker = null;
            pending = null;
        }
    }
}
#endif
