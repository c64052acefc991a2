'use strict';

// The package as users get it: the version agrees with the module's, tb.lua is the
// repository's lua/tb.lua through a relative symlink (never a copy), `npm install
// ./clients/node` into a fresh project reaches it, and so does a tarball (`npm pack`,
// where npm drops symlinks: the prepack step ships the text as dist/tb.lua). Every ```js
// block of the README runs as written from that install. index.d.ts type-checks against a
// usage file.

const assert = require('node:assert/strict');
const { execFileSync, spawn } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { after, test } = require('node:test');
const { luaSource, version } = require('..');
const { REPO, startServer, stopAll } = require('./servers');

const PKG = path.resolve(__dirname, '..');
const LUA = fs.readFileSync(path.join(REPO, 'lua', 'tb.lua'), 'utf8');
const temps = [];

after(async () => {
  temps.forEach((dir) => fs.rmSync(dir, { recursive: true, force: true }));
  await stopAll();
});

function tempProject() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tb-node-install-'));
  temps.push(dir);
  fs.writeFileSync(path.join(dir, 'package.json'), JSON.stringify({ name: 'tb-install-test', version: '1.0.0', private: true }));
  return dir;
}

const npm = (args, cwd) => execFileSync('npm', [...args, '--no-audit', '--no-fund', '--prefer-offline', '--loglevel=error'],
  { cwd, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });

// Runs `code` with node in `dir`, where require('redis-tb') is the installed package.
const nodeIn = (dir, code, env = {}) => execFileSync(process.execPath, ['-e', code],
  { cwd: dir, encoding: 'utf8', env: { ...process.env, ...env } });

test('version 0.1.0 is the module\'s (Cargo.toml)', () => {
  const cargo = fs.readFileSync(path.join(REPO, 'Cargo.toml'), 'utf8');
  const moduleVersion = /^\[package\][^[]*?^version = "([^"]+)"/m.exec(cargo)[1];
  assert.equal(version, moduleVersion);
  assert.equal(version, '0.1.0');
});

test('tb.lua is a relative symlink to the repository\'s lua/tb.lua, and what the library loads', () => {
  assert.equal(fs.readlinkSync(path.join(PKG, 'tb.lua')), '../../lua/tb.lua');
  const source = luaSource();
  assert.equal(source.library, LUA);
  assert.equal(source.script, LUA.slice(LUA.indexOf('\n') + 1));
  assert.ok(source.library.startsWith('#!lua name=tb\n'));
  assert.ok(!source.script.startsWith('#!'));
});

test('npm install ./clients/node into a fresh project: the Lua text is there (through the symlink)', () => {
  const dir = tempProject();
  npm(['install', PKG], dir);
  const installed = path.join(dir, 'node_modules', 'redis-tb');
  // npm links a directory dependency (install-links=false, npm's default).
  assert.equal(fs.realpathSync(installed), fs.realpathSync(PKG));
  const out = JSON.parse(nodeIn(dir, "const t = require('redis-tb'); const s = t.luaSource(); "
    + 'console.log(JSON.stringify({ file: require("fs").realpathSync(s.file), text: s.library, version: t.version }))'));
  assert.equal(out.text, LUA);
  assert.equal(out.file, fs.realpathSync(path.join(REPO, 'lua', 'tb.lua')));
  assert.equal(out.version, '0.1.0');
  assert.ok(fs.existsSync(path.join(installed, 'index.d.ts')));
});

