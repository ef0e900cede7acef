// Categorical and diagonal-Gaussian distributions over the action spaces (docs/protocol.md §11).
using System;
using Tether.Protocol;

namespace Tether.Sampling
{
    /// <summary>
    /// Log-probabilities, sampling and the engine's (clipped) actions. A
    /// model's output row for one agent is its "dist inputs": logits for a
    /// Discrete, concatenated logits for a MultiDiscrete, means then log
    /// standard deviations for a Box. The methods work on caller-owned arrays
    /// with offsets; those of the per-frame path (SampleRows, ToEnvAction,
    /// Deterministic) allocate nothing.
    /// </summary>
    public static class Distributions
    {
        const double LogSqrt2Pi = 0.91893853320467274178;  // 0.5 * ln(2 pi)
        const int KeptExps = 64;

        [ThreadStatic] static double[] kept;
        [ThreadStatic] static double[] uniformBuffer;

        static void CheckSizes(Space space, int inputs, int actionSize)
        {
            if (inputs != space.DistInputsSize)
            {
                throw new TetherException(ErrorCode.InvalidArgument,
                    "dist_inputs has " + inputs + " numbers, the action space needs " + space.DistInputsSize);
            }
            if (actionSize != space.FlatDim)
            {
                throw new TetherException(ErrorCode.InvalidArgument,
                    "the action has " + actionSize + " elements, the action space needs " + space.FlatDim);
            }
        }

        /// <summary>
        /// log pi(action) under one row of dist inputs (§11.1-11.3). INVALID_ARGUMENT
        /// for wrong sizes or a discrete action outside the space.
        /// </summary>
        public static double LogProb(Space space, double[] dist, int distOffset, int distCount, double[] action, int actionOffset, int actionSize)
        {
            CheckSizes(space, distCount, actionSize);
            switch (space.Kind)
            {
                case SpaceKind.Discrete:
                    return CategoricalLogp(dist, distOffset, (int)space.N, DiscreteIndex(action[actionOffset], space.Start, space.N, "action"));
                case SpaceKind.MultiDiscrete:
                    double total = 0;
                    int offset = distOffset;
                    for (int d = 0; d < space.Nvec.Length; ++d)
                    {
                        int n = (int)space.Nvec[d];
                        total += CategoricalLogp(dist, offset, n, DiscreteIndex(action[actionOffset + d], 0, n, "action[" + d + "]"));
                        offset += n;
                    }
                    return total;
                default:
                    return GaussianLogp(null, dist, distOffset, space.FlatDim, action, actionOffset);
            }
        }

        /// <summary><see cref="LogProb(Space, double[], int, int, double[], int, int)"/> for float32 dist inputs (a model's output).</summary>
        public static double LogProb(Space space, float[] dist, int distOffset, int distCount, double[] action, int actionOffset, int actionSize)
        {
            CheckSizes(space, distCount, actionSize);
            var row = new double[distCount];
            for (int i = 0; i < distCount; ++i) row[i] = dist[distOffset + i];
            return LogProb(space, row, 0, distCount, action, actionOffset, actionSize);
        }

        /// <summary>
        /// Throws INFERENCE_FAILED when one of a model's first <paramref name="count"/>
        /// outputs is NaN or infinite: no action or logp can be drawn from it, and
        /// JSON cannot carry it to the server (§4.1).
        /// </summary>
        public static void CheckFinite(float[] dist, int count)
        {
            for (int i = 0; i < count; ++i)
            {
                float v = dist[i];
                if (!(v - v == 0f))  // (NaN or infinite: v - v is NaN)
                {
                    throw new TetherException(ErrorCode.InferenceFailed, "the model's output [" + i + "] is not finite (" +
                                              dist[i].ToString(System.Globalization.CultureInfo.InvariantCulture) + "): no action is drawn from it");
                }
            }
        }

