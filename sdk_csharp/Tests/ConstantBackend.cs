// A backend for scripted-server tests whose model does not matter: every row's outputs are (-5, 5) pairs
// (action 1 nearly always), whatever the width.
using Tether.Inference;

namespace Tether.Tests
{
    sealed class ConstantBackend : IInferenceBackend
    {
        public void Load(byte[] model, string inputName, string outputName) { Loaded = true; }
        public bool Loaded { get; private set; }
        public int ObsDim { get { return 0; } }
        public int OutDim { get { return 0; } }
        public void Run(float[] obs, int batch, int obsDim, float[] output, int outDim)
        {
            for (int i = 0; i < batch * outDim; ++i) output[i] = i % 2 == 0 ? -5f : 5f;
        }
        public void Dispose() { }
    }
}
