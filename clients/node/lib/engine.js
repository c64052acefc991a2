'use strict';

// The limiter's decisions, pure: which backend, when to look for the module again, what a
// failed send leads to (detect again and retry, reconnect and retry, fail), where a cluster
// redirection goes, a Lua wait's grant, and the shield: the denial cache and the local
// limiter with its outage (their buckets and the outage's clock are lib/local.js's). lib/limiter.js does the I/O
// these decide on and feeds back what happened; nothing here touches a socket, a timer or
// a logger (the times are passed in), so test/engine.test.js checks every rule without a
// server. The rules are docs/clients.md's.

const { Decision, MAX_TOKENS, classify, parseRedirect } = require('./core');
const { LimiterUnavailable, isReplyError } = require('./errors');
const { LocalLimiter, DenialCache, Outage, cachedReply, outcomeReply } = require('./local');

// ---------------------------------------------------------------------------------------
// The backend (docs/clients.md, "How the backend is chosen")
// ---------------------------------------------------------------------------------------

// The step a detection starts with: a forced backend is loaded as it is; `auto` asks the
// server for TB.TAKE first.
function detectionStart(requested) {
  return requested === 'auto' ? 'ask_module' : requested;
}

// After FUNCTION LOAD failed with `err` (auto, no module): 'script' when the server refused
// functions (an error reply that is not about its state); anything else is thrown as it is.
function afterFunctionLoadFailed(err) {
  return isReplyError(err) && classify(err) !== 'unavailable' ? 'script' : 'throw';
}

// The line a backend choice logs: [level, message]. A Lua backend that `auto` chose
// because the module is missing is a warning (the fallback is slower and a deployment may
// have meant to load the module); a move off the module too.
function choiceLine(previous, backend, why, requested) {
  if (previous === null) {
    const fallback = requested === 'auto' && backend !== 'module';
    return [fallback ? 'warn' : 'info', `redis-tb backend: ${backend} (${why})`];
  }
  if (previous === 'module' && backend !== 'module') {
    return ['warn', `redis-tb: the module is gone from the server; going on with the Lua backend: ${backend} (${why})`];
  }
  if (previous !== 'module' && backend === 'module') {
    return ['info', `redis-tb: the module is back on the server; moving to it from the Lua backend (${previous})`];
  }
  return ['info', `redis-tb backend: ${backend} again (${why})`];
}

// On Lua after having seen the module (auto only): look for it again at most every
// recheckMs. state: a Backend ({ chosen, sawModule, checkedAt, requested }).
function shouldLookForModule(state, now, recheckMs) {
  return state.sawModule && state.chosen !== 'module' && state.requested === 'auto'
    && now - state.checkedAt >= recheckMs;
}

// Which backend a limiter uses, and why (Python's Backend). `clock`: performance.now() ms.
class Backend {
  constructor(requested, clock) {
    this.requested = requested;
    this.clock = clock;
    // 'module' | 'function' | 'script', or null before the first detection.
    this.chosen = null;
    this.sawModule = false;
    // When the module was last looked for, or left.
    this.checkedAt = 0;
    // Detections ended: a call that met a server change after another call detected the
    // backend again only sends again.
    this.generation = 0;
  }

  // The backend is now `backend`: the [level, message] to log.
  use(backend, why) {
    const previous = this.chosen;
    this.chosen = backend;
    if (backend === 'module') {
      this.sawModule = true;
    }
    if (previous === 'module' && backend !== 'module') {
      this.checkedAt = this.clock();
    }
    return choiceLine(previous, backend, why, this.requested);
  }
}

// ---------------------------------------------------------------------------------------
// Operations as steps (as Python's _engine.py): an operation is a generator that yields the
// I/O it needs and gets back its result, or has its error thrown in; lib/limiter.js's
// _drive runs it. The steps:
//   { step: 'send', op, keys, numbers }   the call's command on backend.chosen, by its keys
//   { step: 'ask_module' }                 COMMAND INFO tb.take -> its reply
//   { step: 'load', what }                 lua/tb.lua on every master: FUNCTION LOAD
//                                          REPLACE ('function') or SCRIPT LOAD ('script')
//   { step: 'detect', generation }         the limiter's one detection in progress (detect,
//                                          shared by the calls that need it), unless one
//                                          ended since `generation`
//   { step: 'reconnect', error }           the client ready again after `error` dropped it
//   { step: 'owner', key }                 the node that owns key's slot (null: standalone)
//   { step: 'block', command, key, args, timeoutMs, node, asking }  a blocking command on a
//                                          pooled connection of its own to `node`, after
//                                          ASKING when `asking`
//   { step: 'refresh_slots' }              the cluster client's slot map, refreshed in the
//                                          background
//   { step: 'take', take, maxWaitMs }      a take (with MAXWAIT when maxWaitMs is set) of
//                                          take: { key, capacity, rate, n, name }, under the
//                                          failure rule -> its Decision
//   { step: 'acquire', acquire }           acquire(acquire: { key, limit, leaseMs, options })
//                                          under the failure rule -> its Lease
//   { step: 'sleep', ms }
//   { step: 'log', line }                  [level, message]
// ---------------------------------------------------------------------------------------

