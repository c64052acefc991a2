'use strict';

// The local limiter, the denial cache and the outage (docs/clients.md, "When Redis is down:
// the local limiter", "When it is used" and "The denial cache"): pure, in process, no I/O.
// The time is passed in (whole Unix ms), so clients/conformance/vectors/local.json replays
// against it with a virtual clock.
//
// The bucket arithmetic is a copy of core/src/bucket.rs `take`, `take_all` and
// `first_ms_when` (lua/tb.lua does the same operations in the same order), so the doubles
// are the module's own. Keep the operation order when changing anything here.

const { MAX_TOKENS } = require('./core');

// A Map kept in use order (a Map iterates in insertion order: a use re-inserts the key), at
// most `maxKeys` entries; the least recently used is forgotten first.
class LruMap {
  constructor(maxKeys) {
    this.maxKeys = maxKeys;
    this.map = new Map();
  }

  get size() {
    return this.map.size;
  }

  get(key) {
    const value = this.map.get(key);
    if (value !== undefined) {
      this.map.delete(key);
      this.map.set(key, value);
    }
    return value;
  }

  set(key, value) {
    this.map.delete(key);
    this.map.set(key, value);
    if (this.map.size > this.maxKeys) {
      this.map.delete(this.map.keys().next().value);
    }
  }

  delete(key) {
    this.map.delete(key);
  }

  clear() {
    this.map.clear();
  }
}

// Map keys: a Buffer key by its bytes (a Map compares objects by identity).
function mapKey(key) {
  return typeof key === 'string' ? key : key.toString('latin1');
}

// ---------------------------------------------------------------------------------------
// The bucket (core/src/bucket.rs). A state is { tokens, last } (last: ms of the last write);
// a missing state is a full bucket.
// ---------------------------------------------------------------------------------------

// min(capacity, max(tokens, -2^53) + max(0, now - last) / 1000 * rate), in the core's order.
function availableAt(state, capacity, rate, now) {
  const elapsed = Math.max(now - state.last, 0);
  const tokens = Math.max(state.tokens, -MAX_TOKENS);
  return Math.min(tokens + elapsed / 1000 * rate, capacity);
}

// A wait in ms as a whole number in [0, 2^53]; NaN counts as the maximum.
function clampWait(ms) {
  if (Number.isNaN(ms) || ms >= MAX_TOKENS) {
    return MAX_TOKENS;
  }
  return ms <= 0 ? 0 : Math.trunc(ms);
}

function remainingOf(tokens) {
  return Math.floor(Math.max(tokens, 0));
}

// The fewest whole ms w in [0, 2^53] such that `state` holds `wanted` tokens at now + w:
// the closed formula's guess, then the exact edge by galloping and halving, as the core.
function firstMsWhen(state, capacity, rate, now, wanted) {
  const ready = (wait) => availableAt(state, capacity, rate, now + wait) >= wanted;
  if (ready(0)) {
    return 0;
  }
  const deficit = wanted - availableAt(state, capacity, rate, now);
  const guess = clampWait(Math.ceil(deficit / rate * 1000));
  let step = 1;
  let notReady;
  let isReady;
  if (ready(guess)) {
    isReady = guess;
    notReady = 0;
    for (;;) {
      const probe = isReady - step;
      if (probe <= 0) {
        break;
      }
      if (!ready(probe)) {
        notReady = probe;
        break;
      }
      isReady = probe;
      step *= 2;
    }
  } else {
    notReady = guess;
    isReady = MAX_TOKENS;
    for (;;) {
      const probe = notReady + step;
      if (probe >= MAX_TOKENS) {
        break;
      }
      if (ready(probe)) {
        isReady = probe;
        break;
      }
      notReady = probe;
      step *= 2;
    }
  }
  while (isReady - notReady > 1) {
    const mid = notReady + Math.floor((isReady - notReady) / 2);
    if (ready(mid)) {
      isReady = mid;
    } else {
      notReady = mid;
    }
  }
  return isReady;
}

