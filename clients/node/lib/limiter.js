'use strict';

const crypto = require('node:crypto');
const fs = require('node:fs');
const path = require('node:path');
const util = require('node:util');
const { setTimeout: sleep } = require('node:timers/promises');
const { Command } = require('ioredis');

const { InvalidArgument, LimiterUnavailable, LimiterReplyError, wrap, isReplyError } = require('./errors');
const { rateLimitHeaders } = require('./headers');

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
// Values
// ---------------------------------------------------------------------------------------

// A number as the command's text: String(x) is the shortest decimal that reads back as x
// ("0.001", "1e-7", "1e+21"), which the module and the script both accept.
function numberText(value, what) {
  if (typeof value !== 'number' || !Number.isFinite(value)) {
    throw new InvalidArgument(`${what} must be a finite number, got ${String(value)}`);
  }
  return String(value);
}

// A policy name goes into the headers as an sf-string: non-empty printable ASCII only.
function checkName(name) {
  if (typeof name !== 'string' || !/^[\x20-\x7e]+$/.test(name)) {
    throw new InvalidArgument(`a policy name must be non-empty printable ASCII, not ${util.inspect(name)}`);
  }
  return name;
}

function checkKey(key) {
  if (!(typeof key === 'string' || Buffer.isBuffer(key)) || key.length === 0) {
    throw new InvalidArgument('key must be a non-empty string or Buffer');
  }
  return key;
}

// One limit of a takeAll call (and the shape the middleware's `limits` option takes).
class Limit {
  constructor(key, capacity, rate, n = 1, name = null) {
    this.key = key;
    this.capacity = capacity;
    this.rate = rate;
    this.n = n;
    this.name = name;
  }
}

// The answer of every call. `limits` lists what the call was judged with (one entry, or one
// per takeAll limit in the call's order); `index` is the deciding limit of a takeAll (null
// otherwise); `capacity`, `rate` and `policy` are that limit's.
class Decision {
  constructor(reply, limits, index) {
    this.allowed = reply[0] === 1;
    this.remaining = reply[1];
    this.retryAfterMs = reply[2];
    this.resetAfterMs = reply[3];
    this.index = index;
    const deciding = limits[index ?? 0];
    this.capacity = deciding.capacity;
    this.rate = deciding.rate;
    this.policy = deciding.name;
    Object.defineProperty(this, 'limits', { value: limits, enumerable: false });
  }

  headers() {
    return rateLimitHeaders(this);
  }
}

function decisionFrom(reply, limits, withIndex) {
  const count = withIndex ? 5 : 4;
  if (!Array.isArray(reply) || reply.length !== count || !reply.every((x) => typeof x === 'number')) {
    throw new LimiterReplyError(`unexpected reply: ${util.inspect(reply)}`);
  }
  return new Decision(reply, limits, withIndex ? reply[4] : null);
}

// ---------------------------------------------------------------------------------------
// Logging: a function (level, message) or an object with debug/info/warn methods (console,
// pino, ...). Default: util.debuglog, printed only with NODE_DEBUG=redis-tb.
// ---------------------------------------------------------------------------------------

const debuglog = util.debuglog('redis-tb');

