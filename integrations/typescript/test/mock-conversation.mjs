// Drive the real @anthropic-ai/sdk tool runner with MemvaultMemory against
// tests/mock_messages_api.py, then check the wrapper's own behaviour: error
// results throw ToolError, concurrent calls stay in step, close() is clean,
// and a dead server is a clear MemvaultServerError.
//
// Usage: node mock-conversation.mjs BASE_URL VAULT KEY_FILE SESSION
// (memvault from $MEMVAULT_BIN). Exits non-zero with a message on any failure.

import { writeFileSync, unlinkSync } from 'node:fs';
import { dirname, join } from 'node:path';
import Anthropic from '@anthropic-ai/sdk';
import { ToolError } from '@anthropic-ai/sdk/lib/tools/ToolError';
import { MemvaultMemory, MemvaultServerError } from '../memvault-memory.mjs';

/** @param {string} msg @returns {never} */
function fail(msg) {
  console.error(`typescript integration: FAIL: ${msg}`);
  process.exit(1);
}

const [baseURL, vault, keyFile, session] = process.argv.slice(2);
const client = new Anthropic({ apiKey: 'sk-ant-mock-not-a-key', baseURL, maxRetries: 0 });

const memory = new MemvaultMemory({ vault, keyFile, session, actor: 'typescript-sdk' });
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
const settled = await Promise.allSettled(paths.map((path) => memory.execute({ command: 'view', path })));
if (settled[0].status !== 'fulfilled' || !String(settled[0].value).startsWith("Here's the content of /memories/clients/acme.md"))
  fail(`concurrent view 0: ${JSON.stringify(settled[0])}`);
if (settled[1].status !== 'rejected' || !(settled[1].reason instanceof ToolError) ||
    settled[1].reason.content !== 'The path /memories/missing.md does not exist. Please provide a valid path.')
  fail(`concurrent view 1: ${JSON.stringify(settled[1])}`);
if (settled[2].status !== 'fulfilled' || !String(settled[2].value).includes('/memories/clients/acme.md'))
  fail(`concurrent view 2: ${JSON.stringify(settled[2])}`);
if (settled[3].status !== 'rejected' || !(settled[3].reason instanceof ToolError) || !String(settled[3].reason.content).includes('..'))
  fail(`concurrent view 3: ${JSON.stringify(settled[3])}`);

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