// bucket::take: { allowed, remaining, retryAfterMs, resetAfterMs, write } (write: the state
// to store, or null). A missing state is full; a `last` in the future counts as now (a
// clock step back grants no refill for the gap) and is repaired by the write.
function take(stored, capacity, rate, n, now) {
  let current = stored;
  let repair = null;
  if (stored === undefined) {
    current = { tokens: capacity, last: now };
  } else if (stored.last > now) {
    current = { tokens: stored.tokens, last: now };
    repair = { tokens: availableAt(current, capacity, rate, now), last: now };
  }
  const available = availableAt(current, capacity, rate, now);
  if (available < n) {
    return {
      allowed: false,
      remaining: remainingOf(available),
      retryAfterMs: n > capacity ? -1 : firstMsWhen(current, capacity, rate, now, n),
      resetAfterMs: firstMsWhen(current, capacity, rate, now, capacity),
      write: repair,
    };
  }
  const after = { tokens: available - n, last: now };
  const write = n > 0 ? after : repair;
  return {
    allowed: true,
    remaining: remainingOf(after.tokens),
    retryAfterMs: 0,
    resetAfterMs: firstMsWhen(write ?? current, capacity, rate, now, capacity),
    write,
  };
}

// bucket::take_all over judged buckets [{ stored, capacity, rate, n }]: every bucket or none
// (a bucket that would allow, in a denied call, is answered as a look, n = 0). The deciding
// index: a denial's longest wait (-1 the longest), an allowed call's longest wait then fewest
// tokens left.
function takeAll(buckets, now) {
  const outcomes = buckets.map((b) => take(b.stored, b.capacity, b.rate, b.n, now));
  const allowed = outcomes.every((o) => o.allowed);
  if (!allowed) {
    outcomes.forEach((o, i) => {
      if (o.allowed) {
        const b = buckets[i];
        outcomes[i] = take(b.stored, b.capacity, b.rate, 0, now);
      }
    });
  }
  const weight = (o) => {
    if (allowed) {
      return [o.retryAfterMs, -o.remaining];
    }
    return [o.retryAfterMs < 0 ? Infinity : o.retryAfterMs, 0];
  };
  let index = 0;
  let heaviest = [-Infinity, -Infinity];
  outcomes.forEach((o, i) => {
    const w = weight(o);
    if (w[0] > heaviest[0] || (w[0] === heaviest[0] && w[1] > heaviest[1])) {
      heaviest = w;
      index = i;
    }
  });
  return { allowed, index, outcomes };
}

// ---------------------------------------------------------------------------------------
// The local limiter: buckets per key at capacity / instances and rate / instances, in an LRU.
// ---------------------------------------------------------------------------------------

class LocalLimiter {
  constructor(instances, maxKeys) {
    this.instances = instances;
    this.buckets = new LruMap(maxKeys);
  }

  // One bucket: the take's outcome; `write` false for a peek (nothing stored).
  take(key, capacity, rate, n, now, write = true) {
    const k = mapKey(key);
    const outcome = take(this.buckets.get(k), capacity / this.instances, rate / this.instances, n, now);
    if (write && outcome.write !== null) {
      this.buckets.set(k, outcome.write);
    }
    return outcome;
  }

  // limits: [{ key, capacity, rate, n }] -> { allowed, index, outcomes }.
  takeAll(limits, now) {
    const keys = limits.map((l) => mapKey(l.key));
    const judged = limits.map((l, i) => ({
      stored: this.buckets.get(keys[i]), capacity: l.capacity / this.instances, rate: l.rate / this.instances, n: l.n,
    }));
    const all = takeAll(judged, now);
    all.outcomes.forEach((o, i) => {
      if (o.write !== null) {
        this.buckets.set(keys[i], o.write);
      }
    });
    return all;
  }

  // The outage is over: limits come from Redis again.
  clear() {
    this.buckets.clear();
  }
}

// ---------------------------------------------------------------------------------------
// The denial cache: a key denied for n tokens until a time answers takes of at least n
// tokens as denied until then, with no round trip.
// ---------------------------------------------------------------------------------------