function toLog(logger) {
  if (logger === undefined || logger === null) {
    return (level, message) => debuglog('%s: %s', level, message);
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
function send(client, name, args, keys, timeoutMs) {
  const command = new Command(name, args);
  if (keys) {
    command.keys = keys;
  }
  if (timeoutMs > 0) {
    command.setTimeout(timeoutMs);
  }
  return client.sendCommand(command);
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

const BACKENDS = ['auto', 'module', 'function', 'script'];
const MODULE_COMMANDS = { take: 'TB.TAKE', peek: 'TB.PEEK', refund: 'TB.REFUND', takeall: 'TB.TAKEALL' };
const FUNCTIONS = { take: 'tb_take', peek: 'tb_peek', refund: 'tb_refund', takeall: 'tb_takeall' };

class RateLimiter {
  // client: an ioredis Redis or Cluster. Options:
  //   backend          'auto' (default) | 'module' | 'function' | 'script'
  //   timeoutMs        per-command timeout, default 200 (0: none)
  //   connectTimeoutMs how long waitTake waits for a connection of its own, default 1000
  //   blockingMarginMs added to a waitTake's timeout_ms for the client-side timer, default 1000
  //   blockingPoolSize idle blocking connections kept for waitTake, default 4
  //   blockingIdleMs   an idle blocking connection is closed after this, default 5000
  //   logger           (level, message) => void, or an object with debug/info/warn
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
    this.timeoutMs = options.timeoutMs ?? 200;
    this.connectTimeoutMs = options.connectTimeoutMs ?? 1000;
    this.blockingMarginMs = options.blockingMarginMs ?? 1000;
    this.blockingPoolSize = options.blockingPoolSize ?? 4;
    this.blockingIdleMs = options.blockingIdleMs ?? 5000;
    this._idleTimer = null;
    this.log = toLog(options.logger);
    this._backend = null;
    this._resolving = null;
    this._idle = [];
    this._busy = new Set();
    this._closed = false;
    // Outage state shared by every middleware built on this limiter (one log line per outage).
    this._outage = null;
    if (client.options && client.options.enableOfflineQueue !== false) {
      this.log('debug', 'the client queues commands while disconnected (enableOfflineQueue); calls still time out '
        + `after ${this.timeoutMs} ms, but a queued take may be sent later: createClient() turns the queue off`);
    }
  }

  // 'module' | 'function' | 'script', or null before the first call (or connect()).
  get backend() {
    return this._backend;
  }

  get isCluster() {
    return Boolean(this.client.isCluster);
  }

  // Picks the backend now (otherwise the first call does): COMMAND INFO tb.take -> module;
  // else FUNCTION LOAD REPLACE tb.lua -> function; if FUNCTION fails -> script.
  async connect() {
    if (this._backend) {
      return this._backend;
    }
    if (!this._resolving) {
      this._resolving = this._detect().finally(() => {
        this._resolving = null;
      });
    }
    await this._resolving;
    return this._backend;
  }

  _choose(backend, why) {
    this._backend = backend;
    this.log('info', `redis-tb backend: ${backend} (${why})`);
  }

  async _detect() {
    try {
      const forced = this.requestedBackend;
      if (forced === 'module') {
        return this._choose('module', 'forced');
      }
      if (forced === 'function') {
        await this._loadFunction();
        return this._choose('function', 'forced; FUNCTION LOAD tb done');
      }
      if (forced === 'script') {
        await this._loadScript();
        return this._choose('script', 'forced; SCRIPT LOAD done');
      }
      let info = null;
      try {
        info = await send(this.client, 'command', ['info', 'tb.take'], null, this.timeoutMs);
      } catch (err) {
        // An error reply (e.g. an ACL that refuses COMMAND) says nothing about the module:
        // go on to the Lua fallback.
        if (!isReplyError(err)) {
          throw err;
        }
      }
      if (Array.isArray(info) && Array.isArray(info[0])) {
        return this._choose('module', 'the server has TB.TAKE');
      }
      try {
        await this._loadFunction();
      } catch (err) {
        if (!isReplyError(err)) {
          throw err;
        }
        await this._loadScript();
        return this._choose('script', `no TB.TAKE; FUNCTION LOAD failed (${err.message}); EVALSHA of lua/tb.lua`);
      }
      return this._choose('function', 'no TB.TAKE on the server; FUNCTION LOAD of lua/tb.lua');
    } catch (err) {
      throw wrap(err);
    }
  }

  // Every master of a cluster (a function or script lives on one node), else the client.
  _nodes() {
    if (!this.isCluster) {
      return [this.client];
    }
    const masters = this.client.nodes('master');
    if (masters.length === 0) {
      throw new LimiterUnavailable('the cluster client is not connected (no master known yet)');
    }
    return masters;
  }

  async _loadFunction() {
    const { library } = lua();
    await Promise.all(this._nodes().map((node) => send(node, 'function', ['load', 'replace', library], null, this.timeoutMs)));
  }

  async _loadScript() {
    const { script } = lua();
    await Promise.all(this._nodes().map((node) => send(node, 'script', ['load', script], null, this.timeoutMs)));
  }

  // One call of `op` (take, peek, refund, takeall) over the chosen backend. `keys` are
  // prefixed already; `numbers` are the texts after the keys (capacity rate n per key).
  async _run(op, keys, numbers) {
    await this.connect();
    const client = this.client;
    const timeout = this.timeoutMs;
    switch (this._backend) {
      case 'module':
        if (op === 'takeall') {
          const args = [];
          keys.forEach((key, i) => args.push(key, ...numbers.slice(3 * i, 3 * i + 3)));
          return send(client, MODULE_COMMANDS[op], args, keys, timeout);
        }
        return send(client, MODULE_COMMANDS[op], [...keys, ...numbers], keys, timeout);
      case 'function': {
        const fcall = op === 'peek' ? 'fcall_ro' : 'fcall';
        const args = [FUNCTIONS[op], keys.length, ...keys, ...numbers];
        try {
          return await send(client, fcall, args, keys, timeout);
        } catch (err) {
          // Someone ran FUNCTION FLUSH, or a node joined without the library: load it
          // everywhere again and retry once.
          if (!(isReplyError(err) && /function not found/i.test(err.message))) {
            throw err;
          }
          await this._loadFunction();
          return send(client, fcall, args, keys, timeout);
        }
      }
      case 'script': {
        const { sha, script } = lua();
        const rest = [keys.length, ...keys, op, ...numbers];
        try {
          return await send(client, 'evalsha', [sha, ...rest], keys, timeout);
        } catch (err) {
          if (!(isReplyError(err) && /^NOSCRIPT/.test(err.message))) {
            throw err;
          }
          // EVAL runs the script on the key's node and caches it there for the next EVALSHA.
          return send(client, 'eval', [script, ...rest], keys, timeout);
        }
      }
      default:
        throw new InvalidArgument(`no backend chosen (${this._backend})`);
    }
  }

  async _single(op, key, capacity, rate, n, options) {
    const limits = [{ name: checkName((options && options.name) ?? 'default'), capacity, rate }];
    const numbers = [numberText(capacity, 'capacity'), numberText(rate, 'rate'), numberText(n, 'n')];
    const keys = [prefixed(this.client, checkKey(key))];
    let reply;
    try {
      reply = await this._run(op, keys, numbers);
    } catch (err) {
      throw wrap(err);
    }
    return decisionFrom(reply, limits, false);
  }

  // Takes n tokens if the bucket holds them. options.name: the policy name for the headers.
  take(key, capacity, rate, n = 1, options = {}) {
    return this._single('take', key, capacity, rate, n, options);
  }

  // What take would answer now; writes nothing.
  peek(key, capacity, rate, n = 1, options = {}) {
    return this._single('peek', key, capacity, rate, n, options);
  }

  // Gives n tokens back (capped at the capacity).
  refund(key, capacity, rate, n, options = {}) {
    if (n === undefined) {
      return Promise.reject(new InvalidArgument('refund needs n'));
    }
    return this._single('refund', key, capacity, rate, n, options);
  }

  // All limits or none: Limit objects (or {key, capacity, rate, n, name}); in a cluster every
  // key must hash to one slot (use a hash tag: '{user:42}:sec', '{user:42}:day').
  async takeAll(limits) {
    if (!Array.isArray(limits) || limits.length === 0) {
      throw new InvalidArgument('takeAll needs a non-empty array of limits');
    }
    const judged = [];
    const keys = [];
    const numbers = [];
    limits.forEach((limit, i) => {
      const n = limit.n ?? 1;
      keys.push(prefixed(this.client, checkKey(limit.key)));
      numbers.push(numberText(limit.capacity, `limits[${i}].capacity`), numberText(limit.rate, `limits[${i}].rate`),
        numberText(n, `limits[${i}].n`));
      judged.push({ name: checkName(limit.name ?? `limit${i}`), capacity: limit.capacity, rate: limit.rate });
    });
    let reply;
    try {
      reply = await this._run('takeall', keys, numbers);
    } catch (err) {
      throw wrap(err);
    }
    return decisionFrom(reply, judged, true);
  }

  // Waits up to options.timeoutMs (required; 0 = no limit) for n tokens.
  // Module backend: TB.BTAKE, first come first served in the server, on a connection of
  // its own (a blocked connection would hold up every other command behind it).
  // Function/script backends: POLLING, NOT FIFO: take, sleep min(retry_after_ms, time
  // left), retry; a later caller can be served before an earlier one.
  async waitTake(key, capacity, rate, n = 1, options = {}) {
    if (typeof options.timeoutMs !== 'number' || !Number.isFinite(options.timeoutMs) || options.timeoutMs < 0) {
      throw new InvalidArgument('waitTake needs options.timeoutMs, a finite number of ms >= 0 (0: no limit)');
    }
    const timeoutMs = Math.ceil(options.timeoutMs);
    const limits = [{ name: checkName(options.name ?? 'default'), capacity, rate }];
    const numbers = [numberText(capacity, 'capacity'), numberText(rate, 'rate'), numberText(n, 'n')];
    checkKey(key);
    try {
      await this.connect();
    } catch (err) {
      throw wrap(err);
    }
    if (this._backend === 'module') {
      const keys = [prefixed(this.client, key)];
      const reply = await this._blocking(keys, [...numbers, String(timeoutMs)], timeoutMs);
      return decisionFrom(reply, limits, false);
    }
    const deadline = timeoutMs === 0 ? Infinity : performance.now() + timeoutMs;
    for (;;) {
      const decision = await this.take(key, capacity, rate, n, { name: limits[0].name });
      if (decision.allowed || decision.retryAfterMs < 0) {
        return decision;
      }
      const left = deadline - performance.now();
      if (left <= 0) {
        return decision;
      }
      await sleep(Math.max(1, Math.min(decision.retryAfterMs, left)));
    }
  }

  async _blocking(keys, args, timeoutMs) {
    let conn;
    try {
      conn = await this._acquire();
    } catch (err) {
      throw wrap(err);
    }
    this._busy.add(conn);
    // The client-side timer is above the server's timeout, so the server's denial arrives
    // first; timeout 0 waits as long as the server does.
    const clientTimeout = timeoutMs === 0 ? 0 : timeoutMs + this.blockingMarginMs;
    try {
      const reply = await send(conn, 'TB.BTAKE', [...keys, ...args], keys, clientTimeout);
      this._busy.delete(conn);
      this._release(conn);
      return reply;
    } catch (err) {
      this._busy.delete(conn);
      // A server error leaves the connection usable; anything else (our timer, a lost
      // connection) leaves its state unknown: close it, which also ends the server-side wait.
      if (isReplyError(err)) {
        this._release(conn);
      } else {
        conn.disconnect();
      }
      throw wrap(err);
    }
  }

  async _acquire() {
    if (this._closed) {
      throw new LimiterUnavailable('the RateLimiter is closed');
    }
    while (this._idle.length > 0) {
      const conn = this._idle.pop();
      if (conn.status === 'ready') {
        return conn;
      }
      conn.disconnect();
    }
    // A connection of waitTake's does not reconnect: one that drops is discarded (and a
    // new one made by the next waitTake), so nothing lingers when the server is gone.
    const conn = this.isCluster
      ? this.client.duplicate([], { clusterRetryStrategy: () => null })
      : this.client.duplicate({ retryStrategy: () => null });
    conn.on('error', () => {});
    if (conn.status === 'wait') {
      conn.connect().catch(() => {});
    }
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
  _release(conn) {
    if (!this._closed && this._idle.length < this.blockingPoolSize && conn.status === 'ready') {
      this._idle.push(conn);
      this._armIdleTimer();
    } else {
      conn.disconnect();
    }
  }

  _armIdleTimer() {
    clearTimeout(this._idleTimer);
    this._idleTimer = setTimeout(() => {
      for (const conn of this._idle.splice(0)) {
        conn.disconnect();
      }
    }, this.blockingIdleMs);
    this._idleTimer.unref();
  }

  // Closes the limiter's own connections (waitTake's); the client passed in stays open.
  close() {
    this._closed = true;
    clearTimeout(this._idleTimer);
    for (const conn of [...this._idle, ...this._busy]) {
      conn.disconnect();
    }
    this._idle = [];
    this._busy.clear();
  }

  // Middleware bookkeeping: one warning when failures start, one info line when they end.
  _failed(err, failOpen) {
    if (this._outage === null) {
      this._outage = { since: Date.now() };
      const action = failOpen ? 'letting requests through' : 'answering 503';
      this.log('warn', `redis-tb: rate limiter unavailable, ${action}: ${err.message}`);
    }
  }

  _succeeded() {
    if (this._outage !== null) {
      this._outage = null;
      this.log('info', 'redis-tb: rate limiter available again');
    }
  }
}

const TUNED = {
  connectTimeout: 200,
  commandTimeout: 200,
  maxRetriesPerRequest: 0,
  enableOfflineQueue: false,
  retryStrategy: (times) => Math.min(times * 100, 2000),
};

// An ioredis Redis set up for a rate limiter: fail fast instead of waiting while Redis is
// down (no offline queue, no per-request retries, 200 ms connect and command timeouts);
// ioredis keeps reconnecting in the background. `options` override any of that.
function createClient(url = 'redis://127.0.0.1:6379', options = {}) {
  const Redis = require('ioredis');
  const client = new Redis(url, { ...TUNED, ...options });
  // Without a listener ioredis prints every failed reconnect; the middleware reports an
  // outage itself, once.
  client.on('error', () => {});
  return client;
}

// The same for an ioredis Cluster; options.redisOptions go to every node's connection.
function createClusterClient(nodes, options = {}) {
  const Redis = require('ioredis');
  const { redisOptions, ...clusterOptions } = options;
  const client = new Redis.Cluster(nodes, {
    enableOfflineQueue: false,
    clusterRetryStrategy: (times) => Math.min(times * 100, 2000),
    ...clusterOptions,
    redisOptions: { ...TUNED, ...redisOptions },
  });
  client.on('error', () => {});
  return client;
}

module.exports = { RateLimiter, Decision, Limit, createClient, createClusterClient, lua, numberText, checkName };
