// The tests reach the SDK's internal machinery.
using System.Runtime.CompilerServices;

[assembly: InternalsVisibleTo("Tether.Tests")]
