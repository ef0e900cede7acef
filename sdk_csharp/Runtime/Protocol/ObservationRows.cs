// The checks a client makes on one observation before it records or acts on it, so that what it
// sends is never refused for it (§10.6 checks 11, 11b and, protocol 1.4, 4c and 14b-14c).
using System.Globalization;

namespace Tether.Protocol
{
    /// <summary>Checks of one flat observation row (§8.6: a composite space's leaves concatenated in leaf order).</summary>
    public static class ObservationRows
    {
        /// <summary>
        /// Checks the <paramref name="space"/>.FlatDim values at <paramref name="offset"/> of
        /// <paramref name="row"/>: NON_FINITE_VALUE for a NaN or an infinity; OBS_DTYPE_MISMATCH for a
        /// byte box's (or byte leaf's) value that is not an integer 0-255, naming the leaf; and with
        /// <paramref name="mask"/>, when <paramref name="acting"/> (an action follows this observation),
        /// INVALID_ACTION_MASK or ACTION_MASK_EMPTY (§11.6). Allocates nothing unless it refuses.
        /// </summary>
        public static void Check(Space space, ActionMask mask, float[] row, int offset, string what, bool acting)
        {
            int n = space.FlatDim;
            for (int i = 0; i < n; ++i)
            {
                float v = row[offset + i];
                if (float.IsNaN(v) || float.IsInfinity(v)) throw new TetherException(ErrorCode.NonFiniteValue, what + Where(space, i) + " is not finite");
            }
            if (space.IsComposite)
            {
                var leaves = space.Leaves;
                for (int l = 0; l < leaves.Count; ++l)
                {
                    SpaceLeaf leaf = leaves[l];
                    if (leaf.IsBytes) CheckBytes(row, offset + leaf.Offset, leaf.Size, space, leaf.Offset, what);
                }
            }
            else if (space.IsBytes)
            {
                CheckBytes(row, offset, n, space, 0, what);
            }
            if (mask != null && acting) mask.CheckRow(row, offset, what);
        }

        /// <summary>
        /// Whether <see cref="Check"/> would accept the row (the same arguments, no message): lets a caller
        /// build its message only when it refuses. Allocates nothing.
        /// </summary>
        public static bool Accepts(Space space, ActionMask mask, float[] row, int offset, bool acting)
        {
            int n = space.FlatDim;
            for (int i = 0; i < n; ++i)
            {
                float v = row[offset + i];
                if (float.IsNaN(v) || float.IsInfinity(v)) return false;
            }
            if (space.IsComposite)
            {
                var leaves = space.Leaves;
                for (int l = 0; l < leaves.Count; ++l)
                {
                    SpaceLeaf leaf = leaves[l];
                    if (leaf.IsBytes && !AreBytes(row, offset + leaf.Offset, leaf.Size)) return false;
                }
            }
            else if (space.IsBytes && !AreBytes(row, offset, n))
            {
                return false;
            }
            return mask == null || !acting || mask.AcceptsRow(row, offset);
        }

        static bool AreBytes(float[] row, int at, int n)
        {
            for (int i = 0; i < n; ++i)
            {
                if (!EpisodeRecords.IsByteValue(row[at + i])) return false;
            }
            return true;
        }

        static void CheckBytes(float[] row, int at, int n, Space space, int flatAt, string what)
        {
            for (int i = 0; i < n; ++i)
            {
                float v = row[at + i];
                if (!EpisodeRecords.IsByteValue(v))
                {
                    throw new TetherException(ErrorCode.ObsDtypeMismatch, what + Where(space, flatAt + i) + " is " + v.ToString("R", CultureInfo.InvariantCulture) +
                                              ": " + (space.IsComposite ? "the leaf" : "the observation space") + " is a uint8 Box (integers 0-255)");
                }
            }
        }

        // "[i]", or for a composite space " leaf 'camera'[j]".
        static string Where(Space space, int i)
        {
            if (!space.IsComposite) return "[" + i + "]";
            foreach (SpaceLeaf leaf in space.Leaves)
            {
                if (i >= leaf.Offset && i < leaf.Offset + leaf.Size) return " leaf '" + leaf.Path + "'[" + (i - leaf.Offset) + "]";
            }
            return "[" + i + "]";
        }
    }
}
