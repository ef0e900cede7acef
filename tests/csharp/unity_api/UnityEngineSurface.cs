// The few UnityEngine declarations sdk_csharp/Runtime/Unity uses, so that layer's
// C# can be compiled (type-checked) outside Unity. Not Unity: nothing here runs;
// sdk_csharp/scripts/build_and_test.sh only compiles the layer against it.
using System;

namespace UnityEngine
{
    public class Object
    {
        public string name;
        public static T[] FindObjectsOfType<T>() where T : Object { return new T[0]; }
    }

    public class GameObject : Object
    {
        public GameObject() { }
        public GameObject(string name) { this.name = name; }
        public Transform transform;
        public T AddComponent<T>() where T : Component, new() { return new T(); }
        public static GameObject CreatePrimitive(PrimitiveType type) { return new GameObject(); }
    }

    public enum PrimitiveType { Sphere, Capsule, Cylinder, Cube, Plane, Quad }

    public class Component : Object
    {
        public GameObject gameObject;
        public Transform transform;
    }

    public class Transform : Component
    {
        public Vector3 position;
        public Vector3 localPosition;
        public Vector3 localScale;
        public Quaternion localRotation;
        public void SetParent(Transform parent, bool worldPositionStays) { }
    }

    public struct Vector3
    {
        public float x, y, z;
        public Vector3(float x, float y, float z) { this.x = x; this.y = y; this.z = z; }
    }

    public struct Quaternion
    {
        public static Quaternion Euler(float x, float y, float z) { return new Quaternion(); }
    }

    public static class Mathf
    {
        public const float PI = 3.14159274f;
        public const float Rad2Deg = 57.29578f;
        public static float Cos(float f) { return (float)Math.Cos(f); }
        public static float Sin(float f) { return (float)Math.Sin(f); }
    }

    public static class Random
    {
        public static float Range(float min, float max) { return min; }
    }

    public class Behaviour : Component
    {
        public bool enabled;
        public bool isActiveAndEnabled;
    }

    public class MonoBehaviour : Behaviour
    {
    }

    public class ScriptableObject : Object
    {
    }

    public static class Debug
    {
        public static void LogError(object message, Object context) { }
        public static void LogError(object message) { }
        public static void LogWarning(object message, Object context) { }
        public static void LogWarning(object message) { }
    }

    public static class Application
    {
        public static string temporaryCachePath { get { return ""; } }
        public static string streamingAssetsPath { get { return ""; } }
    }

    [AttributeUsage(AttributeTargets.Class)]
    public sealed class CreateAssetMenuAttribute : Attribute
    {
        public string fileName;
        public string menuName;
    }

    [AttributeUsage(AttributeTargets.Field)]
    public sealed class TooltipAttribute : Attribute
    {
        public TooltipAttribute(string tooltip) { }
    }

    [AttributeUsage(AttributeTargets.Field)]
    public sealed class MinAttribute : Attribute
    {
        public MinAttribute(float min) { }
    }

    [AttributeUsage(AttributeTargets.Class)]
    public sealed class DefaultExecutionOrder : Attribute
    {
        public DefaultExecutionOrder(int order) { }
    }
}
