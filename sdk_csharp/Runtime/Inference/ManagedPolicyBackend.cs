// The inference seam in plain C#: no native library, no Unity package; runs
// wherever the game's scripts run (IL2CPP, WebGL, consoles).
using System;
using Tether.Protocol;

namespace Tether.Inference
{
    /// <summary>
    /// Runs a <see cref="PolicyGraph"/> (an MLP policy read from the server's
    /// ONNX model) in managed code: the fallback that needs no native plugin
    /// and no package. Under mono it is about 3x ONNX Runtime's P/Invoke for
    /// one row and far slower for a batched frame (no SIMD), so prefer ONNX
    /// Runtime or Inference Engine for many agents. A model with operators it
    /// does not know is refused at load with INFERENCE_FAILED naming them.
    /// Allocates nothing per run once a batch size has been seen.
    /// </summary>
    public sealed class ManagedPolicyBackend : IInferenceBackend
    {
        PolicyGraph graph;
        float[][] values = new float[0][];
        int rowsAllocated;

        /// <inheritdoc />
        public bool Loaded { get { return graph != null; } }

        /// <inheritdoc />
        public int ObsDim { get { return graph == null ? 0 : graph.InputWidth; } }

        /// <inheritdoc />
        public int OutDim { get { return graph == null ? 0 : graph.OutputWidth; } }

        /// <summary>The graph loaded (null before <see cref="Load"/>).</summary>
        public PolicyGraph Graph { get { return graph; } }

        /// <inheritdoc />
        public void Load(byte[] model, string inputName, string outputName)
        {
            graph = PolicyGraph.Read(model, inputName, outputName);
            values = new float[graph.Widths.Count][];
            rowsAllocated = 0;
        }

        void Reserve(int rows)
        {
            if (rows <= rowsAllocated) return;
            for (int v = 1; v < values.Length; ++v) values[v] = new float[rows * graph.Widths[v]];
            rowsAllocated = rows;
        }

        /// <inheritdoc />
        public void Run(float[] obs, int batch, int obsDim, float[] output, int outDim)
        {
            if (graph == null) throw new TetherException(ErrorCode.NotReady, "no model is loaded");
            if (obsDim != graph.InputWidth) throw new TetherException(ErrorCode.InferenceFailed, "the model takes " + graph.InputWidth + " observation values, not " + obsDim);
            if (outDim != graph.OutputWidth) throw new TetherException(ErrorCode.InferenceFailed, "the model gives " + graph.OutputWidth + " outputs per row, not " + outDim);
            if (batch < 0 || obs.Length < batch * obsDim || output.Length < batch * outDim) throw new TetherException(ErrorCode.InvalidArgument, "the buffers hold fewer than " + batch + " rows");
            Reserve(batch);
            values[0] = obs;
            foreach (PolicyStep step in graph.Steps) Apply(step, batch);
            Array.Copy(values[graph.OutputValue], output, batch * outDim);
            values[0] = null;
        }

        void Apply(PolicyStep step, int batch)
        {
            float[] x = step.Kind == PolicyStepKind.Concat ? null : values[step.Input];
            float[] y = values[step.Output];
            int width = graph.Widths[step.Output];
            switch (step.Kind)
            {
                case PolicyStepKind.Dense:
                    Dense(x, step.Weights, step.Bias, y, batch, graph.Widths[step.Input], width);
                    return;
                case PolicyStepKind.AddBias:
                    for (int r = 0; r < batch; ++r)
                    {
                        for (int o = 0; o < width; ++o) y[r * width + o] = x[r * width + o] + step.Bias[o];
                    }
                    return;
                case PolicyStepKind.Tanh:
                    for (int k = 0, n = batch * width; k < n; ++k) y[k] = Tanh(x[k]);
                    return;
                case PolicyStepKind.Relu:
                    for (int k = 0, n = batch * width; k < n; ++k) y[k] = x[k] > 0f ? x[k] : 0f;
                    return;
                case PolicyStepKind.Sigmoid:
                    for (int k = 0, n = batch * width; k < n; ++k) y[k] = (float)(1.0 / (1.0 + Math.Exp(-x[k])));
                    return;
                case PolicyStepKind.Concat:
                {
                    int column = 0;
                    foreach (ConcatPart part in step.Parts)
                    {
                        float[] source = part.Value >= 0 ? values[part.Value] : null;
                        for (int r = 0; r < batch; ++r)
                        {
                            if (source != null) Array.Copy(source, r * part.Width, y, r * width + column, part.Width);
                            else Array.Copy(part.Constant, 0, y, r * width + column, part.Width);
                        }
                        column += part.Width;
                    }
                    return;
                }
            }
        }

