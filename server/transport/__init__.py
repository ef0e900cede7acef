"""Transports: how bytes reach the server. TCP (tcp.py) and websocket (websocket.py) are
adapters around the same connection limits (connection_limits.py, auth_throttle.py),
deadlines (deadlines.py) and sockets (sockets.py); each hands every received body to
``RLlinkService.answer``, which answers it the same way on both."""
