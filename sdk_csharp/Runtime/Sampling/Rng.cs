// A small fast generator: xoshiro256** seeded through splitmix64 (the C++ SDK's, draw for draw).
using System;
using System.Runtime.CompilerServices;

namespace Tether.Sampling
{
    /// <summary>
    /// xoshiro256** with uniform and standard normal draws. Allocation-free.
    /// Not thread-safe: one per thread. The same seed gives the C++ SDK's sequence.
    /// </summary>
    public sealed class Rng
    {
        ulong s0, s1, s2, s3;  // (fields, not an array: no bounds checks per draw)
        bool hasSpare;
        double spare;

        /// <summary>A generator seeded with <paramref name="seed"/>.</summary>
        public Rng(ulong seed) { Reseed(seed); }

        /// <summary>Restarts the sequence from <paramref name="seed"/>.</summary>
        public void Reseed(ulong seed)
        {
            s0 = SplitMix(ref seed);
            s1 = SplitMix(ref seed);
            s2 = SplitMix(ref seed);
            s3 = SplitMix(ref seed);
            hasSpare = false;
        }

        static ulong SplitMix(ref ulong seed)
        {
            unchecked
            {
                seed += 0x9E3779B97F4A7C15UL;
                ulong z = seed;
                z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9UL;
                z = (z ^ (z >> 27)) * 0x94D049BB133111EBUL;
                return z ^ (z >> 31);
            }
        }

        /// <summary>The next 64 random bits.</summary>
        public ulong NextU64()
        {
            ulong a = s0, b = s1, c = s2, d = s3;
            ulong result = Step(ref a, ref b, ref c, ref d);
            s0 = a;
            s1 = b;
            s2 = c;
            s3 = d;
            return result;
        }

        /// <summary>The next <paramref name="count"/> Uniform draws, in order, into <paramref name="into"/>.</summary>
        internal void FillUniform(double[] into, int count)
        {
            ulong a = s0, b = s1, c = s2, d = s3;  // (the state in locals for the whole run)
            for (int i = 0; i < count; ++i) into[i] = ToUniform(Step(ref a, ref b, ref c, ref d));
            s0 = a;
            s1 = b;
            s2 = c;
            s3 = d;
        }

        /// <summary>A uniform draw in [0, 1) with 53 random bits.</summary>
        public double Uniform() { return ToUniform(NextU64()); }

        // One xoshiro256** step of the state a, b, c, d (locals of the caller: inlined, they stay in
        // registers); returns its 64 bits.
        [MethodImpl(MethodImplOptions.AggressiveInlining)]
        static ulong Step(ref ulong a, ref ulong b, ref ulong c, ref ulong d)
        {
            unchecked
            {
                ulong x = b * 5;
                ulong result = ((x << 7) | (x >> 57)) * 9;
                ulong t = b << 17;
                c ^= a;
                d ^= b;
                b ^= c;
                a ^= d;
                c ^= t;
                d = (d << 45) | (d >> 19);
                return result;
            }
        }

        // The top 53 of 64 random bits as a double in [0, 1).
        static double ToUniform(ulong bits) { return (bits >> 11) * (1.0 / 9007199254740992.0); }

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
