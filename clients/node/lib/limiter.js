'use strict';

const crypto = require('node:crypto');
const fs = require('node:fs');
const path = require('node:path');
const util = require('node:util');
const { setTimeout: sleep } = require('node:timers/promises');

const { LimiterError, InvalidArgument, LimiterUnavailable, LeaseDenied, isReplyError } = require('./errors');
const core = require('./core');
const engine = require('./engine');
const { LeaseGuard } = require('./lease');
const { Metrics, isMeterProvider, requireFromApplication } = require('./metrics');

const { Limit, Decision, decisionFrom, classify, limiterError } = core;

// ---------------------------------------------------------------------------------------
// The Lua fallback: lua/tb.lua of the repository, reached through the package's tb.lua
// symlink (a checkout, `npm install ./clients/node`), or dist/tb.lua, the real file that
// `npm pack` puts in the tarball (scripts/pack-lua.js: npm drops symlinks from tarballs).
// ---------------------------------------------------------------------------------------

const LUA_CANDIDATES = [path.join(__dirname, '..', 'tb.lua'), path.join(__dirname, '..', 'dist', 'tb.lua')];

let luaCache = null;

function lua() {
  if (luaCache === null) {
    const file = LUA_CANDIDATES.find((candidate) => fs.existsSync(candidate));
    if (!file) {
      throw new InvalidArgument(`redis-tb: tb.lua not found (looked for ${LUA_CANDIDATES.join(', ')})`);
    }
    const library = fs.readFileSync(file, 'utf8');
    // The EVAL script is the library without its first line (`#!lua name=tb`).
    const script = library.slice(library.indexOf('\n') + 1);
    luaCache = {
      file,
      library,
      script,
      sha: crypto.createHash('sha1').update(script).digest('hex'),
    };
  }
  return luaCache;
}

// ---------------------------------------------------------------------------------------
// ioredis: the application's copy. The package never requires ioredis at load time: a
// directory install (`npm install ./clients/node`) is a symlink, and from the checkout
// `require('ioredis')` finds no copy (issue 18, item 1). The client passed in tells which
// ioredis made it; createClient() looks where the application would.
// ---------------------------------------------------------------------------------------

function isIoredis(exports) {
  return typeof exports === 'function' && typeof exports.Command === 'function' && typeof exports.Cluster === 'function';
}

// The loaded ioredis whose Redis or Cluster class made `client` (instanceof: ioredis 5.0's
// mixins leave `constructor` pointing at EventEmitter), else the application's.
const ioredisByClient = new WeakMap();
function ioredisOf(client) {
  let found = ioredisByClient.get(client);
  if (!found) {
    found = Object.values(require.cache).map((loaded) => loaded && loaded.exports)
      .find((exports) => isIoredis(exports) && (client instanceof exports || client instanceof exports.Cluster));
    found = found ?? requireIoredis();
    ioredisByClient.set(client, found);
  }
  return found;
}

// ioredis as the application resolves it (its copy first).
function requireIoredis() {
  const found = requireFromApplication('ioredis');
  if (found === undefined) {
    throw new LimiterError('bug', 'redis-tb needs ioredis: npm install ioredis');
  }
  return found;
}

// ---------------------------------------------------------------------------------------
// Logging: a function (level, message) or an object with debug/info/warn/error methods
// (console, pino, ...). Default: info, warn and error to stderr, debug with NODE_DEBUG=redis-tb;
// `false`: nothing.
// ---------------------------------------------------------------------------------------

const debuglog = util.debuglog('redis-tb');

function defaultLog(level, message) {
  if (level === 'debug') {
    debuglog('%s', message);
  } else if (level === 'error') {
    console.error(message);
  } else {
    console.warn(message);
  }
}

function toLog(logger) {
  if (logger === undefined) {
    return defaultLog;
  }
  if (logger === false || logger === null) {
    return () => {};
  }
  if (typeof logger === 'function') {
    return logger;
  }
  return (level, message) => {
    const method = logger[level] || logger.log;
    if (typeof method === 'function') {
      method.call(logger, message);
    }
  };
}

// ---------------------------------------------------------------------------------------
// Sending
// ---------------------------------------------------------------------------------------

// Sends one command with its own timeout (ms; 0 = none). ioredis arms a command's timer
// once, so this per-call timer wins over the client's commandTimeout. `keys` route the
// command in a Cluster: ioredis does not know the TB.* commands' key positions.
// The longest delay a timer holds: setTimeout fires a longer one at once.
const MAX_TIMER_MS = 2 ** 31 - 1;

function send(client, name, args, keys, timeoutMs) {
  const { Command } = ioredisOf(client);
  const command = new Command(name, args);
  if (keys) {
    command.keys = keys;
  }
  if (timeoutMs > 0) {
    command.setTimeout(timeoutMs);
  }
  return client.sendCommand(command);
}

// Resolves when `client` can take a command, or rejects with LimiterUnavailable at once
// when it cannot: a client that is (re)connecting has just been refused, and a command
// queued offline would wait out its timeout and might be sent, and charged, later. A
// first connection in progress (right after createClient()) is waited for, up to
// `timeoutMs` (RateLimiter's connectTimeoutMs, or its timeoutMs if longer: a busy machine's
// first connection and ready check can outlast one command's 200 ms); a refusal, if any,
// fails at once.
// Calls that arrive during one connection attempt share one wait (and one set of listeners).
const connecting = new WeakMap();

// How many times each client began reconnecting since it was last ready: 1 means its
// connection dropped and it has not yet tried again (a restart, CLIENT KILL: worth one wait,
// docs/clients.md "A dropped connection is not an outage"); more means a reconnection was
// refused (an outage: fail at once).
const reconnections = new WeakMap();

function watchReconnections(client) {
  if (reconnections.has(client) || typeof client.on !== 'function') {
    return;
  }
  reconnections.set(client, 0);
  client.on('reconnecting', () => reconnections.set(client, reconnections.get(client) + 1));
  client.on('ready', () => reconnections.set(client, 0));
}