        /// <summary>
        /// Draws one action per row of a frame's dist inputs (rows x DistInputsSize
        /// floats): <paramref name="recordActions"/> get what the record carries
        /// (a Box's raw Gaussian sample, rounded to float32), <paramref name="envActions"/>
        /// what the engine executes (the sample clipped into the box), and
        /// <paramref name="logp"/> their log-probabilities (§11.4). With
        /// <paramref name="rawBoxSamples"/> false (a server older than 1.3) the
        /// record carries the clipped action and the density at it.
        /// </summary>
        public static void SampleRows(Space space, float[] dist, int rows, Rng rng, bool rawBoxSamples,
                                      double[] recordActions, double[] envActions, double[] logp)
        {
            SampleRows(space, dist, rows, rng, rawBoxSamples, recordActions, 0, envActions, 0, logp, 0);
        }

        /// <summary>
        /// <see cref="SampleRows(Space, float[], int, Rng, bool, double[], double[], double[])"/> writing
        /// row r's numbers at recordActions[recordAt + r * k], envActions[envAt + r * k] and logp[logpAt + r].
        /// </summary>
        internal static void SampleRows(Space space, float[] dist, int rows, Rng rng, bool rawBoxSamples,
                                        double[] recordActions, int recordAt, double[] envActions, int envAt, double[] logp, int logpAt,
                                        bool discreteLogpLater = false)
        {
            SampleRows(space, dist, 0, rows, rng, rawBoxSamples, recordActions, recordAt, envActions, envAt, logp, logpAt, discreteLogpLater);
        }

        /// <summary>
        /// <see cref="SampleRows(Space, float[], int, Rng, bool, double[], int, double[], int, double[], int, bool)"/> of the
        /// rows of dist inputs from row <paramref name="distRow"/> on (a frame's rows drawn one by one, its
        /// logged ones skipped: the draws are those of the rows drawn, in order). With
        /// <paramref name="discreteLogpLater"/> a Discrete row's log-probability is not taken: its logp
        /// is NaN, for <see cref="DrawnCategoricalLogp"/> to give later, off the game's thread (the log
        /// is a third of a two-category draw's cost under mono); the draws are the same.
        /// </summary>
        internal static void SampleRows(Space space, float[] dist, int distRow, int rows, Rng rng, bool rawBoxSamples,
                                        double[] recordActions, int recordAt, double[] envActions, int envAt, double[] logp, int logpAt,
                                        bool discreteLogpLater = false)
        {
            int nIn = space.DistInputsSize, k = space.FlatDim;
            int distAt = distRow * nIn;
            if (dist.Length < distAt + rows * nIn || recordActions.Length < recordAt + rows * k || envActions.Length < envAt + rows * k || logp.Length < logpAt + rows)
            {
                throw new TetherException(ErrorCode.InvalidArgument, "SampleRows: the arrays are too small for " + rows + " rows");
            }
            switch (space.Kind)
            {
                case SpaceKind.Discrete:
                    if (space.N == 2)
                    {
                        // CategoricalSample for two categories, draw for draw and bit for bit: the top
                        // category's weight is exp(0) = 1, the other's exp(-|l1 - l0|), one exp and one
                        // log a row (no log with discreteLogpLater). (Under mono the plain conditionals beat
                        // a branch-free version that picked values from a table by sign bits.)
                        double[] uniforms = Uniforms(rows);
                        rng.FillUniform(uniforms, rows);  // (one draw per row, in order)
                        double start = space.Start;
                        for (int r = 0, at = distAt; r < rows; ++r, at += 2)
                        {
                            double gap = (double)dist[at + 1] - dist[at];
                            bool secondOnTop = gap > 0;
                            double below = secondOnTop ? -gap : gap;  // the other category's logit minus the top one
                            double e = Math.Exp(below);
                            double total = 1 + e;
                            bool second = (secondOnTop ? e : 1.0) <= uniforms[r] * total;  // the first's weight <= threshold
                            logp[logpAt + r] = discreteLogpLater ? double.NaN : (second == secondOnTop ? 0.0 : below) - Math.Log(total);
                            recordActions[recordAt + r] = envActions[envAt + r] = second ? start + 1 : start;
                        }
                        return;
                    }
                    for (int r = 0; r < rows; ++r)
                    {
                        int index = CategoricalSample(dist, distAt + r * nIn, (int)space.N, rng, out logp[logpAt + r], !discreteLogpLater);
                        recordActions[recordAt + r] = envActions[envAt + r] = index + space.Start;
                    }
                    return;
                case SpaceKind.MultiDiscrete:
                    for (int r = 0; r < rows; ++r)
                    {
                        double total = 0;
                        int offset = distAt + r * nIn;
                        for (int d = 0; d < k; ++d)
                        {
                            int n = (int)space.Nvec[d];
                            double lp;
                            recordActions[recordAt + r * k + d] = envActions[envAt + r * k + d] = CategoricalSample(dist, offset, n, rng, out lp, true);
                            total += lp;
                            offset += n;
                        }
                        logp[logpAt + r] = total;
                    }
                    return;
                default:
                    for (int r = 0; r < rows; ++r)
                    {
                        int inputs = distAt + r * nIn, at = recordAt + r * k, env = envAt + r * k;
                        for (int j = 0; j < k; ++j)
                        {
                            double mean = dist[inputs + j];
                            double stdDev = Math.Exp(dist[inputs + k + j]);
                            // The density is taken at the float32 value that is recorded and sent.
                            double raw = (float)(mean + stdDev * rng.Normal());
                            recordActions[at + j] = raw;
                            envActions[env + j] = (float)Math.Min(Math.Max(raw, space.Low[j]), space.High[j]);
                        }
                        if (!rawBoxSamples) Array.Copy(envActions, env, recordActions, at, k);  // the 1.2 rule
                        logp[logpAt + r] = GaussianLogp(dist, null, inputs, k, recordActions, at);
                    }
                    return;
            }
        }