const log = (line) => ({ step: 'log', line });

// Whether the server has TB.TAKE. An error reply that is not about the server's state (an
// ACL that refuses COMMAND) says nothing about the module: no. Unavailable: thrown.
function* moduleOnServer() {
  let info;
  try {
    info = yield { step: 'ask_module' };
  } catch (err) {
    if (classify(err) === 'unavailable') {
      throw err;
    }
    return false;
  }
  return Array.isArray(info) && Array.isArray(info[0]);
}

// Detects the backend (docs/clients.md, "How the backend is chosen"): a forced one is loaded
// as it is; auto: the module if the server has TB.TAKE, else FUNCTION LOAD of lua/tb.lua,
// else (functions refused) SCRIPT LOAD.
function* detect(backend) {
  try {
    const [chosen, why] = yield* detectedBackend(backend);
    yield log(backend.use(chosen, why));
  } finally {
    backend.generation += 1;
  }
}

function* detectedBackend(backend) {
  switch (detectionStart(backend.requested)) {
    case 'module':
      return ['module', 'forced'];
    case 'function':
      yield { step: 'load', what: 'function' };
      return ['function', 'forced; FUNCTION LOAD tb done'];
    case 'script':
      yield { step: 'load', what: 'script' };
      return ['script', 'forced; SCRIPT LOAD done'];
    default:
      break;
  }
  if (yield* moduleOnServer()) {
    return ['module', 'the server has TB.TAKE'];
  }
  try {
    yield { step: 'load', what: 'function' };
  } catch (err) {
    if (afterFunctionLoadFailed(err) === 'throw') {
      throw err;
    }
    yield { step: 'load', what: 'script' };
    return ['script', `no TB.TAKE; FUNCTION LOAD failed (${err.message}); EVALSHA of lua/tb.lua`];
  }
  return ['function', 'no TB.TAKE on the server; FUNCTION LOAD of lua/tb.lua'];
}

// The backend for the next call: detected on the first call that reaches the server; on Lua
// after the module went away (auto), the module is looked for again at most every recheckMs,
// and that look's failure changes nothing (the call itself says so).
function* ensure(backend, recheckMs) {
  if (backend.chosen === null) {
    yield { step: 'detect', generation: backend.generation };
  } else if (shouldLookForModule(backend, backend.clock(), recheckMs)) {
    backend.checkedAt = backend.clock();
    let present = false;
    try {
      present = yield* moduleOnServer();
    } catch {
      // unavailable now: the call itself will say so
    }
    if (present) {
      yield log(backend.use('module', 'the server has TB.TAKE again'));
      backend.generation += 1;
    }
  }
}

// One call's sends under the failure rule: a server change (the module unloaded, a FUNCTION
// FLUSH, a SCRIPT FLUSH) detects the backend again and sends once more; a dropped connection
// waits for the reconnection and sends once more (afterFailure). The reply, or the last error.
function* exchange(backend, recheckMs, op, keys, numbers, retryDrop) {
  yield* ensure(backend, recheckMs);
  const tried = { detected: false, reconnected: false };
  for (;;) {
    const generation = backend.generation;
    try {
      return yield { step: 'send', op, keys, numbers };
    } catch (err) {
      const next = afterFailure(err, tried, retryDrop);
      if (next === 'detect') {
        tried.detected = true;
        yield log(['info', `redis-tb: the server changed (${err.message}); detecting the backend again`]);
        yield { step: 'detect', generation };
      } else if (next === 'reconnect') {
        tried.reconnected = true;
        yield { step: 'reconnect', error: err };
      } else {
        throw err;
      }
    }
  }
}