function whenWritable(client, timeoutMs) {
  if (client.status === 'ready') {
    return Promise.resolve();
  }
  if (client.status === 'wait') {
    client.connect().catch(() => {});
  }
  if (client.status === 'reconnecting' && reconnections.get(client) === 1) {
    return Promise.reject(new LimiterUnavailable('not connected to the server: the connection dropped (client reconnecting)'));
  }
  if (!['wait', 'connecting', 'connect'].includes(client.status)) {
    return Promise.reject(new LimiterUnavailable(`not connected to the server (client ${client.status})`));
  }
  let pending = connecting.get(client);
  if (!pending) {
    pending = firstConnection(client, timeoutMs).finally(() => connecting.delete(client));
    connecting.set(client, pending);
  }
  return pending;
}

// Resolves at the client's next 'ready'; rejects (LimiterUnavailable) after timeoutMs (0:
// never) or at the first of `failOn` ('error', 'close', 'end').
function untilReady(client, timeoutMs, failOn) {
  return new Promise((resolve, reject) => {
    const timer = timeoutMs > 0 ? setTimeout(() => done(new LimiterUnavailable(
      `not connected to the server within ${timeoutMs} ms (client ${client.status})`)), timeoutMs) : null;
    const onReady = () => done(null);
    const onFailure = (err) => done(err instanceof Error
      ? new LimiterUnavailable(`not connected to the server: ${err.message}`, { cause: err })
      : new LimiterUnavailable(`not connected to the server (client ${client.status})`));
    function done(err) {
      clearTimeout(timer);
      client.off('ready', onReady);
      failOn.forEach((event) => client.off(event, onFailure));
      if (err) {
        reject(err);
      } else {
        resolve();
      }
    }
    client.once('ready', onReady);
    failOn.forEach((event) => client.once(event, onFailure));
  });
}

// A client connecting for the first time, or reconnecting after a drop: a refusal fails at once.
function firstConnection(client, timeoutMs) {
  return untilReady(client, timeoutMs, ['error', 'close', 'end']);
}

// A cluster client that lost its connection is ready again. It emits 'error' for each node it
// cannot reach meanwhile, so only 'ready', 'end' and the timer decide.
function clusterReadyAgain(client, timeoutMs) {
  return untilReady(client, timeoutMs, ['end']);
}

// A standalone client that has yet to see the socket the server closed: the 'close' to come is
// expected (ioredis reconnects on it), but a refused reconnection ('error') is an outage, so it
// fails then rather than after timeoutMs.
function reconnection(client, timeoutMs) {
  return untilReady(client, timeoutMs, ['error', 'end']);
}

function prefixed(client, key) {
  const prefix = client.options && client.options.keyPrefix;
  if (!prefix) {
    return key;
  }
  if (Buffer.isBuffer(prefix) || Buffer.isBuffer(key)) {
    return Buffer.concat([Buffer.from(prefix), Buffer.from(key)]);
  }
  return prefix + key;
}

function nodeAddress(text) {
  const colon = text.lastIndexOf(':');
  return { host: text.slice(0, colon), port: Number(text.slice(colon + 1)) };
}

// A Limit, or a plain { key, capacity, rate, n, name, blockMs, maxBlockMs }, checked as the
// server would check it (charge, settle, takeLimit).
function checkedLimit(limit) {
  if (limit === null || typeof limit !== 'object') {
    throw new InvalidArgument(`expected a Limit, got ${util.inspect(limit)}`);
  }
  core.checkKey(limit.key);
  core.capacityText(limit.capacity, 'limit.capacity');
  core.rateText(limit.rate, 'limit.rate');
  core.lockoutOptions(limit.blockMs, limit.maxBlockMs);
  return limit;
}

const BACKENDS = ['auto', 'module', 'function', 'script'];
const LUA_BACKENDS = ['function', 'script'];

function optionalMs(options, name, fallback) {
  const value = options[name] ?? fallback;
  if (typeof value !== 'number' || !Number.isFinite(value) || value < 0) {
    throw new InvalidArgument(`${name} must be a finite number of ms >= 0, got ${util.inspect(value)}`);
  }
  return value;
}

function optionalCount(options, name, fallback) {
  const value = options[name] ?? fallback;
  if (!Number.isSafeInteger(value) || value < 1) {
    throw new InvalidArgument(`${name} must be a whole number >= 1, got ${util.inspect(value)}`);
  }
  return value;
}

const ON_UNAVAILABLE = ['raise', 'local'];

