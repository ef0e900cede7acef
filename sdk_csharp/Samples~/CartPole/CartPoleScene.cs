// Builds the sample scene at start: a TetherManager and a row of cart-poles.
using Tether.Unity;
using UnityEngine;

namespace Tether.Samples
{
    /// <summary>
    /// Put this on one GameObject of an empty scene and give it a TetherSettings
    /// asset (Create > Tether > Settings). On Awake it adds the scene's
    /// TetherManager and <see cref="count"/> cart-poles built from primitives;
    /// run `tether serve --env CartPole-v1` and press Play.
    /// </summary>
    public sealed class CartPoleScene : MonoBehaviour
    {
        /// <summary>The server settings the manager uses.</summary>
        public TetherSettings settings;
        /// <summary>Cart-poles in the scene (all act with one module, one inference run per decision step).</summary>
        public int count = 16;
        /// <summary>Fixed steps between two decisions of each cart-pole.</summary>
        public int decisionPeriod = 1;

        void Awake()
        {
            var manager = gameObject.AddComponent<TetherManager>();
            manager.settings = settings;
            for (int i = 0; i < count; ++i)
            {
                var root = new GameObject("cartpole_" + i);
                root.transform.position = new Vector3(0f, 0f, 2f * i);
                GameObject cart = GameObject.CreatePrimitive(PrimitiveType.Cube);
                cart.transform.SetParent(root.transform, false);
                cart.transform.localScale = new Vector3(0.5f, 0.25f, 0.3f);
                var pivot = new GameObject("pivot");  // the pole turns about the cart's top
                pivot.transform.SetParent(root.transform, false);
                pivot.transform.localPosition = new Vector3(0f, 0.125f, 0f);
                GameObject pole = GameObject.CreatePrimitive(PrimitiveType.Cylinder);
                pole.transform.SetParent(pivot.transform, false);
                pole.transform.localScale = new Vector3(0.05f, 0.5f, 0.05f);
                pole.transform.localPosition = new Vector3(0f, 0.5f, 0f);
                CartPoleAgent agent = root.AddComponent<CartPoleAgent>();
                agent.agentId = root.name;
                agent.decisionPeriod = decisionPeriod;
                agent.cart = cart.transform;
                agent.pole = pivot.transform;
            }
        }
    }
}
