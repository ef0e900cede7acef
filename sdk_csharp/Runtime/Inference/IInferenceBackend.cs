// The inference seam: what runs a module's model on a batch of observations.
using System;

namespace Tether.Inference
{
    /// <summary>
    /// Runs one model on batches of observations. The SDK keeps one per module
    /// and swaps in a new one (loaded off the main thread) when the server
    /// sends new weights. Implementations: <see cref="OnnxRuntimeBackend"/>
    /// (ONNX Runtime's C API by P/Invoke) and, inside Unity, the Inference
    /// Engine backend. Not thread-safe: one thread loads it, then one thread runs it.
    /// </summary>
    public interface IInferenceBackend : IDisposable
    {
        /// <summary>
        /// Loads an ONNX model whose input <paramref name="inputName"/> takes
        /// (batch, obs) floats and whose output <paramref name="outputName"/>
        /// gives (batch, dist inputs) floats. Throws TetherException (INFERENCE_FAILED)
        /// saying why the runtime refused it.
        /// </summary>
        void Load(byte[] model, string inputName, string outputName);

        /// <summary>Whether a model is loaded.</summary>
        bool Loaded { get; }

        /// <summary>The model's observation width (0 when its input does not fix it).</summary>
        int ObsDim { get; }

        /// <summary>The model's output width (0 when its output does not fix it).</summary>
        int OutDim { get; }

        /// <summary>
        /// Runs the model on <paramref name="batch"/> rows of <paramref name="obsDim"/>
        /// observations and writes batch rows of <paramref name="outDim"/> outputs.
        /// Allocates nothing once a batch size has been seen.
        /// </summary>
        void Run(float[] obs, int batch, int obsDim, float[] output, int outDim);
    }
}