class RateLimiter {
  // client: an ioredis Redis or Cluster. Options:
  //   backend          'auto' (default) | 'module' | 'function' | 'script'
  //   timeoutMs        per-command timeout, default 200 (0: none)
  //   connectTimeoutMs how long waitTake waits for a connection of its own, and a call for
  //                    the client's first connection in progress (at least timeoutMs),
  //                    default 1000
  //   blockingMarginMs added to a waitTake's timeout_ms for the client-side timer, default 1000
  //   blockingPoolSize idle blocking connections kept for waitTake, per node, default 4
  //   blockingIdleMs   an idle blocking connection is closed after this, default 5000
  //   moduleRecheckMs  on Lua after the module went away: how often to look for it, default 30000
  //   onUnavailable    'raise' (default): an unreachable Redis throws LimiterUnavailable;
  //                    'local': take, takeLimit, takeAll and peek are answered in process
  //                    (docs/clients.md, "When Redis is down: the local limiter")
  //   instances        how many processes share the limits (the local limiter's buckets are
  //                    capacity / instances, rate / instances), default 1
  //   localMaxKeys     keys the local limiter and the denial cache hold (LRU), default 10000
  //   localProbeMs     during an outage, how long nothing is sent before one call tries
  //                    Redis again, default 1000
  //   cacheDenials     false (default) | true: a denial is answered in process until the
  //                    time it names (docs/clients.md, "The denial cache")
  //   logger           (level, message) => void, or an object with debug/info/warn/error;
  //                    default stderr; false: nothing
  //   meterProvider    the OpenTelemetry MeterProvider the limiter's metrics go to
  //                    (docs/clients.md, "Metrics"); default the global one of
  //                    @opentelemetry/api, when it is installed
  constructor(client, options = {}) {
    if (!client || typeof client.sendCommand !== 'function') {
      throw new InvalidArgument('RateLimiter needs an ioredis Redis or Cluster client');
    }
    const backend = options.backend ?? 'auto';
    if (!BACKENDS.includes(backend)) {
      throw new InvalidArgument(`backend must be one of ${BACKENDS.join(', ')}, got ${backend}`);
    }
    this.client = client;
    this.requestedBackend = backend;
    this.timeoutMs = optionalMs(options, 'timeoutMs', 200);
    this.connectTimeoutMs = optionalMs(options, 'connectTimeoutMs', 1000);
    this.blockingMarginMs = optionalMs(options, 'blockingMarginMs', 1000);
    this.blockingPoolSize = optionalMs(options, 'blockingPoolSize', 4);
    this.blockingIdleMs = optionalMs(options, 'blockingIdleMs', 5000);
    this.moduleRecheckMs = optionalMs(options, 'moduleRecheckMs', 30_000);
    this.onUnavailable = options.onUnavailable ?? 'raise';
    if (!ON_UNAVAILABLE.includes(this.onUnavailable)) {
      throw new InvalidArgument(`onUnavailable must be one of ${ON_UNAVAILABLE.join(', ')}, got ${util.inspect(this.onUnavailable)}`);
    }
    this.instances = optionalCount(options, 'instances', 1);
    this.localMaxKeys = optionalCount(options, 'localMaxKeys', 10_000);
    this.localProbeMs = optionalMs(options, 'localProbeMs', 1000);
    const cacheDenials = options.cacheDenials ?? false;
    if (typeof cacheDenials !== 'boolean') {
      throw new InvalidArgument(`cacheDenials must be true or false, got ${util.inspect(cacheDenials)}`);
    }
    this.cacheDenials = cacheDenials;
    // The denial cache, the local limiter and its outage (lib/engine.js).
    this._shield = new engine.Shield(this.instances, this.localMaxKeys, this.localProbeMs, cacheDenials);
    this.log = toLog(options.logger);
    if (options.meterProvider !== undefined && !isMeterProvider(options.meterProvider)) {
      throw new InvalidArgument(`meterProvider must be an OpenTelemetry MeterProvider (with getMeter), got ${util.inspect(options.meterProvider)}`);
    }
    this._metrics = new Metrics(options.meterProvider);
    watchReconnections(client);
    // Calls that failed, by class of the failure rule (LimiterUnavailable, any other error).
    this.stats = { unavailable: 0, errors: 0 };
    // The backend (engine.Backend), and the detection in progress, shared by the calls that
    // need it.
    this._backend = new engine.Backend(backend, () => performance.now());
    this._detecting = null;
    // waitTake's own connections: idle ones per node ('' standalone), and every one open.
    this._idle = new Map();
    this._connections = new Set();
    this._idleTimer = null;
    this._closed = false;
  }

  // 'module' | 'function' | 'script', or null before the first call that reached the server.
  get backend() {
    return this._backend.chosen;
  }

  get isCluster() {
    return Boolean(this.client.isCluster);
  }

  // Picks the backend now (otherwise the first call does): COMMAND INFO tb.take -> module;
  // else FUNCTION LOAD REPLACE tb.lua -> function; if FUNCTION fails -> script.
  async connect() {
    try {
      await this._drive(engine.ensure(this._backend, this.moduleRecheckMs));
    } catch (err) {
      throw limiterError(err);
    }
    return this._backend.chosen;
  }

  // Runs an operation of lib/engine.js: each step it yields is done here, and its result
  // sent back (or its error thrown in).
  async _drive(operation) {
    let next = operation.next();
    while (!next.done) {
      let result;
      try {
        result = await this._do(next.value);
      } catch (err) {
        next = operation.throw(err);
        continue;
      }
      next = operation.next(result);
    }
    return next.value;
  }

  // The I/O of one step (engine.js, "Operations as steps").
  _do(step) {
    switch (step.step) {
      case 'send':
        return this._sendOp(step.op, step.keys, step.numbers);
      case 'ask_module':
        return this._sendTo(this.client, 'command', ['info', 'tb.take'], null);
      case 'load':
        return this._load(step.what);
      case 'detect':
        return step.generation === this._backend.generation ? this._detectAgain() : undefined;
      case 'reconnect':
        return this._reconnected(step.error);
      case 'owner':
        return this._owner(step.key);
      case 'block':
        return this._blockOnce(step);
      case 'refresh_slots':
        if (typeof this.client.refreshSlotsCache === 'function') {
          this.client.refreshSlotsCache(() => {});
        }
        return undefined;
      case 'take': {
        const { key, capacity, rate, n, name } = step.take;
        return this._serverTake(key, capacity, rate, n, { name, maxWaitMs: step.maxWaitMs });
      }
      case 'acquire': {
        const { key, limit, leaseMs, options } = step.acquire;
        return this._acquireOnce(key, limit, leaseMs, options);
      }
      case 'sleep':
        return sleep(step.ms);
      case 'log':
        this.log(...step.line);
        return undefined;
      default:
        throw new LimiterError('bug', `redis-tb: an unknown step ${util.inspect(step)}`);
    }
  }

  // One detection at a time; callers that arrive meanwhile share it.
  _detectAgain() {
    if (!this._detecting) {
      this._detecting = this._drive(engine.detect(this._backend)).finally(() => {
        this._detecting = null;
      });
    }
    return this._detecting;
  }