// waitTake's and waitAcquire's wait in the server (TB.BTAKE, TB.ACQUIRE with timeout_ms):
// its reply, or undefined when the backend is Lua, or the module went away during the wait
// (detected again): the caller waits the Lua way. Errors are thrown as they came.
function* waitOnModule(backend, recheckMs, command, key, args, timeoutMs, isCluster) {
  yield* ensure(backend, recheckMs);
  if (backend.chosen !== 'module') {
    return undefined;
  }
  try {
    return yield* blockOnOwner(command, key, args, timeoutMs, isCluster);
  } catch (err) {
    if (classify(err) !== 'server_changed') {
      throw err;
    }
    yield { step: 'detect', generation: backend.generation };
    if (backend.chosen === 'module') {
      throw err;
    }
    return undefined;
  }
}

// ---------------------------------------------------------------------------------------
// Retries (docs/clients.md, "The failure rule" and "A dropped connection is not an outage")
// ---------------------------------------------------------------------------------------

// A connection the server closed (a restart, CLIENT KILL, an idle timeout): a reset, a
// broken pipe, an end of file, ioredis's "Connection is closed", or our own "dropped"
// (a client that lost its connection and has not yet tried again). Not a refusal and not a
// timeout: a timed-out call may still run, and a refused connection is an outage.
// ioredis rejects a command that was in flight when the connection closed with "Connection
// is closed" or, with maxRetriesPerRequest 0 (createClient's), its MaxRetriesPerRequestError.
const DROPPED = /\b(?:ECONNRESET|EPIPE|ECONNABORTED|EOF)\b|Connection is closed|socket hang up|the connection dropped|max retries per request/i;

function isDropped(err) {
  return Boolean(err) && classify(err) === 'unavailable' && DROPPED.test(String(err.message ?? err));
}

// ioredis without an offline queue refuses a command while it reconnects after a dropped
// connection: nothing was written, so sending it once more is safe for every call, a refund
// included. (During an outage the limiter fails before ioredis sees the command: its own
// "not connected" check, limiter.js whenWritable.)
const UNSENT = /(?:Stream|Cluster) isn't (?:writeable|ready) and enableOfflineQueue options is false/;

function isUnsent(err) {
  return Boolean(err) && UNSENT.test(String(err.message ?? err));
}

// What a call does after its send failed with `err`. tried: { detected, reconnected } (what
// this call already retried); retryDrop: whether the call may be sent twice (refund and
// settle may not: a refund given twice hands out tokens nobody returned).
//   'detect'    the server changed: detect the backend again, send once more
//   'reconnect' the connection dropped: wait for the reconnection, send once more
//   'fail'      the error is the call's answer (its class decides what the caller sees)
function afterFailure(err, tried, retryDrop) {
  const kind = classify(err);
  if (kind === 'server_changed' && !tried.detected) {
    return 'detect';
  }
  if (!tried.reconnected && (isUnsent(err) || (retryDrop && isDropped(err)))) {
    return 'reconnect';
  }
  return 'fail';
}

// A cluster client that knows no master in `status`: whether it is worth waiting for (its
// first connection, or a reconnection after its connections dropped: ioredis's 'close' turns
// into 'reconnecting' or 'end' at the next tick), or not ('end', 'disconnecting': closed for
// good; 'ready' with no master cannot become ready again).
const CLUSTER_ON_ITS_WAY = ['wait', 'connecting', 'connect', 'reconnecting', 'close'];

function clusterMayReconnect(status) {
  return CLUSTER_ON_ITS_WAY.includes(status);
}

// A MOVED / ASK reply of a cluster -> where the command goes next: { node, asking,
// refreshSlots }, or null (not a redirection: the error is the answer).
function redirection(err, isCluster) {
  const redirect = isCluster ? parseRedirect(err && err.message) : null;
  if (!redirect) {
    return null;
  }
  return {
    node: { host: redirect.host, port: redirect.port },
    asking: redirect.kind === 'ASK',
    refreshSlots: redirect.kind === 'MOVED',
  };
}

// The most MOVED/ASK hops one blocking command follows (a slot moves once per resharding step).
const MAX_REDIRECTIONS = 5;

