// An action the policy did not choose (protocol 1.6, §10.1: a logged step), checked before a client
// records it as the server would check it, so that a batch is never refused for it.
using System.Globalization;
using System.Text;

namespace Tether.Protocol
{
    /// <summary>The checks a client makes on a logged action (§10.6 checks 12-14 and 14d) before it records it.</summary>
    public static class LoggedActions
    {
        /// <summary>
        /// Checks the <paramref name="length"/> values of <paramref name="action"/> from
        /// <paramref name="actionAt"/> as an action of <paramref name="actionSpace"/>: ACTION_OUT_OF_SPACE
        /// for another number of values than the space's FlatDim, or (Discrete, MultiDiscrete) a value
        /// that is not an integer of the space (a Discrete's from start to start + n - 1, a
        /// MultiDiscrete entry's from 0 to nvec[j] - 1); NON_FINITE_VALUE for a NaN or an infinity, or a Box value beyond float32's range (a
        /// Box action may lie outside its bounds: records carry actions as taken, §11.4); and with
        /// <paramref name="mask"/>, ACTION_MASKED for an action the mask in the flat observation row at
        /// <paramref name="rowOffset"/> of <paramref name="observationRow"/> forbids (§11.6).
        /// <paramref name="what"/> starts the message ("the logged action"). Allocates nothing unless it refuses.
        /// </summary>
        public static void Check(Space actionSpace, ActionMask mask, float[] observationRow, int rowOffset, double[] action, int actionAt, int length,
                                 string what)
        {
            int k = actionSpace.FlatDim;
            bool box = actionSpace.Kind == SpaceKind.Box;
            if (action == null || length != k)
            {
                throw new TetherException(ErrorCode.ActionOutOfSpace, what + " has " + (action == null ? 0 : length) + " values, the action space " +
                                          SpaceText(actionSpace) + " needs " + k);
            }
            for (int j = 0; j < k; ++j)
            {
                double v = action[actionAt + j];
                // (a Box action as float32, as the server reads it: 1e39 would reach it as an infinity)
                if (double.IsNaN(v) || double.IsInfinity(v) || (box && float.IsInfinity((float)v)))
                {
                    throw new TetherException(ErrorCode.NonFiniteValue, what + " " + Values(action, actionAt, k) + " is not finite" + (box ? " (as float32)" : ""));
                }
            }
            if (actionSpace.Kind == SpaceKind.Box) return;
            if (!actionSpace.Contains(action, actionAt, k))
            {
                throw new TetherException(ErrorCode.ActionOutOfSpace, what + " " + Values(action, actionAt, k) + " is outside the action space " + SpaceText(actionSpace));
            }
            if (mask != null && observationRow != null && !mask.AllowsRow(observationRow, rowOffset, action, actionAt))
            {
                throw new TetherException(ErrorCode.ActionMasked, what + " " + Values(action, actionAt, k) + " is not allowed by the observation's action mask '" +
                                          mask.Leaf + "'");
            }
        }

        /// <summary>Whether <see cref="Check"/> would accept the action (the same arguments, no message). Allocates nothing.</summary>
        public static bool Accepts(Space actionSpace, ActionMask mask, float[] observationRow, int rowOffset, double[] action, int actionAt, int length)
        {
            int k = actionSpace.FlatDim;
            bool box = actionSpace.Kind == SpaceKind.Box;
            if (action == null || length != k) return false;
            for (int j = 0; j < k; ++j)
            {
                double v = action[actionAt + j];
                if (double.IsNaN(v) || double.IsInfinity(v) || (box && float.IsInfinity((float)v))) return false;
            }
            if (actionSpace.Kind == SpaceKind.Box) return true;
            return actionSpace.Contains(action, actionAt, k) && (mask == null || observationRow == null || mask.AllowsRow(observationRow, rowOffset, action, actionAt));
        }

        static string SpaceText(Space space) { return space.ToJson().ToString(Newtonsoft.Json.Formatting.None); }

        static string Values(double[] action, int at, int k)
        {
            var text = new StringBuilder("[");
            for (int j = 0; j < k; ++j)
            {
                if (j > 0) text.Append(", ");
                text.Append(action[at + j].ToString("R", CultureInfo.InvariantCulture));
            }
            return text.Append(']').ToString();
        }
    }
}