// docs/clients.md#the-denial-cache: after an allowed take of n that left `remaining` < n,
// the same take is denied until the bucket holds n again. The reset is the time to full,
// and (capacity - n) / rate seconds before it the bucket holds n, so
// w = resetAfterMs - ceil((capacity - n) * 1000 / rate); kept as w + 1 because the
// server's tokens are doubles and both terms are rounded up, so the n-th token can come
// back a ms after w. 0 (nothing to remember) when n is left, the bucket does not refill,
// there is no reset time or w <= 0.
function primedDenialMs(capacity, rate, n, remaining, resetAfterMs) {
  if (!(rate > 0) || !(remaining < n) || !(resetAfterMs >= 0)) {
    return 0;
  }
  const w = resetAfterMs - Math.ceil(((capacity - n) * 1000) / rate);
  return Number.isFinite(w) && w > 0 ? w + 1 : 0;
}

class DenialCache {
  constructor(maxKeys) {
    this.entries = new LruMap(maxKeys);
  }

  // After a server's answer at `now`. A denial is kept when it names a time
  // (retryAfterMs > 0; -1 depends on the call's n). An allowed take is kept as the denial
  // the next one would get when it left fewer than n tokens and `primable` (a plain take:
  // { capacity, rate }; null for a lockout, whose denial must reach the server to lock),
  // until the bucket holds n again (primedDenialMs).
  remember(key, n, decision, now, primable = null) {
    let wait = decision.retryAfterMs;
    if (decision.allowed) {
      wait = primable === null ? 0
        : primedDenialMs(primable.capacity, primable.rate, n, decision.remaining, decision.resetAfterMs);
    }
    if (!(wait > 0)) {
      return;
    }
    this.entries.set(mapKey(key), {
      n,
      until: now + wait,
      remaining: decision.remaining,
      resetAt: now + decision.resetAfterMs,
    });
  }

  // The entry that denies a take of n on key at now, or undefined (an expired entry is
  // dropped; fewer tokens than the denied take go to the server).
  denial(key, n, now) {
    const k = mapKey(key);
    const entry = this.entries.get(k);
    if (entry === undefined) {
      return undefined;
    }
    if (now >= entry.until) {
      this.entries.delete(k);
      return undefined;
    }
    return n >= entry.n ? entry : undefined;
  }

  // A refund, charge, settle or unblock through this limiter changed the key.
  forget(key) {
    this.entries.delete(mapKey(key));
  }
}

// The reply fields [allowed, remaining, retryAfterMs, resetAfterMs] of a cached denial at now.
function cachedReply(entry, now) {
  return [0, entry.remaining, Math.max(1, entry.until - now), Math.max(0, entry.resetAt - now)];
}

// The reply fields of a local outcome (allowed: a takeAll's, for its deciding bucket).
function outcomeReply(outcome, allowed = outcome.allowed) {
  return [allowed ? 1 : 0, outcome.remaining, outcome.retryAfterMs, outcome.resetAfterMs];
}

// ---------------------------------------------------------------------------------------
// The local limiter's outage (docs/clients.md, "When it is used")
// ---------------------------------------------------------------------------------------

// Started by the first unavailable call; while it lasts nothing is sent for probeMs, then
// one call probes Redis (the others go on locally while it is out); a success ends it.
class Outage {
  constructor(probeMs, instances) {
    this.probeMs = probeMs;
    this.instances = instances;
    this.active = false;
    this.probeAt = 0;
  }

  // Whether a call at `now` is sent to Redis (and, in an outage, becomes the probe).
  shouldSend(now) {
    if (!this.active) {
      return true;
    }
    if (now < this.probeAt) {
      return false;
    }
    this.probeAt = now + this.probeMs;
    return true;
  }

  // An unavailable call: the line to log when it starts the outage, else null.
  failed(reason, now) {
    this.probeAt = now + this.probeMs;
    if (this.active) {
      return null;
    }
    this.active = true;
    return ['warn', `redis-tb: Redis unreachable (${reason}); limiting in process at 1/${this.instances} of each limit`];
  }

  // A call that reached Redis: the line to log when it ends the outage, else null.
  succeeded() {
    if (!this.active) {
      return null;
    }
    this.active = false;
    return ['warn', 'redis-tb: Redis reachable again; limits come from Redis'];
  }
}

module.exports = {
  LruMap, LocalLimiter, DenialCache, Outage, primedDenialMs, take, takeAll, firstMsWhen, cachedReply, outcomeReply,
};