// A blocking command (TB.BTAKE, TB.ACQUIRE with timeout_ms) on the node that owns the key:
// a MOVED or ASK reply sends it again where it points (a MOVED refreshes the slot map, an
// ASK is preceded by ASKING), at most MAX_REDIRECTIONS times. A pooled connection the server
// had closed while idle (a restart, CLIENT KILL) can still look ready: the command is sent
// once more, on a new one (docs/clients.md, "A dropped connection is not an outage").
function* blockOnOwner(command, key, args, timeoutMs, isCluster) {
  let node = yield { step: 'owner', key };
  let asking = false;
  let resent = false;
  for (let hops = 0; hops <= MAX_REDIRECTIONS;) {
    try {
      return yield { step: 'block', command, key, args, timeoutMs, node, asking };
    } catch (err) {
      if (!isReplyError(err)) {
        if (!resent && isDropped(err)) {
          resent = true;
          continue;
        }
        throw err;
      }
      const redirect = redirection(err, isCluster);
      if (!redirect) {
        throw err;
      }
      ({ node, asking } = redirect);
      if (redirect.refreshSlots) {
        yield { step: 'refresh_slots' };
      }
      hops += 1;
    }
  }
  throw new LimiterUnavailable(`${command}: more than ${MAX_REDIRECTIONS} cluster redirections`);
}

// ---------------------------------------------------------------------------------------
// Waiting without the module (docs/clients.md, "Waiting in a cluster" and "Leases")
// ---------------------------------------------------------------------------------------

// waitTake on a Lua backend: ONE reservation (MAXWAIT timeoutMs; no limit is MAXWAIT 2^53)
// and one sleep for the wait it names. Reservations queue in the bucket's debt, so this is
// first come first served like TB.BTAKE. A denial (the tokens do not come within the
// timeout) sleeps out the timeout like TB.BTAKE, then takes once more, plainly, and answers
// that (only a refund can have changed it). `started`: when waitTake began (clock() ms).
function* reserveAndWait(take, timeoutMs, started, clock) {
  const reserved = yield { step: 'take', take, maxWaitMs: timeoutMs || MAX_TOKENS };
  if (reserved.allowed) {
    if (reserved.retryAfterMs > 0) {
      yield { step: 'sleep', ms: reserved.retryAfterMs };
    }
    return Object.assign(reserved, grantAfterWait(reserved));
  }
  if (reserved.retryAfterMs < 0 || timeoutMs === 0) {
    return reserved;
  }
  const left = started + timeoutMs - clock();
  if (left > 0) {
    yield { step: 'sleep', ms: left };
  }
  return yield { step: 'take', take, maxWaitMs: undefined };
}

// The grant reserveAndWait answers after its sleep: the one TB.BTAKE answers at the end of
// that wait: no wait left, and the reset counted from then. The reservation's reset was
// counted from before the wait (after a 500 ms wait it said 5500 ms where TB.BTAKE says
// 5000, and RateLimit t=6 for t=5).
function grantAfterWait(reservation) {
  const waited = Math.max(0, reservation.retryAfterMs);
  return { retryAfterMs: 0, resetAfterMs: Math.max(0, reservation.resetAfterMs - waited) };
}

// waitAcquire on a Lua backend: POLLING, NOT FIFO: acquire; until a lease or the deadline,
// sleep min(retryAfterMs, pollMs, the time left) but at least 1 ms, as in the Python and
// Rust clients (a denial with retryAfterMs 0, the module's answer to a caller turned away
// only because others wait, is tried again after 1 ms, not after a whole pollMs), and again.
function* pollForLease(acquire, timeoutMs, pollMs, started, clock) {
  const deadline = timeoutMs === 0 ? Infinity : started + timeoutMs;
  for (;;) {
    const lease = yield { step: 'acquire', acquire };
    if (lease.acquired) {
      return lease;
    }
    const left = deadline - clock();
    if (left <= 0) {
      return lease;
    }
    yield { step: 'sleep', ms: Math.max(1, Math.min(lease.retryAfterMs, pollMs, left)) };
  }
}

// ---------------------------------------------------------------------------------------
// Answers without a round trip: the denial cache and the local limiter (docs/clients.md,
// "The denial cache" and "When Redis is down: the local limiter"); Python's Shield
// ---------------------------------------------------------------------------------------

