// One composite observation (protocol 1.4, §8.6) as an engine hands it: each leaf's values from the
// engine's own arrays, by leaf, with nothing concatenated by the engine and nothing allocated per frame.
//
//   var obs = new ObservationLeaves(client.ObservationSpace);   // once
//   int board = obs.Index("observation"), mask = obs.Index("action_mask");
//   // every frame:
//   obs.Set(board, boardValues);      // float[] or byte[], by index or by path
//   obs.Set(mask, legalMoves);
//   client.GetAction(episode, obs, action);
using System;
using Tether.Protocol;

namespace Tether.Client
{
    /// <summary>
    /// The leaves of one observation of a Dict or Tuple space, copied into the space's flat row (§8.6)
    /// as they are set. Reuse one object per agent: set the leaves that changed, act, and so on; a
    /// leaf keeps its values until it is set again or <see cref="Clear"/> is called. Not thread-safe.
    /// </summary>
    public sealed class ObservationLeaves
    {
        readonly float[] row;
        readonly bool[] given;
        int missing;

        /// <summary>
        /// Bound to <paramref name="space"/>'s leaves (allocates: once, at setup). INVALID_ARGUMENT when
        /// the space is not a Dict or Tuple.
        /// </summary>
        public ObservationLeaves(Space space)
        {
            if (space == null || !space.IsComposite)
            {
                throw new TetherException(ErrorCode.InvalidArgument, "ObservationLeaves needs a Dict or Tuple observation space" +
                                          (space == null ? "" : ", not a " + space.Kind));
            }
            Space = space;
            row = new float[space.FlatDim];
            given = new bool[space.Leaves.Count];
            missing = given.Length;
        }

        /// <summary>The space bound.</summary>
        public Space Space { get; private set; }

        /// <summary>The index of the leaf at <paramref name="path"/> (resolve it once, then set by index), or -1.</summary>
        public int Index(string path) { return Space.LeafIndex(path); }

        /// <summary>
        /// Copies <paramref name="values"/> as leaf <paramref name="leaf"/>'s values (flattened row-major; a
        /// byte box's as the integers 0-255). OBS_LEAF_MISMATCH for no such leaf, OBS_SHAPE_MISMATCH when
        /// their number is not the leaf's size; the leaf is then left as it was.
        /// </summary>
        public void Set(int leaf, float[] values)
        {
            SpaceLeaf target = Leaf(leaf, values == null ? -1 : values.Length);
            Array.Copy(values, 0, row, target.Offset, values.Length);
            Mark(leaf);
        }

        /// <summary>Copies bytes as leaf <paramref name="leaf"/>'s values (a camera image, or any leaf); as <see cref="Set(int, float[])"/>.</summary>
        public void Set(int leaf, byte[] values)
        {
            SpaceLeaf target = Leaf(leaf, values == null ? -1 : values.Length);
            int at = target.Offset;
            for (int i = 0; i < values.Length; ++i) row[at + i] = values[i];
            Mark(leaf);
        }

        /// <summary><see cref="Set(int, float[])"/> by leaf path (a lookup per call; no allocation).</summary>
        public void Set(string path, float[] values) { Set(Resolve(path), values); }

        /// <summary><see cref="Set(int, byte[])"/> by leaf path (a lookup per call; no allocation).</summary>
        public void Set(string path, byte[] values) { Set(Resolve(path), values); }

        /// <summary>Forgets every leaf's values: each must be set again before the next use.</summary>
        public void Clear()
        {
            Array.Clear(row, 0, row.Length);
            Array.Clear(given, 0, given.Length);
            missing = given.Length;
        }

        /// <summary>Whether every leaf has been set.</summary>
        public bool Complete { get { return missing == 0; } }

        /// <summary>
        /// Copies the observation's flat row (Space.FlatDim values, leaves in leaf order) into
        /// <paramref name="into"/> at <paramref name="offset"/>. OBS_LEAF_MISMATCH naming a leaf never set.
        /// </summary>
        public void CopyRow(float[] into, int offset)
        {
            CheckComplete();
            Array.Copy(row, 0, into, offset, row.Length);
        }

        // The flat row as it stands (the clients read it after CheckComplete).
        internal float[] Row { get { return row; } }

        // OBS_LEAF_MISMATCH naming the first leaf never set.
        internal void CheckComplete()
        {
            if (missing == 0) return;
            for (int i = 0; i < given.Length; ++i)
            {
                if (!given[i]) throw new TetherException(ErrorCode.ObsLeafMismatch, "observation leaf '" + Space.Leaves[i].Path + "' was not set");
            }
        }

        int Resolve(string path)
        {
            int index = path == null ? -1 : Space.LeafIndex(path);
            if (index < 0) throw new TetherException(ErrorCode.ObsLeafMismatch, "the observation space has no leaf '" + path + "'");
            return index;
        }

        SpaceLeaf Leaf(int leaf, int count)
        {
            if (leaf < 0 || leaf >= given.Length)
            {
                throw new TetherException(ErrorCode.ObsLeafMismatch, "the observation space has no leaf " + leaf + " (it has " + given.Length + ")");
            }
            SpaceLeaf target = Space.Leaves[leaf];
            if (count != target.Size)
            {
                throw new TetherException(ErrorCode.ObsShapeMismatch, "observation leaf '" + target.Path + "' needs " + target.Size + " values, got " +
                                          (count < 0 ? "none" : count.ToString(System.Globalization.CultureInfo.InvariantCulture)));
            }
            return target;
        }

        void Mark(int leaf)
        {
            if (given[leaf]) return;
            given[leaf] = true;
            --missing;
        }
    }
}