test('npm pack ./clients/node and install the tarball: dist/tb.lua ships the same text, and it runs', async () => {
  const packDir = fs.mkdtempSync(path.join(os.tmpdir(), 'tb-node-pack-'));
  temps.push(packDir);
  const tarball = npm(['pack', PKG, '--pack-destination', packDir], PKG).trim().split('\n').pop();
  // postpack removed the build output from the checkout again.
  assert.equal(fs.existsSync(path.join(PKG, 'dist')), false);
  const dir = tempProject();
  npm(['install', path.join(packDir, tarball)], dir);
  const installed = path.join(dir, 'node_modules', 'redis-tb');
  assert.equal(fs.lstatSync(installed).isSymbolicLink(), false);
  assert.equal(fs.existsSync(path.join(installed, 'tb.lua')), false, 'npm left the symlink out');
  assert.equal(fs.readFileSync(path.join(installed, 'dist', 'tb.lua'), 'utf8'), LUA);
  // The installed copy works against a server without the module (FUNCTION LOAD of that text).
  const server = await startServer();
  const out = nodeIn(dir, `
    const { RateLimiter, createClient } = require('redis-tb');
    const client = createClient(process.env.URL);
    client.once('ready', async () => {
      const limiter = new RateLimiter(client);
      const d = await limiter.take('installed', 5, 0.001, 2);
      console.log(JSON.stringify({ backend: limiter.backend, remaining: d.remaining }));
      client.disconnect();
    });`, { URL: server.url });
  assert.deepEqual(JSON.parse(out), { backend: 'function', remaining: 3 });
});

// A copy of the checkout as a new user has it: clients/node without node_modules (nor any
// build output) and lua/tb.lua, the symlink's target.
function cleanCheckout() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tb-node-checkout-'));
  temps.push(dir);
  const skip = new Set(['node_modules', 'dist']);
  fs.cpSync(PKG, path.join(dir, 'clients', 'node'), {
    recursive: true,
    verbatimSymlinks: true,
    filter: (src) => !skip.has(path.basename(src)) && !src.endsWith('.tgz'),
  });
  fs.mkdirSync(path.join(dir, 'lua'));
  fs.copyFileSync(path.join(REPO, 'lua', 'tb.lua'), path.join(dir, 'lua', 'tb.lua'));
  return path.join(dir, 'clients', 'node');
}

// The README's first ```js block after `heading`.
function readmeBlock(heading) {
  const readme = fs.readFileSync(path.join(PKG, 'README.md'), 'utf8');
  const after = readme.slice(readme.indexOf(`\n${heading}\n`));
  return /```js\n([\s\S]*?)```/.exec(after)[1];
}

// Runs `file` with node in `dir` until stdout has every pattern, then stops it.
function runUntil(dir, file, env, patterns) {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [file], { cwd: dir, env: { ...process.env, ...env } });
    let out = '';
    let err = '';
    const timer = setTimeout(() => finish(new Error(`timed out; stdout: ${out}; stderr: ${err}`)), 15_000);
    function finish(error) {
      clearTimeout(timer);
      child.kill('SIGKILL');
      if (error) reject(error); else resolve(out);
    }
    child.stdout.on('data', (d) => {
      out += d;
      if (patterns.every((p) => p.test(out))) finish(null);
    });
    child.stderr.on('data', (d) => { err += d; });
    child.on('exit', (code) => {
      if (!patterns.every((p) => p.test(out))) finish(new Error(`exited ${code}; stdout: ${out}; stderr: ${err}`));
    });
  });
}

// The README's install, as written ("## Install"'s sh block), in `dir`: npm pack of the
// checkout `pkg`, npm install of the tarball and ioredis, plus `extra` (the versions of
// package-lock.json, so that npm finds them in its cache).
function readmeInstall(pkg, dir, extra) {
  const readme = fs.readFileSync(path.join(PKG, 'README.md'), 'utf8');
  const block = /```sh\n([\s\S]*?)```/.exec(readme.slice(readme.indexOf('\n## Install')))[1];
  const commands = block.trim().split('\n').map((line) => line.trim().split(/\s+/));
  assert.deepEqual(commands.map((c) => c.slice(0, 2)), [['npm', 'pack'], ['npm', 'install']]);
  for (const [, verb, ...args] of commands) {
    const real = args.map((a) => (a === '/path/to/redis-tb/clients/node' ? pkg : a === 'ioredis' ? 'ioredis@6.0.0' : a));
    npm([verb, ...real, ...(verb === 'install' ? extra : [])], dir);
  }
}