  // Every master of a cluster (a function or script lives on one node), else the client.
  // A cluster client whose connections dropped (a restart, CLIENT KILL) knows no master
  // until it has reconnected: it is waited for up to timeoutMs (connectTimeoutMs without
  // one), as _reconnected waits for a standalone client, instead of failing at once.
  async _nodes() {
    if (!this.isCluster) {
      return [this.client];
    }
    const client = this.client;
    let masters = client.nodes('master');
    if (masters.length === 0 && engine.clusterMayReconnect(client.status)) {
      if (client.status === 'wait') {
        client.connect().catch(() => {});
      }
      await clusterReadyAgain(client, this.timeoutMs || this.connectTimeoutMs);
      masters = client.nodes('master');
    }
    if (masters.length === 0) {
      throw new LimiterUnavailable(`the cluster client is not connected (no master known; client ${client.status})`);
    }
    return masters;
  }

  // lua/tb.lua on every master: 'function' (FUNCTION LOAD REPLACE) or 'script' (SCRIPT LOAD).
  async _load(what) {
    const { library, script } = lua();
    const [name, args] = what === 'function' ? ['function', ['load', 'replace', library]] : ['script', ['load', script]];
    await Promise.all((await this._nodes()).map((node) => this._sendTo(node, name, args, null)));
  }

  async _sendTo(client, name, args, keys) {
    await whenWritable(client, Math.max(this.timeoutMs, this.connectTimeoutMs));
    return send(client, name, args, keys, this.timeoutMs);
  }

  _sendOp(op, keys, numbers) {
    const { name, args } = core.commandFor(this._backend.chosen, op, keys, numbers, lua().sha);
    return this._sendTo(this.client, name, args, keys);
  }

  // One call (an engine.Call): the shield first (the denial cache, the local limiter during
  // an outage, engine.Shield), then the failure rule around its sends. `parse`: the reply ->
  // the answer (default: a Decision over call.limits). retryDrop: false for a call that may
  // not be sent twice (refund, settle).
  async _call(call, numbers, parse = (reply) => decisionFrom(reply, call.limits, call.op === 'takeall'), retryDrop = true) {
    const started = call.metered ? performance.now() : 0;
    let early;
    try {
      early = this._shield.before(call, Date.now());
    } catch (err) {
      this.stats.unavailable += 1;
      throw err;
    }
    if (early !== null) {
      if (early.source === 'local') {
        this.stats.unavailable += 1;
      }
      this._decided(call, early, started);
      return early;
    }
    let answer;
    try {
      const sends = engine.exchange(this._backend, this.moduleRecheckMs, call.op, call.keys, numbers, retryDrop);
      answer = parse(await this._drive(sends));
    } catch (err) {
      const error = this._failed(err);
      const { decision, line } = this._shield.failed(call, error, Date.now());
      if (line) {
        this.log(...line);
      }
      if (decision !== null) {
        this._decided(call, decision, started);
        return decision;
      }
      throw error;
    }
    const line = this._shield.after(call, answer, Date.now());
    if (line) {
      this.log(...line);
    }
    this._decided(call, answer, started);
    return answer;
  }

  // A metered call's decision, under the deciding limit's name and where it came from.
  _decided(call, decision, started) {
    if (call.metered) {
      this._metrics.decision(decision.policy, decision.allowed, decision.source, started);
    }
  }

  // Waits for a client whose connection dropped to be ready again: its first reconnection,
  // up to timeoutMs (connectTimeoutMs without one); a refusal fails at once.
  async _reconnected(err) {
    const client = this.client;
    // Still 'ready' with a socket the server closed: ioredis has not seen the close yet, and
    // reconnects as soon as it does.
    const closing = client.status === 'ready' && client.stream != null && client.stream.writable === false;
    if (client.status === 'ready' && !closing) {
      return;
    }
    try {
      const wait = this.isCluster ? clusterReadyAgain : closing ? reconnection : firstConnection;
      await wait(client, this.timeoutMs || this.connectTimeoutMs);
    } catch (failure) {
      throw new LimiterUnavailable(`${err.message}; reconnecting: ${failure.message}`, { cause: err });
    }
  }

  // The LimiterError for err, counted.
  _failed(err) {
    const error = limiterError(err);
    if (error instanceof LimiterUnavailable) {
      this.stats.unavailable += 1;
    } else {
      this.stats.errors += 1;
    }
    return error;
  }

  // `extra`: the command's options after n (MAXWAIT, BLOCK, MAXBLOCK; MAXDEBT), or a function
  // that checks and returns them, called after the numbers are checked so that the first bad
  // argument is named in the server's order. how:
  // { retryDrop, local, cache } (local: the local limiter may answer, `take` or `peek`;
  // cache: the denial cache may answer and learns this call's denial).
  async _single(op, key, capacity, rate, n, options, extra = [], how = {}) {
    const limits = [{ name: core.checkName((options && options.name) ?? 'default'), capacity, rate }];
    const numbers = [core.capacityText(capacity), core.rateText(rate), core.costText(n)];
    const words = typeof extra === 'function' ? extra() : extra;
    numbers.push(...words);
    const k = prefixed(this.client, core.checkKey(key));
    // Only a plain take primes a denial (no MAXWAIT, no BLOCK: no `words`).
    const call = new engine.Call(op, [k], {
      costs: [n], limits, local: how.local ?? false, cache: Boolean(how.cache), primable: op === 'take' && words.length === 0,
      metered: Boolean(how.metered),
    });
    return this._call(call, numbers, undefined, how.retryDrop);
  }

  // How a take is served: locally when Redis is down if the limiter (or the middleware:
  // `local`) says so; from the denial cache unless it is a reservation. Each is a decision
  // of the metrics (waitTake's inner takes are not: the wait is one).
  _takeHow(options, local) {
    const plain = !(options?.maxWaitMs > 0);
    return { local: local || this.onUnavailable === 'local' ? 'take' : false, cache: plain, metered: true };
  }

  // The denial cache forgets a key this limiter changed (refund, charge, settle, unblock).
  _changed(key) {
    this._shield.forget(prefixed(this.client, key));
  }

