// Drive the real @anthropic-ai/sdk tool runner with MemvaultMemory against
// tests/mock_messages_api.py, then check the wrapper's own behaviour: error
// results throw ToolError, concurrent calls stay in step, close() is clean,
// and a dead server is a clear MemvaultServerError. In HTTP mode (a
// `memvault server`): the url and token come from MEMVAULT_URL and
// MEMVAULT_TOKEN, and a wrong token, an unreachable server and a silent one
// each reject with a MemvaultServerError with the status and without the token.
//
// Usage: node mock-conversation.mjs BASE_URL VAULT KEY_FILE SESSION
//        (memvault from $MEMVAULT_BIN)
//    or: node mock-conversation.mjs --http BASE_URL SERVER_URL SESSION
//        (the bearer token in $MEMVAULT_TOKEN)
// Exits non-zero with a message on any failure.

import { writeFileSync, unlinkSync } from 'node:fs';
import { createServer } from 'node:net';
import { dirname, join } from 'node:path';
import Anthropic from '@anthropic-ai/sdk';
import { ToolError } from '@anthropic-ai/sdk/lib/tools/ToolError';
import { MemvaultMemory, MemvaultServerError } from '../memvault-memory.mjs';

/** @param {string} msg @returns {never} */
function fail(msg) {
  console.error(`typescript integration: FAIL: ${msg}`);
  process.exit(1);
}

const http = process.argv[2] === '--http';
const [baseURL, vault, keyFile, session] = http
  ? [process.argv[3], undefined, undefined, process.argv[5]]
  : process.argv.slice(2);
const serverURL = http ? process.argv[4] : undefined;
const client = new Anthropic({ apiKey: 'sk-ant-mock-not-a-key', baseURL, maxRetries: 0 });
const token = process.env.MEMVAULT_TOKEN ?? '';

let memory;
if (http) {
  if (!token) fail('MEMVAULT_TOKEN is not set');
  try {
    new MemvaultMemory({ url: serverURL, vault: 'some-vault' });
    fail('url with vault did not throw');
  } catch (e) {
    if (!(e instanceof TypeError) || !e.message.includes('not both')) fail(`url with vault: ${e}`);
  }
  // The url from MEMVAULT_URL, the token from MEMVAULT_TOKEN.
  process.env.MEMVAULT_URL = serverURL;
  memory = new MemvaultMemory({ session, actor: 'typescript-sdk' });
  if (memory.url !== serverURL?.replace(/\/+$/, '') || memory.pid !== undefined || memory.session !== session)
    fail(`HTTP mode from the environment: url ${memory.url} pid ${memory.pid}`);
  if (JSON.stringify(memory).includes(token) || (await import('node:util')).inspect(memory).includes(token))
    fail('the token shows when the tool object is printed');
} else {
  memory = new MemvaultMemory({ vault, keyFile, session, actor: 'typescript-sdk' });
}
const tool = memory.tool();
if (tool.type !== 'memory_20250818' || tool.name !== 'memory') fail(`tool definition ${JSON.stringify(tool)}`);

const final = await client.beta.messages.toolRunner({
  model: 'claude-memvault-mock',
  max_tokens: 1024,
  max_iterations: 20,
  messages: [{ role: 'user', content: 'Remember that Acme Corp prefers email follow-ups.' }],
  tools: [tool],
});
if (final.stop_reason !== 'end_turn') fail(`the runner ended on stop_reason ${final.stop_reason}`);
const text = final.content.find((b) => b.type === 'text');
if (!text || !text.text.includes('prefers email')) fail(`unexpected final message ${JSON.stringify(final.content)}`);

// Concurrent direct calls: each gets its own answer, in step.
const paths = ['/memories/clients/acme.md', '/memories/missing.md', '/memories/clients', '/memories/../x'];
const settled = await Promise.allSettled(
  [...paths, ...paths, ...paths].map((path) => memory.execute({ command: 'view', path })),
);
settled.forEach((s, i) => {
  const ok = [
    s.status === 'fulfilled' && String(s.value).startsWith("Here's the content of /memories/clients/acme.md"),
    s.status === 'rejected' && s.reason instanceof ToolError &&
      s.reason.content === 'The path /memories/missing.md does not exist. Please provide a valid path.',
    s.status === 'fulfilled' && String(s.value).includes('/memories/clients/acme.md'),
    s.status === 'rejected' && s.reason instanceof ToolError && String(s.reason.content).includes('..'),
  ][i % 4];
  if (!ok) fail(`concurrent view ${i}: ${JSON.stringify(s)}`);
});