// Every ```js block of the README, in order, with the heading it is under.
function readmeBlocks() {
  const readme = fs.readFileSync(path.join(PKG, 'README.md'), 'utf8');
  const blocks = [];
  let heading = '';
  for (const [, line, code] of readme.matchAll(/^(#+ .*)$|^```js\n([\s\S]*?)^```$/gm)) {
    if (line !== undefined) {
      heading = line;
    } else {
      blocks.push({ heading, code });
    }
  }
  return blocks;
}

// One project for every block: the README's install (the tarball of a clean checkout), and
// the frameworks and the OpenTelemetry SDK its blocks use, at package-lock.json's versions.
let blockProject = null;
function projectForBlocks() {
  if (blockProject === null) {
    const dir = tempProject();
    readmeInstall(cleanCheckout(), dir, ['express@5.3.0', 'fastify@5.12.8', '@opentelemetry/api@1.9.1', '@opentelemetry/sdk-metrics@2.12.1']);
    blockProject = dir;
  }
  return blockProject;
}

// What a block prints beyond running (exit 0, or serving HTTP: below): the blocks that
// contain `has`.
const BLOCK_OUTPUT = [
  { has: "limiter.take('user:42', 20, 5)", output: [/^true 19 "default";r=19;t=1$/m] },
  { has: 'limiter.unblock(login)', output: [/^false$/m] },
  { has: 'limiter.withLease(', output: [/^true 1 0 [0-9]+-[0-9]+-[0-9]+$/m, /^worked with lease [0-9]+-[0-9]+-[0-9]+$/m] },
  { has: 'reader.collect()', output: [/^tb\.decisions \{"tb\.limit":"api","tb\.outcome":"allowed","tb\.source":"redis"\} 1$/m,
    /^tb\.decision\.duration \{"tb\.limit":"api","tb\.outcome":"allowed","tb\.source":"redis"\} 1$/m] },
  { has: 'limiter.top(', output: [/^(?:login:bob 3 0 0 false|no TB\.TOP here: ERR unknown command.*)$/m] },
];

// Runs a block as a CommonJS file of `dir`. A block that serves HTTP prints `listening on <port>` once
// for each `listening on` in its text: each such port must answer GET / with the
// middleware's RateLimit-Policy header (a request the limiter let through unlimited, as a
// busy machine's first one may be, is sent again), and the block is then stopped. Any other
// block must exit 0. Either way stdout must match the block's BLOCK_OUTPUT.
function runBlock(dir, block, env) {
  fs.writeFileSync(path.join(dir, 'app.js'), block.code);
  const servers = block.code.split('listening on').length - 1;
  const expected = BLOCK_OUTPUT.filter((b) => block.code.includes(b.has)).flatMap((b) => b.output);
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ['app.js'], { cwd: dir, env: { ...process.env, PORT: '0', FASTIFY_PORT: '0', ...env } });
    let out = '';
    let err = '';
    let checking = false;
    const timer = setTimeout(() => finish(new Error(`timed out; stdout: ${out}; stderr: ${err}`)), 20_000);
    function finish(error) {
      clearTimeout(timer);
      child.kill('SIGKILL');
      if (error) reject(error); else resolve(out);
    }
    const printed = () => expected.every((p) => p.test(out));
    const ports = () => [...out.matchAll(/^listening on (\d+)$/gm)].map((m) => m[1]);
    async function serving() {
      for (const port of ports()) {
        let res;
        for (let i = 0; i < 10 && !res?.headers.get('ratelimit-policy'); i++) {
          res = await fetch(`http://localhost:${port}/`);
        }
        assert.ok(res.headers.get('ratelimit-policy'),
          `port ${port}: ${res.status} ${JSON.stringify([...res.headers])}, no RateLimit-Policy; stderr: ${err}`);
      }
    }
    child.stdout.on('data', (d) => {
      out += d;
      if (servers > 0 && !checking && printed() && ports().length >= servers) {
        checking = true;
        serving().then(() => finish(null), finish);
      }
    });
    child.stderr.on('data', (d) => { err += d; });
    child.on('exit', (code) => {
      if (servers === 0 && code === 0 && printed()) finish(null);
      else if (!checking) finish(new Error(`exited ${code}; stdout: ${out}; stderr: ${err}`));
    });
  });
}

