// The shortest decimal that reads back as the same float32, found with
// double arithmetic. The runtime's own round-trip formatting goes through
// printf twice per number under mono: formatting a batch's observations that
// way took most of the link thread's time, a core's worth at 30,000 agent
// steps a second.
using System;

namespace Tether.Protocol
{
    /// <summary>
    /// Shortest round-trip text of a float32 ("0.1", not "0.100000001"), as JSON numbers.
    /// </summary>
    internal static class Float32Text
    {
        // 10^0 .. 10^MaxPower as doubles (exact to 10^22, correctly rounded beyond).
        const int MaxPower = 60;
        static readonly double[] Powers = MakePowers();

        // A candidate this close to the edge of the interval that reads back as
        // the value, relative to the numbers compared, is left undecided: the
        // double arithmetic's error is within 2^-51 of them (a product of a
        // power that is off by at most an ulp), this allows 2^-47.
        const double Margin = 1.0 / (1L << 47);

        static double[] MakePowers()
        {
            var powers = new double[MaxPower + 1];
            powers[0] = 1.0;
            for (int k = 1; k <= 22; ++k) powers[k] = powers[k - 1] * 10.0;  // (exact: 10^22 < 2^53 * 2^22)
            for (int k = 23; k <= MaxPower; ++k)
            {
                powers[k] = double.Parse("1e" + k, System.Globalization.CultureInfo.InvariantCulture);
            }
            return powers;
        }

        /// <summary>
        /// Writes the shortest decimal that reads back as <paramref name="value"/> (finite) into
        /// <paramref name="into"/> (at least 32 characters) from index 0, always with a "." or an
        /// exponent (a JSON number that reads as a float); returns its length, or 0 for a value
        /// the double arithmetic cannot decide: the caller formats it exactly. (About 1 in 230 of
        /// all bit patterns, nearly all whole numbers from 2^24 to 2^31 whose rounding boundary is
        /// itself a short decimal, a tie read back by round-half-even; no value of a game's usual
        /// range in a test of 100,000.)
        /// </summary>
        internal static int Write(float value, char[] into)
        {
            int bits = new Tensors.FloatBits { Value = value }.Bits;
            int n = 0;
            if (bits < 0) into[n++] = '-';
            int exponentBits = (bits >> 23) & 0xFF;
            int fraction = bits & 0x7FFFFF;
            if (exponentBits == 0xFF) return 0;  // (not finite: the caller's)
            if (exponentBits == 0 && fraction == 0)
            {
                into[n++] = '0';
                into[n++] = '.';
                into[n++] = '0';
                return n;
            }
            // |value| = m * 2^e; it reads back from anything strictly between
            // |value| - below and |value| + above (half the gaps to its neighbours;
            // the gap below is half as wide at the bottom of a binade).
            long m = exponentBits == 0 ? fraction : fraction | 0x800000;
            int e = (exponentBits == 0 ? 1 : exponentBits) - 150;
            double v = Math.Abs((double)value);
            double ulp = BitConverter.Int64BitsToDouble((long)(e + 1023) << 52);  // 2^e
            double above = ulp / 2, below = (m == 0x800000 && exponentBits > 1) ? ulp / 4 : ulp / 2;
            // The first digit's power of ten, from the binary exponent (maybe one low: then a
            // candidate has a digit more than asked, which is harmless).
            int first = (int)Math.Floor((e + 23 + (m >= 0x800000 ? 0 : (int)Math.Log(m, 2) - 23)) * 0.30102999566398120);
            // Fewer digits than enough never are: the fewest is found by halving 1..9.
            long best = 0;
            int bestK = 0, lo = 1, hi = 9;
            while (lo <= hi)
            {
                int digits = (lo + hi) / 2;
                long candidate;
                int k = digits - 1 - first;  // candidates are D * 10^-k
                int verdict = Nearest(v, above, below, k, out candidate);
                if (verdict == 0) return 0;
                if (verdict > 0)
                {
                    best = candidate;
                    bestK = k;
                    hi = digits - 1;
                }
                else
                {
                    lo = digits + 1;
                }
            }
            return best == 0 ? 0 : Format(best, bestK, into, n);  // (none: never, nine digits always read back)
        }

