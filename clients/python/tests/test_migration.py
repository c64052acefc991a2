"""From the Lua fallback to the module on the same keys: nothing is lost."""

from __future__ import annotations

import redis

from redis_tb import Limit, RateLimiter

from conftest import module_path
from test_api import SLOW


def test_module_loaded_after_the_script(own_server):
    client = redis.Redis(port=own_server.port)
    function = RateLimiter(client)
    script = RateLimiter(client, backend="script")
    assert [function.take("m:f", 10, SLOW, 3).remaining for _ in range(2)] == [7, 4]
    assert [script.take("m:s", 10, SLOW, 2).remaining for _ in range(2)] == [8, 6]
    assert function.take_all([Limit("{m}a", 5, SLOW, 2), Limit("{m}b", 3, SLOW)]).remaining == 2
    assert function.backend == "function" and script.backend == "script"

    client.execute_command("MODULE", "LOAD", module_path())

    module = RateLimiter(client)
    assert module.connect() == "module"
    assert module.take("m:f", 10, SLOW, 1).remaining == 3
    assert module.take("m:s", 10, SLOW, 1).remaining == 5
    assert module.peek("m:f", 10, SLOW).remaining == 2
    d = module.take_all([Limit("{m}a", 5, SLOW, 2), Limit("{m}b", 3, SLOW)])
    assert d.allowed and d.index == 0 and d.remaining == 1
    assert not module.take("m:f", 10, SLOW, 4).allowed
    client.close()
