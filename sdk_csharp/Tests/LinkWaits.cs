// Waits of the reconnect tests.
using System;
using System.Threading;
using NUnit.Framework;
using Tether.Client;

namespace Tether.Tests
{
    internal static class LinkWaits
    {
        /// <summary>
        /// Until the link has made its <paramref name="connections"/>-th connection (at most 5 s). Its Connected
        /// event, with the new SET_CONFIG, is then queued for the game's thread, and the game's next call takes it
        /// in before it records or cuts anything. (Waiting for <c>Reconnects</c>, counted when the old connection
        /// is lost, left the handshake racing the game's next calls on a loaded machine.)
        /// </summary>
        public static void UntilConnected(ClientBase client, int connections = 2)
        {
            DateTime deadline = DateTime.UtcNow.AddSeconds(5);
            while (client.link.Connections < connections && DateTime.UtcNow < deadline) Thread.Sleep(10);
            Assert.That(client.link.Connections, Is.EqualTo(connections), "the link's connections");
        }
    }
}
