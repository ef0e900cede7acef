// Action masks (docs/protocol.md §11.6, protocol 1.4): a leaf of a composite observation that says,
// per step, which discrete actions the game allows. The model applies it inside its graph (a
// forbidden logit is -1e9), so a client samples as always; it only checks the mask first, so
// that an action the server would refuse is never drawn or sent.
using System.Collections.Generic;
using System.Globalization;

namespace Tether.Protocol
{
    /// <summary>
    /// Where a module's mask sits in its flat observation row (§8.6) and the categoricals of its action
    /// space: one value per logit, 1 allowed, 0 forbidden. Immutable; checking allocates nothing
    /// unless it refuses.
    /// </summary>
    public sealed class ActionMask
    {
        /// <summary>The logit a forbidden action gets inside the model (§11.6, a float32 value).</summary>
        public const float MaskedLogit = -1e9f;

        /// <summary>The mask leaf's path ("" for a mask given on its own, see <see cref="OfActionSpace"/>).</summary>
        public string Leaf { get; private set; }
        /// <summary>The mask's first value in the flat observation row.</summary>
        public int Offset { get; private set; }
        /// <summary>Its number of values: K, the action space's logits (n, or the sum of nvec).</summary>
        public int Size { get; private set; }

        int[] segmentStart;   // per categorical (one for Discrete, one per MultiDiscrete entry): its first logit
        int[] segmentCount;   // ... and its number of logits
        long shift;           // added to a Discrete action to get its logit (-start); 0 for MultiDiscrete

        ActionMask() { }

        /// <summary>
        /// The mask leaf <paramref name="leaf"/> of <paramref name="observationSpace"/> for
        /// <paramref name="actionSpace"/> (§9.1). INVALID_FIELD when the observation space is not a Dict
        /// or Tuple or has no such leaf, the action space is not Discrete or MultiDiscrete, or the leaf
        /// is not a Box of exactly K values.
        /// </summary>
        public static ActionMask Resolve(Space observationSpace, Space actionSpace, string leaf)
        {
            if (leaf == null) throw Invalid("action_mask must be a leaf path (a string)");
            if (observationSpace == null || !observationSpace.IsComposite)
            {
                throw Invalid("action_mask '" + leaf + "' needs a Dict or Tuple observation space");
            }
            int index = observationSpace.LeafIndex(leaf);
            if (index < 0) throw Invalid("action_mask '" + leaf + "' names no leaf of the observation space");
            ActionMask mask = OfActionSpace(actionSpace);
            SpaceLeaf found = observationSpace.Leaves[index];
            if (found.Space.Kind != SpaceKind.Box || found.Size != mask.Size)
            {
                throw Invalid("action_mask '" + leaf + "' must be a Box of " + mask.Size + " values (one per logit), got a " + found.Space.Kind +
                              " of " + found.Size);
            }
            mask.Leaf = leaf;
            mask.Offset = found.Offset;
            return mask;
        }

        /// <summary>
        /// A mask of K values at offset 0 for <paramref name="actionSpace"/> (checking a mask given on its
        /// own). INVALID_FIELD for an action space that is not Discrete or MultiDiscrete.
        /// </summary>
        public static ActionMask OfActionSpace(Space actionSpace)
        {
            if (actionSpace == null || (actionSpace.Kind != SpaceKind.Discrete && actionSpace.Kind != SpaceKind.MultiDiscrete))
            {
                throw Invalid("an action mask needs a Discrete or MultiDiscrete action space" + (actionSpace == null ? "" : ", not a " + actionSpace.Kind));
            }
            var mask = new ActionMask { Leaf = "", Size = actionSpace.DistInputsSize };
            if (actionSpace.Kind == SpaceKind.Discrete)
            {
                mask.segmentStart = new[] { 0 };
                mask.segmentCount = new[] { (int)actionSpace.N };
                mask.shift = -actionSpace.Start;
            }
            else
            {
                int n = actionSpace.Nvec.Length, at = 0;
                mask.segmentStart = new int[n];
                mask.segmentCount = new int[n];
                for (int i = 0; i < n; ++i)
                {
                    mask.segmentStart[i] = at;
                    mask.segmentCount[i] = (int)actionSpace.Nvec[i];
                    at += (int)actionSpace.Nvec[i];
                }
            }
            return mask;
        }

        /// <summary>
        /// Whether the mask inside the flat observation row at <paramref name="rowOffset"/> of
        /// <paramref name="row"/> can be acted on (§11.6): INVALID_ACTION_MASK for a value other than 0
        /// and 1, ACTION_MASK_EMPTY when it allows nothing (for MultiDiscrete: nothing for some entry).
        /// <paramref name="what"/> starts the message.
        /// </summary>
        public void CheckRow(float[] row, int rowOffset, string what) { CheckAt(row, null, rowOffset + Offset, what); }