  // Takes n tokens if the bucket holds them. options.name: the policy name for the headers.
  // options.maxWaitMs: a reservation (MAXWAIT): allowed into debt when the tokens arrive
  // within that many ms; decision.waitMs (its retryAfterMs) is then how long to wait before
  // acting. options.blockMs / maxBlockMs: lockout (BLOCK / MAXBLOCK): a denial locks the key
  // for blockMs, doubling within a probation up to maxBlockMs; every take and peek is denied
  // while the lock holds.
  async take(key, capacity, rate, n = 1, options = {}) {
    return this._take(key, capacity, rate, n, options, false);
  }

  // take, answered by the local limiter during an outage when `local` (the middleware's
  // onUnavailable: 'local') or the limiter's onUnavailable says so.
  async _take(key, capacity, rate, n, options, local) {
    const extra = () => core.takeOptions(options?.maxWaitMs, options?.blockMs, options?.maxBlockMs);
    return this._single('take', key, capacity, rate, n, options, extra, this._takeHow(options, local));
  }

  // A take that only Redis answers (waitTake's: a wait is not served locally nor cached).
  _serverTake(key, capacity, rate, n, options) {
    const extra = core.takeOptions(options.maxWaitMs, options.blockMs, options.maxBlockMs);
    return this._single('take', key, capacity, rate, n, options, extra);
  }

  // take of one Limit: its key, capacity, rate, n, name and lockout. options.maxWaitMs as take.
  async takeLimit(limit, options = {}) {
    const checked = checkedLimit(limit);
    const extra = core.takeOptions(options?.maxWaitMs, checked.blockMs, checked.maxBlockMs);
    return this._single('take', checked.key, checked.capacity, checked.rate, checked.n ?? 1,
      { name: checked.name ?? 'default' }, extra, this._takeHow(options, false));
  }

  // TB.CHARGE: a cost learned after the work, always taken, into debt down to
  // -options.maxDebt (default: the capacity). decision.waitMs is the wait until the debt is
  // repaid (later takes are denied until then).
  async charge(limit, n, options = {}) {
    const checked = checkedLimit(limit);
    const maxDebt = options?.maxDebt;
    const extra = () => (maxDebt === undefined || maxDebt === null ? [] : ['MAXDEBT', core.costText(maxDebt, 'maxDebt')]);
    this._changed(checked.key);
    return this._single('charge', checked.key, checked.capacity, checked.rate, n, { name: checked.name ?? 'default' }, extra);
  }

  // After a take of `reserved` for work that cost `actual`: refunds the difference (actual <
  // reserved) or charges it (actual > reserved), in one call; null, without a call, when they
  // are equal.
  async settle(limit, reserved, actual) {
    const checked = checkedLimit(limit);
    core.costText(reserved, 'reserved');
    core.costText(actual, 'actual');
    const options = { name: checked.name ?? 'default' };
    // Never sent twice: a refund given twice hands out tokens nobody returned.
    const how = { retryDrop: false };
    if (actual < reserved) {
      this._changed(checked.key);
      return this._single('refund', checked.key, checked.capacity, checked.rate, reserved - actual, options, [], how);
    }
    if (actual > reserved) {
      this._changed(checked.key);
      return this._single('charge', checked.key, checked.capacity, checked.rate, actual - reserved, options, [], how);
    }
    return null;
  }

  // TB.UNBLOCK: ends the key's lock and forgets its strikes; true if there was a lock or a
  // strike to forget. limitOrKey: a Limit or { key, ... } (its key), or a key.
  async unblock(limitOrKey) {
    const isLimit = limitOrKey !== null && typeof limitOrKey === 'object' && !Buffer.isBuffer(limitOrKey);
    const key = isLimit ? limitOrKey.key : limitOrKey;
    const k = prefixed(this.client, core.checkKey(key));
    this._changed(key);
    return this._call(new engine.Call('unblock', [k]), [], core.boolFrom);
  }

  // What take would answer now; writes nothing.
  peek(key, capacity, rate, n = 1, options = {}) {
    return this._single('peek', key, capacity, rate, n, options, [], { local: this.onUnavailable === 'local' ? 'peek' : false });
  }

  // Gives n tokens back (capped at the capacity). Never sent twice (see settle).
  refund(key, capacity, rate, n, options = {}) {
    if (n === undefined) {
      return Promise.reject(new InvalidArgument('refund needs n'));
    }
    if (typeof key === 'string' || Buffer.isBuffer(key)) {
      this._changed(key);
    }
    return this._single('refund', key, capacity, rate, n, options, [], { retryDrop: false });
  }

  // All limits or none: Limit objects (or {key, capacity, rate, n, name}); in a cluster every
  // key must hash to one slot (use a hash tag: '{user:42}:sec', '{user:42}:day').
  // options.maxWaitMs: a reservation on every bucket (see take). The limits' blockMs and
  // maxBlockMs are sent as BLOCK / MAXBLOCK, which TB.TAKEALL applies to every bucket: they
  // must be the same in every limit.
  async takeAll(limits, options = {}) {
    return this._takeAll(limits, options, false);
  }

  // takeAll, answered locally during an outage as _take.
  async _takeAll(limits, options, local) {
    if (!Array.isArray(limits) || limits.length === 0) {
      throw new InvalidArgument('takeAll needs a non-empty array of limits');
    }
    const judged = [];
    const keys = [];
    const numbers = [];
    const lockouts = new Set();
    limits.forEach((limit, i) => {
      keys.push(prefixed(this.client, core.checkKey(limit.key)));
      numbers.push(core.capacityText(limit.capacity, `limits[${i}].capacity`), core.rateText(limit.rate, `limits[${i}].rate`),
        core.costText(limit.n ?? 1, `limits[${i}].n`));
      judged.push({ name: core.checkName(limit.name ?? `limit${i}`), capacity: limit.capacity, rate: limit.rate });
      lockouts.add(core.lockoutOptions(limit.blockMs, limit.maxBlockMs).join(' '));
    });
    if (lockouts.size > 1) {
      throw new InvalidArgument("takeAll: every limit must have the same blockMs and maxBlockMs (TB.TAKEALL's BLOCK applies to every bucket)");
    }
    numbers.push(...core.takeOptions(options?.maxWaitMs, limits[0].blockMs, limits[0].maxBlockMs));
    const how = this._takeHow(options, local);
    const call = new engine.Call('takeall', keys, {
      costs: limits.map((limit) => limit.n ?? 1), limits: judged, local: how.local, cache: how.cache, metered: how.metered,
    });
    return this._call(call, numbers);
  }

