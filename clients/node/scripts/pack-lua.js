'use strict';
// npm leaves symlinks out of tarballs, so `npm pack` / `npm publish` would ship no tb.lua.
// prepack: copy what the tb.lua symlink points at (the repository's lua/tb.lua) to
// dist/tb.lua, a build output (git-ignored), which lib/limiter.js reads when tb.lua is
// absent; postpack: remove it again. Nothing else ever writes dist/.
const fs = require('node:fs');
const path = require('node:path');

const root = path.join(__dirname, '..');
const dist = path.join(root, 'dist');
const mode = process.argv[2];
if (mode === 'copy') {
  const text = fs.readFileSync(path.join(root, 'tb.lua'), 'utf8');
  fs.mkdirSync(dist, { recursive: true });
  fs.writeFileSync(path.join(dist, 'tb.lua'), text);
} else if (mode === 'clean') {
  fs.rmSync(dist, { recursive: true, force: true });
} else {
  console.error('usage: node scripts/pack-lua.js copy|clean');
  process.exit(2);
}