if (http) {
  await httpChecks();
  console.log('typescript integration: ok');
  process.exit(0);
}

const pid = memory.pid;
const code = await memory.close();
if (code !== 0) fail(`the server exited ${code} after close()`);
try {
  process.kill(pid, 0);
  fail('the server process is still running after close()');
} catch (e) {
  if (/** @type {any} */ (e).code !== 'ESRCH') throw e;
}
try {
  await memory.execute({ command: 'view', path: '/memories' });
  fail('a call after close() did not reject');
} catch (e) {
  if (!(e instanceof MemvaultServerError)) fail(`a call after close() rejected with ${e}`);
}

// A server that cannot unlock the vault dies; the call says so clearly.
const wrong = join(dirname(keyFile), 'wrong.key');
writeFileSync(wrong, Buffer.alloc(32, 7), { mode: 0o600 });
const dead = new MemvaultMemory({ vault, keyFile: wrong, session: `${session}-dead` });
try {
  await dead.execute({ command: 'view', path: '/memories' });
  fail('a call to a server that could not unlock did not reject');
} catch (e) {
  if (!(e instanceof MemvaultServerError) || !e.message.includes('exit status 1') || !e.message.includes('key file'))
    fail(`the dead-server error is not clear: ${e}`);
  console.log(`typescript integration: dead server reported as: ${e.message}`);
}
await dead.close();
unlinkSync(wrong);

// A binary that does not exist is a clear error too, not a hang.
const missing = new MemvaultMemory({ vault, keyFile, binary: join(dirname(keyFile), 'no-such-memvault') });
try {
  await missing.execute({ command: 'view', path: '/memories' });
  fail('a missing binary did not reject');
} catch (e) {
  if (!(e instanceof MemvaultServerError) || !e.message.includes('could not start')) fail(`missing binary: ${e}`);
}
await missing.close();

console.log('typescript integration: ok');

/**
 * A view must reject with MemvaultServerError with this status and words, and no token.
 * @param {MemvaultMemory} m @param {number | undefined} status @param {string} words @param {string[]} secrets
 */
async function expectServerError(m, status, words, secrets) {
  try {
    await m.execute({ command: 'view', path: '/memories' });
  } catch (e) {
    if (!(e instanceof MemvaultServerError) || e.status !== status || !e.message.includes(words))
      fail(`expected a MemvaultServerError with status ${status} saying ${JSON.stringify(words)}: ${e}`);
    for (const s of secrets) {
      if (String(e).includes(s) || String(e.stack).includes(s) || JSON.stringify(e).includes(s))
        fail('a token appears in the MemvaultServerError');
    }
    return e.message;
  }
  fail(`expected a MemvaultServerError with status ${status}, the call succeeded`);
}

