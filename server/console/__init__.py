"""The live debug console: a web page and a websocket feed served by ``tether serve``."""