        static double[] Uniforms(int rows)
        {
            double[] buffer = uniformBuffer;
            if (buffer == null || buffer.Length < rows) buffer = uniformBuffer = new double[Math.Max(rows, 2 * (buffer == null ? 128 : buffer.Length))];
            return buffer;
        }

        /// <summary>The action the engine executes for a recorded one: a Box action clipped into the box and rounded to float32; others unchanged.</summary>
        public static void ToEnvAction(Space space, double[] action, int actionOffset, double[] envAction, int envOffset, int actionSize)
        {
            if (actionSize != space.FlatDim)
            {
                throw new TetherException(ErrorCode.InvalidArgument,
                    "the action has " + actionSize + " elements, the action space needs " + space.FlatDim);
            }
            for (int j = 0; j < actionSize; ++j)
            {
                double value = action[actionOffset + j];
                envAction[envOffset + j] = space.Kind == SpaceKind.Box ? (float)Math.Min(Math.Max(value, space.Low[j]), space.High[j]) : value;
            }
        }

        /// <summary>The distribution's mode (greedy mode, §11.4): each categorical's argmax (plus start), a Box's clipped mean.</summary>
        public static void Deterministic(Space space, float[] dist, int distOffset, double[] action, int actionOffset)
        {
            switch (space.Kind)
            {
                case SpaceKind.Discrete:
                    action[actionOffset] = Argmax(dist, distOffset, (int)space.N) + space.Start;
                    return;
                case SpaceKind.MultiDiscrete:
                    int offset = distOffset;
                    for (int d = 0; d < space.Nvec.Length; ++d)
                    {
                        int n = (int)space.Nvec[d];
                        action[actionOffset + d] = Argmax(dist, offset, n);
                        offset += n;
                    }
                    return;
                default:
                    for (int j = 0; j < space.FlatDim; ++j)
                    {
                        action[actionOffset + j] = (float)Math.Min(Math.Max(dist[distOffset + j], space.Low[j]), space.High[j]);
                    }
                    return;
            }
        }

        static int Argmax(float[] logits, int offset, int n)
        {
            int best = 0;
            for (int i = 1; i < n; ++i)
            {
                if (logits[offset + i] > logits[offset + best]) best = i;
            }
            return best;
        }

