"""The Flask app of bench/middleware_bench.py, served by gunicorn (gthread
workers: the sync worker closes every connection, no keep-alive).

The same four routes as asgi_app.py, each a Flask app of its own under
werkzeug's DispatcherMiddleware, so that they differ only by the GET or the
middleware:
  GET /bare/x    "ok", no middleware
  GET /get/x     one plain GET of bench:get on the same Redis, then "ok"
  GET /module/x  "ok" behind redis_tb.wsgi.RateLimitMiddleware, module backend
  GET /lua/x     the same on the Lua backend (FUNCTION library)
Env: REDIS_URL.
"""

import os

import redis
from flask import Flask
from werkzeug.middleware.dispatcher import DispatcherMiddleware

from redis_tb import Policy, RateLimiter
from redis_tb.wsgi import RateLimitMiddleware

client = redis.Redis.from_url(os.environ["REDIS_URL"])
POLICY = Policy(capacity=1e9, rate=1e9)

def ok():
    return "ok"


def one_get():
    client.get("bench:get")
    return "ok"


def sub(name, handler):
    app = Flask(name)
    app.add_url_rule("/x", "x", handler)
    return app.wsgi_app


def limited(backend):
    return RateLimitMiddleware(sub(f"limited-{backend}", ok), RateLimiter(client, backend=backend), POLICY)


def not_found(environ, start_response):
    start_response("404 Not Found", [("Content-Length", "0")])
    return [b""]


app = DispatcherMiddleware(
    not_found,
    {"/bare": sub("bare", ok), "/get": sub("get", one_get), "/module": limited("module"), "/lua": limited("function")},
)