// One call as the shield sees it: `op` (take, peek, takeall, refund, acquire, ...), its
// prefixed `keys`, their `costs` and `limits` ({ name, capacity, rate } each: a Decision's),
// and how it may be answered: `local` ('take' | 'peek' | false), what the local limiter
// answers during an outage; `cache`, whether the denial cache answers it and learns its
// denial; `primable`, a plain take (no MAXWAIT, no BLOCK), whose allowed answer that left
// fewer than n tokens is remembered as the next one's denial; `metered`, whether its answer is
// a decision of the metrics (docs/clients.md, "Metrics": takes, not peeks, refunds, charges).
class Call {
  constructor(op, keys, { costs = [], limits = null, local = false, cache = false, primable = false, metered = false } = {}) {
    this.op = op;
    this.keys = keys;
    this.costs = costs;
    this.limits = limits;
    this.local = local;
    this.cache = cache;
    this.primable = primable;
    this.metered = metered;
  }

  // The Decision's index of the bucket at `i` (null but for takeall).
  indexOf(i) {
    return this.op === 'takeall' ? i : null;
  }
}

// The denial cache, the local limiter and its outage, asked before each call (`before`) and
// told how it went (`after`, `failed`). The times are whole Unix ms, passed in.
class Shield {
  constructor(instances, maxKeys, probeMs, cacheDenials) {
    this.local = new LocalLimiter(instances, maxKeys);
    this.outage = new Outage(probeMs, instances);
    this.denials = cacheDenials ? new DenialCache(maxKeys) : null;
  }

  // Before `call` at `now`: a Decision without Redis (source 'cache': a remembered denial;
  // 'local': the local limiter between the probes of an outage), or null: send it. Throws
  // LimiterUnavailable for a call the local limiter does not serve between probes.
  before(call, now) {
    if (call.cache && this.denials !== null) {
      for (let i = 0; i < call.keys.length; i++) {
        const entry = this.denials.denial(call.keys[i], call.costs[i], now);
        if (entry !== undefined) {
          return new Decision(cachedReply(entry, now), call.limits, call.indexOf(i), 'cache');
        }
      }
    }
    if (this.outage.shouldSend(now)) {
      return null;
    }
    if (call.local) {
      return this.answerLocally(call, now);
    }
    throw new LimiterUnavailable('Redis unreachable (in an outage: waiting for the next probe)');
  }

  // `call` failed with `error` (a LimiterError) at `now`: { decision, line }. decision: the
  // local limiter's answer, or null (the error is the answer); line: the [level, message] to
  // log when this failure starts an outage, or null. Only an unavailable call that the local
  // limiter serves starts one (or goes on with one in progress).
  failed(call, error, now) {
    if (!(error instanceof LimiterUnavailable) || !(call.local || this.outage.active)) {
      return { decision: null, line: null };
    }
    const line = this.outage.failed(error.message, now);
    return { decision: call.local ? this.answerLocally(call, now) : null, line };
  }

  // `call` reached Redis and answered `answer` at `now`: an outage is over (the line to log,
  // else null; the local buckets are dropped, limits come from Redis again), and a denial
  // (or a primable take's next denial) is remembered.
  after(call, answer, now) {
    const line = this.outage.succeeded();
    if (line) {
      this.local.clear();
    }
    if (call.cache && this.denials !== null) {
      const i = answer.index ?? 0;
      const primable = call.primable ? { capacity: call.limits[i].capacity, rate: call.limits[i].rate } : null;
      this.denials.remember(call.keys[i], call.costs[i], answer, now, primable);
    }
    return line;
  }

  // A refund, charge, settle or unblock through this limiter changed `key` (prefixed).
  forget(key) {
    if (this.denials !== null) {
      this.denials.forget(key);
    }
  }

  // The local limiter's Decision for `call` at `now` (a peek writes nothing).
  answerLocally(call, now) {
    const { keys, costs, limits } = call;
    if (call.op !== 'takeall') {
      const outcome = this.local.take(keys[0], limits[0].capacity, limits[0].rate, costs[0], now, call.local === 'take');
      return new Decision(outcomeReply(outcome), limits, null, 'local');
    }
    const all = this.local.takeAll(keys.map((key, i) => ({ key, capacity: limits[i].capacity, rate: limits[i].rate, n: costs[i] })), now);
    return new Decision(outcomeReply(all.outcomes[all.index], all.allowed), limits, all.index, 'local');
  }
}

module.exports = {
  detectionStart, afterFunctionLoadFailed, choiceLine, shouldLookForModule, Backend, detect, ensure, exchange, waitOnModule,
  blockOnOwner, MAX_REDIRECTIONS,
  isDropped, isUnsent, afterFailure, clusterMayReconnect, redirection, reserveAndWait, grantAfterWait, pollForLease,
  Call, Shield,
};
