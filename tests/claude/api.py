#!/usr/bin/env python3
"""A stand-in for the Anthropic Messages API, on loopback, for the tests
that run the real Claude Code through boxdesk (tests/claude).

    api.py ADDR LOG      prints "port N" once it listens on ADDR:N

Every request is appended to LOG as one JSON line: method, path, and the
body (parsed). What it answers to POST /v1/messages is decided by the
conversation's last user turn, so the client's side requests (titles,
summaries, a quota check) get harmless text and the tests script the turns
in their own messages:

* the last user content holds a tool_result: a text turn
  "result: <the result's text, first 300 characters>", end_turn;
* the last user text has a line `TOOL <name> <json input>`: a tool_use
  block with that name and input, stop_reason tool_use (the first such
  line not yet answered in this conversation);
* `SLOW <seconds>`: the answer waits that long first (a turn to kill);
* otherwise: "echo: <the text's last line>", end_turn.

Streaming (`"stream": true`) is server-sent events as the real API sends
them (message_start, content_block_start/delta/stop, message_delta,
message_stop); otherwise one JSON message. count_tokens answers a count;
anything else is 404 with an API error body.
"""
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOCK = threading.Lock()
COUNTER = [0]


def next_id(prefix):
    with LOCK:
        COUNTER[0] += 1
        return "%s_%04d" % (prefix, COUNTER[0])


def texts(content):
    if isinstance(content, str):
        return [content]
    out = []
    for block in content or []:
        if block.get("type") == "text":
            out.append(block.get("text", ""))
    return out


def tool_result_text(content):
    if not isinstance(content, list):
        return None
    for block in content:
        if block.get("type") == "tool_result":
            c = block.get("content")
            if isinstance(c, list):
                c = "".join(b.get("text", "") for b in c if isinstance(b, dict))
            return str(c or "")
    return None


def decide(body):
    """(blocks, stop_reason, delay) for a request body."""
    messages = body.get("messages") or []
    user = [m for m in messages if m.get("role") == "user"]
    if not user:
        return [("text", "echo: (nothing)")], "end_turn", 0
    last = user[-1]
    result = tool_result_text(last.get("content"))
    if result is not None:
        return [("text", "result: " + result[:300])], "end_turn", 0
    # The user's own text: the last user message holding text.
    text = ""
    for m in reversed(user):
        t = "\n".join(texts(m.get("content")))
        if t.strip():
            text = t
            break
    delay = 0
    lines = [l.strip() for l in text.splitlines()]
    # System reminders Claude Code adds are their own text blocks: only
    # lines the tests wrote count.
    for l in lines:
        if l.startswith("SLOW "):
            delay = float(l.split()[1])
    for l in lines:
        if l.startswith("TOOL "):
            _, name, raw = l.split(" ", 2)
            return [("tool_use", name, json.loads(raw))], "tool_use", delay
    last_line = [l for l in lines if l and not l.startswith("<")]
    return [("text", "echo: " + (last_line[-1] if last_line else ""))], "end_turn", delay


def sse(handler, event, data):
    handler.wfile.write(("event: %s\ndata: %s\n\n" % (event, json.dumps(data))).encode())
    handler.wfile.flush()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    log_file = None

    def log_message(self, *args):
        pass

    def record(self, body):
        with LOCK:
            with open(self.log_file, "a") as f:
                f.write(json.dumps({"t": time.time(), "method": self.command, "path": self.path, "body": body}) + "\n")

    def reply_json(self, code, obj):
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.record(None)
        self.reply_json(404, {"type": "error", "error": {"type": "not_found_error", "message": "stand-in"}})

    def do_HEAD(self):
        self.record(None)
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def do_POST(self):
        n = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(n) if n else b""
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {"unparsed": raw.decode("utf-8", "replace")}
        self.record(body)
        path = self.path.split("?")[0]
        if path.endswith("/count_tokens"):
            return self.reply_json(200, {"input_tokens": 100})
        if not path.endswith("/v1/messages"):
            return self.reply_json(404, {"type": "error", "error": {"type": "not_found_error", "message": "stand-in"}})
        blocks, stop, delay = decide(body)
        if delay:
            time.sleep(delay)
        model = body.get("model", "claude-stand-in")
        mid = next_id("msg")
        usage = {"input_tokens": 100, "output_tokens": 10, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
        content = []
        for b in blocks:
            if b[0] == "text":
                content.append({"type": "text", "text": b[1]})
            else:
                content.append({"type": "tool_use", "id": next_id("toolu"), "name": b[1], "input": b[2]})
        if not body.get("stream"):
            return self.reply_json(200, {"id": mid, "type": "message", "role": "assistant", "model": model,
                                         "content": content, "stop_reason": stop, "stop_sequence": None, "usage": usage})
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("connection", "close")
        self.end_headers()
        self.close_connection = True
        sse(self, "message_start", {"type": "message_start", "message": {
            "id": mid, "type": "message", "role": "assistant", "model": model, "content": [],
            "stop_reason": None, "stop_sequence": None, "usage": usage}})
        for i, c in enumerate(content):
            if c["type"] == "text":
                sse(self, "content_block_start", {"type": "content_block_start", "index": i, "content_block": {"type": "text", "text": ""}})
                sse(self, "content_block_delta", {"type": "content_block_delta", "index": i, "delta": {"type": "text_delta", "text": c["text"]}})
            else:
                sse(self, "content_block_start", {"type": "content_block_start", "index": i, "content_block": {"type": "tool_use", "id": c["id"], "name": c["name"], "input": {}}})
                sse(self, "content_block_delta", {"type": "content_block_delta", "index": i, "delta": {"type": "input_json_delta", "partial_json": json.dumps(c["input"])}})
            sse(self, "content_block_stop", {"type": "content_block_stop", "index": i})
        sse(self, "message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None}, "usage": {"output_tokens": 10}})
        sse(self, "message_stop", {"type": "message_stop"})


def main():
    addr, log = sys.argv[1], sys.argv[2]
    Handler.log_file = log
    server = ThreadingHTTPServer((addr, 0), Handler)
    server.daemon_threads = True
    print("port %d" % server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