        /// <summary>
        /// Whether <see cref="CheckRow"/> would accept the mask inside the flat observation row at
        /// <paramref name="rowOffset"/> of <paramref name="row"/>: every value 0 or 1 and some action
        /// allowed (for MultiDiscrete: for every entry). Allocates nothing.
        /// </summary>
        public bool AcceptsRow(float[] row, int rowOffset)
        {
            int at = rowOffset + Offset;
            for (int i = 0; i < Size; ++i)
            {
                float v = row[at + i];
                if (v != 0 && v != 1) return false;
            }
            for (int s = 0; s < segmentStart.Length; ++s)
            {
                bool any = false;
                for (int i = 0; i < segmentCount[s] && !any; ++i) any = row[at + segmentStart[s] + i] == 1;
                if (!any) return false;
            }
            return true;
        }

        /// <summary><see cref="CheckRow"/> of a mask held as doubles, <see cref="Size"/> values at <paramref name="at"/>.</summary>
        public void Check(IList<double> mask, int at, string what) { CheckAt(null, mask, at, what); }

        /// <summary>
        /// INVALID_ACTION_MASK for a value other than 0 and 1 among the <see cref="Size"/> values at
        /// <paramref name="at"/> (§10.6 check 14b: every observation's mask, the last one's too).
        /// </summary>
        public void CheckValues(IList<double> mask, int at, string what) { CheckValuesAt(null, mask, at, what); }

        // The checks read the mask's values from `floats` (an observation row: the per-frame path, no
        // interface calls) or else `doubles`.
        void CheckAt(float[] floats, IList<double> doubles, int at, string what)
        {
            CheckValuesAt(floats, doubles, at, what);
            for (int s = 0; s < segmentStart.Length; ++s)
            {
                bool any = false;
                for (int i = 0; i < segmentCount[s] && !any; ++i) any = ValueAt(floats, doubles, at + segmentStart[s] + i) == 1;
                if (!any) throw Empty(what, s);
            }
        }

        void CheckValuesAt(float[] floats, IList<double> doubles, int at, string what)
        {
            for (int i = 0; i < Size; ++i)
            {
                double v = ValueAt(floats, doubles, at + i);
                if (v != 0 && v != 1) throw BadValue(what, i, v);
            }
        }

        static double ValueAt(float[] floats, IList<double> doubles, int i) { return floats != null ? floats[i] : doubles[i]; }

        /// <summary>
        /// Whether the flat action at <paramref name="actionAt"/> of <paramref name="action"/> (the action
        /// space's FlatDim values) is allowed by the mask at <paramref name="at"/> (§10.6 check 14d).
        /// </summary>
        public bool Allows(IList<double> mask, int at, IList<double> action, int actionAt)
        {
            for (int s = 0; s < segmentStart.Length; ++s)
            {
                long logit = (long)action[actionAt + s] + (s == 0 ? shift : 0);
                if (logit < 0 || logit >= segmentCount[s] || mask[at + segmentStart[s] + (int)logit] != 1) return false;
            }
            return true;
        }

        /// <summary>
        /// <see cref="Allows"/> for the mask inside the flat observation row at <paramref name="rowOffset"/>
        /// of <paramref name="row"/> (a logged action checked before it is recorded, protocol 1.6). Allocates nothing.
        /// </summary>
        public bool AllowsRow(float[] row, int rowOffset, double[] action, int actionAt)
        {
            int at = rowOffset + Offset;
            for (int s = 0; s < segmentStart.Length; ++s)
            {
                long logit = (long)action[actionAt + s] + (s == 0 ? shift : 0);
                if (logit < 0 || logit >= segmentCount[s] || row[at + segmentStart[s] + (int)logit] != 1) return false;
            }
            return true;
        }

        static TetherException BadValue(string what, int i, double v)
        {
            return new TetherException(ErrorCode.InvalidActionMask, what + ": action mask value " + i + " is " +
                                       v.ToString("R", CultureInfo.InvariantCulture) + ", not 0 or 1");
        }

        TetherException Empty(string what, int segment)
        {
            return new TetherException(ErrorCode.ActionMaskEmpty, what + ": the action mask allows no action" +
                                       (segmentStart.Length > 1 ? " for entry " + segment : ""));
        }

        static TetherException Invalid(string detail) { return new TetherException(ErrorCode.InvalidField, detail); }
    }
}