async function httpChecks() {
  if ((await memory.close()) !== null) fail('close() in HTTP mode resolved to something');
  try {
    await memory.execute({ command: 'view', path: '/memories' });
    fail('a call after close() did not reject');
  } catch (e) {
    if (!(e instanceof MemvaultServerError)) fail(`a call after close() rejected with ${e}`);
  }

  // A wrong token: 401, the server's message, and no token in the error.
  const wrong = `mvt_0123456789abcdef_${'e'.repeat(64)}`;
  const bad = new MemvaultMemory({ url: serverURL, token: wrong, session: `${session}-bad` });
  const msg = await expectServerError(bad, 401, 'HTTP 401: a valid bearer token is required', [wrong, token]);
  console.log(`typescript integration: wrong token reported as: ${msg}`);
  await bad.close();

  // Nobody listening: no status, no token.
  const closed = createServer();
  await new Promise((resolve) => closed.listen(0, '127.0.0.1', () => resolve(undefined)));
  const gonePort = /** @type {import('node:net').AddressInfo} */ (closed.address()).port;
  await new Promise((resolve) => closed.close(() => resolve(undefined)));
  const gone = new MemvaultMemory({ url: `http://127.0.0.1:${gonePort}`, session: `${session}-gone` });
  await expectServerError(gone, undefined, 'could not be reached', [token]);
  // A connection that could not be made sent nothing: said so (round 41a).
  await expectServerError(gone, undefined, 'nothing was sent, so nothing was changed', [token]);

  // A proxy whose error page echoes the request's headers, the token past
  // the 300 characters a message keeps: no piece of it is shown.
  const echoToken = `mvt_0123456789abcdef_${'ab'.repeat(32)}`;
  const proxy = createServer((sock) => {
    let head = '';
    sock.on('data', (d) => {
      head += d.toString('latin1');
      if (!head.includes('\r\n\r\n')) return;
      const auth = head.split('\r\n').find((h) => h.toLowerCase().startsWith('authorization:'));
      const page = `<html><body>${'x'.repeat(260)} you sent ${auth}</body></html>`;
      sock.end(
        `HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/html\r\nConnection: close\r\nContent-Length: ${page.length}\r\n\r\n${page}`,
      );
    });
  });
  await new Promise((resolve) => proxy.listen(0, '127.0.0.1', () => resolve(undefined)));
  const proxyPort = /** @type {import('node:net').AddressInfo} */ (proxy.address()).port;
  const echo = new MemvaultMemory({ url: `http://127.0.0.1:${proxyPort}`, token: echoToken, session: `${session}-echo` });
  await expectServerError(echo, 502, 'outcome is unknown', [echoToken.slice(0, 24), echoToken.slice(-24)]);
  proxy.close();

  // A server whose 200 is a success carrying no id: not taken as the answer
  // to this call (memvault gives a null id only to an error).
  const stray = createServer((sock) => {
    let head = '';
    sock.on('data', (d) => {
      head += d.toString('latin1');
      if (!head.includes('\r\n\r\n')) return;
      const body = '{"type":"tool_result","tool_use_id":null,"is_error":false,"content":"done"}';
      sock.end(
        `HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: ${body.length}\r\n\r\n${body}`,
      );
    });
  });
  await new Promise((resolve) => stray.listen(0, '127.0.0.1', () => resolve(undefined)));
  const strayPort = /** @type {import('node:net').AddressInfo} */ (stray.address()).port;
  const odd = new MemvaultMemory({ url: `http://127.0.0.1:${strayPort}`, token: echoToken, session: `${session}-stray` });
  await expectServerError(odd, 200, 'answered out of step', [echoToken]);
  stray.close();

  // Labels with spaces at their edges cannot go through HTTP headers as they are.
  for (const label of [' lead', 'lead ', '  ']) {
    try {
      new MemvaultMemory({ url: serverURL, token, session: label });
      fail(`session ${JSON.stringify(label)} was taken in HTTP mode`);
    } catch (e) {
      if (!String(e).includes('no space at either end')) fail(`session ${JSON.stringify(label)}: ${e}`);
    }
  }

  // An unknown command through the runnable tool gets memvault's answer.
  const live = new MemvaultMemory({ url: serverURL, token, session: `${session}-tool` });
  for (const args of [{ command: 'frobnicate' }, { command: 'toString' }, {}]) {
    try {
      await live.tool().run(/** @type {any} */ (args));
      fail(`${JSON.stringify(args)} through tool().run() succeeded`);
    } catch (e) {
      const content = String(/** @type {any} */ (e)?.content);
      if (!(e instanceof ToolError) || !/command/.test(content) || content.includes('not implemented')) {
        fail(`${JSON.stringify(args)} through tool().run() was answered ${e}`);
      }
    }
  }
  await live.close();

  // A server that takes the connection and never answers: a timeout.
  /** @type {import('node:net').Socket[]} */
  const held = [];
  const silent = createServer((sock) => held.push(sock));
  await new Promise((resolve) => silent.listen(0, '127.0.0.1', () => resolve(undefined)));
  const silentPort = /** @type {import('node:net').AddressInfo} */ (silent.address()).port;
  const hung = new MemvaultMemory({ url: `http://127.0.0.1:${silentPort}`, session: `${session}-hung`, timeoutMs: 500 });
  await expectServerError(hung, undefined, 'gave no answer within 500 ms', [token]);
  for (const sock of held) sock.destroy();
  silent.close();
}
