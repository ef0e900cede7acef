// The inference seam for Dict and Tuple observations (protocol 1.4, §12.1): one model input per leaf.
using Tether.Protocol;

namespace Tether.Inference
{
    /// <summary>
    /// A backend that runs the model of a Dict or Tuple observation space (protocol 1.4, §8.6, §12.1):
    /// one input per leaf, named by its leaf path, uint8 [batch, *shape] for a byte leaf and float32
    /// [batch, size] otherwise. <see cref="IInferenceBackend.Run"/> then takes flat rows (§8.6) and feeds
    /// each leaf's values to its input by name. <see cref="OnnxRuntimeBackend"/> implements it; a backend
    /// without this interface is refused such a model (INFERENCE_FAILED).
    /// </summary>
    public interface ILeafInferenceBackend : IInferenceBackend
    {
        /// <summary>
        /// Loads a model whose inputs are <paramref name="observationSpace"/>'s leaf paths and whose output
        /// <paramref name="outputName"/> gives (batch, dist inputs) floats. Throws TetherException
        /// (INFERENCE_FAILED) saying why the runtime refused it, or naming an input it lacks.
        /// </summary>
        void Load(byte[] model, Space observationSpace, string outputName);
    }

    /// <summary>Loading a module's model into a backend by its observation space.</summary>
    public static class BackendLoading
    {
        /// <summary>
        /// Loads <paramref name="model"/>: by <paramref name="inputName"/> for a Box, Discrete or
        /// MultiDiscrete observation space; leaf by leaf (<see cref="ILeafInferenceBackend"/>) for a Dict or
        /// Tuple, INFERENCE_FAILED when the backend cannot take one input per leaf.
        /// </summary>
        public static void Load(IInferenceBackend backend, byte[] model, Space observationSpace, string inputName, string outputName)
        {
            Load(backend, model, observationSpace, inputName, outputName, null);
        }

        /// <summary>
        /// <see cref="Load(IInferenceBackend, byte[], Space, string, string)"/> for a module whose model may have
        /// memory (protocol 1.5, §12.1): with a <paramref name="state"/>, its state inputs and outputs are bound
        /// (<see cref="IRecurrentInferenceBackend.BindState"/>): INVALID_FIELD when the model lacks one, and
        /// INFERENCE_FAILED when the backend cannot carry a state.
        /// </summary>
        public static void Load(IInferenceBackend backend, byte[] model, Space observationSpace, string inputName, string outputName, RecurrentState state)
        {
            var recurrent = backend as IRecurrentInferenceBackend;
            if (state != null && recurrent == null)
            {
                throw new TetherException(ErrorCode.InferenceFailed, "the inference backend " + backend.GetType().Name +
                                          " cannot run a model with memory (a recurrent state, protocol 1.5): use OnnxRuntimeBackend");
            }
            if (observationSpace == null || !observationSpace.IsComposite)
            {
                backend.Load(model, inputName, outputName);
            }
            else
            {
                var leafBackend = backend as ILeafInferenceBackend;
                if (leafBackend == null)
                {
                    throw new TetherException(ErrorCode.InferenceFailed, "the inference backend " + backend.GetType().Name + " cannot run the model of a " +
                                              observationSpace.Kind + " observation space (one input per leaf, protocol 1.4): use OnnxRuntimeBackend");
                }
                leafBackend.Load(model, observationSpace, outputName);
            }
            if (recurrent != null) recurrent.BindState(state);
        }
    }
}