        static int DiscreteIndex(double value, long start, long n, string what)
        {
            if (!double.IsNaN(value) && !double.IsInfinity(value))
            {
                double index = Math.Truncate(value) - start;  // int() as in Python
                if (index >= 0 && index < n) return (int)index;
            }
            throw new TetherException(ErrorCode.InvalidArgument, what + " " + value + " is outside the space");
        }

        static double CategoricalLogp(double[] logits, int offset, int n, int index)
        {
            double top = logits[offset];
            for (int i = 1; i < n; ++i) top = Math.Max(top, logits[offset + i]);
            double total = 0;
            for (int i = 0; i < n; ++i) total += Math.Exp(logits[offset + i] - top);
            return logits[offset + index] - (top + Math.Log(total));
        }

        // Inverse-CDF draw from softmax(logits): the category is found without a
        // branch per category (it would mispredict half the time). Without withLogp, logp is NaN.
        static int CategoricalSample(float[] logits, int offset, int n, Rng rng, out double logp, bool withLogp)
        {
            double top = logits[offset];
            for (int i = 1; i < n; ++i) top = Math.Max(top, logits[offset + i]);
            double[] exps = kept ?? (kept = new double[KeptExps]);
            bool keep = n <= KeptExps;
            double total = 0;
            int lastPossible = 0;  // the last category of nonzero probability (a masked one has 0, §11.6)
            for (int i = 0; i < n; ++i)
            {
                double e = Weight(logits[offset + i] - top);
                if (keep) exps[i] = e;
                total += e;
                lastPossible = e > 0 ? i : lastPossible;
            }
            double threshold = rng.Uniform() * total;
            double acc = 0;
            int choice = 0;
            for (int i = 0; i + 1 < n; ++i)
            {
                acc += keep ? exps[i] : Math.Exp(logits[offset + i] - top);
                choice += acc <= threshold ? 1 : 0;
            }
            // A threshold rounded up to the whole sum would count past the last possible category.
            choice = Math.Min(choice, lastPossible);
            logp = withLogp ? DrawLogp(logits[offset + choice], top, total) : double.NaN;
            return choice;
        }

        // The weight of a category whose logit is `below` under the top one: exp(0) is exactly 1, and
        // the top category costs no exp.
        static double Weight(double below) { return below == 0 ? 1.0 : Math.Exp(below); }

        // log softmax of the drawn category, from its logit, the top one and the weights' in-order sum.
        static double DrawLogp(double chosen, double top, double total) { return chosen - top - Math.Log(total); }

        /// <summary>
        /// The log-probability a draw of category <paramref name="choice"/> from softmax(logits[offset..offset + n])
        /// was given when it was drawn (SampleRows's, CategoricalSample's): bit for bit, whether it is taken
        /// now or later (a row drawn with discreteLogpLater), for finite logits (a model's output is checked
        /// finite before anything is drawn from it). A category outside 0..n-1 is an INVALID_ARGUMENT.
        /// </summary>
        internal static double DrawnCategoricalLogp(float[] logits, int offset, int n, int choice)
        {
            if (choice < 0 || choice >= n) throw new TetherException(ErrorCode.InvalidArgument, "category " + choice + " is not one of the " + n + " drawn from");
            double top = logits[offset];
            for (int i = 1; i < n; ++i) top = Math.Max(top, logits[offset + i]);
            double total = 0;
            for (int i = 0; i < n; ++i) total += Weight(logits[offset + i] - top);
            return DrawLogp(logits[offset + choice], top, total);
        }

        // log N(action | mean, exp(logStd)) summed over a Box's k values; the dist inputs are read from
        // `floats` (a model's output, the per-frame path) or else `doubles` (LogProb's).
        static double GaussianLogp(float[] floats, double[] doubles, int offset, int k, double[] action, int actionOffset)
        {
            double total = 0;
            for (int j = 0; j < k; ++j)
            {
                double mean = floats != null ? floats[offset + j] : doubles[offset + j];
                double logStd = floats != null ? floats[offset + k + j] : doubles[offset + k + j];
                double z = (action[actionOffset + j] - mean) / Math.Exp(logStd);
                total += -0.5 * z * z - logStd - LogSqrt2Pi;
            }
            return total;
        }
    }
}
