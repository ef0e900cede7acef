// A cart-pole that a Tether server trains: gymnasium's CartPole-v1 physics
// stepped in FixedUpdate, shown by moving two child transforms.
using Tether.Unity;
using UnityEngine;

namespace Tether.Samples
{
    /// <summary>
    /// One cart-pole. Observation: cart position and velocity, pole angle and
    /// angular velocity (4 numbers); action: Discrete(2), push left or right.
    /// Reward 1 per step; the agent leaves (terminated) when the pole falls or
    /// the cart leaves the track, truncated after 500 decisions, and comes back
    /// at once as a new agent with a fresh cart-pole.
    /// </summary>
    public sealed class CartPoleAgent : TetherAgent
    {
        /// <summary>The cart's visual (moved along x).</summary>
        public Transform cart;
        /// <summary>The pole's visual (rotated about z).</summary>
        public Transform pole;

        const float Gravity = 9.8f, MassCart = 1f, MassPole = 0.1f, Length = 0.5f, ForceMag = 10f, Tau = 0.02f;
        const float XThreshold = 2.4f, ThetaThreshold = 12f * 2f * Mathf.PI / 360f;
        float x, xDot, theta, thetaDot;
        int steps;

        /// <inheritdoc />
        public override int ObservationSize { get { return 4; } }

        /// <inheritdoc />
        protected override void OnEnable()
        {
            Restart();
            base.OnEnable();
        }

        void Restart()
        {
            x = Random.Range(-0.05f, 0.05f);
            xDot = Random.Range(-0.05f, 0.05f);
            theta = Random.Range(-0.05f, 0.05f);
            thetaDot = Random.Range(-0.05f, 0.05f);
            steps = 0;
        }

        /// <inheritdoc />
        public override void CollectObservations(float[] observation)
        {
            observation[0] = x;
            observation[1] = xDot;
            observation[2] = theta;
            observation[3] = thetaDot;
        }

        /// <inheritdoc />
        public override void OnActionReceived(double[] action)
        {
            float force = action[0] >= 0.5 ? ForceMag : -ForceMag;
            float cos = Mathf.Cos(theta), sin = Mathf.Sin(theta);
            float total = MassCart + MassPole, poleMassLength = MassPole * Length;
            float temp = (force + poleMassLength * thetaDot * thetaDot * sin) / total;
            float thetaAcc = (Gravity * sin - cos * temp) / (Length * (4f / 3f - MassPole * cos * cos / total));
            float xAcc = temp - poleMassLength * thetaAcc * cos / total;
            x += Tau * xDot;
            xDot += Tau * xAcc;
            theta += Tau * thetaDot;
            thetaDot += Tau * thetaAcc;
            ++steps;
            AddReward(1f);
            if (cart != null) cart.localPosition = new Vector3(x, 0f, 0f);
            if (pole != null) pole.localPosition = new Vector3(x, 0.125f, 0f);
            if (pole != null) pole.localRotation = Quaternion.Euler(0f, 0f, -theta * Mathf.Rad2Deg);
            bool fell = x < -XThreshold || x > XThreshold || theta < -ThetaThreshold || theta > ThetaThreshold;
            if (fell || steps >= 500)
            {
                EndAgent(truncated: !fell);
                Restart();
            }
        }
    }
}
