// One leaf of a Dict or Tuple space (docs/protocol.md §8.6, protocol 1.4).
namespace Tether.Protocol
{
    /// <summary>
    /// A subspace of a Dict or Tuple space, at any depth, that is not composite, and where its values
    /// sit in the space's flat row. Immutable.
    /// </summary>
    public sealed class SpaceLeaf
    {
        /// <summary>The keys and tuple indices from the outermost space to the leaf, joined by '.' ("camera", "arm.0").</summary>
        public string Path { get; private set; }
        /// <summary>The leaf's own space: a Box, Discrete or MultiDiscrete.</summary>
        public Space Space { get; private set; }
        /// <summary>Its position in leaf order (the index of <see cref="Protocol.Space.Leaves"/>).</summary>
        public int Index { get; private set; }
        /// <summary>Its first value in the flat row.</summary>
        public int Offset { get; private set; }
        /// <summary>Its number of values (the leaf space's FlatDim).</summary>
        public int Size { get { return Space.FlatDim; } }
        /// <summary>Whether it is a byte box (its model input takes uint8 in its shape, §12.1).</summary>
        public bool IsBytes { get { return Space.IsBytes; } }

        internal SpaceLeaf(string path, Space space, int index, int offset)
        {
            Path = path;
            Space = space;
            Index = index;
            Offset = offset;
        }
    }
}
