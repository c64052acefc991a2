"""The Flask app of bench/middleware_bench.py, served by gunicorn (gthread
workers: the sync worker closes every connection, no keep-alive).

The same four routes as asgi_app.py:
  GET /bare      "ok", no middleware
  GET /get       one plain GET of bench:get on the same Redis, then "ok"
  GET /module/x  "ok" behind redis_tb.wsgi.RateLimitMiddleware, module backend
  GET /lua/x     the same on the Lua backend (FUNCTION library)
Every route goes through the same werkzeug DispatcherMiddleware, so the
difference between them is the handler's work alone. Env: REDIS_URL.
"""

import os

import redis
from flask import Flask
from werkzeug.middleware.dispatcher import DispatcherMiddleware

from redis_tb import Policy, RateLimiter
from redis_tb.wsgi import RateLimitMiddleware

client = redis.Redis.from_url(os.environ["REDIS_URL"])
POLICY = Policy(capacity=1e9, rate=1e9)

plain = Flask("plain")


@plain.route("/bare")
def bare():
    return "ok"


@plain.route("/get")
def one_get():
    client.get("bench:get")
    return "ok"


def limited(backend):
    inner = Flask(f"limited-{backend}")
    inner.add_url_rule("/x", "x", lambda: "ok")
    return RateLimitMiddleware(inner.wsgi_app, RateLimiter(client, backend=backend), POLICY)


app = DispatcherMiddleware(plain.wsgi_app, {"/module": limited("module"), "/lua": limited("function")})