  // Waits up to options.timeoutMs (required; 0 = no limit) for n tokens.
  // Module backend: TB.BTAKE, first come first served in the server, on a connection of
  // its own to the node that owns the key (a blocked connection would hold up every other
  // command behind it).
  // Function/script backends: one reservation and one sleep (below), first come first served
  // too.
  async waitTake(key, capacity, rate, n = 1, options = {}) {
    if (options.timeoutMs === undefined) {
      throw new InvalidArgument('waitTake needs options.timeoutMs, a finite number of ms >= 0 (0: no limit)');
    }
    const limits = [{ name: core.checkName(options.name ?? 'default'), capacity, rate }];
    const numbers = [core.capacityText(capacity), core.rateText(rate), core.costText(n)];
    // After the numbers, as the server checks them.
    const timeoutText = core.timeoutText(options.timeoutMs);
    const timeoutMs = Number(timeoutText);
    const prefixedKey = prefixed(this.client, core.checkKey(key));
    const started = performance.now();
    let served;
    try {
      served = await this._waitOnModule('TB.BTAKE', prefixedKey, [...numbers, timeoutText], timeoutMs,
        (reply) => decisionFrom(reply, limits, false));
    } catch (err) {
      throw this._failed(err);
    }
    if (served === undefined) {
      // Without the module: one reservation and one sleep (engine.reserveAndWait).
      const take = { key, capacity, rate, n, name: limits[0].name };
      served = await this._drive(engine.reserveAndWait(take, timeoutMs, started, () => performance.now()));
    }
    this._metrics.decision(served.policy, served.allowed, served.source, started);
    this._metrics.wait(served.policy, served.allowed);
    return served;
  }

  // ---------------------------------------------------------------------------------------
  // Concurrency limits: leases (docs/leases.md)
  // ---------------------------------------------------------------------------------------

  _asked(key, limit, leaseMs, options) {
    const texts = [core.wholeText(limit, 'limit'), core.wholeText(leaseMs, 'leaseMs')];
    const name = core.checkName((options && options.name) ?? 'default');
    return { key: core.checkKey(key), limit, leaseMs, name, texts };
  }

  // failOpen: an unavailable limiter answers a Lease with acquired true, lease null and
  // failedOpen true (proceed without a lease) instead of throwing LimiterUnavailable.
  _failOpen(err, asked, options) {
    if (options && options.failOpen && err instanceof LimiterUnavailable) {
      return new core.Lease(true, 0, 0, null, asked, true);
    }
    throw err;
  }

  // Takes a lease on `key` if fewer than `limit` are live; it ends by itself after leaseMs
  // unless released or renewed. options: { name, failOpen }.
  async acquire(key, limit, leaseMs, options = {}) {
    return this._leased(await this._acquireOnce(key, limit, leaseMs, options));
  }

  // A lease call's answer, counted once (tb.leases).
  _leased(lease) {
    this._metrics.lease(lease.policy, lease.acquired ? 'acquired' : 'denied', lease.failedOpen ? 'unavailable_allowed' : 'server');
    return lease;
  }

  // acquire without the count: also waitAcquire's polls (engine.pollForLease), counted once at the end.
  async _acquireOnce(key, limit, leaseMs, options) {
    const asked = this._asked(key, limit, leaseMs, options);
    try {
      return await this._call(new engine.Call('acquire', [prefixed(this.client, asked.key)]), asked.texts,
        (reply) => core.leaseFrom(reply, asked));
    } catch (err) {
      return this._failOpen(err, asked, options);
    }
  }

  // Releases `lease` (a Lease or its id): true if it was live. null (no lease) -> false,
  // without a call.
  async release(key, lease) {
    const id = core.leaseId(lease);
    const k = prefixed(this.client, core.checkKey(key));
    if (id === null) {
      return false;
    }
    return this._call(new engine.Call('release', [k]), [id], core.boolFrom);
  }

  // Makes a live lease end leaseMs from now: true, or false if it is not held any more.
  async renew(key, lease, leaseMs) {
    const id = core.leaseId(lease);
    const k = prefixed(this.client, core.checkKey(key));
    const ms = core.wholeText(leaseMs, 'leaseMs');
    if (id === null) {
      return false;
    }
    return this._call(new engine.Call('renew', [k]), [id, ms], core.boolFrom);
  }

  // Waits up to options.timeoutMs (required; 0 = no limit) for a lease.
  // Module backend: TB.ACQUIRE with timeout_ms, first come first served in the server (a
  // release wakes the head of the queue), on a pooled connection of its own to the node
  // that owns the key, exactly as waitTake. Function/script backends: POLLING, NOT FIFO:
  // acquire, sleep min(retryAfterMs, pollMs (default 100), time left) but at least 1 ms,
  // retry.
  async waitAcquire(key, limit, leaseMs, options = {}) {
    if (options.timeoutMs === undefined) {
      throw new InvalidArgument('waitAcquire needs options.timeoutMs, a finite number of ms >= 0 (0: no limit)');
    }
    const asked = this._asked(key, limit, leaseMs, options);
    // After limit and leaseMs, as the server checks them.
    const timeoutText = core.timeoutText(options.timeoutMs);
    const timeoutMs = Number(timeoutText);
    const pollMs = optionalMs(options, 'pollMs', 100) || 1;
    const prefixedKey = prefixed(this.client, asked.key);
    const started = performance.now();
    let served;
    try {
      served = await this._waitOnModule('TB.ACQUIRE', prefixedKey, [...asked.texts, timeoutText], timeoutMs,
        (reply) => core.leaseFrom(reply, asked));
    } catch (err) {
      return this._leased(this._failOpen(this._failed(err), asked, options));
    }
    if (served === undefined) {
      // Without the module: polling (engine.pollForLease).
      const acquire = { key, limit, leaseMs, options: { name: asked.name, failOpen: options.failOpen } };
      served = await this._drive(engine.pollForLease(acquire, timeoutMs, pollMs, started, () => performance.now()));
    }
    // A failed-open lease did not wait: it is a lease, not a wait.
    if (!served.failedOpen) {
      this._metrics.wait(served.policy, served.acquired);
    }
    return this._leased(served);
  }

