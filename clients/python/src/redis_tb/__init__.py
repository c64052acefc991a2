"""redis-tb client: token-bucket rate limiting on Redis/Valkey with the
redis-tb module, or its Lua fallback (lua/tb.lua) where the module is not
loaded. See README.md."""

from ._core import (
    Concurrency,
    Decision,
    InvalidArgument,
    InvalidNumber,
    Lease,
    LeaseDenied,
    LeaseLost,
    Limit,
    LimiterError,
    LimiterReplyError,
    LimiterUnavailable,
    Policy,
    TopKey,
    bucket_key,
    escape_id,
    lua_library,
    lua_script,
)
from ._lease import AsyncLeaseGuard, LeaseGuard
from .aio import AsyncRateLimiter
from .limiter import RateLimiter

__version__ = "0.1.0"

__all__ = [
    "Concurrency",
    "AsyncRateLimiter",
    "Decision",
    "InvalidArgument",
    "InvalidNumber",
    "Lease",
    "LeaseDenied",
    "LeaseGuard",
    "AsyncLeaseGuard",
    "LeaseLost",
    "Limit",
    "LimiterError",
    "LimiterReplyError",
    "LimiterUnavailable",
    "Policy",
    "RateLimiter",
    "TopKey",
    "bucket_key",
    "escape_id",
    "lua_library",
    "lua_script",
    "__version__",
]
