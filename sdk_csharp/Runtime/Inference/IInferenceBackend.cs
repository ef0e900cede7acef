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

    /// <summary>
    /// A backend that also takes observations as bytes (protocol 1.4): the model of a byte box
    /// (a uint8 Box, §8.1, such as a camera image) takes uint8 [batch, *shape] (§12.1). The
    /// clients hand such a backend a byte observation as it is; a backend without this
    /// interface gets its values as floats. <see cref="OnnxRuntimeBackend"/> implements it.
    /// </summary>
    public interface IByteInferenceBackend : IInferenceBackend
    {
        /// <summary>Whether the loaded model's input takes uint8 (a byte box's model) rather than float32.</summary>
        bool InputIsBytes { get; }

        /// <summary>
        /// Runs the model on <paramref name="batch"/> rows of <paramref name="obsDim"/> byte
        /// observations (each row an observation's values in row-major order) and writes batch
        /// rows of <paramref name="outDim"/> outputs. A model whose input takes float32 is fed the
        /// bytes' values. Allocates nothing once a batch size has been seen.
        /// </summary>
        void Run(byte[] obs, int batch, int obsDim, float[] output, int outDim);
    }
}