  // A LeaseGuard: acquires (waitAcquire with options.timeoutMs), throws LeaseDenied when
  // denied, renews every options.renewEveryMs (default leaseMs / 3; 0: never) until
  // released. `await using guard = await limiter.lease(...)` releases at the end of the
  // block (Symbol.asyncDispose); or call guard.release(); or use withLease.
  async lease(key, limit, leaseMs, options = {}) {
    const renewEveryMs = options.renewEveryMs === undefined
      ? Math.max(1, Math.floor(leaseMs / 3)) : optionalMs(options, 'renewEveryMs', 0);
    const decision = options.timeoutMs === undefined
      ? await this.acquire(key, limit, leaseMs, options)
      : await this.waitAcquire(key, limit, leaseMs, options);
    if (!decision.acquired) {
      throw new LeaseDenied(decision);
    }
    return new LeaseGuard(this, key, decision, leaseMs, renewEveryMs);
  }

  // Runs fn(guard) holding a lease, and releases it when fn settles (also when it throws).
  // Resolves to fn's result; a denial rejects with LeaseDenied.
  async withLease(key, limit, leaseMs, fn, options = {}) {
    if (typeof fn !== 'function') {
      throw new InvalidArgument('withLease needs a function (guard) => ...');
    }
    const guard = await this.lease(key, limit, leaseMs, options);
    let failed = true;
    try {
      const result = await fn(guard);
      failed = false;
      return result;
    } finally {
      await guard._dispose(failed);
    }
  }

  // The most-denied keys of the whole deployment (docs/clients.md, "The most-denied keys"):
  // TB.TOP COUNT count on the server, or on every master of a cluster, merged, the first
  // `count` kept. TB.TOP is the module's alone: it is sent as it is, without detecting the
  // backend. An error reply (no module, an ACL without TB.TOP) throws LimiterReplyError, an
  // unreachable master LimiterUnavailable: never a partial answer.
  async top({ count = 10 } = {}) {
    const text = core.wholeText(count, 'count');
    let lists;
    try {
      const nodes = await this._nodes();
      // Bulk replies come back as Buffers (send() sets no reply encoding): keys exactly.
      lists = await Promise.all(nodes.map(async (node) => core.topFrom(await this._sendTo(node, 'TB.TOP', ['COUNT', text], null))));
    } catch (err) {
      throw this._failed(err);
    }
    return core.mergeTop(lists, count);
  }

  // The node that owns `key`'s slot, by the server's slot rule and the client's slot map;
  // null for a standalone client. A stale map is corrected by MOVED.
  async _owner(key) {
    if (!this.isCluster) {
      return null;
    }
    const owners = this.client.slots && this.client.slots[core.keySlot(key)];
    if (owners && owners.length > 0) {
      return nodeAddress(owners[0]);
    }
    const [master] = await this._nodes();
    return { host: master.options.host, port: master.options.port };
  }

  // waitTake's and waitAcquire's wait in the server (engine.waitOnModule): `command`
  // (TB.BTAKE, TB.ACQUIRE with timeout_ms) on the key's node, its reply -> parse(reply).
  // undefined when the backend is Lua, or the module went away during the wait: the caller
  // waits the Lua way. Errors are thrown as they came; the caller applies the failure rule.
  async _waitOnModule(command, key, args, timeoutMs, parse) {
    const wait = engine.waitOnModule(this._backend, this.moduleRecheckMs, command, key, args, timeoutMs, this.isCluster);
    const reply = await this._drive(wait);
    return reply === undefined ? undefined : parse(reply);
  }

  // One send of a blocking command (engine.blockOnOwner's 'block' step) on a pooled
  // connection of its own to step.node, after ASKING when step.asking.
  async _blockOnce({ command, key, args, timeoutMs, node, asking }) {
    // The client-side timer is above the server's timeout, so the server's denial arrives
    // first; timeout 0 waits as long as the server does, and so does a timeout beyond what a
    // timer holds (2^31 - 1 ms, 24.8 days; a longer one fires at once), up to 2^53 ms.
    const clientTimeout = timeoutMs === 0 || timeoutMs + this.blockingMarginMs > MAX_TIMER_MS
      ? 0 : timeoutMs + this.blockingMarginMs;
    const conn = await this._acquire(node);
    try {
      const pending = [];
      if (asking) {
        pending.push(send(conn, 'asking', [], null, this.timeoutMs));
      }
      pending.push(send(conn, command, [key, ...args], null, clientTimeout));
      const replies = await Promise.all(pending);
      this._release(conn, node);
      return replies[replies.length - 1];
    } catch (err) {
      // A server error leaves the connection usable; anything else (our timer, a lost
      // connection) leaves its state unknown: close it, which also ends the server-side wait.
      if (isReplyError(err)) {
        this._release(conn, node);
      } else {
        conn.disconnect();
      }
      throw err;
    }
  }