        // The D (> 0) nearest v * 10^k whose D * 10^-k reads back as v, if the nearest or its other
        // neighbour does: 1 and D; -1 if neither does; 0 when it is too close to tell.
        static int Nearest(double v, double above, double below, int k, out long candidate)
        {
            candidate = 0;
            if (k > MaxPower || -k > MaxPower) return 0;
            double scaled, high, low;
            if (k >= 0)
            {
                double p = Powers[k];
                scaled = v * p;
                high = above * p;
                low = below * p;
            }
            else
            {
                double p = Powers[-k];
                scaled = v / p;
                high = above / p;
                low = below / p;
            }
            if (scaled >= 9.2e18) return 0;  // (a long holds it: never for the digits asked)
            double nearest = (double)(long)(scaled + 0.5);
            double slack = (scaled + high) * Margin;
            int verdict = Reads(nearest - scaled, low, high, slack);
            if (verdict < 0)
            {
                // (at the bottom of a binade the other neighbour may be inside though this one is not)
                double other = nearest > scaled ? nearest - 1 : nearest + 1;
                verdict = other <= 0 ? -1 : Reads(other - scaled, low, high, slack);
                nearest = other;
            }
            if (verdict > 0) candidate = (long)nearest;
            return verdict;
        }

        /// <summary>
        /// The text <see cref="Write"/> gives a finite value, or the runtime's round-trip text where it gives none.
        /// </summary>
        internal static string Of(float value)
        {
            var into = new char[32];
            int n = Write(value, into);
            return n > 0 ? new string(into, 0, n) : value.ToString("R", System.Globalization.CultureInfo.InvariantCulture);
        }

        // 1: value + diff reads back as the value; -1: it does not; 0: too close to tell.
        static int Reads(double diff, double low, double high, double slack)
        {
            if (diff > -low + slack && diff < high - slack) return 1;
            if (diff < -low - slack || diff > high + slack) return -1;
            return 0;
        }

        // Writes digits * 10^-k from into[n] (after any sign): fixed notation from 10^-4 to 10^16, else
        // with an exponent.
        static int Format(long digits, int k, char[] into, int n)
        {
            while (digits % 10 == 0)
            {
                digits /= 10;
                --k;
            }
            int start = n;
            int count = 0;
            for (long rest = digits; rest > 0; rest /= 10) ++count;
            int power = count - 1 - k;  // the first digit's
            if (power >= -4 && power < 16)
            {
                if (power < 0)
                {
                    into[n++] = '0';
                    into[n++] = '.';
                    for (int i = -1; i > power; --i) into[n++] = '0';
                    return n + WriteDigits(digits, count, into, n);
                }
                n += WriteDigits(digits, count, into, n);
                if (power >= count - 1)
                {
                    for (int i = count - 1; i < power; ++i) into[n++] = '0';
                    into[n++] = '.';
                    into[n++] = '0';
                    return n;
                }
                // The point goes after the first power + 1 digits.
                int point = start + power + 1;
                Array.Copy(into, point, into, point + 1, n - point);
                into[point] = '.';
                return n + 1;
            }
            n += WriteDigits(digits, count, into, n);
            int head = start + 1;
            if (count > 1)
            {
                Array.Copy(into, head, into, head + 1, n - head);
                into[head] = '.';
                ++n;
            }
            into[n++] = 'e';
            if (power < 0)
            {
                into[n++] = '-';
                power = -power;
            }
            if (power >= 10) into[n++] = (char)('0' + power / 10);
            into[n++] = (char)('0' + power % 10);
            return n;
        }

        static int WriteDigits(long digits, int count, char[] into, int at)
        {
            for (int i = count - 1; i >= 0; --i)
            {
                into[at + i] = (char)('0' + (int)(digits % 10));
                digits /= 10;
            }
            return count;
        }
    }
}
