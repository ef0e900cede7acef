// The inference seam for models with memory (protocol 1.5, §12.1): the recurrent state fed and read by name.
using Tether.Protocol;

namespace Tether.Inference
{
    /// <summary>
    /// A backend that runs a model with memory (protocol 1.5, §9.1, §12.1): besides the observation the
    /// model takes the state before the step, one float32 [batch, size] input per state tensor, and besides
    /// the dist inputs it returns the state after the step, one output per tensor. The caller keeps the
    /// state (per actor, §12.4) as rows of <see cref="RecurrentState.Width"/> floats, tensor k's values at
    /// k × size of a row; several actors' rows are stacked. <see cref="OnnxRuntimeBackend"/> implements it;
    /// a backend without this interface is refused such a model (INFERENCE_FAILED).
    /// </summary>
    public interface IRecurrentInferenceBackend : IInferenceBackend
    {
        /// <summary>
        /// Binds the loaded model's state inputs and outputs by name (after a Load; a new Load forgets them):
        /// INVALID_FIELD when the model lacks one of <paramref name="state"/>'s inputs or outputs (§12.1), or
        /// has one that is not float32 [batch, size]. Null: a model without memory.
        /// </summary>
        void BindState(RecurrentState state);

        /// <summary>The state bound by <see cref="BindState"/>, or null.</summary>
        RecurrentState State { get; }

        /// <summary>
        /// <see cref="IInferenceBackend.Run"/> for a model with memory: feeds <paramref name="stateIn"/> (batch
        /// rows of the state's width) with the observations and writes the state after the step into
        /// <paramref name="stateOut"/> (the same layout; it may be <paramref name="stateIn"/> itself). Allocates
        /// nothing once a batch size has been seen.
        /// </summary>
        void Run(float[] obs, int batch, int obsDim, float[] output, int outDim, float[] stateIn, float[] stateOut);

        /// <summary>
        /// <see cref="Run(float[], int, int, float[], int, float[], float[])"/> for observations given as bytes
        /// (a byte box's, protocol 1.4; see <see cref="IByteInferenceBackend"/>).
        /// </summary>
        void Run(byte[] obs, int batch, int obsDim, float[] output, int outDim, float[] stateIn, float[] stateOut);
    }
}