  async _newConnection(node) {
    // A connection of waitTake's does not reconnect (one that drops is discarded, and a new
    // one made by the next waitTake), has no command timeout of its own (waitTake's timer
    // is per call: timeout 0 waits without limit), and queues nothing offline.
    const own = { retryStrategy: () => null, commandTimeout: undefined, lazyConnect: false, enableOfflineQueue: true };
    if (node === null) {
      return this.client.duplicate(own);
    }
    const nodes = await this._nodes();
    const same = nodes.find((n) => n.options.host === node.host && n.options.port === node.port) ?? nodes[0];
    return same.duplicate({ ...own, host: node.host, port: node.port, readOnly: false });
  }

  async _acquire(node) {
    if (this._closed) {
      throw new LimiterUnavailable('the RateLimiter is closed');
    }
    const idle = this._idle.get(node ? `${node.host}:${node.port}` : '') ?? [];
    while (idle.length > 0) {
      const conn = idle.pop();
      if (conn.status === 'ready') {
        return conn;
      }
      conn.disconnect();
    }
    const conn = await this._newConnection(node);
    if (this._closed) {
      conn.disconnect();
      throw new LimiterUnavailable('the RateLimiter is closed');
    }
    this._connections.add(conn);
    conn.on('error', () => {});
    conn.once('end', () => this._connections.delete(conn));
    if (conn.status !== 'ready') {
      await new Promise((resolve, reject) => {
        const timer = setTimeout(() => done(new LimiterUnavailable(
          `no connection for waitTake within ${this.connectTimeoutMs} ms`)), this.connectTimeoutMs);
        const onReady = () => done(null);
        const onEnd = () => done(new LimiterUnavailable('the connection for waitTake closed'));
        function done(err) {
          clearTimeout(timer);
          conn.off('ready', onReady);
          conn.off('end', onEnd);
          if (err) {
            conn.disconnect();
            reject(err);
          } else {
            resolve();
          }
        }
        conn.once('ready', onReady);
        conn.once('end', onEnd);
      });
    }
    return conn;
  }

  // Idle connections are kept for the next waitTake, and closed after blockingIdleMs
  // unused (an open socket keeps a Node process alive: call close() at shutdown).
  _release(conn, node) {
    const name = node ? `${node.host}:${node.port}` : '';
    const idle = this._idle.get(name) ?? [];
    this._idle.set(name, idle);
    if (!this._closed && idle.length < this.blockingPoolSize && conn.status === 'ready') {
      idle.push(conn);
      this._armIdleTimer();
    } else {
      conn.disconnect();
    }
  }

  _armIdleTimer() {
    clearTimeout(this._idleTimer);
    this._idleTimer = setTimeout(() => {
      for (const idle of this._idle.values()) {
        for (const conn of idle.splice(0)) {
          conn.disconnect();
        }
      }
    }, this.blockingIdleMs);
    this._idleTimer.unref();
  }

  // Closes every connection the limiter opened (waitTake's, idle or waiting: a waiter then
  // gets LimiterUnavailable); the client passed in stays open, it is the application's.
  close() {
    this._closed = true;
    clearTimeout(this._idleTimer);
    for (const conn of this._connections) {
      conn.disconnect();
    }
    this._connections.clear();
    this._idle.clear();
  }
}

const TUNED = {
  connectTimeout: 200,
  commandTimeout: 200,
  maxRetriesPerRequest: 0,
  enableOfflineQueue: false,
  // A command in flight when the connection dropped already failed for its caller; sent
  // again after the reconnect it would take tokens nobody asked for any more.
  autoResendUnfulfilledCommands: false,
  retryStrategy: (times) => Math.min(times * 100, 2000),
};

// Without an offline queue ioredis refuses every command before its first 'ready' ("Stream
// isn't writeable"), so the application's own first command would fail although the
// limiter waits for that connection. The queue is on for the first connection attempt only
// (unless `options` set enableOfflineQueue): a command sent meanwhile goes out at 'ready', or
// is refused when the attempt fails, as it would have been without the queue. From then on
// nothing is queued.
function queueTheFirstConnection(client, options) {
  if (options.enableOfflineQueue !== undefined) {
    return;
  }
  client.options.enableOfflineQueue = true;
  const settled = () => {
    client.off('ready', settled);
    client.off('close', settled);
    client.options.enableOfflineQueue = false;
    if (client.status !== 'ready') {
      const refused = client.isCluster ? "Cluster isn't ready" : "Stream isn't writeable";
      // A Redis's command queue (written, in flight) is its own business: only the queue of
      // commands never written is emptied (a Cluster has only that one).
      client.flushQueue(new Error(`${refused} and enableOfflineQueue options is false`), { offlineQueue: true, commandQueue: false });
    }
  };
  client.on('ready', settled);
  client.on('close', settled);
}

// An ioredis Redis set up for a rate limiter: fail fast instead of waiting while Redis is
// down (no offline queue after the first connection, no per-request retries, 200 ms connect
// and command timeouts); ioredis keeps reconnecting in the background. `options` override
// any of that. It may be used at once, by the limiter and by the application: the limiter
// waits for the first connection (up to its connectTimeoutMs), and a command of the application's
// waits for it too (queueTheFirstConnection).
function createClient(url = 'redis://127.0.0.1:6379', options = {}) {
  const Redis = requireIoredis();
  const client = new Redis(url, { ...TUNED, ...options });
  queueTheFirstConnection(client, options);
  // Without a listener ioredis prints every failed reconnect; the middleware reports an
  // outage itself, once.
  client.on('error', () => {});
  return client;
}

// The same for an ioredis Cluster; options.redisOptions go to every node's connection.
function createClusterClient(nodes, options = {}) {
  const Redis = requireIoredis();
  const { redisOptions, ...clusterOptions } = options;
  const client = new Redis.Cluster(nodes, {
    enableOfflineQueue: false,
    clusterRetryStrategy: (times) => Math.min(times * 100, 2000),
    ...clusterOptions,
    redisOptions: { ...TUNED, ...redisOptions },
  });
  queueTheFirstConnection(client, clusterOptions);
  client.on('error', () => {});
  return client;
}

module.exports = { RateLimiter, Decision, Limit, createClient, createClusterClient, lua, ioredisOf };
