// A small fast generator: xoshiro256** seeded through splitmix64 (the C++ SDK's, draw for draw).
using System;

namespace Tether.Sampling
{
    /// <summary>
    /// xoshiro256** with uniform and standard normal draws. Allocation-free.
    /// Not thread-safe: one per thread. The same seed gives the C++ SDK's sequence.
    /// </summary>
    public sealed class Rng
    {
        readonly ulong[] s = new ulong[4];
        bool hasSpare;
        double spare;

        /// <summary>A generator seeded with <paramref name="seed"/>.</summary>
        public Rng(ulong seed) { Reseed(seed); }

        /// <summary>Restarts the sequence from <paramref name="seed"/>.</summary>
        public void Reseed(ulong seed)
        {
            for (int i = 0; i < 4; ++i)
            {
                unchecked
                {
                    seed += 0x9E3779B97F4A7C15UL;
                    ulong z = seed;
                    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9UL;
                    z = (z ^ (z >> 27)) * 0x94D049BB133111EBUL;
                    s[i] = z ^ (z >> 31);
                }
            }
            hasSpare = false;
        }

        static ulong Rotl(ulong x, int k) { return (x << k) | (x >> (64 - k)); }

        /// <summary>The next 64 random bits.</summary>
        public ulong NextU64()
        {
            unchecked
            {
                ulong result = Rotl(s[1] * 5, 7) * 9;
                ulong t = s[1] << 17;
                s[2] ^= s[0];
                s[3] ^= s[1];
                s[1] ^= s[2];
                s[0] ^= s[3];
                s[2] ^= t;
                s[3] = Rotl(s[3], 45);
                return result;
            }
        }

        /// <summary>A uniform draw in [0, 1) with 53 random bits.</summary>
        public double Uniform() { return (NextU64() >> 11) * (1.0 / 9007199254740992.0); }

        /// <summary>A standard normal draw (Box-Muller; the second value of a pair is kept for the next call).</summary>
        public double Normal()
        {
            if (hasSpare)
            {
                hasSpare = false;
                return spare;
            }
            double u1 = 1.0 - Uniform();  // (0, 1]: the log is finite
            double u2 = Uniform();
            double radius = Math.Sqrt(-2.0 * Math.Log(u1));
            double angle = 6.283185307179586476925 * u2;
            spare = radius * Math.Sin(angle);
            hasSpare = true;
            return radius * Math.Cos(angle);
        }
    }
}