        // y = x W^T + b, four rows at a time so that each weight read serves four
        // rows (the batched frame); a lone row sums in four lanes instead.
        static void Dense(float[] x, float[] w, float[] b, float[] y, int batch, int inWidth, int width)
        {
            int r = 0;
            for (; r + 4 <= batch; r += 4)
            {
                int x0 = r * inWidth, x1 = x0 + inWidth, x2 = x1 + inWidth, x3 = x2 + inWidth;
                int y0 = r * width;
                for (int o = 0; o < width; ++o)
                {
                    float s0 = b[o], s1 = s0, s2 = s0, s3 = s0;
                    int wRow = o * inWidth;
                    for (int i = 0; i < inWidth; ++i)
                    {
                        float wi = w[wRow + i];
                        s0 += x[x0 + i] * wi;
                        s1 += x[x1 + i] * wi;
                        s2 += x[x2 + i] * wi;
                        s3 += x[x3 + i] * wi;
                    }
                    y[y0 + o] = s0;
                    y[y0 + width + o] = s1;
                    y[y0 + 2 * width + o] = s2;
                    y[y0 + 3 * width + o] = s3;
                }
            }
            for (; r < batch; ++r)
            {
                int xRow = r * inWidth, yRow = r * width, tail = inWidth & ~3;
                for (int o = 0; o < width; ++o)
                {
                    int wRow = o * inWidth, i = 0;
                    float s0 = 0f, s1 = 0f, s2 = 0f, s3 = 0f;
                    for (; i < tail; i += 4)
                    {
                        s0 += x[xRow + i] * w[wRow + i];
                        s1 += x[xRow + i + 1] * w[wRow + i + 1];
                        s2 += x[xRow + i + 2] * w[wRow + i + 2];
                        s3 += x[xRow + i + 3] * w[wRow + i + 3];
                    }
                    for (; i < inWidth; ++i) s0 += x[xRow + i] * w[wRow + i];
                    y[yRow + o] = b[o] + ((s0 + s1) + (s2 + s3));
                }
            }
        }

        // tanh as a [13/6] rational function of x on [-7.9, 7.9] (beyond, float's tanh
        // is +-1): within 1e-6 of Math.Tanh and several times faster than it,
        // which dominated the batched frame.
        internal static float Tanh(float x)
        {
            if (x > 7.90531111f) x = 7.90531111f;
            else if (x < -7.90531111f) x = -7.90531111f;
            else if (float.IsNaN(x)) return x;
            float x2 = x * x;
            float p = -2.76076847742355e-16f;
            p = p * x2 + 2.00018790482477e-13f;
            p = p * x2 - 8.60467152213735e-11f;
            p = p * x2 + 5.12229709037114e-08f;
            p = p * x2 + 1.48572235717979e-05f;
            p = p * x2 + 6.37261928875436e-04f;
            p = p * x2 + 4.89352455891786e-03f;
            float q = 1.19825839466702e-06f;
            q = q * x2 + 1.18534705686654e-04f;
            q = q * x2 + 2.26843463243900e-03f;
            q = q * x2 + 4.89352518554385e-03f;
            return x * p / q;
        }

        /// <summary>Drops the graph (nothing native to release).</summary>
        public void Dispose()
        {
            graph = null;
            values = new float[0][];
            rowsAllocated = 0;
        }
    }
}