// Issue 35, also-fix 5: every ```js block of the README runs as pasted into a project (a
// CommonJS file), from the README's install, on a server with the module and one without.
for (const [i, block] of readmeBlocks().entries()) {
  test(`README block ${i + 1} (${block.heading.replace(/^#+ /, '')}) runs as written, with the module and without`, async () => {
    const dir = projectForBlocks();
    for (const module of [true, false]) {
      const server = await startServer({ module });
      try {
        await runBlock(dir, block, { REDIS_URL: server.url });
      } catch (err) {
        err.message = `${module ? 'with' : 'without'} the module: ${err.message}`;
        throw err;
      } finally {
        await server.stop();
      }
    }
  });
}

test('from a clean checkout, the README\'s install and its quick start run as written (issue 18, items 1 and 2)', async () => {
  const pkg = cleanCheckout();
  const dir = tempProject();
  readmeInstall(pkg, dir, ['express@5.3.0']);
  assert.equal(fs.lstatSync(path.join(dir, 'node_modules', 'redis-tb')).isSymbolicLink(), false);
  assert.equal(fs.existsSync(path.join(pkg, 'dist')), false, 'postpack cleaned the checkout');
  fs.writeFileSync(path.join(dir, 'app.js'), readmeBlock('## Quick start'));
  const server = await startServer();
  const out = await runUntil(dir, 'app.js', { REDIS_URL: server.url, PORT: '0' },
    [/^listening on \d+$/m, /^true 19 "default";r=19;t=1$/m]);
  const port = Number(/^listening on (\d+)$/m.exec(out)[1]);
  assert.ok(port > 0);
  await server.stop();
});

test('after the README\'s install, tsc --strict type-checks a file using the types (issue 26, item 2)', () => {
  const pkg = cleanCheckout();
  const dir = tempProject();
  // typescript and @types/node at package-lock.json's versions: from npm's cache.
  readmeInstall(pkg, dir, ['typescript@7.0.2', '@types/node@20.19.43']);
  fs.writeFileSync(path.join(dir, 'app.ts'), `
import { RateLimiter, createClient, expressRateLimit, Decision, TopKey } from 'redis-tb';
const limiter = new RateLimiter(createClient('redis://127.0.0.1:6379', { lazyConnect: true }),
  { onUnavailable: 'local', instances: 2, cacheDenials: true });
async function main(): Promise<void> {
  const d: Decision = await limiter.take('k', 5, 1);
  const source: 'server' | 'local' | 'cache' = d.source;
  console.log(source, d.remaining);
  // The metrics' and top()'s types need no @opentelemetry/api (an optional peer dependency).
  const rows: TopKey[] = await new RateLimiter(limiter.client, { meterProvider: { getMeter: () => ({}) } }).top({ count: 3 });
  console.log(rows.map((row) => [row.key, row.keyBytes.length, row.count, row.truncated]));
}
void main;
void expressRateLimit({ limiter, capacity: 5, rate: 1, onUnavailable: 'local', prefix: 'app:' });
`);
  const tsc = path.join(dir, 'node_modules', '.bin', 'tsc');
  try {
    execFileSync(tsc, ['--strict', '--noEmit', '--module', 'nodenext', '--moduleResolution', 'nodenext', '--types', 'node', 'app.ts'],
      { cwd: dir, encoding: 'utf8', stdio: 'pipe' });
  } catch (err) {
    assert.fail(`tsc --strict failed:\n${err.stdout}${err.stderr}`);
  }
});

test('index.d.ts type-checks against test/types/usage.ts (tsc --noEmit)', () => {
  const tsc = path.join(PKG, 'node_modules', '.bin', 'tsc');
  try {
    execFileSync(tsc, ['-p', path.join(__dirname, 'types', 'tsconfig.json')], { encoding: 'utf8', stdio: 'pipe' });
  } catch (err) {
    assert.fail(`tsc failed:\n${err.stdout}${err.stderr}`);
  }
});
