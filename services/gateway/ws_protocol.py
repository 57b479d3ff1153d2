"""The gateway's WebSocket protocol for uvicorn: its `websockets-sansio` one, answering a
handshake that the `websockets` library cannot read instead of leaving it hanging.

`websockets` reads a handshake's lines up to 8 KiB each; for one with a longer line (a
20,000-byte `Authorization` or `Cookie` header) it prepares its own answer, 431 Request
Header Fields Too Large (414 for the request line), and expects it to be sent. uvicorn
sends its answers only for the handshakes it hands to the app, so that connection got
nothing until the client gave up. Here the prepared answer is sent and the connection
closed. (A credential short enough to be read but over the bound of workshop.kit.auth
reaches the app, which answers 401 CREDENTIAL_MALFORMED like every HTTP route.)
"""

from __future__ import annotations

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol


class GatewayWebSocketProtocol(WebSocketsSansIOProtocol):
    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if not self.handshake_initiated and self.conn.handshake_exc is not None:
            self.transport.write(b"".join(self.conn.data_to_send()))
            self.transport.close()
