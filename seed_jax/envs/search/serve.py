"""Serves a local corpus over the Search-R1 retrieval API, with BM25.

  python -m seed_jax.envs.search.serve [--corpus=wiki.jsonl] [--port=8000]

`POST /retrieve` with `{"queries": [str, ...], "topk": int, "return_scores": bool}` answers
`{"result": [[{"document": {"id", "contents"}, "score": float}, ...] per query]}`, or lists
of bare documents when return_scores is false. A malformed request gets a 4xx answer with
`{"error": "..."}`; the server never dies of a bad request. It binds to loopback by default.
"""

from __future__ import annotations

import argparse
import http.server
import json
import logging
import threading
from typing import Any

from seed_jax.envs import search as search_env
from seed_jax.envs.search import data, retrieval

MAX_BODY_BYTES = 1 << 20
MAX_QUERIES = 512
MAX_TOPK = 100


class RequestError(Exception):
  """A client error: becomes an HTTP status and a JSON error message."""

  def __init__(self, status: int, message: str):
    super().__init__(message)
    self.status = status


def parse_request(body: bytes) -> tuple[list[str], int, bool]:
  """Validates a /retrieve body; returns (queries, topk, return_scores) or raises
  RequestError(400)."""
  try:
    request = json.loads(body)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise RequestError(400, f"body is not JSON: {e}") from e
  if not isinstance(request, dict):
    raise RequestError(400, "body must be a JSON object")
  queries = request.get("queries")
  if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
    raise RequestError(400, "'queries' must be a list of strings")
  if len(queries) > MAX_QUERIES:
    raise RequestError(400, f"at most {MAX_QUERIES} queries per request")
  topk = request.get("topk", 3)
  if isinstance(topk, bool) or not isinstance(topk, int) or not 1 <= topk <= MAX_TOPK:
    raise RequestError(400, f"'topk' must be an integer in [1, {MAX_TOPK}]")
  return_scores = request.get("return_scores", False)
  if not isinstance(return_scores, bool):
    raise RequestError(400, "'return_scores' must be a boolean")
  return queries, topk, return_scores


def make_server(retriever: retrieval.BM25Retriever, host: str = "127.0.0.1",
                port: int = 0) -> http.server.ThreadingHTTPServer:
  """An HTTP server (not yet serving) for `retriever`; port 0 picks a free port, read it
  back from `server.server_address`."""

  class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 10  # seconds: a client that stalls mid-body only ties up its own thread

    def _reply(self, status: int, payload: Any) -> None:
      body = json.dumps(payload).encode()
      self.send_response(status)
      self.send_header("Content-Type", "application/json")
      self.send_header("Content-Length", str(len(body)))
      self.end_headers()
      self.wfile.write(body)

    def do_POST(self):  # noqa: N802  (http.server's naming)
      try:
        if self.path.rstrip("/") != "/retrieve":
          raise RequestError(404, f"unknown path {self.path}; use POST /retrieve")
        try:
          length = int(self.headers.get("Content-Length", ""))
        except ValueError as e:
          raise RequestError(411, "a Content-Length header is required") from e
        if length < 0 or length > MAX_BODY_BYTES:
          raise RequestError(413, f"body must be at most {MAX_BODY_BYTES} bytes")
        queries, topk, return_scores = parse_request(self.rfile.read(length))
      except RequestError as e:
        self.close_connection = True  # an unread body must not be parsed as a request
        self._reply(e.status, {"error": str(e)})
        return
      results = retriever.retrieve_with_scores(queries, topk)
      if return_scores:
        payload = [[{"document": d, "score": s} for d, s in zip(docs, scores)]
                   for docs, scores in results]
      else:
        payload = [docs for docs, _ in results]
      self._reply(200, {"result": payload})

    def do_GET(self):  # noqa: N802
      self.close_connection = True
      self._reply(405, {"error": "use POST /retrieve"})

    def log_message(self, format, *args):  # noqa: A002  (http.server's signature)
      logging.getLogger(__name__).debug("retrieval server: " + format, *args)

  server = http.server.ThreadingHTTPServer((host, port), Handler)
  server.daemon_threads = True
  return server


def serve_in_thread(retriever: retrieval.BM25Retriever,
                    host: str = "127.0.0.1") -> tuple[http.server.ThreadingHTTPServer, str]:
  """Starts a server on an ephemeral port in a daemon thread; returns (server, url).
  Stop it with `server.shutdown(); server.server_close()`."""
  server = make_server(retriever, host, 0)
  # A short poll interval makes shutdown() return quickly.
  threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                   daemon=True).start()
  return server, f"http://{host}:{server.server_address[1]}/retrieve"


def main(argv: list[str] | None = None) -> None:
  """Command line: serves until interrupted."""
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--corpus", default="",
                      help="wiki-18-format jsonl; empty: the embedded corpus")
  parser.add_argument("--host", default="127.0.0.1", help="interface to bind (loopback by default)")
  parser.add_argument("--port", type=int, default=8000, help="port (0: any free port)")
  args = parser.parse_args(argv)
  path = args.corpus or str(search_env.embedded_data_paths(search_env.default_config())[0])
  retriever = retrieval.BM25Retriever(data.load_corpus(path))
  server = make_server(retriever, args.host, args.port)
  host, port = server.server_address[:2]
  print(f"serving {path} at http://{host}:{port}/retrieve", flush=True)
  try:
    server.serve_forever()
  except KeyboardInterrupt:
    pass
  finally:
    server.server_close()


if __name__ == "__main__":
  main()
