// A minimal RLlink client over a websocket (docs/protocol.md §3.4): one message
// body per websocket message, one request in flight, answers paired in order.
"use strict";

class RLlinkError extends Error {
  constructor(message, code) { super(message); this.code = code; }
}

// ERROR codes the server sends unsolicited, without "request", before it closes (§5.3, §6.6):
// they answer no request.
const CLOSING_CODES = new Set(["BAD_HEADER", "FRAME_TOO_LARGE", "TOO_MANY_CONNECTIONS", "HANDSHAKE_TIMEOUT",
                               "CLIENT_TIMEOUT", "SERVER_OVERLOADED", "AUTH_THROTTLED", "TRAINING_DONE"]);

class RLlinkSocket {
  /** Opens ws `url`; resolves once open. */
  static open(url) {
    return new Promise((resolve, reject) => {
      const ws = new WebSocket(url);
      const link = new RLlinkSocket(ws);
      ws.onopen = () => resolve(link);
      ws.onerror = () => reject(new RLlinkError(`cannot open ${url}`, "CONNECTION_FAILED"));
    });
  }

  constructor(ws) {
    this.ws = ws;
    this.waiting = [];  // resolvers of the requests in flight, in order
    this.closed = null;
    this.farewell = null;  // the connection-level ERROR the server sent before closing, if any
    ws.onmessage = event => {
      const body = JSON.parse(event.data);
      if (body.type === "ERROR" && body.request === undefined && CLOSING_CODES.has(body.code)) {
        this.farewell = body;
        return;
      }
      const next = this.waiting.shift();
      if (next) next.resolve(body);
    };
    ws.onclose = event => {
      this.closed = this.farewell
        ? new RLlinkError(`${this.farewell.code}: ${this.farewell.message}`, this.farewell.code)
        : new RLlinkError(`the server closed the connection (${event.code} ${event.reason})`, "CLOSED");
      this.closed.summary = this.farewell && this.farewell.summary;
      for (const w of this.waiting.splice(0)) w.reject(this.closed);
    };
  }

  /** Sends a request and resolves with its answer; an ERROR answer rejects with its code. */
  request(message) {
    if (this.closed) return Promise.reject(this.closed);
    return new Promise((resolve, reject) => {
      this.waiting.push({
        resolve: answer => answer.type === "ERROR"
          ? reject(new RLlinkError(`${answer.code}: ${answer.message}`, answer.code)) : resolve(answer),
        reject,
      });
      this.ws.send(JSON.stringify(message));
    });
  }
}

/** The ONNX model of an onnx_file field: base64(gzip(model)) (§12.3). */
async function decodeOnnx(field) {
  const packed = Uint8Array.from(atob(field), c => c.charCodeAt(0));
  const stream = new Blob([packed]).stream().pipeThrough(new DecompressionStream("gzip"));
  return new Uint8Array(await new Response(stream).arrayBuffer());
}
