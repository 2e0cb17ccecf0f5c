// Builds realistic Node.js data structures until the process holds about TARGET_MIB MiB of
// anonymous memory, prints READY and waits for stdin to close (or to be killed).
//
// The data: Debian's package database parsed into objects, then generated order/user records
// kept in a Map, arrays of numbers, nested objects and cached JSON strings, as a web service
// holding a working set would.
//
// Usage: node hold.js TARGET_MIB
'use strict';
const fs = require('fs');

function rssAnonKiB() {
  const m = /RssAnon:\s+(\d+)/.exec(fs.readFileSync('/proc/self/status', 'utf8'));
  return m ? Number(m[1]) : 0;
}

// Small deterministic PRNG (mulberry32) so every run builds the same kinds of values.
function rng(seed) {
  return function () {
    seed |= 0; seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function parsePackages(path) {
  let text = '';
  try { text = fs.readFileSync(path, 'utf8'); } catch (e) { /* synthetic below */ }
  const pkgs = [];
  for (const stanza of text.split('\n\n')) {
    const p = {};
    let last = null;
    for (const line of stanza.split('\n')) {
      if ((line.startsWith(' ') || line.startsWith('\t')) && last) p[last] += '\n' + line.trim();
      else {
        const i = line.indexOf(':');
        if (i > 0) { last = line.slice(0, i); p[last] = line.slice(i + 1).trim(); }
      }
    }
    if (p.Package) pkgs.push(p);
  }
  if (pkgs.length === 0) for (let i = 0; i < 500; i++) pkgs.push({ Package: 'pkg' + i, Version: '1.' + i, Description: 'generated package' });
  return pkgs;
}

const targetKiB = Number(process.argv[2]) * 1024;
const rand = rng(4321);
const pkgs = parsePackages('/var/lib/dpkg/status');
const words = [...new Set(pkgs.flatMap(p => (p.Description || '').split(/\s+/)))].filter(Boolean);
const pick = () => words[Math.floor(rand() * words.length)];
const users = new Map();
const orders = [];
const jsonCache = [];
let i = 0;
for (;;) {
  for (let k = 0; k < 2000; k++, i++) {
    const p = pkgs[i % pkgs.length];
    const userId = 'user-' + Math.floor(rand() * 50000);
    let user = users.get(userId);
    if (!user) {
      user = { id: userId, name: pick() + ' ' + pick(), email: pick().toLowerCase() + '@example.org',
               created: new Date(1.6e12 + Math.floor(rand() * 1e11)), orders: [] };
      users.set(userId, user);
    }
    const order = {
      id: i, user: userId, item: p.Package + '/' + p.Version, qty: 1 + Math.floor(rand() * 9),
      price: Math.round(rand() * 100000) / 100, tags: [pick(), pick(), pick()],
      shipping: { street: pick() + ' ' + Math.floor(rand() * 300), city: pick(), zip: String(10000 + Math.floor(rand() * 89999)) },
      samples: Array.from({ length: Math.floor(rand() * 16) }, () => rand()),
      note: Array.from({ length: 3 + Math.floor(rand() * 20) }, pick).join(' '),
    };
    orders.push(order);
    user.orders.push(i);
    if (i % 4 === 0) jsonCache.push(JSON.stringify(order));
  }
  if (rssAnonKiB() >= targetKiB) break;
}
process.stdout.write(`READY orders=${orders.length} users=${users.size} rss_anon_kib=${rssAnonKiB()}\n`);
process.stdin.resume(); // keeps the event loop (and the data) alive until the dumper kills us
process.stdin.on('end', () => process.exit(0));
