'use strict';

// What several test files share, on top of servers.js: the servers and clients a file holds
// until its end, the three backends, and Express or Fastify apps on a free loopback port.

const { once } = require('node:events');
const { after, before } = require('node:test');
const express = require('express');
const Fastify = require('fastify');
const { expressRateLimit, fastifyRateLimit } = require('..');
const { startServer, stopAll } = require('./servers');

// The three ways a limiter runs: the server it is on (servers.module or servers.plain), the
// backend option it is given, the backend it must find.
const BACKENDS = [
  { name: 'module', server: 'module', option: 'auto', expect: 'module' },
  { name: 'function', server: 'plain', option: 'auto', expect: 'function' },
  { name: 'script', server: 'plain', option: 'script', expect: 'script' },
];

// A server with the module (servers.module) and one without (servers.plain), started
// before the file's first test.
function moduleAndPlainServers() {
  const servers = {};
  before(async () => {
    [servers.module, servers.plain] = await Promise.all([startServer({ module: true }), startServer()]);
  });
  return servers;
}

// After the file's last test: closes what was pushed onto `closers` (apps), disconnects the
// `clients`, then stops every server the file started.
function untilTheEnd() {
  const clients = [];
  const closers = [];
  after(async () => {
    await Promise.all(closers.map((close) => close()));
    clients.forEach((c) => c.disconnect());
    await stopAll();
  });
  return { clients, closers };
}

// An app with its routes, listening on a free loopback port: { base, close }.
async function serveExpress(app) {
  const http = app.listen(0, '127.0.0.1');
  await once(http, 'listening');
  return {
    base: `http://127.0.0.1:${http.address().port}`,
    async close() {
      // Keep-alive connections (fetch's) would hold close() until they time out.
      http.closeAllConnections();
      await new Promise((resolve) => http.close(resolve));
    },
  };
}

async function serveFastify(app) {
  await app.listen({ port: 0, host: '127.0.0.1' });
  return { base: `http://127.0.0.1:${app.server.address().port}`, close: () => app.close() };
}

// GET / answering {"hello":"world"} behind the middleware (options: expressRateLimit's or
// fastifyRateLimit's), served: { base, close }. onError: an Express error handler of the
// application's, if the test wants one.
const HELLO = {
  async express(options, onError) {
    const app = express();
    app.use(expressRateLimit(options));
    app.get('/', (req, res) => res.json({ hello: 'world' }));
    if (onError) {
      app.use(onError);
    }
    return serveExpress(app);
  },
  async fastify(options) {
    const app = Fastify();
    await app.register(fastifyRateLimit, options);
    app.get('/', async () => ({ hello: 'world' }));
    return serveFastify(app);
  },
};

module.exports = { BACKENDS, HELLO, moduleAndPlainServers, serveExpress, serveFastify, untilTheEnd };
