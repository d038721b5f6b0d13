"""The API's per-user rate (FLYWHEEL_API_RATE): one Redis round trip per request.

DRF's `UserRateThrottle` keeps each user's request times as a pickled list in the cache, read and
written whole on every request: at the default 6,000/min that is up to 6,000 floats unpickled,
filtered and pickled again, in two round trips. This throttle keeps one number per user instead,
the generic cell rate algorithm (GCRA) run as a Lua script inside Redis: a rate of N per period
lets a burst of N through, then one request every period/N; a refused request is not counted and
learns exactly when the next one will be let through. Redis' clock decides, so hosts whose clocks
differ share one budget. While Redis is unreachable the throttle lets requests through (see
core.outage: reads keep answering).
"""

import logging

from django.core.cache import cache
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError
from rest_framework.request import Request
from rest_framework.throttling import UserRateThrottle

from core import outage

logger = logging.getLogger(__name__)

# KEYS[1]: the user's theoretical arrival time (TAT, in microseconds); ARGV: emission interval and
# period, in microseconds. Returns 0 when the request is let through, else the microseconds to wait.
GCRA = """
local now = redis.call('TIME')
now = tonumber(now[1]) * 1000000 + tonumber(now[2])
local interval = tonumber(ARGV[1])
local period = tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1])) or now  -- DRF's pickled list (before an upgrade): none
if tat < now then tat = now end
local next_tat = tat + interval
if next_tat - now > period then
  return next_tat - period - now
end
redis.call('SET', KEYS[1], next_tat, 'PX', math.ceil((next_tat - now) / 1000))
return 0
"""


class RedisRateThrottle(UserRateThrottle):
    """`UserRateThrottle`'s rate, scope and identity (the user, or the address when anonymous),
    kept by GCRA in Redis."""

    # Set by SimpleRateThrottle.__init__ from the rate; DRF's stubs do not declare them.
    duration: int
    num_requests: int

    _script = None

    def allow_request(self, request: Request, view) -> bool:
        self.waiting = 0.0
        if self.rate is None:
            return True
        self.key = self.get_cache_key(request, view)
        if self.key is None or outage.breaker.is_open():
            return True
        period = self.duration * 1_000_000
        key = cache.make_key(f"{self.key}:{self.rate}")  # see budget_key
        try:
            waiting = self.script()(keys=[key], args=[period // self.num_requests, period])
        except (RedisConnectionError, RedisTimeoutError) as exc:
            outage.breaker.trip(exc)
            return True
        except RedisError as exc:  # Redis answered, with an error: it is up, so writes go on
            logger.warning("the API rate was not checked: %s", exc)
            return True
        self.waiting = int(waiting) / 1_000_000
        return self.waiting == 0

    @classmethod
    def budget_key(cls, ident: int | str, rate: str) -> str:
        """Where a user's budget under one rate lives (before the cache's prefix). The rate is part
        of it: a budget kept under a stricter rate holds a time up to that rate's period ahead, and
        would refuse every request under a looser one until then; a changed rate starts afresh."""
        return f"{cls.cache_format % {'scope': cls.scope, 'ident': ident}}:{rate}"

    def wait(self) -> float | None:
        return self.waiting or None

    @classmethod
    def script(cls):
        """The registered script (EVALSHA, loading it once if Redis does not know it yet)."""
        if cls._script is None:
            cls._script = cache._cache.get_client(write=True).register_script(GCRA)
        return cls._script
