'use strict';

// Real servers for the tests: redis-server (TB_SERVER, default redis-server on PATH) on free
// 127.0.0.1 ports, in temp dirs, with the module (TB_MODULE, absolute; default
// <repo>/target/release/libredis_tb.so) or without it; and 3-master clusters.
// Every server started here is killed when the test process exits, even on failure.

const { spawn } = require('node:child_process');
const fs = require('node:fs');
const net = require('node:net');
const os = require('node:os');
const path = require('node:path');
const { setTimeout: sleep } = require('node:timers/promises');
const Redis = require('ioredis');

const REPO = path.resolve(__dirname, '..', '..', '..');

function modulePath() {
  const p = path.resolve(process.env.TB_MODULE ?? path.join(REPO, 'target', 'release', 'libredis_tb.so'));
  if (!fs.existsSync(p)) {
    throw new Error(`module not found at ${p} (cargo build --release at the repository root, or set TB_MODULE)`);
  }
  return p;
}

const serverBin = () => process.env.TB_SERVER ?? 'redis-server';

const children = new Set();
const started = new Set();
process.on('exit', () => {
  for (const child of children) {
    try {
      child.kill('SIGCONT');
      child.kill('SIGKILL');
    } catch {
      // already gone
    }
  }
});

function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

function ping(port) {
  return new Promise((resolve) => {
    const sock = net.connect({ port, host: '127.0.0.1' });
    let data = '';
    const done = (ok) => {
      sock.destroy();
      resolve(ok);
    };
    sock.setTimeout(500, () => done(false));
    sock.on('error', () => done(false));
    sock.on('connect', () => sock.write('PING\r\n'));
    sock.on('data', (d) => {
      data += d;
      if (data.includes('\r\n')) done(data.startsWith('+PONG'));
    });
  });
}

// { module: bool, args: [...], port } -> a running server (on `port`, e.g. to restart one
// that was stopped, or on a free port).
async function startServer({ module = false, args = [], port: wanted } = {}) {
  for (let attempt = 0; attempt < 5; attempt++) {
    const port = wanted ?? await freePort();
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tb-node-'));
    const argv = ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', dir,
      '--enable-module-command', 'yes', ...args];
    if (module) argv.push('--loadmodule', modulePath());
    const child = spawn(serverBin(), argv, { stdio: ['ignore', 'ignore', 'inherit'] });
    children.add(child);
    // Not keeping the test process alive: a failed test still ends, and the exit
    // handler above kills what is left.
    child.unref();
    let running = true;
    const exited = new Promise((resolve) => child.once('exit', () => {
      running = false;
      children.delete(child);
      resolve();
    }));
    const server = {
      port,
      dir,
      url: `redis://127.0.0.1:${port}`,
      withModule: module,
      get running() { return running; },
      pause() { child.kill('SIGSTOP'); },
      resume() { child.kill('SIGCONT'); },
      async stop() {
        if (running) {
          // Keep the event loop alive until the exit is seen (the child is unref'd: with
          // nothing else pending, a test awaiting stop() would end with the promise pending).
          child.ref();
          child.kill('SIGCONT');
          child.kill('SIGKILL');
          await exited;
        }
        started.delete(server);
        fs.rmSync(dir, { recursive: true, force: true });
      },
    };
    const deadline = Date.now() + 10_000;
    while (running && Date.now() < deadline) {
      if (await ping(port)) {
        started.add(server);
        return server;
      }
      await sleep(20);
    }
    await server.stop();
  }
  throw new Error(`${serverBin()} did not start`);
}

// A plain ioredis connection for the tests' own checks.
function admin(port) {
  const r = new Redis({ port, host: '127.0.0.1', lazyConnect: false, maxRetriesPerRequest: 1 });
  r.on('error', () => {});
  return r;
}

const SLOT_RANGES = [[0, 5460], [5461, 10922], [10923, 16383]];

// Three masters owning all slots (the recipe of tests/it/topology/cluster.rs: explicit bus ports,
// SET-CONFIG-EPOCH, ADDSLOTSRANGE, MEET, wait for cluster_state:ok on every node).
async function startCluster({ module = false } = {}) {
  const nodes = [];
  for (let i = 0; i < 3; i++) {
    const bus = await freePort();
    const node = await startServer({
      module,
      args: ['--cluster-enabled', 'yes', '--cluster-config-file', 'nodes.conf', '--cluster-port', String(bus),
        '--cluster-node-timeout', '5000'],
    });
    node.busPort = bus;
    nodes.push(node);
  }
  const conns = nodes.map((n) => admin(n.port));
  try {
    for (let i = 0; i < 3; i++) {
      await conns[i].call('cluster', 'set-config-epoch', String(i + 1));
      await conns[i].call('cluster', 'addslotsrange', String(SLOT_RANGES[i][0]), String(SLOT_RANGES[i][1]));
    }
    for (let i = 1; i < 3; i++) {
      await conns[0].call('cluster', 'meet', '127.0.0.1', String(nodes[i].port), String(nodes[i].busPort));
    }
    const deadline = Date.now() + 30_000;
    for (;;) {
      const states = await Promise.all(conns.map(async (c) => {
        const info = await c.call('cluster', 'info');
        const slots = await c.call('cluster', 'slots');
        return info.includes('cluster_state:ok') && slots.length === 3;
      }));
      if (states.every(Boolean)) break;
      if (Date.now() > deadline) throw new Error('cluster did not converge');
      await sleep(100);
    }
  } catch (err) {
    await Promise.all(nodes.map((n) => n.stop()));
    throw err;
  } finally {
    conns.forEach((c) => c.disconnect());
  }
  return {
    nodes,
    startup: nodes.map((n) => ({ host: '127.0.0.1', port: n.port })),
    async stop() {
      await Promise.all(nodes.map((n) => n.stop()));
    },
  };
}

// Stops every server this process started (for after hooks: also those of a setup that
// failed half-way).
async function stopAll() {
  await Promise.all([...started].map((s) => s.stop()));
}

module.exports = { stopAll, startServer, startCluster, admin, modulePath, freePort, REPO };
